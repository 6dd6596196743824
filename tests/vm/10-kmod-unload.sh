#!/usr/bin/env bash
# rmmod urdma removes urdma's own devices and no others, also while some of
# them are being torn down by their interface going away or by "rdma link
# delete" at the same moment: rmmod succeeds, no urdma device and no held
# interface is left behind, and the kernel logs no warning.  rxe's device
# and a second out-of-tree device with urdma's driver id (RDMA_DRIVER_UNKNOWN)
# survive every unload.
set -u
. kmod/tests/vm-lib.sh

PAIRS=3
other_loaded=0

teardown() {
	local i
	cleanup
	for ((i = 0; i < PAIRS; i++)); do timeout 30 ip link del "ua$i" 2>/dev/null; done
	timeout 30 rdma link delete rxe0 2>/dev/null
	timeout 30 ip link del ox0 2>/dev/null
	timeout 30 rmmod rdma_rxe 2>/dev/null
	[ "$other_loaded" = 1 ] && timeout 30 rmmod urdma_other
	true
}

add_pair() {
	t ip link add "$1" type veth peer name "$2" || fail "cannot create veth pair $1/$2"
	t ip link set "$1" up && t ip link set "$2" up || fail "cannot bring up $1/$2"
}

# Names of the devices of driver urdma (node_desc), one per line.
urdma_devs() {
	local d
	for d in /sys/class/infiniband/*; do
		[ "$(cat "$d/node_desc" 2>/dev/null)" = urdma ] && echo "${d##*/}"
	done
}

# Two urdma devices per veth pair: urdma_aN on uaN, urdma_bN on ubN.
add_devices() {
	local i
	for ((i = 0; i < PAIRS; i++)); do
		add_pair "ua$i" "ub$i"
		t rdma link add "urdma_a$i" type urdma netdev "ua$i" || fail "rdma link add urdma_a$i"
		t rdma link add "urdma_b$i" type urdma netdev "ub$i" || fail "rdma link add urdma_b$i"
	done
	[ "$(urdma_devs | wc -l)" = $((2 * PAIRS)) ] || fail "urdma devices: $(urdma_devs | tr '\n' ' ')"
}

others_present() {
	[ -e /sys/class/infiniband/rxe0 ] || fail "$1: rxe0 is gone"
	[ -e /sys/class/infiniband/other0 ] || fail "$1: other0 (RDMA_DRIVER_UNKNOWN) is gone"
}

# After rmmod: no urdma device, and every interface can be deleted, which
# blocks for good if a device still held a reference to it.
check_after_rmmod() {
	local i left
	module_loaded && fail "$1: module still loaded"
	left=$(urdma_devs)
	[ -z "$left" ] || fail "$1: devices left after rmmod: $left"
	others_present "$1"
	for ((i = 0; i < PAIRS; i++)); do
		[ -e "/sys/class/net/ua$i" ] || continue
		t ip link del "ua$i" || fail "$1: ua$i cannot be deleted after rmmod"
	done
}

dmesg_mark
trap teardown EXIT
t modprobe rdma_rxe || fail "modprobe rdma_rxe"
add_pair ox0 ox1
t rdma link add rxe0 type rxe netdev ox0 || fail "rdma link add rxe0"
t insmod kmod/tests/urdma_other.ko || fail "insmod urdma_other.ko"
other_loaded=1
[ "$(cat /sys/class/infiniband/other0/node_desc)" != urdma ] || fail "other0 looks like urdma"

for round in 1 2; do
	# Interfaces deleted right before rmmod: their devices are mid-deletion
	# (queued by the netdev notifier) when the module goes.
	ensure_module
	add_devices
	pids=()
	for ((i = 0; i < PAIRS - 1; i++)); do
		ip link del "ua$i" &
		pids+=($!)
	done
	t rmmod urdma || fail "round $round: rmmod with interfaces being deleted"
	for p in "${pids[@]}"; do
		t tail --pid="$p" -f /dev/null || fail "round $round: ip link del still blocked"
		wait "$p" || fail "round $round: ip link del failed"
	done
	check_after_rmmod "round $round (interfaces)"

	# rdma link delete of some devices racing with rmmod.  A delete may find
	# its device already gone; rmmod must succeed either way.
	ensure_module
	add_devices
	pids=()
	for ((i = 0; i < PAIRS; i++)); do
		rdma link delete "urdma_a$i" 2>/dev/null &
		pids+=($!)
	done
	t rmmod urdma || fail "round $round: rmmod with rdma link delete running"
	for p in "${pids[@]}"; do
		t tail --pid="$p" -f /dev/null || fail "round $round: rdma link delete still blocked"
		wait "$p"
	done
	check_after_rmmod "round $round (rdma link delete)"
done

# Plain unload with idle devices, and a module that loads again afterwards.
ensure_module
add_devices
t rmmod urdma || fail "rmmod with idle devices"
check_after_rmmod "idle devices"
ensure_module
add_pair ua0 ub0
t rdma link add urdma_a0 type urdma netdev ua0 || fail "rdma link add after reload"
t rdma link delete urdma_a0 || fail "rdma link delete after reload"
others_present "end"

dmesg_check
echo "ok"
