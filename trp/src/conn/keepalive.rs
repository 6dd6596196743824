//! Keep-alive while only Read Responses are awaited: nothing of ours is
//! unacknowledged then, so the retransmission timer is idle and would not
//! notice a peer gone silent.

use crate::time::Instant;
use core::time::Duration;

#[derive(Debug, Default)]
pub(super) struct KeepAlive {
    deadline: Option<Instant>,
    /// Probes sent since the peer was last heard from.
    probes: u32,
    /// When the first of those probes was due.
    silent_since: Option<Instant>,
    /// Our next ACK asks for one back.
    pending: bool,
}

impl KeepAlive {
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    pub(super) fn probes(&self) -> u32 {
        self.probes
    }

    /// How long the peer has not answered a probe.
    pub(super) fn silent_for(&self, now: Instant) -> Duration {
        self.silent_since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// Any packet of the connection shows the peer is alive.
    #[inline(always)]
    pub(super) fn heard(&mut self) {
        self.probes = 0;
        self.silent_since = None;
        self.deadline = None;
    }

    /// Whether the deadline has passed; if so it is spent and one more
    /// probe counted.
    pub(super) fn expired(&mut self, now: Instant) -> bool {
        if self.deadline.is_some_and(|d| d <= now) {
            self.deadline = None;
            self.probes += 1;
            self.silent_since.get_or_insert(now);
            true
        } else {
            false
        }
    }

    pub(super) fn send_probe(&mut self) {
        self.pending = true;
    }

    /// Whether the ACK being built is a probe.
    pub(super) fn take_probe(&mut self) -> bool {
        std::mem::take(&mut self.pending)
    }

    /// Arms the deadline while `waiting`, backing off per probe already
    /// sent; disarms it otherwise.
    #[inline(always)]
    pub(super) fn arm(&mut self, now: Instant, waiting: bool, rto: Duration, max_rto: Duration) {
        if !waiting {
            self.deadline = None;
            self.probes = 0;
            self.silent_since = None;
        } else if self.deadline.is_none() {
            let backoff = rto * (1u32 << self.probes.min(16));
            self.deadline = Some(now + backoff.min(max_rto));
        }
    }
}
