//! The progress engine: every QP, CQ and MR of the process, the trp
//! connection of each connected QP, and the moves between them.
//!
//! The engine is plain data driven by calls; it does no I/O of its own.
//! A QP's datagrams come and go through its [`Flow`] (DPDK rings in the
//! provider, in-memory queues in tests), time is an argument, and what
//! urdmad must hear about (a peer's FIN, the end of a connection) is
//! collected as [`Notice`]s. `process` keeps one engine behind one lock;
//! everything here runs under it, which is what makes a deregistration
//! unable to race a placement and an arm unable to miss a completion.

use std::collections::VecDeque;
use std::time::Duration;

use trp::mr::check;
use trp::{
    Access, Completion, Connection, Event, FailReason, Instant, LocalOp, PostError, Queue, RecvWr,
    SendOp, SendWr, Sge, Srq, WcOpcode, WcStatus,
};

use crate::cq::{to_wc, ArmWord, Cq, Notify};
use crate::error::Error;
use crate::int_hash::IntMap;
use crate::mem::{Bind, InlineBuf, MrTable, INLINE_STAG};
use crate::qp_table::QpTable;

/// (device id, QP number).
pub type QpKey = (u32, u32);
/// (device id, CQ id).
pub type CqKey = (u32, u32);
/// A shared receive queue: the address of the provider's object, unique while it lives.
pub type SrqKey = usize;

/// How one connected QP exchanges datagrams (UDP payloads).
pub trait Flow: Send {
    /// Takes up to one burst of received datagrams and hands them to
    /// `handle` (possibly in several calls); returns how many there were.
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize;
    /// Sends datagrams: calls `fill` with a buffer of at least `datagram`
    /// bytes until it returns None (or the flow runs out of buffers);
    /// returns how many were sent.
    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize;
    /// Whether the last `transmit` stopped for want of room on the way out
    /// (the process's TX ring full, or no buffer to send in) rather than because nothing
    /// was left: what is left waits in trp, and progress must come back soon.
    fn backlogged(&self) -> bool {
        false
    }
    /// Whether what arrives on the flow wakes the helper by itself (its own descriptor is in
    /// the helper's poll set), so that urdmad need not be asked to (`ARM`).
    fn wakes_itself(&self) -> bool {
        false
    }
    /// Whether a frame of the flow that fires no completion event wakes nobody while an
    /// application thread is in a call that reads every socket (urdma.ko's hush,
    /// [`urdma_shared::bell::Hush`]).
    fn hushed(&self) -> bool {
        false
    }
    /// The process was forked and this is the child's copy of a flow that stays the
    /// parent's: let go of nothing the parent still uses (the rings' buffers are shared),
    /// so that dropping the flow afterwards frees only the child's own copies.
    fn forked(&mut self) {}
    /// Where the QP's figures go for urdmad to read ([`urdma_shared::qpstats`]), if
    /// urdmad gave the connection a slot.
    fn figures(&self) -> Option<&urdma_shared::qpstats::Slot> {
        None
    }
    /// The flow's word of urdma.ko's bell ([`urdma_shared::bell`]), if its frames ring it.
    fn bell(&mut self) -> Option<&mut urdma_shared::bell::BellWord> {
        None
    }
    /// The PSN whose arrival completes a receive now (`Connection::bell_psn`), for a flow
    /// whose frames ring urdma.ko's bell.
    fn ring_for(&mut self, next: Option<u32>) {
        if let Some(b) = self.bell() {
            b.publish(next);
        }
    }
    /// Whether the QP's receive CQ has a completion channel, whose event a frame may fire
    /// (`urdma_shared::bell::EVENTS`): told once, before the first [`Flow::ring_for`].
    fn events(&mut self, yes: bool) {
        if let Some(b) = self.bell() {
            b.events(yes);
        }
    }
    /// Whether an ACK that carries nothing else can wait unread for whatever wakes the
    /// process next (`Connection::acks_can_wait`), for a flow whose frames ring urdma.ko's
    /// bell: told before each transmit, so that nothing that needs its ACK read at once
    /// leaves while the flow says otherwise.
    fn acks_can_wait(&mut self, yes: bool) {
        if let Some(b) = self.bell() {
            b.acks_can_wait(yes);
        }
    }
}

/// What a QP was created with.
#[derive(Clone, Copy, Debug)]
pub struct QpInit {
    pub pd: u32,
    pub send_cq: CqKey,
    pub recv_cq: CqKey,
    pub sig_all: bool,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
    /// The shared receive queue its receives come from.
    pub srq: Option<SrqKey>,
}

/// What urdmad must be told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// `PEERCLOSED`: the peer sent FIN.
    PeerClosed(QpKey),
    /// `QPCLOSED`: the connection ended (0 graceful, else -errno); the
    /// engine has stopped using the flow.
    Closed(QpKey, i32),
    /// `QPCLOSED` of a connection that urdma.ko had already ended for iw_cm, at its
    /// owner's move to SQD ([`Engine::kernel_ended`]): only urdmad's clean-up waits for it.
    Ended(QpKey, i32),
}

impl Notice {
    /// What tells urdmad that QP `key`'s connection ended with `status`; `kernel_ended`:
    /// urdma.ko ended it already ([`Engine::kernel_ended`]).
    fn end(key: QpKey, status: i32, kernel_ended: bool) -> Notice {
        if kernel_ended {
            Notice::Ended(key, status)
        } else {
            Notice::Closed(key, status)
        }
    }

    /// The `QPCLOSED` of the notices that say the connection ended.
    pub fn closed(&self) -> Option<(QpKey, i32)> {
        match *self {
            Notice::Closed(key, status) | Notice::Ended(key, status) => Some((key, status)),
            Notice::PeerClosed(_) => None,
        }
    }
}

/// What a send work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// An operation on the wire.
    Wire(SendOp),
    /// `IBV_WR_BIND_MW`, or `ibv_bind_mw`'s request.
    Bind(Bind),
    /// `IBV_WR_LOCAL_INV` of this STag.
    Invalidate(u32),
}

impl From<SendOp> for Work {
    fn from(op: SendOp) -> Work {
        Work::Wire(op)
    }
}

impl Work {
    /// What trp queues for it.
    fn send_op(&self) -> SendOp {
        match *self {
            Work::Wire(op) => op,
            Work::Bind(_) => SendOp::Local(LocalOp::BindWindow),
            Work::Invalidate(_) => SendOp::Local(LocalOp::Invalidate),
        }
    }
}

/// A send work request, converted from `ibv_send_wr`.
pub struct SendReq<'a> {
    pub wr_id: u64,
    pub op: Work,
    pub sges: &'a [Sge],
    /// `IBV_SEND_SIGNALED` (the QP's `sq_sig_all` is added here).
    pub signaled: bool,
    /// `IBV_SEND_INLINE`: the SGEs' bytes, to copy now (lkeys ignored).
    pub inline: Option<&'a [&'a [u8]]>,
}

pub fn fail_errno(r: FailReason) -> i32 {
    match r {
        FailReason::RetryExceeded => -libc::ETIMEDOUT,
        FailReason::TerminateSent(_) | FailReason::TerminateReceived(_) => -libc::ECONNRESET,
        FailReason::Aborted => -libc::ECONNABORTED,
        FailReason::PeerAborted => -libc::ECONNRESET,
    }
}

fn flush(wr_id: u64, queue: Queue, opcode: WcOpcode) -> Completion {
    Completion {
        wr_id,
        queue,
        status: WcStatus::Flush,
        opcode,
        byte_len: 0,
        imm: None,
        invalidated: None,
        solicited: false,
    }
}

struct Qp {
    init: QpInit,
    conn: Option<Connection>,
    flow: Option<Box<dyn Flow>>,
    /// The flow of a connection that ended, kept until urdmad has been told
    /// ([`Engine::release_closed_flow`]): dropping it unmaps its rings and gives its socket
    /// back, which need not come before `QPCLOSED` on the way to the application's
    /// `DISCONNECTED` (0.29 ms of `munmap` in the emulated bed).
    closed_flow: Option<Box<dyn Flow>>,
    /// Receives posted before the connection exists.
    early_recv: VecDeque<(u64, Vec<Sge>)>,
    inline: Option<InlineBuf>,
    /// In error without a connection (modify to ERR before connecting,
    /// or urdmad gone): posts complete at once with a flush error.
    errored: bool,
    /// Its connection failed (not closed gracefully).
    failed: bool,
    /// urdma.ko ended its connection for iw_cm ([`Engine::kernel_ended`]).
    kernel_ended: bool,
    /// Completions waiting for room in their CQ, in order.
    out: VecDeque<Completion>,
    /// Whether urdmad has heard how the connection ended.
    end: End,
    /// When the QP's figures may next go to urdmad's table ([`FIGURES_PERIOD`]); `None`:
    /// at the next round that changes them.
    figures_due: Option<Instant>,
    /// A round moved datagrams before `figures_due`: the next round after it copies them,
    /// so the table is never left behind by the end of a burst.
    figures_stale: bool,
    /// How long the application takes to answer what it reads.
    reply: ReplyTime,
    /// An ACK the peer asked for is held for the reply to what a round placed in memory (a
    /// Write): the application may be spinning on that memory, and its next call ends the
    /// wait ([`Engine::progress`]).
    awaits_reader: bool,
    /// urdmad's flow of the connection (`EVENT CONNECTED`'s `flow`).
    flow_id: u32,
}

/// What urdmad must hear of a destroyed QP ([`Engine::destroy_qp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unregister {
    /// Nothing: its connection ended and urdmad heard so (`QPCLOSED`, before anything the
    /// process says next), which ends urdmad's knowledge of the QP.
    Nothing,
    /// `UNQP`: urdmad may hold a connection or a handshake of the QP, which it aborts.
    Unqp,
    /// `UNQP` with `linger`, once the close is over: its connection had begun a graceful
    /// close, which goes on without the QP ([`Lingering`]) on its flow, which urdmad keeps
    /// until told ([`Engine::take_lingered`]). Told then, with the flow's `CLOSE`, urdmad
    /// is woken once for both; meanwhile it still counts the connection as the QP's, which
    /// a new QP cannot meet: urdma.ko numbers QPs cyclically in 24 bits, and a close lingers
    /// at most [`LINGER_LIMIT`].
    Linger,
}

/// How far a QP's connection has got towards `Notice::Closed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Not ended (or no connection yet).
    Open,
    /// Ended with `status`, its last datagrams not all gone yet (see [`FINAL_SEND_LIMIT`]);
    /// they are waited for until `until`.
    Draining { status: i32, until: Instant },
    /// `Notice::Closed` was issued, or there is nobody to tell (urdmad is gone).
    Told,
}

/// How long an ended connection keeps its flow for datagrams it still has to send: the ACK
/// of the peer's FIN, or the Abort that tells a peer we gave up. urdmad closes the flow as
/// soon as it hears `Notice::Closed`; were that sent while the process's TX ring was full,
/// the ACK would never leave, and the peer, retransmitting its FIN to a flow that is gone,
/// would give up (RetryExceeded) after trp's give-up time instead of closing. Bounded, so
/// that a TX path that stopped draining cannot hold the close back for good.
const FINAL_SEND_LIMIT: Duration = Duration::from_secs(2);

/// How often a QP's figures are copied to urdmad's table while datagrams flow: copying them
/// on every round would cost a ping-pong message 2 % more instructions (callgrind of
/// examples/pingpong_cost.rs), and urdmad reads them once a second. A timeout's round
/// copies them at once; a connection gone quiet does so at its next keep-alive; a QP
/// destroyed, on its way out.
const FIGURES_PERIOD: Duration = Duration::from_millis(1);

impl Qp {
    fn inline_region(&self) -> Option<trp::Region> {
        self.inline.as_ref().map(|b| b.region(self.init.pd))
    }
}

/// How the flows' frames reach the helper ([`Engine::flow_wakes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowWakes {
    /// A flow depends on urdmad to wake the helper when something arrives.
    pub needs_arm: bool,
    /// Every flow's frames wake nobody while an application thread is in a call that reads
    /// every socket ([`Flow::hushed`]).
    pub all_hushed: bool,
}

/// What one round of progress found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Datagrams moved or completions delivered.
    pub busy: bool,
    /// The earliest timer of any connection.
    pub deadline: Option<Instant>,
    /// Some flow's way out was full: what is left to send needs a round, since no
    /// descriptor says when the way is free again.
    pub backlogged: bool,
    /// Some QP's held ACK waits for the application's next call ([`Qp::awaits_reader`]).
    pub awaits_reader: bool,
}

#[derive(Default)]
pub struct Engine {
    pub mrs: MrTable,
    cqs: IntMap<CqKey, Cq>,
    /// Each with the device whose MRs its receives use.
    srqs: IntMap<SrqKey, (u32, Srq)>,
    /// SRQs that fell below their armed limit, for the kernel to report.
    srq_limits: Vec<SrqKey>,
    /// Ordered, so that [`Engine::progress`] can start each round elsewhere.
    qps: QpTable<Qp>,
    notices: Vec<Notice>,
    /// The QP the last round of progress started at.
    turn: Option<QpKey>,
    /// When the last round over every QP ended (as its caller says), and the posts since it
    /// began ([`Engine::progress_after_post`]).
    full_round_end: Instant,
    posts_since_full: usize,
    /// Some QP may have [`Qp::awaits_reader`] set.
    reader_waits: bool,
    /// Destroyed QPs finishing their close.
    lingering: Vec<Lingering>,
    /// The QPs and flows of lingering connections that finished, for urdmad to forget
    /// (`UNQP`) and close (`CLOSE`).
    lingered: Vec<(QpKey, u32)>,
    /// An MR table with nothing in it, for lingering connections.
    no_mrs: MrTable,
}

impl Engine {
    pub fn new() -> Engine {
        Engine::default()
    }

    pub fn create_cq(&mut self, key: CqKey, cap: usize, notify: Option<Notify>) {
        self.cqs.insert(key, Cq::new(cap, notify));
    }

    /// A CQ whose arm word urdma.ko knows ([`crate::cq::ArmWord`]).
    pub fn create_cq_with_arm(&mut self, key: CqKey, cap: usize, notify: Notify, arm: ArmWord) {
        self.cqs.insert(key, Cq::with_arm(cap, Some(notify), arm));
    }

    pub fn destroy_cq(&mut self, key: CqKey) {
        self.cqs.remove(&key);
    }

    pub fn cq(&self, key: CqKey) -> Option<&Cq> {
        self.cqs.get(&key)
    }

    pub fn create_srq(&mut self, key: SrqKey, dev: u32, pd: u32, max_wr: usize) {
        self.srqs.insert(key, (dev, Srq::new(pd, max_wr)));
    }

    pub fn destroy_srq(&mut self, key: SrqKey) {
        self.srqs.remove(&key);
        self.srq_limits.retain(|&k| k != key);
    }

    pub fn srq(&mut self, key: SrqKey) -> Option<&mut Srq> {
        self.srqs.get_mut(&key).map(|(_, q)| q)
    }

    /// The SRQs that fell below their armed limit since the last call.
    pub fn take_srq_limits(&mut self) -> Vec<SrqKey> {
        std::mem::take(&mut self.srq_limits)
    }

    pub fn create_qp(&mut self, key: QpKey, init: QpInit) {
        self.qps.insert(
            key,
            Qp {
                init,
                conn: None,
                flow: None,
                closed_flow: None,
                early_recv: VecDeque::new(),
                inline: None,
                errored: false,
                failed: false,
                kernel_ended: false,
                out: VecDeque::new(),
                end: End::Open,
                figures_due: None,
                figures_stale: false,
                reply: ReplyTime::default(),
                awaits_reader: false,
                flow_id: 0,
            },
        );
    }

    /// QP `key` is about to be destroyed: the ACK it holds for a reply that cannot come now
    /// leaves at once. Its connection ends with it, and urdmad's Abort acknowledges nothing,
    /// so the peer's last message, received here and not yet acknowledged, would fail there,
    /// as would an application's closing handshake (perftest's last Send). An abort of the
    /// provider's own ([`Engine::abort`]) needs none: its Abort carries the ACK
    /// (`trp::wire::trp::FLAG_ACKS`).
    pub fn send_held_ack(&mut self, key: QpKey, now: Instant) {
        if let Some(qp) = self.qps.get_mut(&key) {
            round::send_held_ack(&mut self.mrs, key, qp, now);
        }
    }

    /// Forgets the QP; completions it had not delivered yet are dropped, as the QP is gone.
    /// None: no such QP; otherwise what urdmad must be told.
    pub fn destroy_qp(&mut self, key: QpKey) -> Option<Unregister> {
        let mut qp = self.qps.remove(&key)?;
        self.mrs.unbind_qp(key.0, key.1);
        if let (Some(conn), Some(slot)) = (&qp.conn, qp.flow.as_ref().and_then(|f| f.figures())) {
            // The last word before urdmad closes the flow and adds them to the port's.
            slot.publish(&round::figures(conn));
        }
        if let Some(conn) = &qp.conn {
            // What the connection went through, for whoever asks with URDMA_LOG=info.
            crate::log::info(format_args!(
                "QP {}/{}: destroyed; srtt {:?} {:?} {:?}",
                key.0,
                key.1,
                conn.srtt(),
                conn.stats(),
                conn.sender_stats()
            ));
        }
        // Ended, its last datagrams still waiting: they go with the QP, and urdmad hears
        // how it ended now.
        if let End::Draining { status, .. } = qp.end {
            self.notices.push(Notice::end(key, status, qp.kernel_ended));
            return Some(Unregister::Nothing);
        }
        if qp.end == End::Told {
            return Some(Unregister::Nothing);
        }
        let closing = qp.conn.as_ref().map(|c| c.state()) == Some(trp::QpState::Closing);
        // Once this returns the application may free its buffers: a lingering connection
        // sends copies of what it still owes, and one that cannot (the peer is reading
        // the application's memory) goes as an open one does.
        let lingers = closing && qp.end == End::Open && qp.flow.is_some() && {
            let mem = self.mrs.view(key.0, Some(key.1), qp.inline_region(), None);
            qp.conn.as_mut().is_some_and(|c| c.release_memory(&mem))
        };
        if lingers {
            // urdmad hears nothing more of it by this key, which the kernel may give to a
            // new QP: it ends on its own.
            qp.end = End::Told;
            qp.out.clear();
            qp.awaits_reader = false;
            self.lingering.push(Lingering {
                key,
                qp,
                until: None,
            });
            return Some(Unregister::Linger);
        }
        Some(Unregister::Unqp)
    }

    /// Whether a connection's graceful close is still going on: a QP's (either side
    /// began it; trp ends it without the application), the last datagrams of one that
    /// ended, or a destroyed QP's ([`Lingering`]).
    pub fn closing(&self) -> bool {
        let ends = |q: &Qp| match q.end {
            End::Open => q.conn.as_ref().map(|c| c.state()) == Some(trp::QpState::Closing),
            End::Draining { .. } => true,
            End::Told => false,
        };
        !self.lingering.is_empty() || self.qps.values().any(|q| q.flow.is_some() && ends(q))
    }

    pub fn has_qp(&self, key: QpKey) -> bool {
        self.qps.contains_key(&key)
    }

    pub fn is_connected(&self, key: QpKey) -> bool {
        self.qps.get(&key).is_some_and(|q| q.conn.is_some())
    }

    pub fn qp_state(&self, key: QpKey) -> Option<trp::QpState> {
        self.qps.get(&key)?.conn.as_ref().map(|c| c.state())
    }

    /// Whether the QP is in error: its connection failed, or it was moved
    /// to error before it had one.
    pub fn qp_in_error(&self, key: QpKey) -> bool {
        self.qps.get(&key).is_some_and(|q| q.failed || q.errored)
    }

    /// One round over every QP: receive, timers, transmit, connection
    /// events, completions into their CQs.
    ///
    /// The QPs share their port's TX ring, and whoever goes first may fill
    /// it: each round starts one QP further on, so that under load none of
    /// them always finds the ring full (and its peer gives up on it).
    ///
    /// It is the application's: its call ends the waits of ACKs held for what earlier rounds
    /// placed in memory ([`Qp::awaits_reader`]); its reply, if it has one, comes within the
    /// hold from now (`trp::Connection::reader_saw`).
    pub fn progress(&mut self, now: Instant) -> Progress {
        self.end_reader_waits(now);
        self.round(now, Attended::App)
    }

    /// [`Engine::progress`] for the helper thread, while the application may be waiting on
    /// its memory for what the round places, to reply at once (a ping-pong of Writes): an
    /// ACK the peer asked for waits for that reply until the application's next call, a
    /// quarter of the RTO at most (`trp::Connection::hold_ack_for_reader`). Sent alone, it
    /// would end the peer's wait for its completion before the reply came, and the peer's
    /// helper would have to be scheduled to place the reply in turn, message after message.
    pub fn progress_for_app(&mut self, now: Instant) -> Progress {
        self.round(now, Attended::Helper)
    }

    /// [`Engine::progress`] for the helper thread, while the application is elsewhere: an
    /// ACK a peer asked for goes out at once instead of waiting for a reply
    /// (`trp::Config::ack_hold`), which the application is not there to post; holding it
    /// would only make the helper wake again when the hold ends.
    pub fn progress_unattended(&mut self, now: Instant) -> Progress {
        self.round(now, Attended::No)
    }

    /// The application made a call: each ACK held for what a round placed in memory waits
    /// the hold from now at most.
    fn end_reader_waits(&mut self, now: Instant) {
        if !std::mem::take(&mut self.reader_waits) {
            return;
        }
        for qp in self.qps.values_mut() {
            if std::mem::take(&mut qp.awaits_reader) {
                if let Some(conn) = qp.conn.as_mut() {
                    conn.reader_saw(now);
                }
            }
        }
    }

    fn round(&mut self, now: Instant, who: Attended) -> Progress {
        self.posts_since_full = 0;
        let mut p = Progress::default();
        // From the QP after the one the last round started at, or the first.
        let (from, before) = self.qps.rotated_after(self.turn);
        if let Some(&(first, _)) = from.first() {
            self.turn = Some(first);
        }
        let (mrs, cqs, notices) = (&mut self.mrs, &mut self.cqs, &mut self.notices);
        let (srqs, srq_limits) = (&mut self.srqs, &mut self.srq_limits);
        for (key, qp) in from.iter_mut().chain(before.iter_mut()) {
            let srqs = (&mut *srqs, &mut *srq_limits);
            progress_one(mrs, srqs, cqs, notices, *key, qp, now, who, &mut p);
        }
        self.reader_waits |= p.awaits_reader;
        if !self.lingering.is_empty() {
            self.linger(now, &mut p);
        }
        p
    }

    /// The round of a post on QP `key`; whether it was a round over every QP.
    ///
    /// A round over every QP on each post would cost a process with N connections N QPs'
    /// work per message (perftest posts one request per call to each of its QPs in turn).
    /// So a post takes its own QP only (its new requests transmitted, what has arrived for
    /// it taken, its completions delivered), and every QP once a full round is due: after
    /// as many posts as there are QPs, a cost per post that does not grow with them, or once
    /// `every` has passed since the last full round ended. The helper stays away while the
    /// application calls within `every` of its last call, so a QP the application does not
    /// post to still has its round within about twice that.
    pub fn progress_after_post(&mut self, key: QpKey, now: Instant, every: Duration) -> bool {
        self.posts_since_full += 1;
        self.end_reader_waits(now);
        if self.posts_since_full >= self.qps.len() || now >= self.full_round_end + every {
            self.progress(now);
            return true;
        }
        if let Some(qp) = self.qps.get_mut(&key) {
            let (mrs, cqs, notices) = (&mut self.mrs, &mut self.cqs, &mut self.notices);
            let srqs = (&mut self.srqs, &mut self.srq_limits);
            let p = &mut Progress::default();
            progress_one(mrs, srqs, cqs, notices, key, qp, now, Attended::App, p);
            self.reader_waits |= p.awaits_reader;
        }
        false
    }

    /// Records when the last round over every QP ended (the engine has no clock).
    pub fn full_round_ended(&mut self, at: Instant) {
        self.full_round_end = at;
    }

    /// How the flows' frames reach the helper, in one walk over the QPs (after every
    /// helper round).
    pub fn flow_wakes(&self) -> FlowWakes {
        let mut w = FlowWakes {
            needs_arm: false,
            all_hushed: true,
        };
        let lingering = self.lingering.iter().map(|l| &l.qp);
        for f in self
            .qps
            .values()
            .chain(lingering)
            .filter_map(|q| q.flow.as_ref())
        {
            w.needs_arm |= !f.wakes_itself();
            w.all_hushed &= f.hushed();
        }
        w
    }

    /// The earliest timer of any connection that still has its flow.
    pub fn deadline(&self) -> Option<Instant> {
        let lingering = self.lingering.iter().map(|l| &l.qp);
        let ends = self.lingering.iter().filter_map(|l| l.until);
        self.qps
            .values()
            .chain(lingering)
            .filter(|q| q.flow.is_some())
            .filter_map(|q| q.conn.as_ref()?.poll_timeout())
            .chain(ends)
            .min()
    }
}

mod connection;
mod linger;
mod reply;
mod round;
mod work;
use linger::Lingering;
pub use linger::LINGER_LIMIT;
use reply::ReplyTime;
#[cfg(test)]
use round::sends_first;
use round::{progress_one, Attended};

#[cfg(test)]
mod tests;
