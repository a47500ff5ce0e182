# Sourced by scripts/fstests/*.sh: finding, patching and building the fstests archive.
#
# The archive lives outside the project (CI reaches package registries only, never source
# hosts): FSTESTS_KIT names it, else the first of ../shared/kits beside the checkout (or
# beside its parent, for a worktree) and /work/shared/kits that holds it.

FSTESTS_ARCHIVE=fstests-63a29724.tar.gz

find_kit() {
    local root d
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    if [ -n "${FSTESTS_KIT:-}" ]; then
        [ -f "$FSTESTS_KIT" ] || { echo "fstests: FSTESTS_KIT=$FSTESTS_KIT is not a file" >&2; return 1; }
        echo "$FSTESTS_KIT"
        return
    fi
    for d in "$root/../shared/kits" "$root/../../shared/kits" /work/shared/kits; do
        if [ -f "$d/$FSTESTS_ARCHIVE" ]; then
            readlink -f "$d/$FSTESTS_ARCHIVE"
            return
        fi
    done
    echo "fstests: $FSTESTS_ARCHIVE not found (set FSTESTS_KIT=/path/to/it)" >&2
    return 1
}

# build_suite CACHE: prints the directory of a built, patched suite. Built once per archive
# and patch set (the directory is named after their hash), under a lock so parallel runs
# share one build.
build_suite() {
    local cache=$1 kit here key dir tmp
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    kit=$(find_kit) || return 1
    key=$(cat "$kit" "$here"/patches/*.patch | sha256sum | cut -c1-12)
    dir=$cache/fstests-$key
    mkdir -p "$cache"
    (
        flock 9
        if [ -f "$dir/.built" ]; then
            exit 0
        fi
        echo "fstests: building the suite from $kit into $dir" >&2
        tmp=$(mktemp -d "$cache/.build.XXXXXX")
        tar xzf "$kit" -C "$tmp"
        for p in "$here"/patches/*.patch; do
            echo "fstests: applying $(basename "$p")" >&2
            patch -s -p1 -d "$tmp" <"$p" >&2
        done
        make -s -C "$tmp" -j"$(nproc)" >"$tmp/.build.log" 2>&1 || {
            tail -20 "$tmp/.build.log" >&2
            echo "fstests: building the suite failed (log: $tmp/.build.log)" >&2
            exit 1
        }
        touch "$tmp/.built"
        rm -rf "$dir"
        mv "$tmp" "$dir"
    ) 9>"$cache/.lock" || return 1
    # Readable and searchable by all (mktemp -d makes it 0700): tests run the suite's own
    # programs as the fsgqa users (generic/317: nsexec ... src/lstat64 as a regular user,
    # which failed with "execvp: Permission denied").
    chmod 0755 "$dir"
    echo "$dir"
}
