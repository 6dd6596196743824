//! Goodput of an RDMA Write stream across a matrix of lossy and reordering
//! links, against the same stream on a clean one: every case must complete
//! every Write, and the table of goodput and sender statistics is printed
//! (`cargo test -p trp --release --test loss_matrix -- --nocapture`).

use trp::reliability::SenderStats;
use trp::sim::{LinkConfig, LinkStats, Pair};

const MSG: u64 = 1 << 20;

/// What a stream of RDMA Writes achieved.
pub struct Run {
    pub bps: f64,
    pub sender: SenderStats,
    pub data: LinkStats,
    pub acks: LinkStats,
}

/// Streams `total` bytes of 1 MiB RDMA Writes from a to b, over `data`
/// a to b and `acks` b to a; the handshake runs on a clean link.
pub fn stream(data: LinkConfig, acks: LinkConfig, seed: u64, total: u64) -> Run {
    let mut p = Pair::builder()
        .seed(seed)
        .memory_size(2 * MSG)
        .connect()
        .unwrap();
    p.ab.cfg = data;
    p.ba.cfg = acks;
    let n = total / MSG;
    p.post_writes(n, MSG as u32, true);
    let start = p.now;
    let (ab0, ba0) = (p.ab.stats, p.ba.stats);
    let mut done = 0;
    let ok = p.run_until(trp::Instant(start.0 + 100_000_000_000), |p| {
        while let Some(c) = p.a.conn.poll_completion() {
            assert_eq!(c.status, trp::WcStatus::Success);
            done += 1;
        }
        done == n
    });
    assert!(ok, "stream did not finish");
    let secs = (p.now.0 - start.0) as f64 / 1e9;
    let since = |s: LinkStats, s0: LinkStats| LinkStats {
        sent: s.sent - s0.sent,
        lost: s.lost - s0.lost,
        queue_drops: s.queue_drops - s0.queue_drops,
        ..s
    };
    Run {
        bps: (n * MSG * 8) as f64 / secs,
        sender: p.a.conn.sender_stats(),
        data: since(p.ab.stats, ab0),
        acks: since(p.ba.stats, ba0),
    }
}

fn lossy(loss: f64) -> LinkConfig {
    LinkConfig {
        loss,
        ..LinkConfig::default()
    }
}

/// 5 % of packets held back by up to the one-way delay: as the bed's netem
/// reorders (those packets skip the delay the others wait).
fn reordering(loss: f64) -> LinkConfig {
    let link = LinkConfig::default();
    LinkConfig {
        reorder: 0.05,
        reorder_delay: link.delay,
        ..lossy(loss)
    }
}

const TOTAL: u64 = 32 * MSG;

/// Each case with the least goodput it must keep, as a fraction of the
/// lossless stream's. Random loss is retransmitted, not taken for
/// congestion: at 10 % the stream keeps well over half its rate.
#[test]
fn loss_matrix() {
    let clean = LinkConfig::default();
    let cases: &[(&str, LinkConfig, LinkConfig, f64)] = &[
        ("lossless", clean, clean, 1.0),
        ("1% both", lossy(0.01), lossy(0.01), 0.7),
        ("2% both", lossy(0.02), lossy(0.02), 0.7),
        ("5% both", lossy(0.05), lossy(0.05), 0.65),
        ("10% both", lossy(0.10), lossy(0.10), 0.6),
        ("20% both", lossy(0.20), lossy(0.20), 0.1),
        ("10% data only", lossy(0.10), clean, 0.6),
        ("10% ACKs only", clean, lossy(0.10), 0.9),
        ("5% reorder", reordering(0.0), reordering(0.0), 0.9),
        ("10% + 5% reorder", reordering(0.10), reordering(0.10), 0.55),
    ];
    let mut base = 0.0;
    eprintln!(
        "{:<18} {:>9} {:>6} {:>7} {:>7} {:>6} {:>5} {:>6} {:>5} {:>6} {:>7}",
        "case",
        "Mbit/s",
        "ratio",
        "sent",
        "retx",
        "lost",
        "RTOs",
        "probes",
        "cuts",
        "random",
        "maxfl"
    );
    let mut failed = Vec::new();
    for &(name, data, acks, least) in cases {
        let r = stream(data, acks, 7, TOTAL);
        if base == 0.0 {
            base = r.bps;
        }
        let s = r.sender;
        let lost = r.data.lost + r.data.queue_drops;
        eprintln!(
            "{name:<18} {:>9.1} {:>6.3} {:>7} {:>7} {:>6} {:>5} {:>6} {:>5} {:>6} {:>7}",
            r.bps / 1e6,
            r.bps / base,
            s.sent,
            s.retransmitted,
            lost,
            s.timeouts,
            s.tail_probes,
            s.fast_recoveries,
            s.random_losses,
            s.max_in_flight,
        );
        if r.bps / base < least {
            failed.push(format!(
                "{name}: {:.3} of lossless, below {least}",
                r.bps / base
            ));
        }
        // What is resent is what was lost, give or take a tenth: the
        // reordering that RACK's time test waits out is not resent.
        if s.retransmitted as f64 > lost as f64 * 1.1 + 10.0 {
            failed.push(format!(
                "{name}: {} resent for {lost} lost",
                s.retransmitted
            ));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// One stream through a 1 Gbit/s link, slower than the sender, with a
/// drop-tail queue of `queue_ns` and `random` loss: the fraction of the
/// link it used, and of what it sent that the queue dropped.
fn congested(queue_ns: u64, random: f64) -> (f64, f64) {
    let data = LinkConfig {
        rate_bps: 1_000_000_000,
        delay: 250_000,
        queue_limit: queue_ns,
        loss: random,
        ..LinkConfig::default()
    };
    let acks = LinkConfig {
        delay: 250_000,
        ..LinkConfig::default()
    };
    let r = stream(data, acks, 7, 16 * MSG);
    let s = r.sender;
    eprintln!(
        "queue {queue_ns} ns, loss {random}: {:.1} Mbit/s, {} sent, {} dropped by the queue, {} lost at random, {} RTOs, {} cuts",
        r.bps / 1e6,
        s.sent,
        r.data.queue_drops,
        r.data.lost,
        s.timeouts,
        s.fast_recoveries,
    );
    (r.bps / 1e9, r.data.queue_drops as f64 / s.sent as f64)
}

/// A queue that overflows is congestion, random loss or not: the window
/// halves, so the queue drops a small fraction of what is sent while the
/// link stays busy. Reno, for comparison: 0.9 % dropped with the longer
/// queue, 0.2 % with the shorter, and 0.18 of the link used with 2 %
/// random loss, which it halves for. With that loss the queue's overflow
/// is told from it by its excess only: 0.8–1.3 % dropped with the longer
/// queue over the link's seeds (the bound). The shorter queue fills and empties
/// within a round trip; the drops of bursts that never raise the round's
/// least RTT are taken for random ones, hence its larger bound. Its window
/// saws between half and all of the path's product and the queue (26 and
/// 53 segments): about 0.86 of the link once settled, less over a run
/// that includes slow start.
#[test]
fn a_congested_link_still_backs_off() {
    // Half and a fifth of the path's bandwidth-delay product (550 µs).
    for (queue, most_dropped, least_used) in [(275_000, 0.015, 0.8), (110_000, 0.05, 0.75)] {
        for (random, least_used) in [(0.0, least_used), (0.02, 0.7)] {
            let (used, dropped) = congested(queue, random);
            assert!(used >= least_used, "{used:.2} of the link");
            assert!(
                dropped <= most_dropped,
                "the queue dropped {dropped:.3} of what was sent"
            );
        }
    }
}
