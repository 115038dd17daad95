#!/usr/bin/env python3
"""What lull's idle-injection and CPU-quota knobs do, measured with the `spin` guest.

Usage: resources/bench/idle_manager.py [--seconds S] [--lull PATH] [--kit DIR] [--json OUT]

1. Idle injection at 10/25/50% (period 20 ms) on a 2-vCPU spin guest: achieved idle share
   (injected idle time per vCPU / run time) vs requested, the share of the injected time during
   which every vCPU was idle together, and the guest's throughput relative to no injection.
2. CPU quota 50% (quota=10,period=20 per VM, 1 vCPU each) for 2 and 4 VMs started together,
   phase=aligned vs phase=random: throughput per VM, and the fraction of periods in which all
   VMs were throttled at once (from each VM's throttled intervals, CLOCK_MONOTONIC).
Everything in one run; ratios are within this run only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
SPIN = re.compile(r"spin: (\d+) vCPU\(s\), (\d+) iterations in (\d+) ms")


def start(lull, kernel, ms, args, metrics):
    return subprocess.Popen(
        [lull, "run", "--kernel", kernel, "--irqchip", "user", "--cmdline", f"ms={ms}",
         "--metrics", metrics] + args,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def finish(proc, metrics):
    out, _ = proc.communicate(timeout=600)
    m = SPIN.search(out)
    if proc.returncode != 1 or not m:
        raise RuntimeError(f"spin failed ({proc.returncode}): {out}")
    return int(m.group(2)), json.load(open(metrics))


def run_one(lull, kernel, ms, args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        return finish(start(lull, kernel, ms, args, f.name), f.name)


def overlap_all(interval_sets):
    """Intervals during which every set has an interval open."""
    events = []
    for i, ivs in enumerate(interval_sets):
        for a, b in ivs:
            events.append((a, 1))
            events.append((b, -1))
    events.sort()
    depth, since, out = 0, None, []
    for t, d in events:
        depth += d
        if depth == len(interval_sets) and since is None:
            since = t
        elif depth < len(interval_sets) and since is not None:
            out.append((since, t))
            since = None
    return out


def quota_round(lull, kernel, ms, vms, phase):
    files = [tempfile.NamedTemporaryFile(suffix=".json", delete=False) for _ in range(vms)]
    procs = [start(lull, kernel, ms, ["--cpu-quota", f"quota=10,period=20,phase={phase}"], f.name)
             for f in files]
    results = [finish(p, f.name) for p, f in zip(procs, files)]
    for f in files:
        os.unlink(f.name)
    throughput = [it / ms for it, _ in results]
    sets = [m["cpu_quota"]["intervals"] for _, m in results]
    together = overlap_all(sets)
    # Periods of VM 0 in which all VMs were throttled at some moment.
    periods0 = sets[0]
    hit = sum(1 for a, b in periods0 if any(x < b and y > a for x, y in together))
    all_periods = max(len(s) for s in sets) or 1
    return {
        "vms": vms, "phase": phase,
        "throughput_per_ms": throughput,
        "throttled_periods": [m["cpu_quota"]["throttled_periods"] for _, m in results],
        "periods_all_throttled_fraction": hit / all_periods,
        "time_all_throttled_ms": sum(b - a for a, b in together) / 1e6,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--lull", default=os.path.join(REPO, "target", "release", "lull"))
    ap.add_argument("--kit", default=os.path.join(REPO, "target", "kit"))
    ap.add_argument("--json")
    args = ap.parse_args()
    kernel = os.path.join(args.kit, "guests", "spin.elf")
    ms = int(args.seconds * 1000)
    report = {"injection": [], "quota": []}

    base_it, _ = run_one(args.lull, kernel, ms, ["--cpus", "2"])
    print(f"idle injection, 2 vCPUs, spin {ms} ms; no injection: {base_it / ms:.2f} iterations/ms")
    print(f"{'percent':>8} {'achieved %':>11} {'together %':>11} {'throughput %':>13}")
    for pct in (10, 25, 50):
        it, m = run_one(args.lull, kernel, ms, ["--cpus", "2", "--idle-inject", f"percent={pct},period=20"])
        injected = [v["injected_idle_ns"] for v in m["vcpus"]]
        achieved = sum(injected) / len(injected) / (m["run_time_ms"] * 1e6) * 100
        together = m["idle_inject"]["all_idle_together_ns"] / (sum(injected) / len(injected)) * 100
        row = {"percent": pct, "achieved_percent": achieved, "together_percent": together,
               "throughput_percent": it / base_it * 100}
        report["injection"].append(row)
        print(f"{pct:8} {achieved:11.1f} {together:11.1f} {row['throughput_percent']:13.1f}")

    print(f"\ncpu quota 50% (quota=10,period=20), 1 vCPU per VM, spin {ms} ms")
    print(f"{'VMs':>4} {'phase':>8} {'iter/ms per VM':>30} {'periods all throttled':>22} {'ms all throttled':>17}")
    for vms in (2, 4):
        for phase in ("aligned", "random"):
            row = quota_round(args.lull, kernel, ms, vms, phase)
            report["quota"].append(row)
            per_vm = " ".join(f"{t:.2f}" for t in row["throughput_per_ms"])
            print(f"{vms:4} {phase:>8} {per_vm:>30} {row['periods_all_throttled_fraction']:22.2f} "
                  f"{row['time_all_throttled_ms']:17.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
