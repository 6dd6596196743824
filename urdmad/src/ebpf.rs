//! Enough eBPF to build urdmad's socket filters by hand: instructions, a program whose
//! jumps name labels, maps, loading and attaching (bpf(2)). urdmad's filters are a few
//! dozen instructions, fixed but for constants, so no compiler or loader library is worth
//! its weight here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Insn {
    code: u8,
    /// dst_reg in the low nibble, src_reg in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

pub fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | src << 4,
        off,
        imm,
    }
}

// Instruction classes, sizes, modes and operations (linux/bpf_common.h, linux/bpf.h).
pub const LD: u8 = 0x00;
pub const LDX: u8 = 0x01;
pub const ST: u8 = 0x02;
pub const STX: u8 = 0x03;
pub const ALU: u8 = 0x04;
pub const JMP: u8 = 0x05;
/// Jumps that compare the registers' low 32 bits.
pub const JMP32: u8 = 0x06;
pub const ALU64: u8 = 0x07;
pub const W: u8 = 0x00;
pub const H: u8 = 0x08;
pub const B: u8 = 0x10;
pub const DW: u8 = 0x18;
pub const IMM: u8 = 0x00;
pub const ABS: u8 = 0x20;
pub const IND: u8 = 0x40;
pub const MEM: u8 = 0x60;
pub const K: u8 = 0x00;
pub const X: u8 = 0x08;
pub const ADD: u8 = 0x00;
pub const OR: u8 = 0x40;
pub const AND: u8 = 0x50;
pub const LSH: u8 = 0x60;
pub const RSH: u8 = 0x70;
pub const MOV: u8 = 0xb0;
pub const JA: u8 = 0x00;
pub const JEQ: u8 = 0x10;
pub const JGT: u8 = 0x20;
pub const JNE: u8 = 0x50;
pub const JSET: u8 = 0x40;
pub const CALL: u8 = 0x80;
pub const EXIT: u8 = 0x90;
const PSEUDO_MAP_FD: u8 = 1;
pub const FN_MAP_LOOKUP_ELEM: i32 = 1;
/// `offsetof(struct __sk_buff, len)`: the frame's length.
pub const SKB_LEN: i16 = 0;
/// `offsetof(struct __sk_buff, pkt_type)`.
pub const SKB_PKT_TYPE: i16 = 4;
/// Registers: R0 return value and load results, R1-R5 arguments (a call or a packet load
/// overwrites them), R6-R9 kept across both (R6 the context, where `LD_ABS` wants it), R10
/// the frame pointer.
pub const R0: u8 = 0;
pub const R1: u8 = 1;
pub const R2: u8 = 2;
pub const R6: u8 = 6;
pub const R7: u8 = 7;
pub const R8: u8 = 8;
pub const R9: u8 = 9;
pub const R10: u8 = 10;

/// A place in a program, named before it is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(usize);

/// A program being written: jumps name [`Label`]s, resolved by [`Asm::finish`].
#[derive(Default)]
pub struct Asm {
    insns: Vec<(Insn, Option<Label>)>,
    at: Vec<Option<usize>>,
}

impl Asm {
    pub fn label(&mut self) -> Label {
        self.at.push(None);
        Label(self.at.len() - 1)
    }

    /// `l` is the next instruction.
    pub fn bind(&mut self, l: Label) {
        self.at[l.0] = Some(self.insns.len());
    }

    pub fn op(&mut self, i: Insn) -> &mut Asm {
        self.insns.push((i, None));
        self
    }

    /// A jump (its offset set by [`Asm::finish`]).
    pub fn jump(&mut self, i: Insn, to: Label) -> &mut Asm {
        self.insns.push((i, Some(to)));
        self
    }

    /// `if (u32)R0 <op> imm goto to`: a 32-bit comparison, as a packet load's word is. (A
    /// 64-bit one would sign-extend an `imm` from 2^31 up, and never match the word.)
    pub fn jump_r0(&mut self, op: u8, imm: u32, to: Label) -> &mut Asm {
        self.jump(insn(JMP32 | op | K, R0, 0, 0, imm as i32), to)
    }

    /// `if R0 == NULL goto to`, after a map lookup.
    pub fn if_null(&mut self, to: Label) -> &mut Asm {
        self.jump(insn(JMP | JEQ | K, R0, 0, 0, 0), to)
    }

    /// `R0 = the packet's `size` at `at` (network order read as a number)`; a load past the
    /// end ends the program with 0.
    pub fn ld_abs(&mut self, size: u8, at: u32) -> &mut Asm {
        self.op(insn(LD | size | ABS, 0, 0, 0, at as i32))
    }

    /// `R0 = the packet's `size` at `reg` + `at``.
    pub fn ld_ind(&mut self, size: u8, reg: u8, at: u32) -> &mut Asm {
        self.op(insn(LD | size | IND, 0, reg, 0, at as i32))
    }

    /// `reg` = the map `fd` (two instructions).
    pub fn ld_map(&mut self, reg: u8, fd: RawFd) -> &mut Asm {
        self.op(insn(LD | DW | IMM, reg, PSEUDO_MAP_FD, 0, fd));
        self.op(insn(0, 0, 0, 0, 0))
    }

    /// `R0` = the address of entry 0 of the array map that register `map` points to (an
    /// entry of a map of maps, checked not null), or 0. Uses the word at the stack's top.
    pub fn lookup_entry0_of(&mut self, map: u8) -> &mut Asm {
        self.op(insn(ST | W | MEM, R10, 0, -4, 0));
        self.op(insn(ALU64 | MOV | X, R1, map, 0, 0));
        self.op(insn(ALU64 | MOV | X, R2, R10, 0, 0));
        self.op(insn(ALU64 | ADD | K, R2, 0, 0, -4));
        self.op(insn(JMP | CALL, 0, 0, 0, FN_MAP_LOOKUP_ELEM))
    }

    /// `R0` = the address of entry 0 of the map `fd`'s array, or 0. Uses the word at the
    /// stack's top.
    pub fn lookup_entry0(&mut self, fd: RawFd) -> &mut Asm {
        self.op(insn(ST | W | MEM, R10, 0, -4, 0));
        self.ld_map(R1, fd);
        self.op(insn(ALU64 | MOV | X, R2, R10, 0, 0));
        self.op(insn(ALU64 | ADD | K, R2, 0, 0, -4));
        self.op(insn(JMP | CALL, 0, 0, 0, FN_MAP_LOOKUP_ELEM))
    }

    /// `return imm`.
    pub fn ret(&mut self, imm: u32) -> &mut Asm {
        self.op(insn(ALU64 | MOV | K, R0, 0, 0, imm as i32));
        self.op(insn(JMP | EXIT, 0, 0, 0, 0))
    }

    /// The instructions, every jump resolved. Panics on a label never bound: a bug of the
    /// program's writer, caught by its tests.
    pub fn finish(self) -> Vec<Insn> {
        self.insns
            .iter()
            .enumerate()
            .map(|(i, &(mut ins, to))| {
                if let Some(to) = to {
                    let target = self.at[to.0].expect("a jump to a label never bound");
                    ins.off = (target as isize - i as isize - 1) as i16;
                }
                ins
            })
            .collect()
    }
}

// bpf(2) commands and types.
const BPF_MAP_CREATE: i32 = 0;
#[cfg(test)]
const BPF_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_MAP_UPDATE_ELEM: i32 = 2;
const BPF_MAP_DELETE_ELEM: i32 = 3;
const BPF_PROG_LOAD: i32 = 5;
#[cfg(test)]
const BPF_PROG_TEST_RUN: i32 = 10;
pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;
/// A map the process that holds it may `mmap` (arrays only).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
pub const BPF_NOEXIST: u64 = 1;
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
        let n = name.len().min(15);
        self.0[at..at + n].copy_from_slice(&name.as_bytes()[..n]);
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

/// A new array of `entries` maps, each like `template` (its kind, sizes and flags): the
/// program that uses it reads the maps put in it later.
pub fn create_map_of_maps(entries: u32, template: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    bpf_fd(
        BPF_MAP_CREATE,
        Attr::new()
            .u32(0, BPF_MAP_TYPE_ARRAY_OF_MAPS)
            .u32(4, 4)
            .u32(8, 4)
            .u32(12, entries)
            .u32(20, template.as_raw_fd() as u32)
            .name(28, name),
    )
}

/// A new map (`BPF_MAP_CREATE`).
pub fn create_map(
    kind: u32,
    key_size: u32,
    value_size: u32,
    entries: u32,
    flags: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    bpf_fd(
        BPF_MAP_CREATE,
        Attr::new()
            .u32(0, kind)
            .u32(4, key_size)
            .u32(8, value_size)
            .u32(12, entries)
            .u32(16, flags)
            .name(28, name),
    )
}

/// Sets `key` to `value` in `map` (`flags`: `BPF_NOEXIST` or 0).
pub fn map_update(map: &OwnedFd, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    bpf(
        BPF_MAP_UPDATE_ELEM,
        Attr::new()
            .u32(0, map.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, value.as_ptr() as u64)
            .u64(24, flags),
    )
    .map(drop)
}

pub fn map_delete(map: &OwnedFd, key: &[u8]) -> io::Result<()> {
    bpf(
        BPF_MAP_DELETE_ELEM,
        Attr::new()
            .u32(0, map.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64),
    )
    .map(drop)
}

/// Reads `key`'s value into `value` (for a per-CPU map, every CPU's, each rounded up to 8
/// bytes).
#[cfg(test)]
pub fn map_lookup(map: &OwnedFd, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    bpf(
        BPF_MAP_LOOKUP_ELEM,
        Attr::new()
            .u32(0, map.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, value.as_mut_ptr() as u64),
    )
    .map(drop)
}

/// Loads `insns` as a socket filter named `name`. The error of a refused program carries
/// the verifier's last word.
pub fn load_socket_filter(insns: &[Insn], name: &str) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let load = |log: &mut [u8]| {
        let mut attr = Attr::new();
        attr.u32(0, BPF_PROG_TYPE_SOCKET_FILTER)
            .u32(4, insns.len() as u32)
            .u64(8, insns.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .name(48, name);
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
    load(&mut []).map_err(|e| {
        let mut log = vec![0u8; 1 << 20];
        let _ = load(&mut log);
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let why = String::from_utf8_lossy(&log[..end]);
        let last = why
            .lines()
            .rev()
            .find(|l| !l.is_empty())
            .unwrap_or("no log");
        io::Error::new(e.kind(), format!("loading {name}: {e}: {last}"))
    })
}

/// Puts the filter `prog` on socket `fd`.
pub fn attach(fd: RawFd, prog: &OwnedFd) -> io::Result<()> {
    let prog = prog.as_raw_fd();
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

/// The verdict of the socket filter `prog` on the Ethernet frame `frame`, run by the kernel
/// (`BPF_PROG_TEST_RUN`) on the calling CPU.
#[cfg(test)]
pub fn test_run(prog: &OwnedFd, frame: &[u8]) -> io::Result<u32> {
    // The kernel takes a test frame's Ethernet header off before a socket filter runs,
    // where a packet socket's filter sees it: put one more in front.
    let mut data = vec![0u8; 14];
    data[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    data.extend_from_slice(frame);
    let mut attr = Attr::new();
    attr.u32(0, prog.as_raw_fd() as u32)
        .u32(8, data.len() as u32)
        .u64(16, data.as_ptr() as u64)
        .u32(32, 1);
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok(attr.read_u32(4))
}
