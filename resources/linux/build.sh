#!/usr/bin/env bash
# Build lull's guest kernel kit: a tiny Linux 6.1 (Debian's linux-source-6.1) and a busybox
# initramfs.
#
# Usage: resources/linux/build.sh OUT_LINK
#
# Output (a cache dir, OUT_LINK becomes a symlink to it):
#   ${LULL_CACHE:-$HOME/.cache/lull}/linux/<sha256 of all inputs>/
#     vmlinux            uncompressed ELF with a PVH note (load this one: no decompression)
#     bzImage            LZ4-compressed kernel for the Linux boot protocol path
#     initramfs.cpio.gz  busybox-static + /init (prints "lull-init: ready", runs a shell)
#     initramfs.cpio     the same, uncompressed: inflating it costs ~40-90 s of emulated CPL0
#     cmdline            base kernel command line
#     cmdline.pvm        extra arguments for PVM-based (CPL0-emulating) KVM hosts
#     config             the final kernel .config
#     inputs             what the hash covers
#     build.log.gz       the full build log
# A cache hit does nothing but update OUT_LINK. See resources/linux/README.md.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_LINK" >&2
    exit 2
fi
OUT_LINK=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
start=$SECONDS

phase() { printf 'linux: [%3ds] %s\n' $((SECONDS - start)) "$*"; }

# The command lines. Changing them changes build.sh, hence the hash.
CMDLINE="console=ttyS0 reboot=k panic=-1 rdinit=/init"
# tsc=reliable: no clocksource watchdog; with emulated CPL0 its reads are slow enough for it to
# declare the TSC (or kvm-clock) unstable, and it costs an idle guest host CPU every 0.5 s.
# rcupdate.rcu_cpu_stall_suppress=1: emulated, long kernel loops (mark_rodata_ro: 20-80 s on a
# loaded host) read as RCU stalls, and the stall report's NMI backtrace was seen to end in a KVM
# internal error. lull.workload=: guest user space cannot run there, so the kernel runs
# lull_workload.c's idle workload instead of /init and ends the run through the test-exit port
# (PASS: lull status 1).
CMDLINE_PVM="noxsave clearcpuid=cx16,popcnt,rdtscp,smap,xsave mitigations=off tsc=reliable rcupdate.rcu_cpu_stall_suppress=1 lull.workload=idle,seconds=10"

"$repo/resources/ensure-apt.sh" linux-source-6.1 build-essential bc bison flex libelf-dev \
    libssl-dev cpio xz-utils lz4 busybox-static

SRC_TAR=/usr/src/linux-source-6.1.tar.xz
BUSYBOX=/bin/busybox
# Kernel patches: every *.patch here, applied in name order.
PATCHES=()
for f in "$here"/*.patch; do PATCHES+=("$(basename "$f")"); done
INPUT_FILES=(build.sh lull.config "${PATCHES[@]}" lull_workload.c check-insns.sh init ../lib/cache.sh)

# The kit's content-addressed cache (resources/lib/cache.sh): the manifest below is the key.
source "$here/../lib/cache.sh"
inputs() {
    (cd "$here" && cache_files "${INPUT_FILES[@]}")
    dpkg-query -W -f='package ${Package} ${Version}\n' linux-source-6.1 busybox-static
    printf 'gcc %s\n' "$(gcc --version | head -n1)"
    printf 'ld %s\n' "$(ld --version | head -n1)"
    printf 'arch %s\n' "$(uname -m)"
}
cache_open linux "$OUT_LINK" "$(inputs)"
hash=$CACHE_KEY
cache_lookup && exit 0

work=$(cache_workdir)
log=$work/build.log
: >"$log"
on_exit() {
    local rc=$?
    if [ $rc -ne 0 ]; then
        echo "linux: FAILED (exit $rc); work dir kept: $work" >&2
        [ -s "$log" ] && { echo "linux: last lines of $log:" >&2; tail -n 40 "$log" >&2; }
    fi
}
trap on_exit EXIT

phase "building $hash in $work"
printf '%s\n' "$CACHE_MANIFEST" | sed 's/^/linux:   input: /'

phase "extracting $SRC_TAR"
tar -xJf "$SRC_TAR" -C "$work"
src=$work/linux-source-6.1
cd "$src"

for p in "${PATCHES[@]}"; do
    phase "applying $p"
    patch -p1 -F0 --no-backup-if-mismatch <"$here/$p" >>"$log"
done
cp "$here/lull_workload.c" kernel/lull_workload.c # built by lull-workload-hook.patch

# Reproducible-ish build metadata.
export KBUILD_BUILD_USER=lull KBUILD_BUILD_HOST=lull KBUILD_BUILD_VERSION=1
export KBUILD_BUILD_TIMESTAMP="lull ${hash:0:12}"
MAKE=(make ARCH=x86_64 -j"$(nproc)")

phase "configuring: tinyconfig + lull.config"
"${MAKE[@]}" tinyconfig >>"$log" 2>&1
scripts/kconfig/merge_config.sh -m .config "$here/lull.config" >>"$log" 2>&1
"${MAKE[@]}" olddefconfig >>"$log" 2>&1

# Every option of the fragment must have survived Kconfig's dependency resolution.
bad=0
while IFS= read -r line; do
    if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
        if ! grep -qxF "$line" .config; then
            echo "linux: config: wanted '$line', got '$(grep -E "^(# )?${BASH_REMATCH[1]}[= ]" .config || echo unset)'" >&2
            bad=1
        fi
    elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
        if grep -qE "^${BASH_REMATCH[1]}=" .config; then
            echo "linux: config: wanted '$line', got '$(grep -E "^${BASH_REMATCH[1]}=" .config)'" >&2
            bad=1
        fi
    fi
done <"$here/lull.config"
[ $bad -eq 0 ] || { echo "linux: config fragment not honoured" >&2; exit 1; }
phase "config ok ($(grep -c '=y$' .config) options =y)"

phase "make -j$(nproc) bzImage (vmlinux + bzImage); progress every 100 lines, full log in $log"
"${MAKE[@]}" bzImage 2>&1 | tee -a "$log" | awk '
    /error:|Error [0-9]/ { print "linux:   ! " $0; fflush(); next }
    { n++ }
    n % 100 == 0 { printf "linux:   make: %5d lines, %s\n", n, $0; fflush() }
    END { printf "linux:   make: %d lines\n", n }'

"$here/check-insns.sh" kernel/lull_workload.o
# The disk path (block layer, virtio-mmio, virtio-blk, ext4, jbd2) is Linux's own code: its hits
# are reported (kept as insns-disk.txt), not enforced, since BUG's ud2 and alternatives'
# replacement code are in every such object but unreachable here.
"$here/check-insns.sh" block/*.o drivers/virtio/*.o drivers/block/*.o fs/ext4/*.o fs/jbd2/*.o \
    2>"$work/insns-disk.txt" || true
phase "disk path: $(wc -l <"$work/insns-disk.txt") forbidden-instruction hits, by mnemonic:" \
    "$(sed -nE 's/.*forbidden instruction: ([^ ]+).*/\1/p' "$work/insns-disk.txt" | sort | uniq -c | tr -s ' \n' ' ')"
readelf -n vmlinux | grep -Eq 'Xen.*(0x00000012|PHYS32_ENTRY)' \
    || { echo "linux: vmlinux has no PVH note (XEN_ELFNOTE_PHYS32_ENTRY)" >&2; exit 1; }
phase "vmlinux $(stat -c %s vmlinux) bytes (PVH note ok), bzImage $(stat -c %s arch/x86/boot/bzImage) bytes"

phase "building initramfs from $BUSYBOX"
if readelf -l "$BUSYBOX" | grep -q INTERP; then
    echo "linux: $BUSYBOX is not statically linked" >&2
    exit 1
fi
gcc -O2 -o "$work/gen_init_cpio" usr/gen_init_cpio.c
{
    echo "dir /dev 0755 0 0"
    echo "nod /dev/console 0600 0 0 c 5 1"
    echo "nod /dev/null 0666 0 0 c 1 3"
    echo "nod /dev/ttyS0 0660 0 0 c 4 64"
    for d in /proc /sys /bin /etc /root /tmp /mnt; do echo "dir $d 0755 0 0"; done
    echo "slink /sbin bin 0777 0 0"
    echo "file /bin/busybox $BUSYBOX 0755 0 0"
    "$BUSYBOX" --list | sort | grep -vx busybox | while read -r applet; do
        echo "slink /bin/$applet busybox 0777 0 0"
    done
    echo "file /init $here/init 0755 0 0"
} >"$work/initramfs.list"
mkdir "$work/out"
"$work/gen_init_cpio" -t 0 "$work/initramfs.list" >"$work/out/initramfs.cpio"
gzip -9 -n -c "$work/out/initramfs.cpio" >"$work/out/initramfs.cpio.gz"
phase "initramfs.cpio.gz $(stat -c %s "$work/out/initramfs.cpio.gz") bytes," \
    "initramfs.cpio $(stat -c %s "$work/out/initramfs.cpio") bytes (uncompressed: no inflate at CPL0)"

cp vmlinux "$work/out/vmlinux"
cp arch/x86/boot/bzImage "$work/out/bzImage"
cp .config "$work/out/config"
cp "$work/insns-disk.txt" "$work/out/insns-disk.txt"
echo "$CMDLINE" >"$work/out/cmdline"
echo "$CMDLINE_PVM" >"$work/out/cmdline.pvm"
gzip -9 -n -c "$log" >"$work/out/build.log.gz"

# Atomic publish: rename(2) of a complete directory.
cache_publish "$work/out"
phase "done: $CACHE_DIR"
ls -l "$CACHE_DIR" | sed 's/^/linux:   /'
cd /
phase "removing the work dir"
rm -rf "$work"
