//! Property tests: random register traffic, clock advances and interrupt flow never panic and
//! keep the LAPIC's invariants.
//!
//! The priority checks do not trust the LAPIC's own bookkeeping: [`Model`] keeps, from what
//! the test did (injections, EOIs, TPR and CR8 writes, INIT, global disable), which vectors are
//! in service and what TPR holds, and PPR, CR8 and interrupt acceptance are checked against
//! the SDM's definitions over that record ([`sdm_ppr`]).

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::regs;
use super::*;

#[derive(Debug, Clone)]
pub(super) enum Op {
    MmioWrite(u32, u32),
    MmioRead(u32, usize),
    MsrWrite(u32, u64),
    MsrRead(u32),
    Advance(u64),
    TimerFired,
    Accept(u8, bool),
    Inject,
    Eoi,
    Receive(u64),
    /// `kvm_run.cr8` after an exit.
    Cr8(u64),
}

fn offset() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => (0u32..0x40).prop_map(|i| i << 4),
        1 => 0u32..0x1010,
    ]
}

fn value() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        0u32..0x200,
        (0u32..4, any::<u8>()).prop_map(|(mode, v)| (mode << 17) | u32::from(v)),
        Just(0x1FF),
        1u32..5_000,
    ]
}

fn msr() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0x800u32..0x840,
        1 => Just(regs::MSR_APIC_BASE),
        1 => Just(regs::MSR_TSC_DEADLINE),
        1 => any::<u32>(),
    ]
}

fn msr_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..0x1_0000,
        Just(DEFAULT_APIC_BASE | APIC_BASE_ENABLE | APIC_BASE_X2APIC),
        Just(DEFAULT_APIC_BASE | APIC_BASE_ENABLE),
        Just(DEFAULT_APIC_BASE),
        0u64..100_000_000,
    ]
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (offset(), value()).prop_map(|(o, v)| Op::MmioWrite(o, v)),
        1 => (offset(), 0usize..9).prop_map(|(o, n)| Op::MmioRead(o, n)),
        3 => (msr(), msr_value()).prop_map(|(m, v)| Op::MsrWrite(m, v)),
        1 => msr().prop_map(Op::MsrRead),
        2 => prop_oneof![0u64..10_000, 0u64..10_000_000, Just(u64::MAX / 4)].prop_map(Op::Advance),
        2 => Just(Op::TimerFired),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(v, l)| Op::Accept(v, l)),
        2 => Just(Op::Inject),
        1 => Just(Op::Eoi),
        1 => any::<u64>().prop_map(Op::Receive),
        1 => prop_oneof![0u64..16, any::<u64>()].prop_map(Op::Cr8),
    ]
}

/// The processor priority as the SDM defines it (Vol. 3A 11.8.3.1), nibble by nibble:
/// PPR[7:4] = max(TPR[7:4], ISRV[7:4]); PPR[3:0] = TPR[3:0] if TPR[7:4] >= ISRV[7:4], else 0.
/// `isrv` is the highest in-service vector (0 if none).
fn sdm_ppr(tpr: u8, isrv: u8) -> u8 {
    let (tpr_class, isr_class) = (tpr / 16, isrv / 16);
    let high = tpr_class.max(isr_class);
    let low = if tpr_class >= isr_class { tpr % 16 } else { 0 };
    high * 16 + low
}

/// What the test did to the LAPIC, recorded without reading its ISR or TPR back.
#[derive(Debug, Default, Clone)]
pub(super) struct Model {
    /// Vectors the test injected (`interrupt_injected`) and no EOI has retired yet.
    in_service: BTreeSet<u8>,
    /// The task priority the test last wrote (TPR register or CR8).
    tpr: u8,
}

impl Model {
    /// The highest in-service vector, by scanning the record (0 if none).
    fn isrv(&self) -> u8 {
        (0..=255u8)
            .rev()
            .find(|v| self.in_service.contains(v))
            .unwrap_or(0)
    }

    /// INIT or a global disable: no vector in service, TPR 0 (SDM 11.4.7.1, 11.4.7.3).
    fn reset(&mut self) {
        self.in_service.clear();
        self.tpr = 0;
    }

    /// An EOI the LAPIC reported: it must retire the highest vector the test delivered.
    fn eoi(&mut self, eoi: Option<Eoi>, canonical: bool) -> Result<(), TestCaseError> {
        let top = self.in_service.last().copied();
        match eoi {
            Some(eoi) => {
                prop_assert_eq!(
                    Some(eoi.vector),
                    top,
                    "EOI retired a vector not highest in service"
                );
                self.in_service.remove(&eoi.vector);
            }
            None if canonical => prop_assert_eq!(top, None, "an EOI write retired nothing"),
            None => {}
        }
        Ok(())
    }
}

/// PPR, TPR and CR8 as the guest reads them, against the model's record.
fn check_priorities(lapic: &mut Lapic, model: &Model) -> Result<(), TestCaseError> {
    let ppr = sdm_ppr(model.tpr, model.isrv());
    prop_assert_eq!(
        lapic.ppr(),
        ppr,
        "PPR against the SDM over {:?}, TPR {:#x}",
        model.in_service,
        model.tpr
    );
    prop_assert_eq!(lapic.tpr(), model.tpr);
    // SDM 11.8.6.1: CR8[3:0] is TPR[7:4].
    prop_assert_eq!(lapic.cr8(), u64::from(model.tpr / 16));
    let read = |lapic: &mut Lapic, offset: u32| match lapic.mode() {
        ApicMode::Disabled => None,
        ApicMode::XApic => {
            let mut data = [0u8; 4];
            lapic.read_mmio(u64::from(offset), &mut data, 0);
            Some(u32::from_le_bytes(data))
        }
        ApicMode::X2Apic => lapic
            .read_msr(regs::X2APIC_MSR_FIRST + (offset >> 4), 0)
            .ok()
            .and_then(|v| u32::try_from(v).ok()),
    };
    if lapic.mode() != ApicMode::Disabled {
        prop_assert_eq!(read(lapic, regs::PPR), Some(u32::from(ppr)));
        prop_assert_eq!(read(lapic, regs::TPR), Some(u32::from(model.tpr)));
    }
    Ok(())
}

fn check_arm(change: LapicTimerChange, now: u64, limits: TimerLimits) -> Result<(), TestCaseError> {
    if let LapicTimerChange::Arm { deadline_ns } = change {
        prop_assert!(deadline_ns >= now.saturating_add(limits.min_delay_ns));
    }
    Ok(())
}

/// Applies `op` to `lapic` at `now` (an `Advance` moves `now`), checking what it returned
/// and keeping `model` in step.
pub(super) fn apply(
    lapic: &mut Lapic,
    model: &mut Model,
    op: Op,
    now: &mut u64,
    limits: TimerLimits,
) -> Result<(), TestCaseError> {
    let at = *now;
    let mode = lapic.mode();
    match op {
        Op::MmioWrite(offset, value) => {
            let effects = lapic.write_mmio(u64::from(offset), &value.to_le_bytes(), at);
            check_arm(effects.timer, at, limits)?;
            let xapic = mode == ApicMode::XApic;
            if xapic && offset == regs::TPR {
                model.tpr = value.to_le_bytes()[0];
            }
            model.eoi(effects.eoi, xapic && offset == regs::EOI)?;
        }
        Op::MmioRead(offset, len) => {
            let mut data = vec![0u8; len];
            lapic.read_mmio(u64::from(offset), &mut data, at);
            if lapic.mode() != ApicMode::XApic {
                prop_assert!(data.iter().all(|&b| b == 0xFF), "unbacked page reads ones");
            }
        }
        Op::MsrWrite(msr, value) => msr_write(lapic, model, msr, value, at, limits)?,
        Op::MsrRead(msr) => {
            let _ = lapic.read_msr(msr, at);
        }
        Op::Advance(ns) => *now = now.saturating_add(ns),
        Op::TimerFired => {
            let previous = lapic.timer_deadline();
            let next = lapic.timer_fired(at);
            if let (Some(previous), Some(next)) = (previous, next) {
                if next != previous {
                    prop_assert!(next - previous >= limits.min_period_ns);
                    prop_assert!(next > at || next == u64::MAX);
                }
            }
        }
        Op::Accept(vector, level) => {
            let _ = lapic.accept_interrupt(vector, level);
        }
        Op::Inject => {
            if let Some(vector) = lapic.next_interrupt() {
                lapic.interrupt_injected(vector);
                model.in_service.insert(vector);
            }
        }
        Op::Eoi => {
            let effects = lapic.write_mmio(u64::from(regs::EOI), &[0; 4], at);
            model.eoi(effects.eoi, mode == ApicMode::XApic)?;
            let eoi = lapic.write_msr(0x80B, 0, at).ok().and_then(|e| e.eoi);
            model.eoi(eoi, mode == ApicMode::X2Apic)?;
        }
        Op::Receive(icr) => receive(lapic, model, icr),
        Op::Cr8(cr8) => {
            // `sync_cr8` takes a changed CR8 as a MOV to CR8: TPR[7:4] = CR8[3:0],
            // TPR[3:0] = 0 (SDM 11.8.6.1); an unchanged one leaves TPR alone.
            let changed = (cr8 & 0xF) != u64::from(model.tpr / 16);
            prop_assert_eq!(lapic.sync_cr8(cr8), changed);
            if changed {
                model.tpr = (cr8.to_le_bytes()[0] & 0xF) * 16;
            }
        }
    }
    Ok(())
}

/// What holds after every operation: priorities as the model says, delivery by the PPR, and
/// the reserved bits clear.
/// A WRMSR: the timer it arms, the TPR and EOI it writes (x2APIC), a reset if it disables
/// the LAPIC.
fn msr_write(
    lapic: &mut Lapic,
    model: &mut Model,
    msr: u32,
    value: u64,
    at: u64,
    limits: TimerLimits,
) -> Result<(), TestCaseError> {
    let mode = lapic.mode();
    let x2apic = mode == ApicMode::X2Apic;
    let canonical_eoi = x2apic && msr == 0x80B && value == 0;
    match lapic.write_msr(msr, value, at) {
        Ok(effects) => {
            check_arm(effects.timer, at, limits)?;
            if x2apic && msr == 0x808 {
                model.tpr = value.to_le_bytes()[0];
            }
            model.eoi(effects.eoi, canonical_eoi)?;
        }
        Err(e) => prop_assert!(!canonical_eoi, "x2APIC EOI faulted: {e}"),
    }
    if mode != ApicMode::Disabled && lapic.mode() == ApicMode::Disabled {
        model.reset();
    }
    Ok(())
}

/// An IPI received: an INIT resets the model as it resets the LAPIC.
fn receive(lapic: &mut Lapic, model: &mut Model, icr: u64) {
    let mode = lapic.mode();
    if let super::icr::IcrDecode::Send(ipi) = super::icr::decode_icr(icr, icr & 1 == 0, 0) {
        let _ = lapic.receive(&ipi);
        // SDM 11.6.1: an INIT (but a level de-assert) resets the LAPIC.
        let deassert = ipi.trigger_mode == TriggerMode::Level && !ipi.assert;
        if ipi.delivery_mode == DeliveryMode::Init && !deassert && mode != ApicMode::Disabled {
            model.reset();
        }
    }
}

fn check_invariants(lapic: &mut Lapic, model: &Model) -> Result<(), TestCaseError> {
    check_priorities(lapic, model)?;
    // Acceptance follows from the PPR: the highest pending vector is deliverable iff
    // its class is above PPR's (SDM 11.8.3.1), and nothing else is.
    let ppr = sdm_ppr(model.tpr, model.isrv());
    let irrv = (0..=255u8).rev().find(|&v| lapic.irr.contains(v));
    let deliverable = irrv.filter(|&v| lapic.mode() != ApicMode::Disabled && v / 16 > ppr / 16);
    prop_assert_eq!(
        lapic.next_interrupt(),
        deliverable,
        "PPR {:#x}, IRR top {:?}",
        ppr,
        irrv
    );
    prop_assert!(lapic.nmis.pending() <= MAX_PENDING_NMIS);
    prop_assert_eq!(lapic.isr.word(0) & 0xFFFF, 0);
    prop_assert_eq!(lapic.irr.word(0) & 0xFFFF, 0);
    prop_assert_eq!(lapic.esr & !0xE0, 0);
    if lapic.svr & regs::SVR_ENABLED == 0 {
        prop_assert!(lapic.lvt.iter().all(|lvt| lvt & regs::LVT_MASKED != 0));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_traffic_keeps_invariants(ops in prop::collection::vec(op(), 1..200), bsp: bool) {
        let config = LapicConfig {
            apic_id: 1,
            bsp,
            tsc: TscMap { tsc_khz: 2_100_000, tsc_at_ns0: 12_345 },
            ..LapicConfig::default()
        };
        let limits = config.limits;
        let mut lapic = Lapic::new(config).unwrap();
        let mut now = 0u64;
        let mut model = Model::default();
        for op in ops {
            apply(&mut lapic, &mut model, op, &mut now, limits)?;
            check_invariants(&mut lapic, &model)?;
        }
    }

    #[test]
    fn tsc_map_round_trip(khz in 1u64..10_000_000, base: u32, ns in 0u64..(1 << 50)) {
        let map = TscMap { tsc_khz: khz, tsc_at_ns0: u64::from(base) };
        let tsc = map.tsc_at(ns);
        // Converting back never lands after `ns`... and never before the TSC tick's start.
        let back = map.ns_at(tsc);
        prop_assert!(back <= ns);
        prop_assert!(map.tsc_at(back) == tsc);
    }
}
