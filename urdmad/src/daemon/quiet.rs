//! A process's quiet socket (`QUIET`): the end of a connection that is already over for
//! the kernel (a lingering close's `UNQP` and `CLOSE`, a `QPCLOSED` after the owner's own
//! close, sockets given back or parked) is posted there, and urdmad reads it when something
//! else wakes it, at least every `QUIET_SLEEP`: a connection's end costs urdmad no wake-up
//! (a process switch) of its own.
//!
//! Order: a process's quiet lines are handled before any line it wrote on its control
//! socket after them, and after the kernel's messages of the same pass: a connection being
//! set up does not wait for another's clean-up.

use super::control::MAX_HELD_FDS;
use super::{error, Daemon};
use crate::proto::{ErrorCode, Request, Response};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

pub(super) struct Quiet {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

impl Quiet {
    /// Descriptors received and not handed on, for closing off the path.
    pub(super) fn take_fds(&mut self) -> VecDeque<OwnedFd> {
        std::mem::take(&mut self.fds)
    }
}

impl Daemon {
    /// `QUIET`: the Unix stream socket that came with the line becomes client `i`'s quiet
    /// socket.
    pub(super) fn open_quiet(&mut self, i: usize) -> Response {
        let Some(fd) = self.clients[i].fds.pop_front() else {
            return error(ErrorCode::Invalid, "QUIET came without a socket");
        };
        if self.clients[i].quiet.is_some() {
            return error(ErrorCode::Exists, "a quiet socket is open already");
        }
        let stream_socket = crate::direct::socket_domain(fd.as_raw_fd()) == Some(libc::AF_UNIX)
            && crate::direct::socket_type(fd.as_raw_fd()) == Some(libc::SOCK_STREAM);
        if !stream_socket {
            return error(
                ErrorCode::Invalid,
                "what came with QUIET is not a Unix stream socket",
            );
        }
        let stream = UnixStream::from(fd);
        if let Err(e) = stream.set_nonblocking(true) {
            return error(ErrorCode::Invalid, &format!("quiet socket: {e}"));
        }
        self.clients[i].quiet = Some(Quiet {
            stream,
            buf: Vec::new(),
            fds: VecDeque::new(),
        });
        Response::Ok
    }

    /// Reads every process's quiet socket that has something (one `poll` for all).
    pub(super) fn serve_quiet(&mut self) {
        let (clients, mut fds): (Vec<usize>, Vec<libc::pollfd>) = self
            .clients
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let q = c.quiet.as_ref()?;
                let fd = libc::pollfd {
                    fd: q.stream.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                Some((i, fd))
            })
            .unzip();
        if fds.is_empty() {
            return;
        }
        // SAFETY: fds is a valid array of pollfd.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) } <= 0 {
            return;
        }
        for (i, f) in clients.into_iter().zip(&fds) {
            if f.revents != 0 {
                self.read_quiet(i);
            }
        }
    }

    /// Handles what client `i`'s quiet socket holds. A quiet socket that ends, or sends what
    /// does not belong there, is closed; the control socket decides the process's fate.
    pub(super) fn read_quiet(&mut self, i: usize) {
        let Some(q) = self.clients[i].quiet.as_mut() else {
            return;
        };
        let mut ended = !crate::fdpass::read_there(&q.stream, &mut q.buf, &mut q.fds);
        loop {
            let Some(q) = self.clients[i].quiet.as_mut() else {
                return;
            };
            let Some(pos) = q.buf.iter().position(|&b| b == b'\n') else {
                break;
            };
            let line: Vec<u8> = q.buf.drain(..=pos).collect();
            if !self.handle_quiet(i, &line) {
                ended = true;
                break;
            }
        }
        let c = &mut self.clients[i];
        if c.quiet
            .as_ref()
            .is_some_and(|q| q.buf.len() > crate::proto::MAX_LINE)
        {
            ended = true;
        }
        let extra: Vec<OwnedFd> = match c.quiet.as_mut() {
            Some(q) if ended => q.take_fds().into(),
            Some(q) => {
                let n = q.fds.len().saturating_sub(MAX_HELD_FDS);
                q.fds.drain(..n).collect()
            }
            None => Vec::new(),
        };
        if ended {
            c.quiet = None;
        }
        for fd in extra {
            self.close_off_path(fd);
        }
    }

    /// One quiet line: done as on the control socket, a refusal sent there. False when the
    /// line has no place on the quiet socket.
    fn handle_quiet(&mut self, i: usize, line: &[u8]) -> bool {
        if self.clients[i].refused.is_some() {
            return false;
        }
        let Ok((req, posted)) = std::str::from_utf8(line)
            .map_err(|_| ())
            .and_then(|l| Request::decode_line(l).map_err(|_| ()))
        else {
            tracing::warn!(client = self.clients[i].id, "quiet socket: malformed line");
            return false;
        };
        if !posted || !req.is_quiet() {
            let refusal = req.posted_outcome(
                &error(
                    ErrorCode::Invalid,
                    "only posted clean-up requests come on the quiet socket",
                )
                .encode(),
            );
            let _ = self.send(i, &refusal.unwrap_or_default());
            return false;
        }
        let named = req.clone();
        let reply = match req {
            Request::GiveBack => {
                let fd = self.clients[i]
                    .quiet
                    .as_mut()
                    .and_then(|q| q.fds.pop_front());
                self.take_back(i, fd).encode()
            }
            req => self.answer(i, req).0,
        };
        if let Some(refused) = named.posted_outcome(&reply) {
            let _ = self.send(i, &refused);
        }
        true
    }
}
