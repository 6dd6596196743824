//! A hostile host on the link. It sees every frame of a live connection (an on-path
//! attacker: it learns the connection id, the PSNs and the addresses by watching) and
//! forges datagrams that claim to come from one end, A, to the other, B: RDMA Writes and
//! Read Requests aimed where B's application gave no rights, forged ACKs and SACKs for
//! data never sent, FIN and Terminate, datagrams that are garbage or malformed. It then
//! reports how B answered (the Terminate it sent back, if any), one line:
//!
//! ```text
//! urdma-hostile IFACE A_IP:PORT B_IP:PORT write STAG TO LEN
//! urdma-hostile IFACE A_IP:PORT B_IP:PORT read STAG TO LEN
//! urdma-hostile IFACE A_IP:PORT B_IP:PORT ack|sack|fin|terminate|malformed
//! urdma-hostile IFACE A_IP:PORT B_IP:PORT junk COUNT
//! urdma-hostile IFACE flood SRC_IP DST_MAC DST_IP:PORT COUNT [PER_SECOND]
//! ```
//!
//! Output: `answer terminate layer=ddp etype=1 code=0`, `answer abort` or `answer none`
//! (nothing within `HOSTILE_WAIT_MS`, default 3000). `flood` sends COUNT ConnectRequests to
//! a listener, each from its own source port with its own connection id and private data,
//! PER_SECOND of them a second (default: as fast as the socket takes them, which a receiver
//! on the same emulated host mostly drops before anyone reads them).
//! Used by tests/vm/63-e2e-hostile.sh; exits 2 with one line on bad arguments, 1 when the
//! link cannot be used or the connection is never seen.

mod link;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use link::{Mac, Tap};
use trp::wire::crc;
use trp::wire::ddp::{self, BufferRef};
use trp::wire::rdmap::{self, Layer, ReadRequest, Terminate};
use trp::wire::segment::{self, Body};
use trp::wire::trp::{Opcode as TrpOp, Packet, Repr as Header, SackRanges};

/// splitmix64: reproducible junk and requesters (trp's simulator has one, behind a feature
/// the tool does not want to turn on for the whole workspace).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Below `n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            c.copy_from_slice(&self.next_u64().to_le_bytes()[..c.len()]);
        }
    }
}

/// How long to watch for a datagram of the connection before giving up.
const SNIFF: Duration = Duration::from_secs(20);

fn usage(why: &str) -> ! {
    eprintln!("urdma-hostile: {why} (usage: see the top of tests/hostile/src/main.rs)");
    std::process::exit(2)
}

fn die(why: impl std::fmt::Display) -> ! {
    eprintln!("urdma-hostile: {why}");
    std::process::exit(1)
}

fn number(s: &str) -> u64 {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.unwrap_or_else(|_| usage(&format!("'{s}' is not a number")))
}

fn addr(s: &str) -> SocketAddrV4 {
    s.parse()
        .unwrap_or_else(|_| usage(&format!("'{s}' is not an IPv4 address with a port")))
}

fn mac(s: &str) -> Mac {
    let v: Vec<u8> = s
        .split(':')
        .map(|x| {
            u8::from_str_radix(x, 16).unwrap_or_else(|_| usage(&format!("'{s}' is not a MAC")))
        })
        .collect();
    v.try_into()
        .unwrap_or_else(|_| usage(&format!("'{s}' is not a MAC")))
}

/// What a forged datagram carries.
enum Attack {
    Write { stag: u32, to: u64, len: usize },
    Read { stag: u32, to: u64, len: u32 },
    Ack,
    Sack,
    Fin,
    Terminate,
    Malformed,
    Junk(u32),
}

fn attack(args: &[String]) -> Attack {
    let a = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .unwrap_or_else(|| usage("too few arguments"))
    };
    let n = |i: usize| number(a(i));
    let u32_of =
        |i: usize| u32::try_from(n(i)).unwrap_or_else(|_| usage("a 32-bit value is too large"));
    match a(0) {
        "write" => Attack::Write {
            stag: u32_of(1),
            to: n(2),
            len: usize::try_from(n(3))
                .ok()
                .filter(|&l| l <= 1024)
                .unwrap_or_else(|| usage("write LEN is at most 1024")),
        },
        "read" => Attack::Read {
            stag: u32_of(1),
            to: n(2),
            len: u32_of(3),
        },
        "ack" => Attack::Ack,
        "sack" => Attack::Sack,
        "fin" => Attack::Fin,
        "terminate" => Attack::Terminate,
        "malformed" => Attack::Malformed,
        "junk" => Attack::Junk(u32_of(1)),
        other => usage(&format!("unknown attack '{other}'")),
    }
}

/// A live connection as seen from the link: what A would put in its next datagram.
struct Seen {
    a_mac: Mac,
    b_mac: Mac,
    /// B's connection id (the destination of A's datagrams).
    conn: u32,
    /// The PSN A's next datagram would carry.
    next_psn: u32,
    /// The last PSN of B's that A acknowledged.
    ack_psn: u32,
    window: u16,
    sealed: bool,
}

/// The TRP header and the rest of a TRP datagram read off the link.
fn trp_of(payload: &[u8]) -> Option<(Header, &[u8], bool)> {
    let (opened, sealed) = crc::open(payload).ok()?;
    let h = Header::parse(&Packet::new_unchecked(opened)).ok()?;
    Some((h, opened.get(h.buffer_len()..)?, sealed))
}

/// Watches the link until A sends B a datagram and returns at once, so that the forgery
/// goes out before A's next one. A's Data datagrams carry the PSN they take, its ACKs and
/// keep-alive probes the PSN its next Data datagram will take; either way the connection's
/// next PSN is known. (On a connection A sends no data on, nothing A sends later takes the
/// PSN the forgery took.)
fn sniff(tap: &Tap, a: SocketAddrV4, b: SocketAddrV4) -> Seen {
    let mut buf = vec![0u8; 65536];
    let until = Instant::now() + SNIFF;
    while let Some(d) = tap
        .next_between(&mut buf, a, b, until)
        .unwrap_or_else(|e| die(e))
    {
        let Some((h, _, sealed)) = trp_of(d.payload) else {
            continue;
        };
        let next_psn = match h.opcode {
            TrpOp::Data => h.psn.wrapping_add(1),
            TrpOp::Ack | TrpOp::Sack => h.psn,
            _ => continue,
        };
        return Seen {
            a_mac: d.src_mac,
            b_mac: d.dst_mac,
            conn: h.dst_conn,
            next_psn,
            ack_psn: h.ack_psn,
            window: h.window,
            sealed,
        };
    }
    die(format!(
        "nothing from {a} to {b} on the link in {} s",
        SNIFF.as_secs()
    ))
}

/// A TRP datagram from A to B carrying `segment` (Data) or nothing, sealed as A seals.
fn datagram(s: &Seen, opcode: TrpOp, ack_psn: u32, sack: SackRanges, segment: &[u8]) -> Vec<u8> {
    let h = Header {
        opcode,
        flags: 0,
        dst_conn: s.conn,
        psn: if opcode.consumes_psn() { s.next_psn } else { 0 },
        ack_psn,
        window: s.window,
        sack,
    };
    let hl = h.buffer_len();
    let mut d = vec![0u8; hl + segment.len() + crc::TRAILER_LEN];
    h.emit(&mut d);
    d[hl..hl + segment.len()].copy_from_slice(segment);
    let n = if s.sealed {
        crc::seal(&mut d, hl + segment.len())
    } else {
        hl + segment.len()
    };
    d.truncate(n);
    d
}

/// A DDP segment: `header` then `body`.
fn segment(header: ddp::Repr, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; header.buffer_len() + body.len()];
    header.emit(&mut v);
    v[header.buffer_len()..].copy_from_slice(body);
    v
}

fn untagged(op: rdmap::Opcode, qn: u32) -> ddp::Repr {
    ddp::Repr {
        last: true,
        ulp_control: op.control_byte(),
        buffer: BufferRef::Untagged {
            ulp_word: 0,
            qn,
            msn: 1,
            mo: 0,
        },
    }
}

/// The datagrams an attack sends.
fn forge(s: &Seen, what: &Attack) -> Vec<Vec<u8>> {
    let none = SackRanges::new();
    let data = |seg: Vec<u8>| vec![datagram(s, TrpOp::Data, s.ack_psn, SackRanges::new(), &seg)];
    match *what {
        Attack::Write { stag, to, len } => {
            let h = ddp::Repr {
                last: true,
                ulp_control: rdmap::Opcode::RdmaWrite.control_byte(),
                buffer: BufferRef::Tagged { stag, to },
            };
            data(segment(h, &vec![0xee; len]))
        }
        Attack::Read { stag, to, len } => {
            let mut body = [0u8; rdmap::READ_REQUEST_LEN];
            ReadRequest {
                sink_stag: 0x4242_4242,
                sink_to: 0,
                size: len,
                src_stag: stag,
                src_to: to,
            }
            .emit(&mut body);
            data(segment(
                untagged(rdmap::Opcode::ReadRequest, rdmap::qn::READ_REQUEST),
                &body,
            ))
        }
        // acknowledges a million PSNs of B's that B never sent
        Attack::Ack => vec![datagram(
            s,
            TrpOp::Ack,
            s.ack_psn.wrapping_add(1_000_000),
            none,
            &[],
        )],
        Attack::Sack => {
            let mut sack = SackRanges::new();
            sack.push(s.ack_psn.wrapping_add(10), s.ack_psn.wrapping_add(1000));
            vec![datagram(s, TrpOp::Sack, s.ack_psn, sack, &[])]
        }
        Attack::Fin => vec![datagram(s, TrpOp::Fin, s.ack_psn, none, &[])],
        Attack::Terminate => {
            let t = Terminate {
                layer: Layer::Rdmap,
                etype: 2,
                code: 0xff,
                ddp_header: None,
                rdmap_header: None,
            };
            let mut body = vec![0u8; t.buffer_len()];
            t.emit(&mut body);
            data(segment(
                untagged(rdmap::Opcode::Terminate, rdmap::qn::TERMINATE),
                &body,
            ))
        }
        Attack::Malformed => {
            // a Send whose DDP header names DDP version 0 (RFC 5041 asks for 1)
            let mut seg = segment(untagged(rdmap::Opcode::Send, rdmap::qn::SEND), &[0x55; 64]);
            seg[0] &= !0x03;
            data(seg)
        }
        Attack::Junk(count) => junk(s, count),
    }
}

/// Datagrams the TRP layer must drop as they come: random bytes, wrong TRP versions,
/// impossible SACK counts, cut-off headers, wrong CRC trailers, oversized ones.
fn junk(s: &Seen, count: u32) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(u64::from(s.conn) ^ 0x6a75_6e6b);
    let mut out = Vec::new();
    let real = datagram(s, TrpOp::Data, s.ack_psn, SackRanges::new(), &[0x11; 100]);
    for i in 0..count {
        let mut d = match i % 6 {
            0 => {
                let mut d = vec![0u8; rng.below(1400) as usize];
                rng.fill(&mut d);
                d
            }
            1 => {
                let mut d = real.clone();
                d[0] = 2 + rng.below(250) as u8; // TRP version
                d
            }
            2 => {
                let mut d = real.clone();
                d[3] = 5 + rng.below(250) as u8; // more SACK ranges than there can be
                d
            }
            3 => real[..rng.below(20) as usize].to_vec(),
            4 => {
                let mut d = real.clone();
                let n = d.len();
                d[n - 1] ^= 1 + rng.below(255) as u8; // the trailer no longer matches
                if !s.sealed {
                    d[2] |= crc::FLAG_CRC;
                }
                d
            }
            _ => {
                // as large as the link takes: junk after a header that is right
                let mut d = vec![0u8; 1472];
                d[..20].copy_from_slice(&real[..20]);
                rng.fill(&mut d[20..]);
                d[2] = 0;
                d
            }
        };
        d.truncate(1472);
        out.push(d);
    }
    out
}

/// How B answered: its first Terminate or Abort to A within `wait`.
fn answer(tap: &Tap, a: SocketAddrV4, b: SocketAddrV4, wait: Duration) -> String {
    let mut buf = vec![0u8; 65536];
    let until = Instant::now() + wait;
    let mut seen = "answer none".to_string();
    while let Some(d) = tap
        .next_between(&mut buf, b, a, until)
        .unwrap_or_else(|e| die(e))
    {
        let Some((h, rest, _)) = trp_of(d.payload) else {
            continue;
        };
        match h.opcode {
            TrpOp::Abort => seen = "answer abort".to_string(),
            TrpOp::Data => {
                if let Ok((_, Body::Terminate(t))) = segment::Repr::parse(rest) {
                    let layer = match t.layer {
                        Layer::Rdmap => "rdmap",
                        Layer::Ddp => "ddp",
                        Layer::Llp => "llp",
                    };
                    return format!(
                        "answer terminate layer={layer} etype={} code={}",
                        t.etype, t.code
                    );
                }
            }
            _ => {}
        }
    }
    seen
}

fn wait_ms() -> Duration {
    Duration::from_millis(
        std::env::var("HOSTILE_WAIT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3000),
    )
}

/// ConnectRequests from `count` made-up requesters (random source port, connection id and
/// initial PSN, 32 bytes of private data) to a listener.
fn flood(
    tap: &Tap,
    src_mac: Mac,
    src_ip: Ipv4Addr,
    dst_mac: Mac,
    dst: SocketAddrV4,
    count: u32,
    per_second: Option<u32>,
) {
    let mut rng = Rng::new(u64::from(src_ip.to_bits()) ^ u64::from(dst.port()) ^ 0xf100d);
    let now = trp::Instant(0);
    let mut buf = vec![0u8; 2048];
    let mut sent = 0u32;
    let start = Instant::now();
    for _ in 0..count {
        let conn = (rng.next_u64() as u32).max(1);
        let mut pdata = [0u8; 32];
        rng.fill(&mut pdata);
        let mut c = trp::setup::Connecting::new(
            trp::Config::default(),
            conn,
            rng.next_u64() as u32,
            &pdata,
            now,
        )
        .unwrap_or_else(|e| die(format!("ConnectRequest: {e:?}")));
        let Some(n) = c.poll_transmit(now, &mut buf) else {
            die("no ConnectRequest")
        };
        let src = SocketAddrV4::new(src_ip, 1024 + rng.below(64511) as u16);
        let f = link::frame(src_mac, dst_mac, src, dst, &buf[..n]);
        // the socket's queue may be full for a moment: try again rather than count a loss
        loop {
            match tap.send(&f) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => die(format!("send: {e}")),
            }
        }
        sent += 1;
        if let Some(r) = per_second {
            let due = start + Duration::from_secs_f64(f64::from(sent) / f64::from(r.max(1)));
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    }
    println!(
        "flood sent={sent} to={dst} in_ms={}",
        start.elapsed().as_millis()
    );
}

fn iface_mac(iface: &str) -> Mac {
    let s = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))
        .unwrap_or_else(|e| die(format!("{iface}: {e}")));
    mac(s.trim())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        usage("too few arguments");
    }
    let iface = &args[0];
    let tap = Tap::open(iface).unwrap_or_else(|e| die(format!("packet socket on {iface}: {e}")));
    if args[1] == "flood" {
        if !(6..=7).contains(&args.len()) {
            usage("flood SRC_IP DST_MAC DST_IP:PORT COUNT [PER_SECOND]");
        }
        let src_ip: Ipv4Addr = args[2].parse().unwrap_or_else(|_| usage("SRC_IP"));
        let count = u32::try_from(number(&args[5])).unwrap_or_else(|_| usage("COUNT"));
        let rate = args
            .get(6)
            .map(|r| u32::try_from(number(r)).unwrap_or_else(|_| usage("PER_SECOND")));
        flood(
            &tap,
            iface_mac(iface),
            src_ip,
            mac(&args[3]),
            addr(&args[4]),
            count,
            rate,
        );
        return;
    }
    let (a, b) = (addr(&args[1]), addr(&args[2]));
    let what = attack(&args[3..]);
    let s = sniff(&tap, a, b);
    let frames: Vec<Vec<u8>> = forge(&s, &what)
        .iter()
        .map(|d| link::frame(s.a_mac, s.b_mac, a, b, d))
        .collect();
    for f in &frames {
        tap.send(f).unwrap_or_else(|e| die(format!("send: {e}")));
    }
    eprintln!(
        "urdma-hostile: {} datagram(s) to conn {:#x} at psn {} (sealed {})",
        frames.len(),
        s.conn,
        s.next_psn,
        s.sealed
    );
    println!("{}", answer(&tap, a, b, wait_ms()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(sealed: bool) -> Seen {
        Seen {
            a_mac: [1; 6],
            b_mac: [2; 6],
            conn: 0x1234_5678,
            next_psn: 1000,
            ack_psn: 77,
            window: 512,
            sealed,
        }
    }

    /// The TRP header and DDP segment of a forged datagram, read back with trp's parsers.
    fn read_back(d: &[u8]) -> (Header, Option<(segment::Repr, Body<'_>)>) {
        let (h, rest, _) = trp_of(d).expect("a TRP datagram");
        let seg = (h.opcode == TrpOp::Data).then(|| segment::Repr::parse(rest).expect("a segment"));
        (h, seg)
    }

    #[test]
    fn forgeries_are_what_they_claim_to_be() {
        for sealed in [false, true] {
            let s = seen(sealed);
            let one = |a: Attack| {
                let v = forge(&s, &a);
                assert_eq!(v.len(), 1);
                v.into_iter().next().unwrap()
            };
            let w = one(Attack::Write {
                stag: 9,
                to: 0x1000,
                len: 100,
            });
            let (h, seg) = read_back(&w);
            assert_eq!((h.dst_conn, h.psn, h.ack_psn), (s.conn, 1000, 77));
            let (r, body) = seg.unwrap();
            assert_eq!(
                r.buffer,
                BufferRef::Tagged {
                    stag: 9,
                    to: 0x1000
                }
            );
            assert_eq!(body, Body::Data(&[0xee; 100][..]));

            let rr = one(Attack::Read {
                stag: 5,
                to: 8,
                len: 100_000,
            });
            let Some((_, Body::ReadRequest(q))) = read_back(&rr).1 else {
                panic!("not a Read Request")
            };
            assert_eq!((q.src_stag, q.src_to, q.size), (5, 8, 100_000));

            let t = one(Attack::Terminate);
            assert!(matches!(read_back(&t).1, Some((_, Body::Terminate(_)))));

            let (h, _) = read_back(&one(Attack::Ack));
            assert_eq!((h.opcode, h.ack_psn), (TrpOp::Ack, 77 + 1_000_000));
            let (h, _) = read_back(&one(Attack::Sack));
            assert_eq!(h.opcode, TrpOp::Sack);
            let (h, _) = read_back(&one(Attack::Fin));
            assert_eq!((h.opcode, h.psn), (TrpOp::Fin, 1000));

            // the malformed one is a good TRP datagram whose segment does not parse
            let m = one(Attack::Malformed);
            let (_, rest, _) = trp_of(&m).unwrap();
            assert!(segment::Repr::parse(rest).is_err());
        }
    }

    #[test]
    fn junk_never_reads_as_a_datagram_of_the_connection() {
        for sealed in [false, true] {
            let s = seen(sealed);
            for d in junk(&s, 600) {
                assert!(d.len() <= 1472);
                // either TRP refuses it outright, or it is not a sealed datagram of a
                // connection that seals (the connection drops those), or its segment is not
                // one: never a segment that would be placed
                if let Some((h, rest, was_sealed)) = trp_of(&d) {
                    let placeable = h.dst_conn == s.conn
                        && (was_sealed || !s.sealed)
                        && h.opcode == TrpOp::Data
                        && segment::Repr::parse(rest).is_ok();
                    assert!(
                        !placeable,
                        "junk that would be taken: {:02x?}",
                        &d[..20.min(d.len())]
                    );
                }
            }
        }
    }
}
