//! The round-trip time estimator and the retransmission timeout it sets
//! (RFC 6298), in nanoseconds.

use core::time::Duration;

/// RFC 6298 clock granularity G.
const GRANULARITY: u64 = 1_000;

#[derive(Debug)]
pub(super) struct Rtt {
    srtt: Option<u64>,
    rttvar: u64,
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

    pub(super) fn sample(&mut self, r: u64) {
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
