//! The API under more clients than it serves at once (`docs/API.md`, "Connections"): many
//! clients polling `vm.info` on kept-alive connections while one client pauses and resumes
//! the VM, each request on a connection of its own. Every pause and resume whose bytes were
//! sent must get an HTTP answer (a 503 "too many connections" is an answer: the request was
//! not carried out and is sent again), none may be cut off after it was sent, and the VM's
//! state must be the one the answers say.
//!
//! `LULL_API_LIMITS_REQUESTS=N` (default 200) and `LULL_API_LIMITS_POLLERS=N` (default 200)
//! size the run; the figure is 200 pollers and 1,000 requests.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lull_tests::exit_status::API_STOP;
use lull_tests::{kit_file, kvm_trial, start_api_server, temp_path, ApiLull, Arguments, Failed};

/// How long the whole exchange may take before the test gives up.
const BOUND: Duration = Duration::from_secs(240);

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One answer read from `conn`: its status and whether it closes the connection; `None` if the
/// connection ended (EOF or an error) before a whole answer.
fn read_answer(conn: &mut UnixStream, buf: &mut Vec<u8>) -> Option<(u16, bool)> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                buf.drain(..end + 4 + length);
                let status = head.get(9..12)?.parse().ok()?;
                let closes = head.to_ascii_lowercase().contains("connection: close");
                return Some((status, closes));
            }
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// What the pollers saw, for the report.
#[derive(Default)]
struct PollerCounts {
    answered: AtomicU64,
    refused: AtomicU64,
    cut: AtomicU64,
}

/// A client polling `vm.info` on a kept-alive connection, reconnecting whenever lull closes
/// it (closing an idle kept-alive connection to make room is allowed), until `stop`.
fn poll_info(socket: PathBuf, stop: Arc<AtomicBool>, counts: Arc<PollerCounts>) {
    let request = b"GET /api/v1/vm.info HTTP/1.1\r\nHost: localhost\r\n\r\n";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut conn) = UnixStream::connect(&socket) else {
            continue;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
        let mut buf = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if conn.write_all(request).is_err() {
                break;
            }
            match read_answer(&mut conn, &mut buf) {
                Some((503, _)) => {
                    counts.refused.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Some((_, closes)) => {
                    counts.answered.fetch_add(1, Ordering::Relaxed);
                    if closes {
                        break;
                    }
                }
                None => {
                    counts.cut.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

/// How one pause or resume request went.
enum Outcome {
    /// Answered with this status.
    Answered(u16),
    /// lull took none of its bytes (the connection was closed before): never sent.
    NotSent,
    /// Sent whole, then the connection ended with no answer: what must never happen.
    Cut(String),
}

/// `PUT endpoint` on a connection of its own, `Connection: close`.
fn put_once(socket: &Path, endpoint: &str) -> Outcome {
    let Ok(mut conn) = UnixStream::connect(socket) else {
        return Outcome::NotSent;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let request =
        format!("PUT /api/v1/{endpoint} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    // The request is a single write of ~70 bytes: it lands whole or not at all.
    if conn.write_all(request.as_bytes()).is_err() {
        return Outcome::NotSent;
    }
    let mut buf = Vec::new();
    match read_answer(&mut conn, &mut buf) {
        Some((status, _)) => Outcome::Answered(status),
        None => Outcome::Cut(format!("{endpoint} sent, no answer")),
    }
}

fn pause_resume_under_polling_clients() -> Result<(), Failed> {
    let requests = env_count("LULL_API_LIMITS_REQUESTS", 200);
    let pollers = env_count("LULL_API_LIMITS_POLLERS", 200);
    let kernel = kit_file("guests/idle-sim.elf")?;
    let kernel = kernel.to_str().ok_or("kit path is not UTF-8")?;
    let metrics = temp_path("api-limits.json");
    let metrics_arg = metrics.display().to_string();
    let server = start_api_server(
        "api-limits",
        &[
            "--kernel",
            kernel,
            "--cmdline",
            "duration_ms=600000 cpus=1",
            "--cpus",
            "1",
            "--serial",
            "off",
            "--metrics",
            &metrics_arg,
        ],
    )?;
    let lull = ApiLull::from(server);
    lull.put("vm.boot", "")?;
    let socket = lull.socket().to_path_buf();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(PollerCounts::default());
    let threads: Vec<_> = (0..pollers)
        .map(|_| {
            let (socket, stop, counts) = (socket.clone(), stop.clone(), counts.clone());
            std::thread::spawn(move || poll_info(socket, stop, counts))
        })
        .collect();
    let result = drive_pause_resume(&socket, requests);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    eprintln!(
        "pollers: {} answered, {} refused (503), {} cut while idle-kept-alive or mid-request",
        counts.answered.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        counts.cut.load(Ordering::Relaxed),
    );
    let paused = result?;
    let (status, info) = lull_tests::api_call(&socket, "GET", "vm.info", "")?;
    let state: serde_json::Value =
        serde_json::from_str(&info).map_err(|e| format!("vm.info: {e}: {info}"))?;
    let want = if paused { "Paused" } else { "Running" };
    if status != 200 || state["state"] != want {
        return Err(format!("after the requests the answers say {want}, vm.info: {info}").into());
    }
    if paused {
        lull.put("vm.resume", "")?;
    }
    lull.shutdown(API_STOP)?;
    let _ = std::fs::remove_file(&metrics);
    Ok(())
}

/// Sends `requests` pauses and resumes, alternating, each until it is answered 204 (a 503 or
/// a connection that took nothing is sent again); fails on any other answer or on a request
/// cut off after it was sent. Returns whether the VM should now be paused.
fn drive_pause_resume(socket: &Path, requests: usize) -> Result<bool, Failed> {
    let start = Instant::now();
    let (mut refused, mut not_sent) = (0u64, 0u64);
    let mut paused = false;
    for i in 0..requests {
        let endpoint = if paused { "vm.resume" } else { "vm.pause" };
        loop {
            if start.elapsed() > BOUND {
                return Err(
                    format!("only {i} of {requests} requests answered in {BOUND:?}").into(),
                );
            }
            match put_once(socket, endpoint) {
                Outcome::Answered(204) => break,
                Outcome::Answered(503) => refused += 1,
                Outcome::Answered(status) => {
                    return Err(format!(
                        "request {i}, {endpoint}: answered {status} (a request cut off before \
                         was carried out?)"
                    )
                    .into())
                }
                Outcome::NotSent => not_sent += 1,
                Outcome::Cut(what) => return Err(format!("request {i}: {what}").into()),
            }
        }
        paused = !paused;
    }
    eprintln!(
        "{requests} pause/resume requests answered 204 in {:?}; {refused} answers 503 (sent \
         again), {not_sent} connections closed before the request was sent; 0 cut off",
        start.elapsed()
    );
    Ok(paused)
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![kvm_trial(
        "api_pause_resume_under_200_polling_clients_are_all_answered",
        pause_resume_under_polling_clients,
    )];
    libtest_mimic::run(&args, trials).exit();
}
