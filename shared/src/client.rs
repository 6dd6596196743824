//! The client side of the control protocol: connect, greet, send requests, read replies and
//! the daemon's unsolicited events. Needs only `std`, like [`crate::proto`], so the provider
//! can use it as is (the status report's records, which need serde, only with the `status`
//! feature).
//!
//! Events (`EVENT ...` lines, protocol version 2) may arrive between any two replies. A
//! request reads lines until its reply and queues the events it meets; [`Connection::poll_events`]
//! returns the queued events and whatever else has arrived, without blocking. A provider's
//! progress thread `poll()`s [`Connection::as_raw_fd`] for `POLLIN` and then calls
//! `poll_events`; after any request it calls `poll_events` too (a request may have queued
//! events that the socket no longer shows as readable), or checks [`Connection::has_events`].
//!
//! An `EVENT CONNECTED` whose connection takes the direct path (`direct` frames, not 0)
//! comes with the connection's packet socket attached (`SCM_RIGHTS`, [`crate::direct`]), and
//! one whose frames ring urdma.ko's bell with the map of its word: [`Connection::take_fds`]
//! hands them over.
//!
//! Replies come in the order of the requests, so each reply line read is matched with the
//! oldest request not yet answered, whoever reads it. [`Connection::post`] sends a request
//! posted (`post`): the daemon answers it only if it refuses it, with an `EVENT REFUSED` that
//! is kept for [`Connection::take_refusals`] wherever it is read. [`Connection::send`]
//! sends one whose reply is kept until [`Connection::answer`] takes it. Both let a provider
//! that serialises its calls with a lock release the lock while the daemon gets round to
//! answering, rather than stall every thread of the process meanwhile; [`Connection::request`]
//! sends and waits.

use crate::fdpass;
use crate::proto::{self, ErrorCode, Event, Request, Response, MAX_LINE};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What comes with a connection's `EVENT CONNECTED`.
#[derive(Debug)]
pub struct ConnectionFds {
    /// Its packet socket ([`crate::direct`]), on the direct path.
    pub socket: Option<OwnedFd>,
    /// The map of its bell's word ([`crate::bell`]), when urdma.ko rings it.
    pub bell: Option<OwnedFd>,
    /// The map of the process's hush word ([`crate::bell::Hush`]), when urdma.ko reads it
    /// for the connection's frames.
    pub hush: Option<OwnedFd>,
}

/// Most bytes one read takes from the socket.
const READ_CHUNK: usize = 4096;

/// A greeted connection to urdmad.
pub struct Connection {
    stream: UnixStream,
    /// The process's end of its quiet socket ([`Connection::open_quiet`]).
    quiet: Option<UnixStream>,
    /// Bytes received and not yet taken as lines.
    buf: Vec<u8>,
    /// Events met while waiting for a reply, or read by `poll_events`, not yet returned.
    events: VecDeque<Event>,
    /// The daemon closed the connection (seen by a non-blocking read).
    closed: bool,
    /// Descriptors received and not yet matched with their event.
    fds: VecDeque<OwnedFd>,
    /// What came with connections' `EVENT CONNECTED`, by (dev, qpn), until taken.
    handed: HashMap<(u32, u32), ConnectionFds>,
    /// The requests sent (not posted) and not answered yet, oldest first.
    pending: VecDeque<Awaiting>,
    /// Replies of [`Connection::send`]'s requests not taken yet, by ticket.
    answers: HashMap<u64, String>,
    /// Posted requests that urdmad refused, as lines for the user.
    refusals: Vec<String>,
    /// The ticket of the next [`Connection::send`].
    next_ticket: u64,
    /// The daemon's self-description from its `HELLO`.
    pub daemon: String,
    timeout: Duration,
    /// The control socket's path.
    path: PathBuf,
}

/// Why talking to urdmad failed; shown, it is one line for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The control socket's permissions keep this process out.
    #[error("permission denied connecting to urdmad at {} (only root and the configured group may use it)", path.display())]
    PermissionDenied { path: PathBuf },
    /// No urdmad at `path`, or it could not be reached.
    #[error("cannot connect to urdmad at {}: {message}", path.display())]
    Connect {
        path: PathBuf,
        kind: io::ErrorKind,
        message: String,
    },
    /// Reading, writing or setting up the socket failed (`doing` says which).
    #[error("{doing}: {message}")]
    Io {
        doing: &'static str,
        kind: io::ErrorKind,
        message: String,
    },
    #[error("urdmad closed the connection")]
    Closed,
    #[error("urdmad did not answer within {0:?} (is it still starting?)")]
    Timeout(Duration),
    /// urdmad greeted with another protocol version than this client's.
    #[error("urdmad speaks protocol version {daemon}, this client {client}")]
    Version { daemon: u32, client: u32 },
    /// urdmad answered in the text protocol of versions before 11 (`proto::legacy`).
    #[error("urdmad speaks an older control protocol than this client's version {client} (update urdmad or use the provider it came with); it answered: {answer}")]
    OldDaemon { client: u32, answer: String },
    /// urdmad answered with `ERROR` (a refusal of the protocol version is `code` `EVERSION`).
    #[error("urdmad refused ({}): {message}", code.as_str())]
    Refused { code: ErrorCode, message: String },
    /// A well-formed reply, but not one that answers the request (its line).
    #[error("unexpected reply from urdmad: {0}")]
    Unexpected(String),
    /// A line this client cannot read: not UTF-8, too long, or not a reply (or a status
    /// record) of this protocol version.
    #[error("{0}")]
    Malformed(String),
}

impl Error {
    fn io(doing: &'static str, e: io::Error) -> Error {
        Error::Io {
            doing,
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

/// A request sent with [`Connection::send`], to collect its reply with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// What becomes of the reply to a request sent and not answered yet.
enum Awaiting {
    /// Sent: kept under its ticket.
    Sent(u64),
    /// Sent, then given up by its sender: dropped.
    Abandoned,
}

impl AsRawFd for Connection {
    /// The socket, to `poll()` for `POLLIN` (an event or the daemon closing). Do not read
    /// from it directly: call [`Connection::poll_events`].
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

impl Connection {
    /// Connects and exchanges `HELLO`. Replies are awaited for at most `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Connection, Error> {
        let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
            io::ErrorKind::PermissionDenied => Error::PermissionDenied {
                path: path.to_owned(),
            },
            kind => Error::Connect {
                path: path.to_owned(),
                kind,
                message: e.to_string(),
            },
        })?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| Error::io("socket setup", e))?;
        let mut c = Connection::over(stream, timeout, path.to_owned());
        match c.request(&Request::Hello {
            version: proto::VERSION,
            pid: std::process::id(),
        })? {
            Response::Hello { version, daemon } if version == proto::VERSION => {
                c.daemon = daemon;
                Ok(c)
            }
            Response::Hello { version, .. } => Err(Error::Version {
                daemon: version,
                client: proto::VERSION,
            }),
            other => Err(refusal(other)),
        }
    }

    /// A connection over `stream`, not greeted yet.
    fn over(stream: UnixStream, timeout: Duration, path: PathBuf) -> Connection {
        Connection {
            stream,
            quiet: None,
            buf: Vec::new(),
            events: VecDeque::new(),
            closed: false,
            fds: VecDeque::new(),
            handed: HashMap::new(),
            pending: VecDeque::new(),
            answers: HashMap::new(),
            refusals: Vec::new(),
            next_ticket: 0,
            daemon: String::new(),
            timeout,
            path,
        }
    }

    /// The next complete line from the buffer, if one is there, as an iterator's next item.
    fn take_line(&mut self) -> Option<Result<String, Error>> {
        match self.buf.iter().position(|&b| b == b'\n') {
            Some(pos) => {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                Some(
                    String::from_utf8(line).map_err(|_| {
                        Error::Malformed("urdmad sent a line that is not UTF-8".into())
                    }),
                )
            }
            None if self.buf.len() > MAX_LINE => {
                Some(Err(Error::Malformed("urdmad sent a line too long".into())))
            }
            None => None,
        }
    }

    /// One read into the buffer; blocks until `deadline` at most. 0 at end of file,
    /// `usize::MAX` when nothing was there.
    fn fill(&mut self, deadline: Option<Instant>) -> Result<usize, Error> {
        let mut chunk = [0u8; READ_CHUNK];
        let r = match deadline {
            None => fdpass::try_recv_with_fds(&self.stream, &mut chunk, &mut self.fds),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(self.late());
                }
                self.stream
                    .set_read_timeout(Some(left))
                    .map_err(|e| Error::io("socket setup", e))?;
                fdpass::recv_with_fds(&self.stream, &mut chunk, &mut self.fds)
            }
        };
        match r {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(usize::MAX),
            Err(e)
                if deadline.is_some()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
            {
                Err(self.late())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(usize::MAX),
            Err(e) => Err(Error::io("reading from urdmad", e)),
        }
    }

    fn late(&self) -> Error {
        Error::Timeout(self.timeout)
    }

    /// The next line that is not an event (events are queued), waiting until `deadline`.
    fn read_reply_line(&mut self, deadline: Instant) -> Result<String, Error> {
        loop {
            while let Some(line) = self.take_line().transpose()? {
                if proto::is_event(&line) {
                    self.queue_event(&line);
                } else {
                    return Ok(line);
                }
            }
            if self.closed || self.fill(Some(deadline))? == 0 {
                self.closed = true;
                return Err(Error::Closed);
            }
        }
    }

    fn queue_event(&mut self, line: &str) {
        // An event this client cannot decode (a newer daemon's) is skipped.
        if let Ok(e) = Event::decode(line) {
            if let Event::Refused {
                request,
                code,
                message,
            } = e
            {
                let why = refusal(Response::Error { code, message });
                self.refusals.push(format!("{request}: {why}"));
                return;
            }
            if let Event::Connected(c) = &e {
                // Its socket (and the bell's and hush's words) came with the line's first bytes, so
                // they are queued by now.
                let socket = if c.direct > 0 && c.reuse == 0 {
                    self.fds.pop_front()
                } else {
                    None
                };
                if socket.is_some() || c.bell {
                    let bell = if c.bell { self.fds.pop_front() } else { None };
                    let hush = if c.bell && c.hush {
                        self.fds.pop_front()
                    } else {
                        None
                    };
                    self.handed
                        .insert((c.dev, c.qpn), ConnectionFds { socket, bell, hush });
                }
            }
            self.events.push_back(e);
        }
    }

    /// The packet socket and the bell's words that came with the `EVENT CONNECTED` of QP
    /// (dev, qpn), if any did.
    pub fn take_fds(&mut self, dev: u32, qpn: u32) -> Option<ConnectionFds> {
        self.handed.remove(&(dev, qpn))
    }

    /// Posts one request (`post`): no reply comes, and a refusal (`EVENT REFUSED`) is kept
    /// for [`Connection::take_refusals`]. For requests whose outcome the caller need not
    /// wait for: `ARM`, `QP`, `UNQP`, `PEERCLOSED`, `QPCLOSED`, `PARK`, `CLOSE`
    /// (`GIVEBACK`: [`Connection::give_back`]).
    pub fn post(&mut self, req: &Request) -> Result<(), Error> {
        self.write(&req.encode_posted())
    }

    /// Posts `reqs` as [`Connection::post`] does, in order, in one write: urdmad is woken
    /// once for all of them (a connection's close posts two or three).
    pub fn post_all(&mut self, reqs: &[Request]) -> Result<(), Error> {
        if reqs.is_empty() {
            return Ok(());
        }
        let lines: String = reqs.iter().map(Request::encode_posted).collect();
        self.write(&lines)
    }

    /// Opens the quiet socket (`QUIET`, posted): lines posted [`Urgency::Later`] go there,
    /// and urdmad reads them when something else wakes it, before anything this process
    /// writes after them.
    pub fn open_quiet(&mut self) -> Result<(), Error> {
        let (mine, theirs) = UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
        let line = Request::Quiet.encode_posted();
        fdpass::send_with_fd(&self.stream, line.as_bytes(), theirs.as_raw_fd())
            .map_err(|e| Error::io("writing to urdmad", e))?;
        mine.set_write_timeout(Some(self.timeout))
            .map_err(|e| Error::io("socket setup", e))?;
        self.quiet = Some(mine);
        Ok(())
    }

    /// Gives a direct connection's socket back (`GIVEBACK`, posted), then closes this
    /// process's copy: urdmad holds it until after that, so this close does not wait for the
    /// kernel's grace periods ([`crate::direct`]).
    pub fn give_back(&mut self, sock: OwnedFd) -> Result<(), Error> {
        let line = Request::GiveBack.encode_posted();
        fdpass::send_with_fd(&self.stream, line.as_bytes(), sock.as_raw_fd())
            .map_err(|e| Error::io("writing to urdmad", e))?;
        drop(sock);
        Ok(())
    }

    /// Posts `first`, a `GIVEBACK` for each of `sockets`, and `then`, in that order and, when
    /// the sockets' descriptors fit one write ([`fdpass::MAX_SEND_FDS`]), in one: urdmad is
    /// woken once for a connection's end (its `QPCLOSED` and its socket, or a lingering
    /// close's `CLOSE` and `PARK`), not once for each. This process's copies of the sockets
    /// are closed after, as [`Connection::give_back`] does. [`Urgency::Later`]: on the quiet
    /// socket, when it is open and every request may go there ([`Request::is_quiet`]).
    pub fn post_all_giving_back(
        &mut self,
        first: &[Request],
        sockets: Vec<OwnedFd>,
        then: &[Request],
        urgency: Urgency,
    ) -> Result<(), Error> {
        let quiet = urgency == Urgency::Later
            && self.quiet.is_some()
            && sockets.len() <= fdpass::MAX_SEND_FDS
            && first.iter().chain(then).all(Request::is_quiet);
        if quiet {
            let stream = self.quiet.as_ref().expect("checked");
            return send_giving_back(stream, first, &sockets, then)
                .map_err(|e| Error::io("writing to urdmad's quiet socket", e));
        }
        if sockets.len() > fdpass::MAX_SEND_FDS {
            self.post_all(first)?;
            for sock in sockets {
                self.give_back(sock)?;
            }
            return self.post_all(then);
        }
        send_giving_back(&self.stream, first, &sockets, then)
            .map_err(|e| Error::io("writing to urdmad", e))
    }

    /// Sends one request whose reply [`Connection::answer`] takes once it has been read (by
    /// `poll_events`, or by a later `request`). Only for requests the daemon answers with
    /// one line.
    pub fn send(&mut self, req: &Request) -> Result<Ticket, Error> {
        self.write(&req.encode())?;
        let t = self.next_ticket;
        self.next_ticket += 1;
        self.pending.push_back(Awaiting::Sent(t));
        Ok(Ticket(t))
    }

    /// The reply to `ticket`'s request, once it has been read.
    pub fn answer(&mut self, ticket: Ticket) -> Option<Result<Response, Error>> {
        let line = self.answers.remove(&ticket.0)?;
        Some(Response::decode(&line).map_err(|e| bad_reply(&line, e)))
    }

    /// Gives up waiting for `ticket`'s reply: it is dropped when it comes.
    pub fn abandon(&mut self, ticket: Ticket) {
        self.answers.remove(&ticket.0);
        for a in self.pending.iter_mut() {
            if matches!(a, Awaiting::Sent(t) if *t == ticket.0) {
                *a = Awaiting::Abandoned;
            }
        }
    }

    /// The posted requests urdmad refused since the last call, each as a line for the user.
    pub fn take_refusals(&mut self) -> Vec<String> {
        std::mem::take(&mut self.refusals)
    }

    fn write(&mut self, line: &str) -> Result<(), Error> {
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| Error::io("writing to urdmad", e))
    }

    /// A reply line read: it answers the oldest request waiting for one. The line back when
    /// that was `ticket`'s request.
    fn answered(&mut self, line: String, ticket: Option<u64>) -> Option<String> {
        match self.pending.pop_front() {
            Some(Awaiting::Sent(t)) if Some(t) == ticket => return Some(line),
            Some(Awaiting::Sent(t)) => {
                self.answers.insert(t, line);
            }
            // A reply to nothing, or to a request given up: ignored.
            Some(Awaiting::Abandoned) | None => {}
        }
        None
    }

    /// Sends one request and reads its reply; events that arrive first are queued, and the
    /// replies of earlier requests are dealt with as [`Connection::send`] says.
    pub fn request(&mut self, req: &Request) -> Result<Response, Error> {
        let Ticket(mine) = self.send(req)?;
        let deadline = Instant::now() + self.timeout;
        let first = loop {
            let line = match self.read_reply_line(deadline) {
                Ok(l) => l,
                Err(e) => {
                    self.abandon(Ticket(mine));
                    return Err(e);
                }
            };
            if let Some(line) = self.answered(line, Some(mine)) {
                break line;
            }
        };
        Response::decode(&first).map_err(|e| bad_reply(&first, e))
    }

    /// The queued events and every event that has arrived since, without blocking. An error
    /// when urdmad has closed the connection (after the events that came before the close
    /// have been returned).
    pub fn poll_events(&mut self) -> Result<Vec<Event>, Error> {
        if !self.closed {
            loop {
                let held = self.fds.len();
                match self.fill(None)? {
                    0 => {
                        self.closed = true;
                        break;
                    }
                    usize::MAX => break,
                    n if fdpass::read_all_there(n, READ_CHUNK, self.fds.len() != held) => break,
                    _ => {}
                }
            }
            while let Some(line) = self.take_line().transpose()? {
                if proto::is_event(&line) {
                    self.queue_event(&line);
                } else {
                    self.answered(line, None);
                }
            }
        }
        if self.closed && self.events.is_empty() {
            return Err(Error::Closed);
        }
        Ok(self.events.drain(..).collect())
    }

    /// Whether events are queued (met by a request and not returned yet).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The control socket's path, as connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `SYNC` and waits for `OK`: every event urdmad pushed before is then queued.
    pub fn sync(&mut self) -> Result<(), Error> {
        match self.request(&Request::Sync)? {
            Response::Ok => Ok(()),
            other => Err(refusal(other)),
        }
    }

    /// The status report, its records in the order urdmad sent them.
    pub fn status(&mut self) -> Result<Vec<crate::status::Record>, Error> {
        match self.request(&Request::Status)? {
            Response::Status { lines } => {
                let deadline = Instant::now() + self.timeout;
                // Every line is read before any is decoded: a bad one must not leave the
                // rest to be taken for the replies of later requests.
                let lines = (0..lines)
                    .map(|_| self.read_reply_line(deadline))
                    .collect::<Result<Vec<_>, _>>()?;
                lines.iter().map(|l| crate::status::decode(l)).collect()
            }
            other => Err(refusal(other)),
        }
    }
}

/// The error for a reply line that could not be decoded: a line that is not a JSON object
/// comes from an urdmad of the text protocol (versions before 11), which refuses this
/// client's `HELLO` with one.
/// Whether urdmad must act on posted lines at once ([`Connection::post_all_giving_back`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    Now,
    /// At urdmad's next wake-up: what the kernel and the peer no longer wait for.
    Later,
}

/// `first`, a `GIVEBACK` for each of `sockets` (at most [`fdpass::MAX_SEND_FDS`]) and
/// `then`, posted in one write on `stream`.
fn send_giving_back(
    mut stream: &UnixStream,
    first: &[Request],
    sockets: &[OwnedFd],
    then: &[Request],
) -> io::Result<()> {
    let give_back = Request::GiveBack.encode_posted();
    let lines: String = first
        .iter()
        .map(Request::encode_posted)
        .chain(sockets.iter().map(|_| give_back.clone()))
        .chain(then.iter().map(Request::encode_posted))
        .collect();
    if sockets.is_empty() {
        return stream.write_all(lines.as_bytes());
    }
    // The descriptors go with the first byte: urdmad holds them until their GIVEBACKs.
    let fds: Vec<RawFd> = sockets.iter().map(AsRawFd::as_raw_fd).collect();
    fdpass::send_with_fds(stream, lines.as_bytes(), &fds)
}

fn bad_reply(line: &str, e: proto::ProtoError) -> Error {
    if line.starts_with('{') {
        Error::Malformed(format!("bad reply from urdmad: {e}"))
    } else {
        Error::OldDaemon {
            client: proto::VERSION,
            answer: proto::legacy::answer_text(line),
        }
    }
}

/// The error for a reply that was not the one expected: urdmad's refusal, or a reply to
/// something else.
pub fn refusal(resp: Response) -> Error {
    match resp {
        Response::Error { code, message } => Error::Refused { code, message },
        other => Error::Unexpected(other.encode().trim_end().to_owned()),
    }
}

#[cfg(test)]
mod tests;
