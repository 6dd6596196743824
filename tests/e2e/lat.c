// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Latency by how the application waits: one connection over librdmacm, any
 * RDMA device (urdma, rxe, siw), timed with CLOCK_MONOTONIC.
 *
 *   lat server ADDR PORT -p PATTERN [-s SIZE] [-n ITERS] [-t SECONDS]
 *   lat client ADDR PORT -p PATTERN [-s SIZE] [-n ITERS] [-t SECONDS] [-T]
 *
 * Both sides must be given the same -p, -s and -n. Patterns:
 *   poll-send    Send/Recv ping-pong, both sides busy-polling the CQ
 *   chan-send    Send/Recv ping-pong, both sides blocked in ibv_get_cq_event
 *   chan-write   RDMA Write with Immediate ping-pong, completion channel as above
 *   fd-send      as chan-send, but blocked in poll() on the channel's fd
 *   mem-write    RDMA Write ping-pong, each side spinning on the last byte of its
 *                own buffer with no verbs call until it changes
 *   poll-write   as mem-write, but each Write is signaled and its completion
 *                busy-polled before the side spins on its buffer
 *   sleep-read   the client's RDMA Reads, one at a time, busy-polled; the server
 *                sleeps in poll() on its rdma_cm fd, no verbs call, until the end
 *   sleep-write  as sleep-read with signaled RDMA Writes
 *   busy-read    as sleep-read, the server computing (no system call) meanwhile
 *   connect      ITERS times: connect, a Send of SIZE and its reply, disconnect
 *
 * The client prints one line at the end:
 *   lat pattern=P size=S iters=N typical_us=X p99_us=Y avg_us=Z
 * one-way times (half a round trip) for the ping-pongs, the whole operation for
 * the Reads and Writes, the whole cycle for connect; typical is the median. For
 * connect a second line gives each part of the cycle's median:
 *   phases resolve_us= qp_us= established_us= message_us= disconnected_us= destroy_us=
 * (rdma_resolve_addr and _route; the PD, CQ and QP; rdma_connect to ESTABLISHED;
 * the Send and its reply; rdma_disconnect to DISCONNECTED; destroying the QP and id).
 * With -T the client also prints, for each timed cycle, when each phase began and
 * when the last ended, in CLOCK_MONOTONIC microseconds (scripts/trace-wakes lines
 * them up with the scheduler's events):
 *   cycle I T0 T1 T2 T3 T4 T5 T6
 * A few warm-up iterations come first, untimed. The server prints "lat server
 * done". Bad arguments: a usage line, exit 2; any failure, a completion in
 * error, an unexpected rdma_cm event or the -t bound (default 60 s) reached:
 * "FAIL ..." and exit 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <rdma/rdma_cma.h>

#define USAGE "usage: lat server|client ADDR PORT -p poll-send|chan-send|chan-write|fd-send|" \
	      "mem-write|poll-write|sleep-read|sleep-write|busy-read|connect [-s SIZE] [-n ITERS] " \
	      "[-t SECONDS] [-T]"

enum pattern {
	POLL_SEND, CHAN_SEND, CHAN_WRITE, FD_SEND, MEM_WRITE, POLL_WRITE,
	SLEEP_READ, SLEEP_WRITE, BUSY_READ, CONNECT, NPATTERNS
};

static const char *const names[NPATTERNS] = {
	"poll-send", "chan-send", "chan-write", "fd-send", "mem-write", "poll-write",
	"sleep-read", "sleep-write", "busy-read", "connect",
};

#define SQ_DEPTH 64
#define RQ_DEPTH 16
/* Send queue entries are retired by the signaled one after them: one in
 * SIG_EVERY is signaled, so that a ping-pong reaps a completion now and then
 * instead of every message, as perftest does. */
#define SIG_EVERY 16

struct pdata {
	uint64_t addr;
	uint32_t rkey, len;
};

static enum pattern pat = NPATTERNS;
static unsigned size = 64, iters = 1000, limit = 60, warm;
static double deadline;
static const char *volatile waiting_for = "start";

struct conn {
	struct rdma_event_channel *ev;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_comp_channel *ch;
	struct ibv_mr *mr;
	uint8_t *buf;		/* [0, size): sent from; [size, 2 size): written and received into; then a flag */
	size_t len;
	uint32_t max_inline;
	struct pdata peer;
	unsigned posted, sig_done;	/* send queue: entries posted, signaled completions */
	unsigned recvs;			/* receive completions polled but not yet taken */
};

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

/* The catch-all bound, also of the waits that make no call that could time
 * out (ibv_get_cq_event, a spin on memory). */
static void on_alarm(int sig)
{
	static const char a[] = "FAIL timed out waiting for ";
	const char *w = waiting_for;

	(void)sig;
	if (write(1, a, sizeof(a) - 1) < 0 || write(1, w, strlen(w)) < 0 || write(1, "\n", 1) < 0)
		_exit(1);
	_exit(1);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void check_time(void)
{
	if (now_us() > deadline)
		fail("timed out after %u s waiting for %s", limit, waiting_for);
}

static int remaining_ms(void)
{
	double r = (deadline - now_us()) / 1000;

	return r < 0 ? 0 : (int)r + 1;
}

static void nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		fail("fcntl O_NONBLOCK: %s", strerror(errno));
}

/* The next rdma_cm event, bounded: the channel's fd is non-blocking. */
static struct rdma_cm_event *next_cm(struct rdma_event_channel *ev, const char *what)
{
	struct rdma_cm_event *e;
	struct pollfd p = { .fd = ev->fd, .events = POLLIN };

	waiting_for = what;
	for (;;) {
		if (rdma_get_cm_event(ev, &e) == 0)
			return e;
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			fail("rdma_get_cm_event: %s", strerror(errno));
		check_time();
		if (poll(&p, 1, remaining_ms()) < 0 && errno != EINTR)
			fail("poll (rdma_cm): %s", strerror(errno));
	}
}

static struct rdma_cm_event *expect_cm(struct rdma_event_channel *ev,
				       enum rdma_cm_event_type want, int keep)
{
	struct rdma_cm_event *e = next_cm(ev, rdma_event_str(want));

	if (e->event != want)
		fail("rdma_cm event %s (status %d), want %s", rdma_event_str(e->event),
		     e->status, rdma_event_str(want));
	if (keep)
		return e;
	rdma_ack_cm_event(e);
	return NULL;
}

static void check_wc(const struct ibv_wc *wc, const char *what)
{
	if (wc->status != IBV_WC_SUCCESS)
		fail("%s completion: %s (status %d, opcode %d, vendor error %#x)", what,
		     ibv_wc_status_str(wc->status), wc->status, wc->opcode, wc->vendor_err);
}

/* Resources of one connection on id: a send CQ that is polled, a receive CQ
 * with a completion channel for the patterns that wait on one. */
static void setup(struct conn *c, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = RQ_DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
	};
	int chan = pat == CHAN_SEND || pat == CHAN_WRITE || pat == FD_SEND;

	c->id = id;
	c->pd = ibv_alloc_pd(id->verbs);
	if (!c->pd)
		fail("ibv_alloc_pd: %s", strerror(errno));
	if (chan) {
		c->ch = ibv_create_comp_channel(id->verbs);
		if (!c->ch)
			fail("ibv_create_comp_channel: %s", strerror(errno));
		if (pat == FD_SEND)
			nonblock(c->ch->fd);
	}
	c->scq = ibv_create_cq(id->verbs, SQ_DEPTH, NULL, NULL, 0);
	c->rcq = ibv_create_cq(id->verbs, RQ_DEPTH, NULL, c->ch, 0);
	if (!c->scq || !c->rcq)
		fail("ibv_create_cq: %s", strerror(errno));
	if (chan && ibv_req_notify_cq(c->rcq, 0))
		fail("ibv_req_notify_cq: %s", strerror(errno));
	qa.send_cq = c->scq;
	qa.recv_cq = c->rcq;
	if (rdma_create_qp(id, c->pd, &qa)) {
		/* not every device offers inline data */
		qa.cap.max_inline_data = 0;
		if (rdma_create_qp(id, c->pd, &qa))
			fail("rdma_create_qp: %s", strerror(errno));
	}
	c->max_inline = qa.cap.max_inline_data;
	c->len = (2 * (size_t)size + 64 + 4095) & ~(size_t)4095;
	c->buf = aligned_alloc(4096, c->len);
	if (!c->buf)
		fail("out of memory");
	memset(c->buf, 0, c->len);
	c->mr = ibv_reg_mr(c->pd, c->buf, c->len, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!c->mr)
		fail("ibv_reg_mr: %s", strerror(errno));
}

static void teardown(struct conn *c)
{
	rdma_destroy_qp(c->id);
	if (ibv_dereg_mr(c->mr) || ibv_destroy_cq(c->scq) || ibv_destroy_cq(c->rcq) ||
	    (c->ch && ibv_destroy_comp_channel(c->ch)) || ibv_dealloc_pd(c->pd))
		fail("releasing the connection's resources: %s", strerror(errno));
	rdma_destroy_id(c->id);
	free(c->buf);
}

static uint8_t *rbuf(struct conn *c)
{
	return c->buf + size;
}

static uint8_t *flag(struct conn *c)
{
	return c->buf + 2 * (size_t)size;
}

static void post_recv(struct conn *c)
{
	struct ibv_sge sge = { (uintptr_t)rbuf(c), size, c->mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(c->id->qp, &wr, &bad))
		fail("ibv_post_recv: %s", strerror(errno));
}

/* Reaps the send CQ without waiting; returns the completions taken. */
static int reap_sends(struct conn *c)
{
	struct ibv_wc wc[8];
	int n, i, got = 0;

	while ((n = ibv_poll_cq(c->scq, 8, wc)) > 0) {
		for (i = 0; i < n; i++)
			check_wc(&wc[i], "send queue");
		c->sig_done += n;
		got += n;
	}
	if (n < 0)
		fail("ibv_poll_cq (send): %d", n);
	return got;
}

/* Posts one work request from [0, len) of the send area; every operation
 * is signaled when `always`, else one in SIG_EVERY. */
static void post(struct conn *c, enum ibv_wr_opcode op, uint64_t raddr, uint32_t len,
		 uint32_t imm, int always)
{
	struct ibv_sge sge = { (uintptr_t)c->buf, len, c->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = op }, *bad;
	unsigned retired;

	if (op == IBV_WR_RDMA_READ)
		sge.addr = (uintptr_t)rbuf(c);
	/* the queue must have room: wait for signaled completions to retire entries */
	waiting_for = "room in the send queue";
	for (;;) {
		retired = always ? c->sig_done : c->sig_done * SIG_EVERY;
		if (c->posted - retired < SQ_DEPTH - SIG_EVERY)
			break;
		if (!reap_sends(c))
			check_time();
	}
	if (always || c->posted % SIG_EVERY == SIG_EVERY - 1)
		wr.send_flags |= IBV_SEND_SIGNALED;
	if (len <= c->max_inline && op != IBV_WR_RDMA_READ)
		wr.send_flags |= IBV_SEND_INLINE;
	if (op == IBV_WR_RDMA_WRITE_WITH_IMM)
		wr.imm_data = htonl(imm);
	if (op != IBV_WR_SEND) {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = c->peer.rkey;
	}
	if (ibv_post_send(c->id->qp, &wr, &bad))
		fail("ibv_post_send: %s", strerror(errno));
	c->posted++;
}

/* Takes the receive completions there are into c->recvs; a Write with
 * Immediate must carry `imm`. */
static void drain_recvs(struct conn *c, uint32_t imm)
{
	struct ibv_wc wc[4];
	int n, i;

	while ((n = ibv_poll_cq(c->rcq, 4, wc)) > 0) {
		for (i = 0; i < n; i++) {
			check_wc(&wc[i], "receive");
			if (pat == CHAN_WRITE) {
				if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM ||
				    ntohl(wc[i].imm_data) != imm)
					fail("receive: opcode %d immediate %u, want a Write with immediate %u",
					     wc[i].opcode, ntohl(wc[i].imm_data), imm);
			} else if (wc[i].opcode != IBV_WC_RECV || wc[i].byte_len != size) {
				fail("receive: opcode %d of %u bytes, want a Send of %u",
				     wc[i].opcode, wc[i].byte_len, size);
			}
		}
		c->recvs += n;
	}
	if (n < 0)
		fail("ibv_poll_cq (receive): %d", n);
}

/* Waits for one receive completion the way the pattern says, and posts a
 * receive in its place. */
static void wait_recv(struct conn *c, uint32_t imm)
{
	struct ibv_cq *cq;
	void *ctx;
	unsigned spins = 0;

	waiting_for = "a receive completion";
	if (pat == POLL_SEND) {
		while (!c->recvs) {
			drain_recvs(c, imm);
			if (++spins % 4096 == 0)
				check_time();
		}
	} else {
		while (!c->recvs) {
			if (pat == FD_SEND) {
				struct pollfd p = { .fd = c->ch->fd, .events = POLLIN };
				int r = poll(&p, 1, remaining_ms());

				if (r < 0 && errno != EINTR)
					fail("poll (completion channel): %s", strerror(errno));
				check_time();
				if (r <= 0)
					continue;
			}
			if (ibv_get_cq_event(c->ch, &cq, &ctx)) {
				if (pat == FD_SEND && (errno == EAGAIN || errno == EWOULDBLOCK))
					continue;
				fail("ibv_get_cq_event: %s", strerror(errno));
			}
			ibv_ack_cq_events(cq, 1);
			if (ibv_req_notify_cq(c->rcq, 0))
				fail("ibv_req_notify_cq: %s", strerror(errno));
			drain_recvs(c, imm);
		}
	}
	c->recvs--;
	post_recv(c);
}

/* The last byte of the receive area, spun on without a verbs call. */
static void spin_byte(struct conn *c, uint8_t want)
{
	volatile uint8_t *b = rbuf(c) + size - 1;
	unsigned spins = 0;

	waiting_for = "the peer's RDMA Write (last byte of the buffer)";
	while (*b != want)
		if (++spins % 65536 == 0)
			check_time();
}

/* Busy-polls the send CQ until every request posted has completed (each
 * one signaled). */
static void wait_sends(struct conn *c)
{
	unsigned spins = 0;

	waiting_for = "the Write's completion";
	while (c->sig_done < c->posted)
		if (!reap_sends(c) && ++spins % 4096 == 0)
			check_time();
}

static uint8_t mark(unsigned i)
{
	return (uint8_t)(i % 255 + 1);
}

/* One exchange of the ping-pong; the client starts it, the server answers. */
static void ping(struct conn *c, unsigned i, int client)
{
	uint64_t raddr = c->peer.addr + size;	/* the peer's receive area */
	uint8_t m = mark(i);

	if (!client) {
		if (pat == MEM_WRITE || pat == POLL_WRITE)
			spin_byte(c, m);
		else
			wait_recv(c, i);
	}
	switch (pat) {
	case MEM_WRITE:
		c->buf[size - 1] = m;
		post(c, IBV_WR_RDMA_WRITE, raddr, size, 0, 0);
		break;
	case POLL_WRITE:
		c->buf[size - 1] = m;
		post(c, IBV_WR_RDMA_WRITE, raddr, size, 0, 1);
		wait_sends(c);
		break;
	case CHAN_WRITE:
		post(c, IBV_WR_RDMA_WRITE_WITH_IMM, raddr, size, i, 0);
		break;
	default:
		post(c, IBV_WR_SEND, 0, size, 0, 0);
		break;
	}
	if (client) {
		if (pat == MEM_WRITE || pat == POLL_WRITE)
			spin_byte(c, m);
		else
			wait_recv(c, i);
	}
	reap_sends(c);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void report(double *t)
{
	double sum = 0;
	size_t p99 = (size_t)(0.99 * iters);
	unsigned i;

	for (i = 0; i < iters; i++)
		sum += t[i];
	qsort(t, iters, sizeof(*t), cmp_double);
	if (p99 >= iters)
		p99 = iters - 1;
	printf("lat pattern=%s size=%u iters=%u typical_us=%.2f p99_us=%.2f avg_us=%.2f\n",
	       names[pat], size, iters, t[iters / 2], t[p99], sum / iters);
	fflush(stdout);
}

/* The phases of a connection cycle, in order, as the connect pattern's client times them. */
#define CYCLE_PHASES 6
static int print_cycles;

static const char *const phase_names[CYCLE_PHASES] = {
	"resolve", "qp", "established", "message", "disconnected", "destroy",
};

/* One line of each phase's median (ph: CYCLE_PHASES runs of iters times). */
static void report_phases(double *ph)
{
	unsigned k;

	printf("phases");
	for (k = 0; k < CYCLE_PHASES; k++) {
		qsort(ph + (size_t)k * iters, iters, sizeof(*ph), cmp_double);
		printf(" %s_us=%.1f", phase_names[k], ph[(size_t)k * iters + iters / 2]);
	}
	printf("\n");
	fflush(stdout);
}

static int is_remote(void)
{
	return pat == SLEEP_READ || pat == SLEEP_WRITE || pat == BUSY_READ;
}

/* ---- one connection: every pattern but connect ---------------------------- */

static volatile uint64_t sink;

/* The server's side of the one-sided patterns: no verbs call until the
 * client's last Write sets the flag (busy) or it disconnects (sleep). */
static void serve_remote(struct conn *c)
{
	if (pat == BUSY_READ) {
		volatile uint8_t *f = flag(c);
		uint64_t x = 1;
		unsigned k;

		waiting_for = "the client's end flag (computing)";
		while (!*f) {
			for (k = 0; k < 4096; k++)
				x = x * 6364136223846793005ULL + 1442695040888963407ULL;
			sink = x;
		}
		return;
	}
	/* asleep in the kernel on the rdma_cm fd, which wakes only at the end */
	{
		struct pollfd p = { .fd = c->ev->fd, .events = POLLIN };

		waiting_for = "the client's disconnect (asleep)";
		while (poll(&p, 1, remaining_ms()) == 0 || (p.revents & POLLIN) == 0)
			check_time();
	}
}

static void run_one(struct conn *c, int client)
{
	double *t = calloc(iters, sizeof(*t)), t0;
	unsigned i, total = warm + iters;

	if (!t)
		fail("out of memory");
	/* marks the exchange in a scheduler trace (scripts/trace-wakes) */
	prctl(PR_SET_NAME, "lat-exchange");
	if (!is_remote()) {
		for (i = 0; i < total; i++) {
			t0 = now_us();
			ping(c, i, client);
			if (client && i >= warm)
				t[i - warm] = (now_us() - t0) / 2;
		}
	} else if (client) {
		struct ibv_wc wc;
		uint64_t raddr = c->peer.addr + size;
		enum ibv_wr_opcode op = pat == SLEEP_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
		unsigned spins;
		int n;

		for (i = 0; i < total; i++) {
			c->buf[size - 1] = mark(i);
			t0 = now_us();
			post(c, op, raddr, size, 0, 1);
			waiting_for = op == IBV_WR_RDMA_READ ? "an RDMA Read completion" :
							       "an RDMA Write completion";
			spins = 0;
			while ((n = ibv_poll_cq(c->scq, 1, &wc)) == 0)
				if (++spins % 4096 == 0)
					check_time();
			if (n < 0)
				fail("ibv_poll_cq: %d", n);
			if (i >= warm)
				t[i - warm] = now_us() - t0;
			check_wc(&wc, op == IBV_WR_RDMA_READ ? "RDMA Read" : "RDMA Write");
			c->sig_done++;
		}
		/* the end, as the busy server sees it: its flag set by a Write */
		*flag(c) = 1;
		{
			struct ibv_sge sge = { (uintptr_t)flag(c), 1, c->mr->lkey };
			struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
						  .opcode = IBV_WR_RDMA_WRITE,
						  .send_flags = IBV_SEND_SIGNALED }, *bad;

			wr.wr.rdma.remote_addr = c->peer.addr + 2 * (uint64_t)size;
			wr.wr.rdma.rkey = c->peer.rkey;
			if (ibv_post_send(c->id->qp, &wr, &bad))
				fail("ibv_post_send (end flag): %s", strerror(errno));
			waiting_for = "the end flag's RDMA Write completion";
			while ((n = ibv_poll_cq(c->scq, 1, &wc)) == 0)
				check_time();
			if (n < 0)
				fail("ibv_poll_cq: %d", n);
			check_wc(&wc, "RDMA Write (end flag)");
		}
	} else {
		serve_remote(c);
		if (pat == SLEEP_WRITE && rbuf(c)[size - 1] != mark(total - 1))
			fail("the last RDMA Write left %u in the buffer's last byte, want %u",
			     rbuf(c)[size - 1], mark(total - 1));
	}
	if (client) {
		report(t);
	}
	free(t);
}

static void server(const char *addr, const char *port)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_cm_id *listen;
	struct rdma_cm_event *e;
	struct conn c = { 0 };
	struct pdata mine;
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					 .rnr_retry_count = 7,
					 .private_data = &mine, .private_data_len = sizeof(mine) };
	int rv;
	unsigned i;

	rv = rdma_getaddrinfo(addr, port, &hints, &ai);
	if (rv)
		fail("rdma_getaddrinfo %s:%s: %s", addr, port, gai_strerror(rv));
	c.ev = rdma_create_event_channel();
	if (!c.ev)
		fail("rdma_create_event_channel: %s", strerror(errno));
	nonblock(c.ev->fd);
	if (rdma_create_id(c.ev, &listen, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listen, ai->ai_src_addr) || rdma_listen(listen, 8))
		fail("listen on %s:%s: %s", addr, port, strerror(errno));
	rdma_freeaddrinfo(ai);
	printf("lat server listening\n");
	fflush(stdout);
	e = expect_cm(c.ev, RDMA_CM_EVENT_CONNECT_REQUEST, 1);
	if (e->param.conn.private_data_len < sizeof(c.peer))
		fail("connect request with %u bytes of private data", e->param.conn.private_data_len);
	memcpy(&c.peer, e->param.conn.private_data, sizeof(c.peer));
	setup(&c, e->id);
	for (i = 0; i < RQ_DEPTH; i++)
		post_recv(&c);
	mine = (struct pdata){ (uintptr_t)c.buf, c.mr->rkey, (uint32_t)c.len };
	if (rdma_accept(e->id, &param))
		fail("rdma_accept: %s", strerror(errno));
	rdma_ack_cm_event(e);
	expect_cm(c.ev, RDMA_CM_EVENT_ESTABLISHED, 0);
	run_one(&c, 0);
	expect_cm(c.ev, RDMA_CM_EVENT_DISCONNECTED, 0);
	teardown(&c);
	rdma_destroy_id(listen);
	rdma_destroy_event_channel(c.ev);
	printf("lat server done\n");
}

static struct rdma_cm_id *resolve(struct rdma_event_channel *ev, const char *addr,
				  const char *port)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_cm_id *id;
	int rv;

	rv = rdma_getaddrinfo(addr, port, &hints, &ai);
	if (rv)
		fail("rdma_getaddrinfo %s:%s: %s", addr, port, gai_strerror(rv));
	if (rdma_create_id(ev, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 5000))
		fail("rdma_resolve_addr: %s", strerror(errno));
	rdma_freeaddrinfo(ai);
	expect_cm(ev, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	if (rdma_resolve_route(id, 5000))
		fail("rdma_resolve_route: %s", strerror(errno));
	expect_cm(ev, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	return id;
}

static void client(const char *addr, const char *port)
{
	struct conn c = { 0 };
	struct rdma_cm_event *e;
	struct pdata mine;
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					 .retry_count = 7, .rnr_retry_count = 7,
					 .private_data = &mine, .private_data_len = sizeof(mine) };
	unsigned i;

	c.ev = rdma_create_event_channel();
	if (!c.ev)
		fail("rdma_create_event_channel: %s", strerror(errno));
	nonblock(c.ev->fd);
	setup(&c, resolve(c.ev, addr, port));
	for (i = 0; i < RQ_DEPTH; i++)
		post_recv(&c);
	mine = (struct pdata){ (uintptr_t)c.buf, c.mr->rkey, (uint32_t)c.len };
	if (rdma_connect(c.id, &param))
		fail("rdma_connect: %s", strerror(errno));
	e = expect_cm(c.ev, RDMA_CM_EVENT_ESTABLISHED, 1);
	if (e->param.conn.private_data_len < sizeof(c.peer))
		fail("accept with %u bytes of private data", e->param.conn.private_data_len);
	memcpy(&c.peer, e->param.conn.private_data, sizeof(c.peer));
	rdma_ack_cm_event(e);
	if (c.peer.len < 2 * (uint64_t)size + 1)
		fail("the server's buffer of %u bytes is too small", c.peer.len);
	run_one(&c, 1);
	if (rdma_disconnect(c.id))
		fail("rdma_disconnect: %s", strerror(errno));
	expect_cm(c.ev, RDMA_CM_EVENT_DISCONNECTED, 0);
	teardown(&c);
	rdma_destroy_event_channel(c.ev);
}

/* ---- connect: connections in turn ------------------------------------------- */

/* What every connection of the connect pattern shares: one PD, CQ and
 * buffer on the device of the first. */
struct shared {
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_comp_channel *ch;	/* server: waited on beside the rdma_cm fd */
	struct ibv_mr *mr;
	uint8_t *buf;
};

static void shared_setup(struct shared *s, struct ibv_context *verbs, int chan)
{
	if (s->verbs) {
		if (s->verbs != verbs)
			fail("a connection on another device context than the first");
		return;
	}
	s->verbs = verbs;
	s->pd = ibv_alloc_pd(verbs);
	if (!s->pd)
		fail("ibv_alloc_pd: %s", strerror(errno));
	if (chan) {
		s->ch = ibv_create_comp_channel(verbs);
		if (!s->ch)
			fail("ibv_create_comp_channel: %s", strerror(errno));
		nonblock(s->ch->fd);
	}
	s->cq = ibv_create_cq(verbs, 16, NULL, s->ch, 0);
	if (!s->cq)
		fail("ibv_create_cq: %s", strerror(errno));
	if (chan && ibv_req_notify_cq(s->cq, 0))
		fail("ibv_req_notify_cq: %s", strerror(errno));
	s->buf = aligned_alloc(4096, 2 * (size_t)size + 4096);
	if (!s->buf)
		fail("out of memory");
	memset(s->buf, 0, 2 * (size_t)size);
	s->mr = ibv_reg_mr(s->pd, s->buf, 2 * (size_t)size, IBV_ACCESS_LOCAL_WRITE);
	if (!s->mr)
		fail("ibv_reg_mr: %s", strerror(errno));
}

static void shared_qp(struct shared *s, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = s->cq, .recv_cq = s->cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_sge sge = { (uintptr_t)s->buf + size, size, s->mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	if (rdma_create_qp(id, s->pd, &qa))
		fail("rdma_create_qp: %s", strerror(errno));
	if (ibv_post_recv(id->qp, &wr, &bad))
		fail("ibv_post_recv: %s", strerror(errno));
}

static void shared_send(struct shared *s, struct rdma_cm_id *id)
{
	struct ibv_sge sge = { (uintptr_t)s->buf, size, s->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	if (ibv_post_send(id->qp, &wr, &bad))
		fail("ibv_post_send: %s", strerror(errno));
}

static void shared_free(struct shared *s)
{
	if (!s->verbs)
		return;
	if (ibv_dereg_mr(s->mr) || ibv_destroy_cq(s->cq) ||
	    (s->ch && ibv_destroy_comp_channel(s->ch)) || ibv_dealloc_pd(s->pd))
		fail("releasing the shared resources: %s", strerror(errno));
	free(s->buf);
}

/* A completion of the connect pattern: a Send or a receive of SIZE bytes. */
static int check_cycle_wc(const struct ibv_wc *wc)
{
	check_wc(wc, wc->opcode == IBV_WC_SEND ? "Send" : "receive");
	if (wc->opcode == IBV_WC_RECV && wc->byte_len != size)
		fail("received %u bytes, want %u", wc->byte_len, size);
	return wc->opcode == IBV_WC_RECV;
}

#define MAX_OPEN 8

/* The server accepts the connections in turn and answers each one's Send;
 * it waits in poll() on the rdma_cm fd and its completion channel at once,
 * as a server with many connections would. A connection's DISCONNECTED may
 * come after the next one's request. */
static void connect_server(const char *addr, const char *port)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_event_channel *ev = rdma_create_event_channel();
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					 .rnr_retry_count = 7 };
	struct shared s = { 0 };
	struct rdma_cm_id *listen, *open[MAX_OPEN] = { 0 };
	unsigned total = warm + iters, accepted = 0, closed = 0, k;
	int rv;

	rv = rdma_getaddrinfo(addr, port, &hints, &ai);
	if (rv)
		fail("rdma_getaddrinfo %s:%s: %s", addr, port, gai_strerror(rv));
	if (!ev)
		fail("rdma_create_event_channel: %s", strerror(errno));
	nonblock(ev->fd);
	if (rdma_create_id(ev, &listen, NULL, RDMA_PS_TCP))
		fail("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listen, ai->ai_src_addr) || rdma_listen(listen, 8))
		fail("listen on %s:%s: %s", addr, port, strerror(errno));
	rdma_freeaddrinfo(ai);
	printf("lat server listening\n");
	fflush(stdout);
	waiting_for = "connections";
	while (closed < total) {
		struct pollfd p[2] = { { .fd = ev->fd, .events = POLLIN },
				       { .fd = s.ch ? s.ch->fd : -1, .events = POLLIN } };
		struct rdma_cm_event *e;
		struct rdma_cm_id *id;
		struct ibv_cq *cq;
		struct ibv_wc wc;
		void *ctx;
		int n;

		if (poll(p, 2, remaining_ms()) < 0 && errno != EINTR)
			fail("poll: %s", strerror(errno));
		check_time();
		if (s.ch && ibv_get_cq_event(s.ch, &cq, &ctx) == 0) {
			ibv_ack_cq_events(cq, 1);
			if (ibv_req_notify_cq(s.cq, 0))
				fail("ibv_req_notify_cq: %s", strerror(errno));
		}
		while (s.cq && (n = ibv_poll_cq(s.cq, 1, &wc)) != 0) {
			if (n < 0)
				fail("ibv_poll_cq: %d", n);
			if (!check_cycle_wc(&wc))
				continue;
			for (k = 0; k < MAX_OPEN && !(open[k] && open[k]->qp->qp_num == wc.qp_num); k++)
				;
			if (k == MAX_OPEN)
				fail("a receive on QP %u, which is not an open connection's", wc.qp_num);
			shared_send(&s, open[k]);
		}
		if (rdma_get_cm_event(ev, &e)) {
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				fail("rdma_get_cm_event: %s", strerror(errno));
			continue;
		}
		id = e->id;
		switch (e->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			for (k = 0; k < MAX_OPEN && open[k]; k++)
				;
			if (k == MAX_OPEN)
				fail("connect request %u while %u connections are open", accepted + 1, MAX_OPEN);
			shared_setup(&s, id->verbs, 1);
			shared_qp(&s, id);
			if (rdma_accept(id, &param))
				fail("rdma_accept: %s", strerror(errno));
			open[k] = id;
			accepted++;
			rdma_ack_cm_event(e);
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			rdma_ack_cm_event(e);
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			for (k = 0; k < MAX_OPEN && open[k] != id; k++)
				;
			if (k == MAX_OPEN)
				fail("DISCONNECTED of a connection that is not open");
			rdma_ack_cm_event(e);
			rdma_destroy_qp(id);
			rdma_destroy_id(id);
			open[k] = NULL;
			closed++;
			break;
		default:
			fail("rdma_cm event %s (status %d) at connection %u", rdma_event_str(e->event),
			     e->status, accepted);
		}
	}
	shared_free(&s);
	rdma_destroy_id(listen);
	rdma_destroy_event_channel(ev);
	printf("lat server done\n");
}

static void connect_client(const char *addr, const char *port)
{
	struct rdma_event_channel *ev = rdma_create_event_channel();
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					 .retry_count = 7, .rnr_retry_count = 7 };
	struct shared s = { 0 };
	double *t = calloc(iters, sizeof(*t)), t0;
	double *ph = calloc((size_t)iters * CYCLE_PHASES, sizeof(*ph)), tp[CYCLE_PHASES + 1];
	unsigned i, total = warm + iters, spins, k;

	if (!ev || !t || !ph)
		fail("rdma_create_event_channel: %s", strerror(errno));
	nonblock(ev->fd);
	for (i = 0; i < total; i++) {
		struct rdma_cm_id *id;
		struct ibv_wc wc;
		int recvd = 0, sent = 0, n;

		t0 = now_us();
		tp[0] = t0;
		id = resolve(ev, addr, port);
		tp[1] = now_us();
		shared_setup(&s, id->verbs, 0);
		shared_qp(&s, id);
		tp[2] = now_us();
		if (rdma_connect(id, &param))
			fail("rdma_connect: %s", strerror(errno));
		expect_cm(ev, RDMA_CM_EVENT_ESTABLISHED, 0);
		tp[3] = now_us();
		shared_send(&s, id);
		waiting_for = "the Send's completion and the reply";
		spins = 0;
		while (!recvd || !sent) {
			n = ibv_poll_cq(s.cq, 1, &wc);
			if (n < 0)
				fail("ibv_poll_cq: %d", n);
			if (n == 0) {
				if (++spins % 4096 == 0)
					check_time();
				continue;
			}
			if (check_cycle_wc(&wc))
				recvd = 1;
			else
				sent = 1;
		}
		tp[4] = now_us();
		if (rdma_disconnect(id))
			fail("rdma_disconnect: %s", strerror(errno));
		expect_cm(ev, RDMA_CM_EVENT_DISCONNECTED, 0);
		tp[5] = now_us();
		rdma_destroy_qp(id);
		rdma_destroy_id(id);
		tp[6] = now_us();
		if (i >= warm) {
			t[i - warm] = tp[6] - t0;
			for (k = 0; k < CYCLE_PHASES; k++)
				ph[(size_t)k * iters + i - warm] = tp[k + 1] - tp[k];
			if (print_cycles) {
				printf("cycle %u", i - warm);
				for (k = 0; k <= CYCLE_PHASES; k++)
					printf(" %.1f", tp[k]);
				printf("\n");
			}
		}
	}
	shared_free(&s);
	rdma_destroy_event_channel(ev);
	report(t);
	report_phases(ph);
	free(ph);
	free(t);
}

static unsigned num(const char *s, unsigned min, unsigned max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max || *s == '-') {
		fprintf(stderr, "lat: bad number '%s' (%u to %u); " USAGE "\n", s, min, max);
		exit(2);
	}
	return (unsigned)v;
}

int main(int argc, char **argv)
{
	int is_client, o, i;

	if (argc < 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, USAGE "\n");
		return 2;
	}
	is_client = !strcmp(argv[1], "client");
	optind = 4;
	while ((o = getopt(argc, argv, "p:s:n:t:T")) != -1) {
		switch (o) {
		case 'p':
			for (i = 0; i < NPATTERNS && strcmp(optarg, names[i]); i++)
				;
			if (i == NPATTERNS) {
				fprintf(stderr, "lat: unknown pattern '%s'; " USAGE "\n", optarg);
				return 2;
			}
			pat = i;
			break;
		case 's':
			size = num(optarg, 1, 1u << 26);
			break;
		case 'n':
			iters = num(optarg, 1, 100000000);
			break;
		case 't':
			limit = num(optarg, 1, 86400);
			break;
		case 'T':
			print_cycles = 1;
			break;
		default:
			fprintf(stderr, USAGE "\n");
			return 2;
		}
	}
	if (optind != argc || pat == NPATTERNS) {
		fprintf(stderr, "lat: %s; " USAGE "\n", optind != argc ? "stray argument" : "-p is required");
		return 2;
	}
	warm = pat == CONNECT ? 1 : 10;
	deadline = now_us() + limit * 1e6;
	signal(SIGALRM, on_alarm);
	alarm(limit + 1);
	if (pat == CONNECT) {
		if (is_client)
			connect_client(argv[2], argv[3]);
		else
			connect_server(argv[2], argv[3]);
	} else if (is_client) {
		client(argv[2], argv[3]);
	} else {
		server(argv[2], argv[3]);
	}
	return 0;
}
