//! The spread of a sample of times (p50, p99, max), as the snapshot, clones and density
//! reports give restore and pause times.

use serde::{Deserialize, Serialize};

/// p50, p99 and max of a sample (nearest rank), and its size.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Spread {
    /// Values in the sample.
    pub n: usize,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank: the max below 100 values).
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` if there are none.
    pub fn of(mut values: Vec<f64>) -> Option<Self> {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let rank = |percent: usize| {
            // Nearest rank: the smallest value with at least `percent` of the sample at or
            // below it.
            let r = (n * percent).div_ceil(100);
            values[r.clamp(1, n) - 1]
        };
        (n > 0).then(|| Self {
            n,
            p50: rank(50),
            p99: rank(99),
            max: values[n - 1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_take_the_nearest_rank() {
        assert_eq!(Spread::of(Vec::new()), None);
        let one = Spread::of(vec![3.0]).unwrap();
        assert_eq!((one.n, one.p50, one.p99, one.max), (1, 3.0, 3.0, 3.0));
        let s = Spread::of((1..=200).rev().map(f64::from).collect()).unwrap();
        assert_eq!((s.n, s.p50, s.p99, s.max), (200, 100.0, 198.0, 200.0));
        let s = Spread::of(vec![4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!((s.p50, s.p99, s.max), (2.0, 4.0, 4.0));
    }
}
