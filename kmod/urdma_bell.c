// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The bell: a frame that completes a receive on a connected QP fires the
 * event of the QP's receive CQ, if the CQ is armed for that completion,
 * from the softirq that queued the frame on the QP's packet socket.  A
 * thread blocked in ibv_get_cq_event is then the only one woken, as with
 * siw and rxe; its ibv_poll_cq runs the protocol.  Nothing here reads the
 * frame: placement, checks and the protocol stay in the provider
 * (docs/architecture.md).
 *
 * What a frame completes is the verdict of urdmad's socket filter, which
 * af_packet runs in the same softirq, on the same CPU, just before it
 * copies the frame into the ring and calls sk_data_ready.  The filter
 * leaves the verdict in this CPU's slot of a per-CPU map, so the slot
 * read here is the frame's own even while other CPUs receive frames of
 * the socket: a bare acknowledgment or an out-of-order segment fires
 * nothing, and a solicited-only arm fires on solicited receives.  The one
 * exception is af_packet's drop_n_account path, which calls sk_data_ready
 * for a frame that passed the filter but lost the ring's last free slot
 * to another CPU (the ring one slot from full, two CPUs receiving the
 * connection's frames at once); its event may find nothing to poll, and
 * the peer's retransmission brings the frame again.
 *
 * The arm word is shared with the provider (urdma-abi.h): both sides swap
 * it from the arm they saw to OFF and only the winner fires, so one event
 * fires per ibv_req_notify_cq.  Send completions are the provider's to
 * announce (REQ_NOTIFY_CQ): no verdict speaks of them, so the frames that
 * bring them wake the socket's own waiters.
 *
 * A frame whose sender marked it as followed at once by the next (the
 * filter's QUIET verdict, for the PSN the process waits for) wakes nobody:
 * the next frame, whose PSN the filter then waits for, rings or wakes for
 * both.  If that frame is lost, the sender's retransmission wakes.  An
 * acknowledgment the process said can wait is QUIET too: it is read with
 * the process's next frame or call, or before its retransmission timer.
 *
 * A frame that fires no event is left to the process's own threads while
 * one of them is inside a verbs call that reads every socket before it
 * returns (the hush word, urdma-abi.h): a thread busy-polling its CQ takes
 * the frame itself, and a helper woken for it would only take the CPU from
 * it.  So is a frame that falls between two calls of a thread that polls
 * without pause, before the time the process gave for its next call; the
 * bell's timer wakes the socket's waiters at that time if no call read
 * the frame.  Otherwise the socket's waiters are woken as before.
 *
 * Locking: a QP's bell is set and cleared under urdma_cm_mutex; the
 * socket's sk_callback_lock keeps the softirq from a bell being taken
 * down, as siw does for its TCP sockets.
 */
#include <linux/bpf.h>
#include <linux/file.h>
#include <linux/hrtimer.h>
#include <linux/mm.h>
#include <linux/net.h>
#include <linux/slab.h>
#include <net/sock.h>

#include "urdma.h"

#if !IS_ENABLED(CONFIG_BPF_SYSCALL)
#error "the bell reads the verdicts of a BPF map: CONFIG_BPF_SYSCALL needed"
#endif

/*
 * The furthest ahead a process's next call may be said to be due.  The
 * provider says tens of microseconds; a time further off (the word is the
 * process's own) is taken for none, so that no value keeps a frame unread
 * for long or spins the timer.
 */
#define URDMA_HUSH_AHEAD_MAX_NS	(100 * NSEC_PER_MSEC)

struct urdma_bell {
	struct file *file;		/* keeps the socket */
	struct sock *sk;
	struct bpf_map *verdicts;	/* the socket filter's, per CPU */
	struct bpf_map *hush_map;	/* the process's, or NULL */
	struct urdma_hush *hush;	/* its value */
	struct hrtimer late;		/* a frame hushed between calls */
	struct urdma_qp *qp;
	void (*data_ready)(struct sock *sk);	/* the socket's own */
};

int urdma_cq_arm_pin(struct urdma_cq *cq, u64 addr)
{
	struct page *page;
	int rv;

	if (!addr)
		return 0;
	if (addr & (sizeof(u32) - 1))
		return -EINVAL;
	rv = pin_user_pages_fast(addr & PAGE_MASK, 1,
				 FOLL_WRITE | FOLL_LONGTERM, &page);
	if (rv != 1)
		return rv < 0 ? rv : -EFAULT;
	if (PageHighMem(page)) {
		unpin_user_page(page);
		return -EINVAL;
	}
	cq->arm_page = page;
	cq->arm = page_address(page) + offset_in_page(addr);
	return 0;
}

void urdma_cq_arm_unpin(struct urdma_cq *cq)
{
	if (!cq->arm_page)
		return;
	unpin_user_pages_dirty_lock(&cq->arm_page, 1, true);
	cq->arm_page = NULL;
	cq->arm = NULL;
}

/*
 * Takes the verdict the socket filter left for the frame being queued,
 * and clears it so that it counts once: a call no filter run preceded
 * (the filter detached, say) reads NONE, not a stale receive.  Only this
 * CPU touches its slot, the filter and we with BHs off (read_lock_bh),
 * so the two cannot interleave and a plain load and store suffice; ONCE
 * because the slot is also the BPF side's.  Our reference keeps the map,
 * and a per-CPU array's slots never move: no RCU section is needed.
 */
static u32 urdma_bell_verdict(struct bpf_map *map)
{
	u32 key = 0;
	u32 *slot;
	u32 v;

	lockdep_assert_in_softirq();
	slot = map->ops->map_lookup_elem(map, &key);
	if (!slot)
		return URDMA_BELL_NONE;
	v = READ_ONCE(*slot);
	WRITE_ONCE(*slot, URDMA_BELL_NONE);
	return v;
}

/* Fires the CQ's event if armed for the completion and the swap is ours. */
static bool urdma_cq_ring(struct ib_cq *ibcq, u32 verdict)
{
	struct urdma_cq *cq;
	u32 arm;

	if (verdict != URDMA_BELL_RECV && verdict != URDMA_BELL_RECV_SOLICITED)
		return false;
	if (!ibcq)
		return false;
	cq = to_ucq(ibcq);
	if (!cq->arm)
		return false;
	arm = READ_ONCE(*cq->arm);
	if (arm != URDMA_CQ_ARM_NEXT &&
	    (arm != URDMA_CQ_ARM_SOLICITED ||
	     verdict != URDMA_BELL_RECV_SOLICITED))
		return false;
	if (cmpxchg(cq->arm, arm, URDMA_CQ_ARM_OFF) != arm)
		return false;
	ibcq->comp_handler(ibcq, ibcq->cq_context);
	atomic64_inc(&to_udev(ibcq->device)->bell_events);
	return true;
}

/*
 * A frame of the QP that urdmad put on its ring completes a receive, as
 * verdict says (URDMA_CM_RING): the same event as for a frame of a direct
 * socket, fired from urdmad's write instead of the softirq.  Whether it
 * fired.
 */
bool urdma_bell_ring(struct urdma_qp *qp, u32 verdict)
{
	return urdma_cq_ring(qp->ibqp.recv_cq, verdict);
}

/* Whether a next call is due at until, after now and not too far off. */
static bool urdma_hush_ahead(u64 until, u64 now)
{
	return until > now && until - now <= URDMA_HUSH_AHEAD_MAX_NS;
}

/*
 * Whether a thread of the process will read the frame before its call
 * returns, or in a call due before hush->until: then the frame is left to
 * it, and the word says so.  The frame is in the socket already, so the
 * thread that finds URDMA_HUSH_MISSED finds the frame too.  A lost race
 * with the process (the word changed under the swap) wakes the socket's
 * waiters, as without a hush.  A frame left to a call not yet begun starts
 * the timer that wakes them if the call does not come.
 */
static bool urdma_bell_hush(struct urdma_bell *bell)
{
	u64 until = 0;
	u64 v;

	if (!bell->hush)
		return false;
	v = READ_ONCE(bell->hush->word);
	if (!(v & URDMA_HUSH_CALLS)) {
		until = READ_ONCE(bell->hush->until);
		if (!urdma_hush_ahead(until, ktime_get_ns()))
			return false;
	}
	if (cmpxchg(&bell->hush->word, v, v | URDMA_HUSH_MISSED) != v)
		return false;
	/* The timer keeps the time given for the last frame it hushed. */
	if (until && (!hrtimer_is_queued(&bell->late) ||
		      hrtimer_get_expires_ns(&bell->late) < until))
		hrtimer_start(&bell->late, ns_to_ktime(until),
			      HRTIMER_MODE_ABS_SOFT);
	atomic64_inc(&to_udev(bell->qp->ibqp.device)->bell_hushed);
	return true;
}

/*
 * The time given for the next call after the last frame this bell hushed
 * between calls has come.  A call since cleared URDMA_HUSH_MISSED, or will
 * read the socket when it leaves (one is in progress).  A time given since
 * that is still ahead came from a call that read every socket as it left:
 * the frame that set the bit again is another connection's, whose timer
 * keeps that time.  Otherwise nobody read the frame: the socket's waiters
 * are woken, late.  Runs in softirq, as the socket's callback does; detach
 * cancels it before the socket or the map goes.
 */
static enum hrtimer_restart urdma_bell_late(struct hrtimer *timer)
{
	struct urdma_bell *bell = container_of(timer, struct urdma_bell, late);
	u64 v = READ_ONCE(bell->hush->word);

	if (!(v & URDMA_HUSH_MISSED) || (v & URDMA_HUSH_CALLS))
		return HRTIMER_NORESTART;
	if (urdma_hush_ahead(READ_ONCE(bell->hush->until), ktime_get_ns()))
		return HRTIMER_NORESTART;
	atomic64_inc(&to_udev(bell->qp->ibqp.device)->bell_late);
	bell->data_ready(bell->sk);
	return HRTIMER_NORESTART;
}

static void urdma_bell_data_ready(struct sock *sk)
{
	struct urdma_bell *bell;
	u32 verdict;

	read_lock_bh(&sk->sk_callback_lock);
	bell = sk->sk_user_data;
	if (!bell) {
		/* Taken down since the call began: the socket's own is back. */
		read_unlock_bh(&sk->sk_callback_lock);
		if (sk->sk_data_ready != urdma_bell_data_ready)
			sk->sk_data_ready(sk);
		return;
	}
	verdict = urdma_bell_verdict(bell->verdicts);
	/*
	 * The woken thread's poll reads the frame: nobody else need wake.  A
	 * quiet frame is read with what comes next.
	 */
	if (verdict == URDMA_BELL_QUIET)
		atomic64_inc(&to_udev(bell->qp->ibqp.device)->bell_quiet);
	else if (!urdma_cq_ring(bell->qp->ibqp.recv_cq, verdict) &&
		 !urdma_bell_hush(bell))
		bell->data_ready(sk);
	read_unlock_bh(&sk->sk_callback_lock);
}

/*
 * A map of urdmad's (urdma-abi.h): the socket filter's verdicts, a per-CPU
 * array of __u32, or the process's hush word, an array of __u64.
 */
static struct bpf_map *urdma_bell_map_get(int fd, u32 type, u32 value_size)
{
	struct bpf_map *map = bpf_map_get(fd);

	if (IS_ERR(map))
		return map;
	if (map->map_type != type || map->key_size != sizeof(u32) ||
	    map->value_size != value_size || map->max_entries < 1) {
		bpf_map_put(map);
		return ERR_PTR(-EINVAL);
	}
	return map;
}

/* The process's hush map, and the address of its value. */
static struct bpf_map *urdma_hush_map_get(int fd, struct urdma_hush **word)
{
	struct bpf_map *map;
	u32 key = 0;

	map = urdma_bell_map_get(fd, BPF_MAP_TYPE_ARRAY,
				 sizeof(struct urdma_hush));
	if (IS_ERR(map))
		return map;
	/* An array's values never move while the map lives. */
	rcu_read_lock();
	*word = map->ops->map_lookup_elem(map, &key);
	rcu_read_unlock();
	if (!*word) {
		bpf_map_put(map);
		return ERR_PTR(-EINVAL);
	}
	return map;
}

int urdma_bell_attach(struct urdma_qp *qp, int sock_fd, int map_fd,
		      int hush_fd)
{
	struct urdma_bell *bell;
	struct socket *sock;
	struct sock *sk;
	int rv;

	bell = kzalloc(sizeof(*bell), GFP_KERNEL);
	if (!bell)
		return -ENOMEM;
	bell->file = fget(sock_fd);
	if (!bell->file) {
		rv = -EBADF;
		goto err_free;
	}
	sock = sock_from_file(bell->file);
	if (!sock || !sock->sk || sock->sk->sk_family != AF_PACKET) {
		rv = -ENOTSOCK;
		goto err_put;
	}
	bell->verdicts = urdma_bell_map_get(map_fd, BPF_MAP_TYPE_PERCPU_ARRAY,
					    sizeof(u32));
	if (IS_ERR(bell->verdicts)) {
		rv = PTR_ERR(bell->verdicts);
		goto err_put;
	}
	if (hush_fd >= 0) {
		bell->hush_map = urdma_hush_map_get(hush_fd, &bell->hush);
		if (IS_ERR(bell->hush_map)) {
			rv = PTR_ERR(bell->hush_map);
			bell->hush_map = NULL;
			goto err_map;
		}
	}
	sk = sock->sk;
	bell->sk = sk;
	bell->qp = qp;
	hrtimer_init(&bell->late, CLOCK_MONOTONIC, HRTIMER_MODE_ABS_SOFT);
	bell->late.function = urdma_bell_late;
	write_lock_bh(&sk->sk_callback_lock);
	if (sk->sk_user_data) {
		write_unlock_bh(&sk->sk_callback_lock);
		rv = -EBUSY;
		goto err_map;
	}
	bell->data_ready = sk->sk_data_ready;
	sk->sk_user_data = bell;
	sk->sk_data_ready = urdma_bell_data_ready;
	write_unlock_bh(&sk->sk_callback_lock);

	urdma_bell_detach(qp);
	qp->bell = bell;
	return 0;

err_map:
	if (bell->hush_map)
		bpf_map_put(bell->hush_map);
	bpf_map_put(bell->verdicts);
err_put:
	fput(bell->file);
err_free:
	kfree(bell);
	return rv;
}

void urdma_bell_detach(struct urdma_qp *qp)
{
	struct urdma_bell *bell = qp->bell;
	struct sock *sk;

	if (!bell)
		return;
	qp->bell = NULL;
	sk = bell->sk;
	write_lock_bh(&sk->sk_callback_lock);
	sk->sk_data_ready = bell->data_ready;
	sk->sk_user_data = NULL;
	write_unlock_bh(&sk->sk_callback_lock);
	/* No frame starts the timer past the unlock. */
	hrtimer_cancel(&bell->late);
	/* No softirq reads the maps past the cancel. */
	if (bell->hush_map)
		bpf_map_put(bell->hush_map);
	bpf_map_put(bell->verdicts);
	fput(bell->file);
	kfree(bell);
}
