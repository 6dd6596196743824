//! Entry points shared by the cargo-fuzz targets (`trp/fuzz`) and the
//! stable-toolchain fuzz test (`tests/fuzz_stable.rs`): each takes arbitrary
//! bytes and must never panic; invariants are checked with asserts. Built
//! with the `fuzzing` feature only.

use crate::mr::{Access, Memory, Region, VecMemory};
use crate::sim::Pair;
use crate::verbs::{RecvWr, Sge};
use crate::wire::{crc, ddp, handshake, predict, rdmap, segment, trp};
use crate::{Config, Incoming};

/// Every parser on the same bytes; whatever parses must re-emit to bytes
/// that parse to the same value.
pub fn parsers(data: &[u8]) {
    if let Ok(p) = trp::Packet::new_checked(data) {
        let _ = (p.payload(), p.sack_range(3), p.window());
        if let Ok(r) = trp::Repr::parse(&p) {
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&mut buf);
            let again = trp::Repr::parse(&trp::Packet::new_checked(&buf[..]).unwrap()).unwrap();
            assert_eq!(again, r);
        }
    }
    if let Ok(p) = ddp::Packet::new_checked(data) {
        let _ = (p.payload(), p.msn(), p.tagged_offset());
        if let Ok(r) = ddp::Repr::parse(&p) {
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&mut buf);
            assert_eq!(
                ddp::Repr::parse(&ddp::Packet::new_checked(&buf[..]).unwrap()).unwrap(),
                r
            );
        }
    }
    if let Ok((r, body)) = segment::Repr::parse(data) {
        let mut buf = vec![0u8; r.header_len()];
        r.emit(&mut buf);
        if let segment::Body::Data(d) = body {
            buf.extend_from_slice(d);
            assert_eq!(segment::Repr::parse(&buf).unwrap(), (r, body));
        }
    }
    if let Ok(t) = rdmap::Terminate::parse(data) {
        let mut buf = vec![0u8; t.buffer_len()];
        t.emit(&mut buf);
        assert_eq!(rdmap::Terminate::parse(&buf).unwrap(), t);
    }
    if let Ok(r) = rdmap::ReadRequest::parse(data) {
        let mut buf = [0u8; rdmap::READ_REQUEST_LEN];
        r.emit(&mut buf);
        assert_eq!(rdmap::ReadRequest::parse(&buf).unwrap(), r);
    }
    if let Ok(r) = rdmap::AtomicRequest::parse(data) {
        let mut buf = [0u8; rdmap::ATOMIC_REQUEST_LEN];
        r.emit(&mut buf);
        assert_eq!(rdmap::AtomicRequest::parse(&buf).unwrap(), r);
    }
    if let Ok(r) = rdmap::AtomicResponse::parse(data) {
        let mut buf = [0u8; rdmap::ATOMIC_RESPONSE_LEN];
        r.emit(&mut buf);
        assert_eq!(rdmap::AtomicResponse::parse(&buf).unwrap(), r);
    }
    if let Ok(h) = handshake::Repr::parse(data) {
        let mut buf = vec![0u8; h.buffer_len()];
        h.emit(&mut buf);
        assert_eq!(handshake::Repr::parse(&buf).unwrap(), h);
    }
    // Header prediction accepts exactly what the general parsers read as
    // an RDMA Write or Send segment, with the same fields, and its emitter
    // writes headers that parse back to them.
    let predicted = predict::parse(data);
    assert_eq!(predicted, predict::by_general_parsers(data));
    if let Some(d) = predicted {
        let mut buf = vec![0u8; predict::MAX_HEADER_LEN];
        let n = predict::emit(&d, &mut buf);
        buf.truncate(n);
        buf.extend_from_slice(d.payload);
        assert_eq!(predict::parse(&buf), Some(d));
    }
    let _ = Incoming::parse(data);
    // The trailer: what opens is the datagram less four bytes, and sealing
    // it again gives back the same bytes.
    if let Ok((body, true)) = crc::open(data) {
        let mut buf = body.to_vec();
        buf.extend_from_slice(&[0; crc::TRAILER_LEN]);
        assert_eq!(crc::seal(&mut buf, body.len()), data.len());
        assert_eq!(&buf[..], data);
    }
    let _ = rdmap::parse_control(data.first().copied().unwrap_or(0));
}

const MEM: u64 = 1 << 16;
/// Bytes above this are registered for nobody: must never change.
const GUARD: u64 = 3 * MEM / 4;

/// The memory of both ends of the fuzzed pair, and of the one the seed
/// corpus is captured from (`examples/gen_corpus.rs`): 64 KiB, STag 1 for
/// local writes, 2 for remote writes and reads, 3 for remote reads only, 4
/// in another protection domain; the last quarter is registered for nobody.
pub fn memory() -> VecMemory {
    let mut m = VecMemory::new(MEM as usize);
    m.register(1, Region::new(0, 0, MEM / 4, Access::LOCAL_WRITE), false);
    m.register(
        2,
        Region::new(
            0,
            MEM / 4,
            MEM / 4,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        ),
        true,
    );
    m.register(
        3,
        Region::new(0, MEM / 2, MEM / 4, Access::REMOTE_READ),
        true,
    );
    m.register(4, Region::new(1, MEM / 2, MEM / 4, Access::ALL), true);
    m
}

/// An established connection (the receiving end of a fresh pair) fed with
/// arbitrary datagrams. `data` is a sequence of records:
/// `[flags, len_hi, len_lo, bytes...]`. Flag bits steer the fuzzer past the
/// checks a blind input would almost never pass: bit 0 writes the right
/// destination connection id, bit 1 the expected PSN (plus bits 4..7 as an
/// offset), bit 2 a cumulative ACK inside the sent range; bit 3 runs the
/// timers and the transmit path after the datagram. The connection uses the
/// CRC32C trailer, so each datagram is then sealed with a right one, unless
/// the top bit of `len_hi` says to leave it as it is.
pub fn receive_path(data: &[u8]) {
    receive(data, false)
}

/// The same records handed over with `handle_datagram_burst`: each burst
/// ends with a record whose bit 3 is set (then the timers and the transmit
/// path run) or with the input.
pub fn receive_bursts(data: &[u8]) {
    receive(data, true)
}

fn receive(data: &[u8], bursts: bool) {
    let cfg = Config {
        recv_window: 64,
        max_retries: 2,
        // Give up at once after the retries: a failing input ends early.
        min_give_up: core::time::Duration::ZERO,
        ..Config::default()
    };
    let mut p = Pair::builder()
        .config(cfg)
        .seed(3)
        .memories(memory(), memory())
        .connect()
        .expect("handshake");
    for i in 0..4u64 {
        let sges = [Sge {
            addr: i * 1024,
            len: 1024,
            lkey: 1,
        }];
        p.b.conn
            .post_recv(
                &p.b.mem,
                &RecvWr {
                    wr_id: i,
                    sges: &sges,
                },
            )
            .unwrap();
    }
    let guard = p.b.mem.bytes[GUARD as usize..].to_vec();
    let local_conn = p.b.conn.local_conn();
    let mut rest = data;
    let mut buf = vec![0u8; 2048];
    let mut now = p.now;
    let mut burst = Vec::new();
    while rest.len() >= 3 {
        let flags = rest[0];
        let unsealed = rest[1] & 0x80 != 0;
        let len = (usize::from(rest[1] & 0x7f) << 8 | usize::from(rest[2])).min(rest.len() - 3);
        let mut dgram = rest[3..3 + len].to_vec();
        rest = &rest[3 + len..];
        if dgram.len() >= trp::HEADER_LEN {
            if flags & 1 != 0 {
                dgram[4..8].copy_from_slice(&local_conn.to_be_bytes());
            }
            if flags & 2 != 0 {
                let psn = p.b.conn.expected_psn().wrapping_add(u32::from(flags >> 4));
                dgram[8..12].copy_from_slice(&psn.to_be_bytes());
            }
            if flags & 4 != 0 {
                let ack = p.b.conn.unacked_psn();
                dgram[12..16].copy_from_slice(&ack.to_be_bytes());
            }
            if !unsealed {
                dgram.extend_from_slice(&[0; crc::TRAILER_LEN]);
                crc::seal(&mut dgram, len);
            }
        }
        now = crate::Instant(now.0 + 1000);
        if !bursts {
            let _ = p.b.conn.handle_datagram(now, &mut p.b.mem, &dgram);
        } else {
            burst.push(dgram);
            if flags & 8 == 0 && rest.len() >= 3 {
                continue;
            }
            p.b.conn.handle_datagram_burst(now, &mut p.b.mem, &burst);
            burst.clear();
        }
        if flags & 8 != 0 {
            now = crate::Instant(now.0 + 5_000_000);
            p.b.conn.handle_timeout(now);
        }
        while p.b.conn.poll_transmit(now, &p.b.mem, &mut buf).is_some() {}
        while p.b.conn.poll_completion().is_some() {}
        while p.b.conn.poll_event().is_some() {}
    }
    assert_eq!(
        &p.b.mem.bytes[GUARD as usize..],
        &guard[..],
        "unregistered memory changed"
    );
    let _ = p.b.mem.region(2);
}
