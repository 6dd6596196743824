//! Memory windows of device 2 (PD 2) over one MR, written by QP A through
//! QP B's windows.

use super::*;
use crate::mem::{Bind, MwType};

const MR: u32 = 0x200;
const MW1: u32 = 0x500;
const MW2: u32 = 0x600;
const SRC: u32 = 0x100;
/// `IBV_ACCESS_REMOTE_WRITE`.
const REMOTE_WRITE: u32 = 2;

/// The bed connected; B's 256-byte MR `target`, bindable, with a type 1 and
/// a type 2 window; A's source of 16 bytes of 7. Returns A's SGE.
fn bed(target: &mut [u8], source: &mut [u8]) -> (Bed, [Sge; 1]) {
    let mut t = Bed::new();
    t.connect();
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ;
    let base = target.as_mut_ptr() as u64;
    let flags = u32::from(access.bits()) | 16;
    let region = Region::new(2, base, target.len() as u64, access);
    t.e.mrs.insert(2, MR, region, flags);
    t.e.mrs.add_window(2, MW1, 2, MwType::One);
    t.e.mrs.add_window(2, MW2, 2, MwType::Two);
    let saddr = t.reg(1, SRC, 1, source, Access::NONE);
    let s = [Sge {
        addr: saddr,
        len: source.len() as u32,
        lkey: SRC,
    }];
    (t, s)
}

fn bind_req(wr_id: u64, b: Bind) -> SendReq<'static> {
    SendReq {
        wr_id,
        op: Work::Bind(b),
        sges: &[],
        signaled: true,
        inline: None,
    }
}

fn window(mw: u32, new_stag: u32, addr: u64, len: u64) -> Bind {
    Bind {
        mw,
        new_stag,
        mr: Some(MR),
        addr,
        len,
        access: REMOTE_WRITE,
    }
}

fn statuses(wcs: &[ibv_wc]) -> Vec<(u64, u32, u32)> {
    wcs.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect()
}

#[test]
fn writes_land_through_a_type_1_window_and_its_old_key_is_refused() {
    let (mut target, mut source) = (vec![0u8; 256], vec![7u8; 16]);
    let (mut t, s) = bed(&mut target, &mut source);
    let base = target.as_ptr() as u64;
    t.e.post_send(B, &bind_req(1, window(MW1, MW1 + 1, base + 64, 64)))
        .unwrap();
    t.run(2);
    assert_eq!(
        statuses(&t.poll(BCQ)),
        vec![(1, IBV_WC_BIND_MW, IBV_WC_SUCCESS)]
    );
    t.e.post_send(A, &write(2, &s, base + 100, MW1 + 1))
        .unwrap();
    t.run(10);
    assert_eq!(
        statuses(&t.poll(ACQ)),
        vec![(2, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS)]
    );
    assert_eq!(&target[100..116], &[7u8; 16]);
    // The MR holds a window: it cannot go.
    assert_eq!(
        t.e.mrs.remove(2, MR).map_err(|e| e.errno()),
        Err(libc::EBUSY)
    );
    // Rebound elsewhere with the next key: the old key is refused, and
    // the refused write fails A's connection with nothing placed.
    t.e.post_send(B, &bind_req(3, window(MW1 + 1, MW1 + 2, base, 32)))
        .unwrap();
    t.run(2);
    t.e.post_send(A, &write(4, &s, base + 100, MW1 + 1))
        .unwrap();
    t.run(10);
    let wcs = t.poll(ACQ);
    assert_eq!(wcs[0].wr_id, 4);
    assert_eq!(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
    assert_eq!(&target[..100], &[0u8; 100]);
}

#[test]
fn a_type_2_window_is_invalidated_by_the_peer_and_bound_again() {
    let (mut target, mut source) = (vec![0u8; 256], vec![7u8; 16]);
    let (mut t, s) = bed(&mut target, &mut source);
    let base = target.as_ptr() as u64;
    let mut rbuf = vec![0u8; 16];
    let raddr = t.reg(2, 0x201, 2, &mut rbuf, Access::LOCAL_WRITE);
    t.recv_at(B, 9, raddr, 16, 0x201);
    let stag = MW2 | 0x42;
    t.e.post_send(B, &bind_req(1, window(MW2, stag, base, 128)))
        .unwrap();
    // Bound already: a second bind is refused when posted.
    assert_eq!(
        t.e.post_send(B, &bind_req(2, window(MW2, stag + 1, base, 128)))
            .map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    t.e.post_send(A, &write(3, &s, base, stag)).unwrap();
    let inv = SendReq {
        op: SendOp::Send {
            invalidate: Some(stag),
            solicited: false,
        }
        .into(),
        ..send(4, &s)
    };
    t.e.post_send(A, &inv).unwrap();
    t.run(10);
    assert_eq!(&target[..16], &[7u8; 16]);
    let wcs = t.poll(BCQ);
    assert_eq!(
        statuses(&wcs),
        vec![
            (1, IBV_WC_BIND_MW, IBV_WC_SUCCESS),
            (9, IBV_WC_RECV, IBV_WC_SUCCESS)
        ]
    );
    assert_eq!(wcs[1].wc_flags, IBV_WC_WITH_INV);
    assert!(t.e.mrs.window(2, stag).unwrap().bound.is_none());
    // Free: bound again under a new key, then invalidated locally, its
    // completion after the bind's.
    t.e.post_send(B, &bind_req(5, window(MW2, stag + 1, base, 128)))
        .unwrap();
    let local = SendReq {
        op: Work::Invalidate(stag + 1),
        ..send(6, &[])
    };
    t.e.post_send(B, &local).unwrap();
    // A type 1 window is never invalidated.
    let refused = SendReq {
        op: Work::Invalidate(MW1),
        ..send(7, &[])
    };
    assert_eq!(
        t.e.post_send(B, &refused).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    t.run(4);
    assert_eq!(
        statuses(&t.poll(BCQ)),
        vec![
            (5, IBV_WC_BIND_MW, IBV_WC_SUCCESS),
            (6, IBV_WC_LOCAL_INV, IBV_WC_SUCCESS)
        ]
    );
    // The MR is free of windows again.
    assert!(t.e.mrs.remove(2, MR).unwrap().is_some());
}

#[test]
fn a_destroyed_qp_takes_its_type_2_bindings_with_it() {
    let (mut target, mut source) = (vec![0u8; 256], vec![7u8; 16]);
    let (mut t, _) = bed(&mut target, &mut source);
    let base = target.as_ptr() as u64;
    t.e.post_send(B, &bind_req(1, window(MW2, MW2 + 1, base, 16)))
        .unwrap();
    assert!(t.e.mrs.window(2, MW2).unwrap().bound.is_some());
    t.e.destroy_qp(B);
    assert!(t.e.mrs.window(2, MW2).unwrap().bound.is_none());
    assert!(t.e.mrs.remove(2, MR).unwrap().is_some());
}
