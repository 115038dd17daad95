//! Behaviour tests of the whole LAPIC through its register views.

use std::cell::Cell;

use super::regs::*;
use super::*;

pub(super) fn lapic() -> Lapic {
    let mut lapic = Lapic::new(LapicConfig::default()).unwrap();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    lapic
}

pub(super) fn write(
    lapic: &mut Lapic<impl LapicEvents>,
    offset: u32,
    value: u32,
    now: u64,
) -> LapicEffects {
    lapic.write_mmio(u64::from(offset), &value.to_le_bytes(), now)
}

pub(super) fn read(lapic: &mut Lapic<impl LapicEvents>, offset: u32, now: u64) -> u32 {
    let mut data = [0u8; 4];
    lapic.read_mmio(u64::from(offset), &mut data, now);
    u32::from_le_bytes(data)
}

fn x2apic() -> Lapic {
    let mut lapic = Lapic::new(LapicConfig {
        apic_id: 0x23,
        ..LapicConfig::default()
    })
    .unwrap();
    let base = DEFAULT_APIC_BASE | APIC_BASE_ENABLE | APIC_BASE_X2APIC;
    let effects = lapic.write_msr(MSR_APIC_BASE, base, 0).unwrap();
    assert_eq!(effects.base_change.unwrap().mode, ApicMode::X2Apic);
    let _ = lapic.write_msr(0x80F, 0x1FF, 0).unwrap();
    lapic
}

#[derive(Default)]
pub(super) struct Counting {
    pub(super) invalid: Cell<u32>,
    pub(super) illegal: Cell<u32>,
    pub(super) clamped: Cell<u32>,
    pub(super) unsupported: Cell<u32>,
}

impl LapicEvents for Counting {
    fn invalid_access(&self, _: InvalidAccess) {
        self.invalid.set(self.invalid.get() + 1);
    }
    fn illegal_vector(&self, _: u8) {
        self.illegal.set(self.illegal.get() + 1);
    }
    fn timer_clamped(&self, _: u64, _: u64) {
        self.clamped.set(self.clamped.get() + 1);
    }
    fn unsupported_delivery_mode(&self, _: u8) {
        self.unsupported.set(self.unsupported.get() + 1);
    }
}

#[test]
fn power_up_state() {
    let mut lapic = Lapic::new(LapicConfig::default()).unwrap();
    assert_eq!(read(&mut lapic, VERSION, 0), 0x0005_0014);
    assert_eq!(read(&mut lapic, SVR, 0), 0xFF);
    assert_eq!(read(&mut lapic, DFR, 0), 0xFFFF_FFFF);
    for lvt in (LVT_TIMER..=LVT_ERROR).step_by(0x10) {
        assert_eq!(read(&mut lapic, lvt, 0), LVT_MASKED);
    }
    assert_eq!(lapic.read_msr(MSR_APIC_BASE, 0), Ok(0xFEE0_0900));
    let ap = Lapic::new(LapicConfig {
        apic_id: 1,
        bsp: false,
        ..LapicConfig::default()
    })
    .unwrap();
    assert_eq!(ap.init_sipi_state(), InitSipiState::WaitForSipi);
    assert_eq!(
        Lapic::new(LapicConfig {
            bus_hz: 0,
            ..LapicConfig::default()
        })
        .err(),
        Some(LapicError::ZeroFrequency)
    );
}

#[test]
fn svr_disable_masks_lvts() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, LVT_LINT0, 0x700, 0);
    let _ = write(&mut lapic, LVT_ERROR, 0xFE, 0);
    assert_eq!(read(&mut lapic, LVT_ERROR, 0), 0xFE);
    let _ = write(&mut lapic, SVR, 0xFF, 0);
    for lvt in (LVT_TIMER..=LVT_ERROR).step_by(0x10) {
        assert_ne!(read(&mut lapic, lvt, 0) & LVT_MASKED, 0);
    }
    let _ = write(&mut lapic, LVT_ERROR, 0xFE, 0);
    assert_eq!(read(&mut lapic, LVT_ERROR, 0), LVT_MASKED | 0xFE);
    assert!(!lapic.accept_interrupt(0x40, false));
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    assert_eq!(read(&mut lapic, LVT_ERROR, 0), LVT_MASKED | 0xFE);
    let _ = write(&mut lapic, LVT_ERROR, 0xFE, 0);
    assert_eq!(read(&mut lapic, LVT_ERROR, 0), 0xFE);
}

#[test]
fn lvt_reserved_bits_stay_zero() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, LVT_TIMER, u32::MAX, 0);
    // Reserved timer mode 0b11 becomes one-shot.
    assert_eq!(read(&mut lapic, LVT_TIMER, 0), 0x0001_00FF);
    let _ = write(&mut lapic, LVT_THERMAL, u32::MAX, 0);
    assert_eq!(read(&mut lapic, LVT_THERMAL, 0), 0x0001_07FF);
    let _ = write(&mut lapic, LVT_LINT1, u32::MAX, 0);
    assert_eq!(read(&mut lapic, LVT_LINT1, 0), 0x0001_A7FF);
    let _ = write(&mut lapic, LVT_ERROR, u32::MAX, 0);
    assert_eq!(read(&mut lapic, LVT_ERROR, 0), 0x0001_00FF);
    let _ = write(&mut lapic, SVR, u32::MAX, 0);
    assert_eq!(read(&mut lapic, SVR, 0), 0x1FF);
}

#[test]
fn priority_order_and_tpr() {
    let mut lapic = lapic();
    for v in [0x31, 0x51, 0x41] {
        assert!(lapic.accept_interrupt(v, false));
    }
    let mut order = vec![];
    while let Some(v) = lapic.next_interrupt() {
        lapic.interrupt_injected(v);
        order.push(v);
        // A nested lower interrupt must wait for the EOI.
        assert_eq!(lapic.next_interrupt(), None);
        assert_eq!(lapic.ppr(), v & 0xF0);
        assert_eq!(
            write(&mut lapic, EOI, 0, 0).eoi,
            Some(Eoi {
                vector: v,
                level_triggered: false
            })
        );
    }
    assert_eq!(order, [0x51, 0x41, 0x31]);
    assert_eq!(write(&mut lapic, EOI, 0, 0).eoi, None);

    let _ = write(&mut lapic, TPR, 0x45, 0);
    assert!(lapic.accept_interrupt(0x42, false));
    assert!(lapic.accept_interrupt(0x3F, false));
    assert_eq!(lapic.next_interrupt(), None);
    assert!(!lapic.has_pending_interrupt());
    assert!(lapic.accept_interrupt(0x50, false));
    assert_eq!(lapic.next_interrupt(), Some(0x50));
    lapic.set_cr8(3);
    assert_eq!(read(&mut lapic, TPR, 0), 0x30);
    assert_eq!(lapic.cr8(), 3);
    assert_eq!(lapic.next_interrupt(), Some(0x50));
}

#[test]
fn ppr_and_apr_follow_tpr_and_isr() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, TPR, 0x25, 0);
    assert_eq!(read(&mut lapic, PPR, 0), 0x25);
    assert!(lapic.accept_interrupt(0x61, true));
    assert_eq!(read(&mut lapic, APR, 0), 0x60);
    lapic.interrupt_injected(0x61);
    assert_eq!(read(&mut lapic, PPR, 0), 0x60);
    assert_eq!(read(&mut lapic, ISR0 + 0x30, 0), 1 << 1);
    assert_eq!(read(&mut lapic, TMR0 + 0x30, 0), 1 << 1);
    let _ = write(&mut lapic, TPR, 0x70, 0);
    assert_eq!(read(&mut lapic, PPR, 0), 0x70);
    let eoi = write(&mut lapic, EOI, 0, 0).eoi;
    assert_eq!(
        eoi,
        Some(Eoi {
            vector: 0x61,
            level_triggered: true
        })
    );
    assert_eq!(read(&mut lapic, PPR, 0), 0x70);
}

#[test]
fn esr_write_then_read() {
    let mut lapic = Lapic::with_events(LapicConfig::default(), Counting::default()).unwrap();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    assert!(!lapic.accept_interrupt(3, false));
    assert_eq!(lapic.events().illegal.get(), 1);
    assert_eq!(
        read(&mut lapic, ESR, 0),
        0,
        "errors appear only after a write"
    );
    let _ = write(&mut lapic, ESR, 0, 0);
    assert_eq!(read(&mut lapic, ESR, 0), ESR_RECEIVE_ILLEGAL_VECTOR);
    let _ = write(&mut lapic, ESR, 0, 0);
    assert_eq!(read(&mut lapic, ESR, 0), 0);
    // Send illegal vector, and the error LVT raises its interrupt.
    let _ = write(&mut lapic, LVT_ERROR, 0xFE, 0);
    assert_eq!(write(&mut lapic, ICR_LOW, 0x4005, 0).ipi, None);
    assert_eq!(lapic.next_interrupt(), Some(0xFE));
    let _ = write(&mut lapic, ESR, 0, 0);
    assert_eq!(read(&mut lapic, ESR, 0), ESR_SEND_ILLEGAL_VECTOR);
    // Illegal register address.
    let _ = read(&mut lapic, 0x2F0, 0);
    let _ = write(&mut lapic, ESR, 0, 0);
    assert_eq!(read(&mut lapic, ESR, 0), ESR_ILLEGAL_REGISTER);
}

#[test]
fn icr_xapic_each_mode_and_shorthand() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, ID, 5 << 24, 0);
    let _ = write(&mut lapic, ICR_HIGH, 0x0300_00FF, 0);
    assert_eq!(read(&mut lapic, ICR_HIGH, 0), 0x0300_0000);
    let send = |lapic: &mut Lapic, low| write(lapic, ICR_LOW, low, 0).ipi;
    let fixed = send(&mut lapic, 0x0000_4031).unwrap();
    assert_eq!(
        fixed,
        Ipi {
            destination: 3,
            source_apic_id: Some(5),
            ..Ipi::fixed(0x31, 3)
        }
    );
    assert_eq!(
        read(&mut lapic, ICR_LOW, 0),
        0x4031,
        "delivery status reads idle"
    );
    let modes = [
        (0x4131, DeliveryMode::LowestPriority),
        (0x4400, DeliveryMode::Nmi),
        (0xC500, DeliveryMode::Init),
        (0x8500, DeliveryMode::Init),
        (0x4609, DeliveryMode::StartUp),
    ];
    for (low, mode) in modes {
        assert_eq!(send(&mut lapic, low).unwrap().delivery_mode, mode);
    }
    assert!(send(&mut lapic, 0x8500).unwrap().is_init_deassert());
    assert_eq!(send(&mut lapic, 0x4200), None, "SMI is ignored");
    for (bits, shorthand) in [
        (1, Shorthand::SelfOnly),
        (2, Shorthand::AllIncludingSelf),
        (3, Shorthand::AllExcludingSelf),
    ] {
        let ipi = send(&mut lapic, (bits << 18) | 0x4840).unwrap();
        assert_eq!(ipi.shorthand, shorthand);
        assert_eq!(ipi.destination_mode, DestinationMode::Logical);
    }
}

#[test]
fn icr_x2apic_and_self_ipi() {
    let mut lapic = x2apic();
    let effects = lapic.write_msr(0x830, 0x0000_0042_0000_4031, 0).unwrap();
    let ipi = effects.ipi.unwrap();
    assert_eq!(ipi.destination, 0x42);
    assert!(ipi.x2apic_format);
    assert_eq!(ipi.source_apic_id, Some(0x23));
    assert_eq!(lapic.read_msr(0x830, 0), Ok(0x0000_0042_0000_4031));
    let all = lapic.write_msr(0x830, 0xC_4400, 0).unwrap().ipi.unwrap();
    assert_eq!(
        (all.shorthand, all.delivery_mode),
        (Shorthand::AllExcludingSelf, DeliveryMode::Nmi)
    );
    let sipi = lapic
        .write_msr(0x830, 0x0000_0001_0000_4610, 0)
        .unwrap()
        .ipi
        .unwrap();
    assert_eq!(
        (sipi.delivery_mode, sipi.vector, sipi.destination),
        (DeliveryMode::StartUp, 0x10, 1)
    );
    let modes = [
        (0x4031, DeliveryMode::Fixed),
        (0x4131, DeliveryMode::LowestPriority),
        (0x4400, DeliveryMode::Nmi),
        (0xC500, DeliveryMode::Init),
        (0x4609, DeliveryMode::StartUp),
    ];
    for (low, mode) in modes {
        for (bits, shorthand) in [
            (0, Shorthand::None),
            (1, Shorthand::SelfOnly),
            (2, Shorthand::AllIncludingSelf),
            (3, Shorthand::AllExcludingSelf),
        ] {
            let icr = (7u64 << 32) | (bits << 18) | low;
            let ipi = lapic.write_msr(0x830, icr, 0).unwrap().ipi.unwrap();
            assert_eq!((ipi.delivery_mode, ipi.shorthand), (mode, shorthand));
            assert_eq!(ipi.destination, 7);
        }
    }
    assert_eq!(lapic.write_msr(0x830, 0x4200, 0).unwrap().ipi, None, "SMI");
    let effects = lapic.write_msr(0x83F, 0x55, 0).unwrap();
    assert_eq!(effects.ipi, None);
    assert_eq!(lapic.next_interrupt(), Some(0x55));
}

#[test]
fn x2apic_general_protection() {
    let mut lapic = x2apic();
    fn gp<T>(msr: u32) -> Result<T, LapicError> {
        Err(LapicError::GeneralProtection { msr })
    }
    assert_eq!(lapic.read_msr(0x802, 0), Ok(0x23));
    assert_eq!(lapic.read_msr(0x80D, 0), Ok((2 << 16) | (1 << 3)));
    assert_eq!(lapic.read_msr(0x803, 0), Ok(0x0005_0014));
    for msr in [
        0x80B, 0x83F, 0x80E, 0x809, 0x80C, 0x831, 0x82F, 0x840, 0x8FF,
    ] {
        assert_eq!(lapic.read_msr(msr, 0), gp(msr), "read {msr:#x}");
    }
    for msr in [
        0x802, 0x803, 0x80A, 0x80D, 0x80E, 0x810, 0x818, 0x820, 0x839, 0x831,
    ] {
        assert_eq!(
            lapic.write_msr(msr, 0, 0).map(|_| ()),
            gp(msr),
            "write {msr:#x}"
        );
    }
    assert_eq!(lapic.write_msr(0x80B, 1, 0).map(|_| ()), gp(0x80B));
    assert_eq!(lapic.write_msr(0x828, 1, 0).map(|_| ()), gp(0x828));
    assert_eq!(lapic.write_msr(0x808, 1 << 32, 0).map(|_| ()), gp(0x808));
    assert_eq!(
        lapic.write_msr(0x830, 0x0010_4031, 0).map(|_| ()),
        gp(0x830)
    );
    assert_eq!(lapic.write_msr(0x830, 0x2031, 0).map(|_| ()), gp(0x830));
    assert_eq!(lapic.write_msr(0x83F, 0x140, 0).map(|_| ()), gp(0x83F));
    assert!(lapic.write_msr(0x80B, 0, 0).is_ok());
    assert!(lapic.write_msr(0x828, 0, 0).is_ok());
    assert_eq!(lapic.read_msr(0x10, 0), Err(LapicError::NotLapicMsr(0x10)));
    // xAPIC MMIO is gone in x2APIC mode: unbacked, it reads all ones.
    assert_eq!(read(&mut lapic, ID, 0), u32::MAX);
    // And x2APIC MSRs fault in xAPIC mode.
    let mut xapic = self::lapic();
    assert_eq!(xapic.read_msr(0x802, 0), gp(0x802));
    assert_eq!(xapic.write_msr(0x808, 0, 0).map(|_| ()), gp(0x808));
}

#[test]
fn apic_base_transitions() {
    let mut lapic = lapic();
    let gp = Err(LapicError::GeneralProtection { msr: MSR_APIC_BASE });
    let set = |lapic: &mut Lapic, value| lapic.write_msr(MSR_APIC_BASE, value, 0);
    let enabled = DEFAULT_APIC_BASE | APIC_BASE_ENABLE;
    // Invalid state EXTD without EN, and reserved bits.
    assert_eq!(set(&mut lapic, DEFAULT_APIC_BASE | APIC_BASE_X2APIC), gp);
    assert_eq!(set(&mut lapic, enabled | 1), gp);
    assert_eq!(set(&mut lapic, enabled | (1 << 60)), gp);
    // Relocation in xAPIC mode; the BSP bit is read-only.
    let moved = set(&mut lapic, 0xFED0_0000 | APIC_BASE_ENABLE).unwrap();
    assert_eq!(
        moved.base_change,
        Some(ApicBaseChange {
            base_address: 0xFED0_0000,
            mode: ApicMode::XApic
        })
    );
    assert_eq!(lapic.read_msr(MSR_APIC_BASE, 0), Ok(0xFED0_0900));
    assert_eq!(set(&mut lapic, 0xFED0_0900).unwrap().base_change, None);
    // xAPIC -> x2APIC -> xAPIC (#GP) -> disabled -> x2APIC (#GP) -> xAPIC.
    assert!(set(&mut lapic, enabled | APIC_BASE_X2APIC).is_ok());
    assert_eq!(lapic.mode(), ApicMode::X2Apic);
    assert_eq!(set(&mut lapic, enabled), gp);
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    let off = set(&mut lapic, DEFAULT_APIC_BASE).unwrap();
    assert_eq!(off.base_change.unwrap().mode, ApicMode::Disabled);
    assert_eq!(lapic.mode(), ApicMode::Disabled);
    assert!(!lapic.accept_interrupt(0x40, false));
    assert_eq!(
        lapic.read_msr(0x802, 0),
        Err(LapicError::GeneralProtection { msr: 0x802 })
    );
    assert_eq!(set(&mut lapic, enabled | APIC_BASE_X2APIC), gp);
    assert!(set(&mut lapic, enabled).is_ok());
    assert_eq!(
        read(&mut lapic, SVR, 0),
        0xFF,
        "global disable resets the registers"
    );
    // Without x2APIC support the switch faults.
    let mut plain = Lapic::new(LapicConfig {
        x2apic_supported: false,
        ..LapicConfig::default()
    })
    .unwrap();
    assert_eq!(set(&mut plain, enabled | APIC_BASE_X2APIC), gp);
}

#[test]
fn ldr_dfr_and_routing() {
    let mut cpus: Vec<Lapic> = (0..4u32)
        .map(|id| {
            let mut l = Lapic::new(LapicConfig {
                apic_id: id,
                bsp: id == 0,
                ..LapicConfig::default()
            })
            .unwrap();
            let _ = write(&mut l, SVR, 0x1FF, 0);
            let _ = write(&mut l, LDR, (1 << id) << 24 | 0x00FF_FFFF, 0);
            l
        })
        .collect();
    assert_eq!(read(&mut cpus[2], LDR, 0), 0x0400_0000);
    let info: Vec<_> = cpus.iter().map(Lapic::destination_info).collect();
    let ipi = write(&mut cpus[0], ICR_HIGH, 0x0600_0000, 0);
    assert_eq!(ipi.ipi, None);
    let ipi = write(&mut cpus[0], ICR_LOW, 0x4840, 0).ipi.unwrap();
    let targets = route(&ipi, &info);
    assert_eq!(targets.iter().collect::<Vec<_>>(), [1, 2]);
    for t in targets.iter() {
        assert!(cpus[t].receive(&ipi));
    }
    assert_eq!(cpus[1].next_interrupt(), Some(0x40));
    // Cluster model: cluster 0, members 1 and 2 are CPUs with LDR 0x01, 0x02; set DFR.
    for (i, cpu) in cpus.iter_mut().enumerate() {
        let _ = write(cpu, DFR, 0, 0);
        let ldr = (u32::try_from(i / 2).unwrap() << 4) | (1 << (i % 2));
        let _ = write(cpu, LDR, ldr << 24, 0);
    }
    assert_eq!(read(&mut cpus[0], DFR, 0), 0x0FFF_FFFF);
    let info: Vec<_> = cpus.iter().map(Lapic::destination_info).collect();
    let _ = write(&mut cpus[0], ICR_HIGH, 0x1200_0000, 0);
    let ipi = write(&mut cpus[0], ICR_LOW, 0x4840, 0).ipi.unwrap();
    assert_eq!(route(&ipi, &info).iter().collect::<Vec<_>>(), [3]);
}

#[test]
fn init_sipi_state_machine() {
    let mut ap = Lapic::new(LapicConfig {
        apic_id: 1,
        bsp: false,
        ..LapicConfig::default()
    })
    .unwrap();
    let _ = write(&mut ap, SVR, 0x1FF, 0);
    let init = Ipi {
        delivery_mode: DeliveryMode::Init,
        trigger_mode: TriggerMode::Level,
        ..Ipi::fixed(0, 1)
    };
    let deassert = Ipi {
        assert: false,
        ..init
    };
    let sipi = |v| Ipi {
        delivery_mode: DeliveryMode::StartUp,
        ..Ipi::fixed(v, 1)
    };
    assert_eq!(ap.take_sipi(), None);
    assert!(ap.receive(&sipi(0x10)));
    assert_eq!(ap.init_sipi_state(), InitSipiState::SipiReceived(0x10));
    assert!(!ap.receive(&sipi(0x20)), "a second SIPI is ignored");
    assert_eq!(ap.take_sipi(), Some(0x10));
    assert_eq!(ap.init_sipi_state(), InitSipiState::Running);
    assert!(!ap.receive(&sipi(0x20)), "running CPUs ignore SIPI");
    // INIT resets the registers but not the ID.
    let _ = write(&mut ap, TPR, 0x40, 0);
    assert!(ap.accept_interrupt(0x80, false));
    assert!(ap.receive(&init));
    assert_eq!(ap.init_sipi_state(), InitSipiState::WaitForSipi);
    assert_eq!(read(&mut ap, TPR, 0), 0);
    assert_eq!(read(&mut ap, SVR, 0), 0xFF);
    assert_eq!(read(&mut ap, ID, 0), 1 << 24);
    assert_eq!(ap.next_interrupt(), None);
    assert!(!ap.receive(&deassert));
    assert_eq!(ap.init_sipi_state(), InitSipiState::WaitForSipi);
    assert!(ap.receive(&sipi(0x9A)));
    assert_eq!(ap.take_sipi(), Some(0x9A));
}

#[test]
fn nmi_and_unsupported_modes() {
    let mut lapic = Lapic::with_events(LapicConfig::default(), Counting::default()).unwrap();
    assert!(lapic.receive(&Ipi {
        delivery_mode: DeliveryMode::Nmi,
        ..Ipi::fixed(0, 0)
    }));
    assert!(lapic.has_pending_interrupt());
    assert_eq!(lapic.take_nmi(), 1);
    assert!(!lapic.nmi_pending());
    assert_eq!(lapic.take_nmi(), 0);
    assert!(!lapic.receive(&Ipi {
        delivery_mode: DeliveryMode::Smi,
        ..Ipi::fixed(0, 0)
    }));
    assert!(!lapic.receive(&Ipi {
        delivery_mode: DeliveryMode::ExtInt,
        ..Ipi::fixed(0, 0)
    }));
    assert_eq!(lapic.events().unsupported.get(), 2);
}

#[test]
fn mmio_widths_and_offsets() {
    let mut lapic = Lapic::with_events(LapicConfig::default(), Counting::default()).unwrap();
    let _ = write(&mut lapic, TPR, 0x5A, 0);
    let mut byte = [0u8; 1];
    lapic.read_mmio(u64::from(VERSION) + 2, &mut byte, 0);
    assert_eq!(byte, [5]);
    let mut wide = [0xAAu8; 8];
    lapic.read_mmio(u64::from(TPR), &mut wide, 0);
    assert_eq!(wide, [0; 8]);
    let mut straddle = [0xAAu8; 4];
    lapic.read_mmio(u64::from(TPR) + 2, &mut straddle, 0);
    assert_eq!(straddle, [0; 4]);
    let _ = lapic.write_mmio(u64::from(TPR), &[1, 0], 0);
    let _ = lapic.write_mmio(u64::from(TPR) + 4, &[1, 0, 0, 0], 0);
    assert_eq!(read(&mut lapic, TPR, 0), 0x5A);
    assert_eq!(lapic.events().invalid.get(), 4);
    let _ = write(&mut lapic, PPR, 0xFF, 0);
    let _ = write(&mut lapic, 0xFF0, 0xFF, 0);
    lapic.read_mmio(0x1_0000_0000, &mut [0; 4], 0);
    assert_eq!(lapic.events().invalid.get(), 7);
    assert_eq!(read(&mut lapic, PPR, 0), 0x5A);
}

#[test]
fn lint_pins_follow_their_lvt() {
    let mut lapic = Lapic::with_events(LapicConfig::default(), Counting::default()).unwrap();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    assert!(!lapic.assert_lint(1), "masked after reset");
    let _ = write(&mut lapic, LVT_LINT1, 0x400, 0);
    assert!(lapic.assert_lint(1));
    assert_eq!(lapic.take_nmi(), 1);
    let _ = write(&mut lapic, LVT_LINT0, 0x8033, 0);
    assert!(lapic.assert_lint(0));
    assert_eq!(lapic.next_interrupt(), Some(0x33));
    lapic.interrupt_injected(0x33);
    assert_eq!(
        write(&mut lapic, EOI, 0, 0).eoi,
        Some(Eoi {
            vector: 0x33,
            level_triggered: true
        })
    );
    let _ = write(&mut lapic, LVT_LINT0, 0x700, 0);
    assert!(!lapic.assert_lint(0));
    assert_eq!(lapic.events().unsupported.get(), 1);
    assert!(!lapic.assert_lint(2));
}

#[test]
fn addressing_writes_flag_the_routing_table() {
    let mut lapic = lapic();
    assert!(write(&mut lapic, LDR, 1 << 24, 0).destination_changed);
    assert!(write(&mut lapic, DFR, 0, 0).destination_changed);
    assert!(write(&mut lapic, ID, 7 << 24, 0).destination_changed);
    assert!(write(&mut lapic, SVR, 0xFF, 0).destination_changed);
    assert!(!write(&mut lapic, TPR, 0x10, 0).destination_changed);
    let base = DEFAULT_APIC_BASE | APIC_BASE_ENABLE | APIC_BASE_X2APIC;
    assert!(
        lapic
            .write_msr(MSR_APIC_BASE, base, 0)
            .unwrap()
            .destination_changed
    );
    assert_eq!(
        lapic.destination_info().apic_id,
        0,
        "x2APIC ID is the initial ID"
    );
}

#[test]
fn illegal_lvt_vector_is_a_receive_error() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, LVT_TIMER, 0x05, 0);
    let _ = write(&mut lapic, TIMER_INITIAL, 10, 0);
    assert_eq!(lapic.timer_fired(1_000_000), None);
    assert_eq!(lapic.next_interrupt(), None);
    let _ = write(&mut lapic, ESR, 0, 0);
    assert_eq!(read(&mut lapic, ESR, 0), ESR_RECEIVE_ILLEGAL_VECTOR);
    assert_eq!(read(&mut lapic, IRR0, 0), 0);
}

#[test]
fn two_nmis_before_a_service_pass_are_both_taken() {
    let mut lapic = lapic();
    let nmi = Ipi {
        delivery_mode: DeliveryMode::Nmi,
        ..Ipi::fixed(0, 0)
    };
    assert!(lapic.receive(&nmi));
    assert!(lapic.receive(&nmi));
    assert_eq!(lapic.take_nmi(), 2, "one taken, one latched behind it");
    // A third one in the same pass merges: a CPU latches only one behind the one it takes.
    for _ in 0..3 {
        lapic.accept_nmi();
    }
    let _ = write(&mut lapic, LVT_LINT1, 0x400, 0);
    assert!(lapic.assert_lint(1));
    assert_eq!(lapic.take_nmi(), MAX_PENDING_NMIS);
    assert_eq!(lapic.take_nmi(), 0);
    // INIT drops pending NMIs.
    lapic.accept_nmi();
    lapic.accept_init();
    assert!(!lapic.nmi_pending());
}

#[test]
fn fixed_interrupts_wait_for_nmis_the_cpu_would_deliver_first() {
    let mut lapic = lapic();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    lapic.accept_nmi();
    assert!(lapic.receive(&Ipi::fixed(0x50, 0)));
    assert_eq!(lapic.next_interrupt(), Some(0x50));
    assert_eq!(
        lapic.injectable_interrupt(),
        None,
        "the NMI is not handed over yet"
    );
    assert_eq!(lapic.take_nmi(), 1);
    assert!(lapic.nmi_in_cpu());
    assert_eq!(
        lapic.injectable_interrupt(),
        None,
        "until the CPU says otherwise"
    );
    lapic.cpu_nmi(CpuNmi::Deliverable);
    assert!(lapic.nmi_wakes_cpu());
    assert_eq!(lapic.injectable_interrupt(), None);
    // One latched behind NMI blocking holds nothing back and wakes no halted vCPU.
    lapic.cpu_nmi(CpuNmi::Blocked);
    assert!(lapic.nmi_in_cpu() && !lapic.nmi_wakes_cpu());
    assert_eq!(lapic.injectable_interrupt(), Some(0x50));
    lapic.cpu_nmi(CpuNmi::None);
    assert!(!lapic.nmi_in_cpu());
    assert_eq!(lapic.injectable_interrupt(), Some(0x50));
    // INIT forgets what the CPU held (the VMM clears KVM's NMIs too).
    lapic.accept_nmi();
    assert_eq!(lapic.take_nmi(), 1);
    lapic.accept_init();
    assert!(!lapic.nmi_in_cpu());
}

#[test]
fn cr8_is_tpr_bits_7_to_4() {
    let mut lapic = lapic();
    for cr8 in 0..16u64 {
        lapic.set_cr8(cr8);
        assert_eq!(read(&mut lapic, TPR, 0), u32::try_from(cr8 << 4).unwrap());
        assert_eq!(read(&mut lapic, PPR, 0), u32::try_from(cr8 << 4).unwrap());
        assert_eq!(lapic.cr8(), cr8);
    }
    // A TPR write shows in CR8 (bits 3:0 of the TPR are not part of it).
    let _ = write(&mut lapic, TPR, 0x7C, 0);
    assert_eq!(lapic.cr8(), 7);
    // A CR8 write clears TPR[3:0]; only CR8[3:0] exist.
    lapic.set_cr8(0x1_0000_0006);
    assert_eq!(read(&mut lapic, TPR, 0), 0x60);
    // A pending interrupt at or below the new priority is held, released when CR8 drops.
    assert!(lapic.accept_interrupt(0x65, false));
    assert_eq!(lapic.next_interrupt(), None, "class 6 at CR8 6");
    assert!(!lapic.has_pending_interrupt());
    lapic.set_cr8(7);
    assert_eq!(lapic.next_interrupt(), None, "class 6 under CR8 7");
    lapic.set_cr8(5);
    assert_eq!(lapic.next_interrupt(), Some(0x65));
    // With a vector in service the PPR is the higher of the two.
    lapic.interrupt_injected(0x65);
    lapic.set_cr8(2);
    assert_eq!(read(&mut lapic, PPR, 0), 0x60);
    assert_eq!(lapic.cr8(), 2);
}

#[test]
fn held_by_tpr_only_when_tpr_alone_holds_the_interrupt() {
    let mut lapic = lapic();
    assert!(!lapic.held_by_tpr(), "nothing pending");
    assert!(lapic.accept_interrupt(0x65, false));
    assert!(!lapic.held_by_tpr(), "deliverable at TPR 0");
    lapic.set_cr8(6);
    assert!(lapic.held_by_tpr());
    lapic.set_cr8(9);
    assert!(lapic.held_by_tpr());
    // An in-service vector of a higher class holds it too: lowering TPR would not help.
    lapic.set_cr8(0);
    assert!(lapic.accept_interrupt(0x85, false));
    lapic.interrupt_injected(0x85);
    lapic.set_cr8(6);
    assert!(!lapic.held_by_tpr());
    let _ = write(&mut lapic, EOI, 0, 0);
    assert!(lapic.held_by_tpr());
}

#[test]
fn kvm_run_cr8_syncs_only_changes() {
    let mut lapic = lapic();
    // The guest set TPR through the register; kvm_run.cr8 then echoes its class.
    let _ = write(&mut lapic, TPR, 0x3C, 0);
    assert!(!lapic.sync_cr8(lapic.cr8()));
    assert_eq!(
        read(&mut lapic, TPR, 0),
        0x3C,
        "TPR[3:0] survive an unchanged CR8"
    );
    // The guest lowered CR8 (KVM_EXIT_SET_TPR): a held interrupt becomes deliverable.
    assert!(lapic.accept_interrupt(0x35, false));
    assert_eq!(lapic.next_interrupt(), None);
    assert!(lapic.sync_cr8(2));
    assert_eq!(read(&mut lapic, TPR, 0), 0x20);
    assert_eq!(lapic.next_interrupt(), Some(0x35));
    // Raised past it: held again.
    assert!(lapic.sync_cr8(0xF));
    assert_eq!(lapic.next_interrupt(), None);
}

#[test]
fn xapic_page_is_unbacked_while_the_interface_is_off() {
    let mut lapic = Lapic::with_events(LapicConfig::default(), Counting::default()).unwrap();
    let _ = write(&mut lapic, SVR, 0x1FF, 0);
    let _ = write(&mut lapic, TPR, 0x20, 0);
    // Globally disabled: every offset and width reads all ones; writes do nothing.
    let _ = lapic
        .write_msr(MSR_APIC_BASE, DEFAULT_APIC_BASE, 0)
        .unwrap();
    for (offset, len) in [
        (ID, 4),
        (VERSION, 4),
        (TPR, 1),
        (0x2F0, 4),
        (0xFFC, 4),
        (TPR, 8),
    ] {
        let mut data = vec![0u8; len];
        lapic.read_mmio(u64::from(offset), &mut data, 0);
        assert!(
            data.iter().all(|&b| b == 0xFF),
            "offset {offset:#x} len {len}"
        );
    }
    assert_eq!(
        write(&mut lapic, ICR_LOW, 0x4_4040, 0),
        LapicEffects::default()
    );
    assert_eq!(write(&mut lapic, SVR, 0x1FF, 0), LapicEffects::default());
    let _ = lapic.write_msr(MSR_APIC_BASE, DEFAULT_APIC_BASE | APIC_BASE_ENABLE, 0);
    assert_eq!(
        read(&mut lapic, SVR, 0),
        0xFF,
        "the SVR write while disabled was dropped"
    );
    // No ESR error for the accesses while off.
    let _ = write(&mut lapic, ESR, 0, 0);
    assert_eq!(read(&mut lapic, ESR, 0), 0);
    // x2APIC mode: the same, and the MSR view is unaffected by MMIO writes.
    let x2 = DEFAULT_APIC_BASE | APIC_BASE_ENABLE | APIC_BASE_X2APIC;
    let _ = lapic.write_msr(MSR_APIC_BASE, x2, 0).unwrap();
    let _ = lapic.write_msr(0x808, 0x30, 0).unwrap();
    assert_eq!(read(&mut lapic, TPR, 0), u32::MAX);
    assert_eq!(write(&mut lapic, TPR, 0x50, 0), LapicEffects::default());
    assert_eq!(lapic.read_msr(0x808, 0), Ok(0x30));
    assert!(lapic.events().invalid.get() >= 8);
}

#[test]
fn apic_base_address_bits_above_maxphyaddr_fault() {
    let gp = Err(LapicError::GeneralProtection { msr: MSR_APIC_BASE });
    for bits in [36u8, 39, 46, 52] {
        let mut lapic = Lapic::new(LapicConfig {
            max_phys_addr_bits: bits,
            ..LapicConfig::default()
        })
        .unwrap();
        let enabled = APIC_BASE_ENABLE;
        // The highest page below MAXPHYADDR is a valid base.
        let top = ((1u64 << bits) - 1) & APIC_BASE_ADDRESS;
        let moved = lapic.write_msr(MSR_APIC_BASE, top | enabled, 0).unwrap();
        assert_eq!(moved.base_change.unwrap().base_address, top);
        for bit in u32::from(bits)..52 {
            assert_eq!(
                lapic.write_msr(MSR_APIC_BASE, DEFAULT_APIC_BASE | enabled | (1 << bit), 0),
                gp,
                "MAXPHYADDR {bits}, bit {bit}"
            );
        }
        assert_eq!(
            lapic.base_address(),
            top,
            "a faulting write changes nothing"
        );
    }
    for bits in [0u8, 31, 53, 64] {
        let config = LapicConfig {
            max_phys_addr_bits: bits,
            ..LapicConfig::default()
        };
        assert_eq!(
            Lapic::new(config).err(),
            Some(LapicError::MaxPhysAddrOutOfRange(bits))
        );
    }
}

#[test]
fn without_x2apic_support_x2apic_is_hidden() {
    let mut lapic = Lapic::new(LapicConfig {
        x2apic_supported: false,
        ..LapicConfig::default()
    })
    .unwrap();
    let gp = |msr| Err(LapicError::GeneralProtection { msr });
    let base = DEFAULT_APIC_BASE | APIC_BASE_ENABLE;
    assert_eq!(
        lapic
            .write_msr(MSR_APIC_BASE, base | APIC_BASE_X2APIC, 0)
            .map(|_| ()),
        gp(MSR_APIC_BASE)
    );
    assert_eq!(lapic.mode(), ApicMode::XApic);
    // From disabled too, and the disabled -> xAPIC path still works.
    let _ = lapic
        .write_msr(MSR_APIC_BASE, DEFAULT_APIC_BASE, 0)
        .unwrap();
    assert_eq!(
        lapic
            .write_msr(MSR_APIC_BASE, base | APIC_BASE_X2APIC, 0)
            .map(|_| ()),
        gp(MSR_APIC_BASE)
    );
    assert!(lapic.write_msr(MSR_APIC_BASE, base, 0).is_ok());
    // Every x2APIC MSR faults, read or write.
    for msr in regs::X2APIC_MSR_FIRST..=regs::X2APIC_MSR_LAST {
        assert_eq!(lapic.read_msr(msr, 0).map(|_| ()), gp(msr), "read {msr:#x}");
        assert_eq!(
            lapic.write_msr(msr, 0, 0).map(|_| ()),
            gp(msr),
            "write {msr:#x}"
        );
    }
    assert_eq!(lapic.read_msr(MSR_APIC_BASE, 0), Ok(base | APIC_BASE_BSP));
}

/// A TSC deadline at or before now expires at the write itself: the effects say so (no host
/// timer will report that expiry, so the VMM counts the fire from them); a future deadline,
/// and a write that leaves the timer alone, do not.
#[test]
fn an_expiry_at_the_write_is_reported_in_its_effects() {
    let mut l = lapic();
    let now = 1_000_000_000;
    let lvt = write(&mut l, LVT_TIMER, 0x40 | (2 << 17), now);
    assert!(!lvt.timer_expired);
    let future = l.write_msr(MSR_TSC_DEADLINE, 1 << 50, now).unwrap();
    assert!(!future.timer_expired);
    assert_eq!(l.next_interrupt(), None);
    let past = l.write_msr(MSR_TSC_DEADLINE, 1, now).unwrap();
    assert!(past.timer_expired);
    assert_eq!(l.next_interrupt(), Some(0x40));
    let tpr = write(&mut l, TPR, 0, now);
    assert!(!tpr.timer_expired);
}
