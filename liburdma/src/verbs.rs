//! The control verbs urdma implements, each a round trip to urdma.ko
//! through libibverbs' `ibv_cmd_*` helpers, which own the uverbs command
//! encoding. Objects are the libibverbs structs, boxed; failures follow
//! libibverbs: NULL plus errno for constructors, an errno return otherwise.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;

use rdma_core_sys::*;

use crate::abi::{CreateCqResp, CreateQpResp};
use crate::guard::{catch, set_errno};
use crate::log;

/// An all-zero command or response buffer: the form the `ibv_cmd_*`
/// helpers expect before they fill it.
fn zeroed<T>() -> T {
    // SAFETY: only used for the C command/response structs (plain data:
    // integers, arrays and unions thereof).
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// Constructor result: the object or NULL with errno set.
fn object<T>(r: Result<*mut T, c_int>) -> *mut T {
    r.unwrap_or_else(|e| {
        set_errno(e);
        std::ptr::null_mut()
    })
}

/// For verbs that return an errno: a panic becomes EIO.
const PANIC_ERRNO: c_int = libc::EIO;

#[repr(C)]
pub struct UrdmaCq {
    pub vcq: verbs_cq,
    /// urdma.ko's CQ id, the name the data path will use.
    pub id: u32,
}

#[repr(C)]
pub struct UrdmaQp {
    pub vqp: verbs_qp,
    /// urdma.ko's QP id.
    pub id: u32,
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
        let pd = Box::into_raw(Box::new(zeroed::<ibv_pd>()));
        let mut cmd: ibv_alloc_pd = zeroed();
        let mut resp: ib_uverbs_alloc_pd_resp = zeroed();
        // SAFETY: pd is ours; ctx as libibverbs passed it.
        let ret = unsafe {
            ibv_cmd_alloc_pd(
                ctx,
                pd,
                &mut cmd,
                size_of_val(&cmd),
                &mut resp,
                size_of_val(&resp),
            )
        };
        object(if ret == 0 {
            Ok(pd)
        } else {
            // SAFETY: the kernel did not take it; still only ours.
            drop(unsafe { Box::from_raw(pd) });
            Err(ret)
        })
    })
}

pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: pd came from alloc_pd.
        let ret = unsafe { ibv_cmd_dealloc_pd(pd) };
        if ret == 0 {
            drop(unsafe { Box::from_raw(pd) });
        }
        ret
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
        let vmr = Box::into_raw(Box::new(zeroed::<verbs_mr>()));
        let mut cmd: ibv_reg_mr = zeroed();
        let mut resp: ib_uverbs_reg_mr_resp = zeroed();
        // SAFETY: vmr is ours; the rest as libibverbs passed it.
        let ret = unsafe {
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
        };
        object(if ret == 0 {
            Ok(unsafe { &raw mut (*vmr).ibv_mr })
        } else {
            drop(unsafe { Box::from_raw(vmr) });
            Err(ret)
        })
    })
}

pub(crate) unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: vmr came from reg_mr.
        let ret = unsafe { ibv_cmd_dereg_mr(vmr) };
        if ret == 0 {
            drop(unsafe { Box::from_raw(vmr) });
        }
        ret
    })
}

pub(crate) unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    catch(std::ptr::null_mut(), || {
        let cq = Box::into_raw(Box::new(zeroed::<UrdmaCq>()));
        let ibcq = cq.cast::<ibv_cq>();
        let mut cmd: ibv_create_cq = zeroed();
        let mut resp = CreateCqResp::default();
        // SAFETY: cq is ours (verbs_cq starts with the ibv_cq).
        let ret = unsafe {
            ibv_cmd_create_cq(
                ctx,
                cqe,
                channel,
                comp_vector,
                ibcq,
                &mut cmd,
                size_of_val(&cmd),
                &mut resp.ibv,
                size_of_val(&resp),
            )
        };
        object(if ret == 0 {
            unsafe { (*cq).id = resp.drv.cq_id };
            log::debug(format_args!("cq {} ({cqe} entries)", resp.drv.cq_id));
            Ok(ibcq)
        } else {
            drop(unsafe { Box::from_raw(cq) });
            Err(ret)
        })
    })
}

pub(crate) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: cq came from create_cq.
        let ret = unsafe { ibv_cmd_destroy_cq(cq) };
        if ret == 0 {
            drop(unsafe { Box::from_raw(cq.cast::<UrdmaCq>()) });
        }
        ret
    })
}

pub(crate) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    catch(std::ptr::null_mut(), || {
        let qp = Box::into_raw(Box::new(zeroed::<UrdmaQp>()));
        let ibqp = qp.cast::<ibv_qp>();
        let mut cmd: ibv_create_qp = zeroed();
        let mut resp = CreateQpResp::default();
        // SAFETY: qp is ours (verbs_qp starts with the ibv_qp).
        let ret = unsafe {
            ibv_cmd_create_qp(
                pd,
                ibqp,
                attr,
                &mut cmd,
                size_of_val(&cmd),
                &mut resp.ibv,
                size_of_val(&resp),
            )
        };
        object(if ret == 0 {
            unsafe { (*qp).id = resp.drv.qp_id };
            log::debug(format_args!("qp {} (qpn {})", resp.drv.qp_id, resp.ibv.qpn));
            Ok(ibqp)
        } else {
            drop(unsafe { Box::from_raw(qp) });
            Err(ret)
        })
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
        unsafe { ibv_cmd_modify_qp(qp, attr, mask, &mut cmd, size_of_val(&cmd)) }
    })
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
        unsafe { ibv_cmd_query_qp(qp, attr, mask, init_attr, &mut cmd, size_of_val(&cmd)) }
    })
}

pub(crate) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: qp came from create_qp.
        let ret = unsafe { ibv_cmd_destroy_qp(qp) };
        if ret == 0 {
            drop(unsafe { Box::from_raw(qp.cast::<UrdmaQp>()) });
        }
        ret
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
