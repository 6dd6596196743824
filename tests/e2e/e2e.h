/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * What the rdma_cm test programs of tests/e2e share: failing with one line,
 * a deadline, the next rdma_cm event (waited for, or bounded by the deadline)
 * and resolving an address.
 */
#ifndef E2E_H
#define E2E_H

#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* When the program gives up (seconds of CLOCK_MONOTONIC); main sets it. */
static double deadline;

/* Prints "FAIL ..." and exits 1. */
static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void check_time(const char *what)
{
	if (now() > deadline)
		fail("timed out %s", what);
}

/* The channel's next event; failing is fatal. */
static inline struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev))
		fail("rdma_get_cm_event: %s", strerror(errno));
	return ev;
}

/*
 * The channel's next event if one comes within 100 ms, NULL otherwise; with
 * `wait`, the next event, failing at the deadline.
 */
static inline struct rdma_cm_event *cm_event(struct rdma_event_channel *ch, int wait)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };

	while (poll(&p, 1, 100) == 0) {
		if (!wait)
			return NULL;
		check_time("waiting for a connection event");
	}
	return next_event(ch);
}

/* Fails unless the channel's next event, by the deadline, is `want`. */
static inline void expect_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = cm_event(ch, 1);

	if (ev->event != want)
		fail("%s, expected %s (status %d)", rdma_event_str(ev->event),
		     rdma_event_str(want), ev->status);
	rdma_ack_cm_event(ev);
}

static struct rdma_addrinfo *resolve(const char *addr, const char *port, int passive)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;

	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(addr, port, &hints, &res))
		fail("rdma_getaddrinfo %s:%s: %s", addr, port, strerror(errno));
	return res;
}

#endif
