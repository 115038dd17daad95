//! A synthetic load of device/housekeeping deadlines (`--global-timers COUNT[,period=MS]`):
//! every vCPU keeps COUNT global timers armed, each re-armed when it fires at a jittered
//! interval around the period. Whoever expires one (its vCPU, a migrator, the timer thread)
//! queues it for re-arming; the next vCPU to run arms it on its own base, so the load follows
//! running vCPUs, like Linux's non-pinned timers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::config::knobs::GlobalTimersConfig;

/// The VM-wide load: timers waiting to be re-armed, and counters.
#[derive(Debug)]
pub struct GlobalLoad {
    cfg: GlobalTimersConfig,
    pending: Mutex<Vec<u32>>,
    /// Fires executed by the `central` model's timer thread.
    pub timer_thread_fires: AtomicU64,
}

impl GlobalLoad {
    /// The load.
    pub fn new(cfg: GlobalTimersConfig) -> Self {
        Self {
            cfg,
            pending: Mutex::new(Vec::new()),
            timer_thread_fires: AtomicU64::new(0),
        }
    }

    /// The setting.
    pub fn config(&self) -> GlobalTimersConfig {
        self.cfg
    }

    /// The slots vCPU `cpu` arms at start.
    pub fn initial_slots(&self, cpu: u32) -> impl Iterator<Item = u32> {
        let count = self.cfg.count;
        (0..count).map(move |i| cpu * count + i)
    }

    /// The vCPU whose base slot `slot` belongs to (the inverse of [`Self::initial_slots`]).
    pub fn owner(&self, slot: u32) -> usize {
        usize::try_from(slot / self.cfg.count.max(1)).unwrap_or(usize::MAX)
    }

    /// When slot `slot` next fires if armed at `now`: the period, jittered by +-50%.
    pub fn next_deadline(&self, slot: u32, now: u64) -> u64 {
        let p = self.cfg.period_ns;
        let mix = (u64::from(slot).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ now)
            .wrapping_mul(0xbf58_476d_1ce4_e5b9);
        now + p / 2 + (mix >> 11) % p
    }

    /// A slot fired: queue it for re-arming.
    pub fn fired(&self, slot: u32) {
        timer::lock(&self.pending).push(slot);
    }

    /// Takes the slots waiting to be re-armed.
    pub fn take_pending(&self) -> Vec<u32> {
        let mut p = timer::lock(&self.pending);
        if p.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut *p)
        }
    }

    /// Counts a fire on the timer thread.
    pub fn timer_thread_fired(&self) {
        self.timer_thread_fires.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_jitter_within_half_a_period_and_slots_requeue() {
        let g = GlobalLoad::new("3,period=10".parse().unwrap());
        for slot in 0..100 {
            let d = g.next_deadline(slot, 1_000);
            assert!((1_000 + 5_000_000..1_000 + 15_000_000).contains(&d), "{d}");
        }
        assert_eq!(g.initial_slots(2).collect::<Vec<_>>(), vec![6, 7, 8]);
        for cpu in 0..4u32 {
            for slot in g.initial_slots(cpu) {
                assert_eq!(g.owner(slot), cpu as usize);
            }
        }
        g.fired(7);
        g.fired(1);
        assert_eq!(g.take_pending(), vec![7, 1]);
        assert!(g.take_pending().is_empty());
    }
}
