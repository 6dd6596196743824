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
summary
