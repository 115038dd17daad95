//! Save and restore: a restored LAPIC behaves as the saved one (every register read, the next
//! interrupt, the timer's deadline in guest time), and a corrupt state is refused by name.

use proptest::prelude::*;

use super::proptests::{apply, op, Model, Op};
use super::regs;
use super::*;

/// TSC at 1 GHz (one tick per ns), from a high base so that a later clock can map back.
const TSC_BASE: u64 = 1 << 40;

fn config(tsc_at_ns0: u64) -> LapicConfig {
    LapicConfig {
        apic_id: 1,
        bsp: false,
        tsc: TscMap {
            tsc_khz: 1_000_000,
            tsc_at_ns0,
        },
        ..LapicConfig::default()
    }
}

/// Every register as the guest reads it at `now`, by xAPIC offset, with IA32_APIC_BASE and
/// IA32_TSC_DEADLINE.
fn reads(lapic: &mut Lapic, now: u64) -> Vec<(u32, Option<u64>)> {
    let mut out = Vec::new();
    for offset in (0..regs::REGISTER_SPACE).step_by(0x10) {
        let value = match lapic.mode() {
            ApicMode::X2Apic => lapic
                .read_msr(regs::X2APIC_MSR_FIRST + (offset >> 4), now)
                .ok(),
            _ => {
                let mut data = [0u8; 4];
                lapic.read_mmio(u64::from(offset), &mut data, now);
                Some(u64::from(u32::from_le_bytes(data)))
            }
        };
        out.push((offset, value));
    }
    for msr in [regs::MSR_APIC_BASE, regs::MSR_TSC_DEADLINE] {
        out.push((msr, lapic.read_msr(msr, now).ok()));
    }
    out
}

/// What `a` at `now_a` and `b` at `now_b` show: registers, pending work, the timer.
fn check_same(a: &mut Lapic, now_a: u64, b: &mut Lapic, now_b: u64) -> Result<(), TestCaseError> {
    prop_assert_eq!(reads(a, now_a), reads(b, now_b));
    prop_assert_eq!(a.next_interrupt(), b.next_interrupt());
    prop_assert_eq!(a.nmi_pending(), b.nmi_pending());
    prop_assert_eq!(a.init_sipi_state(), b.init_sipi_state());
    prop_assert_eq!(a.destination_info(), b.destination_info());
    prop_assert_eq!(
        a.timer_deadline().map(|d| d.saturating_sub(now_a)),
        b.timer_deadline().map(|d| d.saturating_sub(now_b))
    );
    Ok(())
}

/// `op` with its clock advance cut to 2^40 ns (18 minutes), leaving the clocks room to differ.
fn bounded(op: Op) -> Op {
    match op {
        Op::Advance(ns) => Op::Advance(ns % (1 << 40)),
        op => op,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random traffic, a save, a restore into a new LAPIC whose clock is `shift` ns ahead
    /// (its guest TSC the same: guest time stood still), then the same traffic on both.
    #[test]
    fn a_restored_lapic_behaves_as_the_saved_one(
        before in prop::collection::vec(op(), 1..150),
        after in prop::collection::vec(op(), 0..60),
        shift in prop_oneof![Just(0u64), 0u64..1_000_000_000],
    ) {
        let mut a = Lapic::new(config(TSC_BASE)).unwrap();
        let limits = config(0).limits;
        let mut model = Model::default();
        let mut now = 0u64;
        for op in before {
            let op = bounded(op);
            apply(&mut a, &mut model, op, &mut now, limits)?;
        }
        // What a timer pass would do now: no expiry is overdue at the save.
        let _ = a.timer_fired(now);
        let state = a.save(now);
        let text = serde_json::to_string(&state).unwrap();
        let state: LapicState = serde_json::from_str(&text).unwrap();
        let mut now_b = now + shift;
        let mut b = Lapic::new(config(TSC_BASE - shift)).unwrap();
        let change = b.restore(&state, now_b).unwrap();
        match b.timer_deadline() {
            Some(deadline_ns) => prop_assert_eq!(change, LapicTimerChange::Arm { deadline_ns }),
            None => prop_assert_eq!(change, LapicTimerChange::Cancel),
        }
        prop_assert_eq!(b.save(now_b), state);
        check_same(&mut a, now, &mut b, now_b)?;
        let mut model_b = model.clone();
        for op in after {
            let op = bounded(op);
            apply(&mut a, &mut model, op.clone(), &mut now, limits)?;
            apply(&mut b, &mut model_b, op, &mut now_b, limits)?;
            check_same(&mut a, now, &mut b, now_b)?;
        }
    }

    /// Whatever a state file holds, restoring it refuses or succeeds, never panics, and a
    /// refusal changes nothing.
    #[test]
    fn any_state_is_refused_or_taken(
        apic_base: u64, ldr: u32, dfr: u32, svr: u32, esr: u32, icr: u64, lvt: [u32; 6],
        irr: [u32; 8], divide in 0u32..16, initial: u32, tsc_deadline: u64,
        remaining in proptest::option::of(any::<u64>()), mode in 0usize..3, nmis in 0u32..4,
    ) {
        let mode = [TimerMode::OneShot, TimerMode::Periodic, TimerMode::TscDeadline][mode];
        let mut lapic = Lapic::new(config(TSC_BASE)).unwrap();
        let state = LapicState {
            apic_base,
            ldr,
            dfr,
            svr,
            esr,
            icr,
            lvt,
            irr,
            nmis_pending: nmis,
            timer: LapicTimerState {
                mode,
                divide_config: divide,
                initial_count: initial,
                tsc_deadline,
                remaining_ns: remaining,
            },
            ..lapic.save(0)
        };
        let before = lapic.save(5);
        if lapic.restore(&state, 5).is_err() {
            prop_assert_eq!(lapic.save(5), before);
        } else {
            prop_assert!(lapic.timer_deadline().is_none_or(|d| d >= 5));
        }
    }
}

/// A LAPIC in xAPIC mode, software-enabled, with its timer in `mode` (vector 0x40).
fn enabled(mode: u32, tsc_at_ns0: u64) -> Lapic {
    let mut lapic = Lapic::new(config(tsc_at_ns0)).unwrap();
    let _ = lapic.write_mmio(u64::from(regs::SVR), &0x1FFu32.to_le_bytes(), 0);
    let _ = lapic.write_mmio(
        u64::from(regs::LVT_TIMER),
        &((mode << 17) | 0x40).to_le_bytes(),
        0,
    );
    lapic
}

#[test]
fn a_one_shot_keeps_its_time_left_and_an_overdue_one_fires_at_once() {
    let mut a = enabled(0, 0);
    let _ = a.write_mmio(u64::from(regs::TIMER_DIVIDE), &0xBu32.to_le_bytes(), 0);
    let _ = a.write_mmio(
        u64::from(regs::TIMER_INITIAL),
        &1_000_000u32.to_le_bytes(),
        0,
    );
    // Saved 400 us in: 600 us left, from the restoring clock's now (a very different one).
    let state = a.save(400_000);
    assert_eq!(state.timer.remaining_ns, Some(600_000));
    let mut b = Lapic::new(config(0)).unwrap();
    assert_eq!(
        b.restore(&state, 7_000_000_000).unwrap(),
        LapicTimerChange::Arm {
            deadline_ns: 7_000_600_000
        }
    );
    assert_eq!(b.timer_fired(7_000_599_999), Some(7_000_600_000));
    assert_eq!(b.next_interrupt(), None, "not early");
    assert_eq!(b.timer_fired(7_000_600_000), None);
    assert_eq!(b.next_interrupt(), Some(0x40));
    // Saved after its deadline, before the host timer told the LAPIC: due at the restore.
    let state = a.save(2_000_000);
    assert_eq!(state.timer.remaining_ns, Some(0));
    let mut c = Lapic::new(config(0)).unwrap();
    assert_eq!(
        c.restore(&state, 50).unwrap(),
        LapicTimerChange::Arm { deadline_ns: 50 }
    );
    assert_eq!(c.timer_fired(50), None);
    assert_eq!(c.next_interrupt(), Some(0x40), "fired once, not lost");
    assert_eq!(c.timer_fired(60), None);
}

#[test]
fn a_tsc_deadline_keeps_its_guest_tsc_and_one_passed_meanwhile_is_pending() {
    let mut a = enabled(2, TSC_BASE);
    let effects = a
        .write_msr(regs::MSR_TSC_DEADLINE, TSC_BASE + 5_000_000, 0)
        .unwrap();
    assert_eq!(
        effects.timer,
        LapicTimerChange::Arm {
            deadline_ns: 5_000_000
        }
    );
    let state = a.save(1_000_000);
    assert_eq!(state.timer.tsc_deadline, TSC_BASE + 5_000_000);
    // The guest TSC ran on 2 ms while the VM was away: the deadline is 2 ms nearer.
    let mut b = Lapic::new(config(TSC_BASE + 3_000_000)).unwrap();
    assert_eq!(
        b.restore(&state, 0).unwrap(),
        LapicTimerChange::Arm {
            deadline_ns: 2_000_000
        }
    );
    assert_eq!(
        b.read_msr(regs::MSR_TSC_DEADLINE, 0),
        Ok(TSC_BASE + 5_000_000)
    );
    // It ran on past the deadline: the interrupt is pending at the restore, nothing armed.
    let mut c = Lapic::new(config(TSC_BASE + 9_000_000)).unwrap();
    assert_eq!(c.restore(&state, 0).unwrap(), LapicTimerChange::Cancel);
    assert_eq!(c.next_interrupt(), Some(0x40));
    assert_eq!(c.read_msr(regs::MSR_TSC_DEADLINE, 0), Ok(0));
}

#[test]
fn corrupt_states_are_refused_by_name() {
    let lapic = enabled(1, 0);
    let good = lapic.save(0);
    let refused = |change: &dyn Fn(&mut LapicState)| {
        let mut state = good.clone();
        change(&mut state);
        let mut lapic = lapic.clone();
        lapic.restore(&state, 0).unwrap_err()
    };
    assert_eq!(
        refused(&|s| s.apic_base |= 1 << 60),
        LapicStateError::ApicBase {
            value: good.apic_base | 1 << 60
        }
    );
    // Another vCPU's (the BSP's) APIC base.
    assert!(matches!(
        refused(&|s| s.apic_base |= APIC_BASE_BSP),
        LapicStateError::ApicBase { .. }
    ));
    assert_eq!(
        refused(&|s| s.lvt[0] |= 3 << 17),
        LapicStateError::TimerMode {
            mode: TimerMode::Periodic,
            lvt: good.lvt[0] | 3 << 17
        }
    );
    assert_eq!(
        refused(&|s| s.lvt[3] |= 1 << 20),
        LapicStateError::Register {
            register: "LVT LINT0",
            value: u64::from(good.lvt[3] | 1 << 20)
        }
    );
    assert_eq!(
        refused(&|s| s.irr[0] = 1 << 3),
        LapicStateError::ReservedVector {
            register: "IRR",
            vector: 3
        }
    );
    assert_eq!(refused(&|s| s.nmis_pending = 3), LapicStateError::Nmis(3));
    assert!(matches!(
        refused(&|s| s.timer.divide_config = 0x4),
        LapicStateError::TimerCounts { .. }
    ));
    assert!(matches!(
        refused(&|s| s.timer.tsc_deadline = 1),
        LapicStateError::TimerCounts { .. }
    ));
    // Periodic at divide 2 (the reset value) from a count of 1000: at most 2 us to run, or
    // the 100 us floor on a period.
    assert_eq!(
        refused(&|s| {
            s.timer.initial_count = 1000;
            s.timer.remaining_ns = Some(100_001);
        }),
        LapicStateError::TimerRemaining {
            remaining_ns: 100_001,
            max_ns: 100_000
        }
    );
    let message = refused(&|s| s.nmis_pending = 9).to_string();
    assert!(
        message.contains("NMIs") && message.contains("corrupt snapshot"),
        "{message}"
    );
}
