#!/usr/bin/env python3
"""What one guest timer event costs the host as the time between events grows, per LAPIC mode.

A 2-vCPU `idle-sim` VM, both CPUs arming TSC deadlines at one fixed interval and halting in
between (`ipi_pct=0 mix=100:MS`, PV EOI and, with `--irqchip user`, lull's PV deadline). Only
vCPU 1 is measured: vCPU 0 also prints the guest's report at the end, whose console exits
would count as timer work. Per event of vCPU 1: its thread's CPU time (lull's --metrics,
from /proc), and with `--irqchip user` lull's own time handling its exits
(`exit_handling_ns`: from each KVM_RUN's return to the next, less the time asleep) and, of
that, the timer advance's wait (`advance_wait_ns`). The longer a vCPU sleeps, the colder the
host's caches and TLBs are when it wakes, for KVM's path and lull's alike: this shows how
much of that lands on lull's user-space side. `pull-huge-text` is `pull` with lull's code
moved onto 2 MiB pages (`--huge-text on`), to show what they save.

Runs are interleaved (every interval and mode once, then again) and a row is the median.
With `--before PATH` (another lull build, e.g. the commit before a change) `pull` also runs
with that build, interleaved with the rest, as mode "pull (before)".

Usage: resources/bench/interval_cost.py [--lull target/release/lull] [--kit target/kit]
           [--intervals 1,10,100] [--seconds 15] [--reps 2] [--before PATH] [--json FILE]
"""

import argparse
import json
import re
import sys

import idle_sim

MODES = {
    "kernel": (["--irqchip", "kernel"], ""),
    "pull": (["--irqchip", "user", "--timer-model", "pull"], "pv_deadline=1"),
    # lull's own code on 2 MiB pages instead of the binary's 4 KiB file pages.
    "pull-huge-text": (["--irqchip", "user", "--timer-model", "pull", "--huge-text", "on"],
                       "pv_deadline=1"),
}

EVENTS = re.compile(r"idle-sim: cpu 1: events (\d+)")


def run_once(lull, kit, seconds, interval_ms, mode):
    flags, extra = MODES[mode.removesuffix(" (before)")]
    cmdline = (f"duration_ms={seconds * 1000} ipi_pct=0 mix=100:{interval_ms} pv_eoi=1 "
               f"{extra}").strip()
    text, m = idle_sim.run(lull, kit, f"{mode} {interval_ms} ms", 2, cmdline,
                           ["--memory", "64M"] + flags, seconds)
    events = EVENTS.search(text)
    if not events:
        sys.exit(f"{mode} {interval_ms} ms: no event count for CPU 1:\n{text[-2000:]}")
    n = int(events.group(1))
    cpu_ns = next(t["cpu_ns"] for t in m["threads"] if t["name"] == "vcpu1")
    v = m["vcpus"][1]
    return {
        "events": n,
        "cpu_us_per_event": cpu_ns / 1000 / n,
        "handling_us_per_event": v["exit_handling_ns"] / 1000 / n,
        "advance_wait_us_per_event": v["advance_wait_ns"] / 1000 / n,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lull", default="target/release/lull")
    p.add_argument("--kit", default="target/kit")
    p.add_argument("--intervals", default="1,10,100")
    p.add_argument("--seconds", type=int, default=15)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--before", help="another lull build whose pull runs interleaved")
    p.add_argument("--json")
    a = p.parse_args()
    intervals = [int(x) for x in a.intervals.split(",")]
    builds = {mode: a.lull for mode in MODES}
    if a.before:
        builds["pull (before)"] = a.before
    runs = {(iv, mode): [] for iv in intervals for mode in builds}
    for rep in range(a.reps):
        for iv in intervals:
            for mode, lull in builds.items():
                r = run_once(lull, a.kit, a.seconds, iv, mode)
                runs[(iv, mode)].append(r)
                print(f"rep {rep + 1} {iv} ms {mode}: {r}", file=sys.stderr)
    load = idle_sim.load_average()
    med = {key: idle_sim.medians(rs) for key, rs in runs.items()}
    print(f"vCPU 1 of 2, fixed TSC-deadline intervals, {a.seconds} s x {a.reps} reps "
          f"(medians), load at the end {load}")
    print("| interval | kernel CPU/event | pull CPU/event | **pull / kernel** "
          "| lull's handling/event | of it advance wait "
          "| pull-huge-text CPU/event | pull-huge-text / kernel | its handling/event |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for iv in intervals:
        k, u, s = med[(iv, "kernel")], med[(iv, "pull")], med[(iv, "pull-huge-text")]
        print(f"| {iv} ms | {k['cpu_us_per_event']:.1f} us | {u['cpu_us_per_event']:.1f} us "
              f"| {u['cpu_us_per_event'] / k['cpu_us_per_event']:.2f}x "
              f"| {u['handling_us_per_event']:.1f} us "
              f"| {u['advance_wait_us_per_event']:.1f} us "
              f"| {s['cpu_us_per_event']:.1f} us "
              f"| {s['cpu_us_per_event'] / k['cpu_us_per_event']:.2f}x "
              f"| {s['handling_us_per_event']:.1f} us |")
    if a.before:
        print("\n| interval | pull (before) CPU/event | pull (before) / kernel "
              "| its handling/event | pull's, for comparison |")
        print("|---:|---:|---:|---:|---:|")
        for iv in intervals:
            k, u, b = med[(iv, "kernel")], med[(iv, "pull")], med[(iv, "pull (before)")]
            print(f"| {iv} ms | {b['cpu_us_per_event']:.1f} us "
                  f"| {b['cpu_us_per_event'] / k['cpu_us_per_event']:.2f}x "
                  f"| {b['handling_us_per_event']:.1f} us "
                  f"| {u['handling_us_per_event']:.1f} us |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seconds": a.seconds, "reps": a.reps, "load_end": float(load),
                       "before": a.before,
                       "runs": {f"{iv} ms {mode}": rs for (iv, mode), rs in runs.items()},
                       "medians": {f"{iv} ms {mode}": r for (iv, mode), r in med.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
