#!/usr/bin/env bash
# The direct path end to end (docs/urdmad.md, "The direct path"): the data-verifying
# workload (tests/e2e/verify.c) between the nodes, once with each connection on its own
# packet socket (the default) and once with every frame forwarded by urdmad
# (URDMA_BED_DIRECT=false). Both must move every byte right; on the direct path urdmad must
# forward no frame of a process (its port's `from_processes` stays 0, each flow says
# `path=direct`), through urdmad it must forward them all. And urdmad's own sockets must not
# take the direct connections' frames (its port filter, urdmad/src/portfilter.rs): node B's
# port receives less than a tenth of what it receives for the same work through urdmad.
set -u
. tests/e2e/lib.sh

OPS=${DIRECT_OPS:-200}
prog=$(build_e2e verify) || exit 1
port=7600

counter() { # NODE KIND KEY: the first value of KEY on a status line of KIND
	t "$BED" status "$1" | awk -v kind="$2" -v key="$3" '$1 == kind {
		for (i = 2; i <= NF; i++) { split($i, a, "="); if (a[1] == key) { print a[2]; exit } } }'
}

# run LABEL EXPECTED_PATH: verify.c with 3 connections, the flows' path checked mid-run;
# sets PORT_RX to the frames node B's port received meanwhile.
run() {
	local label=$1 want=$2 out rc paths rx0
	rx0=$(counter B port rx_packets)
	port=$((port + 1))
	start_server B "direct-$label" "listening" "$prog" server "$ADDR_B" "$port" -s 7 -c 3 -t 600
	t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -s 7 -c 3 -n "$OPS" -t 600 \
		>"$OUT/direct-$label-client.log" 2>&1 &
	local cli=$!
	# The flows exist while the client runs: their status lines say which path they take.
	paths=
	for _ in $(seq 200); do
		paths=$(t "$BED" status B | awk '$1 == "flow" { for (i = 2; i <= NF; i++) if ($i ~ /^path=/) print $i }' | sort -u)
		[ -n "$paths" ] && break
		kill -0 "$cli" 2>/dev/null || break
		sleep 0.3
	done
	wait "$cli"
	rc=$?
	cat "$OUT/direct-$label-client.log"
	[ $rc = 0 ] || fail "verify client $label (exit $rc): $(grep -m1 FAIL "$OUT/direct-$label-client.log")"
	wait_server "direct-$label" 120
	grep -q "verify: ok server" "$OUT/direct-$label.log" || fail "verify server $label did not finish"
	PORT_RX=$(($(counter B port rx_packets) - rx0))
	echo "$label: flows of node B during the run: ${paths:-none seen}; its port received $PORT_RX frames"
	[ "$paths" = "path=$want" ] || fail "$label: the flows took ${paths:-no} path, expected path=$want"
}

bed_up
for n in A B; do
	[ "$(counter "$n" port direct)" = 1 ] || fail "node $n's port offers no direct path: $(t "$BED" status "$n" | grep '^port')"
done
run direct direct
direct_rx=$PORT_RX
for n in A B; do
	fp=$(counter "$n" port from_processes)
	echo "node $n: from_processes=$fp"
	[ "$fp" = 0 ] || fail "node $n's urdmad forwarded $fp frames of processes on the direct path"
done
bed_down
trap - EXIT

export URDMA_BED_DIRECT=false
bed_up
run viad urdmad
for n in A B; do
	fp=$(counter "$n" port from_processes)
	echo "node $n: from_processes=$fp"
	[ "${fp:-0}" -gt 0 ] || fail "node $n's urdmad forwarded no frame with the direct path off"
done
[ $((direct_rx * 10)) -lt "$PORT_RX" ] ||
	fail "node B's port received $direct_rx frames on the direct path, $PORT_RX through urdmad"
dmesg_check
echo "PASS"
