// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Test module, not part of urdma: registers one inert RDMA device named
 * other0 with the driver id urdma uses, RDMA_DRIVER_UNKNOWN, as another
 * out-of-tree driver would.  The unload test checks that removing urdma
 * leaves it alone.  No uverbs (no alloc_ucontext), no port protocol, so no
 * ib_core client or provider ever uses it; every verb fails.
 */
#include <linux/module.h>
#include <rdma/ib_verbs.h>

/* ib_core allocates every object with a driver part around it. */
struct other_dev {
	struct ib_device ibdev;
};

struct other_pd {
	struct ib_pd ibpd;
};

struct other_cq {
	struct ib_cq ibcq;
};

struct other_qp {
	struct ib_qp ibqp;
};

static struct other_dev *other_dev;

static int other_query_device(struct ib_device *ibdev,
			      struct ib_device_attr *attr,
			      struct ib_udata *udata)
{
	memset(attr, 0, sizeof(*attr));
	return 0;
}

static int other_query_port(struct ib_device *ibdev, u32 port,
			    struct ib_port_attr *attr)
{
	memset(attr, 0, sizeof(*attr));
	attr->state = IB_PORT_DOWN;
	attr->phys_state = IB_PORT_PHYS_STATE_DISABLED;
	return 0;
}

static int other_get_port_immutable(struct ib_device *ibdev, u32 port,
				    struct ib_port_immutable *immutable)
{
	immutable->core_cap_flags = RDMA_CORE_PORT_RAW_PACKET;
	return 0;
}

static int other_fail(void)
{
	return -EOPNOTSUPP;
}

static int other_alloc_pd(struct ib_pd *pd, struct ib_udata *udata)
{
	return other_fail();
}

static int other_dealloc_pd(struct ib_pd *pd, struct ib_udata *udata)
{
	return 0;
}

static int other_create_qp(struct ib_qp *qp, struct ib_qp_init_attr *init,
			   struct ib_udata *udata)
{
	return other_fail();
}

static int other_modify_qp(struct ib_qp *qp, struct ib_qp_attr *attr,
			   int mask, struct ib_udata *udata)
{
	return other_fail();
}

static int other_destroy_qp(struct ib_qp *qp, struct ib_udata *udata)
{
	return 0;
}

static int other_post_send(struct ib_qp *qp, const struct ib_send_wr *wr,
			   const struct ib_send_wr **bad_wr)
{
	*bad_wr = wr;
	return other_fail();
}

static int other_post_recv(struct ib_qp *qp, const struct ib_recv_wr *wr,
			   const struct ib_recv_wr **bad_wr)
{
	*bad_wr = wr;
	return other_fail();
}

static int other_create_cq(struct ib_cq *cq, const struct ib_cq_init_attr *attr,
			   struct ib_udata *udata)
{
	return other_fail();
}

static int other_destroy_cq(struct ib_cq *cq, struct ib_udata *udata)
{
	return 0;
}

static int other_poll_cq(struct ib_cq *cq, int n, struct ib_wc *wc)
{
	return other_fail();
}

static int other_req_notify_cq(struct ib_cq *cq, enum ib_cq_notify_flags f)
{
	return other_fail();
}

static struct ib_mr *other_get_dma_mr(struct ib_pd *pd, int access)
{
	return ERR_PTR(other_fail());
}

static struct ib_mr *other_reg_user_mr(struct ib_pd *pd, u64 start,
				       u64 length, u64 va, int access,
				       struct ib_udata *udata)
{
	return ERR_PTR(other_fail());
}

static int other_dereg_mr(struct ib_mr *mr, struct ib_udata *udata)
{
	return 0;
}

/* Present so that ib_unregister_driver() would take this device too. */
static void other_dealloc_driver(struct ib_device *ibdev)
{
}

static const struct ib_device_ops other_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,

	.alloc_pd = other_alloc_pd,
	.create_cq = other_create_cq,
	.create_qp = other_create_qp,
	.dealloc_driver = other_dealloc_driver,
	.dealloc_pd = other_dealloc_pd,
	.dereg_mr = other_dereg_mr,
	.destroy_cq = other_destroy_cq,
	.destroy_qp = other_destroy_qp,
	.get_dma_mr = other_get_dma_mr,
	.get_port_immutable = other_get_port_immutable,
	.modify_qp = other_modify_qp,
	.poll_cq = other_poll_cq,
	.post_recv = other_post_recv,
	.post_send = other_post_send,
	.query_device = other_query_device,
	.query_port = other_query_port,
	.reg_user_mr = other_reg_user_mr,
	.req_notify_cq = other_req_notify_cq,

	INIT_RDMA_OBJ_SIZE(ib_cq, other_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_pd, other_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, other_qp, ibqp),
};

static int __init other_init(void)
{
	struct ib_device *ibdev;
	int rv;

	other_dev = ib_alloc_device(other_dev, ibdev);
	if (!other_dev)
		return -ENOMEM;
	ibdev = &other_dev->ibdev;
	ibdev->node_type = RDMA_NODE_UNSPECIFIED;
	ibdev->phys_port_cnt = 1;
	ibdev->num_comp_vectors = 1;
	strscpy(ibdev->node_desc, "other", sizeof(ibdev->node_desc));
	ib_set_device_ops(ibdev, &other_ops);
	rv = ib_register_device(ibdev, "other%d", NULL);
	if (rv)
		ib_dealloc_device(ibdev);
	return rv;
}

static void __exit other_exit(void)
{
	/* Only this module's device: never by driver id. */
	ib_unregister_device(&other_dev->ibdev);
}

module_init(other_init);
module_exit(other_exit);

MODULE_DESCRIPTION("urdma test: an inert device of another RDMA_DRIVER_UNKNOWN driver");
MODULE_LICENSE("Dual BSD/GPL");
