//! One DDP segment with its RDMAP meaning: the payload of a TRP Data packet.

use super::ddp::{self, BufferRef};
use super::rdmap::{
    self, AtomicRequest, AtomicResponse, Immediate, Opcode, ReadRequest, Terminate,
};
use super::WireError;

/// Header of one DDP/RDMAP segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub opcode: Opcode,
    pub last: bool,
    pub buffer: BufferRef,
}

/// The body of a segment, interpreted by opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    Data(&'a [u8]),
    ReadRequest(ReadRequest),
    Terminate(Terminate),
    Immediate(Immediate),
    AtomicRequest(AtomicRequest),
    AtomicResponse(AtomicResponse),
}

impl Repr {
    /// Parses and validates a segment: RFC 5041/5040 versions, opcode,
    /// buffer model and queue number, and the fixed bodies.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<(Repr, Body<'_>), WireError> {
        // Repr::parse checks the length itself.
        let d = ddp::Repr::parse(&ddp::Packet::new_unchecked(bytes))?;
        let opcode = rdmap::parse_control(d.ulp_control)?;
        let op = opcode as u8;
        match (opcode.queue_number(), d.buffer) {
            (None, BufferRef::Tagged { .. }) => {}
            (Some(q), BufferRef::Untagged { qn, .. }) => {
                if q != qn {
                    return Err(WireError::QueueNumber { opcode: op, qn });
                }
            }
            (_, b) => {
                return Err(WireError::BufferModel {
                    opcode: op,
                    tagged: matches!(b, BufferRef::Tagged { .. }),
                })
            }
        }
        let payload = bytes.get(d.buffer_len()..).unwrap_or_default();
        let fixed = |len: usize| -> Result<(), WireError> {
            if !d.last {
                Err(WireError::NotLast { opcode: op })
            } else if payload.len() != len {
                Err(WireError::BodyLen {
                    opcode: op,
                    len: payload.len(),
                })
            } else {
                Ok(())
            }
        };
        let body = match opcode {
            Opcode::ReadRequest => {
                fixed(rdmap::READ_REQUEST_LEN)?;
                Body::ReadRequest(ReadRequest::parse(payload)?)
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                fixed(rdmap::IMMEDIATE_LEN)?;
                Body::Immediate(Immediate::parse(payload)?)
            }
            Opcode::AtomicRequest => {
                fixed(rdmap::ATOMIC_REQUEST_LEN)?;
                Body::AtomicRequest(AtomicRequest::parse(payload)?)
            }
            Opcode::AtomicResponse => {
                fixed(rdmap::ATOMIC_RESPONSE_LEN)?;
                Body::AtomicResponse(AtomicResponse::parse(payload)?)
            }
            Opcode::Terminate => {
                if !d.last {
                    return Err(WireError::NotLast { opcode: op });
                }
                Body::Terminate(Terminate::parse(payload)?)
            }
            _ => Body::Data(payload),
        };
        Ok((
            Repr {
                opcode,
                last: d.last,
                buffer: d.buffer,
            },
            body,
        ))
    }

    #[inline]
    pub fn header_len(&self) -> usize {
        match self.buffer {
            BufferRef::Tagged { .. } => ddp::TAGGED_HEADER_LEN,
            BufferRef::Untagged { .. } => ddp::UNTAGGED_HEADER_LEN,
        }
    }

    /// Writes the DDP header carrying the RDMAP control byte.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) {
        ddp::Repr {
            last: self.last,
            ulp_control: self.opcode.control_byte(),
            buffer: self.buffer,
        }
        .emit(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_with_invalidate() {
        let r = Repr {
            opcode: Opcode::SendSeInvalidate,
            last: true,
            buffer: BufferRef::Untagged {
                ulp_word: 0xabcd,
                qn: 0,
                msn: 5,
                mo: 0,
            },
        };
        let mut b = [0u8; 22];
        r.emit(&mut b);
        b[18..].copy_from_slice(b"data");
        let (p, body) = Repr::parse(&b).unwrap();
        assert_eq!(p, r);
        assert_eq!(body, Body::Data(b"data"));
    }

    #[test]
    fn model_and_queue_checked() {
        let parse_untagged = |opcode, qn| {
            let mut b = [0u8; 18];
            Repr {
                opcode,
                last: true,
                buffer: BufferRef::Untagged {
                    ulp_word: 0,
                    qn,
                    msn: 1,
                    mo: 0,
                },
            }
            .emit(&mut b);
            Repr::parse(&b).map(|_| ())
        };
        assert!(matches!(
            parse_untagged(Opcode::RdmaWrite, 0),
            Err(WireError::BufferModel { .. })
        ));
        assert!(matches!(
            parse_untagged(Opcode::Send, 1),
            Err(WireError::QueueNumber { .. })
        ));
        assert!(matches!(
            parse_untagged(Opcode::ReadRequest, 1),
            Err(WireError::BodyLen { .. })
        ));
    }
}
