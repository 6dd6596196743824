//! What lets an end sleep: the bell's PSN, ACKs that can wait, the FOLLOWS flag.

use super::*;

/// The PSN whose arrival completes a receive: the next one in order while a receive waits
/// for it, none otherwise.
#[test]
fn the_bell_psn_is_the_next_one_while_a_receive_waits() {
    let mut p = pair(Config::default(), Config::default());
    assert_eq!(p.b.conn.bell_psn(), None, "no receive posted");
    post_recv(&mut p.b, 10, 0, 64);
    let next = p.b.conn.expected_psn();
    assert_eq!(p.b.conn.bell_psn(), Some(next));
    send(&mut p, 1, PLAIN_SEND, &sge(0, 8));
    let limit = trp::Instant(p.now.0 + 100_000_000);
    p.run_until(limit, |p| p.b.conn.expected_psn() != next);
    assert_eq!(drain(&mut p.b.conn)[0].wr_id, 10);
    assert_eq!(p.b.conn.bell_psn(), None, "its one receive was taken");
    post_recv(&mut p.b, 11, 0, 64);
    assert_eq!(p.b.conn.bell_psn(), Some(next.wrapping_add(1)));
    p.b.conn.close();
    assert_eq!(p.b.conn.bell_psn(), None, "closing");
}

/// An ACK can wait unread only while nobody waits for one: not for a completion, a
/// response, a request the window holds back or a close.
#[test]
fn acks_can_wait_while_nothing_waits_for_them() {
    let small = Config {
        max_send_wr: 8,
        ..Config::default()
    };
    let mut p = pair(small, Config::default());
    let limit = trp::Instant(p.now.0 + 100_000_000);
    assert!(p.a.conn.acks_can_wait(), "an idle connection");
    let write = |p: &mut Pair, wr_id: u64, signaled: bool| {
        let op = SendOp::RdmaWrite {
            remote_addr: 1 << 19,
            rkey: 2,
        };
        let s = sge(0, 8);
        let wr = SendWr {
            wr_id,
            op,
            sges: &s,
            signaled,
        };
        p.a.conn.post_send(&p.a.mem, &wr).unwrap();
    };
    write(&mut p, 1, false);
    assert!(!p.a.conn.acks_can_wait(), "a request not yet on the wire");
    let sent = p.a.conn.next_psn();
    p.run_until(limit, |p| p.a.conn.next_psn() != sent);
    assert!(p.a.conn.acks_can_wait(), "an unsignaled Write on the wire");
    write(&mut p, 2, true);
    p.run_until(limit, |p| p.a.conn.next_psn() != sent.wrapping_add(1));
    assert!(!p.a.conn.acks_can_wait(), "a signaled Write awaits its ACK");
    p.run_until(limit, |p| !drain(&mut p.a.conn).is_empty());
    assert!(p.a.conn.acks_can_wait(), "acknowledged");
    send(
        &mut p,
        3,
        SendOp::RdmaRead {
            remote_addr: 1 << 19,
            rkey: 2,
        },
        &sge(0, 8),
    );
    p.run_until(limit, |p| p.a.conn.next_psn() != sent.wrapping_add(2));
    assert!(!p.a.conn.acks_can_wait(), "a Read awaits its response");
    p.run_until(limit, |p| !drain(&mut p.a.conn).is_empty());
    assert!(p.a.conn.acks_can_wait());
    // More than half the send queue in flight: the ACK that frees it wakes the poster.
    let room = p.a.conn.send_queue_room();
    let next = p.a.conn.next_psn();
    let many = room / 2 + 1;
    for i in 0..many as u64 {
        write(&mut p, 10 + i, false);
    }
    p.run_until(limit, |p| {
        p.a.conn.next_psn() == next.wrapping_add(many as u32)
    });
    assert!(
        p.a.conn.unacked_psn() != p.a.conn.next_psn(),
        "still in flight"
    );
    assert!(!p.a.conn.acks_can_wait(), "over half the queue in flight");
    p.run_until(limit, |p| p.a.conn.send_queue_room() == room);
    assert!(p.a.conn.acks_can_wait(), "all acknowledged");
    p.a.conn.close();
    assert!(!p.a.conn.acks_can_wait(), "closing");
}

/// The Data packets `a` sent, as (PSN, FOLLOWS set), in the order sent, first
/// transmissions only.
fn follows_flags(sent: &[Vec<u8>]) -> Vec<(u32, bool)> {
    let mut seen = std::collections::BTreeSet::new();
    sent.iter()
        .filter(|d| d[1] == 0)
        .map(|d| {
            let psn = u32::from_be_bytes(d[8..12].try_into().unwrap());
            (psn, d[2] & trp::wire::trp::FLAG_FOLLOWS != 0)
        })
        .filter(|(psn, _)| seen.insert(*psn))
        .collect()
}

#[test]
fn a_packet_says_when_the_next_one_follows_at_once() {
    let mut p = pair(Config::default(), Config::default());
    post_recv(&mut p.b, 10, 0, 8192);
    post_recv(&mut p.b, 11, 0, 64);
    p.ab.capture = Some(Vec::new());
    // A Send of three segments: the first two say the next follows.
    let seg = p.a.conn.max_datagram() as u32;
    send(&mut p, 1, PLAIN_SEND, &sge(0, 2 * seg + 100));
    // An RDMA Write with Immediate: its Write says the Immediate Data follows.
    let op = SendOp::RdmaWriteImm {
        remote_addr: 1 << 19,
        rkey: 2,
        imm: 7,
        solicited: false,
    };
    send(&mut p, 2, op, &sge(0, 8));
    // A plain Write of one segment: nothing follows it.
    let op = SendOp::RdmaWrite {
        remote_addr: 1 << 19,
        rkey: 2,
    };
    send(&mut p, 3, op, &sge(0, 8));
    let mut done = 0;
    p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        done += drain(&mut p.a.conn).len();
        done == 3
    });
    let flags: Vec<bool> = follows_flags(&p.ab.capture.take().unwrap())
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    assert_eq!(flags, [true, true, false, true, false, false]);

    // With room for one packet at a time, the next never follows at once.
    let one = Config {
        initial_cwnd: 1,
        max_cwnd: 1,
        ..Config::default()
    };
    let mut p = pair(one, Config::default());
    post_recv(&mut p.b, 10, 0, 8192);
    p.ab.capture = Some(Vec::new());
    send(&mut p, 1, PLAIN_SEND, &sge(0, 2 * seg + 100));
    p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        !drain(&mut p.a.conn).is_empty()
    });
    let sent = follows_flags(&p.ab.capture.take().unwrap());
    assert_eq!(sent.len(), 3);
    assert!(sent.iter().all(|&(_, f)| !f), "{sent:?}");
}
