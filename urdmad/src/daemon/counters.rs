//! The counters urdmad keeps for others: the table in which processes keep each connected
//! QP's figures current ([`crate::qpstats`]), and each port's counters as urdma.ko shows them
//! on the devices of the port's exception interface (`rdma statistic show link DEV/1`),
//! sent over the connection channel when they have changed, at most every [`PUSH_PERIOD`].

use super::{Daemon, PortState};
use crate::cm_channel::{stat, Msg, Op};
use crate::qpstats::{Counter, Slot, Values, MEMZONE, SLOTS};
use crate::service::StartupError;
use crate::status;
use dpdk_sys as sys;
use std::ffi::CString;
use std::time::{Duration, Instant};

/// How stale the kernel's counters may be while they move; idle, none is sent. Short, so
/// that `rdma statistic` right after the traffic shows it (docs/urdmad.md's table of how far
/// behind); a push is one write to urdma.ko on a pass urdmad makes anyway.
pub(super) const PUSH_PERIOD: Duration = Duration::from_millis(200);

/// The kernel's counters of a port, in `enum urdma_stat` order.
pub(super) type PortCounters = [u64; stat::COUNT];

/// Where each summed QP figure goes among a port's counters (the round-trip time is not a
/// count and goes nowhere).
const QP_TO_PORT: [(Counter, usize); 7] = [
    (Counter::RxPackets, stat::RX_PACKETS),
    (Counter::TxPackets, stat::TX_PACKETS),
    (Counter::Retransmissions, stat::RETRANSMISSIONS),
    (Counter::Timeouts, stat::TIMEOUTS),
    (Counter::Duplicates, stat::DUPLICATES),
    (Counter::CrcErrors, stat::CRC_ERRORS),
    (Counter::Malformed, stat::MALFORMED),
];

/// What the port's frames, drops and QPs add up to: `qps` holds the figures of its live
/// QPs and the sums its closed ones left.
pub(super) fn port_counters(rx: u64, tx: u64, drops: u64, qps: &[Values]) -> PortCounters {
    let mut out = [0; stat::COUNT];
    out[stat::RX_FRAMES] = rx;
    out[stat::TX_FRAMES] = tx;
    out[stat::RX_DROPS] = drops;
    for v in qps {
        for (c, i) in QP_TO_PORT {
            out[i] += v[c as usize];
        }
    }
    out
}

/// A slot's values as status shows them.
pub(super) fn figures(v: &Values) -> status::QpFigures {
    let at = |c: Counter| v[c as usize];
    status::QpFigures {
        rx_packets: at(Counter::RxPackets),
        tx_packets: at(Counter::TxPackets),
        retransmissions: at(Counter::Retransmissions),
        timeouts: at(Counter::Timeouts),
        duplicates: at(Counter::Duplicates),
        crc_errors: at(Counter::CrcErrors),
        malformed: at(Counter::Malformed),
        srtt_us: at(Counter::SrttUs),
    }
}

/// The table of QP figures, in urdmad's shared memory.
pub(super) struct QpFigures {
    mz: *const sys::rte_memzone,
    slots: *const Slot,
    free: Vec<u32>,
}

impl QpFigures {
    pub fn new() -> Result<QpFigures, StartupError> {
        let name = CString::new(MEMZONE).unwrap();
        let len = SLOTS as usize * std::mem::size_of::<Slot>();
        // SAFETY: EAL is up; a valid name.
        let mz = unsafe { sys::rte_memzone_reserve(name.as_ptr(), len, sys::SOCKET_ID_ANY, 0) };
        if mz.is_null() {
            return Err(StartupError::QpStats {
                reason: sys::rte_strerror_string(sys::rte_errno()),
            });
        }
        // SAFETY: the memzone is ours, cache-line aligned and `len` long.
        let slots = unsafe {
            let p = (*mz).__bindgen_anon_1.addr as *mut Slot;
            for i in 0..SLOTS as usize {
                p.add(i).write(Slot::default());
            }
            p as *const Slot
        };
        Ok(QpFigures {
            mz,
            slots,
            // Taken from the end: the lowest first.
            free: (0..SLOTS).rev().collect(),
        })
    }

    fn slot(&self, i: u32) -> &Slot {
        assert!(i < SLOTS);
        // SAFETY: within the table, which lives as long as self.
        unsafe { &*self.slots.add(i as usize) }
    }

    /// A cleared slot for a new flow, if any is left.
    pub fn take(&mut self) -> Option<u32> {
        let i = self.free.pop()?;
        self.slot(i).clear();
        Some(i)
    }

    pub fn read(&self, i: u32) -> Values {
        self.slot(i).read()
    }

    /// Where what slot `i`'s process received ends, if it said.
    pub fn received(&self, i: u32) -> Option<u32> {
        self.slot(i).received()
    }

    /// The slot's last figures; the slot is free again (its flow is closed, so nothing
    /// writes it any more).
    pub fn give_back(&mut self, i: u32) -> Values {
        let v = self.read(i);
        self.free.push(i);
        v
    }
}

impl Drop for QpFigures {
    fn drop(&mut self) {
        // SAFETY: reserved in `new`; no process is attached any more when urdmad drops it.
        unsafe { sys::rte_memzone_free(self.mz) };
    }
}

/// What a port's closed flows leave behind in its counters.
#[derive(Default)]
pub(super) struct Departed {
    /// Their QPs' figures, summed.
    pub qps: Values,
    /// Frames dropped on their rings and sockets.
    pub drops: u64,
}

impl Departed {
    pub fn add(&mut self, qp: Option<Values>, drops: u64) {
        if let Some(v) = qp {
            for (c, _) in QP_TO_PORT {
                self.qps[c as usize] += v[c as usize];
            }
        }
        self.drops += drops;
    }
}

impl PortState {
    /// Frames the kernel dropped on the port's own af_packet sockets (rings full), since
    /// urdmad started: the kernel counts since the last read, so the sum is kept here.
    pub(super) fn socket_drops(&self) -> u64 {
        let fresh: u64 = self
            .sockets
            .iter()
            .map(|&fd| crate::direct::take_stats(fd).1)
            .sum();
        self.socket_drops.set(self.socket_drops.get() + fresh);
        self.socket_drops.get()
    }
}

impl Daemon {
    /// The counters of port `pi` as the kernel shows them.
    fn port_counters(&self, pi: usize) -> PortCounters {
        let p = &self.ports[pi];
        let c = crate::port::counters(p.port.id);
        let mut drops = c.rx_missed + p.socket_drops() + p.to_kernel_drops + p.departed.drops;
        let mut qps = vec![p.departed.qps];
        for rec in self.flows.values().filter(|r| usize::from(r.port) == pi) {
            drops += p.flows.get(rec.slot).map_or(0, |f| f.drops);
            drops += rec.direct.as_ref().map_or(0, |d| d.counters().1);
            if let Some(s) = rec.stats {
                qps.push(self.qp_table.read(s));
            }
        }
        port_counters(c.rx_packets, c.tx_packets, drops, &qps)
    }

    /// Sends each port's counters to the kernel when they changed since the last time (or
    /// were never sent on this channel), at most every [`PUSH_PERIOD`].
    pub(super) fn counters_push(&mut self) {
        let now = Instant::now();
        if self.chan.is_none() || now < self.next_push {
            return;
        }
        self.next_push = now + PUSH_PERIOD;
        for pi in 0..self.ports.len() {
            let values = self.port_counters(pi);
            if self.ports[pi].pushed == Some(values) {
                continue;
            }
            let mut m = Msg::new(Op::Stats);
            m.ifname = self.ports[pi].port.exception_name.clone();
            m.pdata = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
            self.kernel_send(m);
            self.ports[pi].pushed = Some(values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qpstats::COUNTERS;

    #[test]
    fn a_ports_counters_sum_its_qps_but_not_their_round_trip_times() {
        let a: Values = [10, 20, 3, 1, 2, 0, 1, 500];
        let b: Values = [5, 6, 1, 0, 0, 4, 0, 900];
        let c = port_counters(100, 200, 7, &[a, b]);
        assert_eq!(c[stat::RX_FRAMES], 100);
        assert_eq!(c[stat::TX_FRAMES], 200);
        assert_eq!(c[stat::RX_DROPS], 7);
        assert_eq!(c[stat::RX_PACKETS], 15);
        assert_eq!(c[stat::TX_PACKETS], 26);
        assert_eq!(c[stat::RETRANSMISSIONS], 4);
        assert_eq!(c[stat::TIMEOUTS], 1);
        assert_eq!(c[stat::DUPLICATES], 2);
        assert_eq!(c[stat::CRC_ERRORS], 4);
        assert_eq!(c[stat::MALFORMED], 1);
        assert_eq!(
            c.iter().sum::<u64>(),
            100 + 200 + 7 + 15 + 26 + 4 + 1 + 2 + 4 + 1
        );
    }

    #[test]
    fn closed_flows_leave_their_counts_and_drops() {
        let mut d = Departed::default();
        d.add(Some([1, 2, 3, 4, 5, 6, 7, 800]), 2);
        d.add(None, 3);
        d.add(Some([1; COUNTERS]), 0);
        assert_eq!(d.qps, [2, 3, 4, 5, 6, 7, 8, 0]);
        assert_eq!(d.drops, 5);
    }
}
