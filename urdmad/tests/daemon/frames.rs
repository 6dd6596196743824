//! Frames: the exception path, flows and their rings, transmission, two ports, and an
//! idle urdmad woken by the wire or a doorbell.

use super::*;

#[test]
fn ping_crosses_the_exception_path() {
    let bed = Bed::new("pg");
    let d = bed.start();
    let out = ping(&bed.ns_b, 3, &LOCAL_IP.to_string());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ping failed: {text}");
    assert!(text.contains("3 received"), "{text}");
    assert!(!text.contains("DUP!"), "duplicate replies: {text}");
    let st = d.status();
    let e = one::<Exception>(&st);
    assert!(e.to_kernel >= 4 && e.from_kernel >= 4, "{st:?}");
}

#[test]
fn flows_get_their_packets_the_kernel_the_rest_and_secondaries_transmit() {
    let bed = Bed::new("fl");
    let d = bed.start();
    // Kernel sockets in A on a flow's port (must stay empty) and on an unknown port.
    let kernel_flow_port = udp_in(&bed.ns_a, addr(5001));
    let kernel_other = udp_in(&bed.ns_a, addr(7000));
    let peer = udp_in(&bed.ns_b, SocketAddrV4::new(PEER_IP, 6000));
    let send = format!(
        "{},{}:5001,{PEER_IP}:6000,from-secondary",
        bed.peer_mac(),
        LOCAL_IP
    );
    let mut c = TestClient::spawn(
        &bed.socket(),
        &[
            "--open",
            "10.99.0.1:5001",
            "--open",
            "10.99.0.1:5002",
            "--send",
            &send,
            "--run-secs",
            "8",
        ],
    );
    let f1 = c.wait_for("OPENED", Duration::from_secs(20));
    let f2 = c.wait_for("OPENED", Duration::from_secs(5));
    c.wait_for("READY", Duration::from_secs(5));
    let id = |l: &str| l.split_whitespace().nth(1).unwrap().to_owned();
    let (f1, f2) = (id(&f1), id(&f2));

    send_from_peer(
        &bed,
        vec![
            (5001, b"one-a".to_vec()),
            (5002, b"two-a".to_vec()),
            (7000, b"kernel".to_vec()),
            (5001, b"one-b".to_vec()),
            (5002, b"two-b".to_vec()),
        ],
    );
    let got = drain(&peer, Duration::from_secs(1));
    let rx: Vec<String> = c
        .collect(Duration::from_millis(800))
        .iter()
        .filter(|l| l.starts_with("RX "))
        .cloned()
        .collect();
    let expect = |flow: &str, port: u16, payload: &str| {
        rx.iter().any(|l| {
            l.starts_with(&format!("RX {flow} dst={LOCAL_IP}:{port} "))
                && l.ends_with(&format!("payload={payload}"))
        })
    };
    assert!(
        expect(&f1, 5001, "one-a") && expect(&f1, 5001, "one-b"),
        "{rx:?}"
    );
    assert!(
        expect(&f2, 5002, "two-a") && expect(&f2, 5002, "two-b"),
        "{rx:?}"
    );
    assert_eq!(
        rx.len(),
        4,
        "datagrams on the wrong ring or duplicated: {rx:?}"
    );

    let kernel = drain(&kernel_other, Duration::from_millis(300));
    assert_eq!(
        kernel.len(),
        1,
        "unknown port must reach the kernel once: {kernel:?}"
    );
    assert_eq!(kernel[0].0, b"kernel");
    assert!(
        drain(&kernel_flow_port, Duration::from_millis(300)).is_empty(),
        "flow traffic leaked to the kernel"
    );

    assert_eq!(
        got.len(),
        1,
        "the secondary's frame must reach the peer once: {got:?}"
    );
    assert_eq!(got[0].0, b"from-secondary");
    assert_eq!(got[0].1, std::net::SocketAddr::V4(addr(5001)));

    let st = d.status();
    assert_eq!(one::<Process>(&st).tx_packets, 1, "{st:?}");
    let f1: u32 = f1[5..].parse().unwrap();
    assert_eq!(
        find::<Flow>(&st, |f| f.id == f1).map(|f| f.rx_packets),
        Some(2),
        "{st:?}"
    );
    assert!(c.wait(Duration::from_secs(15)).success());
}

#[test]
fn a_full_flow_ring_drops_and_counts_and_its_mbufs_come_back() {
    let bed = Bed::new("rf");
    let d = bed.start();
    let before = warm_baseline(&bed, &d);
    let mut c = TestClient::spawn(
        &bed.socket(),
        &["--open", "10.99.0.1:5001", "--hold", "--run-secs", "20"],
    );
    c.wait_for("READY", Duration::from_secs(20));
    // The bed's rings have 256 slots, of which an rte_ring uses 255.
    let datagrams: Vec<(u16, Vec<u8>)> = (0..300u32)
        .map(|i| (5001, i.to_be_bytes().to_vec()))
        .collect();
    in_netns(&bed.ns_b, move || {
        let s = std::net::UdpSocket::bind(SocketAddrV4::new(PEER_IP, 0)).unwrap();
        for (port, payload) in datagrams {
            s.send_to(&payload, addr(port)).unwrap();
            // Paced so that af_packet's own receive ring does not overflow first.
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let st = d.status();
    let flow = one::<Flow>(&st);
    assert_eq!(flow.queued, 255, "{st:?}");
    assert_eq!(flow.rx_packets, 255, "{st:?}");
    assert_eq!(flow.drops, 300 - 255, "{st:?}");
    let in_use = one::<Pool>(&st).in_use;
    let in_use_before = 2047 - before.0;
    assert!(
        in_use >= in_use_before + 255,
        "ring holds pool mbufs: {st:?}"
    );

    // The process dies with a full ring: every one of those mbufs goes back to the pool.
    kill_and_await_baseline(&d, c, &before, Duration::from_secs(2));
}

#[test]
fn two_ports_each_with_its_exception_path_flows_and_tx() {
    let bed = Bed::new("2p");
    // A second veth pair between the same namespaces, on another subnet.
    let (a2, b2, tap2) = (
        format!("{}2", bed.veth_a),
        format!("{}2", bed.veth_b),
        format!("{}2", bed.tap),
    );
    bed.add_veth_pair(&a2, &b2, "10.98.0.2/24");
    let text = format!(
        "{}\n[[port]]\nname = \"p1\"\ndevice = \"net_af_packet1,iface={a2}\"\nexception = {tap2:?}\n",
        bed.config("", None)
    );
    let cfg = bed.write_config("two.toml", &text);
    let d = bed.start_with(&cfg);
    sh(&[
        "ip",
        "-n",
        &bed.ns_a,
        "addr",
        "add",
        "10.98.0.1/24",
        "dev",
        &tap2,
    ]);
    for target in [LOCAL_IP.to_string(), "10.98.0.1".to_string()] {
        let out = ping(&bed.ns_b, 1, &target);
        assert!(
            out.status.success(),
            "ping {target}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let st = d.status();
    assert_eq!(count::<Port>(&st), 2, "{st:?}");
    assert_eq!(count::<Exception>(&st), 2, "{st:?}");

    // A flow on the second port, and a frame sent through it.
    let peer_mac = bed.link_mac(&bed.ns_b, &b2);
    let peer = udp_in(&bed.ns_b, "10.98.0.2:6000".parse().unwrap());
    let send = format!("{peer_mac},10.98.0.1:5001,10.98.0.2:6000,via-port-1");
    let mut c = TestClient::spawn(
        &bed.socket(),
        &[
            "--port",
            "1",
            "--open",
            "10.98.0.1:5001",
            "--send",
            &send,
            "--run-secs",
            "5",
        ],
    );
    c.wait_for("READY", Duration::from_secs(20));
    in_netns(&bed.ns_b, || {
        let s = std::net::UdpSocket::bind("10.98.0.2:0").unwrap();
        s.send_to(b"on-port-1", "10.98.0.1:5001").unwrap();
    });
    let l = c.wait_for("RX ", Duration::from_secs(5));
    assert!(l.ends_with("payload=on-port-1"), "{l}");
    let got = drain(&peer, Duration::from_millis(500));
    assert_eq!(got.len(), 1, "{got:?} {:?} {:?}", d.status(), c.seen);
    assert_eq!(got[0].0, b"via-port-1");
    let st = d.status();
    let from_processes =
        |name: &str| find::<Port>(&st, |p| p.name == name).map(|p| p.from_processes);
    assert_eq!(from_processes("p1"), Some(1), "{st:?}");
    assert_eq!(from_processes("p0"), Some(0), "{st:?}");
    assert!(c.wait(Duration::from_secs(15)).success());
}

/// An idle urdmad on an af_packet port sleeps `idle_sleep_max_us` at once (here 10 s), and
/// yet frames cross it at once both ways: its port's socket ends the sleep for a frame from
/// the wire, the doorbell for a frame a process put on its TX ring. Three crossings each
/// way, each after long enough for urdmad to be asleep again, each well under a second
/// (a frame that waited for the timer would take seconds).
#[test]
fn an_idle_urdmad_wakes_for_a_frame_from_the_wire_and_for_a_process_doorbell() {
    let bed = Bed::new("wk");
    let cfg = bed.write_config(
        "urdmad.toml",
        &bed.config("idle_sleep_max_us = 10000000", None),
    );
    let d = bed.start_with(&cfg);
    // The kernels' IPv6 chatter would wake urdmad too.
    for ns in [&bed.ns_a, &bed.ns_b] {
        for key in ["all", "default"] {
            let kv = format!("net.ipv6.conf.{key}.disable_ipv6=1");
            sh(&["ip", "netns", "exec", ns, "sysctl", "-qw", &kv]);
        }
    }
    let st = d.status();
    assert!(one::<Daemon>(&st).frames_wake, "{st:?}");
    let quick = Duration::from_millis(900);
    let asleep = Duration::from_millis(1500);

    let mut rx = TestClient::spawn(
        &bed.socket(),
        &["--open", "10.99.0.1:5001", "--run-secs", "60"],
    );
    rx.wait_for("READY", Duration::from_secs(20));
    for i in 0..3 {
        std::thread::sleep(asleep);
        let t = Instant::now();
        send_from_peer(&bed, vec![(5001, format!("wire-{i}").into_bytes())]);
        let line = rx.wait_for("RX ", Duration::from_secs(15));
        let took = t.elapsed();
        assert!(line.ends_with(&format!("payload=wire-{i}")), "{line}");
        assert!(
            took < quick,
            "a frame from the wire waited {took:?} in an idle urdmad"
        );
    }

    let peer = udp_in(&bed.ns_b, SocketAddrV4::new(PEER_IP, 6000));
    let sends: Vec<String> = (0..3)
        .map(|i| format!("{},{LOCAL_IP}:5002,{PEER_IP}:6000,bell-{i}", bed.peer_mac()))
        .collect();
    let mut args = vec!["--send-every-ms", "1500", "--run-secs", "1"];
    for s in &sends {
        args.extend(["--send", s.as_str()]);
    }
    let mut tx = TestClient::spawn(&bed.socket(), &args);
    let mut buf = [0u8; 64];
    for i in 0..3 {
        tx.wait_for("SENT", Duration::from_secs(20));
        let t = Instant::now();
        let got = loop {
            match peer.recv_from(&mut buf) {
                Ok((n, _)) => break Some(buf[..n].to_vec()),
                Err(_) if t.elapsed() < Duration::from_secs(15) => continue,
                Err(_) => break None,
            }
        };
        let took = t.elapsed();
        assert_eq!(got.as_deref(), Some(format!("bell-{i}").as_bytes()));
        assert!(
            took < quick,
            "a process's frame waited {took:?} in an idle urdmad"
        );
    }
    assert!(tx.wait(Duration::from_secs(20)).success());
    let st = d.status();
    assert_eq!(one::<Daemon>(&st).spurious_wakes, 0, "{st:?}");
}
