//! Building a VM from a [`VmConfig`] and running it to its end, in named steps:
//!
//! ```text
//!  inputs::check (guest::resolve, paths, disks, nets) ─► kvm: open, memory, VM ─► boot::load ─► vcpus::create ─► vcpus::irqchip
//!    ─► devices: console, port bus, disks, nets ─► VcpuShared, DeviceBuses, RunStats ─► vcpu::spawn ×N ─► event_loop::run
//!    ─► report::build
//! ```
//!
//! Everything a step needs comes from the steps before it; nothing here decides anything about
//! interrupts or idling (that is the irqchip's and the idle core's).
//!
//! [`run_observed`] also hands a [`LiveVm`] to its caller once every thread runs: the
//! management API reads live counters through it, pauses and resumes the VM
//! ([`pause_resume`]) and asks it to stop.

pub mod devices;
pub mod disks;
mod error;
pub mod event_loop;
pub mod guest;
mod input_error;
pub mod inputs;
pub mod kvm;
mod live;
pub mod nets;
pub mod paths;
pub mod pause_resume;
mod pause_state;
pub mod report;
mod restore;
mod run_stats;
pub mod snapshot;
pub mod test_devices;
pub mod vcpus;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ::devices::virtio::mmio::SharedTransport;
use kvm_ioctls::{Kvm, VmFd};
use timer::lock;
use vm_memory::GuestMemoryMmap;

use crate::config::{IrqchipMode, MemoryRestore, MemoryRestoreMode, VmConfig};
use crate::host::console::SinkFailureHook;
use crate::irqchip::IrqChip;
use crate::metrics::RunReport;
use crate::setup::boot::{self, BootSpec};
use crate::snapshot::{Snapshot, SnapshotError};
use crate::state::device_timers::DeviceTimers;
use crate::state::{StopReason, VcpuShared};
use crate::vcpu::{self, DeviceBuses};
pub use error::VmError;
use guest::GuestImage;
pub use live::LiveVm;
pub use run_stats::RunStats;

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// Why.
    pub reason: StopReason,
    /// The report written to `--metrics`.
    pub report: RunReport,
}

/// KVM, the VM and its memory, with the guest loaded.
struct LoadedVm {
    kvm: Kvm,
    vm: Arc<VmFd>,
    mem: Arc<GuestMemoryMmap>,
    /// Where the boot CPU starts; `None` for a restored VM (its registers are the snapshot's).
    entry: Option<boot::cpu_state::EntryMode>,
}

/// Opens KVM, creates the VM and its memory, loads the guest (or the snapshot's memory).
fn load(
    cfg: &VmConfig,
    image: &GuestImage,
    snapshot: Option<(&Snapshot, MemoryRestore)>,
) -> Result<LoadedVm, VmError> {
    let kvm = kvm::open_kvm(cfg.cpus)?;
    let mem = match snapshot {
        Some((s, how)) => restored_memory(cfg, s, how)?,
        None => kvm::create_guest_memory(cfg.memory.0)?,
    };
    let mem: Arc<GuestMemoryMmap> = Arc::new(mem);
    let chip = match cfg.irqchip {
        IrqchipMode::User => kvm::VmChip::User {
            pv_eoi: cfg.pv_eoi.is_on(),
        },
        IrqchipMode::Kernel => kvm::VmChip::InKernel,
    };
    let vm = Arc::new(kvm::create_vm(&kvm, &mem, chip)?);
    let spec = BootSpec {
        kernel: &image.kernel,
        initramfs: image.initramfs.as_deref(),
        cmdline: &image.cmdline,
        cpus: cfg.cpus,
        memory: cfg.memory.0,
    };
    // A restored VM's memory is the snapshot's alone (the guest is not loaded) and its
    // vCPUs' registers are the snapshot's.
    let entry = match snapshot {
        Some(_) => None,
        None => Some(boot::load(&mem, &spec)?),
    };
    match &entry {
        Some(entry) => tracing::debug!(?image, ?entry, "guest loaded"),
        None => tracing::debug!(?image, "guest memory restored from the snapshot"),
    }
    Ok(LoadedVm {
        kvm,
        vm,
        mem,
        entry,
    })
}

/// The guest memory of a VM restored from `snapshot`: its memory file mapped copy-on-write,
/// or a new VM's memory with the file's data copied in (the holes stay the new memory's
/// zeros). Either way the regions are the ones `cfg`'s memory size lays out.
fn restored_memory(
    cfg: &VmConfig,
    snapshot: &Snapshot,
    how: MemoryRestore,
) -> Result<GuestMemoryMmap, VmError> {
    let regions = &snapshot.manifest.regions;
    let laid_out = crate::setup::layout::ram_ranges(cfg.memory.0);
    let matches = regions.len() == laid_out.len()
        && regions
            .iter()
            .zip(&laid_out)
            .all(|(r, &(start, len))| r.guest_addr == start && r.bytes == len);
    if !matches {
        return Err(SnapshotError::MemoryRegions(cfg.memory.0).into());
    }
    Ok(match how.mode {
        MemoryRestoreMode::Map => {
            crate::snapshot::mapped::map(&snapshot.memory, regions, how.prefault)?
        }
        MemoryRestoreMode::Copy => {
            let mem = kvm::create_guest_memory(cfg.memory.0)?;
            crate::snapshot::memory::read_into(&mem, &snapshot.memory, regions)?;
            mem
        }
    })
}

/// Fails early if `--metrics PATH` cannot be written, rather than after a long run.
fn check_metrics_path(cfg: &VmConfig) -> Result<(), VmError> {
    let Some(path) = cfg.metrics.as_ref().filter(|p| p.as_os_str() != "-") else {
        return Ok(());
    };
    crate::host::files::open_output(path, crate::host::files::OutputMode::Append)
        .map(drop)
        .map_err(|source| VmError::MetricsFile {
            path: path.clone(),
            source,
        })
}

/// Builds the VM described by `cfg` and runs it to the end.
/// `other`: lull's own input and output paths (`--config`, the API socket), kept apart from
/// the configuration's inputs like its outputs (see [`inputs::check`]).
pub fn run(
    cfg: &VmConfig,
    other: inputs::OtherPaths<'_>,
    started: Instant,
) -> Result<RunOutcome, VmError> {
    run_observed(cfg, other, started, |_| {})
}

/// [`run`], handing `on_running` the running VM once its vCPUs and event loop are set up.
pub fn run_observed(
    cfg: &VmConfig,
    other: inputs::OtherPaths<'_>,
    started: Instant,
    on_running: impl FnOnce(LiveVm),
) -> Result<RunOutcome, VmError> {
    run_from(cfg, other, started, on_running, None)
}

/// Builds the VM of `snapshot` (either irqchip mode, see [`restore`]), its memory restored as
/// `memory` says, hands it to `on_running` paused, and runs it to the end once resumed.
pub fn restore_observed(
    snapshot: &Snapshot,
    memory: MemoryRestore,
    started: Instant,
    on_running: impl FnOnce(LiveVm),
) -> Result<RunOutcome, VmError> {
    let cfg = &snapshot.manifest.config;
    restore::check(snapshot)?;
    let files = snapshot.files();
    let other = inputs::OtherPaths {
        snapshot: &files,
        ..Default::default()
    };
    run_from(cfg, other, started, on_running, Some((snapshot, memory)))
}

/// [`run_observed`], booting the guest, or restoring `snapshot` (its VM starts paused).
fn run_from(
    cfg: &VmConfig,
    other: inputs::OtherPaths<'_>,
    started: Instant,
    on_running: impl FnOnce(LiveVm),
    restoring: Option<(&Snapshot, MemoryRestore)>,
) -> Result<RunOutcome, VmError> {
    let snapshot = restoring.map(|(s, _)| s);
    let inputs::Inputs {
        image,
        disks: open_disks,
        nets: open_nets,
    } = inputs::check(cfg, other)?;
    check_metrics_path(cfg)?;
    let (sink, pty) = devices::console_sink(&cfg.serial)?;
    let sink_failure = sink.failure_hook();
    let loaded = load(cfg, &image, restoring)?;
    let mut vcpus = vcpus::create(&loaded.kvm, &loaded.vm, cfg, loaded.entry)?;
    let tsc_movable = vcpus.tsc_movable;
    if let Some(s) = snapshot {
        restore::apply(s, &loaded.vm, &mut vcpus.ports)?;
    }
    let chip = vcpus::irqchip(cfg, &loaded.vm, &loaded.mem, &vcpus)?;
    let console = devices::console(chip.as_ref(), sink, snapshot.map(|s| &s.devices.serial))?;
    let serial_counters = lock(&console.console).counters();
    // The restore-count port: one more than the snapshot's VM had (0 for a boot).
    let restores = snapshot.map_or(0, |s| s.devices.restores.saturating_add(1));
    let pio = devices::pio_bus(cfg, console.console.clone(), chip.as_ref(), restores)?;
    let (device_timers, mut disks, nets) =
        attach_timed_devices(cfg, open_disks, open_nets, &loaded.mem, chip.as_ref())?;
    let kvm_stats = kvm_stats_fds(&vcpus.ports);
    let shared = vcpu_shared(cfg, started, device_timers)?;
    // Every virtio device in window order: the disks, then the nets.
    let virtio: Arc<[SharedTransport]> =
        disks.transports.drain(..).chain(nets.transports).collect();
    if let Some(s) = snapshot {
        s.devices.restore_virtio(&virtio)?;
    }
    let buses = Arc::new(DeviceBuses::new(pio, disks.bus));
    let stats = Arc::new(RunStats {
        kvm_stats,
        nets: nets.ports,
        disk_shrink_errors: std::mem::take(&mut disks.shrink_errors),
    });
    if let Some(hook) = sink_failure {
        stop_on_output_failure(&hook, &shared);
    }
    let events = event_loop::EventLoop::new(
        cfg,
        shared.clone(),
        stats.nets.clone(),
        &console,
        pty.as_ref().map(crate::host::pty::Pty::main),
    )?;
    crate::host::seccomp::prepare(cfg.seccomp)?;
    let restored_at = crate::host::sys::clock::monotonic_ns();
    if let Some(s) = snapshot {
        // A restored VM starts paused: its vCPUs park before their first entry.
        shared.pause.request();
        restore::freeze(chip.as_ref(), restored_at);
        restore::apply_user_ioapic(s, chip.as_ref())?;
    }
    let live = LiveVm {
        shared,
        buses,
        stats,
        chip,
        serial: serial_counters,
        vm: loaded.vm.clone(),
        pause: match snapshot {
            None => pause_state::not_paused(tsc_movable),
            Some(s) => pause_state::paused_since(tsc_movable, restored_at, s.kvm_vm.clock),
        },
        mem: loaded.mem.clone(),
        console: console.console.clone(),
        virtio,
        restores,
        serial_pty: pty.as_ref().map(|p| p.path().to_path_buf()),
    };
    let to_start = ToStart {
        vcpus,
        snapshot,
        events,
        disk_files: &disks.files,
        console: &console,
    };
    start_and_run(live, to_start, on_running)
}

/// What [`start_and_run`] starts and runs besides the built VM: its vCPUs (restored from
/// `snapshot` when there is one), the VMM thread's event loop, and what the end reports.
struct ToStart<'a> {
    vcpus: vcpus::CreatedVcpus,
    snapshot: Option<&'a Snapshot>,
    events: event_loop::EventLoop,
    disk_files: &'a [Arc<std::fs::File>],
    console: &'a devices::ConsoleParts,
}

/// Starts the vCPU threads and the irqchip of the built VM `live`, hands it to `on_running`,
/// runs the VMM thread's event loop to the VM's end and reports.
fn start_and_run(
    live: LiveVm,
    to_start: ToStart<'_>,
    on_running: impl FnOnce(LiveVm),
) -> Result<RunOutcome, VmError> {
    let (shared, chip) = (&live.shared, live.chip.as_ref());
    let started_all = start_vcpus(to_start.vcpus, chip, shared, &live.buses, to_start.snapshot)
        .and_then(|()| chip.start(shared).map_err(VmError::from));
    if let Err(e) = started_all {
        stop_started(shared, chip, &e);
        return Err(e);
    }
    on_running(live.clone());
    let reason = to_start.events.run().inspect_err(|e| {
        stop_started(shared, chip, e);
        disks::sync(to_start.disk_files);
    })?;
    let report = finish(&reason, &live, to_start.disk_files, to_start.console);
    Ok(RunOutcome { reason, report })
}

/// What the vCPU threads share with the VM's other threads, with the device timers in it.
fn vcpu_shared(
    cfg: &VmConfig,
    started: Instant,
    device_timers: Arc<DeviceTimers>,
) -> Result<Arc<VcpuShared>, VmError> {
    let mut shared = VcpuShared::new(cfg.cpus, started).map_err(|source| VmError::Host {
        what: "the stop eventfd",
        source,
    })?;
    shared.device_timers = device_timers;
    Ok(Arc::new(shared))
}

/// KVM's binary statistics of each vCPU that has them (the report's `kvm`).
fn kvm_stats_fds(ports: &[vcpu::KvmPort]) -> Vec<std::fs::File> {
    ports
        .iter()
        .filter_map(|p| crate::host::sys::kvm::stats_fd(&p.fd))
        .collect()
}

/// The device timers and the devices they refill (disks, then nets, on one MMIO bus), wired
/// to `chip`'s interrupt lines.
fn attach_timed_devices(
    cfg: &VmConfig,
    open_disks: disks::OpenDisks,
    open_nets: nets::OpenNets,
    mem: &Arc<GuestMemoryMmap>,
    chip: &dyn IrqChip,
) -> Result<(Arc<DeviceTimers>, disks::Disks, nets::Nets), VmError> {
    let device_timers = Arc::new(
        DeviceTimers::new(cfg.device_timer_mode(), cfg.disks.len() + cfg.nets.len()).map_err(
            |source| VmError::Host {
                what: "a device's refill timerfd",
                source,
            },
        )?,
    );
    let lines = chip.irq_lines();
    let mut disks = disks::attach(open_disks, mem, &lines, &device_timers)?;
    let mut nets = nets::attach(
        open_nets,
        cfg.disks.len(),
        &mut disks.bus,
        mem,
        &lines,
        &device_timers,
    )?;
    let mut timed = std::mem::take(&mut disks.devices);
    timed.extend(std::mem::take(&mut nets.devices));
    device_timers.set_devices(timed);
    Ok((device_timers, disks, nets))
}

/// Stops the VM when the console's output fails (`--serial file=` on a full disk).
fn stop_on_output_failure(hook: &OnceLock<SinkFailureHook>, shared: &Arc<VcpuShared>) {
    let vm = Arc::downgrade(shared);
    let _ = hook.set(Box::new(move |why| {
        if let Some(vm) = vm.upgrade() {
            vm.stop.request(StopReason::OutputFailed(why));
        }
    }));
}

/// After the event loop ended for `reason`: the host's view read while every thread still
/// exists, the vCPUs kicked out, the disk images synced, the console flushed; the report.
fn finish(
    reason: &StopReason,
    live: &LiveVm,
    disk_files: &[Arc<std::fs::File>],
    console: &devices::ConsoleParts,
) -> RunReport {
    let host = report::host_facts(live);
    live.shared.pause.stop();
    live.chip.kick_all();
    disks::sync(disk_files);
    let shrunk = disks::shrink_error_total(&live.stats.disk_shrink_errors);
    if shrunk > 0 {
        tracing::warn!(
            "{shrunk} disk request(s) failed because a disk image shrank under the VM (the guest \
             saw I/O errors)"
        );
    }
    let _ = lock(&console.console).flush();
    report::build(reason, live, host)
}

/// Ends the threads a failed start left running (they matter when lull lives on: the API).
fn stop_started(shared: &VcpuShared, chip: &dyn IrqChip, why: &VmError) {
    shared
        .stop
        .request(StopReason::VmmError(format!("start failed: {why}")));
    shared.pause.stop();
    chip.kick_all();
}

/// Starts one thread per vCPU with its part of the irqchip; its exits reach `buses`.
fn start_vcpus(
    vcpus: vcpus::CreatedVcpus,
    chip: &dyn IrqChip,
    shared: &Arc<VcpuShared>,
    buses: &Arc<DeviceBuses>,
    snapshot: Option<&Snapshot>,
) -> Result<(), VmError> {
    for port in vcpus.ports {
        let mut irq = chip.vcpu(port.id, shared)?;
        if let Some(s) = snapshot {
            restore::apply_user_vcpu(s, port.id, irq.as_mut())?;
        }
        vcpu::spawn(port, irq, shared.clone(), buses.clone())?;
    }
    Ok(())
}
