//! RDMAP (RFC 5040 section 4, RFC 7306 section 4) carried in DDP's RsvdULP
//! fields and in untagged message bodies.

use super::{be16, be32, be64, need, put16, put32, put64, WireError};
use crate::verbs::AtomicOp;

pub const VERSION: u8 = 1;

/// Untagged queue numbers (RFC 5040 section 5.1; RFC 7306 section 4.3).
pub mod qn {
    pub const SEND: u32 = 0;
    pub const READ_REQUEST: u32 = 1;
    pub const TERMINATE: u32 = 2;
    /// RFC 7306: Atomic Requests share queue 1 (and its MSNs) with RDMA
    /// Read Requests, for IRD/ORD.
    pub const ATOMIC_RESPONSE: u32 = 3;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    RdmaWrite = 0x0,
    ReadRequest = 0x1,
    ReadResponse = 0x2,
    Send = 0x3,
    SendInvalidate = 0x4,
    SendSe = 0x5,
    SendSeInvalidate = 0x6,
    Terminate = 0x7,
    /// RFC 7306 Immediate Data.
    ImmediateData = 0x8,
    /// RFC 7306 Immediate Data with Solicited Event.
    ImmediateDataSe = 0x9,
    /// RFC 7306 Atomic Request.
    AtomicRequest = 0xa,
    /// RFC 7306 Atomic Response.
    AtomicResponse = 0xb,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0x0 => Opcode::RdmaWrite,
            0x1 => Opcode::ReadRequest,
            0x2 => Opcode::ReadResponse,
            0x3 => Opcode::Send,
            0x4 => Opcode::SendInvalidate,
            0x5 => Opcode::SendSe,
            0x6 => Opcode::SendSeInvalidate,
            0x7 => Opcode::Terminate,
            0x8 => Opcode::ImmediateData,
            0x9 => Opcode::ImmediateDataSe,
            0xa => Opcode::AtomicRequest,
            0xb => Opcode::AtomicResponse,
            o => return Err(WireError::RdmapOpcode(o)),
        })
    }

    pub fn tagged(self) -> bool {
        matches!(self, Opcode::RdmaWrite | Opcode::ReadResponse)
    }

    /// The untagged queue the opcode must use, if untagged.
    #[inline]
    pub fn queue_number(self) -> Option<u32> {
        match self {
            Opcode::RdmaWrite | Opcode::ReadResponse => None,
            Opcode::ReadRequest => Some(qn::READ_REQUEST),
            Opcode::Terminate => Some(qn::TERMINATE),
            Opcode::AtomicRequest => Some(qn::READ_REQUEST),
            Opcode::AtomicResponse => Some(qn::ATOMIC_RESPONSE),
            _ => Some(qn::SEND),
        }
    }

    #[inline]
    pub fn solicited(self) -> bool {
        matches!(
            self,
            Opcode::SendSe | Opcode::SendSeInvalidate | Opcode::ImmediateDataSe
        )
    }

    #[inline]
    pub fn invalidates(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }

    /// RDMAP control byte: RV(2) | reserved(2) | opcode(4).
    #[inline]
    pub fn control_byte(self) -> u8 {
        (VERSION << 6) | self as u8
    }
}

/// Splits an RDMAP control byte. Reserved bits are ignored on receipt.
#[inline]
pub fn parse_control(b: u8) -> Result<Opcode, WireError> {
    let rv = b >> 6;
    if rv != VERSION {
        return Err(WireError::RdmapVersion(rv));
    }
    Opcode::from_u8(b & 0x0f)
}

pub const READ_REQUEST_LEN: usize = 28;

/// RDMA Read Request body, in RFC 5040 section 4.4 order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReadRequest {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub src_stag: u32,
    pub src_to: u64,
}

impl ReadRequest {
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b.len(), READ_REQUEST_LEN)?;
        Ok(ReadRequest {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            src_stag: be32(b, 16),
            src_to: be64(b, 20),
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.sink_stag);
        put64(b, 4, self.sink_to);
        put32(b, 12, self.size);
        put32(b, 16, self.src_stag);
        put64(b, 20, self.src_to);
    }
}

pub const ATOMIC_REQUEST_LEN: usize = 52;

/// RFC 7306 atomic operation codes (AOpCode; 1 is reserved).
pub mod aop {
    pub const FETCH_ADD: u8 = 0;
    pub const COMPARE_SWAP: u8 = 2;
}

/// Atomic Request body (RFC 7306 section 4.1, figure 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicRequest {
    pub aop: u8,
    pub request_id: u32,
    pub stag: u32,
    pub to: u64,
    /// Add data (Fetch-and-Add) or swap data (Compare-and-Swap).
    pub add_swap: u64,
    pub add_swap_mask: u64,
    pub compare: u64,
    pub compare_mask: u64,
}

impl AtomicRequest {
    /// The request for `op` on `to` of `stag`.
    pub fn new(request_id: u32, stag: u32, to: u64, op: AtomicOp) -> AtomicRequest {
        let (aop, add_swap, add_swap_mask, compare, compare_mask) = match op {
            // Compare data and mask as the RFC says a Fetch-and-Add sends them.
            AtomicOp::FetchAdd { add, fields } => (aop::FETCH_ADD, add, fields, 0, u64::MAX),
            AtomicOp::CompareSwap {
                compare,
                compare_mask,
                swap,
                swap_mask,
            } => (aop::COMPARE_SWAP, swap, swap_mask, compare, compare_mask),
        };
        AtomicRequest {
            aop,
            request_id,
            stag,
            to,
            add_swap,
            add_swap_mask,
            compare,
            compare_mask,
        }
    }

    /// The operation asked for; None for a reserved AOpCode.
    pub fn op(&self) -> Option<AtomicOp> {
        match self.aop {
            aop::FETCH_ADD => Some(AtomicOp::FetchAdd {
                add: self.add_swap,
                fields: self.add_swap_mask,
            }),
            aop::COMPARE_SWAP => Some(AtomicOp::CompareSwap {
                compare: self.compare,
                compare_mask: self.compare_mask,
                swap: self.add_swap,
                swap_mask: self.add_swap_mask,
            }),
            _ => None,
        }
    }

    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b.len(), ATOMIC_REQUEST_LEN)?;
        Ok(AtomicRequest {
            aop: b[3] & 0x0f,
            request_id: be32(b, 4),
            stag: be32(b, 8),
            to: be64(b, 12),
            add_swap: be64(b, 20),
            add_swap_mask: be64(b, 28),
            compare: be64(b, 36),
            compare_mask: be64(b, 44),
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        put32(b, 0, u32::from(self.aop & 0x0f));
        put32(b, 4, self.request_id);
        put32(b, 8, self.stag);
        put64(b, 12, self.to);
        put64(b, 20, self.add_swap);
        put64(b, 28, self.add_swap_mask);
        put64(b, 36, self.compare);
        put64(b, 44, self.compare_mask);
    }
}

pub const ATOMIC_RESPONSE_LEN: usize = 12;

/// Atomic Response body (RFC 7306 section 5.2): the value the request
/// found at its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicResponse {
    pub request_id: u32,
    pub original: u64,
}

impl AtomicResponse {
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b.len(), ATOMIC_RESPONSE_LEN)?;
        Ok(AtomicResponse {
            request_id: be32(b, 0),
            original: be64(b, 4),
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.request_id);
        put64(b, 4, self.original);
    }
}

/// RFC 7306 Immediate Data carries 8 bytes. The verbs mapping puts the
/// 32-bit immediate value in the first four and, for Write with Immediate,
/// the length of the preceding RDMA Write in the last four (docs/protocol.md).
pub const IMMEDIATE_LEN: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Immediate {
    pub imm: u32,
    pub write_len: u32,
}

impl Immediate {
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b.len(), IMMEDIATE_LEN)?;
        Ok(Immediate {
            imm: be32(b, 0),
            write_len: be32(b, 4),
        })
    }
    pub fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.imm);
        put32(b, 4, self.write_len);
    }
}

/// Terminate error layer (RFC 5040 section 4.8); the types and codes of
/// each are in [`crate::terminate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Layer {
    Rdmap = 0,
    Ddp = 1,
    Llp = 2,
}

const TERM_FLAG_M: u8 = 0x80;
const TERM_FLAG_D: u8 = 0x40;
const TERM_FLAG_R: u8 = 0x20;
pub const TERMINATE_MAX_LEN: usize = 4 + 2 + 18 + READ_REQUEST_LEN;

/// A copy of the DDP header of the segment that caused the error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderCopy {
    pub segment_len: u16,
    len: u8,
    bytes: [u8; 18],
}

impl HeaderCopy {
    /// Copies a DDP header from the front of `segment` (its length follows
    /// from the T bit). Returns None if `segment` is too short.
    pub fn from_segment(segment: &[u8]) -> Option<Self> {
        let len = if *segment.first()? & 0x80 != 0 {
            14
        } else {
            18
        };
        let src = segment.get(..len)?;
        let mut bytes = [0u8; 18];
        bytes[..len].copy_from_slice(src);
        Some(HeaderCopy {
            segment_len: segment.len().min(u16::MAX as usize) as u16,
            len: len as u8,
            bytes,
        })
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// Terminate message body (RFC 5040 section 4.8). Type and code stay
/// numbers: a peer may send any; ours are built from a
/// [`Cause`](crate::terminate::Cause).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terminate {
    pub layer: Layer,
    pub etype: u8,
    pub code: u8,
    pub ddp_header: Option<HeaderCopy>,
    pub rdmap_header: Option<ReadRequest>,
}

impl Terminate {
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b.len(), 4)?;
        let layer = match b[0] >> 4 {
            0 => Layer::Rdmap,
            1 => Layer::Ddp,
            2 => Layer::Llp,
            _ => return Err(WireError::Terminate),
        };
        let flags = b[2];
        let mut at = 4;
        let ddp_header = if flags & TERM_FLAG_D != 0 {
            need(b.len(), at + 3)?;
            let segment_len = be16(b, at);
            at += 2;
            let len = if b[at] & 0x80 != 0 { 14 } else { 18 };
            need(b.len(), at + len)?;
            let mut hc = HeaderCopy::from_segment(&b[at..at + len]).ok_or(WireError::Terminate)?;
            hc.segment_len = segment_len;
            at += len;
            Some(hc)
        } else {
            None
        };
        let rdmap_header = if flags & TERM_FLAG_R != 0 {
            need(b.len(), at + READ_REQUEST_LEN)?;
            Some(ReadRequest::parse(&b[at..])?)
        } else {
            None
        };
        Ok(Terminate {
            layer,
            etype: b[0] & 0x0f,
            code: b[1],
            ddp_header,
            rdmap_header,
        })
    }

    pub fn buffer_len(&self) -> usize {
        4 + self.ddp_header.map_or(0, |h| 2 + h.len as usize)
            + self.rdmap_header.map_or(0, |_| READ_REQUEST_LEN)
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[0] = ((self.layer as u8) << 4) | (self.etype & 0x0f);
        b[1] = self.code;
        let mut flags = 0;
        if self.ddp_header.is_some() {
            flags |= TERM_FLAG_M | TERM_FLAG_D;
        }
        if self.rdmap_header.is_some() {
            flags |= TERM_FLAG_R;
        }
        b[2] = flags;
        b[3] = 0;
        let mut at = 4;
        if let Some(h) = &self.ddp_header {
            put16(b, at, h.segment_len);
            at += 2;
            b[at..at + h.len as usize].copy_from_slice(h.as_bytes());
            at += h.len as usize;
        }
        if let Some(r) = &self.rdmap_header {
            r.emit(&mut b[at..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::terminate::{Cause, TaggedCode};

    #[test]
    fn read_request_rfc_order() {
        let r = ReadRequest {
            sink_stag: 0x11111111,
            sink_to: 0x2222222222222222,
            size: 0x33333333,
            src_stag: 0x44444444,
            src_to: 0x5555555555555555,
        };
        let mut b = [0u8; 28];
        r.emit(&mut b);
        assert_eq!(&b[0..4], &[0x11; 4]);
        assert_eq!(&b[4..12], &[0x22; 8]);
        assert_eq!(&b[12..16], &[0x33; 4]);
        assert_eq!(&b[16..20], &[0x44; 4]);
        assert_eq!(&b[20..28], &[0x55; 8]);
        assert_eq!(ReadRequest::parse(&b).unwrap(), r);
        assert!(ReadRequest::parse(&b[..27]).is_err());
    }

    #[test]
    fn terminate_roundtrip() {
        let seg = [0xC1u8, 0x40, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0x10, 0, 1, 2, 3];
        let t = Terminate::quoting(Cause::DdpTagged(TaggedCode::BaseBounds), &seg);
        let mut b = [0u8; TERMINATE_MAX_LEN];
        t.emit(&mut b);
        assert_eq!(&b[..6], &[0x11, 0x01, 0xC0, 0, 0, 17]);
        assert_eq!(Terminate::parse(&b[..t.buffer_len()]).unwrap(), t);
    }

    #[test]
    #[inline]
    fn control_byte() {
        assert_eq!(Opcode::SendSeInvalidate.control_byte(), 0x46);
        assert_eq!(parse_control(0x48).unwrap(), Opcode::ImmediateData);
        assert_eq!(parse_control(0x0a).unwrap_err(), WireError::RdmapVersion(0));
        assert_eq!(
            parse_control(0x4c).unwrap_err(),
            WireError::RdmapOpcode(0xc)
        );
    }
}
