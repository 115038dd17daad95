//! The `lapic_idle` target's side of the idle manager: the features it turns on. How it keeps
//! the chip from blocking in a hold on a clock only the target moves: `Machine::skip_holds`
//! (machine.rs).

use arbitrary::Unstructured;
use vmm::config::knobs::{
    CpuQuotaConfig, GlobalTimersConfig, HaltPollMode, IdleInjectConfig, QuotaPhase,
    TimerAdvanceMode,
};

use crate::chip::IdleSpec;

/// The idle manager's features, all on, with parameters from the input: halt polling (the
/// target never halts: it must stay out of the way), timer advance, idle injection, the CPU
/// quota (aligned: a random phase would come from the host) and global timers.
pub fn spec(u: &mut Unstructured<'_>) -> arbitrary::Result<IdleSpec> {
    const MS: u64 = 1_000_000;
    let halt_poll = match u.int_in_range(0u8..=1)? {
        0 => HaltPollMode::Fixed(u.int_in_range(1..=200_000)?),
        _ => HaltPollMode::Adaptive,
    };
    let timer_advance = match u.int_in_range(0u8..=1)? {
        0 => TimerAdvanceMode::Fixed(u.int_in_range(0..=100_000)?),
        _ => TimerAdvanceMode::Adaptive {
            max_ns: u.int_in_range(1..=100_000)?,
        },
    };
    let period_ns = u.int_in_range(MS..=20 * MS)?;
    let idle_inject = IdleInjectConfig {
        percent: u.int_in_range(1..=90)?,
        period_ns,
    };
    let period_ns = u.int_in_range(MS..=20 * MS)?;
    let cpu_quota = CpuQuotaConfig {
        quota_ns: u.int_in_range(1..=4 * period_ns)?,
        period_ns,
        phase: QuotaPhase::Aligned,
    };
    let global_timers = GlobalTimersConfig {
        count: u.int_in_range(1..=8)?,
        period_ns: u.int_in_range(MS / 10..=20 * MS)?,
    };
    Ok(IdleSpec {
        halt_poll,
        timer_advance,
        idle_inject: Some(idle_inject),
        cpu_quota: Some(cpu_quota),
        global_timers: Some(global_timers),
    })
}
