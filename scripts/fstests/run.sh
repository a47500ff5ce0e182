#!/usr/bin/env bash
# `make fstests`: the file-system community's regression suite (fstests, a.k.a. xfstests)
# on cairn, in one mode, from the archive kept outside the project.
#
#   scripts/fstests/run.sh [MODE=softdep] [GROUP=quick | TESTS="generic/001 generic/002" |
#                          TESTS=@smoke] [FSTESTS_CACHE=...] [FSTESTS_RESULTS=...]
#
# MODE is a mode of `cairn modes`, `umbrella` (the policy layer over two local branches) or
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
# The loop devices are detached and every mount is undone on exit, however the run ends.
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
case $MODE in
    ext4) kind=ext4 ;;
    umbrella) kind=umbrella ;;
    *)
        [ -n "$mode_json" ] || die "unknown mode '$MODE' (cairn modes lists: $("$CAIRN_BIN" modes | cut -f1 | tr '\n' ' ')umbrella ext4)"
        kind=cairn
        format=$(json_field type)
        mount_options=$(json_field mount_options)
        ;;
esac

# --- 1. packages, 2. the suite ------------------------------------------------------------
bash "$root/scripts/install-deps.sh"
# shellcheck source=scripts/fstests/suite.sh
. "$here/suite.sh"
src=$(build_suite "$CACHE")
say "suite: $src"

# --- 3. users -----------------------------------------------------------------------------
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
ensure_users

# --- 4. devices ---------------------------------------------------------------------------
stamp=$(date +%Y%m%d-%H%M%S)
RESULTS=${FSTESTS_RESULTS:-$root/results/fstests/$stamp-$MODE}
mkdir -p "$RESULTS"
RESULTS=$(readlink -f "$RESULTS")
work=$CACHE/work/$MODE.$$
mkdir -p "$work/bin"
# The run's own copies: a rebuild or an edit while the suite runs (hours) must not change
# the binary or the scripts under it (bash reads a script as it goes).
cp "$CAIRN_BIN" "$work/bin/cairn"
CAIRN_BIN=$work/bin/cairn
cp "$here"/inside.sh "$here"/umbrella.sh "$here"/summarize.sh "$here"/exclude "$work/bin/"
loops=()
cleanup() {
    local l
    for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT

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
# Exclusions: scripts/fstests/exclude (every cairn target; ext4 runs everything), each with
# its reason; `check -E` wants bare names.
if [ "$kind" = ext4 ]; then
    : >"$RESULTS/exclude.list"
else
    sed 's/#.*//; s/[[:space:]]*$//; /^$/d' "$here/exclude" >"$RESULTS/exclude.list"
fi

# --- 5. the run, in a private mount namespace ---------------------------------------------
export MODE kind format mount_options CAIRN_BIN src work RESULTS test_dev scratch_dev here
export FSTESTS_TEST_TIMEOUT=${FSTESTS_TEST_TIMEOUT:-1800}
export -f say
say "mode $MODE: ${selection[*]} (results in $RESULTS)"
t0=$SECONDS
rc=0
unshare --mount --propagation private bash "$work/bin/inside.sh" "${selection[@]}" || rc=$?
say "check ran $((SECONDS - t0)) s (exit $rc)"

# --- 6. summary ---------------------------------------------------------------------------
bash "$work/bin/summarize.sh" "$RESULTS" "$work/bin/exclude" "$MODE"
exit 0
}

main "$@"
