#!/usr/bin/env bash
# End-to-end integrity: a corrupting middlebox on the bed's link, which inverts one byte in
# one of every ten full-sized UDP datagrams each way and then makes the UDP checksum right
# again (tc: u32 match, gact random, pedit, csum), as a faulty switch or NIC that
# recomputes checksums would. With the CRC32C trailer (urdmad's default) the data-verifying
# workload (tests/e2e/verify.c: mixed Sends, Writes, Writes with Immediate and Reads, every
# byte and completion checked) must finish with everything right, and the connections must
# have dropped datagrams for their trailer (rx_crc_errors in the statistics each QP logs
# with URDMA_LOG=info). Then the same with the trailer off at both nodes (URDMA_BED_CRC=false):
# the workload must fail, which shows that the middlebox does what the first half relies on.
#
# CORRUPT_OPS operations per connection (default 150, two connections).
# vm-timeout: 1800
set -u
. tests/e2e/lib.sh

OPS=${CORRUPT_OPS:-150}
port=7600
prog=$(build_e2e verify) || exit 1

# corrupt NODE: the middlebox on what NODE sends. Only datagrams of 1024 to 1535 bytes
# (full-sized segments) are touched, at byte 500 of the IP packet: inside the payload.
corrupt() {
	local dev=urdma-veth$1
	in_node "$1" tc qdisc add dev "$dev" clsact || fail "tc qdisc add dev $dev clsact"
	in_node "$1" tc filter add dev "$dev" egress protocol ip u32 \
		match ip protocol 17 0xff match u16 0x0400 0xfe00 at 2 \
		action gact ok random netrand pipe 10 \
		action pedit munge offset 500 u8 invert pipe \
		action csum udp >"$OUT/corrupt-tc.log" 2>&1 ||
		fail "tc filter on $dev: $(tail -n1 "$OUT/corrupt-tc.log")"
}

# How many datagrams the middleboxes changed (pedit's count, both nodes).
corrupted() {
	local n
	for n in A B; do
		in_node "$n" tc -s filter show dev "urdma-veth$n" egress
	done | awk '/pedit/ {p = 1} p && $1 == "Sent" {s += $4; p = 0} END {print s + 0}'
}

# verify_once: one verify run, client in node A, server in node B, each logging its QPs'
# statistics; its exit status is the client's (log: $OUT/corrupt-PORT-client.log).
verify_once() {
	port=$((port + 1))
	start_server B "corrupt-$port" "listening" \
		env URDMA_LOG=info "$prog" server "$ADDR_B" "$port" -s 12 -c 2 -t 300
	STEP_TIMEOUT=400 t_or_dump verify ip netns exec urdmaA env URDMA_LOG=info \
		"$prog" client "$ADDR_B" "$port" -s 12 -c 2 -n "$OPS" -t 300 \
		>"$OUT/corrupt-$port-client.log" 2>&1
}

# Datagrams the run's connections dropped for their trailer, both ends.
crc_drops() {
	cat "$OUT/corrupt-$port-client.log" "$OUT/corrupt-$port.log" |
		grep -o 'rx_crc_errors: [0-9]*' | awk '{s += $2} END {print s + 0}'
}

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)
corrupt A
corrupt B
verify_once
rc=$?
log=$OUT/corrupt-$port-client.log
[ $rc = 0 ] || fail "verify through the corrupting link, with the trailer (exit $rc): $(grep -m1 FAIL "$log" || tail -n1 "$log")"
wait_server "corrupt-$port" 120
grep -q "verify: ok server" "$OUT/corrupt-$port.log" || fail "the verify server did not finish"
changed=$(corrupted)
dropped=$(crc_drops)
echo "with the CRC32C trailer: verify ok ($(grep -c '^verify: conn' "$log") connections x $OPS operations);" \
	"the link changed $changed datagrams, the connections dropped $dropped for their trailer"
[ "$changed" -gt 0 ] || fail "the middlebox changed no datagram"
[ "$dropped" -gt 0 ] || fail "no datagram was dropped for its trailer although the link changed $changed"
wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30

# The same link without the trailer: corrupted bytes must reach the workload.
bed_down
export URDMA_BED_CRC=false
bed_up
corrupt A
corrupt B
verify_once
rc=$?
log=$OUT/corrupt-$port-client.log
kill "$SERVER_PID" 2>/dev/null
wait "$SERVER_PID" 2>/dev/null
[ $rc != 0 ] || fail "without the trailer verify passed through a link that changed $(corrupted) datagrams"
echo "without the trailer: verify failed as it must (exit $rc)"
grep -h -m1 FAIL "$OUT/corrupt-$port.log" "$log" | sed 's/^/  /' 
[ "$(crc_drops)" = 0 ] || fail "datagrams dropped for a trailer the connections do not use"
dmesg_check
echo "PASS"
