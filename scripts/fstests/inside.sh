#!/usr/bin/env bash
# The part of scripts/fstests/run.sh that runs inside a private mount namespace: the mount
# helpers go into an overlay over /sbin that vanishes with the namespace, every mount the
# suite makes stays in here, and the exit trap takes them all down (a cairn daemon serving
# a mount nobody can reach any more would otherwise live on).
# Arguments: what to give `check` (-g GROUP or test names). Environment: from run.sh.
set -euo pipefail

sbin=$(readlink -f /sbin)
mkdir -p "$work/ov" "$work/test" "$work/scratch" "$work/bin" "$work/run"
mount -t tmpfs -o mode=0755 cairn-fstests-sbin "$work/ov"
mkdir "$work/ov/up" "$work/ov/work"
mount -t overlay overlay -o "lowerdir=$sbin,upperdir=$work/ov/up,workdir=$work/ov/work" "$sbin"
export CAIRN_RUNTIME_DIR=$work/run

check_pid=
watchdog_pid=
finish() {
    trap - EXIT INT TERM HUP
    set +e  # every step runs, whatever the one before it did
    # The suite first, if it is still running (we were signalled): no test may mount again.
    [ -n "$watchdog_pid" ] && kill "$watchdog_pid" 2>/dev/null
    [ -n "$check_pid" ] && kill_tree "$check_pid"
    # Unmount what the suite left mounted, waiting for each daemon's final flush, then
    # anything a daemon still serves (a test may have lazily detached a busy mount).
    local m pid
    for m in "$work/scratch" "$work/test"; do
        while mountpoint -q "$m" 2>/dev/null; do
            if [ "$kind" = ext4 ]; then umount "$m" || umount -l "$m"
            # Bounded: a daemon still busy with a killed test's call must not hold the
            # run (run.sh stops the daemons after that).
            else timeout 60 "$CAIRN_BIN" umount "$m" || umount -l "$m"; fi
        done
    done
    for m in "$work"/umbrella/*/fast "$work"/umbrella/*/slow; do
        mountpoint -q "$m" 2>/dev/null && umount -l "$m"
    done
    for f in "$work"/run/*.pid; do
        [ -e "$f" ] || continue
        pid=$(head -1 "$f")
        [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
    done
    umount -l "$sbin" 2>/dev/null || true
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The helpers mount(8) runs for `-t fuse.cairn` and umount(8) for a fuse.cairn mount
# (`cairn install-helper --link` points them at the binary under test).
case $kind in
    cairn)
        "$CAIRN_BIN" install-helper --link --prefix "$sbin" >/dev/null
        # A log on a device of its own (run.sh: a registry variant) is made afresh with
        # its file system: a new image must not meet an old image's log.
        cat >"$work/bin/mkfs.cairn" <<EOF
#!/bin/sh
# fstests' FUSE_MKFS_PROG for mode $MODE: [--size BYTES] [--block-size BYTES] DEVICE
set -e
for dev; do :; done
case "\$dev" in
    "$test_dev") log="$test_log" ;;
    "$scratch_dev") log="$scratch_log" ;;
    *) log= ;;
esac
"$CAIRN_BIN" mkfs -F --format $format "\$@"
[ -z "\$log" ] || "$CAIRN_BIN" wal mkfs -F "\$log" >/dev/null
EOF
        cat >"$work/bin/fsck.cairn" <<EOF
#!/bin/sh
# fstests' FUSE_FSCK_PROG: check only; nonzero when anything is found.
exec "$CAIRN_BIN" fsck "\$@"
EOF
        chmod +x "$work/bin/mkfs.cairn" "$work/bin/fsck.cairn"
        "$work/bin/mkfs.cairn" "$test_dev" >/dev/null
        cat >"$work/local.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.cairn
export TEST_DEV=$test_dev
export TEST_DIR=$work/test
export SCRATCH_DEV=$scratch_dev
export SCRATCH_MNT=$work/scratch
# No dev,suid here: mount(8) drops them (its defaults) before it runs the helper, which
# then mounts dev,suid as a disk file system is (generic/184 writes to a device node).
export MOUNT_OPTIONS="-o $mount_options${scratch_log:+,log=dev:$scratch_log}"
export TEST_FS_MOUNT_OPTS="-o $mount_options${test_log:+,log=dev:$test_log}"
export FUSE_MKFS_PROG=$work/bin/mkfs.cairn
export FUSE_FSCK_PROG=$work/bin/fsck.cairn
EOF
        ;;
    umbrella)
        # shellcheck source=scripts/fstests/umbrella.sh
        . "$(dirname "${BASH_SOURCE[0]}")/umbrella.sh"
        umbrella_setup
        ;;
    ext4)
        mkfs.ext4 -q -F "$test_dev"
        cat >"$work/local.config" <<EOF
export FSTYP=ext4
export TEST_DEV=$test_dev
export TEST_DIR=$work/test
export SCRATCH_DEV=$scratch_dev
export SCRATCH_MNT=$work/scratch
EOF
        ;;
esac
cat >>"$work/local.config" <<EOF
export RESULT_BASE=$RESULTS/raw
EOF
# The times a cairn mount keeps (the umbrella's too: the adapter clamps for every file
# system), from the registry, for the suite's timestamp-range tests (patch 0003).
if [ "$kind" != ext4 ]; then
    range=$("$CAIRN_BIN" modes --json | sed -n '1s/.*"time_range":\[\(-\{0,1\}[0-9]*\),\(-\{0,1\}[0-9]*\)\].*/\1 \2/p')
    [ -n "$range" ] || { echo "fstests: cairn modes --json gives no time_range" >&2; exit 1; }
    echo "export FUSE_TIMESTAMP_RANGE=\"$range\"" >>"$work/local.config"
fi
cp "$work/local.config" "$RESULTS/local.config"

# No test may hang the run: scripts/fstests/watchdog.sh kills one still running after
# FSTESTS_TEST_TIMEOUT seconds, records it in timeouts.txt (reported failed) and cuts off the
# test and scratch mounts it used; `check` goes on with the next test. Tests that need
# more time, not a fix, get a multiple of the limit: FSTESTS_SLOW_TESTS (TEST=N each),
# which run.sh decides.
kill_tree() {
    local c
    for c in $(pgrep -P "$1"); do kill_tree "$c"; done
    kill -9 "$1" 2>/dev/null || true
}
WATCHDOG_LIMIT=${FSTESTS_TEST_TIMEOUT:-1800} \
    WATCHDOG_MATCH="^/bin/bash $src/tests/[a-z]+/[0-9]+\$" \
    WATCHDOG_NS_PID=$$ \
    WATCHDOG_MOUNTS="$work/scratch $work/test" \
    WATCHDOG_PIDS=$work/run \
    WATCHDOG_RECORD=$RESULTS/timeouts.txt \
    WATCHDOG_SLOW="${FSTESTS_SLOW_TESTS:-}" \
    bash "$(dirname "${BASH_SOURCE[0]}")/watchdog.sh" &
watchdog_pid=$!

cd "$src"
rc=0
# In the background and waited for, so a signal runs the trap at once.
HOST_OPTIONS=$work/local.config ./check -R xunit -E "$RESULTS/exclude.list" "$@" \
    > >(tee "$RESULTS/check.out") 2>&1 &
check_pid=$!
wait "$check_pid" || rc=$?
check_pid=
exit "$rc"
