//! The control protocol between urdmad and the processes that use it (the verbs provider,
//! test clients, `urdmad status`).
//!
//! This module is the single definition of that protocol: the messages are the types below,
//! and their wire form is derived from them (serde), so no message has a hand-written
//! encoder or decoder.
//!
//! # Wire format
//! A `SOCK_STREAM` Unix socket carrying lines of UTF-8 text, at most [`MAX_LINE`] bytes
//! each, ending in `\n`. Every message is one line: one JSON object (compact, as serde_json
//! writes it), whose first member names the message: `req` for a request, `reply` for a
//! reply, `event` for an event. The other members are the message's fields; a decoder
//! ignores members it does not know. The client speaks first and waits for one reply per
//! request, so no framing beyond the line is needed, except that a status reply announces
//! how many report lines (JSON records, `crate::status`) follow it.
//!
//! ```text
//! {"req":"HELLO","version":16,"pid":4242}     -> {"reply":"HELLO","version":16,"daemon":"urdmad 0.1.0"}
//! {"req":"ATTACH"}                            -> {"reply":"ATTACHED","client":3,"prefix":"urdma","lcore":3,
//!                                                 "alloc":"urd_alloc_3","free":"urd_free_3","ports":[{"index":0,
//!                                                 "name":"port0","mac":"02:00:00:00:00:01","tx":"urd_tx_3_0",
//!                                                 "steering":"software"}]}
//! {"req":"OPEN","port":0,"local":"10.0.0.1:4791","remote":"10.0.0.2:4791","mac":"02:.."}
//!                                             -> {"reply":"OPENED","flow":7,"rx":"urd_rx_7","steering":"hardware","queue":3}
//! {"req":"CLOSE","flow":7}                    -> {"reply":"CLOSED","flow":7}
//! {"req":"STATUS"}                            -> {"reply":"STATUS","lines":N}, then N report lines
//! {"req":"DETACH"}                            -> {"reply":"DETACHED"}
//! QP, UNQP, PEERCLOSED {"dev":0,"qpn":17}; QPCLOSED {.., "status":-104}; ARM; SYNC;
//! GIVEBACK (a packet socket attached); PARK {"cookie":N}  -> {"reply":"OK"}
//! any error                                   -> {"reply":"ERROR","code":"EACCES","message":"text"}
//! {"req":"PARK","cookie":N,"post":true}       -> nothing, or when refused
//!                                                {"event":"REFUSED","request":"{\"req\":\"PARK\",..}","code":..,"message":..}
//! ```
//!
//! A request with `"post":true` is posted: its sender reads no reply, so the daemon sends
//! none unless it refuses the request, and then an `EVENT REFUSED` naming it in place of the
//! `ERROR`. A process that posts its requests (the provider's `QP`, `UNQP`, `ARM`, ...) is
//! then not woken once for every one of them by an `OK` that tells it nothing.
//!
//! Events (`{"event":"CONNECTED",..}`, `DISCONNECT`, `WAKE`: [`Event`]) come unsolicited from
//! the daemon between any two replies (never inside a multi-line reply), so a client reads
//! lines until the reply to its request and keeps the events it meets on the way
//! ([`crate::client::Connection`] does). Byte strings (`pdata`, `pkt`) are lowercase hex.
//! `CONNECTED` with `direct` not 0 carries the connection's packet socket as `SCM_RIGHTS` on
//! its first byte, and its rings hold that many frames each way; the process then moves the
//! connection's frames through that socket ([`crate::direct`]), and urdmad no longer sees
//! them. With `reuse` not 0 no socket comes: the connection takes the socket of an ended
//! connection of the same process, which the process kept (`PARK`).
//!
//! The first request on a connection must be `HELLO`; a daemon refuses other versions with
//! an `ERROR` of code `EVERSION` and closes the connection. A process of a version before 11
//! (the text protocol, [`legacy`]) gets that refusal in the text it reads. After `ATTACH`
//! the process is a DPDK secondary of the daemon: it initialises EAL with
//! [`Attachment::eal_args`], looks up its rings by name and owns them until it detaches or
//! its connection closes. Closing the connection (including by dying) is a detach: the
//! daemon then removes the process's flows and frees its rings.
//!
//! `OPENED` names how the flow is steered: `steering` `hardware` with `queue` Q when an
//! `rte_flow` rule sends its datagrams to the port's RX queue Q, `software` when urdmad
//! classifies them (the port has no hardware steering, its flow queues are all taken, or the
//! rule could not be created). Either way the process receives from the `rx` ring.
//!
//! Ring discipline: each flow's RX ring has one producer (the daemon) and one consumer
//! (the process); each TX ring has one producer (the process) and one consumer (the
//! daemon). A process that posts from several threads must serialise its own enqueues.

pub mod legacy;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::SocketAddrV4;
use std::str::FromStr;

/// The protocol version this module speaks. Version 2 added the connection requests (`QP`,
/// `UNQP`, `QPCLOSED`, `PEERCLOSED`, `ARM`, `SYNC`, `OK` and the unsolicited events);
/// version 3 the direct path (`CONNECTED` with `direct`, and the connection's socket);
/// version 4 the marks of who holds each of the pool's mbufs (urdmad's `holder`), which a
/// process must clear on every mbuf it frees: urdmad frees what is still marked with a
/// process's id once it is gone, so a process that left marks behind would have mbufs
/// freed twice; version 5 the virtio header in front of every frame of a direct
/// connection's rings ([`crate::direct::Rings`]), without which the kernel would take a frame's
/// first bytes for one; version 6 the process's own rings for the mbufs it sends and gives
/// back (`ATTACHED`'s `alloc` and `free`, `crate::lending`) in place of the pool, which a
/// process no longer touches and whose marks it no longer sets or clears; version 7 the
/// status report's lines as JSON records (`crate::status`); version 8 `GIVEBACK`, with which
/// a process hands a direct connection's socket back before closing its copy; version 9 the
/// bell's word (`CONNECTED`'s `bell`, a second descriptor after the socket,
/// [`crate::bell`]); version 10 the process's hush word (`hush`, a third descriptor,
/// [`crate::bell::HushWord`]); version 11 every message as one JSON object, derived from
/// the types of this module, in place of `VERB key=value` text; version 12 the bell's word
/// for a connection through urdmad's rings too (`bell` without `direct`: the word is the
/// only descriptor), which urdmad reads for each frame it puts on the ring; version 13
/// urdmad's sending of a passive connection's Accept (`CONNECTED`'s `accept_sent`);
/// version 14 a direct connection's transmit ring of at most
/// [`crate::direct::TX_FRAMES_MAX`] slots (`direct` counts the receive ring's); version 15
/// a process's direct sockets used again for its next connections (`PARK`, `CONNECTED`'s
/// `park` and `reuse`); version 16 the graceful close of a destroyed QP's connection
/// finished by its process (`UNQP`'s `linger`); version 17 posted requests (`post`), answered
/// only when refused (`EVENT REFUSED`); version 18 a QP's owner named by urdma.ko, so that
/// a process sends no `QP` line, and no `UNQP` once its `QPCLOSED` is sent; version 19 a
/// second cache line in each slot of the QP figures' table ([`crate::qpstats::Slot`]), where
/// a process says how far it received, for urdmad's Abort after it is gone; version 20 a
/// process's second, quiet socket (`QUIET`), for the lines of a connection's end that need
/// not wake urdmad.
pub const VERSION: u32 = 20;

/// Longest accepted line, newline included.
pub const MAX_LINE: usize = 4096;

/// Most report lines a status reply may announce.
pub const MAX_STATUS_LINES: usize = 100_000;

/// A 48-bit Ethernet address; on the wire as `02:00:00:00:00:01`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Mac(pub [u8; 6]);

impl From<Mac> for String {
    fn from(m: Mac) -> String {
        m.to_string()
    }
}

impl TryFrom<String> for Mac {
    type Error = ProtoError;
    fn try_from(s: String) -> Result<Self, ProtoError> {
        s.parse()
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl FromStr for Mac {
    type Err = ProtoError;
    fn from_str(s: &str) -> Result<Self, ProtoError> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in out.iter_mut() {
            let p = parts.next().ok_or(ProtoError::BadMac)?;
            if p.len() != 2 {
                return Err(ProtoError::BadMac);
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| ProtoError::BadMac)?;
        }
        if parts.next().is_some() {
            return Err(ProtoError::BadMac);
        }
        Ok(Mac(out))
    }
}

/// How a port delivers a flow's packets to its process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Steering {
    /// urdmad classifies every received frame and enqueues a flow's frames on its ring.
    #[default]
    Software,
    /// An `rte_flow` rule sends the flow to a hardware queue.
    Hardware,
}

impl Steering {
    pub fn as_str(self) -> &'static str {
        match self {
            Steering::Software => "software",
            Steering::Hardware => "hardware",
        }
    }
}

/// What identifies a QP's inbound packets on a port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowSpec {
    /// Index of the port, as listed in [`Attachment::ports`].
    pub port: u16,
    /// Local IPv4 address and UDP port; packets to it belong to the flow.
    pub local: SocketAddrV4,
    /// When set, only packets from this address and UDP port belong to the flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<SocketAddrV4>,
    /// The peer's MAC, recorded for the process's own use when building frames.
    #[serde(rename = "mac", default, skip_serializing_if = "Option::is_none")]
    pub remote_mac: Option<Mac>,
}

/// One port as a process sees it after attaching.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    pub index: u16,
    pub name: String,
    pub mac: Mac,
    /// The process's own TX ring for this port.
    #[serde(rename = "tx")]
    pub tx_ring: String,
    pub steering: Steering,
}

/// What a process needs to become a DPDK secondary of the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub client: u32,
    /// DPDK `--file-prefix` of the daemon.
    #[serde(rename = "prefix")]
    pub file_prefix: String,
    /// The EAL lcore id reserved for this process (EAL keeps state per lcore id in memory
    /// that every process shares, so two processes must never use the same one).
    pub lcore: u32,
    /// The ring urdmad keeps filled with mbufs for the process to send with.
    #[serde(rename = "alloc")]
    pub alloc_ring: String,
    /// The ring on which the process gives back the mbufs it is done with.
    #[serde(rename = "free")]
    pub free_ring: String,
    pub ports: Vec<PortInfo>,
}

impl Attachment {
    /// EAL arguments (after argv\[0\]) that attach a process as this daemon's secondary.
    /// The lcore is bound to the CPUs the calling thread may already run on, so attaching
    /// does not change the application's affinity.
    pub fn eal_args(&self) -> Vec<String> {
        vec![
            "--proc-type=secondary".into(),
            format!("--file-prefix={}", self.file_prefix),
            format!("--lcores={}@({})", self.lcore, allowed_cpus()),
            "--no-pci".into(),
            "--no-telemetry".into(),
        ]
    }
}

/// The calling thread's allowed CPUs as an EAL cpu set ("0-3,6"), from
/// /proc/thread-self/status; all CPUs when that cannot be read.
fn allowed_cpus() -> String {
    let parsed = std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_owned())
        })
        .filter(|v| {
            !v.is_empty()
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || b == b'-' || b == b',')
        });
    parsed.unwrap_or_else(|| {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        format!("0-{}", n - 1)
    })
}

/// Error kinds a daemon reports; `code` on the wire, as [`ErrorCode::as_str`] names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The peer is not root and not in the allowed group.
    #[serde(rename = "EACCES")]
    Access,
    /// The client speaks another protocol version.
    #[serde(rename = "EVERSION")]
    Version,
    /// A request that is malformed or not valid in this state.
    #[serde(rename = "EINVAL")]
    Invalid,
    /// Something named does not exist (port, flow).
    #[serde(rename = "ENOENT")]
    NotFound,
    /// The flow is already open.
    #[serde(rename = "EEXIST")]
    Exists,
    /// Out of rings, lcores or memory.
    #[serde(rename = "ENOSPC")]
    NoResources,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Access => "EACCES",
            ErrorCode::Version => "EVERSION",
            ErrorCode::Invalid => "EINVAL",
            ErrorCode::NotFound => "ENOENT",
            ErrorCode::Exists => "EEXIST",
            ErrorCode::NoResources => "ENOSPC",
        }
    }
}

/// A request from a process to the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "req", rename_all = "UPPERCASE")]
pub enum Request {
    Hello {
        version: u32,
        pid: u32,
    },
    Attach,
    Open(FlowSpec),
    Close {
        flow: u32,
    },
    Status,
    Detach,
    /// This process owns QP `qpn` of device `dev` (sent after attaching). The provider
    /// sends none: urdma.ko names each QP's owner in its `CONNECT` and `ACCEPT`, which
    /// overrides this line; it serves a test or tool that plays the kernel's part.
    Qp {
        dev: u32,
        qpn: u32,
    },
    /// The QP is destroyed. `linger`: its connection had begun a graceful close, which the
    /// process finishes on the connection's flow without the QP; urdmad keeps the flow
    /// until the process closes it (`CLOSE`), and sends the peer no Abort.
    Unqp {
        dev: u32,
        qpn: u32,
        #[serde(default, skip_serializing_if = "is_false")]
        linger: bool,
    },
    /// The QP's trp connection ended: 0 graceful, else a negative errno.
    QpClosed {
        dev: u32,
        qpn: u32,
        status: i32,
    },
    /// The peer began a graceful close (it sent FIN).
    PeerClosed {
        dev: u32,
        qpn: u32,
    },
    /// Send one `EVENT WAKE` at the next frame enqueued on any of this process's flows.
    Arm,
    /// Answered with `OK` once every event pushed before has been written.
    Sync,
    /// Comes with the packet socket of a direct connection the process no longer uses
    /// (`SCM_RIGHTS` on its first byte): the process closes its copy next, and urdmad closes
    /// its own afterwards, so that the close that waits is urdmad's (`direct`).
    GiveBack,
    /// The process keeps the packet socket of a direct connection that ended (one whose
    /// `CONNECTED` said `park`), rings mapped, for its next connection: `cookie` is the
    /// socket's `SO_COOKIE`. urdmad may then name it in a `CONNECTED`'s `reuse`, and the
    /// process holds it until then or until it detaches.
    Park {
        cookie: u64,
    },
    /// Comes with one end of a Unix stream socket pair (`SCM_RIGHTS`), posted: the
    /// process's quiet socket. urdmad does not wait on it: it reads it at its next wake-up,
    /// and before any later line of the process. Only [`Request::is_quiet`] requests, posted,
    /// are taken there.
    Quiet,
}

/// A reply from the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "UPPERCASE")]
pub enum Response {
    Hello {
        version: u32,
        daemon: String,
    },
    Attached(Attachment),
    Opened {
        flow: u32,
        #[serde(rename = "rx")]
        rx_ring: String,
        /// How this flow's datagrams reach `rx_ring`.
        #[serde(default)]
        steering: Steering,
        /// The port's RX queue dedicated to the flow, with hardware steering.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<u16>,
    },
    Closed {
        flow: u32,
    },
    /// Followed on the wire by `lines` report lines (at most [`MAX_STATUS_LINES`]).
    Status {
        #[serde(deserialize_with = "status_lines")]
        lines: usize,
    },
    Detached,
    /// The reply to `QP`, `UNQP`, `QPCLOSED`, `PEERCLOSED`, `ARM` and `SYNC`.
    Ok,
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// Which side of the handshake a connected QP was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It sent the ConnectRequest (`rdma_connect`).
    Active,
    /// It accepted a ConnectRequest (`rdma_accept`).
    Passive,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Passive => "passive",
        }
    }
}

/// The event `CONNECTED`: a QP of the process is connected and its flow is open. What the
/// provider needs to rebuild the trp connection (docs/connection.md): `cfg` =
/// [`Connected::trp_config`] (with the QP's own PD and queue sizes); then, active:
/// `Connecting::new(cfg, conn, isn, pdata, now).handle_datagram(now, pkt)` (pkt = the peer's
/// Accept) gives `Established`; passive: `Incoming::parse(pkt)?.accept(cfg, conn, isn,
/// pdata)` (pkt = the ConnectRequest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connected {
    pub dev: u32,
    pub qpn: u32,
    pub role: Role,
    /// Index of the port the connection uses.
    pub port: u16,
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
    /// Destination MAC of the QP's frames.
    pub mac: Mac,
    /// The flow urdmad opened for the QP (4-tuple), as `OPENED` would name it.
    pub flow: u32,
    /// The flow's RX ring.
    #[serde(rename = "rx")]
    pub rx_ring: String,
    /// Our IRD and ORD (what the handshake announced for this side).
    pub ird: u16,
    pub ord: u16,
    /// Our `max_datagram` (UDP payload bytes the port's MTU allows).
    pub datagram: u16,
    /// Whether this side asks for the CRC32C trailer (the port's `crc`).
    pub crc: bool,
    /// 0, or the connection takes the direct path: its packet socket comes with this event
    /// and its rings hold this many frames each way (`direct::Geometry::new(datagram,
    /// direct)`).
    pub direct: u32,
    /// A connection whose frames ring urdma.ko's bell: the map of its word
    /// ([`crate::bell`]) comes with this event, after the socket on the direct path, alone
    /// otherwise (urdmad rings the bell for the frames it puts on the ring).
    pub bell: bool,
    /// With `bell`, on the direct path: the map of the process's hush word
    /// ([`crate::bell::HushWord`]), which urdma.ko reads for the connection's frames, comes
    /// after the bell's word.
    pub hush: bool,
    /// The connection's slot in urdmad's table of QP figures ([`crate::qpstats`]), which the
    /// process keeps current; `None` when every slot is taken.
    #[serde(default)]
    pub stats: Option<u32>,
    /// Our connection id.
    pub conn: u32,
    /// Our initial PSN.
    pub isn: u32,
    /// Our private data (in the ConnectRequest when active, in the Accept when passive).
    #[serde(with = "hex_bytes")]
    pub pdata: Vec<u8>,
    /// The peer's handshake datagram (UDP payload): its Accept when active, its
    /// ConnectRequest when passive.
    #[serde(with = "hex_bytes")]
    pub pkt: Vec<u8>,
    /// Passive: urdmad sends the connection's Accept, the first datagram the connection
    /// would send, right after this event; the provider's connection takes it as sent and
    /// repeats it until the requester acknowledges it.
    #[serde(default)]
    pub accept_sent: bool,
    /// On the direct path: when the connection ends the process may keep its socket for
    /// its next connection (`PARK`) rather than give it back.
    #[serde(default)]
    pub park: bool,
    /// On the direct path: not 0, the `SO_COOKIE` of a socket this process parked, which
    /// the connection uses; no socket comes with the event (the bell's and hush's words
    /// do). urdmad has aimed its filter at the connection.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reuse: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl Connected {
    /// The configuration the handshake ran with, for the connection the provider builds.
    pub fn trp_config(&self) -> trp::Config {
        connection_config(self.ird, self.ord, self.datagram, self.crc)
    }
}

/// The trp configuration of a connection urdmad hands over, on both sides of the hand-over:
/// urdmad runs the handshake with it (retransmission timing aside) and the provider builds
/// the data connection from it ([`Connected::trp_config`]). What the handshake announces
/// (IRD, ORD, the datagram size, the receive window, whether it asks for the CRC32C
/// trailer) is what the connection then holds to, so those values must come from here and
/// nowhere else.
pub fn connection_config(ird: u16, ord: u16, datagram: u16, crc: bool) -> trp::Config {
    trp::Config {
        ird,
        ord,
        max_datagram: datagram,
        crc,
        ..trp::Config::default()
    }
}

/// An unsolicited line from the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "UPPERCASE")]
pub enum Event {
    Connected(Box<Connected>),
    /// The kernel asked to close the QP: 0 graceful (`close()`), < 0 abortive (`abort()`).
    Disconnect {
        dev: u32,
        qpn: u32,
        status: i32,
    },
    /// A frame was enqueued on one of the process's flows after `ARM`.
    Wake,
    /// A posted request was refused: `request` is its line (without `post` and the
    /// newline), `code` and `message` what its `ERROR` would have said.
    Refused {
        request: String,
        code: ErrorCode,
        message: String,
    },
}

/// A request as its line carries it: `post`, when its sender reads no reply.
#[derive(Serialize, Deserialize)]
struct RequestLine {
    #[serde(flatten)]
    req: Request,
    #[serde(default, skip_serializing_if = "is_false")]
    post: bool,
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    // By table: a formatter per byte was a tenth of encoding `EVENT CONNECTED`.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Bytes of a hex string (either case); `None` when it is not one.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let b = s.as_bytes();
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    (0..b.len() / 2)
        .map(|i| Some(digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?))
        .collect()
}

/// Byte strings as hex: half the size of JSON's array of numbers, and what a reader of a
/// captured line expects of a datagram.
mod hex_bytes {
    use super::*;

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        unhex(&s).ok_or_else(|| serde::de::Error::custom("not a hex string"))
    }
}

/// A status reply's count, refused past [`MAX_STATUS_LINES`] before a client waits for them.
fn status_lines<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if n > MAX_STATUS_LINES {
        return Err(serde::de::Error::custom(format!(
            "more than {MAX_STATUS_LINES} status lines"
        )));
    }
    Ok(n)
}

/// Whether a line from the daemon is an [`Event`] rather than a reply. serde_json writes an
/// enum's tag first, so an event's line starts with it.
pub fn is_event(line: &str) -> bool {
    line.starts_with("{\"event\":")
}

/// Why a line could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtoError {
    Empty,
    TooLong,
    /// Not a message of this version; serde's account of why, cut to a sentence.
    Malformed(String),
    /// Not a MAC address (`Mac`'s text form).
    BadMac,
}

/// Longest account of a malformed line kept: an error goes back on the wire in an `ERROR`
/// line, which must stay well under [`MAX_LINE`].
const MAX_REASON: usize = 200;

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Empty => write!(f, "empty message"),
            ProtoError::TooLong => write!(f, "message longer than {MAX_LINE} bytes"),
            ProtoError::Malformed(why) => write!(f, "malformed message: {why}"),
            ProtoError::BadMac => write!(f, "not a MAC address"),
        }
    }
}

impl std::error::Error for ProtoError {}

/// The wire form of a message, newline included.
fn encode<T: Serialize>(msg: &T) -> String {
    // Cannot fail: every message is a struct of numbers, strings and booleans, with no map
    // keyed by anything but strings; an empty line would only be refused by its reader.
    let mut line = serde_json::to_string(msg).unwrap_or_default();
    line.push('\n');
    line
}

/// A message from its line (the newline optional); never panics.
fn decode<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, ProtoError> {
    if line.len() > MAX_LINE {
        return Err(ProtoError::TooLong);
    }
    let line = line.trim_end_matches(['\n', '\r']);
    if line.trim().is_empty() {
        return Err(ProtoError::Empty);
    }
    serde_json::from_str(line).map_err(|e| {
        let mut why = e.to_string();
        if why.len() > MAX_REASON {
            let mut cut = MAX_REASON;
            while !why.is_char_boundary(cut) {
                cut -= 1;
            }
            why.truncate(cut);
            why.push('…');
        }
        ProtoError::Malformed(why)
    })
}

impl Request {
    /// The wire form, newline included.
    pub fn encode(&self) -> String {
        encode(self)
    }

    /// The wire form of the request posted (`post`), newline included.
    pub fn encode_posted(&self) -> String {
        encode(&RequestLine {
            req: self.clone(),
            post: true,
        })
    }

    /// Decodes one line; never panics.
    pub fn decode(line: &str) -> Result<Self, ProtoError> {
        decode(line)
    }

    /// Whether the request may come on the quiet socket ([`Request::Quiet`]): the
    /// clean-up of a connection that is over for the kernel, which nobody waits for.
    pub fn is_quiet(&self) -> bool {
        matches!(
            self,
            Request::Unqp { .. }
                | Request::QpClosed { .. }
                | Request::PeerClosed { .. }
                | Request::GiveBack
                | Request::Park { .. }
                | Request::Close { .. }
        )
    }

    /// Decodes one line, posted or not (`post`); never panics.
    pub fn decode_line(line: &str) -> Result<(Self, bool), ProtoError> {
        decode::<RequestLine>(line).map(|l| (l.req, l.post))
    }

    /// What answers this request when it was posted and `reply` is its reply: nothing on
    /// success, `EVENT REFUSED` for an `ERROR`.
    pub fn posted_outcome(&self, reply: &str) -> Option<String> {
        match Response::decode(reply) {
            Ok(Response::Error { code, message }) => Some(
                Event::Refused {
                    request: self.encode().trim_end().to_owned(),
                    code,
                    message,
                }
                .encode(),
            ),
            _ => None,
        }
    }
}

impl Response {
    /// The wire form, newline included.
    pub fn encode(&self) -> String {
        encode(self)
    }

    /// Decodes one line; never panics.
    pub fn decode(line: &str) -> Result<Self, ProtoError> {
        decode(line)
    }
}

impl Event {
    /// The wire form, newline included.
    pub fn encode(&self) -> String {
        encode(self)
    }

    /// Decodes one line; never panics.
    pub fn decode(line: &str) -> Result<Self, ProtoError> {
        // The one long event, read straight into its struct (the tag is a field it
        // ignores): the tagged form buffers the whole line first, which took 40 % longer.
        if line.starts_with("{\"event\":\"CONNECTED\",") {
            return decode::<Connected>(line).map(|c| Event::Connected(Box::new(c)));
        }
        decode(line)
    }
}

#[cfg(test)]
mod tests;
