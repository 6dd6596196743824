//! TRP reliability: PSN bookkeeping, acknowledgements, loss recovery,
//! RTT estimation (RFC 6298) and congestion control, independent of what
//! the segments carry.
//!
//! - [`sender`]: the window of outstanding PSNs, loss detection and
//!   retransmission;
//! - `congestion`: how much of that window may be in the network;
//! - `rtt`: the round-trip estimator and the retransmission timeout;
//! - [`receiver`]: which PSNs arrived, and when to acknowledge them.

mod congestion;
pub mod receiver;
mod rtt;
pub mod sender;

pub use receiver::{AckAsk, Arrival, Receiver};
pub use sender::{Params, Sender, SenderStats, Timeout};

/// `a < b` in 32-bit serial arithmetic.
#[inline(always)]
pub fn psn_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a <= b` in 32-bit serial arithmetic.
#[inline(always)]
pub fn psn_le(a: u32, b: u32) -> bool {
    !psn_lt(b, a)
}
