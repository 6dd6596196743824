// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Exercises a urdma device through unmodified libibverbs (link with
 * -libverbs only).
 *
 *   objects DEVICE cycle N   open the device, then N times create and destroy
 *                            PD, MR, CQ and an RC QP (taken to INIT and
 *                            queried, then to SQD as rdma_disconnect does,
 *                            which leaves it in INIT); reopens the device
 *                            every 100 rounds
 *   objects DEVICE errors    each invalid request must fail with the errno
 *                            the kernel's verbs rules give it (SRQs'
 *                            included), the verbs urdma does not implement
 *                            with EOPNOTSUPP, a send posted to a QP that
 *                            is not connected with EINVAL, and a receive
 *                            posted to a full receive queue with ENOMEM
 *
 * Prints one line per failed check and exits 1 if any failed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static int failures;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond)) {                                                 \
			printf("FAIL %s:%d: ", __func__, __LINE__);            \
			printf(__VA_ARGS__);                                   \
			printf("\n");                                          \
			failures++;                                            \
		}                                                              \
	} while (0)

static struct ibv_context *open_by_name(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	int i;

	if (!list) {
		printf("FAIL ibv_get_device_list: %s\n", strerror(errno));
		exit(1);
	}
	for (i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx) {
		printf("FAIL cannot open %s: %s\n", name, strerror(errno));
		exit(1);
	}
	return ctx;
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, int sge)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = sge, .max_recv_sge = 1 },
	};

	return ibv_create_qp(pd, &init);
}

/* One full round of object creation and destruction; 0 when all held. */
static int one_round(struct ibv_context *ctx, void *buf, size_t len)
{
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				    .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	struct ibv_qp_init_attr init;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	int before = failures, ret;

	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd: %s", strerror(errno));
	if (!pd)
		return -1;
	mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "reg_mr: %s", strerror(errno));
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq, "create_cq: %s", strerror(errno));
	qp = cq ? rc_qp(pd, cq, 1) : NULL;
	CHECK(qp, "create_qp: %s", strerror(errno));
	if (mr)
		CHECK(mr->lkey && mr->length == len, "mr lkey %u length %zu",
		      mr->lkey, mr->length);
	if (qp) {
		ret = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX);
		CHECK(!ret, "modify_qp to INIT: %s", strerror(ret));
		memset(&attr, 0, sizeof(attr));
		ret = ibv_query_qp(qp, &attr, IBV_QP_STATE | IBV_QP_CAP, &init);
		CHECK(!ret, "query_qp: %s", strerror(ret));
		CHECK(!ret && attr.qp_state == IBV_QPS_INIT,
		      "query_qp state %d, want INIT", attr.qp_state);
		/*
		 * rdma_disconnect moves the QP to SQD whatever became of its
		 * connection: on one that never had one, as with siw, that
		 * succeeds and changes nothing.
		 */
		attr.qp_state = IBV_QPS_SQD;
		ret = ibv_modify_qp(qp, &attr, IBV_QP_STATE);
		CHECK(!ret, "modify_qp to SQD, never connected: %s",
		      strerror(ret));
		memset(&attr, 0, sizeof(attr));
		ret = ibv_query_qp(qp, &attr, IBV_QP_STATE, &init);
		CHECK(!ret && attr.qp_state == IBV_QPS_INIT,
		      "query_qp state %d after SQD, want INIT", attr.qp_state);
		ret = ibv_destroy_qp(qp);
		CHECK(!ret, "destroy_qp: %s", strerror(ret));
	}
	if (cq) {
		ret = ibv_destroy_cq(cq);
		CHECK(!ret, "destroy_cq: %s", strerror(ret));
	}
	if (mr) {
		ret = ibv_dereg_mr(mr);
		CHECK(!ret, "dereg_mr: %s", strerror(ret));
	}
	ret = ibv_dealloc_pd(pd);
	CHECK(!ret, "dealloc_pd: %s", strerror(ret));
	return failures == before ? 0 : -1;
}

static void cycle(const char *name, long rounds)
{
	static char buf[65536];
	struct ibv_context *ctx = NULL;
	long i;

	for (i = 0; i < rounds; i++) {
		if (i % 100 == 0) {
			if (ctx)
				CHECK(!ibv_close_device(ctx), "close_device");
			ctx = open_by_name(name);
		}
		if (one_round(ctx, buf, sizeof(buf))) {
			printf("FAIL round %ld\n", i);
			break;
		}
	}
	CHECK(!ibv_close_device(ctx), "close_device");
}

#define EXPECT_NULL_ERRNO(expr, want, what)                                    \
	do {                                                                   \
		void *p_;                                                      \
		errno = 0;                                                     \
		p_ = (expr);                                                   \
		CHECK(!p_ && errno == (want), "%s: got %s (%s), want %s",     \
		      what, p_ ? "an object" : "NULL", strerror(errno),        \
		      strerror(want));                                         \
	} while (0)

/* An SRQ's invalid requests, and what a QP on it refuses. */
static void srq_errors(struct ibv_pd *pd, struct ibv_cq *cq, const struct ibv_device_attr *dev)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_send_sge = 1 },
	};
	struct ibv_srq_attr a = { .max_wr = 8, .srq_limit = 5 };
	struct ibv_recv_wr rw = { .num_sge = dev->max_srq_sge + 1 }, *bad = NULL;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	int ret;

	sa.attr.max_wr = dev->max_srq_wr + 1;
	EXPECT_NULL_ERRNO(ibv_create_srq(pd, &sa), EINVAL, "SRQ above max_srq_wr");
	sa.attr.max_wr = 4;
	sa.attr.max_sge = dev->max_srq_sge + 1;
	EXPECT_NULL_ERRNO(ibv_create_srq(pd, &sa), EINVAL, "SRQ above max_srq_sge");
	sa.attr.max_sge = 1;
	srq = ibv_create_srq(pd, &sa);
	CHECK(srq, "create_srq: %s", strerror(errno));
	if (!srq)
		return;
	ret = ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT);
	CHECK(ret == EINVAL, "SRQ limit above max_wr: got %s, want %s", strerror(ret),
	      strerror(EINVAL));
	ret = ibv_modify_srq(srq, &a, IBV_SRQ_MAX_WR);
	CHECK(ret == EOPNOTSUPP, "resizing an SRQ: got %s, want %s", strerror(ret),
	      strerror(EOPNOTSUPP));
	ret = ibv_post_srq_recv(srq, &rw, &bad);
	CHECK(ret == EINVAL && bad == &rw, "SRQ receive above max_sge: got %s, bad_wr %s",
	      strerror(ret), bad == &rw ? "set" : "not set");
	qa.srq = srq;
	qp = ibv_create_qp(pd, &qa);
	CHECK(qp, "create_qp on an SRQ: %s", strerror(errno));
	if (qp) {
		rw.num_sge = 0;
		bad = NULL;
		ret = ibv_post_recv(qp, &rw, &bad);
		CHECK(ret == EINVAL && bad == &rw, "post_recv on a QP on an SRQ: got %s",
		      strerror(ret));
		ret = ibv_destroy_srq(srq);
		CHECK(ret == EBUSY, "destroy_srq with a QP on it: got %s, want %s",
		      strerror(ret), strerror(EBUSY));
		CHECK(!ibv_destroy_qp(qp), "destroy_qp");
	}
	CHECK(!ibv_destroy_srq(srq), "destroy_srq");
}

/*
 * Memory windows' invalid requests at the API: a type the verbs do not have,
 * binds of a window to a QP that was never connected.
 */
static void mw_errors(struct ibv_pd *pd, struct ibv_cq *cq)
{
	static char mem[4096];
	struct ibv_mw *mw1, *mw2;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	int ret;

	EXPECT_NULL_ERRNO(ibv_alloc_mw(pd, (enum ibv_mw_type)3), EINVAL, "MW of type 3");
	mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw1 && mw2, "alloc_mw: %s", strerror(errno));
	mr = ibv_reg_mr(pd, mem, sizeof(mem), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	qp = rc_qp(pd, cq, 1);
	CHECK(mr && qp, "reg_mr/create_qp: %s", strerror(errno));
	if (mw1 && mw2 && mr && qp) {
		struct ibv_mw_bind b = {
			.bind_info = { .mr = mr, .addr = (uintptr_t)mem, .length = 64,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
		};
		uint32_t rkey = mw1->rkey;

		ret = ibv_bind_mw(qp, mw1, &b);
		CHECK(ret == EINVAL && mw1->rkey == rkey,
		      "bind_mw on a QP never connected: got %s, rkey %s", strerror(ret),
		      mw1->rkey == rkey ? "kept" : "changed");
		/* libibverbs' own check: ibv_bind_mw is for type 1 windows. */
		ret = ibv_bind_mw(qp, mw2, &b);
		CHECK(ret == EINVAL, "bind_mw of a type 2 window: got %s", strerror(ret));
	}
	CHECK(!qp || !ibv_destroy_qp(qp), "destroy_qp");
	CHECK(!mr || !ibv_dereg_mr(mr), "dereg_mr");
	CHECK(!mw1 || !ibv_dealloc_mw(mw1), "dealloc_mw type 1");
	CHECK(!mw2 || !ibv_dealloc_mw(mw2), "dealloc_mw type 2");
}

/*
 * Receives wait on a QP before it connects, as many as its receive queue
 * holds: one more is refused with ENOMEM, as rxe and siw refuse a post to
 * a full queue.
 */
static void full_recv_queue(struct ibv_qp *qp)
{
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr attr;
	struct ibv_recv_wr rw = { .wr_id = 1 }, *bad = NULL;
	unsigned int i;
	int ret;

	ret = ibv_query_qp(qp, &attr, IBV_QP_CAP, &init);
	CHECK(!ret, "query_qp: %s", strerror(ret));
	if (ret)
		return;
	for (i = 0; i < init.cap.max_recv_wr; i++) {
		ret = ibv_post_recv(qp, &rw, &bad);
		CHECK(!ret, "post_recv %u of %u before connecting: %s", i + 1,
		      init.cap.max_recv_wr, strerror(ret));
		if (ret)
			return;
	}
	ret = ibv_post_recv(qp, &rw, &bad);
	CHECK(ret == ENOMEM && bad == &rw,
	      "post_recv to a full receive queue: got %s, want %s, bad_wr %s",
	      strerror(ret), strerror(ENOMEM), bad == &rw ? "set" : "not set");
}

static void errors(const char *name)
{
	static char buf[8192];
	struct ibv_context *ctx = open_by_name(name);
	struct ibv_device_attr dev;
	struct ibv_qp_init_attr ud = { .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8 };
	struct ibv_send_wr swr = { .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND }, *bad = NULL;
	struct ibv_wc wc;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	int ret;

	ret = ibv_query_device(ctx, &dev);
	CHECK(!ret, "query_device: %s", strerror(ret));
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (ret || !pd || !cq) {
		printf("FAIL setup: %s\n", strerror(errno));
		exit(1);
	}
	ud.send_cq = ud.recv_cq = cq;

	/* Verbs forbids remote write without local write (IB spec 10.6.3.1). */
	EXPECT_NULL_ERRNO(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE),
			  EINVAL, "MR with remote but not local write");
	EXPECT_NULL_ERRNO(ibv_create_cq(ctx, dev.max_cqe + 1, NULL, NULL, 0),
			  EINVAL, "CQ above max_cqe");
	/* iWARP has only RC QPs; like siw, urdma refuses the others. */
	EXPECT_NULL_ERRNO(ibv_create_qp(pd, &ud), EOPNOTSUPP, "UD QP");
	EXPECT_NULL_ERRNO(rc_qp(pd, cq, dev.max_sge + 1), EINVAL,
			  "QP above max_sge");

	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr: %s", strerror(errno));
	ret = ibv_dealloc_pd(pd);
	CHECK(ret == EBUSY, "dealloc_pd with a live MR: got %s, want %s",
	      strerror(ret), strerror(EBUSY));

	srq_errors(pd, cq, &dev);
	mw_errors(pd, cq);
	/* A QP that was never connected takes no send. */
	qp = rc_qp(pd, cq, 1);
	CHECK(qp, "create_qp: %s", strerror(errno));
	if (qp) {
		ret = ibv_post_send(qp, &swr, &bad);
		CHECK(ret == EINVAL && bad == &swr,
		      "post_send before connecting: got %s, bad_wr %s", strerror(ret),
		      bad == &swr ? "set" : "not set");
		full_recv_queue(qp);
		CHECK(!ibv_destroy_qp(qp), "destroy_qp");
	}
	ret = ibv_poll_cq(cq, 1, &wc);
	CHECK(ret == 0, "poll_cq of an empty CQ: got %d, want 0", ret);
	ret = ibv_req_notify_cq(cq, 0);
	CHECK(ret == 0, "req_notify_cq: got %s", strerror(ret));

	/* Everything still releases in order afterwards. */
	CHECK(!mr || !ibv_dereg_mr(mr), "dereg_mr");
	CHECK(!ibv_destroy_cq(cq), "destroy_cq");
	CHECK(!ibv_dealloc_pd(pd), "dealloc_pd after the MR is gone");
	CHECK(!ibv_close_device(ctx), "close_device");
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[2], "cycle"))
		cycle(argv[1], strtol(argv[3], NULL, 0));
	else if (argc == 3 && !strcmp(argv[2], "errors"))
		errors(argv[1]);
	else {
		fprintf(stderr, "usage: %s DEVICE cycle N | DEVICE errors\n", argv[0]);
		return 2;
	}
	if (failures)
		printf("%d check(s) failed\n", failures);
	else
		printf("%s: all checks passed\n", argv[2]);
	return failures ? 1 : 0;
}
