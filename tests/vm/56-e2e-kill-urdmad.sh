#!/usr/bin/env bash
# kill -9 of a node's urdmad in the middle of a transfer: its applications get errors, not a
# hang, the peer's application sees its connection die, and once urdmad is back new
# connections work, while a process that had attached to the dead urdmad is still alive.
#
# The bound (KILL_BOUND, 30 s) for both applications to end: node B's provider sees its
# control socket close at once (its helper thread polls it while traffic flows and sleeps on
# it otherwise) and fails every QP; node A's connection fails when trp's retransmissions run
# out (7 timeouts and at least trp's min_give_up, 10 s, since the first: 10-11 s) or, when
# the kill caught it with all its packets acknowledged and only waiting for node B's reply,
# when its keep-alive probes (sent after trp's keepalive, 2 s, of silence) go unanswered as
# long: up to 12.5 s; the rest is slack for the emulated VM.
# urdmad's death also removes the urdma device (its TAP goes with it), which revokes the
# objects of the processes still holding it: the holder sees IBV_EVENT_DEVICE_FATAL.
# vm-timeout: 900
# vm-bed: shared
set -u
. tests/e2e/lib.sh

BOUND=${KILL_BOUND:-30}	# seconds a survivor may take to notice
prog=$(build_e2e verify) || exit 1
holder=$(build_e2e holder) || exit 1
port=7700

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

# A process of node B that holds a QP (so it is attached to urdmad) and outlives urdmad.
start_server B holder "holding" "$holder" urdmaB 600
hpid=$SERVER_PID

# kill -9 of node B's urdmad mid-transfer
port=$((port + 1))
start_server B kill-urdmad "listening" "$prog" server "$ADDR_B" "$port" -n 1000000 -t 600
ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n 1000000 -t 600 >"$OUT/kill-urdmad-client.log" 2>&1 &
cpid=$!
wait_connected A 1
wait_connected B 1
kill -0 "$cpid" 2>/dev/null || fail "client ended early: $(tail -n1 "$OUT/kill-urdmad-client.log")"
kill -0 "$SERVER_PID" 2>/dev/null || fail "server ended early: $(tail -n1 "$OUT/kill-urdmad.log")"
upid=$(cat /run/urdma/bed/B.pid) || fail "no pid file for node B's urdmad"
start=$SECONDS
kill -9 "$upid"
for _ in $(seq $((BOUND * 5))); do
	kill -0 "$cpid" 2>/dev/null || kill -0 "$SERVER_PID" 2>/dev/null || break
	sleep 0.2
done
kill -0 "$SERVER_PID" 2>/dev/null && fail "node B's application still running ${BOUND}s after its urdmad was killed"
kill -0 "$cpid" 2>/dev/null && fail "node A's application still running ${BOUND}s after the peer's urdmad was killed"
wait "$SERVER_PID" && fail "node B's application succeeded without its urdmad"
wait "$cpid" && fail "node A's application succeeded without its peer's urdmad"
echo "urdmad killed: both applications ended after $((SECONDS - start)) s"
echo "  node B: $(tail -n1 "$OUT/kill-urdmad.log")"
echo "  node A: $(tail -n1 "$OUT/kill-urdmad-client.log")"
for _ in $(seq $((BOUND * 5))); do
	grep -q "async event: local catastrophic error" "$OUT/holder.log" && break
	sleep 0.2
done
grep -q "async event: local catastrophic error" "$OUT/holder.log" ||
	fail "the holder saw no IBV_EVENT_DEVICE_FATAL: $(tail -n1 "$OUT/holder.log")"
kill -0 "$hpid" 2>/dev/null || fail "the holder ended: $(tail -n1 "$OUT/holder.log")"

# urdmad back, the holder still alive: new processes attach and connect
if ! t "$BED" restart B >"$OUT/bed-restart.log" 2>&1; then
	ls -l "/proc/$hpid/fd" 2>/dev/null | grep -E "dpdk|huge" | sed 's/^/  holder: /'
	fail "scripts/bed restart B: $(tail -n1 "$OUT/bed-restart.log")"
fi
port=$((port + 1))
start_server B after-restart "listening" "$prog" server "$ADDR_B" "$port" -t 300
out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n 200 -t 300 2>&1) ||
	fail "a new connection after urdmad's restart: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
wait_server after-restart 60
kill -0 "$hpid" 2>/dev/null || fail "the holder ended before the new connection was done: $(tail -n1 "$OUT/holder.log")"
echo "after urdmad's restart: a new connection works; the holder: $(grep -c . "$OUT/holder.log") lines, alive"
grep "create_qp after" "$OUT/holder.log" | grep -q succeeded && fail "the holder created a QP on the removed device"
kill "$hpid"
wait "$hpid" 2>/dev/null

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
