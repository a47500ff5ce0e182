#!/usr/bin/env bash
# `make demo`: make a cairn image, mount it in each metadata-update mode, run a short
# metadata-heavy workload, print ops/s and device writes/flushes per operation, unmount, fsck.
# Every command is one a person would type; `make demo` has already built the release binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

CAIRN=${CAIRN:-$PWD/target/release/cairn}
BENCH=${BENCH:-$PWD/target/release/cairn-bench}
WORK=${CAIRN_DEMO_DIR:-/var/tmp/cairn-demo}
FILES=${DEMO_FILES:-10000}
SMALL=${DEMO_SMALL_FILES:-2000}
# Benchmark and daemon share one CPU, as in docs/BENCHMARKS.md (set DEMO_CPU= to unpin).
CPU=${DEMO_CPU-0}
pin() { if [ -n "$CPU" ]; then taskset -c "$CPU" "$@"; else "$@"; fi; }

if [ "$(id -u)" -ne 0 ]; then
    echo "demo: run as root (mounting through /dev/fuse and dropping caches)"; exit 1
fi
for b in "$CAIRN" "$BENCH"; do
    [ -x "$b" ] || { echo "demo: $b missing: run 'make build' first"; exit 1; }
done

# The modes this build knows; first word of each line of `cairn modes`.
modes=$("$CAIRN" modes 2>/dev/null | awk 'NF && $1 ~ /^[a-z0-9_-]+:?$/ && tolower($1) != "mode" { sub(":$", "", $1); print $1 }' || true)
[ -n "$modes" ] || modes="sync async"

mkdir -p "$WORK"
summary=$(mktemp)
status=0
mnt=
cleanup() {
    if [ -n "$mnt" ] && mountpoint -q "$mnt"; then "$CAIRN" umount "$mnt" || umount -l "$mnt"; fi
    rm -f "$summary"
}
trap cleanup EXIT

echo "cairn demo: modes: $(echo $modes); workload: create+unlink of $FILES files, then $SMALL files of 1 KiB created, read back, deleted"
for mode in $modes; do
    img=$WORK/demo-$mode.img
    mnt=$WORK/mnt-$mode
    rm -f "$img"; mkdir -p "$mnt"
    echo
    echo "== mode $mode"
    echo "\$ cairn mkfs $img --size 1G"
    "$CAIRN" mkfs "$img" --size 1G
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
    if "$CAIRN" fsck "$img"; then rm -f "$img"; else
        echo "demo: fsck of the $mode image failed (image kept: $img)"; status=1
    fi
done
echo
echo "== summary (rates per second; device writes/flushes and FUSE requests per operation)"
cat "$summary"
echo
echo "cairn demo: done. The papers' benchmarks beside ext4, ext2, xfs, fuse2fs and mergerfs: cairn bench run --suite paper (docs/BENCHMARKS.md)."
exit $status
