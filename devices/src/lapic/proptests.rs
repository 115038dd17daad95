//! Property tests: random register traffic, clock advances and interrupt flow never panic and
//! keep the LAPIC's invariants.

use proptest::prelude::*;

use super::regs::{self, VectorBitmap};
use super::*;

#[derive(Debug, Clone)]
enum Op {
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

fn op() -> impl Strategy<Value = Op> {
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
    ]
}

fn derived_ppr(tpr: u8, isr: &VectorBitmap) -> u8 {
    let isrv = isr.highest().unwrap_or(0);
    if tpr >> 4 >= isrv >> 4 {
        tpr
    } else {
        isrv & 0xF0
    }
}

fn check_arm(change: LapicTimerChange, now: u64, limits: TimerLimits) -> Result<(), TestCaseError> {
    if let LapicTimerChange::Arm { deadline_ns } = change {
        prop_assert!(deadline_ns >= now.saturating_add(limits.min_delay_ns));
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
        for op in ops {
            match op {
                Op::MmioWrite(offset, value) => {
                    let effects = lapic.write_mmio(u64::from(offset), &value.to_le_bytes(), now);
                    check_arm(effects.timer, now, limits)?;
                }
                Op::MmioRead(offset, len) => {
                    let mut data = vec![0u8; len];
                    lapic.read_mmio(u64::from(offset), &mut data, now);
                    if lapic.mode() != ApicMode::XApic {
                        prop_assert!(data.iter().all(|&b| b == 0xFF), "unbacked page reads ones");
                    }
                }
                Op::MsrWrite(msr, value) => {
                    if let Ok(effects) = lapic.write_msr(msr, value, now) {
                        check_arm(effects.timer, now, limits)?;
                    }
                }
                Op::MsrRead(msr) => {
                    let _ = lapic.read_msr(msr, now);
                }
                Op::Advance(ns) => now = now.saturating_add(ns),
                Op::TimerFired => {
                    let previous = lapic.timer_deadline();
                    let next = lapic.timer_fired(now);
                    if let (Some(previous), Some(next)) = (previous, next) {
                        if next != previous {
                            prop_assert!(next - previous >= limits.min_period_ns);
                            prop_assert!(next > now || next == u64::MAX);
                        }
                    }
                }
                Op::Accept(vector, level) => {
                    let _ = lapic.accept_interrupt(vector, level);
                }
                Op::Inject => {
                    if let Some(vector) = lapic.next_interrupt() {
                        prop_assert!(vector >> 4 > lapic.ppr() >> 4);
                        lapic.interrupt_injected(vector);
                    }
                }
                Op::Eoi => {
                    let _ = lapic.write_mmio(u64::from(regs::EOI), &[0; 4], now);
                    let _ = lapic.write_msr(0x80B, 0, now);
                }
                Op::Receive(icr) => {
                    if let super::icr::IcrDecode::Send(ipi) =
                        super::icr::decode_icr(icr, icr & 1 == 0, 0)
                    {
                        let _ = lapic.receive(&ipi);
                    }
                }
            }
            prop_assert_eq!(lapic.ppr(), derived_ppr(lapic.tpr, &lapic.isr));
            prop_assert!(lapic.nmis_pending <= MAX_PENDING_NMIS);
            prop_assert_eq!(u64::from(lapic.tpr >> 4), lapic.cr8());
            prop_assert_eq!(lapic.isr.word(0) & 0xFFFF, 0);
            prop_assert_eq!(lapic.irr.word(0) & 0xFFFF, 0);
            prop_assert_eq!(lapic.esr & !0xE0, 0);
            if lapic.svr & regs::SVR_ENABLED == 0 {
                prop_assert!(lapic.lvt.iter().all(|lvt| lvt & regs::LVT_MASKED != 0));
            }
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
