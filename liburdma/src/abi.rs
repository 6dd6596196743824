//! The kernel <-> provider ABI, generated from `kmod/urdma-abi.h`, and the
//! full response buffers of the commands that carry urdma's private udata.
//!
//! The kernel writes its private response right after the generic uverbs
//! response, so each buffer is the generic part followed by ours.

#![allow(non_camel_case_types)]

mod generated {
    #![allow(non_upper_case_globals, non_camel_case_types, dead_code)]
    // bindgen's generated code (its zeroing Default impls) carries no
    // SAFETY comments; the structs are plain C data.
    #![allow(clippy::undocumented_unsafe_blocks)]
    include!(concat!(env!("OUT_DIR"), "/urdma_abi.rs"));
}

pub use generated::*;

use crate::error::Error;
use rdma_core_sys::{
    ib_uverbs_create_cq_resp, ib_uverbs_create_qp_resp, ib_uverbs_get_context_resp,
};

#[repr(C)]
#[derive(Default)]
pub struct AllocContextResp {
    pub ibv: ib_uverbs_get_context_resp,
    pub drv: urdma_uresp_alloc_ctx,
}

/// `create_cq`'s command with urdma's private request after it.
#[repr(C)]
pub struct CreateCqCmd {
    pub ibv: rdma_core_sys::ibv_create_cq,
    pub drv: urdma_ureq_create_cq,
}

#[repr(C)]
#[derive(Default)]
pub struct CreateCqResp {
    pub ibv: ib_uverbs_create_cq_resp,
    pub drv: urdma_uresp_create_cq,
}

#[repr(C)]
#[derive(Default)]
pub struct CreateQpResp {
    pub ibv: ib_uverbs_create_qp_resp,
    pub drv: urdma_uresp_create_qp,
}

/// Whether an alloc_ucontext response really came from a urdma.ko speaking
/// our ABI version (the device match only saw sysfs).
pub fn context_is_ours(r: &urdma_uresp_alloc_ctx) -> Result<(), Error> {
    if r.magic != URDMA_ABI_MAGIC {
        return Err(Error::ForeignDevice(format!(
            "device answered with magic {:#010x}, not urdma's {URDMA_ABI_MAGIC:#010x}",
            r.magic
        )));
    }
    if r.abi_version != URDMA_ABI_VERSION {
        return Err(Error::ForeignDevice(format!(
            "kernel speaks urdma ABI {}, this provider {URDMA_ABI_VERSION}",
            r.abi_version
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // The kernel sees these structs through the same header; what must
    // also hold is where they land behind the generic uverbs responses,
    // which is what the kernel's udata offset is computed from.
    #[test]
    fn private_udata_follows_the_generic_response() {
        assert_eq!(size_of::<urdma_uresp_alloc_ctx>(), 16);
        assert_eq!(size_of::<urdma_uresp_create_cq>(), 8);
        assert_eq!(size_of::<urdma_uresp_create_qp>(), 8);
        assert_eq!(offset_of!(AllocContextResp, drv), 8);
        assert_eq!(offset_of!(CreateCqResp, drv), 8);
        assert_eq!(size_of::<urdma_ureq_create_cq>(), 8);
        assert_eq!(
            offset_of!(CreateCqCmd, drv),
            size_of::<rdma_core_sys::ibv_create_cq>()
        );
        assert_eq!(offset_of!(CreateQpResp, drv), 32);
        assert_eq!(
            offset_of!(AllocContextResp, drv),
            size_of::<ib_uverbs_get_context_resp>()
        );
        assert_eq!(
            offset_of!(CreateQpResp, drv),
            size_of::<ib_uverbs_create_qp_resp>()
        );
    }

    #[test]
    fn context_check_accepts_only_our_magic_and_version() {
        let mut r = urdma_uresp_alloc_ctx {
            magic: URDMA_ABI_MAGIC,
            abi_version: URDMA_ABI_VERSION,
            ..Default::default()
        };
        assert!(context_is_ours(&r).is_ok());
        r.abi_version += 1;
        assert!(context_is_ours(&r).is_err());
        r.abi_version = URDMA_ABI_VERSION;
        r.magic = 0;
        assert!(context_is_ours(&r).is_err());
    }
}
