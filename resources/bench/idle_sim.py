"""One `lull run` of the kit's idle-sim guest with --metrics, for the bench scripts beside it
(event_cost.py, interval_cost.py): the guest's output, lull's metrics, and medians of runs."""

import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(lull, kit, label, cpus, cmdline, flags, seconds):
    """Runs idle-sim for `seconds` (`cmdline` must say so); exits the script with the output's
    tail unless the guest passed. Returns (guest output, metrics)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.json")
        cmd = [lull, "run", "--kernel", os.path.join(kit, "guests/idle-sim.elf"),
               "--cpus", str(cpus), "--metrics", metrics,
               "--cmdline", cmdline] + flags
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
        text = out.stdout + out.stderr
        if out.returncode != 1 or "idle-sim: PASS" not in text:
            sys.exit(f"{label}: the run failed (status {out.returncode}):\n{text[-2000:]}")
        with open(metrics) as f:
            return text, json.load(f)


def medians(runs):
    """Per key of the runs' dicts, the median over the runs."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def load_average():
    """The 1-minute load average, as /proc/loadavg has it."""
    with open("/proc/loadavg") as f:
        return f.read().split()[0]
