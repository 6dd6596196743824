// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Verbs objects of urdma.  Only user-space consumers (with udata) are
 * served: queues live in the provider, so a kernel ULP would get a device
 * that cannot move data.  Refusing it with -EOPNOTSUPP is the honest answer.
 */
#include <linux/etherdevice.h>
#include <linux/random.h>
#include <rdma/ib_mad.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "urdma.h"

/*
 * Reserve one unit of a per-device limit.  Counting before allocating
 * keeps the limit exact under concurrent creates.
 */
static bool urdma_reserve(atomic_t *count, u32 max)
{
	if (atomic_inc_return(count) <= (int)max)
		return true;
	atomic_dec(count);
	return false;
}

int urdma_query_device(struct ib_device *ibdev, struct ib_device_attr *attr,
		       struct ib_udata *udata)
{
	const struct urdma_limits *lim = &to_udev(ibdev)->limits;

	/* There is no private query_device data in either direction. */
	if (udata->inlen || udata->outlen)
		return -EINVAL;

	memset(attr, 0, sizeof(*attr));
	attr->fw_ver = URDMA_FW_VER_RAW;
	attr->vendor_id = URDMA_VENDOR_ID;
	attr->sys_image_guid = ibdev->node_guid;
	attr->max_mr_size = URDMA_MAX_MR_SIZE;
	attr->page_size_cap = PAGE_SIZE;
	attr->max_qp = lim->qp;
	attr->max_qp_wr = URDMA_MAX_QP_WR;
	attr->kernel_cap_flags = IBK_ALLOW_USER_UNREG;
	attr->max_send_sge = URDMA_MAX_SGE;
	attr->max_recv_sge = URDMA_MAX_SGE;
	attr->max_sge_rd = URDMA_MAX_SGE_RD;
	attr->max_cq = lim->cq;
	attr->max_cqe = URDMA_MAX_CQE;
	attr->max_mr = lim->mr;
	attr->max_mw = lim->mw;
	/* Type 2 windows are bound to a QP and checked against its PD: 2B. */
	attr->device_cap_flags = IB_DEVICE_MEM_WINDOW |
				 IB_DEVICE_MEM_WINDOW_TYPE_2B;
	attr->max_pd = lim->pd;
	/* IB names: rd_atom is the responder side (IRD), init the initiator. */
	attr->max_qp_rd_atom = URDMA_MAX_IRD;
	attr->max_qp_init_rd_atom = URDMA_MAX_ORD;
	attr->max_res_rd_atom = lim->qp * URDMA_MAX_IRD;
	/*
	 * The provider runs RFC 7306 atomics with locked instructions on the
	 * target memory: atomic against every other atomic on that memory of
	 * this host, from any QP or process.
	 */
	attr->atomic_cap = IB_ATOMIC_HCA;
	attr->max_srq = lim->srq;
	attr->max_srq_wr = URDMA_MAX_SRQ_WR;
	attr->max_srq_sge = URDMA_MAX_SGE;
	return 0;
}

/* Everything about the port except the link speed. */
static void urdma_fill_port_attr(struct urdma_dev *udev,
				 struct ib_port_attr *attr)
{
	enum ib_port_state state = urdma_port_state(udev);
	enum ib_mtu mtu = ib_mtu_int_to_enum(READ_ONCE(udev->netdev->mtu));

	memset(attr, 0, sizeof(*attr));
	attr->state = state;
	attr->phys_state = state == IB_PORT_ACTIVE ?
		IB_PORT_PHYS_STATE_LINK_UP : IB_PORT_PHYS_STATE_DISABLED;
	attr->max_mtu = mtu;
	attr->active_mtu = mtu;
	attr->gid_tbl_len = 1;
	attr->port_cap_flags = IB_PORT_CM_SUP;
	attr->max_msg_sz = 0x80000000;
}

int urdma_query_port(struct ib_device *ibdev, u32 port,
		     struct ib_port_attr *attr)
{
	urdma_fill_port_attr(to_udev(ibdev), attr);
	/* A failure leaves the speed unknown, which is not an error. */
	ib_get_eth_speed(ibdev, port, &attr->active_speed, &attr->active_width);
	return 0;
}

int urdma_get_port_immutable(struct ib_device *ibdev, u32 port,
			     struct ib_port_immutable *immutable)
{
	struct ib_port_attr attr;

	urdma_fill_port_attr(to_udev(ibdev), &attr);
	immutable->gid_tbl_len = attr.gid_tbl_len;
	immutable->core_cap_flags = RDMA_CORE_PORT_IWARP;
	return 0;
}

int urdma_query_gid(struct ib_device *ibdev, u32 port, int idx,
		    union ib_gid *gid)
{
	struct urdma_dev *udev = to_udev(ibdev);

	if (idx != 0)
		return -EINVAL;
	/* iWARP convention: the MAC address in the first six bytes. */
	memset(gid, 0, sizeof(*gid));
	ether_addr_copy(gid->raw, udev->netdev->dev_addr);
	return 0;
}

void urdma_get_dev_fw_str(struct ib_device *ibdev, char *str)
{
	snprintf(str, IB_FW_VERSION_NAME_MAX, "%s", URDMA_FW_VERSION);
}

int urdma_alloc_ucontext(struct ib_ucontext *ibuctx, struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibuctx->device);
	struct urdma_uresp_alloc_ctx uresp = {
		.magic = URDMA_ABI_MAGIC,
		.abi_version = URDMA_ABI_VERSION,
		.dev_id = udev->ibdev.index,
	};
	int rv;

	if (udata->outlen < sizeof(uresp))
		return -EINVAL;
	if (!urdma_reserve(&udev->num_ctx, udev->limits.ctx))
		return -ENOMEM;
	rv = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (rv)
		atomic_dec(&udev->num_ctx);
	return rv;
}

void urdma_dealloc_ucontext(struct ib_ucontext *ibuctx)
{
	atomic_dec(&to_udev(ibuctx->device)->num_ctx);
}

/*
 * Device removal (urdmad's TAP going with urdmad, rdma link delete,
 * rmmod) revokes a process's objects instead of waiting for the process
 * to close the device: ib_uverbs then queues IB_EVENT_DEVICE_FATAL,
 * destroys the objects through the usual paths and closes the completion
 * channels.  The provider maps nothing of ours, so there is nothing to
 * take back here; its data path stops with urdmad's (docs/kernel-abi.md).
 */
void urdma_disassociate_ucontext(struct ib_ucontext *ibuctx)
{
}

int urdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibpd->device);

	if (!udata)
		return -EOPNOTSUPP;
	if (!urdma_reserve(&udev->num_pd, udev->limits.pd))
		return -ENOMEM;
	return 0;
}

int urdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	atomic_dec(&to_udev(ibpd->device)->num_pd);
	return 0;
}

#define URDMA_MR_ACCESS (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | \
			 IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC | \
			 IB_ACCESS_MW_BIND)

struct ib_mr *urdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				u64 virt_addr, int access,
				struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibpd->device);
	struct urdma_mr *mr;
	struct ib_umem *umem;
	u32 index;
	u8 key;
	int rv;

	if (!udata)
		return ERR_PTR(-EOPNOTSUPP);
	/*
	 * ib_core already enforces the verbs rule that remote write or
	 * atomic access needs local write; the placement code relies on
	 * it, so it is checked here too rather than assumed.
	 */
	if ((access & (IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IB_ACCESS_LOCAL_WRITE))
		return ERR_PTR(-EINVAL);
	if (!length || length > URDMA_MAX_MR_SIZE)
		return ERR_PTR(-EINVAL);
	if (!urdma_reserve(&udev->num_mr, udev->limits.mr))
		return ERR_PTR(-ENOMEM);

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr) {
		rv = -ENOMEM;
		goto err_count;
	}

	/* Pins the pages and checks that the range is mapped and writable. */
	umem = ib_umem_get(ibpd->device, start, length, access);
	if (IS_ERR(umem)) {
		rv = PTR_ERR(umem);
		goto err_free;
	}

	rv = xa_alloc_cyclic(&udev->mr_xa, &index, mr,
			     XA_LIMIT(1, URDMA_STAG_INDEX_MAX),
			     &udev->next_stag_index, GFP_KERNEL);
	if (rv < 0)
		goto err_umem;

	/* A random key makes a stale or guessed STag unlikely to match. */
	key = get_random_u8();
	mr->umem = umem;
	mr->va = virt_addr;
	mr->length = length;
	mr->access = access & URDMA_MR_ACCESS;
	mr->stag_index = index;
	mr->ibmr.lkey = (index << 8) | key;
	mr->ibmr.rkey = mr->ibmr.lkey;
	mr->ibmr.iova = virt_addr;
	mr->ibmr.length = length;
	return &mr->ibmr;

err_umem:
	ib_umem_release(umem);
err_free:
	kfree(mr);
err_count:
	atomic_dec(&udev->num_mr);
	return ERR_PTR(rv);
}

int urdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibmr->device);
	struct urdma_mr *mr = to_umr(ibmr);

	xa_erase(&udev->mr_xa, mr->stag_index);
	ib_umem_release(mr->umem);
	kfree(mr);
	atomic_dec(&udev->num_mr);
	return 0;
}

struct ib_mr *urdma_get_dma_mr(struct ib_pd *ibpd, int access)
{
	return ERR_PTR(-EOPNOTSUPP);
}

/*
 * A window's STag index comes from the space of MR indices, so that the
 * provider tells one from the other by STag alone.
 */
int urdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibmw->device);
	struct urdma_mw *mw = to_umw(ibmw);
	u32 index;
	int rv;

	if (!udata)
		return -EOPNOTSUPP;
	if (!urdma_reserve(&udev->num_mw, udev->limits.mw))
		return -ENOMEM;
	rv = xa_alloc_cyclic(&udev->mr_xa, &index, mw,
			     XA_LIMIT(1, URDMA_STAG_INDEX_MAX),
			     &udev->next_stag_index, GFP_KERNEL);
	if (rv < 0) {
		atomic_dec(&udev->num_mw);
		return rv;
	}
	mw->stag_index = index;
	ibmw->rkey = (index << 8) | get_random_u8();
	return 0;
}

int urdma_dealloc_mw(struct ib_mw *ibmw)
{
	struct urdma_dev *udev = to_udev(ibmw->device);

	xa_erase(&udev->mr_xa, to_umw(ibmw)->stag_index);
	atomic_dec(&udev->num_mw);
	return 0;
}

int urdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		    struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibcq->device);
	struct urdma_cq *cq = to_ucq(ibcq);
	struct urdma_uresp_create_cq uresp = {};
	struct urdma_ureq_create_cq ureq = {};
	int rv;

	if (!udata)
		return -EOPNOTSUPP;
	if (attr->flags)
		return -EOPNOTSUPP;
	if (attr->cqe < 1 || attr->cqe > URDMA_MAX_CQE)
		return -EINVAL;
	if (udata->outlen < sizeof(uresp))
		return -EINVAL;
	if (udata->inlen) {
		if (udata->inlen < sizeof(ureq))
			return -EINVAL;
		rv = ib_copy_from_udata(&ureq, udata, sizeof(ureq));
		if (rv)
			return rv;
	}
	if (!urdma_reserve(&udev->num_cq, udev->limits.cq))
		return -ENOMEM;
	rv = urdma_cq_arm_pin(cq, ureq.arm_addr);
	if (rv)
		goto err_count;

	rv = xa_alloc_cyclic(&udev->cq_xa, &cq->id, cq, xa_limit_31b,
			     &udev->next_cq_id, GFP_KERNEL);
	if (rv < 0)
		goto err_arm;

	ibcq->cqe = attr->cqe;
	uresp.cq_id = cq->id;
	rv = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (rv)
		goto err_id;
	return 0;

err_id:
	xa_erase(&udev->cq_xa, cq->id);
err_arm:
	urdma_cq_arm_unpin(cq);
err_count:
	atomic_dec(&udev->num_cq);
	return rv;
}

/* No QP uses the CQ any more (ib_core checks), so no bell reads its arm. */
int urdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibcq->device);

	xa_erase(&udev->cq_xa, to_ucq(ibcq)->id);
	urdma_cq_arm_unpin(to_ucq(ibcq));
	atomic_dec(&udev->num_cq);
	return 0;
}

/* Completions are produced and consumed in user space only. */
int urdma_poll_cq(struct ib_cq *ibcq, int num_entries, struct ib_wc *wc)
{
	return -EOPNOTSUPP;
}

/*
 * The provider arms its CQs in user space and sends REQ_NOTIFY_CQ exactly
 * when the armed CQ has an event due; the kernel only has to wake the
 * completion channel, which is what comp_handler does for a uverbs CQ
 * (one event per call).  uverbs discards the return value.
 */
int urdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	if (!ibcq->uobject)
		return -EOPNOTSUPP;
	ibcq->comp_handler(ibcq, ibcq->cq_context);
	return 0;
}

int urdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		     struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibsrq->device);
	struct urdma_srq *srq = to_usrq(ibsrq);
	struct ib_srq_attr *attr = &init->attr;

	if (!udata)
		return -EOPNOTSUPP;
	if (init->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	if (!attr->max_wr || attr->max_wr > URDMA_MAX_SRQ_WR ||
	    attr->max_sge > URDMA_MAX_SGE || attr->srq_limit > attr->max_wr)
		return -EINVAL;
	if (!urdma_reserve(&udev->num_srq, udev->limits.srq))
		return -ENOMEM;
	mutex_init(&srq->lock);
	srq->max_wr = attr->max_wr;
	srq->max_sge = attr->max_sge;
	srq->limit = attr->srq_limit;
	return 0;
}

/* Raises IB_EVENT_SRQ_LIMIT_REACHED for the provider, which disarms it. */
static void urdma_srq_limit_reached(struct urdma_srq *srq)
{
	struct ib_srq *ibsrq = &srq->ibsrq;
	struct ib_event ev = {
		.device = ibsrq->device,
		.element.srq = ibsrq,
		.event = IB_EVENT_SRQ_LIMIT_REACHED,
	};

	mutex_lock(&srq->lock);
	srq->limit = 0;
	mutex_unlock(&srq->lock);
	if (ibsrq->event_handler)
		ibsrq->event_handler(&ev, ibsrq->srq_context);
}

int urdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		     enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct urdma_srq *srq = to_usrq(ibsrq);
	struct urdma_ureq_modify_srq ureq = {};
	int rv = 0;

	if (udata && udata->inlen) {
		if (udata->inlen < sizeof(ureq))
			return -EINVAL;
		rv = ib_copy_from_udata(&ureq, udata, sizeof(ureq));
		if (rv)
			return rv;
		if (ureq.flags & ~URDMA_SRQ_REPORT_LIMIT || ureq.reserved)
			return -EINVAL;
	}
	/* The provider's queue has a fixed size: no resizing, as siw. */
	if (mask & IB_SRQ_MAX_WR)
		return -EOPNOTSUPP;
	if (mask & ~IB_SRQ_LIMIT)
		return -EINVAL;
	if (ureq.flags & URDMA_SRQ_REPORT_LIMIT) {
		urdma_srq_limit_reached(srq);
		return 0;
	}
	mutex_lock(&srq->lock);
	if (mask & IB_SRQ_LIMIT) {
		if (attr->srq_limit > srq->max_wr)
			rv = -EINVAL;
		else
			srq->limit = attr->srq_limit;
	}
	mutex_unlock(&srq->lock);
	return rv;
}

int urdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct urdma_srq *srq = to_usrq(ibsrq);

	mutex_lock(&srq->lock);
	attr->max_wr = srq->max_wr;
	attr->max_sge = srq->max_sge;
	attr->srq_limit = srq->limit;
	mutex_unlock(&srq->lock);
	return 0;
}

int urdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct urdma_srq *srq = to_usrq(ibsrq);

	mutex_destroy(&srq->lock);
	atomic_dec(&to_udev(ibsrq->device)->num_srq);
	return 0;
}

static int urdma_check_qp_cap(const struct ib_qp_cap *cap)
{
	if (cap->max_send_wr > URDMA_MAX_QP_WR ||
	    cap->max_recv_wr > URDMA_MAX_QP_WR)
		return -EINVAL;
	if (cap->max_send_sge > URDMA_MAX_SGE ||
	    cap->max_recv_sge > URDMA_MAX_SGE)
		return -EINVAL;
	if (cap->max_inline_data > URDMA_MAX_INLINE)
		return -EINVAL;
	return 0;
}

int urdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		    struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibqp->device);
	struct urdma_qp *qp = to_uqp(ibqp);
	struct urdma_uresp_create_qp uresp = {};
	u32 qpn;
	int rv;

	if (!udata)
		return -EOPNOTSUPP;
	/* iWARP has reliable connected QPs only. */
	if (init->qp_type != IB_QPT_RC)
		return -EOPNOTSUPP;
	if (init->create_flags)
		return -EOPNOTSUPP;
	/* A QP on an SRQ takes its receives from there. */
	if (init->srq) {
		init->cap.max_recv_wr = 0;
		init->cap.max_recv_sge = 0;
	}
	rv = urdma_check_qp_cap(&init->cap);
	if (rv)
		return rv;
	if (!init->send_cq || !init->recv_cq)
		return -EINVAL;
	if (udata->outlen < sizeof(uresp))
		return -EINVAL;
	if (!urdma_reserve(&udev->num_qp, udev->limits.qp))
		return -ENOMEM;

	kref_init(&qp->ref);
	init_completion(&qp->released);
	mutex_init(&qp->lock);
	qp->state = IB_QPS_RESET;
	qp->cap = init->cap;
	qp->sq_sig_type = init->sq_sig_type;
	qp->owner = get_task_pid(current, PIDTYPE_TGID);

	/* From here on iw_get_qp can find the QP: it must be complete. */
	rv = xa_alloc_cyclic(&udev->qp_xa, &qpn, qp,
			     XA_LIMIT(URDMA_QPN_MIN, URDMA_QPN_MAX),
			     &udev->next_qpn, GFP_KERNEL);
	if (rv < 0)
		goto err_count;
	ibqp->qp_num = qpn;

	uresp.qp_id = qpn;
	rv = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (rv)
		goto err_qpn;
	return 0;

err_qpn:
	/* iw_cm may have found the QP meanwhile: same exit as destroy. */
	urdma_qp_unpublish(udev, qp);
err_count:
	put_pid(qp->owner);
	mutex_destroy(&qp->lock);
	atomic_dec(&udev->num_qp);
	return rv;
}

/*
 * Allowed state changes.  These are the IB transitions restricted to what
 * an iWARP QP can do: INIT may go straight to RTS because iw_cm moves a
 * connected QP there itself, and a closing (SQD) or terminated (SQE) QP
 * never returns to RTS.  Any state may go to RESET or ERR.  A move to SQD
 * from a state other than RTS is not here: urdma_modify_qp accepts it as a
 * no-op.
 */
static const u8 urdma_qp_next[IB_QPS_ERR + 1] = {
	[IB_QPS_RESET] = BIT(IB_QPS_INIT),
	[IB_QPS_INIT] = BIT(IB_QPS_INIT) | BIT(IB_QPS_RTR) | BIT(IB_QPS_RTS),
	[IB_QPS_RTR] = BIT(IB_QPS_RTS),
	[IB_QPS_RTS] = BIT(IB_QPS_RTS) | BIT(IB_QPS_SQD) | BIT(IB_QPS_SQE),
	[IB_QPS_SQD] = BIT(IB_QPS_SQD),
	[IB_QPS_SQE] = 0,
	[IB_QPS_ERR] = 0,
};

static bool urdma_qp_transition_ok(enum ib_qp_state cur,
				   enum ib_qp_state next)
{
	if (next == IB_QPS_RESET || next == IB_QPS_ERR)
		return true;
	return urdma_qp_next[cur] & BIT(next);
}

#define URDMA_QP_ACCESS (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | \
			 IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC | \
			 IB_ACCESS_MW_BIND)

static int urdma_check_qp_attr(const struct ib_qp_attr *attr, int mask)
{
	if ((mask & IB_QP_STATE) && attr->qp_state > IB_QPS_ERR)
		return -EINVAL;
	if ((mask & IB_QP_PORT) && attr->port_num != 1)
		return -EINVAL;
	if ((mask & IB_QP_ACCESS_FLAGS) &&
	    (attr->qp_access_flags & ~URDMA_QP_ACCESS))
		return -EINVAL;
	if ((mask & IB_QP_MAX_QP_RD_ATOMIC) &&
	    attr->max_rd_atomic > URDMA_MAX_ORD)
		return -EINVAL;
	if ((mask & IB_QP_MAX_DEST_RD_ATOMIC) &&
	    attr->max_dest_rd_atomic > URDMA_MAX_IRD)
		return -EINVAL;
	/* Queues are sized once, in the provider. */
	if (mask & IB_QP_CAP)
		return -EOPNOTSUPP;
	return 0;
}

int urdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
		    int mask, struct ib_udata *udata)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	enum ib_qp_state next;
	int rv;

	if (mask & ~IB_QP_ATTR_STANDARD_BITS)
		return -EOPNOTSUPP;
	rv = urdma_check_qp_attr(attr, mask);
	if (rv)
		return rv;

	/*
	 * iw_cm (no udata) closes a connection by moving its QP to SQD or
	 * ERR; the daemon does the closing, whatever state the QP is in.
	 */
	if (!udata && (mask & IB_QP_STATE) &&
	    (attr->qp_state == IB_QPS_SQD || attr->qp_state == IB_QPS_ERR))
		urdma_cm_qp_modified(qp, attr->qp_state, false);

	mutex_lock(&qp->lock);
	if ((mask & IB_QP_CUR_STATE) && attr->cur_qp_state != qp->state) {
		rv = -EINVAL;
		goto out;
	}
	next = (mask & IB_QP_STATE) ? attr->qp_state : qp->state;
	/*
	 * rdma_disconnect moves the QP to SQD whatever became of its
	 * connection.  As in siw, a QP that is not connected, or no longer
	 * (its connection failed), keeps its state and the call succeeds
	 * (docs/kernel-abi.md, "QP states").
	 */
	if (next == IB_QPS_SQD && qp->state != IB_QPS_RTS) {
		next = qp->state;
	} else if ((mask & IB_QP_STATE) &&
		   !urdma_qp_transition_ok(qp->state, next)) {
		rv = -EINVAL;
		goto out;
	}

	if (mask & IB_QP_ACCESS_FLAGS)
		qp->access = attr->qp_access_flags;
	if (mask & IB_QP_MAX_QP_RD_ATOMIC)
		qp->max_rd_atomic = attr->max_rd_atomic;
	if (mask & IB_QP_MAX_DEST_RD_ATOMIC)
		qp->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	qp->state = next;
out:
	mutex_unlock(&qp->lock);
	/* The owner's own move to SQD: its provider is closing. */
	if (!rv && udata && (mask & IB_QP_STATE) &&
	    attr->qp_state == IB_QPS_SQD)
		urdma_cm_qp_modified(qp, IB_QPS_SQD, true);
	return rv;
}

int urdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		   struct ib_qp_init_attr *init)
{
	struct urdma_dev *udev = to_udev(ibqp->device);
	struct urdma_qp *qp = to_uqp(ibqp);

	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));

	mutex_lock(&qp->lock);
	attr->qp_state = qp->state;
	attr->cur_qp_state = qp->state;
	attr->qp_access_flags = qp->access;
	attr->max_rd_atomic = qp->max_rd_atomic;
	attr->max_dest_rd_atomic = qp->max_dest_rd_atomic;
	attr->cap = qp->cap;
	init->sq_sig_type = qp->sq_sig_type;
	mutex_unlock(&qp->lock);

	attr->port_num = 1;
	attr->path_mtu = ib_mtu_int_to_enum(READ_ONCE(udev->netdev->mtu));
	init->qp_type = ibqp->qp_type;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->cap = attr->cap;
	return 0;
}

int urdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct urdma_dev *udev = to_udev(ibqp->device);
	struct urdma_qp *qp = to_uqp(ibqp);

	/*
	 * ib_core frees the QP when we return: end its connection, which
	 * makes iw_cm let go of it, then wait for that.
	 */
	urdma_cm_qp_destroy(qp);
	urdma_qp_unpublish(udev, qp);
	put_pid(qp->owner);
	mutex_destroy(&qp->lock);
	atomic_dec(&udev->num_qp);
	return 0;
}

/* Work requests are posted to the provider's queues, never here. */
int urdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		    const struct ib_send_wr **bad_wr)
{
	*bad_wr = wr;
	return -EOPNOTSUPP;
}

int urdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		    const struct ib_recv_wr **bad_wr)
{
	*bad_wr = wr;
	return -EOPNOTSUPP;
}
