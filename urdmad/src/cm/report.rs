//! The status records of connection management (`urdmad status`).

use super::{Cm, ReqState, MAX_REQUESTS};
use crate::status::{self, Record};
use std::net::SocketAddrV4;
use std::time::Instant;

impl Cm {
    /// The status records of connection management.
    pub fn status(&self, now: Instant, out: &mut Vec<Record>) {
        let name = |p: usize| {
            self.ports
                .get(p)
                .map_or_else(String::new, |p| p.name.clone())
        };
        out.push(Record::Cm(status::Cm {
            channel: if self.channel { "open" } else { "none" }.into(),
            listeners: self.listeners.len(),
            requests: self.requests.len(),
            max_requests: MAX_REQUESTS,
            requests_dropped: self.counters.requests_dropped,
            connecting: self.handshakes.len(),
            connected: self.conns.len(),
            qps: self.qps.len(),
            rejects_sent: self.counters.rejects_sent,
            aborts_sent: self.counters.aborts_sent,
            strays: self.counters.strays,
        }));
        for (&id, l) in &self.listeners {
            out.push(Record::Listener(status::Listener {
                id,
                dev: l.dev,
                port: l.port.map(name),
                local: SocketAddrV4::new(l.addr, l.udp).to_string(),
            }));
        }
        for (&req, r) in &self.requests {
            out.push(Record::Request(status::Request {
                req,
                listener: r.listener,
                port: name(r.port),
                local: r.local.to_string(),
                remote: r.remote.to_string(),
                peer_conn: r.peer_conn,
                state: match r.state {
                    ReqState::Unheard(_) => "unheard",
                    ReqState::Pending => "pending",
                    ReqState::Rejected(_) => "rejected",
                    ReqState::Accepted => "accepted",
                }
                .into(),
                idle_ms: now.saturating_duration_since(r.last_seen).as_millis() as u64,
            }));
        }
        for (&id, h) in &self.handshakes {
            out.push(Record::Connecting(status::Connecting {
                id,
                dev: h.dev,
                qpn: h.qpn,
                port: name(h.port),
                local: h.local.to_string(),
                remote: h.remote.to_string(),
                mac: h.mac.to_string(),
                sent: h.sent,
            }));
        }
        for (&(dev, qpn), c) in &self.conns {
            out.push(Record::Connection(status::Connection {
                dev,
                qpn,
                client: c.client,
                role: c.role.as_str().into(),
                port: name(c.port),
                local: c.local.to_string(),
                remote: c.remote.to_string(),
                mac: c.mac.to_string(),
                flow: c.flow,
                peer_conn: c.peer_conn,
                peer_closed: c.peer_closed_sent,
            }));
        }
        for (&(dev, qpn), &client) in &self.qps {
            out.push(Record::Qp(status::Qp { dev, qpn, client }));
        }
    }
}
