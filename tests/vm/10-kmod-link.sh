#!/usr/bin/env bash
# urdma.ko device life cycle: rdma link add/delete, node type, port state
# following the interface, GID, ABI version, refusals, rmmod with devices.
set -u
. kmod/tests/vm-lib.sh

dmesg_mark
ensure_module
setup_veth

t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0"
t rdma link show | grep -q "^link urdma0/1 .*netdev veth0" || fail "rdma link show does not list urdma0 on veth0"
sys=/sys/class/infiniband/urdma0
[ "$(cat $sys/node_type)" = "4: RNIC" ] || fail "node_type is '$(cat $sys/node_type)', want '4: RNIC'"
[ "$(cat $sys/ports/1/link_layer)" = "Ethernet" ] || fail "link_layer is '$(cat $sys/ports/1/link_layer)'"
wait_port_state urdma0 ACTIVE 10 || fail "port is $(port_state urdma0) with veth up, want ACTIVE"

# The GID carries the interface's MAC in its first six bytes.
mac=$(tr -d ':\n' </sys/class/net/veth0/address)
gid=$(tr -d ':\n' <$sys/ports/1/gids/0)
[ "${gid:0:12}" = "$mac" ] || fail "gid $gid does not start with MAC $mac"

# A new MAC address becomes the new GID.
t ip link set veth0 down && t ip link set veth0 address 02:75:72:64:6d:61 && t ip link set veth0 up ||
	fail "cannot change the MAC of veth0"
for ((i = 0; i < 50; i++)); do
	gid=$(tr -d ':\n' <$sys/ports/1/gids/0)
	[ "${gid:0:12}" = 027572646d61 ] && break
	sleep 0.2
done
[ "${gid:0:12}" = 027572646d61 ] || fail "gid $gid did not follow the MAC change"
wait_port_state urdma0 ACTIVE 10 || fail "port is $(port_state urdma0) after the MAC change, want ACTIVE"

uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0"
want_abi=$(abi_define URDMA_ABI_VERSION)
[ "$(cat /sys/class/infiniband_verbs/${uv##*/}/abi_version)" = "$want_abi" ] ||
	fail "uverbs abi_version is not URDMA_ABI_VERSION ($want_abi)"

# The port follows the interface: down, up, and the peer's carrier.
t ip link set veth0 down || fail "veth0 down"
wait_port_state urdma0 DOWN 10 || fail "port is $(port_state urdma0) with veth0 down, want DOWN"
t ip link set veth0 up || fail "veth0 up"
wait_port_state urdma0 ACTIVE 10 || fail "port is $(port_state urdma0) after veth0 up, want ACTIVE"
t ip link set veth1 down || fail "veth1 down"
wait_port_state urdma0 DOWN 10 || fail "port is $(port_state urdma0) without carrier, want DOWN"
t ip link set veth1 up || fail "veth1 up"
wait_port_state urdma0 ACTIVE 10 || fail "port is $(port_state urdma0) with carrier back, want ACTIVE"

# One device per interface, Ethernet only.
t rdma link add urdma9 type urdma netdev veth0 2>/dev/null && fail "second device on veth0 accepted"
t rdma link add urdma9 type urdma netdev lo 2>/dev/null && fail "device on loopback accepted"

t rdma link delete urdma0 || fail "rdma link delete urdma0"
[ -e $sys ] && fail "$sys still exists after delete"
t rdma link show | grep -q urdma0 && fail "rdma link show still lists urdma0"

# Deleting the interface removes its device.
t rdma link add urdma0 type urdma netdev veth0 || fail "re-add urdma0"
t ip link del veth0 || fail "ip link del veth0"
for ((i = 0; i < 50; i++)); do [ -e $sys ] || break; sleep 0.2; done
[ -e $sys ] && fail "urdma0 survived the deletion of veth0"

# Unloading the module removes the devices it still has.
setup_veth
t rdma link add urdma0 type urdma netdev veth0 || fail "add urdma0 before rmmod"
t rdma link add urdma1 type urdma netdev veth1 || fail "add urdma1 before rmmod"
t rmmod urdma || fail "rmmod urdma with two devices"
[ -e $sys ] && fail "urdma0 survived rmmod"
[ -e /sys/class/infiniband/urdma1 ] && fail "urdma1 survived rmmod"
ensure_module

dmesg_check
echo "ok"
