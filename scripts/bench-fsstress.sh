#!/bin/bash
# fsstress (xfstests' ltp/fsstress) on a fresh image in each mode, the modes alternating in
# every repetition: seconds, device flushes, FUSE calls, flushes per call, and soft updates'
# flushes by cause. One line per run, then min/median/max per mode and the ratio of medians
# to the first mode.
#
#   FSSTRESS=/path/to/fsstress scripts/bench-fsstress.sh [MODE...]
#
# Environment: FSSTRESS (required: xfstests' ltp/fsstress, built with `make` in an xfstests
# checkout), CAIRN (default: cairn on PATH), SEED (7), OPS (3000), PROCS (4), REPS (3),
# SIZE (2G), CPU (a CPU list for taskset, both fsstress and the daemon; empty: unpinned),
# SCRATCH (/var/tmp). Modes default to async softdep journal-async.
set -euo pipefail
CAIRN=${CAIRN:-cairn}
FSSTRESS=${FSSTRESS:?set FSSTRESS to xfstests ltp/fsstress}
SEED=${SEED:-7} OPS=${OPS:-3000} PROCS=${PROCS:-4} REPS=${REPS:-3} SIZE=${SIZE:-2G}
CPU=${CPU:-}
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(async softdep journal-async)
pin=()
[ -n "$CPU" ] && pin=(taskset -c "$CPU")
W=$(mktemp -d "${SCRATCH:-/var/tmp}/cairn-fsstress.XXXXXX")
mounted=""
cleanup() {
    [ -n "$mounted" ] && "$CAIRN" umount "$mounted" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
echo "# fsstress -s $SEED -n $OPS -p $PROCS, $SIZE images, cpu ${CPU:-unpinned}, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
    for mode in "${modes[@]}"; do
        fmt=ffs
        [ "${mode%%-*}" = lfs ] && fmt=lfs
        r=$W/$mode.$rep
        mkdir -p "$r/mnt"
        "$CAIRN" mkfs "$r/img" --size "$SIZE" --format "$fmt" >/dev/null
        "${pin[@]}" "$CAIRN" mount -o "mode=$mode" "$r/img" "$r/mnt"
        mounted=$r/mnt
        mkdir "$r/mnt/d"
        s=$(date +%s.%N)
        "${pin[@]}" "$FSSTRESS" -s "$SEED" -n "$OPS" -p "$PROCS" -d "$r/mnt/d" >"$r/fss.out" 2>&1
        e=$(date +%s.%N)
        "$CAIRN" stats "$r/mnt" --json >"$r/stats.json"
        "$CAIRN" umount "$r/mnt"
        mounted=""
        rm -f "$r/img"
        python3 - "$mode" "$rep" "$s" "$e" "$r/stats.json" >>"$W/lines" <<'PY'
import json, sys
mode, rep, s, e, path = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
fs = json.load(open(path))["fs"]
calls = sum(v["calls"] for v in fs.get("ops", {}).values()) or fs.get("ops_total", 0)
fl = fs["device"]["flushes"]
cause = (fs.get("strategy") or {}).get("flushes")
print(json.dumps({"mode": mode, "rep": int(rep), "secs": e - s, "flushes": fl, "calls": calls,
                  "writes": fs["device"]["writes"], "by_cause": cause}))
PY
        tail -n1 "$W/lines"
    done
done
python3 - "$W/lines" "${modes[0]}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = sys.argv[2]
by = {}
for r in rows:
    by.setdefault(r["mode"], []).append(r)
med = {m: statistics.median(r["secs"] for r in v) for m, v in by.items()}
print("| mode | time min / median / max (s) | ratio to %s (time, median) | device flushes (median) | FUSE calls | flushes per call |" % base)
print("|---|---|---|---|---|---|")
for m, v in by.items():
    t = sorted(r["secs"] for r in v)
    f = statistics.median(r["flushes"] for r in v)
    c = statistics.median(r["calls"] for r in v)
    print(f"| {m} | {t[0]:.1f} / {med[m]:.1f} / {t[-1]:.1f} | {med[base] / med[m]:.2f} | {f:,.0f} | {c:,.0f} | {f / max(c, 1):.4f} |")
PY
