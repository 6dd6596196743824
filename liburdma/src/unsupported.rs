//! Data-path verbs that urdma does not implement (shared receive queues).
//! Each fails with EOPNOTSUPP in the form its caller checks for.

use std::ffi::c_int;

use rdma_core_sys::{ibv_recv_wr, ibv_srq};

use crate::guard::catch;

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
        // SAFETY: ibv_recv_wr is plain C data (integers, raw pointers).
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the verb reads nothing but the pointers it is given.
        let ret = unsafe { post_srq_recv(std::ptr::null_mut(), &mut wr, &mut bad) };
        assert_eq!(ret, libc::EOPNOTSUPP);
        assert_eq!(bad, &raw mut wr);
    }
}
