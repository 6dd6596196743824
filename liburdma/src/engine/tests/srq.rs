//! Two QPs of device 2 on one shared receive queue, each connected to a QP
//! of device 1.

use super::*;

const S: SrqKey = 0x5000;
const B2: QpKey = (2, 21);
const A2: QpKey = (1, 11);

/// The bed's pair plus A2 → B2, both B QPs on SRQ `S`, which holds four
/// 64-byte receives (wr_id 100..104) of `rbuf`.
fn shared(t: &mut Bed, rbuf: &mut [u8]) {
    t.e.create_srq(S, 2, 2, 8);
    t.e.destroy_qp(B);
    t.e.create_qp(
        B,
        QpInit {
            srq: Some(S),
            ..init(2, BCQ)
        },
    );
    t.e.create_qp(
        B2,
        QpInit {
            srq: Some(S),
            ..init(2, BCQ)
        },
    );
    t.e.create_qp(A2, init(1, ACQ));
    let base = t.reg(2, 0x200, 2, rbuf, Access::LOCAL_WRITE);
    for i in 0..4 {
        let sge = [Sge {
            addr: base + 64 * i,
            len: 64,
            lkey: 0x200,
        }];
        t.e.post_srq_recv(S, 100 + i, &sge).unwrap();
    }
    t.connect();
    let wires: (Wire, Wire) = Default::default();
    connect_pair(&mut t.e, A2, B2, (&wires.0, &wires.1), t.now);
}

#[test]
fn qps_on_one_srq_take_its_receives_in_turn() {
    let mut t = Bed::new();
    let mut rbuf = vec![0u8; 256];
    shared(&mut t, &mut rbuf);
    assert_eq!(
        t.e.post_recv(B, 1, &[]).map_err(|e| e.errno()),
        Err(libc::EINVAL),
        "a QP on an SRQ has no receive queue of its own"
    );
    t.e.srq(S).unwrap().set_limit(3);
    let mut sbuf = *b"from A, and then from A2 ......";
    let base = t.reg(1, 0x100, 1, &mut sbuf, Access::LOCAL_WRITE);
    let sge = [Sge {
        addr: base,
        len: 16,
        lkey: 0x100,
    }];
    t.e.post_send(A, &send(1, &sge)).unwrap();
    t.run(20);
    t.e.post_send(A2, &send(2, &sge)).unwrap();
    t.run(20);
    let got: Vec<_> = t
        .poll(BCQ)
        .iter()
        .map(|w| (w.wr_id, w.qp_num, w.byte_len))
        .collect();
    assert_eq!(got, [(100, B.1, 16), (101, B2.1, 16)]);
    assert_eq!(&rbuf[..16], &sbuf[..16]);
    assert_eq!(&rbuf[64..80], &sbuf[..16]);
    // Two left, below the limit of 3: reported once, and disarmed.
    assert_eq!(t.e.take_srq_limits(), [S]);
    assert!(t.e.take_srq_limits().is_empty());
    assert_eq!(t.e.srq(S).unwrap().limit(), 0);
    // B fails: nothing of the SRQ is flushed with it, and B2 goes on using it.
    t.e.abort(B, t.now);
    t.run(20);
    let flushed: Vec<_> = t.poll(BCQ).iter().map(|w| (w.wr_id, w.status)).collect();
    assert!(flushed.iter().all(|&(id, _)| id < 100), "{flushed:?}");
    assert_eq!(t.e.srq(S).unwrap().len(), 2);
    t.e.post_send(A2, &send(3, &sge)).unwrap();
    t.run(20);
    let got: Vec<_> = t.poll(BCQ).iter().map(|w| (w.wr_id, w.qp_num)).collect();
    assert_eq!(got, [(102, B2.1)]);
}
