#!/usr/bin/env bash
# Open MPI over libfabric's verbs provider with ofi_rxm (issue #29, item 7): mpirun --mca pml
# cm --mca mtl ofi with FI_PROVIDER="verbs;ofi_rxm", the MPI program tests/e2e/mpi.c (a
# ping-pong from 1 byte to MPI_MAX_SIZE bytes, every byte checked both ways; Bcast of 100 B
# and 1 MiB, Allreduce and Alltoall, results checked).
#
# 1. Two ranks in node A: both on device urdmaA, connected to each other through it.
# 2. One rank in each node: mpirun in node A launches its daemons through tests/e2e/netns-rsh
#    (a hostfile naming the nodes A and B; the agent runs each daemon in its node's
#    namespace, under the node's name), each rank on its node's device.
# Expected: Open MPI selects PML cm and the ofi MTL on the urdma devices (mtl:ofi:provider
# urdmaA / urdmaB), both ranks print "mpi: ok", and afterwards every QP, CQ, MR and PD is gone.
#
# ofi_rxm opens a completion queue of (FI_OFI_RXM_MSG_TX_SIZE + FI_OFI_RXM_MSG_RX_SIZE) *
# FI_UNIVERSE_SIZE entries, by default (128 + 128) * 1024 = 262144; a device whose max_cqe is
# smaller makes ofi_rxm fail ("Unable to create verbs CQ") and Open MPI fail with "PML cm cannot
# be selected". MPI_FI_ENV (e.g. "FI_UNIVERSE_SIZE=256") adds variables for a run by hand.
# vm-bed: shared
set -u
. tests/e2e/lib.sh

ITERS=${MPI_ITERS:-5}
MAXSIZE=${MPI_MAX_SIZE:-65536}
STEP_TIMEOUT=${MPI_TIMEOUT:-300}

for p in mpicc mpirun fi_info; do
	command -v "$p" >/dev/null || fail "$p is not installed (scripts/setup: openmpi-bin libopenmpi-dev libfabric-bin)"
done
prog=$(build_mpi mpi) || exit 1

bed_up
before_a=$(res_counts urdmaA)
before_b=$(res_counts urdmaB)

# libfabric sees the urdma device and offers an RDM endpoint with tagged messages over it.
info=$(t ip netns exec urdmaA fi_info -p "verbs;ofi_rxm" -t FI_EP_RDM -c FI_TAGGED 2>&1)
grep -q "domain: urdmaA" <<<"$info" || fail "fi_info -p 'verbs;ofi_rxm' lists no urdmaA domain: $(tail -n1 <<<"$info")"

fienv=(-x "FI_PROVIDER=verbs;ofi_rxm" -x FI_LOG_LEVEL=warn)
for v in ${MPI_FI_ENV:-}; do fienv+=(-x "$v"); done
mpiargs=(--allow-run-as-root --oversubscribe --mca pml cm --mca mtl ofi --mca btl self,vader
	--mca mtl_base_verbose 100 --mca orte_base_help_aggregate 0 "${fienv[@]}")

# launch_state: what is left of a launch, and its TCP connections in both nodes, with the
# nodes' addresses (Open MPI's daemons call mpirun back over TCP, through urdma's TAPs).
launch_state() {
	local ns
	ps -eo pid,ppid,etimes,stat,wchan:24,args | grep -E '[m]pirun|[o]rted|[n]etns-rsh|/[m]pi '
	for ns in urdmaA urdmaB; do
		echo "$ns: $(ip -n "$ns" -o -4 addr show | awk '{print $2, $4}' | tr '\n' ' ')"
		ip netns exec "$ns" ss -tanp 2>&1 | grep -v LISTEN | sed "s/^/$ns: /"
	done
}

# mpi_run NAME DEVICES MPIRUN_ARGS...: mpirun in node A; checks the devices the ranks used.
mpi_run() {
	local name=$1 devs=$2 rc d log=$OUT/mpi-$1.log
	shift 2
	start=$SECONDS
	t_or_dump mpirun ip netns exec urdmaA mpirun "${mpiargs[@]}" "$@" "$prog" -n "$ITERS" -m "$MAXSIZE" >"$log" 2>&1
	rc=$?
	if [ "$rc" = 124 ]; then
		# Where it stood: the launch's own lines (plm), what mpirun was doing at the bound
		# (stuck.log), and what is left of the launch once mpirun is gone.
		grep -m20 -E 'plm:|orted|daemon' "$log"
		sed 's/^/    /' "$OUT/stuck.log"
		launch_state | sed 's/^/mpi '"$name"' after: /'
	fi
	grep -E '^mpi:|mtl:ofi:provider|<warn>|PML|FAIL|error' "$log" | grep -v 'returned -61\|OFI_MRAIL'
	echo "mpi $name: exit $rc in $((SECONDS - start)) s"
	if grep -q "Unable to create verbs CQ" "$log"; then
		fail "mpi $name: ofi_rxm could not create its MSG CQ (max_cqe $(ibv_devinfo -v -d urdmaA |
			awk '$1 == "max_cqe:" {print $2}'); ofi_rxm asks (msg_tx_size + msg_rx_size) * universe_size, 262144 by default): $(grep -m1 'PML cm' "$log")"
	fi
	[ "$rc" = 0 ] || fail "mpi $name: mpirun exit $rc: $(grep -m1 -E 'FAIL|PML cm|error' "$log" || tail -n1 "$log")"
	for d in $devs; do
		grep -q "mtl:ofi:provider: $d\$" "$log" || fail "mpi $name: no rank used device $d"
	done
	for r in 0 1; do
		grep -q "^mpi: ok rank $r of 2" "$log" || fail "mpi $name: rank $r did not finish"
	done
	grep -q "^mpi: pingpong checked" "$log" && grep -q "^mpi: collectives checked" "$log" ||
		fail "mpi $name: the checks did not run"
}

mpi_run 1node urdmaA -np 2
printf 'A slots=1\nB slots=1\n' >"$OUT/mpi-hosts"
mpi_run 2node "urdmaA urdmaB" -np 2 --hostfile "$OUT/mpi-hosts" \
	--mca plm_rsh_agent "$PWD/tests/e2e/netns-rsh" --mca plm_rsh_no_tree_spawn 1 --mca plm_base_verbose 5 \
	--mca oob_tcp_if_include "${ADDR_A%.*}.0/24"

wait_res urdmaA "$before_a" 30
wait_res urdmaB "$before_b" 30
dmesg_check
echo "PASS"
