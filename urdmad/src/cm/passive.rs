//! The passive side: listeners, ConnectRequests from peers, and the kernel's `ACCEPT` or
//! `REJECT` of each.

use super::{
    accepted, kernel_msg, Cm, Handing, Listener, PendingReq, QpConn, ReqState, ECONNRESET, EINVAL,
    ENOTCONN, LISTEN_GRACE, MAX_REQUESTS,
};
use crate::cm_channel::{Msg, Op};
use crate::proto::{Connected, Mac, Role};
use std::net::SocketAddrV4;
use std::time::Instant;
use trp::setup::Incoming;

impl Cm {
    pub(super) fn listen(&mut self, now: Instant, m: Msg) {
        let port = if m.ifname.is_empty() {
            None
        } else {
            match self.port_of_iface(&m.ifname) {
                Some(p) => Some(p),
                None => {
                    tracing::warn!(iface = %m.ifname, "LISTEN for an interface urdmad does not serve");
                    return;
                }
            }
        };
        if let Some(p) = port {
            self.dev_port.insert(m.dev, p);
        }
        tracing::info!(id = m.id, dev = m.dev, local = %m.local, "listening");
        self.listeners.insert(
            m.id,
            Listener {
                dev: m.dev,
                port,
                addr: *m.local.ip(),
                udp: m.local.port(),
            },
        );
        self.refresh_udp_ports();
        let early: Vec<(u64, u64, u32)> = self
            .requests
            .iter()
            .filter(|(_, r)| matches!(r.state, ReqState::Unheard(_)))
            .filter_map(|(&req, r)| {
                self.listener_for(r.port, r.local)
                    .map(|(lid, dev)| (req, lid, dev))
            })
            .collect();
        for (req, lid, dev) in early {
            self.pass_on(now, req, lid, dev);
        }
    }

    /// The listener that takes a request to `local` on `port`, and its device: one bound to
    /// the address before one on every address.
    fn listener_for(&self, port: usize, local: SocketAddrV4) -> Option<(u64, u32)> {
        self.listeners
            .iter()
            .filter(|(_, l)| {
                l.udp == local.port()
                    && l.port.is_none_or(|p| p == port)
                    && (l.addr.is_unspecified() || l.addr == *local.ip())
            })
            .max_by_key(|(_, l)| !l.addr.is_unspecified())
            .map(|(&id, l)| (id, l.dev))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn request(
        &mut self,
        now: Instant,
        port: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        mac: Mac,
        pkt: &[u8],
        inc: Incoming,
    ) {
        let known = self.requests.iter_mut().find(|(_, r)| {
            r.port == port
                && r.local == local
                && r.remote == remote
                && r.peer_conn == inc.peer_conn()
        });
        if let Some((_, r)) = known {
            r.last_seen = now;
            if let ReqState::Rejected(bytes) = &r.state {
                let bytes = bytes.clone();
                self.send(port, mac, local, remote, bytes);
                self.counters.rejects_sent += 1;
            }
            return;
        }
        if !self.channel {
            self.refuse(port, mac, local, remote, &inc);
            return;
        }
        if self.requests.len() >= MAX_REQUESTS {
            let oldest_answered = self
                .requests
                .iter()
                .filter(|(_, r)| r.state != ReqState::Pending)
                .min_by_key(|(_, r)| r.last_seen)
                .map(|(&k, _)| k);
            match oldest_answered {
                Some(k) => {
                    self.requests.remove(&k);
                }
                None => {
                    self.counters.requests_dropped += 1;
                    tracing::debug!(%local, %remote, "request table full: ConnectRequest dropped");
                    return;
                }
            }
        }
        self.next_req += 1;
        let req = self.next_req;
        self.requests.insert(
            req,
            PendingReq {
                listener: 0,
                port,
                local,
                remote,
                mac,
                peer_conn: inc.peer_conn(),
                pkt: pkt.to_vec(),
                state: ReqState::Unheard(now + LISTEN_GRACE),
                last_seen: now,
            },
        );
        self.request_due_by(now + LISTEN_GRACE);
        match self.listener_for(port, local) {
            Some((lid, dev)) => self.pass_on(now, req, lid, dev),
            None => tracing::debug!(req, %local, %remote, "ConnectRequest with no listener yet"),
        }
    }

    /// Passes request `req` to the kernel for listener `lid` of device `dev`.
    fn pass_on(&mut self, now: Instant, req: u64, lid: u64, dev: u32) {
        let Some(r) = self.requests.get_mut(&req) else {
            return;
        };
        // Parsed when it came: this does not fail.
        let Ok(inc) = Incoming::parse(&r.pkt) else {
            return;
        };
        r.listener = lid;
        r.state = ReqState::Pending;
        r.last_seen = now;
        let (local, remote, mac) = (r.local, r.remote, r.mac);
        tracing::debug!(req, listener = lid, %local, %remote, peer_conn = format_args!("{:#x}", inc.peer_conn()), "connection request");
        self.actions.push_back(kernel_msg(Op::Request, |m| {
            m.id = lid;
            m.req = req;
            m.dev = dev;
            m.local = local;
            m.remote = remote;
            m.remote_mac = mac;
            m.ird = inc.ird();
            m.ord = inc.ord();
            m.pdata = inc.private_data().to_vec();
        }));
    }

    /// Refuses a request no listener took: a Reject with no private data, not remembered.
    pub(super) fn refuse(
        &mut self,
        port: usize,
        mac: Mac,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        inc: &Incoming,
    ) {
        let mut buf = vec![0u8; 512];
        if let Ok(n) = inc.reject(&[], &mut buf) {
            tracing::debug!(%local, %remote, "ConnectRequest with no listener: rejected");
            buf.truncate(n);
            self.send(port, mac, local, remote, buf);
            self.counters.rejects_sent += 1;
        }
    }

    pub(super) fn accept(&mut self, now: Instant, m: Msg) {
        let Some(r) = self
            .requests
            .get(&m.req)
            .filter(|r| r.state == ReqState::Pending)
        else {
            tracing::warn!(req = m.req, "ACCEPT of an unknown request");
            self.actions
                .push_back(accepted(m.req, m.dev, m.qpn, ECONNRESET));
            return;
        };
        let (port, local, remote, mac, peer_conn) = (r.port, r.local, r.remote, r.mac, r.peer_conn);
        let pkt = r.pkt.clone();
        let cfg = self.trp_config(port, m.ird, m.ord);
        let (conn, isn) = self.new_ids();
        // The provider builds the same connection from `EVENT CONNECTED`; this one only
        // says whether that will succeed and gives the Accept's bytes, which urdmad sends
        // once the process has the connection. The provider's copy takes it as sent and
        // repeats it until acknowledged.
        let accept =
            match Incoming::parse(&pkt).and_then(|inc| inc.accept(cfg, conn, isn, &m.pdata)) {
                Ok(mut c) => {
                    let mut buf =
                        vec![0u8; usize::from(cfg.max_datagram.max(trp::config::MIN_DATAGRAM))];
                    let n = c.poll_transmit(self.trp_now(now), &trp::VecMemory::new(0), &mut buf);
                    buf.truncate(n.unwrap_or(0));
                    buf
                }
                Err(e) => {
                    tracing::warn!(req = m.req, "ACCEPT refused: {e}");
                    self.actions
                        .push_back(accepted(m.req, m.dev, m.qpn, EINVAL));
                    return;
                }
            };
        let Some(&client) = self.qps.get(&(m.dev, m.qpn)) else {
            tracing::warn!(
                req = m.req,
                dev = m.dev,
                qpn = m.qpn,
                "ACCEPT failed: no process owns the QP"
            );
            self.actions
                .push_back(accepted(m.req, m.dev, m.qpn, ENOTCONN));
            return;
        };
        let connected = Connected {
            dev: m.dev,
            qpn: m.qpn,
            role: Role::Passive,
            port: port as u16,
            local,
            remote,
            mac,
            flow: 0,
            rx_ring: String::new(),
            ird: m.ird,
            ord: m.ord,
            datagram: cfg.max_datagram,
            crc: cfg.crc,
            direct: 0,
            bell: false,
            hush: false,
            stats: None,
            conn,
            isn,
            pdata: m.pdata.clone(),
            pkt,
            accept_sent: true,
            park: false,
            reuse: 0,
        };
        let qp = QpConn {
            client,
            role: Role::Passive,
            port,
            local,
            remote,
            mac,
            peer_conn,
            flow: 0,
            peer_closed_sent: false,
        };
        let handing = Handing::Passive {
            req: m.req,
            conn: qp,
            dev: m.dev,
            qpn: m.qpn,
            accept,
        };
        self.hand_over(client, connected, handing);
    }

    pub(super) fn reject(&mut self, m: Msg) {
        let Some(r) = self.requests.get(&m.req) else {
            tracing::warn!(req = m.req, "REJECT of an unknown request");
            return;
        };
        if r.state != ReqState::Pending {
            return;
        }
        let mut buf = vec![0u8; 1024];
        let Ok(n) = Incoming::parse(&r.pkt).and_then(|inc| inc.reject(&m.pdata, &mut buf)) else {
            return;
        };
        buf.truncate(n);
        let (port, mac, local, remote) = (r.port, r.mac, r.local, r.remote);
        tracing::info!(req = m.req, %remote, "request rejected");
        self.send(port, mac, local, remote, buf.clone());
        self.counters.rejects_sent += 1;
        if let Some(r) = self.requests.get_mut(&m.req) {
            r.state = ReqState::Rejected(buf);
        }
    }
}
