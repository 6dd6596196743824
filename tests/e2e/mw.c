// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Memory windows of both types (tests/vm/67-e2e-mw.sh).
 *
 *   mw server ADDR PORT [-c N] [-t S]
 *   mw client ADDR PORT [-m ok|oldkey|outside|readonly] [-t S]
 *
 * server: registers a 4 KiB buffer of zeros with local write, remote read and
 * the bind right only (no remote write: the MR's own STag cannot be written),
 * allocates a type 1 window, and serves N connections (1) one after another.
 * For each it binds the type 1 window with ibv_bind_mw over bytes 1024..1536
 * (remote read and write; a new key each time) and a type 2 window of its own
 * with IBV_WR_BIND_MW over 2048..2560 (remote write only), and sends
 * struct keys. Then it waits for a message or for the connection to fail:
 *   "one" (Send with Invalidate of the type 2 window): the receive must say
 *     so; the buffer must hold the client's pattern in both windows. The
 *     server then checks that ibv_dereg_mr of the MR fails with EBUSY,
 *     rebinds the type 1 window over 1536..1792, binds the type 2 window again
 *     (it is free) over 2560..2816, invalidates it with IBV_WR_LOCAL_INV,
 *     binds it once more, and sends the new keys.
 *   "two": both new windows must hold the pattern.
 * Every bind and invalidation must complete successfully, in order. After the
 * N connections, the bytes outside the windows must still be zero; the MR is
 * deregistered once the windows are gone. Prints "mw: server ok conns=N".
 * client, by -m:
 *   ok        writes a pattern through both windows, reads the type 1 window
 *             back, sends "one" with Invalidate; through the new keys
 *             writes again and sends "two"; then writes through the
 *             invalidated key, which must fail with IBV_WC_REM_ACCESS_ERR.
 *   oldkey    writes through the type 1 window's key before this bind:
 *             IBV_WC_REM_ACCESS_ERR.
 *   outside   writes one byte past the type 1 window: IBV_WC_REM_ACCESS_ERR.
 *   readonly  reads the type 2 window, bound for remote write only:
 *             IBV_WC_REM_ACCESS_ERR.
 * Every failure prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "e2e.h"

#define BUF 4096
#define MSG 64

/* Where the windows are, in the server's buffer. */
#define W1 1024
#define W1_LEN 512
#define W2 2048
#define W2_LEN 512
#define W1B 1536
#define W1B_LEN 256
#define W2B 2560
#define W2B_LEN 256

/* Both ends are this program on hosts of one byte order. */
struct keys {
	uint64_t base;
	uint32_t rkey1, rkey2;
};

struct conn {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *msg;		/* MSG bytes to receive, MSG to send, BUF of data */
};

/*
 * Completions polled while waiting for another: a receive and the send
 * whose acknowledgement came with it may complete in either order.
 */
static struct ibv_wc stash[16];
static int stashed;

/* The completion of wr_id, whatever its status. */
static struct ibv_wc take(struct ibv_cq *cq, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (int i = 0; i < stashed; i++) {
		if (stash[i].wr_id == wr_id) {
			wc = stash[i];
			stash[i] = stash[--stashed];
			return wc;
		}
	}
	for (;;) {
		while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
			check_time("waiting for a completion");
		if (n < 0)
			fail("ibv_poll_cq: %d", n);
		if (wc.wr_id == wr_id)
			return wc;
		if (stashed == 16)
			fail("more than 16 completions before %" PRIu64, wr_id);
		stash[stashed++] = wc;
	}
}

/* Forgets a connection's completions left over. */
static void drain(struct ibv_cq *cq)
{
	struct ibv_wc wc;

	while (ibv_poll_cq(cq, 1, &wc) > 0)
		;
	stashed = 0;
}

static struct ibv_wc wc_ok(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc = take(cq, wr_id);

	if (wc.status != IBV_WC_SUCCESS)
		fail("completion %" PRIu64 ": %s", wc.wr_id, ibv_wc_status_str(wc.status));
	if (wc.wr_id != wr_id || wc.opcode != op)
		fail("completion %" PRIu64 " opcode %d, expected %" PRIu64 " opcode %d",
		     wc.wr_id, wc.opcode, wr_id, op);
	return wc;
}

static void post(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	int rc = ibv_post_send(qp, wr, &bad);

	if (rc)
		fail("ibv_post_send (opcode %d): %s", wr->opcode, strerror(rc));
}

static void post_recv(struct conn *c)
{
	struct ibv_sge sge = { (uintptr_t)c->msg, MSG, c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 100, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(c->id->qp, &wr, &bad))
		fail("ibv_post_recv");
}

/* Sends MSG bytes from the message area; invalidates `inv` when non-zero. */
static void send_msg(struct conn *c, const void *data, size_t len, uint32_t inv, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)c->msg + MSG, MSG, c->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
		.opcode = inv ? IBV_WR_SEND_WITH_INV : IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};

	memset(c->msg + MSG, 0, MSG);
	memcpy(c->msg + MSG, data, len);
	wr.invalidate_rkey = inv;
	post(c->id->qp, &wr);
	wc_ok(c->cq, wr_id, IBV_WC_SEND);
}

static uint8_t pattern(size_t i, int round)
{
	return (uint8_t)(i * 7 + round * 31 + 1);
}

/* ---- server ---- */

static uint8_t *buf;
static struct ibv_mr *bufmr;
static struct ibv_mw *mw1;

static void bind2(struct conn *c, struct ibv_mw *mw, uint32_t rkey, size_t off, size_t len,
		  uint64_t wr_id)
{
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED,
	};

	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){
		.mr = bufmr, .addr = (uintptr_t)buf + off, .length = len,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	post(c->id->qp, &wr);
	wc_ok(c->cq, wr_id, IBV_WC_BIND_MW);
}

static void bind1(struct conn *c, size_t off, size_t len, uint64_t wr_id)
{
	struct ibv_mw_bind b = {
		.wr_id = wr_id, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = {
			.mr = bufmr, .addr = (uintptr_t)buf + off, .length = len,
			.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
		},
	};
	uint32_t before = mw1->rkey;
	int rc = ibv_bind_mw(c->id->qp, mw1, &b);

	if (rc)
		fail("ibv_bind_mw: %s", strerror(rc));
	if (mw1->rkey != ibv_inc_rkey(before))
		fail("type 1 window's key %#x after a bind from %#x", mw1->rkey, before);
	wc_ok(c->cq, wr_id, IBV_WC_BIND_MW);
}

static void check_pattern(size_t off, size_t len, int round, const char *what)
{
	for (size_t i = 0; i < len; i++)
		if (buf[off + i] != pattern(i, round))
			fail("%s: byte %zu is %u, expected %u", what, i, buf[off + i],
			     pattern(i, round));
}

/* Waits for the client's message; 0 when the connection failed instead. */
static int wait_msg(struct conn *c, const char *want, uint32_t invalidated)
{
	struct ibv_wc wc = take(c->cq, 100);

	if (wc.status == IBV_WC_WR_FLUSH_ERR)
		return 0;
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
		fail("server receive: %s opcode %d", ibv_wc_status_str(wc.status), wc.opcode);
	if (strcmp((char *)c->msg, want))
		fail("message '%.*s', expected '%s'", MSG, c->msg, want);
	if (invalidated && (!(wc.wc_flags & IBV_WC_WITH_INV) || wc.invalidated_rkey != invalidated))
		fail("'%s' did not say it invalidated %#x (flags %#x, rkey %#x)", want,
		     invalidated, wc.wc_flags, wc.invalidated_rkey);
	return 1;
}

static void serve(struct conn *c, int round)
{
	struct ibv_mw *mw2 = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
	struct keys k = { .base = (uintptr_t)buf };
	uint32_t r2;

	if (!mw2)
		fail("ibv_alloc_mw type 2: %s", strerror(errno));
	post_recv(c);
	bind1(c, W1, W1_LEN, 1);
	r2 = ibv_inc_rkey(mw2->rkey);
	bind2(c, mw2, r2, W2, W2_LEN, 2);
	k.rkey1 = mw1->rkey;
	k.rkey2 = r2;
	send_msg(c, &k, sizeof(k), 0, 3);
	if (!wait_msg(c, "one", r2))
		goto out;
	check_pattern(W1, W1_LEN, round, "type 1 window");
	check_pattern(W2, W2_LEN, round, "type 2 window");
	if (ibv_dereg_mr(bufmr) != EBUSY)
		fail("ibv_dereg_mr of an MR with a window bound: not EBUSY");
	post_recv(c);
	bind1(c, W1B, W1B_LEN, 4);
	bind2(c, mw2, ibv_inc_rkey(r2), W2B, W2B_LEN, 5);
	{
		struct ibv_send_wr inv = {
			.wr_id = 6, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED,
		};

		inv.invalidate_rkey = ibv_inc_rkey(r2);
		post(c->id->qp, &inv);
		wc_ok(c->cq, 6, IBV_WC_LOCAL_INV);
	}
	r2 = ibv_inc_rkey(ibv_inc_rkey(r2));
	bind2(c, mw2, r2, W2B, W2B_LEN, 7);
	k.rkey1 = mw1->rkey;
	k.rkey2 = r2;
	send_msg(c, &k, sizeof(k), 0, 8);
	if (!wait_msg(c, "two", 0))
		goto out;
	check_pattern(W1B, W1B_LEN, round + 1, "type 1 window, rebound");
	check_pattern(W2B, W2B_LEN, round + 1, "type 2 window, bound again");
	/* The client's write through the invalidated key fails the connection. */
	post_recv(c);
	if (wait_msg(c, "", 0))
		fail("a message after 'two'");
out:
	if (ibv_dealloc_mw(mw2))
		fail("ibv_dealloc_mw: %s", strerror(errno));
}

static int run_server(const char *addr, const char *port, int conns)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_addrinfo *ai = resolve(addr, port, 1);
	struct rdma_cm_id *listener;
	struct conn c = { 0 };
	int served = 0;

	if (!ch || rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listener, ai->ai_src_addr) || rdma_listen(listener, 1))
		fail("bind/listen %s:%s: %s", addr, port, strerror(errno));
	if (posix_memalign((void **)&buf, 4096, BUF) || posix_memalign((void **)&c.msg, 64, 2 * MSG))
		fail("posix_memalign");
	memset(buf, 0, BUF);
	printf("mw: listening\n");
	fflush(stdout);
	while (served < conns) {
		struct rdma_cm_event *ev = next_event(ch);
		struct ibv_qp_init_attr qa = {
			.cap = { .max_send_wr = 8, .max_recv_wr = 2,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
		};
		struct rdma_conn_param cp = { .responder_resources = 4, .initiator_depth = 4 };

		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
			fail("server: %s, expected a connect request", rdma_event_str(ev->event));
		c.id = ev->id;
		rdma_ack_cm_event(ev);
		if (!c.pd) {
			c.pd = ibv_alloc_pd(c.id->verbs);
			c.cq = c.pd ? ibv_create_cq(c.id->verbs, 16, NULL, NULL, 0) : NULL;
			c.mr = c.cq ? ibv_reg_mr(c.pd, c.msg, 2 * MSG, IBV_ACCESS_LOCAL_WRITE) : NULL;
			bufmr = c.mr ? ibv_reg_mr(c.pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE |
						  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND) : NULL;
			mw1 = bufmr ? ibv_alloc_mw(c.pd, IBV_MW_TYPE_1) : NULL;
			if (!mw1)
				fail("pd/cq/mr/mw: %s", strerror(errno));
		}
		qa.send_cq = c.cq;
		qa.recv_cq = c.cq;
		if (rdma_create_qp(c.id, c.pd, &qa))
			fail("rdma_create_qp: %s", strerror(errno));
		if (rdma_accept(c.id, &cp))
			fail("rdma_accept: %s", strerror(errno));
		expect_event(ch, RDMA_CM_EVENT_ESTABLISHED);
		serve(&c, served * 2);
		expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
		rdma_disconnect(c.id);
		rdma_destroy_qp(c.id);
		rdma_destroy_id(c.id);
		drain(c.cq);
		served++;
	}
	for (size_t i = 0; i < BUF; i++) {
		int in1 = (i >= W1 && i < W1 + W1_LEN) || (i >= W1B && i < W1B + W1B_LEN);
		int in2 = (i >= W2 && i < W2 + W2_LEN) || (i >= W2B && i < W2B + W2B_LEN);

		if (!in1 && !in2 && buf[i])
			fail("byte %zu outside every window was written", i);
	}
	if (ibv_dealloc_mw(mw1) || ibv_dereg_mr(bufmr) || ibv_dereg_mr(c.mr))
		fail("dealloc/dereg: %s", strerror(errno));
	ibv_destroy_cq(c.cq);
	ibv_dealloc_pd(c.pd);
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(ch);
	rdma_freeaddrinfo(ai);
	printf("mw: server ok conns=%d\n", served);
	return 0;
}

/* ---- client ---- */

static void connect_to(struct conn *c, const char *addr, const char *port)
{
	struct rdma_addrinfo *ai = resolve(addr, port, 0);
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 8, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param cp = { .responder_resources = 4, .initiator_depth = 4 };

	memset(c, 0, sizeof(*c));
	if (posix_memalign((void **)&c->msg, 64, 2 * MSG + BUF))
		fail("posix_memalign");
	c->ch = rdma_create_event_channel();
	if (!c->ch || rdma_create_id(c->ch, &c->id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_resolve_addr(c->id, NULL, ai->ai_dst_addr, 5000))
		fail("rdma_resolve_addr: %s", strerror(errno));
	expect_event(c->ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(c->id, 5000))
		fail("rdma_resolve_route: %s", strerror(errno));
	expect_event(c->ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->cq = c->pd ? ibv_create_cq(c->id->verbs, 16, NULL, NULL, 0) : NULL;
	c->mr = c->cq ? ibv_reg_mr(c->pd, c->msg, 2 * MSG + BUF, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!c->mr)
		fail("pd/cq/mr: %s", strerror(errno));
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	if (rdma_create_qp(c->id, c->pd, &qa))
		fail("rdma_create_qp: %s", strerror(errno));
	post_recv(c);
	if (rdma_connect(c->id, &cp))
		fail("rdma_connect: %s", strerror(errno));
	expect_event(c->ch, RDMA_CM_EVENT_ESTABLISHED);
	rdma_freeaddrinfo(ai);
}

static struct keys recv_keys(struct conn *c)
{
	struct keys k;

	wc_ok(c->cq, 100, IBV_WC_RECV);
	memcpy(&k, c->msg, sizeof(k));
	post_recv(c);
	return k;
}

/* An RDMA Write (or Read) of len bytes of the data area to base + off under rkey. */
static struct ibv_wc rdma(struct conn *c, enum ibv_wr_opcode op, uint64_t addr, uint32_t rkey,
			  size_t len, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)c->msg + 2 * MSG, (uint32_t)len, c->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	};

	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	post(c->id->qp, &wr);
	return take(c->cq, wr_id);
}

static void write_ok(struct conn *c, uint64_t addr, uint32_t rkey, size_t len, int round)
{
	struct ibv_wc wc;

	for (size_t i = 0; i < len; i++)
		c->msg[2 * MSG + i] = pattern(i, round);
	wc = rdma(c, IBV_WR_RDMA_WRITE, addr, rkey, len, 10);
	if (wc.status != IBV_WC_SUCCESS)
		fail("write through %#x: %s", rkey, ibv_wc_status_str(wc.status));
}

static void refused(struct conn *c, enum ibv_wr_opcode op, uint64_t addr, uint32_t rkey,
		    size_t len, const char *what)
{
	struct ibv_wc wc = rdma(c, op, addr, rkey, len, 20);

	if (wc.status != IBV_WC_REM_ACCESS_ERR)
		fail("%s: %s, expected %s", what, ibv_wc_status_str(wc.status),
		     ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
	printf("mw: %s refused\n", what);
}

static int run_client(const char *addr, const char *port, const char *mode)
{
	struct conn c;
	struct keys k;
	struct ibv_wc wc;
	int round = 0;

	connect_to(&c, addr, port);
	k = recv_keys(&c);
	if (!strcmp(mode, "oldkey")) {
		refused(&c, IBV_WR_RDMA_WRITE, k.base + W1, (k.rkey1 & ~0xffu) |
			((k.rkey1 - 1) & 0xff), 8, "a write under the type 1 window's previous key");
	} else if (!strcmp(mode, "outside")) {
		refused(&c, IBV_WR_RDMA_WRITE, k.base + W1 + W1_LEN - 4, k.rkey1, 8,
			"a write across the type 1 window's end");
	} else if (!strcmp(mode, "readonly")) {
		refused(&c, IBV_WR_RDMA_READ, k.base + W2, k.rkey2, 8,
			"a read of the write-only type 2 window");
	} else if (!strcmp(mode, "ok")) {
		/* The server numbers its rounds by connection: this one's is its first. */
		write_ok(&c, k.base + W1, k.rkey1, W1_LEN, round);
		write_ok(&c, k.base + W2, k.rkey2, W2_LEN, round);
		memset(c.msg + 2 * MSG, 0, W1_LEN);
		wc = rdma(&c, IBV_WR_RDMA_READ, k.base + W1, k.rkey1, W1_LEN, 11);
		if (wc.status != IBV_WC_SUCCESS)
			fail("read through the type 1 window: %s", ibv_wc_status_str(wc.status));
		for (size_t i = 0; i < W1_LEN; i++)
			if (c.msg[2 * MSG + i] != pattern(i, round))
				fail("read back byte %zu: %u", i, c.msg[2 * MSG + i]);
		send_msg(&c, "one", 4, k.rkey2, 12);
		uint32_t old2 = k.rkey2;

		k = recv_keys(&c);
		write_ok(&c, k.base + W1B, k.rkey1, W1B_LEN, round + 1);
		write_ok(&c, k.base + W2B, k.rkey2, W2B_LEN, round + 1);
		send_msg(&c, "two", 4, 0, 13);
		refused(&c, IBV_WR_RDMA_WRITE, k.base + W2, old2, 8,
			"a write under the invalidated type 2 key");
		printf("mw: ok client\n");
	} else {
		fail("unknown mode %s", mode);
	}
	rdma_disconnect(c.id);
	expect_event(c.ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(c.id);
	ibv_dereg_mr(c.mr);
	ibv_destroy_cq(c.cq);
	ibv_dealloc_pd(c.pd);
	rdma_destroy_id(c.id);
	rdma_destroy_event_channel(c.ch);
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = "ok";
	int conns = 1, opt;
	double secs = 120;

	if (argc < 4)
		fail("usage: mw server|client ADDR PORT [-c N] [-m MODE] [-t S]");
	optind = 4;
	while ((opt = getopt(argc, argv, "c:m:t:")) != -1) {
		switch (opt) {
		case 'c':
			conns = atoi(optarg);
			break;
		case 'm':
			mode = optarg;
			break;
		case 't':
			secs = atof(optarg);
			break;
		default:
			fail("bad option");
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	deadline = now() + secs;
	if (!strcmp(argv[1], "server"))
		return run_server(argv[2], argv[3], conns);
	if (!strcmp(argv[1], "client"))
		return run_client(argv[2], argv[3], mode);
	fail("unknown role %s", argv[1]);
	return 1;
}
