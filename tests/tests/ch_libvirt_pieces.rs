//! What libvirt's Cloud Hypervisor driver (`src/ch/` of libvirt 11.3) asks of
//! `cloud-hypervisor`, asked of lull the way the driver asks it (issue 44):
//! - `cloud-hypervisor --version`, parsed as `chExtractVersion` parses it (`ch_conf.c`);
//! - started as `virCHMonitorNew` starts it (`ch_monitor.c`): `--api-socket fd=N` on a socket
//!   the driver bound and listens on, `--event-monitor path=FIFO`, whose reading end the driver
//!   opens (blocking) once the process runs, then reads records split as `virCHProcessEvents`
//!   splits them (`ch_events.c`: brace counting); a `shutdown` event is how it learns that the
//!   VM stopped;
//! - the vCPU threads found by their names (`vcpu0`, ...) in `/proc/PID/task/*/comm`
//!   (`virCHMonitorRefreshThreadInfo`).

use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use lull_tests::{api_call, kit_file, kvm_trial, lull_bin, temp_path};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

/// `chExtractVersion` and `chPreProcessVersionString`: the output must start with
/// `cloud-hypervisor `; then the text after the last `/`, without a leading `v`, cut at the
/// first `-`, is read as `major[.minor[.micro]]` (`virStringParseVersion`, trailing text
/// allowed). Returns major * 1000000 + minor * 1000 + micro.
fn libvirt_version(output: &str) -> Result<u64, String> {
    let rest = output
        .strip_prefix("cloud-hypervisor ")
        .ok_or("Unexpected output of cloud-hypervisor binary")?;
    let rest = rest.rsplit_once('/').map_or(rest, |(_, after)| after);
    let rest = rest.strip_prefix('v').unwrap_or(rest);
    let rest = rest.split_once('-').map_or(rest, |(before, _)| before);
    let mut parts = [0u64; 3];
    let mut text = rest;
    for (i, part) in parts.iter_mut().enumerate() {
        let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            if i == 0 {
                return Err(format!("Unable to parse cloud-hypervisor version: {rest}"));
            }
            break;
        }
        *part = digits.parse().map_err(|e| format!("{digits}: {e}"))?;
        text = &text[digits.len()..];
        match text.strip_prefix('.') {
            Some(after) => text = after,
            None => break,
        }
    }
    Ok(parts[0] * 1_000_000 + parts[1] * 1000 + parts[2])
}

fn version_is_what_libvirt_parses() -> Result<(), Failed> {
    for (as_name, args) in [
        ("lull", vec!["ch", "--version"]),
        ("cloud-hypervisor", vec!["--version"]),
    ] {
        let program = if as_name == "lull" {
            lull_bin()
        } else {
            let link = temp_path("chp-bin").join("cloud-hypervisor");
            let _ = std::fs::remove_dir_all(link.parent().ok_or("no parent")?);
            std::fs::create_dir_all(link.parent().ok_or("no parent")?)
                .map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(lull_bin(), &link).map_err(|e| e.to_string())?;
            link
        };
        let out = Command::new(&program)
            .args(&args)
            .env("LC_ALL", "C")
            .output()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = libvirt_version(&text)?;
        // libvirt needs 15 at least; 40 for restore with new tap fds (CH_RESTORE_WITH_NEW_TAPFDS).
        if !out.status.success() || version < 40_000_000 {
            return Err(format!("{as_name} --version: {text:?} reads as {version}").into());
        }
    }
    // The parser itself, on the examples of ch_conf.c.
    for (text, want) in [
        ("cloud-hypervisor v32.0.0", 32_000_000),
        ("cloud-hypervisor v33.0-104-ge0e3779e-dirty", 33_000_000),
        (
            "cloud-hypervisor testing/v32.0.131-1-ga5d6db5c-dirty",
            32_000_131,
        ),
    ] {
        if libvirt_version(text)? != want {
            return Err(format!("{text} does not read as {want}").into());
        }
    }
    Ok(())
}

/// One event record, as libvirt takes it.
#[derive(Debug, PartialEq)]
struct Event {
    source: String,
    event: String,
}

/// libvirt's side of the event monitor FIFO: opens its reading end (blocking, as
/// `virCHMonitorNew` does, so that lull's open of the writing end returns) and splits what it
/// reads into records by counting braces, as `virCHProcessEvents` does.
fn read_events(fifo: PathBuf) -> mpsc::Receiver<Result<Event, String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut file = match std::fs::File::open(&fifo) {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.send(Err(format!("open {}: {e}", fifo.display())));
                return;
            }
        };
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            let mut depth = 0usize;
            let mut start = None;
            let mut consumed = 0;
            for (i, &b) in pending.iter().enumerate() {
                if b == b'{' {
                    depth += 1;
                    if depth == 1 {
                        start = Some(i);
                    }
                } else if b == b'}' && depth > 0 {
                    depth -= 1;
                    if depth == 0 {
                        let doc = &pending[start.unwrap_or(0)..=i];
                        let parsed = serde_json::from_slice::<serde_json::Value>(doc)
                            .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(doc)))
                            .and_then(|v| {
                                let field = |k: &str| {
                                    v[k].as_str()
                                        .map(str::to_string)
                                        .ok_or_else(|| format!("no {k} in {v}"))
                                };
                                if !v["timestamp"]["secs"].is_u64()
                                    || !v["timestamp"]["nanos"].is_u64()
                                {
                                    return Err(format!("no timestamp secs/nanos in {v}"));
                                }
                                Ok(Event {
                                    source: field("source")?,
                                    event: field("event")?,
                                })
                            });
                        if tx.send(parsed).is_err() {
                            return;
                        }
                        consumed = i + 1;
                        start = None;
                    }
                }
            }
            pending.drain(..consumed);
        }
    });
    rx
}

/// lull started as libvirt starts `cloud-hypervisor`, and the driver's view of it.
struct Driven {
    child: Child,
    socket: PathBuf,
    fifo: PathBuf,
    events: mpsc::Receiver<Result<Event, String>>,
    log: mpsc::Receiver<String>,
}

impl Driven {
    /// Binds and listens on the API socket, makes the FIFO, starts lull with `--api-socket
    /// fd=3 --event-monitor path=FIFO` (the socket handed over as fd 3 by a shell, as
    /// virCommandPassFD does), and opens the FIFO's reading end.
    fn start(name: &str) -> Result<Self, Failed> {
        Self::start_with(name, "--event-monitor \"path=$1\"")
    }

    /// [`Driven::start`] with `monitor` as lull's event-monitor flag (`$1` is the FIFO's path;
    /// the shell may open it, as `4>"$1"`, for `fd=4`).
    fn start_with(name: &str, monitor: &str) -> Result<Self, Failed> {
        let socket = temp_path(&format!("{name}.sock"));
        let fifo = temp_path(&format!("{name}-event-monitor-fifo"));
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(&fifo);
        let listener = UnixListener::bind(&socket).map_err(|e| format!("bind: {e}"))?;
        nix::unistd::mkfifo(
            &fifo,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .map_err(|e| format!("mkfifo: {e}"))?;
        let mut child = Command::new("sh")
            .args([
                "-c",
                &format!("exec \"$0\" ch --api-socket fd=3 {monitor} -v 3<&0 </dev/null"),
            ])
            .arg(lull_bin())
            .arg(&fifo)
            .stdin(Stdio::from(OwnedFd::from(listener)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start lull: {e}"))?;
        let stderr = child.stderr.take().ok_or("no stderr pipe")?;
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let events = read_events(fifo.clone());
        Ok(Self {
            child,
            socket,
            fifo,
            events,
            log,
        })
    }

    /// The next event, or why there is none.
    fn next_event(&self) -> Result<Event, Failed> {
        match self.events.recv_timeout(DEADLINE) {
            Ok(Ok(e)) => Ok(e),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => {
                let log: Vec<String> = self.log.try_iter().collect();
                Err(format!(
                    "no event within {DEADLINE:?}; lull's log:\n{}",
                    log.join("\n")
                )
                .into())
            }
        }
    }

    /// Fails unless the next events are `want` (`source:event`), in order.
    fn expect(&self, want: &[&str]) -> Result<(), Failed> {
        for w in want {
            let e = self.next_event()?;
            let got = format!("{}:{}", e.source, e.event);
            if got != *w {
                return Err(format!("event {got}, want {w} (of {want:?})").into());
            }
        }
        Ok(())
    }

    fn put(&self, endpoint: &str, body: &str) -> Result<(), Failed> {
        let (status, text) = api_call(&self.socket, "PUT", endpoint, body)?;
        if status != 204 {
            return Err(format!("PUT {endpoint}: {status} {text}").into());
        }
        Ok(())
    }

    /// Waits up to the deadline for lull to exit: its exit code.
    fn wait(mut self) -> Result<Option<i32>, Failed> {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Ok(status.code());
            }
            if Instant::now() > end {
                return Err("lull did not exit".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.fifo);
    }
}

/// `virCHMonitorBuildVMJson` for a domain with 2 vCPUs, 256 MiB and a direct kernel.
fn libvirt_vm_json(kernel: &Path, cmdline: &str) -> String {
    json!({
        "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
        "memory": {"size": 268_435_456u64},
        "payload": {"kernel": kernel, "cmdline": cmdline},
    })
    .to_string()
}

/// The names of the threads of `pid` (`/proc/PID/task/*/comm`), as libvirt reads them.
fn thread_names(pid: u32) -> Result<Vec<String>, Failed> {
    let dir = format!("/proc/{pid}/task");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))? {
        let path = entry.map_err(|e| e.to_string())?.path().join("comm");
        if let Ok(name) = std::fs::read_to_string(&path) {
            names.push(name.trim_end().to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// The driver's life of a domain: start (vmm starting), create, boot, the vCPU threads by
/// name, suspend, resume, shutdown (the `vm:shutdown` libvirt stops the domain on), then the
/// SIGTERM of `virProcessAbort` (`vmm:shutdown`).
fn events_follow_the_vm_as_libvirt_reads_them() -> Result<(), Failed> {
    let lull = Driven::start("chp-events")?;
    lull.expect(&["vmm:starting"])?;
    let kernel = kit_file("guests/idle-sim.elf")?;
    lull.put("vm.create", &libvirt_vm_json(&kernel, "duration_ms=600000"))?;
    lull.put("vm.boot", "")?;
    lull.expect(&["vm:booting", "vm:booted"])?;
    // virCHMonitorRefreshThreadInfo: "vcpu" then the index, one per vCPU.
    let names = thread_names(lull.pid())?;
    let vcpus: Vec<&String> = names.iter().filter(|n| n.starts_with("vcpu")).collect();
    if vcpus != ["vcpu0", "vcpu1"] {
        return Err(format!("threads {names:?}: want vcpu0 and vcpu1 among them").into());
    }
    // Cloud Hypervisor's API description: resuming a VM that is not paused is 405; a method
    // the endpoint does not take is 405 with the methods it takes.
    let (status, text) = api_call(&lull.socket, "PUT", "vm.resume", "")?;
    if status != 405 {
        return Err(format!("vm.resume of a running VM: {status} {text}").into());
    }
    let answer = raw_exchange(
        &lull.socket,
        b"GET /api/v1/vm.boot HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )?;
    if !answer.starts_with("HTTP/1.1 405") || !answer.contains("\r\nAllow: PUT\r\n") {
        return Err(format!("GET vm.boot: {answer:?}").into());
    }
    lull.put("vm.pause", "")?;
    lull.expect(&["vm:pausing", "vm:paused"])?;
    lull.put("vm.resume", "")?;
    lull.expect(&["vm:resuming", "vm:resumed"])?;
    // virsh reboot: no shutdown in between (libvirt would stop the domain on it); on rebooted
    // libvirt reads vm.info again.
    lull.put("vm.reboot", "")?;
    lull.expect(&["vm:rebooting", "vm:booting", "vm:booted", "vm:rebooted"])?;
    lull.put("vm.shutdown", "")?;
    lull.expect(&["vm:shutdown"])?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(lull.pid()).map_err(|e| e.to_string())?),
        nix::sys::signal::Signal::SIGTERM,
    )
    .map_err(|e| e.to_string())?;
    lull.expect(&["vmm:shutdown"])?;
    lull.wait()?;
    Ok(())
}

/// Reads the pty at `path` (as `virsh console` does) until `want` appears: what was read.
fn read_pty_until(path: &str, want: &str) -> Result<String, Failed> {
    let file = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let (tx, rx) = mpsc::channel();
    let want_owned = want.to_string();
    std::thread::spawn(move || {
        let mut file = file;
        let mut text = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = file.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&text).contains(&want_owned) {
                break;
            }
        }
        let _ = tx.send(String::from_utf8_lossy(&text).into_owned());
    });
    let text = rx
        .recv_timeout(DEADLINE)
        .map_err(|_| format!("nothing with {want:?} on {path} within {DEADLINE:?}"))?;
    if !text.contains(want) {
        return Err(format!("{path} ended without {want:?}: {text:?}").into());
    }
    Ok(text)
}

/// `virCHMonitorBuildConsoleJson` for `<serial type='pty'>` and `<console type='pty'>`: both in
/// `Pty` mode; `vm.info` reports the pty in `config.serial.file` and `config.console.file`
/// (`virCHProcessUpdateConsole`; the same pty: lull has no virtio console), and the guest's
/// serial output is read from it. A console Pty with the serial port on a file is refused.
fn serial_and_console_pty_as_libvirt_asks() -> Result<(), Failed> {
    let lull = Driven::start("chp-pty")?;
    lull.expect(&["vmm:starting"])?;
    let kernel = kit_file("guests/idle-sim.elf")?;
    let mut create: serde_json::Value =
        serde_json::from_str(&libvirt_vm_json(&kernel, "duration_ms=600000"))
            .map_err(|e| e.to_string())?;
    create["console"] = json!({"mode": "Pty"});
    create["serial"] = json!({"mode": "File", "file": temp_path("chp-pty.serial")});
    let (status, text) = api_call(&lull.socket, "PUT", "vm.create", &create.to_string())?;
    if status != 400 || !text.contains("console Pty") {
        return Err(format!("console Pty with serial File: {status} {text}").into());
    }
    create["serial"] = json!({"mode": "Pty"});
    lull.put("vm.create", &create.to_string())?;
    lull.put("vm.boot", "")?;
    let (_, info) = api_call(&lull.socket, "GET", "vm.info", "")?;
    let info: serde_json::Value = serde_json::from_str(&info).map_err(|e| e.to_string())?;
    let serial = info["config"]["serial"]["file"]
        .as_str()
        .unwrap_or_default();
    let console = info["config"]["console"]["file"]
        .as_str()
        .unwrap_or_default();
    if !serial.starts_with("/dev/pts/") || console != serial {
        return Err(format!("vm.info: serial.file {serial:?}, console.file {console:?}").into());
    }
    read_pty_until(serial, "idle-sim: ")?;
    lull.put("vm.shutdown", "")?;
    lull.expect(&["vm:booting", "vm:booted", "vm:shutdown"])?;
    drop(lull);

    // `<console type='pty'>` alone: the serial port's pty is the console's.
    let lull = Driven::start("chp-console-pty")?;
    lull.expect(&["vmm:starting"])?;
    create
        .as_object_mut()
        .ok_or("not an object")?
        .remove("serial");
    lull.put("vm.create", &create.to_string())?;
    lull.put("vm.boot", "")?;
    let (_, info) = api_call(&lull.socket, "GET", "vm.info", "")?;
    let info: serde_json::Value = serde_json::from_str(&info).map_err(|e| e.to_string())?;
    let console = info["config"]["console"]["file"]
        .as_str()
        .unwrap_or_default();
    if !console.starts_with("/dev/pts/") || !info["config"]["serial"].is_null() {
        return Err(format!("vm.info with a console Pty alone: {info}").into());
    }
    read_pty_until(console, "idle-sim: ")?;
    Ok(())
}

/// `virsh console` both ways: the kit Linux's shell on the pty answers a command typed into it
/// (input reaches the guest's UART). Needs guest user space, which PVM hosts do not run.
fn a_shell_on_the_pty_answers() -> Result<(), Failed> {
    use std::io::Write;
    let lull = Driven::start("chp-pty-shell")?;
    lull.expect(&["vmm:starting"])?;
    let create = json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 268_435_456u64},
        "payload": {
            "kernel": kit_file("linux/vmlinux")?,
            "initramfs": kit_file("linux/initramfs.cpio.gz")?,
            "cmdline": lull_tests::linux_cmdline("")?,
        },
        "serial": {"mode": "Pty"},
    });
    lull.put("vm.create", &create.to_string())?;
    lull.put("vm.boot", "")?;
    let (_, info) = api_call(&lull.socket, "GET", "vm.info", "")?;
    let info: serde_json::Value = serde_json::from_str(&info).map_err(|e| e.to_string())?;
    let path = info["config"]["serial"]["file"]
        .as_str()
        .ok_or_else(|| format!("no serial.file in {info}"))?
        .to_string();
    read_pty_until(&path, "lull-init: ready")?;
    let mut pty = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| format!("{path}: {e}"))?;
    let reader = std::thread::spawn({
        let path = path.clone();
        move || read_pty_until(&path, "chp-42").map_err(|e| format!("{e:?}"))
    });
    std::thread::sleep(Duration::from_millis(500));
    pty.write_all(b"echo chp-$((6*7))\r")
        .map_err(|e| e.to_string())?;
    reader.join().map_err(|_| "reader panicked")??;
    Ok(())
}

/// `virsh save` then `virsh restore`: `vm.pause`, `vm.snapshot`, the lull killed; a new lull
/// started as libvirt starts it, `vm.restore` (raw, as `virCHProcessStartRestore` sends it),
/// then `vm.info`, which answers in Cloud Hypervisor's shape as before the snapshot, with the
/// restored VM's new pty (`virCHProcessSetup` reads it), and `vm.resume`: the guest runs to its
/// end (its own stop: `vm:shutdown`).
fn vm_info_keeps_its_shape_across_a_restore() -> Result<(), Failed> {
    let first = Driven::start("chp-save")?;
    first.expect(&["vmm:starting"])?;
    let kernel = kit_file("guests/idle-sim.elf")?;
    let mut create: serde_json::Value =
        serde_json::from_str(&libvirt_vm_json(&kernel, "duration_ms=1500"))
            .map_err(|e| e.to_string())?;
    create["serial"] = json!({"mode": "Pty"});
    create["console"] = json!({"mode": "Pty"});
    first.put("vm.create", &create.to_string())?;
    first.put("vm.boot", "")?;
    first.put("vm.pause", "")?;
    let dir = temp_path("chp-save-snapshot");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    first.put(
        "vm.snapshot",
        &json!({"destination_url": format!("file://{}", dir.display())}).to_string(),
    )?;
    first.expect(&[
        "vm:booting",
        "vm:booted",
        "vm:pausing",
        "vm:paused",
        "vm:snapshotting",
        "vm:snapshotted",
    ])?;
    drop(first);

    let second = Driven::start("chp-restore")?;
    second.expect(&["vmm:starting"])?;
    let body = json!({"source_url": format!("file://{}", dir.display())}).to_string();
    let request = format!(
        "PUT /api/v1/vm.restore HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    {
        use std::io::Write;
        let mut conn =
            std::os::unix::net::UnixStream::connect(&second.socket).map_err(|e| e.to_string())?;
        conn.write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 1023];
        let n = conn.read(&mut buf).map_err(|e| e.to_string())?;
        let answer = String::from_utf8_lossy(&buf[..n]);
        if !answer.starts_with("HTTP/1.1 204") {
            return Err(format!("vm.restore: {answer:?}").into());
        }
    }
    second.expect(&["vm:restoring", "vm:restored"])?;
    // Cloud Hypervisor's API description: restoring over a VM is 404.
    let (status, text) = api_call(&second.socket, "PUT", "vm.restore", &body)?;
    if status != 404 {
        return Err(format!("vm.restore over a VM: {status} {text}").into());
    }
    let (_, info) = api_call(&second.socket, "GET", "vm.info", "")?;
    let info: serde_json::Value = serde_json::from_str(&info).map_err(|e| e.to_string())?;
    let config = &info["config"];
    let serial = config["serial"]["file"].as_str().unwrap_or_default();
    if config["payload"]["kernel"].as_str() != kernel.to_str()
        || config["cpus"]["boot_vcpus"] != 2
        || !serial.starts_with("/dev/pts/")
        || config["console"]["file"].as_str() != Some(serial)
        || info["state"] != "Paused"
    {
        return Err(format!("vm.info after vm.restore: {info}").into());
    }
    std::fs::File::open(serial).map_err(|e| format!("{serial}: {e}"))?;
    second.put("vm.resume", "")?;
    second.expect(&["vm:resuming", "vm:resumed", "vm:shutdown"])?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Opens `/dev/net/tun` attached to the tap `tap` with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`
/// (as libvirt's `virNetDevTapCreate` does for an interface whose model is virtio) as fd 3,
/// then execs `args` (Python's ioctl, so that the test holds no `unsafe`).
const VNET_HDR_TAP_EXEC: &str = "import fcntl, os, struct, sys
fd = os.open('/dev/net/tun', os.O_RDWR)
fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH22x', sys.argv[1].encode(), 0x0002 | 0x1000 | 0x4000))
if fd != 3:
    os.dup2(fd, 3)
os.set_inheritable(3, True)
os.execv(sys.argv[2], sys.argv[2:])";

/// A tap fd with a virtio-net header (`IFF_VNET_HDR`), as libvirt gives one for `<model
/// type='virtio'/>`: the kit's virtio-net guest ARPs through it, in a network namespace of its
/// own, and gets the host's answer.
fn a_vnet_hdr_tap_fd_carries_frames() -> Result<(), Failed> {
    let ns = format!("lull-chp-{}", std::process::id());
    let _ = lull_tests::sh("ip", &["netns", "del", &ns]);
    lull_tests::sh("ip", &["netns", "add", &ns])?;
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = lull_tests::sh("ip", &["netns", "del", &self.0]);
        }
    }
    let ns = Ns(ns);
    let exec = |args: &[&str]| -> Result<String, Failed> {
        let mut all = vec!["netns", "exec", &ns.0];
        all.extend_from_slice(args);
        lull_tests::sh("ip", &all)
    };
    exec(&["ip", "link", "set", "lo", "up"])?;
    exec(&[
        "ip", "tuntap", "add", "dev", "lulltap0", "mode", "tap", "vnet_hdr",
    ])?;
    exec(&["ip", "addr", "add", "10.0.2.1/24", "dev", "lulltap0"])?;
    exec(&["ip", "link", "set", "lulltap0", "up"])?;
    let kernel = kit_file("guests/virtio-net.elf")?;
    let lull = lull_bin();
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0,
            "/usr/bin/python3",
            "-c",
            VNET_HDR_TAP_EXEC,
            "lulltap0",
        ])
        .arg(&lull)
        .arg("ch")
        .arg("--kernel")
        .arg(&kernel)
        .args(["--net", "fd=3,mac=52:54:00:12:34:56", "--serial", "tty"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run lull: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.contains("virtio-net: ARP reply from 10.0.2.1 is-at ")
        || !stdout.contains("virtio-net: PASS")
    {
        return Err(format!(
            "{}:\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

/// Sends `request` on a new connection and reads the answer until lull closes it.
fn raw_exchange(socket: &Path, request: &[u8]) -> Result<String, Failed> {
    use std::io::Write;
    let mut conn = std::os::unix::net::UnixStream::connect(socket).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    conn.write_all(request).map_err(|e| e.to_string())?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    Ok(answer)
}

/// Why the tap test cannot run here (it creates taps: root and `ip`), if it cannot.
fn taps_unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok();
    if uid.is_none_or(|o| String::from_utf8_lossy(&o.stdout).trim() != "0") {
        return Some("needs root (creates taps)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("needs `ip` (iproute2)".into()),
    }
}

/// A tap of this test's own, deleted on drop.
struct TestTap(String);

impl TestTap {
    fn new(tag: char) -> Result<Self, Failed> {
        let name = format!("lullchp{}{tag}", std::process::id() % 100_000);
        let _ = lull_tests::sh("ip", &["link", "del", &name]);
        lull_tests::sh("ip", &["tuntap", "add", "dev", &name, "mode", "tap"])?;
        Ok(Self(name))
    }
}

impl Drop for TestTap {
    fn drop(&mut self) {
        let _ = lull_tests::sh("ip", &["link", "del", &self.0]);
    }
}

/// `chProcessAddNetworkDevices`: on ONE connection, for each net, the whole request (headers
/// and `virCHMonitorBuildNetJson`'s body) in one sendmsg with the tap fd, then, within 500 ms,
/// one recv of at most 1023 bytes, which must hold the whole answer and start `HTTP/1.x 204`
/// (or 200); the next request follows on the same connection.
fn add_net_as_libvirt_sends_it() -> Result<(), Failed> {
    use std::os::fd::AsRawFd;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let lull = Driven::start("chp-add-net")?;
    lull.expect(&["vmm:starting"])?;
    let kernel = kit_file("guests/idle-sim.elf")?;
    lull.put("vm.create", &libvirt_vm_json(&kernel, "duration_ms=600000"))?;
    let taps = [TestTap::new('a')?, TestTap::new('b')?];
    let conn = std::os::unix::net::UnixStream::connect(&lull.socket).map_err(|e| e.to_string())?;
    for (i, tap) in taps.iter().enumerate() {
        let fd = vmm::host::sys::tap::Tap::open(&tap.0)
            .map_err(|e| e.to_string())?
            .into_fd();
        let body = json!({"id": format!("net_{i}"), "mac": format!("52:54:00:00:00:0{i}"), "num_queues": 2})
            .to_string();
        let request = format!(
            "PUT /api/v1/vm.add-net HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.send_with_fds(&[request.as_bytes()], &[fd.as_raw_fd()])
            .map_err(|e| format!("sendmsg: {e}"))?;
        drop(fd);
        let mut poll = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&conn),
            nix::poll::PollFlags::POLLIN,
        )];
        let ready = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(500u16))
            .map_err(|e| e.to_string())?;
        if ready != 1 {
            return Err(format!("net_{i}: no answer within 500 ms").into());
        }
        let mut buf = [0u8; 1023];
        let n = nix::sys::socket::recv(
            conn.as_raw_fd(),
            &mut buf,
            nix::sys::socket::MsgFlags::empty(),
        )
        .map_err(|e| e.to_string())?;
        let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
        let code = answer
            .strip_prefix("HTTP/1.")
            .and_then(|r| r.get(2..5))
            .and_then(|c| c.parse::<u16>().ok());
        if !matches!(code, Some(200 | 204)) {
            return Err(format!("net_{i}: {answer:?}").into());
        }
        // The answer was whole: its head ends in this read, and nothing of it is left behind.
        if !answer.ends_with("\r\n\r\n") {
            return Err(format!("net_{i}: more than one read's worth: {answer:?}").into());
        }
    }
    let (status, info) = api_call(&lull.socket, "GET", "vm.info", "")?;
    let info: serde_json::Value = serde_json::from_str(&info).map_err(|e| e.to_string())?;
    let nets = info["config"]["net"].as_array().map_or(0, Vec::len);
    if status != 200 || nets != 2 {
        return Err(format!("vm.info after two add-net: {status} {info}").into());
    }
    Ok(())
}

/// A guest that stops by itself (hello powers off) is a `vm:shutdown` too; and SIGTERM of a
/// running VM is `vm:shutdown` then `vmm:shutdown`.
fn the_guest_s_own_stop_and_sigterm_are_shutdown_events() -> Result<(), Failed> {
    let lull = Driven::start("chp-guest-stop")?;
    lull.expect(&["vmm:starting"])?;
    let hello = kit_file("guests/hello.elf")?;
    lull.put("vm.create", &libvirt_vm_json(&hello, ""))?;
    lull.put("vm.boot", "")?;
    lull.expect(&["vm:booting", "vm:booted", "vm:shutdown"])?;
    drop(lull);

    let lull = Driven::start("chp-sigterm")?;
    lull.expect(&["vmm:starting"])?;
    let kernel = kit_file("guests/idle-sim.elf")?;
    lull.put("vm.create", &libvirt_vm_json(&kernel, "duration_ms=600000"))?;
    lull.put("vm.boot", "")?;
    lull.expect(&["vm:booting", "vm:booted"])?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(lull.pid()).map_err(|e| e.to_string())?),
        nix::sys::signal::Signal::SIGTERM,
    )
    .map_err(|e| e.to_string())?;
    lull.expect(&["vm:shutdown", "vmm:shutdown"])?;
    lull.wait()?;
    Ok(())
}

/// `--event-monitor fd=N`: an inherited descriptor (here the FIFO, opened by the shell).
fn the_event_monitor_takes_an_inherited_fd() -> Result<(), Failed> {
    let lull = Driven::start_with("chp-events-fd", "--event-monitor fd=4 4>\"$1\"")?;
    lull.expect(&["vmm:starting"])?;
    let kernel = kit_file("guests/hello.elf")?;
    lull.put("vm.create", &libvirt_vm_json(&kernel, ""))?;
    lull.put("vm.boot", "")?;
    lull.expect(&["vm:booting", "vm:booted", "vm:shutdown"])?;
    lull.put("vmm.shutdown", "")?;
    lull.expect(&["vmm:shutdown"])?;
    Ok(())
}

/// `--event-monitor` without `--api-socket` is refused (exit 2), as are bad values.
fn the_event_monitor_needs_the_api_and_a_valid_target() -> Result<(), Failed> {
    for args in [
        vec![
            "ch",
            "--kernel",
            "/nonexistent",
            "--event-monitor",
            "path=/tmp/x",
        ],
        vec![
            "ch",
            "--api-socket",
            "path=/tmp/chp-nope.sock",
            "--event-monitor",
            "/tmp/x",
        ],
    ] {
        let out = Command::new(lull_bin())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.code() != Some(2) {
            return Err(format!(
                "{args:?}: {:?} {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test(
            "chp_version_is_what_libvirt_parses",
            version_is_what_libvirt_parses,
        ),
        Trial::test(
            "chp_the_event_monitor_needs_the_api_and_a_valid_target",
            the_event_monitor_needs_the_api_and_a_valid_target,
        ),
        kvm_trial(
            "chp_events_follow_the_vm_as_libvirt_reads_them",
            events_follow_the_vm_as_libvirt_reads_them,
        ),
        Trial::ignorable_test(
            "chp_add_net_as_libvirt_sends_it",
            || match taps_unavailable() {
                Some(reason) => Ok(libtest_mimic::Completion::ignored_with(reason)),
                None => {
                    add_net_as_libvirt_sends_it().map(|()| libtest_mimic::Completion::Completed)
                }
            },
        ),
        kvm_trial(
            "chp_serial_and_console_pty_as_libvirt_asks",
            serial_and_console_pty_as_libvirt_asks,
        ),
        Trial::ignorable_test("chp_a_shell_on_the_pty_answers", || {
            if let Some(reason) = lull_tests::kvm_unavailable() {
                return Ok(libtest_mimic::Completion::ignored_with(reason));
            }
            if lull_tests::host_is_pvm() {
                return Ok(libtest_mimic::Completion::ignored_with(
                    "PVM host: the kit Linux's user space (its shell) cannot run",
                ));
            }
            a_shell_on_the_pty_answers().map(|()| libtest_mimic::Completion::Completed)
        }),
        Trial::ignorable_test("chp_a_vnet_hdr_tap_fd_carries_frames", || {
            if let Some(reason) = lull_tests::kvm_unavailable().or_else(taps_unavailable) {
                return Ok(libtest_mimic::Completion::ignored_with(reason));
            }
            if !Path::new("/usr/bin/python3").exists() {
                return Ok(libtest_mimic::Completion::ignored_with(
                    "needs /usr/bin/python3 (opens the tap with IFF_VNET_HDR)",
                ));
            }
            a_vnet_hdr_tap_fd_carries_frames().map(|()| libtest_mimic::Completion::Completed)
        }),
        kvm_trial(
            "chp_the_event_monitor_takes_an_inherited_fd",
            the_event_monitor_takes_an_inherited_fd,
        ),
        kvm_trial(
            "chp_vm_info_keeps_its_shape_across_a_restore",
            vm_info_keeps_its_shape_across_a_restore,
        ),
        kvm_trial(
            "chp_the_guest_s_own_stop_and_sigterm_are_shutdown_events",
            the_guest_s_own_stop_and_sigterm_are_shutdown_events,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
