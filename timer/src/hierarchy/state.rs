//! The per-group migration state word and its compare-exchange transitions.
//!
//! ```text
//!  63  62         40 39      32 31                            0
//! +---+-------------+----------+-------------------------------+
//! | L |  seq (23 b) | migrator |  active mask (one bit/child)  |
//! +---+-------------+----------+-------------------------------+
//! ```
//! `migrator` is the index of the active child that handles the group's idle children's
//! events, or `NO_MIGRATOR`. Every successful update bumps `seq`, so a compare-exchange
//! prepared from a stale read fails even when the visible fields happen to be equal again
//! (the ABA case: a child goes idle and active again between a deactivator's reads).
//!
//! `L` (linked) says the group has a parent. It is set by a compare-exchange on this same
//! word, so a walker learns whether to go on to a parent from the very update it made: an
//! update ordered before the link is accounted for by whoever links (it reads the state it
//! replaces), one ordered after it sees `L` and walks up itself. No store/load race.

use crate::sync::{AtomicU64, Ordering};

/// `migrator` value meaning "no active child".
pub(crate) const NO_MIGRATOR: u8 = 0xff;

const SEQ_MASK: u64 = 0x7f_ffff;
const LINKED: u64 = 1 << 63;

/// Largest supported number of children per group (the width of the active mask).
pub const MAX_GROUP_SIZE: usize = 32;

/// Decoded group state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupState {
    /// One bit per active child.
    pub active: u32,
    /// Index of the migrator child, if any.
    pub migrator: Option<u8>,
    /// Update counter (wraps at 2^23).
    pub seq: u32,
    /// The group has a parent.
    pub linked: bool,
}

impl GroupState {
    pub(crate) fn unpack(w: u64) -> Self {
        // Each field is masked to its width before narrowing.
        #[allow(clippy::cast_possible_truncation)]
        let (active, m, seq) = (
            (w & 0xffff_ffff) as u32,
            ((w >> 32) & 0xff) as u8,
            ((w >> 40) & SEQ_MASK) as u32,
        );
        Self {
            active,
            migrator: (m != NO_MIGRATOR).then_some(m),
            seq,
            linked: w & LINKED != 0,
        }
    }

    pub(crate) fn pack(self) -> u64 {
        u64::from(self.active)
            | (u64::from(self.migrator.unwrap_or(NO_MIGRATOR)) << 32)
            | ((u64::from(self.seq) & SEQ_MASK) << 40)
            | if self.linked { LINKED } else { 0 }
    }

    /// The idle state: no active child, no migrator.
    pub(crate) const IDLE: u64 = (NO_MIGRATOR as u64) << 32;
}

fn next_seq(s: u32, step: u32) -> u32 {
    s.wrapping_add(step) & 0x7f_ffff
}

/// Result of one transition: the state before and after.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transition {
    pub(crate) old: GroupState,
    pub(crate) new: GroupState,
}

/// Marks child `slot` active; it becomes the migrator if there was none. The walk must go
/// on to the parent iff `old.migrator` was `None` (the group itself just became active).
/// `step` is 1; only the model-checking demonstration of why `seq` exists passes 0.
pub(crate) fn set_active(word: &AtomicU64, slot: u8, step: u32) -> Transition {
    let mut cur = word.load(Ordering::SeqCst);
    loop {
        let old = GroupState::unpack(cur);
        let mut new = old;
        new.active |= 1 << slot;
        if new.migrator.is_none() {
            new.migrator = Some(slot);
        }
        new.seq = next_seq(old.seq, step);
        match word.compare_exchange_weak(cur, new.pack(), Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return Transition { old, new },
            Err(w) => cur = w,
        }
    }
}

/// Clears child `slot`'s active bit unless `child_active()` (re-read inside the loop, after
/// the group state) says the child is active again; hands the migrator role to another
/// active child or to nobody. The walk goes on to the parent iff `new.active == 0` and the
/// group was active before.
pub(crate) fn set_inactive(
    word: &AtomicU64,
    slot: u8,
    child_active: &dyn Fn() -> bool,
    step: u32,
) -> Transition {
    let mut cur = word.load(Ordering::SeqCst);
    loop {
        let old = GroupState::unpack(cur);
        let mut new = old;
        if !child_active() {
            new.active &= !(1 << slot);
            if new.migrator == Some(slot) || new.active == 0 {
                new.migrator = first_bit(new.active);
            }
        }
        new.seq = next_seq(old.seq, step);
        match word.compare_exchange_weak(cur, new.pack(), Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return Transition { old, new },
            Err(w) => cur = w,
        }
    }
}

/// Sets the linked bit of a parentless group. `prepare` sees the state being replaced and
/// must initialise the new parent from it (the parent is unreachable until the exchange
/// succeeds); it runs again if the exchange is retried.
pub(crate) fn link(word: &AtomicU64, prepare: &dyn Fn(GroupState)) -> GroupState {
    let mut cur = word.load(Ordering::SeqCst);
    loop {
        let old = GroupState::unpack(cur);
        prepare(old);
        match word.compare_exchange(cur, cur | LINKED, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return old,
            Err(w) => cur = w,
        }
    }
}

fn first_bit(mask: u32) -> Option<u8> {
    // trailing_zeros of a non-zero u32 is below 32.
    #[allow(clippy::cast_possible_truncation)]
    (mask != 0).then(|| mask.trailing_zeros() as u8)
}

/// Reads and decodes a state word.
pub(crate) fn load(word: &AtomicU64) -> GroupState {
    GroupState::unpack(word.load(Ordering::SeqCst))
}

#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use super::*;

    #[test]
    fn pack_roundtrip() {
        let s = GroupState {
            active: 0b1010,
            migrator: Some(3),
            seq: 77,
            linked: true,
        };
        assert_eq!(GroupState::unpack(s.pack()), s);
        assert_eq!(GroupState::unpack(GroupState::IDLE).migrator, None);
    }

    #[test]
    fn migrator_moves_to_another_active_child() {
        let w = AtomicU64::new(GroupState::IDLE);
        assert_eq!(set_active(&w, 2, 1).new.migrator, Some(2));
        assert_eq!(set_active(&w, 5, 1).new.migrator, Some(2));
        let t = set_inactive(&w, 2, &|| false, 1);
        assert_eq!(t.new.migrator, Some(5));
        assert_eq!(t.new.active, 1 << 5);
        let t = set_inactive(&w, 5, &|| false, 1);
        assert_eq!((t.new.active, t.new.migrator), (0, None));
        // A child that is active again keeps its bit.
        set_active(&w, 1, 1);
        let t = set_inactive(&w, 1, &|| true, 1);
        assert_eq!(t.new.active, 1 << 1);
    }

    /// Why `seq` exists, replayed deterministically with the real transitions: child 0 (the
    /// migrator, the only active child) went idle and its deactivator is inside
    /// `set_inactive`, between reading the group word and its compare-exchange; exactly there
    /// (the `child_active` read, which still sees the child idle) the child comes back and
    /// its `set_active` runs. With `seq` the stale compare-exchange fails and the retry sees
    /// the child active; without, `set_active` rewrote the very word the deactivator read,
    /// the stale exchange succeeds and an active child loses its bit.
    fn deactivate_while_the_child_returns(step: u32) -> GroupState {
        let w = AtomicU64::new(GroupState::IDLE);
        set_active(&w, 0, step);
        let active = std::cell::Cell::new(false);
        let raced = std::cell::Cell::new(false);
        let child_active = || {
            let seen = active.get();
            if !raced.replace(true) {
                active.set(true);
                set_active(&w, 0, step);
            }
            seen
        };
        set_inactive(&w, 0, &child_active, step);
        assert!(active.get() && raced.get());
        load(&w)
    }

    #[test]
    fn stale_cas_is_refused_with_seq() {
        let s = deactivate_while_the_child_returns(1);
        assert_eq!((s.active, s.migrator), (1, Some(0)));
    }

    /// The same interleaving without `seq` loses the child (on x86-64, whose
    /// compare-exchange never fails spuriously: a spurious failure would retry and keep it).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn stale_cas_loses_an_active_child_without_seq() {
        let s = deactivate_while_the_child_returns(0);
        assert_eq!((s.active, s.migrator), (0, None));
    }
}

/// Loom models of the real transitions racing on one word: every interleaving of a
/// deactivation with the child's return (`RUSTFLAGS="--cfg loom"`, see `make loom-tests`).
#[cfg(test)]
#[cfg(loom)]
mod loom_tests {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;
    use crate::sync::AtomicBool;

    /// Children 0 and 1 active, child 0 the migrator. Child 0 went idle: its deactivator
    /// (thread A) clears its bit, reading the child's flag inside `set_inactive`; meanwhile
    /// child 0 comes back (thread B): flag set, then `set_active`. At the end the child is
    /// active, so its bit must be set, and the migrator must be an active child.
    fn deactivate_races_return(step: u32) {
        let w = Arc::new(AtomicU64::new(GroupState::IDLE));
        set_active(&w, 0, step);
        set_active(&w, 1, step);
        let active = Arc::new(AtomicBool::new(false));
        let (w2, active2) = (Arc::clone(&w), Arc::clone(&active));
        let a = thread::spawn(move || {
            set_inactive(&w2, 0, &|| active2.load(Ordering::SeqCst), step);
        });
        active.store(true, Ordering::SeqCst);
        set_active(&w, 0, step);
        a.join()
            .unwrap_or_else(|_| panic!("the deactivator panicked"));
        let s = load(&w);
        assert!(s.active & 1 != 0, "active child lost: {s:?}");
        let m = s.migrator.unwrap_or_else(|| panic!("no migrator: {s:?}"));
        assert!(s.active & (1 << m) != 0, "idle migrator: {s:?}");
    }

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        if b.preemption_bound.is_none() {
            b.preemption_bound = Some(3);
        }
        b.check(f);
    }

    #[test]
    fn loom_set_inactive_races_set_active() {
        model(|| deactivate_races_return(1));
    }

    /// The same with `seq` never bumped: loom finds the stale compare-exchange.
    #[test]
    #[should_panic(expected = "active child lost")]
    fn loom_without_seq_set_inactive_loses_the_child() {
        model(|| deactivate_races_return(0));
    }
}
