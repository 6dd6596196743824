//! Property tests: no tagged placement, read or atomic ever touches memory
//! the application did not register for the peer, and each violation yields
//! the Terminate code RFC 5040/5041/7306 prescribe.

use proptest::prelude::*;
use trp::mr::{self, ProtectionError};
use trp::sim::Pair;
use trp::terminate::{Cause, OperationCode, ProtectionCode};
use trp::{
    Access, AtomicOp, Completion, Config, Event, FailReason, Memory, QpState, Region, SendOp,
    SendWr, Sge, VecMemory, WcStatus,
};

const SIZE: u64 = 64 * 1024;
const PD: u32 = 9;
const LKEY: u32 = 1;
const TARGET: u32 = 0x77;

#[derive(Debug, Clone, Copy)]
enum Target {
    Valid,
    Unknown,
    Invalidated,
    OtherPd,
}

fn setup(target: Target, base: u64, len: u64, access: Access) -> (VecMemory, VecMemory) {
    let mut a = VecMemory::new(SIZE as usize);
    a.register(LKEY, Region::new(PD, 0, SIZE, Access::LOCAL_WRITE), false);
    for (i, b) in a.bytes.iter_mut().enumerate() {
        *b = i as u8 ^ 0x5a;
    }
    let mut b = VecMemory::new(SIZE as usize);
    for (i, x) in b.bytes.iter_mut().enumerate() {
        *x = (i * 7) as u8;
    }
    let region = Region {
        pd: if matches!(target, Target::OtherPd) {
            PD + 1
        } else {
            PD
        },
        base,
        len,
        access,
        valid: !matches!(target, Target::Invalidated),
    };
    if !matches!(target, Target::Unknown) {
        b.register(TARGET, region, true);
    }
    (a, b)
}

/// Posts `wr` at A and runs until it completes and B, if it failed, has
/// sent its Terminate.
fn complete(p: &mut Pair, wr: &SendWr<'_>) -> Completion {
    p.a.conn.post_send(&p.a.mem, wr).unwrap();
    let mut done = None;
    p.run_until(trp::Instant(p.now.0 + 1_000_000_000), |p| {
        if let Some(c) = p.a.conn.poll_completion() {
            done = Some(c);
        }
        done.is_some() && p.b.conn.state() != QpState::Error
    });
    done.expect("completion")
}

fn offsets() -> impl Strategy<Value = u64> {
    prop_oneof![0..SIZE * 2, (u64::MAX - 4096)..=u64::MAX, Just(0u64),]
}

fn rights() -> impl Strategy<Value = Access> {
    (0u8..16).prop_map(Access::from_bits)
}

fn atomic_offsets() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => (0..SIZE / 8 * 2).prop_map(|x| x * 8),
        1 => 0..SIZE * 2,
        1 => (u64::MAX - 64)..=u64::MAX,
    ]
}

fn targets() -> impl Strategy<Value = Target> {
    prop_oneof![
        4 => Just(Target::Valid),
        1 => Just(Target::Unknown),
        1 => Just(Target::Invalidated),
        1 => Just(Target::OtherPd),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn tagged_access(
        target in targets(),
        base in 0..SIZE,
        rlen in 0..SIZE,
        access in rights(),
        to in offsets(),
        len in 0u32..6000,
        read in any::<bool>(),
    ) {
        let rlen = rlen.min(SIZE - base);
        let (a, b) = setup(target, base, rlen, access);
        let need = if read { Access::REMOTE_READ } else { Access::REMOTE_WRITE };
        // A write is checked segment by segment (1434 payload bytes each at
        // the default datagram size: headers and the CRC32C trailer off
        // 1472): the first bad segment decides.
        let expect = if read {
            mr::check(&b, TARGET, PD, to, u64::from(len), need)
        } else {
            let seg = 1472 - 20 - 14 - trp::wire::crc::TRAILER_LEN as u32;
            let mut r = mr::check(&b, TARGET, PD, to, u64::from(len.min(seg)), need);
            let mut off = seg;
            while r.is_ok() && off < len {
                let l = (len - off).min(seg);
                r = mr::check(&b, TARGET, PD, to.wrapping_add(u64::from(off)), u64::from(l), need);
                off += seg;
            }
            r
        };
        let cfg = Config { pd: PD, ..Config::default() };
        let mut p = Pair::builder().config(cfg).seed(1).memories(a, b).connect().unwrap();
        let before_b = p.b.mem.bytes.clone();
        let sink = SIZE - u64::from(len);
        let sge = [Sge { addr: sink, len, lkey: LKEY }];
        let op = if read {
            SendOp::RdmaRead { remote_addr: to, rkey: TARGET }
        } else {
            SendOp::RdmaWrite { remote_addr: to, rkey: TARGET }
        };
        let c = complete(&mut p, &SendWr { wr_id: 1, op, sges: &sge, signaled: true });
        match expect {
            Ok(()) => {
                prop_assert_eq!(c.status, WcStatus::Success);
                if read {
                    let s = to as usize;
                    prop_assert_eq!(&p.a.mem.bytes[sink as usize..], &before_b[s..s + len as usize]);
                    prop_assert_eq!(&p.b.mem.bytes, &before_b);
                } else {
                    let mut want = before_b.clone();
                    want[to as usize..to as usize + len as usize].copy_from_slice(&p.a.mem.bytes[sink as usize..]);
                    prop_assert_eq!(&p.b.mem.bytes, &want);
                }
            }
            Err(e) => {
                // Nothing outside what was registered for the peer moved (a
                // write may have placed its good leading segments), the
                // initiator learns the RFC's error code, and the target's QP
                // went to error.
                let allowed = matches!(target, Target::Valid) && access.contains(Access::REMOTE_WRITE);
                for (i, (x, y)) in p.b.mem.bytes.iter().zip(&before_b).enumerate() {
                    let i = i as u64;
                    if x != y {
                        prop_assert!(!read && allowed && i >= base && i < base + rlen, "byte {} changed", i);
                    }
                }
                prop_assert_eq!(c.status, WcStatus::RemoteAccess);
                let ev = p.a.conn.poll_event();
                let t = match ev {
                    Some(Event::Failed(FailReason::TerminateReceived(t))) => t,
                    other => return Err(TestCaseError::fail(format!("event {other:?}"))),
                };
                let want = if read {
                    Cause::RemoteProtection(ProtectionCode::from(e))
                } else {
                    Cause::from(e)
                };
                prop_assert_eq!((t.layer, t.etype, t.code), want.wire());
                if read {
                    prop_assert!(t.rdmap_header.is_some(), "read request echoed");
                } else {
                    prop_assert!(t.ddp_header.is_some(), "DDP header echoed");
                }
                prop_assert_eq!(p.b.conn.state(), QpState::Closed);
                prop_assert!(matches!(
                    e,
                    ProtectionError::UnknownStag
                        | ProtectionError::Invalidated
                        | ProtectionError::WrongPd
                        | ProtectionError::Wrap
                        | ProtectionError::Bounds
                        | ProtectionError::Access
                ));
            }
        }
        let _ = p.b.mem.region(TARGET);
    }

    #[test]
    fn atomic_access(
        target in targets(),
        base in 0..SIZE,
        rlen in 0..SIZE,
        access in rights(),
        to in atomic_offsets(),
        fetch_add in any::<bool>(),
        a1 in any::<u64>(),
        a2 in any::<u64>(),
    ) {
        let rlen = rlen.min(SIZE - base);
        let (a, b) = setup(target, base, rlen, access);
        let expect = mr::check(&b, TARGET, PD, to, 8, Access::REMOTE_ATOMIC)
            .map_err(|e| Cause::RemoteProtection(ProtectionCode::from(e)))
            .and_then(|()| {
                if to.is_multiple_of(8) {
                    Ok(())
                } else {
                    Err(Cause::RemoteOperation(OperationCode::CatastrophicStream))
                }
            });
        let cfg = Config { pd: PD, ..Config::default() };
        let mut p = Pair::builder().config(cfg).seed(1).memories(a, b).connect().unwrap();
        let before_b = p.b.mem.bytes.clone();
        let sink = 24;
        let sge = [Sge { addr: sink, len: 8, lkey: LKEY }];
        let op = if fetch_add {
            AtomicOp::fetch_add(a1)
        } else {
            AtomicOp::compare_swap(a1, a2)
        };
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Atomic { remote_addr: to, rkey: TARGET, op },
            sges: &sge,
            signaled: true,
        };
        let c = complete(&mut p, &wr);
        match expect {
            Ok(()) => {
                prop_assert_eq!(c.status, WcStatus::Success);
                prop_assert_eq!(c.byte_len, 8);
                let at = to as usize;
                let old = u64::from_ne_bytes(before_b[at..at + 8].try_into().unwrap());
                let result = &p.a.mem.bytes[sink as usize..sink as usize + 8];
                prop_assert_eq!(u64::from_ne_bytes(result.try_into().unwrap()), old);
                let mut want = before_b.clone();
                want[at..at + 8].copy_from_slice(&op.apply(old).to_ne_bytes());
                prop_assert_eq!(&p.b.mem.bytes, &want);
            }
            Err(cause) => {
                prop_assert_eq!(&p.b.mem.bytes, &before_b);
                let status = if matches!(cause, Cause::RemoteProtection(_)) {
                    WcStatus::RemoteAccess
                } else {
                    WcStatus::RemoteOperation
                };
                prop_assert_eq!(c.status, status);
                let t = match p.a.conn.poll_event() {
                    Some(Event::Failed(FailReason::TerminateReceived(t))) => t,
                    other => return Err(TestCaseError::fail(format!("event {other:?}"))),
                };
                prop_assert_eq!((t.layer, t.etype, t.code), cause.wire());
                prop_assert!(t.ddp_header.is_some(), "DDP header echoed");
                prop_assert_eq!(p.b.conn.state(), QpState::Closed);
            }
        }
    }
}
