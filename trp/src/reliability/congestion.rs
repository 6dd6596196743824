//! Congestion control: how many segments may be in the network (AIMD,
//! RFC 5681, with SACK-based recovery).

use super::psn_le;

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
        }
    }

    #[inline]
    pub(super) fn cwnd(&self) -> u32 {
        self.cwnd
    }

    #[inline]
    pub(super) fn in_recovery(&self) -> bool {
        self.recovery_end.is_some()
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

    /// The cumulative ACK moved to `una`: recovery ends once everything
    /// sent before it began is acknowledged.
    pub(super) fn on_cumulative(&mut self, una: u32) {
        if let Some(end) = self.recovery_end {
            if psn_le(end, una) {
                self.recovery_end = None;
                self.rto_recovery = false;
            }
        }
    }

    /// Losses were found; `nxt` is the next PSN to be sent. Returns whether
    /// this began a recovery episode (one cut per window of data).
    pub(super) fn on_loss(&mut self, nxt: u32) -> bool {
        if self.recovery_end.is_some() {
            return false;
        }
        self.ssthresh = (self.cwnd / 2).max(2);
        self.cwnd = self.ssthresh;
        self.cwnd_acc = 0;
        self.recovery_end = Some(nxt);
        true
    }

    /// The retransmission timer fired with `pipe` segments believed in the
    /// network.
    pub(super) fn on_timeout(&mut self, pipe: u32, nxt: u32) {
        self.ssthresh = (pipe / 2).max(2);
        // Loss window of two (RFC 5681 uses one): on a very lossy path one
        // probe and its ACK both survive too rarely.
        self.cwnd = 2;
        self.cwnd_acc = 0;
        self.recovery_end = Some(nxt);
        self.rto_recovery = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
