//! Setting up and ending a connection: handshakes, closes, aborts and rejects.

use super::*;

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
