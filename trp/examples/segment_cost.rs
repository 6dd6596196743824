//! Workload for measuring the protocol core's cost per segment with
//! callgrind (see docs/performance.md). Two connections exchange datagrams
//! directly, with no simulated link, so only trp and the payload copies run.
//!
//! `segment_cost core <n> [burst]`: n RDMA Writes of 1 MiB from a to b.
//! Each end hands over at most `burst` datagrams before the other end runs
//! (as a driver polling bursts of packets would); without it, each end
//! sends all it may, so ACKs are fewer (about one per window).
//! `segment_cost burst <n> [burst]`: the same, each end sending with
//! `poll_transmit_burst` over 32 buffers, as a driver sending bursts does.
//! `segment_cost copy <n>`: the same number of segments' payload copied
//! once with memcpy, nothing else.

use std::hint::black_box;
use trp::sim::{Endpoint, LinkConfig, Pair};
use trp::{Access, Config, Region, SendOp, SendWr, Sge, VecMemory};

const MIB: u64 = 1 << 20;

fn memory() -> VecMemory {
    let mut m = VecMemory::new(2 * MIB as usize);
    m.register(1, Region::new(0, 0, 2 * MIB, Access::ALL), false);
    m
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "core".into());
    let n: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(1);
    let burst: usize = args
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    let cfg = Config::default();
    let p = Pair::connect(cfg, cfg, LinkConfig::default(), 1, memory(), memory()).unwrap();
    let payload = u64::from(cfg.max_datagram) - 20 - 14;
    let segments_per_mib = MIB.div_ceil(payload);
    if mode == "copy" {
        let src = vec![1u8; payload as usize];
        let mut dst = vec![0u8; payload as usize];
        for _ in 0..n * segments_per_mib {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        }
        println!("segments {}", n * segments_per_mib);
        return;
    }
    let (mut a, mut b) = (p.a, p.b);
    let mut now = p.now;
    let mut buf = vec![0u8; 2048];
    let mut bufs = vec![vec![0u8; 2048]; 32];
    let mut lens = [0usize; 32];
    let sge = [Sge {
        addr: 0,
        len: MIB as u32,
        lkey: 1,
    }];
    for i in 0..n {
        let wr = SendWr {
            wr_id: i,
            op: SendOp::RdmaWrite {
                remote_addr: MIB,
                rkey: 1,
            },
            sges: &sge,
            signaled: true,
        };
        a.conn.post_send(&a.mem, &wr).unwrap();
        loop {
            let moved = if mode == "burst" {
                send_bursts(&mut a, &mut b, now, burst, &mut bufs, &mut lens)
            } else {
                send_each(&mut a, &mut b, now, burst, &mut buf)
            };
            let acks = if mode == "burst" {
                send_bursts(&mut b, &mut a, now, burst, &mut bufs, &mut lens)
            } else {
                send_each(&mut b, &mut a, now, burst, &mut buf)
            };
            if a.conn.poll_completion().is_some() {
                break;
            }
            if moved > 0 || acks > 0 {
                continue;
            }
            now = trp::Instant(now.0 + 1_000);
            for e in [&mut a, &mut b] {
                if e.conn.poll_timeout().is_some_and(|t| t <= now) {
                    e.conn.handle_timeout(now);
                }
            }
        }
    }
    println!(
        "segments {} sent {:?} acks {}",
        n * segments_per_mib,
        a.conn.sender_stats(),
        b.conn.stats().tx_acks
    );
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

/// The same with `poll_transmit_burst`.
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
        let mut received: [&[u8]; 32] = [&[]; 32];
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
