//! urdmad's status report, typed: the records `STATUS` answers with, both ways (urdmad
//! encodes them, [`crate::client::Connection::status`] decodes them), so that the daemon,
//! `urdmad status` and anything reading the report share one definition of each field.
//!
//! Each record goes on the wire as one JSON object whose `kind` says which record it is
//! (`STATUS lines=N`, then N such lines), its fields in the order they are declared here.
//! Field names and meanings are in docs/urdmad.md ("Status"). Behind the `status` feature:
//! the provider does not read the report and does not need serde for it.

use serde::{Deserialize, Serialize};

/// One record of the report.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    Daemon(Daemon),
    Pool(Pool),
    Port(Port),
    Queue(Queue),
    Exception(Exception),
    Process(Process),
    Cm(Cm),
    Listener(Listener),
    Request(Request),
    Connecting(Connecting),
    Connection(Connection),
    Qp(Qp),
    Flow(Flow),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Daemon {
    pub version: String,
    pub pid: u32,
    pub prefix: String,
    pub uptime_s: u64,
    /// Attached processes.
    pub processes: usize,
    pub flows: usize,
    pub rings: usize,
    pub flow_rules: usize,
    /// Whether a frame on a port wakes urdmad from its sleep.
    pub frames_wake: bool,
    pub spurious_wakes: u64,
    /// Direct-path sockets with their rings set, ready for connections to come, and
    /// sockets waiting to be closed (`socket_keeper`); `None` without the keeper.
    pub sockets_ready: Option<usize>,
    pub sockets_closing: Option<usize>,
    /// Connections that found no socket ready (`socket_keeper`) and had urdmad's thread
    /// make theirs, waiting for the grace periods, since start; of them, those that found a
    /// keeper's thread holding the keeper's lock. `None` without the keeper.
    #[serde(default)]
    pub sockets_missed: Option<u64>,
    #[serde(default)]
    pub sockets_missed_busy: Option<u64>,
    /// Direct-path filters used again for a new connection (`filter_pool`), since start.
    #[serde(default)]
    pub filters_reused: u64,
    /// Direct-path sockets that processes keep parked for their next connections now, and
    /// connections that took one, since start.
    #[serde(default)]
    pub sockets_parked: usize,
    #[serde(default)]
    pub sockets_reused: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Pool {
    pub name: String,
    pub size: u32,
    pub available: u32,
    pub in_use: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Port {
    pub index: u16,
    pub name: String,
    pub device: String,
    pub mac: String,
    pub steering: String,
    /// Why steering is what it is (None: as configured).
    pub steering_reason: Option<String>,
    pub flow_queues: usize,
    pub free_queues: usize,
    pub quarantined_queues: usize,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_missed: u64,
    pub rx_socket_drops: u64,
    pub rx_errors: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
    pub from_processes: u64,
    pub from_processes_drops: u64,
    pub loopback: u64,
    pub echoes: u64,
    pub conns_direct: u64,
    pub conns_forwarded: u64,
    /// Whether the port hands connections their own packet socket.
    pub direct: bool,
    /// With `direct`: the connections on it now, and at most.
    pub direct_flows: Option<usize>,
    pub direct_max: Option<usize>,
    /// Without `direct`: why not.
    pub direct_off: Option<String>,
    /// What ends urdmad's idle sleep when the port receives: `socket` (af_packet),
    /// `interrupt` (a PCI device's RX interrupts) or `timer` (nothing: urdmad looks again
    /// after `idle_sleep_us`).
    pub rx_wake: String,
    /// With `timer`: why the port has no interrupt.
    pub rx_wake_reason: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Queue {
    pub port: String,
    pub id: u16,
    pub state: String,
    pub flow: Option<u32>,
    /// Whether an `rte_flow` rule steers to it.
    pub rule: bool,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub drops: u64,
    pub strays: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Exception {
    pub port: String,
    pub iface: String,
    pub to_kernel: u64,
    pub to_kernel_drops: u64,
    pub from_kernel: u64,
    pub from_kernel_drops: u64,
    pub tap_rx_packets: u64,
    pub tap_tx_packets: u64,
    /// What urdmad put on the interface (`addresses`), and the device it keeps there:
    /// `created index=N` or `waiting: WHY`.
    pub addresses: Vec<String>,
    pub rdma_device: Option<String>,
    pub rdma_device_state: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Process {
    pub client: u32,
    pub pid: u32,
    pub uid: u32,
    pub lcore: u32,
    pub flows: usize,
    pub tx_queued: u32,
    pub tx_packets: u64,
    pub tx_drops: u64,
    pub mbufs_lent: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Cm {
    /// "open" or "none" (/dev/urdma_cm).
    pub channel: String,
    pub listeners: usize,
    pub requests: usize,
    pub max_requests: usize,
    pub requests_dropped: u64,
    pub connecting: usize,
    pub connected: usize,
    pub qps: usize,
    pub rejects_sent: u64,
    pub aborts_sent: u64,
    pub strays: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Listener {
    pub id: u64,
    pub dev: u32,
    /// None: any port.
    pub port: Option<String>,
    pub local: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Request {
    pub req: u64,
    pub listener: u64,
    pub port: String,
    pub local: String,
    pub remote: String,
    pub peer_conn: u32,
    pub state: String,
    pub idle_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Connecting {
    pub id: u64,
    pub dev: u32,
    pub qpn: u32,
    pub port: String,
    pub local: String,
    pub remote: String,
    pub mac: String,
    pub sent: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Connection {
    pub dev: u32,
    pub qpn: u32,
    pub client: u32,
    pub role: String,
    pub port: String,
    pub local: String,
    pub remote: String,
    pub mac: String,
    pub flow: u32,
    pub peer_conn: u32,
    pub peer_closed: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Qp {
    pub dev: u32,
    pub qpn: u32,
    pub client: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Flow {
    pub id: u32,
    pub client: u32,
    pub port: String,
    pub local: String,
    /// None: any remote.
    pub remote: Option<String>,
    pub ring: String,
    pub steering: String,
    /// With hardware steering: its queue.
    pub queue: Option<u16>,
    /// Software steering where hardware was asked for: why.
    pub fallback: Option<String>,
    /// "direct" (the connection's own socket) or "urdmad".
    pub path: String,
    pub rx_packets: u64,
    /// Of `rx_packets`, those urdmad forwarded (before a direct hand-over).
    pub via_urdmad: u64,
    pub rx_bytes: u64,
    pub drops: u64,
    pub queued: u32,
    /// A connection's QP as its process last kept its figures (docs/urdmad.md, "Status");
    /// none for other flows and for a connection without a slot.
    pub qp: Option<QpFigures>,
}

/// A connected QP's transport figures, while it lives.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct QpFigures {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub duplicates: u64,
    pub crc_errors: u64,
    pub malformed: u64,
    /// 0 before the first sample.
    pub srtt_us: u64,
}

/// The report's lines on the wire.
pub fn encode(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| serde_json::to_string(r).expect("a status record serialises"))
        .collect()
}

/// One line of the wire as its record; the error says what is wrong with it.
pub fn decode(line: &str) -> Result<Record, crate::client::Error> {
    serde_json::from_str(line.trim_end()).map_err(|e| {
        crate::client::Error::Malformed(format!(
            "urdmad sent a status line that is not a record ({e}): {line}"
        ))
    })
}

/// A kind of record, to pick its records out of a report ([`all`], [`first`]).
pub trait Kind: Sized {
    fn of(r: &Record) -> Option<&Self>;
}

macro_rules! kinds {
    ($($t:ident),*) => {
        $(impl Kind for $t {
            fn of(r: &Record) -> Option<&Self> {
                match r {
                    Record::$t(x) => Some(x),
                    _ => None,
                }
            }
        })*
    };
}

kinds!(
    Daemon, Pool, Port, Queue, Exception, Process, Cm, Listener, Request, Connecting, Connection,
    Qp, Flow
);

/// The report's records of kind `T`, in the report's order.
pub fn all<'a, T: Kind + 'a>(records: &'a [Record]) -> impl Iterator<Item = &'a T> {
    records.iter().filter_map(T::of)
}

/// The report's first record of kind `T` (of `daemon` and `cm`, the only one).
pub fn first<T: Kind>(records: &[Record]) -> Option<&T> {
    all(records).next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_within_a_record_and_nones_read_back_as_sent() {
        let flow = |qp, remote: Option<&str>| {
            Record::Flow(Flow {
                id: 7,
                client: 1,
                port: "p0".into(),
                local: "10.0.0.1:4791".into(),
                remote: remote.map(str::to_owned),
                ring: "urd_rx_7".into(),
                steering: "hardware".into(),
                queue: Some(3),
                fallback: None,
                path: "urdmad".into(),
                rx_packets: 1,
                via_urdmad: 1,
                rx_bytes: 100,
                drops: 0,
                queued: 0,
                qp,
            })
        };
        let figures = QpFigures {
            rx_packets: 10,
            tx_packets: 12,
            retransmissions: 2,
            timeouts: 1,
            duplicates: 0,
            crc_errors: 0,
            malformed: 0,
            srtt_us: 350,
        };
        let sent = vec![flow(Some(figures), Some("10.0.0.2:4791")), flow(None, None)];
        let wire = encode(&sent);
        assert!(
            wire[1].starts_with(r#"{"kind":"flow","id":7,"#),
            "{}",
            wire[1]
        );
        let read: Vec<Record> = wire.iter().map(|l| decode(l).unwrap()).collect();
        assert_eq!(read, sent);
        let flows: Vec<&Flow> = all(&read).collect();
        assert_eq!(flows.len(), 2);
        assert_eq!(flows[0].qp.as_ref().map(|q| q.srtt_us), Some(350));
        assert!(first::<Daemon>(&read).is_none());
    }

    #[test]
    fn lines_that_are_not_records_are_errors() {
        for bad in [
            "",
            "port index=0",
            "[1,2]",
            r#"{"index":0}"#,
            r#"{"kind":3}"#,
            r#"{"kind":"newfangled","x":1}"#,
            r#"{"kind":"qp","dev":0,"qpn":1}"#,
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            decode(r#"{"kind":"qp","dev":0,"qpn":1,"client":2}"#),
            Ok(Record::Qp(Qp {
                dev: 0,
                qpn: 1,
                client: 2
            }))
        );
    }
}
