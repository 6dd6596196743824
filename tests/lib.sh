# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# The helpers every VM test shares, sourced by kmod/tests/vm-lib.sh, tests/verbs/vm-lib.sh,
# tests/e2e/lib.sh and tests/vm/run-all.  A caller that wants another bound per step sets
# STEP_TIMEOUT before sourcing this file.  A failure prints one line "FAIL: ..." and exits 1.

STEP_TIMEOUT=${STEP_TIMEOUT:-120}

# What in the kernel log means a test provoked a kernel bug, a warning or a task stuck in D state.
KERNEL_TROUBLE='Oops|BUG:|WARNING:|general protection|Call Trace|KASAN|refcount_t:|hung_task|blocked for more than'
# ... except a user-space program's own fault, which the kernel reports as
# "traps: NAME[PID] general protection fault ip:ADDR ... in LIBRARY".
USER_FAULT='traps: .*\[[0-9]+\] general protection fault ip:'

# The kernel trouble in the log on standard input, one line each.
kernel_trouble_in() {
	grep -E "$KERNEL_TROUBLE" | grep -vE "$USER_FAULT"
}

fail() {
	echo "FAIL: $*"
	exit 1
}

# Runs a command bounded in time.
t() {
	timeout -k 5 "$STEP_TIMEOUT" "$@"
}

# wait_for SECONDS DESCRIPTION CMD...: runs CMD every 0.2 s until it succeeds, or until
# SECONDS have passed (then says what it waited for and returns 1).  What happens
# asynchronously (counters urdmad pushes to the kernel at most every second, a dead
# process's objects or flows reclaimed, a line another process logs, a file opened by a
# background job) is checked by waiting for the condition: read once, the check fails or
# passes by how fast the host happens to be.  Not for a check that something stays absent
# or unchanged.
wait_for() {
	local bound=$1 what=$2 end=$((SECONDS + $1))
	shift 2
	until "$@"; do
		if [ "$SECONDS" -gt "$end" ]; then
			echo "waited ${bound} s for $what, in vain"
			return 1
		fi
		sleep 0.2
	done
}

# Kernel trouble is looked for from here on.
dmesg_mark() {
	DMESG_START=$(dmesg | wc -l)
}

dmesg_check() {
	local bad
	bad=$(dmesg | tail -n +"$((${DMESG_START:-0} + 1))" | kernel_trouble_in | head -n1)
	[ -z "$bad" ] || fail "kernel: $bad"
}

# "pd N cq N qp N ..." of device $1, or nothing if rdma cannot tell.
res_counts() {
	t rdma resource show "$1" 2>/dev/null | sed -E 's/^[0-9]+: *[^ ]+: *//'
}

# Removes every urdma device (rdma link) a test left behind.
delete_urdma_links() {
	local l
	for l in $(rdma link show 2>/dev/null | awk '$2 ~ /^urdma/ {split($2, a, "/"); print a[1]}'); do
		timeout 30 rdma link delete "$l" >/dev/null 2>&1
	done
}
