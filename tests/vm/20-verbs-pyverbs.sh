#!/usr/bin/env bash
# rdma-core's own Python bindings (pyverbs, Debian's python3-pyverbs) drive
# urdma0 through libibverbs and liburdma: extended device query, object
# rounds with resource counts back at baseline, errno of invalid requests.
set -u
. tests/verbs/vm-lib.sh

# pyverbs is built for Debian's interpreter only.
/usr/bin/python3 -c "import pyverbs" 2>/dev/null || fail "pyverbs does not import (python3-pyverbs not installed?)"
setup_urdma0
before=$(res_counts urdma0)
[ -n "$before" ] || fail "rdma resource show urdma0 gave nothing"

out=$(STEP_TIMEOUT=600 t /usr/bin/python3 tests/verbs/pyverbs_objects.py urdma0 200 2>&1)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "pyverbs checks (exit $rc): $(grep -m1 -E 'FAIL|Error' <<<"$out" || tail -n1 <<<"$out")"
after=$(res_counts urdma0)
[ "$after" = "$before" ] || fail "resource counts '$after' after pyverbs, were '$before'"

dmesg_check
echo "PASS"
