//! Connection management without urdma.ko: two urdmads in two namespaces joined by a veth
//! pair, each with a fake kernel (a `SOCK_SEQPACKET` socket at its `cm_device`) and a test
//! process registered as the owner of a QP. The tests play the kernel's part of
//! docs/connection.md and check urdmad's; this file holds what they share, one module per
//! subject.

#[path = "../common/mod.rs"]
mod common;
mod direct;
mod handshake;
mod ports;

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
