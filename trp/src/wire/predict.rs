//! Header prediction (after Van Jacobson's TCP fast path): most datagrams of
//! a transfer are TRP Data packets without SACK ranges carrying an RDMA
//! Write or a Send segment. [`parse`] recognises exactly those with a few
//! compares on fixed bytes and reads their fields in one step, without the
//! general representations; [`emit`] writes their headers in one step.
//!
//! `parse` accepts a datagram only if [`trp::Repr::parse`] followed by
//! [`segment::Repr::parse`] would accept it with the same fields, and
//! [`by_general_parsers`] gives the general parsers' answer for comparison;
//! anything else returns `None` and goes to the general parsers, which also
//! produce the right error. The fuzz target `parsers` checks the agreement.

use super::ddp::{self, field as df, BufferRef};
use super::rdmap::{self, qn, Opcode};
use super::segment::{self, Body};
use super::trp::{self, field as tf};

/// The longest header `emit` writes (a Send segment's).
pub const MAX_HEADER_LEN: usize = trp::HEADER_LEN + ddp::UNTAGGED_HEADER_LEN;

/// The fields of a Data packet without SACK ranges carrying an RDMA Write
/// or Send segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub flags: u8,
    pub dst_conn: u32,
    pub psn: u32,
    pub ack_psn: u32,
    pub window: u16,
    pub seg: segment::Repr,
    pub payload: &'a [u8],
}

/// TRP version 1, opcode Data, no SACK ranges.
const TRP_DATA: [u8; 2] = [trp::VERSION, trp::Opcode::Data as u8];
/// DDP control: the tagged flag and the version (the last flag and the
/// reserved bits vary).
const DDP_MASK: u8 = ddp::FLAG_TAGGED | ddp::MASK_DV;
const DDP_TAGGED_V1: u8 = ddp::FLAG_TAGGED | ddp::VERSION;
const DDP_UNTAGGED_V1: u8 = ddp::VERSION;
/// RDMAP control: version (the top two bits) and opcode (the low four);
/// the reserved bits 4 and 5 are ignored on receipt.
const RDMAP_VERSION_MASK: u8 = 0xc0;
const RDMAP_V1: u8 = rdmap::VERSION << 6;
const RDMAP_OPCODE_MASK: u8 = 0x0f;
const WRITE: u8 = Opcode::RdmaWrite as u8;
/// The four Send opcodes are consecutive.
const SEND_FIRST: u8 = Opcode::Send as u8;
const SEND_LAST: u8 = Opcode::SendSeInvalidate as u8;

#[inline(always)]
fn word(h: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

/// The datagram's fields if it is a Data packet without SACK ranges
/// carrying an RDMA Write or a Send segment, else `None`.
#[inline(always)]
pub fn parse(bytes: &[u8]) -> Option<Datagram<'_>> {
    const T: usize = trp::HEADER_LEN;
    let (h, _) = bytes.split_first_chunk::<{ T + ddp::TAGGED_HEADER_LEN }>()?;
    let (ddp_control, rdmap_control) = (h[T + df::CONTROL], h[T + df::ULP_CONTROL]);
    if h[tf::VERSION..tf::FLAGS] != TRP_DATA
        || h[tf::NSACK] != 0
        || rdmap_control & RDMAP_VERSION_MASK != RDMAP_V1
    {
        return None;
    }
    let last = ddp_control & ddp::FLAG_LAST != 0;
    let (opcode, buffer, at) = match (ddp_control & DDP_MASK, rdmap_control & RDMAP_OPCODE_MASK) {
        (DDP_TAGGED_V1, WRITE) => {
            let to = (u64::from(word(h, T + df::TO)) << 32) | u64::from(word(h, T + df::TO + 4));
            let buffer = BufferRef::Tagged {
                stag: word(h, T + df::STAG),
                to,
            };
            (Opcode::RdmaWrite, buffer, T + ddp::TAGGED_HEADER_LEN)
        }
        (DDP_UNTAGGED_V1, op @ SEND_FIRST..=SEND_LAST) => {
            let (h, _) = bytes.split_first_chunk::<MAX_HEADER_LEN>()?;
            if word(h, T + df::QN) != qn::SEND {
                return None;
            }
            let opcode = Opcode::from_u8(op).ok()?;
            let buffer = BufferRef::Untagged {
                ulp_word: word(h, T + df::ULP_WORD),
                qn: qn::SEND,
                msn: word(h, T + df::MSN),
                mo: word(h, T + df::MO),
            };
            (opcode, buffer, MAX_HEADER_LEN)
        }
        _ => return None,
    };
    Some(Datagram {
        flags: h[tf::FLAGS],
        dst_conn: word(h, tf::DST_CONN),
        psn: word(h, tf::PSN),
        ack_psn: word(h, tf::ACK),
        window: u16::from_be_bytes([h[tf::WINDOW], h[tf::WINDOW + 1]]),
        seg: segment::Repr {
            opcode,
            last,
            buffer,
        },
        payload: &bytes[at..],
    })
}

/// Writes the headers of `d` (its payload is not touched) into the front
/// of `buf`, which must hold them: the bytes `trp::Repr::emit` and
/// `segment::Repr::emit` produce for it. Returns their length, at most
/// [`MAX_HEADER_LEN`].
#[inline(always)]
pub fn emit(d: &Datagram<'_>, buf: &mut [u8]) -> usize {
    let mut t = [0u8; trp::HEADER_LEN];
    t[tf::VERSION] = trp::VERSION;
    t[tf::OPCODE] = trp::Opcode::Data as u8;
    t[tf::FLAGS] = d.flags;
    t[tf::DST_CONN..tf::PSN].copy_from_slice(&d.dst_conn.to_be_bytes());
    t[tf::PSN..tf::ACK].copy_from_slice(&d.psn.to_be_bytes());
    t[tf::ACK..tf::WINDOW].copy_from_slice(&d.ack_psn.to_be_bytes());
    t[tf::WINDOW..tf::RESERVED].copy_from_slice(&d.window.to_be_bytes());
    let (head, seg) = buf.split_at_mut(trp::HEADER_LEN);
    head.copy_from_slice(&t);
    d.seg.emit(seg);
    trp::HEADER_LEN + d.seg.header_len()
}

/// The general parsers' answer for the datagrams `parse` recognises: the
/// reference it is checked against by tests and fuzzing.
pub fn by_general_parsers(bytes: &[u8]) -> Option<Datagram<'_>> {
    let h = trp::Repr::parse(&trp::Packet::new_unchecked(bytes)).ok()?;
    if h.opcode != trp::Opcode::Data || !h.sack.is_empty() {
        return None;
    }
    let (seg, body) = segment::Repr::parse(&bytes[h.buffer_len()..]).ok()?;
    // Immediate Data also goes to the Send queue, but with its own body.
    let ours = seg.opcode == Opcode::RdmaWrite || seg.opcode.queue_number() == Some(qn::SEND);
    match body {
        Body::Data(payload) if ours => Some(Datagram {
            flags: h.flags,
            dst_conn: h.dst_conn,
            psn: h.psn,
            ack_psn: h.ack_psn,
            window: h.window,
            seg,
            payload,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(seg: segment::Repr) -> Vec<u8> {
        let mut b = vec![0u8; trp::HEADER_LEN + seg.header_len() + 5];
        trp::Repr {
            opcode: trp::Opcode::Data,
            flags: trp::FLAG_ACK_REQUEST,
            dst_conn: 7,
            psn: 0xfffffffe,
            ack_psn: 3,
            window: 512,
            sack: trp::SackRanges::new(),
        }
        .emit(&mut b);
        seg.emit(&mut b[trp::HEADER_LEN..]);
        let n = b.len();
        b[n - 5..].copy_from_slice(b"hello");
        b
    }

    fn write(last: bool) -> segment::Repr {
        segment::Repr {
            opcode: Opcode::RdmaWrite,
            last,
            buffer: BufferRef::Tagged {
                stag: 0x1234,
                to: 0x0102_0304_0506_0708,
            },
        }
    }

    fn send(opcode: Opcode, last: bool) -> segment::Repr {
        segment::Repr {
            opcode,
            last,
            buffer: BufferRef::Untagged {
                ulp_word: 0xabcd,
                qn: qn::SEND,
                msn: 9,
                mo: 1438,
            },
        }
    }

    fn all() -> Vec<segment::Repr> {
        let sends = [
            Opcode::Send,
            Opcode::SendInvalidate,
            Opcode::SendSe,
            Opcode::SendSeInvalidate,
        ];
        let mut v = vec![write(false), write(true)];
        for op in sends {
            v.extend([send(op, false), send(op, true)]);
        }
        v
    }

    #[test]
    fn agrees_with_the_general_parsers() {
        for seg in all() {
            let b = datagram(seg);
            let d = parse(&b).unwrap();
            assert_eq!(Some(d), by_general_parsers(&b));
            assert_eq!((d.psn, d.seg, d.payload), (0xfffffffe, seg, &b"hello"[..]));
        }
    }

    #[test]
    fn emits_what_the_general_emitters_emit() {
        for seg in all() {
            let b = datagram(seg);
            let d = parse(&b).unwrap();
            let mut h = [0u8; MAX_HEADER_LEN];
            let n = emit(&d, &mut h);
            assert_eq!(h[..n], b[..b.len() - 5]);
        }
    }

    #[test]
    fn declines_everything_else() {
        let t = trp::HEADER_LEN;
        let w = datagram(write(true));
        let s = datagram(send(Opcode::Send, true));
        // Truncated headers, other TRP version or opcode, SACK ranges,
        // other DDP or RDMAP version, other RDMAP opcodes, the wrong buffer
        // model for the opcode, a Send on another queue.
        assert_eq!(parse(&w[..t + ddp::TAGGED_HEADER_LEN - 1]), None);
        assert_eq!(parse(&s[..MAX_HEADER_LEN - 1]), None);
        let edits: [(&[u8], usize, u8); 11] = [
            (&w, 0, 2),
            (&w, 1, trp::Opcode::Fin as u8),
            (&w, 3, 1),
            (&w, t, 0xc2),
            (&w, t + 1, 0x80),
            (&w, t + 1, 0x41),
            (&w, t + 1, 0x43),
            (&s, t, 0xc1),
            (&s, t + 1, 0x47),
            (&s, t + 1, 0x48),
            (&s, t + 9, 1),
        ];
        for (b, at, v) in edits {
            let mut c = b.to_vec();
            c[at] = v;
            assert_eq!(parse(&c), None, "byte {at} = {v:#x}");
            assert_eq!(by_general_parsers(&c), None, "byte {at} = {v:#x}");
        }
        // Reserved bits the general parsers ignore are ignored here too.
        for b in [&w, &s] {
            let mut c = b.clone();
            c[t] |= 0x3c;
            c[t + 1] |= 0x30;
            c[18] = 0xff;
            assert!(parse(&c).is_some());
            assert_eq!(parse(&c), by_general_parsers(&c));
        }
    }
}
