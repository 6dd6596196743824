//! urdma.ko's bell for connections whose frames come through urdmad's rings (off the direct
//! path: a PCI or TAP port, `direct = false`, or more connections than `direct_max`).
//!
//! On the direct path the socket's filter ([`crate::flowfilter`]) gives each frame a verdict
//! and urdma.ko fires the receive CQ's event in the softirq. Here urdmad is the one that sees
//! the frame first: it gives the same verdict, from the same [`crate::bell`] word the process
//! publishes, and for a frame that completes a receive asks urdma.ko to fire the CQ
//! (`URDMA_CM_RING`) once the frame is on the ring. An application blocked on its completion
//! channel is then woken once, by the kernel, and its own poll runs the protocol; the
//! process's helper is woken (`EVENT WAKE`) only for frames that rang nothing and are not
//! quiet. The verdict is [`verdict`], the filter's program written again in Rust: the tests
//! of [`crate::flowfilter`] run both on every frame they try.

use crate::bell;
use crate::cm_channel::verdict as v;
use crate::flowfilter::{
    word_map, CLASSIFIED_LEN_X, DDP_CONTROL, DDP_QN, DDP_T_L_DV, RDMAP_CONTROL, RECV_OPS,
    SOLICITED_OPS, TRP_FLAGS, TRP_HEADER_END_X, TRP_OPCODE, TRP_PSN, TRP_SACKS, TRP_VERSION,
    UNTAGGED_LAST_V1,
};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use trp::wire::trp::{Opcode, FLAG_ACK_REQUEST, FLAG_FOLLOWS};

/// A connection's bell word as urdmad reads it ([`bell::BellWord`] is the process's side),
/// with the QP urdma.ko knows the connection by.
pub struct RingBell {
    word: *const AtomicU64,
    len: usize,
    map: OwnedFd,
    pub dev: u32,
    pub qpn: u32,
}

// SAFETY: the mapping is this value's alone and lives as long as it; every access is atomic.
unsafe impl Send for RingBell {}

impl RingBell {
    /// A new word for QP `dev`/`qpn`, closed: nothing rings until the process publishes.
    pub fn new(dev: u32, qpn: u32) -> io::Result<RingBell> {
        RingBell::of(word_map()?, dev, qpn)
    }

    /// Maps the word's map `map` (a [`crate::flowfilter`] word map).
    pub fn of(map: OwnedFd, dev: u32, qpn: u32) -> io::Result<RingBell> {
        let (word, len) = bell::map_word(&map)?;
        Ok(RingBell {
            word,
            len,
            map,
            dev,
            qpn,
        })
    }

    /// The word's map, which the process maps.
    pub fn map(&self) -> RawFd {
        self.map.as_raw_fd()
    }

    /// Whether the connection's receive CQ has a completion channel ([`bell::EVENTS`]): a
    /// receive completed without one fires nothing, and is not worth a system call.
    pub fn events(&self) -> bool {
        // SAFETY: the mapping holds the word at its start while self lives.
        unsafe { &*self.word }.load(Ordering::Acquire) & bell::EVENTS != 0
    }

    /// The verdict on `frame`, a frame of the connection (as [`verdict`]).
    pub fn verdict(&self, frame: &[u8]) -> u32 {
        // SAFETY: the mapping holds the two 8-aligned words at its start while self lives.
        let (word, acks) = unsafe { (&*self.word, &*self.word.add(bell::ACKS_AT / 8)) };
        verdict(frame, word, acks)
    }
}

impl Drop for RingBell {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, not used after this.
        unsafe { libc::munmap(self.word as *mut libc::c_void, self.len) };
    }
}

/// What `frame` (Ethernet, IPv4, UDP, admitted to the connection's flow already) completes,
/// as `enum urdma_bell_verdict` says: `RECV` or `RECV_SOLICITED` for the last segment of an
/// untagged message on queue 0 whose PSN is the one `word` waits for; `QUIET` for a frame of
/// that PSN whose next follows at once (the word then waits for the next PSN), and for an
/// ACK with nothing else in it while `acks` says such ACKs can wait; `NONE` otherwise.
pub fn verdict(frame: &[u8], word: &AtomicU64, acks: &AtomicU64) -> u32 {
    let Some(&ihl) = frame.get(crate::direct::IHL_AT as usize) else {
        return v::NONE;
    };
    let x = usize::from(ihl & 0xf) * 4;
    let at = |off: u32| frame.get(x + off as usize).copied().map_or(0, u32::from);
    let has = |len: i32| frame.len() >= x + len as usize;
    if !has(TRP_HEADER_END_X) || at(TRP_VERSION) != 1 {
        return v::NONE;
    }
    let flags = at(TRP_FLAGS);
    let opcode = at(TRP_OPCODE);
    if opcode == Opcode::Ack as u32 {
        let quiet = flags & u32::from(FLAG_ACK_REQUEST | FLAG_FOLLOWS) == 0
            && at(TRP_SACKS) == 0
            && acks.load(Ordering::Acquire) == bell::ACKS_WAIT;
        return if quiet { v::QUIET } else { v::NONE };
    }
    if opcode != Opcode::Data as u32 || !has(CLASSIFIED_LEN_X) {
        return v::NONE;
    }
    let be32 = |off: u32| (0..4).fold(0u32, |w, i| w << 8 | at(off + i));
    let psn = be32(TRP_PSN);
    let w = word.load(Ordering::Acquire);
    let awaited = w >> 32 != 0 && w as u32 == psn;
    if flags & u32::from(FLAG_FOLLOWS) != 0 {
        if !awaited {
            return v::NONE;
        }
        // Wait for the next PSN instead. A process that published meanwhile wins.
        let next = (w & !0xffff_ffff) | u64::from(psn.wrapping_add(1));
        let _ = word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Relaxed);
        return v::QUIET;
    }
    if at(TRP_SACKS) != 0
        || at(DDP_CONTROL) & DDP_T_L_DV != UNTAGGED_LAST_V1
        || be32(DDP_QN) != 0
        || !awaited
    {
        return v::NONE;
    }
    let op = at(RDMAP_CONTROL);
    if RECV_OPS.contains(&op) {
        v::RECV
    } else if SOLICITED_OPS.contains(&op) {
        v::RECV_SOLICITED
    } else {
        v::NONE
    }
}

/// What a burst's frames of one flow ask for: how many wake the process's helper, and the
/// verdict to ring urdma.ko's bell with, if one completes a receive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Burst {
    pub wakes: u64,
    pub ring: Option<u32>,
}

impl Burst {
    /// Adds a frame's verdict. A solicited receive rings an arm of either kind, a plain one
    /// only an arm for any completion: one ring per burst, the stronger.
    pub fn add(&mut self, verdict: u32) {
        match verdict {
            v::RECV_SOLICITED => self.ring = Some(v::RECV_SOLICITED),
            v::RECV => {
                self.ring.get_or_insert(v::RECV);
            }
            v::QUIET => {}
            _ => self.wakes += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_rings_once_with_the_strongest_verdict_and_counts_the_rest() {
        let mut b = Burst::default();
        for x in [
            v::NONE,
            v::RECV,
            v::QUIET,
            v::RECV_SOLICITED,
            v::RECV,
            v::NONE,
        ] {
            b.add(x);
        }
        assert_eq!(
            b,
            Burst {
                wakes: 2,
                ring: Some(v::RECV_SOLICITED)
            }
        );
        let mut q = Burst::default();
        q.add(v::QUIET);
        assert_eq!(q, Burst::default(), "a quiet frame asks for nothing");
    }

    /// Runs in the kernel (a BPF map): needs `CAP_BPF`, as urdmad does.
    #[test]
    fn a_receive_completed_rings_only_where_the_cq_has_a_channel() {
        use crate::demux::FlowTable;
        let mut t = FlowTable::default();
        let sa = |s: &str| s.parse().unwrap();
        let i = t
            .insert(
                sa("10.0.0.1:1"),
                Some(sa("10.0.0.2:2")),
                std::ptr::null_mut(),
            )
            .unwrap();
        let bell = RingBell::new(3, 4).expect("a word map (needs CAP_BPF)");
        let mut word = bell::BellWord::map(bell.map.try_clone().unwrap()).unwrap();
        let f = t.get_mut(i).unwrap();
        f.bell = Some(bell);
        let mut rings = Vec::new();
        word.publish(Some(9));
        f.enqueued(i, &[v::RECV], &mut rings);
        assert_eq!(
            (rings.len(), f.wakes),
            (0, 1),
            "no channel: the frame wakes"
        );
        word.events(true);
        word.publish(Some(9));
        f.enqueued(i, &[v::RECV_SOLICITED, v::NONE], &mut rings);
        let want = crate::demux::Ring {
            flow: i,
            dev: 3,
            qpn: 4,
            verdict: v::RECV_SOLICITED,
        };
        assert_eq!((rings, f.wakes), (vec![want], 2), "a channel: it rings");
    }

    #[test]
    fn a_frame_too_short_to_say_wakes() {
        let (w, a) = (AtomicU64::new(bell::word(Some(1))), AtomicU64::new(0));
        for len in [0, 10, 14, 15, 40] {
            assert_eq!(verdict(&vec![0x45; len], &w, &a), v::NONE);
        }
    }
}
