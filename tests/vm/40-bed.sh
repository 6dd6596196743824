#!/usr/bin/env bash
# The two-node test bed (scripts/bed) works before any RDMA traffic does: up, a ping from
# node A to node B that crosses both urdmads (counted in their status) and the veth pair,
# netem on the link (loss 100% stops the ping, removing it restores it), `bed pair`, each
# node's urdma device seen by rdma-core tools, a node's urdmad stopped (deleting its device)
# and killed, each time started again with `bed restart` and back with its address and device
# (urdmad makes both from its configuration), and `scripts/bed down` leaving nothing behind.
#   scripts/vm --out out/bed -- bash tests/vm/40-bed.sh
set -u

STEP_TIMEOUT=${STEP_TIMEOUT:-300}
urdmad=${URDMAD:-$PWD/target/release/urdmad}
start=$SECONDS

fail() {
	echo "FAIL: $*"
	exit 1
}
t() { timeout -k 5 "$STEP_TIMEOUT" "$@"; }
step() { echo "--- [$((SECONDS - start))s] $*"; }
cleanup() { timeout 120 scripts/bed down >/dev/null 2>&1; }
trap cleanup EXIT

# field NODE KIND KEY: KEY of the node's first urdmad status record KIND (port, exception).
field() {
	t "$urdmad" status --json --socket "/run/urdma/$1.sock" | jq -r ".$2[0].$3"
}
# counter NODE KIND KEY: the same, a counter ("none" if it is not one).
counter() {
	field "$@" | grep -E '^[0-9]+$' || echo "none"
}
# snapshot: a line "NODE rx_packets tx_packets to_kernel from_kernel" per node, its port's and
# exception path's counters from one status call (each call, urdmad and jq, takes about a
# second here; the checks below refuse a value that is not a count)
snapshot() {
	local n
	for n in A B; do
		echo "$n $(t "$urdmad" status --json --socket "/run/urdma/$n.sock" |
			jq -r '"\(.port[0].rx_packets) \(.port[0].tx_packets) \(.exception[0].to_kernel) \(.exception[0].from_kernel)"')"
	done
}

step "scripts/bed up"
t scripts/bed up || fail "scripts/bed up failed"
pid_a=$(cat /run/urdma/bed/A.pid) && pid_b=$(cat /run/urdma/bed/B.pid) || fail "no urdmad pid recorded"
step "bed is up (urdmad pids $pid_a $pid_b)"
t scripts/bed show

step "the nodes are separate: A's kernel has no route to B but through urdma-tapA"
route=$(t scripts/bed exec A ip -o route get 10.77.0.2) || fail "ip route get in A"
echo "$route"
grep -q "dev urdma-tapA" <<<"$route" || fail "A routes 10.77.0.2 not through urdma-tapA: $route"
t scripts/bed exec A ip -o addr show | grep -q "10.77.0.2" && fail "A owns B's address"

step "ping B from A"
before=$(snapshot)
echo "$before"
t scripts/bed exec A ping -c 3 -i 0.5 -W 10 10.77.0.2 || fail "ping 10.77.0.2 from node A"
after=$(snapshot)
echo "$after"
# Each of the 3 requests and replies (and ARP) crosses both urdmads: A sends what its kernel
# gave its TAP, B receives it and hands it to its kernel, and back.
while read -r n rx0 tx0 tk0 fk0 && read -r _ rx1 tx1 tk1 fk1 <&3; do
	for v in "$rx0" "$tx0" "$tk0" "$fk0" "$rx1" "$tx1" "$tk1" "$fk1"; do
		[[ "$v" =~ ^[0-9]+$ ]] || fail "node $n: urdmad status has no counter ($before / $after)"
	done
	((rx1 - rx0 >= 3)) || fail "node $n: urdmad received $((rx1 - rx0)) frames on its port, expected >= 3"
	((tx1 - tx0 >= 3)) || fail "node $n: urdmad sent $((tx1 - tx0)) frames on its port, expected >= 3"
	((tk1 - tk0 >= 3)) || fail "node $n: urdmad gave its kernel $((tk1 - tk0)) frames, expected >= 3"
	((fk1 - fk0 >= 3)) || fail "node $n: urdmad took $((fk1 - fk0)) frames from its kernel, expected >= 3"
done <<<"$before" 3<<<"$after"

step "netem loss 100% on the link stops the ping"
t scripts/bed netem loss 100% || fail "scripts/bed netem loss 100%"
t scripts/bed show
rx_b0=$(counter B port rx_packets)
t scripts/bed exec A ping -c 3 -i 0.5 -W 3 10.77.0.2 && fail "ping got through netem loss 100%"
rx_b1=$(counter B port rx_packets)
echo "node B port rx_packets: $rx_b0 -> $rx_b1"
[ "$rx_b0" = "$rx_b1" ] || fail "node B's urdmad received frames through loss 100% ($rx_b0 -> $rx_b1)"

step "netem off restores it"
t scripts/bed netem off || fail "scripts/bed netem off"
t scripts/bed exec A ping -c 3 -i 0.5 -W 10 10.77.0.2 || fail "ping after netem off"

step "netem delay: each urdmad drops its own frames seen again instead of giving them to its kernel"
# netem releases a frame from its socket, so af_packet then hands the sender a copy too. With
# the direct path on, the filter on urdmad's sockets drops every frame the host sends before
# urdmad sees it (echoes stays); without it, urdmad drops them itself and counts them.
t scripts/bed netem delay 1ms || fail "scripts/bed netem delay 1ms"
direct_a=$(field A port direct)
ec_a0=$(counter A port echoes)
tk_a0=$(counter A exception to_kernel)
t scripts/bed exec A ping -c 3 -i 0.5 -W 10 10.77.0.2 || fail "ping with netem delay"
ec_a1=$(counter A port echoes)
tk_a1=$(counter A exception to_kernel)
t scripts/bed netem off || fail "scripts/bed netem off"
echo "node A: direct=$direct_a, echoes $ec_a0 -> $ec_a1, to_kernel $tk_a0 -> $tk_a1"
if [ "$direct_a" = true ]; then
	((ec_a1 == ec_a0)) || fail "node A's urdmad saw $((ec_a1 - ec_a0)) of its own frames again past its filter"
else
	((ec_a1 - ec_a0 >= 3)) || fail "node A's urdmad saw $((ec_a1 - ec_a0)) of its own frames again, expected >= 3"
fi
# the 3 replies and at most a few ARP frames, not A's own requests back
((tk_a1 - tk_a0 <= 5)) || fail "node A's urdmad gave its kernel $((tk_a1 - tk_a0)) frames for 3 replies"

step "scripts/bed pair: the server side runs in B, the client side in A with B's address"
# shellcheck disable=SC2016
pair_script='case $0 in
	10.77.0.2) ip -br addr show urdma-tapA | grep -q 10.77.0.1 && ping -c 2 -W 10 "$0" ;;
	*) ip -br addr show urdma-tapB | grep -q 10.77.0.2 && sleep 1 ;;
	esac'
t scripts/bed pair --timeout 120 sh -c "$pair_script" || fail "scripts/bed pair"

step "each node's urdma device"
for n in A B; do
	links=$(t scripts/bed exec "$n" rdma link show) || fail "rdma link show in node $n"
	echo "$links"
	grep -qE "^link urdma$n/1 .*netdev urdma-tap$n\b" <<<"$links" ||
		fail "node $n: rdma link shows no urdma$n on urdma-tap$n"
	devs=$(t scripts/bed exec "$n" ibv_devices) || fail "ibv_devices in node $n"
	echo "$devs"
	grep -qw "urdma$n" <<<"$devs" || fail "node $n: ibv_devices does not list urdma$n"
done

# back NODE WHAT: after `bed restart NODE` (which waits for the address and the device, as
# urdmad makes them from its configuration), the node's status says so and A reaches B.
back() {
	local n=$1 what=$2 since=$SECONDS state
	t scripts/bed restart "$n" || fail "scripts/bed restart $n after $what"
	echo "  $what: urdmad back with address and device in $((SECONDS - since)) s"
	((SECONDS - since <= RESTART_BOUND)) || fail "more than ${RESTART_BOUND}s for node $n to come back after $what"
	state=$(field "$n" exception rdma_device_state)
	[[ $state == created* ]] || fail "node $n's status says its device is '$state'"
	[ "$(field "$n" exception addresses[0])" = 10.77.0.2/24 ] || fail "node $n's status shows no address"
	t scripts/bed exec A ping -c 3 -i 0.5 -W 10 10.77.0.2 || fail "ping after $what"
}
# What urdmad takes from start to serving with its address and device, in the emulated VM.
RESTART_BOUND=${RESTART_BOUND:-90}

step "SIGTERM to node B's urdmad: it deletes its device, its interface and address go with it"
[ "$(field B exception rdma_device)" = urdmaB ] || fail "node B's status names no device"
kill -TERM "$pid_b"
for _ in $(seq 300); do [ -d "/proc/$pid_b" ] || break; sleep 0.2; done
[ -d "/proc/$pid_b" ] && fail "node B's urdmad still runs 60 s after SIGTERM"
grep -q "urdma device deleted" /run/urdma/bed/B.log || fail "node B's urdmad did not say it deleted its device"
rdma link show 2>/dev/null | grep -q "^link urdmaB/" && fail "urdmaB outlived its urdmad: $(rdma link show)"
ip -n urdmaB link show urdma-tapB >/dev/null 2>&1 && fail "urdma-tapB outlived its urdmad"
back B "a stop"
pid_b=$(cat /run/urdma/bed/B.pid)

step "kill -9 of node B's urdmad: a new one puts back address and device"
kill -9 "$pid_b"
back B "kill -9"
pid_b2=$(cat /run/urdma/bed/B.pid)
[ "$pid_b2" != "$pid_b" ] && [ -d "/proc/$pid_b2" ] || fail "no new urdmad in node B after restart"
links=$(t scripts/bed exec B rdma link show) || fail "rdma link show in node B"
grep -qE "^link urdmaB/1 .*netdev urdma-tapB\b" <<<"$links" || fail "node B has no urdmaB on urdma-tapB after restart: $links"

step "scripts/bed down"
t scripts/bed down || fail "scripts/bed down failed"
left=
for ns in urdmaA urdmaB; do
	[ -e "/run/netns/$ns" ] && left+=" netns $ns"
done
for p in "$pid_a" "$pid_b" "$pid_b2"; do
	[ -d "/proc/$p" ] && left+=" urdmad pid $p"
done
for i in urdma-tapA urdma-tapB urdma-vethA urdma-vethB; do
	ip link show "$i" >/dev/null 2>&1 && left+=" interface $i"
done
rdma link show 2>/dev/null | grep -qE "^link urdma[AB]/" && left+=" rdma links: $(rdma link show | grep -E '^link urdma[AB]/')"
for d in $(awk '$3 == "hugetlbfs" {print $2}' /proc/mounts); do
	for f in "$d"/urdmabedA* "$d"/urdmabedB*; do
		[ -e "$f" ] && left+=" $f"
	done
done
for f in /run/urdma/A.sock /run/urdma/B.sock /run/urdma/bed /var/run/dpdk/urdmabedA /var/run/dpdk/urdmabedB; do
	[ -e "$f" ] && left+=" $f"
done
[ -z "$left" ] || fail "left after scripts/bed down:$left"

step "scripts/bed down again (idempotent)"
t scripts/bed down || fail "a second scripts/bed down failed"
echo "PASS: bed up, ping across both urdmads, netem, devices, down ($((SECONDS - start))s)"
