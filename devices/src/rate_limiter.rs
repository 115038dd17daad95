//! Token-bucket rate limiting for devices (`--disk ...,bandwidth=BYTES,ops=N`), the model of
//! Firecracker's `TokenBucket`: pure arithmetic over times handed in as values, no thread, no
//! timer, no clock.
//!
//! ```text
//!   size ┤ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─   budget refills linearly: `size` tokens per
//!        │      ╱│        ╱│      ╱        `refill_ns`, never above `size`
//!        │    ╱  │      ╱  │    ╱
//!        │  ╱    │    ╱    │  ╱           a request of n tokens takes n at once, or waits:
//!      0 ┼╱──────┴──╱──────┴╱──── time    `consume` says when enough will be there
//! ```
//!
//! A bucket starts full and may have a one-time burst on top, spent first and never refilled.
//! A request larger than the bucket could never fit: it is let through once the bucket is full
//! and leaves the budget in debt (below zero), which later requests wait out, so it is neither
//! starved nor a way around the rate. Over any window of `w` ns a bucket lets through at most
//! `size + burst + w * size / refill_ns` tokens, plus the overshoot of one oversized request.
//!
//! A [`RateLimiter`] is a bandwidth bucket (bytes) and an operations bucket (requests): a request
//! goes through only if both have room, and then takes from both.

use std::fmt;
use std::str::FromStr;

mod state;
pub use state::{BucketState, RateLimiterState, RateStateError};

/// Nanoseconds on whatever monotonic clock the caller uses for every call.
pub type Nanos = u64;

const NS_PER_SEC: u128 = 1_000_000_000;

/// One token bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    size: u64,
    refill_ns: u64,
    /// Tokens in the bucket; negative after an oversized request (debt).
    budget: i128,
    burst: u64,
    /// The time the budget was last brought up to date; refill counts from here.
    last: Nanos,
    /// Refill since `last` short of a whole token, in token-nanoseconds (< `refill_ns`).
    frac: u128,
}

impl TokenBucket {
    /// A full bucket of `size` tokens that refills `size` tokens every `refill_ns`, with a
    /// one-time `burst` on top, as of time `now`. `None` if `size` or `refill_ns` is zero.
    pub fn new(size: u64, burst: u64, refill_ns: u64, now: Nanos) -> Option<Self> {
        (size > 0 && refill_ns > 0).then_some(Self {
            size,
            refill_ns,
            budget: i128::from(size),
            burst,
            last: now,
            frac: 0,
        })
    }

    /// The bucket's capacity.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Adds what refilled since the last update. Refill is counted exactly in token-
    /// nanoseconds (`size` per elapsed ns, `refill_ns` of them make a token): what does not
    /// make a whole token yet is kept for the next update, so nothing is lost to rounding.
    fn refill(&mut self, now: Nanos) {
        let elapsed = u128::from(now.saturating_sub(self.last));
        self.last = now.max(self.last);
        let credit = self.frac + elapsed * u128::from(self.size);
        let tokens = credit / u128::from(self.refill_ns);
        self.frac = credit % u128::from(self.refill_ns);
        let room = (i128::from(self.size) - self.budget).max(0).unsigned_abs();
        if tokens >= room {
            self.budget = i128::from(self.size);
            self.frac = 0;
        } else {
            // tokens < room <= size + debt, so this fits.
            self.budget += i128::try_from(tokens).unwrap_or(i128::MAX);
        }
    }

    /// Tokens that must be in the budget (beyond the burst) before `n` may go.
    fn needed(&self, n: u64) -> i128 {
        i128::from(n.saturating_sub(self.burst).min(self.size))
    }

    /// Brings the bucket to `now` and says whether `n` tokens may go at once.
    pub fn fits(&mut self, n: u64, now: Nanos) -> bool {
        self.refill(now);
        self.budget >= self.needed(n)
    }

    /// Takes `n` tokens (burst first); call only after [`Self::fits`] said yes.
    pub fn take(&mut self, n: u64) {
        let from_burst = n.min(self.burst);
        self.burst -= from_burst;
        self.budget -= i128::from(n - from_burst);
    }

    /// When `n` tokens will fit, as of the last update (at or after it; exact: at that time
    /// [`Self::fits`] says yes).
    pub fn ready_at(&self, n: u64) -> Nanos {
        let deficit = (self.needed(n) - self.budget).max(0).unsigned_abs();
        let credit = (deficit * u128::from(self.refill_ns)).saturating_sub(self.frac);
        let wait = credit.div_ceil(u128::from(self.size));
        self.last
            .saturating_add(u64::try_from(wait).unwrap_or(u64::MAX))
    }

    /// Takes `n` tokens at `now` if they fit; otherwise the time they will.
    pub fn consume(&mut self, n: u64, now: Nanos) -> Result<(), Nanos> {
        if self.fits(n, now) {
            self.take(n);
            Ok(())
        } else {
            Err(self.ready_at(n))
        }
    }
}

/// A rate limit as configured: bytes and operations per second, a one-time burst of bytes and
/// the bucket's depth in time (`bandwidth=10M,ops=1000,burst=1M,refill=100ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimit {
    /// Bytes per second; 0: unlimited.
    pub bytes_per_sec: u64,
    /// Requests per second; 0: unlimited.
    pub ops_per_sec: u64,
    /// A one-time burst of bytes on top of the bandwidth bucket.
    pub burst_bytes: u64,
    /// How much time's worth of the rate a bucket holds (its depth); 0: the default, 100 ms.
    pub refill_ns: u64,
}

/// The bucket depth when none is given.
pub const DEFAULT_REFILL_NS: u64 = 100_000_000;

impl RateLimit {
    /// Whether anything is limited.
    pub fn is_limited(&self) -> bool {
        self.bytes_per_sec > 0 || self.ops_per_sec > 0
    }

    fn depth_ns(&self) -> u64 {
        if self.refill_ns == 0 {
            DEFAULT_REFILL_NS
        } else {
            self.refill_ns
        }
    }

    /// A bucket holding `depth` of `per_sec`, refilled in `depth` (so: `per_sec` a second).
    fn bucket(&self, per_sec: u64, burst: u64, now: Nanos) -> Option<TokenBucket> {
        let depth = self.depth_ns();
        let size = u128::from(per_sec) * u128::from(depth) / NS_PER_SEC;
        let size = u64::try_from(size.max(1)).unwrap_or(u64::MAX);
        // Refill `size` tokens in the time they take at `per_sec` (exact when size >= 1).
        let refill = u128::from(size) * NS_PER_SEC / u128::from(per_sec.max(1));
        let refill = u64::try_from(refill.max(1)).unwrap_or(u64::MAX);
        (per_sec > 0)
            .then(|| TokenBucket::new(size, burst, refill, now))
            .flatten()
    }
}

/// A `--disk` rate option that does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RateLimitError {
    /// A size that is not a number with an optional K, M or G (binary) suffix.
    #[error("'{0}' is not a size: write bytes with an optional K, M or G suffix, e.g. 10M")]
    BadSize(String),
    /// A count that is not a number.
    #[error("'{0}' is not a count of operations per second")]
    BadCount(String),
    /// A duration that is not `N`ms, `N`us or `N`s.
    #[error("'{0}' is not a refill time: write e.g. 100ms, 500us or 1s")]
    BadDuration(String),
}

/// Bytes from `10M`-style text (K, M, G are binary).
pub fn parse_size(s: &str) -> Result<u64, RateLimitError> {
    let bad = || RateLimitError::BadSize(s.to_string());
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).ok_or_else(bad)
}

/// Nanoseconds from `100ms`, `500us`, `1s` (a plain number is milliseconds).
pub fn parse_refill(s: &str) -> Result<u64, RateLimitError> {
    let bad = || RateLimitError::BadDuration(s.to_string());
    let (digits, scale) = if let Some(d) = s.strip_suffix("ms") {
        (d, 1_000_000)
    } else if let Some(d) = s.strip_suffix("us") {
        (d, 1_000)
    } else if let Some(d) = s.strip_suffix('s') {
        (d, 1_000_000_000)
    } else {
        (s, 1_000_000)
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(scale).filter(|&ns| ns > 0).ok_or_else(bad)
}

impl RateLimit {
    /// Applies one `key=value` option if it is a rate option; `Ok(false)`: not one of ours.
    pub fn apply_option(&mut self, key: &str, value: &str) -> Result<bool, RateLimitError> {
        match key {
            "bandwidth" => self.bytes_per_sec = parse_size(value)?,
            "ops" => {
                self.ops_per_sec = value
                    .parse()
                    .map_err(|_| RateLimitError::BadCount(value.to_string()))?;
            }
            "burst" => self.burst_bytes = parse_size(value)?,
            "refill" => self.refill_ns = parse_refill(value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl fmt::Display for RateLimit {
    /// The options that differ from the defaults, each with a leading comma.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bytes_per_sec > 0 {
            write!(f, ",bandwidth={}", self.bytes_per_sec)?;
        }
        if self.ops_per_sec > 0 {
            write!(f, ",ops={}", self.ops_per_sec)?;
        }
        if self.burst_bytes > 0 {
            write!(f, ",burst={}", self.burst_bytes)?;
        }
        if self.refill_ns > 0 {
            write!(f, ",refill={}us", self.refill_ns / 1_000)?;
        }
        Ok(())
    }
}

impl FromStr for RateLimit {
    type Err = RateLimitError;

    /// `bandwidth=10M,ops=1000,burst=1M,refill=100ms`, any subset, any order; other keys are
    /// refused as a bad count.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut limit = Self::default();
        for option in s.split(',').filter(|o| !o.is_empty()) {
            let (k, v) = option.split_once('=').unwrap_or((option, ""));
            if !limit.apply_option(k, v)? {
                return Err(RateLimitError::BadCount(option.to_string()));
            }
        }
        Ok(limit)
    }
}

/// A device's limiter: a bandwidth bucket and an operations bucket, each optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimiter {
    bytes: Option<TokenBucket>,
    ops: Option<TokenBucket>,
}

impl RateLimiter {
    /// The limiter of `limit`, its buckets full at `now`.
    pub fn new(limit: RateLimit, now: Nanos) -> Self {
        Self {
            bytes: limit.bucket(limit.bytes_per_sec, limit.burst_bytes, now),
            ops: limit.bucket(limit.ops_per_sec, 0, now),
        }
    }

    /// Lets one request of `bytes` go at `now` (taking from both buckets), or says when it
    /// will fit in both.
    pub fn consume(&mut self, bytes: u64, now: Nanos) -> Result<(), Nanos> {
        let bytes_fit = self.bytes.as_mut().is_none_or(|b| b.fits(bytes, now));
        let ops_fit = self.ops.as_mut().is_none_or(|b| b.fits(1, now));
        if bytes_fit && ops_fit {
            if let Some(b) = &mut self.bytes {
                b.take(bytes);
            }
            if let Some(b) = &mut self.ops {
                b.take(1);
            }
            return Ok(());
        }
        let at = |b: &Option<TokenBucket>, n| b.as_ref().map_or(now, |b| b.ready_at(n).max(now));
        Err(at(&self.bytes, bytes).max(at(&self.ops, 1)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_bucket_starts_full_and_refills_linearly() {
        // 1000 tokens per 1 ms.
        let mut b = TokenBucket::new(1000, 0, 1_000_000, 0).unwrap();
        assert_eq!(b.consume(1000, 0), Ok(()));
        assert_eq!(b.consume(1, 0), Err(1_000));
        assert_eq!(b.consume(500, 250_000), Err(500_000));
        assert_eq!(b.consume(500, 500_000), Ok(()));
        assert!(TokenBucket::new(0, 0, 1, 0).is_none());
        assert!(TokenBucket::new(1, 0, 0, 0).is_none());
    }

    #[test]
    fn the_burst_goes_first_and_is_not_refilled() {
        let mut b = TokenBucket::new(100, 50, 1_000, 0).unwrap();
        assert_eq!(b.consume(150, 0), Ok(()));
        assert_eq!(b.consume(100, 1_000), Ok(()));
        assert!(
            b.consume(101, 1_000_000).is_ok(),
            "oversized: let through when full"
        );
        assert_eq!(b.consume(1, 1_000_000), Err(1_000_000 + 20));
    }

    #[test]
    fn the_limiter_waits_for_both_buckets() {
        let limit: RateLimit = "bandwidth=1M,ops=10,refill=1s".parse().unwrap();
        let mut l = RateLimiter::new(limit, 0);
        for _ in 0..10 {
            assert_eq!(l.consume(4096, 0), Ok(()));
        }
        // Ops bucket empty: one op every 100 ms.
        assert_eq!(l.consume(4096, 0), Err(100_000_000));
        assert_eq!(l.consume(4096, 100_000_000), Ok(()));
        let none = RateLimiter::new(RateLimit::default(), 0);
        assert_eq!(none.clone().consume(u64::MAX, 0), Ok(()));
    }

    #[test]
    fn options_parse_and_print() {
        let l: RateLimit = "bandwidth=10M,ops=1000,burst=1K,refill=50ms"
            .parse()
            .unwrap();
        assert_eq!(
            l,
            RateLimit {
                bytes_per_sec: 10 << 20,
                ops_per_sec: 1000,
                burst_bytes: 1024,
                refill_ns: 50_000_000
            }
        );
        assert_eq!(l.to_string()[1..].parse::<RateLimit>(), Ok(l));
        assert!("bandwidth=10X".parse::<RateLimit>().is_err());
        assert!("ops=-1".parse::<RateLimit>().is_err());
        assert!("refill=0ms".parse::<RateLimit>().is_err());
        assert!("speed=3".parse::<RateLimit>().is_err());
        assert!(!RateLimit::default().is_limited());
    }

    proptest! {
        /// Whatever the requests and their times, a bucket never lets through more than its
        /// size, its burst and what refilled over any window between two admissions.
        #[test]
        fn never_more_than_size_burst_and_refill(
            size in 1u64..10_000,
            burst in 0u64..5_000,
            refill in 1u64..10_000_000,
            steps in prop::collection::vec((0u64..2_000_000, 1u64..10_000), 1..200),
        ) {
            let mut b = TokenBucket::new(size, burst, refill, 0).unwrap();
            let mut now = 0;
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (dt, n) in steps {
                now += dt;
                let n = n.min(size);
                if b.consume(n, now).is_ok() {
                    admitted.push((now, n));
                }
            }
            for i in 0..admitted.len() {
                let mut sum: u128 = 0;
                for &(t, n) in &admitted[i..] {
                    sum += u128::from(n);
                    let window = u128::from(t - admitted[i].0);
                    let bound = u128::from(size) + u128::from(burst)
                        + window * u128::from(size) / u128::from(refill);
                    prop_assert!(sum <= bound, "{sum} > {bound}");
                }
            }
        }

        /// No starvation: a refused request fits at the time the bucket names, whatever its
        /// size (an oversized one once the bucket is full).
        #[test]
        fn a_request_fits_when_the_bucket_says(
            size in 1u64..10_000,
            burst in 0u64..5_000,
            refill in 1u64..10_000_000,
            steps in prop::collection::vec((0u64..2_000_000, 1u64..30_000), 1..100),
        ) {
            let mut b = TokenBucket::new(size, burst, refill, 0).unwrap();
            let mut now = 0;
            for (dt, n) in steps {
                now += dt;
                if let Err(at) = b.consume(n, now) {
                    prop_assert!(at > now);
                    // Exact: not a nanosecond earlier.
                    prop_assert!(!b.clone().fits(n, at - 1));
                    now = at;
                    prop_assert_eq!(b.consume(n, now), Ok(()));
                }
            }
        }
    }
}
