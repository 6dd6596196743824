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

/*
 * iw_cm calls this and then iw_add_ref under one spinlock, so the QP found
 * here holds no reference yet.  Marking it tells urdma_qp_unpublish() to
 * wait out such a section before dropping its own reference.
 */
struct ib_qp *urdma_get_qp(struct ib_device *ibdev, int qpn)
{
	struct xarray *xa = &to_udev(ibdev)->qp_xa;
	struct urdma_qp *qp;

	xa_lock(xa);
	qp = xa_load(xa, qpn);
	if (qp)
		qp->cm_found = true;
	xa_unlock(xa);
	return qp ? &qp->ibqp : NULL;
}

/*
 * Takes the QP out of iw_get_qp's reach and waits until iw_cm holds no
 * reference to it, so that ib_core may free it.
 */
void urdma_qp_unpublish(struct urdma_dev *udev, struct urdma_qp *qp)
{
	struct xarray *xa = &udev->qp_xa;
	bool found;

	xa_lock(xa);
	__xa_erase(xa, qp->ibqp.qp_num);
	found = qp->cm_found;
	xa_unlock(xa);
	/*
	 * A lookup that found the QP before the erase may not have taken its
	 * reference yet; it does so with interrupts off, which a grace period
	 * waits for.  Only QPs given to iw_cm pay for that.
	 */
	if (found)
		synchronize_rcu();
	urdma_qp_put(&qp->ibqp);
	wait_for_completion(&qp->released);
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
