//! Connection management's I/O (docs/connection.md): the kernel channel, the frames the
//! receive path takes for it ([`Tap`]), and carrying out what the core (`crate::cm`)
//! decides: messages to urdma.ko, datagrams, hand-overs to processes.

use super::control::runs;
use super::Daemon;
use crate::cm::{self, Action, HandOver, PortView};
use crate::cm_channel::{Channel, Msg, Op};
use crate::frame;
use crate::proto::{self, Event, Request};
use crate::status::Record;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};
use trp::setup::Incoming;
use trp::wire::trp as tw;

/// How often urdmad looks for the connection channel while it has none (urdma.ko not loaded
/// yet when urdmad started): connection management starts within this of the module's load.
pub(super) const CHANNEL_RETRY: Duration = Duration::from_secs(1);

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

/// A connection's `EVENT CONNECTED`, ready to write to its process. The hand-over opens the
/// flow and reports success to the connection manager at once; the event is written after
/// the frames the manager sends next and before anything else, so that an Accept reaches
/// the requester before the process that the event wakes takes the CPU, and the kernel
/// still hears a connection only after its process could (`ESTABLISHED` comes after the
/// event: the provider relies on it).
pub(super) struct Deferred {
    client: u32,
    flow: u32,
    dev: u32,
    qpn: u32,
    text: String,
    /// Descriptors urdmad holds open while the flow is: its socket, its bell's word, the
    /// process's hush.
    fds: Vec<RawFd>,
    /// The flow took a socket the process had parked.
    reused: bool,
    path: Path,
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

/// Random u32s from the kernel's generator: connection ids and initial sequence numbers
/// that an off-path sender cannot guess. Drawn 16 at a time: a connection takes two, and a
/// system call is tens of microseconds on a small guest.
struct KernelRandom {
    pool: [u8; 64],
    used: usize,
}

impl KernelRandom {
    fn new() -> KernelRandom {
        KernelRandom {
            pool: [0; 64],
            used: 64,
        }
    }

    fn next_u32(&mut self) -> u32 {
        if self.used == self.pool.len() {
            // SAFETY: writes at most pool.len() bytes into pool.
            let n = unsafe { libc::getrandom(self.pool.as_mut_ptr().cast(), self.pool.len(), 0) };
            if n != self.pool.len() as isize {
                // Not expected on Linux >= 3.17; a time-based value still differs per call.
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.subsec_nanos());
                return t ^ std::process::id().rotate_left(16);
            }
            self.used = 0;
        }
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.pool[self.used..self.used + 4]);
        // Not left in memory once handed out.
        self.pool[self.used..self.used + 4].fill(0);
        self.used += 4;
        u32::from_ne_bytes(b)
    }
}

/// The connection manager for `ports`, with the kernel's random numbers.
pub(super) fn new_cm(ports: Vec<PortView>) -> cm::Cm {
    let mut random = KernelRandom::new();
    cm::Cm::new(ports, Box::new(move || random.next_u32()))
}

impl Daemon {
    /// What the connection manager knows of port `pi`.
    pub(super) fn port_view(&self, pi: usize) -> PortView {
        let p = &self.ports[pi];
        let mut mtu = 0u16;
        // SAFETY: valid port and out-pointer.
        let rc = unsafe { dpdk_sys::rte_eth_dev_get_mtu(p.port.id, &mut mtu) };
        if rc != 0 || mtu < 576 {
            mtu = 1500;
        }
        PortView {
            name: p.port.name.clone(),
            iface: p.port.exception_name.clone(),
            datagram: mtu - 28,
            crc: self.cfg.ports.get(pi).is_none_or(|c| c.crc),
        }
    }

    /// Opens the kernel channel and registers every port's exception interface. Without it
    /// (urdma.ko not loaded yet) urdmad serves what needs no connection management and tries
    /// again every [`CHANNEL_RETRY`] (`cm_retry`), saying so once.
    pub(super) fn cm_open(&mut self) {
        let path = self.cfg.daemon.cm_device.clone();
        let first = self.next_open.is_none();
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
                self.next_open = Some(Instant::now() + CHANNEL_RETRY);
                return;
            }
        };
        self.next_open = None;
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
        self.chan = Some(chan);
        self.cm.set_channel(true);
        // A new channel starts without counters: they go again at the next push.
        for p in &mut self.ports {
            p.pushed = None;
        }
        self.tap.macs = self.ports.iter().map(|p| p.port.mac.0).collect();
        self.tap.enabled = true;
    }

    /// Tries the channel again when it is due ([`Daemon::cm_open`]).
    pub(super) fn cm_retry(&mut self) {
        if self.chan.is_none() && self.next_open.is_some_and(|t| Instant::now() >= t) {
            self.cm_open();
        }
    }

    pub(super) fn kernel_send(&mut self, m: Msg) {
        if let Some(c) = &self.chan {
            tracing::debug!(op = ?m.op, id = m.id, req = m.req, status = m.status, "to kernel");
            if let Err(e) = c.send(&m) {
                tracing::error!(op = ?m.op, "cannot write to the connection channel: {e}");
            }
        }
    }

    /// Asks urdma.ko to fire the QP's receive CQ itself when a frame that completes a
    /// receive reaches the connection's socket `fd`, as the socket's filter says in
    /// `verdicts` ([`crate::flowfilter`]). That wakes an application blocked on its
    /// completion channel with no thread of the provider in between. A connection without it
    /// works the same, only through the provider's helper thread. Whether urdma.ko took it.
    /// `hush`: the map of the process's hush word, which urdma.ko then reads for each frame.
    fn bell(
        &mut self,
        dev: u32,
        qpn: u32,
        fd: RawFd,
        verdicts: RawFd,
        hush: Option<RawFd>,
    ) -> bool {
        let Some(c) = &self.chan else { return false };
        let mut m = Msg::new(Op::Bell);
        (m.dev, m.qpn, m.req, m.id) = (dev, qpn, fd as u64, verdicts as u64);
        if let Some(h) = hush {
            m.pdata = h.to_ne_bytes().to_vec();
        }
        match c.send(&m) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dev, qpn, "urdma.ko rings no bell for this connection: {e}");
                false
            }
        }
    }

    /// Gives a connection through urdmad's rings, flow `flow`, urdma.ko's bell rung by
    /// urdmad ([`crate::ringbell`]): its word's map, for the process, or None where urdma.ko
    /// is not there to ring it or the word cannot be made (its frames then wake the
    /// process's helper, as before).
    fn ring_bell(&mut self, flow: u32, dev: u32, qpn: u32) -> Option<RawFd> {
        self.chan.as_ref()?;
        let rec = self.flows.get(&flow)?;
        let f = self
            .ports
            .get_mut(usize::from(rec.port))?
            .flows
            .get_mut(rec.slot)?;
        match crate::ringbell::RingBell::new(dev, qpn) {
            Ok(b) => Some(f.bell.insert(b).map()),
            Err(e) => {
                tracing::warn!(dev, qpn, "urdma.ko rings no bell for this connection: {e}");
                None
            }
        }
    }

    /// The map of client `i`'s hush word, made on first use; None where it cannot be made
    /// (its connections' frames then wake its helper as before).
    fn client_hush(&mut self, i: usize) -> Option<RawFd> {
        let c = &mut self.clients[i];
        if c.hush.is_none() {
            let made = crate::flowfilter::hush_map()
                .and_then(|m| Ok((m.try_clone()?, m)))
                .and_then(|(m, ours)| Ok((m, crate::bell::HushMap::map(ours)?)));
            match made {
                Ok(h) => c.hush = Some(h),
                Err(e) => tracing::warn!(client = c.id, "no hush word: {e}"),
            }
        }
        c.hush.as_ref().map(|(m, _)| m.as_raw_fd())
    }

    /// Reads up to 64 of the kernel's messages, for [`Daemon::cm_handle_kernel`].
    pub(super) fn cm_read_kernel(&mut self) -> Vec<Msg> {
        let mut read = Vec::new();
        while read.len() < 64 {
            let Some(chan) = &self.chan else { break };
            match chan.recv() {
                Ok(Some(m)) => read.push(m),
                Ok(None) => break,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    tracing::warn!("connection channel: {e}");
                }
                Err(e) => {
                    tracing::error!("connection channel lost: {e}; connection management stops");
                    self.chan = None;
                    self.cm.set_channel(false);
                    self.tap.enabled = false;
                    break;
                }
            }
        }
        read
    }

    /// Hands the kernel's messages to the connection manager and carries out its actions.
    pub(super) fn cm_handle_kernel(&mut self, msgs: Vec<Msg>) {
        for m in msgs {
            let addr_port = if m.op == Op::Connect && m.ifname.is_empty() {
                self.port_of_addr(*m.local.ip())
            } else {
                None
            };
            if matches!(m.op, Op::Connect | Op::Accept) {
                match (m.owner, self.client_of_pid(m.owner)) {
                    (_, Some(id)) => self.cm.kernel_owner(m.dev, m.qpn, id),
                    (0, None) if self.cm.qp_owner(m.dev, m.qpn).is_none() => tracing::warn!(
                        dev = m.dev,
                        qpn = m.qpn,
                        "urdma.ko names no process for the QP: is the loaded module older \
                         than urdmad?"
                    ),
                    (0, None) => {}
                    (pid, None) => tracing::warn!(
                        dev = m.dev,
                        qpn = m.qpn,
                        pid,
                        "the QP's process is not attached to urdmad"
                    ),
                }
            }
            self.cm.kernel(Instant::now(), m, addr_port);
            self.cm_act();
        }
    }

    /// The attached process with process id `pid` (in urdmad's pid namespace): the newest,
    /// should a process that died with that id not have been seen going yet.
    fn client_of_pid(&self, pid: u32) -> Option<u32> {
        if pid == 0 {
            return None;
        }
        self.clients
            .iter()
            .filter(|c| c.peer.pid == pid && c.attached.is_some())
            .map(|c| c.id)
            .max()
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
                        found = self
                            .ports
                            .iter()
                            .position(|p| p.port.exception_name == name);
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

    /// Handles the connection-management frames the receive path took.
    pub(super) fn cm_frames(&mut self) -> usize {
        let mut done = 0;
        // Handling may send frames that loop back to this node; bounded rounds.
        for _ in 0..8 {
            let frames = std::mem::take(&mut self.tap.frames);
            if frames.is_empty() {
                break;
            }
            done += frames.len();
            for (port, f) in frames {
                self.cm.frame(Instant::now(), port, &f);
                self.cm_act();
            }
        }
        done
    }

    /// The connection manager's timers.
    pub(super) fn cm_tick(&mut self) {
        let now = Instant::now();
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
            self.cm_act();
        }
    }

    /// A connection line of the control protocol from client `i`; the reply.
    pub(super) fn cm_client_request(&mut self, i: usize, req: &Request) -> proto::Response {
        let id = self.clients[i].id;
        if let Request::Qp { dev, qpn } = *req {
            // The kernel gives a QP's number again once the QP is destroyed; a process that
            // died with it may not have been seen going yet (its socket is read later).
            let dead = self
                .cm
                .qp_owner(dev, qpn)
                .filter(|&other| other != id)
                .and_then(|other| self.clients.iter().find(|c| c.id == other))
                .filter(|c| !runs(c.peer.pid))
                .map(|c| c.id);
            if let Some(other) = dead {
                self.cm_release(other);
            }
        }
        let r = self.cm.client_request(id, req);
        self.cm_act();
        r
    }

    /// After a process detached or went away: its connections end.
    pub(super) fn cm_release(&mut self, id: u32) {
        self.cm.client_gone(id);
        self.cm_act();
    }

    /// Carries out what the connection manager decided.
    pub(super) fn cm_act(&mut self) {
        loop {
            while let Some(a) = self.cm.poll_action() {
                if !matches!(a, Action::Datagram { .. }) {
                    self.write_deferred();
                }
                self.cm_do(a);
            }
            if self.deferred.is_empty() {
                break;
            }
            // An event not delivered ends its connection: more actions.
            self.write_deferred();
        }
        if self.tap.ports != *self.cm.udp_ports() {
            self.tap.ports.clone_from(self.cm.udp_ports());
        }
    }

    /// Writes the `EVENT CONNECTED`s waiting ([`Deferred`]). A process that does not read
    /// its socket loses the connection as it would a `DISCONNECT` it cannot read.
    fn write_deferred(&mut self) {
        for d in std::mem::take(&mut self.deferred) {
            if !self.flows.contains_key(&d.flow) {
                continue;
            }
            let sent = match self.clients.iter().position(|c| c.id == d.client) {
                Some(i) => self.send_with(i, &d.text, &d.fds),
                None => Err(std::io::ErrorKind::NotConnected.into()),
            };
            if let Err(e) = sent {
                tracing::warn!(
                    dev = d.dev,
                    qpn = d.qpn,
                    flow = d.flow,
                    "{}: aborted",
                    HandOverError::NotReading(e)
                );
                if d.reused {
                    // The process never heard of the connection: it still has the socket
                    // parked.
                    self.direct_reparked(d.flow);
                }
                self.cm.disconnect_undelivered(d.dev, d.qpn);
                continue;
            }
            if let Some(p) = self.ports.get_mut(usize::from(self.flows[&d.flow].port)) {
                match d.path {
                    Path::Direct => p.conns_direct += 1,
                    Path::Forwarded => p.conns_forwarded += 1,
                }
            }
            tracing::debug!(
                dev = d.dev,
                qpn = d.qpn,
                flow = d.flow,
                path = d.path.as_str(),
                "handed over"
            );
        }
    }

    /// Carries out one action of the connection manager.
    fn cm_do(&mut self, a: Action) {
        match a {
            Action::Kernel(m) => self.kernel_send(m),
            Action::Datagram {
                port,
                mac,
                local,
                remote,
                payload,
            } => self.send_datagram(port, mac, local, remote, &payload),
            Action::Abort {
                port,
                mac,
                local,
                remote,
                peer_conn,
                flow,
            } => {
                let received = self.flow_received(flow);
                let payload = cm::abort_packet(peer_conn, received);
                self.send_datagram(port, mac, local, remote, &payload);
            }
            Action::HandOver(h) => {
                let token = h.token;
                let result = self.hand_over(h).map_err(|e| e.to_string());
                self.cm.handed_over(token, result);
            }
            Action::Disconnect {
                client,
                dev,
                qpn,
                status,
            } => {
                let ev = Event::Disconnect { dev, qpn, status };
                let sent = match self.clients.iter().position(|c| c.id == client) {
                    Some(i) => self.send(i, &ev.encode()),
                    None => false,
                };
                if !sent {
                    self.cm.disconnect_undelivered(dev, qpn);
                }
            }
            Action::CloseFlow { client, flow } => {
                self.close_flow(flow);
                if let Some(c) = self.clients.iter_mut().find(|c| c.id == client) {
                    c.flows.retain(|&f| f != flow);
                }
            }
            // Still the process's: closed with its flows if it goes first.
            Action::RetireFlow { flow, .. } => self.retire_flow(flow),
        }
    }

    /// Opens the connection's flow for its process and readies its `EVENT CONNECTED`
    /// ([`Deferred`]); the flow.
    fn hand_over(&mut self, h: HandOver) -> Result<u32, HandOverError> {
        let HandOver {
            client,
            spec,
            mut connected,
            ..
        } = h;
        let Some(i) = self.clients.iter().position(|c| c.id == client) else {
            return Err(HandOverError::OwnerGone);
        };
        if self.clients[i].attached.is_none() {
            return Err(HandOverError::NotAttached);
        }
        let opened = self
            .open_flow(i, &spec)
            .map_err(|reply| HandOverError::FlowNotOpened { reply })?;
        connected.flow = opened.flow;
        connected.rx_ring = opened.rx_ring;
        // The rings are sized for the datagram the event announces.
        let qp = (connected.dev, connected.qpn);
        let direct = self.direct_open(opened.flow, &spec, connected.datagram, qp);
        connected.direct = direct.as_ref().map_or(0, |d| d.frames);
        connected.park = direct.as_ref().is_some_and(|d| d.park);
        connected.reuse = direct.as_ref().map_or(0, |d| d.reuse);
        connected.stats = self.qp_table.take();
        if let Some(rec) = self.flows.get_mut(&opened.flow) {
            rec.stats = connected.stats;
        }
        if connected.stats.is_none() {
            tracing::warn!(
                flow = opened.flow,
                "every slot of the QP figures is taken: this connection has none"
            );
        }
        let (dev, qpn) = (connected.dev, connected.qpn);
        // The bell's word goes to the process after the socket; the filter and its maps
        // live on in the socket and urdma.ko, and with the connection's flow in urdmad.
        let mut fds = Vec::new();
        if let Some(d) = &direct {
            // A parked socket is the process's already.
            if d.reuse == 0 {
                fds.push(d.socket);
            }
            if let Some((verdicts, word)) = &d.bell {
                let hush = self.client_hush(i);
                if self.bell(dev, qpn, d.socket, *verdicts, hush) {
                    fds.push(*word);
                    connected.bell = true;
                    if let Some(h) = hush {
                        fds.push(h);
                        connected.hush = true;
                    }
                }
            }
        } else if let Some(word) = self.ring_bell(opened.flow, dev, qpn) {
            fds.push(word);
            connected.bell = true;
            // urdmad follows urdma.ko's hush for the frames it puts on the ring (wakes.rs).
            if let Some(hush) = self.client_hush(i) {
                fds.push(hush);
                connected.hush = true;
            }
        }
        self.deferred.push(Deferred {
            client,
            flow: opened.flow,
            dev,
            qpn,
            text: Event::Connected(Box::new(connected)).encode(),
            fds,
            reused: direct.as_ref().is_some_and(|d| d.reuse != 0),
            path: if direct.is_some() {
                Path::Direct
            } else {
                Path::Forwarded
            },
        });
        Ok(opened.flow)
    }

    /// Status records of connection management.
    pub(super) fn cm_status(&self, out: &mut Vec<Record>) {
        self.cm.status(Instant::now(), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::abort_packet;
    use std::net::SocketAddrV4;
    use trp::setup::Connecting;

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
    fn random_numbers_come_from_the_kernel_sixteen_at_a_time_and_differ() {
        let mut r = KernelRandom::new();
        let drawn: Vec<u32> = (0..40).map(|_| r.next_u32()).collect();
        let mut distinct = drawn.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() >= 38, "{drawn:?}");
        assert!(r.used == 32 && r.pool[..32].iter().all(|&b| b == 0));
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
        let abort = frame(mac, 7000, &abort_packet(5, None));
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
