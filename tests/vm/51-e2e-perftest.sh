#!/usr/bin/env bash
# Unmodified perftest with rdma_cm (-R) over urdma, both directions of the bed: the latency
# tools for Send, Write and Read over every size of -a (2 B ... 8 MiB).  Each run must
# complete and print perftest's result table with a row for every size.  (Under emulation perftest's cycle counter gives "inf" for some
# figures; the row is still there.)  The bandwidth tools are in
# tests/e2e/pending/51-e2e-perftest-bw.sh: under the VM's emulation their rdma_cm data
# exchange fails ("Failed to exchange data between server and clients").
# vm-timeout: 1500
set -u
. tests/e2e/lib.sh

ITER=${PERFTEST_ITER:-5}
port=18600

# perf SERVER_NODE CLIENT_NODE TOOL [ARGS...]
perf() {
	local sn=$1 cn=$2 tool=$3 label sa out rows
	shift 3
	port=$((port + 1))
	label="$tool$(tr -d ' ' <<<"$*")-$sn"
	if [ "$sn" = B ]; then sa=$ADDR_B; else sa=$ADDR_A; fi
	start_server "$sn" "pt-$label" "." \
		sh -c "echo started; exec $tool -R -a -n $ITER -p $port -d urdma$sn $*"
	sleep 1
	out=$(t ip netns exec "urdma$cn" stdbuf -oL "$tool" -R -a -n "$ITER" -p "$port" -d "urdma$cn" "$@" "$sa" 2>&1)
	rc=$?
	echo "$out" >"$OUT/pt-$label-client.log"
	[ $rc = 0 ] || fail "$tool $* ($cn -> $sn, exit $rc): $(tail -n2 <<<"$out" | tr '\n' ' ')"
	wait_server "pt-$label" 300
	# one result row per size: 2, 4, ..., 8388608
	rows=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/' <<<"$out" | wc -l)
	[ "$rows" -ge 23 ] || fail "$tool $* ($cn -> $sn): $rows result rows, expected 23 (2 B ... 8 MiB)"
	echo "$tool $* $cn -> $sn: $rows sizes"
	awk '$1 == 2 || $1 == 65536 || $1 == 8388608' <<<"$out" | sed 's/^/    /'
}

bed_up
for dir in "B A" "A B"; do
	for tool in ${PERFTEST_TOOLS:-ib_send_lat ib_write_lat ib_read_lat}; do
		perf $dir $tool
	done
done
# with completion events (-e): tests/e2e/pending/51-e2e-perftest-events.sh, not yet seen
# to pass
[ -n "${PERFTEST_EVENTS:-}" ] && perf B A "$PERFTEST_EVENTS" -e
dmesg_check
echo "PASS"
