//! Windows, completion order and the PSN space.

use super::*;

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
