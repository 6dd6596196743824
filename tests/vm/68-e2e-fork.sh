#!/usr/bin/env bash
# fork() after the process attached to urdmad (tests/e2e/fork.c): the pattern of servers that
# fork a worker per client and of test harnesses (rdma-core's own suite) that fork both ends
# of a connection after earlier tests made QPs.
#
# A client on node A connects to an echo server on node B and exchanges messages, then
# forks. The child finds the parent's QP not its own (ibv_post_send fails), makes a
# connection of its own and exchanges messages over it while the parent goes on over its
# connection; after the child has exited, and after a second child that exits at once,
# the parent's connection still works.
# Expected: every echo is byte for byte what was sent, the server counts exactly the
# messages of both connections, and both nodes' resources go back to what they were.
# vm-bed: shared
set -u
. tests/e2e/lib.sh

port=8310
msgs=50
prog=$(build_e2e fork) || exit 1

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

start_server B fork-server "listening" "$prog" server "$ADDR_B" "$port" -c 2 -t 240
out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n "$msgs" -t 180 2>&1) ||
	fail "client: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
echo "$out"
grep -q "^fork: ok child sent=$msgs\$" <<<"$out" || fail "the child did not finish"
grep -q "^fork: ok client sent=$((3 * msgs))\$" <<<"$out" || fail "the parent did not finish"
wait_server fork-server 120
cat "$OUT/fork-server.log"
grep -q "^fork: server ok conns=2 msgs=$((4 * msgs))\$" "$OUT/fork-server.log" ||
	fail "the server did not count both connections' messages"

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
