//! Integration tests: virtio-net over MMIO (`--net tap=NAME`) against the host's own network
//! stack. Each test makes a network namespace of its own (`ip netns add`, a unique name,
//! deleted on drop even when the test fails) holding a tap `lulltap0` with 10.0.2.1/24, up,
//! and runs lull inside it (`ip netns exec NS lull run ...`), so the host kernel answers the
//! guest and nothing outside the namespace sees a frame.
//!
//! - the kit's `virtio-net` guest (resources/guests/src/virtio-net.c) sends an ARP request for
//!   10.0.2.1 and checks the reply, under both irqchips; `--metrics` counts its frames;
//! - the kit's Linux configures eth0 from `ip=` (IP_PNP), sits in its idle workload, and the
//!   namespace pings it (`ping -c 2 -W 3 10.0.2.15`), under both irqchips;
//! - the same Linux, pinged, is paused, snapshotted and its lull ended; restored into a new
//!   lull in the same namespace (`--restore DIR --resume`), it answers pings again through the
//!   restored virtqueues, the device counts the frames with no drop, and the workload PASSes,
//!   under both irqchips (issue 31);
//! - a tap lull cannot use (missing, not a tap, named twice, a bad name) is refused before any
//!   guest runs, with a message that says why and the documented exit status.
//!
//! Tests that boot need `/dev/kvm`, root and `ip` (iproute2; `ping` from iputils-ping for the
//! Linux test); without them they are reported as ignored with the reason, never as passed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lull_schema::RunReport;
use lull_tests::exit_status::{API_STOP, BAD_INPUT, GUEST_PASS, USAGE};
use lull_tests::netns::{Netns, GUEST_ADDR, GUEST_IP_CONFIG, TAP};
use lull_tests::{
    kit_file, kvm_unavailable, linux_cmdline, lull_bin, run_lull, run_lull_in, start_api_server_in,
    temp_path, wait_for_console, ApiLull, Arguments, Completion, Failed, RunResult, Trial,
};

const DEADLINE: Duration = Duration::from_secs(60);
/// The tiny Linux kernel needs ~0.5-3 minutes to boot on a PVM host; allow 10.
const LINUX_DEADLINE: Duration = Duration::from_secs(600);
/// The idle workload's length across a restore (guest seconds, which run on through the pause
/// on PVM hosts): room for a ping, the snapshot, a new lull and a ping on a loaded host.
const RESTORE_WORKLOAD_SECONDS: u32 = 30;

/// Why the namespace tests cannot run here, if they cannot.
fn netns_unavailable() -> Option<String> {
    if let Some(reason) = kvm_unavailable() {
        return Some(reason);
    }
    let uid = Command::new("id").arg("-u").output().ok();
    let root = uid.is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return Some("needs root (network namespaces and taps)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("needs `ip` (iproute2: resources/ensure-apt.sh iproute2)".into()),
    }
}

/// A test that needs KVM, root and `ip`: reported as ignored, with the reason, without them.
fn netns_trial<F>(name: &str, body: F) -> Trial
where
    F: FnOnce() -> Result<(), Failed> + Send + 'static,
{
    Trial::ignorable_test(name, move || match netns_unavailable() {
        Some(reason) => Ok(Completion::ignored_with(reason)),
        None => body().map(|()| Completion::Completed),
    })
}

/// The kit's virtio-net guest ARPs for 10.0.2.1 and gets the host's answer; the run report
/// counts the frames each way on the device.
fn guest_gets_an_arp_reply(irqchip: &'static str) -> Result<(), Failed> {
    let kernel = kit_file("guests/virtio-net.elf")?.display().to_string();
    let ns = Netns::new(&format!("arp-{irqchip}"))?;
    let metrics = temp_path(&format!("net-{irqchip}.json"));
    let metrics_arg = metrics.display().to_string();
    let wrapper = ns.wrapper();
    let mut wrap = vec!["ip"];
    wrap.extend_from_slice(&wrapper);
    let r = run_lull_in(
        &wrap,
        &[
            "run",
            "--irqchip",
            irqchip,
            "--kernel",
            &kernel,
            "--net",
            &format!("tap={TAP}"),
            "--metrics",
            &metrics_arg,
        ],
        DEADLINE,
    )?;
    let report = lull_tests::take_metrics(&metrics);
    r.expect_stdout("virtio-net: ARP reply from 10.0.2.1 is-at ")?;
    r.expect_stdout("virtio-net: PASS")?;
    r.expect_code(1)?;
    // The guest prints the MAC lull gave it: the one derived from the tap's name.
    r.expect_stdout("mac 52:54:00:bc:84:f1")?;
    let report = report?;
    let net = report.nets.first().cloned().unwrap_or_default();
    let count = net.stats;
    if net.tap != TAP || count.tx_frames < 1 || count.rx_frames < 1 {
        return Err(r.failure(&format!("nets in the report: {:?}", report.nets)));
    }
    if count.tx_dropped + count.tx_errors + count.rx_dropped + count.rx_errors != 0 {
        return Err(r.failure(&format!("drops or errors: {net:?}")));
    }
    Ok(())
}

/// The kit's Linux brings eth0 up from `ip=` and answers the namespace's pings while its idle
/// workload runs; then the workload PASSes.
fn linux_answers_ping(irqchip: &'static str) -> Result<(), Failed> {
    let kernel = kit_file("linux/vmlinux")?;
    let ns = Netns::new(&format!("ping-{irqchip}"))?;
    let cmdline = linux_cmdline(&format!(
        "{GUEST_IP_CONFIG} lull.workload=idle,seconds=20,cpus=1"
    ))?;
    let mut child = Command::new("ip")
        .args(ns.wrapper())
        .arg(lull_bin())
        .args(["run", "--irqchip", irqchip, "--kernel"])
        .arg(&kernel)
        .args(["--cmdline", &cmdline, "--net", &format!("tap={TAP}")])
        .args(["--cpus", "1", "--memory", "64M"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start lull in {}: {e}", ns.name))?;
    let pid = child.id().to_string();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("lull-workload: start") {
                let _ = tx.send(());
            }
            lines.push(line);
        }
        lines.join("\n")
    });
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    let started = rx.recv_timeout(LINUX_DEADLINE).is_ok();
    let ping = if started {
        Some(ns.exec("ping", &["-c", "2", "-W", "3", GUEST_ADDR]))
    } else {
        None
    };
    // The workload ends the run by itself; past the deadline lull is killed.
    let (done_tx, done_rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = done_tx.send(());
        status
    });
    if done_rx.recv_timeout(Duration::from_secs(120)).is_err() {
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    }
    let status = waiter.join().map_err(|_| "waiter thread panicked")?;
    let out = reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let code = status.as_ref().ok().and_then(|s| s.code());
    let fail = |what: String| -> Failed {
        format!("{what}\n--- status: {status:?}\n--- stdout:\n{out}\n--- stderr:\n{err}").into()
    };
    if !started {
        return Err(fail("the workload never started".into()));
    }
    match ping {
        Some(Ok(text)) if text.contains("2 received") => {}
        Some(Ok(text)) => return Err(fail(format!("ping: {text}"))),
        Some(Err(e)) => return Err(fail(format!("ping failed: {}", e.message().unwrap_or("")))),
        None => unreachable!("ping runs once the workload started"),
    }
    for needle in ["IP-Config: Complete", "lull-workload: PASS"] {
        if !out.contains(needle) {
            return Err(fail(format!("console output lacks {needle:?}")));
        }
    }
    // The workload writes 0 to port 0xf4 on PASS: status (0 << 1) | 1.
    match code {
        Some(1) => Ok(()),
        other => Err(fail(format!("exit status {other:?}, want 1"))),
    }
}

/// The kit's Linux, eth0 up and answering pings, is paused, snapshotted and its lull ended;
/// restored into a new lull in the same namespace, it answers pings again and its workload
/// PASSes. The restored device must go on from the saved virtqueue indices: the receive
/// buffers the guest posted before the snapshot carry the first replies in, and a device back
/// at reset would ignore the guest's queue (no frame either way: the ping fails).
fn linux_answers_ping_across_a_restore(irqchip: &'static str) -> Result<(), Failed> {
    let name = format!("net-restore-{irqchip}");
    let ns = Netns::new(&format!("restore-{irqchip}"))?;
    let mut wrap = vec!["ip"];
    wrap.extend_from_slice(&ns.wrapper());
    let serial = temp_path(&format!("{name}.serial"));
    let _ = std::fs::remove_file(&serial);
    let serial_flag = format!("file={}", serial.display());
    let dir = snapshot_of_answering_linux(&ns, &wrap, &name, irqchip, &serial)?;

    // The restored lull runs until the workload ends; the namespace pings it meanwhile, for
    // up to 30 s (`-w`: it stops at the second reply), as the new lull comes up.
    let metrics = temp_path(&format!("{name}.json"));
    let restore_args = [
        "run".to_string(),
        "--restore".into(),
        dir.display().to_string(),
        "--resume".into(),
        "--metrics".into(),
        metrics.display().to_string(),
        "--serial".into(),
        serial_flag,
    ];
    let wrap_owned: Vec<String> = wrap.iter().map(|s| s.to_string()).collect();
    let restored = std::thread::spawn(move || {
        let wrap: Vec<&str> = wrap_owned.iter().map(String::as_str).collect();
        let args: Vec<&str> = restore_args.iter().map(String::as_str).collect();
        run_lull_in(&wrap, &args, LINUX_DEADLINE)
    });
    let after = ns.exec("ping", &["-c", "2", "-w", "30", GUEST_ADDR]);
    let run = restored
        .join()
        .map_err(|_| "the restore thread panicked")??;
    let report = lull_tests::take_metrics(&metrics);
    let console = std::fs::read_to_string(&serial).unwrap_or_default();
    restored_linux_answered(&run, after, report, &console)?;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&serial);
    Ok(())
}

/// The kit's Linux booted in `ns` (through `wrap`) on `irqchip`, its console in `serial`,
/// answering pings, paused, snapshotted and its lull ended: the snapshot.
fn snapshot_of_answering_linux(
    ns: &Netns,
    wrap: &[&str],
    name: &str,
    irqchip: &str,
    serial: &Path,
) -> Result<PathBuf, Failed> {
    let kernel = kit_file("linux/vmlinux")?.display().to_string();
    let cmdline = linux_cmdline(&format!(
        "{GUEST_IP_CONFIG} lull.workload=idle,seconds={RESTORE_WORKLOAD_SECONDS},cpus=1"
    ))?;
    let serial_flag = format!("file={}", serial.display());
    let net = format!("tap={TAP}");
    let first = ApiLull::from(start_api_server_in(
        wrap,
        name,
        &[
            "--irqchip",
            irqchip,
            "--kernel",
            &kernel,
            "--cmdline",
            &cmdline,
            "--net",
            &net,
            "--cpus",
            "1",
            "--memory",
            "64M",
            "--serial",
            &serial_flag,
        ],
    )?);
    first.put("vm.boot", "")?;
    wait_for_console(
        serial,
        "lull-workload: start",
        &["lull-workload: FAIL"],
        LINUX_DEADLINE,
    )?;
    let before = ns.exec("ping", &["-c", "2", "-W", "3", GUEST_ADDR])?;
    if !before.contains("2 received") {
        return Err(format!("ping before the snapshot: {before}").into());
    }
    first.put("vm.pause", "")?;
    let dir = first.snapshot_into(&format!("{name}.snapshot"))?;
    first.shutdown(API_STOP)?;
    Ok(dir)
}

/// The restored run `run` answered the namespace's pings (`ping`), its workload passed (its
/// `console`), and its `report` counts the replies out and the requests in on the tap,
/// nothing dropped.
fn restored_linux_answered(
    run: &RunResult,
    ping: Result<String, Failed>,
    report: Result<RunReport, Failed>,
    console: &str,
) -> Result<(), Failed> {
    let fail = |why: String| -> Failed {
        format!(
            "{why}\n--- restored lull's stderr:\n{}\n--- console:\n{console}",
            run.stderr
        )
        .into()
    };
    match ping {
        Ok(text) if text.contains("2 received") => {}
        Ok(text) => return Err(fail(format!("ping after the restore: {text}"))),
        Err(e) => {
            let why = e.message().unwrap_or("").to_string();
            return Err(fail(format!("ping after the restore failed: {why}")));
        }
    }
    if !console.contains("lull-workload: PASS") {
        return Err(fail("the restored workload did not pass".into()));
    }
    let code = run.code()?;
    if code != GUEST_PASS {
        return Err(fail(format!("lull exited with {code}, want {GUEST_PASS}")));
    }
    // The restored run's own counts: the replies out, the requests in, nothing dropped.
    let report = report.map_err(|e| fail(format!("metrics: {}", e.message().unwrap_or(""))))?;
    let device = report.nets.first().cloned().unwrap_or_default();
    let count = device.stats;
    if device.tap != TAP || count.tx_frames < 2 || count.rx_frames < 2 {
        return Err(fail(format!("nets in the report: {:?}", report.nets)));
    }
    if count.tx_dropped + count.tx_errors + count.rx_dropped + count.rx_errors != 0 {
        return Err(fail(format!("drops or errors: {device:?}")));
    }
    Ok(())
}

/// A `--net` lull cannot use is refused before any guest runs (no KVM needed), with a message
/// that says why and the documented status.
fn bad_nets_are_refused() -> Result<(), Failed> {
    let cases = vec![
        (
            vec!["--net", "tap=lull-none0"],
            BAD_INPUT,
            "Tap device lull-none0 does not exist",
        ),
        (
            vec!["--net", "tap=name-too-long-for-linux"],
            USAGE,
            "is not a tap device name",
        ),
        (
            vec!["--net", "tap=t0", "--net", "tap=t0"],
            BAD_INPUT,
            "Tap t0 is given to two --net devices",
        ),
        (
            vec!["--net", "tap=t0,mac=01:00:5e:00:00:01"],
            USAGE,
            "is not a unicast MAC address",
        ),
        (vec!["--net", "lulltap0"], USAGE, "Unknown --net option"),
    ];
    for (args, code, message) in cases {
        expect_refusal(&args, code, message)?;
    }
    Ok(())
}

/// Runs `lull run ARGS`; fails unless it exits with `code` and says `message` on stderr.
fn expect_refusal(args: &[&str], code: i32, message: &str) -> Result<(), Failed> {
    let mut argv = vec!["run"];
    argv.extend_from_slice(args);
    let r = run_lull(&argv, DEADLINE)?;
    if r.code()? != code || !r.stderr.contains(message) {
        return Err(r.failure(&format!(
            "{args:?}: want exit {code} and {message:?} on stderr"
        )));
    }
    Ok(())
}

/// The loopback device exists in every namespace and is no tap: lull must say so. Telling it
/// apart from a tap takes `/dev/net/tun` (`TUNSETIFF`); without it the test is reported as
/// ignored with that reason.
fn an_interface_that_is_not_a_tap_is_refused() -> Result<Completion, Failed> {
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Ok(Completion::ignored_with(
            "needs /dev/net/tun to tell a tap from another interface",
        ));
    }
    expect_refusal(&["--net", "tap=lo"], BAD_INPUT, "lo is not a tap device")?;
    Ok(Completion::Completed)
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![
        Trial::test("bad_nets_are_refused", bad_nets_are_refused),
        Trial::ignorable_test(
            "an_interface_that_is_not_a_tap_is_refused",
            an_interface_that_is_not_a_tap_is_refused,
        ),
    ];
    for irqchip in ["user", "kernel"] {
        trials.push(netns_trial(
            &format!("guest_gets_an_arp_reply_{irqchip}"),
            move || guest_gets_an_arp_reply(irqchip),
        ));
    }
    // Two Linux boots (~30-60 s of a core each here), one per irqchip.
    for irqchip in ["user", "kernel"] {
        trials.push(netns_trial(
            &format!("linux_answers_ping_{irqchip}"),
            move || linux_answers_ping(irqchip),
        ));
    }
    // Two more Linux boots, each snapshotted and restored once.
    for irqchip in ["user", "kernel"] {
        trials.push(netns_trial(
            &format!("linux_answers_ping_across_a_restore_{irqchip}"),
            move || linux_answers_ping_across_a_restore(irqchip),
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
