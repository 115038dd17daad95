//! Integration tests of the management API (`lull run --api-socket PATH`): a client speaking
//! HTTP/1.1 over the Unix socket (from this test, no curl) creates, boots, queries and stops
//! a VM running `idle-sim` (timers and HLT until stopped), and checks the status codes and
//! error bodies, that bad requests leave the VM running, the socket's permissions, and how
//! lull ends (vmm.shutdown, SIGTERM) with which exit status.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_schema::{RunReport, VcpuReadout};
use lull_tests::exit_status::{API_STOP, BAD_INPUT, USER_STOP};
use lull_tests::{
    api_raw, kit_file, kvm_trial, lull_bin, report_from, run_lull, start_api_server, temp_path,
    Arguments, Failed, Trial,
};
use serde_json::Value;

/// A lull serving the API; killed if the test fails before it exits.
struct Lull {
    /// `None` once waited for.
    child: Option<Child>,
    pid: u32,
    socket: PathBuf,
    /// lull's log, collected after the ready line.
    log: mpsc::Receiver<String>,
}

impl Lull {
    /// Starts `lull run --api-socket SOCKET ARGS` and waits for its "management API on" line.
    fn start(name: &str, args: &[&str]) -> Result<Self, Failed> {
        let server = start_api_server(name, args)?;
        Ok(Self {
            pid: server.child.id(),
            child: Some(server.child),
            socket: server.socket,
            log: server.log,
        })
    }

    /// Sends one request and returns the status and the body.
    fn call(&self, method: &str, endpoint: &str, body: &str) -> Result<(u16, String), Failed> {
        let head = format!(
            "{method} /api/v1/{endpoint} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.raw(format!("{head}{body}").as_bytes())
    }

    /// A request whose body is JSON, answered with a JSON body.
    fn json(&self, method: &str, endpoint: &str, want: u16) -> Result<Value, Failed> {
        let (status, body) = self.call(method, endpoint, "")?;
        if status != want {
            return Err(
                format!("{method} {endpoint}: status {status}, want {want}: {body}").into(),
            );
        }
        serde_json::from_str(&body).map_err(|e| format!("{endpoint}: {e}: {body}").into())
    }

    /// `GET vm.counters`: the run report, checked against lull-schema's.
    fn counters(&self) -> Result<RunReport, Failed> {
        let (status, body) = self.call("GET", "vm.counters", "")?;
        if status != 200 {
            return Err(format!("GET vm.counters: status {status}, want 200: {body}").into());
        }
        report_from(&body).map_err(|e| format!("vm.counters: {e}").into())
    }

    /// Sends `bytes` as they are and reads the answer until lull closes the connection.
    fn raw(&self, bytes: &[u8]) -> Result<(u16, String), Failed> {
        api_raw(&self.socket, bytes)
    }

    /// Fails unless `method endpoint` answers `want` (with an error body of messages for a 4xx
    /// or 5xx, as Cloud Hypervisor's).
    fn expect(&self, method: &str, endpoint: &str, body: &str, want: u16) -> Result<(), Failed> {
        let (status, text) = self.call(method, endpoint, body)?;
        check_status(&format!("{method} {endpoint}"), status, &text, want)
    }

    /// `vmm.shutdown`: answered 204, then lull exits with `want`.
    fn vmm_shutdown(self, want: i32) -> Result<(), Failed> {
        self.expect("PUT", "vmm.shutdown", "", 204)?;
        match self.wait()? {
            code if code == want => Ok(()),
            code => Err(format!("exit {code}, want {want}").into()),
        }
    }

    /// Waits (up to 30 s) for lull to exit; its exit code. lull must have removed its socket.
    fn wait(mut self) -> Result<i32, Failed> {
        let code = self.wait_exit()?;
        if self.socket.exists() {
            return Err(format!(
                "lull exited ({code}) and left its socket\n{}",
                self.log_text()
            )
            .into());
        }
        Ok(code)
    }

    fn wait_exit(&mut self) -> Result<i32, Failed> {
        let mut child = self.child.take().ok_or("already waited for")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let status = child.wait();
            let _ = tx.send(status);
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(status)) => status.code().ok_or_else(|| "lull died by a signal".into()),
            Ok(Err(e)) => Err(e.to_string().into()),
            Err(_) => {
                let _ = Command::new("kill")
                    .args(["-KILL", &self.pid.to_string()])
                    .status();
                Err("lull did not exit within 30 s".into())
            }
        }
    }

    fn log_text(&self) -> String {
        self.log.try_iter().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Lull {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn check_status(what: &str, status: u16, body: &str, want: u16) -> Result<(), Failed> {
    if status != want {
        return Err(format!("{what}: status {status}, want {want}: {body}").into());
    }
    if status >= 400 {
        let messages: Vec<String> = serde_json::from_str(body)
            .map_err(|e| format!("{what}: error body is not an array of messages ({e}): {body}"))?;
        if messages.is_empty() || messages.iter().any(String::is_empty) {
            return Err(format!("{what}: empty error messages: {body}").into());
        }
    }
    Ok(())
}

/// The VM configuration of the tests: idle-sim on 2 vCPUs for 10 minutes, console off.
fn idle_config(metrics: &Path) -> Result<String, Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?;
    Ok(serde_json::json!({
        "kernel": kernel,
        "cmdline": "duration_ms=600000",
        "cpus": 2,
        "serial": "off",
        "metrics": metrics,
    })
    .to_string())
}

/// Sum of one per-vCPU counter in a report.
fn vcpu_sum(report: &RunReport, counter: fn(&VcpuReadout) -> u64) -> u64 {
    report.vcpus.iter().map(counter).sum()
}

fn create_boot_query_stop() -> Result<(), Failed> {
    let metrics = temp_path("api-metrics.json");
    let lull = Lull::start("api-life", &[])?;
    socket_is_private_and_answers(&lull)?;
    create_checks_its_input(&lull, &metrics)?;
    let live = boot_and_watch_counters(&lull)?;
    bad_requests_leave_it_running(&lull)?;
    shutdown_keeps_the_counters(&lull, &live, &metrics)?;
    lull.expect("PUT", "vm.shutdown", "", 405)?;
    lull.expect("PUT", "vm.boot", "", 500)?;
    lull.vmm_shutdown(API_STOP)
}

/// The API socket is the user's alone, and `vmm.ping` names this lull: its pid, and the
/// version `lull --version` prints.
fn socket_is_private_and_answers(lull: &Lull) -> Result<(), Failed> {
    let mode = std::fs::metadata(&lull.socket)
        .map_err(|e| e.to_string())?
        .permissions()
        .mode();
    if mode & 0o777 != 0o600 {
        return Err(format!("socket mode {:o}, want 600", mode & 0o777).into());
    }
    let ping = lull.json("GET", "vmm.ping", 200)?;
    let printed = run_lull(&["--version"], Duration::from_secs(30))?;
    printed.expect_code(0)?;
    let version = printed.stdout.trim().strip_prefix("lull ").unwrap_or("");
    if version.is_empty()
        || ping["version"] != version
        || ping["pid"].as_u64() != Some(u64::from(lull.pid))
    {
        return Err(format!("vmm.ping: {ping} (lull --version: {version:?})").into());
    }
    Ok(())
}

/// Before a VM exists: boot and info find none; `vm.create` refuses bad configurations,
/// creates once, and refuses a second one; counters and shutdown need a running VM.
fn create_checks_its_input(lull: &Lull, metrics: &Path) -> Result<(), Failed> {
    lull.expect("PUT", "vm.boot", "", 404)?;
    lull.expect("GET", "vm.info", "", 404)?;
    lull.expect("PUT", "vm.create", "", 400)?;
    lull.expect("PUT", "vm.create", r#"{"cpus": 0}"#, 400)?;
    lull.expect("PUT", "vm.create", r#"{"cpu": 2}"#, 400)?;
    let config = idle_config(metrics)?;
    lull.expect("PUT", "vm.create", &config, 204)?;
    lull.expect("PUT", "vm.create", &config, 500)?;
    let info = lull.json("GET", "vm.info", 200)?;
    if info["state"] != "Created" || info["config"]["cpus"] != 2 {
        return Err(format!("vm.info after create: {info}").into());
    }
    lull.expect("GET", "vm.counters", "", 405)?;
    lull.expect("PUT", "vm.shutdown", "", 405)?;

    Ok(())
}

/// `vm.boot` runs the VM (once); its live counters grow while the guest's timers fire.
fn boot_and_watch_counters(lull: &Lull) -> Result<RunReport, Failed> {
    lull.expect("PUT", "vm.boot", "", 204)?;
    lull.expect("PUT", "vm.boot", "", 500)?;
    let info = lull.json("GET", "vm.info", 200)?;
    if info["state"] != "Running" {
        return Err(format!("vm.info after boot: {info}").into());
    }
    // Live counters: they grow while the guest's timers fire.
    let deadline = Instant::now() + Duration::from_secs(30);
    let live = loop {
        let report = lull.counters()?;
        if report.stop_reason != "running" || report.vcpus.len() != 2 {
            return Err(format!("live vm.counters: {report:?}").into());
        }
        if vcpu_sum(&report, |c| c.lapic_timer_fires) >= 10 {
            break report;
        }
        if Instant::now() > deadline {
            return Err(format!("no LAPIC timer fired in 30 s: {report:?}").into());
        }
        // Polls the counters as an orchestrator would; the pause only spaces the queries.
        std::thread::sleep(Duration::from_millis(100));
    };
    Ok(live)
}

/// Bad requests get errors and leave the VM running.
fn bad_requests_leave_it_running(lull: &Lull) -> Result<(), Failed> {
    let (status, body) = lull.raw(b"NONSENSE\x00\x01\r\n\r\n")?;
    check_status("garbage", status, &body, 400)?;
    let big = format!(
        "PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: {}\r\n\r\n{{",
        (1 << 20) + 1
    );
    let (status, body) = lull.raw(big.as_bytes())?;
    check_status("oversized body", status, &body, 413)?;
    lull.expect("GET", "vm.boot", "", 405)?;
    lull.expect("PUT", "vm.info", "", 405)?;
    lull.expect("GET", "vm.nothing", "", 404)?;
    lull.expect("PUT", "vm.boot", "{}", 400)?;
    for partial in [&b""[..], b"PUT /api/v1/vm.shutdown HTTP/1.1\r\nContent-"] {
        let mut conn = UnixStream::connect(&lull.socket).map_err(|e| e.to_string())?;
        conn.write_all(partial).map_err(|e| e.to_string())?;
        drop(conn); // hang up mid-request
    }
    let info = lull.json("GET", "vm.info", 200)?;
    if info["state"] != "Running" {
        return Err(format!("the VM stopped after bad requests: {info}").into());
    }
    Ok(())
}

/// `vm.shutdown` stops the VM; its last counters are at least the `live` ones, and the
/// `--metrics` file agrees with them.
fn shutdown_keeps_the_counters(
    lull: &Lull,
    live: &RunReport,
    metrics: &Path,
) -> Result<(), Failed> {
    lull.expect("PUT", "vm.shutdown", "", 204)?;
    let info = lull.json("GET", "vm.info", 200)?;
    if info["state"] != "Shutdown"
        || !info["stop_reason"]
            .as_str()
            .is_some_and(|r| r.contains("API"))
    {
        return Err(format!("vm.info after vm.shutdown: {info}").into());
    }
    let last = lull.counters()?;
    if last.exit_status != API_STOP
        || vcpu_sum(&last, |c| c.lapic_timer_fires) < vcpu_sum(live, |c| c.lapic_timer_fires)
        || last.run_time_ms < live.run_time_ms
    {
        return Err(format!("final vm.counters: {last:?}\nlive: {live:?}").into());
    }
    // The --metrics file is the run's final report: the final vm.counters, field by field.
    let written = lull_tests::take_metrics(metrics)?;
    if written != last {
        return Err(format!("--metrics file: {written:?}\nfinal vm.counters: {last:?}").into());
    }
    Ok(())
}

/// Flags on the command line create the VM; vmm.shutdown stops it while it runs.
fn flags_create_and_vmm_shutdown_stops() -> Result<(), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?;
    let kernel = kernel.to_str().ok_or("kit path is not UTF-8")?;
    let lull = Lull::start(
        "api-flags",
        &[
            "--kernel",
            kernel,
            "--cmdline",
            "duration_ms=600000",
            "--serial",
            "off",
        ],
    )?;
    let info = lull.json("GET", "vm.info", 200)?;
    if info["state"] != "Created" || info["config"]["cmdline"] != "duration_ms=600000" {
        return Err(format!("vm.info: {info}").into());
    }
    lull.expect("PUT", "vm.boot", "", 204)?;
    lull.vmm_shutdown(API_STOP)
}

/// SIGTERM stops a running VM and ends lull as it does for `lull run`.
fn sigterm_stops_the_vm_and_lull() -> Result<(), Failed> {
    let metrics = temp_path("api-sigterm.json");
    let lull = Lull::start("api-sigterm", &[])?;
    lull.expect("PUT", "vm.create", &idle_config(&metrics)?, 204)?;
    lull.expect("PUT", "vm.boot", "", 204)?;
    let pid = lull.pid.to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status();
    if !killed.is_ok_and(|s| s.success()) {
        return Err("cannot send SIGTERM".into());
    }
    let code = lull.wait()?;
    let written = lull_tests::take_metrics(&metrics)?;
    if code != USER_STOP || written.stop_reason != "stopped by SIGTERM" {
        return Err(format!("exit {code} (want {USER_STOP}), metrics: {written:?}").into());
    }
    Ok(())
}

/// A guest that stops by itself leaves lull serving (state Shutdown, final counters); a
/// SIGTERM then reaches the server, whose handlers came back when the run ended, and lull
/// exits with the status of the VM's run.
fn a_guest_that_stops_leaves_lull_serving() -> Result<(), Failed> {
    let kernel = kit_file("guests/hello.elf")?;
    let kernel = kernel.to_str().ok_or("kit path is not UTF-8")?;
    let lull = Lull::start("api-hello", &["--kernel", kernel, "--serial", "off"])?;
    lull.expect("PUT", "vm.boot", "", 204)?;
    // hello passes and writes 0 to the test-exit port within milliseconds; wait for the API
    // to see it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let info = loop {
        let info = lull.json("GET", "vm.info", 200)?;
        if info["state"] == "Shutdown" {
            break info;
        }
        if Instant::now() > deadline {
            return Err(format!("hello did not stop in 30 s: {info}").into());
        }
        // Polls the state as an orchestrator would; the pause only spaces the queries.
        std::thread::sleep(Duration::from_millis(50));
    };
    if info["stop_reason"] != "guest test exit (status 1)" {
        return Err(format!("vm.info: {info}").into());
    }
    let last = lull.counters()?;
    if last.exit_status != 1 || last.serial_bytes_out == 0 {
        return Err(format!("final vm.counters: {last:?}").into());
    }
    lull.json("GET", "vmm.ping", 200)?;
    let killed = Command::new("kill")
        .args(["-TERM", &lull.pid.to_string()])
        .status();
    if !killed.is_ok_and(|s| s.success()) {
        return Err("cannot send SIGTERM".into());
    }
    // lull ends (it would not without its handlers back) with the status of the VM's run.
    match lull.wait()? {
        1 => Ok(()),
        code => Err(format!("exit {code} after SIGTERM, want the guest's 1").into()),
    }
}

/// An existing file at the socket path is refused and left alone.
fn an_existing_path_is_refused() -> Result<(), Failed> {
    let path = temp_path("api-exists.sock");
    std::fs::write(&path, "keep").map_err(|e| e.to_string())?;
    let out = Command::new(lull_bin())
        .args(["run", "--api-socket"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(BAD_INPUT) || kept != "keep" || !stderr.contains("already exists")
    {
        return Err(format!("status {:?}, file {kept:?}, stderr: {stderr}", out.status).into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial(
            "api_creates_boots_queries_and_stops_a_vm",
            create_boot_query_stop,
        ),
        kvm_trial(
            "api_flags_create_the_vm_and_vmm_shutdown_stops_it",
            flags_create_and_vmm_shutdown_stops,
        ),
        kvm_trial(
            "api_a_guest_that_stops_leaves_lull_serving",
            a_guest_that_stops_leaves_lull_serving,
        ),
        kvm_trial(
            "api_sigterm_stops_the_vm_and_lull",
            sigterm_stops_the_vm_and_lull,
        ),
        Trial::test(
            "api_refuses_an_existing_socket_path",
            an_existing_path_is_refused,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
