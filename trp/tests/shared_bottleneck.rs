//! Two connections through one bottleneck: each pair's data shares a
//! rate-limited, lossy link (one queue, one loss process), their ACKs go
//! back on links of their own. `trp::sim::Pair` has one link per direction,
//! so this test drives the four endpoints itself.

use trp::sim::{Endpoint, Link, LinkConfig, Pair};
use trp::Instant;

const MSG: u64 = 1 << 20;

fn connected(seed: u64) -> Pair {
    let mut p = Pair::builder()
        .seed(seed)
        .memory_size(2 * MSG)
        .connect()
        .unwrap();
    // More than the run can send: both flows stay busy to its end.
    p.post_writes(256, MSG as u32, false);
    p
}

/// Puts everything `from` wants to send on `link`, each datagram behind a
/// byte naming its flow.
fn transmit(now: Instant, from: &mut Endpoint, flow: u8, link: &mut Link, buf: &mut [u8]) {
    while let Some(n) = from.conn.poll_transmit(now, &from.mem, &mut buf[1..]) {
        buf[0] = flow;
        link.send(now, &buf[..n + 1]);
    }
}

/// Runs both flows for `warmup` and then `span` ns of virtual time;
/// returns the datagrams each delivered to its receiver in the span.
fn share(bottleneck: LinkConfig, warmup: u64, span: u64) -> [u64; 2] {
    let mut pairs = [connected(1), connected(2)];
    let mut shared = Link::new(bottleneck, 99);
    let mut acks = [
        Link::new(LinkConfig::default(), 7),
        Link::new(LinkConfig::default(), 8),
    ];
    let mut now = pairs.iter().map(|p| p.now).max().unwrap();
    let start = now.0 + warmup;
    let end = start + span;
    let mut buf = vec![0u8; 65536];
    let mut delivered = [0u64; 2];
    while now.0 < end {
        for (i, p) in pairs.iter_mut().enumerate() {
            transmit(now, &mut p.a, i as u8, &mut shared, &mut buf);
            transmit(now, &mut p.b, i as u8, &mut acks[i], &mut buf);
        }
        let next = [
            shared.next_delivery(),
            acks[0].next_delivery(),
            acks[1].next_delivery(),
        ]
        .into_iter()
        .chain(
            pairs
                .iter()
                .flat_map(|p| [p.a.conn.poll_timeout(), p.b.conn.poll_timeout()]),
        )
        .flatten()
        .min()
        .expect("two busy flows always have something to do");
        now = now.max(next);
        while let Some(d) = shared.pop_due(now) {
            let flow = usize::from(d[0]);
            let b = &mut pairs[flow].b;
            let _ = b.conn.handle_datagram(now, &mut b.mem, &d[1..]);
            if now.0 >= start {
                delivered[flow] += 1;
            }
        }
        for (i, link) in acks.iter_mut().enumerate() {
            while let Some(d) = link.pop_due(now) {
                let a = &mut pairs[i].a;
                let _ = a.conn.handle_datagram(now, &mut a.mem, &d[1..]);
            }
        }
        for p in &mut pairs {
            for e in [&mut p.a, &mut p.b] {
                if e.conn.poll_timeout().is_some_and(|t| t <= now) {
                    e.conn.handle_timeout(now);
                }
            }
        }
    }
    for (i, p) in pairs.iter().enumerate() {
        eprintln!("  flow {i}: {:?}", p.a.conn.sender_stats());
    }
    delivered
}

/// Through a 1 Gbit/s bottleneck with a queue of a fifth of its
/// bandwidth-delay product, with and without 10 % random loss, neither
/// flow gets more than twice the other's share, and together they keep it
/// busy.
#[test]
fn two_flows_share_a_bottleneck() {
    for loss in [0.0, 0.10] {
        let link = LinkConfig {
            rate_bps: 1_000_000_000,
            delay: 250_000,
            queue_limit: 100_000,
            loss,
            ..LinkConfig::default()
        };
        // Both start at once: the queue takes the first flight of one and
        // drops the other's, which waits for the initial RTO (200 ms, no
        // RTT sample yet, doubled on each loss of its retransmission: up to
        // 1.1 s). Measured after that.
        let span = 300_000_000;
        let [x, y] = share(link, 2_000_000_000, span);
        // 1 Gbit/s of full-size datagrams, less what the link lost.
        let capacity = 1e9 * span as f64 / 1e9 / (1500.0 * 8.0) * (1.0 - loss);
        let used = (x + y) as f64 / capacity;
        eprintln!(
            "loss {loss}: {x} and {y} datagrams delivered, ratio {:.2}, {:.2} of the link",
            x.max(y) as f64 / x.min(y).max(1) as f64,
            used
        );
        assert!(x.max(y) <= 2 * x.min(y), "{x} against {y}");
        assert!(used >= 0.8, "the two used {used:.2} of the link");
    }
}
