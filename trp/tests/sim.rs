//! Randomised workloads through the deterministic simulator, checked
//! against a reference model.
//!
//! A failing case prints its seed and loss rate; replay it with
//! `TRP_SIM_SEED=<seed> TRP_SIM_LOSS=<percent> cargo test -p trp --test sim`.
//! `TRP_SIM_SOAK=<n>` runs n seeds per loss rate instead of the CI default.

use trp::sim::{LinkConfig, Pair, Rng, LKEY, RKEY};
use trp::{
    Access, AtomicOp, Completion, Config, Memory, Queue, RecvWr, Region, SendOp, SendWr, Sge, Srq,
    VecMemory, WcOpcode, WcStatus,
};

/// Not 0, so a PD that fails to reach a check shows.
const PD: u32 = 3;

/// Bump allocator over one endpoint's flat memory.
struct Arena {
    next: u64,
    end: u64,
}

impl Arena {
    fn alloc(&mut self, rng: &mut Rng, len: u64) -> u64 {
        let gap = rng.below(64);
        let at = self.next + gap;
        self.next = at + len;
        assert!(self.next <= self.end, "arena exhausted");
        at
    }
}

#[derive(Debug, Clone)]
enum Check {
    /// `len` bytes at `dst` on the receiving side equal `src` pieces.
    Bytes {
        src: Vec<(u64, u32)>,
        dst: Vec<(u64, u32)>,
        src_side: usize,
    },
    Invalidated {
        stag: u32,
    },
    /// The 64-bit integer (native order) at `at` across `pieces` is `want`.
    Value {
        pieces: Vec<(u64, u32)>,
        want: u64,
    },
}

/// Atomic targets in each side's remote area, and the values the model
/// says they hold: atomics run once each, in the order they were posted.
const COUNTERS: usize = 4;

struct Side {
    local: Arena,
    remote: Arena,
    next_stag: u32,
    counters: [(u64, u64); COUNTERS],
}

struct Expect {
    /// Expected completions per side, in order.
    cq: [Vec<Completion>; 2],
    checks: Vec<(usize, Check)>,
}

fn split(rng: &mut Rng, arena: &mut Arena, len: u64) -> Vec<Sge> {
    let pieces = if len >= 3 { 1 + rng.below(3) } else { 1 };
    let mut out = Vec::new();
    let mut left = len;
    for i in 0..pieces {
        let l = if i + 1 == pieces {
            left
        } else {
            rng.below(left + 1)
        };
        left -= l;
        out.push(Sge {
            addr: arena.alloc(rng, l),
            len: l as u32,
            lkey: LKEY,
        });
    }
    out
}

fn size(rng: &mut Rng, budget: &mut u64) -> u64 {
    let s = match rng.below(100) {
        0..50 => rng.below(257),
        50..85 => rng.below(16 * 1024 + 1),
        85..98 => rng.below(256 * 1024 + 1),
        _ => rng.below(4 * 1024 * 1024 + 1),
    };
    let s = s.min(*budget);
    *budget -= s;
    s
}

fn recv_completion(
    wr_id: u64,
    op: WcOpcode,
    len: u32,
    imm: Option<u32>,
    inv: Option<u32>,
    sol: bool,
) -> Completion {
    Completion {
        wr_id,
        queue: Queue::Recv,
        status: WcStatus::Success,
        opcode: op,
        byte_len: len,
        imm,
        invalidated: inv,
        solicited: sol,
    }
}

/// Posts `ops` random operations in each direction; returns what must happen.
fn post_workload(p: &mut Pair, rng: &mut Rng, ops: usize, budget: u64, mem_size: u64) -> Expect {
    let mut sides = [0, 1].map(|_| Side {
        local: Arena {
            next: 4096,
            end: mem_size / 2,
        },
        remote: Arena {
            next: mem_size / 2,
            end: mem_size,
        },
        next_stag: 0x1000,
        counters: [(0, 0); COUNTERS],
    });
    for (x, side) in sides.iter_mut().enumerate() {
        for c in 0..COUNTERS {
            let at = side.remote.alloc(rng, 16).next_multiple_of(8);
            let v = rng.next_u64();
            let (mine, _) = ends(p, x);
            mine.write(at, &v.to_ne_bytes());
            side.counters[c] = (at, v);
        }
    }
    let mut exp = Expect {
        cq: [Vec::new(), Vec::new()],
        checks: Vec::new(),
    };
    let mut budgets = [budget, budget];
    let mut wr_id = 1u64;
    for i in 0..ops * 2 {
        let x = i % 2;
        let y = 1 - x;
        let len = size(rng, &mut budgets[x]);
        let kind = rng.below(100);
        let signaled = rng.chance(0.8) || i + 2 >= ops * 2;
        let src_sges = split(rng, &mut sides[x].local, len);
        for s in &src_sges {
            let (xe, _) = ends(p, x);
            let mut data = vec![0u8; s.len as usize];
            rng.fill(&mut data);
            xe.write(s.addr, &data);
        }
        let id = wr_id;
        wr_id += 2;
        let mut sges = src_sges.clone();
        let mut byte_len = len as u32;
        let (op, wc) = match kind {
            0..30 => {
                let invalidate = if rng.chance(0.2) {
                    let stag = sides[y].next_stag;
                    sides[y].next_stag += 1;
                    let (_, ye) = ends(p, x);
                    ye.register(stag, Region::new(PD, 0, 1, Access::REMOTE_WRITE), true);
                    exp.checks.push((y, Check::Invalidated { stag }));
                    Some(stag)
                } else {
                    None
                };
                let solicited = rng.chance(0.3);
                let extra = rng.below(64);
                let rsges = split(rng, &mut sides[y].local, len + extra);
                post_recv(p, y, id + 1, &rsges);
                exp.cq[y].push(recv_completion(
                    id + 1,
                    WcOpcode::Recv,
                    len as u32,
                    None,
                    invalidate,
                    solicited,
                ));
                exp.checks.push((
                    y,
                    Check::Bytes {
                        src: pieces(&src_sges),
                        dst: pieces(&rsges),
                        src_side: x,
                    },
                ));
                (
                    SendOp::Send {
                        invalidate,
                        solicited,
                    },
                    WcOpcode::Send,
                )
            }
            30..70 => {
                let dst = sides[y].remote.alloc(rng, len);
                let dst_piece = vec![(dst, len as u32)];
                exp.checks.push((
                    y,
                    Check::Bytes {
                        src: pieces(&src_sges),
                        dst: dst_piece,
                        src_side: x,
                    },
                ));
                if kind < 55 {
                    (
                        SendOp::RdmaWrite {
                            remote_addr: dst,
                            rkey: RKEY,
                        },
                        WcOpcode::RdmaWrite,
                    )
                } else {
                    let imm = rng.next_u64() as u32;
                    let solicited = rng.chance(0.3);
                    let rsges = if rng.chance(0.5) {
                        vec![]
                    } else {
                        split(rng, &mut sides[y].local, 8)
                    };
                    post_recv(p, y, id + 1, &rsges);
                    exp.cq[y].push(recv_completion(
                        id + 1,
                        WcOpcode::RecvRdmaWithImm,
                        len as u32,
                        Some(imm),
                        None,
                        solicited,
                    ));
                    (
                        SendOp::RdmaWriteImm {
                            remote_addr: dst,
                            rkey: RKEY,
                            imm,
                            solicited,
                        },
                        WcOpcode::RdmaWrite,
                    )
                }
            }
            90.. => {
                // Atomic on one of y's counters; the value found lands in x's result SGEs.
                let c = rng.below(COUNTERS as u64) as usize;
                let (at, old) = sides[y].counters[c];
                // Verbs' plain atomics mostly, RFC 7306's masked ones now and then.
                let masked = rng.chance(0.2);
                let mask = |rng: &mut Rng| if masked { rng.next_u64() } else { u64::MAX };
                let (op, wc) = if rng.chance(0.5) {
                    let add = rng.next_u64() >> rng.below(64);
                    let fields = if masked { rng.next_u64() } else { 0 };
                    (AtomicOp::FetchAdd { add, fields }, WcOpcode::FetchAdd)
                } else {
                    let compare = if rng.chance(0.5) { old } else { rng.next_u64() };
                    let op = AtomicOp::CompareSwap {
                        compare,
                        compare_mask: mask(rng),
                        swap: rng.next_u64(),
                        swap_mask: mask(rng),
                    };
                    (op, WcOpcode::CompareSwap)
                };
                sides[y].counters[c].1 = op.apply(old);
                sges = split(rng, &mut sides[x].local, 8);
                byte_len = 8;
                exp.checks.push((
                    x,
                    Check::Value {
                        pieces: pieces(&sges),
                        want: old,
                    },
                ));
                (
                    SendOp::Atomic {
                        remote_addr: at,
                        rkey: RKEY,
                        op,
                    },
                    wc,
                )
            }
            _ => {
                // Read: y's remote area is the source, x's scatter list the sink.
                let src = sides[y].remote.alloc(rng, len);
                let mut data = vec![0u8; len as usize];
                rng.fill(&mut data);
                let (_, ye) = ends(p, x);
                ye.write(src, &data);
                exp.checks.push((
                    x,
                    Check::Bytes {
                        src: vec![(src, len as u32)],
                        dst: pieces(&src_sges),
                        src_side: y,
                    },
                ));
                (
                    SendOp::RdmaRead {
                        remote_addr: src,
                        rkey: RKEY,
                    },
                    WcOpcode::RdmaRead,
                )
            }
        };
        let wr = SendWr {
            wr_id: id,
            op,
            sges: &sges,
            signaled,
        };
        let e = if x == 0 { &mut p.a } else { &mut p.b };
        e.conn.post_send(&e.mem, &wr).expect("post_send");
        if signaled {
            exp.cq[x].push(Completion {
                wr_id: id,
                queue: Queue::Send,
                status: WcStatus::Success,
                opcode: wc,
                byte_len,
                imm: None,
                invalidated: None,
                solicited: false,
            });
        }
    }
    for (y, side) in sides.iter().enumerate() {
        for &(at, want) in &side.counters {
            exp.checks.push((
                y,
                Check::Value {
                    pieces: vec![(at, 8)],
                    want,
                },
            ));
        }
    }
    exp
}

fn pieces(s: &[Sge]) -> Vec<(u64, u32)> {
    s.iter().map(|s| (s.addr, s.len)).collect()
}

/// (x's memory, y's memory)
fn ends(p: &mut Pair, x: usize) -> (&mut VecMemory, &mut VecMemory) {
    if x == 0 {
        (&mut p.a.mem, &mut p.b.mem)
    } else {
        (&mut p.b.mem, &mut p.a.mem)
    }
}

/// Posts a receive at end `y`: to its shared receive queue if it has one.
fn post_recv(p: &mut Pair, y: usize, wr_id: u64, sges: &[Sge]) {
    let e = if y == 0 { &mut p.a } else { &mut p.b };
    let wr = RecvWr { wr_id, sges };
    match e.mem.srq.take() {
        Some(mut q) => {
            q.post(&e.mem, &wr).expect("post to the SRQ");
            e.mem.srq = Some(q);
        }
        None => e.conn.post_recv(&e.mem, &wr).expect("post_recv"),
    }
}

fn collect(bytes: &VecMemory, pieces: &[(u64, u32)]) -> Vec<u8> {
    let mut v = Vec::new();
    for &(a, l) in pieces {
        v.extend_from_slice(&bytes.bytes[a as usize..a as usize + l as usize]);
    }
    v
}

fn config() -> Config {
    Config {
        pd: PD,
        ..Config::default()
    }
}

struct Outcome {
    virtual_ns: u64,
    bytes: u64,
    stats: [trp::reliability::SenderStats; 2],
    /// Every datagram each end sent, when `Drive::capture`.
    sent: [Vec<Vec<u8>>; 2],
}

/// How the simulation drives the two ends.
#[derive(Clone, Copy, Debug)]
struct Drive {
    header_prediction: bool,
    bursts: bool,
    capture: bool,
    /// Each end's receives come from a shared receive queue.
    srq: bool,
}

impl Default for Drive {
    fn default() -> Self {
        Drive {
            header_prediction: true,
            bursts: false,
            capture: false,
            srq: false,
        }
    }
}

fn run(seed: u64, loss: f64, ops: usize, budget: u64) -> Result<Outcome, String> {
    run_on(seed, LinkConfig::lossy(loss), ops, budget)
}

fn run_on(seed: u64, link: LinkConfig, ops: usize, budget: u64) -> Result<Outcome, String> {
    run_driven(seed, link, ops, budget, Drive::default())
}

fn run_driven(
    seed: u64,
    link: LinkConfig,
    ops: usize,
    budget: u64,
    drive: Drive,
) -> Result<Outcome, String> {
    let mem_size = 2 * (budget * 2 + ops as u64 * 2 * 400 + (1 << 20));
    let mut rng = Rng::new(seed);
    let cfg = Config {
        header_prediction: drive.header_prediction,
        srq: drive.srq,
        ..config()
    };
    // Each end's memory: the lower half local (LKEY), the upper half remote (RKEY).
    let mut p = Pair::builder()
        .config(cfg)
        .link(link)
        .seed(rng.next_u64())
        .memory_size(mem_size)
        .connect()?;
    p.bursts = drive.bursts;
    if drive.srq {
        p.a.mem.srq = Some(Srq::new(PD, 1 << 20));
        p.b.mem.srq = Some(Srq::new(PD, 1 << 20));
    }
    if drive.capture {
        p.ab.capture = Some(Vec::new());
        p.ba.capture = Some(Vec::new());
    }
    let start = p.now;
    let exp = post_workload(&mut p, &mut rng, ops, budget, mem_size);
    let mut got: [Vec<Completion>; 2] = [Vec::new(), Vec::new()];
    let want = [exp.cq[0].len(), exp.cq[1].len()];
    let limit = trp::Instant(start.0 + 60_000_000_000);
    let finished = p.run_until(limit, |p| {
        while let Some(c) = p.a.conn.poll_completion() {
            got[0].push(c);
        }
        while let Some(c) = p.b.conn.poll_completion() {
            got[1].push(c);
        }
        got[0].len() >= want[0] && got[1].len() >= want[1]
    });
    let elapsed = p.now.0 - start.0;
    if !finished {
        return Err(format!(
            "did not finish in virtual time: got {}/{} and {}/{} completions, states {:?}/{:?}, events {:?}/{:?}",
            got[0].len(), want[0], got[1].len(), want[1], p.a.conn.state(), p.b.conn.state(),
            p.a.conn.poll_event(), p.b.conn.poll_event()
        ));
    }
    // Run on a little: nothing more may complete.
    let until = trp::Instant(p.now.0 + 50_000_000);
    p.run_until(until, |_| false);
    for (side, got) in got.iter_mut().enumerate() {
        let e = if side == 0 { &mut p.a } else { &mut p.b };
        while let Some(c) = e.conn.poll_completion() {
            got.push(c);
        }
        // Send completions are in posting order; receive completions in
        // message order. Compare each queue on its own.
        for q in [Queue::Send, Queue::Recv] {
            let g: Vec<_> = got.iter().filter(|c| c.queue == q).collect();
            let w: Vec<_> = exp.cq[side].iter().filter(|c| c.queue == q).collect();
            if g != w {
                let i = g
                    .iter()
                    .zip(&w)
                    .position(|(a, b)| a != b)
                    .unwrap_or(g.len().min(w.len()));
                return Err(format!(
                    "side {side} {q:?} completions differ at {i}: got {:?}, want {:?} ({} vs {})",
                    g.get(i),
                    w.get(i),
                    g.len(),
                    w.len()
                ));
            }
        }
    }
    for (side, e) in [&p.a, &p.b].into_iter().enumerate() {
        if let Some(left) = e.mem.srq.as_ref().map(Srq::len).filter(|&n| n > 0) {
            return Err(format!("side {side}: {left} receives left on the SRQ"));
        }
    }
    let mut bytes = 0;
    for (side, check) in &exp.checks {
        let (mine, other) = if *side == 0 {
            (&p.a.mem, &p.b.mem)
        } else {
            (&p.b.mem, &p.a.mem)
        };
        match check {
            Check::Bytes { src, dst, src_side } => {
                let src_mem = if *src_side == *side { mine } else { other };
                let want = collect(src_mem, src);
                let have = collect(mine, dst);
                bytes += want.len() as u64;
                if have[..want.len()] != want[..] {
                    return Err(format!("side {side}: bytes at {dst:?} differ from {src:?}"));
                }
            }
            Check::Invalidated { stag } => {
                if mine.region(*stag).is_some_and(|r| r.valid) {
                    return Err(format!("side {side}: STag {stag:#x} not invalidated"));
                }
            }
            Check::Value { pieces, want } => {
                let have = collect(mine, pieces);
                let have = u64::from_ne_bytes(have[..8].try_into().expect("8 bytes"));
                if have != *want {
                    return Err(format!(
                        "side {side}: {have:#x} at {pieces:?}, the model says {want:#x}"
                    ));
                }
            }
        }
    }
    Ok(Outcome {
        virtual_ns: elapsed,
        bytes,
        stats: [p.a.conn.sender_stats(), p.b.conn.sender_stats()],
        sent: [
            p.ab.capture.take().unwrap_or_default(),
            p.ba.capture.take().unwrap_or_default(),
        ],
    })
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn sweep(loss_percent: u64, seeds: u64, ops: usize, budget: u64) {
    if let Some(l) = env("TRP_SIM_LOSS") {
        if l != loss_percent {
            return;
        }
    }
    let seeds: Vec<u64> = match env("TRP_SIM_SEED") {
        Some(s) => vec![s],
        None => (0..env("TRP_SIM_SOAK").unwrap_or(seeds))
            .map(|i| 1000 * loss_percent + i)
            .collect(),
    };
    for seed in seeds {
        match run(seed, loss_percent as f64 / 100.0, ops, budget) {
            Ok(o) => eprintln!(
                "loss {loss_percent}% seed {seed}: {} bytes checked, {:.3} ms virtual, {:?}",
                o.bytes,
                o.virtual_ns as f64 / 1e6,
                o.stats
            ),
            Err(e) => panic!(
                "loss {loss_percent}% seed {seed} failed: {e}\nreplay: TRP_SIM_SEED={seed} TRP_SIM_LOSS={loss_percent} cargo test -p trp --test sim"
            ),
        }
    }
}

#[test]
fn workload_loss_0() {
    sweep(0, 4, 400, 12 << 20);
}

#[test]
fn workload_loss_1() {
    sweep(1, 4, 300, 8 << 20);
}

#[test]
fn workload_loss_10() {
    sweep(10, 3, 200, 4 << 20);
}

#[test]
fn workload_loss_30() {
    sweep(30, 2, 100, 1 << 20);
}

/// No loss, but a third of the packets overtaken by later ones and many
/// duplicates.
fn reordering() -> LinkConfig {
    LinkConfig {
        jitter: 20_000,
        reorder: 0.3,
        reorder_delay: 300_000,
        duplicate: 0.1,
        ..LinkConfig::default()
    }
}

/// The reordering link: out-of-order placement and in-order completion.
#[test]
fn workload_heavy_reordering() {
    for seed in 0..3 {
        if let Err(e) = run_on(7000 + seed, reordering(), 150, 4 << 20) {
            panic!("reordering seed {} failed: {e}", 7000 + seed);
        }
    }
}

/// The same workloads with each end's receives on a shared receive queue:
/// a message takes its receive when its first segment is placed in order,
/// under loss and under reordering (segments ahead of a gap wait for their
/// retransmission), and the model's completions and bytes hold.
#[test]
fn workload_srq() {
    let srq = Drive {
        srq: true,
        ..Drive::default()
    };
    let runs = [
        (8000, LinkConfig::lossy(0.0), 300, 8 << 20),
        (8001, LinkConfig::lossy(0.01), 300, 8 << 20),
        (8010, LinkConfig::lossy(0.1), 200, 4 << 20),
        (8020, reordering(), 150, 4 << 20),
    ];
    for (seed, link, ops, budget) in runs {
        if let Err(e) = run_driven(seed, link, ops, budget, srq) {
            panic!("SRQ seed {seed} failed: {e}");
        }
    }
}

/// Corruption the UDP checksum would have caught, delivered anyway: the
/// endpoints must neither panic nor hang. Each run either completes its
/// work or fails cleanly (Terminate / retry limit) with every work request
/// completed.
#[test]
fn undetected_corruption_never_panics_or_hangs() {
    for seed in 0..4u64 {
        let mut rng = Rng::new(seed);
        let mem_size = 16 << 20;
        let link = LinkConfig {
            corrupt: 0.05,
            corrupt_detected: false,
            ..LinkConfig::lossy(0.01)
        };
        let mut p = Pair::builder()
            .config(config())
            .link(link)
            .seed(rng.next_u64())
            .memory_size(mem_size)
            .connect()
            .unwrap();
        let exp = post_workload(&mut p, &mut rng, 40, 1 << 20, mem_size);
        let want = [exp.cq[0].len(), exp.cq[1].len()];
        let mut got = [0usize; 2];
        let limit = trp::Instant(p.now.0 + 600_000_000_000);
        let ok = p.run_until(limit, |p| {
            while p.a.conn.poll_completion().is_some() {
                got[0] += 1;
            }
            while p.b.conn.poll_completion().is_some() {
                got[1] += 1;
            }
            let closed = p.a.conn.state() == trp::QpState::Closed
                && p.b.conn.state() == trp::QpState::Closed;
            closed || (got[0] >= want[0] && got[1] >= want[1])
        });
        assert!(ok, "seed {seed}: hung with {got:?} of {want:?} completions");
    }
}

/// The fast paths (header prediction on both ends, burst calls) are only
/// faster: the same workloads, driven through the general paths alone, one
/// datagram per call, and with bursts, send the same datagrams byte for
/// byte and finish identically. The lossy runs make both ends leave and
/// re-enter the fast paths (retransmissions, SACKs, Reads, Sends).
#[test]
fn fast_paths_change_nothing() {
    for (seed, loss) in [(11, 0.0), (12, 0.01), (13, 0.1), (14, 0.3)] {
        let link = LinkConfig::lossy(loss);
        let run = |drive: Drive| {
            run_driven(
                seed,
                link,
                200,
                4 << 20,
                Drive {
                    capture: true,
                    ..drive
                },
            )
            .unwrap_or_else(|e| panic!("seed {seed} loss {loss}: {e}"))
        };
        let general = run(Drive {
            header_prediction: false,
            ..Drive::default()
        });
        for drive in [
            Drive::default(),
            Drive {
                bursts: true,
                ..Drive::default()
            },
        ] {
            let fast = run(drive);
            for side in 0..2 {
                let (g, f) = (&general.sent[side], &fast.sent[side]);
                assert!(!g.is_empty());
                if let Some(i) = (0..g.len().max(f.len())).find(|&i| g.get(i) != f.get(i)) {
                    panic!("seed {seed} loss {loss} {drive:?}: side {side} datagram {i} differs");
                }
            }
            assert_eq!(
                (general.virtual_ns, general.bytes, general.stats),
                (fast.virtual_ns, fast.bytes, fast.stats)
            );
        }
    }
}
