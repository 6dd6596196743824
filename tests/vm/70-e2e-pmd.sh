#!/usr/bin/env bash
# The PMD link end to end (docs/testbed.md, "The PMD link"): the bed's nodes wired by the VM's
# two virtio-net PCI NICs instead of the veth pair, each urdmad driving its NIC through DPDK's
# virtio PMD (the NIC bound to vfio-pci behind the VM's IOMMU, so that its RX queues
# interrupt). Each urdmad's port is its NIC and says its frames end its sleeps by interrupt,
# and idle, each urdmad wakes at most IDLE_PMD_WAKES (default 25) times a second (it sleeps
# 100 ms at a time, as on the veth bed; on its timer it wakes 200-330 times) and uses at most
# IDLE_PMD_BOUND_PCT (default 5) percent of one CPU in the quietest of three 5-s windows. The
# wake-ups are the sharp check: under emulation a wake-up's CPU time grows with the host's
# load (0.5-0.75 % on a quiet host, 4 % seen while another guest ran), their number does not.
# ping, rping -V, ib_write_bw -R and the data-verifying workload pass over it; verify passes
# again with 5 % of the link's frames dropped (by its relay on the host, scripts/pmd-relay:
# netem cannot reach frames the kernel never sees), and the devices' retransmissions rise
# with it. Then the NICs bound to uio_pci_generic, which has no RX interrupts: each urdmad
# says so in one log line and in status, and still serves (ping), on its timer. Last, a
# urdmad given a NIC bound to no driver exits non-zero with one line naming it.
# Reduced for CI (PMD_OPS=100 operations, PMD_RPING=50 iterations); the full form is
#   scripts/vm -- env PMD_OPS=2000 PMD_RPING=1000 tests/vm/run-all 70-e2e-pmd
# vm-timeout: 1800
set -u
export URDMA_BED_LINK=pmd
. tests/e2e/lib.sh

OPS=${PMD_OPS:-100}
RPING=${PMD_RPING:-50}
prog=$(build_e2e verify) || exit 1
port=7800
IDLE_BOUND=${IDLE_PMD_BOUND_PCT:-5}
IDLE_WAKES=${IDLE_PMD_WAKES:-25}

# urdmad_use NODE: the CPU time (ns) and the sleeps (voluntary context switches) of every
# thread of the node's urdmad, "ns sleeps".
urdmad_use() {
	local t pid ns=0 sw=0 a b
	pid=$(cat "/run/urdma/bed/$1.pid")
	for t in /proc/"$pid"/task/*; do
		read -r a _ <"$t/schedstat" || continue
		b=$(awk '/^voluntary_ctxt_switches/ {print $2}' "$t/status")
		ns=$((ns + a)) sw=$((sw + ${b:-0}))
	done
	echo "$ns $sw"
}
# idle_use NODE...: for each node's urdmad over 5 s with no traffic, "NODE=PCT/WAKES": percent
# of one CPU and wake-ups a second.
idle_use() {
	local n s0 s1 out=
	declare -A c
	s0=$(date +%s.%N)
	for n in "$@"; do c[$n]=$(urdmad_use "$n"); done
	sleep 5
	s1=$(date +%s.%N)
	for n in "$@"; do
		out+="$n=$(awk -v a="${c[$n]}" -v b="$(urdmad_use "$n")" -v s0="$s0" -v s1="$s1" 'BEGIN {
			split(a, x, " "); split(b, y, " "); d = s1 - s0
			printf "%.2f/%.1f", (y[1] - x[1]) / 1e7 / d, (y[2] - x[2]) / d }') "
	done
	echo "$out"
}

# verify_run LABEL: verify.c, client in node A, server in node B, 2 connections.
verify_run() {
	local label=$1 t0=$SECONDS
	port=$((port + 1))
	start_server B "pmd-verify-$label" "listening" "$prog" server "$ADDR_B" "$port" -c 2 -n "$OPS" -t 900
	t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -c 2 -n "$OPS" -t 900 \
		>"$OUT/pmd-verify-$label-client.log" 2>&1 ||
		fail "verify over the PMD link ($label): $(grep -m1 FAIL "$OUT/pmd-verify-$label-client.log" || tail -n1 "$OUT/pmd-verify-$label-client.log")"
	wait_server "pmd-verify-$label" 120
	grep -q "verify: ok server" "$OUT/pmd-verify-$label.log" || fail "verify server ($label) did not finish"
	echo "verify ($label): 2 connections x $OPS operations in $((SECONDS - t0)) s"
}

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)
IFS=, read -r pci_a pci_b <<<"$URDMA_VM_PMD_LINK"
for n in A B; do
	want=$pci_a
	[ "$n" = B ] && want=$pci_b
	device=$(t "$BED" status --json "$n" | jq -r '.port[0].device')
	[ "$device" = "$want" ] || fail "node $n's port is '$device', not the NIC $want"
	driver=$(basename "$(readlink "/sys/bus/pci/devices/$want/driver")")
	[ "$driver" = vfio-pci ] || fail "NIC $want is bound to '$driver', not vfio-pci"
	wake=$(t "$BED" status --json "$n" | jq -r '.port[0] | "\(.rx_wake) \(.rx_wake_reason)"')
	[ "$wake" = "interrupt null" ] || fail "node $n's port: rx_wake '$wake', not interrupt"
done
echo "ports: node A on $pci_a, node B on $pci_b (vfio-pci, DPDK's virtio PMD, RX interrupts)"
declare -A least=([A]=100 [B]=100)
for w in 1 2 3; do
	idle=$(idle_use A B)
	echo "idle, interrupts, window $w: urdmad % of one CPU/wake-ups a second: $idle(bounds $IDLE_BOUND % in the quietest window, $IDLE_WAKES wake-ups in each)"
	for kv in $idle; do
		n=${kv%%=*} pct=${kv#*=} wakes=${kv#*/}
		pct=${pct%/*}
		awk -v w="$wakes" -v b="$IDLE_WAKES" 'BEGIN {exit !(w <= b)}' ||
			fail "idle urdmad $n on its PMD port woke $wakes times a second, above $IDLE_WAKES"
		least[$n]=$(awk -v a="${least[$n]}" -v b="$pct" 'BEGIN {print (b < a ? b : a)}')
	done
done
for n in A B; do
	awk -v p="${least[$n]}" -v b="$IDLE_BOUND" 'BEGIN {exit !(p <= b)}' ||
		fail "idle urdmad $n on its PMD port used ${least[$n]} % of one CPU in its quietest window, above $IDLE_BOUND %"
done

t "$BED" exec A ping -c 3 -i 0.5 -W 10 "$ADDR_B" >/dev/null || fail "ping across the PMD link"
rx=$(t "$BED" status --json B | jq -r '.port[0].rx_packets')
[ "$rx" -gt 0 ] || fail "node B's port counted no frame after a ping"

port=$((port + 1))
start_server B pmd-rping "." sh -c "echo started; exec rping -s -a $ADDR_B -p $port -C $RPING -S 4096 -V"
wait_listening B "$port"
out=$(timeout -k 5 900 ip netns exec urdmaA rping -c -a "$ADDR_B" -p "$port" -C "$RPING" -S 4096 -V 2>&1) ||
	fail "rping -V over the PMD link: $(tail -n2 <<<"$out" | tr '\n' ' ')"
wait_server pmd-rping 120
grep -qiE "error|fail|mismatch" "$OUT/pmd-rping.log" && fail "rping server: $(grep -m1 -iE 'error|fail|mismatch' "$OUT/pmd-rping.log")"
echo "rping -V -S 4096 -C $RPING: ok"

t "$BED" pair --timeout 900 --logs "$OUT/pmd-perftest" ib_write_bw -R -s 65536 -n 100 >"$OUT/pmd-perftest.log" 2>&1 ||
	fail "ib_write_bw -R over the PMD link: $(tail -n2 "$OUT/pmd-perftest.log" | tr '\n' ' ')"
row=$(grep -E "^ *65536 +100 " "$OUT/pmd-perftest/ib_write_bw-client.log") ||
	fail "ib_write_bw printed no result row"
echo "ib_write_bw -R -s 65536 -n 100: $(awk '{print $4 " MB/s"}' <<<"$row")"

verify_run clean
retrans0=$(hw_sum retransmissions)
t "$BED" netem loss 5% || fail "scripts/bed netem loss 5% on the PMD link"
verify_run loss5
t "$BED" netem off || fail "scripts/bed netem off"
hw_above retransmissions "$retrans0" "verify under 5 % loss"

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30

t "$BED" down >"$OUT/bed-down.log" 2>&1 || fail "scripts/bed down: $(tail -n1 "$OUT/bed-down.log")"
URDMA_BED_PMD_DRIVER=uio_pci_generic bed_up
for n in A B; do
	wake=$(t "$BED" status --json "$n" | jq -r '.port[0] | "\(.rx_wake): \(.rx_wake_reason)"')
	[[ "$wake" == "timer: the PMD refused RX interrupts: "* ]] ||
		fail "node $n's port under uio_pci_generic: rx_wake '$wake'"
	lines=$(grep -c "no RX interrupts" "/run/urdma/bed/$n.log")
	[ "$lines" = 1 ] || fail "node $n's urdmad logged $lines lines on its missing interrupts, not 1"
done
t "$BED" exec A ping -c 3 -i 0.5 -W 10 "$ADDR_B" >/dev/null || fail "ping across the PMD link without interrupts"
echo "uio_pci_generic: $wake; ping: ok; idle urdmad % of one CPU/wake-ups a second: $(idle_use A B)"

# Bad input: a urdmad whose port names a NIC bound to no driver says so in one line naming the
# NIC and exits non-zero, and leaves the other NIC as it was.
t "$BED" down >"$OUT/bed-down-uio.log" 2>&1 || fail "scripts/bed down: $(tail -n1 "$OUT/bed-down-uio.log")"
drv_a=$(basename "$(readlink "/sys/bus/pci/devices/$pci_a/driver")")
drv_b=$(basename "$(readlink "/sys/bus/pci/devices/$pci_b/driver")")
echo "$pci_a" >"/sys/bus/pci/devices/$pci_a/driver/unbind" || fail "cannot unbind $pci_a from $drv_a"
bad=$OUT/pmd-unbound
printf '%s\n' "[daemon]" 'socket = "/run/urdma/pmd-unbound.sock"' 'group = ""' \
	'file_prefix = "urdmapmdunbound"' "memory_mb = 64" "" "[[port]]" 'name = "unbound"' \
	"device = \"$pci_a\"" 'exception = "urdma-tapx"' 'addresses = ["10.77.9.1/24"]' >"$bad.toml"
ip netns add urdmapmdx || fail "ip netns add urdmapmdx"
timeout -k 5 120 ip netns exec urdmapmdx target/release/urdmad --config "$bad.toml" </dev/null >"$bad.log" 2>&1
rc=$?
ip netns del urdmapmdx
echo "$pci_a" >/sys/bus/pci/drivers_probe
[ "$(basename "$(readlink "/sys/bus/pci/devices/$pci_a/driver")")" = "$drv_a" ] || fail "$pci_a not rebound to $drv_a"
case $rc in 0 | 124 | 137) fail "urdmad with an unbound NIC: exit $rc, not an error exit" ;; esac
want="PCI device $pci_a has no DPDK port: it is bound to no driver (bind it to vfio-pci)"
lines=$(grep -c "$pci_a" "$bad.log")
grep -qF "$want" "$bad.log" && [ "$lines" = 1 ] ||
	fail "urdmad with an unbound NIC: $lines lines name $pci_a, not the one line '$want': $(tail -n3 "$bad.log" | tr '\n' ' ')"
[ "$(basename "$(readlink "/sys/bus/pci/devices/$pci_b/driver")")" = "$drv_b" ] ||
	fail "urdmad with an unbound NIC $pci_a changed $pci_b's driver"
echo "unbound NIC: exit $rc, '$(grep -F "$pci_a" "$bad.log")'"
dmesg_check
echo "PASS"
