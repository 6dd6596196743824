//! The verbs on a connection and their completions: each operation, unsignaled sends, the
//! errors a post or a peer causes, a full CQ, lost datagrams, an armed CQ, zero-entry queues.

use super::*;

#[test]
fn write_with_immediate_read_and_inline() {
    let mut t = Bed::new();
    t.connect();
    let mut target = vec![0u8; 4096];
    let taddr = t.reg(
        2,
        0x300,
        2,
        &mut target,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let mut source = (0..=255u8).cycle().take(3000).collect::<Vec<u8>>();
    let saddr = t.reg(1, 0x100, 1, &mut source, Access::REMOTE_READ);
    let mut rbuf = vec![0u8; 16];
    let raddr = t.reg(2, 0x201, 2, &mut rbuf, Access::LOCAL_WRITE);
    t.recv_at(B, 9, raddr, 16, 0x201);
    // Multi-segment RDMA Write with immediate data.
    let s = [Sge {
        addr: saddr,
        len: 3000,
        lkey: 0x100,
    }];
    let wr = SendReq {
        op: SendOp::RdmaWriteImm {
            remote_addr: taddr + 10,
            rkey: 0x300,
            imm: 0xdead_beef,
            solicited: false,
        }
        .into(),
        ..send(2, &s)
    };
    t.e.post_send(A, &wr).unwrap();
    t.run(20);
    assert_eq!(&target[10..3010], &source[..]);
    let wcs = t.poll(BCQ);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(wcs[0].wc_flags, IBV_WC_WITH_IMM);
    assert_eq!(
        // SAFETY: the union's members are all u32.
        u32::from_be(unsafe { wcs[0].__bindgen_anon_1.imm_data }),
        0xdead_beef
    );
    assert_eq!(t.poll(ACQ)[0].opcode, IBV_WC_RDMA_WRITE);

    // RDMA Read of B's region back into A's local buffer.
    let mut back = vec![0u8; 100];
    let baddr = t.reg(1, 0x101, 1, &mut back, Access::LOCAL_WRITE);
    t.e.mrs.insert(
        2,
        0x301,
        Region::new(2, taddr, 4096, Access::REMOTE_READ),
        4,
    );
    let s = [Sge {
        addr: baddr,
        len: 100,
        lkey: 0x101,
    }];
    let wr = SendReq {
        op: SendOp::RdmaRead {
            remote_addr: taddr + 10,
            rkey: 0x301,
        }
        .into(),
        ..send(3, &s)
    };
    t.e.post_send(A, &wr).unwrap();
    t.run(20);
    assert_eq!(&back[..], &source[..100]);
    let wcs = t.poll(ACQ);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].opcode, wcs[0].byte_len),
        (3, IBV_WC_RDMA_READ, 100)
    );

    // Inline: bytes outside any MR, copied at post time.
    t.recv_at(B, 10, raddr, 16, 0x201);
    let mut msg = b"inline!".to_vec();
    let parts: [&[u8]; 1] = [&msg];
    let bogus = [Sge {
        addr: 1,
        len: 7,
        lkey: 0xdead,
    }];
    let wr = SendReq {
        inline: Some(&parts),
        ..send(4, &bogus)
    };
    t.e.post_send(A, &wr).unwrap();
    msg.fill(0);
    t.run(10);
    assert_eq!(&rbuf[..7], b"inline!");
    let big = [0u8; 65];
    let parts: [&[u8]; 1] = [&big];
    let wr = SendReq {
        inline: Some(&parts),
        ..send(5, &bogus)
    };
    assert_eq!(
        t.e.post_send(A, &wr).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
}

#[test]
fn unsignaled_sends_complete_silently_unless_sq_sig_all() {
    let mut t = Bed::new();
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    for i in 0..3 {
        t.recv_at(B, i, raddr, 64, 0x200);
    }
    let wr = SendReq {
        signaled: false,
        ..send(1, &[])
    };
    t.e.post_send(A, &wr).unwrap();
    t.run(10);
    assert!(t.poll(ACQ).is_empty());
    assert_eq!(t.poll(BCQ).len(), 1);
}

#[test]
fn local_errors_refuse_the_post() {
    let mut t = Bed::new();
    t.connect();
    let bad = [Sge {
        addr: 0x1000,
        len: 8,
        lkey: 0x999,
    }];
    assert_eq!(
        t.e.post_send(A, &send(1, &bad)).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    assert_eq!(
        t.e.post_recv(A, 1, &bad).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    let five = [bad[0]; 5];
    assert_eq!(
        t.e.post_recv(A, 1, &five).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    // The send queue holds 16: the 17th is refused while nothing moves.
    for i in 0..16 {
        t.e.post_send(A, &send(i, &[])).unwrap();
    }
    assert_eq!(
        t.e.post_send(A, &send(99, &[])).map_err(|e| e.errno()),
        Err(libc::ENOMEM)
    );
}

#[test]
fn remote_protection_error_fails_both_and_later_posts_flush() {
    let mut t = Bed::new();
    t.connect();
    let mut target = vec![0u8; 64];
    let taddr = t.reg(
        2,
        0x300,
        2,
        &mut target,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    );
    let mut src = vec![1u8; 64];
    let saddr = t.reg(1, 0x100, 1, &mut src, Access::NONE);
    let s = [Sge {
        addr: saddr,
        len: 64,
        lkey: 0x100,
    }];
    let wr = write(1, &s, taddr, 0x300);
    t.e.post_send(A, &wr).unwrap();
    assert!(!t.e.qp_in_error(A) && !t.e.qp_in_error(B));
    t.run(20);
    assert_eq!(target, vec![0u8; 64], "no byte placed without REMOTE_WRITE");
    assert!(
        t.e.qp_in_error(A) && t.e.qp_in_error(B),
        "ibv_query_qp says ERR"
    );
    let wcs = t.poll(ACQ);
    assert_eq!(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
    let notices = t.e.take_notices();
    assert!(notices
        .iter()
        .any(|n| matches!(n, Notice::Closed(k, s) if *k == A && *s < 0)));
    assert!(notices
        .iter()
        .any(|n| matches!(n, Notice::Closed(k, s) if *k == B && *s < 0)));
    t.e.post_send(A, &send(2, &[])).unwrap();
    t.run(1);
    let wcs = t.poll(ACQ);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, IBV_WC_WR_FLUSH_ERR));
}

#[test]
fn full_cq_holds_completions_back_in_order() {
    let mut t = Bed::new();
    t.e.destroy_cq(ACQ);
    t.e.create_cq(ACQ, 2, None);
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    for i in 0..5 {
        t.recv_at(B, i, raddr, 64, 0x200);
        t.e.post_send(A, &send(i, &[])).unwrap();
    }
    t.run(20);
    let mut ids = vec![];
    for _ in 0..5 {
        let w = t.poll(ACQ);
        assert!(w.len() <= 2);
        ids.extend(w.iter().map(|w| w.wr_id));
        t.run(1);
    }
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
}

#[test]
fn lost_datagrams_are_retransmitted_on_timers() {
    let mut t = Bed::new();
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    t.recv_at(B, 1, raddr, 64, 0x200);
    t.e.post_send(A, &send(1, &[])).unwrap();
    t.e.progress(t.now);
    t.ab.lock().unwrap().clear(); // lost
    let deadline = t.e.deadline().expect("retransmission timer");
    t.now = deadline;
    t.run(10);
    assert_eq!(t.poll(BCQ).len(), 1);
}

#[test]
fn armed_cq_fires_on_delivery_and_solicited_only_waits() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut t = Bed::new();
    let fired = Arc::new(AtomicUsize::new(0));
    let f = fired.clone();
    t.e.destroy_cq(BCQ);
    t.e.create_cq(
        BCQ,
        16,
        Some(Box::new(move || {
            f.fetch_add(1, Ordering::SeqCst);
        })),
    );
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    for i in 0..3 {
        t.recv_at(B, i, raddr, 64, 0x200);
    }
    assert!(t.e.arm_cq(BCQ, true));
    t.e.post_send(A, &send(1, &[])).unwrap();
    t.run(10);
    assert_eq!(fired.load(Ordering::SeqCst), 0, "not solicited");
    let solicited = SendReq {
        op: SendOp::Send {
            invalidate: None,
            solicited: true,
        }
        .into(),
        ..send(2, &[])
    };
    t.e.post_send(A, &solicited).unwrap();
    t.run(10);
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(t.poll(BCQ).len(), 2);
    t.e.arm_cq(BCQ, false);
    t.e.post_send(A, &send(3, &[])).unwrap();
    t.run(10);
    assert_eq!(fired.load(Ordering::SeqCst), 2);
}

#[test]
fn send_with_invalidate_reports_and_invalidates_the_stag() {
    let mut t = Bed::new();
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    let mut target = vec![0u8; 64];
    let taddr = t.reg(
        2,
        0x300,
        2,
        &mut target,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    t.recv_at(B, 1, raddr, 64, 0x200);
    let wr = SendReq {
        op: SendOp::Send {
            invalidate: Some(0x300),
            solicited: false,
        }
        .into(),
        ..send(1, &[])
    };
    t.e.post_send(A, &wr).unwrap();
    t.run(10);
    let wcs = t.poll(BCQ);
    assert_eq!(wcs[0].wc_flags, IBV_WC_WITH_INV);
    // SAFETY: the union's members are all u32.
    assert_eq!(unsafe { wcs[0].__bindgen_anon_1.invalidated_rkey }, 0x300);
    assert!(!t.e.mrs.get(2, 0x300).unwrap().region.valid);
    // A write through the invalidated STag is refused: nothing placed.
    let mut src = vec![7u8; 8];
    let saddr = t.reg(1, 0x100, 1, &mut src, Access::NONE);
    let s = [Sge {
        addr: saddr,
        len: 8,
        lkey: 0x100,
    }];
    let wr = write(2, &s, taddr, 0x300);
    t.e.post_send(A, &wr).unwrap();
    t.run(10);
    assert_eq!(target, vec![0u8; 64]);
    let wcs = t.poll(ACQ);
    assert!(wcs
        .iter()
        .any(|w| w.wr_id == 2 && w.status == IBV_WC_REM_ACCESS_ERR));
}

#[test]
fn zero_entry_queues_refuse_posts() {
    let mut t = Bed::new();
    let mut i = init(1, ACQ);
    i.max_send_wr = 0;
    i.max_recv_wr = 0;
    t.e.create_qp((1, 11), i);
    assert_eq!(
        t.e.post_send((1, 11), &send(1, &[])).map_err(|e| e.errno()),
        Err(libc::ENOMEM)
    );
    assert_eq!(
        t.e.post_recv((1, 11), 1, &[]).map_err(|e| e.errno()),
        Err(libc::ENOMEM)
    );
}
