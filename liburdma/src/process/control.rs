//! The control connection to urdmad: requests, and the events urdmad sends.
//!
//! `ARM` is posted: urdmad looks at the process's rings when it takes the
//! `ARM` and sends `EVENT WAKE` at once if a frame is there, so a frame that
//! came after the last round and before the `ARM` took effect still wakes
//! the helper. Posted requests get no reply unless refused, so none wakes
//! the helper for nothing. Waiting for the reply would hold
//! the lock, and so every application thread in a verb, until urdmad got
//! round to the control socket (it reads it every couple of milliseconds
//! while it forwards traffic).
//!
//! Nor do application calls wait for urdmad, but for the first `create_qp`
//! (attaching) and the rare `SYNC` of a post that finds its QP not yet
//! connected: `QP`, `UNQP`, `PEERCLOSED` and `QPCLOSED` are posted, and a
//! refusal (`EVENT REFUSED`) is logged where it is read.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use trp::Instant;
use urdma_shared::bell::{self, BellWord};
use urdma_shared::client::{Connection as Control, ConnectionFds, Urgency};
use urdma_shared::proto::{Event, Request, Response};

use super::helper::kick_helper;
use super::{lock, rt, Shared};
use crate::dpdk::{self, DpdkFlow};
use crate::engine::{Flow, Notice, QpKey, Unregister};
use crate::error::Error;
use crate::log;
use crate::socket_flow::SocketFlow;

/// Tells urdmad what it must hear of a destroyed QP: its `QPCLOSED` if destroying it made
/// one, and `UNQP` unless that was all. Posted: urdmad accepts it whatever it finds, so
/// `ibv_destroy_qp` need not wait a round trip for it (a refusal would still be logged, as
/// every posted request's is). A QP whose closed connection urdmad heard of wakes nobody.
pub fn unregister_qp(key: QpKey, told: Unregister) {
    let mut g = lock();
    if g.control().is_none() {
        return;
    }
    // After the QP's own QPCLOSED, if destroying it made one (urdmad takes requests in
    // order), in the same write. A lingering close's comes when it is over.
    g.deliver_notices_then((told == Unregister::Unqp).then_some(Request::Unqp {
        dev: key.0,
        qpn: key.1,
        linger: false,
    }));
}

impl Shared {
    /// urdmad's control connection, while it lasts.
    fn control(&mut self) -> Option<&mut Control> {
        self.attached.as_mut().and_then(|a| a.ctl.as_mut())
    }

    /// One request to urdmad, waited for under the lock; events it meets are handled. Only
    /// where waiting is rare: see [`ask`].
    fn request(
        &mut self,
        what: &'static str,
        req: &Request,
        now: Instant,
    ) -> Result<Response, Error> {
        let Some(ctl) = self.control() else {
            return Err(Error::UrdmadGone);
        };
        let r = ctl.request(req);
        self.pump(now);
        r.map_err(|source| Error::Urdmad { what, source })
    }

    /// Posts `req`, whose outcome nothing waits for (a refusal is logged when it is read).
    fn post(&mut self, req: &Request) {
        if let Some(ctl) = self.control() {
            if let Err(e) = ctl.post(req) {
                log::error(format_args!("{}: {e}", req.encode().trim_end()));
            }
        }
    }

    /// Posts `ARM` (see the module's comment on progress).
    pub(super) fn arm(&mut self) {
        let Some(ctl) = self.control() else {
            return;
        };
        match ctl.post(&Request::Arm) {
            Ok(()) => self.armed = true,
            Err(e) => log::error(format_args!("ARM: {e}")),
        }
    }

    fn expect_ok(&mut self, what: &'static str, req: &Request, now: Instant) -> Result<(), Error> {
        match self.request(what, req, now)? {
            Response::Ok => Ok(()),
            other => Err(Error::Urdmad {
                what,
                source: urdma_shared::client::refusal(other),
            }),
        }
    }

    /// Reads and handles urdmad's events (never blocks). When urdmad has
    /// closed the connection every QP fails.
    pub fn pump(&mut self, now: Instant) -> bool {
        let Some(ctl) = self.control() else {
            return false;
        };
        let polled = ctl.poll_events();
        for r in ctl.take_refusals() {
            log::error(format_args!("{r}"));
        }
        match polled {
            Ok(events) => {
                let any = !events.is_empty();
                if any && self.helper_sleep.is_some() {
                    // Read by an application thread while the helper sleeps:
                    // it must re-arm (a WAKE is one-shot).
                    self.helper_sleep = None;
                    kick_helper();
                }
                for e in events {
                    self.handle_event(e, now);
                }
                any
            }
            Err(e) => {
                log::error(format_args!("{e}: every QP fails"));
                if let Some(a) = self.attached.as_mut() {
                    a.ctl = None;
                }
                self.engine.fail_all(now);
                // Nobody would use them again.
                crate::socket_flow::forget_parked();
                // No flow is left and no EVENT CONNECTED can come: nothing
                // touches urdmad's memory any more.
                dpdk::detach();
                true
            }
        }
    }

    fn handle_event(&mut self, e: Event, now: Instant) {
        match e {
            Event::Wake => self.armed = false,
            // The client keeps these for `take_refusals` and returns none; logged all the same.
            Event::Refused {
                request, message, ..
            } => log::error(format_args!("{request}: urdmad refused: {message}")),
            Event::Disconnect { dev, qpn, status } => {
                if status == 0 {
                    log::debug(format_args!("QP {dev}/{qpn}: disconnect"));
                    self.engine.close((dev, qpn));
                } else {
                    // Not the application's doing: say so, as for a failure of trp's.
                    log::info(format_args!(
                        "QP {dev}/{qpn}: aborted by the connection manager (status {status})"
                    ));
                    self.engine.abort((dev, qpn), now);
                }
            }
            Event::Connected(c) => {
                let key = (c.dev, c.qpn);
                let Some(a) = self.attached.as_mut() else {
                    return;
                };
                let sock = a.ctl.as_mut().and_then(|ctl| ctl.take_fds(c.dev, c.qpn));
                let r = a
                    .rings
                    .flow(c.port, &c.rx_ring, c.local, c.remote, c.mac.0, c.stats)
                    .and_then(|flow| make_flow(flow, &c, sock))
                    .and_then(|flow| self.engine.connected(key, &c, flow, now));
                match r {
                    Ok(()) => log::debug(format_args!(
                        "QP {}/{} connected {} -> {} ({:?})",
                        c.dev, c.qpn, c.local, c.remote, c.role
                    )),
                    Err(e) => {
                        log::error(format_args!("QP {}/{}: {e}", c.dev, c.qpn));
                        self.engine.drop_flow(key);
                        self.post(&Request::QpClosed {
                            dev: c.dev,
                            qpn: c.qpn,
                            status: -libc::ECONNRESET,
                        });
                    }
                }
            }
        }
    }

    /// Ends QP `key`'s connection for iw_cm as its owner's move to SQD does (urdma.ko's
    /// `CLOSE`: the application's `DISCONNECTED`), unless that was done, or the QP is being
    /// destroyed (its handle may then name a new QP).
    fn end_for_kernel(&mut self, key: QpKey) {
        if self.engine.is_kernel_ended(key) {
            return;
        }
        let Some(&qp) = self.handles.get(&key) else {
            return;
        };
        if crate::control_verbs::end_connection(qp as *mut rdma_core_sys::ibv_qp) {
            self.engine.kernel_ended(key);
        }
    }

    /// Tells urdmad what the engine found (PEERCLOSED, QPCLOSED), and urdma.ko which SRQs
    /// fell below their limit. Posted: nothing here
    /// depends on the reply, and urdmad takes requests in order, so a later request of this
    /// process (`UNQP`) finds them done.
    pub fn deliver_notices(&mut self) {
        self.deliver_notices_then(None);
    }

    /// [`Shared::deliver_notices`], and `last` after them in the same write.
    fn deliver_notices_then(&mut self, last: Option<Request>) {
        crate::srq::report_limits(self.engine.take_srq_limits());
        let mut told = Vec::new();
        // Only what the kernel waits for wakes urdmad: a connection's end it has not heard
        // of from urdma.ko, a destroyed QP's abort (`last`).
        let mut urgency = if last.is_some() {
            Urgency::Now
        } else {
            Urgency::Later
        };
        let notices = self.engine.take_notices();
        // The peer's FIN ends the connection for the application, as siw's does: urdma.ko
        // hears it from the provider, not from a wake-up of urdmad.
        for n in &notices {
            if let Notice::PeerClosed(key) = *n {
                self.end_for_kernel(key);
            }
        }
        let lingered = self.engine.take_lingered();
        if (!notices.is_empty() || !lingered.is_empty())
            && super::at_exit::WAITING.load(Ordering::Relaxed)
        {
            rt().closes.notify_all();
        }
        for n in notices {
            let n = self.engine.as_kernel_heard(n);
            if let Notice::Closed(..) = n {
                urgency = Urgency::Now;
            }
            told.push(match n {
                Notice::PeerClosed((dev, qpn)) => Request::PeerClosed { dev, qpn },
                Notice::Closed((dev, qpn), status) | Notice::Ended((dev, qpn), status) => {
                    Request::QpClosed { dev, qpn, status }
                }
            });
            // Told below: its flow goes now, and its socket back after.
            if let Some((key, _)) = n.closed() {
                self.engine.release_closed_flow(key);
            }
        }
        let (returned, parked) = crate::socket_flow::take_for_urdmad();
        if self.control().is_none() {
            // Without urdmad these close here: its copies are gone too, and nobody would
            // use a parked one again.
            if !parked.is_empty() {
                crate::socket_flow::forget_parked();
            }
            return;
        }
        // A peer's close alone wakes nobody: the kernel's PEER_CLOSED only moves iw_cm to
        // CLOSING, which rdma_cm never shows, and the QPCLOSED or UNQP that always follows
        // (the close ends, fails, or the QP is destroyed; a process's death says it too)
        // carries it: urdmad tells the kernel once, and a QPCLOSED tells it anyway.
        let only_peer_closed = told.iter().all(|r| matches!(r, Request::PeerClosed { .. }));
        if only_peer_closed
            && returned.is_empty()
            && parked.is_empty()
            && lingered.is_empty()
            && last.is_none()
        {
            self.peer_closed.append(&mut told);
            return;
        }
        told.splice(0..0, self.peer_closed.drain(..));
        let Some(ctl) = self.control() else { return };
        let later: Vec<Request> = parked
            .into_iter()
            .map(|cookie| Request::Park { cookie })
            .chain(lingered.into_iter().flat_map(|((dev, qpn), flow)| {
                [
                    Request::Unqp {
                        dev,
                        qpn,
                        linger: true,
                    },
                    Request::Close { flow },
                ]
            }))
            .chain(last)
            .collect();
        // One write wakes urdmad once for all of it.
        if let Err(e) = ctl.post_all_giving_back(&told, returned, &later, urgency) {
            log::error(format_args!(
                "PEERCLOSED, QPCLOSED, GIVEBACK, PARK, CLOSE, UNQP: {e}"
            ));
        }
    }

    /// Reads the socket, and if that brings nothing asks for the rest of
    /// urdmad's events with `SYNC`.
    pub(super) fn catch_up(&mut self, now: Instant) {
        if self.pump(now) {
            return;
        }
        if let Err(e) = self.expect_ok("SYNC", &Request::Sync, now) {
            log::error(format_args!("{e}"));
        }
    }
}

/// The connection's bell word from its map `map`: `parked`, the word a parked socket kept
/// mapped, when `map` is the same map (a mapping and its unmapping are the dearest calls of
/// a connection's set-up and end); a new mapping otherwise. Without its word the bell never
/// rings for the connection: it works all the same.
fn map_bell(
    map: Option<OwnedFd>,
    parked: Option<BellWord>,
    c: &urdma_shared::proto::Connected,
) -> Option<BellWord> {
    let map = map?;
    if let Some(mut word) = parked {
        if matches!((word.map_id(), bell::map_id(&map)), (Ok(a), Ok(b)) if a == b) {
            word.reset();
            return Some(word);
        }
    }
    BellWord::map(map)
        .map_err(|e| log::info(format_args!("QP {}/{}: no bell: {e}", c.dev, c.qpn)))
        .ok()
}

/// The flow of a connection urdmad handed over: on the direct path when it passed the
/// connection's socket, through urdmad's rings otherwise; either way with the word of
/// urdma.ko's bell when urdmad passed one.
fn make_flow(
    ring: DpdkFlow,
    c: &urdma_shared::proto::Connected,
    fds: Option<ConnectionFds>,
) -> Result<Box<dyn Flow>, Error> {
    let (sock, bell, hush) = match fds {
        Some(f) => (f.socket, f.bell, f.hush),
        None => (None, None, None),
    };
    let hushed = hush.is_some_and(|map| super::adopt_hush(map, c));
    if c.direct == 0 {
        return Ok(Box::new(ring.with_bell(map_bell(bell, None, c), hushed)));
    }
    // urdmad no longer takes the connection's frames: without the socket nothing arrives.
    let geo = urdma_shared::direct::Geometry::new(c.datagram, c.direct);
    let (rings, parked_bell) = if c.reuse != 0 {
        let (rings, parked_bell) = crate::socket_flow::take_parked(c.reuse).ok_or(
            Error::HandOver("urdmad named a parked socket this process does not hold".into()),
        )?;
        if rings.geometry() != geo {
            return Err(Error::HandOver(
                "urdmad named a parked socket of other rings".into(),
            ));
        }
        (rings, parked_bell)
    } else {
        let sock = sock.ok_or(Error::HandOver(
            "urdmad put the connection on the direct path but passed no socket".into(),
        ))?;
        (crate::socket_flow::map(sock, geo)?, None)
    };
    let bell = map_bell(bell, parked_bell, c);
    let epoll = rt()
        .sockets
        .get()
        .ok_or(Error::HandOver("no epoll set for the direct path".into()))?
        .as_raw_fd();
    let ep = ring.endpoints();
    Ok(Box::new(SocketFlow::new(
        ring, rings, ep, epoll, bell, hushed, c.park,
    )?))
}

#[cfg(test)]
mod tests {
    use super::super::{now, Attached, EVENT_LOOK};
    use super::*;
    use crate::dpdk::Rings;
    use crate::engine::Engine;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::time::Duration;

    #[test]
    fn writing_to_a_closed_socket_does_not_raise_sigpipe() {
        use std::io::Write;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(b);
        // The default action, as in a C application (Rust's runtime
        // ignores SIGPIPE). std's socket writes pass MSG_NOSIGNAL, so a
        // write to a urdmad that has gone away fails with EPIPE instead of
        // killing the application; this would kill the test otherwise.
        // SAFETY: changing the disposition for the test, restored below.
        let prev = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let _ = a.write_all(b"x");
        let r = a.write_all(b"ARM\n");
        // SAFETY: restoring what was there.
        unsafe { libc::signal(libc::SIGPIPE, prev) };
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
        // SAFETY: reading the calling thread's pending set and mask.
        unsafe {
            let mut p: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut p);
            assert_eq!(libc::sigismember(&p, libc::SIGPIPE), 0);
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut p);
            assert_eq!(libc::sigismember(&p, libc::SIGPIPE), 0);
        }
    }

    /// A fake urdmad on a socket that answers HELLO; the connection and the
    /// daemon's end of it.
    fn fake_urdmad(dir: &Path) -> (Control, std::os::unix::net::UnixStream) {
        use std::io::{BufRead, Write};
        let path = dir.join("urdmad.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let daemon = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            std::io::BufReader::new(&s).read_line(&mut line).unwrap();
            assert!(
                matches!(Request::decode(&line), Ok(Request::Hello { .. })),
                "{line}"
            );
            let hello = Response::Hello {
                version: urdma_shared::proto::VERSION,
                daemon: "fake".into(),
            };
            (&s).write_all(hello.encode().as_bytes()).unwrap();
            s
        });
        let ctl = Control::connect(&path, Duration::from_secs(5)).unwrap();
        (ctl, daemon.join().unwrap())
    }

    #[test]
    fn losing_urdmad_fails_every_qp_and_ends_the_attachment() {
        use crate::engine::QpInit;
        let dir = std::env::temp_dir().join(format!("urdma-lost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (state, daemon) = attached_to_fake(&dir);
        let path = dir.join("urdmad.sock");
        let mut sh = state.into_inner().unwrap();
        let key = (1, 7);
        sh.engine.create_cq((1, 1), 8, None);
        sh.engine.create_qp(
            key,
            QpInit {
                pd: 1,
                send_cq: (1, 1),
                recv_cq: (1, 1),
                sig_all: false,
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
                srq: None,
            },
        );
        sh.engine.post_recv(key, 42, &[]).unwrap();
        let t = now();
        assert!(!sh.pump(t), "nothing from a live urdmad yet");
        assert_eq!(sh.ensure_attached(&path), Ok(()));

        drop(daemon); // kill -9
        assert!(sh.pump(t));
        assert!(sh.attached.as_ref().unwrap().ctl.is_none());
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wc = [unsafe { std::mem::zeroed::<rdma_core_sys::ibv_wc>() }; 4];
        assert_eq!(sh.engine.poll_cq((1, 1), &mut wc, t), Some(1));
        assert_eq!(wc[0].wr_id, 42);
        assert_eq!(wc[0].status, rdma_core_sys::IBV_WC_WR_FLUSH_ERR);
        // Posts after the loss flush too; nothing asks urdmad anything.
        sh.engine.post_recv(key, 43, &[]).unwrap();
        sh.engine.progress(t);
        assert_eq!(sh.engine.poll_cq((1, 1), &mut wc, t), Some(1));
        assert_eq!(wc[0].status, rdma_core_sys::IBV_WC_WR_FLUSH_ERR);
        assert_eq!(
            sh.ensure_attached(&path).map_err(|e| e.errno()),
            Err(libc::ENOTCONN)
        );
        assert!(sh.control().is_none());
        assert!(sh.expect_ok("SYNC", &Request::Sync, t).is_err());
        assert!(!sh.pump(t));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A process's state attached to a fake urdmad; the daemon's end.
    fn attached_to_fake(dir: &Path) -> (Mutex<Shared>, std::os::unix::net::UnixStream) {
        let (ctl, daemon) = fake_urdmad(dir);
        let sh = Shared {
            engine: Engine::new(),
            attached: Some(Attached {
                path: dir.join("urdmad.sock"),
                devices: Vec::new(),
                ctl: Some(ctl),
                rings: Rings::none(),
            }),
            attach_failed: None,
            helper_sleep: None,
            helper_direct: false,
            armed: false,
            event_look: Instant::ZERO,
            peer_closed: Vec::new(),
            handles: Default::default(),
        };
        (Mutex::new(sh), daemon)
    }

    /// A process's state attached to a fake urdmad in a new directory named for `tag`.
    fn fresh_fake(tag: &str) -> (PathBuf, Shared, std::os::unix::net::UnixStream) {
        let dir = std::env::temp_dir().join(format!("urdma-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (state, daemon) = attached_to_fake(&dir);
        (dir, state.into_inner().unwrap(), daemon)
    }

    /// Everything urdmad can read now, as lines.
    fn lines_there(daemon: &std::os::unix::net::UnixStream) -> Vec<String> {
        use std::io::Read;
        daemon.set_nonblocking(true).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while let Ok(n) = (&*daemon).read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_peers_close_and_a_lingering_qps_unqp_go_with_the_qps_next_lines() {
        use crate::engine::Notice;
        let (dir, mut sh, daemon) = fresh_fake("peer");
        let line = |r: Request| r.encode_posted().trim_end().to_owned();
        sh.engine.notice(Notice::PeerClosed((1, 5)));
        sh.deliver_notices();
        assert!(lines_there(&daemon).is_empty());
        sh.engine.notice(Notice::Closed((1, 5), 0));
        sh.deliver_notices();
        let closed = Request::QpClosed {
            dev: 1,
            qpn: 5,
            status: 0,
        };
        assert_eq!(
            lines_there(&daemon),
            [line(Request::PeerClosed { dev: 1, qpn: 5 }), line(closed)]
        );
        // A destroyed QP's UNQP carries it too, in the same write.
        sh.engine.notice(Notice::PeerClosed((1, 6)));
        sh.deliver_notices();
        let unqp = Request::Unqp {
            dev: 1,
            qpn: 6,
            linger: true,
        };
        sh.deliver_notices_then(Some(unqp.clone()));
        assert_eq!(
            lines_there(&daemon),
            [line(Request::PeerClosed { dev: 1, qpn: 6 }), line(unqp)]
        );
        // A lingering close's UNQP comes when it is over, with its flow's CLOSE.
        sh.engine.lingered((1, 7), 33);
        sh.deliver_notices();
        let unqp = Request::Unqp {
            dev: 1,
            qpn: 7,
            linger: true,
        };
        assert_eq!(
            lines_there(&daemon),
            [line(unqp), line(Request::Close { flow: 33 })]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_what_the_kernel_waits_for_wakes_urdmad_the_rest_goes_on_the_quiet_socket() {
        use crate::engine::Notice;
        let (dir, mut sh, daemon) = fresh_fake("quiet");
        let line = |r: Request| r.encode_posted().trim_end().to_owned();
        sh.control().unwrap().open_quiet().unwrap();
        let mut buf = [0u8; 256];
        let mut fds = std::collections::VecDeque::new();
        let n = urdma_shared::fdpass::recv_with_fds(&daemon, &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], Request::Quiet.encode_posted().as_bytes());
        let quiet = std::os::unix::net::UnixStream::from(fds.pop_front().unwrap());
        // The end of a connection urdma.ko ended at its owner's SQD, and a lingering close.
        sh.engine.notice(Notice::PeerClosed((1, 5)));
        sh.engine.notice(Notice::Ended((1, 5), 0));
        sh.engine.lingered((1, 7), 33);
        sh.deliver_notices();
        let closed = |qpn, status| Request::QpClosed {
            dev: 1,
            qpn,
            status,
        };
        let unqp = |qpn, linger| Request::Unqp {
            dev: 1,
            qpn,
            linger,
        };
        assert!(lines_there(&daemon).is_empty());
        assert_eq!(
            lines_there(&quiet),
            [
                line(Request::PeerClosed { dev: 1, qpn: 5 }),
                line(closed(5, 0)),
                line(unqp(7, true)),
                line(Request::Close { flow: 33 })
            ]
        );
        // An end the kernel has not heard of, and a destroyed QP's abort, wake urdmad.
        sh.engine.notice(Notice::Closed((1, 6), 0));
        sh.engine.notice(Notice::Ended((1, 8), -libc::ECONNRESET));
        sh.deliver_notices();
        assert_eq!(
            lines_there(&daemon),
            [line(closed(6, 0)), line(closed(8, -libc::ECONNRESET))]
        );
        sh.deliver_notices_then(Some(unqp(9, false)));
        assert_eq!(lines_there(&daemon), [line(unqp(9, false))]);
        assert!(lines_there(&quiet).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_device_found_served_by_the_attached_urdmad_is_not_looked_up_again() {
        let dir = std::env::temp_dir().join(format!("urdma-dev-{}", std::process::id()));
        let (dev, other) = (dir.join("urdma0"), dir.join("urdma1"));
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let (state, _daemon) = attached_to_fake(&dir);
        let mut sh = state.into_inner().unwrap();
        let socket = dir.join("urdmad.sock");
        std::fs::write(dev.join("urdmad"), format!("{}\n", socket.display())).unwrap();
        std::fs::write(other.join("urdmad"), "/elsewhere/urdmad.sock\n").unwrap();
        assert_eq!(sh.ensure_attached_for(&dev), Ok(()));
        // sysfs is not read again for it...
        std::fs::remove_file(dev.join("urdmad")).unwrap();
        assert_eq!(sh.ensure_attached_for(&dev), Ok(()));
        // ...but is for a device not seen yet, which another urdmad serves.
        assert_eq!(
            sh.ensure_attached_for(&other).map_err(|e| e.errno()),
            Err(libc::EINVAL)
        );
        assert_eq!(
            sh.ensure_attached_for(&dir).map_err(|e| e.errno()),
            Err(libc::ENODEV)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_application_polling_reads_urdmads_events_now_and_then() {
        use std::io::Write;
        let (dir, mut sh, daemon) = fresh_fake("look");
        // What urdmad wrote waits until a round looks: the helper may not get the lock.
        let wake = |sh: &mut Shared| {
            sh.armed = true;
            (&daemon)
                .write_all(Event::Wake.encode().as_bytes())
                .unwrap();
            std::thread::sleep(Duration::from_millis(20));
        };
        let t = now();
        wake(&mut sh);
        sh.full_round(t);
        assert!(!sh.armed, "read by the application's round");
        // Not on every poll: the next look is EVENT_LOOK later.
        wake(&mut sh);
        sh.full_round(t + EVENT_LOOK / 2);
        assert!(sh.armed, "a poll within EVENT_LOOK reads nothing");
        sh.full_round(t + EVENT_LOOK);
        assert!(!sh.armed);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
