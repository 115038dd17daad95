//! Logging for events a guest can trigger at will: the 1st, 2nd, 4th, 8th, ... occurrence of
//! each kind is logged, with the running count, so a guest can cost at most log2(N) lines.

use std::sync::atomic::{AtomicU64, Ordering};

/// A counter that says when an occurrence deserves a log line.
#[derive(Debug, Default)]
pub struct LogLimiter {
    count: AtomicU64,
}

impl LogLimiter {
    /// A limiter with no occurrences yet.
    pub const fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
        }
    }

    /// Records one occurrence; returns its ordinal when it should be logged.
    pub fn hit(&self) -> Option<u64> {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        n.is_power_of_two().then_some(n)
    }

    /// Occurrences so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_logarithmically() {
        let l = LogLimiter::new();
        let logged: Vec<u64> = (0..1000).filter_map(|_| l.hit()).collect();
        assert_eq!(logged, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512]);
        assert_eq!(l.count(), 1000);
    }
}
