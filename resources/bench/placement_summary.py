#!/usr/bin/env python3
"""Summary of `placement.sh`: reads every run's lull metrics, guest consoles and competitor
output from the work directory, prints a table (medians over repetitions per cell) and writes
the JSON (schema `lull-bench-placement/1`, described in docs/bench/README.md).

argv: WORK JSON LOAD VMS CPUS DURATION_MS MIX REPS ALONE_LINES TAG...
"""

import glob
import json
import os
import re
import statistics
import sys


def busy_rate(text):
    m = re.search(r"rate ([0-9.]+)", text or "")
    return float(m.group(1)) if m else None


def lateness_hist(console):
    """Buckets (lo, hi, count) of one idle-sim console's lateness histogram, ns."""
    out = []
    for line in console.splitlines():
        if line.startswith("idle-sim: hist lateness"):
            for item in line.split()[3:]:
                rng, count = item.split(":")
                lo, hi = rng.split("-")
                out.append((int(lo), int(hi), int(count)))
    return out


def percentile(buckets, q):
    """Upper bound of the bucket holding quantile q (what idle-sim itself reports)."""
    buckets = sorted(buckets)
    total = sum(c for _, _, c in buckets)
    if total == 0:
        return None
    need = q * total
    seen = 0
    for _, hi, c in buckets:
        seen += c
        if seen >= need:
            return hi
    return buckets[-1][1]


def run_summary(work, tag):
    blocks = migrations = binds = backoffs = bound_moves = vcpu_cpu_ns = 0
    bound_wakes = bound_late = free_wakes = free_late = 0
    buckets = []
    passed = 0
    vms = sorted(glob.glob(os.path.join(work, f"{tag}-vm*.json")))
    for path in vms:
        with open(path) as f:
            m = json.load(f)
        for v in m["vcpus"]:
            blocks += v["blocks"]
            migrations += v["wake_migrations"]
            binds += v["placement"]["binds"]
            backoffs += v["placement"]["backoffs"]
            bound_moves += v["placement"]["bound_migrations"]
            bound_wakes += v["placement"]["bound_wakes"]
            bound_late += v["placement"]["bound_late_ns"]
            free_wakes += v["placement"]["free_wakes"]
            free_late += v["placement"]["free_late_ns"]
        vcpu_cpu_ns += sum(t["cpu_ns"] for t in m["threads"] if t["name"].startswith("vcpu"))
        with open(path[: -len(".json")] + ".console") as f:
            console = f.read()
        passed += "idle-sim: PASS" in console
        buckets += lateness_hist(console)
    busy = None
    busy_path = os.path.join(work, f"{tag}.busy")
    if os.path.exists(busy_path):
        with open(busy_path) as f:
            busy = busy_rate(f.read())
    return {
        "tag": tag,
        "vms_passed": passed,
        "vms": len(vms),
        "blocks": blocks,
        "wake_migrations": migrations,
        "migrations_per_1000_wakes": 1000 * migrations / blocks if blocks else None,
        "binds": binds,
        "binds_per_block": binds / blocks if blocks else None,
        "backoffs": backoffs,
        "bound_migrations": bound_moves,
        "vcpu_cpu_us_per_wake": vcpu_cpu_ns / blocks / 1000 if blocks else None,
        "bound_wakes": bound_wakes,
        "bound_mean_late_us": bound_late / bound_wakes / 1000 if bound_wakes else None,
        "free_wakes": free_wakes,
        "free_mean_late_us": free_late / free_wakes / 1000 if free_wakes else None,
        "lateness_p50_ns": percentile(buckets, 0.50),
        "lateness_p99_ns": percentile(buckets, 0.99),
        "competitor_mips": busy,
    }


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    work, json_path, load, vms, cpus, duration_ms, mix, reps, alone = sys.argv[1:10]
    tags = sys.argv[10:]
    alone_rates = [float(x) for x in re.findall(r"rate ([0-9.]+)", alone)]
    alone_mips = median(alone_rates)
    runs = []
    for tag in tags:
        r = run_summary(work, tag)
        _, compete, mode = tag.split("-", 2)
        r["mode"] = mode
        r["competitor"] = compete == "c1"
        runs.append(r)
    cells = []
    keys = ["migrations_per_1000_wakes", "binds_per_block", "bound_mean_late_us",
            "free_mean_late_us", "vcpu_cpu_us_per_wake", "lateness_p50_ns",
            "lateness_p99_ns", "competitor_mips"]
    for competitor in (False, True):
        for mode in dict.fromkeys(r["mode"] for r in runs):
            rs = [r for r in runs if r["mode"] == mode and r["competitor"] == competitor]
            cell = {"mode": mode, "competitor": competitor, "runs": len(rs)}
            for k in keys:
                cell[k] = median([r[k] for r in rs])
            cell["backoffs"] = sum(r["backoffs"] for r in rs)
            cell["bound_migrations"] = sum(r["bound_migrations"] for r in rs)
            cell["vms_failed"] = sum(r["vms"] - r["vms_passed"] for r in rs)
            if cell["competitor_mips"] and alone_mips:
                cell["competitor_share_of_alone"] = cell["competitor_mips"] / alone_mips
            cells.append(cell)
    # Paired per repetition: each mode against the first (`off`) of the same repetition and
    # competitor case, which ran minutes apart at most; the median of those ratios is less
    # exposed to the host's load drifting between repetitions than the medians above.
    base_mode = runs[0]["mode"] if runs else None
    paired = []
    for competitor in (False, True):
        for mode in dict.fromkeys(r["mode"] for r in runs):
            if mode == base_mode:
                continue
            ratios = {k: [] for k in ("lateness_p50_ns", "lateness_p99_ns", "competitor_mips")}
            for r in runs:
                if r["mode"] != mode or r["competitor"] != competitor:
                    continue
                rep = r["tag"].split("-")[0]
                base = next(b for b in runs if b["tag"] == f"{rep}-c{int(competitor)}-{base_mode}")
                for k in ratios:
                    if r[k] and base[k]:
                        ratios[k].append(r[k] / base[k])
            paired.append({"mode": mode, "against": base_mode, "competitor": competitor,
                           **{f"{k}_ratio": median(v) for k, v in ratios.items()}})
    fmt = lambda v, f: "-" if v is None else f.format(v)
    print(f"wake placement: {vms} VMs x {cpus} vCPUs of idle-sim mix={mix}, "
          f"{duration_ms} ms, {reps} reps (medians); load before {load}; "
          f"competitor alone {fmt(alone_mips, '{:.0f}')} M it/s")
    print(f"{'competitor':<10} {'mode':<10} {'migr/1k':>7} {'binds/blk':>9} {'cpu/wake':>8} "
          f"{'host late bound/free':>20} {'late p50':>9} {'late p99':>9} {'comp M it/s':>11} {'of alone':>8} {'backoffs':>8}")
    for c in cells:
        print(f"{'yes' if c['competitor'] else 'no':<10} {c['mode']:<10} "
              f"{fmt(c['migrations_per_1000_wakes'], '{:.2f}'):>7} {fmt(c['binds_per_block'], '{:.3f}'):>9} "
              f"{fmt(c['vcpu_cpu_us_per_wake'], '{:.1f}us'):>8} "
              f"{fmt(c['bound_mean_late_us'], '{:.0f}us'):>10}/{fmt(c['free_mean_late_us'], '{:.0f}us'):<9} "
              f"{fmt(c['lateness_p50_ns'] and c['lateness_p50_ns'] / 1000, '{:.0f}us'):>9} "
              f"{fmt(c['lateness_p99_ns'] and c['lateness_p99_ns'] / 1000, '{:.0f}us'):>9} "
              f"{fmt(c['competitor_mips'], '{:.0f}'):>11} "
              f"{fmt(c.get('competitor_share_of_alone'), '{:.1%}'):>8} {c['backoffs']:>8}")
    for p in paired:
        print(f"paired per rep, {p['mode']} / {p['against']}, competitor "
              f"{'yes' if p['competitor'] else 'no'}: lateness p50 "
              f"{fmt(p['lateness_p50_ns_ratio'], '{:.2f}x')}, p99 "
              f"{fmt(p['lateness_p99_ns_ratio'], '{:.2f}x')}, competitor throughput "
              f"{fmt(p['competitor_mips_ratio'], '{:.3f}x')}")
    if json_path:
        report = {
            "schema": "lull-bench-placement/1",
            "load_before": load,
            "vms": int(vms),
            "cpus": int(cpus),
            "duration_ms": int(duration_ms),
            "mix": mix,
            "reps": int(reps),
            "host_cpus": os.cpu_count(),
            "competitor_alone_mips": alone_rates,
            "cells": cells,
            "paired": paired,
            "runs": runs,
        }
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
