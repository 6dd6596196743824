//! Ports: which one a connection goes out on, a frame to a port's own MAC, and an idle
//! urdmad that sleeps yet answers at once.

use super::*;

fn wakeups(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn idle_urdmad_wakes_rarely_and_still_answers_at_once() {
    let bed = Bed::new("idl");
    // No cm_device: urdmad warns and runs without connection management.
    let d = bed.start();
    assert!(d.log_text().contains("without connection management"));
    assert_eq!(one::<Cm>(&d.status()).channel, "none");
    // The kernels' IPv6 chatter (on the TAP, from the peer) is traffic, which ends
    // idleness for a while.
    for ns in [&bed.ns_a, &bed.ns_b] {
        sh(&[
            "ip",
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
        ]);
    }
    let mut c = Connection::connect(&d.socket, WAIT).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let before = wakeups(d.pid());
    std::thread::sleep(Duration::from_secs(2));
    let n = (wakeups(d.pid()) - before) / 2;
    // idle_sleep_max_us = 4000: at most ~250 sleeps a second (was 10,000).
    eprintln!("idle: {n} wake-ups per second");
    assert!(n < 600, "{n} wake-ups per idle second");
    // A request ends the sleep at once.
    let t = Instant::now();
    c.sync().unwrap();
    assert!(t.elapsed() < Duration::from_millis(20), "{:?}", t.elapsed());
}

#[test]
fn a_frame_to_the_ports_own_mac_is_received_not_sent() {
    let bed = Bed::new("lo");
    let d = bed.start();
    let mut c = Connection::connect(&d.socket, WAIT).unwrap();
    let mac = match c.request(&Request::Attach).unwrap() {
        Response::Attached(a) => a.ports[0].mac,
        other => panic!("{other:?}"),
    };
    drop(c);
    let to = SocketAddrV4::new(LOCAL_IP, 6000);
    let mut rx = TestClient::spawn(&d.socket, &["--open", &to.to_string(), "--run-secs", "10"]);
    rx.wait_for("READY", WAIT);
    let mut tx = TestClient::spawn(
        &d.socket,
        &[
            "--send",
            &format!("{mac},{LOCAL_IP}:6001,{to},over-the-loop"),
        ],
    );
    tx.wait_for("SENT", WAIT);
    let line = rx.wait_for("RX ", WAIT);
    assert!(line.contains("payload=over-the-loop"), "{line}");
    assert!(line.contains(&format!("src={LOCAL_IP}:6001")), "{line}");
    assert_eq!(one::<Port>(&d.status()).loopback, 1);
}

#[test]
fn a_connect_goes_out_on_the_port_holding_its_local_address() {
    let bed = Bed::new("2pc");
    let (a2, b2, tap2) = (
        format!("{}2", bed.veth_a),
        format!("{}2", bed.veth_b),
        format!("{}2", bed.tap),
    );
    bed.add_veth_pair(&a2, &b2, "10.97.0.2/24");
    let cm = bed.dir.join("cm");
    let fake = FakeKernel::bind(&cm).unwrap();
    let text = format!(
        "{}\n[[port]]\nname = \"p1\"\ndevice = \"net_af_packet1,iface={a2}\"\nexception = {tap2:?}\n",
        bed.config(&format!("cm_device = {cm:?}"), None)
    );
    let d = bed.start_with(&bed.write_config("two.toml", &text));
    let kernel = fake.accept(WAIT).unwrap();
    for tap in [&bed.tap, &tap2] {
        let m = from_urdmad(&kernel, WAIT).unwrap();
        assert_eq!((m.op, &m.ifname), (Op::Register, tap));
    }
    sh(&[
        "ip",
        "-n",
        &bed.ns_a,
        "addr",
        "add",
        "10.97.0.1/24",
        "dev",
        &tap2,
    ]);
    let peer_mac: Mac = bed.link_mac(&bed.ns_b, &b2).parse().unwrap();
    // The peer is namespace B's kernel: a UDP socket speaking TRP's handshake.
    let peer = udp_in(&bed.ns_b, "10.97.0.2:7000".parse().unwrap());
    let mut m = Msg::new(Op::Connect);
    m.id = 21;
    m.qpn = 3;
    m.local = "10.97.0.1:41000".parse().unwrap();
    m.remote = "10.97.0.2:7000".parse().unwrap();
    m.remote_mac = peer_mac;
    m.pdata = b"port one?".to_vec();
    kernel.send(&m).unwrap();
    let (req, from) = drain(&peer, Duration::from_millis(500))
        .into_iter()
        .next()
        .expect("a ConnectRequest on the second port");
    assert_eq!(from.to_string(), "10.97.0.1:41000");
    let inc = trp::Incoming::parse(&req).unwrap();
    assert_eq!(inc.private_data(), b"port one?");
    assert_eq!(
        find::<Connecting>(&d.status(), |c| c.id == 21).map(|c| c.port.clone()),
        Some("p1".to_owned())
    );
    let mut buf = vec![0u8; 512];
    let n = inc.reject(b"via p1", &mut buf).unwrap();
    peer.send_to(&buf[..n], from).unwrap();
    let f = from_urdmad(&kernel, WAIT).expect("CONNECT_FAILED");
    assert_eq!(
        (f.op, f.id, f.status, f.pdata.as_slice()),
        (Op::ConnectFailed, 21, -111, &b"via p1"[..])
    );
}
