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
#
# A second connection's client blocks in ibv_get_cq_event, its receive CQ armed
# (cm_cases hold-cq): over the same 10 s that process uses at most CHAN_BOUND_PCT percent
# of one CPU (its helper wakes for trp's keep-alive only), and the thread blocked on the
# channel is not woken at all (its voluntary context switches do not grow): nothing
# arrives, so no event may come.
# vm-bed: shared
set -u
. tests/e2e/lib.sh

BOUND_PCT=${IDLE_BOUND_PCT:-25}
CHAN_BOUND_PCT=${IDLE_CHAN_BOUND_PCT:-3}
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
srv_hold=$SERVER_PID
start_server B idle-server-cq "listening" "$prog" server "$ADDR_B" 7901 hold
srv_cq=$SERVER_PID
ip netns exec urdmaA "$prog" client "$ADDR_B" 7901 hold-cq >"$OUT/idle-client-cq.log" 2>&1 &
qpid=$!
for _ in $(seq 150); do grep -q "waiting on the completion channel" "$OUT/idle-client-cq.log" && break; sleep 0.2; done
grep -q "waiting on the completion channel" "$OUT/idle-client-cq.log" ||
	fail "the channel client did not get to wait: $(tail -n1 "$OUT/idle-client-cq.log")"
sleep 2	# let the connections settle (handshake ACKs, back-off)
pids=("$srv_hold" "$cpid" "$(cat /run/urdma/bed/A.pid)" "$(cat /run/urdma/bed/B.pid)")
switches() { awk '/^voluntary_ctxt_switches/ {print $2}' "/proc/$1/task/$1/status"; }
q0=$(cpu_ticks "$qpid")
w0=$(switches "$qpid")
hz=$(getconf CLK_TCK)
t0=$(cpu_ticks "${pids[@]}")
for p in "${pids[@]}"; do b[$p]=$(cpu_ticks "$p"); done
s0=$(date +%s.%N)
sleep 10
t1=$(cpu_ticks "${pids[@]}")
s1=$(date +%s.%N)
q1=$(cpu_ticks "$qpid")
w1=$(switches "$qpid")
for p in "${pids[@]}" "$qpid"; do kill -0 "$p" 2>/dev/null || fail "process $p ended while idle: $(tail -n1 "$OUT/idle-client-cq.log")"; done
pct=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s0="$s0" -v s1="$s1" 'BEGIN {printf "%.2f", 100 * (b - a) / hz / (s1 - s0)}')
echo "idle: applications + urdmads used $pct % of one CPU over $(awk -v a="$s0" -v b="$s1" 'BEGIN {printf "%.1f", b - a}') s (bound $BOUND_PCT %)"
for p in "${pids[@]}"; do
	echo "    $(cat "/proc/$p/comm") (pid $p): $(($(cpu_ticks "$p") - b[$p])) ticks of 1/$hz s"
done
awk -v p="$pct" -v b="$BOUND_PCT" 'BEGIN {exit !(p <= b)}' || fail "idle CPU $pct % is above the bound of $BOUND_PCT %"
qpct=$(awk -v a="$q0" -v b="$q1" -v hz="$hz" -v s0="$s0" -v s1="$s1" 'BEGIN {printf "%.2f", 100 * (b - a) / hz / (s1 - s0)}')
echo "idle: the client blocked in ibv_get_cq_event used $qpct % of one CPU ($((q1 - q0)) ticks; bound $CHAN_BOUND_PCT %), its waiting thread was woken $((w1 - w0)) times"
awk -v p="$qpct" -v b="$CHAN_BOUND_PCT" 'BEGIN {exit !(p <= b)}' ||
	fail "the client blocked in ibv_get_cq_event used $qpct % of one CPU, above $CHAN_BOUND_PCT %"
[ "$w1" = "$w0" ] || fail "the thread blocked in ibv_get_cq_event was woken $((w1 - w0)) times with nothing sent"
kill "$cpid" "$qpid" "$srv_hold" "$srv_cq" 2>/dev/null
wait 2>/dev/null
dmesg_check
echo "PASS"
