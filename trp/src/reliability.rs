//! TRP reliability: PSN bookkeeping, acknowledgements, loss recovery,
//! RTT estimation (RFC 6298) and congestion control (AIMD), independent of
//! what the segments carry.

use crate::time::Instant;
use crate::wire::trp::SackRanges;
use core::time::Duration;
use std::collections::VecDeque;

/// `a < b` in 32-bit serial arithmetic.
#[inline(always)]
pub fn psn_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a <= b` in 32-bit serial arithmetic.
#[inline(always)]
pub fn psn_le(a: u32, b: u32) -> bool {
    !psn_lt(b, a)
}

/// Segments sent after a segment that must be delivered before it is
/// declared lost: tolerates this much reordering without a retransmission.
const REORDER_SEGMENTS: u64 = 3;
/// RFC 6298 clock granularity G.
const GRANULARITY: u64 = 1_000;

#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub initial_rto: Duration,
    pub min_rto: Duration,
    pub max_rto: Duration,
    pub max_retries: u32,
    /// The retry limit fails the connection only once this much time has
    /// also passed since the first of the consecutive timeouts.
    pub min_give_up: Duration,
    pub initial_cwnd: u32,
    pub max_cwnd: u32,
}

#[derive(Debug)]
struct Seg<K> {
    kind: K,
    sent_at: Instant,
    xmit: u64,
    retrans: u16,
    sacked: bool,
    lost: bool,
}

/// Sender half: every PSN from `una` to `nxt` with what it carries.
#[derive(Debug)]
pub struct Sender<K> {
    p: Params,
    una: u32,
    nxt: u32,
    segs: VecDeque<Seg<K>>,
    lost_q: VecDeque<u32>,
    sacked: u32,
    lost: u32,
    /// Outstanding records with `retrans > 0`. While it, `sacked` and
    /// `lost` are all zero, transmission order is PSN order and an ACK can
    /// retire records without visiting each.
    retransmitted: u32,
    xmit_count: u64,
    delivered_xmit: u64,
    cwnd: u32,
    cwnd_acc: u32,
    ssthresh: u32,
    /// While set, further losses before this PSN do not cut the window again.
    recovery_end: Option<u32>,
    /// After a timeout the window slow-starts back even during recovery.
    rto_recovery: bool,
    peer_window: u32,
    srtt: Option<u64>,
    rttvar: u64,
    rto: u64,
    /// `p.min_rto` and `p.max_rto` in nanoseconds, converted once.
    min_rto_ns: u64,
    max_rto_ns: u64,
    retries: u32,
    /// When the first of the current run of consecutive timeouts fired.
    silent_since: Option<Instant>,
    rto_deadline: Option<Instant>,
    /// After a timeout with a single packet outstanding, that packet is sent
    /// twice: one probe and its ACK both survive a 30 % loss path only half
    /// the time, which would exhaust the retry limit far too often.
    probe_again: Option<u32>,
    /// Counters for tests and statistics.
    pub stats: SenderStats,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    pub sent: u64,
    pub retransmitted: u64,
    pub timeouts: u64,
    pub fast_recoveries: u64,
    pub max_in_flight: u32,
}

/// What a timeout did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    None,
    Retransmit,
    RetryExceeded,
}

impl<K> Sender<K> {
    pub fn new(p: Params, first_psn: u32, peer_window: u32) -> Self {
        let cwnd = p.initial_cwnd.max(1);
        Sender {
            una: first_psn,
            nxt: first_psn,
            segs: VecDeque::new(),
            lost_q: VecDeque::new(),
            sacked: 0,
            lost: 0,
            retransmitted: 0,
            xmit_count: 0,
            delivered_xmit: 0,
            cwnd,
            cwnd_acc: 0,
            ssthresh: p.max_cwnd,
            recovery_end: None,
            rto_recovery: false,
            peer_window: peer_window.max(1),
            srtt: None,
            rttvar: 0,
            rto: p.initial_rto.as_nanos() as u64,
            min_rto_ns: p.min_rto.as_nanos() as u64,
            max_rto_ns: p.max_rto.as_nanos() as u64,
            retries: 0,
            silent_since: None,
            rto_deadline: None,
            probe_again: None,
            stats: SenderStats::default(),
            p,
        }
    }

    #[inline]
    pub fn una(&self) -> u32 {
        self.una
    }
    #[inline]
    pub fn nxt(&self) -> u32 {
        self.nxt
    }
    #[inline]
    pub fn outstanding(&self) -> u32 {
        self.nxt.wrapping_sub(self.una)
    }
    pub fn cwnd(&self) -> u32 {
        self.cwnd
    }
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt.map(Duration::from_nanos)
    }
    pub fn rto(&self) -> Duration {
        Duration::from_nanos(self.rto)
    }
    pub fn rto_deadline(&self) -> Option<Instant> {
        self.rto_deadline
    }
    /// Segments believed to be in the network (RFC 6675 "pipe").
    #[inline]
    pub fn pipe(&self) -> u32 {
        self.outstanding() - self.sacked - self.lost
    }
    #[inline]
    pub fn set_peer_window(&mut self, w: u32) {
        self.peer_window = w.max(1);
    }

    /// Whether a new PSN may be sent now: inside the peer's receive window
    /// and the congestion window.
    #[inline]
    pub fn can_send_new(&self) -> bool {
        self.room() > 0
    }

    /// How many new PSNs may be sent now, one after the other: each
    /// `push` takes one place in both windows.
    #[inline]
    pub fn room(&self) -> u32 {
        let peer = self.peer_window.min(self.p.max_cwnd);
        let flow = peer.saturating_sub(self.outstanding());
        flow.min(self.cwnd.saturating_sub(self.pipe()))
    }

    #[inline]
    pub fn seg(&self, psn: u32) -> Option<&K> {
        let i = psn.wrapping_sub(self.una) as usize;
        self.segs.get(i).map(|s| &s.kind)
    }

    pub fn iter(&self) -> impl Iterator<Item = &K> {
        self.segs.iter().map(|s| &s.kind)
    }

    #[inline]
    fn arm(&mut self, now: Instant) {
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(Instant(now.0.saturating_add(self.rto)));
        }
    }

    /// Sends a new PSN carrying `kind`; returns the PSN.
    #[inline]
    pub fn push(&mut self, kind: K, now: Instant) -> u32 {
        let psn = self.nxt;
        self.xmit_count += 1;
        self.segs.push_back(Seg {
            kind,
            sent_at: now,
            xmit: self.xmit_count,
            retrans: 0,
            sacked: false,
            lost: false,
        });
        self.nxt = self.nxt.wrapping_add(1);
        self.stats.sent += 1;
        self.stats.max_in_flight = self.stats.max_in_flight.max(self.outstanding());
        self.arm(now);
        psn
    }

    /// The next PSN to retransmit, if any is marked lost and the congestion
    /// window allows it.
    #[inline]
    pub fn next_retransmit(&mut self, now: Instant) -> Option<u32> {
        while let Some(&psn) = self.lost_q.front() {
            let i = psn.wrapping_sub(self.una) as usize;
            let live = psn_le(self.una, psn)
                && psn_lt(psn, self.nxt)
                && self.segs.get(i).is_some_and(|s| s.lost && !s.sacked);
            if !live {
                self.lost_q.pop_front();
                continue;
            }
            if self.pipe() >= self.cwnd {
                return None;
            }
            self.lost_q.pop_front();
            self.xmit_count += 1;
            let s = &mut self.segs[i];
            s.lost = false;
            self.retransmitted += u32::from(s.retrans == 0);
            s.retrans = s.retrans.saturating_add(1);
            s.sent_at = now;
            s.xmit = self.xmit_count;
            self.lost -= 1;
            self.stats.retransmitted += 1;
            self.arm(now);
            return Some(psn);
        }
        if let Some(psn) = self.probe_again.take() {
            let i = psn.wrapping_sub(self.una) as usize;
            if psn_le(self.una, psn) && self.segs.get(i).is_some_and(|s| !s.sacked && !s.lost) {
                self.stats.retransmitted += 1;
                return Some(psn);
            }
        }
        None
    }

    /// Whether `next_retransmit` may have a PSN to send.
    #[inline]
    pub fn retransmit_pending(&self) -> bool {
        !self.lost_q.is_empty() || self.probe_again.is_some()
    }

    /// Marks a PSN for immediate retransmission (e.g. the peer repeated a
    /// handshake packet because our answer was lost).
    pub fn mark_lost(&mut self, psn: u32) {
        let i = psn.wrapping_sub(self.una) as usize;
        if let Some(s) = self.segs.get_mut(i) {
            if !s.lost && !s.sacked {
                s.lost = true;
                self.lost += 1;
                self.lost_q.push_front(psn);
            }
        }
    }

    #[inline]
    /// Grows the window for `n` newly delivered segments: by one each in
    /// slow start, by one per window's worth in congestion avoidance.
    /// Steps through runs rather than single segments; the result is the
    /// same as growing segment by segment.
    fn on_delivered(&mut self, mut n: u32) {
        if self.recovery_end.is_some() && !self.rto_recovery {
            return;
        }
        while n > 0 {
            // A window above the cap (a cut or a timeout can leave one when
            // the cap is below 2) is clamped after the first step: take
            // that step alone.
            let run = if self.cwnd > self.p.max_cwnd { 1 } else { n };
            let k;
            if self.cwnd < self.ssthresh {
                k = run.min(self.ssthresh - self.cwnd);
                self.cwnd += k;
            } else {
                k = run.min(self.cwnd.saturating_sub(self.cwnd_acc).max(1));
                self.cwnd_acc += k;
                if self.cwnd_acc >= self.cwnd {
                    self.cwnd_acc = 0;
                    self.cwnd += 1;
                }
            }
            self.cwnd = self.cwnd.min(self.p.max_cwnd);
            n -= k;
        }
    }

    fn rtt_sample(&mut self, r: u64) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                self.rttvar = (3 * self.rttvar + srtt.abs_diff(r)) / 4;
                self.srtt = Some((7 * srtt + r) / 8);
            }
        }
        self.rto = self.base_rto();
    }

    /// RTO from the estimator, without back-off.
    fn base_rto(&self) -> u64 {
        match self.srtt {
            None => self.p.initial_rto.as_nanos() as u64,
            Some(srtt) => {
                (srtt + (4 * self.rttvar).max(GRANULARITY)).clamp(self.min_rto_ns, self.max_rto_ns)
            }
        }
    }

    /// Processes a cumulative ACK and SACK ranges. Returns the number of
    /// PSNs newly acknowledged cumulatively.
    #[inline]
    pub fn on_ack(&mut self, now: Instant, ack: u32, sack: &SackRanges) -> u32 {
        // Most packets of a one-way transfer acknowledge nothing new: skip
        // the work when it would change nothing (the timer is already in
        // the state `on_ack_news` would leave it in).
        if ack == self.una
            && sack.is_empty()
            && self.recovery_end.is_none()
            && self.rto_deadline.is_some() == (self.outstanding() > 0)
        {
            return 0;
        }
        self.on_ack_news(now, ack, sack)
    }

    fn on_ack_news(&mut self, now: Instant, ack: u32, sack: &SackRanges) -> u32 {
        if !(psn_le(self.una, ack) && psn_le(ack, self.nxt)) {
            return 0;
        }
        // RTT sample: the most recently sent of the newly delivered packets,
        // and only if it was never retransmitted. Extending Karn's rule this
        // way also skips old packets whose ACK waited behind a hole that a
        // retransmission just filled.
        let mut newest_clean: Option<(u64, Instant)> = None;
        let mut newest_any = 0u64;
        let delivered_before = self.delivered_xmit;
        // Read the acknowledged entries in place and drop them in one go:
        // one ACK often covers hundreds of segments.
        let n = ack.wrapping_sub(self.una);
        let mut was_sacked = 0;
        let mut was_lost = 0;
        let mut was_retransmitted = 0;
        if self.sacked == 0 && self.lost == 0 && self.retransmitted == 0 {
            // Nothing outstanding was SACKed, lost or sent twice: the last
            // acknowledged record is both the newest sent and a clean one.
            if let Some(s) = n.checked_sub(1).and_then(|i| self.segs.get(i as usize)) {
                newest_any = s.xmit;
                newest_clean = Some((s.xmit, s.sent_at));
            }
            debug_assert!(self
                .segs
                .range(..n as usize)
                .all(|s| !s.sacked && !s.lost && s.retrans == 0 && s.xmit <= newest_any));
        } else {
            for s in self.segs.range(..n as usize) {
                was_sacked += u32::from(s.sacked);
                was_lost += u32::from(s.lost && !s.sacked);
                was_retransmitted += u32::from(s.retrans > 0);
                newest_any = newest_any.max(s.xmit);
                if s.retrans == 0 && newest_clean.is_none_or(|(x, _)| s.xmit > x) {
                    newest_clean = Some((s.xmit, s.sent_at));
                }
            }
        }
        self.segs.drain(..n as usize);
        self.retransmitted -= was_retransmitted;
        self.una = ack;
        let acked = n;
        self.sacked -= was_sacked;
        self.lost -= was_lost;
        self.delivered_xmit = self.delivered_xmit.max(newest_any);
        self.on_delivered(n - was_sacked);
        // Ranges are reduced to offsets from `una`, clamped to what is
        // outstanding: serial comparisons alone are not transitive across
        // half the PSN space, and a peer may send any numbers.
        let out = self.outstanding();
        let mut highest_off = 0u32;
        for &(start, end) in sack.as_slice() {
            let from = if psn_lt(start, self.una) {
                0
            } else {
                start.wrapping_sub(self.una).min(out)
            };
            let to = if psn_lt(end, self.una) {
                0
            } else {
                end.wrapping_sub(self.una).min(out)
            };
            for i in from..to.max(from) {
                let s = &mut self.segs[i as usize];
                if !s.sacked {
                    s.sacked = true;
                    self.sacked += 1;
                    if s.lost {
                        s.lost = false;
                        self.lost -= 1;
                    }
                    self.delivered_xmit = self.delivered_xmit.max(s.xmit);
                    newest_any = newest_any.max(s.xmit);
                    if s.retrans == 0 && newest_clean.is_none_or(|(x, _)| s.xmit > x) {
                        newest_clean = Some((s.xmit, s.sent_at));
                    }
                    self.on_delivered(1);
                }
            }
            if to > from {
                highest_off = highest_off.max(to);
            }
        }
        if let Some((_, sent_at)) = newest_clean.filter(|&(x, _)| x == newest_any) {
            self.rtt_sample(now.0.saturating_sub(sent_at.0));
        }
        if let Some(end) = self.recovery_end {
            if psn_le(end, self.una) {
                self.recovery_end = None;
                self.rto_recovery = false;
            }
        }
        if highest_off > 0 {
            self.detect_losses(self.una.wrapping_add(highest_off));
        }
        // Any newly delivered segment proves the peer alive: the retry
        // limit counts consecutive timeouts without such evidence.
        if acked > 0 || self.delivered_xmit != delivered_before {
            self.retries = 0;
            self.silent_since = None;
            self.rto_deadline = None;
        }
        // Newly delivered data: drop the back-off (Linux does so on new
        // cumulative ACKs; we also count SACKed data, which proves the path
        // works). Karn's rule still keeps retransmissions out of the estimate.
        if acked > 0 || self.delivered_xmit != delivered_before {
            self.rto = self.base_rto();
        }
        if self.outstanding() > 0 {
            self.arm(now);
        } else {
            self.rto_deadline = None;
        }
        acked
    }

    /// A segment is lost once a segment sent REORDER_SEGMENTS transmissions
    /// after it has been delivered (a packet-count form of RACK, which also
    /// catches lost retransmissions).
    fn detect_losses(&mut self, highest_sacked: u32) {
        let n = highest_sacked.wrapping_sub(self.una) as usize;
        let mut first_loss = None;
        for i in 0..n.min(self.segs.len()) {
            let s = &mut self.segs[i];
            if !s.sacked && !s.lost && s.xmit + REORDER_SEGMENTS <= self.delivered_xmit {
                s.lost = true;
                self.lost += 1;
                let psn = self.una.wrapping_add(i as u32);
                self.lost_q.push_back(psn);
                first_loss.get_or_insert(psn);
            }
        }
        if first_loss.is_some() && self.recovery_end.is_none() {
            self.ssthresh = (self.cwnd / 2).max(2);
            self.cwnd = self.ssthresh;
            self.cwnd_acc = 0;
            self.recovery_end = Some(self.nxt);
            self.stats.fast_recoveries += 1;
        }
    }

    /// Runs the retransmission timer.
    pub fn on_timeout(&mut self, now: Instant) -> Timeout {
        match self.rto_deadline {
            Some(d) if d <= now => {}
            _ => return Timeout::None,
        }
        self.rto_deadline = None;
        if self.outstanding() == 0 {
            return Timeout::None;
        }
        self.retries += 1;
        self.stats.timeouts += 1;
        let since = *self.silent_since.get_or_insert(now);
        if self.retries > self.p.max_retries
            && now.saturating_duration_since(since) >= self.p.min_give_up
        {
            return Timeout::RetryExceeded;
        }
        self.rto = (self.rto * 2).min(self.max_rto_ns);
        self.ssthresh = (self.pipe() / 2).max(2);
        // Loss window of two (RFC 5681 uses one): on a very lossy path one
        // probe and its ACK both survive too rarely.
        self.cwnd = 2;
        self.cwnd_acc = 0;
        self.recovery_end = Some(self.nxt);
        self.rto_recovery = true;
        self.lost_q.clear();
        self.probe_again = (self.outstanding() - self.sacked == 1)
            .then(|| self.segs.iter().position(|s| !s.sacked))
            .flatten()
            .map(|i| self.una.wrapping_add(i as u32));
        for (i, s) in self.segs.iter_mut().enumerate() {
            if !s.sacked {
                if !s.lost {
                    s.lost = true;
                    self.lost += 1;
                }
                self.lost_q.push_back(self.una.wrapping_add(i as u32));
            }
        }
        self.arm(now);
        Timeout::Retransmit
    }

    /// Forgets everything outstanding (the connection failed).
    pub fn clear(&mut self) {
        self.segs.clear();
        self.lost_q.clear();
        self.una = self.nxt;
        self.sacked = 0;
        self.lost = 0;
        self.retransmitted = 0;
        self.rto_deadline = None;
    }
}

/// What a received packet asks of our acknowledgement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckAsk {
    /// Acknowledge soon (`FLAG_ACK_REQUEST`).
    pub request: bool,
    /// It ends its message and its follower comes at once (`FLAG_FOLLOWS` on the Write of
    /// an RDMA Write with Immediate): acknowledged with the follower, as one packet.
    pub with_follower: bool,
}

impl AckAsk {
    /// What the packet with TRP `flags` and DDP segment `last` asks.
    #[inline(always)]
    pub fn of(flags: u8, last: bool) -> AckAsk {
        AckAsk {
            request: flags & crate::wire::trp::FLAG_ACK_REQUEST != 0,
            with_follower: last && flags & crate::wire::trp::FLAG_FOLLOWS != 0,
        }
    }

    /// An ACK asked for (tests, probes), or not.
    pub fn request(request: bool) -> AckAsk {
        AckAsk {
            request,
            with_follower: false,
        }
    }
}

/// Receiver half: which PSNs in the window have arrived, and when to ACK.
#[derive(Debug)]
pub struct Receiver {
    nxt: u32,
    cap: u32,
    /// Slots are PSNs modulo a power of two at least `cap`: a mask, not a
    /// division, per lookup. At most `cap` consecutive PSNs are tracked, so
    /// they never share a slot.
    slot_mask: u32,
    bits: Vec<u64>,
    highest: u32,
    unacked: u32,
    ack_now: bool,
    ack_deadline: Option<Instant>,
    /// In nanoseconds, converted once.
    ack_delay_ns: u64,
    /// How long an ACK the sender asked for may wait for a reply to carry it (ns).
    hold_ns: u64,
    /// An asked-for ACK is waiting (until `ack_deadline` at the latest).
    held: bool,
}

/// How a PSN relates to the receive window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Already received (or below the window).
    Duplicate,
    /// Beyond the window: the sender ignored it.
    OutOfWindow,
    /// New; `in_order` if it is the next expected PSN.
    New { in_order: bool },
}

impl Receiver {
    pub fn new(first_psn: u32, window: u16, ack_delay: Duration, hold: Duration) -> Self {
        let cap = u32::from(window.max(1));
        let slots = cap.next_power_of_two();
        Receiver {
            nxt: first_psn,
            cap,
            slot_mask: slots - 1,
            bits: vec![0; slots.div_ceil(64) as usize],
            highest: first_psn,
            unacked: 0,
            ack_now: false,
            ack_deadline: None,
            ack_delay_ns: ack_delay.as_nanos().min(u128::from(u64::MAX)) as u64,
            hold_ns: hold.as_nanos().min(u128::from(u64::MAX)) as u64,
            held: false,
        }
    }

    #[inline]
    pub fn nxt(&self) -> u32 {
        self.nxt
    }
    #[inline]
    pub fn window(&self) -> u16 {
        self.cap.min(u16::MAX as u32) as u16
    }
    /// Number of distinct slots `slot` returns (per-PSN state is kept in
    /// arrays of this length).
    pub fn slots(&self) -> usize {
        self.slot_mask as usize + 1
    }
    #[inline(always)]
    pub fn slot(&self, psn: u32) -> usize {
        (psn & self.slot_mask) as usize
    }
    #[inline(always)]
    fn bit(&self, psn: u32) -> bool {
        let s = self.slot(psn);
        self.bits[s / 64] & (1 << (s % 64)) != 0
    }
    #[inline(always)]
    fn set(&mut self, psn: u32, v: bool) {
        let s = self.slot(psn);
        if v {
            self.bits[s / 64] |= 1 << (s % 64);
        } else {
            self.bits[s / 64] &= !(1 << (s % 64));
        }
    }

    #[inline(always)]
    pub fn classify(&self, psn: u32) -> Arrival {
        let d = psn.wrapping_sub(self.nxt);
        if psn_lt(psn, self.nxt) {
            Arrival::Duplicate
        } else if d >= self.cap {
            Arrival::OutOfWindow
        } else if self.bit(psn) {
            Arrival::Duplicate
        } else {
            Arrival::New { in_order: d == 0 }
        }
    }

    /// Records a new PSN (after `classify` said New).
    #[inline(always)]
    pub fn mark(&mut self, psn: u32) {
        self.set(psn, true);
        if psn_lt(self.highest, psn) {
            self.highest = psn;
        }
    }

    /// Accepts `psn` and moves past it at once if it is the next expected
    /// PSN and nothing is held above it (the common in-order case: it need
    /// not be parked in the window). Otherwise does nothing and returns
    /// false. Only for PSNs `classify` called New.
    #[inline(always)]
    pub fn take_in_order(&mut self, psn: u32) -> bool {
        if psn != self.nxt || self.has_gap() {
            return false;
        }
        self.nxt = self.nxt.wrapping_add(1);
        self.highest = self.nxt;
        true
    }

    /// `classify`, `take_in_order` and `on_packet` for a PSN that arrives
    /// in order with nothing held above it, in one step; returns false,
    /// changing nothing, for any other PSN.
    #[inline(always)]
    pub fn accept_next(&mut self, now: Instant, psn: u32, ack: AckAsk) -> bool {
        // Without a gap `highest == nxt`, and every PSN marked in the
        // window lies above `nxt`: so `nxt` itself is unmarked, and new.
        if psn != self.nxt || self.highest != self.nxt {
            return false;
        }
        debug_assert!(!self.bit(psn));
        self.nxt = self.nxt.wrapping_add(1);
        self.highest = self.nxt;
        self.schedule_in_order(now, ack);
        true
    }

    /// When to acknowledge an in-order packet with nothing held above it: at once for every
    /// second one, within the hold for one the sender asked about, within `ack_delay`
    /// otherwise. Whatever we send first carries the ACK. A packet acknowledged with its
    /// follower ([`AckAsk::with_follower`]) is not counted: the pair is one.
    #[inline(always)]
    fn schedule_in_order(&mut self, now: Instant, ack: AckAsk) {
        let ack_request = ack.request;
        if !ack.with_follower {
            self.unacked += 1;
        }
        if self.unacked >= 2 || (ack_request && self.hold_ns == 0) {
            self.ack_now = true;
            return;
        }
        self.held |= ack_request;
        let delay = if ack_request {
            self.hold_ns
        } else {
            self.ack_delay_ns
        };
        let at = Instant(now.0.saturating_add(delay));
        self.ack_deadline = Some(self.ack_deadline.map_or(at, |d| d.min(at)));
    }

    /// Takes the next in-order PSN if it has arrived.
    #[inline(always)]
    pub fn pop_in_order(&mut self) -> Option<u32> {
        if !self.bit(self.nxt) {
            return None;
        }
        let psn = self.nxt;
        self.set(psn, false);
        self.nxt = self.nxt.wrapping_add(1);
        if psn_lt(self.highest, self.nxt) {
            self.highest = self.nxt;
        }
        Some(psn)
    }

    /// Whether PSNs above a gap are held.
    #[inline(always)]
    pub fn has_gap(&self) -> bool {
        psn_lt(self.nxt, self.highest)
    }

    /// Up to four ranges of PSNs received above the cumulative ACK, lowest
    /// first (the holes the sender most needs to fill).
    pub fn sack_ranges(&self) -> SackRanges {
        let mut r = SackRanges::new();
        let n = self
            .highest
            .wrapping_sub(self.nxt)
            .wrapping_add(1)
            .min(self.cap);
        let mut start = None;
        for d in 1..=n {
            let psn = self.nxt.wrapping_add(d);
            let have = d < n && self.bit(psn);
            match (have, start) {
                (true, None) => start = Some(psn),
                (false, Some(s)) => {
                    if !r.push(s, psn) {
                        return r;
                    }
                    start = None;
                }
                _ => {}
            }
        }
        r
    }

    /// Schedules an acknowledgement after receiving a packet.
    #[inline(always)]
    pub fn on_packet(&mut self, now: Instant, arrival: Arrival, ack: AckAsk) {
        match arrival {
            Arrival::New { in_order: true } if !self.has_gap() => self.schedule_in_order(now, ack),
            _ => self.ack_now = true,
        }
    }

    #[inline]
    pub fn request_ack(&mut self) {
        self.ack_now = true;
    }

    /// An asked-for ACK that is being held goes out now: nobody is there to reply.
    #[inline]
    pub fn release_held(&mut self) {
        if self.held {
            self.ack_now = true;
        }
    }

    /// A held ACK waits until `until` (later or earlier than the hold): for a reply whose
    /// application has not seen yet what it answers. Nothing changes without a held ACK.
    pub fn hold_until(&mut self, until: Instant) {
        if self.held && !self.ack_now {
            self.ack_deadline = Some(until);
        }
    }

    /// The application has seen what a held ACK answers: its reply comes within the hold
    /// from now, or the ACK goes alone.
    pub fn hold_from(&mut self, now: Instant) {
        if self.held && !self.ack_now {
            let at = Instant(now.0.saturating_add(self.hold_ns));
            self.ack_deadline = Some(self.ack_deadline.map_or(at, |d| d.min(at)));
        }
    }

    /// Whether an ACK the sender asked for is being held for a reply.
    pub fn holds(&self) -> bool {
        self.held && !self.ack_now
    }

    /// How long an asked-for ACK waits for a reply, from now on.
    pub fn set_hold(&mut self, hold: Duration) {
        self.hold_ns = hold.as_nanos().min(u128::from(u64::MAX)) as u64;
    }

    pub fn ack_deadline(&self) -> Option<Instant> {
        if self.ack_now {
            None
        } else {
            self.ack_deadline
        }
    }

    pub fn on_timeout(&mut self, now: Instant) {
        if self.ack_deadline.is_some_and(|d| d <= now) {
            self.ack_now = true;
        }
    }

    #[inline]
    pub fn ack_due(&self) -> bool {
        self.ack_now
    }

    /// Every packet we send carries the cumulative ACK.
    #[inline]
    pub fn ack_sent(&mut self) {
        self.ack_now = false;
        self.ack_deadline = None;
        self.held = false;
        self.unacked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            initial_rto: Duration::from_millis(10),
            min_rto: Duration::from_millis(1),
            max_rto: Duration::from_millis(100),
            max_retries: 3,
            min_give_up: Duration::ZERO,
            initial_cwnd: 4,
            max_cwnd: 64,
        }
    }

    #[test]
    fn rtt_and_karn() {
        let mut s: Sender<()> = Sender::new(params(), 100, 64);
        s.push((), Instant(0));
        s.on_ack(Instant(2_000_000), 101, &SackRanges::new());
        assert_eq!(s.srtt(), Some(Duration::from_millis(2)));
        assert_eq!(s.rto(), Duration::from_millis(6));
        s.push((), Instant(3_000_000));
        assert_eq!(s.on_timeout(Instant(9_000_000)), Timeout::Retransmit);
        assert_eq!(s.rto(), Duration::from_millis(12));
        assert_eq!(s.next_retransmit(Instant(9_000_000)), Some(101));
        // The retransmitted segment gives no sample (Karn).
        s.on_ack(Instant(50_000_000), 102, &SackRanges::new());
        assert_eq!(s.srtt(), Some(Duration::from_millis(2)));
    }

    #[test]
    fn ack_without_visiting_records_samples_the_newest() {
        let mut s: Sender<()> = Sender::new(params(), 0, 64);
        // A retransmitted record outstanding: Karn's rule must still see it.
        s.push((), Instant(0));
        s.push((), Instant(0));
        s.mark_lost(0);
        assert_eq!(s.next_retransmit(Instant(1_000_000)), Some(0));
        assert_eq!(s.retransmitted, 1);
        s.on_ack(Instant(5_000_000), 1, &SackRanges::new());
        assert_eq!(s.srtt(), None);
        assert_eq!(s.retransmitted, 0);
        // Only clean records left: an ACK of several samples the newest.
        s.push((), Instant(6_000_000));
        s.push((), Instant(8_000_000));
        assert_eq!(s.on_ack(Instant(11_000_000), 4, &SackRanges::new()), 3);
        assert_eq!(s.srtt(), Some(Duration::from_millis(3)));
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.rto_deadline(), None);
    }

    #[test]
    fn retry_limit() {
        let mut s: Sender<()> = Sender::new(params(), 0, 64);
        s.push((), Instant(0));
        let mut now = Instant(0);
        let mut outcome = Timeout::None;
        for _ in 0..10 {
            now = s.rto_deadline().unwrap();
            outcome = s.on_timeout(now);
            if outcome == Timeout::RetryExceeded {
                break;
            }
            s.next_retransmit(now);
        }
        assert_eq!(outcome, Timeout::RetryExceeded);
        assert!(now < Instant(1_000_000_000));
    }

    #[test]
    fn sack_marks_losses_and_halves_cwnd() {
        let mut s: Sender<()> = Sender::new(params(), 0, 64);
        for _ in 0..4 {
            s.push((), Instant(0));
        }
        let mut sack = SackRanges::new();
        sack.push(1, 4);
        s.on_ack(Instant(1000), 0, &sack);
        assert_eq!(s.cwnd(), 3);
        assert_eq!(s.next_retransmit(Instant(1000)), Some(0));
        s.on_ack(Instant(2000), 4, &SackRanges::new());
        assert_eq!(s.outstanding(), 0);
    }

    #[test]
    fn hostile_sack_ranges_are_clamped() {
        let mut s: Sender<()> = Sender::new(params(), 10, 64);
        for _ in 0..3 {
            s.push((), Instant(0));
        }
        // Found by fuzzing: a range just under half the PSN space whose
        // serial comparisons disagree with each other.
        for (a, b) in [
            (18, 18 + 0x7fff_fffe),
            (5, 12),
            (0x8000_0000, 0x8000_0005),
            (12, 11),
        ] {
            let mut sack = SackRanges::new();
            sack.push(a, b);
            s.on_ack(Instant(1), 10, &sack);
        }
        assert_eq!(s.outstanding(), 3);
        assert_eq!(s.pipe(), 1, "only PSNs 10 and 11 were SACKed");
    }

    #[test]
    fn receiver_sacks() {
        let mut r = Receiver::new(10, 64, Duration::from_micros(100), Duration::ZERO);
        for p in [12, 13, 15, 20] {
            assert_eq!(r.classify(p), Arrival::New { in_order: false });
            r.mark(p);
        }
        assert_eq!(r.classify(12), Arrival::Duplicate);
        assert_eq!(r.classify(74), Arrival::OutOfWindow);
        assert_eq!(r.sack_ranges().as_slice(), &[(12, 14), (15, 16), (20, 21)]);
        assert_eq!(r.pop_in_order(), None);
        r.mark(10);
        r.mark(11);
        let got: Vec<u32> = std::iter::from_fn(|| r.pop_in_order()).collect();
        assert_eq!(got, vec![10, 11, 12, 13]);
        assert_eq!(r.sack_ranges().as_slice(), &[(15, 16), (20, 21)]);
    }

    /// Window growth over a run of deliveries equals growth one delivery
    /// at a time (RFC 5681: +1 per segment in slow start, +1 per window in
    /// congestion avoidance), from any starting state.
    #[test]
    fn window_growth_per_run_matches_per_segment() {
        for max_cwnd in [1, 2, 7, 64] {
            for ssthresh in [1, 2, 3, 10, 64, 100] {
                for cwnd in [1, 2, 5, 9, 63, 64] {
                    for acc in [0, 1, 4, 8, 70] {
                        for n in [0, 1, 2, 3, 17, 200] {
                            let mut p = params();
                            p.max_cwnd = max_cwnd;
                            let mut s: Sender<()> = Sender::new(p, 0, 64);
                            (s.cwnd, s.ssthresh, s.cwnd_acc) = (cwnd, ssthresh, acc);
                            let (mut c, mut a) = (cwnd, acc);
                            for _ in 0..n {
                                if c < ssthresh {
                                    c += 1;
                                } else {
                                    a += 1;
                                    if a >= c {
                                        a = 0;
                                        c += 1;
                                    }
                                }
                                c = c.min(max_cwnd);
                            }
                            s.on_delivered(n);
                            assert_eq!(
                                (s.cwnd, s.cwnd_acc),
                                (c, a),
                                "max {max_cwnd} ssthresh {ssthresh} cwnd {cwnd} acc {acc} n {n}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn in_order_arrival_is_taken_only_without_a_gap() {
        let mut r = Receiver::new(10, 64, Duration::from_micros(100), Duration::ZERO);
        assert!(!r.take_in_order(11), "not the next PSN");
        assert!(r.take_in_order(10));
        assert_eq!(r.nxt(), 11);
        r.mark(13);
        assert!(!r.take_in_order(11), "13 is held above a gap");
        r.mark(11);
        r.mark(12);
        let got: Vec<u32> = std::iter::from_fn(|| r.pop_in_order()).collect();
        assert_eq!(got, vec![11, 12, 13]);
        assert!(r.take_in_order(14));
        assert_eq!(r.sack_ranges().as_slice(), &[]);
    }

    /// An ACK a segment asks for waits up to the hold for data of ours to carry it; every
    /// second segment, an out-of-order one, a release or the hold's end sends it.
    #[test]
    fn held_ack_waits_for_the_reader() {
        let t0 = Instant::ZERO;
        let us = |n: u64| Instant(n * 1_000);
        let mut r = Receiver::new(
            0,
            64,
            Duration::from_micros(200),
            Duration::from_micros(100),
        );
        assert!(r.accept_next(t0, 0, AckAsk::request(true)));
        assert_eq!(r.ack_deadline(), Some(us(100)), "the hold from the arrival");
        r.hold_until(us(1_000));
        assert_eq!(r.ack_deadline(), Some(us(1_000)), "waits for the reader");
        r.hold_from(us(300));
        assert_eq!(r.ack_deadline(), Some(us(400)), "the hold from the reading");
        r.hold_from(us(390));
        assert_eq!(r.ack_deadline(), Some(us(400)), "never later once read");
        r.on_timeout(us(400));
        assert!(r.ack_due());
        r.hold_until(us(2_000));
        assert!(r.ack_due(), "an ACK due stays due");
        r.ack_sent();
        // Without a held ACK neither moves anything.
        assert!(r.accept_next(us(500), 1, AckAsk::request(false)));
        let d = r.ack_deadline();
        r.hold_until(us(5_000));
        r.hold_from(us(501));
        assert_eq!(r.ack_deadline(), d);
    }

    #[test]
    fn an_asked_for_ack_is_held_for_a_reply() {
        let us = |n: u64| Instant(n * 1_000);
        let mut r = Receiver::new(
            10,
            64,
            Duration::from_micros(200),
            Duration::from_micros(50),
        );
        assert!(r.accept_next(us(0), 10, AckAsk::request(true)));
        assert!(!r.ack_due(), "held");
        assert_eq!(r.ack_deadline(), Some(us(50)));
        r.on_timeout(us(49));
        assert!(!r.ack_due());
        r.on_timeout(us(50));
        assert!(r.ack_due(), "the hold is over");
        r.ack_sent();

        // Data of ours went first: it carried the ACK, nothing is left to send.
        assert!(r.accept_next(us(100), 11, AckAsk::request(true)));
        r.ack_sent();
        assert_eq!(r.ack_deadline(), None);
        assert!(!r.ack_due());

        // A segment that did not ask sets the longer delay; a second one is acknowledged
        // at once, whether it asked or not.
        assert!(r.accept_next(us(200), 12, AckAsk::request(false)));
        assert_eq!(r.ack_deadline(), Some(us(400)));
        r.ack_sent();
        r.on_packet(
            us(300),
            Arrival::New { in_order: true },
            AckAsk::request(false),
        );
        assert_eq!(r.ack_deadline(), Some(us(500)));
        // (on_packet after take_in_order: the second unacknowledged segment.)
        r.on_packet(
            us(310),
            Arrival::New { in_order: true },
            AckAsk::request(true),
        );
        assert!(r.ack_due(), "every second segment at once");
        r.ack_sent();

        // Released: nobody will reply.
        assert!(r.accept_next(us(400), 13, AckAsk::request(true)));
        assert!(!r.ack_due());
        r.release_held();
        assert!(r.ack_due());
        r.ack_sent();
        // A release with nothing held sends nothing.
        assert!(r.accept_next(us(500), 14, AckAsk::request(false)));
        r.release_held();
        assert!(!r.ack_due());

        // A Write whose Immediate Data follows at once and that Immediate: one packet to
        // the every-second rule, held for the reply.
        r.ack_sent();
        let write = AckAsk::of(
            crate::wire::trp::FLAG_ACK_REQUEST | crate::wire::trp::FLAG_FOLLOWS,
            true,
        );
        assert!(r.accept_next(us(600), 15, write));
        assert!(r.accept_next(us(601), 16, AckAsk::request(true)));
        assert!(!r.ack_due(), "held for the reply");
        assert_eq!(r.ack_deadline(), Some(us(650)));
        // Segments in the middle of a message that follow at once count as any.
        let middle = AckAsk::of(crate::wire::trp::FLAG_FOLLOWS, false);
        assert_eq!(middle, AckAsk::request(false));
        r.ack_sent();
        assert!(r.accept_next(us(700), 17, middle));
        assert!(r.accept_next(us(701), 18, middle));
        assert!(r.ack_due());

        // Without a hold the ACK goes at once, as the sender asked.
        let mut r = Receiver::new(10, 64, Duration::from_micros(200), Duration::ZERO);
        assert!(r.accept_next(us(0), 10, AckAsk::request(true)));
        assert!(r.ack_due());
    }
}
