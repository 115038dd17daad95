//! A rate limiter's buckets as a snapshot holds them: each bucket's tokens, its unspent burst,
//! its refill short of a whole token, and how long before the save it was last brought up to
//! date (the refill position, as time, so that it means the same on another host's clock).
//! The bucket's size and refill period are not saved: they come from the VM's configuration,
//! and [`RateLimiter::restore`] checks the saved values against them.

use serde::{Deserialize, Serialize};

use super::{Nanos, RateLimiter, TokenBucket};

/// The most debt a bucket can be in: one request larger than the bucket, and no chain
/// carries more than 4 GiB.
const MAX_DEBT: i64 = 1 << 32;

/// One bucket's saved state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketState {
    /// Tokens in the bucket; negative while in debt.
    pub budget: i64,
    /// The one-time burst not spent yet.
    pub burst: u64,
    /// Refill short of a whole token, in token-nanoseconds.
    pub frac: u64,
    /// Nanoseconds between the bucket's last update and the save.
    pub since_update_ns: u64,
}

/// A limiter's saved state (`None`: that bucket is not configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterState {
    /// The bandwidth bucket.
    pub bytes: Option<BucketState>,
    /// The operations bucket.
    pub ops: Option<BucketState>,
}

/// Why a saved limiter does not fit the configured one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateStateError {
    /// The saved buckets are not the configured ones.
    #[error("The saved {which} bucket does not match the configured rate limit: the snapshot's configuration or state is corrupt")]
    Shape {
        /// `bandwidth` or `ops`.
        which: &'static str,
    },
    /// A saved value is out of its range.
    #[error("The saved {which} bucket holds an impossible {field} ({value}): corrupt snapshot")]
    Range {
        /// `bandwidth` or `ops`.
        which: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: i128,
    },
}

impl TokenBucket {
    fn save(&self, now: Nanos) -> BucketState {
        BucketState {
            budget: i64::try_from(
                self.budget
                    .clamp(-i128::from(MAX_DEBT), i128::from(self.size)),
            )
            .unwrap_or(0),
            burst: self.burst,
            frac: u64::try_from(self.frac).unwrap_or(0),
            since_update_ns: now.saturating_sub(self.last),
        }
    }

    fn restore(
        &mut self,
        s: &BucketState,
        now: Nanos,
        which: &'static str,
    ) -> Result<(), RateStateError> {
        let range = |field, value: i128| RateStateError::Range {
            which,
            field,
            value,
        };
        if s.budget > i64::try_from(self.size).unwrap_or(i64::MAX) || s.budget < -MAX_DEBT {
            return Err(range("budget", i128::from(s.budget)));
        }
        if s.burst > self.burst {
            return Err(range("burst", i128::from(s.burst)));
        }
        if s.frac >= self.refill_ns {
            return Err(range("refill fraction", i128::from(s.frac)));
        }
        self.budget = i128::from(s.budget);
        self.burst = s.burst;
        self.frac = u128::from(s.frac);
        self.last = now.saturating_sub(s.since_update_ns);
        Ok(())
    }
}

impl RateLimiter {
    /// The buckets as of `now`.
    pub fn save(&self, now: Nanos) -> RateLimiterState {
        RateLimiterState {
            bytes: self.bytes.as_ref().map(|b| b.save(now)),
            ops: self.ops.as_ref().map(|b| b.save(now)),
        }
    }

    /// Puts the saved buckets `s` into this limiter (built from the same configuration) at
    /// `now`; on an error the limiter may be partly restored and should be dropped.
    pub fn restore(&mut self, s: &RateLimiterState, now: Nanos) -> Result<(), RateStateError> {
        for (which, bucket, saved) in [
            ("bandwidth", &mut self.bytes, &s.bytes),
            ("ops", &mut self.ops, &s.ops),
        ] {
            match (bucket, saved) {
                (Some(b), Some(saved)) => b.restore(saved, now, which)?,
                (None, None) => {}
                _ => return Err(RateStateError::Shape { which }),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::RateLimit;
    use super::*;

    proptest! {
        /// A limiter saved at any point of any request sequence and restored on a clock
        /// shifted by any offset answers every later request as the original does.
        #[test]
        fn a_restored_limiter_behaves_as_the_saved_one(
            before in proptest::collection::vec((0u64..5_000, 0u64..3_000_000), 0..40),
            after in proptest::collection::vec((0u64..5_000, 0u64..3_000_000), 1..40),
            shift in 0u64..1 << 50,
        ) {
            let limit: RateLimit = "bandwidth=100K,ops=50,burst=4K,refill=10ms".parse().unwrap();
            let mut now = 1_000;
            let mut original = RateLimiter::new(limit, now);
            for (bytes, dt) in before {
                now += dt;
                let _ = original.consume(bytes, now);
            }
            let saved = original.save(now);
            let text = serde_json::to_string(&saved).unwrap();
            let mut restored = RateLimiter::new(limit, now + shift);
            restored.restore(&serde_json::from_str(&text).unwrap(), now + shift).unwrap();
            for (bytes, dt) in after {
                now += dt;
                let a = original.consume(bytes, now);
                let b = restored.consume(bytes, now + shift).map_err(|at| at - shift);
                prop_assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn impossible_buckets_are_refused() {
        let limit: RateLimit = "bandwidth=1M,refill=1s".parse().unwrap();
        let good = RateLimiter::new(limit, 0).save(0);
        let mut l = RateLimiter::new(limit, 0);
        let bytes = good.bytes.unwrap();
        for bad in [
            BucketState {
                budget: i64::MAX,
                ..bytes
            },
            BucketState {
                budget: i64::MIN,
                ..bytes
            },
            BucketState {
                frac: u64::MAX,
                ..bytes
            },
            BucketState { burst: 1, ..bytes },
        ] {
            let s = RateLimiterState {
                bytes: Some(bad),
                ops: None,
            };
            assert!(
                matches!(l.restore(&s, 0), Err(RateStateError::Range { .. })),
                "{bad:?}"
            );
        }
        let extra = RateLimiterState {
            bytes: Some(bytes),
            ops: Some(bytes),
        };
        assert_eq!(
            l.restore(&extra, 0),
            Err(RateStateError::Shape { which: "ops" })
        );
        assert_eq!(l.restore(&good, 0), Ok(()));
    }
}
