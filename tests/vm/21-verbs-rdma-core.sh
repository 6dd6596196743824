#!/usr/bin/env bash
# rdma-core's own test suite (python3-pyverbs ships it in /usr/share/doc/rdma-core/tests,
# entry point run_tests.py), unmodified, against urdma and siw in one boot (reduced, for CI),
# or urdma, siw and rxe (full):
#   scripts/vm --timeout 1500 -- env RCT_STACKS="siw rxe" tests/vm/run-all 21-verbs-rdma-core
#
# Every generic module runs (not mlx5_*, efa*, cuda*, vfio: they need that hardware): a copy
# of the suite, gunzipped, under $OUT holds only those, and run_tests.py runs them all in one
# process per stack, as upstream runs it.  The suite is single-node: each test opens one
# device and connects its QPs to each other on it (rdmacm tests: both ends on the device's own
# address, in two processes forked from the test's).
#   urdma: the two-node bed (scripts/bed), run in node A on urdmaA;
#   rxe, siw: rxe0 and siw0, each on a veth pair of its own in the root namespace
#   (scripts/klink.sh; siw.ko from out/siw, or built by scripts/build-siw).
# The runs go at once (RCT_SERIAL=1: one after the other): most of a run's time under
# emulation is its rdmacm tests waiting for their peers (a failing one waits out upstream's
# 15-s bound), which leaves the CPU to the others.  Every device is there from before the first
# run until after the last.
# Adapted, by tests/verbs/rdma-core-tests.py, and nothing else: how a test finds its device's
# IP address (upstream: the parent device's net/ directory in sysfs, which a software device
# on a TAP or veth lacks; there: the netdev `rdma link` reports for the port), and each test's
# random choices, seeded with its name so that every stack draws the same.  Every stack runs
# with --dev DEV --gid 0 (upstream's own discovery skips an iWARP device's GID, its MAC
# followed by zeros, as a zero GID; rxe's GID 0 is the one upstream would choose anyway).
#
# Prints unittest's summary for each stack side by side, every test whose outcome differs
# between them, and urdma's failures and errors.  Fails when urdma passes fewer tests than siw,
# when a urdma failure or error is not in ALLOW below (each with its reason), when urdma's run
# did not finish, or when urdmaA's resource counts are not back where they were after it.
# The time column is each run's own wall time (the runs overlap).
# RCT_LIMIT: seconds each stack's run may take (default 480).
# vm-timeout: 900
set -u
. tests/e2e/lib.sh
. scripts/klink.sh

LIMIT=${RCT_LIMIT:-480}
# The kernel stacks beside urdma: siw, the one it must match, in CI; the full form adds rxe
# (RCT_STACKS="siw rxe"), whose figures docs/verbs.md reports.
KSTACKS=${RCT_STACKS:-siw}
SRC=/usr/share/doc/rdma-core/tests
RUNNER=tests/verbs/rdma-core-tests.py
PY=/usr/bin/python3	# pyverbs is built for Debian's interpreter only
# STACK: "IF_A IF_B ADDR_A ADDR_B routing-table" of its veth pair (scripts/klink.sh)
declare -A KLINK=([rxe]="rct-rxe-a rct-rxe-b 10.78.0.1 10.78.0.2 178" [siw]="rct-siw-a rct-siw-b 10.79.0.1 10.79.0.2 179")
suite=$OUT/rdma-core-suite/tests

# urdma's failures and errors that are accepted: test id (module.Class.method) -> why. Each is
# in docs/verbs.md, "rdma-core's test suite", iWARP's limits and urdma's defects apart.
JOINED="RC QPs joined by ibv_modify_qp (GID, QPN), without rdma_cm: an iWARP QP is connected only by iw_cm"
declare -A ALLOW=(
	[test_qp.QPTest.test_query_rc_qp]="wants a new QP of an RNIC to query as INIT (cxgb4 reports its idle state so); urdma.ko reports RESET, the state verbs gives a new QP (siw fails it too)"
	[test_atomic.AtomicTest.test_atomic_cmp_and_swap]="RC QPs joined by ibv_modify_qp (GID, QPN), without rdma_cm: an iWARP QP is connected only by iw_cm (urdma: post_send EINVAL, not connected; siw: the RTS modify EINVAL)"
	[test_atomic.AtomicTest.test_atomic_fetch_and_add]=$JOINED
	[test_cq_events.CqEventsTestCase.test_cq_events_rc]=$JOINED
	[test_cqex.CqExTestCase.test_rc_traffic_cq_ex]=$JOINED
	[test_mr.MRTest.test_mr_rereg_access_bad_flow]=$JOINED
	[test_mr.MRTest.test_mr_rereg_pd]=$JOINED
	[test_relaxed_ordering.RoTestCase.test_ro_rc_traffic]=$JOINED
	# their first bind is posted on a QP that never connected: EINVAL (siw has no windows)
	[test_mr.MWTest.test_mw_type1]=$JOINED
	[test_mr.MWTest.test_invalidate_mw_type1]=$JOINED
	[test_mr.MWTest.test_mw_type2]=$JOINED
	[test_mr.MWTest.test_mw_type2_invalidate_dealloc]=$JOINED
	[test_mr.MWTest.test_mw_type2_invalidate_local]=$JOINED
	[test_mr.MWTest.test_mw_type2_invalidate_remote]=$JOINED
	# their first ibv_wr_complete posts on a QP that never connected: EINVAL (siw has no ibv_wr_*)
	[test_qpex.QpExTestCase.test_qp_ex_rc_send]=$JOINED
	[test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write]=$JOINED
	[test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write_zero_length]=$JOINED
	[test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write_imm]=$JOINED
	[test_qpex.QpExTestCase.test_qp_ex_rc_rdma_read]=$JOINED
	[test_qpex.QpExTestCase.test_qp_ex_rc_rdma_read_zero_size]=$JOINED
	[test_qpex.QpExTestCase.test_qp_ex_rc_atomic_cmp_swp]=$JOINED
	[test_qpex.QpExTestCase.test_qp_ex_rc_atomic_fetch_add]=$JOINED
	[test_qpex.QpExTestCase.test_qp_ex_rc_bind_mw]=$JOINED
	[test_rdmacm.CMTestCase.test_rdmacm_async_traffic]="checks that rdma_set_option(ACK_TIMEOUT) shows in query_qp's timeout: rdma_cm applies it to IB/RoCE QPs only (siw fails it too)"
	[test_rdmacm.CMTestCase.test_rdmacm_async_traffic_external_qp]="expects RDMA_CM_EVENT_CONNECT_RESPONSE then rdma_establish for an external QP: iw_cm moves the QP to RTS itself and reports ESTABLISHED (siw fails it too)"
	[test_rdmacm.CMTestCase.test_rdmacm_async_udp_traffic]="RDMA_PS_UDP needs a UD QP: iWARP has none (create_qp EOPNOTSUPP; siw fails it too)"
)

cleanup() {
	local s
	bed_down	# also ends the background runs (jobs -p)
	for s in rxe siw; do
		set -- ${KLINK[$s]}
		KTABLE=$5 kstack_down "$s" "$1" "$2" >/dev/null 2>&1
	done
	rm -rf "$OUT/rdma-core-suite"
}

# --- the suite: a copy of the generic modules, gunzipped ------------------------------------
$PY -c "import pyverbs" 2>/dev/null || fail "pyverbs does not import (python3-pyverbs not installed?)"
[ -f "$SRC/run_tests.py" ] || fail "no $SRC/run_tests.py (python3-pyverbs not installed?)"
rm -rf "$OUT/rdma-core-suite"
mkdir -p "$OUT/rdma-core-suite"
cp -r "$SRC" "$suite" || fail "cannot copy $SRC"
gunzip -f "$suite"/*.gz || fail "cannot gunzip the suite"
for f in "$suite"/test_*.py; do
	case "${f##*/}" in
	test_mlx5_* | test_efa* | test_cuda* | *vfio*) rm -f "$f" ;;
	esac
done
modules=$(cd "$suite" && ls test_*.py | sed 's/\.py$//' | tr '\n' ' ')
echo "[${SECONDS}s] rdma-core $(dpkg-query -W -f '${Version}' python3-pyverbs 2>/dev/null), modules: $modules"

# run_suite STACK DEV [NS...]: runs the suite against DEV (in namespace NS when given) into
# $OUT/rdma-core-STACK.{log,results,secs}.
run_suite() {
	local stack=$1 dev=$2 start=$SECONDS
	shift 2
	"$@" env URDMA_RCT_RESULTS="$OUT/rdma-core-$stack.results" URDMA_RCT_DEADLINE=$((LIMIT - 15)) \
		timeout -k 10 "$LIMIT" $PY "$RUNNER" "$suite" -v --dev "$dev" --gid 0 \
		>"$OUT/rdma-core-$stack.log" 2>&1
	echo $((SECONDS - start)) >"$OUT/rdma-core-$stack.secs"
}

# summary STACK: "passed failed errors skipped ran" from the results file.
summary() {
	local f=$OUT/rdma-core-$1.results
	awk -F'\t' '$1 == "ok" {p++} $1 == "fail" {f++} $1 == "error" {e++} $1 == "skip" {s++}
		$1 == "start" {r++} END {printf "%d %d %d %d %d\n", p, f, e, s, r}' "$f" 2>/dev/null || echo "0 0 0 0 0"
}

# --- the stacks: urdma on the bed, rxe and siw on veth pairs --------------------------------
siw_ko=out/siw/siw.ko
if [ ! -f "$siw_ko" ] || [ "$(modinfo -F vermagic "$siw_ko" 2>/dev/null | cut -d' ' -f1)" != "$(uname -r)" ]; then
	siw_ko=$(t scripts/build-siw "$OUT/siw") || fail "no siw.ko for $(uname -r), and scripts/build-siw failed"
fi
bed_up
trap cleanup EXIT	# after bed_up, whose own trap it replaces (cleanup calls bed_down)
before=$(res_counts urdmaA)
echo "[${SECONDS}s] the bed is up"
for s in $KSTACKS; do
	set -- ${KLINK[$s]}
	KTABLE=$5 kstack_up "$s" "$1" "$2" "$3" "$4" "$siw_ko" || fail "cannot set $s up on a veth pair"
done
rm -f "$OUT"/rdma-core-{urdma,rxe,siw}.{log,results,secs}
echo "[${SECONDS}s] $KSTACKS up"

# --- the runs ---------------------------------------------------------------------------------
start=$SECONDS
echo "[${SECONDS}s] runs: run_tests.py -v --dev DEV --gid 0, each within ${LIMIT}s$([ "${RCT_SERIAL:-0}" = 1 ] && echo ", one after the other")"
if [ "${RCT_SERIAL:-0}" = 1 ]; then
	run_suite urdma urdmaA ip netns exec urdmaA
	for s in $KSTACKS; do run_suite "$s" "${s}0"; done
else
	run_suite urdma urdmaA ip netns exec urdmaA &
	for s in $KSTACKS; do run_suite "$s" "${s}0" & done
	wait
fi
runs_s=$((SECONDS - start))
for s in urdma $KSTACKS; do
	echo "== $s: $(grep -E "^(Ran |OK|FAILED)" "$OUT/rdma-core-$s.log" | tr '\n' ' ')"
done
finished_urdma=$(grep -cE "^(OK|FAILED)" "$OUT/rdma-core-urdma.log")
# what the suite created on urdmaA is gone again once its processes have ended
for _ in $(seq 150); do
	after=$(res_counts urdmaA)
	[ "$after" = "$before" ] && break
	sleep 0.2
done

# --- the three side by side -----------------------------------------------------------------
echo
echo "the runs took ${runs_s}s, the test so far ${SECONDS}s; urdmaA's resources after the run: $after"
printf '%-8s %7s %7s %7s %7s %5s %6s\n' stack passed failed errors skipped ran time
for s in urdma $KSTACKS; do
	read -r p f e k r <<<"$(summary "$s")"
	eval "PASS_$s=$p"
	secs=$(cat "$OUT/rdma-core-$s.secs" 2>/dev/null)
	[ -n "$secs" ] && secs=${secs}s
	printf '%-8s %7s %7s %7s %7s %5s %6s\n' "$s" "$p" "$f" "$e" "$k" "$r" "${secs:-n/a}"
done

# Every test whose outcome differs between the stacks or that urdma failed, with each
# stack's outcome; then how many every stack skipped.
echo
stacks="urdma $KSTACKS"
echo "tests whose outcome differs, or that urdma did not pass or skip (${stacks// / \/ }):"
files=()
for s in $stacks; do files+=("$OUT/rdma-core-$s.results"); done
table=$(awk -F'\t' -v stacks="$stacks" '
	BEGIN { ns = split(stacks, k, " ") }
	FNR == 1 { s = FILENAME; sub(/.*rdma-core-/, "", s); sub(/\.results$/, "", s) }
	$1 == "start" { ids[$2] = 1 }
	$1 != "start" { st[s, $2] = $1 }
	END {
		for (id in ids) {
			same = 1; line = ""
			for (i = 1; i <= ns; i++) {
				o = ((k[i], id) in st) ? st[k[i], id] : "-"
				if (i == 1) first = o; else if (o != first) same = 0
				line = line sprintf("%s%-5s", i == 1 ? "" : " / ", o)
			}
			if (same && (first == "ok" || first == "skip")) {
				n[first]++
				continue
			}
			printf "  %-72s %s\n", id, line
		}
		printf "=  and %d tests every stack passed, %d every stack skipped\n", n["ok"], n["skip"]
	}' "${files[@]}" 2>/dev/null)
grep -v '^=' <<<"$table" | sort
grep '^=' <<<"$table" | cut -c2-
echo
echo "the slowest tests (seconds):"
for s in urdma $KSTACKS; do
	echo "  $s: $(awk -F'\t' '$1 != "start" {print $3, $2}' "$OUT/rdma-core-$s.results" 2>/dev/null |
		sort -rn | head -n 6 | awk '{printf "%s %s; ", $1, $2}')"
done

echo
echo "urdma's failures and errors:"
bad=0
while IFS=$'\t' read -r kind id _ what; do
	[ "$kind" = fail ] || [ "$kind" = error ] || continue
	if [ -n "${ALLOW[$id]:-}" ]; then
		echo "  allowed $kind $id: $what (${ALLOW[$id]})"
	else
		echo "  $kind $id: $what"
		bad=$((bad + 1))
	fi
done <"$OUT/rdma-core-urdma.results"
echo "urdma's skips by reason:"
awk -F'\t' '$1 == "skip" {print $4}' "$OUT/rdma-core-urdma.results" | sort | uniq -c | sort -rn

[ "$finished_urdma" -ge 1 ] ||
	fail "urdma's run did not finish within ${LIMIT}s (last started: $(awk -F'\t' '$1 == "start" {t = $2} END {print t}' "$OUT/rdma-core-urdma.results"))"
[ "$after" = "$before" ] || fail "urdmaA: resource counts '$after' after the suite, were '$before'"
dmesg_check
[ "$bad" = 0 ] || fail "urdma: $bad failure(s) or error(s) not in the allow-list (above)"
[ -n "${PASS_siw:-}" ] && [ "$PASS_siw" -gt 0 ] || fail "siw did not run: no comparison"
[ "$PASS_urdma" -ge "$PASS_siw" ] || fail "urdma passed $PASS_urdma tests, siw $PASS_siw"
echo "PASS"
