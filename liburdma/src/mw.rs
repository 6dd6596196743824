//! Memory windows. urdma.ko allocates a window's STag index (from the
//! space of MR indices) and keeps the object; the provider keeps what it
//! is bound to, in the engine's table (`mem::MrTable`), where the data
//! path's protection checks find it as they find an MR.
//!
//! A bind is a send queue request: `ibv_bind_mw` (type 1) posts one, as
//! an `IBV_WR_BIND_MW` request (type 2) is ([`crate::data_verbs`]).

use std::ffi::c_int;

use rdma_core_sys::*;

use crate::control_verbs::{create, destroy, dev_of, qp_key, PANIC_ERRNO};
use crate::engine::{SendReq, Work};
use crate::error::{object, status, Error};
use crate::guard::catch;
use crate::mem::{Bind, MwType};
use crate::process;
use crate::zero::zeroed;

fn mw_type(t: ibv_mw_type) -> Option<MwType> {
    match t {
        IBV_MW_TYPE_1 => Some(MwType::One),
        IBV_MW_TYPE_2 => Some(MwType::Two),
        _ => None,
    }
}

pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    catch(std::ptr::null_mut(), || {
        let Some(kind) = mw_type(type_) else {
            return object(
                "alloc_mw",
                Err(Error::Invalid("a window type other than 1 and 2")),
            );
        };
        let mut cmd: ibv_alloc_mw = zeroed();
        let mut resp: ib_uverbs_alloc_mw_resp = zeroed();
        object(
            "alloc_mw",
            create("ibv_cmd_alloc_mw", |mw| {
                // SAFETY: mw is ours; pd as libibverbs passed it.
                unsafe {
                    ibv_cmd_alloc_mw(
                        pd,
                        type_,
                        mw,
                        &mut cmd,
                        size_of_val(&cmd),
                        &mut resp,
                        size_of_val(&resp),
                    )
                }
            })
            .inspect(|&mw: &*mut ibv_mw| {
                // SAFETY: the kernel filled in the window; pd is valid.
                let (dev, stag, pdh) = unsafe { (dev_of((*pd).context), (*mw).rkey, (*pd).handle) };
                process::with_engine(|e| e.mrs.add_window(dev, stag, pdh, kind));
            }),
        )
    })
}

pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: mw came from alloc_mw.
        let (dev, stag) = unsafe { (dev_of((*mw).context), (*mw).rkey) };
        // Unbound and out of the table first, under the engine lock: no
        // access through it can be running or start after.
        let old = process::with_engine(|e| e.mrs.remove_window(dev, stag));
        // SAFETY: mw came from alloc_mw.
        let cmd = || unsafe { ibv_cmd_dealloc_mw(mw) };
        // SAFETY: mw came from alloc_mw (create); libibverbs does not use
        // it after a successful dealloc.
        let r = unsafe { destroy("ibv_cmd_dealloc_mw", mw, cmd, || {}) };
        if let (true, Some(w)) = (r.is_err(), old) {
            // Still allocated: back, unbound.
            process::with_engine(|e| e.mrs.add_window(dev, w.stag, w.pd, w.kind));
        }
        status("dealloc_mw", r)
    })
}

/// The bind a request describes: the window `mw` (as the application
/// holds it) takes STag `new_stag` over `info`.
///
/// # Safety
/// `info.mr` is null or an MR of this provider.
pub(crate) unsafe fn bind_of(mw: *mut ibv_mw, new_stag: u32, info: &ibv_mw_bind_info) -> Bind {
    Bind {
        // SAFETY: libibverbs hands a window of ours.
        mw: unsafe { (*mw).rkey },
        new_stag,
        // SAFETY: per the contract.
        mr: (!info.mr.is_null()).then(|| unsafe { (*info.mr).lkey }),
        addr: info.addr,
        len: info.length,
        access: info.mw_access_flags,
    }
}

/// `ibv_bind_mw` (libibverbs has checked that the window is type 1 and
/// the MR in its PD): a bind request on `qp`'s send queue, the window's
/// key advanced by one as `ibv_inc_rkey` does. The window has its new
/// STag once the request is posted.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    catch(PANIC_ERRNO, || {
        if mw.is_null() || bind.is_null() {
            return status(
                "bind_mw",
                Err(Error::Invalid("no window or no bind description")),
            );
        }
        // SAFETY: libibverbs' window and bind description.
        let (old, b) = unsafe { ((*mw).rkey, &*bind) };
        let new_stag = (old & !0xff) | (old.wrapping_add(1) & 0xff);
        // SAFETY: the MR, if any, is the application's of this provider.
        let window = unsafe { bind_of(mw, new_stag, &b.bind_info) };
        let req = SendReq {
            wr_id: b.wr_id,
            op: Work::Bind(window),
            sges: &[],
            signaled: b.send_flags & IBV_SEND_SIGNALED != 0,
            inline: None,
        };
        // SAFETY: libibverbs passes a QP of ours.
        let key = unsafe { qp_key(qp) };
        let r = process::with(|sh, now| {
            let r = sh.post_send(key, &req, now);
            sh.progress_after_post(key, now);
            r
        });
        if r.is_ok() {
            // SAFETY: the application's window, which it does not use
            // concurrently with a bind of it.
            unsafe { (*mw).rkey = new_stag };
        }
        status("bind_mw", r)
    })
}
