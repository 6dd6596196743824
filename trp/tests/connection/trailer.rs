//! The CRC32C trailer: when it is used and what it catches.

use super::*;

/// A Write of `len` bytes from a's local half to b's remote half over a link
/// that flips one bit in `rate` of the datagrams each way, which no checksum
/// catches (a middlebox that fixes the UDP checksum after it). Returns
/// whether the Write completed and whether b's memory holds what a sent.
fn write_through_corruption(p: &mut Pair, len: u32, rate: f64) -> (bool, bool) {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    p.a.mem.write(0, &data);
    for link in [&mut p.ab, &mut p.ba] {
        link.cfg.corrupt = rate;
        link.cfg.corrupt_detected = false;
    }
    send(
        p,
        1,
        SendOp::RdmaWrite {
            remote_addr: 1 << 19,
            rkey: 2,
        },
        &sge(0, len),
    );
    let done = p.run_until(trp::Instant(p.now.0 + 5_000_000_000), |p| {
        p.a.conn.poll_completion().is_some() || p.a.conn.state() != QpState::Rts
    });
    let mut got = vec![0u8; len as usize];
    p.b.mem.read(1 << 19, &mut got);
    (done && p.a.conn.state() == QpState::Rts, got == data)
}

#[test]
fn corruption_past_the_checksum_is_caught_by_the_trailer() {
    let mut p = pair(Config::default(), Config::default());
    let (completed, intact) = write_through_corruption(&mut p, 200_000, 0.05);
    assert!(
        completed && intact,
        "completed {completed}, intact {intact}"
    );
    let dropped = p.a.conn.stats().rx_crc_errors + p.b.conn.stats().rx_crc_errors;
    let corrupted = p.ab.stats.corrupted + p.ba.stats.corrupted;
    // Some corrupted datagrams may still be on the way when it completes.
    assert!(
        dropped > 0 && dropped <= corrupted,
        "{dropped} dropped, {corrupted} corrupted"
    );
}

/// What the trailer is for: with it off at both ends the same link puts
/// wrong bytes in memory (or breaks the connection).
#[test]
fn without_the_trailer_corruption_gets_through() {
    let off = Config {
        crc: false,
        ..Config::default()
    };
    let mut p = pair(off, off);
    let (completed, intact) = write_through_corruption(&mut p, 200_000, 0.05);
    assert!(!(completed && intact), "no corruption got through");
    assert_eq!(
        p.a.conn.stats().rx_crc_errors + p.b.conn.stats().rx_crc_errors,
        0
    );
}

/// The trailer is used when either end asks for it, and then on every
/// datagram both ends send after the ConnectRequest; never otherwise.
#[test]
fn trailer_is_used_when_either_end_asks() {
    use trp::wire::trp::{Opcode, Packet, FLAG_CRC};
    for (a, b) in [(true, true), (true, false), (false, true), (false, false)] {
        let cfg = |crc| Config {
            crc,
            ..Config::default()
        };
        let mut p = pair(cfg(a), cfg(b));
        post_recv(&mut p.b, 10, 0, 64);
        p.ab.capture = Some(Vec::new());
        p.ba.capture = Some(Vec::new());
        send(&mut p, 1, PLAIN_SEND, &sge(0, 10));
        // Until the Send is acknowledged: datagrams both ways.
        assert!(p.run_until(trp::Instant(p.now.0 + 100_000_000), |p| {
            p.a.conn.poll_completion().is_some()
        }));
        let sent: Vec<Vec<u8>> = [p.ab.capture.take(), p.ba.capture.take()]
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        assert!(sent.len() >= 2, "{a} {b}");
        for d in sent {
            let sealed = Packet::new_unchecked(&d[..]).flags() & FLAG_CRC != 0;
            assert_eq!(sealed, a || b, "a {a}, b {b}: opcode {}", d[1]);
            assert!(crc::open(&d).is_ok());
            assert_ne!(d[1], Opcode::ConnectRequest as u8);
        }
    }
}
