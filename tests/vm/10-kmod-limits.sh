#!/usr/bin/env bash
# urdma.ko enforces the object limits it declares: with the limits lowered
# through module parameters, every kind of object stops exactly at its
# limit with ENOMEM and has room again after one is freed.  Parameters above
# the built-in maxima are clamped to them.
set -u
. kmod/tests/vm-lib.sh

reload() {
	cleanup
	if module_loaded; then t rmmod urdma || fail "rmmod urdma"; fi
	t insmod "$KMOD_KO" "$@" || fail "insmod urdma.ko $*"
}
restore() {
	cleanup
	module_loaded && timeout 30 rmmod urdma
	timeout 30 insmod "$KMOD_KO"
}

dmesg_mark
build_probe uverbs_probe
reload max_ctx=4 max_pd=8 max_mr=8 max_mw=8 max_cq=8 max_qp=8
setup_veth
trap restore EXIT

t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0"
uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0"
info=$(t "$PROBE" "$uv" info) || fail "probe info: $(tail -n1 <<<"$info")"
for k in max_qp max_cq max_mr max_mw max_pd; do
	grep -qx "$k=8" <<<"$info" || fail "$k not lowered to 8: $(grep "^$k=" <<<"$info")"
done

out=$(t "$PROBE" "$uv" limits 4)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "$(grep -m1 '^FAIL' <<<"$out")"

reload max_qp=99999999
setup_veth
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0 (clamped)"
uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0"
info=$(t "$PROBE" "$uv" info) || fail "probe info: $(tail -n1 <<<"$info")"
want=$(awk '$1 == "#define" && $2 == "URDMA_MAX_QP" {print $3}' kmod/urdma.h)
grep -qx "max_qp=$want" <<<"$info" || fail "max_qp=99999999 not clamped to $want: $(grep '^max_qp=' <<<"$info")"

dmesg_check
echo "ok"
