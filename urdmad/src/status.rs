//! urdmad's status report, typed: what `STATUS` answers and `urdmad status` shows.
//!
//! The daemon fills [`Record`]s; each goes on the wire as one JSON object whose `kind`
//! says which record it is (`STATUS lines=N`, then N such lines). `urdmad status` shows
//! each as a text line, `kind key=value ...` in the record's field order ([`text_line`]),
//! and `urdmad status --json` as one document with a list of records per kind
//! ([`document`]). Field names and meanings are in docs/urdmad.md ("Status").

use serde::Serialize;
use serde_json::{Map, Value};

/// One record of the report.
#[derive(Serialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Debug, Clone, PartialEq)]
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
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Pool {
    pub name: String,
    pub size: u32,
    pub available: u32,
    pub in_use: u32,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
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
}

#[derive(Serialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Listener {
    pub id: u64,
    pub dev: u32,
    /// None: any port.
    pub port: Option<String>,
    pub local: String,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Qp {
    pub dev: u32,
    pub qpn: u32,
    pub client: u32,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
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
#[derive(Serialize, Debug, Clone, PartialEq)]
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

/// One line of the wire as text: `kind key=value ...`, null as `-`, true and false as 1
/// and 0, spaces in strings as `_` (so that a value is one word).
pub fn text_line(line: &str) -> Result<String, String> {
    let obj = record(line)?;
    let mut out = String::new();
    for (k, v) in &obj {
        match v {
            Value::String(s) if k == "kind" => out.insert_str(0, s),
            // A record within the record: its fields, named `outer_inner`.
            Value::Object(inner) => {
                for (k2, v2) in inner {
                    out.push_str(&format!(" {k}_{k2}={}", text_value(v2)));
                }
            }
            v => out.push_str(&format!(" {k}={}", text_value(v))),
        }
    }
    Ok(out)
}

/// One value as a word.
fn text_value(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::Bool(b) => u8::from(*b).to_string(),
        Value::String(s) => s.replace(' ', "_"),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            let words: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            if words.is_empty() {
                "-".to_string()
            } else {
                words.join(",").replace(' ', "_")
            }
        }
        other => other.to_string(),
    }
}

/// The report as one JSON document: per kind, in the order kinds first come, the list of
/// its records (without `kind`).
pub fn document(lines: &[String]) -> Result<Value, String> {
    let mut doc = Map::new();
    for l in lines {
        let mut obj = record(l)?;
        let Some(Value::String(kind)) = obj.shift_remove("kind") else {
            return Err(format!("a status record without its kind: {l}"));
        };
        if let Value::Array(list) = doc.entry(kind).or_insert(Value::Array(Vec::new())) {
            list.push(Value::Object(obj));
        }
    }
    Ok(Value::Object(doc))
}

fn record(line: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(line) {
        Ok(Value::Object(o)) if matches!(o.get("kind"), Some(Value::String(_))) => Ok(o),
        _ => Err(format!(
            "urdmad sent a status line that is not a record: {line}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record::Cm(Cm {
                channel: "open".into(),
                listeners: 1,
                requests: 0,
                max_requests: 64,
                requests_dropped: 0,
                connecting: 0,
                connected: 2,
                qps: 2,
                rejects_sent: 0,
                aborts_sent: 3,
                strays: 0,
            }),
            Record::Listener(Listener {
                id: 1,
                dev: 0,
                port: None,
                local: "10.0.0.1:4791".into(),
            }),
            Record::Listener(Listener {
                id: 2,
                dev: 0,
                port: Some("p0".into()),
                local: "10.0.0.1:4792".into(),
            }),
            Record::Queue(Queue {
                port: "p0".into(),
                id: 1,
                state: "flow".into(),
                flow: Some(7),
                rule: true,
                rx_packets: 10,
                rx_bytes: 1000,
                drops: 0,
                strays: 0,
            }),
        ]
    }

    #[test]
    fn text_lines_read_as_the_records_fields_in_order() {
        let lines: Vec<String> = encode(&sample())
            .iter()
            .map(|l| text_line(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            "cm channel=open listeners=1 requests=0 max_requests=64 requests_dropped=0 connecting=0 connected=2 qps=2 rejects_sent=0 aborts_sent=3 strays=0"
        );
        assert_eq!(lines[1], "listener id=1 dev=0 port=- local=10.0.0.1:4791");
        assert_eq!(
            lines[3],
            "queue port=p0 id=1 state=flow flow=7 rule=1 rx_packets=10 rx_bytes=1000 drops=0 strays=0"
        );
    }

    #[test]
    fn a_string_with_spaces_stays_one_word_in_text_and_whole_in_json() {
        let r = Record::Listener(Listener {
            id: 3,
            dev: 0,
            port: Some("the port".into()),
            local: "x".into(),
        });
        let wire = encode(&[r]);
        assert_eq!(
            text_line(&wire[0]).unwrap(),
            "listener id=3 dev=0 port=the_port local=x"
        );
        assert_eq!(document(&wire).unwrap()["listener"][0]["port"], "the port");
    }

    #[test]
    fn a_list_of_words_is_one_word_in_text_and_a_list_in_json() {
        let exception = |addresses: Vec<String>| {
            Record::Exception(Exception {
                port: "p0".into(),
                iface: "tap0".into(),
                to_kernel: 0,
                to_kernel_drops: 0,
                from_kernel: 0,
                from_kernel_drops: 0,
                tap_rx_packets: 0,
                tap_tx_packets: 0,
                addresses,
                rdma_device: Some("urdma0".into()),
                rdma_device_state: Some("waiting: urdma.ko is not loaded".into()),
            })
        };
        let wire = encode(&[
            exception(vec!["10.0.0.1/24".into(), "fd00::1/64".into()]),
            exception(Vec::new()),
        ]);
        let text = text_line(&wire[0]).unwrap();
        assert!(
            text.ends_with(" addresses=10.0.0.1/24,fd00::1/64 rdma_device=urdma0 rdma_device_state=waiting:_urdma.ko_is_not_loaded"),
            "{text}"
        );
        assert!(text_line(&wire[1]).unwrap().contains(" addresses=- "));
        let doc = document(&wire).unwrap();
        assert_eq!(doc["exception"][0]["addresses"][1], "fd00::1/64");
        assert_eq!(
            doc["exception"][1]["addresses"].as_array().unwrap().len(),
            0
        );
    }

    #[test]
    fn a_record_within_a_record_is_prefixed_words_in_text_and_an_object_in_json() {
        let flow = |qp| {
            Record::Flow(Flow {
                id: 7,
                client: 1,
                port: "p0".into(),
                local: "10.0.0.1:4791".into(),
                remote: None,
                ring: "urd_rx_7".into(),
                steering: "software".into(),
                queue: None,
                fallback: None,
                path: "direct".into(),
                rx_packets: 1,
                via_urdmad: 0,
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
        let wire = encode(&[flow(Some(figures)), flow(None)]);
        let text = text_line(&wire[0]).unwrap();
        assert!(
            text.ends_with(" queued=0 qp_rx_packets=10 qp_tx_packets=12 qp_retransmissions=2 qp_timeouts=1 qp_duplicates=0 qp_crc_errors=0 qp_malformed=0 qp_srtt_us=350"),
            "{text}"
        );
        assert!(text_line(&wire[1]).unwrap().ends_with(" queued=0 qp=-"));
        let doc = document(&wire).unwrap();
        assert_eq!(doc["flow"][0]["qp"]["retransmissions"], 2);
        assert!(doc["flow"][1]["qp"].is_null());
    }

    #[test]
    fn the_document_lists_each_kinds_records_typed() {
        let doc = document(&encode(&sample())).unwrap();
        let kinds: Vec<&String> = doc.as_object().unwrap().keys().collect();
        assert_eq!(kinds, ["cm", "listener", "queue"]);
        assert_eq!(doc["cm"][0]["aborts_sent"], 3);
        assert_eq!(doc["listener"].as_array().unwrap().len(), 2);
        assert!(doc["listener"][0]["port"].is_null());
        assert_eq!(doc["queue"][0]["rule"], true);
        assert!(doc["queue"][0].get("kind").is_none());
    }

    #[test]
    fn lines_that_are_not_records_are_errors() {
        for bad in ["", "port index=0", "[1,2]", "{\"index\":0}", "{\"kind\":3}"] {
            assert!(text_line(bad).is_err(), "{bad:?}");
            assert!(document(&[bad.to_string()]).is_err(), "{bad:?}");
        }
    }
}
