# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Shared by tests/vm/20-verbs-*.sh: sourced inside the VM from the repo root,
# where scripts/vm has loaded urdma.ko and installed the provider.
# Every step is bounded in time; a failure prints one line and exits 1.

STEP_TIMEOUT=${STEP_TIMEOUT:-120}
OUT=${URDMA_OUT:-/tmp}
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

URDMAD_DIR=/run/urdma/verbs-test

cleanup() {
	local pid
	timeout 30 rdma link delete urdma0 >/dev/null 2>&1
	pid=$(cat "$URDMAD_DIR/urdmad.pid" 2>/dev/null)
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill "$pid"
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -9 "$pid" 2>/dev/null
	fi
	rm -rf "$URDMAD_DIR"
	timeout 30 ip link del vethv0 >/dev/null 2>&1
	true
}

# urdma0 on interface veth0, both removed when the test exits.  veth0 is the exception
# (TAP) interface of a urdmad of the test's own whose port is one end of a veth pair
# (vethv0/vethv1): a QP needs the urdmad that serves its device (docs/connection.md).
setup_urdma0() {
	local urdmad=target/release/urdmad
	grep -q "^urdma " /proc/modules || fail "urdma.ko is not loaded"
	[ -f /etc/libibverbs.d/urdma.driver ] || fail "provider not installed (/etc/libibverbs.d/urdma.driver)"
	cleanup
	trap cleanup EXIT
	t ip link add vethv0 type veth peer name vethv1 || fail "cannot create veth pair"
	t ip link set vethv0 up && t ip link set vethv1 up || fail "cannot bring the veth pair up"
	mkdir -p "$URDMAD_DIR"
	cat >"$URDMAD_DIR/urdmad.toml" <<-EOF
		[daemon]
		socket = "$URDMAD_DIR/urdmad.sock"
		group = ""
		file_prefix = "urdmaverbs"
		memory_mb = 64
		mbufs = 4095
		ring_size = 512

		[[port]]
		name = "port0"
		device = "net_af_packet0,iface=vethv1"
		exception = "veth0"
	EOF
	"$urdmad" --config "$URDMAD_DIR/urdmad.toml" </dev/null >"$OUT/verbs-urdmad.log" 2>&1 &
	echo $! >"$URDMAD_DIR/urdmad.pid"
	for _ in $(seq 600); do
		ip link show veth0 >/dev/null 2>&1 &&
			timeout 20 "$urdmad" status --socket "$URDMAD_DIR/urdmad.sock" >/dev/null 2>&1 && break
		kill -0 "$(cat "$URDMAD_DIR/urdmad.pid")" 2>/dev/null ||
			fail "urdmad did not start: $(tail -n1 "$OUT/verbs-urdmad.log")"
		sleep 0.2
	done
	t ip link set veth0 up || fail "cannot bring veth0 up"
	t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0 type urdma netdev veth0"
	dmesg_mark
}

# A limit urdma.ko declares, evaluated from its #define in kmod/urdma.h.
kmod_limit() {
	local v
	v=$(awk -v k="$1" '$1 == "#define" && $2 == k {$1 = $2 = ""; print}' kmod/urdma.h |
		sed -E 's/([0-9])U?L*L?/\1/g; s/[()]//g')
	[ -n "$v" ] || fail "no $1 in kmod/urdma.h"
	echo $((v))
}

# An object-count limit: module parameter $1 (urdma.ko clamps it to
# [1, $2]), or the #define $2 when the module has no such parameter.
kmod_count_limit() {
	local max p
	max=$(kmod_limit "$2") || exit 1
	p=$(cat "/sys/module/urdma/parameters/$1" 2>/dev/null) || { echo "$max"; return; }
	((p < 1)) && p=1
	((p > max)) && p=$max
	echo "$p"
}

# Builds tests/verbs/$1.c against the installed libibverbs only.
build_c() {
	local exe=$OUT/$1
	if [ "$exe" -nt "tests/verbs/$1.c" ]; then
		echo "$exe"
		return 0
	fi
	TMPDIR=$OUT t cc -O2 -Wall -Werror -o "$exe" "tests/verbs/$1.c" -libverbs ||
		fail "cannot build tests/verbs/$1.c"
	echo "$exe"
}
