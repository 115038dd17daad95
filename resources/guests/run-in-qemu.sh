#!/usr/bin/env bash
# run-in-qemu.sh NAME [APPEND] : boot guest NAME under QEMU+KVM, serial on stdout.
#
# Exits with the guest's own exit code (0 = pass) decoded from QEMU's isa-debug-exit status
# ((code << 1) | 1); 124 if QEMU hit the timeout, 125 if QEMU stopped without a test exit
# (e.g. a triple fault with -no-reboot).
# Environment: GUESTS_DIR (default: target/kit/guests, built on demand), QEMU_TIMEOUT
# (seconds, default 60), QEMU_SMP (default 1), QEMU_EXTRA (more QEMU arguments),
# QEMU_CPU (default host,+invtsc,vmware-cpuid-freq=on).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${1:?usage: run-in-qemu.sh NAME [APPEND]}
append=${2:-}
dir=${GUESTS_DIR:-$here/../../target/kit/guests}
if [ ! -e "$dir/$name.elf" ]; then
    "$here/build.sh" "$dir" >&2 || exit 1
fi
[ -e "$dir/$name.elf" ] || { echo "run-in-qemu: no guest $dir/$name.elf" >&2; exit 1; }
command -v qemu-system-x86_64 >/dev/null || "$here/../ensure-apt.sh" qemu-system-x86

# shellcheck disable=SC2086
timeout "${QEMU_TIMEOUT:-60}" qemu-system-x86_64 -enable-kvm \
    -cpu "${QEMU_CPU:-host,+invtsc,vmware-cpuid-freq=on}" -smp "${QEMU_SMP:-1}" -m 128 \
    -nographic -no-reboot -serial mon:stdio -monitor none -display none \
    -net none -device isa-debug-exit,iobase=0xf4,iosize=4 \
    -kernel "$dir/$name.elf" -append "$append" ${QEMU_EXTRA:-} </dev/null
rc=$?
if [ $rc -eq 124 ]; then
    echo "run-in-qemu: $name timed out after ${QEMU_TIMEOUT:-60}s" >&2
    exit 124
fi
if [ $((rc & 1)) -eq 1 ]; then
    code=$((rc >> 1))
    echo "run-in-qemu: $name exited with code $code" >&2
    exit $code
fi
echo "run-in-qemu: $name: QEMU exited with status $rc without a test exit" >&2
exit 125
