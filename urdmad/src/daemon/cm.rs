//! Connection management in the daemon (docs/connection.md): the kernel channel, listeners,
//! incoming requests, active handshakes (`trp::setup`), connected QPs and their owners.
//!
//! A submodule of `daemon`, so that it works on the daemon's own state.

use super::{Daemon, FlowSpecOpened};
use crate::cm_channel::{Channel, Msg, Op};
use crate::frame;
use crate::proto::{self, Connected, Event, FlowSpec, Mac, Role};
use crate::status::{self, Record};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};
use trp::setup::{ConnectOutcome, Connecting, Incoming};
use trp::wire::crc;
use trp::wire::trp as tw;

/// Which way a connection's frames go after hand-over: a packet socket of the process's own
/// (the direct path), or through urdmad's rings. Logged with the connection, as the two
/// behave differently under load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Direct,
    Forwarded,
}

impl Path {
    fn as_str(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Forwarded => "forwarded",
        }
    }
}

/// Why a connected QP's flow was not handed to its process.
#[derive(Debug, thiserror::Error)]
enum HandOverError {
    #[error("no process owns the QP")]
    NoOwner,
    #[error("the QP's process is gone")]
    OwnerGone,
    #[error("the QP's process is not attached")]
    NotAttached,
    /// The daemon's error reply to opening the flow.
    #[error("flow not opened: {}", .reply.encode().trim_end())]
    FlowNotOpened { reply: proto::Response },
    #[error("the QP's process does not read its socket ({0})")]
    NotReading(std::io::Error),
}

/// A pending request whose requester has not repeated its ConnectRequest for this long is
/// taken as abandoned (`REQUEST_GONE`, and the application's accept fails). Far longer than
/// the widest gap between two ConnectRequests of [`handshake_timing`] (2 s): a link down
/// for a few seconds while a connection is being made must not end it, any more than it
/// ends a TCP handshake (tests/vm/62-e2e-chaos.sh takes links down for up to 4 s; with 5 s
/// here a 4-s outage plus the requester's back-off made the server's accept fail).
const REQUEST_IDLE: Duration = Duration::from_secs(15);

/// How patiently a ConnectRequest is repeated: 50 ms, doubling up to 2 s, 34 repeats, so
/// about a minute before the connect fails with `-ETIMEDOUT` (urdma.ko's own limit is 90 s). The peer's application must
/// accept within that time, and its first QP may be the one that attaches it to its urdmad
/// (DPDK start-up takes seconds on small machines, tens of seconds under emulation); trp's data-path timers
/// (10 ms, 7 retries) are far too short for that. Only the handshake uses these values:
/// the provider builds the data connection with its own configuration.
fn handshake_timing(cfg: trp::Config) -> trp::Config {
    trp::Config {
        initial_rto: Duration::from_millis(50),
        max_rto: Duration::from_secs(2),
        max_retries: 34,
        ..cfg
    }
}
/// Answered (accepted or rejected) requests are remembered this long after their last
/// repetition, so that a repeated ConnectRequest is not a new request.
const REQUEST_MEMORY: Duration = Duration::from_secs(60);
/// Requests remembered at most. A ConnectRequest is one datagram whose source anyone can
/// forge, so a flood of them would otherwise grow the table by its rate times
/// [`REQUEST_MEMORY`]. At the bound a new request takes the place of the answered one
/// heard from longest ago (its requester, if it repeats, is then asked about afresh); when
/// every entry still waits for the kernel (which bounds those by each listener's backlog),
/// the new request is dropped unanswered and counted, and a real requester repeats it.
pub(super) const MAX_REQUESTS: usize = 1024;
const ECONNREFUSED: i32 = -111;
const ETIMEDOUT: i32 = -110;
const ECONNRESET: i32 = -104;
const ENOTCONN: i32 = -107;
const EINVAL: i32 = -22;
const EADDRINUSE: i32 = -98;

pub(super) struct Listener {
    pub id: u64,
    pub dev: u32,
    /// The port (index) of the interface it was made on; `None`: every port.
    pub port: Option<usize>,
    /// `0.0.0.0`: any address of the port.
    pub addr: Ipv4Addr,
    pub udp: u16,
}

#[derive(Clone, PartialEq, Eq)]
pub(super) enum ReqState {
    /// Told the kernel, no answer yet.
    Pending,
    /// Rejected: the Reject datagram, repeated for repeated requests.
    Rejected(Vec<u8>),
    Accepted,
}

pub(super) struct PendingReq {
    pub listener: u64,
    pub port: usize,
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
    pub mac: Mac,
    pub peer_conn: u32,
    /// The ConnectRequest (UDP payload).
    pub pkt: Vec<u8>,
    pub state: ReqState,
    pub last_seen: Instant,
}

/// An active open in progress.
pub(super) struct Handshake {
    pub dev: u32,
    pub qpn: u32,
    pub port: usize,
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
    pub mac: Mac,
    pub ird: u16,
    pub ord: u16,
    pub pdata: Vec<u8>,
    pub conn: u32,
    pub isn: u32,
    pub connecting: Option<Connecting>,
    pub sent: u32,
}

/// A connected QP.
pub(super) struct QpConn {
    pub client: u32,
    pub role: Role,
    pub port: usize,
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
    pub mac: Mac,
    pub peer_conn: u32,
    pub flow: u32,
    pub peer_closed_sent: bool,
}

/// What the receive path needs to pick the connection-management frames out of what would
/// go to the kernel.
#[derive(Default)]
pub(super) struct Tap {
    pub enabled: bool,
    /// Local UDP ports with a listener, a handshake or a connection: TRP frames to them
    /// that belong to no flow are urdmad's (dropped unless they are handshake frames).
    pub ports: BTreeSet<u16>,
    /// Frames taken, by port index, to handle between bursts.
    pub frames: Vec<(usize, Vec<u8>)>,
    /// Each port's MAC: only frames to it are urdmad's (a promiscuous port sees others).
    pub macs: Vec<[u8; 6]>,
}

impl Tap {
    /// Whether a frame that belongs to no flow is urdmad's: a TRP ConnectRequest to any
    /// port, or a TRP frame to a port urdmad uses for connections. Everything else goes to
    /// the kernel as before.
    pub fn wants(&self, port: usize, frame: &[u8]) -> bool {
        if !self.enabled || frame.get(..6) != self.macs.get(port).map(|m| &m[..]) {
            return false;
        }
        let Some(frame::Datagram { dst, payload, .. }) = frame::datagram(frame) else {
            return false;
        };
        let pkt = tw::Packet::new_unchecked(payload);
        let Ok(h) = tw::Repr::parse(&pkt) else {
            return false;
        };
        if h.opcode == tw::Opcode::ConnectRequest {
            return Incoming::parse(payload).is_ok();
        }
        self.ports.contains(&dst.port())
    }
}

#[derive(Default)]
pub(super) struct Cm {
    pub chan: Option<Channel>,
    pub listeners: BTreeMap<u64, Listener>,
    pub requests: BTreeMap<u64, PendingReq>,
    pub next_req: u64,
    /// By the kernel's connect id.
    pub handshakes: BTreeMap<u64, Handshake>,
    /// QP (dev, qpn) → owning client.
    pub qps: BTreeMap<(u32, u32), u32>,
    pub conns: BTreeMap<(u32, u32), QpConn>,
    /// Learned from `LISTEN`: which port a device is on.
    pub dev_port: BTreeMap<u32, usize>,
    pub tap: Tap,
    pub rejects_sent: u64,
    pub aborts_sent: u64,
    pub strays: u64,
    /// ConnectRequests dropped because [`MAX_REQUESTS`] were pending.
    pub requests_dropped: u64,
    pub clock0: Option<Instant>,
    /// Without the channel: when to try opening it again ([`CHANNEL_RETRY`]).
    pub next_open: Option<Instant>,
}

/// How often urdmad looks for the connection channel while it has none (urdma.ko not loaded
/// yet when urdmad started): connection management starts within this of the module's load.
pub(super) const CHANNEL_RETRY: Duration = Duration::from_secs(1);

/// A random u32 (never 0 when `nonzero`).
fn random_u32(nonzero: bool) -> u32 {
    loop {
        let mut b = [0u8; 4];
        // SAFETY: writes at most 4 bytes into b.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
        let v = if n == 4 {
            u32::from_ne_bytes(b)
        } else {
            // Not expected on Linux >= 3.17; a time-based value still differs per call.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.subsec_nanos());
            t ^ std::process::id().rotate_left(16)
        };
        if v != 0 || !nonzero {
            return v;
        }
    }
}

/// An Abort for the peer's connection `peer_conn`, sealed with the CRC32C trailer: a sealed
/// datagram says so itself, so every peer reads it, whether its connection uses the trailer
/// or not.
fn abort_packet(peer_conn: u32) -> Vec<u8> {
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

impl Daemon {
    fn trp_now(&mut self) -> trp::Instant {
        let c0 = *self.cm.clock0.get_or_insert_with(Instant::now);
        trp::Instant::from_nanos(c0.elapsed().as_nanos() as u64)
    }

    /// Opens the kernel channel and registers every port's exception interface. Without it
    /// (urdma.ko not loaded yet) urdmad serves what needs no connection management and tries
    /// again every [`CHANNEL_RETRY`] (`cm_retry`), saying so once.
    pub(super) fn cm_open(&mut self) {
        let path = self.cfg.daemon.cm_device.clone();
        let first = self.cm.next_open.is_none();
        let opened = if path.exists() {
            Channel::open(&path).map_err(|e| format!("cannot open it: {e}"))
        } else {
            Err("no such device (is urdma.ko loaded?)".to_string())
        };
        let chan = match opened {
            Ok(c) => c,
            Err(why) => {
                if first {
                    tracing::warn!(device = %path.display(),
                        "no connection channel: {why}; running without connection management until it opens (tried every {CHANNEL_RETRY:?})");
                }
                self.cm.next_open = Some(Instant::now() + CHANNEL_RETRY);
                return;
            }
        };
        self.cm.next_open = None;
        let socket = std::path::absolute(&self.cfg.daemon.socket)
            .unwrap_or_else(|_| self.cfg.daemon.socket.clone());
        for p in &self.ports {
            let mut m = Msg::new(Op::Register);
            m.ifname = p.port.exception_name.clone();
            m.socket_path = socket.to_string_lossy().into_owned();
            if let Err(e) = chan.send(&m) {
                tracing::error!(iface = %m.ifname, "REGISTER failed: {e}");
            }
        }
        tracing::info!(device = %path.display(), ports = self.ports.len(), "connection channel open");
        self.cm.chan = Some(chan);
        // A new channel starts without counters: they go again at the next push.
        for p in &mut self.ports {
            p.pushed = None;
        }
        self.cm.tap.macs = self.ports.iter().map(|p| p.port.mac.0).collect();
        self.cm.tap.enabled = true;
    }

    /// Tries the channel again when it is due ([`Daemon::cm_open`]).
    pub(super) fn cm_retry(&mut self) {
        if self.cm.chan.is_none() && self.cm.next_open.is_some_and(|t| Instant::now() >= t) {
            self.cm_open();
        }
    }

    pub(super) fn kernel_send(&mut self, m: Msg) {
        if let Some(c) = &self.cm.chan {
            tracing::debug!(op = ?m.op, id = m.id, req = m.req, status = m.status, "to kernel");
            if let Err(e) = c.send(&m) {
                tracing::error!(op = ?m.op, "cannot write to the connection channel: {e}");
            }
        }
    }

    /// Reads what the kernel sent (bounded per call).
    pub(super) fn cm_read_kernel(&mut self) -> usize {
        let mut n = 0;
        while n < 64 {
            let Some(chan) = &self.cm.chan else { break };
            match chan.recv() {
                Ok(Some(m)) => {
                    n += 1;
                    self.cm_kernel_msg(m);
                }
                Ok(None) => break,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    tracing::warn!("connection channel: {e}");
                }
                Err(e) => {
                    tracing::error!("connection channel lost: {e}; connection management stops");
                    self.cm.chan = None;
                    self.cm.tap.enabled = false;
                    break;
                }
            }
        }
        n
    }

    fn refresh_tap_ports(&mut self) {
        let cm = &mut self.cm;
        cm.tap.ports = cm
            .listeners
            .values()
            .map(|l| l.udp)
            .chain(cm.handshakes.values().map(|h| h.local.port()))
            .chain(cm.conns.values().map(|c| c.local.port()))
            .collect();
    }

    fn port_of_iface(&self, ifname: &str) -> Option<usize> {
        self.ports
            .iter()
            .position(|p| p.port.exception_name == ifname)
    }

    /// The port whose exception interface has IPv4 address `ip` (in urdmad's namespace).
    fn port_of_addr(&self, ip: Ipv4Addr) -> Option<usize> {
        let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills a list we free below.
        if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
            return None;
        }
        let mut found = None;
        let mut cur = ifs;
        // SAFETY: walking the list getifaddrs returned; sockaddr_in for AF_INET entries.
        unsafe {
            while !cur.is_null() {
                let a = (*cur).ifa_addr;
                if !a.is_null() && i32::from((*a).sa_family) == libc::AF_INET {
                    let sin = &*(a as *const libc::sockaddr_in);
                    if Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()) == ip {
                        let name = std::ffi::CStr::from_ptr((*cur).ifa_name).to_string_lossy();
                        found = self.port_of_iface(&name);
                        if found.is_some() {
                            break;
                        }
                    }
                }
                cur = (*cur).ifa_next;
            }
            libc::freeifaddrs(ifs);
        }
        found
    }

    fn port_datagram(&self, port: usize) -> u16 {
        let mut mtu = 0u16;
        // SAFETY: valid port and out-pointer.
        let rc = unsafe { dpdk_sys::rte_eth_dev_get_mtu(self.ports[port].port.id, &mut mtu) };
        if rc != 0 || mtu < 576 {
            mtu = 1500;
        }
        mtu - 28
    }

    fn trp_config(&self, port: usize, ird: u16, ord: u16) -> trp::Config {
        let crc = self.port_crc(port);
        crate::proto::connection_config(ird, ord, self.port_datagram(port), crc)
    }

    /// Whether connections through `port` ask for the CRC32C trailer.
    fn port_crc(&self, port: usize) -> bool {
        self.cfg.ports.get(port).is_none_or(|p| p.crc)
    }

    fn cm_kernel_msg(&mut self, m: Msg) {
        tracing::debug!(op = ?m.op, id = m.id, req = m.req, dev = m.dev, qpn = m.qpn, "from kernel");
        match m.op {
            Op::Listen => {
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
                    self.cm.dev_port.insert(m.dev, p);
                }
                tracing::info!(id = m.id, dev = m.dev, local = %m.local, "listening");
                self.cm.listeners.insert(
                    m.id,
                    Listener {
                        id: m.id,
                        dev: m.dev,
                        port,
                        addr: *m.local.ip(),
                        udp: m.local.port(),
                    },
                );
                self.refresh_tap_ports();
            }
            Op::Unlisten => {
                self.cm.listeners.remove(&m.id);
                self.refresh_tap_ports();
            }
            Op::Connect => self.cm_connect(m),
            Op::Accept => self.cm_accept(m),
            Op::Reject => self.cm_reject(m),
            Op::Disconnect => self.cm_disconnect(m),
            other => {
                tracing::warn!(op = ?other, code = m.code, "unexpected message from the kernel")
            }
        }
    }

    fn cm_connect(&mut self, m: Msg) {
        // The interface when the kernel names it, else the one holding the local address,
        // else the one the device was seen on (LISTEN), else the only one.
        let port = if !m.ifname.is_empty() {
            self.port_of_iface(&m.ifname)
        } else if let Some(p) = self.port_of_addr(*m.local.ip()) {
            Some(p)
        } else if let Some(&p) = self.cm.dev_port.get(&m.dev) {
            Some(p)
        } else if self.ports.len() == 1 {
            Some(0)
        } else {
            None
        };
        let fail = |d: &mut Daemon, status: i32| {
            let mut r = Msg::new(Op::ConnectFailed);
            r.id = m.id;
            r.status = status;
            r.dev = m.dev;
            r.qpn = m.qpn;
            d.kernel_send(r);
        };
        let Some(port) = port else {
            tracing::warn!(dev = m.dev, "CONNECT: no port for the device");
            return fail(self, ECONNRESET);
        };
        if self.cm.handshakes.contains_key(&m.id)
            || self
                .cm
                .handshakes
                .values()
                .any(|h| h.port == port && h.local == m.local && h.remote == m.remote)
        {
            return fail(self, EADDRINUSE);
        }
        let cfg = self.trp_config(port, m.ird, m.ord);
        let conn = random_u32(true);
        let isn = random_u32(false);
        let now = self.trp_now();
        let connecting = match Connecting::new(handshake_timing(cfg), conn, isn, &m.pdata, now) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(id = m.id, "CONNECT refused: {e}");
                return fail(self, EINVAL);
            }
        };
        tracing::info!(id = m.id, dev = m.dev, qpn = m.qpn, local = %m.local, remote = %m.remote, conn = format_args!("{conn:#x}"), "connecting");
        self.cm.handshakes.insert(
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
        self.refresh_tap_ports();
        self.drive_handshake(m.id);
    }

    /// Sends what a handshake has due and ends it when it timed out.
    fn drive_handshake(&mut self, id: u64) {
        let now = self.trp_now();
        let Some(h) = self.cm.handshakes.get_mut(&id) else {
            return;
        };
        let Some(c) = h.connecting.take() else { return };
        match c.handle_timeout(now) {
            ConnectOutcome::Pending(mut c) => {
                let mut out = Vec::new();
                let mut buf = vec![0u8; 2048];
                while let Some(n) = c.poll_transmit(now, &mut buf) {
                    out.push(buf[..n].to_vec());
                    if out.len() > 4 {
                        break;
                    }
                }
                h.sent += out.len() as u32;
                h.connecting = Some(c);
                let (port, mac, local, remote) = (h.port, h.mac, h.local, h.remote);
                for d in out {
                    self.send_datagram(port, mac, local, remote, &d);
                }
            }
            ConnectOutcome::TimedOut => {
                let h = self.cm.handshakes.remove(&id).expect("present");
                tracing::info!(id, remote = %h.remote, "connect timed out");
                let mut r = Msg::new(Op::ConnectFailed);
                r.id = id;
                r.status = ETIMEDOUT;
                r.dev = h.dev;
                r.qpn = h.qpn;
                self.kernel_send(r);
                self.refresh_tap_ports();
            }
            other => {
                // handle_timeout gives only Pending or TimedOut.
                tracing::error!(id, "unexpected handshake outcome {other:?}");
            }
        }
    }

    /// Handles the connection-management frames the receive path took.
    pub(super) fn cm_frames(&mut self) -> usize {
        let mut done = 0;
        // Handling may send frames that loop back to this node; bounded rounds.
        for _ in 0..8 {
            let frames = std::mem::take(&mut self.cm.tap.frames);
            if frames.is_empty() {
                break;
            }
            done += frames.len();
            for (port, f) in frames {
                self.cm_frame(port, &f);
            }
        }
        done
    }

    fn cm_frame(&mut self, port: usize, frame: &[u8]) {
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
            .cm
            .handshakes
            .iter()
            .find(|(_, h)| h.port == port && h.local == local && h.remote == remote)
            .map(|(&id, _)| id);
        if let Some(id) = hs {
            let now = self.trp_now();
            let h = self.cm.handshakes.get_mut(&id).expect("present");
            let Some(c) = h.connecting.take() else { return };
            match c.handle_datagram(now, payload) {
                ConnectOutcome::Pending(c) => {
                    h.connecting = Some(c);
                    self.cm.strays += 1;
                }
                ConnectOutcome::Established {
                    private_data,
                    ird,
                    ord,
                    ..
                } => self.established(id, payload, private_data, ird, ord),
                ConnectOutcome::Rejected { private_data } => {
                    let h = self.cm.handshakes.remove(&id).expect("present");
                    tracing::info!(id, remote = %h.remote, "connect rejected");
                    let mut r = Msg::new(Op::ConnectFailed);
                    r.id = id;
                    r.status = ECONNREFUSED;
                    r.dev = h.dev;
                    r.qpn = h.qpn;
                    r.pdata = private_data;
                    self.kernel_send(r);
                    self.refresh_tap_ports();
                }
                ConnectOutcome::TimedOut => {}
            }
            return;
        }
        match Incoming::parse(payload) {
            Ok(inc) => self.cm_request(port, local, remote, mac, payload, inc),
            Err(_) => self.cm.strays += 1,
        }
    }

    /// The active side's handshake succeeded: hand the connection to the QP's process.
    fn established(&mut self, id: u64, pkt: &[u8], peer_pdata: Vec<u8>, ird: u16, ord: u16) {
        let h = self.cm.handshakes.remove(&id).expect("present");
        self.refresh_tap_ports();
        let peer_conn = accept_src_conn(pkt).unwrap_or(0);
        let datagram = self.port_datagram(h.port);
        let crc = self.port_crc(h.port);
        let spec = FlowSpec {
            port: h.port as u16,
            local: h.local,
            remote: Some(h.remote),
            remote_mac: Some(h.mac),
        };
        let ev = |o: &FlowSpecOpened| {
            Event::Connected(Box::new(Connected {
                dev: h.dev,
                qpn: h.qpn,
                role: Role::Active,
                port: h.port as u16,
                local: h.local,
                remote: h.remote,
                mac: h.mac,
                flow: o.flow,
                rx_ring: o.rx_ring.clone(),
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
            }))
        };
        match self.hand_over(h.dev, h.qpn, &spec, ev) {
            Ok((client, flow, path)) => {
                tracing::info!(id, dev = h.dev, qpn = h.qpn, client, flow, remote = %h.remote, conn = format_args!("{:#x}", h.conn), peer_conn = format_args!("{peer_conn:#x}"), path = path.as_str(), "connected (active)");
                self.cm.conns.insert(
                    (h.dev, h.qpn),
                    QpConn {
                        client,
                        role: Role::Active,
                        port: h.port,
                        local: h.local,
                        remote: h.remote,
                        mac: h.mac,
                        peer_conn,
                        flow,
                        peer_closed_sent: false,
                    },
                );
                self.refresh_tap_ports();
                let mut r = Msg::new(Op::Connected);
                r.id = id;
                r.dev = h.dev;
                r.qpn = h.qpn;
                r.local = h.local;
                r.remote = h.remote;
                r.ird = ird;
                r.ord = ord;
                r.pdata = peer_pdata;
                self.kernel_send(r);
            }
            Err(why) => {
                tracing::warn!(
                    id,
                    dev = h.dev,
                    qpn = h.qpn,
                    "connected, but {why}: aborted"
                );
                self.send_datagram(h.port, h.mac, h.local, h.remote, &abort_packet(peer_conn));
                self.cm.aborts_sent += 1;
                let mut r = Msg::new(Op::ConnectFailed);
                r.id = id;
                r.status = ECONNRESET;
                r.dev = h.dev;
                r.qpn = h.qpn;
                self.kernel_send(r);
            }
        }
    }

    /// Opens the flow for the process owning QP (dev, qpn) and writes it the event made by
    /// `ev`. The owning client's id, the flow and the path its frames take, or why not.
    fn hand_over(
        &mut self,
        dev: u32,
        qpn: u32,
        spec: &FlowSpec,
        ev: impl FnOnce(&FlowSpecOpened) -> Event,
    ) -> Result<(u32, u32, Path), HandOverError> {
        let Some(&client) = self.cm.qps.get(&(dev, qpn)) else {
            return Err(HandOverError::NoOwner);
        };
        let Some(i) = self.clients.iter().position(|c| c.id == client) else {
            return Err(HandOverError::OwnerGone);
        };
        if self.clients[i].attached.is_none() {
            return Err(HandOverError::NotAttached);
        }
        let opened = self
            .open_flow(i, spec)
            .map_err(|reply| HandOverError::FlowNotOpened { reply })?;
        let mut event = ev(&opened);
        let mut direct = None;
        if let Event::Connected(c) = &mut event {
            // The rings are sized for the datagram the event announces.
            direct = self.direct_open(opened.flow, spec, c.datagram);
            c.direct = direct.map_or(0, |(_, frames)| frames);
            c.stats = self.qp_table.take();
            if let Some(rec) = self.flows.get_mut(&opened.flow) {
                rec.stats = c.stats;
            }
            if c.stats.is_none() {
                tracing::warn!(
                    flow = opened.flow,
                    "every slot of the QP figures is taken: this connection has none"
                );
            }
        }
        let text = event.encode();
        if let Err(e) = self.send_with(i, &text, direct.map(|(fd, _)| fd)) {
            self.close_flow(opened.flow);
            self.clients[i].flows.retain(|&f| f != opened.flow);
            return Err(HandOverError::NotReading(e));
        }
        let path = if direct.is_some() {
            Path::Direct
        } else {
            Path::Forwarded
        };
        if let (Event::Connected(_), Some(p)) = (&event, self.ports.get_mut(usize::from(spec.port)))
        {
            match path {
                Path::Direct => p.conns_direct += 1,
                Path::Forwarded => p.conns_forwarded += 1,
            }
        }
        Ok((client, opened.flow, path))
    }

    fn cm_request(
        &mut self,
        port: usize,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        mac: Mac,
        pkt: &[u8],
        inc: Incoming,
    ) {
        let now = Instant::now();
        let known = self.cm.requests.iter_mut().find(|(_, r)| {
            r.port == port
                && r.local == local
                && r.remote == remote
                && r.peer_conn == inc.peer_conn()
        });
        if let Some((_, r)) = known {
            r.last_seen = now;
            if let ReqState::Rejected(bytes) = &r.state {
                let bytes = bytes.clone();
                self.send_datagram(port, mac, local, remote, &bytes);
                self.cm.rejects_sent += 1;
            }
            return;
        }
        let listener = self
            .cm
            .listeners
            .values()
            .filter(|l| {
                l.udp == local.port()
                    && l.port.is_none_or(|p| p == port)
                    && (l.addr.is_unspecified() || l.addr == *local.ip())
            })
            .max_by_key(|l| !l.addr.is_unspecified())
            .map(|l| (l.id, l.dev));
        let Some((lid, dev)) = listener.filter(|_| self.cm.chan.is_some()) else {
            let mut buf = vec![0u8; 512];
            if let Ok(n) = inc.reject(&[], &mut buf) {
                tracing::debug!(%local, %remote, "ConnectRequest with no listener: rejected");
                self.send_datagram(port, mac, local, remote, &buf[..n]);
                self.cm.rejects_sent += 1;
            }
            return;
        };
        if self.cm.requests.len() >= MAX_REQUESTS {
            let oldest_answered = self
                .cm
                .requests
                .iter()
                .filter(|(_, r)| r.state != ReqState::Pending)
                .min_by_key(|(_, r)| r.last_seen)
                .map(|(&k, _)| k);
            match oldest_answered {
                Some(k) => {
                    self.cm.requests.remove(&k);
                }
                None => {
                    self.cm.requests_dropped += 1;
                    tracing::debug!(%local, %remote, "request table full: ConnectRequest dropped");
                    return;
                }
            }
        }
        self.cm.next_req += 1;
        let req = self.cm.next_req;
        tracing::info!(req, listener = lid, %local, %remote, peer_conn = format_args!("{:#x}", inc.peer_conn()), "connection request");
        let mut m = Msg::new(Op::Request);
        m.id = lid;
        m.req = req;
        m.dev = dev;
        m.local = local;
        m.remote = remote;
        m.remote_mac = mac;
        m.ird = inc.ird();
        m.ord = inc.ord();
        m.pdata = inc.private_data().to_vec();
        self.cm.requests.insert(
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
        self.kernel_send(m);
    }

    fn cm_accept(&mut self, m: Msg) {
        let reply = |d: &mut Daemon, status: i32| {
            let mut r = Msg::new(Op::Accepted);
            r.req = m.req;
            r.status = status;
            r.dev = m.dev;
            r.qpn = m.qpn;
            d.kernel_send(r);
        };
        let Some(r) = self
            .cm
            .requests
            .get(&m.req)
            .filter(|r| r.state == ReqState::Pending)
        else {
            tracing::warn!(req = m.req, "ACCEPT of an unknown request");
            return reply(self, ECONNRESET);
        };
        let (port, local, remote, mac, pkt) = (r.port, r.local, r.remote, r.mac, r.pkt.clone());
        let peer_conn = r.peer_conn;
        let cfg = self.trp_config(port, m.ird, m.ord);
        let conn = random_u32(true);
        let isn = random_u32(false);
        // The provider repeats this exactly: check that it will succeed.
        if let Err(e) =
            Incoming::parse(&pkt).and_then(|inc| inc.accept(cfg, conn, isn, &m.pdata).map(|_| ()))
        {
            tracing::warn!(req = m.req, "ACCEPT refused: {e}");
            return reply(self, EINVAL);
        }
        let datagram = cfg.max_datagram;
        let spec = FlowSpec {
            port: port as u16,
            local,
            remote: Some(remote),
            remote_mac: Some(mac),
        };
        let pdata = m.pdata.clone();
        let ev = |o: &FlowSpecOpened| {
            Event::Connected(Box::new(Connected {
                dev: m.dev,
                qpn: m.qpn,
                role: Role::Passive,
                port: port as u16,
                local,
                remote,
                mac,
                flow: o.flow,
                rx_ring: o.rx_ring.clone(),
                ird: m.ird,
                ord: m.ord,
                datagram,
                crc: cfg.crc,
                direct: 0,
                stats: None,
                conn,
                isn,
                pdata,
                pkt: pkt.clone(),
            }))
        };
        match self.hand_over(m.dev, m.qpn, &spec, ev) {
            Ok((client, flow, path)) => {
                tracing::info!(req = m.req, dev = m.dev, qpn = m.qpn, client, flow, %remote, conn = format_args!("{conn:#x}"), peer_conn = format_args!("{peer_conn:#x}"), path = path.as_str(), "connected (passive)");
                if let Some(r) = self.cm.requests.get_mut(&m.req) {
                    r.state = ReqState::Accepted;
                }
                self.cm.conns.insert(
                    (m.dev, m.qpn),
                    QpConn {
                        client,
                        role: Role::Passive,
                        port,
                        local,
                        remote,
                        mac,
                        peer_conn,
                        flow,
                        peer_closed_sent: false,
                    },
                );
                self.refresh_tap_ports();
                reply(self, 0);
            }
            Err(why) => {
                tracing::warn!(
                    req = m.req,
                    dev = m.dev,
                    qpn = m.qpn,
                    "ACCEPT failed: {why}"
                );
                reply(self, ENOTCONN);
            }
        }
    }

    fn cm_reject(&mut self, m: Msg) {
        let Some(r) = self.cm.requests.get(&m.req) else {
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
        let bytes = buf[..n].to_vec();
        let (port, mac, local, remote) = (r.port, r.mac, r.local, r.remote);
        tracing::info!(req = m.req, %remote, "request rejected");
        self.send_datagram(port, mac, local, remote, &bytes);
        self.cm.rejects_sent += 1;
        if let Some(r) = self.cm.requests.get_mut(&m.req) {
            r.state = ReqState::Rejected(bytes);
        }
    }

    fn cm_disconnect(&mut self, m: Msg) {
        let key = (m.dev, m.qpn);
        let owner = self
            .cm
            .conns
            .get(&key)
            .map(|c| c.client)
            .or_else(|| self.cm.qps.get(&key).copied())
            .and_then(|id| self.clients.iter().position(|c| c.id == id));
        if let Some(hid) = self
            .cm
            .handshakes
            .iter()
            .find(|(_, h)| (h.dev, h.qpn) == key)
            .map(|(&id, _)| id)
        {
            // Not connected yet: the handshake ends here.
            let h = self.cm.handshakes.remove(&hid).expect("present");
            self.refresh_tap_ports();
            let mut r = Msg::new(Op::ConnectFailed);
            r.id = hid;
            r.status = ECONNRESET;
            r.dev = h.dev;
            r.qpn = h.qpn;
            self.kernel_send(r);
            return;
        }
        if let Some(i) = owner {
            let ev = Event::Disconnect {
                dev: m.dev,
                qpn: m.qpn,
                status: m.status,
            };
            if self.send(i, &ev.encode()) {
                return;
            }
        }
        if self.cm.conns.contains_key(&key) {
            self.abort_conn(key, ECONNRESET);
        }
    }

    /// Ends a connection urdmad has to end itself: Abort to the peer, flow closed,
    /// `CLOSED status` to the kernel.
    pub(super) fn abort_conn(&mut self, key: (u32, u32), status: i32) {
        let Some(c) = self.cm.conns.remove(&key) else {
            return;
        };
        self.refresh_tap_ports();
        tracing::info!(dev = key.0, qpn = key.1, remote = %c.remote, "connection aborted");
        self.send_datagram(c.port, c.mac, c.local, c.remote, &abort_packet(c.peer_conn));
        self.cm.aborts_sent += 1;
        self.close_flow(c.flow);
        if let Some(cl) = self.clients.iter_mut().find(|x| x.id == c.client) {
            cl.flows.retain(|&f| f != c.flow);
        }
        let mut r = Msg::new(Op::Closed);
        r.dev = key.0;
        r.qpn = key.1;
        r.status = status;
        r.local = c.local;
        r.remote = c.remote;
        self.kernel_send(r);
    }

    /// The connection lines of the control protocol; the reply.
    pub(super) fn cm_client_request(&mut self, i: usize, req: &proto::Request) -> proto::Response {
        use proto::Request as R;
        let id = self.clients[i].id;
        match *req {
            R::Qp { dev, qpn } => {
                if let Some(&other) = self.cm.qps.get(&(dev, qpn)) {
                    if other != id && self.clients.iter().any(|c| c.id == other) {
                        return super::error(
                            proto::ErrorCode::Exists,
                            &format!("QP {qpn} of device {dev} belongs to another process"),
                        );
                    }
                }
                self.cm.qps.insert((dev, qpn), id);
            }
            R::Unqp { dev, qpn } => {
                if self.cm.qps.get(&(dev, qpn)) == Some(&id) {
                    self.cm.qps.remove(&(dev, qpn));
                }
                if self
                    .cm
                    .conns
                    .get(&(dev, qpn))
                    .is_some_and(|c| c.client == id)
                {
                    self.abort_conn((dev, qpn), ECONNRESET);
                }
            }
            R::QpClosed { dev, qpn, status }
                if self
                    .cm
                    .conns
                    .get(&(dev, qpn))
                    .is_some_and(|c| c.client == id) =>
            {
                let c = self.cm.conns.remove(&(dev, qpn)).expect("present");
                self.refresh_tap_ports();
                self.close_flow(c.flow);
                self.clients[i].flows.retain(|&f| f != c.flow);
                if !c.peer_closed_sent {
                    let mut r = Msg::new(Op::PeerClosed);
                    r.dev = dev;
                    r.qpn = qpn;
                    self.kernel_send(r);
                }
                let mut r = Msg::new(Op::Closed);
                r.dev = dev;
                r.qpn = qpn;
                r.status = status.min(0);
                r.local = c.local;
                r.remote = c.remote;
                self.kernel_send(r);
            }
            R::PeerClosed { dev, qpn } => {
                if let Some(c) = self.cm.conns.get_mut(&(dev, qpn)) {
                    if c.client == id && !c.peer_closed_sent {
                        c.peer_closed_sent = true;
                        let mut r = Msg::new(Op::PeerClosed);
                        r.dev = dev;
                        r.qpn = qpn;
                        self.kernel_send(r);
                    }
                }
            }
            R::Sync => {}
            _ => {}
        }
        proto::Response::Ok
    }

    /// After a process's connection closed or it detached: its connections end.
    pub(super) fn cm_release(&mut self, id: u32) {
        self.cm.qps.retain(|_, c| *c != id);
        let mine: Vec<(u32, u32)> = self
            .cm
            .conns
            .iter()
            .filter(|(_, c)| c.client == id)
            .map(|(&k, _)| k)
            .collect();
        for k in mine {
            self.abort_conn(k, ECONNRESET);
        }
    }

    /// Timers: handshake retransmissions and time-outs, request expiry.
    pub(super) fn cm_tick(&mut self) {
        // Only the handshakes with something due: this runs every few milliseconds, and a
        // burst of connects leaves hundreds of handshakes waiting for their peers, most of
        // them with nothing to send for a second or two. Driving each of them on every
        // tick took most of urdmad's time on a small host, and its port's socket
        // overflowed meanwhile (tests/vm/59-e2e-overload.sh, the full case).
        let now = self.trp_now();
        let due: Vec<u64> = self
            .cm
            .handshakes
            .iter()
            .filter(|(_, h)| {
                h.connecting
                    .as_ref()
                    .and_then(|c| c.poll_timeout())
                    .is_some_and(|t| t <= now)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.drive_handshake(id);
        }
        let now = Instant::now();
        let mut gone = Vec::new();
        self.cm.requests.retain(|&req, r| {
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
            let mut m = Msg::new(Op::RequestGone);
            m.req = req;
            m.id = listener;
            self.kernel_send(m);
        }
    }

    /// Status lines of connection management.
    pub(super) fn cm_status(&self, out: &mut Vec<Record>) {
        out.push(Record::Cm(status::Cm {
            channel: if self.cm.chan.is_some() {
                "open"
            } else {
                "none"
            }
            .into(),
            listeners: self.cm.listeners.len(),
            requests: self.cm.requests.len(),
            max_requests: MAX_REQUESTS,
            requests_dropped: self.cm.requests_dropped,
            connecting: self.cm.handshakes.len(),
            connected: self.cm.conns.len(),
            qps: self.cm.qps.len(),
            rejects_sent: self.cm.rejects_sent,
            aborts_sent: self.cm.aborts_sent,
            strays: self.cm.strays,
        }));
        for l in self.cm.listeners.values() {
            out.push(Record::Listener(status::Listener {
                id: l.id,
                dev: l.dev,
                port: l.port.map(|p| self.ports[p].port.name.clone()),
                local: SocketAddrV4::new(l.addr, l.udp).to_string(),
            }));
        }
        let now = Instant::now();
        for (&req, r) in &self.cm.requests {
            out.push(Record::Request(status::Request {
                req,
                listener: r.listener,
                port: self.ports[r.port].port.name.clone(),
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
        for (&id, h) in &self.cm.handshakes {
            out.push(Record::Connecting(status::Connecting {
                id,
                dev: h.dev,
                qpn: h.qpn,
                port: self.ports[h.port].port.name.clone(),
                local: h.local.to_string(),
                remote: h.remote.to_string(),
                mac: h.mac.to_string(),
                sent: h.sent,
            }));
        }
        for (&(dev, qpn), c) in &self.cm.conns {
            out.push(Record::Connection(status::Connection {
                dev,
                qpn,
                client: c.client,
                role: c.role.as_str().into(),
                port: self.ports[c.port].port.name.clone(),
                local: c.local.to_string(),
                remote: c.remote.to_string(),
                mac: c.mac.to_string(),
                flow: c.flow,
                peer_conn: c.peer_conn,
                peer_closed: c.peer_closed_sent,
            }));
        }
        for (&(dev, qpn), &client) in &self.cm.qps {
            out.push(Record::Qp(status::Qp { dev, qpn, client }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn established() -> (trp::Connection, trp::Connection) {
        established_with(true)
    }

    /// A connection pair whose ends ask for the CRC32C trailer, or not.
    fn established_with(crc: bool) -> (trp::Connection, trp::Connection) {
        let cfg = trp::Config {
            crc,
            ..trp::Config::default()
        };
        let now = trp::Instant::from_nanos(1);
        let mut c = Connecting::new(cfg, 11, 100, b"", now).unwrap();
        let mut buf = vec![0u8; 2048];
        let n = c.poll_transmit(now, &mut buf).unwrap();
        let mut b = Incoming::parse(&buf[..n])
            .unwrap()
            .accept(cfg, 22, 200, b"")
            .unwrap();
        let mem = trp::VecMemory::new(16);
        let n = b.poll_transmit(now, &mem, &mut buf).unwrap();
        assert_eq!(accept_src_conn(&buf[..n]), Some(22));
        match c.handle_datagram(now, &buf[..n]) {
            ConnectOutcome::Established { conn, .. } => (conn, b),
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn our_abort_fails_the_peers_connection() {
        let (mut a, _b) = established();
        let mut mem = trp::VecMemory::new(16);
        let now = trp::Instant::from_nanos(2);
        a.handle_datagram(now, &mut mem, &abort_packet(11)).unwrap();
        assert_eq!(
            a.poll_event(),
            Some(trp::Event::Failed(trp::FailReason::PeerAborted))
        );
        // To another connection id it is foreign.
        let (mut a, _b) = established();
        let _ = a.handle_datagram(now, &mut mem, &abort_packet(12));
        assert_eq!(a.state(), trp::QpState::Rts);
        // Sealed, it is read by a connection without the trailer as well.
        let (mut a, _b) = established_with(false);
        a.handle_datagram(now, &mut mem, &abort_packet(11)).unwrap();
        assert_eq!(
            a.poll_event(),
            Some(trp::Event::Failed(trp::FailReason::PeerAborted))
        );
    }

    fn frame(dst_mac: [u8; 6], dst_port: u16, payload: &[u8]) -> Vec<u8> {
        crate::frame::udp_frame(
            dst_mac,
            [2, 0, 0, 0, 0, 2],
            "10.0.0.2:5000".parse().unwrap(),
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), dst_port),
            payload,
        )
    }

    #[test]
    fn the_tap_takes_connect_requests_and_frames_to_its_ports_only() {
        let mac = [2, 0, 0, 0, 0, 1];
        let mut tap = Tap {
            enabled: true,
            macs: vec![mac],
            ..Tap::default()
        };
        let now = trp::Instant::from_nanos(1);
        let mut c = Connecting::new(trp::Config::default(), 11, 100, b"x", now).unwrap();
        let mut buf = vec![0u8; 2048];
        let n = c.poll_transmit(now, &mut buf).unwrap();
        let req = frame(mac, 7000, &buf[..n]);
        assert_eq!(frame::datagram(&req).map(|d| d.payload), Some(&buf[..n]));
        assert!(tap.wants(0, &req));
        assert!(!tap.wants(0, &frame([2, 0, 0, 0, 0, 9], 7000, &buf[..n])));
        assert!(!tap.wants(1, &req));
        let abort = frame(mac, 7000, &abort_packet(5));
        assert!(!tap.wants(0, &abort));
        tap.ports.insert(7000);
        assert!(tap.wants(0, &abort));
        // Not TRP: the kernel's, even on a port urdmad uses.
        assert!(!tap.wants(0, &frame(mac, 7000, b"hi")));
        tap.enabled = false;
        assert!(!tap.wants(0, &req));
        for i in 0..req.len() {
            let _ = frame::datagram(&req[..i]);
            let _ = Tap {
                enabled: true,
                macs: vec![mac],
                ..Tap::default()
            }
            .wants(0, &req[..i]);
        }
    }
}
