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
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    /// dst_reg in the low nibble, src_reg in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | src << 4,
        off,
        imm,
    }
}

// Instruction classes, sizes, modes and operations (linux/bpf_common.h, linux/bpf.h).
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const STX: u8 = 0x03;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
const W: u8 = 0x00;
const H: u8 = 0x08;
const B: u8 = 0x10;
const DW: u8 = 0x18;
const IMM: u8 = 0x00;
const ABS: u8 = 0x20;
const IND: u8 = 0x40;
const MEM: u8 = 0x60;
const K: u8 = 0x00;
const X: u8 = 0x08;
const ADD: u8 = 0x00;
const AND: u8 = 0x50;
const LSH: u8 = 0x60;
const MOV: u8 = 0xb0;
const JEQ: u8 = 0x10;
const JNE: u8 = 0x50;
const JSET: u8 = 0x40;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
const PSEUDO_MAP_FD: u8 = 1;
const FN_MAP_LOOKUP_ELEM: i32 = 1;
/// `offsetof(struct __sk_buff, pkt_type)`.
const SKB_PKT_TYPE: i16 = 4;
/// Registers: R0 return value and load results, R1-R5 arguments, R6 the context (where
/// `LD_ABS` wants it), R10 the frame pointer.
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R6: u8 = 6;
const R7: u8 = 7;
const R10: u8 = 10;

/// Where a jump goes: one of the two verdicts at the program's end.
#[derive(Clone, Copy, PartialEq)]
enum To {
    Drop,
    Accept,
}

/// The program, its map named by `map_fd`. Packet loads past the frame's end end the
/// program with 0 (drop), as in a classic filter.
fn program(map_fd: RawFd) -> Vec<Insn> {
    use direct::{DADDR_AT, ETHERTYPE_AT, FRAG_AT, IHL_AT, PORTS_AT_X, PROTO_AT, SADDR_AT};
    let ld_abs = |size: u8, at: u32| (insn(LD | size | ABS, 0, 0, 0, at as i32), None);
    let jump = |op: u8, imm: u32, to: To| (insn(JMP | op | K, R0, 0, 0, imm as i32), Some(to));
    let store_key = |at: i16| (insn(STX | W | MEM, R10, R0, at, 0), None);
    let op = |i: Insn| (i, None);
    let body = [
        op(insn(ALU64 | MOV | X, R6, R1, 0, 0)),
        // Frames this host sends out.
        op(insn(LDX | W | MEM, R0, R6, SKB_PKT_TYPE, 0)),
        jump(JEQ, u32::from(libc::PACKET_OUTGOING), To::Drop),
        // Anything but an unfragmented IPv4/UDP frame is urdmad's.
        ld_abs(H, ETHERTYPE_AT),
        jump(JNE, 0x0800, To::Accept),
        ld_abs(B, PROTO_AT),
        jump(JNE, 17, To::Accept),
        ld_abs(H, FRAG_AT),
        jump(JSET, 0x3fff, To::Accept),
        // The key, on the stack: source, destination, ports.
        ld_abs(W, SADDR_AT),
        store_key(-12),
        ld_abs(W, DADDR_AT),
        store_key(-8),
        ld_abs(B, IHL_AT),
        op(insn(ALU64 | AND | K, R0, 0, 0, 0xf)),
        op(insn(ALU64 | LSH | K, R0, 0, 0, 2)),
        op(insn(ALU64 | MOV | X, R7, R0, 0, 0)),
        op(insn(LD | W | IND, 0, R7, 0, PORTS_AT_X as i32)),
        store_key(-4),
        op(insn(LD | DW | IMM, R1, PSEUDO_MAP_FD, 0, map_fd)),
        op(insn(0, 0, 0, 0, 0)),
        op(insn(ALU64 | MOV | X, R2, R10, 0, 0)),
        op(insn(ALU64 | ADD | K, R2, 0, 0, -12)),
        op(insn(JMP | CALL, 0, 0, 0, FN_MAP_LOOKUP_ELEM)),
        // A direct connection's frame.
        jump(JNE, 0, To::Drop),
    ];
    let accept = body.len();
    let drop = accept + 2;
    let mut p: Vec<Insn> = body
        .iter()
        .enumerate()
        .map(|(i, &(mut ins, to))| {
            if let Some(to) = to {
                let target = if to == To::Drop { drop } else { accept };
                ins.off = (target - i - 1) as i16;
            }
            ins
        })
        .collect();
    p.push(insn(ALU64 | MOV | K, R0, 0, 0, ACCEPT as i32));
    p.push(insn(JMP | EXIT, 0, 0, 0, 0));
    p.push(insn(ALU64 | MOV | K, R0, 0, 0, 0));
    p.push(insn(JMP | EXIT, 0, 0, 0, 0));
    p
}

// bpf(2) commands and types.
const BPF_MAP_CREATE: i32 = 0;
const BPF_MAP_UPDATE_ELEM: i32 = 2;
const BPF_MAP_DELETE_ELEM: i32 = 3;
const BPF_PROG_LOAD: i32 = 5;
#[cfg(test)]
const BPF_PROG_TEST_RUN: i32 = 10;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
const BPF_NOEXIST: u64 = 1;
const SO_ATTACH_BPF: i32 = 50;

/// `union bpf_attr`, as the words each command reads; the kernel wants the rest zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, at: usize, v: u32) -> &mut Attr {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, at: usize, v: u64) -> &mut Attr {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(&mut self, at: usize, name: &str) -> &mut Attr {
        self.0[at..at + name.len()].copy_from_slice(name.as_bytes());
        self
    }
    #[cfg(test)]
    fn read_u32(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }
}

fn bpf(cmd: i32, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: attr is a zero-filled bpf_attr of the size passed, with the pointers in it
    // valid for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn bpf_fd(cmd: i32, attr: &mut Attr) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)? as RawFd;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
        let map = bpf_fd(
            BPF_MAP_CREATE,
            Attr::new()
                .u32(0, BPF_MAP_TYPE_HASH)
                .u32(4, KEY_SIZE)
                .u32(8, 1)
                .u32(12, MAX_DIRECT)
                .name(28, "urdmad_direct"),
        )?;
        let insns = program(map.as_raw_fd());
        let license = c"GPL";
        let load = |log: &mut [u8]| {
            let mut attr = Attr::new();
            attr.u32(0, BPF_PROG_TYPE_SOCKET_FILTER)
                .u32(4, insns.len() as u32)
                .u64(8, insns.as_ptr() as u64)
                .u64(16, license.as_ptr() as u64)
                .name(48, "urdmad_port");
            if !log.is_empty() {
                attr.u32(24, 1)
                    .u32(28, log.len() as u32)
                    .u64(32, log.as_mut_ptr() as u64);
            }
            // The verifier gives up with EAGAIN when a signal reaches the thread while it
            // works (urdmad's own handlers, a child's end); the program is not at fault, so
            // the load is tried again, as libbpf does.
            let mut tries = 5;
            loop {
                match bpf_fd(BPF_PROG_LOAD, &mut attr) {
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries > 1 => tries -= 1,
                    r => return r,
                }
            }
        };
        // Without a log first: a log too small for what the verifier says fails the load.
        let prog = load(&mut []).map_err(|e| {
            let mut log = vec![0u8; 1 << 20];
            let _ = load(&mut log);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let why = String::from_utf8_lossy(&log[..end]);
            let last = why
                .lines()
                .rev()
                .find(|l| !l.is_empty())
                .unwrap_or("no log");
            io::Error::new(e.kind(), format!("loading the port filter: {e}: {last}"))
        })?;
        Ok(PortFilter { map, prog })
    }

    /// Puts the filter on socket `fd`.
    pub fn attach(&self, fd: RawFd) -> io::Result<()> {
        let prog = self.prog.as_raw_fd();
        // SAFETY: an int of the given size.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_ATTACH_BPF,
                (&prog as *const RawFd).cast(),
                std::mem::size_of::<RawFd>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Leaves the frames from `remote` to `local` out from now on. Fails when the map is
    /// full (`E2BIG`) or already holds the connection (`EEXIST`).
    pub fn insert(&self, local: &SocketAddrV4, remote: &SocketAddrV4) -> io::Result<()> {
        let k = key(local, remote);
        let v = 1u8;
        bpf(
            BPF_MAP_UPDATE_ELEM,
            Attr::new()
                .u32(0, self.map.as_raw_fd() as u32)
                .u64(8, k.as_ptr() as u64)
                .u64(16, &v as *const u8 as u64)
                .u64(24, BPF_NOEXIST),
        )
        .map(drop)
    }

    /// Takes the frames from `remote` to `local` in again.
    pub fn remove(&self, local: &SocketAddrV4, remote: &SocketAddrV4) -> io::Result<()> {
        let k = key(local, remote);
        bpf(
            BPF_MAP_DELETE_ELEM,
            Attr::new()
                .u32(0, self.map.as_raw_fd() as u32)
                .u64(8, k.as_ptr() as u64),
        )
        .map(drop)
    }

    /// The program's verdict on `frame`, run by the kernel (`BPF_PROG_TEST_RUN`).
    #[cfg(test)]
    fn verdict(&self, frame: &[u8]) -> io::Result<u32> {
        // The kernel takes a test frame's Ethernet header off before a socket filter runs,
        // where a packet socket's filter sees it: put one more in front.
        let mut data = vec![0u8; 14];
        data[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        data.extend_from_slice(frame);
        let mut attr = Attr::new();
        attr.u32(0, self.prog.as_raw_fd() as u32)
            .u32(8, data.len() as u32)
            .u64(16, data.as_ptr() as u64)
            .u32(32, 1);
        bpf(BPF_PROG_TEST_RUN, &mut attr)?;
        Ok(attr.read_u32(4))
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
