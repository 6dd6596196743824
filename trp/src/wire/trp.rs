//! The TRP header: the reliability shim that replaces TCP and MPA under DDP.
//!
//! ```text
//!  0       1       2       3
//! +-------+-------+-------+-------+
//! |version|opcode | flags |nsack  |
//! +-------+-------+-------+-------+
//! |   destination connection id   |
//! +-------------------------------+
//! |              PSN              |
//! +-------------------------------+
//! |     cumulative ACK PSN        |
//! +---------------+---------------+
//! | recv window   |   reserved    |
//! +---------------+---------------+
//! | nsack x (start PSN, end PSN)  |
//! +-------------------------------+
//! ```

use super::{be16, be32, need, put32, WireError};

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 20;
pub const SACK_RANGE_LEN: usize = 8;
pub const MAX_SACK_RANGES: usize = 4;
/// Largest header: what a sender must reserve in every datagram.
pub const MAX_HEADER_LEN: usize = HEADER_LEN + MAX_SACK_RANGES * SACK_RANGE_LEN;

/// Ask the receiver to acknowledge this packet at once instead of delaying.
pub const FLAG_ACK_REQUEST: u8 = 0x01;
/// The datagram ends with a CRC32C trailer (`wire::crc`).
pub const FLAG_CRC: u8 = 0x02;
/// The sender's next new packet (PSN + 1) leaves right after this one: the next segment of
/// the same message, or the Immediate Data that ends an RDMA Write. Only a hint for whom to
/// wake (urdma.ko's bell): a receiver processes the packet the same either way.
pub const FLAG_FOLLOWS: u8 = 0x04;
/// On an Abort: its cumulative ACK and SACK ranges are its sender's, and what they acknowledge
/// was received. The connection's own end sets it, and so does urdmad's Abort for a process
/// that is gone, with the cumulative ACK the process last published; where the process
/// published none, urdmad leaves it clear (its ACK fields are 0).
pub const FLAG_ACKS: u8 = 0x08;

pub(crate) mod field {
    pub const VERSION: usize = 0;
    pub const OPCODE: usize = 1;
    pub const FLAGS: usize = 2;
    pub const NSACK: usize = 3;
    pub const DST_CONN: usize = 4;
    pub const PSN: usize = 8;
    pub const ACK: usize = 12;
    pub const WINDOW: usize = 16;
    pub const RESERVED: usize = 18;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Carries one DDP segment; consumes a PSN.
    Data = 0,
    /// Acknowledgement only; does not consume a PSN.
    Ack = 1,
    /// Acknowledgement with SACK ranges; does not consume a PSN.
    Sack = 2,
    /// Opens a connection; carries a handshake body; consumes a PSN.
    ConnectRequest = 3,
    /// Accepts a connection; carries a handshake body; consumes a PSN.
    Accept = 4,
    /// Refuses a connection; carries a handshake body.
    Reject = 5,
    /// Graceful close; consumes a PSN.
    Fin = 6,
    /// Abortive close; unacknowledged.
    Abort = 7,
}

impl Opcode {
    #[inline]
    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0 => Opcode::Data,
            1 => Opcode::Ack,
            2 => Opcode::Sack,
            3 => Opcode::ConnectRequest,
            4 => Opcode::Accept,
            5 => Opcode::Reject,
            6 => Opcode::Fin,
            7 => Opcode::Abort,
            o => return Err(WireError::TrpOpcode(o)),
        })
    }

    /// Whether the packet occupies a place in the sender's PSN space and
    /// therefore is retransmitted until acknowledged.
    #[inline]
    pub fn consumes_psn(self) -> bool {
        matches!(
            self,
            Opcode::Data | Opcode::ConnectRequest | Opcode::Accept | Opcode::Fin
        )
    }
}

/// A view of a TRP packet.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Packet { buffer };
        p.check_len()?;
        Ok(p)
    }

    /// After this succeeds no accessor can index out of bounds.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        need(b.len(), HEADER_LEN)?;
        let n = b[field::NSACK];
        if n as usize > MAX_SACK_RANGES {
            return Err(WireError::SackCount(n));
        }
        need(b.len(), HEADER_LEN + n as usize * SACK_RANGE_LEN)
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    pub fn opcode(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE]
    }
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    pub fn sack_count(&self) -> usize {
        self.buffer.as_ref()[field::NSACK] as usize
    }
    pub fn dst_conn(&self) -> u32 {
        be32(self.buffer.as_ref(), field::DST_CONN)
    }
    pub fn psn(&self) -> u32 {
        be32(self.buffer.as_ref(), field::PSN)
    }
    pub fn ack_psn(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ACK)
    }
    pub fn window(&self) -> u16 {
        be16(self.buffer.as_ref(), field::WINDOW)
    }
    /// SACK range `i` as (first PSN, one past the last PSN). `i` must be
    /// below `sack_count()`; larger values return the empty range.
    pub fn sack_range(&self, i: usize) -> (u32, u32) {
        if i >= self.sack_count() {
            return (0, 0);
        }
        let at = HEADER_LEN + i * SACK_RANGE_LEN;
        let b = self.buffer.as_ref();
        (be32(b, at), be32(b, at + 4))
    }
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.sack_count() * SACK_RANGE_LEN
    }
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let at = self.header_len();
        &mut self.buffer.as_mut()[at..]
    }
}

/// A fixed-capacity list of SACK ranges: no allocation per packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SackRanges {
    len: u8,
    ranges: [(u32, u32); MAX_SACK_RANGES],
}

impl SackRanges {
    #[inline]
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a range; returns false when full.
    #[inline]
    pub fn push(&mut self, start: u32, end: u32) -> bool {
        if self.len as usize == MAX_SACK_RANGES {
            return false;
        }
        self.ranges[self.len as usize] = (start, end);
        self.len += 1;
        true
    }
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    #[inline]
    pub fn as_slice(&self) -> &[(u32, u32)] {
        &self.ranges[..self.len as usize]
    }
}

/// The parsed TRP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub opcode: Opcode,
    pub flags: u8,
    pub dst_conn: u32,
    pub psn: u32,
    pub ack_psn: u32,
    pub window: u16,
    pub sack: SackRanges,
}

impl Repr {
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        p.check_len()?;
        let b = p.buffer.as_ref();
        // check_len guarantees the fixed header: read it as an array, so
        // the field reads below need no bounds checks.
        let h: &[u8; HEADER_LEN] =
            b[..HEADER_LEN]
                .try_into()
                .map_err(|_| WireError::Truncated {
                    need: HEADER_LEN,
                    have: b.len(),
                })?;
        if h[field::VERSION] != VERSION {
            return Err(WireError::TrpVersion(h[field::VERSION]));
        }
        let opcode = Opcode::from_u8(h[field::OPCODE])?;
        let mut sack = SackRanges::new();
        for i in 0..p.sack_count() {
            let (start, end) = p.sack_range(i);
            let span = end.wrapping_sub(start);
            if span == 0 || span > 0x8000_0000 {
                return Err(WireError::SackRange { start, end });
            }
            sack.push(start, end);
        }
        let word = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        Ok(Repr {
            opcode,
            flags: h[field::FLAGS],
            dst_conn: word(field::DST_CONN),
            psn: word(field::PSN),
            ack_psn: word(field::ACK),
            window: u16::from_be_bytes([h[field::WINDOW], h[field::WINDOW + 1]]),
            sack,
        })
    }

    #[inline]
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.sack.len() * SACK_RANGE_LEN
    }

    /// Writes the header into the front of `buf`, which must hold at least
    /// `buffer_len()` bytes (callers size it from `MAX_HEADER_LEN`).
    #[inline(always)]
    pub fn emit(&self, buf: &mut [u8]) {
        // Built in a fixed-size array and stored at once: one bounds
        // check instead of one per field.
        let mut h = [0u8; HEADER_LEN];
        h[field::VERSION] = VERSION;
        h[field::OPCODE] = self.opcode as u8;
        h[field::FLAGS] = self.flags;
        h[field::NSACK] = self.sack.len() as u8;
        h[field::DST_CONN..field::PSN].copy_from_slice(&self.dst_conn.to_be_bytes());
        h[field::PSN..field::ACK].copy_from_slice(&self.psn.to_be_bytes());
        h[field::ACK..field::WINDOW].copy_from_slice(&self.ack_psn.to_be_bytes());
        h[field::WINDOW..field::RESERVED].copy_from_slice(&self.window.to_be_bytes());
        buf[..HEADER_LEN].copy_from_slice(&h);
        for (i, &(s, e)) in self.sack.as_slice().iter().enumerate() {
            let at = HEADER_LEN + i * SACK_RANGE_LEN;
            put32(buf, at, s);
            put32(buf, at + 4, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_with_sack() {
        let mut sack = SackRanges::new();
        sack.push(10, 12);
        sack.push(20, 25);
        let r = Repr {
            opcode: Opcode::Sack,
            flags: FLAG_ACK_REQUEST,
            dst_conn: 0xdead_beef,
            psn: 7,
            ack_psn: 9,
            window: 512,
            sack,
        };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf);
        assert_eq!(
            &buf[..20],
            &[1, 2, 1, 2, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 7, 0, 0, 0, 9, 2, 0, 0, 0]
        );
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), r);
        assert!(p.payload().is_empty());
    }

    #[test]
    fn rejects_short_and_bad() {
        assert!(matches!(
            Packet::new_checked(&[0u8; 19][..]),
            Err(WireError::Truncated { .. })
        ));
        let mut b = [0u8; 20];
        b[0] = 1;
        b[3] = 5;
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            WireError::SackCount(5)
        );
        b[3] = 1;
        assert!(Packet::new_checked(&b[..]).is_err());
        b[3] = 0;
        b[1] = 9;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap_err(), WireError::TrpOpcode(9));
    }
}
