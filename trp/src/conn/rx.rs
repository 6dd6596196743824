//! Receive: handling a datagram, admitting its PSN, placing its payload
//! after the protection checks, and applying each PSN's effect in order.

use super::complete::Failure;
use super::sgl::{scatter, SgeList};
use super::states::{Closing, Phase};
use super::tx::{atomic_request_header, read_request_header, ReadJob, Reply};
use super::{take_msn, Connection, Event, Msn};
use crate::mr::{self, Access, Memory, Region};
use crate::reliability::{psn_lt, AckAsk, Arrival};
use crate::state;
use crate::terminate::{Cause, Malformed, OperationCode, ProtectionCode, UntaggedCode};
use crate::time::Instant;
use crate::verbs::{Completion, RecvWr, SendOp, WcStatus};
use crate::wire::ddp::{self, BufferRef};
use crate::wire::handshake;
use crate::wire::predict::Datagram;
use crate::wire::rdmap::{
    self, AtomicRequest, AtomicResponse, HeaderCopy, Opcode, ReadRequest, Terminate,
};
use crate::wire::segment::{self, Body};
use crate::wire::trp::{self, SackRanges};
use crate::wire::WireError;
use std::collections::VecDeque;

#[derive(Clone, Debug)]
pub(super) struct RqEntry {
    pub(super) wr_id: u64,
    sges: SgeList,
    len: u64,
}

impl RqEntry {
    pub(super) fn new(wr: &RecvWr<'_>, len: u32) -> RqEntry {
        RqEntry {
            wr_id: wr.wr_id,
            sges: SgeList::new(wr.sges),
            len: u64::from(len),
        }
    }
}

/// Effect of a received PSN that must happen in PSN order.
#[derive(Clone, Debug, Default)]
pub(super) enum RxEvent {
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
    AtomicRequest {
        msn: u32,
        req: AtomicRequest,
    },
    AtomicResponse {
        msn: u32,
        resp: AtomicResponse,
    },
    Terminate(Terminate),
    /// Boxed: rare, and it would triple the size of every slot.
    Fail(Box<Failure>),
    Fin,
}

/// Our posted receives, what numbers the messages we expect, and the
/// effects of PSNs that arrived ahead of a gap.
#[derive(Debug)]
pub(super) struct RecvSide {
    /// Posted receives, oldest first: `rq[i]` takes Send MSN
    /// `expected.send + i`.
    pub(super) rq: VecDeque<RqEntry>,
    /// The next MSN expected on each queue (Terminates are not counted).
    expected: Msn,
    /// In-order effects parked per receive-window slot, made when a PSN with an effect first
    /// arrives ahead of a gap: a connection that never sees one (most, on a clean link) is
    /// spared zeroing the window's worth of slots (tens of KiB) when it is set up.
    parked: Vec<RxEvent>,
    slots: usize,
}

impl RecvSide {
    pub(super) fn new(slots: usize) -> RecvSide {
        RecvSide {
            rq: VecDeque::new(),
            expected: Msn::FIRST,
            parked: Vec::new(),
            slots,
        }
    }

    fn park(&mut self, slot: usize, ev: RxEvent) {
        if self.parked.is_empty() {
            if matches!(ev, RxEvent::None) {
                return;
            }
            self.parked.resize(self.slots, RxEvent::None);
        }
        self.parked[slot] = ev;
    }

    fn unpark(&mut self, slot: usize) -> RxEvent {
        self.parked
            .get_mut(slot)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub(super) fn post(&mut self, wr: &RecvWr<'_>, len: u32) {
        self.rq.push_back(RqEntry::new(wr, len));
    }
}

impl RxEvent {
    #[inline(always)]
    fn fail(f: Failure) -> RxEvent {
        RxEvent::Fail(Box::new(f))
    }

    /// We found `cause` in `segment`: the peer gets a Terminate quoting it.
    #[inline(always)]
    fn detected(cause: Cause, segment: &[u8]) -> RxEvent {
        RxEvent::fail(Failure::detected(Terminate::quoting(cause, segment)))
    }
}

/// The Terminate for a refused Read or Atomic Request. Its DDP header is
/// rebuilt (only the MSN varies in a valid one); a Read Request is quoted
/// whole, as RFC 5040 asks.
#[cold]
#[inline(never)]
fn request_terminate(
    cause: Cause,
    hdr: crate::wire::segment::Repr,
    body_len: usize,
    read: Option<ReadRequest>,
) -> Terminate {
    let mut h = [0u8; ddp::UNTAGGED_HEADER_LEN];
    hdr.emit(&mut h);
    let mut copy = HeaderCopy::from_segment(&h);
    if let Some(c) = copy.as_mut() {
        c.segment_len = (ddp::UNTAGGED_HEADER_LEN + body_len) as u16;
    }
    Terminate {
        ddp_header: copy,
        rdmap_header: read,
        ..Terminate::from(cause)
    }
}

fn read_request_terminate(cause: Cause, msn: u32, rr: ReadRequest) -> Terminate {
    let hdr = read_request_header(msn);
    request_terminate(cause, hdr, rdmap::READ_REQUEST_LEN, Some(rr))
}

fn atomic_request_terminate(cause: Cause, msn: u32) -> Terminate {
    let hdr = atomic_request_header(msn);
    request_terminate(cause, hdr, rdmap::ATOMIC_REQUEST_LEN, None)
}

impl Connection {
    /// Everything `receive_predicted` leaves: kept out of line so the fast
    /// path does not pay for this one's registers and stack frame.
    #[inline(never)]
    pub(super) fn receive_general<M: Memory + ?Sized>(
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
            if let (Some(a), Ok(body)) = (&self.accept, handshake::Repr::parse(payload)) {
                if h.dst_conn == 0 && body.src_conn == self.peer_conn {
                    self.tx.mark_lost(a.psn);
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
                // What the peer says it received before it aborted was delivered: `fail`
                // completes it as such, and flushes only the rest.
                if h.flags & trp::FLAG_ACKS != 0
                    && matches!(self.state, Phase::Rts | Phase::Closing(_))
                {
                    self.tx.on_ack(now, h.ack_psn, &h.sack);
                }
                self.fail(Failure::peer_aborted());
                return Ok(());
            }
            _ => {}
        }
        let ack_request = h.flags & trp::FLAG_ACK_REQUEST != 0;
        if let Phase::Closed(c) = &mut self.state {
            if h.opcode.consumes_psn() || ack_request {
                if c.abort_on_contact {
                    c.abort_pending = true;
                } else {
                    self.rx.request_ack();
                }
            }
            return Ok(());
        }
        self.keepalive.heard(now);
        if !h.opcode.consumes_psn() && ack_request {
            // A keep-alive probe: answer it.
            self.rx.request_ack();
        }
        self.tx.on_ack(now, h.ack_psn, &h.sack);
        self.tx.set_peer_window(u32::from(h.window));
        if self
            .accept
            .as_ref()
            .is_some_and(|a| psn_lt(a.psn, self.tx.una()))
        {
            self.accept = None;
        }
        if h.opcode.consumes_psn() {
            let arrival = self.rx.classify(h.psn);
            match arrival {
                Arrival::New { in_order } if !matches!(self.state, Phase::Error(_)) => {
                    let ev = match h.opcode {
                        trp::Opcode::Data => self.place(mem, in_order, payload),
                        trp::Opcode::Fin => Some(RxEvent::Fin),
                        _ => Some(RxEvent::None),
                    };
                    let Some(ev) = ev else {
                        self.stats.rx_deferred += 1;
                        return Ok(());
                    };
                    let last = h.opcode == trp::Opcode::Data
                        && payload.first().is_some_and(|c| c & ddp::FLAG_LAST != 0);
                    let ack = AckAsk::of(h.flags, last);
                    if self.rx.take_in_order(h.psn) {
                        // Nothing waits behind it: its effect applies now.
                        self.rx.on_packet(now, arrival, ack);
                        if !matches!(ev, RxEvent::None)
                            && matches!(self.state, Phase::Rts | Phase::Closing(_))
                        {
                            self.deliver_event(mem, ev);
                        }
                    } else {
                        self.rx.mark(h.psn);
                        let slot = self.rx.slot(h.psn);
                        self.recv.park(slot, ev);
                        self.rx.on_packet(now, arrival, ack);
                        self.deliver(mem);
                    }
                }
                Arrival::New { .. } => {}
                _ => {
                    self.stats.rx_duplicates += 1;
                    self.rx.on_packet(now, arrival, AckAsk::default());
                }
            }
            if h.opcode == trp::Opcode::Fin {
                // No data of ours follows a FIN to carry its ACK (`Config::ack_hold`), and
                // the connection may be over before the hold is.
                self.rx.request_ack();
            }
        }
        self.progress();
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
    pub(super) fn receive_predicted<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        mem: &mut M,
        d: &Datagram<'_>,
        region: &mut Option<(u32, Region)>,
    ) -> bool {
        let ours = d.dst_conn == self.local_conn
            && self.cfg.header_prediction
            && matches!(self.state, Phase::Rts)
            && self.accept.is_none();
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
                let i = msn.wrapping_sub(self.recv.expected.send) as usize;
                let end = u64::from(mo) + d.payload.len() as u64;
                if self.recv.rq.get(i).is_none_or(|e| end > e.len) || !self.admit(now, d) {
                    return false;
                }
                scatter(mem, &self.recv.rq[i].sges, u64::from(mo), d.payload);
                if d.seg.last {
                    let ev = RxEvent::Recv {
                        msn,
                        invalidate: None,
                        solicited: d.seg.opcode.solicited(),
                        len: end as u32,
                        imm: None,
                    };
                    self.deliver_event(mem, ev);
                }
            }
        }
        self.progress();
        true
    }

    /// The receive fast path's bookkeeping once the segment may be placed:
    /// takes its PSN if it is the next expected with nothing held above
    /// it (else changes nothing and returns false), then what the general
    /// path does for any packet of the connection.
    #[inline(always)]
    fn admit(&mut self, now: Instant, d: &Datagram<'_>) -> bool {
        if !self
            .rx
            .accept_next(now, d.psn, AckAsk::of(d.flags, d.seg.last))
        {
            return false;
        }
        self.stats.rx_packets += 1;
        self.keepalive.heard(now);
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
            Err(error) => {
                let t = Terminate::from(Malformed {
                    error,
                    segment: payload,
                });
                return Some(RxEvent::fail(Failure::detected(t)));
            }
        };
        let pd = self.cfg.pd;
        match (seg.buffer, body) {
            (BufferRef::Tagged { stag, to }, Body::Data(data)) => {
                let response = seg.opcode == Opcode::ReadResponse;
                if response && self.sq.reads_out.is_empty() {
                    let cause = Cause::RemoteOperation(OperationCode::UnexpectedOpcode);
                    return Some(RxEvent::detected(cause, payload));
                }
                let need = if response {
                    Access::LOCAL_WRITE
                } else {
                    Access::REMOTE_WRITE
                };
                match mr::check(mem, stag, pd, to, data.len() as u64, need) {
                    Err(e) => Some(RxEvent::detected(Cause::from(e), payload)),
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
                let d = msn.wrapping_sub(self.recv.expected.send);
                if self.cfg.srq && in_order && d as usize == self.recv.rq.len() {
                    // A message starts: it takes the shared queue's oldest receive.
                    if let Some(e) = mem.srq().and_then(|q| q.take()) {
                        self.recv.rq.push_back(e);
                    }
                }
                if d as usize >= self.recv.rq.len() {
                    if !in_order && d < 1 << 16 {
                        return None;
                    }
                    let code = if d < 1 << 16 {
                        UntaggedCode::NoBuffer
                    } else {
                        UntaggedCode::MsnRange
                    };
                    return Some(RxEvent::detected(Cause::DdpUntagged(code), payload));
                }
                let e = &self.recv.rq[d as usize];
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
                            let t = Terminate::quoting(
                                Cause::DdpUntagged(UntaggedCode::TooLong),
                                payload,
                            );
                            let f = Failure::detected(t).with_recv_status(WcStatus::LocalLength);
                            return Some(RxEvent::fail(f));
                        }
                        scatter(mem, &e.sges, u64::from(mo), data);
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
            (BufferRef::Untagged { msn, .. }, Body::AtomicRequest(req)) => {
                Some(RxEvent::AtomicRequest { msn, req })
            }
            (BufferRef::Untagged { msn, .. }, Body::AtomicResponse(resp)) => {
                Some(RxEvent::AtomicResponse { msn, resp })
            }
            (_, Body::Terminate(t)) => Some(RxEvent::Terminate(t)),
            _ => {
                let cause = Cause::RemoteOperation(OperationCode::UnexpectedOpcode);
                Some(RxEvent::detected(cause, payload))
            }
        }
    }

    /// Applies in-order effects of every PSN that is now contiguous.
    #[inline]
    fn deliver<M: Memory + ?Sized>(&mut self, mem: &mut M) {
        while let Some(psn) = self.rx.pop_in_order() {
            let slot = self.rx.slot(psn);
            let ev = self.recv.unpark(slot);
            // Most PSNs (all but the last segment of a message) have no
            // in-order effect: keep their path free of the rest.
            if matches!(ev, RxEvent::None) || !matches!(self.state, Phase::Rts | Phase::Closing(_))
            {
                continue;
            }
            self.deliver_event(mem, ev);
        }
    }

    /// Applies one PSN's in-order effect.
    #[inline(never)]
    fn deliver_event<M: Memory + ?Sized>(&mut self, mem: &mut M, ev: RxEvent) {
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
                if msn != self.recv.expected.send || self.recv.rq.is_empty() {
                    let cause = Cause::DdpUntagged(UntaggedCode::MsnRange);
                    self.fail(Failure::detected(cause.into()));
                    return;
                }
                if let Some(stag) = invalidate {
                    if mem.invalidate(stag, self.cfg.pd).is_err() {
                        let cause = Cause::RemoteOperation(OperationCode::StagCannotInvalidate);
                        self.fail(Failure::detected(cause.into()));
                        return;
                    }
                }
                let e = self
                    .recv
                    .rq
                    .pop_front()
                    .expect("placement checked the receive exists");
                take_msn(&mut self.recv.expected.send);
                self.cq.push_back(Completion::received(
                    e.wr_id, len, imm, invalidate, solicited,
                ));
            }
            RxEvent::ReadRequest { msn, rr } => {
                let code = if msn != self.recv.expected.read_request {
                    UntaggedCode::MsnRange
                } else if self.responses.len() >= usize::from(self.cfg.ird) {
                    UntaggedCode::NoBuffer
                } else if let Err(e) = mr::check(
                    mem,
                    rr.src_stag,
                    self.cfg.pd,
                    rr.src_to,
                    u64::from(rr.size),
                    Access::REMOTE_READ,
                ) {
                    let cause = Cause::RemoteProtection(ProtectionCode::from(e));
                    self.fail(Failure::detected(read_request_terminate(cause, msn, rr)));
                    return;
                } else {
                    take_msn(&mut self.recv.expected.read_request);
                    self.responses.push_back(Reply::Read(ReadJob {
                        src_addr: rr.src_to,
                        sink_stag: rr.sink_stag,
                        sink_to: rr.sink_to,
                        size: rr.size,
                        off: 0,
                    }));
                    return;
                };
                let t = read_request_terminate(Cause::DdpUntagged(code), msn, rr);
                self.fail(Failure::detected(t));
            }
            RxEvent::ReadResponseDone => {
                let Some(&seq) = self.sq.reads_out.front() else {
                    return;
                };
                match self.sq.get_mut(seq) {
                    Some(e) if matches!(e.op, SendOp::RdmaRead { .. }) => e.reads_done += 1,
                    // The response to an atomic of ours ended as a Read's.
                    Some(_) => {
                        let cause = Cause::RemoteOperation(OperationCode::UnexpectedOpcode);
                        self.fail(Failure::detected(cause.into()));
                        return;
                    }
                    None => {}
                }
                self.sq.reads_out.pop_front();
            }
            RxEvent::AtomicRequest { msn, req } => self.execute_atomic(mem, msn, req),
            RxEvent::AtomicResponse { msn, resp } => {
                let ours = msn == self.recv.expected.atomic_response
                    && self
                        .sq
                        .reads_out
                        .front()
                        .and_then(|&seq| self.sq.get(seq))
                        .is_some_and(|e| e.is_atomic_request(resp.request_id));
                if !ours {
                    let cause = Cause::RemoteOperation(OperationCode::UnexpectedOpcode);
                    self.fail(Failure::detected(cause.into()));
                    return;
                }
                take_msn(&mut self.recv.expected.atomic_response);
                let seq = self.sq.reads_out.pop_front().expect("checked above");
                if let Some(e) = self.sq.get_mut(seq) {
                    e.place_atomic_result(mem, resp.original);
                }
            }
            RxEvent::Terminate(t) => self.fail(Failure::reported(t)),
            RxEvent::Fail(f) => self.fail(*f),
            RxEvent::Fin => {
                self.events.push_back(Event::PeerClosed);
                match &mut self.state {
                    Phase::Rts => {
                        let closing = Closing {
                            fin_psn: None,
                            peer_fin: true,
                        };
                        self.goto::<state::Rts, state::Closing>(Phase::Closing(closing));
                    }
                    Phase::Closing(c) => c.peer_fin = true,
                    // Effects apply only in Rts and Closing.
                    Phase::Error(_) | Phase::Closed(_) => {}
                }
            }
        }
    }

    /// Runs the peer's atomic, in order with everything else it sent,
    /// once its checks pass, and queues the response with the value found.
    /// It runs only here, once per request: TRP delivers each PSN once, and
    /// a lost response is retransmitted with that value (`Src::AtomicResp`).
    #[inline(never)]
    fn execute_atomic<M: Memory + ?Sized>(&mut self, mem: &mut M, msn: u32, req: AtomicRequest) {
        // RFC 7306 sections 5.2.1 and 8.2: an AOpCode it does not know, or a
        // misaligned target, ends the stream.
        let cause = if msn != self.recv.expected.read_request {
            Cause::DdpUntagged(UntaggedCode::MsnRange)
        } else if self.responses.len() >= usize::from(self.cfg.ird) {
            Cause::DdpUntagged(UntaggedCode::NoBuffer)
        } else if let Err(e) =
            mr::check(mem, req.stag, self.cfg.pd, req.to, 8, Access::REMOTE_ATOMIC)
        {
            Cause::RemoteProtection(ProtectionCode::from(e))
        } else if !req.to.is_multiple_of(8) {
            Cause::RemoteOperation(OperationCode::CatastrophicStream)
        } else if let Some(op) = req.op() {
            take_msn(&mut self.recv.expected.read_request);
            let original = mem.atomic(req.to, op);
            self.responses.push_back(Reply::Atomic(AtomicResponse {
                request_id: req.request_id,
                original,
            }));
            return;
        } else {
            Cause::RemoteOperation(OperationCode::UnexpectedOpcode)
        };
        self.fail(Failure::detected(atomic_request_terminate(cause, msn)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parked_slots_are_made_by_the_first_effect_ahead_of_a_gap() {
        let mut r = RecvSide::new(1024);
        r.park(5, RxEvent::None);
        assert!(r.parked.is_empty(), "a PSN without an effect parks nothing");
        assert!(matches!(r.unpark(5), RxEvent::None));
        r.park(7, RxEvent::Fin);
        assert_eq!(r.parked.len(), 1024);
        assert!(matches!(r.unpark(5), RxEvent::None));
        assert!(matches!(r.unpark(7), RxEvent::Fin));
        assert!(matches!(r.unpark(7), RxEvent::None), "taken once");
    }
}
