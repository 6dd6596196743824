//! Congestion control: how many segments may be in the network.
//!
//! RFC 5681's window (slow start, one segment per window, halved on
//! congestion) with one change: a loss is taken for congestion only when
//! its round lost more than the path's own noise, and the round trip shows
//! a queue or the round lost a third. A link that loses at random keeps
//! its window (IRN: loss is not a rate signal), while a queue that
//! overflows — a bottleneck shared or too slow — still halves it, as Reno
//! would. TCP Veno tells the two kinds of loss apart the same way.
//!
//! A queue is seen when the least RTT of the last two rounds exceeds the
//! path's base (the least of the last `BASE_ROUNDS` rounds) by an eighth:
//! a full drop-tail queue delays every datagram, a random loss delays none.
//! A queue that stands without overflowing (a busy receiver, a host whose
//! scheduler delays every datagram alike) loses nothing of its own, so a
//! loss with a queue in sight cuts only when the round has lost more than
//! the path's learnt loss rate explains.
//!
//! Losses are counted against the round that sent the segment, not the
//! one that found it lost: a loss is found a round trip and more after
//! its sending, and a host that stalls delivers several rounds' findings
//! at once. A round's count set against what it sent is what a binomial
//! test can judge. The rate is learnt from finished rounds that did not
//! cut and whose own least RTT was at most the median of the last rounds':
//! the half of the rounds when a queue, if there is one, stood lowest. A
//! host whose round trips vary widely (an emulated one) shows a "queue" in
//! nearly every round, and learning only from rounds without one left the
//! rate unlearnt there.

/// Rounds the base RTT is the least of.
const BASE_ROUNDS: usize = 64;
/// A round trip this many eighths above the base shows a queue.
const QUEUE_EIGHTHS: u64 = 9;
/// RTT samples after which a round's least alone says whether a queue
/// stands; with fewer, the last round's is taken too.
const ROUND_SAMPLES: u32 = 4;
/// A round that loses more than this fraction of what it sent (and at
/// least `NOISE_MIN` segments) is congested whatever its RTT: a policer or
/// a queue too short to show in the round trip.
const NOISE_THIRDS: u64 = 1;
const NOISE_MIN: u32 = 4;
/// A round's losses are more than the path's own when they are this many
/// standard deviations above its learnt rate's mean, and when that rate
/// would lose as many in fewer than one round in `UNUSUAL` (a Poisson
/// tail). The deviations alone misjudge a mean below one, where a second
/// loss in a round is common; the tail alone lets a queue overflow longer
/// where the mean is a few segments. One in 100 cut a path losing 1-2 %
/// by chance alone, 20-60 times in 20 s on the VM bed; one in 1,000 let the
/// congested link's queue drop more than its test allows.
const DEVIATIONS: u64 = 3;
const UNUSUAL: f64 = 300.0;
/// Loss rates are kept in 1/1024ths.
const ONE: u64 = 1024;
/// Segments a loss-rate sample spans at least: short rounds add up.
const LOSS_SAMPLE: u64 = 64;
/// Samples the path's loss rate is learnt from: the mean of the middle
/// half. Random loss is in every sample, an overflowing queue's bursts in
/// a few, which the trimmed mean leaves out; the median alone is biased
/// low where a sample holds few losses.
const LOSS_SAMPLES: usize = 16;
/// The most loss the path is believed to have at random: a quarter.
const MAX_LOSS: u64 = ONE / 4;
/// Rounds without a cut after which one round runs at half the window, so
/// that a queue this flow keeps full drains and the base RTT is learnt
/// again: a flow that arrived at a full queue would otherwise take it for
/// the path's and never see congestion (BBR's ProbeRTT, briefly).
const DRAIN_EVERY: u32 = 48;
/// Sending rounds whose segments are followed: a loss is found a round
/// trip and a quarter after its sending at the least (RACK), a lost
/// retransmission later; a round's count is final, and learnt from, when
/// its place is taken.
const LEDGER_ROUNDS: usize = 8;

/// Whether a round that lost `lost` of `sent` lost more than a third: a
/// policer, or a queue too short to show in the round trip.
fn policed(lost: u32, sent: u32) -> bool {
    lost >= NOISE_MIN && u64::from(lost) * 3 > u64::from(sent) * NOISE_THIRDS
}

/// What an ACK's progress meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Progress {
    SameRound,
    RoundEnded,
}

/// The window before a cut, and the round whose losses made it.
#[derive(Clone, Copy, Debug)]
struct Undo {
    round: u32,
    cwnd: u32,
    ssthresh: u32,
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

/// What the segments sent in one round became.
#[derive(Clone, Copy, Debug)]
struct Ledger {
    round: u32,
    sent: u32,
    lost: u32,
    /// The least RTT of its segments (ns); `u64::MAX` without a sample.
    min_rtt: u64,
    /// Its losses cut the window.
    cut: bool,
}

impl Ledger {
    const EMPTY: Ledger = Ledger {
        round: 0,
        sent: 0,
        lost: 0,
        min_rtt: u64::MAX,
        cut: false,
    };
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
    /// The round under way: what it sends is counted against it.
    round: u32,
    ledger: [Ledger; LEDGER_ROUNDS],
    /// The least RTT sampled in this round and in the one before (ns).
    round_min: u64,
    last_round_min: u64,
    round_samples: u32,
    /// The least RTT of each of the last rounds that had a sample.
    mins: [u64; BASE_ROUNDS],
    mins_at: usize,
    mins_len: usize,
    /// The same, in order: the base and the median at a glance, kept per
    /// round by one removal and one insertion (a ping-pong ends a round
    /// per message).
    sorted_mins: [u64; BASE_ROUNDS],
    /// What the rounds since the last loss-rate sample sent and lost.
    sample_sent: u64,
    sample_lost: u64,
    /// The last loss-rate samples, in 1/1024ths.
    samples: [u16; LOSS_SAMPLES],
    samples_len: usize,
    samples_at: usize,
    /// The path's usual loss rate, in 1/1024ths.
    loss_rate: u64,
    /// Rounds since the window was last cut or drained.
    rounds_since_drain: u32,
    /// This round runs at half the window.
    draining: bool,
    /// The last cut, until its round's count stands or a timeout comes.
    undo: Option<Undo>,
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
            round: 0,
            ledger: [Ledger::EMPTY; LEDGER_ROUNDS],
            round_min: u64::MAX,
            last_round_min: u64::MAX,
            round_samples: 0,
            mins: [0; BASE_ROUNDS],
            mins_at: 0,
            mins_len: 0,
            sorted_mins: [0; BASE_ROUNDS],
            sample_sent: 0,
            sample_lost: 0,
            samples: [0; LOSS_SAMPLES],
            samples_len: 0,
            samples_at: 0,
            loss_rate: 0,
            rounds_since_drain: 0,
            draining: false,
            undo: None,
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

    /// A segment is sent (new or again): returns the round to count it in.
    #[inline]
    pub(super) fn on_sent(&mut self) -> u32 {
        let e = &mut self.ledger[self.round as usize % LEDGER_ROUNDS];
        e.sent += 1;
        self.round
    }

    /// The ledger of `round`, while it is kept.
    fn ledger_of(&mut self, round: u32) -> Option<&mut Ledger> {
        let e = &mut self.ledger[round as usize % LEDGER_ROUNDS];
        (e.round == round).then_some(e)
    }

    /// An RTT sample (ns) of a segment sent in `round`.
    #[inline]
    pub(super) fn on_rtt(&mut self, rtt: u64, round: u32) {
        self.round_min = self.round_min.min(rtt);
        self.round_samples += 1;
        if let Some(e) = self.ledger_of(round) {
            e.min_rtt = e.min_rtt.min(rtt);
        }
    }

    /// The path's least round trip of late: the base a queue adds to.
    fn base_rtt(&self) -> Option<u64> {
        self.sorted_mins[..self.mins_len].first().copied()
    }

    /// The median of the last rounds' least RTTs.
    fn median_rtt(&self) -> u64 {
        self.sorted_mins[..self.mins_len]
            .get(self.mins_len / 2)
            .copied()
            .unwrap_or(u64::MAX)
    }

    /// Adds a round's least RTT to the last rounds', in place of the
    /// oldest once there are `BASE_ROUNDS`.
    fn push_min(&mut self, rtt: u64) {
        let mut len = self.mins_len;
        if len == BASE_ROUNDS {
            let old = self.mins[self.mins_at];
            let sorted = &mut self.sorted_mins[..len];
            if let Ok(i) = sorted.binary_search(&old) {
                sorted.copy_within(i + 1.., i);
            }
            len -= 1;
        }
        let sorted = &mut self.sorted_mins[..=len];
        let i = sorted[..len].partition_point(|&m| m < rtt);
        sorted.copy_within(i..len, i + 1);
        sorted[i] = rtt;
        self.mins[self.mins_at] = rtt;
        self.mins_at = (self.mins_at + 1) % BASE_ROUNDS;
        self.mins_len = len + 1;
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
    /// sent `sent_xmit`; `una` is the cumulative ACK. Ends the round once
    /// a segment sent in it is delivered, and ends recovery once
    /// everything sent before it began is acknowledged.
    pub(super) fn on_progress(
        &mut self,
        delivered_xmit: u64,
        sent_xmit: u64,
        una: u32,
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
        self.end_round();
        Progress::RoundEnded
    }

    fn end_round(&mut self) {
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
        if self.round_min != u64::MAX {
            self.push_min(self.round_min);
            self.last_round_min = self.round_min;
        }
        self.round_min = u64::MAX;
        self.round_samples = 0;
        self.round = self.round.wrapping_add(1);
        let slot = self.round as usize % LEDGER_ROUNDS;
        let done = self.ledger[slot];
        self.learn_loss_rate(done);
        self.ledger[slot] = Ledger {
            round: self.round,
            ..Ledger::EMPTY
        };
    }

    /// Folds a finished round into the path's loss rate once the rounds
    /// since the last sample span `LOSS_SAMPLE` segments. A round that cut
    /// is learnt from too: a path with no rate learnt yet cuts on every
    /// loss, and leaving those rounds out would keep its rate at nothing.
    fn learn_loss_rate(&mut self, done: Ledger) {
        if done.sent == 0 || done.min_rtt == u64::MAX || done.min_rtt > self.median_rtt() {
            return;
        }
        self.sample_sent += u64::from(done.sent);
        self.sample_lost += u64::from(done.lost.min(done.sent));
        if self.sample_sent < LOSS_SAMPLE {
            return;
        }
        let f = (self.sample_lost * ONE / self.sample_sent).min(MAX_LOSS);
        self.sample_sent = 0;
        self.sample_lost = 0;
        self.samples[self.samples_at] = f as u16;
        self.samples_at = (self.samples_at + 1) % LOSS_SAMPLES;
        self.samples_len = (self.samples_len + 1).min(LOSS_SAMPLES);
        let mut sorted = self.samples;
        let sorted = &mut sorted[..self.samples_len];
        sorted.sort_unstable();
        let quarter = self.samples_len / 4;
        let middle = &sorted[quarter..self.samples_len - quarter];
        let sum: u64 = middle.iter().map(|&f| u64::from(f)).sum();
        self.loss_rate = sum / middle.len() as u64;
    }

    /// Whether `lost` of `sent` segments is more than the path usually
    /// loses: `DEVIATIONS` standard deviations above the mean (the
    /// binomial count taken as Poisson), and beyond its tail's
    /// `1/UNUSUAL`.
    fn beyond_usual_loss(&self, lost: u32, sent: u32) -> bool {
        let mean = u64::from(sent) * self.loss_rate;
        let deviation = (mean * ONE).isqrt();
        if u64::from(lost) * ONE <= mean + DEVIATIONS * deviation {
            return false;
        }
        // P(X < lost), summed term by term.
        let mean = mean as f64 / ONE as f64;
        let mut term = (-mean).exp();
        let mut below = 0.0;
        for i in 0..lost {
            below += term;
            term *= mean / f64::from(i + 1);
        }
        1.0 - below < 1.0 / UNUSUAL
    }

    /// A segment sent in `round` was found lost; `nxt` is the next PSN to
    /// be sent. Halves the window, once per window of data, if that round
    /// lost more than a third of what it sent, or if the round trip shows
    /// a queue and the round lost more than the path usually does;
    /// otherwise the loss is the path's and only retransmitted.
    pub(super) fn on_loss(&mut self, round: u32, nxt: u32) -> LossResponse {
        // A round no longer kept lost one segment of what the window was.
        let (sent, lost, cut_before) = match self.ledger_of(round) {
            Some(e) => {
                e.lost += 1;
                (e.sent, e.lost, e.cut)
            }
            None => (self.cwnd, 1, false),
        };
        if self.recovery_end.is_some() {
            return LossResponse::InRecovery;
        }
        let unusual = self.beyond_usual_loss(lost, sent);
        if cut_before || !(unusual && (policed(lost, sent) || self.queue_seen())) {
            return LossResponse::Random;
        }
        if let Some(e) = self.ledger_of(round) {
            e.cut = true;
        }
        self.undo = Some(Undo {
            round,
            cwnd: self.cwnd,
            ssthresh: self.ssthresh,
        });
        self.cut(nxt);
        LossResponse::Cut
    }

    /// A segment of `round` counted lost was delivered after all, before
    /// its resend: a round trip longer than the loss test allows, which a
    /// receiver that ran late gives a whole burst at once. The round's count
    /// drops by one; a cut that count made and no longer would is undone
    /// (Eifel, RFC 4015): the window and slow-start threshold come back and
    /// recovery ends. Returns whether a cut was undone.
    pub(super) fn on_spurious(&mut self, round: u32) -> bool {
        let Some(e) = self.ledger_of(round) else {
            return false;
        };
        e.lost = e.lost.saturating_sub(1);
        let (sent, lost) = (e.sent, e.lost);
        let Some(u) = self.undo.filter(|u| u.round == round) else {
            return false;
        };
        if policed(lost, sent) || self.beyond_usual_loss(lost, sent) {
            return false;
        }
        if let Some(e) = self.ledger_of(round) {
            e.cut = false;
        }
        self.undo = None;
        self.cwnd = self.cwnd.max(u.cwnd);
        self.ssthresh = self.ssthresh.max(u.ssthresh);
        self.recovery_end = None;
        true
    }

    /// Halves the window.
    fn cut(&mut self, nxt: u32) {
        self.ssthresh = (self.cwnd / 2).max(2);
        self.cwnd = self.ssthresh;
        self.cwnd_acc = 0;
        self.recovery_end = Some(nxt);
        self.rounds_since_drain = 0;
        self.draining = false;
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
        self.undo = None;
        self.draining = false;
        self.rounds_since_drain = 0;
        self.recovery_end = Some(nxt);
        self.rto_recovery = true;
    }
}
#[cfg(test)]
mod tests;
