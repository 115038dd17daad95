//! Helpers for lull's integration tests: find the built binary and the guest kit, run lull
//! with a deadline, and skip (never pass) tests that need `/dev/kvm` where it is missing.
//!
//! `make test` builds lull and the kit first and sets `LULL_BIN` and `LULL_KIT`; run by hand,
//! the tests look in `target/debug/lull` and `target/kit`.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_schema::RunReport;

pub mod libvirt;
pub mod netns;

pub use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The lull binary under test.
pub fn lull_bin() -> PathBuf {
    std::env::var_os("LULL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/lull"))
}

/// The guest kit directory.
pub fn kit_dir() -> PathBuf {
    std::env::var_os("LULL_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/kit"))
}

/// A file of the kit, or a failure that says how to build it.
pub fn kit_file(relative: &str) -> Result<PathBuf, Failed> {
    let path = kit_dir().join(relative);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: build the kit with `make guests linux`",
            path.display()
        )
        .into())
    }
}

/// The kit Linux kernel's command line with `extra` appended: its base line (`linux/cmdline`)
/// and its PVM-host workarounds (`linux/cmdline.pvm`) on every host, so that a test boots
/// the same way everywhere (the workarounds only turn CPU features off), minus the
/// `lull.workload=` that `cmdline.pvm` carries for `make run`.
pub fn linux_cmdline(extra: &str) -> Result<String, Failed> {
    let mut words = Vec::new();
    for name in ["linux/cmdline", "linux/cmdline.pvm"] {
        let path = kit_file(name)?;
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        words.extend(
            text.split_whitespace()
                .filter(|w| !w.starts_with("lull.workload="))
                .map(str::to_string),
        );
    }
    words.push(extra.to_string());
    Ok(words.join(" "))
}

/// A path in the temp directory unique to this test process and `name`.
pub fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("lull-test-{}-{name}", std::process::id()))
}

/// Reads and parses a JSON file (lull's `--metrics`, `lull bench --json`).
pub fn read_json(path: &Path) -> Result<serde_json::Value, Failed> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Runs `lull bench EXPERIMENT ARGS` with the kit, `--json` and `--work-dir` in a directory
/// of its own (`temp_path(name)`, removed after a good run); expects status 0 and returns the
/// JSON report and the run.
pub fn run_bench(
    name: &str,
    experiment: &str,
    args: &[&str],
    deadline: Duration,
) -> Result<(serde_json::Value, RunResult), Failed> {
    let dir = temp_path(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = dir.join("report.json");
    let text = |p: &Path| p.display().to_string();
    let (kit, json_arg, dir_arg) = (text(&kit_dir()), text(&json), text(&dir));
    let mut all = vec!["bench", experiment];
    all.extend_from_slice(args);
    all.extend(["--kit", &kit, "--json", &json_arg, "--work-dir", &dir_arg]);
    let r = run_lull(&all, deadline)?;
    r.expect_code(0)?;
    let v = read_json(&json)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((v, r))
}

/// Reads lull's `--metrics` JSON (checked by [`report_from`]).
pub fn read_report(path: &Path) -> Result<RunReport, Failed> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    report_from(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Reads lull's `--metrics` JSON (checked by [`report_from`]) and removes the file.
pub fn take_metrics(path: &Path) -> Result<RunReport, Failed> {
    let metrics = read_report(path);
    let _ = std::fs::remove_file(path);
    metrics
}

/// Parses a report lull wrote (`--metrics` pretty, `vm.counters` compact), checking that it is
/// exactly lull-schema's: written back the same way, it gives the same bytes (no key missing,
/// added or moved).
pub fn report_from(text: &str) -> Result<RunReport, String> {
    let report: RunReport = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let pretty = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    let compact = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    if text.trim_end() != pretty && text.trim_end() != compact {
        return Err(format!(
            "lull's report is not lull-schema's RunReport: lull wrote\n{text}\nthe schema \
             writes it back as\n{pretty}"
        ));
    }
    Ok(report)
}

/// Whether this host's KVM is PVM (the `kvm_pvm` module, docs/ENVIRONMENT.md), whose in-kernel
/// LAPIC and IOAPIC differ from KVM's on hardware virtualization in known ways (ISR bits never
/// set; one more level-triggered interrupt after the line is lowered). A test relaxes its
/// comparison with KVM's irqchip for those on such hosts only, and is strict elsewhere.
pub fn host_is_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// Why tests that boot guests cannot run here, if they cannot.
pub fn kvm_unavailable() -> Option<String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => None,
        Err(e) => Some(format!("needs /dev/kvm ({e})")),
    }
}

/// A test that boots a guest: reported as ignored, with the reason, where KVM is missing.
pub fn kvm_trial<F>(name: &str, body: F) -> Trial
where
    F: FnOnce() -> Result<(), Failed> + Send + 'static,
{
    Trial::ignorable_test(name, move || match kvm_unavailable() {
        Some(reason) => Ok(Completion::ignored_with(reason)),
        None => body().map(|()| Completion::Completed),
    })
}

/// What a lull run produced.
#[derive(Debug)]
pub struct RunResult {
    /// Exit status (`None` if it was killed at the deadline).
    pub status: Option<ExitStatus>,
    /// Standard output (the guest console).
    pub stdout: String,
    /// Standard error (lull's log).
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

impl RunResult {
    /// The exit code, or a failure if lull was killed or died by a signal.
    pub fn code(&self) -> Result<i32, Failed> {
        self.status
            .and_then(|s| s.code())
            .ok_or_else(|| self.failure("lull did not exit by itself"))
    }

    /// A failure message with the run's output attached.
    pub fn failure(&self, what: &str) -> Failed {
        format!(
            "{what}\n--- status: {:?} after {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
        .into()
    }

    /// Fails unless the console output contains `needle`.
    pub fn expect_stdout(&self, needle: &str) -> Result<(), Failed> {
        if self.stdout.contains(needle) {
            Ok(())
        } else {
            Err(self.failure(&format!("console output lacks {needle:?}")))
        }
    }

    /// Fails unless lull exited with `code`.
    pub fn expect_code(&self, code: i32) -> Result<(), Failed> {
        let got = self.code()?;
        if got == code {
            Ok(())
        } else {
            Err(self.failure(&format!("expected exit status {code}, got {got}")))
        }
    }
}

/// Runs lull with `args`, no stdin, and kills it after `deadline`.
pub fn run_lull(args: &[&str], deadline: Duration) -> Result<RunResult, Failed> {
    run_lull_in(&[], args, deadline)
}

/// [`run_lull`] under a wrapper command: `WRAPPER... lull ARGS...` (e.g. `ip netns exec NS`).
/// On the deadline the wrapper is killed, which `ip netns exec` passes on by exec'ing lull.
pub fn run_lull_in(
    wrapper: &[&str],
    args: &[&str],
    deadline: Duration,
) -> Result<RunResult, Failed> {
    let bin = lull_bin();
    if !bin.is_file() {
        return Err(format!(
            "{} is missing: build it with `cargo build -p lull` (make test does)",
            bin.display()
        )
        .into());
    }
    let start = Instant::now();
    // Its own process group, so that a deadline kills what it started too (`lull bench`'s VMs,
    // or lull under a wrapper that did not exec it).
    let mut child = lull_command(wrapper)
        .args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {wrapper:?} {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send(());
        status
    });
    let killed = rx.recv_timeout(deadline).is_err();
    if killed {
        // Deadline: kill lull and its children (a bench's VMs); the waiter then reaps lull.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status();
    }
    let status = waiter.join().map_err(|_| "waiter thread panicked")?.ok();
    let collect = |h: Option<std::thread::JoinHandle<String>>| {
        h.and_then(|h| h.join().ok()).unwrap_or_default()
    };
    Ok(RunResult {
        status: if killed { None } else { status },
        stdout: collect(stdout),
        stderr: collect(stderr),
        elapsed: start.elapsed(),
    })
}

/// `WRAPPER... lull` (lull alone when `wrapper` is empty), its arguments still to come.
fn lull_command(wrapper: &[&str]) -> Command {
    match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(lull_bin());
            c
        }
        None => Command::new(lull_bin()),
    }
}

fn drain<R: Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// A `lull run --api-socket` that announced its socket: the process, the socket, and the
/// lines of its log that follow the announcement.
pub struct ApiServer {
    /// The lull process (the caller kills or waits for it).
    pub child: Child,
    /// The socket it serves.
    pub socket: PathBuf,
    /// Its stderr, line by line, after the "management API on" line.
    pub log: mpsc::Receiver<String>,
}

/// Starts `lull run --api-socket SOCKET ARGS` (the socket a temp path named after `name`) and
/// waits up to 30 s for its "management API on" line; kills it if the line does not come.
pub fn start_api_server(name: &str, args: &[&str]) -> Result<ApiServer, Failed> {
    start_api_server_in(&[], name, args)
}

/// [`start_api_server`] under a wrapper command (e.g. `ip netns exec NS`, which exec's lull, so
/// that killing the child kills lull). The socket is a path, reachable from any namespace.
pub fn start_api_server_in(
    wrapper: &[&str],
    name: &str,
    args: &[&str],
) -> Result<ApiServer, Failed> {
    let socket = temp_path(&format!("{name}.sock"));
    let _ = std::fs::remove_file(&socket);
    let mut child = lull_command(wrapper)
        .args(["run", "--api-socket"])
        .arg(&socket)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", lull_bin().display()))?;
    let stderr = child.stderr.take().ok_or("no stderr pipe")?;
    let (tx, log) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match log.recv_timeout(left) {
            Ok(line) if line.contains("management API on") => {
                return Ok(ApiServer { child, socket, log })
            }
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("lull did not announce its API socket".into());
            }
        }
    }
}

/// A lull serving its API socket, owned by a test: killed on drop, so that a test that fails
/// early leaves no lull behind.
pub struct ApiLull {
    child: Option<Child>,
    socket: PathBuf,
}

impl From<ApiServer> for ApiLull {
    fn from(server: ApiServer) -> Self {
        Self {
            child: Some(server.child),
            socket: server.socket,
        }
    }
}

impl ApiLull {
    /// The socket it serves.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Fails unless `PUT endpoint` with `body` answers 204.
    pub fn put(&self, endpoint: &str, body: &str) -> Result<(), Failed> {
        api_put(&self.socket, endpoint, body)
    }

    /// [`snapshot_into`] on this lull.
    pub fn snapshot_into(&self, name: &str) -> Result<PathBuf, Failed> {
        snapshot_into(&self.socket, name)
    }

    /// `vmm.shutdown`, then waits up to 60 s for lull to exit; fails unless it exits with
    /// status `want` (a paused VM's lull stopped through the API: [`exit_status::API_STOP`]).
    pub fn shutdown(mut self, want: i32) -> Result<(), Failed> {
        self.put("vmm.shutdown", "")?;
        let mut child = self.child.take().ok_or("already ended")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(status)) if status.code() == Some(want) => Ok(()),
            Ok(Ok(status)) => {
                Err(format!("lull exited with {status} after vmm.shutdown, want {want}").into())
            }
            Ok(Err(e)) => Err(format!("waiting for lull: {e}").into()),
            Err(_) => Err("lull did not exit within 60 s of vmm.shutdown".into()),
        }
    }
}

impl Drop for ApiLull {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Fails unless `PUT endpoint` with `body` on the lull at `socket` answers 204.
pub fn api_put(socket: &Path, endpoint: &str, body: &str) -> Result<(), Failed> {
    let (status, text) = api_call(socket, "PUT", endpoint, body)?;
    if status != 204 {
        return Err(format!("PUT {endpoint}: status {status}: {text}").into());
    }
    Ok(())
}

/// `vm.snapshot` of the paused VM of the lull at `socket` into a fresh directory, the temp
/// path `name`: that path.
pub fn snapshot_into(socket: &Path, name: &str) -> Result<PathBuf, Failed> {
    let dir = temp_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let body = format!(r#"{{"destination_url": "file://{}"}}"#, dir.display());
    api_put(socket, "vm.snapshot", &body)?;
    Ok(dir)
}

/// The file of the snapshot in `dir` that its manifest names at `pointer` (a JSON pointer:
/// `/memory_file`, `/vcpus/1/file`, `/kvm_vm/file`): each snapshot names its files anew.
pub fn snapshot_file(dir: &Path, pointer: &str) -> Result<PathBuf, Failed> {
    let manifest = read_json(&dir.join("manifest.json"))?;
    let name = manifest
        .pointer(pointer)
        .and_then(|v| v.as_str())
        .ok_or_else(|| format!("no {pointer} in the manifest of {}", dir.display()))?;
    Ok(dir.join(name))
}

/// Waits for `line` in the console file `file` (re-read every 10 ms, as a guest appends to
/// it): its whole text. Fails, with that text, past `deadline` or as soon as it holds any of
/// `give_up_on` (a guest's own failure line).
pub fn wait_for_console(
    file: &Path,
    line: &str,
    give_up_on: &[&str],
    deadline: Duration,
) -> Result<String, Failed> {
    let end = Instant::now() + deadline;
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.contains(line) {
            return Ok(text);
        }
        if give_up_on.iter().any(|failure| text.contains(failure)) || Instant::now() > end {
            return Err(format!("no {line:?} on the console {}:\n{text}", file.display()).into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One request to a lull API socket (`Connection: close`): the status and the body.
pub fn api_call(
    socket: &Path,
    method: &str,
    endpoint: &str,
    body: &str,
) -> Result<(u16, String), Failed> {
    let request = format!(
        "{method} /api/v1/{endpoint} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    api_raw(socket, request.as_bytes())
}

/// Sends `bytes` as they are to a lull API socket and reads the answer until lull closes the
/// connection (up to 60 s): the status and the body.
pub fn api_raw(socket: &Path, bytes: &[u8]) -> Result<(u16, String), Failed> {
    use std::io::Write;
    let mut conn = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| format!("connect to {}: {e}", socket.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    conn.write_all(bytes).map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .map_err(|e| format!("receive: {e}"))?;
    let status = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// `PUT endpoint` with `body` on the lull at `socket`, `fds` sent by SCM_RIGHTS with the
/// request's first bytes, as Cloud Hypervisor's clients (ch-remote's `add-net`, Kata, libvirt)
/// send them, on a connection kept alive as theirs are; reads the answer by its length (up to
/// 60 s): the status and the body.
pub fn api_put_with_fds(
    socket: &Path,
    endpoint: &str,
    body: &str,
    fds: &[std::os::fd::RawFd],
) -> Result<(u16, String), Failed> {
    use std::io::Write;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let mut conn =
        std::os::unix::net::UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let first = format!("PUT /api/v1/{endpoint} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n");
    conn.send_with_fds(&[first.as_bytes()], fds)
        .map_err(|e| format!("send the fds: {e}"))?;
    let rest = format!("Content-Length: {}\r\n\r\n{body}", body.len());
    conn.write_all(rest.as_bytes()).map_err(|e| e.to_string())?;
    let (head, body) = read_by_length(&mut conn).map_err(|e| format!("{endpoint}: {e}"))?;
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {head:?}"))?;
    Ok((status, body))
}

/// Reads one answer as Go's client does: the head, then the body by its Content-Length.
pub fn read_by_length(
    conn: &mut std::os::unix::net::UnixStream,
) -> Result<(String, String), String> {
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

/// Runs a command to completion; fails with its output unless it succeeds.
pub fn sh(program: &str, args: &[&str]) -> Result<String, Failed> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{program} {args:?}: {}\n{text}", out.status).into())
    }
}

/// `lull run --restore DIR --resume --serial file=SERIAL` (the restored console given again:
/// a restore does not reuse the snapshot's own), killed after `deadline`.
pub fn run_restored(dir: &Path, serial: &Path, deadline: Duration) -> Result<RunResult, Failed> {
    let dir_arg = dir.display().to_string();
    let serial_flag = format!("file={}", serial.display());
    run_lull(
        &[
            "run",
            "--restore",
            &dir_arg,
            "--resume",
            "--serial",
            &serial_flag,
        ],
        deadline,
    )
}

/// lull's exit statuses as `docs/CLI.md` documents them: the contract the tests hold lull to,
/// written out here rather than taken from `vmm::exit_code`, so that a change of a status
/// fails the tests instead of passing with it.
pub mod exit_status {
    /// A guest that passed through the test port ((0 << 1) | 1).
    pub const GUEST_PASS: i32 = 1;
    /// A command line lull refuses (clap's usage error).
    pub const USAGE: i32 = 2;
    /// Input lull refuses (a path, a configuration, a snapshot).
    pub const BAD_INPUT: i32 = 4;
    /// A VM stopped by SIGINT or SIGTERM.
    pub const USER_STOP: i32 = 12;
    /// A VM stopped through the management API.
    pub const API_STOP: i32 = 14;
}
