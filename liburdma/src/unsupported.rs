//! Data-path verbs that urdma does not implement yet. Each fails with
//! EOPNOTSUPP in the form its caller checks for.

use std::ffi::c_int;

use rdma_core_sys::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_srq, ibv_wc};

use crate::guard::catch;

/// `ibv_poll_cq` reports errors as a negative return; a positive one
/// would be a count of completions.
pub(crate) unsafe extern "C" fn poll_cq(_cq: *mut ibv_cq, _n: c_int, _wc: *mut ibv_wc) -> c_int {
    -libc::EOPNOTSUPP
}

pub(crate) unsafe extern "C" fn req_notify_cq(_cq: *mut ibv_cq, _solicited: c_int) -> c_int {
    libc::EOPNOTSUPP
}

/// Post verbs return an errno and point `bad_wr` at the first request
/// that was not posted: here, the first one.
pub(crate) unsafe extern "C" fn post_send(
    _qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: libibverbs passes the caller's list and out-pointer.
    unsafe { refuse_post(wr, bad_wr) }
}

pub(crate) unsafe extern "C" fn post_recv(
    _qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: libibverbs passes the caller's list and out-pointer.
    unsafe { refuse_post(wr, bad_wr) }
}

pub(crate) unsafe extern "C" fn post_srq_recv(
    _srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: libibverbs passes the caller's list and out-pointer.
    unsafe { refuse_post(wr, bad_wr) }
}

/// The body of every post verb. It catches panics itself, so the entry
/// points above, which only call it, unwind nothing into the caller.
///
/// # Safety
/// `bad_wr` is null or valid for a write.
unsafe fn refuse_post<W>(wr: *mut W, bad_wr: *mut *mut W) -> c_int {
    catch(libc::EOPNOTSUPP, || {
        if !bad_wr.is_null() {
            // SAFETY: the caller vouches for `bad_wr`.
            unsafe { *bad_wr = wr };
        }
        libc::EOPNOTSUPP
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_points_bad_wr_at_the_first_request() {
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        let ret = unsafe { post_send(std::ptr::null_mut(), &mut wr, &mut bad) };
        assert_eq!(ret, libc::EOPNOTSUPP);
        assert_eq!(bad, &raw mut wr);
    }

    #[test]
    fn poll_reports_a_negative_error() {
        assert_eq!(
            unsafe { poll_cq(std::ptr::null_mut(), 1, std::ptr::null_mut()) },
            -libc::EOPNOTSUPP
        );
    }
}
