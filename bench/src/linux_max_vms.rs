//! `lull bench density --guest linux --clones --max-vms CAP`: the search of max_vms.rs over
//! rows of clones of the kit's Linux (linux_density.rs): per mode (and per `--timer-slack` of
//! a user-irqchip mode), the most clones whose window meets `--slo`, and the bound that
//! stopped it (lateness, host CPU, a VM failing, memory, threads, the cap).
//!
//! ```text
//! per mode: steps of N clones, N doubling from 1 then bisected (max_vms::search)
//!   each step: linux_density's row of N clones restored from one snapshot of the mode's VM
//!              (one boot per workload length: the steps' lengths are rounded up to 30 s)
//!   judged by the SLO; memory bound by what a clone holds (its PSS), threads by lull's
//! ```
//!
//! One workload is searched: `timers` if `--workload` names it (the lateness bound needs its
//! figures), else the first named.

use super::density::{DensityArgs, Workload};
use super::error::BenchError;
use super::linux_density::{self, Snapshots};
use super::max_vms::{self, PerVm};
use super::report;

/// What one clone takes before one is measured: its written pages and lull (under 10 MiB
/// measured here), 8 threads.
const GUESS: PerVm = PerVm {
    bytes: (16u64 << 20) as f64,
    threads: 8.0,
};

/// The workload a search runs: `timers` if named, else the first.
fn searched_workload(args: &DensityArgs) -> Workload {
    if args.workload.contains(&Workload::Timers) {
        Workload::Timers
    } else {
        args.workload.first().copied().unwrap_or(Workload::Timers)
    }
}

/// Runs the search up to `cap` clones per mode; `Ok(false)` if a mode held not even one.
pub fn run(args: &DensityArgs, cap: u32) -> Result<bool, BenchError> {
    if !args.clones {
        return Err(BenchError::Flags(
            "--max-vms with --guest linux runs clones of one snapshot: add --clones (a boot \
             of every VM of every step would take hours here)"
                .into(),
        ));
    }
    let workload = searched_workload(args);
    let (plan, mut modes, skipped) = linux_density::plan(args)?;
    max_vms::kernel_first(&mut modes);
    let limits = max_vms::host_limits(cap, GUESS);
    let params = linux_density::empty_report(&plan, &modes, Vec::new()).params;
    let mut report = max_vms::empty_report(params, cap, &args.slo, &limits, skipped);
    eprintln!(
        "bench: max-vms of the kit's Linux, {} workload, clones, logs in {}",
        workload.name(),
        plan.work.display()
    );
    max_vms::print_header(&report, args.cpus, args.duration, report::linux_header());
    report.power_baseline = args.power_baseline();
    let baseline = report.power_baseline.clone();
    let mut snapshots = Snapshots::default();
    for &mode in &modes {
        for slack in args.slacks_of(mode) {
            let name = match slack {
                Some(s) => format!("{}@{s}", mode.name()),
                None => mode.name().to_string(),
            };
            let searched = max_vms::search_mode(&mut report, &name, &limits, args.cpus, |n| {
                linux_density::measure_clones(
                    &plan,
                    &mut snapshots,
                    (mode, slack, workload),
                    n,
                    &baseline,
                )
            })?;
            report.modes.push(searched);
            max_vms::set_ratios(&mut report.modes);
            if let Some(path) = &args.common.json {
                report::write_json(path, &report)?;
            }
        }
    }
    max_vms::finish(&report, args.plot.as_ref())?;
    Ok(report.modes.iter().all(|m| m.max_vms > 0))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Density {
        #[command(flatten)]
        args: DensityArgs,
    }

    fn args(words: &[&str]) -> DensityArgs {
        let argv = ["density", "--guest", "linux"].iter().chain(words);
        Density::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn the_timers_workload_is_searched_where_it_is_named() {
        assert_eq!(searched_workload(&args(&[])), Workload::Timers);
        assert_eq!(
            searched_workload(&args(&["--workload", "idle"])),
            Workload::Idle
        );
        assert_eq!(
            searched_workload(&args(&["--workload", "idle,timers"])),
            Workload::Timers
        );
    }

    #[test]
    fn a_search_of_linux_guests_needs_clones() {
        let e = run(&args(&["--max-vms", "4"]), 4).unwrap_err();
        assert!(e.to_string().contains("--clones"), "{e}");
    }
}
