//! The connection's QP state, with what only that state has: a closing
//! connection its FINs, a failed one its Terminate, a closed one whether
//! it answers the peer with Abort.

use super::Connection;
use crate::state::{QpState, State, Transition};
use crate::wire::rdmap::Terminate;

#[derive(Debug)]
pub(super) enum Phase {
    Rts,
    Closing(Closing),
    Error(Errored),
    Closed(Closed),
}

impl Phase {
    pub(super) fn qp(&self) -> QpState {
        match self {
            Phase::Rts => QpState::Rts,
            Phase::Closing(_) => QpState::Closing,
            Phase::Error(_) => QpState::Error,
            Phase::Closed(_) => QpState::Closed,
        }
    }
}

/// Closing gracefully: our FIN goes once our work is done, and we close
/// when it is acknowledged and the peer's has arrived.
#[derive(Debug, Default)]
pub(super) struct Closing {
    pub(super) fin_psn: Option<u32>,
    pub(super) peer_fin: bool,
}

/// Failed on an error we detected: the peer must get our Terminate, and
/// we close once it acknowledges it. (A failure we need not report closes
/// at once.)
#[derive(Debug)]
pub(super) struct Errored {
    /// Kept whole: a retransmission rebuilds it.
    pub(super) term: Terminate,
    /// Its PSN, once sent.
    pub(super) term_psn: Option<u32>,
}

#[derive(Debug, Default)]
pub(super) struct Closed {
    /// An Abort is to be sent.
    pub(super) abort_pending: bool,
    /// We failed or aborted: answer the peer's packets with Abort (as TCP
    /// answers a closed connection with RST) so a live peer learns of it.
    pub(super) abort_on_contact: bool,
}

impl Connection {
    /// Takes the edge `F -> T` into `next`, T's data; `Transition` admits
    /// only legal edges, so a wrong one does not compile.
    pub(super) fn goto<F: Transition<T>, T: State>(&mut self, next: Phase) {
        debug_assert_eq!(self.state.qp(), F::STATE);
        debug_assert_eq!(next.qp(), T::STATE);
        self.state = next;
    }

    /// `goto` along `F -> M -> T`, leaving `M` at once: nothing waits
    /// there (a failure with no Terminate to deliver).
    pub(super) fn goto_through<F: Transition<M>, M: Transition<T>, T: State>(
        &mut self,
        next: Phase,
    ) {
        debug_assert_eq!(self.state.qp(), F::STATE);
        debug_assert_eq!(next.qp(), T::STATE);
        self.state = next;
    }
}
