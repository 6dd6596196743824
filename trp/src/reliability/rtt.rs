//! The round-trip time estimator and the retransmission timeout it sets
//! (RFC 6298), in nanoseconds.

use core::time::Duration;

/// RFC 6298 clock granularity G.
const GRANULARITY: u64 = 1_000;

#[derive(Debug)]
pub(super) struct Rtt {
    srtt: Option<u64>,
    rttvar: u64,
    /// The largest deviation sampled in the current round trip.
    round_dev: u64,
    /// The timeout, back-off included.
    rto: u64,
    initial_rto_ns: u64,
    min_rto_ns: u64,
    max_rto_ns: u64,
}

impl Rtt {
    pub(super) fn new(initial_rto: Duration, min_rto: Duration, max_rto: Duration) -> Self {
        let initial_rto_ns = initial_rto.as_nanos() as u64;
        Rtt {
            srtt: None,
            rttvar: 0,
            round_dev: 0,
            rto: initial_rto_ns,
            initial_rto_ns,
            min_rto_ns: min_rto.as_nanos() as u64,
            max_rto_ns: max_rto.as_nanos() as u64,
        }
    }

    #[inline]
    pub(super) fn srtt(&self) -> Option<u64> {
        self.srtt
    }

    #[inline]
    pub(super) fn rto(&self) -> u64 {
        self.rto
    }

    /// How long a segment's round trip may usually take on this path: the
    /// smoothed RTT plus twice its variation, and at least a quarter more
    /// (RFC 8985's reordering window). Zero before any sample.
    #[inline]
    pub(super) fn usual_max(&self) -> u64 {
        self.srtt.map_or(0, |s| s + (2 * self.rttvar).max(s / 4))
    }

    /// An RTT sample. The variation rises at once (RFC 6298's step) but
    /// falls only once per round trip, towards the round's largest
    /// deviation (as Linux does): an ACK per two segments would otherwise
    /// shrink it within a round to well below the stalls of a busy host,
    /// and every such stall would fire the retransmission timer.
    pub(super) fn sample(&mut self, r: u64) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
                self.round_dev = self.rttvar;
            }
            Some(srtt) => {
                let dev = srtt.abs_diff(r);
                self.round_dev = self.round_dev.max(dev);
                self.rttvar = self.rttvar.max((3 * self.rttvar + dev) / 4);
                self.srtt = Some((7 * srtt + r) / 8);
            }
        }
        self.rto = self.base_rto();
    }

    /// A round trip ended: the variation moves a quarter of the way down to
    /// the largest deviation the round saw.
    pub(super) fn end_round(&mut self) {
        if self.round_dev < self.rttvar {
            self.rttvar -= (self.rttvar - self.round_dev) / 4;
        }
        self.round_dev = 0;
    }

    /// A timeout fired: wait twice as long for the next.
    pub(super) fn back_off(&mut self) {
        self.rto = (self.rto * 2).min(self.max_rto_ns);
    }

    /// Newly delivered data: drop the back-off.
    pub(super) fn reset_back_off(&mut self) {
        self.rto = self.base_rto();
    }

    /// RTO from the estimator, without back-off.
    fn base_rto(&self) -> u64 {
        match self.srtt {
            None => self.initial_rto_ns,
            Some(srtt) => {
                (srtt + (4 * self.rttvar).max(GRANULARITY)).clamp(self.min_rto_ns, self.max_rto_ns)
            }
        }
    }
}
