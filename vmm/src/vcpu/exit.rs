//! What a vCPU does about one KVM exit the irqchip did not take: port I/O to the device bus,
//! MMIO to the MMIO bus (virtio devices, whose requests run here, on the notifying vCPU),
//! HLT, shutdown and system events, KVM's failures. A free function over the exit, testable
//! without a guest.

use std::sync::atomic::Ordering;

use devices::mmio::MmioBus;
use devices::pio::{MachineRequest, PioBus, PioOutcome};
use kvm_ioctls::VcpuExit;

use crate::metrics::{GuestNoise, VcpuCounters};
use crate::state::StopReason;

/// What the vCPU loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuAction {
    /// Re-enter the guest.
    Continue,
    /// The guest wrote its boot-complete marker; re-enter the guest.
    BootComplete,
    /// The vCPU executed HLT and KVM returned to user space.
    Halted,
    /// Stop the VM.
    Stop(StopReason),
}

/// The state an exit handler may touch.
pub struct ExitContext<'a> {
    /// vCPU index, for log lines.
    pub vcpu: u32,
    /// Port I/O devices.
    pub pio: &'a PioBus,
    /// MMIO devices.
    pub mmio: &'a MmioBus,
    /// This vCPU's counters.
    pub counters: &'a VcpuCounters,
    /// VM-wide counters of ignored guest accesses.
    pub noise: &'a GuestNoise,
}

/// The devices a vCPU's exits reach beyond the irqchip: built by the VM, shared by every vCPU
/// thread and handed only into the [`ExitContext`]; the VM also reads `noise` for its report.
pub struct DeviceBuses {
    /// Port I/O devices.
    pub pio: PioBus,
    /// MMIO devices outside the irqchip (virtio).
    pub mmio: MmioBus,
    /// VM-wide counters of ignored guest accesses.
    pub noise: GuestNoise,
}

impl DeviceBuses {
    /// The buses `pio` and `mmio`, with no ignored access counted yet.
    pub fn new(pio: PioBus, mmio: MmioBus) -> Self {
        Self {
            pio,
            mmio,
            noise: GuestNoise::default(),
        }
    }

    /// What an exit of vCPU `vcpu`, counted in `counters`, may touch.
    pub fn exit_context<'a>(&'a self, vcpu: u32, counters: &'a VcpuCounters) -> ExitContext<'a> {
        ExitContext {
            vcpu,
            pio: &self.pio,
            mmio: &self.mmio,
            counters,
            noise: &self.noise,
        }
    }
}

const KVM_SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const KVM_SYSTEM_EVENT_RESET: u32 = 2;

fn machine(request: Option<MachineRequest>) -> VcpuAction {
    match request {
        None => VcpuAction::Continue,
        Some(MachineRequest::Reset) => VcpuAction::Stop(StopReason::Reset),
        Some(MachineRequest::Exit(status)) => VcpuAction::Stop(StopReason::TestExit(status)),
        Some(MachineRequest::BootComplete) => VcpuAction::BootComplete,
    }
}

/// Handles one exit.
pub fn handle_exit(exit: VcpuExit<'_>, ctx: &ExitContext<'_>) -> VcpuAction {
    let c = ctx.counters;
    match exit {
        VcpuExit::IoIn(port, data) => {
            c.io_in.fetch_add(1, Ordering::Relaxed);
            if ctx.pio.read(port, data) == PioOutcome::Unclaimed {
                unknown_port(ctx, port, "read", data.len());
            }
            VcpuAction::Continue
        }
        VcpuExit::IoOut(port, data) => {
            c.io_out.fetch_add(1, Ordering::Relaxed);
            match ctx.pio.write(port, data) {
                PioOutcome::Handled(request) => machine(request),
                PioOutcome::Unclaimed => {
                    unknown_port(ctx, port, "write", data.len());
                    VcpuAction::Continue
                }
            }
        }
        VcpuExit::MmioRead(addr, data) => {
            c.mmio_read.fetch_add(1, Ordering::Relaxed);
            if !ctx.mmio.read(addr, data) {
                unknown_mmio(ctx, addr, "read", data.len());
            }
            VcpuAction::Continue
        }
        VcpuExit::MmioWrite(addr, data) => {
            c.mmio_write.fetch_add(1, Ordering::Relaxed);
            if !ctx.mmio.write(addr, data) {
                unknown_mmio(ctx, addr, "write", data.len());
            }
            VcpuAction::Continue
        }
        VcpuExit::Hlt => {
            c.hlt.fetch_add(1, Ordering::Relaxed);
            VcpuAction::Halted
        }
        VcpuExit::Shutdown => VcpuAction::Stop(StopReason::TripleFault),
        VcpuExit::SystemEvent(KVM_SYSTEM_EVENT_RESET, _) => VcpuAction::Stop(StopReason::Reset),
        VcpuExit::SystemEvent(KVM_SYSTEM_EVENT_SHUTDOWN, _) => {
            VcpuAction::Stop(StopReason::PowerOff)
        }
        VcpuExit::InternalError => VcpuAction::Stop(StopReason::GuestCrash(
            "KVM internal error (emulation failure)".into(),
        )),
        VcpuExit::FailEntry(reason, cpu) => VcpuAction::Stop(StopReason::GuestCrash(format!(
            "KVM could not enter the guest (hardware reason {reason:#x}, cpu {cpu})"
        ))),
        VcpuExit::IrqWindowOpen | VcpuExit::Intr | VcpuExit::SetTpr => {
            c.other.fetch_add(1, Ordering::Relaxed);
            VcpuAction::Continue
        }
        other => {
            c.other.fetch_add(1, Ordering::Relaxed);
            VcpuAction::Stop(StopReason::GuestCrash(format!(
                "unexpected KVM exit {other:?}"
            )))
        }
    }
}

fn unknown_port(ctx: &ExitContext<'_>, port: u16, dir: &str, len: usize) {
    if let Some(n) = ctx.noise.unknown_port.hit() {
        tracing::warn!(
            vcpu = ctx.vcpu,
            "guest {dir} of {len} byte(s) at unknown port {port:#x} ignored ({n} unknown port accesses so far)"
        );
    }
}

fn unknown_mmio(ctx: &ExitContext<'_>, addr: u64, dir: &str, len: usize) {
    if let Some(n) = ctx.noise.unknown_mmio.hit() {
        tracing::warn!(
            vcpu = ctx.vcpu,
            "guest {dir} of {len} byte(s) at unknown MMIO address {addr:#x} ignored ({n} unknown MMIO accesses so far)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::test_exit::TestExit;
    use std::sync::{Arc, Mutex};

    /// What an exit context borrows, owned by the test.
    struct Parts {
        buses: DeviceBuses,
        counters: VcpuCounters,
    }

    impl Parts {
        fn new() -> Self {
            let mut bus = PioBus::new();
            bus.insert(0xf4, 4, Arc::new(Mutex::new(TestExit))).unwrap();
            Self {
                buses: DeviceBuses::new(bus, MmioBus::new()),
                counters: VcpuCounters::default(),
            }
        }

        fn ctx(&self) -> ExitContext<'_> {
            self.buses.exit_context(0, &self.counters)
        }
    }

    #[test]
    fn test_exit_port_stops_with_status() {
        let parts = Parts::new();
        let ctx = parts.ctx();
        let action = handle_exit(VcpuExit::IoOut(0xf4, &[2]), &ctx);
        assert_eq!(action, VcpuAction::Stop(StopReason::TestExit(5)));
        assert_eq!(parts.counters.io_out.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn unknown_accesses_are_counted_and_read_as_ones() {
        let parts = Parts::new();
        let ctx = parts.ctx();
        let mut data = [0u8; 2];
        assert_eq!(
            handle_exit(VcpuExit::IoIn(0x1234, &mut data), &ctx),
            VcpuAction::Continue
        );
        assert_eq!(data, [0xff, 0xff]);
        let mut m = [0u8; 4];
        assert_eq!(
            handle_exit(VcpuExit::MmioRead(0xd000_0000, &mut m), &ctx),
            VcpuAction::Continue
        );
        assert_eq!(m, [0xff; 4]);
        assert_eq!(
            handle_exit(VcpuExit::MmioWrite(0xd000_0000, &[1]), &ctx),
            VcpuAction::Continue
        );
        assert_eq!(parts.buses.noise.unknown_port.count(), 1);
        assert_eq!(parts.buses.noise.unknown_mmio.count(), 2);
    }

    #[test]
    fn fatal_exits_stop_the_vm() {
        let parts = Parts::new();
        let ctx = parts.ctx();
        assert_eq!(
            handle_exit(VcpuExit::Shutdown, &ctx),
            VcpuAction::Stop(StopReason::TripleFault)
        );
        assert!(matches!(
            handle_exit(VcpuExit::InternalError, &ctx),
            VcpuAction::Stop(StopReason::GuestCrash(_))
        ));
        assert_eq!(
            handle_exit(VcpuExit::SystemEvent(2, &[]), &ctx),
            VcpuAction::Stop(StopReason::Reset)
        );
        assert_eq!(handle_exit(VcpuExit::Hlt, &ctx), VcpuAction::Halted);
    }
}
