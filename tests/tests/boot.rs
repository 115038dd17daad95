//! Integration tests: the built `lull` binary against the guest kit.
//!
//! Tests that boot a guest need `/dev/kvm`; where it is missing they are reported as ignored
//! with the reason, never as passed.

use std::time::Duration;

use lull_tests::{kit_file, kvm_trial, run_lull, Arguments, Failed, Trial};

const GUEST_DEADLINE: Duration = Duration::from_secs(60);
/// The tiny Linux kernel needs ~2-3 minutes to reach /init on a PVM host; allow 10.
const LINUX_DEADLINE: Duration = Duration::from_secs(600);

fn guest(name: &str) -> Result<String, Failed> {
    Ok(kit_file(&format!("guests/{name}.elf"))?
        .display()
        .to_string())
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("lull-test-{}-{name}", std::process::id()))
}

fn hello_boots_and_exits_through_the_test_port() -> Result<(), Failed> {
    let kernel = guest("hello")?;
    let r = run_lull(
        &["run", "--kernel", &kernel, "--cmdline", "alpha=1 beta"],
        GUEST_DEADLINE,
    )?;
    r.expect_stdout("hello: Hello from a lull test guest")?;
    r.expect_stdout("alpha=1 beta")?;
    r.expect_stdout("hello: PASS")?;
    // The guest writes 0 to port 0xf4: status (0 << 1) | 1.
    r.expect_code(1)
}

fn lapic_timer_fires_in_one_shot_and_tsc_deadline_modes() -> Result<(), Failed> {
    let kernel = guest("lapic-timer")?;
    let r = run_lull(
        &["run", "--kernel", &kernel, "--cmdline", "count=3"],
        GUEST_DEADLINE,
    )?;
    r.expect_stdout("one-shot div1: n=3 lateness ns")?;
    r.expect_stdout("one-shot div16: n=3 lateness ns")?;
    r.expect_stdout("tsc-deadline: n=3 lateness ns")?;
    r.expect_stdout("cancel by writing 0: no interrupt")?;
    r.expect_stdout("lapic-timer: PASS")?;
    r.expect_code(1)
}

fn serial_file_and_metrics_capture_the_run() -> Result<(), Failed> {
    let kernel = guest("hello")?;
    let console = temp_path("console.txt");
    let metrics = temp_path("metrics.json");
    let _ = std::fs::remove_file(&console);
    let serial = format!("file={}", console.display());
    let r = run_lull(
        &[
            "run",
            "--kernel",
            &kernel,
            "--serial",
            &serial,
            "--metrics",
            metrics.to_str().unwrap_or(""),
        ],
        GUEST_DEADLINE,
    )?;
    r.expect_code(1)?;
    if !r.stdout.is_empty() {
        return Err(r.failure("with --serial file=..., nothing may reach stdout"));
    }
    let text = std::fs::read_to_string(&console).map_err(|e| format!("console file: {e}"))?;
    if !text.contains("hello: PASS") {
        return Err(format!("console file lacks the guest's output: {text:?}").into());
    }
    let json = std::fs::read_to_string(&metrics).map_err(|e| format!("metrics file: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| format!("metrics JSON: {e}"))?;
    let bytes = v["serial_bytes_out"].as_u64().unwrap_or(0);
    if v["exit_status"] != 1
        || bytes < text.len() as u64
        || v["vcpus"][0]["io_out"].as_u64() < Some(bytes)
    {
        return Err(format!("metrics do not match the run: {json}").into());
    }
    let _ = std::fs::remove_file(&console);
    let _ = std::fs::remove_file(&metrics);
    Ok(())
}

fn config_file_drives_the_run_and_flags_override_it() -> Result<(), Failed> {
    let kernel = guest("hello")?;
    let cfg = temp_path("vm.json");
    let body =
        serde_json::json!({"kernel": kernel, "cmdline": "from-config", "memory": "64M", "cpus": 1});
    std::fs::write(&cfg, body.to_string()).map_err(|e| e.to_string())?;
    let r = run_lull(
        &["run", "--config", cfg.to_str().unwrap_or("")],
        GUEST_DEADLINE,
    )?;
    r.expect_stdout("from-config")?;
    r.expect_code(1)?;
    let r = run_lull(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap_or(""),
            "--cmdline",
            "from-flag",
        ],
        GUEST_DEADLINE,
    )?;
    r.expect_stdout("from-flag")?;
    let _ = std::fs::remove_file(&cfg);
    r.expect_code(1)
}

fn initramfs_too_large_for_memory_is_bad_input() -> Result<(), Failed> {
    let kernel = guest("hello")?;
    let big = temp_path("big.cpio");
    let f = std::fs::File::create(&big).map_err(|e| e.to_string())?;
    f.set_len(40 << 20).map_err(|e| e.to_string())?;
    let r = run_lull(
        &[
            "run",
            "--kernel",
            &kernel,
            "--memory",
            "32M",
            "--initramfs",
            big.to_str().unwrap_or(""),
        ],
        GUEST_DEADLINE,
    )?;
    let _ = std::fs::remove_file(&big);
    r.expect_code(4)?;
    if !r.stderr.contains("initramfs") || !r.stderr.contains("--memory") {
        return Err(r.failure("error should name the initramfs and --memory"));
    }
    Ok(())
}

fn linux_smp_boots_to_init_and_reset_ends_lull() -> Result<(), Failed> {
    let kernel = kit_file("linux/vmlinux")?.display().to_string();
    let initramfs = kit_file("linux/initramfs.cpio.gz")?.display().to_string();
    let r = run_lull(
        &[
            "run",
            "--kernel",
            &kernel,
            "--initramfs",
            &initramfs,
            "--cpus",
            "2",
            "--memory",
            "256M",
        ],
        LINUX_DEADLINE,
    )?;
    r.expect_stdout("smp: Brought up 1 node, 2 CPUs")?;
    r.expect_stdout("Run /init as init process")?;
    // panic=-1 and reboot=k: the kernel resets through the i8042, which ends lull with 0.
    r.expect_code(0)
}

/// Error cases that lull must report before touching KVM: (args, expected status, text).
const BAD_INPUT_CASES: &[(&[&str], i32, &str)] = &[
    (&["run", "--memory", "lots"], 2, "not a size"),
    (&["run", "--serial", "tty"], 2, "not a serial mode"),
    (&["run", "--cpus", "0"], 4, "--cpus 0 is out of range"),
    (&["run", "--cpus", "500"], 4, "out of range"),
    (&["run", "--memory", "8M"], 4, "--memory 8M is out of range"),
    (
        &["run", "--kernel", "/nonexistent/vmlinux"],
        4,
        "Cannot read kernel /nonexistent/vmlinux",
    ),
    (
        &["run", "--kernel", "/etc/hostname"],
        4,
        "is not a kernel lull can boot",
    ),
    (
        &["run", "--config", "/nonexistent.json"],
        4,
        "Cannot read config file",
    ),
];

fn bad_input_cases() -> Vec<Trial> {
    BAD_INPUT_CASES
        .iter()
        .enumerate()
        .map(|(i, (args, code, text))| {
            Trial::test(
                format!("bad_input_{i}_{}", args[1..].join("_").replace('/', "")),
                move || {
                    let r = run_lull(args, GUEST_DEADLINE)?;
                    r.expect_code(*code)?;
                    if r.stderr.contains(text) {
                        Ok(())
                    } else {
                        Err(r.failure(&format!("stderr lacks {text:?}")))
                    }
                },
            )
        })
        .collect()
}

fn help_explains_every_flag() -> Result<(), Failed> {
    let r = run_lull(&["run", "--help"], GUEST_DEADLINE)?;
    r.expect_code(0)?;
    for flag in [
        "--kernel",
        "--initramfs",
        "--cmdline",
        "--cpus",
        "--memory",
        "--irqchip",
        "--serial",
        "--metrics",
        "--config",
        "Exit status",
    ] {
        r.expect_stdout(flag)?;
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![
        Trial::test("help_explains_every_flag", help_explains_every_flag),
        kvm_trial(
            "hello_boots_and_exits_through_the_test_port",
            hello_boots_and_exits_through_the_test_port,
        ),
        kvm_trial(
            "lapic_timer_fires_in_one_shot_and_tsc_deadline_modes",
            lapic_timer_fires_in_one_shot_and_tsc_deadline_modes,
        ),
        kvm_trial(
            "serial_file_and_metrics_capture_the_run",
            serial_file_and_metrics_capture_the_run,
        ),
        kvm_trial(
            "config_file_drives_the_run_and_flags_override_it",
            config_file_drives_the_run_and_flags_override_it,
        ),
        kvm_trial(
            "initramfs_too_large_for_memory_is_bad_input",
            initramfs_too_large_for_memory_is_bad_input,
        ),
        kvm_trial(
            "linux_smp_boots_to_init_and_reset_ends_lull",
            linux_smp_boots_to_init_and_reset_ends_lull,
        ),
    ];
    trials.extend(bad_input_cases());
    libtest_mimic::run(&args, trials).exit();
}
