//! Body of TRP ConnectRequest / Accept / Reject packets: what iw_cm needs
//! (protocol version, IRD/ORD, private data) plus the connection ids and
//! initial PSN of the sender.
//!
//! ```text
//! 0..2 version  2..4 IRD  4..6 ORD  6..8 private data length
//! 8..12 sender connection id  12..16 initial PSN
//! 16..18 max segment payload  18..20 flags  20.. private data
//! ```
//!
//! Flags: [`FLAG_CRC32C`]; the others are sent as 0 and ignored.

use super::{be16, be32, need, put16, put32, WireError};

pub const PROTOCOL_VERSION: u16 = 1;
pub const FIXED_LEN: usize = 20;
pub const MAX_PRIVATE_DATA: usize = 512;
pub const MAX_LEN: usize = FIXED_LEN + MAX_PRIVATE_DATA;
/// In a ConnectRequest: the requester asks for the CRC32C trailer; in an
/// Accept: the connection uses it (asked by either end).
pub const FLAG_CRC32C: u16 = 0x0001;

/// The flags of a handshake body that asks for (or, in an Accept, uses) the
/// CRC32C trailer, or not.
pub fn flags(crc: bool) -> u16 {
    if crc {
        FLAG_CRC32C
    } else {
        0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr<'a> {
    pub version: u16,
    pub ird: u16,
    pub ord: u16,
    pub src_conn: u32,
    pub initial_psn: u32,
    pub max_payload: u16,
    pub flags: u16,
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    pub fn parse(b: &'a [u8]) -> Result<Self, WireError> {
        need(b.len(), FIXED_LEN)?;
        let len = be16(b, 6) as usize;
        if len > MAX_PRIVATE_DATA {
            return Err(WireError::PrivateDataLen(len));
        }
        need(b.len(), FIXED_LEN + len)?;
        Ok(Repr {
            version: be16(b, 0),
            ird: be16(b, 2),
            ord: be16(b, 4),
            src_conn: be32(b, 8),
            initial_psn: be32(b, 12),
            max_payload: be16(b, 16),
            flags: be16(b, 18),
            private_data: &b[FIXED_LEN..FIXED_LEN + len],
        })
    }

    pub fn buffer_len(&self) -> usize {
        FIXED_LEN + self.private_data.len()
    }

    /// Whether [`FLAG_CRC32C`] is set.
    pub fn crc(&self) -> bool {
        self.flags & FLAG_CRC32C != 0
    }

    /// Private data must already be at most `MAX_PRIVATE_DATA` bytes and
    /// fit the datagram (checked by the constructors in `setup`).
    pub fn emit(&self, b: &mut [u8]) {
        put16(b, 0, self.version);
        put16(b, 2, self.ird);
        put16(b, 4, self.ord);
        put16(b, 6, self.private_data.len() as u16);
        put32(b, 8, self.src_conn);
        put32(b, 12, self.initial_psn);
        put16(b, 16, self.max_payload);
        put16(b, 18, self.flags);
        b[FIXED_LEN..FIXED_LEN + self.private_data.len()].copy_from_slice(self.private_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let r = Repr {
            version: 1,
            ird: 16,
            ord: 8,
            src_conn: 77,
            initial_psn: 1000,
            max_payload: 1400,
            flags: FLAG_CRC32C,
            private_data: b"hello",
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b);
        assert_eq!(&b[..8], &[0, 1, 0, 16, 0, 8, 0, 5]);
        assert_eq!(Repr::parse(&b).unwrap(), r);
        assert!(Repr::parse(&b[..24]).is_err());
        let mut big = vec![0u8; 20];
        big[6] = 0x02;
        big[7] = 0x01;
        assert_eq!(
            Repr::parse(&big).unwrap_err(),
            WireError::PrivateDataLen(513)
        );
    }
}
