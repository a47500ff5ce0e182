#!/usr/bin/env bash
# `make test`: every check CI makes, in order, each step reported; exits nonzero if any failed.
# Mount-based suites need root (/dev/fuse, loop devices, running parts as another user).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        echo "test: re-running as root (the mount suites need it)"
        exec sudo -E env "PATH=$PATH" bash "$0" "$@"
    fi
    echo "test: warning: not root and no sudo; the mount suites will fail"
fi

# The heavy parts (a real C project built on a mount, long differential runs) are part of the
# suite CI runs; set CAIRN_TEST_HEAVY=0 for a quicker local run.
export CAIRN_TEST_HEAVY="${CAIRN_TEST_HEAVY:-1}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

declare -a failed=()
declare -a timings=()
step() {
    local name=$1; shift
    local t0=$SECONDS
    echo
    echo "=== $name: $*"
    if "$@"; then
        timings+=("$name: ok ($((SECONDS - t0)) s)")
    else
        local rc=$?
        failed+=("$name")
        timings+=("$name: FAILED, exit $rc ($((SECONDS - t0)) s)")
    fi
}

step fmt cargo fmt --all -- --check
step clippy cargo clippy --workspace --all-targets -- -D warnings
# The mount suites run the `cairn` binary: build it (same profile as the tests) before them.
step build cargo build --workspace --bins
# Where cargo put it: CARGO_TARGET_DIR (or a config file) may move the target directory.
target_dir=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
export CAIRN_BIN="${CAIRN_BIN:-${target_dir:-$PWD/target}/debug/cairn}"

# Everything the suites leave outside their own temporary directories goes into one scratch
# directory removed at the end: the mount daemons' runtime files and logs, the benchmark's
# source-tarball cache. `make test` changes nothing else on the machine.
scratch=$(mktemp -d /tmp/cairn-test.XXXXXX)
trap 'rm -rf --one-file-system "$scratch"' EXIT
export CAIRN_RUNTIME_DIR="${CAIRN_RUNTIME_DIR:-$scratch/run}"
export CAIRN_BENCH_CACHE="${CAIRN_BENCH_CACHE:-$scratch/cache}"
log="$scratch/test.log"

# FUSE over io_uring is a kernel switch that new mounts see at INIT (a live mount keeps what
# it got). The suites mount over both transports: turn it on for the run. It stays on
# afterwards: turning it off could fail another run's io_uring mounts mid-way.
uring_param=/sys/module/fuse/parameters/enable_uring
if [ -e "$uring_param" ]; then
    if [ "$(cat "$uring_param")" != Y ] && ! echo Y > "$uring_param" 2>/dev/null; then
        echo "test: cannot turn on $uring_param; the io_uring transport will not be tested"
    fi
    echo "test: FUSE over io_uring: $uring_param = $(cat "$uring_param")"
else
    echo "test: this kernel has no FUSE over io_uring; only the /dev/fuse transport is tested"
fi
run_tests() {
    # --no-fail-fast: one failing suite must not hide the results of the others.
    cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}
step test run_tests

# fstests' smoke list in every mode (scripts/fstests/smoke.sh, two modes at a time, each
# on its own loop devices; about two minutes a mode on a loaded 2-CPU machine): the suite is built once from its archive
# (scripts/fstests/suite.sh finds it: FSTESTS_KIT, or shared/kits beside the checkout).
# The quick group in every mode is `make fstests`; its results are docs/CONFORMANCE.md.
step fstests env FSTESTS_RESULTS_ROOT="$scratch/fstests" bash scripts/fstests/smoke.sh

# Totals over every test binary's "test result:" line.
read -r passed failed_n ignored < <(awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i
        }
    } END { printf "%d %d %d\n", p, f, g }' "$log")

echo
echo "=== summary"
printf '  %s\n' "${timings[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "  FAILED steps: ${failed[*]}"
fi
echo "tests: $passed passed, $failed_n failed, $ignored skipped"
[ ${#failed[@]} -eq 0 ]
