//! Each connected QP's transport figures, which the process that owns the QP keeps current
//! in memory urdmad reads: urdmad shows them on the QP's flow in its status while the QP
//! lives, and adds them up into its port's counters, which urdma.ko shows as the device's
//! `hw_counters` (`rdma statistic show`).
//!
//! The slot also holds how far the QP has received the peer's stream ([`Slot::received`]):
//! when urdmad ends the connection for a process that died or never heard of its end, its
//! Abort acknowledges that much, so that the peer completes what was delivered and flushes
//! only the rest, as it would for the process's own Abort.
//!
//! urdmad reserves the table ([`MEMZONE`], [`SLOTS`] slots) at start and gives each
//! connection's flow a slot of its own, zeroed, in `EVENT CONNECTED` (`stats`). Only the
//! owning process writes a slot, and only while it has the flow; urdmad reads it when asked
//! for status or counters, and a last time when the flow closes, when it adds the slot's
//! counts to its port's totals and the slot becomes free again. Each value is written and read
//! whole (an atomic word): a reader may see one value of a round and another of the next,
//! never a torn one.

use std::sync::atomic::{AtomicU64, Ordering};

/// The memzone that holds the table of [`Slot`]s.
pub const MEMZONE: &str = "urd_qp_stats";

/// Slots in the table: connections beyond this many at once have no figures of their own
/// (urdmad's status shows none for them, and the port's counters miss them).
pub const SLOTS: u32 = 4096;

/// What a slot counts, in slot order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Datagrams the QP received (duplicates included).
    RxPackets,
    /// Datagrams it sent: new data, retransmissions and acknowledgements.
    TxPackets,
    /// Data datagrams it sent again.
    Retransmissions,
    /// Retransmission timeouts.
    Timeouts,
    /// Datagrams it received twice.
    Duplicates,
    /// Datagrams it dropped for their CRC32C.
    CrcErrors,
    /// Datagrams for it that did not parse.
    Malformed,
    /// Not a count: its smoothed round-trip time in microseconds (0 before the first sample).
    SrttUs,
}

/// Values in a slot.
pub const COUNTERS: usize = 8;

/// Every counter, in slot order.
pub const ALL: [Counter; COUNTERS] = [
    Counter::RxPackets,
    Counter::TxPackets,
    Counter::Retransmissions,
    Counter::Timeouts,
    Counter::Duplicates,
    Counter::CrcErrors,
    Counter::Malformed,
    Counter::SrttUs,
];

/// One QP's figures, and the end of what it has received, in cache lines of their own.
#[repr(C, align(64))]
#[derive(Default)]
pub struct Slot {
    values: [AtomicU64; COUNTERS],
    /// `RECEIVED | psn`, or 0 while nothing was said.
    received: AtomicU64,
}

/// Marks [`Slot`]'s `received` word as said.
const RECEIVED: u64 = 1 << 32;

/// A copy of a slot's values, in slot order.
pub type Values = [u64; COUNTERS];

impl Slot {
    /// The owning process, after a round of the QP's progress.
    pub fn publish(&self, v: &Values) {
        for (slot, v) in self.values.iter().zip(v) {
            slot.store(*v, Ordering::Relaxed);
        }
    }

    /// urdmad.
    pub fn read(&self) -> Values {
        std::array::from_fn(|i| self.values[i].load(Ordering::Relaxed))
    }

    /// The owning process: every datagram of the peer's before sequence number `psn` has
    /// been received and placed. Said before the application can see what they completed,
    /// so that a process that exits on a completion has said it.
    pub fn set_received(&self, psn: u32) {
        self.received
            .store(RECEIVED | u64::from(psn), Ordering::Release);
    }

    /// urdmad: the sequence number that ends what the process received, if it said.
    pub fn received(&self) -> Option<u32> {
        let v = self.received.load(Ordering::Acquire);
        (v & RECEIVED != 0).then_some(v as u32)
    }

    /// urdmad, before handing the slot to a new flow.
    pub fn clear(&self) {
        self.publish(&[0; COUNTERS]);
        self.received.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_two_cache_lines_and_reads_what_was_published() {
        assert_eq!(std::mem::size_of::<Slot>(), 128);
        assert_eq!(ALL.len(), COUNTERS);
        for (i, c) in ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        let s = Slot::default();
        let v: Values = [1, 2, 3, 4, 5, 6, 7, 800];
        s.publish(&v);
        assert_eq!(s.read(), v);
        assert_eq!(s.read()[Counter::SrttUs as usize], 800);
        assert_eq!(s.received(), None);
        s.set_received(0);
        assert_eq!(s.received(), Some(0));
        s.set_received(u32::MAX);
        assert_eq!(s.received(), Some(u32::MAX));
        s.clear();
        assert_eq!(s.read(), [0; COUNTERS]);
        assert_eq!(s.received(), None);
    }
}
