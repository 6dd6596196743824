/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * urdma: software iWARP over UDP with a user-space data path.
 *
 * The kernel side owns the verbs objects (so that ib_core, rdma_cm and
 * resource tracking see them) but never moves data: posting and polling
 * happen in the provider.  Everything here is bookkeeping and limits.
 */
#ifndef URDMA_H
#define URDMA_H

#include <linux/atomic.h>
#include <linux/kref.h>
#include <linux/completion.h>
#include <linux/mutex.h>
#include <linux/stringify.h>
#include <linux/netdevice.h>
#include <linux/xarray.h>
#include <rdma/ib_verbs.h>
#include <rdma/ib_umem.h>

#include "urdma-abi.h"

/*
 * The module's version, reported as the device's firmware version.  sysfs
 * fw_ver shows the string; query_device carries the numbers in the layout
 * rdma-core providers decode (major in bits 63..32, minor 31..16, sub
 * 15..0), which is what ibv_devinfo prints.
 */
#define URDMA_FW_MAJOR		0
#define URDMA_FW_MINOR		1
#define URDMA_FW_SUB		0
#define URDMA_FW_VERSION	__stringify(URDMA_FW_MAJOR) "." \
				__stringify(URDMA_FW_MINOR) "." \
				__stringify(URDMA_FW_SUB)
#define URDMA_FW_VER_RAW	(((u64)URDMA_FW_MAJOR << 32) | \
				 ((u64)URDMA_FW_MINOR << 16) | URDMA_FW_SUB)

/*
 * Device limits.  They describe what this module accounts for and what the
 * provider's queues are sized for; query_device reports exactly these and
 * every create path enforces them.  The object counts can be lowered per
 * module load (module parameters), never raised.
 */
#define URDMA_MAX_CONTEXT	1024
#define URDMA_MAX_PD		16384
#define URDMA_MAX_MR		65536
#define URDMA_MAX_MW		65536
#define URDMA_MAX_CQ		16384
#define URDMA_MAX_CQE		4194304
#define URDMA_MAX_QP		16384
#define URDMA_MAX_QP_WR		16384
#define URDMA_MAX_SRQ		16384
#define URDMA_MAX_SRQ_WR	16384
#define URDMA_MAX_SGE		8
#define URDMA_MAX_SGE_RD	1
#define URDMA_MAX_INLINE	256
/* Outstanding RDMA READs a QP may issue (ORD) and accept (IRD). */
#define URDMA_MAX_ORD		32
#define URDMA_MAX_IRD		32
/*
 * No IEEE OUI is ours: the value rxe reports for the same reason. Zero would
 * read as "no vendor" to tools and test suites that expect one.
 */
#define URDMA_VENDOR_ID		0xffffff
/* 1 TiB */
#define URDMA_MAX_MR_SIZE	0x10000000000ULL

/*
 * QP numbers double as the handle rdma_cm passes to iw_get_qp.  0 and 1
 * are special QPs on IB; keeping them unused avoids any confusion in
 * tools that assume so.  The allocation range is larger than URDMA_MAX_QP
 * so that cyclic allocation does not reuse a number right after a destroy.
 */
#define URDMA_QPN_MIN		2
#define URDMA_QPN_MAX		((1U << 24) - 1)
/* An STag is a 24-bit index and an 8-bit key. */
#define URDMA_STAG_INDEX_MAX	((1U << 24) - 1)

/* Object counts of one device, fixed when it is created. */
struct urdma_limits {
	u32 ctx;
	u32 pd;
	u32 mr;
	u32 mw;
	u32 cq;
	u32 qp;
	u32 srq;
};

struct urdma_dev {
	struct ib_device ibdev;
	struct urdma_limits limits;
	struct net_device *netdev;
	netdevice_tracker netdev_tracker;
	struct list_head link;		/* on urdma_dev_list */
	bool gone;			/* dealloc_driver ran, under urdma_dev_lock */

	/* Port state last announced with an IB event, under rtnl. */
	enum ib_port_state announced_state;

	atomic_t num_ctx;
	atomic_t num_pd;
	atomic_t num_mr;
	atomic_t num_mw;
	atomic_t num_cq;
	atomic_t num_qp;
	atomic_t num_srq;

	struct xarray qp_xa;
	u32 next_qpn;
	struct xarray cq_xa;
	u32 next_cq_id;
	struct xarray mr_xa;		/* STag indices of MRs and MWs */
	u32 next_stag_index;

	atomic64_t bell_events;		/* completion events the bell fired */
	atomic64_t bell_hushed;		/* frames left to a thread in a call */
	atomic64_t bell_late;		/* ... that no call read in time */
	atomic64_t bell_quiet;		/* frames read with what comes next */
};

/* hw_counters: urdmad's (enum urdma_stat), then the module's own. */
#define URDMA_HW_BELL_EVENTS	URDMA_STAT_COUNT
#define URDMA_HW_BELL_HUSHED	(URDMA_STAT_COUNT + 1)
#define URDMA_HW_BELL_LATE	(URDMA_STAT_COUNT + 2)
#define URDMA_HW_BELL_QUIET	(URDMA_STAT_COUNT + 3)
#define URDMA_HW_COUNT		(URDMA_STAT_COUNT + 4)

struct urdma_ucontext {
	struct ib_ucontext ibucontext;
};

struct urdma_pd {
	struct ib_pd ibpd;
};

struct urdma_cq {
	struct ib_cq ibcq;
	u32 id;
	struct page *arm_page;	/* pinned from create to destroy, or NULL */
	u32 *arm;		/* the provider's arm word (enum urdma_cq_arm) */
};

/* The receives live in the provider; the module keeps the limits. */
struct urdma_srq {
	struct ib_srq ibsrq;
	struct mutex lock;	/* max_wr, max_sge, limit */
	u32 max_wr;
	u32 max_sge;
	u32 limit;
};

struct urdma_mr {
	struct ib_mr ibmr;
	struct ib_umem *umem;
	u64 va;
	u64 length;
	int access;
	u32 stag_index;
};

/* What a window is bound to lives in the provider, with its binds. */
struct urdma_mw {
	struct ib_mw ibmw;
	u32 stag_index;
};

struct urdma_qp {
	struct ib_qp ibqp;
	/* iw_cm takes references while it looks at the QP. */
	struct kref ref;
	struct completion released;
	/* iw_get_qp's references that iw_add_ref has not claimed yet */
	atomic_t cm_lookups;

	struct mutex lock;		/* serializes modify and query */
	enum ib_qp_state state;
	int access;
	u8 max_rd_atomic;
	u8 max_dest_rd_atomic;
	struct ib_qp_cap cap;
	enum ib_sig_type sq_sig_type;
	struct urdma_bell *bell;	/* under urdma_cm_mutex */
	struct pid *owner;		/* the creating process */
};

static inline struct urdma_dev *to_udev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct urdma_dev, ibdev);
}

static inline struct urdma_pd *to_upd(struct ib_pd *ibpd)
{
	return container_of(ibpd, struct urdma_pd, ibpd);
}

static inline struct urdma_cq *to_ucq(struct ib_cq *ibcq)
{
	return container_of(ibcq, struct urdma_cq, ibcq);
}

static inline struct urdma_srq *to_usrq(struct ib_srq *ibsrq)
{
	return container_of(ibsrq, struct urdma_srq, ibsrq);
}

static inline struct urdma_mr *to_umr(struct ib_mr *ibmr)
{
	return container_of(ibmr, struct urdma_mr, ibmr);
}

static inline struct urdma_mw *to_umw(struct ib_mw *ibmw)
{
	return container_of(ibmw, struct urdma_mw, ibmw);
}

static inline struct urdma_qp *to_uqp(struct ib_qp *ibqp)
{
	return container_of(ibqp, struct urdma_qp, ibqp);
}

/* The port is usable when the interface is up and has carrier. */
static inline enum ib_port_state urdma_port_state(const struct urdma_dev *udev)
{
	if (netif_running(udev->netdev) && netif_carrier_ok(udev->netdev))
		return IB_PORT_ACTIVE;
	return IB_PORT_DOWN;
}

/* urdma_verbs.c */
int urdma_query_device(struct ib_device *ibdev, struct ib_device_attr *attr,
		       struct ib_udata *udata);
int urdma_query_port(struct ib_device *ibdev, u32 port,
		     struct ib_port_attr *attr);
int urdma_get_port_immutable(struct ib_device *ibdev, u32 port,
			     struct ib_port_immutable *immutable);
int urdma_query_gid(struct ib_device *ibdev, u32 port, int idx,
		    union ib_gid *gid);
void urdma_get_dev_fw_str(struct ib_device *ibdev, char *str);
int urdma_alloc_ucontext(struct ib_ucontext *ibuctx, struct ib_udata *udata);
void urdma_dealloc_ucontext(struct ib_ucontext *ibuctx);
void urdma_disassociate_ucontext(struct ib_ucontext *ibuctx);
int urdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata);
int urdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata);
struct ib_mr *urdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				u64 virt_addr, int access,
				struct ib_udata *udata);
int urdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata);
struct ib_mr *urdma_get_dma_mr(struct ib_pd *ibpd, int access);
int urdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata);
int urdma_dealloc_mw(struct ib_mw *ibmw);
int urdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		    struct ib_udata *udata);
int urdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata);
int urdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		     struct ib_udata *udata);
int urdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		     enum ib_srq_attr_mask mask, struct ib_udata *udata);
int urdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr);
int urdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata);
int urdma_poll_cq(struct ib_cq *ibcq, int num_entries, struct ib_wc *wc);
int urdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags);
int urdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		    struct ib_udata *udata);
int urdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
		    int mask, struct ib_udata *udata);
int urdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		   struct ib_qp_init_attr *init);
int urdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata);
int urdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		    const struct ib_send_wr **bad_wr);
int urdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		    const struct ib_recv_wr **bad_wr);

/* urdma_bell.c */
int urdma_cq_arm_pin(struct urdma_cq *cq, u64 addr);
void urdma_cq_arm_unpin(struct urdma_cq *cq);
int urdma_bell_attach(struct urdma_qp *qp, int sock_fd, int map_fd,
		      int hush_fd);
void urdma_bell_detach(struct urdma_qp *qp);
bool urdma_bell_ring(struct urdma_qp *qp, u32 verdict);

/* urdma_iwcm.c */
void urdma_qp_get(struct ib_qp *ibqp);
void urdma_qp_put(struct ib_qp *ibqp);
struct ib_qp *urdma_get_qp(struct ib_device *ibdev, int qpn);
void urdma_qp_unpublish(struct urdma_dev *udev, struct urdma_qp *qp);
int urdma_connect(struct iw_cm_id *id, struct iw_cm_conn_param *param);
int urdma_accept(struct iw_cm_id *id, struct iw_cm_conn_param *param);
int urdma_reject(struct iw_cm_id *id, const void *pdata, u8 pdata_len);
int urdma_create_listen(struct iw_cm_id *id, int backlog);
int urdma_destroy_listen(struct iw_cm_id *id);

/* urdma_cm.c */
void urdma_cm_qp_modified(struct urdma_qp *qp, enum ib_qp_state state,
			  bool by_owner);
void urdma_cm_qp_destroy(struct urdma_qp *qp);
void urdma_cm_dev_gone(struct urdma_dev *udev);
int urdma_cm_init(void);
void urdma_cm_exit(void);

/* urdma_chan.c */
void urdma_cm_netdev_unregister(struct net_device *netdev);
void urdma_cm_read_stats(struct urdma_dev *udev, u64 *values);
extern const struct attribute_group urdma_attr_group;

#endif /* URDMA_H */
