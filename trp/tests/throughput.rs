//! Goodput of a long RDMA Write stream through the simulator.

use trp::sim::{LinkConfig, Pair};
use trp::Config;

const MSG: u64 = 1 << 20;

/// Streams `total` bytes of 1 MiB RDMA Writes from a to b; returns goodput in
/// bits per (virtual) second and the pair for inspection.
pub fn stream(link: LinkConfig, seed: u64, total: u64) -> (f64, Pair) {
    // One message of local memory (LKEY) and one of remote (RKEY) per end.
    let mut p = Pair::builder()
        .link(link)
        .seed(seed)
        .memory_size(2 * MSG)
        .connect()
        .unwrap();
    let n = total / MSG;
    p.post_writes(n, MSG as u32, true);
    let start = p.now;
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
    ((n * MSG * 8) as f64 / secs, p)
}

#[test]
fn clean_link_fills_bandwidth_delay_product() {
    let link = LinkConfig::default();
    let (bps, p) = stream(link, 1, 64 * MSG);
    let stats = p.a.conn.sender_stats();
    // 10 Gbit/s, 100 us RTT: BDP = 125 kB = 88 segments of 1472 bytes.
    let bdp_segments = (link.rate_bps / 8 * 2 * link.delay / 1_000_000_000) / 1472;
    eprintln!(
        "clean: {:.2} Gbit/s, {stats:?}, BDP {bdp_segments} segments",
        bps / 1e9
    );
    assert!(
        stats.max_in_flight as u64 >= bdp_segments,
        "window never reached the BDP"
    );
    // Payload efficiency is 1420/1500 on the wire; ask for 85 % of line rate.
    assert!(bps > 0.85 * link.rate_bps as f64, "goodput {bps} too low");
}

#[test]
fn goodput_at_ten_percent_loss() {
    let mut link = LinkConfig::lossy(0.10);
    link.reorder = 0.0;
    let (bps, p) = stream(link, 2, 32 * MSG);
    let stats = p.a.conn.sender_stats();
    // Threshold: the Padhye et al. (SIGCOMM 1998) steady-state model of a
    // TCP-Reno-like AIMD sender that treats every loss as congestion, with
    // this link's RTT, the loss rate, an ACK per two segments and our minimum
    // RTO as T0. A TRP sender must do at least as well as TCP would.
    let payload_bits = ((1472 - 20 - 14) * 8) as f64;
    let (rtt, p_loss, b): (f64, f64, f64) = (2.0 * link.delay as f64 / 1e9, 0.10, 2.0);
    let t0 = Config::default().min_rto.as_secs_f64();
    let per_packet = rtt * (2.0 * b * p_loss / 3.0).sqrt()
        + t0 * (3.0 * (3.0 * b * p_loss / 8.0).sqrt()).min(1.0)
            * p_loss
            * (1.0 + 32.0 * p_loss * p_loss);
    let model = payload_bits / per_packet;
    eprintln!(
        "10% loss: {:.1} Mbit/s (TCP-Reno model {:.1} Mbit/s), {stats:?}",
        bps / 1e6,
        model / 1e6
    );
    assert!(bps >= model, "goodput {bps} below the AIMD model {model}");
}
