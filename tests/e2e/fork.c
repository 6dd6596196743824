// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * fork() in a process that already uses urdma (tests/vm/68-e2e-fork.sh):
 * servers that fork a worker per client, test harnesses that fork both ends
 * of a connection, and shells-out all fork after the parent made QPs.
 *
 *   fork server ADDR PORT [-c N] [-t S]
 *   fork client ADDR PORT [-n MSGS] [-t S]
 *
 * server: echoes every message of its N connections (2) back with a Send,
 * and prints "fork: server ok conns=N msgs=M" once all N have disconnected.
 * client: the parent connects and exchanges MSGS messages (50), each echo
 * checked byte for byte. Then it forks a child and both go on at once: the
 * child checks that the parent's QP is not its own (ibv_post_send on it
 * fails with an errno, and nothing reaches the server), makes a connection
 * of its own and exchanges MSGS messages over it; the parent exchanges MSGS
 * more on its connection meanwhile. The parent waits for the child, which
 * must exit 0, forks a child that exits at once, and exchanges MSGS more:
 * neither child's end disturbed the parent's connection. Prints "fork: ok
 * client"; the child prints "fork: ok child".
 * Every failure prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "e2e.h"

#define MSG 64
#define MAX_CONNS 16
#define RECVS 4

/* ---- server ---- */

struct server {
	struct rdma_event_channel *ch;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char bufs[MAX_CONNS][RECVS + 1][MSG];	/* per connection: receives, then the reply */
	struct rdma_cm_id *ids[MAX_CONNS];
	int conns, accepted, ended;
	long msgs;
};

static void post_recv(struct server *s, int c, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->bufs[c][slot], .length = MSG,
			       .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)c << 8 | slot, .sg_list = &sge,
				  .num_sge = 1 }, *bad;

	if (ibv_post_recv(s->ids[c]->qp, &wr, &bad))
		fail("server ibv_post_recv: %s", strerror(errno));
}

static void accept_one(struct server *s, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = RECVS, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	int c = s->accepted;

	if (c == s->conns)
		fail("more connections than -c %d", s->conns);
	if (!s->pd) {
		s->pd = ibv_alloc_pd(id->verbs);
		s->cq = s->pd ? ibv_create_cq(id->verbs, 64, NULL, NULL, 0) : NULL;
		s->mr = s->cq ? ibv_reg_mr(s->pd, s->bufs, sizeof(s->bufs),
					   IBV_ACCESS_LOCAL_WRITE) : NULL;
		if (!s->mr)
			fail("server pd/cq/mr: %s", strerror(errno));
	}
	qa.send_cq = s->cq;
	qa.recv_cq = s->cq;
	if (rdma_create_qp(id, s->pd, &qa))
		fail("server rdma_create_qp: %s", strerror(errno));
	s->ids[c] = id;
	id->context = (void *)(uintptr_t)c;
	s->accepted++;
	for (int k = 0; k < RECVS; k++)
		post_recv(s, c, k);
	if (rdma_accept(id, &cp))
		fail("rdma_accept: %s", strerror(errno));
}

static void server_events(struct server *s, int wait)
{
	struct rdma_cm_event *ev = cm_event(s->ch, wait);

	if (!ev)
		return;
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		accept_one(s, ev->id);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		rdma_disconnect(ev->id);
		s->ended++;
		break;
	default:
		fail("server: %s (status %d)", rdma_event_str(ev->event), ev->status);
	}
	rdma_ack_cm_event(ev);
}

/* Answers the message in slot `slot` of connection `c` with the same bytes. */
static void echo(struct server *s, int c, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->bufs[c][RECVS], .length = MSG,
			       .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = UINT64_MAX, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	memcpy(s->bufs[c][RECVS], s->bufs[c][slot], MSG);
	post_recv(s, c, slot);
	if (ibv_post_send(s->ids[c]->qp, &wr, &bad))
		fail("server ibv_post_send: %s", strerror(errno));
	s->msgs++;
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
	printf("fork: listening\n");
	while (s->ended < s->conns) {
		server_events(s, !s->pd);
		if (!s->pd)
			continue;
		int n = ibv_poll_cq(s->cq, 16, wc);

		if (n < 0)
			fail("ibv_poll_cq: %d", n);
		for (int k = 0; k < n; k++) {
			if (wc[k].status != IBV_WC_SUCCESS) {
				/* flushed receives of a connection that ended */
				if (wc[k].status == IBV_WC_WR_FLUSH_ERR)
					continue;
				fail("server completion: %s", ibv_wc_status_str(wc[k].status));
			}
			if (wc[k].wr_id != UINT64_MAX)
				echo(s, (int)(wc[k].wr_id >> 8), (int)(wc[k].wr_id & 0xff));
		}
		check_time("serving");
	}
	for (int i = 0; i < s->accepted; i++) {
		rdma_destroy_qp(s->ids[i]);
		rdma_destroy_id(s->ids[i]);
	}
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	ibv_dealloc_pd(s->pd);
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(s->ch);
	rdma_freeaddrinfo(ai);
	printf("fork: server ok conns=%d msgs=%ld\n", s->conns, s->msgs);
	return 0;
}

/* ---- client ---- */

struct conn {
	const char *who;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *smr, *rmr;
	char sbuf[MSG], rbuf[MSG];
	long sent;
};

static void conn_open(struct conn *c, const char *addr, const char *port)
{
	struct rdma_addrinfo *ai = resolve(addr, port, 0);
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };

	c->ch = rdma_create_event_channel();
	if (!c->ch || rdma_create_id(c->ch, &c->id, NULL, RDMA_PS_TCP))
		fail("%s: rdma_create_id: %s", c->who, strerror(errno));
	if (rdma_resolve_addr(c->id, NULL, ai->ai_dst_addr, 5000))
		fail("%s: rdma_resolve_addr: %s", c->who, strerror(errno));
	expect_event(c->ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(c->id, 5000))
		fail("%s: rdma_resolve_route: %s", c->who, strerror(errno));
	expect_event(c->ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->cq = c->pd ? ibv_create_cq(c->id->verbs, 16, NULL, NULL, 0) : NULL;
	c->smr = c->cq ? ibv_reg_mr(c->pd, c->sbuf, MSG, 0) : NULL;
	c->rmr = c->smr ? ibv_reg_mr(c->pd, c->rbuf, MSG, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!c->rmr)
		fail("%s: pd/cq/mr: %s", c->who, strerror(errno));
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	if (rdma_create_qp(c->id, c->pd, &qa))
		fail("%s: rdma_create_qp: %s", c->who, strerror(errno));
	if (rdma_connect(c->id, &cp))
		fail("%s: rdma_connect: %s", c->who, strerror(errno));
	expect_event(c->ch, RDMA_CM_EVENT_ESTABLISHED);
	rdma_freeaddrinfo(ai);
}

static void completion(struct conn *c)
{
	struct ibv_wc wc;
	int n;

	while ((n = ibv_poll_cq(c->cq, 1, &wc)) == 0)
		check_time("waiting for a completion");
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		fail("%s: completion: %s", c->who,
		     n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
}

/* Sends n messages, each answered with its own bytes before the next. */
static void exchange(struct conn *c, long n)
{
	for (long end = c->sent + n; c->sent < end; c->sent++) {
		struct ibv_sge rs = { .addr = (uintptr_t)c->rbuf, .length = MSG,
				      .lkey = c->rmr->lkey };
		struct ibv_recv_wr rw = { .sg_list = &rs, .num_sge = 1 }, *rbad;
		struct ibv_sge ss = { .addr = (uintptr_t)c->sbuf, .length = MSG,
				      .lkey = c->smr->lkey };
		struct ibv_send_wr sw = { .sg_list = &ss, .num_sge = 1,
					  .opcode = IBV_WR_SEND }, *sbad;

		memset(c->sbuf, 0, MSG);
		memset(c->rbuf, 0xff, MSG);
		snprintf(c->sbuf, MSG, "%s pid %d seq %ld", c->who, (int)getpid(), c->sent);
		if (ibv_post_recv(c->id->qp, &rw, &rbad) || ibv_post_send(c->id->qp, &sw, &sbad))
			fail("%s: post: %s", c->who, strerror(errno));
		completion(c);	/* the Send's and the echo's, in either order */
		completion(c);
		if (memcmp(c->sbuf, c->rbuf, MSG))
			fail("%s: message %ld came back as '%.*s'", c->who, c->sent, MSG,
			     c->rbuf);
	}
}

static void conn_close(struct conn *c)
{
	rdma_disconnect(c->id);
	expect_event(c->ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(c->id);
	ibv_dereg_mr(c->smr);
	ibv_dereg_mr(c->rmr);
	ibv_destroy_cq(c->cq);
	ibv_dealloc_pd(c->pd);
	rdma_destroy_id(c->id);
	rdma_destroy_event_channel(c->ch);
}

/* The forked child: the parent's QP is not its own; a connection of its own works. */
static void child(struct conn *parents, const char *addr, const char *port, long msgs)
{
	static struct conn c = { .who = "child" };
	struct ibv_sge ss = { .addr = (uintptr_t)parents->sbuf, .length = MSG,
			      .lkey = parents->smr->lkey };
	struct ibv_send_wr sw = { .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
	int rc;

	alarm((unsigned int)(deadline - now()) + 30);	/* a child has no alarm of its parent's */
	memset(parents->sbuf, 0, MSG);
	snprintf(parents->sbuf, MSG, "the child on the parent's QP");
	rc = ibv_post_send(parents->id->qp, &sw, &bad);
	if (rc == 0)
		fail("child: ibv_post_send on the parent's QP succeeded");
	printf("fork: child's post on the parent's QP: %s\n", strerror(rc));
	conn_open(&c, addr, port);
	exchange(&c, msgs);
	conn_close(&c);
	printf("fork: ok child sent=%ld\n", c.sent);
	fflush(stdout);
	_exit(0);
}

static void reap(pid_t pid, const char *what)
{
	int status;

	while (waitpid(pid, &status, WNOHANG) == 0) {
		check_time(what);
		usleep(10000);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fail("%s: status %#x", what, status);
}

static int run_client(const char *addr, const char *port, long msgs)
{
	static struct conn p = { .who = "parent" };
	pid_t pid;

	conn_open(&p, addr, port);
	exchange(&p, msgs);
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		fail("fork: %s", strerror(errno));
	if (pid == 0)
		child(&p, addr, port, msgs);
	exchange(&p, msgs);	/* while the child connects and exchanges its own */
	reap(pid, "waiting for the child");
	pid = fork();
	if (pid < 0)
		fail("fork: %s", strerror(errno));
	if (pid == 0)
		_exit(0);
	reap(pid, "waiting for the child that exits at once");
	exchange(&p, msgs);
	conn_close(&p);
	printf("fork: ok client sent=%ld\n", p.sent);
	return 0;
}

int main(int argc, char **argv)
{
	static struct server s = { .conns = 2 };
	long msgs = 50;
	double limit = 120;
	int opt;

	if (argc < 4)
		fail("usage: fork server|client ADDR PORT [options]");
	optind = 4;
	while ((opt = getopt(argc, argv, "c:n:t:")) != -1) {
		switch (opt) {
		case 'c': s.conns = atoi(optarg); break;
		case 'n': msgs = atol(optarg); break;
		case 't': limit = atof(optarg); break;
		default: fail("unknown option");
		}
	}
	if (s.conns < 1 || s.conns > MAX_CONNS || msgs < 1)
		fail("-c 1..%d, -n 1 or more", MAX_CONNS);
	deadline = now() + limit;
	alarm((unsigned int)limit + 30);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "server"))
		return run_server(argv[2], argv[3], &s);
	if (!strcmp(argv[1], "client"))
		return run_client(argv[2], argv[3], msgs);
	fail("usage: fork server|client ADDR PORT [options]");
	return 1;
}
