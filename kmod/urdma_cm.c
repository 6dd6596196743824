// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * iw_cm glue and the urdmad channel (/dev/urdma_cm).
 *
 * The TRP handshake runs in urdmad (docs/connection.md); this file keeps
 * what only the kernel can: iw_cm's events, the QP's kernel state and the
 * next hop's MAC.  Every iw_cm op becomes a message to the daemon that
 * serves the device's interface, and every daemon message becomes at most
 * one iw_cm event.  The rules iw_cm imposes (exactly one CONNECT_REPLY
 * after a successful connect, exactly one CLOSE after an established
 * connection, nothing after a reject) are kept here even when the daemon
 * goes away or the QP is destroyed first.
 *
 * Locking: urdma_cm_mutex protects every list and endpoint state below.
 * It nests outside a QP's lock and inside rtnl (netdev notifier).  Posting
 * an event to iw_cm never sleeps, so it is done under the mutex, which
 * keeps each endpoint's events in the order its state changed.
 */
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/moduleparam.h>
#include <linux/pid_namespace.h>
#include <linux/poll.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>
#include <linux/etherdevice.h>
#include <net/arp.h>
#include <net/ipv6.h>
#include <net/neighbour.h>
#include <net/route.h>
#include <rdma/iw_cm.h>

#include "urdma.h"

/* How long iw_accept waits for urdmad's ACCEPTED. */
#define URDMA_ACCEPT_TIMEOUT	(5 * HZ)
/*
 * How long a CONNECT may stay unanswered, in seconds.  urdmad gives up on
 * a handshake after about a minute (docs/connection.md); this only bounds
 * what a hung daemon would otherwise make unbounded: iw_cm holds
 * rdma_destroy_id, and the exit of the owning process, uninterruptibly
 * until the CONNECT_REPLY.  Writable, so that a test of the bound need not
 * wait 90 s; a connect keeps the value it started with.
 */
#define URDMA_CONNECT_TIMEOUT_MAX	3600
static unsigned int urdma_connect_timeout_s = 90;

static int urdma_set_connect_timeout(const char *val,
				     const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, URDMA_CONNECT_TIMEOUT_MAX);
}

static const struct kernel_param_ops urdma_connect_timeout_ops = {
	.set = urdma_set_connect_timeout,
	.get = param_get_uint,
};

module_param_cb(connect_timeout, &urdma_connect_timeout_ops,
		&urdma_connect_timeout_s, 0644);
MODULE_PARM_DESC(connect_timeout,
		 "seconds a CONNECT may wait for urdmad's answer (1-"
		 __stringify(URDMA_CONNECT_TIMEOUT_MAX) ", default 90)");

/* One open of /dev/urdma_cm: one urdmad. */
struct urdma_chan {
	struct net *net;		/* the opener's: REGISTER names live there */
	struct pid_namespace *pid_ns;	/* the opener's: owners are named there */
	spinlock_t qlock;		/* protects queue */
	struct list_head queue;		/* of struct urdma_qmsg, to be read */
	wait_queue_head_t wait;
};

struct urdma_qmsg {
	struct list_head link;
	struct urdma_cm_msg msg;
};

/* An interface served by a channel. */
struct urdma_reg {
	struct list_head link;		/* on urdma_regs */
	struct urdma_chan *chan;
	struct net_device *netdev;
	char socket_path[URDMA_CM_PATHSIZ];
	netdevice_tracker tracker;
	u64 stats[URDMA_STAT_COUNT];	/* the last URDMA_CM_STATS */
};

struct urdma_listener {
	struct list_head link;		/* on urdma_listeners */
	u64 id;
	struct urdma_dev *udev;
	struct iw_cm_id *cm_id;		/* with a reference */
	__be32 addr;			/* 0: any address of the interface */
	__be16 port;
	bool inert;			/* an address urdma cannot serve */
};

enum urdma_ep_state {
	URDMA_EP_CONNECTING,	/* active: CONNECT sent, CONNECT_REPLY due */
	URDMA_EP_REQUEST,	/* passive: CONNECT_REQUEST posted */
	URDMA_EP_ACCEPTING,	/* passive: ACCEPT sent, iw_accept waits */
	URDMA_EP_ESTABLISHED,	/* CONNECT_REPLY(0) or ACCEPTED 0: CLOSE due */
	URDMA_EP_DEAD,		/* passive request nobody can accept any more */
};

/* Disconnects already sent to the daemon. */
#define URDMA_DISC_GRACEFUL	BIT(0)
#define URDMA_DISC_ABORT	BIT(1)

/*
 * One connection, from iw_connect or REQUEST to its last event.  An
 * endpoint is on urdma_eps for as long as iw_cm or the daemon may name it.
 * A passive endpoint given to iw_cm as provider_data stays there until
 * iw_accept or iw_reject, or until its device goes (see urdma_cm_dev_gone).
 */
struct urdma_ep {
	struct kref ref;
	struct list_head link;		/* on urdma_eps */
	enum urdma_ep_state state;
	u64 id;				/* active: the kernel's handle */
	u64 req;			/* passive: urdmad's handle */
	struct urdma_dev *udev;
	struct urdma_chan *chan;	/* the serving daemon, NULL once it left */
	struct urdma_listener *listener; /* passive, until the listener goes */
	struct iw_cm_id *cm_id;		/* with a reference, while CLOSE or REPLY is due */
	struct urdma_qp *qp;		/* with a reference */
	struct sockaddr_in local;
	struct sockaddr_in remote;
	u8 ird;
	u8 ord;
	u8 disc_sent;
	struct delayed_work connect_timeout;	/* active, holds a reference */
	/* iw_accept's wait for ACCEPTED (or for the end of the daemon) */
	struct completion answered;
	bool has_answer;		/* accept_status is set */
	int accept_status;
	bool est_due;			/* ACCEPTED came; ESTABLISHED not posted */
};

static DEFINE_MUTEX(urdma_cm_mutex);
/* The connect timeouts; destroyed at unload, which waits for them. */
static struct workqueue_struct *urdma_cm_wq;
static LIST_HEAD(urdma_regs);
static LIST_HEAD(urdma_listeners);
static LIST_HEAD(urdma_eps);
static u64 urdma_next_id = 1;

static void urdma_qp_release(struct kref *ref)
{
	complete(&container_of(ref, struct urdma_qp, ref)->released);
}

/*
 * iw_add_ref.  iw_cm calls it right after iw_get_qp, under the same
 * spinlock, and only then: it claims the reference the lookup took.
 */
void urdma_qp_get(struct ib_qp *ibqp)
{
	struct urdma_qp *qp = to_uqp(ibqp);

	if (!atomic_add_unless(&qp->cm_lookups, -1, 0))
		kref_get(&qp->ref);
}

void urdma_qp_put(struct ib_qp *ibqp)
{
	kref_put(&to_uqp(ibqp)->ref, urdma_qp_release);
}

/*
 * iw_get_qp.  The reference is taken here, under the xarray's lock, which
 * urdma_qp_unpublish() takes to remove the QP before it drops the creation
 * reference: a QP found here cannot be freed before iw_add_ref keeps it,
 * and destroy_qp waits for no grace period.
 */
struct ib_qp *urdma_get_qp(struct ib_device *ibdev, int qpn)
{
	struct xarray *xa = &to_udev(ibdev)->qp_xa;
	struct urdma_qp *qp;

	xa_lock(xa);
	qp = xa_load(xa, qpn);
	if (qp) {
		kref_get(&qp->ref);
		atomic_inc(&qp->cm_lookups);
	}
	xa_unlock(xa);
	return qp ? &qp->ibqp : NULL;
}

/*
 * Takes the QP out of iw_get_qp's reach and waits until iw_cm holds no
 * reference to it, so that ib_core may free it.
 */
void urdma_qp_unpublish(struct urdma_dev *udev, struct urdma_qp *qp)
{
	xa_erase(&udev->qp_xa, qp->ibqp.qp_num);
	urdma_qp_put(&qp->ibqp);
	wait_for_completion(&qp->released);
}

/*
 * The QP with a reference of the caller's.  The QP stays in the xarray
 * until its creation reference is dropped, so one found there is alive.
 */
static struct urdma_qp *urdma_qp_lookup(struct urdma_dev *udev, u32 qpn)
{
	struct xarray *xa = &udev->qp_xa;
	struct urdma_qp *qp;

	xa_lock(xa);
	qp = xa_load(xa, qpn);
	if (qp)
		kref_get(&qp->ref);
	xa_unlock(xa);
	return qp;
}

static void urdma_qp_set_state(struct urdma_qp *qp, enum ib_qp_state state)
{
	mutex_lock(&qp->lock);
	qp->state = state;
	mutex_unlock(&qp->lock);
}

/* Moves a QP that has not started closing to RTS. */
static void urdma_qp_to_rts(struct urdma_qp *qp)
{
	mutex_lock(&qp->lock);
	if (qp->state >= IB_QPS_INIT && qp->state <= IB_QPS_RTS)
		qp->state = IB_QPS_RTS;
	mutex_unlock(&qp->lock);
}

/* The connection failed under the QP: flush it and tell its owner. */
static void urdma_qp_fatal(struct urdma_qp *qp)
{
	struct ib_qp *ibqp = &qp->ibqp;
	struct ib_event ev = {
		.device = ibqp->device,
		.element.qp = ibqp,
		.event = IB_EVENT_QP_FATAL,
	};

	urdma_qp_set_state(qp, IB_QPS_ERR);
	if (ibqp->event_handler)
		ibqp->event_handler(&ev, ibqp->qp_context);
}

/* Channel messages */

static struct urdma_qmsg *urdma_msg_new(enum urdma_cm_op op)
{
	struct urdma_qmsg *m = kzalloc(sizeof(*m), GFP_KERNEL);

	if (m)
		m->msg.op = op;
	return m;
}

static void urdma_chan_queue(struct urdma_chan *chan, struct urdma_qmsg *m)
{
	spin_lock(&chan->qlock);
	list_add_tail(&m->link, &chan->queue);
	spin_unlock(&chan->qlock);
	wake_up_interruptible_poll(&chan->wait, EPOLLIN | EPOLLRDNORM);
}

static struct urdma_reg *urdma_reg_find(struct net_device *netdev)
{
	struct urdma_reg *reg;

	lockdep_assert_held(&urdma_cm_mutex);
	list_for_each_entry(reg, &urdma_regs, link) {
		if (reg->netdev == netdev)
			return reg;
	}
	return NULL;
}

static struct urdma_chan *urdma_chan_of(struct urdma_dev *udev)
{
	struct urdma_reg *reg = urdma_reg_find(udev->netdev);

	return reg ? reg->chan : NULL;
}

static void urdma_set_pdata(struct urdma_cm_msg *msg, const void *pdata,
			    size_t len)
{
	len = min_t(size_t, len, URDMA_CM_MAX_PDATA);
	if (pdata && len)
		memcpy(msg->pdata, pdata, len);
	msg->pdata_len = pdata ? len : 0;
}

static u16 urdma_clamp16(u32 v)
{
	return min_t(u32, v, U16_MAX);
}

static void urdma_send_listen(struct urdma_chan *chan,
			      struct urdma_listener *l)
{
	struct urdma_qmsg *m = urdma_msg_new(URDMA_CM_LISTEN);

	if (!m)
		return;
	m->msg.id = l->id;
	m->msg.dev_id = l->udev->ibdev.index;
	m->msg.local_addr = (__force u32)l->addr;
	m->msg.local_port = (__force u16)l->port;
	strscpy(m->msg.ifname, l->udev->netdev->name, sizeof(m->msg.ifname));
	urdma_chan_queue(chan, m);
}

static void urdma_send_reject(struct urdma_chan *chan, u64 req,
			      const void *pdata, size_t len)
{
	struct urdma_qmsg *m = urdma_msg_new(URDMA_CM_REJECT);

	if (!m)
		return;
	m->msg.req = req;
	urdma_set_pdata(&m->msg, pdata, len);
	urdma_chan_queue(chan, m);
}

/* Tells the daemon to close @ep's QP, at most once per kind. */
static void urdma_send_disconnect(struct urdma_ep *ep, int status)
{
	u8 kind = status ? URDMA_DISC_ABORT : URDMA_DISC_GRACEFUL;
	struct urdma_qmsg *m;

	/* Nothing follows an abort; a graceful close may be escalated. */
	if (!ep->chan || !ep->qp ||
	    (ep->disc_sent & (kind | URDMA_DISC_ABORT)))
		return;
	m = urdma_msg_new(URDMA_CM_DISCONNECT);
	if (!m)
		return;
	ep->disc_sent |= kind;
	m->msg.status = status;
	m->msg.dev_id = ep->udev->ibdev.index;
	m->msg.qpn = ep->qp->ibqp.qp_num;
	urdma_chan_queue(ep->chan, m);
}

/* Endpoints */

static void urdma_ep_free(struct kref *ref)
{
	kfree(container_of(ref, struct urdma_ep, ref));
}

static void urdma_ep_put(struct urdma_ep *ep)
{
	kref_put(&ep->ref, urdma_ep_free);
}

static void urdma_ep_connect_timeout(struct work_struct *work);

static struct urdma_ep *urdma_ep_new(struct urdma_dev *udev,
				     struct urdma_chan *chan,
				     enum urdma_ep_state state)
{
	struct urdma_ep *ep = kzalloc(sizeof(*ep), GFP_KERNEL);

	if (!ep)
		return NULL;
	kref_init(&ep->ref);
	init_completion(&ep->answered);
	INIT_DELAYED_WORK(&ep->connect_timeout, urdma_ep_connect_timeout);
	ep->state = state;
	ep->udev = udev;
	ep->chan = chan;
	return ep;
}

/*
 * The endpoint's last event has been posted: drop what it holds.  The
 * cm_id reference goes after the event, as iw_cm frees the id at its last
 * reference (iw_destroy_cm_id does not wait for the driver's).  The bell
 * goes with the connection, whichever side ended it: once urdmad has the
 * connection's CLOSED, the socket is free for the next connection of the
 * QP's process, though the QP lives on.
 */
static void urdma_ep_finish(struct urdma_ep *ep)
{
	lockdep_assert_held(&urdma_cm_mutex);
	if (ep->qp)
		urdma_bell_detach(ep->qp);
	if (ep->cm_id) {
		ep->cm_id->rem_ref(ep->cm_id);
		ep->cm_id = NULL;
	}
	if (ep->qp) {
		urdma_qp_put(&ep->qp->ibqp);
		ep->qp = NULL;
	}
	/* A timeout already running finds the endpoint off the list. */
	if (cancel_delayed_work(&ep->connect_timeout))
		urdma_ep_put(ep);
	list_del_init(&ep->link);
	urdma_ep_put(ep);
}

static void urdma_event_init(struct iw_cm_event *ev, struct urdma_ep *ep,
			     enum iw_cm_event_type type, int status)
{
	memset(ev, 0, sizeof(*ev));
	ev->event = type;
	ev->status = status;
	memcpy(&ev->local_addr, &ep->local, sizeof(ep->local));
	memcpy(&ev->remote_addr, &ep->remote, sizeof(ep->remote));
	ev->ird = ep->ird;
	ev->ord = ep->ord;
}

static int urdma_deliver(struct urdma_ep *ep, enum iw_cm_event_type type,
			 int status, const void *pdata, u8 len)
{
	struct iw_cm_event ev;
	int rv;

	urdma_event_init(&ev, ep, type, status);
	if (pdata && len) {
		ev.private_data = (void *)pdata;
		ev.private_data_len = len;
	}
	rv = ep->cm_id->event_handler(ep->cm_id, &ev);
	if (rv)
		pr_warn_ratelimited("urdma: iw_cm event %d lost: %d\n", type, rv);
	return rv;
}

/*
 * The ESTABLISHED that ACCEPTED left to iw_accept.  iw_accept posts it as it
 * returns: posted earlier, it would hold iwcm_wq, and every other
 * connection's events, until the accepting thread runs again.
 */
static int urdma_post_established(struct urdma_ep *ep)
{
	if (!ep->est_due)
		return 0;
	ep->est_due = false;
	return urdma_deliver(ep, IW_CM_EVENT_ESTABLISHED, 0, NULL, 0);
}

/*
 * Any event after an ESTABLISHED still due comes after it.  Should iw_cm
 * refuse that ESTABLISHED, it is still in CONN_RECV, where a CLOSE is a
 * BUG(): nothing follows, and the endpoint is back to an accept that
 * failed, which iw_accept ends.  (iw_cm gives a child three work entries
 * and this is its first event, so that takes a change in iw_cm.)
 */
static int urdma_post(struct urdma_ep *ep, enum iw_cm_event_type type,
		      int status, const void *pdata, u8 len)
{
	int rv;

	lockdep_assert_held(&urdma_cm_mutex);
	rv = urdma_post_established(ep);
	if (rv) {
		ep->state = URDMA_EP_ACCEPTING;
		ep->accept_status = rv;
		return rv;
	}
	return urdma_deliver(ep, type, status, pdata, len);
}

/*
 * The one CONNECT_REPLY of an active endpoint.  Should iw_cm be short of
 * memory for the private data, the failure is still reported: without a
 * reply, iw_cm would wait for it forever.
 */
static void urdma_ep_connect_reply(struct urdma_ep *ep, int status,
				   const void *pdata, u8 len)
{
	if (!urdma_post(ep, IW_CM_EVENT_CONNECT_REPLY, status, pdata, len))
		return;
	if (!status) {
		/* Now a failure: the daemon must not keep the connection. */
		ep->state = URDMA_EP_CONNECTING;
		urdma_send_disconnect(ep, -ECONNRESET);
		status = -ECONNRESET;
	}
	/* Without private data, the one thing iw_cm allocates for it. */
	urdma_post(ep, IW_CM_EVENT_CONNECT_REPLY, status, NULL, 0);
}

/* Gives iw_accept its answer, unless it has one already. */
static void urdma_ep_answer(struct urdma_ep *ep, int status)
{
	if (ep->has_answer)
		return;
	ep->has_answer = true;
	ep->accept_status = status;
	complete(&ep->answered);
}

/* The one CLOSE of an established endpoint, then its end. */
static void urdma_ep_close(struct urdma_ep *ep, int status, bool fatal)
{
	if (fatal)
		urdma_qp_fatal(ep->qp);
	urdma_post(ep, IW_CM_EVENT_CLOSE, status, NULL, 0);
	if (ep->state != URDMA_EP_ACCEPTING)
		urdma_ep_finish(ep);
}

/*
 * The daemon serving @ep is gone or has lost the QP: end the connection
 * as iw_cm requires.  A passive endpoint iw_cm still owns becomes DEAD.
 */
static void urdma_ep_abort(struct urdma_ep *ep, int status, bool fatal)
{
	switch (ep->state) {
	case URDMA_EP_CONNECTING:
		urdma_ep_connect_reply(ep, status, NULL, 0);
		urdma_ep_finish(ep);
		break;
	case URDMA_EP_ESTABLISHED:
		urdma_ep_close(ep, status, fatal);
		if (ep->state != URDMA_EP_ACCEPTING)
			break;
		fallthrough;
	case URDMA_EP_ACCEPTING:
		/* iw_accept is waiting: it cleans up. */
		urdma_ep_answer(ep, -ENOTCONN);
		ep->chan = NULL;
		break;
	case URDMA_EP_REQUEST:
		ep->state = URDMA_EP_DEAD;
		ep->chan = NULL;
		break;
	case URDMA_EP_DEAD:
		break;
	}
}

static void urdma_ep_connect_timeout(struct work_struct *work)
{
	struct urdma_ep *ep = container_of(to_delayed_work(work),
					   struct urdma_ep, connect_timeout);

	mutex_lock(&urdma_cm_mutex);
	if (!list_empty(&ep->link) && ep->state == URDMA_EP_CONNECTING) {
		urdma_send_disconnect(ep, -ECONNRESET);
		urdma_ep_connect_reply(ep, -ETIMEDOUT, NULL, 0);
		urdma_ep_finish(ep);
	}
	mutex_unlock(&urdma_cm_mutex);
	urdma_ep_put(ep);
}

/* Ends the endpoints @chan serves, or only those on @netdev. */
static void urdma_chan_drop_eps(struct urdma_chan *chan,
				struct net_device *netdev)
{
	struct urdma_ep *ep, *next;

	list_for_each_entry_safe(ep, next, &urdma_eps, link) {
		if (ep->chan != chan ||
		    (netdev && ep->udev->netdev != netdev))
			continue;
		urdma_ep_abort(ep, -ECONNRESET, true);
	}
}

static struct urdma_ep *urdma_ep_by_qp(struct urdma_qp *qp)
{
	struct urdma_ep *ep;

	list_for_each_entry(ep, &urdma_eps, link) {
		if (ep->qp == qp)
			return ep;
	}
	return NULL;
}

static struct urdma_ep *urdma_ep_by_id(struct urdma_chan *chan, u64 id)
{
	struct urdma_ep *ep;

	list_for_each_entry(ep, &urdma_eps, link) {
		if (ep->chan == chan && ep->state == URDMA_EP_CONNECTING &&
		    ep->id == id)
			return ep;
	}
	return NULL;
}

static struct urdma_ep *urdma_ep_by_req(struct urdma_chan *chan, u64 req)
{
	struct urdma_ep *ep;

	list_for_each_entry(ep, &urdma_eps, link) {
		if (ep->chan == chan && !ep->id && ep->req == req)
			return ep;
	}
	return NULL;
}

static struct urdma_ep *urdma_ep_by_qpn(struct urdma_chan *chan,
					u32 dev_id, u32 qpn)
{
	struct urdma_ep *ep;

	list_for_each_entry(ep, &urdma_eps, link) {
		if (ep->chan == chan && ep->qp &&
		    ep->udev->ibdev.index == dev_id &&
		    ep->qp->ibqp.qp_num == qpn)
			return ep;
	}
	return NULL;
}

/* QP hooks, called by urdma_verbs.c */

/*
 * A QP moved to SQD (graceful close) or ERR (abort), by iw_cm or, with
 * @by_owner, by its process.  Either may come more than once, or after
 * the connection ended: only the first of each kind on a live connection
 * is passed on.  The owner's provider begins a graceful close itself when
 * it moves its QP to SQD, as rdma_disconnect does just before iw_cm's own
 * move, so that one is not passed on: the daemon would only tell the
 * process what it already does.  And it is the connection's end for
 * iw_cm, as siw's local close is: the provider finishes the exchange of
 * FINs on its own, after the QP is destroyed if need be, so the
 * application's DISCONNECTED does not wait for the peer.
 */
void urdma_cm_qp_modified(struct urdma_qp *qp, enum ib_qp_state state,
			  bool by_owner)
{
	struct urdma_ep *ep;

	mutex_lock(&urdma_cm_mutex);
	ep = urdma_ep_by_qp(qp);
	if (ep && ep->state == URDMA_EP_ESTABLISHED) {
		if (!by_owner) {
			urdma_send_disconnect(ep, state == IB_QPS_SQD ?
					      0 : -ECONNRESET);
		} else if (state == IB_QPS_SQD) {
			ep->disc_sent |= URDMA_DISC_GRACEFUL;
			urdma_ep_close(ep, 0, false);
		}
	}
	mutex_unlock(&urdma_cm_mutex);
}

/*
 * The QP is being destroyed.  ib_core frees it when destroy_qp returns,
 * and iw_cm lets go of it only at the connection's last event, so that
 * event is posted here.  Runs in any task, even one without namespaces.
 */
void urdma_cm_qp_destroy(struct urdma_qp *qp)
{
	struct urdma_ep *ep;

	mutex_lock(&urdma_cm_mutex);
	urdma_bell_detach(qp);
	ep = urdma_ep_by_qp(qp);
	if (ep) {
		urdma_send_disconnect(ep, -ECONNRESET);
		if (ep->state == URDMA_EP_ACCEPTING)
			urdma_ep_answer(ep, -ECONNRESET);
		else
			urdma_ep_abort(ep, -ECONNRESET, false);
	}
	mutex_unlock(&urdma_cm_mutex);
}

/* The device is going: no iw_cm id can name its endpoints any more. */
void urdma_cm_dev_gone(struct urdma_dev *udev)
{
	struct urdma_ep *ep, *next;

	mutex_lock(&urdma_cm_mutex);
	list_for_each_entry_safe(ep, next, &urdma_eps, link) {
		if (ep->udev != udev)
			continue;
		/* Only passive requests iw_cm dropped can be left. */
		WARN_ON(ep->state != URDMA_EP_REQUEST &&
			ep->state != URDMA_EP_DEAD);
		urdma_ep_finish(ep);
	}
	mutex_unlock(&urdma_cm_mutex);
}

/* iw_cm ops */

static int urdma_sockaddr_in(const struct sockaddr_storage *ss,
			     struct sockaddr_in *sin)
{
	if (ss->ss_family != AF_INET)
		return -EAFNOSUPPORT;
	memcpy(sin, ss, sizeof(*sin));
	return 0;
}

/*
 * The MAC to send to for @daddr: the next hop's from the neighbour table
 * of the interface's namespace, or the interface's own for an address of
 * this host (two processes on one node connect through its address, and
 * urdmad loops such frames back).  rdma_resolve_addr() has resolved the
 * neighbour already, so an unresolved one is an error, not a wait.
 */
static int urdma_resolve_mac(struct net_device *netdev, __be32 daddr,
			     u8 *mac)
{
	struct net *net = dev_net(netdev);
	struct neighbour *n;
	struct rtable *rt;
	__be32 nexthop;
	int rv = 0;

	rt = ip_route_output(net, daddr, 0, 0, 0);
	if (IS_ERR(rt))
		return PTR_ERR(rt);
	if (rt->rt_type == RTN_LOCAL) {
		ip_rt_put(rt);
		ether_addr_copy(mac, netdev->dev_addr);
		return 0;
	}
	nexthop = rt_nexthop(rt, daddr);
	ip_rt_put(rt);

	n = neigh_lookup(&arp_tbl, &nexthop, netdev);
	if (!n)
		return -EHOSTUNREACH;
	if (READ_ONCE(n->nud_state) & NUD_VALID) {
		neigh_ha_snapshot(mac, n, netdev);
	} else {
		/* Start a resolution so that a retry may succeed. */
		neigh_event_send(n, NULL);
		rv = -EHOSTUNREACH;
	}
	neigh_release(n);
	return rv;
}

int urdma_connect(struct iw_cm_id *id, struct iw_cm_conn_param *param)
{
	struct urdma_dev *udev = to_udev(id->device);
	struct sockaddr_in local, remote;
	struct urdma_chan *chan;
	struct urdma_qmsg *m;
	struct urdma_ep *ep;
	struct urdma_qp *qp;
	u8 mac[ETH_ALEN];
	int rv;

	rv = urdma_sockaddr_in(&id->local_addr, &local);
	if (!rv)
		rv = urdma_sockaddr_in(&id->remote_addr, &remote);
	if (rv)
		return rv;
	if (param->private_data_len > URDMA_CM_MAX_PDATA)
		return -EINVAL;
	rv = urdma_resolve_mac(udev->netdev, remote.sin_addr.s_addr, mac);
	if (rv)
		return rv;

	qp = urdma_qp_lookup(udev, param->qpn);
	if (!qp)
		return -EINVAL;
	rv = -ENOMEM;
	m = urdma_msg_new(URDMA_CM_CONNECT);
	ep = urdma_ep_new(udev, NULL, URDMA_EP_CONNECTING);
	if (!m || !ep)
		goto err;

	mutex_lock(&urdma_cm_mutex);
	chan = urdma_chan_of(udev);
	rv = -ENETUNREACH;
	if (!chan)
		goto err_unlock;
	rv = -EBUSY;
	if (urdma_ep_by_qp(qp))
		goto err_unlock;

	ep->chan = chan;
	ep->id = urdma_next_id++;
	ep->qp = qp;
	ep->local = local;
	ep->remote = remote;
	ep->ird = min_t(u32, param->ird, U8_MAX);
	ep->ord = min_t(u32, param->ord, U8_MAX);
	id->add_ref(id);
	ep->cm_id = id;
	id->provider_data = ep;
	list_add_tail(&ep->link, &urdma_eps);
	kref_get(&ep->ref);
	queue_delayed_work(urdma_cm_wq, &ep->connect_timeout,
			   READ_ONCE(urdma_connect_timeout_s) * HZ);

	m->msg.id = ep->id;
	m->msg.dev_id = udev->ibdev.index;
	m->msg.qpn = qp->ibqp.qp_num;
	m->msg.owner = pid_nr_ns(qp->owner, chan->pid_ns);
	m->msg.local_addr = (__force u32)local.sin_addr.s_addr;
	m->msg.remote_addr = (__force u32)remote.sin_addr.s_addr;
	m->msg.local_port = (__force u16)local.sin_port;
	m->msg.remote_port = (__force u16)remote.sin_port;
	ether_addr_copy(m->msg.remote_mac, mac);
	/* The daemon's port, without its looking the local address up. */
	strscpy(m->msg.ifname, udev->netdev->name, sizeof(m->msg.ifname));
	m->msg.ird = urdma_clamp16(param->ird);
	m->msg.ord = urdma_clamp16(param->ord);
	urdma_set_pdata(&m->msg, param->private_data, param->private_data_len);
	urdma_chan_queue(chan, m);
	mutex_unlock(&urdma_cm_mutex);
	return 0;

err_unlock:
	mutex_unlock(&urdma_cm_mutex);
err:
	kfree(ep);
	kfree(m);
	urdma_qp_put(&qp->ibqp);
	return rv;
}

int urdma_accept(struct iw_cm_id *id, struct iw_cm_conn_param *param)
{
	struct urdma_ep *ep = id->provider_data;
	struct urdma_dev *udev = to_udev(id->device);
	struct urdma_qmsg *m = NULL;
	struct urdma_qp *qp = NULL;
	long left;
	int rv;

	if (param->private_data_len > URDMA_CM_MAX_PDATA) {
		rv = -EINVAL;
		goto fail;
	}
	qp = urdma_qp_lookup(udev, param->qpn);
	m = urdma_msg_new(URDMA_CM_ACCEPT);
	rv = qp ? (m ? 0 : -ENOMEM) : -EINVAL;
	if (rv)
		goto fail;

	mutex_lock(&urdma_cm_mutex);
	if (ep->state != URDMA_EP_REQUEST || !ep->chan) {
		rv = -ENOTCONN;
		goto fail_locked;
	}
	if (urdma_ep_by_qp(qp)) {
		rv = -EBUSY;
		goto fail_locked;
	}
	ep->state = URDMA_EP_ACCEPTING;
	ep->qp = qp;
	qp = NULL;
	/*
	 * The child's first reference.  None may be taken before: iw_cm's
	 * cm_conn_req_handler, running on iw_cm's work queue, destroys a
	 * child it cannot set up, and with a reference held that destroy
	 * flushes the same queue: a deadlock.
	 */
	id->add_ref(id);
	ep->cm_id = id;
	ep->ird = min_t(u32, param->ird, U8_MAX);
	ep->ord = min_t(u32, param->ord, U8_MAX);

	m->msg.req = ep->req;
	m->msg.dev_id = udev->ibdev.index;
	m->msg.qpn = ep->qp->ibqp.qp_num;
	m->msg.owner = pid_nr_ns(ep->qp->owner, ep->chan->pid_ns);
	m->msg.ird = urdma_clamp16(param->ird);
	m->msg.ord = urdma_clamp16(param->ord);
	urdma_set_pdata(&m->msg, param->private_data, param->private_data_len);
	urdma_chan_queue(ep->chan, m);
	kref_get(&ep->ref);
	mutex_unlock(&urdma_cm_mutex);

	left = wait_for_completion_killable_timeout(&ep->answered,
						    URDMA_ACCEPT_TIMEOUT);

	mutex_lock(&urdma_cm_mutex);
	if (ep->state == URDMA_EP_ESTABLISHED) {
		/* ACCEPTED came, maybe just after the wait ended. */
		rv = urdma_post_established(ep);
		if (rv) {
			/* iw_cm could not take it: the connection fails here. */
			urdma_send_disconnect(ep, -ECONNRESET);
			urdma_ep_finish(ep);
		}
	} else {
		if (ep->has_answer)
			rv = ep->accept_status;
		else
			rv = left ? -EINTR : -ETIMEDOUT;
		if (rv == -ETIMEDOUT || rv == -EINTR) {
			/* The daemon may still answer: make it let go. */
			urdma_send_disconnect(ep, -ECONNRESET);
			if (ep->chan)
				urdma_send_reject(ep->chan, ep->req, NULL, 0);
		}
		urdma_ep_finish(ep);
	}
	mutex_unlock(&urdma_cm_mutex);
	urdma_ep_put(ep);
	return rv;

fail_locked:
	/*
	 * iw_reject does not follow a failed accept (rdma_accept's reject
	 * fails in iw_cm, whose id is back to IDLE): the
	 * request ends here, and the daemon's side with it.
	 */
	if (ep->chan && ep->state == URDMA_EP_REQUEST)
		urdma_send_reject(ep->chan, ep->req, NULL, 0);
	urdma_ep_finish(ep);
	mutex_unlock(&urdma_cm_mutex);
	kfree(m);
	if (qp)
		urdma_qp_put(&qp->ibqp);
	return rv;
fail:
	mutex_lock(&urdma_cm_mutex);
	goto fail_locked;
}

int urdma_reject(struct iw_cm_id *id, const void *pdata, u8 pdata_len)
{
	struct urdma_ep *ep = id->provider_data;

	mutex_lock(&urdma_cm_mutex);
	if (ep->state == URDMA_EP_REQUEST && ep->chan)
		urdma_send_reject(ep->chan, ep->req, pdata, pdata_len);
	urdma_ep_finish(ep);
	mutex_unlock(&urdma_cm_mutex);
	return 0;
}

/*
 * rdma_cm asks every iWARP device to listen on a wildcard address, and one
 * refusal fails the whole listen, so this succeeds even when no daemon
 * serves the device: the listener is replayed to the next one that
 * registers.  An IPv6 wildcard that also takes IPv4 is a wildcard for us;
 * any other IPv6 address is recorded but never served.
 */
int urdma_create_listen(struct iw_cm_id *id, int backlog)
{
	struct urdma_dev *udev = to_udev(id->device);
	const struct sockaddr_storage *ss = &id->local_addr;
	struct urdma_listener *l;
	struct urdma_chan *chan;

	l = kzalloc(sizeof(*l), GFP_KERNEL);
	if (!l)
		return -ENOMEM;
	l->udev = udev;
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *sin = (const void *)ss;

		l->addr = sin->sin_addr.s_addr;
		l->port = sin->sin_port;
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *sin6 = (const void *)ss;

		l->port = sin6->sin6_port;
		if (ipv6_addr_v4mapped(&sin6->sin6_addr))
			l->addr = sin6->sin6_addr.s6_addr32[3];
		else if (!ipv6_addr_any(&sin6->sin6_addr) || id->afonly)
			l->inert = true;
	} else {
		l->inert = true;
	}

	mutex_lock(&urdma_cm_mutex);
	l->id = urdma_next_id++;
	id->add_ref(id);
	l->cm_id = id;
	id->provider_data = l;
	list_add_tail(&l->link, &urdma_listeners);
	chan = urdma_chan_of(udev);
	if (chan && !l->inert)
		urdma_send_listen(chan, l);
	mutex_unlock(&urdma_cm_mutex);
	return 0;
}

int urdma_destroy_listen(struct iw_cm_id *id)
{
	struct urdma_listener *l = id->provider_data;
	struct urdma_chan *chan;
	struct urdma_qmsg *m;
	struct urdma_ep *ep;

	mutex_lock(&urdma_cm_mutex);
	list_del(&l->link);
	chan = urdma_chan_of(l->udev);
	if (chan && !l->inert) {
		m = urdma_msg_new(URDMA_CM_UNLISTEN);
		if (m) {
			m->msg.id = l->id;
			urdma_chan_queue(chan, m);
		}
	}
	/*
	 * Requests posted to this listener stay: the ones rdma_cm delivered
	 * may still be accepted.  Those iw_cm dropped with the dying id are
	 * freed with the device (urdma_cm_dev_gone).
	 */
	list_for_each_entry(ep, &urdma_eps, link) {
		if (ep->listener == l)
			ep->listener = NULL;
	}
	l->cm_id->rem_ref(l->cm_id);
	mutex_unlock(&urdma_cm_mutex);
	kfree(l);
	return 0;
}

/* Daemon messages */

static int urdma_cm_register(struct urdma_chan *chan,
			     struct urdma_cm_msg *msg)
{
	struct urdma_listener *l;
	struct net_device *netdev;
	struct urdma_reg *reg;

	if (!memchr(msg->ifname, 0, sizeof(msg->ifname)) ||
	    !memchr(msg->socket_path, 0, sizeof(msg->socket_path)))
		return -EINVAL;
	reg = kzalloc(sizeof(*reg), GFP_KERNEL);
	if (!reg)
		return -ENOMEM;
	netdev = dev_get_by_name(chan->net, msg->ifname);
	if (!netdev) {
		kfree(reg);
		return -ENODEV;
	}
	netdev_tracker_alloc(netdev, &reg->tracker, GFP_KERNEL);
	reg->netdev = netdev;
	reg->chan = chan;
	/* NUL-terminated: checked above. */
	memcpy(reg->socket_path, msg->socket_path, sizeof(reg->socket_path));

	mutex_lock(&urdma_cm_mutex);
	/* The interface may be unregistering: its notifier ran already. */
	if (urdma_reg_find(netdev) || netdev->reg_state != NETREG_REGISTERED) {
		mutex_unlock(&urdma_cm_mutex);
		netdev_put(netdev, &reg->tracker);
		kfree(reg);
		return -EBUSY;
	}
	list_add_tail(&reg->link, &urdma_regs);
	list_for_each_entry(l, &urdma_listeners, link) {
		if (l->udev->netdev == netdev && !l->inert)
			urdma_send_listen(chan, l);
	}
	mutex_unlock(&urdma_cm_mutex);
	return 0;
}

static void urdma_reg_free(struct urdma_reg *reg)
{
	list_del(&reg->link);
	netdev_put(reg->netdev, &reg->tracker);
	kfree(reg);
}

/* A ConnectRequest for listener msg->id: post CONNECT_REQUEST. */
static void urdma_cm_request(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	struct urdma_listener *l, *found = NULL;
	struct iw_cm_event ev;
	struct urdma_ep *ep;

	list_for_each_entry(l, &urdma_listeners, link) {
		if (l->id == msg->id && urdma_chan_of(l->udev) == chan) {
			found = l;
			break;
		}
	}
	/* A retransmission the daemon took for new: the first one stands. */
	if (found && urdma_ep_by_req(chan, msg->req))
		return;
	ep = found ? urdma_ep_new(found->udev, chan, URDMA_EP_REQUEST) : NULL;
	if (!ep) {
		urdma_send_reject(chan, msg->req, NULL, 0);
		return;
	}
	ep->req = msg->req;
	ep->listener = found;
	ep->local.sin_family = AF_INET;
	ep->local.sin_addr.s_addr = (__force __be32)msg->local_addr;
	ep->local.sin_port = (__force __be16)msg->local_port;
	ep->remote.sin_family = AF_INET;
	ep->remote.sin_addr.s_addr = (__force __be32)msg->remote_addr;
	ep->remote.sin_port = (__force __be16)msg->remote_port;
	ep->ird = min_t(u16, msg->ird, U8_MAX);
	ep->ord = min_t(u16, msg->ord, U8_MAX);

	/* Status must be 0: iw_cm's cm_conn_req_handler BUG()s otherwise. */
	urdma_event_init(&ev, ep, IW_CM_EVENT_CONNECT_REQUEST, 0);
	ev.provider_data = ep;
	if (msg->pdata_len) {
		ev.private_data = msg->pdata;
		ev.private_data_len = msg->pdata_len;
	}
	list_add_tail(&ep->link, &urdma_eps);
	if (found->cm_id->event_handler(found->cm_id, &ev)) {
		/* Over the backlog: the requester gets a Reject. */
		urdma_send_reject(chan, msg->req, NULL, 0);
		urdma_ep_finish(ep);
	}
}

static void urdma_cm_connected(struct urdma_chan *chan,
			       struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_id(chan, msg->id);

	if (!ep)
		return;
	/* Nobody but the driver moves the QP to RTS (iw_cm sets SQD, ERR). */
	urdma_qp_to_rts(ep->qp);
	ep->state = URDMA_EP_ESTABLISHED;
	ep->ird = min_t(u16, msg->ird, U8_MAX);
	ep->ord = min_t(u16, msg->ord, U8_MAX);
	urdma_ep_connect_reply(ep, 0, msg->pdata, msg->pdata_len);
	if (ep->state != URDMA_EP_ESTABLISHED)
		urdma_ep_finish(ep);
}

static void urdma_cm_connect_failed(struct urdma_chan *chan,
				    struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_id(chan, msg->id);

	if (!ep)
		return;
	urdma_ep_connect_reply(ep, msg->status < 0 ? msg->status : -ECONNRESET,
			       msg->pdata, msg->pdata_len);
	urdma_ep_finish(ep);
}

static void urdma_cm_accepted(struct urdma_chan *chan,
			      struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_req(chan, msg->req);

	int status = msg->status > 0 ? -EINVAL : msg->status;

	if (!ep || ep->state != URDMA_EP_ACCEPTING || ep->has_answer)
		return;
	if (!status) {
		/*
		 * Established here rather than in iw_accept, so that a wait
		 * that timed out meanwhile finds the connection up and keeps
		 * it; its event is posted by iw_accept.
		 */
		urdma_qp_to_rts(ep->qp);
		ep->state = URDMA_EP_ESTABLISHED;
		ep->est_due = true;
	}
	urdma_ep_answer(ep, status);
}

static void urdma_cm_request_gone(struct urdma_chan *chan,
				  struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_req(chan, msg->req);

	/* iw_cm still owns it; a later accept fails, a reject is a no-op. */
	if (ep && ep->state == URDMA_EP_REQUEST) {
		ep->state = URDMA_EP_DEAD;
		ep->chan = NULL;
	}
}

static void urdma_cm_peer_closed(struct urdma_chan *chan,
				 struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_qpn(chan, msg->dev_id, msg->qpn);

	/* Only moves iw_cm to CLOSING; legal in any of its states. */
	if (!ep || ep->state != URDMA_EP_ESTABLISHED)
		return;
	urdma_post(ep, IW_CM_EVENT_DISCONNECT, 0, NULL, 0);
	/* The accept failed instead: the daemon lets go. */
	if (ep->state == URDMA_EP_ACCEPTING)
		urdma_send_disconnect(ep, -ECONNRESET);
}

static void urdma_cm_closed(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_qpn(chan, msg->dev_id, msg->qpn);
	int status = msg->status > 0 ? -EINVAL : msg->status;

	if (!ep)
		return;
	if (ep->qp)
		urdma_bell_detach(ep->qp);
	switch (ep->state) {
	case URDMA_EP_ESTABLISHED:
		urdma_ep_close(ep, status, status < 0);
		break;
	case URDMA_EP_CONNECTING:
		/* Closed before CONNECTED: the connect failed. */
		urdma_ep_connect_reply(ep, status ? status : -ECONNRESET,
				       NULL, 0);
		urdma_ep_finish(ep);
		break;
	case URDMA_EP_ACCEPTING:
		urdma_ep_answer(ep, status ? status : -ECONNRESET);
		break;
	default:
		break;
	}
}

/*
 * Hands the connection's socket and its filter's verdict map to the bell
 * (urdma_bell.c).  Only the daemon that serves the connection may name
 * its QP.
 */
static int urdma_cm_bell(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_qpn(chan, msg->dev_id, msg->qpn);
	s32 hush = -1;

	if (!ep)
		return -ENOENT;
	if (msg->req > INT_MAX || msg->id > INT_MAX)
		return -EBADF;
	if (msg->pdata_len == sizeof(hush))
		memcpy(&hush, msg->pdata, sizeof(hush));
	else if (msg->pdata_len)
		return -EINVAL;
	return urdma_bell_attach(ep->qp, (int)msg->req, (int)msg->id, hush);
}

/*
 * A frame of the connection that urdmad put on the QP's ring completes a
 * receive (URDMA_CM_RING).  0: the receive CQ's event fired;
 * URDMA_CM_NOT_RUNG: it was not armed for it.
 */
#define URDMA_CM_NOT_RUNG	1
static int urdma_cm_ring(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_qpn(chan, msg->dev_id, msg->qpn);

	if (!ep)
		return -ENOENT;
	return urdma_bell_ring(ep->qp, (u32)msg->status) ? 0 : URDMA_CM_NOT_RUNG;
}

/* The port counters of the interface msg->ifname, if this channel serves it. */
static void urdma_cm_stats(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	size_t n = min_t(size_t, msg->pdata_len / sizeof(u64), URDMA_STAT_COUNT);
	struct net_device *netdev;
	struct urdma_reg *reg;

	if (!memchr(msg->ifname, 0, sizeof(msg->ifname)))
		return;
	netdev = dev_get_by_name(chan->net, msg->ifname);
	if (!netdev)
		return;
	reg = urdma_reg_find(netdev);
	if (reg && reg->chan == chan)
		memcpy(reg->stats, msg->pdata, n * sizeof(u64));
	dev_put(netdev);
}

/*
 * The counters of the urdmad serving the device's interface, the last it
 * sent; zeros while none serves it.
 */
void urdma_cm_read_stats(struct urdma_dev *udev, u64 *values)
{
	struct urdma_reg *reg;

	mutex_lock(&urdma_cm_mutex);
	reg = urdma_reg_find(udev->netdev);
	if (reg)
		memcpy(values, reg->stats, sizeof(reg->stats));
	else
		memset(values, 0, sizeof(reg->stats));
	mutex_unlock(&urdma_cm_mutex);
}

static int urdma_cm_dispatch(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	int rv = 0;

	if (msg->pdata_len > URDMA_CM_MAX_PDATA)
		return -EINVAL;
	if (msg->op == URDMA_CM_REGISTER)
		return urdma_cm_register(chan, msg);

	/*
	 * Messages naming a connection or request that is already gone
	 * (destroyed QP, timed-out accept) are normal races: ignored.
	 */
	mutex_lock(&urdma_cm_mutex);
	switch (msg->op) {
	case URDMA_CM_REQUEST:
		urdma_cm_request(chan, msg);
		break;
	case URDMA_CM_CONNECTED:
		urdma_cm_connected(chan, msg);
		break;
	case URDMA_CM_CONNECT_FAILED:
		urdma_cm_connect_failed(chan, msg);
		break;
	case URDMA_CM_ACCEPTED:
		urdma_cm_accepted(chan, msg);
		break;
	case URDMA_CM_PEER_CLOSED:
		urdma_cm_peer_closed(chan, msg);
		break;
	case URDMA_CM_CLOSED:
		urdma_cm_closed(chan, msg);
		break;
	case URDMA_CM_REQUEST_GONE:
		urdma_cm_request_gone(chan, msg);
		break;
	case URDMA_CM_STATS:
		urdma_cm_stats(chan, msg);
		break;
	case URDMA_CM_BELL:
		rv = urdma_cm_bell(chan, msg);
		break;
	case URDMA_CM_RING:
		rv = urdma_cm_ring(chan, msg);
		break;
	default:
		rv = -EINVAL;
		break;
	}
	mutex_unlock(&urdma_cm_mutex);
	return rv;
}

/* The interface is going away (or to another namespace). */
void urdma_cm_netdev_unregister(struct net_device *netdev)
{
	struct urdma_reg *reg;

	mutex_lock(&urdma_cm_mutex);
	reg = urdma_reg_find(netdev);
	if (reg) {
		urdma_chan_drop_eps(reg->chan, netdev);
		urdma_reg_free(reg);
	}
	mutex_unlock(&urdma_cm_mutex);
}

/* sysfs: /sys/class/infiniband/<dev>/urdmad */
static ssize_t urdmad_show(struct device *device,
			   struct device_attribute *attr, char *buf)
{
	struct urdma_dev *udev = rdma_device_to_drv_device(device,
							   struct urdma_dev,
							   ibdev);
	struct urdma_reg *reg;
	ssize_t len = 0;

	mutex_lock(&urdma_cm_mutex);
	reg = urdma_reg_find(udev->netdev);
	if (reg)
		len = sysfs_emit(buf, "%s\n", reg->socket_path);
	mutex_unlock(&urdma_cm_mutex);
	return len;
}
static DEVICE_ATTR_RO(urdmad);

static struct attribute *urdma_attrs[] = {
	&dev_attr_urdmad.attr,
	NULL,
};

const struct attribute_group urdma_attr_group = {
	.attrs = urdma_attrs,
};

/* /dev/urdma_cm */

static int urdma_cm_open(struct inode *inode, struct file *file)
{
	struct urdma_chan *chan;

	if (!capable(CAP_NET_ADMIN))
		return -EPERM;
	chan = kzalloc(sizeof(*chan), GFP_KERNEL);
	if (!chan)
		return -ENOMEM;
	chan->net = get_net(current->nsproxy->net_ns);
	chan->pid_ns = get_pid_ns(task_active_pid_ns(current));
	spin_lock_init(&chan->qlock);
	INIT_LIST_HEAD(&chan->queue);
	init_waitqueue_head(&chan->wait);
	file->private_data = chan;
	return stream_open(inode, file);
}

/*
 * urdmad exited or died: end every connection it served, keep the
 * listeners for the next one.
 */
static int urdma_cm_release(struct inode *inode, struct file *file)
{
	struct urdma_chan *chan = file->private_data;
	struct urdma_reg *reg, *next_reg;
	struct urdma_qmsg *m, *next;

	mutex_lock(&urdma_cm_mutex);
	urdma_chan_drop_eps(chan, NULL);
	list_for_each_entry_safe(reg, next_reg, &urdma_regs, link) {
		if (reg->chan == chan)
			urdma_reg_free(reg);
	}
	mutex_unlock(&urdma_cm_mutex);

	list_for_each_entry_safe(m, next, &chan->queue, link)
		kfree(m);
	put_net(chan->net);
	put_pid_ns(chan->pid_ns);
	kfree(chan);
	return 0;
}

static ssize_t urdma_cm_read(struct file *file, char __user *buf,
			     size_t len, loff_t *off)
{
	struct urdma_chan *chan = file->private_data;
	struct urdma_qmsg *m;
	int rv;

	if (len != sizeof(m->msg))
		return -EINVAL;
	for (;;) {
		spin_lock(&chan->qlock);
		m = list_first_entry_or_null(&chan->queue, struct urdma_qmsg,
					     link);
		if (m)
			list_del(&m->link);
		spin_unlock(&chan->qlock);
		if (m)
			break;
		if (file->f_flags & O_NONBLOCK)
			return -EAGAIN;
		rv = wait_event_interruptible(chan->wait,
					      !list_empty_careful(&chan->queue));
		if (rv)
			return rv;
	}
	if (copy_to_user(buf, &m->msg, sizeof(m->msg))) {
		/* Not lost: the next read gets it. */
		spin_lock(&chan->qlock);
		list_add(&m->link, &chan->queue);
		spin_unlock(&chan->qlock);
		return -EFAULT;
	}
	kfree(m);
	return len;
}

static ssize_t urdma_cm_write(struct file *file, const char __user *buf,
			      size_t len, loff_t *off)
{
	struct urdma_chan *chan = file->private_data;
	struct urdma_cm_msg *msg;
	int rv;

	if (len != sizeof(*msg))
		return -EINVAL;
	msg = memdup_user(buf, len);
	if (IS_ERR(msg))
		return PTR_ERR(msg);
	rv = urdma_cm_dispatch(chan, msg);
	kfree(msg);
	if (rv == URDMA_CM_NOT_RUNG)
		return 0;
	return rv ? rv : len;
}

static __poll_t urdma_cm_poll(struct file *file, poll_table *wait)
{
	struct urdma_chan *chan = file->private_data;
	__poll_t mask = EPOLLOUT | EPOLLWRNORM;

	poll_wait(file, &chan->wait, wait);
	if (!list_empty_careful(&chan->queue))
		mask |= EPOLLIN | EPOLLRDNORM;
	return mask;
}

static const struct file_operations urdma_cm_fops = {
	.owner = THIS_MODULE,
	.open = urdma_cm_open,
	.release = urdma_cm_release,
	.read = urdma_cm_read,
	.write = urdma_cm_write,
	.poll = urdma_cm_poll,
	.llseek = no_llseek,
};

static struct miscdevice urdma_cm_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = URDMA_CM_DEVNAME,
	.fops = &urdma_cm_fops,
	.mode = 0600,
};

int urdma_cm_init(void)
{
	int rv;

	urdma_cm_wq = alloc_workqueue("urdma_cm", 0, 0);
	if (!urdma_cm_wq)
		return -ENOMEM;
	rv = misc_register(&urdma_cm_misc);
	if (rv)
		destroy_workqueue(urdma_cm_wq);
	return rv;
}

void urdma_cm_exit(void)
{
	misc_deregister(&urdma_cm_misc);
	destroy_workqueue(urdma_cm_wq);
}
