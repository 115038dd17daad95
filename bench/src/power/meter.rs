//! An external power meter (`--power-meter CMD`): a thread runs `sh -c CMD` once a second; CMD
//! prints the host's power in watts (a wall meter, IPMI DCMI, a PDU). The samples are
//! integrated over the window.
//!
//! ```text
//! accepted:   123.4            123.4 W            98 Watts
//!             Instantaneous power reading:                   123 Watts    (ipmitool dcmi power reading)
//! a sample:   CMD exits 0 and prints one of these      -> watts
//!             CMD fails, prints anything else, or runs past the timeout (its process group is
//!             killed)                                  -> an error for that sample; sampling goes on
//! the window: trapezoids between valid samples, the first and last held to the window's edges
//!             -> joules, mean watts, samples taken and valid; none valid -> an error (a reason)
//! ```

use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::children;

/// How long a killed command may take to close its output.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// What to run and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterConfig {
    /// The shell command that prints watts.
    pub command: String,
    /// Time between the starts of two samples.
    pub interval: Duration,
    /// How long one run of the command may take before it is killed.
    pub timeout: Duration,
}

impl MeterConfig {
    /// `command` once a second, killed after 2 s.
    pub fn new(command: &str) -> Self {
        Self {
            command: command.to_string(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
        }
    }
}

/// One run of the command.
#[derive(Debug, Clone, PartialEq)]
pub struct MeterSample {
    /// When its output arrived, from the meter's start.
    pub at: Duration,
    /// The watts it printed, or why there are none.
    pub watts: Result<f64, MeterError>,
}

/// The meter over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeterWindow {
    /// Samples taken in the window.
    pub samples: usize,
    /// Of these, the ones that gave watts.
    pub valid: usize,
    /// Energy over the window in joules.
    pub joules: f64,
    /// Mean power over the window in watts.
    pub watts: f64,
    /// The distinct errors of the other samples (at most three).
    pub errors: Vec<String>,
}

/// Why a sample or a window has no watts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeterError {
    /// `sh` could not be started.
    #[error("cannot run the power meter command with sh: {0}")]
    Spawn(String),
    /// The command exited with an error.
    #[error("the power meter command failed ({0}): {1}")]
    Failed(String, String),
    /// The command ran past its timeout and was killed.
    #[error("the power meter command printed no reading within {after:?} and was killed{}",
        if *ended { "" } else { ", but its output stayed open" })]
    Hung {
        /// The timeout.
        after: Duration,
        /// Whether the command's output closed after the kill.
        ended: bool,
    },
    /// The output holds no watts.
    #[error(
        "the power meter printed {0:?}, not watts: print a number, `123.4 W`, or IPMI DCMI's \
             `Instantaneous power reading: 123 Watts`"
    )]
    Garbage(String),
    /// IPMI DCMI says its reading is off.
    #[error("IPMI DCMI power reading is deactivated: activate it (ipmitool dcmi power activate)")]
    Deactivated,
    /// No valid sample in the window.
    #[error("no valid power meter sample in the window ({0} taken): {1}")]
    NoValidSample(usize, String),
    /// A zero interval would run the command without pause.
    #[error("the power meter's interval must be above zero")]
    ZeroInterval,
    /// The sampling thread could not start or died.
    #[error("the power meter thread failed: {0}")]
    Thread(String),
}

/// The watts in a command's output.
pub fn parse_watts(text: &str) -> Result<f64, MeterError> {
    let garbage = || {
        let excerpt: String = text.trim().chars().take(80).collect();
        MeterError::Garbage(excerpt)
    };
    if text
        .lines()
        .any(|l| l.contains("Power reading state is:") && l.contains("deactivated"))
    {
        return Err(MeterError::Deactivated);
    }
    let dcmi = text
        .lines()
        .find(|l| l.trim_start().starts_with("Instantaneous power reading"));
    let value = match dcmi {
        Some(line) => line.split_once(':').map(|(_, v)| v),
        None => {
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            match (lines.next(), lines.next()) {
                (Some(only), None) => Some(only),
                _ => None,
            }
        }
    };
    value.and_then(watts_of).ok_or_else(garbage)
}

/// `123.4`, `123.4 W`, `123 Watts`: a non-negative number and an optional unit.
fn watts_of(text: &str) -> Option<f64> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    let watts: f64 = number.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    (watts.is_finite() && ["", "w", "watt", "watts"].contains(&unit.as_str())).then_some(watts)
}

/// Runs `sh -c command` once, killing its process group after `timeout`.
pub fn read_once(command: &str, timeout: Duration) -> Result<f64, MeterError> {
    let child = children::guard(Command::new("sh").arg("-c").arg(command))
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| MeterError::Spawn(e.to_string()))?;
    let group = libc::pid_t::try_from(child.id()).map_err(|e| MeterError::Spawn(e.to_string()))?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("power-meter-cmd".into())
        .spawn(move || tx.send(child.wait_with_output()))
        .map_err(|e| MeterError::Thread(e.to_string()))?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(output)) => watts_of_output(&output),
        Ok(Err(e)) => Err(MeterError::Spawn(e.to_string())),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            // The group is the command's own (process_group(0) made its shell the leader), and
            // it lives until the waiting thread has reaped the shell, which has not happened yet.
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
            Err(MeterError::Hung {
                after: timeout,
                ended: rx.recv_timeout(KILL_GRACE).is_ok(),
            })
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(MeterError::Thread(
            "the command's waiting thread died".into(),
        )),
    }
}

fn watts_of_output(output: &Output) -> Result<f64, MeterError> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said = if stderr.trim().is_empty() {
            &stdout
        } else {
            &stderr
        };
        let excerpt: String = said.trim().chars().take(200).collect();
        return Err(MeterError::Failed(output.status.to_string(), excerpt));
    }
    parse_watts(&stdout)
}

/// The energy and mean power over `[0, end]` of the samples taken in it.
pub fn integrate(samples: &[MeterSample], end: Duration) -> Result<MeterWindow, MeterError> {
    let inside: Vec<&MeterSample> = samples.iter().filter(|s| s.at <= end).collect();
    let valid: Vec<(f64, f64)> = inside
        .iter()
        .filter_map(|s| Some((s.at.as_secs_f64(), *s.watts.as_ref().ok()?)))
        .collect();
    let mut errors: Vec<String> = Vec::new();
    for e in inside.iter().filter_map(|s| s.watts.as_ref().err()) {
        if errors.len() < 3 && !errors.contains(&e.to_string()) {
            errors.push(e.to_string());
        }
    }
    let (Some(&first), Some(&last)) = (valid.first(), valid.last()) else {
        let last = inside.iter().rev().find_map(|s| s.watts.as_ref().err());
        let why = last.map_or_else(|| "the command never finished".into(), |e| e.to_string());
        return Err(MeterError::NoValidSample(inside.len(), why));
    };
    let end = end.as_secs_f64();
    let mut joules = first.1 * first.0 + last.1 * (end - last.0);
    for pair in valid.windows(2) {
        joules += (pair[1].0 - pair[0].0) * (pair[0].1 + pair[1].1) / 2.0;
    }
    Ok(MeterWindow {
        samples: inside.len(),
        valid: valid.len(),
        watts: if end > 0.0 { joules / end } else { first.1 },
        joules,
        errors,
    })
}

/// Every sample of a stopped meter.
#[derive(Debug, Clone, PartialEq)]
pub struct MeterRecord {
    /// When the meter started (the samples' `at` count from here).
    pub started: Instant,
    /// The samples in the order taken.
    pub samples: Vec<MeterSample>,
}

impl MeterRecord {
    /// The energy and mean power over `[from, to]` of the samples taken in it (as
    /// [`integrate`] over a window that opened at `from`).
    pub fn between(&self, from: Instant, to: Instant) -> Result<MeterWindow, MeterError> {
        let open = from.saturating_duration_since(self.started);
        let close = to.saturating_duration_since(self.started);
        let inside: Vec<MeterSample> = self
            .samples
            .iter()
            .filter(|s| s.at >= open)
            .map(|s| MeterSample {
                at: s.at - open,
                watts: s.watts.clone(),
            })
            .collect();
        integrate(&inside, close.saturating_sub(open))
    }
}

/// The samples so far, and a signal for each new one.
type Shared = Arc<(Mutex<Vec<MeterSample>>, Condvar)>;

/// A running meter: its thread samples until [`Meter::finish`].
#[derive(Debug)]
pub struct Meter {
    started: Instant,
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
    samples: Shared,
}

impl Meter {
    /// Starts sampling now (the first sample at once).
    pub fn start(config: MeterConfig) -> Result<Meter, MeterError> {
        if config.interval.is_zero() {
            return Err(MeterError::ZeroInterval);
        }
        let (stop, stopped) = mpsc::channel();
        let samples: Shared = Arc::default();
        let started = Instant::now();
        let shared = Arc::clone(&samples);
        let thread = std::thread::Builder::new()
            .name("power-meter".into())
            .spawn(move || {
                let mut next = Duration::ZERO;
                loop {
                    let watts = read_once(&config.command, config.timeout);
                    let sample = MeterSample {
                        at: started.elapsed(),
                        watts,
                    };
                    let (list, added) = &*shared;
                    list.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
                    added.notify_all();
                    next += config.interval;
                    let now = started.elapsed();
                    if next <= now {
                        // A slow or hung command: the next sample starts now.
                        next = now;
                    }
                    match stopped.recv_timeout(next - now) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
            })
            .map_err(|e| MeterError::Thread(e.to_string()))?;
        Ok(Meter {
            started,
            stop,
            thread,
            samples,
        })
    }

    /// Ends the window now and integrates its samples (a command still running is waited for,
    /// and its sample, later than the window, left out).
    pub fn finish(self) -> Result<MeterWindow, MeterError> {
        let end = self.started.elapsed();
        // The thread may already be gone (it panicked): the join below says so.
        let _ = self.stop.send(());
        self.thread
            .join()
            .map_err(|_| MeterError::Thread("the sampling thread panicked".into()))?;
        let list = self.samples.0.lock().unwrap_or_else(|e| e.into_inner());
        integrate(&list, end)
    }

    /// Stops sampling (a command still running is waited for) and hands over every sample,
    /// to integrate over any span of the run ([`MeterRecord::between`]).
    pub fn stop(self) -> Result<MeterRecord, MeterError> {
        let _ = self.stop.send(());
        self.thread
            .join()
            .map_err(|_| MeterError::Thread("the sampling thread panicked".into()))?;
        let samples = self.samples.0.lock().unwrap_or_else(|e| e.into_inner());
        Ok(MeterRecord {
            started: self.started,
            samples: samples.clone(),
        })
    }

    /// Blocks until `n` samples have been taken.
    #[cfg(test)]
    fn wait_for(&self, n: usize) {
        let (list, added) = &*self.samples;
        let mut list = list.lock().unwrap();
        while list.len() < n {
            list = added.wait(list).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_tree::TempTree;
    use super::*;

    const DCMI: &str = "
    Instantaneous power reading:                   123 Watts
    Minimum during sampling period:                 98 Watts
    Maximum during sampling period:                245 Watts
    Average power reading over sample period:      140 Watts
    IPMI timestamp:                           Thu Jan  1 00:00:00 2026
    Sampling period:                          00000001 Seconds.
    Power reading state is:                   activated
";

    #[test]
    fn watts_are_read_from_the_accepted_forms_and_nothing_else() {
        assert_eq!(parse_watts("123.4\n"), Ok(123.4));
        assert_eq!(parse_watts("123.4 W"), Ok(123.4));
        assert_eq!(parse_watts("\n  98W\n\n"), Ok(98.0));
        assert_eq!(parse_watts("7 watts"), Ok(7.0));
        assert_eq!(parse_watts(DCMI), Ok(123.0), "the instantaneous reading");
        let off = DCMI.replace(
            "state is:                   activated",
            "state is: deactivated",
        );
        assert_eq!(parse_watts(&off), Err(MeterError::Deactivated));
        for garbage in [
            "",
            "hello",
            "12 kW",
            "-5 W",
            "1 2",
            "12\n13",
            "NaN",
            "Power: 12 W",
        ] {
            assert!(
                matches!(parse_watts(garbage), Err(MeterError::Garbage(_))),
                "{garbage:?} parsed"
            );
        }
        let err = parse_watts("oops").unwrap_err().to_string();
        assert!(
            err.starts_with("the power meter printed \"oops\", not watts"),
            "{err}"
        );
    }

    #[test]
    fn a_command_that_fails_or_prints_garbage_says_why() {
        let t = Duration::from_secs(20);
        assert_eq!(read_once("echo 42.5 W", t), Ok(42.5));
        assert_eq!(
            read_once("echo 7; echo no meter >&2; exit 3", t),
            Err(MeterError::Failed(
                "exit status: 3".into(),
                "no meter".into()
            ))
        );
        assert!(matches!(
            read_once("no-such-power-meter-command", t),
            Err(MeterError::Failed(status, said)) if status == "exit status: 127" && said.contains("not found")
        ));
        assert_eq!(
            read_once("echo hello", t),
            Err(MeterError::Garbage("hello".into()))
        );
    }

    #[test]
    fn a_command_that_hangs_is_killed_with_its_children() {
        // The shell's child `sleep` holds the output open: only killing the whole group ends
        // it within the grace time (else it would run for 1000 s and `ended` be false).
        let err = read_once("sleep 1000; echo 5", Duration::from_millis(100)).unwrap_err();
        assert_eq!(
            err,
            MeterError::Hung {
                after: Duration::from_millis(100),
                ended: true
            }
        );
        assert_eq!(
            err.to_string(),
            "the power meter command printed no reading within 100ms and was killed"
        );
    }

    fn at(ms: u64, watts: Result<f64, MeterError>) -> MeterSample {
        MeterSample {
            at: Duration::from_millis(ms),
            watts,
        }
    }

    #[test]
    fn samples_integrate_by_trapezoids_held_at_the_edges() {
        let bad = || Err(MeterError::Garbage("x".into()));
        let samples = [
            at(1000, Ok(100.0)),
            at(1500, bad()),
            at(2000, Ok(200.0)),
            at(2500, bad()),
            at(3500, Ok(300.0)),
        ];
        // 100 W held over [0,1], 150 W over [1,2], 200 W held over [2,3]; 3.5 s is past the end.
        let w = integrate(&samples, Duration::from_secs(3)).unwrap();
        assert_eq!((w.joules, w.watts), (450.0, 150.0));
        assert_eq!((w.samples, w.valid), (4, 2));
        assert_eq!(w.errors, [MeterError::Garbage("x".into()).to_string()]);
        let one = integrate(&[at(400, Ok(60.0))], Duration::from_secs(2)).unwrap();
        assert_eq!((one.joules, one.watts), (120.0, 60.0));
    }

    #[test]
    fn a_record_integrates_the_span_asked_for_only() {
        let started = Instant::now();
        let record = MeterRecord {
            started,
            samples: vec![
                at(0, Ok(10.0)),
                at(1000, Ok(10.0)),
                at(2000, Ok(20.0)),
                at(3000, Ok(20.0)),
            ],
        };
        let s = Duration::from_secs;
        // From 1 s to 3 s: 10 W then 20 W, a trapezoid of 15 J and a flat 20 J.
        let w = record.between(started + s(1), started + s(3)).unwrap();
        assert_eq!((w.samples, w.valid), (3, 3));
        assert!((w.joules - 35.0).abs() < 1e-9, "{w:?}");
        assert!((w.watts - 17.5).abs() < 1e-9, "{w:?}");
        // A span past the last sample holds that sample to its end.
        let late = record.between(started + s(3), started + s(5)).unwrap();
        assert!((late.joules - 40.0).abs() < 1e-9, "{late:?}");
    }

    #[test]
    fn a_window_with_no_valid_sample_says_why() {
        let hung = Err(MeterError::Hung {
            after: Duration::from_secs(2),
            ended: true,
        });
        let err = integrate(&[at(10, hung)], Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, MeterError::NoValidSample(1, ref why) if why.contains("killed")));
        assert_eq!(
            integrate(&[], Duration::from_secs(1)),
            Err(MeterError::NoValidSample(
                0,
                "the command never finished".into()
            ))
        );
    }

    #[test]
    fn the_sampler_goes_on_past_bad_samples() {
        // Every other run prints garbage; the valid ones say 50 W.
        let tree = TempTree::new("meter-alternating");
        let counter = tree.path().join("n");
        let command = format!(
            "n=$(cat {0} 2>/dev/null || echo 0); echo $((n + 1)) > {0}; \
             if [ $((n % 2)) -eq 0 ]; then echo garbage; else echo 50 W; fi",
            counter.display()
        );
        let meter = Meter::start(MeterConfig {
            interval: Duration::from_millis(10),
            ..MeterConfig::new(&command)
        })
        .unwrap();
        meter.wait_for(4);
        let w = meter.finish().unwrap();
        assert!(
            w.samples >= 4 && w.valid >= 2 && w.valid < w.samples,
            "{w:?}"
        );
        assert!((w.watts - 50.0).abs() < 1e-9, "{w:?}");
        assert_eq!(
            w.errors,
            [MeterError::Garbage("garbage".into()).to_string()]
        );
    }

    #[test]
    fn a_meter_that_always_fails_gives_a_reason() {
        let meter = Meter::start(MeterConfig::new("exit 1")).unwrap();
        meter.wait_for(1);
        let err = meter.finish().unwrap_err().to_string();
        assert!(
            err.starts_with("no valid power meter sample in the window"),
            "{err}"
        );
        assert!(err.contains("exit status: 1"), "{err}");
        let zero = MeterConfig {
            interval: Duration::ZERO,
            ..MeterConfig::new("echo 1")
        };
        assert!(matches!(Meter::start(zero), Err(MeterError::ZeroInterval)));
    }
}
