//! One QP's share of a round of progress: its flow's datagrams in, its timers, its
//! datagrams out, its completions to their CQs. A part of [`super::Engine`], which owns
//! the QPs, CQs and tables these functions are handed.

use super::*;
use urdma_shared::qpstats::{self, Counter};

/// Who makes the round, and whether the application may post a reply to what it receives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Attended {
    /// The application, in one of its calls.
    App,
    /// The helper, while the application called recently: it may be spinning on its memory.
    Helper,
    /// The helper, while the application is away or asleep.
    No,
}

/// One QP's share of a round of [`Engine::progress`].
#[allow(clippy::too_many_arguments)]
pub(super) fn progress_one(
    mrs: &mut MrTable,
    srqs: Srqs<'_>,
    cqs: &mut IntMap<CqKey, Cq>,
    notices: &mut Vec<Notice>,
    key: QpKey,
    qp: &mut Qp,
    now: Instant,
    who: Attended,
    p: &mut Progress,
) {
    if progress_qp(mrs, srqs, key, qp, now, who, notices) {
        p.busy = true;
    }
    if deliver(cqs, key, qp) {
        p.busy = true;
    }
    if qp.flow.as_ref().is_some_and(|f| f.backlogged()) {
        p.backlogged = true;
    }
    p.awaits_reader |= qp.awaits_reader;
    if let Some(t) = qp.conn.as_ref().and_then(|c| c.poll_timeout()) {
        if qp.flow.is_some() {
            p.deadline = Some(p.deadline.map_or(t, |d| d.min(t)));
        }
    }
}

/// [`Engine::send_held_ack`]'s work: the held ACK, and whatever else is ready to go with it.
pub(super) fn send_held_ack(mrs: &mut MrTable, key: QpKey, qp: &mut Qp, now: Instant) {
    let inline = qp.inline_region();
    let (Some(conn), Some(flow)) = (qp.conn.as_mut(), qp.flow.as_mut()) else {
        return;
    };
    if !conn.holds_ack() {
        return;
    }
    conn.release_held_ack();
    let mem = mrs.view(key.0, Some(key.1), inline, None);
    let dg = conn.max_datagram();
    flow.transmit(dg, &mut |buf| conn.poll_transmit(now, &mem, buf));
}

/// A connection's figures as urdmad's table holds them ([`urdma_shared::qpstats`]).
pub(super) fn figures(conn: &Connection) -> qpstats::Values {
    let (rx, tx) = (conn.stats(), conn.sender_stats());
    let mut v = [0; qpstats::COUNTERS];
    v[Counter::RxPackets as usize] = rx.rx_packets;
    v[Counter::TxPackets as usize] = tx.sent + tx.retransmitted + rx.tx_acks;
    v[Counter::Retransmissions as usize] = tx.retransmitted;
    v[Counter::Timeouts as usize] = tx.timeouts;
    v[Counter::Duplicates as usize] = rx.rx_duplicates;
    v[Counter::CrcErrors as usize] = rx.rx_crc_errors;
    v[Counter::Malformed as usize] = rx.rx_malformed;
    v[Counter::SrttUs as usize] = conn.srtt().map_or(0, |d| d.as_micros() as u64);
    v
}

/// Most receive bursts one round takes from a flow before moving on.
const MAX_RX_BURSTS: usize = 64;

/// The engine's SRQs and the list of those that fell below their limit.
type Srqs<'a> = (&'a mut IntMap<SrqKey, (u32, Srq)>, &'a mut Vec<SrqKey>);

#[allow(clippy::too_many_arguments)]
fn progress_qp(
    mrs: &mut MrTable,
    (srqs, srq_limits): Srqs<'_>,
    key: QpKey,
    qp: &mut Qp,
    now: Instant,
    who: Attended,
    notices: &mut Vec<Notice>,
) -> bool {
    let inline = qp.inline_region();
    let Some(conn) = qp.conn.as_mut() else {
        return false;
    };
    let mut work = false;
    // An ACK held since an earlier round keeps the wait that round gave it: a later frame
    // (the peer's ACK of our data) must not start it again.
    let held_before = conn.holds_ack();
    let mut placed = false;
    if let Some(flow) = qp.flow.as_mut() {
        let srq = qp.init.srq.and_then(|k| srqs.get_mut(&k)).map(|(_, q)| q);
        let mut mem = mrs.view(key.0, Some(key.1), inline, srq);
        // Everything that has arrived first (bounded): a timer must not fire
        // for data whose acknowledgement is still waiting in the ring.
        let mut n = 0;
        for _ in 0..MAX_RX_BURSTS {
            let k = flow.receive(&mut |dgs| {
                conn.handle_datagram_burst(now, &mut mem, dgs);
            });
            n += k;
            if k == 0 {
                break;
            }
        }
        if n > 0 {
            // Before any of it completes where the application can see it: if it exits on
            // that, urdmad's Abort says what arrived, and the peer's sends succeed.
            if let Some(slot) = flow.figures() {
                slot.set_received(conn.expected_psn());
            }
        }
        if who == Attended::No {
            conn.release_held_ack();
        }
        let timed_out = conn.poll_timeout().is_some_and(|t| t <= now);
        if timed_out {
            conn.handle_timeout(now);
        }
        let dg = conn.max_datagram();
        // Before what leaves: an ACK that must be read at once may come as soon as it has.
        flow.acks_can_wait(conn.acks_can_wait());
        let m = flow.transmit(dg, &mut |buf| conn.poll_transmit(now, &mem, buf));
        work = n + m > 0 || flow.backlogged();
        placed = n > 0;
        // After the ring is drained: a frame that came meanwhile was told the old PSN and
        // wakes the helper as without a bell.
        flow.ring_for(conn.bell_psn());
        flow.acks_can_wait(conn.acks_can_wait());
        // Figures change only with datagrams and timers.
        let due = qp.figures_due.is_none_or(|t| t <= now);
        let moved = n + m > 0 || qp.figures_stale;
        if timed_out || (moved && due) {
            if let Some(slot) = flow.figures() {
                slot.publish(&figures(conn));
                qp.figures_due = Some(now + FIGURES_PERIOD);
            }
            qp.figures_stale = false;
        } else if moved {
            qp.figures_stale = true;
        }
    }
    if let Some(k) = qp.init.srq {
        if srqs.get_mut(&k).is_some_and(|(_, q)| q.take_limit_event()) {
            srq_limits.push(k);
        }
    }
    let mut ended = None;
    while let Some(e) = conn.poll_event() {
        work = true;
        match e {
            Event::PeerClosed => {
                if qp.end != End::Told {
                    notices.push(Notice::PeerClosed(key));
                }
            }
            Event::Closed => {
                // As for a failure: what the connection went through
                // (URDMA_LOG=info), for applications that exit without
                // destroying their QPs.
                crate::log::info(format_args!(
                    "QP {}/{}: connection closed (conn {:#x} peer {:#x}; stats {:?}, {:?})",
                    key.0,
                    key.1,
                    conn.local_conn(),
                    conn.peer_conn(),
                    conn.stats(),
                    conn.sender_stats()
                ));
                ended = Some(0)
            }
            Event::Failed(r) => {
                // The sender's side says what a RetryExceeded waited for: how much was
                // retransmitted, how many timeouts, the last round-trip estimate.
                // The ids and sequence numbers pair the two ends' lines of one connection.
                crate::log::info(format_args!(
                    "QP {}/{}: connection failed: {r:?} (conn {:#x} peer {:#x} una {:#x} nxt {:#x} expected {:#x}; stats {:?}, {:?}, srtt {:?}, cwnd {})",
                    key.0,
                    key.1,
                    conn.local_conn(),
                    conn.peer_conn(),
                    conn.unacked_psn(),
                    conn.next_psn(),
                    conn.expected_psn(),
                    conn.stats(),
                    conn.sender_stats(),
                    conn.srtt(),
                    conn.cwnd()
                ));
                qp.failed = true;
                ended = Some(fail_errno(r))
            }
        }
    }
    if let Some(status) = ended {
        if qp.end == End::Open {
            qp.end = End::Draining {
                status,
                until: now + FINAL_SEND_LIMIT,
            };
        }
    }
    if let End::Draining { status, until } = qp.end {
        // This round's transmit came after what ended the connection, so it made the last
        // datagrams; a flow that took them all has nothing left (see FINAL_SEND_LIMIT).
        if !qp.flow.as_ref().is_some_and(|f| f.backlogged()) || now >= until {
            qp.end = End::Told;
            qp.closed_flow = qp.flow.take();
            notices.push(Notice::end(key, status, qp.kernel_ended));
        }
    }
    let start = qp.out.len();
    let mut received = false;
    while let Some(c) = conn.poll_completion() {
        received |= c.queue == Queue::Recv;
        qp.out.push_back(c);
    }
    if who != Attended::No {
        if received {
            // The reply, if one comes, follows the application's poll of this completion.
            conn.hold_ack_for_reader(now);
        } else if placed && !held_before && conn.holds_ack() {
            // What asked for it went to memory, which the application may be spinning on:
            // the reply, if one comes, is its next call.
            conn.hold_ack_for_reader(now);
            qp.awaits_reader = true;
        }
    }
    sends_first(&mut qp.out, start);
    work
}

/// Puts the send-queue completions among `out[start..]` (those of one
/// round) before its receive completions, each queue keeping its order.
///
/// trp completes a request when a packet acknowledges it, after it placed
/// what that packet carries: a message the peer sent after it received
/// ours can complete before our request does. An application that answers
/// messages one at a time (verify's ACKs) would see the answer before the
/// completion of what it answers. Verbs orders each queue's completions,
/// not the two queues against each other, so this order is as legal as
/// trp's and respects causality.
pub(super) fn sends_first(out: &mut VecDeque<Completion>, start: usize) {
    let mut seen_recv = false;
    let mut needed = false;
    for c in out.range(start..) {
        match c.queue {
            Queue::Recv => seen_recv = true,
            Queue::Send if seen_recv => {
                needed = true;
                break;
            }
            Queue::Send => {}
        }
    }
    if !needed {
        return;
    }
    let round: Vec<Completion> = out.drain(start..).collect();
    out.extend(round.iter().filter(|c| c.queue == Queue::Send).copied());
    out.extend(round.iter().filter(|c| c.queue == Queue::Recv).copied());
}

/// Moves a QP's completions into its CQs while they have room.
fn deliver(cqs: &mut IntMap<CqKey, Cq>, key: QpKey, qp: &mut Qp) -> bool {
    let mut any = false;
    while let Some(c) = qp.out.front() {
        let cqk = match c.queue {
            Queue::Send => qp.init.send_cq,
            Queue::Recv => qp.init.recv_cq,
        };
        match cqs.get_mut(&cqk) {
            Some(cq) if cq.room() == 0 => break,
            Some(cq) => {
                cq.push(to_wc(c, key.1), c.solicited);
            }
            None => {}
        }
        qp.out.pop_front();
        any = true;
    }
    any
}
