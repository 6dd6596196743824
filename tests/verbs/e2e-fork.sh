#!/usr/bin/env bash
# Open the device, fork, create a QP in the child and then in the parent (node A of the bed).
#   scripts/vm --out out/provider -- bash tests/verbs/e2e-fork.sh
set -u
. tests/e2e/lib.sh
exe=$OUT/fork
TMPDIR=$OUT t cc -O2 -Wall -Werror -o "$exe" tests/verbs/fork.c -libverbs || fail "cannot build tests/verbs/fork.c"
[ -n "${BED_IS_UP:-}" ] || bed_up
out=$(in_node A timeout 300 "$exe" urdmaA 2>&1)
rc=$?
echo "$out"
[ $rc = 0 ] || fail "fork: exit $rc"
echo "PASS fork"
