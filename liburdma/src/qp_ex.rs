//! The extended QP: `ibv_create_qp_ex` and the `ibv_wr_*` interface.
//!
//! Between `ibv_wr_start` and `ibv_wr_complete` the requests are built in
//! the QP's [`Batch`] (inline data copied at once, so its buffers are the
//! application's again when the call returns); `ibv_wr_complete` posts
//! them as one `ibv_post_send` list would, or none when one was built
//! wrong or the send queue has no room for them all. The batch is held
//! from start to complete or abort, so two threads building on one QP wait
//! for each other, as they do with hardware providers.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use rdma_core_sys::*;
use trp::{AtomicOp, PostError, SendOp, Sge};

use crate::control_verbs::{create_qp, qp_key, UrdmaQp, PANIC_ERRNO};
use crate::engine::{SendReq, Work};
use crate::error::{object, status, Error};
use crate::guard::catch;
use crate::mw::bind_of;
use crate::process;

/// The operations a QP made here may be built with: all but iWARP's
/// missing Send with Immediate and what urdma has not (TSO, flush, atomic
/// write).
const SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_SEND_WITH_INV) as u64;

/// Most SGEs or inline buffers one request takes (the device's max_sge).
const MAX_PARTS: usize = 8;

/// One request being built.
struct Pending {
    wr_id: u64,
    signaled: bool,
    op: Work,
    sges: Vec<Sge>,
    /// Its inline data, copied.
    inline: Option<Vec<u8>>,
}

/// The requests of one `ibv_wr_start` … `ibv_wr_complete`.
#[derive(Default)]
pub struct Batch {
    held: AtomicBool,
    reqs: Vec<Pending>,
    /// The first error a builder met: `ibv_wr_complete` returns it.
    err: Option<Error>,
}

impl Batch {
    fn fail(&mut self, e: Error) {
        self.err.get_or_insert(e);
    }

    /// The request the `ibv_wr_set_*` calls complete.
    fn last(&mut self) -> Option<&mut Pending> {
        if self.reqs.last().is_none() {
            self.fail(Error::Invalid("an ibv_wr_set_* call before any request"));
        }
        self.reqs.last_mut()
    }
}

/// Frees the QP's batch, if it has one.
///
/// # Safety
/// `qp` is a live QP of [`create_qp`]'s that nothing builds on any more.
pub(crate) unsafe fn free_batch(qp: *mut UrdmaQp) {
    // SAFETY: per the contract.
    let b = unsafe { std::mem::replace(&mut (*qp).batch, std::ptr::null_mut()) };
    if !b.is_null() {
        // SAFETY: the box made in create_qp_ex, used by nothing now.
        drop(unsafe { Box::from_raw(b) });
    }
}

/// Where libibverbs looks for `VERBS_QP_EX` in a `verbs_qp`: just after
/// its `ibv_qp_ex`, which grew (rdma-core 44 ends it at `wr_atomic_write`,
/// later ones add `wr_flush`) without a new provider ABI. So the loaded
/// libibverbs is asked: `ibv_qp_to_qp_ex` of a probe with the flag at each
/// candidate offset.
fn comp_mask_offset() -> Option<usize> {
    static OFFSET: OnceLock<Option<usize>> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        let newest = std::mem::offset_of!(verbs_qp, comp_mask);
        let without_flush = newest - std::mem::size_of::<usize>();
        [newest, without_flush].into_iter().find(|&off| {
            let mut probe = [0u64; 64];
            let base = probe.as_mut_ptr().cast::<u8>();
            // SAFETY: off + 4 lies inside the probe (verbs_qp is smaller).
            unsafe { base.add(off).cast::<u32>().write_unaligned(VERBS_QP_EX) };
            // SAFETY: the probe is as large as a verbs_qp and zeroed but for
            // the flag; ibv_qp_to_qp_ex reads its comp_mask only.
            !unsafe { ibv_qp_to_qp_ex(base.cast()) }.is_null()
        })
    })
}

/// `ibv_create_qp_ex`: a QP as `ibv_create_qp` makes it, in a PD, with the
/// `ibv_wr_*` interface when send operations are asked for. Other
/// attributes (XRC, TSO, RSS, creation flags) are refused with EOPNOTSUPP.
pub(crate) unsafe extern "C" fn create_qp_ex(
    _ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    catch(std::ptr::null_mut(), || {
        let fail = |e| object("create_qp_ex", Err(e));
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let no_flags = a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS == 0 || a.create_flags == 0;
        if a.comp_mask & !(known | IBV_QP_INIT_ATTR_CREATE_FLAGS) != 0 || !no_flags {
            return fail(Error::Unsupported(
                "create_qp_ex with XRC, TSO, RSS or creation flags",
            ));
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return fail(Error::Invalid("create_qp_ex without a PD"));
        }
        let ops = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
        if ops && a.send_ops_flags & !SEND_OPS != 0 {
            return fail(Error::Unsupported("a send operation iWARP has not"));
        }
        let Some(offset) = comp_mask_offset().filter(|_| ops) else {
            return match ops {
                true => fail(Error::Unsupported(
                    "ibv_wr_* with a libibverbs of another ibv_qp_ex layout",
                )),
                false => plain(a),
            };
        };
        let qp = plain(a);
        if qp.is_null() {
            return qp;
        }
        let q = qp.cast::<UrdmaQp>();
        // SAFETY: a live QP of create_qp's, not yet the application's; the
        // flag goes where the loaded libibverbs reads it (comp_mask_offset).
        unsafe {
            (*q).batch = Box::into_raw(Box::default());
            let vqp = &raw mut (*q).vqp;
            let mask = vqp.cast::<u8>().add(offset).cast::<u32>();
            mask.write_unaligned(mask.read_unaligned() | VERBS_QP_EX);
            install(&mut (*vqp).__bindgen_anon_1.qp_ex);
        }
        qp
    })
}

/// The QP of the attributes' `ibv_qp_init_attr` part, its granted caps
/// written back.
fn plain(a: &mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    let mut init = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: the caller's PD and a complete init attr.
    let qp = unsafe { create_qp(a.pd, &mut init) };
    a.cap = init.cap;
    qp
}

fn install(x: &mut ibv_qp_ex) {
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_send = Some(wr_send);
    x.wr_send_imm = Some(wr_send_imm);
    x.wr_send_inv = Some(wr_send_inv);
    x.wr_rdma_write = Some(wr_rdma_write);
    x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    x.wr_rdma_read = Some(wr_rdma_read);
    x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    x.wr_bind_mw = Some(wr_bind_mw);
    x.wr_local_inv = Some(wr_local_inv);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
}

/// The batch of `qp` with what the application set for the next request.
///
/// # Safety
/// `qp` is the `ibv_qp_ex` of a QP of [`create_qp_ex`]'s with a batch,
/// between `ibv_wr_start` and its end (the batch is held).
unsafe fn batch<'a>(qp: *mut ibv_qp_ex) -> (&'a mut Batch, u64, u32) {
    // SAFETY: per the contract: the ibv_qp_ex is at the start of UrdmaQp,
    // and the holder of the batch is its only user.
    unsafe {
        let q = qp.cast::<UrdmaQp>();
        (&mut *(*q).batch, (*qp).wr_id, (*qp).wr_flags)
    }
}

/// Starts a request of `op`.
///
/// # Safety
/// As for [`batch`].
unsafe fn push(qp: *mut ibv_qp_ex, op: Work) {
    // SAFETY: per the contract.
    let (b, wr_id, flags) = unsafe { batch(qp) };
    b.reqs.push(Pending {
        wr_id,
        signaled: flags & IBV_SEND_SIGNALED != 0,
        op,
        sges: Vec::new(),
        inline: None,
    });
}

/// # Safety
/// As for [`batch`].
unsafe fn solicited(qp: *mut ibv_qp_ex) -> bool {
    // SAFETY: per the contract.
    unsafe { (*qp).wr_flags & IBV_SEND_SOLICITED != 0 }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: libibverbs hands our QP; the batch lives as long as it.
    let b = unsafe { &*(*qp.cast::<UrdmaQp>()).batch };
    while b
        .held
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    // SAFETY: held now.
    let (b, _, _) = unsafe { batch(qp) };
    b.reqs.clear();
    b.err = None;
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: between wr_start and here.
    let (b, _, _) = unsafe { batch(qp) };
    b.reqs.clear();
    b.err = None;
    b.held.store(false, Ordering::Release);
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    catch(PANIC_ERRNO, || {
        // SAFETY: between wr_start and here.
        let (b, _, _) = unsafe { batch(qp) };
        let r = match b.err.take() {
            None => post_all(qp, &b.reqs),
            Some(e) => Err(e),
        };
        let ret = status("wr_complete", r);
        b.reqs.clear();
        b.held.store(false, Ordering::Release);
        ret
    })
}

/// Posts the batch's requests in order, then runs the QP's progress, as
/// `ibv_post_send` does; nothing when the send queue cannot take them all.
fn post_all(qp: *mut ibv_qp_ex, reqs: &[Pending]) -> Result<(), Error> {
    // SAFETY: our QP.
    let key = unsafe { qp_key(qp.cast()) };
    process::with(|sh, now| {
        if sh
            .engine
            .send_room(key)
            .is_some_and(|room| room < reqs.len())
        {
            return Err(Error::Post(PostError::QueueFull));
        }
        let mut ret = Ok(());
        for r in reqs {
            let parts = [r.inline.as_deref().unwrap_or_default()];
            let req = SendReq {
                wr_id: r.wr_id,
                op: r.op,
                sges: &r.sges,
                signaled: r.signaled,
                inline: r.inline.is_some().then_some(&parts[..]),
            };
            if let Err(e) = sh.post_send(key, &req, now) {
                ret = Err(e);
                break;
            }
        }
        sh.progress_after_post(key, now);
        ret
    })
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: libibverbs' contract for every builder: between start and end.
    unsafe {
        let solicited = solicited(qp);
        push(
            qp,
            Work::Wire(SendOp::Send {
                invalidate: None,
                solicited,
            }),
        )
    }
}

/// iWARP has no Send with Immediate Data.
unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, _imm: __be32) {
    // SAFETY: as for wr_send.
    unsafe { batch(qp) }
        .0
        .fail(Error::Unsupported("Send with Immediate Data"));
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: as for wr_send.
    unsafe {
        let solicited = solicited(qp);
        push(
            qp,
            Work::Wire(SendOp::Send {
                invalidate: Some(rkey),
                solicited,
            }),
        )
    }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: as for wr_send.
    unsafe { push(qp, Work::Wire(SendOp::RdmaWrite { remote_addr, rkey })) }
}

unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: __be32,
) {
    // SAFETY: as for wr_send.
    unsafe {
        let solicited = solicited(qp);
        push(
            qp,
            Work::Wire(SendOp::RdmaWriteImm {
                remote_addr,
                rkey,
                imm: u32::from_be(imm),
                solicited,
            }),
        )
    }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: as for wr_send.
    unsafe { push(qp, Work::Wire(SendOp::RdmaRead { remote_addr, rkey })) }
}

/// Starts an atomic on the 8 bytes at `remote_addr`.
///
/// # Safety
/// As for [`batch`].
unsafe fn push_atomic(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, op: AtomicOp) {
    let atomic = SendOp::Atomic {
        remote_addr,
        rkey,
        op,
    };
    // SAFETY: per the contract.
    unsafe { push(qp, Work::Wire(atomic)) }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = AtomicOp::compare_swap(compare, swap);
    // SAFETY: as for wr_send.
    unsafe { push_atomic(qp, rkey, remote_addr, op) }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // SAFETY: as for wr_send.
    unsafe { push_atomic(qp, rkey, remote_addr, AtomicOp::fetch_add(add)) }
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    if mw.is_null() || info.is_null() {
        // SAFETY: as for wr_send.
        unsafe { batch(qp) }
            .0
            .fail(Error::Invalid("a bind without a window or its description"));
        return;
    }
    // SAFETY: the application's window and bind description, its MR ours.
    let bind = unsafe { bind_of(mw, rkey, &*info) };
    // SAFETY: as for wr_send.
    unsafe { push(qp, Work::Bind(bind)) }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    // SAFETY: as for wr_send.
    unsafe { push(qp, Work::Invalidate(rkey)) }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, len: u32) {
    // SAFETY: as for wr_send.
    if let Some(r) = unsafe { batch(qp) }.0.last() {
        r.sges = vec![Sge { addr, len, lkey }];
    }
}

/// The application's list of `n` entries at `list`; None (the batch failed) when it is
/// longer than a request takes or missing.
///
/// # Safety
/// `list` points to `n` entries when it is not null.
unsafe fn parts<'a, T>(b: &mut Batch, n: usize, list: *const T) -> Option<&'a [T]> {
    if n > MAX_PARTS || (n > 0 && list.is_null()) {
        b.fail(Error::Invalid(
            "more SGEs than a request takes, or none where some were named",
        ));
        return None;
    }
    Some(match n {
        0 => &[],
        // SAFETY: per the contract.
        _ => unsafe { std::slice::from_raw_parts(list, n) },
    })
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // SAFETY: as for wr_send.
    let b = unsafe { batch(qp) }.0;
    // SAFETY: the application's list of n SGEs.
    let Some(list) = (unsafe { parts(b, n, list) }) else {
        return;
    };
    if let Some(r) = b.last() {
        r.sges = list
            .iter()
            .map(|s| Sge {
                addr: s.addr,
                len: s.length,
                lkey: s.lkey,
            })
            .collect();
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    let buf = ibv_data_buf { addr, length: len };
    // SAFETY: as for wr_send; one buffer.
    unsafe { wr_set_inline_data_list(qp, 1, &buf) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    // SAFETY: as for wr_send.
    let b = unsafe { batch(qp) }.0;
    // SAFETY: the application's list of n buffers.
    let Some(list) = (unsafe { parts(b, n, list) }) else {
        return;
    };
    let mut bytes = Vec::new();
    for d in list {
        if d.length > 0 && d.addr.is_null() {
            b.fail(Error::Invalid("inline data at a null address"));
            return;
        }
        if d.length > 0 {
            // SAFETY: the application's readable buffer, copied now.
            bytes.extend_from_slice(unsafe {
                std::slice::from_raw_parts(d.addr.cast::<u8>(), d.length)
            });
        }
    }
    if let Some(r) = b.last() {
        r.inline = Some(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zero::zeroed;

    #[test]
    fn the_loaded_libibverbs_finds_the_flag() {
        let off = comp_mask_offset().expect("ibv_qp_to_qp_ex accepts one of the offsets");
        assert!(off >= std::mem::size_of::<ibv_qp>());
    }

    /// A QP of ours as far as the builders go (no connection: nothing is
    /// posted), its batch held.
    fn qp() -> Box<UrdmaQp> {
        let mut q: Box<UrdmaQp> = Box::new(zeroed());
        q.batch = Box::into_raw(Box::default());
        // SAFETY: the union's ibv_qp_ex member, plain data.
        install(unsafe { &mut q.vqp.__bindgen_anon_1.qp_ex });
        q
    }

    fn x(q: &mut UrdmaQp) -> *mut ibv_qp_ex {
        (q as *mut UrdmaQp).cast()
    }

    #[test]
    fn builders_record_requests_with_their_ids_flags_and_data() {
        let mut q = qp();
        let x = x(&mut q);
        let data = *b"inline!";
        let sges = [
            ibv_sge {
                addr: 0x1000,
                length: 10,
                lkey: 7,
            },
            ibv_sge {
                addr: 0x2000,
                length: 20,
                lkey: 7,
            },
        ];
        // SAFETY: x is a QP with a batch; the builders run between start
        // and abort, their buffers live.
        unsafe {
            wr_start(x);
            (*x).wr_id = 1;
            (*x).wr_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
            wr_send(x);
            wr_set_inline_data(x, data.as_ptr() as *mut c_void, data.len());
            (*x).wr_id = 2;
            (*x).wr_flags = 0;
            wr_rdma_write_imm(x, 9, 0x3000, 5u32.to_be());
            wr_set_sge_list(x, 2, sges.as_ptr());
            (*x).wr_id = 3;
            wr_atomic_fetch_add(x, 9, 0x4000, 1);
            wr_set_sge(x, 7, 0x5000, 8);
            let (b, _, _) = batch(x);
            assert_eq!(b.err, None);
            let got: Vec<_> = b
                .reqs
                .iter()
                .map(|r| (r.wr_id, r.signaled, r.op, r.sges.len(), r.inline.clone()))
                .collect();
            assert_eq!(
                got,
                vec![
                    (
                        1,
                        true,
                        Work::Wire(SendOp::Send {
                            invalidate: None,
                            solicited: true
                        }),
                        0,
                        Some(data.to_vec())
                    ),
                    (
                        2,
                        false,
                        Work::Wire(SendOp::RdmaWriteImm {
                            remote_addr: 0x3000,
                            rkey: 9,
                            imm: 5,
                            solicited: false
                        }),
                        2,
                        None
                    ),
                    (
                        3,
                        false,
                        Work::Wire(SendOp::Atomic {
                            remote_addr: 0x4000,
                            rkey: 9,
                            op: AtomicOp::fetch_add(1)
                        }),
                        1,
                        None
                    ),
                ]
            );
            wr_abort(x);
            assert!(batch(x).0.reqs.is_empty());
            assert!(!batch(x).0.held.load(Ordering::Relaxed));
            free_batch(&mut *q);
        }
    }

    #[test]
    fn what_cannot_be_built_fails_the_whole_batch() {
        let mut q = qp();
        let x = x(&mut q);
        // SAFETY: as above. wr_complete returns before posting anything.
        unsafe {
            wr_start(x);
            wr_set_sge(x, 1, 2, 3); // no request yet
            wr_send(x);
            assert_eq!(wr_complete(x), libc::EINVAL);
            wr_start(x);
            wr_send_imm(x, 0);
            assert_eq!(wr_complete(x), libc::EOPNOTSUPP);
            wr_start(x);
            wr_send(x);
            wr_set_sge_list(x, MAX_PARTS + 1, [].as_ptr());
            assert_eq!(wr_complete(x), libc::EINVAL);
            free_batch(&mut *q);
        }
    }
}
