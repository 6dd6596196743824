#!/bin/bash
# One node of tests/deploy, run by urdma-test.service after each boot of the Debian 12 image
# (scripts/image). The node's letter (a or b) is on the kernel command line; what it has done
# so far is in /var/lib/urdma-test-stage, on its own disk, which lives through its reboots.
#
#   install  (node a) install urdma's packages from the share, configure urdmad as
#            docs/two-hosts.md says, enable it, reboot; node b starts as a copy of this disk
#            (tests/deploy/run), and a unit installed here gives it its own address
#   booted   find urdmad, the device and its address; node b serves rping, node a checks
#            rping -V, `systemctl restart urdmad` and `kill -9` of urdmad; then each node
#            purges the packages and checks that nothing is left
#
# The share holds the packages (debs/), this node's log (NODE.log) and its result lines
# (NODE.result: "ok ..." or "FAIL ...", then "done"); a node waits for the other's files
# there.
set -uo pipefail

share=/mnt/test
node=$(sed -n 's/.*urdma_test_node=\([ab]\).*/\1/p' /proc/cmdline)
[ -n "$node" ] || { echo "deploy: no urdma_test_node=a|b on the kernel command line"; exit 1; }
peer=$([ "$node" = a ] && echo b || echo a)
addr_of() { [ "$1" = a ] && echo 10.78.0.1 || echo 10.78.0.2; }
addr=$(addr_of "$node")
peer_addr=$(addr_of "$peer")
mac=52:54:00:78:00:0$([ "$node" = a ] && echo a || echo b)
tap=urdma-tap0
dev=urdma0
stage_file=/var/lib/urdma-test-stage
# The packaged daemon (not on the host that runs the tests, which has no package installed).
urdmad=/usr/sbin/urdmad
result=$share/$node.result
# How long urdmad may take to bring the device back: after a boot, a restart or a kill -9.
# Under emulation with one vCPU; measured figures go to the result lines.
BOUND=${URDMA_DEPLOY_BOUND:-90}

exec >>"$share/$node.log" 2>&1
echo "=== node $node, boot $(cat /proc/sys/kernel/random/boot_id), stage $(cat "$stage_file" 2>/dev/null || echo install)"

# wait_for, a bounded wait on a condition: the tests' shared helpers, beside this script in the
# share (tests/deploy/run puts them there); ok, fail and check below are this test's own.
. "$share/lib.sh"
ok() { echo "ok   $*" | tee -a "$result"; }
fail() { echo "FAIL $*" | tee -a "$result"; }
check() { # DESCRIPTION CMD...
	local what=$1
	shift
	if "$@"; then ok "$what"; else fail "$what"; fi
}
finish() {
	echo done >>"$result"
	exit 0
}

# The device is there, on the TAP, the TAP up with the node's address, urdmad active; or
# what is missing, on stdout.
device_ready() {
	systemctl is-active -q urdmad || { echo "urdmad is $(systemctl is-active urdmad)"; return 1; }
	rdma link show "$dev/1" 2>/dev/null | grep -q "netdev $tap" || { echo "no $dev on $tap"; return 1; }
	ip link show dev "$tap" 2>/dev/null | grep -q "[<,]UP[,>]" || { echo "$tap is not up"; return 1; }
	ip -o -4 addr show dev "$tap" 2>/dev/null | grep -q "inet $addr/24" || { echo "$tap has no $addr/24"; return 1; }
}
# wait_ready SECS: seconds until device_ready; what was missing after SECS.
wait_ready() {
	local start=$SECONDS why
	while [ $((SECONDS - start)) -lt "$1" ]; do
		why=$(device_ready) && { echo $((SECONDS - start)); return 0; }
		sleep 1
	done
	echo "$why"
	return 1
}
# A verifying rping to the peer; the peer's server may still be starting: tried for SECS.
rping_peer() { # SECS
	local start=$SECONDS
	while [ $((SECONDS - start)) -lt "$1" ]; do
		timeout 60 rping -c -a "$peer_addr" -V -C 20 -S 4096 && return 0
		sleep 2
	done
	return 1
}

stage_install() {
	check "booted with systemd as init" test "$(cat /proc/1/comm)" = systemd
	rm -rf /tmp/debs && cp -r "$share/debs" /tmp/debs
	local start=$SECONDS
	if DEBIAN_FRONTEND=noninteractive apt-get install -y /tmp/debs/*.deb; then
		ok "the packages install with no network ($((SECONDS - start)) s, DKMS included)"
	else
		fail "the packages install with no network"
		finish
	fi
	check "DKMS built urdma.ko for the running kernel" \
		sh -c "dkms status urdma | grep -q '$(uname -r).*installed'"
	check "modinfo finds urdma.ko" modinfo -n urdma

	local iface
	iface=$(ip -br link | awk -v m="$mac" '$3 == m {print $1}')
	[ -n "$iface" ] || { fail "an interface with MAC $mac"; finish; }
	# What docs/two-hosts.md asks of a deployer: hugepages and the configuration.
	echo "vm.nr_hugepages = 128" >/etc/sysctl.d/urdma.conf
	cat >/etc/urdma/urdmad.toml <<-EOF
		[daemon]
		socket = "/run/urdma/urdmad.sock"
		memory_mb = 128

		[[port]]
		name = "port0"
		device = "net_af_packet0,iface=$iface"
		exception = "$tap"
		addresses = ["$addr/24"]
		rdma_device = "$dev"
	EOF
	check "urdmad --check-config accepts the configuration" \
		"$urdmad" --config /etc/urdma/urdmad.toml --check-config
	check "systemctl enable urdmad" systemctl enable urdmad
	# Node b, a copy of this system, takes its own address before urdmad starts, as a host
	# made from a common installation is given its own (not part of the packages).
	cat >/etc/systemd/system/urdma-test-node-b.service <<-EOF
		[Unit]
		Description=Node b's own address in urdmad's configuration (tests/deploy)
		ConditionKernelCommandLine=urdma_test_node=b
		Before=urdmad.service

		[Service]
		Type=oneshot
		ExecStart=/bin/sed -i 's|"$(addr_of a)/24"|"$(addr_of b)/24"|' /etc/urdma/urdmad.toml

		[Install]
		WantedBy=multi-user.target
	EOF
	check "the unit that gives node b its address" systemctl enable urdma-test-node-b.service
	echo booted >"$stage_file"
	sync
	# tests/deploy/run powers the system on again when it sees NODE.reboot.
	touch /run/urdma-test-reboot "$share/$node.reboot"
	sync
	# What `systemctl reboot` starts; without D-Bus (a minimal system) only this form works.
	systemctl start --job-mode=replace-irreversibly --no-block reboot.target
}

# Purges the packages and checks that none of their files, their configuration, their
# group, DKMS's module or urdmad's device and interface is left.
purge_and_check() {
	local files left
	files=$(dpkg -L urdma-provider urdmad urdma-dkms 2>/dev/null | sort -u)
	check "dpkg lists the packages' files" test -n "$files"
	check "apt-get purge urdma-provider urdmad urdma-dkms" \
		env DEBIAN_FRONTEND=noninteractive apt-get purge -y urdma-provider urdmad urdma-dkms
	left=$(while read -r f; do
		[ -e "$f" ] && [ ! -d "$f" ] && echo "$f"
	done <<<"$files")
	# Directories: only those the packages created, none a path of the system.
	left+=$(for d in /etc/urdma /usr/src/urdma-* /var/lib/dkms/urdma /run/urdma \
		/usr/share/doc/urdmad /usr/share/doc/urdma-provider /usr/share/doc/urdma-dkms; do
		[ -e "$d" ] && echo " $d"
	done)
	left+=$(find /lib/modules -name 'urdma.ko*' 2>/dev/null | sed 's/^/ /')
	check "nothing of the packages is left on disk${left:+: $left}" test -z "$left"
	check "the urdma group is gone" sh -c '! getent group urdma'
	check "urdmad is not running" sh -c '! pgrep -x urdmad'
	check "no urdma device and no $tap" sh -c "! rdma link show | grep -q urdma && ! ip link show $tap 2>/dev/null"
}

# After the reboot, by itself: urdmad active, the device and the address; the stage ends
# here otherwise.
came_back() {
	local why
	if why=$(wait_ready "$BOUND"); then
		ok "after the reboot: urdmad active, $dev on $tap with $addr ($(cut -d' ' -f1 /proc/uptime) s after boot)"
	else
		fail "after the reboot: urdmad active, $dev on $tap with $addr within $BOUND s ($why)"
		systemctl status urdmad --no-pager; journalctl -u urdmad --no-pager | tail -n 30
		finish
	fi
}

stage_booted_b() {
	came_back
	# A persistent server: node a's connections come and go as it restarts its urdmad.
	rping -s -P -a "$addr" -V -S 4096 -C 20 &
	local server=$!
	local start=$SECONDS
	until grep -q '^done' "$share/$peer.result" 2>/dev/null; do
		[ $((SECONDS - start)) -lt 900 ] || { fail "node a finished within 900 s"; break; }
		sleep 2
	done
	kill "$server" 2>/dev/null
	wait "$server" 2>/dev/null
	purge_and_check
	finish
}

# restarted WHAT: after urdmad was made to go away, the same device and address come back
# within the bound, a held connection failed rather than hung, and a new one works.
restarted() {
	local what=$1 held=$2 start=$3 why
	if why=$(wait_ready "$BOUND"); then
		ok "after $what: $dev on $tap with $addr again in $((SECONDS - start)) s (bound $BOUND s)"
	else
		fail "after $what: $dev on $tap with $addr again within $BOUND s ($why)"
		journalctl -u urdmad --no-pager | tail -n 30
		return
	fi
	if timeout 60 tail --pid="$held" -f /dev/null; then
		wait "$held"
		local rc=$?
		check "after $what: the connection that was open failed (rping exited with $rc)" test "$rc" -ne 0
	else
		fail "after $what: the connection that was open ended within 60 s"
		kill -9 "$held" 2>/dev/null
	fi
	check "after $what: a new rping -V to $peer_addr" rping_peer 60
}

# A long verifying rping that holds a connection across what comes next.
hold_connection() {
	rping -c -a "$peer_addr" -V -C 1000000 -S 4096 >/dev/null 2>&1 &
	held=$!
	sleep 5
	kill -0 "$held" 2>/dev/null
}

stage_booted_a() {
	came_back
	check "ibv_devinfo: $dev is an iWARP device, port active" \
		sh -c "ibv_devinfo -d $dev | grep -q 'transport:.*iWARP' && ibv_devinfo -d $dev | grep -q PORT_ACTIVE"
	check "rping -V to $peer_addr (node b)" rping_peer 300
	check "rdma statistic show: tx_packets moved" wait_for 10 "tx_packets of $dev above 0" \
		sh -c "rdma statistic show link $dev/1 | grep -Eq 'tx_packets [1-9]'"
	check "urdmad status --json: the exception record says the device was created" \
		sh -c "$urdmad status --json | jq -e '.exception[0].rdma_device_state == \"created\"' >/dev/null"

	local held start pid
	check "a held connection before systemctl restart" hold_connection
	start=$SECONDS
	check "systemctl restart urdmad" systemctl restart urdmad
	restarted "systemctl restart urdmad" "$held" "$start"

	check "a held connection before kill -9" hold_connection
	pid=$(systemctl show -p MainPID --value urdmad)
	start=$SECONDS
	kill -9 "$pid"
	# until it has exited, the device and the active unit that wait_ready sees are its own
	timeout 60 tail --pid="$pid" -f /dev/null
	restarted "kill -9 of urdmad (pid $pid)" "$held" "$start"
	check "systemd restarted urdmad once (NRestarts=1)" \
		test "$(systemctl show -p NRestarts --value urdmad)" = 1

	purge_and_check
	finish
}

case $(cat "$stage_file" 2>/dev/null || echo install) in
install)
	if [ "$node" = a ]; then stage_install; else
		fail "node $node booted a system without urdma"
		finish
	fi
	;;
booted) "stage_booted_$node" ;;
*) fail "unknown stage in $stage_file"; finish ;;
esac
