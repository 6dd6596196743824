#!/usr/bin/env bash
# Memory windows between the nodes (tests/e2e/mw.c): perftest has no test of them.
#
# A server on node B owns a 4 KiB buffer whose MR grants no remote write, and binds windows
# over parts of it; clients on node A use them, one connection after another:
# 1. ok: writes through a type 1 window (ibv_bind_mw) and a type 2 window (IBV_WR_BIND_MW)
#    land where they should, a read through the type 1 window returns them; a Send with
#    Invalidate frees the type 2 window, which is bound again, invalidated locally
#    (IBV_WR_LOCAL_INV) and bound once more, while the type 1 window is rebound elsewhere;
#    writes through the new keys land; a write through the invalidated key is refused.
#    ibv_dereg_mr of the MR fails with EBUSY while windows are bound to it.
# 2. oldkey, outside, readonly: a write under the type 1 window's previous key, a write
#    across its end and a read of the write-only type 2 window are each refused with
#    IBV_WC_REM_ACCESS_ERR.
# Expected: every bind and invalidation completes in order, every byte outside the windows
# is still zero at the end, and the MR is deregistered once the windows are gone.
# vm-bed: shared
set -u
. tests/e2e/lib.sh

port=8300
prog=$(build_e2e mw) || exit 1
modes=(ok oldkey outside readonly)

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

start_server B mw-server "listening" "$prog" server "$ADDR_B" "$port" -c "${#modes[@]}" -t 300
for m in "${modes[@]}"; do
	out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -m "$m" -t 120 2>&1) ||
		fail "client $m: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
	echo "$out"
done
wait_server mw-server 120
cat "$OUT/mw-server.log"
grep -q "^mw: server ok conns=${#modes[@]}\$" "$OUT/mw-server.log" || fail "the server did not finish"

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
