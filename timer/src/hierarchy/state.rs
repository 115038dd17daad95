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

    /// Why `seq` exists, replayed step by step: a deactivator reads the group state, then sees
    /// the child idle; meanwhile the child goes active again and its `set_active` CAS writes a
    /// word identical to the one the deactivator read. Without `seq` the deactivator's stale
    /// CAS succeeds and clears the bit of an active child: that active CPU is lost.
    #[test]
    fn stale_cas_loses_an_active_child_without_seq() {
        for with_seq in [true, false] {
            let w = AtomicU64::new(GroupState::IDLE);
            let bump = |s: u32| if with_seq { s.wrapping_add(1) } else { s };
            // Child 0 active and migrator.
            let s0 = GroupState {
                active: 1,
                migrator: Some(0),
                seq: 0,
                linked: false,
            };
            w.store(s0.pack(), Ordering::SeqCst);
            // Deactivator (for a child that went idle) reads the state ...
            let read = w.load(Ordering::SeqCst);
            // ... the child is seen idle and the new word is computed ...
            let stale_new = GroupState {
                active: 0,
                migrator: None,
                seq: bump(0),
                linked: false,
            };
            // ... but before its CAS, the child re-activates: set bit (already set), seq++.
            let again = GroupState {
                active: 1,
                migrator: Some(0),
                seq: bump(0),
                linked: false,
            };
            w.store(again.pack(), Ordering::SeqCst);
            let stale =
                w.compare_exchange(read, stale_new.pack(), Ordering::SeqCst, Ordering::SeqCst);
            let lost = stale.is_ok();
            assert_eq!(lost, !with_seq, "with_seq={with_seq}");
        }
    }
}
