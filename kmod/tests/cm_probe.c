// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * One rdma_cm connection, client or server side, the way librdmacm drives
 * it, but through the raw rdma_cm (ucma) and uverbs commands: the kernel's
 * connection management is tested without the provider, which the
 * library would need for its device.
 *
 *   cm_probe UVERBS client ADDR PORT PDATA [wait|disconnect|none] [SECS]
 *   cm_probe UVERBS server ADDR PORT PDATA [accept|reject] [SECS]
 *
 * UVERBS is the urdma device's /dev/infiniband/uverbsN, where the QP is
 * created (RC, moved to INIT as rdma_create_qp does).  The client
 * resolves ADDR and connects with private data PDATA; the server listens
 * on ADDR (0.0.0.0: every device) and accepts or rejects the first
 * request with PDATA.  After ESTABLISHED the client waits for
 * DISCONNECTED ("wait"), disconnects first ("disconnect") or stops
 * ("none"); the server always waits.  Output, one line each:
 *
 *   listening
 *   connect: <errno name>            (rdma_connect failed: no event)
 *   accept: <errno name>
 *   event <NAME> status <n> pdata <text>
 *   qp state <n>
 *   timeout
 *
 * Exit status 0 unless a step before the connect failed ("FAIL ...").
 * SECS (default 30) bounds each wait for an event.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_cm.h>

#include "../urdma-abi.h"

enum { QPS_RESET, QPS_INIT };
enum {
	EV_ADDR_RESOLVED, EV_ADDR_ERROR, EV_ROUTE_RESOLVED, EV_ROUTE_ERROR,
	EV_CONNECT_REQUEST, EV_CONNECT_RESPONSE, EV_CONNECT_ERROR,
	EV_UNREACHABLE, EV_REJECTED, EV_ESTABLISHED, EV_DISCONNECTED,
	EV_DEVICE_REMOVAL,
};
static const char *const ev_names[] = {
	"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR",
	"CONNECT_REQUEST", "CONNECT_RESPONSE", "CONNECT_ERROR",
	"UNREACHABLE", "REJECTED", "ESTABLISHED", "DISCONNECTED",
	"DEVICE_REMOVAL",
};

static int cm_fd, dev_fd, secs = 30;

static void fail(const char *what, int err)
{
	printf("FAIL %s: %s\n", what, strerror(err));
	exit(1);
}

/* One ucma command; the response pointer is inside the command. */
static int ucma(__u32 cmd, void *body, size_t len, size_t out)
{
	struct {
		struct rdma_ucm_cmd_hdr hdr;
		unsigned char body[1024];
	} buf = { .hdr = { .cmd = cmd, .in = len, .out = out } };

	memcpy(buf.body, body, len);
	if (write(cm_fd, &buf, sizeof(buf.hdr) + len) < 0)
		return -errno;
	return 0;
}

/* One uverbs write command; resp's address goes in the first 8 bytes. */
static int uverbs(__u32 command, void *req, size_t req_len, void *resp,
		  size_t resp_len)
{
	struct {
		struct ib_uverbs_cmd_hdr hdr;
		unsigned char body[512];
	} buf;

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

/* PD, CQ and an RC QP in INIT; returns the QP handle, sets *qpn. */
static __u32 make_qp(__u32 *qpn)
{
	struct ib_uverbs_get_context ctx = {};
	struct {
		struct ib_uverbs_get_context_resp core;
		struct urdma_uresp_alloc_ctx drv;
	} ctx_resp;
	struct ib_uverbs_alloc_pd pd = {};
	struct ib_uverbs_alloc_pd_resp pd_resp;
	struct ib_uverbs_create_cq cq = { .cqe = 8, .comp_channel = -1 };
	struct {
		struct ib_uverbs_create_cq_resp core;
		struct urdma_uresp_create_cq drv;
	} cq_resp;
	struct ib_uverbs_create_qp qp = {
		.max_send_wr = 4, .max_recv_wr = 4,
		.max_send_sge = 1, .max_recv_sge = 1,
		.qp_type = IB_UVERBS_QPT_RC,
	};
	struct {
		struct ib_uverbs_create_qp_resp core;
		struct urdma_uresp_create_qp drv;
	} qp_resp;
	struct ib_uverbs_modify_qp mod = {
		.attr_mask = 1 | (1 << 3) | (1 << 4), /* STATE, ACCESS, PORT */
		.qp_state = QPS_INIT, .port_num = 1,
	};
	int rv;

	rv = uverbs(IB_USER_VERBS_CMD_GET_CONTEXT, &ctx, sizeof(ctx),
		    &ctx_resp, sizeof(ctx_resp));
	if (rv)
		fail("get_context", -rv);
	rv = uverbs(IB_USER_VERBS_CMD_ALLOC_PD, &pd, sizeof(pd), &pd_resp,
		    sizeof(pd_resp));
	if (rv)
		fail("alloc_pd", -rv);
	rv = uverbs(IB_USER_VERBS_CMD_CREATE_CQ, &cq, sizeof(cq), &cq_resp,
		    sizeof(cq_resp));
	if (rv)
		fail("create_cq", -rv);
	qp.pd_handle = pd_resp.pd_handle;
	qp.send_cq_handle = cq_resp.core.cq_handle;
	qp.recv_cq_handle = cq_resp.core.cq_handle;
	rv = uverbs(IB_USER_VERBS_CMD_CREATE_QP, &qp, sizeof(qp), &qp_resp,
		    sizeof(qp_resp));
	if (rv)
		fail("create_qp", -rv);
	mod.qp_handle = qp_resp.core.qp_handle;
	rv = uverbs(IB_USER_VERBS_CMD_MODIFY_QP, &mod, sizeof(mod), NULL, 0);
	if (rv)
		fail("modify_qp INIT", -rv);
	*qpn = qp_resp.core.qpn;
	return qp_resp.core.qp_handle;
}

static void print_qp_state(__u32 qp)
{
	struct ib_uverbs_query_qp req = { .qp_handle = qp, .attr_mask = 1 };
	struct ib_uverbs_query_qp_resp resp = {};
	int rv = uverbs(IB_USER_VERBS_CMD_QUERY_QP, &req, sizeof(req), &resp,
			sizeof(resp));

	if (rv)
		printf("qp state %s\n", strerror(-rv));
	else
		printf("qp state %u\n", resp.qp_state);
	fflush(stdout);
}

static __u32 create_id(void)
{
	struct rdma_ucm_create_id_resp resp;
	struct rdma_ucm_create_id cmd = {
		.uid = 1, .response = (uintptr_t)&resp, .ps = RDMA_PS_TCP,
		.qp_type = IB_UVERBS_QPT_RC,
	};
	int rv = ucma(RDMA_USER_CM_CMD_CREATE_ID, &cmd, sizeof(cmd),
		      sizeof(resp));

	if (rv)
		fail("create_id", -rv);
	return resp.id;
}

/* The next event, or 0 with "timeout" printed. */
static int get_event(struct rdma_ucm_event_resp *ev)
{
	struct rdma_ucm_get_event cmd = { .response = (uintptr_t)ev };
	struct pollfd p = { .fd = cm_fd, .events = POLLIN };
	int rv;

	rv = poll(&p, 1, secs * 1000);
	if (rv <= 0) {
		printf("timeout\n");
		fflush(stdout);
		return 0;
	}
	rv = ucma(RDMA_USER_CM_CMD_GET_EVENT, &cmd, sizeof(cmd), sizeof(*ev));
	if (rv)
		fail("get_event", -rv);
	return 1;
}

static void print_event(const struct rdma_ucm_event_resp *ev)
{
	const char *name = ev->event < sizeof(ev_names) / sizeof(ev_names[0]) ?
		ev_names[ev->event] : "?";

	printf("event %s status %d pdata %.*s\n", name, (int)ev->status,
	       (int)strnlen((const char *)ev->param.conn.private_data,
			    ev->param.conn.private_data_len),
	       ev->param.conn.private_data);
	fflush(stdout);
}

/* Waits for @want; anything else is printed and ends the program. */
static void expect_event(int want, struct rdma_ucm_event_resp *ev)
{
	if (!get_event(ev))
		exit(0);
	if ((int)ev->event != want) {
		print_event(ev);
		exit(0);
	}
}

static void set_addr(struct sockaddr_in *sin, const char *addr,
		     const char *port)
{
	memset(sin, 0, sizeof(*sin));
	sin->sin_family = AF_INET;
	sin->sin_port = htons(atoi(port));
	if (inet_pton(AF_INET, addr, &sin->sin_addr) != 1)
		fail("address", EINVAL);
}

static void set_pdata(struct rdma_ucm_conn_param *p, const char *pdata)
{
	p->private_data_len = strlen(pdata);
	memcpy(p->private_data, pdata, p->private_data_len);
}

static void wait_disconnected(void)
{
	struct rdma_ucm_event_resp ev;

	if (get_event(&ev))
		print_event(&ev);
}

static int client(const char *addr, const char *port, const char *pdata,
		  const char *action)
{
	struct rdma_ucm_resolve_addr ra = { .timeout_ms = 5000 };
	struct rdma_ucm_resolve_route rr = { .timeout_ms = 5000 };
	struct rdma_ucm_connect conn = {};
	struct rdma_ucm_disconnect disc = {};
	struct rdma_ucm_event_resp ev;
	__u32 id, qp, qpn;
	int rv;

	id = create_id();
	ra.id = id;
	ra.dst_size = sizeof(struct sockaddr_in);
	set_addr((struct sockaddr_in *)&ra.dst_addr, addr, port);
	rv = ucma(RDMA_USER_CM_CMD_RESOLVE_ADDR, &ra, sizeof(ra), 0);
	if (rv)
		fail("resolve_addr", -rv);
	expect_event(EV_ADDR_RESOLVED, &ev);
	rr.id = id;
	rv = ucma(RDMA_USER_CM_CMD_RESOLVE_ROUTE, &rr, sizeof(rr), 0);
	if (rv)
		fail("resolve_route", -rv);
	expect_event(EV_ROUTE_RESOLVED, &ev);

	qp = make_qp(&qpn);
	printf("qpn %u\npid %d\n", qpn, (int)getpid());
	fflush(stdout);
	conn.id = id;
	conn.conn_param.qp_num = qpn;
	conn.conn_param.responder_resources = 1;
	conn.conn_param.initiator_depth = 1;
	conn.conn_param.valid = 1;
	set_pdata(&conn.conn_param, pdata);
	rv = ucma(RDMA_USER_CM_CMD_CONNECT, &conn, sizeof(conn), 0);
	if (rv) {
		printf("connect: %s\n", strerrorname_np(-rv));
		return 0;
	}
	if (!get_event(&ev))
		return 0;
	print_event(&ev);
	if (ev.event != EV_ESTABLISHED)
		return 0;
	print_qp_state(qp);
	if (!strcmp(action, "none"))
		return 0;
	if (!strcmp(action, "disconnect")) {
		disc.id = id;
		rv = ucma(RDMA_USER_CM_CMD_DISCONNECT, &disc, sizeof(disc), 0);
		if (rv)
			printf("disconnect: %s\n", strerrorname_np(-rv));
	}
	wait_disconnected();
	return 0;
}

static int server(const char *addr, const char *port, const char *pdata,
		  const char *action)
{
	struct rdma_ucm_bind bind = {};
	struct rdma_ucm_listen listen = { .backlog = 8 };
	struct rdma_ucm_accept acc = { .uid = 2 };
	struct rdma_ucm_reject rej = {};
	struct rdma_ucm_event_resp ev;
	__u32 id, qp, qpn;
	int rv;

	id = create_id();
	bind.id = id;
	bind.addr_size = sizeof(struct sockaddr_in);
	set_addr((struct sockaddr_in *)&bind.addr, addr, port);
	rv = ucma(RDMA_USER_CM_CMD_BIND, &bind, sizeof(bind), 0);
	if (rv)
		fail("bind", -rv);
	listen.id = id;
	rv = ucma(RDMA_USER_CM_CMD_LISTEN, &listen, sizeof(listen), 0);
	if (rv)
		fail("listen", -rv);
	printf("listening\n");
	fflush(stdout);

	expect_event(EV_CONNECT_REQUEST, &ev);
	print_event(&ev);
	if (!strcmp(action, "reject")) {
		rej.id = ev.id;
		rej.private_data_len = strlen(pdata);
		memcpy(rej.private_data, pdata, rej.private_data_len);
		rv = ucma(RDMA_USER_CM_CMD_REJECT, &rej, sizeof(rej), 0);
		printf("reject: %s\n", rv ? strerrorname_np(-rv) : "ok");
		return 0;
	}
	qp = make_qp(&qpn);
	printf("qpn %u\npid %d\n", qpn, (int)getpid());
	fflush(stdout);
	acc.id = ev.id;
	acc.conn_param.qp_num = qpn;
	acc.conn_param.responder_resources = 1;
	acc.conn_param.initiator_depth = 1;
	acc.conn_param.valid = 1;
	set_pdata(&acc.conn_param, pdata);
	rv = ucma(RDMA_USER_CM_CMD_ACCEPT, &acc, sizeof(acc), 0);
	if (rv) {
		printf("accept: %s\n", strerrorname_np(-rv));
		return 0;
	}
	if (!get_event(&ev))
		return 0;
	print_event(&ev);
	if (ev.event != EV_ESTABLISHED)
		return 0;
	print_qp_state(qp);
	wait_disconnected();
	return 0;
}

int main(int argc, char **argv)
{
	const char *action;

	if (argc < 6) {
		fprintf(stderr, "usage: %s UVERBS client|server ADDR PORT PDATA [ACTION] [SECS]\n",
			argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 7)
		secs = atoi(argv[7]);
	dev_fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (dev_fd < 0)
		fail(argv[1], errno);
	cm_fd = open("/dev/infiniband/rdma_cm", O_RDWR | O_CLOEXEC);
	if (cm_fd < 0)
		fail("/dev/infiniband/rdma_cm", errno);
	if (!strcmp(argv[2], "client")) {
		action = argc > 6 ? argv[6] : "wait";
		return client(argv[3], argv[4], argv[5], action);
	}
	if (!strcmp(argv[2], "server")) {
		action = argc > 6 ? argv[6] : "accept";
		return server(argv[3], argv[4], argv[5], action);
	}
	fprintf(stderr, "unknown role %s\n", argv[2]);
	return 2;
}
