# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Sourced, not run: the link the kernel's RDMA stacks (rxe, siw) use when both ends live in one
# host, by scripts/bench-guest, scripts/profile-guest and tests/vm/59-e2e-overload.sh (and
# tested by tests/host/klink.sh).
#
# klink_up IA IB AA AB: policy routing that sends what one local address sends to the other
# across the link between interfaces IA and IB (address AA on IA, AB on IB) instead of
# through loopback: rules "to X iif lo" (locally originated) and "to X oif IF" (sockets bound
# to a device) point at table $KTABLE (178 unless set), which routes X out of the other end;
# the local table is consulted after them, accept_local lets an interface take packets from a
# local source address, rp_filter is off and neighbours are permanent (ARP between two local
# addresses would not resolve).  Takes any two interfaces: a veth pair or two NICs cabled to
# each other.  klink_down IA IB undoes it (the interfaces stay).
#
# kstack_up STACK IA IB AA AB [SIW_KO]: a new veth pair IA-IB joined by klink_up, and a device
# of the kernel's STACK (rxe or siw) on each end, STACK0 on IA and STACK1 on IB (siw.ko is
# loaded from SIW_KO unless siw is loaded already).  kstack_down STACK IA IB removes the
# devices and the pair.

KTABLE=${KTABLE:-178}

klink_up() {
	local ia=$1 ib=$2 aa=$3 ab=$4 i
	for i in "$ia" "$ib"; do
		ip link set "$i" up || return 1
		ip addr replace "$([ "$i" = "$ia" ] && echo "$aa" || echo "$ab")/24" dev "$i" || return 1
		sysctl -qw "net.ipv4.conf.$i.accept_local=1" "net.ipv4.conf.$i.rp_filter=0" || return 1
	done
	sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 || return 1
	ip route replace "$ab" dev "$ia" src "$aa" table "$KTABLE" || return 1
	ip route replace "$aa" dev "$ib" src "$ab" table "$KTABLE" || return 1
	ip rule add pref 100 to "$ab" iif lo lookup "$KTABLE" || return 1
	ip rule add pref 101 to "$aa" iif lo lookup "$KTABLE" || return 1
	ip rule add pref 102 to "$ab" oif "$ia" lookup "$KTABLE" || return 1
	ip rule add pref 103 to "$aa" oif "$ib" lookup "$KTABLE" || return 1
	if ip rule show pref 0 | grep -q "lookup local"; then
		ip rule add pref 1000 lookup local || return 1
		ip rule del pref 0 || return 1
	fi
	ip neigh replace "$ab" lladdr "$(cat "/sys/class/net/$ib/address")" dev "$ia" nud permanent || return 1
	ip neigh replace "$aa" lladdr "$(cat "/sys/class/net/$ia/address")" dev "$ib" nud permanent || return 1
}

klink_down() {
	local ia=$1 ib=$2 p
	for p in 100 101 102 103; do ip rule del pref "$p" 2>/dev/null; done
	ip route flush table "$KTABLE" 2>/dev/null
	if ! ip rule show pref 0 | grep -q "lookup local"; then
		ip rule add pref 0 lookup local
		ip rule del pref 1000 2>/dev/null
	fi
	ip addr flush dev "$ia" 2>/dev/null
	ip addr flush dev "$ib" 2>/dev/null
	true
}

kstack_up() {
	local s=$1 ia=$2 ib=$3 aa=$4 ab=$5 ko=${6:-}
	case "$s" in
	rxe) modprobe rdma_rxe || return 1 ;;
	siw)
		if ! grep -q "^siw " /proc/modules; then
			modprobe ib_core && modprobe libcrc32c && insmod "$ko" || return 1
		fi
		;;
	*) return 1 ;;
	esac
	ip link del "$ia" 2>/dev/null
	ip link add "$ia" type veth peer name "$ib" || return 1
	klink_up "$ia" "$ib" "$aa" "$ab" || return 1
	timeout -k 5 120 rdma link add "${s}0" type "$s" netdev "$ia" || return 1
	timeout -k 5 120 rdma link add "${s}1" type "$s" netdev "$ib" || return 1
}

kstack_down() {
	local s=$1 ia=$2 ib=$3
	timeout -k 5 120 rdma link del "${s}0" 2>/dev/null
	timeout -k 5 120 rdma link del "${s}1" 2>/dev/null
	klink_down "$ia" "$ib"
	ip link del "$ia" 2>/dev/null
	true
}
