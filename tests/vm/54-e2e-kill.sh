#!/usr/bin/env bash
# kill -9 of either application in the middle of a transfer: the survivor sees error
# completions or DISCONNECTED within a bound, urdmad reclaims the dead process's flows and
# rdma resource counts return to their baseline on both nodes.  (Killing a node's urdmad is
# 56-e2e-kill-urdmad.sh.)
# vm-bed: shared
set -u
. tests/e2e/lib.sh

BOUND=${KILL_BOUND:-30}	# seconds a survivor may take to notice
prog=$(build_e2e verify) || exit 1
port=7700

# kill_app VICTIM(client|server)
kill_app() {
	local victim=$1 cpid start
	port=$((port + 1))
	start_server B "kill-$victim" "listening" "$prog" server "$ADDR_B" "$port" -n 1000000 -t 600
	ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n 1000000 -t 600 >"$OUT/kill-$victim-client.log" 2>&1 &
	cpid=$!
	wait_connected A 1
	wait_connected B 1
	kill -0 "$cpid" 2>/dev/null || fail "$victim: client ended early: $(tail -n1 "$OUT/kill-$victim-client.log")"
	kill -0 "$SERVER_PID" 2>/dev/null || fail "$victim: server ended early"
	start=$SECONDS
	if [ "$victim" = client ]; then
		kill -9 "$cpid"
		wait "$cpid" 2>/dev/null
		# the server fails (error completion or DISCONNECTED) and exits
		for _ in $(seq $((BOUND * 5))); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
		kill -0 "$SERVER_PID" 2>/dev/null && fail "server still waiting ${BOUND}s after its peer was killed"
		wait "$SERVER_PID" 2>/dev/null
		echo "client killed: server noticed after $((SECONDS - start)) s: $(tail -n1 "$OUT/kill-$victim.log")"
	else
		kill -9 "$SERVER_PID"
		wait "$SERVER_PID" 2>/dev/null
		for _ in $(seq $((BOUND * 5))); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.2; done
		kill -0 "$cpid" 2>/dev/null && fail "client still waiting ${BOUND}s after its peer was killed"
		wait "$cpid" 2>/dev/null
		echo "server killed: client noticed after $((SECONDS - start)) s: $(tail -n1 "$OUT/kill-$victim-client.log")"
	fi
}

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

kill_app client
wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
kill_app server
wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
# urdmad reclaims a dead process's flows once it sees the process's socket close, in its own time
flows_of() { "$BED" status --json "$1" | jq -r '.daemon[0].flows'; }
no_flows() { [ "$(flows_of "$1")" = 0 ]; }
for n in A B; do
	wait_for 10 "node $n's urdmad to have no flows" no_flows "$n"
	flows=$(flows_of "$n")
	[ "$flows" = 0 ] || fail "urdmad of node $n still has $flows flows"
done

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
