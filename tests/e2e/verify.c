// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * A data-verifying RDMA workload over librdmacm, for any RDMA device: one or
 * more connections, each running thousands of randomly mixed Sends (some
 * inline, some solicited, some empty), RDMA Writes, Writes with Immediate and
 * RDMA Reads of random sizes and scatter/gather lists, with every byte and
 * every completion checked against what was posted. Inline requests (up to
 * 256 bytes where the device allows) have their buffers overwritten as soon as
 * the post returns, so that a device that read them later delivers the wrong
 * bytes; each connection's line reports how many there were and the QP's
 * max_inline_data.
 *
 *   verify server ADDR PORT [options]
 *   verify client ADDR PORT [options]
 *
 * options (the client's count; both sides must agree on -s and -m, and the
 * server's -n, the most messages it accepts per connection, must not be less
 * than the client's):
 *   -c N  connections (default 1)          -n N  operations per connection (2000)
 *   -b N  operations per batch (16)        -m N  largest message in bytes (65536)
 *   -s N  seed (1)                         -e T  completions through a completion
 *                                                channel, T threads waiting on it
 *   -t S  give up after S seconds (300)    -x    poll with the extended CQ API
 *                                                (ibv_create_cq_ex, ibv_start_poll,
 *                                                ibv_next_poll, ibv_wc_read_*)
 *   -w    post with the extended QP API (ibv_create_qp_ex, ibv_wr_start,
 *         ibv_wr_send/rdma_write/..., ibv_wr_set_sge_list and
 *         ibv_wr_set_inline_data_list, ibv_wr_complete)
 *
 * How it checks:
 * - Sends and Writes with Immediate consume the server's receives in order:
 *   both carry a message number (a Send in a 16-byte header, a Write with
 *   Immediate as its immediate data); the length and the bytes of message k
 *   follow from (seed, connection, k), so the server checks length, contents
 *   and order (order only with one waiting thread).
 * - The client keeps a shadow copy of the server's region: a Write updates
 *   it when posted, and a Read compares what it brings back with it. Within
 *   a batch Reads and Writes touch disjoint blocks (iWARP may place a later
 *   Write before an earlier Read is served); a batch ends with a Send that
 *   the server acknowledges once every receive it consumed is posted again,
 *   which is also the flow control.
 * - Every signalled request must complete exactly once, successfully, in
 *   posting order, with the right opcode and length.
 * Prints one line per connection and "verify: ok ..." at the end; any
 * mismatch prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

#define MAGIC 0x75726476u /* "urdv" */
#define HDR_LEN 16
#define MAX_SGE 4
#define MAX_BATCH 64

enum msg_type { MSG_DATA = 1, MSG_BATCH_END = 2, MSG_DONE = 3, MSG_ACK = 4 };
enum op { OP_SEND, OP_WRITE, OP_WRITE_IMM, OP_READ, OP_KINDS };

struct hdr {
	uint32_t magic, type, seq, len;
};

struct connect_pdata {
	uint32_t magic, index;
};

struct accept_pdata {
	uint64_t addr;
	uint32_t rkey, len;
};

static unsigned conns = 1, ops = 2000, batch = 16, maxsize = 65536, seed = 1;
static unsigned ev_threads, time_limit = 300;
static int use_cq_ex;	/* -x */
static int use_wr_api;	/* -w */
static time_t deadline;

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

/* xorshift64*: both ends derive the same message lengths and bytes. */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1DULL;
}

static uint64_t stream(unsigned conn, unsigned kind, uint64_t k)
{
	uint64_t s = ((uint64_t)seed << 40) ^ ((uint64_t)conn << 32) ^
		     ((uint64_t)kind << 28) ^ k ^ 0x9E3779B97F4A7C15ULL;
	int i;

	for (i = 0; i < 4; i++)
		rnd(&s);
	return s ? s : 1;
}

static void fill(uint8_t *p, size_t n, uint64_t s)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (i % 8 == 0)
			rnd(&s);
		p[i] = (uint8_t)(s >> (8 * (i % 8)));
	}
}

/* A size between 0 and max, mostly small, sometimes a whole message. */
static unsigned pick_len(uint64_t *s, unsigned min, unsigned max)
{
	unsigned r = rnd(s) % 100, len;

	if (r < 45)
		len = rnd(s) % 257;
	else if (r < 75)
		len = rnd(s) % 4097;
	else if (r < 90)
		len = rnd(s) % (max + 1);
	else
		len = max;
	if (len < min)
		len = min;
	return len > max ? max : len;
}

/* Length of the message number k that consumes a receive. */
static unsigned msg_len(unsigned conn, uint64_t k)
{
	uint64_t s = stream(conn, 1, k);

	return pick_len(&s, 0, maxsize);
}

struct conn {
	unsigned index;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_cq_ex *cqx;	/* -x: the same CQ, extended */
	struct ibv_comp_channel *ch;
	struct ibv_mr *mr;
	uint8_t *buf;		/* client: send/read slots; server: receive slots */
	size_t slot;
	unsigned nslots;
	struct ibv_mr *region_mr;	/* server: the region the client reads and writes */
	uint8_t *region;
	uint8_t *shadow;	/* client: what the region should hold */
	uint64_t raddr;
	uint32_t rkey, rlen, max_inline, max_sge_rd;
	uint64_t inlined;	/* client: requests posted with IBV_SEND_INLINE */
	/* completions handed over by the waiting threads (-e) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct ibv_wc *queue;
	unsigned qhead, qlen, qcap;
	int stop;
	pthread_t threads[16];
	struct ibv_sge rsge[MAX_BATCH + 8][MAX_SGE];	/* server: each receive's list */
	int rsge_n[MAX_BATCH + 8];
	int done;		/* server: DONE came, */
	uint64_t done_at;	/* with the number of messages the client counted */
	unsigned acks_posted, acks_done;
	int ack_pending; /* a batch ended while the last ACK was still in flight */
	/* counters */
	uint64_t next_msg, sends, writes, write_imms, reads, bytes, empty;
};

static void check_time(const char *what)
{
	if (time(NULL) > deadline)
		fail("timed out waiting for %s", what);
}

static void *waiter(void *arg)
{
	struct conn *c = arg;
	struct ibv_wc wc[16];
	struct ibv_cq *cq;
	void *ctx;
	int n, i;

	for (;;) {
		if (ibv_get_cq_event(c->ch, &cq, &ctx))
			break;
		ibv_ack_cq_events(cq, 1);
		pthread_mutex_lock(&c->lock);
		if (c->stop) {
			pthread_mutex_unlock(&c->lock);
			break;
		}
		pthread_mutex_unlock(&c->lock);
		if (ibv_req_notify_cq(cq, 0))
			fail("ibv_req_notify_cq: %s", strerror(errno));
		/*
		 * Poll and queue under one lock: a waiter that polled first but queued second
		 * would reorder the completions the CQ gave in order.
		 */
		pthread_mutex_lock(&c->lock);
		while ((n = ibv_poll_cq(cq, 16, wc)) > 0) {
			for (i = 0; i < n; i++) {
				if (c->qlen == c->qcap)
					fail("completion queue of the test overflowed");
				c->queue[(c->qhead + c->qlen++) % c->qcap] = wc[i];
			}
			pthread_cond_broadcast(&c->cond);
		}
		pthread_mutex_unlock(&c->lock);
		if (n < 0)
			fail("ibv_poll_cq: %d", n);
	}
	return NULL;
}

/* The fields of the extended CQ's current completion that a work completion has. */
static struct ibv_wc read_wc_ex(struct ibv_cq_ex *cqx)
{
	struct ibv_wc wc = {
		.wr_id = cqx->wr_id,
		.status = cqx->status,
		.opcode = ibv_wc_read_opcode(cqx),
		.byte_len = ibv_wc_read_byte_len(cqx),
		.qp_num = ibv_wc_read_qp_num(cqx),
		.wc_flags = ibv_wc_read_wc_flags(cqx),
	};

	if (wc.wc_flags & IBV_WC_WITH_IMM)
		wc.imm_data = ibv_wc_read_imm_data(cqx);
	return wc;
}

/* -x: one poll of the extended CQ, start to end, into the connection's queue. */
static void poll_ex(struct conn *c)
{
	struct ibv_poll_cq_attr attr = {};
	int ret = ibv_start_poll(c->cqx, &attr);

	if (ret == ENOENT)
		return;
	if (ret)
		fail("ibv_start_poll: %s", strerror(ret));
	do {
		if (c->qlen == c->qcap)
			fail("completion queue of the test overflowed");
		c->queue[(c->qhead + c->qlen++) % c->qcap] = read_wc_ex(c->cqx);
	} while ((ret = ibv_next_poll(c->cqx)) == 0);
	ibv_end_poll(c->cqx);
	if (ret != ENOENT)
		fail("ibv_next_poll: %s", strerror(ret));
}

/* The next completion of the connection, polled or from the waiters. */
static void next_wc(struct conn *c, struct ibv_wc *wc, const char *what)
{
	int n;

	if (c->cqx) {
		unsigned spins = 0;

		while (!c->qlen) {
			poll_ex(c);
			if (++spins % 1024 == 0)
				check_time(what);
		}
		*wc = c->queue[c->qhead];
		c->qhead = (c->qhead + 1) % c->qcap;
		c->qlen--;
	} else if (!ev_threads) {
		unsigned spins = 0;

		while ((n = ibv_poll_cq(c->cq, 1, wc)) == 0) {
			if (++spins % 1024 == 0)
				check_time(what);
		}
		if (n < 0)
			fail("ibv_poll_cq: %d", n);
	} else {
		struct timespec ts;

		pthread_mutex_lock(&c->lock);
		while (!c->qlen) {
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&c->cond, &c->lock, &ts);
			if (time(NULL) > deadline) {
				pthread_mutex_unlock(&c->lock);
				fail("no completion event for %s (a wait that never woke?)", what);
			}
		}
		*wc = c->queue[c->qhead];
		c->qhead = (c->qhead + 1) % c->qcap;
		c->qlen--;
		pthread_mutex_unlock(&c->lock);
	}
	if (wc->status != IBV_WC_SUCCESS)
		fail("conn %u: %s completion wr_id %" PRIu64 " status %s (%d)",
		     c->index, what, wc->wr_id, ibv_wc_status_str(wc->status),
		     wc->status);
}

/* Splits [p, p + len) into up to max pieces laid out with gaps in slot. */
static int scatter(struct conn *c, uint8_t *slot, unsigned len, uint64_t *s,
		   unsigned max, struct ibv_sge *sge)
{
	unsigned n = 1 + rnd(s) % max, i, left = len, off = 0;

	if (len < n)
		n = len ? len : 1;
	for (i = 0; i < n; i++) {
		unsigned piece = i + 1 == n ? left : 1 + rnd(s) % (left - (n - i - 1));

		sge[i].addr = (uintptr_t)(slot + off);
		sge[i].length = piece;
		sge[i].lkey = c->mr->lkey;
		left -= piece;
		off += piece + rnd(s) % 64;
	}
	return n;
}

static void gather_copy(uint8_t *dst, unsigned len, struct ibv_sge *sge, int n)
{
	int i;

	for (i = 0; i < n && len; i++) {
		unsigned piece = sge[i].length < len ? sge[i].length : len;

		memcpy(dst, (void *)(uintptr_t)sge[i].addr, piece);
		dst += piece;
		len -= piece;
	}
}

/* rdma_create_qp, or with -w rdma_create_qp_ex with the send operations used here. */
static int create_qp(struct conn *c, struct rdma_cm_id *id, struct ibv_qp_init_attr *qpa)
{
	struct ibv_qp_init_attr_ex ax = {
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = c->pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
				  IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ,
	};

	if (!use_wr_api)
		return rdma_create_qp(id, c->pd, qpa);
	ax.cap = qpa->cap;
	ax.qp_type = qpa->qp_type;
	ax.send_cq = qpa->send_cq;
	ax.recv_cq = qpa->recv_cq;
	if (rdma_create_qp_ex(id, &ax))
		return -1;
	qpa->cap = ax.cap;
	if (!ibv_qp_to_qp_ex(id->qp))
		fail("rdma_create_qp_ex: no ibv_qp_ex for the QP");
	return 0;
}

/*
 * ibv_post_send of the list at wr, or with -w the same requests built with
 * ibv_wr_*: then all are posted or none (*bad is the first).
 */
static int post_send(struct conn *c, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct ibv_qp_ex *x;
	struct ibv_send_wr *w;
	int ret;

	if (!use_wr_api)
		return ibv_post_send(c->id->qp, wr, bad);
	x = ibv_qp_to_qp_ex(c->id->qp);
	ibv_wr_start(x);
	for (w = wr; w; w = w->next) {
		x->wr_id = w->wr_id;
		x->wr_flags = w->send_flags & ~IBV_SEND_INLINE;
		switch (w->opcode) {
		case IBV_WR_SEND:
			ibv_wr_send(x);
			break;
		case IBV_WR_RDMA_WRITE:
			ibv_wr_rdma_write(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr);
			break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			ibv_wr_rdma_write_imm(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr, w->imm_data);
			break;
		case IBV_WR_RDMA_READ:
			ibv_wr_rdma_read(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr);
			break;
		default:
			ibv_wr_abort(x);
			*bad = wr;
			return EINVAL;
		}
		if (w->send_flags & IBV_SEND_INLINE) {
			struct ibv_data_buf d[MAX_SGE];

			for (int i = 0; i < w->num_sge; i++)
				d[i] = (struct ibv_data_buf){ (void *)(uintptr_t)w->sg_list[i].addr,
							      w->sg_list[i].length };
			ibv_wr_set_inline_data_list(x, w->num_sge, d);
		} else {
			ibv_wr_set_sge_list(x, w->num_sge, w->sg_list);
		}
	}
	ret = ibv_wr_complete(x);
	if (ret)
		*bad = wr;
	return ret;
}

static void setup_qp(struct conn *c, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qpa = {
		.cap = { .max_send_wr = MAX_BATCH * 2 + 8,
			 .max_recv_wr = MAX_BATCH + 8,
			 .max_send_sge = MAX_SGE, .max_recv_sge = MAX_SGE,
			 .max_inline_data = 256 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_device_attr da;
	unsigned i;

	c->id = id;
	c->pd = ibv_alloc_pd(id->verbs);
	if (!c->pd)
		fail("ibv_alloc_pd: %s", strerror(errno));
	if (ibv_query_device(id->verbs, &da))
		fail("ibv_query_device: %s", strerror(errno));
	c->max_sge_rd = da.max_sge_rd < 1 ? 1 : da.max_sge_rd;
	if (c->max_sge_rd > MAX_SGE)
		c->max_sge_rd = MAX_SGE;
	if (ev_threads) {
		c->ch = ibv_create_comp_channel(id->verbs);
		if (!c->ch)
			fail("ibv_create_comp_channel: %s", strerror(errno));
	}
	if (use_cq_ex) {
		struct ibv_cq_init_attr_ex ca = {
			.cqe = 4 * MAX_BATCH + 32,
			.cq_context = c,
			.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
				    IBV_WC_EX_WITH_QP_NUM,
		};

		c->cqx = ibv_create_cq_ex(id->verbs, &ca);
		if (!c->cqx)
			fail("ibv_create_cq_ex: %s", strerror(errno));
		c->cq = ibv_cq_ex_to_cq(c->cqx);
	} else {
		c->cq = ibv_create_cq(id->verbs, 4 * MAX_BATCH + 32, c, c->ch, 0);
	}
	if (!c->cq)
		fail("ibv_create_cq: %s", strerror(errno));
	if (ev_threads && ibv_req_notify_cq(c->cq, 0))
		fail("ibv_req_notify_cq: %s", strerror(errno));
	qpa.send_cq = qpa.recv_cq = c->cq;
	if (create_qp(c, id, &qpa)) {
		/* not every device offers inline data */
		qpa.cap.max_inline_data = 0;
		if (create_qp(c, id, &qpa))
			fail("rdma_create_qp: %s", strerror(errno));
	}
	c->max_inline = qpa.cap.max_inline_data;
	c->slot = 2 * (size_t)maxsize + 64 * MAX_SGE + HDR_LEN;
	c->nslots = MAX_BATCH + 8;
	c->buf = aligned_alloc(4096, c->slot * c->nslots);
	if (!c->buf)
		fail("out of memory");
	memset(c->buf, 0, c->slot * c->nslots);
	c->mr = ibv_reg_mr(c->pd, c->buf, c->slot * c->nslots,
			   IBV_ACCESS_LOCAL_WRITE);
	if (!c->mr)
		fail("ibv_reg_mr: %s", strerror(errno));
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->qcap = 8 * MAX_BATCH + 64;
	c->queue = calloc(c->qcap, sizeof(*c->queue));
	for (i = 0; i < ev_threads; i++)
		pthread_create(&c->threads[i], NULL, waiter, c);
}

static void wait_cm(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
		    struct rdma_cm_event **out)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev))
		fail("rdma_get_cm_event: %s", strerror(errno));
	if (ev->event != want)
		fail("rdma_cm event %s (status %d), want %s",
		     rdma_event_str(ev->event), ev->status, rdma_event_str(want));
	if (out)
		*out = ev;
	else
		rdma_ack_cm_event(ev);
}

/* ---- server ---------------------------------------------------------------- */

static uint64_t recv_sges_seed(struct conn *c, unsigned slot)
{
	static uint64_t n;

	return stream(c->index, 7, slot + 1) ^ __atomic_add_fetch(&n, 1, __ATOMIC_RELAXED);
}

static void post_recv_slot(struct conn *c, unsigned slot)
{
	int ret;
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = c->rsge[slot] }, *bad;
	uint64_t s = recv_sges_seed(c, slot);

	c->rsge_n[slot] = scatter(c, c->buf + slot * c->slot, maxsize + HDR_LEN,
				  &s, MAX_SGE, c->rsge[slot]);
	wr.num_sge = c->rsge_n[slot];
	ret = ibv_post_recv(c->id->qp, &wr, &bad);
	if (ret)
		fail("ibv_post_recv: %s", strerror(ret));
}

static void send_ack(struct conn *c)
{
	int ret;
	/* The last slot is the server's send slot: ACKs go one at a time. */
	uint8_t *p = c->buf + (c->nslots - 1) * c->slot;
	struct hdr h = { MAGIC, MSG_ACK, 0, HDR_LEN };
	struct ibv_sge sge = { (uintptr_t)p, HDR_LEN, c->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = ~0ULL, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	/* One ACK at a time: the client sends nothing until it has it. It may
	 * have it, and end its next batch, before the ACK's send completion
	 * reaches us (rxe completes a Send when the transport ACK comes, which
	 * can follow the peer's next requests): then the new ACK waits for that
	 * completion, as its buffer does. */
	if (c->acks_posted != c->acks_done) {
		if (c->ack_pending)
			fail("conn %u: two batches ended while an ACK was in flight", c->index);
		c->ack_pending = 1;
		return;
	}
	memcpy(p, &h, sizeof(h));
	ret = post_send(c, &wr, &bad);
	if (ret)
		fail("ibv_post_send (ack): %s", strerror(ret));
	c->acks_posted++;
}

static void *serve(void *arg)
{
	struct conn *c = arg;
	uint8_t *tmp = malloc(maxsize + HDR_LEN), *want = malloc(maxsize + HDR_LEN);
	/* With several waiting threads completions may reach this loop a little
	 * out of order: then message numbers are checked as a set, not a
	 * sequence. */
	int in_order = ev_threads <= 1;
	uint8_t *seen = calloc(1, (size_t)ops + 2);

	while (!c->done || c->next_msg != c->done_at ||
	       c->acks_done != c->acks_posted || c->ack_pending) {
		struct ibv_wc wc;
		struct hdr h;
		unsigned len, slot;
		uint64_t k;

		next_wc(c, &wc, "a receive");
		if (wc.opcode == IBV_WC_SEND) {
			if (wc.wr_id != ~0ULL)
				fail("conn %u: send completion wr_id %" PRIu64, c->index, wc.wr_id);
			c->acks_done++;
			if (c->ack_pending) {
				c->ack_pending = 0;
				send_ack(c);
			}
			continue;
		}
		slot = wc.wr_id;
		if (slot >= c->nslots - 1)
			fail("conn %u: receive completion with wr_id %u", c->index, slot);
		if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
			k = ntohl(wc.imm_data);
			if (!(wc.wc_flags & IBV_WC_WITH_IMM))
				fail("conn %u: Write with Immediate without IBV_WC_WITH_IMM", c->index);
			if (wc.byte_len != msg_len(c->index, k))
				fail("conn %u: Write with Immediate %" PRIu64 ": byte_len %u, expected %u",
				     c->index, k, wc.byte_len, msg_len(c->index, k));
			c->write_imms++;
		} else if (wc.opcode == IBV_WC_RECV) {
			if (wc.wc_flags & IBV_WC_WITH_IMM)
				fail("conn %u: a Send reported IBV_WC_WITH_IMM", c->index);
			if (wc.byte_len == 0) {
				c->empty++;
				post_recv_slot(c, slot);
				continue;
			}
			if (wc.byte_len < HDR_LEN)
				fail("conn %u: %u-byte Send", c->index, wc.byte_len);
			gather_copy(tmp, wc.byte_len, c->rsge[slot], c->rsge_n[slot]);
			memcpy(&h, tmp, sizeof(h));
			if (h.magic != MAGIC || h.len != wc.byte_len)
				fail("conn %u: Send header magic %#x len %u, byte_len %u",
				     c->index, h.magic, h.len, wc.byte_len);
			if (h.type == MSG_BATCH_END || h.type == MSG_DONE) {
				if (h.type == MSG_DONE) {
					c->done = 1;
					c->done_at = h.seq;
				}
				post_recv_slot(c, slot);
				send_ack(c);
				continue;
			}
			if (h.type != MSG_DATA)
				fail("conn %u: Send of type %u", c->index, h.type);
			k = h.seq;
			len = msg_len(c->index, k);
			if (len < HDR_LEN)
				len = HDR_LEN;
			if (wc.byte_len != len)
				fail("conn %u: Send %" PRIu64 ": byte_len %u, expected %u",
				     c->index, k, wc.byte_len, len);
			fill(want, len - HDR_LEN, stream(c->index, 2, k));
			if (memcmp(want, tmp + HDR_LEN, len - HDR_LEN))
				fail("conn %u: Send %" PRIu64 ": payload differs", c->index, k);
			c->sends++;
			c->bytes += len;
		} else {
			fail("conn %u: completion opcode %d on the server", c->index, wc.opcode);
		}
		if (in_order && k != c->next_msg)
			fail("conn %u: message %" PRIu64 " arrived, expected %" PRIu64,
			     c->index, k, c->next_msg);
		if (k > ops || seen[k]++)
			fail("conn %u: message %" PRIu64 " twice or out of range", c->index, k);
		c->next_msg++;
		post_recv_slot(c, slot);
	}
	free(seen);
	free(tmp);
	free(want);
	return NULL;
}

static int run_server(const char *addr, const char *port)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE,
				       .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen;
	struct conn *cs = calloc(conns, sizeof(*cs));
	pthread_t *t = calloc(conns, sizeof(*t));
	unsigned i, j, early = 0;	/* connections that ended while others were accepted */
	int rv;

	rv = rdma_getaddrinfo(addr, port, &hints, &ai);
	if (rv)
		fail("rdma_getaddrinfo: %s", gai_strerror(rv));
	if (!ch || rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listen, ai->ai_src_addr) || rdma_listen(listen, 64))
		fail("listen: %s", strerror(errno));
	printf("verify: listening on %s:%s\n", addr, port);
	fflush(stdout);
	/* Requests and establishments of several connections interleave. */
	for (i = 0, j = 0; i < conns || j < conns;) {
		struct rdma_cm_event *ev;
		struct connect_pdata cp;
		struct accept_pdata ap;
		struct rdma_conn_param param = { .responder_resources = 8,
						 .initiator_depth = 8,
						 .private_data = &ap,
						 .private_data_len = sizeof(ap) };
		struct conn *c;
		size_t rlen = 2 * MAX_BATCH * (size_t)maxsize;
		unsigned k;

		if (rdma_get_cm_event(ch, &ev))
			fail("rdma_get_cm_event: %s", strerror(errno));
		if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {
			c = ev->id->context;
			rdma_ack_cm_event(ev);
			if (!c)
				fail("ESTABLISHED for an unknown connection");
			pthread_create(&t[c->index], NULL, serve, c);
			j++;
			continue;
		}
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id->context) {
			/* a connection that ended before another one connected (a busy host
			 * starts the client's threads late) */
			rdma_ack_cm_event(ev);
			early++;
			continue;
		}
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
			fail("rdma_cm event %s (status %d) while accepting",
			     rdma_event_str(ev->event), ev->status);
		if (ev->param.conn.private_data_len < sizeof(cp))
			fail("connect request with %u bytes of private data",
			     ev->param.conn.private_data_len);
		memcpy(&cp, ev->param.conn.private_data, sizeof(cp));
		if (cp.magic != MAGIC || cp.index >= conns)
			fail("connect request private data magic %#x index %u", cp.magic, cp.index);
		c = &cs[cp.index];
		if (c->id)
			fail("two connections with index %u", cp.index);
		c->index = cp.index;
		ev->id->context = c;
		setup_qp(c, ev->id);
		c->region = aligned_alloc(4096, rlen);
		if (!c->region)
			fail("out of memory");
		memset(c->region, 0, rlen);
		c->region_mr = ibv_reg_mr(c->pd, c->region, rlen,
					  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					  IBV_ACCESS_REMOTE_READ);
		if (!c->region_mr)
			fail("ibv_reg_mr (region): %s", strerror(errno));
		for (k = 0; k < c->nslots - 1; k++)
			post_recv_slot(c, k);
		ap.addr = (uintptr_t)c->region;
		ap.rkey = c->region_mr->rkey;
		ap.len = rlen;
		if (rdma_accept(ev->id, &param))
			fail("rdma_accept: %s", strerror(errno));
		rdma_ack_cm_event(ev);
		i++;
	}
	for (i = 0; i < conns; i++)
		pthread_join(t[i], NULL);
	for (i = 0; i < conns; i++) {
		printf("verify: conn %u sends %" PRIu64 " write_imms %" PRIu64
		       " empty %" PRIu64 " bytes %" PRIu64 "\n", i, cs[i].sends,
		       cs[i].write_imms, cs[i].empty, cs[i].bytes);
		if (i >= early)
			wait_cm(ch, RDMA_CM_EVENT_DISCONNECTED, NULL);
	}
	printf("verify: ok server\n");
	return 0;
}

/* ---- client ---------------------------------------------------------------- */

struct posted {
	enum op op;
	int signaled;
	unsigned len;
	uint64_t roff;		/* Read: offset in the region */
	struct ibv_sge sge[MAX_SGE];
	int nsge;
};

static void client_batch(struct conn *c, unsigned n, uint64_t *s)
{
	int ret;
	struct posted p[MAX_BATCH + 1];
	uint8_t used[2 * MAX_BATCH] = { 0 };
	uint64_t blk = maxsize, nblk = c->rlen / maxsize;
	struct ibv_send_wr wr[MAX_BATCH + 1], *bad;
	unsigned i, signaled = 0, first = 0;
	uint8_t *tmp = malloc(maxsize + HDR_LEN);
	struct ibv_wc wc;
	struct hdr h;

	memset(wr, 0, sizeof(wr));
	for (i = 0; i < n; i++) {
		uint8_t *slot = c->buf + i * c->slot;
		unsigned r = rnd(s) % 100, b;

		p[i].op = r < 35 ? OP_SEND : r < 60 ? OP_WRITE : r < 75 ? OP_WRITE_IMM : OP_READ;
		p[i].signaled = p[i].op == OP_SEND || p[i].op == OP_READ || rnd(s) % 2;
		wr[i].wr_id = i;
		wr[i].sg_list = p[i].sge;
		wr[i].send_flags = p[i].signaled ? IBV_SEND_SIGNALED : 0;
		do {
			b = rnd(s) % nblk;
		} while (used[b]);
		used[b] = 1;
		switch (p[i].op) {
		case OP_SEND: {
			uint64_t k = c->next_msg++;
			unsigned len = msg_len(c->index, k);

			if (len == 0 && rnd(s) % 2) {
				/* an empty Send: no header, counted apart */
				c->next_msg--;
				c->empty++;
				p[i].len = 0;
				p[i].nsge = 0;
				wr[i].opcode = IBV_WR_SEND;
				break;
			}
			if (len < HDR_LEN)
				len = HDR_LEN;
			h = (struct hdr){ MAGIC, MSG_DATA, (uint32_t)k, len };
			memcpy(tmp, &h, sizeof(h));
			fill(tmp + HDR_LEN, len - HDR_LEN, stream(c->index, 2, k));
			p[i].len = len;
			p[i].nsge = scatter(c, slot, len, s, MAX_SGE, p[i].sge);
			{
				unsigned off = 0;
				int j;

				for (j = 0; j < p[i].nsge; j++) {
					memcpy((void *)(uintptr_t)p[i].sge[j].addr, tmp + off,
					       p[i].sge[j].length);
					off += p[i].sge[j].length;
				}
			}
			wr[i].opcode = IBV_WR_SEND;
			if (rnd(s) % 4 == 0)
				wr[i].send_flags |= IBV_SEND_SOLICITED;
			if (len <= c->max_inline && rnd(s) % 2)
				wr[i].send_flags |= IBV_SEND_INLINE;
			c->sends++;
			break;
		}
		case OP_WRITE:
		case OP_WRITE_IMM: {
			unsigned len, off, j, o = 0;

			if (p[i].op == OP_WRITE_IMM) {
				uint64_t k = c->next_msg++;

				len = msg_len(c->index, k);
				wr[i].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
				wr[i].imm_data = htonl((uint32_t)k);
				c->write_imms++;
			} else {
				len = pick_len(s, 1, maxsize);
				wr[i].opcode = IBV_WR_RDMA_WRITE;
				c->writes++;
			}
			off = len < blk ? rnd(s) % (blk - len + 1) : 0;
			fill(tmp, len, rnd(s));
			p[i].len = len;
			p[i].nsge = len ? scatter(c, slot, len, s, MAX_SGE, p[i].sge) : 0;
			for (j = 0; j < (unsigned)p[i].nsge; j++) {
				memcpy((void *)(uintptr_t)p[i].sge[j].addr, tmp + o,
				       p[i].sge[j].length);
				o += p[i].sge[j].length;
			}
			memcpy(c->shadow + b * blk + off, tmp, len);
			wr[i].wr.rdma.remote_addr = c->raddr + b * blk + off;
			wr[i].wr.rdma.rkey = c->rkey;
			if (len <= c->max_inline && rnd(s) % 4 == 0)
				wr[i].send_flags |= IBV_SEND_INLINE;
			break;
		}
		case OP_READ: {
			unsigned len = pick_len(s, 1, maxsize), off;

			off = len < blk ? rnd(s) % (blk - len + 1) : 0;
			memset(slot, 0xa5, c->slot);
			p[i].len = len;
			p[i].roff = b * blk + off;
			p[i].nsge = scatter(c, slot, len, s, c->max_sge_rd, p[i].sge);
			wr[i].opcode = IBV_WR_RDMA_READ;
			wr[i].wr.rdma.remote_addr = c->raddr + p[i].roff;
			wr[i].wr.rdma.rkey = c->rkey;
			c->reads++;
			break;
		}
		default:
			break;
		}
		wr[i].num_sge = p[i].nsge;
		c->bytes += p[i].len;
		signaled += p[i].signaled;
	}
	/* The batch end, always signalled, last. */
	{
		uint8_t *slot = c->buf + n * c->slot;

		h = (struct hdr){ MAGIC, MSG_BATCH_END, (uint32_t)c->next_msg, HDR_LEN };
		memcpy(slot, &h, sizeof(h));
		p[n].op = OP_SEND;
		p[n].signaled = 1;
		p[n].len = HDR_LEN;
		p[n].nsge = 1;
		p[n].sge[0] = (struct ibv_sge){ (uintptr_t)slot, HDR_LEN, c->mr->lkey };
		wr[n].wr_id = n;
		wr[n].sg_list = p[n].sge;
		wr[n].num_sge = 1;
		wr[n].opcode = IBV_WR_SEND;
		wr[n].send_flags = IBV_SEND_SIGNALED;
		signaled++;
	}
	/* Post in chains of 1..4 requests. */
	while (first <= n) {
		unsigned len = 1 + rnd(s) % 4, k;

		if (first + len > n + 1)
			len = n + 1 - first;
		for (k = first; k + 1 < first + len; k++)
			wr[k].next = &wr[k + 1];
		wr[first + len - 1].next = NULL;
		ret = post_send(c, &wr[first], &bad);
		if (ret)
			fail("conn %u: ibv_post_send: %s (bad_wr %" PRIu64 ")", c->index,
			     strerror(ret), bad ? bad->wr_id : 0);
		/* Inline data is the device's once the post returns: the buffers are ours again. */
		for (k = first; k < first + len; k++) {
			if (!(wr[k].send_flags & IBV_SEND_INLINE))
				continue;
			for (int j = 0; j < wr[k].num_sge; j++)
				memset((void *)(uintptr_t)wr[k].sg_list[j].addr, 0xa5,
				       wr[k].sg_list[j].length);
			c->inlined++;
		}
		first += len;
	}
	/* Signalled completions in posting order, then the server's ACK. */
	{
		unsigned want = 0, got_ack = 0;

		for (i = 0; i < signaled + 1; i++) {
			next_wc(c, &wc, "a send-side completion");
			if (wc.opcode == IBV_WC_RECV) {
				if (got_ack++ || wc.byte_len != HDR_LEN)
					fail("conn %u: unexpected receive (%u bytes)",
					     c->index, wc.byte_len);
				memcpy(&h, c->buf + (c->nslots - 1) * c->slot, sizeof(h));
				if (h.magic != MAGIC || h.type != MSG_ACK)
					fail("conn %u: ACK magic %#x type %u", c->index, h.magic, h.type);
				continue;
			}
			while (want <= n && !p[want].signaled)
				want++;
			if (wc.wr_id != want)
				fail("conn %u: completion for wr_id %" PRIu64 ", expected %u",
				     c->index, wc.wr_id, want);
			switch (p[want].op) {
			case OP_SEND:
				if (wc.opcode != IBV_WC_SEND)
					fail("conn %u: Send completed with opcode %d", c->index, wc.opcode);
				break;
			case OP_WRITE:
			case OP_WRITE_IMM:
				if (wc.opcode != IBV_WC_RDMA_WRITE)
					fail("conn %u: Write completed with opcode %d", c->index, wc.opcode);
				break;
			case OP_READ: {
				if (wc.opcode != IBV_WC_RDMA_READ)
					fail("conn %u: Read completed with opcode %d", c->index, wc.opcode);
				gather_copy(tmp, p[want].len, p[want].sge, p[want].nsge);
				if (memcmp(tmp, c->shadow + p[want].roff, p[want].len)) {
					unsigned x = 0;

					while (tmp[x] == c->shadow[p[want].roff + x])
						x++;
					fail("conn %u: Read of %u bytes at region offset %" PRIu64
					     " differs from what was written, first at byte %u",
					     c->index, p[want].len, p[want].roff, x);
				}
				break;
			}
			default:
				break;
			}
			want++;
		}
		if (!got_ack)
			fail("conn %u: no ACK", c->index);
	}
	free(tmp);
}

static void post_ack_recv(struct conn *c)
{
	int ret;
	struct ibv_sge sge = { (uintptr_t)(c->buf + (c->nslots - 1) * c->slot),
			       HDR_LEN, c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1000000, .sg_list = &sge, .num_sge = 1 }, *bad;

	ret = ibv_post_recv(c->id->qp, &wr, &bad);
	if (ret)
		fail("ibv_post_recv: %s", strerror(ret));
}

struct client_arg {
	struct conn *c;
	const char *addr;
	unsigned port;
};

static void *client_conn(void *arg)
{
	int ret;
	struct client_arg *a = arg;
	struct conn *c = a->c;
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_event *ev;
	struct connect_pdata cp = { MAGIC, c->index };
	struct rdma_conn_param param = { .responder_resources = 8,
					 .initiator_depth = 8,
					 .retry_count = 7,
					 .private_data = &cp,
					 .private_data_len = sizeof(cp) };
	struct accept_pdata ap;
	struct rdma_cm_id *id;
	char port[16];
	uint64_t s = stream(c->index, 9, 0);
	unsigned done = 0;
	int rv;

	snprintf(port, sizeof(port), "%u", a->port);
	rv = rdma_getaddrinfo(a->addr, port, &hints, &ai);
	if (rv)
		fail("rdma_getaddrinfo: %s", gai_strerror(rv));
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 5000))
		fail("rdma_resolve_addr: %s", strerror(errno));
	wait_cm(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	if (rdma_resolve_route(id, 5000))
		fail("rdma_resolve_route: %s", strerror(errno));
	wait_cm(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	setup_qp(c, id);
	post_ack_recv(c);
	if (rdma_connect(id, &param))
		fail("rdma_connect: %s", strerror(errno));
	wait_cm(ch, RDMA_CM_EVENT_ESTABLISHED, &ev);
	if (ev->param.conn.private_data_len < sizeof(ap))
		fail("accept with %u bytes of private data", ev->param.conn.private_data_len);
	memcpy(&ap, ev->param.conn.private_data, sizeof(ap));
	rdma_ack_cm_event(ev);
	c->raddr = ap.addr;
	c->rkey = ap.rkey;
	c->rlen = ap.len;
	if (c->rlen < 2 * batch * (uint64_t)maxsize)
		fail("server region of %u bytes is too small", c->rlen);
	c->shadow = calloc(1, c->rlen);
	while (done < ops) {
		unsigned n = ops - done < batch ? ops - done : batch;

		post_ack_recv(c);
		client_batch(c, n, &s);
		done += n;
	}
	/* DONE carries the number of messages that consumed a receive. */
	{
		uint8_t *slot = c->buf;
		struct hdr h = { MAGIC, MSG_DONE, (uint32_t)c->next_msg, HDR_LEN };
		struct ibv_sge sge = { (uintptr_t)slot, HDR_LEN, c->mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 77, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		struct ibv_wc wc;
		int seen = 0;

		post_ack_recv(c);
		memcpy(slot, &h, sizeof(h));
		ret = post_send(c, &wr, &bad);
		if (ret)
			fail("ibv_post_send (done): %s", strerror(ret));
		while (seen < 2) {
			next_wc(c, &wc, "the final exchange");
			seen++;
		}
	}
	if (rdma_disconnect(id))
		fail("rdma_disconnect: %s", strerror(errno));
	wait_cm(ch, RDMA_CM_EVENT_DISCONNECTED, NULL);
	printf("verify: conn %u sends %" PRIu64 " writes %" PRIu64 " write_imms %" PRIu64
	       " reads %" PRIu64 " empty %" PRIu64 " bytes %" PRIu64 " inline %" PRIu64
	       " max_inline %u\n", c->index, c->sends, c->writes, c->write_imms, c->reads,
	       c->empty, c->bytes, c->inlined, c->max_inline);
	fflush(stdout);
	return NULL;
}

static int run_client(const char *addr, const char *port)
{
	struct conn *cs = calloc(conns, sizeof(*cs));
	struct client_arg *args = calloc(conns, sizeof(*args));
	pthread_t *t = calloc(conns, sizeof(*t));
	unsigned i;

	for (i = 0; i < conns; i++) {
		cs[i].index = i;
		args[i] = (struct client_arg){ &cs[i], addr, (unsigned)atoi(port) };
		pthread_create(&t[i], NULL, client_conn, &args[i]);
	}
	for (i = 0; i < conns; i++)
		pthread_join(t[i], NULL);
	printf("verify: ok client %u connections x %u operations\n", conns, ops);
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode, *addr, *port;
	int opt;

	if (argc < 4) {
		fprintf(stderr, "usage: %s server|client ADDR PORT [-c N] [-n N] [-b N] [-m N] [-s N] [-e T] [-t S] [-x] [-w]\n",
			argv[0]);
		return 2;
	}
	mode = argv[1];
	addr = argv[2];
	port = argv[3];
	optind = 4;
	while ((opt = getopt(argc, argv, "c:n:b:m:s:e:t:xw")) != -1) {
		switch (opt) {
		case 'c': conns = atoi(optarg); break;
		case 'n': ops = atoi(optarg); break;
		case 'b': batch = atoi(optarg); break;
		case 'm': maxsize = atoi(optarg); break;
		case 's': seed = atoi(optarg); break;
		case 'e': ev_threads = atoi(optarg); break;
		case 't': time_limit = atoi(optarg); break;
		case 'x': use_cq_ex = 1; break;
		case 'w': use_wr_api = 1; break;
		default: return 2;
		}
	}
	if (!conns || !batch || batch > MAX_BATCH || maxsize < HDR_LEN || ev_threads > 16 ||
	    (use_cq_ex && ev_threads)) {
		fprintf(stderr, "verify: bad option (1 <= -b <= %d, -m >= %d, -e <= 16, not -e with -x)\n",
			MAX_BATCH, HDR_LEN);
		return 2;
	}
	deadline = time(NULL) + time_limit;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "server"))
		return run_server(addr, port);
	if (!strcmp(mode, "client"))
		return run_client(addr, port);
	fprintf(stderr, "verify: mode must be server or client\n");
	return 2;
}
