// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * A process that opened a urdma device and then forked: the child creates
 * its own context, CQ and RC QP (the QP attaches it to urdmad), and so does
 * the parent after the child is done. Nothing of DPDK may happen before the
 * first QP, so both work.
 *
 *   fork DEVICE
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static struct ibv_device *find(const char *name)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);

	for (int i = 0; l && i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), name))
			return l[i];
	return NULL;
}

static int make_qp(struct ibv_device *dev, const char *who)
{
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr a = {0};

	if (!ctx) {
		printf("FAIL %s: open: %s\n", who, strerror(errno));
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	if (!cq) {
		printf("FAIL %s: pd/cq: %s\n", who, strerror(errno));
		return 1;
	}
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 8;
	a.cap.max_recv_wr = 8;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &a);
	if (!qp) {
		printf("FAIL %s: create_qp: %s\n", who, strerror(errno));
		return 1;
	}
	printf("%s: qp %u\n", who, qp->qp_num);
	if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) ||
	    ibv_close_device(ctx)) {
		printf("FAIL %s: teardown\n", who);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct ibv_device *dev;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	int status;
	pid_t pid;

	if (argc != 2) {
		fprintf(stderr, "usage: fork DEVICE\n");
		return 2;
	}
	dev = find(argv[1]);
	if (!dev) {
		printf("FAIL no device %s\n", argv[1]);
		return 1;
	}
	/* Opened before the fork, as rdma-core's tests do. */
	ctx = ibv_open_device(dev);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		printf("FAIL open before fork: %s\n", strerror(errno));
		return 1;
	}
	pid = fork();
	if (pid == 0)
		_exit(make_qp(dev, "child"));
	if (pid < 0 || waitpid(pid, &status, 0) != pid) {
		printf("FAIL fork/wait\n");
		return 1;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		printf("FAIL child exit status %d\n", status);
		return 1;
	}
	if (make_qp(dev, "parent"))
		return 1;
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	printf("fork: ok\n");
	return 0;
}
