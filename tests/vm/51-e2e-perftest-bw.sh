#!/usr/bin/env bash
# tests/vm/51-e2e-perftest.sh with perftest's bandwidth tools: ib_send_bw, ib_write_bw and
# ib_read_bw with -R over every size of -a (2 B ... 8 MiB), both directions of the bed, and
# ib_send_bw with completion events (-e), server in node A.  Each run must print a result
# row for every size.
# vm-timeout: 1800
PERFTEST_TOOLS="ib_send_bw ib_write_bw ib_read_bw" PERFTEST_EVENTS="A ib_send_bw" \
	exec bash tests/vm/51-e2e-perftest.sh
