//! Synchronized idle injection (`--idle-inject percent=P,period=MS`): in every period, the first
//! P% is a window in which every vCPU of the VM is held idle. Windows are aligned to the VM
//! clock, so all vCPUs enter and leave them together and the host can put whole cores to
//! sleep. Interrupts and guest timers that fall in a window are held and delivered when it
//! ends; the guest's clocks (TSC, kvmclock) keep running, so it keeps correct time.

use std::sync::Mutex;

use crate::config::knobs::IdleInjectConfig;

#[derive(Debug, Default)]
struct Together {
    forced: usize,
    blocked: usize,
    since: Option<u64>,
    total_ns: u64,
}

/// The VM-wide injector: window arithmetic and the "all idle together" account.
#[derive(Debug)]
pub struct IdleInjector {
    cfg: IdleInjectConfig,
    idle_ns: u64,
    cpus: usize,
    together: Mutex<Together>,
}

impl IdleInjector {
    /// An injector for a VM of `cpus` vCPUs.
    pub fn new(cfg: IdleInjectConfig, cpus: usize) -> Self {
        let idle_ns = cfg.period_ns / 100 * u64::from(cfg.percent);
        Self {
            cfg,
            idle_ns,
            cpus,
            together: Mutex::new(Together::default()),
        }
    }

    /// The setting.
    pub fn config(&self) -> IdleInjectConfig {
        self.cfg
    }

    /// If `now` lies in an injection window, the window's end.
    pub fn window_end(&self, now: u64) -> Option<u64> {
        let pos = now % self.cfg.period_ns;
        (pos < self.idle_ns).then(|| now - pos + self.idle_ns)
    }

    /// The start of the first window after `now`.
    pub fn next_window_start(&self, now: u64) -> u64 {
        now - now % self.cfg.period_ns + self.cfg.period_ns
    }

    fn update(&self, now: u64, change: impl FnOnce(&mut Together)) {
        let mut t = timer::lock(&self.together);
        let was = t.since.is_some();
        change(&mut t);
        let is = t.forced > 0 && t.forced + t.blocked >= self.cpus;
        match (was, is) {
            (false, true) => t.since = Some(now),
            (true, false) => {
                if let Some(since) = t.since.take() {
                    t.total_ns += now.saturating_sub(since);
                }
            }
            _ => {}
        }
    }

    /// A vCPU enters a forced-idle window.
    pub fn enter_forced(&self, now: u64) {
        self.update(now, |t| t.forced += 1);
    }

    /// A vCPU leaves a forced-idle window.
    pub fn leave_forced(&self, now: u64) {
        self.update(now, |t| t.forced = t.forced.saturating_sub(1));
    }

    /// A vCPU blocks in HLT.
    pub fn enter_blocked(&self, now: u64) {
        self.update(now, |t| t.blocked += 1);
    }

    /// A vCPU wakes from HLT.
    pub fn leave_blocked(&self, now: u64) {
        self.update(now, |t| t.blocked = t.blocked.saturating_sub(1));
    }

    /// Time during which every vCPU was idle (forced or halted) with at least one forced.
    pub fn all_idle_together_ns(&self, now: u64) -> u64 {
        let t = timer::lock(&self.together);
        t.total_ns + t.since.map_or(0, |s| now.saturating_sub(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_the_first_share_of_each_period() {
        let inj = IdleInjector::new("percent=25,period=100".parse().unwrap(), 2);
        assert_eq!(inj.window_end(0), Some(25_000_000));
        assert_eq!(inj.window_end(24_999_999), Some(25_000_000));
        assert_eq!(inj.window_end(25_000_000), None);
        assert_eq!(inj.window_end(110_000_000), Some(125_000_000));
        assert_eq!(inj.next_window_start(30_000_000), 100_000_000);
    }

    #[test]
    fn together_counts_only_when_every_vcpu_is_idle() {
        let inj = IdleInjector::new("percent=50,period=10".parse().unwrap(), 2);
        inj.enter_forced(0);
        inj.enter_blocked(10); // the other vCPU was halted: all idle from 10
        inj.leave_blocked(30);
        inj.enter_forced(40);
        inj.leave_forced(45);
        inj.leave_forced(50);
        assert_eq!(inj.all_idle_together_ns(100), 20 + 5);
    }
}
