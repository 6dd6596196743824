//! A deterministic network simulator: two endpoints, a virtual clock and a
//! seeded lossy link in each direction. Used by the tests and benchmarks,
//! and usable by drivers that want to test against the core. Built with the
//! `sim` feature only.

use crate::conn::Connection;
use crate::mr::{Access, Region, VecMemory};
use crate::setup::{ConnectOutcome, Connecting, Incoming};
use crate::time::Instant;
use crate::{Config, SendOp, SendWr, Sge};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// SplitMix64: small, fast, and the same on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Faults and shape of one direction of the link.
#[derive(Clone, Copy, Debug)]
pub struct LinkConfig {
    /// One-way propagation delay (ns).
    pub delay: u64,
    /// Extra random delay in `0..jitter` (ns) for every packet.
    pub jitter: u64,
    /// Bits per second; 0 = unlimited.
    pub rate_bps: u64,
    /// Tail-drop when the transmit queue holds more than this (ns of data).
    pub queue_limit: u64,
    pub loss: f64,
    pub duplicate: f64,
    /// Probability a packet is held back by up to `reorder_delay`.
    pub reorder: f64,
    pub reorder_delay: u64,
    /// Probability one byte is flipped. UDP's checksum would drop such a
    /// packet in a real network, so `corrupt_detected` decides whether the
    /// packet is dropped (checksum) or delivered corrupted (to exercise the
    /// parsers).
    pub corrupt: f64,
    pub corrupt_detected: bool,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            delay: 50_000,
            jitter: 0,
            rate_bps: 10_000_000_000,
            queue_limit: 1_000_000,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: 0,
            corrupt: 0.0,
            corrupt_detected: true,
        }
    }
}

impl LinkConfig {
    /// A hostile link: `loss` random loss plus reordering, duplication and
    /// (checksum-detected) corruption.
    pub fn lossy(loss: f64) -> Self {
        LinkConfig {
            jitter: 5_000,
            loss,
            duplicate: 0.01,
            reorder: 0.05,
            reorder_delay: 100_000,
            corrupt: 0.005,
            ..Default::default()
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub sent: u64,
    pub delivered: u64,
    pub bytes_delivered: u64,
    pub lost: u64,
    pub queue_drops: u64,
    pub duplicated: u64,
    pub corrupted: u64,
}

/// One direction of the simulated network.
#[derive(Debug)]
pub struct Link {
    pub cfg: LinkConfig,
    pub up: bool,
    rng: Rng,
    queue: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>,
    free_at: u64,
    seq: u64,
    pub stats: LinkStats,
    /// When set, every datagram offered to the link is recorded here.
    pub capture: Option<Vec<Vec<u8>>>,
}

impl Link {
    pub fn new(cfg: LinkConfig, seed: u64) -> Self {
        Link {
            cfg,
            up: true,
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            free_at: 0,
            seq: 0,
            stats: LinkStats::default(),
            capture: None,
        }
    }

    pub fn send(&mut self, now: Instant, bytes: &[u8]) {
        let now = now.0;
        self.stats.sent += 1;
        if let Some(c) = self.capture.as_mut() {
            c.push(bytes.to_vec());
        }
        if !self.up {
            self.stats.lost += 1;
            return;
        }
        let start = self.free_at.max(now);
        if start - now > self.cfg.queue_limit {
            self.stats.queue_drops += 1;
            return;
        }
        let bits = (bytes.len() as u64 + 28) * 8;
        self.free_at = start
            + (bits * 1_000_000_000)
                .checked_div(self.cfg.rate_bps)
                .unwrap_or(0);
        if self.rng.chance(self.cfg.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(self.cfg.duplicate) {
            2
        } else {
            1
        };
        self.stats.duplicated += copies - 1;
        for _ in 0..copies {
            let mut at = self.free_at + self.cfg.delay;
            if self.cfg.jitter > 0 {
                at += self.rng.below(self.cfg.jitter);
            }
            if self.rng.chance(self.cfg.reorder) && self.cfg.reorder_delay > 0 {
                at += self.rng.below(self.cfg.reorder_delay);
            }
            let mut p = bytes.to_vec();
            if !p.is_empty() && self.rng.chance(self.cfg.corrupt) {
                self.stats.corrupted += 1;
                if self.cfg.corrupt_detected {
                    continue;
                }
                let i = self.rng.below(p.len() as u64) as usize;
                p[i] ^= 1 << self.rng.below(8);
            }
            self.seq += 1;
            self.queue.push(Reverse((at, self.seq, p)));
        }
    }

    pub fn next_delivery(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((t, _, _))| Instant(*t))
    }

    pub fn pop_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self
            .queue
            .peek()
            .is_some_and(|Reverse((t, _, _))| *t <= now.0)
        {
            let Reverse((_, _, p)) = self.queue.pop()?;
            self.stats.delivered += 1;
            self.stats.bytes_delivered += p.len() as u64;
            Some(p)
        } else {
            None
        }
    }
}

#[derive(Debug)]
pub struct Endpoint {
    pub conn: Connection,
    pub mem: VecMemory,
}

/// Two connected endpoints and the links between them.
#[derive(Debug)]
pub struct Pair {
    pub now: Instant,
    pub a: Endpoint,
    pub b: Endpoint,
    /// a -> b
    pub ab: Link,
    /// b -> a
    pub ba: Link,
    /// Drive both ends through the burst calls (`poll_transmit_burst`,
    /// `handle_datagram_burst`) instead of one datagram per call.
    pub bursts: bool,
    buf: Vec<u8>,
    /// Made at the first step with `bursts` set.
    burst_bufs: Vec<Vec<u8>>,
}

/// Puts on `link` everything `from` wants to send; bounded so a connection
/// that never runs dry cannot hang the simulation.
fn transmit_all(now: Instant, from: &mut Endpoint, link: &mut Link, buf: &mut [u8]) {
    for _ in 0..100_000 {
        let Some(n) = from.conn.poll_transmit(now, &from.mem, buf) else {
            break;
        };
        link.send(now, &buf[..n]);
    }
}

/// The same through `poll_transmit_burst`, 32 datagrams per call.
fn transmit_all_in_bursts(
    now: Instant,
    from: &mut Endpoint,
    link: &mut Link,
    bufs: &mut [Vec<u8>],
) {
    let mut lens = [0usize; 32];
    for _ in 0..100_000 / 32 {
        let n = from
            .conn
            .poll_transmit_burst(now, &from.mem, bufs, &mut lens);
        for (b, &len) in bufs.iter().zip(&lens).take(n) {
            link.send(now, &b[..len]);
        }
        if n < bufs.len() {
            break;
        }
    }
}

fn earliest(ts: &[Option<Instant>]) -> Option<Instant> {
    ts.iter().flatten().copied().min()
}

/// The memory the simulated tests start from: `size` bytes in protection
/// domain `pd`, the lower half registered as [`LKEY`] for local access (the
/// sources and sinks of SGEs), the upper half as [`RKEY`] for the peer's
/// RDMA Writes, Reads and atomics. Neither may be invalidated by a remote Send.
pub fn memory(pd: u32, size: u64) -> VecMemory {
    let mut m = VecMemory::new(size as usize);
    m.register(
        LKEY,
        Region::new(pd, 0, size / 2, Access::LOCAL_WRITE),
        false,
    );
    m.register(
        RKEY,
        Region::new(
            pd,
            size / 2,
            size / 2,
            Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ),
        false,
    );
    m
}

/// The STag of the local half of [`memory`].
pub const LKEY: u32 = 1;
/// The STag of the remote half of [`memory`].
pub const RKEY: u32 = 2;
/// The size of the memory [`PairBuilder`] gives each end unless told otherwise.
pub const MEMORY_SIZE: u64 = 1 << 20;

/// How to set up a [`Pair`]: every field has a default, so a test names
/// only what it cares about.
///
/// ```
/// use trp::sim::{LinkConfig, Pair};
///
/// let p = Pair::builder()
///     .link(LinkConfig::lossy(0.01))
///     .seed(7)
///     .connect()
///     .unwrap();
/// assert_eq!(p.a.conn.state(), trp::QpState::Rts);
/// ```
#[derive(Debug)]
pub struct PairBuilder {
    cfg_a: Config,
    cfg_b: Config,
    link: LinkConfig,
    seed: u64,
    memory_size: u64,
    memories: Option<(VecMemory, VecMemory)>,
    isns: Option<(u32, u32)>,
}

impl Default for PairBuilder {
    fn default() -> Self {
        PairBuilder {
            cfg_a: Config::default(),
            cfg_b: Config::default(),
            link: LinkConfig::default(),
            seed: 0,
            memory_size: MEMORY_SIZE,
            memories: None,
            isns: None,
        }
    }
}

impl PairBuilder {
    /// The same configuration for both ends (default: `Config::default()`).
    pub fn config(self, cfg: Config) -> Self {
        self.configs(cfg, cfg)
    }
    /// A different configuration for each end.
    pub fn configs(mut self, a: Config, b: Config) -> Self {
        self.cfg_a = a;
        self.cfg_b = b;
        self
    }
    /// Both directions of the link (default: `LinkConfig::default()`).
    pub fn link(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }
    /// Seeds the links' faults and the initial PSNs (default: 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Gives each end [`memory`] of `size` bytes, in its configuration's
    /// protection domain (default: [`MEMORY_SIZE`]).
    pub fn memory_size(mut self, size: u64) -> Self {
        self.memory_size = size;
        self
    }
    /// Gives the ends these memories instead of [`memory`].
    pub fn memories(mut self, a: VecMemory, b: VecMemory) -> Self {
        self.memories = Some((a, b));
        self
    }
    /// Chosen initial PSNs (a, b) instead of ones drawn from the seed.
    pub fn isns(mut self, a: u32, b: u32) -> Self {
        self.isns = Some((a, b));
        self
    }
    /// Runs the handshake over the (possibly lossy) links.
    pub fn connect(self) -> Result<Pair, String> {
        let PairBuilder {
            cfg_a,
            cfg_b,
            link,
            seed,
            memory_size,
            memories,
            isns,
        } = self;
        let (mem_a, mem_b) = memories
            .unwrap_or_else(|| (memory(cfg_a.pd, memory_size), memory(cfg_b.pd, memory_size)));
        let mut rng = Rng::new(seed);
        let mut ab = Link::new(link, rng.next_u64());
        let mut ba = Link::new(link, rng.next_u64());
        let mut now = Instant(0);
        let (isn_a, isn_b) = isns.unwrap_or((rng.next_u64() as u32, rng.next_u64() as u32));
        let mut connecting = Some(
            Connecting::new(cfg_a, 0xA, isn_a, b"hello from a", now).map_err(|e| e.to_string())?,
        );
        let mut a: Option<Connection> = None;
        let mut b: Option<Connection> = None;
        let mut buf = vec![0u8; 65536];
        let mem_b_ref = &mem_b;
        for _ in 0..100_000 {
            if let Some(c) = connecting.as_mut() {
                while let Some(n) = c.poll_transmit(now, &mut buf) {
                    ab.send(now, &buf[..n]);
                }
            }
            if let Some(bc) = b.as_mut() {
                while let Some(n) = bc.poll_transmit(now, mem_b_ref, &mut buf) {
                    ba.send(now, &buf[..n]);
                }
            }
            if let Some(ac) = a.as_mut() {
                while let Some(n) = ac.poll_transmit(now, &mem_a, &mut buf) {
                    ab.send(now, &buf[..n]);
                }
                // Established on both sides once B's Accept is acknowledged.
                if b.is_some() && ab.next_delivery().is_none() && ba.next_delivery().is_none() {
                    let (a, b) = (a.take().unwrap(), b.take().unwrap());
                    return Ok(Pair {
                        now,
                        a: Endpoint {
                            conn: a,
                            mem: mem_a,
                        },
                        b: Endpoint {
                            conn: b,
                            mem: mem_b,
                        },
                        ab,
                        ba,
                        bursts: false,
                        burst_bufs: Vec::new(),
                        buf,
                    });
                }
            }
            let next = earliest(&[
                ab.next_delivery(),
                ba.next_delivery(),
                connecting.as_ref().and_then(|c| c.poll_timeout()),
                a.as_ref().and_then(|c| c.poll_timeout()),
                b.as_ref().and_then(|c| c.poll_timeout()),
            ])
            .ok_or("handshake stalled")?;
            now = now.max(next);
            let mut mem_scratch = VecMemory::new(0);
            while let Some(p) = ab.pop_due(now) {
                match b.as_mut() {
                    None => {
                        if let Ok(inc) = Incoming::parse(&p) {
                            assert_eq!(inc.private_data(), b"hello from a");
                            b = Some(
                                inc.accept(cfg_b, 0xB, isn_b, b"hello from b")
                                    .map_err(|e| e.to_string())?,
                            );
                        }
                    }
                    Some(bc) => {
                        let _ = bc.handle_datagram(now, &mut mem_scratch, &p);
                    }
                }
            }
            while let Some(p) = ba.pop_due(now) {
                if let Some(c) = connecting.take() {
                    match c.handle_datagram(now, &p) {
                        ConnectOutcome::Pending(c) => connecting = Some(c),
                        ConnectOutcome::Established {
                            conn, private_data, ..
                        } => {
                            assert_eq!(private_data, b"hello from b");
                            a = Some(conn);
                        }
                        o => return Err(format!("handshake failed: {o:?}")),
                    }
                } else if let Some(ac) = a.as_mut() {
                    let _ = ac.handle_datagram(now, &mut mem_scratch, &p);
                }
            }
            if let Some(c) = connecting.take() {
                match c.handle_timeout(now) {
                    ConnectOutcome::Pending(c) => connecting = Some(c),
                    o => return Err(format!("handshake failed: {o:?}")),
                }
            }
            for c in [a.as_mut(), b.as_mut()].into_iter().flatten() {
                if c.poll_timeout().is_some_and(|t| t <= now) {
                    c.handle_timeout(now);
                }
            }
        }
        Err("handshake did not finish".into())
    }
}

impl Pair {
    /// Starts setting up a pair; see [`PairBuilder`].
    pub fn builder() -> PairBuilder {
        PairBuilder::default()
    }

    /// Sends everything both sides want to send, then advances the clock to
    /// the next event and processes it. Returns false when nothing is left
    /// to happen.
    pub fn step(&mut self) -> bool {
        if self.bursts {
            if self.burst_bufs.is_empty() {
                self.burst_bufs = vec![vec![0; self.buf.len()]; 32];
            }
            transmit_all_in_bursts(self.now, &mut self.a, &mut self.ab, &mut self.burst_bufs);
            transmit_all_in_bursts(self.now, &mut self.b, &mut self.ba, &mut self.burst_bufs);
        } else {
            transmit_all(self.now, &mut self.a, &mut self.ab, &mut self.buf);
            transmit_all(self.now, &mut self.b, &mut self.ba, &mut self.buf);
        }
        let Some(next) = earliest(&[
            self.ab.next_delivery(),
            self.ba.next_delivery(),
            self.a.conn.poll_timeout(),
            self.b.conn.poll_timeout(),
        ]) else {
            return false;
        };
        self.now = self.now.max(next);
        let now = self.now;
        // Deliver one packet per direction at a time so each side can answer
        // (ACKs) in between, as a real receive loop would.
        loop {
            let mut any = false;
            for (link, to) in [(&mut self.ab, &mut self.b), (&mut self.ba, &mut self.a)] {
                if let Some(p) = link.pop_due(now) {
                    if self.bursts {
                        to.conn.handle_datagram_burst(now, &mut to.mem, &[p]);
                    } else {
                        let _ = to.conn.handle_datagram(now, &mut to.mem, &p);
                    }
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        for e in [&mut self.a, &mut self.b] {
            if e.conn.poll_timeout().is_some_and(|t| t <= now) {
                e.conn.handle_timeout(now);
            }
        }
        true
    }

    /// Steps until `done` holds or virtual time passes `limit`; returns
    /// whether `done` held.
    /// Posts `n` RDMA Writes of `len` bytes from a's memory at 0 (`LKEY`) to b's at `len`
    /// (`RKEY`): the stream the goodput tests measure. The memories need `2 * len` bytes.
    pub fn post_writes(&mut self, n: u64, len: u32, signaled: bool) {
        let sge = [Sge {
            addr: 0,
            len,
            lkey: LKEY,
        }];
        for i in 0..n {
            let wr = SendWr {
                wr_id: i,
                op: SendOp::RdmaWrite {
                    remote_addr: u64::from(len),
                    rkey: RKEY,
                },
                sges: &sge,
                signaled,
            };
            self.a.conn.post_send(&self.a.mem, &wr).unwrap();
        }
    }

    pub fn run_until(&mut self, limit: Instant, mut done: impl FnMut(&mut Pair) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now > limit || !self.step() {
                return done(self);
            }
        }
    }
}
