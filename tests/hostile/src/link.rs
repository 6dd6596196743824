//! The link as a hostile host sees it: a packet socket on one interface that reads every
//! frame crossing it (both directions) and sends frames of its own making, and the
//! Ethernet/IPv4/UDP framing of the datagrams it reads and forges.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

pub type Mac = [u8; 6];

/// One UDP datagram read off the link, with the MACs of its frame.
pub struct Datagram<'a> {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub payload: &'a [u8],
}

/// The UDP datagram a frame carries, if it carries a whole one whose checksums hold
/// (`urdma_shared::frame`, the framing every part of urdma uses).
pub fn parse(frame: &[u8]) -> Option<Datagram<'_>> {
    let d = urdma_shared::frame::datagram(frame)?;
    Some(Datagram {
        dst_mac: frame.get(0..6)?.try_into().ok()?,
        src_mac: frame.get(6..12)?.try_into().ok()?,
        src: d.src,
        dst: d.dst,
        payload: d.payload,
    })
}

/// An Ethernet frame carrying `payload` from `src` to `dst` in one UDP datagram, with
/// correct checksums: a receiver that checks them must not be what stops a forgery.
pub fn frame(
    src_mac: Mac,
    dst_mac: Mac,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &[u8],
) -> Vec<u8> {
    urdma_shared::frame::udp_frame(dst_mac, src_mac, src, dst, payload)
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

    /// The next datagram from `src` to `dst` that crosses the link before `until` (frames of
    /// anything else are passed over), or `None` once `until` has passed.
    pub fn next_between<'b>(
        &self,
        buf: &'b mut [u8],
        src: SocketAddrV4,
        dst: SocketAddrV4,
        until: std::time::Instant,
    ) -> io::Result<Option<Datagram<'b>>> {
        let mut len = None;
        while len.is_none() {
            let Some(left) = until.checked_duration_since(std::time::Instant::now()) else {
                return Ok(None);
            };
            if let Some(f) = self.recv(buf, left.min(Duration::from_millis(100)))? {
                len = parse(f)
                    .filter(|d| d.src == src && d.dst == dst)
                    .map(|_| f.len());
            }
        }
        Ok(len.and_then(|n| parse(&buf[..n])))
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
    use std::net::Ipv4Addr;

    #[test]
    fn a_frame_reads_back_as_it_was_made() {
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 4791);
        let b = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), 50000);
        let f = frame([1; 6], [2; 6], a, b, b"hello, odd");
        let d = parse(&f).unwrap();
        assert_eq!((d.src, d.dst, d.src_mac, d.dst_mac), (a, b, [1; 6], [2; 6]));
        assert_eq!(d.payload, b"hello, odd");
        for cut in 0..f.len() {
            // cut-off frames never parse and never panic
            assert!(parse(&f[..cut]).is_none());
        }
    }
}
