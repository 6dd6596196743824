//! urdmad's status report as `urdmad status` shows it.
//!
//! The records are `urdma-shared`'s ([`urdma_shared::status`], re-exported here): the daemon
//! fills them and they go on the wire as JSON. `urdmad status` shows each as a text line,
//! `kind key=value ...` in the record's field order ([`text_line`]), and
//! `urdmad status --json` as one document with a list of records per kind ([`document`]).
//! Field names and meanings are in docs/urdmad.md ("Status").

use serde_json::{Map, Value};
pub use urdma_shared::status::*;

/// A record as text: `kind key=value ...`, null as `-`, true and false as 1 and 0, spaces
/// in strings as `_` (so that a value is one word).
pub fn text_line(record: &Record) -> String {
    let (kind, obj) = fields(record);
    let mut out = kind;
    for (k, v) in &obj {
        match v {
            // A record within the record: its fields, named `outer_inner`.
            Value::Object(inner) => {
                for (k2, v2) in inner {
                    out.push_str(&format!(" {k}_{k2}={}", text_value(v2)));
                }
            }
            v => out.push_str(&format!(" {k}={}", text_value(v))),
        }
    }
    out
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
pub fn document(records: &[Record]) -> Value {
    let mut doc = Map::new();
    for r in records {
        let (kind, obj) = fields(r);
        if let Value::Array(list) = doc.entry(kind).or_insert(Value::Array(Vec::new())) {
            list.push(Value::Object(obj));
        }
    }
    Value::Object(doc)
}

/// A record's kind and its other fields, in their order.
fn fields(record: &Record) -> (String, Map<String, Value>) {
    let Ok(Value::Object(mut obj)) = serde_json::to_value(record) else {
        unreachable!("a status record serialises to an object");
    };
    let Some(Value::String(kind)) = obj.shift_remove("kind") else {
        unreachable!("a status record serialises with its kind");
    };
    (kind, obj)
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
        let lines: Vec<String> = sample().iter().map(text_line).collect();
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
        assert_eq!(text_line(&r), "listener id=3 dev=0 port=the_port local=x");
        assert_eq!(document(&[r])["listener"][0]["port"], "the port");
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
        let records = [
            exception(vec!["10.0.0.1/24".into(), "fd00::1/64".into()]),
            exception(Vec::new()),
        ];
        let text = text_line(&records[0]);
        assert!(
            text.ends_with(" addresses=10.0.0.1/24,fd00::1/64 rdma_device=urdma0 rdma_device_state=waiting:_urdma.ko_is_not_loaded"),
            "{text}"
        );
        assert!(text_line(&records[1]).contains(" addresses=- "));
        let doc = document(&records);
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
        let records = [flow(Some(figures)), flow(None)];
        let text = text_line(&records[0]);
        assert!(
            text.ends_with(" queued=0 qp_rx_packets=10 qp_tx_packets=12 qp_retransmissions=2 qp_timeouts=1 qp_duplicates=0 qp_crc_errors=0 qp_malformed=0 qp_srtt_us=350"),
            "{text}"
        );
        assert!(text_line(&records[1]).ends_with(" queued=0 qp=-"));
        let doc = document(&records);
        assert_eq!(doc["flow"][0]["qp"]["retransmissions"], 2);
        assert!(doc["flow"][1]["qp"].is_null());
    }

    #[test]
    fn the_document_lists_each_kinds_records_typed() {
        let doc = document(&sample());
        let kinds: Vec<&String> = doc.as_object().unwrap().keys().collect();
        assert_eq!(kinds, ["cm", "listener", "queue"]);
        assert_eq!(doc["cm"][0]["aborts_sent"], 3);
        assert_eq!(doc["listener"].as_array().unwrap().len(), 2);
        assert!(doc["listener"][0]["port"].is_null());
        assert_eq!(doc["queue"][0]["rule"], true);
        assert!(doc["queue"][0].get("kind").is_none());
    }

    #[test]
    fn records_read_back_from_the_wire_are_the_records_sent() {
        let sent = sample();
        let read: Vec<Record> = encode(&sent).iter().map(|l| decode(l).unwrap()).collect();
        assert_eq!(read, sent);
    }
}
