//! What a vCPU does when it does not run guest code: HLT (halt polling, then blocking in the
//! timer model), and being held by the idle manager (an idle-injection window, a used-up CPU
//! quota). All blocking goes through [`UserVcpu::block_until`], which idles the vCPU in the
//! timer model so that, in `pull`, its global timers are expired by running vCPUs meanwhile.

use std::sync::atomic::Ordering;
use std::time::Duration;

use devices::lapic::{InitSipiState, LapicEvents};
use timer::{Clock, Nanos, TimerKind, NEVER};

use super::user::{UserVcpu, VcpuTimer};
use crate::idle::halt_poll::WakeKind;
use crate::irqchip::mailbox::{Mailbox, WakeCause};

/// How a halt ended.
pub enum Halt {
    /// Back to the guest.
    Resume,
    /// The VM stops.
    Stop,
}

/// Shortest interval between two CPU-quota checks of a running vCPU.
const MIN_QUOTA_CHECK_NS: u64 = 100_000;

impl<E: LapicEvents> UserVcpu<E> {
    fn vcpu_counters(&self) -> &crate::metrics::VcpuCounters {
        &self.shared.vcpu_counters[usize::try_from(self.id).unwrap_or(usize::MAX)]
    }

    /// HLT: poll, then block, until an interrupt the guest can take, INIT/SIPI, or a stop.
    pub(crate) fn halt(&mut self, mailbox: &Mailbox) -> Halt {
        let interrupts_enabled = self.vcpu.get_kvm_run().if_flag != 0;
        let start = self.clock.now();
        // The idle manager's own timers must not wake a halted vCPU: re-armed when it runs.
        if let Some((h, _)) = self.inject_timer.take() {
            self.timers.cancel(h);
        }
        if let Some((h, _)) = self.quota_timer.take() {
            self.timers.cancel(h);
        }
        let mut polled = false;
        let mut poll_won = false;
        let mut blocked = false;
        let mut last_wake = WakeKind::Other;
        loop {
            // A kick that arrived while blocked is answered by the service() below: clear it
            // so that the next KVM_RUN does not return at once.
            self.vcpu.set_kvm_immediate_exit(0);
            let now = self.clock.now();
            if self.service(mailbox, now).own_pinned > 0 {
                last_wake = WakeKind::OwnTimer;
            }
            if self.shared.stop.is_requested() {
                return Halt::Stop;
            }
            let runnable = (interrupts_enabled && self.lapic.has_pending_interrupt())
                || self.lapic.init_sipi_state() != InitSipiState::Running;
            if runnable {
                self.poller
                    .record(now.saturating_sub(start), poll_won && !blocked, last_wake);
                return Halt::Resume;
            }
            if !polled {
                polled = true;
                poll_won = self.poll(mailbox);
                if poll_won {
                    continue;
                }
            }
            blocked = true;
            last_wake = self.halt_block(mailbox);
        }
    }

    /// Spins for the poller's budget watching for a wake-up; true if one came.
    fn poll(&mut self, mailbox: &Mailbox) -> bool {
        let now = self.clock.now();
        let budget = self.poller.budget(now, self.lapic.timer_deadline());
        if budget == 0 {
            return false;
        }
        let counters = self.vcpu_counters();
        counters.polls.fetch_add(1, Ordering::Relaxed);
        let end = now.saturating_add(budget);
        let deadline = self.lapic.timer_deadline();
        let won = loop {
            if mailbox.has_work() || self.shared.stop.is_requested() {
                break true;
            }
            let t = self.clock.now();
            if deadline.is_some_and(|d| d <= t) {
                break true;
            }
            if t >= end {
                break false;
            }
            std::hint::spin_loop();
        };
        let counters = self.vcpu_counters();
        counters
            .poll_ns
            .fetch_add(self.clock.now().saturating_sub(now), Ordering::Relaxed);
        if won {
            counters.polls_won.fetch_add(1, Ordering::Relaxed);
        }
        won
    }

    /// One block of a halted vCPU; counts what woke it.
    fn halt_block(&mut self, mailbox: &Mailbox) -> WakeKind {
        self.vcpu_counters().blocks.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        if let Some(inj) = &self.idle.inject {
            inj.enter_blocked(now);
        }
        self.block_until(mailbox, None, true);
        let now = self.clock.now();
        if let Some(inj) = &self.idle.inject {
            inj.leave_blocked(now);
        }
        let cause = mailbox.wake_cause();
        // Run what is due now, to see whose timer it was.
        self.vcpu.set_kvm_immediate_exit(0);
        let fired = self.service(mailbox, now);
        let c = self.vcpu_counters();
        let (counter, kind) = match cause {
            Some(WakeCause::Control) => (&c.wake_control, WakeKind::Other),
            Some(WakeCause::Interrupt) => (&c.wake_interrupt, WakeKind::Other),
            Some(WakeCause::Timer) => (&c.wake_timer, WakeKind::OwnTimer),
            None if fired.own_pinned > 0 || self.lapic.has_pending_interrupt() => {
                (&c.wake_timer, WakeKind::OwnTimer)
            }
            None if fired.own_global + fired.remote_global > 0 => {
                (&c.wake_global_timer, WakeKind::Other)
            }
            None => (&c.wake_other, WakeKind::Other),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        kind
    }

    /// Blocks the thread, idle in the timer model, until `until` (VM clock), VM control, and
    /// (with `wake_on_work`) mail or the timer model's timeout. Without `wake_on_work`,
    /// interrupts and timers wait in the mailbox and the timer queues until `until`.
    pub(crate) fn block_until(
        &mut self,
        mailbox: &Mailbox,
        until: Option<Nanos>,
        wake_on_work: bool,
    ) {
        mailbox.set_blocked();
        let stop = || self.shared.stop.is_requested() || mailbox.control_pending();
        if !(stop() || (wake_on_work && mailbox.has_work())) {
            let timeout = self.timers.idle(self.clock.now());
            loop {
                let now = self.clock.now();
                if stop() || (wake_on_work && mailbox.has_work()) {
                    break;
                }
                let model = if wake_on_work {
                    timeout.min(self.timers.idle_timeout())
                } else {
                    NEVER
                };
                let deadline = model.min(until.unwrap_or(NEVER));
                if deadline <= now {
                    break;
                }
                if deadline == NEVER {
                    std::thread::park();
                } else {
                    std::thread::park_timeout(Duration::from_nanos(deadline - now));
                }
            }
            self.timers.wake(self.clock.now());
        }
        mailbox.set_running();
    }

    /// Before entering the guest: holds the vCPU in an idle-injection window or while the
    /// VM's CPU quota is used up (true: it was held; re-check everything), and arms the timers
    /// that will kick it out of KVM_RUN for the next window or quota check.
    pub(crate) fn idle_manager_holds(&mut self, mailbox: &Mailbox, now: Nanos) -> bool {
        let before = (self.inject_timer, self.quota_timer);
        let held = self.idle_manager_check(mailbox, now);
        if !held && (self.inject_timer, self.quota_timer) != before {
            // A timer was armed after this iteration's timer pass: program the host tick
            // for it now, or KVM_RUN would not be interrupted in time.
            self.sync_host_tick(now);
        }
        held
    }

    fn idle_manager_check(&mut self, mailbox: &Mailbox, now: Nanos) -> bool {
        let idle = self.idle.clone();
        if let Some(inj) = &idle.inject {
            if let Some(end) = inj.window_end(now) {
                inj.enter_forced(now);
                self.block_until(mailbox, Some(end), false);
                let left = self.clock.now();
                inj.leave_forced(left);
                self.vcpu_counters()
                    .injected_idle_ns
                    .fetch_add(left.saturating_sub(now), Ordering::Relaxed);
                return true;
            }
            let start = inj.next_window_start(now);
            if self.inject_timer.map(|(_, d)| d) != Some(start) {
                if let Some((h, _)) = self.inject_timer.take() {
                    self.timers.cancel(h);
                }
                let h = self
                    .timers
                    .arm(TimerKind::Pinned, start, VcpuTimer::IdleInject);
                self.inject_timer = Some((h, start));
            }
        }
        if let Some(quota) = &idle.quota {
            let clock = self.clock;
            if let Some(until) = quota.throttled_until(now, |t| clock.to_monotonic(t)) {
                if let Some((h, _)) = self.quota_timer.take() {
                    self.timers.cancel(h);
                }
                self.block_until(mailbox, Some(until), false);
                let left = self.clock.now();
                self.vcpu_counters()
                    .throttled_ns
                    .fetch_add(left.saturating_sub(now), Ordering::Relaxed);
                return true;
            }
            if self.quota_timer.is_none() {
                let cpus = u64::try_from(self.router.mailboxes().len())
                    .unwrap_or(1)
                    .max(1);
                let check = now + (quota.remaining(now) / cpus).max(MIN_QUOTA_CHECK_NS);
                let h = self
                    .timers
                    .arm(TimerKind::Pinned, check, VcpuTimer::QuotaCheck);
                self.quota_timer = Some((h, check));
            }
        }
        false
    }

    /// Forgets fired idle-manager timers (their handles are stale once they fired).
    pub(crate) fn idle_timers_fired(&mut self, now: Nanos) {
        if self.inject_timer.is_some_and(|(_, d)| d <= now) {
            self.inject_timer = None;
        }
        if self.quota_timer.is_some_and(|(_, d)| d <= now) {
            self.quota_timer = None;
        }
    }
}
