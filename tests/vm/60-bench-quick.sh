#!/usr/bin/env bash
# scripts/bench --quick, so the benchmark does not rot: the guest part (scripts/bench-guest
# --quick: one round, one size per figure, few iterations) measures urdma, rxe and siw; every
# stack must produce every figure (a failed urdma run fails the test like a missing figure),
# and the report generator must turn the CSV into a report with its plots.
#
# siw.ko: out/siw/siw.ko when scripts/bench or scripts/build-siw built it on the host,
# otherwise scripts/bench-guest builds it here (slower under emulation).
# vm-timeout: 900
set -u
. tests/lib.sh

dir=${URDMA_OUT:-/tmp}/bench-quick
rm -rf "$dir"
start=$SECONDS
timeout -k 10 840 scripts/bench-guest --quick --out "$dir" >"$dir.log" 2>&1
rc=$?
grep -E "^bench: (round|done)|BENCH FAILURE" "$dir.log"
[ "$rc" != 124 ] || fail "scripts/bench-guest --quick did not finish within 840 s"
[ -f "$dir/bench.csv" ] || fail "no CSV: $(tail -n1 "$dir.log")"
awk -F, '$1 == "urdma" && $6 == "failed" {bad = 1} END {exit !bad}' "$dir/bench.csv" &&
	fail "a urdma run failed: $(grep -m1 'BENCH FAILURE: urdma' "$dir.log")"
scripts/bench-report --check "$dir" || fail "a stack lacks a figure (above)"
[ "$rc" = 0 ] || fail "scripts/bench-guest --quick exited $rc: $(tail -n1 "$dir.log")"
timeout -k 5 300 scripts/bench-report "$dir" "$dir/report" || fail "scripts/bench-report failed on the quick run's CSV"
for f in benchmarks.md benchmarks/bench.csv benchmarks/latency.png benchmarks/bandwidth.png benchmarks/loss.png; do
	[ -s "$dir/report/$f" ] || fail "the report lacks $f"
done
echo "quick bench in $((SECONDS - start)) s"
echo "PASS"
