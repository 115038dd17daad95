#!/usr/bin/env python3
"""What one guest timer event costs the host, per LAPIC configuration, side by side.

One vCPU of the kit's `idle-sim` guest arms a 1 ms TSC deadline, halts, takes the interrupt,
again and again (`mix=100:1 ipi_pct=0`, PV EOI when offered), for `--seconds`. Configurations:

  kernel           --irqchip kernel (KVM's LAPIC; the guest writes IA32_TSC_DEADLINE)
  pull             --irqchip user   (the guest writes IA32_TSC_DEADLINE: 2 exits per event)
  pull-pvdeadline  --irqchip user, idle-sim pv_deadline=1 (lull's PV deadline: 1 exit)
  pull-pvdeadline-noadvance  the same with --timer-advance off (no early wake-up, no wait)

Runs are interleaved (rep 1 of every configuration, then rep 2, ...) so that host noise hits
each alike; a row is the median over the reps. Per event: the vCPU thread's CPU time (from
lull's --metrics, which reads /proc at exit; boot and the guest's report are a few ms of a
10 s run), KVM's exit count and the exits that reached lull (both without the console's port
I/O of the guest's report), lull's own time handling the exits (`exit_handling_ns`: from each
KVM_RUN's return to the next, less the time blocked; it includes the report's console exits)
and of it the time the timer advance spent waiting for deadlines (`advance_wait_ns`), and the
guest's lateness p50/p99.

With `--before PATH` (another lull build, e.g. the commit before a change) every `pull`
configuration also runs with that build, interleaved with the rest, as rows "<config>
(before)": the change's effect measured in the same minutes as the ratio to kernel.

Usage: resources/bench/event_cost.py [--lull target/release/lull] [--kit target/kit]
           [--seconds 10] [--reps 3] [--before PATH] [--json FILE]
"""

import argparse
import json
import math
import re
import sys

import idle_sim

CONFIGS = {
    "kernel": (["--irqchip", "kernel"], ""),
    "pull": (["--irqchip", "user", "--timer-model", "pull"], ""),
    "pull-pvdeadline": (["--irqchip", "user", "--timer-model", "pull"], "pv_deadline=1"),
    "pull-pvdeadline-noadvance": (
        ["--irqchip", "user", "--timer-model", "pull", "--timer-advance", "off"],
        "pv_deadline=1",
    ),
}

EVENTS = re.compile(r"idle-sim: cpu 0: events (\d+)")
LATENESS = re.compile(r"idle-sim: lateness_ns n=\d+ min \d+ p50 (\d+) p99 (\d+)")


def run_once(lull, kit, seconds, name):
    flags, extra = CONFIGS[name]
    cmdline = f"duration_ms={seconds * 1000} ipi_pct=0 mix=100:1 pv_eoi=1 {extra}".strip()
    text, m = idle_sim.run(lull, kit, name, 1, cmdline, flags, seconds)
    events = EVENTS.search(text)
    late = LATENESS.search(text)
    if not events or not late:
        sys.exit(f"{name}: no event count or lateness in the guest's output:\n{text[-2000:]}")
    n = int(events.group(1))
    vcpu = [t for t in m["threads"] if t["name"].startswith("vcpu")]
    cpu_ns = sum(t["cpu_ns"] for t in vcpu)
    v = m["vcpus"][0]
    # Port I/O is the guest's console (its report at the end), not the timer events: left out
    # of both exit counts (each such access is one KVM exit that reaches lull).
    console = v["io_in"] + v["io_out"]
    to_lull = sum(v[k] for k in ("mmio_read", "mmio_write", "hlt", "interrupted", "other",
                                 "msr", "irq_window"))
    return {
        "events": n,
        "cpu_us_per_event": cpu_ns / 1000 / n,
        "kvm_exits_per_event": (m["kvm"]["exits"] - console) / n,
        "lull_exits_per_event": to_lull / n,
        "spin_us_per_event": sum(x["advance_wait_ns"] for x in m["vcpus"]) / 1000 / n,
        # NaN for a build without the counter (an older --before build).
        "handling_us_per_event": sum(x.get("exit_handling_ns", math.nan) for x in m["vcpus"])
        / 1000 / n,
        "late_p50_us": int(late.group(1)) / 1000,
        "late_p99_us": int(late.group(2)) / 1000,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lull", default="target/release/lull")
    p.add_argument("--kit", default="target/kit")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--before", help="another lull build whose pull rows run interleaved")
    p.add_argument("--json")
    a = p.parse_args()
    plan = []  # (row, lull binary, configuration)
    for name in CONFIGS:
        plan.append((name, a.lull, name))
        if a.before and name != "kernel":
            plan.append((f"{name} (before)", a.before, name))
    runs = {row: [] for row, _, _ in plan}
    for rep in range(a.reps):
        for row, lull, name in plan:
            runs[row].append(run_once(lull, a.kit, a.seconds, name))
            print(f"rep {rep + 1} {row}: {runs[row][-1]}", file=sys.stderr)
    load = idle_sim.load_average()
    rows = {name: idle_sim.medians(rs) for name, rs in runs.items()}
    base = rows["kernel"]["cpu_us_per_event"]

    def us(v):
        return "-" if math.isnan(v) else f"{v:.1f} us"
    print(f"one vCPU, 1 ms TSC deadlines, {a.seconds} s x {a.reps} reps (medians), "
          f"load at the end {load}")
    print("| config | events | host CPU/event | ratio to kernel | KVM exits/event "
          "| exits reaching lull/event | lull's handling/event | of it advance wait "
          "| lateness p50 / p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['events']:.0f} | {r['cpu_us_per_event']:.1f} us "
              f"| {r['cpu_us_per_event'] / base:.2f}x | {r['kvm_exits_per_event']:.2f} "
              f"| {r['lull_exits_per_event']:.2f} | {us(r['handling_us_per_event'])} "
              f"| {r['spin_us_per_event']:.1f} us "
              f"| {r['late_p50_us']:.0f} / {r['late_p99_us']:.0f} us |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seconds": a.seconds, "reps": a.reps, "load_end": float(load),
                       "before": a.before, "runs": runs, "medians": rows}, f, indent=1)


if __name__ == "__main__":
    main()
