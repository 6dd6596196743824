// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The target of a hostile peer (tests/vm/63-e2e-hostile.sh): a server whose
 * registered memory is fenced and watched, connections kept alive by a client,
 * and a listener that a flood of connection requests aims at.
 *
 *   target server ADDR PORT INFO [-c N] [-t S]
 *   target client ADDR PORT [-c N] [-t S]
 *   target listen ADDR PORT [-t S]
 *   target connect ADDR PORT [-t S]
 *
 * server: registers five regions in the listening device's PD, each in a
 * mapping of its own with a guard page (PROT_NONE) at either end and 512-byte
 * canaries between the guard pages and the region:
 *   w        remote write and read       ro       remote read only
 *   local    no remote access            otherpd  remote write, in a second PD
 *   gone     remote write, deregistered before any connection
 * writes INFO ("region NAME stag=S addr=A len=L" per region, then "conn I
 * local=PORT peer=PORT" per connection, then "ready"), accepts N connections,
 * and takes the client's Sends until SIGTERM. Then it prints, per connection,
 * "conn I recvs=R state=alive|error|disconnected" (what ended it first: an
 * error completion, or DISCONNECTED) and, per region, "region
 * NAME changed=C first=F last=L" (bytes that differ from what it wrote, F/L
 * their offsets, -1 with none) and "canary NAME changed=C": nothing but an
 * RDMA Write may change a region, and no one writes into the canaries. A
 * placement into a guard page ends the process (SIGSEGV): no report.
 * client: connects N connections, prints "conn I local=PORT" for each, sends
 * two 64-byte Sends on each and then nothing but one more on each live
 * connection for every SIGUSR1, until SIGTERM; prints "target: quiet" after
 * the first two and "conn I sends=S
 * state=alive|error" at the end. The quiet is for the hostile tool: a forged
 * datagram takes the PSN that the real sender's next one would take, which
 * the receiver then drops as a duplicate, so while the client sends nothing
 * the forgeries collide with nothing.
 * listen: accepts one connection whose private data is "target" and rejects
 * every other request; prints "listen: rejected R accepted 1" when that one
 * connection has exchanged a Send. connect: that one connection.
 * Every failure prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 64
#define MSG 64
#define RECVS 8
#define CANARY 512
#define REGION_LEN 8192
#define PAGE 4096
#define PDATA "target"

enum state { ALIVE, ERROR, DISCONNECTED };
static const char *state_name[] = { "alive", "error", "disconnected" };

struct region {
	const char *name;
	uint8_t *map, *p;	/* the mapping; the region inside it */
	size_t inner;		/* canary + region + canary (+ slack to a page) */
	struct ibv_mr *mr;
	uint32_t stag;
};

struct conn {
	struct rdma_cm_id *id;
	enum state state;
	uint64_t count;		/* receives (server) or sends (client) */
	uint8_t *buf;		/* RECVS receive slots, or one send slot */
	struct ibv_mr *mr;
};

static volatile sig_atomic_t stop, more;
static time_t deadline;
static struct conn conns[MAX_CONNS];
static unsigned nconns = 1;

static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	exit(1);
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		more = 1;
	else
		stop = 1;
}

static void check_time(const char *what)
{
	if (time(NULL) > deadline)
		fail("timed out %s", what);
}

/* Below 0x80: the hostile tool writes 0xee, so every byte it places shows as changed. */
static uint8_t pattern(const struct region *r, size_t at)
{
	return (uint8_t)(at * 131 + r->name[0] * 7 + r->name[1]) & 0x7f;
}

/* A region fenced by canaries and guard pages, filled with its pattern. */
static void region_map(struct region *r)
{
	size_t i, pages;

	r->inner = CANARY + REGION_LEN + CANARY;
	pages = (r->inner + PAGE - 1) / PAGE;
	r->inner = pages * PAGE;
	r->map = mmap(NULL, (pages + 2) * PAGE, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->map == MAP_FAILED)
		fail("mmap: %s", strerror(errno));
	if (mprotect(r->map, PAGE, PROT_NONE) ||
	    mprotect(r->map + (pages + 1) * PAGE, PAGE, PROT_NONE))
		fail("mprotect: %s", strerror(errno));
	r->map += PAGE;
	r->p = r->map + CANARY;
	for (i = 0; i < r->inner; i++)
		r->map[i] = pattern(r, i);
}

/* "region|canary NAME changed=C first=F last=L" for the bytes of [from, to). */
static void report(const struct region *r, const char *what, size_t from, size_t to,
		   size_t base)
{
	long first = -1, last = -1;
	size_t i, changed = 0;

	for (i = from; i < to; i++) {
		if (r->map[i] == pattern(r, i))
			continue;
		changed++;
		if (first < 0)
			first = (long)(i - base);
		last = (long)(i - base);
	}
	printf("%s %s changed=%zu first=%ld last=%ld\n", what, r->name, changed, first, last);
}

static struct rdma_addrinfo *resolve(const char *addr, const char *port, int passive)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *ai;

	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(addr, port, &hints, &ai))
		fail("rdma_getaddrinfo %s:%s: %s", addr, port, strerror(errno));
	return ai;
}

static struct ibv_cq *cq;
static struct ibv_pd *pd;

static void make_qp(struct conn *c, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qpa = {
		.cap = { .max_send_wr = 16, .max_recv_wr = RECVS + 2,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.send_cq = cq, .recv_cq = cq,
	};

	c->id = id;
	if (rdma_create_qp(id, pd, &qpa))
		fail("rdma_create_qp: %s", strerror(errno));
	c->buf = calloc(RECVS, MSG);
	if (!c->buf)
		fail("out of memory");
	c->mr = ibv_reg_mr(pd, c->buf, RECVS * MSG, IBV_ACCESS_LOCAL_WRITE);
	if (!c->mr)
		fail("ibv_reg_mr: %s", strerror(errno));
}

static void post_recv(struct conn *c, unsigned slot)
{
	struct ibv_sge sge = { (uintptr_t)(c->buf + slot * MSG), MSG, c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)(c - conns) << 8 | slot,
				  .sg_list = &sge, .num_sge = 1 }, *bad;
	int ret = ibv_post_recv(c->id->qp, &wr, &bad);

	/* A QP the peer (or an attacker) put in error refuses it. */
	if (ret && c->state == ALIVE)
		c->state = ERROR;
}

static int post_send(struct conn *c)
{
	struct ibv_sge sge = { (uintptr_t)c->buf, MSG, c->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = (uint64_t)(c - conns) << 8, .sg_list = &sge,
				  .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	return ibv_post_send(c->id->qp, &wr, &bad);
}

/* Takes completions: a receive is counted and posted again, an error marks its
 * connection. */
static void drain_cq(int server)
{
	struct ibv_wc wc[16];
	int n, i;

	while ((n = ibv_poll_cq(cq, 16, wc)) > 0) {
		for (i = 0; i < n; i++) {
			struct conn *c = &conns[(wc[i].wr_id >> 8) % MAX_CONNS];

			if (wc[i].status != IBV_WC_SUCCESS) {
				if (c->state == ALIVE)
					c->state = ERROR;
				continue;
			}
			c->count++;
			if (server)
				post_recv(c, wc[i].wr_id & 0xff);
		}
	}
	if (n < 0)
		fail("ibv_poll_cq: %d", n);
}

/* Handles what the CM reports about established connections. */
static void drain_cm(struct rdma_event_channel *ch, int server)
{
	struct rdma_cm_event *ev;
	unsigned i;

	while (!rdma_get_cm_event(ch, &ev)) {
		/* The completions that came before the event are taken first: the CQ and
		 * the event channel are read in turn, and an error completion that was
		 * already due must not lose to an event read a moment later. */
		drain_cq(server);
		for (i = 0; i < nconns; i++) {
			if (conns[i].id != ev->id)
				continue;
			/* what ended the connection first: an error completion or this */
			if (conns[i].state == ALIVE)
				conns[i].state = ev->event == RDMA_CM_EVENT_DISCONNECTED ?
							 DISCONNECTED : ERROR;
		}
		rdma_ack_cm_event(ev);
	}
}

static void nonblocking(struct rdma_event_channel *ch)
{
	int fl = fcntl(ch->fd, F_GETFL);

	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
}

static struct rdma_cm_event *wait_cm(struct rdma_event_channel *ch, const char *what)
{
	struct rdma_cm_event *ev;

	for (;;) {
		if (!rdma_get_cm_event(ch, &ev))
			return ev;
		if (errno != EAGAIN)
			fail("rdma_get_cm_event (%s): %s", what, strerror(errno));
		check_time(what);
		usleep(10000);
	}
}

static unsigned short port_of(struct sockaddr *sa)
{
	return ntohs(((struct sockaddr_in *)sa)->sin_port);
}

static void serve(const char *addr, const char *port, const char *info)
{
	struct region regions[] = { { "w" }, { "ro" }, { "local" }, { "otherpd" }, { "gone" } };
	int access[] = { IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
			 IBV_ACCESS_REMOTE_READ, IBV_ACCESS_LOCAL_WRITE,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE };
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = resolve(addr, port, 1);
	struct rdma_cm_id *listen_id;
	struct ibv_pd *pd2;
	unsigned i, accepted = 0;
	FILE *f;

	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listen_id, ai->ai_src_addr))
		fail("rdma_bind_addr: %s", strerror(errno));
	if (!listen_id->verbs)
		fail("%s is no RDMA device's address", addr);
	pd = ibv_alloc_pd(listen_id->verbs);
	pd2 = ibv_alloc_pd(listen_id->verbs);
	cq = ibv_create_cq(listen_id->verbs, MAX_CONNS * (RECVS + 2), NULL, NULL, 0);
	if (!pd || !pd2 || !cq)
		fail("ibv_alloc_pd/ibv_create_cq: %s", strerror(errno));
	for (i = 0; i < 5; i++) {
		struct region *r = &regions[i];

		region_map(r);
		r->mr = ibv_reg_mr(i == 3 ? pd2 : pd, r->p, REGION_LEN, access[i]);
		if (!r->mr)
			fail("ibv_reg_mr %s: %s", r->name, strerror(errno));
		r->stag = r->mr->rkey;
	}
	if (ibv_dereg_mr(regions[4].mr))
		fail("ibv_dereg_mr: %s", strerror(errno));
	regions[4].mr = NULL;
	if (rdma_listen(listen_id, 8))
		fail("rdma_listen: %s", strerror(errno));
	nonblocking(ch);
	printf("target: listening on %s:%s\n", addr, port);
	fflush(stdout);
	while (accepted < nconns) {
		struct rdma_cm_event *ev = wait_cm(ch, "for connections");
		struct conn *c = &conns[accepted];
		struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };

		if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {
			accepted++;
			rdma_ack_cm_event(ev);
			continue;
		}
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
			fail("rdma_cm event %s while accepting", rdma_event_str(ev->event));
		make_qp(c, ev->id);
		for (i = 0; i < RECVS; i++)
			post_recv(c, i);
		if (rdma_accept(ev->id, &cp))
			fail("rdma_accept: %s", strerror(errno));
		rdma_ack_cm_event(ev);
	}
	f = fopen(info, "w");
	if (!f)
		fail("%s: %s", info, strerror(errno));
	for (i = 0; i < 5; i++)
		fprintf(f, "region %s stag=%#x addr=%#" PRIx64 " len=%d\n", regions[i].name,
			regions[i].stag, (uint64_t)(uintptr_t)regions[i].p, REGION_LEN);
	for (i = 0; i < nconns; i++)
		fprintf(f, "conn %u local=%u peer=%u\n", i,
			port_of(rdma_get_local_addr(conns[i].id)),
			port_of(rdma_get_peer_addr(conns[i].id)));
	fprintf(f, "ready\n");
	fclose(f);
	while (!stop) {
		drain_cq(1);
		drain_cm(ch, 1);
		check_time("(no SIGTERM)");
		usleep(10000);
	}
	drain_cq(1);
	drain_cm(ch, 1);
	for (i = 0; i < nconns; i++)
		printf("conn %u recvs=%" PRIu64 " state=%s\n", i, conns[i].count,
		       state_name[conns[i].state]);
	for (i = 0; i < 5; i++) {
		struct region *r = &regions[i];

		report(r, "region", CANARY, CANARY + REGION_LEN, CANARY);
		report(r, "canary", 0, CANARY, CANARY);
		report(r, "canary", CANARY + REGION_LEN, r->inner, CANARY);
	}
	printf("target: server done\n");
}

static void connect_one(struct rdma_event_channel *ch, struct rdma_addrinfo *ai, struct conn *c,
			const char *pdata)
{
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7 };

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 5000))
		fail("rdma_resolve_addr: %s", strerror(errno));
	ev = wait_cm(ch, "for the address");
	if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED)
		fail("rdma_cm event %s, want ADDR_RESOLVED", rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 5000))
		fail("rdma_resolve_route: %s", strerror(errno));
	ev = wait_cm(ch, "for the route");
	if (ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED)
		fail("rdma_cm event %s, want ROUTE_RESOLVED", rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
	if (!pd) {
		pd = ibv_alloc_pd(id->verbs);
		cq = ibv_create_cq(id->verbs, MAX_CONNS * 16, NULL, NULL, 0);
		if (!pd || !cq)
			fail("ibv_alloc_pd/ibv_create_cq: %s", strerror(errno));
	}
	make_qp(c, id);
	cp.private_data = pdata;
	cp.private_data_len = pdata ? strlen(pdata) + 1 : 0;
	if (rdma_connect(id, &cp))
		fail("rdma_connect: %s", strerror(errno));
	ev = wait_cm(ch, "for the connection");
	if (ev->event != RDMA_CM_EVENT_ESTABLISHED)
		fail("rdma_cm event %s (status %d), want ESTABLISHED", rdma_event_str(ev->event),
		     ev->status);
	rdma_ack_cm_event(ev);
}

/* One Send on each live connection, and its completion (or the connection's end). */
static void send_round(struct rdma_event_channel *ch)
{
	uint64_t before[MAX_CONNS];
	unsigned i, waiting;

	for (i = 0; i < nconns; i++) {
		before[i] = conns[i].count;
		if (conns[i].state == ALIVE && post_send(&conns[i]))
			conns[i].state = ERROR;
	}
	for (;;) {
		drain_cq(0);
		drain_cm(ch, 0);
		for (waiting = 0, i = 0; i < nconns; i++)
			waiting += conns[i].state == ALIVE && conns[i].count == before[i];
		if (!waiting || stop)
			break;
		check_time("for Send completions");
		usleep(10000);
	}
}

static void client(const char *addr, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = resolve(addr, port, 0);
	uint64_t rounds = 0;
	unsigned i;

	if (!ch)
		fail("rdma_create_event_channel: %s", strerror(errno));
	nonblocking(ch);
	for (i = 0; i < nconns; i++) {
		connect_one(ch, ai, &conns[i], NULL);
		printf("conn %u local=%u\n", i, port_of(rdma_get_local_addr(conns[i].id)));
	}
	while (!stop) {
		if (rounds < 2 || more) {
			more = 0;
			send_round(ch);
			if (++rounds == 2)
				printf("target: quiet\n");
		}
		drain_cq(0);
		drain_cm(ch, 0);
		check_time("(no SIGTERM)");
		usleep(10000);
	}
	drain_cq(0);
	for (i = 0; i < nconns; i++)
		printf("conn %u sends=%" PRIu64 " state=%s\n", i, conns[i].count,
		       state_name[conns[i].state]);
	printf("target: client done\n");
}

/* One good connection among any number of requests without our private data. */
static void listen_one(const char *addr, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = resolve(addr, port, 1);
	struct rdma_cm_id *listen_id;
	struct conn *c = &conns[0];
	uint64_t rejected = 0;
	int established = 0;

	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listen_id, ai->ai_src_addr) || !listen_id->verbs)
		fail("rdma_bind_addr: %s", strerror(errno));
	pd = ibv_alloc_pd(listen_id->verbs);
	cq = ibv_create_cq(listen_id->verbs, 16, NULL, NULL, 0);
	if (!pd || !cq)
		fail("ibv_alloc_pd/ibv_create_cq: %s", strerror(errno));
	if (rdma_listen(listen_id, 64))
		fail("rdma_listen: %s", strerror(errno));
	nonblocking(ch);
	printf("target: listening on %s:%s\n", addr, port);
	fflush(stdout);
	while (!established || !c->count) {
		struct rdma_cm_event *ev;

		drain_cq(1);
		if (rdma_get_cm_event(ch, &ev)) {
			if (errno != EAGAIN)
				fail("rdma_get_cm_event: %s", strerror(errno));
			check_time("for the good connection");
			usleep(10000);
			continue;
		}
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			const struct rdma_conn_param *p = &ev->param.conn;
			int good = !c->id && p->private_data_len >= sizeof(PDATA) &&
				   !memcmp(p->private_data, PDATA, sizeof(PDATA));

			if (good) {
				struct rdma_conn_param cp = { .responder_resources = 1,
							      .initiator_depth = 1 };
				unsigned i;

				make_qp(c, ev->id);
				for (i = 0; i < RECVS; i++)
					post_recv(c, i);
				if (rdma_accept(ev->id, &cp))
					fail("rdma_accept: %s", strerror(errno));
			} else {
				struct rdma_cm_id *id = ev->id;

				rejected++;
				rdma_reject(id, NULL, 0);
				rdma_ack_cm_event(ev);
				rdma_destroy_id(id);
				continue;
			}
		} else if (ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == c->id) {
			established = 1;
		}
		rdma_ack_cm_event(ev);
	}
	printf("listen: rejected %" PRIu64 " accepted 1\n", rejected);
}

static void connect_good(const char *addr, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = resolve(addr, port, 0);
	struct ibv_wc wc;
	int n;

	if (!ch)
		fail("rdma_create_event_channel: %s", strerror(errno));
	nonblocking(ch);
	connect_one(ch, ai, &conns[0], PDATA);
	if (post_send(&conns[0]))
		fail("ibv_post_send");
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
		check_time("for the Send's completion");
		usleep(10000);
	}
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		fail("the Send completed with %s", n < 0 ? "a poll error" : ibv_wc_status_str(wc.status));
	printf("target: connected and sent\n");
}

int main(int argc, char **argv)
{
	unsigned seconds = 600;
	const char *info = NULL;
	int o, first = 4;

	if (argc < 4)
		goto usage;
	if (!strcmp(argv[1], "server")) {
		if (argc < 5)
			goto usage;
		info = argv[4];
		first = 5;
	}
	optind = first;
	while ((o = getopt(argc, argv, "c:t:")) != -1) {
		switch (o) {
		case 'c': nconns = atoi(optarg); break;
		case 't': seconds = atoi(optarg); break;
		default: goto usage;
		}
	}
	if (nconns < 1 || nconns > MAX_CONNS || optind != argc)
		goto usage;
	deadline = time(NULL) + seconds;
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGUSR1, on_signal);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "server"))
		serve(argv[2], argv[3], info);
	else if (!strcmp(argv[1], "client"))
		client(argv[2], argv[3]);
	else if (!strcmp(argv[1], "listen"))
		listen_one(argv[2], argv[3]);
	else if (!strcmp(argv[1], "connect"))
		connect_good(argv[2], argv[3]);
	else
		goto usage;
	return 0;
usage:
	fprintf(stderr, "usage: target server ADDR PORT INFO [-c N] [-t S] | client ADDR PORT [-c N] [-t S] | listen ADDR PORT [-t S] | connect ADDR PORT [-t S]\n");
	return 2;
}
