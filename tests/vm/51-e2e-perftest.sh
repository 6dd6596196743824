#!/usr/bin/env bash
# Unmodified perftest with rdma_cm (-R) over urdma, in both directions of the bed: the latency
# tools for Write and Read (and, in the full form, Send) over every size of -a (2 B ... 8 MiB),
# and ib_send_lat with completion events (-e).  Each run must complete and print perftest's
# result table with a row for every size.  The bandwidth tools: 51-e2e-perftest-bw.sh, which
# runs this script.
#
# -F: perftest calibrates its cycle counter against gettimeofday() before every report and,
# without -F, exits when the fit is poor (r^2 < 0.9), which a preempted vCPU can cause.  The
# guest's clocksource is the TSC (scripts/vm), which makes the calibration good; -F keeps an
# unlucky one from failing a run that worked (the row then shows zeros or "inf").
#
# PERFTEST_TOOLS: the tools run; PERFTEST_DIRS: "SERVER_NODE CLIENT_NODE" pairs separated by
# ';' (both directions unless told), which the tools take in turn, so that every direction
# is covered and the test stays within CI's time (each run is about a minute under the
# emulation); PERFTEST_EVERY_DIR=1 runs every tool in every pair instead.  PERFTEST_EVENTS:
# "SERVER_NODE TOOL [ARGS]" runs of TOOL -e, separated by ';'; PERFTEST_ITER: perftest's -n
# (its minimum is 5), unless a run's ARGS give their own -n.  A run whose ARGS give -s runs
# that one size instead of every size of -a.
# vm-timeout: 1800
# vm-bed: shared
set -u
. tests/e2e/lib.sh

ITER=${PERFTEST_ITER:-5}
EVERY_DIR=${PERFTEST_EVERY_DIR:-0}
# ib_send_lat polling its CQs runs in the full form (PERFTEST_EVERY_DIR=1) only: the CI form
# has Send over every size twice without it, as a ping-pong by ib_send_lat -e (EVENTS, the
# same direction) and polled by ib_send_bw (51-e2e-perftest-bw.sh). It is a run of 45 s here.
lat_tools="ib_write_lat ib_read_lat"
[ "$EVERY_DIR" = 1 ] && lat_tools="ib_send_lat $lat_tools"
TOOLS=${PERFTEST_TOOLS-$lat_tools}
EVENTS=${PERFTEST_EVENTS-B ib_send_lat}
DIRS=${PERFTEST_DIRS-B A;A B}
port=18600

# perf SERVER_NODE CLIENT_NODE TOOL [ARGS...]
perf() {
	local sn=$1 cn=$2 tool=$3 label sa out missing size start=$SECONDS n= a prev= shown
	local one= sizes all=(-a)
	shift 3
	port=$((port + 1))
	label="$tool$(tr -d ' ' <<<"$*")-$sn"
	shown=$*
	for a in "$@"; do
		[ "$prev" = -n ] && n=$a
		[ "$prev" = -s ] && one=$a
		prev=$a
	done
	if [ -n "$one" ]; then
		all=()
		sizes=$one
	else
		# 2, 4, ..., 8388608 bytes
		sizes=$(for size in $(seq 1 23); do echo $((1 << size)); done)
	fi
	[ -n "$n" ] || {
		n=$ITER
		set -- -n "$n" "$@"
	}
	if [ "$sn" = B ]; then sa=$ADDR_B; else sa=$ADDR_A; fi
	start_server "$sn" "pt-$label" "." \
		sh -c "echo started; exec $tool -R -F ${all[*]} -p $port -d urdma$sn $*"
	wait_listening "$sn" "$port"
	out=$(t_or_dump "$tool" ip netns exec "urdma$cn" stdbuf -oL "$tool" -R -F "${all[@]}" -p "$port" -d "urdma$cn" "$@" "$sa" 2>&1)
	rc=$?
	echo "$out" >"$OUT/pt-$label-client.log"
	if [ $rc = 124 ]; then
		echo "$tool $shown ($cn -> $sn): no end within ${STEP_TIMEOUT}s; the server's last lines:"
		tail -n3 "$OUT/pt-$label.log" | sed 's/^/    /'
		echo "  what both were doing (stuck.log):"
		sed 's/^/    /' "$OUT/stuck.log"
	fi
	[ $rc = 0 ] || fail "$tool $shown ($cn -> $sn, exit $rc): $(tail -n2 <<<"$out" | tr '\n' ' ')"
	wait_server "pt-$label" 300
	# one result row per size, then the iteration count
	missing=
	for size in $sizes; do
		awk -v s="$size" -v n="$n" '$1 == s && $2 == n {found = 1} END {exit !found}' <<<"$out" ||
			missing="$missing $size"
	done
	[ -z "$missing" ] || fail "$tool $shown ($cn -> $sn): no result row for size(s)$missing"
	echo "$tool${shown:+ $shown} $cn -> $sn: $(wc -w <<<"$sizes") size(s) in $((SECONDS - start)) s"
	awk '$1 == 2 || $1 == 65536 || $1 == 8388608' <<<"$out" | sed 's/^/    /'
}

bed_up
echo "guest clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
IFS=';' read -ra dirs <<<"$DIRS"
turn=0
for tool in $TOOLS; do
	picked=("${dirs[turn % ${#dirs[@]}]}")
	[ "$EVERY_DIR" = 1 ] && picked=("${dirs[@]}")
	for dir in "${picked[@]}"; do
		# shellcheck disable=SC2086 # "SERVER_NODE CLIENT_NODE"
		perf $dir "$tool"
	done
	turn=$((turn + 1))
done
IFS=';' read -ra runs <<<"$EVENTS"
for r in "${runs[@]}"; do
	read -r sn tool args <<<"$r"
	[ -n "${tool:-}" ] || continue
	# shellcheck disable=SC2086 # the run's extra arguments, split
	if [ "$sn" = B ]; then perf B A "$tool" -e $args; else perf A B "$tool" -e $args; fi
done
dmesg_check
echo "PASS"
