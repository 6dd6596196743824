//! A shared receive queue: receives that every connection created with
//! [`Config::srq`](crate::Config::srq) takes, in posting order, as its
//! messages start.
//!
//! A connection takes a receive only for the message it is placing in PSN
//! order (a segment that arrives ahead of a gap waits for its retransmission,
//! as one without a posted receive does), so it never holds a receive that no
//! message has reached: when it fails, only the message it was placing is
//! flushed, and every other receive stays with the queue for the others.

use std::collections::VecDeque;

use super::rx::RqEntry;
use super::sgl::check_sges;
use crate::mr::{Access, Memory};
use crate::verbs::{PostError, RecvWr};

#[derive(Clone, Debug)]
pub struct Srq {
    pd: u32,
    max_wr: usize,
    rq: VecDeque<RqEntry>,
    /// Armed limit (0: none): once fewer receives than this are left, the
    /// owner is told once ([`Srq::take_limit_event`]) and the limit is
    /// disarmed, as `IBV_EVENT_SRQ_LIMIT_REACHED` is.
    limit: u32,
    limit_reached: bool,
}

impl Srq {
    /// A queue of up to `max_wr` receives in protection domain `pd`.
    pub fn new(pd: u32, max_wr: usize) -> Srq {
        Srq {
            pd,
            max_wr,
            rq: VecDeque::new(),
            limit: 0,
            limit_reached: false,
        }
    }

    /// Posts a receive after checking its SGEs for local write in the
    /// queue's PD.
    pub fn post<M: Memory + ?Sized>(&mut self, mem: &M, wr: &RecvWr<'_>) -> Result<(), PostError> {
        if self.rq.len() >= self.max_wr {
            return Err(PostError::QueueFull);
        }
        let len = check_sges(mem, self.pd, wr.sges, Access::LOCAL_WRITE)?;
        self.rq.push_back(RqEntry::new(wr, len));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.rq.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rq.is_empty()
    }

    pub fn max_wr(&self) -> usize {
        self.max_wr
    }

    /// Arms the limit (0 disarms it). Already below it: the event comes
    /// with the next receive taken, as with a hardware SRQ.
    pub fn set_limit(&mut self, limit: u32) {
        self.limit = limit;
    }

    /// The armed limit; 0 once it has been reached.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Whether the queue fell below its armed limit since the last call.
    pub fn take_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }

    /// The oldest receive, for a message that starts now.
    pub(super) fn take(&mut self) -> Option<RqEntry> {
        let e = self.rq.pop_front()?;
        if self.limit != 0 && self.rq.len() < self.limit as usize {
            self.limit = 0;
            self.limit_reached = true;
        }
        Some(e)
    }
}
