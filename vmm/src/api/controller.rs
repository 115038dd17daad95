//! The VM's life as the API sees it, one state at a time:
//!
//! ```text
//!  NotCreated ──vm.create──► Created ──vm.boot──► Running ──vm.shutdown, vmm.shutdown, ──► Shutdown
//!                             ▲  ▲  │              vm.pause │ ▲ vm.resume   a signal, or the
//!                             │  │  │                       ▼ │             guest's own stop
//!                             │  │  │                     Paused ── (stops as Running does)
//!                             │  └──┘ boot failed: stays Created (500 with the reason)
//!                             └─ vm.create again, once a boot has failed
//! ```
//! `vm.delete` takes any created VM back to `NotCreated` (stopping it if it runs);
//! `vm.reboot` takes a running VM through `Shutdown` and `Created` back to `Running`.
//! `vm.create` checks the configuration as `lull run` does (`vm::inputs::check`: kernel,
//! initramfs, disks, taps, output paths) and answers 400 with the reason, so a VM that cannot
//! be built is never created. Each request either moves the state or is refused with the state
//! error Cloud Hypervisor gives (`vm.boot` before `vm.create`: 404; `vm.shutdown` of a VM not
//! booted: 405; creating or booting twice: 500), except that a VM whose boot failed may be
//! created again (with a corrected configuration). A stopped VM stays `Shutdown` with its final report: lull runs one
//! VM per process.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

use super::error::ApiError;
use super::events::EventMonitor;
use super::http::Response;
use super::restore_taps;
use super::routes::ApiRequest;
use super::runner::{self, RunningVm};
use crate::config::ch::json::AddNet;
use crate::config::ch::restore::ChRestore;
use crate::config::ch::{options, ChError};
use crate::config::{NetConfig, VmConfig};
use crate::exit_code;
use crate::host::sys::scm::SentFds;
use crate::host::sys::tap::Tap;
use crate::metrics::RunReport;
use crate::snapshot::ReadError;
use crate::state::StopReason;
use crate::vm::report;

/// What the server does after answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Serve the next request.
    Serve,
    /// End lull with this exit status.
    Exit(i32),
}

/// How the VM's run ended.
enum Ended {
    /// With a report.
    Stopped {
        reason: StopReason,
        report: Box<RunReport>,
    },
    /// In a failure of lull's, with no report: the error, said and answered.
    Failed {
        description: String,
        response: Response,
    },
}

/// Where the VM is in its life.
enum VmState {
    NotCreated,
    /// `boot_failed`: a `vm.boot` failed, so `vm.create` may replace the configuration.
    Created {
        cfg: Box<VmConfig>,
        boot_failed: bool,
    },
    Running {
        cfg: Box<VmConfig>,
        vm: RunningVm,
    },
    Shutdown {
        cfg: Box<VmConfig>,
        ended: Ended,
    },
}

/// `vmm.ping`'s answer (Cloud Hypervisor's `VmmPingResponse`).
#[derive(Serialize)]
struct Ping {
    version: &'static str,
    build_version: &'static str,
    pid: u32,
    features: [&'static str; 0],
}

/// `vm.info`'s answer (Cloud Hypervisor's `VmInfo`, plus why a stopped VM stopped): the
/// configuration in the shape it was given in.
#[derive(Serialize)]
struct Info {
    config: serde_json::Value,
    state: &'static str,
    memory_actual_size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<String>,
}

/// The VM behind the API and what the API does with it.
pub struct Controller {
    state: VmState,
    /// The `vm.create` body of the VM, if it was Cloud Hypervisor's `VmConfig`.
    ch_config: Option<Box<serde_json::Value>>,
    /// Tap fds received with `vm.add-net` or `vm.restore`, open for as long as the VM's
    /// configuration names them (`NetConfig::fd`).
    net_fds: Vec<OwnedFd>,
    /// A run ended and no other has started since: the server must take the SIGINT/SIGTERM
    /// handlers back (see [`Controller::take_run_ended`]).
    run_ended: bool,
    /// Written by the VM thread when its run ends.
    ended: EventFd,
    /// Cloud Hypervisor's event records (`--event-monitor`).
    events: EventMonitor,
    /// A `vm.reboot` is stopping the VM: its stop is no `shutdown` event.
    rebooting: bool,
    /// `lull ch --lull KEY=VALUE,...`: lull's own knobs, applied to every VM `vm.create` makes
    /// from Cloud Hypervisor's `VmConfig` (whose fields cannot say them), as they are to the
    /// VM the command line describes.
    ch_knobs: Vec<String>,
}

impl Controller {
    /// A controller with no VM, or with `initial` created (flags given on the command line).
    pub fn new(initial: Option<VmConfig>, ended: EventFd) -> Self {
        Self {
            state: initial.map_or(VmState::NotCreated, |cfg| VmState::Created {
                cfg: Box::new(cfg),
                boot_failed: false,
            }),
            ch_config: None,
            run_ended: false,
            net_fds: Vec::new(),
            ended,
            events: EventMonitor::none(),
            rebooting: false,
            ch_knobs: Vec::new(),
        }
    }

    /// The controller, writing its events to `events` (`--event-monitor`).
    pub fn with_events(self, events: EventMonitor) -> Self {
        Self { events, ..self }
    }

    /// The controller, applying `lull ch`'s `--lull` values `knobs` to every VM created from
    /// Cloud Hypervisor's `VmConfig`.
    pub fn with_ch_knobs(self, ch_knobs: Vec<String>) -> Self {
        Self { ch_knobs, ..self }
    }

    /// lull ends: the `vmm` `shutdown` event.
    pub fn exiting(&mut self) {
        self.events.vmm("shutdown");
    }

    /// The eventfd the VM thread writes when its run ends.
    pub fn ended_event(&self) -> &EventFd {
        &self.ended
    }

    /// Answers one request.
    pub fn handle(&mut self, request: ApiRequest) -> (Response, Next) {
        self.handle_with_fds(request, SentFds::default())
    }

    /// Answers one request that came with `fds` (SCM_RIGHTS): `vm.add-net` and `vm.restore`
    /// take them, any other request (or one refused) closes them.
    pub fn handle_with_fds(&mut self, request: ApiRequest, fds: SentFds) -> (Response, Next) {
        // A run that ended by itself is taken note of first; if a signal ended it, lull ends
        // after this answer.
        let then = self.poll_vm().map_or(Next::Serve, Next::Exit);
        let answer = match request {
            ApiRequest::VmmPing => Response::json(&Ping {
                version: env!("CARGO_PKG_VERSION"),
                build_version: env!("CARGO_PKG_VERSION"),
                pid: std::process::id(),
                features: [],
            }),
            ApiRequest::VmCreate(cfg) => self.create(cfg, None),
            ApiRequest::VmCreateCh(cfg, given) => self
                .with_knobs(cfg)
                .and_then(|cfg| self.create(cfg, Some(given))),
            ApiRequest::VmBoot => self.boot(),
            ApiRequest::VmInfo => self.info(),
            ApiRequest::VmCounters => self.counters(),
            ApiRequest::VmShutdown => self.shutdown(),
            ApiRequest::VmDelete => self.delete(),
            ApiRequest::VmReboot => self.reboot(),
            ApiRequest::VmPowerButton => Err(ApiError::NoPowerButton),
            ApiRequest::VmAddNet(net) => self.add_net(*net, fds),
            ApiRequest::VmPause => self.pause_or_resume("pause"),
            ApiRequest::VmResume => self.pause_or_resume("resume"),
            ApiRequest::VmSnapshot(dir) => self.snapshot(&dir),
            ApiRequest::VmRestore(restore) => self.restore(&restore, fds),
            ApiRequest::VmmShutdown => {
                return match self.stop(StopReason::Api) {
                    Ok(code) => (Response::no_content(), Next::Exit(code)),
                    Err(e) => (Response::error(&e), Next::Serve),
                }
            }
        };
        (answer.unwrap_or_else(|e| Response::error(&e)), then)
    }

    fn create(
        &mut self,
        cfg: Box<VmConfig>,
        ch_config: Option<Box<serde_json::Value>>,
    ) -> Result<Response, ApiError> {
        match self.state {
            VmState::NotCreated
            | VmState::Created {
                boot_failed: true, ..
            } => {
                crate::vm::inputs::check(&cfg, crate::vm::inputs::OtherPaths::default())
                    .map_err(ApiError::ConfigInputs)?;
                self.state = VmState::Created {
                    cfg,
                    boot_failed: false,
                };
                self.ch_config = ch_config;
                self.net_fds.clear();
                Ok(Response::no_content())
            }
            _ => Err(ApiError::VmAlreadyCreated),
        }
    }

    /// `cfg` (made from Cloud Hypervisor's `VmConfig`) with `lull ch`'s `--lull` knobs, checked.
    fn with_knobs(&self, mut cfg: Box<VmConfig>) -> Result<Box<VmConfig>, ApiError> {
        for knobs in &self.ch_knobs {
            crate::config::ch::cli::apply_lull_knobs(&mut cfg, knobs)
                .map_err(ApiError::ChConfig)?;
        }
        cfg.validate().map_err(ApiError::ConfigInvalid)?;
        Ok(cfg)
    }

    /// Boots the VM the command line created, before the API serves (a failure ends lull).
    pub fn boot_at_start(&mut self) -> Result<(), ApiError> {
        self.boot().map(|_| ())
    }

    /// Restores `restore`'s snapshot before the server serves (Cloud Hypervisor's
    /// `--restore`), as `vm.restore` does.
    pub fn restore_at_start(&mut self, restore: &ChRestore) -> Result<(), ApiError> {
        self.restore(restore, SentFds::default()).map(|_| ())
    }

    fn boot(&mut self) -> Result<Response, ApiError> {
        let cfg = match &self.state {
            VmState::NotCreated => return Err(ApiError::VmNotCreated),
            VmState::Running { .. } => return Err(ApiError::VmAlreadyBooted),
            VmState::Shutdown { .. } => return Err(ApiError::VmAlreadyRan),
            VmState::Created { cfg, .. } => cfg.clone(),
        };
        self.events.vm("booting");
        let vm = runner::start(&cfg, &self.ended).inspect_err(|_| {
            if let VmState::Created { boot_failed, .. } = &mut self.state {
                *boot_failed = true;
            }
        })?;
        tracing::info!("VM booted through the API");
        // The new run's event loop has the signal handlers now.
        self.run_ended = false;
        self.state = VmState::Running { cfg, vm };
        self.events.vm("booted");
        Ok(Response::no_content())
    }

    fn info(&self) -> Result<Response, ApiError> {
        let (config, state, stop_reason) = match &self.state {
            VmState::NotCreated => return Err(ApiError::VmNotCreated),
            VmState::Created { cfg, .. } => (cfg, "Created", None),
            VmState::Running { cfg, vm } if vm.live().is_paused() => (cfg, "Paused", None),
            VmState::Running { cfg, .. } => (cfg, "Running", None),
            VmState::Shutdown { cfg, ended } => (cfg, "Shutdown", Some(ended.describe())),
        };
        let mut shown = match &self.ch_config {
            Some(given) => (**given).clone(),
            None => serde_json::to_value(config).map_err(ApiError::Encode)?,
        };
        if let VmState::Running { vm, .. } = &self.state {
            if let Some(pty) = vm.live().serial_pty() {
                show_pty(&mut shown, pty);
            }
        }
        Response::json(&Info {
            config: shown,
            state,
            memory_actual_size: config.memory.0,
            stop_reason,
        })
    }

    fn counters(&self) -> Result<Response, ApiError> {
        match &self.state {
            VmState::NotCreated => Err(ApiError::VmNotCreated),
            VmState::Created { .. } => Err(ApiError::VmNotBooted),
            VmState::Running { vm, .. } => Response::json(&report::live(vm.live())),
            VmState::Shutdown {
                ended: Ended::Stopped { report, .. },
                ..
            } => Response::json(report),
            VmState::Shutdown {
                ended: Ended::Failed { response, .. },
                ..
            } => Ok(response.clone()),
        }
    }

    fn shutdown(&mut self) -> Result<Response, ApiError> {
        match &self.state {
            VmState::NotCreated => Err(ApiError::VmNotCreated),
            VmState::Created { .. } => Err(ApiError::VmNotBooted),
            VmState::Shutdown { .. } => Err(ApiError::VmNotRunning),
            VmState::Running { .. } => {
                self.stop(StopReason::Api)?;
                Ok(Response::no_content())
            }
        }
    }

    /// `vm.add-net` before boot: a virtio-net device on the named tap, or on the tap fd sent
    /// with the request (checked to be a tap; kept open for the VM's life).
    fn add_net(&mut self, net: AddNet, fds: SentFds) -> Result<Response, ApiError> {
        let VmState::Created { cfg, boot_failed } = &self.state else {
            return Err(match self.state {
                VmState::NotCreated => ApiError::VmNotCreated,
                _ => ApiError::AddNetAfterBoot,
            });
        };
        if fds.count > 1 || fds.truncated {
            return Err(ApiError::AddNetFds(fds.said()));
        }
        let first = fds.fds.into_iter().next();
        let device = match (&first, &net.tap) {
            (None, _) if net.body_fds => return Err(ApiError::AddNetBodyFds),
            (None, None) => return Err(ApiError::AddNetNoTap),
            (None, Some(tap)) => {
                let device: NetConfig = format!("tap={tap}")
                    .parse()
                    .map_err(|e| ApiError::ChNet(ChError::Net(e)))?;
                NetConfig {
                    mac: net.mac,
                    ..device
                }
            }
            (Some(fd), _) => {
                let tap = Tap::from_sent(fd.as_fd()).map_err(ApiError::AddNetFd)?;
                options::fd_net(fd.as_raw_fd(), tap.name(), net.mac).map_err(ApiError::ChNet)?
            }
        };
        let mut with = (**cfg).clone();
        let boot_failed = *boot_failed;
        with.nets.push(device.clone());
        with.validate().map_err(ApiError::ConfigInvalid)?;
        crate::vm::inputs::check(&with, crate::vm::inputs::OtherPaths::default())
            .map_err(ApiError::ConfigInputs)?;
        if let Some(serde_json::Value::Object(given)) = self.ch_config.as_deref_mut() {
            let shown = serde_json::json!({"tap": device.tap, "mac": device.mac().to_string()});
            match given
                .get_mut("net")
                .and_then(serde_json::Value::as_array_mut)
            {
                Some(nets) => nets.push(shown),
                None => {
                    given.insert("net".into(), serde_json::Value::Array(vec![shown]));
                }
            }
        }
        self.net_fds.extend(first);
        self.state = VmState::Created {
            cfg: Box::new(with),
            boot_failed,
        };
        tracing::info!("vm.add-net: {device}");
        Ok(Response::no_content())
    }

    /// `vm.delete`: stops the VM if it runs, then forgets it.
    fn delete(&mut self) -> Result<Response, ApiError> {
        if matches!(self.state, VmState::NotCreated) {
            return Err(ApiError::VmNotCreated);
        }
        self.stop(StopReason::Api)?;
        self.state = VmState::NotCreated;
        self.ch_config = None;
        self.net_fds.clear();
        self.events.vm("deleted");
        tracing::info!("VM deleted through the API");
        Ok(Response::no_content())
    }

    /// `vm.reboot`: stops the running VM and boots it again from its kernel, with the same
    /// configuration (a new run: its counters start again).
    fn reboot(&mut self) -> Result<Response, ApiError> {
        match &self.state {
            VmState::NotCreated => return Err(ApiError::VmNotCreated),
            VmState::Created { .. } => return Err(ApiError::VmNotBooted),
            VmState::Shutdown { .. } => return Err(ApiError::VmNotRunning),
            VmState::Running { .. } => {}
        }
        self.events.vm("rebooting");
        self.rebooting = true;
        let stopped = self.stop(StopReason::Api);
        self.rebooting = false;
        stopped?;
        let VmState::Shutdown { cfg, .. } = &self.state else {
            return Err(ApiError::RunnerLost);
        };
        let cfg = cfg.clone();
        self.state = VmState::Created {
            cfg,
            boot_failed: false,
        };
        self.boot()?;
        self.events.vm("rebooted");
        tracing::info!("VM rebooted through the API");
        Ok(Response::no_content())
    }

    /// `vm.pause` or `vm.resume` (`action`) of the running VM.
    fn pause_or_resume(&mut self, action: &'static str) -> Result<Response, ApiError> {
        let vm = match &self.state {
            VmState::NotCreated => return Err(ApiError::VmNotCreated),
            VmState::Created { .. } => return Err(ApiError::VmNotBooted),
            VmState::Shutdown { .. } => return Err(ApiError::VmNotRunning),
            VmState::Running { vm, .. } => vm.live(),
        };
        let (doing, done_event) = match action {
            "pause" => ("pausing", "paused"),
            _ => ("resuming", "resumed"),
        };
        // A request the state refuses (pausing a paused VM, resuming a running one) is no step.
        if vm.is_paused() == (action != "pause") {
            self.events.vm(doing);
        }
        let done = match action {
            "pause" => vm.pause(),
            _ => vm.resume().map(drop),
        };
        done.map_err(|source| ApiError::Pause { action, source })?;
        self.events.vm(done_event);
        Ok(Response::no_content())
    }

    /// `vm.snapshot` of the paused VM into `dir`.
    fn snapshot(&mut self, dir: &std::path::Path) -> Result<Response, ApiError> {
        match &self.state {
            VmState::NotCreated => Err(ApiError::VmNotCreated),
            VmState::Created { .. } => Err(ApiError::VmNotBooted),
            VmState::Shutdown { .. } => Err(ApiError::VmNotRunning),
            VmState::Running { vm, cfg } => {
                self.events.vm("snapshotting");
                vm.live()
                    .snapshot(cfg, self.ch_config.as_deref(), dir)
                    .map_err(ApiError::Snapshot)?;
                self.events.vm("snapshotted");
                Ok(Response::no_content())
            }
        }
    }

    /// `vm.restore` of the snapshot in `restore.dir` on a lull with no VM, its memory restored
    /// as `restore.memory` says, the nets `net_fds` names on the tap fds given (`fds`, sent
    /// with the request: `restore_taps`): the VM runs, paused, or resumed at once with
    /// `restore.resume`; its console goes where `serial` says (never to the snapshot's own
    /// console file unless `serial` names it).
    fn restore(&mut self, restore: &ChRestore, fds: SentFds) -> Result<Response, ApiError> {
        let dir = &restore.dir;
        if !matches!(self.state, VmState::NotCreated) {
            return Err(ApiError::RestoreOverVm);
        }
        self.events.vm("restoring");
        // The sent fds the nets take, kept open while the VM runs.
        let mut keep = Vec::new();
        let mut snapshot = crate::snapshot::read_with_taps(dir, |nets| {
            restore_taps::resolve(nets, &restore.nets, fds).map(|taps| {
                keep = taps.keep;
                taps.nets
            })
        })
        .map_err(|e| match e {
            ReadError::Snapshot(e) => ApiError::Restore(crate::vm::VmError::Snapshot(e)),
            ReadError::Taps(e) => e,
        })?;
        if let Some(serial) = &restore.serial {
            snapshot.manifest.config.serial = serial.clone();
        }
        let cfg = Box::new(snapshot.manifest.config.clone());
        // `vm.info` answers in the shape the VM was created with, as before the snapshot.
        let given = snapshot
            .manifest
            .given_config
            .take()
            .map(|given| Box::new(as_restored(given, &cfg)));
        let vm = runner::restore(snapshot, restore.memory, &self.ended).map_err(|e| match e {
            ApiError::Boot(e) => ApiError::Restore(e),
            other => other,
        })?;
        tracing::info!(
            "VM restored from {} (paused; memory: {})",
            dir.display(),
            restore.memory.mode.name()
        );
        self.state = VmState::Running { cfg, vm };
        self.ch_config = given;
        self.net_fds = keep;
        self.events.vm("restored");
        if restore.resume {
            return self.pause_or_resume("resume");
        }
        Ok(Response::no_content())
    }

    /// Stops the VM if it runs (for `reason`) and waits for it; returns lull's exit status:
    /// that of the VM's run, or 0 if none ran.
    fn stop(&mut self, reason: StopReason) -> Result<i32, ApiError> {
        if let VmState::Running { vm, .. } = &mut self.state {
            vm.live().request_stop(reason);
            let result = vm.wait_end();
            self.finish(result);
        }
        Ok(self.exit_status())
    }

    /// lull's exit status if it ended now.
    fn exit_status(&self) -> i32 {
        match &self.state {
            VmState::Shutdown {
                ended: Ended::Stopped { reason, .. },
                ..
            } => exit_code::for_stop(reason),
            VmState::Shutdown {
                ended: Ended::Failed { .. },
                ..
            } => exit_code::VMM_FAILURE,
            _ => exit_code::GUEST_RESET,
        }
    }

    /// Takes note of a run that ended by itself (the VM-ended eventfd fired). Returns lull's
    /// exit status if lull should end: a signal stopped the VM.
    pub fn poll_vm(&mut self) -> Option<i32> {
        let VmState::Running { vm, .. } = &mut self.state else {
            return None;
        };
        let result = vm.try_end()?;
        self.finish(result);
        match &self.state {
            VmState::Shutdown {
                ended:
                    Ended::Stopped {
                        reason: StopReason::Signal(_),
                        ..
                    },
                ..
            } => Some(self.exit_status()),
            _ => None,
        }
    }

    /// SIGINT or SIGTERM reached the server: stop the VM if it runs; returns lull's status.
    pub fn on_signal(&mut self, signal: i32) -> i32 {
        if matches!(self.state, VmState::NotCreated | VmState::Created { .. }) {
            return exit_code::for_stop(&StopReason::Signal(signal));
        }
        match self.stop(StopReason::Signal(signal)) {
            Ok(code) => code,
            Err(e) => {
                tracing::error!("{e}");
                exit_code::VMM_FAILURE
            }
        }
    }

    /// True once after a run has ended (and no other started): the server takes the
    /// SIGINT/SIGTERM handlers back then, before it answers, so that a client that signals
    /// lull after `vm.shutdown`'s answer (the Nomad drivers do) reaches the server, not the
    /// ended run.
    pub fn take_run_ended(&mut self) -> bool {
        std::mem::take(&mut self.run_ended)
    }

    /// Moves a run that ended to `Shutdown` and writes its `--metrics` file.
    fn finish(&mut self, result: Result<crate::vm::RunOutcome, ApiError>) {
        let state = std::mem::replace(&mut self.state, VmState::NotCreated);
        let VmState::Running { cfg, .. } = state else {
            self.state = state;
            return;
        };
        let ended = match result {
            Ok(mut outcome) => {
                outcome.report.exit_status = exit_code::for_stop(&outcome.reason);
                tracing::info!("VM stopped: {}", outcome.reason);
                if let Some(path) = &cfg.metrics {
                    if let Err(e) = report::write_json(&outcome.report, path) {
                        tracing::warn!("cannot write metrics to {}: {e}", path.display());
                    }
                }
                Ended::Stopped {
                    reason: outcome.reason,
                    report: Box::new(outcome.report),
                }
            }
            Err(e) => {
                let description = e.messages().join(": ");
                tracing::error!("{description}");
                Ended::Failed {
                    description,
                    response: Response::error(&e),
                }
            }
        };
        self.state = VmState::Shutdown { cfg, ended };
        self.run_ended = true;
        if !self.rebooting {
            self.events.vm("shutdown");
        }
    }
}

/// The configuration `given` at `vm.create` (Cloud Hypervisor's shape), as the VM restored
/// with `cfg` has it: the taps its nets were given (`net_fds`) and where its serial port goes
/// (a snapshot's console file is not reused).
fn as_restored(mut given: serde_json::Value, cfg: &VmConfig) -> serde_json::Value {
    use serde_json::json;
    if let Some(nets) = given
        .get_mut("net")
        .and_then(serde_json::Value::as_array_mut)
    {
        if nets.len() == cfg.nets.len() {
            for (shown, net) in nets.iter_mut().zip(&cfg.nets) {
                if let Some(shown) = shown.as_object_mut() {
                    shown.insert("tap".into(), net.tap.clone().into());
                }
            }
        }
    }
    if let Some(given) = given.as_object_mut() {
        let serial = match &cfg.serial {
            crate::config::SerialMode::Off => json!({"mode": "Null"}),
            crate::config::SerialMode::Stdio => json!({"mode": "Tty"}),
            crate::config::SerialMode::Pty => json!({"mode": "Pty"}),
            crate::config::SerialMode::File(p) => json!({"mode": "File", "file": p}),
        };
        let unchanged = given.get("serial").is_some_and(|s| {
            s.get("mode").and_then(serde_json::Value::as_str) == serial["mode"].as_str()
                && (serial["mode"] != "File" || s.get("file") == serial.get("file"))
        });
        // A serial port left as it was given (none: Null, the default) stays as written.
        let default_kept = given.get("serial").is_none() && serial["mode"] == "Null";
        if !(unchanged || default_kept) {
            given.insert("serial".into(), serial);
        }
    }
    given
}

/// Where a running VM's pty is, in Cloud Hypervisor's shape: the `file` of `serial` and of
/// `console` where their `mode` is `Pty` (the console's pty is the serial port's: lull has no
/// virtio console), as libvirt reads them (`config.serial.file`, `config.console.file`).
fn show_pty(config: &mut serde_json::Value, pty: &std::path::Path) {
    for device in ["serial", "console"] {
        let Some(shown) = config
            .get_mut(device)
            .and_then(serde_json::Value::as_object_mut)
        else {
            continue;
        };
        let is_pty = shown
            .get("mode")
            .and_then(serde_json::Value::as_str)
            .is_some_and(|m| m.eq_ignore_ascii_case("pty"));
        if is_pty {
            shown.insert("file".into(), pty.display().to_string().into());
        }
    }
}

impl Ended {
    fn describe(&self) -> String {
        match self {
            Self::Stopped { reason, .. } => reason.to_string(),
            Self::Failed { description, .. } => description.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    fn controller(initial: Option<VmConfig>) -> Controller {
        Controller::new(initial, EventFd::new(EFD_NONBLOCK).unwrap())
    }

    #[test]
    fn a_restored_config_shows_its_new_taps_and_where_its_serial_goes() {
        use crate::config::SerialMode;
        use serde_json::json;
        let given = json!({
            "payload": {"kernel": "/k"},
            "net": [{"id": "net_0", "tap": "old"}],
            "serial": {"mode": "File", "file": "/old.log"},
        });
        let mut cfg = VmConfig {
            nets: vec!["tap=new".parse().unwrap()],
            serial: SerialMode::Off,
            ..VmConfig::default()
        };
        let shown = as_restored(given.clone(), &cfg);
        assert_eq!(shown["net"][0], json!({"id": "net_0", "tap": "new"}));
        assert_eq!(shown["serial"], json!({"mode": "Null"}));
        assert_eq!(shown["payload"], given["payload"]);
        cfg.serial = SerialMode::File("/old.log".into());
        assert_eq!(as_restored(given.clone(), &cfg)["serial"], given["serial"]);
        cfg.serial = SerialMode::Pty;
        let pty = json!({"serial": {"mode": "Pty"}, "console": {"mode": "Pty"}});
        assert_eq!(as_restored(pty.clone(), &cfg), pty);
        cfg.serial = SerialMode::Off;
        assert_eq!(as_restored(json!({}), &cfg), json!({}));
    }

    #[test]
    fn a_pty_is_shown_where_the_mode_is_pty() {
        use serde_json::json;
        let mut config = json!({"serial": {"mode": "Pty"}, "console": {"mode": "Off"}});
        show_pty(&mut config, std::path::Path::new("/dev/pts/7"));
        assert_eq!(config["serial"]["file"], "/dev/pts/7");
        assert!(config["console"].get("file").is_none());
    }

    fn status(c: &mut Controller, request: ApiRequest) -> u16 {
        c.handle(request).0.status
    }

    fn body(c: &mut Controller, request: ApiRequest) -> serde_json::Value {
        let (response, _) = c.handle(request);
        serde_json::from_slice(&response.body.unwrap()).unwrap()
    }

    #[test]
    fn a_vm_not_created_answers_404_and_can_be_created_once() {
        let mut c = controller(None);
        assert_eq!(status(&mut c, ApiRequest::VmBoot), 404);
        assert_eq!(status(&mut c, ApiRequest::VmInfo), 404);
        assert_eq!(status(&mut c, ApiRequest::VmCounters), 404);
        assert_eq!(status(&mut c, ApiRequest::VmShutdown), 404);
        let cfg = VmConfig {
            cpus: 2,
            ..VmConfig::default()
        };
        let dir = std::env::temp_dir().join(format!("lull-controller-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let as_kernel = VmConfig {
            kernel: Some(dir.clone()),
            ..cfg.clone()
        };
        let (refused, _) = c.handle(ApiRequest::VmCreate(Box::new(as_kernel)));
        assert_eq!(refused.status, 400);
        let why = String::from_utf8(refused.body.unwrap()).unwrap();
        assert!(why.contains(dir.to_str().unwrap()), "{why}");
        assert_eq!(status(&mut c, ApiRequest::VmInfo), 404);
        let kernel = dir.join("vmlinux");
        std::fs::write(&kernel, [0x7f, b'E', b'L', b'F', 2, 1, 1, 0]).unwrap();
        let cfg = VmConfig {
            kernel: Some(kernel),
            ..cfg
        };
        let created = c.handle(ApiRequest::VmCreate(Box::new(cfg.clone()))).0;
        let text = created.body.as_deref().map(String::from_utf8_lossy);
        assert_eq!(created.status, 204, "{text:?}");
        // The 8-byte "ELF" passes the probe but cannot be loaded: the boot fails (or KVM is
        // missing), and the VM may then be created again.
        assert_eq!(status(&mut c, ApiRequest::VmBoot), 500);
        assert_eq!(body(&mut c, ApiRequest::VmInfo)["state"], "Created");
        let again = VmConfig {
            cpus: 3,
            ..cfg.clone()
        };
        assert_eq!(status(&mut c, ApiRequest::VmCreate(Box::new(again))), 204);
        assert_eq!(status(&mut c, ApiRequest::VmCreate(Box::new(cfg))), 500);
        let info = body(&mut c, ApiRequest::VmInfo);
        assert_eq!(info["state"], "Created");
        assert_eq!(info["config"]["cpus"], 3);
        assert_eq!(info["memory_actual_size"], 256 << 20);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn vm_info_answers_in_the_shape_the_config_was_given_in() {
        let mut c = controller(None);
        let dir = std::env::temp_dir().join(format!("lull-controller-ch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("vmlinux");
        std::fs::write(&kernel, [0x7f, b'E', b'L', b'F', 2, 1, 1, 0]).unwrap();
        let given = serde_json::json!({"payload": {"kernel": kernel}});
        let cfg = Box::new(VmConfig {
            kernel: Some(kernel),
            ..VmConfig::default()
        });
        let created = c.handle(ApiRequest::VmCreateCh(cfg, Box::new(given.clone())));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(created.0.status, 204);
        let info = body(&mut c, ApiRequest::VmInfo);
        assert_eq!(info["config"], given);
        assert_eq!(info["state"], "Created");
        let ping = body(&mut c, ApiRequest::VmmPing);
        let version = ping["version"].as_str().unwrap();
        let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
        assert_eq!(parts.len(), 3, "{version}");
    }

    #[test]
    fn lull_ch_knobs_apply_to_each_vm_created_from_cloud_hypervisors_config() {
        let dir =
            std::env::temp_dir().join(format!("lull-controller-knobs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("vmlinux");
        std::fs::write(&kernel, [0x7f, b'E', b'L', b'F', 2, 1, 1, 0]).unwrap();
        let given = serde_json::json!({"payload": {"kernel": kernel}});
        let cfg = || {
            Box::new(VmConfig {
                kernel: Some(kernel.clone()),
                ..VmConfig::default()
            })
        };
        let mut c = controller(None).with_ch_knobs(vec!["irqchip=kernel,cpus=2".into()]);
        let created = c.handle(ApiRequest::VmCreateCh(cfg(), Box::new(given.clone())));
        assert_eq!(created.0.status, 204);
        match &c.state {
            VmState::Created { cfg, .. } => {
                assert_eq!(cfg.irqchip, crate::config::IrqchipMode::Kernel);
                assert_eq!(cfg.cpus, 2);
            }
            _ => panic!("no VM created"),
        }
        // lull's own configuration is its own: no knob touches it.
        let mut c = controller(None).with_ch_knobs(vec!["irqchip=kernel".into()]);
        assert_eq!(status(&mut c, ApiRequest::VmCreate(cfg())), 204);
        match &c.state {
            VmState::Created { cfg, .. } => {
                assert_eq!(cfg.irqchip, VmConfig::default().irqchip);
            }
            _ => panic!("no VM created"),
        }
        // Knobs that make the VM invalid refuse it, and nothing is created.
        let mut c = controller(None).with_ch_knobs(vec!["cpus=0".into()]);
        let refused = c.handle(ApiRequest::VmCreateCh(cfg(), Box::new(given)));
        assert_eq!(refused.0.status, 400);
        assert_eq!(status(&mut c, ApiRequest::VmInfo), 404);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_deleted_vm_can_be_created_again_and_the_power_button_is_refused() {
        let mut c = controller(Some(VmConfig::default()));
        assert_eq!(status(&mut c, ApiRequest::VmPowerButton), 405);
        assert_eq!(status(&mut c, ApiRequest::VmReboot), 405);
        assert_eq!(status(&mut c, ApiRequest::VmDelete), 204);
        assert_eq!(status(&mut c, ApiRequest::VmInfo), 404);
        assert_eq!(status(&mut c, ApiRequest::VmDelete), 404);
        assert_eq!(status(&mut c, ApiRequest::VmReboot), 404);
        let why = body(&mut c, ApiRequest::VmPowerButton);
        assert!(why[0].as_str().unwrap().contains("vm.shutdown"), "{why}");
    }

    #[test]
    fn a_created_vm_is_not_booted() {
        let mut c = controller(Some(VmConfig::default()));
        assert_eq!(status(&mut c, ApiRequest::VmShutdown), 405);
        assert_eq!(status(&mut c, ApiRequest::VmCounters), 405);
        let ping = body(&mut c, ApiRequest::VmmPing);
        // The version lull is released as: the workspace's, as its Cargo.toml writes it.
        let workspace = include_str!("../../../Cargo.toml");
        let version = workspace
            .lines()
            .find_map(|l| l.strip_prefix("version = \""))
            .and_then(|v| v.strip_suffix('"'))
            .unwrap();
        assert_eq!(ping["version"], version);
        assert_eq!(ping["build_version"], version);
        assert_eq!(ping["pid"], std::process::id());
    }

    #[test]
    fn vmm_shutdown_without_a_run_ends_lull_with_status_0() {
        let mut c = controller(Some(VmConfig::default()));
        let (response, next) = c.handle(ApiRequest::VmmShutdown);
        assert_eq!(response.status, 204);
        assert_eq!(next, Next::Exit(exit_code::GUEST_RESET));
        assert_eq!(c.on_signal(libc::SIGTERM), exit_code::USER_STOP);
    }
}
