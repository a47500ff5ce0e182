#!/usr/bin/env bash
# summarize.sh RESULTS EXCLUDE MODE [OUT]: turns one fstests run into OUT/summary.tsv
# (test, status, seconds, reason; status is pass, fail, notrun or excluded) and
# OUT/summary.txt (the counts and the failures), from the suite's xunit report
# (RESULTS/raw/result.xml) or, when the run was cut short before writing it, from its
# console output (RESULTS/check.out). OUT is RESULTS unless given: a reader of someone
# else's run, live or finished, gives a directory of its own and writes nothing into it.
set -euo pipefail
results=$1 exclude=$2 mode=$3 out=${4:-$1}
tsv=$out/summary.tsv
xml=$results/raw/result.xml

{
    if [ -s "$xml" ]; then
        # <testcase ... name="generic/001" time="3"> then <skipped message=".."/> or
        # <failure message=".." .../> or nothing (passed).
        awk '
            function flush() { if (name != "") print name "\t" st "\t" t "\t" why; name = "" }
            function attr(s, k,   r) {
                # " name=" (not "classname=")
                if (match(s, "[ \t]" k "=\"[^\"]*\"")) { r = substr(s, RSTART + length(k) + 3, RLENGTH - length(k) - 4); return r }
                return ""
            }
            /<testcase / { flush(); name = attr($0, "name"); t = attr($0, "time"); st = "pass"; why = "" }
            /<skipped/ && name != "" { st = "notrun"; why = attr($0, "message") }
            /<failure/ && name != "" { st = "fail"; why = attr($0, "message") }
            END { flush() }
        ' "$xml"
    elif [ -s "$results/check.out" ]; then
        awk '
            $1 ~ /^[a-z0-9]+\/[0-9]+$/ {
                line = $0; sub(/^[^ ]+ +/, "", line)
                if (line ~ /\[not run\]/) { sub(/.*\[not run\] */, "", line); print $1 "\tnotrun\t\t" line }
                else if (line ~ /\[expunged\]/) { }
                else if (line ~ /output mismatch|\[failed/) { print $1 "\tfail\t\t" line }
                else if (line ~ /[0-9]+s$/) { n = split(line, w, " "); s = w[n]; sub(/s$/, "", s); print $1 "\tpass\t" s "\t" }
            }' "$results/check.out"
    fi
    # Tests left out of this run (`check` prints them "[expunged]"; only those the run was
    # asked for): the ones this machine cannot run (run.sh, scripts/fstests/machine), on
    # every target, then the excluded ones with the reason the exclusion file gives.
    {
        [ -s "$results/machine-notrun.tsv" ] && cat "$results/machine-notrun.tsv"
        if [ "$mode" != ext4 ]; then
            sed -n 's/^\([a-z0-9]*\/[0-9]*\)[[:space:]]*#[[:space:]]*\(.*\)$/\1\texcluded\t\t\2/p' "$exclude"
        fi
    } | awk -F'\t' 'NR == FNR { left[$1] = 1; next } $1 in left' \
        <(awk '$2 == "[expunged]" { print $1 }' "$results/check.out" 2>/dev/null) -
} | sort -u -t$'\t' -k1,1 >"$tsv"

# A test the console shows failing by the file system check after its body passed.
if [ -s "$results/check.out" ]; then
    while read -r t; do
        awk -F'\t' -v t="$t" 'BEGIN{OFS="\t"} $1 == t && $2 == "pass" { $2 = "fail"; $4 = "file system check failed after the test" } { print }' \
            "$tsv" >"$tsv.new" && mv "$tsv.new" "$tsv"
    done < <(awk '$1 ~ /^[a-z0-9]+\/[0-9]+$/ { cur = $1 } /_check_.*filesystem.*inconsistent/ { print cur }' "$results/check.out" | sort -u)
fi

# Tests the harness killed for running too long (inside.sh's watchdog).
if [ -s "$results/timeouts.txt" ]; then
    while read -r t _ _ _ secs _; do
        awk -F'\t' -v t="$t" -v s="$secs" 'BEGIN{OFS="\t"} $1 == t { $2 = "fail"; $3 = s; $4 = "timed out (killed after " s " s)" } { print }' \
            "$tsv" >"$tsv.new" && mv "$tsv.new" "$tsv"
    done <"$results/timeouts.txt"
fi

count() { awk -F'\t' -v s="$1" '$2 == s' "$tsv" | wc -l; }
{
    echo "fstests on $mode: $(count pass) passed, $(count fail) failed, $(count notrun) not run, $(count excluded) excluded"
    if [ "$(count fail)" -gt 0 ]; then
        echo "failed:"
        awk -F'\t' '$2 == "fail" { print "  " $1 "  " $4 }' "$tsv"
    fi
} | tee "$out/summary.txt"
