// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Remote atomics on one shared counter (tests/vm/64-e2e-atomic.sh).
 *
 *   atomic server ADDR PORT [-c N] [-l LOCAL] [-t S]
 *   atomic client ADDR PORT [-m add|cas|protect] [-n OPS] [-d DEPTH] [-t S]
 *
 * server: registers an 8-byte counter (remote atomic) and a region without
 * remote atomic access, gives both to every client in its Accept's private
 * data, accepts N connections (1) and, while they run, adds 1 to the counter
 * LOCAL times (0) with the CPU's own atomic instruction. It makes no verbs call
 * on the data path: the provider serves the atomics. Once the N connections
 * are gone it prints "atomic: server counter=V" (V the counter's value, which
 * started at 0) and exits 0.
 * client, by -m:
 *   add      OPS Fetch-and-Adds of 1 (100), DEPTH of them outstanding at once
 *            (1); each value found must exceed the one before it (the
 *            responder runs one connection's atomics in order).
 *   cas      OPS increments by Compare-and-Swap: the value is read with a
 *            Fetch-and-Add of 0, then swapped for one more until a swap finds
 *            the value it compared with; prints the swaps that failed.
 *   protect  a Fetch-and-Add on the region without remote atomic access, which
 *            must complete with IBV_WC_REM_ACCESS_ERR, then, on a second
 *            connection, one on the counter's address + 4, which must complete
 *            with IBV_WC_REM_OP_ERR (misaligned); the counter is not touched.
 * add and cas print "atomic: ok client MODE ops=OPS ..." and count OPS
 * increments of the counter. Every failure prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
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
#define DEPTH_MAX 64

/* What the server's Accept carries (network byte order not needed: both ends
 * are this program on hosts of one byte order, as libibverbs' atomics are). */
struct info {
	uint64_t counter_addr;
	uint64_t plain_addr;
	uint32_t counter_rkey;
	uint32_t plain_rkey;
};

/* ---- server ---- */

static volatile uint64_t *counter;
static long local_adds;

static void *local_adder(void *arg)
{
	(void)arg;
	for (long i = 0; i < local_adds; i++) {
		__atomic_fetch_add(counter, 1, __ATOMIC_SEQ_CST);
		if (i % 64 == 63)
			sched_yield();
	}
	return NULL;
}

static int run_server(const char *addr, const char *port, int conns)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = resolve(addr, port, 1);
	struct rdma_cm_id *listener, *ids[MAX_CONNS];
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_mr *cmr = NULL, *pmr = NULL;
	static uint64_t plain[8] __attribute__((aligned(64)));
	pthread_t adder;
	int accepted = 0, gone = 0, i;

	if (!ch || rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listener, ai->ai_src_addr) || rdma_listen(listener, conns))
		fail("bind/listen %s:%s: %s", addr, port, strerror(errno));
	if (posix_memalign((void **)&counter, 4096, 4096))
		fail("posix_memalign");
	memset((void *)counter, 0, 4096);
	printf("atomic: listening\n");
	fflush(stdout);
	while (gone < conns) {
		struct rdma_cm_event *ev = next_event(ch);
		struct rdma_cm_id *id = ev->id;
		enum rdma_cm_event_type type = ev->event;

		if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
			struct ibv_qp_init_attr qa = {
				.cap = { .max_send_wr = 4, .max_recv_wr = 4,
					 .max_send_sge = 1, .max_recv_sge = 1 },
				.qp_type = IBV_QPT_RC,
			};
			struct info info;
			struct rdma_conn_param cp = {
				.responder_resources = 16, .initiator_depth = 16,
				.private_data = &info,
				.private_data_len = sizeof(info),
			};

			if (!pd) {
				pd = ibv_alloc_pd(id->verbs);
				cq = pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
				if (!cq)
					fail("ibv_alloc_pd/create_cq: %s", strerror(errno));
				cmr = ibv_reg_mr(pd, (void *)counter, 4096,
						 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
						 IBV_ACCESS_REMOTE_ATOMIC);
				pmr = ibv_reg_mr(pd, plain, sizeof(plain),
						 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
						 IBV_ACCESS_REMOTE_WRITE);
				if (!cmr || !pmr)
					fail("ibv_reg_mr: %s", strerror(errno));
				if (pthread_create(&adder, NULL, local_adder, NULL))
					fail("pthread_create");
			}
			if (accepted == MAX_CONNS)
				fail("more than %d connections", MAX_CONNS);
			qa.send_cq = cq;
			qa.recv_cq = cq;
			if (rdma_create_qp(id, pd, &qa))
				fail("rdma_create_qp: %s", strerror(errno));
			info = (struct info){
				.counter_addr = (uintptr_t)counter,
				.counter_rkey = cmr->rkey,
				.plain_addr = (uintptr_t)plain,
				.plain_rkey = pmr->rkey,
			};
			ids[accepted++] = id;
			rdma_ack_cm_event(ev);
			if (rdma_accept(id, &cp))
				fail("rdma_accept: %s", strerror(errno));
			continue;
		}
		rdma_ack_cm_event(ev);
		switch (type) {
		case RDMA_CM_EVENT_ESTABLISHED:
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			rdma_disconnect(id);
			gone++;
			break;
		default:
			fail("server: unexpected %s", rdma_event_str(type));
		}
	}
	if (pd)
		pthread_join(adder, NULL);
	printf("atomic: server counter=%" PRIu64 "\n", *counter);
	for (i = 0; i < accepted; i++) {
		rdma_destroy_qp(ids[i]);
		rdma_destroy_id(ids[i]);
	}
	if (pd) {
		ibv_dereg_mr(cmr);
		ibv_dereg_mr(pmr);
		ibv_destroy_cq(cq);
		ibv_dealloc_pd(pd);
	}
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(ch);
	rdma_freeaddrinfo(ai);
	return 0;
}

/* ---- client ---- */

struct conn {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint64_t result[DEPTH_MAX];
	struct info info;
};

static void expect_conn(struct conn *c, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = next_event(c->ch);

	if (ev->event != want)
		fail("%s, expected %s (status %d)", rdma_event_str(ev->event),
		     rdma_event_str(want), ev->status);
	if (want == RDMA_CM_EVENT_ESTABLISHED) {
		if (ev->param.conn.private_data_len < sizeof(c->info))
			fail("private data of %u bytes", ev->param.conn.private_data_len);
		memcpy(&c->info, ev->param.conn.private_data, sizeof(c->info));
	}
	rdma_ack_cm_event(ev);
}

static void connect_to(struct conn *c, const char *addr, const char *port)
{
	struct rdma_addrinfo *ai = resolve(addr, port, 0);
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = DEPTH_MAX, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct rdma_conn_param cp = { .responder_resources = 16, .initiator_depth = 16 };

	memset(c, 0, sizeof(*c));
	c->ch = rdma_create_event_channel();
	if (!c->ch || rdma_create_id(c->ch, &c->id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_resolve_addr(c->id, NULL, ai->ai_dst_addr, 5000))
		fail("rdma_resolve_addr: %s", strerror(errno));
	expect_conn(c, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(c->id, 5000))
		fail("rdma_resolve_route: %s", strerror(errno));
	expect_conn(c, RDMA_CM_EVENT_ROUTE_RESOLVED);
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->cq = c->pd ? ibv_create_cq(c->id->verbs, DEPTH_MAX, NULL, NULL, 0) : NULL;
	c->mr = c->cq ? ibv_reg_mr(c->pd, c->result, sizeof(c->result),
				   IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!c->mr)
		fail("pd/cq/mr: %s", strerror(errno));
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	if (rdma_create_qp(c->id, c->pd, &qa))
		fail("rdma_create_qp: %s", strerror(errno));
	if (rdma_connect(c->id, &cp))
		fail("rdma_connect: %s", strerror(errno));
	expect_conn(c, RDMA_CM_EVENT_ESTABLISHED);
	rdma_freeaddrinfo(ai);
}

static void disconnect(struct conn *c)
{
	rdma_disconnect(c->id);
	expect_conn(c, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(c->id);
	ibv_dereg_mr(c->mr);
	ibv_destroy_cq(c->cq);
	ibv_dealloc_pd(c->pd);
	rdma_destroy_id(c->id);
	rdma_destroy_event_channel(c->ch);
}

static void post_atomic(struct conn *c, int slot, enum ibv_wr_opcode op, uint64_t addr,
			uint32_t rkey, uint64_t compare_add, uint64_t swap)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&c->result[slot], .length = 8, .lkey = c->mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = slot, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	int rc;

	wr.wr.atomic.remote_addr = addr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	rc = ibv_post_send(c->id->qp, &wr, &bad);
	if (rc)
		fail("ibv_post_send: %s", strerror(rc));
}

/* The next completion; its status is the caller's to judge. */
static struct ibv_wc next_wc(struct conn *c)
{
	struct ibv_wc wc;
	int n;

	while ((n = ibv_poll_cq(c->cq, 1, &wc)) == 0)
		check_time("waiting for a completion");
	if (n < 0)
		fail("ibv_poll_cq: %d", n);
	return wc;
}

static struct ibv_wc wc_ok(struct conn *c, enum ibv_wc_opcode op)
{
	struct ibv_wc wc = next_wc(c);

	if (wc.status != IBV_WC_SUCCESS)
		fail("completion %s (wr_id %" PRIu64 ")", ibv_wc_status_str(wc.status), wc.wr_id);
	if (wc.opcode != op || wc.byte_len != 8)
		fail("completion opcode %d byte_len %u, expected %d and 8", wc.opcode, wc.byte_len, op);
	return wc;
}

static void run_add(struct conn *c, long ops, int depth)
{
	long posted = 0, done = 0;
	uint64_t first = 0, prev = 0;

	while (done < ops) {
		while (posted < ops && posted - done < depth) {
			post_atomic(c, posted % depth, IBV_WR_ATOMIC_FETCH_AND_ADD,
				    c->info.counter_addr, c->info.counter_rkey, 1, 0);
			posted++;
		}
		struct ibv_wc wc = wc_ok(c, IBV_WC_FETCH_ADD);
		uint64_t v = c->result[wc.wr_id];

		if (wc.wr_id != (uint64_t)(done % depth))
			fail("completion %" PRIu64 " out of order (expected %ld)", wc.wr_id, done % depth);
		if (done == 0)
			first = v;
		else if (v <= prev)
			fail("Fetch-and-Add %ld found %" PRIu64 " after %" PRIu64, done, v, prev);
		prev = v;
		done++;
	}
	printf("atomic: ok client add ops=%ld depth=%d first=%" PRIu64 " last=%" PRIu64 "\n",
	       ops, depth, first, prev);
}

static void run_cas(struct conn *c, long ops)
{
	long failed = 0;

	for (long i = 0; i < ops; i++) {
		uint64_t seen;

		post_atomic(c, 0, IBV_WR_ATOMIC_FETCH_AND_ADD, c->info.counter_addr,
			    c->info.counter_rkey, 0, 0);
		wc_ok(c, IBV_WC_FETCH_ADD);
		seen = c->result[0];
		for (;;) {
			post_atomic(c, 0, IBV_WR_ATOMIC_CMP_AND_SWP, c->info.counter_addr,
				    c->info.counter_rkey, seen, seen + 1);
			wc_ok(c, IBV_WC_COMP_SWAP);
			if (c->result[0] == seen)
				break;
			failed++;
			seen = c->result[0];
		}
	}
	printf("atomic: ok client cas ops=%ld failed_swaps=%ld\n", ops, failed);
}

static void expect_error(struct conn *c, uint64_t addr, uint32_t rkey, enum ibv_wc_status want,
			 const char *what)
{
	struct ibv_wc wc;

	c->result[0] = 0x5a5a5a5a5a5a5a5aULL;
	post_atomic(c, 0, IBV_WR_ATOMIC_FETCH_AND_ADD, addr, rkey, 1, 0);
	wc = next_wc(c);
	if (wc.status != want)
		fail("%s: %s, expected %s", what, ibv_wc_status_str(wc.status),
		     ibv_wc_status_str(want));
	if (c->result[0] != 0x5a5a5a5a5a5a5a5aULL)
		fail("%s: the result buffer changed", what);
	printf("atomic: %s: %s\n", what, ibv_wc_status_str(wc.status));
}

static void run_protect(const char *addr, const char *port)
{
	struct conn c;

	connect_to(&c, addr, port);
	expect_error(&c, c.info.plain_addr, c.info.plain_rkey, IBV_WC_REM_ACCESS_ERR,
		     "no remote atomic right");
	disconnect(&c);
	connect_to(&c, addr, port);
	expect_error(&c, c.info.counter_addr + 4, c.info.counter_rkey, IBV_WC_REM_OP_ERR,
		     "misaligned");
	disconnect(&c);
	printf("atomic: ok client protect\n");
}

int main(int argc, char **argv)
{
	const char *mode = "add";
	long ops = 100;
	int conns = 1, depth = 1, opt;
	double limit = 120;

	if (argc < 4)
		fail("usage: atomic server|client ADDR PORT [options]");
	optind = 4;
	while ((opt = getopt(argc, argv, "c:l:m:n:d:t:")) != -1) {
		switch (opt) {
		case 'c': conns = atoi(optarg); break;
		case 'l': local_adds = atol(optarg); break;
		case 'm': mode = optarg; break;
		case 'n': ops = atol(optarg); break;
		case 'd': depth = atoi(optarg); break;
		case 't': limit = atof(optarg); break;
		default: fail("unknown option");
		}
	}
	if (conns < 1 || conns > MAX_CONNS || depth < 1 || depth > DEPTH_MAX || ops < 1)
		fail("-c 1..%d, -d 1..%d, -n 1 or more", MAX_CONNS, DEPTH_MAX);
	deadline = now() + limit;
	alarm((unsigned int)limit + 30);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "server"))
		return run_server(argv[2], argv[3], conns);
	if (strcmp(argv[1], "client"))
		fail("usage: atomic server|client ADDR PORT [options]");
	if (!strcmp(mode, "protect")) {
		run_protect(argv[2], argv[3]);
		return 0;
	}
	struct conn c;

	connect_to(&c, argv[2], argv[3]);
	if (!strcmp(mode, "add"))
		run_add(&c, ops, depth);
	else if (!strcmp(mode, "cas"))
		run_cas(&c, ops);
	else
		fail("-m add|cas|protect");
	disconnect(&c);
	return 0;
}
