// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The iw_cm ops: each of iw_cm's requests becomes a message to the
 * urdmad serving the device's interface (urdma_chan.c), and its answer an
 * event (urdma_cm.c).  Also the QP references iw_cm takes.
 */
#include <linux/etherdevice.h>
#include <linux/moduleparam.h>
#include <linux/pid_namespace.h>
#include <linux/slab.h>
#include <net/arp.h>
#include <net/ipv6.h>
#include <net/neighbour.h>
#include <net/route.h>

#include "urdma_cm.h"

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
