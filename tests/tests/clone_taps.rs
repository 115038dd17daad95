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
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lull_schema::RunReport;
use lull_tests::exit_status::{API_STOP, BAD_INPUT, GUEST_PASS};
use lull_tests::{
    api_call, api_put_with_fds, kit_file, kvm_unavailable, lull_bin, report_from, run_lull_in, sh,
    start_api_server_in, temp_path, ApiLull, Arguments, Completion, Failed, RunResult, Trial,
};
use vmm::host::sys::tap::Tap;

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

/// A VM's first net as a clone is checked on: tap, MAC, frames sent by the guest and
/// received, and the VM's exit status.
type Net = (String, String, u64, u64, i32);

/// The first net of the VM of the lull at `socket` (`vm.counters`).
fn first_net(socket: &Path) -> Result<Net, Failed> {
    let (status, body) = api_call(socket, "GET", "vm.counters", "")?;
    if status != 200 {
        return Err(format!("vm.counters: {status} {body}").into());
    }
    first_net_of(&report_from(&body)?)
}

/// The first net of the VM `report` reports on.
fn first_net_of(report: &RunReport) -> Result<Net, Failed> {
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
fn wait_net(socket: &Path, what: &str, check: impl Fn(&Net) -> bool) -> Result<Net, Failed> {
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

/// Boots the guest on `tap` in `ns`, pauses it while it asks (its first frame counted) and
/// snapshots it: the snapshot's directory and the guest's MAC.
fn snapshot_on(ns: &Netns, kernel: &str, tap: &str) -> Result<(PathBuf, String), Failed> {
    let first = ApiLull::from(start_api_server_in(
        &ns.wrapper(),
        "clone-taps-a",
        // No console: clone D's stdin is its tap.
        &[
            "--kernel",
            kernel,
            "--net",
            &format!("tap={tap}"),
            "--serial",
            "off",
        ],
    )?);
    first.put("vm.boot", "")?;
    let (_, mac, ..) = wait_net(first.socket(), "the guest's first ARP", |n| n.2 >= 1)?;
    first.put("vm.pause", "")?;
    let dir = first.snapshot_into("clone-taps-snapshot")?;
    first.shutdown(API_STOP)?;
    let manifest = std::fs::read_to_string(dir.join("manifest.json"))
        .map_err(|e| format!("the snapshot's manifest: {e}"))?;
    if !manifest.contains(&format!("tap={tap}")) {
        return Err(format!("the snapshot does not name tap {tap}: {manifest}").into());
    }
    Ok((dir, mac))
}

/// A `--net` with a MAC the guest does not know is refused before any VM is built, naming
/// the snapshot's.
fn another_mac_is_refused(ns: &Netns, dir: &str, tap: &str, mac: &str) -> Result<(), Failed> {
    let refused = run_lull_in(
        &ns.wrapper(),
        &[
            "run",
            "--restore",
            dir,
            "--resume",
            "--net",
            &format!("tap={tap},mac=52:54:00:00:00:99"),
        ],
        DEADLINE,
    )?;
    refused.expect_code(BAD_INPUT)?;
    if !refused.stderr.contains(mac) {
        return Err(refused.failure("the refusal does not name the snapshot's MAC"));
    }
    Ok(())
}

/// A tap made in the test's namespace, opened here, then moved into a namespace of its own
/// (where it answers): the tap, its namespace and its fd.
fn moved_tap(name: String, tag: &str) -> Result<(HostTap, Netns, Tap), Failed> {
    let tap = HostTap(name);
    sh("ip", &["tuntap", "add", "dev", &tap.0, "mode", "tap"])?;
    let fd = Tap::open(&tap.0).map_err(|e| e.to_string())?;
    let ns = Netns::new(tag)?;
    ns.tap(&tap.0, true, true)?;
    Ok((tap, ns, fd))
}

/// Clone B, by name, on the command line, in a thread (it runs while the others restore).
fn clone_by_name(
    ns: &Netns,
    dir: &str,
    tap: &str,
    metrics: &Path,
) -> JoinHandle<Result<RunResult, Failed>> {
    let wrapper: Vec<String> = ns.wrapper().iter().map(|s| s.to_string()).collect();
    let args = [
        "run".to_string(),
        "--restore".to_string(),
        dir.to_string(),
        "--resume".to_string(),
        "--net".to_string(),
        format!("tap={tap}"),
        "--metrics".to_string(),
        metrics.display().to_string(),
    ];
    std::thread::spawn(move || {
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_lull_in(&wrapper, &args, DEADLINE)
    })
}

/// Clone D, by lull's own fd 0 (`tap`), on Cloud Hypervisor's command line, serving its API
/// on `socket`.
fn clone_by_ch_fd(ns: &Netns, dir: &Path, tap: Tap, socket: &Path) -> Result<Reaped, Failed> {
    Ok(Reaped(
        Command::new("ip")
            .args(&ns.wrapper()[1..])
            .arg(lull_bin())
            .arg("ch")
            .arg("--api-socket")
            .arg(socket)
            .arg("--restore")
            .arg(format!(
                "source_url=file://{},resume=true,net_fds=[net0@[0]]",
                dir.display()
            ))
            .stdin(Stdio::from(tap.into_fd()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start lull ch: {e}"))?,
    ))
}

/// Clone C, by fd (`tap`), through the API: a `vm.restore` naming a net the snapshot lacks is
/// refused and its fd closed, then the one naming net0 takes the fd and holds it.
fn clone_by_api_fd(ns: &Netns, dir: &Path, tap: Tap) -> Result<ApiLull, Failed> {
    let server = start_api_server_in(&ns.wrapper(), "clone-taps-c", &[])?;
    let pid = server.child.id();
    let clone = ApiLull::from(server);
    let body = |id: &str| {
        format!(
            r#"{{"source_url": "file://{}", "resume": true, "net_fds": [{{"id": "{id}", "num_fds": 1, "fds": [-1]}}]}}"#,
            dir.display()
        )
    };
    let (status, answer) = api_put_with_fds(
        clone.socket(),
        "vm.restore",
        &body("net1"),
        &[tap.as_raw_fd()],
    )?;
    if status != 400 || !answer.contains("'net1' names no net") {
        return Err(format!("vm.restore naming net1: {status} {answer}").into());
    }
    // The refused request's fd is closed.
    let taps_held = tun_fds(pid)?;
    if taps_held != 0 {
        return Err(format!("after a refused vm.restore lull holds {taps_held} tap fd(s)").into());
    }
    let (status, answer) = api_put_with_fds(
        clone.socket(),
        "vm.restore",
        &body("net0"),
        &[tap.as_raw_fd()],
    )?;
    if status != 204 {
        return Err(format!("vm.restore with tap C's fd: {status} {answer}").into());
    }
    drop(tap);
    // ... and the one it takes is held (the refused one would have been counted too).
    if tun_fds(pid)? == 0 {
        return Err("the restored clone C holds no tap fd".into());
    }
    Ok(clone)
}

/// Clone D's net at its end, once its API serves.
fn net_at_end_of_ch_clone(socket: &Path) -> Result<Net, Failed> {
    let end = Instant::now() + DEADLINE;
    while UnixStream::connect(socket).is_err() {
        if Instant::now() > end {
            return Err("clone D (lull ch --restore) never served its API".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_net(socket, "clone D's end", |n| n.4 != 0)
}

/// Clone B's net from the report it wrote at its end (it must have passed).
fn net_of_clone_by_name(
    clone: JoinHandle<Result<RunResult, Failed>>,
    metrics: &Path,
) -> Result<Net, Failed> {
    let run = clone.join().map_err(|_| "clone B's thread panicked")??;
    let report = lull_tests::take_metrics(metrics);
    run.expect_code(GUEST_PASS)?;
    first_net_of(&report?)
}

fn clones_run_on_taps_of_their_own() -> Result<(), Failed> {
    let kernel = kit_file("guests/virtio-net.elf")?.display().to_string();
    let (tap_a, tap_b) = ("lullcloneA", "lullcloneB");
    let ns_a = Netns::new("a")?;
    ns_a.tap(tap_a, false, false)?;
    // The snapshot: the guest asks on tap A, which nothing answers.
    let (dir, snapshot_mac) = snapshot_on(&ns_a, &kernel, tap_a)?;
    let dir_arg = dir.display().to_string();
    another_mac_is_refused(&ns_a, &dir_arg, tap_a, &snapshot_mac)?;

    let ns_b = Netns::new("b")?;
    ns_b.tap(tap_b, false, true)?;
    // Taps C and D are opened in the test's namespace, so their names are unique on the host.
    let pid = std::process::id() % 100_000;
    let (tap_c, ns_c, fd_c) = moved_tap(format!("lullcl{pid}c"), "c")?;
    let (tap_d, ns_d, fd_d) = moved_tap(format!("lullcl{pid}d"), "d")?;

    let metrics_b = temp_path("clone-taps-b.json");
    let _ = std::fs::remove_file(&metrics_b);
    let clone_b = clone_by_name(&ns_b, &dir_arg, tap_b, &metrics_b);
    let socket_d = temp_path("clone-taps-d.sock");
    let _ = std::fs::remove_file(&socket_d);
    let clone_d = clone_by_ch_fd(&ns_d, &dir, fd_d, &socket_d)?;
    let clone_c = clone_by_api_fd(&ns_c, &dir, fd_c)?;
    let net_c = wait_net(clone_c.socket(), "clone C's end", |n| n.4 != 0)?;
    let net_d = net_at_end_of_ch_clone(&socket_d)?;
    drop(clone_d);
    let net_b = net_of_clone_by_name(clone_b, &metrics_b)?;
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
