//! How a blocked vCPU thread waits: idle in the timer model, on its kick eventfd and on the
//! wake-up timerfd the model arms for it.
//!
//! The wake-up is the timer model's: with a wake-up timer attached the model arms it when the
//! vCPU goes idle, and other vCPUs may move it while this one sleeps (in `pull`, when one of
//! them takes over what this one was to wake for), so the thread waits on that timer, never on
//! a timeout it computed when it went to sleep; without one (a fake clock) it waits for the
//! model's timeout. With `--timer-slack` the wake-up is ranged: the thread sleeps with a
//! relative timeout to it, which the kernel may end anywhere within the thread's timer slack
//! after it, and the timerfd is only the doorbell for a wake-up moved earlier meanwhile (see
//! `ranged_wake.rs`). Senders wake it through the mailbox (see `mailbox.rs` for the handshake).

use std::os::fd::AsRawFd;
use std::sync::Arc;

use timer::{Clock, CpuTimers, Nanos, NEVER};

use super::host_timer::SharedTimerFd;
use super::lapic_timer_host::slack::ranged_timeout;
use super::mailbox::Mailbox;
use crate::idle::core::block_deadline;
use crate::idle::vcpu_timer::VcpuTimer;
use crate::ratelimit::LogLimiter;

/// Failed waits of blocked vCPUs (VM-wide log limiter).
static WAIT_FAILED: LogLimiter = LogLimiter::new();

/// What one vCPU blocks on.
pub struct VcpuWait {
    /// Its mailbox (kick eventfd, work flags, blocked state).
    pub mailbox: Arc<Mailbox>,
    /// The wake-up timer handed to the timer model; `None`: wait for the model's timeout.
    pub wake_timer: Option<Arc<SharedTimerFd>>,
}

impl VcpuWait {
    /// Blocks the thread, idle in `timers`, until `until` (VM clock), `stop()`, and (with
    /// `wake_on_work`) mail or the wake-up. Without `wake_on_work`, interrupts and timers wait
    /// in the mailbox and the timer queues until `until`. Returns the time spent asleep in the
    /// wait itself (the timer model's idle and wake passes around it are work, not sleep).
    pub fn block_until(
        &self,
        timers: &mut dyn CpuTimers<VcpuTimer>,
        clock: &impl Clock,
        until: Option<Nanos>,
        wake_on_work: bool,
        stop: impl Fn() -> bool,
    ) -> Nanos {
        let mailbox = &self.mailbox;
        let mut asleep = 0;
        mailbox.set_blocked();
        let woken = || stop() || mailbox.control_pending() || (wake_on_work && mailbox.has_work());
        if !woken() {
            let timeout = timers.idle(clock.now());
            let wake_timer = self.wake_timer.as_ref().filter(|_| wake_on_work);
            let ranged = wake_timer.and_then(|t| t.ranged());
            loop {
                let now = clock.now();
                if woken() {
                    break;
                }
                let model = match (wake_timer, ranged) {
                    (Some(_), Some(r)) => r.begin_wait(),
                    (Some(_), None) => NEVER,
                    (None, _) => timeout.min(timers.idle_timeout()),
                };
                let deadline = block_deadline(model, until, wake_on_work);
                let wait = ranged_timeout(deadline, now);
                if wait.is_none() {
                    wake_timer.inspect(|t| t.end_ranged_wait());
                    break;
                }
                let wait = wait.filter(|_| deadline != NEVER);
                let wake_fd = wake_timer.map(|t| t.fd() as &dyn AsRawFd);
                let woken_by = crate::host::sys::poll::wait(mailbox.kick_fd(), wake_fd, wait);
                wake_timer.inspect(|t| t.end_ranged_wait());
                let after = clock.now();
                asleep += after.saturating_sub(now);
                match woken_by {
                    // The expiry is left unread: the next `idle` re-programs a wake-up
                    // timer whose deadline passed, which clears it (the model's contract),
                    // so no later wait sees it and the read is one system call less.
                    Ok(w) if w.wake => break,
                    // A ranged wake-up's timeout ended in its range.
                    Ok(_) if ranged.is_some_and(|r| r.due(after)) => break,
                    Ok(w) if w.kick => mailbox.drain_kicks(),
                    // A signal (the running tick, a stale kick) or the timeout: look again.
                    Ok(_) => {}
                    Err(e) => {
                        // Cannot wait (a lull bug): the caller looks again rather than hang.
                        if let Some(n) = WAIT_FAILED.hit() {
                            tracing::warn!("a blocked vCPU cannot wait: {e} ({n} so far)");
                        }
                        break;
                    }
                }
            }
            timers.wake(clock.now());
        }
        mailbox.set_running();
        asleep
    }
}
