//! Congestion control: how many segments may be in the network.
//!
//! RFC 5681's window (slow start, one segment per window, halved on
//! congestion) with one change: a loss is taken for congestion only when
//! the round trip shows a queue, or when a round loses too much to be the
//! path's own noise. A link that loses at random keeps its window (IRN:
//! loss is not a rate signal), while a queue that overflows — a bottleneck
//! shared or too slow — still halves it, as Reno would. TCP Veno tells the
//! two kinds of loss apart the same way.
//!
//! A queue is seen when the least RTT of the last two rounds exceeds the
//! path's base (the least of the last `BASE_ROUNDS` rounds) by an eighth:
//! a full drop-tail queue delays every datagram, a random loss delays none.
//! A queue that stands without overflowing (a busy receiver, a host whose
//! scheduler delays every datagram alike) loses nothing of its own, so a
//! loss with a queue in sight cuts only when the round has lost more than
//! the path usually does: `DEVIATIONS` standard deviations above its
//! learnt loss rate.

/// Rounds the base RTT is the least of.
const BASE_ROUNDS: usize = 64;
/// A round trip this many eighths above the base shows a queue.
const QUEUE_EIGHTHS: u64 = 9;
/// RTT samples after which a round's least alone says whether a queue
/// stands; with fewer, the last round's is taken too.
const ROUND_SAMPLES: u32 = 4;
/// A round that loses more than this fraction of what it delivered and
/// lost (and at least `NOISE_MIN` segments) is congested whatever its RTT:
/// a policer or a queue too short to show in the round trip.
const NOISE_THIRDS: u64 = 1;
const NOISE_MIN: u64 = 4;
/// A round may lose this many standard deviations (of the binomial count
/// at the path's learnt rate) above the mean before a queue in sight makes
/// its losses congestion.
const DEVIATIONS: u64 = 3;
/// Loss rates are kept in 1/1024ths.
const ONE: u64 = 1024;
/// Segments (delivered and lost) a loss-rate sample spans at least: short
/// rounds add up.
const LOSS_SAMPLE: u64 = 32;
/// One sample moves the learnt rate an eighth of the way towards it, and
/// towards at most twice the rate plus this: the bursts of an overflowing
/// queue, learnt as the path's, would excuse the next overflow.
const LOSS_STEP: u64 = ONE / 32;
/// The most loss the path is believed to have at random: a quarter.
const MAX_LOSS: u64 = ONE / 4;
/// Rounds without a cut after which one round runs at half the window, so
/// that a queue this flow keeps full drains and the base RTT is learnt
/// again: a flow that arrived at a full queue would otherwise take it for
/// the path's and never see congestion (BBR's ProbeRTT, briefly).
const DRAIN_EVERY: u32 = 48;

/// What an ACK's progress meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Progress {
    SameRound,
    /// A round trip ended; `cut` if its losses cut the window.
    RoundEnded {
        cut: bool,
    },
}

/// What a loss did to the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LossResponse {
    /// The window was halved: congestion.
    Cut,
    /// The window was already cut for this window of data.
    InRecovery,
    /// No queue: the path's own loss, only retransmitted.
    Random,
}

#[derive(Debug)]
pub(super) struct Congestion {
    max_cwnd: u32,
    cwnd: u32,
    cwnd_acc: u32,
    ssthresh: u32,
    /// While set, further losses before this PSN do not cut the window again.
    recovery_end: Option<u32>,
    /// After a timeout the window slow-starts back even during recovery.
    rto_recovery: bool,
    /// The round trip under way ends once a segment sent after it began
    /// (transmission number above this) is delivered.
    round_end_xmit: u64,
    /// The least RTT sampled in this round and in the one before (ns).
    round_min: u64,
    last_round_min: u64,
    round_samples: u32,
    /// What this round delivered and lost.
    round_delivered: u64,
    round_lost: u64,
    /// The least RTT of each of the last rounds that had a sample.
    mins: [u64; BASE_ROUNDS],
    mins_at: usize,
    mins_len: usize,
    /// What the rounds since the last loss-rate sample delivered and lost.
    sample_delivered: u64,
    sample_lost: u64,
    /// The path's usual loss rate, in 1/1024ths.
    loss_rate: u64,
    /// Rounds since the window was last cut or drained.
    rounds_since_drain: u32,
    /// This round runs at half the window.
    draining: bool,
}

impl Congestion {
    pub(super) fn new(initial_cwnd: u32, max_cwnd: u32) -> Self {
        Congestion {
            max_cwnd,
            cwnd: initial_cwnd.max(1),
            cwnd_acc: 0,
            ssthresh: max_cwnd,
            recovery_end: None,
            rto_recovery: false,
            round_end_xmit: 0,
            round_min: u64::MAX,
            last_round_min: u64::MAX,
            round_samples: 0,
            round_delivered: 0,
            round_lost: 0,
            mins: [0; BASE_ROUNDS],
            mins_at: 0,
            mins_len: 0,
            sample_delivered: 0,
            sample_lost: 0,
            loss_rate: 0,
            rounds_since_drain: 0,
            draining: false,
        }
    }

    /// The window in force: half while a round drains.
    #[inline]
    pub(super) fn cwnd(&self) -> u32 {
        if self.draining {
            (self.cwnd / 2).max(2)
        } else {
            self.cwnd
        }
    }

    #[inline]
    pub(super) fn in_recovery(&self) -> bool {
        self.recovery_end.is_some()
    }

    /// An RTT sample (ns).
    #[inline]
    pub(super) fn on_rtt(&mut self, rtt: u64) {
        self.round_min = self.round_min.min(rtt);
        self.round_samples += 1;
    }

    /// The path's least round trip of late: the base a queue adds to.
    fn base_rtt(&self) -> Option<u64> {
        self.mins[..self.mins_len].iter().copied().min()
    }

    /// Whether the round trip shows a queue: the least RTT of this round
    /// (of the last as well while this one has few samples) is an eighth
    /// above the base.
    fn queue_seen(&self) -> bool {
        let recent = if self.round_samples >= ROUND_SAMPLES {
            self.round_min
        } else {
            self.round_min.min(self.last_round_min)
        };
        self.above_base(recent)
    }

    fn above_base(&self, rtt: u64) -> bool {
        match self.base_rtt() {
            Some(base) if rtt != u64::MAX => rtt * 8 > base * QUEUE_EIGHTHS,
            _ => false,
        }
    }

    /// Grows the window for `n` newly delivered segments: by one each in
    /// slow start, by one per window's worth in congestion avoidance.
    /// Steps through runs rather than single segments; the result is the
    /// same as growing segment by segment.
    #[inline]
    pub(super) fn on_delivered(&mut self, mut n: u32) {
        self.round_delivered += u64::from(n);
        if self.recovery_end.is_some() && !self.rto_recovery {
            return;
        }
        while n > 0 {
            // A window above the cap (a cut or a timeout can leave one when
            // the cap is below 2) is clamped after the first step: take
            // that step alone.
            let run = if self.cwnd > self.max_cwnd { 1 } else { n };
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
            self.cwnd = self.cwnd.min(self.max_cwnd);
            n -= k;
        }
    }

    /// The newest delivered transmission is `delivered_xmit`, the newest
    /// sent `sent_xmit`; `una` is the cumulative ACK, `nxt` the next PSN.
    /// Ends the round once a segment sent in it is delivered, and ends
    /// recovery once everything sent before it began is acknowledged.
    pub(super) fn on_progress(
        &mut self,
        delivered_xmit: u64,
        sent_xmit: u64,
        una: u32,
        nxt: u32,
    ) -> Progress {
        if let Some(end) = self.recovery_end {
            if super::psn_le(end, una) {
                self.recovery_end = None;
                self.rto_recovery = false;
            }
        }
        if delivered_xmit <= self.round_end_xmit {
            return Progress::SameRound;
        }
        self.round_end_xmit = sent_xmit;
        Progress::RoundEnded {
            cut: self.end_round(nxt),
        }
    }

    fn end_round(&mut self, nxt: u32) -> bool {
        let lost = self.round_lost;
        let seen = lost + self.round_delivered;
        let cut = lost >= NOISE_MIN && lost * 3 > seen * NOISE_THIRDS && self.cut(nxt);
        if self.draining {
            self.draining = false;
            self.rounds_since_drain = 0;
        } else {
            self.rounds_since_drain += 1;
            self.draining = self.rounds_since_drain >= DRAIN_EVERY
                && self.recovery_end.is_none()
                && self.cwnd >= self.ssthresh;
        }
        // A queue building ends slow start before it overflows (HyStart's
        // delay test): the losses of an overflow in slow start may be few
        // in the round and taken for random ones, and doubling on would
        // overshoot by the window.
        if self.cwnd < self.ssthresh && self.above_base(self.round_min) {
            self.ssthresh = self.cwnd;
        }
        self.learn_loss_rate();
        if self.round_min != u64::MAX {
            self.mins[self.mins_at] = self.round_min;
            self.mins_at = (self.mins_at + 1) % BASE_ROUNDS;
            self.mins_len = (self.mins_len + 1).min(BASE_ROUNDS);
            self.last_round_min = self.round_min;
        }
        self.round_min = u64::MAX;
        self.round_samples = 0;
        self.round_delivered = 0;
        self.round_lost = 0;
        cut
    }

    /// Folds what the last rounds without a queue delivered and lost into
    /// the path's loss rate once they span `LOSS_SAMPLE` segments. A round
    /// with a queue may have lost to it: learnt as the path's, an
    /// overflow would excuse the next, and a flow would keep a shared
    /// queue full against the others.
    fn learn_loss_rate(&mut self) {
        if self.queue_seen() {
            return;
        }
        self.sample_delivered += self.round_delivered;
        self.sample_lost += self.round_lost;
        let n = self.sample_delivered + self.sample_lost;
        if n >= LOSS_SAMPLE {
            let f = self.sample_lost * ONE / n;
            let step = f.min(2 * self.loss_rate + LOSS_STEP).min(MAX_LOSS);
            self.loss_rate = (7 * self.loss_rate + step) / 8;
            self.sample_delivered = 0;
            self.sample_lost = 0;
        }
    }

    /// Whether this round has lost more than a window's worth of the path
    /// usually loses: `DEVIATIONS` standard deviations above the mean (the
    /// binomial count, taken as Poisson), in 1/1024ths of a segment.
    fn beyond_usual_loss(&self) -> bool {
        let mean = u64::from(self.cwnd) * self.loss_rate;
        let deviation = (mean * ONE).isqrt();
        self.round_lost * ONE > mean + DEVIATIONS * deviation
    }

    /// `n` segments were found lost; `nxt` is the next PSN to be sent.
    /// Halves the window, once per window of data, if the round trip shows
    /// a queue and the round has lost more than the path usually does;
    /// otherwise the loss is the path's and only retransmitted.
    pub(super) fn on_loss(&mut self, n: u32, nxt: u32) -> LossResponse {
        self.round_lost += u64::from(n);
        if self.recovery_end.is_some() {
            LossResponse::InRecovery
        } else if !self.queue_seen() || !self.beyond_usual_loss() {
            LossResponse::Random
        } else {
            self.cut(nxt);
            LossResponse::Cut
        }
    }

    /// Halves the window unless it already was for this window of data;
    /// returns whether it did.
    fn cut(&mut self, nxt: u32) -> bool {
        if self.recovery_end.is_some() {
            return false;
        }
        self.ssthresh = (self.cwnd / 2).max(2);
        self.cwnd = self.ssthresh;
        self.cwnd_acc = 0;
        self.recovery_end = Some(nxt);
        self.rounds_since_drain = 0;
        self.draining = false;
        true
    }

    /// The retransmission timer fired with `pipe` segments believed in the
    /// network. The window restarts from two either way; slow start returns
    /// to half of what was in the network if a queue was seen, and to the
    /// window the path sustained if not (a random loss of a whole flight).
    pub(super) fn on_timeout(&mut self, pipe: u32, nxt: u32) {
        if self.queue_seen() {
            self.ssthresh = (pipe / 2).max(2);
        } else if !self.rto_recovery {
            self.ssthresh = self.cwnd.max(2);
        }
        // Loss window of two (RFC 5681 uses one): on a very lossy path one
        // probe and its ACK both survive too rarely.
        self.cwnd = 2;
        self.cwnd_acc = 0;
        self.draining = false;
        self.rounds_since_drain = 0;
        self.recovery_end = Some(nxt);
        self.rto_recovery = true;
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// A sender with window `cwnd` after `rounds` rounds whose least RTT
    /// was `rtt`; returns it and the next transmission number.
    fn settled(cwnd: u32, rtt: u64, rounds: u64) -> (Congestion, u64) {
        let mut c = Congestion::new(cwnd, 1024);
        c.ssthresh = cwnd;
        let mut xmit = 0;
        for _ in 0..rounds {
            c.on_rtt(rtt);
            xmit += 10;
            c.on_progress(xmit, xmit, 0, 0);
        }
        (c, xmit)
    }

    #[test]
    fn random_loss_keeps_the_window() {
        let (mut c, _) = settled(40, 100_000, 8);
        c.on_rtt(105_000);
        assert_eq!(c.on_loss(1, 100), LossResponse::Random);
        assert_eq!(c.on_loss(3, 100), LossResponse::Random);
        assert_eq!(c.cwnd(), 40);
        assert!(!c.in_recovery());
        c.on_delivered(40);
        assert_eq!(c.cwnd(), 41, "the window still grows");
    }

    /// Queued datagrams show in every RTT of a round: a loss then is the
    /// queue's, and halves the window once per window of data.
    #[test]
    fn loss_with_a_queue_halves_once_per_window() {
        let (mut c, xmit) = settled(40, 100_000, 8);
        c.on_rtt(120_000);
        c.on_progress(xmit + 10, xmit + 10, 0, 0);
        c.on_rtt(125_000);
        assert_eq!(c.on_loss(1, 100), LossResponse::Cut);
        assert_eq!(c.cwnd(), 20);
        assert_eq!(c.on_loss(2, 100), LossResponse::InRecovery);
        assert_eq!(c.cwnd(), 20);
        // Everything sent before the cut acknowledged: recovery ends, and
        // the queue, still there, cuts again.
        c.on_progress(xmit + 10, xmit + 10, 100, 150);
        assert_eq!(c.on_loss(1, 150), LossResponse::Cut);
        assert_eq!(c.cwnd(), 10);
    }

    /// One round trip of `cwnd` segments whose least RTT is `rtt` and of
    /// which `lost` are lost; `psn` counts what was sent. Returns whether
    /// the window was cut.
    fn round(c: &mut Congestion, xmit: &mut u64, psn: &mut u32, rtt: u64, lost: u32) -> bool {
        let w = c.cwnd();
        for _ in 0..ROUND_SAMPLES {
            c.on_rtt(rtt);
        }
        c.on_delivered(w - lost.min(w));
        let cut = lost > 0 && c.on_loss(lost, *psn + w) == LossResponse::Cut;
        *xmit += u64::from(w);
        *psn += w;
        let ended = c.on_progress(*xmit, *xmit, *psn, *psn);
        cut || ended == (Progress::RoundEnded { cut: true })
    }

    /// A link that loses a tenth at random, then a queue that stands in two
    /// rounds of three without overflowing (a busy receiver, a host that
    /// delays datagrams): with the path's rate learnt from the rounds
    /// without a queue, the losses of those with one cut no more and the
    /// window grows; a round losing well beyond it still cuts.
    #[test]
    fn a_standing_queue_with_random_loss_keeps_the_window() {
        let (mut c, mut xmit) = settled(40, 100_000, 8);
        let mut psn = 0;
        // The first rounds see no queue; then two in three do.
        let rtt = |i: u32| {
            if i < 40 || i.is_multiple_of(3) {
                100_000
            } else {
                130_000
            }
        };
        // Every tenth segment sent is lost.
        let mut sent = 0;
        let mut tenth = |w: u32| {
            let lost = (sent + w) / 10 - sent / 10;
            sent += w;
            lost
        };
        for i in 0..90 {
            let lost = tenth(c.cwnd());
            round(&mut c, &mut xmit, &mut psn, rtt(i), lost);
        }
        assert!((80..=110).contains(&c.loss_rate), "{}", c.loss_rate);
        let before = c.cwnd;
        for i in 0..60 {
            let lost = tenth(c.cwnd());
            assert!(
                !round(&mut c, &mut xmit, &mut psn, rtt(90 + i), lost),
                "round {i}"
            );
        }
        // The field: `cwnd()` halves while a round drains.
        assert!(c.cwnd > before + 20, "{before} -> {}", c.cwnd);
        let w = c.cwnd;
        assert!(round(&mut c, &mut xmit, &mut psn, 130_000, w / 4));
        assert_eq!(c.cwnd, w / 2);
    }

    /// A clean path's first overflow cuts at once: nothing is excused.
    #[test]
    fn a_clean_path_cuts_on_its_first_queue_loss() {
        let (mut c, mut xmit) = settled(40, 100_000, 8);
        let mut psn = 0;
        for _ in 0..20 {
            assert!(!round(&mut c, &mut xmit, &mut psn, 130_000, 0));
        }
        assert_eq!(c.loss_rate, 0);
        assert!(round(&mut c, &mut xmit, &mut psn, 130_000, 1));
    }

    /// One slow sample is not a queue: the round's least RTT decides.
    #[test]
    fn one_slow_sample_is_not_a_queue() {
        let (mut c, _) = settled(40, 100_000, 8);
        c.on_rtt(300_000);
        c.on_rtt(101_000);
        assert_eq!(c.on_loss(1, 100), LossResponse::Random);
    }

    /// A round that loses more than a third of its segments cuts even
    /// without a queue in sight (a policer); a quarter does not.
    #[test]
    fn a_round_losing_a_third_cuts() {
        let (mut c, xmit) = settled(40, 100_000, 8);
        c.on_delivered(30);
        assert_eq!(c.on_loss(10, 100), LossResponse::Random);
        assert_eq!(
            c.on_progress(xmit + 10, xmit + 20, 0, 100),
            Progress::RoundEnded { cut: false },
            "10 of 40"
        );
        assert_eq!(c.cwnd(), 40);
        c.on_delivered(8);
        assert_eq!(c.on_loss(6, 100), LossResponse::Random);
        assert_eq!(
            c.on_progress(xmit + 30, xmit + 40, 0, 100),
            Progress::RoundEnded { cut: true },
            "6 of 14"
        );
        assert_eq!(c.cwnd(), 20);
    }

    /// A timeout restarts from two; without a queue slow start returns to
    /// the window the path carried, with one to half of what was in flight.
    #[test]
    fn timeout_returns_to_the_window_unless_queued() {
        let (mut c, _) = settled(40, 100_000, 8);
        c.on_timeout(30, 100);
        assert_eq!((c.cwnd(), c.ssthresh), (2, 40));
        c.on_timeout(1, 100);
        assert_eq!(c.ssthresh, 40, "a second timeout keeps it");
        c.on_delivered(38);
        assert_eq!(c.cwnd(), 40);

        let (mut c, xmit) = settled(40, 100_000, 8);
        c.on_rtt(150_000);
        c.on_progress(xmit + 10, xmit + 10, 0, 0);
        c.on_rtt(150_000);
        c.on_timeout(30, 100);
        assert_eq!((c.cwnd(), c.ssthresh), (2, 15));
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
                            let mut s = Congestion::new(4, max_cwnd);
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
}
