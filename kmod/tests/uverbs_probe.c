// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Drives urdma.ko through the raw uverbs write() commands, without
 * libibverbs or the provider, so that the kernel side can be tested on
 * its own: the ABI handshake, object bookkeeping, limits and errno values.
 *
 *   uverbs_probe DEV info          print the context reply and limits
 *   uverbs_probe DEV cycle N       create and destroy PD/MR/CQ/QP N times
 *   uverbs_probe DEV errors        every refusal gets the expected errno
 *   uverbs_probe DEV limits CTX    every object count stops at its limit
 *                                  (CTX: the module's max_ctx)
 *   uverbs_probe DEV hold SECS     keep a context with objects, then exit
 *   uverbs_probe DEV notify        REQ_NOTIFY_CQ makes the CQ's completion
 *                                  channel readable, one event per call
 *
 * DEV is /dev/infiniband/uverbsN.  Exit status 0 means every check passed;
 * a failing check prints one line starting with "FAIL".
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/ib_user_verbs.h>

#include "../urdma-abi.h"

/*
 * QP states and modify masks travel as the IB numeric values; the uapi
 * headers do not name them.
 */
enum { QPS_RESET, QPS_INIT, QPS_RTR, QPS_RTS, QPS_SQD, QPS_SQE, QPS_ERR };
enum {
	QP_STATE = 1 << 0,
	QP_CUR_STATE = 1 << 1,
	QP_ACCESS_FLAGS = 1 << 3,
	QP_MAX_QP_RD_ATOMIC = 1 << 13,
};

static int dev_fd;
static int failures;
static struct ib_uverbs_query_device_resp dev_attr;

/*
 * One legacy write() command.  The core response and the driver's private
 * response are laid out back to back in @resp, which is how the kernel
 * splits them (core part first, udata after it).
 */
static int uverbs_cmd(__u32 command, void *req, size_t req_len,
		      void *resp, size_t resp_len)
{
	struct {
		struct ib_uverbs_cmd_hdr hdr;
		unsigned char body[512];
	} buf;

	if (req_len > sizeof(buf.body) || (req_len | resp_len) % 4) {
		fprintf(stderr, "FAIL bad command layout %u\n", command);
		exit(2);
	}
	buf.hdr.command = command;
	buf.hdr.in_words = (sizeof(buf.hdr) + req_len) / 4;
	buf.hdr.out_words = resp_len / 4;
	if (resp) {
		__u64 p = (uintptr_t)resp;

		memcpy(req, &p, sizeof(p));
	}
	memcpy(buf.body, req, req_len);
	if (write(dev_fd, &buf, sizeof(buf.hdr) + req_len) < 0)
		return -errno;
	return 0;
}

static void must(int rv, const char *what)
{
	if (rv) {
		printf("FAIL %s: %s\n", what, strerror(-rv));
		exit(1);
	}
}

/* Results are 0, a negative errno, or a non-negative value to compare. */
static const char *result_str(int rv)
{
	static char buf[2][64];
	static int n;

	n ^= 1;
	if (rv < 0)
		snprintf(buf[n], sizeof(buf[n]), "%s", strerror(-rv));
	else
		snprintf(buf[n], sizeof(buf[n]), "%d", rv);
	return buf[n];
}

static void expect(int rv, int want, const char *what)
{
	if (rv == want) {
		printf("ok   %s (%s)\n", what, result_str(want));
		return;
	}
	printf("FAIL %s: got %s, want %s\n", what, result_str(rv),
	       result_str(want));
	failures++;
}

static struct urdma_uresp_alloc_ctx get_context(void)
{
	struct ib_uverbs_get_context req = {};
	struct {
		struct ib_uverbs_get_context_resp core;
		struct urdma_uresp_alloc_ctx drv;
	} resp = {};
	struct ib_uverbs_query_device qreq = {};

	must(uverbs_cmd(IB_USER_VERBS_CMD_GET_CONTEXT, &req, sizeof(req),
			&resp, sizeof(resp)), "get_context");
	must(uverbs_cmd(IB_USER_VERBS_CMD_QUERY_DEVICE, &qreq, sizeof(qreq),
			&dev_attr, sizeof(dev_attr)), "query_device");
	return resp.drv;
}

static int alloc_pd(__u32 *pd)
{
	struct ib_uverbs_alloc_pd req = {};
	struct ib_uverbs_alloc_pd_resp resp = {};
	int rv = uverbs_cmd(IB_USER_VERBS_CMD_ALLOC_PD, &req, sizeof(req),
			    &resp, sizeof(resp));

	*pd = resp.pd_handle;
	return rv;
}

static int dealloc_pd(__u32 pd)
{
	struct ib_uverbs_dealloc_pd req = { .pd_handle = pd };

	return uverbs_cmd(IB_USER_VERBS_CMD_DEALLOC_PD, &req, sizeof(req),
			  NULL, 0);
}

static int reg_mr(__u32 pd, void *addr, __u64 len, __u32 access,
		  __u32 *mr)
{
	struct ib_uverbs_reg_mr req = {
		.start = (uintptr_t)addr,
		.length = len,
		.hca_va = (uintptr_t)addr,
		.pd_handle = pd,
		.access_flags = access,
	};
	struct ib_uverbs_reg_mr_resp resp = {};
	int rv = uverbs_cmd(IB_USER_VERBS_CMD_REG_MR, &req, sizeof(req),
			    &resp, sizeof(resp));

	*mr = resp.mr_handle;
	return rv;
}

static int dereg_mr(__u32 mr)
{
	struct ib_uverbs_dereg_mr req = { .mr_handle = mr };

	return uverbs_cmd(IB_USER_VERBS_CMD_DEREG_MR, &req, sizeof(req),
			  NULL, 0);
}

static int alloc_mw(__u32 pd, __u32 *mw)
{
	struct ib_uverbs_alloc_mw req = { .pd_handle = pd, .mw_type = 1 /* type 1 */ };
	struct ib_uverbs_alloc_mw_resp resp = {};
	int rv = uverbs_cmd(IB_USER_VERBS_CMD_ALLOC_MW, &req, sizeof(req),
			    &resp, sizeof(resp));

	*mw = resp.mw_handle;
	return rv;
}

static int dealloc_mw(__u32 mw)
{
	struct ib_uverbs_dealloc_mw req = { .mw_handle = mw };

	return uverbs_cmd(IB_USER_VERBS_CMD_DEALLOC_MW, &req, sizeof(req),
			  NULL, 0);
}

static int create_cq(__u32 cqe, __u32 *cq)
{
	struct ib_uverbs_create_cq req = { .cqe = cqe, .comp_channel = -1 };
	struct {
		struct ib_uverbs_create_cq_resp core;
		struct urdma_uresp_create_cq drv;
	} resp = {};
	int rv = uverbs_cmd(IB_USER_VERBS_CMD_CREATE_CQ, &req, sizeof(req),
			    &resp, sizeof(resp));

	*cq = resp.core.cq_handle;
	return rv;
}

/*
 * create_cq with urdma's request after the command: the CQ's arm word at
 * arm, of which drv_len bytes of the request are sent.
 */
static int create_cq_arm(__u64 arm, size_t drv_len, __u32 *cq)
{
	struct {
		struct ib_uverbs_create_cq core;
		struct urdma_ureq_create_cq drv;
	} req = {
		.core = { .cqe = 4, .comp_channel = -1 },
		.drv = { .arm_addr = arm },
	};
	struct {
		struct ib_uverbs_create_cq_resp core;
		struct urdma_uresp_create_cq drv;
	} resp = {};
	int rv = uverbs_cmd(IB_USER_VERBS_CMD_CREATE_CQ, &req,
			    sizeof(req.core) + drv_len, &resp, sizeof(resp));

	*cq = resp.core.cq_handle;
	return rv;
}

static int destroy_cq(__u32 cq)
{
	struct ib_uverbs_destroy_cq req = { .cq_handle = cq };
	struct ib_uverbs_destroy_cq_resp resp;

	return uverbs_cmd(IB_USER_VERBS_CMD_DESTROY_CQ, &req, sizeof(req),
			  &resp, sizeof(resp));
}

struct qp_req {
	__u32 pd, cq;
	__u8 type;
	__u32 send_wr, recv_wr, send_sge, recv_sge, inline_data;
};

static struct qp_req qp_defaults(__u32 pd, __u32 cq)
{
	struct qp_req q = {
		.pd = pd, .cq = cq, .type = IB_UVERBS_QPT_RC,
		.send_wr = 16, .recv_wr = 16, .send_sge = 1, .recv_sge = 1,
	};

	return q;
}

static int create_qp(const struct qp_req *q, __u32 *qp, __u32 *qpn)
{
	struct ib_uverbs_create_qp req = {
		.pd_handle = q->pd,
		.send_cq_handle = q->cq,
		.recv_cq_handle = q->cq,
		.max_send_wr = q->send_wr,
		.max_recv_wr = q->recv_wr,
		.max_send_sge = q->send_sge,
		.max_recv_sge = q->recv_sge,
		.max_inline_data = q->inline_data,
		.qp_type = q->type,
	};
	struct {
		struct ib_uverbs_create_qp_resp core;
		struct urdma_uresp_create_qp drv;
	} resp = {};
	int rv = uverbs_cmd(IB_USER_VERBS_CMD_CREATE_QP, &req, sizeof(req),
			    &resp, sizeof(resp));

	*qp = resp.core.qp_handle;
	if (qpn)
		*qpn = resp.core.qpn;
	if (!rv && resp.drv.qp_id != resp.core.qpn) {
		printf("FAIL %s: qp_id %u differs from qpn %u\n", __func__,
		       resp.drv.qp_id, resp.core.qpn);
		failures++;
	}
	return rv;
}

static int destroy_qp(__u32 qp)
{
	struct ib_uverbs_destroy_qp req = { .qp_handle = qp };
	struct ib_uverbs_destroy_qp_resp resp;

	return uverbs_cmd(IB_USER_VERBS_CMD_DESTROY_QP, &req, sizeof(req),
			  &resp, sizeof(resp));
}

static int modify_qp(__u32 qp, struct ib_uverbs_modify_qp *req)
{
	req->qp_handle = qp;
	return uverbs_cmd(IB_USER_VERBS_CMD_MODIFY_QP, req, sizeof(*req),
			  NULL, 0);
}

static int to_state(__u32 qp, __u8 state)
{
	struct ib_uverbs_modify_qp req = {
		.attr_mask = QP_STATE, .qp_state = state,
	};

	return modify_qp(qp, &req);
}

static int query_state(__u32 qp)
{
	struct ib_uverbs_query_qp req = {
		.qp_handle = qp, .attr_mask = QP_STATE,
	};
	struct ib_uverbs_query_qp_resp resp = {};
	int rv = uverbs_cmd(IB_USER_VERBS_CMD_QUERY_QP, &req, sizeof(req),
			    &resp, sizeof(resp));

	return rv ? rv : resp.qp_state;
}

static void *buffer(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		printf("FAIL mmap: %s\n", strerror(errno));
		exit(1);
	}
	memset(p, 0, len);
	return p;
}

#define RW_ACCESS (IB_UVERBS_ACCESS_LOCAL_WRITE | \
		   IB_UVERBS_ACCESS_REMOTE_WRITE | IB_UVERBS_ACCESS_REMOTE_READ)

static int do_info(void)
{
	struct urdma_uresp_alloc_ctx ctx = get_context();
	struct ib_uverbs_query_port preq = { .port_num = 1 };
	struct ib_uverbs_query_port_resp port = {};

	must(uverbs_cmd(IB_USER_VERBS_CMD_QUERY_PORT, &preq, sizeof(preq),
			&port, sizeof(port)), "query_port");
	printf("magic=0x%x\nabi_version=%u\ndev_id=%u\n", ctx.magic,
	       ctx.abi_version, ctx.dev_id);
	printf("max_qp=%u\nmax_qp_wr=%u\nmax_sge=%u\nmax_cq=%u\nmax_cqe=%u\n",
	       dev_attr.max_qp, dev_attr.max_qp_wr, dev_attr.max_sge,
	       dev_attr.max_cq, dev_attr.max_cqe);
	printf("max_mw=%u\n", dev_attr.max_mw);
	printf("max_mr=%u\nmax_pd=%u\nmax_mr_size=%llu\n", dev_attr.max_mr,
	       dev_attr.max_pd, (unsigned long long)dev_attr.max_mr_size);
	printf("max_qp_rd_atom=%u\nmax_qp_init_rd_atom=%u\n",
	       dev_attr.max_qp_rd_atom, dev_attr.max_qp_init_rd_atom);
	printf("port_state=%u\nlink_layer=%u\n", port.state, port.link_layer);
	/* Decoded the way rdma-core providers (and liburdma) do. */
	printf("fw_ver=%llu.%llu.%llu\n",
	       (unsigned long long)(dev_attr.fw_ver >> 32),
	       (unsigned long long)((dev_attr.fw_ver >> 16) & 0xffff),
	       (unsigned long long)(dev_attr.fw_ver & 0xffff));
	if (ctx.magic != URDMA_ABI_MAGIC || ctx.abi_version != URDMA_ABI_VERSION) {
		printf("FAIL context reply: magic 0x%x version %u\n",
		       ctx.magic, ctx.abi_version);
		return 1;
	}
	return 0;
}

static int do_cycle(long n)
{
	size_t len = 1 << 16;
	char *buf = buffer(len);
	__u32 pd, mr, cq, qp;
	long i;

	get_context();
	for (i = 0; i < n; i++) {
		struct qp_req q;

		must(alloc_pd(&pd), "alloc_pd");
		must(reg_mr(pd, buf, len, RW_ACCESS, &mr), "reg_mr");
		must(create_cq(16, &cq), "create_cq");
		q = qp_defaults(pd, cq);
		must(create_qp(&q, &qp, NULL), "create_qp");
		must(to_state(qp, QPS_INIT), "modify_qp INIT");
		must(destroy_qp(qp), "destroy_qp");
		must(destroy_cq(cq), "destroy_cq");
		must(dereg_mr(mr), "dereg_mr");
		must(dealloc_pd(pd), "dealloc_pd");
	}
	printf("ok   %ld create/destroy cycles\n", n);
	return failures != 0;
}

/* The arm word create_cq pins (docs/kernel-abi.md, "Private data"). */
static void check_cq_arm(void)
{
	static __u32 words[2] __attribute__((aligned(8)));
	char *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *gone = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	__u32 cq;

	if (ro == MAP_FAILED || gone == MAP_FAILED) {
		printf("FAIL mmap: %s\n", strerror(errno));
		exit(1);
	}
	munmap(gone, 4096);
	expect(create_cq_arm((uintptr_t)words, sizeof(__u64), &cq), 0,
	       "CQ with an arm word");
	expect(destroy_cq(cq), 0, "destroy CQ with an arm word");
	expect(create_cq_arm(0, sizeof(__u64), &cq), 0, "CQ with no arm word");
	expect(destroy_cq(cq), 0, "destroy CQ with no arm word");
	expect(create_cq_arm((uintptr_t)words + 2, sizeof(__u64), &cq), -EINVAL,
	       "CQ arm word not aligned");
	expect(create_cq_arm((uintptr_t)ro, sizeof(__u64), &cq), -EFAULT,
	       "CQ arm word read-only");
	expect(create_cq_arm((uintptr_t)gone, sizeof(__u64), &cq), -EFAULT,
	       "CQ arm word unmapped");
	expect(create_cq_arm((uintptr_t)words, sizeof(__u32), &cq), -EINVAL,
	       "CQ request cut short");
	munmap(ro, 4096);
}

static void check_qp_caps(__u32 pd, __u32 cq)
{
	struct qp_req q;
	__u32 qp;

	q = qp_defaults(pd, cq);
	q.type = IB_UVERBS_QPT_UD;
	expect(create_qp(&q, &qp, NULL), -EOPNOTSUPP, "UD QP refused");
	q.type = IB_UVERBS_QPT_UC;
	expect(create_qp(&q, &qp, NULL), -EOPNOTSUPP, "UC QP refused");
	q = qp_defaults(pd, cq);
	q.send_sge = dev_attr.max_sge + 1;
	expect(create_qp(&q, &qp, NULL), -EINVAL, "send SGEs > max_sge");
	q = qp_defaults(pd, cq);
	q.recv_sge = dev_attr.max_sge + 1;
	expect(create_qp(&q, &qp, NULL), -EINVAL, "recv SGEs > max_sge");
	q = qp_defaults(pd, cq);
	q.send_wr = dev_attr.max_qp_wr + 1;
	expect(create_qp(&q, &qp, NULL), -EINVAL, "send WRs > max_qp_wr");
	q = qp_defaults(pd, cq);
	q.recv_wr = dev_attr.max_qp_wr + 1;
	expect(create_qp(&q, &qp, NULL), -EINVAL, "recv WRs > max_qp_wr");
	q = qp_defaults(pd, cq);
	q.send_sge = dev_attr.max_sge;
	q.recv_sge = dev_attr.max_sge;
	q.send_wr = dev_attr.max_qp_wr;
	q.recv_wr = dev_attr.max_qp_wr;
	expect(create_qp(&q, &qp, NULL), 0, "QP at the limits");
	must(destroy_qp(qp), "destroy_qp");
}

static void check_qp_states(__u32 pd, __u32 cq)
{
	struct qp_req q = qp_defaults(pd, cq);
	struct ib_uverbs_modify_qp m;
	__u32 qp, qpn;

	must(create_qp(&q, &qp, &qpn), "create_qp");
	expect(qpn >= 2 ? 0 : -ERANGE, 0, "QP number not 0 or 1");
	expect(query_state(qp), QPS_RESET, "new QP is RESET");
	expect(to_state(qp, QPS_RTS), -EINVAL, "RESET -> RTS");
	expect(to_state(qp, QPS_RTR), -EINVAL, "RESET -> RTR");

	memset(&m, 0, sizeof(m));
	m.attr_mask = QP_STATE | QP_ACCESS_FLAGS;
	m.qp_state = QPS_INIT;
	m.qp_access_flags = RW_ACCESS;
	expect(modify_qp(qp, &m), 0, "RESET -> INIT with access flags");

	memset(&m, 0, sizeof(m));
	m.attr_mask = QP_MAX_QP_RD_ATOMIC;
	m.max_rd_atomic = dev_attr.max_qp_init_rd_atom + 1;
	expect(modify_qp(qp, &m), -EINVAL, "max_rd_atomic > ORD limit");
	m.max_rd_atomic = dev_attr.max_qp_init_rd_atom;
	expect(modify_qp(qp, &m), 0, "max_rd_atomic at ORD limit");

	memset(&m, 0, sizeof(m));
	m.attr_mask = QP_STATE | QP_CUR_STATE;
	m.qp_state = QPS_RTR;
	m.cur_qp_state = QPS_RESET;
	expect(modify_qp(qp, &m), -EINVAL, "stale cur_qp_state");

	expect(to_state(qp, QPS_RTR), 0, "INIT -> RTR");
	expect(to_state(qp, QPS_INIT), -EINVAL, "RTR -> INIT");
	expect(to_state(qp, QPS_RTS), 0, "RTR -> RTS");
	expect(query_state(qp), QPS_RTS, "query says RTS");
	expect(to_state(qp, QPS_SQD), 0, "RTS -> SQD");
	expect(to_state(qp, QPS_RTS), -EINVAL, "SQD -> RTS");
	expect(to_state(qp, QPS_ERR), 0, "SQD -> ERR");
	expect(to_state(qp, QPS_RTS), -EINVAL, "ERR -> RTS");
	/* rdma_disconnect after a failed connection: a no-op, as in siw */
	expect(to_state(qp, QPS_SQD), 0, "ERR -> SQD");
	expect(query_state(qp), QPS_ERR, "query says ERR after SQD");
	expect(to_state(qp, QPS_RESET), 0, "ERR -> RESET");
	expect(to_state(qp, QPS_INIT), 0, "RESET -> INIT again");
	expect(to_state(qp, QPS_RTS), 0, "INIT -> RTS (iWARP)");
	must(destroy_qp(qp), "destroy_qp");
}

static int do_errors(void)
{
	size_t len = 1 << 16;
	char *buf = buffer(len);
	__u32 pd, mr, cq, cq2, qp;
	struct qp_req q;

	get_context();
	must(alloc_pd(&pd), "alloc_pd");

	expect(reg_mr(pd, buf, len, IB_UVERBS_ACCESS_REMOTE_WRITE, &mr),
	       -EINVAL, "MR remote write without local write");
	expect(reg_mr(pd, buf, len, IB_UVERBS_ACCESS_REMOTE_ATOMIC, &mr),
	       -EINVAL, "MR remote atomic without local write");
	expect(reg_mr(pd, buf, 0, IB_UVERBS_ACCESS_LOCAL_WRITE, &mr),
	       -EINVAL, "MR of length 0");
	munmap(buf + len / 2, len / 2);
	expect(reg_mr(pd, buf, len, IB_UVERBS_ACCESS_LOCAL_WRITE, &mr),
	       -EFAULT, "MR over unmapped memory");
	expect(reg_mr(pd, buf, len / 2, IB_UVERBS_ACCESS_REMOTE_READ, &mr),
	       0, "MR remote read only");

	expect(create_cq(dev_attr.max_cqe + 1, &cq), -EINVAL, "CQ > max_cqe");
	expect(create_cq(0, &cq), -EINVAL, "CQ of 0 entries");
	expect(create_cq(dev_attr.max_cqe, &cq2), 0, "CQ of max_cqe");
	must(destroy_cq(cq2), "destroy_cq");
	check_cq_arm();
	must(create_cq(16, &cq), "create_cq");

	check_qp_caps(pd, cq);
	check_qp_states(pd, cq);

	q = qp_defaults(pd, cq);
	must(create_qp(&q, &qp, NULL), "create_qp");
	expect(dealloc_pd(pd), -EBUSY, "dealloc PD that still has an MR");
	expect(destroy_cq(cq), -EBUSY, "destroy CQ that a QP uses");
	must(destroy_qp(qp), "destroy_qp");
	must(dereg_mr(mr), "dereg_mr");
	expect(destroy_cq(cq), 0, "destroy CQ");
	expect(dealloc_pd(pd), 0, "dealloc PD");

	if (failures)
		printf("FAIL %d check(s) failed\n", failures);
	return failures != 0;
}

/*
 * Fills one kind of object up to its limit: the next one must fail with
 * ENOMEM, and freeing one makes room again.
 */
struct kind {
	const char *name;
	int (*create)(__u32 *handle);
	int (*destroy)(__u32 handle);
};

static __u32 lim_pd, lim_cq;
static char *lim_buf;

static int mk_pd(__u32 *h) { return alloc_pd(h); }
static int mk_cq(__u32 *h) { return create_cq(4, h); }
static int mk_mr(__u32 *h)
{
	return reg_mr(lim_pd, lim_buf, 4096, IB_UVERBS_ACCESS_LOCAL_WRITE, h);
}

static int mk_mw(__u32 *h) { return alloc_mw(lim_pd, h); }

static int mk_qp(__u32 *h)
{
	struct qp_req q = qp_defaults(lim_pd, lim_cq);

	return create_qp(&q, h, NULL);
}

static void check_limit(const struct kind *k, __u32 limit, __u32 already)
{
	__u32 *h = calloc(limit + 1, sizeof(*h));
	__u32 n = already, i;
	char what[128];
	int rv = 0;

	if (!h)
		exit(1);
	while (n < limit && !(rv = k->create(&h[n - already])))
		n++;
	snprintf(what, sizeof(what), "%u %ss (the limit)", limit, k->name);
	expect(n == limit ? 0 : rv, 0, what);
	snprintf(what, sizeof(what), "%s beyond the limit", k->name);
	expect(k->create(&h[n - already]), -ENOMEM, what);
	if (n > already) {
		must(k->destroy(h[n - already - 1]), "destroy");
		snprintf(what, sizeof(what), "%s after freeing one", k->name);
		expect(k->create(&h[n - already - 1]), 0, what);
	}
	for (i = 0; i < n - already; i++)
		must(k->destroy(h[i]), "destroy");
	free(h);
}

static int do_limits(const char *path, long max_ctx)
{
	static const struct kind pd = { "PD", mk_pd, dealloc_pd };
	static const struct kind cq = { "CQ", mk_cq, destroy_cq };
	static const struct kind mr = { "MR", mk_mr, dereg_mr };
	static const struct kind mw = { "MW", mk_mw, dealloc_mw };
	static const struct kind qp = { "QP", mk_qp, destroy_qp };
	int main_fd = dev_fd, *fds;
	long i;

	get_context();
	lim_buf = buffer(4096);
	check_limit(&pd, dev_attr.max_pd, 0);
	check_limit(&cq, dev_attr.max_cq, 0);
	must(alloc_pd(&lim_pd), "alloc_pd");
	check_limit(&mr, dev_attr.max_mr, 0);
	check_limit(&mw, dev_attr.max_mw, 0);
	must(create_cq(4, &lim_cq), "create_cq");
	check_limit(&qp, dev_attr.max_qp, 0);
	must(destroy_cq(lim_cq), "destroy_cq");
	must(dealloc_pd(lim_pd), "dealloc_pd");

	/* This process already has one context. */
	fds = calloc(max_ctx + 1, sizeof(*fds));
	if (!fds)
		return 1;
	for (i = 1; i <= max_ctx; i++) {
		struct ib_uverbs_get_context req = {};
		struct {
			struct ib_uverbs_get_context_resp core;
			struct urdma_uresp_alloc_ctx drv;
		} resp;
		int rv;

		fds[i] = open(path, O_RDWR | O_CLOEXEC);
		if (fds[i] < 0) {
			printf("FAIL open %s: %s\n", path, strerror(errno));
			return 1;
		}
		dev_fd = fds[i];
		rv = uverbs_cmd(IB_USER_VERBS_CMD_GET_CONTEXT, &req,
				sizeof(req), &resp, sizeof(resp));
		if (i < max_ctx && rv) {
			expect(rv, 0, "context within the limit");
			break;
		}
		if (i == max_ctx)
			expect(rv, -ENOMEM, "context beyond the limit");
	}
	dev_fd = main_fd;

	if (failures)
		printf("FAIL %d check(s) failed\n", failures);
	return failures != 0;
}

static int do_hold(long secs)
{
	size_t len = 1 << 16;
	char *buf = buffer(len);
	__u32 pd, mr, cq, qp;
	struct qp_req q;

	get_context();
	must(alloc_pd(&pd), "alloc_pd");
	must(reg_mr(pd, buf, len, RW_ACCESS, &mr), "reg_mr");
	must(create_cq(16, &cq), "create_cq");
	q = qp_defaults(pd, cq);
	must(create_qp(&q, &qp, NULL), "create_qp");
	printf("holding\n");
	fflush(stdout);
	sleep(secs);
	return 0;
}

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

static int req_notify(__u32 cq, int solicited)
{
	struct ib_uverbs_req_notify_cq req = {
		.cq_handle = cq, .solicited_only = solicited,
	};

	return uverbs_cmd(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, &req, sizeof(req),
			  NULL, 0);
}

/*
 * The provider arms CQs itself and asks the kernel, with REQ_NOTIFY_CQ,
 * to wake the completion channel when an event is due: each call must
 * queue exactly one event for the CQ's user handle.
 */
static int do_notify(void)
{
	struct ib_uverbs_create_comp_channel ch = {};
	struct ib_uverbs_create_comp_channel_resp ch_resp = {};
	struct ib_uverbs_create_cq req = {
		.user_handle = 0x5eed, .cqe = 8,
	};
	struct {
		struct ib_uverbs_create_cq_resp core;
		struct urdma_uresp_create_cq drv;
	} resp = {};
	struct ib_uverbs_comp_event_desc desc = {};
	__u32 plain;

	get_context();
	must(uverbs_cmd(IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, &ch, sizeof(ch),
			&ch_resp, sizeof(ch_resp)), "create_comp_channel");
	req.comp_channel = ch_resp.fd;
	must(uverbs_cmd(IB_USER_VERBS_CMD_CREATE_CQ, &req, sizeof(req),
			&resp, sizeof(resp)), "create_cq with a channel");
	expect(readable(ch_resp.fd, 0), 0, "channel idle after create");
	expect(req_notify(resp.core.cq_handle, 0), 0, "req_notify_cq");
	expect(readable(ch_resp.fd, 2000), 1, "channel readable after req_notify_cq");
	expect(read(ch_resp.fd, &desc, sizeof(desc)), sizeof(desc), "read the event");
	expect(desc.cq_handle == 0x5eed, 1, "event names the CQ's user handle");
	expect(readable(ch_resp.fd, 0), 0, "one event per call");
	expect(req_notify(resp.core.cq_handle, 1), 0, "req_notify_cq solicited");
	expect(readable(ch_resp.fd, 2000), 1, "channel readable again");
	expect(read(ch_resp.fd, &desc, sizeof(desc)), sizeof(desc), "read the second event");
	expect(destroy_cq(resp.core.cq_handle), 0, "destroy_cq");
	close(ch_resp.fd);

	must(create_cq(8, &plain), "create_cq without a channel");
	expect(req_notify(plain, 0), 0, "req_notify_cq without a channel");
	expect(destroy_cq(plain), 0, "destroy_cq without a channel");
	if (failures)
		printf("FAIL %d check(s) failed\n", failures);
	return failures != 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s /dev/infiniband/uverbsN %s\n", argv[0],
			"info|cycle N|errors|limits CTX|hold SECS|notify");
		return 2;
	}
	dev_fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (dev_fd < 0) {
		printf("FAIL open %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	if (!strcmp(argv[2], "info"))
		return do_info();
	if (!strcmp(argv[2], "cycle") && argc > 3)
		return do_cycle(strtol(argv[3], NULL, 0));
	if (!strcmp(argv[2], "errors"))
		return do_errors();
	if (!strcmp(argv[2], "limits") && argc > 3)
		return do_limits(argv[1], strtol(argv[3], NULL, 0));
	if (!strcmp(argv[2], "notify"))
		return do_notify();
	if (!strcmp(argv[2], "hold") && argc > 3)
		return do_hold(strtol(argv[3], NULL, 0));
	fprintf(stderr, "unknown mode %s\n", argv[2]);
	return 2;
}
