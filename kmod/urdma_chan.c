// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The urdmad channel, /dev/urdma_cm: one open per urdmad, a queue of
 * messages to it, and the interfaces it serves (REGISTER), with their
 * socket path (sysfs) and port counters.  What a message says about a
 * connection is urdma_cm.c's.
 */
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/netdevice.h>
#include <linux/pid_namespace.h>
#include <linux/poll.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <net/net_namespace.h>

#include "urdma_cm.h"

/* An interface served by a channel. */
struct urdma_reg {
	struct list_head link;		/* on urdma_regs */
	struct urdma_chan *chan;
	struct net_device *netdev;
	char socket_path[URDMA_CM_PATHSIZ];
	netdevice_tracker tracker;
	u64 stats[URDMA_STAT_COUNT];	/* the last URDMA_CM_STATS */
};

static LIST_HEAD(urdma_regs);

struct urdma_qmsg *urdma_msg_new(enum urdma_cm_op op)
{
	struct urdma_qmsg *m = kzalloc(sizeof(*m), GFP_KERNEL);

	if (m)
		m->msg.op = op;
	return m;
}

void urdma_chan_queue(struct urdma_chan *chan, struct urdma_qmsg *m)
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

struct urdma_chan *urdma_chan_of(struct urdma_dev *udev)
{
	struct urdma_reg *reg = urdma_reg_find(udev->netdev);

	return reg ? reg->chan : NULL;
}

static int urdma_cm_register(struct urdma_chan *chan,
			     struct urdma_cm_msg *msg)
{
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
	urdma_cm_listen_all(chan, netdev);
	mutex_unlock(&urdma_cm_mutex);
	return 0;
}

static void urdma_reg_free(struct urdma_reg *reg)
{
	list_del(&reg->link);
	netdev_put(reg->netdev, &reg->tracker);
	kfree(reg);
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

static int urdma_chan_dispatch(struct urdma_chan *chan, struct urdma_cm_msg *msg)
{
	if (msg->pdata_len > URDMA_CM_MAX_PDATA)
		return -EINVAL;
	if (msg->op == URDMA_CM_REGISTER)
		return urdma_cm_register(chan, msg);
	if (msg->op == URDMA_CM_STATS) {
		mutex_lock(&urdma_cm_mutex);
		urdma_cm_stats(chan, msg);
		mutex_unlock(&urdma_cm_mutex);
		return 0;
	}
	return urdma_cm_handle(chan, msg);
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
	rv = urdma_chan_dispatch(chan, msg);
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

int urdma_chan_init(void)
{
	return misc_register(&urdma_cm_misc);
}

void urdma_chan_exit(void)
{
	misc_deregister(&urdma_cm_misc);
}
