use super::*;
use std::io::Read;

fn pair() -> (Connection, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    (
        Connection::over(a, Duration::from_secs(5), PathBuf::new()),
        b,
    )
}

#[test]
fn a_socket_given_back_travels_with_its_line_and_outlives_the_senders_copy() {
    let (mut c, d) = pair();
    let (mine, peer) = UnixStream::pair().unwrap();
    c.give_back(OwnedFd::from(mine)).unwrap();
    let mut buf = [0u8; 64];
    let mut fds = VecDeque::new();
    let n = fdpass::recv_with_fds(&d, &mut buf, &mut fds).unwrap();
    assert_eq!(&buf[..n], b"{\"req\":\"GIVEBACK\",\"post\":true}\n");
    assert_eq!(fds.len(), 1);
    // Still open through the copy that came over: the peer sees no end of file.
    (&peer).write_all(b"x").unwrap();
    peer.set_nonblocking(true).unwrap();
    let mut one = [0u8; 1];
    let got = UnixStream::from(fds.pop_front().unwrap()).read(&mut one);
    assert_eq!(got.unwrap(), 1);
    assert!(c.pending.is_empty(), "a posted request waits for no reply");
}

#[test]
fn requests_posted_together_go_in_one_write_in_order() {
    let (mut c, mut d) = pair();
    c.post_all(&[]).unwrap();
    c.post_all(&[
        Request::PeerClosed { dev: 1, qpn: 2 },
        Request::Park { cookie: 7 },
    ])
    .unwrap();
    let want = b"{\"req\":\"PEERCLOSED\",\"dev\":1,\"qpn\":2,\"post\":true}\n\
                 {\"req\":\"PARK\",\"cookie\":7,\"post\":true}\n";
    d.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    let n = d.read(&mut buf).unwrap();
    assert_eq!(
        &buf[..n],
        &want[..],
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert!(c.pending.is_empty());
}

#[test]
fn a_connections_end_goes_in_one_write_with_its_sockets_in_order() {
    let (mut c, d) = pair();
    let (s1, _p1) = UnixStream::pair().unwrap();
    let (s2, _p2) = UnixStream::pair().unwrap();
    let closed = Request::QpClosed {
        dev: 1,
        qpn: 2,
        status: 0,
    };
    let unqp = Request::Unqp {
        dev: 1,
        qpn: 2,
        linger: false,
    };
    c.post_all_giving_back(&[], Vec::new(), &[], Urgency::Now)
        .unwrap();
    c.post_all_giving_back(
        std::slice::from_ref(&closed),
        vec![OwnedFd::from(s1), OwnedFd::from(s2)],
        std::slice::from_ref(&unqp),
        Urgency::Now,
    )
    .unwrap();
    let want = format!(
        "{}{}{}{}",
        closed.encode_posted(),
        Request::GiveBack.encode_posted(),
        Request::GiveBack.encode_posted(),
        unqp.encode_posted()
    );
    d.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let mut fds = VecDeque::new();
    let n = fdpass::recv_with_fds(&d, &mut buf, &mut fds).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&buf[..n]),
        want,
        "one read takes it all"
    );
    assert_eq!(fds.len(), 2);
    // Beyond what one write carries: the same lines, the descriptors in writes of their own.
    let socks: Vec<OwnedFd> = (0..fdpass::MAX_SEND_FDS + 1)
        .map(|_| OwnedFd::from(UnixStream::pair().unwrap().0))
        .collect();
    c.post_all_giving_back(std::slice::from_ref(&closed), socks, &[], Urgency::Now)
        .unwrap();
    let mut got = String::new();
    while let Ok(n) = fdpass::recv_with_fds(&d, &mut buf, &mut fds) {
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines.len(), fdpass::MAX_SEND_FDS + 2);
    assert_eq!(lines[0], closed.encode_posted().trim_end());
    assert_eq!(fds.len(), 2 + fdpass::MAX_SEND_FDS + 1);
    assert!(c.pending.is_empty());
}

#[test]
fn what_may_wait_goes_on_the_quiet_socket_and_the_rest_wakes_urdmad() {
    let (mut c, d) = pair();
    d.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let mut fds = VecDeque::new();
    let linger = [
        Request::Unqp {
            dev: 1,
            qpn: 2,
            linger: true,
        },
        Request::Close { flow: 3 },
    ];
    // No quiet socket yet: everything on the control socket.
    c.post_all_giving_back(&[], Vec::new(), &linger, Urgency::Later)
        .unwrap();
    let n = fdpass::recv_with_fds(&d, &mut buf, &mut fds).unwrap();
    assert_eq!(String::from_utf8_lossy(&buf[..n]).lines().count(), 2);
    c.open_quiet().unwrap();
    let n = fdpass::recv_with_fds(&d, &mut buf, &mut fds).unwrap();
    assert_eq!(&buf[..n], Request::Quiet.encode_posted().as_bytes());
    let quiet = UnixStream::from(fds.pop_front().expect("the quiet socket came with QUIET"));
    quiet.set_nonblocking(true).unwrap();
    let (s1, _p1) = UnixStream::pair().unwrap();
    c.post_all_giving_back(&[], vec![OwnedFd::from(s1)], &linger, Urgency::Later)
        .unwrap();
    let n = fdpass::recv_with_fds(&quiet, &mut buf, &mut fds).unwrap();
    let want = format!(
        "{}{}{}",
        Request::GiveBack.encode_posted(),
        linger[0].encode_posted(),
        linger[1].encode_posted()
    );
    assert_eq!(String::from_utf8_lossy(&buf[..n]), want);
    assert_eq!(fds.len(), 1, "the socket travels with its line");
    assert!(fdpass::recv_with_fds(&d, &mut buf, &mut fds).is_err());
    // Urgent, or not all of it may wait: the control socket.
    c.post_all_giving_back(&linger, Vec::new(), &[], Urgency::Now)
        .unwrap();
    c.post_all_giving_back(&[], Vec::new(), &[Request::Arm], Urgency::Later)
        .unwrap();
    let n = fdpass::recv_with_fds(&d, &mut buf, &mut fds).unwrap();
    assert_eq!(String::from_utf8_lossy(&buf[..n]).lines().count(), 3);
    assert!(fdpass::recv_with_fds(&quiet, &mut buf, &mut fds).is_err());
}

#[test]
fn a_posted_request_waits_for_nothing_and_its_refusal_is_kept_wherever_it_is_read() {
    let (mut c, mut d) = pair();
    let mut line = [0u8; 26];
    c.post(&Request::Arm).unwrap();
    d.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"{\"req\":\"ARM\",\"post\":true}\n");
    assert!(c.pending.is_empty());
    let refused = |what: &str| {
        Event::Refused {
            request: Request::Park { cookie: 7 }.encode().trim_end().to_owned(),
            code: ErrorCode::NotFound,
            message: what.into(),
        }
        .encode()
    };
    // Read by poll_events, between events: kept, not returned as an event.
    d.write_all(format!("{{\"event\":\"WAKE\"}}\n{}", refused("gone")).as_bytes())
        .unwrap();
    assert_eq!(c.poll_events().unwrap(), vec![Event::Wake]);
    // Read by a request, before its reply: kept, and the reply is the request's.
    d.write_all(format!("{}{{\"reply\":\"OK\"}}\n", refused("again")).as_bytes())
        .unwrap();
    assert_eq!(c.request(&Request::Sync).unwrap(), Response::Ok);
    assert_eq!(
        c.take_refusals(),
        vec![
            "{\"req\":\"PARK\",\"cookie\":7}: urdmad refused (ENOENT): gone".to_owned(),
            "{\"req\":\"PARK\",\"cookie\":7}: urdmad refused (ENOENT): again".to_owned(),
        ]
    );
    assert!(c.take_refusals().is_empty());
    assert!(!c.has_events());
}

#[test]
fn a_line_behind_one_that_carries_descriptors_is_read_in_the_same_look() {
    let (mut c, d) = pair();
    let (mine, _peer) = UnixStream::pair().unwrap();
    // The kernel ends a read after the bytes that carry descriptors: the first read is
    // short with more behind it.
    fdpass::send_with_fd(&d, b"{\"event\":\"WAKE\"}\n", mine.as_raw_fd()).unwrap();
    (&d).write_all(b"{\"event\":\"WAKE\"}\n").unwrap();
    assert_eq!(c.poll_events().unwrap(), vec![Event::Wake, Event::Wake]);
}

#[test]
fn a_sent_requests_reply_waits_for_its_ticket_whoever_reads_it() {
    let (mut c, mut d) = pair();
    let a = c.send(&Request::Qp { dev: 0, qpn: 1 }).unwrap();
    c.post(&Request::Arm).unwrap();
    let b = c.send(&Request::Qp { dev: 0, qpn: 2 }).unwrap();
    assert_eq!(c.answer(a), None);
    // a's reply read by poll_events, b's by a request; the posted ARM has none.
    d.write_all(
        b"{\"reply\":\"ERROR\",\"code\":\"EEXIST\",\"message\":\"taken\"}\n{\"event\":\"WAKE\"}\n",
    )
    .unwrap();
    assert_eq!(c.poll_events().unwrap(), vec![Event::Wake]);
    d.write_all(b"{\"reply\":\"OK\"}\n{\"reply\":\"OK\"}\n")
        .unwrap();
    assert_eq!(c.request(&Request::Sync).unwrap(), Response::Ok);
    assert_eq!(c.answer(b), Some(Ok(Response::Ok)));
    assert_eq!(c.answer(b), None);
    let r = c.answer(a).unwrap().unwrap();
    assert!(
        matches!(&r, Response::Error { message, .. } if message == "taken"),
        "{r:?}"
    );
    assert!(c.take_refusals().is_empty());
    // Given up before its reply came: the reply goes nowhere, the next one to its owner.
    let gone = c.send(&Request::Qp { dev: 0, qpn: 3 }).unwrap();
    let next = c.send(&Request::Qp { dev: 0, qpn: 4 }).unwrap();
    c.abandon(gone);
    d.write_all(
        b"{\"reply\":\"ERROR\",\"code\":\"EEXIST\",\"message\":\"late\"}\n{\"reply\":\"OK\"}\n",
    )
    .unwrap();
    assert!(c.poll_events().unwrap().is_empty());
    assert_eq!(c.answer(gone), None);
    assert_eq!(c.answer(next), Some(Ok(Response::Ok)));
    assert!(c.pending.is_empty() && c.answers.is_empty());
}

#[test]
fn a_request_that_times_out_does_not_take_the_next_reply() {
    let (mut c, mut d) = pair();
    c.timeout = Duration::from_millis(50);
    assert!(c.request(&Request::Sync).is_err());
    d.write_all(
        b"{\"reply\":\"ERROR\",\"code\":\"EINVAL\",\"message\":\"late\"}\n{\"reply\":\"OK\"}\n",
    )
    .unwrap();
    assert_eq!(c.request(&Request::Sync).unwrap(), Response::Ok);
}

#[test]
fn events_between_replies_are_queued_and_polled() {
    let (mut c, mut d) = pair();
    assert!(c.poll_events().unwrap().is_empty());
    d.write_all(b"{\"event\":\"WAKE\"}\n{\"event\":\"DISCONNECT\",\"dev\":1,\"qpn\":2,\"status\":0}\n{\"reply\":\"OK\"}\n")
        .unwrap();
    assert_eq!(c.request(&Request::Arm).unwrap(), Response::Ok);
    let mut line = [0u8; 14];
    d.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"{\"req\":\"ARM\"}\n");
    assert!(c.has_events());
    d.write_all(b"{\"event\":\"WA").unwrap();
    assert_eq!(
        c.poll_events().unwrap(),
        vec![
            Event::Wake,
            Event::Disconnect {
                dev: 1,
                qpn: 2,
                status: 0
            }
        ]
    );
    assert!(c.poll_events().unwrap().is_empty());
    d.write_all(b"KE\"}\n{\"event\":\"NEWFANGLED\",\"x\":1}\n")
        .unwrap();
    assert_eq!(c.poll_events().unwrap(), vec![Event::Wake]);
    d.write_all(b"{\"event\":\"WAKE\"}\n").unwrap();
    drop(d);
    assert_eq!(c.poll_events().unwrap(), vec![Event::Wake]);
    assert!(c.poll_events().is_err());
    assert!(c.request(&Request::Sync).is_err());
}

#[test]
fn an_urdmad_of_the_text_protocol_is_named_in_one_line() {
    let (mut c, mut d) = pair();
    d.write_all(b"ERROR code=EINVAL message=unknown_message\n")
        .unwrap();
    let e = c
        .request(&Request::Hello {
            version: proto::VERSION,
            pid: 1,
        })
        .unwrap_err();
    assert_eq!(
        e,
        Error::OldDaemon {
            client: proto::VERSION,
            answer: "EINVAL unknown message".into()
        }
    );
    let text = e.to_string();
    assert!(
        !text.contains('\n') && text.contains("older control protocol"),
        "{text}"
    );
}

#[test]
fn a_reply_that_never_comes_times_out() {
    let (mut c, _d) = pair();
    c.timeout = Duration::from_millis(50);
    let e = c.request(&Request::Sync).unwrap_err();
    assert_eq!(e, Error::Timeout(Duration::from_millis(50)));
    assert!(e.to_string().contains("did not answer"), "{e}");
}
