//! The control server: processes connect, attach, open flows and give sockets back here;
//! a process that goes away is released and, once it no longer runs, swept.

use super::{error, ring_create, ring_drain_free, Attached, Client, Daemon, TxRing};
use crate::access;
use crate::holder;
use crate::lending::Lender;
use crate::proto::{self, Attachment, ErrorCode, PortInfo, Request, Response};
use crate::status;
use dpdk_sys as sys;
use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Connections beyond this are closed at once.
const MAX_CONNECTIONS: usize = 1024;
/// A refused peer gets this long to send its first request, which is answered with the
/// refusal, before it is disconnected regardless.
const REFUSAL_GRACE: Duration = Duration::from_secs(1);
/// Descriptors a client sent with requests other than `GIVEBACK` that are kept (the oldest
/// beyond go): a process sends one per `GIVEBACK`, on the same line.
pub(super) const MAX_HELD_FDS: usize = 8;

/// What a sleep found readable among [`Daemon::control_fds`]. The pass after it reads
/// only those: another look at each (a `poll`, an empty `read` of the kernel's channel)
/// would be a system call for nothing, on every request's wake-up. What became readable
/// since is found by the next pass's look or the next sleep's, which return at once.
pub(super) struct ControlReady(Vec<(RawFd, bool)>);

impl ControlReady {
    pub(super) fn of(polled: &[libc::pollfd]) -> ControlReady {
        ControlReady(polled.iter().map(|p| (p.fd, p.revents != 0)).collect())
    }

    /// Whether `fd` was readable; None unless the descriptors are still `fds`.
    fn readable(&self, fds: &[RawFd], fd: RawFd) -> Option<bool> {
        let same = fds.len() == self.0.len() && fds.iter().zip(&self.0).all(|(a, (b, _))| a == b);
        same.then(|| self.0.iter().any(|&(f, r)| f == fd && r))
    }

    /// Which of `sockets` (the listener's and the processes') were readable, when that may
    /// stand for a look now: not once a kernel message has been read since the sleep
    /// (`kernel_read`). Such a message may follow a line written after the sleep (a `PARK`
    /// of the socket an `ACCEPT`'s connection takes), which must be read before the message
    /// is handled.
    fn sockets(&self, fds: &[RawFd], sockets: &[RawFd], kernel_read: bool) -> Option<Vec<bool>> {
        if kernel_read {
            return None;
        }
        sockets.iter().map(|&s| self.readable(fds, s)).collect()
    }
}

/// Whether process `pid` still runs: it exists and is not a zombie (which holds no memory
/// and no locks any more).
pub(super) fn runs(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which ends with the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// One send of `bytes` (with `fds` if any) that does not wait: the bytes it took.
fn send_nowait(
    s: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[std::os::fd::RawFd],
) -> std::io::Result<usize> {
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    if !fds.is_empty() {
        return crate::fdpass::send_with_fds_flags(s, bytes, fds, flags);
    }
    // SAFETY: a valid buffer of that length.
    let n = unsafe { libc::send(s.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), flags) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Frees the TX rings of an `ATTACH` that failed half-way.
pub(super) fn free_new_rings(tx: Vec<TxRing>) {
    for t in tx {
        // SAFETY: just created, never handed out.
        unsafe { sys::rte_ring_free(t.ring) };
    }
}

impl Daemon {
    pub(super) fn serve_control(&mut self) {
        let ready = self.control_ready.take();
        let fds = if ready.is_some() {
            self.control_fds()
        } else {
            Vec::new()
        };
        // The kernel's messages are read before the processes' lines and handled after
        // them: what a process posted before the call that makes the kernel's `ACCEPT` or
        // `CONNECT` (a `PARK` of the socket the connection may take, a `QP` line of a tool)
        // is in the socket by the time the message can be read (docs/connection.md).
        let chan_idle =
            |fd: RawFd| ready.as_ref().and_then(|r| r.readable(&fds, fd)) == Some(false);
        let from_kernel = match &self.chan {
            Some(c) if !chan_idle(c.as_raw_fd()) => self.cm_read_kernel(),
            Some(_) => Vec::new(),
            None => {
                self.cm_retry();
                Vec::new()
            }
        };
        let sockets: Vec<RawFd> = std::iter::once(self.listener.as_raw_fd())
            .chain(self.clients.iter().map(|c| c.stream.as_raw_fd()))
            .collect();
        let clients = ready
            .as_ref()
            .and_then(|r| r.sockets(&fds, &sockets, !from_kernel.is_empty()));
        self.serve_clients(clients);
        if self.chan.is_some() || !from_kernel.is_empty() {
            self.cm_handle_kernel(from_kernel);
            self.cm_tick();
        }
        // Last: what a connection's set-up waits for goes first.
        self.serve_quiet();
        self.devices_create();
        self.counters_push();
        if !self.departed.is_empty() && self.swept_at.elapsed() >= Duration::from_millis(500) {
            self.sweep();
        }
    }

    /// Reads and answers every process's lines, and takes new control connections.
    /// `ready`: which of the listener and the processes' sockets, in that order, the sleep
    /// before found readable; looked at here when not known.
    fn serve_clients(&mut self, ready: Option<Vec<bool>>) {
        let mut fds = Vec::with_capacity(self.clients.len() + 1);
        fds.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for c in &self.clients {
            fds.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let n = match ready {
            Some(r) => {
                for (f, r) in fds.iter_mut().zip(r) {
                    f.revents = if r { libc::POLLIN } else { 0 };
                }
                fds.iter().filter(|f| f.revents != 0).count() as i32
            }
            // SAFETY: fds is a valid array of pollfd.
            None => unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) },
        };
        let refusals_pending = self.clients.iter().any(|c| c.refused.is_some());
        if n <= 0 && !refusals_pending {
            return;
        }
        let now = Instant::now();
        let mut gone = Vec::new();
        for (i, f) in fds.iter().enumerate().skip(1) {
            let expired = self.clients[i - 1]
                .refused
                .as_ref()
                .is_some_and(|(_, until)| now > *until);
            if expired || (f.revents != 0 && !self.read_client(i - 1)) {
                gone.push(i - 1);
            }
        }
        for i in gone.into_iter().rev() {
            let c = self.clients.remove(i);
            self.release(c, "connection closed");
        }
        if fds[0].revents != 0 {
            self.accept();
        }
    }

    pub(super) fn accept(&mut self) {
        while let Ok((stream, _)) = self.listener.accept() {
            if self.clients.len() >= MAX_CONNECTIONS {
                tracing::warn!("{MAX_CONNECTIONS} connections open; closing a new one");
                continue;
            }
            let peer = match access::peer_of(&stream) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("control connection without credentials: {e}");
                    continue;
                }
            };
            tracing::debug!(pid = peer.pid, uid = peer.uid, "control connection");
            let refused = access::check(
                peer,
                &access::supplementary_groups(peer.pid),
                self.allowed_gid,
                &self.cfg.daemon.group,
            )
            .err()
            .map(|why| (why.to_string(), Instant::now() + REFUSAL_GRACE));
            if let Some((why, _)) = &refused {
                tracing::warn!(pid = peer.pid, uid = peer.uid, "refused: {why}");
            }
            let _ = stream.set_nonblocking(true);
            let id = self.next_client;
            self.next_client += 1;
            self.clients.push(Client {
                id,
                peer,
                stream,
                buf: Vec::new(),
                greeted: false,
                refused,
                attached: None,
                flows: Vec::new(),
                fds: VecDeque::new(),
                quiet: None,
                hush: None,
            });
        }
    }

    /// Reads and answers what a client sent; false when the connection is to be dropped.
    pub(super) fn read_client(&mut self, i: usize) -> bool {
        let c = &mut self.clients[i];
        // Every line written before now is read, as the kernel's messages need
        // (`serve_control`).
        let open = crate::fdpass::read_there(&c.stream, &mut c.buf, &mut c.fds);
        // What the process wrote on its quiet socket before these lines comes first.
        self.read_quiet(i);
        if !open {
            return false;
        }
        while let Some(pos) = self.clients[i].buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.clients[i].buf.drain(..=pos).collect();
            let (reply, keep) = match std::str::from_utf8(&line) {
                Ok(text) => self.handle(i, text),
                Err(_) => (
                    error(ErrorCode::Invalid, "message is not UTF-8").encode(),
                    false,
                ),
            };
            // A posted request that succeeded is not answered (its reply is empty).
            if (!reply.is_empty() && !self.send(i, &reply)) || !keep {
                return false;
            }
        }
        if self.clients[i].buf.len() > proto::MAX_LINE {
            let _ = self.send(i, &error(ErrorCode::Invalid, "line too long").encode());
            return false;
        }
        // Descriptors that came with no GIVEBACK are not kept beyond a few.
        while self.clients[i].fds.len() > MAX_HELD_FDS {
            let fd = self.clients[i].fds.pop_front().expect("not empty");
            self.close_off_path(fd);
        }
        true
    }

    /// `GIVEBACK`: the socket of a direct connection that the process no longer uses, to
    /// be closed after its own copy ([`SocketKeeper::close`]).
    pub(super) fn take_back(&mut self, i: usize, fd: Option<OwnedFd>) -> Response {
        let Some(fd) = fd else {
            return error(ErrorCode::Invalid, "GIVEBACK came without a socket");
        };
        let packet = crate::direct::socket_domain(fd.as_raw_fd()) == Some(libc::AF_PACKET);
        if packet {
            if let Ok(cookie) = crate::direct::socket_cookie(fd.as_raw_fd()) {
                self.direct_given_back(i, cookie);
            }
        }
        self.close_off_path(fd);
        if packet {
            Response::Ok
        } else {
            error(
                ErrorCode::Invalid,
                "what came with GIVEBACK is not a packet socket",
            )
        }
    }

    /// Closes `fd` on the keeper's thread: the last close of a packet socket with rings
    /// waits for grace periods.
    pub(super) fn close_off_path(&self, fd: OwnedFd) {
        match &self.keeper {
            Ok(k) => k.close(fd),
            Err(_) => drop(fd),
        }
    }

    pub(super) fn send(&mut self, i: usize, text: &str) -> bool {
        self.send_with(i, text, &[]).is_ok()
    }

    /// [`Daemon::send`], with `fds` passed along with the text's first byte.
    pub(super) fn send_with(
        &mut self,
        i: usize,
        text: &str,
        fds: &[std::os::fd::RawFd],
    ) -> std::io::Result<()> {
        let s = &mut self.clients[i].stream;
        let bytes = text.as_bytes();
        // First without waiting, in one system call: a reply or an event almost always fits
        // in the socket's buffer, and switching the socket to blocking mode and back cost
        // three more calls for each of urdmad's writes.
        let sent = match send_nowait(s, bytes, fds) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        // The rest (the descriptors went with the first byte, when it went): a status
        // report, or a client slow to read. One that does not read it within the timeout
        // is dropped rather than stalling the data path longer.
        let fds = if sent == 0 { fds } else { &[] };
        let rest = &bytes[sent..];
        let _ = s.set_nonblocking(false);
        let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
        let r = if fds.is_empty() {
            s.write_all(rest)
        } else {
            crate::fdpass::send_with_fds(s, rest, fds)
        };
        let _ = s.set_nonblocking(true);
        r
    }

    /// The reply to one request line (empty for a posted request that succeeded: only a
    /// refusal answers one), and whether the connection stays open.
    pub(super) fn handle(&mut self, i: usize, line: &str) -> (String, bool) {
        if let Some((why, _)) = self.clients[i].refused.clone() {
            return (error(ErrorCode::Access, &why).encode(), false);
        }
        let (req, posted) = match Request::decode_line(line) {
            Ok(r) => r,
            Err(e) => match proto::legacy::hello_version(line) {
                // A process of the text protocol: refused in the words it reads.
                Some(version) => {
                    return (proto::legacy::version_refusal(&unsupported(version)), false)
                }
                None => return (error(ErrorCode::Invalid, &e.to_string()).encode(), true),
            },
        };
        if !posted {
            return self.answer(i, req);
        }
        let named = req.clone();
        let (reply, keep) = self.answer(i, req);
        (named.posted_outcome(&reply).unwrap_or_default(), keep)
    }

    /// The reply to one request, and whether the connection stays open.
    pub(super) fn answer(&mut self, i: usize, req: Request) -> (String, bool) {
        let c = &self.clients[i];
        match req {
            Request::Hello { version, .. } => {
                if version != proto::VERSION {
                    return (
                        error(ErrorCode::Version, &unsupported(version)).encode(),
                        false,
                    );
                }
                self.clients[i].greeted = true;
                let r = Response::Hello {
                    version: proto::VERSION,
                    daemon: format!("urdmad {}", env!("CARGO_PKG_VERSION")),
                };
                (r.encode(), true)
            }
            _ if !c.greeted => (
                error(ErrorCode::Invalid, "HELLO must come first").encode(),
                false,
            ),
            Request::Attach => (self.attach(i), true),
            Request::Open(spec) => (self.open(i, &spec), true),
            Request::Close { flow } => {
                let id = self.clients[i].id;
                // A retired flow too: its process closes it after a lingering close's UNQP.
                let mine = self.flows.get(&flow).is_some_and(|f| f.client == id)
                    || self
                        .retired
                        .iter()
                        .any(|r| r.flow == flow && r.client == id);
                if !mine {
                    return (
                        error(ErrorCode::NotFound, &format!("no flow {flow} of yours")).encode(),
                        true,
                    );
                }
                self.close_flow(flow);
                self.clients[i].flows.retain(|&f| f != flow);
                (Response::Closed { flow }.encode(), true)
            }
            Request::Status => {
                let report = status::encode(&self.status());
                let mut text = Response::Status {
                    lines: report.len(),
                }
                .encode();
                for l in report {
                    text.push_str(&l);
                    text.push('\n');
                }
                (text, true)
            }
            Request::Detach => {
                let c = &mut self.clients[i];
                let flows = std::mem::take(&mut c.flows);
                let attached = c.attached.take();
                let (id, pid) = (c.id, c.peer.pid);
                self.release_parts(id, pid, flows, attached, "detached");
                (Response::Detached.encode(), true)
            }
            Request::GiveBack => {
                let fd = self.clients[i].fds.pop_front();
                (self.take_back(i, fd).encode(), true)
            }
            Request::Quiet => (self.open_quiet(i).encode(), true),
            Request::Park { cookie } => match self.direct_park(i, cookie) {
                Ok(()) => (Response::Ok.encode(), true),
                Err(why) => (error(ErrorCode::NotFound, &why).encode(), true),
            },
            Request::Qp { .. }
            | Request::Unqp { .. }
            | Request::QpClosed { .. }
            | Request::PeerClosed { .. }
            | Request::Sync => (self.cm_client_request(i, &req).encode(), true),
            Request::Arm => (self.arm(i).encode(), true),
        }
    }

    pub(super) fn attach(&mut self, i: usize) -> String {
        if self.clients[i].attached.is_some() {
            return error(ErrorCode::Invalid, "already attached").encode();
        }
        let Some(lcore) = (1..self.lcores_used.len()).find(|&l| !self.lcores_used[l]) else {
            return error(
                ErrorCode::NoResources,
                "no free lcore id for another process",
            )
            .encode();
        };
        let id = self.clients[i].id;
        let mut tx = Vec::new();
        for p in &self.ports {
            let name = format!("urd_tx_{id}_{}", p.port.index);
            match ring_create(&name, self.cfg.daemon.ring_size, false) {
                Ok(ring) => tx.push(TxRing {
                    name,
                    ring,
                    packets: 0,
                    drops: 0,
                }),
                Err(e) => {
                    free_new_rings(tx);
                    return error(ErrorCode::NoResources, &e.to_string()).encode();
                }
            }
        }
        // SAFETY: the pool lives as long as the daemon.
        let pool_size = unsafe { (*self.pool).size };
        let mut lender = match Lender::new(id, pool_size) {
            Ok(l) => l,
            Err(e) => {
                free_new_rings(tx);
                return error(ErrorCode::NoResources, &e.to_string()).encode();
            }
        };
        // Filled now: an idle urdmad may sleep before its loop comes to the process.
        // SAFETY: urdmad's thread and pool; the rings are new.
        unsafe { lender.serve(self.pool) };
        self.rings += tx.len() + 2;
        self.lcores_used[lcore] = true;
        let ports = self
            .ports
            .iter()
            .zip(&tx)
            .map(|(p, t)| PortInfo {
                index: p.port.index,
                name: p.port.name.clone(),
                mac: p.port.mac,
                tx_ring: t.name.clone(),
                steering: p.port.steering,
            })
            .collect();
        let (alloc_ring, free_ring) = (lender.alloc_name.clone(), lender.free_name.clone());
        let c = &mut self.clients[i];
        c.attached = Some(Attached {
            lcore: lcore as u32,
            tx,
            lender,
        });
        tracing::info!(
            client = id,
            pid = c.peer.pid,
            uid = c.peer.uid,
            lcore,
            "process attached"
        );
        Response::Attached(Attachment {
            client: id,
            file_prefix: self.cfg.daemon.file_prefix.clone(),
            lcore: lcore as u32,
            alloc_ring,
            free_ring,
            ports,
        })
        .encode()
    }

    pub(super) fn release(&mut self, mut c: Client, why: &str) {
        let quiet = c.quiet.take().map(|mut q| q.take_fds()).unwrap_or_default();
        for fd in std::mem::take(&mut c.fds).into_iter().chain(quiet) {
            self.close_off_path(fd);
        }
        let flows = std::mem::take(&mut c.flows);
        self.release_parts(c.id, c.peer.pid, flows, c.attached.take(), why);
    }

    /// Removes a process's flows and rings and frees the mbufs on them.
    pub(super) fn release_parts(
        &mut self,
        id: u32,
        pid: u32,
        flows: Vec<u32>,
        attached: Option<Attached>,
        why: &str,
    ) {
        let nflows = flows.len();
        // The process's connections end first (an Abort to each peer, CLOSED to the
        // kernel); that closes their flows too.
        self.armed.remove(&id);
        self.late.remove(&id);
        self.cm_release(id);
        for f in flows {
            self.close_flow(f);
        }
        self.direct_release(id);
        if let Some(a) = attached {
            for t in &a.tx {
                // SAFETY: the process detached or died; nothing enqueues any more.
                unsafe { ring_drain_free(t.ring) };
            }
            // SAFETY: as for the TX rings.
            unsafe { a.lender.release() };
            self.rings -= a.tx.len() + 2;
            self.lcores_used[a.lcore as usize] = false;
            tracing::info!(client = id, pid, flows = nflows, "process released: {why}");
            self.departed.push((pid, id));
            self.sweep();
        }
    }

    /// Removes the DPDK runtime files of released processes that no longer exist (a live
    /// secondary still uses its multi-process socket). Cheap: a `stat` per departed process.
    pub(super) fn sweep(&mut self) {
        self.swept_at = Instant::now();
        let dir = crate::eal::runtime_dir(&self.cfg.daemon.file_prefix);
        let pool = self.pool;
        self.departed.retain(|&(pid, client)| {
            if runs(pid) {
                return true;
            }
            // SAFETY: the process no longer runs and its rings are freed (it was
            // released), so nothing else holds an mbuf marked with its id.
            let n = unsafe { holder::reclaim(pool, client) };
            if n > 0 {
                tracing::info!(
                    client,
                    pid,
                    mbufs = n,
                    "mbufs a departed process held taken back"
                );
            }
            let n = crate::eal::remove_secondary_files(&dir, pid);
            tracing::debug!(
                pid,
                files = n,
                "runtime files of a departed process removed"
            );
            false
        });
    }
}

/// The refusal of a process that speaks another protocol version.
fn unsupported(version: u32) -> String {
    format!(
        "protocol version {version} is not supported, urdmad speaks {}",
        proto::VERSION
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polled(fds: &[(RawFd, bool)]) -> Vec<libc::pollfd> {
        fds.iter()
            .map(|&(fd, r)| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: if r { libc::POLLIN } else { 0 },
            })
            .collect()
    }

    #[test]
    fn a_sleeps_readiness_is_only_trusted_for_the_descriptors_it_polled() {
        let r = ControlReady::of(&polled(&[(3, false), (7, true), (9, false)]));
        assert_eq!(r.readable(&[3, 7, 9], 7), Some(true));
        assert_eq!(r.readable(&[3, 7, 9], 9), Some(false));
        // A process came or went since: nothing is known, so the pass looks again.
        assert_eq!(r.readable(&[3, 7], 7), None);
        assert_eq!(r.readable(&[3, 8, 9], 9), None);
        assert_eq!(r.readable(&[3, 7, 9, 11], 3), None);
    }

    #[test]
    fn a_kernel_message_read_since_the_sleep_makes_the_processes_sockets_looked_at_again() {
        // 3 the listener, 7 a process, 9 urdma.ko's channel: the sleep saw only the channel.
        let r = ControlReady::of(&polled(&[(3, false), (7, false), (9, true)]));
        let all = [3, 7, 9];
        assert_eq!(r.sockets(&all, &[3, 7], false), Some(vec![false, false]));
        // The channel gave a message: the process's `PARK` may have come after the sleep.
        assert_eq!(r.sockets(&all, &[3, 7], true), None);
        assert_eq!(r.sockets(&[3, 7, 8, 9], &[3, 7, 8], false), None);
    }
}
