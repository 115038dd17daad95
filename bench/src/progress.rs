//! Progress of a fleet run on stderr: an indicatif bar (elapsed time against the run's
//! expected length, VMs booted and exited) when stderr is a terminal, else a plain line every
//! few seconds, so that logs of unattended runs stay readable.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

const LINE_EVERY: Duration = Duration::from_secs(5);
const BAR_TEMPLATE: &str = "bench: {prefix} [{elapsed_precise}] {wide_bar} {msg}";

/// Where a fleet run reports how far it is.
#[derive(Debug)]
pub enum Progress {
    /// A live bar on the terminal.
    Bar(ProgressBar),
    /// A line now and then (stderr is a file or a pipe).
    Lines {
        /// What the lines begin with.
        label: String,
        /// When the last line was printed.
        last: Instant,
    },
}

impl Progress {
    /// Starts reporting a run labelled `label` expected to last about `expected`.
    pub fn start(label: &str, expected: Duration) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self::Lines {
                label: label.to_string(),
                last: Instant::now(),
            };
        }
        let style = ProgressStyle::with_template(BAR_TEMPLATE)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bar = ProgressBar::with_draw_target(
            Some(millis(expected).max(1)),
            ProgressDrawTarget::stderr(),
        )
        .with_style(style)
        .with_prefix(label.to_string());
        Self::Bar(bar)
    }

    /// Reports the state at `elapsed` since the start.
    pub fn update(&mut self, elapsed: Duration, booted: usize, exited: usize, n: usize) {
        let state = format!("{booted}/{n} booted, {exited}/{n} exited");
        match self {
            Self::Bar(bar) => {
                // A run longer than expected keeps a full bar rather than overflowing it.
                let pos = millis(elapsed);
                if pos > bar.length().unwrap_or(0) {
                    bar.set_length(pos);
                }
                bar.set_position(pos);
                bar.set_message(state);
            }
            Self::Lines { label, last } => {
                if last.elapsed() >= LINE_EVERY {
                    *last = Instant::now();
                    eprintln!("bench: {label}: {:5.1} s, {state}", elapsed.as_secs_f64());
                }
            }
        }
    }

    /// Prints `line` without tearing the bar.
    pub fn println(&self, line: &str) {
        match self {
            Self::Bar(bar) => bar.suspend(|| eprintln!("{line}")),
            Self::Lines { .. } => eprintln!("{line}"),
        }
    }

    /// Ends the report (the bar disappears; the tables follow on stdout).
    pub fn finish(self) {
        if let Self::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_grows_when_the_run_takes_longer_than_expected() {
        let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::hidden());
        let mut p = Progress::Bar(bar.clone());
        p.update(Duration::from_millis(400), 1, 0, 2);
        assert_eq!((bar.position(), bar.length()), (400, Some(1000)));
        assert_eq!(bar.message(), "1/2 booted, 0/2 exited");
        p.update(Duration::from_millis(1500), 2, 2, 2);
        assert_eq!((bar.position(), bar.length()), (1500, Some(1500)));
        p.finish();
        assert!(bar.is_finished());
    }
}
