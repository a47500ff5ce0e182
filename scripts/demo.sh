#!/usr/bin/env bash
# `make demo`: make a cairn image, mount it in each metadata-update mode, run a short
# metadata-heavy workload, print ops/s and device writes/flushes per operation, unmount, fsck.
# Every command is one a person would type; `make demo` has already built the release binaries
# (`cargo build --release`), wherever cargo put them: this script asks cargo where that is, so
# CARGO_TARGET_DIR or a target-dir in cargo's config works as well as ./target.
# Everything the demo makes lives in a directory of its own (mktemp, under CAIRN_DEMO_DIR,
# default /var/tmp) that is removed when the script exits, on failure and Ctrl-C too.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
FILES=${DEMO_FILES:-10000}
SMALL=${DEMO_SMALL_FILES:-2000}
# Benchmark and daemon share one CPU, as in docs/bench/how-to-run.md (set DEMO_CPU= to unpin).
CPU=${DEMO_CPU-0}
pin() { if [ -n "$CPU" ]; then taskset -c "$CPU" "$@"; else "$@"; fi; }

if [ "$(id -u)" -ne 0 ]; then
    echo "demo: run as root (mounting through /dev/fuse and dropping caches)"; exit 1
fi

# cargo's target directory, from `cargo metadata` (compact JSON: "target_directory":"PATH").
# Read with sed so jq is not needed; a path JSON had to escape (a quote or a backslash in it)
# does not match and is reported instead of misread.
target_dir() {
    "$CARGO" metadata --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"\\]*\)".*/\1/p'
}
if [ -z "${CAIRN:-}" ] || [ -z "${BENCH:-}" ]; then
    td=$(target_dir) || td=
    if [ -z "$td" ]; then
        echo "demo: cannot read cargo's target directory from '$CARGO metadata'; set CAIRN and BENCH to the binaries"
        exit 1
    fi
    CAIRN=${CAIRN:-$td/release/cairn}
    BENCH=${BENCH:-$td/release/cairn-bench}
fi
for b in "$CAIRN" "$BENCH"; do
    [ -x "$b" ] || { echo "demo: $b missing: run 'make build' first"; exit 1; }
done

# The modes this build knows; first word of each line of `cairn modes`.
modes=$("$CAIRN" modes 2>/dev/null | awk 'NF && $1 ~ /^[a-z0-9_-]+:?$/ && tolower($1) != "mode" { sub(":$", "", $1); print $1 }' || true)
[ -n "$modes" ] || modes="sync async"

WORK=$(mktemp -d "${CAIRN_DEMO_DIR:-/var/tmp}/cairn-demo.XXXXXX")
summary=$WORK/summary.txt
status=0
mnt=
cleanup() {
    if [ -n "$mnt" ] && mountpoint -q "$mnt"; then
        "$CAIRN" umount "$mnt" || umount -l "$mnt" || true
    fi
    # --one-file-system: if a mount is somehow still inside, its files are not deleted; the
    # directory is then left in place and named.
    rm -rf --one-file-system "$WORK" 2>/dev/null || true
    if [ -e "$WORK" ]; then echo "demo: could not remove $WORK (still mounted inside?)"; fi
}
trap cleanup EXIT
# Ctrl-C and kill end the script through `exit`, so the EXIT trap cleans up.
trap 'exit 130' INT
trap 'exit 143' TERM

echo "cairn demo: modes: $(echo $modes); workload: create+unlink of $FILES files, then $SMALL files of 1 KiB created, read back, deleted"
echo "cairn demo: working in $WORK (removed at the end)"
for mode in $modes; do
    img=$WORK/demo-$mode.img
    mnt=$WORK/mnt-$mode
    mkdir -p "$mnt"
    echo
    echo "== mode $mode"
    # The mode's on-disk format ("type" in `cairn modes --json`): lfs is a format of its own.
    fmt=$("$CAIRN" modes --json 2>/dev/null | grep "\"mode\":\"$mode\"" |
        sed -n 's/.*"type":"\([a-z0-9_-]*\)".*/\1/p' || true)
    fmt=${fmt:-ffs}
    echo "\$ cairn mkfs $img --size 1G --format $fmt"
    "$CAIRN" mkfs "$img" --size 1G --format "$fmt"
    echo "\$ cairn mount -o mode=$mode $img $mnt"
    pin "$CAIRN" mount -o "mode=$mode" "$img" "$mnt"
    pin "$BENCH" workload create-unlink --dir "$mnt/demo" --files "$FILES" --cairn-stats "$mnt" --cairn "$CAIRN" --label "$mode" | tee -a "$summary"
    pin "$BENCH" workload smallfile --dir "$mnt/demo" --small-files "$SMALL" --cairn-stats "$mnt" --cairn "$CAIRN" --drop-caches --label "$mode" | tee -a "$summary"
    echo "\$ cairn stats $mnt   # (device and FUSE totals; the full list has every counter)"
    "$CAIRN" stats "$mnt" | grep -E '^(fs\.device\.(reads|writes|flushes)|fs\.cache\.(hits|misses)|fuse\.total) ' || true
    echo "\$ cairn umount $mnt"
    "$CAIRN" umount "$mnt"
    mnt=
    echo "\$ cairn fsck $img"
    if ! "$CAIRN" fsck "$img"; then
        echo "demo: fsck of the $mode image failed (its findings are above)"; status=1
    fi
    rm -f "$img"
done
echo
echo "== summary (rates per second; device writes/flushes and FUSE requests per operation)"
cat "$summary"
echo
echo "cairn demo: done. The papers' benchmarks beside ext4, ext2, xfs, fuse2fs and mergerfs: cairn bench run --suite paper (docs/BENCHMARKS.md)."
exit $status
