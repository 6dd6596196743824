// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * iw_cm glue.  Connection setup (the TRP handshake) is not implemented
 * yet: connect, accept and reject fail with -EOPNOTSUPP.  Listening
 * succeeds without effect, because rdma_cm listens on every iWARP device
 * for a wildcard address and one refusing device would make such a
 * listen fail for the devices of other drivers too.
 */
#include <rdma/iw_cm.h>

#include "urdma.h"

static void urdma_qp_release(struct kref *ref)
{
	complete(&container_of(ref, struct urdma_qp, ref)->released);
}

void urdma_qp_get(struct ib_qp *ibqp)
{
	kref_get(&to_uqp(ibqp)->ref);
}

void urdma_qp_put(struct ib_qp *ibqp)
{
	kref_put(&to_uqp(ibqp)->ref, urdma_qp_release);
}

struct ib_qp *urdma_get_qp(struct ib_device *ibdev, int qpn)
{
	struct urdma_qp *qp = xa_load(&to_udev(ibdev)->qp_xa, qpn);

	return qp ? &qp->ibqp : NULL;
}

int urdma_connect(struct iw_cm_id *id, struct iw_cm_conn_param *param)
{
	return -EOPNOTSUPP;
}

int urdma_accept(struct iw_cm_id *id, struct iw_cm_conn_param *param)
{
	return -EOPNOTSUPP;
}

int urdma_reject(struct iw_cm_id *id, const void *pdata, u8 pdata_len)
{
	return -EOPNOTSUPP;
}

int urdma_create_listen(struct iw_cm_id *id, int backlog)
{
	return 0;
}

int urdma_destroy_listen(struct iw_cm_id *id)
{
	return 0;
}
