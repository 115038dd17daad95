#!/usr/bin/env python3
"""Guest timers under each interrupt-controller / timer model, side by side in one run.

Usage: resources/bench/timer_modes.py [--count N] [--reps R] [--lull PATH] [--kit DIR]

For `--irqchip kernel` and `--irqchip user` with `--timer-model pull|push|central`, boots the
`lapic-timer` test guest (one-shot div1, one-shot div16, periodic and TSC-deadline timers of
1 ms, N each, waiting in HLT) R times, interleaving the modes, and reports medians over the
repetitions of the following. Per-event costs are differential: each repetition also boots the
guest with count=10, and the cost per event is (totals at N - totals at 10) / (events at N -
events at 10), so boot and console output drop out.
  * guest-measured lateness p50/p99 of the TSC-deadline timer (rdtsc in the interrupt
    handler minus the deadline);
  * KVM exits per guest timer event (KVM's own counter: in-kernel exits included) and the
    exits that reached lull;
  * host wake-ups of the vCPU's thread per guest timer event (its voluntary context
    switches), and of the `central` model's timer thread;
  * host CPU time of lull's threads per guest timer event.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
MODES = [
    ("kernel", ["--irqchip", "kernel"]),
    ("user/pull", ["--irqchip", "user", "--timer-model", "pull"]),
    ("user/push", ["--irqchip", "user", "--timer-model", "push"]),
    ("user/central", ["--irqchip", "user", "--timer-model", "central"]),
]
LINE = re.compile(r"lapic-timer: (.+?): n=(\d+) lateness ns min (-?\d+) p50 (-?\d+) p99 (-?\d+) max (-?\d+)")
LULL_EXITS = ("io_in", "io_out", "mmio_read", "mmio_write", "hlt", "msr", "irq_window", "other")


def one_run(lull, kernel, count, args):
    """Boots lapic-timer once; returns its lateness lines and the run's totals."""
    with tempfile.NamedTemporaryFile(suffix=".json") as metrics:
        out = subprocess.run(
            [lull, "run", "--kernel", kernel, "--cmdline", f"count={count}", "--metrics", metrics.name]
            + args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        if out.returncode != 1 or "lapic-timer: PASS" not in out.stdout:
            raise RuntimeError(f"lapic-timer failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        m = json.load(open(metrics.name))
    # mode -> [n, min, p50, p99, max]
    lines = {g[0]: [int(x) for x in g[1:]] for g in LINE.findall(out.stdout)}
    vcpu = next(t for t in m["threads"] if t["name"] == "vcpu0")
    timer_thread = next((t for t in m["threads"] if t["name"] == "timers"), None)
    return {
        "lines": lines,
        "events": sum(v[0] for v in lines.values()),
        "kvm_exits": (m.get("kvm") or {}).get("exits", float("nan")),
        "lull_exits": sum(m["vcpus"][0][k] for k in LULL_EXITS),
        "vcpu_wakeups": vcpu["voluntary_ctxt_switches"],
        "timer_thread_wakeups": timer_thread["voluntary_ctxt_switches"] if timer_thread else 0,
        "cpu_ns": sum(t["cpu_ns"] for t in m["threads"]),
    }


def per_event(big, small):
    events = big["events"] - small["events"]
    d = lambda k: (big[k] - small[k]) / events
    return {
        "p50_us": big["lines"]["tsc-deadline"][2] / 1000,
        "p99_us": big["lines"]["tsc-deadline"][3] / 1000,
        "kvm_exits/ev": d("kvm_exits"),
        "lull_exits/ev": d("lull_exits"),
        "vcpu_wakeups/ev": d("vcpu_wakeups"),
        "timer_thr_wakeups/ev": d("timer_thread_wakeups"),
        "cpu_us/ev": d("cpu_ns") / 1000,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lull", default=os.path.join(REPO, "target", "release", "lull"))
    ap.add_argument("--kit", default=os.path.join(REPO, "target", "kit"))
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    kernel = os.path.join(args.kit, "guests", "lapic-timer.elf")
    runs = {name: [] for name, _ in MODES}
    for _ in range(args.reps):
        for name, mode_args in MODES:
            small = one_run(args.lull, kernel, 10, mode_args)
            big = one_run(args.lull, kernel, args.count, mode_args)
            runs[name].append(per_event(big, small))
    keys = list(runs[MODES[0][0]][0].keys())
    table = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    print(f"lapic-timer count={args.count}, {args.reps} runs per mode, medians")
    print(f"{'mode':14}" + "".join(f"{k:>21}" for k in keys))
    for name, row in table.items():
        print(f"{name:14}" + "".join(f"{row[k]:21.2f}" for k in keys))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"count": args.count, "reps": args.reps, "medians": table}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
