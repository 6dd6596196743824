//! Work requests and completions, with the meaning libibverbs gives them.

/// One scatter/gather element: local memory named by its lkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Send; `invalidate` names the peer's STag to invalidate (Send with
    /// Invalidate); `solicited` asks for a solicited event.
    Send {
        invalidate: Option<u32>,
        solicited: bool,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    /// RDMA Write followed by RFC 7306 Immediate Data, which consumes a
    /// receive at the peer.
    RdmaWriteImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
        solicited: bool,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    /// RFC 7306 atomic on the 8 bytes at `remote_addr`; the value found
    /// there lands in the request's first 8 bytes of local memory.
    Atomic {
        remote_addr: u64,
        rkey: u32,
        op: AtomicOp,
    },
    /// Work the caller does on its own memory table when it posts the
    /// request (binding a memory window, invalidating an STag): nothing goes
    /// on the wire, and the request completes in send queue order.
    Local(LocalOp),
}

/// What a [`SendOp::Local`] request did, for its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalOp {
    BindWindow,
    Invalidate,
}

/// RFC 7306's two atomics, both masked; verbs' are [`AtomicOp::fetch_add`]
/// and [`AtomicOp::compare_swap`]. The remote value is a 64-bit integer in
/// the responder's byte order, as libibverbs defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Adds `add`. Each bit set in `fields` is the top bit of a field whose
    /// carry out is dropped: 0 is one 64-bit add.
    FetchAdd { add: u64, fields: u64 },
    /// Where `old` equals `compare` in the bits of `compare_mask`, the bits
    /// of `swap_mask` take `swap`'s.
    CompareSwap {
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    },
}

impl AtomicOp {
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: one 64-bit add.
    pub const fn fetch_add(add: u64) -> AtomicOp {
        AtomicOp::FetchAdd { add, fields: 0 }
    }

    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: all 64 bits compared and swapped.
    pub const fn compare_swap(compare: u64, swap: u64) -> AtomicOp {
        AtomicOp::CompareSwap {
            compare,
            compare_mask: u64::MAX,
            swap,
            swap_mask: u64::MAX,
        }
    }

    /// Applies the operation to `old`: the value left in memory.
    #[inline]
    pub fn apply(self, old: u64) -> u64 {
        match self {
            AtomicOp::FetchAdd { add, fields: 0 } => old.wrapping_add(add),
            AtomicOp::FetchAdd { add, fields } => {
                // Bit by bit, the carry dropped past the top of each field.
                let (mut sum, mut carry) = (0u64, 0u64);
                for i in 0..64 {
                    let (a, b) = ((old >> i) & 1, (add >> i) & 1);
                    sum |= (a ^ b ^ carry) << i;
                    carry = (a & b) | (carry & (a ^ b));
                    carry &= !(fields >> i) & 1;
                }
                sum
            }
            AtomicOp::CompareSwap {
                compare,
                compare_mask,
                swap,
                swap_mask,
            } => {
                if (old ^ compare) & compare_mask == 0 {
                    (old & !swap_mask) | (swap & swap_mask)
                } else {
                    old
                }
            }
        }
    }
}

impl SendOp {
    /// The opcode of the request's completion.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send { .. } => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::Atomic {
                op: AtomicOp::FetchAdd { .. },
                ..
            } => WcOpcode::FetchAdd,
            SendOp::Atomic {
                op: AtomicOp::CompareSwap { .. },
                ..
            } => WcOpcode::CompareSwap,
            SendOp::Local(LocalOp::BindWindow) => WcOpcode::BindMw,
            SendOp::Local(LocalOp::Invalidate) => WcOpcode::LocalInv,
        }
    }

    /// Whether the request completes on the peer's response (an RDMA Read
    /// or an atomic: each takes one of the peer's IRD slots) rather than on
    /// the acknowledgement of what it sent.
    #[inline]
    pub fn awaits_response(&self) -> bool {
        matches!(self, SendOp::RdmaRead { .. } | SendOp::Atomic { .. })
    }
}

#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp,
    pub sges: &'a [Sge],
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sges: &'a [Sge],
}

/// Completion status, mapped one-to-one onto `ibv_wc_status` by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// The peer reported a protection error (Terminate): IBV_WC_REM_ACCESS_ERR.
    RemoteAccess,
    /// The peer reported another error (Terminate): IBV_WC_REM_OP_ERR.
    RemoteOperation,
    /// Incoming data did not fit the receive buffer: IBV_WC_LOC_LEN_ERR.
    LocalLength,
    /// A local protection check failed on incoming data: IBV_WC_LOC_PROT_ERR.
    LocalProtection,
    /// The peer stopped acknowledging: IBV_WC_RETRY_EXC_ERR.
    RetryExceeded,
    /// The QP went to error before this request ran: IBV_WC_WR_FLUSH_ERR.
    Flush,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompareSwap,
    FetchAdd,
    BindMw,
    LocalInv,
    Recv,
    RecvRdmaWithImm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    Send,
    Recv,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub queue: Queue,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (receive completions; for RecvRdmaWithImm the length
    /// of the RDMA Write) or bytes of the request (send completions).
    pub byte_len: u32,
    pub imm: Option<u32>,
    /// STag invalidated by a received Send with Invalidate.
    pub invalidated: Option<u32>,
    /// The message asked for a solicited event.
    pub solicited: bool,
}

/// Why a post was refused before anything was queued (the verbs call
/// returns an errno; nothing is completed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The QP is not in a state that accepts this request (EINVAL).
    State,
    /// The queue is full (ENOMEM).
    QueueFull,
    /// An SGE names an invalid lkey, lies outside its region or lacks local
    /// write where needed (EINVAL).
    LocalProtection(crate::mr::ProtectionError),
    /// The total length exceeds 2^31 bytes (EINVAL).
    TooLong,
    /// An atomic without 8 bytes of local memory for its result (EINVAL).
    AtomicResult,
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PostError::State => f.write_str("QP does not accept work requests in this state"),
            PostError::QueueFull => f.write_str("work queue full"),
            PostError::LocalProtection(e) => write!(f, "local protection error: {e}"),
            PostError::TooLong => f.write_str("message longer than 2^31 bytes"),
            PostError::AtomicResult => f.write_str("atomic without 8 bytes for its result"),
        }
    }
}

impl std::error::Error for PostError {}

#[cfg(test)]
mod tests {
    use super::AtomicOp;

    #[test]
    fn masked_atomics_follow_rfc_7306() {
        // Two 32-bit fields: the low one's carry does not reach the high one.
        let two = AtomicOp::FetchAdd {
            add: 0x0000_0001_0000_0001,
            fields: 0x8000_0000_8000_0000,
        };
        assert_eq!(two.apply(0x0000_0005_ffff_ffff), 0x0000_0006_0000_0000);
        assert_eq!(AtomicOp::fetch_add(1).apply(0xffff_ffff), 0x1_0000_0000);
        assert_eq!(AtomicOp::fetch_add(2).apply(u64::MAX), 1);
        // Compare the low byte only; swap the high half only.
        let cs = AtomicOp::CompareSwap {
            compare: 0x42,
            compare_mask: 0xff,
            swap: 0xaaaa_aaaa_0000_0000,
            swap_mask: 0xffff_ffff_0000_0000,
        };
        assert_eq!(cs.apply(0x1234_5678_9abc_de42), 0xaaaa_aaaa_9abc_de42);
        assert_eq!(cs.apply(0x1234_5678_9abc_de43), 0x1234_5678_9abc_de43);
        assert_eq!(AtomicOp::compare_swap(7, 9).apply(7), 9);
        assert_eq!(AtomicOp::compare_swap(7, 9).apply(8), 8);
    }
}
