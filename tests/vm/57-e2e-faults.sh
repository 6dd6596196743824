#!/usr/bin/env bash
# The fault matrix: the data-verifying workload (tests/e2e/verify.c: mixed Sends, Writes,
# Writes with Immediate and Reads of random sizes and scatter lists, every byte and
# completion checked) across the bed's link under tc netem, one row per fault: loss 1 % and
# 10 %, duplication, delay with jitter (which also reorders), rate limiting and a
# combination of them all; rping -V under duplication and under the combination; and
# ib_write_bw's duration mode ending with its Writes in flight on a lossy link. Every run
# must finish with every byte and completion right; each row prints its time and goodput
# against the clean link's, measured first in the same run (the same seed, so the same
# work). netem acts in both directions.
# The counters move with it: each device lists urdma's counters (`rdma statistic show`),
# their QP datagrams rise with the clean run and their retransmissions with loss 10 %, and
# urdmad's status shows a live QP's figures (`.flow[].qp`) during a run.
#
# FAULT_OPS operations per connection (default 100, two connections), FAULT_RPING rping
# iterations of 65535 bytes (default 40: under the combination of faults each took about
# half a second, and each is dozens of datagrams, so 40 still meet every fault many times):
# the full matrix is (the guest sees only the environment the command gives it)
#   scripts/vm -- env FAULT_OPS=2000 FAULT_RPING=1000 tests/vm/run-all 57-e2e-faults
# vm-timeout: 3600
# vm-bed: shared
set -u
. tests/e2e/lib.sh

OPS=${FAULT_OPS:-100}
RPING=${FAULT_RPING:-40}
port=7500
prog=$(build_e2e verify) || exit 1

# The rows: label, then netem's arguments.
rows=(
	"loss 1%|loss 1%"
	"loss 10%|loss 10%"
	"duplication 10%|duplicate 10%"
	"delay 5 ms, jitter 4 ms|delay 5ms 4ms"
	"rate 20 Mbit/s|rate 20mbit"
	"all at once|loss 3% duplicate 3% delay 2ms 1ms rate 50mbit"
)

now() { date +%s.%N; }

# verify_row LABEL: one verify run (client in node A, server in node B); sets ROW_S and
# ROW_B to the client's seconds and bytes.
verify_row() {
	local label=$1 log rc t0 t1
	port=$((port + 1))
	log=$OUT/faults-$port-client.log
	start_server B "faults-$port" "listening" "$prog" server "$ADDR_B" "$port" -s 11 -c 2 -n "$OPS" -t 900
	t0=$(now)
	STEP_TIMEOUT=900 t_or_dump verify ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" \
		-s 11 -c 2 -n "$OPS" -t 900 >"$log" 2>&1
	rc=$?
	t1=$(now)
	[ $rc = 0 ] || fail "verify under $label (exit $rc): $(grep -m1 FAIL "$log" || tail -n1 "$log")"
	wait_server "faults-$port" 120
	grep -q "verify: ok server" "$OUT/faults-$port.log" || fail "verify server under $label did not finish"
	ROW_S=$(awk -v t0="$t0" -v t1="$t1" 'BEGIN {printf "%.1f", t1 - t0}')
	ROW_B=$(awk '/^verify: conn/ {for (i = 1; i < NF; i++) if ($i == "bytes") b += $(i + 1)} END {print b + 0}' "$log")
}

rping_row() {
	local label=$1 size=65535 out rc
	port=$((port + 1))
	start_server B "faults-rping-$port" "." sh -c "echo started; exec rping -s -a $ADDR_B -p $port -C $RPING -S $size -V"
	wait_listening B "$port"
	out=$(timeout -k 5 900 ip netns exec urdmaA rping -c -a "$ADDR_B" -p "$port" -C "$RPING" -S "$size" -V 2>&1)
	rc=$?
	[ $rc = 0 ] || fail "rping -V under $label (exit $rc): $(tail -n2 <<<"$out" | tr '\n' ' ')"
	wait_server "faults-rping-$port" 120
	grep -qiE "error|fail|mismatch" "$OUT/faults-rping-$port.log" &&
		fail "rping server under $label: $(grep -m1 -iE 'error|fail|mismatch' "$OUT/faults-rping-$port.log")"
	echo "  rping -V -S $size -C $RPING under $label: ok"
}

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

listed=$(t ip netns exec urdmaA rdma statistic show link urdmaA/1) || fail "rdma statistic show link urdmaA/1"
echo "$listed"
for c in $HW_COUNTERS; do
	grep -qw "$c" <<<"$listed" || fail "rdma statistic lists no $c for urdmaA"
done
packets0=$(hw_sum rx_packets)
frames0=$(hw_sum rx_frames)	# the bed may have carried other tests' traffic (run-all's shared bed)

verify_row "a clean link"
clean_s=$ROW_S clean_b=$ROW_B
hw_above rx_packets "$packets0" "the clean run"
hw_above rx_frames "$frames0" "the clean run"
retrans0=$(hw_sum retransmissions)

# A live QP's figures in node A's urdmad status, looked at while a longer run goes on.
port=$((port + 1))
start_server B faults-live "listening" "$prog" server "$ADDR_B" "$port" -n $((OPS * 10)) -t 600
ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n $((OPS * 10)) -t 600 \
	>"$OUT/faults-live-client.log" 2>&1 &
cpid=$!
live=0
for _ in $(seq 300); do
	live=$(t "$BED" status --json A | jq -r '[.flow[]? | .qp // empty | .tx_packets] | max // 0')
	[ "${live:-0}" -gt 0 ] && break
	kill -0 "$cpid" 2>/dev/null || break
	sleep 0.2
done
wait "$cpid" || fail "the client of the live run: $(tail -n1 "$OUT/faults-live-client.log")"
wait_server faults-live 60
[ "${live:-0}" -gt 0 ] || fail "urdmad's status showed no live QP's figures during a run"
echo "a live QP's figures in urdmad's status: tx_packets $live"
[ "$clean_b" -gt 0 ] || fail "the clean run moved no bytes"
echo "fault matrix: verify.c, 2 connections x $OPS operations, $clean_b bytes each run"
printf '  %-26s %8s %10s %10s\n' "netem" "seconds" "MB/s" "of clean"
row() {
	awk -v l="$1" -v s="$2" -v b="$3" -v cs="$clean_s" -v cb="$clean_b" \
		'BEGIN {printf "  %-26s %8.1f %10.2f %9.0f%%\n", l, s, b / s / 1e6, 100 * (b / s) / (cb / cs)}'
}
row "none" "$clean_s" "$clean_b"
for r in "${rows[@]}"; do
	label=${r%%|*}
	t "$BED" netem ${r#*|} >/dev/null || fail "scripts/bed netem ${r#*|}"
	verify_row "$label"
	[ "$ROW_B" = "$clean_b" ] || fail "verify under $label moved $ROW_B bytes, the clean run $clean_b"
	row "$label" "$ROW_S" "$ROW_B"
	[ "$label" = "loss 10%" ] && hw_above retransmissions "$retrans0" "$label"
	case $label in
	duplication* | all*) rping_row "$label" ;;
	esac
	t "$BED" netem off >/dev/null || fail "scripts/bed netem off"
done

# perftest's duration mode stops with its Writes still in flight, destroys the QP while
# its close goes on, and frees the buffer: what the closing connection still sends must be
# copies, not reads of freed memory (the client crashed in about half of these runs).
t "$BED" netem delay 1ms reorder 5% loss 10% >/dev/null || fail "scripts/bed netem delay 1ms reorder 5% loss 10%"
for i in 1 2 3; do
	port=$((port + 1))
	start_server B "faults-duration-$port" "." sh -c "echo started; exec ib_write_bw -R -F -p $port -s 65536 -D 3"
	wait_listening B "$port"
	timeout -k 5 120 ip netns exec urdmaA ib_write_bw -R -F -p "$port" -s 65536 -D 3 "$ADDR_B" \
		>"$OUT/faults-duration-$port-client.log" 2>&1
	rc=$?
	[ $rc = 0 ] || fail "ib_write_bw -D 3 under loss, run $i: exit $rc:" \
		"$(tail -n2 "$OUT/faults-duration-$port-client.log" | tr '\n' ' ')"
	wait_server "faults-duration-$port" 60
done
echo "  ib_write_bw -D 3 under delay, reordering and loss 10%, 3 runs: ok"
t "$BED" netem off >/dev/null || fail "scripts/bed netem off"

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
