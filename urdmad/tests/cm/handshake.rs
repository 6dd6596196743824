//! Connections set up, used and ended through both urdmads, and given to the process the
//! kernel names.

use super::*;

/// Moves datagrams between two connections until neither has anything to send.
fn exchange(
    a: &mut trp::Connection,
    b: &mut trp::Connection,
    ma: &mut trp::VecMemory,
    mb: &mut trp::VecMemory,
    now: trp::Instant,
) {
    let mut buf = vec![0u8; 2048];
    for _ in 0..100 {
        let mut moved = false;
        // No application here replies, and the clock stands still: acknowledge at once.
        a.release_held_ack();
        b.release_held_ack();
        while let Some(n) = a.poll_transmit(now, ma, &mut buf) {
            b.handle_datagram(now, mb, &buf[..n]).unwrap();
            moved = true;
        }
        while let Some(n) = b.poll_transmit(now, mb, &mut buf) {
            a.handle_datagram(now, ma, &buf[..n]).unwrap();
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

#[test]
fn connections_through_two_urdmads_with_fake_kernels() {
    let bed = Bed::new("cm");
    let a = start_side(&bed, &bed.ns_a, &bed.veth_a, "a", false);
    // B's urdmad starts before its kernel channel exists (urdma.ko loaded after urdmad)
    // and takes it up when it appears: everything below goes through it.
    let b = start_side_kernel(&bed, &bed.ns_b, &bed.veth_b, "b", false, true);
    let b_addr = SocketAddrV4::new(B_IP, 7000);

    // --- Listen on B, connect from A, accept on B.
    let mut pa = a.process(5);
    let mut pb = b.process(9);
    listen(&b, 1, 7000);
    a.send(connect_msg(11, 5, 40000, b_addr, b.mac, b"hello"));
    let req = b.expect(Op::Request);
    assert_eq!(req.id, 1);
    assert_eq!(req.local, b_addr);
    assert_eq!(req.remote, SocketAddrV4::new(A_IP, 40000));
    assert_eq!(req.pdata, b"hello");
    assert_eq!((req.ird, req.ord), (4, 3));
    assert_eq!(req.remote_mac, a.mac);
    let st = b.status();
    assert_eq!(one::<status::Request>(&st).state, "pending", "{st:?}");
    assert_eq!(one::<Listener>(&st).id, 1, "{st:?}");
    let mut acc = Msg::new(Op::Accept);
    acc.req = req.req;
    acc.qpn = 9;
    acc.ird = 2;
    acc.ord = 1;
    acc.pdata = b"welcome".to_vec();
    b.send(acc);
    let ev_b = connected(&mut pb);
    let accepted = b.expect(Op::Accepted);
    assert_eq!((accepted.req, accepted.status), (req.req, 0));
    assert_eq!(ev_b.role, Role::Passive);
    assert_eq!((ev_b.dev, ev_b.qpn), (0, 9));
    assert_eq!(ev_b.local, b_addr);
    assert_eq!(ev_b.remote, SocketAddrV4::new(A_IP, 40000));
    assert_eq!(ev_b.mac, a.mac);
    assert_eq!((ev_b.ird, ev_b.ord, ev_b.datagram), (2, 1, 1472));
    assert_eq!(ev_b.pdata, b"welcome");
    assert!(ev_b.rx_ring.starts_with("urd_rx_"));

    // urdmad B sent the Accept with the hand-over. The provider's part on B: rebuild the
    // connection, whose first datagram is that Accept, taken as sent.
    assert!(ev_b.accept_sent);
    let now = trp::Instant::from_nanos(1);
    let inc = trp::Incoming::parse(&ev_b.pkt).unwrap();
    assert_eq!(inc.private_data(), b"hello");
    let mut conn_b = inc
        .accept(cfg_of(&ev_b), ev_b.conn, ev_b.isn, &ev_b.pdata)
        .unwrap();
    let mut mem_a = memory();
    let mut mem_b = memory();
    let mut buf = vec![0u8; 2048];
    let n = conn_b
        .poll_transmit(now, &mem_b, &mut buf)
        .expect("the Accept");
    let accept_pkt = buf[..n].to_vec();
    // Namespace B's kernel sends the test's frames to A's flow below.
    sh(&[
        "ip",
        "-n",
        &bed.ns_b,
        "addr",
        "add",
        &format!("{B_IP}/32"),
        "dev",
        &bed.veth_b,
    ]);
    sh(&[
        "ip",
        "-n",
        &bed.ns_b,
        "neigh",
        "replace",
        &A_IP.to_string(),
        "lladdr",
        &a.mac.to_string(),
        "dev",
        &bed.veth_b,
    ]);
    sh(&[
        "ip",
        "-n",
        &bed.ns_b,
        "route",
        "add",
        &format!("{A_IP}/32"),
        "dev",
        &bed.veth_b,
    ]);
    let udp_b: UdpSocket = udp_in(&bed.ns_b, b_addr);

    let ev_a = connected(&mut pa);
    let c = a.expect(Op::Connected);
    assert_eq!(c.id, 11);
    assert_eq!(c.pdata, b"welcome");
    assert_eq!((c.ird, c.ord), (2, 1));
    assert_eq!(
        (c.local, c.remote),
        (SocketAddrV4::new(A_IP, 40000), b_addr)
    );
    assert_eq!(ev_a.role, Role::Active);
    assert_eq!((ev_a.dev, ev_a.qpn), (0, 5));
    assert_eq!(ev_a.remote, b_addr);
    assert_eq!(ev_a.mac, b.mac);
    assert_eq!(ev_a.pdata, b"hello");
    assert_eq!(ev_a.pkt, accept_pkt);
    assert_eq!((ev_a.ird, ev_a.ord), (4, 3));

    // The provider's part on A: the rebuild docs/connection.md prescribes.
    let mut conn_a =
        match trp::Connecting::new(cfg_of(&ev_a), ev_a.conn, ev_a.isn, &ev_a.pdata, now)
            .unwrap()
            .handle_datagram(now, &ev_a.pkt)
        {
            trp::ConnectOutcome::Established {
                conn, private_data, ..
            } => {
                assert_eq!(private_data, b"welcome");
                conn
            }
            o => panic!("rebuild on A: {o:?}"),
        };
    // The two rebuilt connections talk: a Send from A lands in B's receive.
    post_ping(&mut conn_a, &mut conn_b, &mut mem_a, &mem_b);
    exchange(&mut conn_a, &mut conn_b, &mut mem_a, &mut mem_b, now);
    let wc = conn_b.poll_completion().expect("B received");
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, trp::WcStatus::Success, 5)
    );
    assert_eq!(&mem_b.bytes[100..105], b"ping!");
    assert_eq!(
        conn_a.poll_completion().unwrap().status,
        trp::WcStatus::Success
    );

    let st = a.status();
    assert_eq!(
        find::<status::Connection>(&st, |c| c.qpn == 5).map(|c| c.role.as_str()),
        Some("active"),
        "{st:?}"
    );
    assert_eq!(count::<Connecting>(&st), 0, "{st:?}");

    // --- ARM: the next frame on A's flow wakes the process once.
    assert_eq!(pa.request(&Request::Arm).unwrap(), Response::Ok);
    assert!(pa.poll_events().unwrap().is_empty());
    udp_b
        .send_to(b"anything", SocketAddrV4::new(A_IP, 40000))
        .unwrap();
    assert_eq!(event(&mut pa), Event::Wake);
    udp_b
        .send_to(b"anything", SocketAddrV4::new(A_IP, 40000))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    pa.sync().unwrap();
    assert!(pa.poll_events().unwrap().is_empty(), "one wake per ARM");
    // Frames wait on the ring: ARM now wakes at once.
    assert_eq!(pa.request(&Request::Arm).unwrap(), Response::Ok);
    assert_eq!(event(&mut pa), Event::Wake);

    // --- DISCONNECT from B's kernel reaches B's process; its QPCLOSED closes.
    let mut d = Msg::new(Op::Disconnect);
    d.qpn = 9;
    b.send(d);
    assert_eq!(
        event(&mut pb),
        Event::Disconnect {
            dev: 0,
            qpn: 9,
            status: 0
        }
    );
    assert_eq!(
        pb.request(&Request::PeerClosed { dev: 0, qpn: 9 }).unwrap(),
        Response::Ok
    );
    let pc = b.expect(Op::PeerClosed);
    assert_eq!(pc.qpn, 9);
    assert_eq!(
        pb.request(&Request::QpClosed {
            dev: 0,
            qpn: 9,
            status: 0
        })
        .unwrap(),
        Response::Ok
    );
    let closed = b.expect(Op::Closed);
    assert_eq!((closed.qpn, closed.status), (9, 0));
    assert_eq!(count::<status::Connection>(&b.status()), 0);

    // --- Process death on A: Abort to the peer, CLOSED -ECONNRESET to the kernel.
    let aborts = |s: &Side| one::<Cm>(&s.status()).aborts_sent;
    assert_eq!(aborts(&a), 0);
    drop(pa);
    let closed = a.expect(Op::Closed);
    assert_eq!((closed.qpn, closed.status), (5, -104));
    assert_eq!(aborts(&a), 1);
    let st = a.status();
    assert_eq!(count::<status::Connection>(&st), 0, "{st:?}");
    assert_eq!(count::<Flow>(&st), 0, "{st:?}");

    // --- UNQP of a connected QP (active side) and death of the passive side's process.
    let mut pa3 = a.process(7);
    assert_eq!(
        pb.request(&Request::Qp { dev: 0, qpn: 10 }).unwrap(),
        Response::Ok
    );
    a.send(connect_msg(17, 7, 40010, b_addr, b.mac, b""));
    let ev_b = accept(&b, &mut pb, 10);
    let mut conn_b = trp::Incoming::parse(&ev_b.pkt)
        .unwrap()
        .accept(cfg_of(&ev_b), ev_b.conn, ev_b.isn, &ev_b.pdata)
        .unwrap();
    let n = conn_b.poll_transmit(now, &mem_b, &mut buf).unwrap();
    udp_b
        .send_to(&buf[..n], SocketAddrV4::new(A_IP, 40010))
        .unwrap();
    assert_eq!(connected(&mut pa3).qpn, 7);
    assert_eq!(a.expect(Op::Connected).id, 17);
    assert_eq!(
        pa3.request(&Request::Unqp {
            dev: 0,
            qpn: 7,
            linger: false
        })
        .unwrap(),
        Response::Ok
    );
    let closed = a.expect(Op::Closed);
    assert_eq!((closed.qpn, closed.status), (7, -104));
    assert_eq!(aborts(&a), 2);
    assert_eq!(count::<Qp>(&a.status()), 0);
    drop(pb);
    let closed = b.expect(Op::Closed);
    assert_eq!((closed.qpn, closed.status), (10, -104));
    assert_eq!(aborts(&b), 1);

    // --- Reject with private data.
    let _pa2 = a.process(6);
    listen(&b, 2, 7001);
    a.send(connect_msg(
        12,
        6,
        40001,
        SocketAddrV4::new(B_IP, 7001),
        b.mac,
        b"may I",
    ));
    let req = b.expect(Op::Request);
    assert_eq!(req.pdata, b"may I");
    let mut rej = Msg::new(Op::Reject);
    rej.req = req.req;
    rej.pdata = b"no".to_vec();
    b.send(rej);
    let f = a.expect(Op::ConnectFailed);
    assert_eq!((f.id, f.status, f.pdata.as_slice()), (12, -111, &b"no"[..]));
    assert_eq!(
        find::<status::Request>(&b.status(), |r| r.listener == 2).map(|r| r.state.clone()),
        Some("rejected".to_owned())
    );

    // --- No listener: urdmad B rejects, without private data, once its grace for a
    // listener has passed (cm::LISTEN_GRACE).
    a.send(connect_msg(
        13,
        6,
        40002,
        SocketAddrV4::new(B_IP, 7999),
        b.mac,
        b"",
    ));
    let f = a.expect(Op::ConnectFailed);
    assert_eq!((f.id, f.status, f.pdata.len()), (13, -111, 0));
    b.nothing(Duration::from_millis(300));

    // Two handshakes that time out, each after about a minute: they run at once, and the
    // loopback case between their starts and their ends.
    // --- Nobody there: the handshake times out.
    let t0 = Instant::now();
    a.send(connect_msg(
        14,
        6,
        40003,
        SocketAddrV4::new(Ipv4Addr::new(10, 98, 0, 77), 7000),
        Mac([2, 0, 0, 0, 0, 0x77]),
        b"",
    ));
    assert_eq!(
        find::<Connecting>(&a.status(), |c| c.id == 14).map(|c| c.remote.clone()),
        Some("10.98.0.77:7000".to_owned())
    );

    // --- Connect to a QP nobody owns on the passive side: ACCEPTED -ENOTCONN; A's handshake
    // then times out (nobody sends the Accept), and B's pending request is gone after it.
    a.send(connect_msg(15, 6, 40004, b_addr, b.mac, b""));
    let req = b.expect(Op::Request);
    let mut acc = Msg::new(Op::Accept);
    acc.req = req.req;
    acc.qpn = 99;
    b.send(acc);
    let r = b.expect(Op::Accepted);
    assert_eq!(r.status, -107);

    // --- Loopback: A connects to its own address; urdmad's frames to its own MAC are
    // received by urdmad A itself.
    listen(&a, 3, 7002);
    let mut m = connect_msg(16, 6, 40005, SocketAddrV4::new(A_IP, 7002), a.mac, b"self");
    m.local = SocketAddrV4::new(A_IP, 40005);
    a.send(m);
    let lreq = a.expect(Op::Request);
    assert_eq!((lreq.id, lreq.pdata.as_slice()), (3, &b"self"[..]));
    let mut rej = Msg::new(Op::Reject);
    rej.req = lreq.req;
    a.send(rej);
    let f = a.expect(Op::ConnectFailed);
    assert_eq!((f.id, f.status), (16, -111));
    assert!(one::<Port>(&a.status()).loopback != 0);

    // urdmad repeats a ConnectRequest for about a minute before it gives up: both fail with
    // -ETIMEDOUT.
    let end = Instant::now() + HANDSHAKE_GIVES_UP;
    let mut timed_out = Vec::new();
    while timed_out.len() < 2 {
        if let Some(m) = from_urdmad(&a.kernel, Duration::from_millis(500)) {
            if m.op == Op::ConnectFailed {
                assert_eq!(m.status, -110, "{m:?}");
                timed_out.push(m.id);
            }
        }
        assert!(
            Instant::now() < end,
            "CONNECT_FAILED for only {timed_out:?} of 14, 15"
        );
    }
    timed_out.sort_unstable();
    assert_eq!(timed_out, [14, 15]);
    // B's port is promiscuous: it saw 14's ConnectRequests, to another MAC, and left them.
    b.nothing(Duration::from_millis(100));
    assert!(t0.elapsed() > Duration::from_millis(500));
    let g = loop {
        let m = from_urdmad(&b.kernel, REQUEST_IDLE + 2 * WAIT).expect("REQUEST_GONE");
        if m.op == Op::RequestGone {
            break m;
        }
    };
    assert_eq!(g.req, req.req);

    // Each urdmad told its kernel its port's counters as they moved: B's port received the
    // frames A's port sent (ConnectRequests and data), and no frame was lost.
    let b_rx = one::<Port>(&b.status()).rx_packets;
    let counted = counters_until(&b.kernel, &b.tap, |v| v[stat::RX_FRAMES] >= b_rx);
    assert_eq!(counted.len(), stat::COUNT);
    assert_eq!(counted[stat::RX_DROPS], 0, "{counted:?}");
    let a_tx = one::<Port>(&a.status()).tx_packets;
    counters_until(&a.kernel, &a.tap, |v| {
        v[stat::TX_FRAMES] >= a_tx && a_tx > 0
    });
}

/// The main thread's voluntary context switches.
/// Processes that send no `QP` line: urdma.ko names each QP's owner in `CONNECT` and
/// `ACCEPT` (a process id in urdmad's namespace, here the test's own), and urdmad hands the
/// connection to the attached process with that id. An owner that is not attached fails
/// the connection as a QP of nobody's does.
#[test]
fn connections_go_to_the_processes_the_kernel_names() {
    let bed = Bed::new("own");
    let a = start_side(&bed, &bed.ns_a, &bed.veth_a, "a", false);
    let b = start_side(&bed, &bed.ns_b, &bed.veth_b, "b", false);
    let b_addr = SocketAddrV4::new(B_IP, 7000);
    let me = std::process::id();
    let mut pa = a.attached();
    let mut pb = b.attached();
    listen(&b, 1, 7000);
    let accept_as = |qpn: u32| {
        let req = b.expect(Op::Request);
        let mut acc = Msg::new(Op::Accept);
        acc.req = req.req;
        acc.qpn = qpn;
        acc.owner = me;
        b.send(acc);
    };

    let mut m = connect_msg(11, 5, 40000, b_addr, b.mac, b"");
    m.owner = me;
    a.send(m);
    accept_as(9);
    let ev_b = connected(&mut pb);
    assert_eq!((ev_b.qpn, ev_b.role), (9, Role::Passive));
    assert_eq!(b.expect(Op::Accepted).status, 0);
    let ev_a = connected(&mut pa);
    assert_eq!((ev_a.qpn, ev_a.role), (5, Role::Active));
    assert_eq!(a.expect(Op::Connected).id, 11);
    let st = a.status();
    assert_eq!(one::<Qp>(&st).qpn, 5, "{st:?}");

    // pid 1 is attached to no urdmad: A's QP 6 is nobody's.
    let mut m = connect_msg(12, 6, 40001, b_addr, b.mac, b"");
    m.owner = 1;
    a.send(m);
    accept_as(10);
    assert_eq!(connected(&mut pb).qpn, 10);
    assert_eq!(b.expect(Op::Accepted).status, 0);
    let f = a.expect(Op::ConnectFailed);
    assert_eq!((f.id, f.status), (12, -libc::ECONNRESET));
    assert!(
        a._daemon
            .log_text()
            .contains("the QP's process is not attached to urdmad"),
        "{}",
        a._daemon.log_text()
    );
}
