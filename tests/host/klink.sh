#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# scripts/klink.sh, the link the benchmarks give rxe and siw, in a network namespace this test
# creates (and removes): after klink_up, pings between the two local addresses cross the veth
# pair both ways (its packet counters move) instead of loopback; klink_down puts the routing
# rules back as they were.  Needs root.  Prints "klink: N passed, M failed".
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ns=urdma-klink-$$
passed=0
failed=0
ok() { echo "ok   $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
at() { ip netns exec "$ns" "$@"; }
tx() { at cat "/sys/class/net/$1/statistics/tx_packets"; }

ip netns add "$ns" || { echo "FAIL: cannot create network namespace $ns"; exit 1; }
trap 'ip netns del "$ns" 2>/dev/null' EXIT
at ip link set lo up
at ip link add kl0 type veth peer name kl1 || { echo "FAIL: cannot create a veth pair"; exit 1; }
# No IPv6 on the pair: its neighbour discovery would move the counters read below.
at sysctl -qw net.ipv6.conf.kl0.disable_ipv6=1 net.ipv6.conf.kl1.disable_ipv6=1
rules_before=$(at ip rule show)

if at bash -c '. scripts/klink.sh && klink_up kl0 kl1 10.79.0.1 10.79.0.2'; then
	ok "klink_up"
else
	bad "klink_up"
fi
a0=$(tx kl0)
b0=$(tx kl1)
if at timeout 20 ping -c 3 -W 2 -I 10.79.0.1 10.79.0.2 >/dev/null; then
	ok "ping 10.79.0.1 -> 10.79.0.2"
else
	bad "ping 10.79.0.1 -> 10.79.0.2"
fi
a1=$(tx kl0)
b1=$(tx kl1)
# Requests leave by kl0, replies by kl1; through loopback neither counter would move.
if [ $((a1 - a0)) -ge 3 ] && [ $((b1 - b0)) -ge 3 ]; then
	ok "the pings crossed the veth pair (kl0 sent $((a1 - a0)), kl1 sent $((b1 - b0)))"
else
	bad "the pings did not cross the veth pair (kl0 sent $((a1 - a0)), kl1 sent $((b1 - b0)))"
fi
at bash -c '. scripts/klink.sh && klink_down kl0 kl1'
if [ "$(at ip rule show)" = "$rules_before" ]; then
	ok "klink_down restored the rules"
else
	bad "klink_down left other rules: $(at ip rule show | tr '\n' ';')"
fi
echo "klink: $passed passed, $failed failed"
[ "$failed" = 0 ]
