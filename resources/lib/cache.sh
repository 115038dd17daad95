# shellcheck shell=bash
# cache.sh - the content-addressed cache of the guest kit, sourced by the kit's build scripts
# (resources/guests/build.sh, resources/guests/multiboot/build.sh, resources/linux/build.sh).
#
# A build names everything its output depends on in a *manifest*, one line each:
#     file <path> <sha256 of the file's content>   every input file, this helper included
#     <tool or package> <version>                  compilers, Debian packages, architecture
# The manifest's sha256 is the build's *key*. Its output is one directory,
#     ${LULL_CACHE:-$HOME/.cache/lull}/<kind>/<key>/      (with the manifest in it as `inputs`)
# and the script's OUT_LINK (e.g. target/kit/guests) becomes a symlink to it. Change any input
# and the key changes: the next run builds a new entry (old ones stay until deleted by hand).
#
#   cache_open KIND OUT_LINK MANIFEST   compute the key; sets CACHE_DIR, the entry
#   cache_lookup                        hit: point OUT_LINK at the entry, return 0. Miss: take
#                                       the key's lock (one build per key at a time; a second
#                                       caller waits, then finds the entry) and return 1
#   cache_workdir                       print a fresh directory next to the entry to build in
#   cache_publish DIR                   move the complete DIR into place as the entry, link
#
# Readers never see a half-built entry or no OUT_LINK: a build fills a temp directory and
# rename(2)s it into place; OUT_LINK is replaced by renaming a new symlink over it.
# LULL_CACHE_CHECK=1 makes cache_lookup only report and exit: "<kind>: cached DIR" (status 0)
# or "<kind>: would build DIR" and the manifest (status 3), e.g. to learn whether `make kit`
# would rebuild the kernel.

# The manifest lines of input FILEs (paths as given, relative to the current directory).
cache_files() {
    local f
    for f in "$@"; do
        printf 'file %s %s\n' "$f" "$(sha256sum <"$f" | cut -d' ' -f1)"
    done
}

cache_die() {
    echo "$CACHE_KIND: error: $*" >&2
    exit 1
}

# cache_open KIND OUT_LINK MANIFEST; a relative OUT_LINK is taken from the current directory.
cache_open() {
    CACHE_KIND=$1
    case $2 in
    /*) CACHE_OUT_LINK=$2 ;;
    *) CACHE_OUT_LINK=$PWD/$2 ;;
    esac
    CACHE_MANIFEST=$3
    CACHE_ROOT=${LULL_CACHE:-$HOME/.cache/lull}/$CACHE_KIND
    CACHE_KEY=$(printf '%s\n' "$CACHE_MANIFEST" | sha256sum | cut -d' ' -f1)
    CACHE_DIR=$CACHE_ROOT/$CACHE_KEY
}

# Points OUT_LINK at the entry; replaces an old link atomically.
cache_link() {
    if [ -d "$CACHE_OUT_LINK" ] && [ ! -L "$CACHE_OUT_LINK" ]; then
        cache_die "$CACHE_OUT_LINK is a real directory; remove it (it should be a symlink)"
    fi
    mkdir -p "$(dirname "$CACHE_OUT_LINK")"
    ln -sfn "$CACHE_DIR" "$CACHE_OUT_LINK.tmp.$$"
    mv -T "$CACHE_OUT_LINK.tmp.$$" "$CACHE_OUT_LINK"
}

cache_lookup() {
    if [ -n "${LULL_CACHE_CHECK:-}" ]; then
        if [ -d "$CACHE_DIR" ]; then
            echo "$CACHE_KIND: cached $CACHE_DIR"
            exit 0
        fi
        echo "$CACHE_KIND: would build $CACHE_DIR"
        printf '%s\n' "$CACHE_MANIFEST" | sed "s/^/$CACHE_KIND:   input: /"
        exit 3
    fi
    if [ -d "$CACHE_DIR" ]; then
        echo "$CACHE_KIND: cached $CACHE_DIR"
        cache_link
        return 0
    fi
    mkdir -p "$CACHE_ROOT"
    # Held until the script exits (the descriptor is not closed before).
    exec {CACHE_LOCK_FD}>"$CACHE_ROOT/.lock-$CACHE_KEY"
    if ! flock -n "$CACHE_LOCK_FD"; then
        echo "$CACHE_KIND: another build of $CACHE_KEY is running, waiting"
        flock "$CACHE_LOCK_FD"
    fi
    if [ -d "$CACHE_DIR" ]; then
        echo "$CACHE_KIND: cached $CACHE_DIR (built by the other run)"
        cache_link
        return 0
    fi
    return 1
}

cache_workdir() {
    mktemp -d "$CACHE_ROOT/work.$CACHE_KEY.XXXXXX"
}

cache_publish() {
    local dir=$1
    printf '%s\n' "$CACHE_MANIFEST" >"$dir/inputs"
    chmod 755 "$dir"
    mv -T "$dir" "$CACHE_DIR" 2>/dev/null || cache_die "cannot move $dir to $CACHE_DIR"
    rm -f "$CACHE_ROOT/.lock-$CACHE_KEY"
    echo "$CACHE_KIND: built $CACHE_DIR"
    cache_link
}
