//! What goes on the wire. Every format has a zero-copy `Packet` view, whose
//! accessors cannot panic once `new_checked` has accepted the buffer, and a
//! `Repr` that can be parsed from a view and emitted into one.
//!
//! The byte layouts are specified in `docs/protocol.md`; the constants here
//! are the single source of those offsets.

pub mod ddp;
mod error;
pub mod handshake;
pub mod rdmap;
pub mod segment;
pub mod trp;

pub use error::WireError;

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn need(have: usize, need: usize) -> Result<(), WireError> {
    if have < need {
        Err(WireError::Truncated { need, have })
    } else {
        Ok(())
    }
}
