//! The `orchestrators` tests with file descriptors: tap fds sent with `vm.add-net` (Kata) or
//! inherited with `--net fd=N` (Flintlock), bad fds, and an inherited API socket.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_tests::{api_put_with_fds, kit_file, report_from, temp_path, Failed};
use serde_json::json;

use super::client::{
    cloud_hypervisor, expect, path_form, shutdown_vmm, wait_guest_timers, Ch, GoClient,
};
use super::API_STOP;

/// Runs a command to completion; fails with its output unless it succeeds.
pub fn sh(program: &str, args: &[&str]) -> Result<(), Failed> {
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
pub fn taps_unavailable() -> Option<String> {
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
pub struct TestTap(String);

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

/// Once the guest runs (its timers fire), its one net must be on `tap` with `mac`.
fn expect_one_net(socket: &Path, tap: &str, mac: &str) -> Result<(), Failed> {
    let mut go = GoClient::connect(socket)?;
    wait_guest_timers(&mut go, 1)?;
    let report = report_from(&go.expect("GET", "vm.counters", None, 200)?)?;
    let nets: Vec<(&str, &str)> = report
        .nets
        .iter()
        .map(|n| (n.tap.as_str(), n.mac.as_str()))
        .collect();
    if nets != [(tap, mac)] {
        return Err(format!("the running VM's nets: {nets:?}").into());
    }
    Ok(())
}

/// Kata's sequence (kata-containers src/runtime/virtcontainers/clh.go: vm.create, then each
/// network endpoint's tap fd sent with vm.add-net, then vm.boot): the VM boots with a
/// virtio-net device on the tap behind the fd.
pub fn tap_fd_sent_with_add_net_backs_the_vm_s_net() -> Result<(), Failed> {
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
    let (status, text) = api_put_with_fds(&ch.socket, "vm.add-net", body, &[fd.as_raw_fd()])?;
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
    expect_one_net(&ch.socket, &tap.0, "52:54:00:00:00:42")?;
    // No hotplug: after boot, vm.add-net is refused.
    let (status, _) = api_put_with_fds(&ch.socket, "vm.add-net", body, &[])?;
    if status != 405 {
        return Err(format!("vm.add-net after boot: {status}, want 405").into());
    }
    shutdown_vmm(ch, API_STOP)
}

/// Flintlock's form: `--net fd=N,mac=..` with the tap's fd inherited (here as fd 0), and
/// `--memory size=NM,shared=on`, `-v`: the VM runs at once on that tap.
pub fn inherited_tap_fd_backs_the_vm_s_net() -> Result<(), Failed> {
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
        expect_one_net(&socket, &tap.0, "52:54:00:00:00:44")?;
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
pub fn add_net_refuses_a_bad_fd() -> Result<(), Failed> {
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
        let (status, text) = api_put_with_fds(&ch.socket, "vm.add-net", body, &fds)?;
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
pub fn api_socket_fd_serves_an_inherited_listener() -> Result<(), Failed> {
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
