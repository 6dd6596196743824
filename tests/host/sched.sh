#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# scripts/sched-sample and scripts/sched-report: a sampled command's own thread shows in the
# report with the CPU time it spun, the command's exit status comes back, and bad arguments
# get a usage line and exit 2.  Needs root (the sampler runs in SCHED_RR).  Prints
# "sched: N passed, M failed".
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
passed=0
failed=0
ok() { echo "ok   $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# A thread named for this test spins for two seconds, sampled every 0.2 s.
spin='printf urdma-sched-spin >/proc/$$/comm; end=$((SECONDS + 2)); while [ $SECONDS -lt $end ]; do :; done; exit 3'
timeout 60 scripts/sched-sample --every 0.2 --out "$dir/s.txt" -- bash -c "$spin"
rc=$?
[ "$rc" = 3 ] && ok "the command's exit status comes back" || bad "exit status $rc, expected 3"
n=$(grep -c '^T ' "$dir/s.txt")
[ "$n" -ge 4 ] && ok "$n samples in 2 s" || bad "$n samples in 2 s, expected at least 4"
report=$(timeout 60 scripts/sched-report "$dir/s.txt" 0 "$((n - 1))" 2>&1)
# a thread's name is at most 15 bytes
ran=$(awk '$1 == "urdma-sched-spi" {print $3}' <<<"$report")
if [ -n "$ran" ] && awk -v r="$ran" 'BEGIN {exit !(r >= 0.3)}'; then
	ok "the spinning thread ran $ran s"
else
	bad "the spinning thread is not in the report with its CPU time: $report"
fi
timeout 10 scripts/sched-report "$dir/s.txt" 5 2 >/dev/null 2>&1
[ $? = 2 ] && ok "samples in the wrong order: exit 2" || bad "samples in the wrong order: not exit 2"
timeout 10 scripts/sched-report "$dir/none.txt" >/dev/null 2>&1
[ $? = 2 ] && ok "a missing file: exit 2" || bad "a missing file: not exit 2"
timeout 10 scripts/sched-sample --every x -- true >/dev/null 2>&1
[ $? = 2 ] && ok "sched-sample --every x: exit 2" || bad "sched-sample --every x: not exit 2"
echo "sched: $passed passed, $failed failed"
[ "$failed" = 0 ]
