//! The link as a hostile host sees it: a packet socket on one interface that reads every
//! frame crossing it (both directions) and sends frames of its own making, and the
//! Ethernet/IPv4/UDP framing of the datagrams it reads and forges.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

pub type Mac = [u8; 6];

const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;
const UDP_LEN: usize = 8;
const HEADERS: usize = ETH_LEN + IP_LEN + UDP_LEN;

/// One UDP datagram read off the link (IPv4 without options or fragments only: nothing
/// else carries TRP).
pub struct Datagram<'a> {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub payload: &'a [u8],
}

/// Reads the UDP datagram a frame carries, if it carries one.
pub fn parse(frame: &[u8]) -> Option<Datagram<'_>> {
    let eth = frame.get(..ETH_LEN)?;
    if eth[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = frame.get(ETH_LEN..ETH_LEN + IP_LEN)?;
    // version 4, no options, UDP, not a fragment
    if ip[0] != 0x45 || ip[9] != 17 || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let udp = frame.get(ETH_LEN + IP_LEN..HEADERS)?;
    let ulen = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if ulen < UDP_LEN || total != IP_LEN + ulen {
        return None;
    }
    let payload = frame.get(HEADERS..ETH_LEN + IP_LEN + ulen)?;
    let addr = |a: &[u8], p: &[u8]| {
        SocketAddrV4::new(
            Ipv4Addr::new(a[0], a[1], a[2], a[3]),
            u16::from_be_bytes([p[0], p[1]]),
        )
    };
    Some(Datagram {
        dst_mac: eth[0..6].try_into().ok()?,
        src_mac: eth[6..12].try_into().ok()?,
        src: addr(&ip[12..16], &udp[0..2]),
        dst: addr(&ip[16..20], &udp[2..4]),
        payload,
    })
}

fn sum16(mut acc: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// An Ethernet frame carrying `payload` from `src` to `dst` in one UDP datagram, with
/// correct IPv4 and UDP checksums (a receiver that checks them must not be what stops it).
pub fn frame(
    src_mac: Mac,
    dst_mac: Mac,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &[u8],
) -> Vec<u8> {
    let ulen = UDP_LEN + payload.len();
    let mut f = vec![0u8; HEADERS + payload.len()];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[ETH_LEN..ETH_LEN + IP_LEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((IP_LEN + ulen) as u16).to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.ip().octets());
    ip[16..20].copy_from_slice(&dst.ip().octets());
    let c = fold(sum16(0, ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp_at = ETH_LEN + IP_LEN;
    f[udp_at..udp_at + 2].copy_from_slice(&src.port().to_be_bytes());
    f[udp_at + 2..udp_at + 4].copy_from_slice(&dst.port().to_be_bytes());
    f[udp_at + 4..udp_at + 6].copy_from_slice(&(ulen as u16).to_be_bytes());
    f[HEADERS..].copy_from_slice(payload);
    // pseudo-header, then the UDP header and payload
    let mut acc = sum16(0, &src.ip().octets());
    acc = sum16(acc, &dst.ip().octets());
    acc += 17 + ulen as u32;
    acc = sum16(acc, &f[udp_at..]);
    let c = match fold(acc) {
        0 => 0xffff,
        c => c,
    };
    f[udp_at + 6..udp_at + 8].copy_from_slice(&c.to_be_bytes());
    f
}

/// A packet socket bound to one interface: every frame that crosses it, sent or received.
pub struct Tap {
    fd: OwnedFd,
    ifindex: i32,
}

impl Tap {
    pub fn open(iface: &str) -> io::Result<Tap> {
        let name = std::ffi::CString::new(iface)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket call.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data; zero is a valid start.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = proto;
        sa.sll_ifindex = ifindex as i32;
        // SAFETY: a valid sockaddr_ll of the right size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tap {
            fd,
            ifindex: ifindex as i32,
        })
    }

    /// The next frame, or `None` when none came within `wait`.
    pub fn recv<'b>(&self, buf: &'b mut [u8], wait: Duration) -> io::Result<Option<&'b [u8]>> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
            return Ok(None);
        }
        // SAFETY: buf is writable for its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(&buf[..n as usize]))
    }

    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain data.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_ifindex = self.ifindex;
        sa.sll_halen = 6;
        sa.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: frame and sa are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back_as_it_was_made() {
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 4791);
        let b = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), 50000);
        let f = frame([1; 6], [2; 6], a, b, b"hello, odd");
        let d = parse(&f).unwrap();
        assert_eq!((d.src, d.dst, d.src_mac, d.dst_mac), (a, b, [1; 6], [2; 6]));
        assert_eq!(d.payload, b"hello, odd");
        // Both checksums verify: summing a header with its checksum gives 0xffff.
        assert_eq!(fold(sum16(0, &f[ETH_LEN..ETH_LEN + IP_LEN])), 0);
        let mut acc = sum16(0, &a.ip().octets());
        acc = sum16(acc, &b.ip().octets());
        acc += 17 + (f.len() - ETH_LEN - IP_LEN) as u32;
        assert_eq!(fold(sum16(acc, &f[ETH_LEN + IP_LEN..])), 0);
    }

    #[test]
    fn frames_that_are_not_udp_over_ipv4_are_left_alone() {
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 1);
        let f = frame([1; 6], [2; 6], a, a, &[0; 40]);
        for cut in 0..f.len() {
            // truncated frames never parse and never panic
            let _ = parse(&f[..cut]);
        }
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(parse(&arp).is_none());
        let mut frag = f.clone();
        frag[ETH_LEN + 7] = 1;
        assert!(parse(&frag).is_none());
    }
}
