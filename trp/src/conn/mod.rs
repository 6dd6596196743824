//! An established connection: the RDMAP/DDP engine on top of TRP.
//!
//! Inputs: datagrams (`handle_datagram`), time (`handle_timeout`), work
//! requests (`post_send`, `post_recv`). Outputs: datagrams
//! (`poll_transmit`), completions (`poll_completion`), connection events
//! (`poll_event`) and the next deadline (`poll_timeout`). Payload is placed
//! straight into the caller's memory through [`Memory`] after the
//! protection checks; nothing is allocated per packet.
//!
//! The public calls are here; the work they start lives in rooms of its
//! own: `tx` builds and sends segments, `rx` admits and places received
//! ones, `complete` finishes work requests and fails the connection,
//! `states` holds what each QP state owns, `keepalive` watches a peer while
//! nothing of ours is unacknowledged, `sgl` copies between scatter/gather
//! lists and memory.
//! Errors sent to the peer are built in [`crate::terminate`].

mod complete;
mod keepalive;
mod rx;
mod sgl;
pub mod srq;
mod states;
mod tx;

use crate::config::Config;
use crate::mr::{Access, Memory};
use crate::reliability::{Params, Receiver, Sender, SenderStats, Timeout};
use crate::state::{self, QpState};
use crate::time::Instant;
use crate::verbs::{Completion, PostError, RecvWr, SendOp, SendWr, WcStatus};
use crate::wire::rdmap::Terminate;
use crate::wire::WireError;
use crate::wire::{crc, predict, trp};
use complete::Failure;
use keepalive::KeepAlive;
use rx::RecvSide;
use states::{Closed, Phase};
use std::collections::VecDeque;
use tx::{Reply, SendQueue, TxKind};

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

/// The longest an ACK the peer asked for waits for the reply to carry it: a peer whose
/// request is answered later gets the ACK alone, long before its retransmission timer.
const LONGEST_HOLD: core::time::Duration = core::time::Duration::from_millis(2);

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
    /// Datagrams dropped because their CRC32C trailer did not match, or
    /// was missing where the connection uses it (the sender retransmits).
    pub rx_crc_errors: u64,
    pub tx_acks: u64,
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
    /// Every datagram carries the CRC32C trailer (`wire::crc`).
    pub crc: bool,
}

/// The next MSN of each untagged queue (RFC 5040 section 5.1: each
/// numbers its messages from 1), named by the queue (`qn::*`).
#[derive(Clone, Copy, Debug)]
struct Msn {
    send: u32,
    /// Read and Atomic Requests (RFC 7306 puts both on queue 1).
    read_request: u32,
    terminate: u32,
    atomic_response: u32,
}

impl Msn {
    const FIRST: Msn = Msn {
        send: 1,
        read_request: 1,
        terminate: 1,
        atomic_response: 1,
    };
}

/// Returns the MSN `counter` holds and moves it to the next.
#[inline(always)]
fn take_msn(counter: &mut u32) -> u32 {
    let msn = *counter;
    *counter = msn.wrapping_add(1);
    msn
}

/// The acceptor's Accept until the requester acknowledges it: it takes
/// the connection's first PSN and is repeated like any packet, so it can
/// outlive Rts (a close or a failure does not make the requester need it
/// less).
#[derive(Debug)]
struct PendingAccept {
    body: AcceptBody,
    psn: u32,
    sent: bool,
}

#[derive(Debug)]
pub struct Connection {
    cfg: Config,
    state: Phase,
    local_conn: u32,
    peer_conn: u32,
    /// Largest datagram we send, trailer included...
    datagram: usize,
    /// ...and the TRP packet inside it.
    room: usize,
    /// Our datagrams are sealed and the peer's must be (`wire::crc`).
    crc: bool,
    accept: Option<PendingAccept>,
    tx: Sender<TxKind>,
    rx: Receiver,
    sq: SendQueue,
    recv: RecvSide,
    /// The peer's RDMA Reads and atomics we answer (IRD of them at most),
    /// in the order they came.
    responses: VecDeque<Reply>,
    cq: VecDeque<Completion>,
    events: VecDeque<Event>,
    keepalive: KeepAlive,
    stats: Stats,
}

impl Connection {
    /// `heard_at`: when the peer was last heard from, if it has been (a
    /// requester's connection exists once the Accept arrived; an
    /// acceptor's before the peer has said anything of it).
    pub(crate) fn new(
        cfg: Config,
        n: Negotiated,
        accept: Option<AcceptBody>,
        heard_at: Option<Instant>,
    ) -> Connection {
        let params = Params {
            initial_rto: cfg.initial_rto,
            min_rto: cfg.min_rto,
            max_rto: cfg.max_rto,
            max_retries: cfg.max_retries,
            min_give_up: cfg.min_give_up,
            initial_cwnd: cfg.initial_cwnd,
            max_cwnd: cfg.max_cwnd.max(1),
            ack_delay_ns: cfg.ack_delay.as_nanos().min(u128::from(u64::MAX)) as u64,
            ack_hold_ns: LONGEST_HOLD.max(cfg.ack_hold).as_nanos() as u64,
        };
        let rx = Receiver::new(n.rcv_first, cfg.recv_window, cfg.ack_delay, cfg.ack_hold);
        let datagram = usize::from(
            cfg.max_datagram
                .min(n.peer_max_datagram)
                .max(crate::config::MIN_DATAGRAM),
        );
        Connection {
            state: Phase::Rts,
            local_conn: n.local_conn,
            peer_conn: n.peer_conn,
            datagram,
            room: datagram - crc::trailer_len(n.crc),
            crc: n.crc,
            accept: accept.map(|body| PendingAccept {
                body,
                psn: n.snd_first,
                sent: false,
            }),
            tx: Sender::new(params, n.snd_first, u32::from(n.peer_window)),
            recv: RecvSide::new(rx.slots()),
            rx,
            sq: SendQueue::new(usize::from(cfg.ord.min(n.peer_ird))),
            responses: VecDeque::new(),
            cq: VecDeque::new(),
            events: VecDeque::new(),
            keepalive: KeepAlive::new(heard_at),
            stats: Stats::default(),
            cfg,
        }
    }

    pub fn state(&self) -> QpState {
        self.state.qp()
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
    /// The peer's connection id (the destination of what we send).
    pub fn peer_conn(&self) -> u32 {
        self.peer_conn
    }
    /// The next PSN we expect from the peer (our cumulative ACK).
    pub fn expected_psn(&self) -> u32 {
        self.rx.nxt()
    }
    /// The PSN whose arrival completes a receive at once when it carries the last segment
    /// of a Send or an Immediate Data: the next one in order, while a receive is posted for
    /// the next message and the QP is in RTS; None when no arrival can. A direct
    /// connection tells its socket's filter, which tells urdma.ko's bell
    /// (docs/kernel-abi.md, "Completion events").
    pub fn bell_psn(&self) -> Option<u32> {
        (matches!(self.state, Phase::Rts) && !self.cfg.srq && !self.recv.rq.is_empty())
            .then(|| self.rx.nxt())
    }
    /// Whether an ACK from the peer that carries nothing else can wait unread for whatever
    /// wakes the caller next: nobody is waiting for one. In Rts, with every send request
    /// on the wire, none signaled, none waiting for a response and the send queue at most
    /// half full, an ACK only lets go of what the peer has: no completion, no window that
    /// holds a request back, no close. A direct connection tells its socket's filter, so
    /// that such an ACK wakes nobody; the retransmission timer still reads it before it
    /// fires, because callers receive before they run timers.
    pub fn acks_can_wait(&self) -> bool {
        matches!(self.state, Phase::Rts)
            && self.accept.is_none()
            && self.sq.cursor == self.sq.entries.len()
            && self.sq.entries.len() * 2 <= self.cfg.max_send_wr
            && self
                .sq
                .entries
                .iter()
                .all(|e| !e.signaled && !e.op.awaits_response())
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
        self.sq.ord
    }

    pub(crate) fn request_ack(&mut self) {
        self.rx.request_ack();
    }

    /// Sends at the next transmit an ACK that is held for a reply (`Config::ack_hold`): for
    /// a caller that knows no reply is coming soon (the application is not there to post
    /// one), so that the peer's completion does not wait for the hold.
    pub fn release_held_ack(&mut self) {
        self.rx.release_held();
    }

    /// The retransmission timeout in force.
    pub fn rto(&self) -> core::time::Duration {
        self.tx.rto()
    }

    /// The ACK held for a reply (`Config::ack_hold`) waits for the application to see what
    /// it answers, not only the hold from its arrival: for a caller that delivered a receive
    /// completion the application has yet to poll. An application woken from a completion
    /// channel under load often polls later than the hold, and the ACK that went alone woke
    /// the peer, and preempted the reply. Bounded by a quarter of the RTO (at most 2 ms), so
    /// that the peer's retransmission timer never runs out on it;
    /// [`Connection::reader_saw`] ends the wait.
    pub fn hold_ack_for_reader(&mut self, now: Instant) {
        self.rx.hold_until(now + self.reader_bound());
    }

    /// Whether an ACK the peer asked for is being held for a reply (`Config::ack_hold`).
    pub fn holds_ack(&self) -> bool {
        self.rx.holds()
    }

    /// The longest an ACK waits for the reply of an application that has yet to see what
    /// it answers ([`Connection::hold_ack_for_reader`]): a quarter of the RTO, at most
    /// `LONGEST_HOLD` (2 ms).
    pub fn reader_bound(&self) -> core::time::Duration {
        (self.tx.rto() / 4).min(LONGEST_HOLD)
    }

    /// How long a held ACK waits for the reply once the application has seen what it
    /// answers: `hold`, measured by the caller for an application that takes that long to
    /// reply, never less than `Config::ack_hold` nor more than `LONGEST_HOLD`. Nothing
    /// changes on a connection configured with no hold.
    pub fn set_ack_hold(&mut self, hold: core::time::Duration) {
        if self.cfg.ack_hold.is_zero() {
            return;
        }
        let most = LONGEST_HOLD.max(self.cfg.ack_hold);
        self.rx.set_hold(hold.clamp(self.cfg.ack_hold, most));
    }

    /// The application has seen what a held ACK answers (it polled the receive completion,
    /// or made its next call after a Write was placed): the ACK waits `Config::ack_hold`
    /// from now at most.
    pub fn reader_saw(&mut self, now: Instant) {
        self.rx.hold_from(now);
    }

    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.cq.pop_front()
    }
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest time `handle_timeout` has something to do.
    ///
    /// Asked on every round of a caller's progress, twice: written out rather than as a
    /// minimum over an iterator of three, which cost several times as many instructions.
    pub fn poll_timeout(&self) -> Option<Instant> {
        fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
            match (a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, None) => x,
                (None, y) => y,
            }
        }
        earlier(
            earlier(self.tx.rto_deadline(), self.rx.ack_deadline()),
            self.probe_deadline(),
        )
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.rx.on_timeout(now);
        if self.probe_deadline().is_some_and(|t| t <= now) {
            if self.keepalive.probes() >= self.cfg.max_retries
                && self.keepalive.silent_for(now) >= self.cfg.min_give_up
            {
                self.fail(Failure::retry_exceeded());
                return;
            }
            self.keepalive
                .probe_sent(now, self.tx.rto(), self.cfg.max_rto);
            self.rx.request_ack();
        }
        if self.tx.on_timeout(now) == Timeout::RetryExceeded {
            match &self.state {
                // Only our FIN is unacknowledged, and the peer's has come: every byte
                // both ways was delivered. The peer has most likely closed already and
                // its last ACK was lost (its flow, gone with it, cannot repeat it): the
                // connection closed, it did not fail.
                Phase::Closing(c) if c.peer_fin && c.fin_psn == Some(self.tx.una()) => {
                    self.tx.clear();
                    self.finish_close();
                }
                Phase::Rts | Phase::Closing(_) => self.fail(Failure::retry_exceeded()),
                Phase::Error(_) => {
                    self.tx.clear();
                    self.sq.entries.clear();
                    self.goto::<state::Error, state::Closed>(Phase::Closed(Closed::default()));
                }
                Phase::Closed(_) => {}
            }
        }
    }

    /// When the keep-alive probes next, if the peer stays silent. Only
    /// while nothing of ours is unacknowledged: otherwise the
    /// retransmission timer already notices a silent peer. Awaited Read
    /// Responses are due soon, so their silence is probed after one
    /// retransmission timeout; an idle connection's after
    /// `Config::keepalive`.
    #[inline(always)]
    fn probe_deadline(&self) -> Option<Instant> {
        if !matches!(self.state, Phase::Rts | Phase::Closing(_)) || self.tx.outstanding() != 0 {
            return None;
        }
        let quiet = if self.sq.reads_out.is_empty() {
            self.cfg.keepalive
        } else {
            self.tx.rto()
        };
        self.keepalive.deadline(quiet)
    }

    /// How many more send work requests the send queue takes now.
    pub fn send_queue_room(&self) -> usize {
        self.cfg.max_send_wr.saturating_sub(self.sq.entries.len())
    }

    /// Queues a send work request. In Error/Closed it completes at once
    /// with `Flush`, as verbs specifies.
    pub fn post_send<M: Memory + ?Sized>(
        &mut self,
        mem: &M,
        wr: &SendWr<'_>,
    ) -> Result<(), PostError> {
        match self.state {
            Phase::Rts => {}
            Phase::Closing(_) => return Err(PostError::State),
            Phase::Error(_) | Phase::Closed(_) => {
                self.cq
                    .push_back(Completion::send(wr.wr_id, &wr.op, WcStatus::Flush, 0));
                return Ok(());
            }
        }
        if self.sq.entries.len() >= self.cfg.max_send_wr {
            return Err(PostError::QueueFull);
        }
        let need = match wr.op {
            SendOp::RdmaRead { .. } | SendOp::Atomic { .. } => Access::LOCAL_WRITE,
            _ => Access::NONE,
        };
        let mut len = sgl::check_sges(mem, self.cfg.pd, wr.sges, need)?;
        if let SendOp::Atomic { .. } = wr.op {
            // Its result takes the first 8 bytes, and its completion says 8.
            if len < 8 {
                return Err(PostError::AtomicResult);
            }
            len = 8;
        }
        self.sq.push(wr, len);
        if let SendOp::Local(_) = wr.op {
            // With nothing before it left to issue, it waits only for what
            // was sent so far, and may be complete already.
            self.sq.pass_locals(self.tx.nxt().wrapping_sub(1));
            self.progress();
        }
        Ok(())
    }

    pub fn post_recv<M: Memory + ?Sized>(
        &mut self,
        mem: &M,
        wr: &RecvWr<'_>,
    ) -> Result<(), PostError> {
        if matches!(self.state, Phase::Error(_) | Phase::Closed(_)) {
            self.cq
                .push_back(Completion::recv_failed(wr.wr_id, WcStatus::Flush));
            return Ok(());
        }
        // Its receives come from its shared receive queue.
        if self.cfg.srq {
            return Err(PostError::State);
        }
        if self.recv.rq.len() >= self.cfg.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        let len = sgl::check_sges(mem, self.cfg.pd, wr.sges, Access::LOCAL_WRITE)?;
        self.recv.post(wr, len);
        Ok(())
    }

    /// Graceful close: outstanding work finishes, then FIN is exchanged.
    pub fn close(&mut self) {
        if matches!(self.state, Phase::Rts) {
            self.goto::<state::Rts, state::Closing>(Phase::Closing(Default::default()));
        }
    }

    /// Abortive close: an Abort packet goes out, all work is flushed.
    /// Failing needs no time: `_now` stays for the callers' sake, as with
    /// every other input.
    pub fn abort(&mut self, _now: Instant) {
        if matches!(self.state, Phase::Rts | Phase::Closing(_)) {
            self.fail(Failure::aborted());
        }
    }

    /// The caller lets go of its memory while the connection finishes its
    /// close (the QP is destroyed; its application may free its buffers):
    /// what is still to be sent is copied out of that memory, and nothing
    /// will land in it (posted receives are forgotten, and so are the
    /// buffers Read and Atomic results were for). False, and nothing
    /// changed, if the peer is reading that memory (a Read Response is
    /// queued or unacknowledged): only the memory has those bytes, and the
    /// caller drops the connection instead.
    pub fn release_memory<M: Memory + ?Sized>(&mut self, mem: &M) -> bool {
        let serves_reads = self.responses.iter().any(|r| matches!(r, Reply::Read(_)))
            || self.tx.iter().any(TxKind::reads_local_memory);
        if serves_reads {
            return false;
        }
        self.sq.release_memory(mem);
        self.recv.rq.clear();
        true
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
                return Some(self.seal(buf, len[0]));
            }
        }
        let len = self.transmit_general(now, mem, buf)?;
        Some(self.seal(buf, len))
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
                for (b, len) in bufs[i..i + k].iter_mut().zip(&mut lens[i..i + k]) {
                    *len = self.seal(b.as_mut(), *len);
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

    /// Processes one received datagram (the UDP payload). Malformed,
    /// corrupted (its CRC32C trailer wrong or missing, `rx_crc_errors`) or
    /// foreign datagrams are counted and dropped; they never panic.
    pub fn handle_datagram<M: Memory + ?Sized>(
        &mut self,
        now: Instant,
        mem: &mut M,
        bytes: &[u8],
    ) -> Result<(), WireError> {
        let bytes = self.open(bytes)?;
        if let Some(d) = predict::parse(bytes) {
            if self.receive_predicted(now, mem, &d, &mut None) {
                return Ok(());
            }
        }
        self.receive_general(now, mem, bytes)
    }

    /// `handle_datagram` for each of a burst of received datagrams, in
    /// order, as a driver receiving bursts calls it. Malformed and corrupted
    /// datagrams are dropped and counted (`stats().rx_malformed`,
    /// `rx_crc_errors`) as by `handle_datagram`; returns how many there were.
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
            let Ok(bytes) = self.open(d.as_ref()) else {
                malformed += 1;
                continue;
            };
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

    /// A datagram we built (`len` bytes in `buf`), sealed if the connection
    /// uses the trailer: the buffers hold `max_datagram()` bytes, and the
    /// packets inside are built to leave room for it.
    #[inline]
    fn seal(&self, buf: &mut [u8], len: usize) -> usize {
        if self.crc {
            crc::seal(buf, len)
        } else {
            len
        }
    }

    /// A received datagram without its trailer, or why it is dropped: the
    /// trailer does not match, or it is missing where the connection uses
    /// it. Only a repeated ConnectRequest may come unsealed then (the
    /// requester seals only if it asked for the trailer itself); all it can
    /// do is have our Accept sent again.
    #[inline]
    fn open<'a>(&mut self, bytes: &'a [u8]) -> Result<&'a [u8], WireError> {
        let e = match crc::open(bytes) {
            Ok((b, true)) => return Ok(b),
            Ok((b, false))
                if !self.crc
                    || b.get(trp::field::OPCODE) == Some(&(trp::Opcode::ConnectRequest as u8)) =>
            {
                return Ok(b)
            }
            Ok(_) => WireError::Unsealed,
            Err(e) => e,
        };
        self.stats.rx_crc_errors += 1;
        Err(e)
    }
}
