//! Transmit: the send queue, cutting its work requests (and the peer's
//! Reads we answer) into segments, and writing datagrams.

use super::sgl::{scatter, SgeList};
use super::states::Phase;
use super::{take_msn, Connection, Msn};
use crate::mr::Memory;
use crate::time::Instant;
use crate::verbs::{SendOp, SendWr};
use crate::wire::ddp::{self, BufferRef};
use crate::wire::handshake;
use crate::wire::predict::{self, Datagram};
use crate::wire::rdmap::{self, qn, AtomicRequest, AtomicResponse, Immediate, Opcode, ReadRequest};
use crate::wire::segment;
use crate::wire::trp::{self, SackRanges};
use std::collections::VecDeque;

/// Where a segment's payload comes from when it is (re)built.
#[derive(Clone, Copy, Debug)]
pub(super) enum Src {
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
    /// Send queue entry `seq`'s Atomic Request.
    AtomicReq {
        seq: u64,
    },
    /// The result of the peer's atomic, taken when it ran: a retransmission
    /// carries the same value, and the operation never runs twice.
    AtomicResp(AtomicResponse),
    Imm(Immediate),
    /// The connection's one Terminate (kept in its Error state).
    Term,
}

/// What occupies one of our PSNs; enough to rebuild the packet.
#[derive(Clone, Copy, Debug)]
pub(super) enum TxKind {
    Accept,
    Fin,
    Seg {
        hdr: segment::Repr,
        src: Src,
        len: u32,
    },
}

impl TxKind {
    /// Whether (re)building the segment reads the local memory a Read
    /// Request named.
    pub(super) fn reads_local_memory(&self) -> bool {
        matches!(
            self,
            TxKind::Seg {
                src: Src::Local { .. },
                ..
            }
        )
    }
}

#[derive(Debug)]
pub(super) struct SqEntry {
    pub(super) seq: u64,
    pub(super) wr_id: u64,
    pub(super) op: SendOp,
    sges: SgeList,
    pub(super) signaled: bool,
    pub(super) len: u32,
    off: u32,
    msn: u32,
    pub(super) started: bool,
    write_done: bool,
    read_sge: usize,
    pub(super) reads_total: usize,
    pub(super) reads_done: usize,
    pub(super) issued: bool,
    pub(super) last_psn: u32,
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
            self.msn = take_msn(next_msn);
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

impl SqEntry {
    /// Whether a packet of this request that was just made (`last`: it ends its DDP
    /// message) has another of the same request right behind it: more of the message, or
    /// the Immediate Data after the Write of a Write with Immediate.
    #[inline(always)]
    fn followed(&self, last: bool) -> bool {
        !last || (matches!(self.op, SendOp::RdmaWriteImm { .. }) && !self.issued)
    }

    /// The Atomic Request of an atomic entry, its MSN its identifier.
    fn atomic_request(&self) -> AtomicRequest {
        match self.op {
            SendOp::Atomic {
                remote_addr,
                rkey,
                op,
            } => AtomicRequest::new(self.msn, rkey, remote_addr, op),
            _ => AtomicRequest::default(),
        }
    }

    /// Whether this atomic entry's request carried `request_id`.
    pub(super) fn is_atomic_request(&self, request_id: u32) -> bool {
        matches!(self.op, SendOp::Atomic { .. }) && self.started && self.msn == request_id
    }

    /// Puts an atomic's result, the value the peer found, in the first 8
    /// bytes of its local memory (checked for local write when posted).
    pub(super) fn place_atomic_result<M: Memory + ?Sized>(&mut self, mem: &mut M, original: u64) {
        scatter(mem, &self.sges, 0, &original.to_ne_bytes());
        self.reads_done += 1;
    }
}

/// Our send work requests from posting to completion, and the numbering
/// of the messages we send.
#[derive(Debug)]
pub(super) struct SendQueue {
    /// Posted and not yet completed, oldest first.
    pub(super) entries: VecDeque<SqEntry>,
    /// `seq` of `entries[0]`: segments name their entry by `seq`, which
    /// outlives its index as entries complete.
    pub(super) head_seq: u64,
    next_seq: u64,
    /// The first entry not yet wholly issued.
    pub(super) cursor: usize,
    next_msn: Msn,
    /// Our RDMA Reads awaiting their responses (entry `seq`), in order.
    pub(super) reads_out: VecDeque<u64>,
    /// Effective ORD (ours, limited by the peer's IRD).
    pub(super) ord: usize,
}

impl SendQueue {
    pub(super) fn new(ord: usize) -> SendQueue {
        SendQueue {
            entries: VecDeque::new(),
            head_seq: 0,
            next_seq: 0,
            cursor: 0,
            next_msn: Msn::FIRST,
            reads_out: VecDeque::new(),
            ord,
        }
    }

    pub(super) fn push(&mut self, wr: &SendWr<'_>, len: u32) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.push_back(SqEntry {
            seq,
            wr_id: wr.wr_id,
            op: wr.op,
            sges: SgeList::new(wr.sges),
            signaled: wr.signaled,
            len,
            off: 0,
            msn: 0,
            started: false,
            write_done: false,
            read_sge: 0,
            reads_total: if matches!(wr.op, SendOp::Atomic { .. }) {
                1
            } else {
                wr.sges.len().max(1)
            },
            reads_done: 0,
            issued: false,
            last_psn: 0,
        });
    }

    /// Passes the local requests at the cursor: they have no segments and
    /// complete once `last_psn`, the last PSN of the requests before them,
    /// is acknowledged (and those requests have completed).
    pub(super) fn pass_locals(&mut self, last_psn: u32) {
        while let Some(e) = self.entries.get_mut(self.cursor) {
            if !matches!(e.op, SendOp::Local(_)) {
                break;
            }
            e.issued = true;
            e.last_psn = last_psn;
            self.cursor += 1;
        }
    }

    /// Copies the data of every entry out of the caller's memory; an
    /// Atomic's buffer, where its result would land, is forgotten (a Read's
    /// response lands through the region table, which the caller no longer
    /// offers: `Connection::release_memory`).
    pub(super) fn release_memory<M: Memory + ?Sized>(&mut self, mem: &M) {
        for e in &mut self.entries {
            match e.op {
                SendOp::Send { .. } | SendOp::RdmaWrite { .. } | SendOp::RdmaWriteImm { .. } => {
                    e.sges.copy_out(mem, e.len)
                }
                SendOp::Atomic { .. } => e.sges = SgeList::Copied(Box::default()),
                SendOp::RdmaRead { .. } | SendOp::Local(_) => {}
            }
        }
    }

    #[inline]
    pub(super) fn get_mut(&mut self, seq: u64) -> Option<&mut SqEntry> {
        self.entries
            .get_mut(seq.wrapping_sub(self.head_seq) as usize)
    }

    #[inline]
    pub(super) fn get(&self, seq: u64) -> Option<&SqEntry> {
        self.entries.get(seq.wrapping_sub(self.head_seq) as usize)
    }
}

/// What we owe the peer for one of its Read or Atomic Requests.
#[derive(Debug)]
pub(super) enum Reply {
    Read(ReadJob),
    Atomic(AtomicResponse),
}

/// A Read Response we still have to send.
#[derive(Debug)]
pub(super) struct ReadJob {
    pub(super) src_addr: u64,
    pub(super) sink_stag: u32,
    pub(super) sink_to: u64,
    pub(super) size: u32,
    pub(super) off: u32,
}

impl Connection {
    #[inline]
    fn max_tagged(&self) -> u32 {
        (self.room - trp::HEADER_LEN - ddp::TAGGED_HEADER_LEN) as u32
    }
    #[inline]
    fn max_untagged(&self) -> u32 {
        (self.room - trp::HEADER_LEN - ddp::UNTAGGED_HEADER_LEN) as u32
    }

    /// Chooses what the next new PSN carries.
    #[inline]
    fn next_new(&mut self) -> Option<TxKind> {
        match &mut self.state {
            Phase::Closed(_) => return None,
            Phase::Error(e) => {
                if e.term_psn.is_some() {
                    return None;
                }
                e.term_psn = Some(self.tx.nxt());
                let len = e.term.buffer_len() as u32;
                let msn = take_msn(&mut self.sq.next_msn.terminate);
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
                    len,
                });
            }
            Phase::Rts | Phase::Closing(_) => {}
        }
        if let Some(a) = &mut self.accept {
            if !a.sent {
                a.sent = true;
                return Some(TxKind::Accept);
            }
            return None;
        }
        let next_psn = self.tx.nxt();
        let max_tagged = self.max_tagged();
        let max_untagged = self.max_untagged();
        match self.responses.front_mut() {
            Some(Reply::Read(j)) => {
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
                    self.responses.pop_front();
                }
                return Some(TxKind::Seg { hdr, src, len });
            }
            Some(Reply::Atomic(r)) => {
                let r = *r;
                self.responses.pop_front();
                let msn = take_msn(&mut self.sq.next_msn.atomic_response);
                let hdr = untagged_header(Opcode::AtomicResponse, qn::ATOMIC_RESPONSE, msn);
                let len = rdmap::ATOMIC_RESPONSE_LEN as u32;
                return Some(TxKind::Seg {
                    hdr,
                    src: Src::AtomicResp(r),
                    len,
                });
            }
            None => {}
        }
        let sq = &mut self.sq;
        if let Some(e) = sq.entries.get_mut(sq.cursor) {
            let seq = e.seq;
            let kind = match e.op {
                SendOp::Send {
                    invalidate,
                    solicited,
                } => {
                    let (hdr, off, len) = e.next_send_segment(
                        invalidate,
                        solicited,
                        &mut sq.next_msn.send,
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
                    let msn = take_msn(&mut sq.next_msn.send);
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
                    if sq.reads_out.len() >= sq.ord {
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
                    let msn = take_msn(&mut sq.next_msn.read_request);
                    sq.reads_out.push_back(seq);
                    let hdr = read_request_header(msn);
                    TxKind::Seg {
                        hdr,
                        src: Src::ReadReq(rr),
                        len: rdmap::READ_REQUEST_LEN as u32,
                    }
                }
                SendOp::Atomic { .. } => {
                    // An atomic takes one of the peer's IRD slots, as a Read does.
                    if sq.reads_out.len() >= sq.ord {
                        return None;
                    }
                    e.started = true;
                    e.msn = take_msn(&mut sq.next_msn.read_request);
                    e.issued = true;
                    sq.reads_out.push_back(seq);
                    TxKind::Seg {
                        hdr: atomic_request_header(e.msn),
                        src: Src::AtomicReq { seq },
                        len: rdmap::ATOMIC_REQUEST_LEN as u32,
                    }
                }
                // Passed when the request before it was issued or, with
                // none left, when it was posted.
                SendOp::Local(_) => return None,
            };
            if e.issued {
                e.last_psn = next_psn;
                sq.cursor += 1;
                sq.pass_locals(next_psn);
            }
            return Some(kind);
        }
        match &mut self.state {
            Phase::Closing(c)
                if c.fin_psn.is_none()
                    && self.sq.entries.is_empty()
                    && self.responses.is_empty() =>
            {
                c.fin_psn = Some(next_psn);
                Some(TxKind::Fin)
            }
            _ => None,
        }
    }

    /// Everything `transmit_predicted` leaves: kept out of line so the
    /// fast path does not pay for this one's registers and stack frame.
    #[inline(never)]
    pub(super) fn transmit_general<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        mem: &M,
        buf: &mut [u8],
    ) -> Option<usize> {
        if let Phase::Closed(c) = &mut self.state {
            if std::mem::take(&mut c.abort_pending) {
                return Some(self.emit_control(buf, trp::Opcode::Abort));
            }
        } else {
            if let Some(psn) = self.tx.next_retransmit(now) {
                let kind = *self.tx.seg(psn).expect("retransmit PSN is outstanding");
                return Some(self.emit(mem, buf, psn, kind, true));
            }
            if self.tx.can_send_new() {
                if let Some(kind) = self.next_new() {
                    let psn = self.tx.push(kind, now);
                    let len = self.emit(mem, buf, psn, kind, false);
                    if self.follows(kind) {
                        buf[trp::field::FLAGS] |= trp::FLAG_FOLLOWS;
                    }
                    return Some(len);
                }
            }
        }
        if self.rx.ack_due() {
            let sack = self.rx.take_sack();
            let op = if sack.is_empty() {
                trp::Opcode::Ack
            } else {
                trp::Opcode::Sack
            };
            self.stats.tx_acks += 1;
            let flags = if self.keepalive.take_probe() {
                trp::FLAG_ACK_REQUEST
            } else {
                0
            };
            return Some(self.emit_header(buf, op, self.tx.nxt(), flags, sack));
        }
        None
    }

    /// Whether the new packet of `kind` just pushed is followed at once by the next one:
    /// more of its message, or the Immediate Data after the Write of an RDMA Write with
    /// Immediate, with room in the windows for it ([`trp::FLAG_FOLLOWS`]).
    fn follows(&self, kind: TxKind) -> bool {
        let TxKind::Seg { hdr, src, .. } = kind else {
            return false;
        };
        let more = match src {
            Src::Sq { seq, .. } => self.sq.get(seq).is_some_and(|e| e.followed(hdr.last)),
            _ => !hdr.last,
        };
        more && self.tx.room() > 0
    }

    /// Whether nothing the general transmit path handles goes before new
    /// segments: no abort, handshake packet, Read Response or
    /// retransmission waiting. Only the general paths change this, so it
    /// holds for a whole burst of `transmit_predicted`.
    #[inline(always)]
    pub(super) fn transmit_predictable(&self) -> bool {
        self.cfg.header_prediction
            && matches!(self.state, Phase::Rts)
            && self.accept.is_none()
            && self.responses.is_empty()
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
    pub(super) fn transmit_predicted<M: Memory + ?Sized, B: AsMut<[u8]>>(
        &mut self,
        now: Instant,
        mem: &M,
        bufs: &mut [B],
        lens: &mut [usize],
    ) -> usize {
        let Some(e) = self.sq.entries.get(self.sq.cursor) else {
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
            SendOp::RdmaRead { .. } | SendOp::Atomic { .. } | SendOp::Local(_) => 0,
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
        let sq = &mut self.sq;
        let Some(e) = sq.entries.get_mut(sq.cursor) else {
            return 0;
        };
        let mut sent = 0;
        let mut issued_at = None;
        for (buf, out_len) in bufs.iter_mut().zip(lens.iter_mut()).take(room) {
            let Some((hdr, off, len)) = next(e, &mut sq.next_msn.send) else {
                break;
            };
            let psn = self.tx.nxt();
            let buf = buf.as_mut();
            let at = trp::HEADER_LEN + hdr.header_len();
            e.sges
                .gather(mem, u64::from(off), &mut buf[at..at + len as usize]);
            // As `follows`, with the room this run started with.
            let follows = if e.followed(hdr.last) && room > sent + 1 {
                trp::FLAG_FOLLOWS
            } else {
                0
            };
            if e.issued {
                e.last_psn = psn;
                sq.cursor += 1;
                issued_at = Some(psn);
            }
            let d = Datagram {
                flags: if hdr.last { trp::FLAG_ACK_REQUEST } else { 0 } | follows,
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
        if let Some(psn) = issued_at {
            self.sq.pass_locals(psn);
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
        self.emit_header(buf, op, psn, trp::FLAG_ACKS, SackRanges::new())
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
                    .map_or(&[][..], |a| &a.body.private_data[..]);
                let body = handshake::Repr {
                    version: handshake::PROTOCOL_VERSION,
                    ird: self.cfg.ird,
                    ord: self.cfg.ord,
                    src_conn: self.local_conn,
                    initial_psn: psn,
                    max_payload: self.cfg.max_datagram,
                    flags: handshake::flags(self.crc),
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
                        if let Some(e) = self.sq.get(seq) {
                            e.sges.gather(mem, u64::from(off), body);
                        }
                    }
                    Src::Local { addr } => mem.read(addr, body),
                    Src::ReadReq(r) => r.emit(body),
                    Src::AtomicReq { seq } => {
                        if let Some(e) = self.sq.get(seq) {
                            e.atomic_request().emit(body);
                        }
                    }
                    Src::AtomicResp(r) => r.emit(body),
                    Src::Imm(i) => i.emit(body),
                    Src::Term => {
                        if let Phase::Error(e) = &self.state {
                            e.term.emit(body)
                        }
                    }
                }
                (trp::Opcode::Data, p + len as usize)
            }
        };
        self.emit_header(buf, opcode, psn, flags, SackRanges::new());
        end
    }
}

/// The header of a one-segment untagged message on queue `qn`.
#[inline]
fn untagged_header(opcode: Opcode, qn: u32, msn: u32) -> segment::Repr {
    segment::Repr {
        opcode,
        last: true,
        buffer: BufferRef::Untagged {
            ulp_word: 0,
            qn,
            msn,
            mo: 0,
        },
    }
}

/// The DDP/RDMAP header of the Read Request with `msn`: what we send, and
/// what a Terminate refusing a peer's Read Request quotes.
#[inline]
pub(super) fn read_request_header(msn: u32) -> segment::Repr {
    untagged_header(Opcode::ReadRequest, qn::READ_REQUEST, msn)
}

/// The same for the Atomic Request with `msn` (on the Read Requests' queue).
#[inline]
pub(super) fn atomic_request_header(msn: u32) -> segment::Repr {
    untagged_header(Opcode::AtomicRequest, qn::READ_REQUEST, msn)
}
