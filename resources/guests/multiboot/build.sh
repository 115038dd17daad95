#!/usr/bin/env bash
# build.sh OUT_LINK : build the multiboot test images (src/*.c) into a content-addressed cache
# directory and point OUT_LINK at it (the same conventions as ../build.sh).
#
#   cache dir = ${LULL_CACHE:-$HOME/.cache/lull}/guests-multiboot/<sha256 of the manifest of
#               every input, the shared runtime ../lib, this script, the instruction check, the
#               cache helper (../../lib/cache.sh), and tool versions>; paths in the manifest
#               are relative to resources/guests, so every checkout of a commit shares one entry
#   outputs   = <name>.elf (ELF32 i386 with a multiboot v1 header, code at 1 MiB), .map, .dis,
#               inputs
#
# Images are ELF32 executables as QEMU's `-kernel` loads multiboot kernels (no PVH note, which
# QEMU would prefer); they link the shared runtime (../lib) with mb-entry.S and mb-boot.c.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
lib=$(cd "$here/../lib" && pwd)
out_link=${1:?usage: build.sh OUT_LINK (e.g. target/kit/multiboot)}
case $out_link in /*) ;; *) out_link=$PWD/$out_link ;; esac

die() { echo "multiboot: error: $*" >&2; exit 1; }

for tool in gcc ld objdump readelf nm sha256sum od; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install gcc binutils)"
done

cd "$here"
source ../../lib/cache.sh
mapfile -t guests < <(find src -maxdepth 1 -name '*.c' | LC_ALL=C sort)
[ ${#guests[@]} -gt 0 ] || die "no images in $here/src"

cache_open guests-multiboot "$out_link" "$(
    cd ..
    mapfile -t inputs < <(find lib multiboot -type f \( -name '*.c' -o -name '*.h' -o -name '*.S' -o -name '*.ld' \) | LC_ALL=C sort)
    inputs+=(multiboot/build.sh check-insns.sh forbidden-insns.txt ../lib/cache.sh)
    cache_files "${inputs[@]}"
    printf 'gcc %s\nld %s\n' "$(gcc --version | head -n1)" "$(ld --version | head -n1)"
)"
cache_lookup && exit 0

tmp=$(cache_workdir)
trap 'rm -rf "$tmp"' EXIT

CFLAGS=(-m32 -march=i686 -O2 -Wall -Wextra -Wno-unused-parameter -Werror -std=gnu11
    -mgeneral-regs-only -mno-red-zone -ffreestanding -fno-builtin -fno-pic -fno-pie
    -fno-stack-protector -nostdlib -fno-asynchronous-unwind-tables -fno-unwind-tables
    -fcf-protection=none -fno-tree-loop-distribute-patterns -fno-common
    -ffunction-sections -I"$lib" -I"$here")

mkdir -p "$tmp/obj"
objs=()
for src in "$lib"/*.c "$lib"/*.S mb-boot.c mb-entry.S; do
    obj=$tmp/obj/$(basename "$src").o
    gcc "${CFLAGS[@]}" -c "$src" -o "$obj" || die "compiling $src failed"
    objs+=("$obj")
done

# Offset of the first multiboot header magic (4-byte aligned) in the file's first 8 KiB.
header_offset() {
    od -A d -t x4 -w4 -v -N 8192 "$1" | awk '$2 == "1badb002" { print $1; exit }'
}

n=${#guests[@]}
i=0
for src in "${guests[@]}"; do
    i=$((i + 1))
    name=$(basename "$src" .c)
    echo "multiboot: [$i/$n] $name"
    gcc "${CFLAGS[@]}" -DGUEST_NAME="\"$name\"" -c "$src" -o "$tmp/obj/$name.o" ||
        die "compiling $src failed"
    ld -m elf_i386 -nostdlib --gc-sections -T mb-linker.ld -Map "$tmp/$name.map" \
        -o "$tmp/$name.elf" "$tmp/obj/$name.o" "${objs[@]}" || die "linking $name failed"
    readelf -h "$tmp/$name.elf" | grep -q 'Class: *ELF32' || die "$name.elf is not ELF32"
    entry=$(readelf -h "$tmp/$name.elf" | awk '/Entry point/ { print $4 }')
    [ $((entry)) -ge $((0x100000)) ] || die "$name.elf entry $entry is below 1 MiB"
    [ -n "$(header_offset "$tmp/$name.elf")" ] ||
        die "$name.elf has no multiboot header in its first 8 KiB"
    if readelf -n "$tmp/$name.elf" | grep -q Xen; then
        die "$name.elf carries a PVH note: QEMU would not boot it as multiboot"
    fi
    objdump -d -w -m i386 "$tmp/$name.elf" >"$tmp/$name.dis"
    "$here/../check-insns.sh" "$tmp/$name.elf" ||
        die "$name uses instructions our hosts cannot run at CPL0 (see forbidden-insns.txt)"
done
rm -rf "$tmp/obj"
cache_publish "$tmp"
trap - EXIT
