//! Two QPs of one engine (devices 1 and 2) connected through in-memory
//! queues, with the handshake done the way urdmad does it.

use super::*;
use rdma_core_sys::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use trp::{Config, Connecting, Region};
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

    /// Posts receive `wr_id` on `qp`: one SGE of `len` bytes at `addr` in MR `lkey`.
    fn recv_at(&mut self, qp: QpKey, wr_id: u64, addr: u64, len: u32, lkey: u32) {
        self.e
            .post_recv(qp, wr_id, &[Sge { addr, len, lkey }])
            .unwrap();
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
    t.recv_at(B, 7, raddr, 64, 0x200);
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
fn error_before_connecting_flushes_receives() {
    let mut t = Bed::new();
    let mut rbuf = vec![0u8; 8];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    t.recv_at(B, 1, raddr, 8, 0x200);
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

/// A flow that says when it is dropped and whether it heard of a fork, and has a slot of
/// figures when the test gives it one (as urdmad's table would).
struct Watched {
    inner: MemFlow,
    dropped: Arc<AtomicBool>,
    forked: Arc<AtomicBool>,
    slot: Option<Arc<urdma_shared::qpstats::Slot>>,
}

impl Flow for Watched {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        self.inner.receive(handle)
    }
    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        self.inner.transmit(datagram, fill)
    }
    fn forked(&mut self) {
        self.forked.store(true, Ordering::SeqCst);
    }
    fn figures(&self) -> Option<&urdma_shared::qpstats::Slot> {
        self.slot.as_deref()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

mod srq;

mod mw;

mod ack;

mod bell;

mod verbs;

mod ends;

mod rounds;
