//! The hierarchical pull model for global timers of idle CPUs.
//!
//! # Model
//!
//! Every CPU (vCPU thread) keeps its timers on its own [`TimerBase`](crate::TimerBase). Pinned
//! timers only ever fire on their CPU. Global timers may be expired by any CPU, so an idle CPU
//! does not have to wake up for them: some CPU that is running anyway *pulls* them. This
//! module decides which CPU that is, with the scheme of Linux's `timer_migration.c`.
//!
//! CPUs are the leaves of a tree of groups. A group has up to `group_size` children (8 by
//! default, a power of two), CPUs at level 0 and groups above. Levels are added as CPUs
//! arrive, so 1..=4096 CPUs need at most 4 levels of 8. Below the *cross-node level* a group
//! only holds CPUs (or groups) of one NUMA node; from that level up, nodes mix.
//!
//! ```text
//!                                 LVL 2            [GRP2:0]                        root
//!                                                 /        \
//!                                   (cross-node level: nodes mix from here up)
//!                                               /            \
//!  LVL 1                   [GRP1:0 node0]                       [GRP1:1 node1]
//!                        /    ...     \                        /     ...    \
//!  LVL 0       [GRP0:0 node0] ... [GRP0:7 node0]     [GRP0:8 node1] ... [GRP0:15 node1]
//!              /   |   ...  \                         /   |   ...  \
//!  CPUS      0     1   ...   7        ...            64  65   ...  71         ...
//! ```
//!
//! Each group holds one atomic state word (see `state.rs`), changed only by compare-exchange:
//!
//! * `active`: one bit per child that is active (a CPU running, or a group with an active
//!   child). A group's bit is set in its parent iff the group has an active child.
//! * `migrator`: one active child chosen to look after the group's idle children, or none iff
//!   `active == 0`. The CPU at the bottom of a chain of migrators is the one that pulls.
//! * `seq`: bumped by every update, so a compare-exchange computed from a stale read fails.
//!   A deactivation reads the group state, then the child's state, then writes; if the child
//!   went idle and active again in between, the active mask is back to the value read and
//!   only `seq` tells the write is stale. Without it an active CPU could be dropped from its
//!   group (shown by a unit test and a loom model in `state.rs`, and by the loom model in
//!   `tests/loom.rs`, which find the losing interleaving when `seq` is turned off).
//! * `linked`: the group has a parent. Set by compare-exchange when a group is put under a
//!   parent, so a walker learns from its own update whether to go on up (see `grow.rs`).
//!
//! Each group also has an *event queue* with one slot per child: an idle child's first global
//! expiry and the CPU that owns it. A child that becomes active only raises its `ignore` flag
//! (no lock); the stale entry is dropped lazily the next time the queue is scanned under its
//! lock. `next_expiry` mirrors the queue's first live event for lock-free readers.
//!
//! # Operations
//!
//! * [`Hierarchy::activate`]: the CPU sets its bit bottom-up; the walk stops at the first group
//!   that already had a migrator. If it turned the top group active it takes over the
//!   wake-up duty (below) and names the sleeper that held it for a retarget.
//! * [`Hierarchy::deactivate`]: the CPU queues its first global expiry in its group and
//!   clears its bit; if the group became idle, the group's first event goes one level up, and
//!   so on. If the top group became idle this CPU was the last active one and claims the
//!   *wake-up duty*: the system-wide first global expiry, which it must block with. If the
//!   walk stops at an active group whose first event moved earlier, its migrator CPU is
//!   named for a kick. On an idle CPU it re-reports the exact first expiry (later too).
//! * [`Hierarchy::new_timer`]: an idle CPU armed an earlier global timer; the event is
//!   re-propagated the same way.
//! * [`Hierarchy::requires_handle_remote`]: lock-free check for the host tick: is this CPU a
//!   migrator of a group whose first event is due?
//! * [`Hierarchy::handle_remote`]: the migrator pops due events, expires those idle CPUs'
//!   global timers on its own thread (via [`RemoteExpiry`]) and re-propagates each CPU's next
//!   event. With the clock frozen it reaches a fixed point: popped events are only re-queued
//!   with a later expiry.
//! * [`Hierarchy::quick_check`]: the sleep length this CPU would get from `deactivate`.
//! * [`Hierarchy::add_cpu`]: hot-add; may create groups and a new root above the old one
//!   while other CPUs keep going idle and active (see `grow.rs`).
//!
//! # The wake-up duty (`duty.rs`)
//!
//! At most one idle CPU holds the duty to wake for the first event of an all-idle tree; its
//! deadline is [`Hierarchy::wakeup`], every other CPU's is `NEVER`. An activation that makes
//! the tree active takes the duty over, an idle CPU whose report reaches the idle top claims
//! it; either names the CPU it took the duty from ([`IdleUpdate::retarget`], the return of
//! [`Hierarchy::activate`]), whose host wake-up the caller re-arms without waking it.
//!
//! # Differences from Linux
//!
//! * Event queues are arrays with one slot per child, scanned linearly (at most 32 children),
//!   instead of red-black timerqueues; `ignore` is a per-slot flag in the parent.
//! * Linux lets the last idle CPU wake at its deadline even when another CPU has taken over
//!   meanwhile (a sleeping CPU's clock event cannot be reprogrammed remotely). Here the duty
//!   moves and the sleeper's host wake-up is re-armed from the CPU that moved it.
//! * Linux's active CPUs notice new remote work at their periodic tick. A vCPU in KVM_RUN has
//!   only a lazily armed host tick, so [`Hierarchy::deactivate`] and [`Hierarchy::new_timer`]
//!   name the migrator to kick when its remote deadline moved earlier or the migrator role
//!   moved to it ([`IdleUpdate::kick`]).
//! * Remote re-propagation always walks up to the first active group.
//! * A new root is connected with the `linked` bit in the old root's state word instead of
//!   activating the old root under `tmigr_mutex` (see `grow.rs`).
//! * The state word is 64 bits: a 32-bit active mask, an 8-bit migrator index, a 23-bit
//!   `seq` and the `linked` bit (Linux: 8 + 8 + 16 bits).
//! * Reporting a global expiry only when it precedes the first pinned one (Linux's
//!   `fetch_next_timer_interrupt`) is done by the caller, the pull model.
//!
//! # Locking
//!
//! CPU state lock, then group queue locks bottom-up, child before parent, then the duty lock
//! (nothing is taken under it). State words are
//! lock-free. The owner of a CPU id calls activate/deactivate/new_timer for it; any active CPU
//! may call `handle_remote` for itself.

mod dump;
mod duty;
mod grow;
mod ops;
#[cfg(test)]
#[cfg(not(loom))]
mod retarget_tests;
pub(crate) mod state;
#[cfg(test)]
#[cfg(not(loom))]
mod tests;
mod topology;
mod tree;

use crate::base::CpuId;
use crate::clock::Nanos;

pub use dump::{CpuDump, EventDump, GroupDump, HierarchyDump, MemberDump};
pub use grow::{HierarchyConfig, HierarchyError};
pub use state::{GroupState, MAX_GROUP_SIZE};
pub use topology::NodeId;
pub use tree::Hierarchy;

/// What a migrator needs from the timer bases to expire an idle CPU's global timers.
pub trait RemoteExpiry {
    /// Expires `cpu`'s global timers due at `now`, running their callbacks on this thread.
    fn expire_remote(&mut self, cpu: CpuId, now: Nanos);
    /// `cpu`'s first pending global deadline, `NEVER` if none.
    fn next_global(&mut self, cpu: CpuId) -> Nanos;
}

/// What an idle CPU learns from [`Hierarchy::deactivate`] or [`Hierarchy::new_timer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleUpdate {
    /// The system-wide first global expiry if this CPU now holds the wake-up duty of an
    /// all-idle tree (it must wake up by then), else `NEVER`. Live value: [`Hierarchy::wakeup`].
    pub wakeup: Nanos,
    /// A migrator whose remote deadline moved earlier and must re-arm its host tick.
    pub kick: Option<CpuId>,
    /// A sleeping CPU that lost the wake-up duty to this one: its host wake-up must be moved
    /// to its own next deadline (see [`Hierarchy::wakeup`]), without waking it.
    pub retarget: Option<CpuId>,
}

/// What [`Hierarchy::handle_remote`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteOutcome {
    /// Idle CPUs whose global timers were expired.
    pub cpus_expired: usize,
    /// Due events popped (including stale ones that needed nothing).
    pub events: usize,
}
