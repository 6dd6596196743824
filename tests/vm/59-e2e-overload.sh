#!/usr/bin/env bash
# Overload: PROCS pairs of processes run the data-verifying workload (tests/e2e/verify.c) at
# once, each pair with CONNS connections between a client on node A and a server on node B,
# over flow and TX rings of only 16 frames (URDMA_BED_RING_SIZE) against trp's window of
# 1,024 segments. Expected: every pair finishes with every byte and completion right, and
# afterwards no QP, flow or ring is left on either node. (Before the provider kept to its TX
# ring's room and took its QPs in turn, the last QPs of a process never got a frame out and
# their peers gave up.)
#
# Then the work runs a second time, the first pair's 30 times as large, with that pair's
# receiver stopped (SIGSTOP, nothing of it runs, not even the provider's progress thread) for
# OVERLOAD_STALL seconds (3; 0: no second run) once all its connections carry traffic, while
# the others run. What comes for it fills its connections' receive rings (on the direct
# path, the kernel drops into each socket's own ring; through urdmad, its flow rings), and
# node B's urdmad counts the drops. Expected:
# the other pairs finish in about the baseline's time, the stopped receiver's drops show in
# urdmad's status, and TRP recovers them once it runs again (a stop stays below trp's
# give-up time, 10 s, with room for a busy host: a 5-s stop once lasted 8 s there, and the
# stopped receiver's peer gave up before it had run again).
#
# Reduced (the default): 4 pairs x 8 connections x 30 operations (the stalled phase's slow
# pair 30 times as many). The full case, as large as the test VM's two emulated vCPUs carry
# (the guest sees only the environment the command gives it; docs/reliability.md, "The full
# case", has what 8 x 32 and polling do there):
#   scripts/vm --timeout 1500 -- env OVERLOAD_PROCS=8 OVERLOAD_CONNS=12 OVERLOAD_OPS=100 \
#     OVERLOAD_EVENTS=1 OVERLOAD_MAXSIZE=4096 OVERLOAD_LIMIT=600 URDMA_VM_TEST_TIMEOUT=1350 \
#     tests/vm/run-all 59-e2e-overload
# OVERLOAD_EVENTS is verify.c's -e, both sides: threads per connection that wait for its
# CQ's events (0, the default: each connection's thread spins on its CQ, which at 8 x 32
# makes 512 spinning threads on the test VM's two vCPUs).
# OVERLOAD_MAXSIZE is verify.c's largest message (-m, both sides; 65536 by default). Its
# memory grows with it: about 12 MiB per connection on each side at 64 KiB (a region of
# 2 x 64 messages, its shadow, the slots), some 6 GB for 8 x 32 connections, which ended in
# the test VM's OOM killer; at 4 KiB the full case fits the VM's 2 GB.
# vm-timeout: 1500
set -u
. tests/e2e/lib.sh

PROCS=${OVERLOAD_PROCS:-4}
CONNS=${OVERLOAD_CONNS:-8}
OPS=${OVERLOAD_OPS:-30}
STALL=${OVERLOAD_STALL:-3}
LIMIT=${OVERLOAD_LIMIT:-600}	# seconds a phase may take
MAXSIZE=${OVERLOAD_MAXSIZE:-65536}
EVENTS=${OVERLOAD_EVENTS:-0}	# verify.c's -e: threads per connection waiting on its CQ's events (0: it polls)
STACK=${OVERLOAD_STACK:-urdma}
case "$STACK" in
urdma) SRV_NODE=B CLI=(ip netns exec urdmaA) ;;
rxe) SRV_NODE=host CLI=() STALL=0 ;;
*) fail "OVERLOAD_STACK=$STACK: urdma or rxe" ;;
esac
prog=$(build_e2e verify) || exit 1
port=7800
export URDMA_BED_RING_SIZE=${URDMA_BED_RING_SIZE:-16}
# Each process's log says how every connection ended (a failure with trp's figures, or a
# close), so that a failed run shows which end gave up first and why.
export URDMA_LOG=${URDMA_LOG:-info}

# The drops node B's urdmad counts on the flows of the process with pid $1 (while it runs).
flow_drops() {
	local n
	n=$("$BED" status --json B | jq -r --argjson pid "$1" '
		[.process // [] | .[] | select(.pid == $pid) | .client] as $c |
		[.flow // [] | .[] | select(.client == $c[0]) | .drops] | add // 0')
	echo "${n:-0}"
}

# The flows node B's urdmad has open for the process with pid $1.
proc_flows() {
	"$BED" status --json B 2>/dev/null | jq -r --argjson pid "$1" '.process // [] | .[] | select(.pid == $pid) | .flows'
}

# The operations per connection of pair $1 in phase $2: in the stalled phase the slow pair
# (1) has more to do, so that it is still at it when it is stopped (with 4 times the others'
# work, it once finished right after its first stop, which then fell where nothing was in
# flight for it; with 10 times, once the data path had become faster, it finished before the
# status reads that wait for its connections had seen them all). In the baseline, where
# nothing is stopped, it does what the others do: the baseline measures the others' time,
# its long run alone after theirs (56 s of the phase's 107 here) added nothing to that, and
# the stalled phase runs the long work, stop and all. Its server is told the same count.
pair_ops() {
	if [ "$1" = 1 ] && [ "$2" = 1 ]; then echo $((OPS * 30)); else echo "$OPS"; fi
}

# phase NAME STALLED: every pair at once; with STALLED=1 the first server stops for a while.
# Sets OTHERS_S to the seconds until the last of the other pairs' clients finished.
phase() {
	local name=$1 stalled=$2 i spids=() cpids=() start t_conn slow_pid p
	SLOW_DROPS=0
	for i in $(seq "$PROCS"); do
		start_server "$SRV_NODE" "overload-$name-s$i" "listening" "$prog" server "$ADDR_B" "$((port + i))" \
			-c "$CONNS" -n "$(pair_ops "$i" "$stalled")" -s "$i" -m "$MAXSIZE" -t "$LIMIT" -e "$EVENTS"
		spids+=("$SERVER_PID")
	done
	start=$SECONDS
	for i in $(seq "$PROCS"); do
		"${CLI[@]}" "$prog" client "$ADDR_B" "$((port + i))" -c "$CONNS" -n "$(pair_ops "$i" "$stalled")" \
			-s "$i" -m "$MAXSIZE" -t "$LIMIT" -e "$EVENTS" >"$OUT/overload-$name-c$i.log" 2>&1 &
		cpids+=("$!")
	done
	port=$((port + PROCS))
	slow_pid=${spids[0]}
	# The slow receiver stops once all of its connections carry traffic (one stopped while
	# its connections are still being made is a case of its own).
	if [ "$stalled" = 1 ]; then
		until [ "$(proc_flows "$slow_pid")" -ge "$CONNS" ] 2>/dev/null; do
			kill -0 "$slow_pid" 2>/dev/null || fail "$name: the slow receiver ended before it was stopped"
			[ $((SECONDS - start)) -lt "$LIMIT" ] || fail "$name: the slow receiver's connections not made"
			sleep 0.2
		done
		sleep 1
		# A stop that falls where its peers send nothing (each waits for the receiver's
		# answer to a batch) drops nothing: stop again, up to three times, until one does.
		STOPS=0
		SLOW_DROPS=0
		while [ "$STOPS" -lt 3 ] && [ "$SLOW_DROPS" = 0 ] && kill -0 "$slow_pid" 2>/dev/null; do
			kill -STOP "$slow_pid"
			# The drops are read while the receiver is stopped: its flows, and their
			# counters, go as soon as it has finished, which it may do right after the stop.
			# A status request takes seconds here, so a sampler runs beside the stop rather
			# than lengthen it, and keeps the largest count it read.
			: >"$OUT/overload-drops"
			touch "$OUT/overload-stopped"
			(
				while [ -e "$OUT/overload-stopped" ]; do
					flow_drops "$slow_pid" >>"$OUT/overload-drops"
					sleep 0.5
				done
			) &
			local sampler=$! stopped_at=$SECONDS
			sleep "$STALL"
			rm -f "$OUT/overload-stopped"
			kill -CONT "$slow_pid"
			local stopped_s=$((SECONDS - stopped_at))
			wait "$sampler"
			STOPS=$((STOPS + 1))
			SLOW_DROPS=$(sort -n "$OUT/overload-drops" | tail -n1)
			SLOW_DROPS=${SLOW_DROPS:-0}
			echo "  stop $STOPS: ${stopped_s}s, $(wc -l <"$OUT/overload-drops") status reads, drops $SLOW_DROPS"
			[ "$SLOW_DROPS" = 0 ] && sleep 2
		done
	fi
	while :; do
		local running=0
		for p in "${cpids[@]:1}"; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
		[ "$running" = 0 ] && break
		[ $((SECONDS - start)) -lt "$LIMIT" ] || {
			dump_stuck verify "${cpids[1]}"
			fail "$name: $running client(s) still running after ${LIMIT}s (their state: stuck.log)"
		}
		sleep 0.2
	done
	OTHERS_S=$((SECONDS - start))
	for i in $(seq "$PROCS"); do
		p=${cpids[$((i - 1))]}
		t_conn=$SECONDS
		while kill -0 "$p" 2>/dev/null; do
			[ $((SECONDS - t_conn)) -lt "$LIMIT" ] || fail "$name: client $i did not finish"
			sleep 0.2
		done
		wait "$p" || {
			# the ports' and processes' counters (socket and ring drops) as the run failed
			[ "$STACK" = urdma ] && for n in A B; do
				t "$BED" status "$n" >"$OUT/overload-$name-status-$n.txt" 2>&1
			done
			fail "$name: client $i: $(grep -m1 FAIL "$OUT/overload-$name-c$i.log" || tail -n1 "$OUT/overload-$name-c$i.log")"
		}
		grep -q "verify: ok client $CONNS connections" "$OUT/overload-$name-c$i.log" ||
			fail "$name: client $i did not report success"
		SERVER_PID=${spids[$((i - 1))]}
		wait_server "overload-$name-s$i" 120
		grep -q "verify: ok server" "$OUT/overload-$name-s$i.log" || fail "$name: server $i did not finish"
	done
}

if [ "$STACK" = urdma ]; then
	bed_up
	DEV_A=urdmaA DEV_B=urdmaB
else
	# rxe0 and rxe1 on a veth pair (scripts/klink.sh)
	. scripts/klink.sh
	trap 'kill -9 $(jobs -p) 2>/dev/null; kstack_down rxe ovl-kva ovl-kvb >/dev/null 2>&1' EXIT
	kstack_up rxe ovl-kva ovl-kvb 10.78.0.1 10.78.0.2 || fail "cannot set rxe up on a veth pair"
	ADDR_B=10.78.0.2
	DEV_A=rxe0 DEV_B=rxe1
	dmesg_mark
fi
before_a=$(res_counts "$DEV_A")
before_b=$(res_counts "$DEV_B")
echo "overload ($STACK): $PROCS pairs of processes x $CONNS connections x $OPS operations, all at once"

phase baseline 0
base_s=$OTHERS_S
echo "  pairs 2-$PROCS done in ${base_s}s, pair 1 too, every byte right"

if [ "$STALL" -gt 0 ]; then
	phase stalled 1
	stall_s=$OTHERS_S
	echo "  stalled: pairs 2-$PROCS done in ${stall_s}s, pair 1's receiver stopped $STOPS x ${STALL}s;" \
		"its flows' drops at node B: $SLOW_DROPS; pair 1 finished right after, every byte right"
	# One stopped receiver must not hold the others up: they finish within twice the
	# baseline (emulation's noise) plus the stops.
	[ "$stall_s" -le $((2 * base_s + STOPS * (STALL + 2) + 1)) ] ||
		fail "the other pairs took ${stall_s}s with a stalled receiver, ${base_s}s without"
	[ "$SLOW_DROPS" -gt 0 ] || fail "no drops counted for the stalled receiver's flows"
fi

for n in A B; do
	[ "$STACK" = urdma ] || break
	flows=$("$BED" status --json "$n" | jq -r '.daemon[0].flows')
	for _ in $(seq 150); do
		[ "$flows" = 0 ] && break
		sleep 0.2
		flows=$("$BED" status --json "$n" | jq -r '.daemon[0].flows')
	done
	[ "$flows" = 0 ] || fail "urdmad of node $n still has $flows flows"
done
wait_res "$DEV_A" "$before_a" 60
wait_res "$DEV_B" "$before_b" 60
dmesg_check
echo "PASS"
