//! An established connection: the RDMAP/DDP engine on top of TRP.
//!
//! Inputs: datagrams (`handle_datagram`), time (`handle_timeout`), work
//! requests (`post_send`, `post_recv`). Outputs: datagrams
//! (`poll_transmit`), completions (`poll_completion`), connection events
//! (`poll_event`) and the next deadline (`poll_timeout`). Payload is placed
//! straight into the caller's memory through [`Memory`] after the
//! protection checks; nothing is allocated per packet.

use crate::config::Config;
use crate::mr::{self, Access, Memory, Region};
use crate::reliability::{psn_lt, Arrival, Params, Receiver, Sender, SenderStats, Timeout};
use crate::state::{self, QpState, State, Transition};
use crate::time::Instant;
use crate::verbs::{Completion, PostError, Queue, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use crate::wire::ddp::{self, BufferRef};
use crate::wire::handshake;
use crate::wire::predict::{self, Datagram};
use crate::wire::rdmap::{
    self, qn, term, HeaderCopy, Immediate, Layer, Opcode, ReadRequest, Terminate,
};
use crate::wire::segment::{self, Body};
use crate::wire::trp::{self, SackRanges};
use crate::wire::WireError;
use std::collections::VecDeque;

/// Why a connection failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// The peer stopped acknowledging within the retry limit.
    RetryExceeded,
    /// We detected an error and sent this Terminate.
    TerminateSent(Terminate),
    /// The peer sent this Terminate.
    TerminateReceived(Terminate),
    /// The local user aborted.
    Aborted,
    /// The peer aborted.
    PeerAborted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The peer closed its side gracefully.
    PeerClosed,
    /// Both sides closed gracefully; outstanding receives were flushed.
    Closed,
    /// The connection failed; outstanding work was completed with errors.
    Failed(FailReason),
}

/// Counters for tests and statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub rx_packets: u64,
    pub rx_malformed: u64,
    pub rx_foreign: u64,
    pub rx_duplicates: u64,
    /// Out-of-order untagged segments dropped because their receive was
    /// not posted yet (the sender retransmits them).
    pub rx_deferred: u64,
    pub tx_acks: u64,
}

/// Where a segment's payload comes from when it is (re)built.
#[derive(Clone, Copy, Debug)]
enum Src {
    /// Bytes `off..off+len` of send queue entry `seq`'s scatter list.
    Sq {
        seq: u64,
        off: u32,
    },
    /// Local memory already checked when the Read Request arrived.
    Local {
        addr: u64,
    },
    ReadReq(ReadRequest),
    Imm(Immediate),
    /// The connection's one Terminate (kept in `Connection::term_body`).
    Term,
}

/// What occupies one of our PSNs; enough to rebuild the packet.
#[derive(Clone, Copy, Debug)]
enum TxKind {
    Accept,
    Fin,
    Seg {
        hdr: segment::Repr,
        src: Src,
        len: u32,
    },
}

#[derive(Debug)]
struct SqEntry {
    seq: u64,
    wr_id: u64,
    op: SendOp,
    sges: Vec<Sge>,
    signaled: bool,
    len: u32,
    off: u32,
    msn: u32,
    started: bool,
    write_done: bool,
    read_sge: usize,
    reads_total: usize,
    reads_done: usize,
    issued: bool,
    last_psn: u32,
}

impl SqEntry {
    /// Advances a Send by one segment, taking the next Send MSN from
    /// `next_msn` at its first: its header, its offset in the scatter list,
    /// its length.
    #[inline(always)]
    fn next_send_segment(
        &mut self,
        invalidate: Option<u32>,
        solicited: bool,
        next_msn: &mut u32,
        max_untagged: u32,
    ) -> (segment::Repr, u32, u32) {
        if !self.started {
            self.started = true;
            self.msn = *next_msn;
            *next_msn = self.msn.wrapping_add(1);
        }
        let off = self.off;
        let len = (self.len - off).min(max_untagged);
        let last = off + len == self.len;
        let opcode = match (invalidate.is_some(), solicited) {
            (false, false) => Opcode::Send,
            (true, false) => Opcode::SendInvalidate,
            (false, true) => Opcode::SendSe,
            (true, true) => Opcode::SendSeInvalidate,
        };
        let hdr = segment::Repr {
            opcode,
            last,
            buffer: BufferRef::Untagged {
                ulp_word: invalidate.unwrap_or(0),
                qn: qn::SEND,
                msn: self.msn,
                mo: off,
            },
        };
        self.off += len;
        self.issued = last;
        (hdr, off, len)
    }

    /// Advances an RDMA Write (or a Write with Immediate's Write part) by
    /// one segment: its header, its offset in the scatter list, its length.
    #[inline(always)]
    fn next_write_segment(
        &mut self,
        remote_addr: u64,
        rkey: u32,
        max_tagged: u32,
    ) -> (segment::Repr, u32, u32) {
        self.started = true;
        let off = self.off;
        let len = (self.len - off).min(max_tagged);
        let last = off + len == self.len;
        let hdr = segment::Repr {
            opcode: Opcode::RdmaWrite,
            last,
            buffer: BufferRef::Tagged {
                stag: rkey,
                to: remote_addr.wrapping_add(u64::from(off)),
            },
        };
        self.off += len;
        self.write_done = last;
        self.issued = last && matches!(self.op, SendOp::RdmaWrite { .. });
        (hdr, off, len)
    }
}

#[derive(Debug)]
struct RqEntry {
    wr_id: u64,
    sges: Vec<Sge>,
    len: u64,
}

#[derive(Debug)]
struct ReadJob {
    src_addr: u64,
    sink_stag: u32,
    sink_to: u64,
    size: u32,
    off: u32,
}

/// Effect of a received PSN that must happen in PSN order.
#[derive(Clone, Debug, Default)]
enum RxEvent {
    #[default]
    None,
    Recv {
        msn: u32,
        invalidate: Option<u32>,
        solicited: bool,
        len: u32,
        imm: Option<u32>,
    },
    ReadRequest {
        msn: u32,
        rr: ReadRequest,
    },
    ReadResponseDone,
    Terminate(Terminate),
    /// Boxed: rare, and it would triple the size of every slot.
    Fail {
        term: Box<Terminate>,
        rq_status: Option<WcStatus>,
    },
    Fin,
}

/// What the acceptor must repeat until its Accept is acknowledged.
#[derive(Debug)]
pub(crate) struct AcceptBody {
    pub private_data: Vec<u8>,
}

/// Parameters agreed in the handshake.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Negotiated {
    pub local_conn: u32,
    pub peer_conn: u32,
    pub snd_first: u32,
    pub rcv_first: u32,
    pub peer_window: u16,
    pub peer_ird: u16,
    pub peer_max_datagram: u16,
}

#[derive(Debug)]
pub struct Connection {
    cfg: Config,
    state: QpState,
    local_conn: u32,
    peer_conn: u32,
    datagram: usize,
    tx: Sender<TxKind>,
    rx: Receiver,
    rx_events: Vec<RxEvent>,
    accept: Option<AcceptBody>,
    accept_unsent: bool,
    handshake_psn: Option<u32>,
    sq: VecDeque<SqEntry>,
    sq_head_seq: u64,
    sq_next_seq: u64,
    sq_cursor: usize,
    rq: VecDeque<RqEntry>,
    rq_msn: u32,
    send_msn: [u32; 3],
    rr_msn: u32,
    reads_out: VecDeque<u64>,
    ord: usize,
    rjobs: VecDeque<ReadJob>,
    cq: VecDeque<Completion>,
    events: VecDeque<Event>,
    fin_psn: Option<u32>,
    peer_fin: bool,
    term_pending: Option<Terminate>,
    term_body: Option<Terminate>,
    term_psn: Option<u32>,
    abort_pending: bool,
    /// We failed or aborted: answer the peer's packets with Abort (as TCP
    /// answers a closed connection with RST) so a live peer learns of it.
    abort_on_contact: bool,
    /// Keep-alive while only Read Responses are awaited (nothing of ours is
    /// unacknowledged, so the retransmission timer is idle).
    probe_deadline: Option<Instant>,
    probes: u32,
    probe_pending: bool,
    stats: Stats,
}

fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
    }
}

/// Copies bytes `off..off+out.len()` of a scatter list out of memory.
#[inline(always)]
fn gather<M: Memory + ?Sized>(mem: &M, sges: &[Sge], mut off: u64, mut out: &mut [u8]) {
    // Most work requests have one SGE: no loop, one copy.
    if let [s] = sges {
        if off + out.len() as u64 <= u64::from(s.len) {
            mem.read(s.addr + off, out);
            return;
        }
    }
    for s in sges {
        if out.is_empty() {
            return;
        }
        let l = u64::from(s.len);
        if off >= l {
            off -= l;
            continue;
        }
        let n = ((l - off) as usize).min(out.len());
        let (head, tail) = out.split_at_mut(n);
        mem.read(s.addr + off, head);
        out = tail;
        off = 0;
    }
}

/// Writes `data` at offset `off` of a scatter list.
#[inline]
fn scatter<M: Memory + ?Sized>(mem: &mut M, sges: &[Sge], mut off: u64, mut data: &[u8]) {
    for s in sges {
        if data.is_empty() {
            return;
        }
        let l = u64::from(s.len);
        if off >= l {
            off -= l;
            continue;
        }
        let n = ((l - off) as usize).min(data.len());
        mem.write(s.addr + off, &data[..n]);
        data = &data[n..];
        off = 0;
    }
}

// Error paths are cold: keeping them out of line keeps the per-segment
// path short.
#[cold]
#[inline(never)]
fn terminate(
    layer: Layer,
    etype: u8,
    code: u8,
    segment: &[u8],
    rr: Option<ReadRequest>,
) -> Terminate {
    Terminate {
        layer,
        etype,
        code,
        ddp_header: HeaderCopy::from_segment(segment),
        rdmap_header: rr,
    }
}

/// The Terminate RFC 5040/5041 prescribe for a malformed segment.
#[cold]
#[inline(never)]
fn wire_error_term(e: WireError, segment: &[u8]) -> Terminate {
    let tagged = segment.first().is_some_and(|b| b & 0x80 != 0);
    let (layer, etype, code) = match e {
        WireError::DdpVersion(_) if tagged => {
            (Layer::Ddp, term::DDP_TAGGED, term::T_INVALID_DDP_VERSION)
        }
        WireError::DdpVersion(_) => (Layer::Ddp, term::DDP_UNTAGGED, term::U_INVALID_DDP_VERSION),
        WireError::RdmapVersion(_) => (
            Layer::Rdmap,
            term::RDMAP_REMOTE_OPERATION,
            term::INVALID_RDMAP_VERSION,
        ),
        WireError::QueueNumber { .. } => (Layer::Ddp, term::DDP_UNTAGGED, term::U_INVALID_QN),
        WireError::RdmapOpcode(_)
        | WireError::BufferModel { .. }
        | WireError::NotLast { .. }
        | WireError::BodyLen { .. } => (
            Layer::Rdmap,
            term::RDMAP_REMOTE_OPERATION,
            term::UNEXPECTED_OPCODE,
        ),
        _ => (
            Layer::Rdmap,
            term::RDMAP_REMOTE_OPERATION,
            term::UNSPECIFIED,
        ),
    };
    terminate(layer, etype, code, segment, None)
}

impl Connection {
    pub(crate) fn new(cfg: Config, n: Negotiated, accept: Option<AcceptBody>) -> Connection {
        let params = Params {
            initial_rto: cfg.initial_rto,
            min_rto: cfg.min_rto,
            max_rto: cfg.max_rto,
            max_retries: cfg.max_retries,
            initial_cwnd: cfg.initial_cwnd,
            max_cwnd: cfg.max_cwnd.max(1),
        };
        let rx = Receiver::new(n.rcv_first, cfg.recv_window, cfg.ack_delay);
        let datagram = usize::from(
            cfg.max_datagram
                .min(n.peer_max_datagram)
                .max(crate::config::MIN_DATAGRAM),
        );
        let handshake_psn = accept.as_ref().map(|_| n.snd_first);
        Connection {
            state: QpState::Rts,
            local_conn: n.local_conn,
            peer_conn: n.peer_conn,
            datagram,
            tx: Sender::new(params, n.snd_first, u32::from(n.peer_window)),
            rx_events: vec![RxEvent::None; rx.slots()],
            rx,
            accept_unsent: accept.is_some(),
            accept,
            handshake_psn,
            sq: VecDeque::new(),
            sq_head_seq: 0,
            sq_next_seq: 0,
            sq_cursor: 0,
            rq: VecDeque::new(),
            rq_msn: 1,
            send_msn: [1; 3],
            rr_msn: 1,
            reads_out: VecDeque::new(),
            ord: usize::from(cfg.ord.min(n.peer_ird)),
            rjobs: VecDeque::new(),
            cq: VecDeque::new(),
            events: VecDeque::new(),
            fin_psn: None,
            peer_fin: false,
            term_pending: None,
            term_body: None,
            term_psn: None,
            abort_pending: false,
            abort_on_contact: false,
            probe_deadline: None,
            probes: 0,
            probe_pending: false,
            stats: Stats::default(),
            cfg,
        }
    }

    pub fn state(&self) -> QpState {
        self.state
    }
    pub fn stats(&self) -> Stats {
        self.stats
    }
    pub fn sender_stats(&self) -> SenderStats {
        self.tx.stats
    }
    pub fn cwnd(&self) -> u32 {
        self.tx.cwnd()
    }
    pub fn srtt(&self) -> Option<core::time::Duration> {
        self.tx.srtt()
    }
    /// Size of the datagrams this connection sends; `poll_transmit` needs a
    /// buffer at least this long.
    pub fn max_datagram(&self) -> usize {
        self.datagram
    }
    pub fn local_conn(&self) -> u32 {
        self.local_conn
    }
    /// The next PSN we expect from the peer (our cumulative ACK).
    pub fn expected_psn(&self) -> u32 {
        self.rx.nxt()
    }
    /// The PSN our next new packet will carry.
    pub fn next_psn(&self) -> u32 {
        self.tx.nxt()
    }
    /// Our oldest unacknowledged PSN.
    pub fn unacked_psn(&self) -> u32 {
        self.tx.una()
    }
    /// Effective ORD (ours, limited by the peer's IRD).
    pub fn ord(&self) -> usize {
        self.ord
    }

    fn goto<F: Transition<T>, T: State>(&mut self) {
        debug_assert_eq!(self.state, F::STATE);
        self.state = T::STATE;
    }

    pub(crate) fn request_ack(&mut self) {
        self.rx.request_ack();
    }

    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.cq.pop_front()
    }
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest time `handle_timeout` has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.tx.rto_deadline(),
            self.rx.ack_deadline(),
            self.probe_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Arms or disarms the keep-alive that detects a peer gone silent while
    /// we wait for Read Responses.
    #[inline(always)]
    fn arm_probe(&mut self, now: Instant) {
        let waiting = matches!(self.state, QpState::Rts | QpState::Closing)
            && !self.reads_out.is_empty()
            && self.tx.outstanding() == 0;
        if !waiting {
            self.probe_deadline = None;
            self.probes = 0;
        } else if self.probe_deadline.is_none() {
            let backoff = self.tx.rto() * (1u32 << self.probes.min(16));
            self.probe_deadline = Some(now + backoff.min(self.cfg.max_rto));
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.rx.on_timeout(now);
        if self.probe_deadline.is_some_and(|d| d <= now) {
            self.probe_deadline = None;
            self.probes += 1;
            if self.probes > self.cfg.max_retries {
                self.fail(now, FailReason::RetryExceeded, None, None, true, None);
                return;
            }
            self.probe_pending = true;
            self.rx.request_ack();
            self.arm_probe(now);
        }
        if self.tx.on_timeout(now) == Timeout::RetryExceeded {
            match self.state {
                QpState::Rts | QpState::Closing => {
                    self.fail(now, FailReason::RetryExceeded, None, None, true, None)
                }
                QpState::Error => {
                    self.tx.clear();
                    self.sq.clear();
                    self.goto::<state::Error, state::Closed>();
                }
                QpState::Closed => {}
            }
        }
    }

    fn check_sges<M: Memory + ?Sized>(
        &self,
        mem: &M,
        sges: &[Sge],
        need: Access,
    ) -> Result<u32, PostError> {
        let mut total: u64 = 0;
        for s in sges {
            mr::check(mem, s.lkey, self.cfg.pd, s.addr, u64::from(s.len), need)
                .map_err(PostError::LocalProtection)?;
            total += u64::from(s.len);
        }
        if total > 1 << 31 {
            return Err(PostError::TooLong);
        }
        Ok(total as u32)
    }

    /// Queues a send work request. In Error/Closed it completes at once
    /// with `Flush`, as verbs specifies.
    pub fn post_send<M: Memory + ?Sized>(
        &mut self,
        mem: &M,
        wr: &SendWr<'_>,
    ) -> Result<(), PostError> {
        match self.state {
            QpState::Rts => {}
            QpState::Closing => return Err(PostError::State),
            QpState::Error | QpState::Closed => {
                self.cq.push_back(Completion {
                    wr_id: wr.wr_id,
                    queue: Queue::Send,
                    status: WcStatus::Flush,
                    opcode: wc_opcode(&wr.op),
                    byte_len: 0,
                    imm: None,
                    invalidated: None,
                    solicited: false,
                });
                return Ok(());
            }
        }
        if self.sq.len() >= self.cfg.max_send_wr {
            return Err(PostError::QueueFull);
        }
        let need = match wr.op {
            SendOp::RdmaRead { .. } => Access::LOCAL_WRITE,
            _ => Access::NONE,
        };
        let len = self.check_sges(mem, wr.sges, need)?;
        let seq = self.sq_next_seq;
        self.sq_next_seq += 1;
        self.sq.push_back(SqEntry {
            seq,
            wr_id: wr.wr_id,
            op: wr.op,
            sges: wr.sges.to_vec(),
            signaled: wr.signaled,
            len,
            off: 0,
            msn: 0,
            started: false,
            write_done: false,
            read_sge: 0,
            reads_total: wr.sges.len().max(1),
            reads_done: 0,
            issued: false,
            last_psn: 0,
        });
        Ok(())
    }

    pub fn post_recv<M: Memory + ?Sized>(
        &mut self,
        mem: &M,
        wr: &RecvWr<'_>,
    ) -> Result<(), PostError> {
        if matches!(self.state, QpState::Error | QpState::Closed) {
            self.cq.push_back(Completion {
                wr_id: wr.wr_id,
                queue: Queue::Recv,
                status: WcStatus::Flush,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: None,
                invalidated: None,
                solicited: false,
            });
            return Ok(());
        }
        if self.rq.len() >= self.cfg.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        let len = self.check_sges(mem, wr.sges, Access::LOCAL_WRITE)?;
        self.rq.push_back(RqEntry {
            wr_id: wr.wr_id,
            sges: wr.sges.to_vec(),
            len: u64::from(len),
        });
        Ok(())
    }

    /// Graceful close: outstanding work finishes, then FIN is exchanged.
    pub fn close(&mut self) {
        if self.state == QpState::Rts {
            self.goto::<state::Rts, state::Closing>();
        }
    }

    /// Abortive close: an Abort packet goes out, all work is flushed.
    pub fn abort(&mut self, now: Instant) {
        if matches!(self.state, QpState::Rts | QpState::Closing) {
            self.abort_pending = true;
            self.fail(now, FailReason::Aborted, None, None, false, None);
        }
    }

    #[inline]
    fn sq_entry(&self, seq: u64) -> Option<&SqEntry> {
        self.sq.get(seq.wrapping_sub(self.sq_head_seq) as usize)
    }

    #[inline]
    fn max_tagged(&self) -> u32 {
        (self.datagram - trp::HEADER_LEN - ddp::TAGGED_HEADER_LEN) as u32
    }
    #[inline]
    fn max_untagged(&self) -> u32 {
        (self.datagram - trp::HEADER_LEN - ddp::UNTAGGED_HEADER_LEN) as u32
    }

    /// Chooses what the next new PSN carries.
    #[inline]
    fn next_new(&mut self) -> Option<TxKind> {
        match self.state {
            QpState::Closed => return None,
            QpState::Error => {
                let t = self.term_pending.take()?;
                let msn = self.send_msn[2];
                self.send_msn[2] = msn.wrapping_add(1);
                let hdr = segment::Repr {
                    opcode: Opcode::Terminate,
                    last: true,
                    buffer: BufferRef::Untagged {
                        ulp_word: 0,
                        qn: qn::TERMINATE,
                        msn,
                        mo: 0,
                    },
                };
                return Some(TxKind::Seg {
                    hdr,
                    src: Src::Term,
                    len: t.buffer_len() as u32,
                });
            }
            QpState::Rts | QpState::Closing => {}
        }
        if self.accept_unsent {
            self.accept_unsent = false;
            return Some(TxKind::Accept);
        }
        if self.handshake_psn.is_some() {
            return None;
        }
        let next_psn = self.tx.nxt();
        let max_tagged = self.max_tagged();
        let max_untagged = self.max_untagged();
        if let Some(j) = self.rjobs.front_mut() {
            let len = (j.size - j.off).min(max_tagged);
            let last = j.off + len == j.size;
            let hdr = segment::Repr {
                opcode: Opcode::ReadResponse,
                last,
                buffer: BufferRef::Tagged {
                    stag: j.sink_stag,
                    to: j.sink_to.wrapping_add(u64::from(j.off)),
                },
            };
            let src = Src::Local {
                addr: j.src_addr + u64::from(j.off),
            };
            j.off += len;
            if last {
                // The IRD slot is free once the whole response is queued:
                // retransmissions read the source memory directly.
                self.rjobs.pop_front();
            }
            return Some(TxKind::Seg { hdr, src, len });
        }
        if let Some(e) = self.sq.get_mut(self.sq_cursor) {
            let seq = e.seq;
            let kind = match e.op {
                SendOp::Send {
                    invalidate,
                    solicited,
                } => {
                    let (hdr, off, len) = e.next_send_segment(
                        invalidate,
                        solicited,
                        &mut self.send_msn[0],
                        max_untagged,
                    );
                    let src = Src::Sq { seq, off };
                    TxKind::Seg { hdr, src, len }
                }
                SendOp::RdmaWrite { remote_addr, rkey }
                | SendOp::RdmaWriteImm {
                    remote_addr, rkey, ..
                } if !e.write_done => {
                    let (hdr, off, len) = e.next_write_segment(remote_addr, rkey, max_tagged);
                    let src = Src::Sq { seq, off };
                    TxKind::Seg { hdr, src, len }
                }
                // A plain write is issued with its last segment; never seen here.
                SendOp::RdmaWrite { .. } => return None,
                SendOp::RdmaWriteImm { imm, solicited, .. } => {
                    let msn = self.send_msn[0];
                    self.send_msn[0] = msn.wrapping_add(1);
                    let hdr = segment::Repr {
                        opcode: if solicited {
                            Opcode::ImmediateDataSe
                        } else {
                            Opcode::ImmediateData
                        },
                        last: true,
                        buffer: BufferRef::Untagged {
                            ulp_word: 0,
                            qn: qn::SEND,
                            msn,
                            mo: 0,
                        },
                    };
                    e.issued = true;
                    TxKind::Seg {
                        hdr,
                        src: Src::Imm(Immediate {
                            imm,
                            write_len: e.len,
                        }),
                        len: rdmap::IMMEDIATE_LEN as u32,
                    }
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    if self.reads_out.len() >= self.ord {
                        return None;
                    }
                    e.started = true;
                    let (sink_stag, sink_to, size) = e
                        .sges
                        .get(e.read_sge)
                        .map_or((0, 0, 0), |s| (s.lkey, s.addr, s.len));
                    let rr = ReadRequest {
                        sink_stag,
                        sink_to,
                        size,
                        src_stag: rkey,
                        src_to: remote_addr.wrapping_add(u64::from(e.off)),
                    };
                    e.off += size;
                    e.read_sge += 1;
                    e.issued = e.read_sge >= e.reads_total;
                    let msn = self.send_msn[1];
                    self.send_msn[1] = msn.wrapping_add(1);
                    self.reads_out.push_back(seq);
                    let hdr = segment::Repr {
                        opcode: Opcode::ReadRequest,
                        last: true,
                        buffer: BufferRef::Untagged {
                            ulp_word: 0,
                            qn: qn::READ_REQUEST,
                            msn,
                            mo: 0,
                        },
                    };
                    TxKind::Seg {
                        hdr,
                        src: Src::ReadReq(rr),
                        len: rdmap::READ_REQUEST_LEN as u32,
                    }
                }
            };
            if e.issued {
                e.last_psn = next_psn;
                self.sq_cursor += 1;
            }
            return Some(kind);
        }
        if self.state == QpState::Closing
            && self.fin_psn.is_none()
            && self.sq.is_empty()
            && self.rjobs.is_empty()
        {
            self.fin_psn = Some(next_psn);
            return Some(TxKind::Fin);
        }
        None
    }

    /// Produces the next datagram to send into `buf` (at least
    /// `max_datagram()` bytes) and returns its length.
    pub fn poll_transmit<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        mem: &M,
        buf: &mut [u8],
    ) -> Option<usize> {
        if buf.len() < self.datagram {
            debug_assert!(false, "transmit buffer smaller than max_datagram");
            return None;
        }
        if self.transmit_predictable() {
            let mut len = [0];
            if self.transmit_predicted(now, mem, &mut [&mut *buf], &mut len) == 1 {
                return Some(len[0]);
            }
        }
        self.transmit_general(now, mem, buf)
    }

    /// `poll_transmit` for up to `bufs.len()` datagrams at once, as a
    /// driver sending bursts calls it: the same datagrams in the same
    /// order, with the fast path's fixed conditions checked once per burst.
    /// Returns how many were written; datagram `i` is `bufs[i][..lens[i]]`.
    pub fn poll_transmit_burst<M: Memory + ?Sized, B: AsMut<[u8]>>(
        &mut self,
        now: Instant,
        mem: &M,
        bufs: &mut [B],
        lens: &mut [usize],
    ) -> usize {
        let n = bufs.len().min(lens.len());
        let mut i = 0;
        let fit = bufs[..n]
            .iter_mut()
            .all(|b| b.as_mut().len() >= self.datagram);
        if fit && self.transmit_predictable() {
            // Each run stops at the end of a request; the next may follow.
            while i < n {
                let k = self.transmit_predicted(now, mem, &mut bufs[i..n], &mut lens[i..n]);
                if k == 0 {
                    break;
                }
                i += k;
            }
        }
        while i < n {
            let Some(len) = self.poll_transmit(now, mem, bufs[i].as_mut()) else {
                break;
            };
            lens[i] = len;
            i += 1;
        }
        i
    }

    /// Everything `transmit_predicted` leaves: kept out of line so the
    /// fast path does not pay for this one's registers and stack frame.
    #[inline(never)]
    fn transmit_general<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        mem: &M,
        buf: &mut [u8],
    ) -> Option<usize> {
        if self.abort_pending {
            self.abort_pending = false;
            return Some(self.emit_control(buf, trp::Opcode::Abort));
        }
        if self.state != QpState::Closed {
            if let Some(psn) = self.tx.next_retransmit(now) {
                let kind = *self.tx.seg(psn).expect("retransmit PSN is outstanding");
                return Some(self.emit(mem, buf, psn, kind, true));
            }
            if self.tx.can_send_new() {
                if let Some(kind) = self.next_new() {
                    let psn = self.tx.push(kind, now);
                    if matches!(kind, TxKind::Seg { src: Src::Term, .. }) {
                        self.term_psn = Some(psn);
                    }
                    return Some(self.emit(mem, buf, psn, kind, false));
                }
            }
        }
        if self.rx.ack_due() {
            let sack = self.rx.sack_ranges();
            let op = if sack.is_empty() {
                trp::Opcode::Ack
            } else {
                trp::Opcode::Sack
            };
            self.stats.tx_acks += 1;
            let flags = if std::mem::take(&mut self.probe_pending) {
                trp::FLAG_ACK_REQUEST
            } else {
                0
            };
            return Some(self.emit_header(buf, op, self.tx.nxt(), flags, sack));
        }
        None
    }

    /// Whether nothing the general transmit path handles goes before new
    /// segments: no abort, handshake packet, Read Response or
    /// retransmission waiting. Only the general paths change this, so it
    /// holds for a whole burst of `transmit_predicted`.
    #[inline(always)]
    fn transmit_predictable(&self) -> bool {
        self.cfg.header_prediction
            && !self.abort_pending
            && self.state == QpState::Rts
            && !self.accept_unsent
            && self.handshake_psn.is_none()
            && self.rjobs.is_empty()
            && !self.tx.retransmit_pending()
    }

    /// The transmit fast path, when `transmit_predictable`: the next
    /// segments of the RDMA Write or Send at the send cursor, as many as
    /// the windows allow and `bufs` hold, their headers built in one step.
    /// What it sends and records is what `next_new` and `emit` would for
    /// each; it stops, changing nothing more, where they would do anything
    /// else. Returns how many datagrams it wrote (`lens`); every buffer
    /// holds at least `max_datagram()` bytes.
    #[inline(always)]
    fn transmit_predicted<M: Memory + ?Sized, B: AsMut<[u8]>>(
        &mut self,
        now: Instant,
        mem: &M,
        bufs: &mut [B],
        lens: &mut [usize],
    ) -> usize {
        let Some(e) = self.sq.get(self.sq_cursor) else {
            return 0;
        };
        // One specialised loop per kind of request.
        match e.op {
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteImm {
                remote_addr, rkey, ..
            } => {
                let max = self.max_tagged();
                // The end of a Write with Immediate, its Immediate Data
                // segment, takes the general path.
                self.transmit_run(now, mem, bufs, lens, |e, _| {
                    (!e.write_done).then(|| e.next_write_segment(remote_addr, rkey, max))
                })
            }
            SendOp::Send {
                invalidate,
                solicited,
            } => {
                let max = self.max_untagged();
                self.transmit_run(now, mem, bufs, lens, |e, msn| {
                    (!e.issued).then(|| e.next_send_segment(invalidate, solicited, msn, max))
                })
            }
            SendOp::RdmaRead { .. } => 0,
        }
    }

    /// The segments `next` makes of the send queue entry at the cursor (it
    /// gets the next Send MSN to take), as many as the windows allow and
    /// `bufs` hold, until it returns None.
    #[inline(always)]
    fn transmit_run<M: Memory + ?Sized, B: AsMut<[u8]>>(
        &mut self,
        now: Instant,
        mem: &M,
        bufs: &mut [B],
        lens: &mut [usize],
        mut next: impl FnMut(&mut SqEntry, &mut u32) -> Option<(segment::Repr, u32, u32)>,
    ) -> usize {
        let room = self.tx.room() as usize;
        let Some(e) = self.sq.get_mut(self.sq_cursor) else {
            return 0;
        };
        let mut sent = 0;
        for (buf, out_len) in bufs.iter_mut().zip(lens.iter_mut()).take(room) {
            let Some((hdr, off, len)) = next(e, &mut self.send_msn[0]) else {
                break;
            };
            let psn = self.tx.nxt();
            let buf = buf.as_mut();
            let at = trp::HEADER_LEN + hdr.header_len();
            gather(
                mem,
                &e.sges,
                u64::from(off),
                &mut buf[at..at + len as usize],
            );
            if e.issued {
                e.last_psn = psn;
                self.sq_cursor += 1;
            }
            let d = Datagram {
                flags: if hdr.last { trp::FLAG_ACK_REQUEST } else { 0 },
                dst_conn: self.peer_conn,
                psn,
                ack_psn: self.rx.nxt(),
                window: self.rx.window(),
                seg: hdr,
                payload: &[],
            };
            predict::emit(&d, buf);
            let src = Src::Sq { seq: e.seq, off };
            self.tx.push(TxKind::Seg { hdr, src, len }, now);
            self.rx.ack_sent();
            *out_len = at + len as usize;
            sent += 1;
        }
        sent
    }

    #[inline]
    fn emit_header(
        &mut self,
        buf: &mut [u8],
        opcode: trp::Opcode,
        psn: u32,
        flags: u8,
        sack: SackRanges,
    ) -> usize {
        let h = trp::Repr {
            opcode,
            flags,
            dst_conn: self.peer_conn,
            psn,
            ack_psn: self.rx.nxt(),
            window: self.rx.window(),
            sack,
        };
        h.emit(buf);
        self.rx.ack_sent();
        h.buffer_len()
    }

    fn emit_control(&mut self, buf: &mut [u8], op: trp::Opcode) -> usize {
        let psn = self.tx.nxt();
        self.emit_header(buf, op, psn, 0, SackRanges::new())
    }

    #[inline]
    fn emit<M: Memory + ?Sized>(
        &mut self,
        mem: &M,
        buf: &mut [u8],
        psn: u32,
        kind: TxKind,
        ack_now: bool,
    ) -> usize {
        let at = trp::HEADER_LEN;
        let mut flags = if ack_now { trp::FLAG_ACK_REQUEST } else { 0 };
        let (opcode, end) = match kind {
            TxKind::Accept => {
                let pd = self
                    .accept
                    .as_ref()
                    .map_or(&[][..], |a| &a.private_data[..]);
                let body = handshake::Repr {
                    version: handshake::PROTOCOL_VERSION,
                    ird: self.cfg.ird,
                    ord: self.cfg.ord,
                    src_conn: self.local_conn,
                    initial_psn: psn,
                    max_payload: self.cfg.max_datagram,
                    private_data: pd,
                };
                body.emit(&mut buf[at..]);
                flags = trp::FLAG_ACK_REQUEST;
                (trp::Opcode::Accept, at + body.buffer_len())
            }
            TxKind::Fin => {
                flags = trp::FLAG_ACK_REQUEST;
                (trp::Opcode::Fin, at)
            }
            TxKind::Seg { hdr, src, len } => {
                if hdr.last {
                    flags = trp::FLAG_ACK_REQUEST;
                }
                hdr.emit(&mut buf[at..]);
                let p = at + hdr.header_len();
                let body = &mut buf[p..p + len as usize];
                match src {
                    Src::Sq { seq, off } => {
                        if let Some(e) = self.sq_entry(seq) {
                            gather(mem, &e.sges, u64::from(off), body);
                        }
                    }
                    Src::Local { addr } => mem.read(addr, body),
                    Src::ReadReq(r) => r.emit(body),
                    Src::Imm(i) => i.emit(body),
                    Src::Term => {
                        if let Some(t) = &self.term_body {
                            t.emit(body)
                        }
                    }
                }
                (trp::Opcode::Data, p + len as usize)
            }
        };
        self.emit_header(buf, opcode, psn, flags, SackRanges::new());
        end
    }

    /// Processes one received datagram (the UDP payload). Malformed or
    /// foreign datagrams are counted and dropped; they never panic.
    pub fn handle_datagram<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        mem: &mut M,
        bytes: &[u8],
    ) -> Result<(), WireError> {
        if let Some(d) = predict::parse(bytes) {
            if self.receive_predicted(now, mem, &d, &mut None) {
                return Ok(());
            }
        }
        self.receive_general(now, mem, bytes)
    }

    /// `handle_datagram` for each of a burst of received datagrams, in
    /// order, as a driver receiving bursts calls it. Malformed datagrams
    /// are dropped and counted (`stats().rx_malformed`) as by
    /// `handle_datagram`; returns how many there were.
    pub fn handle_datagram_burst<M: Memory + ?Sized, B: AsRef<[u8]>>(
        &mut self,
        now: Instant,
        mem: &mut M,
        datagrams: &[B],
    ) -> usize {
        let mut malformed = 0;
        // The last region looked up: the table can change during the call
        // only through the general path (Send with Invalidate), which
        // forgets it.
        let mut region = None;
        for d in datagrams {
            let bytes = d.as_ref();
            if let Some(d) = predict::parse(bytes) {
                if self.receive_predicted(now, mem, &d, &mut region) {
                    continue;
                }
            }
            region = None;
            malformed += usize::from(self.receive_general(now, mem, bytes).is_err());
        }
        malformed
    }

    /// Everything `receive_predicted` leaves: kept out of line so the fast
    /// path does not pay for this one's registers and stack frame.
    #[inline(never)]
    fn receive_general<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        mem: &mut M,
        bytes: &[u8],
    ) -> Result<(), WireError> {
        self.stats.rx_packets += 1;
        // `parse` checks the lengths itself: checking them when the view is
        // made too would do it twice per datagram.
        let pkt = trp::Packet::new_unchecked(bytes);
        let h = trp::Repr::parse(&pkt).inspect_err(|_| self.stats.rx_malformed += 1)?;
        // Every SACK range the header announces was parsed into `h`, so its
        // length is the header's (no need to read the count again), and
        // `parse` checked that `bytes` holds it: the slice cannot panic.
        let payload = &bytes[h.buffer_len()..];
        if h.opcode == trp::Opcode::ConnectRequest {
            // The requester did not get our Accept: repeat it now.
            if let (Some(psn), Ok(body)) = (self.handshake_psn, handshake::Repr::parse(payload)) {
                if h.dst_conn == 0 && body.src_conn == self.peer_conn {
                    self.tx.mark_lost(psn);
                }
            }
            return Ok(());
        }
        if h.dst_conn != self.local_conn {
            self.stats.rx_foreign += 1;
            return Ok(());
        }
        match h.opcode {
            trp::Opcode::Reject => return Ok(()),
            trp::Opcode::Abort => {
                self.fail(now, FailReason::PeerAborted, None, None, false, None);
                return Ok(());
            }
            _ => {}
        }
        let ack_request = h.flags & trp::FLAG_ACK_REQUEST != 0;
        if self.state == QpState::Closed {
            if h.opcode.consumes_psn() || ack_request {
                if self.abort_on_contact {
                    self.abort_pending = true;
                } else {
                    self.rx.request_ack();
                }
            }
            return Ok(());
        }
        // Any packet of the connection shows the peer is alive.
        self.probes = 0;
        self.probe_deadline = None;
        if !h.opcode.consumes_psn() && ack_request {
            // A keep-alive probe: answer it.
            self.rx.request_ack();
        }
        self.tx.on_ack(now, h.ack_psn, &h.sack);
        self.tx.set_peer_window(u32::from(h.window));
        if self.handshake_psn.is_some_and(|p| psn_lt(p, self.tx.una())) {
            self.handshake_psn = None;
            self.accept = None;
        }
        if h.opcode.consumes_psn() {
            let arrival = self.rx.classify(h.psn);
            match arrival {
                Arrival::New { in_order } if self.state != QpState::Error => {
                    let ev = match h.opcode {
                        trp::Opcode::Data => self.place(mem, in_order, payload),
                        trp::Opcode::Fin => Some(RxEvent::Fin),
                        _ => Some(RxEvent::None),
                    };
                    let Some(ev) = ev else {
                        self.stats.rx_deferred += 1;
                        return Ok(());
                    };
                    if self.rx.take_in_order(h.psn) {
                        // Nothing waits behind it: its effect applies now.
                        self.rx.on_packet(now, arrival, ack_request);
                        if !matches!(ev, RxEvent::None)
                            && matches!(self.state, QpState::Rts | QpState::Closing)
                        {
                            self.deliver_event(now, mem, ev);
                        }
                    } else {
                        self.rx.mark(h.psn);
                        let slot = self.rx.slot(h.psn);
                        self.rx_events[slot] = ev;
                        self.rx.on_packet(now, arrival, ack_request);
                        self.deliver(now, mem);
                    }
                }
                Arrival::New { .. } => {}
                _ => {
                    self.stats.rx_duplicates += 1;
                    self.rx.on_packet(now, arrival, false);
                }
            }
        }
        self.progress();
        self.arm_probe(now);
        Ok(())
    }

    /// The receive fast path: what the general path does with an RDMA
    /// Write or Send segment in the common case (ours, established, the
    /// next PSN with nothing held above it, no handshake left to finish,
    /// placement allowed; for a Send, its receive posted and long enough,
    /// and no invalidation), done without building the general
    /// representations. When any of that does not hold it changes nothing
    /// and returns false, and the general path handles the datagram,
    /// errors included. `region` is the last region looked up (see
    /// `handle_datagram_burst`).
    #[inline(always)]
    fn receive_predicted<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        mem: &mut M,
        d: &Datagram<'_>,
        region: &mut Option<(u32, Region)>,
    ) -> bool {
        let ours = d.dst_conn == self.local_conn
            && self.cfg.header_prediction
            && self.state == QpState::Rts
            && self.handshake_psn.is_none();
        if !ours {
            return false;
        }
        // One specialised path per kind of segment. Each checks where the
        // payload goes before anything changes.
        match d.seg.buffer {
            BufferRef::Tagged { stag, to } => {
                let r = match *region {
                    Some((s, r)) if s == stag => r,
                    _ => {
                        let Some(r) = mem.region(stag) else {
                            return false;
                        };
                        *region = Some((stag, r));
                        r
                    }
                };
                let (pd, len) = (self.cfg.pd, d.payload.len() as u64);
                if mr::check_region(&r, pd, to, len, Access::REMOTE_WRITE).is_err()
                    || !self.admit(now, d)
                {
                    return false;
                }
                mem.write(to, d.payload);
            }
            BufferRef::Untagged { msn, mo, .. } => {
                // Invalidation changes the region table: general path.
                if d.seg.last && d.seg.opcode.invalidates() {
                    return false;
                }
                let i = msn.wrapping_sub(self.rq_msn) as usize;
                let end = u64::from(mo) + d.payload.len() as u64;
                if self.rq.get(i).is_none_or(|e| end > e.len) || !self.admit(now, d) {
                    return false;
                }
                scatter(mem, &self.rq[i].sges, u64::from(mo), d.payload);
                if d.seg.last {
                    let ev = RxEvent::Recv {
                        msn,
                        invalidate: None,
                        solicited: d.seg.opcode.solicited(),
                        len: end as u32,
                        imm: None,
                    };
                    self.deliver_event(now, mem, ev);
                }
            }
        }
        self.progress();
        // The keep-alive was just reset; it rearms only while Reads wait.
        if !self.reads_out.is_empty() {
            self.arm_probe(now);
        }
        true
    }

    /// The receive fast path's bookkeeping once the segment may be placed:
    /// takes its PSN if it is the next expected with nothing held above
    /// it (else changes nothing and returns false), then what the general
    /// path does for any packet of the connection.
    #[inline(always)]
    fn admit(&mut self, now: Instant, d: &Datagram<'_>) -> bool {
        let ack_request = d.flags & trp::FLAG_ACK_REQUEST != 0;
        if !self.rx.accept_next(now, d.psn, ack_request) {
            return false;
        }
        self.stats.rx_packets += 1;
        self.probes = 0;
        self.probe_deadline = None;
        self.tx.on_ack(now, d.ack_psn, &SackRanges::new());
        self.tx.set_peer_window(u32::from(d.window));
        true
    }

    /// Places a new segment's payload (any order) and returns what must
    /// happen when its PSN is delivered in order. `None`: drop it unseen.
    #[inline]
    fn place<M: Memory + ?Sized>(
        &mut self,
        mem: &mut M,
        in_order: bool,
        payload: &[u8],
    ) -> Option<RxEvent> {
        let (seg, body) = match segment::Repr::parse(payload) {
            Ok(x) => x,
            Err(e) => {
                return Some(RxEvent::Fail {
                    term: Box::new(wire_error_term(e, payload)),
                    rq_status: None,
                })
            }
        };
        let pd = self.cfg.pd;
        match (seg.buffer, body) {
            (BufferRef::Tagged { stag, to }, Body::Data(data)) => {
                let response = seg.opcode == Opcode::ReadResponse;
                if response && self.reads_out.is_empty() {
                    let term = terminate(
                        Layer::Rdmap,
                        term::RDMAP_REMOTE_OPERATION,
                        term::UNEXPECTED_OPCODE,
                        payload,
                        None,
                    );
                    return Some(RxEvent::Fail {
                        term: Box::new(term),
                        rq_status: None,
                    });
                }
                let need = if response {
                    Access::LOCAL_WRITE
                } else {
                    Access::REMOTE_WRITE
                };
                match mr::check(mem, stag, pd, to, data.len() as u64, need) {
                    Err(e) => {
                        let (l, t, c) = e.tagged_term();
                        Some(RxEvent::Fail {
                            term: Box::new(terminate(l, t, c, payload, None)),
                            rq_status: None,
                        })
                    }
                    Ok(()) => {
                        mem.write(to, data);
                        Some(if response && seg.last {
                            RxEvent::ReadResponseDone
                        } else {
                            RxEvent::None
                        })
                    }
                }
            }
            (
                BufferRef::Untagged {
                    ulp_word, msn, mo, ..
                },
                body @ (Body::Data(_) | Body::Immediate(_)),
            ) => {
                let d = msn.wrapping_sub(self.rq_msn);
                if d as usize >= self.rq.len() {
                    if !in_order && d < 1 << 16 {
                        return None;
                    }
                    let code = if d < 1 << 16 {
                        term::U_NO_BUFFER
                    } else {
                        term::U_MSN_RANGE
                    };
                    let term = terminate(Layer::Ddp, term::DDP_UNTAGGED, code, payload, None);
                    return Some(RxEvent::Fail {
                        term: Box::new(term),
                        rq_status: None,
                    });
                }
                let e = &self.rq[d as usize];
                match body {
                    Body::Immediate(i) => Some(RxEvent::Recv {
                        msn,
                        invalidate: None,
                        solicited: seg.opcode.solicited(),
                        len: i.write_len,
                        imm: Some(i.imm),
                    }),
                    Body::Data(data) => {
                        let end = u64::from(mo) + data.len() as u64;
                        if end > e.len {
                            let term = terminate(
                                Layer::Ddp,
                                term::DDP_UNTAGGED,
                                term::U_TOO_LONG,
                                payload,
                                None,
                            );
                            return Some(RxEvent::Fail {
                                term: Box::new(term),
                                rq_status: Some(WcStatus::LocalLength),
                            });
                        }
                        let sges = std::mem::take(&mut self.rq[d as usize].sges);
                        scatter(mem, &sges, u64::from(mo), data);
                        self.rq[d as usize].sges = sges;
                        Some(if seg.last {
                            RxEvent::Recv {
                                msn,
                                invalidate: seg.opcode.invalidates().then_some(ulp_word),
                                solicited: seg.opcode.solicited(),
                                len: end as u32,
                                imm: None,
                            }
                        } else {
                            RxEvent::None
                        })
                    }
                    _ => None,
                }
            }
            (BufferRef::Untagged { msn, .. }, Body::ReadRequest(rr)) => {
                Some(RxEvent::ReadRequest { msn, rr })
            }
            (_, Body::Terminate(t)) => Some(RxEvent::Terminate(t)),
            _ => {
                let term = terminate(
                    Layer::Rdmap,
                    term::RDMAP_REMOTE_OPERATION,
                    term::UNEXPECTED_OPCODE,
                    payload,
                    None,
                );
                Some(RxEvent::Fail {
                    term: Box::new(term),
                    rq_status: None,
                })
            }
        }
    }

    /// Applies in-order effects of every PSN that is now contiguous.
    #[inline]
    fn deliver<M: Memory + ?Sized>(&mut self, now: Instant, mem: &mut M) {
        while let Some(psn) = self.rx.pop_in_order() {
            let slot = self.rx.slot(psn);
            let ev = std::mem::take(&mut self.rx_events[slot]);
            // Most PSNs (all but the last segment of a message) have no
            // in-order effect: keep their path free of the rest.
            if matches!(ev, RxEvent::None) || !matches!(self.state, QpState::Rts | QpState::Closing)
            {
                continue;
            }
            self.deliver_event(now, mem, ev);
        }
    }

    /// Applies one PSN's in-order effect.
    #[inline(never)]
    fn deliver_event<M: Memory + ?Sized>(&mut self, now: Instant, mem: &mut M, ev: RxEvent) {
        match ev {
            RxEvent::None => {}
            RxEvent::Recv {
                msn,
                invalidate,
                solicited,
                len,
                imm,
            } => {
                // A hostile peer can end the same message twice.
                if msn != self.rq_msn || self.rq.is_empty() {
                    let t = Terminate {
                        layer: Layer::Ddp,
                        etype: term::DDP_UNTAGGED,
                        code: term::U_MSN_RANGE,
                        ddp_header: None,
                        rdmap_header: None,
                    };
                    self.fail_terminate(now, t);
                    return;
                }
                if let Some(stag) = invalidate {
                    if mem.invalidate(stag, self.cfg.pd).is_err() {
                        let t = Terminate {
                            layer: Layer::Rdmap,
                            etype: term::RDMAP_REMOTE_OPERATION,
                            code: term::STAG_CANNOT_INVALIDATE,
                            ddp_header: None,
                            rdmap_header: None,
                        };
                        self.fail_terminate(now, t);
                        return;
                    }
                }
                let e = self
                    .rq
                    .pop_front()
                    .expect("placement checked the receive exists");
                self.rq_msn = self.rq_msn.wrapping_add(1);
                self.cq.push_back(Completion {
                    wr_id: e.wr_id,
                    queue: Queue::Recv,
                    status: WcStatus::Success,
                    opcode: if imm.is_some() {
                        WcOpcode::RecvRdmaWithImm
                    } else {
                        WcOpcode::Recv
                    },
                    byte_len: len,
                    imm,
                    invalidated: invalidate,
                    solicited,
                });
            }
            RxEvent::ReadRequest { msn, rr } => {
                // Rebuild the offending header for a Terminate: only
                // MSN varies in a valid Read Request's DDP header.
                let mut h = [0u8; ddp::UNTAGGED_HEADER_LEN];
                segment::Repr {
                    opcode: Opcode::ReadRequest,
                    last: true,
                    buffer: BufferRef::Untagged {
                        ulp_word: 0,
                        qn: qn::READ_REQUEST,
                        msn,
                        mo: 0,
                    },
                }
                .emit(&mut h);
                let mut hdr = HeaderCopy::from_segment(&h);
                if let Some(c) = hdr.as_mut() {
                    c.segment_len = (ddp::UNTAGGED_HEADER_LEN + rdmap::READ_REQUEST_LEN) as u16;
                }
                let mut t = Terminate {
                    layer: Layer::Ddp,
                    etype: term::DDP_UNTAGGED,
                    code: 0,
                    ddp_header: hdr,
                    rdmap_header: Some(rr),
                };
                if msn != self.rr_msn {
                    t.code = term::U_MSN_RANGE;
                } else if self.rjobs.len() >= usize::from(self.cfg.ird) {
                    t.code = term::U_NO_BUFFER;
                } else if let Err(e) = mr::check(
                    mem,
                    rr.src_stag,
                    self.cfg.pd,
                    rr.src_to,
                    u64::from(rr.size),
                    Access::REMOTE_READ,
                ) {
                    (t.layer, t.etype, t.code) = e.read_term();
                } else {
                    self.rr_msn = self.rr_msn.wrapping_add(1);
                    self.rjobs.push_back(ReadJob {
                        src_addr: rr.src_to,
                        sink_stag: rr.sink_stag,
                        sink_to: rr.sink_to,
                        size: rr.size,
                        off: 0,
                    });
                    return;
                }
                self.fail_terminate(now, t);
            }
            RxEvent::ReadResponseDone => {
                if let Some(seq) = self.reads_out.pop_front() {
                    let i = seq.wrapping_sub(self.sq_head_seq) as usize;
                    if let Some(e) = self.sq.get_mut(i) {
                        e.reads_done += 1;
                    }
                }
            }
            RxEvent::Terminate(t) => {
                let protection = (t.layer == Layer::Rdmap
                    && t.etype == term::RDMAP_REMOTE_PROTECTION)
                    || (t.layer == Layer::Ddp && t.etype == term::DDP_TAGGED);
                let status = if protection {
                    WcStatus::RemoteAccess
                } else {
                    WcStatus::RemoteOperation
                };
                self.fail(
                    now,
                    FailReason::TerminateReceived(t),
                    Some(status),
                    None,
                    false,
                    None,
                );
            }
            RxEvent::Fail { term, rq_status } => {
                let term = *term;
                self.fail(
                    now,
                    FailReason::TerminateSent(term),
                    None,
                    rq_status,
                    false,
                    Some(term),
                );
            }
            RxEvent::Fin => {
                self.peer_fin = true;
                self.events.push_back(Event::PeerClosed);
                if self.state == QpState::Rts {
                    self.goto::<state::Rts, state::Closing>();
                }
            }
        }
    }

    /// Completes finished send work in order and finishes closes.
    #[inline(always)]
    fn progress(&mut self) {
        // The common case on a receiving end: nothing of ours to finish.
        if self.state == QpState::Rts && self.sq.is_empty() {
            return;
        }
        let una = self.tx.una();
        if matches!(self.state, QpState::Rts | QpState::Closing) {
            while let Some(e) = self.sq.front() {
                let done = e.issued
                    && match e.op {
                        SendOp::RdmaRead { .. } => e.reads_done >= e.reads_total,
                        _ => psn_lt(e.last_psn, una),
                    };
                if !done {
                    break;
                }
                let e = self.sq.pop_front().expect("front exists");
                self.sq_head_seq += 1;
                self.sq_cursor -= 1;
                if e.signaled {
                    self.cq.push_back(Completion {
                        wr_id: e.wr_id,
                        queue: Queue::Send,
                        status: WcStatus::Success,
                        opcode: wc_opcode(&e.op),
                        byte_len: e.len,
                        imm: None,
                        invalidated: None,
                        solicited: false,
                    });
                }
            }
        }
        match self.state {
            QpState::Closing if self.peer_fin && self.fin_psn.is_some_and(|p| psn_lt(p, una)) => {
                self.goto::<state::Closing, state::Closed>();
                self.flush_rq(None);
                self.events.push_back(Event::Closed);
            }
            QpState::Error if self.term_psn.is_some_and(|p| psn_lt(p, una)) => {
                self.tx.clear();
                self.sq.clear();
                self.goto::<state::Error, state::Closed>();
            }
            _ => {}
        }
    }

    fn flush_rq(&mut self, first: Option<WcStatus>) {
        let mut first = first;
        while let Some(e) = self.rq.pop_front() {
            self.cq.push_back(Completion {
                wr_id: e.wr_id,
                queue: Queue::Recv,
                status: first.take().unwrap_or(WcStatus::Flush),
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: None,
                invalidated: None,
                solicited: false,
            });
        }
    }

    /// We detected the error: the peer gets `t` and the failure names it.
    fn fail_terminate(&mut self, now: Instant, t: Terminate) {
        self.fail(
            now,
            FailReason::TerminateSent(t),
            None,
            None,
            false,
            Some(t),
        );
    }

    /// Moves to Error: completes all outstanding work (the first send with
    /// `sq_first`, the first receive with `rq_first`, transmitted sends with
    /// RetryExceeded when `retry`, everything else Flush) and, if given,
    /// queues a Terminate for the peer.
    fn fail(
        &mut self,
        _now: Instant,
        reason: FailReason,
        sq_first: Option<WcStatus>,
        rq_first: Option<WcStatus>,
        retry: bool,
        term: Option<Terminate>,
    ) {
        match self.state {
            QpState::Rts => self.goto::<state::Rts, state::Error>(),
            QpState::Closing => self.goto::<state::Closing, state::Error>(),
            QpState::Error | QpState::Closed => return,
        }
        let mut first = sq_first;
        for e in &self.sq {
            let status = first.take().unwrap_or(if retry && e.started {
                WcStatus::RetryExceeded
            } else {
                WcStatus::Flush
            });
            self.cq.push_back(Completion {
                wr_id: e.wr_id,
                queue: Queue::Send,
                status,
                opcode: wc_opcode(&e.op),
                byte_len: 0,
                imm: None,
                invalidated: None,
                solicited: false,
            });
        }
        // Entries stay (without further completions) while earlier segments
        // that reference them may still be retransmitted before the
        // Terminate; they are dropped when the connection is Closed.
        self.sq_cursor = self.sq.len();
        self.flush_rq(rq_first);
        self.reads_out.clear();
        self.rjobs.clear();
        self.events.push_back(Event::Failed(reason));
        if matches!(reason, FailReason::RetryExceeded | FailReason::Aborted) {
            self.abort_on_contact = true;
            self.abort_pending = true;
        }
        match term {
            Some(t) => {
                self.term_pending = Some(t);
                self.term_body = Some(t);
            }
            None => {
                self.tx.clear();
                self.sq.clear();
                self.goto::<state::Error, state::Closed>();
            }
        }
    }
}
