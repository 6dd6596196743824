//! How long the application takes to answer what it reads on a connection, so that the
//! ACK it owes the peer waits that long for the answer to carry it
//! (`trp::Connection::set_ack_hold`).
//!
//! A ping-pong, an RPC server or a Read Response's next request answers each receive with
//! a request of its own. When the ACK of the receive goes out before that request, it
//! travels alone, and it wakes a peer that sleeps until the answer: two frames and two
//! wake-ups where one of each would do. How soon the answer follows the read depends on the
//! application and on the host (under emulation, a repost of the receive and a poll of
//! the send queue between the read and the answer took longer than trp's fixed hold in a
//! quarter of the messages), so it is measured, as TCP's RTO is (RFC 6298): a smoothed
//! time from a read to the next post of a request, and its mean deviation.

use std::time::Duration;

use trp::Instant;

/// A connection's answer time.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ReplyTime {
    /// When the application took the first receive completion it has not answered yet.
    read_at: Option<Instant>,
    /// Smoothed time from a read to the answer, and its mean deviation (ns; 0: no sample).
    avg: u64,
    dev: u64,
}

impl ReplyTime {
    /// The application took a receive completion of the connection at `now`.
    pub fn read(&mut self, now: Instant) {
        self.read_at.get_or_insert(now);
    }

    /// The application posted a request at `now`. If it answers a read within `longest`,
    /// returns the hold that covers the application's answers, as measured so far. A post
    /// later than `longest` after the read is taken for no answer: an ACK never waits
    /// that long.
    pub fn posted(&mut self, now: Instant, longest: Duration) -> Option<Duration> {
        let read = self.read_at.take()?;
        let took = now.as_nanos().checked_sub(read.as_nanos())?;
        if took > u64::try_from(longest.as_nanos()).unwrap_or(u64::MAX) {
            return None;
        }
        if self.avg == 0 {
            self.avg = took.max(1);
            self.dev = took / 2;
        } else {
            let err = took.abs_diff(self.avg);
            self.dev = self.dev - self.dev / 4 + err / 4;
            self.avg = self.avg - self.avg / 8 + took / 8;
        }
        Some(Duration::from_nanos(
            self.avg.saturating_add(self.dev.saturating_mul(4)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONGEST: Duration = Duration::from_millis(2);

    fn at(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
    }

    #[test]
    fn a_post_without_a_read_before_it_measures_nothing() {
        let mut r = ReplyTime::default();
        assert_eq!(r.posted(at(10), LONGEST), None);
        r.read(at(20));
        assert!(r.posted(at(30), LONGEST).is_some());
        assert_eq!(r.posted(at(40), LONGEST), None, "one answer per read");
    }

    #[test]
    fn the_answer_is_timed_from_the_first_unanswered_read() {
        let mut r = ReplyTime::default();
        r.read(at(100));
        r.read(at(150));
        // First sample: 200 us, deviation half of it.
        assert_eq!(
            r.posted(at(300), LONGEST),
            Some(Duration::from_micros(200 + 4 * 100))
        );
    }

    #[test]
    fn steady_answers_converge_on_their_time() {
        let mut r = ReplyTime::default();
        let mut hold = None;
        for i in 0..100u64 {
            r.read(at(i * 1000));
            hold = r.posted(at(i * 1000 + 150), LONGEST);
        }
        let hold = hold.unwrap();
        assert!(
            hold >= Duration::from_micros(150) && hold < Duration::from_micros(160),
            "{hold:?}"
        );
    }

    #[test]
    fn a_post_later_than_the_longest_hold_is_no_answer() {
        let mut r = ReplyTime::default();
        r.read(at(0));
        assert_eq!(r.posted(at(2_001), LONGEST), None);
        // The read is consumed: the next answer is timed from the next read.
        r.read(at(5_000));
        assert_eq!(
            r.posted(at(5_100), LONGEST),
            Some(Duration::from_micros(100 + 4 * 50))
        );
    }

    #[test]
    fn a_clock_that_went_back_measures_nothing() {
        let mut r = ReplyTime::default();
        r.read(at(500));
        assert_eq!(r.posted(at(400), LONGEST), None);
    }
}
