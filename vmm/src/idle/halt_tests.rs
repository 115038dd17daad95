//! The halt loop over a fake chip on a fake clock: a vCPU with one LAPIC timer that may be
//! sent one piece of mail. The fake's waits jump the clock to what would wake them and record
//! what they waited for; each look at its mailbox while polling takes [`POLL_STEP_NS`].

use std::cell::Cell;
use std::sync::Arc;

use timer::{build, AfterFire, Clock, FakeClock, FakeHostTimer, HostTimer, ModelKind, NEVER};

use super::*;
use crate::config::knobs::{HaltPollMode, IdleInjectConfig, TimerAdvanceMode, WakePlacementMode};
use crate::idle::global_load::GlobalLoad;
use crate::idle::inject::IdleInjector;

/// How long one look at the mailbox takes while the fake vCPU polls.
const POLL_STEP_NS: Nanos = 1_000;

/// What another thread sends the fake vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mail {
    /// An interrupt.
    Interrupt,
    /// A start-up IPI with this vector.
    Sipi(u8),
}

/// One wait of the fake vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wait {
    start: Nanos,
    until: Option<Nanos>,
    wake_on_work: bool,
    end: Nanos,
    /// The next deadline on its timers as the wait began.
    timers_next: Nanos,
}

struct FakeChip {
    clock: FakeClock,
    timers: Box<dyn CpuTimers<VcpuTimer>>,
    /// RFLAGS.IF as of the HLT.
    interrupts_enabled: bool,
    /// An interrupt is pending in the LAPIC.
    pending: bool,
    /// The LAPIC timer's deadline; its expiry makes an interrupt pending.
    deadline: Option<Nanos>,
    /// Mail another thread posts (and kicks) at a time.
    mail: Option<(Nanos, Mail)>,
    /// In INIT.
    init: bool,
    sipi: Option<u8>,
    /// When VM control asks the vCPU to stop.
    stop_at: Option<Nanos>,
    polling: Cell<bool>,
    /// What ended the last wait (read once, as the mailbox's wake cause is).
    woken_by: Cell<Option<WakeCause>>,
    waits: Vec<Wait>,
    /// Timer passes asked for by the idle manager (host tick re-programmed).
    timer_passes: u32,
}

impl FakeChip {
    /// A vCPU that runs, halted with interrupts enabled, nothing pending, at `now`.
    fn new(clock: &FakeClock) -> Self {
        let waker = Arc::new(|_cpu: usize| {});
        let mut host = |_| Box::new(FakeHostTimer::new()) as Box<dyn HostTimer>;
        let model = build::<VcpuTimer>(ModelKind::Pull, &[0], &mut host, waker).unwrap();
        Self {
            clock: clock.clone(),
            timers: model.cpus.into_iter().next().unwrap(),
            interrupts_enabled: true,
            pending: false,
            deadline: None,
            mail: None,
            init: false,
            sipi: None,
            stop_at: None,
            polling: Cell::new(false),
            woken_by: Cell::new(None),
            waits: Vec::new(),
            timer_passes: 0,
        }
    }

    fn mail_due(&self, now: Nanos) -> bool {
        self.mail.is_some_and(|(at, _)| at <= now)
    }
}

impl IdleChip for FakeChip {
    fn stop_requested(&self) -> bool {
        self.stop_at.is_some_and(|t| t <= self.clock.now())
    }

    fn service(&mut self, now: Nanos) -> FiredSummary {
        let mut fired = FiredSummary::default();
        if self.mail_due(now) {
            match self.mail.take().map(|(_, m)| m) {
                Some(Mail::Interrupt) => self.pending = true,
                Some(Mail::Sipi(v)) => self.sipi = Some(v),
                None => {}
            }
        }
        if self.deadline.is_some_and(|d| d <= now) {
            self.deadline = None;
            self.pending = true;
            fired.own_pinned += 1;
        }
        self.timers.run(now, &mut |f| {
            if f.handle.kind() == timer::TimerKind::Global {
                fired.own_global += 1;
            }
            AfterFire::Done
        });
        fired
    }

    fn runnable(&mut self) -> bool {
        (self.pending && self.interrupts_enabled) || self.init
    }

    fn interrupt_pending(&self) -> bool {
        self.pending
    }

    fn in_init(&self) -> bool {
        self.init
    }

    fn take_sipi(&mut self) -> Option<u8> {
        self.sipi.take()
    }

    fn next_pinned(&self) -> Option<Nanos> {
        self.deadline
    }

    fn wake_at(&self) -> Option<Nanos> {
        self.deadline
    }

    fn timers(&mut self) -> &mut dyn CpuTimers<VcpuTimer> {
        self.timers.as_mut()
    }

    fn run_timers(&mut self, now: Nanos) {
        self.timer_passes += 1;
        self.timers.run(now, &mut |_| AfterFire::Done);
    }

    fn set_polling(&self, on: bool) {
        assert_ne!(self.polling.get(), on, "polling turned on or off twice");
        self.polling.set(on);
    }

    fn has_work(&self) -> bool {
        // Senders skip the kick only for a vCPU that said it polls.
        assert!(self.polling.get(), "the mailbox watched without polling on");
        self.clock.advance(POLL_STEP_NS);
        self.mail_due(self.clock.now())
    }

    fn wake_cause(&self) -> Option<WakeCause> {
        self.woken_by.take()
    }

    fn clear_kick(&mut self) {}

    fn block_until(&mut self, until: Option<Nanos>, wake_on_work: bool) {
        assert!(!self.polling.get(), "blocked while polling");
        let start = self.clock.now();
        // A pass at the wait's start fires nothing (the service before it ran at the same
        // time) and returns the next deadline left on its timers.
        let timers_next = self.timers.run(start, &mut |_| AfterFire::Done);
        let mail = self.mail.map(|(at, _)| at).filter(|_| wake_on_work);
        let own = self.deadline.filter(|_| wake_on_work);
        let wake = [until, mail, own, self.stop_at].into_iter().flatten().min();
        let end = wake
            .expect("a wait nothing ends: the vCPU would sleep forever")
            .max(start);
        self.clock.set(end);
        let cause = if self.stop_at.is_some_and(|t| t <= end) {
            Some(WakeCause::Control)
        } else {
            mail.filter(|&m| m <= end).map(|_| WakeCause::Interrupt)
        };
        self.woken_by.set(cause);
        self.waits.push(Wait {
            start,
            until,
            wake_on_work,
            end,
            timers_next,
        });
    }
}

/// The idle manager of vCPU 0 of a one-vCPU VM over a fake chip, on a fake clock.
struct Rig {
    clock: FakeClock,
    idle: VcpuIdle<FakeClock>,
    counters: Arc<VcpuCounters>,
    chip: FakeChip,
}

impl Rig {
    /// At `start`, halt polling `halt_poll`, idle injection `inject`, nothing else on.
    fn new(start: Nanos, halt_poll: HaltPollMode, inject: Option<IdleInjector>) -> Self {
        let clock = FakeClock::new(start);
        let shared = Arc::new(IdleShared {
            halt_poll,
            timer_advance: TimerAdvanceMode::Off,
            timer_slack: crate::config::knobs::TimerSlack::Off,
            inject,
            quota: None,
            global: None,
            wake_placement: WakePlacementMode::Off,
        });
        let counters = Arc::new(VcpuCounters::default());
        Self {
            idle: VcpuIdle::new(shared, 0, 1, clock.clone(), counters.clone()),
            chip: FakeChip::new(&clock),
            clock,
            counters,
        }
    }

    fn halt(&mut self) -> HaltEnd {
        self.idle.halt(&mut self.chip)
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// A counter's value.
    fn count(&self, counter: impl Fn(&VcpuCounters) -> &std::sync::atomic::AtomicU64) -> u64 {
        counter(&self.counters).load(Ordering::Relaxed)
    }
}

#[test]
fn a_runnable_vcpu_never_sleeps_or_polls() {
    for mode in [
        HaltPollMode::Off,
        HaltPollMode::Fixed(50_000),
        HaltPollMode::Adaptive,
    ] {
        let mut r = Rig::new(1_000, mode, None);
        r.chip.pending = true;
        r.chip.deadline = Some(2_000_000);
        assert_eq!(r.halt(), HaltEnd::Resume, "{mode:?}");
        assert!(r.chip.waits.is_empty(), "{mode:?}: {:?}", r.chip.waits);
        assert_eq!(r.count(|c| &c.polls), 0, "{mode:?}");
        assert_eq!(r.now(), 1_000, "{mode:?}");
    }
}

#[test]
fn a_pending_interrupt_the_guest_cannot_take_does_not_end_a_halt() {
    let mut r = Rig::new(0, HaltPollMode::Off, None);
    r.chip.interrupts_enabled = false;
    r.chip.pending = true;
    r.chip.deadline = Some(700_000);
    r.chip.mail = Some((300_000, Mail::Interrupt));
    r.chip.stop_at = Some(5_000_000);
    // Neither the mail nor its timer ends the halt: only VM control does.
    assert_eq!(r.halt(), HaltEnd::Stop);
    let ends: Vec<Nanos> = r.chip.waits.iter().map(|w| w.end).collect();
    assert_eq!(ends, vec![300_000, 700_000, 5_000_000]);
    assert_eq!(r.count(|c| &c.wakeups.interrupt), 1);
    assert_eq!(r.count(|c| &c.wakeups.timer), 1);
    assert_eq!(r.count(|c| &c.wakeups.control), 1);
}

#[test]
fn a_halt_with_a_deadline_wakes_at_the_deadline() {
    let mut r = Rig::new(0, HaltPollMode::Off, None);
    r.chip.deadline = Some(2_000_000);
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert_eq!(r.now(), 2_000_000, "resumed before or after its deadline");
    assert_eq!(
        r.chip.waits,
        vec![Wait {
            start: 0,
            until: None,
            wake_on_work: true,
            end: 2_000_000,
            timers_next: NEVER,
        }]
    );
    assert_eq!(r.count(|c| &c.blocks), 1);
    assert_eq!(r.count(|c| &c.wakeups.timer), 1);
    assert_eq!(r.count(|c| &c.wakeups.interrupt), 0);
    assert!(r.chip.pending);
}

#[test]
fn a_kick_ends_the_wait() {
    let mut r = Rig::new(0, HaltPollMode::Off, None);
    r.chip.deadline = Some(2_000_000);
    r.chip.mail = Some((300_000, Mail::Interrupt));
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert_eq!(r.now(), 300_000);
    assert_eq!(r.chip.waits.len(), 1);
    assert_eq!(r.chip.waits[0].end, 300_000);
    assert_eq!(r.count(|c| &c.wakeups.interrupt), 1);
    assert_eq!(r.count(|c| &c.wakeups.timer), 0);
    assert_eq!(r.chip.deadline, Some(2_000_000), "its timer did not fire");
}

#[test]
fn a_poll_that_sees_the_mail_never_blocks() {
    let mut r = Rig::new(0, HaltPollMode::Fixed(100_000), None);
    r.chip.deadline = Some(2_000_000);
    r.chip.mail = Some((10_000, Mail::Interrupt));
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert!(r.chip.waits.is_empty(), "{:?}", r.chip.waits);
    assert_eq!(r.count(|c| &c.polls), 1);
    assert_eq!(r.count(|c| &c.polls_won), 1);
    assert_eq!(r.count(|c| &c.blocks), 0);
    // It saw the mail at its first look after the mail came.
    assert!((10_000..10_000 + POLL_STEP_NS).contains(&r.now()));
    assert_eq!(r.count(|c| &c.poll_ns), r.now());
}

#[test]
fn a_lost_poll_blocks_until_the_deadline() {
    let mut r = Rig::new(0, HaltPollMode::Fixed(20_000), None);
    r.chip.deadline = Some(1_000_000);
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert_eq!(r.count(|c| &c.polls), 1);
    assert_eq!(r.count(|c| &c.polls_won), 0);
    assert_eq!(r.chip.waits.len(), 1);
    let w = r.chip.waits[0];
    assert!(
        w.start >= 20_000,
        "blocked before the poll window ended: {w:?}"
    );
    assert_eq!(w.end, 1_000_000);
    assert_eq!(r.now(), 1_000_000);
}

#[test]
fn a_poll_never_runs_past_the_deadline() {
    let mut r = Rig::new(0, HaltPollMode::Fixed(100_000), None);
    r.chip.deadline = Some(30_000);
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert!(r.chip.waits.is_empty(), "{:?}", r.chip.waits);
    assert_eq!(r.count(|c| &c.polls), 1);
    // Its own timer is the wake-up the poll waited for: the poll counts as won.
    assert_eq!(r.count(|c| &c.polls_won), 1);
    assert!((30_000..30_000 + POLL_STEP_NS).contains(&r.now()));
    assert!(r.chip.pending, "the timer's interrupt ended the halt");
}

/// Adaptive polling, nothing learned yet: a deadline nearer than a block and wake-up cost is
/// polled to, and the poll ends at it, never past it.
#[test]
fn a_near_deadline_is_polled_to_not_blocked_for() {
    let mut r = Rig::new(0, HaltPollMode::Adaptive, None);
    r.chip.deadline = Some(40_000);
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert!(r.chip.waits.is_empty(), "blocked: {:?}", r.chip.waits);
    assert_eq!(r.count(|c| &c.polls), 1);
    assert_eq!(r.count(|c| &c.polls_won), 1);
    assert!(
        (40_000..40_000 + POLL_STEP_NS).contains(&r.now()),
        "the poll ended at {}, not at the deadline",
        r.now()
    );
    assert!(r.chip.pending, "the timer's interrupt ended the halt");
    assert_eq!(r.count(|c| &c.wakeups.timer), 0, "no block, no wake-up");
}

/// ...a far one is blocked for, and an interrupt during a poll to a near one ends the poll.
#[test]
fn a_far_deadline_blocks_and_mail_ends_a_poll_to_a_near_one() {
    let mut r = Rig::new(0, HaltPollMode::Adaptive, None);
    let far = 1 + crate::idle::halt_poll::NEAR_DEADLINE_NS;
    r.chip.deadline = Some(far);
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert_eq!(r.count(|c| &c.polls), 0);
    assert_eq!(r.chip.waits.len(), 1);
    assert_eq!(r.chip.waits[0].end, far);

    let mut r = Rig::new(0, HaltPollMode::Adaptive, None);
    r.chip.deadline = Some(60_000);
    r.chip.mail = Some((20_000, Mail::Interrupt));
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert!(r.chip.waits.is_empty(), "blocked: {:?}", r.chip.waits);
    assert_eq!(r.count(|c| &c.polls_won), 1);
    assert!((20_000..20_000 + POLL_STEP_NS).contains(&r.now()));
    assert_eq!(r.chip.deadline, Some(60_000), "its timer did not fire");
}

#[test]
fn a_stop_ends_a_halt_and_a_sipi_wait() {
    let mut r = Rig::new(0, HaltPollMode::Fixed(100_000), None);
    r.chip.stop_at = Some(0);
    assert_eq!(r.halt(), HaltEnd::Stop);
    r.chip.init = true;
    assert_eq!(r.idle.wait_for_sipi(&mut r.chip), None);
    assert_eq!(r.idle.before_entry(&mut r.chip), Entry::Stop);
    assert!(r.chip.waits.is_empty(), "{:?}", r.chip.waits);
}

#[test]
fn a_vcpu_in_init_waits_for_its_sipi() {
    let mut r = Rig::new(0, HaltPollMode::Off, None);
    r.chip.init = true;
    assert_eq!(r.idle.before_entry(&mut r.chip), Entry::WaitForSipi);
    r.chip.mail = Some((1_000_000, Mail::Sipi(0x10)));
    assert_eq!(r.idle.wait_for_sipi(&mut r.chip), Some(0x10));
    assert_eq!(r.now(), 1_000_000);
    assert_eq!(r.chip.waits.len(), 1);
}

#[test]
fn an_injection_window_holds_the_vcpu_until_its_end_and_a_halt_cancels_the_next() {
    let cfg = IdleInjectConfig {
        percent: 50,
        period_ns: 1_000_000,
    };
    let inject = IdleInjector::new(cfg, 1);
    let mut r = Rig::new(100_000, HaltPollMode::Off, Some(inject));
    // Mail inside the window waits for its end.
    r.chip.mail = Some((200_000, Mail::Interrupt));
    assert_eq!(r.idle.before_entry(&mut r.chip), Entry::Enter);
    assert_eq!(
        r.chip.waits,
        vec![Wait {
            start: 100_000,
            until: Some(500_000),
            wake_on_work: false,
            end: 500_000,
            timers_next: NEVER,
        }]
    );
    assert!(r.chip.pending, "the mail is taken when the window ends");
    assert_eq!(r.count(|c| &c.injected_idle_ns), 400_000);
    // The idle core armed the next window's start on the vCPU's timers, and asked for the
    // timer pass that programs the host tick for it.
    assert_eq!(r.chip.timers.next_deadline(), 1_000_000);
    assert_eq!(r.chip.timer_passes, 1);
    // A halt cancels it: the idle manager's timers never wake a halted vCPU.
    r.chip.pending = false;
    r.chip.deadline = Some(700_000);
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert_eq!(r.chip.waits.len(), 2);
    assert_eq!(r.chip.waits[1].timers_next, NEVER);
    assert_eq!(r.chip.waits[1].end, 700_000);
}

/// A wake-up that serves k expiries (its LAPIC timer and, in its range, global timers due
/// since) is one wake-up with more than one expiry, and counts k - 1 coalesced.
#[test]
fn a_wake_up_serving_k_expiries_counts_k_minus_1_coalesced() {
    let mut r = Rig::new(0, HaltPollMode::Off, None);
    for (at, slot) in [(600_000, 0), (650_000, 1)] {
        r.chip
            .timers
            .arm(timer::TimerKind::Global, at, VcpuTimer::Global(slot));
    }
    r.chip.deadline = Some(700_000);
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert_eq!(r.now(), 700_000, "woke once, for its own timer");
    assert_eq!(r.count(|c| &c.blocks), 1);
    assert_eq!(r.count(|c| &c.wake_multi_expiry), 1);
    assert_eq!(r.count(|c| &c.wake_coalesced), 2);
    // A wake-up for one expiry coalesces nothing.
    r.chip.pending = false;
    r.chip.deadline = Some(900_000);
    assert_eq!(r.halt(), HaltEnd::Resume);
    assert_eq!(r.count(|c| &c.blocks), 2);
    assert_eq!(r.count(|c| &c.wake_multi_expiry), 1);
    assert_eq!(r.count(|c| &c.wake_coalesced), 2);
}

/// The idle manager arms the vCPU's share of the global-timer load once the vCPU runs (not
/// in INIT), and re-arms on its timers the load's timers that fired anywhere.
#[test]
fn the_global_load_is_armed_once_the_vcpu_runs_and_re_armed_after_it_fires() {
    let mut r = Rig::new(0, HaltPollMode::Off, None);
    let shared = Arc::new(IdleShared {
        halt_poll: HaltPollMode::Off,
        timer_advance: TimerAdvanceMode::Off,
        timer_slack: crate::config::knobs::TimerSlack::Off,
        inject: None,
        quota: None,
        global: Some(GlobalLoad::new("2,period=1".parse().unwrap())),
        wake_placement: WakePlacementMode::Off,
    });
    r.idle = VcpuIdle::new(shared.clone(), 0, 1, r.clock.clone(), r.counters.clone());
    r.chip.init = true;
    assert_eq!(r.idle.before_entry(&mut r.chip), Entry::WaitForSipi);
    assert_eq!(r.chip.timers.next_deadline(), NEVER, "armed in INIT");
    r.chip.init = false;
    assert_eq!(r.idle.before_entry(&mut r.chip), Entry::Enter);
    let first = r.chip.timers.next_deadline();
    assert!((500_000..1_500_000).contains(&first), "{first}");
    // Both fired (their expiry queued them with the load): re-armed here, a period on.
    let load = shared.global.as_ref().unwrap();
    load.fired(0);
    load.fired(1);
    r.clock.set(2_000_000);
    assert_eq!(r.idle.before_entry(&mut r.chip), Entry::Enter);
    let next = r.chip.timers.next_deadline();
    assert!((2_500_000..3_500_000).contains(&next), "{next}");
    assert!(load.take_pending().is_empty());
}
