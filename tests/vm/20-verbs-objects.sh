#!/usr/bin/env bash
# Through unmodified libibverbs (a C program linked only against
# -libverbs) and liburdma: open urdma0, create and destroy PD/MR/CQ/RC QP
# 1000 times with rdma resource counts back at their baseline, then the
# errno of each invalid request and of each verb not implemented yet.
set -u
. tests/verbs/vm-lib.sh

setup_urdma0
prog=$(build_c objects) || exit 1
before=$(res_counts urdma0)
[ -n "$before" ] || fail "rdma resource show urdma0 gave nothing"

out=$(STEP_TIMEOUT=900 t "$prog" urdma0 cycle 1000 2>&1)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "1000 object cycles (exit $rc): $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
after=$(res_counts urdma0)
[ "$after" = "$before" ] || fail "resource counts '$after' after the cycles, were '$before'"

out=$(t "$prog" urdma0 errors 2>&1)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "errno checks (exit $rc): $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
after=$(res_counts urdma0)
[ "$after" = "$before" ] || fail "resource counts '$after' after the errno checks, were '$before'"

# A process killed in the middle of creating and destroying objects
# leaves nothing behind once it is gone.
"$prog" urdma0 cycle 1000000 >/dev/null 2>&1 &
victim=$!
sleep 3
kill -0 "$victim" 2>/dev/null || fail "the cycling process ended before it could be killed"
kill -9 "$victim"
wait "$victim" 2>/dev/null
for _ in $(seq 50); do
	after=$(res_counts urdma0)
	[ "$after" = "$before" ] && break
	sleep 0.2
done
[ "$after" = "$before" ] || fail "resource counts '$after' after a killed process, were '$before'"

dmesg_check
echo "PASS"
