use core::fmt;

/// Why a buffer is not a valid packet. Each variant names the field at fault
/// so a receiver can pick the matching Terminate code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The buffer ends before the field that needs `need` bytes.
    Truncated { need: usize, have: usize },
    /// TRP version byte is not the one this implementation speaks.
    TrpVersion(u8),
    /// TRP opcode is not defined.
    TrpOpcode(u8),
    /// More SACK ranges than the header may carry.
    SackCount(u8),
    /// A SACK range is empty or spans half the PSN space or more.
    SackRange { start: u32, end: u32 },
    /// Handshake private data is longer than 512 bytes.
    PrivateDataLen(usize),
    /// DDP version (DV) is not 1 (RFC 5041 section 4.1).
    DdpVersion(u8),
    /// RDMAP version (RV) is not 1 (RFC 5040 section 4.2).
    RdmapVersion(u8),
    /// RDMAP opcode is reserved or not supported (atomics).
    RdmapOpcode(u8),
    /// The opcode needs the other DDP buffer model (tagged vs untagged).
    BufferModel { opcode: u8, tagged: bool },
    /// The untagged queue number does not belong to the opcode.
    QueueNumber { opcode: u8, qn: u32 },
    /// A message that must fit one segment does not have the Last flag.
    NotLast { opcode: u8 },
    /// The fixed-size body (Read Request, Immediate Data) has the wrong size.
    BodyLen { opcode: u8, len: usize },
    /// Terminate layer/etype combination or header flags make no sense.
    Terminate,
    /// The CRC32C trailer does not match the datagram (corrupted on the way).
    Crc,
    /// The connection requires sealed datagrams (CRC32C) and this one is not.
    Unsealed,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { need, have } => {
                write!(f, "packet truncated: need {need} bytes, have {have}")
            }
            WireError::TrpVersion(v) => write!(f, "unsupported TRP version {v}"),
            WireError::TrpOpcode(o) => write!(f, "unknown TRP opcode {o:#x}"),
            WireError::SackCount(n) => write!(f, "too many SACK ranges ({n})"),
            WireError::SackRange { start, end } => {
                write!(f, "invalid SACK range {start:#x}..{end:#x}")
            }
            WireError::PrivateDataLen(n) => {
                write!(f, "private data of {n} bytes exceeds 512")
            }
            WireError::DdpVersion(v) => write!(f, "unsupported DDP version {v}"),
            WireError::RdmapVersion(v) => write!(f, "unsupported RDMAP version {v}"),
            WireError::RdmapOpcode(o) => write!(f, "unsupported RDMAP opcode {o:#x}"),
            WireError::BufferModel { opcode, tagged } => write!(
                f,
                "RDMAP opcode {opcode:#x} sent {} buffer model",
                if tagged {
                    "in the tagged"
                } else {
                    "in the untagged"
                }
            ),
            WireError::QueueNumber { opcode, qn } => {
                write!(f, "RDMAP opcode {opcode:#x} on wrong queue number {qn}")
            }
            WireError::NotLast { opcode } => {
                write!(f, "RDMAP opcode {opcode:#x} must be a single segment")
            }
            WireError::BodyLen { opcode, len } => {
                write!(f, "RDMAP opcode {opcode:#x} with body of wrong size {len}")
            }
            WireError::Terminate => write!(f, "malformed Terminate message"),
            WireError::Crc => write!(f, "CRC32C trailer does not match"),
            WireError::Unsealed => write!(f, "datagram without the CRC32C the connection requires"),
        }
    }
}

impl std::error::Error for WireError {}
