//! Integration tests: the `lapic-conformance` guest (resources/guests/src/lapic-conformance.c)
//! under KVM's in-kernel LAPIC and under lull's own, with 2 and 4 vCPUs and every timer model.
//!
//! KVM is the oracle: every check it passes, lull must pass. Where KVM is wrong against the
//! SDM ([`KVM_DEVIATIONS`], each explained in the guest's header) its failure is tolerated
//! and lull must follow the SDM. Tests that boot need `/dev/kvm`; where it is missing they are
//! reported as ignored with the reason, never as passed.

use std::collections::BTreeMap;
use std::time::Duration;

use lull_tests::{kit_file, kvm_trial, run_lull, Arguments, Failed, RunResult};

const DEADLINE: Duration = Duration::from_secs(120);
const GUEST: &str = "lapic-conformance";

/// Checks KVM's in-kernel LAPIC fails on our hosts although the SDM says otherwise; the
/// guest's header gives the reason for each. Tolerated under `--irqchip kernel` only.
const KVM_DEVIATIONS: &[&str] = &[
    "esr_send_illegal_vector",
    "esr_illegal_register",
    "isr_in_handler",
    "eoi_broadcast",
    "tsc_deadline_past",
    "x2apic_eoi_nonzero_gp",
];

/// One run's verdicts: check name -> `Ok(())` or `Err(detail)`.
type Verdicts = BTreeMap<String, Result<(), String>>;

/// Parses the guest's `PASS name` / `FAIL name: detail` lines; fails if the summary is missing.
fn verdicts(r: &RunResult) -> Result<Verdicts, Failed> {
    let prefix = format!("{GUEST}: ");
    let mut out = Verdicts::new();
    for line in r.stdout.lines() {
        let Some(rest) = line.trim_end().strip_prefix(&prefix) else {
            continue;
        };
        if let Some(name) = rest.strip_prefix("PASS ") {
            out.insert(name.to_string(), Ok(()));
        } else if let Some(failure) = rest.strip_prefix("FAIL ") {
            if let Some((name, detail)) = failure.split_once(": ") {
                out.insert(name.to_string(), Err(detail.to_string()));
            }
        }
    }
    if !r
        .stdout
        .contains(&format!("{prefix}{} checks, ", out.len()))
    {
        return Err(r.failure("the guest did not finish its checks (no matching summary line)"));
    }
    Ok(out)
}

/// How the guest is run besides the irqchip.
#[derive(Clone, Copy)]
struct Setup {
    cpus: u32,
    timer_model: &'static str,
    /// `--x2apic off`: x2APIC hidden from the guest.
    no_x2apic: bool,
}

fn run_guest(irqchip: &str, setup: Setup) -> Result<RunResult, Failed> {
    let kernel = kit_file(&format!("guests/{GUEST}.elf"))?
        .display()
        .to_string();
    let cpus = setup.cpus.to_string();
    let cmdline = format!("cpus={cpus}");
    let mut args = vec![
        "run",
        "--kernel",
        &kernel,
        "--irqchip",
        irqchip,
        "--cpus",
        &cpus,
        "--cmdline",
        &cmdline,
    ];
    // A timer model is lull's: with KVM's LAPIC lull refuses any but the default.
    if irqchip == "user" {
        args.extend(["--timer-model", setup.timer_model]);
    }
    if setup.no_x2apic {
        args.extend(["--x2apic", "off"]);
    }
    run_lull(&args, DEADLINE)
}

/// Failures outside `allowed`, as "name: detail" lines.
fn unexpected(verdicts: &Verdicts, allowed: &[&str]) -> Vec<String> {
    verdicts
        .iter()
        .filter_map(|(name, v)| match v {
            Err(detail) if !allowed.contains(&name.as_str()) => Some(format!("{name}: {detail}")),
            _ => None,
        })
        .collect()
}

/// Runs the guest under both irqchips and holds lull to everything KVM passes.
fn conforms(setup: Setup) -> Result<(), Failed> {
    let kernel_run = run_guest("kernel", setup)?;
    let kvm = verdicts(&kernel_run)?;
    let wrong = unexpected(&kvm, KVM_DEVIATIONS);
    if !wrong.is_empty() {
        return Err(kernel_run.failure(&format!(
            "KVM failed checks it should pass (a host problem, or a wrong check):\n{}",
            wrong.join("\n")
        )));
    }
    let user_run = run_guest("user", setup)?;
    let lull = verdicts(&user_run)?;
    if lull.keys().ne(kvm.keys()) {
        return Err(user_run.failure(&format!(
            "lull ran other checks than KVM: {:?} vs {:?}",
            lull.keys().collect::<Vec<_>>(),
            kvm.keys().collect::<Vec<_>>()
        )));
    }
    if setup.no_x2apic && lull.get("x2apic_hidden") != Some(&Ok(())) {
        return Err(user_run.failure("with --x2apic off, x2apic_hidden must run and pass"));
    }
    // The two-NMI rounds (nmi_pairs: both NMIs taken, before the fixed IPI sent after one)
    // ran under both, and KVM passed them above.
    if !lull.contains_key("nmi_pairs") {
        return Err(user_run.failure("the nmi_pairs rounds did not run"));
    }
    let failed = unexpected(&lull, &[]);
    if !failed.is_empty() {
        return Err(user_run.failure(&format!("lull fails:\n{}", failed.join("\n"))));
    }
    // Every check passed: the guest's own verdict must be a pass.
    let last = format!("{GUEST}: PASS");
    if !user_run.stdout.lines().any(|l| l.trim_end() == last) {
        return Err(user_run.failure("every check passed, yet the guest did not say PASS"));
    }
    user_run.expect_code(1)?;
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for cpus in [2, 4] {
        for timer_model in ["pull", "push", "central"] {
            let setup = Setup {
                cpus,
                timer_model,
                no_x2apic: false,
            };
            trials.push(kvm_trial(
                &format!("lapic_conforms_{cpus}_cpus_timer_model_{timer_model}"),
                move || conforms(setup),
            ));
        }
    }
    // With x2APIC hidden (`--x2apic off`) the guest checks that it really is: EXTD and the
    // x2APIC MSRs #GP, under KVM's LAPIC and lull's.
    trials.push(kvm_trial("lapic_conforms_2_cpus_without_x2apic", || {
        conforms(Setup {
            cpus: 2,
            timer_model: "pull",
            no_x2apic: true,
        })
    }));
    libtest_mimic::run(&args, trials).exit();
}
