#!/usr/bin/env bash
# `make fstests`: the file-system community's regression suite (fstests, a.k.a. xfstests)
# on cairn, in one mode, from the archive kept outside the project.
#
#   scripts/fstests/run.sh [MODE=softdep] [GROUP=quick | TESTS="generic/001 generic/002" |
#                          TESTS=@smoke] [FSTESTS_CACHE=...] [FSTESTS_RESULTS=...]
#
# MODE is a mode of `cairn modes`, a variant of `cairn modes --json` (journal-2sync,
# journal-2async, journal-2group: the log on a loop device of its own), `umbrella` (the policy layer over two local branches) or
# `ext4` (the kernel's ext4 on the same loop devices: the reference every table is read
# against). GROUP is an fstests group of the generic tests (quick, auto, rw, ...); TESTS a
# list of tests, or @smoke for scripts/fstests/smoke.list (what CI runs).
#
# Steps, each said as it runs:
#  1. the Debian packages the suite needs (scripts/install-deps.sh);
#  2. the suite unpacked into FSTESTS_CACHE (default /var/cache/cairn-fstests), our patches
#     (scripts/fstests/patches/, see their headers) applied, built once per archive and
#     patch set;
#  3. the users the suite runs things as (fsgqa, fsgqa2, 123456-fsgqa; group fsgqa),
#     created when missing;
#  4. two fresh sparse images on loop devices (TEST_DEV, SCRATCH_DEV: the block-device
#     tests run), TEST_DEV formatted in the mode's format;
#  5. inside a private mount namespace whose /sbin is an overlay (nothing on the machine's
#     /sbin changes): the mount helpers `mount -t fuse.cairn` needs (`cairn install-helper`),
#     local.config, then the suite's `check` with the exclusions of scripts/fstests/exclude;
#  6. a summary: FSTESTS_RESULTS/summary.tsv (test, status, seconds, reason) and
#     summary.txt; the raw results beside them.
# However the run ends (an error, Ctrl-C, kill, a hung-up terminal), every mount is undone,
# the daemons it started are stopped and the loop devices it made are detached; what a run
# killed with SIGKILL left is removed by the next run.
set -euo pipefail

# All of it in one function, which bash reads whole before running: editing this file
# while a run of several hours goes on cannot change what that run does next.
main() {

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$root/scripts/fstests

for a in "$@"; do
    case $a in
        *=*) export "${a?}" ;;
        *) echo "fstests: unknown argument '$a' (use MODE=, GROUP=, TESTS=)" >&2; exit 2 ;;
    esac
done

MODE=${MODE:-softdep}
GROUP=${GROUP:-quick}
TESTS=${TESTS:-}
CACHE=${FSTESTS_CACHE:-/var/cache/cairn-fstests}
# Sizes of the two images (sparse). The tests fill the scratch file system often (ENOSPC
# tests, fallocate of all free space), so it is the smaller.
FSTESTS_TEST_SIZE=${FSTESTS_TEST_SIZE:-4G}
FSTESTS_SCRATCH_SIZE=${FSTESTS_SCRATCH_SIZE:-2G}

say() { printf 'fstests: %s\n' "$*"; }
die() { printf 'fstests: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (loop devices, mounts, the suite's users); try sudo make fstests"

# --- the cairn binary -------------------------------------------------------------------
if [ -z "${CAIRN_BIN:-}" ]; then
    cargo=${CARGO:-cargo}
    target_dir=$("$cargo" metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    say "building cairn (release)"
    "$cargo" build --release -q -p cairn-cli --manifest-path "$root/Cargo.toml"
    CAIRN_BIN=${target_dir:-$root/target}/release/cairn
fi
[ -x "$CAIRN_BIN" ] || die "no cairn binary at $CAIRN_BIN"

# --- which file system ------------------------------------------------------------------
# A cairn mode's format and mount options come from the registry (`cairn modes --json`),
# never from a table here.
mode_json=$("$CAIRN_BIN" modes --json | grep -F "\"mode\":\"$MODE\"" || true)
json_field() { sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p" <<<"$mode_json"; }
# A registry variant (`"variant"` in `cairn modes --json`: journal-2sync, ...) runs as its
# base mode with what its facts change: a log on a device of its own ("log":"device") gets
# one loop device per file system (TEST_LOGDEV, SCRATCH_LOGDEV), made a log by `cairn wal
# mkfs` whenever its file system is made, and `log=dev:PATH` in its mount options.
log_device=
variant_json=$("$CAIRN_BIN" modes --json | grep -F "\"variant\":\"$MODE\"" || true)
if [ -n "$variant_json" ]; then
    base=$(sed -n 's/.*"base":"\([^"]*\)".*/\1/p' <<<"$variant_json")
    mode_json=$("$CAIRN_BIN" modes --json | grep -F "\"mode\":\"$base\"" || true)
    [ "$(sed -n 's/.*"log":"\([^"]*\)".*/\1/p' <<<"$variant_json")" = device ] && log_device=1
fi
case $MODE in
    ext4) kind=ext4 ;;
    umbrella) kind=umbrella ;;
    *)
        [ -n "$mode_json" ] || die "unknown mode '$MODE' (cairn modes lists: $("$CAIRN_BIN" modes | cut -f1 | tr '\n' ' ')umbrella ext4)"
        kind=cairn
        format=$(json_field type)
        mount_options=$(json_field mount_options)
        # A mode whose every call is durable on return through its log (the registry's
        # facts: family journal, commit sync or group) makes two device flushes per write
        # call, the data's and the log's. generic/069 (3 million appends) and 371 (8 GB
        # written by xfs_io in 4 KiB calls, each its own durable request: docs/FUSE.md)
        # took 53 and 39 minutes at load 10 (2026-11-29), beyond the default limit: 069
        # gets three times it, 371 twice (docs/CONFORMANCE.md, "journal's five").
        if [ "$(json_field family)" = journal ] && [ "$(json_field commit)" != async ]; then
            FSTESTS_SLOW_TESTS="generic/069=3 generic/371=2 ${FSTESTS_SLOW_TESTS:-}"
        fi
        ;;
esac

# --- 1. packages, 2. the suite ------------------------------------------------------------
# (SKIP_DEPS=1: the caller installed them, as scripts/fstests/smoke.sh does once for its runs.)
[ -n "${SKIP_DEPS:-}" ] || bash "$root/scripts/install-deps.sh"
# shellcheck source=scripts/fstests/suite.sh
. "$here/suite.sh"
src=$(build_suite "$CACHE")
say "suite: $src"

# --- 3. users -----------------------------------------------------------------------------
# The smoke list runs several modes at once: on a fresh machine each finds the users
# missing, and the second useradd of one failed the run. One run adds them at a time (a
# lock); the next finds them there.
ensure_users() {
    local u
    for u in fsgqa fsgqa2 123456-fsgqa; do
        if ! getent passwd "$u" >/dev/null; then
            say "adding user $u (the suite runs commands as it)"
            useradd -m "$u"
        fi
    done
    if ! getent group fsgqa >/dev/null; then
        say "adding group fsgqa"
        groupadd fsgqa
    fi
}
(
    flock 9
    ensure_users
) 9>/tmp/cairn-fstests-users.lock

# --- 4. devices ---------------------------------------------------------------------------
stamp=$(date +%Y%m%d-%H%M%S)
RESULTS=${FSTESTS_RESULTS:-$root/results/fstests/$stamp-$MODE}
mkdir -p "$RESULTS"
RESULTS=$(readlink -f "$RESULTS")
# Work directories of earlier runs that could not clean up (killed with SIGKILL, a lost
# machine): named MODE.PID, stale once that pid is no run.sh. Their loop devices are
# detached and their daemons stopped as this run's would be.
for w in "$CACHE"/work/*.*; do
    [ -d "$w" ] || continue
    p=${w##*.}
    if [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -q 'fstests/run.sh'; then
        continue
    fi
    say "removing the work directory of an earlier run that did not finish: $w"
    for e in /proc/[0-9]*/exe; do
        [ "$(readlink "$e" 2>/dev/null)" = "$w/bin/cairn" ] && { e=${e#/proc/}; kill -KILL "${e%/exe}" 2>/dev/null || true; }
    done
    for m in $(awk -v w="$w/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo); do
        umount -l "$m" 2>/dev/null || true
    done
    for l in $(losetup -l -n -O NAME,BACK-FILE | awk -v w="$w/" 'index($2, w) == 1 { print $1 }'); do
        losetup -d "$l" 2>/dev/null || true
    done
    rm -rf --one-file-system "$w"
done
work=$CACHE/work/$MODE.$$
mkdir -p "$work/bin"
# The run's own copies: a rebuild or an edit while the suite runs (hours) must not change
# the binary or the scripts under it (bash reads a script as it goes).
cp "$CAIRN_BIN" "$work/bin/cairn"
CAIRN_BIN=$work/bin/cairn
cp "$here"/inside.sh "$here"/watchdog.sh "$here"/umbrella.sh "$here"/summarize.sh "$here"/exclude "$work/bin/"
# The umbrella's own exclusions (scripts/fstests/exclude.umbrella: the union's design) join
# the run's copy, reasons and all, so `check -E` and the summary read one file.
if [ "$kind" = umbrella ]; then
    case ",${FSTESTS_UMBRELLA_BRANCH_OPTS:-}," in
        *,strictatime,*) grep -v '^generic/003[[:space:]]' "$here/exclude.umbrella" ;;
        *) cat "$here/exclude.umbrella" ;;
    esac >>"$work/bin/exclude"
fi
loops=()
inside_pid=
# However the run ends (done, an error, Ctrl-C, kill, a closed terminal): the namespace's
# own exit trap unmounts and stops its daemons; then whatever of this run is still alive —
# a daemon runs the run's own copy of the binary, so /proc/PID/exe names it exactly — is
# stopped, the loop devices whose images live under the run's directory (ours and any a
# test made) are detached, and the directory goes.
cleanup() {
    trap - EXIT INT TERM HUP
    # Nothing here may end the trap early (set -e): a namespace script still unmounting
    # after a minute (a daemon busy with a test's long call) is why its daemons are stopped.
    set +e
    if [ -n "$inside_pid" ] && kill -0 "$inside_pid" 2>/dev/null; then
        kill -TERM "$inside_pid" 2>/dev/null
        wait_gone 60 "$inside_pid"
    fi
    stop_run_daemons
    local l
    for l in "${loops[@]}" $(losetup -l -n -O NAME,BACK-FILE | awk -v w="$work/" 'index($2, w) == 1 { print $1 }'); do
        losetup -d "$l" 2>/dev/null || true
    done
    rm -rf --one-file-system "$work"
}
# wait_gone SECONDS PID...: polls until none of the processes is alive, at most SECONDS.
wait_gone() {
    local deadline=$((SECONDS + $1)) p alive
    shift
    while [ $SECONDS -lt $deadline ]; do
        alive=
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && return 0
        sleep 0.2
    done
    return 1
}
# The pids of the processes running this run's binary (its daemons).
run_daemons() {
    local e
    for e in /proc/[0-9]*/exe; do
        [ "$(readlink "$e" 2>/dev/null)" = "$CAIRN_BIN" ] && { e=${e#/proc/}; echo "${e%/exe}"; }
    done
    return 0
}
stop_run_daemons() {
    local pids
    pids=$(run_daemons)
    [ -n "$pids" ] || return 0
    say "stopping daemons this run left: $(echo $pids)"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    # shellcheck disable=SC2086
    wait_gone 30 $pids && return 0
    # shellcheck disable=SC2086
    kill -KILL $(run_daemons) 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

new_loop() {
    local img=$1 size=$2
    rm -f "$img"
    truncate -s "$size" "$img"
    losetup -f --show "$img"
}
if [ "$kind" != umbrella ]; then
    test_dev=$(new_loop "$work/test.img" "$FSTESTS_TEST_SIZE"); loops+=("$test_dev")
    scratch_dev=$(new_loop "$work/scratch.img" "$FSTESTS_SCRATCH_SIZE"); loops+=("$scratch_dev")
    say "TEST_DEV=$test_dev ($FSTESTS_TEST_SIZE) SCRATCH_DEV=$scratch_dev ($FSTESTS_SCRATCH_SIZE), sparse"
    if [ -n "$log_device" ]; then
        test_log=$(new_loop "$work/test-log.img" "${FSTESTS_LOG_SIZE:-64M}"); loops+=("$test_log")
        scratch_log=$(new_loop "$work/scratch-log.img" "${FSTESTS_LOG_SIZE:-64M}"); loops+=("$scratch_log")
        say "logs on devices of their own: TEST_LOGDEV=$test_log SCRATCH_LOGDEV=$scratch_log"
    fi
fi

# --- the test list ------------------------------------------------------------------------
# Always the generic tests (a group of `generic/`), so ext4 runs exactly the list cairn does.
selection=()
if [ "$TESTS" = "@smoke" ]; then
    TESTS=$(sed 's/#.*//' "$here/smoke.list" | xargs)
fi
if [ -n "$TESTS" ]; then
    read -r -a selection <<<"$TESTS"
else
    case $GROUP in */*) selection=(-g "$GROUP") ;; *) selection=(-g "generic/$GROUP") ;; esac
fi
# Exclusions: scripts/fstests/exclude (every cairn target; ext4 runs everything) and, for the
# umbrella, exclude.umbrella, each with its reason; `check -E` wants bare names.
if [ "$kind" = ext4 ]; then
    : >"$RESULTS/exclude.list"
else
    sed 's/#.*//; s/[[:space:]]*$//; /^$/d' "$work/bin/exclude" >"$RESULTS/exclude.list"
fi
# Tests that need something this machine's root lacks (scripts/fstests/machine): left out
# on every target, ext4 too, and counted "not run" with the reason in the summary.
cap_eff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
has_cap() { (((16#$cap_eff >> $1) & 1)); }
machine_has() {
    case $1 in
        CAP_SYS_RESOURCE) has_cap 24 ;;
        # Either the capability, or a hard limit already that high.
        NOFILE\>=*) has_cap 24 || [ "$(ulimit -Hn)" = unlimited ] || [ "$(ulimit -Hn)" -ge "${1#NOFILE>=}" ] ;;
        *) die "scripts/fstests/machine names $1, which run.sh does not know" ;;
    esac
}
: >"$RESULTS/machine-notrun.tsv"
while IFS=$'\t' read -r t need why; do
    case $t in '' | '#'*) continue ;; esac
    machine_has "$need" && continue
    echo "$t" >>"$RESULTS/exclude.list"
    case $need in
        NOFILE*) lacks="open files' hard limit $(ulimit -Hn) < ${need#NOFILE>=} and root lacks CAP_SYS_RESOURCE" ;;
        *) lacks="root lacks $need" ;;
    esac
    printf '%s\tnotrun\t\tthis machine: %s (%s)\n' "$t" "$lacks" "$why" >>"$RESULTS/machine-notrun.tsv"
done <"$here/machine"
[ -s "$RESULTS/machine-notrun.tsv" ] && say "not run on this machine (scripts/fstests/machine): $(cut -f1 "$RESULTS/machine-notrun.tsv" | xargs)"

# --- 5. the run, in a private mount namespace ---------------------------------------------
export MODE kind format mount_options CAIRN_BIN src work RESULTS test_dev scratch_dev here
export test_log=${test_log:-} scratch_log=${scratch_log:-}
export FSTESTS_TEST_TIMEOUT=${FSTESTS_TEST_TIMEOUT:-1800}
export FSTESTS_UMBRELLA_BRANCH_OPTS=${FSTESTS_UMBRELLA_BRANCH_OPTS:-}
export FSTESTS_UMBRELLA_BRANCH_FS=${FSTESTS_UMBRELLA_BRANCH_FS:-tmpfs}
# Tests slow on every target, ext4 included, get a multiple of the limit too: generic/748
# three times (233 s on ext4, 280 s in async under load, docs/CONFORMANCE.md). With the
# mode's own above and the caller's, every multiple the watchdog applies is decided here.
export FSTESTS_SLOW_TESTS="generic/748=3 ${FSTESTS_SLOW_TESTS:-}"
export -f say
say "mode $MODE: ${selection[*]} (results in $RESULTS)"
t0=$SECONDS
rc=0
# In the background and waited for, so a signal to this script runs its trap at once
# (bash runs a trap only after a foreground child ends).
# `slave`, not `private`: a private copy would hold every FUSE mount of the host (another
# run's cairn daemon, a benchmark's) alive after its own unmount until this run ended.
unshare --mount --propagation slave bash "$work/bin/inside.sh" "${selection[@]}" &
inside_pid=$!
wait "$inside_pid" || rc=$?
inside_pid=
say "check ran $((SECONDS - t0)) s (exit $rc)"

# --- 6. summary ---------------------------------------------------------------------------
bash "$work/bin/summarize.sh" "$RESULTS" "$work/bin/exclude" "$MODE"
exit 0
}

main "$@"
