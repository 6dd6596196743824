# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Shared by the end-to-end VM tests (tests/vm/5*-e2e-*.sh): sourced inside the VM from the
# repository root.  Brings the two-node bed up (scripts/bed) and removes it when the test
# exits; every step is bounded in time; a failure prints one line "FAIL ..." and exits 1.

STEP_TIMEOUT=${STEP_TIMEOUT:-300}
OUT=${URDMA_OUT:-/tmp}
BED=scripts/bed
ADDR_A=
ADDR_B=
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# Runs CMD in node A or B (network namespace of that node).
in_node() {
	local n=$1
	shift
	"$BED" exec "$n" "$@"
}

# Under tests/vm/run-all, a test marked "# vm-bed: shared" gets URDMA_BED_SHARED=1 and the bed
# run-all keeps up: bed_up takes it as it is (or brings one up, left for run-all to remove),
# and bed_down leaves it tidy (scripts/bed tidy) for the next test instead of removing it.
bed_down() {
	# a test may leave its background processes: end the ones it started, without waiting
	# for one stuck in the kernel, and without bash reporting each as killed
	local p
	p=$(jobs -p)
	disown -a
	[ -z "$p" ] || kill -9 $p 2>/dev/null
	if [ -n "${URDMA_BED_SHARED:-}" ]; then
		timeout 120 "$BED" tidy >/dev/null 2>&1
	else
		timeout 120 "$BED" down >/dev/null 2>&1
	fi
	true
}

bed_up() {
	trap bed_down EXIT
	if [ -z "${URDMA_BED_SHARED:-}" ] || ! "$BED" tidy >"$OUT/bed-up.log" 2>&1; then
		t "$BED" up >"$OUT/bed-up.log" 2>&1 || fail "scripts/bed up: $(tail -n1 "$OUT/bed-up.log")"
	fi
	ADDR_A=$("$BED" addr A)
	ADDR_B=$("$BED" addr B)
	dmesg_mark
}

# The counters urdma.ko shows for each device (kmod/urdma_main.c), in their order.
HW_COUNTERS="rx_frames tx_frames rx_drops rx_packets tx_packets retransmissions timeouts duplicates crc_errors malformed bell_events bell_hushed bell_late bell_quiet"
# hw NODE NAME: counter NAME of the node's device, as `rdma statistic show` lists it.
hw() {
	t ip netns exec "urdma$1" rdma statistic show link "urdma$1/1" |
		awk -v n="$2" '{for (i = 1; i < NF; i++) if ($i == n) print $(i + 1)}'
}
# hw_sum NAME: counter NAME of both nodes' devices, summed.
hw_sum() { echo $(($(hw A "$1") + $(hw B "$1"))); }
# hw_above NAME FLOOR WHAT: waits (bounded: they lag the traffic by at most 2.3 s) until
# both devices' NAME sum above FLOOR, and says so.
hw_above() {
	local v
	for _ in $(seq 50); do
		v=$(hw_sum "$1")
		[ "$v" -gt "$2" ] && { echo "  $1: $2 -> $v ($3)"; return 0; }
		sleep 0.2
	done
	fail "the devices' $1 stayed at $v (not above $2) after $3"
}

# listening NODE PORT: node NODE's urdmad holds a listener on PORT (the kernel hands it each
# listen, in its own time).
listening() {
	"$BED" status --json "$1" 2>/dev/null |
		jq -e --arg port ":$2" 'any(.listener[]?; .local | endswith($port))' >/dev/null
}
# wait_listening NODE PORT: waits (bounded) until the server just started in NODE listens on
# PORT.  rping and perftest say nothing when they listen: a client started after a guessed
# sleep finds nobody on a slow host, and waits for nothing on a fast one.
wait_listening() {
	wait_for 60 "a listener on port $2 in node $1's urdmad" listening "$1" "$2" ||
		fail "node $1: nothing listens on port $2 after 60 s"
}

# Compiles tests/e2e/NAME.c (librdmacm + libibverbs) into $OUT and prints its path.  A build
# newer than its sources is used as it is: gcc under the VM's emulation takes many seconds,
# and scripts/test builds them all on the host, into the VM's $OUT, before the VM stage.
build_e2e() {
	local exe=$OUT/$1
	if [ "$exe" -nt "tests/e2e/$1.c" ] && [ "$exe" -nt tests/e2e/e2e.h ]; then
		echo "$exe"
		return 0
	fi
	TMPDIR=$OUT t "${E2E_CC:-cc}" -O2 -Wall -Werror -o "$exe" "tests/e2e/$1.c" -lrdmacm -libverbs -lpthread ||
		fail "cannot build tests/e2e/$1.c"
	echo "$exe"
}

# build_e2e for the MPI program tests/e2e/NAME.c, with mpicc.
build_mpi() {
	E2E_CC=mpicc build_e2e "$1"
}

# Waits until the resource counts of device $1 equal $2 (at most $3 seconds).
wait_res() {
	local i now
	for i in $(seq $((${3:-30} * 5))); do
		now=$(res_counts "$1")
		[ "$now" = "$2" ] && return 0
		sleep 0.2
	done
	fail "$1: resource counts '$now', expected '$2'"
}

# Starts a server in node $1 (host: the root namespace) in the background (output in
# $OUT/$2.log), waits until it prints a line matching $3 (a regular expression), and sets
# SERVER_PID to the server's own pid (ip netns exec and stdbuf exec it; a shell function in
# between would not).
start_server() {
	local n=$1 name=$2 ready=$3 i ns=(ip netns exec "urdma$1")
	shift 3
	[ "$n" = host ] && ns=()	# the root namespace (a kernel stack's comparison run)
	"${ns[@]}" stdbuf -oL "$@" >"$OUT/$name.log" 2>&1 &
	SERVER_PID=$!
	for i in $(seq 300); do
		grep -qE "$ready" "$OUT/$name.log" 2>/dev/null && return 0
		kill -0 "$SERVER_PID" 2>/dev/null || fail "$name exited before it was ready: $(tail -n1 "$OUT/$name.log")"
		sleep 0.2
	done
	fail "$name not ready in 60 s: $(tail -n1 "$OUT/$name.log")"
}

# Writes to $OUT/stuck.log what the processes called $1 are doing, the hung one (pid $2)
# first: every thread's state and kernel wait channel, then the bed's status, then each
# process's user-space stacks, and last a few lines that say it in short (one per thread
# state list and one per main thread's innermost frames), which a log cut to its tail keeps.
# The stacks come after the states: gdb stops a process for seconds, long enough for its
# peer to give up and change what the states would have shown.
dump_stuck() {
	local name=$1 hung=$2 p task others states="" short=""
	others=$(pgrep -x "$name" | grep -vx "$hung")
	{
		echo "== threads (pid/tid state wchan comm) of $name, pid $hung first"
		for p in $hung $others; do
			short=
			for task in /proc/"$p"/task/*; do
				set -- "$(awk '{print $3}' "$task/stat" 2>/dev/null)" \
					"$(cat "$task/wchan" 2>/dev/null)" "$(cat "$task/comm" 2>/dev/null)"
				echo "$p/${task##*/} $1 $2 $3"
				short="$short $3:$1:$2"
			done
			states="$states$p$short"$'\n'
		done
		echo "== scripts/bed status"
		timeout 20 "$BED" status A
		timeout 20 "$BED" status B
		for p in $hung $others; do
			echo "== stacks of pid $p"
			timeout 60 gdb -p "$p" -batch -nx -ex "thread apply all bt" 2>&1 |
				grep -E '^(Thread|#)' | tee "$OUT/stuck-$p.bt"
		done
		echo "== in short: each process's threads (comm:state:wchan), then its main thread"
		printf '%s' "$states"
		for p in $hung $others; do
			# gdb's thread 1 is the main one: its frames' function names, innermost first
			echo "$p main:$(awk '/^Thread / {m = ($2 == 1)} m && /^#/ {
				printf " %s", ($3 == "in") ? $4 : $2 }' "$OUT/stuck-$p.bt" | cut -c1-300)"
			rm -f "$OUT/stuck-$p.bt"
		done
	} >"$OUT/stuck.log" 2>&1
}

# t_or_dump NAME CMD...: runs CMD bounded like t; when the bound is reached, leaves what
# the processes called NAME were doing in $OUT/stuck.log (dump_stuck), ends CMD's process
# only, and returns 124.  CMD must exec its program (ip netns exec, stdbuf, timeout do).
t_or_dump() {
	local name=$1 pid
	shift
	"$@" &
	pid=$!
	for _ in $(seq $((STEP_TIMEOUT * 5))); do
		kill -0 "$pid" 2>/dev/null || {
			wait "$pid"
			return
		}
		sleep 0.2
	done
	dump_stuck "$name" "$pid"
	kill -9 "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	return 124
}

# Waits (bounded) for the background server started last; fails with its last line (what a
# server that did not finish was doing is in $OUT/stuck.log).
wait_server() {
	local name=$1 limit=${2:-$STEP_TIMEOUT} i
	for i in $(seq $((limit * 5))); do
		kill -0 "$SERVER_PID" 2>/dev/null || break
		sleep 0.2
	done
	if kill -0 "$SERVER_PID" 2>/dev/null; then
		dump_stuck "$(cat "/proc/$SERVER_PID/comm" 2>/dev/null)" "$SERVER_PID"
		kill -9 "$SERVER_PID" 2>/dev/null
		fail "$name did not finish within ${limit}s (its state: stuck.log): $(tail -n1 "$OUT/$name.log")"
	fi
	wait "$SERVER_PID" || fail "$name: $(tail -n1 "$OUT/$name.log")"
}

# Waits until node $1's urdmad has $2 connected QPs (a first QP attaches to DPDK, which
# takes many seconds under emulation), then lets the transfer run a little.
wait_connected() {
	local n=$1 want=$2 got
	for _ in $(seq 600); do
		got=$("$BED" status --json "$n" 2>/dev/null | jq -r '.cm[0].connected // empty')
		[ "${got:-0}" -ge "$want" ] && { sleep 3; return 0; }
		sleep 0.2
	done
	fail "node $n: no connection after 120 s"
}
