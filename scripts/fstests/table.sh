#!/usr/bin/env bash
# table.sh REFERENCE RESULTS...: the rows docs/CONFORMANCE.md shows for runs of
# `make fstests`, each beside the reference run (ext4 on the same harness) counted over the
# tests both reached — so a reader sees which "not run" are the file system's and which
# are the machine's or the suite's. Each argument is a run's results directory (its
# summary.tsv, written by summarize.sh; a run cut short, or still going, is summarized
# first, into a temporary directory: nothing is written into the runs read).
#
#   scripts/fstests/table.sh results/ext4 results/async results/softdep
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -ge 2 ] || { echo "usage: table.sh REFERENCE RESULTS..." >&2; exit 2; }
ref=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A run still going, or killed, has no summary yet: make one from its console output.
tsv_of() {
    local d=$1 mode out
    if [ -s "$d/summary.tsv" ] && ! [ "$d/check.out" -nt "$d/summary.tsv" ]; then
        echo "$d/summary.tsv"
        return
    fi
    mode=$(sed -n 's/.*MOUNT_OPTIONS.*mode=\([a-z-]*\).*/\1/p' "$d/local.config" 2>/dev/null | head -1)
    out=$(mktemp -d "$tmp/run.XXXXXX")
    bash "$here/summarize.sh" "$d" /dev/null "${mode:-?}" "$out" >/dev/null
    echo "$out/summary.tsv"
}

count() { awk -F'\t' -v s="$2" '$2 == s' "$1" | wc -l; }
rtsv=$(tsv_of "$ref")
echo "| run | tests reached | passed | failed | not run | reference on the same tests: passed / failed / not run | failed |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for d in "$@"; do
    t=$(tsv_of "$d")
    both=$(mktemp "$tmp/both.XXXXXX")
    awk -F'\t' 'NR == FNR { seen[$1] = 1; next } $1 in seen' "$t" "$rtsv" >"$both"
    failed=$(awk -F'\t' '$2 == "fail" { sub(/^generic\//, "", $1); printf "%s%s", sep, $1; sep = ", " }' "$t")
    printf '| %s | %s | %s | %s | %s | %s / %s / %s | %s |\n' "$(basename "$d")" "$(wc -l <"$t")" \
        "$(count "$t" pass)" "$(count "$t" fail)" "$(count "$t" notrun)" \
        "$(count "$both" pass)" "$(count "$both" fail)" "$(count "$both" notrun)" "${failed:-none}"
    rm -f "$both"
done
