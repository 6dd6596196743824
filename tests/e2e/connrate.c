// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Connection rate: CLIENTS connections to one server at once, each one
 * connect, a Send of 64 bytes and its reply, and a disconnect, over
 * librdmacm on any RDMA device (urdma, rxe, siw).
 *
 *   connrate server ADDR PORT -c CLIENTS [-n CYCLES] [-t SECONDS]
 *   connrate client ADDR PORT -c CLIENTS [-n CYCLES] [-t SECONDS]
 *
 * Both sides must be given the same -c and -n. The client first runs one
 * untimed cycle (the device's and the provider's start-up), then CLIENTS
 * threads, each with its own event channel, PD, CQ and buffer made before
 * the clock starts, run CYCLES cycles each, all starting at once. It prints
 *   connrate clients=N conns=M seconds=S rate_per_s=R
 * The server says "connrate server listening" once it listens, takes the
 * connections as they come, up to MAX_OPEN open at once, answers each Send
 * and prints "connrate server done". Any failure or
 * the -t bound (default 120 s): "FAIL ..." and exit 1; bad arguments: a
 * usage line, exit 2.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "e2e.h"

#define USAGE "usage: connrate server|client ADDR PORT -c CLIENTS [-n CYCLES] [-t SECONDS]"
#define SIZE 64
#define MAX_CLIENTS 256
#define MAX_OPEN (2 * MAX_CLIENTS)

static unsigned clients, cycles = 1, limit = 120;
static const char *addr, *port;
static struct rdma_addrinfo *peer;
static pthread_barrier_t start;

/* A PD, a CQ for both queues (with a completion channel on the server) and
 * one buffer: [0, SIZE) sent from, [SIZE, 2 SIZE) received into. */
struct res {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_comp_channel *ch;
	struct ibv_mr *mr;
	uint8_t buf[2 * SIZE];
};

static void res_setup(struct res *r, struct ibv_context *verbs, int cqe, int chan)
{
	r->pd = ibv_alloc_pd(verbs);
	if (!r->pd)
		fail("ibv_alloc_pd: %s", strerror(errno));
	if (chan) {
		r->ch = ibv_create_comp_channel(verbs);
		if (!r->ch)
			fail("ibv_create_comp_channel: %s", strerror(errno));
	}
	r->cq = ibv_create_cq(verbs, cqe, NULL, r->ch, 0);
	if (!r->cq)
		fail("ibv_create_cq: %s", strerror(errno));
	if (chan && ibv_req_notify_cq(r->cq, 0))
		fail("ibv_req_notify_cq: %s", strerror(errno));
	r->mr = ibv_reg_mr(r->pd, r->buf, sizeof(r->buf), IBV_ACCESS_LOCAL_WRITE);
	if (!r->mr)
		fail("ibv_reg_mr: %s", strerror(errno));
}

static void res_free(struct res *r)
{
	if (ibv_dereg_mr(r->mr) || ibv_destroy_cq(r->cq) ||
	    (r->ch && ibv_destroy_comp_channel(r->ch)) || ibv_dealloc_pd(r->pd))
		fail("releasing a client's resources: %s", strerror(errno));
}

static void make_qp(struct res *r, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = r->cq, .recv_cq = r->cq,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_sge sge = { (uintptr_t)r->buf + SIZE, SIZE, r->mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	if (rdma_create_qp(id, r->pd, &qa))
		fail("rdma_create_qp: %s", strerror(errno));
	if (ibv_post_recv(id->qp, &wr, &bad))
		fail("ibv_post_recv: %s", strerror(errno));
}

static void send_one(struct res *r, struct rdma_cm_id *id)
{
	struct ibv_sge sge = { (uintptr_t)r->buf, SIZE, r->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	if (ibv_post_send(id->qp, &wr, &bad))
		fail("ibv_post_send: %s", strerror(errno));
}

/* Whether wc is a receive (else the Send's completion); fails on an error. */
static int received(const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS)
		fail("%s completion: %s", wc->opcode == IBV_WC_SEND ? "Send" : "receive",
		     ibv_wc_status_str(wc->status));
	if (wc->opcode == IBV_WC_RECV && wc->byte_len != SIZE)
		fail("received %u bytes, want %u", wc->byte_len, SIZE);
	return wc->opcode == IBV_WC_RECV;
}

/* ---- client ----------------------------------------------------------------- */

/* One cycle on a channel of its own: connect, Send, the reply, disconnect. */
static void cycle(struct rdma_event_channel *ev, struct res *r)
{
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					 .retry_count = 7, .rnr_retry_count = 7 };
	struct rdma_cm_id *id;
	struct ibv_wc wc;
	int recvd = 0, sent = 0, n;

	if (rdma_create_id(ev, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_resolve_addr(id, NULL, peer->ai_dst_addr, 5000))
		fail("rdma_resolve_addr: %s", strerror(errno));
	expect_event(ev, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(id, 5000))
		fail("rdma_resolve_route: %s", strerror(errno));
	expect_event(ev, RDMA_CM_EVENT_ROUTE_RESOLVED);
	make_qp(r, id);
	if (rdma_connect(id, &param))
		fail("rdma_connect: %s", strerror(errno));
	expect_event(ev, RDMA_CM_EVENT_ESTABLISHED);
	send_one(r, id);
	while (!recvd || !sent) {
		n = ibv_poll_cq(r->cq, 1, &wc);
		if (n < 0)
			fail("ibv_poll_cq: %d", n);
		if (n == 0) {
			check_time("for a Send's reply");
			sched_yield();
			continue;
		}
		if (received(&wc))
			recvd = 1;
		else
			sent = 1;
	}
	if (rdma_disconnect(id))
		fail("rdma_disconnect: %s", strerror(errno));
	expect_event(ev, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(id);
	if (rdma_destroy_id(id))
		fail("rdma_destroy_id: %s", strerror(errno));
}

struct client {
	pthread_t thread;
	struct rdma_event_channel *ev;
	struct res r;
};

static void *client_thread(void *arg)
{
	struct client *c = arg;
	unsigned i;

	pthread_barrier_wait(&start);
	for (i = 0; i < cycles; i++)
		cycle(c->ev, &c->r);
	return NULL;
}

static void client(void)
{
	struct rdma_event_channel *ev = rdma_create_event_channel();
	struct client *c = calloc(clients, sizeof(*c));
	struct res first = { 0 };
	struct rdma_cm_id *probe;
	struct ibv_context *verbs;
	double t0, t1;
	unsigned i;

	if (!ev || !c)
		fail("rdma_create_event_channel: %s", strerror(errno));
	/* The device's context, from an id resolved to the server. */
	if (rdma_create_id(ev, &probe, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(probe, NULL, peer->ai_dst_addr, 5000))
		fail("rdma_resolve_addr: %s", strerror(errno));
	expect_event(ev, RDMA_CM_EVENT_ADDR_RESOLVED);
	verbs = probe->verbs;
	res_setup(&first, verbs, 4, 0);
	cycle(ev, &first);
	if (pthread_barrier_init(&start, NULL, clients + 1))
		fail("pthread_barrier_init");
	for (i = 0; i < clients; i++) {
		c[i].ev = rdma_create_event_channel();
		if (!c[i].ev)
			fail("rdma_create_event_channel: %s", strerror(errno));
		res_setup(&c[i].r, verbs, 4, 0);
		if (pthread_create(&c[i].thread, NULL, client_thread, &c[i]))
			fail("pthread_create");
	}
	pthread_barrier_wait(&start);
	t0 = now();
	for (i = 0; i < clients; i++)
		pthread_join(c[i].thread, NULL);
	t1 = now();
	for (i = 0; i < clients; i++) {
		res_free(&c[i].r);
		rdma_destroy_event_channel(c[i].ev);
	}
	res_free(&first);
	rdma_destroy_id(probe);
	rdma_destroy_event_channel(ev);
	printf("connrate clients=%u conns=%u seconds=%.6f rate_per_s=%.2f\n", clients,
	       clients * cycles, t1 - t0, clients * cycles / (t1 - t0));
	free(c);
}

/* ---- server ----------------------------------------------------------------- */

/* Takes the connections as they come on one channel, with one PD and CQ for
 * all, and answers each one's Send; waits in poll() on the rdma_cm fd and
 * the completion channel at once. */
static void server(void)
{
	struct rdma_event_channel *ev = rdma_create_event_channel();
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					 .rnr_retry_count = 7 };
	struct rdma_cm_id *listen, *open[MAX_OPEN] = { 0 };
	struct rdma_addrinfo *ai = resolve(addr, port, 1);
	unsigned total = clients * cycles + 1, closed = 0, k;
	struct res r = { 0 };
	int have_res = 0;

	if (!ev)
		fail("rdma_create_event_channel: %s", strerror(errno));
	if (rdma_create_id(ev, &listen, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listen, ai->ai_src_addr) || rdma_listen(listen, MAX_OPEN))
		fail("listen on %s:%s: %s", addr, port, strerror(errno));
	rdma_freeaddrinfo(ai);
	printf("connrate server listening\n");
	fflush(stdout);
	while (closed < total) {
		struct pollfd p[2] = { { .fd = ev->fd, .events = POLLIN },
				       { .fd = have_res ? r.ch->fd : -1, .events = POLLIN } };
		struct rdma_cm_event *e;
		struct rdma_cm_id *open_id;
		struct ibv_cq *cq;
		struct ibv_wc wc;
		void *ctx;
		int n;

		if (poll(p, 2, 100) < 0 && errno != EINTR)
			fail("poll: %s", strerror(errno));
		check_time("for the clients");
		if (have_res && (p[1].revents & POLLIN)) {
			if (ibv_get_cq_event(r.ch, &cq, &ctx))
				fail("ibv_get_cq_event: %s", strerror(errno));
			ibv_ack_cq_events(cq, 1);
			if (ibv_req_notify_cq(r.cq, 0))
				fail("ibv_req_notify_cq: %s", strerror(errno));
		}
		while (have_res && (n = ibv_poll_cq(r.cq, 1, &wc)) != 0) {
			if (n < 0)
				fail("ibv_poll_cq: %d", n);
			if (!received(&wc))
				continue;
			for (k = 0; k < MAX_OPEN && !(open[k] && open[k]->qp->qp_num == wc.qp_num); k++)
				;
			if (k == MAX_OPEN)
				fail("a receive on QP %u, which is not an open connection's", wc.qp_num);
			send_one(&r, open[k]);
		}
		if (!(p[0].revents & POLLIN))
			continue;
		e = next_event(ev);
		switch (e->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			for (k = 0; k < MAX_OPEN && open[k]; k++)
				;
			if (k == MAX_OPEN)
				fail("more than %u connections open at once", MAX_OPEN);
			if (!have_res) {
				/* A CQ with room for every open connection's two completions. */
				res_setup(&r, e->id->verbs, 2 * MAX_OPEN, 1);
				have_res = 1;
			}
			make_qp(&r, e->id);
			if (rdma_accept(e->id, &param))
				fail("rdma_accept: %s", strerror(errno));
			open[k] = e->id;
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			for (k = 0; k < MAX_OPEN && open[k] != e->id; k++)
				;
			if (k == MAX_OPEN)
				fail("DISCONNECTED of a connection that is not open");
			open_id = open[k];
			open[k] = NULL;
			/* The id outlives the event, which the ack frees. */
			rdma_ack_cm_event(e);
			rdma_destroy_qp(open_id);
			rdma_destroy_id(open_id);
			closed++;
			continue;
		default:
			fail("rdma_cm event %s (status %d)", rdma_event_str(e->event), e->status);
		}
		rdma_ack_cm_event(e);
	}
	if (have_res)
		res_free(&r);
	rdma_destroy_id(listen);
	rdma_destroy_event_channel(ev);
	printf("connrate server done\n");
}

static unsigned num(const char *s, unsigned min, unsigned max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max || *s == '-') {
		fprintf(stderr, "connrate: bad number '%s' (%u to %u); " USAGE "\n", s, min, max);
		exit(2);
	}
	return (unsigned)v;
}

static void on_alarm(int sig)
{
	static const char a[] = "FAIL timed out\n";

	(void)sig;
	if (write(1, a, sizeof(a) - 1) < 0)
		_exit(1);
	_exit(1);
}

int main(int argc, char **argv)
{
	int is_client, o;

	if (argc < 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, USAGE "\n");
		return 2;
	}
	is_client = !strcmp(argv[1], "client");
	addr = argv[2];
	port = argv[3];
	optind = 4;
	while ((o = getopt(argc, argv, "c:n:t:")) != -1) {
		switch (o) {
		case 'c':
			clients = num(optarg, 1, MAX_CLIENTS);
			break;
		case 'n':
			cycles = num(optarg, 1, 100000);
			break;
		case 't':
			limit = num(optarg, 1, 86400);
			break;
		default:
			fprintf(stderr, USAGE "\n");
			return 2;
		}
	}
	if (optind != argc || !clients) {
		fprintf(stderr, "connrate: %s; " USAGE "\n", optind != argc ? "stray argument" : "-c is required");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	deadline = now() + limit;
	signal(SIGALRM, on_alarm);
	alarm(limit + 1);
	if (is_client) {
		peer = resolve(addr, port, 0);
		client();
		rdma_freeaddrinfo(peer);
	} else {
		server();
	}
	return 0;
}
