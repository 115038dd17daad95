//! An IPI of the `lapic` target: sent through the ICR of the sender's mode, its targets
//! worked out by the SDM's rules (oracle.rs) and checked against lull's routing.

use std::sync::Arc;

use devices::lapic::{
    regs, ApicMode, DeliveryMode, DestinationMode, Ipi, Lapic, Shorthand, TriggerMode,
};
use kvm_ioctls::VcpuExit;
use vmm::irqchip::VcpuIrq;
use vmm::metrics::LapicNoise;

use super::check::read_reg;
use super::input::IpiSpec;
use super::machine::Machine;
use super::oracle;
use super::vcpu::lapic_of;

/// The low ICR word of `spec`: vector, delivery (fixed or NMI), destination mode, assert,
/// edge, shorthand.
fn icr_low(spec: IpiSpec) -> u32 {
    let delivery: u32 = if spec.nmi { 4 } else { 0 };
    u32::from(spec.vector)
        | (delivery << 8)
        | (u32::from(spec.logical) << 11)
        | (1 << 14)
        | (u32::from(spec.shorthand & 3) << 18)
}

/// The IPI a LAPIC in `mode` with ID `source` sends for `spec` to `destination`.
fn ipi_of(spec: IpiSpec, mode: ApicMode, destination: u32, source: u32) -> Ipi {
    Ipi {
        delivery_mode: if spec.nmi {
            DeliveryMode::Nmi
        } else {
            DeliveryMode::Fixed
        },
        vector: spec.vector,
        destination,
        destination_mode: if spec.logical {
            DestinationMode::Logical
        } else {
            DestinationMode::Physical
        },
        shorthand: match spec.shorthand & 3 {
            0 => Shorthand::None,
            1 => Shorthand::SelfOnly,
            2 => Shorthand::AllIncludingSelf,
            _ => Shorthand::AllExcludingSelf,
        },
        assert: true,
        trigger_mode: TriggerMode::Edge,
        x2apic_format: mode == ApicMode::X2Apic,
        source_apic_id: Some(source),
    }
}

impl Machine {
    /// A fixed (or NMI) edge IPI through the ICR of the sender's mode, with the delivery the
    /// target expects of it.
    pub(super) fn send_ipi(&mut self, i: usize, lapic: &mut Lapic<Arc<LapicNoise>>, spec: IpiSpec) {
        let mode = lapic.mode();
        let low = icr_low(spec);
        let destination = match mode {
            ApicMode::Disabled => {
                let v = &mut self.vcpus[i];
                v.irq.exit_done(&mut v.port);
                return;
            }
            ApicMode::XApic => read_reg(lapic, regs::ICR_HIGH).unwrap_or(0) >> 24,
            ApicMode::X2Apic => spec.destination,
        };
        let ipi = ipi_of(spec, mode, destination, lapic.apic_id());
        self.expect_ipi(i, &ipi, spec, destination, mode);
        self.vcpus[i].writes += 1;
        if mode == ApicMode::X2Apic {
            let value = (u64::from(destination) << 32) | u64::from(low);
            self.wrmsr(i, regs::X2APIC_MSR_FIRST + (regs::ICR_LOW >> 4), value);
        } else {
            let addr = lapic.base_address() + u64::from(regs::ICR_LOW);
            self.run_exit(i, VcpuExit::MmioWrite(addr, &low.to_le_bytes()));
        }
    }

    /// The targets of vCPU `i`'s `ipi` by the SDM's rules: lull's routing must name them
    /// (`oracle::check_route`), and each must get the IPI (a fixed vector from 16 to an
    /// enabled LAPIC, or an NMI) by its next entry, if the sender is software-enabled.
    fn expect_ipi(&mut self, i: usize, ipi: &Ipi, spec: IpiSpec, destination: u32, mode: ApicMode) {
        let IpiSpec {
            vector,
            logical,
            shorthand,
            nmi,
            ..
        } = spec;
        let msg = oracle::Message {
            shorthand,
            logical,
            destination,
            x2apic: mode == ApicMode::X2Apic,
        };
        let addressing: Vec<_> = self
            .vcpus
            .iter()
            .map(|v| oracle::addressing(&mut lapic_of(v)))
            .collect();
        let verdicts: Vec<_> = (0..self.vcpus.len())
            .map(|j| oracle::accepts(&msg, addressing[j].as_ref(), j == i))
            .collect();
        let infos: Vec<_> = self
            .vcpus
            .iter()
            .map(|v| v.irq.lapic().destination_info())
            .collect();
        oracle::check_route(ipi, &infos, &verdicts, &addressing);
        let sender_enabled = addressing[i].is_some_and(|a| a.software_enabled);
        for (t, verdict) in verdicts.iter().enumerate() {
            if *verdict != oracle::Verdict::Yes || !sender_enabled {
                continue;
            }
            if nmi {
                self.vcpus[t].expected_nmis += 1;
            } else if vector >= 16 && addressing[t].is_some_and(|a| a.software_enabled) {
                self.vcpus[t].expected.push(vector);
            }
        }
    }
}
