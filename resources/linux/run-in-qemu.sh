#!/usr/bin/env bash
# Boot lull's guest kernel kit under QEMU+KVM (a reference run, side by side with lull) and
# time the boot markers.
#
# Usage: resources/linux/run-in-qemu.sh [options] [-- extra QEMU args]
#   --kit DIR        kit directory (default: target/kit/linux of this checkout)
#   --bzimage        boot bzImage instead of the PVH vmlinux
#   --initrd NAME    initramfs file in the kit (default initramfs.cpio.gz; initramfs.cpio skips
#                    the ~40-90 s of emulated inflate on PVM hosts)
#   --firmware F     qboot (default) or seabios. qboot writes an MP table with one entry per
#                    vCPU from fw_cfg, as lull does; SeaBIOS lists only the CPUs that answered
#                    its own INIT/SIPI, which on our PVM host is 1, so the ACPI-less kernel
#                    then sees 1 CPU. qboot also saves ~5-10 s of emulated BIOS.
#   --irqchip on|off QEMU's -machine kernel-irqchip= (default: QEMU's default, on)
#   --smp N          vCPUs (default 2)
#   --mem MIB        memory (default 256)
#   --no-pvm         leave out cmdline.pvm (hosts with hardware virtualization)
#   --append ARGS    extra kernel arguments
#   --timeout S      give up after S seconds (default 600)
#   --log FILE       serial log with host timestamps (default: a temp file, printed path)
#
# Passes (exit 0) when the kernel prints "smp: Brought up 1 node, N CPUs" and either
# "Run /init as init process" and QEMU exits by itself (panic=-1 + -no-reboot, or the shell's
# reset on hosts where /init runs), or, with cmdline.pvm's lull.workload=, the in-kernel
# workload's "lull-workload: PASS" and its write of 0 to QEMU's isa-debug-exit at 0xf4 (QEMU
# status 1, as lull's). Exit 1 otherwise, 2 on usage errors.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
kit=$repo/target/kit/linux
kernel=vmlinux
initrd=initramfs.cpio.gz
firmware=qboot
irqchip=""
smp=2
mem=256
pvm=1
append=""
timeout_s=600
log=""
extra=()

while [ $# -gt 0 ]; do
    case $1 in
    --kit) kit=$2; shift 2 ;;
    --bzimage) kernel=bzImage; shift ;;
    --initrd) initrd=$2; shift 2 ;;
    --firmware) firmware=$2; shift 2 ;;
    --irqchip) irqchip=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --no-pvm) pvm=0; shift ;;
    --append) append=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-in-qemu: unknown argument $1" >&2; exit 2 ;;
    esac
done

"$repo/resources/ensure-apt.sh" qemu-system-x86
for f in "$kernel" "$initrd" cmdline cmdline.pvm; do
    [ -f "$kit/$f" ] || { echo "run-in-qemu: $kit/$f missing (run resources/linux/build.sh)" >&2; exit 2; }
done

cmdline=$(cat "$kit/cmdline")
[ $pvm -eq 1 ] && cmdline="$cmdline $(cat "$kit/cmdline.pvm")"
[ -n "$append" ] && cmdline="$cmdline $append"
# Linux 6.1 honours only one clearcpuid= (a second one silently replaces the first: a run with
# an extra clearcpuid= died on popcnt). Merge them all into the first.
merge_clearcpuid() {
    local out=() ids="" first=-1 w
    for w in $1; do
        if [[ $w == clearcpuid=* ]]; then
            ids="${ids:+$ids,}${w#clearcpuid=}"
            [ $first -lt 0 ] && { first=${#out[@]}; out+=("clearcpuid="); }
        else
            out+=("$w")
        fi
    done
    [ $first -ge 0 ] && out[first]="clearcpuid=$ids"
    echo "${out[*]}"
}
cmdline=$(merge_clearcpuid "$cmdline")
machine=()
[ -n "$irqchip" ] && machine=(-machine "kernel-irqchip=$irqchip")
cpu=host
# Without an in-kernel LAPIC, QEMU 7.2 aborts setting MSR_KVM_POLL_CONTROL (0x4b564d06) on this
# host; mask the PV features that need a KVM LAPIC, as lull does in its user-space LAPIC mode.
[ "$irqchip" = off ] && cpu=host,-kvm-poll-control,-kvm-pv-eoi,-kvm-pv-ipi,-kvm-pv-unhalt,-kvm-asyncpf,-kvm-asyncpf-int,-kvm-pv-sched-yield
bios=()
case $firmware in
qboot) bios=(-bios /usr/share/qemu/qboot.rom) ;;
seabios) ;;
*) echo "run-in-qemu: --firmware qboot|seabios" >&2; exit 2 ;;
esac
[ -n "$log" ] || log=$(mktemp /tmp/lull-qemu.XXXXXX.log)

qemu=(qemu-system-x86_64 -enable-kvm -cpu "$cpu" -smp "$smp" -m "$mem" -nographic -no-reboot
    "${machine[@]}" "${bios[@]}" -kernel "$kit/$kernel" -initrd "$kit/$initrd" -append "$cmdline"
    -device isa-debug-exit,iobase=0xf4,iosize=0x04 "${extra[@]}")
echo "run-in-qemu: ${qemu[*]}"
echo "run-in-qemu: timeout ${timeout_s}s, serial log with host timestamps: $log"

raw=$log.raw
: >"$raw"
t0=$EPOCHREALTIME
timeout -k 10 "$timeout_s" "${qemu[@]}" </dev/null >"$raw" 2>&1 &
qpid=$!
# Each serial line is prefixed with the host seconds since QEMU started. A KVM internal error
# pauses QEMU rather than ending it: stop it once its register dump (ending in "Code=") is out.
flag=$log.internal-error
rm -f "$flag"
tail -n +1 -f --pid=$qpid "$raw" | {
    internal=0
    while IFS= read -r line; do
        line=${line//$'\r'/}
        now=$EPOCHREALTIME
        printf '[%8.3f] %s\n' "$(bc <<<"$now - $t0")" "$line"
        case $line in
        *"KVM internal error"* | *"KVM: entry failed"*) internal=1; touch "$flag" ;;
        Code=*) [ $internal -eq 1 ] && kill "$qpid" 2>/dev/null ;;
        esac
    done
} | tee "$log"
set +e
wait "$qpid"
rc=$?
set -e
rm -f "$raw"
total=$(bc <<<"$EPOCHREALTIME - $t0")

marker_time() { grep -F -m1 "$1" "$log" | sed -E 's/^\[ *([0-9.]+)\].*/\1/'; }
smp_line="smp: Brought up 1 node, $smp CPU"
t_smp=$(marker_time "$smp_line" || true)
t_init=$(marker_time "Run /init as init process" || true)
t_ready=$(marker_time "lull-init: ready" || true)
t_workload=$(marker_time "lull-workload: PASS" || true)

echo "run-in-qemu: ---- summary ($kernel, $initrd, $firmware, smp $smp, irqchip ${irqchip:-default}) ----"
echo "run-in-qemu: '$smp_line': ${t_smp:-NOT SEEN}${t_smp:+ s}"
echo "run-in-qemu: 'Run /init as init process': ${t_init:-NOT SEEN}${t_init:+ s}"
echo "run-in-qemu: 'lull-init: ready': ${t_ready:-not seen (expected on PVM hosts)}${t_ready:+ s}"
echo "run-in-qemu: 'lull-workload: PASS': ${t_workload:-not seen}${t_workload:+ s}"
if [ -e "$flag" ]; then
    rm -f "$flag"
    echo "run-in-qemu: KVM internal error (emulation failure: see the Code= bytes above); QEMU stopped"
    rc=124
elif [ "$rc" -eq 124 ]; then
    echo "run-in-qemu: QEMU killed after the ${timeout_s}s timeout"
else
    echo "run-in-qemu: QEMU exited with status $rc after $(printf '%.1f' "$total") s"
fi
if [ -n "$t_smp" ] && [ "$rc" -ne 124 ] &&
    { [ -n "$t_init" ] || { [ -n "$t_workload" ] && [ "$rc" -eq 1 ]; }; }; then
    echo "run-in-qemu: PASS"
    exit 0
fi
echo "run-in-qemu: FAIL (log: $log)"
exit 1
