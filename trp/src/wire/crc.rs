//! The CRC32C trailer (docs/protocol.md, "Integrity"): what iWARP's MPA CRC
//! does over TCP, for datagrams. The UDP checksum's 16 bits let about one
//! corrupted datagram in 65,536 through; the trailer makes that one in 2^32.
//!
//! A datagram whose TRP header has [`FLAG_CRC`] set ends with four bytes
//! (big-endian) holding the CRC32C (Castagnoli) of everything before them,
//! the TRP header with that flag included. The flag makes every datagram
//! say for itself whether it is sealed, so a receiver never has to know the
//! sender's choice to read one; whether a connection *requires* sealed
//! datagrams is agreed in its handshake and enforced by the connection.

use super::trp::{field, HEADER_LEN};
use super::{be32, put32, WireError};

pub use super::trp::FLAG_CRC;

/// Bytes the trailer takes at the end of a sealed datagram.
pub const TRAILER_LEN: usize = 4;

/// What the trailer adds to a datagram that is `sealed`, or not.
#[inline]
pub fn trailer_len(sealed: bool) -> usize {
    if sealed {
        TRAILER_LEN
    } else {
        0
    }
}

/// CRC32C of `b` (hardware-accelerated where the CPU has it).
#[inline]
pub fn crc32c(b: &[u8]) -> u32 {
    // CRC-32/ISCSI is CRC32C: a 32-bit value in the u64.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}

/// The datagram without its trailer, and whether it had one (checked). A
/// datagram too short for a TRP header is passed on as it is: the parser
/// after this says what is wrong with it.
#[inline]
pub fn open(b: &[u8]) -> Result<(&[u8], bool), WireError> {
    if b.len() < HEADER_LEN || b[field::FLAGS] & FLAG_CRC == 0 {
        return Ok((b, false));
    }
    let Some(end) = b
        .len()
        .checked_sub(TRAILER_LEN)
        .filter(|&e| e >= HEADER_LEN)
    else {
        return Err(WireError::Truncated {
            need: HEADER_LEN + TRAILER_LEN,
            have: b.len(),
        });
    };
    let (body, trailer) = b.split_at(end);
    if crc32c(body) != be32(trailer, 0) {
        return Err(WireError::Crc);
    }
    Ok((body, true))
}

/// Seals the datagram `b[..len]` (a TRP packet): sets [`FLAG_CRC`] in its
/// header and writes the trailer after it. Returns the sealed length.
/// `b` must hold `len + TRAILER_LEN` bytes and `len` a TRP header.
#[inline]
pub fn seal(b: &mut [u8], len: usize) -> usize {
    debug_assert!(len >= HEADER_LEN && b.len() >= len + TRAILER_LEN);
    b[field::FLAGS] |= FLAG_CRC;
    let c = crc32c(&b[..len]);
    put32(b, len, c);
    len + TRAILER_LEN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet() -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[0] = 1; // version
        for (i, x) in b.iter_mut().enumerate().skip(HEADER_LEN) {
            *x = i as u8;
        }
        b
    }

    #[test]
    fn known_value() {
        // The check value of CRC-32C (RFC 3720 appendix B.4 uses the same
        // polynomial): "123456789" gives 0xE3069283.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    /// `packet()`, sealed.
    fn sealed() -> Vec<u8> {
        let mut b = packet();
        let len = b.len();
        b.extend_from_slice(&[0; TRAILER_LEN]);
        assert_eq!(seal(&mut b, len), len + TRAILER_LEN);
        b
    }

    #[test]
    fn sealed_datagram_opens_to_itself() {
        let p = packet();
        let b = sealed();
        let n = b.len();
        let (body, sealed) = open(&b[..n]).unwrap();
        assert!(sealed);
        assert_eq!(body.len(), p.len());
        assert_eq!(body[field::FLAGS], FLAG_CRC);
        assert_eq!(&body[HEADER_LEN..], &p[HEADER_LEN..]);
    }

    #[test]
    fn any_flipped_bit_is_caught() {
        let b = sealed();
        let n = b.len();
        for bit in 0..n * 8 {
            let mut c = b[..n].to_vec();
            c[bit / 8] ^= 1 << (bit % 8);
            // Flipping the flag itself turns the datagram into an unsealed
            // one with four stray bytes; a connection that requires the
            // trailer drops it as unsealed.
            if bit / 8 == field::FLAGS && 1 << (bit % 8) == FLAG_CRC {
                assert!(!open(&c).unwrap().1);
                continue;
            }
            assert!(open(&c).is_err(), "bit {bit} passed");
        }
    }

    #[test]
    fn unsealed_and_short_datagrams() {
        let p = packet();
        assert_eq!(open(&p).unwrap(), (&p[..], false));
        assert_eq!(open(&p[..3]).unwrap(), (&p[..3], false));
        let mut short = p[..HEADER_LEN + 2].to_vec();
        short[field::FLAGS] |= FLAG_CRC;
        assert!(matches!(open(&short), Err(WireError::Truncated { .. })));
    }
}
