//! The extended CQ (`ibv_create_cq_ex`): `ibv_start_poll`, `ibv_next_poll`,
//! `ibv_end_poll` and the `ibv_wc_read_*` accessors over the same user-space
//! CQ that `ibv_poll_cq` reads. Each poll takes one completion into the
//! CQ's `current` slot, which the accessors read until the next poll.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use rdma_core_sys::*;

use crate::control_verbs::{cq_key, create_cq, UrdmaCq};
use crate::error::{object, status, Error};
use crate::guard::catch;
use crate::process;

/// The completion fields urdma fills; the rest (timestamps, VLAN, flow
/// tag, tag matching) it has none of. SLID, SL and DLID path bits are IB's
/// and read 0, as on siw.
const WC_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    catch(std::ptr::null_mut(), || {
        // SAFETY: libibverbs passes the caller's attributes.
        let a = unsafe { &*attr };
        // A single-threaded CQ is a hint that needs nothing here; a CQ that
        // ignores overruns or lives in a parent domain is not urdma's.
        let flags_ok = a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS == 0
            || a.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED == 0;
        let mask_ok = a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS == 0;
        if a.wc_flags & !WC_FLAGS != 0 || !flags_ok || !mask_ok {
            let e = Error::Unsupported("a completion field, flag or attribute urdma has not");
            return object("create_cq_ex", Err(e));
        }
        let Ok(cqe) = c_int::try_from(a.cqe) else {
            return object(
                "create_cq_ex",
                Err(Error::Invalid("more CQ entries than an int")),
            );
        };
        // SAFETY: ctx is ours; the CQ is made as ibv_create_cq makes one.
        let cq = unsafe { create_cq(ctx, cqe, a.channel, a.comp_vector as c_int) };
        if cq.is_null() {
            return std::ptr::null_mut();
        }
        let ex = cq.cast::<ibv_cq_ex>();
        // SAFETY: cq is a fresh UrdmaCq, whose verbs_cq holds an ibv_cq_ex
        // that begins with the ibv_cq create_cq filled in.
        unsafe {
            let e = &mut *ex;
            e.start_poll = Some(start_poll);
            e.next_poll = Some(next_poll);
            e.end_poll = Some(end_poll);
            e.read_opcode = Some(read_opcode);
            e.read_vendor_err = Some(read_vendor_err);
            e.read_wc_flags = Some(read_wc_flags);
            e.read_byte_len = Some(read_byte_len);
            e.read_imm_data = Some(read_imm_data);
            e.read_qp_num = Some(read_qp_num);
            e.read_src_qp = Some(read_src_qp);
            e.read_slid = Some(read_zero_u32);
            e.read_sl = Some(read_zero_u8);
            e.read_dlid_path_bits = Some(read_zero_u8);
        }
        ex
    })
}

/// The slot of the completion being read.
///
/// # Safety
/// `cq` came from [`create_cq_ex`], and the caller is the thread that holds
/// the CQ's poll (`polling`), the only one to touch the slot.
unsafe fn current_slot<'a>(cq: *mut ibv_cq_ex) -> &'a mut ibv_wc {
    // SAFETY: per the contract: a UrdmaCq, its verbs_cq at offset 0.
    unsafe { &mut (*cq.cast::<UrdmaCq>()).current }
}

/// Whether a thread holds the CQ's poll.
///
/// # Safety
/// `cq` came from [`create_cq_ex`].
unsafe fn polling<'a>(cq: *mut ibv_cq_ex) -> &'a AtomicBool {
    // SAFETY: per the contract; an atomic is shared between threads.
    unsafe { &(*cq.cast::<UrdmaCq>()).polling }
}

/// Takes the next completion into `current`, after a round of progress if
/// `progress`; ENOENT when there is none.
///
/// # Safety
/// As for [`current_slot`].
unsafe fn take(cq: *mut ibv_cq_ex, progress: bool) -> c_int {
    // SAFETY: per the contract.
    let key = unsafe { cq_key(cq.cast()) };
    // SAFETY: per the contract.
    let slot = unsafe { current_slot(cq) };
    let n = process::with(|sh, now| {
        if progress {
            sh.full_round(now);
        }
        sh.engine.poll_cq(key, std::slice::from_mut(slot), now)
    });
    match n {
        Some(1) => {
            // SAFETY: per the contract.
            unsafe {
                (*cq).status = slot.status;
                (*cq).wr_id = slot.wr_id;
            }
            0
        }
        Some(_) => libc::ENOENT,
        None => status("ibv_next_poll", Err(Error::Invalid("no such CQ"))),
    }
}

/// Like a hardware provider's, a poll from `ibv_start_poll` to
/// `ibv_end_poll` holds the CQ: another thread's start waits for its end.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    catch(libc::EIO, || {
        // SAFETY: libibverbs passes the caller's attributes.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return status(
                "ibv_start_poll",
                Err(Error::Invalid("a poll attribute mask")),
            );
        }
        // SAFETY: libibverbs calls this on a CQ of create_cq_ex.
        let polling = unsafe { polling(cq) };
        while polling
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        // SAFETY: this thread holds the poll now.
        let ret = unsafe { take(cq, true) };
        if ret != 0 {
            // Nothing to read: no ibv_end_poll follows.
            polling.store(false, Ordering::Release);
        }
        ret
    })
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: called between the caller's start and end of a poll.
    catch(libc::EIO, || unsafe { take(cq, false) })
}

/// Each poll has already taken its completion off the CQ: only the CQ is
/// let go.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: libibverbs calls this on a CQ of create_cq_ex.
    unsafe { polling(cq) }.store(false, Ordering::Release);
}

/// The completion the last poll took.
///
/// # Safety
/// As for [`current_slot`].
unsafe fn current<'a>(cq: *mut ibv_cq_ex) -> &'a ibv_wc {
    // SAFETY: per the contract.
    unsafe { current_slot(cq) }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    // SAFETY: libibverbs calls the accessors on a CQ of create_cq_ex, between
    // a poll's start and end.
    unsafe { current(cq) }.opcode
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as for read_opcode.
    unsafe { current(cq) }.vendor_err
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as for read_opcode.
    unsafe { current(cq) }.wc_flags
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as for read_opcode.
    unsafe { current(cq) }.byte_len
}

unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: as for read_opcode; the union's members are both 32-bit
    // integers.
    unsafe { current(cq).__bindgen_anon_1.imm_data }
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as for read_opcode.
    unsafe { current(cq) }.qp_num
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: as for read_opcode.
    unsafe { current(cq) }.src_qp
}

unsafe extern "C" fn read_zero_u32(_cq: *mut ibv_cq_ex) -> u32 {
    0
}

unsafe extern "C" fn read_zero_u8(_cq: *mut ibv_cq_ex) -> u8 {
    0
}
