// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * urdma device life cycle: "rdma link add NAME type urdma netdev IF"
 * creates one iWARP device per Ethernet interface; the port follows the
 * interface's state; deleting the link, unregistering the interface or
 * unloading the module removes the device.
 */
#include <linux/module.h>
#include <linux/if_arp.h>
#include <linux/etherdevice.h>
#include <linux/rtnetlink.h>
#include <linux/spinlock.h>
#include <net/addrconf.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/iw_cm.h>
#include <rdma/rdma_netlink.h>

#include "urdma.h"

/*
 * Every device this module created and still holds a reference to.
 *
 * ib_device_get_by_netdev() cannot tell our devices apart from those of any
 * other driver that also uses RDMA_DRIVER_UNKNOWN, nor from an rxe device on
 * the same interface, so the notifier finds its devices here.
 *
 * The list is also the unload fence.  ib_core calls dealloc_driver, the last
 * of our code that runs for a device, with the device's unregistration lock
 * held, and ib_unregister_device() takes that lock, even on a device that is
 * already unregistered.  So calling it on every entry, including a device
 * that "rdma link delete" or a queued unregistration is tearing down right
 * now, returns only when no thread is left in this module's code for that
 * device.  Hence an entry (and the reference that keeps the lock's memory
 * alive) outlives dealloc_driver; it is only marked gone there, and reaped
 * on the next link add or at unload.  Unlike ib_unregister_driver(), this
 * leaves the devices of other drivers using RDMA_DRIVER_UNKNOWN alone.
 */
static LIST_HEAD(urdma_dev_list);
static DEFINE_SPINLOCK(urdma_dev_lock);

static unsigned int max_ctx = URDMA_MAX_CONTEXT;
module_param(max_ctx, uint, 0444);
MODULE_PARM_DESC(max_ctx, "user contexts per device (at most " __stringify(URDMA_MAX_CONTEXT) ")");
static unsigned int max_pd = URDMA_MAX_PD;
module_param(max_pd, uint, 0444);
MODULE_PARM_DESC(max_pd, "protection domains per device (at most " __stringify(URDMA_MAX_PD) ")");
static unsigned int max_mr = URDMA_MAX_MR;
module_param(max_mr, uint, 0444);
MODULE_PARM_DESC(max_mr, "memory regions per device (at most " __stringify(URDMA_MAX_MR) ")");
static unsigned int max_mw = URDMA_MAX_MW;
module_param(max_mw, uint, 0444);
MODULE_PARM_DESC(max_mw, "memory windows per device (at most " __stringify(URDMA_MAX_MW) ")");
static unsigned int max_cq = URDMA_MAX_CQ;
module_param(max_cq, uint, 0444);
MODULE_PARM_DESC(max_cq, "completion queues per device (at most " __stringify(URDMA_MAX_CQ) ")");
static unsigned int max_srq = URDMA_MAX_SRQ;
module_param(max_srq, uint, 0444);
MODULE_PARM_DESC(max_srq, "SRQs per device (at most " __stringify(URDMA_MAX_SRQ) ")");
static unsigned int max_qp = URDMA_MAX_QP;
module_param(max_qp, uint, 0444);
MODULE_PARM_DESC(max_qp, "queue pairs per device (at most " __stringify(URDMA_MAX_QP) ")");

static void urdma_set_limits(struct urdma_limits *l)
{
	l->ctx = clamp_t(u32, max_ctx, 1, URDMA_MAX_CONTEXT);
	l->pd = clamp_t(u32, max_pd, 1, URDMA_MAX_PD);
	l->mr = clamp_t(u32, max_mr, 1, URDMA_MAX_MR);
	l->mw = clamp_t(u32, max_mw, 1, URDMA_MAX_MW);
	l->cq = clamp_t(u32, max_cq, 1, URDMA_MAX_CQ);
	l->qp = clamp_t(u32, max_qp, 1, URDMA_MAX_QP);
	l->srq = clamp_t(u32, max_srq, 1, URDMA_MAX_SRQ);
}

static void urdma_dealloc_driver(struct ib_device *ibdev)
{
	struct urdma_dev *udev = to_udev(ibdev);

	spin_lock(&urdma_dev_lock);
	udev->gone = true;
	spin_unlock(&urdma_dev_lock);

	/* ib_core destroyed every user object before calling us. */
	WARN_ON(!xa_empty(&udev->qp_xa));
	WARN_ON(!xa_empty(&udev->cq_xa));
	WARN_ON(!xa_empty(&udev->mr_xa));
	urdma_cm_dev_gone(udev);
	xa_destroy(&udev->qp_xa);
	xa_destroy(&udev->cq_xa);
	xa_destroy(&udev->mr_xa);
	netdev_put(udev->netdev, &udev->netdev_tracker);
}

/*
 * Names of the counters urdmad sends (enum urdma_stat), as hw_counters show
 * them, and after them the module's own.
 */
static const struct rdma_stat_desc urdma_stat_descs[] = {
	[URDMA_STAT_RX_FRAMES] = { .name = "rx_frames" },
	[URDMA_STAT_TX_FRAMES] = { .name = "tx_frames" },
	[URDMA_STAT_RX_DROPS] = { .name = "rx_drops" },
	[URDMA_STAT_RX_PACKETS] = { .name = "rx_packets" },
	[URDMA_STAT_TX_PACKETS] = { .name = "tx_packets" },
	[URDMA_STAT_RETRANSMISSIONS] = { .name = "retransmissions" },
	[URDMA_STAT_TIMEOUTS] = { .name = "timeouts" },
	[URDMA_STAT_DUPLICATES] = { .name = "duplicates" },
	[URDMA_STAT_CRC_ERRORS] = { .name = "crc_errors" },
	[URDMA_STAT_MALFORMED] = { .name = "malformed" },
	[URDMA_HW_BELL_EVENTS] = { .name = "bell_events" },
	[URDMA_HW_BELL_HUSHED] = { .name = "bell_hushed" },
	[URDMA_HW_BELL_LATE] = { .name = "bell_late" },
	[URDMA_HW_BELL_QUIET] = { .name = "bell_quiet" },
};

static struct rdma_hw_stats *
urdma_alloc_hw_port_stats(struct ib_device *ibdev, u32 port_num)
{
	BUILD_BUG_ON(ARRAY_SIZE(urdma_stat_descs) != URDMA_HW_COUNT);
	return rdma_alloc_hw_stats_struct(urdma_stat_descs, URDMA_HW_COUNT,
					  RDMA_HW_STATS_DEFAULT_LIFESPAN);
}

static int urdma_get_hw_stats(struct ib_device *ibdev,
			      struct rdma_hw_stats *stats, u32 port, int index)
{
	struct urdma_dev *udev = to_udev(ibdev);

	urdma_cm_read_stats(udev, stats->value);
	stats->value[URDMA_HW_BELL_EVENTS] = atomic64_read(&udev->bell_events);
	stats->value[URDMA_HW_BELL_HUSHED] = atomic64_read(&udev->bell_hushed);
	stats->value[URDMA_HW_BELL_LATE] = atomic64_read(&udev->bell_late);
	stats->value[URDMA_HW_BELL_QUIET] = atomic64_read(&udev->bell_quiet);
	return stats->num_counters;
}

static const struct ib_device_ops urdma_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = URDMA_ABI_VERSION,

	.alloc_hw_port_stats = urdma_alloc_hw_port_stats,
	.alloc_mw = urdma_alloc_mw,
	.alloc_pd = urdma_alloc_pd,
	.alloc_ucontext = urdma_alloc_ucontext,
	.create_cq = urdma_create_cq,
	.create_qp = urdma_create_qp,
	.create_srq = urdma_create_srq,
	.dealloc_driver = urdma_dealloc_driver,
	.dealloc_mw = urdma_dealloc_mw,
	.dealloc_pd = urdma_dealloc_pd,
	.device_group = &urdma_attr_group,
	.dealloc_ucontext = urdma_dealloc_ucontext,
	.dereg_mr = urdma_dereg_mr,
	.destroy_cq = urdma_destroy_cq,
	.destroy_qp = urdma_destroy_qp,
	.destroy_srq = urdma_destroy_srq,
	.disassociate_ucontext = urdma_disassociate_ucontext,
	.get_dev_fw_str = urdma_get_dev_fw_str,
	.get_dma_mr = urdma_get_dma_mr,
	.get_hw_stats = urdma_get_hw_stats,
	.get_port_immutable = urdma_get_port_immutable,
	.iw_accept = urdma_accept,
	.iw_add_ref = urdma_qp_get,
	.iw_connect = urdma_connect,
	.iw_create_listen = urdma_create_listen,
	.iw_destroy_listen = urdma_destroy_listen,
	.iw_get_qp = urdma_get_qp,
	.iw_reject = urdma_reject,
	.iw_rem_ref = urdma_qp_put,
	.modify_qp = urdma_modify_qp,
	.modify_srq = urdma_modify_srq,
	.poll_cq = urdma_poll_cq,
	.post_recv = urdma_post_recv,
	.post_send = urdma_post_send,
	.query_device = urdma_query_device,
	.query_gid = urdma_query_gid,
	.query_port = urdma_query_port,
	.query_qp = urdma_query_qp,
	.query_srq = urdma_query_srq,
	.reg_user_mr = urdma_reg_user_mr,
	.req_notify_cq = urdma_req_notify_cq,

	INIT_RDMA_OBJ_SIZE(ib_cq, urdma_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_mw, urdma_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_pd, urdma_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, urdma_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, urdma_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, urdma_ucontext, ibucontext),
};

/* Returns the device on @netdev with a reference held, or NULL. */
static struct urdma_dev *urdma_dev_get_by_netdev(struct net_device *netdev)
{
	struct urdma_dev *udev, *found = NULL;

	spin_lock(&urdma_dev_lock);
	list_for_each_entry(udev, &urdma_dev_list, link) {
		if (!udev->gone && udev->netdev == netdev &&
		    ib_device_try_get(&udev->ibdev)) {
			found = udev;
			break;
		}
	}
	spin_unlock(&urdma_dev_lock);
	return found;
}

/*
 * Lists @udev, with a reference of the list's own, unless its interface
 * already has a device that is not gone.
 */
static int urdma_dev_list_add(struct urdma_dev *udev)
{
	struct urdma_dev *other;
	int rv = 0;

	spin_lock(&urdma_dev_lock);
	list_for_each_entry(other, &urdma_dev_list, link) {
		if (!other->gone && other->netdev == udev->netdev)
			rv = -EEXIST;
	}
	if (!rv) {
		get_device(&udev->ibdev.dev);
		list_add_tail(&udev->link, &urdma_dev_list);
	}
	spin_unlock(&urdma_dev_lock);
	return rv;
}

/* Only for a device that never got registered, before its dealloc. */
static void urdma_dev_list_del(struct urdma_dev *udev)
{
	spin_lock(&urdma_dev_lock);
	list_del_init(&udev->link);
	spin_unlock(&urdma_dev_lock);
	put_device(&udev->ibdev.dev);
}

/*
 * Drops the entries of devices that are gone, or of all devices (which
 * unregisters those still registered).  May sleep: each entry waits until
 * any unregistration of its device in flight, including the call of
 * dealloc_driver, has finished.
 */
static void urdma_dev_reap(bool all)
{
	struct urdma_dev *udev, *next;
	LIST_HEAD(reap);

	spin_lock(&urdma_dev_lock);
	list_for_each_entry_safe(udev, next, &urdma_dev_list, link) {
		if (all || udev->gone)
			list_move_tail(&udev->link, &reap);
	}
	spin_unlock(&urdma_dev_lock);

	list_for_each_entry_safe(udev, next, &reap, link) {
		ib_unregister_device(&udev->ibdev);
		put_device(&udev->ibdev.dev);
	}
}

static void urdma_port_event(struct urdma_dev *udev, enum ib_event_type type)
{
	struct ib_event event = {
		.device = &udev->ibdev,
		.element.port_num = 1,
		.event = type,
	};

	ib_dispatch_event(&event);
}

/* Called under rtnl, which orders the state announcements. */
static void urdma_port_update(struct urdma_dev *udev)
{
	enum ib_port_state state = urdma_port_state(udev);

	if (state == udev->announced_state)
		return;
	udev->announced_state = state;
	urdma_port_event(udev, state == IB_PORT_ACTIVE ?
			 IB_EVENT_PORT_ACTIVE : IB_EVENT_PORT_ERR);
}

static int urdma_netdev_event(struct notifier_block *nb, unsigned long event,
			      void *arg)
{
	struct net_device *netdev = netdev_notifier_info_to_dev(arg);
	struct urdma_dev *udev;

	/* A daemon's registration may exist without a device. */
	if (event == NETDEV_UNREGISTER)
		urdma_cm_netdev_unregister(netdev);

	udev = urdma_dev_get_by_netdev(netdev);
	if (!udev)
		return NOTIFY_DONE;

	switch (event) {
	case NETDEV_UP:
	case NETDEV_DOWN:
	case NETDEV_CHANGE:
		urdma_port_update(udev);
		break;
	case NETDEV_CHANGENAME:
		memcpy(udev->ibdev.iw_ifname, netdev->name,
		       sizeof(udev->ibdev.iw_ifname));
		break;
	case NETDEV_CHANGEADDR:
		/* The GID is read from the interface on every query. */
		urdma_port_event(udev, IB_EVENT_GID_CHANGE);
		break;
	case NETDEV_UNREGISTER:
		/* Not under rtnl: unregistration waits for users to leave. */
		ib_unregister_device_queued(&udev->ibdev);
		break;
	default:
		break;
	}
	ib_device_put(&udev->ibdev);
	return NOTIFY_OK;
}

static struct notifier_block urdma_netdev_nb = {
	.notifier_call = urdma_netdev_event,
};

static struct urdma_dev *urdma_dev_alloc(struct net_device *netdev)
{
	struct urdma_dev *udev;
	struct ib_device *ibdev;

	udev = ib_alloc_device(urdma_dev, ibdev);
	if (!udev)
		return NULL;
	ibdev = &udev->ibdev;

	udev->netdev = netdev;
	urdma_set_limits(&udev->limits);
	netdev_hold(netdev, &udev->netdev_tracker, GFP_KERNEL);
	INIT_LIST_HEAD(&udev->link);
	xa_init_flags(&udev->qp_xa, XA_FLAGS_ALLOC);
	xa_init_flags(&udev->cq_xa, XA_FLAGS_ALLOC1);
	xa_init_flags(&udev->mr_xa, XA_FLAGS_ALLOC1);
	udev->next_qpn = URDMA_QPN_MIN;
	atomic_set(&udev->num_ctx, 0);
	atomic_set(&udev->num_pd, 0);
	atomic_set(&udev->num_mr, 0);
	atomic_set(&udev->num_mw, 0);
	atomic_set(&udev->num_cq, 0);
	atomic_set(&udev->num_qp, 0);
	atomic_set(&udev->num_srq, 0);

	ibdev->node_type = RDMA_NODE_RNIC;
	ibdev->phys_port_cnt = 1;
	/* No interrupts: completions are polled in user space. */
	ibdev->num_comp_vectors = 1;
	addrconf_addr_eui48((u8 *)&ibdev->node_guid, netdev->dev_addr);
	strscpy(ibdev->node_desc, URDMA_NODE_DESC, sizeof(ibdev->node_desc));
	memcpy(ibdev->iw_ifname, netdev->name, sizeof(ibdev->iw_ifname));
	/* Our connection setup runs over UDP: no iwpmd port mapping. */
	ibdev->iw_driver_flags = IW_F_NO_PORT_MAP;
	/* The provider wakes completion channels through the kernel. */
	ibdev->uverbs_cmd_mask |= BIT_ULL(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ);
	ib_set_device_ops(ibdev, &urdma_dev_ops);

	return udev;
}

static int urdma_newlink(const char *ibdev_name, struct net_device *netdev)
{
	struct urdma_dev *udev;
	int rv;

	/* The GID and node GUID are derived from a 6-byte MAC address. */
	if (netdev->type != ARPHRD_ETHER || netdev->addr_len != ETH_ALEN)
		return -EINVAL;

	/* Keeps the list as short as the devices that exist. */
	urdma_dev_reap(false);

	udev = urdma_dev_alloc(netdev);
	if (!udev)
		return -ENOMEM;

	rv = ib_device_set_netdev(&udev->ibdev, netdev, 1);
	if (rv)
		goto err_dealloc;

	/* Listed before registration so that no interface event is missed. */
	rv = urdma_dev_list_add(udev);
	if (rv)
		goto err_dealloc;

	udev->announced_state = urdma_port_state(udev);
	rv = ib_register_device(&udev->ibdev, ibdev_name, NULL);
	if (rv)
		goto err_unlist;
	dev_info(&udev->ibdev.dev, "urdma device on %s\n", netdev->name);

	/*
	 * Once registered, the device can be deleted at any time ("rdma link
	 * delete" by name); the list's reference keeps its memory.  If it is
	 * already going, there is nothing to catch up on.
	 */
	if (!ib_device_try_get(&udev->ibdev))
		return 0;

	/*
	 * The notifier cannot take a device that is still registering, so
	 * catch up under rtnl: the interface may have changed state, or even
	 * started to go away, in the meantime.
	 */
	rtnl_lock();
	if (netdev->reg_state != NETREG_REGISTERED)
		ib_unregister_device_queued(&udev->ibdev);
	else
		urdma_port_update(udev);
	rtnl_unlock();
	ib_device_put(&udev->ibdev);
	return 0;

err_unlist:
	urdma_dev_list_del(udev);
err_dealloc:
	/* Runs urdma_dealloc_driver, which undoes the allocation. */
	ib_dealloc_device(&udev->ibdev);
	return rv;
}

static struct rdma_link_ops urdma_link_ops = {
	.type = "urdma",
	.newlink = urdma_newlink,
};

static int __init urdma_init(void)
{
	int rv;

	rv = urdma_cm_init();
	if (rv)
		return rv;
	rv = register_netdevice_notifier(&urdma_netdev_nb);
	if (rv) {
		urdma_cm_exit();
		return rv;
	}
	rdma_link_register(&urdma_link_ops);
	return 0;
}

static void __exit urdma_exit(void)
{
	/* Waits for link adds in progress; none can start afterwards. */
	rdma_link_unregister(&urdma_link_ops);
	urdma_dev_reap(true);
	/*
	 * Last, so that the NETDEV_UNREGISTER this replays for every
	 * interface finds no device left to queue.
	 */
	unregister_netdevice_notifier(&urdma_netdev_nb);
	/* Nobody has it open: an open file pins the module. */
	urdma_cm_exit();
}

module_init(urdma_init);
module_exit(urdma_exit);

MODULE_ALIAS_RDMA_LINK("urdma");
MODULE_VERSION(URDMA_FW_VERSION);
MODULE_DESCRIPTION("urdma: iWARP over UDP with a user-space data path");
MODULE_LICENSE("Dual BSD/GPL");
