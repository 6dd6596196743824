//! Completion queues in user space: trp's completions as `ibv_wc`, the
//! queue `ibv_poll_cq` reads, and the arming behind completion channels.
//!
//! `ibv_req_notify_cq` arms the queue; the next completion that satisfies
//! the arm (any completion, or with `solicited_only` a solicited receive or
//! an error) disarms it and calls the queue's notify function, which asks
//! urdma.ko to signal the completion channel. Arming and pushing both run
//! under the engine lock, so a completion pushed right after an arm always
//! fires it: no wake-up is lost.
//!
//! The arm itself is a word urdma.ko shares ([`ArmWord`]): when a frame
//! reaches a QP of an armed queue, the kernel fires the channel at once and
//! disarms the queue (its bell, urdma-abi.h). Both sides disarm with one
//! swap and only the winner fires, so one event fires per arm.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_core_sys::*;
use trp::{Completion, WcOpcode, WcStatus};

use crate::abi::{
    urdma_cq_arm_URDMA_CQ_ARM_NEXT as URDMA_CQ_ARM_NEXT,
    urdma_cq_arm_URDMA_CQ_ARM_OFF as URDMA_CQ_ARM_OFF,
    urdma_cq_arm_URDMA_CQ_ARM_SOLICITED as URDMA_CQ_ARM_SOLICITED,
};

/// trp's status → `ibv_wc_status`.
pub fn wc_status(s: WcStatus) -> ibv_wc_status {
    match s {
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::RemoteAccess => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemoteOperation => IBV_WC_REM_OP_ERR,
        WcStatus::LocalLength => IBV_WC_LOC_LEN_ERR,
        WcStatus::LocalProtection => IBV_WC_LOC_PROT_ERR,
        WcStatus::RetryExceeded => IBV_WC_RETRY_EXC_ERR,
        WcStatus::Flush => IBV_WC_WR_FLUSH_ERR,
    }
}

pub fn wc_opcode(o: WcOpcode) -> ibv_wc_opcode {
    match o {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompareSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::BindMw => IBV_WC_BIND_MW,
        WcOpcode::LocalInv => IBV_WC_LOCAL_INV,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

/// A completion of QP `qp_num` as libibverbs reports it. Immediate data is
/// in network order (`imm_data` is `__be32`); an invalidated STag is in
/// host order. `src_qp` is 0: an iWARP connection does not learn the
/// peer's QP number.
pub fn to_wc(c: &Completion, qp_num: u32) -> ibv_wc {
    let mut wc = ibv_wc {
        wr_id: c.wr_id,
        status: wc_status(c.status),
        opcode: wc_opcode(c.opcode),
        vendor_err: 0,
        byte_len: c.byte_len,
        __bindgen_anon_1: ibv_wc__bindgen_ty_1 { imm_data: 0 },
        qp_num,
        src_qp: 0,
        wc_flags: 0,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    };
    if let Some(imm) = c.imm {
        wc.__bindgen_anon_1.imm_data = imm.to_be();
        wc.wc_flags |= IBV_WC_WITH_IMM;
    } else if let Some(stag) = c.invalidated {
        wc.__bindgen_anon_1.invalidated_rkey = stag;
        wc.wc_flags |= IBV_WC_WITH_INV;
    }
    wc
}

/// What an armed queue waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    Off,
    /// Any completion.
    Next,
    /// A solicited receive, or any completion in error.
    Solicited,
}

impl Arm {
    fn word(self) -> u32 {
        match self {
            Arm::Off => URDMA_CQ_ARM_OFF,
            Arm::Next => URDMA_CQ_ARM_NEXT,
            Arm::Solicited => URDMA_CQ_ARM_SOLICITED,
        }
    }

    fn of_word(w: u32) -> Arm {
        match w {
            URDMA_CQ_ARM_NEXT => Arm::Next,
            URDMA_CQ_ARM_SOLICITED => Arm::Solicited,
            _ => Arm::Off,
        }
    }
}

/// A queue's arm as urdma.ko sees it too (`enum urdma_cq_arm`): boxed, so
/// that it stays at the address the kernel pinned at `create_cq` for as
/// long as the queue lives.
#[derive(Debug, Default)]
pub struct ArmWord(Box<AtomicU32>);

impl ArmWord {
    /// Its address, for `create_cq`'s request.
    pub fn addr(&self) -> u64 {
        &*self.0 as *const AtomicU32 as u64
    }

    fn get(&self) -> Arm {
        Arm::of_word(self.0.load(Ordering::Acquire))
    }

    /// Disarms `from`; whether this call did (and so must fire).
    fn take(&self, from: Arm) -> bool {
        self.0
            .compare_exchange(
                from.word(),
                URDMA_CQ_ARM_OFF,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// As [`Cq::arm`] says; the kernel may disarm it meanwhile.
    fn arm(&self, solicited_only: bool) {
        let want = if solicited_only {
            Arm::Solicited
        } else {
            Arm::Next
        };
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (Arm::of_word(w) != Arm::Next).then_some(want.word())
            });
    }

    /// What the kernel's bell does to a queue armed for any completion.
    #[cfg(test)]
    pub fn ring(&self) -> bool {
        self.take(Arm::Next)
    }
}

/// Calls urdma.ko (or a test's counter) to signal the completion channel.
pub type Notify = Box<dyn FnMut() + Send>;

pub struct Cq {
    entries: VecDeque<ibv_wc>,
    cap: usize,
    arm: ArmWord,
    notify: Option<Notify>,
}

impl Cq {
    pub fn new(cap: usize, notify: Option<Notify>) -> Cq {
        Cq::with_arm(cap, notify, ArmWord::default())
    }

    /// A queue whose arm is `arm`, which the kernel may already know.
    pub fn with_arm(cap: usize, notify: Option<Notify>, arm: ArmWord) -> Cq {
        Cq {
            entries: VecDeque::with_capacity(cap.min(4096)),
            cap,
            arm,
            notify,
        }
    }

    /// Free entries.
    pub fn room(&self) -> usize {
        self.cap - self.entries.len()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn arm_state(&self) -> Arm {
        self.arm.get()
    }

    #[cfg(test)]
    pub fn arm_word(&self) -> &ArmWord {
        &self.arm
    }

    /// Whether the queue has a completion channel: its event can be armed.
    pub fn has_channel(&self) -> bool {
        self.notify.is_some()
    }

    /// `ibv_req_notify_cq`. Arming for any completion supersedes a
    /// solicited-only arm, never the other way round.
    pub fn arm(&mut self, solicited_only: bool) {
        self.arm.arm(solicited_only);
    }

    /// Adds a completion (the caller checked [`Cq::room`]); fires the arm
    /// it satisfies, unless the kernel fired it first. Returns whether it
    /// fired.
    pub fn push(&mut self, wc: ibv_wc, solicited: bool) -> bool {
        debug_assert!(self.room() > 0);
        let error = wc.status != IBV_WC_SUCCESS;
        self.entries.push_back(wc);
        let arm = self.arm.get();
        let wanted = match arm {
            Arm::Off => false,
            Arm::Next => true,
            Arm::Solicited => solicited || error,
        };
        let fire = wanted && self.arm.take(arm);
        if fire {
            if let Some(n) = self.notify.as_mut() {
                n();
            }
        }
        fire
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions out, oldest
    /// first.
    pub fn poll(&mut self, out: &mut [ibv_wc]) -> usize {
        let n = out.len().min(self.entries.len());
        for (o, wc) in out.iter_mut().zip(self.entries.drain(..n)) {
            *o = wc;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use trp::Queue;

    fn completion(status: WcStatus, opcode: WcOpcode) -> Completion {
        Completion {
            wr_id: 42,
            queue: Queue::Recv,
            status,
            opcode,
            byte_len: 100,
            imm: None,
            invalidated: None,
            solicited: false,
        }
    }

    #[test]
    fn completion_fields_map_as_libibverbs_expects() {
        let mut c = completion(WcStatus::Success, WcOpcode::RecvRdmaWithImm);
        c.imm = Some(0x0102_0304);
        let wc = to_wc(&c, 7);
        assert_eq!(wc.wr_id, 42);
        assert_eq!(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(wc.status, IBV_WC_SUCCESS);
        assert_eq!(wc.byte_len, 100);
        assert_eq!(wc.qp_num, 7);
        assert_eq!(wc.wc_flags, IBV_WC_WITH_IMM);
        // In memory, the immediate data is in wire (big-endian) order.
        // SAFETY: the union's members are all u32.
        let imm = unsafe { wc.__bindgen_anon_1.imm_data };
        assert_eq!(imm.to_ne_bytes(), [1, 2, 3, 4]);

        let mut c = completion(WcStatus::Success, WcOpcode::Recv);
        c.invalidated = Some(0xabcd_ef01);
        let wc = to_wc(&c, 7);
        assert_eq!(wc.wc_flags, IBV_WC_WITH_INV);
        // SAFETY: the union's members are all u32.
        assert_eq!(unsafe { wc.__bindgen_anon_1.invalidated_rkey }, 0xabcd_ef01);

        let wc = to_wc(&completion(WcStatus::Success, WcOpcode::Send), 1);
        assert_eq!(wc.wc_flags, 0);
        assert_eq!(wc.opcode, IBV_WC_SEND);
    }

    #[test]
    fn statuses_and_opcodes() {
        assert_eq!(wc_status(WcStatus::Flush), IBV_WC_WR_FLUSH_ERR);
        assert_eq!(wc_status(WcStatus::RetryExceeded), IBV_WC_RETRY_EXC_ERR);
        assert_eq!(wc_status(WcStatus::RemoteAccess), IBV_WC_REM_ACCESS_ERR);
        assert_eq!(wc_status(WcStatus::RemoteOperation), IBV_WC_REM_OP_ERR);
        assert_eq!(wc_status(WcStatus::LocalLength), IBV_WC_LOC_LEN_ERR);
        assert_eq!(wc_status(WcStatus::LocalProtection), IBV_WC_LOC_PROT_ERR);
        assert_eq!(wc_opcode(WcOpcode::RdmaRead), IBV_WC_RDMA_READ);
        assert_eq!(wc_opcode(WcOpcode::RdmaWrite), IBV_WC_RDMA_WRITE);
    }

    fn counter() -> (Arc<AtomicUsize>, Notify) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (
            n,
            Box::new(move || {
                m.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }

    #[test]
    fn arm_fires_once_for_the_next_completion() {
        let (n, f) = counter();
        let mut cq = Cq::new(4, Some(f));
        let wc = to_wc(&completion(WcStatus::Success, WcOpcode::Recv), 1);
        assert!(!cq.push(wc, false), "not armed");
        cq.arm(false);
        assert!(cq.push(wc, false));
        assert!(!cq.push(wc, false), "disarmed by the first");
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert_eq!(cq.room(), 1);
        let mut out = [wc; 8];
        assert_eq!(cq.poll(&mut out), 3);
        assert_eq!(cq.poll(&mut out), 0);
    }

    #[test]
    fn solicited_arm_waits_for_solicited_or_error() {
        let (n, f) = counter();
        let mut cq = Cq::new(8, Some(f));
        let ok = to_wc(&completion(WcStatus::Success, WcOpcode::Recv), 1);
        let err = to_wc(&completion(WcStatus::Flush, WcOpcode::Recv), 1);
        cq.arm(true);
        assert!(!cq.push(ok, false));
        assert!(cq.push(ok, true));
        cq.arm(true);
        assert!(cq.push(err, false));
        cq.arm(true);
        cq.arm(false);
        assert_eq!(cq.arm_state(), Arm::Next);
        cq.arm(true);
        assert_eq!(cq.arm_state(), Arm::Next);
        assert!(cq.push(ok, false));
        assert_eq!(n.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn the_kernel_and_the_provider_fire_one_event_per_arm() {
        let (n, f) = counter();
        let mut cq = Cq::new(8, Some(f));
        let wc = to_wc(&completion(WcStatus::Success, WcOpcode::Recv), 1);
        cq.arm(false);
        // A frame rang the bell first: the completion it brings fires nothing more.
        assert!(cq.arm_word().ring());
        assert!(!cq.push(wc, false));
        assert_eq!(n.load(Ordering::SeqCst), 0);
        // The provider first: the bell finds the queue disarmed.
        cq.arm(false);
        assert!(cq.push(wc, false));
        assert!(!cq.arm_word().ring());
        assert_eq!(n.load(Ordering::SeqCst), 1);
        // The kernel leaves a solicited-only arm to the provider.
        cq.arm(true);
        assert!(!cq.arm_word().ring());
        assert_eq!(cq.arm_state(), Arm::Solicited);
        assert!(cq.push(wc, true));
        assert_eq!(cq.arm_state(), Arm::Off);
    }

    /// An application thread that arms, polls once and then waits for the
    /// notification, against a producer pushing completions: every arm
    /// that found the queue empty is followed by a notification.
    #[test]
    fn no_lost_wakeup_under_stress() {
        const ROUNDS: usize = 20_000;
        let fired = Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
        let f2 = fired.clone();
        let notify: Notify = Box::new(move || {
            *f2.0.lock().unwrap() += 1;
            f2.1.notify_all();
        });
        let cq = Arc::new(Mutex::new(Cq::new(ROUNDS + 1, Some(notify))));
        let wc = to_wc(&completion(WcStatus::Success, WcOpcode::Recv), 1);
        let producer = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                for i in 0..ROUNDS {
                    cq.lock().unwrap().push(wc, false);
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut got = 0;
        let mut out = [wc; 16];
        while got < ROUNDS {
            let before = *fired.0.lock().unwrap();
            cq.lock().unwrap().arm(false);
            // Poll after arming, as applications do.
            let n = cq.lock().unwrap().poll(&mut out);
            got += n;
            if n > 0 || got == ROUNDS {
                continue;
            }
            // The queue was empty after arming: a notification must come.
            let (m, cv) = &*fired;
            let g = cv
                .wait_timeout_while(m.lock().unwrap(), std::time::Duration::from_secs(10), |c| {
                    *c == before
                })
                .unwrap();
            assert!(*g.0 > before, "wake-up lost after {got} completions");
        }
        producer.join().unwrap();
    }
}
