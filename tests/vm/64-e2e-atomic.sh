#!/usr/bin/env bash
# RFC 7306 atomics between the nodes (tests/e2e/atomic.c, and perftest's atomic tools).
#
# 1. One counter on node B, many writers at once: two client processes on node A (one with
#    ATOMIC_DEPTH Fetch-and-Adds outstanding, beyond the ORD of 16, one incrementing by
#    Compare-and-Swap), one on node B itself (loopback), and a thread of the server adding
#    with the CPU's own atomic instruction. Expected: the final value is the sum of every
#    increment (none lost, none run twice) and each client's own Fetch-and-Adds found
#    rising values.
# 2. Protection: a Fetch-and-Add on a region without remote atomic access completes with
#    IBV_WC_REM_ACCESS_ERR, one on a misaligned address with IBV_WC_REM_OP_ERR, and
#    neither changes the result buffer.
# 3. The same counter under netem loss 5 % with reordering: every request or response lost
#    is retransmitted by trp, and the final value proves that no atomic ran twice.
# 4. ib_atomic_lat and ib_atomic_bw (Fetch-and-Add and Compare-and-Swap), unmodified, with
#    rdma_cm, node A to node B.
# ATOMIC_OPS: each add client's operations (300; the Compare-and-Swap client does a third).
# vm-bed: shared
set -u
. tests/e2e/lib.sh

OPS=${ATOMIC_OPS:-300}
DEPTH=${ATOMIC_DEPTH:-24}
LOCAL=${ATOMIC_LOCAL:-20000}
port=7900
prog=$(build_e2e atomic) || exit 1

# counter LABEL: phase 1 (or 3, under whatever netem the caller set)
counter() {
	local label=$1 cas_ops=$((OPS / 3)) pids=() p i want
	port=$((port + 1))
	start_server B "atomic-$label" "listening" "$prog" server "$ADDR_B" "$port" -c 3 -l "$LOCAL" -t 600
	local spid=$SERVER_PID
	ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -m add -n "$OPS" -d "$DEPTH" -t 600 \
		>"$OUT/atomic-$label-c1.log" 2>&1 &
	pids+=("$!")
	ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -m cas -n "$cas_ops" -t 600 \
		>"$OUT/atomic-$label-c2.log" 2>&1 &
	pids+=("$!")
	ip netns exec urdmaB "$prog" client "$ADDR_B" "$port" -m add -n "$OPS" -t 600 \
		>"$OUT/atomic-$label-c3.log" 2>&1 &
	pids+=("$!")
	i=0
	for p in "${pids[@]}"; do
		i=$((i + 1))
		wait "$p" || fail "$label: client $i: $(grep -m1 FAIL "$OUT/atomic-$label-c$i.log" || tail -n1 "$OUT/atomic-$label-c$i.log")"
		cat "$OUT/atomic-$label-c$i.log"
	done
	SERVER_PID=$spid
	wait_server "atomic-$label" 120
	cat "$OUT/atomic-$label.log"
	want=$((2 * OPS + cas_ops + LOCAL))
	grep -q "^atomic: server counter=$want\$" "$OUT/atomic-$label.log" ||
		fail "$label: the counter is not $want (every increment once): $(grep -m1 counter= "$OUT/atomic-$label.log")"
}

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

counter clean

port=$((port + 1))
start_server B atomic-protect "listening" "$prog" server "$ADDR_B" "$port" -c 2 -t 300
out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -m protect -t 300 2>&1) ||
	fail "protect: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
echo "$out"
wait_server atomic-protect 120
grep -q "^atomic: server counter=0\$" "$OUT/atomic-protect.log" ||
	fail "protect: the counter changed: $(cat "$OUT/atomic-protect.log")"

t "$BED" netem loss 5% delay 1ms reorder 25% 50% || fail "scripts/bed netem"
counter loss5
t "$BED" netem off || fail "scripts/bed netem off"

# perftest's atomic tools: one row of 8 bytes and the iterations asked for
for run in "ib_atomic_lat" "ib_atomic_bw -A FETCH_AND_ADD" "ib_atomic_bw -A CMP_AND_SWAP"; do
	port=$((port + 1))
	label=$(tr -d ' ' <<<"$run")
	# shellcheck disable=SC2086 # the run's tool and arguments, split
	start_server B "atomic-$label" "." sh -c "echo started; exec $run -R -F -n 200 -p $port -d urdmaB"
	wait_listening B "$port"
	# shellcheck disable=SC2086
	out=$(t_or_dump "${run%% *}" ip netns exec urdmaA $run -R -F -n 200 -p "$port" -d urdmaA "$ADDR_B" 2>&1) ||
		fail "$run: $(tail -n2 <<<"$out" | tr '\n' ' ')"
	wait_server "atomic-$label" 120
	awk '$1 == 8 && $2 == 200 {found = 1} END {exit !found}' <<<"$out" ||
		fail "$run: no result row for 8 bytes x 200: $(tail -n3 <<<"$out" | tr '\n' ' ')"
	echo "$run A -> B: $(awk '$1 == 8 && $2 == 200' <<<"$out")"
done

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
