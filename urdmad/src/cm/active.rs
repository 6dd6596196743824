//! The active side: a `CONNECT` from the kernel, the handshake's ConnectRequests and their
//! repetitions, and the peer's Accept or Reject.

use super::{
    connect_failed, Cm, Handing, Handshake, QpConn, EADDRINUSE, ECONNREFUSED, ECONNRESET, EINVAL,
    ETIMEDOUT,
};
use crate::cm::abort_packet;
use crate::cm_channel::Msg;
use crate::frame;
use crate::proto::{Connected, Mac, Role};
use std::time::{Duration, Instant};
use trp::setup::{ConnectOutcome, Connecting, Incoming};
use trp::wire::crc;
use trp::wire::trp as tw;

/// How patiently a ConnectRequest is repeated: 50 ms, doubling up to 2 s, 34 repeats, so
/// about a minute before the connect fails with `-ETIMEDOUT` (urdma.ko's own limit is 90 s).
/// The peer's application must accept within that time, and its first QP may be the one
/// that attaches it to its urdmad (DPDK start-up takes seconds on small machines, tens of
/// seconds under emulation); trp's data-path timers (10 ms, 7 retries) are far too short for
/// that. Only the handshake uses these values: the provider builds the data connection with
/// its own configuration.
pub fn handshake_timing(cfg: trp::Config) -> trp::Config {
    trp::Config {
        initial_rto: Duration::from_millis(50),
        max_rto: Duration::from_secs(2),
        max_retries: 34,
        ..cfg
    }
}

/// The requester's connection id in an Accept.
pub(super) fn accept_src_conn(pkt: &[u8]) -> Option<u32> {
    let (pkt, _) = crc::open(pkt).ok()?;
    let p = tw::Packet::new_checked(pkt).ok()?;
    let body = trp::wire::handshake::Repr::parse(p.payload()).ok()?;
    Some(body.src_conn)
}

impl Cm {
    pub(super) fn connect(&mut self, now: Instant, m: Msg, addr_port: Option<usize>) {
        // The interface when the kernel names it, else the one holding the local address,
        // else the one the device was seen on (LISTEN), else the only one.
        let port = if !m.ifname.is_empty() {
            self.port_of_iface(&m.ifname)
        } else {
            addr_port
                .filter(|&p| p < self.ports.len())
                .or_else(|| self.dev_port.get(&m.dev).copied())
                .or((self.ports.len() == 1).then_some(0))
        };
        let fail = |status: i32| connect_failed(m.id, m.dev, m.qpn, status, Vec::new());
        let Some(port) = port else {
            tracing::warn!(dev = m.dev, "CONNECT: no port for the device");
            self.actions.push_back(fail(ECONNRESET));
            return;
        };
        if self.handshakes.contains_key(&m.id)
            || self
                .handshakes
                .values()
                .any(|h| h.port == port && h.local == m.local && h.remote == m.remote)
        {
            self.actions.push_back(fail(EADDRINUSE));
            return;
        }
        let cfg = self.trp_config(port, m.ird, m.ord);
        let (conn, isn) = self.new_ids();
        let t = self.trp_now(now);
        let connecting = match Connecting::new(handshake_timing(cfg), conn, isn, &m.pdata, t) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(id = m.id, "CONNECT refused: {e}");
                self.actions.push_back(fail(EINVAL));
                return;
            }
        };
        tracing::debug!(id = m.id, dev = m.dev, qpn = m.qpn, local = %m.local, remote = %m.remote, conn = format_args!("{conn:#x}"), "connecting");
        self.handshakes.insert(
            m.id,
            Handshake {
                dev: m.dev,
                qpn: m.qpn,
                port,
                local: m.local,
                remote: m.remote,
                mac: m.remote_mac,
                ird: m.ird,
                ord: m.ord,
                pdata: m.pdata,
                conn,
                isn,
                connecting: Some(connecting),
                sent: 0,
            },
        );
        self.refresh_udp_ports();
        self.drive_handshake(now, m.id);
    }

    /// Sends what a handshake has due and ends it when it timed out.
    pub(super) fn drive_handshake(&mut self, now: Instant, id: u64) {
        let t = self.trp_now(now);
        let Some(h) = self.handshakes.get_mut(&id) else {
            return;
        };
        let Some(c) = h.connecting.take() else { return };
        match c.handle_timeout(t) {
            ConnectOutcome::Pending(mut c) => {
                let mut out = Vec::new();
                let mut buf = vec![0u8; 2048];
                while let Some(n) = c.poll_transmit(t, &mut buf) {
                    out.push(buf[..n].to_vec());
                    if out.len() > 4 {
                        break;
                    }
                }
                h.sent += out.len() as u32;
                h.connecting = Some(c);
                let (port, mac, local, remote) = (h.port, h.mac, h.local, h.remote);
                for d in out {
                    self.send(port, mac, local, remote, d);
                }
            }
            ConnectOutcome::TimedOut => {
                let h = self.handshakes.remove(&id).expect("present");
                tracing::info!(id, remote = %h.remote, "connect timed out");
                self.actions
                    .push_back(connect_failed(id, h.dev, h.qpn, ETIMEDOUT, Vec::new()));
                self.refresh_udp_ports();
            }
            other => {
                // handle_timeout gives only Pending or TimedOut.
                tracing::error!(id, "unexpected handshake outcome {other:?}");
            }
        }
    }

    /// A frame a port received that the daemon's tap took (`Tap::wants`).
    pub fn frame(&mut self, now: Instant, port: usize, frame: &[u8]) {
        let Some(frame::Datagram {
            src: remote,
            dst: local,
            payload,
        }) = frame::datagram(frame)
        else {
            return;
        };
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&frame[6..12]);
        let mac = Mac(mac);
        let hs = self
            .handshakes
            .iter()
            .find(|(_, h)| h.port == port && h.local == local && h.remote == remote)
            .map(|(&id, _)| id);
        if let Some(id) = hs {
            let t = self.trp_now(now);
            let h = self.handshakes.get_mut(&id).expect("present");
            let Some(c) = h.connecting.take() else { return };
            match c.handle_datagram(t, payload) {
                ConnectOutcome::Pending(c) => {
                    h.connecting = Some(c);
                    self.counters.strays += 1;
                }
                ConnectOutcome::Established {
                    private_data,
                    ird,
                    ord,
                    ..
                } => self.established(id, payload, private_data, ird, ord),
                ConnectOutcome::Rejected { private_data } => {
                    let h = self.handshakes.remove(&id).expect("present");
                    tracing::info!(id, remote = %h.remote, "connect rejected");
                    self.actions.push_back(connect_failed(
                        id,
                        h.dev,
                        h.qpn,
                        ECONNREFUSED,
                        private_data,
                    ));
                    self.refresh_udp_ports();
                }
                ConnectOutcome::TimedOut => {}
            }
            return;
        }
        match Incoming::parse(payload) {
            Ok(inc) => self.request(now, port, local, remote, mac, payload, inc),
            Err(_) => self.counters.strays += 1,
        }
    }

    /// The active side's handshake succeeded: hand the connection to the QP's process.
    pub(super) fn established(
        &mut self,
        id: u64,
        pkt: &[u8],
        peer_pdata: Vec<u8>,
        ird: u16,
        ord: u16,
    ) {
        let h = self.handshakes.remove(&id).expect("present");
        self.refresh_udp_ports();
        let peer_conn = accept_src_conn(pkt).unwrap_or(0);
        let (datagram, crc) = (self.ports[h.port].datagram, self.ports[h.port].crc);
        let Some(&client) = self.qps.get(&(h.dev, h.qpn)) else {
            tracing::warn!(
                id,
                dev = h.dev,
                qpn = h.qpn,
                "connected, but no process owns the QP: aborted"
            );
            return self.active_failed(id, &h, peer_conn);
        };
        let connected = Connected {
            dev: h.dev,
            qpn: h.qpn,
            role: Role::Active,
            port: h.port as u16,
            local: h.local,
            remote: h.remote,
            mac: h.mac,
            flow: 0,
            rx_ring: String::new(),
            ird: h.ird,
            ord: h.ord,
            datagram,
            crc,
            direct: 0,
            bell: false,
            hush: false,
            stats: None,
            conn: h.conn,
            isn: h.isn,
            pdata: h.pdata.clone(),
            pkt: pkt.to_vec(),
            accept_sent: false,
            park: false,
            reuse: 0,
        };
        let conn = QpConn {
            client,
            role: Role::Active,
            port: h.port,
            local: h.local,
            remote: h.remote,
            mac: h.mac,
            peer_conn,
            flow: 0,
            peer_closed_sent: false,
        };
        let handing = Handing::Active {
            id,
            conn,
            dev: h.dev,
            qpn: h.qpn,
            ird,
            ord,
            peer_pdata,
        };
        self.hand_over(client, connected, handing);
    }

    /// Aborts what the active side's peer accepted and fails the kernel's connect.
    pub(super) fn active_failed(&mut self, id: u64, h: &Handshake, peer_conn: u32) {
        self.send(
            h.port,
            h.mac,
            h.local,
            h.remote,
            abort_packet(peer_conn, None),
        );
        self.counters.aborts_sent += 1;
        let (dev, qpn) = (h.dev, h.qpn);
        self.actions
            .push_back(connect_failed(id, dev, qpn, ECONNRESET, Vec::new()));
    }
}
