#!/usr/bin/env bash
# scripts/bench --quick, so that the benchmark does not rot: the guest part
# (scripts/bench-guest --quick: one round, one size per figure, few iterations) measures
# urdma and a kernel stack in one boot; urdma must produce every figure (a failed urdma run
# fails the test like a missing figure), and the report generator must turn the CSV into a
# report with its ratios (not its plots: tests/host/bench-report.sh checks those on the
# host). The kernel stacks' figures are reported, missing ones too, but do not fail the
# test: under the VM's emulation their runs sometimes exceed the bench's per-run bound,
# which says nothing about urdma. scripts/bench (the full run) wants them all.
# BENCH_QUICK_KSTACKS: the kernel stacks measured; siw in the CI form (the ratios need one,
# and siw is the quicker: 58 s here against rxe's 95), "rxe siw" in the full form.
# The quick run includes the latency by how the application waits (tests/e2e/lat.c: a
# completion channel, a spin on memory, a target that sleeps) and the floor beside it of any
# user-space data path (tests/e2e/floor.c); the report must show its matrix.
#
# siw.ko: out/siw/siw.ko when scripts/bench or scripts/build-siw built it on the host,
# otherwise scripts/bench-guest builds it here (slower under emulation).
# vm-timeout: 1200
set -u
. tests/e2e/lib.sh

kstacks=${BENCH_QUICK_KSTACKS:-siw}
dir=${URDMA_OUT:-/tmp}/bench-quick
rm -rf "$dir"
mkdir -p "$dir"
start=$SECONDS
# lat.c and floor.c as scripts/test built them on the host (gcc under the emulation takes
# some 25 s for the two): bench-guest uses a build in its output directory newer than its source.
lat=$(build_e2e lat) || exit 1
floor=$(build_e2e floor) || exit 1
cp "$lat" "$floor" "$dir/" || fail "cannot copy lat and floor into $dir"
# Not urdma-pmd, for time: it is urdma on another bed link (70-e2e-pmd tests that link).
timeout -k 10 1080 scripts/bench-guest --quick --stacks "urdma $kstacks floor floor-spin" \
	--out "$dir" >"$dir.log" 2>&1
rc=$?
grep -E "^bench: (round|done)|BENCH FAILURE" "$dir.log"
[ "$rc" != 124 ] || fail "scripts/bench-guest --quick did not finish within 1080 s"
[ "$rc" != 2 ] || fail "scripts/bench-guest --quick could not set up: $(tail -n1 "$dir.log")"
[ -f "$dir/bench.csv" ] || fail "no CSV: $(tail -n1 "$dir.log")"
awk -F, '$1 == "urdma" && $6 == "failed" {bad = 1} END {exit !bad}' "$dir/bench.csv" &&
	fail "a urdma run failed: $(grep -m1 'BENCH FAILURE: urdma' "$dir.log")"
scripts/bench-report --check "$dir" urdma || fail "urdma lacks a figure (above)"
scripts/bench-report --check "$dir" floor floor-spin || fail "the user-space floor (tests/e2e/floor.c) lacks a figure (above)"
echo "the kernel stacks' figures:"
# shellcheck disable=SC2086 # the stacks, split
scripts/bench-report --check "$dir" $kstacks | sed 's/^/  /'
# Without plots: matplotlib takes minutes to load here (tests/host/bench-report.sh checks them).
timeout -k 5 300 scripts/bench-report --no-plots "$dir" "$dir/report" ||
	fail "scripts/bench-report failed on the quick run's CSV"
for f in benchmarks.md benchmarks/bench.csv; do
	[ -s "$dir/report/$f" ] || fail "the report lacks $f"
done
grep -q "^## Latency by how the application waits" "$dir/report/benchmarks.md" ||
	fail "the report lacks the latency matrix of the waiting patterns"
awk '/^## / {on = /^## Latency by how the application waits/} on && /^\|/' "$dir/report/benchmarks.md"
grep -iE "ratio|×|x rxe|x siw" "$dir/report/benchmarks.md" | head -n 20
echo "quick bench in $((SECONDS - start)) s"
echo "PASS"
