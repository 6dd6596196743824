// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * One rdma_cm scenario per run, as an unmodified librdmacm application sees
 * it; for any iWARP or RoCE device.
 *
 *   cm_cases server ADDR PORT reject PDATA     reject the first request with PDATA
 *   cm_cases server ADDR PORT disconnect       accept, then rdma_disconnect
 *   cm_cases server ADDR PORT wait             accept, wait for the peer's disconnect
 *   cm_cases server ADDR PORT hold             accept, wait until killed
 *   cm_cases server ADDR PORT send             accept, send one message: its
 *                                              completion must be a success
 *   cm_cases server ADDR PORT twice            listen on PORT twice: the second must fail
 *   cm_cases client ADDR PORT rejected [PDATA] expect REJECTED (with exactly PDATA)
 *   cm_cases client ADDR PORT unreachable      expect UNREACHABLE (or a timeout error)
 *   cm_cases client ADDR PORT disconnect       connect, then rdma_disconnect
 *   cm_cases client ADDR PORT wait             connect, wait for the peer's disconnect
 *   cm_cases client ADDR PORT hold             connect, wait for DISCONNECTED (peer died)
 *   cm_cases client ADDR PORT hold-cq          connect, post a receive, arm the CQ and
 *                                              block in ibv_get_cq_event until killed
 *                                              (an event: "FAIL", nothing was sent)
 *   cm_cases client ADDR PORT exit-on-recv     connect with a receive posted, poll
 *                                              until it completes, exit at once
 *   cm_cases client ADDR PORT disconnect-on-recv  as exit-on-recv, but disconnect
 *                                              first, and exit()
 *   cm_cases client ADDR PORT close-on-recv    as disconnect-on-recv, destroying the QP
 *                                              before exit()
 *
 * Prints "event NAME status N" for each rdma_cm event and "ok" when the
 * scenario went as expected (exit 0); "FAIL ..." and exit 1 otherwise.
 * Every wait is bounded (30 s, or -t SECONDS as the last two arguments).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static int wait_ms = 30000;

static void fail(const char *what)
{
	printf("FAIL %s\n", what);
	fflush(stdout);
	exit(1);
}

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, wait_ms) != 1)
		fail("no rdma_cm event in time");
	if (rdma_get_cm_event(ch, &ev)) {
		printf("FAIL rdma_get_cm_event: %s\n", strerror(errno));
		exit(1);
	}
	printf("event %s status %d", rdma_event_str(ev->event), ev->status);
	if (ev->param.conn.private_data_len && ev->param.conn.private_data)
		printf(" pdata '%.*s'", (int)strnlen(ev->param.conn.private_data,
						     ev->param.conn.private_data_len),
		       (const char *)ev->param.conn.private_data);
	printf("\n");
	fflush(stdout);
	return ev;
}

static void expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = next_event(ch);

	if (ev->event != want) {
		printf("FAIL expected %s\n", rdma_event_str(want));
		exit(1);
	}
	rdma_ack_cm_event(ev);
}

static struct ibv_comp_channel *comp_channel;
static struct ibv_pd *qp_pd;

/* The QP's CQ completes through comp_channel when there is one. */
static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qpa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	qp_pd = ibv_alloc_pd(id->verbs);
	if (!qp_pd)
		fail("ibv_alloc_pd");
	qpa.send_cq = qpa.recv_cq = ibv_create_cq(id->verbs, 8, NULL,
						  comp_channel, 0);
	if (!qpa.send_cq)
		fail("ibv_create_cq");
	if (rdma_create_qp(id, qp_pd, &qpa))
		fail("rdma_create_qp");
}

/*
 * With a receive posted and the CQ armed, waits in ibv_get_cq_event: the
 * peer sends nothing, so no event may come.  Ends when killed.
 */
static void hold_on_cq(struct rdma_cm_id *id)
{
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(qp_pd, buf, sizeof(buf),
				       IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof(buf) };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;
	struct ibv_cq *cq;
	void *ctx;

	if (!mr)
		fail("ibv_reg_mr");
	sge.lkey = mr->lkey;
	if (ibv_post_recv(id->qp, &wr, &bad))
		fail("ibv_post_recv");
	if (ibv_req_notify_cq(id->qp->recv_cq, 0))
		fail("ibv_req_notify_cq");
	printf("waiting on the completion channel\n");
	if (ibv_get_cq_event(comp_channel, &cq, &ctx))
		fail("ibv_get_cq_event");
	fail("a completion event with nothing sent");
}

static char msg_buf[64];

/* Busy-polls the QP's CQ for one completion, for at most wait_ms. */
static struct ibv_wc poll_one(struct rdma_cm_id *id)
{
	struct timespec t0, t;
	struct ibv_wc wc;
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		n = ibv_poll_cq(id->qp->send_cq, 1, &wc);
		if (n < 0)
			fail("ibv_poll_cq");
		if (n == 1)
			return wc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > wait_ms)
			fail("no completion in time");
	}
}

static struct ibv_mr *msg_mr(void)
{
	struct ibv_mr *mr = ibv_reg_mr(qp_pd, msg_buf, sizeof(msg_buf),
				       IBV_ACCESS_LOCAL_WRITE);

	if (!mr)
		fail("ibv_reg_mr");
	return mr;
}

/*
 * One Send to a peer that exits as soon as it has it: the message was
 * delivered, so it completes successfully, whatever becomes of the
 * connection next (siw and rxe complete it too).
 */
static void send_one(struct rdma_cm_id *id)
{
	struct ibv_mr *mr = msg_mr();
	struct ibv_sge sge = { (uintptr_t)msg_buf, sizeof(msg_buf), mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	if (ibv_post_send(id->qp, &wr, &bad))
		fail("ibv_post_send");
	wc = poll_one(id);
	printf("send completion: %s\n", ibv_wc_status_str(wc.status));
	if (wc.status != IBV_WC_SUCCESS)
		fail("a Send the peer received did not complete successfully");
}

static void post_one_recv(struct rdma_cm_id *id)
{
	struct ibv_mr *mr = msg_mr();
	struct ibv_sge sge = { (uintptr_t)msg_buf, sizeof(msg_buf), mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 3, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(id->qp, &wr, &bad))
		fail("ibv_post_recv");
}

/* The message is in: exit before anything else can go out. */
static void exit_on_recv(struct rdma_cm_id *id)
{
	struct ibv_wc wc = poll_one(id);

	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
		fail("expected a receive completion");
	printf("received; exiting\nok\n");
	fflush(stdout);
	_exit(0);
}

/*
 * The message is in: disconnect (and destroy the QP) and exit at once, as most
 * applications end, while the close is still going on.
 */
static void close_on_recv(struct rdma_cm_id *id, int destroy)
{
	struct ibv_wc wc = poll_one(id);

	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
		fail("expected a receive completion");
	if (rdma_disconnect(id))
		fail("rdma_disconnect");
	if (destroy)
		rdma_destroy_qp(id);
	printf("received, closed; exiting\nok\n");
	exit(0);
}

static struct rdma_addrinfo *addr(const char *host, const char *port, int passive)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *ai;
	int rv;

	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	rv = rdma_getaddrinfo(host, port, &hints, &ai);
	if (rv) {
		printf("FAIL rdma_getaddrinfo: %s\n", gai_strerror(rv));
		exit(1);
	}
	return ai;
}

static int server(const char *host, const char *port, const char *what,
		  const char *pdata)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = addr(host, port, 1);
	struct rdma_conn_param param = { .responder_resources = 1,
					 .initiator_depth = 1 };
	struct rdma_cm_id *lid, *id;
	struct rdma_cm_event *ev;

	if (!ch || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP))
		fail("rdma_create_id");
	if (rdma_bind_addr(lid, ai->ai_src_addr) || rdma_listen(lid, 8)) {
		printf("FAIL listen: %s\n", strerror(errno));
		return 1;
	}
	if (!strcmp(what, "twice")) {
		struct rdma_cm_id *second;

		if (rdma_create_id(ch, &second, NULL, RDMA_PS_TCP))
			fail("rdma_create_id");
		if (!rdma_bind_addr(second, ai->ai_src_addr) && !rdma_listen(second, 8))
			fail("a second listener on the same port was allowed");
		printf("second listen: %s\n", strerror(errno));
		if (errno != EADDRINUSE)
			fail("expected EADDRINUSE");
		printf("ok\n");
		return 0;
	}
	printf("listening\n");
	fflush(stdout);
	ev = next_event(ch);
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		fail("expected CONNECT_REQUEST");
	id = ev->id;
	if (!strcmp(what, "reject")) {
		if (rdma_reject(id, pdata, pdata ? strlen(pdata) + 1 : 0))
			fail("rdma_reject");
		rdma_ack_cm_event(ev);
		printf("ok\n");
		return 0;
	}
	make_qp(id);
	if (rdma_accept(id, &param)) {
		printf("FAIL rdma_accept: %s\n", strerror(errno));
		return 1;
	}
	rdma_ack_cm_event(ev);
	expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	if (!strcmp(what, "disconnect")) {
		if (rdma_disconnect(id))
			fail("rdma_disconnect");
	} else if (!strcmp(what, "hold")) {
		wait_ms = 3600 * 1000;
	} else if (!strcmp(what, "send")) {
		send_one(id);
	} else if (strcmp(what, "wait")) {
		fail("unknown server scenario");
	}
	expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	printf("ok\n");
	return 0;
}

static int client(const char *host, const char *port, const char *what,
		  const char *pdata)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = addr(host, port, 0);
	struct rdma_conn_param param = { .responder_resources = 1,
					 .initiator_depth = 1,
					 .private_data = "hello",
					 .private_data_len = 6 };
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 5000))
		fail("rdma_resolve_addr");
	expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(id, 5000))
		fail("rdma_resolve_route");
	expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	if (!strcmp(what, "hold-cq")) {
		comp_channel = ibv_create_comp_channel(id->verbs);
		if (!comp_channel)
			fail("ibv_create_comp_channel");
	}
	make_qp(id);
	if (strstr(what, "-on-recv"))
		post_one_recv(id);
	if (rdma_connect(id, &param)) {
		printf("FAIL rdma_connect: %s\n", strerror(errno));
		return 1;
	}
	ev = next_event(ch);
	if (!strcmp(what, "rejected")) {
		const char *got = ev->param.conn.private_data;
		unsigned len = ev->param.conn.private_data_len;

		if (ev->event != RDMA_CM_EVENT_REJECTED)
			fail("expected REJECTED");
		if (pdata && (!got || len < strlen(pdata) + 1 ||
			      memcmp(got, pdata, strlen(pdata) + 1)))
			fail("REJECTED without the peer's private data");
		printf("ok\n");
		return 0;
	}
	if (!strcmp(what, "unreachable")) {
		if (ev->event != RDMA_CM_EVENT_UNREACHABLE)
			fail("expected UNREACHABLE");
		printf("ok\n");
		return 0;
	}
	if (ev->event != RDMA_CM_EVENT_ESTABLISHED)
		fail("expected ESTABLISHED");
	rdma_ack_cm_event(ev);
	if (!strcmp(what, "disconnect")) {
		if (rdma_disconnect(id))
			fail("rdma_disconnect");
	} else if (!strcmp(what, "hold")) {
		wait_ms = 3600 * 1000;
	} else if (!strcmp(what, "hold-cq")) {
		hold_on_cq(id);
	} else if (!strcmp(what, "exit-on-recv")) {
		exit_on_recv(id);
	} else if (!strcmp(what, "disconnect-on-recv")) {
		close_on_recv(id, 0);
	} else if (!strcmp(what, "close-on-recv")) {
		close_on_recv(id, 1);
	} else if (strcmp(what, "wait")) {
		fail("unknown client scenario");
	}
	expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	const char *pdata;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 3 && !strcmp(argv[argc - 2], "-t")) {
		wait_ms = atoi(argv[argc - 1]) * 1000;
		argc -= 2;
	}
	if (argc < 5) {
		fprintf(stderr, "usage: %s server|client ADDR PORT SCENARIO [PDATA] [-t SECONDS]\n",
			argv[0]);
		return 2;
	}
	pdata = argc > 5 ? argv[5] : NULL;
	if (!strcmp(argv[1], "server"))
		return server(argv[2], argv[3], argv[4], pdata);
	if (!strcmp(argv[1], "client"))
		return client(argv[2], argv[3], argv[4], pdata);
	fprintf(stderr, "cm_cases: first argument must be server or client\n");
	return 2;
}
