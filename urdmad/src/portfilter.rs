//! The filter of urdmad's own sockets on a port with a direct path ([`crate::direct`]):
//! every frame but the ones this host sends and the frames of the connections on the direct
//! path, which their processes' own sockets receive.
//!
//! It is an eBPF socket filter that looks each UDP frame's addresses and ports up in a hash
//! map, and a connection joins or leaves the direct path by one map update. A classic
//! filter cannot do this: it would have to name every connection, growing with them, and
//! the kernel charges a socket's new filter to its option memory (`optmem_max`, 20 KiB by
//! default) before it frees the old one, so once the list is larger than half of that it
//! can no longer be replaced at all, neither to add a connection nor to drop a closed one.
//! This program's size is fixed; the map's memory is charged to urdmad's memory cgroup.
//!
//! Loading it needs `CAP_BPF` (or `CAP_SYS_ADMIN`): Debian does not let unprivileged users
//! load programs. Without it the port offers no direct path, and says why.

use crate::direct::{self, ACCEPT};
use crate::ebpf::{self, *};
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Most connections of one port on the direct path: the map's size. Every frame on the
/// interface also runs each direct socket's own filter in the kernel, so the receive cost
/// of every frame grows with them; beyond this, connections go through urdmad's rings.
pub const MAX_DIRECT: u32 = 512;

/// The map's key: the frame's source and destination addresses and its UDP ports, each as
/// the filter loads them (host order), stored in host byte order.
const KEY_SIZE: u32 = 12;

fn key(local: &SocketAddrV4, remote: &SocketAddrV4) -> [u8; KEY_SIZE as usize] {
    let mut k = [0u8; KEY_SIZE as usize];
    k[0..4].copy_from_slice(&u32::from(*remote.ip()).to_ne_bytes());
    k[4..8].copy_from_slice(&u32::from(*local.ip()).to_ne_bytes());
    k[8..12].copy_from_slice(&direct::ports_word(remote.port(), local.port()).to_ne_bytes());
    k
}

/// The program, its map named by `map_fd`. Packet loads past the frame's end end the
/// program with 0 (drop), as in a classic filter.
fn program(map_fd: RawFd) -> Vec<Insn> {
    use direct::{DADDR_AT, ETHERTYPE_AT, FRAG_AT, IHL_AT, PORTS_AT_X, PROTO_AT, SADDR_AT};
    let mut a = Asm::default();
    let (drop, accept) = (a.label(), a.label());
    let store_key = |a: &mut Asm, at: i16| {
        a.op(insn(STX | W | MEM, R10, R0, at, 0));
    };
    a.op(insn(ALU64 | MOV | X, R6, R1, 0, 0));
    // Frames this host sends out.
    a.op(insn(LDX | W | MEM, R0, R6, SKB_PKT_TYPE, 0)).jump_r0(
        JEQ,
        u32::from(libc::PACKET_OUTGOING),
        drop,
    );
    // Anything but an unfragmented IPv4/UDP frame is urdmad's.
    a.ld_abs(H, ETHERTYPE_AT).jump_r0(JNE, 0x0800, accept);
    a.ld_abs(B, PROTO_AT).jump_r0(JNE, 17, accept);
    a.ld_abs(H, FRAG_AT).jump_r0(JSET, 0x3fff, accept);
    // The key, on the stack: source, destination, ports.
    a.ld_abs(W, SADDR_AT);
    store_key(&mut a, -12);
    a.ld_abs(W, DADDR_AT);
    store_key(&mut a, -8);
    a.ld_abs(B, IHL_AT)
        .op(insn(ALU64 | AND | K, R0, 0, 0, 0xf))
        .op(insn(ALU64 | LSH | K, R0, 0, 0, 2))
        .op(insn(ALU64 | MOV | X, R7, R0, 0, 0))
        .ld_ind(W, R7, PORTS_AT_X);
    store_key(&mut a, -4);
    a.ld_map(R1, map_fd)
        .op(insn(ALU64 | MOV | X, R2, R10, 0, 0))
        .op(insn(ALU64 | ADD | K, R2, 0, 0, -12))
        .op(insn(JMP | CALL, 0, 0, 0, FN_MAP_LOOKUP_ELEM));
    // Not a direct connection's frame: urdmad's.
    a.if_null(accept);
    a.jump(insn(JMP | JA, 0, 0, 0, 0), drop);
    a.bind(accept);
    a.ret(ACCEPT);
    a.bind(drop);
    a.ret(0);
    a.finish()
}

/// The loaded program and the map of direct connections it reads.
pub struct PortFilter {
    map: OwnedFd,
    prog: OwnedFd,
}

impl PortFilter {
    /// Creates the map and loads the program. The error of a refused program carries the
    /// verifier's log.
    pub fn new() -> io::Result<PortFilter> {
        let map = ebpf::create_map(
            BPF_MAP_TYPE_HASH,
            KEY_SIZE,
            1,
            MAX_DIRECT,
            0,
            "urdmad_direct",
        )?;
        let prog = ebpf::load_socket_filter(&program(map.as_raw_fd()), "urdmad_port")?;
        Ok(PortFilter { map, prog })
    }

    /// Puts the filter on socket `fd`.
    pub fn attach(&self, fd: RawFd) -> io::Result<()> {
        ebpf::attach(fd, &self.prog)
    }

    /// Leaves the frames from `remote` to `local` out from now on. Fails when the map is
    /// full (`E2BIG`) or already holds the connection (`EEXIST`).
    pub fn insert(&self, local: &SocketAddrV4, remote: &SocketAddrV4) -> io::Result<()> {
        ebpf::map_update(&self.map, &key(local, remote), &[1u8], BPF_NOEXIST)
    }

    /// Takes the frames from `remote` to `local` in again.
    pub fn remove(&self, local: &SocketAddrV4, remote: &SocketAddrV4) -> io::Result<()> {
        ebpf::map_delete(&self.map, &key(local, remote))
    }

    /// The program's verdict on `frame`, run by the kernel.
    #[cfg(test)]
    fn verdict(&self, frame: &[u8]) -> io::Result<u32> {
        ebpf::test_run(&self.prog, frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> std::net::SocketAddrV4 {
        s.parse().unwrap()
    }

    /// A UDP frame from `src` to `dst`.
    fn udp(src: &str, dst: &str) -> Vec<u8> {
        crate::frame::udp_frame([2; 6], [4; 6], sa(src), sa(dst), b"payload")
    }
    use crate::frame;

    /// Runs in the kernel: needs `CAP_BPF`, as urdmad does.
    #[test]
    fn leaves_out_the_direct_connections_and_nothing_else() {
        let f = PortFilter::new().expect("load the port filter (needs CAP_BPF)");
        let a = (sa("10.0.0.1:4000"), sa("10.0.0.2:5000"));
        let b = (sa("10.0.0.1:4000"), sa("10.0.0.3:5000"));
        let v = |s, d| f.verdict(&udp(s, d)).unwrap();
        assert_eq!(v("10.0.0.2:5000", "10.0.0.1:4000"), ACCEPT);
        f.insert(&a.0, &a.1).unwrap();
        f.insert(&b.0, &b.1).unwrap();
        assert_eq!(
            f.insert(&a.0, &a.1).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        assert_eq!(v("10.0.0.2:5000", "10.0.0.1:4000"), 0);
        assert_eq!(v("10.0.0.3:5000", "10.0.0.1:4000"), 0);
        // A ConnectRequest from a new peer to the same listening port is urdmad's, and so is
        // every other tuple.
        for (s, d) in [
            ("10.0.0.4:5000", "10.0.0.1:4000"),
            ("10.0.0.2:5001", "10.0.0.1:4000"),
            ("10.0.0.2:5000", "10.0.0.1:4001"),
            ("10.0.0.2:5000", "10.0.0.9:4000"),
            ("10.0.0.1:4000", "10.0.0.2:5000"),
        ] {
            assert_eq!(v(s, d), ACCEPT, "{s} -> {d}");
        }
        // Not IPv4/UDP, or a fragment: urdmad's; a runt ends the program: dropped.
        let mut arp = udp("10.0.0.2:5000", "10.0.0.1:4000");
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(f.verdict(&arp).unwrap(), ACCEPT);
        let mut tcp = udp("10.0.0.2:5000", "10.0.0.1:4000");
        tcp[23] = 6;
        assert_eq!(f.verdict(&tcp).unwrap(), ACCEPT);
        let mut frag = udp("10.0.0.2:5000", "10.0.0.1:4000");
        frag[21] = 1;
        assert_eq!(f.verdict(&frag).unwrap(), ACCEPT);
        assert_eq!(f.verdict(&[0u8; 12]).unwrap(), 0);
        let cut = udp("10.0.0.4:5000", "10.0.0.1:4000");
        assert_eq!(f.verdict(&cut[..36]).unwrap(), 0);
        // An IP header with options moves the ports.
        let mut opts = udp("10.0.0.2:5000", "10.0.0.1:4000");
        opts[14] = 0x46;
        opts.splice(34..34, [1u8, 1, 1, 1]);
        assert_eq!(f.verdict(&opts).unwrap(), 0);
        // A closed connection's frames are urdmad's again.
        f.remove(&a.0, &a.1).unwrap();
        assert_eq!(v("10.0.0.2:5000", "10.0.0.1:4000"), ACCEPT);
        assert_eq!(v("10.0.0.3:5000", "10.0.0.1:4000"), 0);
    }

    #[test]
    fn holds_as_many_connections_as_it_says_and_no_more() {
        let f = PortFilter::new().expect("load the port filter (needs CAP_BPF)");
        let local = sa("10.0.0.1:4000");
        let remote = |i: u32| SocketAddrV4::new((0x0a01_0000 + i).into(), 5000);
        for i in 0..MAX_DIRECT {
            f.insert(&local, &remote(i)).unwrap();
        }
        let full = f.insert(&local, &remote(MAX_DIRECT)).unwrap_err();
        assert_eq!(full.raw_os_error(), Some(libc::E2BIG));
        // Space freed by a close is usable again.
        f.remove(&local, &remote(7)).unwrap();
        f.insert(&local, &remote(MAX_DIRECT)).unwrap();
        let last = frame::udp_frame([2; 6], [4; 6], remote(MAX_DIRECT), local, b"x");
        assert_eq!(f.verdict(&last).unwrap(), 0);
    }
}
