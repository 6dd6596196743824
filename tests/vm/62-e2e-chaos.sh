#!/usr/bin/env bash
# Process, daemon and link faults at random moments: each round starts a verify.c pair
# (mixed Sends, Writes, Writes with Immediate and Reads, every byte checked) and, after a
# random delay that may fall in connection setup, in the transfer or in its close, does one
# of: kill -9 of the client or the server, kill -9 of either node's urdmad (restarted
# afterwards), or either node's link taken down for 1-4 s. The moments take turns between
# setup, transfer and close, as a clean run first measured them.  After each round:
# - both applications have ended within BOUND seconds of the fault (a killed urdmad is
#   restarted at once, as a service manager would);
# - neither reports wrong data or a wrong completion: an application either succeeds with
#   every byte right or fails with an error completion or an rdma_cm error; after a link
#   flap, which is shorter than trp's give-up time, both must succeed;
# - nothing is left: rdma resource counts, urdmad's processes, flows, rings and mbufs in
#   use, its hugepage files and DPDK runtime files, urdma.ko's reference count, each back to
#   what it was before the round; no kernel warning;
# and the next round's connection shows that the node serves new ones.
#
# Reduced here (CHAOS_ROUNDS=6: each fault once); the full run:
#   scripts/vm --timeout 5400 -- env CHAOS_ROUNDS=100 URDMA_VM_TEST_TIMEOUT=5100 \
#     tests/vm/run-all 62-e2e-chaos
# (a round takes about 22 s here, 37 minutes in all; the bound below is the reduced run's).
# CHAOS_SEED picks the faults and moments (the log prints it; the same seed repeats them).
# Each fault is undone within its round (a link taken down comes up again, a killed urdmad
# is restarted) and the test checks that the nodes hold what they held before it, so it runs
# on run-all's shared bed.
# vm-timeout: 900
# vm-bed: shared
set -u
. tests/e2e/lib.sh

BOUND=${KILL_BOUND:-30}	# seconds both applications may take to end after a fault
ROUNDS=${CHAOS_ROUNDS:-6}
SEED=${CHAOS_SEED:-$(date +%s)}
# Operations per run: enough that the transfer is not a sliver of the run. With 1,500, once
# processes started in about a second, the transfer took 1 s of a 7-s run and 5 of 46 rounds
# fell in it.
OPS=${CHAOS_OPS:-8000}
prog=$(build_e2e verify) || exit 1
port=7800
RANDOM=$SEED
echo "seed $SEED, $ROUNDS rounds"

# The answer of a failed verify.c that is about data, not about the connection ending:
# a wrong byte, length, order or completion.
WRONG_DATA='differs|payload|magic|twice or out of range|arrived, expected|byte_len|Send of type|opcode|WITH_IMM|completion wr_id [0-9]+$|receive completion with wr_id|completion for wr_id|unexpected receive|no completion event|timed out'

# Field $3 of node $1's first urdmad status record of kind $2.
status_field() {
	"$BED" status --json "$1" 2>/dev/null | jq -r ".$2[0].$3"
}

# What a node holds that a finished round must give back, as one line.
holdings() {
	local n=$1 d files=0 run st
	for d in $(awk '$3 == "hugetlbfs" {print $2}' /proc/mounts); do
		files=$((files + $(find "$d" -maxdepth 1 -name "urdmabed$n*" | wc -l)))
	done
	run=$(find "/var/run/dpdk/urdmabed$n" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
	st=$("$BED" status --json "$n" 2>/dev/null | jq -r '.daemon[0] as $d |
		"processes=\($d.processes) flows=\($d.flows) rings=\($d.rings) mbufs=\(.pool[0].in_use)"')
	echo "res[$(res_counts "urdma$n")] $st hugepage_files=$files dpdk_run_files=$run" \
		"module_refs=$(cat /sys/module/urdma/refcnt)"
}

# Waits until node $1 holds what it held before ($2), at most $3 seconds.
wait_holdings() {
	local now end=$((SECONDS + $3))
	while :; do
		now=$(holdings "$1")
		[ "$now" = "$2" ] && return 0
		[ "$SECONDS" -lt "$end" ] || break
		sleep 0.5
	done
	fail "round $round: node $1 holds '$now', before the round '$2' (runtime files: $(ls "/var/run/dpdk/urdmabed$1" | tr '\n' ' '))"
}

# Checks how a verify.c run ended: $1 its name, $2 its exit status, $3 "ok" when it must
# have succeeded.
judge() {
	local name=$1 rc=$2 must=${3:-} last
	last=$(grep -m1 FAIL "$OUT/$name.log" || tail -n1 "$OUT/$name.log")
	if [ "$rc" = 0 ]; then
		grep -q "verify: ok" "$OUT/$name.log" || fail "round $round: $name exited 0 without 'verify: ok'"
		return
	fi
	grep -qE "FAIL.*($WRONG_DATA)" "$OUT/$name.log" && fail "round $round: $name: $last"
	[ "$must" = ok ] && fail "round $round: $name failed after a fault it should survive: $last"
	echo "    $name: ${last#FAIL: }"
}

# Waits for pids $@ to end, at most BOUND seconds from $start; returns 1 with the pids
# still running in $left when they do not.
wait_ended() {
	local p
	while :; do
		left=
		for p in "$@"; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
		left=${left# }
		[ -z "$left" ] && return 0
		[ $((SECONDS - start)) -le "$BOUND" ] || return 1
		sleep 0.2
	done
}

bed_up
base_a=$(holdings A)
base_b=$(holdings B)
echo "node A holds: $base_a"
echo "node B holds: $base_b"

# A clean run first: it must succeed, and its phases set the range of the fault moments:
# setup until node A's urdmad has handed the connection over, then the transfer and close.
port=$((port + 1))
start_server B chaos-clean-server "listening" "$prog" server "$ADDR_B" "$port" -n "$OPS" -m 16384 -t 300
began=$(date +%s%3N)
ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n "$OPS" -m 16384 -t 300 >"$OUT/chaos-clean-client.log" 2>&1 &
cpid=$!
setup_ms=
while kill -0 "$cpid" 2>/dev/null; do
	[ -z "$setup_ms" ] && [ "$(status_field A daemon flows)" != 0 ] && setup_ms=$(($(date +%s%3N) - began))
	sleep 0.2
done
wait "$cpid" || fail "the clean run: $(grep -m1 FAIL "$OUT/chaos-clean-client.log" || tail -n1 "$OUT/chaos-clean-client.log")"
clean_ms=$(($(date +%s%3N) - began))
wait_server chaos-clean-server 60
[ -n "$setup_ms" ] || setup_ms=$((clean_ms / 2))
[ "$setup_ms" -ge 1 ] || setup_ms=1
echo "clean run: $((clean_ms / 1000)) s, the first $((setup_ms / 1000)) s of it setup ($OPS operations)"

declare -A count=()
faults=(kill-client kill-server kill-urdmad-A kill-urdmad-B link-A link-B)
for round in $(seq "$ROUNDS"); do
	# every fault in turn, each at a random moment
	fault=${faults[(round - 1) % ${#faults[@]}]}
	# a random moment (ms) in setup, in the transfer or around the close, in turn (each
	# fault in each over three cycles of the faults): most of
	# a run under emulation is setup (DPDK's start), so uniform moments would seldom fall
	# in the transfer
	case $(( ((round - 1) / ${#faults[@]} + round) % 3 )) in
	1) delay=$(((RANDOM * 32768 + RANDOM) % setup_ms)) ;;
	2) delay=$((setup_ms + (RANDOM * 32768 + RANDOM) % (clean_ms - setup_ms + 1))) ;;
	0) delay=$((clean_ms * 8 / 10 + (RANDOM * 32768 + RANDOM) % (clean_ms * 4 / 10 + 1))) ;;
	esac
	port=$((port + 1))
	sname=chaos-$round-server
	cname=chaos-$round-client
	start_server B "$sname" "listening" "$prog" server "$ADDR_B" "$port" -n "$OPS" -m 16384 -t 300
	spid=$SERVER_PID
	ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n "$OPS" -m 16384 -t 300 >"$OUT/$cname.log" 2>&1 &
	cpid=$!
	sleep "$((delay / 1000)).$(printf %03d $((delay % 1000)))"
	# where the fault falls: before node A's urdmad handed the connection over, during the
	# transfer, or after the client's end (the server may still be closing)
	if ! kill -0 "$cpid" 2>/dev/null; then
		moment=after-client-end
	elif [ "$(status_field A daemon flows)" = 0 ]; then
		moment=setup
	else
		moment=transfer
	fi
	start=$SECONDS
	must=
	case $fault in
	kill-client) kill -9 "$cpid" 2>/dev/null ;;
	kill-server) kill -9 "$spid" 2>/dev/null ;;
	kill-urdmad-*)
		# restarted at once, as its service manager would: requests and frames for
		# what it had are then answered (Reject, Abort) instead of going unheard until
		# the peer's handshake or trp gives up
		n=${fault#kill-urdmad-}
		kill -9 "$(cat "/run/urdma/bed/$n.pid")"
		t "$BED" restart "$n" >"$OUT/chaos-restart.log" 2>&1 ||
			fail "round $round: scripts/bed restart $n: $(tail -n1 "$OUT/chaos-restart.log")"
		fault="$fault (back after $((SECONDS - start)) s)"
		# the bound counts from here: a restart under emulation takes its own time
		start=$SECONDS
		;;
	link-*)
		n=${fault#link-}
		down=$((1 + RANDOM % 4))
		ip -n "urdma$n" link set "urdma-veth$n" down
		sleep "$down"
		ip -n "urdma$n" link set "urdma-veth$n" up
		fault="$fault-${down}s"
		must=ok
		;;
	esac
	kind=${fault%% *}
	kind=${kind%-[0-9]*s}
	count[$kind]=$((${count[$kind]:-0} + 1))
	echo "round $round: $fault at $delay ms ($moment)"
	if ! wait_ended "$cpid" "$spid" 2>/dev/null && ! kill -0 "$cpid" 2>/dev/null &&
		[ "$(status_field B daemon processes)" = 0 ]; then
		# A client that ended before its connection request reached the server (killed,
		# or its urdmad killed while it attached: rdma_create_qp fails) leaves the server
		# listening without a QP, as it should: another client must then get through.
		echo "    the server still listens: another client"
		out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n "$OPS" -m 16384 -t 300 2>&1) ||
			fail "round $round: a client after the first one ended: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
		start=$SECONDS
	fi
	wait_ended "$cpid" "$spid" || {
		dump_stuck verify "${left%% *}"
		fail "round $round: $fault: still running ${BOUND}s after the fault (state in stuck.log)"
	}
	took=$((SECONDS - start))
	rc=0
	wait "$cpid" 2>/dev/null || rc=$?
	[ "$fault" = kill-client ] || judge "$cname" "$rc" "$must"
	rc=0
	wait "$spid" 2>/dev/null || rc=$?
	[ "$fault" = kill-server ] || judge "$sname" "$rc" "$must"
	echo "    both ended within $took s"
	wait_holdings A "$base_a" 30
	wait_holdings B "$base_b" 30
	dmesg_check
done

# The nodes still serve new connections.
port=$((port + 1))
start_server B chaos-last-server "listening" "$prog" server "$ADDR_B" "$port" -n "$OPS" -m 16384 -t 300
out=$(t ip netns exec urdmaA "$prog" client "$ADDR_B" "$port" -n "$OPS" -m 16384 -t 300 2>&1) ||
	fail "a connection after the faults: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
wait_server chaos-last-server 60
wait_holdings A "$base_a" 30
wait_holdings B "$base_b" 30
dmesg_check
summary=
for f in "${!count[@]}"; do summary="$summary $f=${count[$f]}"; done
echo "faults:$summary; a new connection after them works; nothing left behind"
echo "PASS"
