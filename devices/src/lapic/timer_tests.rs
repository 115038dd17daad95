//! Behaviour tests of the LAPIC timer through the register views: one-shot with every
//! divide value, periodic without drift, TSC-deadline, masking and clamping.

use super::regs::*;
use super::tests::{lapic, read, write, Counting};
use super::*;

#[test]
fn one_shot_each_divide_and_current_count() {
    for (dcr, divisor) in [
        (0, 2),
        (1, 4),
        (2, 8),
        (3, 16),
        (8, 32),
        (9, 64),
        (10, 128),
        (11, 1),
    ] {
        let mut lapic = lapic();
        let _ = write(&mut lapic, LVT_TIMER, 0x30, 0);
        let _ = write(&mut lapic, TIMER_DIVIDE, dcr, 0);
        assert_eq!(read(&mut lapic, TIMER_DIVIDE, 0), dcr);
        let start = 1_000;
        let effects = write(&mut lapic, TIMER_INITIAL, 50_000, start);
        let deadline_ns = start + 50_000 * divisor;
        assert_eq!(effects.timer, LapicTimerChange::Arm { deadline_ns });
        for step in 0..5u64 {
            let now = start + step * 10_000 * divisor;
            let expected = 50_000 - u32::try_from(step * 10_000).unwrap();
            assert_eq!(read(&mut lapic, TIMER_CURRENT, now), expected);
        }
        assert_eq!(lapic.timer_fired(deadline_ns - 1), Some(deadline_ns));
        assert_eq!(lapic.next_interrupt(), None);
        assert_eq!(lapic.timer_fired(deadline_ns), None);
        assert_eq!(read(&mut lapic, TIMER_CURRENT, deadline_ns), 0);
        assert_eq!(read(&mut lapic, TIMER_INITIAL, deadline_ns), 50_000);
        assert_eq!(lapic.next_interrupt(), Some(0x30));
    }
}

#[test]
fn initial_count_zero_cancels() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, LVT_TIMER, 0x30, 0);
    assert!(matches!(
        write(&mut lapic, TIMER_INITIAL, 10_000, 0).timer,
        LapicTimerChange::Arm { .. }
    ));
    assert_eq!(
        write(&mut lapic, TIMER_INITIAL, 0, 5).timer,
        LapicTimerChange::Cancel
    );
    assert_eq!(lapic.timer_deadline(), None);
}

#[test]
fn periodic_does_not_drift() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, LVT_TIMER, (1 << 17) | 0x40, 0);
    let _ = write(&mut lapic, TIMER_DIVIDE, 0xB, 0);
    let period = 1_000_003u64;
    let effects = write(&mut lapic, TIMER_INITIAL, 1_000_003, 7);
    assert_eq!(
        effects.timer,
        LapicTimerChange::Arm {
            deadline_ns: 7 + period
        }
    );
    let mut deadline = 7 + period;
    for k in 1..=1_000u64 {
        // The VMM runs a little late every time; the grid must not move.
        let late = deadline + (k % 7) * 1_000;
        let next = lapic.timer_fired(late).unwrap();
        assert_eq!(next, 7 + (k + 1) * period);
        assert_eq!(lapic.next_interrupt(), Some(0x40));
        lapic.interrupt_injected(0x40);
        let _ = write(&mut lapic, EOI, 0, late);
        deadline = next;
    }
    // Mid-period, the current count follows the grid too.
    let mid = deadline - period / 2;
    assert_eq!(read(&mut lapic, TIMER_CURRENT, mid), 500_001);
    // Missed periods are skipped, staying on the grid.
    let next = lapic.timer_fired(deadline + 3 * period + 5).unwrap();
    assert_eq!(next, deadline + 4 * period);
}

#[test]
fn periodic_period_is_clamped() {
    let mut lapic = Lapic::with_events(LapicConfig::default(), Counting::default()).unwrap();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    let _ = write(&mut lapic, LVT_TIMER, (1 << 17) | 0x40, 0);
    let _ = write(&mut lapic, TIMER_DIVIDE, 0xB, 0);
    let LapicTimerChange::Arm { deadline_ns } = write(&mut lapic, TIMER_INITIAL, 1, 0).timer else {
        panic!("not armed");
    };
    assert_eq!(deadline_ns, 100_000);
    assert_eq!(lapic.events().clamped.get(), 1);
    let next = lapic.timer_fired(deadline_ns).unwrap();
    assert_eq!(next - deadline_ns, 100_000);
}

fn tsc_lapic() -> Lapic {
    let mut lapic = Lapic::new(LapicConfig {
        tsc: TscMap {
            tsc_khz: 2_000_000,
            tsc_at_ns0: 1_000,
        },
        ..LapicConfig::default()
    })
    .unwrap();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    let effects = write(&mut lapic, LVT_TIMER, (2 << 17) | 0xEF, 0);
    assert_eq!(effects.timer, LapicTimerChange::Unchanged);
    lapic
}

#[test]
fn tsc_deadline_arm_rearm_cancel() {
    let mut lapic = tsc_lapic();
    let arm = |lapic: &mut Lapic, tsc, now| lapic.write_msr(MSR_TSC_DEADLINE, tsc, now).unwrap();
    // TSC 2_001_000 is 1 ms after time 0.
    assert_eq!(
        arm(&mut lapic, 2_001_000, 0).timer,
        LapicTimerChange::Arm {
            deadline_ns: 1_000_000
        }
    );
    assert_eq!(lapic.read_msr(MSR_TSC_DEADLINE, 0), Ok(2_001_000));
    assert_eq!(
        arm(&mut lapic, 4_001_000, 10).timer,
        LapicTimerChange::Arm {
            deadline_ns: 2_000_000
        }
    );
    // Initial-count writes are ignored in TSC-deadline mode.
    assert_eq!(
        write(&mut lapic, TIMER_INITIAL, 5, 10).timer,
        LapicTimerChange::Unchanged
    );
    assert_eq!(read(&mut lapic, TIMER_CURRENT, 10), 0);
    assert_eq!(arm(&mut lapic, 0, 20).timer, LapicTimerChange::Cancel);
    assert_eq!(lapic.timer_deadline(), None);
    assert_eq!(lapic.timer_fired(3_000_000), None);
    assert_eq!(lapic.next_interrupt(), None);
    // Fire: the MSR clears and the vector is pending.
    let _ = arm(&mut lapic, 2_001_000, 0);
    assert_eq!(lapic.timer_fired(1_000_000), None);
    assert_eq!(lapic.read_msr(MSR_TSC_DEADLINE, 0), Ok(0));
    assert_eq!(lapic.next_interrupt(), Some(0xEF));
}

#[test]
fn a_new_tsc_map_converts_the_deadlines_written_after_it() {
    let mut lapic = tsc_lapic();
    let arm = |lapic: &mut Lapic, tsc, now| lapic.write_msr(MSR_TSC_DEADLINE, tsc, now).unwrap();
    let first = arm(&mut lapic, 2_001_000, 0).timer;
    assert_eq!(
        first,
        LapicTimerChange::Arm {
            deadline_ns: 1_000_000
        }
    );
    // Re-anchored: the TSC ran 1,000 ticks (0.5 us) ahead of the first map.
    lapic.set_tsc_map(TscMap {
        tsc_khz: 2_000_000,
        tsc_at_ns0: 2_000,
    });
    assert_eq!(
        lapic.timer_deadline(),
        Some(1_000_000),
        "the armed deadline stays"
    );
    assert_eq!(
        arm(&mut lapic, 2_001_000, 0).timer,
        LapicTimerChange::Arm {
            deadline_ns: 999_500
        }
    );
    // A reset keeps the map (it is the VM's, not the register state's).
    lapic.reset();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    let _ = write(&mut lapic, LVT_TIMER, (2 << 17) | 0xEF, 0);
    assert_eq!(
        arm(&mut lapic, 2_001_000, 0).timer,
        LapicTimerChange::Arm {
            deadline_ns: 999_500
        }
    );
}

#[test]
fn tsc_deadline_at_or_before_now_is_pending_when_the_write_completes() {
    let mut lapic = tsc_lapic();
    let now = 5_000_000;
    // TSC 1_000 + 2 per ns: now is TSC 10_001_000.
    for tsc in [2_000, 10_001_000] {
        let effects = lapic.write_msr(MSR_TSC_DEADLINE, tsc, now).unwrap();
        assert_eq!(effects.timer, LapicTimerChange::Unchanged, "no host timer");
        assert_eq!(lapic.next_interrupt(), Some(0xEF), "deadline {tsc}");
        assert_eq!(lapic.read_msr(MSR_TSC_DEADLINE, now), Ok(0));
        lapic.interrupt_injected(0xEF);
        let _ = write(&mut lapic, EOI, 0, now);
    }
    // An armed future deadline moved into the past: the host timer is cancelled.
    let _ = lapic.write_msr(MSR_TSC_DEADLINE, 1 << 40, now).unwrap();
    let effects = lapic.write_msr(MSR_TSC_DEADLINE, 5, now).unwrap();
    assert_eq!(effects.timer, LapicTimerChange::Cancel);
    assert_eq!(lapic.next_interrupt(), Some(0xEF));
    assert_eq!(
        lapic.timer_fired(now + 1),
        None,
        "a stale host timer does nothing"
    );
    // Masked: it expires all the same, with no interrupt.
    let mut lapic = tsc_lapic();
    let _ = write(&mut lapic, LVT_TIMER, LVT_MASKED | (2 << 17) | 0xEF, 0);
    let effects = lapic.write_msr(MSR_TSC_DEADLINE, 5, now).unwrap();
    assert_eq!(effects.timer, LapicTimerChange::Unchanged);
    assert_eq!(lapic.read_msr(MSR_TSC_DEADLINE, now), Ok(0));
    assert_eq!(lapic.next_interrupt(), None);
    // Just ahead of now: a future deadline, armed at the minimum delay, not early.
    let mut lapic = Lapic::with_events(
        LapicConfig {
            tsc: TscMap {
                tsc_khz: 2_000_000,
                tsc_at_ns0: 1_000,
            },
            ..LapicConfig::default()
        },
        Counting::default(),
    )
    .unwrap();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    let _ = write(&mut lapic, LVT_TIMER, (2 << 17) | 0xEF, 0);
    let effects = lapic.write_msr(MSR_TSC_DEADLINE, 10_001_002, now).unwrap();
    let floor = now + TimerLimits::default().min_delay_ns;
    assert_eq!(effects.timer, LapicTimerChange::Arm { deadline_ns: floor });
    assert_eq!(lapic.next_interrupt(), None);
    assert_eq!(lapic.events().clamped.get(), 1);
}

#[test]
fn one_shot_count_already_run_out_is_pending_at_once() {
    // A 4 GHz bus at divide 1: a count of 1 is a quarter nanosecond, over before the write ends.
    let mut lapic = Lapic::new(LapicConfig {
        bus_hz: 4_000_000_000,
        ..LapicConfig::default()
    })
    .unwrap();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    let _ = write(&mut lapic, LVT_TIMER, 0x41, 0);
    let _ = write(&mut lapic, TIMER_DIVIDE, 0xB, 0);
    let effects = write(&mut lapic, TIMER_INITIAL, 1, 100);
    assert_eq!(effects.timer, LapicTimerChange::Unchanged);
    assert_eq!(lapic.next_interrupt(), Some(0x41));
    assert_eq!(read(&mut lapic, TIMER_CURRENT, 100), 0);
    assert_eq!(read(&mut lapic, TIMER_INITIAL, 100), 1);
    // Periodic mode keeps its minimum period instead.
    let _ = write(&mut lapic, LVT_TIMER, (1 << 17) | 0x42, 0);
    let effects = write(&mut lapic, TIMER_INITIAL, 1, 100);
    assert_eq!(
        effects.timer,
        LapicTimerChange::Arm {
            deadline_ns: 100 + TimerLimits::default().min_period_ns
        }
    );
}

#[test]
fn one_shot_periodic_switches_keep_the_count() {
    let mut lapic = counting(0x40);
    let effects = write(&mut lapic, LVT_TIMER, (1 << 17) | 0x40, 250_000);
    assert_eq!(effects.timer, LapicTimerChange::Unchanged);
    assert_eq!(read(&mut lapic, TIMER_INITIAL, 250_000), 1_000_000);
    assert_eq!(read(&mut lapic, TIMER_CURRENT, 250_000), 750_000);
    // Now periodic: it reloads at zero.
    assert_eq!(lapic.timer_fired(1_000_000), Some(2_000_000));
    assert_eq!(lapic.next_interrupt(), Some(0x40));
    assert_eq!(read(&mut lapic, TIMER_CURRENT, 1_500_000), 500_000);
    // Back to one-shot: the count runs out once more and stays at 0.
    let effects = write(&mut lapic, LVT_TIMER, 0x40, 1_500_000);
    assert_eq!(effects.timer, LapicTimerChange::Unchanged);
    assert_eq!(lapic.timer_fired(2_000_000), None);
    assert_eq!(read(&mut lapic, TIMER_CURRENT, 2_500_000), 0);
    // Masking with the same mode keeps the timer too.
    let _ = write(&mut lapic, TIMER_INITIAL, 1_000, 3_000_000);
    let effects = write(&mut lapic, LVT_TIMER, LVT_MASKED | 0x40, 3_000_100);
    assert_eq!(effects.timer, LapicTimerChange::Unchanged);
    assert_eq!(read(&mut lapic, TIMER_CURRENT, 3_000_100), 900);
}

#[test]
fn tsc_deadline_ignored_outside_its_mode() {
    let mut lapic = lapic();
    let effects = lapic.write_msr(MSR_TSC_DEADLINE, 12345, 0).unwrap();
    assert_eq!(effects.timer, LapicTimerChange::Unchanged);
    assert_eq!(lapic.read_msr(MSR_TSC_DEADLINE, 0), Ok(0));
    // Leaving TSC-deadline mode disarms.
    let mut lapic = tsc_lapic();
    let _ = lapic.write_msr(MSR_TSC_DEADLINE, 1 << 40, 0).unwrap();
    assert_eq!(
        write(&mut lapic, LVT_TIMER, 0xEF, 0).timer,
        LapicTimerChange::Cancel
    );
}

#[test]
fn masked_timer_sets_no_irr_but_keeps_running() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, LVT_TIMER, LVT_MASKED | (1 << 17) | 0x40, 0);
    let _ = write(&mut lapic, TIMER_DIVIDE, 0xB, 0);
    let _ = write(&mut lapic, TIMER_INITIAL, 1_000_000, 0);
    assert_eq!(lapic.timer_fired(1_000_000), Some(2_000_000));
    assert_eq!(lapic.next_interrupt(), None);
    let _ = write(&mut lapic, LVT_TIMER, (1 << 17) | 0x40, 0);
    assert_eq!(lapic.timer_fired(2_000_000), Some(3_000_000));
    assert_eq!(lapic.next_interrupt(), Some(0x40));
}

#[test]
fn disabling_cancels_an_armed_timer() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, LVT_TIMER, 0x40, 0);
    let _ = write(&mut lapic, TIMER_INITIAL, 100_000, 0);
    let effects = lapic
        .write_msr(MSR_APIC_BASE, DEFAULT_APIC_BASE, 0)
        .unwrap();
    assert_eq!(effects.timer, LapicTimerChange::Cancel);
}

#[test]
fn timer_through_x2apic_msrs() {
    let mut lapic = Lapic::new(LapicConfig::default()).unwrap();
    let base = DEFAULT_APIC_BASE | APIC_BASE_ENABLE | APIC_BASE_X2APIC;
    let _ = lapic.write_msr(MSR_APIC_BASE, base, 0).unwrap();
    let _ = lapic.write_msr(0x80F, 0x1FF, 0).unwrap();
    let _ = lapic.write_msr(0x832, (1 << 17) | 0xEC, 0).unwrap();
    let _ = lapic.write_msr(0x83E, 0x3, 0).unwrap(); // divide by 16
    let effects = lapic.write_msr(0x838, 62_500, 0).unwrap();
    assert_eq!(
        effects.timer,
        LapicTimerChange::Arm {
            deadline_ns: 1_000_000
        }
    );
    assert_eq!(lapic.read_msr(0x839, 500_000), Ok(31_250));
    assert_eq!(lapic.read_msr(0x838, 500_000), Ok(62_500));
    assert_eq!(lapic.read_msr(0x83E, 0), Ok(3));
    assert_eq!(lapic.timer_fired(1_000_000), Some(2_000_000));
    assert_eq!(lapic.next_interrupt(), Some(0xEC));
    assert_eq!(
        lapic.write_msr(0x839, 0, 0).map(|_| ()),
        Err(LapicError::GeneralProtection { msr: 0x839 })
    );
}

#[test]
fn an_lvt_write_after_a_late_host_timer_sees_the_expiry_first() {
    // One-shot ran out at 1 ms; the host timer is late; the guest switches to periodic at 2 ms.
    let mut one_shot = counting(0x40);
    let effects = write(&mut one_shot, LVT_TIMER, (1 << 17) | 0x41, 2_000_000);
    assert_eq!(effects.timer, LapicTimerChange::Cancel);
    assert_eq!(
        one_shot.next_interrupt(),
        Some(0x40),
        "expired under the old vector"
    );
    assert_eq!(
        read(&mut one_shot, TIMER_CURRENT, 2_000_000),
        0,
        "a spent one-shot stays spent"
    );
    assert_eq!(
        one_shot.timer_fired(2_000_001),
        None,
        "the late host timer finds nothing"
    );
    // Masked when it ran out: unmasking later raises nothing.
    let mut masked = counting(LVT_MASKED | 0x40);
    let _ = write(&mut masked, LVT_TIMER, 0x40, 2_000_000);
    assert_eq!(masked.next_interrupt(), None);
    // Periodic with a late host timer, switched to one-shot: the missed tick is raised, the
    // count goes on from its reload and stops at the next zero.
    let mut periodic = counting((1 << 17) | 0x40);
    let effects = write(&mut periodic, LVT_TIMER, 0x40, 1_250_000);
    assert_eq!(
        effects.timer,
        LapicTimerChange::Unchanged,
        "the due host timer re-arms"
    );
    assert_eq!(periodic.next_interrupt(), Some(0x40));
    assert_eq!(read(&mut periodic, TIMER_CURRENT, 1_250_000), 750_000);
    assert_eq!(periodic.timer_fired(1_250_001), Some(2_000_000));
    assert_eq!(periodic.timer_fired(2_000_000), None);
    assert_eq!(read(&mut periodic, TIMER_CURRENT, 2_500_000), 0);
}

/// A LAPIC whose timer counts 1 ms (divide 1) from time 0 with this LVT timer value.
fn counting(lvt_timer: u32) -> Lapic {
    let mut lapic = lapic();
    let _ = write(&mut lapic, TIMER_DIVIDE, 0xB, 0);
    let _ = write(&mut lapic, LVT_TIMER, lvt_timer, 0);
    let _ = write(&mut lapic, TIMER_INITIAL, 1_000_000, 0);
    lapic
}
