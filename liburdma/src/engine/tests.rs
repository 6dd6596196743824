//! Two QPs of one engine (devices 1 and 2) connected through in-memory
//! queues, with the handshake done the way urdmad does it.

use super::*;
use rdma_core_sys::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use trp::{Config, Region};
use urdma_shared::proto::{Connected, Role};

type Wire = Arc<Mutex<VecDeque<Vec<u8>>>>;

struct MemFlow {
    rx: Wire,
    tx: Wire,
}

impl Flow for MemFlow {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        let got: Vec<Vec<u8>> = self.rx.lock().unwrap().drain(..).collect();
        let refs: Vec<&[u8]> = got.iter().map(|b| &b[..]).collect();
        if !refs.is_empty() {
            handle(&refs);
        }
        refs.len()
    }
    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        let mut n = 0;
        loop {
            let mut buf = vec![0u8; datagram];
            match fill(&mut buf) {
                Some(len) => {
                    buf.truncate(len);
                    self.tx.lock().unwrap().push_back(buf);
                    n += 1;
                }
                None => return n,
            }
        }
    }
}

const A: QpKey = (1, 10);
const B: QpKey = (2, 20);
const ACQ: CqKey = (1, 1);
const BCQ: CqKey = (2, 1);

fn init(pd: u32, cq: CqKey) -> QpInit {
    QpInit {
        pd,
        send_cq: cq,
        recv_cq: cq,
        sig_all: false,
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline: 64,
        srq: None,
    }
}

struct Bed {
    e: Engine,
    now: Instant,
    ab: Wire,
    ba: Wire,
}

impl Bed {
    fn new() -> Bed {
        let mut e = Engine::new();
        e.create_cq(ACQ, 64, None);
        e.create_cq(BCQ, 64, None);
        e.create_qp(A, init(1, ACQ));
        e.create_qp(B, init(2, BCQ));
        Bed {
            e,
            now: Instant(1_000_000),
            ab: Default::default(),
            ba: Default::default(),
        }
    }

    /// What urdmad does: the active side's Connecting sends the request,
    /// the passive QP accepts it, its Accept comes back to urdmad.
    fn connect(&mut self) {
        connect_pair(&mut self.e, A, B, (&self.ab, &self.ba), self.now);
    }

    fn run(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.now = self.now + std::time::Duration::from_micros(50);
            self.e.progress(self.now);
        }
    }

    fn poll(&mut self, cq: CqKey) -> Vec<ibv_wc> {
        // SAFETY: ibv_wc is plain C data (integers and a union of them).
        let mut out: Vec<ibv_wc> = vec![unsafe { std::mem::zeroed() }; 64];
        let n = self.e.poll_cq(cq, &mut out, self.now).unwrap();
        out.truncate(n);
        out
    }

    fn reg(&mut self, dev: u32, stag: u32, pd: u32, buf: &mut [u8], access: Access) -> u64 {
        let base = buf.as_mut_ptr() as u64;
        self.e.mrs.insert(
            dev,
            stag,
            Region::new(pd, base, buf.len() as u64, access),
            access.bits().into(),
        );
        base
    }
}

/// The ConnectRequest of active QP `a`'s handshake, as urdmad's `Connecting` sends it.
fn connect_request(now: Instant) -> Vec<u8> {
    let cfg = Config {
        pd: 1,
        ..Config::default()
    };
    let mut c = Connecting::new(cfg, 0xA, 100, b"hi", now).unwrap();
    let mut req = vec![0u8; 1500];
    let n = c.poll_transmit(now, &mut req).unwrap();
    req.truncate(n);
    req
}

/// urdmad's `EVENT CONNECTED` for passive QP `b`, which `req` asked for.
fn passive_event(b: QpKey, req: Vec<u8>, accept_sent: bool) -> Connected {
    // The engine reads the handshake's fields; the flow's are the runtime's.
    Connected {
        dev: b.0,
        qpn: b.1,
        role: Role::Passive,
        port: 0,
        local: "10.0.0.2:7000".parse().unwrap(),
        remote: "10.0.0.1:7001".parse().unwrap(),
        mac: Default::default(),
        flow: 0,
        rx_ring: String::new(),
        ird: 16,
        ord: 16,
        datagram: 1472,
        crc: true,
        direct: 0,
        bell: false,
        hush: false,
        stats: None,
        conn: 0xB,
        isn: 500,
        pdata: b"ok".to_vec(),
        pkt: req,
        accept_sent,
        park: false,
        reuse: 0,
    }
}

/// Connects QP `a` (active) to QP `b` (passive) of engine `e` over the wires `(a to b, b to
/// a)`, the handshake done the way urdmad does it.
fn connect_pair(e: &mut Engine, a: QpKey, b: QpKey, (ab, ba): (&Wire, &Wire), now: Instant) {
    let passive = passive_event(b, connect_request(now), false);
    let flow = MemFlow {
        rx: ab.clone(),
        tx: ba.clone(),
    };
    e.connected(b, &passive, Box::new(flow), now).unwrap();
    e.progress(now);
    let accept = ba.lock().unwrap().pop_front().expect("Accept sent");
    let active = Connected {
        dev: a.0,
        qpn: a.1,
        role: Role::Active,
        conn: 0xA,
        isn: 100,
        pdata: b"hi".to_vec(),
        pkt: accept,
        flow: 1,
        ..passive
    };
    let flow = MemFlow {
        rx: ba.clone(),
        tx: ab.clone(),
    };
    e.connected(a, &active, Box::new(flow), now).unwrap();
    assert!(e.is_connected(a) && e.is_connected(b));
}

/// urdmad sends a passive connection's Accept when it hands the connection over: the
/// process's connection takes it as sent, and repeats it only while nothing acknowledges it.
#[test]
fn an_accept_urdmad_sent_is_not_sent_again_until_it_is_due_again() {
    let mut t = Bed::new();
    let passive = passive_event(B, connect_request(t.now), true);
    let flow = MemFlow {
        rx: t.ab.clone(),
        tx: t.ba.clone(),
    };
    t.e.connected(B, &passive, Box::new(flow), t.now).unwrap();
    t.run(10);
    assert!(t.ba.lock().unwrap().is_empty(), "the Accept went out once");
    // Unacknowledged, it is repeated like any datagram: the same Accept.
    for _ in 0..100 {
        t.run(1_000);
        if !t.ba.lock().unwrap().is_empty() {
            break;
        }
    }
    let again =
        t.ba.lock()
            .unwrap()
            .pop_front()
            .expect("the Accept repeated");
    // What a connection that sends its own Accept sends first.
    let first = passive_event(B, connect_request(t.now), false);
    let mut e = Engine::new();
    e.create_cq(BCQ, 64, None);
    e.create_qp(B, init(2, BCQ));
    let wire: Wire = Default::default();
    let flow = MemFlow {
        rx: Default::default(),
        tx: wire.clone(),
    };
    e.connected(B, &first, Box::new(flow), t.now).unwrap();
    e.progress(t.now);
    let sent_by_urdmad = wire.lock().unwrap().pop_front().expect("Accept");
    assert_eq!(again, sent_by_urdmad);
}

/// `buf` registered on device `dev` (its PD too) as STag `stag`: the first `len` bytes.
fn region(t: &mut Bed, dev: u32, stag: u32, buf: &mut [u8], len: u32) -> [Sge; 1] {
    let addr = t.reg(dev, stag, dev, buf, Access::LOCAL_WRITE);
    [Sge {
        addr,
        len,
        lkey: stag,
    }]
}

fn send(wr_id: u64, sges: &[Sge]) -> SendReq<'_> {
    SendReq {
        wr_id,
        op: SendOp::Send {
            invalidate: None,
            solicited: false,
        }
        .into(),
        sges,
        signaled: true,
        inline: None,
    }
}

/// A signalled RDMA Write of `sges` to `remote_addr` under `rkey`.
fn write(wr_id: u64, sges: &[Sge], remote_addr: u64, rkey: u32) -> SendReq<'_> {
    SendReq {
        op: SendOp::RdmaWrite { remote_addr, rkey }.into(),
        ..send(wr_id, sges)
    }
}

#[test]
fn receive_posted_before_the_connection_gets_the_send() {
    let mut t = Bed::new();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    let mut sbuf = b"hello world".to_vec();
    let saddr = t.reg(1, 0x100, 1, &mut sbuf, Access::NONE);
    t.e.post_recv(
        B,
        7,
        &[Sge {
            addr: raddr,
            len: 64,
            lkey: 0x200,
        }],
    )
    .unwrap();
    let s = [Sge {
        addr: saddr,
        len: 11,
        lkey: 0x100,
    }];
    assert_eq!(t.e.post_send(A, &send(1, &s)), Err(Error::NotConnected));
    t.connect();
    t.e.post_send(A, &send(1, &s)).unwrap();
    t.run(10);
    let wcs = t.poll(BCQ);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].wr_id, 7);
    assert_eq!(wcs[0].opcode, IBV_WC_RECV);
    assert_eq!(wcs[0].status, IBV_WC_SUCCESS);
    assert_eq!(wcs[0].byte_len, 11);
    assert_eq!(wcs[0].qp_num, 20);
    assert_eq!(&rbuf[..11], b"hello world");
    let wcs = t.poll(ACQ);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].opcode), (1, IBV_WC_SEND));
}

#[test]
fn write_with_immediate_read_and_inline() {
    let mut t = Bed::new();
    t.connect();
    let mut target = vec![0u8; 4096];
    let taddr = t.reg(
        2,
        0x300,
        2,
        &mut target,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let mut source = (0..=255u8).cycle().take(3000).collect::<Vec<u8>>();
    let saddr = t.reg(1, 0x100, 1, &mut source, Access::REMOTE_READ);
    let mut rbuf = vec![0u8; 16];
    let raddr = t.reg(2, 0x201, 2, &mut rbuf, Access::LOCAL_WRITE);
    t.e.post_recv(
        B,
        9,
        &[Sge {
            addr: raddr,
            len: 16,
            lkey: 0x201,
        }],
    )
    .unwrap();
    // Multi-segment RDMA Write with immediate data.
    let s = [Sge {
        addr: saddr,
        len: 3000,
        lkey: 0x100,
    }];
    let wr = SendReq {
        op: SendOp::RdmaWriteImm {
            remote_addr: taddr + 10,
            rkey: 0x300,
            imm: 0xdead_beef,
            solicited: false,
        }
        .into(),
        ..send(2, &s)
    };
    t.e.post_send(A, &wr).unwrap();
    t.run(20);
    assert_eq!(&target[10..3010], &source[..]);
    let wcs = t.poll(BCQ);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(wcs[0].wc_flags, IBV_WC_WITH_IMM);
    assert_eq!(
        // SAFETY: the union's members are all u32.
        u32::from_be(unsafe { wcs[0].__bindgen_anon_1.imm_data }),
        0xdead_beef
    );
    assert_eq!(t.poll(ACQ)[0].opcode, IBV_WC_RDMA_WRITE);

    // RDMA Read of B's region back into A's local buffer.
    let mut back = vec![0u8; 100];
    let baddr = t.reg(1, 0x101, 1, &mut back, Access::LOCAL_WRITE);
    t.e.mrs.insert(
        2,
        0x301,
        Region::new(2, taddr, 4096, Access::REMOTE_READ),
        4,
    );
    let s = [Sge {
        addr: baddr,
        len: 100,
        lkey: 0x101,
    }];
    let wr = SendReq {
        op: SendOp::RdmaRead {
            remote_addr: taddr + 10,
            rkey: 0x301,
        }
        .into(),
        ..send(3, &s)
    };
    t.e.post_send(A, &wr).unwrap();
    t.run(20);
    assert_eq!(&back[..], &source[..100]);
    let wcs = t.poll(ACQ);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].opcode, wcs[0].byte_len),
        (3, IBV_WC_RDMA_READ, 100)
    );

    // Inline: bytes outside any MR, copied at post time.
    t.e.post_recv(
        B,
        10,
        &[Sge {
            addr: raddr,
            len: 16,
            lkey: 0x201,
        }],
    )
    .unwrap();
    let mut msg = b"inline!".to_vec();
    let parts: [&[u8]; 1] = [&msg];
    let bogus = [Sge {
        addr: 1,
        len: 7,
        lkey: 0xdead,
    }];
    let wr = SendReq {
        inline: Some(&parts),
        ..send(4, &bogus)
    };
    t.e.post_send(A, &wr).unwrap();
    msg.fill(0);
    t.run(10);
    assert_eq!(&rbuf[..7], b"inline!");
    let big = [0u8; 65];
    let parts: [&[u8]; 1] = [&big];
    let wr = SendReq {
        inline: Some(&parts),
        ..send(5, &bogus)
    };
    assert_eq!(
        t.e.post_send(A, &wr).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
}

#[test]
fn unsignaled_sends_complete_silently_unless_sq_sig_all() {
    let mut t = Bed::new();
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    for i in 0..3 {
        t.e.post_recv(
            B,
            i,
            &[Sge {
                addr: raddr,
                len: 64,
                lkey: 0x200,
            }],
        )
        .unwrap();
    }
    let wr = SendReq {
        signaled: false,
        ..send(1, &[])
    };
    t.e.post_send(A, &wr).unwrap();
    t.run(10);
    assert!(t.poll(ACQ).is_empty());
    assert_eq!(t.poll(BCQ).len(), 1);
}

#[test]
fn local_errors_refuse_the_post() {
    let mut t = Bed::new();
    t.connect();
    let bad = [Sge {
        addr: 0x1000,
        len: 8,
        lkey: 0x999,
    }];
    assert_eq!(
        t.e.post_send(A, &send(1, &bad)).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    assert_eq!(
        t.e.post_recv(A, 1, &bad).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    let five = [bad[0]; 5];
    assert_eq!(
        t.e.post_recv(A, 1, &five).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    // The send queue holds 16: the 17th is refused while nothing moves.
    for i in 0..16 {
        t.e.post_send(A, &send(i, &[])).unwrap();
    }
    assert_eq!(
        t.e.post_send(A, &send(99, &[])).map_err(|e| e.errno()),
        Err(libc::ENOMEM)
    );
}

#[test]
fn remote_protection_error_fails_both_and_later_posts_flush() {
    let mut t = Bed::new();
    t.connect();
    let mut target = vec![0u8; 64];
    let taddr = t.reg(
        2,
        0x300,
        2,
        &mut target,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    );
    let mut src = vec![1u8; 64];
    let saddr = t.reg(1, 0x100, 1, &mut src, Access::NONE);
    let s = [Sge {
        addr: saddr,
        len: 64,
        lkey: 0x100,
    }];
    let wr = write(1, &s, taddr, 0x300);
    t.e.post_send(A, &wr).unwrap();
    assert!(!t.e.qp_in_error(A) && !t.e.qp_in_error(B));
    t.run(20);
    assert_eq!(target, vec![0u8; 64], "no byte placed without REMOTE_WRITE");
    assert!(
        t.e.qp_in_error(A) && t.e.qp_in_error(B),
        "ibv_query_qp says ERR"
    );
    let wcs = t.poll(ACQ);
    assert_eq!(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
    let notices = t.e.take_notices();
    assert!(notices
        .iter()
        .any(|n| matches!(n, Notice::Closed(k, s) if *k == A && *s < 0)));
    assert!(notices
        .iter()
        .any(|n| matches!(n, Notice::Closed(k, s) if *k == B && *s < 0)));
    t.e.post_send(A, &send(2, &[])).unwrap();
    t.run(1);
    let wcs = t.poll(ACQ);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, IBV_WC_WR_FLUSH_ERR));
}

#[test]
fn error_before_connecting_flushes_receives() {
    let mut t = Bed::new();
    let mut rbuf = vec![0u8; 8];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    t.e.post_recv(
        B,
        1,
        &[Sge {
            addr: raddr,
            len: 8,
            lkey: 0x200,
        }],
    )
    .unwrap();
    t.e.abort(B, t.now);
    t.e.post_recv(B, 2, &[]).unwrap();
    t.e.post_send(B, &send(3, &[])).unwrap();
    t.run(1);
    let wcs = t.poll(BCQ);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (1, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV),
            (2, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV),
            (3, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND)
        ]
    );
}

#[test]
fn graceful_close_reaches_both_sides() {
    let mut t = Bed::new();
    t.connect();
    t.e.close(A);
    t.run(20);
    let n = t.e.take_notices();
    assert!(n.contains(&Notice::PeerClosed(B)), "{n:?}");
    // B closes in turn when told (EVENT DISCONNECT status=0).
    t.e.close(B);
    t.run(20);
    let n2 = t.e.take_notices();
    let all: Vec<_> = n.iter().chain(&n2).collect();
    assert!(all.contains(&&Notice::Closed(A, 0)), "{all:?}");
    assert!(all.contains(&&Notice::Closed(B, 0)), "{all:?}");
    assert_eq!(t.e.deadline(), None, "closed connections keep no timers");
}

#[test]
fn full_cq_holds_completions_back_in_order() {
    let mut t = Bed::new();
    t.e.destroy_cq(ACQ);
    t.e.create_cq(ACQ, 2, None);
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    for i in 0..5 {
        t.e.post_recv(
            B,
            i,
            &[Sge {
                addr: raddr,
                len: 64,
                lkey: 0x200,
            }],
        )
        .unwrap();
        t.e.post_send(A, &send(i, &[])).unwrap();
    }
    t.run(20);
    let mut ids = vec![];
    for _ in 0..5 {
        let w = t.poll(ACQ);
        assert!(w.len() <= 2);
        ids.extend(w.iter().map(|w| w.wr_id));
        t.run(1);
    }
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
}

/// The ACK a Write's last segment asks for waits for the application's reply while its
/// calls make the rounds, and goes at once from the helper's: in a ping-pong of Writes the
/// reply carries it, and the peer's completion then comes with the reply's data.
#[test]
fn an_asked_for_ack_waits_for_the_reply_only_while_the_application_calls() {
    for reply in [true, false] {
        let mut t = Bed::new();
        t.connect();
        let mut a_mem = vec![1u8; 64];
        let a_addr = t.reg(
            1,
            0x100,
            1,
            &mut a_mem,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        );
        let mut b_mem = vec![2u8; 64];
        let b_addr = t.reg(
            2,
            0x200,
            2,
            &mut b_mem,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        );
        let sge = |addr, lkey| [Sge { addr, len: 8, lkey }];
        t.e.post_send(A, &write(1, &sge(a_addr, 0x100), b_addr + 8, 0x200))
            .unwrap();
        // One round sends the Write, the next places it: B's application is calling.
        t.e.progress(t.now);
        t.e.progress(t.now);
        assert_eq!(t.ab.lock().unwrap().len(), 0, "the Write was taken");
        assert_eq!(t.ba.lock().unwrap().len(), 0, "its ACK is held");
        assert!(t.poll(ACQ).is_empty());
        let acks = |t: &Bed| t.e.qps[&B].conn.as_ref().unwrap().stats().tx_acks;
        if reply {
            t.e.post_send(B, &write(2, &sge(b_addr, 0x200), a_addr + 8, 0x100))
                .unwrap();
            t.e.progress(t.now);
            assert_eq!(acks(&t), 0, "the reply carried the ACK");
            assert_eq!(&a_mem[8..16], &[2; 8]);
        } else {
            t.e.progress_unattended(t.now);
            assert_eq!(acks(&t), 1, "an ACK of its own, at once");
        }
        t.e.progress(t.now);
        let wcs = t.poll(ACQ);
        assert_eq!(wcs.len(), 1, "reply {reply}");
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, IBV_WC_SUCCESS));
    }
}

#[test]
fn lost_datagrams_are_retransmitted_on_timers() {
    let mut t = Bed::new();
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    t.e.post_recv(
        B,
        1,
        &[Sge {
            addr: raddr,
            len: 64,
            lkey: 0x200,
        }],
    )
    .unwrap();
    t.e.post_send(A, &send(1, &[])).unwrap();
    t.e.progress(t.now);
    t.ab.lock().unwrap().clear(); // lost
    let deadline = t.e.deadline().expect("retransmission timer");
    t.now = deadline;
    t.run(10);
    assert_eq!(t.poll(BCQ).len(), 1);
}

#[test]
fn armed_cq_fires_on_delivery_and_solicited_only_waits() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut t = Bed::new();
    let fired = Arc::new(AtomicUsize::new(0));
    let f = fired.clone();
    t.e.destroy_cq(BCQ);
    t.e.create_cq(
        BCQ,
        16,
        Some(Box::new(move || {
            f.fetch_add(1, Ordering::SeqCst);
        })),
    );
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    for i in 0..3 {
        t.e.post_recv(
            B,
            i,
            &[Sge {
                addr: raddr,
                len: 64,
                lkey: 0x200,
            }],
        )
        .unwrap();
    }
    assert!(t.e.arm_cq(BCQ, true));
    t.e.post_send(A, &send(1, &[])).unwrap();
    t.run(10);
    assert_eq!(fired.load(Ordering::SeqCst), 0, "not solicited");
    let solicited = SendReq {
        op: SendOp::Send {
            invalidate: None,
            solicited: true,
        }
        .into(),
        ..send(2, &[])
    };
    t.e.post_send(A, &solicited).unwrap();
    t.run(10);
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(t.poll(BCQ).len(), 2);
    t.e.arm_cq(BCQ, false);
    t.e.post_send(A, &send(3, &[])).unwrap();
    t.run(10);
    assert_eq!(fired.load(Ordering::SeqCst), 2);
}

#[test]
fn send_with_invalidate_reports_and_invalidates_the_stag() {
    let mut t = Bed::new();
    t.connect();
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    let mut target = vec![0u8; 64];
    let taddr = t.reg(
        2,
        0x300,
        2,
        &mut target,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    t.e.post_recv(
        B,
        1,
        &[Sge {
            addr: raddr,
            len: 64,
            lkey: 0x200,
        }],
    )
    .unwrap();
    let wr = SendReq {
        op: SendOp::Send {
            invalidate: Some(0x300),
            solicited: false,
        }
        .into(),
        ..send(1, &[])
    };
    t.e.post_send(A, &wr).unwrap();
    t.run(10);
    let wcs = t.poll(BCQ);
    assert_eq!(wcs[0].wc_flags, IBV_WC_WITH_INV);
    // SAFETY: the union's members are all u32.
    assert_eq!(unsafe { wcs[0].__bindgen_anon_1.invalidated_rkey }, 0x300);
    assert!(!t.e.mrs.get(2, 0x300).unwrap().region.valid);
    // A write through the invalidated STag is refused: nothing placed.
    let mut src = vec![7u8; 8];
    let saddr = t.reg(1, 0x100, 1, &mut src, Access::NONE);
    let s = [Sge {
        addr: saddr,
        len: 8,
        lkey: 0x100,
    }];
    let wr = write(2, &s, taddr, 0x300);
    t.e.post_send(A, &wr).unwrap();
    t.run(10);
    assert_eq!(target, vec![0u8; 64]);
    let wcs = t.poll(ACQ);
    assert!(wcs
        .iter()
        .any(|w| w.wr_id == 2 && w.status == IBV_WC_REM_ACCESS_ERR));
}

#[test]
fn zero_entry_queues_refuse_posts() {
    let mut t = Bed::new();
    let mut i = init(1, ACQ);
    i.max_send_wr = 0;
    i.max_recv_wr = 0;
    t.e.create_qp((1, 11), i);
    assert_eq!(
        t.e.post_send((1, 11), &send(1, &[])).map_err(|e| e.errno()),
        Err(libc::ENOMEM)
    );
    assert_eq!(
        t.e.post_recv((1, 11), 1, &[]).map_err(|e| e.errno()),
        Err(libc::ENOMEM)
    );
}

mod srq;

mod mw;

mod ack;

mod bell;

mod rounds;
