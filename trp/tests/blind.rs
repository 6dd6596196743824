//! An off-path attacker: one who knows a live connection's UDP addresses and
//! ports (so its datagrams reach the connection) but has not seen its traffic,
//! so knows neither the connection ids nor the PSNs. Both ends draw their
//! connection id and initial PSN at random (urdmad takes them from
//! `getrandom`), and a connection takes nothing whose destination connection
//! id is not its own. Here: a million forged datagrams of each kind that can
//! hurt (a Write segment built on a real one, so that every other field is
//! right, an ACK and a SACK for data never sent, a FIN, an Abort), each with
//! a random connection id and PSN, go to a live connection. None may be
//! accepted (each must count as foreign), the memory they aim at stays as it
//! was, nothing completes, and the connection carries on. The CRC32C trailer
//! is no defence here (it has no secret): every forged datagram carries a
//! valid one.

use trp::sim::{Pair, Rng};
use trp::wire::crc;
use trp::wire::trp::{Opcode, Packet, Repr, SackRanges};
use trp::{Config, Memory, QpState, SendOp, SendWr, Sge};

const ATTEMPTS: u32 = 1_000_000;
/// Where the real Write lands in the peer's memory (its remote half).
const TARGET: u64 = 1 << 19;
const LEN: usize = 1000;

#[test]
fn blind_injection_is_not_accepted() {
    let mut p = Pair::builder()
        .config(Config::default())
        .seed(23)
        .connect()
        .unwrap();
    p.a.mem.write(0, &[0xa5; LEN]);
    p.a.conn
        .post_send(
            &p.a.mem,
            &SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    remote_addr: TARGET,
                    rkey: 2,
                },
                sges: &[Sge {
                    addr: 0,
                    len: LEN as u32,
                    lkey: 1,
                }],
                signaled: true,
            },
        )
        .unwrap();
    let mut buf = vec![0u8; 2048];
    let n = p.a.conn.poll_transmit(p.now, &p.a.mem, &mut buf).unwrap();
    let write = buf[..n].to_vec();
    let (opened, sealed) = crc::open(&write).unwrap();
    assert!(sealed);
    let real = Repr::parse(&Packet::new_unchecked(opened)).unwrap();
    assert_eq!(real.opcode, Opcode::Data);

    let mut target_before = vec![0u8; LEN];
    p.b.mem.read(TARGET, &mut target_before);
    let mut sack = SackRanges::new();
    sack.push(1, 9);
    let kinds: [(&str, Repr, &[u8]); 5] = [
        ("Write segment", real, &opened[real.buffer_len()..]),
        (
            "ACK",
            Repr {
                opcode: Opcode::Ack,
                flags: 0,
                ack_psn: 0,
                sack: SackRanges::new(),
                ..real
            },
            &[],
        ),
        (
            "SACK",
            Repr {
                opcode: Opcode::Sack,
                flags: 0,
                sack,
                ..real
            },
            &[],
        ),
        (
            "FIN",
            Repr {
                opcode: Opcode::Fin,
                sack: SackRanges::new(),
                ..real
            },
            &[],
        ),
        (
            "Abort",
            Repr {
                opcode: Opcode::Abort,
                sack: SackRanges::new(),
                ..real
            },
            &[],
        ),
    ];
    let mut rng = Rng::new(0x0ff_9a7e);
    let mut d = vec![0u8; 2048];
    for (name, template, payload) in kinds {
        let before = p.b.conn.stats();
        for _ in 0..ATTEMPTS {
            let h = Repr {
                dst_conn: rng.next_u64() as u32,
                psn: rng.next_u64() as u32,
                ack_psn: if template.opcode == Opcode::Data {
                    template.ack_psn
                } else {
                    rng.next_u64() as u32
                },
                ..template
            };
            let hl = h.buffer_len();
            h.emit(&mut d);
            d[hl..hl + payload.len()].copy_from_slice(payload);
            let n = crc::seal(&mut d, hl + payload.len());
            let _ = p.b.conn.handle_datagram(p.now, &mut p.b.mem, &d[..n]);
        }
        let after = p.b.conn.stats();
        let foreign = after.rx_foreign - before.rx_foreign;
        assert_eq!(
            foreign,
            u64::from(ATTEMPTS),
            "{name}: {} of {ATTEMPTS} forged datagrams accepted",
            u64::from(ATTEMPTS) - foreign
        );
        assert_eq!(p.b.conn.state(), QpState::Rts, "{name}");
        assert!(p.b.conn.poll_completion().is_none(), "{name}");
        assert!(p.b.conn.poll_event().is_none(), "{name}");
    }
    let mut target = vec![0u8; LEN];
    p.b.mem.read(TARGET, &mut target);
    assert_eq!(target, target_before, "forged Writes placed data");

    // The real segment still lands and completes: the connection carried on.
    p.b.conn
        .handle_datagram(p.now, &mut p.b.mem, &write)
        .unwrap();
    let done = p.run_until(trp::Instant(p.now.0 + 5_000_000_000), |p| {
        p.a.conn.poll_completion().is_some()
    });
    assert!(done, "the real Write did not complete");
    p.b.mem.read(TARGET, &mut target);
    assert_eq!(target, vec![0xa5; LEN]);
}
