#!/usr/bin/env bash
# rdma_cm with a urdma device present, before connection setup exists:
# listening (on the device's address and on the wildcard, which covers
# every RDMA device) works, and a connection attempt through librdmacm
# fails cleanly with EOPNOTSUPP instead of hanging or hurting the kernel.
set -u
. kmod/tests/vm-lib.sh

dmesg_mark
ensure_module
setup_veth
t ip addr add 10.77.0.1/24 dev veth0 || fail "address on veth0"
t ip addr add 10.77.0.2/24 dev veth1 || fail "address on veth1"
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0"

servers=
finish() {
	[ -n "$servers" ] && kill $servers 2>/dev/null && wait $servers 2>/dev/null
	cleanup
}
trap finish EXIT

log=$(mktemp -d 2>/dev/null || mktemp -d -p "${URDMA_OUT:?}")
t gcc -O2 -Wall -o "$log/cm_probe" kmod/tests/cm_probe.c -lrdmacm -libverbs || fail "cannot build cm_probe"
# A listener stays up until a client comes; one that fails exits at once.
timeout 300 rping -s -a 10.77.0.1 -p 7471 -C 1 -v >"$log/addr" 2>&1 &
servers=$!
timeout 300 rping -s -p 7472 -C 1 -v >"$log/wild" 2>&1 &
servers="$servers $!"
sleep 5
for s in $servers; do
	kill -0 "$s" 2>/dev/null || fail "rping listener exited: $(cat "$log/addr" "$log/wild" | tail -n1)"
done

# No TRP handshake yet: the QP reaches INIT through rdma_cm's iWARP
# attributes, then iw_connect refuses and the application sees EOPNOTSUPP.
out=$(t "$log/cm_probe" 10.77.0.1 7471)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "cm_probe: $(tail -n1 <<<"$out")"
grep -qx "device: urdma0" <<<"$out" || fail "rdma_cm did not pick urdma0: $(head -n1 <<<"$out")"
grep -q "state after rdma_create_qp: 1$" <<<"$out" || fail "QP not in INIT after rdma_create_qp"
grep -qx "connect: EOPNOTSUPP" <<<"$out" || fail "rdma_connect: $(tail -n1 <<<"$out"), want EOPNOTSUPP"
for s in $servers; do
	kill -0 "$s" 2>/dev/null || fail "rping listener died after the failed connect: $(cat "$log/addr" "$log/wild" | tail -n1)"
done
kill $servers 2>/dev/null
wait $servers 2>/dev/null
servers=

t rdma link delete urdma0 || fail "rdma link delete after rdma_cm use"
dmesg_check
echo "ok"
