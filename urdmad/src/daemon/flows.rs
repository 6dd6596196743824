//! Flows: opened for a process, steered by the port's software table, a hardware queue or
//! the direct path, and closed.

use super::{
    error, ring_create, ring_drain_free, Daemon, FlowRec, FlowSpecOpened, PortState, RetiredFlow,
    BURST,
};
use crate::hwflow::{self, FlowQueue, Match, QueueUse};
use crate::port::SteeringError;
use crate::proto::{ErrorCode, FlowSpec, Response, Steering};
use dpdk_sys as sys;

/// Frees whatever waits on a flow queue (frames of a flow that is gone, or that arrived
/// before its rule), bounded so that a flood cannot hold the loop.
pub(super) fn drain_queue(port: u16, q: &mut FlowQueue) {
    let mut rx = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
    for _ in 0..64 {
        // SAFETY: the port is started; the mbufs are ours to free.
        let n = unsafe { sys::rte_eth_rx_burst(port, q.id, rx.as_mut_ptr(), BURST as u16) };
        if n == 0 {
            return;
        }
        q.strays += u64::from(n);
        for &m in &rx[..usize::from(n)] {
            // SAFETY: received above.
            unsafe { sys::rte_pktmbuf_free(m) };
        }
    }
}

/// Takes a free flow queue, empties it, and creates the flow's rule to it. The error says
/// why the flow stays with software steering.
pub(super) fn steer_to_queue(
    p: &mut PortState,
    flow: u32,
    slot: u32,
    ring: *mut sys::rte_ring,
    spec: &FlowSpec,
) -> Result<u16, SteeringError> {
    let port = p.port.id;
    let q = p
        .queues
        .iter_mut()
        .find(|q| q.state == QueueUse::Free)
        .ok_or(SteeringError::QueuesInUse {
            queues: p.port.flow_queues,
        })?;
    drain_queue(port, q);
    let m = Match::Flow {
        local: spec.local,
        remote: spec.remote,
    };
    let rule =
        hwflow::create(port, m, q.id).map_err(|error| SteeringError::RuleNotCreated { error })?;
    q.rule = Some(rule);
    q.state = QueueUse::Flow {
        id: flow,
        slot,
        ring,
    };
    Ok(q.id)
}

/// Destroys a flow's rule and returns its queue to the pool emptied, or quarantines the
/// queue when the rule cannot be destroyed.
pub(super) fn unsteer_queue(p: &mut PortState, queue: u16, flow: u32) {
    let port = p.port.id;
    let name = &p.port.name;
    let Some(q) = p.queues.get_mut(usize::from(queue) - 1) else {
        return;
    };
    // The ring is about to be freed: the queue must stop referring to it first.
    q.state = QueueUse::Quarantined;
    let Some(rule) = q.rule.take() else {
        drain_queue(port, q);
        q.state = QueueUse::Free;
        return;
    };
    match hwflow::destroy(port, rule) {
        Ok(()) => {
            drain_queue(port, q);
            q.state = QueueUse::Free;
        }
        Err((rule, why)) => {
            q.rule = Some(rule);
            tracing::error!(port = %name, queue, flow, "rule not destroyed, queue quarantined: {why}");
        }
    }
}

impl Daemon {
    pub(super) fn open(&mut self, i: usize, spec: &FlowSpec) -> String {
        match self.open_flow(i, spec) {
            Ok(o) => Response::Opened {
                flow: o.flow,
                rx_ring: o.rx_ring,
                steering: o.steering,
                queue: o.queue,
            }
            .encode(),
            Err(r) => r.encode(),
        }
    }

    /// Opens a flow for client `i`; the error reply when it cannot.
    pub(super) fn open_flow(
        &mut self,
        i: usize,
        spec: &FlowSpec,
    ) -> Result<FlowSpecOpened, Response> {
        if self.clients[i].attached.is_none() {
            return Err(error(ErrorCode::Invalid, "ATTACH first"));
        }
        let Some(p) = self.ports.get_mut(usize::from(spec.port)) else {
            return Err(error(
                ErrorCode::NotFound,
                &format!("no port {}", spec.port),
            ));
        };
        if spec.local.port() == 0 {
            return Err(error(ErrorCode::Invalid, "local UDP port 0"));
        }
        let flow = self.next_flow;
        let name = format!("urd_rx_{flow}");
        let ring = match ring_create(&name, self.cfg.daemon.ring_size, false) {
            Ok(r) => r,
            Err(e) => return Err(error(ErrorCode::NoResources, &e.to_string())),
        };
        let Some(slot) = p.flows.insert(spec.local, spec.remote, ring) else {
            // SAFETY: just created, unused.
            unsafe { sys::rte_ring_free(ring) };
            return Err(error(
                ErrorCode::Exists,
                &format!("a flow for {} is already open", spec.local),
            ));
        };
        if let Some(f) = p.flows.get_mut(slot) {
            f.holder = self.clients[i].id;
        }
        self.next_flow += 1;
        self.rings += 1;
        let (queue, fallback) = if p.port.steering == Steering::Hardware {
            match steer_to_queue(p, flow, slot, ring, spec) {
                Ok(q) => (Some(q), None),
                Err(why) => {
                    tracing::warn!(flow, port = %p.port.name, "flow steered in software: {why}");
                    (None, Some(why.to_string()))
                }
            }
        } else {
            (None, None)
        };
        let client = self.clients[i].id;
        self.flows.insert(
            flow,
            FlowRec {
                port: spec.port,
                slot,
                client,
                ring_name: name.clone(),
                queue,
                fallback,
                direct: None,
                stats: None,
            },
        );
        self.clients[i].flows.push(flow);
        let steering = if queue.is_some() {
            Steering::Hardware
        } else {
            Steering::Software
        };
        tracing::debug!(client, flow, port = spec.port, local = %spec.local, remote = ?spec.remote,
            steering = steering.as_str(), queue, "flow opened");
        Ok(FlowSpecOpened {
            flow,
            rx_ring: name,
            steering,
            queue,
        })
    }

    /// Where what the flow's process received ends, as it last said in the flow's figures
    /// slot (`crate::qpstats::Slot::received`); `None` for a flow without a slot.
    pub(super) fn flow_received(&self, flow: u32) -> Option<u32> {
        let slot = self.flows.get(&flow)?.stats?;
        self.qp_table.received(slot)
    }

    pub(super) fn close_flow(&mut self, flow: u32) {
        if let Some(i) = self.retired.iter().position(|r| r.flow == flow) {
            let r = self.retired.swap_remove(i);
            let qp = r.stats.map(|s| self.qp_table.give_back(s));
            self.ports[usize::from(r.port)].departed.add(qp, 0);
            // SAFETY: off the wire since it was retired; its owner let it go or is gone.
            unsafe { ring_drain_free(r.ring) };
            self.rings -= 1;
            tracing::debug!(flow, "retired flow closed");
            return;
        }
        self.end_flow(flow, false);
    }

    /// Takes a flow off the wire, keeping its ring and figures slot for the process that may
    /// still read them until [`Daemon::close_flow`] ([`crate::cm::Action::RetireFlow`]).
    pub(super) fn retire_flow(&mut self, flow: u32) {
        self.end_flow(flow, true);
    }

    fn end_flow(&mut self, flow: u32, retire: bool) {
        let Some(mut rec) = self.flows.remove(&flow) else {
            return;
        };
        let p = &mut self.ports[usize::from(rec.port)];
        let drops = p.flows.get(rec.slot).map_or(0, |f| f.drops)
            + rec.direct.as_ref().map_or(0, |d| d.counters().1);
        let qp = match rec.stats {
            Some(s) if !retire => Some(self.qp_table.give_back(s)),
            _ => None,
        };
        p.departed.add(qp, drops);
        if let Some(sock) = rec.direct.take() {
            self.direct_close(flow, rec.client, sock);
        }
        let p = &mut self.ports[usize::from(rec.port)];
        if let Some(q) = rec.queue {
            unsteer_queue(p, q, flow);
        }
        if let Some(ring) = p.flows.remove(rec.slot) {
            if retire {
                self.retired.push(RetiredFlow {
                    flow,
                    client: rec.client,
                    port: rec.port,
                    ring,
                    stats: rec.stats,
                });
                tracing::debug!(flow, "flow retired");
                return;
            }
            // SAFETY: unlinked from the table, so nothing enqueues any more; the owner has
            // closed it or is gone.
            unsafe { ring_drain_free(ring) };
            self.rings -= 1;
        }
        tracing::debug!(flow, "flow closed");
    }
}
