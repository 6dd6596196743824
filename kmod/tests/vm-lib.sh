# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Shared by tests/vm/10-kmod-*.sh: sourced inside the VM, from the repo root.
# Every step is bounded in time; a failure prints one line and exits 1.

KMOD_KO=$PWD/kmod/urdma.ko
STEP_TIMEOUT=${STEP_TIMEOUT:-60}
. "$(dirname "${BASH_SOURCE[0]}")/../../tests/lib.sh"

module_loaded() {
	grep -q "^urdma " /proc/modules
}

ensure_module() {
	module_loaded || t insmod "$KMOD_KO" || fail "insmod $KMOD_KO"
}

# A fresh veth pair, both ends up; removed when the test exits.
setup_veth() {
	t ip link del veth0 2>/dev/null
	t ip link add veth0 type veth peer name veth1 || fail "cannot create veth pair"
	t ip link set veth0 up || fail "veth0 up"
	t ip link set veth1 up || fail "veth1 up"
	trap cleanup EXIT
}

cleanup() {
	delete_urdma_links
	timeout 30 ip link del veth0 2>/dev/null
	true
}

# /sys/class/infiniband/$1/ports/1/state is "4: ACTIVE" or "1: DOWN".
port_state() {
	local s
	s=$(cat "/sys/class/infiniband/$1/ports/1/state" 2>/dev/null) || return 1
	echo "${s#*: }"
}

# Waits up to $3 seconds for device $1's port to reach state $2.
wait_port_state() {
	local i
	for ((i = 0; i < $3 * 5; i++)); do
		[ "$(port_state "$1")" = "$2" ] && return 0
		sleep 0.2
	done
	return 1
}

# The /dev/infiniband/uverbsN of device $1.
uverbs_dev() {
	local d
	for d in /sys/class/infiniband_verbs/uverbs*; do
		[ "$(cat "$d/ibdev" 2>/dev/null)" = "$1" ] && { echo "/dev/infiniband/${d##*/}"; return 0; }
	done
	return 1
}

# build_probe NAME: builds kmod/tests/NAME.c (a probe that speaks raw uverbs or ucma) into
# $URDMA_OUT and sets PROBE to it.  A build newer than its sources is used as it is: gcc
# under the VM's emulation takes seconds, and scripts/test builds the probes on the host,
# into the VM's $URDMA_OUT, before the VM stage.
build_probe() {
	PROBE=${URDMA_OUT:-/tmp}/$1
	[ "$PROBE" -nt "kmod/tests/$1.c" ] && [ "$PROBE" -nt kmod/urdma-abi.h ] && return 0
	t gcc -O2 -Wall -o "$PROBE" "kmod/tests/$1.c" || fail "cannot build kmod/tests/$1.c"
}

# A #define from the ABI header.
abi_define() {
	awk -v n="$1" '$1 == "#define" && $2 == n {print $3}' kmod/urdma-abi.h | sed 's/U$//'
}
