//! The data-path verbs: `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`
//! and `ibv_req_notify_cq`, all in user space over the engine. Each call
//! also drives progress (receive, timers, transmit): `ibv_poll_cq` for every
//! connection, a post for its QP and, when a full round is due, for every one
//! (`Engine::progress_after_post`).

use std::ffi::c_int;

use rdma_core_sys::*;
use trp::{AtomicOp, Instant, SendOp, Sge};

use crate::control_verbs::{cq_key, qp_key, PANIC_ERRNO};
use crate::engine::{QpKey, SendReq, Work};
use crate::error::{status, Error};
use crate::guard::catch;
use crate::mw::bind_of;
use crate::process;

/// Most SGEs a request may carry (the device's max_sge).
const MAX_SGE: usize = 8;

/// The SGEs of a work request.
///
/// # Safety
/// `list` points to `n` SGEs when `n > 0`.
unsafe fn sges(list: *const ibv_sge, n: c_int, out: &mut [Sge; MAX_SGE]) -> Option<&[Sge]> {
    let n = usize::try_from(n).ok()?;
    if n > MAX_SGE {
        return None;
    }
    if n == 0 {
        return Some(&out[..0]);
    }
    // SAFETY: per the contract.
    let src = unsafe { std::slice::from_raw_parts(list, n) };
    for (o, s) in out.iter_mut().zip(src) {
        *o = Sge {
            addr: s.addr,
            len: s.length,
            lkey: s.lkey,
        };
    }
    Some(&out[..n])
}

/// What a send work request does; None for what iWARP has not (Send with
/// Immediate, ...).
///
/// # Safety
/// A bind request names a window and an MR (or none) of this provider.
pub unsafe fn work(wr: &ibv_send_wr) -> Option<Work> {
    let solicited = wr.send_flags & IBV_SEND_SOLICITED != 0;
    // SAFETY: reading the union members the opcode selects (all plain
    // integers, so any bit pattern is valid).
    let (rdma, atomic, imm, inv) = unsafe {
        (
            wr.wr.rdma,
            wr.wr.atomic,
            wr.__bindgen_anon_1.imm_data,
            wr.__bindgen_anon_1.invalidate_rkey,
        )
    };
    Some(Work::Wire(match wr.opcode {
        IBV_WR_SEND => SendOp::Send {
            invalidate: None,
            solicited,
        },
        IBV_WR_SEND_WITH_INV => SendOp::Send {
            invalidate: Some(inv),
            solicited,
        },
        IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: u32::from_be(imm),
            solicited,
        },
        IBV_WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::Atomic {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            op: AtomicOp::fetch_add(atomic.compare_add),
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::Atomic {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            op: AtomicOp::compare_swap(atomic.compare_add, atomic.swap),
        },
        IBV_WR_LOCAL_INV => return Some(Work::Invalidate(inv)),
        IBV_WR_BIND_MW => {
            // SAFETY: the union member the opcode selects.
            let b = unsafe { &wr.__bindgen_anon_2.bind_mw };
            if b.mw.is_null() {
                return None;
            }
            // SAFETY: per the contract.
            return Some(Work::Bind(unsafe { bind_of(b.mw, b.rkey, &b.bind_info) }));
        }
        _ => return None,
    }))
}

/// A work request of a list `ibv_post_send`, `ibv_post_recv` or `ibv_post_srq_recv` takes.
pub(crate) trait WorkRequest {
    fn next(&self) -> *mut Self;
    fn sg_list(&self) -> (*const ibv_sge, c_int);
}

impl WorkRequest for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn sg_list(&self) -> (*const ibv_sge, c_int) {
        (self.sg_list, self.num_sge)
    }
}

impl WorkRequest for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn sg_list(&self) -> (*const ibv_sge, c_int) {
        (self.sg_list, self.num_sge)
    }
}

/// Posts the list at `wr` on the QP or SRQ `key`, one request at a time through `post`
/// (given the request and its SGEs, under the engine lock), and stops at
/// the first one refused: that one goes to `*bad_wr` and its errno is the
/// result, as libibverbs says (`verb` names the call in the log). A request
/// with more SGEs than the device allows is refused. `done` runs once the
/// list is done (a QP's progress).
///
/// # Safety
/// `wr` is the caller's list and `bad_wr` null or its out-pointer.
pub(crate) unsafe fn post_list<W: WorkRequest, K: Copy>(
    verb: &'static str,
    key: K,
    wr: *mut W,
    bad_wr: *mut *mut W,
    mut post: impl FnMut(&mut process::Shared, K, &W, &[Sge], Instant) -> Result<(), Error>,
    done: impl FnOnce(&mut process::Shared, K, Instant),
) -> c_int {
    let fail = |at: *mut W, e: Result<(), Error>| {
        if !bad_wr.is_null() {
            // SAFETY: the caller's out-pointer.
            unsafe { *bad_wr = at };
        }
        status(verb, e)
    };
    // A panic is blamed on the list's first request.
    fail(wr, Ok(()));
    catch(PANIC_ERRNO, || {
        process::with(|sh, now| {
            let mut cur = wr;
            let mut ret = 0;
            while !cur.is_null() {
                // SAFETY: the caller's list of requests.
                let w = unsafe { &*cur };
                let mut buf = [Sge {
                    addr: 0,
                    len: 0,
                    lkey: 0,
                }; MAX_SGE];
                let (list, n) = w.sg_list();
                // SAFETY: the request's own list of n entries.
                let Some(list) = (unsafe { sges(list, n, &mut buf) }) else {
                    ret = fail(
                        cur,
                        Err(Error::Invalid("more SGEs than the device's max_sge")),
                    );
                    break;
                };
                if let Err(e) = post(sh, key, w, list, now) {
                    ret = fail(cur, Err(e));
                    break;
                }
                cur = w.next();
            }
            done(sh, key, now);
            ret
        })
    })
}

/// What a QP's posts are followed by: their progress.
fn after_post(sh: &mut process::Shared, key: QpKey, now: Instant) {
    sh.progress_after_post(key, now);
}

pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let post = |sh: &mut process::Shared, key, w: &ibv_send_wr, list: &[Sge], now| {
        // SAFETY: the application's request, naming its own objects.
        let op = unsafe { work(w) }.ok_or(Error::Invalid("an opcode iWARP has not"))?;
        let mut parts: [&[u8]; MAX_SGE] = [&[]; MAX_SGE];
        let inline = w.send_flags & IBV_SEND_INLINE != 0;
        if inline {
            for (p, s) in parts.iter_mut().zip(list) {
                // SAFETY: with IBV_SEND_INLINE the application hands
                // readable memory, copied before we return.
                *p = unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.len as usize)
                };
            }
        }
        let req = SendReq {
            wr_id: w.wr_id,
            op,
            sges: list,
            signaled: w.send_flags & IBV_SEND_SIGNALED != 0,
            inline: inline.then_some(&parts[..list.len()]),
        };
        sh.post_send(key, &req, now)
    };
    // SAFETY: libibverbs passes a QP of ours and its list of requests.
    unsafe { post_list("post_send", qp_key(qp), wr, bad_wr, post, after_post) }
}

pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let post = |sh: &mut process::Shared, key, w: &ibv_recv_wr, list: &[Sge], _| {
        sh.engine.post_recv(key, w.wr_id, list)
    };
    // SAFETY: libibverbs passes a QP of ours and its list of requests.
    unsafe { post_list("post_recv", qp_key(qp), wr, bad_wr, post, after_post) }
}

/// Negative errno on failure, as `ibv_poll_cq` callers expect.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    catch(-libc::EIO, || {
        let invalid = |why| -status("poll_cq", Err(Error::Invalid(why)));
        let Ok(n) = usize::try_from(n) else {
            return invalid("a negative number of entries");
        };
        if n == 0 {
            return 0;
        }
        if wc.is_null() {
            return invalid("no array for the completions");
        }
        // SAFETY: cq is ours.
        let key = unsafe { cq_key(cq) };
        // SAFETY: wc is non-null with room for n entries (the caller's).
        let out = unsafe { std::slice::from_raw_parts_mut(wc, n) };
        process::with(|sh, now| {
            sh.full_round(now);
            match sh.engine.poll_cq(key, out, now) {
                Some(k) => k as c_int,
                None => invalid("no such CQ"),
            }
        })
    })
}

pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    catch(libc::EIO, || {
        // SAFETY: cq is ours.
        let key = unsafe { cq_key(cq) };
        process::with(|sh, now| {
            // urdma.ko's bell fires a CQ's event when a frame that completes a receive is in
            // the ring, before any thread has pushed the completion. Pushed now, before the
            // arm, it fires no second event, and the CQ holds it when the caller polls, as
            // with a kernel stack, whichever CQ the caller polls first.
            sh.full_round(now);
            sh.app_going_to_sleep();
            let armed = match sh.engine.arm_cq(key, solicited_only != 0) {
                true => Ok(()),
                false => Err(Error::Invalid("no such CQ")),
            };
            status("req_notify_cq", armed)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(opcode: ibv_wr_opcode, flags: u32) -> ibv_send_wr {
        // SAFETY: all-zero is a valid ibv_send_wr.
        let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
        w.opcode = opcode;
        w.send_flags = flags;
        w
    }

    #[test]
    fn opcodes_map_to_trp_operations() {
        // SAFETY: none of these requests names a window or an MR.
        let op = |w: &ibv_send_wr| match unsafe { work(w) } {
            Some(Work::Wire(op)) => Some(op),
            _ => None,
        };
        let w = wr(IBV_WR_SEND, IBV_SEND_SOLICITED);
        assert_eq!(
            op(&w),
            Some(SendOp::Send {
                invalidate: None,
                solicited: true
            })
        );
        let mut w = wr(IBV_WR_SEND_WITH_INV, 0);
        w.__bindgen_anon_1.invalidate_rkey = 0x1234;
        assert_eq!(
            op(&w),
            Some(SendOp::Send {
                invalidate: Some(0x1234),
                solicited: false
            })
        );
        let mut w = wr(IBV_WR_RDMA_WRITE_WITH_IMM, 0);
        w.wr.rdma.remote_addr = 0x1000;
        w.wr.rdma.rkey = 77;
        w.__bindgen_anon_1.imm_data = u32::from_ne_bytes([1, 2, 3, 4]);
        assert_eq!(
            op(&w),
            Some(SendOp::RdmaWriteImm {
                remote_addr: 0x1000,
                rkey: 77,
                imm: 0x0102_0304,
                solicited: false
            })
        );
        let mut w = wr(IBV_WR_RDMA_READ, 0);
        w.wr.rdma.remote_addr = 8;
        w.wr.rdma.rkey = 9;
        assert_eq!(
            op(&w),
            Some(SendOp::RdmaRead {
                remote_addr: 8,
                rkey: 9
            })
        );
        assert_eq!(op(&wr(IBV_WR_SEND_WITH_IMM, 0)), None);
        let mut w = wr(IBV_WR_LOCAL_INV, 0);
        w.__bindgen_anon_1.invalidate_rkey = 0x4321;
        // SAFETY: no window or MR to read.
        assert_eq!(unsafe { work(&w) }, Some(Work::Invalidate(0x4321)));
        // SAFETY: as above: a bind without a window is refused unread.
        assert_eq!(unsafe { work(&wr(IBV_WR_BIND_MW, 0)) }, None);
    }

    #[test]
    fn sge_lists_are_bounded() {
        let list = [ibv_sge {
            addr: 1,
            length: 2,
            lkey: 3,
        }; 9];
        let mut out = [Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        }; MAX_SGE];
        // SAFETY: list has 9 entries, more than any count it is read with
        // (here and below); a NULL list is passed only with count 0.
        let got = unsafe { sges(list.as_ptr(), 2, &mut out) }.unwrap();
        assert_eq!(
            got,
            &[Sge {
                addr: 1,
                len: 2,
                lkey: 3
            }; 2]
        );
        // SAFETY: as above.
        assert!(unsafe { sges(list.as_ptr(), 9, &mut out) }.is_none());
        // SAFETY: as above.
        assert!(unsafe { sges(list.as_ptr(), -1, &mut out) }.is_none());
        assert_eq!(
            // SAFETY: as above.
            unsafe { sges(std::ptr::null(), 0, &mut out) }
                .unwrap()
                .len(),
            0
        );
    }
}
