#!/usr/bin/env bash
# tests/vm/51-e2e-perftest.sh with perftest's bandwidth tools: ib_send_bw, ib_write_bw and
# ib_read_bw with -R over every size of -a (2 B ... 8 MiB), the tools taking the bed's two
# directions in turn, and ib_send_bw with completion events (-e) at 64 KiB, server in node A
# (ib_send_lat -e covers every size with events; -e here over every size moved 1.7 GB and
# took four minutes).  Each run must print a result row for every size.
#
# ib_send_bw -e has a hang of perftest's own over iWARP, with any provider.  The client may
# not post beyond the receives the server has credited, and the server credits by RDMA
# Writes to the client's memory, which complete nothing there; a client that meets the limit
# while none of its sends is outstanding waits in ibv_get_cq_event for a completion that
# never comes.  perftest sets the receive depth to -n and credits every third of it, so the
# client meets the limit only when the server lags at least two thirds of -n receives
# behind.  The run uses -t 1 (each send signalled: with the default -t only the last of
# -n 5 is, and one late credit hangs it) and -n 100: with -n 5 the server credits each
# receive and the client stops at its fifth send without one, which hung a CI run in its
# first size (the server's first wake-up was a scheduling delay away on the bed's two
# shared vCPUs; the client's four round trips were quicker).
# vm-timeout: 1800
# vm-bed: shared
PERFTEST_TOOLS="ib_send_bw ib_write_bw ib_read_bw" PERFTEST_EVENTS="A ib_send_bw -t 1 -n 100 -s 65536" \
	exec bash tests/vm/51-e2e-perftest.sh
