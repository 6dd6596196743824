//! Goodput of an RDMA Write stream across a matrix of lossy and reordering
//! links, against the same stream on a clean one: every case must complete
//! every Write, and the table of goodput and sender statistics is printed
//! (`cargo test -p trp --release --test loss_matrix -- --nocapture`).

use trp::reliability::SenderStats;
use trp::sim::{LinkConfig, LinkStats, Pair, LKEY, RKEY};
use trp::{SendOp, SendWr, Sge};

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
    let sge = [Sge {
        addr: 0,
        len: MSG as u32,
        lkey: LKEY,
    }];
    let n = total / MSG;
    for i in 0..n {
        let wr = SendWr {
            wr_id: i,
            op: SendOp::RdmaWrite {
                remote_addr: MSG,
                rkey: RKEY,
            },
            sges: &sge,
            signaled: true,
        };
        p.a.conn.post_send(&p.a.mem, &wr).unwrap();
    }
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

#[test]
fn loss_matrix() {
    let clean = LinkConfig::default();
    let cases: &[(&str, LinkConfig, LinkConfig)] = &[
        ("lossless", clean, clean),
        ("1% both", lossy(0.01), lossy(0.01)),
        ("2% both", lossy(0.02), lossy(0.02)),
        ("5% both", lossy(0.05), lossy(0.05)),
        ("10% both", lossy(0.10), lossy(0.10)),
        ("20% both", lossy(0.20), lossy(0.20)),
        ("10% data only", lossy(0.10), clean),
        ("10% ACKs only", clean, lossy(0.10)),
        ("5% reorder", reordering(0.0), reordering(0.0)),
        ("10% + 5% reorder", reordering(0.10), reordering(0.10)),
    ];
    let mut base = 0.0;
    let mut reorder = None;
    eprintln!(
        "{:<18} {:>9} {:>6} {:>7} {:>7} {:>6} {:>5} {:>6} {:>7}",
        "case", "Mbit/s", "ratio", "sent", "retx", "lost", "RTOs", "recov", "maxfl"
    );
    for &(name, data, acks) in cases {
        let r = stream(data, acks, 7, TOTAL);
        if base == 0.0 {
            base = r.bps;
        }
        let s = r.sender;
        eprintln!(
            "{name:<18} {:>9.1} {:>6.3} {:>7} {:>7} {:>6} {:>5} {:>6} {:>7}",
            r.bps / 1e6,
            r.bps / base,
            s.sent,
            s.retransmitted,
            r.data.lost + r.data.queue_drops,
            s.timeouts,
            s.fast_recoveries,
            s.max_in_flight,
        );
        if name == "5% reorder" {
            reorder = Some((r.bps / base, s.retransmitted));
        }
    }
    // Reordering alone loses nothing: it must neither slow the stream nor
    // resend much (a count of overtaking segments alone made 0.09 of
    // lossless, each reordered datagram a halved window).
    let (ratio, retx) = reorder.unwrap();
    assert!(ratio >= 0.9, "5% reorder: {ratio:.3} of lossless");
    assert!(retx <= 1_000, "5% reorder: {retx} retransmitted");
}
