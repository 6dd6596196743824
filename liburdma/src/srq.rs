//! Shared receive queues. The receives live in the provider's engine
//! (`trp::Srq`), where every QP created on the queue takes them as its
//! messages start; urdma.ko keeps the object, its limits and the armed
//! limit, and raises `IBV_EVENT_SRQ_LIMIT_REACHED` when the provider finds
//! the queue below it ([`report_limits`]).

use std::ffi::c_int;

use rdma_core_sys::*;

use crate::abi::{urdma_ureq_modify_srq, URDMA_SRQ_REPORT_LIMIT};
use crate::control_verbs::{create, destroy, dev_of, PANIC_ERRNO};
use crate::data_verbs::post_list;
use crate::engine::SrqKey;
use crate::error::{object, status, Error};
use crate::guard::catch;
use crate::zero::{zeroed, Zeroable};
use crate::{log, process};
use trp::Sge;

#[repr(C)]
pub struct UrdmaSrq {
    pub ibsrq: ibv_srq,
    pub max_sge: u32,
}

// SAFETY: rdma-core's plain C struct (integers, raw pointers, opaque
// pthread byte arrays) and an integer: all-zero is valid.
unsafe impl Zeroable for UrdmaSrq {}

/// `modify_srq`'s command with urdma's private request after it.
#[repr(C)]
#[derive(Default)]
struct ModifySrqCmd {
    ibv: ibv_modify_srq,
    drv: urdma_ureq_modify_srq,
}

/// The engine's name of an SRQ.
pub(crate) fn srq_key(srq: *mut ibv_srq) -> SrqKey {
    srq as SrqKey
}

pub(crate) unsafe extern "C" fn create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    catch(std::ptr::null_mut(), || {
        let mut cmd: ibv_create_srq = zeroed();
        let mut resp: ib_uverbs_create_srq_resp = zeroed();
        // The kernel checks the limits and keeps the object.
        let made = create("ibv_cmd_create_srq", |srq: *mut UrdmaSrq| {
            // SAFETY: pd and attr are the caller's (libibverbs' contract);
            // srq is ours and starts with the ibv_srq.
            unsafe {
                ibv_cmd_create_srq(
                    pd,
                    srq.cast(),
                    attr,
                    &mut cmd,
                    size_of_val(&cmd),
                    &mut resp,
                    size_of_val(&resp),
                )
            }
        });
        object(
            "create_srq",
            made.map(|srq| {
                // SAFETY: attr now holds what the kernel granted; pd is valid.
                let (a, pdh, dev) = unsafe { ((*attr).attr, (*pd).handle, dev_of((*pd).context)) };
                // SAFETY: srq is the live box create returned.
                unsafe { (*srq).max_sge = a.max_sge };
                let key = srq_key(srq.cast());
                process::with_engine(|e| {
                    e.create_srq(key, dev, pdh, a.max_wr as usize);
                    if let Some(q) = e.srq(key) {
                        q.set_limit(a.srq_limit);
                    }
                });
                srq.cast::<ibv_srq>()
            }),
        )
    })
}

pub(crate) unsafe extern "C" fn modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    catch(PANIC_ERRNO, || {
        let mut cmd: ibv_modify_srq = zeroed();
        // The kernel checks the request first.
        // SAFETY: as libibverbs passed them.
        let ret = unsafe { ibv_cmd_modify_srq(srq, attr, mask, &mut cmd, size_of_val(&cmd)) };
        if ret == 0 && mask & IBV_SRQ_LIMIT as c_int != 0 {
            // SAFETY: attr is valid when the mask names the limit.
            let limit = unsafe { (*attr).srq_limit };
            process::with_engine(|e| e.srq(srq_key(srq)).map(|q| q.set_limit(limit)));
        }
        status("modify_srq", Error::kernel("ibv_cmd_modify_srq", ret))
    })
}

pub(crate) unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    catch(PANIC_ERRNO, || {
        let Some((max_wr, limit)) =
            process::with_engine(|e| e.srq(srq_key(srq)).map(|q| (q.max_wr(), q.limit())))
        else {
            return status("query_srq", Err(Error::Invalid("no such SRQ")));
        };
        // SAFETY: srq came from create_srq; attr is the caller's.
        unsafe {
            *attr = ibv_srq_attr {
                max_wr: max_wr as u32,
                max_sge: (*srq.cast::<UrdmaSrq>()).max_sge,
                srq_limit: limit,
            };
        }
        0
    })
}

pub(crate) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: srq came from create_srq. The kernel refuses (EBUSY)
        // while a QP is on it.
        let cmd = || unsafe { ibv_cmd_destroy_srq(srq) };
        let forget = || process::with_engine(|e| e.destroy_srq(srq_key(srq)));
        // SAFETY: srq came from create_srq, a box of UrdmaSrq at offset 0;
        // libibverbs does not use it after a successful destroy.
        status("destroy_srq", unsafe {
            destroy("ibv_cmd_destroy_srq", srq.cast::<UrdmaSrq>(), cmd, forget)
        })
    })
}

pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: libibverbs passes an SRQ of ours, a box of UrdmaSrq.
    let max_sge = unsafe { (*srq.cast::<UrdmaSrq>()).max_sge } as usize;
    let post = |sh: &mut process::Shared, key, w: &ibv_recv_wr, list: &[Sge], _| {
        if list.len() > max_sge {
            return Err(Error::Invalid("more SGEs than the SRQ's max_sge"));
        }
        sh.engine.post_srq_recv(key, w.wr_id, list)
    };
    // SAFETY: libibverbs' contract for ibv_post_srq_recv.
    unsafe {
        post_list(
            "post_srq_recv",
            srq_key(srq),
            wr,
            bad_wr,
            post,
            |_, _, _| {},
        )
    }
}

/// Asks urdma.ko to raise `IBV_EVENT_SRQ_LIMIT_REACHED` for each SRQ the
/// engine found below its armed limit (the kernel disarms it, as the
/// engine did). Called with the engine's lock held, so that no SRQ named
/// here is freed meanwhile.
pub(crate) fn report_limits(keys: Vec<SrqKey>) {
    for key in keys {
        let srq = key as *mut ibv_srq;
        let mut cmd = ModifySrqCmd {
            drv: urdma_ureq_modify_srq {
                flags: URDMA_SRQ_REPORT_LIMIT,
                reserved: 0,
            },
            ..Default::default()
        };
        let mut attr: ibv_srq_attr = zeroed();
        // SAFETY: key names a live SRQ of ours (the caller holds the lock
        // destroy_srq's forget needs); cmd is sized as passed and starts
        // with the generic command.
        let ret = unsafe { ibv_cmd_modify_srq(srq, &mut attr, 0, &mut cmd.ibv, size_of_val(&cmd)) };
        if ret != 0 {
            log::error(format_args!("SRQ limit event not raised: errno {ret}"));
        }
    }
}
