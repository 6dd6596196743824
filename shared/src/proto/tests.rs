//! The codec's tests: every message both ways, the wire form, and no input that panics.

use super::*;

fn connected() -> Connected {
    Connected {
        dev: 1,
        qpn: 17,
        role: Role::Passive,
        port: 0,
        local: "10.0.0.1:4791".parse().unwrap(),
        remote: "10.0.0.2:50000".parse().unwrap(),
        mac: Mac([2, 0, 0, 0, 0, 0xab]),
        flow: 9,
        rx_ring: "urd_rx_9".into(),
        ird: 16,
        ord: 8,
        datagram: 1472,
        crc: true,
        direct: 0,
        bell: false,
        hush: false,
        stats: Some(5),
        conn: 0xdead_beef,
        isn: 7,
        pdata: vec![],
        pkt: vec![0, 1, 0xfe, 0xff],
        accept_sent: false,
        park: false,
        reuse: 0,
    }
}

fn requests() -> Vec<Request> {
    vec![
        Request::Hello {
            version: 1,
            pid: 99,
        },
        Request::Attach,
        Request::Open(FlowSpec {
            port: 0,
            local: "10.0.0.1:4791".parse().unwrap(),
            remote: Some("10.0.0.2:5000".parse().unwrap()),
            remote_mac: Some(Mac([2, 0, 0, 0, 0, 0xab])),
        }),
        Request::Open(FlowSpec {
            port: 3,
            local: "10.0.0.1:1".parse().unwrap(),
            remote: None,
            remote_mac: None,
        }),
        Request::Close { flow: 7 },
        Request::Status,
        Request::Detach,
        Request::Qp { dev: 0, qpn: 17 },
        Request::Unqp {
            dev: 3,
            qpn: 1,
            linger: false,
        },
        Request::Unqp {
            dev: 3,
            qpn: 2,
            linger: true,
        },
        Request::QpClosed {
            dev: 0,
            qpn: 17,
            status: -104,
        },
        Request::PeerClosed { dev: 2, qpn: 5 },
        Request::Arm,
        Request::Sync,
        Request::GiveBack,
        Request::Park { cookie: u64::MAX },
    ]
}

fn responses() -> Vec<Response> {
    vec![
        Response::Hello {
            version: 1,
            daemon: "urdmad 0.1.0".into(),
        },
        Response::Attached(Attachment {
            client: 3,
            file_prefix: "urdma".into(),
            lcore: 3,
            alloc_ring: "urd_alloc_3".into(),
            free_ring: "urd_free_3".into(),
            ports: vec![PortInfo {
                index: 0,
                name: "port0".into(),
                mac: Mac([2, 0, 0, 0, 0, 1]),
                tx_ring: "urd_tx_3_0".into(),
                steering: Steering::Software,
            }],
        }),
        Response::Opened {
            flow: 1,
            rx_ring: "urd_rx_1".into(),
            steering: Steering::Software,
            queue: None,
        },
        Response::Opened {
            flow: 2,
            rx_ring: "urd_rx_2".into(),
            steering: Steering::Hardware,
            queue: Some(3),
        },
        Response::Closed { flow: 1 },
        Response::Status { lines: 12 },
        Response::Detached,
        Response::Ok,
        Response::Error {
            code: ErrorCode::Access,
            message: "uid 65534 is not allowed".into(),
        },
    ]
}

#[test]
fn every_message_is_one_line_and_comes_back_as_it_went() {
    for r in requests() {
        let line = r.encode();
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.ends_with('\n') && !is_event(&line), "{line}");
        assert_eq!(Request::decode(&line).unwrap(), r);
    }
    for r in responses() {
        let line = r.encode();
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(!is_event(&line), "{line}");
        assert_eq!(Response::decode(&line).unwrap(), r);
    }
}

#[test]
fn a_posted_request_says_so_and_comes_back_as_it_went() {
    for r in requests() {
        let line = r.encode_posted();
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.ends_with(",\"post\":true}\n"), "{line}");
        assert_eq!(Request::decode_line(&line).unwrap(), (r.clone(), true));
        // Not posted: no `post`, and a decoder of either kind reads it.
        assert_eq!(
            Request::decode_line(&r.encode()).unwrap(),
            (r.clone(), false)
        );
        assert_eq!(Request::decode(&line).unwrap(), r);
    }
    assert_eq!(
        Request::Arm.encode_posted(),
        "{\"req\":\"ARM\",\"post\":true}\n"
    );
    assert_eq!(
        Request::decode_line("{\"req\":\"ARM\",\"post\":false}").unwrap(),
        (Request::Arm, false)
    );
    assert!(Request::decode_line("{\"req\":\"ARM\",\"post\":1}").is_err());
    assert!(Request::decode_line("{\"post\":true}").is_err());
}

#[test]
fn a_posted_request_is_answered_only_when_refused() {
    let park = Request::Park { cookie: 16 };
    assert_eq!(park.posted_outcome(&Response::Ok.encode()), None);
    assert_eq!(
        park.posted_outcome(&Response::Closed { flow: 3 }.encode()),
        None
    );
    let refused = Response::Error {
        code: ErrorCode::NotFound,
        message: "not yours".into(),
    };
    let line = park.posted_outcome(&refused.encode()).unwrap();
    assert_eq!(
        line,
        "{\"event\":\"REFUSED\",\"request\":\"{\\\"req\\\":\\\"PARK\\\",\\\"cookie\\\":16}\",\"code\":\"ENOENT\",\"message\":\"not yours\"}\n"
    );
    assert!(is_event(&line));
    assert_eq!(
        Event::decode(&line).unwrap(),
        Event::Refused {
            request: "{\"req\":\"PARK\",\"cookie\":16}".into(),
            code: ErrorCode::NotFound,
            message: "not yours".into(),
        }
    );
}

#[test]
fn the_wire_form_is_the_documented_one() {
    assert_eq!(
        Request::Qp { dev: 0, qpn: 5 }.encode(),
        "{\"req\":\"QP\",\"dev\":0,\"qpn\":5}\n"
    );
    assert_eq!(
        Request::Open(FlowSpec {
            port: 0,
            local: "10.0.0.1:4791".parse().unwrap(),
            remote: None,
            remote_mac: Some(Mac([2, 0, 0, 0, 0, 0xab])),
        })
        .encode(),
        "{\"req\":\"OPEN\",\"port\":0,\"local\":\"10.0.0.1:4791\",\"mac\":\"02:00:00:00:00:ab\"}\n"
    );
    assert_eq!(Response::Ok.encode(), "{\"reply\":\"OK\"}\n");
    assert_eq!(
        Response::Error {
            code: ErrorCode::Version,
            message: "no".into()
        }
        .encode(),
        "{\"reply\":\"ERROR\",\"code\":\"EVERSION\",\"message\":\"no\"}\n"
    );
    assert_eq!(Event::Wake.encode(), "{\"event\":\"WAKE\"}\n");
    let line = Event::Connected(Box::new(connected())).encode();
    assert!(line.starts_with("{\"event\":\"CONNECTED\",\"dev\":1,\"qpn\":17,\"role\":\"passive\""));
    assert!(line.contains(",\"rx\":\"urd_rx_9\","), "{line}");
    assert!(
        line.ends_with(
            ",\"pdata\":\"\",\"pkt\":\"0001feff\",\"accept_sent\":false,\"park\":false}\n"
        ),
        "{line}"
    );
    // `accept_sent` and `park` may be left out: they are then false; `reuse` 0 is.
    let short = line.replace(",\"accept_sent\":false,\"park\":false", "");
    assert_eq!(
        Event::decode(&short).unwrap(),
        Event::Connected(Box::new(connected()))
    );
    let reused = Connected {
        direct: 256,
        park: true,
        reuse: 0x1234_5678_9abc,
        ..connected()
    };
    let line = Event::Connected(Box::new(reused.clone())).encode();
    assert!(
        line.ends_with(",\"park\":true,\"reuse\":20015998343868}\n"),
        "{line}"
    );
    assert_eq!(
        Event::decode(&line).unwrap(),
        Event::Connected(Box::new(reused))
    );
}

#[test]
fn fields_a_decoder_does_not_know_are_ignored_and_optional_ones_may_be_left_out() {
    assert_eq!(
        Request::decode("{\"req\":\"CLOSE\",\"flow\":7,\"later\":[1,{\"x\":null}]}").unwrap(),
        Request::Close { flow: 7 }
    );
    assert_eq!(
        Response::decode("{\"reply\":\"OPENED\",\"flow\":7,\"rx\":\"urd_rx_7\"}").unwrap(),
        Response::Opened {
            flow: 7,
            rx_ring: "urd_rx_7".into(),
            steering: Steering::Software,
            queue: None,
        }
    );
    let mut c = connected();
    c.stats = None;
    let e = Event::Connected(Box::new(c));
    let unsaid = e.encode().replace(",\"stats\":null", "");
    assert!(!unsaid.contains("stats"), "{unsaid}");
    assert_eq!(Event::decode(&unsaid).unwrap(), e);
}

#[test]
fn connected_read_straight_is_read_as_the_tagged_form_reads_it() {
    let mut c = connected();
    c.pdata = (0..=255).collect();
    let line = Event::Connected(Box::new(c)).encode();
    let tagged = |l: &str| decode::<Event>(l);
    // An unknown field, the tag again, a missing or a bad field: both agree.
    let unknown = line.replacen("\"dev\"", "\"later\":[1],\"dev\"", 1);
    let missing = line.replacen("\"qpn\":17,", "", 1);
    let bad_hex = line.replacen("\"pkt\":\"0001feff\"", "\"pkt\":\"0g\"", 1);
    for l in [&line, &unknown, &missing, &bad_hex] {
        assert_eq!(Event::decode(l).is_ok(), tagged(l).is_ok(), "{l}");
        if let Ok(e) = Event::decode(l) {
            assert_eq!(e, tagged(l).unwrap());
        }
    }
    assert!(Event::decode(&missing).is_err() && Event::decode(&bad_hex).is_err());
    assert!(Event::decode("{\"event\":\"CONNECTED\",}").is_err());
}

#[test]
fn events_come_back_as_they_went_and_the_largest_fits_a_line() {
    let mut c = connected();
    c.role = Role::Active;
    c.stats = None;
    c.pdata = (0..=254).collect();
    c.pkt = vec![0xab; 1472];
    for e in [
        Event::Connected(Box::new(connected())),
        Event::Connected(Box::new(c)),
        Event::Disconnect {
            dev: 1,
            qpn: 2,
            status: -103,
        },
        Event::Wake,
        Event::Refused {
            request: "{\"req\":\"QP\",\"dev\":0,\"qpn\":5}".into(),
            code: ErrorCode::Exists,
            message: "QP 0/5 is another process's".into(),
        },
    ] {
        let line = e.encode();
        assert!(line.len() < MAX_LINE && is_event(&line), "{}", line.len());
        assert_eq!(Event::decode(&line).unwrap(), e);
    }
    assert!(!is_event("{\"reply\":\"OK\"}\n"));
    assert!(!is_event("EVENT WAKE\n"));
}

#[test]
fn malformed_lines_are_errors_that_say_why() {
    let good = Event::Connected(Box::new(connected())).encode();
    for (from, to) in [
        ("\"role\":\"passive\"", "\"role\":\"sideways\""),
        ("\"pkt\":\"0001feff\"", "\"pkt\":\"0001fef\""),
        ("\"pkt\":\"0001feff\"", "\"pkt\":\"zz\""),
        ("\"mac\":\"02:", "\"mac\":\"2:"),
        ("\"local\":\"10.0.0.1:4791\"", "\"local\":\"10.0.0.1\""),
        ("\"crc\":true", "\"crc\":1"),
        ("\"qpn\":17", "\"qpn\":-17"),
        ("\"port\":0", "\"port\":70000"),
        ("\"event\":\"CONNECTED\"", "\"event\":\"BOGUS\""),
        (",\"isn\":7", ""),
    ] {
        let s = good.replacen(from, to, 1);
        assert_ne!(s, good);
        let e = Event::decode(&s).unwrap_err();
        assert!(matches!(e, ProtoError::Malformed(_)), "{s}: {e}");
    }
    assert_eq!(Request::decode(""), Err(ProtoError::Empty));
    assert_eq!(Request::decode("\n"), Err(ProtoError::Empty));
    assert_eq!(
        Request::decode(&format!(
            "{{\"req\":\"ARM\",\"x\":\"{}\"}}",
            "a".repeat(MAX_LINE)
        )),
        Err(ProtoError::TooLong)
    );
    assert!(Response::decode(&format!(
        "{{\"reply\":\"STATUS\",\"lines\":{}}}",
        MAX_STATUS_LINES + 1
    ))
    .is_err());
    assert!(Response::decode("{\"reply\":\"ERROR\",\"code\":\"EWHAT\",\"message\":\"\"}").is_err());
    // A request is not a reply, nor a reply an event.
    assert!(Response::decode(&Request::Arm.encode()).is_err());
    assert!(Event::decode(&Response::Ok.encode()).is_err());
    // The account of what is wrong stays short enough to go back in an ERROR line.
    let long = format!("{{\"req\":\"{}\"}}", "Q".repeat(3000));
    match Request::decode(&long) {
        Err(ProtoError::Malformed(why)) => assert!(why.len() <= MAX_REASON + 3, "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_line_makes_a_decoder_panic() {
    let mut samples: Vec<String> = requests().iter().map(Request::encode).collect();
    samples.extend(requests().iter().map(Request::encode_posted));
    samples.extend(responses().iter().map(Response::encode));
    samples.push(Event::Connected(Box::new(connected())).encode());
    for msg in &samples {
        for i in 0..msg.len() {
            if msg.is_char_boundary(i) {
                let _ = Request::decode(&msg[..i]);
                let _ = Request::decode_line(&msg[..i]);
                let _ = Response::decode(&msg[..i]);
                let _ = Event::decode(&msg[..i]);
            }
        }
    }
    // A fixed-seed generator, biased towards JSON's and the protocol's alphabet so that
    // inputs get past the first byte.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let alphabet: Vec<char> = "{}[]\":,reqplyventHELOQPCNDW 0123456789.-abcdef\\u\u{e9}\u{0}\n"
        .chars()
        .collect();
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 80) as usize;
        let line: String = (0..len)
            .map(|i| alphabet[((x >> (i % 50)) as usize + i * 7) % alphabet.len()])
            .collect();
        let _ = Request::decode(&line);
        let _ = Request::decode_line(&line);
        let _ = Response::decode(&line);
        let _ = Event::decode(&line);
    }
    let deep = "[".repeat(MAX_LINE - 1);
    assert!(Request::decode(&deep).is_err());
}

#[test]
fn hex_both_ways() {
    assert_eq!(hex(&[0, 0x0f, 0xa0, 0xff]), "000fa0ff");
    assert_eq!(unhex("000FA0ff"), Some(vec![0, 0x0f, 0xa0, 0xff]));
    assert_eq!(unhex(""), Some(vec![]));
    assert_eq!(unhex("0"), None);
    assert_eq!(unhex("0g"), None);
    assert_eq!(unhex("é0"), None);
}
