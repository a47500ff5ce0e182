#!/usr/bin/env bash
# CI's fstests step: the smoke list (scripts/fstests/smoke.list) in every mode `cairn modes`
# lists, FSTESTS_JOBS (default 2) modes at a time, each through
# scripts/fstests/run.sh (its own loop devices, mount namespace and work directory). Fails
# when a test fails in any mode, or a mode's run gives no results; a test the suite cannot
# run there ("not run") does not fail it. The whole quick group is `make fstests`
# (docs/CONFORMANCE.md).
#
#   CAIRN_BIN=target/debug/cairn scripts/fstests/smoke.sh [MODE...]
#
# Besides the registry's modes, the umbrella layer (MODE umbrella: two tmpfs branches, its
# own helpers `mount -t fuse.umbrella`).
#
# FSTESTS_RESULTS_ROOT: where each mode's results go (default: a new directory in /tmp).
set -euo pipefail

main() {
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ -x "${CAIRN_BIN:-}" ] || { echo "smoke: set CAIRN_BIN to the cairn binary" >&2; exit 2; }
export CAIRN_BIN
if [ $# -gt 0 ]; then
    modes=("$@")
else
    # The registry's modes, never a list kept here; then the policy layer over them.
    mapfile -t modes < <("$CAIRN_BIN" modes | awk 'NF { print $1 }')
    modes+=(umbrella)
fi
jobs=${FSTESTS_JOBS:-2}
out=${FSTESTS_RESULTS_ROOT:-$(mktemp -d /tmp/cairn-fstests-smoke.XXXXXX)}
mkdir -p "$out"
# A test that hangs is killed (and failed) long before CI's own limit.
export FSTESTS_TEST_TIMEOUT=${FSTESTS_TEST_TIMEOUT:-300}

# Packages and the suite's build once, before the parallel runs (each run finds them done).
bash "$root/scripts/install-deps.sh" >"$out/install-deps.log" 2>&1 || {
    tail -20 "$out/install-deps.log" >&2
    echo "smoke: installing the suite's packages failed" >&2
    exit 1
}
# shellcheck source=scripts/fstests/suite.sh
. "$root/scripts/fstests/suite.sh"
build_suite "${FSTESTS_CACHE:-/var/cache/cairn-fstests}" >/dev/null

t0=$SECONDS
pids=()
stop() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait
}
trap 'stop; exit 143' TERM
trap 'stop; exit 130' INT
for m in "${modes[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    echo "smoke: $m"
    FSTESTS_RESULTS=$out/$m SKIP_DEPS=1 bash "$root/scripts/fstests/run.sh" MODE="$m" TESTS=@smoke \
        >"$out/$m.log" 2>&1 &
    pids+=($!)
done
wait
trap - TERM INT

bad=()
for m in "${modes[@]}"; do
    tsv=$out/$m/summary.tsv
    if [ ! -s "$tsv" ]; then
        echo "smoke: $m gave no results; its log ends:"
        tail -15 "$out/$m.log" | sed 's/^/    /'
        bad+=("$m")
        continue
    fi
    cat "$out/$m/summary.txt"
    if awk -F'\t' '$2 == "fail" { f = 1 } END { exit !f }' "$tsv"; then
        bad+=("$m")
        # The first lines of each failure's diff, so CI's log says what went wrong.
        for t in $(awk -F'\t' '$2 == "fail" { print $1 }' "$tsv"); do
            f=$out/$m/raw/$t.out.bad
            [ -f "$f" ] && { echo "  $t.out.bad:"; head -15 "$f" | sed 's/^/    /'; }
        done
    fi
done
echo "smoke: ${#modes[@]} modes in $((SECONDS - t0)) s (results in $out)"
if [ ${#bad[@]} -gt 0 ]; then
    echo "smoke: FAILED in: ${bad[*]}"
    exit 1
fi
}

main "$@"
