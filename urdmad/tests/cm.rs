//! Connection management without urdma.ko: two urdmads in two namespaces joined by a veth
//! pair, each with a fake kernel (a `SOCK_SEQPACKET` socket at its `cm_device`) and a test
//! process registered as the owner of a QP. The test plays the kernel's part of
//! docs/connection.md and checks urdmad's.

mod common;

use common::*;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use urdmad::client::Connection;
use urdmad::cm_channel::{stat, Channel, FakeKernel, Msg, Op};
use urdmad::proto::{Connected, Event, Mac, Request, Response, Role};
use urdmad::status::{Cm, Connecting, Daemon, Flow, Listener, Port, Qp};

/// Addresses the CM messages use; no kernel owns them, so only urdmad answers.
const A_IP: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 2);
const WAIT: Duration = Duration::from_secs(5);
/// Longer than urdmad's handshake repeats (about a minute) plus the forgetting of a request.
const HANDSHAKE_GIVES_UP: Duration = Duration::from_secs(80);
/// How long urdmad keeps a pending request whose requester has gone quiet (`REQUEST_IDLE`,
/// daemon/cm.rs).
const REQUEST_IDLE: Duration = Duration::from_secs(15);

/// The next message urdmad sends the kernel within `wait`, but for port counters
/// (`Op::Stats`, sent whenever they change), which go to `counters` by interface, and bells
/// (`Op::Bell`, one per connection on the direct path), which go to `BELLS`.
fn from_urdmad(kernel: &Channel, wait: Duration) -> Option<Msg> {
    let end = Instant::now() + wait;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let m = kernel.recv_timeout(left).unwrap()?;
        if m.op == Op::Bell {
            BELLS.lock().unwrap().push((m.dev, m.qpn));
            continue;
        }
        if m.op != Op::Stats {
            return Some(m);
        }
        let values = m
            .pdata
            .chunks_exact(8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        COUNTERS.lock().unwrap().insert(m.ifname, values);
    }
}

/// The connections (dev, qpn) urdmad gave a bell.
static BELLS: std::sync::Mutex<Vec<(u32, u32)>> = std::sync::Mutex::new(Vec::new());

/// The last port counters urdmad sent for each interface.
static COUNTERS: std::sync::Mutex<std::collections::BTreeMap<String, Vec<u64>>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Waits (bounded) until urdmad has sent counters for `iface` that satisfy `ok`.
fn counters_until(kernel: &Channel, iface: &str, ok: impl Fn(&[u64]) -> bool) -> Vec<u64> {
    let end = Instant::now() + 3 * WAIT;
    loop {
        if let Some(v) = COUNTERS.lock().unwrap().get(iface).filter(|v| ok(v)) {
            return v.clone();
        }
        assert!(
            Instant::now() < end,
            "no such counters for {iface}: {:?}",
            COUNTERS.lock().unwrap().get(iface)
        );
        if let Some(m) = from_urdmad(kernel, Duration::from_millis(200)) {
            panic!("unexpected {m:?} while waiting for counters");
        }
    }
}

struct Side {
    _daemon: Urdmad,
    kernel: Channel,
    _fake: FakeKernel,
    socket: PathBuf,
    tap: String,
    mac: Mac,
}

impl Side {
    /// A greeted, attached process that has said nothing of its QPs.
    fn attached(&self) -> Connection {
        let mut c = Connection::connect(&self.socket, WAIT).expect("connect");
        assert!(matches!(
            c.request(&Request::Attach).unwrap(),
            Response::Attached(_)
        ));
        c
    }

    /// A greeted, attached process owning QP `qpn` of device 0.
    fn process(&self, qpn: u32) -> Connection {
        let mut c = self.attached();
        assert_eq!(
            c.request(&Request::Qp { dev: 0, qpn }).unwrap(),
            Response::Ok
        );
        c
    }

    fn expect(&self, op: Op) -> Msg {
        let m = from_urdmad(&self.kernel, WAIT)
            .unwrap_or_else(|| panic!("no {op:?} from urdmad within {WAIT:?}"));
        assert_eq!(m.op, op, "expected {op:?}, got {m:?}");
        m
    }

    fn nothing(&self, wait: Duration) {
        if let Some(m) = from_urdmad(&self.kernel, wait) {
            panic!("unexpected message {m:?}");
        }
    }

    fn send(&self, m: Msg) {
        self.kernel.send(&m).unwrap();
    }

    fn status(&self) -> Vec<Record> {
        status_of(&self.socket, WAIT).unwrap()
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- urdmad log {}:\n{}", self.tap, self._daemon.log_text());
        }
    }
}

/// Starts urdmad in `ns` on `iface` with a fake kernel; waits for its REGISTER. With
/// `direct` false the port's connections stay on urdmad's flow rings (the tests of ARM and
/// of what urdmad forwards need that).
fn start_side(bed: &Bed, ns: &str, iface: &str, tag: &str, direct: bool) -> Side {
    start_side_kernel(bed, ns, iface, tag, direct, false)
}

/// [`start_side`]; with `kernel_late` the fake kernel's channel appears only once urdmad
/// serves without it, as when urdma.ko is loaded after urdmad started.
fn start_side_kernel(
    bed: &Bed,
    ns: &str,
    iface: &str,
    tag: &str,
    direct: bool,
    kernel_late: bool,
) -> Side {
    let socket = bed.dir.join(format!("urdmad-{tag}.sock"));
    let cm = bed.dir.join(format!("cm-{tag}"));
    let tap = format!("{}{tag}", bed.tap);
    let early = (!kernel_late).then(|| FakeKernel::bind(&cm).unwrap());
    let cfg = format!(
        "[daemon]\nsocket = {socket:?}\ngroup = \"\"\nfile_prefix = \"{}{tag}\"\nmemory_mb = 48\nmbufs = 2047\nring_size = 256\nlog_level = \"debug\"\ncm_device = {cm:?}\n\
         [[port]]\nname = \"p0\"\ndevice = \"net_af_packet0,iface={iface}\"\nexception = {tap:?}\nsteering = \"software\"\ndirect = {direct}\n",
        bed.prefix
    );
    let path = bed.write_config(&format!("urdmad-{tag}.toml"), &cfg);
    let log = bed.dir.join(format!("urdmad-{tag}.log"));
    let child = Command::new("ip")
        .args(["netns", "exec", ns, URDMAD, "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let daemon = Urdmad {
        child: Some(child),
        socket: socket.clone(),
        log,
    };
    let serving = || {
        let end = Instant::now() + START_LIMIT;
        while daemon.try_status().is_err() {
            assert!(
                Instant::now() < end,
                "urdmad {tag} not serving: {}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let fake = match early {
        Some(f) => f,
        None => {
            serving();
            assert_eq!(one::<Cm>(&daemon.status()).channel, "none");
            FakeKernel::bind(&cm).unwrap()
        }
    };
    let kernel = fake.accept(START_LIMIT).unwrap_or_else(|e| {
        panic!(
            "urdmad {tag} did not open its cm channel: {e}: {}",
            daemon.log_text()
        )
    });
    serving();
    let mut side = Side {
        _daemon: daemon,
        kernel,
        _fake: fake,
        socket,
        tap,
        mac: Mac::default(),
    };
    let reg = side.expect(Op::Register);
    assert_eq!(reg.ifname, side.tap);
    assert_eq!(Path::new(&reg.socket_path), side.socket.as_path());
    let mut c = Connection::connect(&side.socket, WAIT).unwrap();
    match c.request(&Request::Attach).unwrap() {
        Response::Attached(a) => side.mac = a.ports[0].mac,
        other => panic!("{other:?}"),
    }
    side
}

fn listen(side: &Side, id: u64, port: u16) {
    let mut m = Msg::new(Op::Listen);
    m.id = id;
    m.local = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
    m.ifname = side.tap.clone();
    side.send(m);
    // urdmad reads the channel before it serves requests: once a status shows the
    // listener, ConnectRequests find it.
    let end = Instant::now() + WAIT;
    while find::<Listener>(&side.status(), |l| l.id == id).is_none() {
        assert!(Instant::now() < end, "listener {id} not in status");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn connect_msg(id: u64, qpn: u32, local: u16, remote: SocketAddrV4, mac: Mac, pdata: &[u8]) -> Msg {
    let mut m = Msg::new(Op::Connect);
    m.id = id;
    m.qpn = qpn;
    m.local = SocketAddrV4::new(A_IP, local);
    m.remote = remote;
    m.remote_mac = mac;
    m.ird = 4;
    m.ord = 3;
    m.pdata = pdata.to_vec();
    m
}

/// Waits for the first event of a process.
fn event(c: &mut Connection) -> Event {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(e) = c.poll_events().unwrap().into_iter().next() {
            return e;
        }
        assert!(Instant::now() < end, "no event within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn connected(c: &mut Connection) -> Connected {
    match event(c) {
        Event::Connected(c) => *c,
        e => panic!("expected EVENT CONNECTED, got {e:?}"),
    }
}

fn cfg_of(c: &Connected) -> trp::Config {
    trp::Config {
        ird: c.ird,
        ord: c.ord,
        max_datagram: c.datagram,
        ..trp::Config::default()
    }
}

fn memory() -> trp::VecMemory {
    let mut m = trp::VecMemory::new(1 << 16);
    m.register(
        1,
        trp::Region::new(0, 0, 1 << 16, trp::Access::LOCAL_WRITE),
        false,
    );
    m
}

/// The kernel's part on B when a request comes: accept it for `qpn`; the process's event.
fn accept(b: &Side, pb: &mut Connection, qpn: u32) -> Connected {
    let req = b.expect(Op::Request);
    let mut acc = Msg::new(Op::Accept);
    acc.req = req.req;
    acc.qpn = qpn;
    b.send(acc);
    let ev = connected(pb);
    assert_eq!(b.expect(Op::Accepted).status, 0);
    ev
}

/// Posts a receive (wr_id 7, at 100) on B and a Send of "ping!" (wr_id 3, from 0) on A.
fn post_ping(
    a: &mut trp::Connection,
    b: &mut trp::Connection,
    ma: &mut trp::VecMemory,
    mb: &trp::VecMemory,
) {
    ma.bytes[..5].copy_from_slice(b"ping!");
    let sge = |addr, len| trp::Sge { addr, len, lkey: 1 };
    b.post_recv(
        mb,
        &trp::RecvWr {
            wr_id: 7,
            sges: &[sge(100, 64)],
        },
    )
    .unwrap();
    a.post_send(
        ma,
        &trp::SendWr {
            wr_id: 3,
            op: trp::SendOp::Send {
                invalidate: None,
                solicited: false,
            },
            sges: &[sge(0, 5)],
            signaled: true,
        },
    )
    .unwrap();
}

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
    let peer_mac: Mac = {
        let out = run_bounded(
            Command::new("ip").args(["-n", &bed.ns_b, "-o", "link", "show", &b2]),
            Duration::from_secs(5),
        );
        let t = String::from_utf8_lossy(&out.stdout).to_string();
        t.split("link/ether ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
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

/// A connection's socket on the direct path, driven as the provider drives it.
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
