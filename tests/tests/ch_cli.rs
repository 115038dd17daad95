//! `lull ch` (lull as `cloud-hypervisor`): its command line as Cloud Hypervisor's clap command
//! reads it, and the descriptors a client sends with `vm.add-net`, as the binary answers them.
//!
//! - A flag that takes one value comes once: a second `--api-socket` (or `--serial`) is
//!   refused, exit 2, naming it, and nothing is served (before, the last one was kept).
//! - An empty `--disk path=` is said to be empty (before, "not a --disk option").
//! - `--help` lists every flag lull takes and every flag it refuses, with the reason.
//! - `vm.add-net` with 50 fds says 50 were sent (before: 8), does not name lull's numbers
//!   for the fds it received, and closes every one of them.

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_tests::exit_status::USAGE;
use lull_tests::{
    api_call, api_put_with_fds, kit_file, lull_bin, run_lull, temp_path, Arguments, Failed, Trial,
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

fn repeated_single_valued_flags_are_refused() -> Result<(), Failed> {
    let first = temp_path("ch-cli-first.sock");
    let second = temp_path("ch-cli-second.sock");
    for path in [&first, &second] {
        let _ = std::fs::remove_file(path);
    }
    let (a, b) = (first.display().to_string(), second.display().to_string());
    for (args, named) in [
        (vec!["--api-socket", &a, "--api-socket", &b], "--api-socket"),
        (
            vec!["--api-socket", &a, "--serial", "tty", "--serial", "off"],
            "--serial",
        ),
    ] {
        let mut argv = vec!["ch"];
        argv.extend(args.iter().copied());
        // Before, lull served the second socket until killed.
        let r = run_lull(&argv, Duration::from_secs(10))?;
        r.expect_code(USAGE)?;
        if !r
            .stderr
            .contains(&format!("{named} was given more than once"))
        {
            return Err(r.failure(&format!("the message does not name {named} as repeated")));
        }
        if first.exists() || second.exists() {
            return Err(r.failure("an API socket was created"));
        }
    }
    Ok(())
}

fn an_empty_disk_path_is_called_empty() -> Result<(), Failed> {
    let r = run_lull(&["ch", "--disk", "path="], DEADLINE)?;
    r.expect_code(USAGE)?;
    if !r.stderr.contains("--disk path is empty") {
        return Err(r.failure("the message does not say the path is empty"));
    }
    Ok(())
}

fn help_lists_what_lull_takes_and_refuses() -> Result<(), Failed> {
    let r = run_lull(&["ch", "--help"], DEADLINE)?;
    r.expect_code(0)?;
    for taken in [
        "--api-socket",
        "--kernel",
        "--initramfs",
        "--cmdline",
        "--cpus",
        "--memory",
        "--disk",
        "--net",
        "--serial",
        "--console",
        "--rng",
        "--log-file",
        "-v",
        "--seccomp",
        "--platform",
        "--lull",
        "--restore",
        "--version",
        "--help",
    ] {
        r.expect_stdout(taken)?;
    }
    for refused in [
        "--fs",
        "lull has no virtio-fs",
        "--gdb",
        "lull has no gdb stub",
    ] {
        r.expect_stdout(refused)?;
    }
    Ok(())
}

/// `lull ch --api-socket path=SOCKET` once it says it serves; killed on drop.
struct ChApi {
    child: Child,
    socket: PathBuf,
}

impl ChApi {
    fn start(name: &str) -> Result<Self, Failed> {
        let socket = temp_path(&format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let mut child = Command::new(lull_bin())
            .args(["ch", "--api-socket"])
            .arg(format!("path={}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start lull ch: {e}"))?;
        let stderr = child.stderr.take().ok_or("no stderr pipe")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let api = Self { child, socket };
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("management API on") => return Ok(api),
                Ok(_) => {}
                Err(_) => return Err("lull ch did not announce its API socket".into()),
            }
        }
    }

    /// How many of lull's descriptors are open on /dev/null.
    fn dev_null_fds(&self) -> Result<usize, Failed> {
        let dir = format!("/proc/{}/fd", self.child.id());
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
        Ok(entries
            .filter_map(Result::ok)
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|p| p == Path::new("/dev/null")))
            .count())
    }
}

impl Drop for ChApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// ch-remote's `add-net` (and Kata's): the request's first write carries the fds.
fn add_net_with_fds(socket: &Path, fds: &[i32]) -> Result<(u16, String), Failed> {
    api_put_with_fds(socket, "vm.add-net", r#"{"mac": "52:54:00:00:00:45"}"#, fds)
}

fn add_net_counts_every_fd_sent_and_closes_them() -> Result<(), Failed> {
    let lull = ChApi::start("ch-cli-fds")?;
    let kernel = kit_file("guests/hello.elf")?;
    let create = json!({"payload": {"kernel": kernel}}).to_string();
    let (status, text) = api_call(&lull.socket, "PUT", "vm.create", &create)?;
    if status != 204 {
        return Err(format!("vm.create: {status} {text}").into());
    }
    let before = lull.dev_null_fds()?;
    let null = std::fs::File::open("/dev/null").map_err(|e| e.to_string())?;
    let (status, text) = add_net_with_fds(&lull.socket, &[null.as_raw_fd(); 50])?;
    if status != 400 || !text.contains("; 50 were sent") {
        return Err(format!("vm.add-net with 50 fds: {status} {text}").into());
    }
    // The answer comes after the request's fds were dropped: none is left open.
    let after = lull.dev_null_fds()?;
    if after != before {
        return Err(format!("lull's fds on /dev/null: {before} before, {after} after").into());
    }
    let (status, text) = add_net_with_fds(&lull.socket, &[null.as_raw_fd()])?;
    if status != 400
        || !text.contains("The fd sent with the request is not a tap")
        || text.contains("File descriptor")
    {
        return Err(format!("vm.add-net with /dev/null: {status} {text}").into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test(
            "ch_repeated_single_valued_flags_are_refused",
            repeated_single_valued_flags_are_refused,
        ),
        Trial::test(
            "ch_an_empty_disk_path_is_called_empty",
            an_empty_disk_path_is_called_empty,
        ),
        Trial::test(
            "ch_help_lists_what_lull_takes_and_refuses",
            help_lists_what_lull_takes_and_refuses,
        ),
        Trial::test(
            "ch_add_net_counts_every_fd_sent_and_closes_them",
            add_net_counts_every_fd_sent_and_closes_them,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
