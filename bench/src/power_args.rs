//! The power flags every experiment that reports power shares (`--power-meter`,
//! `--power-baseline`), and the baseline window they ask for.

use std::time::Duration;

use clap::Args;

use super::density_power;
use super::power::{PowerWindow, Reading};
use super::units::parse_duration;

/// The power flags of an experiment.
#[derive(Debug, Clone, Default, Args)]
pub struct PowerArgs {
    /// An external power meter: `sh -c CMD` runs once a second during the baseline and every
    /// window and prints the host's power in watts (a wall meter, a PDU; IPMI DCMI:
    /// `ipmitool dcmi power reading`); its samples are integrated over each window.
    #[arg(long, value_name = "CMD")]
    pub power_meter: Option<String>,
    /// The power baseline measured before the first run: a window with no VM running, as
    /// long as --duration unless a duration is given here. `off` skips it; every figure
    /// "above the baseline" is then null, with that reason.
    #[arg(long, value_name = "DURATION|off", value_parser = parse_baseline)]
    pub power_baseline: Option<BaselineLength>,
}

/// How long the power baseline lasts (`--power-baseline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineLength {
    /// No baseline.
    Off,
    /// A window of this length.
    For(Duration),
}

/// Reads `--power-baseline`: `off` or a duration.
fn parse_baseline(s: &str) -> Result<BaselineLength, String> {
    if s == "off" {
        Ok(BaselineLength::Off)
    } else {
        parse_duration(s)
            .map(BaselineLength::For)
            .map_err(|e| e.to_string())
    }
}

impl PowerArgs {
    /// The power baseline: `--power-baseline`, else a window of `duration` (the experiment's
    /// own run length).
    pub fn baseline(&self, duration: Duration) -> Reading<PowerWindow> {
        match self.power_baseline.unwrap_or(BaselineLength::For(duration)) {
            BaselineLength::Off => Reading::missing("--power-baseline off"),
            BaselineLength::For(d) => density_power::baseline(d, self.power_meter.as_deref()),
        }
    }

    /// The sampler of one run of `duration`, with the meter if one was given.
    pub fn sampler(&self, duration: Duration) -> density_power::Sampler {
        density_power::Sampler::start(density_power::period(duration), self.power_meter.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_baseline_is_off_or_a_duration() {
        assert_eq!(parse_baseline("off"), Ok(BaselineLength::Off));
        assert_eq!(
            parse_baseline("2s"),
            Ok(BaselineLength::For(Duration::from_secs(2)))
        );
        assert!(parse_baseline("2").is_err(), "a bare number has no unit");
        assert!(parse_baseline("none").is_err());
    }

    #[test]
    fn an_off_baseline_says_so() {
        let args = PowerArgs {
            power_meter: None,
            power_baseline: Some(BaselineLength::Off),
        };
        let b = args.baseline(Duration::from_secs(60));
        assert_eq!(b.value, None);
        assert_eq!(b.reason.as_deref(), Some("--power-baseline off"));
    }
}
