//! A vCPU's chip saved and restored into another VM's (fake clock, fake vCPU): the posted
//! interrupts and the timer's time left go along, nothing fires early, and a bad state is
//! refused by name with nothing changed.

use timer::ModelKind;

use super::tests::Rig;
use crate::irqchip::{Entry, VcpuIrq};

#[test]
fn a_restored_chip_keeps_posted_interrupts_and_its_timers_time_left() {
    let mut a = Rig::new(ModelKind::Pull);
    a.port.open = true;
    a.mmio_write(0x3e0, 0xb); // divide by 1
    a.mmio_write(0x320, 0x40); // LVT timer: one-shot, vector 0x40
    a.mmio_write(0x380, 1_000_000); // 1 ms
    a.wrmsr(0x4b56_4d04, 0x1000 | 1); // PV EOI at 0x1000
    a.router.send_ipi(&devices::lapic::Ipi::fixed(0x55, 0)); // posted, not yet taken
    a.clock.set(400_000);
    let state = a.irq.save(true).expect("the user chip saves its state");
    assert!(state.halted);
    assert_eq!(state.lapic.timer.remaining_ns, Some(600_000));
    assert_ne!(
        state.lapic.irr[0x55 / 32] & 1 << (0x55 % 32),
        0,
        "the mail was taken"
    );
    assert_eq!(state.pv_eoi_msr, 0x1001);

    let mut b = Rig::new(ModelKind::Push);
    b.port.open = true;
    b.clock.set(5_000_000);
    b.irq.restore(&state).unwrap();
    assert!(b.irq.take_restored_halt(), "saved halted, restored halted");
    assert!(!b.irq.take_restored_halt(), "asked once");
    b.irq.attach(&mut b.port);
    assert_eq!(b.irq.lapic().save(5_000_000), state.lapic);
    b.clock.set(5_599_999);
    assert_eq!(b.irq.before_entry(&mut b.port), Entry::Enter);
    assert_eq!(
        b.port.injected,
        vec![0x55],
        "only the posted interrupt: no timer early"
    );
    b.eoi();
    b.clock.set(5_600_000);
    assert_eq!(b.irq.before_entry(&mut b.port), Entry::Enter);
    assert_eq!(b.port.injected, vec![0x55, 0x40]);
}

#[test]
fn a_bad_saved_state_is_refused_by_name_and_changes_nothing() {
    let mut a = Rig::new(ModelKind::Pull);
    a.mmio_write(0x320, 0x2_0040); // periodic
    let good = a.irq.save(false).unwrap();
    let mut b = Rig::new(ModelKind::Pull);
    let before = b.irq.save(false).unwrap();
    let mut bad = good.clone();
    bad.lapic.nmis_pending = 9;
    let why = b.irq.restore(&bad).unwrap_err().to_string();
    assert!(why.contains("9 NMIs pending"), "{why}");
    let mut bad = good.clone();
    bad.lapic.lvt[0] |= 3 << 17;
    let why = b.irq.restore(&bad).unwrap_err().to_string();
    assert!(why.contains("timer mode"), "{why}");
    let mut bad = good.clone();
    bad.pv_eoi_msr = 0x10_0000 | 1; // beyond the rig's 64 KiB of RAM
    let why = b.irq.restore(&bad).unwrap_err().to_string();
    assert!(why.contains("not in guest RAM"), "{why}");
    assert_eq!(b.irq.save(false).unwrap(), before);
    // The LVT register reads back as it was saved once the state is good.
    b.irq.restore(&good).unwrap();
    let lvt = b.irq.lapic().save(0).lvt[0];
    assert_eq!(lvt, good.lapic.lvt[0]);
    assert_eq!(lvt >> 17 & 3, 1, "periodic");
}
