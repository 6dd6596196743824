#!/usr/bin/env bash
# Removing a urdma device that a process holds open revokes the process's objects
# (disassociate_ucontext) instead of waiting for it: rmmod, rdma link delete and deleting
# the interface complete while the process runs on, and nothing is left behind.
set -u
. kmod/tests/vm-lib.sh

dmesg_mark
ensure_module
build_probe uverbs_probe

holder=
stop() {
	[ -n "$holder" ] && kill "$holder" 2>/dev/null && wait "$holder" 2>/dev/null
	holder=
}
finish() {
	stop
	cleanup
}
# setup_veth sets its own trap; ours stops the holder first.
veth() {
	setup_veth
	trap finish EXIT
}

fifo=$(mktemp)

# hold N: a process with a context, PD, MR, CQ and QP on urdma0 (round N).
hold() {
	local uv
	uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0 ($1)"
	: >"$fifo"
	"$PROBE" "$uv" hold 300 >"$fifo" &
	holder=$!
	for ((i = 0; i < 100; i++)); do grep -q holding "$fifo" && break; sleep 0.2; done
	grep -q holding "$fifo" || fail "holder ($1) did not get its objects: $(cat "$fifo")"
	[[ "$(res_counts urdma0)" == *"qp 1 "* ]] || fail "holder ($1): no QP counted: $(res_counts urdma0)"
}

# gone N: urdma0 disappears while the holder still runs.
gone() {
	for ((i = 0; i < 150; i++)); do [ -e /sys/class/infiniband/urdma0 ] || break; sleep 0.2; done
	[ -e /sys/class/infiniband/urdma0 ] && fail "urdma0 still present ($1)"
	kill -0 "$holder" 2>/dev/null || fail "holder died with the device ($1)"
	stop
}

# 1. A bare open file (no context) does not pin the module.
veth
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0"
uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0"
sleep 300 3<>"$uv" &
holder=$!
opened() { [ "$(readlink "/proc/$holder/fd/3")" = "$uv" ]; }
wait_for 10 "the opener (pid $holder) to have $uv open" opened
t rmmod urdma || fail "rmmod while $uv is open"
kill -0 "$holder" 2>/dev/null || fail "the opener died with the module"
stop
ensure_module
veth

# 2. rdma link delete with a process holding objects: it returns, the device goes.
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0 (2)"
hold 2
t rdma link delete urdma0 || fail "rdma link delete while a context is open"
gone 2

# 3. Deleting the interface, the same.
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0 (3)"
hold 3
t ip link del veth0 || fail "ip link del veth0 while a context is open"
gone 3

# 4. rmmod with a process holding objects.
veth
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0 (4)"
hold 4
t rmmod urdma || fail "rmmod while a context is open"
module_loaded && fail "module still loaded"
kill -0 "$holder" 2>/dev/null || fail "holder died with the module"
stop
ensure_module

dmesg_check
echo "ok"
