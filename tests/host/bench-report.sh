#!/usr/bin/env bash
# scripts/bench-report on the committed run (docs/benchmarks/): it makes docs/benchmarks.md
# again, word for word (the page is the report's, not edited by hand), and its four plots;
# --no-plots makes the same page without them; the variant tables refuse a run without
# their stack. The quick benchmark in the VM (tests/vm/60-bench-quick.sh) reports without
# plots: matplotlib takes minutes to load there, and the plots are checked here.
#   bash tests/host/bench-report.sh
set -u

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
suite=bench-report
. tests/host/checks.sh

check "the report of docs/benchmarks/" scripts/bench-report docs/benchmarks "$out/full"
check "it is docs/benchmarks.md, word for word" diff -u docs/benchmarks.md "$out/full/benchmarks.md"
for p in latency bandwidth loss patterns; do
	check "plot $p.png" test -s "$out/full/benchmarks/$p.png"
done
check "the report without plots" scripts/bench-report --no-plots docs/benchmarks "$out/bare"
check "no plot, no Plots section" sh -c "! ls '$out'/bare/benchmarks/*.png 2>/dev/null && ! grep -q '^## Plots' '$out/bare/benchmarks.md'"
# The full page less its Plots section.
without_plots() { awk '/^## Plots/ {skip = 1; next} /^## / {skip = 0} !skip' "$1"; }
check "the rest is the same page" diff <(without_plots "$out/full/benchmarks.md") "$out/bare/benchmarks.md"
check "--pmd: the PMD link's table of the committed run" \
	sh -c "scripts/bench-report --pmd docs/benchmarks | grep -q '^| figure | veth bed'"
for v in crc direct; do
	check "--$v: one line, exit 2, for a run without its stack" \
		sh -c "scripts/bench-report --$v docs/benchmarks 2>'$out/$v.err'; [ \$? = 2 ] && [ \$(wc -l <'$out/$v.err') = 1 ]"
done
# The connection-rate table, from the committed run with its connrate rows replaced: a
# ratio to the better (higher) kernel stack, and --check missing a stack's figure.
cp -r docs/benchmarks "$out/cr"
grep -v '^[^,]*,[^,]*,connrate,' docs/benchmarks/bench.csv >"$out/cr/bench.csv"
printf "connrate=1 16\nconnrate_cycles=3\n" >>"$out/cr/guest.txt"
for r in "urdma,1,connrate,1,0,conn_rate,20,conns/s,x" "urdma,1,connrate,16,0,conn_rate,40,conns/s,x" \
	"rxe,1,connrate,1,0,conn_rate,50,conns/s,x" "rxe,1,connrate,16,0,conn_rate,80,conns/s,x" \
	"siw,1,connrate,1,0,conn_rate,100,conns/s,x"; do
	echo "$r" >>"$out/cr/bench.csv"
done
check "--no-plots with connection rates" scripts/bench-report --no-plots "$out/cr" "$out/cr-report"
check "their table: urdma over the better kernel stack" \
	sh -c "grep -q '^## Connection rate' '$out/cr-report/benchmarks.md' &&
		grep -qF '| 1 | 20.0 | 50.0 | 100 | 0.2 |' '$out/cr-report/benchmarks.md' &&
		grep -qF '| 16 | 40.0 | 80.0 | failed | 0.5 |' '$out/cr-report/benchmarks.md'"
check "its method: each client's cycles, from a run before connrate_conns" \
	grep -qF 'disconnecting, 3 times (tests/e2e/connrate.c)' "$out/cr-report/benchmarks.md"
cp -r "$out/cr" "$out/cr48"
echo "connrate_conns=48" >>"$out/cr48/guest.txt"
check "--no-plots with connection rates of at least 48 connections" \
	scripts/bench-report --no-plots "$out/cr48" "$out/cr48-report"
check "its method: more cycles for fewer clients, up to 48 connections a figure" \
	grep -qF 'disconnecting, max(3, ⌈48/N⌉) times (tests/e2e/connrate.c)' \
	"$out/cr48-report/benchmarks.md"
check "--check: siw lacks the rate of 16 clients" \
	sh -c "scripts/bench-report --check '$out/cr' siw | grep '^missing: siw: connrate 16 B' >/dev/null"
# with_rows NAME ROW...: the committed run in $out/NAME, ROWs added to its bench.csv (and with
# DROP=PATTERN set, its rows that match PATTERN taken out first).
with_rows() {
	local name=$1 r
	shift
	cp -r docs/benchmarks "$out/$name"
	[ -z "${DROP:-}" ] || sed -i "/$DROP/d" "$out/$name/bench.csv"
	for r in "$@"; do echo "$r" >>"$out/$name/bench.csv"; done
}
# The matrix's goal at 64 B: the better kernel stack, or 1.1 x the lower floor where that is
# higher (here 88 for a floor of 80), from a pattern the committed run lacks.
with_rows goal "urdma,1,lat:poll-write,64,0,lat_typical,100,us,x" "rxe,1,lat:poll-write,64,0,lat_typical,50,us,x" \
	"siw,1,lat:poll-write,64,0,lat_typical,60,us,x" "floor,1,lat:poll-write,64,0,lat_typical,80,us,x"
check "--no-plots with a pattern beside its floor" scripts/bench-report --no-plots "$out/goal" "$out/goal-report"
check "its goal: 1.1 x the floor, urdma at 1.14 of it, not met" \
	grep -qF '| `poll-write` | — | 100 | 50.0 | 80.0 | 88.0 | 1.14 | not met |' "$out/goal-report/benchmarks.md"
# The PMD link's table: urdmad idle on both links and the baseline run's PMD figures beside.
check "--pmd: urdmad idle and the baseline run's column" \
	sh -c "scripts/bench-report --pmd docs/benchmarks >'$out/pmd.md' &&
		grep -q '^| urdmad idle, each (% of a CPU) | ' '$out/pmd.md' &&
		head -n1 '$out/pmd.md' | grep -q 'PMD link (virtio), run of '"
# Write latency under loss (#42), from rows of its own in place of the committed run's: urdma
# 200 us at 10 % against 80 at 0 % is 2.5 times, within the goal's 3.
DROP=,lat_loss_ with_rows ll "urdma,1,ib_write_lat,64,0,lat_loss_typical,80,us,x" "urdma,1,ib_write_lat,64,10,lat_loss_typical,200,us,x" \
	"urdma,1,ib_write_lat,64,10,lat_loss_p99,900,us,x" "siw,1,ib_write_lat,64,10,lat_loss_typical,400,us,x"
check "--no-plots with latency under loss" scripts/bench-report --no-plots "$out/ll" "$out/ll-report"
check "its goal row and table" \
	sh -c "grep -qF '| \`ib_write_lat\` 64 B typical latency at 10 % loss / the same link without loss | 200 µs | (urdma at 0 %: 80.0 µs) | 2.50 | ≤ 3 | met |' '$out/ll-report/benchmarks.md' &&
		grep -qF '| 10 | 200 (900) | — | 400 (—) | 2.50 |' '$out/ll-report/benchmarks.md'"
bw_against_loss() { awk '/^### Write bandwidth against loss/ {on = 1; print; next} on && /^#/ {exit} on' "$1"; }
check "the bandwidth-against-loss table as without them" \
	diff <(bw_against_loss "$out/full/benchmarks.md") <(bw_against_loss "$out/ll-report/benchmarks.md")
# bench-guest refuses a bad idle, loss or connection-rate measurement, in one line, before
# it touches anything.
for v in BENCH_IDLE_SECS=0 BENCH_IDLE_SECS=x BENCH_IDLE_SETTLE=-1 BENCH_LOSS_SECS=0 BENCH_LOSS_SECS=2s \
	BENCH_LAT_LOSSES=1.5 BENCH_CONNRATE=0 BENCH_CONNRATE_CYCLES=x BENCH_CONNRATE_CONNS=0; do
	check "bench-guest refuses $v" \
		sh -c "env $v scripts/bench-guest --out '$out/bg' --stacks urdma 2>'$out/bg.err'; [ \$? = 2 ] && [ \$(wc -l <'$out/bg.err') = 1 ] && [ ! -e '$out/bg' ]"
done
summary
