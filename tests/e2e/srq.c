// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * A server whose connections share one receive queue, the way storage
 * targets serve many initiators (tests/vm/65-e2e-srq.sh).
 *
 *   srq server ADDR PORT [-c N] [-d DEPTH] [-l LIMIT] [-t S]
 *   srq client ADDR PORT [-i ID] [-n MSGS] [-a AFTER] [-t S]
 *
 * server: one SRQ of DEPTH receives (16) of 256 bytes for all N connections
 * (4), its limit armed at LIMIT (8). Each message received is answered with a
 * Send on its connection. A consumed receive is not posted again at once:
 * once fewer than LIMIT are left, the server waits for
 * IBV_EVENT_SRQ_LIMIT_REACHED (ibv_get_async_event), then posts them all again
 * and re-arms the limit. Every receive must complete successfully with the
 * bytes its client sent: a receive of the SRQ flushed because one connection
 * failed is an error. Once N connections have ended it destroys the QPs, then
 * the SRQ (which must succeed), and prints "srq: server recvs=R
 * limit_events=E failed_conns=F" and "srq: ok server".
 * client: sends MSGS messages (100) of 200 bytes, each holding ID and its
 * sequence number, one at a time, each answered before the next; with -a it
 * moves its QP to the error state after AFTER messages (an abortive failure
 * the server's QP then sees) and ends. Prints "srq: ok client ID sent=S".
 * Every failure prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "e2e.h"

#define MAX_CONNS 64
#define MAX_DEPTH 256
#define BUF 256
#define MSG 200

/* ---- server ---- */

struct server {
	struct rdma_event_channel *ch;
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	char *bufs;
	int depth, limit;
	struct rdma_cm_id *ids[MAX_CONNS];
	long next_seq[MAX_CONNS];
	int conns, accepted, ended, failed;
	int consumed[MAX_DEPTH], n_consumed;
	long recvs, limit_events;
};

static void post_srq(struct server *s, int slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(s->bufs + slot * BUF), .length = BUF, .lkey = s->mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	int rc = ibv_post_srq_recv(s->srq, &wr, &bad);

	if (rc)
		fail("ibv_post_srq_recv: %s", strerror(rc));
}

static void arm(struct server *s)
{
	struct ibv_srq_attr a = { .srq_limit = s->limit };
	int rc = ibv_modify_srq(s->srq, &a, IBV_SRQ_LIMIT);

	if (rc)
		fail("ibv_modify_srq(IBV_SRQ_LIMIT %d): %s", s->limit, strerror(rc));
}

static void setup(struct server *s, struct ibv_context *verbs)
{
	struct ibv_srq_init_attr sa = {
		.attr = { .max_wr = s->depth, .max_sge = 1 },
	};
	struct ibv_srq_attr q;

	s->verbs = verbs;
	s->pd = ibv_alloc_pd(verbs);
	s->cq = s->pd ? ibv_create_cq(verbs, 4 * MAX_DEPTH, NULL, NULL, 0) : NULL;
	s->srq = s->cq ? ibv_create_srq(s->pd, &sa) : NULL;
	if (!s->srq)
		fail("pd/cq/srq: %s", strerror(errno));
	if (ibv_query_srq(s->srq, &q) || q.max_wr < (uint32_t)s->depth || q.srq_limit)
		fail("ibv_query_srq: max_wr %u limit %u", q.max_wr, q.srq_limit);
	s->bufs = calloc(s->depth, BUF);
	s->mr = s->bufs ? ibv_reg_mr(s->pd, s->bufs, s->depth * BUF, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!s->mr)
		fail("ibv_reg_mr: %s", strerror(errno));
	for (int i = 0; i < s->depth; i++)
		post_srq(s, i);
	arm(s);
	if (ibv_query_srq(s->srq, &q) || q.srq_limit != (uint32_t)s->limit)
		fail("ibv_query_srq after arming: limit %u, not %d", q.srq_limit, s->limit);
}

static int conn_index(struct server *s, uint32_t qp_num)
{
	for (int i = 0; i < s->accepted; i++)
		if (s->ids[i]->qp && s->ids[i]->qp->qp_num == qp_num)
			return i;
	fail("completion of unknown QP %u", qp_num);
	return -1;
}

static void reply(struct server *s, int i)
{
	static char ack[8];
	struct ibv_sge sge = { .addr = (uintptr_t)ack, .length = sizeof(ack) };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED, .wr_id = MAX_DEPTH + i,
	}, *bad;

	/* The peer may have failed meanwhile: a refused reply is its business. */
	ibv_post_send(s->ids[i]->qp, &wr, &bad);
}

static void on_recv(struct server *s, struct ibv_wc *wc)
{
	int slot = (int)wc->wr_id, i = conn_index(s, wc->qp_num);
	const char *b = s->bufs + slot * BUF;
	long id, seq;

	if (wc->status != IBV_WC_SUCCESS)
		fail("SRQ receive %d of QP %u: %s (a failed connection flushed a receive of the SRQ?)",
		     slot, wc->qp_num, ibv_wc_status_str(wc->status));
	if (wc->byte_len != MSG || sscanf(b, "client %ld seq %ld", &id, &seq) != 2)
		fail("receive of %u bytes: '%.40s'", wc->byte_len, b);
	if (seq != s->next_seq[i])
		fail("connection %d: message %ld where %ld was due", i, seq, s->next_seq[i]);
	s->next_seq[i]++;
	s->recvs++;
	s->consumed[s->n_consumed++] = slot;
	reply(s, i);
}

/* Fewer than LIMIT receives left: the event must come; then refill and re-arm. */
static void refill(struct server *s)
{
	struct pollfd p = { .fd = s->verbs->async_fd, .events = POLLIN };
	struct ibv_async_event ev;

	for (;;) {
		while (poll(&p, 1, 100) == 0)
			check_time("waiting for IBV_EVENT_SRQ_LIMIT_REACHED");
		if (ibv_get_async_event(s->verbs, &ev))
			fail("ibv_get_async_event: %s", strerror(errno));
		int type = ev.event_type;
		void *srq = ev.element.srq;

		ibv_ack_async_event(&ev);
		if (type == IBV_EVENT_SRQ_LIMIT_REACHED) {
			if (srq != s->srq)
				fail("SRQ limit event for another SRQ");
			break;
		}
		/* A failed connection's QP_FATAL, for example. */
		printf("srq: async event %s\n", ibv_event_type_str(type));
	}
	s->limit_events++;
	for (int i = 0; i < s->n_consumed; i++)
		post_srq(s, s->consumed[i]);
	s->n_consumed = 0;
	arm(s);
}

static void accept_conn(struct server *s, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 8, .max_send_sge = 1, .max_inline_data = 8 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };

	if (!s->pd)
		setup(s, id->verbs);
	if (s->accepted == MAX_CONNS)
		fail("more than %d connections", MAX_CONNS);
	qa.send_cq = s->cq;
	qa.recv_cq = s->cq;
	qa.srq = s->srq;
	if (rdma_create_qp(id, s->pd, &qa))
		fail("rdma_create_qp on the SRQ: %s", strerror(errno));
	s->ids[s->accepted++] = id;
	if (rdma_accept(id, &cp))
		fail("rdma_accept: %s", strerror(errno));
}

static void server_events(struct server *s, int wait)
{
	struct rdma_cm_event *ev;

	while ((ev = cm_event(s->ch, wait))) {
		struct rdma_cm_id *id = ev->id;
		enum rdma_cm_event_type type = ev->event;

		rdma_ack_cm_event(ev);
		switch (type) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			accept_conn(s, id);
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			rdma_disconnect(id);
			s->ended++;
			break;
		default:
			fail("server: unexpected %s", rdma_event_str(type));
		}
		wait = 0;
	}
}

static int run_server(const char *addr, const char *port, struct server *s)
{
	struct rdma_addrinfo *ai = resolve(addr, port, 1);
	struct rdma_cm_id *listener;
	struct ibv_wc wc[16];

	s->ch = rdma_create_event_channel();
	if (!s->ch || rdma_create_id(s->ch, &listener, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listener, ai->ai_src_addr) || rdma_listen(listener, s->conns))
		fail("bind/listen %s:%s: %s", addr, port, strerror(errno));
	printf("srq: listening\n");
	fflush(stdout);
	while (s->ended < s->conns) {
		server_events(s, !s->pd);
		if (!s->pd)
			continue;
		int n = ibv_poll_cq(s->cq, 16, wc);

		if (n < 0)
			fail("ibv_poll_cq: %d", n);
		for (int k = 0; k < n; k++) {
			/* wr_id tells them apart: an error's opcode is undefined */
			if (wc[k].wr_id < MAX_DEPTH)
				on_recv(s, &wc[k]);
			else if (wc[k].status != IBV_WC_SUCCESS)
				s->failed++;	/* a reply to a connection that failed */
		}
		if (s->depth - s->n_consumed < s->limit)
			refill(s);
		check_time("serving");
	}
	for (int i = 0; i < s->accepted; i++) {
		rdma_destroy_qp(s->ids[i]);
		rdma_destroy_id(s->ids[i]);
	}
	if (ibv_destroy_srq(s->srq))
		fail("ibv_destroy_srq once its QPs are gone: %s", strerror(errno));
	printf("srq: server recvs=%ld limit_events=%ld failed_conns=%d\n", s->recvs,
	       s->limit_events, s->failed);
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	ibv_dealloc_pd(s->pd);
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(s->ch);
	rdma_freeaddrinfo(ai);
	printf("srq: ok server\n");
	return 0;
}

/* ---- client ---- */

static struct ibv_wc client_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;

	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		check_time("waiting for a completion");
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		fail("completion: %s", n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
	return wc;
}

static int run_client(const char *addr, const char *port, long id, long msgs, long after)
{
	struct rdma_addrinfo *ai = resolve(addr, port, 0);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *cm;
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	static char sbuf[MSG], rbuf[64];
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *smr, *rmr;
	long sent = 0;

	if (!ch || rdma_create_id(ch, &cm, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_resolve_addr(cm, NULL, ai->ai_dst_addr, 5000))
		fail("rdma_resolve_addr: %s", strerror(errno));
	expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(cm, 5000))
		fail("rdma_resolve_route: %s", strerror(errno));
	expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	pd = ibv_alloc_pd(cm->verbs);
	cq = pd ? ibv_create_cq(cm->verbs, 16, NULL, NULL, 0) : NULL;
	smr = cq ? ibv_reg_mr(pd, sbuf, sizeof(sbuf), 0) : NULL;
	rmr = smr ? ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!rmr)
		fail("pd/cq/mr: %s", strerror(errno));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	if (rdma_create_qp(cm, pd, &qa))
		fail("rdma_create_qp: %s", strerror(errno));
	if (rdma_connect(cm, &cp))
		fail("rdma_connect: %s", strerror(errno));
	expect_event(ch, RDMA_CM_EVENT_ESTABLISHED);
	for (; sent < msgs; sent++) {
		struct ibv_sge rs = { .addr = (uintptr_t)rbuf, .length = sizeof(rbuf), .lkey = rmr->lkey };
		struct ibv_recv_wr rw = { .sg_list = &rs, .num_sge = 1 }, *rbad;
		struct ibv_sge ss = { .addr = (uintptr_t)sbuf, .length = MSG, .lkey = smr->lkey };
		struct ibv_send_wr sw = { .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND }, *sbad;
		int got = 0;

		if (after >= 0 && sent == after) {
			struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

			if (ibv_modify_qp(cm->qp, &a, IBV_QP_STATE))
				fail("ibv_modify_qp(ERR): %s", strerror(errno));
			printf("srq: client %ld failed its QP after %ld messages\n", id, sent);
			break;
		}
		memset(sbuf, 0, sizeof(sbuf));
		snprintf(sbuf, sizeof(sbuf), "client %ld seq %ld", id, sent);
		if (ibv_post_recv(cm->qp, &rw, &rbad) || ibv_post_send(cm->qp, &sw, &sbad))
			fail("post: %s", strerror(errno));
		while (got < 2) {	/* the Send's completion and the answer */
			client_wc(cq);
			got++;
		}
	}
	rdma_disconnect(cm);
	expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(cm);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	rdma_destroy_id(cm);
	rdma_destroy_event_channel(ch);
	rdma_freeaddrinfo(ai);
	printf("srq: ok client %ld sent=%ld\n", id, sent);
	return 0;
}

int main(int argc, char **argv)
{
	static struct server s = { .conns = 4, .depth = 16, .limit = 8 };
	long id = 0, msgs = 100, after = -1;
	double limit = 120;
	int opt;

	if (argc < 4)
		fail("usage: srq server|client ADDR PORT [options]");
	optind = 4;
	while ((opt = getopt(argc, argv, "c:d:l:i:n:a:t:")) != -1) {
		switch (opt) {
		case 'c': s.conns = atoi(optarg); break;
		case 'd': s.depth = atoi(optarg); break;
		case 'l': s.limit = atoi(optarg); break;
		case 'i': id = atol(optarg); break;
		case 'n': msgs = atol(optarg); break;
		case 'a': after = atol(optarg); break;
		case 't': limit = atof(optarg); break;
		default: fail("unknown option");
		}
	}
	if (s.conns < 1 || s.conns > MAX_CONNS || s.depth < 2 || s.depth > MAX_DEPTH ||
	    s.limit < 1 || s.limit >= s.depth || msgs < 1)
		fail("-c 1..%d, -d 2..%d, -l 1..DEPTH-1, -n 1 or more", MAX_CONNS, MAX_DEPTH);
	deadline = now() + limit;
	alarm((unsigned int)limit + 30);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "server"))
		return run_server(argv[2], argv[3], &s);
	if (!strcmp(argv[1], "client"))
		return run_client(argv[2], argv[3], id, msgs, after);
	fail("usage: srq server|client ADDR PORT [options]");
	return 1;
}
