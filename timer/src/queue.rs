//! `TimerQueue`: an indexed binary min-heap of deadlines with cancel and re-arm by handle.
//!
//! Timers live in a slab (`entries`) so a handle is a slot number plus a generation; the heap
//! holds `(deadline, slot)` pairs and every entry remembers its heap position, so cancel and
//! re-arm are O(log n) without searching. Freed slots are reused; the generation makes a stale
//! handle harmless. A base holds a handful of timers, so the heap stays in one or two cache
//! lines and arm + cancel is a few dozen instructions, no allocation once warm.

// Heap positions are below the slab length, which `arm` keeps within u32.
#![allow(clippy::cast_possible_truncation)]

use crate::clock::Nanos;

/// Marks an entry that is not in the heap (free, or fired).
const NOT_QUEUED: u32 = u32::MAX;

/// A handle into one queue: slot plus generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Slot {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

#[derive(Debug)]
struct Entry<T> {
    gen: u32,
    pos: u32,
    deadline: Nanos,
    payload: Option<T>,
}

/// An indexed min-heap of timers keyed by deadline.
#[derive(Debug)]
pub(crate) struct TimerQueue<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    heap: Vec<(Nanos, u32)>,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> TimerQueue<T> {
    pub(crate) fn new() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            heap: Vec::new(),
        }
    }

    /// Number of pending timers.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Earliest pending deadline.
    pub(crate) fn peek(&self) -> Option<Nanos> {
        self.heap.first().map(|&(d, _)| d)
    }

    /// Queues a timer and returns its slot.
    pub(crate) fn arm(&mut self, deadline: Nanos, payload: T) -> Slot {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.entries.len()).unwrap_or(u32::MAX - 1);
                self.entries.push(Entry {
                    gen: 0,
                    pos: NOT_QUEUED,
                    deadline: 0,
                    payload: None,
                });
                i
            }
        };
        let pos = self.heap.len();
        let e = &mut self.entries[index as usize];
        e.deadline = deadline;
        e.payload = Some(payload);
        e.pos = pos as u32;
        let gen = e.gen;
        self.heap.push((deadline, index));
        self.sift_up(pos);
        Slot { index, gen }
    }

    fn live(&self, s: Slot) -> Option<&Entry<T>> {
        self.entries
            .get(s.index as usize)
            .filter(|e| e.gen == s.gen && e.pos != NOT_QUEUED)
    }

    /// Deadline of a pending timer.
    pub(crate) fn deadline(&self, s: Slot) -> Option<Nanos> {
        self.live(s).map(|e| e.deadline)
    }

    /// Removes a pending timer; `None` if it already fired or was cancelled.
    pub(crate) fn cancel(&mut self, s: Slot) -> Option<T> {
        let pos = self.live(s)?.pos as usize;
        self.remove_at(pos);
        Some(self.release(s.index))
    }

    /// Moves a pending timer to a new deadline; false if it is no longer pending.
    pub(crate) fn rearm(&mut self, s: Slot, deadline: Nanos) -> bool {
        let Some(e) = self.live(s) else {
            return false;
        };
        let pos = e.pos as usize;
        let old = e.deadline;
        self.entries[s.index as usize].deadline = deadline;
        self.heap[pos].0 = deadline;
        if deadline < old {
            self.sift_up(pos);
        } else {
            self.sift_down(pos);
        }
        true
    }

    /// Pops the earliest timer if its deadline is at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Nanos) -> Option<(Slot, Nanos, T)> {
        let &(deadline, index) = self.heap.first()?;
        if deadline > now {
            return None;
        }
        self.remove_at(0);
        let gen = self.entries[index as usize].gen;
        let payload = self.release(index);
        Some((Slot { index, gen }, deadline, payload))
    }

    fn release(&mut self, index: u32) -> T {
        let e = &mut self.entries[index as usize];
        e.pos = NOT_QUEUED;
        e.gen = e.gen.wrapping_add(1);
        self.free.push(index);
        // Invariant: a queued entry always holds its payload.
        e.payload
            .take()
            .unwrap_or_else(|| unreachable!("queued timer without payload"))
    }

    fn remove_at(&mut self, pos: usize) {
        let last = self.heap.len() - 1;
        self.heap.swap(pos, last);
        self.heap.pop();
        if pos < self.heap.len() {
            self.entries[self.heap[pos].1 as usize].pos = pos as u32;
            self.sift_down(pos);
            self.sift_up(pos);
        }
    }

    fn sift_up(&mut self, mut pos: usize) {
        let item = self.heap[pos];
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.heap[parent].0 <= item.0 {
                break;
            }
            self.heap[pos] = self.heap[parent];
            self.entries[self.heap[pos].1 as usize].pos = pos as u32;
            pos = parent;
        }
        self.heap[pos] = item;
        self.entries[item.1 as usize].pos = pos as u32;
    }

    fn sift_down(&mut self, mut pos: usize) {
        let item = self.heap[pos];
        let n = self.heap.len();
        loop {
            let l = 2 * pos + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let c = if r < n && self.heap[r].0 < self.heap[l].0 {
                r
            } else {
                l
            };
            if self.heap[c].0 >= item.0 {
                break;
            }
            self.heap[pos] = self.heap[c];
            self.entries[self.heap[pos].1 as usize].pos = pos as u32;
            pos = c;
        }
        self.heap[pos] = item;
        self.entries[item.1 as usize].pos = pos as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn arm_cancel_pop() {
        let mut q = TimerQueue::new();
        let a = q.arm(30, 'a');
        let b = q.arm(10, 'b');
        let c = q.arm(20, 'c');
        assert_eq!(q.peek(), Some(10));
        assert_eq!(q.cancel(b), Some('b'));
        assert_eq!(q.cancel(b), None);
        assert!(q.rearm(a, 5));
        assert_eq!(q.pop_due(4), None);
        assert_eq!(q.pop_due(100).map(|x| x.2), Some('a'));
        assert_eq!(q.pop_due(100).map(|x| x.2), Some('c'));
        assert!(!q.rearm(c, 1));
        assert_eq!(q.len(), 0);
        // Three slots were used and all three freed: `d` reuses one of them (no fourth slot),
        // and the stale handle of that slot's previous timer neither sees nor moves `d`.
        let d = q.arm(1, 'd');
        let stale = [a, b, c].into_iter().find(|s| s.index == d.index);
        let stale = stale.unwrap_or_else(|| panic!("slot {} is new, none was reused", d.index));
        assert_eq!(q.deadline(stale), None);
        assert!(!q.rearm(stale, 50));
        assert_eq!(q.cancel(stale), None);
        assert_eq!((q.deadline(d), q.len()), (Some(1), 1));
        assert_eq!(q.cancel(a), None);
        assert_eq!(q.cancel(c), None);
        assert_eq!(q.cancel(d), Some('d'));
    }

    /// Slot reuse against a model that knows nothing of the queue's free list: which slot
    /// indices exist, which are free, which handles are live and which are stale.
    #[derive(Default)]
    struct SlotModel {
        /// Live timers: handle, deadline, payload (unique per arm).
        live: Vec<(Slot, u64, usize)>,
        /// Handles of timers that were cancelled or fired.
        stale: Vec<Slot>,
        /// Indices freed and not handed out again.
        free: std::collections::BTreeSet<u32>,
        /// Distinct indices ever handed out.
        slots: u32,
    }

    impl SlotModel {
        /// A timer was armed into `s`: a freed index if there is one, else a new one.
        fn armed(&mut self, s: Slot, deadline: u64, payload: usize) -> Result<(), TestCaseError> {
            if self.free.is_empty() {
                prop_assert_eq!(s.index, self.slots, "no slot was free: expected a new one");
                self.slots += 1;
            } else {
                prop_assert!(
                    self.free.remove(&s.index),
                    "slot {} is not one of the freed {:?}",
                    s.index,
                    self.free
                );
            }
            prop_assert!(self.live.iter().all(|l| l.0.index != s.index));
            self.live.push((s, deadline, payload));
            Ok(())
        }

        /// The live timer `i` was cancelled or fired.
        fn gone(&mut self, i: usize) -> (Slot, u64, usize) {
            let l = self.live.remove(i);
            self.free.insert(l.0.index);
            self.stale.push(l.0);
            l
        }

        /// Every live timer is still pending with its deadline.
        fn check(&self, q: &TimerQueue<usize>) -> Result<(), TestCaseError> {
            for l in &self.live {
                prop_assert_eq!(q.deadline(l.0), Some(l.1));
            }
            prop_assert_eq!(q.len(), self.live.len());
            prop_assert_eq!(q.peek(), self.live.iter().map(|l| l.1).min());
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn behaves_like_a_sorted_list(ops in proptest::collection::vec((0u8..4, 0u64..100, 0usize..16), 1..200)) {
            let mut q = TimerQueue::new();
            let mut model: Vec<(Slot, u64, usize)> = Vec::new();
            let mut handles: Vec<Slot> = Vec::new();
            for (i, (op, t, pick)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => { let s = q.arm(t, i); model.push((s, t, i)); handles.push(s); }
                    2 => if let Some(&h) = handles.get(pick % handles.len().max(1)) {
                        let want = model.iter().position(|m| m.0 == h).map(|p| model.remove(p).2);
                        prop_assert_eq!(q.cancel(h), want);
                    },
                    _ => if let Some(&h) = handles.get(pick % handles.len().max(1)) {
                        let live = model.iter_mut().find(|m| m.0 == h);
                        let ok = live.is_some();
                        if let Some(m) = live { m.1 = t; }
                        prop_assert_eq!(q.rearm(h, t), ok);
                    },
                }
                prop_assert_eq!(q.peek(), model.iter().map(|m| m.1).min());
                prop_assert_eq!(q.len(), model.len());
            }
            let mut last = 0;
            while let Some((s, d, p)) = q.pop_due(u64::MAX) {
                prop_assert!(d >= last);
                last = d;
                let m = model.iter().position(|m| m.0 == s).map(|i| model.remove(i));
                prop_assert_eq!(m.map(|m| (m.1, m.2)), Some((d, p)));
            }
            prop_assert!(model.is_empty());
        }

        /// Arms, cancels, re-arms and pops at random, with stale handles (of timers cancelled
        /// or fired, whose slots the queue reuses) used as often as live ones: a new timer
        /// takes a freed slot whenever there is one, and a stale handle never cancels, moves
        /// or sees the live timer that now holds its slot.
        #[test]
        fn reused_slots_ignore_stale_handles(ops in proptest::collection::vec((0u8..6, 0u64..100, 0usize..64), 1..300)) {
            let mut q = TimerQueue::new();
            let mut m = SlotModel::default();
            for (i, (op, t, pick)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => m.armed(q.arm(t, i), t, i)?,
                    2 if !m.live.is_empty() => {
                        let k = pick % m.live.len();
                        let h = m.live[k].0;
                        let (_, _, p) = m.gone(k);
                        prop_assert_eq!(q.cancel(h), Some(p));
                    }
                    3 if !m.live.is_empty() => {
                        let k = pick % m.live.len();
                        prop_assert!(q.rearm(m.live[k].0, t));
                        m.live[k].1 = t;
                    }
                    4 if !m.stale.is_empty() => {
                        let h = m.stale[pick % m.stale.len()];
                        prop_assert_eq!(q.deadline(h), None);
                        prop_assert_eq!(q.cancel(h), None);
                        prop_assert!(!q.rearm(h, t));
                    }
                    _ => match q.pop_due(t) {
                        Some((s, d, p)) => {
                            let k = m.live.iter().position(|l| l.2 == p);
                            let k = k.ok_or_else(|| TestCaseError::fail(format!("popped unknown {p}")))?;
                            prop_assert_eq!(Some(d), m.live.iter().map(|l| l.1).min());
                            let (ls, ld, _) = m.gone(k);
                            prop_assert_eq!((s, d), (ls, ld));
                            prop_assert!(d <= t);
                        }
                        None => prop_assert!(m.live.iter().all(|l| l.1 > t)),
                    },
                }
                m.check(&q)?;
            }
        }
    }
}
