#!/usr/bin/env bash
# kill -9 of a node's urdmad in the middle of a transfer: its applications get errors, not
# a hang, and once urdmad is back new connections work.
#
# NOT YET PASSING: node B's application does not notice within the bound that its urdmad is
# gone.  tests/vm/run-all does not run it yet:
#   scripts/vm --out out/pending -- bash tests/e2e/pending/54-e2e-kill-urdmad.sh
set -u
. tests/e2e/lib.sh

BOUND=${KILL_BOUND:-30}	# seconds a survivor may take to notice
prog=$(build_e2e verify) || exit 1
port=7700

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

# kill -9 of node B's urdmad mid-transfer, then a restart and a new connection
port=$((port + 1))
start_server B kill-urdmad "listening" "$prog" server "$ADDR_B" "$port" -n 1000000 -t 600
ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n 1000000 -t 600 >"$OUT/kill-urdmad-client.log" 2>&1 &
cpid=$!
wait_connected A 1
wait_connected B 1
upid=$(cat /run/urdma/bed/B.pid) || fail "no pid file for node B's urdmad"
start=$SECONDS
kill -9 "$upid"
for _ in $(seq $((BOUND * 5))); do
	kill -0 "$cpid" 2>/dev/null || kill -0 "$SERVER_PID" 2>/dev/null || break
	sleep 0.2
done
kill -0 "$SERVER_PID" 2>/dev/null && fail "node B's application still running ${BOUND}s after its urdmad was killed"
kill -0 "$cpid" 2>/dev/null && fail "node A's application still running ${BOUND}s after the peer's urdmad was killed"
wait
echo "urdmad killed: both applications ended after $((SECONDS - start)) s"
t "$BED" restart B >"$OUT/bed-restart.log" 2>&1 || fail "scripts/bed restart B: $(tail -n1 "$OUT/bed-restart.log")"
port=$((port + 1))
start_server B after-restart "listening" "$prog" server "$ADDR_B" "$port" -t 300
out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n 200 -t 300 2>&1) ||
	fail "a new connection after urdmad's restart: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
wait_server after-restart 60
echo "after urdmad's restart: a new connection works"
wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
