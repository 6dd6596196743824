//! A connection's own packet socket: the direct path.
//!
//! Where a port is a kernel interface that urdmad reads through DPDK's af_packet PMD (the
//! test bed's veth, a host whose NIC has no DPDK driver), every frame passes the kernel
//! anyway, and the hop through urdmad adds two threads that must be scheduled on each
//! frame's way: urdmad, woken to forward it, and then the process's helper, woken for the
//! flow ring. On a host whose cores are shared those wake-ups are the latency.
//!
//! So for each connection it hands over, urdmad gives an AF_PACKET socket a receive and a
//! transmit ring (TPACKET_V2, [`Geometry`]; [`prepare_socket`], ahead of need), then a
//! classic BPF filter that admits only that connection's frames ([`flow_filter`]), locks the
//! filter and binds the socket to the port's interface ([`hand_over`]), and passes it to the
//! process with the connection's `EVENT CONNECTED` ([`crate::fdpass`]). The process maps the
//! rings ([`Rings`]) and moves the connection's frames itself: a frame sent by the peer lands
//! in the process's receive ring in the softirq of its arrival, where a thread polling the CQ
//! finds it without any other thread running, and a frame the process sends leaves in its
//! own system call. urdmad's own sockets get a filter that leaves those connections' frames
//! out ([`port_filter`]), so it is not woken for them. When the connection ends the process
//! keeps the socket for its next connection (`PARK`, [`crate::proto`]), whose filter urdmad
//! aims anew, or gives it back (`GIVEBACK`) before closing its copy, so that the last close,
//! which waits for grace periods, is urdmad's.
//!
//! What the process can do with the socket: receive nothing but its connection's frames (the
//! filter is locked: `SO_LOCK_FILTER`), and send any frame on the interface, which it can
//! through its TX ring too.
//!
//! Only `std` and `libc`: the provider uses [`Rings`] without the
//! daemon.

use crate::frame;
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes in front of a received frame in its ring slot: the TPACKET_V2 header, the
/// `sockaddr_ll` the kernel writes and the virtio header, aligned (the kernel puts the frame
/// at 76 for an Ethernet header of 14), with room to spare.
const RX_HEADROOM: usize = 128;
/// Where the frame starts in a transmit slot (TPACKET_V2 without `PACKET_TX_HAS_OFF`): the
/// header's aligned length.
const TX_DATA: usize = libc::TPACKET2_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();
const ETH_P_IP: u16 = 0x0800;
/// `PACKET_VNET_HDR` (linux/if_packet.h; not in the libc crate): every frame of the socket's
/// rings comes after a `struct virtio_net_hdr`, of [`VNET_HDR`] bytes.
const PACKET_VNET_HDR: i32 = 15;
const VNET_HDR: usize = 10;
/// A filter's verdict that keeps the frame (the bytes of it to keep: all).
pub const ACCEPT: u32 = 0x0004_0000;

/// Most slots of a connection's transmit ring. The kernel hands a slot back once the
/// frame it held has left (on a veth within the send; on a NIC at its transmit
/// completion, 128 full frames being 150 us of a 10 Gb/s link), so the ring holds what
/// the provider writes between sends, while each slot costs every connection half a page
/// that the kernel clears and the process maps (the rings' pages were the largest part
/// of a connection cycle's CPU).
pub const TX_FRAMES_MAX: u32 = 128;

/// The rings of a connection's socket: `frames` receive slots and `tx_frames` transmit
/// slots (at most [`TX_FRAMES_MAX`]), of `frame_size` bytes each. Both sides compute it from
/// what `EVENT CONNECTED` says (the datagram size and the frame count), so it is stated
/// once, here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub frames: u32,
    pub tx_frames: u32,
    pub frame_size: u32,
    block_size: u32,
}

impl Geometry {
    /// A receive ring of at least `frames` slots and a transmit ring of as many up to
    /// [`TX_FRAMES_MAX`], each slot large enough for a frame carrying `datagram` bytes of
    /// UDP payload.
    pub fn new(datagram: u16, frames: u32) -> Geometry {
        let frame_size = (usize::from(datagram) + frame::HEADERS + RX_HEADROOM).next_power_of_two();
        let page = page_size();
        let block_size = frame_size.max(page);
        let per_block = (block_size / frame_size) as u32;
        let whole = |n: u32| n.max(1).div_ceil(per_block) * per_block;
        Geometry {
            frames: whole(frames),
            tx_frames: whole(frames.min(TX_FRAMES_MAX)),
            frame_size: frame_size as u32,
            block_size: block_size as u32,
        }
    }

    fn ring_bytes(&self, slots: u32) -> usize {
        slots as usize * self.frame_size as usize
    }

    /// Bytes of the mapping: the receive ring, then the transmit ring.
    pub fn map_len(&self) -> usize {
        self.ring_bytes(self.frames) + self.ring_bytes(self.tx_frames)
    }

    fn req(&self, slots: u32) -> libc::tpacket_req {
        libc::tpacket_req {
            tp_block_size: self.block_size,
            tp_block_nr: (self.ring_bytes(slots) / self.block_size as usize) as u32,
            tp_frame_size: self.frame_size,
            tp_frame_nr: slots,
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | code | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

const LD_W: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const LD_H: u32 = libc::BPF_LD | libc::BPF_H | libc::BPF_ABS;
const LD_B: u32 = libc::BPF_LD | libc::BPF_B | libc::BPF_ABS;
const LD_IND_W: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_IND;
const LDX_MSH: u32 = libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH;
const RET: u32 = libc::BPF_RET | libc::BPF_K;
const PKTTYPE: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_PKTTYPE) as u32;
/// Offsets in an Ethernet frame with an IPv4 header.
pub const ETHERTYPE_AT: u32 = 12;
pub const PROTO_AT: u32 = 23;
pub const FRAG_AT: u32 = 20;
pub const SADDR_AT: u32 = 26;
pub const DADDR_AT: u32 = 30;
pub const IHL_AT: u32 = 14;
/// The UDP ports, as one word, after `X` = the IP header's length.
pub const PORTS_AT_X: u32 = 14;

/// The two UDP ports as one word loaded at [`PORTS_AT_X`] reads them.
pub fn ports_word(src: u16, dst: u16) -> u32 {
    u32::from(src) << 16 | u32::from(dst)
}

fn ip_word(a: &SocketAddrV4) -> u32 {
    u32::from(*a.ip())
}

/// The filter of a connection's socket: the frames from `remote` to `local`, nothing else.
/// Frames this host sends out are dropped, and so is anything that is not an unfragmented
/// IPv4/UDP frame.
///
/// Every frame on the interface runs the filter of every connection's socket, and on most of
/// them only the ports differ: those are compared first. Past the part of a frame the kernel
/// holds in one piece each load costs a copy (a frame sent from a packet socket's ring without
/// a virtio header has only its Ethernet header there: see [`prepare_socket`]), so a frame of
/// another connection costs two loads here rather than six.
pub fn flow_filter(local: &SocketAddrV4, remote: &SocketAddrV4) -> Vec<libc::sock_filter> {
    vec![
        stmt(LD_W, PKTTYPE),
        jump(libc::BPF_JEQ, u32::from(libc::PACKET_OUTGOING), 13, 0),
        stmt(LD_H, ETHERTYPE_AT),
        jump(libc::BPF_JEQ, u32::from(ETH_P_IP), 0, 11),
        stmt(LDX_MSH, IHL_AT),
        stmt(LD_IND_W, PORTS_AT_X),
        jump(libc::BPF_JEQ, ports_word(remote.port(), local.port()), 0, 8),
        stmt(LD_B, PROTO_AT),
        jump(libc::BPF_JEQ, 17, 0, 6),
        stmt(LD_H, FRAG_AT),
        jump(libc::BPF_JSET, 0x3fff, 4, 0),
        stmt(LD_W, DADDR_AT),
        jump(libc::BPF_JEQ, ip_word(local), 0, 2),
        stmt(LD_W, SADDR_AT),
        jump(libc::BPF_JEQ, ip_word(remote), 1, 0),
        stmt(RET, 0),
        stmt(RET, ACCEPT),
    ]
}

fn setsockopt<T>(fd: RawFd, level: i32, name: i32, v: &T) -> io::Result<()> {
    // SAFETY: v points to a T of the given size for the duration of the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Puts `prog` on the socket `fd`.
fn attach_filter(fd: RawFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// The interface an AF_PACKET socket is bound to (0: none, or not such a socket).
pub fn bound_ifindex(fd: RawFd) -> i32 {
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: valid out-pointers of the given size.
    let r = unsafe { libc::getsockname(fd, (&mut sa as *mut libc::sockaddr_ll).cast(), &mut len) };
    if r == 0 && i32::from(sa.sll_family) == libc::AF_PACKET {
        sa.sll_ifindex
    } else {
        0
    }
}

/// A `SOL_SOCKET` option of socket `fd` whose value is a plain number `T`.
fn socket_option<T: Copy + Default>(fd: RawFd, name: libc::c_int) -> io::Result<T> {
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: valid out-pointers of the given size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// The address family of the socket `fd` (`SO_DOMAIN`); None for what is not a socket.
pub fn socket_domain(fd: RawFd) -> Option<i32> {
    socket_option(fd, libc::SO_DOMAIN).ok()
}

/// The type of the socket `fd` (`SO_TYPE`: `SOCK_STREAM`, ...); None for what is not a socket.
pub fn socket_type(fd: RawFd) -> Option<i32> {
    socket_option(fd, libc::SO_TYPE).ok()
}

/// The cookie the kernel gives socket `fd` (`SO_COOKIE`): unique among the sockets of this
/// boot, never reused.
pub fn socket_cookie(fd: RawFd) -> io::Result<u64> {
    socket_option(fd, libc::SO_COOKIE)
}

/// The index of the interface `name` in the calling thread's network namespace.
pub fn ifindex(name: &str) -> io::Result<i32> {
    let c = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a valid C string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i as i32),
    }
}

/// A packet socket with rings of `geo` that receives nothing yet (protocol 0, unbound): the
/// part of opening a connection's socket that waits, twice, for an RCU grace period
/// (`packet_set_ring`), so urdmad does it ahead of need. Needs `CAP_NET_RAW`.
pub fn prepare_socket(geo: Geometry) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; protocol 0 receives nothing until bound.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // A frame sent from the transmit ring keeps only what its virtio header's `hdr_len` says
    // in the buffer the kernel allocates, and the rest where it lies, in the ring's pages
    // (see [`Rings::tx_commit`]); without the header that is the Ethernet header alone. Every socket filter on the
    // receiving node then loads the IP and UDP fields by copying them out (see
    // [`flow_filter`]), and a node with hundreds of connections runs hundreds of filters on
    // every frame.
    setsockopt(fd, libc::SOL_PACKET, PACKET_VNET_HDR, &1i32)?;
    setsockopt(
        fd,
        libc::SOL_PACKET,
        libc::PACKET_VERSION,
        &(libc::tpacket_versions::TPACKET_V2 as i32),
    )?;
    setsockopt(
        fd,
        libc::SOL_PACKET,
        libc::PACKET_RX_RING,
        &geo.req(geo.frames),
    )?;
    setsockopt(
        fd,
        libc::SOL_PACKET,
        libc::PACKET_TX_RING,
        &geo.req(geo.tx_frames),
    )?;
    // Room in the socket's send budget for a full transmit ring (best effort: root may
    // exceed wmem_max, anyone else gets what the system allows).
    let budget = i32::try_from(2 * geo.ring_bytes(geo.tx_frames)).unwrap_or(i32::MAX);
    if setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &budget).is_err() {
        let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &budget);
    }
    Ok(sock)
}

/// urdmad's side: makes a [`prepare_socket`] socket the connection's from `local` to
/// `remote` on interface `ifindex`, with the classic filter [`flow_filter`]. Needs
/// `CAP_NET_RAW`.
pub fn hand_over(
    sock: &OwnedFd,
    ifindex: i32,
    local: &SocketAddrV4,
    remote: &SocketAddrV4,
) -> io::Result<()> {
    hand_over_with(sock, ifindex, |fd| {
        attach_filter(fd, &flow_filter(local, remote))
    })
}

/// [`hand_over`] with the filter `attach` puts on the socket (one that admits the
/// connection's frames and no other): attached and locked, then bound, so that nothing
/// unfiltered ever reaches the socket. Nothing here waits for a grace period: the socket
/// was not bound before.
pub fn hand_over_with(
    sock: &OwnedFd,
    ifindex: i32,
    attach: impl FnOnce(RawFd) -> io::Result<()>,
) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    attach(fd)?;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_LOCK_FILTER, &1i32)?;
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = ETH_P_IP.to_be();
    sa.sll_ifindex = ifindex;
    // SAFETY: a valid sockaddr_ll of the given size.
    let r = unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Frames the socket received and frames it dropped for want of ring room since the last
/// call (the kernel resets its counters when read).
pub fn take_stats(fd: RawFd) -> (u64, u64) {
    let mut s = libc::tpacket_stats {
        tp_packets: 0,
        tp_drops: 0,
    };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: valid out-pointers of the given size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&mut s as *mut libc::tpacket_stats).cast(),
            &mut len,
        )
    };
    if r == 0 {
        (u64::from(s.tp_packets), u64::from(s.tp_drops))
    } else {
        (0, 0)
    }
}

/// The process's side: a connection's socket with its rings mapped.
///
/// Receive slots are taken in order ([`Rings::received`], [`Rings::release`]); transmit
/// slots are filled in order ([`Rings::tx_slot`], [`Rings::tx_commit`]) and handed to the
/// kernel by [`Rings::kick`]. One user at a time (the provider's engine lock).
pub struct Rings {
    sock: OwnedFd,
    map: *mut u8,
    geo: Geometry,
    rx_next: u32,
    tx_next: u32,
}

// SAFETY: the mapping belongs to the socket, which any thread may use; callers serialise.
unsafe impl Send for Rings {}

impl Drop for Rings {
    fn drop(&mut self) {
        // SAFETY: our mapping of this length; nothing refers into it once self is dropped.
        unsafe { libc::munmap(self.map.cast(), self.geo.map_len()) };
    }
}

impl Rings {
    /// Maps the rings of `sock`, which urdmad set up as `geo` says.
    pub fn map(sock: OwnedFd, geo: Geometry) -> io::Result<Rings> {
        // SAFETY: mapping a packet socket's rings: the kernel checks the length against
        // what the socket has.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                geo.map_len(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                sock.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Rings {
            sock,
            map: p.cast(),
            geo,
            rx_next: 0,
            tx_next: 0,
        })
    }

    /// Unmaps the rings and hands the socket over (to give it back to urdmad).
    pub fn into_socket(self) -> OwnedFd {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: our mapping of this length; `me` is not used again but for its socket,
        // which is moved out once and never dropped in place (ManuallyDrop).
        unsafe {
            libc::munmap(me.map.cast(), me.geo.map_len());
            std::ptr::read(&me.sock)
        }
    }

    /// The socket, to wait on for `POLLIN`.
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Slot `i` of the receive ring (`tx` false, `i` < frames) or the transmit ring (`tx`
    /// true, `i` < tx_frames), which follows it in the mapping.
    fn slot(&self, tx: bool, i: u32) -> *mut u8 {
        let ring = if tx {
            self.geo.ring_bytes(self.geo.frames)
        } else {
            0
        };
        let off = ring + i as usize * self.geo.frame_size as usize;
        // SAFETY: within the mapping, for the `i` the callers pass.
        unsafe { self.map.add(off) }
    }

    fn status(&self, slot: *mut u8) -> &AtomicU32 {
        // SAFETY: every slot starts with a 16-byte aligned tpacket2_hdr whose first field is
        // the status word the kernel and we hand the slot over with.
        unsafe { &*(slot as *const AtomicU32) }
    }

    /// The `i`-th received frame not yet released, if the kernel has filled it. Frames the
    /// ring could not hold whole are returned empty (to be released like the others).
    pub fn received(&self, i: u32) -> Option<&[u8]> {
        if i >= self.geo.frames {
            return None;
        }
        let s = self.slot(false, (self.rx_next + i) % self.geo.frames);
        if self.status(s).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: the slot is ours until released; its header is a tpacket2_hdr.
        let h = unsafe { &*(s as *const libc::tpacket2_hdr) };
        let (mac, len) = (usize::from(h.tp_mac), h.tp_snaplen as usize);
        if h.tp_snaplen != h.tp_len || mac + len > self.geo.frame_size as usize {
            return Some(&[]);
        }
        // SAFETY: the kernel wrote `len` bytes at `mac` within the slot.
        Some(unsafe { std::slice::from_raw_parts(s.add(mac), len) })
    }

    /// Gives the first `n` received frames back to the kernel.
    pub fn release(&mut self, n: u32) {
        for _ in 0..n {
            let s = self.slot(false, self.rx_next);
            self.status(s)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.rx_next = (self.rx_next + 1) % self.geo.frames;
        }
    }

    /// Gives every frame received so far back to the kernel, unread: a socket kept for the
    /// process's next connection starts with none of the last one's.
    pub fn drain(&mut self) {
        let mut n = 0;
        while self.received(n).is_some() {
            n += 1;
        }
        self.release(n);
    }

    /// The geometry the rings were mapped with.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The next transmit slot's frame buffer, if the kernel is done with it.
    pub fn tx_slot(&mut self) -> Option<&mut [u8]> {
        let s = self.slot(true, self.tx_next);
        let st = self.status(s).load(Ordering::Acquire);
        if st == libc::TP_STATUS_WRONG_FORMAT {
            // The kernel refused what was there (it never is, for our frames): the slot is
            // free again.
            self.status(s)
                .store(libc::TP_STATUS_AVAILABLE, Ordering::Relaxed);
        } else if st != libc::TP_STATUS_AVAILABLE {
            return None;
        }
        let room = self.geo.frame_size as usize - TX_DATA - VNET_HDR;
        // SAFETY: the slot is ours while its status says available.
        Some(unsafe { std::slice::from_raw_parts_mut(s.add(TX_DATA + VNET_HDR), room) })
    }

    /// Hands the slot [`Rings::tx_slot`] gave, holding a frame of `len` bytes, to the kernel
    /// (sent at the next [`Rings::kick`]).
    pub fn tx_commit(&mut self, len: usize) {
        let s = self.slot(true, self.tx_next);
        // The frame's virtio header (host byte order, as for a legacy device): no offload,
        // and the whole frame in the buffer the kernel allocates. A part left in the ring's
        // pages makes the frame zero-copy, and the port's own sockets (urdmad's, which take
        // every protocol) are handed a clone of every frame sent on the interface: cloning
        // a zero-copy frame copies those pages into new ones, a page allocated and cleared
        // per frame, where copying the frame's bytes here costs a few hundred at most.
        let hdr_len = u16::try_from(len).unwrap_or(u16::MAX);
        let mut vnet = [0u8; VNET_HDR];
        vnet[2..4].copy_from_slice(&hdr_len.to_ne_bytes());
        // SAFETY: the slot is ours; a tpacket2_hdr, then the virtio header at TX_DATA.
        unsafe {
            (*(s as *mut libc::tpacket2_hdr)).tp_len = (VNET_HDR + len) as u32;
            std::ptr::copy_nonoverlapping(vnet.as_ptr(), s.add(TX_DATA), VNET_HDR);
        }
        self.status(s)
            .store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.tx_next = (self.tx_next + 1) % self.geo.tx_frames;
    }

    /// Sends the committed frames (one system call, not waiting). An error, `WouldBlock`
    /// included, leaves frames in the ring, which the kernel takes at the next call.
    pub fn kick(&self) -> io::Result<()> {
        // SAFETY: a send of nothing on our socket: the kernel walks the transmit ring.
        let r = unsafe {
            libc::send(
                self.sock.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny classic-BPF interpreter for the instructions the filters use, so that their
    /// verdicts are tested without a kernel.
    fn run(prog: &[libc::sock_filter], frame: &[u8], pkttype: u8) -> u32 {
        let (mut a, mut x) = (0u32, 0u32);
        let mut pc = 0usize;
        let load = |off: usize, n: usize| -> Option<u32> {
            let b = frame.get(off..off + n)?;
            Some(b.iter().fold(0u32, |acc, &v| acc << 8 | u32::from(v)))
        };
        loop {
            let i = prog[pc];
            let code = u32::from(i.code);
            pc += 1;
            match code {
                LD_W if i.k == PKTTYPE => a = u32::from(pkttype),
                LD_W => match load(i.k as usize, 4) {
                    Some(v) => a = v,
                    None => return 0,
                },
                LD_H => match load(i.k as usize, 2) {
                    Some(v) => a = v,
                    None => return 0,
                },
                LD_B => match load(i.k as usize, 1) {
                    Some(v) => a = v,
                    None => return 0,
                },
                LD_IND_W => match load((x + i.k) as usize, 4) {
                    Some(v) => a = v,
                    None => return 0,
                },
                LDX_MSH => match load(i.k as usize, 1) {
                    Some(v) => x = (v & 0xf) * 4,
                    None => return 0,
                },
                RET => return i.k,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf })
                }
                c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => {
                    pc += usize::from(if a & i.k != 0 { i.jt } else { i.jf })
                }
                c => panic!("unexpected instruction {c:#x}"),
            }
        }
    }

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    /// A UDP frame from `src` to `dst`.
    fn udp(src: &str, dst: &str) -> Vec<u8> {
        frame::udp_frame([2; 6], [4; 6], sa(src), sa(dst), b"payload")
    }

    #[test]
    fn a_connections_filter_admits_its_frames_only() {
        let (local, remote) = (sa("10.0.0.1:4000"), sa("10.0.0.2:5000"));
        let f = flow_filter(&local, &remote);
        assert_eq!(run(&f, &udp("10.0.0.2:5000", "10.0.0.1:4000"), 0), ACCEPT);
        // Our own frame going out, and every other tuple.
        assert_eq!(run(&f, &udp("10.0.0.2:5000", "10.0.0.1:4000"), 4), 0);
        for (s, d) in [
            ("10.0.0.1:4000", "10.0.0.2:5000"),
            ("10.0.0.3:5000", "10.0.0.1:4000"),
            ("10.0.0.2:5001", "10.0.0.1:4000"),
            ("10.0.0.2:5000", "10.0.0.1:4001"),
            ("10.0.0.2:5000", "10.0.0.9:4000"),
        ] {
            assert_eq!(run(&f, &udp(s, d), 0), 0, "{s} -> {d}");
        }
        // Not UDP, a fragment, a runt, ARP.
        let mut tcp = udp("10.0.0.2:5000", "10.0.0.1:4000");
        tcp[23] = 6;
        assert_eq!(run(&f, &tcp, 0), 0);
        let mut frag = udp("10.0.0.2:5000", "10.0.0.1:4000");
        frag[21] = 1;
        assert_eq!(run(&f, &frag, 0), 0);
        assert_eq!(run(&f, &[0u8; 10], 0), 0);
        let mut arp = udp("10.0.0.2:5000", "10.0.0.1:4000");
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(run(&f, &arp, 0), 0);
        // An IP header with options moves the ports.
        let mut opts = udp("10.0.0.2:5000", "10.0.0.1:4000");
        opts[14] = 0x46;
        opts.splice(34..34, [1u8, 1, 1, 1]);
        assert_eq!(run(&f, &opts, 0), ACCEPT);
        // The kernel takes it (its checker, on a socket that needs no privilege).
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        attach_filter(sock.as_raw_fd(), &f).unwrap();
    }

    #[test]
    fn geometry_fits_a_frame_of_the_datagram_and_whole_blocks() {
        let g = Geometry::new(1472, 100);
        assert_eq!(g.frame_size, 2048);
        assert!(g.frames >= 100 && g.ring_bytes(g.frames).is_multiple_of(g.block_size as usize));
        assert_eq!(g.tx_frames, 100);
        let big = Geometry::new(1472, 512);
        assert_eq!((big.frames, big.tx_frames), (512, TX_FRAMES_MAX));
        assert_eq!(big.map_len(), (512 + TX_FRAMES_MAX) as usize * 2048);
        assert!(g.frame_size as usize - TX_DATA - VNET_HDR >= 1472 + frame::HEADERS);
        let j = Geometry::new(8972, 16);
        assert_eq!(j.frame_size, 16384);
        assert_eq!(j.frames, 16);
        assert!(Geometry::new(1472, 0).frames >= 1);
    }
}
