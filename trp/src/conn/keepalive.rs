//! Keep-alive: notices a peer gone silent while nothing of ours is
//! unacknowledged, when the retransmission timer is idle and would not.
//!
//! Two cases share it. A requester awaiting Read Responses expects the
//! peer to speak soon, so it probes after one retransmission timeout of
//! silence. An idle connection (a receiver waiting for a message, or no
//! traffic at all) probes after `Config::keepalive` of silence; without it
//! a receiver whose peer vanished (host gone, or its Abort lost) would wait
//! forever. Either way the probes then back off like retransmissions and
//! the connection fails on the same terms (`max_retries` probes and
//! `min_give_up` since the first).

use crate::time::Instant;
use core::time::Duration;

#[derive(Debug, Default)]
pub(super) struct KeepAlive {
    /// When the peer was last heard from. `None` until it first is: an
    /// acceptor's Accept is retransmitted until the peer answers, so the
    /// retransmission timer watches it until then.
    heard_at: Option<Instant>,
    /// Probes sent since then.
    probes: u32,
    /// When the first of those probes was sent.
    silent_since: Option<Instant>,
    /// When the next probe is due, once probing.
    next: Option<Instant>,
    /// Our next ACK asks for one back.
    pending: bool,
}

impl KeepAlive {
    pub(super) fn new(heard_at: Option<Instant>) -> KeepAlive {
        KeepAlive {
            heard_at,
            ..KeepAlive::default()
        }
    }

    /// When the next probe is due if the peer stays silent: `quiet` after
    /// it was last heard, then per the back-off.
    #[inline(always)]
    pub(super) fn deadline(&self, quiet: Duration) -> Option<Instant> {
        let heard = self.heard_at?;
        if self.probes == 0 {
            Some(heard + quiet)
        } else {
            self.next
        }
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
    pub(super) fn heard(&mut self, now: Instant) {
        self.heard_at = Some(now);
        self.probes = 0;
    }

    /// Counts a probe sent now and schedules the next one: `rto` doubled
    /// per probe sent, at most `max_rto`.
    pub(super) fn probe_sent(&mut self, now: Instant, rto: Duration, max_rto: Duration) {
        if self.probes == 0 {
            self.silent_since = Some(now);
        }
        self.probes += 1;
        let backoff = rto * (1u32 << self.probes.min(16));
        self.next = Some(now + backoff.min(max_rto));
        self.pending = true;
    }

    /// Whether the ACK being built is a probe.
    pub(super) fn take_probe(&mut self) -> bool {
        std::mem::take(&mut self.pending)
    }
}
