//! The `pause-timers` guest served by a lull on its API socket, as the pause and restore tests
//! drive it.

use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_schema::RunReport;
use lull_tests::exit_status::GUEST_PASS;
use lull_tests::{
    api_call, kit_file, report_from, start_api_server, temp_path, wait_for_console, Failed,
};

/// A lull serving the API with `pause-timers` created; killed if the test fails early.
pub(crate) struct PausedVm {
    pub(crate) child: Option<Child>,
    pub(crate) socket: PathBuf,
    pub(crate) serial: PathBuf,
    pub(crate) log: mpsc::Receiver<String>,
}

impl PausedVm {
    /// Starts lull with the guest (`count` timers per phase) on 2 vCPUs, `extra` flags.
    pub(crate) fn start(name: &str, count: u32, extra: &[&str]) -> Result<Self, Failed> {
        let kernel = kit_file("guests/pause-timers.elf")?;
        let serial = temp_path(&format!("{name}.serial"));
        let _ = std::fs::remove_file(&serial);
        let cmdline = format!("count={count} ns=10000000 spread_ns=1000000");
        let serial_flag = format!("file={}", serial.display());
        let kernel = kernel.display().to_string();
        let mut args = vec![
            "--kernel",
            &kernel,
            "--cpus",
            "2",
            "--cmdline",
            &cmdline,
            "--serial",
            &serial_flag,
        ];
        args.extend_from_slice(extra);
        let server = start_api_server(name, &args)?;
        Ok(Self {
            child: Some(server.child),
            socket: server.socket,
            serial,
            log: server.log,
        })
    }

    /// Fails unless `method endpoint` answers `want`; the body.
    pub(crate) fn expect(&self, method: &str, endpoint: &str, want: u16) -> Result<String, Failed> {
        let (status, body) = api_call(&self.socket, method, endpoint, "")?;
        if status != want {
            return Err(
                format!("{method} {endpoint}: status {status}, want {want}: {body}").into(),
            );
        }
        Ok(body)
    }

    pub(crate) fn info(&self) -> Result<serde_json::Value, Failed> {
        let body = self.expect("GET", "vm.info", 200)?;
        serde_json::from_str(&body).map_err(|e| format!("vm.info: {e}: {body}").into())
    }

    pub(crate) fn counters(&self) -> Result<RunReport, Failed> {
        let body = self.expect("GET", "vm.counters", 200)?;
        report_from(&body).map_err(|e| format!("vm.counters: {e}").into())
    }

    pub(crate) fn serial_text(&self) -> String {
        std::fs::read_to_string(&self.serial).unwrap_or_default()
    }

    /// Waits up to 60 s for the guest's console to show `line`.
    pub(crate) fn wait_for_line(&self, line: &str) -> Result<(), Failed> {
        wait_for_console(&self.serial, line, &[], Duration::from_secs(60)).map(drop)
    }

    /// Pauses for `length`: the state says `Paused`, and no vCPU exits or takes a timer
    /// meanwhile (the counters at the start and the end of the pause are equal).
    pub(crate) fn pause_for(&self, length: Duration) -> Result<(), Failed> {
        self.expect("PUT", "vm.pause", 204)?;
        let state = self.info()?["state"].clone();
        if state != "Paused" {
            return Err(format!("vm.info state {state} after vm.pause").into());
        }
        let before = activity(&self.counters()?);
        std::thread::sleep(length);
        let after = activity(&self.counters()?);
        if before != after {
            return Err(format!("the vCPUs ran while paused: {before:?} -> {after:?}").into());
        }
        self.expect("PUT", "vm.resume", 204)?;
        Ok(())
    }

    /// Waits up to 120 s for the guest to end; fails unless it passed. Returns its console.
    pub(crate) fn guest_passes(&self) -> Result<String, Failed> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let info = self.info()?;
            if info["state"] == "Shutdown" {
                let text = self.serial_text();
                if info["stop_reason"] != "guest test exit (status 1)"
                    || !text.contains("pause-timers: PASS")
                {
                    return Err(format!("the guest did not pass: {info}\n{text}").into());
                }
                return Ok(text);
            }
            if Instant::now() > deadline {
                return Err(format!("the guest did not end: {}", self.serial_text()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `vmm.shutdown`; lull must exit with the guest's status.
    pub(crate) fn finish(mut self) -> Result<(), Failed> {
        self.expect("PUT", "vmm.shutdown", 204)?;
        let mut child = self.child.take().ok_or("already finished")?;
        let status = child.wait().map_err(|e| e.to_string())?;
        match status.code() {
            Some(GUEST_PASS) => Ok(()),
            code => Err(format!("lull exited with {code:?}, want {GUEST_PASS}").into()),
        }
    }

    /// What lull said of guest time over its `resumes` resumes: `true` if it stood still (KVM
    /// moved the TSC back), `false` if it ran on (it cannot: PVM hosts). Fails unless every
    /// "VM resumed" line says one or the other, the same each time.
    pub(crate) fn time_stood_still(&self, resumes: usize) -> Result<bool, Failed> {
        let said: Vec<bool> = self
            .log
            .try_iter()
            .filter(|l| l.contains("VM resumed"))
            .map(|l| {
                if l.contains("guest time stood still") {
                    Ok(true)
                } else if l.contains("guest time ran on") {
                    Ok(false)
                } else {
                    Err(format!(
                        "lull's resume does not say what guest time did: {l}"
                    ))
                }
            })
            .collect::<Result<_, _>>()?;
        match said.first() {
            Some(&first) if said.len() == resumes && said.iter().all(|&s| s == first) => Ok(first),
            _ => Err(format!("{resumes} resumes, lull said of guest time: {said:?}").into()),
        }
    }
}

impl Drop for PausedVm {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.serial);
    }
}

/// Everything a vCPU does that lull counts: it must not change while the VM is paused.
pub(crate) fn activity(report: &RunReport) -> Vec<[u64; 9]> {
    report
        .vcpus
        .iter()
        .map(|v| {
            [
                v.io_in,
                v.io_out,
                v.mmio_read,
                v.mmio_write,
                v.hlt,
                v.msr,
                v.injected,
                v.lapic_timer_fires,
                v.global_timer_fires,
            ]
        })
        .collect()
}

/// The guest's `max_late_ns` over all its timers.
pub(crate) fn max_lateness_ns(console: &str) -> Option<i64> {
    console
        .lines()
        .find(|l| l.starts_with("pause-timers: timers "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.trim().parse().ok())
}
