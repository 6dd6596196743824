//! Whose a QP is: the processes' lines, the kernel's word, and what forgets it.

use super::*;

#[test]
fn a_qp_has_one_owner() {
    let mut a = core(1, 1);
    assert_eq!(
        a.client_request(1, &Request::Qp { dev: 1, qpn: 2 }),
        Response::Ok
    );
    assert_eq!(
        a.client_request(1, &Request::Qp { dev: 1, qpn: 2 }),
        Response::Ok
    );
    assert!(matches!(
        a.client_request(2, &Request::Qp { dev: 1, qpn: 2 }),
        Response::Error {
            code: ErrorCode::Exists,
            ..
        }
    ));
    a.client_request(
        1,
        &Request::Unqp {
            dev: 1,
            qpn: 2,
            linger: false,
        },
    );
    assert_eq!(
        a.client_request(2, &Request::Qp { dev: 1, qpn: 2 }),
        Response::Ok
    );
    assert!(drain(&mut a).is_empty());
}

/// urdma.ko's word on a QP's owner (in `CONNECT`, `ACCEPT`) overrides a `QP` line, and the
/// QP is forgotten with its connection's `QPCLOSED`: no `UNQP` is needed after it.
#[test]
fn the_kernel_names_a_qps_owner_and_qpclosed_forgets_the_qp() {
    let mut a = core(1, 1);
    assert_eq!(
        a.client_request(1, &Request::Qp { dev: 1, qpn: 2 }),
        Response::Ok
    );
    a.kernel_owner(1, 2, 3);
    assert_eq!(a.qp_owner(1, 2), Some(3));
    let closed = Request::QpClosed {
        dev: 1,
        qpn: 2,
        status: 0,
    };
    // Another process's QPCLOSED does not take the QP from its owner.
    assert_eq!(a.client_request(1, &closed), Response::Ok);
    assert_eq!(a.qp_owner(1, 2), Some(3));
    assert_eq!(a.client_request(3, &closed), Response::Ok);
    assert_eq!(a.qp_owner(1, 2), None);
    assert!(drain(&mut a).is_empty());
}

/// A's and B's QPs owned by the kernel's word alone (no `QP` line): the connection is
/// handed to the processes the kernel named.
#[test]
fn a_connection_goes_to_the_processes_the_kernel_names() {
    let t = Instant::now();
    let mut a = core(1, 0x100);
    let mut b = core(1, 0x200);
    listen(&mut b, t);
    a.kernel_owner(DEV, QPN_A, CLIENT_A);
    a.kernel(t, connect_msg(), None);
    let f = frames(&drain(&mut a), MAC_A);
    assert_eq!(f.len(), 1);
    b.frame(t, 0, &f[0]);
    let out = drain(&mut b);
    let mut acc = Msg::new(Op::Accept);
    acc.req = only_kernel(&out).req;
    acc.dev = DEV;
    acc.qpn = QPN_B;
    b.kernel_owner(DEV, QPN_B, CLIENT_B);
    b.kernel(t, acc, None);
    let handed: Vec<_> = drain(&mut b)
        .into_iter()
        .filter_map(|x| match x {
            Action::HandOver(h) => Some(h.client),
            _ => None,
        })
        .collect();
    assert_eq!(handed, [CLIENT_B]);
}
