#!/usr/bin/env bash
# Build the smallest libvirt that drives lull as Cloud Hypervisor: virtchd (the ch driver),
# virsh and virtlogd, from Debian's libvirt source package (bookworm-backports, 11.x), every
# other driver, storage backend, security driver, docs and tests off.
#
# Usage: resources/libvirt/build.sh OUT_LINK
#
# Output (a cache dir, OUT_LINK becomes a symlink to it):
#   ${LULL_CACHE:-$HOME/.cache/lull}/libvirt/<sha256 of all inputs>/
#     bin/virsh  sbin/virtchd  sbin/virtlogd  lib/...  (the install prefix: rpath points here)
#     etc/               the installed sysconfdir (libvirt.conf, virtchd.conf, ...): a template
#                        the test harness copies into each test's own directory
#     inputs             what the hash covers
#     build.log.gz       the full build log
# A cache hit does nothing but update OUT_LINK.
#
# State directories. libvirt run as root (virtchd's "privileged" mode, the only one in which
# the ch driver uses the system paths) takes its config, state and run directories from the
# build: sysconfdir, localstatedir and runstatedir. They are built as
#   /run/lull-libvirt/{etc,var,run}
# a directory that exists only as a mount point: tests/src/libvirt.rs starts each virtchd in
# a mount namespace of its own with a directory of the test bind-mounted there, so that tests
# running in parallel never share a domain, a socket or a pid file, and the host's own
# /etc/libvirt, /var/lib/libvirt and /run/libvirt are never touched. (Short paths on purpose:
# the ch driver puts each VM's API socket in runstatedir, and a Unix socket's path has at
# most 107 bytes.)
#
# Source. The deb-src line for bookworm-backports goes into a private apt list of the build
# (its own sources.list and lists directory, in the work dir): the host's apt sources are not
# changed. The source version is pinned (LIBVIRT_DEB_VERSION, part of the key) so that a cache
# hit needs no network; if the archive has moved on, `apt-get source` fails and says so.
# Debian's mirror may serve the orig tarball without the .dsc and Debian's patch tarball (seen
# on our hosts): the build then uses the upstream tarball apt fetched and checked against the
# archive's Sources index, and says so (Debian's patches are packaging changes: paths,
# AppArmor, systemd units; none touches src/ch/).
#
# Patches: every *.patch here is applied in name order (part of the key). Each says at its top
# which libvirt bug it fixes: ch-daemonized-vmm.patch (the ch driver never ended the VMM it had
# daemonized, on destroy or save, and could never restore), ch-restore-net-queues.patch (a
# restored net with one queue pair got no tap fd).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_LINK" >&2
    exit 2
fi
OUT_LINK=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
start=$SECONDS

phase() { printf 'libvirt: [%3ds] %s\n' $((SECONDS - start)) "$*"; }

LIBVIRT_DEB_VERSION=${LULL_LIBVIRT_DEB_VERSION:-11.3.0-2~bpo12+1}
UPSTREAM_VERSION=${LIBVIRT_DEB_VERSION%%-*}
STATE_ROOT=/run/lull-libvirt
SUITE=bookworm-backports

# Meson: every auto feature off, then what virtchd, virsh and virtlogd need. libnl is not
# optional on Linux in 11.3 (virnetdevbridge.c uses RTM_* from it unconditionally).
MESON_OPTIONS=(
    -Dauto_features=disabled
    -Ddriver_ch=enabled -Ddriver_libvirtd=enabled -Ddriver_remote=enabled
    -Dcurl=enabled -Djson_c=enabled -Dlibnl=enabled
    -Ddocs=disabled -Dtests=disabled -Dexpensive_tests=disabled -Dgit_werror=disabled
    -Dinit_script=none -Drpath=enabled
    -Doptimization=1 -Ddebug=false
    -Dsysconfdir=$STATE_ROOT/etc -Dlocalstatedir=$STATE_ROOT/var -Drunstatedir=$STATE_ROOT/run
)

# The build dependencies, found by trying (`apt-get build-dep libvirt` pulls in ~300 packages
# for the drivers that are off here): meson's required programs (perl, python3, xmllint,
# xsltproc), its required libraries (glib, gnutls, libxml2, libtirpc for XDR) and the ch
# driver's (json-c, curl), libnl, and dpkg-dev for `apt-get source`.
BUILD_DEPS=(build-essential meson ninja-build pkg-config perl python3 libxml2-utils xsltproc
    libglib2.0-dev libgnutls28-dev libxml2-dev libtirpc-dev libjson-c-dev libcurl4-gnutls-dev
    libnl-3-dev libnl-route-3-dev dpkg-dev xz-utils util-linux)
"$repo/resources/ensure-apt.sh" "${BUILD_DEPS[@]}"

PATCHES=()
for f in "$here"/*.patch; do [ -e "$f" ] && PATCHES+=("$(basename "$f")"); done

source "$here/../lib/cache.sh"
inputs() {
    (cd "$here" && cache_files build.sh ../lib/cache.sh "${PATCHES[@]}")
    printf 'source libvirt %s %s\n' "$SUITE" "$LIBVIRT_DEB_VERSION"
    printf 'meson-option %s\n' "${MESON_OPTIONS[@]}"
    # shellcheck disable=SC2016
    dpkg-query -W -f='package ${Package} ${Version}\n' meson libglib2.0-dev libgnutls28-dev \
        libxml2-dev libtirpc-dev libjson-c-dev libcurl4-gnutls-dev libnl-3-dev
    printf 'gcc %s\n' "$(gcc --version | head -n1)"
    printf 'arch %s\n' "$(uname -m)"
}
cache_open libvirt "$OUT_LINK" "$(inputs)"
cache_lookup && exit 0

work=$(cache_workdir)
log=$work/build.log
: >"$log"
on_exit() {
    local rc=$?
    if [ $rc -ne 0 ]; then
        echo "libvirt: FAILED (exit $rc); work dir kept: $work" >&2
        [ -s "$log" ] && { echo "libvirt: last lines of $log:" >&2; tail -n 40 "$log" >&2; }
    fi
}
trap on_exit EXIT

phase "building $CACHE_KEY in $work"
printf '%s\n' "$CACHE_MANIFEST" | sed 's/^/libvirt:   input: /'

phase "fetching Debian's libvirt $LIBVIRT_DEB_VERSION source ($SUITE, private apt lists)"
mkdir -p "$work/apt/lists/partial" "$work/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian $SUITE main" >"$work/apt/sources.list"
APT=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
    -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" -q)
apt-get "${APT[@]}" update >>"$log" 2>&1
(cd "$work/src" && apt-get "${APT[@]}" source "libvirt=$LIBVIRT_DEB_VERSION" >>"$log" 2>&1) || {
    orig=$work/src/libvirt_$UPSTREAM_VERSION.orig.tar.xz
    [ -f "$orig" ] || { echo "libvirt: apt-get source libvirt=$LIBVIRT_DEB_VERSION failed" \
        "(see the log; set LULL_LIBVIRT_DEB_VERSION to what $SUITE has)" >&2; exit 1; }
    phase "the mirror has no .dsc/debian.tar.xz: using the upstream tarball apt checked," \
        "Debian's packaging patches not applied"
    tar -xJf "$orig" -C "$work/src"
}
src=$work/src/libvirt-$UPSTREAM_VERSION
[ -f "$src/meson.build" ] || { echo "libvirt: no $src/meson.build" >&2; exit 1; }
for p in "${PATCHES[@]}"; do
    phase "applying $p"
    patch -d "$src" -p1 -F0 --no-backup-if-mismatch <"$here/$p" >>"$log"
done

prefix=$CACHE_DIR
phase "meson setup (prefix $prefix, state under $STATE_ROOT)"
meson setup "$work/build" "$src" --prefix="$prefix" "${MESON_OPTIONS[@]}" >>"$log" 2>&1
grep -A3 'Cloud-Hypervisor' "$log" | head -1 | grep -q YES \
    || { echo "libvirt: meson did not enable the Cloud Hypervisor driver" >&2; exit 1; }

phase "ninja -j$(nproc); progress every 50 steps, full log in $log"
ninja -C "$work/build" -j"$(nproc)" 2>&1 | tee -a "$log" | awk '
    /error:|FAILED/ { print "libvirt:   ! " $0; fflush(); next }
    /^\[[0-9]+\/[0-9]+\]/ { n++; if (n % 50 == 0) { printf "libvirt:   %s\n", $1; fflush() } }'
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1

phase "installing into a staging dir"
DESTDIR=$work/stage meson install -C "$work/build" --no-rebuild >>"$log" 2>&1
mv -T "$work/stage$prefix" "$work/out"
mv -T "$work/stage$STATE_ROOT/etc" "$work/out/etc"
for f in sbin/virtchd bin/virsh sbin/virtlogd; do
    [ -x "$work/out/$f" ] || { echo "libvirt: $f was not built" >&2; exit 1; }
done
# What the tests do not use: headers, pkg-config files, man pages, locale files.
rm -rf "$work/out/include" "$work/out/share/man" "$work/out/share/locale" \
    "$work/out/lib/"*/pkgconfig
gzip -9 -n -c "$log" >"$work/out/build.log.gz"

cache_publish "$work/out"
phase "done: $CACHE_DIR ($(du -sh "$CACHE_DIR" | cut -f1))"
cd /
rm -rf "$work"
