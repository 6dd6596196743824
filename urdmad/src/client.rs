//! The client side of the control protocol: connect, greet, send requests, read replies.
//! Needs only `std`, like [`crate::proto`], so the provider can use it as is.

use crate::proto::{self, Request, Response, MAX_LINE};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// A greeted connection to urdmad.
pub struct Connection {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// The daemon's self-description from its `HELLO`.
    pub daemon: String,
    timeout: Duration,
}

/// Why talking to urdmad failed, as one line for the user.
pub type Error = String;

impl Connection {
    /// Connects and exchanges `HELLO`. Replies are awaited for at most `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Connection, Error> {
        let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => format!(
                "permission denied connecting to urdmad at {} (only root and the configured group may use it)",
                path.display()
            ),
            _ => format!("cannot connect to urdmad at {}: {e}", path.display()),
        })?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(|e| format!("socket setup: {e}"))?;
        let writer = stream
            .try_clone()
            .map_err(|e| format!("socket setup: {e}"))?;
        let mut c = Connection {
            reader: BufReader::new(stream),
            writer,
            daemon: String::new(),
            timeout,
        };
        match c.request(&Request::Hello {
            version: proto::VERSION,
            pid: std::process::id(),
        })? {
            Response::Hello { version, daemon } if version == proto::VERSION => {
                c.daemon = daemon;
                Ok(c)
            }
            Response::Hello { version, .. } => Err(format!(
                "urdmad speaks protocol version {version}, this client {}",
                proto::VERSION
            )),
            other => Err(refusal(other)),
        }
    }

    fn read_line(&mut self) -> Result<String, Error> {
        let mut line = String::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64)
            .read_line(&mut line)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                    "urdmad did not answer within {:?} (is it still starting?)",
                    self.timeout
                ),
                _ => format!("reading from urdmad: {e}"),
            })?;
        if n == 0 {
            return Err("urdmad closed the connection".into());
        }
        Ok(line)
    }

    /// Sends one request and reads its reply.
    pub fn request(&mut self, req: &Request) -> Result<Response, Error> {
        self.writer
            .write_all(req.encode().as_bytes())
            .map_err(|e| format!("writing to urdmad: {e}"))?;
        let first = self.read_line()?;
        let mut extra_err = None;
        let resp = Response::decode(&first, || match self.read_line() {
            Ok(l) => Some(l),
            Err(e) => {
                extra_err = Some(e);
                None
            }
        });
        if let Some(e) = extra_err {
            return Err(e);
        }
        resp.map_err(|e| format!("bad reply from urdmad: {e}"))
    }

    /// The status report, one entry per line.
    pub fn status(&mut self) -> Result<Vec<String>, Error> {
        match self.request(&Request::Status)? {
            Response::Status { lines } => (0..lines)
                .map(|_| self.read_line().map(|l| l.trim_end().to_owned()))
                .collect(),
            other => Err(refusal(other)),
        }
    }
}

/// Text for a reply that was not the one expected.
pub fn refusal(resp: Response) -> Error {
    match resp {
        Response::Error { code, message } => {
            format!("urdmad refused ({}): {message}", code.as_str())
        }
        other => format!(
            "unexpected reply from urdmad: {}",
            other.encode().trim_end()
        ),
    }
}
