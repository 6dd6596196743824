// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Drives one rdma_cm connection attempt to ADDR:PORT through librdmacm,
 * the way an unmodified application does: resolve the address and route,
 * create a CQ and an RC QP on the device rdma_cm chose (rdma_create_qp
 * moves it to INIT through the kernel's iWARP attributes), and connect.
 *
 *   cm_probe ADDR PORT
 *
 * Prints the device, the QP state after rdma_create_qp and the outcome of
 * rdma_connect as "connect: <errno name>" or "connect: ok", then exits 0;
 * any earlier failure prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch,
					enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev)) {
		printf("FAIL rdma_get_cm_event: %s\n", strerror(errno));
		exit(1);
	}
	if (ev->event != want) {
		printf("FAIL event %s (status %d), want %s\n",
		       rdma_event_str(ev->event), ev->status,
		       rdma_event_str(want));
		exit(1);
	}
	return ev;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_conn_param param = {
		.responder_resources = 1, .initiator_depth = 1,
	};
	struct ibv_qp_init_attr qpa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr attr;
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int rv;

	if (argc != 3) {
		fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
		return 2;
	}
	rv = rdma_getaddrinfo(argv[1], argv[2], &hints, &ai);
	if (rv) {
		printf("FAIL rdma_getaddrinfo: %s\n", gai_strerror(rv));
		return 1;
	}
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		printf("FAIL rdma_create_id: %s\n", strerror(errno));
		return 1;
	}
	if (rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 5000)) {
		printf("FAIL rdma_resolve_addr: %s\n", strerror(errno));
		return 1;
	}
	rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 5000)) {
		printf("FAIL rdma_resolve_route: %s\n", strerror(errno));
		return 1;
	}
	rdma_ack_cm_event(wait_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	printf("device: %s\n", ibv_get_device_name(id->verbs->device));

	pd = ibv_alloc_pd(id->verbs);
	cq = pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	if (!cq) {
		printf("FAIL PD/CQ: %s\n", strerror(errno));
		return 1;
	}
	qpa.send_cq = cq;
	qpa.recv_cq = cq;
	if (rdma_create_qp(id, pd, &qpa)) {
		printf("FAIL rdma_create_qp: %s\n", strerror(errno));
		return 1;
	}
	if (ibv_query_qp(id->qp, &attr, IBV_QP_STATE, &init)) {
		printf("FAIL ibv_query_qp: %s\n", strerror(errno));
		return 1;
	}
	printf("qp %u state after rdma_create_qp: %d\n", id->qp->qp_num,
	       attr.qp_state);

	if (rdma_connect(id, &param))
		printf("connect: %s\n", strerrorname_np(errno));
	else
		printf("connect: ok\n");

	rdma_destroy_qp(id);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	rdma_freeaddrinfo(ai);
	return 0;
}
