//! The clients of the `orchestrators` tests: lull started as `cloud-hypervisor`, ch-remote's
//! way of sending a command and reading its answer, and Go's HTTP client on a kept-alive
//! connection.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lull_tests::{lull_bin, read_by_length, report_from, temp_path, Failed};
use serde_json::Value;

/// `cloud-hypervisor`: a symlink to the lull under test, in a directory of its own.
pub fn cloud_hypervisor(name: &str) -> Result<PathBuf, Failed> {
    let dir = temp_path(&format!("{name}-bin"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let link = dir.join("cloud-hypervisor");
    std::os::unix::fs::symlink(lull_bin(), &link).map_err(|e| e.to_string())?;
    Ok(link)
}

/// lull started as `cloud-hypervisor ARGS` serving SOCKET; killed if the test fails early.
pub struct Ch {
    /// The process (`None` once waited for).
    pub child: Option<Child>,
    /// The API socket.
    pub socket: PathBuf,
    /// lull's stderr, line by line.
    pub log: mpsc::Receiver<String>,
}

impl Ch {
    /// Starts `cloud-hypervisor --api-socket SOCKET ARGS` (SOCKET in the form `api_form`
    /// gives) and waits for the socket to take a connection.
    pub fn start(name: &str, api_form: fn(&Path) -> String, args: &[&str]) -> Result<Self, Failed> {
        let socket = temp_path(&format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let mut child = Command::new(cloud_hypervisor(name)?)
            .arg("--api-socket")
            .arg(api_form(&socket))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start cloud-hypervisor: {e}"))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut ch = Self {
            child: Some(child),
            socket,
            log,
        };
        // As the driver's waitForAPISocket: until the socket takes a connection (lull's own
        // log may be in --log-file).
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&ch.socket).is_err() {
            if let Some(child) = ch.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("lull exited ({status}): {}", ch.log_text()).into());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no API socket within 30 s: {}", ch.log_text()).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(ch)
    }

    /// Sends SIGTERM (as the driver does after vm.shutdown) and waits for the exit status.
    pub fn terminate(mut self) -> Result<i32, Failed> {
        let mut child = self.child.take().ok_or("already waited for")?;
        let kill = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        if !kill.success() {
            return Err("kill -TERM failed".into());
        }
        Self::wait(&mut child)
    }

    /// Waits for lull to exit by itself (after vmm.shutdown).
    pub fn exit_status(mut self) -> Result<i32, Failed> {
        let mut child = self.child.take().ok_or("already waited for")?;
        Self::wait(&mut child)
    }

    pub fn wait(child: &mut Child) -> Result<i32, Failed> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return status.code().ok_or_else(|| "lull died by a signal".into());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err("lull did not exit within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.try_iter().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Ch {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One ch-remote command, as its `api_client` sends it and reads the answer (see the module
/// comment): the status and the body (`None` without a Content-Length, as it has it).
pub fn ch_remote(
    socket: &Path,
    method: &str,
    command: &str,
    body: Option<&str>,
) -> Result<(u16, Option<String>), Failed> {
    let mut conn = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let io = |e: std::io::Error| format!("{method} {command}: {e}");
    conn.write_all(
        format!("{method} /api/v1/{command} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n")
            .as_bytes(),
    )
    .map_err(io)?;
    if let Some(body) = body {
        conn.write_all(format!("Content-Length: {}\r\n", body.len()).as_bytes())
            .map_err(io)?;
    }
    conn.write_all(b"\r\n").map_err(io)?;
    if let Some(body) = body {
        conn.write_all(body.as_bytes()).map_err(io)?;
    }
    vmm::api::ch_client::read_answer(&mut conn)
        .map_err(|e| format!("{method} {command}: {e}").into())
}

/// ch-remote's command, failing unless it answers `want`; the body as JSON (`Null` if none).
pub fn expect(
    socket: &Path,
    method: &str,
    command: &str,
    body: Option<&str>,
    want: u16,
) -> Result<Value, Failed> {
    let (status, text) = ch_remote(socket, method, command, body)?;
    if status != want {
        return Err(format!("{method} {command}: {status}, want {want}: {text:?}").into());
    }
    match text {
        Some(text) if !text.is_empty() => {
            serde_json::from_str(&text).map_err(|e| format!("{command}: {e}: {text}").into())
        }
        _ => Ok(Value::Null),
    }
}

/// A connection of Go's HTTP client (Go's net/http transport writes a request whole, with
/// `User-Agent` and `Accept-Encoding`, and reuses the connection for the next request).
pub struct GoClient {
    /// The connection.
    pub conn: UnixStream,
}

impl GoClient {
    pub fn connect(socket: &Path) -> Result<Self, Failed> {
        let conn = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        Ok(Self { conn })
    }

    /// One request; the status and the body of the answer, read by its Content-Length.
    pub fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, String), Failed> {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: Go-http-client/1.1\r\n"
        );
        if let Some(body) = body {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("Accept-Encoding: gzip\r\n\r\n");
        req.push_str(body.unwrap_or_default());
        self.conn
            .write_all(req.as_bytes())
            .map_err(|e| format!("send: {e}"))?;
        let (head, body) =
            read_by_length(&mut self.conn).map_err(|e| format!("{method} {path}: {e}"))?;
        if head.contains("Connection: close") {
            return Err(
                format!("{method} {path}: lull closes a kept-alive connection: {head}").into(),
            );
        }
        let status = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("status line: {head}"))?;
        Ok((status, body))
    }

    pub fn expect(
        &mut self,
        method: &str,
        endpoint: &str,
        body: Option<&str>,
        want: u16,
    ) -> Result<String, Failed> {
        let (status, text) = self.call(method, &format!("/api/v1/{endpoint}"), body)?;
        if status != want {
            return Err(format!("{method} {endpoint}: {status}, want {want}: {text}").into());
        }
        Ok(text)
    }
}

/// A raw image of 1 MiB for a disk.
pub fn image(name: &str) -> Result<PathBuf, Failed> {
    let path = temp_path(&format!("{name}.img"));
    std::fs::write(&path, vec![0u8; 1 << 20]).map_err(|e| e.to_string())?;
    Ok(path)
}

pub fn path_form(socket: &Path) -> String {
    format!("path={}", socket.display())
}

pub fn bare_form(socket: &Path) -> String {
    socket.display().to_string()
}

/// `vm.info` until its state is `want` (the driver's waitForVMState), up to 30 s.
pub fn wait_state(go: &mut GoClient, want: &str) -> Result<Value, Failed> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: Value = serde_json::from_str(&go.expect("GET", "vm.info", None, 200)?)
            .map_err(|e| e.to_string())?;
        if info["state"] == want {
            return Ok(info);
        }
        if Instant::now() > deadline {
            return Err(format!("state never became {want}: {info}").into());
        }
        // The driver polls every second; this only spaces the queries.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Until the guest's LAPIC timer has fired at least `n` times in this run (it runs).
pub fn wait_guest_timers(go: &mut GoClient, n: u64) -> Result<u64, Failed> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let report = report_from(&go.expect("GET", "vm.counters", None, 200)?)?;
        let fires: u64 = report.vcpus.iter().map(|v| v.lapic_timer_fires).sum();
        if fires >= n {
            return Ok(fires);
        }
        if Instant::now() > deadline {
            return Err(format!("the guest's timers did not fire: {report:?}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// ch-remote's `shutdown-vmm`, then lull's exit status must be `want`.
pub fn shutdown_vmm(ch: Ch, want: i32) -> Result<(), Failed> {
    expect(&ch.socket, "PUT", "vmm.shutdown", None, 204)?;
    match ch.exit_status()? {
        code if code == want => Ok(()),
        code => Err(format!("exit {code}, want {want}").into()),
    }
}
