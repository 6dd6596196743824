//! Build and parse one 4 KiB tagged segment (an RDMA Write segment in a
//! jumbo-frame datagram): TRP header, DDP/RDMAP header, payload copy.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use trp::wire::ddp::BufferRef;
use trp::wire::rdmap::Opcode;
use trp::wire::{predict, segment, trp as trph};

fn build_parse(c: &mut Criterion) {
    let payload = vec![0xa5u8; 4096];
    let mut buf = vec![0u8; trph::HEADER_LEN + 14 + 4096];
    let mut g = c.benchmark_group("segment");
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("build_parse_4k_tagged", |b| {
        let mut psn = 0u32;
        b.iter(|| {
            psn = psn.wrapping_add(1);
            let h = trph::Repr {
                opcode: trph::Opcode::Data,
                flags: 0,
                dst_conn: 7,
                psn,
                ack_psn: 3,
                window: 1024,
                sack: trph::SackRanges::new(),
            };
            h.emit(&mut buf);
            let s = segment::Repr {
                opcode: Opcode::RdmaWrite,
                last: false,
                buffer: BufferRef::Tagged {
                    stag: 0x1234,
                    to: u64::from(psn) * 4096,
                },
            };
            s.emit(&mut buf[trph::HEADER_LEN..]);
            buf[trph::HEADER_LEN + 14..].copy_from_slice(black_box(&payload));
            let p = trph::Packet::new_checked(black_box(&buf[..])).unwrap();
            let r = trph::Repr::parse(&p).unwrap();
            let (seg, body) = segment::Repr::parse(p.payload()).unwrap();
            black_box((r, seg, body));
        })
    });
    // The same through the receive path's header prediction and the
    // matching one-step emitter (`wire::predict`).
    g.bench_function("build_parse_4k_tagged_predicted", |b| {
        let mut psn = 0u32;
        b.iter(|| {
            psn = psn.wrapping_add(1);
            let d = predict::Datagram {
                flags: 0,
                dst_conn: 7,
                psn,
                ack_psn: 3,
                window: 1024,
                seg: segment::Repr {
                    opcode: Opcode::RdmaWrite,
                    last: false,
                    buffer: BufferRef::Tagged {
                        stag: 0x1234,
                        to: u64::from(psn) * 4096,
                    },
                },
                payload: &[],
            };
            let n = predict::emit(&d, &mut buf);
            buf[n..].copy_from_slice(black_box(&payload));
            black_box(predict::parse(black_box(&buf[..])).unwrap());
        })
    });
    // The yardstick: copying the same payload once.
    let mut dst = vec![0u8; 4096];
    g.bench_function("copy_4k", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&payload));
            black_box(&mut dst);
        })
    });
    g.finish();
}

criterion_group!(benches, build_parse);
criterion_main!(benches);
