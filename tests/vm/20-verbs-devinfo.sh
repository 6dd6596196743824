#!/usr/bin/env bash
# Unmodified rdma-core tools see urdma0 through liburdma: ibv_devices lists
# it, ibv_devinfo -v shows an iWARP port that follows the netdev and the
# limits urdma.ko declares, rdma link show lists it.
set -u
. tests/verbs/vm-lib.sh

setup_urdma0

devs=$(t ibv_devices) || fail "ibv_devices failed"
echo "$devs"
grep -qE '^\s+urdma0\s' <<<"$devs" || fail "ibv_devices does not list urdma0"

t rdma link show | grep -q '^link urdma0/1 ' || fail "rdma link show does not list urdma0"

info=$(URDMA_LOG=error t ibv_devinfo -v -d urdma0 2>&1) || fail "ibv_devinfo -v -d urdma0: $(tail -n1 <<<"$info")"
echo "$info"
val() { awk -v k="$1:" '$1 == k {print $2; exit}' <<<"$info"; }
[ "$(val transport)" = iWARP ] || fail "transport '$(val transport)', want iWARP"
[ "$(val state)" = PORT_ACTIVE ] || fail "port state '$(val state)', want PORT_ACTIVE"
[ "$(val link_layer)" = Ethernet ] || fail "link_layer '$(val link_layer)', want Ethernet"

# Each limit as the module declares it (ibv_devinfo prints max_mr_size in hex).
# Object counts may be lowered per load with module parameters.
check_limit() {
	local got want
	got=$(val "$1")
	if [ $# = 3 ]; then want=$(kmod_count_limit "$3" "$2"); else want=$(kmod_limit "$2"); fi
	[ -n "$got" ] && [ $((got)) = "$want" ] || fail "$1 is '$got', urdma.ko declares $2 = $want"
}
check_limit max_qp URDMA_MAX_QP max_qp
check_limit max_qp_wr URDMA_MAX_QP_WR
check_limit max_sge URDMA_MAX_SGE
check_limit max_sge_rd URDMA_MAX_SGE_RD
check_limit max_cq URDMA_MAX_CQ max_cq
check_limit max_cqe URDMA_MAX_CQE
check_limit max_mr URDMA_MAX_MR max_mr
check_limit max_pd URDMA_MAX_PD max_pd
check_limit max_mr_size URDMA_MAX_MR_SIZE
check_limit max_qp_rd_atom URDMA_MAX_IRD
check_limit max_qp_init_rd_atom URDMA_MAX_ORD
check_limit max_srq URDMA_MAX_SRQ max_srq
check_limit max_srq_wr URDMA_MAX_SRQ_WR
check_limit max_srq_sge URDMA_MAX_SGE
# Memory windows of type 1 and 2B (tests/vm/67-e2e-mw.sh).
check_limit max_mw URDMA_MAX_MW max_mw
for flag in MEM_WINDOW MEM_WINDOW_TYPE_2B; do
	grep -qE "^\s+$flag\s*$" <<<"$info" || fail "device_cap_flags lack $flag"
done
# RFC 7306 atomics, atomic across QPs and processes (tests/vm/64-e2e-atomic.sh).
[ "$(val atomic_cap)" = ATOMIC_HCA ] || fail "atomic_cap is '$(val atomic_cap)', expected ATOMIC_HCA"
# rdma-core's test suite rejects a device whose vendor_id is 0.
[ "$(val vendor_id)" = "$(printf '0x%x' "$(kmod_limit URDMA_VENDOR_ID)")" ] ||
	fail "vendor_id is '$(val vendor_id)', urdma.ko declares URDMA_VENDOR_ID = $(kmod_limit URDMA_VENDOR_ID)"

# The firmware version the provider decodes from query_device is the one sysfs shows.
fw_sysfs=$(cat /sys/class/infiniband/urdma0/fw_ver)
[ "$(val fw_ver)" = "$fw_sysfs" ] || fail "fw_ver '$(val fw_ver)' from ibv_devinfo, sysfs says '$fw_sysfs'"
[ "$fw_sysfs" != 0.0.0 ] || fail "fw_ver is 0.0.0"

# The provider is silent unless URDMA_LOG asks, and then says what it did.
quiet=$(env -u URDMA_LOG timeout 60 ibv_devinfo -d urdma0 2>&1 >/dev/null)
[ -z "$quiet" ] || fail "ibv_devinfo wrote to stderr without URDMA_LOG: $(head -n1 <<<"$quiet")"
loud=$(URDMA_LOG=debug timeout 60 ibv_devinfo -d urdma0 2>&1 >/dev/null)
grep -q "liburdma.*opened urdma device" <<<"$loud" || fail "URDMA_LOG=debug logged nothing about opening the device"
# Without URDMA_LOG, rdma-core's own variables: VERBS_LOG_LEVEL=4 (debug) into VERBS_LOG_FILE.
vlog=$(mktemp)
quiet=$(env -u URDMA_LOG VERBS_LOG_LEVEL=4 VERBS_LOG_FILE="$vlog" timeout 60 ibv_devinfo -d urdma0 2>&1 >/dev/null)
[ -z "$quiet" ] || fail "VERBS_LOG_FILE set, yet the provider wrote to stderr: $(head -n1 <<<"$quiet")"
grep -q "liburdma.*opened urdma device" "$vlog" || fail "VERBS_LOG_LEVEL=4 logged nothing about opening the device into VERBS_LOG_FILE"
rm -f "$vlog"

# The port follows the netdev.
t ip link set veth0 down || fail "ip link set veth0 down"
down=""
for _ in $(seq 50); do
	down=$(t ibv_devinfo -d urdma0 | awk '$1 == "state:" {print $2; exit}')
	[ "$down" = PORT_DOWN ] && break
	sleep 0.2
done
[ "$down" = PORT_DOWN ] || fail "port state '$down' with veth0 down, want PORT_DOWN"
t ip link set veth0 up || fail "ip link set veth0 up"

dmesg_check
echo "PASS"
