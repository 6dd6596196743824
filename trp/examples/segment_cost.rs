//! Workload for measuring the protocol core's cost per segment (see
//! docs/performance.md). Two connections exchange datagrams directly, with
//! no simulated link, so only trp and the payload copies run.
//!
//! - `segment_cost core <n> [burst]`: n RDMA Writes of 1 MiB from a to b,
//!   one `poll_transmit` / `handle_datagram` per datagram. Each end hands
//!   over at most `burst` datagrams before the other end runs (as a driver
//!   polling bursts of packets would); without it, each end sends all it
//!   may, so ACKs are fewer (about one per window).
//! - `segment_cost burst <n> [burst]`: the same through
//!   `poll_transmit_burst` / `handle_datagram_burst` over 32 buffers, as a
//!   driver moving bursts of packets calls them.
//! - `segment_cost general <n> [burst]`: `core` with the fast paths off
//!   (`Config::header_prediction`): every datagram takes the general paths.
//! - `core-send`, `burst-send`, `general-send`, `time-send`: the same with
//!   1 MiB Sends into receives b posts (1430-byte segments).
//! - a mode ending in `-nocrc` (`burst-nocrc`, `core-send-nocrc`, ...): the
//!   same without the CRC32C trailer (`Config::crc` off at both ends), whose
//!   segments are 4 bytes longer.
//! - `segment_cost copy <n>`: one memcpy per segment between two small
//!   buffers that stay in L1, nothing else (the yardstick of earlier runs).
//! - `segment_cost copies <n> [buffers]`: the two copies every segment
//!   needs, with the workload's own addresses: out of a's memory into a
//!   datagram buffer (of 32 in turn, or of `buffers`), and out of it into
//!   b's memory.
//! - `segment_cost time <n>`: wall-clock, for one call per datagram and
//!   for bursts: the copies through the same buffers, the workload, and
//!   the workload with the fast paths off, in turn, seven times each, best
//!   of each; prints nanoseconds per segment and the protocol's share (a
//!   run minus the copies) as a ratio to the copies.

use std::hint::black_box;
use std::time::{Duration, Instant as Clock};
use trp::sim::{Endpoint, Pair, LKEY, RKEY};
use trp::{Config, Memory, RecvWr, SendOp, SendWr, Sge};

const MIB: u64 = 1 << 20;
const BURST: usize = 32;

/// Two established ends and the buffers datagrams pass through.
struct Bench {
    a: Endpoint,
    b: Endpoint,
    now: trp::Instant,
    bufs: Vec<Vec<u8>>,
    lens: [usize; BURST],
    /// Payload bytes per segment.
    payload: u64,
    /// Sends (into receives b posts) instead of RDMA Writes.
    send: bool,
    /// Datagrams carry the CRC32C trailer.
    crc: bool,
    /// Where in b's memory the payload goes: a receive's buffer in the
    /// local half, or the remote half an RDMA Write targets.
    sink: u64,
}

impl Bench {
    fn new(header_prediction: bool, send: bool, crc: bool) -> Bench {
        let cfg = Config {
            header_prediction,
            crc,
            ..Config::default()
        };
        // 1 MiB of local memory (LKEY) and 1 MiB of remote (RKEY) per end.
        let p = Pair::builder()
            .config(cfg)
            .seed(1)
            .memory_size(2 * MIB)
            .connect()
            .unwrap();
        Bench {
            a: p.a,
            b: p.b,
            now: p.now,
            bufs: vec![vec![0u8; 2048]; BURST],
            lens: [0; BURST],
            payload: u64::from(cfg.max_datagram)
                - 20
                - if send { 18 } else { 14 }
                - trp::wire::crc::trailer_len(crc) as u64,
            send,
            crc,
            sink: if send { 0 } else { MIB },
        }
    }

    fn segments(&self, n: u64) -> u64 {
        n * MIB.div_ceil(self.payload)
    }

    /// n RDMA Writes of 1 MiB from a to b, each waited for.
    fn write(&mut self, n: u64, bursts: bool, cap: usize) {
        let sge = [Sge {
            addr: 0,
            len: MIB as u32,
            lkey: LKEY,
        }];
        let (a, b, bufs, lens) = (&mut self.a, &mut self.b, &mut self.bufs, &mut self.lens);
        for i in 0..n {
            let op = if self.send {
                let dst = [Sge {
                    addr: self.sink,
                    ..sge[0]
                }];
                let wr = RecvWr {
                    wr_id: i,
                    sges: &dst,
                };
                b.conn.post_recv(&b.mem, &wr).unwrap();
                SendOp::Send {
                    invalidate: None,
                    solicited: false,
                }
            } else {
                SendOp::RdmaWrite {
                    remote_addr: self.sink,
                    rkey: RKEY,
                }
            };
            let wr = SendWr {
                wr_id: i,
                op,
                sges: &sge,
                signaled: true,
            };
            a.conn.post_send(&a.mem, &wr).unwrap();
            loop {
                let now = self.now;
                let (moved, acks) = if bursts {
                    (
                        send_bursts(a, b, now, cap, bufs, lens),
                        send_bursts(b, a, now, cap, bufs, lens),
                    )
                } else {
                    (
                        send_each(a, b, now, cap, &mut bufs[0]),
                        send_each(b, a, now, cap, &mut bufs[0]),
                    )
                };
                if a.conn.poll_completion().is_some() {
                    break;
                }
                if moved > 0 || acks > 0 {
                    continue;
                }
                self.now = trp::Instant(now.0 + 1_000);
                for e in [&mut *a, &mut *b] {
                    if e.conn.poll_timeout().is_some_and(|t| t <= self.now) {
                        e.conn.handle_timeout(self.now);
                    }
                }
            }
        }
    }

    /// The two copies of every segment of n 1 MiB Writes, through the same
    /// memories and addresses as `write` and the first `buffers` datagram
    /// buffers in turn (`write` uses one, or 32 in bursts).
    fn copies(&mut self, n: u64, buffers: usize) {
        for _ in 0..n {
            let mut off = 0;
            let mut i = 0;
            while off < MIB {
                let len = self.payload.min(MIB - off) as usize;
                let buf = &mut self.bufs[i % buffers][34..34 + len];
                self.a.mem.read(off, buf);
                self.b.mem.write(self.sink + off, black_box(buf));
                off += len as u64;
                i += 1;
            }
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "core".into());
    let n: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(1);
    let cap: usize = args
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    let (mode, crc) = match mode.strip_suffix("-nocrc") {
        Some(m) => (m.to_string(), false),
        None => (mode, true),
    };
    let (mode, send) = match mode.strip_suffix("-send") {
        Some(m) => (m.to_string(), true),
        None => (mode, false),
    };
    let mut bench = Bench::new(mode != "general", send, crc);
    let segments = bench.segments(n);
    match mode.as_str() {
        "core" | "burst" | "general" => {
            bench.write(n, mode == "burst", cap);
            println!(
                "segments {segments} sent {:?} acks {}",
                bench.a.conn.sender_stats(),
                bench.b.conn.stats().tx_acks
            );
        }
        "copy" => {
            let len = bench.payload as usize;
            let src = vec![1u8; len];
            let mut dst = vec![0u8; len];
            for _ in 0..segments {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            }
            println!("segments {segments}");
        }
        "copies" => {
            bench.copies(n, if cap == usize::MAX { BURST } else { cap });
            println!("segments {segments}");
        }
        "time" => time(&mut bench, n),
        m => {
            eprintln!(
                "segment_cost: unknown mode {m:?} (core, burst, general, copy, copies, time)"
            );
            std::process::exit(2);
        }
    }
}

fn time(bench: &mut Bench, n: u64) {
    let segments = bench.segments(n) as f64;
    let run = |f: &mut dyn FnMut()| {
        let t = Clock::now();
        f();
        t.elapsed()
    };
    // The same ends without the fast paths, for comparison.
    let mut general = Bench::new(false, bench.send, bench.crc);
    // Each driving (one call per datagram through one buffer, or bursts
    // through 32) against the copies through the same buffers.
    for bursts in [false, true] {
        let buffers = if bursts { BURST } else { 1 };
        // Warm up (page faults, caches, window growth).
        bench.write(n, bursts, usize::MAX);
        general.write(n, bursts, usize::MAX);
        bench.copies(n, buffers);
        let mut best = [Duration::MAX; 3];
        for _ in 0..7 {
            best[0] = best[0].min(run(&mut || bench.copies(n, buffers)));
            best[1] = best[1].min(run(&mut || bench.write(n, bursts, usize::MAX)));
            best[2] = best[2].min(run(&mut || general.write(n, bursts, usize::MAX)));
        }
        let [copies, fast, slow] = best.map(|d| d.as_nanos() as f64 / segments);
        let calls = if bursts {
            "bursts of 32"
        } else {
            "one call per datagram"
        };
        println!("{calls}: ns per segment, both ends; the two payload copies {copies:.1}");
        for (paths, t) in [("fast paths", fast), ("general paths only", slow)] {
            let p = t - copies;
            println!(
                "  {paths}: {t:.1}, protocol {p:.1} = {:.2} x the two copies = {:.2} x one copy",
                p / copies,
                2.0 * p / copies
            );
        }
    }
}

/// Hands up to `cap` datagrams from `from` to `to`, one `poll_transmit`
/// each; returns how many.
fn send_each(
    from: &mut Endpoint,
    to: &mut Endpoint,
    now: trp::Instant,
    cap: usize,
    buf: &mut [u8],
) -> usize {
    let mut moved = 0;
    while moved < cap {
        let Some(len) = from.conn.poll_transmit(now, &from.mem, buf) else {
            break;
        };
        to.conn
            .handle_datagram(now, &mut to.mem, &buf[..len])
            .unwrap();
        moved += 1;
    }
    moved
}

/// The same through the burst calls, `BURST` datagrams at a time.
fn send_bursts(
    from: &mut Endpoint,
    to: &mut Endpoint,
    now: trp::Instant,
    cap: usize,
    bufs: &mut [Vec<u8>],
    lens: &mut [usize],
) -> usize {
    let mut moved = 0;
    while moved < cap {
        let k = bufs.len().min(cap - moved);
        let n = from
            .conn
            .poll_transmit_burst(now, &from.mem, &mut bufs[..k], lens);
        let mut received: [&[u8]; BURST] = [&[]; BURST];
        for (r, (b, &len)) in received
            .iter_mut()
            .zip(bufs.iter().zip(lens.iter()))
            .take(n)
        {
            *r = &b[..len];
        }
        let malformed = to
            .conn
            .handle_datagram_burst(now, &mut to.mem, &received[..n]);
        assert_eq!(malformed, 0);
        moved += n;
        if n < k {
            break;
        }
    }
    moved
}
