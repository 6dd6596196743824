//! Ethernet/IPv4/UDP framing of a connection's datagrams: headers written
//! in front of a payload trp has already put in place, checksums in
//! software (the UDP checksum is never 0 on IPv4: it is the only integrity
//! check a datagram has), and the checks a received frame must pass before
//! its payload reaches trp.

use std::net::SocketAddrV4;

pub const ETH_LEN: usize = 14;
pub const IP_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
/// Bytes in front of the UDP payload.
pub const HEADERS: usize = ETH_LEN + IP_LEN + UDP_LEN;

/// Both ends of a connection's flow, as `EVENT CONNECTED` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub local_mac: [u8; 6],
    pub remote_mac: [u8; 6],
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
}

fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
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
    let mut s = csum_add(0, &src.ip().octets());
    s = csum_add(s, &dst.ip().octets());
    s + 17 + u32::from(udp_len)
}

/// Writes the headers into `frame[..HEADERS]` for the `payload_len` bytes
/// at `frame[HEADERS..]`, from `ep.local` to `ep.remote`. Returns the
/// frame's length.
pub fn write_headers(frame: &mut [u8], ep: &Endpoints, payload_len: usize) -> usize {
    let udp_len = (UDP_LEN + payload_len) as u16;
    let ip_len = IP_LEN as u16 + udp_len;
    frame[0..6].copy_from_slice(&ep.remote_mac);
    frame[6..12].copy_from_slice(&ep.local_mac);
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut frame[ETH_LEN..ETH_LEN + IP_LEN];
    ip.fill(0);
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
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

/// The UDP payload of `frame` if it is an unfragmented IPv4/UDP datagram
/// from `ep.remote` to `ep.local` with valid checksums; None otherwise.
pub fn payload<'a>(frame: &'a [u8], ep: &Endpoints) -> Option<&'a [u8]> {
    if frame.len() < HEADERS || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[ETH_LEN..];
    if ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ihl < IP_LEN || total < ihl + UDP_LEN || total > ip.len() || ip[9] != 17 {
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
    if src != ep.remote || dst != ep.local {
        return None;
    }
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
    Some(&udp[UDP_LEN..])
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
        let mut f = vec![0u8; HEADERS + payload.len()];
        f[HEADERS..].copy_from_slice(payload);
        let n = write_headers(&mut f, e, payload.len());
        assert_eq!(n, f.len());
        f
    }

    #[test]
    fn matches_urdmads_reference_frame() {
        let e = ep();
        for p in [&b""[..], b"x", b"hello world", &[0xffu8; 1472]] {
            let f = build(&e, p);
            let reference = urdmad_udp_frame(e.remote_mac, e.local_mac, e.local, e.remote, p);
            assert_eq!(f, reference);
        }
    }

    /// The same construction as urdmad's `secondary::udp_frame` (which
    /// is built only with the daemon), restated independently.
    fn urdmad_udp_frame(
        dst_mac: [u8; 6],
        src_mac: [u8; 6],
        src: SocketAddrV4,
        dst: SocketAddrV4,
        payload: &[u8],
    ) -> Vec<u8> {
        let udp_len = 8 + payload.len();
        let mut f = Vec::new();
        f.extend_from_slice(&dst_mac);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&[8, 0]);
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
        ip[6] = 0x40;
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&src.ip().octets());
        ip[16..20].copy_from_slice(&dst.ip().octets());
        let c = csum_fold(csum_add(0, &ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        let mut udp = Vec::new();
        udp.extend_from_slice(&src.port().to_be_bytes());
        udp.extend_from_slice(&dst.port().to_be_bytes());
        udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend_from_slice(payload);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.ip().octets());
        pseudo.extend_from_slice(&dst.ip().octets());
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&(udp_len as u16).to_be_bytes());
        let mut c = csum_fold(csum_add(csum_add(0, &pseudo), &udp));
        if c == 0 {
            c = 0xffff;
        }
        udp[6..8].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&udp);
        f
    }

    #[test]
    fn round_trip_to_the_peer() {
        let e = ep();
        let f = build(&e, b"payload");
        assert_eq!(payload(&f, &mirror(&e)), Some(&b"payload"[..]));
        // Not for us: our own frame seen from our side.
        assert_eq!(payload(&f, &e), None);
        // Trailing Ethernet padding is ignored.
        let mut padded = build(&e, b"");
        padded.resize(60, 0);
        assert_eq!(payload(&padded, &mirror(&e)), Some(&b""[..]));
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
        let mut f = good.clone();
        f[ETH_LEN + 8] = 1;
        assert_eq!(payload(&f, &m), None, "IP checksum");
        let mut f = good.clone();
        f[12] = 0x86;
        assert_eq!(payload(&f, &m), None, "not IPv4");
        let mut f = good.clone();
        f[ETH_LEN + 6] = 0x20; // more fragments
        assert_eq!(payload(&f, &m), None);
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
        }
    }
}
