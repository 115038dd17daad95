//! Clones of one snapshot, each on a tap of its own (issue 43): a restore gives the
//! snapshot's nets new host taps, by name (`lull run --restore DIR --net tap=NAME`) and by fds
//! sent with `vm.restore`'s `net_fds` (`SCM_RIGHTS`), the guest side kept.
//!
//! The kit's `virtio-net` guest ARPs for 10.0.2.1 once a second, five times, and passes on
//! the first reply. It is booted on tap A in a network namespace where nothing has 10.0.2.1
//! (no reply comes), paused while it asks (its first frame counted), snapshotted, and its lull
//! ended: the snapshot names tap A. Three clones are then restored from it at once, each in a
//! namespace of its own where its tap has 10.0.2.1/24:
//! - clone B: `lull run --restore DIR --resume --net tap=B`;
//! - clone C: `vm.restore` with `"net_fds": [{"id": "net0", "num_fds": 1}]` and tap C's fd
//!   sent with the request (the tap was opened, then moved into C's namespace); before it, a
//!   `vm.restore` naming a net the snapshot lacks is refused (400, naming it) and lull keeps
//!   no descriptor of the fd sent with it;
//! - clone D: `lull ch --api-socket S --restore source_url=...,resume=true,net_fds=[net0@[0]]`
//!   with tap D's fd inherited as lull's fd 0 (Cloud Hypervisor's `--restore` form).
//!
//! Each clone passes (only its own tap could answer), and its report counts frames each way
//! on its own tap under the snapshot's MAC (the one lull derived from A's name, which the
//! guest knows). A `--net` with another MAC is refused before any VM is built.
//!
//! Needs `/dev/kvm`, root and `ip` (iproute2); without them the test is reported as ignored
//! with the reason, never as passed.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lull_tests::exit_status::{API_STOP, BAD_INPUT, GUEST_PASS};
use lull_tests::{
    api_call, api_put_with_fds, kit_file, kvm_unavailable, lull_bin, report_from, run_lull_in, sh,
    start_api_server_in, temp_path, ApiLull, Arguments, Completion, Failed, Trial,
};

const DEADLINE: Duration = Duration::from_secs(60);

/// Why the test cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if let Some(reason) = kvm_unavailable() {
        return Some(reason);
    }
    let uid = Command::new("id").arg("-u").output().ok();
    if uid.is_none_or(|o| String::from_utf8_lossy(&o.stdout).trim() != "0") {
        return Some("needs root (network namespaces and taps)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("needs `ip` (iproute2: resources/ensure-apt.sh iproute2)".into()),
    }
}

/// A network namespace of this test's own; deleted, taps and all, on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Result<Self, Failed> {
        let name = format!("lull-{}-clone-{tag}", std::process::id());
        sh("ip", &["netns", "add", &name])?;
        let ns = Self { name };
        ns.exec("ip", &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip netns exec NS PROGRAM ARGS...`.
    fn exec(&self, program: &str, args: &[&str]) -> Result<String, Failed> {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    /// Makes `tap` (here, or moved in from the test's namespace with `moved`), up, with
    /// 10.0.2.1/24 if `answers`.
    fn tap(&self, tap: &str, moved: bool, answers: bool) -> Result<(), Failed> {
        if moved {
            sh("ip", &["link", "set", tap, "netns", &self.name])?;
        } else {
            self.exec("ip", &["tuntap", "add", "dev", tap, "mode", "tap"])?;
        }
        if answers {
            self.exec("ip", &["addr", "add", "10.0.2.1/24", "dev", tap])?;
        }
        self.exec("ip", &["link", "set", tap, "up"])?;
        Ok(())
    }

    /// The wrapper that runs lull inside the namespace.
    fn wrapper(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.name]
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh("ip", &["netns", "del", &self.name]);
    }
}

/// A tap in the test's own namespace until it is moved; deleted on drop if still here.
struct HostTap(String);

impl Drop for HostTap {
    fn drop(&mut self) {
        let _ = sh("ip", &["link", "del", &self.0]);
    }
}

/// A lull of the test's own: killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first net of the VM of the lull at `socket` (`vm.counters`): tap, MAC, frames sent by
/// the guest and received.
fn first_net(socket: &Path) -> Result<(String, String, u64, u64, i32), Failed> {
    let (status, body) = api_call(socket, "GET", "vm.counters", "")?;
    if status != 200 {
        return Err(format!("vm.counters: {status} {body}").into());
    }
    let report = report_from(&body)?;
    let net = report.nets.first().ok_or("the VM has no net")?;
    Ok((
        net.tap.clone(),
        net.mac.clone(),
        net.stats.tx_frames,
        net.stats.rx_frames,
        report.exit_status,
    ))
}

/// How many of process `pid`'s descriptors are open on /dev/net/tun.
fn tun_fds(pid: u32) -> Result<usize, Failed> {
    let dir = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
    Ok(entries
        .filter_map(Result::ok)
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|p| p == Path::new("/dev/net/tun")))
        .count())
}

/// Waits until `check` says yes about the first net of the lull at `socket`, or fails.
fn wait_net(
    socket: &Path,
    what: &str,
    check: impl Fn(&(String, String, u64, u64, i32)) -> bool,
) -> Result<(String, String, u64, u64, i32), Failed> {
    let end = Instant::now() + DEADLINE;
    loop {
        let net = first_net(socket)?;
        if check(&net) {
            return Ok(net);
        }
        if Instant::now() > end {
            return Err(format!("{what}: the VM's net is {net:?}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn clones_run_on_taps_of_their_own() -> Result<(), Failed> {
    let kernel = kit_file("guests/virtio-net.elf")?.display().to_string();
    let (tap_a, tap_b) = ("lullcloneA", "lullcloneB");
    // Taps C and D are opened in the test's namespace, so their names are unique on the host.
    let tap_c = HostTap(format!("lullcl{}c", std::process::id() % 100_000));
    let tap_d = HostTap(format!("lullcl{}d", std::process::id() % 100_000));
    let ns_a = Netns::new("a")?;
    ns_a.tap(tap_a, false, false)?;

    // The snapshot: the guest asks on tap A, which nothing answers.
    let first = ApiLull::from(start_api_server_in(
        &ns_a.wrapper(),
        "clone-taps-a",
        // No console: clone D's stdin is its tap.
        &[
            "--kernel",
            &kernel,
            "--net",
            &format!("tap={tap_a}"),
            "--serial",
            "off",
        ],
    )?);
    first.put("vm.boot", "")?;
    let (_, snapshot_mac, ..) = wait_net(first.socket(), "the guest's first ARP", |n| n.2 >= 1)?;
    first.put("vm.pause", "")?;
    let dir = first.snapshot_into("clone-taps-snapshot")?;
    first.shutdown(API_STOP)?;
    let manifest = std::fs::read_to_string(dir.join("manifest.json"))
        .map_err(|e| format!("the snapshot's manifest: {e}"))?;
    if !manifest.contains(&format!("tap={tap_a}")) {
        return Err(format!("the snapshot does not name tap {tap_a}: {manifest}").into());
    }
    let dir_arg = dir.display().to_string();

    // A MAC the guest does not know is refused before any VM is built.
    let refused = run_lull_in(
        &ns_a.wrapper(),
        &[
            "run",
            "--restore",
            &dir_arg,
            "--resume",
            "--net",
            &format!("tap={tap_a},mac=52:54:00:00:00:99"),
        ],
        DEADLINE,
    )?;
    refused.expect_code(BAD_INPUT)?;
    if !refused.stderr.contains(&snapshot_mac) {
        return Err(refused.failure("the refusal does not name the snapshot's MAC"));
    }

    let ns_b = Netns::new("b")?;
    ns_b.tap(tap_b, false, true)?;
    sh("ip", &["tuntap", "add", "dev", &tap_c.0, "mode", "tap"])?;
    let fd_c = vmm::host::sys::tap::Tap::open(&tap_c.0).map_err(|e| e.to_string())?;
    let ns_c = Netns::new("c")?;
    ns_c.tap(&tap_c.0, true, true)?;
    sh("ip", &["tuntap", "add", "dev", &tap_d.0, "mode", "tap"])?;
    let fd_d = vmm::host::sys::tap::Tap::open(&tap_d.0).map_err(|e| e.to_string())?;
    let ns_d = Netns::new("d")?;
    ns_d.tap(&tap_d.0, true, true)?;

    // Clone B, by name, on the command line; it runs while clone C is restored.
    let metrics_b = temp_path("clone-taps-b.json");
    let _ = std::fs::remove_file(&metrics_b);
    let clone_b = {
        let wrapper: Vec<String> = ns_b.wrapper().iter().map(|s| s.to_string()).collect();
        let args = [
            "run".to_string(),
            "--restore".to_string(),
            dir_arg.clone(),
            "--resume".to_string(),
            "--net".to_string(),
            format!("tap={tap_b}"),
            "--metrics".to_string(),
            metrics_b.display().to_string(),
        ];
        std::thread::spawn(move || {
            let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_lull_in(&wrapper, &args, DEADLINE)
        })
    };

    // Clone D, by lull's own fd 0, on Cloud Hypervisor's command line.
    let socket_d = temp_path("clone-taps-d.sock");
    let _ = std::fs::remove_file(&socket_d);
    let clone_d = Reaped(
        Command::new("ip")
            .args(&ns_d.wrapper()[1..])
            .arg(lull_bin())
            .arg("ch")
            .arg("--api-socket")
            .arg(&socket_d)
            .arg("--restore")
            .arg(format!(
                "source_url=file://{},resume=true,net_fds=[net0@[0]]",
                dir.display()
            ))
            .stdin(Stdio::from(fd_d.into_fd()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start lull ch: {e}"))?,
    );

    // Clone C, by fd, through the API.
    let server_c = start_api_server_in(&ns_c.wrapper(), "clone-taps-c", &[])?;
    let pid_c = server_c.child.id();
    let clone_c = ApiLull::from(server_c);
    let body = |id: &str| {
        format!(
            r#"{{"source_url": "file://{}", "resume": true, "net_fds": [{{"id": "{id}", "num_fds": 1, "fds": [-1]}}]}}"#,
            dir.display()
        )
    };
    let (status, answer) = api_put_with_fds(
        clone_c.socket(),
        "vm.restore",
        &body("net1"),
        &[fd_c.as_raw_fd()],
    )?;
    if status != 400 || !answer.contains("'net1' names no net") {
        return Err(format!("vm.restore naming net1: {status} {answer}").into());
    }
    // The refused request's fd is closed.
    let taps_held = tun_fds(pid_c)?;
    if taps_held != 0 {
        return Err(format!("after a refused vm.restore lull holds {taps_held} tap fd(s)").into());
    }
    let (status, answer) = api_put_with_fds(
        clone_c.socket(),
        "vm.restore",
        &body("net0"),
        &[fd_c.as_raw_fd()],
    )?;
    if status != 204 {
        return Err(format!("vm.restore with tap C's fd: {status} {answer}").into());
    }
    drop(fd_c);
    // ... and the one it takes is held (the refused one would have been counted too).
    if tun_fds(pid_c)? == 0 {
        return Err("the restored clone C holds no tap fd".into());
    }
    let net_c = wait_net(clone_c.socket(), "clone C's end", |n| n.4 != 0)?;
    let end = Instant::now() + DEADLINE;
    while UnixStream::connect(&socket_d).is_err() {
        if Instant::now() > end {
            return Err("clone D (lull ch --restore) never served its API".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let net_d = wait_net(&socket_d, "clone D's end", |n| n.4 != 0)?;
    drop(clone_d);

    let b = clone_b.join().map_err(|_| "clone B's thread panicked")??;
    let report_b = lull_tests::take_metrics(&metrics_b);
    b.expect_code(GUEST_PASS)?;
    let report_b = report_b?;
    let net_b = report_b.nets.first().ok_or("clone B has no net")?;
    let net_b = (
        net_b.tap.clone(),
        net_b.mac.clone(),
        net_b.stats.tx_frames,
        net_b.stats.rx_frames,
        report_b.exit_status,
    );
    for (clone, tap, net) in [
        ("B", tap_b, &net_b),
        ("C", tap_c.0.as_str(), &net_c),
        ("D", tap_d.0.as_str(), &net_d),
    ] {
        let (on, mac, tx, rx, exit) = net;
        if on != tap || *mac != snapshot_mac || *tx < 1 || *rx < 1 || *exit != GUEST_PASS {
            return Err(format!(
                "clone {clone}: net {net:?}, want tap {tap}, MAC {snapshot_mac}, frames each \
                 way, exit status {GUEST_PASS}"
            )
            .into());
        }
    }
    drop(clone_c);
    let _ = std::fs::remove_file(&socket_d);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![Trial::ignorable_test(
        "clones_run_on_taps_of_their_own",
        || match unavailable() {
            Some(reason) => Ok(Completion::ignored_with(reason)),
            None => clones_run_on_taps_of_their_own().map(|()| Completion::Completed),
        },
    )];
    libtest_mimic::run(&args, trials).exit();
}
