#!/usr/bin/env python3
"""Host wake-ups per rate-limiter refill: device timers on lull's timer models against a
timerfd per limiter (Firecracker's way), in one run.

The kit guest virtio-blk (2 vCPUs) writes 4 KiB requests for DURATION ms to a disk limited to
BANDWIDTH bytes/s, waiting for each request halted (STI;HLT), while its AP either spins
(`ap=spin`: one vCPU always runs) or halts for good (`ap=idle`: both idle between requests).
Past the bucket's first 100 ms, every request waits for one refill timer.

Modes: `pull`, `push`, `central` (`--device-timers hierarchy`: global timers on the timer
model), `timerfd` (`--irqchip user --timer-model pull --device-timers timerfd`) and `kernel`
(`--irqchip kernel`, timerfd). Each limited run is paired with the same guest without the
rate loop, whose counts are subtracted (boot, checks, exit).

Host wake-ups are voluntary context switches of every lull thread (a blocked thread woken).
`halted_woken_by_device_timer` counts wake-ups of blocked vCPUs whose cause was a global
(device) timer (`vcpus[].wakeups.global_timer`); in `pull` with `ap=spin` it must be 0.

Usage: resources/bench/ratelimit.py LULL KIT_GUESTS OUT.json [DURATION_MS] [BANDWIDTH]
"""

import json
import os
import platform
import subprocess
import sys
import tempfile

MODES = {
    "pull": ["--timer-model", "pull"],
    "push": ["--timer-model", "push"],
    "central": ["--timer-model", "central"],
    "timerfd": ["--timer-model", "pull", "--device-timers", "timerfd"],
    "kernel": ["--irqchip", "kernel"],
}
SCENARIOS = ["spin", "idle"]


def run(lull, guest, disk, mode, ap, rate_ms, bandwidth):
    """One lull run; returns (metrics, guest line of the rate loop or None)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as m:
        metrics = m.name
    cmdline = f"ap={ap}" + (f" rate_ms={rate_ms}" if rate_ms else "")
    cmd = [lull, "run", "--cpus", "2", "--kernel", guest, "--cmdline", cmdline,
           "--disk", f"path={disk},bandwidth={bandwidth}", "--serial", "stdio",
           "--metrics", metrics] + MODES[mode]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 1 or "virtio-blk: PASS" not in out.stdout:
        raise RuntimeError(f"{' '.join(cmd)}: status {out.returncode}\n{out.stdout}{out.stderr}")
    with open(metrics) as f:
        report = json.load(f)
    os.unlink(metrics)
    line = next((l for l in out.stdout.splitlines() if l.startswith("virtio-blk: rate")), None)
    return report, line


def counts(report):
    """What one run cost: wake-ups per thread kind, refills, halted vCPUs woken by timers."""
    threads = report["threads"]
    def vol(pred):
        return sum(t["voluntary_ctxt_switches"] for t in threads if pred(t["name"]))
    dev = (report.get("device_timers") or {"devices": [{}]})["devices"][0]
    vcpus = report["vcpus"]
    return {
        "wakeups_total": vol(lambda n: True),
        "wakeups_vcpus": vol(lambda n: n.startswith("vcpu")),
        "wakeups_vmm": vol(lambda n: n == "lull"),
        "wakeups_timer_thread": vol(lambda n: n == "timers"),
        "refills": dev.get("fired", 0),
        "refills_on_vmm_thread": dev.get("vmm_thread_fires", 0),
        "halted_woken_by_device_timer": sum(v["wakeups"]["global_timer"] for v in vcpus),
        "ap_interrupted_exits": vcpus[1]["interrupted"] if len(vcpus) > 1 else 0,
    }


def main():
    lull, guests, out = sys.argv[1], sys.argv[2], sys.argv[3]
    duration = int(sys.argv[4]) if len(sys.argv) > 4 else 3000
    bandwidth = sys.argv[5] if len(sys.argv) > 5 else "400K"
    guest = os.path.join(guests, "virtio-blk.elf")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        disk = os.path.join(tmp, "disk.img")
        with open(disk, "wb") as f:
            f.truncate(1 << 20)
        for ap in SCENARIOS:
            for mode in MODES:
                base, _ = run(lull, guest, disk, mode, ap, 0, bandwidth)
                limited, line = run(lull, guest, disk, mode, ap, duration, bandwidth)
                b, l = counts(base), counts(limited)
                words = line.split() if line else []
                requests = int(words[-2]) if line else 0
                bytes_per_s = int(words[-4]) if line else 0
                d = {k: l[k] - b[k] for k in l}
                refills = max(l["refills"], 1)
                row = {
                    "scenario": f"ap={ap}", "mode": mode, "requests": requests,
                    "achieved_bytes_per_s": bytes_per_s, "refills": l["refills"],
                    "refills_on_vmm_thread": l["refills_on_vmm_thread"],
                    "wakeups_per_refill": round(d["wakeups_total"] / refills, 2),
                    "vcpu_wakeups_per_refill": round(d["wakeups_vcpus"] / refills, 2),
                    "vmm_wakeups_per_refill": round(d["wakeups_vmm"] / refills, 2),
                    "timer_thread_wakeups_per_refill": round(d["wakeups_timer_thread"] / refills, 2),
                    "wakeups_per_io": round(d["wakeups_total"] / max(requests, 1), 2),
                    "halted_woken_by_device_timer": l["halted_woken_by_device_timer"],
                    "ap_interrupted_exits_per_refill": round(d["ap_interrupted_exits"] / refills, 2),
                    "limited": l, "baseline": b,
                }
                results.append(row)
                print(f"{row['scenario']:8} {mode:8} refills {row['refills']:5} "
                      f"wake-ups/refill {row['wakeups_per_refill']:5} "
                      f"(vCPUs {row['vcpu_wakeups_per_refill']}, VMM {row['vmm_wakeups_per_refill']}, "
                      f"timer thread {row['timer_thread_wakeups_per_refill']}) "
                      f"per I/O {row['wakeups_per_io']} halted-woken-by-device-timer "
                      f"{row['halted_woken_by_device_timer']} AP kicks/refill "
                      f"{row['ap_interrupted_exits_per_refill']} {bytes_per_s} B/s",
                      flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    doc = {
        "schema": "lull-bench-ratelimit/1",
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "loadavg": load},
        "duration_ms": duration, "bandwidth": bandwidth, "request_bytes": 4096,
        "results": results,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
