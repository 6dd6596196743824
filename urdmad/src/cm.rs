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
use crate::proto::{self, Connected, FlowSpec, Mac, Role};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};
use trp::setup::Connecting;
use trp::wire::crc;
use trp::wire::trp as tw;

mod active;
mod close;
mod passive;
mod report;
#[cfg(test)]
mod tests;

pub use active::handshake_timing;

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

/// A ConnectRequest that no listener takes waits this long for one before it is refused.
/// `rdma_listen` returns before urdmad has read the kernel's `LISTEN`, and a server that
/// listens again after each accept (perftest's `-R`) does so while its first client is
/// already connecting again: a request that came a moment early would otherwise be refused
/// for a listen the application had made, or was about to make. Only a refusal waits for it.
/// On a loaded two-vCPU guest perftest's listen came 260 ms after its client's request,
/// and CI's hosts are at times three times slower.
pub const LISTEN_GRACE: Duration = Duration::from_secs(1);

const ECONNREFUSED: i32 = -111;
const ETIMEDOUT: i32 = -110;
const ECONNRESET: i32 = -104;
const ENOTCONN: i32 = -107;
const EINVAL: i32 = -22;
const EADDRINUSE: i32 = -98;

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
    /// An Abort to the peer of a connection urdmad ends itself, before its `flow` closes:
    /// [`abort_packet`] with what the flow's process said it received
    /// (`crate::qpstats::Slot::received`), which the peer completes rather than flushes.
    Abort {
        port: usize,
        mac: Mac,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        peer_conn: u32,
        flow: u32,
    },
    /// Close a connection's flow, which `client` owned.
    CloseFlow { client: u32, flow: u32 },
    /// Take the flow of a connection urdmad ended while its process still has it off the
    /// wire (nothing reaches it any more), but keep what the process reads (the ring, the
    /// figures slot) until it lets the QP go: a later `CloseFlow` of the same flow, or the
    /// process's end.
    RetireFlow { client: u32, flow: u32 },
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
    /// No listener has taken it yet: refused at the instant unless one comes first
    /// ([`LISTEN_GRACE`]).
    Unheard(Instant),
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
    /// The kernel accepted request `req`; `accept` is the Accept datagram to send once the
    /// process has the connection.
    Passive {
        req: u64,
        conn: QpConn,
        dev: u32,
        qpn: u32,
        accept: Vec<u8>,
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
    /// No request's timer is due before this (None: no request). A bound, made exact by
    /// [`Cm::handle_timeout`]: the table holds up to [`MAX_REQUESTS`] answered requests for a
    /// minute, and walking it for every [`Cm::poll_timeout`], which urdmad asks on each
    /// pass of its loop, took about 1 ms of CPU per connection under emulation in a loop of
    /// connections. A timer only goes later once set, but for a request's first.
    requests_due: Option<Instant>,
    next_req: u64,
    handshakes: BTreeMap<u64, Handshake>,
    /// QP (dev, qpn) → owning client.
    qps: BTreeMap<(u32, u32), u32>,
    conns: BTreeMap<(u32, u32), QpConn>,
    /// QP (dev, qpn) → (client, flow): connections urdmad ended while their process may
    /// still read the flow ([`Action::RetireFlow`]).
    retired: BTreeMap<(u32, u32), (u32, u32)>,
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
/// or not. With `received`, the end of what our side of the connection received: the
/// Abort acknowledges it (`FLAG_ACKS`). Without, its ACK fields are not read.
pub fn abort_packet(peer_conn: u32, received: Option<u32>) -> Vec<u8> {
    let h = tw::Repr {
        opcode: tw::Opcode::Abort,
        flags: if received.is_some() { tw::FLAG_ACKS } else { 0 },
        dst_conn: peer_conn,
        psn: 0,
        ack_psn: received.unwrap_or(0),
        window: 0,
        sack: tw::SackRanges::new(),
    };
    let mut b = vec![0u8; h.buffer_len() + crc::TRAILER_LEN];
    h.emit(&mut b);
    crc::seal(&mut b, h.buffer_len());
    b
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
            requests_due: None,
            next_req: 0,
            handshakes: BTreeMap::new(),
            qps: BTreeMap::new(),
            conns: BTreeMap::new(),
            retired: BTreeMap::new(),
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
        hs.into_iter().chain(self.requests_due).min()
    }

    /// A request's first timer: the bound [`Cm::requests_due`] comes down to it if need be.
    fn request_due_by(&mut self, t: Instant) {
        self.requests_due = Some(self.requests_due.map_or(t, |d| d.min(t)));
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

    /// A new connection's id (never 0: no connection has it) and initial sequence number.
    fn new_ids(&mut self) -> (u32, u32) {
        let conn = loop {
            let c = (self.random)();
            if c != 0 {
                break c;
            }
        };
        (conn, (self.random)())
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
            Op::Listen => self.listen(now, m),
            Op::Unlisten => {
                self.listeners.remove(&m.id);
                self.refresh_udp_ports();
            }
            Op::Connect => self.connect(now, m, addr_port),
            Op::Accept => self.accept(now, m),
            Op::Reject => self.reject(m),
            Op::Disconnect => self.disconnect(m),
            other => {
                tracing::warn!(op = ?other, code = m.code, "unexpected message from the kernel")
            }
        }
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
                tracing::debug!(id, dev, qpn, client = conn.client, flow, remote = %conn.remote, peer_conn = format_args!("{:#x}", conn.peer_conn), "connected (active)");
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
                    abort_packet(conn.peer_conn, None),
                );
                self.counters.aborts_sent += 1;
                self.actions
                    .push_back(connect_failed(id, dev, qpn, ECONNRESET, Vec::new()));
            }
            (
                Handing::Passive {
                    req,
                    mut conn,
                    dev,
                    qpn,
                    accept,
                },
                Ok(flow),
            ) => {
                conn.flow = flow;
                tracing::debug!(req, dev, qpn, client = conn.client, flow, remote = %conn.remote, peer_conn = format_args!("{:#x}", conn.peer_conn), "connected (passive)");
                // The process has the connection: its flow is open and `EVENT CONNECTED`
                // written. The requester may start now, and waits for no wake-up of the
                // process (docs/connection.md, "Where the handshake runs").
                if !accept.is_empty() {
                    self.send(conn.port, conn.mac, conn.local, conn.remote, accept);
                }
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
        let mut unheard = Vec::new();
        self.requests.retain(|&req, r| {
            let idle = now.saturating_duration_since(r.last_seen);
            match r.state {
                ReqState::Unheard(until) if now >= until => {
                    unheard.push((r.port, r.mac, r.local, r.remote, std::mem::take(&mut r.pkt)));
                    false
                }
                ReqState::Unheard(_) => true,
                ReqState::Pending if idle > REQUEST_IDLE => {
                    gone.push((req, r.listener));
                    false
                }
                _ => idle <= REQUEST_MEMORY,
            }
        });
        self.requests_due = self
            .requests
            .values()
            .map(|r| match r.state {
                ReqState::Unheard(until) => until,
                ReqState::Pending => r.last_seen + REQUEST_IDLE,
                ReqState::Rejected(_) | ReqState::Accepted => r.last_seen + REQUEST_MEMORY,
            })
            .min();
        for (port, mac, local, remote, pkt) in unheard {
            if let Ok(inc) = trp::setup::Incoming::parse(&pkt) {
                self.refuse(port, mac, local, remote, &inc);
            }
        }
        for (req, listener) in gone {
            tracing::info!(req, "the requester gave up");
            self.actions.push_back(kernel_msg(Op::RequestGone, |m| {
                m.req = req;
                m.id = listener;
            }));
        }
    }
}

/// `CONNECT_FAILED status` for the kernel's connect `id` of QP (dev, qpn).
fn connect_failed(id: u64, dev: u32, qpn: u32, status: i32, pdata: Vec<u8>) -> Action {
    kernel_msg(Op::ConnectFailed, |r| {
        r.id = id;
        r.status = status;
        r.dev = dev;
        r.qpn = qpn;
        r.pdata = pdata;
    })
}

fn accepted(req: u64, dev: u32, qpn: u32, status: i32) -> Action {
    kernel_msg(Op::Accepted, |r| {
        r.req = req;
        r.status = status;
        r.dev = dev;
        r.qpn = qpn;
    })
}
