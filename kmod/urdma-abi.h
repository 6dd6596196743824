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

#define URDMA_ABI_VERSION 2
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

#endif /* URDMA_ABI_H */
