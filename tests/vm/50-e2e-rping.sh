#!/usr/bin/env bash
# Unmodified rping with data verification (-V) over urdma: between the two nodes of the bed
# at several sizes (23, 4096 and 65535 bytes) up to rping's largest buffer (65535 bytes: rping refuses 64 KiB itself), the same with netem loss 2 %
# plus reordering on the link, and between two processes of one node (loopback).
# Reduced for CI: 300 iterations a run and 100 under loss rather than 1000 (about 125 s
# here: a 65535-byte iteration is dozens of datagrams each way, so 100 of them under 2 %
# loss still have many losses to recover, every byte verified); the full form is
# scripts/vm -- env RPING_ITER=1000 RPING_LOSS_ITER=1000 tests/vm/run-all 50-e2e-rping
# vm-timeout: 3600
# vm-bed: shared
set -u
. tests/e2e/lib.sh

ITER=${RPING_ITER:-300}
LOSS_ITER=${RPING_LOSS_ITER:-100}
# One rping run's bound: 1000 iterations at 2 % loss take ~5 min under the test bed's
# emulation (each loss costs a retransmission timeout of a few round trips, ~30 ms each).
RPING_BOUND=${RPING_BOUND:-1200}
port=7100

# rping_pair SERVER_NODE SERVER_ADDR CLIENT_NODE SIZE LABEL [ITERATIONS]
rping_pair() {
	local sn=$1 sa=$2 cn=$3 size=$4 label=$5 ITER=${6:-$ITER} out t0=$SECONDS
	port=$((port + 1))
	start_server "$sn" "rping-$label-$size" "." \
		sh -c "echo started; exec rping -s -a $sa -p $port -C $ITER -S $size -V"
	wait_listening "$sn" "$port"
	out=$(timeout -k 5 "$RPING_BOUND" ip netns exec "urdma$cn" rping -c -a "$sa" -p "$port" -C "$ITER" -S "$size" -V 2>&1)
	rc=$?
	[ $rc = 0 ] || fail "rping client $label size $size (exit $rc): $(tail -n2 <<<"$out" | tr '\n' ' ')"
	wait_server "rping-$label-$size" 120
	grep -qiE "error|fail|mismatch" "$OUT/rping-$label-$size.log" &&
		fail "rping server $label size $size: $(grep -m1 -iE 'error|fail|mismatch' "$OUT/rping-$label-$size.log")"
	echo "rping $label -S $size -C $ITER: ok ($((SECONDS - t0)) s)"
}

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

for size in 23 4096 65535; do
	rping_pair B "$ADDR_B" A "$size" nodes
done

t "$BED" netem loss 2% delay 1ms reorder 25% 50% || fail "scripts/bed netem"
for size in 64 65535; do
	rping_pair B "$ADDR_B" A "$size" loss2 "$LOSS_ITER"
done
t "$BED" netem off || fail "scripts/bed netem off"

for size in 64 65535; do
	rping_pair A "$ADDR_A" A "$size" loopback
done

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
