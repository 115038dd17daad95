//! A vCPU thread at the pause gate ([`crate::state::pause_gate`]): it parks outside `KVM_RUN`, and
//! when the VM resumes it moves its TSC back by the time the VM was paused, so that guest time
//! does not advance while paused.
//!
//! Why the TSC moves: lull's VM clock stops while the VM is paused (`irqchip::clock`), and
//! every guest TSC deadline was converted to that clock with a map fixed at boot
//! (`irqchip::user::guest_tsc`: guest TSC = TSC at VM time 0 + VM time x frequency). For the
//! map to stay true the guest TSC must lose what the clock lost: `paused_ns` at the TSC's
//! frequency. KVM's TSC offset (`KVM_VCPU_TSC_OFFSET`) moves by exactly that many ticks,
//! rounded down, so the guest TSC ends at most one tick ahead of the map (a deadline then
//! fires at most one tick late, never early). Every vCPU moves by the same amount, so their
//! TSCs stay in step.
//!
//! Where KVM cannot move the TSC ([`tsc_movable`]: PVM hosts, where the guest TSC is the
//! host's, or a KVM without the attribute), the VM is resumed with no shift at all
//! (`vm::pause_resume`): guest time then runs on through the pause, and timers that came due while
//! paused fire at the resume, each once and late, never early.

use std::sync::atomic::Ordering;

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

use super::kvm_port::KvmPort;
use super::state::VcpuKvmState;
use crate::host::sys;
use crate::irqchip::VcpuIrq;
use crate::state::{StopReason, VcpuShared};

/// IA32_TSC.
const MSR_IA32_TSC: u32 = 0x10;
/// IA32_TSC_DEADLINE.
const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;

/// The TSC ticks of `paused_ns` at `tsc_khz`, rounded down.
pub fn paused_ticks(paused_ns: u64, tsc_khz: u32) -> u64 {
    let ticks = u128::from(paused_ns) * u128::from(tsc_khz) / 1_000_000;
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// Parks the vCPU until the VM resumes (or stops), then moves its TSC back by the pause. A
/// snapshot taken meanwhile gets its KVM state and `irq`'s own (`--irqchip user`; `halted`:
/// the vCPU parked in its halt).
pub fn park(
    port: &mut KvmPort,
    irq: &mut dyn VcpuIrq,
    shared: &VcpuShared,
    halted: bool,
) -> Result<(), StopReason> {
    let id = port.id;
    let failed =
        |what: &str, e: std::io::Error| StopReason::VmmError(format!("{what} on vCPU {id}: {e}"));
    let deadline = take_kernel_deadline(&port.fd)
        .map_err(|e| failed("disarming KVM's TSC deadline for a pause", e))?;
    let parked_at = sys::clock::monotonic_ns();
    let fd = &port.fd;
    let mut save = || {
        let mut state = VcpuKvmState::capture(id, fd)?;
        // The deadline disarmed for the pause is the vCPU's, not the 0 KVM holds meanwhile.
        if let Some(d) = deadline {
            state.set_msr(MSR_IA32_TSC_DEADLINE, d);
        }
        state.user_irqchip = irq.save(halted);
        Ok(serde_json::to_vec(&state)?)
    };
    let paused_ns = shared.pause.park(id, &mut save);
    // Parked is blocked: not lull's exit handling.
    if let Some(c) = shared.counters(id) {
        let parked = sys::clock::monotonic_ns().saturating_sub(parked_at);
        c.blocked_ns.fetch_add(parked, Ordering::Relaxed);
    }
    if paused_ns > 0 {
        let khz = port
            .fd
            .get_tsc_khz()
            .map_err(|e| failed("KVM_GET_TSC_KHZ", io(e)))?;
        let ticks = paused_ticks(paused_ns, khz);
        shift_tsc(&port.fd, ticks).map_err(|e| failed("moving the TSC back after a pause", e))?;
    }
    if let Some(deadline) = deadline {
        set_msr(&port.fd, MSR_IA32_TSC_DEADLINE, deadline)
            .map_err(|e| failed("re-arming KVM's TSC deadline after a pause", e))?;
    }
    Ok(())
}

/// `--irqchip kernel`: KVM's LAPIC timer runs on host time, so a TSC deadline still ahead is
/// disarmed for the pause (its host timer would fire while paused, early in guest time) and
/// written back after the TSC moved, when KVM arms it again from the guest TSC. One already
/// reached is left alone: KVM delivers it once. Without an in-kernel LAPIC KVM reads the MSR
/// as 0 and this does nothing.
///
/// A deadline that falls between the read and the disarm would be re-armed though KVM may
/// hold it as fired already: the window is one ioctl (microseconds) per pause.
fn take_kernel_deadline(vcpu: &VcpuFd) -> std::io::Result<Option<u64>> {
    let [deadline, tsc] = get_msrs(vcpu, [MSR_IA32_TSC_DEADLINE, MSR_IA32_TSC])?;
    if deadline == 0 || deadline <= tsc {
        return Ok(None);
    }
    set_msr(vcpu, MSR_IA32_TSC_DEADLINE, 0)?;
    Ok(Some(deadline))
}

fn io(e: kvm_ioctls::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.errno())
}

/// The values of `indices` (KVM_GET_MSRS).
fn get_msrs<const N: usize>(vcpu: &VcpuFd, indices: [u32; N]) -> std::io::Result<[u64; N]> {
    let entries = indices.map(|index| kvm_msr_entry {
        index,
        ..Default::default()
    });
    let mut msrs =
        Msrs::from_entries(&entries).map_err(|_| io(kvm_ioctls::Error::new(libc::E2BIG)))?;
    let read = vcpu.get_msrs(&mut msrs).map_err(io)?;
    if read != N {
        return Err(io(kvm_ioctls::Error::new(libc::EIO)));
    }
    let mut out = [0; N];
    for (o, e) in out.iter_mut().zip(msrs.as_slice()) {
        *o = e.data;
    }
    Ok(out)
}

/// Writes one MSR (KVM_SET_MSRS, host-initiated).
fn set_msr(vcpu: &VcpuFd, index: u32, data: u64) -> std::io::Result<()> {
    let entry = kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    let msrs = Msrs::from_entries(&[entry]).map_err(|_| io(kvm_ioctls::Error::new(libc::E2BIG)))?;
    match vcpu.set_msrs(&msrs).map_err(io)? {
        1 => Ok(()),
        _ => Err(io(kvm_ioctls::Error::new(libc::EIO))),
    }
}

/// Moves `vcpu`'s TSC back by `ticks` (where [`tsc_movable`]).
fn shift_tsc(vcpu: &VcpuFd, ticks: u64) -> std::io::Result<()> {
    let offset = sys::kvm::tsc_offset(vcpu)?;
    sys::kvm::set_tsc_offset(vcpu, offset.wrapping_sub(ticks))
}

/// A move of the TSC [`tsc_movable`] tries: about 8 minutes at 2 GHz.
const PROBE_TICKS: u64 = 1 << 40;

/// Whether KVM can move `vcpu`'s TSC: it tells the offset and a change of it shows in the
/// guest TSC. Not so on PVM hosts, where the guest TSC is the host's (the offset reads 0 and
/// setting it changes nothing). Call before the vCPU first runs: the TSC is moved and put
/// back.
pub fn tsc_movable(vcpu: &VcpuFd) -> bool {
    let Ok(offset) = sys::kvm::tsc_offset(vcpu) else {
        return false;
    };
    let Ok([before]) = get_msrs(vcpu, [MSR_IA32_TSC]) else {
        return false;
    };
    if sys::kvm::set_tsc_offset(vcpu, offset.wrapping_sub(PROBE_TICKS)).is_err() {
        return false;
    }
    let after = get_msrs(vcpu, [MSR_IA32_TSC]);
    let restored = sys::kvm::set_tsc_offset(vcpu, offset).is_ok();
    // Moved back by the probe, less the ticks between the reads (wrapping: a new VM's TSC may
    // start near 0).
    restored
        && after.is_ok_and(|[a]| (PROBE_TICKS / 2..=PROBE_TICKS).contains(&before.wrapping_sub(a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_time_becomes_ticks_rounded_down() {
        // 2.1 GHz: 2.1 ticks per ns.
        assert_eq!(paused_ticks(1_000_000_000, 2_100_000), 2_100_000_000);
        assert_eq!(paused_ticks(1, 2_100_000), 2);
        assert_eq!(paused_ticks(0, 2_100_000), 0);
        assert_eq!(paused_ticks(u64::MAX, u32::MAX), u64::MAX);
    }
}
