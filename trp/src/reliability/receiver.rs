//! The receiver half: which PSNs arrived, and when to acknowledge them.

use super::psn_lt;
use crate::time::Instant;
use crate::wire::trp::{SackRanges, MAX_SACK_RANGES};
use core::time::Duration;

/// ACKs that may follow an ACK at once, each with ranges it had no room for: a burst that
/// left more ranges held than one ACK carries is reported whole, and one arrival costs at
/// most this many ACKs more.
const SACK_FOLLOW_UPS: u8 = 2;

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
    /// The PSN most recently held above a gap: its range is reported first.
    last: u32,
    unacked: u32,
    ack_now: bool,
    ack_deadline: Option<Instant>,
    /// In nanoseconds, converted once.
    ack_delay_ns: u64,
    /// How long an ACK the sender asked for may wait for a reply to carry it (ns).
    hold_ns: u64,
    /// An asked-for ACK is waiting (until `ack_deadline` at the latest).
    held: bool,
    /// The last SACK had no room for the ranges below this PSN (above the lowest).
    sack_more: Option<u32>,
    /// ACKs sent for `sack_more` since the last arrival.
    follow_ups: u8,
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
            last: first_psn,
            unacked: 0,
            ack_now: false,
            ack_deadline: None,
            ack_delay_ns: ack_delay.as_nanos().min(u128::from(u64::MAX)) as u64,
            hold_ns: hold.as_nanos().min(u128::from(u64::MAX)) as u64,
            held: false,
            sack_more: None,
            follow_ups: 0,
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
        self.last = psn;
        self.follow_ups = 0;
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

    /// Up to four ranges of PSNs received above the cumulative ACK, in PSN
    /// order: the one holding the latest arrival, the lowest (above the
    /// hole the sender most needs to fill) and the highest. Each range is
    /// reported while it is the highest, and twice more as the next ones
    /// grow, so the sender's scoreboard learns every range of a window with
    /// hundreds of holes even when ACKs are lost (RFC 2018's rule, adapted).
    /// Reporting only the lowest ranges let it learn four holes per round
    /// trip.
    pub fn sack_ranges(&self) -> SackRanges {
        self.pick_sacks(None).0
    }

    /// The ranges of the ACK to send now. A burst taken in one go (a
    /// receiver that ran late) can leave more ranges than an ACK carries,
    /// and a range never reported is resent once overdue: the ACKs that
    /// follow at once ([`SACK_FOLLOW_UPS`]) carry the ranges below, down to
    /// the lowest.
    pub fn take_sack(&mut self) -> SackRanges {
        let (ranges, more) = self.pick_sacks(self.sack_more);
        self.sack_more = more;
        ranges
    }

    /// [`Receiver::sack_ranges`], the highest ones taken from below `from`
    /// when given; and where the next ACK goes on when ranges above the
    /// lowest were left out.
    fn pick_sacks(&self, from: Option<u32>) -> (SackRanges, Option<u32>) {
        let mut picked = [(0u32, 0u32); MAX_SACK_RANGES];
        let mut n = 0;
        let mut pick = |r: Option<(u32, u32)>, n: &mut usize| {
            if let Some(r) = r {
                if *n < MAX_SACK_RANGES && !picked[..*n].contains(&r) {
                    picked[*n] = r;
                    *n += 1;
                }
            }
        };
        pick(self.range_around(self.last), &mut n);
        let first_held = (1..self.span())
            .map(|d| self.nxt.wrapping_add(d))
            .find(|&p| self.bit(p));
        let lowest = first_held.and_then(|p| self.range_around(p));
        pick(lowest, &mut n);
        let mut below = from.unwrap_or(self.highest.wrapping_add(1));
        let mut more = None;
        while let Some(top) = self.held_below(below) {
            let r = self.range_around(top);
            if n == MAX_SACK_RANGES {
                more = (r != lowest).then_some(below);
                break;
            }
            pick(r, &mut n);
            below = r.map_or(top, |(start, _)| start);
        }
        let ranges = &mut picked[..n];
        ranges.sort_unstable_by_key(|&(start, _)| start.wrapping_sub(self.nxt));
        let mut r = SackRanges::new();
        for &(start, end) in ranges.iter() {
            r.push(start, end);
        }
        (r, more)
    }

    /// PSNs from `nxt` that may be held: up to and including `highest`,
    /// at most the window.
    fn span(&self) -> u32 {
        self.highest
            .wrapping_sub(self.nxt)
            .wrapping_add(1)
            .min(self.cap)
    }

    /// Whether `psn` lies above `nxt` within what may be held.
    fn in_span(&self, psn: u32) -> bool {
        let d = psn.wrapping_sub(self.nxt);
        d > 0 && d < self.span()
    }

    /// The run of held PSNs that contains `psn`, as `(start, end)` with
    /// `end` exclusive; none if `psn` is not held above `nxt`.
    fn range_around(&self, psn: u32) -> Option<(u32, u32)> {
        if !self.in_span(psn) || !self.bit(psn) {
            return None;
        }
        let mut start = psn;
        while self.in_span(start.wrapping_sub(1)) && self.bit(start.wrapping_sub(1)) {
            start = start.wrapping_sub(1);
        }
        let mut end = psn.wrapping_add(1);
        while self.in_span(end) && self.bit(end) {
            end = end.wrapping_add(1);
        }
        Some((start, end))
    }

    /// The highest held PSN below `psn`.
    fn held_below(&self, psn: u32) -> Option<u32> {
        let mut p = psn.wrapping_sub(1);
        while self.in_span(p) {
            if self.bit(p) {
                return Some(p);
            }
            p = p.wrapping_sub(1);
        }
        None
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
        // Ranges left out go in the next ACK, at once while the follow-ups last.
        self.ack_now = self.sack_more.is_some() && self.follow_ups < SACK_FOLLOW_UPS;
        self.follow_ups += u8::from(self.ack_now);
        self.ack_deadline = None;
        self.held = false;
        self.unacked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// With more ranges than an ACK carries: the latest arrival's, the
    /// lowest and the highest.
    #[test]
    fn many_holes_report_the_latest_lowest_and_highest() {
        let mut r = Receiver::new(10, 64, Duration::from_micros(100), Duration::ZERO);
        for p in [12, 13, 15, 20, 25, 26, 30, 40] {
            r.mark(p);
        }
        assert_eq!(
            r.sack_ranges().as_slice(),
            &[(12, 14), (25, 27), (30, 31), (40, 41)]
        );
        // A late arrival in the middle: its range is reported.
        r.mark(16);
        assert_eq!(
            r.sack_ranges().as_slice(),
            &[(12, 14), (15, 17), (30, 31), (40, 41)]
        );
    }

    /// Every SACK due now, as the transmit path takes them.
    fn sacks_due(r: &mut Receiver) -> Vec<SackRanges> {
        let mut acks = Vec::new();
        while r.ack_due() {
            acks.push(r.take_sack());
            r.ack_sent();
        }
        acks
    }

    /// A burst with more ranges than an ACK carries: the ACKs that follow at
    /// once report the rest, down to the lowest.
    #[test]
    fn ranges_left_out_follow_at_once() {
        let mut r = Receiver::new(10, 64, Duration::from_micros(100), Duration::ZERO);
        for p in [12, 13, 15, 20, 25, 26, 30, 40] {
            r.mark(p);
        }
        r.request_ack();
        let acks = sacks_due(&mut r);
        assert_eq!(acks.len(), 2);
        assert_eq!(
            acks[0].as_slice(),
            &[(12, 14), (25, 27), (30, 31), (40, 41)]
        );
        assert_eq!(
            acks[1].as_slice(),
            &[(12, 14), (15, 16), (20, 21), (40, 41)]
        );
        // All reported: the next ACK starts from the highest again.
        r.mark(41);
        r.request_ack();
        assert_eq!(sacks_due(&mut r).len(), 2);
    }

    /// One arrival is answered by at most `1 + SACK_FOLLOW_UPS` ACKs, however
    /// many ranges are held; the next arrival goes on where they stopped.
    #[test]
    fn follow_ups_are_bounded_per_arrival() {
        let mut r = Receiver::new(0, 256, Duration::from_micros(100), Duration::ZERO);
        for p in (2..200).step_by(2) {
            r.mark(p);
        }
        r.request_ack();
        let first = sacks_due(&mut r);
        assert_eq!(first.len(), 1 + usize::from(SACK_FOLLOW_UPS));
        let lowest_so_far = first.last().unwrap().as_slice()[2].0;
        r.mark(201);
        r.request_ack();
        let next = sacks_due(&mut r);
        assert_eq!(next.len(), 1 + usize::from(SACK_FOLLOW_UPS));
        assert!(next[0].as_slice()[2].0 < lowest_so_far, "it went on below");
        // A data packet carries no ranges: it neither ends nor prolongs the
        // follow-ups beyond their bound.
        r.mark(203);
        r.request_ack();
        let mut sent = 0;
        while r.ack_due() {
            r.ack_sent();
            sent += 1;
        }
        assert_eq!(sent, 1 + usize::from(SACK_FOLLOW_UPS));
    }

    /// The sender learns every range of a burst taken in one go, and resends
    /// exactly the holes: a range no ACK had room for was resent as lost.
    #[test]
    fn a_burst_taken_at_once_resends_only_its_holes() {
        use crate::reliability::{Params, Sender};
        let ms = |n: u64| Instant(n * 1_000_000);
        let mut tx: Sender<()> = Sender::new(
            Params {
                initial_rto: Duration::from_millis(200),
                min_rto: Duration::from_millis(200),
                max_rto: Duration::from_secs(1),
                max_retries: 3,
                min_give_up: Duration::ZERO,
                initial_cwnd: 64,
                max_cwnd: 64,
                ack_delay_ns: 0,
                ack_hold_ns: 0,
            },
            0,
            64,
        );
        let mut rx = Receiver::new(0, 64, Duration::from_micros(100), Duration::ZERO);
        tx.push((), ms(0));
        rx.take_in_order(0);
        tx.on_ack(ms(1), rx.nxt(), &SackRanges::new());
        for _ in 1..=40 {
            tx.push((), ms(2));
        }
        let holes = [5, 13, 21, 29, 37];
        for p in (1..=40).filter(|p| !holes.contains(p)) {
            if !rx.take_in_order(p) {
                rx.mark(p);
                std::iter::from_fn(|| rx.pop_in_order()).count();
            }
        }
        rx.request_ack();
        for sack in sacks_due(&mut rx) {
            tx.on_ack(ms(10), rx.nxt(), &sack);
        }
        let mut resent = Vec::new();
        while let Some(psn) = tx.next_retransmit(ms(10)) {
            resent.push(psn);
        }
        assert_eq!(resent, holes);
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
