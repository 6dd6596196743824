#!/usr/bin/env bash
# Removing a urdma device that a process holds open: rmmod is refused,
# rdma link delete waits for the process, and both succeed once it exits.
set -u
. kmod/tests/vm-lib.sh

dmesg_mark
ensure_module
setup_veth
build_probe

holder=
deleter=
stop() {
	[ -n "$holder" ] && kill "$holder" 2>/dev/null && wait "$holder" 2>/dev/null
	holder=
}
finish() {
	stop
	[ -n "$deleter" ] && wait "$deleter" 2>/dev/null
	cleanup
}
trap finish EXIT

t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0"
uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0"
fifo=$(dirname "$PROBE")/holder.out

# 1. A bare open file (no context) is enough to pin the device.
sleep 300 3<>"$uv" &
holder=$!
sleep 1
t rmmod urdma 2>/dev/null && fail "rmmod succeeded while $uv is open"
module_loaded || fail "module gone while $uv is open"
stop
t rmmod urdma || fail "rmmod after the holder exited"
ensure_module
setup_veth

# 2. A process with a context, PD, MR, CQ and QP.
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0 (2)"
uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0 (2)"
"$PROBE" "$uv" hold 300 >"$fifo" &
holder=$!
for ((i = 0; i < 100; i++)); do grep -q holding "$fifo" && break; sleep 0.2; done
grep -q holding "$fifo" || fail "holder did not get its objects: $(cat "$fifo")"
t rmmod urdma 2>/dev/null && fail "rmmod succeeded while a context is open"

# rdma link delete blocks until the process lets go; the device stays usable
# to it meanwhile, and no new process can open it.
rdma link delete urdma0 &
deleter=$!
sleep 3
kill -0 "$deleter" 2>/dev/null || fail "rdma link delete returned while a context is open"
[ -e "$uv" ] && exec 4<>"$uv" 2>/dev/null && fail "$uv could be opened during deletion"
kill -0 "$holder" 2>/dev/null || fail "holder died during deletion"
stop
t timeout 30 tail --pid="$deleter" -f /dev/null || fail "rdma link delete still blocked after the holder exited"
wait "$deleter" || fail "rdma link delete failed after the holder exited"
deleter=
[ -e /sys/class/infiniband/urdma0 ] && fail "urdma0 still present after deferred delete"


# 3. Deleting the interface waits for the holder in the same way.
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0 (3)"
uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0 (3)"
: >"$fifo"
"$PROBE" "$uv" hold 300 >"$fifo" &
holder=$!
for ((i = 0; i < 100; i++)); do grep -q holding "$fifo" && break; sleep 0.2; done
grep -q holding "$fifo" || fail "holder (3) did not get its objects: $(cat "$fifo")"
ip link del veth0 &
deleter=$!
sleep 3
kill -0 "$deleter" 2>/dev/null || fail "ip link del veth0 returned while a context is open"
stop
t timeout 30 tail --pid="$deleter" -f /dev/null || fail "ip link del still blocked after the holder exited"
wait "$deleter" || fail "ip link del veth0 failed after the holder exited"
deleter=
for ((i = 0; i < 50; i++)); do [ -e /sys/class/infiniband/urdma0 ] || break; sleep 0.2; done
[ -e /sys/class/infiniband/urdma0 ] && fail "urdma0 still present after its interface was deleted"

t rmmod urdma || fail "rmmod after deferred delete"
ensure_module

dmesg_check
echo "ok"
