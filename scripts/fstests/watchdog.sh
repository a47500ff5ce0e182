#!/usr/bin/env bash
# The fstests run's watchdog (started by scripts/fstests/inside.sh; tested by
# crates/fstests/tests/watchdog.rs): no test may hold the run. A test still running after
# WATCHDOG_LIMIT seconds is
#  1. recorded: "TEST timed out after N s" appended to WATCHDOG_RECORD (the summary counts
#     it failed);
#  2. killed with everything it started (SIGKILL, children first);
#  3. cut off from the file systems it used: for every mount point of WATCHDOG_MOUNTS, the
#     FUSE connection is aborted (its requests fail at once, so a process the kill left
#     waiting on one goes too), the daemon serving it (the pid file in WATCHDOG_PIDS that
#     names that mount point) is killed, and the mount is detached. A daemon still busy with
#     the killed test's calls (an fallocate of gigabytes, three million appends queued) would
#     otherwise make the next `mount` of its image wait, and the run stall behind it.
# The suite's `check` sees the test fail (exit 137), mounts TEST_DEV again for the next test
# and formats SCRATCH_DEV as a test asks.
#
# Environment:
#   WATCHDOG_LIMIT     seconds a test may run
#   WATCHDOG_MATCH     extended regex matched (pgrep -f) against a test's command line
#   WATCHDOG_NS_PID    only processes in this process's mount namespace (runs side by side)
#   WATCHDOG_MOUNTS    mount points to cut off after a timeout, space-separated
#   WATCHDOG_PIDS      the cairn runtime directory holding the daemons' pid files
#   WATCHDOG_RECORD    the file the timeouts are appended to
#   WATCHDOG_INTERVAL  seconds between looks (default 20)
#   WATCHDOG_SLOW      tests given a multiple of the limit, space-separated TEST=N
#                      (`generic/748=3`): tests slow on every target, ext4 included,
#                      which need time, not a fix (docs/CONFORMANCE.md)
#
# Nothing here may end the loop: no `set -e` (a test that ends between two looks makes a
# `ps` fail — under `set -e` that silently ended the old watchdog, and generic/069 then ran
# 40 minutes in mode journal with nobody to stop it).
set -u

# kill_tree PID: SIGKILL to PID and everything under it, children first (a parent killed
# first lets its children be re-parented out of reach).
kill_tree() {
    local c
    for c in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$c"; done
    kill -KILL "$1" 2>/dev/null
}

# alive PID...: whether any of them still runs (a zombie does not).
alive() {
    local p s
    for p in "$@"; do
        s=$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) || continue
        [ -n "$s" ] && [ "$s" != Z ] && return 0
    done
    return 1
}

# descendants PID: PID and every process under it.
descendants() {
    local c
    echo "$1"
    for c in $(pgrep -P "$1" 2>/dev/null); do descendants "$c"; done
}

# cut_off MOUNTPOINT: abort its FUSE connection, kill its daemon, detach it.
cut_off() {
    local m=$1 dev f pid
    # The connection's number is the mount's minor device number (fusectl).
    dev=$(awk -v m="$m" '$5 == m { print $3 }' /proc/self/mountinfo | tail -1)
    if [ -n "$dev" ] && [ -w "/sys/fs/fuse/connections/${dev#*:}/abort" ]; then
        echo 1 >"/sys/fs/fuse/connections/${dev#*:}/abort" 2>/dev/null
    fi
    for f in "$WATCHDOG_PIDS"/*.pid; do
        [ -e "$f" ] || continue
        # pid, image, mount point, device number (crates/cli/src/runtime.rs)
        [ "$(sed -n 3p "$f" 2>/dev/null)" = "$m" ] || continue
        pid=$(sed -n 1p "$f" 2>/dev/null)
        [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    done
    # mountinfo, not mountpoint(1): a stat of a dead FUSE mount fails (ENOTCONN).
    while awk -v m="$m" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; do
        umount -l "$m" 2>/dev/null || break
    done
}

# limit_of TEST: its limit in seconds, WATCHDOG_LIMIT times its WATCHDOG_SLOW multiple.
limit_of() {
    local e n=1
    for e in ${WATCHDOG_SLOW:-}; do
        [ "${e%%=*}" = "$1" ] && n=${e#*=}
    done
    case $n in '' | *[!0-9]*) n=1 ;; esac
    echo $((WATCHDOG_LIMIT * n))
}

watchdog() {
    local interval=${WATCHDOG_INTERVAL:-20} pid age t m pids
    while sleep "$interval"; do
        # The oldest matching process: the test script itself (its children do not match).
        pid=$(pgrep -o --ns "$WATCHDOG_NS_PID" --nslist mnt -f "$WATCHDOG_MATCH" 2>/dev/null)
        [ -n "$pid" ] || continue
        age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')
        [ -n "$age" ] && [ "$age" -gt "$WATCHDOG_LIMIT" ] || continue
        t=$(ps -o args= -p "$pid" 2>/dev/null | sed 's|.*/tests/||')
        [ -n "$t" ] || continue  # it ended just now
        [ "$age" -gt "$(limit_of "$t")" ] || continue
        echo "$t timed out after $age s" >>"$WATCHDOG_RECORD"
        mapfile -t pids < <(descendants "$pid")
        kill_tree "$pid"
        # A process waiting on a FUSE request dies with the kill; one the kill left (a
        # request the kernel waits for uninterruptibly) goes once its connection is
        # aborted below.
        for m in $WATCHDOG_MOUNTS; do cut_off "$m"; done
        for _ in $(seq 50); do
            alive "${pids[@]}" || break
            sleep 0.2
        done
        if alive "${pids[@]}"; then
            echo "$t: processes still alive after the kill: $(echo "${pids[@]}")" >>"$WATCHDOG_RECORD"
        fi
    done
}

watchdog
