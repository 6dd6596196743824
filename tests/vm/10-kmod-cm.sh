#!/usr/bin/env bash
# The kernel's connection management (docs/connection.md) against a fake
# urdmad (kmod/tests/fake_urdmad.py) on /dev/urdma_cm, seen through the
# rdma_cm events applications get (kmod/tests/cm_probe.c, raw ucma and
# uverbs: no provider needed).  Covers: no daemon (ENETUNREACH), REGISTER
# in the opener's namespace, the sysfs urdmad file, LISTEN replay,
# ESTABLISHED on both sides with private data, graceful and daemon-side
# close, REJECTED (fake and real reject), UNREACHABLE, the next hop's MAC,
# an unanswered accept, urdmad dying with pending and established
# connections and with an accept waiting, a process killed while
# connecting and while connected, a connect never answered (the kernel's
# timeout, the module parameter connect_timeout), a request abandoned
# before the accept, an accepting thread that cannot run holding up no
# other connection, two daemons in two namespaces, module unload refused
# while a daemon is attached,
# resource counts back to where they were, and the interface deleted
# under an established connection.
# vm-timeout: 1200
set -u
. kmod/tests/vm-lib.sh

NS=urdma-peer
SOCK=/run/urdma-cm-test
CT=/sys/module/urdma/parameters/connect_timeout
pids=
daemons=

finish() {
	local p
	# The daemons first: that ends any connect a killed process waits
	# for in iw_cm.  Killing their timeout(1) wrappers would not.
	pkill -KILL -f "^python3 kmod/tests/fake_urdmad.py" 2>/dev/null
	[ -n "${CMP:-}" ] && pkill -KILL -f "^$CMP " 2>/dev/null
	for p in $pids; do
		kill -KILL "$p" 2>/dev/null
	done
	for p in $pids; do
		wait_gone "$p" 30
	done
	[ -w "$CT" ] && echo 90 >"$CT"
	[ -n "${RT_RUNTIME:-}" ] && echo "$RT_RUNTIME" >/proc/sys/kernel/sched_rt_runtime_us
	cleanup
	timeout 30 ip netns del "$NS" 2>/dev/null
	true
}

# Runs "$@" in the background with output to file $1; remembers the pid in BG.
bg() {
	local out=$1
	shift
	timeout -k 5 240 "$@" >"$out" 2>&1 &
	BG=$!
	pids="$pids $BG"
}

# Waits up to $3 seconds for a line matching regex $2 in file $1.
wait_line() {
	local i
	for ((i = 0; i < $3 * 5; i++)); do
		grep -qE "$2" "$1" 2>/dev/null && return 0
		sleep 0.2
	done
	return 1
}

# Waits up to $2 seconds for process $1 to end.
wait_gone() {
	local i
	for ((i = 0; i < $2 * 5; i++)); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.2
	done
	return 1
}

expect_line() {
	grep -qE "$2" "$1" || fail "$3: want /$2/, got: $(tr '\n' '|' <"$1")"
}

start_daemon() {
	local name=$1 ifname=$2
	shift 2
	bg "$log/$name" "$@" python3 kmod/tests/fake_urdmad.py "$ifname" "$SOCK/$name.sock"
	daemons="$daemons $BG"
	wait_line "$log/$name" '^(registered|register:)' 30 || fail "$name did not register: $(cat "$log/$name")"
	expect_line "$log/$name" '^registered' "$name register"
}

client() {
	t "$CMP" "$uv" client "$@" >"$log/client" 2>&1
	cat "$log/client"
}

server() {
	local name=$1
	shift
	bg "$log/$name" "$CMP" "$uv" server "$@"
	wait_line "$log/$name" '^(listening|FAIL)' 30 || fail "$name not listening"
	expect_line "$log/$name" '^listening' "$name listen"
}

dmesg_mark
ensure_module
setup_veth
trap finish EXIT
t ip netns del "$NS" 2>/dev/null
t ip netns add "$NS" || fail "ip netns add"
t ip link set veth1 netns "$NS" || fail "veth1 to $NS"
t ip -n "$NS" addr add 10.77.0.2/24 dev veth1 || fail "address on veth1"
t ip -n "$NS" link set veth1 up || fail "veth1 up"
t ip -n "$NS" link set lo up || fail "lo up in $NS"
t ip addr add 10.77.0.1/24 dev veth0 || fail "address on veth0"
t rdma link add urdma0 type urdma netdev veth0 || fail "rdma link add urdma0"
uv=$(uverbs_dev urdma0) || fail "no uverbs device for urdma0"
mac0=$(cat /sys/class/net/veth0/address)
mac1=$(ip netns exec "$NS" cat /sys/class/net/veth1/address)
mkdir -p "$SOCK"

log=$(mktemp -d 2>/dev/null || mktemp -d -p "${URDMA_OUT:?}")
build_probe cm_probe
CMP=$PROBE
before=$(res_counts urdma0) || fail "rdma resource show urdma0"
echo "resources before: $before"

# -- No daemon: the device's sysfs file is empty, listening works, and a
# connect fails at once with ENETUNREACH (no event).
[ -c /dev/urdma_cm ] || fail "/dev/urdma_cm missing"
[ "$(wc -c </sys/class/infiniband/urdma0/urdmad)" = 0 ] ||
	fail "sysfs urdmad not empty without a daemon: $(cat /sys/class/infiniband/urdma0/urdmad)"
server s1 0.0.0.0 7471 welcome accept
s1=$BG
client 10.77.0.1 7471 hello
expect_line "$log/client" '^connect: ENETUNREACH$' "connect without a daemon"
# One whole message per read and write; reads block unless O_NONBLOCK.
out=$(t python3 - <<'EOF'
import errno, os, struct
fd = os.open("/dev/urdma_cm", os.O_RDWR | os.O_NONBLOCK)
def res(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
msg = lambda op: struct.pack("<I", op) + bytes(436)
print("read-empty", res(lambda: os.read(fd, 440)))
print("read-short", res(lambda: os.read(fd, 439)))
print("write-short", res(lambda: os.write(fd, msg(3)[:100])))
print("write-badop", res(lambda: os.write(fd, msg(99))))
print("write-stale", res(lambda: os.write(fd, msg(3))))
print("register-noif", res(lambda: os.write(fd, msg(1))))
EOF
)
[ "$(tr '\n' ' ' <<<"$out")" = "read-empty EAGAIN read-short EINVAL write-short EINVAL write-badop EINVAL write-stale ok register-noif ENODEV " ] ||
	fail "channel read/write errors: $(tr '\n' ' ' <<<"$out")"
if command -v setpriv >/dev/null; then
	out=$(setpriv --bounding-set=-net_admin --inh-caps=-net_admin \
		python3 -c 'import os; os.open("/dev/urdma_cm", os.O_RDWR)' 2>&1) &&
		fail "/dev/urdma_cm opened without CAP_NET_ADMIN"
	grep -q "PermissionError\|Operation not permitted" <<<"$out" ||
		fail "open without CAP_NET_ADMIN: $out"
fi

# -- A daemon registers: the listener is replayed to it, sysfs names it.
start_daemon d1 veth0
wait_line "$log/d1" '^LISTEN .*local=0\.0\.0\.0:7471 ifname=veth0' 10 ||
	fail "listener not replayed at REGISTER: $(cat "$log/d1")"
printf '%s\n' "$SOCK/d1.sock" | cmp -s - /sys/class/infiniband/urdma0/urdmad ||
	fail "sysfs urdmad is '$(cat /sys/class/infiniband/urdma0/urdmad)'"
# Names resolve in the opener's namespace; an interface has one daemon.
t python3 kmod/tests/fake_urdmad.py veth1 "$SOCK/x.sock" >"$log/x" 2>&1
expect_line "$log/x" '^register: ENODEV$' "REGISTER of another namespace's interface"
t python3 kmod/tests/fake_urdmad.py veth0 "$SOCK/x.sock" >"$log/x" 2>&1
expect_line "$log/x" '^register: EBUSY$' "second REGISTER of veth0"

# -- Two processes on one node: ESTABLISHED on both sides with each
# other's private data, QPs in RTS, then a graceful close from the client.
client 10.77.0.1 7471 hello disconnect
expect_line "$log/client" '^event ESTABLISHED status 0 pdata welcome$' "client connect"
expect_line "$log/client" '^qp state 3$' "client QP state after ESTABLISHED"
expect_line "$log/client" '^event DISCONNECTED status 0 ' "client disconnect"
wait_gone "$s1" 30 || fail "server s1 still running: $(tr '\n' '|' <"$log/s1")"
expect_line "$log/s1" '^event CONNECT_REQUEST status 0 pdata hello$' "server request"
expect_line "$log/s1" '^event ESTABLISHED status 0 ' "server established"
expect_line "$log/s1" '^qp state 3$' "server QP state after ESTABLISHED"
expect_line "$log/s1" '^event DISCONNECTED status 0 ' "server disconnected"
expect_line "$log/d1" "^CONNECT .*local=10\.77\.0\.1:[0-9]+ remote=10\.77\.0\.1:7471 mac=$mac0 .*pdata=hello" \
	"CONNECT to an own address carries the interface's MAC"
qpn=$(awk '$1 == "qpn" {print $2}' "$log/client")
pid=$(awk '$1 == "pid" {print $2}' "$log/client")
expect_line "$log/d1" "^CONNECT .* qpn=$qpn status=0 owner=$pid " "CONNECT names the client's QP and process"
qpn=$(awk '$1 == "qpn" {print $2}' "$log/s1")
pid=$(awk '$1 == "pid" {print $2}' "$log/s1")
expect_line "$log/d1" "^ACCEPT .* qpn=$qpn status=0 owner=$pid .*pdata=welcome" "ACCEPT names the server's QP and process"
expect_line "$log/d1" '^DISCONNECT .*status=0$' "graceful DISCONNECT message"
wait_line "$log/d1" '^UNLISTEN ' 10 || fail "no UNLISTEN after the server exited"

# -- Refusals: the daemon's (with the peer's private data), the server's
# own rdma_reject, no answer in time, and the next hop's MAC.
client 10.77.0.1 7001 hello
expect_line "$log/client" '^event REJECTED status -111 pdata refused-by-fake$' "refused connect"
server s2 10.77.0.1 7472 go-away reject
s2=$BG
client 10.77.0.1 7472 hello
expect_line "$log/client" '^event REJECTED status -111 pdata go-away$' "connect rejected by the server"
wait_gone "$s2" 30 || fail "server s2 still running"
expect_line "$log/s2" '^reject: ok$' "server reject"
expect_line "$log/d1" '^REJECT .*pdata=go-away' "REJECT message"
client 10.77.0.1 7002 hello
expect_line "$log/client" '^event UNREACHABLE status -110 ' "timed-out connect"
client 10.77.0.2 7001 hello
expect_line "$log/client" '^event REJECTED status -111 ' "refused connect to the peer"
expect_line "$log/d1" "^CONNECT .*remote=10\.77\.0\.2:7001 mac=$mac1 " "CONNECT carries the next hop's MAC"

# -- An accept the daemon never answers fails after 5 s; the requester
# is rejected.
server s3 10.77.0.1 7473 noanswer accept
s3=$BG
client 10.77.0.1 7473 hello
expect_line "$log/client" '^event REJECTED status -111 ' "connect to an unanswered accept"
wait_gone "$s3" 30 || fail "server s3 still running"
expect_line "$log/s3" '^accept: ETIMEDOUT$' "unanswered accept"

# -- The daemon closes an established connection: DISCONNECTED on both.
server s4 10.77.0.1 7474 welcome accept
s4=$BG
bg "$log/c4" "$CMP" "$uv" client 10.77.0.1 7474 hello wait 60
c4=$BG
wait_line "$log/c4" '^qp state' 60 || fail "c4 not connected: $(tr '\n' '|' <"$log/c4")"
wait_line "$log/s4" '^qp state' 60 || fail "s4 not connected: $(tr '\n' '|' <"$log/s4")"
kill -USR1 "$(pgrep -f "^python3 kmod/tests/fake_urdmad.py veth0 $SOCK/d1.sock" | head -n1)"
wait_gone "$c4" 30 || fail "c4 still running"
wait_gone "$s4" 30 || fail "s4 still running"
expect_line "$log/c4" '^event DISCONNECTED status 0 ' "client after the daemon's close"
expect_line "$log/s4" '^event DISCONNECTED status 0 ' "server after the daemon's close"

# -- urdmad dies with an established connection: DISCONNECTED -ECONNRESET.
server s5 10.77.0.1 7475 welcome accept
s5=$BG
bg "$log/c5" "$CMP" "$uv" client 10.77.0.1 7475 hello wait 60
c5=$BG
wait_line "$log/c5" '^qp state' 60 || fail "c5 not connected: $(tr '\n' '|' <"$log/c5")"
wait_line "$log/s5" '^qp state' 60 || fail "s5 not connected: $(tr '\n' '|' <"$log/s5")"
pkill -KILL -f "^python3 kmod/tests/fake_urdmad.py veth0 $SOCK/d1.sock"
wait_gone "$c5" 30 || fail "c5 still running"
wait_gone "$s5" 30 || fail "s5 still running"
expect_line "$log/c5" '^event DISCONNECTED status -104 ' "client when urdmad died"
expect_line "$log/s5" '^event DISCONNECTED status -104 ' "server when urdmad died"
[ "$(wc -c </sys/class/infiniband/urdma0/urdmad)" = 0 ] || fail "sysfs urdmad not empty after the daemon died"

# -- urdmad dies with a connect pending: REJECTED -ECONNRESET.
start_daemon d2 veth0
bg "$log/c6" "$CMP" "$uv" client 10.77.0.1 7003 hello wait 60
c6=$BG
wait_line "$log/d2" '^CONNECT .*:7003 ' 30 || fail "d2 got no CONNECT"
pkill -KILL -f "^python3 kmod/tests/fake_urdmad.py veth0 $SOCK/d2.sock"
wait_gone "$c6" 30 || fail "c6 still running"
expect_line "$log/c6" '^event REJECTED status -104 ' "pending connect when urdmad died"

# -- A process killed while connecting: gone once the daemon answers (a
# pending connect holds rdma_destroy_id until its reply: iw_cm waits for it).
start_daemon d3 veth0
# Not under timeout(1): the signal must reach cm_probe itself.
"$CMP" "$uv" client 10.77.0.1 7003 hello wait 60 >"$log/c7" 2>&1 &
c7=$!
pids="$pids $c7"
wait_line "$log/d3" '^CONNECT .*:7003 ' 30 || fail "d3 got no CONNECT"
kill -KILL "$c7"
sleep 2
echo "killed client state: $(ps -o stat= -p "$c7" 2>/dev/null || echo gone)"
kill -USR2 "$(pgrep -f "^python3 kmod/tests/fake_urdmad.py veth0 $SOCK/d3.sock" | head -n1)"
wait_gone "$c7" 20 || fail "killed client stuck: $(ps -o stat=,wchan= -p "$c7")"
stuck=$(ps -eo stat=,comm= | awk '$1 ~ /^D/ && $2 == "cm_probe"')
[ -z "$stuck" ] || fail "cm_probe in D state: $stuck"

# -- A CONNECT the daemon never answers fails on its own after
# connect_timeout seconds (90 by default; 1 to 3600), here 20
# (UNREACHABLE), and the daemon is told to drop it.  The steps up to the
# one that ends d3 run meanwhile (none sends d3 a SIGUSR2, which would
# answer it).
[ "$(cat "$CT")" = 90 ] || fail "connect_timeout is '$(cat "$CT")', not 90 by default"
for v in 0 3601 x; do
	echo "$v" 2>/dev/null >"$CT" && fail "connect_timeout took $v"
done
echo 20 >"$CT" || fail "connect_timeout refused 20"
bg "$log/c13" "$CMP" "$uv" client 10.77.0.1 7003 hello wait 150
c13=$BG
c13_start=$SECONDS
wait_line "$log/d3" '^CONNECT .*:7003 ' 30 || fail "d3 got no CONNECT for the connect left unanswered"

# -- A second daemon in another namespace serves its own interface.
t ip netns exec "$NS" rdma link add urdma1 type urdma netdev veth1 || fail "rdma link add urdma1 in $NS"
start_daemon d4 veth1 ip netns exec "$NS"
printf '%s\n' "$SOCK/d4.sock" | cmp -s - /sys/class/infiniband/urdma1/urdmad ||
	fail "sysfs urdma1/urdmad is '$(cat /sys/class/infiniband/urdma1/urdmad)'"
printf '%s\n' "$SOCK/d3.sock" | cmp -s - /sys/class/infiniband/urdma0/urdmad ||
	fail "sysfs urdma0/urdmad is '$(cat /sys/class/infiniband/urdma0/urdmad)'"
# A wildcard listen reaches every device, each through its own daemon.
server s8 0.0.0.0 7476 welcome accept
s8=$BG
wait_line "$log/d3" '^LISTEN .*:7476 ifname=veth0' 10 || fail "d3 got no LISTEN"
wait_line "$log/d4" '^LISTEN .*:7476 ifname=veth1' 10 || fail "d4 got no LISTEN"
kill "$s8"
wait_line "$log/d4" '^UNLISTEN ' 10 || fail "d4 got no UNLISTEN"
t rdma link delete urdma1 || fail "rdma link delete urdma1"

# -- A process killed with an established connection: the peer sees
# DISCONNECTED once the daemon reports the abort it was told about.
server s9 10.77.0.1 7478 welcome accept
s9=$BG
"$CMP" "$uv" client 10.77.0.1 7478 hello wait 60 >"$log/c9" 2>&1 &
c9=$!
pids="$pids $c9"
wait_line "$log/c9" '^qp state' 60 || fail "c9 not connected: $(tr '\n' '|' <"$log/c9")"
wait_line "$log/s9" '^qp state' 60 || fail "s9 not connected: $(tr '\n' '|' <"$log/s9")"
kill -KILL "$c9"
wait_gone "$c9" 30 || fail "killed established client stuck: $(ps -o stat=,wchan= -p "$c9")"
wait_gone "$s9" 30 || fail "s9 still running"
expect_line "$log/s9" '^event DISCONNECTED status -104 ' "server after its peer was killed"
qpn=$(awk '$1 == "qpn" {print $2}' "$log/c9")
expect_line "$log/d3" "^DISCONNECT .*qpn=$qpn status=-104\$" "abortive DISCONNECT for the killed process's QP"

# -- A request abandoned before the accept (REQUEST_GONE): the accept
# fails with ENOTCONN.
server s10 10.77.0.1 7005 welcome accept
s10=$BG
client 10.77.0.1 7005 hello
expect_line "$log/client" '^event UNREACHABLE status -110 ' "connect abandoned by the daemon"
wait_gone "$s10" 30 || fail "s10 still running"
expect_line "$log/s10" '^accept: ENOTCONN$' "accept of an abandoned request"

# -- The module stays while a daemon has the channel open; no hang.
t rmmod urdma 2>/dev/null && fail "rmmod succeeded with /dev/urdma_cm open"
module_loaded || fail "module gone"

# The connect left unanswered above, before d3 goes.
wait_gone "$c13" 150 || fail "the connect left unanswered did not end"
[ $((SECONDS - c13_start)) -lt 80 ] || fail "the connect left unanswered took $((SECONDS - c13_start)) s, not connect_timeout's 20"
expect_line "$log/c13" '^event UNREACHABLE status -110 ' "connect never answered"
qpn=$(awk '$1 == "qpn" {print $2}' "$log/c13")
# the daemon logs the DISCONNECT when it reads it, in its own time
wait_line "$log/d3" "^DISCONNECT .*qpn=$qpn status=-104" 10
expect_line "$log/d3" "^DISCONNECT .*qpn=$qpn status=-104" "DISCONNECT after the connect timeout"

# -- An accepting thread that cannot run once ACCEPTED came holds up no
# other connection: its ESTABLISHED is posted as iw_accept returns, not
# from the daemon's write, where it would wait on iw_cm's one work queue
# for this thread and every later event with it.  The server sits on CPU 1
# under a real-time spinner (8 s at most) when the daemon answers; the
# client, on CPU 0, must hear ESTABLISHED before the spinner ends.  The
# VM has two CPUs: with one, taskset fails and so does the case.
bg "$log/s14" taskset -c 1 "$CMP" "$uv" server 10.77.0.1 7481 held accept
s14=$BG
wait_line "$log/s14" '^(listening|FAIL)' 30 || fail "s14 not listening"
bg "$log/c14" taskset -c 0 "$CMP" "$uv" client 10.77.0.1 7481 hello wait 60
c14=$BG
wait_line "$log/d3" '^ACCEPT .*pdata=held' 30 || fail "d3 got no held ACCEPT"
d3=$(pgrep -f "^python3 kmod/tests/fake_urdmad.py veth0 $SOCK/d3.sock" | head -n1)
t taskset -p -c 0 "$d3" >/dev/null || fail "d3 to CPU 0"
RT_RUNTIME=$(cat /proc/sys/kernel/sched_rt_runtime_us)
echo -1 >/proc/sys/kernel/sched_rt_runtime_us
# timeout(1) outside the spinner's CPU and class, or it could not end it.
timeout 8 taskset -c 1 chrt -f 50 sh -c 'while :; do :; done' &
spin=$!
pids="$pids $spin"
sleep 0.5
kill -USR2 "$d3"
# Held up: the spinner ended before the client heard ESTABLISHED.
held_up=1
while kill -0 "$spin" 2>/dev/null; do
	if grep -q '^event ESTABLISHED status 0 ' "$log/c14"; then
		kill -0 "$spin" 2>/dev/null && held_up=0
		break
	fi
	sleep 0.1
done
kill "$spin" 2>/dev/null
wait_gone "$spin" 30
echo "$RT_RUNTIME" >/proc/sys/kernel/sched_rt_runtime_us
RT_RUNTIME=
[ "$held_up" = 0 ] ||
	fail "the client's ESTABLISHED waited for the starved accepting thread: $(tr '\n' '|' <"$log/c14")"
wait_line "$log/s14" '^qp state' 30 || fail "s14 not connected: $(tr '\n' '|' <"$log/s14")"
kill -USR1 "$d3"
wait_gone "$c14" 30 || fail "c14 still running"
wait_gone "$s14" 30 || fail "s14 still running"
expect_line "$log/s14" '^event ESTABLISHED status 0 ' "server established after its starvation"

# -- urdmad dies while an accept waits for it: the accept fails at once
# (ENOTCONN), the requester is reset.
server s11 10.77.0.1 7479 noanswer accept
s11=$BG
bg "$log/c11" "$CMP" "$uv" client 10.77.0.1 7479 hello wait 60
c11=$BG
wait_line "$log/d3" '^ACCEPT .*pdata=noanswer' 30 || fail "d3 got no ACCEPT"
pkill -KILL -f "^python3 kmod/tests/fake_urdmad.py veth0 $SOCK/d3.sock"
wait_gone "$s11" 30 || fail "s11 still running"
wait_gone "$c11" 30 || fail "c11 still running"
expect_line "$log/s11" '^accept: ENOTCONN$' "accept when urdmad died"
expect_line "$log/c11" '^event REJECTED status -104 ' "requester when urdmad died"

# Everything above released what it held.
after=$(res_counts urdma0) || fail "rdma resource show urdma0"
[ "$after" = "$before" ] || fail "resource counts '$after' at the end, were '$before'"

# -- The interface goes away under an established connection: the
# registration ends with it and both sides see the connection end.
start_daemon d5 veth0
server s12 10.77.0.1 7480 welcome accept
s12=$BG
bg "$log/c12" "$CMP" "$uv" client 10.77.0.1 7480 hello wait 60
c12=$BG
wait_line "$log/c12" '^qp state' 60 || fail "c12 not connected: $(tr '\n' '|' <"$log/c12")"
wait_line "$log/s12" '^qp state' 60 || fail "s12 not connected: $(tr '\n' '|' <"$log/s12")"
STEP_TIMEOUT=120 t ip link del veth0 || fail "ip link del veth0 with a connection up"
wait_gone "$c12" 30 || fail "c12 still running"
wait_gone "$s12" 30 || fail "s12 still running"
expect_line "$log/c12" '^event (DISCONNECTED status -104|DEVICE_REMOVAL) ' "client when the interface went"
expect_line "$log/s12" '^event (DISCONNECTED status -104|DEVICE_REMOVAL) ' "server when the interface went"
rdma link show 2>/dev/null | grep -q urdma0 && fail "urdma0 left after its interface went"

pkill -f "fake_urdmad.py" 2>/dev/null
for p in $daemons; do
	wait_gone "$p" 30 || fail "a fake daemon did not exit"
done
t rmmod urdma || fail "rmmod after the daemons exited"
ensure_module
dmesg_check
echo "ok"
