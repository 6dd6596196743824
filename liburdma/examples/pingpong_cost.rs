//! The provider's own work per message of a ping-pong of 64-byte RDMA Writes, as
//! `ib_write_lat` makes it, for callgrind: two engines (two processes' worth), one QP each,
//! whose frames go through in-memory rings with their Ethernet, IPv4 and UDP headers built
//! and checked as on the direct path.
//!
//! ```text
//! cargo build --release -p liburdma --example pingpong_cost
//! B=target/release/examples/pingpong_cost
//! for n in 1000 11000; do
//!   valgrind --tool=callgrind --callgrind-out-file=pp-$n.out \
//!     --toggle-collect='urdma::engine::Engine::*' $B $n
//! done
//! # per message, both ends = (Ir(11000) - Ir(1000)) / 10000
//! ```
//!
//! Each message costs what the two applications' calls cost: the sender's `ibv_post_send`
//! (the post and the round of its own QP), and the `ibv_poll_cq` calls of both ends, each a
//! round over the process's QPs and a look at the CQ: the receiver's that finds the Write
//! (and, in it, the ACK of its own last Write), the sender's that finds nothing (a spin).
//! `$B N idle` runs N spins only: a round that finds nothing, the cost of one turn of an
//! application's polling loop. `$B N SIZE` makes the Writes SIZE bytes (at most 65536)
//! instead of 64: the cost of full segments.

use std::collections::VecDeque;
use std::time::Duration;

use trp::{Access, Connecting, Instant, Region, SendOp, Sge};
use urdma::engine::{Engine, Flow, QpInit, QpKey, SendReq};
use urdma_shared::frame::{self, Endpoints, HEADERS};
use urdma_shared::proto::{Connected, Role};

/// Frames one way: buffers kept for reuse, so that the harness allocates nothing per frame.
#[derive(Default)]
struct Wire {
    /// Each frame's buffer and length.
    frames: VecDeque<(Vec<u8>, usize)>,
    spare: Vec<Vec<u8>>,
}

/// One end's flow: frames out to `tx`, in from `rx` (raw pointers: the two ends' flows share
/// the wires, and the harness is one thread).
struct FrameFlow {
    rx: *mut Wire,
    tx: *mut Wire,
    ep: Endpoints,
    /// The QP's figures, kept as for urdmad's table (`URDMA_COST_NO_FIGURES` set: none).
    figures: Option<Box<urdma_shared::qpstats::Slot>>,
}

// SAFETY: the harness never moves a flow to another thread.
unsafe impl Send for FrameFlow {}

impl Flow for FrameFlow {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        // SAFETY: the wires outlive the engines, and one thread uses them.
        let rx = unsafe { &mut *self.rx };
        let n = rx.frames.len().min(32);
        if n == 0 {
            return 0;
        }
        {
            let mut payloads: [&[u8]; 32] = [&[]; 32];
            let mut k = 0;
            for (f, len) in rx.frames.range(..n) {
                if let Some(p) = frame::payload(&f[..*len], &self.ep) {
                    payloads[k] = p;
                    k += 1;
                }
            }
            handle(&payloads[..k]);
        }
        for (f, _) in rx.frames.drain(..n) {
            rx.spare.push(f);
        }
        n
    }

    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        // SAFETY: as in receive.
        let tx = unsafe { &mut *self.tx };
        let mut sent = 0;
        loop {
            // Every buffer has room for a whole datagram; a frame's length is its own.
            let mut buf = tx
                .spare
                .pop()
                .unwrap_or_else(|| vec![0; HEADERS + datagram]);
            match fill(&mut buf[HEADERS..HEADERS + datagram]) {
                Some(n) => {
                    let len = frame::write_headers(&mut buf, &self.ep, n);
                    tx.frames.push_back((buf, len));
                    sent += 1;
                }
                None => {
                    tx.spare.push(buf);
                    return sent;
                }
            }
        }
    }

    fn figures(&self) -> Option<&urdma_shared::qpstats::Slot> {
        self.figures.as_deref()
    }
}

const QP: QpKey = (1, 1);
const CQ: (u32, u32) = (1, 1);
const STAG: u32 = 0x100;
/// The largest Write; the peer's lands at this offset of the buffer.
const MAX: usize = 65536;

struct End {
    e: Engine,
    /// The application's buffer: what it writes, and where the peer's Write lands.
    buf: Vec<u8>,
}

impl End {
    fn new() -> End {
        let mut e = Engine::new();
        e.create_cq(CQ, 64, None);
        e.create_qp(
            QP,
            QpInit {
                pd: 1,
                send_cq: CQ,
                recv_cq: CQ,
                sig_all: false,
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
                srq: None,
            },
        );
        let mut buf = vec![0u8; 2 * MAX];
        let r = Region::new(
            1,
            buf.as_mut_ptr() as u64,
            buf.len() as u64,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        );
        e.mrs.insert(1, STAG, r, 0);
        End { e, buf }
    }

    fn addr(&mut self) -> u64 {
        self.buf.as_mut_ptr() as u64
    }

    /// `ibv_post_send` of a Write of `len` bytes of the first half of our buffer to the
    /// peer's second half.
    fn post(&mut self, peer: u64, len: u32, now: Instant) {
        let s = [Sge {
            addr: self.addr(),
            len,
            lkey: STAG,
        }];
        let wr = SendReq {
            wr_id: 1,
            op: SendOp::RdmaWrite {
                remote_addr: peer + MAX as u64,
                rkey: STAG,
            }
            .into(),
            sges: &s,
            signaled: true,
            inline: None,
        };
        self.e.post_send(QP, &wr).expect("post");
        self.e
            .progress_after_post(QP, now, Duration::from_millis(10));
    }

    /// `ibv_poll_cq`: a round, then the CQ; how many completions it returned.
    fn poll(&mut self, now: Instant) -> usize {
        // SAFETY: ibv_wc is plain C data.
        let mut wc: [rdma_core_sys::ibv_wc; 4] = unsafe { std::mem::zeroed() };
        self.e.progress(now);
        self.e.poll_cq(CQ, &mut wc, now).expect("CQ")
    }
}

impl FrameFlow {
    /// The flow of the connection `c` names, frames in from `rx` and out to `tx`.
    fn new(c: &Connected, rx: *mut Wire, tx: *mut Wire) -> FrameFlow {
        FrameFlow {
            rx,
            tx,
            ep: Endpoints {
                local_mac: [2, 0, 0, 0, 0, 1],
                remote_mac: [2, 0, 0, 0, 0, 2],
                local: c.local,
                remote: c.remote,
            },
            figures: std::env::var_os("URDMA_COST_NO_FIGURES")
                .is_none()
                .then(Default::default),
        }
    }
}

/// Connects `a` (active) to `b` (passive) as urdmad hands connections over.
fn connect(a: &mut End, b: &mut End, ab: *mut Wire, ba: *mut Wire, now: Instant) {
    let cfg = trp::Config {
        pd: 1,
        ..urdma_shared::proto::connection_config(16, 16, 1472, true)
    };
    let mut c = Connecting::new(cfg, 0xA, 100, b"", now).expect("connecting");
    let mut req = vec![0u8; 1500];
    let n = c.poll_transmit(now, &mut req).expect("request");
    req.truncate(n);
    let passive = Connected {
        dev: 1,
        qpn: 1,
        role: Role::Passive,
        port: 0,
        local: "10.0.0.2:7000".parse().expect("address"),
        remote: "10.0.0.1:7001".parse().expect("address"),
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
        pdata: Vec::new(),
        pkt: req,
        accept_sent: false,
        park: false,
        reuse: 0,
    };
    let fb = FrameFlow::new(&passive, ab, ba);
    b.e.connected(QP, &passive, Box::new(fb), now)
        .expect("passive");
    b.e.progress(now);
    // SAFETY: one thread, the wire outlives this call.
    let (accept, len) = unsafe { &mut *ba }.frames.pop_front().expect("Accept");
    let accept = frame::datagram(&accept[..len])
        .expect("Accept's frame")
        .payload
        .to_vec();
    let active = Connected {
        role: Role::Active,
        local: passive.remote,
        remote: passive.local,
        conn: 0xA,
        isn: 100,
        pkt: accept,
        accept_sent: false,
        park: false,
        reuse: 0,
        ..passive
    };
    let fa = FrameFlow::new(&active, ba, ab);
    a.e.connected(QP, &active, Box::new(fa), now)
        .expect("active");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = || -> ! {
        eprintln!("usage: pingpong_cost MESSAGES [idle | SIZE], SIZE from 1 to 65536");
        std::process::exit(2)
    };
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| usage());
    let mode = args.next();
    let idle = mode.as_deref() == Some("idle");
    let size: u32 = match mode.as_deref() {
        None | Some("idle") => 64,
        Some(s) => s
            .parse()
            .ok()
            .filter(|&n| (1..=MAX as u32).contains(&n))
            .unwrap_or_else(|| usage()),
    };
    if args.next().is_some() {
        usage();
    }
    // The mark is the Write's last byte, which arrives last.
    let last = size as usize - 1;
    let mut wires = Box::new([Wire::default(), Wire::default()]);
    let (ab, ba): (*mut Wire, *mut Wire) = {
        let [x, y] = &mut *wires;
        (x, y)
    };
    let mut now = Instant(1_000_000_000);
    let step = Duration::from_micros(15);
    let mut a = End::new();
    let mut b = End::new();
    connect(&mut a, &mut b, ab, ba, now);
    let (pa, pb) = (a.addr(), b.addr());
    let mut sent = 0u64;
    if idle {
        for _ in 0..n {
            now = now + step;
            a.poll(now);
        }
    } else {
        // Each side writes a new mark and posts, and the other polls its CQ until the mark
        // has landed in its memory (perftest's `ib_write_lat` polls the memory, and its CQ
        // for the completion of its own last Write, which the peer's Write acknowledges);
        // the sender spins on its CQ meanwhile and finds nothing new.
        let (mut x, mut y, mut px) = (&mut a, &mut b, pb);
        let mut py = pa;
        while sent < 2 * n {
            let mark = (sent % 251) as u8 + 1;
            now = now + step;
            x.buf[last] = mark;
            x.post(px, size, now);
            sent += 1;
            for _ in 0..100 {
                now = now + step;
                y.poll(now);
                if y.buf[MAX + last] == mark {
                    break;
                }
                x.poll(now);
            }
            assert_eq!(y.buf[MAX + last], mark, "message {sent} did not arrive");
            std::mem::swap(&mut x, &mut y);
            std::mem::swap(&mut px, &mut py);
        }
    }
    println!("messages {sent}");
}
