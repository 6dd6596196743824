#!/usr/bin/env bash
# Shared receive queues between the nodes (tests/e2e/srq.c, and perftest's --use-srq).
#
# 1. A server on node B serves SRQ_CONNS connections from node A on one SRQ of 16 receives,
#    its limit armed at 8: it posts consumed receives again only after
#    IBV_EVENT_SRQ_LIMIT_REACHED, so every refill waits for the event. One client moves its
#    QP to the error state part-way. Expected: every receive completes successfully with the
#    bytes its client sent, in order per connection (the failed QP flushed none of the SRQ's
#    receives, which the others went on using); the number of receives is what the clients
#    sent; the limit event came for every refill; the SRQ is destroyed once its QPs are.
# 2. ib_send_bw and ib_send_lat --use-srq, unmodified, with rdma_cm, node A to node B.
# vm-bed: shared
set -u
. tests/e2e/lib.sh

CONNS=${SRQ_CONNS:-4}
MSGS=${SRQ_MSGS:-100}
AFTER=$((MSGS / 3))
port=8100
prog=$(build_e2e srq) || exit 1

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

start_server B srq-server "listening" "$prog" server "$ADDR_B" "$port" -c "$CONNS" -d 16 -l 8 -t 600
spid=$SERVER_PID
pids=()
for i in $(seq "$CONNS"); do
	args=()
	[ "$i" = 1 ] && args=(-a "$AFTER")
	ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -i "$i" -n "$MSGS" "${args[@]}" -t 600 \
		>"$OUT/srq-client-$i.log" 2>&1 &
	pids+=("$!")
done
i=0
for p in "${pids[@]}"; do
	i=$((i + 1))
	wait "$p" || fail "client $i: $(grep -m1 FAIL "$OUT/srq-client-$i.log" || tail -n1 "$OUT/srq-client-$i.log")"
	cat "$OUT/srq-client-$i.log"
done
SERVER_PID=$spid
wait_server srq-server 120
cat "$OUT/srq-server.log"
grep -q "^srq: ok server" "$OUT/srq-server.log" || fail "the server did not finish"
want=$(((CONNS - 1) * MSGS + AFTER))
read -r recvs events < <(sed -n 's/^srq: server recvs=\([0-9]*\) limit_events=\([0-9]*\).*/\1 \2/p' "$OUT/srq-server.log")
[ "${recvs:-}" = "$want" ] || fail "the server received ${recvs:-?} messages, the clients sent $want"
# a refill after every 9 receives or fewer (16 posted, limit 8): at least one per 9 + CONNS
[ "${events:-0}" -ge $((want / (9 + CONNS))) ] ||
	fail "only ${events:-0} SRQ limit events for $want receives"

# perftest's SRQ mode: one result row for its one size
for tool in ib_send_bw ib_send_lat; do
	port=$((port + 1))
	start_server B "srq-$tool" "." sh -c "echo started; exec $tool -R -F --use-srq -n 200 -s 4096 -p $port -d urdmaB"
	wait_listening B "$port"
	out=$(t_or_dump "$tool" ip netns exec urdmaA "$tool" -R -F --use-srq -n 200 -s 4096 -p "$port" -d urdmaA "$ADDR_B" 2>&1) ||
		fail "$tool --use-srq: $(tail -n2 <<<"$out" | tr '\n' ' ')"
	wait_server "srq-$tool" 120
	awk '$1 == 4096 && $2 == 200 {found = 1} END {exit !found}' <<<"$out" ||
		fail "$tool --use-srq: no result row for 4096 bytes x 200: $(tail -n3 <<<"$out" | tr '\n' ' ')"
	echo "$tool --use-srq A -> B: $(awk '$1 == 4096 && $2 == 200' <<<"$out")"
done

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
