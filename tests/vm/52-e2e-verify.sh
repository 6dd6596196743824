#!/usr/bin/env bash
# The data-verifying workload (tests/e2e/verify.c) between the nodes: thousands of randomly
# mixed Sends, Writes, Writes with Immediate and Reads with random sizes and scatter lists,
# every byte and completion checked; on a clean link, through the extended API (posted with
# ibv_wr_*, polled with ibv_start_poll), at netem loss 2 % with reordering,
# over several connections to one port, and with completion channels waited on by several
# threads on both sides (the completion-channel stress: every completion seen once, no wait
# that never wakes).
# vm-bed: shared
set -u
. tests/e2e/lib.sh

OPS=${VERIFY_OPS:-300}
port=7300
prog=$(build_e2e verify) || exit 1

# verify_run LABEL SERVER_ARGS -- CLIENT_ARGS
verify_run() {
	local label=$1 out
	shift
	port=$((port + 1))
	start_server B "verify-$label" "listening" "$prog" server "$ADDR_B" "$port" "${@}" -n "$OPS" -t 600
	out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" "${@}" -n "$OPS" -t 600 2>&1)
	rc=$?
	echo "$out"
	[ $rc = 0 ] || fail "verify client $label (exit $rc): $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
	wait_server "verify-$label" 120
	cat "$OUT/verify-$label.log"
	grep -q "verify: ok server" "$OUT/verify-$label.log" || fail "verify server $label did not finish"
	client_out=$out
}

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

verify_run clean -s 1
# Inline data (IBV_SEND_INLINE, buffers overwritten once the post returns) up to 256 bytes.
grep -q "max_inline 256" <<<"$client_out" ||
	fail "the client's QP was not given 256 bytes of inline data: $(grep -m1 'verify: conn' <<<"$client_out")"
grep -qE " inline [1-9]" <<<"$client_out" || fail "no request was posted inline: $(grep -m1 'verify: conn' <<<"$client_out")"
verify_run events -s 2 -e 4
# the extended API on both sides: QPs of ibv_create_qp_ex posted with ibv_wr_* (inline data
# by ibv_wr_set_inline_data_list), CQs of ibv_create_cq_ex polled with ibv_start_poll
verify_run extended -s 5 -x -w
grep -qE " inline [1-9]" <<<"$client_out" || fail "no request was built inline: $(grep -m1 'verify: conn' <<<"$client_out")"
verify_run conns -s 3 -c 4
t "$BED" netem loss 2% delay 1ms reorder 25% 50% || fail "scripts/bed netem"
verify_run loss2 -s 4 -c 2
t "$BED" netem off || fail "scripts/bed netem off"

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
