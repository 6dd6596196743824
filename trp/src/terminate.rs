//! Errors that go on the wire: what a Terminate reports (RFC 5040 section
//! 7, RFC 5041 section 7) and the one mapping from each local error to it.
//!
//! Error types and codes are numbered per layer, so the same number means
//! different things (DDP tagged and RDMAP remote protection are both type
//! 1; code 2 is "access rights" for one and "STag not associated" for the
//! other). [`Cause`] pairs a type with a code of that type only, so the
//! wrong pair cannot be sent. Received Terminates keep the raw numbers:
//! a peer may send any.

use crate::mr::ProtectionError;
use crate::wire::rdmap::{HeaderCopy, Terminate};
use crate::wire::WireError;

pub use crate::wire::rdmap::Layer;

/// Error type (RFC 5040 section 4.8), named with its layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    RdmapLocalCatastrophic,
    RdmapRemoteProtection,
    RdmapRemoteOperation,
    DdpLocalCatastrophic,
    DdpTagged,
    DdpUntagged,
}

impl ErrorType {
    pub fn layer(self) -> Layer {
        match self {
            ErrorType::RdmapLocalCatastrophic
            | ErrorType::RdmapRemoteProtection
            | ErrorType::RdmapRemoteOperation => Layer::Rdmap,
            ErrorType::DdpLocalCatastrophic | ErrorType::DdpTagged | ErrorType::DdpUntagged => {
                Layer::Ddp
            }
        }
    }

    /// The type's number within its layer.
    pub fn number(self) -> u8 {
        match self {
            ErrorType::RdmapLocalCatastrophic | ErrorType::DdpLocalCatastrophic => 0,
            ErrorType::RdmapRemoteProtection | ErrorType::DdpTagged => 1,
            ErrorType::RdmapRemoteOperation | ErrorType::DdpUntagged => 2,
        }
    }

    /// The type a received Terminate names, if it is one we know.
    pub fn from_wire(layer: Layer, number: u8) -> Option<ErrorType> {
        Some(match (layer, number) {
            (Layer::Rdmap, 0) => ErrorType::RdmapLocalCatastrophic,
            (Layer::Rdmap, 1) => ErrorType::RdmapRemoteProtection,
            (Layer::Rdmap, 2) => ErrorType::RdmapRemoteOperation,
            (Layer::Ddp, 0) => ErrorType::DdpLocalCatastrophic,
            (Layer::Ddp, 1) => ErrorType::DdpTagged,
            (Layer::Ddp, 2) => ErrorType::DdpUntagged,
            _ => return None,
        })
    }

    /// Whether the peer refused an access (IBV_WC_REM_ACCESS_ERR) rather
    /// than an operation.
    pub fn is_protection(self) -> bool {
        matches!(
            self,
            ErrorType::RdmapRemoteProtection | ErrorType::DdpTagged
        )
    }
}

/// RDMAP remote protection error codes (RFC 5040 section 7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ProtectionCode {
    InvalidStag = 0x00,
    BaseBounds = 0x01,
    AccessRights = 0x02,
    StagNotAssociated = 0x03,
    ToWrap = 0x04,
    StagCannotInvalidate = 0x09,
    Unspecified = 0xff,
}

/// RDMAP remote operation error codes (RFC 5040 section 7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OperationCode {
    InvalidRdmapVersion = 0x05,
    UnexpectedOpcode = 0x06,
    CatastrophicStream = 0x07,
    CatastrophicGlobal = 0x08,
    StagCannotInvalidate = 0x09,
    Unspecified = 0xff,
}

/// DDP tagged buffer error codes (RFC 5041 section 7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TaggedCode {
    InvalidStag = 0x00,
    BaseBounds = 0x01,
    StagNotAssociated = 0x02,
    ToWrap = 0x03,
    InvalidDdpVersion = 0x04,
}

/// DDP untagged buffer error codes (RFC 5041 section 7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum UntaggedCode {
    InvalidQn = 0x01,
    NoBuffer = 0x02,
    MsnRange = 0x03,
    InvalidMo = 0x04,
    TooLong = 0x05,
    InvalidDdpVersion = 0x06,
}

/// One error a Terminate reports: a remote error type with a code of that
/// type (the local catastrophic types have no use here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    RemoteProtection(ProtectionCode),
    RemoteOperation(OperationCode),
    DdpTagged(TaggedCode),
    DdpUntagged(UntaggedCode),
}

impl Cause {
    pub fn error_type(self) -> ErrorType {
        match self {
            Cause::RemoteProtection(_) => ErrorType::RdmapRemoteProtection,
            Cause::RemoteOperation(_) => ErrorType::RdmapRemoteOperation,
            Cause::DdpTagged(_) => ErrorType::DdpTagged,
            Cause::DdpUntagged(_) => ErrorType::DdpUntagged,
        }
    }

    pub fn code(self) -> u8 {
        match self {
            Cause::RemoteProtection(c) => c as u8,
            Cause::RemoteOperation(c) => c as u8,
            Cause::DdpTagged(c) => c as u8,
            Cause::DdpUntagged(c) => c as u8,
        }
    }

    /// Layer, error type and code as a Terminate carries them.
    pub fn wire(self) -> (Layer, u8, u8) {
        let t = self.error_type();
        (t.layer(), t.number(), self.code())
    }
}

/// A failed check of a Read Request's source: RDMAP remote protection.
impl From<ProtectionError> for ProtectionCode {
    fn from(e: ProtectionError) -> Self {
        match e {
            ProtectionError::UnknownStag | ProtectionError::Invalidated => {
                ProtectionCode::InvalidStag
            }
            ProtectionError::WrongPd => ProtectionCode::StagNotAssociated,
            ProtectionError::Wrap => ProtectionCode::ToWrap,
            ProtectionError::Bounds => ProtectionCode::BaseBounds,
            ProtectionError::Access => ProtectionCode::AccessRights,
        }
    }
}

/// A failed tagged placement (RDMA Write, Read Response): DDP tagged
/// buffer errors, except missing rights, which RFC 5040 reports at the
/// RDMAP layer.
impl From<ProtectionError> for Cause {
    fn from(e: ProtectionError) -> Self {
        Cause::DdpTagged(match e {
            ProtectionError::UnknownStag | ProtectionError::Invalidated => TaggedCode::InvalidStag,
            ProtectionError::WrongPd => TaggedCode::StagNotAssociated,
            ProtectionError::Wrap => TaggedCode::ToWrap,
            ProtectionError::Bounds => TaggedCode::BaseBounds,
            ProtectionError::Access => {
                return Cause::RemoteProtection(ProtectionCode::AccessRights)
            }
        })
    }
}

/// A received segment that did not parse, and the error it gave.
#[derive(Clone, Copy, Debug)]
pub struct Malformed<'a> {
    pub error: WireError,
    /// The DDP segment, from its header on.
    pub segment: &'a [u8],
}

/// The Terminate RFC 5040/5041 prescribe for a malformed segment, quoting
/// its header. A version error's DDP type follows the segment's T bit.
impl From<Malformed<'_>> for Terminate {
    #[cold]
    #[inline(never)]
    fn from(m: Malformed<'_>) -> Self {
        let tagged = m.segment.first().is_some_and(|b| b & 0x80 != 0);
        let cause = match m.error {
            WireError::DdpVersion(_) if tagged => Cause::DdpTagged(TaggedCode::InvalidDdpVersion),
            WireError::DdpVersion(_) => Cause::DdpUntagged(UntaggedCode::InvalidDdpVersion),
            WireError::RdmapVersion(_) => {
                Cause::RemoteOperation(OperationCode::InvalidRdmapVersion)
            }
            WireError::QueueNumber { .. } => Cause::DdpUntagged(UntaggedCode::InvalidQn),
            WireError::RdmapOpcode(_)
            | WireError::BufferModel { .. }
            | WireError::NotLast { .. }
            | WireError::BodyLen { .. } => Cause::RemoteOperation(OperationCode::UnexpectedOpcode),
            _ => Cause::RemoteOperation(OperationCode::Unspecified),
        };
        Terminate::quoting(cause, m.segment)
    }
}

/// A Terminate quoting no header: the error is not one segment's.
impl From<Cause> for Terminate {
    fn from(cause: Cause) -> Self {
        let (layer, etype, code) = cause.wire();
        Terminate {
            layer,
            etype,
            code,
            ddp_header: None,
            rdmap_header: None,
        }
    }
}

impl Terminate {
    /// A Terminate for `cause` quoting the DDP header of `segment`, the
    /// segment at fault. Cold: only errors build one.
    #[cold]
    #[inline(never)]
    pub fn quoting(cause: Cause, segment: &[u8]) -> Terminate {
        Terminate {
            ddp_header: HeaderCopy::from_segment(segment),
            ..Terminate::from(cause)
        }
    }

    /// The error type named, if it is one we know.
    pub fn error_type(&self) -> Option<ErrorType> {
        ErrorType::from_wire(self.layer, self.etype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_numbers_different_layers() {
        assert_eq!(
            Cause::DdpTagged(TaggedCode::StagNotAssociated).wire(),
            (Layer::Ddp, 1, 2)
        );
        assert_eq!(
            Cause::RemoteProtection(ProtectionCode::AccessRights).wire(),
            (Layer::Rdmap, 1, 2)
        );
        assert_eq!(
            Cause::DdpUntagged(UntaggedCode::TooLong).wire(),
            (Layer::Ddp, 2, 5)
        );
        for t in [
            ErrorType::RdmapLocalCatastrophic,
            ErrorType::RdmapRemoteProtection,
            ErrorType::RdmapRemoteOperation,
            ErrorType::DdpLocalCatastrophic,
            ErrorType::DdpTagged,
            ErrorType::DdpUntagged,
        ] {
            assert_eq!(ErrorType::from_wire(t.layer(), t.number()), Some(t));
        }
        assert_eq!(ErrorType::from_wire(Layer::Llp, 0), None);
    }
}
