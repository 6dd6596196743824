//! The filter of a connection's own socket on the direct path ([`crate::direct`]), which
//! also tells urdma.ko's bell what each frame completes.
//!
//! It admits what the classic [`direct::flow_filter`] admits: the connection's frames and
//! nothing else. For every frame it admits it also leaves a verdict (`enum
//! urdma_bell_verdict`) in its CPU's slot of a per-CPU array, which the bell reads in the
//! same softirq, right after the frame is in the ring: a receive completes with this frame
//! when it is a Data packet (TRP) carrying the last segment of an untagged message on queue
//! 0 (a Send of any kind, or Immediate Data), and its PSN is the one the process published
//! ([`crate::bell`]). A frame whose sender says the next one follows at once, and an ACK
//! with nothing else in it while the process says ACKs can wait (`bell::ACKS_WAIT`), get
//! `QUIET`: they wake nobody. Everything else, and any frame too short to say, gets `NONE`,
//! and the process's helper is woken as without a bell. The filter only reads fixed header
//! fields: the checks, the placement and the protocol stay in the process.

use crate::bell;
use crate::cm_channel::verdict;
use crate::direct::{self, ACCEPT};
use crate::ebpf::{self, *};
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use trp::wire::trp::{FLAG_ACK_REQUEST, FLAG_FOLLOWS};

/// Offsets in the frame after `X` = the IP header's length: the UDP payload, which starts
/// with the TRP header (docs/protocol.md).
const TRP_AT_X: u32 = direct::PORTS_AT_X + 8;
pub(crate) const TRP_VERSION: u32 = TRP_AT_X;
pub(crate) const TRP_OPCODE: u32 = TRP_AT_X + 1;
pub(crate) const TRP_FLAGS: u32 = TRP_AT_X + 2;
pub(crate) const TRP_SACKS: u32 = TRP_AT_X + 3;
pub(crate) const TRP_PSN: u32 = TRP_AT_X + 8;
/// A Data packet has no SACK ranges: its DDP segment follows the 20-byte header.
const DDP_AT_X: u32 = TRP_AT_X + 20;
/// The frame's bytes up to the end of the TRP header, after `X`.
pub(crate) const TRP_HEADER_END_X: i32 = DDP_AT_X as i32;
pub(crate) const DDP_CONTROL: u32 = DDP_AT_X;
pub(crate) const RDMAP_CONTROL: u32 = DDP_AT_X + 1;
pub(crate) const DDP_QN: u32 = DDP_AT_X + 6;
/// The frame's bytes up to the end of the untagged header's QN, after `X`.
pub(crate) const CLASSIFIED_LEN_X: i32 = (DDP_QN + 4) as i32;
/// DDP's first byte with T (tagged) and L (last) and the version bits: untagged, last,
/// version 1.
pub(crate) const DDP_T_L_DV: u32 = 0xc3;
pub(crate) const UNTAGGED_LAST_V1: u32 = 0x41;
/// RDMAP's control byte (RDMAP version 1, reserved bits 0) of the messages that complete a
/// receive, plain and solicited.
pub(crate) const RECV_OPS: [u32; 3] = [0x43, 0x44, 0x48]; // Send, Send with Invalidate, Immediate Data
pub(crate) const SOLICITED_OPS: [u32; 3] = [0x45, 0x46, 0x49]; // the same with SE

/// The entry of a filter's `addrs` map: three words in the CPU's order, the values the
/// program's packet loads give for the connection's frames.
const ADDR_PORTS: i16 = 0;
const ADDR_LOCAL: i16 = 4;
const ADDR_REMOTE: i16 = 8;
const ADDRS_SIZE: u32 = 12;

/// A connection's filter and the maps it uses: the verdicts urdma.ko reads, the
/// connection's addresses, and the process's [`bell`] word.
///
/// The program is loaded before the connection is known ([`FlowFilter::new`]), because the
/// kernel's verifier takes milliseconds under emulation (3.2-3.4 ms per load in the
/// emulated bed, on both ends of every connection's setup): urdmad's socket keeper makes
/// filters ready with its sockets. [`FlowFilter::aim`] then gives it the connection's
/// addresses; until then it admits nothing.
///
/// A filter made to be used again ([`crate::filter_pool`]) serves one socket at a time
/// and, once that socket is gone, another. Nothing of it reaches a process but the word,
/// which is each connection's own ([`FlowFilter::renew`]), so a process that kept its word
/// mapped can never touch a later connection's. Its program reads the word through a
/// one-slot map of maps; putting a word there makes the kernel wait for an RCU grace period
/// (tens of milliseconds under emulation), which the keeper's threads do, never a
/// connection's path.
pub struct FlowFilter {
    prog: OwnedFd,
    /// For urdma.ko (`BELL`).
    pub verdicts: OwnedFd,
    /// urdmad's alone: a process that could write it could admit other connections'
    /// frames to its socket.
    addrs: OwnedFd,
    /// The connection's word, for the process.
    word: OwnedFd,
    /// The one-slot map of maps that holds `word`, for a filter made to be used again.
    slot: Option<OwnedFd>,
    /// Aimed at a connection since its word was made.
    aimed: bool,
}

/// A connection's [`bell`] word: a map of its own, which the process maps.
pub(crate) fn word_map() -> io::Result<OwnedFd> {
    ebpf::create_map(
        BPF_MAP_TYPE_ARRAY,
        4,
        bell::WORD_SIZE,
        1,
        BPF_F_MMAPABLE,
        "urdma_bell",
    )
}

/// Puts `word` in `slot`; waits for an RCU grace period (the kernel does, for a map of maps).
fn put_word(slot: &OwnedFd, word: &OwnedFd) -> io::Result<()> {
    ebpf::map_update(
        slot,
        &0u32.to_ne_bytes(),
        &word.as_raw_fd().to_ne_bytes(),
        0,
    )
}

impl FlowFilter {
    /// Creates the maps and loads the program, with a word and aimed at no connection yet.
    /// `again`: made to be used again ([`FlowFilter::renew`]), which costs a grace period
    /// here; otherwise it reads its word directly and serves one connection only.
    pub fn new(again: bool) -> io::Result<FlowFilter> {
        let word = word_map()?;
        let slot = if again {
            let slot = ebpf::create_map_of_maps(1, &word, "urdma_words")?;
            put_word(&slot, &word)?;
            Some(slot)
        } else {
            None
        };
        let verdicts = ebpf::create_map(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 4, 1, 0, "urdma_verdict")?;
        let addrs = ebpf::create_map(BPF_MAP_TYPE_ARRAY, 4, ADDRS_SIZE, 1, 0, "urdma_flow")?;
        let source = match &slot {
            Some(s) => Word::Slot(s.as_raw_fd()),
            None => Word::Map(word.as_raw_fd()),
        };
        let insns = program(source, verdicts.as_raw_fd(), addrs.as_raw_fd());
        let prog = ebpf::load_socket_filter(&insns, "urdma_flow")?;
        Ok(FlowFilter {
            prog,
            verdicts,
            addrs,
            word,
            slot,
            aimed: false,
        })
    }

    /// The connection's word, which the process maps.
    pub fn word(&self) -> &OwnedFd {
        &self.word
    }

    /// Whether the filter can serve another connection once its socket is gone.
    pub fn can_renew(&self) -> bool {
        self.slot.is_some()
    }

    /// Makes the filter admit the frames of the connection from `remote` to `local`, before
    /// it is attached to the connection's socket. Waits for nothing.
    pub fn aim(&mut self, local: &SocketAddrV4, remote: &SocketAddrV4) -> io::Result<()> {
        let mut v = [0u8; ADDRS_SIZE as usize];
        let words = [
            direct::ports_word(remote.port(), local.port()),
            u32::from(*local.ip()),
            u32::from(*remote.ip()),
        ];
        for (chunk, w) in v.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        self.aimed = true;
        ebpf::map_update(&self.addrs, &0u32.to_ne_bytes(), &v, 0)
    }

    /// Makes the filter admit nothing and its word read as a new one's, for a socket its
    /// process keeps for its next connection (`PARK`): the word stays the process's, so it
    /// need not be renewed. Waits for nothing.
    pub fn aim_at_nothing(&mut self) -> io::Result<()> {
        self.admit_nothing()?;
        ebpf::map_update(
            &self.word,
            &0u32.to_ne_bytes(),
            &[0u8; bell::WORD_SIZE as usize],
            0,
        )
    }

    /// For a filter whose socket is gone, before it is aimed again: it admits nothing, and
    /// reads a new word. Waits for an RCU grace period; nothing to do for a filter never
    /// aimed.
    pub fn renew(&mut self) -> io::Result<()> {
        if !self.aimed {
            return Ok(());
        }
        let Some(slot) = &self.slot else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a filter that reads its word directly serves one connection",
            ));
        };
        self.admit_nothing()?;
        let word = word_map()?;
        put_word(slot, &word)?;
        self.word = word;
        self.aimed = false;
        Ok(())
    }

    /// No address in the filter's map: it admits nothing.
    fn admit_nothing(&self) -> io::Result<()> {
        ebpf::map_update(
            &self.addrs,
            &0u32.to_ne_bytes(),
            &[0u8; ADDRS_SIZE as usize],
            0,
        )
    }

    /// Puts the filter on socket `fd` (see [`direct::hand_over_with`]).
    pub fn attach(&self, fd: RawFd) -> io::Result<()> {
        ebpf::attach(fd, &self.prog)
    }
}

/// The map of a process's hush word (`urdma_shared::bell::Hush`), which urdma.ko reads for
/// the frames of each of its connections that ring the bell, and the process maps.
pub fn hush_map() -> io::Result<OwnedFd> {
    ebpf::create_map(
        BPF_MAP_TYPE_ARRAY,
        4,
        bell::HUSH_SIZE,
        1,
        BPF_F_MMAPABLE,
        "urdma_hush",
    )
}

/// The program. Packet loads past the frame's end would end it with 0 (drop), so the
/// classification checks the length first: a bare ACK is admitted all the same.
/// Where a program finds the word.
#[derive(Clone, Copy)]
enum Word {
    /// In this map.
    Map(RawFd),
    /// In the map in slot 0 of this map of maps.
    Slot(RawFd),
}

/// Leaves R0 = the word's address, or goes to `none`.
fn word_at(a: &mut Asm, word: Word, none: Label) -> &mut Asm {
    match word {
        Word::Map(fd) => a.lookup_entry0(fd),
        Word::Slot(fd) => a.lookup_entry0(fd).if_null(none).lookup_entry0_of(R0),
    }
    .if_null(none)
}

/// Goes on only if the frame's PSN is the one the process waits for (the word's), else to
/// `none`. Leaves R0 = the word's address, R1 = its low half (the PSN), R2 = its high half
/// (non-zero), R9 = the frame's PSN.
fn awaited(a: &mut Asm, word: Word, none: Label) -> &mut Asm {
    a.ld_ind(W, R7, TRP_PSN)
        .op(insn(ALU64 | MOV | X, R9, R0, 0, 0));
    word_at(a, word, none)
        .op(insn(LDX | DW | MEM, R1, R0, 0, 0))
        .op(insn(ALU64 | MOV | X, R2, R1, 0, 0))
        .op(insn(ALU64 | RSH | K, R2, 0, 0, 32))
        .jump(insn(JMP | JEQ | K, R2, 0, 0, 0), none)
        // Its low half, zero-extended.
        .op(insn(ALU | MOV | X, R1, R1, 0, 0))
        .jump(insn(JMP | JNE | X, R1, R9, 0, 0), none)
}

fn program(word: Word, verdicts: RawFd, addrs: RawFd) -> Vec<Insn> {
    use direct::{DADDR_AT, ETHERTYPE_AT, FRAG_AT, IHL_AT, PORTS_AT_X, PROTO_AT, SADDR_AT};
    let mut a = Asm::default();
    let drop = a.label();
    let none = a.label();
    let recv = a.label();
    let solicited = a.label();
    let psn = a.label();
    let follows = a.label();
    let ack = a.label();
    let store = a.label();
    let accept = a.label();
    // R0 against the `addrs` entry's word at `at` (R9 points to the entry).
    let differs = |a: &mut Asm, at: i16| {
        a.op(insn(LDX | W | MEM, R1, R9, at, 0))
            .jump(insn(JMP32 | JNE | X, R0, R1, 0, 0), drop);
    };
    a.op(insn(ALU64 | MOV | X, R6, R1, 0, 0));
    // Admission, as the classic filter: ports first, which differ on most frames.
    a.op(insn(LDX | W | MEM, R0, R6, SKB_PKT_TYPE, 0)).jump_r0(
        JEQ,
        u32::from(libc::PACKET_OUTGOING),
        drop,
    );
    // The connection's addresses; R9 keeps the entry through the packet loads, which
    // clobber R0-R5. A filter not aimed yet (ports word 0) admits nothing.
    a.lookup_entry0(addrs)
        .if_null(drop)
        .op(insn(ALU64 | MOV | X, R9, R0, 0, 0))
        .op(insn(LDX | W | MEM, R0, R9, ADDR_PORTS, 0))
        .jump_r0(JEQ, 0, drop);
    a.ld_abs(H, ETHERTYPE_AT).jump_r0(JNE, 0x0800, drop);
    a.ld_abs(B, IHL_AT)
        .op(insn(ALU64 | AND | K, R0, 0, 0, 0xf))
        .op(insn(ALU64 | LSH | K, R0, 0, 0, 2))
        .op(insn(ALU64 | MOV | X, R7, R0, 0, 0));
    a.ld_ind(W, R7, PORTS_AT_X);
    differs(&mut a, ADDR_PORTS);
    a.ld_abs(B, PROTO_AT).jump_r0(JNE, 17, drop);
    a.ld_abs(H, FRAG_AT).jump_r0(JSET, 0x3fff, drop);
    a.ld_abs(W, DADDR_AT);
    differs(&mut a, ADDR_LOCAL);
    a.ld_abs(W, SADDR_AT);
    differs(&mut a, ADDR_REMOTE);
    // Admitted. Long enough to classify?
    let long_enough = |a: &mut Asm, len: i32| {
        a.op(insn(LDX | W | MEM, R0, R6, SKB_LEN, 0))
            .op(insn(ALU64 | MOV | X, R1, R7, 0, 0))
            .op(insn(ALU64 | ADD | K, R1, 0, 0, len))
            .jump(insn(JMP | JGT | X, R1, R0, 0, 0), none);
    };
    long_enough(&mut a, TRP_HEADER_END_X);
    a.ld_ind(B, R7, TRP_VERSION).jump_r0(JNE, 1, none);
    a.ld_ind(B, R7, TRP_OPCODE)
        .jump_r0(JEQ, trp::wire::trp::Opcode::Ack as u32, ack)
        .jump_r0(JNE, trp::wire::trp::Opcode::Data as u32, none);
    long_enough(&mut a, CLASSIFIED_LEN_X);
    a.ld_ind(B, R7, TRP_FLAGS)
        .jump_r0(JSET, u32::from(FLAG_FOLLOWS), follows);
    a.ld_ind(B, R7, TRP_SACKS).jump_r0(JNE, 0, none);
    a.ld_ind(B, R7, DDP_CONTROL)
        .op(insn(ALU64 | AND | K, R0, 0, 0, DDP_T_L_DV as i32))
        .jump_r0(JNE, UNTAGGED_LAST_V1, none);
    a.ld_ind(W, R7, DDP_QN).jump_r0(JNE, 0, none);
    a.ld_ind(B, R7, RDMAP_CONTROL);
    for op in RECV_OPS {
        a.jump_r0(JEQ, op, recv);
    }
    for op in SOLICITED_OPS {
        a.jump_r0(JEQ, op, solicited);
    }
    a.jump(insn(JMP | JA, 0, 0, 0, 0), none);
    a.bind(recv);
    a.op(insn(ALU64 | MOV | K, R8, 0, 0, verdict::RECV as i32))
        .jump(insn(JMP | JA, 0, 0, 0, 0), psn);
    a.bind(solicited);
    a.op(insn(
        ALU64 | MOV | K,
        R8,
        0,
        0,
        verdict::RECV_SOLICITED as i32,
    ));
    a.bind(psn);
    awaited(&mut a, word, none).jump(insn(JMP | JA, 0, 0, 0, 0), store);
    // The PSN the process waits for, and its sender's next follows at once: wait for
    // that one instead, and wake nobody for this one.
    a.bind(follows);
    awaited(&mut a, word, none)
        // The next PSN, wrapping in 32 bits, with the word's high half as it was.
        .op(insn(ALU | ADD | K, R1, 0, 0, 1))
        .op(insn(ALU64 | LSH | K, R2, 0, 0, 32))
        .op(insn(ALU64 | OR | X, R1, R2, 0, 0))
        .op(insn(STX | DW | MEM, R0, R1, 0, 0))
        .op(insn(ALU64 | MOV | K, R8, 0, 0, verdict::QUIET as i32))
        .jump(insn(JMP | JA, 0, 0, 0, 0), store);
    // An ACK and nothing else, which the process said can wait for its next wake-up.
    a.bind(ack);
    a.ld_ind(B, R7, TRP_FLAGS)
        .jump_r0(JSET, u32::from(FLAG_ACK_REQUEST | FLAG_FOLLOWS), none);
    a.ld_ind(B, R7, TRP_SACKS).jump_r0(JNE, 0, none);
    word_at(&mut a, word, none)
        .op(insn(LDX | DW | MEM, R1, R0, bell::ACKS_AT as i16, 0))
        .jump(insn(JMP | JNE | K, R1, 0, 0, bell::ACKS_WAIT as i32), none)
        .op(insn(ALU64 | MOV | K, R8, 0, 0, verdict::QUIET as i32))
        .jump(insn(JMP | JA, 0, 0, 0, 0), store);
    a.bind(none);
    a.op(insn(ALU64 | MOV | K, R8, 0, 0, verdict::NONE as i32));
    // Every admitted frame leaves its verdict, so none is read for another frame's.
    a.bind(store);
    a.lookup_entry0(verdicts)
        .if_null(accept)
        .op(insn(STX | W | MEM, R0, R8, 0, 0));
    a.bind(accept);
    a.ret(ACCEPT);
    a.bind(drop);
    a.ret(0);
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame;

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    const LOCAL: &str = "10.0.0.1:40000";
    /// Ports from 2^15 up, as ephemeral ones are: the word of both is above 2^31.
    const REMOTE: &str = "10.0.0.2:50000";

    /// A UDP frame of the connection carrying `payload`.
    fn udp(payload: &[u8]) -> Vec<u8> {
        frame::udp_frame([2; 6], [4; 6], sa(REMOTE), sa(LOCAL), payload)
    }

    /// A TRP Data packet of PSN `psn` with a DDP untagged header: `ddp` its first byte,
    /// `rdmap` its second, queue `qn`, and 4 bytes of payload.
    fn data(psn: u32, ddp: u8, rdmap: u8, qn: u32) -> Vec<u8> {
        let mut p = vec![1, 0, 0x01, 0];
        p.extend_from_slice(&11u32.to_be_bytes());
        p.extend_from_slice(&psn.to_be_bytes());
        p.extend_from_slice(&0x7fff_0000u32.to_be_bytes());
        p.extend_from_slice(&[4, 0, 0, 0]);
        p.extend_from_slice(&[ddp, rdmap, 0, 0, 0, 0]);
        p.extend_from_slice(&qn.to_be_bytes());
        p.extend_from_slice(&5u32.to_be_bytes());
        p.extend_from_slice(&0u32.to_be_bytes());
        p.extend_from_slice(b"data");
        p
    }

    /// Writes a whole value of the word's map: the word for `next`, and the second word.
    fn put(map: &OwnedFd, next: Option<u32>, acks_wait: bool) {
        let mut v = [0u8; bell::WORD_SIZE as usize];
        v[..8].copy_from_slice(&bell::word(next).to_ne_bytes());
        let acks = if acks_wait { bell::ACKS_WAIT } else { 0 };
        v[bell::ACKS_AT..bell::ACKS_AT + 8].copy_from_slice(&acks.to_ne_bytes());
        ebpf::map_update(map, &0u32.to_ne_bytes(), &v, 0).unwrap();
    }

    struct Bed {
        f: FlowFilter,
    }

    impl Bed {
        /// A filter aimed at the connection: one to be used again (its word through a
        /// slot) with `again`.
        fn of(again: bool) -> Bed {
            let mut f = FlowFilter::new(again).expect("load the flow filter (needs CAP_BPF)");
            f.aim(&sa(LOCAL), &sa(REMOTE)).unwrap();
            Bed { f }
        }

        fn new() -> Bed {
            Bed::of(true)
        }

        fn publish(&self, next: Option<u32>) {
            self.publish_all(next, false);
        }

        /// The word for `next`, and whether ACKs can wait.
        fn publish_all(&self, next: Option<u32>, acks_wait: bool) {
            put(self.f.word(), next, acks_wait);
        }

        /// The word as the filter left it.
        fn word(&self) -> u64 {
            let mut v = [0u8; bell::WORD_SIZE as usize];
            ebpf::map_lookup(self.f.word(), &0u32.to_ne_bytes(), &mut v).unwrap();
            u64::from_ne_bytes(v[..8].try_into().unwrap())
        }

        /// The word's map's whole value.
        fn value(&self) -> [u8; bell::WORD_SIZE as usize] {
            let mut v = [0u8; bell::WORD_SIZE as usize];
            ebpf::map_lookup(self.f.word(), &0u32.to_ne_bytes(), &mut v).unwrap();
            v
        }

        /// The filter's verdict on `frame` and the bell's: the one slot of the per-CPU
        /// array that is set (all are cleared first, so a run on any CPU shows). For a frame
        /// it admits, urdmad's own verdict for a connection through its rings
        /// ([`crate::ringbell::verdict`]), run on the word as it was, must be the same and
        /// leave the word the same.
        fn run(&self, frame: &[u8]) -> (u32, u32) {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) * 4;
            let zero = vec![0u8; 8 * cpus.max(256)];
            let key = 0u32.to_ne_bytes();
            // The kernel reads a value per possible CPU, 8 bytes each: room for more.
            ebpf::map_update(&self.f.verdicts, &key, &zero, 0).unwrap();
            let before = self.value();
            let accept = ebpf::test_run(&self.f.prog, frame).unwrap();
            let mut all = zero.clone();
            ebpf::map_lookup(&self.f.verdicts, &key, &mut all).unwrap();
            let v = all
                .chunks(8)
                .map(|c| u32::from_ne_bytes(c[..4].try_into().unwrap()))
                .max()
                .unwrap();
            if accept != 0 {
                let after = self.value();
                ebpf::map_update(self.f.word(), &key, &before, 0).unwrap();
                let map = self.f.word().try_clone().unwrap();
                let ours = crate::ringbell::RingBell::of(map, 0, 0).unwrap();
                assert_eq!(ours.verdict(frame), v, "urdmad's verdict on {frame:02x?}");
                assert_eq!(self.value(), after, "the word urdmad left for {frame:02x?}");
            }
            (accept, v)
        }
    }

    /// Runs in the kernel: needs `CAP_BPF`, as urdmad does.
    #[test]
    fn admits_the_connection_s_frames_only() {
        for again in [false, true] {
            admits_only(&Bed::of(again));
        }
    }

    fn admits_only(b: &Bed) {
        let send = data(9, 0x41, 0x43, 0);
        assert_eq!(b.run(&udp(&send)).0, ACCEPT);
        for (s, d) in [
            ("10.0.0.3:50000", LOCAL),
            ("10.0.0.2:50001", LOCAL),
            (REMOTE, "10.0.0.1:40001"),
            (REMOTE, "10.0.0.9:40000"),
        ] {
            let f = frame::udp_frame([2; 6], [4; 6], sa(s), sa(d), &send);
            assert_eq!(b.run(&f), (0, 0), "{s} -> {d}");
        }
        let mut arp = udp(&send);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(b.run(&arp).0, 0);
        let mut frag = udp(&send);
        frag[21] = 1;
        assert_eq!(b.run(&frag).0, 0);
        let mut tcp = udp(&send);
        tcp[23] = 6;
        assert_eq!(b.run(&tcp).0, 0);
        // An IP header with options moves everything after it.
        let mut opts = udp(&send);
        opts[14] = 0x46;
        opts.splice(34..34, [1u8, 1, 1, 1]);
        b.publish(Some(9));
        assert_eq!(b.run(&opts), (ACCEPT, verdict::RECV));
    }

    /// A filter the socket keeper made ready admits nothing before it is aimed, not even a
    /// frame whose addresses and ports are all zero, the map's values before `aim`.
    #[test]
    fn admits_nothing_before_it_is_aimed() {
        for again in [false, true] {
            let mut b = Bed {
                f: FlowFilter::new(again).expect("load the flow filter (needs CAP_BPF)"),
            };
            let send = data(9, 0x41, 0x43, 0);
            b.publish(Some(9));
            for (s, d) in [(REMOTE, LOCAL), ("0.0.0.0:0", "0.0.0.0:0")] {
                let f = frame::udp_frame([2; 6], [4; 6], sa(s), sa(d), &send);
                assert_eq!(b.run(&f), (0, 0), "{s} -> {d}");
            }
            b.f.aim(&sa(LOCAL), &sa(REMOTE)).unwrap();
            assert_eq!(b.run(&udp(&send)), (ACCEPT, verdict::RECV));
        }
    }

    /// A filter aimed again, after its socket is gone, serves the new connection only and
    /// reads only its word: the last connection's process may still have its word mapped.
    #[test]
    fn a_filter_aimed_again_admits_and_reads_only_the_new_connection_s() {
        let mut b = Bed::new();
        let send = |psn| udp(&data(psn, 0x41, 0x43, 0));
        b.publish(Some(9));
        assert_eq!(b.run(&send(9)), (ACCEPT, verdict::RECV));
        let old = b.f.word().try_clone().unwrap();
        b.f.renew().unwrap();
        assert_eq!(b.run(&send(9)), (0, 0), "renewed: nothing admitted");
        b.f.renew().unwrap();
        const NEW: &str = "10.0.0.3:45000";
        b.f.aim(&sa(LOCAL), &sa(NEW)).unwrap();
        assert_eq!(b.run(&send(9)), (0, 0), "the last connection's frame");
        let new = |psn| {
            frame::udp_frame(
                [2; 6],
                [4; 6],
                sa(NEW),
                sa(LOCAL),
                &data(psn, 0x41, 0x43, 0),
            )
        };
        // The old word, written by the old process, is not read; the new one is.
        put(&old, Some(9), true);
        assert_eq!(b.run(&new(9)), (ACCEPT, verdict::NONE));
        b.publish(Some(9));
        assert_eq!(b.run(&new(9)), (ACCEPT, verdict::RECV));
        // One that reads its word directly serves one connection.
        let mut once = Bed::of(false);
        assert!(!once.f.can_renew() && once.f.renew().is_err());
    }

    #[test]
    fn rings_for_the_published_psn_s_last_untagged_segment_on_queue_0() {
        let b = Bed::new();
        let send = |psn| udp(&data(psn, 0x41, 0x43, 0));
        // Nothing published: nothing rings.
        assert_eq!(b.run(&send(9)), (ACCEPT, verdict::NONE));
        b.publish(Some(9));
        assert_eq!(b.run(&send(9)), (ACCEPT, verdict::RECV));
        assert_eq!(
            b.run(&send(10)),
            (ACCEPT, verdict::NONE),
            "not the next PSN"
        );
        assert_eq!(b.run(&send(8)), (ACCEPT, verdict::NONE), "a duplicate");
        b.publish(None);
        assert_eq!(
            b.run(&send(9)),
            (ACCEPT, verdict::NONE),
            "no receive posted"
        );
        b.publish(Some(0xffff_ffff));
        assert_eq!(b.run(&send(0xffff_ffff)), (ACCEPT, verdict::RECV));
        b.publish(Some(9));
        for (rdmap, v) in [
            (0x44, verdict::RECV),
            (0x48, verdict::RECV),
            (0x45, verdict::RECV_SOLICITED),
            (0x46, verdict::RECV_SOLICITED),
            (0x49, verdict::RECV_SOLICITED),
            (0x41, verdict::NONE), // Read Request
            (0x47, verdict::NONE), // Terminate
            (0x4a, verdict::NONE), // Atomic Request
            (0x03, verdict::NONE), // RDMAP version 0
        ] {
            assert_eq!(
                b.run(&udp(&data(9, 0x41, rdmap, 0))),
                (ACCEPT, v),
                "{rdmap:#x}"
            );
        }
        // Not the last segment, tagged, another DDP version, another queue.
        for (ddp, qn) in [(0x01, 0), (0xc1, 0), (0x42, 0), (0x41, 1)] {
            assert_eq!(
                b.run(&udp(&data(9, ddp, 0x43, qn))),
                (ACCEPT, verdict::NONE)
            );
        }
        // Other TRP packets: an ACK (header only), a Sack, another version, a Fin.
        let ack = &data(9, 0x41, 0x43, 0)[..20];
        let mut ack = ack.to_vec();
        ack[1] = 1;
        assert_eq!(b.run(&udp(&ack)), (ACCEPT, verdict::NONE));
        for (at, v) in [(1usize, 2u8), (0, 2), (1, 6), (3, 1)] {
            let mut p = data(9, 0x41, 0x43, 0);
            p[at] = v;
            assert_eq!(b.run(&udp(&p)), (ACCEPT, verdict::NONE), "byte {at} = {v}");
        }
        // Cut short of the QN: admitted, not classified; an empty datagram too.
        let full = data(9, 0x41, 0x43, 0);
        assert_eq!(b.run(&udp(&full[..29])), (ACCEPT, verdict::NONE));
        assert_eq!(b.run(&udp(&full[..30])), (ACCEPT, verdict::RECV));
        assert_eq!(b.run(&udp(&[])), (ACCEPT, verdict::NONE));
    }

    #[test]
    fn a_frame_followed_at_once_wakes_nobody_and_the_next_psn_is_awaited() {
        let b = Bed::new();
        let follows = |psn, ddp| {
            let mut p = data(psn, ddp, 0x43, 0);
            p[2] |= trp::wire::trp::FLAG_FOLLOWS;
            udp(&p)
        };
        let send = |psn| udp(&data(psn, 0x41, 0x43, 0));
        // Nothing published, or another PSN: woken as any frame, the word unchanged.
        assert_eq!(b.run(&follows(9, 0x01)), (ACCEPT, verdict::NONE));
        assert_eq!(b.word(), 0);
        b.publish(Some(9));
        assert_eq!(b.run(&follows(8, 0x01)), (ACCEPT, verdict::NONE));
        assert_eq!(b.run(&follows(10, 0x01)), (ACCEPT, verdict::NONE));
        assert_eq!(b.word(), bell::word(Some(9)));
        // A Send's first two segments, then its last: one verdict that rings.
        assert_eq!(b.run(&follows(9, 0x01)), (ACCEPT, verdict::QUIET));
        assert_eq!(b.word(), bell::word(Some(10)));
        assert_eq!(b.run(&follows(10, 0x01)), (ACCEPT, verdict::QUIET));
        assert_eq!(b.run(&send(11)), (ACCEPT, verdict::RECV));
        // A Write (tagged) whose Immediate Data follows; the PSN wraps.
        b.publish(Some(0xffff_ffff));
        assert_eq!(b.run(&follows(0xffff_ffff, 0x81)), (ACCEPT, verdict::QUIET));
        assert_eq!(b.word(), bell::word(Some(0)));
        assert_eq!(
            b.run(&udp(&data(0, 0x41, 0x48, 0))),
            (ACCEPT, verdict::RECV)
        );
        // Not a Data packet: an ACK with the flag is woken for.
        b.publish(Some(9));
        let mut ack = data(9, 0x41, 0x43, 0)[..20].to_vec();
        ack[1] = 1;
        ack[2] |= trp::wire::trp::FLAG_FOLLOWS;
        assert_eq!(b.run(&udp(&ack)), (ACCEPT, verdict::NONE));
        assert_eq!(b.word(), bell::word(Some(9)));
    }

    /// A TRP ACK of `nsack` ranges (8 bytes each) with `flags`.
    fn ack(flags: u8, nsack: u8) -> Vec<u8> {
        let mut p = data(9, 0x41, 0x43, 0)[..20].to_vec();
        p[1] = trp::wire::trp::Opcode::Ack as u8;
        p[2] = flags;
        p[3] = nsack;
        p.extend(std::iter::repeat_n(0u8, 8 * usize::from(nsack)));
        p
    }

    #[test]
    fn an_ack_that_can_wait_wakes_nobody() {
        for again in [false, true] {
            acks_wait(&Bed::of(again));
        }
    }

    fn acks_wait(b: &Bed) {
        let bare = udp(&ack(0, 0));
        assert_eq!(b.run(&bare), (ACCEPT, verdict::NONE), "nothing said yet");
        b.publish_all(Some(9), true);
        assert_eq!(b.run(&bare), (ACCEPT, verdict::QUIET));
        // With a trailer, as every datagram of a connection that asked for one.
        let crc = udp(&ack(trp::wire::trp::FLAG_CRC, 0));
        assert_eq!(b.run(&crc), (ACCEPT, verdict::QUIET));
        assert_eq!(b.word(), bell::word(Some(9)), "the word unchanged");
        // What the process must read at once: an ACK asked for an answer, one that says
        // more follows, one with SACK ranges (a loss to repair), a Sack.
        for (p, why) in [
            (ack(FLAG_ACK_REQUEST, 0), "asked"),
            (ack(FLAG_FOLLOWS, 0), "follows"),
            (ack(0, 1), "ranges"),
        ] {
            assert_eq!(b.run(&udp(&p)), (ACCEPT, verdict::NONE), "{why}");
        }
        let mut sack = ack(0, 1);
        sack[1] = trp::wire::trp::Opcode::Sack as u8;
        assert_eq!(b.run(&udp(&sack)), (ACCEPT, verdict::NONE), "a Sack");
        // Cut short of its header, or another version.
        assert_eq!(b.run(&udp(&ack(0, 0)[..19])), (ACCEPT, verdict::NONE));
        let mut v2 = ack(0, 0);
        v2[0] = 2;
        assert_eq!(b.run(&udp(&v2)), (ACCEPT, verdict::NONE));
        // Data still rings and wakes as before.
        assert_eq!(
            b.run(&udp(&data(9, 0x41, 0x43, 0))),
            (ACCEPT, verdict::RECV)
        );
        assert_eq!(
            b.run(&udp(&data(10, 0x81, 0x40, 0))),
            (ACCEPT, verdict::NONE)
        );
        // The process takes it back.
        b.publish_all(Some(9), false);
        assert_eq!(b.run(&bare), (ACCEPT, verdict::NONE));
        // With no PSN awaited, an ACK can still wait.
        b.publish_all(None, true);
        assert_eq!(b.run(&bare), (ACCEPT, verdict::QUIET));
    }

    /// What a process checks before it keeps a parked socket's word for the socket's next
    /// connection: the map urdmad passes is the one it has mapped, by the kernel's id, and
    /// the word starts closed again.
    #[test]
    fn a_word_is_known_again_by_its_map_and_reset_closes_it() {
        let map = word_map().unwrap();
        let again = map.try_clone().unwrap();
        let other = word_map().unwrap();
        let mut word = bell::BellWord::map(map).unwrap();
        assert_eq!(word.map_id().unwrap(), bell::map_id(&again).unwrap());
        assert_ne!(word.map_id().unwrap(), bell::map_id(&other).unwrap());
        let read = |m: &OwnedFd| {
            let mut v = [0u8; bell::WORD_SIZE as usize];
            ebpf::map_lookup(m, &0u32.to_ne_bytes(), &mut v).unwrap();
            u64::from_ne_bytes(v[..8].try_into().unwrap())
        };
        word.events(true);
        word.publish(Some(7));
        assert_eq!(read(&again), bell::OPEN | bell::EVENTS | 7);
        word.reset();
        assert_eq!(read(&again), 0);
        // Nothing cached survives: the same PSN is published again, without the events.
        word.publish(Some(7));
        assert_eq!(read(&again), bell::word(Some(7)));
        assert!(bell::map_id(&std::fs::File::open("/dev/null").unwrap().into()).is_err());
    }
}
