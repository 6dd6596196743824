//! Connection management as a deterministic core (docs/connection.md): listeners, incoming
//! requests, active handshakes (`trp::setup`), connected QPs and their owners.
//!
//! [`Cm`] does no I/O and reads no clock. The daemon (`daemon/connections.rs`) feeds it the
//! kernel's messages, the handshake frames its ports received, its processes' requests and
//! the time, and carries out the [`Action`]s it returns: messages to the kernel, datagrams to
//! send, connections to hand to a process, events to a process, flows to close. Where an
//! action can fail in the daemon's hands (a hand-over, an event a process does not read),
//! the daemon reports the result back ([`Cm::handed_over`], [`Cm::disconnect_undelivered`]),
//! so every decision about a connection's state is taken here and can be tested without
//! root, ports or a kernel module (`cm/tests.rs`).

use crate::cm_channel::{Msg, Op};
use crate::frame;
use crate::proto::{self, Connected, ErrorCode, FlowSpec, Mac, Request, Response, Role};
use crate::status::{self, Record};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};
use trp::setup::{ConnectOutcome, Connecting, Incoming};
use trp::wire::crc;
use trp::wire::trp as tw;

#[cfg(test)]
mod tests;

/// A pending request whose requester has not repeated its ConnectRequest for this long is
/// taken as abandoned (`REQUEST_GONE`, and the application's accept fails). Far longer than
/// the widest gap between two ConnectRequests of [`handshake_timing`] (2 s): a link down
/// for a few seconds while a connection is being made must not end it, any more than it
/// ends a TCP handshake (tests/vm/62-e2e-chaos.sh takes links down for up to 4 s; with 5 s
/// here a 4-s outage plus the requester's back-off made the server's accept fail).
pub const REQUEST_IDLE: Duration = Duration::from_secs(15);

/// Answered (accepted or rejected) requests are remembered this long after their last
/// repetition, so that a repeated ConnectRequest is not a new request.
pub const REQUEST_MEMORY: Duration = Duration::from_secs(60);

/// Requests remembered at most. A ConnectRequest is one datagram whose source anyone can
/// forge, so a flood of them would otherwise grow the table by its rate times
/// [`REQUEST_MEMORY`]. At the bound a new request takes the place of the answered one
/// heard from longest ago (its requester, if it repeats, is then asked about afresh); when
/// every entry still waits for the kernel (which bounds those by each listener's backlog),
/// the new request is dropped unanswered and counted, and a real requester repeats it.
pub const MAX_REQUESTS: usize = 1024;

const ECONNREFUSED: i32 = -111;
const ETIMEDOUT: i32 = -110;
const ECONNRESET: i32 = -104;
const ENOTCONN: i32 = -107;
const EINVAL: i32 = -22;
const EADDRINUSE: i32 = -98;

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

/// What the core knows of one of the daemon's ports.
#[derive(Clone, Debug)]
pub struct PortView {
    /// Its name in status records.
    pub name: String,
    /// Its exception interface, as the kernel names it in `LISTEN` and `CONNECT`.
    pub iface: String,
    /// The largest UDP payload it carries.
    pub datagram: u16,
    /// Whether its connections ask for the CRC32C trailer.
    pub crc: bool,
}

/// What the daemon must do.
#[derive(Debug)]
pub enum Action {
    /// A message to urdma.ko.
    Kernel(Msg),
    /// A datagram of urdmad's own (handshake, Reject, Abort) on a port.
    Datagram {
        port: usize,
        mac: Mac,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        payload: Vec<u8>,
    },
    /// Open the connection's flow for `client` and write it `connected` (with the flow's
    /// fields filled in), then report with [`Cm::handed_over`].
    HandOver(HandOver),
    /// Write `EVENT DISCONNECT` to `client`; report failure with
    /// [`Cm::disconnect_undelivered`].
    Disconnect {
        client: u32,
        dev: u32,
        qpn: u32,
        status: i32,
    },
    /// Close a connection's flow, which `client` owned.
    CloseFlow { client: u32, flow: u32 },
}

/// A connection to hand to the process owning its QP.
#[derive(Debug)]
pub struct HandOver {
    pub token: u64,
    pub client: u32,
    pub spec: FlowSpec,
    /// The event, its `flow`, `rx_ring`, `direct` and `stats` left for the daemon.
    pub connected: Connected,
}

/// The outcome of a hand-over: the flow, or why there is none.
pub type HandOverResult = Result<u32, String>;

struct Listener {
    dev: u32,
    /// The port of the interface it was made on; `None`: every port.
    port: Option<usize>,
    /// `0.0.0.0`: any address of the port.
    addr: Ipv4Addr,
    udp: u16,
}

#[derive(Clone, PartialEq, Eq)]
enum ReqState {
    /// Told the kernel, no answer yet.
    Pending,
    /// Rejected: the Reject datagram, repeated for repeated requests.
    Rejected(Vec<u8>),
    Accepted,
}

struct PendingReq {
    listener: u64,
    port: usize,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    mac: Mac,
    peer_conn: u32,
    /// The ConnectRequest (UDP payload).
    pkt: Vec<u8>,
    state: ReqState,
    last_seen: Instant,
}

/// An active open in progress, by the kernel's connect id.
struct Handshake {
    dev: u32,
    qpn: u32,
    port: usize,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    mac: Mac,
    ird: u16,
    ord: u16,
    pdata: Vec<u8>,
    conn: u32,
    isn: u32,
    connecting: Option<Connecting>,
    sent: u32,
}

/// A connected QP.
struct QpConn {
    client: u32,
    role: Role,
    port: usize,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    mac: Mac,
    peer_conn: u32,
    flow: u32,
    peer_closed_sent: bool,
}

/// A hand-over the daemon is carrying out, and what follows it either way.
enum Handing {
    /// The active side's handshake ended in an Accept carrying the peer's private data.
    Active {
        id: u64,
        conn: QpConn,
        dev: u32,
        qpn: u32,
        ird: u16,
        ord: u16,
        peer_pdata: Vec<u8>,
    },
    /// The kernel accepted request `req`.
    Passive {
        req: u64,
        conn: QpConn,
        dev: u32,
        qpn: u32,
    },
}

/// Counters of what connection management did on its own (status).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub rejects_sent: u64,
    pub aborts_sent: u64,
    /// Frames to a port urdmad uses that are no handshake of a known connection.
    pub strays: u64,
    /// ConnectRequests dropped because [`MAX_REQUESTS`] were pending.
    pub requests_dropped: u64,
}

/// The connection manager's state (module docs).
pub struct Cm {
    ports: Vec<PortView>,
    /// Whether urdma.ko's channel is open: without it no request can be passed on.
    channel: bool,
    listeners: BTreeMap<u64, Listener>,
    requests: BTreeMap<u64, PendingReq>,
    next_req: u64,
    handshakes: BTreeMap<u64, Handshake>,
    /// QP (dev, qpn) → owning client.
    qps: BTreeMap<(u32, u32), u32>,
    conns: BTreeMap<(u32, u32), QpConn>,
    /// Learned from `LISTEN`: which port a device is on.
    dev_port: BTreeMap<u32, usize>,
    handing: BTreeMap<u64, Handing>,
    next_token: u64,
    counters: Counters,
    /// The origin of trp's clock, the first time the core was told.
    clock0: Option<Instant>,
    /// Connection ids and initial sequence numbers: unpredictable in the daemon.
    random: Box<dyn FnMut() -> u32>,
    actions: VecDeque<Action>,
    /// Local UDP ports with a listener, a handshake or a connection.
    udp_ports: BTreeSet<u16>,
}

/// An Abort for the peer's connection `peer_conn`, sealed with the CRC32C trailer: a sealed
/// datagram says so itself, so every peer reads it, whether its connection uses the trailer
/// or not.
pub fn abort_packet(peer_conn: u32) -> Vec<u8> {
    let h = tw::Repr {
        opcode: tw::Opcode::Abort,
        flags: 0,
        dst_conn: peer_conn,
        psn: 0,
        ack_psn: 0,
        window: 0,
        sack: tw::SackRanges::new(),
    };
    let mut b = vec![0u8; h.buffer_len() + crc::TRAILER_LEN];
    h.emit(&mut b);
    crc::seal(&mut b, h.buffer_len());
    b
}

/// The requester's connection id in an Accept.
fn accept_src_conn(pkt: &[u8]) -> Option<u32> {
    let (pkt, _) = crc::open(pkt).ok()?;
    let p = tw::Packet::new_checked(pkt).ok()?;
    let body = trp::wire::handshake::Repr::parse(p.payload()).ok()?;
    Some(body.src_conn)
}

fn kernel_msg(op: Op, f: impl FnOnce(&mut Msg)) -> Action {
    let mut m = Msg::new(op);
    f(&mut m);
    Action::Kernel(m)
}

impl Cm {
    /// A manager for `ports`; `random` gives connection ids and initial sequence numbers.
    pub fn new(ports: Vec<PortView>, random: Box<dyn FnMut() -> u32>) -> Cm {
        Cm {
            ports,
            channel: false,
            listeners: BTreeMap::new(),
            requests: BTreeMap::new(),
            next_req: 0,
            handshakes: BTreeMap::new(),
            qps: BTreeMap::new(),
            conns: BTreeMap::new(),
            dev_port: BTreeMap::new(),
            handing: BTreeMap::new(),
            next_token: 0,
            counters: Counters::default(),
            clock0: None,
            random,
            actions: VecDeque::new(),
            udp_ports: BTreeSet::new(),
        }
    }

    /// The next thing to do, in the order decided.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether urdma.ko's channel is open. Its loss forgets nothing: the kernel's own state
    /// went with it, and what is left ends as processes close their QPs.
    pub fn set_channel(&mut self, open: bool) {
        self.channel = open;
    }

    /// The local UDP ports whose TRP frames that belong to no flow are urdmad's.
    pub fn udp_ports(&self) -> &BTreeSet<u16> {
        &self.udp_ports
    }

    /// Whether an active open waits for its peer (its repetitions need the timer).
    pub fn handshaking(&self) -> bool {
        !self.handshakes.is_empty()
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// When [`Cm::handle_timeout`] has something to do, at the latest.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let hs = self.clock0.and_then(|c0| {
            self.handshakes
                .values()
                .filter_map(|h| h.connecting.as_ref()?.poll_timeout())
                .min()
                .map(|t| c0 + Duration::from_nanos(t.as_nanos()))
        });
        let req = self
            .requests
            .values()
            .map(|r| {
                r.last_seen
                    + if r.state == ReqState::Pending {
                        REQUEST_IDLE
                    } else {
                        REQUEST_MEMORY
                    }
            })
            .min();
        hs.into_iter().chain(req).min()
    }

    fn trp_now(&mut self, now: Instant) -> trp::Instant {
        let c0 = *self.clock0.get_or_insert(now);
        trp::Instant::from_nanos(now.saturating_duration_since(c0).as_nanos() as u64)
    }

    fn refresh_udp_ports(&mut self) {
        self.udp_ports = self
            .listeners
            .values()
            .map(|l| l.udp)
            .chain(self.handshakes.values().map(|h| h.local.port()))
            .chain(self.conns.values().map(|c| c.local.port()))
            .collect();
    }

    fn port_of_iface(&self, ifname: &str) -> Option<usize> {
        self.ports.iter().position(|p| p.iface == ifname)
    }

    fn trp_config(&self, port: usize, ird: u16, ord: u16) -> trp::Config {
        let p = &self.ports[port];
        proto::connection_config(ird, ord, p.datagram, p.crc)
    }

    fn send(
        &mut self,
        port: usize,
        mac: Mac,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        payload: Vec<u8>,
    ) {
        self.actions.push_back(Action::Datagram {
            port,
            mac,
            local,
            remote,
            payload,
        });
    }

    /// A message from urdma.ko. `addr_port` is the port whose interface holds a `CONNECT`'s
    /// local address, when the kernel names no interface (the daemon looks it up).
    pub fn kernel(&mut self, now: Instant, m: Msg, addr_port: Option<usize>) {
        tracing::debug!(op = ?m.op, id = m.id, req = m.req, dev = m.dev, qpn = m.qpn, "from kernel");
        match m.op {
            Op::Listen => self.listen(m),
            Op::Unlisten => {
                self.listeners.remove(&m.id);
                self.refresh_udp_ports();
            }
            Op::Connect => self.connect(now, m, addr_port),
            Op::Accept => self.accept(m),
            Op::Reject => self.reject(m),
            Op::Disconnect => self.disconnect(m),
            other => {
                tracing::warn!(op = ?other, code = m.code, "unexpected message from the kernel")
            }
        }
    }

    fn listen(&mut self, m: Msg) {
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
    }

    fn connect(&mut self, now: Instant, m: Msg, addr_port: Option<usize>) {
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
        let fail = |status: i32| {
            kernel_msg(Op::ConnectFailed, |r| {
                r.id = m.id;
                r.status = status;
                r.dev = m.dev;
                r.qpn = m.qpn;
            })
        };
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
        let conn = loop {
            let c = (self.random)();
            if c != 0 {
                break c;
            }
        };
        let isn = (self.random)();
        let t = self.trp_now(now);
        let connecting = match Connecting::new(handshake_timing(cfg), conn, isn, &m.pdata, t) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(id = m.id, "CONNECT refused: {e}");
                self.actions.push_back(fail(EINVAL));
                return;
            }
        };
        tracing::info!(id = m.id, dev = m.dev, qpn = m.qpn, local = %m.local, remote = %m.remote, conn = format_args!("{conn:#x}"), "connecting");
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
    fn drive_handshake(&mut self, now: Instant, id: u64) {
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
                self.actions.push_back(kernel_msg(Op::ConnectFailed, |r| {
                    r.id = id;
                    r.status = ETIMEDOUT;
                    r.dev = h.dev;
                    r.qpn = h.qpn;
                }));
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
                    self.actions.push_back(kernel_msg(Op::ConnectFailed, |r| {
                        r.id = id;
                        r.status = ECONNREFUSED;
                        r.dev = h.dev;
                        r.qpn = h.qpn;
                        r.pdata = private_data;
                    }));
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
    fn established(&mut self, id: u64, pkt: &[u8], peer_pdata: Vec<u8>, ird: u16, ord: u16) {
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
            stats: None,
            conn: h.conn,
            isn: h.isn,
            pdata: h.pdata.clone(),
            pkt: pkt.to_vec(),
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

    fn hand_over(&mut self, client: u32, connected: Connected, handing: Handing) {
        self.next_token += 1;
        let token = self.next_token;
        let spec = FlowSpec {
            port: connected.port,
            local: connected.local,
            remote: Some(connected.remote),
            remote_mac: Some(connected.mac),
        };
        self.handing.insert(token, handing);
        self.actions.push_back(Action::HandOver(HandOver {
            token,
            client,
            spec,
            connected,
        }));
    }

    /// Aborts what the active side's peer accepted and fails the kernel's connect.
    fn active_failed(&mut self, id: u64, h: &Handshake, peer_conn: u32) {
        self.send(h.port, h.mac, h.local, h.remote, abort_packet(peer_conn));
        self.counters.aborts_sent += 1;
        let (dev, qpn) = (h.dev, h.qpn);
        self.actions.push_back(kernel_msg(Op::ConnectFailed, |r| {
            r.id = id;
            r.status = ECONNRESET;
            r.dev = dev;
            r.qpn = qpn;
        }));
    }

    /// The daemon's report on [`Action::HandOver`] `token`.
    pub fn handed_over(&mut self, token: u64, result: HandOverResult) {
        let Some(handing) = self.handing.remove(&token) else {
            return;
        };
        match (handing, result) {
            (
                Handing::Active {
                    id,
                    mut conn,
                    dev,
                    qpn,
                    ird,
                    ord,
                    peer_pdata,
                },
                Ok(flow),
            ) => {
                conn.flow = flow;
                tracing::info!(id, dev, qpn, client = conn.client, flow, remote = %conn.remote, peer_conn = format_args!("{:#x}", conn.peer_conn), "connected (active)");
                let (local, remote) = (conn.local, conn.remote);
                self.conns.insert((dev, qpn), conn);
                self.refresh_udp_ports();
                self.actions.push_back(kernel_msg(Op::Connected, |r| {
                    r.id = id;
                    r.dev = dev;
                    r.qpn = qpn;
                    r.local = local;
                    r.remote = remote;
                    r.ird = ird;
                    r.ord = ord;
                    r.pdata = peer_pdata;
                }));
            }
            (
                Handing::Active {
                    id, conn, dev, qpn, ..
                },
                Err(why),
            ) => {
                tracing::warn!(id, dev, qpn, "connected, but {why}: aborted");
                self.send(
                    conn.port,
                    conn.mac,
                    conn.local,
                    conn.remote,
                    abort_packet(conn.peer_conn),
                );
                self.counters.aborts_sent += 1;
                self.actions.push_back(kernel_msg(Op::ConnectFailed, |r| {
                    r.id = id;
                    r.status = ECONNRESET;
                    r.dev = dev;
                    r.qpn = qpn;
                }));
            }
            (
                Handing::Passive {
                    req,
                    mut conn,
                    dev,
                    qpn,
                },
                Ok(flow),
            ) => {
                conn.flow = flow;
                tracing::info!(req, dev, qpn, client = conn.client, flow, remote = %conn.remote, peer_conn = format_args!("{:#x}", conn.peer_conn), "connected (passive)");
                if let Some(r) = self.requests.get_mut(&req) {
                    r.state = ReqState::Accepted;
                }
                self.conns.insert((dev, qpn), conn);
                self.refresh_udp_ports();
                self.actions.push_back(accepted(req, dev, qpn, 0));
            }
            (Handing::Passive { req, dev, qpn, .. }, Err(why)) => {
                tracing::warn!(req, dev, qpn, "ACCEPT failed: {why}");
                self.actions.push_back(accepted(req, dev, qpn, ENOTCONN));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
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
        let listener = self
            .listeners
            .iter()
            .filter(|(_, l)| {
                l.udp == local.port()
                    && l.port.is_none_or(|p| p == port)
                    && (l.addr.is_unspecified() || l.addr == *local.ip())
            })
            .max_by_key(|(_, l)| !l.addr.is_unspecified())
            .map(|(&id, l)| (id, l.dev));
        let Some((lid, dev)) = listener.filter(|_| self.channel) else {
            let mut buf = vec![0u8; 512];
            if let Ok(n) = inc.reject(&[], &mut buf) {
                tracing::debug!(%local, %remote, "ConnectRequest with no listener: rejected");
                buf.truncate(n);
                self.send(port, mac, local, remote, buf);
                self.counters.rejects_sent += 1;
            }
            return;
        };
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
        tracing::info!(req, listener = lid, %local, %remote, peer_conn = format_args!("{:#x}", inc.peer_conn()), "connection request");
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
        self.requests.insert(
            req,
            PendingReq {
                listener: lid,
                port,
                local,
                remote,
                mac,
                peer_conn: inc.peer_conn(),
                pkt: pkt.to_vec(),
                state: ReqState::Pending,
                last_seen: now,
            },
        );
    }

    fn accept(&mut self, m: Msg) {
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
        let conn = loop {
            let c = (self.random)();
            if c != 0 {
                break c;
            }
        };
        let isn = (self.random)();
        // The provider repeats this exactly: check that it will succeed.
        if let Err(e) =
            Incoming::parse(&pkt).and_then(|inc| inc.accept(cfg, conn, isn, &m.pdata).map(|_| ()))
        {
            tracing::warn!(req = m.req, "ACCEPT refused: {e}");
            self.actions
                .push_back(accepted(m.req, m.dev, m.qpn, EINVAL));
            return;
        }
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
            stats: None,
            conn,
            isn,
            pdata: m.pdata.clone(),
            pkt,
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
        };
        self.hand_over(client, connected, handing);
    }

    fn reject(&mut self, m: Msg) {
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

    fn disconnect(&mut self, m: Msg) {
        let key = (m.dev, m.qpn);
        if let Some(hid) = self
            .handshakes
            .iter()
            .find(|(_, h)| (h.dev, h.qpn) == key)
            .map(|(&id, _)| id)
        {
            // Not connected yet: the handshake ends here.
            let h = self.handshakes.remove(&hid).expect("present");
            self.refresh_udp_ports();
            self.actions.push_back(kernel_msg(Op::ConnectFailed, |r| {
                r.id = hid;
                r.status = ECONNRESET;
                r.dev = h.dev;
                r.qpn = h.qpn;
            }));
            return;
        }
        let owner = self
            .conns
            .get(&key)
            .map(|c| c.client)
            .or_else(|| self.qps.get(&key).copied());
        match owner {
            Some(client) => self.actions.push_back(Action::Disconnect {
                client,
                dev: m.dev,
                qpn: m.qpn,
                status: m.status,
            }),
            None => self.abort_conn(key, ECONNRESET),
        }
    }

    /// The daemon could not write [`Action::Disconnect`] to its process: urdmad ends the
    /// connection itself.
    pub fn disconnect_undelivered(&mut self, dev: u32, qpn: u32) {
        self.abort_conn((dev, qpn), ECONNRESET);
    }

    /// Ends a connection urdmad has to end itself: Abort to the peer, flow closed,
    /// `CLOSED status` to the kernel.
    fn abort_conn(&mut self, key: (u32, u32), status: i32) {
        let Some(c) = self.conns.remove(&key) else {
            return;
        };
        self.refresh_udp_ports();
        tracing::info!(dev = key.0, qpn = key.1, remote = %c.remote, "connection aborted");
        self.send(c.port, c.mac, c.local, c.remote, abort_packet(c.peer_conn));
        self.counters.aborts_sent += 1;
        self.actions.push_back(Action::CloseFlow {
            client: c.client,
            flow: c.flow,
        });
        self.actions.push_back(kernel_msg(Op::Closed, |r| {
            r.dev = key.0;
            r.qpn = key.1;
            r.status = status;
            r.local = c.local;
            r.remote = c.remote;
        }));
    }

    /// A connection line of the control protocol (`QP`, `UNQP`, `QPCLOSED`, `PEERCLOSED`,
    /// `SYNC`) from `client`; the reply.
    pub fn client_request(&mut self, client: u32, req: &Request) -> Response {
        match *req {
            Request::Qp { dev, qpn } => {
                // A client's QPs go when it does (`client_gone`): another owner is alive.
                if let Some(&other) = self.qps.get(&(dev, qpn)) {
                    if other != client {
                        return Response::Error {
                            code: ErrorCode::Exists,
                            message: format!("QP {qpn} of device {dev} belongs to another process"),
                        };
                    }
                }
                self.qps.insert((dev, qpn), client);
            }
            Request::Unqp { dev, qpn } => {
                if self.qps.get(&(dev, qpn)) == Some(&client) {
                    self.qps.remove(&(dev, qpn));
                }
                if self
                    .conns
                    .get(&(dev, qpn))
                    .is_some_and(|c| c.client == client)
                {
                    self.abort_conn((dev, qpn), ECONNRESET);
                }
            }
            Request::QpClosed { dev, qpn, status }
                if self
                    .conns
                    .get(&(dev, qpn))
                    .is_some_and(|c| c.client == client) =>
            {
                let c = self.conns.remove(&(dev, qpn)).expect("present");
                self.refresh_udp_ports();
                self.actions.push_back(Action::CloseFlow {
                    client,
                    flow: c.flow,
                });
                if !c.peer_closed_sent {
                    self.actions.push_back(kernel_msg(Op::PeerClosed, |r| {
                        r.dev = dev;
                        r.qpn = qpn;
                    }));
                }
                self.actions.push_back(kernel_msg(Op::Closed, |r| {
                    r.dev = dev;
                    r.qpn = qpn;
                    r.status = status.min(0);
                    r.local = c.local;
                    r.remote = c.remote;
                }));
            }
            Request::PeerClosed { dev, qpn } => {
                if let Some(c) = self.conns.get_mut(&(dev, qpn)) {
                    if c.client == client && !c.peer_closed_sent {
                        c.peer_closed_sent = true;
                        self.actions.push_back(kernel_msg(Op::PeerClosed, |r| {
                            r.dev = dev;
                            r.qpn = qpn;
                        }));
                    }
                }
            }
            _ => {}
        }
        Response::Ok
    }

    /// A process detached or went away: its QPs are forgotten and its connections end.
    pub fn client_gone(&mut self, client: u32) {
        self.qps.retain(|_, c| *c != client);
        let mine: Vec<(u32, u32)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.client == client)
            .map(|(&k, _)| k)
            .collect();
        for k in mine {
            self.abort_conn(k, ECONNRESET);
        }
    }

    /// Timers: handshake repetitions and time-outs, request expiry.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Only the handshakes with something due: a burst of connects leaves hundreds of
        // handshakes waiting for their peers, most of them with nothing to send for a
        // second or two, and driving each of them on every tick took most of urdmad's time
        // on a small host (tests/vm/59-e2e-overload.sh, the full case).
        let t = self.trp_now(now);
        let due: Vec<u64> = self
            .handshakes
            .iter()
            .filter(|(_, h)| {
                h.connecting
                    .as_ref()
                    .and_then(|c| c.poll_timeout())
                    .is_some_and(|d| d <= t)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.drive_handshake(now, id);
        }
        let mut gone = Vec::new();
        self.requests.retain(|&req, r| {
            let idle = now.saturating_duration_since(r.last_seen);
            match r.state {
                ReqState::Pending if idle > REQUEST_IDLE => {
                    gone.push((req, r.listener));
                    false
                }
                _ => idle <= REQUEST_MEMORY,
            }
        });
        for (req, listener) in gone {
            tracing::info!(req, "the requester gave up");
            self.actions.push_back(kernel_msg(Op::RequestGone, |m| {
                m.req = req;
                m.id = listener;
            }));
        }
    }

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

fn accepted(req: u64, dev: u32, qpn: u32, status: i32) -> Action {
    kernel_msg(Op::Accepted, |r| {
        r.req = req;
        r.status = status;
        r.dev = dev;
        r.qpn = qpn;
    })
}
