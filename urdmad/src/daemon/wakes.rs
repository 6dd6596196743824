//! Wake-up requests: a process that is going to sleep asks (`ARM`) to be told (`EVENT WAKE`)
//! when a frame for it arrives. Not connection management: only the flows' counters count.

use super::Daemon;
use crate::proto::{self, Response};
use dpdk_sys as sys;

impl Daemon {
    /// `ARM`: an `EVENT WAKE` at once when a flow's ring already holds frames, otherwise at
    /// the first frame to come.
    pub(super) fn arm(&mut self, i: usize) -> Response {
        if self.client_rings_nonempty(i) {
            self.send(i, &proto::Event::Wake.encode());
        } else {
            let id = self.clients[i].id;
            let seen = self.client_rx_packets(id);
            self.armed.insert(id, seen);
        }
        Response::Ok
    }

    /// Writes `EVENT WAKE` to every armed process that has received frames since it armed.
    pub(super) fn check_wakes(&mut self) {
        let armed: Vec<(u32, u64)> = self.armed.iter().map(|(&k, &v)| (k, v)).collect();
        for (id, seen) in armed {
            if self.client_rx_packets(id) > seen {
                self.armed.remove(&id);
                if let Some(i) = self.clients.iter().position(|c| c.id == id) {
                    self.send(i, &proto::Event::Wake.encode());
                }
            }
        }
    }

    /// Frames enqueued on the flows of client `id` so far.
    pub(super) fn client_rx_packets(&self, id: u32) -> u64 {
        self.flows
            .values()
            .filter(|r| r.client == id)
            .filter_map(|r| self.ports[usize::from(r.port)].flows.get(r.slot))
            .map(|f| f.rx_packets)
            .sum()
    }

    /// Whether any of client `i`'s flow rings holds frames.
    pub(super) fn client_rings_nonempty(&self, i: usize) -> bool {
        self.clients[i]
            .flows
            .iter()
            .filter_map(|f| self.flows.get(f))
            .filter_map(|r| self.ports[usize::from(r.port)].flows.get(r.slot))
            // SAFETY: the ring lives while the flow is open.
            .any(|f| unsafe { sys::rte_ring_count(f.ring) } > 0)
    }
}
