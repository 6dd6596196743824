/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The whole kernel <-> provider ABI of urdma: the private udata that
 * urdma.ko and liburdma exchange on top of the generic uverbs commands.
 *
 * This header is the single source of truth.  urdma.ko includes it directly;
 * liburdma generates its Rust bindings from it at build time, and a test on
 * each side checks the sizes below.  Any change to a struct here must bump
 * URDMA_ABI_VERSION: libibverbs refuses to bind liburdma to a device whose
 * sysfs abi_version differs, and the provider checks the magic and version
 * returned by alloc_ucontext a second time.
 */
#ifndef URDMA_ABI_H
#define URDMA_ABI_H

#include <linux/types.h>

#define URDMA_ABI_VERSION 6
/* "URDM": tells the provider that the context really came from urdma.ko. */
#define URDMA_ABI_MAGIC 0x5552444dU
/*
 * The device's node_desc in sysfs.  With node type RNIC and no driver id
 * (RDMA_DRIVER_UNKNOWN) it is how the provider recognises a urdma device;
 * the device name is chosen by the administrator and proves nothing.
 */
#define URDMA_NODE_DESC "urdma"

/* Response to alloc_ucontext. */
struct urdma_uresp_alloc_ctx {
	__u32 magic;
	__u32 abi_version;
	__u32 dev_id;		/* index of the urdma device, stable while it exists */
	__u32 reserved;
};

/*
 * Request of create_cq: where the CQ's arm word lives in the provider, or 0
 * for a CQ without one (no completion channel).  The word is a __u32 holding
 * an enum urdma_cq_arm.  The provider sets it in ibv_req_notify_cq; whoever
 * first sees a completion the arm asks for swaps it back to
 * URDMA_CQ_ARM_OFF and, having won the swap, fires the CQ's event: the
 * provider (with REQ_NOTIFY_CQ) when it pushes the completion, or urdma.ko
 * when a frame that completes a receive reaches a QP of the CQ on its
 * direct socket (URDMA_CM_BELL), or urdmad says one reached its ring
 * (URDMA_CM_RING).
 * So exactly one event fires per arm.  urdma.ko pins the word's page from
 * create_cq to destroy_cq.
 */
struct urdma_ureq_create_cq {
	__u64 arm_addr;		/* 4-byte aligned */
};

enum urdma_cq_arm {
	URDMA_CQ_ARM_OFF = 0,
	URDMA_CQ_ARM_NEXT = 1,		/* any completion */
	URDMA_CQ_ARM_SOLICITED = 2,	/* a solicited one or an error */
};

/* Response to create_cq. */
struct urdma_uresp_create_cq {
	__u32 cq_id;
	__u32 reserved;
};

/* Response to create_qp. */
struct urdma_uresp_create_qp {
	__u32 qp_id;
	__u32 reserved;
};

/*
 * Connection management channel between urdma.ko and urdmad: the misc
 * device /dev/urdma_cm.  urdmad opens it, registers the exception
 * interfaces it serves, then read()s and write()s whole struct
 * urdma_cm_msg records (one per call).  docs/connection.md describes the
 * exchange; this header defines every byte of it.
 */
#define URDMA_CM_DEVNAME	"urdma_cm"
/* iw_cm carries at most 255 bytes of private data (u8 length). */
#define URDMA_CM_MAX_PDATA	255
#define URDMA_CM_IFNAMSIZ	16
#define URDMA_CM_PATHSIZ	108

enum urdma_cm_op {
	/* urdmad -> kernel */
	URDMA_CM_REGISTER = 1,		/* serve ifname (in urdmad's netns); socket_path */
	URDMA_CM_REQUEST = 2,		/* ConnectRequest for listener id: new req */
	URDMA_CM_CONNECTED = 3,		/* CONNECT id established (pdata, ird, ord) */
	URDMA_CM_CONNECT_FAILED = 4,	/* CONNECT id failed: status, peer pdata */
	URDMA_CM_ACCEPTED = 5,		/* answer to ACCEPT req: status */
	URDMA_CM_PEER_CLOSED = 6,	/* peer began a graceful close of dev/qpn */
	URDMA_CM_CLOSED = 7,		/* dev/qpn's connection ended: status */
	URDMA_CM_REQUEST_GONE = 8,	/* req abandoned before accept/reject */
	URDMA_CM_STATS = 9,		/* ifname's port counters, in pdata */
	URDMA_CM_BELL = 10,		/* dev/qpn's frames: socket req, verdicts id */
	URDMA_CM_RING = 11,		/* a frame of dev/qpn's ring: verdict status */
	/* kernel -> urdmad */
	URDMA_CM_LISTEN = 32,		/* listener id on local addr:port (addr 0 = any) */
	URDMA_CM_UNLISTEN = 33,		/* listener id is gone */
	URDMA_CM_CONNECT = 34,		/* connect dev/qpn as id: local, remote, mac */
	URDMA_CM_ACCEPT = 35,		/* accept req with dev/qpn: pdata, ird, ord */
	URDMA_CM_REJECT = 36,		/* reject req: pdata */
	URDMA_CM_DISCONNECT = 37,	/* close dev/qpn: status 0 graceful, <0 abort */
};

/*
 * The counters of a port that URDMA_CM_STATS carries: pdata holds pdata_len / 8
 * __u64 values, in this order, for the interface ifname (a shorter list leaves
 * the others as they were).  Each device on that interface shows them as its
 * port's hw_counters (rdma statistic show link DEV/1).  The frame counters are
 * urdmad's port's; the others sum the transport counters of every QP that ran
 * on the port, live or gone.
 */
enum urdma_stat {
	URDMA_STAT_RX_FRAMES,		/* frames received on the port */
	URDMA_STAT_TX_FRAMES,		/* frames sent on the port */
	URDMA_STAT_RX_DROPS,		/* frames lost on their way to urdmad or a QP */
	URDMA_STAT_RX_PACKETS,		/* datagrams QPs received */
	URDMA_STAT_TX_PACKETS,		/* datagrams QPs sent, retransmissions too */
	URDMA_STAT_RETRANSMISSIONS,	/* datagrams QPs sent again */
	URDMA_STAT_TIMEOUTS,		/* retransmission timeouts */
	URDMA_STAT_DUPLICATES,		/* datagrams QPs received twice */
	URDMA_STAT_CRC_ERRORS,		/* datagrams dropped for their CRC32C */
	URDMA_STAT_MALFORMED,		/* datagrams of a QP that did not parse */
	URDMA_STAT_COUNT
};

/*
 * URDMA_CM_BELL: req is a descriptor, in urdmad, of the packet socket that
 * receives dev/qpn's frames (the direct path), id one of the verdict map
 * that the socket's filter writes (below).  urdma.ko watches the socket
 * until the QP is destroyed or urdmad sends CLOSED for it: a frame whose
 * verdict announces a receive completion that the QP's receive CQ is
 * armed for fires that CQ's event at once, in the softirq that queued the
 * frame, and the provider's poll then runs the protocol.  Such a frame
 * wakes no other waiter of the socket (the provider's helper thread), nor
 * does a QUIET one: a frame whose sender says its next frame follows at
 * once (that frame wakes, or rings, for both), or an acknowledgment the
 * process said can wait for its next wake-up; every other frame wakes
 * them as before.  A later BELL for the same QP replaces the earlier one.
 *
 * The verdict map is a BPF_MAP_TYPE_PERCPU_ARRAY (key and value __u32,
 * at least one entry).  For every frame it accepts, the socket filter
 * stores the frame's enum urdma_bell_verdict in entry 0 of the CPU it
 * runs on; urdma.ko reads and clears it in the same softirq, so the slot
 * cannot hold another frame's verdict.
 *
 * pdata, when pdata_len is 4, holds a descriptor (__s32, host order) of
 * the process's hush map: a BPF_MAP_TYPE_ARRAY whose entry 0 is a __u64
 * that the process maps and keeps (the hush word, below).  Without it,
 * pdata_len is 0.
 */
/*
 * URDMA_CM_RING: urdmad put a frame of dev/qpn on the QP's ring (a
 * connection off the direct path), and status holds its verdict, as
 * urdmad's filter would have left it (URDMA_BELL_RECV or
 * URDMA_BELL_RECV_SOLICITED; any other fires nothing).  urdma.ko fires the
 * QP's receive CQ's event if the CQ is armed for it, as the bell does for
 * a direct socket's frame.  The write returns the message's size when the
 * event fired, 0 when it did not (the CQ not armed for it): urdmad then
 * wakes the process's helper for the frame.
 */
enum urdma_bell_verdict {
	URDMA_BELL_NONE = 0,		/* completes nothing the bell announces */
	URDMA_BELL_RECV = 1,		/* completes a receive, in order */
	URDMA_BELL_RECV_SOLICITED = 2,	/* the same, and it is solicited */
	URDMA_BELL_QUIET = 3,		/* wake nobody: read with what comes next */
};

/*
 * The hush word: how many of the process's threads are inside a verbs call
 * that reads the sockets of all its QPs before it returns, and whether a
 * frame came meanwhile.  A frame that fires no CQ event while the count is
 * not zero wakes nobody: urdma.ko sets URDMA_HUSH_MISSED instead (in one
 * compare-and-swap with the count it read), and the last thread out of its
 * call reads the sockets again if it finds the bit set.  The frame is in
 * the socket before urdma.ko looks, so the thread that sees the bit finds
 * it.  The process clears the bit before each round that reads every
 * socket.
 *
 * until: while a thread polls without pause, the CLOCK_MONOTONIC time (ns)
 * before which its next call is due (0: none).  A frame that comes between
 * two calls before then is hushed as well, and urdma.ko wakes the socket's
 * waiters at that time if no call has read it by then (the bit still set
 * and no thread in a call).
 */
#define URDMA_HUSH_CALLS	0xffffffffULL	/* threads in such a call */
#define URDMA_HUSH_MISSED	0x100000000ULL	/* a frame woke nobody since */

struct urdma_hush {
	__u64 word;		/* URDMA_HUSH_CALLS, URDMA_HUSH_MISSED */
	__u64 until;
};

/*
 * One message, both directions.  Fields a message does not use are zero.
 * Addresses and ports are in network byte order, everything else in host
 * order.  status is 0 or a negative errno.
 */
struct urdma_cm_msg {
	__u32 op;			/* enum urdma_cm_op */
	__s32 status;
	__u64 id;			/* kernel's handle: listener or connect */
	__u64 req;			/* urdmad's handle: an incoming request */
	__u32 dev_id;			/* ib_device index (as in alloc_ctx) */
	__u32 qpn;
	__u32 local_addr;		/* IPv4, network order */
	__u32 remote_addr;
	__u16 local_port;		/* network order */
	__u16 remote_port;
	__u16 ird;
	__u16 ord;
	__u8 remote_mac[6];		/* next hop's MAC (CONNECT) */
	__u16 pdata_len;
	__u8 pdata[URDMA_CM_MAX_PDATA + 1];
	char ifname[URDMA_CM_IFNAMSIZ];		/* REGISTER, LISTEN, CONNECT: NUL-terminated */
	char socket_path[URDMA_CM_PATHSIZ];	/* REGISTER: urdmad's control socket */
	/*
	 * CONNECT, ACCEPT: the process that created the QP, by its process id
	 * in urdmad's pid namespace (0: none there).  urdmad hands the
	 * connection to that process.
	 */
	__u32 owner;
};

/*
 * Private request of modify_srq.  The provider sees its SRQ fall below the
 * armed limit (the receives are taken in user space) and asks the module to
 * raise IB_EVENT_SRQ_LIMIT_REACHED, which disarms the limit.
 */
#define URDMA_SRQ_REPORT_LIMIT	1U

struct urdma_ureq_modify_srq {
	__u32 flags;		/* URDMA_SRQ_REPORT_LIMIT */
	__u32 reserved;
};

#endif /* URDMA_ABI_H */
