#!/usr/bin/env bash
# urdma.ko uverbs objects through the raw kernel ABI (no provider needed):
# the context reply, the declared limits, 1000 PD/MR/CQ/QP cycles with
# resource counts returning to zero, and the errno of every refusal.
set -u
. kmod/tests/vm-lib.sh

dmesg_mark
ensure_module
setup_veth
build_probe uverbs_probe

t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0"
uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0"
before=$(res_counts urdma0) || fail "rdma resource show urdma0"
echo "resources before: $before"

info=$(t "$PROBE" "$uv" info) || fail "probe info: $(tail -n1 <<<"$info")"
echo "$info"
field() { awk -F= -v k="$1" '$1 == k {print $2}' <<<"$info"; }
[ "$(field magic)" = "$(abi_define URDMA_ABI_MAGIC)" ] || fail "context magic $(field magic)"
[ "$(field port_state)" = 4 ] || fail "query_port state $(field port_state), want 4 (ACTIVE)"
# query_device (what ibv_devinfo prints) and sysfs agree on the version.
fw=$(cat /sys/class/infiniband/urdma0/fw_ver)
[ "$(field fw_ver)" = "$fw" ] || fail "query_device fw_ver $(field fw_ver), sysfs fw_ver $fw"
[ "$fw" != 0.0.0 ] || fail "fw_ver is 0.0.0"
# The limits come from the module; a device without them would be useless.
for k in max_qp max_qp_wr max_sge max_cq max_cqe max_mr max_pd max_mr_size max_qp_rd_atom; do
	[ "$(field $k)" -gt 0 ] 2>/dev/null || fail "$k is '$(field $k)'"
done

STEP_TIMEOUT=900 t "$PROBE" "$uv" cycle 1000 || fail "1000 create/destroy cycles"
after=$(res_counts urdma0) || fail "rdma resource show urdma0"
[ "$after" = "$before" ] || fail "resource counts '$after' after cycles, were '$before'"

out=$(t "$PROBE" "$uv" errors)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "$(grep -m1 '^FAIL' <<<"$out")"
after=$(res_counts urdma0) || fail "rdma resource show urdma0"
[ "$after" = "$before" ] || fail "resource counts '$after' after error checks, were '$before'"

# REQ_NOTIFY_CQ, which the provider sends when an armed CQ has an event
# due, wakes the CQ's completion channel: one event per call.
out=$(t "$PROBE" "$uv" notify)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "$(grep -m1 '^FAIL' <<<"$out")"
after=$(res_counts urdma0) || fail "rdma resource show urdma0"
[ "$after" = "$before" ] || fail "resource counts '$after' after notify checks, were '$before'"

# A process that dies with objects open leaves nothing behind.
t "$PROBE" "$uv" hold 0 >/dev/null || fail "probe hold"
after=$(res_counts urdma0) || fail "rdma resource show urdma0"
[ "$after" = "$before" ] || fail "resource counts '$after' after exit with objects, were '$before'"

# Killed in the middle of creating and destroying: nothing is left behind.
"$PROBE" "$uv" cycle 1000000 >/dev/null &
victims=$!
"$PROBE" "$uv" cycle 1000000 >/dev/null &
victims="$victims $!"
sleep 3
kill -KILL $victims
wait $victims 2>/dev/null
after=$(res_counts urdma0) || fail "rdma resource show urdma0"
[ "$after" = "$before" ] || fail "resource counts '$after' after SIGKILL mid-cycle, were '$before'"

dmesg_check
echo "ok"
