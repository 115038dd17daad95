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
        // A reused slot does not honour the stale handle.
        let d = q.arm(1, 'd');
        assert_eq!(d.index, c.index.min(a.index).max(d.index));
        assert_eq!(q.cancel(a), None);
        assert_eq!(q.cancel(c), None);
        assert_eq!(q.cancel(d), Some('d'));
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
    }
}
