#!/usr/bin/env bash
# rdma_cm over urdma as librdmacm applications see it (tests/e2e/cm_cases.c): a reject
# with private data, nobody listening, an unreachable peer, disconnect from either side,
# a client that exits as soon as it has a message (the sender's Send succeeds), or
# disconnects and exits (the process stays until the close is over), a port
# already listened on, several connections to one listening port, and 16 clients
# connecting to one server at once (tests/e2e/connrate.c, CM_STORMS runs of 3 cycles each:
# every connection must be accepted, whatever order urdmad meets a QP's line and its
# kernel message in; CI: 3, --full: 20).
# vm-bed: shared
set -u
. tests/e2e/lib.sh

prog=$(build_e2e cm_cases) || exit 1
port=7500

# case_pair LABEL SERVER_SCENARIO [PDATA] -- CLIENT_SCENARIO [PDATA]
case_pair() {
	local label=$1 s=() c=() out
	shift
	while [ $# -gt 0 ] && [ "$1" != -- ]; do s+=("$1"); shift; done
	shift
	c=("$@")
	port=$((port + 1))
	start_server B "cm-$label" "listening|ok" "$prog" server "$ADDR_B" "$port" "${s[@]}"
	out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" "${c[@]}" 2>&1)
	rc=$?
	echo "$out"
	[ $rc = 0 ] || fail "$label: client: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
	wait_server "cm-$label" 60
	echo "$label: ok"
}

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

# an address that resolves (a permanent neighbour entry) but never answers: UNREACHABLE once
# urdmad's handshake gives up (about a minute), which runs beside the other cases and is
# judged after them
t ip -n urdmaA neigh replace 10.77.0.9 lladdr 02:00:00:00:00:09 dev urdma-tapA nud permanent ||
	fail "cannot add a neighbour entry"
(
	start=$SECONDS
	t ip netns exec urdmaA "$prog" client 10.77.0.9 7598 unreachable -t 120
	rc=$?
	echo "after $((SECONDS - start)) s"
	exit "$rc"
) >"$OUT/cm-unreachable.log" 2>&1 &
unreachable=$!

case_pair reject reject "not today" -- rejected "not today"
case_pair disconnect-by-server disconnect -- wait
case_pair disconnect-by-client wait -- disconnect
# the client exits the moment its receive completes, before its ACK can leave: urdmad's
# Abort for the dead process says what it received, and the server's Send succeeds
case_pair exit-on-recv send -- exit-on-recv
# the client disconnects (and destroys its QP) the moment its receive completes and calls
# exit(): the process stays until its connection's close is over, so no flow of it is left
# for urdmad to drop
dropped() { grep -c "process released.*flows=[1-9]" /run/urdma/bed/A.log; }
for c in disconnect-on-recv close-on-recv; do
	before=$(dropped)
	case_pair "$c" send -- "$c"
	[ "$(dropped)" = "$before" ] ||
		fail "$c: the client exited before its connection's close was over: $(grep "process released" /run/urdma/bed/A.log | tail -n1)"
done

# nobody listens on the port: REJECTED (after urdmad's grace for a listener, cm::LISTEN_GRACE)
out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" 7599 rejected 2>&1) ||
	fail "no listener: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
echo "no listener: ok"

# a second listener on the same port
out=$(t ip netns exec urdmaB "$prog" server "$ADDR_B" 7597 twice 2>&1) ||
	fail "port in use: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
echo "port in use: ok"

# several connections to one port, with data
verify=$(build_e2e verify) || exit 1
start_server B "cm-many" "listening" "$verify" server "$ADDR_B" 7596 -c 8 -t 300
out=$(t ip netns exec urdmaA "$verify" client "$ADDR_B" 7596 -c 8 -n 100 -t 300 2>&1) ||
	fail "8 connections to one port: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
wait_server cm-many 60
echo "8 connections to one port: ok"

# 16 clients at once, each connect-message-disconnect 3 times
connrate=$(build_e2e connrate) || exit 1
for i in $(seq "${CM_STORMS:-3}"); do
	start_server B "cm-storm-$i" "connrate server listening" "$connrate" server "$ADDR_B" 7595 -c 16 -n 3 -t 120
	out=$(t ip netns exec urdmaA "$connrate" client "$ADDR_B" 7595 -c 16 -n 3 -t 120 2>&1) ||
		fail "16 clients at once, run $i: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out"); server: $(grep -m1 FAIL "$OUT/cm-storm-$i.log")"
	wait_server "cm-storm-$i" 60
	grep -q "connrate server done" "$OUT/cm-storm-$i.log" || fail "16 clients at once, run $i: the server did not finish"
done
echo "16 clients at once, ${CM_STORMS:-3} runs: ok $(tail -n1 <<<"$out")"

wait "$unreachable" ||
	fail "unreachable peer: $(grep -m1 FAIL "$OUT/cm-unreachable.log" || tail -n2 "$OUT/cm-unreachable.log" | head -n1)"
echo "unreachable: ok $(tail -n1 "$OUT/cm-unreachable.log")"

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
