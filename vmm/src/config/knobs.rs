//! The idle manager's knobs as configuration values (`--halt-poll`, `--timer-advance`,
//! `--wake-placement`, `--idle-inject`, `--cpu-quota`, `--global-timers`, `--timer-slack`) and `--seccomp`: each type with its
//! textual form (FromStr, Display, and serde as that string) and its defaults. What the idle
//! manager does with them is in `idle/`; the grammar they share is in `config::knob`.

mod advance;
mod global_load;
mod halt_poll;
mod inject;
mod placement;
mod quota;
mod seccomp;
mod slack;

pub use advance::{TimerAdvanceMode, DEFAULT_MAX_ADVANCE_NS};
pub use global_load::GlobalTimersConfig;
pub use halt_poll::HaltPollMode;
pub use inject::IdleInjectConfig;
pub use placement::{WakePlacementMode, DEFAULT_MAX_SLEEP_NS};
pub use quota::{CpuQuotaConfig, QuotaPhase};
pub use seccomp::SeccompMode;
pub use slack::TimerSlack;
