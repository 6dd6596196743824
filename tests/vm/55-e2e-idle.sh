#!/usr/bin/env bash
# The idle cost: with a connection established and no traffic for 10 s, the CPU time used by
# both applications and both urdmads together (utime + stime from /proc, which includes
# every thread of each process) stays under IDLE_BOUND_PCT percent of one CPU.
#
# Bound: 25 % of one CPU for the four processes together, in this emulated VM.  The
# applications' helper threads sleep armed on an idle connection, woken only by trp's
# keep-alive (a probe or its answer every 2 s; measured: 0 ticks before the keep-alive).  Each
# urdmad sleeps on its af_packet ports' sockets and, with no handshake under way, wakes about
# ten times a second (docs/urdmad.md, "Idle cost"); under TCG a wake-up costs ~0.4 ms.  A
# design that spins costs 100 % per spinning thread, one that polls at 1 kHz per process
# ~40 % each here, so the bound still tells them apart.
set -u
. tests/e2e/lib.sh

BOUND_PCT=${IDLE_BOUND_PCT:-25}
prog=$(build_e2e cm_cases) || exit 1

cpu_ticks() {
	local p sum=0
	for p in "$@"; do
		sum=$((sum + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo $sum
}

declare -A b
bed_up
start_server B idle-server "listening" "$prog" server "$ADDR_B" 7900 hold
ip netns exec urdmaA "$prog" client "$ADDR_B" 7900 hold >"$OUT/idle-client.log" 2>&1 &
cpid=$!
for _ in $(seq 150); do grep -q ESTABLISHED "$OUT/idle-client.log" && break; sleep 0.2; done
grep -q ESTABLISHED "$OUT/idle-client.log" || fail "no connection: $(tail -n1 "$OUT/idle-client.log")"
sleep 2	# let the connection settle (handshake ACKs, back-off)
pids=("$SERVER_PID" "$cpid" "$(cat /run/urdma/bed/A.pid)" "$(cat /run/urdma/bed/B.pid)")
hz=$(getconf CLK_TCK)
t0=$(cpu_ticks "${pids[@]}")
for p in "${pids[@]}"; do b[$p]=$(cpu_ticks "$p"); done
s0=$(date +%s.%N)
sleep 10
t1=$(cpu_ticks "${pids[@]}")
s1=$(date +%s.%N)
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "process $p ended while idle"; done
pct=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s0="$s0" -v s1="$s1" 'BEGIN {printf "%.2f", 100 * (b - a) / hz / (s1 - s0)}')
echo "idle: applications + urdmads used $pct % of one CPU over $(awk -v a="$s0" -v b="$s1" 'BEGIN {printf "%.1f", b - a}') s (bound $BOUND_PCT %)"
for p in "${pids[@]}"; do
	echo "    $(cat "/proc/$p/comm") (pid $p): $(($(cpu_ticks "$p") - b[$p])) ticks of 1/$hz s"
done
awk -v p="$pct" -v b="$BOUND_PCT" 'BEGIN {exit !(p <= b)}' || fail "idle CPU $pct % is above the bound of $BOUND_PCT %"
kill "$cpid" "$SERVER_PID" 2>/dev/null
wait 2>/dev/null
dmesg_check
echo "PASS"
