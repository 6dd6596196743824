//! Descriptors over the control socket: urdmad passes a connection's socket and its bell's
//! maps with `EVENT CONNECTED`, and a process gives the socket back with `GIVEBACK`, each
//! attached (`SCM_RIGHTS`) to the bytes of its line.
//!
//! Only `std` and `libc`, as [`crate::direct`].

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Writes all of `data` to `sock`, with `fd` attached to its first byte (`SCM_RIGHTS`).
pub fn send_with_fd(sock: &UnixStream, data: &[u8], fd: RawFd) -> io::Result<()> {
    send_with_fds(sock, data, &[fd])
}

/// Most descriptors [`send_with_fds`] passes with one message.
pub const MAX_SEND_FDS: usize = 3;

/// Writes all of `data` to `sock`, with `fds` (at most [`MAX_SEND_FDS`]) attached to its
/// first byte, in order.
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let n = send_with_fds_flags(sock, data, fds, 0)?;
    let rest = &data[n..];
    if !rest.is_empty() {
        use std::io::Write;
        (&*sock).write_all(rest)?;
    }
    Ok(())
}

/// One `sendmsg` of `data` with `fds` and `flags` (`MSG_DONTWAIT`: without waiting): the bytes
/// it took, the descriptors with the first of them.
pub fn send_with_fds_flags(
    sock: &UnixStream,
    data: &[u8],
    fds: &[RawFd],
    flags: i32,
) -> io::Result<usize> {
    if fds.is_empty() || fds.len() > MAX_SEND_FDS {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let bytes = std::mem::size_of_val(fds) as u32;
    let mut space = [0u64; 6];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: all-zero is a valid msghdr; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
    // SAFETY: msg_control has room for one header and three descriptors (CMSG_SPACE(12) =
    // 32 bytes of the 48).
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
        let data = libc::CMSG_DATA(c).cast::<RawFd>();
        for (i, &fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data.add(i), fd);
        }
    }
    // SAFETY: a valid msghdr; MSG_NOSIGNAL: a gone peer is an error, not SIGPIPE.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Whether a read of `asked` bytes that returned `got` took everything the socket had: a
/// short read that brought no descriptors (`fds_came`). The kernel ends a read after the
/// bytes that carry descriptors, with more behind them, so such a read says nothing. A
/// reader that stops here reads every line written before its read, and saves the read
/// that would only say `EAGAIN`.
pub fn read_all_there(got: usize, asked: usize, fds_came: bool) -> bool {
    got < asked && !fds_came
}

/// Appends to `buf` every line `sock` (non-blocking) had when called ([`read_all_there`]),
/// and queues the descriptors that came with them on `fds`. False when the peer closed it
/// or reading failed.
pub fn read_there(sock: &UnixStream, buf: &mut Vec<u8>, fds: &mut VecDeque<OwnedFd>) -> bool {
    let mut chunk = [0u8; 1024];
    loop {
        let held = fds.len();
        match recv_with_fds(sock, &mut chunk, fds) {
            Ok(0) => return false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if read_all_there(n, chunk.len(), fds.len() != held) {
                    return true;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// Reads what `sock` has into `buf` like `read`, and queues the descriptors that came with
/// it on `fds`.
pub fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut VecDeque<OwnedFd>,
) -> io::Result<usize> {
    recv_with_fds_flags(sock, buf, fds, 0)
}

/// [`recv_with_fds`] that does not wait, whatever the socket's mode: `WouldBlock` when
/// nothing is there. One system call, where switching the socket's mode around a read took
/// three.
pub fn try_recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut VecDeque<OwnedFd>,
) -> io::Result<usize> {
    recv_with_fds_flags(sock, buf, fds, libc::MSG_DONTWAIT)
}

fn recv_with_fds_flags(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut VecDeque<OwnedFd>,
    flags: libc::c_int,
) -> io::Result<usize> {
    const MAX_FDS: usize = 8;
    let mut space = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: all-zero is a valid msghdr; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    // SAFETY: arithmetic; 64 bytes hold a header and eight descriptors.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE((MAX_FDS * 4) as u32) } as usize;
    // SAFETY: a valid msghdr; descriptors received are close-on-exec.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: walking the control messages the kernel wrote, within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count =
                    ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    fds.push_back(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_travel_with_the_bytes_they_were_sent_with() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, _w) = UnixStream::pair().unwrap();
        send_with_fd(&a, b"EVENT ONE\n", r.as_raw_fd()).unwrap();
        use std::io::Write;
        (&a).write_all(b"EVENT TWO\n").unwrap();
        let mut fds = VecDeque::new();
        let mut buf = [0u8; 64];
        let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!(
            &buf[..n],
            b"EVENT ONE\n",
            "a read stops after the bytes with a descriptor"
        );
        assert_eq!(fds.len(), 1);
        let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"EVENT TWO\n");
        assert_eq!(fds.len(), 1);
        // The descriptor is a new one for the same socket.
        let got = fds.pop_front().unwrap();
        assert_ne!(got.as_raw_fd(), r.as_raw_fd());
        let mut s = UnixStream::from(got);
        s.write_all(b"x").unwrap();
    }

    #[test]
    fn a_try_read_does_not_wait_and_leaves_the_socket_blocking() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut fds = VecDeque::new();
        let mut buf = [0u8; 64];
        let e = try_recv_with_fds(&b, &mut buf, &mut fds).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        send_with_fd(&a, b"EVENT ONE\n", a.as_raw_fd()).unwrap();
        let n = try_recv_with_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"EVENT ONE\n"[..], 1));
        // SAFETY: F_GETFL on our own descriptor.
        let flags = unsafe { libc::fcntl(b.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0, "the mode is untouched");
    }
}
