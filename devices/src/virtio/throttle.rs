//! A device's rate limiter at work: it admits a request or says it must wait, and then asks
//! for one timer at the instant enough tokens will be there (an effect the transport takes
//! with `VirtioDevice::take_timer_request`), until that timer has fired.
//!
//! The time comes from a clock the VMM hands in (the same one its device timers are armed
//! on); the arithmetic is [`RateLimiter`]'s, on plain values.

use std::sync::Arc;

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::GuestMemory;

use serde::{Deserialize, Serialize};

use crate::rate_limiter::{Nanos, RateLimit, RateLimiter, RateLimiterState, RateStateError};

/// The clock a throttled device reads (monotonic nanoseconds).
pub type DeviceClock = Arc<dyn Fn() -> Nanos + Send + Sync>;

/// A limiter, its clock, and the timer it waits for.
pub struct Throttle {
    limiter: RateLimiter,
    clock: DeviceClock,
    /// The deadline of the timer asked for and not yet fired.
    waiting: Option<Nanos>,
    /// A timer to ask for, not yet taken by the transport.
    request: Option<Nanos>,
    /// While the device is quiesced (a paused VM), the time it was quiesced: a snapshot
    /// measures the buckets and the wait from there, as the pause keeps them.
    frozen: Option<Nanos>,
}

impl Throttle {
    /// A throttle for `limit` on `clock`, its buckets full now.
    pub fn new(limit: RateLimit, clock: DeviceClock) -> Self {
        let now = clock();
        Self {
            limiter: RateLimiter::new(limit, now),
            clock,
            waiting: None,
            request: None,
            frozen: None,
        }
    }

    /// Lets a request of `bytes` go now, or records the wait. `Err(true)`: it must wait and a
    /// new timer is asked for; `Err(false)`: it must wait for the timer already asked for.
    pub fn admit(&mut self, bytes: u64) -> Result<(), bool> {
        let now = (self.clock)();
        match self.limiter.consume(bytes, now) {
            Ok(()) => Ok(()),
            Err(at) if self.waiting.is_some_and(|w| w <= at) => Err(false),
            Err(at) => {
                self.waiting = Some(at);
                self.request = Some(at);
                Err(true)
            }
        }
    }

    /// The timer fired: nothing is waited for any more.
    pub fn fired(&mut self) {
        self.waiting = None;
    }

    /// The timer to ask for, once.
    pub fn take_request(&mut self) -> Option<Nanos> {
        self.request.take()
    }
}

/// A throttle as a snapshot holds it: the buckets, and the refill timer it waits for as the
/// time left until it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleState {
    /// The limiter's buckets.
    pub limiter: RateLimiterState,
    /// Nanoseconds left until the refill timer waited for (if any) fires.
    pub waiting_ns: Option<u64>,
}

impl Throttle {
    /// The device is quiesced (`on`, from now) or released.
    pub fn freeze(&mut self, on: bool) {
        self.frozen = on.then(|| (self.clock)());
    }

    /// The throttle as of now (its clock's), or as of when the device was quiesced: what a
    /// pause keeps (a refill waited for is re-armed on resume with the time it had left).
    pub fn save(&self) -> ThrottleState {
        let now = self.frozen.unwrap_or_else(|| (self.clock)());
        ThrottleState {
            limiter: self.limiter.save(now),
            waiting_ns: self
                .waiting
                .or(self.request)
                .map(|at| at.saturating_sub(now)),
        }
    }

    /// Puts `s` into this throttle (built from the same configuration); a refill timer it
    /// waited for is asked for again, as far ahead as it was ([`Self::take_request`]).
    pub fn restore(&mut self, s: &ThrottleState) -> Result<(), RateStateError> {
        let now = (self.clock)();
        self.limiter.restore(&s.limiter, now)?;
        self.waiting = s.waiting_ns.map(|left| now.saturating_add(left));
        self.request = self.waiting;
        Ok(())
    }
}

/// Restores a device's optional throttle from its optional saved state; one without the
/// other is a snapshot of another configuration.
pub fn restore_optional(
    throttle: Option<&mut Throttle>,
    saved: Option<&ThrottleState>,
) -> Result<(), RateStateError> {
    match (throttle, saved) {
        (Some(t), Some(s)) => t.restore(s),
        (None, None) => Ok(()),
        _ => Err(RateStateError::Shape {
            which: "rate limiter's",
        }),
    }
}

/// What [`pop_admitted`] took from a queue.
pub enum Popped<T> {
    /// A chain to serve (admitted by the limiter, if any).
    Chain(DescriptorChain<T>),
    /// An available-ring entry naming no descriptor (index past the queue's size): skipped.
    BadHead,
    /// Nothing more now: the ring is empty, or the limiter holds the next chain back (it stays
    /// in the ring for the refill timer or the next notification).
    Stop,
}

/// Takes the next available chain of `queue` if `throttle` (if any) admits it, its cost the
/// bytes of its buffers less `overhead` (a request's header and status, a frame's header).
/// A chain held back counts in `throttled` when it asked for a new refill timer.
pub fn pop_admitted<'a, M: GuestMemory>(
    queue: &mut Queue,
    mem: &'a M,
    throttle: Option<&mut Throttle>,
    overhead: u64,
    throttled: &mut u64,
) -> Popped<&'a M> {
    let before = queue.next_avail();
    let Some(chain) = queue.pop_descriptor_chain(mem) else {
        return Popped::Stop;
    };
    if chain.head_index() >= queue.size() {
        return Popped::BadHead;
    }
    if let Some(throttle) = throttle {
        let total: u64 = chain.clone().map(|d| u64::from(d.len())).sum();
        if let Err(new_wait) = throttle.admit(total.saturating_sub(overhead)) {
            queue.set_next_avail(before);
            *throttled += u64::from(new_wait);
            return Popped::Stop;
        }
    }
    Popped::Chain(chain)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn asks_for_one_timer_per_wait() {
        let t = Arc::new(AtomicU64::new(0));
        let clock = t.clone();
        let limit: RateLimit = "ops=10,refill=1s".parse().unwrap();
        let mut th = Throttle::new(limit, Arc::new(move || clock.load(Ordering::Relaxed)));
        for _ in 0..10 {
            assert_eq!(th.admit(0), Ok(()));
        }
        assert_eq!(th.admit(0), Err(true));
        assert_eq!(th.take_request(), Some(100_000_000));
        assert_eq!(th.admit(0), Err(false), "the same wait: no second timer");
        assert_eq!(th.take_request(), None);
        t.store(100_000_000, Ordering::Relaxed);
        th.fired();
        assert_eq!(th.admit(0), Ok(()));
        assert_eq!(th.admit(0), Err(true));
        assert_eq!(th.take_request(), Some(200_000_000));
    }
}
