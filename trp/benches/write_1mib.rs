//! A 1 MiB RDMA Write between two simulated endpoints over a loss-free link.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use trp::sim::{LinkConfig, Pair};
use trp::{Access, Config, Region, SendOp, SendWr, Sge, VecMemory, WcStatus};

const MIB: u64 = 1 << 20;

fn memory() -> VecMemory {
    let mut m = VecMemory::new(2 * MIB as usize);
    m.register(1, Region::new(0, 0, 2 * MIB, Access::ALL), false);
    m
}

fn write_1mib(c: &mut Criterion) {
    let cfg = Config::default();
    let mut p = Pair::connect(cfg, cfg, LinkConfig::default(), 1, memory(), memory()).unwrap();
    let sge = [Sge {
        addr: 0,
        len: MIB as u32,
        lkey: 1,
    }];
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Bytes(MIB));
    g.sample_size(20);
    g.bench_function("rdma_write_1mib", |b| {
        b.iter(|| {
            let wr = SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    remote_addr: MIB,
                    rkey: 1,
                },
                sges: &sge,
                signaled: true,
            };
            p.a.conn.post_send(&p.a.mem, &wr).unwrap();
            let limit = trp::Instant(p.now.0 + 10_000_000_000);
            let done = p.run_until(limit, |p| {
                p.a.conn
                    .poll_completion()
                    .is_some_and(|c| c.status == WcStatus::Success)
            });
            assert!(done);
        })
    });
    g.finish();
}

criterion_group!(benches, write_1mib);
criterion_main!(benches);
