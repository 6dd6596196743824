//! Workload for measuring the protocol core's cost per segment with
//! callgrind (see docs/performance.md). Two connections exchange datagrams
//! directly, with no simulated link, so only trp and the payload copies run.
//!
//! `segment_cost core <n> [burst]`: n RDMA Writes of 1 MiB from a to b.
//! Each end hands over at most `burst` datagrams before the other end runs
//! (as a driver polling bursts of packets would); without it, each end
//! sends all it may, so ACKs are fewer (about one per window).
//! `segment_cost copy <n>`: the same number of segments' payload copied
//! once with memcpy, nothing else.

use std::hint::black_box;
use trp::sim::{LinkConfig, Pair};
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
            let mut moved = 0;
            while moved < burst {
                let Some(len) = a.conn.poll_transmit(now, &a.mem, &mut buf) else {
                    break;
                };
                b.conn
                    .handle_datagram(now, &mut b.mem, &buf[..len])
                    .unwrap();
                moved += 1;
            }
            let mut acks = 0;
            while acks < burst {
                let Some(len) = b.conn.poll_transmit(now, &b.mem, &mut buf) else {
                    break;
                };
                a.conn
                    .handle_datagram(now, &mut a.mem, &buf[..len])
                    .unwrap();
                acks += 1;
            }
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
