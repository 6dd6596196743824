//! What goes on the wire. Every format has a zero-copy `Packet` view, whose
//! accessors cannot panic once `new_checked` has accepted the buffer, and a
//! `Repr` that can be parsed from a view and emitted into one.
//!
//! The byte layouts are specified in `docs/protocol.md`; the constants here
//! are the single source of those offsets.

pub mod crc;
pub mod ddp;
mod error;
pub mod handshake;
pub mod predict;
pub mod rdmap;
pub mod segment;
pub mod trp;

pub use error::WireError;

#[inline]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

#[inline]
pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn need(have: usize, need: usize) -> Result<(), WireError> {
    if have < need {
        Err(WireError::Truncated { need, have })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod doc_example {
    use super::*;

    /// The example in docs/protocol.md ("a 4-byte Send"), byte for byte.
    #[test]
    fn four_byte_send() {
        let t = trp::Repr {
            opcode: trp::Opcode::Data,
            flags: 0,
            dst_conn: 11,
            psn: 0x1000,
            ack_psn: 0x7fff_0000,
            window: 1024,
            sack: trp::SackRanges::new(),
        };
        let s = segment::Repr {
            opcode: rdmap::Opcode::Send,
            last: true,
            buffer: ddp::BufferRef::Untagged {
                ulp_word: 0,
                qn: 0,
                msn: 5,
                mo: 0,
            },
        };
        let mut b = [0u8; 42];
        t.emit(&mut b);
        s.emit(&mut b[20..]);
        b[38..].copy_from_slice(b"data");
        let want: [u8; 42] = [
            0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x00, 0x10, 0x00, 0x7f, 0xff,
            0x00, 0x00, 0x04, 0x00, 0x00, 0x00, //
            0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
            0x00, 0x00, 0x00, 0x00, //
            0x64, 0x61, 0x74, 0x61,
        ];
        assert_eq!(b, want);
    }
}
