//! `HostTimer`: the one place where a timer model touches the host (arm at an absolute
//! deadline, disarm). The real ones are the VMM's (`vmm/src/irqchip/user/host_timer.rs`: a
//! vCPU's POSIX-timer tick and the shared timerfds a blocked vCPU or the central thread waits
//! on); this crate programs none and has only the fake, which records what it was told.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::clock::{Nanos, NEVER};

/// Errors from the host timer.
#[derive(Debug, thiserror::Error)]
pub enum HostTimerError {
    /// The timerfd could not be created or programmed.
    #[error("cannot program the host timerfd ({0}); check the process's file-descriptor limit")]
    TimerFd(#[source] std::io::Error),
}

/// A host timer a model programs for a CPU (its host tick) or for the central timer thread.
pub trait HostTimer: Send {
    /// Fires at `deadline` (monotonic ns on the model's clock), replacing any earlier setting.
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError>;
    /// Stops the timer.
    fn disarm(&mut self) -> Result<(), HostTimerError>;
}

/// A host timer that only records its deadline and counts arms and disarms; clones share the
/// record. Fakes made with [`FakeHostTimer::sharing_order`] also number their arms and disarms
/// on one sequence, so a test can tell which of two host timers was programmed first.
#[derive(Debug, Clone)]
pub struct FakeHostTimer {
    deadline: Arc<AtomicU64>,
    arms: Arc<AtomicU64>,
    disarms: Arc<AtomicU64>,
    /// The sequence shared with the fakes made by `sharing_order`.
    order: Arc<AtomicU64>,
    /// The sequence numbers of the last arm and the last disarm (0: none yet).
    last_arm: Arc<AtomicU64>,
    last_disarm: Arc<AtomicU64>,
}

impl Default for FakeHostTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeHostTimer {
    /// A disarmed fake.
    pub fn new() -> Self {
        Self::on_sequence(Arc::new(AtomicU64::new(0)))
    }

    /// A disarmed fake whose arms and disarms are numbered on `other`'s sequence.
    pub fn sharing_order(other: &FakeHostTimer) -> Self {
        Self::on_sequence(Arc::clone(&other.order))
    }

    fn on_sequence(order: Arc<AtomicU64>) -> Self {
        Self {
            deadline: Arc::new(AtomicU64::new(NEVER)),
            arms: Arc::new(AtomicU64::new(0)),
            disarms: Arc::new(AtomicU64::new(0)),
            order,
            last_arm: Arc::new(AtomicU64::new(0)),
            last_disarm: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Where its last arm falls on its sequence (0: never armed).
    pub fn last_arm_seq(&self) -> u64 {
        self.last_arm.load(Ordering::SeqCst)
    }

    /// Where its last disarm falls on its sequence (0: never disarmed).
    pub fn last_disarm_seq(&self) -> u64 {
        self.last_disarm.load(Ordering::SeqCst)
    }

    fn next_seq(&self) -> u64 {
        self.order.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The deadline it is armed for (`NEVER` when disarmed).
    pub fn deadline(&self) -> Nanos {
        self.deadline.load(Ordering::SeqCst)
    }

    /// How many times it was armed.
    pub fn arms(&self) -> u64 {
        self.arms.load(Ordering::SeqCst)
    }

    /// How many times it was disarmed.
    pub fn disarms(&self) -> u64 {
        self.disarms.load(Ordering::SeqCst)
    }

    /// It fires, as a one-shot host timer does at its deadline: disarmed by the host, not
    /// by its owner (not counted as a disarm).
    pub fn expire(&self) {
        self.deadline.store(NEVER, Ordering::SeqCst);
    }
}

impl HostTimer for FakeHostTimer {
    fn arm(&mut self, deadline: Nanos) -> Result<(), HostTimerError> {
        self.arms.fetch_add(1, Ordering::Relaxed);
        self.deadline.store(deadline, Ordering::SeqCst);
        self.last_arm.store(self.next_seq(), Ordering::SeqCst);
        Ok(())
    }

    fn disarm(&mut self) -> Result<(), HostTimerError> {
        self.disarms.fetch_add(1, Ordering::Relaxed);
        self.deadline.store(NEVER, Ordering::SeqCst);
        self.last_disarm.store(self.next_seq(), Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_records() {
        let f = FakeHostTimer::new();
        let mut g = f.clone();
        g.arm(5).unwrap();
        assert_eq!((f.deadline(), f.arms()), (5, 1));
        g.disarm().unwrap();
        assert_eq!(f.deadline(), NEVER);
    }
}
