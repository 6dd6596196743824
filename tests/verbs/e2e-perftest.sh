#!/usr/bin/env bash
# One perftest tool (-R: connections through rdma_cm) between the two nodes of the bed
# through liburdma; the provider's log and the tools' output are kept in $URDMA_OUT.
#   scripts/vm --out out/provider --timeout 900 -- bash tests/verbs/e2e-perftest.sh ib_write_bw -n 200 -s 65536
set -u
. tests/e2e/lib.sh
tool=${1:-ib_write_bw}
shift || true
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-n 100 -s 4096)
if [ -n "${BED_IS_UP:-}" ]; then
	ADDR_A=$("$BED" addr A)
	ADDR_B=$("$BED" addr B)
else
	bed_up
fi
export URDMA_LOG=${URDMA_LOG:-info}
in_node B timeout 400 stdbuf -oL "$tool" -R -d urdmaB "${args[@]}" >"$OUT/$tool-s.log" 2>&1 &
server=$!
sleep 3
in_node A timeout 360 stdbuf -oL "$tool" -R -d urdmaA "${args[@]}" "$ADDR_B" >"$OUT/$tool-c.log" 2>&1
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
tail -n 30 "$OUT/$tool-c.log"
echo "--- server (exit $src)"
tail -n 30 "$OUT/$tool-s.log"
[ $rc = 0 ] && [ $src = 0 ] || fail "$tool client $rc server $src"
echo "PASS $tool ${args[*]}"
