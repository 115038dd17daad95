#!/usr/bin/env bash
# build.sh OUT_LINK : build every test guest (src/*.c) into the kit's content-addressed cache
# (../lib/cache.sh) and point OUT_LINK at it.
#
#   cache dir = ${LULL_CACHE:-$HOME/.cache/lull}/guests/<sha256 of the manifest of every input
#               file, this script, the instruction check and its list, the cache helper, and
#               gcc/ld/objcopy versions>
#   outputs   = <name>.elf (ELF64, 32-bit PVH code at 1 MiB), <name>.map, <name>.dis, inputs
#
# A cache hit skips the build. A miss builds in a temp dir next to the cache dir and renames
# it into place, so a concurrent or interrupted build never leaves a half-filled cache entry.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out_link=${1:?usage: build.sh OUT_LINK (e.g. target/kit/guests)}
case $out_link in /*) ;; *) out_link=$PWD/$out_link ;; esac # absolute (we cd below), not resolved

die() { echo "guests: error: $*" >&2; exit 1; }

for tool in gcc ld objcopy objdump readelf nm sha256sum; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install gcc binutils)"
done

cd "$here"
source ../lib/cache.sh
mapfile -t inputs < <(find lib src -type f \( -name '*.c' -o -name '*.h' -o -name '*.S' -o -name '*.ld' \) | LC_ALL=C sort)
inputs+=(build.sh check-insns.sh forbidden-insns.txt ../lib/cache.sh)
mapfile -t guests < <(find src -maxdepth 1 -name '*.c' | LC_ALL=C sort)
[ ${#guests[@]} -gt 0 ] || die "no guests in $here/src"

cache_open guests "$out_link" "$(
    cache_files "${inputs[@]}"
    printf 'gcc %s\nld %s\nobjcopy %s\n' "$(gcc --version | head -n1)" \
        "$(ld --version | head -n1)" "$(objcopy --version | head -n1)"
)"
cache_lookup && exit 0

tmp=$(cache_workdir)
trap 'rm -rf "$tmp"' EXIT

CFLAGS=(-m32 -march=i686 -O2 -Wall -Wextra -Wno-unused-parameter -Werror -std=gnu11
    -mgeneral-regs-only -mno-red-zone -ffreestanding -fno-builtin -fno-pic -fno-pie
    -fno-stack-protector -nostdlib -fno-asynchronous-unwind-tables -fno-unwind-tables
    -fcf-protection=none -fno-tree-loop-distribute-patterns -fno-common
    -ffunction-sections -I"$here/lib")

mkdir -p "$tmp/obj"
lib_objs=()
for src in lib/*.c lib/*.S; do
    obj=$tmp/obj/$(basename "$src").o
    gcc "${CFLAGS[@]}" -c "$src" -o "$obj" || die "compiling $src failed"
    lib_objs+=("$obj")
done

n=${#guests[@]}
i=0
for src in "${guests[@]}"; do
    i=$((i + 1))
    name=$(basename "$src" .c)
    echo "guests: [$i/$n] $name"
    gcc "${CFLAGS[@]}" -DGUEST_NAME="\"$name\"" -c "$src" -o "$tmp/obj/$name.o" ||
        die "compiling $src failed"
    ld -m elf_i386 -nostdlib --gc-sections -T lib/linker.ld -Map "$tmp/$name.map" \
        -o "$tmp/obj/$name.elf32" "$tmp/obj/$name.o" "${lib_objs[@]}" ||
        die "linking $name failed"
    objcopy -O elf64-x86-64 "$tmp/obj/$name.elf32" "$tmp/$name.elf" ||
        die "objcopy to ELF64 failed for $name"
    # Shape checks: ELF64, entry >= 1 MiB, a PT_NOTE carrying the PVH note.
    readelf -h "$tmp/$name.elf" | grep -q 'Class: *ELF64' || die "$name.elf is not ELF64"
    entry=$(readelf -h "$tmp/$name.elf" | awk '/Entry point/ { print $4 }')
    [ $((entry)) -ge $((0x100000)) ] || die "$name.elf entry $entry is below 1 MiB"
    readelf -l "$tmp/$name.elf" | grep -q NOTE || die "$name.elf has no PT_NOTE"
    readelf -n "$tmp/$name.elf" | grep -q 'Xen' || die "$name.elf has no Xen PVH note"
    objdump -d -w -m i386 "$tmp/obj/$name.elf32" >"$tmp/$name.dis"
    "$here/check-insns.sh" "$tmp/$name.elf" ||
        die "$name uses instructions our hosts cannot run at CPL0 (see forbidden-insns.txt)"
done
rm -rf "$tmp/obj"
cache_publish "$tmp"
trap - EXIT
