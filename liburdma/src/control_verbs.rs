//! The control verbs urdma implements, each a round trip to urdma.ko
//! through libibverbs' `ibv_cmd_*` helpers, which own the uverbs command
//! encoding. Objects are the libibverbs structs, boxed; failures follow
//! libibverbs: NULL plus errno for constructors, an errno return otherwise.

use std::ffi::{c_int, c_void};

use rdma_core_sys::*;

use crate::abi::{urdma_ureq_create_cq, CreateCqCmd, CreateCqResp, CreateQpResp};
use crate::cq::ArmWord;
use crate::engine::QpInit;
use crate::error::{object, status, Error};
use crate::guard::catch;
use crate::mem::access_from_ibv;
use crate::zero::{zeroed, Zeroable};
use crate::{context, log, process};

/// Allocates a zeroed `T` for libibverbs to fill in and runs the kernel
/// command `cmd` that creates the object on it. On success the kernel holds
/// the object and the box is handed out, to be freed by [`destroy`]; on
/// failure (the kernel's errno, for `verb`) nothing refers to it and it is freed here.
pub(crate) fn create<T: Zeroable>(
    verb: &'static str,
    cmd: impl FnOnce(*mut T) -> c_int,
) -> Result<*mut T, Error> {
    let obj = Box::into_raw(Box::new(zeroed::<T>()));
    match Error::kernel(verb, cmd(obj)) {
        Ok(()) => Ok(obj),
        Err(e) => {
            // SAFETY: obj came from Box::into_raw above and the failed
            // command left nothing holding it: it is still only ours.
            drop(unsafe { Box::from_raw(obj) });
            Err(e)
        }
    }
}

/// Runs the kernel command `cmd` that destroys `obj`; once it succeeded,
/// `forget` drops what the provider keeps about the object (it may still
/// read `obj`) and the box is freed. A failed command (the kernel's errno,
/// for `verb`) leaves both, as the object still exists.
///
/// # Safety
/// `obj` came from [`create`] (as a `T`) and is not used after a success.
pub(crate) unsafe fn destroy<T>(
    verb: &'static str,
    obj: *mut T,
    cmd: impl FnOnce() -> c_int,
    forget: impl FnOnce(),
) -> Result<(), Error> {
    Error::kernel(verb, cmd())?;
    forget();
    // SAFETY: per the contract: create's box, which the kernel let go
    // of and nothing uses any more.
    drop(unsafe { Box::from_raw(obj) });
    Ok(())
}

/// For verbs that return an errno: a panic becomes EIO.
pub(crate) const PANIC_ERRNO: c_int = libc::EIO;

#[repr(C)]
pub struct UrdmaCq {
    pub vcq: verbs_cq,
    /// urdma.ko's CQ id, the name the data path uses.
    pub id: u32,
    /// The device's id (from alloc_ucontext).
    pub dev: u32,
    /// An extended CQ's completion being read (`cq_ex`)...
    pub current: ibv_wc,
    /// ...by the thread between `ibv_start_poll` and `ibv_end_poll`.
    pub polling: std::sync::atomic::AtomicBool,
}

// SAFETY: bindgen structs of rdma-core (integers, raw pointers, C enums as
// integers, unions of integers, opaque pthread byte arrays), integers and an
// AtomicBool (false): all-zero is valid.
unsafe impl Zeroable for UrdmaCq {}

#[repr(C)]
pub struct UrdmaQp {
    pub vqp: verbs_qp,
    /// urdma.ko's QP id (= the QP number).
    pub id: u32,
    pub dev: u32,
    /// The requests built by `ibv_wr_*` (a QP made by `ibv_create_qp_ex`
    /// with send operations; else null).
    pub batch: *mut crate::qp_ex::Batch,
}

// SAFETY: as for UrdmaCq: rdma-core's plain C struct, integers and a raw
// pointer (null).
unsafe impl Zeroable for UrdmaQp {}

unsafe extern "C" {
    // libibverbs' helper (IBVERBS_PRIVATE_34) for the REQ_NOTIFY_CQ command;
    // not in rdma-core-sys's list.
    fn ibv_cmd_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;
}

/// The device id of an open context.
///
/// # Safety
/// `ctx` is a context opened by this provider.
pub(crate) unsafe fn dev_of(ctx: *mut ibv_context) -> u32 {
    // SAFETY: per the contract.
    unsafe { (*context::from_ibv(ctx)).dev_id }
}

/// The engine's names of a CQ and a QP.
///
/// # Safety
/// `cq` was created by [`create_cq`].
pub(crate) unsafe fn cq_key(cq: *mut ibv_cq) -> (u32, u32) {
    // SAFETY: UrdmaCq starts with the ibv_cq.
    let c = unsafe { &*cq.cast::<UrdmaCq>() };
    (c.dev, c.id)
}

/// # Safety
/// `qp` was created by [`create_qp`].
pub(crate) unsafe fn qp_key(qp: *mut ibv_qp) -> (u32, u32) {
    // SAFETY: UrdmaQp starts with the ibv_qp.
    let q = unsafe { &*qp.cast::<UrdmaQp>() };
    (q.dev, q.id)
}

fn c_path(a: &[std::ffi::c_char]) -> std::path::PathBuf {
    // SAFETY: reinterpreting c_char as u8 of the same size.
    let b = unsafe { &*(a as *const [std::ffi::c_char] as *const [u8]) };
    let len = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::path::PathBuf::from(String::from_utf8_lossy(&b[..len]).into_owned())
}

/// The kernel reports the firmware version as one number; ibv_devinfo
/// shows the provider's rendering of it.
pub fn fw_ver_string(fw: u64) -> String {
    format!("{}.{}.{}", fw >> 32, (fw >> 16) & 0xffff, fw & 0xffff)
}

fn write_c_string(dst: &mut [std::ffi::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as std::ffi::c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    catch(PANIC_ERRNO, || {
        let mut resp: ib_uverbs_ex_query_device_resp = zeroed();
        let mut resp_size = size_of_val(&resp);
        // SAFETY: arguments as libibverbs passed them; resp is ours.
        let ret = unsafe {
            ibv_cmd_query_device_any(ctx, input, attr, attr_size, &mut resp, &mut resp_size)
        };
        if ret == 0 {
            // SAFETY: attr_size always covers orig_attr (libibverbs' rule).
            let orig = unsafe { &mut (*attr).orig_attr };
            write_c_string(&mut orig.fw_ver, &fw_ver_string(resp.base.fw_ver));
        }
        ret
    })
}

pub(crate) unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    catch(PANIC_ERRNO, || {
        let mut cmd: ibv_query_port = zeroed();
        // SAFETY: as libibverbs passed them.
        unsafe { ibv_cmd_query_port(ctx, port, attr, &mut cmd, size_of_val(&cmd)) }
    })
}

pub(crate) unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    catch(std::ptr::null_mut(), || {
        let mut cmd: ibv_alloc_pd = zeroed();
        let mut resp: ib_uverbs_alloc_pd_resp = zeroed();
        object(
            "alloc_pd",
            create("ibv_cmd_alloc_pd", |pd| {
                // SAFETY: pd is ours; ctx as libibverbs passed it.
                unsafe {
                    ibv_cmd_alloc_pd(
                        ctx,
                        pd,
                        &mut cmd,
                        size_of_val(&cmd),
                        &mut resp,
                        size_of_val(&resp),
                    )
                }
            }),
        )
    })
}

pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: pd came from alloc_pd.
        let cmd = || unsafe { ibv_cmd_dealloc_pd(pd) };
        // SAFETY: pd came from alloc_pd (create); libibverbs does not use
        // it after a successful dealloc.
        status("dealloc_pd", unsafe {
            destroy("ibv_cmd_dealloc_pd", pd, cmd, || {})
        })
    })
}

pub(crate) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    hca_va: u64,
    access: c_int,
) -> *mut ibv_mr {
    catch(std::ptr::null_mut(), || {
        // Tagged offsets are the addresses the memory is copied at.
        if hca_va != addr as u64 {
            let e = Error::Unsupported("reg_mr with an I/O virtual address other than the address");
            log::error(format_args!("{e}"));
            return object("reg_mr", Err(e));
        }
        let mut cmd: ibv_reg_mr = zeroed();
        let mut resp: ib_uverbs_reg_mr_resp = zeroed();
        object(
            "reg_mr",
            create("ibv_cmd_reg_mr", |vmr| {
                // SAFETY: vmr is ours; the rest as libibverbs passed it.
                unsafe {
                    ibv_cmd_reg_mr(
                        pd,
                        addr,
                        length,
                        hca_va,
                        access,
                        vmr,
                        &mut cmd,
                        size_of_val(&cmd),
                        &mut resp,
                        size_of_val(&resp),
                    )
                }
            })
            .map(|vmr: *mut verbs_mr| {
                // SAFETY: the kernel filled in the MR; pd is valid.
                let (dev, stag, pdh) =
                    unsafe { (dev_of((*pd).context), (*vmr).ibv_mr.lkey, (*pd).handle) };
                let region = trp::Region::new(
                    pdh,
                    addr as u64,
                    length as u64,
                    access_from_ibv(access as u32),
                );
                process::with_engine(|e| e.mrs.insert(dev, stag, region, access as u32));
                // SAFETY: vmr is the live box create returned.
                unsafe { &raw mut (*vmr).ibv_mr }
            }),
        )
    })
}

pub(crate) unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: vmr came from reg_mr.
        let (dev, stag) = unsafe { (dev_of((*vmr).ibv_mr.context), (*vmr).ibv_mr.lkey) };
        // Out of the table first, under the engine lock: no placement can
        // be running, and none will reach this memory after. Not while
        // windows are bound to it (EBUSY).
        let old = match process::with_engine(|e| e.mrs.remove(dev, stag)) {
            Ok(old) => old,
            Err(e) => return status("dereg_mr", Err(e)),
        };
        // SAFETY: vmr came from reg_mr.
        let cmd = || unsafe { ibv_cmd_dereg_mr(vmr) };
        // SAFETY: vmr came from reg_mr (create); libibverbs does not use it
        // after a successful dereg.
        let r = unsafe { destroy("ibv_cmd_dereg_mr", vmr, cmd, || {}) };
        if let (true, Some(m)) = (r.is_err(), old) {
            process::with_engine(|e| e.mrs.restore(dev, stag, m));
        }
        status("dereg_mr", r)
    })
}

/// # Safety
/// As for `verbs_context_ops::create_cq`.
pub(crate) unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    catch(std::ptr::null_mut(), || {
        // Only a CQ with a channel has events for the kernel's bell to fire.
        let arm = ArmWord::default();
        let mut cmd = CreateCqCmd {
            ibv: zeroed(),
            drv: urdma_ureq_create_cq {
                arm_addr: if channel.is_null() { 0 } else { arm.addr() },
            },
        };
        let mut resp = CreateCqResp::default();
        let made = create("ibv_cmd_create_cq", |cq: *mut UrdmaCq| {
            // SAFETY: cq is ours (verbs_cq starts with the ibv_cq); the
            // private request follows the command (CreateCqCmd is repr(C)).
            unsafe {
                ibv_cmd_create_cq(
                    ctx,
                    cqe,
                    channel,
                    comp_vector,
                    cq.cast::<ibv_cq>(),
                    &mut cmd.ibv,
                    size_of_val(&cmd),
                    &mut resp.ibv,
                    size_of_val(&resp),
                )
            }
        });
        object(
            "create_cq",
            made.map(|cq| {
                let ibcq = cq.cast::<ibv_cq>();
                // SAFETY: ctx is our context (libibverbs' contract).
                let dev = unsafe { dev_of(ctx) };
                // SAFETY: cq is the live box create returned.
                unsafe {
                    (*cq).id = resp.drv.cq_id;
                    (*cq).dev = dev;
                }
                let at = ibcq as usize;
                let notify: crate::cq::Notify = Box::new(move || {
                    // SAFETY: the engine drops this closure (destroy_cq) before
                    // the CQ is freed; it runs under the engine lock.
                    unsafe { ibv_cmd_req_notify_cq(at as *mut ibv_cq, 0) };
                });
                let cap = cqe.max(1) as usize;
                let key = (dev, resp.drv.cq_id);
                process::with_engine(|e| e.create_cq_with_arm(key, cap, notify, arm));
                log::debug(format_args!("cq {} ({cqe} entries)", resp.drv.cq_id));
                ibcq
            }),
        )
    })
}

pub(crate) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: cq came from create_cq.
        let cmd = || unsafe { ibv_cmd_destroy_cq(cq) };
        let forget = || {
            // SAFETY: cq came from create_cq and is not freed yet.
            let key = unsafe { cq_key(cq) };
            process::with_engine(|e| e.destroy_cq(key));
        };
        // SAFETY: cq came from create_cq, a box of UrdmaCq at offset 0;
        // libibverbs does not use it after a successful destroy.
        status("destroy_cq", unsafe {
            destroy("ibv_cmd_destroy_cq", cq.cast::<UrdmaCq>(), cmd, forget)
        })
    })
}

pub(crate) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    catch(std::ptr::null_mut(), || {
        // SAFETY: pd and its context are valid (libibverbs' contract).
        let (ctx, pdh) = unsafe { ((*pd).context, (*pd).handle) };
        // SAFETY: ctx is the context of one of our PDs.
        let dev = unsafe { dev_of(ctx) };
        let mut cmd: ibv_create_qp = zeroed();
        let mut resp = CreateQpResp::default();
        // The kernel first: an invalid request fails with its errno.
        let made = create("ibv_cmd_create_qp", |qp: *mut UrdmaQp| {
            // SAFETY: qp is ours (verbs_qp starts with the ibv_qp).
            unsafe {
                ibv_cmd_create_qp(
                    pd,
                    qp.cast::<ibv_qp>(),
                    attr,
                    &mut cmd,
                    size_of_val(&cmd),
                    &mut resp.ibv,
                    size_of_val(&resp),
                )
            }
        });
        let qp = match made {
            Ok(qp) => qp,
            Err(e) => return object("create_qp", Err(e)),
        };
        let ibqp = qp.cast::<ibv_qp>();
        // libibverbs fills qp_num whichever way the command went (write or
        // ioctl); the generic response buffer is only used by the former.
        // urdma.ko's private udata carries the same number.
        // SAFETY: the kernel made the QP; ibqp is ours.
        let qpn = match unsafe { (*ibqp).qp_num } {
            0 => resp.drv.qp_id,
            n => n,
        };
        // SAFETY: qp is the live box create returned.
        unsafe {
            (*qp).id = qpn;
            (*qp).dev = dev;
        }
        // SAFETY: attr is the caller's, updated with the granted caps.
        let a = unsafe { &*attr };
        // SAFETY: the CQs a QP is created with are ours (libibverbs checks
        // they belong to the same context).
        let (send_cq, recv_cq) = unsafe { (cq_key(a.send_cq), cq_key(a.recv_cq)) };
        let init = QpInit {
            pd: pdh,
            send_cq,
            recv_cq,
            sig_all: a.sq_sig_all != 0,
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline: a.cap.max_inline_data,
            srq: (!a.srq.is_null()).then(|| crate::srq::srq_key(a.srq)),
        };
        // SAFETY: the context's device is libibverbs' record of it.
        let ibdev_path = unsafe { c_path(&(*(*ctx).device).ibdev_path) };
        // The first QP of the process attaches it to urdmad. urdmad hears whose QP it is
        // from urdma.ko, with the QP's CONNECT or ACCEPT: nothing is said to it here.
        let registered = process::with(|sh, _| {
            sh.ensure_attached_for(&ibdev_path)?;
            sh.engine.create_qp((dev, qpn), init);
            sh.handles.insert((dev, qpn), ibqp as usize);
            Ok(())
        });
        object(
            "create_qp",
            match registered {
                Ok(()) => {
                    log::debug(format_args!("qp {qpn} (dev {dev})"));
                    Ok(ibqp)
                }
                Err(e) => {
                    // Undo the kernel's QP; if that fails too, the object stays
                    // allocated, as the kernel still has it.
                    // SAFETY: the kernel QP made above.
                    let cmd = || unsafe { ibv_cmd_destroy_qp(ibqp) };
                    // SAFETY: qp is create's box, never handed to libibverbs.
                    let _ = unsafe { destroy("ibv_cmd_destroy_qp", qp, cmd, || {}) };
                    Err(e)
                }
            },
        )
    })
}

pub(crate) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    catch(PANIC_ERRNO, || {
        let mut cmd: ibv_modify_qp = zeroed();
        // SAFETY: as libibverbs passed them.
        let ret = unsafe { ibv_cmd_modify_qp(qp, attr, mask, &mut cmd, size_of_val(&cmd)) };
        if ret == 0 && mask & IBV_QP_STATE as c_int != 0 {
            // SAFETY: attr is valid when the mask names the state.
            let state = unsafe { (*attr).qp_state };
            // SAFETY: qp came from create_qp.
            let key = unsafe { qp_key(qp) };
            process::with(|sh, now| {
                match state {
                    IBV_QPS_SQD => {
                        // urdma.ko tells urdmad nothing of this close: the provider does
                        // it. urdmad's EVENT CONNECTED is in the socket by the time the
                        // application can have seen the connection (docs/connection.md,
                        // "Ordering"), so a connection not yet read is read first.
                        if !sh.engine.is_connected(key) {
                            sh.pump(now);
                        }
                        // urdma.ko ended a connected QP's connection for iw_cm at this move.
                        sh.engine.kernel_ended(key);
                        sh.engine.close(key)
                    }
                    IBV_QPS_ERR => sh.engine.abort(key, now),
                    _ => return,
                }
                sh.engine.progress(now);
            });
        }
        status("modify_qp", Error::kernel("ibv_cmd_modify_qp", ret))
    })
}

/// Moves `qp` to SQD in the kernel, as `rdma_disconnect` does: urdma.ko ends a connected
/// QP's connection for iw_cm at its owner's move (docs/connection.md, "Close"). Whether the
/// kernel took it. The caller holds the process lock and found `qp` in
/// [`process::Shared::handles`], so `destroy_qp` has not begun.
pub(crate) fn end_connection(qp: *mut ibv_qp) -> bool {
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = IBV_QPS_SQD;
    let mut cmd: ibv_modify_qp = zeroed();
    // SAFETY: per the contract, a live QP of ours; attr and cmd are sized as passed.
    let ret = unsafe {
        ibv_cmd_modify_qp(
            qp,
            &mut attr,
            IBV_QP_STATE as c_int,
            &mut cmd,
            size_of_val(&cmd),
        )
    };
    if ret != 0 {
        log::error(format_args!(
            "ending a connection for the kernel: errno {ret}"
        ));
    }
    ret == 0
}

pub(crate) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    catch(PANIC_ERRNO, || {
        let mut cmd: ibv_query_qp = zeroed();
        // SAFETY: as libibverbs passed them.
        let ret =
            unsafe { ibv_cmd_query_qp(qp, attr, mask, init_attr, &mut cmd, size_of_val(&cmd)) };
        // The kernel learns of a connection's failure only when rdma_cm does; the data path
        // knows it at once (a Terminate, a peer gone silent).
        // SAFETY: qp came from create_qp.
        let key = unsafe { qp_key(qp) };
        if ret == 0 && process::with_engine(|e| e.qp_in_error(key)) {
            // SAFETY: attr is the caller's, filled by the kernel above.
            unsafe {
                (*attr).qp_state = IBV_QPS_ERR;
                (*attr).cur_qp_state = IBV_QPS_ERR;
            }
        }
        status("query_qp", Error::kernel("ibv_cmd_query_qp", ret))
    })
}

pub(crate) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    catch(PANIC_ERRNO, || {
        // Before the kernel hears of it: urdmad then aborts the connection.
        // SAFETY: qp came from create_qp.
        let key = unsafe { qp_key(qp) };
        process::with(|sh, now| {
            // From here its handle may name another QP once the kernel lets it go.
            sh.handles.remove(&key);
            sh.engine.send_held_ack(key, now)
        });
        // SAFETY: qp came from create_qp.
        let cmd = || unsafe { ibv_cmd_destroy_qp(qp) };
        let forget = || {
            if let Some(told) = process::with_engine(|e| e.destroy_qp(key)) {
                process::unregister_qp(key, told);
            }
            // SAFETY: qp came from create_qp; its batch, if any, is no
            // longer used (the application is done with the QP).
            unsafe { crate::qp_ex::free_batch(qp.cast::<UrdmaQp>()) };
        };
        // SAFETY: qp came from create_qp, a box of UrdmaQp at offset 0;
        // libibverbs does not use it after a successful destroy.
        status("destroy_qp", unsafe {
            destroy("ibv_cmd_destroy_qp", qp.cast::<UrdmaQp>(), cmd, forget)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fw_version_rendering() {
        assert_eq!(fw_ver_string(0), "0.0.0");
        assert_eq!(fw_ver_string((1 << 32) | (2 << 16) | 3), "1.2.3");
        assert_eq!(fw_ver_string(u64::MAX), "4294967295.65535.65535");
    }

    #[test]
    fn c_string_is_truncated_and_terminated() {
        let mut dst = [1 as std::ffi::c_char; 4];
        write_c_string(&mut dst, "abcdef");
        assert_eq!(dst, [b'a' as _, b'b' as _, b'c' as _, 0]);
        let mut dst = [1 as std::ffi::c_char; 8];
        write_c_string(&mut dst, "ab");
        assert_eq!(&dst[..3], &[b'a' as _, b'b' as _, 0]);
    }
}
