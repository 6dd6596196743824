#!/usr/bin/env bash
# rping (rdma_cm, completion channels, Send and RDMA Read/Write) between the two nodes of
# the bed through liburdma, with the provider's log kept in $URDMA_OUT.
#   scripts/vm --out out/provider --timeout 900 -- bash tests/verbs/e2e-rping.sh [COUNT] [SIZE]
set -u
. tests/e2e/lib.sh
count=${1:-3}
size=${2:-64}
if [ -n "${BED_IS_UP:-}" ]; then
	ADDR_A=$("$BED" addr A)
	ADDR_B=$("$BED" addr B)
else
	bed_up
fi
export URDMA_LOG=${URDMA_LOG:-debug}
in_node B timeout 300 rping -s -a "$ADDR_B" -V -C "$count" -S "$size" >"$OUT/rping-s.log" 2>&1 &
server=$!
sleep 3
in_node A timeout 240 rping -c -a "$ADDR_B" -V -C "$count" -S "$size" >"$OUT/rping-c.log" 2>&1
rc=$?
# The server ends by itself once the client is done; give it time, then end it.
for _ in $(seq 60); do
	kill -0 "$server" 2>/dev/null || break
	sleep 1
done
kill "$server" 2>/dev/null
wait "$server"
src=$?
echo "--- client (exit $rc)"
tail -n 40 "$OUT/rping-c.log"
echo "--- server (exit $src)"
tail -n 40 "$OUT/rping-s.log"
[ $rc = 0 ] && [ $src = 0 ] || fail "rping client $rc server $src"
echo "PASS rping $count x $size"
