//! Opening and closing a urdma device: the provider's context, created
//! with the kernel's ucontext and checked against urdma.ko's ABI.

use std::ffi::{c_int, c_void};
use std::mem::offset_of;

use rdma_core_sys::{
    ibv_cmd_get_context, ibv_context, ibv_device, ibv_get_context, verbs_context,
    verbs_context_ops, verbs_init_and_alloc_context, verbs_set_ops, verbs_uninit_context,
    RDMA_DRIVER_UNKNOWN,
};

use crate::abi::{context_is_ours, AllocContextResp};
use crate::error::{object, Error};
use crate::guard::catch;
use crate::zero::{zeroed, Zeroable};
use crate::{control_verbs, cq_ex, data_verbs, log, mw, qp_ex, srq};

/// The provider's per-open-device state. libibverbs allocates it (zeroed)
/// and gives out the embedded `verbs_context`; it must stay plain data, as
/// it is released with `free()`.
#[repr(C)]
pub struct UrdmaContext {
    pub vctx: verbs_context,
    /// urdma.ko's index of the device, from alloc_ucontext.
    pub dev_id: u32,
}

// SAFETY: rdma-core's verbs_context, a bindgen C struct (integers, raw
// pointers, `Option<extern fn>`, C enums as integers, opaque pthread byte
// arrays), and an integer: all-zero is valid, as libibverbs' own zeroed
// allocation of it shows.
unsafe impl Zeroable for UrdmaContext {}

/// The `UrdmaContext` that holds `ctx`.
///
/// # Safety
/// `ctx` must be a context opened by [`alloc_context`].
pub unsafe fn from_ibv(ctx: *mut ibv_context) -> *mut UrdmaContext {
    let back = offset_of!(UrdmaContext, vctx) + offset_of!(verbs_context, context);
    // SAFETY: per the contract, ctx sits `back` bytes into a UrdmaContext.
    unsafe { ctx.cast::<u8>().sub(back).cast() }
}

struct ContextOps(verbs_context_ops);
// SAFETY: immutable table of function pointers.
unsafe impl Sync for ContextOps {}

/// The verbs urdma implements. Left out (None), libibverbs installs its
/// own stubs, which fail with EOPNOTSUPP in the way each verb reports
/// errors. The data-path verbs run in user space ([`data_verbs`], [`srq`]).
static CONTEXT_OPS: ContextOps = ContextOps(verbs_context_ops {
    query_device_ex: Some(control_verbs::query_device_ex),
    query_port: Some(control_verbs::query_port),
    alloc_pd: Some(control_verbs::alloc_pd),
    dealloc_pd: Some(control_verbs::dealloc_pd),
    reg_mr: Some(control_verbs::reg_mr),
    dereg_mr: Some(control_verbs::dereg_mr),
    alloc_mw: Some(mw::alloc_mw),
    dealloc_mw: Some(mw::dealloc_mw),
    bind_mw: Some(mw::bind_mw),
    create_cq: Some(control_verbs::create_cq),
    create_cq_ex: Some(cq_ex::create_cq_ex),
    destroy_cq: Some(control_verbs::destroy_cq),
    create_qp: Some(control_verbs::create_qp),
    create_qp_ex: Some(qp_ex::create_qp_ex),
    modify_qp: Some(control_verbs::modify_qp),
    query_qp: Some(control_verbs::query_qp),
    destroy_qp: Some(control_verbs::destroy_qp),
    free_context: Some(free_context),
    poll_cq: Some(data_verbs::poll_cq),
    req_notify_cq: Some(data_verbs::req_notify_cq),
    post_send: Some(data_verbs::post_send),
    post_recv: Some(data_verbs::post_recv),
    create_srq: Some(srq::create_srq),
    modify_srq: Some(srq::modify_srq),
    query_srq: Some(srq::query_srq),
    destroy_srq: Some(srq::destroy_srq),
    post_srq_recv: Some(srq::post_srq_recv),
    // Every other verb None: libibverbs' stub.
    ..zeroed()
});

/// The table handed to `verbs_set_ops` (tests inspect it).
pub fn context_ops() -> &'static verbs_context_ops {
    &CONTEXT_OPS.0
}

pub(crate) unsafe extern "C" fn alloc_context(
    device: *mut ibv_device,
    cmd_fd: c_int,
    _private_data: *mut c_void,
) -> *mut verbs_context {
    catch(std::ptr::null_mut(), || {
        // SAFETY: device and cmd_fd come from libibverbs' open path, which
        // hands us ownership of cmd_fd.
        object("alloc_context", unsafe { open(device, cmd_fd) })
    })
}

/// # Safety
/// As for `verbs_device_ops::alloc_context`.
unsafe fn open(device: *mut ibv_device, cmd_fd: c_int) -> Result<*mut verbs_context, Error> {
    // SAFETY: device and cmd_fd per the contract; the size and offset
    // describe UrdmaContext, which embeds the verbs_context.
    let ctx = unsafe {
        verbs_init_and_alloc_context(
            device,
            cmd_fd,
            size_of::<UrdmaContext>(),
            offset_of!(UrdmaContext, vctx),
            RDMA_DRIVER_UNKNOWN,
        )
    }
    .cast::<UrdmaContext>();
    if ctx.is_null() {
        // libibverbs has closed cmd_fd and set errno.
        return Err(Error::last_os("verbs_init_and_alloc_context"));
    }
    // SAFETY: ctx is the non-null UrdmaContext just allocated.
    let vctx = unsafe { &raw mut (*ctx).vctx };

    let mut cmd = ibv_get_context::default();
    let mut resp = AllocContextResp::default();
    // SAFETY: vctx was initialised above; cmd and resp are ours and sized
    // as passed.
    let ret = unsafe {
        ibv_cmd_get_context(
            vctx,
            &mut cmd,
            size_of_val(&cmd),
            &mut resp.ibv,
            size_of_val(&resp),
        )
    };
    let checked = Error::kernel("ibv_cmd_get_context", ret)
        .and_then(|()| context_is_ours(&resp.drv))
        .inspect_err(|e| log::error(format_args!("{e}")));
    if let Err(e) = checked {
        // Closes cmd_fd, which also releases the kernel's ucontext.
        // SAFETY: vctx was initialised by verbs_init_and_alloc_context,
        // which allocated ctx with malloc; neither is used after.
        unsafe {
            verbs_uninit_context(vctx);
            libc::free(ctx.cast());
        }
        return Err(e);
    }
    // SAFETY: ctx is ours and initialised; the ops table is 'static.
    unsafe {
        (*ctx).dev_id = resp.drv.dev_id;
        verbs_set_ops(vctx, &CONTEXT_OPS.0);
    }
    log::info(format_args!("opened urdma device {}", resp.drv.dev_id));
    Ok(vctx)
}

unsafe extern "C" fn free_context(ctx: *mut ibv_context) {
    catch((), || {
        if ctx.is_null() {
            return;
        }
        // SAFETY: libibverbs calls this once per context we opened.
        unsafe {
            let uctx = from_ibv(ctx);
            verbs_uninit_context(&raw mut (*uctx).vctx);
            libc::free(uctx.cast());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implemented_verbs_are_installed() {
        let ops = context_ops();
        assert!(ops.alloc_pd.is_some() && ops.dealloc_pd.is_some());
        assert!(ops.reg_mr.is_some() && ops.dereg_mr.is_some());
        assert!(ops.create_cq.is_some() && ops.destroy_cq.is_some());
        assert!(ops.create_qp.is_some() && ops.destroy_qp.is_some());
        assert!(ops.modify_qp.is_some() && ops.query_qp.is_some());
        assert!(ops.query_device_ex.is_some() && ops.query_port.is_some());
        assert!(ops.free_context.is_some());
        // Not implemented: left to libibverbs' EOPNOTSUPP stubs.
        assert!(ops.create_srq.is_some() && ops.post_srq_recv.is_some());
        assert!(ops.modify_srq.is_some() && ops.query_srq.is_some() && ops.destroy_srq.is_some());
        assert!(ops.alloc_mw.is_some() && ops.dealloc_mw.is_some() && ops.bind_mw.is_some());
        assert!(ops.create_ah.is_none() && ops.create_cq_ex.is_some());
    }

    #[test]
    fn from_ibv_inverts_the_embedding() {
        let mut c: Box<UrdmaContext> = Box::new(zeroed());
        let p: *mut UrdmaContext = &mut *c;
        // SAFETY: p points into the live box c.
        let ibv = unsafe { &raw mut (*p).vctx.context };
        // SAFETY: ibv is embedded in a UrdmaContext, as from_ibv requires.
        assert_eq!(unsafe { from_ibv(ibv) }, p);
    }
}
