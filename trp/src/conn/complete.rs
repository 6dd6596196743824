//! Completion: finishing send work as the peer acknowledges it, closing
//! once both FINs are through, and failing: every outstanding request
//! completes with an error and the peer is told why.

use super::states::{Closed, Errored, Phase};
use super::{Connection, Event, FailReason};
use crate::reliability::psn_lt;
use crate::state;
use crate::terminate::ErrorType;
use crate::verbs::{Completion, Queue, SendOp, WcOpcode, WcStatus};
use crate::wire::rdmap::Terminate;

/// A failure, whole: why, and what the oldest outstanding requests
/// complete with when the error is theirs (the rest get Flush).
#[derive(Clone, Copy, Debug)]
pub(super) struct Failure {
    reason: FailReason,
    send_status: Option<WcStatus>,
    recv_status: Option<WcStatus>,
}

impl Failure {
    fn new(reason: FailReason) -> Failure {
        Failure {
            reason,
            send_status: None,
            recv_status: None,
        }
    }

    /// The peer stopped acknowledging.
    pub(super) fn retry_exceeded() -> Failure {
        Failure::new(FailReason::RetryExceeded)
    }

    pub(super) fn aborted() -> Failure {
        Failure::new(FailReason::Aborted)
    }

    pub(super) fn peer_aborted() -> Failure {
        Failure::new(FailReason::PeerAborted)
    }

    /// We found an error: the peer gets `t`.
    pub(super) fn detected(t: Terminate) -> Failure {
        Failure::new(FailReason::TerminateSent(t))
    }

    /// The peer reported an error: it was about our oldest send, which
    /// completes with what the error's type means.
    pub(super) fn reported(t: Terminate) -> Failure {
        let status = if t.error_type().is_some_and(ErrorType::is_protection) {
            WcStatus::RemoteAccess
        } else {
            WcStatus::RemoteOperation
        };
        Failure {
            send_status: Some(status),
            ..Failure::new(FailReason::TerminateReceived(t))
        }
    }

    /// The error was about the oldest receive, which completes with
    /// `status`.
    pub(super) fn with_recv_status(self, status: WcStatus) -> Failure {
        Failure {
            recv_status: Some(status),
            ..self
        }
    }
}

impl Completion {
    /// A send work request's completion; `byte_len` is the request's
    /// length on success and 0 otherwise.
    pub(super) fn send(wr_id: u64, op: &SendOp, status: WcStatus, byte_len: u32) -> Completion {
        Completion {
            wr_id,
            queue: Queue::Send,
            status,
            opcode: op.wc_opcode(),
            byte_len,
            imm: None,
            invalidated: None,
            solicited: false,
        }
    }

    /// A receive that ended without a message.
    pub(super) fn recv_failed(wr_id: u64, status: WcStatus) -> Completion {
        Completion {
            wr_id,
            queue: Queue::Recv,
            status,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm: None,
            invalidated: None,
            solicited: false,
        }
    }

    /// A receive that got a message: a Send (`imm` None) or a Write with
    /// Immediate, whose `len` is the Write's.
    pub(super) fn received(
        wr_id: u64,
        len: u32,
        imm: Option<u32>,
        invalidated: Option<u32>,
        solicited: bool,
    ) -> Completion {
        Completion {
            wr_id,
            queue: Queue::Recv,
            status: WcStatus::Success,
            opcode: if imm.is_some() {
                WcOpcode::RecvRdmaWithImm
            } else {
                WcOpcode::Recv
            },
            byte_len: len,
            imm,
            invalidated,
            solicited,
        }
    }
}

impl Connection {
    /// Completes finished send work in order and finishes closes.
    #[inline(always)]
    pub(super) fn progress(&mut self) {
        // The common case on a receiving end: nothing of ours to finish.
        if matches!(self.state, Phase::Rts) && self.sq.entries.is_empty() {
            return;
        }
        let una = self.tx.una();
        if matches!(self.state, Phase::Rts | Phase::Closing(_)) {
            self.complete_finished();
        }
        match &self.state {
            Phase::Closing(c) if c.peer_fin && c.fin_psn.is_some_and(|p| psn_lt(p, una)) => {
                self.finish_close();
            }
            Phase::Error(e) if e.term_psn.is_some_and(|p| psn_lt(p, una)) => {
                self.tx.clear();
                self.sq.entries.clear();
                self.goto::<state::Error, state::Closed>(Phase::Closed(Closed::default()));
            }
            _ => {}
        }
    }

    /// Completes, in order, the send work the peer has acknowledged (or answered).
    #[inline(always)]
    fn complete_finished(&mut self) {
        let una = self.tx.una();
        while let Some(e) = self.sq.entries.front() {
            let done = e.issued
                && if e.op.awaits_response() {
                    e.reads_done >= e.reads_total
                } else {
                    psn_lt(e.last_psn, una)
                };
            if !done {
                break;
            }
            let e = self.sq.entries.pop_front().expect("front exists");
            self.sq.head_seq += 1;
            self.sq.cursor -= 1;
            if e.signaled {
                self.cq
                    .push_back(Completion::send(e.wr_id, &e.op, WcStatus::Success, e.len));
            }
        }
    }

    fn flush_rq(&mut self, first: Option<WcStatus>) {
        let mut first = first;
        while let Some(e) = self.recv.rq.pop_front() {
            let status = first.take().unwrap_or(WcStatus::Flush);
            self.cq.push_back(Completion::recv_failed(e.wr_id, status));
        }
    }

    /// Closing ends, gracefully: the receives left are flushed.
    pub(super) fn finish_close(&mut self) {
        self.goto::<state::Closing, state::Closed>(Phase::Closed(Closed::default()));
        self.flush_rq(None);
        self.events.push_back(Event::Closed);
    }

    /// Moves to Error: completes all outstanding work (the requests `f`
    /// names with its statuses, sends already transmitted with
    /// RetryExceeded when the peer stopped answering, everything else
    /// Flush) and, if we detected the error, queues its Terminate.
    pub(super) fn fail(&mut self, f: Failure) {
        let from_rts = match self.state {
            Phase::Rts => true,
            Phase::Closing(_) => false,
            Phase::Error(_) | Phase::Closed(_) => return,
        };
        // What the peer acknowledged (often in the very datagram that makes us fail) was
        // received: it completes as such, not flushed. Not so under the peer's Terminate,
        // which acknowledges the message it refuses along with those before it.
        if !matches!(f.reason, FailReason::TerminateReceived(_)) {
            self.complete_finished();
        }
        let retry = f.reason == FailReason::RetryExceeded;
        let mut first = f.send_status;
        for e in &self.sq.entries {
            let status = first.take().unwrap_or(if retry && e.started {
                WcStatus::RetryExceeded
            } else {
                WcStatus::Flush
            });
            self.cq
                .push_back(Completion::send(e.wr_id, &e.op, status, 0));
        }
        // Entries stay (without further completions) while earlier segments
        // that reference them may still be retransmitted before the
        // Terminate; they are dropped when the connection is Closed.
        self.sq.cursor = self.sq.entries.len();
        self.flush_rq(f.recv_status);
        self.sq.reads_out.clear();
        self.responses.clear();
        self.events.push_back(Event::Failed(f.reason));
        if let FailReason::TerminateSent(term) = f.reason {
            let next = Phase::Error(Errored {
                term,
                term_psn: None,
            });
            if from_rts {
                self.goto::<state::Rts, state::Error>(next);
            } else {
                self.goto::<state::Closing, state::Error>(next);
            }
            return;
        }
        self.tx.clear();
        self.sq.entries.clear();
        // A peer that stopped answering, or our own abort, is told by Abort.
        let abort = matches!(f.reason, FailReason::RetryExceeded | FailReason::Aborted);
        let next = Phase::Closed(Closed {
            abort_pending: abort,
            abort_on_contact: abort,
        });
        if from_rts {
            self.goto_through::<state::Rts, state::Error, state::Closed>(next);
        } else {
            self.goto_through::<state::Closing, state::Error, state::Closed>(next);
        }
    }
}
