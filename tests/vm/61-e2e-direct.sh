#!/usr/bin/env bash
# The direct path end to end (docs/urdmad.md, "The direct path"): the data-verifying
# workload (tests/e2e/verify.c) between the nodes, once with each connection on its own
# packet socket (the default) and once with every frame forwarded by urdmad
# (URDMA_BED_DIRECT=false). Both must move every byte right; on the direct path urdmad must
# forward no frame of a process (its port's `from_processes` stays 0, `conns_direct` counts
# every connection), through urdmad it must forward them all. And urdmad's own sockets must not
# take the direct connections' frames (its port filter, urdmad/src/portfilter.rs): node B's
# port receives less than a tenth of what it receives for the same work through urdmad.
# With threads blocked on completion channels (verify.c -e), urdma.ko's bell fires the
# receive CQ's event of the direct connections when a frame that completes a receive arrives
# (hw counter bell_events, docs/kernel-abi.md, "The bell"); for connections through urdmad,
# urdmad asks urdma.ko to fire it when such a frame reaches the ring. With threads busy-polling, the frames that come while one is
# in a call are left to it and wake no helper (hw counter bell_hushed, "The hush"). A frame
# left to the next call of a thread polling without pause wakes the helper when that call
# does not come in time (hw counter bell_late). An ACK that nobody waits for wakes nobody
# (hw counter bell_quiet). A process that connects again and again takes the socket it
# parked (daemon counter sockets_reused).
set -u
. tests/e2e/lib.sh

OPS=${DIRECT_OPS:-200}
prog=$(build_e2e verify) || exit 1
port=7600

counter() { # NODE KIND KEY: KEY of the node's first urdmad status record of KIND
	t "$BED" status --json "$1" | jq -r ".$2[0].$3"
}

# NODE: its port's rx_packets, conns_direct and conns_forwarded, from one status call
port_counters() {
	t "$BED" status --json "$1" | jq -r '.port[0] | "\(.rx_packets) \(.conns_direct) \(.conns_forwarded)"'
}

# run LABEL EXPECTED_PATH [VERIFY_ARGS...]: verify.c with 3 connections; node B's port must
# have handed all three to the server on EXPECTED_PATH (its conns_direct / conns_forwarded
# counters). Sets PORT_RX to the frames node B's port received meanwhile, BELLS to the
# events node B's bell fired, HUSHED to the frames it left to a thread in a call.
run() {
	local label=$1 want=$2 rc rx0 d0 f0 rx d f b0 h0
	shift 2
	read -r rx0 d0 f0 < <(port_counters B)
	b0=$(hw B bell_events)
	h0=$(hw B bell_hushed)
	port=$((port + 1))
	start_server B "direct-$label" "listening" "$prog" server "$ADDR_B" "$port" -s 7 -c 3 -t 600 "$@"
	t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -s 7 -c 3 -n "$OPS" -t 600 "$@" \
		>"$OUT/direct-$label-client.log" 2>&1
	rc=$?
	cat "$OUT/direct-$label-client.log"
	if [ $rc != 0 ]; then
		# what the other end saw comes first: a client's flushed requests follow from it
		echo "== the server's log, its end"
		tail -n 12 "$OUT/direct-$label.log"
		fail "verify client $label (exit $rc): $(grep -m1 FAIL "$OUT/direct-$label-client.log")"
	fi
	wait_server "direct-$label" 120
	grep -q "verify: ok server" "$OUT/direct-$label.log" || fail "verify server $label did not finish"
	read -r rx d f < <(port_counters B)
	BELLS=$(($(hw B bell_events) - b0))
	HUSHED=$(($(hw B bell_hushed) - h0))
	PORT_RX=$((rx - rx0))
	d=$((d - d0))
	f=$((f - f0))
	echo "$label: node B's connections: $d direct, $f forwarded through urdmad; its port received $PORT_RX frames; its bell fired $BELLS events and hushed $HUSHED frames"
	case $want in
	direct) [ "$d/$f" = 3/0 ] ;;
	urdmad) [ "$d/$f" = 0/3 ] ;;
	esac || fail "$label: $d connections took the direct path and $f went through urdmad, expected all 3 $want"
}

bed_up
for n in A B; do
	[ "$(counter "$n" port direct)" = true ] || fail "node $n's port offers no direct path: $(t "$BED" status --json "$n" | jq -c '.port[0]')"
done
run direct direct
direct_rx=$PORT_RX
[ "$BELLS" = 0 ] || fail "the bell fired $BELLS events for a workload that arms no CQ"
# verify.c's server busy-polls its CQs: most frames come while it is in ibv_poll_cq.
[ "$HUSHED" -gt 0 ] || fail "no frame of $OPS exchanges on 3 busy-polled connections was left to the polling thread"
run bell direct -e 2
# The bell fires for a Send or a Write with Immediate that finds the receive CQ armed (the
# rest find a thread draining it); which of verify's mixed operations do depends on timing.
[ "$BELLS" -gt 0 ] || fail "the bell fired no event for $OPS exchanges on 3 connections waited for on channels"

# lat.c's mem-write: each side's calls (a Write, a poll of its send CQ) end before it waits on
# its memory for the peer's Write. Every call taken for a steady poll (URDMA_STEADY_CALLS) whose
# next call is due within 50 ms (URDMA_STEADY_GAP_US) leaves that Write to a call that does not
# come; the helper neither looks on its own for 2 s (URDMA_APP_ACTIVE_US) nor spins on its
# sockets (URDMA_SPIN_ROUNDS). Only urdma.ko's timer brings such a Write to its target, up to
# 50 ms late; one that comes after the time given wakes the helper at once.
export URDMA_STEADY_CALLS=0 URDMA_STEADY_GAP_US=50000 URDMA_APP_ACTIVE_US=2000000 URDMA_SPIN_ROUNDS=1
lat=$(build_e2e lat) || exit 1
# mem_write LABEL N: lat.c's mem-write, N exchanges from node A to node B.
mem_write() {
	port=$((port + 1))
	start_server B "$1" "lat server listening" "$lat" server "$ADDR_B" "$port" -p mem-write -n "$2" -t 60
	t ip netns exec urdmaA "$lat" client "$ADDR_B" "$port" -p mem-write -n "$2" -t 60 \
		>"$OUT/$1-client.log" 2>&1 || fail "lat mem-write ($1): $(tail -n1 "$OUT/$1-client.log")"
	cat "$OUT/$1-client.log"
	wait_server "$1" 60
}
sleep 3	# the counters lag the traffic before
late0=$(hw_sum bell_late)
mem_write late 20
# 60 Writes, the later ones each left to a call that does not come (some come when the
# receiver's time is up already, and wake its helper at once).
hw_above bell_late $((late0 + 10)) "60 Writes, each to a side waiting on its memory"
unset URDMA_STEADY_CALLS URDMA_STEADY_GAP_US URDMA_APP_ACTIVE_US URDMA_SPIN_ROUNDS

# The same with the provider's own timing: a side whose answer takes longer than trp's ACK
# hold sends its ACK alone, and the initiator, whose unsignaled Write needs no ACK soon, said
# that such an ACK can wait: urdma.ko wakes nobody for it (hw counter bell_quiet). Under
# emulation an answer takes about a millisecond, ten times the hold.
quiet0=$(hw_sum bell_quiet)
mem_write quiet 50
hw_above bell_quiet "$quiet0" "120 Writes, each answered by a Write"

# A process's sockets serve its next connections (docs/urdmad.md, "The direct path"): in 20
# connect-message-disconnect cycles between one client and one server, each side's later
# connections take the socket its process parked.
reused() { counter "$1" daemon sockets_reused; }
reused_a=$(reused A)
reused_b=$(reused B)
port=$((port + 1))
start_server B cycles "lat server listening" "$lat" server "$ADDR_B" "$port" -p connect -n 20 -t 120
t ip netns exec urdmaA "$lat" client "$ADDR_B" "$port" -p connect -n 20 -t 120 \
	>"$OUT/cycles-client.log" 2>&1 || fail "lat connect: $(tail -n1 "$OUT/cycles-client.log")"
cat "$OUT/cycles-client.log"
wait_server cycles 60
reused_a=$(($(reused A) - reused_a))
reused_b=$(($(reused B) - reused_b))
echo "20 connection cycles: $reused_a connections on node A and $reused_b on node B took a parked socket"
[ "$reused_a" -ge 15 ] && [ "$reused_b" -ge 15 ] ||
	fail "of 20 connection cycles, $reused_a on node A and $reused_b on node B took a parked socket"

for n in A B; do
	fp=$(counter "$n" port from_processes)
	echo "node $n: from_processes=$fp"
	[ "$fp" = 0 ] || fail "node $n's urdmad forwarded $fp frames of processes on the direct path"
done
bed_down
trap - EXIT

export URDMA_BED_DIRECT=false
bed_up
run viad-bell urdmad -e 2
[ "$BELLS" -gt 0 ] || fail "the bell fired no event for $OPS exchanges on 3 connections through urdmad waited for on channels"
[ "$HUSHED" = 0 ] || fail "the bell hushed $HUSHED frames of connections through urdmad"
run viad urdmad
for n in A B; do
	fp=$(counter "$n" port from_processes)
	echo "node $n: from_processes=$fp"
	[ "${fp:-0}" -gt 0 ] || fail "node $n's urdmad forwarded no frame with the direct path off"
done
[ $((direct_rx * 10)) -lt "$PORT_RX" ] ||
	fail "node B's port received $direct_rx frames on the direct path, $PORT_RX through urdmad"
dmesg_check
echo "PASS"
