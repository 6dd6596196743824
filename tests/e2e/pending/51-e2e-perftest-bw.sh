#!/usr/bin/env bash
# tests/vm/51-e2e-perftest.sh with perftest's bandwidth tools: ib_send_bw, ib_write_bw and
# ib_read_bw with -R over every size of -a, both directions of the bed, and ib_send_bw with
# completion events (-e).
#
# NOT YET PASSING under the VM's emulation (perftest's rdma_cm data exchange fails: "Failed
# to exchange data between server and clients"), so tests/vm/run-all does not run it yet:
#   scripts/vm --out out/pending -- bash tests/e2e/pending/51-e2e-perftest-bw.sh
PERFTEST_TOOLS="ib_send_bw ib_write_bw ib_read_bw" PERFTEST_EVENTS=ib_send_bw \
	exec bash tests/vm/51-e2e-perftest.sh
