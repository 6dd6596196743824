// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * A process that holds a device's objects and outlives the device's urdmad:
 *
 *   holder DEVICE SECONDS
 *
 * Opens DEVICE, creates a PD, a CQ and a QP (the provider attaches the
 * process to the device's urdmad then), prints "holding", and waits up to
 * SECONDS for IBV_EVENT_DEVICE_FATAL, printing every asynchronous event
 * ("async event: NAME").  After that event it tries to create another QP
 * and prints the outcome, then stays alive, objects and all, until SECONDS
 * have passed or it is killed.
 * Exits 1 if the event did not come.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static struct ibv_qp *new_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	return ibv_create_qp(pd, &a);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_async_event ev;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct pollfd p;
	time_t end;
	char *rest = NULL;
	long secs;
	int i, n;

	secs = argc == 3 ? strtol(argv[2], &rest, 10) : 0;
	if (argc != 3 || *argv[2] == '\0' || *rest != '\0' || secs <= 0) {
		fprintf(stderr, "usage: %s DEVICE SECONDS (a whole number above 0)\n", argv[0]);
		return 2;
	}
	end = time(NULL) + secs;
	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	for (i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		printf("FAIL: cannot open %s\n", argv[1]);
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	cq = pd ? ibv_create_cq(ctx, 8, NULL, NULL, 0) : NULL;
	qp = cq ? new_qp(pd, cq) : NULL;
	if (!qp) {
		printf("FAIL: objects: %s\n", strerror(errno));
		return 1;
	}
	printf("holding qp %u\n", qp->qp_num);

	p.fd = ctx->async_fd;
	p.events = POLLIN;
	do {
		while (poll(&p, 1, 1000) == 0)
			if (time(NULL) > end) {
				printf("FAIL: no fatal asynchronous event\n");
				return 1;
			}
		if (ibv_get_async_event(ctx, &ev)) {
			printf("FAIL: ibv_get_async_event: %s\n",
			       strerror(errno));
			return 1;
		}
		printf("async event: %s\n",
		       ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	} while (ev.event_type != IBV_EVENT_DEVICE_FATAL);
	qp = new_qp(pd, cq);
	printf("create_qp after the event: %s\n",
	       qp ? "succeeded" : strerror(errno));

	while (time(NULL) < end)
		sleep(1);
	return 0;
}
