//! Header prediction for the receive path (after Van Jacobson's TCP fast
//! path): most datagrams of a transfer are TRP Data packets without SACK
//! ranges carrying an RDMA Write segment. [`tagged_write`] recognises
//! exactly those with a few compares on fixed bytes and reads their fields
//! in one step, without building the general representations.
//!
//! It accepts a datagram only if [`trp::Repr::parse`] followed by
//! [`segment::Repr::parse`] would accept it with the same fields; anything
//! else returns `None` and goes to the general parsers, which also produce
//! the right error. The fuzz target `parsers` checks that agreement.
//!
//! [`segment::Repr::parse`]: super::segment::Repr::parse

use super::ddp;
use super::ddp::BufferRef;
use super::rdmap::{self, Opcode};
use super::segment::{self, Body};
use super::trp;

/// Bytes before the payload of a predicted datagram.
pub const HEADER_LEN: usize = trp::HEADER_LEN + ddp::TAGGED_HEADER_LEN;

/// The fields of a Data packet carrying an RDMA Write segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaggedWrite<'a> {
    pub flags: u8,
    pub dst_conn: u32,
    pub psn: u32,
    pub ack_psn: u32,
    pub window: u16,
    pub last: bool,
    pub stag: u32,
    pub to: u64,
    pub payload: &'a [u8],
}

/// TRP version 1, opcode Data, no SACK ranges.
const TRP_DATA: [u8; 2] = [trp::VERSION, trp::Opcode::Data as u8];
/// DDP control: tagged, version 1 (the last flag and reserved bits vary).
const DDP_TAGGED_MASK: u8 = ddp::FLAG_TAGGED | ddp::MASK_DV;
const DDP_TAGGED_V1: u8 = ddp::FLAG_TAGGED | ddp::VERSION;
/// RDMAP control: version and opcode (reserved bits 4 and 5 are ignored).
const RDMAP_MASK: u8 = 0xc0 | 0x0f;
const RDMAP_WRITE_V1: u8 = (rdmap::VERSION << 6) | Opcode::RdmaWrite as u8;

#[inline(always)]
fn word(h: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

/// The datagram's fields if it is a plain RDMA Write segment, else `None`.
#[inline(always)]
pub fn tagged_write(bytes: &[u8]) -> Option<TaggedWrite<'_>> {
    let (h, payload) = bytes.split_first_chunk::<HEADER_LEN>()?;
    let ddp_control = h[trp::HEADER_LEN];
    let rdmap_control = h[trp::HEADER_LEN + 1];
    if h[..2] != TRP_DATA
        || h[3] != 0
        || ddp_control & DDP_TAGGED_MASK != DDP_TAGGED_V1
        || rdmap_control & RDMAP_MASK != RDMAP_WRITE_V1
    {
        return None;
    }
    let d = trp::HEADER_LEN;
    Some(TaggedWrite {
        flags: h[2],
        dst_conn: word(h, 4),
        psn: word(h, 8),
        ack_psn: word(h, 12),
        window: u16::from_be_bytes([h[16], h[17]]),
        last: ddp_control & ddp::FLAG_LAST != 0,
        stag: word(h, d + 2),
        to: (u64::from(word(h, d + 6)) << 32) | u64::from(word(h, d + 10)),
        payload,
    })
}

/// Writes the headers of a Data packet without SACK ranges carrying an
/// RDMA Write segment: the bytes `trp::Repr::emit` and
/// `segment::Repr::emit` produce for it, built in one array.
#[inline(always)]
pub fn emit_tagged_write(w: &TaggedWrite<'_>, buf: &mut [u8; HEADER_LEN]) {
    let d = trp::HEADER_LEN;
    let mut h = [0u8; HEADER_LEN];
    h[..2].copy_from_slice(&TRP_DATA);
    h[2] = w.flags;
    h[4..8].copy_from_slice(&w.dst_conn.to_be_bytes());
    h[8..12].copy_from_slice(&w.psn.to_be_bytes());
    h[12..16].copy_from_slice(&w.ack_psn.to_be_bytes());
    h[16..18].copy_from_slice(&w.window.to_be_bytes());
    h[d] = DDP_TAGGED_V1 | if w.last { ddp::FLAG_LAST } else { 0 };
    h[d + 1] = RDMAP_WRITE_V1;
    h[d + 2..d + 6].copy_from_slice(&w.stag.to_be_bytes());
    h[d + 6..].copy_from_slice(&w.to.to_be_bytes());
    *buf = h;
}

/// The same answer from the general parsers: the reference the prediction
/// is checked against by tests and fuzzing.
pub fn by_general_parsers(bytes: &[u8]) -> Option<TaggedWrite<'_>> {
    let h = trp::Repr::parse(&trp::Packet::new_unchecked(bytes)).ok()?;
    if h.opcode != trp::Opcode::Data || !h.sack.is_empty() {
        return None;
    }
    let (seg, body) = segment::Repr::parse(&bytes[h.buffer_len()..]).ok()?;
    match (seg.opcode, seg.buffer, body) {
        (Opcode::RdmaWrite, BufferRef::Tagged { stag, to }, Body::Data(payload)) => {
            Some(TaggedWrite {
                flags: h.flags,
                dst_conn: h.dst_conn,
                psn: h.psn,
                ack_psn: h.ack_psn,
                window: h.window,
                last: seg.last,
                stag,
                to,
                payload,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ddp::BufferRef;
    use crate::wire::segment;
    use crate::wire::trp::SackRanges;

    fn datagram(last: bool) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + 5];
        trp::Repr {
            opcode: trp::Opcode::Data,
            flags: trp::FLAG_ACK_REQUEST,
            dst_conn: 7,
            psn: 0xfffffffe,
            ack_psn: 3,
            window: 512,
            sack: SackRanges::new(),
        }
        .emit(&mut b);
        segment::Repr {
            opcode: Opcode::RdmaWrite,
            last,
            buffer: BufferRef::Tagged {
                stag: 0x1234,
                to: 0x0102_0304_0506_0708,
            },
        }
        .emit(&mut b[trp::HEADER_LEN..]);
        b[HEADER_LEN..].copy_from_slice(b"hello");
        b
    }

    #[test]
    fn agrees_with_the_general_parsers() {
        for last in [false, true] {
            let b = datagram(last);
            let p = tagged_write(&b).unwrap();
            assert_eq!(Some(p), by_general_parsers(&b));
            assert_eq!(
                (p.psn, p.stag, p.last, p.payload),
                (0xfffffffe, 0x1234, last, &b"hello"[..])
            );
        }
    }

    #[test]
    fn emits_what_the_general_emitters_emit() {
        for last in [false, true] {
            let b = datagram(last);
            let w = tagged_write(&b).unwrap();
            let mut h = [0u8; HEADER_LEN];
            emit_tagged_write(&w, &mut h);
            assert_eq!(h[..], b[..HEADER_LEN]);
        }
    }

    #[test]
    fn declines_everything_else() {
        let b = datagram(true);
        // Truncated header, other TRP version/opcode, SACK ranges, untagged,
        // other DDP or RDMAP version, other RDMAP opcode.
        let edits: [(usize, u8); 7] = [
            (0, 2),
            (1, trp::Opcode::Fin as u8),
            (3, 1),
            (trp::HEADER_LEN, 0x41),
            (trp::HEADER_LEN, 0xc2),
            (trp::HEADER_LEN + 1, 0x80),
            (trp::HEADER_LEN + 1, 0x41),
        ];
        assert_eq!(tagged_write(&b[..HEADER_LEN - 1]), None);
        for (at, v) in edits {
            let mut c = b.clone();
            c[at] = v;
            assert_eq!(tagged_write(&c), None, "byte {at} = {v:#x}");
        }
        // Reserved bits the general parsers ignore are ignored here too.
        let mut c = b.clone();
        c[trp::HEADER_LEN] |= 0x3c;
        c[trp::HEADER_LEN + 1] |= 0x30;
        c[18] = 0xff;
        assert_eq!(tagged_write(&c), by_general_parsers(&c));
        assert!(tagged_write(&c).is_some());
    }
}
