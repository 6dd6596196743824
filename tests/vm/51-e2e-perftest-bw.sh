#!/usr/bin/env bash
# tests/vm/51-e2e-perftest.sh with perftest's bandwidth tools: ib_send_bw, ib_write_bw and
# ib_read_bw with -R over every size of -a (2 B ... 8 MiB), both directions of the bed, and
# ib_send_bw with completion events (-e), server in node A.  Each run must print a result
# row for every size.
#
# ib_send_bw -e runs with -t 1 (one send outstanding, each signalled).  Over iWARP the
# client may not post beyond the receives the server has credited, by RDMA Writes to the
# client's memory (no completion there); with -e, a client that meets that limit while no
# signalled send is outstanding waits for a completion event that never comes (perftest's
# own logic; with -n 5 only the last send is signalled, so it hangs as soon as a credit is
# late).  With -t 1 the limit is met only if the server lags several round trips behind.
# vm-timeout: 1800
PERFTEST_TOOLS="ib_send_bw ib_write_bw ib_read_bw" PERFTEST_EVENTS="A ib_send_bw -t 1" \
	exec bash tests/vm/51-e2e-perftest.sh
