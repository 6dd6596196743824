//! Wake-up requests: a process that is going to sleep asks (`ARM`) to be told (`EVENT WAKE`)
//! when a frame for it arrives, and urdma.ko's bell for frames that complete a receive
//! ([`crate::ringbell`]). Not connection management: only the flows' counters count.
//!
//! A frame that would wake the process's helper follows urdma.ko's hush (docs/kernel-abi.md,
//! "The hush") where the process has a hush word: while one of its threads is in a call
//! that reads every ring, or its next call is due soon, the frame is left to that call, and
//! the helper is woken only if no call has read it by the time given.

use super::Daemon;
use crate::proto::{self, Response};
use dpdk_sys as sys;
use std::time::Duration;

/// CLOCK_MONOTONIC in nanoseconds, the clock of the hush word's times.
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

impl Daemon {
    /// `ARM`: an `EVENT WAKE` at once when a flow's ring already holds frames that no
    /// thread of the process will read, otherwise at the first frame to come.
    pub(super) fn arm(&mut self, i: usize) -> Response {
        let id = self.clients[i].id;
        if self.client_rings_nonempty(i) && !self.hushed(i, monotonic_ns()) {
            self.send(i, &proto::Event::Wake.encode());
        } else {
            let seen = self.client_wakes(id);
            self.armed.insert(id, seen);
        }
        Response::Ok
    }

    /// Writes `EVENT WAKE` to every armed process that has received frames since it armed,
    /// unless they are left to a thread of its own (the hush).
    pub(super) fn check_wakes(&mut self) {
        let now = monotonic_ns();
        let armed: Vec<(u32, u64)> = self.armed.iter().map(|(&k, &v)| (k, v)).collect();
        for (id, seen) in armed {
            let wakes = self.client_wakes(id);
            if wakes <= seen {
                continue;
            }
            let Some(i) = self.clients.iter().position(|c| c.id == id) else {
                self.armed.remove(&id);
                continue;
            };
            if self.hushed(i, now) {
                self.armed.insert(id, wakes);
                continue;
            }
            self.armed.remove(&id);
            self.send(i, &proto::Event::Wake.encode());
        }
    }

    /// Whether what client `i`'s rings hold now is left to a thread of the process (its
    /// hush word marked); a time given for its next call starts the wait for it.
    fn hushed(&mut self, i: usize, now: u64) -> bool {
        let c = &self.clients[i];
        let Some(until) = c.hush.as_ref().and_then(|(_, h)| h.value().hush_frame(now)) else {
            return false;
        };
        if until != 0 {
            // The wait keeps the time given for the last frame hushed.
            let t = self.late.entry(c.id).or_insert(until);
            *t = (*t).max(until);
        }
        true
    }

    /// Wakes the helper of each process whose time given for its next call has come with a
    /// frame left to that call unread; how long until the next such time, if any.
    pub(super) fn check_late(&mut self) -> Option<Duration> {
        if self.late.is_empty() {
            return None;
        }
        let now = monotonic_ns();
        let due: Vec<u32> = self
            .late
            .iter()
            .filter(|(_, &t)| t <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.late.remove(&id);
            let Some(i) = self.clients.iter().position(|c| c.id == id) else {
                continue;
            };
            let late = self.clients[i]
                .hush
                .as_ref()
                .is_some_and(|(_, h)| h.value().late(now));
            // A helper not armed is awake, and reads the rings in its next round.
            if late && self.armed.remove(&id).is_some() {
                self.send(i, &proto::Event::Wake.encode());
            }
        }
        self.late
            .values()
            .min()
            .map(|&t| Duration::from_nanos(t.saturating_sub(now)))
    }

    /// Rings urdma.ko's bell for the frames enqueued since the last call that complete a
    /// receive; a frame for which it fires nothing (the CQ not armed for it) wakes the
    /// process's helper instead, as one without a bell does.
    pub(super) fn ring_bells(&mut self) {
        for p in self.ports.iter_mut() {
            let mut unrung = Vec::new();
            for r in p.flows.take_rings() {
                let fired = match &self.chan {
                    Some(c) => c.ring(r.dev, r.qpn, r.verdict).unwrap_or_else(|e| {
                        tracing::debug!(dev = r.dev, qpn = r.qpn, "urdma.ko rang no bell: {e}");
                        false
                    }),
                    None => false,
                };
                if !fired {
                    unrung.push(r.flow);
                }
            }
            for i in unrung {
                if let Some(f) = p.flows.get_mut(i) {
                    f.wakes += 1;
                }
            }
        }
    }

    /// Frames enqueued on the flows of client `id` so far that wake its helper.
    pub(super) fn client_wakes(&self, id: u32) -> u64 {
        self.flows
            .values()
            .filter(|r| r.client == id)
            .filter_map(|r| self.ports[usize::from(r.port)].flows.get(r.slot))
            .map(|f| f.wakes)
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
