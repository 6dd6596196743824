//! A peer gone silent or vanished: retransmission, keep-alive probes, lost Aborts.

use super::*;

/// A requester that only awaits Read Responses has nothing unacknowledged;
/// keep-alive probes must still notice a peer gone silent.
fn read_then_silence() -> Pair {
    let mut p = pair(Config::default(), Config::default());
    send(
        &mut p,
        1,
        SendOp::RdmaRead {
            remote_addr: 1 << 19,
            rkey: 2,
        },
        &sge(0, 400_000),
    );
    let start = p.a.conn.expected_psn();
    assert!(p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        p.a.conn.expected_psn().wrapping_sub(start) > 10
            && p.a.conn.unacked_psn() == p.a.conn.next_psn()
    }));
    p.ba.up = false;
    p
}

/// b aborts while its packets to a are lost, so a never hears of it;
/// then the path heals.
fn abort_b_unheard(p: &mut Pair) {
    p.ba.up = false;
    let now = p.now;
    p.b.conn.abort(now);
    p.run_until(trp::Instant(p.now.0 + 1_000_000), |_| false);
    assert_eq!(p.b.conn.state(), QpState::Closed);
    assert_eq!(p.a.conn.state(), QpState::Rts);
    p.ba.up = true;
}

#[test]
fn silent_read_responder_detected_by_probes() {
    let mut p = read_then_silence();
    p.ab.up = false;
    let t0 = p.now;
    // min_give_up (10 s) from the first probe, plus the last back-off.
    let limit = trp::Instant(t0.0 + 11_000_000_000);
    let c = a_fails(&mut p, limit, FailReason::RetryExceeded);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::RetryExceeded));
}

#[test]
fn failed_peer_answers_with_abort() {
    let mut p = read_then_silence();
    abort_b_unheard(&mut p);
    // a's next keep-alive probe is answered with Abort.
    let limit = trp::Instant(p.now.0 + 10_000_000_000);
    let c = a_fails(&mut p, limit, FailReason::PeerAborted);
    assert_eq!(c[0].status, WcStatus::Flush);
}

/// A connection that has said all it had to: a receiver waiting for a
/// message, with every packet of ours acknowledged.
fn idle_receiver() -> Pair {
    let mut p = pair(Config::default(), Config::default());
    post_recv(&mut p.a, 7, 0, 64);
    post_recv(&mut p.b, 1, 0, 64);
    send(&mut p, 1, PLAIN_SEND, &sge(0, 10));
    let mut sent = None;
    assert!(p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        sent = sent.or_else(|| p.a.conn.poll_completion());
        sent.is_some() && p.a.conn.unacked_psn() == p.a.conn.next_psn()
    }));
    assert_eq!(sent.unwrap().status, WcStatus::Success);
    assert_eq!(drain(&mut p.b.conn)[0].status, WcStatus::Success);
    p
}

/// The peer's host vanishes while we only wait for its messages: the
/// retransmission timer has nothing to time, so only the keep-alive can
/// notice. It does, after `keepalive` of silence and `min_give_up` of
/// unanswered probes, and not before.
#[test]
fn idle_receiver_notices_vanished_peer() {
    let cfg = Config::default();
    let mut p = idle_receiver();
    p.ab.up = false;
    p.ba.up = false;
    let t0 = p.now;
    let early = t0.0 + (cfg.keepalive + cfg.min_give_up).as_nanos() as u64;
    let late = early + cfg.max_rto.as_nanos() as u64 + 100_000_000;
    let c = a_fails(&mut p, trp::Instant(late), FailReason::RetryExceeded);
    assert!(
        p.now.0 >= early,
        "gave up {} ms early",
        (early - p.now.0) / 1_000_000
    );
    assert_eq!((c[0].wr_id, c[0].status), (7, WcStatus::Flush));
}

/// Idle but alive: the probes are answered, the connection stays up, and
/// they cost about one datagram each way per `keepalive`.
#[test]
fn idle_connection_stays_up_at_a_probe_per_interval() {
    let cfg = Config::default();
    let mut p = idle_receiver();
    p.ab.capture = Some(Vec::new());
    p.ba.capture = Some(Vec::new());
    let idle = 60_000_000_000u64;
    p.run_until(trp::Instant(p.now.0 + idle), |_| false);
    assert_eq!(p.a.conn.state(), QpState::Rts);
    assert_eq!(p.b.conn.state(), QpState::Rts);
    let intervals = idle / cfg.keepalive.as_nanos() as u64;
    for (dir, sent) in [("a to b", &p.ab.capture), ("b to a", &p.ba.capture)] {
        let n = sent.as_ref().unwrap().len() as u64;
        assert!(
            n >= intervals / 2 && n <= intervals + 2,
            "{dir}: {n} datagrams in {intervals} intervals"
        );
    }
    // Still a working connection.
    post_recv(&mut p.b, 8, 0, 64);
    send(&mut p, 2, PLAIN_SEND, &sge(0, 10));
    assert!(p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        p.b.conn.poll_completion().is_some_and(|c| c.wr_id == 8)
    }));
}

/// The peer aborted and its Abort was lost: an idle receiver learns it
/// from the answer to its next probe instead of waiting forever.
#[test]
fn idle_receiver_learns_of_lost_abort() {
    let cfg = Config::default();
    let mut p = idle_receiver();
    abort_b_unheard(&mut p);
    let bound = cfg.keepalive.as_nanos() as u64 + 100_000_000;
    let limit = trp::Instant(p.now.0 + bound);
    let c = a_fails(&mut p, limit, FailReason::PeerAborted);
    assert_eq!(c[0].status, WcStatus::Flush);
}
