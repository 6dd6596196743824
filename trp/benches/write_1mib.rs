//! A 1 MiB RDMA Write between two simulated endpoints over a loss-free link.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use trp::sim::{Pair, LKEY, RKEY};
use trp::{SendOp, SendWr, Sge, WcStatus};

const MIB: u64 = 1 << 20;

fn write_1mib(c: &mut Criterion) {
    // 1 MiB of local memory (LKEY) and 1 MiB of remote (RKEY) per end.
    let mut p = Pair::builder()
        .seed(1)
        .memory_size(2 * MIB)
        .connect()
        .unwrap();
    let sge = [Sge {
        addr: 0,
        len: MIB as u32,
        lkey: LKEY,
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
                    rkey: RKEY,
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
