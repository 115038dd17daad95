//! The hierarchy walks: activate, deactivate, new timer, remote handling and the lock-free
//! queries a running CPU makes at its host tick.

use tracing::trace;

use super::state::{self, Transition};
use super::tree::{Child, CpuNode, Event, Group, GroupQueue, Hierarchy, NONE};
use super::{IdleUpdate, RemoteExpiry, RemoteOutcome};
use crate::base::CpuId;
use crate::clock::{Nanos, NEVER};
use crate::sync::{lock, Ordering};

/// Tracing target of every state transition (the analogue of Linux's `tmigr_*` tracepoints).
pub const TRACE_TARGET: &str = "timer::tmigr";

/// Recomputes a group's first live event, dropping ignored entries (the lazy `ignore`).
/// `ignore` flags use acquire/release only: a stale flag leaves a stale event in the queue,
/// which costs at most one useless remote expiry.
fn recompute(g: &Group, q: &mut GroupQueue) -> Nanos {
    let (mut best, mut cpu) = (NEVER, NONE);
    for (i, e) in q.evts.iter_mut().enumerate() {
        if e.expiry == NEVER {
            continue;
        }
        if g.ignore[i].load(Ordering::Acquire) {
            e.expiry = NEVER;
            continue;
        }
        if e.expiry < best {
            (best, cpu) = (e.expiry, e.cpu);
        }
    }
    q.first_cpu = cpu;
    // SeqCst: lock-free readers (kick decisions, remote deadlines) pair this store with their
    // own compare-exchange on a state word; only a single total order makes that sound.
    g.next_expiry.store(best, Ordering::SeqCst);
    best
}

/// Sets child `slot`'s event in `g` (under `g`'s lock). Returns (old first, new first).
fn set_event(g: &Group, q: &mut GroupQueue, slot: u8, evt: Event) -> (Nanos, Nanos) {
    let old = g.next_expiry.load(Ordering::SeqCst);
    let i = usize::from(slot);
    q.evts[i] = evt;
    g.ignore[i].store(evt.expiry == NEVER, Ordering::Release);
    let new = recompute(g, q);
    (old, new)
}

impl Hierarchy {
    /// Marks `cpu` active (it is about to run guest code). Lock-free except for the CPU's own
    /// state lock; the walk stops at the first group that already had a migrator. If it
    /// turned the top group active it takes over the wake-up duty of the all-idle tree and
    /// returns the sleeping CPU that held it: re-arm that CPU's host wake-up (it reads
    /// `NEVER` from [`Hierarchy::wakeup`] now), do not wake it.
    pub fn activate(&self, cpu: CpuId) -> Option<CpuId> {
        let c = self.cpu_node(cpu);
        let mut st = lock(&c.state);
        if !st.idle {
            return None;
        }
        st.idle = false;
        let mut g = self.group(c.group);
        g.ignore[usize::from(c.slot)].store(true, Ordering::Release);
        let mut slot = c.slot;
        let mut retarget = None;
        loop {
            let t = state::set_active(&g.state, slot, self.seq_step);
            trace!(target: TRACE_TARGET, event = "group_set_cpu_active", cpu, group = g.id,
                level = g.level, active = t.new.active, migrator = ?t.new.migrator, seq = t.new.seq);
            if t.old.migrator.is_some() {
                break;
            }
            let Some(p) = self.parent_of(g, t.new) else {
                retarget = self.release_duty(cpu, g);
                break;
            };
            slot = g.slot();
            p.ignore[usize::from(slot)].store(true, Ordering::Release);
            g = p;
        }
        trace!(target: TRACE_TARGET, event = "cpu_active", cpu, retarget = ?retarget);
        retarget
    }

    /// Marks `cpu` idle with `next_global` (its first global expiry, or `NEVER`; pass `NEVER`
    /// when a pinned timer expires first, the CPU wakes for that anyway). On a CPU that is
    /// already idle it re-reports exactly `next_global`, later or earlier than before (after
    /// the idle CPU armed, cancelled or moved timers), so that nobody wakes for a stale event.
    pub fn deactivate(&self, cpu: CpuId, next_global: Nanos) -> IdleUpdate {
        let c = self.cpu_node(cpu);
        let mut st = lock(&c.state);
        if st.idle {
            drop(st);
            return self.report(cpu, next_global, true);
        }
        st.idle = true;
        st.evt = next_global;
        let mut g = self.group(c.group);
        let (mut old_first, mut new_first) = {
            let mut q = lock(&g.queue);
            set_event(
                g,
                &mut q,
                c.slot,
                Event {
                    expiry: next_global,
                    cpu,
                },
            )
        };
        let mut t = state::set_inactive(&g.state, c.slot, &|| false, self.seq_step);
        self.trace_inactive(cpu, g, &t);
        let mut out = IdleUpdate {
            wakeup: NEVER,
            kick: None,
            retarget: None,
        };
        loop {
            if t.new.active != 0 {
                // A new migrator, or an earlier first event: its host tick must cover it.
                let moved = t.old.migrator != t.new.migrator || new_first < old_first;
                if moved {
                    out.kick = self
                        .migrator_cpu(g)
                        .filter(|&m| self.remote_deadline(m) != NEVER);
                }
                break;
            }
            let Some(p) = self.parent_of(g, t.new) else {
                // The last one out: the wake-up duty of the all-idle tree (see `duty.rs`).
                (out.wakeup, out.retarget) = self.claim_duty(cpu, g);
                break;
            };
            (old_first, new_first) = self.propagate_group(p, g);
            let child = g;
            t = state::set_inactive(&p.state, child.slot(), &|| child.is_active(), self.seq_step);
            self.trace_inactive(cpu, p, &t);
            g = p;
        }
        trace!(target: TRACE_TARGET, event = "cpu_idle", cpu, next_global, wakeup = out.wakeup,
            kick = ?out.kick, retarget = ?out.retarget);
        out
    }

    fn trace_inactive(&self, cpu: CpuId, g: &Group, t: &Transition) {
        trace!(target: TRACE_TARGET, event = "group_set_cpu_inactive", cpu, group = g.id,
            level = g.level, active = t.new.active, migrator = ?t.new.migrator, seq = t.new.seq);
    }

    /// Puts child group `child`'s first event into its parent `p` (locks child, then parent);
    /// an active child's event is ignored. Returns `p`'s (old first, new first).
    pub(super) fn propagate_group(&self, p: &Group, child: &Group) -> (Nanos, Nanos) {
        let cq = lock(&child.queue);
        let mut pq = lock(&p.queue);
        let evt = if child.is_active() {
            Event {
                expiry: NEVER,
                cpu: NONE,
            }
        } else {
            Event {
                expiry: child.next_expiry.load(Ordering::SeqCst),
                cpu: cq.first_cpu,
            }
        };
        let r = set_event(p, &mut pq, child.slot(), evt);
        trace!(target: TRACE_TARGET, event = "update_events", group = p.id, child = child.id,
            expiry = evt.expiry, owner = evt.cpu, first = r.1);
        r
    }

    /// The CPU at the bottom of `g`'s chain of migrators, if the chain is complete.
    fn migrator_cpu(&self, g: &Group) -> Option<CpuId> {
        let mut g = g;
        loop {
            let m = state::load(&g.state).migrator?;
            match g.members[usize::from(m)].get()? {
                Child::Cpu(c) => return Some(*c),
                Child::Group(id) => g = self.group(*id),
            }
        }
    }

    /// An idle `cpu` armed a global timer at `next_global` (its new first global expiry).
    /// Returns the wake-up it must now honour (`NEVER` if none), a migrator to kick and a
    /// sleeper whose duty it took. Active CPUs need nothing; a later `next_global` than the
    /// one reported changes nothing (use [`Hierarchy::deactivate`] to re-report exactly).
    pub fn new_timer(&self, cpu: CpuId, next_global: Nanos) -> IdleUpdate {
        self.report(cpu, next_global, false)
    }

    /// Reports an idle `cpu`'s first global expiry: only if earlier than the last one, or
    /// (`exact`) whenever it differs.
    fn report(&self, cpu: CpuId, next_global: Nanos, exact: bool) -> IdleUpdate {
        let c = self.cpu_node(cpu);
        let mut st = lock(&c.state);
        let unchanged = IdleUpdate {
            wakeup: c.wake.load(Ordering::SeqCst),
            kick: None,
            retarget: None,
        };
        if !st.idle || next_global == st.evt || (next_global > st.evt && !exact) {
            return unchanged;
        }
        if st.remote {
            // The CPU handling it remotely re-reads the next expiry after we release the lock.
            return unchanged;
        }
        st.evt = next_global;
        trace!(target: TRACE_TARGET, event = "cpu_new_timer", cpu, next_global);
        let (top, kick) = self.walk_events(c, cpu, next_global);
        let (wakeup, retarget) = match top {
            Some(g) => self.claim_duty(cpu, g),
            None => (c.wake.load(Ordering::SeqCst), None),
        };
        IdleUpdate {
            wakeup,
            kick,
            retarget,
        }
    }

    /// Re-propagates `cpu`'s event bottom-up until a level above the first active group (the
    /// `tmigr_new_timer_up` walk). Returns the top group if the walk reached it idle, and a
    /// migrator to kick. Caller holds the CPU's state lock.
    fn walk_events(
        &self,
        c: &CpuNode,
        cpu: CpuId,
        expiry: Nanos,
    ) -> (Option<&Group>, Option<CpuId>) {
        let mut g = self.group(c.group);
        let (mut old, mut new) = {
            let mut q = lock(&g.queue);
            set_event(g, &mut q, c.slot, Event { expiry, cpu })
        };
        loop {
            let gs = state::load(&g.state);
            if gs.active != 0 {
                let kick = if new < old {
                    self.migrator_cpu(g)
                } else {
                    None
                };
                return (None, kick);
            }
            let Some(p) = self.parent_of(g, gs) else {
                return (Some(g), None);
            };
            (old, new) = self.propagate_group(p, g);
            g = p;
        }
    }

    /// True if `cpu` is the migrator of a group (walking up while it stays migrator) whose
    /// first event is due at `now`. Lock-free: a few atomic loads, for the host tick.
    pub fn requires_handle_remote(&self, cpu: CpuId, now: Nanos) -> bool {
        self.remote_deadline(cpu) <= now
    }

    /// The earliest first event among the groups `cpu` is the migrator of (walking up while
    /// it stays migrator), `NEVER` if none: its host tick must fire by then. Lock-free.
    pub fn remote_deadline(&self, cpu: CpuId) -> Nanos {
        let c = self.cpu_node(cpu);
        let mut g = self.group(c.group);
        let mut slot = c.slot;
        let mut first = NEVER;
        loop {
            let s = state::load(&g.state);
            if s.migrator != Some(slot) {
                return first;
            }
            first = first.min(g.next_expiry.load(Ordering::SeqCst));
            let Some(p) = self.parent_of(g, s) else {
                return first;
            };
            slot = g.slot();
            g = p;
        }
    }

    /// Expires the due global timers of idle CPUs in every group `cpu` is the migrator of,
    /// running their callbacks on this thread through `exp`, and re-propagates each remote
    /// CPU's next event. Call when [`Hierarchy::requires_handle_remote`] says so.
    pub fn handle_remote(
        &self,
        cpu: CpuId,
        now: Nanos,
        exp: &mut dyn RemoteExpiry,
    ) -> RemoteOutcome {
        let c = self.cpu_node(cpu);
        let mut g = self.group(c.group);
        let mut slot = c.slot;
        let mut out = RemoteOutcome::default();
        loop {
            let s = state::load(&g.state);
            if s.migrator != Some(slot) {
                break;
            }
            while let Some(owner) = Self::pop_expired(g, now) {
                out.events += 1;
                trace!(target: TRACE_TARGET, event = "handle_remote", cpu, group = g.id, owner);
                if self.handle_remote_cpu(owner, now, exp) {
                    out.cpus_expired += 1;
                }
            }
            let Some(p) = self.parent_of(g, s) else {
                break;
            };
            slot = g.slot();
            g = p;
        }
        out
    }

    /// Pops `g`'s first live event if due; returns the CPU it names.
    fn pop_expired(g: &Group, now: Nanos) -> Option<CpuId> {
        let mut q = lock(&g.queue);
        let first = g.next_expiry.load(Ordering::SeqCst);
        if first > now {
            return None;
        }
        let owner = q.first_cpu;
        let i = q
            .evts
            .iter()
            .position(|e| e.expiry == first && e.cpu == owner)?;
        q.evts[i].expiry = NEVER;
        recompute(g, &mut q);
        Some(owner)
    }

    fn handle_remote_cpu(&self, cpu: CpuId, now: Nanos, exp: &mut dyn RemoteExpiry) -> bool {
        if cpu == NONE {
            return false;
        }
        let c = self.cpu_node(cpu);
        {
            let mut st = lock(&c.state);
            // Active again (it expires its own timers), already being handled, or its event
            // moved into the future (whoever moved it propagated it).
            if !st.idle || st.remote || st.evt > now {
                return false;
            }
            st.remote = true;
        }
        exp.expire_remote(cpu, now);
        let mut st = lock(&c.state);
        if st.idle {
            let next = exp.next_global(cpu);
            st.evt = next;
            // The walk stops at or below a group this (active) migrator keeps active.
            let (_, kick) = self.walk_events(c, cpu, next);
            trace!(target: TRACE_TARGET, event = "remote_cpu_done", cpu, next, kick = ?kick);
        }
        st.remote = false;
        true
    }

    /// Forecast of the wake-up `deactivate(cpu, next_global)` would return now: `NEVER` unless
    /// `cpu` is the only active CPU on its path to the root (lonely at every level), else the
    /// earliest of `next_global` and those groups' first events. Never later than the truth.
    pub fn quick_check(&self, cpu: CpuId, next_global: Nanos) -> Nanos {
        let c = self.cpu_node(cpu);
        let mut g = self.group(c.group);
        let mut slot = c.slot;
        let mut first = next_global;
        loop {
            let s = state::load(&g.state);
            if s.active != 1 << slot {
                return NEVER;
            }
            first = first.min(g.next_expiry.load(Ordering::SeqCst));
            let Some(p) = self.parent_of(g, s) else {
                return first;
            };
            slot = g.slot();
            g = p;
        }
    }
}
