//! The direct path: each connection's own packet socket, moved past urdmad, and parked by
//! its process for the next one.

use super::*;

/// Waits until the `daemon` status record of `s` is as `what` says (`ok`).
fn status_reaches(s: &Side, what: &str, ok: impl Fn(&Daemon) -> bool) {
    let end = Instant::now() + WAIT;
    loop {
        let st = s.status();
        if ok(one::<Daemon>(&st)) {
            return;
        }
        assert!(Instant::now() < end, "not {what}: {st:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection's socket on the direct path, driven as the provider drives it.
struct DirectEnd {
    rings: urdmad::direct::Rings,
    ep: urdmad::frame::Endpoints,
}

impl DirectEnd {
    /// The socket that came with `ev` on `c`, mapped; `local_mac` is the port's.
    fn of(c: &mut Connection, ev: &Connected, local_mac: Mac) -> DirectEnd {
        assert!(ev.direct > 0, "connection not on the direct path: {ev:?}");
        let sock = c
            .take_fds(ev.dev, ev.qpn)
            .and_then(|f| f.socket)
            .expect("the connection's socket with its event");
        let geo = urdmad::direct::Geometry::new(ev.datagram, ev.direct);
        DirectEnd {
            rings: urdmad::direct::Rings::map(sock, geo).expect("mapping its rings"),
            ep: urdmad::frame::Endpoints {
                local_mac: local_mac.0,
                remote_mac: ev.mac.0,
                local: ev.local,
                remote: ev.remote,
            },
        }
    }

    /// Sends `payload` to `to` (the connection's peer unless said otherwise).
    fn send_to(&mut self, payload: &[u8], to: SocketAddrV4) {
        let ep = urdmad::frame::Endpoints {
            remote: to,
            ..self.ep
        };
        let buf = self.rings.tx_slot().expect("a free transmit slot");
        let h = urdmad::frame::HEADERS;
        buf[h..h + payload.len()].copy_from_slice(payload);
        let n = urdmad::frame::write_headers(buf, &ep, payload.len());
        self.rings.tx_commit(n);
        self.rings.kick().unwrap();
    }

    fn send(&mut self, payload: &[u8]) {
        self.send_to(payload, self.ep.remote);
    }

    /// The datagrams that arrive within `wait` (returns as soon as some did).
    fn recv(&mut self, wait: Duration) -> Vec<Vec<u8>> {
        let end = Instant::now() + wait;
        loop {
            let mut out = Vec::new();
            let mut i = 0;
            while let Some(f) = self.rings.received(i) {
                out.push(
                    urdmad::frame::payload(f, &self.ep)
                        .expect("only the connection's frames, checksums right")
                        .to_vec(),
                );
                i += 1;
            }
            self.rings.release(i);
            if !out.is_empty() || Instant::now() >= end {
                return out;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn port_rx(s: &Side) -> u64 {
    one::<Port>(&s.status()).rx_packets
}

/// Waits until urdmad's port has received more than `before` frames (`what` came).
fn port_rx_grows(s: &Side, before: u64, what: &str) {
    let end = Instant::now() + WAIT;
    while port_rx(s) == before {
        assert!(Instant::now() < end, "urdmad did not receive {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connections_on_the_direct_path_move_their_frames_past_urdmad() {
    let bed = Bed::new("dp");
    let a = start_side(&bed, &bed.ns_a, &bed.veth_a, "a", true);
    let b = start_side(&bed, &bed.ns_b, &bed.veth_b, "b", true);
    let b_addr = SocketAddrV4::new(B_IP, 7000);
    assert!(one::<Port>(&b.status()).direct);

    let mut pa = a.process(5);
    let mut pb = b.process(9);
    listen(&b, 1, 7000);
    a.send(connect_msg(11, 5, 40000, b_addr, b.mac, b"hello"));
    let ev_b = accept(&b, &mut pb, 9);
    let mut db = DirectEnd::of(&mut pb, &ev_b, b.mac);
    let st = b.status();
    assert_eq!(one::<Flow>(&st).path, "direct", "{st:?}");
    assert_eq!(one::<Port>(&st).direct_flows, Some(1), "{st:?}");
    // From the first connection on, B's urdmad keeps sockets like its one ready (the
    // configuration's default `direct_ready`), rings set, so that the next connection
    // need not wait for the kernel to set them up.
    status_reaches(&b, "sockets_ready=4", |d| d.sockets_ready == Some(4));
    // The first found none ready: the keeper makes sockets of a geometry once asked.
    assert_eq!(one::<Daemon>(&st).sockets_missed, Some(1), "{st:?}");

    // The process cannot widen what its socket receives.
    let zero: libc::c_int = 0;
    // SAFETY: a setsockopt on a descriptor we own, with a valid int.
    let r = unsafe {
        libc::setsockopt(
            db.rings.fd(),
            libc::SOL_SOCKET,
            libc::SO_DETACH_FILTER,
            (&zero as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        (r, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EPERM)),
        "the connection's filter is locked"
    );

    // B's process sends its Accept itself; A's urdmad finishes the handshake and hands A's
    // process its own socket too.
    let now = trp::Instant::from_nanos(1);
    let mut conn_b = trp::Incoming::parse(&ev_b.pkt)
        .unwrap()
        .accept(cfg_of(&ev_b), ev_b.conn, ev_b.isn, &ev_b.pdata)
        .unwrap();
    let (mut mem_a, mut mem_b) = (memory(), memory());
    let mut buf = vec![0u8; 2048];
    let n = conn_b.poll_transmit(now, &mem_b, &mut buf).unwrap();
    db.send(&buf[..n]);
    let ev_a = connected(&mut pa);
    assert_eq!(a.expect(Op::Connected).id, 11);
    let mut da = DirectEnd::of(&mut pa, &ev_a, a.mac);
    // Each side's urdmad gave urdma.ko the connection's socket for its bell.
    let bells = BELLS.lock().unwrap().clone();
    for ev in [&ev_a, &ev_b] {
        assert!(
            bells.contains(&(ev.dev, ev.qpn)),
            "no bell for {ev:?}: {bells:?}"
        );
    }
    let mut conn_a =
        match trp::Connecting::new(cfg_of(&ev_a), ev_a.conn, ev_a.isn, &ev_a.pdata, now)
            .unwrap()
            .handle_datagram(now, &ev_a.pkt)
        {
            trp::ConnectOutcome::Established { conn, .. } => conn,
            o => panic!("rebuild on A: {o:?}"),
        };

    // A Send from A to B, every datagram through the two sockets, none through urdmad.
    // (urdmad may have passed on a handshake packet the requester repeated while a slow
    // host kept the Accept waiting: that is the design, and not what is counted here.)
    let via = |s: &Side| {
        let st = s.status();
        find::<Flow>(&st, |f| f.path == "direct").map(|f| f.via_urdmad)
    };
    let via_before = [via(&a), via(&b)];
    let rx_b = port_rx(&b);
    post_ping(&mut conn_a, &mut conn_b, &mut mem_a, &mem_b);
    let end = Instant::now() + WAIT;
    let (mut done_a, mut done_b) = (None, None);
    while done_a.is_none() || done_b.is_none() {
        assert!(
            Instant::now() < end,
            "the Send did not complete over the sockets"
        );
        while let Some(n) = conn_a.poll_transmit(now, &mem_a, &mut buf) {
            da.send(&buf[..n]);
        }
        for d in db.recv(Duration::from_millis(20)) {
            conn_b.handle_datagram(now, &mut mem_b, &d).unwrap();
        }
        // Nobody replies, and the clock stands still: acknowledge at once.
        conn_b.release_held_ack();
        while let Some(n) = conn_b.poll_transmit(now, &mem_b, &mut buf) {
            db.send(&buf[..n]);
        }
        for d in da.recv(Duration::from_millis(20)) {
            conn_a.handle_datagram(now, &mut mem_a, &d).unwrap();
        }
        conn_a.release_held_ack();
        done_a = done_a.or(conn_a.poll_completion());
        done_b = done_b.or(conn_b.poll_completion());
    }
    let wc = done_b.unwrap();
    assert_eq!((wc.wr_id, wc.status), (7, trp::WcStatus::Success));
    assert_eq!(&mem_b.bytes[100..105], b"ping!");
    assert_eq!(done_a.unwrap().status, trp::WcStatus::Success);
    for ((s, side), before) in [(&a, "A"), (&b, "B")].into_iter().zip(via_before) {
        let st = s.status();
        let flow = find::<Flow>(&st, |f| f.path == "direct")
            .unwrap_or_else(|| panic!("no direct flow on {side}: {st:?}"));
        assert!(
            flow.rx_packets >= 1,
            "{side}'s flow counts what its socket received: {st:?}"
        );
        assert_eq!(
            Some(flow.via_urdmad),
            before,
            "urdmad {side} forwarded none of the Send's frames: {st:?}"
        );
    }

    // Another port of B's address is not the connection's: urdmad takes it, the socket
    // does not.
    da.send_to(b"stray", SocketAddrV4::new(B_IP, 7001));
    assert!(db.recv(Duration::from_millis(300)).is_empty());
    port_rx_grows(&b, rx_b, "the stray frame");

    // Once B's connection is closed, urdmad takes its address again.
    assert_eq!(
        pb.request(&Request::QpClosed {
            dev: 0,
            qpn: 9,
            status: 0
        })
        .unwrap(),
        Response::Ok
    );
    assert_eq!(b.expect(Op::PeerClosed).qpn, 9);
    assert_eq!(b.expect(Op::Closed).status, 0);
    let st = b.status();
    assert_eq!(count::<Flow>(&st), 0, "{st:?}");
    assert_eq!(one::<Port>(&st).direct_flows, Some(0), "{st:?}");
    // The process gives its socket back, on its quiet socket, and closes its copy; urdmad
    // closes its own copies on its keeper's thread a while later.
    pb.open_quiet().unwrap();
    pb.post_all_giving_back(
        &[],
        vec![db.rings.into_socket()],
        &[],
        urdmad::client::Urgency::Later,
    )
    .unwrap();
    pb.sync().unwrap();
    assert!(pb.take_refusals().is_empty());
    status_reaches(&b, "sockets_closing=0", |d| d.sockets_closing == Some(0));
    // What comes without a socket, or with something else, is refused.
    assert!(matches!(
        pb.request(&Request::GiveBack).unwrap(),
        Response::Error {
            code: urdmad::proto::ErrorCode::Invalid,
            ..
        }
    ));
    let (other, _keep) = std::os::unix::net::UnixStream::pair().unwrap();
    pb.give_back(other.into()).unwrap();
    pb.sync().unwrap();
    let refused = pb.take_refusals();
    assert!(
        matches!(&refused[..], [r] if r.contains("not a packet socket")),
        "{refused:?}"
    );
    let before = port_rx(&b);
    da.send(b"late");
    port_rx_grows(&b, before, "the closed connection's frame");
}

/// A direct connection from A (QP `qa`, local port `local`) to B's listener at `b_addr`,
/// accepted by B's process `pb` for its QP `qb`: both processes' events.
fn connect_direct(
    (a, pa, qa, local): (&Side, &mut Connection, u32, u16),
    (b, pb, qb): (&Side, &mut Connection, u32),
    b_addr: SocketAddrV4,
) -> (Connected, Connected) {
    a.send(connect_msg(u64::from(qa), qa, local, b_addr, b.mac, b""));
    let ev_b = accept(b, pb, qb);
    let ev_a = connected(pa);
    assert_eq!(a.expect(Op::Connected).id, u64::from(qa));
    assert!(ev_a.direct > 0 && ev_b.direct > 0, "{ev_a:?} {ev_b:?}");
    (ev_a, ev_b)
}

/// B's process `pb` has its QP `qb`'s connection end.
fn close_b(b: &Side, pb: &mut Connection, qb: u32) {
    let closed = Request::QpClosed {
        dev: 0,
        qpn: qb,
        status: 0,
    };
    assert_eq!(pb.request(&closed).unwrap(), Response::Ok);
    assert_eq!(b.expect(Op::PeerClosed).qpn, qb);
    assert_eq!(b.expect(Op::Closed).status, 0);
}

#[test]
fn a_process_parks_its_direct_socket_for_its_next_connection_and_no_other_gets_it() {
    let bed = Bed::new("pk");
    let a = start_side(&bed, &bed.ns_a, &bed.veth_a, "a", true);
    let b = start_side(&bed, &bed.ns_b, &bed.veth_b, "b", true);
    let b_addr = SocketAddrV4::new(B_IP, 7000);
    let mut pa = a.process(5);
    for qpn in [6, 7, 8] {
        let r = pa.request(&Request::Qp { dev: 0, qpn }).unwrap();
        assert_eq!(r, Response::Ok);
    }
    let mut pb = b.process(9);
    listen(&b, 1, 7000);

    // The first connection gets a new socket, which its process may park.
    let (_, ev_b) = connect_direct((&a, &mut pa, 5, 40000), (&b, &mut pb, 9), b_addr);
    assert!(ev_b.park && ev_b.reuse == 0, "{ev_b:?}");
    let mut db = DirectEnd::of(&mut pb, &ev_b, b.mac);
    let cookie = urdmad::direct::socket_cookie(db.rings.fd()).unwrap();
    close_b(&b, &mut pb, 9);
    pb.post(&Request::Park { cookie }).unwrap();
    pb.sync().unwrap();
    assert!(pb.take_refusals().is_empty());
    status_reaches(&b, "sockets_parked=1", |d| d.sockets_parked == 1);

    // QP 9's connection is closed (`QPCLOSED`, after which urdma.ko watches the socket for
    // it no more): B's next connection takes the parked socket, no socket comes with its
    // event, and the socket's filter admits the new connection's frames.
    assert_eq!(
        pb.request(&Request::Qp { dev: 0, qpn: 11 }).unwrap(),
        Response::Ok
    );
    let (ev_a, ev_b) = connect_direct((&a, &mut pa, 7, 40002), (&b, &mut pb, 11), b_addr);
    assert!(ev_b.park && ev_b.reuse == cookie, "{ev_b:?}");
    let fds = pb.take_fds(0, 11).expect("the bell's word");
    assert!(fds.socket.is_none() && fds.bell.is_some(), "{fds:?}");
    assert!(BELLS.lock().unwrap().contains(&(0, 11)));
    let st = b.status();
    assert_eq!(one::<Daemon>(&st).sockets_reused, 1, "{st:?}");
    assert_eq!(one::<Daemon>(&st).sockets_parked, 0, "{st:?}");
    assert_eq!(one::<Port>(&st).direct_flows, Some(1), "{st:?}");
    db.ep.remote = ev_b.remote;
    let mut da = DirectEnd::of(&mut pa, &ev_a, a.mac);
    da.send(b"third");
    let end = Instant::now() + WAIT;
    while !db
        .recv(Duration::from_millis(100))
        .contains(&b"third".to_vec())
    {
        assert!(
            Instant::now() < end,
            "the parked socket's new connection got nothing"
        );
    }
    db.send(b"back");
    assert!(da.recv(WAIT).contains(&b"back".to_vec()));

    // Parked again, it is not another process's: that one gets a new socket, and cannot
    // park what is not its own.
    close_b(&b, &mut pb, 11);
    pb.post(&Request::Park { cookie }).unwrap();
    assert_eq!(
        pb.request(&Request::Unqp {
            dev: 0,
            qpn: 11,
            linger: false
        })
        .unwrap(),
        Response::Ok
    );
    let mut pc = b.process(12);
    let (_, ev) = connect_direct((&a, &mut pa, 8, 40003), (&b, &mut pc, 12), b_addr);
    assert_eq!(ev.reuse, 0, "{ev:?}");
    assert!(matches!(
        pc.request(&Request::Park { cookie }).unwrap(),
        Response::Error {
            code: urdmad::proto::ErrorCode::NotFound,
            ..
        }
    ));
    status_reaches(&b, "sockets_parked=1", |d| d.sockets_parked == 1);
    // A process that goes takes its parked sockets with it.
    drop(pb);
    status_reaches(&b, "sockets_parked=0", |d| d.sockets_parked == 0);
}
