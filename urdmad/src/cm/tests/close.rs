//! Closing: by either application, by a process's end, by urdmad when nobody reads.

use super::*;
use crate::cm::active::accept_src_conn;
use trp::setup::ConnectOutcome;

#[test]
fn a_process_gone_after_connecting_aborts_its_connections() {
    let t = Instant::now();
    let (mut a, _b) = connected(t);
    a.client_gone(CLIENT_A);
    let out = drain(&mut a);
    assert_eq!(frames(&out, MAC_A).len(), 1, "an Abort to the peer");
    // The Abort names the flow, whose process said what it received, and goes before
    // the flow closes.
    let at = |want: &dyn Fn(&Action) -> bool| out.iter().position(want).expect("present");
    let abort = at(&|x| matches!(x, Action::Abort { flow: 21, .. }));
    let close = at(&|x| matches!(x, Action::CloseFlow { .. }));
    assert!(abort < close, "{out:?}");
    assert!(out.iter().any(|x| matches!(
        x,
        Action::CloseFlow {
            client: CLIENT_A,
            flow: 21
        }
    )));
    let m = only_kernel(&out);
    assert_eq!((m.op, m.status, m.qpn), (Op::Closed, ECONNRESET, QPN_A));
    assert!(conn_records(&a).is_empty());
    assert!(a.udp_ports().is_empty());
    // Its QP is forgotten: another process may take the number.
    assert_eq!(
        a.client_request(
            9,
            &Request::Qp {
                dev: DEV,
                qpn: QPN_A
            }
        ),
        Response::Ok
    );
}

#[test]
fn a_close_reports_the_peers_close_once() {
    let t = Instant::now();
    let (mut a, mut b) = connected(t);
    // Both applications disconnect at once: each kernel asks, each process is told.
    for (cm, client, qpn) in [(&mut a, CLIENT_A, QPN_A), (&mut b, CLIENT_B, QPN_B)] {
        let mut m = Msg::new(Op::Disconnect);
        m.dev = DEV;
        m.qpn = qpn;
        cm.kernel(t, m, None);
        let out = drain(cm);
        assert!(
            matches!(out[..], [Action::Disconnect { client: c, qpn: q, status: 0, .. }] if c == client && q == qpn),
            "{out:?}"
        );
    }
    // A's process saw the peer's Terminate before its own close completed.
    a.client_request(
        CLIENT_A,
        &Request::PeerClosed {
            dev: DEV,
            qpn: QPN_A,
        },
    );
    assert_eq!(only_kernel(&drain(&mut a)).op, Op::PeerClosed);
    a.client_request(
        CLIENT_A,
        &Request::PeerClosed {
            dev: DEV,
            qpn: QPN_A,
        },
    );
    assert!(drain(&mut a).is_empty(), "once");
    a.client_request(
        CLIENT_A,
        &Request::QpClosed {
            dev: DEV,
            qpn: QPN_A,
            status: 0,
        },
    );
    let out = drain(&mut a);
    let k = kernel_msgs(&out);
    assert_eq!(k.len(), 1, "no second PEER_CLOSED");
    assert_eq!((k[0].op, k[0].status), (Op::Closed, 0));
    assert!(out
        .iter()
        .any(|x| matches!(x, Action::CloseFlow { flow: 21, .. })));
    // B's process closed without seeing the peer's close: both messages, in order.
    b.client_request(
        CLIENT_B,
        &Request::QpClosed {
            dev: DEV,
            qpn: QPN_B,
            status: -104,
        },
    );
    let out = drain(&mut b);
    let k = kernel_msgs(&out);
    assert_eq!(
        k.iter().map(|m| m.op).collect::<Vec<_>>(),
        [Op::PeerClosed, Op::Closed]
    );
    assert_eq!(k[1].status, -104);
    // A close from a process that does not own the connection changes nothing.
    let (mut a, _b) = connected(t);
    a.client_request(
        CLIENT_B,
        &Request::QpClosed {
            dev: DEV,
            qpn: QPN_A,
            status: 0,
        },
    );
    a.client_request(
        CLIENT_B,
        &Request::Unqp {
            dev: DEV,
            qpn: QPN_A,
            linger: false,
        },
    );
    assert!(drain(&mut a).is_empty());
    assert_eq!(conn_records(&a).len(), 1);
}

fn m_disconnect() -> Msg {
    let mut m = Msg::new(Op::Disconnect);
    m.dev = DEV;
    m.qpn = QPN_A;
    m
}

/// A's side of a connection whose `EVENT DISCONNECT` its process did not read: its actions
/// not drained.
fn retired(t: Instant) -> Cm {
    let (mut a, _b) = connected(t);
    a.kernel(t, m_disconnect(), None);
    drain(&mut a);
    a.disconnect_undelivered(DEV, QPN_A);
    a
}

#[test]
fn a_disconnect_no_process_reads_is_an_abort() {
    let t = Instant::now();
    let (mut a, _b) = connected(t);
    a.kernel(t, m_disconnect(), None);
    drain(&mut a);
    a.disconnect_undelivered(DEV, QPN_A);
    let out = drain(&mut a);
    assert_eq!(only_kernel(&out).status, ECONNRESET);
    assert_eq!(frames(&out, MAC_A).len(), 1);
    // The process still has the connection and reads its flow: the flow goes off the wire,
    // and its ring stays until the process lets the QP go; another process's word, or a
    // second one, frees nothing.
    let flows = |out: &[Action]| -> Vec<String> {
        out.iter()
            .filter_map(|x| match x {
                Action::CloseFlow { client, flow } => Some(format!("close {client} {flow}")),
                Action::RetireFlow { client, flow } => Some(format!("retire {client} {flow}")),
                _ => None,
            })
            .collect()
    };
    assert_eq!(flows(&out), [format!("retire {CLIENT_A} 21")]);
    let unqp_of = |linger| Request::Unqp {
        dev: DEV,
        qpn: QPN_A,
        linger,
    };
    let unqp = unqp_of(false);
    a.client_request(CLIENT_B, &unqp);
    assert!(flows(&drain(&mut a)).is_empty());
    a.client_request(CLIENT_A, &unqp);
    assert_eq!(flows(&drain(&mut a)), [format!("close {CLIENT_A} 21")]);
    a.client_request(CLIENT_A, &unqp);
    assert!(drain(&mut a).is_empty());
    // A lingering close's UNQP lets it go too, the process's CLOSE of the flow following.
    let mut a = retired(t);
    drain(&mut a);
    a.client_request(CLIENT_A, &unqp_of(true));
    assert!(flows(&drain(&mut a)).is_empty());
    a.client_request(CLIENT_A, &unqp);
    assert!(drain(&mut a).is_empty(), "forgotten");
    // QPCLOSED lets it go as well; a process that goes has the daemon close its flows.
    for gone in [false, true] {
        let mut a = retired(t);
        assert_eq!(flows(&drain(&mut a)), [format!("retire {CLIENT_A} 21")]);
        if gone {
            a.client_gone(CLIENT_A);
        }
        let closed = Request::QpClosed {
            dev: DEV,
            qpn: QPN_A,
            status: -104,
        };
        a.client_request(CLIENT_A, &closed);
        let want = if gone {
            vec![]
        } else {
            vec![format!("close {CLIENT_A} 21")]
        };
        assert_eq!(flows(&drain(&mut a)), want);
    }
    // Unregistering the QP of a live connection aborts it too.
    let (mut a, _b) = connected(t);
    a.client_request(
        CLIENT_A,
        &Request::Unqp {
            dev: DEV,
            qpn: QPN_A,
            linger: false,
        },
    );
    assert_eq!(only_kernel(&drain(&mut a)).op, Op::Closed);
}

#[test]
fn a_qp_destroyed_while_its_connection_closes_lingers_without_an_abort() {
    let t = Instant::now();
    let (mut a, _b) = connected(t);
    a.client_request(
        CLIENT_A,
        &Request::Unqp {
            dev: DEV,
            qpn: QPN_A,
            linger: true,
        },
    );
    let out = drain(&mut a);
    // The kernel hears the close (a no-op if urdma.ko posted it at the owner's SQD); the
    // peer gets no Abort, and the flow stays for the process to close.
    let k = only_kernel(&out);
    assert_eq!((k.op, k.status), (Op::Closed, 0));
    assert!(frames(&out, MAC_A).is_empty(), "{out:?}");
    assert!(
        !out.iter().any(|x| matches!(x, Action::CloseFlow { .. })),
        "{out:?}"
    );
    assert!(conn_records(&a).is_empty());
    assert_eq!(a.qp_owner(DEV, QPN_A), None);
}

#[test]
fn a_disconnect_during_the_handshake_fails_the_connect() {
    let t = Instant::now();
    let (mut a, _b, _f) = requested(t);
    let mut m = Msg::new(Op::Disconnect);
    m.dev = DEV;
    m.qpn = QPN_A;
    a.kernel(t, m, None);
    let out = drain(&mut a);
    let m = only_kernel(&out);
    assert_eq!(
        (m.op, m.status, m.id),
        (Op::ConnectFailed, ECONNRESET, CONNECT_ID)
    );
    assert!(!a.handshaking());
    assert!(a.udp_ports().is_empty());
}

#[test]
fn our_abort_fails_the_peers_connection() {
    let cfg = |crc| trp::Config {
        crc,
        ..trp::Config::default()
    };
    let pair = |crc: bool| {
        let now = trp::Instant::from_nanos(1);
        let mut c = Connecting::new(cfg(crc), 11, 100, b"", now).unwrap();
        let mut buf = vec![0u8; 2048];
        let n = c.poll_transmit(now, &mut buf).unwrap();
        let mut b = Incoming::parse(&buf[..n])
            .unwrap()
            .accept(cfg(crc), 22, 200, b"")
            .unwrap();
        let mem = trp::VecMemory::new(16);
        let n = b.poll_transmit(now, &mem, &mut buf).unwrap();
        assert_eq!(accept_src_conn(&buf[..n]), Some(22));
        match c.handle_datagram(now, &buf[..n]) {
            ConnectOutcome::Established { conn, .. } => conn,
            o => panic!("{o:?}"),
        }
    };
    let mut mem = trp::VecMemory::new(16);
    let now = trp::Instant::from_nanos(2);
    let failed = Some(trp::Event::Failed(trp::FailReason::PeerAborted));
    let mut a = pair(true);
    a.handle_datagram(now, &mut mem, &abort_packet(11, None))
        .unwrap();
    assert_eq!(a.poll_event(), failed);
    // To another connection id it is foreign.
    let mut a = pair(true);
    let _ = a.handle_datagram(now, &mut mem, &abort_packet(12, None));
    assert_eq!(a.state(), trp::QpState::Rts);
    // Sealed, it is read by a connection without the trailer as well.
    let mut a = pair(false);
    a.handle_datagram(now, &mut mem, &abort_packet(11, None))
        .unwrap();
    assert_eq!(a.poll_event(), failed);
}

#[test]
fn urdmads_abort_acknowledges_what_the_process_received_only_when_told() {
    let open = |b: &[u8]| {
        let d = crc::open(b).unwrap().0.to_vec();
        tw::Repr::parse(&tw::Packet::new_checked(&d[..]).unwrap()).unwrap()
    };
    let r = open(&abort_packet(7, Some(0x8000_0001)));
    assert_eq!(
        (r.opcode, r.dst_conn, r.flags & tw::FLAG_ACKS, r.ack_psn),
        (tw::Opcode::Abort, 7, tw::FLAG_ACKS, 0x8000_0001)
    );
    let r = open(&abort_packet(7, None));
    assert_eq!((r.flags & tw::FLAG_ACKS, r.ack_psn), (0, 0));
}

#[test]
fn a_closed_connection_is_told_to_the_kernel_before_its_flow_is_closed() {
    let t = Instant::now();
    let (mut a, _b) = connected(t);
    let closed = Request::QpClosed {
        dev: DEV,
        qpn: QPN_A,
        status: 0,
    };
    assert_eq!(a.client_request(CLIENT_A, &closed), Response::Ok);
    let out = drain(&mut a);
    let ops: Vec<String> = out
        .iter()
        .map(|x| match x {
            Action::Kernel(m) => format!("{:?}", m.op),
            Action::CloseFlow { flow, .. } => format!("CloseFlow {flow}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(ops, ["PeerClosed", "Closed", "CloseFlow 21"], "{out:?}");
    // An abort too (the process gone).
    let (mut a, _b) = connected(t);
    a.client_gone(CLIENT_A);
    let out = drain(&mut a);
    let at = |want: &dyn Fn(&Action) -> bool| out.iter().position(want).expect("present");
    let kernel = at(&|x| matches!(x, Action::Kernel(m) if m.op == Op::Closed));
    let flow = at(&|x| matches!(x, Action::CloseFlow { .. }));
    assert!(kernel < flow, "{out:?}");
}
