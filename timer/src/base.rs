//! `TimerBase`: one CPU's timers, split like Linux's BASE_LOCAL / BASE_GLOBAL.
//!
//! ```text
//!   TimerBase<T> (owned by the vCPU thread, &mut self)
//!   ├── pinned: TimerQueue<T>            only the owner arms/expires: no lock, no atomics
//!   ├── globals: TimerQueue<T>           global timers while the owner runs: no lock either
//!   └── shared: Arc<GlobalQueue<T>>      global timers while the owner is idle
//!         ├── queue:  Mutex<TimerQueue<T>>  any thread may expire it (remote expiry)
//!         ├── expiry: Mutex<()>            held for a whole expiry run: one expirer at a time
//!         └── head:   AtomicU64            first global deadline, readable without the lock
//! ```
//!
//! A pinned timer (a vCPU's LAPIC timer) can only fire on its own CPU. A global timer may be
//! expired by another CPU while its owner is idle (see `Hierarchy`); its callback then runs on
//! that other thread and says, through [`AfterFire`], whether the owner must be woken.
//!
//! Remote expiry only happens while the owner is idle, so the global timers live in an
//! owner-only queue while it runs and are handed over whole (one `mem::swap` under the lock,
//! handles stay valid) by [`TimerBase::share_globals`] before it goes idle, and taken back by
//! [`TimerBase::reclaim_globals`] when it wakes. Arming a global timer while running is then
//! as cheap as arming a pinned one.

use std::sync::Arc;

use crate::clock::{Nanos, NEVER};
use crate::queue::{Slot, TimerQueue};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// Index of a CPU (a vCPU thread) in a VM, dense from 0.
pub type CpuId = usize;

/// Whether a timer must fire on its own CPU or may be expired by any CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimerKind {
    /// Fires only on the CPU that armed it (a LAPIC timer).
    Pinned,
    /// May be expired by any CPU when its owner is idle (device and housekeeping deadlines).
    Global,
}

/// Names one armed timer: owner CPU, queue, slot and generation. Stale handles are harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerHandle {
    cpu: CpuId,
    kind: TimerKind,
    slot: Slot,
}

impl TimerHandle {
    pub(crate) fn new(cpu: CpuId, kind: TimerKind, slot: Slot) -> Self {
        Self { cpu, kind, slot }
    }

    pub(crate) fn slot(&self) -> Slot {
        self.slot
    }

    /// The CPU whose base holds the timer.
    pub fn cpu(&self) -> CpuId {
        self.cpu
    }

    /// Whether the timer is pinned or global.
    pub fn kind(&self) -> TimerKind {
        self.kind
    }
}

/// A timer that fired, handed to the expiry callback.
#[derive(Debug, PartialEq, Eq)]
pub struct Fired<T> {
    /// The CPU that armed the timer.
    pub cpu: CpuId,
    /// The handle it was armed with (now stale).
    pub handle: TimerHandle,
    /// Its deadline.
    pub deadline: Nanos,
    /// What the owner attached when arming.
    pub payload: T,
    /// True when another CPU expired it on the owner's behalf.
    pub remote: bool,
}

/// What the expiry callback asks for after handling a fired timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFire {
    /// Nothing more to do.
    Done,
    /// The owner must be told (kicked) because the timer concerns it.
    NotifyOwner,
}

/// The global half of a base: shared so that another CPU can expire it remotely.
#[derive(Debug)]
pub struct GlobalQueue<T> {
    cpu: CpuId,
    queue: Mutex<TimerQueue<T>>,
    expiry: Mutex<()>,
    head: AtomicU64,
}

impl<T> GlobalQueue<T> {
    fn new(cpu: CpuId) -> Self {
        Self {
            cpu,
            queue: Mutex::new(TimerQueue::new()),
            expiry: Mutex::new(()),
            head: AtomicU64::new(NEVER),
        }
    }

    /// The owning CPU.
    pub fn cpu(&self) -> CpuId {
        self.cpu
    }

    /// First pending global deadline (`NEVER` if none), read without locking.
    pub fn next_expiry(&self) -> Nanos {
        self.head.load(Ordering::Acquire)
    }

    /// Number of pending global timers.
    pub fn len(&self) -> usize {
        lock(&self.queue).len()
    }

    /// True when no global timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn publish(&self, q: &TimerQueue<T>) {
        self.head
            .store(q.peek().unwrap_or(NEVER), Ordering::Release);
    }

    fn arm(&self, deadline: Nanos, payload: T) -> Slot {
        let mut q = lock(&self.queue);
        let s = q.arm(deadline, payload);
        if q.peek() == Some(deadline) {
            self.head.store(deadline, Ordering::Release);
        }
        s
    }

    fn cancel(&self, s: Slot) -> Option<T> {
        let mut q = lock(&self.queue);
        let p = q.cancel(s);
        if p.is_some() {
            self.publish(&q);
        }
        p
    }

    fn rearm(&self, s: Slot, deadline: Nanos) -> bool {
        let mut q = lock(&self.queue);
        let ok = q.rearm(s, deadline);
        self.publish(&q);
        ok
    }

    fn deadline(&self, s: Slot) -> Option<Nanos> {
        lock(&self.queue).deadline(s)
    }

    /// Exchanges the shared queue with the owner's (the hand-over at idle entry and exit).
    fn swap(&self, q: &mut TimerQueue<T>) {
        let mut shared = lock(&self.queue);
        std::mem::swap(&mut *shared, q);
        self.publish(&shared);
    }

    /// Expires every global timer due at `now`, one expirer at a time, calling `f` for each
    /// outside the queue lock (so `f` may arm timers on this base). Returns how many fired
    /// and how many callbacks asked to notify the owner.
    pub fn expire(
        &self,
        now: Nanos,
        remote: bool,
        f: &mut dyn FnMut(Fired<T>) -> AfterFire,
    ) -> (usize, usize) {
        let _one_expirer = lock(&self.expiry);
        let (mut fired, mut notify) = (0, 0);
        loop {
            let popped = {
                let mut q = lock(&self.queue);
                let p = q.pop_due(now);
                if p.is_some() {
                    self.publish(&q);
                }
                p
            };
            let Some((slot, deadline, payload)) = popped else {
                break;
            };
            fired += 1;
            let handle = TimerHandle {
                cpu: self.cpu,
                kind: TimerKind::Global,
                slot,
            };
            let fired_timer = Fired {
                cpu: self.cpu,
                handle,
                deadline,
                payload,
                remote,
            };
            if f(fired_timer) == AfterFire::NotifyOwner {
                notify += 1;
            }
        }
        (fired, notify)
    }
}

/// One CPU's timer base: a pinned queue and a global queue owned by the CPU's thread, the
/// global one handed to other CPUs while this one is idle.
#[derive(Debug)]
pub struct TimerBase<T> {
    cpu: CpuId,
    pinned: TimerQueue<T>,
    globals: TimerQueue<T>,
    shared_mode: bool,
    global: Arc<GlobalQueue<T>>,
}

impl<T> TimerBase<T> {
    /// An empty base for `cpu`, its global timers owner-only (as for a running CPU).
    pub fn new(cpu: CpuId) -> Self {
        Self {
            cpu,
            pinned: TimerQueue::new(),
            globals: TimerQueue::new(),
            shared_mode: false,
            global: Arc::new(GlobalQueue::new(cpu)),
        }
    }

    /// The owning CPU.
    pub fn cpu(&self) -> CpuId {
        self.cpu
    }

    /// The shared global queue, for remote expiry by other CPUs while this one is idle.
    pub fn global(&self) -> &Arc<GlobalQueue<T>> {
        &self.global
    }

    /// Hands the global timers to the shared queue so other CPUs can expire them (before
    /// going idle). Idempotent.
    pub fn share_globals(&mut self) {
        if !self.shared_mode {
            self.global.swap(&mut self.globals);
            self.shared_mode = true;
        }
    }

    /// Takes the global timers back from the shared queue (after waking). Idempotent.
    pub fn reclaim_globals(&mut self) {
        if self.shared_mode {
            self.global.swap(&mut self.globals);
            self.shared_mode = false;
        }
    }

    /// True while the global timers are in the shared queue.
    pub fn globals_shared(&self) -> bool {
        self.shared_mode
    }

    /// Arms a timer. Pinned ones, and global ones while not shared, touch no lock and no
    /// atomic.
    pub fn arm(&mut self, kind: TimerKind, deadline: Nanos, payload: T) -> TimerHandle {
        let slot = match kind {
            TimerKind::Pinned => self.pinned.arm(deadline, payload),
            TimerKind::Global if self.shared_mode => self.global.arm(deadline, payload),
            TimerKind::Global => self.globals.arm(deadline, payload),
        };
        TimerHandle {
            cpu: self.cpu,
            kind,
            slot,
        }
    }

    /// Cancels a pending timer and returns its payload; `None` if it already fired, is being
    /// fired, was cancelled, or belongs to another base. A timer cancelled here never fires.
    pub fn cancel(&mut self, h: TimerHandle) -> Option<T> {
        if h.cpu != self.cpu {
            return None;
        }
        match h.kind {
            TimerKind::Pinned => self.pinned.cancel(h.slot),
            TimerKind::Global if self.shared_mode => self.global.cancel(h.slot),
            TimerKind::Global => self.globals.cancel(h.slot),
        }
    }

    /// Moves a pending timer to `deadline`; false if it is no longer pending.
    pub fn rearm(&mut self, h: TimerHandle, deadline: Nanos) -> bool {
        if h.cpu != self.cpu {
            return false;
        }
        match h.kind {
            TimerKind::Pinned => self.pinned.rearm(h.slot, deadline),
            TimerKind::Global if self.shared_mode => self.global.rearm(h.slot, deadline),
            TimerKind::Global => self.globals.rearm(h.slot, deadline),
        }
    }

    /// Deadline of a pending timer.
    pub fn deadline(&self, h: TimerHandle) -> Option<Nanos> {
        if h.cpu != self.cpu {
            return None;
        }
        match h.kind {
            TimerKind::Pinned => self.pinned.deadline(h.slot),
            TimerKind::Global if self.shared_mode => self.global.deadline(h.slot),
            TimerKind::Global => self.globals.deadline(h.slot),
        }
    }

    /// First pending pinned deadline, or `NEVER`.
    pub fn next_pinned(&self) -> Nanos {
        self.pinned.peek().unwrap_or(NEVER)
    }

    /// First pending global deadline, or `NEVER`.
    pub fn next_global(&self) -> Nanos {
        if self.shared_mode {
            self.global.next_expiry()
        } else {
            self.globals.peek().unwrap_or(NEVER)
        }
    }

    /// First pending deadline of either kind, or `NEVER`.
    pub fn next_expiry(&self) -> Nanos {
        self.next_pinned().min(self.next_global())
    }

    /// Number of pending timers of both kinds.
    pub fn len(&self) -> usize {
        self.pinned.len() + self.globals.len() + self.global.len()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Expires every pinned and global timer due at `now` on the owner's thread, earliest
    /// pinned first then global. Returns the number fired.
    pub fn expire(&mut self, now: Nanos, f: &mut dyn FnMut(Fired<T>) -> AfterFire) -> usize {
        let mut fired = Self::expire_queue(self.cpu, &mut self.pinned, TimerKind::Pinned, now, f);
        if self.shared_mode {
            if self.global.next_expiry() <= now {
                fired += self.global.expire(now, false, f).0;
            }
        } else if self.globals.peek().is_some_and(|d| d <= now) {
            // A remote expirer may still be running a callback it popped before the hand-back.
            let _one_expirer = lock(&self.global.expiry);
            fired += Self::expire_queue(self.cpu, &mut self.globals, TimerKind::Global, now, f);
        }
        fired
    }

    fn expire_queue(
        cpu: CpuId,
        q: &mut TimerQueue<T>,
        kind: TimerKind,
        now: Nanos,
        f: &mut dyn FnMut(Fired<T>) -> AfterFire,
    ) -> usize {
        let mut fired = 0;
        while let Some((slot, deadline, payload)) = q.pop_due(now) {
            fired += 1;
            f(Fired {
                cpu,
                handle: TimerHandle { cpu, kind, slot },
                deadline,
                payload,
                remote: false,
            });
        }
        fired
    }
}

#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use super::*;

    #[test]
    fn pinned_and_global_are_separate() {
        let mut b = TimerBase::new(3);
        let p = b.arm(TimerKind::Pinned, 100, "lapic");
        let g = b.arm(TimerKind::Global, 50, "disk");
        assert_eq!(b.next_pinned(), 100);
        assert_eq!(b.next_global(), 50);
        assert_eq!(b.next_expiry(), 50);
        assert_eq!(p.cpu(), 3);
        assert_eq!(g.kind(), TimerKind::Global);
        assert!(b.rearm(p, 40));
        assert_eq!(b.deadline(p), Some(40));
        let mut got = Vec::new();
        assert_eq!(
            b.expire(60, &mut |f| {
                got.push((f.payload, f.deadline));
                AfterFire::Done
            }),
            2
        );
        assert_eq!(got, vec![("lapic", 40), ("disk", 50)]);
        assert_eq!(b.cancel(p), None);
        assert!(b.is_empty());
    }

    #[test]
    fn remote_expiry_reports_notifications_and_cancel_wins() {
        let mut b = TimerBase::new(0);
        let g1 = b.arm(TimerKind::Global, 10, 1);
        let _g2 = b.arm(TimerKind::Global, 20, 2);
        assert_eq!(b.cancel(g1), Some(1));
        // Nothing is shared while the owner runs.
        assert!(b.global().is_empty());
        b.share_globals();
        assert!(b.globals_shared());
        let remote = Arc::clone(b.global());
        let (fired, notify) = remote.expire(30, true, &mut |f| {
            assert!(f.remote);
            assert_eq!(f.payload, 2);
            AfterFire::NotifyOwner
        });
        assert_eq!((fired, notify), (1, 1));
        assert_eq!(b.next_global(), NEVER);
        // Handles survive the hand-over both ways.
        let g3 = b.arm(TimerKind::Global, 40, 3);
        b.reclaim_globals();
        assert!(b.global().is_empty());
        assert_eq!(b.deadline(g3), Some(40));
        b.share_globals();
        assert_eq!(b.cancel(g3), Some(3));
        // A handle from another base is rejected.
        let mut other = TimerBase::<i32>::new(1);
        assert_eq!(other.cancel(g1), None);
    }
}
