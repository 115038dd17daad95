//! The wake-up duty of an all-idle tree: which sleeping CPU wakes for the first global event
//! when no CPU runs, and how it is taken back, without waking it, when one runs again.
//!
//! # Why
//!
//! When the last active CPU goes idle nobody is left to pull idle CPUs' global timers, so it
//! blocks with the system-wide first global expiry as its timeout (Linux does the same). When
//! another CPU becomes active before then, that CPU becomes the migrator and expires the
//! event itself. In Linux the sleeper still wakes at its old deadline and finds nothing to do:
//! a sleeping CPU's clock event cannot be reprogrammed from another CPU. A vCPU's host
//! wake-up can (a timerfd is re-armed by any thread without waking the one waiting on it), so
//! here the duty is state the hierarchy owns and moves:
//!
//! ```text
//!   CPU 1: last one out         CPU 0: first one back           CPU 1's host wake-up
//!   deactivate -> top idle
//!   claim: holder = 1, wake[1] = W                              armed for min(own, W)
//!                               activate -> top active
//!                               release: holder = none,
//!                               wake[1] = NEVER, retarget 1 ->  re-armed for own (or off),
//!                                                               CPU 1 sleeps on
//! ```
//!
//! # Protocol
//!
//! One holder at most, recorded under the hierarchy-wide `duty` lock; the holder's deadline
//! lives in its `CpuNode::wake` (every other CPU's is `NEVER`), written only under that lock.
//! Both sides decide from the *current* root state read under the lock, after their own
//! compare-exchange on the top group:
//!
//! * *claim* (a walk found its top group idle: the last CPU going idle, or an idle CPU whose
//!   re-reported event reached an idle top): if the root is still idle, the claimant becomes
//!   the holder with the root's first event; a previous holder is displaced (its `wake`
//!   becomes `NEVER` and it is returned for a retarget). If the root is active, it claims
//!   nothing.
//! * *release* (an activation walk turned the top group from idle to active): if the root is
//!   still active, the holder (if any) is displaced and returned for a retarget. If it is
//!   idle again, a later deactivation turned it so and claims after us.
//!
//! Every transition of the root between idle and active is made by a walker that takes the
//! lock afterwards, so the last lock holder saw the last transition: at rest, an idle root
//! with a first event has exactly one holder whose `wake` is that event, and an active root
//! has none. Each change of `wake[c]` names `c` to its author, which re-reads `wake[c]` when
//! it re-arms `c`'s host wake-up (under the sleeper's own lock, see `model/sleep.rs`), so the
//! last re-arm uses the last value: no stale wake-up, no lost one.
//!
//! Lock order: CPU state lock, group queue locks, then `duty` (a leaf: nothing is taken
//! under it).

use super::state::{self, GroupState};
use super::tree::{Group, Hierarchy};
use crate::base::CpuId;
use crate::clock::{Nanos, NEVER};
use crate::sync::{lock, Ordering};

impl Hierarchy {
    /// Follows parent links from `top` (a new root may have been grown above it since the
    /// walk found it parentless) to the root. Returns the root's state and the earliest first
    /// event on the way (the old root's event reaches a new root only after its link).
    fn root_from<'a>(&'a self, top: &'a Group) -> (GroupState, Nanos) {
        let mut g = top;
        let mut first = NEVER;
        loop {
            let s = state::load(&g.state);
            first = first.min(g.next_expiry.load(Ordering::SeqCst));
            match self.parent_of(g, s) {
                Some(p) => g = p,
                None => return (s, first),
            }
        }
    }

    /// `cpu` (idle, its walk found the parentless group `top` idle) takes the duty if the
    /// tree is still all idle. Returns its wake-up and the CPU it displaced.
    pub(super) fn claim_duty(&self, cpu: CpuId, top: &Group) -> (Nanos, Option<CpuId>) {
        let mut holder = lock(&self.duty);
        let (root, first) = self.root_from(top);
        if root.active != 0 {
            // Someone runs and pulls every event; a duty we held is stale too.
            if *holder == Some(cpu) {
                *holder = None;
                self.cpu_node(cpu).wake.store(NEVER, Ordering::SeqCst);
            }
            return (NEVER, None);
        }
        let prev = *holder;
        if let Some(p) = prev.filter(|&p| p != cpu) {
            if self.cpu_node(p).wake.load(Ordering::SeqCst) == first {
                // The holder already wakes for exactly this: leave it, re-arm nobody.
                return (NEVER, None);
            }
        }
        *holder = (first != NEVER).then_some(cpu);
        self.cpu_node(cpu).wake.store(first, Ordering::SeqCst);
        let displaced = prev.filter(|&p| p != cpu);
        if let Some(p) = displaced {
            self.cpu_node(p).wake.store(NEVER, Ordering::SeqCst);
        }
        tracing::trace!(target: super::ops::TRACE_TARGET, event = "duty_claimed", cpu, first,
            displaced = ?displaced);
        (first, displaced)
    }

    /// `cpu`'s activation turned the parentless group `top` active: it takes over the
    /// holder's duty if the root is still active. Returns the displaced sleeper, if another.
    pub(super) fn release_duty(&self, cpu: CpuId, top: &Group) -> Option<CpuId> {
        let mut holder = lock(&self.duty);
        let (root, _) = self.root_from(top);
        if root.active == 0 {
            return None;
        }
        let h = holder.take()?;
        self.cpu_node(h).wake.store(NEVER, Ordering::SeqCst);
        tracing::trace!(target: super::ops::TRACE_TARGET, event = "duty_released", cpu,
            holder = h);
        (h != cpu).then_some(h)
    }

    /// The CPU holding the wake-up duty, if any (for dumps and tests).
    pub(super) fn duty_holder(&self) -> Option<CpuId> {
        *lock(&self.duty)
    }
}
