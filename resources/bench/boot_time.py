#!/usr/bin/env python3
"""Boot time of lull vs QEMU (-enable-kvm) on the same guests, and lull's own memory.

Usage: resources/bench/boot_time.py [--reps N] [--linux-reps N] [--lull PATH] [--kit DIR]

Runs, alternating lull and QEMU so that host noise hits both alike:
  * the `hello` test guest: wall time from spawn to the VMM's exit;
  * the kit's Linux kernel + initramfs with 2 vCPUs: wall time to "smp: Brought up",
    to "Run /init as init process" and to the VMM's exit (panic=-1 resets);
  * lull's resident memory beyond guest RAM for a 1-vCPU, 128 MiB Linux guest, read from
    /proc/PID/smaps once the kernel has brought up its CPUs (total Rss minus the Rss of the
    guest RAM mapping), then the run is stopped.
Prints a table and ratios (lull / QEMU) of medians from this one run.
"""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
MARKERS = ("smp: Brought up", "Run /init as init process")


QBOOT = "/usr/share/qemu/qboot.rom"


def qemu_base(mem_mb, smp):
    # qboot writes one MP-table entry per vCPU, as lull does (SeaBIOS lists one per socket).
    bios = ["-bios", QBOOT] if os.path.exists(QBOOT) else []
    return ["qemu-system-x86_64", "-enable-kvm"] + bios + ["-cpu", "host,+invtsc,vmware-cpuid-freq=on",
            "-smp", str(smp), "-m", str(mem_mb), "-nographic", "-no-reboot",
            "-serial", "stdio", "-monitor", "none", "-display", "none", "-net", "none",
            "-device", "isa-debug-exit,iobase=0xf4,iosize=4"]


def timed_run(cmd, markers=(), timeout=900, on_marker=None):
    """Runs cmd; returns (total seconds, {marker: seconds}, exit code)."""
    start = time.monotonic()
    seen = {}
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    buf = b""
    for chunk in iter(lambda: proc.stdout.read1(4096), b""):
        buf = (buf + chunk)[-4096:]
        text = buf.decode("utf-8", "replace")
        for m in markers:
            if m not in seen and m in text:
                seen[m] = time.monotonic() - start
                if on_marker:
                    on_marker(m, proc.pid)
    code = proc.wait()
    timer.cancel()
    return time.monotonic() - start, seen, code


def guest_ram_excess_kib(pid, guest_bytes):
    """Total Rss of pid minus the Rss of its guest-RAM mapping (the one of guest_bytes)."""
    total = 0
    guest = 0
    current_size = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                current_size = hi - lo
            elif parts[0] == "Rss:":
                kib = int(parts[1])
                total += kib
                if current_size == guest_bytes:
                    guest += kib
    return total - guest, guest, total


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--linux-reps", type=int, default=1)
    ap.add_argument("--lull", default=os.path.join(REPO, "target", "release", "lull"))
    ap.add_argument("--kit", default=os.path.join(REPO, "target", "kit"))
    args = ap.parse_args()

    hello = os.path.join(args.kit, "guests", "hello.elf")
    linux = os.path.join(args.kit, "linux")
    initrd = os.path.join(linux, "initramfs.cpio")
    if not os.path.exists(initrd):
        initrd = os.path.join(linux, "initramfs.cpio.gz")
    cmdline = open(os.path.join(linux, "cmdline")).read().strip()
    if os.path.exists("/sys/module/kvm_pvm"):
        cmdline += " " + open(os.path.join(linux, "cmdline.pvm")).read().strip()

    results = {}
    for _ in range(args.reps):
        t, _, code = timed_run([args.lull, "run", "--kernel", hello, "--memory", "128M"])
        assert code == 1, f"lull hello exit {code}"
        results.setdefault("hello lull", []).append(t)
        t, _, code = timed_run(qemu_base(128, 1) + ["-kernel", hello])
        assert code == 1, f"qemu hello exit {code}"
        results.setdefault("hello qemu", []).append(t)

    # lull's own memory: a 1-vCPU, 128 MiB Linux guest, sampled once the kernel is up.
    rss = []
    def sample_and_stop(marker, pid):
        rss.append(guest_ram_excess_kib(pid, 128 << 20))
        os.kill(pid, 15)
    timed_run([args.lull, "run", "--kernel", os.path.join(linux, "vmlinux"),
               "--initramfs", initrd,
               "--cpus", "1", "--memory", "128M", "--cmdline", cmdline],
              MARKERS[:1], on_marker=sample_and_stop)

    for _ in range(args.linux_reps):
        base = [args.lull, "run", "--kernel", os.path.join(linux, "vmlinux"), "--initramfs", initrd,
                "--cpus", "2", "--memory", "128M", "--cmdline", cmdline]
        runs = [("lull-user", base + ["--irqchip", "user"]),
                ("lull-kernel", base + ["--irqchip", "kernel"]),
                ("qemu", qemu_base(128, 2) + ["-kernel", os.path.join(linux, "vmlinux"),
                                              "-initrd", initrd, "-append", cmdline])]
        for name, cmd in runs:
            t, seen, code = timed_run(cmd, MARKERS)
            results.setdefault(f"linux {name} exit", []).append(t)
            for m in MARKERS:
                results.setdefault(f"linux {name} '{m}'", []).append(seen.get(m, float("nan")))

    print(f"{'measurement':45} {'median s':>10}  runs")
    for k, v in results.items():
        print(f"{k:45} {med(v):10.3f}  {' '.join(f'{x:.3f}' for x in v)}")
    print()
    print(f"ratio hello (lull/qemu): {med(results['hello lull']) / med(results['hello qemu']):.3f}")
    if args.linux_reps:
        for name in ("lull-user", "lull-kernel"):
            for m in MARKERS:
                a, b = med(results[f"linux {name} '{m}'"]), med(results[f"linux qemu '{m}'"])
                print(f"ratio linux to '{m}' ({name}/qemu): {a / b:.3f}")
    for excess, guest, total in rss:
        print(f"lull RSS, 1 vCPU, 128 MiB guest, after 'smp: Brought up': total {total} KiB, "
              f"guest RAM {guest} KiB, lull's own {excess} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
