//! Requests refused, from the peer or locally: protection, lengths and malformed messages.

use super::*;

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
