#!/usr/bin/env python3
"""Where a halted vCPU's time on the host CPU goes, per timer event, per LAPIC mode.

One vCPU of the kit's `idle-sim` guest arms a TSC deadline at a fixed interval and halts
(`mix=100:MS ipi_pct=0`, PV EOI, and with `--irqchip user` lull's PV deadline and no halt
polling, so that every event is one wake-up in both modes). While it
runs, `perf record` takes the host's scheduler switches, system calls and KVM's user-space
exits for a window; the vCPU thread's part of that gives, per wake-up of the thread:

  on CPU            from being switched in to being switched out asleep (both modes)

and with `--irqchip user` how that splits:

  wake path         switched in -> its `ppoll` returns (the kernel's side of the wait)
  lull, wake        `ppoll` returns -> `KVM_RUN` is entered (lull's code: timers, inject)
  KVM_RUN           `KVM_RUN` entered -> the HLT exit (KVM's entry, the guest, its exit)
  exit path         the HLT exit -> `KVM_RUN` returns to user space
  lull, halt        `KVM_RUN` returns -> `ppoll` is entered (lull's code: the HLT, the
                    wake-up timer's arming)
  sleep path        `ppoll` entered -> switched out (the kernel's side of the wait)

KVM's LAPIC spends its whole event inside `KVM_RUN`, so only "on CPU" is compared between
the modes. The longer the interval, the colder the host's caches when the vCPU wakes: this
shows which of lull's steps grow with that. The tracepoints add about a microsecond to every
system call, in both modes; compare the two modes of one run, not runs with and without it.
Runs are interleaved (every mode of an interval, then the next interval); a row holds the
medians over the window's wake-ups (the first and last few are left out).

Needs `perf` (Debian: linux-perf) and the right to trace the whole host (root).

Usage: resources/bench/event_timeline.py [--lull target/release/lull] [--kit target/kit]
           [--intervals 1,10,100] [--seconds 10] [--json FILE]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import idle_sim

MODES = {
    "kernel": (["--irqchip", "kernel"], ""),
    # lull's halt polling off: a poll that wins spares a wake-up, so with it the two modes'
    # wake-ups would not be the same events (KVM's own polling did not win here either).
    "pull": (["--irqchip", "user", "--timer-model", "pull", "--halt-poll", "off"],
             "pv_deadline=1"),
}

EVENTS = ["sched:sched_switch", "kvm:kvm_userspace_exit", "raw_syscalls:sys_enter",
          "raw_syscalls:sys_exit"]

# x86_64 system call numbers, and KVM_RUN's ioctl request as perf prints it.
NR_IOCTL, NR_PPOLL, KVM_RUN = "16", "271", "ae80"

SEGMENTS = ["wake path", "lull, wake", "KVM_RUN", "exit path", "lull, halt", "sleep path"]

LINE = re.compile(r"\s*\S+\s+(\d+)\s+([\d.]+):\s+(\S+):\s+(.*)")

# Wake-ups left out at each end of the window (the window's edges cut them).
EDGE = 3


def vcpu_tid(pid, deadline):
    """The thread id of vCPU 0 of lull process `pid`, once it exists."""
    while time.monotonic() < deadline:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if f.read().strip() == "vcpu0":
                        return tid
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    sys.exit(f"lull {pid}: no vcpu0 thread appeared")


def wakes(script, tid):
    """Per wake-up of thread `tid` in `perf script` output: (switch-in time, marks, switch-out
    time), marks being (time, what) of its system calls and user-space exits between."""
    out, cur = [], None
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        who, t, event, rest = m.group(1), float(m.group(2)) * 1e6, m.group(3), m.group(4)
        if event == "sched:sched_switch":
            if f"next_pid={tid} " in rest + " ":
                cur = (t, [])
            elif f"prev_pid={tid} " in rest and cur is not None:
                if "prev_state=S" in rest:
                    out.append((cur[0], cur[1], t))
                cur = None
            continue
        if cur is None or who != tid:
            continue
        if event == "raw_syscalls:sys_enter":
            if rest.startswith(f"NR {NR_PPOLL} "):
                cur[1].append((t, "ppoll enter"))
            elif rest.startswith(f"NR {NR_IOCTL} ") and f", {KVM_RUN}," in rest:
                cur[1].append((t, "run enter"))
        elif event == "raw_syscalls:sys_exit":
            if rest.startswith(f"NR {NR_PPOLL} "):
                cur[1].append((t, "ppoll exit"))
            elif rest.startswith(f"NR {NR_IOCTL} "):
                cur[1].append((t, "ioctl exit"))
        elif event == "kvm:kvm_userspace_exit" and "KVM_EXIT_HLT" in rest:
            cur[1].append((t, "hlt"))
    return out[EDGE:-EDGE] if len(out) > 2 * EDGE else []


def split(start, marks, end):
    """The segments of one user-irqchip wake-up, or None if it is not the plain sequence
    (ppoll returns, KVM_RUN until the HLT, ppoll) that a timer event makes."""
    first = {}
    for t, what in marks:
        first.setdefault(what, t)
    last = {what: t for t, what in marks}
    need = ("ppoll exit", "run enter", "hlt", "ioctl exit", "ppoll enter")
    if any(k not in first for k in need):
        return None
    points = [start, first["ppoll exit"], first["run enter"], last["hlt"], last["ioctl exit"],
              last["ppoll enter"], end]
    if points != sorted(points):
        return None
    return [b - a for a, b in zip(points, points[1:])]


def run_once(lull, kit, seconds, interval_ms, mode):
    flags, extra = MODES[mode]
    cmdline = (f"duration_ms={(seconds + 4) * 1000} ipi_pct=0 mix=100:{interval_ms} "
               f"pv_eoi=1 {extra}").strip()
    cmd = [lull, "run", "--kernel", os.path.join(kit, "guests/idle-sim.elf"), "--cpus", "1",
           "--cmdline", cmdline] + flags
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        vm = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tid = vcpu_tid(vm.pid, time.monotonic() + 10)
        time.sleep(1.5)
        rec = subprocess.run(["perf", "record", "-q", "-m", "8192", "-a", "-o", data]
                             + [a for e in EVENTS for a in ("-e", e)]
                             + ["sleep", str(seconds)], capture_output=True, text=True)
        output, _ = vm.communicate(timeout=seconds + 60)
        if rec.returncode != 0:
            sys.exit(f"perf record failed ({rec.returncode}): {rec.stderr[-1000:]}")
        if "idle-sim: PASS" not in output:
            sys.exit(f"{mode} {interval_ms} ms: the guest did not pass:\n{output[-2000:]}")
        script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,time,event,trace"],
                                capture_output=True, text=True, check=True).stdout
    ws = wakes(script, tid)
    if not ws:
        sys.exit(f"{mode} {interval_ms} ms: no wake-up of vcpu0 ({tid}) in the trace")
    row = {"wakes": len(ws), "on_cpu_us": statistics.median(e - s for s, _, e in ws)}
    if mode != "kernel":
        parts = [p for p in (split(*w) for w in ws) if p]
        row["split_wakes"] = len(parts)
        for i, name in enumerate(SEGMENTS):
            row[name] = statistics.median(p[i] for p in parts) if parts else None
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lull", default="target/release/lull")
    p.add_argument("--kit", default="target/kit")
    p.add_argument("--intervals", default="1,10,100")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--json")
    a = p.parse_args()
    if shutil.which("perf") is None:
        sys.exit("event_timeline.py needs perf (Debian: linux-perf) and root to trace the host")
    rows = {}
    for iv in [int(x) for x in a.intervals.split(",")]:
        for mode in MODES:
            rows[(iv, mode)] = run_once(a.lull, a.kit, a.seconds, iv, mode)
            print(f"{iv} ms {mode}: {rows[(iv, mode)]}", file=sys.stderr)
    load = idle_sim.load_average()
    print(f"one vCPU, fixed TSC-deadline intervals, {a.seconds} s traced per row (medians "
          f"over its wake-ups), load at the end {load}")
    print("| interval | kernel on CPU | pull on CPU | **pull - kernel** | "
          + " | ".join(SEGMENTS) + " |")
    print("|---:|---:|---:|---:|" + "---:|" * len(SEGMENTS))
    for iv in sorted({iv for iv, _ in rows}):
        k, u = rows[(iv, "kernel")], rows[(iv, "pull")]
        segs = " | ".join("-" if u[s] is None else f"{u[s]:.0f} us" for s in SEGMENTS)
        print(f"| {iv} ms | {k['on_cpu_us']:.0f} us | {u['on_cpu_us']:.0f} us | "
              f"**{u['on_cpu_us'] - k['on_cpu_us']:+.0f} us** | {segs} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"load": load, "seconds": a.seconds,
                       "rows": [{"interval_ms": iv, "mode": m, **r}
                                for (iv, m), r in rows.items()]}, f, indent=1)


if __name__ == "__main__":
    main()
