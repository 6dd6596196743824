//! A connection on a shared receive queue.

use super::*;

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
