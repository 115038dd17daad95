//! A vCPU of the `lapic` target (in the guest) exits with what its guest did, through the
//! chip's exit path, and the checks of every exit.

use std::sync::Arc;

use devices::lapic::{regs, ApicMode, Lapic};
use kvm_ioctls::{MsrExitReason, ReadMsrExit, VcpuExit};
use vm_memory::{Bytes, GuestAddress};
use vmm::irqchip::user::pv_deadline::MSR_LULL_PV_DEADLINE;
use vmm::irqchip::user::pv_eoi::MSR_KVM_PV_EOI_EN;
use vmm::irqchip::VcpuIrq;
use vmm::metrics::LapicNoise;
use vmm::setup::layout::IOAPIC_ADDR;

use super::check::{self, highest, read_bitmap};
use super::input::{GuestAction, IpiSpec};
use super::machine::{xapic_write, Machine};
use super::vcpu::{lapic_of, Place};

/// What the target read of a vCPU before its exit, to drive and check the exit with.
struct BeforeExit {
    now: u64,
    /// The vCPU's PV EOI flag, if it is its own.
    flag: Option<u64>,
    /// A copy of its LAPIC.
    lapic: Lapic<Arc<LapicNoise>>,
    deadline: Option<u64>,
    base: u64,
    mode: ApicMode,
    /// The vector lull offered through the PV flag at the entry.
    offered: Option<u8>,
}

/// How the guest ends an interrupt in this exit, if it does.
struct GuestEoi {
    /// Through the PV flag lull set (no exit of its own): the vector it ends.
    by_flag: Option<u8>,
    /// Through the EOI register.
    register: bool,
}

impl Machine {
    /// vCPU `i` (in the guest) exits with what its guest did.
    pub(super) fn exit(&mut self, i: usize, action: GuestAction) {
        if !self.write_icr_high_first(i, action) {
            return;
        }
        let mut before = self.read_before_exit(i);
        let eoi = self.guest_eoi(action, &before);
        self.after_run_checked(i, action, &before, eoi.by_flag);
        // What the EOI register must retire (read after `after_run`, which may EOI by flag).
        let isr_before = read_bitmap(&mut lapic_of(&self.vcpus[i]), regs::ISR0);
        let tsc_now = self.tsc_now();
        let (base, mode) = (before.base, before.mode);
        match action {
            GuestAction::MmioWrite { offset, len, value } => {
                self.lapic_mmio_write(i, mode, base, offset.get(), len, value.get());
            }
            GuestAction::MmioRead { offset, len } => {
                let mut data = [0u8; 8];
                let addr = base.wrapping_add(offset.get());
                self.run_exit(
                    i,
                    VcpuExit::MmioRead(addr, &mut data[..usize::from(len % 9)]),
                );
            }
            GuestAction::IoapicWrite { offset, len, value } => {
                let mut data = [0u8; 8];
                data[..4].copy_from_slice(&value.get().to_le_bytes());
                let addr = IOAPIC_ADDR + u64::from(offset);
                self.run_exit(i, VcpuExit::MmioWrite(addr, &data[..usize::from(len % 9)]));
            }
            GuestAction::IoapicRead { offset, len } => {
                let mut data = [0u8; 8];
                let addr = IOAPIC_ADDR + u64::from(offset);
                self.run_exit(
                    i,
                    VcpuExit::MmioRead(addr, &mut data[..usize::from(len % 9)]),
                );
            }
            GuestAction::MsrWrite { msr, value } => {
                self.msr_write(i, mode, msr.get(), value.get(tsc_now));
            }
            GuestAction::MsrRead { msr } => {
                let (mut error, mut data) = (0u8, 0u64);
                let exit = VcpuExit::X86Rdmsr(ReadMsrExit {
                    error: &mut error,
                    reason: MsrExitReason::Filter,
                    index: msr.get(),
                    data: &mut data,
                });
                self.run_exit(i, exit);
            }
            GuestAction::Ipi(spec) => self.send_ipi(i, &mut before.lapic, spec),
            GuestAction::Eoi if eoi.register => self.eoi_register(i, mode, base, isr_before),
            GuestAction::Window => self.run_exit(i, VcpuExit::IrqWindowOpen),
            GuestAction::Eoi | GuestAction::Interrupted | GuestAction::StoreDeadline(_) => {
                let v = &mut self.vcpus[i];
                v.irq.exit_done(&mut v.port);
            }
        }
        self.vcpus[i].place = Place::Out;
        self.check_deadline_after_exit(i, &before);
    }

    /// An xAPIC guest writes an IPI's destination (ICR2) first: an exit of its own, then an
    /// entry. False if the vCPU is no longer in the guest after it.
    fn write_icr_high_first(&mut self, i: usize, action: GuestAction) -> bool {
        if let GuestAction::Ipi(IpiSpec { destination, .. }) = action {
            if self.vcpus[i].irq.lapic().mode() == ApicMode::XApic {
                self.exit(i, xapic_write(regs::ICR_HIGH, destination << 24));
                self.enter(i, false);
                if self.vcpus[i].place != Place::InGuest {
                    return false;
                }
            }
        }
        true
    }

    fn read_before_exit(&mut self, i: usize) -> BeforeExit {
        let now = self.now();
        let flag = self.pv_flag_alone(i);
        let lapic = lapic_of(&self.vcpus[i]);
        BeforeExit {
            now,
            flag,
            deadline: lapic.timer_deadline(),
            base: lapic.base_address(),
            mode: lapic.mode(),
            lapic,
            offered: self.vcpus[i].offered.take(),
        }
    }

    /// The guest's EOI: through the PV flag when lull set it (the guest clears the flag), else
    /// through the register of an enabled LAPIC.
    fn guest_eoi(&self, action: GuestAction, before: &BeforeExit) -> GuestEoi {
        let mut eoi = GuestEoi {
            by_flag: None,
            register: false,
        };
        if let GuestAction::Eoi = action {
            match (before.flag, before.offered) {
                (Some(f), Some(vector)) if self.flag_byte(f) == 1 => {
                    self.write_flag(f, 0);
                    eoi.by_flag = Some(vector);
                }
                _ => eoi.register = before.mode != ApicMode::Disabled,
            }
        }
        eoi
    }

    /// The exit's `after_run` (after the guest's store to its PV deadline slot, if any), and
    /// what it must have done with the slot and the PV EOI flag.
    fn after_run_checked(
        &mut self,
        i: usize,
        action: GuestAction,
        before: &BeforeExit,
        pv_eoi: Option<u8>,
    ) {
        let id = u32::try_from(i).unwrap_or(0);
        let pv_eois = |m: &Machine| m.counter(id, |c| &c.pv_eois);
        let pv_eois_before = pv_eois(self);
        let pv_deadlines = |m: &Machine| m.counter(id, |c| &c.pv_deadlines);
        let pv_deadlines_before = pv_deadlines(self);
        let stored = self.store_deadline(i, action);
        let now = before.now;
        let cr8 = self.vcpus[i].port.cr8;
        if let Some(quota) = &self.quota {
            // What the chip charges in `after_run`: the time since the entry.
            quota.charge(now, now.saturating_sub(self.vcpus[i].entered));
        }
        self.vcpus[i].irq.after_run(Some(cr8));
        if let Some((slot, tsc)) = stored {
            let left: u64 = self.fake.mem.read_obj(GuestAddress(slot)).unwrap_or(0);
            assert_eq!(left, 0, "vCPU {i}: PV deadline slot not taken");
            let taken = pv_deadlines(self) - pv_deadlines_before;
            assert_eq!(taken, u64::from(tsc != 0), "vCPU {i}: PV deadlines taken");
        }
        // Every EOI by flag lull took ended the highest in-service interrupt.
        for _ in pv_eois_before..pv_eois(self) {
            self.vcpus[i].model.eoi();
        }
        if let Some(vector) = pv_eoi {
            let isr = read_bitmap(&mut lapic_of(&self.vcpus[i]), regs::ISR0);
            assert!(
                isr.is_none_or(|isr| !check::contains(&isr, vector)),
                "vCPU {i}: PV EOI of {vector:#x} did not retire it"
            );
            assert_eq!(
                pv_eois(self),
                pv_eois_before + 1,
                "vCPU {i}: PV EOI not counted"
            );
        } else if let (Some(f), Some(_)) = (before.flag, before.offered) {
            assert_eq!(self.flag_byte(f), 0, "vCPU {i}: PV flag not taken back");
        }
    }

    /// The guest's store to its PV deadline slot, taken by the exit's `after_run`: the slot
    /// and the TSC value, if the slot is the vCPU's own.
    fn store_deadline(&mut self, i: usize, action: GuestAction) -> Option<(u64, u64)> {
        let (GuestAction::StoreDeadline(value), Some(slot)) = (action, self.vcpus[i].pv_slot)
        else {
            return None;
        };
        let tsc = value.get(self.tsc_now());
        self.fake
            .mem
            .write_obj(tsc, GuestAddress(slot))
            .unwrap_or_else(|e| panic!("PV slot {slot:#x} accepted outside RAM: {e}"));
        self.vcpus[i].writes += 1;
        self.pv_slot_alone(i).map(|slot| (slot, tsc))
    }

    /// A guest MMIO write of `value` (`len` bytes) at `off` from its LAPIC's base `base`.
    fn lapic_mmio_write(
        &mut self,
        i: usize,
        mode: ApicMode,
        base: u64,
        off: u64,
        len: u8,
        value: u32,
    ) {
        let mut data = [0u8; 8];
        data[..4].copy_from_slice(&value.to_le_bytes());
        let addr = base.wrapping_add(off);
        self.vcpus[i].writes += 1;
        self.run_exit(i, VcpuExit::MmioWrite(addr, &data[..usize::from(len % 9)]));
        // An aligned 4-byte write inside the page is a register write (SDM 11.4.1).
        if mode == ApicMode::XApic && len % 9 == 4 && off.is_multiple_of(16) && off < 0x1000 {
            let model = &mut self.vcpus[i].model;
            match u32::try_from(off).unwrap_or(u32::MAX) {
                regs::TPR => model.tpr = data[0],
                regs::EOI => model.eoi(),
                _ => {}
            }
        }
    }

    /// A guest WRMSR of `data` to `index` from a LAPIC in `mode`, and what the target learns
    /// from it: TPR and EOI (x2APIC), a global disable, the PV EOI flag and PV deadline slot.
    fn msr_write(&mut self, i: usize, mode: ApicMode, index: u32, data: u64) {
        self.vcpus[i].writes += 1;
        let accepted = self.wrmsr(i, index, data);
        let model = &mut self.vcpus[i].model;
        if accepted && mode == ApicMode::X2Apic {
            match index {
                0x808 => model.tpr = data.to_le_bytes()[0],
                0x80B => model.eoi(),
                _ => {}
            }
        }
        if mode != ApicMode::Disabled && self.vcpus[i].irq.lapic().mode() == ApicMode::Disabled {
            // A global disable resets the LAPIC (SDM 11.4.3).
            self.vcpus[i].model.reset();
        }
        if accepted {
            let enabled = (data & 1 == 1).then_some(data & !1);
            match index {
                MSR_KVM_PV_EOI_EN => self.vcpus[i].pv_flag = enabled,
                MSR_LULL_PV_DEADLINE => self.vcpus[i].pv_slot = enabled,
                _ => {}
            }
        }
    }

    /// The guest's EOI through the register of its LAPIC's mode: it must retire exactly the
    /// highest of `isr_before`.
    fn eoi_register(&mut self, i: usize, mode: ApicMode, base: u64, isr_before: Option<[u32; 8]>) {
        self.vcpus[i].writes += 1;
        self.vcpus[i].model.eoi();
        if mode == ApicMode::X2Apic {
            self.wrmsr(i, regs::X2APIC_MSR_FIRST + (regs::EOI >> 4), 0);
        } else {
            let addr = base + u64::from(regs::EOI);
            self.run_exit(i, VcpuExit::MmioWrite(addr, &[0; 4]));
        }
        let isr = read_bitmap(&mut lapic_of(&self.vcpus[i]), regs::ISR0);
        if let (Some(mut want), Some(got)) = (isr_before, isr) {
            if let Some(top) = highest(&want) {
                want[usize::from(top >> 5)] &= !(1 << (top & 31));
            }
            assert_eq!(
                got, want,
                "vCPU {i}: EOI did not retire exactly the highest in-service vector"
            );
        }
    }

    /// A deadline the exit set (it changed) is at least `min_delay_ns` after the exit began.
    fn check_deadline_after_exit(&self, i: usize, before: &BeforeExit) {
        let now = before.now;
        let deadline = self.vcpus[i].irq.lapic().timer_deadline();
        if let Some(d) = deadline.filter(|_| deadline != before.deadline) {
            let floor = now.saturating_add(self.limits.min_delay_ns);
            assert!(
                d >= floor,
                "vCPU {i}: deadline {d} below now {now} + min delay"
            );
        }
    }
}
