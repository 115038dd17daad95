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
//! - ch-remote's snapshot cycle: pause, snapshot, then `--restore` on the command line and
//!   ch-remote's restore (its whole RestoreConfig, resume on).
//!
//! Also: both command-line forms (`cloud-hypervisor` as a symlink, `lull ch`), every refused
//! flag (exit 2) and every refused VmConfig field (one 400 each, naming it), keep-alive.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lull_tests::exit_status::{API_STOP, USAGE};
use lull_tests::{kit_file, kvm_trial, run_lull, temp_path, Arguments, Failed, Trial};
use serde_json::{json, Value};

#[path = "orchestrators/client.rs"]
mod client;
#[path = "orchestrators/fds.rs"]
mod fds;

use client::{
    bare_form, cloud_hypervisor, expect, image, path_form, shutdown_vmm, wait_guest_timers,
    wait_state, Ch, GoClient,
};

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

/// ch-remote's snapshot cycle: pause, snapshot, shutdown-vmm. `cloud-hypervisor --api-socket
/// P --restore source_url=file:///DIR` starts the snapshot's VM paused, and ch-remote's resume
/// runs it (its timers fire); on a bare `cloud-hypervisor --api-socket P`, ch-remote's restore
/// (its whole RestoreConfig, `resume` on) runs it at once.
fn ch_remote_snapshots_and_both_restores_run_the_vm() -> Result<(), Failed> {
    let kernel = kit_file("guests/idle-sim.elf")?.display().to_string();
    let first = Ch::start(
        "ch-snap-1",
        path_form,
        &[
            "--kernel",
            &kernel,
            "--cmdline",
            "duration_ms=600000",
            "--memory",
            "size=67108864",
            "--serial",
            "off",
            "--console",
            "off",
        ],
    )?;
    let mut go = GoClient::connect(&first.socket)?;
    wait_guest_timers(&mut go, 3)?;
    drop(go);
    expect(&first.socket, "PUT", "vm.pause", None, 204)?;
    let dir = temp_path("ch-snap.snapshot");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let url = format!("file://{}", dir.display());
    let body = json!({ "destination_url": url }).to_string();
    expect(&first.socket, "PUT", "vm.snapshot", Some(&body), 204)?;
    shutdown_vmm(first, API_STOP)?;

    let restore = format!("source_url={url},prefault=on");
    let second = Ch::start("ch-snap-2", path_form, &["--restore", &restore, "-v"])?;
    let info = expect(&second.socket, "GET", "vm.info", None, 200)?;
    if info["state"] != "Paused" {
        return Err(format!("--restore: the VM is not paused: {info}").into());
    }
    expect(&second.socket, "PUT", "vm.resume", None, 204)?;
    let mut go = GoClient::connect(&second.socket)?;
    wait_guest_timers(&mut go, 3)?;
    drop(go);
    shutdown_vmm(second, API_STOP)?;

    let third = Ch::start("ch-snap-3", path_form, &[])?;
    // What `ch-remote restore source_url=...,resume=true` sends.
    let body = json!({
        "source_url": url,
        "prefault": false,
        "memory_restore_mode": "Copy",
        "net_fds": null,
        "resume": true,
    })
    .to_string();
    expect(&third.socket, "PUT", "vm.restore", Some(&body), 204)?;
    let mut go = GoClient::connect(&third.socket)?;
    wait_state(&mut go, "Running")?;
    wait_guest_timers(&mut go, 3)?;
    drop(go);
    shutdown_vmm(third, API_STOP)?;
    let _ = std::fs::remove_dir_all(&dir);
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
        (&["--serial", "socket=/s"], "--serial socket"),
        (&["--net", "tap=t0,vhost_user=on"], "--net vhost_user=on"),
        (
            &["--device", "path=/sys/bus/pci/devices/0000:00:01.0"],
            "--device",
        ),
        (&["--cpus", "boot=1"], "--kernel"),
        (
            &["--restore", "source_url=file:///s", "--kernel", "/k"],
            "--restore with --kernel",
        ),
        (&["--restore", "source_url=file:///s"], "resume=true"),
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
    ("serial", r#"{"mode": "Socket", "socket": "/s"}"#),
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
        kvm_trial(
            "ch_remote_snapshots_and_both_restores_run_the_vm",
            ch_remote_snapshots_and_both_restores_run_the_vm,
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
            match fds::taps_unavailable() {
                Some(reason) => Ok(lull_tests::Completion::ignored_with(reason)),
                None => fds::tap_fd_sent_with_add_net_backs_the_vm_s_net()
                    .map(|()| lull_tests::Completion::Completed),
            }
        }),
        Trial::ignorable_test("ch_inherited_tap_fd_backs_the_vm_s_net", || {
            match fds::taps_unavailable() {
                Some(reason) => Ok(lull_tests::Completion::ignored_with(reason)),
                None => fds::inherited_tap_fd_backs_the_vm_s_net()
                    .map(|()| lull_tests::Completion::Completed),
            }
        }),
        Trial::test("ch_add_net_refuses_a_bad_fd", fds::add_net_refuses_a_bad_fd),
        Trial::test(
            "ch_api_socket_fd_serves_an_inherited_listener",
            fds::api_socket_fd_serves_an_inherited_listener,
        ),
        Trial::test(
            "ch_keep_alive_serves_a_whole_cycle_on_one_connection",
            keep_alive_serves_a_whole_cycle_on_one_connection,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
