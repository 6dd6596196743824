//! Connection setup, typed by value: a `Connecting` (active side) or an
//! `Incoming` request (passive side) is consumed to make a `Connection`.
//! The handshake is ConnectRequest -> Accept (or Reject) -> first ACK;
//! both handshake packets take a PSN so the ordinary retransmission
//! machinery repeats them.

use crate::config::{Config, MIN_DATAGRAM};
use crate::conn::{AcceptBody, Connection, Negotiated};
use crate::time::Instant;
use crate::wire::crc;
use crate::wire::handshake::{self, MAX_PRIVATE_DATA, PROTOCOL_VERSION};
use crate::wire::trp::{self, SackRanges};
use crate::wire::WireError;
use core::fmt;
use core::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupError {
    Wire(WireError),
    /// The datagram is not a connection request.
    NotARequest,
    /// The peer speaks another protocol version.
    Version(u16),
    /// Private data longer than 512 bytes, or too long for the handshake
    /// packet to fit one datagram.
    PrivateDataLen(usize),
    /// Connection id 0 is reserved for "unknown" in ConnectRequest.
    ZeroConnectionId,
    /// The peer's datagram size is below the minimum.
    DatagramTooSmall(u16),
    /// The buffer handed to `reject` is too small.
    BufferTooSmall,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Wire(e) => write!(f, "malformed handshake: {e}"),
            SetupError::NotARequest => f.write_str("not a connection request"),
            SetupError::Version(v) => write!(f, "unsupported protocol version {v}"),
            SetupError::PrivateDataLen(n) => write!(
                f,
                "private data of {n} bytes too long (512 at most, and the handshake must fit one datagram)"
            ),
            SetupError::ZeroConnectionId => f.write_str("connection id 0 is reserved"),
            SetupError::DatagramTooSmall(n) => write!(f, "peer datagram size {n} too small"),
            SetupError::BufferTooSmall => f.write_str("buffer too small"),
        }
    }
}

impl std::error::Error for SetupError {}

impl From<WireError> for SetupError {
    fn from(e: WireError) -> Self {
        SetupError::Wire(e)
    }
}

fn check_private_data(pd: &[u8]) -> Result<(), SetupError> {
    if pd.len() > MAX_PRIVATE_DATA {
        Err(SetupError::PrivateDataLen(pd.len()))
    } else {
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn emit_handshake(
    buf: &mut [u8],
    opcode: trp::Opcode,
    dst_conn: u32,
    psn: u32,
    ack_psn: u32,
    window: u16,
    body: &handshake::Repr<'_>,
    sealed: bool,
) -> Option<usize> {
    let len = trp::HEADER_LEN + body.buffer_len();
    if buf.len() < len + crc::trailer_len(sealed) {
        return None;
    }
    trp::Repr {
        opcode,
        flags: trp::FLAG_ACK_REQUEST,
        dst_conn,
        psn,
        ack_psn,
        window,
        sack: SackRanges::new(),
    }
    .emit(buf);
    body.emit(&mut buf[trp::HEADER_LEN..]);
    Some(if sealed { crc::seal(buf, len) } else { len })
}

/// Header, body and private data of a handshake datagram, sealed or not.
fn handshake_len(private_data: usize, sealed: bool) -> usize {
    trp::HEADER_LEN + handshake::FIXED_LEN + private_data + crc::trailer_len(sealed)
}

/// Active side, waiting for Accept or Reject.
#[derive(Debug)]
pub struct Connecting {
    cfg: Config,
    local_conn: u32,
    isn: u32,
    private_data: Vec<u8>,
    send_at: Instant,
    rto: Duration,
    sent: u32,
}

/// Result of feeding a `Connecting` an input.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum ConnectOutcome {
    Pending(Connecting),
    Established {
        conn: Connection,
        private_data: Vec<u8>,
        ird: u16,
        ord: u16,
    },
    Rejected {
        private_data: Vec<u8>,
    },
    TimedOut,
}

impl Connecting {
    /// `local_conn` (non-zero) is what the peer puts in every packet's
    /// destination field; `isn` is our initial PSN (pick it at random).
    pub fn new(
        cfg: Config,
        local_conn: u32,
        isn: u32,
        private_data: &[u8],
        now: Instant,
    ) -> Result<Self, SetupError> {
        check_private_data(private_data)?;
        if local_conn == 0 {
            return Err(SetupError::ZeroConnectionId);
        }
        if handshake_len(private_data.len(), cfg.crc) > usize::from(cfg.max_datagram) {
            return Err(SetupError::PrivateDataLen(private_data.len()));
        }
        Ok(Connecting {
            cfg,
            local_conn,
            isn,
            private_data: private_data.to_vec(),
            send_at: now,
            rto: cfg.initial_rto,
            sent: 0,
        })
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        Some(self.send_at)
    }

    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if now < self.send_at || self.sent > self.cfg.max_retries {
            return None;
        }
        let body = handshake::Repr {
            version: PROTOCOL_VERSION,
            ird: self.cfg.ird,
            ord: self.cfg.ord,
            src_conn: self.local_conn,
            initial_psn: self.isn,
            max_payload: self.cfg.max_datagram,
            flags: handshake::flags(self.cfg.crc),
            private_data: &self.private_data,
        };
        let n = emit_handshake(
            buf,
            trp::Opcode::ConnectRequest,
            0,
            self.isn,
            0,
            self.cfg.recv_window,
            &body,
            self.cfg.crc,
        )?;
        self.sent += 1;
        self.send_at = now + self.rto;
        self.rto = (self.rto * 2).min(self.cfg.max_rto);
        Some(n)
    }

    pub fn handle_timeout(self, now: Instant) -> ConnectOutcome {
        if self.sent > self.cfg.max_retries && now >= self.send_at {
            ConnectOutcome::TimedOut
        } else {
            ConnectOutcome::Pending(self)
        }
    }

    /// Feeds a datagram; anything that is not our Accept/Reject is ignored,
    /// and so is a datagram whose CRC32C trailer does not match.
    pub fn handle_datagram(self, now: Instant, bytes: &[u8]) -> ConnectOutcome {
        let Ok((bytes, _)) = crc::open(bytes) else {
            return ConnectOutcome::Pending(self);
        };
        let Ok(pkt) = trp::Packet::new_checked(bytes) else {
            return ConnectOutcome::Pending(self);
        };
        let Ok(h) = trp::Repr::parse(&pkt) else {
            return ConnectOutcome::Pending(self);
        };
        let Ok(body) = handshake::Repr::parse(pkt.payload()) else {
            return ConnectOutcome::Pending(self);
        };
        if h.dst_conn != self.local_conn {
            return ConnectOutcome::Pending(self);
        }
        match h.opcode {
            trp::Opcode::Reject => ConnectOutcome::Rejected {
                private_data: body.private_data.to_vec(),
            },
            trp::Opcode::Accept
                if h.ack_psn == self.isn.wrapping_add(1)
                    && body.version == PROTOCOL_VERSION
                    && body.max_payload >= MIN_DATAGRAM =>
            {
                let mut conn = Connection::new(
                    self.cfg,
                    Negotiated {
                        local_conn: self.local_conn,
                        peer_conn: body.src_conn,
                        snd_first: self.isn.wrapping_add(1),
                        rcv_first: h.psn.wrapping_add(1),
                        peer_window: h.window,
                        peer_ird: body.ird,
                        peer_max_datagram: body.max_payload,
                        // The Accept says what the connection uses.
                        crc: body.crc(),
                    },
                    None,
                    Some(now),
                );
                conn.request_ack();
                ConnectOutcome::Established {
                    conn,
                    private_data: body.private_data.to_vec(),
                    ird: body.ird,
                    ord: body.ord,
                }
            }
            _ => ConnectOutcome::Pending(self),
        }
    }
}

/// A connection request received by the passive side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    peer_conn: u32,
    peer_isn: u32,
    window: u16,
    version: u16,
    ird: u16,
    ord: u16,
    max_datagram: u16,
    /// The requester asks for the CRC32C trailer.
    crc: bool,
    private_data: Vec<u8>,
}

impl Incoming {
    /// A ConnectRequest (its CRC32C trailer checked and removed if it has
    /// one).
    pub fn parse(bytes: &[u8]) -> Result<Incoming, SetupError> {
        let (bytes, _) = crc::open(bytes)?;
        let pkt = trp::Packet::new_checked(bytes)?;
        let h = trp::Repr::parse(&pkt)?;
        if h.opcode != trp::Opcode::ConnectRequest || h.dst_conn != 0 {
            return Err(SetupError::NotARequest);
        }
        let body = handshake::Repr::parse(pkt.payload())?;
        if body.src_conn == 0 {
            return Err(SetupError::ZeroConnectionId);
        }
        Ok(Incoming {
            peer_conn: body.src_conn,
            peer_isn: h.psn,
            window: h.window,
            version: body.version,
            ird: body.ird,
            ord: body.ord,
            max_datagram: body.max_payload,
            crc: body.crc(),
            private_data: body.private_data.to_vec(),
        })
    }

    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    pub fn ird(&self) -> u16 {
        self.ird
    }
    pub fn ord(&self) -> u16 {
        self.ord
    }
    pub fn version(&self) -> u16 {
        self.version
    }
    /// The requester's connection id: with its address, identifies a
    /// repeated request for a connection already accepted.
    pub fn peer_conn(&self) -> u32 {
        self.peer_conn
    }

    /// Accepts: the returned connection sends Accept first and repeats it
    /// until acknowledged.
    pub fn accept(
        self,
        cfg: Config,
        local_conn: u32,
        isn: u32,
        private_data: &[u8],
    ) -> Result<Connection, SetupError> {
        check_private_data(private_data)?;
        if local_conn == 0 {
            return Err(SetupError::ZeroConnectionId);
        }
        if self.version != PROTOCOL_VERSION {
            return Err(SetupError::Version(self.version));
        }
        if self.max_datagram < MIN_DATAGRAM {
            return Err(SetupError::DatagramTooSmall(self.max_datagram));
        }
        // Either end's asking is enough (as with MPA's CRC).
        let crc = self.crc || cfg.crc;
        // The Accept (header, body, private data, trailer) must fit one datagram.
        let datagram = usize::from(cfg.max_datagram.min(self.max_datagram).max(MIN_DATAGRAM));
        if handshake_len(private_data.len(), crc) > datagram {
            return Err(SetupError::PrivateDataLen(private_data.len()));
        }
        Ok(Connection::new(
            cfg,
            Negotiated {
                local_conn,
                peer_conn: self.peer_conn,
                snd_first: isn,
                rcv_first: self.peer_isn.wrapping_add(1),
                peer_window: self.window,
                peer_ird: self.ird,
                peer_max_datagram: self.max_datagram,
                crc,
            },
            Some(AcceptBody {
                private_data: private_data.to_vec(),
            }),
            None,
        ))
    }

    /// Builds a Reject datagram into `buf`.
    pub fn reject(&self, private_data: &[u8], buf: &mut [u8]) -> Result<usize, SetupError> {
        check_private_data(private_data)?;
        let body = handshake::Repr {
            version: PROTOCOL_VERSION,
            ird: 0,
            ord: 0,
            src_conn: 0,
            initial_psn: 0,
            max_payload: 0,
            flags: 0,
            private_data,
        };
        // Sealed when the requester asked for sealed datagrams.
        emit_handshake(
            buf,
            trp::Opcode::Reject,
            self.peer_conn,
            0,
            self.peer_isn.wrapping_add(1),
            0,
            &body,
            self.crc,
        )
        .ok_or(SetupError::BufferTooSmall)
    }
}
