//! The status report (`urdmad status`): one record per daemon, port, queue, flow, process and
//! connection.

use super::{counters, Daemon, POOL_NAME};
use crate::hwflow::QueueUse;
use crate::port;
use crate::status::{self, Record};
use dpdk_sys as sys;

impl Daemon {
    /// The status report: one `kind key=value...` line per object.
    pub fn status(&self) -> Vec<Record> {
        let mut out = Vec::new();
        let attached = self.clients.iter().filter(|c| c.attached.is_some()).count();
        let flow_rules: usize = self
            .ports
            .iter()
            .flat_map(|p| &p.queues)
            .filter(|q| q.rule.is_some())
            .count();
        let keeper = self.keeper.as_ref().ok().and_then(|k| k.figures());
        let misses = self.keeper.as_ref().ok().map(|k| k.misses());
        out.push(Record::Daemon(status::Daemon {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            prefix: self.cfg.daemon.file_prefix.clone(),
            uptime_s: self.started.elapsed().as_secs(),
            processes: attached,
            flows: self.flows.len(),
            rings: self.rings,
            flow_rules,
            frames_wake: !self.idle.port_fds().is_empty(),
            spurious_wakes: self.idle.spurious_wakes,
            sockets_ready: keeper.map(|k| k.ready),
            sockets_closing: keeper.map(|k| k.closing),
            sockets_missed: misses.map(|m| m.missed),
            sockets_missed_busy: misses.map(|m| m.busy),
            filters_reused: self.filters.reused(),
            sockets_parked: self.sockets_parked(),
            sockets_reused: self.sockets_reused,
        }));
        // SAFETY: the pool lives as long as the daemon.
        let (available, size) =
            unsafe { (sys::rte_mempool_avail_count(self.pool), (*self.pool).size) };
        out.push(Record::Pool(status::Pool {
            name: POOL_NAME.into(),
            size,
            available,
            in_use: size.saturating_sub(available),
        }));
        for p in &self.ports {
            let c = port::counters(p.port.id);
            let socket_drops = p.socket_drops();
            let in_state = |s: QueueUse| p.queues.iter().filter(|q| q.state == s).count();
            out.push(Record::Port(status::Port {
                index: p.port.index,
                name: p.port.name.clone(),
                device: p.port.device.clone(),
                mac: p.port.mac.to_string(),
                steering: p.port.steering.as_str().into(),
                steering_reason: Some(p.port.steering_reason.clone()).filter(|r| !r.is_empty()),
                flow_queues: p.queues.len(),
                free_queues: in_state(QueueUse::Free),
                quarantined_queues: in_state(QueueUse::Quarantined),
                rx_packets: c.rx_packets,
                rx_bytes: c.rx_bytes,
                rx_missed: c.rx_missed,
                rx_socket_drops: socket_drops,
                rx_errors: c.rx_errors,
                tx_packets: c.tx_packets,
                tx_bytes: c.tx_bytes,
                tx_errors: c.tx_errors,
                from_processes: p.from_processes,
                from_processes_drops: p.from_processes_drops,
                loopback: p.loopback,
                echoes: p.echoes,
                conns_direct: p.conns_direct,
                conns_forwarded: p.conns_forwarded,
                rx_wake: p.port.rx_wake.as_str().into(),
                rx_wake_reason: p.port.rx_wake.reason().map(Into::into),
                direct: p.direct.is_some(),
                direct_flows: p.direct.as_ref().map(|d| d.len()),
                direct_max: p.direct.as_ref().map(|d| d.max()),
                direct_off: p.direct.is_none().then(|| p.direct_off.clone()),
            }));
            for q in &p.queues {
                out.push(Record::Queue(status::Queue {
                    port: p.port.name.clone(),
                    id: q.id,
                    state: q.state_str().into(),
                    flow: match q.state {
                        QueueUse::Flow { id, .. } => Some(id),
                        _ => None,
                    },
                    rule: q.rule.is_some(),
                    rx_packets: q.rx_packets,
                    rx_bytes: q.rx_bytes,
                    drops: q.drops,
                    strays: q.strays,
                }));
            }
            let e = port::counters(p.port.exception_id);
            out.push(Record::Exception(status::Exception {
                port: p.port.name.clone(),
                iface: p.port.exception_name.clone(),
                to_kernel: p.to_kernel,
                to_kernel_drops: p.to_kernel_drops,
                from_kernel: p.from_kernel,
                from_kernel_drops: p.from_kernel_drops,
                tap_rx_packets: e.rx_packets,
                tap_tx_packets: e.tx_packets,
                addresses: self.cfg.ports[p.port.index as usize]
                    .addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                rdma_device: p.rdma.as_ref().map(|d| d.name.clone()),
                rdma_device_state: p.rdma.as_ref().map(|d| d.state_text()),
            }));
        }
        for c in &self.clients {
            if let Some(a) = &c.attached {
                out.push(Record::Process(status::Process {
                    client: c.id,
                    pid: c.peer.pid,
                    uid: c.peer.uid,
                    lcore: a.lcore,
                    flows: c.flows.len(),
                    // SAFETY: rings live while the client is attached.
                    tx_queued: a
                        .tx
                        .iter()
                        .map(|t| unsafe { sys::rte_ring_count(t.ring) })
                        .sum(),
                    tx_packets: a.tx.iter().map(|t| t.packets).sum(),
                    tx_drops: a.tx.iter().map(|t| t.drops).sum(),
                    mbufs_lent: a.lender.lent(),
                }));
            }
        }
        self.cm_status(&mut out);
        for (&id, rec) in &self.flows {
            let p = &self.ports[usize::from(rec.port)];
            if let Some(f) = p.flows.get(rec.slot) {
                // A direct connection's frames arrive on its socket, but for those urdmad
                // took before the hand-over (`via_urdmad`); its socket ring's drops are the
                // process's as much as its flow ring's.
                let (path, sock_rx, sock_drops) = match &rec.direct {
                    Some(d) => {
                        let (rx, drops) = d.counters();
                        ("direct", rx, drops)
                    }
                    None => ("urdmad", 0, 0),
                };
                out.push(Record::Flow(status::Flow {
                    id,
                    client: rec.client,
                    port: p.port.name.clone(),
                    local: f.local.to_string(),
                    remote: f.remote.map(|r| r.to_string()),
                    ring: rec.ring_name.clone(),
                    steering: if rec.queue.is_some() {
                        "hardware"
                    } else {
                        "software"
                    }
                    .into(),
                    queue: rec.queue,
                    fallback: rec.fallback.clone(),
                    path: path.into(),
                    rx_packets: f.rx_packets + sock_rx,
                    via_urdmad: f.rx_packets,
                    rx_bytes: f.rx_bytes,
                    drops: f.drops + sock_drops,
                    // SAFETY: the ring lives while the flow is open.
                    queued: unsafe { sys::rte_ring_count(f.ring) },
                    qp: rec.stats.map(|s| counters::figures(&self.qp_table.read(s))),
                }));
            }
        }
        out
    }
}
