// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Connection endpoints: from iw_connect or a daemon's REQUEST to the
 * connection's last iw_cm event, and the daemon's messages about them.
 * The iw_cm ops are in urdma_iwcm.c, the urdmad channel in urdma_chan.c.
 *
 * The TRP handshake runs in urdmad (docs/connection.md); the kernel keeps
 * what only it can: iw_cm's events, the QP's kernel state and the next
 * hop's MAC.  Every iw_cm op becomes a message to the daemon that serves
 * the device's interface, and every daemon message becomes at most one
 * iw_cm event.  The rules iw_cm imposes (exactly one CONNECT_REPLY
 * after a successful connect, exactly one CLOSE after an established
 * connection, nothing after a reject) are kept here even when the daemon
 * goes away or the QP is destroyed first.
 *
 * Locking: urdma_cm_mutex protects every list of the three files and
 * every endpoint's state.
 * It nests outside a QP's lock and inside rtnl (netdev notifier).  Posting
 * an event to iw_cm never sleeps, so it is done under the mutex, which
 * keeps each endpoint's events in the order its state changed.
 */
#include <linux/slab.h>

#include "urdma_cm.h"

/* The lists and every endpoint's state (see above). */
DEFINE_MUTEX(urdma_cm_mutex);
/* The connect timeouts; destroyed at unload, which waits for them. */
struct workqueue_struct *urdma_cm_wq;
LIST_HEAD(urdma_listeners);
LIST_HEAD(urdma_eps);
u64 urdma_next_id = 1;

/*
 * The QP with a reference of the caller's.  The QP stays in the xarray
 * until its creation reference is dropped, so one found there is alive.
 */
struct urdma_qp *urdma_qp_lookup(struct urdma_dev *udev, u32 qpn)
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

void urdma_set_pdata(struct urdma_cm_msg *msg, const void *pdata,
		     size_t len)
{
	len = min_t(size_t, len, URDMA_CM_MAX_PDATA);
	if (pdata && len)
		memcpy(msg->pdata, pdata, len);
	msg->pdata_len = pdata ? len : 0;
}

u16 urdma_clamp16(u32 v)
{
	return min_t(u32, v, U16_MAX);
}

void urdma_send_listen(struct urdma_chan *chan,
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

void urdma_send_reject(struct urdma_chan *chan, u64 req,
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
void urdma_send_disconnect(struct urdma_ep *ep, int status)
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

void urdma_ep_put(struct urdma_ep *ep)
{
	kref_put(&ep->ref, urdma_ep_free);
}

static void urdma_ep_connect_timeout(struct work_struct *work);

struct urdma_ep *urdma_ep_new(struct urdma_dev *udev,
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
void urdma_ep_finish(struct urdma_ep *ep)
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
int urdma_post_established(struct urdma_ep *ep)
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

/*
 * The one CLOSE of an established endpoint, then its end; unless iw_cm
 * refused the ESTABLISHED still owed (urdma_post), when iw_accept ends it.
 */
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
void urdma_chan_drop_eps(struct urdma_chan *chan,
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

struct urdma_ep *urdma_ep_by_qp(struct urdma_qp *qp)
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

/* Daemon messages */

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
static int urdma_cm_ring(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	struct urdma_ep *ep = urdma_ep_by_qpn(chan, msg->dev_id, msg->qpn);

	if (!ep)
		return -ENOENT;
	return urdma_bell_ring(ep->qp, (u32)msg->status) ? 0 : URDMA_CM_NOT_RUNG;
}

/* A daemon message about a connection or a request (urdma_chan.c reads it). */
int urdma_cm_handle(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	int rv = 0;

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

/* REGISTER: the listeners already on @netdev's device go to its new daemon. */
void urdma_cm_listen_all(struct urdma_chan *chan, struct net_device *netdev)
{
	struct urdma_listener *l;

	lockdep_assert_held(&urdma_cm_mutex);
	list_for_each_entry(l, &urdma_listeners, link) {
		if (l->udev->netdev == netdev && !l->inert)
			urdma_send_listen(chan, l);
	}
}

int urdma_cm_init(void)
{
	int rv;

	urdma_cm_wq = alloc_workqueue("urdma_cm", 0, 0);
	if (!urdma_cm_wq)
		return -ENOMEM;
	rv = urdma_chan_init();
	if (rv)
		destroy_workqueue(urdma_cm_wq);
	return rv;
}

void urdma_cm_exit(void)
{
	urdma_chan_exit();
	destroy_workqueue(urdma_cm_wq);
}
