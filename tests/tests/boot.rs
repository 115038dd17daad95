//! Integration tests: the built `lull` binary against the guest kit.
//!
//! Tests that boot a guest need `/dev/kvm`; where it is missing they are reported as ignored
//! with the reason, never as passed.

use std::time::Duration;

use lull_tests::{
    host_is_pvm, kit_file, kvm_trial, linux_cmdline, run_lull, take_metrics, temp_path, Arguments,
    Failed, RunResult, Trial,
};

const GUEST_DEADLINE: Duration = Duration::from_secs(60);
/// The tiny Linux kernel needs ~0.5-3 minutes to reach /init on a PVM host; allow 10.
const LINUX_DEADLINE: Duration = Duration::from_secs(600);

fn guest(name: &str) -> Result<String, Failed> {
    Ok(kit_file(&format!("guests/{name}.elf"))?
        .display()
        .to_string())
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
    let v = take_metrics(&metrics)?;
    let bytes = v.serial_bytes_out;
    if v.exit_status != 1
        || bytes < text.len() as u64
        || v.vcpus.first().map(|c| c.io_out) < Some(bytes)
    {
        return Err(format!("metrics do not match the run: {v:?}").into());
    }
    let _ = std::fs::remove_file(&console);
    Ok(())
}

fn lull_code_moves_to_huge_pages_when_asked() -> Result<(), Failed> {
    // lull's report reads /proc/self/smaps at the end of the run: its code's mapping is backed
    // by 2 MiB pages with `on` when the host has transparent huge pages, never with `off` or
    // by default.
    let kernel = guest("hello")?;
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let host_has_thp = !thp.is_empty() && !thp.contains("[never]");
    for (switch, expect_huge) in [
        (Some("on"), host_has_thp),
        (Some("off"), false),
        (None, false),
    ] {
        let metrics = temp_path(&format!("huge-text-{switch:?}.json"));
        let metrics_arg = metrics.display().to_string();
        let mut args = vec!["run", "--kernel", &kernel, "--metrics", &metrics_arg];
        if let Some(s) = switch {
            args.extend(["--huge-text", s]);
        }
        let r = run_lull(&args, GUEST_DEADLINE)?;
        r.expect_stdout("hello: PASS")?;
        r.expect_code(1)?;
        let v = take_metrics(&metrics)?;
        let huge = v.text_on_huge_pages_bytes;
        if (huge > 0) != expect_huge {
            return Err(format!(
                "--huge-text {switch:?} on a host with THP {thp:?}: {huge} bytes of lull's \
                 code on huge pages"
            )
            .into());
        }
    }
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

/// Boots the kit's Linux kernel `image` (vmlinux through PVH, or the bzImage through the Linux
/// 64-bit boot protocol) with `cpus` vCPUs in irqchip `mode`, 64 MiB and `lull.workload=`
/// `workload` (resources/linux/lull_workload.c, run in place of /init: no guest user space
/// needed, so the same on every host), with the kit's initramfs if `initramfs` (without
/// one, and with no `root=`, the kernel keeps its built-in rootfs and skips unpacking: a
/// shorter boot). Checks
/// that every CPU came up.
fn boot_linux_workload(
    image: &str,
    mode: &'static str,
    cpus: u32,
    workload: &str,
    initramfs: bool,
) -> Result<RunResult, Failed> {
    let kernel = kit_file(image)?.display().to_string();
    let cmdline = linux_cmdline(&format!("lull.workload={workload}"))?;
    let cpus_arg = cpus.to_string();
    let mut args = vec![
        "run",
        "--kernel",
        &kernel,
        "--cmdline",
        &cmdline,
        "--cpus",
        &cpus_arg,
        "--memory",
        "64M",
        "--irqchip",
        mode,
    ];
    let initramfs_path;
    if initramfs {
        initramfs_path = kit_file("linux/initramfs.cpio")
            .or_else(|_| kit_file("linux/initramfs.cpio.gz"))?
            .display()
            .to_string();
        args.extend(["--initramfs", &initramfs_path]);
    }
    let r = run_lull(&args, LINUX_DEADLINE)?;
    let plural = if cpus == 1 { "CPU" } else { "CPUs" };
    r.expect_stdout(&format!("smp: Brought up 1 node, {cpus} {plural}"))?;
    if initramfs {
        // Unpacked in full before the point where /init would run.
        r.expect_stdout("Freeing initrd memory")?;
        if r.stdout.contains("Initramfs unpacking failed") {
            return Err(r.failure("the kernel could not unpack the initramfs"));
        }
    } else {
        // The kernel has a block layer but no root= here: it keeps its built-in rootfs
        // (resources/linux/rootfs-without-root.patch) instead of panicking.
        r.expect_stdout("VFS: no root= given, staying on the rootfs")?;
    }
    Ok(r)
}

/// The workload `kind` for 2 s on `cpus` CPUs: a start line where /init would run, a line
/// per CPU and a total, PASS, and the test-exit port's status for it.
fn linux_runs_workload(
    image: &str,
    mode: &'static str,
    cpus: u32,
    kind: &str,
    initramfs: bool,
) -> Result<(), Failed> {
    let workload = format!("{kind},seconds=2,cpus={cpus}");
    let r = boot_linux_workload(image, mode, cpus, &workload, initramfs)?;
    r.expect_stdout(&format!(
        "lull-workload: start kind={kind} seconds=2 cpus={cpus} "
    ))?;
    for cpu in 0..cpus {
        r.expect_stdout(&format!("lull-workload: {kind} cpu={cpu} "))?;
    }
    r.expect_stdout(&format!("lull-workload: {kind} cpu=all cpus={cpus} "))?;
    r.expect_stdout("lull-workload: PASS")?;
    // The workload writes 0 to port 0xf4 on PASS: status (0 << 1) | 1.
    r.expect_code(1)
}

/// A workload that fails (it expects 2 CPUs, the VM has 1) says why and ends with the
/// test-exit port's status for 1, never with a reset (0): `make run` must see a failure.
fn linux_workload_failure_ends_with_status_3() -> Result<(), Failed> {
    let r = boot_linux_workload("linux/vmlinux", "kernel", 1, "idle,seconds=2,cpus=2", false)?;
    r.expect_stdout("lull-workload: FAIL not as many CPUs online as cpus= asked")?;
    if r.stdout.contains("lull-workload: PASS") {
        return Err(r.failure("a failed workload printed PASS"));
    }
    r.expect_code(3)
}

/// The interrupt-controller configurations every test guest runs in, with the same
/// expectations: KVM's in-kernel LAPIC is the oracle for lull's.
const MODES: &[(&str, &[&str])] = &[
    ("kernel", &["--irqchip", "kernel"]),
    ("user_pull", &["--irqchip", "user", "--timer-model", "pull"]),
    ("user_push", &["--irqchip", "user", "--timer-model", "push"]),
    (
        "user_central",
        &["--irqchip", "user", "--timer-model", "central"],
    ),
];

/// Test guests: (name, vCPUs, command line, lines the console must show).
const GUESTS: &[(&str, u32, &str, &[&str])] = &[
    ("hello", 1, "", &["hello: PASS"]),
    (
        "lapic-timer",
        1,
        "count=3",
        &[
            "one-shot div1: n=3",
            "one-shot div16: n=3",
            "periodic div1: n=3",
            "tsc-deadline: n=3",
            "cancel by writing 0: no interrupt",
            "lapic-timer: PASS",
        ],
    ),
    (
        "ipi-self",
        1,
        "",
        &[
            "priority: 0x60 delivered before 0x50",
            "SELF_IPI delivered",
            "ipi-self: PASS",
        ],
    ),
    (
        "smp-hello",
        4,
        "",
        &["3 of 3 AP(s) reported", "smp-hello: PASS"],
    ),
    (
        "smp-ipi",
        2,
        "count=3",
        &[
            "bsp -> cpu 1 (halted): n=3",
            "broadcast, last AP: n=3",
            "smp-ipi: PASS",
        ],
    ),
    (
        "smp-timer",
        3,
        "count=3",
        &["cpu 2: n=3", "all: n=9", "smp-timer: PASS"],
    ),
];

fn guest_matrix() -> Vec<Trial> {
    let mut trials = Vec::new();
    for (mode, mode_args) in MODES {
        for (name, cpus, cmdline, expect) in GUESTS {
            trials.push(kvm_trial(
                &format!("guest_{}_{mode}", name.replace('-', "_")),
                move || {
                    let kernel = guest(name)?;
                    let metrics = temp_path(&format!("{name}-{mode}.json"));
                    // KVM's in-kernel LAPIC on PVM hosts never sets ISR bits (resources/guests
                    // README): there, and only there, its ISR check only warns.
                    let cmdline = if *mode == "kernel" && *name == "ipi-self" && host_is_pvm() {
                        format!("{cmdline} isr=warn")
                    } else {
                        cmdline.to_string()
                    };
                    let cpus = cpus.to_string();
                    let metrics_arg = metrics.display().to_string();
                    let mut args = vec![
                        "run",
                        "--kernel",
                        &kernel,
                        "--cpus",
                        &cpus,
                        "--cmdline",
                        &cmdline,
                    ];
                    args.extend_from_slice(&["--metrics", &metrics_arg]);
                    args.extend_from_slice(mode_args);
                    let r = run_lull(&args, GUEST_DEADLINE)?;
                    for line in *expect {
                        r.expect_stdout(line)?;
                    }
                    r.expect_code(1)?;
                    let v = take_metrics(&metrics)?;
                    if mode.starts_with("user") && *name == "lapic-timer" {
                        // Every guest timer event goes through lull's timers, and every block of
                        // the halted vCPU ends with exactly one counted wake-up. (A slow guest may
                        // not reach HLT before its timer fires, so blocks can be fewer.)
                        let vcpu = v.vcpus.first().cloned().unwrap_or_default();
                        let fires = vcpu.lapic_timer_fires;
                        let blocks = vcpu.blocks;
                        let w = &vcpu.wakeups;
                        let wakeups = w.timer + w.interrupt + w.control + w.other;
                        if fires < 12 || blocks == 0 || wakeups != blocks || blocks > vcpu.hlt {
                            return Err(format!("timer/halt metrics inconsistent: {v:?}").into());
                        }
                    }
                    Ok(())
                },
            ));
        }
    }
    trials
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
    // A directory (or a FIFO, a device) is refused before anything reads it.
    (
        &["run", "--kernel", "/"],
        4,
        "--kernel / is not a regular file",
    ),
    // Output files are checked before the guest runs, not after.
    (
        &["run", "--metrics", "/nonexistent/m.json"],
        4,
        "Cannot write the metrics file /nonexistent/m.json",
    ),
    (
        &["run", "--serial", "file=/nonexistent/serial.log"],
        4,
        "Cannot open serial output file /nonexistent/serial.log",
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
                    match r.stderr.matches(text).count() {
                        1 => Ok(()),
                        0 => Err(r.failure(&format!("stderr lacks {text:?}"))),
                        _ => Err(r.failure(&format!("stderr repeats {text:?}"))),
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
            "serial_file_and_metrics_capture_the_run",
            serial_file_and_metrics_capture_the_run,
        ),
        kvm_trial(
            "lull_code_moves_to_huge_pages_when_asked",
            lull_code_moves_to_huge_pages_when_asked,
        ),
        kvm_trial(
            "config_file_drives_the_run_and_flags_override_it",
            config_file_drives_the_run_and_flags_override_it,
        ),
        kvm_trial(
            "initramfs_too_large_for_memory_is_bad_input",
            initramfs_too_large_for_memory_is_bad_input,
        ),
        kvm_trial("linux_kernel_irqchip_2_cpus_runs_timers_workload", || {
            linux_runs_workload("linux/vmlinux", "kernel", 2, "timers", false)
        }),
        kvm_trial("linux_user_irqchip_2_cpus_runs_timers_workload", || {
            linux_runs_workload("linux/vmlinux", "user", 2, "timers", false)
        }),
        kvm_trial(
            "linux_user_irqchip_1_cpu_runs_idle_workload_after_initramfs",
            || linux_runs_workload("linux/vmlinux", "user", 1, "idle", true),
        ),
        kvm_trial("linux_bzimage_runs_idle_workload_after_initramfs", || {
            linux_runs_workload("linux/bzImage", "user", 1, "idle", true)
        }),
        kvm_trial(
            "linux_workload_failure_ends_with_status_3",
            linux_workload_failure_ends_with_status_3,
        ),
    ];
    trials.extend(guest_matrix());
    trials.extend(bad_input_cases());
    libtest_mimic::run(&args, trials).exit();
}
