#!/usr/bin/env bash
# urdmad's hardware steering (rte_flow on net_tap, which needs tc flower, multiq and skbedit:
# the VM's Debian kernel has them, the development hosts' kernel does not).  Runs the
# steering tests that `cargo test` on the host marks as ignored, here where they can pass.
# The test binary is the one scripts/setup built on the host (every target, release profile).
set -u

bin=
for f in $(ls -t target/release/deps/steering-* 2>/dev/null); do
	case "$f" in *.d) continue ;; esac
	[ -x "$f" ] && { bin=$f; break; }
done
[ -n "$bin" ] || { echo "no steering test binary: run cargo test --release -p urdmad on the host first"; exit 1; }

out=$(timeout 540 "$bin" --include-ignored --test-threads=1 2>&1)
rc=$?
echo "$out"
grep -qE "^test result: ok\. [1-9][0-9]* passed; 0 failed; 0 ignored" <<<"$out" ||
	{ echo "steering tests failed or were skipped (exit $rc): $(grep -E '^test result' <<<"$out")"; exit 1; }
