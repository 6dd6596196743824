/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * The connection manager's three rooms share these: urdma_chan.c (the
 * urdmad channel), urdma_cm.c (endpoints and the daemon's messages about
 * them) and urdma_iwcm.c (the iw_cm ops).  Everything here is under
 * urdma_cm_mutex unless said otherwise.
 */
#ifndef URDMA_CM_H
#define URDMA_CM_H

#include <linux/completion.h>
#include <linux/in.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/workqueue.h>
#include <rdma/iw_cm.h>

#include "urdma.h"

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

/*
 * A frame of the connection that urdmad put on the QP's ring completes a
 * receive (URDMA_CM_RING) but the CQ was not armed for it: write()
 * returns 0.
 */
#define URDMA_CM_NOT_RUNG	1

extern struct mutex urdma_cm_mutex;
extern struct workqueue_struct *urdma_cm_wq;
extern struct list_head urdma_listeners;
extern struct list_head urdma_eps;
extern u64 urdma_next_id;

/* urdma_chan.c */
struct urdma_qmsg *urdma_msg_new(enum urdma_cm_op op);
void urdma_chan_queue(struct urdma_chan *chan, struct urdma_qmsg *m);
struct urdma_chan *urdma_chan_of(struct urdma_dev *udev);
int urdma_chan_init(void);
void urdma_chan_exit(void);

/* urdma_cm.c */
struct urdma_qp *urdma_qp_lookup(struct urdma_dev *udev, u32 qpn);
void urdma_set_pdata(struct urdma_cm_msg *msg, const void *pdata,
		     size_t len);
u16 urdma_clamp16(u32 v);
void urdma_send_listen(struct urdma_chan *chan, struct urdma_listener *l);
void urdma_send_reject(struct urdma_chan *chan, u64 req, const void *pdata,
		       size_t len);
void urdma_send_disconnect(struct urdma_ep *ep, int status);
struct urdma_ep *urdma_ep_new(struct urdma_dev *udev, struct urdma_chan *chan,
			      enum urdma_ep_state state);
void urdma_ep_put(struct urdma_ep *ep);
void urdma_ep_finish(struct urdma_ep *ep);
struct urdma_ep *urdma_ep_by_qp(struct urdma_qp *qp);
int urdma_post_established(struct urdma_ep *ep);
void urdma_chan_drop_eps(struct urdma_chan *chan,
			 struct net_device *netdev);
void urdma_cm_listen_all(struct urdma_chan *chan, struct net_device *netdev);
int urdma_cm_handle(struct urdma_chan *chan, struct urdma_cm_msg *msg);

#endif
