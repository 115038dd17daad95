//! libvirt drives lull: `virsh` against libvirt's Cloud Hypervisor driver (`virtchd`, built
//! by `make libvirt` from Debian's libvirt source: resources/libvirt/build.sh), with lull as
//! its `cloud-hypervisor` (tests/src/libvirt.rs: one virtchd per test, in a mount namespace of
//! its own).
//!
//! Two domains, each under both irqchips (the domain's `<emulator>` is a wrapper that runs
//! `lull ch --lull irqchip=MODE`: libvirt has no other way to pass a VMM flag):
//! - the kit's idle-sim guest (2 vCPUs, 64 MiB, a pty serial port);
//! - the kit's Linux (1 vCPU) with an `<interface type='ethernet'>` on a tap of a network
//!   namespace (virtchd runs inside it, as lull must), which it configures from `ip=`.
//!
//! The sequence: `virsh define`, `start`, `dominfo`, `console`, `suspend`, `resume`, `save`,
//! `restore`, `shutdown`, `destroy`, `undefine`. Each step checks the guest's own state as
//! well as virsh's: lull's `vm.info` and `vm.counters` on the API socket the driver made (the
//! irqchip the VM runs with; its vCPUs' exits moving while it runs, standing still while
//! paused), the guest's console output through `virsh console`, pings to the Linux guest, and
//! idle-sim's own verdict after the restore (every timer on time, none early: `early 0`,
//! `PASS`). `destroy` needs a running domain: the domain is started again for it (and for
//! `shutdown`, after idle-sim ended by itself).
//!
//! A step that fails names itself, virsh's error, virtchd's errors and lull's log (the
//! domain's log file): a step lull cannot do yet fails, it is never skipped. Without
//! `/dev/kvm` (or root, `ip`, `unshare`) the tests are reported as ignored with the reason;
//! without the libvirt build they fail and say `make libvirt`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lull_tests::libvirt::{libvirt_build, Console, Virtchd};
use lull_tests::netns::{Netns, GUEST_IP_CONFIG, TAP};
use lull_tests::{
    api_call, kit_file, kvm_unavailable, linux_cmdline, report_from, Arguments, Completion, Failed,
    Trial,
};

/// idle-sim's run: long enough for every step up to the restore on a loaded host, short
/// enough to wait for its verdict.
const IDLE_SIM_MS: u64 = 45_000;
/// The kit's Linux boots in 30-400 s here (docs/ENVIRONMENT.md).
const LINUX_BOOT: Duration = Duration::from_secs(600);
/// Why these tests cannot run here, if they cannot (the libvirt build is not a reason: a
/// missing one fails).
fn unavailable() -> Option<String> {
    if let Some(reason) = kvm_unavailable() {
        return Some(reason);
    }
    let uid = Command::new("id").arg("-u").output().ok();
    let root = uid.is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return Some("needs root (virtchd as root, mount and network namespaces, taps)".into());
    }
    for (tool, package) in [("ip", "iproute2"), ("unshare", "util-linux")] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some(format!("needs `{tool}` ({package})"));
        }
    }
    None
}

fn trial<F>(name: &str, body: F) -> Trial
where
    F: FnOnce() -> Result<(), Failed> + Send + 'static,
{
    Trial::ignorable_test(name, move || match unavailable() {
        Some(reason) => Ok(Completion::ignored_with(reason)),
        None => body().map(|()| Completion::Completed),
    })
}

/// Runs one step of the sequence: its failure says which.
fn step<T>(name: &str, body: impl FnOnce() -> Result<T, Failed>) -> Result<T, Failed> {
    body().map_err(|e| format!("step `{name}`: {}", e.message().unwrap_or("")).into())
}

/// A domain under test: its virtchd, its name, and where its lull answers.
struct Domain<'a> {
    v: &'a Virtchd,
    name: String,
    irqchip: &'static str,
}

impl Domain<'_> {
    fn virsh(&self, args: &[&str]) -> Result<String, Failed> {
        self.v.virsh(args, Some(&self.name))
    }

    fn expect_state(&self, want: &str) -> Result<(), Failed> {
        self.v.wait_state(&self.name, want, Duration::from_secs(30))
    }

    /// A GET on lull's API socket: the body, parsed.
    fn api_get(&self, endpoint: &str) -> Result<serde_json::Value, Failed> {
        let socket = self.v.api_socket(&self.name);
        let (code, body) = api_call(&socket, "GET", endpoint, "")?;
        if code != 200 {
            return Err(format!(
                "lull: GET {endpoint}: {code} {body}{}",
                self.v.logs(Some(&self.name))
            )
            .into());
        }
        serde_json::from_str(&body).map_err(|e| format!("lull: {endpoint}: {e}: {body}").into())
    }

    /// lull's own state of the VM (`vm.info`'s `state`).
    fn lull_state(&self) -> Result<String, Failed> {
        let info = self.api_get("vm.info")?;
        Ok(info["state"].as_str().unwrap_or_default().to_string())
    }

    fn expect_lull_state(&self, want: &str) -> Result<(), Failed> {
        match self.lull_state()? {
            s if s == want => Ok(()),
            s => Err(format!("lull says the VM is {s}, want {want}").into()),
        }
    }

    /// How far the guest's vCPUs have got: KVM's exit count (in-kernel exits included, so it
    /// moves under both irqchips), else lull's own per-vCPU counts. Also checks that lull runs
    /// the VM with the irqchip the domain asked for.
    fn progress(&self) -> Result<u64, Failed> {
        let socket = self.v.api_socket(&self.name);
        let (code, body) = api_call(&socket, "GET", "vm.counters", "")?;
        if code != 200 {
            return Err(format!("lull: GET vm.counters: {code} {body}").into());
        }
        let report = report_from(&body)?;
        if report.irqchip != self.irqchip {
            return Err(format!(
                "the domain's <emulator> asked lull for --lull irqchip={} but lull runs the VM \
                 with irqchip {}: lull applies --lull knobs to a VM given on its command line, \
                 not (yet) to the VmConfig libvirt sends to vm.create",
                self.irqchip, report.irqchip
            )
            .into());
        }
        let kvm_exits = report.kvm.as_ref().and_then(|k| k.get("exits")).copied();
        let own: u64 = report
            .vcpus
            .iter()
            .map(|v| v.hlt + v.lapic_timer_fires + v.msr + v.io_out + v.mmio_write)
            .sum();
        Ok(kvm_exits.unwrap_or(own))
    }

    /// The guest's vCPUs move on within `within`.
    fn expect_running_guest(&self, within: Duration) -> Result<(), Failed> {
        let first = self.progress()?;
        let deadline = Instant::now() + within;
        loop {
            std::thread::sleep(Duration::from_millis(250));
            let now = self.progress()?;
            if now > first {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the guest's vCPUs did not move in {within:?} ({first} exits)"
                )
                .into());
            }
        }
    }

    /// The guest's vCPUs stand still for a second.
    fn expect_frozen_guest(&self) -> Result<(), Failed> {
        let first = self.progress()?;
        std::thread::sleep(Duration::from_secs(1));
        let now = self.progress()?;
        if now != first {
            return Err(
                format!("paused, the guest's vCPUs still ran ({first} -> {now} exits)").into(),
            );
        }
        Ok(())
    }

    /// lull's process for the domain is gone (the driver's pid file, or its last pid).
    fn expect_no_vm_process(&self, pid: Option<u32>) -> Result<(), Failed> {
        let Some(pid) = pid else { return Ok(()) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Path::new(&format!("/proc/{pid}")).exists() {
            if Instant::now() > deadline {
                return Err(format!("lull (pid {pid}) still runs").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// `virsh dominfo`: the state, vCPUs and memory the domain says.
    fn expect_dominfo(&self, state: &str, cpus: u32, mib: u64) -> Result<(), Failed> {
        let info = self.virsh(&["dominfo", &self.name])?;
        let field = |key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
                .unwrap_or_default()
        };
        let want = [
            ("State:", state.to_string()),
            ("CPU(s):", cpus.to_string()),
            ("Max memory:", format!("{} KiB", mib << 10)),
        ];
        for (key, value) in want {
            if field(key) != value {
                return Err(
                    format!("dominfo {key} '{}', want '{value}':\n{info}", field(key)).into(),
                );
            }
        }
        Ok(())
    }

    fn listed(&self) -> Result<bool, Failed> {
        let names = self.virsh(&["list", "--all", "--name"])?;
        Ok(names.lines().any(|l| l.trim() == self.name))
    }
}

/// The domain XML: a kernel, its command line, vCPUs and memory, a pty serial port (the
/// console libvirt's ch driver supports), `extra` devices, and the wrapper that picks the
/// irqchip as the emulator.
fn domain_xml(
    name: &str,
    kernel: &Path,
    cmdline: &str,
    cpus: u32,
    mib: u64,
    emulator: &Path,
    extra: &str,
) -> String {
    format!(
        "<domain type='kvm'>
  <name>{name}</name>
  <memory unit='MiB'>{mib}</memory>
  <vcpu>{cpus}</vcpu>
  <os>
    <type>hvm</type>
    <kernel>{}</kernel>
    <cmdline>{cmdline}</cmdline>
  </os>
  <devices>
    <emulator>{}</emulator>
    <serial type='pty'/>{extra}
  </devices>
</domain>
",
        kernel.display(),
        emulator.display()
    )
}

/// define, start, dominfo, console, suspend, resume: the domain runs.
fn define_to_resume(
    d: &Domain<'_>,
    xml: &str,
    cpus: u32,
    mib: u64,
    first_line: &str,
    boot: Duration,
) -> Result<(), Failed> {
    let xml_path = d.v.dir.join(format!("{}.xml", d.name));
    std::fs::write(&xml_path, xml).map_err(|e| e.to_string())?;
    step("define", || {
        d.virsh(&["define", &xml_path.display().to_string()])?;
        d.expect_state("shut off")?;
        if !d.listed()? {
            return Err("not in `virsh list --all`".into());
        }
        Ok(())
    })?;
    step("start", || {
        d.virsh(&["start", &d.name])?;
        d.expect_state("running")?;
        d.expect_lull_state("Running")?;
        d.expect_running_guest(Duration::from_secs(30))
    })?;
    step("dominfo", || d.expect_dominfo("running", cpus, mib))?;
    step("console", || {
        let mut console = Console::attach(d.v, &d.name)?;
        console.wait_for(first_line, boot).map(drop)
    })?;
    step("suspend", || {
        d.virsh(&["suspend", &d.name])?;
        d.expect_state("paused")?;
        d.expect_lull_state("Paused")?;
        d.expect_frozen_guest()
    })?;
    step("resume", || {
        d.virsh(&["resume", &d.name])?;
        d.expect_state("running")?;
        d.expect_lull_state("Running")?;
        d.expect_running_guest(Duration::from_secs(30))
    })
}

/// save (the domain stops, its snapshot is written), restore (it runs again).
fn save_and_restore(d: &Domain<'_>) -> Result<(), Failed> {
    let saved = d.v.dir.join(format!("{}.save", d.name));
    step("save", || {
        let pid = d.v.vm_pid(&d.name);
        d.virsh(&["save", &d.name, &saved.display().to_string()])?;
        d.expect_state("shut off")?;
        d.expect_no_vm_process(pid)?;
        if !saved.exists() {
            return Err(format!("{} was not written", saved.display()).into());
        }
        Ok(())
    })?;
    step("restore", || {
        d.virsh(&["restore", &saved.display().to_string()])?;
        d.expect_state("running")?;
        d.expect_lull_state("Running")?;
        d.expect_running_guest(Duration::from_secs(30))
    })
}

/// shutdown (from a fresh start), destroy (likewise), undefine.
fn shutdown_destroy_undefine(d: &Domain<'_>) -> Result<(), Failed> {
    step("shutdown", || {
        if d.v.state(&d.name)? != "running" {
            d.virsh(&["start", &d.name])?;
            d.expect_state("running")?;
        }
        let pid = d.v.vm_pid(&d.name);
        d.virsh(&["shutdown", &d.name])?;
        d.expect_state("shut off")?;
        d.expect_no_vm_process(pid)
    })?;
    step("destroy", || {
        d.virsh(&["start", &d.name])?;
        d.expect_state("running")?;
        d.expect_lull_state("Running")?;
        let pid = d.v.vm_pid(&d.name);
        d.virsh(&["destroy", &d.name])?;
        d.expect_state("shut off")?;
        d.expect_no_vm_process(pid)
    })?;
    step("undefine", || {
        d.virsh(&["undefine", &d.name])?;
        if d.listed()? {
            return Err("still in `virsh list --all`".into());
        }
        Ok(())
    })
}

/// idle-sim under libvirt: the whole sequence; after the restore its own verdict through the
/// console: every CPU's timers fired, none early, PASS; then it ends and the domain stops.
fn idle_sim(irqchip: &'static str) -> Result<(), Failed> {
    libvirt_build()?;
    let kernel = kit_file("guests/idle-sim.elf")?;
    let v = Virtchd::start(&format!("idle-{irqchip}"), None)?;
    let d = Domain {
        v: &v,
        name: format!("lull-idle-{irqchip}"),
        irqchip,
    };
    let xml = domain_xml(
        &d.name,
        &kernel,
        &format!("cpus=2 duration_ms={IDLE_SIM_MS}"),
        2,
        64,
        &v.emulator(irqchip),
        "",
    );
    define_to_resume(&d, &xml, 2, 64, "idle-sim: 2 CPUs", Duration::from_secs(30))?;
    save_and_restore(&d)?;
    step("restore: idle-sim's verdict", || {
        let mut console = Console::attach(&v, &d.name)?;
        let wait = Duration::from_millis(IDLE_SIM_MS) + Duration::from_secs(60);
        let text = console.wait_for("idle-sim: PASS", wait)?;
        let cpus: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("idle-sim: cpu "))
            .collect();
        if cpus.len() != 2 || cpus.iter().any(|l| !l.trim_end().ends_with("early 0")) {
            return Err(format!("idle-sim's timers across the save/restore:\n{text}").into());
        }
        // The guest ended its run: lull exits, the driver sees the VM stop.
        d.expect_state("shut off")
    })?;
    shutdown_destroy_undefine(&d)?;
    v.passed();
    Ok(())
}

/// The kit's Linux with an ethernet interface on the namespace's tap: it boots (its console
/// through virsh), answers pings, and answers them again after suspend/resume and after
/// save/restore.
fn linux_net(irqchip: &'static str) -> Result<(), Failed> {
    libvirt_build()?;
    let kernel = kit_file("linux/vmlinux")?;
    let ns = Netns::new(&format!("lv-{irqchip}"))?;
    let v = Virtchd::start(&format!("linux-{irqchip}"), Some(&ns.name))?;
    let d = Domain {
        v: &v,
        name: format!("lull-linux-{irqchip}"),
        irqchip,
    };
    // The idle workload outlives every step; `shutdown` and `destroy` end it.
    let cmdline = linux_cmdline(&format!(
        "{GUEST_IP_CONFIG} lull.workload=idle,seconds=3600,cpus=1"
    ))?;
    // No <model>: libvirt opens a tap for a virtio model with IFF_VNET_HDR, which lull's
    // virtio-net refuses (it makes the virtio-net header itself).
    let interface = format!(
        "
    <interface type='ethernet'>
      <mac address='52:54:00:4c:75:01'/>
      <target dev='{TAP}' managed='no'/>
    </interface>"
    );
    let xml = domain_xml(
        &d.name,
        &kernel,
        &cmdline,
        1,
        64,
        &v.emulator(irqchip),
        &interface,
    );
    define_to_resume(&d, &xml, 1, 64, "IP-Config: Complete", LINUX_BOOT)?;
    step("resume: ping", || ns.ping_guest(Duration::from_secs(60)))?;
    save_and_restore(&d)?;
    step("restore: ping", || ns.ping_guest(Duration::from_secs(60)))?;
    shutdown_destroy_undefine(&d)?;
    v.passed();
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for irqchip in ["kernel", "user"] {
        trials.push(trial(
            &format!("virsh_drives_idle_sim_{irqchip}"),
            move || idle_sim(irqchip),
        ));
        trials.push(trial(
            &format!("virsh_drives_linux_with_a_tap_{irqchip}"),
            move || linux_net(irqchip),
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
