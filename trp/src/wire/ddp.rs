//! DDP segment headers exactly as RFC 5041 section 4.
//!
//! ```text
//! byte 0: T | L | reserved(4) | DV(2)     byte 1: RsvdULP (RDMAP control)
//! tagged   (14 bytes): control(2) STag(4) TO(8)
//! untagged (18 bytes): control(2) RsvdULP(4) QN(4) MSN(4) MO(4)
//! ```

use super::{be32, be64, need, WireError};

pub const VERSION: u8 = 1;
pub const TAGGED_HEADER_LEN: usize = 14;
pub const UNTAGGED_HEADER_LEN: usize = 18;

pub(crate) const FLAG_TAGGED: u8 = 0x80;
pub(crate) const FLAG_LAST: u8 = 0x40;
pub(crate) const MASK_DV: u8 = 0x03;

pub(crate) mod field {
    pub const CONTROL: usize = 0;
    pub const ULP_CONTROL: usize = 1;
    pub const STAG: usize = 2;
    pub const TO: usize = 6;
    pub const ULP_WORD: usize = 2;
    pub const QN: usize = 6;
    pub const MSN: usize = 10;
    pub const MO: usize = 14;
}

/// A view of a DDP segment.
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

    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        need(b.len(), 2)?;
        need(b.len(), self.header_len())
    }

    pub fn tagged(&self) -> bool {
        self.buffer.as_ref()[field::CONTROL] & FLAG_TAGGED != 0
    }
    pub fn last(&self) -> bool {
        self.buffer.as_ref()[field::CONTROL] & FLAG_LAST != 0
    }
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::CONTROL] & MASK_DV
    }
    /// The 8 bits DDP reserves for its upper layer: RDMAP's control field.
    pub fn ulp_control(&self) -> u8 {
        self.buffer.as_ref()[field::ULP_CONTROL]
    }
    pub fn header_len(&self) -> usize {
        if self.tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }
    pub fn stag(&self) -> u32 {
        be32(self.buffer.as_ref(), field::STAG)
    }
    pub fn tagged_offset(&self) -> u64 {
        be64(self.buffer.as_ref(), field::TO)
    }
    /// The untagged header's 32-bit RsvdULP word (RDMAP: Invalidate STag).
    pub fn ulp_word(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ULP_WORD)
    }
    pub fn queue_number(&self) -> u32 {
        be32(self.buffer.as_ref(), field::QN)
    }
    pub fn msn(&self) -> u32 {
        be32(self.buffer.as_ref(), field::MSN)
    }
    pub fn message_offset(&self) -> u32 {
        be32(self.buffer.as_ref(), field::MO)
    }
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

#[inline]
fn header<const N: usize>(b: &[u8]) -> Result<&[u8; N], WireError> {
    b.get(..N)
        .and_then(|h| h.try_into().ok())
        .ok_or(WireError::Truncated {
            need: N,
            have: b.len(),
        })
}

#[inline]
fn check_version(control: u8) -> Result<(), WireError> {
    match control & MASK_DV {
        VERSION => Ok(()),
        v => Err(WireError::DdpVersion(v)),
    }
}

/// Where the segment's payload goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferRef {
    Tagged {
        stag: u32,
        to: u64,
    },
    Untagged {
        ulp_word: u32,
        qn: u32,
        msn: u32,
        mo: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub last: bool,
    pub ulp_control: u8,
    pub buffer: BufferRef,
}

impl Repr {
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        let b = p.buffer.as_ref();
        need(b.len(), 2)?;
        let control = b[field::CONTROL];
        // The header is read as a fixed-size array: after its one length
        // check no field read is bounds-checked.
        let buffer = if control & FLAG_TAGGED != 0 {
            let h: &[u8; TAGGED_HEADER_LEN] = header(b)?;
            check_version(control)?;
            BufferRef::Tagged {
                stag: be32(h, field::STAG),
                to: be64(h, field::TO),
            }
        } else {
            let h: &[u8; UNTAGGED_HEADER_LEN] = header(b)?;
            check_version(control)?;
            BufferRef::Untagged {
                ulp_word: be32(h, field::ULP_WORD),
                qn: be32(h, field::QN),
                msn: be32(h, field::MSN),
                mo: be32(h, field::MO),
            }
        };
        Ok(Repr {
            last: control & FLAG_LAST != 0,
            ulp_control: b[field::ULP_CONTROL],
            buffer,
        })
    }

    #[inline]
    pub fn buffer_len(&self) -> usize {
        match self.buffer {
            BufferRef::Tagged { .. } => TAGGED_HEADER_LEN,
            BufferRef::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }

    /// Writes the header into the front of `buf` (at least `buffer_len()`).
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) {
        let mut control = VERSION;
        if self.last {
            control |= FLAG_LAST;
        }
        // Each header is built in a fixed-size array and stored at once.
        match self.buffer {
            BufferRef::Tagged { stag, to } => {
                let mut h = [0u8; TAGGED_HEADER_LEN];
                h[field::CONTROL] = control | FLAG_TAGGED;
                h[field::ULP_CONTROL] = self.ulp_control;
                h[field::STAG..field::TO].copy_from_slice(&stag.to_be_bytes());
                h[field::TO..].copy_from_slice(&to.to_be_bytes());
                buf[..TAGGED_HEADER_LEN].copy_from_slice(&h);
            }
            BufferRef::Untagged {
                ulp_word,
                qn,
                msn,
                mo,
            } => {
                let mut h = [0u8; UNTAGGED_HEADER_LEN];
                h[field::CONTROL] = control;
                h[field::ULP_CONTROL] = self.ulp_control;
                h[field::ULP_WORD..field::QN].copy_from_slice(&ulp_word.to_be_bytes());
                h[field::QN..field::MSN].copy_from_slice(&qn.to_be_bytes());
                h[field::MSN..field::MO].copy_from_slice(&msn.to_be_bytes());
                h[field::MO..].copy_from_slice(&mo.to_be_bytes());
                buf[..UNTAGGED_HEADER_LEN].copy_from_slice(&h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_bytes() {
        let r = Repr {
            last: true,
            ulp_control: 0x40,
            buffer: BufferRef::Tagged {
                stag: 0x0102_0304,
                to: 0x1122_3344_5566_7788,
            },
        };
        let mut b = [0u8; 14];
        r.emit(&mut b);
        assert_eq!(
            b,
            [0xC1, 0x40, 1, 2, 3, 4, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
    }

    #[test]
    fn untagged_bytes() {
        let r = Repr {
            last: false,
            ulp_control: 0x43,
            buffer: BufferRef::Untagged {
                ulp_word: 0,
                qn: 0,
                msn: 1,
                mo: 1024,
            },
        };
        let mut b = [0u8; 18];
        r.emit(&mut b);
        assert_eq!(b[0], 0x01);
        assert_eq!(&b[6..18], &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 4, 0]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        assert!(Packet::new_checked(&b[..17]).is_err());
        let mut bad = b;
        bad[0] = 0x02;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bad[..]).unwrap()).unwrap_err(),
            WireError::DdpVersion(2)
        );
    }
}
