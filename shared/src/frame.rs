//! Ethernet/IPv4/UDP framing of TRP datagrams, in one place for all who
//! build or read one: the provider's data path, urdmad's handshakes, Rejects
//! and Aborts, its steering and its test client. Only `std`: the provider
//! uses it without the daemon.
//!
//! Checksums are computed in software and the UDP checksum is never 0 on
//! IPv4: it is the only integrity check a datagram has, so a frame is
//! accepted only if both checksums hold.

use std::net::SocketAddrV4;

pub const ETH_LEN: usize = 14;
pub const IP_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
/// Bytes in front of the UDP payload of the frames we build.
pub const HEADERS: usize = ETH_LEN + IP_LEN + UDP_LEN;
const ETHERTYPE_IPV4: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;

/// Both ends of a connection's flow, as `EVENT CONNECTED` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub local_mac: [u8; 6],
    pub remote_mac: [u8; 6],
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
}

/// A received IPv4/UDP datagram whose checksums hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub payload: &'a [u8],
}

/// Adds `data`, as big-endian 16-bit words (an odd last byte padded with zero), to the
/// partial one's-complement sum `sum`; [`csum_fold`] finishes it.
///
/// Every frame's payload is summed on both ends (a 1,472-byte datagram is 736 words), so
/// the bulk goes eight bytes at a time in native order, with the carries added back in:
/// the one's-complement sum does not depend on byte order (RFC 1071, section 2), so the
/// native sum, folded to 16 bits, is the big-endian one byte-swapped.
fn csum_add(sum: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(8);
    let mut acc: u64 = 0;
    for w in &mut words {
        let v = u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        let (s, carry) = acc.overflowing_add(v);
        acc = s + u64::from(carry);
    }
    let mut n = (acc & 0xffff_ffff) + (acc >> 32);
    n = (n & 0xffff) + (n >> 16);
    n = (n & 0xffff) + (n >> 16);
    n = (n & 0xffff) + (n >> 16);
    let mut sum = sum + u32::from(u16::from_be(n as u16));
    let mut rest = words.remainder().chunks_exact(2);
    for c in &mut rest {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = rest.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn pseudo_sum(src: &SocketAddrV4, dst: &SocketAddrV4, udp_len: u16) -> u32 {
    let halves = |a: &SocketAddrV4| {
        let ip = u32::from(*a.ip());
        (ip >> 16) + (ip & 0xffff)
    };
    halves(src) + halves(dst) + u32::from(IPPROTO_UDP) + u32::from(udp_len)
}

/// Writes the headers into `frame[..HEADERS]` for the `payload_len` bytes
/// at `frame[HEADERS..]`, from `ep.local` to `ep.remote`. Returns the
/// frame's length.
#[inline]
pub fn write_headers(frame: &mut [u8], ep: &Endpoints, payload_len: usize) -> usize {
    let udp_len = (UDP_LEN + payload_len) as u16;
    let ip_len = IP_LEN as u16 + udp_len;
    frame[0..6].copy_from_slice(&ep.remote_mac);
    frame[6..12].copy_from_slice(&ep.local_mac);
    frame[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip = &mut frame[ETH_LEN..ETH_LEN + IP_LEN];
    ip.fill(0);
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = IPPROTO_UDP;
    ip[12..16].copy_from_slice(&ep.local.ip().octets());
    ip[16..20].copy_from_slice(&ep.remote.ip().octets());
    let c = csum_fold(csum_add(0, ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let u = ETH_LEN + IP_LEN;
    frame[u..u + 2].copy_from_slice(&ep.local.port().to_be_bytes());
    frame[u + 2..u + 4].copy_from_slice(&ep.remote.port().to_be_bytes());
    frame[u + 4..u + 6].copy_from_slice(&udp_len.to_be_bytes());
    frame[u + 6..u + 8].fill(0);
    let end = u + usize::from(udp_len);
    let sum = csum_add(pseudo_sum(&ep.local, &ep.remote, udp_len), &frame[u..end]);
    let mut c = csum_fold(sum);
    if c == 0 {
        c = 0xffff;
    }
    frame[u + 6..u + 8].copy_from_slice(&c.to_be_bytes());
    end
}

/// A whole frame carrying `payload` from `src` to `dst`.
pub fn udp_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &[u8],
) -> Vec<u8> {
    let ep = Endpoints {
        local_mac: src_mac,
        remote_mac: dst_mac,
        local: src,
        remote: dst,
    };
    let mut f = vec![0u8; HEADERS + payload.len()];
    f[HEADERS..].copy_from_slice(payload);
    write_headers(&mut f, &ep, payload.len());
    f
}

/// The datagram in `frame` if it is an unfragmented IPv4/UDP datagram with
/// valid checksums (Ethernet padding after it is ignored); None otherwise.
#[inline]
pub fn datagram(frame: &[u8]) -> Option<Datagram<'_>> {
    if frame.len() < HEADERS || frame[12..14] != ETHERTYPE_IPV4.to_be_bytes() {
        return None;
    }
    let ip = &frame[ETH_LEN..];
    if ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ihl < IP_LEN || total < ihl + UDP_LEN || total > ip.len() || ip[9] != IPPROTO_UDP {
        return None;
    }
    // More fragments, or a fragment offset: not a whole datagram.
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    if csum_fold(csum_add(0, &ip[..ihl])) != 0 {
        return None;
    }
    let src = SocketAddrV4::new(
        [ip[12], ip[13], ip[14], ip[15]].into(),
        u16::from_be_bytes([ip[ihl], ip[ihl + 1]]),
    );
    let dst = SocketAddrV4::new(
        [ip[16], ip[17], ip[18], ip[19]].into(),
        u16::from_be_bytes([ip[ihl + 2], ip[ihl + 3]]),
    );
    let udp = &ip[ihl..total];
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if udp_len < UDP_LEN || udp_len > udp.len() {
        return None;
    }
    let udp = &udp[..udp_len];
    if udp[6..8] != [0, 0] {
        let sum = csum_add(pseudo_sum(&src, &dst, udp_len as u16), udp);
        if csum_fold(sum) != 0 {
            return None;
        }
    }
    Some(Datagram {
        src,
        dst,
        payload: &udp[UDP_LEN..],
    })
}

/// The UDP payload of `frame` if [`datagram`] accepts it and it goes from
/// `ep.remote` to `ep.local`; None otherwise.
#[inline]
pub fn payload<'a>(frame: &'a [u8], ep: &Endpoints) -> Option<&'a [u8]> {
    datagram(frame)
        .filter(|d| d.src == ep.remote && d.dst == ep.local)
        .map(|d| d.payload)
}

/// Destination and source of an IPv4/UDP frame, or `None` for anything else
/// (including IP fragments; options-bearing headers are fine). Checks no
/// checksum: this is steering, for every frame; the flow's owner checks.
/// Never reads beyond `frame`.
#[inline]
pub fn udp4_addresses(frame: &[u8]) -> Option<(SocketAddrV4, SocketAddrV4)> {
    if frame.len() < ETH_LEN + IP_LEN + UDP_LEN {
        return None;
    }
    if u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = &frame[ETH_LEN..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ihl < IP_LEN || ip[9] != IPPROTO_UDP {
        return None;
    }
    // More-fragments flag or a fragment offset: reassembly is the kernel's job.
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let udp = ip.get(ihl..ihl + UDP_LEN)?;
    let src = SocketAddrV4::new(
        [ip[12], ip[13], ip[14], ip[15]].into(),
        u16::from_be_bytes([udp[0], udp[1]]),
    );
    let dst = SocketAddrV4::new(
        [ip[16], ip[17], ip[18], ip[19]].into(),
        u16::from_be_bytes([udp[2], udp[3]]),
    );
    Some((dst, src))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep() -> Endpoints {
        Endpoints {
            local_mac: [2, 0, 0, 0, 0, 1],
            remote_mac: [2, 0, 0, 0, 0, 2],
            local: "10.0.0.1:4791".parse().unwrap(),
            remote: "10.0.0.2:5000".parse().unwrap(),
        }
    }

    fn mirror(e: &Endpoints) -> Endpoints {
        Endpoints {
            local_mac: e.remote_mac,
            remote_mac: e.local_mac,
            local: e.remote,
            remote: e.local,
        }
    }

    fn build(e: &Endpoints, payload: &[u8]) -> Vec<u8> {
        udp_frame(e.remote_mac, e.local_mac, e.local, e.remote, payload)
    }

    /// The fields RFC 791 and 768 fix, and the receiver's check of both
    /// checksums (a header summed with its checksum folds to 0).
    #[test]
    fn headers_are_the_standard_ones() {
        let e = ep();
        let f = build(&e, b"hi");
        assert_eq!(f.len(), HEADERS + 2);
        assert_eq!(&f[0..6], &e.remote_mac);
        assert_eq!(&f[6..12], &e.local_mac);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        let ip = &f[ETH_LEN..ETH_LEN + IP_LEN];
        assert_eq!(ip[0], 0x45);
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 30);
        assert_eq!(&ip[6..10], &[0x40, 0, 64, 17]);
        assert_eq!(&ip[12..20], &[10, 0, 0, 1, 10, 0, 0, 2]);
        // The standard check: a header with its checksum sums to 0xffff.
        assert_eq!(csum_fold(csum_add(0, ip)), 0);
        let udp = &f[ETH_LEN + IP_LEN..];
        assert_eq!(&udp[..6], &[0x12, 0xb7, 0x13, 0x88, 0, 10]);
        assert_eq!(
            csum_fold(csum_add(pseudo_sum(&e.local, &e.remote, 10), udp)),
            0
        );
        assert_eq!(udp4_addresses(&f), Some((e.remote, e.local)));
    }

    #[test]
    fn round_trip_to_the_peer() {
        let e = ep();
        let f = build(&e, b"payload");
        assert_eq!(payload(&f, &mirror(&e)), Some(&b"payload"[..]));
        assert_eq!(
            datagram(&f),
            Some(Datagram {
                src: e.local,
                dst: e.remote,
                payload: b"payload"
            })
        );
        // Not for us: our own frame seen from our side.
        assert_eq!(payload(&f, &e), None);
        // Trailing Ethernet padding is ignored.
        let mut padded = build(&e, b"");
        padded.resize(60, 0);
        assert_eq!(payload(&padded, &mirror(&e)), Some(&b""[..]));
    }

    /// The sum taken eight bytes at a time in native order is the one of RFC 768's 16-bit
    /// big-endian words, for every length and alignment.
    #[test]
    fn checksum_sum_matches_the_word_by_word_definition() {
        fn by_words(mut sum: u32, data: &[u8]) -> u32 {
            let mut words = data.chunks_exact(2);
            for c in &mut words {
                sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
            }
            if let [last] = words.remainder() {
                sum += u32::from(*last) << 8;
            }
            sum
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let bytes: Vec<u8> = (0..1600)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let ones = vec![0xffu8; 9000];
        for data in [&bytes[..], &ones[..]] {
            for start in 0..4 {
                for len in (0..40).chain([1471, 1472, 1473, 1475, 1596]) {
                    let Some(d) = data.get(start..start + len) else {
                        continue;
                    };
                    for seed in [0, 0x1234, 0xfffe] {
                        assert_eq!(
                            csum_fold(csum_add(seed, d)),
                            csum_fold(by_words(seed, d)),
                            "start {start} len {len} seed {seed:#x}"
                        );
                    }
                }
            }
        }
        assert_eq!(csum_fold(csum_add(0, &ones)), csum_fold(by_words(0, &ones)));
    }

    #[test]
    fn udp_checksum_is_never_zero() {
        // Find a payload whose checksum folds to 0 and check it is sent as 0xffff.
        let e = ep();
        let base = build(&e, &[0, 0]);
        let u = ETH_LEN + IP_LEN;
        let c = u16::from_be_bytes([base[u + 6], base[u + 7]]);
        // Adding (c) to the sum in the payload makes the folded sum 0xffff,
        // whose complement is 0.
        let f = build(&e, &c.to_be_bytes());
        assert_eq!(&f[u + 6..u + 8], &[0xff, 0xff]);
        assert_eq!(payload(&f, &mirror(&e)), Some(&c.to_be_bytes()[..]));
    }

    #[test]
    fn damaged_or_foreign_frames_are_refused() {
        let e = ep();
        let m = mirror(&e);
        let good = build(&e, b"abcdefgh");
        let mut f = good.clone();
        f[HEADERS + 2] ^= 1;
        assert_eq!(payload(&f, &m), None, "UDP checksum");
        assert_eq!(datagram(&f), None, "UDP checksum");
        let mut f = good.clone();
        f[ETH_LEN + 8] = 1;
        assert_eq!(payload(&f, &m), None, "IP checksum");
        let mut f = good.clone();
        f[12] = 0x86;
        assert_eq!(payload(&f, &m), None, "not IPv4");
        assert_eq!(udp4_addresses(&f), None, "not IPv4");
        let mut f = good.clone();
        f[ETH_LEN + 6] = 0x20; // more fragments
        assert_eq!(payload(&f, &m), None);
        assert_eq!(udp4_addresses(&f), None);
        let f = build(
            &Endpoints {
                local: "10.0.0.2:5001".parse().unwrap(),
                ..e
            },
            b"x",
        );
        assert_eq!(payload(&f, &m), None, "other source port");
        assert_eq!(payload(&good[..HEADERS - 1], &m), None);
        assert_eq!(payload(&good[..good.len() - 1], &m), None, "truncated");
        for cut in 0..good.len() {
            let _ = payload(&good[..cut], &m);
            let _ = datagram(&good[..cut]);
            let _ = udp4_addresses(&good[..cut]);
        }
    }
}
