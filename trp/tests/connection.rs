//! Connection life cycle and error paths through the simulator.

use trp::sim::{Endpoint, LinkConfig, Pair};
use trp::terminate::{Cause, OperationCode, TaggedCode, UntaggedCode};
use trp::wire::crc;
use trp::{
    Access, Completion, Config, Event, FailReason, Incoming, Memory, QpState, Queue, RecvWr,
    Region, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

/// A Send that neither invalidates nor asks for a solicited event.
const PLAIN_SEND: SendOp = SendOp::Send {
    invalidate: None,
    solicited: false,
};

/// Both ends get `trp::sim::memory`: STag 1 for the lower half, local;
/// STag 2 for the upper half (from `1 << 19`), remote.
fn pair(cfg_a: Config, cfg_b: Config) -> Pair {
    Pair::builder()
        .configs(cfg_a, cfg_b)
        .seed(7)
        .connect()
        .unwrap()
}

fn drain(c: &mut trp::Connection) -> Vec<Completion> {
    std::iter::from_fn(|| c.poll_completion()).collect()
}

fn events(c: &mut trp::Connection) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

fn sge(addr: u64, len: u32) -> [Sge; 1] {
    [Sge { addr, len, lkey: 1 }]
}

fn send(p: &mut Pair, wr_id: u64, op: SendOp, s: &[Sge]) {
    p.a.conn
        .post_send(
            &p.a.mem,
            &SendWr {
                wr_id,
                op,
                sges: s,
                signaled: true,
            },
        )
        .unwrap();
}

fn post_recv(e: &mut Endpoint, wr_id: u64, addr: u64, len: u32) {
    e.conn
        .post_recv(
            &e.mem,
            &RecvWr {
                wr_id,
                sges: &sge(addr, len),
            },
        )
        .unwrap();
}

#[test]
fn peer_vanishes() {
    let mut p = pair(Config::default(), Config::default());
    let s = sge(0, 100_000);
    post_recv(&mut p.a, 100, 200_000, 64);
    post_recv(&mut p.a, 101, 200_100, 64);
    // The peer is gone before anything arrives.
    p.ab.up = false;
    p.ba.up = false;
    send(
        &mut p,
        1,
        SendOp::RdmaWrite {
            remote_addr: 1 << 19,
            rkey: 2,
        },
        &s,
    );
    send(&mut p, 2, PLAIN_SEND, &s);
    for i in 3..40 {
        send(
            &mut p,
            i,
            SendOp::RdmaRead {
                remote_addr: 1 << 19,
                rkey: 2,
            },
            &sge(300_000, 10),
        );
    }
    let start = p.now;
    let failed = p.run_until(trp::Instant(start.0 + 30_000_000_000), |p| {
        p.a.conn.state() == QpState::Closed
    });
    assert!(failed);
    let elapsed = p.now.0 - start.0;
    // The retry count alone would give up after the back-off's sum (about
    // a second); the connection holds on for min_give_up from its first
    // timeout, then fails at the next capped timeout.
    let cfg = Config::default();
    let retries: u64 = (0..=cfg.max_retries)
        .map(|i| (cfg.initial_rto.as_nanos() as u64) << i)
        .map(|r| r.min(cfg.max_rto.as_nanos() as u64))
        .sum();
    let lower = cfg.min_give_up.as_nanos() as u64;
    let upper = (cfg.initial_rto + cfg.min_give_up + cfg.max_rto).as_nanos() as u64;
    assert!(retries < lower, "the time bound must be what ends it here");
    assert!(
        (lower..=upper).contains(&elapsed),
        "took {elapsed} ns, expected {lower}..={upper}"
    );
    assert_eq!(
        events(&mut p.a.conn),
        vec![Event::Failed(FailReason::RetryExceeded)]
    );
    let cq = drain(&mut p.a.conn);
    let sends: Vec<_> = cq.iter().filter(|c| c.queue == Queue::Send).collect();
    assert_eq!(sends.len(), 39);
    // Work that reached the wire fails with retry-exceeded; work that never
    // started (here: everything behind the congestion window) is flushed.
    assert_eq!(sends[0].status, WcStatus::RetryExceeded);
    let mut flushing = false;
    for (i, c) in sends.iter().enumerate() {
        assert_eq!(c.wr_id, i as u64 + 1, "completions in posting order");
        flushing |= c.status == WcStatus::Flush;
        let want = if flushing {
            WcStatus::Flush
        } else {
            WcStatus::RetryExceeded
        };
        assert_eq!(c.status, want, "wr {}", c.wr_id);
    }
    assert_eq!(sends[38].status, WcStatus::Flush);
    let recvs: Vec<_> = cq
        .iter()
        .filter(|c| c.queue == Queue::Recv)
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(recvs, vec![(100, WcStatus::Flush), (101, WcStatus::Flush)]);
    // Posting after the failure completes at once with a flush.
    send(&mut p, 99, PLAIN_SEND, &s);
    assert_eq!(drain(&mut p.a.conn)[0].status, WcStatus::Flush);
}

#[test]
fn graceful_close_flushes_receives() {
    let mut p = pair(Config::default(), Config::default());
    post_recv(&mut p.b, 10, 0, 4096);
    post_recv(&mut p.b, 11, 4096, 4096);
    send(
        &mut p,
        1,
        SendOp::Send {
            invalidate: None,
            solicited: true,
        },
        &sge(8192, 3000),
    );
    p.a.conn.close();
    assert!(p
        .a
        .conn
        .post_send(
            &p.a.mem,
            &SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    invalidate: None,
                    solicited: false
                },
                sges: &[],
                signaled: true
            }
        )
        .is_err());
    let ok = p.run_until(trp::Instant(p.now.0 + 1_000_000_000), |p| {
        p.a.conn.state() == QpState::Closed && p.b.conn.state() == QpState::Closed
    });
    assert!(ok, "{:?} {:?}", p.a.conn.state(), p.b.conn.state());
    assert_eq!(
        events(&mut p.a.conn),
        vec![Event::PeerClosed, Event::Closed]
    );
    assert_eq!(
        events(&mut p.b.conn),
        vec![Event::PeerClosed, Event::Closed]
    );
    let a = drain(&mut p.a.conn);
    assert_eq!((a[0].wr_id, a[0].status), (1, WcStatus::Success));
    let b = drain(&mut p.b.conn);
    assert_eq!(
        (b[0].wr_id, b[0].status, b[0].byte_len, b[0].solicited),
        (10, WcStatus::Success, 3000, true)
    );
    assert_eq!((b[1].wr_id, b[1].status), (11, WcStatus::Flush));
}

#[test]
fn abort_reaches_peer() {
    let mut p = pair(Config::default(), Config::default());
    post_recv(&mut p.b, 10, 0, 64);
    let now = p.now;
    p.a.conn.abort(now);
    assert_eq!(p.a.conn.state(), QpState::Closed);
    p.run_until(trp::Instant(p.now.0 + 10_000_000), |p| {
        p.b.conn.state() == QpState::Closed
    });
    assert_eq!(
        events(&mut p.b.conn),
        vec![Event::Failed(FailReason::PeerAborted)]
    );
    assert_eq!(drain(&mut p.b.conn)[0].status, WcStatus::Flush);
}

#[test]
fn reject_carries_private_data() {
    let cfg = Config::default();
    let mut c = trp::Connecting::new(cfg, 5, 1, b"please", trp::Instant(0)).unwrap();
    let mut buf = vec![0u8; 2048];
    let n = c.poll_transmit(trp::Instant(0), &mut buf).unwrap();
    let inc = Incoming::parse(&buf[..n]).unwrap();
    assert_eq!(inc.private_data(), b"please");
    let mut out = vec![0u8; 2048];
    let m = inc.reject(b"no thanks", &mut out).unwrap();
    match c.handle_datagram(trp::Instant(1), &out[..m]) {
        trp::ConnectOutcome::Rejected { private_data } => assert_eq!(private_data, b"no thanks"),
        o => panic!("{o:?}"),
    }
    assert!(trp::Connecting::new(cfg, 5, 1, &[0; 513], trp::Instant(0)).is_err());
}

#[test]
fn connect_times_out_without_peer() {
    let cfg = Config::default();
    let mut c = trp::Connecting::new(cfg, 5, 1, b"", trp::Instant(0)).unwrap();
    let mut buf = vec![0u8; 2048];
    let mut sent = 0;
    for _ in 0..100 {
        let now = c.poll_timeout().unwrap();
        while c.poll_transmit(now, &mut buf).is_some() {
            sent += 1;
        }
        match c.handle_timeout(now) {
            trp::ConnectOutcome::Pending(n) => c = n,
            trp::ConnectOutcome::TimedOut => {
                assert_eq!(sent, cfg.max_retries + 1);
                return;
            }
            o => panic!("{o:?}"),
        }
    }
    panic!("never timed out");
}

#[test]
fn write_outside_region_terminates() {
    let mut p = pair(Config::default(), Config::default());
    let before = p.b.mem.bytes.clone();
    send(
        &mut p,
        1,
        SendOp::RdmaWrite {
            remote_addr: (1 << 20) - 10,
            rkey: 2,
        },
        &sge(0, 100),
    );
    send(&mut p, 2, PLAIN_SEND, &sge(0, 10));
    p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        p.a.conn.state() == QpState::Closed && p.b.conn.state() == QpState::Closed
    });
    assert_eq!(p.b.mem.bytes, before, "nothing written");
    let t = match events(&mut p.a.conn)[..] {
        [Event::Failed(FailReason::TerminateReceived(t))] => t,
        ref e => panic!("{e:?}"),
    };
    assert_eq!(
        (t.layer, t.etype, t.code),
        Cause::DdpTagged(TaggedCode::BaseBounds).wire()
    );
    let cq = drain(&mut p.a.conn);
    assert_eq!((cq[0].wr_id, cq[0].status), (1, WcStatus::RemoteAccess));
    assert_eq!((cq[1].wr_id, cq[1].status), (2, WcStatus::Flush));
    assert!(matches!(
        events(&mut p.b.conn)[..],
        [Event::Failed(FailReason::TerminateSent(_))]
    ));
}

#[test]
fn send_too_long_for_receive() {
    let mut p = pair(Config::default(), Config::default());
    post_recv(&mut p.b, 10, 0, 10);
    post_recv(&mut p.b, 11, 0, 10);
    send(&mut p, 1, PLAIN_SEND, &sge(0, 100));
    p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        p.a.conn.state() == QpState::Closed
    });
    let b = drain(&mut p.b.conn);
    assert_eq!((b[0].wr_id, b[0].status), (10, WcStatus::LocalLength));
    assert_eq!((b[1].wr_id, b[1].status), (11, WcStatus::Flush));
    assert_eq!(drain(&mut p.a.conn)[0].status, WcStatus::RemoteOperation);
}

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

#[test]
fn receive_window_is_never_overrun() {
    let b_cfg = Config {
        recv_window: 8,
        ..Config::default()
    };
    let mut p = pair(Config::default(), b_cfg);
    send(
        &mut p,
        1,
        SendOp::RdmaWrite {
            remote_addr: 1 << 19,
            rkey: 2,
        },
        &sge(0, 200_000),
    );
    p.run_until(trp::Instant(p.now.0 + 1_000_000_000), |p| {
        p.a.conn.poll_completion().is_some()
    });
    assert!(p.a.conn.sender_stats().max_in_flight <= 8);
}

#[test]
fn ord_limited_by_peer_ird_and_reads_complete() {
    let a_cfg = Config {
        ord: 16,
        ..Config::default()
    };
    let b_cfg = Config {
        ird: 2,
        ..Config::default()
    };
    let mut p = pair(a_cfg, b_cfg);
    assert_eq!(p.a.conn.ord(), 2);
    let data: Vec<u8> = (0..=255).collect();
    p.b.mem.write(1 << 19, &data);
    for i in 0..20u64 {
        send(
            &mut p,
            i,
            SendOp::RdmaRead {
                remote_addr: 1 << 19,
                rkey: 2,
            },
            &sge(i * 256, 256),
        );
    }
    let mut n = 0;
    assert!(p.run_until(trp::Instant(p.now.0 + 1_000_000_000), |p| {
        while let Some(c) = p.a.conn.poll_completion() {
            assert_eq!(
                (c.wr_id, c.status, c.opcode),
                (n, WcStatus::Success, WcOpcode::RdmaRead)
            );
            n += 1;
        }
        n == 20
    }));
    for i in 0..20usize {
        assert_eq!(&p.a.mem.bytes[i * 256..i * 256 + 256], &data[..]);
    }
    assert_eq!(p.b.conn.state(), QpState::Rts);
}

#[test]
fn lost_handshake_packets_are_repeated() {
    for seed in 0..20 {
        let link = LinkConfig {
            loss: 0.5,
            ..LinkConfig::default()
        };
        let mut p = Pair::builder().link(link).seed(seed).connect().unwrap();
        p.ab.cfg.loss = 0.0;
        p.ba.cfg.loss = 0.0;
        send(
            &mut p,
            1,
            SendOp::RdmaWrite {
                remote_addr: 1 << 19,
                rkey: 2,
            },
            &sge(0, 5000),
        );
        assert!(
            p.run_until(trp::Instant(p.now.0 + 2_000_000_000), |p| p
                .a
                .conn
                .poll_completion()
                .is_some()),
            "seed {seed}"
        );
    }
}

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

/// Runs until a's connection is closed, at `limit` at the latest; checks
/// that it failed for `why` and returns its completions.
fn a_fails(p: &mut Pair, limit: trp::Instant, why: FailReason) -> Vec<Completion> {
    assert!(p.run_until(limit, |p| p.a.conn.state() == QpState::Closed));
    assert_eq!(events(&mut p.a.conn), vec![Event::Failed(why)]);
    drain(&mut p.a.conn)
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

#[test]
fn message_ended_twice_terminates_instead_of_panicking() {
    let mut p = pair(Config::default(), Config::default());
    post_recv(&mut p.b, 10, 0, 64);
    p.ab.capture = Some(Vec::new());
    send(&mut p, 1, PLAIN_SEND, &sge(0, 10));
    p.run_until(trp::Instant(p.now.0 + 10_000_000), |p| {
        p.a.conn.poll_completion().is_some()
    });
    let sent = p.ab.capture.take().unwrap();
    let mut forged = sent
        .iter()
        .find(|d| d[1] == 0)
        .expect("a Data packet")
        .clone();
    // Same message (MSN 1, Last) again under the next PSN, with a trailer
    // that matches (a hostile peer computes it like any other).
    forged[8..12].copy_from_slice(&p.b.conn.expected_psn().to_be_bytes());
    let len = forged.len() - crc::TRAILER_LEN;
    crc::seal(&mut forged, len);
    let now = p.now;
    p.b.conn
        .handle_datagram(now, &mut p.b.mem, &forged)
        .unwrap();
    assert_eq!(p.b.conn.state(), QpState::Error);
    let t = match events(&mut p.b.conn)[..] {
        [Event::Failed(FailReason::TerminateSent(t))] => t,
        ref e => panic!("{e:?}"),
    };
    assert_eq!(
        (t.layer, t.etype, t.code),
        Cause::DdpUntagged(UntaggedCode::MsnRange).wire()
    );
}

#[test]
fn send_with_invalidate_of_protected_stag_terminates() {
    let mut p = pair(Config::default(), Config::default());
    // STag 2 is registered as not invalidatable.
    post_recv(&mut p.b, 10, 0, 64);
    send(
        &mut p,
        1,
        SendOp::Send {
            invalidate: Some(2),
            solicited: false,
        },
        &sge(0, 8),
    );
    p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        p.a.conn.state() == QpState::Closed
    });
    let t = match events(&mut p.a.conn)[..] {
        [Event::Failed(FailReason::TerminateReceived(t))] => t,
        ref e => panic!("{e:?}"),
    };
    assert_eq!(
        (t.layer, t.etype, t.code),
        Cause::RemoteOperation(OperationCode::StagCannotInvalidate).wire()
    );
    assert_eq!(drain(&mut p.a.conn)[0].status, WcStatus::RemoteOperation);
    assert_eq!(drain(&mut p.b.conn)[0].status, WcStatus::Flush);
    assert!(p.b.mem.region(2).unwrap().valid);
}

#[test]
fn posts_are_checked_locally() {
    let mut p = pair(Config::default(), Config::default());
    let bad_key = [Sge {
        addr: 0,
        len: 8,
        lkey: 99,
    }];
    let outside = [Sge {
        addr: (1 << 19) - 4,
        len: 8,
        lkey: 1,
    }];
    let e = &mut p.a;
    let op = PLAIN_SEND;
    assert_eq!(
        e.conn.post_send(
            &e.mem,
            &SendWr {
                wr_id: 1,
                op,
                sges: &bad_key,
                signaled: true
            }
        ),
        Err(trp::PostError::LocalProtection(
            trp::mr::ProtectionError::UnknownStag
        ))
    );
    assert_eq!(
        e.conn.post_recv(
            &e.mem,
            &RecvWr {
                wr_id: 2,
                sges: &outside
            }
        ),
        Err(trp::PostError::LocalProtection(
            trp::mr::ProtectionError::Bounds
        ))
    );
    // A read's sink needs local write; region 2 has only remote rights.
    let remote_only = [Sge {
        addr: 1 << 19,
        len: 8,
        lkey: 2,
    }];
    let read = SendOp::RdmaRead {
        remote_addr: 1 << 19,
        rkey: 2,
    };
    assert_eq!(
        e.conn.post_send(
            &e.mem,
            &SendWr {
                wr_id: 3,
                op: read,
                sges: &remote_only,
                signaled: true
            }
        ),
        Err(trp::PostError::LocalProtection(
            trp::mr::ProtectionError::Access
        ))
    );
    assert!(e.conn.poll_completion().is_none());
}

#[test]
fn psn_space_wraps() {
    let link = LinkConfig::lossy(0.05);
    let mut p = Pair::builder()
        .link(link)
        .seed(3)
        .isns(u32::MAX - 40, u32::MAX - 2)
        .connect()
        .unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13) as u8).collect();
    p.a.mem.write(0, &data);
    p.b.mem.write(0, &data);
    send(
        &mut p,
        1,
        SendOp::RdmaWrite {
            remote_addr: 1 << 19,
            rkey: 2,
        },
        &sge(0, 300_000),
    );
    let s = sge(0, 300_000);
    let op = SendOp::RdmaWrite {
        remote_addr: 1 << 19,
        rkey: 2,
    };
    p.b.conn
        .post_send(
            &p.b.mem,
            &SendWr {
                wr_id: 2,
                op,
                sges: &s,
                signaled: true,
            },
        )
        .unwrap();
    let mut done = [false; 2];
    assert!(p.run_until(trp::Instant(p.now.0 + 5_000_000_000), |p| {
        done[0] |=
            p.a.conn
                .poll_completion()
                .is_some_and(|c| c.status == WcStatus::Success);
        done[1] |=
            p.b.conn
                .poll_completion()
                .is_some_and(|c| c.status == WcStatus::Success);
        done == [true, true]
    }));
    assert!(p.a.conn.next_psn() < 1000, "a's PSNs wrapped");
    assert!(p.b.conn.next_psn() < 1000, "b's PSNs wrapped");
    assert_eq!(&p.b.mem.bytes[1 << 19..(1 << 19) + 300_000], &data[..]);
    assert_eq!(&p.a.mem.bytes[1 << 19..(1 << 19) + 300_000], &data[..]);
}

/// A burst reuses the region it looked up for the next segments of the
/// same STag, but not past a Send with Invalidate of that STag in the same
/// burst: the Write after it is refused and nothing of it lands.
#[test]
fn write_after_invalidate_in_one_burst_is_refused() {
    let mut p = pair(Config::default(), Config::default());
    let base = 1 << 19;
    p.b.mem
        .register(3, Region::new(0, base, 4096, Access::REMOTE_WRITE), true);
    p.a.mem.bytes[..100].fill(0xab);
    post_recv(&mut p.b, 10, 0, 64);
    let write = |remote_addr| SendOp::RdmaWrite {
        remote_addr,
        rkey: 3,
    };
    send(&mut p, 1, write(base), &sge(0, 100));
    let invalidate = SendOp::Send {
        invalidate: Some(3),
        solicited: false,
    };
    send(&mut p, 2, invalidate, &sge(0, 8));
    send(&mut p, 3, write(base + 200), &sge(0, 100));
    let mut burst = Vec::new();
    let mut buf = vec![0u8; p.a.conn.max_datagram()];
    while let Some(n) = p.a.conn.poll_transmit(p.now, &p.a.mem, &mut buf) {
        burst.push(buf[..n].to_vec());
    }
    assert_eq!(burst.len(), 3);
    assert_eq!(
        p.b.conn.handle_datagram_burst(p.now, &mut p.b.mem, &burst),
        0
    );
    let at = |a: u64, n: usize| p.b.mem.bytes[a as usize..a as usize + n].to_vec();
    assert_eq!(at(base, 100), vec![0xab; 100], "the first Write landed");
    assert!(!p.b.mem.region(3).unwrap().valid, "the Send invalidated");
    assert_eq!(at(base + 200, 100), vec![0; 100], "the last Write did not");
    let t = match events(&mut p.b.conn)[..] {
        [Event::Failed(FailReason::TerminateSent(t))] => t,
        ref e => panic!("{e:?}"),
    };
    assert_eq!(
        (t.layer, t.etype, t.code),
        Cause::DdpTagged(TaggedCode::InvalidStag).wire()
    );
    let recv = drain(&mut p.b.conn);
    assert_eq!((recv[0].wr_id, recv[0].invalidated), (10, Some(3)));
}

/// A Write of `len` bytes from a's local half to b's remote half over a link
/// that flips one bit in `rate` of the datagrams each way, which no checksum
/// catches (a middlebox that fixes the UDP checksum after it). Returns
/// whether the Write completed and whether b's memory holds what a sent.
fn write_through_corruption(p: &mut Pair, len: u32, rate: f64) -> (bool, bool) {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    p.a.mem.write(0, &data);
    for link in [&mut p.ab, &mut p.ba] {
        link.cfg.corrupt = rate;
        link.cfg.corrupt_detected = false;
    }
    send(
        p,
        1,
        SendOp::RdmaWrite {
            remote_addr: 1 << 19,
            rkey: 2,
        },
        &sge(0, len),
    );
    let done = p.run_until(trp::Instant(p.now.0 + 5_000_000_000), |p| {
        p.a.conn.poll_completion().is_some() || p.a.conn.state() != QpState::Rts
    });
    let mut got = vec![0u8; len as usize];
    p.b.mem.read(1 << 19, &mut got);
    (done && p.a.conn.state() == QpState::Rts, got == data)
}

#[test]
fn corruption_past_the_checksum_is_caught_by_the_trailer() {
    let mut p = pair(Config::default(), Config::default());
    let (completed, intact) = write_through_corruption(&mut p, 200_000, 0.05);
    assert!(
        completed && intact,
        "completed {completed}, intact {intact}"
    );
    let dropped = p.a.conn.stats().rx_crc_errors + p.b.conn.stats().rx_crc_errors;
    let corrupted = p.ab.stats.corrupted + p.ba.stats.corrupted;
    // Some corrupted datagrams may still be on the way when it completes.
    assert!(
        dropped > 0 && dropped <= corrupted,
        "{dropped} dropped, {corrupted} corrupted"
    );
}

/// What the trailer is for: with it off at both ends the same link puts
/// wrong bytes in memory (or breaks the connection).
#[test]
fn without_the_trailer_corruption_gets_through() {
    let off = Config {
        crc: false,
        ..Config::default()
    };
    let mut p = pair(off, off);
    let (completed, intact) = write_through_corruption(&mut p, 200_000, 0.05);
    assert!(!(completed && intact), "no corruption got through");
    assert_eq!(
        p.a.conn.stats().rx_crc_errors + p.b.conn.stats().rx_crc_errors,
        0
    );
}

/// The trailer is used when either end asks for it, and then on every
/// datagram both ends send after the ConnectRequest; never otherwise.
#[test]
fn trailer_is_used_when_either_end_asks() {
    use trp::wire::trp::{Opcode, Packet, FLAG_CRC};
    for (a, b) in [(true, true), (true, false), (false, true), (false, false)] {
        let cfg = |crc| Config {
            crc,
            ..Config::default()
        };
        let mut p = pair(cfg(a), cfg(b));
        post_recv(&mut p.b, 10, 0, 64);
        p.ab.capture = Some(Vec::new());
        p.ba.capture = Some(Vec::new());
        send(&mut p, 1, PLAIN_SEND, &sge(0, 10));
        // Until the Send is acknowledged: datagrams both ways.
        assert!(p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
            p.a.conn.poll_completion().is_some()
        }));
        let sent: Vec<Vec<u8>> = [p.ab.capture.take(), p.ba.capture.take()]
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        assert!(sent.len() >= 2, "{a} {b}");
        for d in sent {
            let sealed = Packet::new_unchecked(&d[..]).flags() & FLAG_CRC != 0;
            assert_eq!(sealed, a || b, "a {a}, b {b}: opcode {}", d[1]);
            assert!(crc::open(&d).is_ok());
            assert_ne!(d[1], Opcode::ConnectRequest as u8);
        }
    }
}

#[test]
fn a_lost_last_ack_still_closes_the_peer_gracefully() {
    // A closes first; B's FIN closes A, and A's ACK of it is lost, as is everything A
    // would send after (its flow goes with the connection). B, its FIN unacknowledged,
    // retransmits until it gives up, and then closes: every byte both ways was delivered.
    let mut p = pair(Config::default(), Config::default());
    post_recv(&mut p.b, 10, 0, 4096);
    p.a.conn.close();
    let limit = trp::Instant(p.now.0 + 1_000_000_000);
    assert!(p.run_until(limit, |p| p.a.conn.state() == QpState::Closed));
    p.ab.up = false;
    let limit = trp::Instant(p.now.0 + 120_000_000_000);
    assert!(p.run_until(limit, |p| p.b.conn.state() == QpState::Closed));
    assert_eq!(
        events(&mut p.b.conn),
        vec![Event::PeerClosed, Event::Closed]
    );
    assert_eq!(
        drain(&mut p.b.conn)
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        vec![(10, WcStatus::Flush)]
    );
}

/// B receives A's Send and aborts while it holds the Send's ACK for a reply: its Abort
/// acknowledges the Send, which completes as delivered; what B had not received fails.
/// urdmad's Abort for B's dead process acknowledges what the process published it had
/// received (`urdma_shared::qpstats`), and nothing where it published nothing.
#[test]
fn an_abort_acknowledges_what_its_sender_received() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum By {
        Itself,
        UrdmadWithReceived,
        UrdmadWithout,
    }
    for by in [By::Itself, By::UrdmadWithReceived, By::UrdmadWithout] {
        let cfg = Config {
            ack_hold: core::time::Duration::from_millis(50),
            ..Config::default()
        };
        let mut p = pair(Config::default(), cfg);
        post_recv(&mut p.b, 10, 0, 4096);
        send(&mut p, 1, PLAIN_SEND, &sge(8192, 100));
        let limit = trp::Instant(p.now.0 + 10_000_000);
        assert!(p.run_until(limit, |p| p.b.conn.poll_completion().is_some()));
        assert!(p.b.conn.holds_ack());
        let received = p.b.conn.expected_psn();
        // Behind the Send, one B never receives.
        p.ab.up = false;
        send(&mut p, 2, PLAIN_SEND, &sge(8192, 100));
        if by == By::Itself {
            p.b.conn.abort(p.now);
        } else {
            // As urdmad sends it (`urdmad::cm::abort_packet`): no stream state of its own.
            let h = trp::wire::trp::Repr {
                opcode: trp::wire::trp::Opcode::Abort,
                flags: if by == By::UrdmadWithReceived {
                    trp::wire::trp::FLAG_ACKS
                } else {
                    0
                },
                dst_conn: p.a.conn.local_conn(),
                psn: 0,
                ack_psn: if by == By::UrdmadWithReceived {
                    received
                } else {
                    0
                },
                window: 0,
                sack: trp::wire::trp::SackRanges::new(),
            };
            let mut d = vec![0u8; h.buffer_len() + crc::TRAILER_LEN];
            h.emit(&mut d);
            crc::seal(&mut d, h.buffer_len());
            let now = p.now;
            let _ = p.a.conn.handle_datagram(now, &mut p.a.mem, &d);
        }
        let limit = trp::Instant(p.now.0 + 10_000_000);
        assert!(p.run_until(limit, |p| p.a.conn.state() == QpState::Closed));
        let got: Vec<_> = drain(&mut p.a.conn)
            .iter()
            .filter(|c| c.queue == Queue::Send)
            .map(|c| (c.wr_id, c.status))
            .collect();
        let first = if by == By::UrdmadWithout {
            WcStatus::Flush
        } else {
            WcStatus::Success
        };
        assert_eq!(got, vec![(1, first), (2, WcStatus::Flush)], "{by:?}");
    }
}

#[test]
fn a_fin_the_peer_never_answers_fails_the_connection() {
    // The peer's FIN never came: B cannot know that A has everything, so B's FIN
    // unacknowledged still ends in RetryExceeded.
    let mut p = pair(Config::default(), Config::default());
    p.ab.up = false;
    p.b.conn.close();
    let limit = trp::Instant(p.now.0 + 120_000_000_000);
    assert!(p.run_until(limit, |p| p.b.conn.state() == QpState::Closed));
    assert_eq!(
        events(&mut p.b.conn),
        vec![Event::Failed(FailReason::RetryExceeded)]
    );
}

/// Posts a receive of `len` bytes at `addr` to end `e`'s shared receive queue.
fn post_srq(e: &mut Endpoint, wr_id: u64, addr: u64, len: u32) {
    let mut q = e.mem.srq.take().expect("an SRQ");
    q.post(
        &e.mem,
        &RecvWr {
            wr_id,
            sges: &sge(addr, len),
        },
    )
    .unwrap();
    e.mem.srq = Some(q);
}

/// A connection on a shared receive queue: each message takes the queue's
/// oldest receive; the armed limit reports once when fewer are left, then
/// is disarmed; a failure flushes only the receive its message had taken,
/// and the others stay with the queue.
#[test]
fn srq_receives_limit_and_failure() {
    let cfg = Config {
        srq: true,
        ..Config::default()
    };
    let mut p = pair(Config::default(), cfg);
    p.b.mem.srq = Some(trp::Srq::new(0, 8));
    assert_eq!(
        p.b.conn.post_recv(
            &p.b.mem,
            &RecvWr {
                wr_id: 1,
                sges: &sge(0, 8)
            }
        ),
        Err(trp::PostError::State),
        "a connection on an SRQ takes no receive of its own"
    );
    for id in 10..14 {
        post_srq(&mut p.b, id, 64 * id, 64);
    }
    p.b.mem.srq.as_mut().unwrap().set_limit(3);
    let received = |p: &mut Pair, n: usize| {
        let mut got = Vec::new();
        p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
            got.extend(drain(&mut p.b.conn));
            got.len() >= n
        });
        got
    };
    send(&mut p, 1, PLAIN_SEND, &sge(0, 32));
    let got = received(&mut p, 1);
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].byte_len),
        (10, WcStatus::Success, 32)
    );
    let q = p.b.mem.srq.as_mut().unwrap();
    assert_eq!((q.len(), q.take_limit_event(), q.limit()), (3, false, 3));
    send(&mut p, 2, PLAIN_SEND, &sge(0, 32));
    assert_eq!(received(&mut p, 1)[0].wr_id, 11);
    let q = p.b.mem.srq.as_mut().unwrap();
    assert_eq!((q.len(), q.take_limit_event(), q.limit()), (2, true, 0));
    assert!(!q.take_limit_event(), "the event comes once");
    // Too long for the next receive: the connection fails with it alone.
    send(&mut p, 3, PLAIN_SEND, &sge(0, 100));
    p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
        p.a.conn.state() == QpState::Closed
    });
    let b = drain(&mut p.b.conn);
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!((b[0].wr_id, b[0].status), (12, WcStatus::LocalLength));
    assert_eq!(p.b.mem.srq.as_ref().unwrap().len(), 1);
}

/// A local request (a window bind, an invalidation) completes in send
/// queue order: at once with nothing before it, otherwise after the
/// requests before it, the write, the read and the local one after it
/// included; and it is flushed like any other when the connection fails.
#[test]
fn local_requests_complete_in_send_queue_order() {
    use trp::LocalOp;
    let mut p = pair(Config::default(), Config::default());
    send(&mut p, 1, SendOp::Local(LocalOp::BindWindow), &[]);
    assert_eq!(
        drain(&mut p.a.conn)
            .iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, WcOpcode::BindMw)],
        "nothing before it: complete when posted"
    );
    let write = SendOp::RdmaWrite {
        remote_addr: 1 << 19,
        rkey: 2,
    };
    let read = SendOp::RdmaRead {
        remote_addr: 1 << 19,
        rkey: 2,
    };
    send(&mut p, 2, write, &sge(0, 100_000));
    send(&mut p, 3, SendOp::Local(LocalOp::Invalidate), &[]);
    send(&mut p, 4, read, &sge(0, 3000));
    send(&mut p, 5, SendOp::Local(LocalOp::BindWindow), &[]);
    send(&mut p, 6, SendOp::Local(LocalOp::Invalidate), &[]);
    assert!(
        drain(&mut p.a.conn).is_empty(),
        "nothing completes before the write"
    );
    let mut got = Vec::new();
    assert!(p.run_until(trp::Instant(p.now.0 + 1_000_000_000), |p| {
        got.extend(drain(&mut p.a.conn).iter().map(|c| (c.wr_id, c.opcode)));
        got.len() == 5
    }));
    assert_eq!(
        got,
        vec![
            (2, WcOpcode::RdmaWrite),
            (3, WcOpcode::LocalInv),
            (4, WcOpcode::RdmaRead),
            (5, WcOpcode::BindMw),
            (6, WcOpcode::LocalInv),
        ]
    );
    // Queued behind a write the peer never acknowledges: flushed.
    p.ba.up = false;
    send(&mut p, 7, write, &sge(0, 1000));
    send(&mut p, 8, SendOp::Local(LocalOp::BindWindow), &[]);
    let limit = trp::Instant(p.now.0 + 60_000_000_000);
    let done = a_fails(&mut p, limit, FailReason::RetryExceeded);
    assert_eq!(
        done.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        vec![
            (7, WcStatus::RetryExceeded, WcOpcode::RdmaWrite),
            (8, WcStatus::Flush, WcOpcode::BindMw),
        ]
    );
}

/// A datagram that acknowledges our Send and brings a Write we must refuse: the Send was
/// received, so it completes successfully before the connection fails, and only what was
/// not acknowledged is flushed (the server of tests/e2e/mw.c once saw its acknowledged
/// Send flushed when the client's refused Write carried the acknowledgement).
#[test]
fn work_acknowledged_by_the_datagram_that_fails_the_connection_completes() {
    let mut p = pair(Config::default(), Config::default());
    post_recv(&mut p.b, 10, 0, 64);
    send(&mut p, 1, PLAIN_SEND, &sge(0, 64));
    // A's Send reaches B; B sends nothing yet, so its acknowledgement waits for B's next
    // datagram.
    let mut buf = vec![0u8; 65536];
    while let Some(n) = p.a.conn.poll_transmit(p.now, &p.a.mem, &mut buf) {
        let _ = p.b.conn.handle_datagram(p.now, &mut p.b.mem, &buf[..n]);
    }
    let got = drain(&mut p.b.conn);
    assert_eq!((got[0].wr_id, got[0].status), (10, WcStatus::Success));
    // A has a second Send, not yet sent, that the failure must flush.
    send(&mut p, 2, PLAIN_SEND, &sge(0, 64));
    // B writes under a key A does not have.
    p.b.conn
        .post_send(
            &p.b.mem,
            &SendWr {
                wr_id: 20,
                op: SendOp::RdmaWrite {
                    remote_addr: 1 << 19,
                    rkey: 0x7777,
                },
                sges: &sge(0, 8),
                signaled: true,
            },
        )
        .unwrap();
    let n = p.b.conn.poll_transmit(p.now, &p.b.mem, &mut buf).unwrap();
    let _ = p.a.conn.handle_datagram(p.now, &mut p.a.mem, &buf[..n]);
    assert_eq!(p.a.conn.state(), QpState::Error);
    let cq = drain(&mut p.a.conn);
    assert_eq!(
        cq.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Flush)]
    );
}

/// A's QP is destroyed while its graceful close still has a Write to deliver over a lossy
/// link: once `release_memory` returns, its application may free and reuse the buffer, yet
/// B receives the bytes the Write had when posted, and the close completes.
#[test]
fn a_lingering_close_sends_what_was_posted_not_what_the_memory_holds_now() {
    let mut p = pair(Config::default(), Config::default());
    p.ab.cfg = LinkConfig {
        loss: 0.3,
        ..LinkConfig::default()
    };
    let len = 64 * 1024;
    let posted: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    p.a.mem.bytes[..len].copy_from_slice(&posted);
    send(
        &mut p,
        1,
        SendOp::RdmaWrite {
            remote_addr: 1 << 19,
            rkey: 2,
        },
        &sge(0, len as u32),
    );
    p.a.conn.close();
    assert!(p.a.conn.release_memory(&p.a.mem));
    // The application frees its buffer; the memory is someone else's now.
    p.a.mem.bytes[..len].fill(0xee);
    let limit = trp::Instant(p.now.0 + 60_000_000_000);
    assert!(p.run_until(limit, |p| {
        if p.b.conn.state() == QpState::Closing
            || events(&mut p.b.conn).contains(&Event::PeerClosed)
        {
            p.b.conn.close();
        }
        p.a.conn.state() == QpState::Closed
    }));
    assert!(
        p.a.conn.sender_stats().retransmitted > 0,
        "the loss made it resend"
    );
    assert!(p.b.mem.bytes[1 << 19..(1 << 19) + len] == posted[..]);
}

/// A Read Response owed to the peer can only come from the memory: a connection answering
/// one does not let the memory go, and the caller drops it instead.
#[test]
fn a_connection_serving_a_read_keeps_its_memory() {
    let mut p = pair(Config::default(), Config::default());
    p.ab.up = false;
    // B reads A's remote half; A's responses cannot get through.
    p.b.conn
        .post_send(
            &p.b.mem,
            &SendWr {
                wr_id: 1,
                op: SendOp::RdmaRead {
                    remote_addr: 1 << 19,
                    rkey: 2,
                },
                sges: &sge(0, 8192),
                signaled: true,
            },
        )
        .unwrap();
    let limit = trp::Instant(p.now.0 + 100_000_000);
    p.run_until(limit, |p| p.a.conn.next_psn() != p.a.conn.unacked_psn());
    assert_ne!(
        p.a.conn.next_psn(),
        p.a.conn.unacked_psn(),
        "A is answering"
    );
    p.a.conn.close();
    assert!(!p.a.conn.release_memory(&p.a.mem));
}
