//! The connection manager's transitions, two cores wired back to back: no root, no ports,
//! no kernel module. Node A (10.0.0.1) connects, node B (10.0.0.2) listens on port 7000.

use super::*;
use crate::frame;
use crate::proto::{ErrorCode, Request, Response};
use crate::status::{self, Record};
use trp::setup::Incoming;

mod close;
mod owners;

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
const DEV: u32 = 1;
const QPN_A: u32 = 5;
const QPN_B: u32 = 9;
const CLIENT_A: u32 = 3;
const CLIENT_B: u32 = 4;
const CONNECT_ID: u64 = 77;
const LISTEN_ID: u64 = 88;

fn port(name: &str) -> PortView {
    PortView {
        name: name.into(),
        iface: format!("{name}-tap"),
        datagram: 1472,
        crc: true,
    }
}

/// A core with `ports` ports whose random numbers count up from `seed`.
fn core(ports: usize, seed: u32) -> Cm {
    let mut n = seed;
    let mut cm = Cm::new(
        (0..ports).map(|i| port(&format!("p{i}"))).collect(),
        Box::new(move || {
            n = n.wrapping_add(1);
            n
        }),
    );
    cm.set_channel(true);
    cm
}

fn addr(host: u8, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, host), port)
}

fn drain(cm: &mut Cm) -> Vec<Action> {
    std::iter::from_fn(|| cm.poll_action()).collect()
}

fn kernel_msgs(actions: &[Action]) -> Vec<&Msg> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Kernel(m) => Some(m),
            _ => None,
        })
        .collect()
}

/// The datagrams among `actions`, as frames from `src_mac` on the wire.
fn frames(actions: &[Action], src_mac: [u8; 6]) -> Vec<Vec<u8>> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Datagram {
                mac,
                local,
                remote,
                payload,
                ..
            } => Some(frame::udp_frame(mac.0, src_mac, *local, *remote, payload)),
            // As the daemon sends it for a process that said nothing of what it received.
            Action::Abort {
                mac,
                local,
                remote,
                peer_conn,
                ..
            } => Some(frame::udp_frame(
                mac.0,
                src_mac,
                *local,
                *remote,
                &abort_packet(*peer_conn, None),
            )),
            _ => None,
        })
        .collect()
}

fn only_kernel(actions: &[Action]) -> &Msg {
    let k = kernel_msgs(actions);
    assert_eq!(k.len(), 1, "{actions:?}");
    k[0]
}

fn connect_msg() -> Msg {
    let mut m = Msg::new(Op::Connect);
    m.id = CONNECT_ID;
    m.dev = DEV;
    m.qpn = QPN_A;
    m.local = addr(1, 40000);
    m.remote = addr(2, 7000);
    m.remote_mac = Mac(MAC_B);
    m.ird = 4;
    m.ord = 4;
    m.pdata = b"hello".to_vec();
    m
}

fn listen(b: &mut Cm, t: Instant) {
    let mut m = Msg::new(Op::Listen);
    m.id = LISTEN_ID;
    m.dev = DEV;
    m.local = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7000);
    b.kernel(t, m, None);
    assert!(drain(b).is_empty());
}

/// A and B with their QPs registered, B listening, A's ConnectRequest sent: its frames.
fn requested(t: Instant) -> (Cm, Cm, Vec<Vec<u8>>) {
    let mut a = core(1, 0x100);
    let mut b = core(1, 0x200);
    assert_eq!(
        a.client_request(
            CLIENT_A,
            &Request::Qp {
                dev: DEV,
                qpn: QPN_A
            }
        ),
        Response::Ok
    );
    assert_eq!(
        b.client_request(
            CLIENT_B,
            &Request::Qp {
                dev: DEV,
                qpn: QPN_B
            }
        ),
        Response::Ok
    );
    listen(&mut b, t);
    a.kernel(t, connect_msg(), None);
    let out = drain(&mut a);
    let f = frames(&out, MAC_A);
    assert_eq!(f.len(), 1, "{out:?}");
    (a, b, f)
}

/// B's kernel hears of the request: its id.
fn request_at_b(b: &mut Cm, t: Instant, f: &[u8]) -> u64 {
    b.frame(t, 0, f);
    let out = drain(b);
    let m = only_kernel(&out);
    assert_eq!(m.op, Op::Request);
    assert_eq!(m.id, LISTEN_ID);
    assert_eq!(m.pdata, b"hello");
    assert_eq!(
        (m.local, m.remote, m.remote_mac),
        (addr(2, 7000), addr(1, 40000), Mac(MAC_A))
    );
    m.req
}

fn accept_msg(req: u64) -> Msg {
    let mut m = Msg::new(Op::Accept);
    m.req = req;
    m.dev = DEV;
    m.qpn = QPN_B;
    m.ird = 4;
    m.ord = 4;
    m.pdata = b"welcome".to_vec();
    m
}

fn hand_over_of(actions: Vec<Action>) -> HandOver {
    let mut h: Vec<HandOver> = actions
        .into_iter()
        .filter_map(|a| match a {
            Action::HandOver(h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(h.len(), 1);
    h.remove(0)
}

/// The Accept B's provider sends once it has the connection.
fn provider_accept(h: &HandOver, t: trp::Instant) -> Vec<u8> {
    let c = &h.connected;
    let cfg = c.trp_config();
    let mut conn = Incoming::parse(&c.pkt)
        .unwrap()
        .accept(cfg, c.conn, c.isn, &c.pdata)
        .unwrap();
    let mem = trp::VecMemory::new(16);
    let mut buf = vec![0u8; 2048];
    let n = conn.poll_transmit(t, &mem, &mut buf).unwrap();
    frame::udp_frame(MAC_A, MAC_B, c.local, c.remote, &buf[..n])
}

/// Both sides connected: (A, B) with A's flow 21 and B's flow 31.
fn connected(t: Instant) -> (Cm, Cm) {
    let (mut a, mut b, f) = requested(t);
    let req = request_at_b(&mut b, t, &f[0]);
    b.kernel(t, accept_msg(req), None);
    let h = hand_over_of(drain(&mut b));
    b.handed_over(h.token, Ok(31));
    assert_eq!(only_kernel(&drain(&mut b)).status, 0);
    a.frame(t, 0, &provider_accept(&h, trp::Instant::from_nanos(1)));
    let h = hand_over_of(drain(&mut a));
    a.handed_over(h.token, Ok(21));
    assert_eq!(only_kernel(&drain(&mut a)).op, Op::Connected);
    (a, b)
}

fn conn_records(cm: &Cm) -> Vec<status::Connection> {
    let mut out = Vec::new();
    cm.status(Instant::now(), &mut out);
    out.into_iter()
        .filter_map(|r| match r {
            Record::Connection(c) => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn connect_and_accept_hand_both_ends_to_their_processes() {
    let t = Instant::now();
    let (mut a, mut b, f) = requested(t);
    assert!(a.handshaking());
    assert!(a.udp_ports().contains(&40000));
    let req = request_at_b(&mut b, t, &f[0]);
    b.kernel(t, accept_msg(req), None);
    let out = drain(&mut b);
    assert!(
        frames(&out, MAC_B).is_empty(),
        "no Accept before the hand-over"
    );
    let h = hand_over_of(out);
    assert_eq!(h.client, CLIENT_B);
    assert_eq!(h.spec.local, addr(2, 7000));
    assert_eq!(h.spec.remote, Some(addr(1, 40000)));
    assert_eq!(h.connected.role, Role::Passive);
    assert_eq!((h.connected.datagram, h.connected.crc), (1472, true));
    assert_ne!(h.connected.conn, 0);
    b.handed_over(h.token, Ok(31));
    let out = drain(&mut b);
    let m = only_kernel(&out);
    assert_eq!(
        (m.op, m.req, m.status, m.qpn),
        (Op::Accepted, req, 0, QPN_B)
    );
    assert_eq!(conn_records(&b)[0].flow, 31);
    assert_eq!(conn_records(&b)[0].role, "passive");
    // Once the process has the connection, urdmad sends its Accept: the one the process's
    // connection would send first, which that connection then takes as sent.
    let accept = frames(&out, MAC_B);
    assert_eq!(accept, [provider_accept(&h, trp::Instant::from_nanos(1))]);
    assert!(
        matches!(out[0], Action::Datagram { .. }),
        "the Accept leaves before the kernel is told: {out:?}"
    );

    a.frame(t, 0, &accept[0]);
    let h = hand_over_of(drain(&mut a));
    assert_eq!((h.client, h.connected.role), (CLIENT_A, Role::Active));
    assert_eq!(h.connected.pdata, b"hello");
    assert!(!a.handshaking(), "the handshake ends before the hand-over");
    a.handed_over(h.token, Ok(21));
    let out = drain(&mut a);
    let m = only_kernel(&out);
    assert_eq!((m.op, m.id, m.qpn), (Op::Connected, CONNECT_ID, QPN_A));
    assert_eq!(m.pdata, b"welcome");
    let c = &conn_records(&a)[0];
    assert_eq!(
        (c.flow, c.role.as_str(), c.client),
        (21, "active", CLIENT_A)
    );
    assert!(
        a.udp_ports().contains(&40000),
        "a connection keeps its port tapped"
    );
    // A token reported twice, or never issued, changes nothing.
    a.handed_over(h.token, Ok(99));
    a.handed_over(12345, Err("x".into()));
    assert!(drain(&mut a).is_empty());
}

#[test]
fn a_reject_carries_private_data_and_is_repeated_for_a_repeated_request() {
    let t = Instant::now();
    let (mut a, mut b, f) = requested(t);
    let req = request_at_b(&mut b, t, &f[0]);
    let mut m = Msg::new(Op::Reject);
    m.req = req;
    m.pdata = b"go away".to_vec();
    b.kernel(t, m.clone(), None);
    let out = drain(&mut b);
    let rej = frames(&out, MAC_B);
    assert_eq!(rej.len(), 1);
    assert_eq!(b.counters().rejects_sent, 1);
    // A second REJECT of the answered request sends nothing.
    b.kernel(t, m, None);
    assert!(drain(&mut b).is_empty());
    // The request repeated: the same Reject, and no second REQUEST to the kernel.
    b.frame(t, 0, &f[0]);
    let out = drain(&mut b);
    assert!(kernel_msgs(&out).is_empty());
    assert_eq!(frames(&out, MAC_B), rej);
    assert_eq!(b.counters().rejects_sent, 2);

    a.frame(t, 0, &rej[0]);
    let out = drain(&mut a);
    let m = only_kernel(&out);
    assert_eq!(
        (m.op, m.status, m.id),
        (Op::ConnectFailed, ECONNREFUSED, CONNECT_ID)
    );
    assert_eq!(m.pdata, b"go away");
    assert!(!a.handshaking());
    assert!(a.udp_ports().is_empty());
}

#[test]
fn a_repeated_request_is_one_request_until_forgotten() {
    let t = Instant::now();
    let (_a, mut b, f) = requested(t);
    let req = request_at_b(&mut b, t, &f[0]);
    b.frame(t + Duration::from_secs(1), 0, &f[0]);
    assert!(
        drain(&mut b).is_empty(),
        "pending: the kernel already knows"
    );
    // Repeated within REQUEST_IDLE of the last repetition, it stays pending.
    b.handle_timeout(t + Duration::from_secs(1) + REQUEST_IDLE);
    assert!(drain(&mut b).is_empty());
    b.handle_timeout(t + Duration::from_secs(2) + REQUEST_IDLE);
    let out = drain(&mut b);
    let m = only_kernel(&out);
    assert_eq!((m.op, m.req, m.id), (Op::RequestGone, req, LISTEN_ID));
    // Gone, the same request is a new one.
    assert_ne!(request_at_b(&mut b, t, &f[0]), req);
}

#[test]
fn an_answered_request_is_remembered_for_a_while() {
    let t = Instant::now();
    let (_a, mut b, f) = requested(t);
    let req = request_at_b(&mut b, t, &f[0]);
    let mut m = Msg::new(Op::Reject);
    m.req = req;
    b.kernel(t, m, None);
    drain(&mut b);
    assert!(b.poll_timeout().is_some_and(|d| d <= t + REQUEST_MEMORY));
    b.handle_timeout(t + REQUEST_MEMORY + Duration::from_millis(1));
    assert!(
        drain(&mut b).is_empty(),
        "an answered request goes silently"
    );
    assert_ne!(request_at_b(&mut b, t, &f[0]), req);
}

#[test]
fn the_requests_timer_is_never_late_and_exact_once_handled() {
    let t = Instant::now();
    let (_a, mut b, f) = requested(t);
    let req = request_at_b(&mut b, t, &f[0]);
    // Pending: due when the requester has gone quiet for REQUEST_IDLE; never later.
    assert!(b.poll_timeout().is_some_and(|d| d <= t + REQUEST_IDLE));
    let mut m = Msg::new(Op::Reject);
    m.req = req;
    b.kernel(t, m, None);
    drain(&mut b);
    // Answered, its timer went later; a round of timers with nothing due finds that.
    let early = t + Duration::from_secs(1);
    b.handle_timeout(early);
    assert!(drain(&mut b).is_empty());
    assert_eq!(b.poll_timeout(), Some(t + REQUEST_MEMORY));
    // A repetition keeps it a while longer.
    let again = t + Duration::from_secs(2);
    b.frame(again, 0, &f[0]);
    assert_eq!(frames(&drain(&mut b), MAC_B).len(), 1, "its Reject again");
    assert!(b
        .poll_timeout()
        .is_some_and(|d| d <= again + REQUEST_MEMORY));
    b.handle_timeout(t + REQUEST_MEMORY);
    assert_eq!(b.poll_timeout(), Some(again + REQUEST_MEMORY));
    b.handle_timeout(again + REQUEST_MEMORY + Duration::from_millis(1));
    assert_eq!(b.poll_timeout(), None);
}

fn unlisten(b: &mut Cm, t: Instant) {
    let mut m = Msg::new(Op::Unlisten);
    m.id = LISTEN_ID;
    b.kernel(t, m, None);
}

#[test]
fn a_request_with_no_listener_is_refused_after_the_grace_and_with_no_channel_at_once() {
    let t = Instant::now();
    let (_a, mut b, f) = requested(t);
    unlisten(&mut b, t);
    assert!(b.udp_ports().is_empty());
    b.frame(t, 0, &f[0]);
    assert!(drain(&mut b).is_empty(), "held for a listener");
    let half = t + LISTEN_GRACE / 2;
    b.frame(half, 0, &f[0]);
    b.handle_timeout(half);
    assert!(drain(&mut b).is_empty(), "a repetition is the same request");
    assert_eq!(b.poll_timeout(), Some(t + LISTEN_GRACE));
    b.handle_timeout(t + LISTEN_GRACE);
    let out = drain(&mut b);
    assert!(kernel_msgs(&out).is_empty());
    assert_eq!(frames(&out, MAC_B).len(), 1, "one Reject");
    assert_eq!(b.poll_timeout(), None, "a refusal is not remembered");
    assert_eq!(b.counters().rejects_sent, 1);

    let (_a, mut b, f) = requested(t);
    b.set_channel(false);
    b.frame(t, 0, &f[0]);
    let out = drain(&mut b);
    assert!(kernel_msgs(&out).is_empty());
    assert_eq!(frames(&out, MAC_B).len(), 1);
    assert_eq!(b.counters().rejects_sent, 1);
}

#[test]
fn a_request_that_comes_just_before_its_listener_is_passed_on_when_it_listens() {
    let t = Instant::now();
    let (mut a, mut b, f) = requested(t);
    unlisten(&mut b, t);
    b.frame(t, 0, &f[0]);
    assert!(drain(&mut b).is_empty());
    // The listener comes within the grace: the kernel hears of the request once.
    let later = t + LISTEN_GRACE / 2;
    let mut m = Msg::new(Op::Listen);
    m.id = LISTEN_ID;
    m.dev = DEV;
    m.local = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7000);
    b.kernel(later, m, None);
    let out = drain(&mut b);
    let r = only_kernel(&out);
    assert_eq!((r.op, r.id), (Op::Request, LISTEN_ID));
    assert_eq!(r.pdata, b"hello");
    let req = r.req;
    b.frame(later, 0, &f[0]);
    b.handle_timeout(t + LISTEN_GRACE);
    assert!(drain(&mut b).is_empty(), "neither repeated nor refused");
    // And it connects.
    b.kernel(later, accept_msg(req), None);
    let h = hand_over_of(drain(&mut b));
    b.handed_over(h.token, Ok(31));
    assert_eq!(only_kernel(&drain(&mut b)).status, 0);
    a.frame(later, 0, &provider_accept(&h, trp::Instant::from_nanos(1)));
    assert_eq!(hand_over_of(drain(&mut a)).connected.remote, addr(2, 7000));
}

#[test]
fn a_silent_peer_gets_repeated_requests_then_the_connect_times_out() {
    let t = Instant::now();
    let (mut a, _b, _f) = requested(t);
    let mut repeats = 0;
    let mut now = t;
    let failed = loop {
        let next = a.poll_timeout().expect("a handshake has a timer");
        assert!(next > now, "the timer moves on");
        now = next;
        assert!(now < t + Duration::from_secs(120), "no time-out");
        a.handle_timeout(now);
        let out = drain(&mut a);
        repeats += frames(&out, MAC_A).len();
        if let Some(m) = kernel_msgs(&out).first() {
            break (*m).clone();
        }
    };
    assert_eq!(
        (failed.op, failed.status, failed.id),
        (Op::ConnectFailed, ETIMEDOUT, CONNECT_ID)
    );
    assert_eq!(repeats, 34);
    let took = now - t;
    assert!(
        took > Duration::from_secs(30) && took < Duration::from_secs(90),
        "{took:?}"
    );
    assert!(!a.handshaking());
    assert!(a.udp_ports().is_empty());
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn a_process_gone_mid_handshake_fails_both_ends_and_aborts_the_peer() {
    let t = Instant::now();
    let (_a, mut b, f) = requested(t);
    let req = request_at_b(&mut b, t, &f[0]);
    // B's owner gone before its application accepts: the accept fails.
    b.client_gone(CLIENT_B);
    b.kernel(t, accept_msg(req), None);
    let out = drain(&mut b);
    let m = only_kernel(&out);
    assert_eq!((m.op, m.status), (Op::Accepted, ENOTCONN));

    // A's owner gone before the Accept arrives: the peer is aborted, the connect fails.
    let (mut a2, mut b2, f2) = requested(t);
    let req = request_at_b(&mut b2, t, &f2[0]);
    b2.kernel(t, accept_msg(req), None);
    let h = hand_over_of(drain(&mut b2));
    b2.handed_over(h.token, Ok(31));
    drain(&mut b2);
    a2.client_gone(CLIENT_A);
    a2.frame(t, 0, &provider_accept(&h, trp::Instant::from_nanos(1)));
    let out = drain(&mut a2);
    let m = only_kernel(&out);
    assert_eq!(
        (m.op, m.status, m.id),
        (Op::ConnectFailed, ECONNRESET, CONNECT_ID)
    );
    let abort = frames(&out, MAC_A);
    assert_eq!(abort.len(), 1);
    let d = frame::datagram(&abort[0]).unwrap();
    let r = tw::Repr::parse(&tw::Packet::new_unchecked(crc::open(d.payload).unwrap().0)).unwrap();
    assert_eq!(
        (r.opcode, r.dst_conn),
        (tw::Opcode::Abort, h.connected.conn)
    );
    assert_eq!(a2.counters().aborts_sent, 1);

    // A hand-over the daemon could not carry out ends the same way.
    let (mut a3, mut b3, f3) = requested(t);
    let req = request_at_b(&mut b3, t, &f3[0]);
    b3.kernel(t, accept_msg(req), None);
    let hb = hand_over_of(drain(&mut b3));
    b3.handed_over(hb.token, Err("the QP's process is not attached".into()));
    let out = drain(&mut b3);
    assert_eq!(only_kernel(&out).status, ENOTCONN);
    assert!(
        frames(&out, MAC_B).is_empty(),
        "no Accept for a failed hand-over"
    );
    assert!(conn_records(&b3).is_empty());
    a3.frame(t, 0, &provider_accept(&hb, trp::Instant::from_nanos(1)));
    let ha = hand_over_of(drain(&mut a3));
    a3.handed_over(ha.token, Err("the QP's process is gone".into()));
    let out = drain(&mut a3);
    assert_eq!(only_kernel(&out).status, ECONNRESET);
    assert_eq!(frames(&out, MAC_A).len(), 1);
    assert!(conn_records(&a3).is_empty());
}

#[test]
fn forged_or_foreign_frames_change_no_state() {
    let t = Instant::now();
    let (mut a, mut b, f) = requested(t);
    let req = request_at_b(&mut b, t, &f[0]);
    b.kernel(t, accept_msg(req), None);
    let h = hand_over_of(drain(&mut b));
    let good = provider_accept(&h, trp::Instant::from_nanos(1));
    // An Abort for another connection, garbage, and a truncated Accept, all from the peer's
    // address: counted, the handshake goes on.
    let d = frame::datagram(&good).unwrap();
    let from_peer = |payload: &[u8]| frame::udp_frame(MAC_A, MAC_B, d.src, d.dst, payload);
    for bad in [
        from_peer(&abort_packet(0xdead, None)),
        from_peer(b"not trp at all"),
        from_peer(&d.payload[..d.payload.len() - 3]),
        good[..20].to_vec(),
    ] {
        a.frame(t, 0, &bad);
        assert!(drain(&mut a).is_empty());
        assert!(a.handshaking());
    }
    assert_eq!(
        a.counters().strays,
        3,
        "the truncated frame is no datagram at all"
    );
    // A ConnectRequest with a bad version or a forged length is no request.
    let d = frame::datagram(&f[0]).unwrap();
    let mut forged = d.payload.to_vec();
    forged[20] ^= 0xff;
    b.frame(t, 0, &frame::udp_frame(MAC_B, MAC_A, d.src, d.dst, &forged));
    let out = drain(&mut b);
    assert!(kernel_msgs(&out).is_empty(), "{out:?}");
    // The real Accept still completes the handshake.
    a.frame(t, 0, &good);
    hand_over_of(drain(&mut a));
}

#[test]
fn the_request_table_is_bounded() {
    let t = Instant::now();
    let mut b = core(1, 0x200);
    listen(&mut b, t);
    let request = |i: u32| {
        let mut c = Connecting::new(
            trp::Config::default(),
            1000 + i,
            i,
            b"",
            trp::Instant::from_nanos(1),
        )
        .unwrap();
        let mut buf = vec![0u8; 2048];
        let n = c
            .poll_transmit(trp::Instant::from_nanos(1), &mut buf)
            .unwrap();
        frame::udp_frame(
            MAC_B,
            MAC_A,
            addr(1, 10000 + i as u16),
            addr(2, 7000),
            &buf[..n],
        )
    };
    for i in 0..MAX_REQUESTS as u32 {
        b.frame(t, 0, &request(i));
    }
    assert_eq!(kernel_msgs(&drain(&mut b)).len(), MAX_REQUESTS);
    b.frame(t, 0, &request(5000));
    assert!(drain(&mut b).is_empty());
    assert_eq!(b.counters().requests_dropped, 1);
    // An answered request makes room for a new one.
    let mut m = Msg::new(Op::Reject);
    m.req = 1;
    b.kernel(t, m, None);
    drain(&mut b);
    b.frame(t, 0, &request(5001));
    assert_eq!(only_kernel(&drain(&mut b)).op, Op::Request);
    assert_eq!(b.counters().requests_dropped, 1);
}

#[test]
fn a_connect_needs_a_port_and_a_free_four_tuple() {
    let t = Instant::now();
    // Two ports and nothing to choose by: refused.
    let mut a = core(2, 1);
    a.kernel(t, connect_msg(), None);
    let out = drain(&mut a);
    assert_eq!(
        (only_kernel(&out).op, only_kernel(&out).status),
        (Op::ConnectFailed, ECONNRESET)
    );
    // The interface named, the address's port, the device's listening port: each chooses.
    let mut m = connect_msg();
    m.ifname = "p1-tap".into();
    a.kernel(t, m, None);
    assert!(matches!(
        drain(&mut a)[..],
        [Action::Datagram { port: 1, .. }]
    ));
    let mut m = connect_msg();
    m.id += 1;
    m.local = addr(1, 40001);
    a.kernel(t, m, Some(0));
    assert!(matches!(
        drain(&mut a)[..],
        [Action::Datagram { port: 0, .. }]
    ));
    // The same connect id, or the same four-tuple on the port: in use.
    let mut m = connect_msg();
    m.ifname = "p0-tap".into();
    a.kernel(t, m, None);
    assert_eq!(only_kernel(&drain(&mut a)).status, EADDRINUSE);
    let mut m = connect_msg();
    m.id = 1000;
    m.ifname = "p1-tap".into();
    a.kernel(t, m, None);
    assert_eq!(only_kernel(&drain(&mut a)).status, EADDRINUSE);
    // An interface no port has: refused, not looked up by address.
    let mut m = connect_msg();
    m.id = 1002;
    m.local = addr(1, 40003);
    m.ifname = "nowhere".into();
    a.kernel(t, m, Some(0));
    let out = drain(&mut a);
    assert_eq!(
        (only_kernel(&out).op, only_kernel(&out).status),
        (Op::ConnectFailed, ECONNRESET)
    );
    // Private data too long for a ConnectRequest: invalid.
    let mut m = connect_msg();
    m.id = 1001;
    m.local = addr(1, 40002);
    m.ifname = "p0-tap".into();
    m.pdata = vec![0; 4096];
    a.kernel(t, m, None);
    assert_eq!(only_kernel(&drain(&mut a)).status, EINVAL);
}

#[test]
fn listeners_choose_their_ports_and_addresses() {
    let t = Instant::now();
    let mut b = core(2, 1);
    let mut m = Msg::new(Op::Listen);
    m.id = 1;
    m.dev = 3;
    m.ifname = "nowhere".into();
    m.local = addr(2, 7000);
    b.kernel(t, m.clone(), None);
    assert!(
        b.udp_ports().is_empty(),
        "an interface urdmad does not serve"
    );
    m.ifname = "p1-tap".into();
    b.kernel(t, m, None);
    assert_eq!(b.udp_ports().iter().copied().collect::<Vec<_>>(), [7000]);
    let (_a, _b, f) = requested(t);
    // Port 0 has no listener: refused there.
    b.frame(t, 0, &f[0]);
    b.handle_timeout(t + LISTEN_GRACE);
    let out = drain(&mut b);
    assert!(kernel_msgs(&out).is_empty());
    assert_eq!(frames(&out, MAC_B).len(), 1);
    b.frame(t, 1, &f[0]);
    let out = drain(&mut b);
    assert_eq!(only_kernel(&out).id, 1);
    // The device was seen on port 1: a connect of it with no better clue goes there.
    let mut m = connect_msg();
    m.dev = 3;
    b.kernel(t, m, None);
    assert!(matches!(
        drain(&mut b)[..],
        [Action::Datagram { port: 1, .. }]
    ));
}

#[test]
fn status_names_each_state() {
    let t = Instant::now();
    let (a, mut b, f) = requested(t);
    request_at_b(&mut b, t, &f[0]);
    let mut out = Vec::new();
    a.status(t, &mut out);
    b.status(t + Duration::from_millis(5), &mut out);
    let kinds: Vec<&str> = out
        .iter()
        .map(|r| match r {
            Record::Cm(_) => "cm",
            Record::Listener(_) => "listener",
            Record::Request(_) => "request",
            Record::Connecting(_) => "connecting",
            Record::Connection(_) => "connection",
            Record::Qp(_) => "qp",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["cm", "connecting", "qp", "cm", "listener", "request", "qp"]
    );
    match &out[5] {
        Record::Request(r) => {
            assert_eq!(
                (r.state.as_str(), r.idle_ms, r.port.as_str()),
                ("pending", 5, "p0")
            )
        }
        r => panic!("{r:?}"),
    }
    match &out[1] {
        Record::Connecting(c) => assert_eq!((c.sent, c.remote.as_str()), (1, "10.0.0.2:7000")),
        r => panic!("{r:?}"),
    }
}
