//! Writes the seed corpus for the fuzz targets from datagrams captured in
//! the simulator: `cargo run -p trp --example gen_corpus -- trp/fuzz/corpus`.

use std::path::Path;
use trp::fuzzing::memory;
use trp::sim::{LinkConfig, Pair};
use trp::wire::{trp as trph, WireError};
use trp::{Config, RecvWr, SendOp, SendWr, Sge};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "trp/fuzz/corpus".into());
    let cfg = Config::default();
    let link = LinkConfig {
        delay: 1000,
        ..LinkConfig::default()
    };
    // The fuzz targets' memory, so the records land where they look.
    let mut p = Pair::builder()
        .config(cfg)
        .link(link)
        .seed(11)
        .memories(memory(), memory())
        .connect()?;
    p.ab.capture = Some(Vec::new());
    p.ba.capture = Some(Vec::new());
    let sge = |a, l| {
        [Sge {
            addr: a,
            len: l,
            lkey: 1,
        }]
    };
    for i in 0..3 {
        p.b.conn.post_recv(
            &p.b.mem,
            &RecvWr {
                wr_id: i,
                sges: &sge(4096 * i, 4096),
            },
        )?;
    }
    let ops = [
        SendOp::Send {
            invalidate: None,
            solicited: false,
        },
        SendOp::Send {
            invalidate: Some(2),
            solicited: true,
        },
        SendOp::RdmaWrite {
            remote_addr: 1 << 14,
            rkey: 2,
        },
        SendOp::RdmaWriteImm {
            remote_addr: 1 << 14,
            rkey: 2,
            imm: 7,
            solicited: false,
        },
        SendOp::RdmaRead {
            remote_addr: 1 << 14,
            rkey: 2,
        },
        SendOp::RdmaWrite {
            remote_addr: 1 << 30,
            rkey: 2,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let s = sge(0, 2000);
        p.a.conn.post_send(
            &p.a.mem,
            &SendWr {
                wr_id: i as u64,
                op,
                sges: &s,
                signaled: true,
            },
        )?;
    }
    p.run_until(trp::Instant(p.now.0 + 100_000_000), |_| false);
    p.a.conn.close();
    let mut dgrams = p.ab.capture.take().unwrap_or_default();
    dgrams.extend(p.ba.capture.take().unwrap_or_default());
    let mut cb = trp::Connecting::new(cfg, 9, 99, b"private", trp::Instant(0))?;
    let mut buf = vec![0u8; 2048];
    if let Some(n) = cb.poll_transmit(trp::Instant(0), &mut buf) {
        dgrams.push(buf[..n].to_vec());
    }
    dgrams.sort();
    dgrams.dedup();
    let write = |dir: &str, name: String, bytes: &[u8]| -> std::io::Result<()> {
        let d = Path::new(&out).join(dir);
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join(name), bytes)
    };
    let mut record = Vec::new();
    for (i, d) in dgrams.iter().enumerate().take(40) {
        write("parsers", format!("dgram-{i:03}"), d)?;
        let pkt = trph::Packet::new_checked(&d[..]).map_err(|e: WireError| e.to_string())?;
        write("parsers", format!("segment-{i:03}"), pkt.payload())?;
        // Records for the receive path: steer connection id, PSN and ACK.
        record.push(0x07);
        record.extend_from_slice(&(d.len() as u16).to_be_bytes());
        record.extend_from_slice(d);
        if i % 8 == 7 {
            write("receive_path", format!("records-{i:03}"), &record)?;
            record.clear();
        }
    }
    if !record.is_empty() {
        write("receive_path", "records-last".into(), &record)?;
    }
    eprintln!("wrote {} datagrams to {out}", dgrams.len().min(40));
    Ok(())
}
