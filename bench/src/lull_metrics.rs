//! lull's own counters of a run (its `--metrics` JSON, or the same report live from the
//! management API's `vm.counters`), summed over a fleet: the wake-ups of halted vCPUs (lull's
//! per-cause counts, or KVM's `halt_wakeup` with the in-kernel irqchip), global-timer work
//! and KVM's exit counter. Two live reports of one VM give the counts between them
//! ([`MetricsSum::since`]), which is how a window that excludes the boot is measured.

use std::collections::BTreeMap;

use lull_schema::RunReport;

/// Sums of lull's reports over a fleet (or their growth over a window).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSum {
    /// Reports summed.
    pub vm_reports: u32,
    /// Wake-ups of halted vCPU threads, every cause lull counts (`vcpus[].wakeups`).
    pub halted_wakeups: u64,
    /// The same by cause (`timer`, `interrupt`, `control`, `other`, `global_timer`, ...).
    pub wakeup_causes: BTreeMap<String, u64>,
    /// KVM's `halt_wakeup` (the in-kernel irqchip's wake-ups of halted vCPUs).
    pub kvm_halt_wakeups: u64,
    /// Wake-ups of blocked vCPUs by a global timer, where lull reports them.
    pub global_timer_wakeups: Option<u64>,
    /// Global timer expiries (vCPUs and the `central` timer thread), where lull reports them.
    pub global_timer_fires: Option<u64>,
    /// KVM's `exits`, where readable.
    pub kvm_exits: Option<u64>,
    /// Port I/O exits lull handled (`vcpus[].io_in` + `io_out`): with the kit's guests, their
    /// console, whose report at the end is longer or shorter with the run's histograms.
    pub port_io_exits: u64,
    /// LAPIC timer expiries of lull's LAPIC (`vcpus[].lapic_timer_fires`; 0 with the kernel's).
    pub lapic_timer_fires: u64,
    /// Interrupts lull injected (`vcpus[].injected`; 0 with the kernel irqchip).
    pub injected: u64,
    /// KVM's `irq_injections` (every interrupt the in-kernel LAPIC delivered), where readable.
    pub kvm_irq_injections: Option<u64>,
    /// Run time times vCPUs, seconds (lull's clock).
    pub vcpu_seconds: f64,
    /// Wake-ups of blocked vCPUs that served more than one timer expiry
    /// (`vcpus[].wake_multi_expiry`).
    pub multi_expiry_wakeups: u64,
    /// Expiries those wake-ups served beyond their first (`vcpus[].wake_coalesced`).
    pub coalesced_expiries: u64,
}

fn add_opt(acc: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *acc = Some(acc.unwrap_or(0) + v);
    }
}

fn sub_opt(later: Option<u64>, earlier: Option<u64>) -> Option<u64> {
    Some(later?.saturating_sub(earlier?))
}

impl MetricsSum {
    /// The sums of one report.
    pub fn of(m: &RunReport) -> Self {
        let mut s = Self::default();
        s.add(m);
        s
    }

    /// Adds one report.
    pub fn add(&mut self, m: &RunReport) {
        self.vm_reports += 1;
        for v in &m.vcpus {
            // Every cause lull reports (timer, interrupt, control, other, global_timer).
            for (cause, count) in v.wakeups.by_cause() {
                self.halted_wakeups += count;
                *self.wakeup_causes.entry(cause.to_string()).or_insert(0) += count;
            }
            add_opt(&mut self.global_timer_wakeups, Some(v.wakeups.global_timer));
            add_opt(&mut self.global_timer_fires, Some(v.global_timer_fires));
            self.lapic_timer_fires += v.lapic_timer_fires;
            self.injected += v.injected;
            self.multi_expiry_wakeups += v.wake_multi_expiry.unwrap_or(0);
            self.coalesced_expiries += v.wake_coalesced.unwrap_or(0);
            self.port_io_exits += v.io_in + v.io_out;
        }
        // The `central` model expires global timers on its own timer thread, not on a vCPU.
        add_opt(
            &mut self.global_timer_fires,
            m.global_timers.as_ref().map(|g| g.timer_thread_fires),
        );
        let kvm = |name: &str| m.kvm.as_ref().and_then(|k| k.get(name).copied());
        self.kvm_halt_wakeups += kvm("halt_wakeup").unwrap_or(0);
        add_opt(&mut self.kvm_exits, kvm("exits"));
        add_opt(&mut self.kvm_irq_injections, kvm("irq_injections"));
        let secs = m.run_time_ms as f64 / 1000.0;
        self.vcpu_seconds += secs * m.vcpus.len() as f64;
    }

    /// Adds the sums of other VMs.
    pub fn merge(&mut self, other: &Self) {
        self.vm_reports += other.vm_reports;
        self.halted_wakeups += other.halted_wakeups;
        for (cause, count) in &other.wakeup_causes {
            *self.wakeup_causes.entry(cause.clone()).or_insert(0) += count;
        }
        self.kvm_halt_wakeups += other.kvm_halt_wakeups;
        add_opt(&mut self.global_timer_wakeups, other.global_timer_wakeups);
        add_opt(&mut self.global_timer_fires, other.global_timer_fires);
        add_opt(&mut self.kvm_exits, other.kvm_exits);
        self.port_io_exits += other.port_io_exits;
        self.lapic_timer_fires += other.lapic_timer_fires;
        self.injected += other.injected;
        add_opt(&mut self.kvm_irq_injections, other.kvm_irq_injections);
        self.vcpu_seconds += other.vcpu_seconds;
        self.multi_expiry_wakeups += other.multi_expiry_wakeups;
        self.coalesced_expiries += other.coalesced_expiries;
    }

    /// KVM exits per vCPU-second less the port I/O ones: the exits of the guest's timers and
    /// idle, not of its console (a kit guest prints its report at its end, after the measured
    /// window, and a report with more histogram lines would count as more exits). `None`
    /// without KVM's counter or run time.
    pub fn exits_per_vcpu_s(&self) -> Option<f64> {
        let exits = self.kvm_exits?.saturating_sub(self.port_io_exits);
        (self.vcpu_seconds > 0.0).then(|| exits as f64 / self.vcpu_seconds)
    }

    /// What one VM counted between an `earlier` report and this one.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            vm_reports: self.vm_reports,
            halted_wakeups: self.halted_wakeups.saturating_sub(earlier.halted_wakeups),
            wakeup_causes: self
                .wakeup_causes
                .iter()
                .map(|(cause, &n)| {
                    let before = earlier.wakeup_causes.get(cause).copied().unwrap_or(0);
                    (cause.clone(), n.saturating_sub(before))
                })
                .collect(),
            kvm_halt_wakeups: self
                .kvm_halt_wakeups
                .saturating_sub(earlier.kvm_halt_wakeups),
            global_timer_wakeups: sub_opt(self.global_timer_wakeups, earlier.global_timer_wakeups),
            global_timer_fires: sub_opt(self.global_timer_fires, earlier.global_timer_fires),
            kvm_exits: sub_opt(self.kvm_exits, earlier.kvm_exits),
            port_io_exits: self.port_io_exits.saturating_sub(earlier.port_io_exits),
            lapic_timer_fires: self
                .lapic_timer_fires
                .saturating_sub(earlier.lapic_timer_fires),
            injected: self.injected.saturating_sub(earlier.injected),
            kvm_irq_injections: sub_opt(self.kvm_irq_injections, earlier.kvm_irq_injections),
            vcpu_seconds: (self.vcpu_seconds - earlier.vcpu_seconds).max(0.0),
            multi_expiry_wakeups: self
                .multi_expiry_wakeups
                .saturating_sub(earlier.multi_expiry_wakeups),
            coalesced_expiries: self
                .coalesced_expiries
                .saturating_sub(earlier.coalesced_expiries),
        }
    }
}

/// A report from the parts of it a test gives (the rest as lull's defaults).
#[cfg(test)]
pub(crate) fn report(parts: serde_json::Value) -> RunReport {
    serde_json::from_value(parts).expect("the test's parts of a report parse")
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn metrics(vcpu_fires: [u64; 2], thread_fires: Option<u64>) -> RunReport {
        let vcpu = |fires: u64| {
            serde_json::json!({
                "wakeups": { "timer": 3, "global_timer": 1 },
                "global_timer_fires": fires,
                "wake_multi_expiry": 1,
                "wake_coalesced": 3,
            })
        };
        let global = thread_fires.map_or(
            Value::Null,
            |f| serde_json::json!({ "config": "4,period=1ms", "timer_thread_fires": f }),
        );
        report(serde_json::json!({
            "run_time_ms": 2000,
            "vcpus": [vcpu(vcpu_fires[0]), vcpu(vcpu_fires[1])],
            "global_timers": global,
            "kvm": { "exits": 100, "halt_wakeup": 0 },
        }))
    }

    #[test]
    fn global_fires_count_every_model() {
        // pull/push: the vCPUs expire global timers themselves.
        let mut pull = MetricsSum::default();
        pull.add(&metrics([5, 7], Some(0)));
        assert_eq!(pull.global_timer_fires, Some(12));
        // central: its timer thread does, and the vCPUs report none.
        let mut central = MetricsSum::default();
        central.add(&metrics([0, 0], Some(40)));
        central.add(&metrics([0, 0], Some(2)));
        assert_eq!(central.global_timer_fires, Some(42));
        assert_eq!(central.global_timer_wakeups, Some(4));
        assert_eq!(central.halted_wakeups, 16);
        assert_eq!(central.kvm_exits, Some(200));
        // Per vCPU one wake-up served 4 expiries: 3 coalesced.
        assert_eq!((pull.multi_expiry_wakeups, pull.coalesced_expiries), (2, 6));
        let none = MetricsSum::of(&report(serde_json::json!({ "vcpus": [{}] })));
        assert_eq!((none.multi_expiry_wakeups, none.coalesced_expiries), (0, 0));
    }

    /// Two runs that differ only in the length of the guest's console report: the same exits
    /// per vCPU-second once its port I/O exits are left out (a slack row's idle-sim prints a
    /// `past_slack` histogram more; counting it made slack look like more exits).
    #[test]
    fn console_exits_are_not_counted_as_exits() {
        let run = |console_bytes: u64| {
            let vcpu = |io: u64| serde_json::json!({ "io_in": io, "io_out": io, "hlt": 40 });
            MetricsSum::of(&report(serde_json::json!({
                "run_time_ms": 4000,
                "vcpus": [vcpu(console_bytes), vcpu(0)],
                "kvm": { "exits": 300 + 2 * console_bytes },
            })))
        };
        let (short, long) = (run(1_232), run(2_066));
        assert_eq!(long.port_io_exits, 2 * 2_066);
        assert_eq!(short.exits_per_vcpu_s(), Some(300.0 / 8.0));
        assert_eq!(long.exits_per_vcpu_s(), short.exits_per_vcpu_s());
        let mut fleet = short.clone();
        fleet.merge(&long);
        assert_eq!(fleet.exits_per_vcpu_s(), Some(600.0 / 16.0));
        assert_eq!(long.since(&short).port_io_exits, 2 * (2_066 - 1_232));
        let none = MetricsSum::of(&report(serde_json::json!({ "run_time_ms": 4000 })));
        assert_eq!(none.exits_per_vcpu_s(), None);
    }

    /// A live report's counted parts, as `vm.counters` gives them (user irqchip, 2 vCPUs).
    fn live(run_ms: u64, wakeups: [[u64; 2]; 2], exits: u64) -> RunReport {
        let vcpu = |w: [u64; 2]| {
            serde_json::json!({
                "wakeups": { "timer": w[0], "interrupt": w[1], "control": 0, "other": 0, "global_timer": 0 },
                "global_timer_fires": 0,
                "lapic_timer_fires": 3 * w[0],
                "injected": 3 * w[0] + w[1],
            })
        };
        report(serde_json::json!({
            "stop_reason": "running",
            "run_time_ms": run_ms,
            "vcpus": [vcpu(wakeups[0]), vcpu(wakeups[1])],
            "global_timers": null,
            "kvm": { "exits": exits, "halt_wakeup": 0, "irq_injections": exits / 10 },
        }))
    }

    #[test]
    fn a_window_counts_what_grew_between_two_reports() {
        // Window start 21.5 s into the run (boot counted 335 + 38 wake-ups), end 81.5 s.
        let start = MetricsSum::of(&live(21_532, [[277, 58], [17, 21]], 39_238));
        let end = MetricsSum::of(&live(81_532, [[397, 60], [150, 22]], 45_238));
        let w = end.since(&start);
        assert_eq!(w.halted_wakeups, (120 + 2) + (133 + 1));
        assert_eq!(w.wakeup_causes["timer"], 120 + 133);
        assert_eq!(w.wakeup_causes["interrupt"], 2 + 1);
        assert_eq!(w.wakeup_causes["control"], 0);
        assert_eq!(w.kvm_exits, Some(6_000));
        assert_eq!(w.kvm_irq_injections, Some(600));
        assert_eq!(w.lapic_timer_fires, 3 * (120 + 133));
        assert_eq!(w.injected, 3 * (120 + 133) + 2 + 1);
        assert_eq!(w.global_timer_wakeups, Some(0));
        assert!((w.vcpu_seconds - 120.0).abs() < 1e-9);
        // Two VMs' windows add up.
        let mut fleet = w.clone();
        fleet.merge(&w);
        assert_eq!((fleet.vm_reports, fleet.halted_wakeups), (2, 512));
        assert_eq!(fleet.wakeup_causes["timer"], 2 * 253);
        assert_eq!(fleet.kvm_exits, Some(12_000));
        // A counter only one report has gives no difference.
        let mut no_kvm = live(81_532, [[0, 0], [0, 0]], 0);
        no_kvm.kvm = None;
        assert_eq!(MetricsSum::of(&no_kvm).since(&start).kvm_exits, None);
    }
}
