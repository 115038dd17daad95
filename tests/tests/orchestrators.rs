//! lull driven as Cloud Hypervisor by the clients that drive Cloud Hypervisor, replayed
//! request by request from their public sources (each fixture names its source):
//!
//! - `ch-remote` (cloud-hypervisor/api_client/src/lib.rs, v54): one connection per command,
//!   the request written in pieces (request line with `Host` and `Accept`, then
//!   `Content-Length`, the blank line, the body), no Content-Type; the answer read in 256-byte
//!   pieces up to the blank line or the Content-Length, never to the end of the stream, and
//!   its status taken as everything after `HTTP/1.1 ` on the first line.
//! - the Nomad driver ccheshirecat/nomad-driver-ch (cloudhypervisor/vm_operations.go): starts
//!   `cloud-hypervisor --api-socket PATH --log-file F --seccomp S`, sends its VmConfig to
//!   vm.create with Go's HTTP client (one reused connection), expects 204, vm.boot, polls
//!   vm.info for `Running`, stops with vm.shutdown and a signal.
//! - a driver that puts the VM on the command line (`--kernel`, `--cpus boot=N`, `--memory
//!   size=BYTES`, `--disk path=..,readonly=on`, `--serial`, `--console`) and reads
//!   `memory_actual_size` from vm.info.
//!
//! - Kata's Cloud Hypervisor driver (kata-containers src/runtime/virtcontainers/clh.go):
//!   vm.create, then vm.add-net with each tap's fd sent by SCM_RIGHTS, then vm.boot.
//!
//! Also: both command-line forms (`cloud-hypervisor` as a symlink, `lull ch`), every refused
//! flag (exit 2) and every refused VmConfig field (one 400 each, naming it), keep-alive.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_tests::{
    kit_file, kvm_trial, lull_bin, report_from, run_lull, temp_path, Arguments, Failed, Trial,
};
use serde_json::{json, Value};

/// Exit status of a VM stopped through the API.
const API_STOP: i32 = 14;
/// Exit status of a refused command line.
const USAGE: i32 = 2;

/// `cloud-hypervisor`: a symlink to the lull under test, in a directory of its own.
fn cloud_hypervisor(name: &str) -> Result<PathBuf, Failed> {
    let dir = temp_path(&format!("{name}-bin"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let link = dir.join("cloud-hypervisor");
    std::os::unix::fs::symlink(lull_bin(), &link).map_err(|e| e.to_string())?;
    Ok(link)
}

/// lull started as `cloud-hypervisor ARGS` serving SOCKET; killed if the test fails early.
struct Ch {
    child: Option<Child>,
    socket: PathBuf,
    log: mpsc::Receiver<String>,
}

impl Ch {
    /// Starts `cloud-hypervisor --api-socket SOCKET ARGS` (SOCKET in the form `api_form`
    /// gives) and waits for the socket to take a connection.
    fn start(name: &str, api_form: fn(&Path) -> String, args: &[&str]) -> Result<Self, Failed> {
        let socket = temp_path(&format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let mut child = Command::new(cloud_hypervisor(name)?)
            .arg("--api-socket")
            .arg(api_form(&socket))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start cloud-hypervisor: {e}"))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut ch = Self {
            child: Some(child),
            socket,
            log,
        };
        // As the driver's waitForAPISocket: until the socket takes a connection (lull's own
        // log may be in --log-file).
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&ch.socket).is_err() {
            if let Some(child) = ch.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("lull exited ({status}): {}", ch.log_text()).into());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no API socket within 30 s: {}", ch.log_text()).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(ch)
    }

    /// Sends SIGTERM (as the driver does after vm.shutdown) and waits for the exit status.
    fn terminate(mut self) -> Result<i32, Failed> {
        let mut child = self.child.take().ok_or("already waited for")?;
        let kill = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        if !kill.success() {
            return Err("kill -TERM failed".into());
        }
        Self::wait(&mut child)
    }

    /// Waits for lull to exit by itself (after vmm.shutdown).
    fn exit_status(mut self) -> Result<i32, Failed> {
        let mut child = self.child.take().ok_or("already waited for")?;
        Self::wait(&mut child)
    }

    fn wait(child: &mut Child) -> Result<i32, Failed> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return status.code().ok_or_else(|| "lull died by a signal".into());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err("lull did not exit within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        self.log.try_iter().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Ch {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One ch-remote command, as its `api_client` sends it and reads the answer (see the module
/// comment): the status and the body (`None` without a Content-Length, as it has it).
fn ch_remote(
    socket: &Path,
    method: &str,
    command: &str,
    body: Option<&str>,
) -> Result<(u16, Option<String>), Failed> {
    let mut conn = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let io = |e: std::io::Error| format!("{method} {command}: {e}");
    conn.write_all(
        format!("{method} /api/v1/{command} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n")
            .as_bytes(),
    )
    .map_err(io)?;
    if let Some(body) = body {
        conn.write_all(format!("Content-Length: {}\r\n", body.len()).as_bytes())
            .map_err(io)?;
    }
    conn.write_all(b"\r\n").map_err(io)?;
    if let Some(body) = body {
        conn.write_all(body.as_bytes()).map_err(io)?;
    }
    vmm::api::ch_client::read_answer(&mut conn)
        .map_err(|e| format!("{method} {command}: {e}").into())
}

/// ch-remote's command, failing unless it answers `want`; the body as JSON (`Null` if none).
fn expect(
    socket: &Path,
    method: &str,
    command: &str,
    body: Option<&str>,
    want: u16,
) -> Result<Value, Failed> {
    let (status, text) = ch_remote(socket, method, command, body)?;
    if status != want {
        return Err(format!("{method} {command}: {status}, want {want}: {text:?}").into());
    }
    match text {
        Some(text) if !text.is_empty() => {
            serde_json::from_str(&text).map_err(|e| format!("{command}: {e}: {text}").into())
        }
        _ => Ok(Value::Null),
    }
}

/// A connection of Go's HTTP client (Go's net/http transport writes a request whole, with
/// `User-Agent` and `Accept-Encoding`, and reuses the connection for the next request).
struct GoClient {
    conn: UnixStream,
}

impl GoClient {
    fn connect(socket: &Path) -> Result<Self, Failed> {
        let conn = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        Ok(Self { conn })
    }

    /// One request; the status and the body of the answer, read by its Content-Length.
    fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, String), Failed> {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: Go-http-client/1.1\r\n"
        );
        if let Some(body) = body {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("Accept-Encoding: gzip\r\n\r\n");
        req.push_str(body.unwrap_or_default());
        self.conn
            .write_all(req.as_bytes())
            .map_err(|e| format!("send: {e}"))?;
        let (head, body) =
            read_by_length(&mut self.conn).map_err(|e| format!("{method} {path}: {e}"))?;
        if head.contains("Connection: close") {
            return Err(
                format!("{method} {path}: lull closes a kept-alive connection: {head}").into(),
            );
        }
        let status = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("status line: {head}"))?;
        Ok((status, body))
    }

    fn expect(
        &mut self,
        method: &str,
        endpoint: &str,
        body: Option<&str>,
        want: u16,
    ) -> Result<String, Failed> {
        let (status, text) = self.call(method, &format!("/api/v1/{endpoint}"), body)?;
        if status != want {
            return Err(format!("{method} {endpoint}: {status}, want {want}: {text}").into());
        }
        Ok(text)
    }
}

/// Reads one answer as Go's client does: the head, then the body by its Content-Length.
fn read_by_length(conn: &mut UnixStream) -> Result<(String, String), String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => return Err("the connection closed".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
    let head = String::from_utf8(head).map_err(|e| e.to_string())?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(Ok(0), str::parse)
        .map_err(|e| format!("Content-Length: {e}"))?;
    let mut body = vec![0; length];
    conn.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok((head, String::from_utf8(body).map_err(|e| e.to_string())?))
}

/// A raw image of 1 MiB for a disk.
fn image(name: &str) -> Result<PathBuf, Failed> {
    let path = temp_path(&format!("{name}.img"));
    std::fs::write(&path, vec![0u8; 1 << 20]).map_err(|e| e.to_string())?;
    Ok(path)
}

fn path_form(socket: &Path) -> String {
    format!("path={}", socket.display())
}

fn bare_form(socket: &Path) -> String {
    socket.display().to_string()
}

/// `vm.info` until its state is `want` (the driver's waitForVMState), up to 30 s.
fn wait_state(go: &mut GoClient, want: &str) -> Result<Value, Failed> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: Value = serde_json::from_str(&go.expect("GET", "vm.info", None, 200)?)
            .map_err(|e| e.to_string())?;
        if info["state"] == want {
            return Ok(info);
        }
        if Instant::now() > deadline {
            return Err(format!("state never became {want}: {info}").into());
        }
        // The driver polls every second; this only spaces the queries.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Until the guest's LAPIC timer has fired at least `n` times in this run (it runs).
fn wait_guest_timers(go: &mut GoClient, n: u64) -> Result<u64, Failed> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let report = report_from(&go.expect("GET", "vm.counters", None, 200)?)?;
        let fires: u64 = report.vcpus.iter().map(|v| v.lapic_timer_fires).sum();
        if fires >= n {
            return Ok(fires);
        }
        if Instant::now() > deadline {
            return Err(format!("the guest's timers did not fire: {report:?}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The Nomad driver's VmConfig (ccheshirecat/nomad-driver-ch, buildVMConfig): the kit's
/// idle-sim as the kernel, its base image and a read-only cloud-init disk with a serial,
/// memory shared "for virtio-fs", console Null, serial to a file, an RNG. Its net needs a
/// tap and is left out here (see the fds test); its `fs` is refused (see the refusals).
fn driver_vm_config(name: &str) -> Result<(Value, PathBuf), Failed> {
    let serial = temp_path(&format!("{name}-serial.log"));
    let _ = std::fs::remove_file(&serial);
    let config = json!({
        "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
        "memory": {"size": 64u64 << 20, "shared": true},
        "console": {"mode": "Null"},
        "serial": {"mode": "File", "file": serial},
        "payload": {
            "kernel": kit_file("guests/idle-sim.elf")?,
            "cmdline": "duration_ms=600000",
        },
        "disks": [
            {"path": image(&format!("{name}-base"))?, "readonly": false},
            {"path": image(&format!("{name}-ci"))?, "readonly": true, "serial": "cloud-init"},
        ],
        "rng": {"src": "/dev/urandom"},
    });
    Ok((config, serial))
}

fn nomad_driver_creates_boots_polls_and_stops() -> Result<(), Failed> {
    let log = temp_path("ch-nomad.log");
    let _ = std::fs::remove_file(&log);
    let log_arg = log.display().to_string();
    let ch = Ch::start(
        "ch-nomad",
        bare_form,
        &["--log-file", &log_arg, "--seccomp", "true"],
    )?;
    let (config, _serial) = driver_vm_config("ch-nomad")?;
    let mut go = GoClient::connect(&ch.socket)?;
    go.expect("PUT", "vm.create", Some(&config.to_string()), 204)?;
    go.expect("PUT", "vm.boot", None, 204)?;
    let info = wait_state(&mut go, "Running")?;
    if info["config"] != config || info["memory_actual_size"] != 64u64 << 20 {
        return Err(format!("vm.info: {info}").into());
    }
    wait_guest_timers(&mut go, 10)?;
    go.expect("PUT", "vm.shutdown", None, 204)?;
    wait_state(&mut go, "Shutdown")?;
    let code = ch.terminate()?;
    if code != API_STOP {
        return Err(format!("exit {code}, want {API_STOP}").into());
    }
    let logged = std::fs::read_to_string(&log).map_err(|e| format!("--log-file: {e}"))?;
    if !logged.contains("VM booted through the API") {
        return Err(format!("--log-file holds no log: {logged}").into());
    }
    Ok(())
}

/// A driver that puts the VM on the command line: it runs at once; then ch-remote's
/// commands: ping, info, counters, power-button, reboot, delete, create, shutdown-vmm.
fn command_line_vm_runs_at_once_and_ch_remote_drives_it() -> Result<(), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?.display().to_string();
    let disk = format!("path={},readonly=on,serial=ro0", image("ch-cli")?.display());
    let ch = Ch::start(
        "ch-cli",
        path_form,
        &[
            "--kernel",
            &kernel,
            "--cmdline",
            "duration_ms=600000",
            "--cpus",
            "boot=2",
            "--memory",
            "size=67108864",
            "--disk",
            &disk,
            "--serial",
            "off",
            "--console",
            "off",
            "-v",
        ],
    )?;
    let s = ch.socket.clone();
    let ping = expect(&s, "GET", "vmm.ping", None, 200)?;
    let version = ping["version"].as_str().unwrap_or_default();
    if version
        .split('.')
        .filter(|p| p.parse::<u32>().is_ok())
        .count()
        != 3
    {
        return Err(format!("vmm.ping version {version:?} is not x.y.z").into());
    }
    let info = expect(&s, "GET", "vm.info", None, 200)?;
    if info["state"] != "Running" || info["memory_actual_size"] != 64u64 << 20 {
        return Err(format!("vm.info of the command line's VM: {info}").into());
    }
    let mut go = GoClient::connect(&s)?;
    wait_guest_timers(&mut go, 10)?;
    let refusal = expect(&s, "PUT", "vm.power-button", None, 405)?;
    if !refusal[0].as_str().is_some_and(|m| m.contains("ACPI")) {
        return Err(format!("vm.power-button: {refusal}").into());
    }
    expect(&s, "PUT", "vm.reboot", None, 204)?;
    // A new run: its counters start again, and its timers fire.
    wait_state(&mut go, "Running")?;
    wait_guest_timers(&mut go, 1)?;
    expect(&s, "PUT", "vm.delete", None, 204)?;
    expect(&s, "GET", "vm.info", None, 404)?;
    let again = json!({"payload": {"kernel": kernel, "cmdline": "duration_ms=600000"}});
    expect(&s, "PUT", "vm.create", Some(&again.to_string()), 204)?;
    expect(&s, "PUT", "vm.boot", None, 204)?;
    wait_guest_timers(&mut go, 1)?;
    expect(&s, "PUT", "vmm.shutdown", None, 204)?;
    let log = ch.log_text();
    let code = ch.exit_status()?;
    if code != API_STOP {
        return Err(format!("exit {code}, want {API_STOP}\n{log}").into());
    }
    if !log.contains("accepted without effect: --disk serial=ro0") {
        return Err(format!("-v does not note the accepted option:\n{log}").into());
    }
    Ok(())
}

/// `lull ch ...` runs a guest to its end like `lull run` (no API socket: Cloud Hypervisor
/// also boots at once with `--kernel` alone).
fn lull_ch_runs_a_guest_to_its_end() -> Result<(), Failed> {
    let kernel = kit_file("guests/hello.elf")?.display().to_string();
    let r = run_lull(
        &[
            "ch",
            "--kernel",
            &kernel,
            "--cpus",
            "boot=1",
            "--memory",
            "size=64M",
            "--serial",
            "tty",
            "--console",
            "off",
        ],
        Duration::from_secs(60),
    )?;
    // The guest passes with test-exit value 0: status (0 << 1) | 1.
    r.expect_code(1)?;
    r.expect_stdout("hello: PASS")
}

/// Each flag lull cannot honour: exit 2 and a message naming it; `--version` says x.y.z.
fn refused_flags_exit_2_naming_them() -> Result<(), Failed> {
    for (args, named) in [
        (&["--fs", "tag=a,socket=/s"][..], "--fs"),
        (&["--pmem", "file=/p"], "--pmem"),
        (&["--vsock", "cid=3,socket=/v"], "--vsock"),
        (&["--cpus", "boot=1,max=2"], "--cpus max=2"),
        (
            &["--memory", "size=1G,hugepages=on"],
            "--memory hugepages=on",
        ),
        (&["--console", "tty"], "--console tty"),
        (&["--serial", "pty"], "--serial pty"),
        (&["--net", "tap=t0,vhost_user=on"], "--net vhost_user=on"),
        (
            &["--device", "path=/sys/bus/pci/devices/0000:00:01.0"],
            "--device",
        ),
    ] {
        let mut argv = vec!["ch"];
        argv.extend_from_slice(args);
        let r = run_lull(&argv, Duration::from_secs(30))?;
        r.expect_code(USAGE)?;
        if !r.stderr.contains(named) {
            return Err(
                format!("{args:?}: the message does not name {named}: {}", r.stderr).into(),
            );
        }
    }
    let out = Command::new(cloud_hypervisor("ch-version")?)
        .arg("--version")
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.strip_prefix('v'))
        .unwrap_or_default();
    if !out.status.success()
        || version
            .split('.')
            .filter(|p| p.parse::<u32>().is_ok())
            .count()
            != 3
    {
        return Err(format!("--version: {text:?}").into());
    }
    Ok(())
}

/// Each VmConfig field lull refuses (Cloud Hypervisor's names and values, as its OpenAPI
/// description cloud-hypervisor/vmm/src/api/openapi/cloud-hypervisor.yaml has them), alone
/// in a body that is otherwise good.
const REFUSED_FIELDS: [(&str, &str); 17] = [
    ("payload", r#"{"kernel": "KERNEL", "firmware": "/fw"}"#),
    ("cpus", r#"{"boot_vcpus": 1, "max_vcpus": 4}"#),
    (
        "cpus",
        r#"{"boot_vcpus": 1, "topology": {"threads_per_core": 2}}"#,
    ),
    ("memory", r#"{"size": 67108864, "hugepages": true}"#),
    (
        "memory",
        r#"{"size": 67108864, "hotplug_size": 1073741824}"#,
    ),
    ("disks", r#"[{"path": "/d", "vhost_user": true}]"#),
    ("disks", r#"[{"path": "/d", "num_queues": 4}]"#),
    ("net", r#"[{"tap": "t0", "mtu": 9000}]"#),
    ("serial", r#"{"mode": "Pty"}"#),
    ("console", r#"{"mode": "Tty"}"#),
    (
        "fs",
        r#"[{"tag": "x", "socket": "/s", "num_queues": 1, "queue_size": 1024}]"#,
    ),
    ("pmem", r#"[{"file": "/p"}]"#),
    ("vsock", r#"{"cid": 3, "socket": "/v"}"#),
    (
        "devices",
        r#"[{"path": "/sys/bus/pci/devices/0000:00:01.0"}]"#,
    ),
    ("numa", r#"[{"guest_numa_id": 0}]"#),
    ("balloon", r#"{"size": 0}"#),
    ("watchdog", "true"),
];

fn every_refused_vm_config_field_is_a_400_naming_it() -> Result<(), Failed> {
    let ch = Ch::start("ch-refused", path_form, &[])?;
    let kernel = kit_file("guests/hello.elf")?.display().to_string();
    for (field, value) in REFUSED_FIELDS {
        let value = value.replace("KERNEL", &kernel);
        let body = if field == "payload" {
            format!(r#"{{"payload": {value}}}"#)
        } else {
            format!(r#"{{"payload": {{"kernel": "{kernel}"}}, "{field}": {value}}}"#)
        };
        let messages = expect(&ch.socket, "PUT", "vm.create", Some(&body), 400)?;
        let named = messages.as_array().is_some_and(|m| {
            m.iter()
                .any(|m| m.as_str().is_some_and(|m| m.contains(field)))
        });
        if !named {
            return Err(format!("{body}: the 400 does not name {field}: {messages}").into());
        }
        expect(&ch.socket, "GET", "vm.info", None, 404)?;
    }
    // Nothing was created: a good body still is.
    let good = json!({"payload": {"kernel": kernel}, "console": {"mode": "Off"}});
    expect(&ch.socket, "PUT", "vm.create", Some(&good.to_string()), 204)?;
    let info = expect(&ch.socket, "GET", "vm.info", None, 200)?;
    if info["config"] != good || info["state"] != "Created" {
        return Err(format!("vm.info: {info}").into());
    }
    shutdown_vmm(ch, 0)
}

/// ch-remote's `shutdown-vmm`, then lull's exit status must be `want`.
fn shutdown_vmm(ch: Ch, want: i32) -> Result<(), Failed> {
    expect(&ch.socket, "PUT", "vmm.shutdown", None, 204)?;
    match ch.exit_status()? {
        code if code == want => Ok(()),
        code => Err(format!("exit {code}, want {want}").into()),
    }
}

/// Runs a command to completion; fails with its output unless it succeeds.
fn sh(program: &str, args: &[&str]) -> Result<(), Failed> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    )
    .into())
}

/// Why the tap tests cannot run here (they create a tap: root and `ip`), if they cannot.
fn taps_unavailable() -> Option<String> {
    if let Some(reason) = lull_tests::kvm_unavailable() {
        return Some(reason);
    }
    let uid = Command::new("id").arg("-u").output().ok();
    if uid.is_none_or(|o| String::from_utf8_lossy(&o.stdout).trim() != "0") {
        return Some("needs root (creates a tap)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("needs `ip` (iproute2)".into()),
    }
}

/// A tap of this test's own (no address, so no route on the host); deleted on drop.
struct TestTap(String);

impl TestTap {
    /// The tap `lullch<pid><tag>` (a tag per test: tests run in parallel).
    fn new(tag: char) -> Result<Self, Failed> {
        let name = format!("lullch{}{tag}", std::process::id() % 100_000);
        let _ = sh("ip", &["link", "del", &name]);
        sh("ip", &["tuntap", "add", "dev", &name, "mode", "tap"])?;
        Ok(Self(name))
    }
}

impl Drop for TestTap {
    fn drop(&mut self) {
        let _ = sh("ip", &["link", "del", &self.0]);
    }
}

/// ch-remote's `add-net` (and Kata's): the request's first write carries the fds.
fn add_net_with_fds(
    socket: &Path,
    body: &str,
    fds: &[std::os::fd::RawFd],
) -> Result<(u16, String), Failed> {
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let mut conn = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let first = b"PUT /api/v1/vm.add-net HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n";
    conn.send_with_fds(&[&first[..]], fds)
        .map_err(|e| format!("send the fds: {e}"))?;
    let rest = format!("Content-Length: {}\r\n\r\n{body}", body.len());
    conn.write_all(rest.as_bytes()).map_err(|e| e.to_string())?;
    let (head, body) = read_by_length(&mut conn).map_err(|e| format!("vm.add-net: {e}"))?;
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or("status line")?;
    Ok((status, body))
}

/// Kata's sequence (kata-containers src/runtime/virtcontainers/clh.go: vm.create, then each
/// network endpoint's tap fd sent with vm.add-net, then vm.boot): the VM boots with a
/// virtio-net device on the tap behind the fd.
fn tap_fd_sent_with_add_net_backs_the_vm_s_net() -> Result<(), Failed> {
    let tap = TestTap::new('a')?;
    let fd = vmm::host::sys::tap::Tap::open(&tap.0).map_err(|e| e.to_string())?;
    let ch = Ch::start("ch-addnet", path_form, &[])?;
    let kernel = kit_file("guests/idle-sim.elf")?;
    let create = json!({"payload": {"kernel": kernel, "cmdline": "duration_ms=600000"},
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1}, "memory": {"size": 64u64 << 20}});
    expect(
        &ch.socket,
        "PUT",
        "vm.create",
        Some(&create.to_string()),
        204,
    )?;
    use std::os::fd::AsRawFd;
    let body = r#"{"mac": "52:54:00:00:00:42", "num_queues": 2, "queue_size": 256}"#;
    let (status, text) = add_net_with_fds(&ch.socket, body, &[fd.as_raw_fd()])?;
    if status != 204 {
        return Err(format!("vm.add-net with the tap fd: {status} {text}").into());
    }
    // lull holds its own copy: the test's may go.
    drop(fd);
    let info = expect(&ch.socket, "GET", "vm.info", None, 200)?;
    if info["config"]["net"][0]["tap"] != tap.0.as_str() {
        return Err(format!("vm.info after vm.add-net: {info}").into());
    }
    expect(&ch.socket, "PUT", "vm.boot", None, 204)?;
    let mut go = GoClient::connect(&ch.socket)?;
    wait_guest_timers(&mut go, 1)?;
    let report = report_from(&go.expect("GET", "vm.counters", None, 200)?)?;
    let nets: Vec<(&str, &str)> = report
        .nets
        .iter()
        .map(|n| (n.tap.as_str(), n.mac.as_str()))
        .collect();
    if nets != [(tap.0.as_str(), "52:54:00:00:00:42")] {
        return Err(format!("the running VM's nets: {nets:?}").into());
    }
    // No hotplug: after boot, vm.add-net is refused.
    let (status, _) = add_net_with_fds(&ch.socket, body, &[])?;
    if status != 405 {
        return Err(format!("vm.add-net after boot: {status}, want 405").into());
    }
    shutdown_vmm(ch, API_STOP)
}

/// Flintlock's form: `--net fd=N,mac=..` with the tap's fd inherited (here as fd 0), and
/// `--memory size=NM,shared=on`, `-v`: the VM runs at once on that tap.
fn inherited_tap_fd_backs_the_vm_s_net() -> Result<(), Failed> {
    let tap = TestTap::new('b')?;
    let fd = vmm::host::sys::tap::Tap::open(&tap.0).map_err(|e| e.to_string())?;
    let kernel = kit_file("guests/idle-sim.elf")?.display().to_string();
    let socket = temp_path("ch-netfd.sock");
    let _ = std::fs::remove_file(&socket);
    let mut child = Command::new(cloud_hypervisor("ch-netfd")?)
        .arg("--api-socket")
        .arg(&socket)
        .args(["--kernel", &kernel, "--cmdline", "duration_ms=600000"])
        .args(["--memory", "size=64M,shared=on", "-v"])
        .args(["--net", "fd=0,mac=52:54:00:00:00:44"])
        .stdin(Stdio::from(fd.into_fd()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start cloud-hypervisor: {e}"))?;
    let ch = Ch {
        child: None,
        socket: socket.clone(),
        log: mpsc::channel().1,
    };
    let ran = (|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&socket).is_err() {
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                return Err(Failed::from("no API socket"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut go = GoClient::connect(&socket)?;
        wait_guest_timers(&mut go, 1)?;
        let report = report_from(&go.expect("GET", "vm.counters", None, 200)?)?;
        let nets: Vec<(&str, &str)> = report
            .nets
            .iter()
            .map(|n| (n.tap.as_str(), n.mac.as_str()))
            .collect();
        if nets != [(tap.0.as_str(), "52:54:00:00:00:44")] {
            return Err(format!("the VM's nets: {nets:?}").into());
        }
        expect(&socket, "PUT", "vmm.shutdown", None, 204)?;
        Ch::wait(&mut child)
    })();
    if ran.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(ch);
    match ran? {
        API_STOP => Ok(()),
        code => Err(format!("exit {code}, want {API_STOP}").into()),
    }
}

/// An fd that is not a tap, two fds, an fd number in the body, or nothing at all: each a 400
/// that says so, and the created VM is left as it was.
fn add_net_refuses_a_bad_fd() -> Result<(), Failed> {
    use std::os::fd::AsRawFd;
    let ch = Ch::start("ch-badfd", path_form, &[])?;
    let kernel = kit_file("guests/hello.elf")?;
    let create = json!({"payload": {"kernel": kernel}});
    expect(
        &ch.socket,
        "PUT",
        "vm.create",
        Some(&create.to_string()),
        204,
    )?;
    let null = std::fs::File::open("/dev/null").map_err(|e| e.to_string())?;
    let body = r#"{"mac": "52:54:00:00:00:43"}"#;
    for (fds, body, says) in [
        (vec![null.as_raw_fd()], body, "not a tap"),
        (vec![null.as_raw_fd(), null.as_raw_fd()], body, "one tap fd"),
        (vec![], r#"{"fds": [0]}"#, "never a number in the body"),
        (vec![], body, "needs a tap"),
    ] {
        let (status, text) = add_net_with_fds(&ch.socket, body, &fds)?;
        if status != 400 || !text.contains(says) {
            return Err(format!("vm.add-net {fds:?} {body}: {status} {text}").into());
        }
    }
    let info = expect(&ch.socket, "GET", "vm.info", None, 200)?;
    if info["config"] != create || info["state"] != "Created" {
        return Err(format!("vm.info after the refusals: {info}").into());
    }
    shutdown_vmm(ch, 0)
}

/// `--api-socket fd=N`: the listening socket lull was started with (here its stdin, fd 0,
/// handed over without any unsafe code) serves the API; lull leaves its file to its owner.
/// A descriptor that is not a listening socket is refused (status 4) with the reason.
fn api_socket_fd_serves_an_inherited_listener() -> Result<(), Failed> {
    let path = temp_path("ch-fd.sock");
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).map_err(|e| e.to_string())?;
    let mut child = Command::new(cloud_hypervisor("ch-fd")?)
        .args(["--api-socket", "fd=0"])
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(listener)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start cloud-hypervisor: {e}"))?;
    let served = (|| {
        let ping = expect(&path, "GET", "vmm.ping", None, 200)?;
        if !ping["version"].is_string() {
            return Err(format!("vmm.ping: {ping}").into());
        }
        expect(&path, "PUT", "vmm.shutdown", None, 204)?;
        Ch::wait(&mut child)
    })();
    if served.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let code = served?;
    let left = path.exists();
    let _ = std::fs::remove_file(&path);
    if code != 0 || !left {
        return Err(format!("exit {code} (want 0), socket file kept: {left} (want true)").into());
    }
    let out = Command::new(cloud_hypervisor("ch-fd-bad")?)
        .args(["--api-socket", "fd=0"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let said = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(4) || !said.contains("not a Unix socket") {
        return Err(format!("--api-socket fd=0 on /dev/null: {:?} {said}", out.status).into());
    }
    Ok(())
}

/// Go's client keeps its connection: every request of a create/inspect/delete cycle on one.
fn keep_alive_serves_a_whole_cycle_on_one_connection() -> Result<(), Failed> {
    let ch = Ch::start("ch-keepalive", path_form, &[])?;
    let kernel = kit_file("guests/hello.elf")?.display().to_string();
    let create = json!({"payload": {"kernel": kernel}}).to_string();
    let mut go = GoClient::connect(&ch.socket)?;
    go.expect("GET", "vmm.ping", None, 200)?;
    go.expect("GET", "vm.info", None, 404)?;
    go.expect("PUT", "vm.create", Some(&create), 204)?;
    go.expect("GET", "vm.info", None, 200)?;
    go.expect("PUT", "vm.create", Some(r#"{"vsock": {"cid": 3}}"#), 400)?;
    go.expect("PUT", "vm.delete", None, 204)?;
    go.expect("GET", "vm.info", None, 404)?;
    go.expect("PUT", "vm.create", Some(&create), 204)?;
    go.expect("PUT", "vmm.shutdown", None, 204)?;
    match ch.exit_status()? {
        0 => Ok(()),
        code => Err(format!("exit {code}, want 0").into()),
    }
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        kvm_trial(
            "ch_nomad_driver_creates_boots_polls_and_stops",
            nomad_driver_creates_boots_polls_and_stops,
        ),
        kvm_trial(
            "ch_command_line_vm_runs_at_once_and_ch_remote_drives_it",
            command_line_vm_runs_at_once_and_ch_remote_drives_it,
        ),
        kvm_trial(
            "ch_lull_ch_runs_a_guest_to_its_end",
            lull_ch_runs_a_guest_to_its_end,
        ),
        Trial::test(
            "ch_refused_flags_exit_2_naming_them",
            refused_flags_exit_2_naming_them,
        ),
        Trial::test(
            "ch_every_refused_vm_config_field_is_a_400_naming_it",
            every_refused_vm_config_field_is_a_400_naming_it,
        ),
        Trial::ignorable_test("ch_tap_fd_sent_with_add_net_backs_the_vm_s_net", || {
            match taps_unavailable() {
                Some(reason) => Ok(lull_tests::Completion::ignored_with(reason)),
                None => tap_fd_sent_with_add_net_backs_the_vm_s_net()
                    .map(|()| lull_tests::Completion::Completed),
            }
        }),
        Trial::ignorable_test(
            "ch_inherited_tap_fd_backs_the_vm_s_net",
            || match taps_unavailable() {
                Some(reason) => Ok(lull_tests::Completion::ignored_with(reason)),
                None => inherited_tap_fd_backs_the_vm_s_net()
                    .map(|()| lull_tests::Completion::Completed),
            },
        ),
        Trial::test("ch_add_net_refuses_a_bad_fd", add_net_refuses_a_bad_fd),
        Trial::test(
            "ch_api_socket_fd_serves_an_inherited_listener",
            api_socket_fd_serves_an_inherited_listener,
        ),
        Trial::test(
            "ch_keep_alive_serves_a_whole_cycle_on_one_connection",
            keep_alive_serves_a_whole_cycle_on_one_connection,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
