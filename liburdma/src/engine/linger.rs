//! Destroyed QPs whose connections finish their graceful close ([`Lingering`]).

use super::{progress_one, Attended, Engine, IntMap, Progress, Qp, QpKey};
use std::time::Duration;
use trp::Instant;

/// A destroyed QP whose graceful close had begun: its connection finishes the FIN exchange
/// on its flow, as a TCP socket closed by its application does, so that the peer sees the
/// close it was told of and not an Abort. Nothing of the application's is reachable from it
/// (no memory: what it still sends was copied out when the QP was destroyed, trp's
/// `Connection::release_memory`; no CQ), and its number may already serve a new QP.
pub(super) struct Lingering {
    pub(super) key: QpKey,
    pub(super) qp: Qp,
    /// Given up at this time: set at its first round.
    pub(super) until: Option<Instant>,
}

/// How long a destroyed QP's connection may take to finish its close. Shorter than trp's
/// give-up time, which would hold the flow and its socket for seconds after a peer that
/// vanished.
pub const LINGER_LIMIT: Duration = Duration::from_secs(2);

impl Engine {
    /// The QPs and flows of lingering connections that finished since the last call.
    pub fn take_lingered(&mut self) -> Vec<(QpKey, u32)> {
        std::mem::take(&mut self.lingered)
    }

    /// A round over the lingering connections: each takes what arrived and sends what it
    /// owes, and goes when its close is over (its last datagrams gone) or its time is up.
    pub(super) fn linger(&mut self, now: Instant, p: &mut Progress) {
        let mut i = 0;
        while i < self.lingering.len() {
            let l = &mut self.lingering[i];
            let until = *l.until.get_or_insert(now + LINGER_LIMIT);
            let (mut cqs, mut srqs, mut limits, mut notices) =
                (IntMap::default(), IntMap::default(), Vec::new(), Vec::new());
            let srqs_ = (&mut srqs, &mut limits);
            progress_one(
                &mut self.no_mrs,
                srqs_,
                &mut cqs,
                &mut notices,
                l.key,
                &mut l.qp,
                now,
                Attended::No,
                p,
            );
            let over = l.qp.conn.as_ref().map(|c| c.state()) != Some(trp::QpState::Closing);
            let sent = !l.qp.flow.as_ref().is_some_and(|f| f.backlogged());
            if (over && sent) || now >= until {
                let l = self.lingering.swap_remove(i);
                self.lingered.push((l.key, l.qp.flow_id));
                continue;
            }
            i += 1;
        }
    }
}
