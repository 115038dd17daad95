//! libvirt driving lull: the libvirt that `make libvirt` builds (resources/libvirt/build.sh:
//! `virtchd` with the Cloud Hypervisor driver, `virsh`, `virtlogd`), one `virtchd` per test
//! with directories of its own, `virsh` against it, and `virsh console` on a pty.
//!
//! How a test gets a libvirt of its own:
//!
//! ```text
//!   test dir  DIR = $TMPDIR/lull-test-PID-NAME/
//!     etc/ var/ run/        bind-mounted on /run/lull-libvirt (the build's sysconfdir,
//!                           localstatedir and runstatedir) in virtchd's own mount namespace
//!     bin/cloud-hypervisor  -> the lull under test (virtchd finds it on its PATH)
//!     bin/irqchip-kernel/cloud-hypervisor, bin/irqchip-user/cloud-hypervisor
//!                           wrappers `exec lull ch --lull irqchip=MODE "$@"`: a domain picks
//!                           one with <emulator> (libvirt runs the domain's emulator)
//!     virtchd.log           virtchd's log (debug for the ch driver and the commands it runs)
//!
//!   [ip netns exec NS] unshare --mount --propagation private \
//!       sh -c 'mount --bind DIR /run/lull-libvirt && exec virtchd'
//!   virsh -c 'ch:///system?socket=DIR/run/libvirt/virtchd-sock' ...
//! ```
//!
//! libvirt run as root takes its state directories from the build, not from the environment
//! (no `XDG_*` for a privileged daemon, and the ch driver's session mode would need a
//! non-root lull that cannot open taps): a mount namespace per virtchd gives each test its own
//! domains, sockets, pid files and logs, and leaves the host's /etc/libvirt and /run/libvirt
//! alone. The VMs libvirt starts (lull, daemonized) live in that namespace too; their API
//! sockets, pid files and logs are under DIR, where the test reads them.
//!
//! A missing libvirt build is a failure that says to run `make libvirt`, never a skip: `make
//! test` builds it before the integration tests.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{lull_bin, temp_path, workspace_root, Failed};

/// The build's sysconfdir, localstatedir and runstatedir live under this mount point
/// (resources/libvirt/build.sh); each virtchd has its own test directory mounted there.
pub const STATE_ROOT: &str = "/run/lull-libvirt";

/// How long one virsh command may take (a restore maps the snapshot and starts lull). The ch
/// driver blocks for good in `virsh start` if lull never opens its event FIFO.
const VIRSH_DEADLINE: Duration = Duration::from_secs(90);

/// The libvirt build: `LULL_LIBVIRT`, else `target/libvirt` (the link `make libvirt` makes).
pub fn libvirt_dir() -> PathBuf {
    std::env::var_os("LULL_LIBVIRT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/libvirt"))
}

/// The libvirt build's prefix, or a failure that says how to build it.
pub fn libvirt_build() -> Result<PathBuf, Failed> {
    let dir = libvirt_dir();
    for program in ["sbin/virtchd", "bin/virsh", "etc"] {
        if !dir.join(program).exists() {
            return Err(format!(
                "libvirt is not built ({} is missing): run `make libvirt` \
                 (resources/libvirt/build.sh; `make test` runs it first)",
                dir.join(program).display()
            )
            .into());
        }
    }
    Ok(dir)
}

/// Runs `cmd`, killed at `deadline`, or once `give_up` (asked every 200 ms) says why: its
/// output.
fn run_with_deadline(
    cmd: &mut Command,
    deadline: Duration,
    give_up: &dyn Fn() -> Option<String>,
) -> Result<Output, Failed> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let end = Instant::now() + deadline;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(out) => return out.map_err(|e| format!("{cmd:?}: {e}").into()),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(format!("{cmd:?}: lost").into())
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        let why = if Instant::now() > end {
            Some(format!("did not finish within {deadline:?}"))
        } else {
            give_up()
        };
        if let Some(why) = why {
            kill(pid, "-KILL");
            return Err(format!("{cmd:?} {why} (killed)").into());
        }
    }
}

/// `kill SIGNAL PID`, quietly (the process may be gone).
fn kill(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The test directory `dir` of a virtchd from the build `prefix`: the ch driver's log, save
/// and state directories (a package would create them), the build's configuration, and on
/// `bin/` lull as `cloud-hypervisor` and one wrapper per irqchip mode.
fn prepare_dir(dir: &Path, prefix: &Path) -> Result<(), Failed> {
    let _ = std::fs::remove_dir_all(dir);
    let subs = [
        "var/log/libvirt/ch",
        "var/lib/libvirt/ch/save",
        "var/cache/libvirt/ch",
        "run/libvirt/ch",
        "bin/irqchip-kernel",
        "bin/irqchip-user",
    ];
    for sub in subs {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("{sub}: {e}"))?;
    }
    crate::sh(
        "cp",
        &[
            "-a",
            &path_str(&prefix.join("etc")),
            &path_str(&dir.join("etc")),
        ],
    )?;
    std::fs::create_dir_all(STATE_ROOT).map_err(|e| format!("{STATE_ROOT}: {e}"))?;
    let bin = dir.join("bin");
    std::os::unix::fs::symlink(lull_bin(), bin.join("cloud-hypervisor"))
        .map_err(|e| format!("cloud-hypervisor link: {e}"))?;
    for mode in ["kernel", "user"] {
        write_wrapper(&bin.join(format!("irqchip-{mode}")), mode)?;
    }
    Ok(())
}

/// virtchd of the build `prefix` in a private mount namespace (inside `netns` if given) with
/// `dir` bind-mounted on [`STATE_ROOT`], `dir/bin` first on its PATH, logging into `dir`.
fn spawn_virtchd(dir: &Path, prefix: &Path, netns: Option<&str>) -> Result<Child, Failed> {
    let path = format!(
        "{}:{}",
        dir.join("bin").display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    );
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "unshare"]);
            c
        }
        None => Command::new("unshare"),
    };
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount --bind \"$0\" \"$1\" && exec \"$2\"")
        .arg(dir)
        .arg(STATE_ROOT)
        .arg(prefix.join("sbin/virtchd"))
        .env("PATH", path)
        .env(
            "LIBVIRT_LOG_OUTPUTS",
            format!("1:file:{}", dir.join("virtchd.log").display()),
        )
        .env("LIBVIRT_LOG_FILTERS", "1:ch 1:util.command 3:*")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(dir.join("virtchd.stderr"))
                .map_err(|e| format!("virtchd.stderr: {e}"))?,
        );
    Ok(cmd
        .spawn()
        .map_err(|e| format!("cannot start virtchd: {e}"))?)
}

/// A virtchd of one test, in its own mount namespace (and network namespace, if given);
/// stopped, with every VM it started, on drop.
pub struct Virtchd {
    /// The test directory (module docs).
    pub dir: PathBuf,
    /// The libvirt build.
    prefix: PathBuf,
    /// `virsh -c` URI of this virtchd.
    pub uri: String,
    child: Option<Child>,
    /// The domains virsh was asked about: their cgroups are removed on drop.
    domains: Mutex<Vec<String>>,
    /// Whether drop removes the test directory ([`Virtchd::passed`]).
    remove_dir: bool,
}

impl Virtchd {
    /// Starts virtchd for test `name`, inside network namespace `netns` if given, and waits
    /// until virsh can talk to it (its ch driver found `cloud-hypervisor` and took its
    /// version).
    pub fn start(name: &str, netns: Option<&str>) -> Result<Self, Failed> {
        let prefix = libvirt_build()?;
        let dir = temp_path(&format!("lv-{name}"));
        prepare_dir(&dir, &prefix)?;
        let socket = dir.join("run/libvirt/virtchd-sock");
        let uri = format!("ch:///system?socket={}", socket.display());
        let child = spawn_virtchd(&dir, &prefix, netns)?;
        let mut v = Self {
            dir,
            prefix,
            uri,
            child: Some(child),
            domains: Mutex::new(Vec::new()),
            remove_dir: false,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(Ok(Some(status))) = v.child.as_mut().map(Child::try_wait) {
                v.child = None;
                return Err(format!("virtchd exited at start ({status}){}", v.logs(None)).into());
            }
            if socket.exists() {
                let out = v.virsh_output(&["uri"])?;
                if out.status.success() {
                    return Ok(v);
                }
            }
            if Instant::now() > deadline {
                return Err(format!("virtchd did not answer within 60 s{}", v.logs(None)).into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops virtchd and removes the test directory: the test passed (a failed test keeps it
    /// for its logs, which the failure names).
    pub fn passed(mut self) {
        self.remove_dir = true;
    }

    /// The `<emulator>` that runs lull with `--lull irqchip=MODE` (module docs).
    pub fn emulator(&self, irqchip: &str) -> PathBuf {
        self.dir
            .join(format!("bin/irqchip-{irqchip}"))
            .join("cloud-hypervisor")
    }

    /// `virsh -c URI ARGS`, whatever its status.
    pub fn virsh_output(&self, args: &[&str]) -> Result<Output, Failed> {
        let mut cmd = Command::new(self.prefix.join("bin/virsh"));
        cmd.arg("-q").arg("-c").arg(&self.uri).args(args);
        run_with_deadline(&mut cmd, VIRSH_DEADLINE, &|| None)
    }

    /// `virsh -c URI ARGS` about `domain`, given up 5 s after the domain's lull has exited
    /// while virsh still waits: the ch driver waits for good for lull to open its event FIFO
    /// (`virsh start`, `restore`), or for an answer lull will not send.
    fn virsh_about(&self, args: &[&str], domain: &str) -> Result<Output, Failed> {
        let mut cmd = Command::new(self.prefix.join("bin/virsh"));
        cmd.arg("-q").arg("-c").arg(&self.uri).args(args);
        let dead_since = std::cell::Cell::new(None::<Instant>);
        let give_up = || {
            let pid = self.vm_pid(domain)?;
            if Path::new(&format!("/proc/{pid}")).exists() {
                return None;
            }
            let since = dead_since.get().unwrap_or_else(Instant::now);
            dead_since.set(Some(since));
            (since.elapsed() > Duration::from_secs(5))
                .then(|| format!("still waited 5 s after {domain}'s lull (pid {pid}) had exited"))
        };
        run_with_deadline(&mut cmd, VIRSH_DEADLINE, &give_up)
    }

    /// `virsh -c URI ARGS`: its standard output, or a failure with virsh's error and the logs
    /// of virtchd and of `domain` (lull's own output).
    pub fn virsh(&self, args: &[&str], domain: Option<&str>) -> Result<String, Failed> {
        if let (Some(domain), Ok(mut domains)) = (domain, self.domains.lock()) {
            if !domains.iter().any(|d| d == domain) {
                domains.push(domain.to_string());
            }
        }
        let out = match domain {
            Some(domain) => self.virsh_about(args, domain),
            None => self.virsh_output(args),
        };
        let out = out.map_err(|e| format!("{}{}", e.message().unwrap_or(""), self.logs(domain)))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            return Ok(stdout);
        }
        Err(format!(
            "virsh {} failed ({}): {}{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdout.trim(),
            self.logs(domain)
        )
        .into())
    }

    /// `virsh domstate DOMAIN`: "running", "paused", "shut off", ...
    pub fn state(&self, domain: &str) -> Result<String, Failed> {
        Ok(self
            .virsh(&["domstate", domain], Some(domain))?
            .trim()
            .to_string())
    }

    /// Waits up to `timeout` for `virsh domstate` to say `want`.
    pub fn wait_state(&self, domain: &str, want: &str, timeout: Duration) -> Result<(), Failed> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.state(domain)?;
            if state == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "domain {domain} is '{state}' after {timeout:?}, want '{want}'{}",
                    self.logs(Some(domain))
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The API socket the ch driver made for `domain`'s lull.
    pub fn api_socket(&self, domain: &str) -> PathBuf {
        self.dir.join(format!("run/libvirt/ch/{domain}-socket"))
    }

    /// The pid of `domain`'s lull, from the ch driver's pid file, if it is there.
    pub fn vm_pid(&self, domain: &str) -> Option<u32> {
        let path = self.dir.join(format!("run/libvirt/ch/{domain}.pid"));
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// What `domain`'s lull wrote (its stdout and stderr go to the domain's log file).
    pub fn domain_log(&self, domain: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("var/log/libvirt/ch/{domain}.log")))
            .unwrap_or_default()
    }

    /// The error lines of virtchd's log and the tail of `domain`'s log, for a failure message.
    pub fn logs(&self, domain: Option<&str>) -> String {
        let log = std::fs::read_to_string(self.dir.join("virtchd.log")).unwrap_or_default();
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(": error : ") || l.contains(": warning : "))
            .collect();
        let stderr = std::fs::read_to_string(self.dir.join("virtchd.stderr")).unwrap_or_default();
        let mut text = format!(
            "\n--- virtchd errors and warnings ({}):\n{}",
            self.dir.join("virtchd.log").display(),
            tail(&errors, 30)
        );
        if !stderr.trim().is_empty() {
            text += &format!("\n--- virtchd stderr:\n{}", stderr.trim());
        }
        if let Some(domain) = domain {
            let lines: Vec<String> = self.domain_log(domain).lines().map(String::from).collect();
            let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
            text += &format!("\n--- {domain}'s log (lull):\n{}", tail(&lines, 30));
        }
        text
    }
}

impl Drop for Virtchd {
    fn drop(&mut self) {
        // The VMs first: daemonized, they outlive virtchd.
        if let Ok(dir) = std::fs::read_dir(self.dir.join("run/libvirt/ch")) {
            for entry in dir.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "pid") {
                    let pid = std::fs::read_to_string(&path).ok();
                    if let Some(pid) = pid.and_then(|p| p.trim().parse().ok()) {
                        kill(pid, "-KILL");
                    }
                }
            }
        }
        // virtchd may be stuck opening a VM's event FIFO: TERM, then KILL.
        if let Some(mut child) = self.child.take() {
            kill(child.id(), "-TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let domains = self.domains.lock().map(|d| d.clone()).unwrap_or_default();
        for domain in domains {
            remove_machine_cgroups(&domain);
        }
        if self.remove_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Removes the cgroups libvirt made for `domain`'s VMs (`machine/ch-PID-NAME.libvirt-ch` in
/// every hierarchy, with its `emulator` and `vcpuN` children), which outlive a test that
/// failed half-way (libvirt removes them when it stops a VM).
fn remove_machine_cgroups(domain: &str) {
    let suffix = format!("-{domain}.libvirt-ch");
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let mut cgroups: Vec<PathBuf> = Vec::new();
    for hierarchy in hierarchies.flatten() {
        let machine = hierarchy.path().join("machine");
        let Ok(entries) = std::fs::read_dir(&machine) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("ch-") && name.ends_with(&suffix) {
                cgroups.push(entry.path());
            }
        }
    }
    // Its processes may take a moment to leave (killed just before).
    for _ in 0..20 {
        cgroups.retain(|cgroup| {
            if let Ok(children) = std::fs::read_dir(cgroup) {
                for child in children.flatten() {
                    if child.file_type().is_ok_and(|t| t.is_dir()) {
                        let _ = std::fs::remove_dir(child.path());
                    }
                }
            }
            std::fs::remove_dir(cgroup).is_err() && cgroup.exists()
        });
        if cgroups.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `DIR/cloud-hypervisor`: `exec lull ch --lull irqchip=MODE "$@"`.
fn write_wrapper(dir: &Path, irqchip: &str) -> Result<(), Failed> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("cloud-hypervisor");
    let script = format!(
        "#!/bin/sh\n# lull as cloud-hypervisor with the {irqchip} irqchip (tests/src/libvirt.rs)\n\
         exec '{}' ch --lull irqchip={irqchip} \"$@\"\n",
        lull_bin().display()
    );
    std::fs::write(&path, script).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

fn tail(lines: &[&str], n: usize) -> String {
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `virsh console DOMAIN --force` on a pty of its own (virsh refuses a console without a
/// terminal), everything it prints gathered; killed on drop.
pub struct Console {
    child: Child,
    output: Arc<Mutex<String>>,
}

impl Console {
    /// Attaches to `domain`'s console.
    pub fn attach(virtchd: &Virtchd, domain: &str) -> Result<Self, Failed> {
        let (master, slave) = openpty()?;
        let stdio = |fd: &OwnedFd| -> Result<Stdio, Failed> {
            Ok(Stdio::from(fd.try_clone().map_err(|e| e.to_string())?))
        };
        let child = Command::new(virtchd.prefix.join("bin/virsh"))
            .arg("-c")
            .arg(&virtchd.uri)
            .args(["console", domain, "--force"])
            .stdin(stdio(&slave)?)
            .stdout(stdio(&slave)?)
            .stderr(stdio(&slave)?)
            .spawn()
            .map_err(|e| format!("cannot run virsh console: {e}"))?;
        drop(slave);
        let output = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&output);
        let mut master = std::fs::File::from(master);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once virsh has exited and the slave is closed.
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut text) = sink.lock() {
                    text.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        Ok(Self { child, output })
    }

    /// Everything virsh printed so far (its banner, then the guest's output).
    pub fn text(&self) -> String {
        self.output.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Waits up to `timeout` for `needle` in the console output: the output so far.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<String, Failed> {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.text();
            if text.contains(needle) {
                return Ok(text);
            }
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                // Whatever was still in the pty.
                std::thread::sleep(Duration::from_millis(200));
                return Err(format!(
                    "virsh console: no {needle:?} within {timeout:?}{}; it printed:\n{}",
                    if exited { " (virsh exited)" } else { "" },
                    self.text()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pty pair: (master, slave).
fn openpty() -> Result<(OwnedFd, OwnedFd), Failed> {
    let pty = nix::pty::openpty(None, None).map_err(|e| format!("openpty: {e}"))?;
    Ok((pty.master, pty.slave))
}
