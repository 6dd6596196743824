//! The words a process shares with urdma.ko's bell on its direct connections: one per
//! connection that says which frame completes a receive ([`BellWord`]), and one for the
//! process that says whether its threads are in calls that read the sockets ([`Hush`]).
//!
//! urdmad's filter on the connection's socket (urdmad's `flowfilter`) classifies each frame
//! it admits, and the kernel's bell fires the receive CQ's completion event, from the
//! softirq, for a frame that completes a receive (docs/kernel-abi.md, "The bell").
//! Whether a frame does depends on what the process has received so far: only the last
//! segment of a Send or an Immediate Data whose PSN is the next one in order, with a
//! receive posted for it, completes one at once. The process says which PSN that is in
//! this word, an eBPF array of one entry that urdmad passes with the socket and the process
//! maps; the filter reads it for every frame.
//!
//! Only `std` and `libc`: the provider maps it, urdmad's filter reads its layout.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The map's value size: the word, then the [`ACKS_WAIT`] word at [`ACKS_AT`].
pub const WORD_SIZE: u32 = 16;
/// Where the second word is, in bytes from the first.
pub const ACKS_AT: usize = 8;
/// The second word when an ACK that carries nothing else can wait, unread, for whatever wakes
/// the process next (`trp::Connection::acks_can_wait`): the filter tells the bell to wake
/// nobody for one. 0 otherwise.
pub const ACKS_WAIT: u64 = 1;
/// Set in the word when its low 32 bits are a PSN whose arrival completes a receive.
pub const OPEN: u64 = 1 << 32;
/// Set with [`OPEN`] when the receive CQ has a completion channel, so that its event may be
/// armed: only then does urdmad ask urdma.ko to ring for a frame it puts on a ring (a system
/// call per message, which an application that polls its CQ would pay for nothing). The
/// socket filter ignores it.
pub const EVENTS: u64 = 1 << 33;

/// The word for `next`: the PSN whose arrival completes a receive at once, or none.
pub fn word(next: Option<u32>) -> u64 {
    next.map_or(0, |psn| OPEN | u64::from(psn))
}

/// Maps the first page of the array `map`, whose first value is a word: the address of the
/// word and the mapping's length, for `munmap`.
pub fn map_word(map: &OwnedFd) -> io::Result<(*const AtomicU64, usize)> {
    // SAFETY: sysconf has no preconditions.
    let len = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096);
    // SAFETY: a fresh shared mapping of the map's values, checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            map.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok((p.cast::<AtomicU64>(), len))
}

/// The kernel's id of the eBPF map `map` (`BPF_OBJ_GET_INFO_BY_FD`).
pub fn map_id(map: &OwnedFd) -> io::Result<u32> {
    /// `struct bpf_map_info`'s first two members; the kernel fills no more than asked.
    #[repr(C)]
    #[derive(Default)]
    struct Head {
        kind: u32,
        id: u32,
    }
    /// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let mut head = Head::default();
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(map.as_raw_fd()).map_err(|_| io::ErrorKind::InvalidInput)?,
        info_len: std::mem::size_of::<Head>() as u32,
        info: &mut head as *mut Head as u64,
    };
    // SAFETY: attr and the buffer it points to are valid for the call; the kernel writes at
    // most info_len bytes there.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(head.id)
}

/// A connection's word, mapped.
pub struct BellWord {
    word: *const AtomicU64,
    len: usize,
    /// The last values written: most rounds change nothing.
    last: u64,
    last_acks: u64,
    /// [`EVENTS`] or 0, with every PSN published.
    events: u64,
    _map: OwnedFd,
}

// SAFETY: the mapping is the word's alone and lives as long as the value; stores to it are
// atomic.
unsafe impl Send for BellWord {}

impl BellWord {
    /// Maps the array `map` (`BPF_F_MMAPABLE`, one entry of [`WORD_SIZE`] bytes). Starts
    /// closed: nothing rings until the process publishes.
    pub fn map(map: OwnedFd) -> io::Result<BellWord> {
        let (word, len) = map_word(&map)?;
        let b = BellWord {
            word,
            len,
            last: u64::MAX,
            last_acks: 0,
            events: 0,
            _map: map,
        };
        b.store(0);
        b.store_acks(0);
        Ok(b)
    }

    /// The word again as [`BellWord::map`] leaves it, for the next connection of a parked
    /// socket, whose word urdmad has cleared: closed, nothing published.
    pub fn reset(&mut self) {
        self.last = u64::MAX;
        self.last_acks = 0;
        self.events = 0;
        self.store(0);
        self.store_acks(0);
    }

    /// The kernel's id of the word's map: a parked socket's word serves its next connection
    /// when urdmad passes the same map again, without a new mapping.
    pub fn map_id(&self) -> io::Result<u32> {
        map_id(&self._map)
    }

    fn store(&self, w: u64) {
        // SAFETY: the mapping holds the 8-byte, 8-aligned word at its start while self lives.
        unsafe { &*self.word }.store(w, Ordering::Release);
    }

    fn store_acks(&self, w: u64) {
        // SAFETY: the mapping holds WORD_SIZE bytes at its start while self lives; the
        // second word is 8-aligned there.
        unsafe { &*self.word.add(ACKS_AT / 8) }.store(w, Ordering::Release);
    }

    /// Says whether an ACK that carries nothing else can wait unread for whatever wakes the
    /// process next. Say `false` before sending what needs an ACK to be read at once (a
    /// signaled request): an ACK that comes before the word changes wakes nobody.
    pub fn acks_can_wait(&mut self, yes: bool) {
        let w = if yes { ACKS_WAIT } else { 0 };
        if w != self.last_acks {
            self.store_acks(w);
            self.last_acks = w;
        }
    }

    /// Says whether the connection's receive CQ has a completion channel ([`EVENTS`]), for
    /// the PSNs published from now on.
    pub fn events(&mut self, yes: bool) {
        self.events = if yes { EVENTS } else { 0 };
    }

    /// Says which PSN's arrival completes a receive now (`None`: none does).
    pub fn publish(&mut self, next: Option<u32>) {
        let w = word(next);
        let w = if w == 0 { 0 } else { w | self.events };
        if w != self.last {
            self.store(w);
            self.last = w;
        }
    }
}

impl Drop for BellWord {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, not used after this.
        unsafe { libc::munmap(self.word as *mut libc::c_void, self.len) };
    }
}

/// The hush map's value size: the word, then the time by which the next call is due.
pub const HUSH_SIZE: u32 = 16;
/// Threads inside calls that read every socket (the count in the [`Hush`] word).
pub const HUSH_CALLS: u64 = 0xffff_ffff;
/// Set in the [`Hush`] word by urdma.ko for a frame it woke nobody for.
pub const HUSH_MISSED: u64 = 1 << 32;

/// The process's hush word (urdma-abi.h, `URDMA_HUSH_CALLS`): while a thread is inside a call
/// that reads every direct connection's socket before it returns, a frame that fires no
/// completion event wakes nobody (the helper thread would only take the CPU from the
/// thread that reads it), and urdma.ko marks it missed instead. The last thread out reads
/// the sockets once more if the mark is there. A thread that polls without pause also says
/// by when its next call is due ([`Hush::next_call_by`]): a frame that comes between its
/// calls wakes nobody either, unless no call has read it by then. One array of one entry for
/// the process, which urdmad creates and passes with the connections' sockets and urdma.ko
/// reads for each of their frames.
#[derive(Clone, Copy)]
pub struct Hush(&'static HushValue);

/// The map's value (urdma-abi.h, `struct urdma_hush`).
#[repr(C)]
pub struct HushValue {
    word: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds; 0: no call is due.
    until: AtomicU64,
}

impl Hush {
    /// Maps the array `map` for the rest of the process's life: a thread may be entering a
    /// call with this word when a newer one (after urdmad restarts) replaces it.
    pub fn map(map: OwnedFd) -> io::Result<Hush> {
        let (word, _) = map_word(&map)?;
        // SAFETY: the mapping stays (never unmapped; closing the map's descriptor leaves
        // it), holding the 16-byte, 8-aligned value at its start.
        Ok(Hush(unsafe { &*word.cast::<HushValue>() }))
    }

    /// A word of the process's own memory, which nobody else reads (tests).
    pub fn unshared() -> Hush {
        Hush(Box::leak(Box::new(HushValue {
            word: AtomicU64::new(0),
            until: AtomicU64::new(0),
        })))
    }

    /// A thread enters a call that reads every socket before it returns.
    pub fn enter(self) {
        self.0.word.fetch_add(1, Ordering::SeqCst);
    }

    /// A thread about to leave its call says by when (CLOCK_MONOTONIC nanoseconds) the
    /// process's next call is due, when it polls without pause; `None` when nothing says it
    /// will call again soon. Before [`Hush::leave`]: no frame falls between the two.
    pub fn next_call_by(self, ns: Option<u64>) {
        let v = ns.unwrap_or(0);
        if self.0.until.load(Ordering::Relaxed) != v {
            self.0.until.store(v, Ordering::SeqCst);
        }
    }

    /// A thread leaves such a call. True: it was the last one in and a frame was left to
    /// it since the last [`Hush::clear`]; it is counted in again, must read every socket
    /// (a round that begins with [`Hush::clear`]) and leave again.
    #[must_use]
    pub fn leave(self) -> bool {
        let v = self.0.word.fetch_sub(1, Ordering::SeqCst);
        if v & HUSH_CALLS == 1 && v & HUSH_MISSED != 0 {
            self.0.word.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Leaves a call without reading the sockets: the caller wakes another reader.
    pub fn abandon(self) {
        self.0.word.fetch_sub(1, Ordering::SeqCst);
    }

    /// The word, to keep where a pointer fits.
    pub fn into_raw(self) -> *mut HushValue {
        (self.0 as *const HushValue).cast_mut()
    }

    /// The word kept by [`Hush::into_raw`].
    ///
    /// # Safety
    /// `p` came from [`Hush::into_raw`].
    pub unsafe fn from_raw(p: *mut HushValue) -> Hush {
        // SAFETY: the caller's promise: a word that is never unmapped.
        Hush(unsafe { &*p })
    }

    /// Before a round that reads every socket: the frames marked missed so far are in the
    /// sockets, and the round reads them.
    pub fn clear(self) {
        if self.0.word.load(Ordering::Relaxed) & HUSH_MISSED != 0 {
            self.0.word.fetch_and(!HUSH_MISSED, Ordering::SeqCst);
        }
    }

    /// What urdma.ko does for a frame that fires no event (tests): whether it hushed it.
    #[cfg(test)]
    fn frame(self) -> bool {
        self.frame_at(u64::MAX)
    }

    /// The same for a frame that comes at `now` (ns).
    #[cfg(test)]
    fn frame_at(self, now: u64) -> bool {
        self.0.hush_frame(now).is_some()
    }

    /// What urdma.ko's timer does at `now`, the time given for the next call (tests):
    /// whether it wakes the helper.
    #[cfg(test)]
    fn late_at(self, now: u64) -> bool {
        self.0.late(now)
    }
}

/// The furthest ahead a process's next call may be said to be due (urdma.ko's
/// `URDMA_HUSH_AHEAD_MAX_NS`): a time further off, the word being the process's own, is
/// taken for none, so that no value keeps a frame unread for long.
pub const HUSH_AHEAD_MAX_NS: u64 = 100_000_000;

/// Whether a next call is due at `until`, after `now` and not too far off.
fn ahead(until: u64, now: u64) -> bool {
    until > now && until - now <= HUSH_AHEAD_MAX_NS
}

impl HushValue {
    /// urdma.ko's rule for a frame that fires no event and comes at `now` (CLOCK_MONOTONIC
    /// ns), which urdmad follows for the frames it puts on the process's rings: whether it is
    /// left to a thread of the process, which then finds [`HUSH_MISSED`] and the frame.
    /// `Some(0)`: a thread is in a call; `Some(t)`: the next call is due by `t`, and if none
    /// has read the frame by then ([`HushValue::late`]) the helper must be woken.
    pub fn hush_frame(&self, now: u64) -> Option<u64> {
        let v = self.word.load(Ordering::SeqCst);
        let mut until = 0;
        if v & HUSH_CALLS == 0 {
            until = self.until.load(Ordering::SeqCst);
            if !ahead(until, now) {
                return None;
            }
        }
        // A lost race with the process wakes, as without a hush.
        self.word
            .compare_exchange(v, v | HUSH_MISSED, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        Some(until)
    }

    /// At `now`, the time given for the next call when a frame was hushed: whether no call
    /// has read it (the mark still there, no thread in a call, no later time given), so the
    /// helper must be woken.
    pub fn late(&self, now: u64) -> bool {
        let v = self.word.load(Ordering::SeqCst);
        v & HUSH_MISSED != 0
            && v & HUSH_CALLS == 0
            && !ahead(self.until.load(Ordering::SeqCst), now)
    }
}

/// A process's hush word as urdmad maps it, to follow urdma.ko's rule for the frames it puts
/// on the process's rings; unmapped when dropped.
pub struct HushMap {
    value: *const HushValue,
    len: usize,
    _map: OwnedFd,
}

// SAFETY: the mapping is this value's alone and lives as long as it; every access is atomic.
unsafe impl Send for HushMap {}

impl HushMap {
    /// Maps the array `map` ([`HUSH_SIZE`]-byte values).
    pub fn map(map: OwnedFd) -> io::Result<HushMap> {
        let (word, len) = map_word(&map)?;
        Ok(HushMap {
            value: word.cast::<HushValue>(),
            len,
            _map: map,
        })
    }

    /// The value.
    pub fn value(&self) -> &HushValue {
        // SAFETY: the mapping holds the 16-byte, 8-aligned value at its start while self
        // lives.
        unsafe { &*self.value }
    }
}

impl Drop for HushMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, not used after this.
        unsafe { libc::munmap(self.value as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_hushed_only_while_a_thread_is_in_a_call() {
        let h = Hush::unshared();
        assert!(!h.frame(), "nobody in a call: the helper is woken");
        h.enter();
        assert!(h.frame());
        assert!(h.leave(), "the last one out reads the sockets again");
        h.clear();
        assert!(!h.leave(), "and leaves after that round");
        assert!(!h.frame());
    }

    #[test]
    fn the_last_thread_out_reads_again_for_all() {
        let h = Hush::unshared();
        h.enter();
        h.enter();
        assert!(h.frame());
        assert!(!h.leave(), "another thread is still in a call");
        assert!(h.leave());
        h.clear();
        assert!(!h.leave());
    }

    #[test]
    fn a_round_after_the_frame_takes_it() {
        let h = Hush::unshared();
        h.enter();
        assert!(h.frame());
        h.clear();
        assert!(!h.leave(), "the call's own round read it");
    }

    #[test]
    fn a_frame_between_the_calls_of_a_steady_poller_is_left_to_the_next() {
        let h = Hush::unshared();
        h.enter();
        h.next_call_by(Some(1_000));
        assert!(!h.leave());
        assert!(h.frame_at(500), "before the next call is due");
        assert!(!h.late_at(999), "not yet: the call may still come");
        h.enter();
        h.clear();
        h.next_call_by(Some(2_000));
        assert!(!h.leave(), "the call's round read it");
        assert!(!h.late_at(2_000), "nothing left for the timer");
    }

    #[test]
    fn a_frame_no_call_came_for_wakes_the_helper_late() {
        let h = Hush::unshared();
        h.enter();
        h.next_call_by(Some(1_000));
        assert!(!h.leave());
        assert!(h.frame_at(999));
        assert!(h.late_at(1_000));
        assert!(
            !h.frame_at(1_000),
            "past the time given: the frame wakes at once"
        );
    }

    #[test]
    fn a_poller_that_stops_gives_no_time() {
        let h = Hush::unshared();
        h.enter();
        h.next_call_by(Some(1_000));
        assert!(!h.leave());
        h.enter();
        h.next_call_by(None);
        assert!(!h.leave());
        assert!(!h.frame_at(10), "nothing said a call comes");
    }

    #[test]
    fn a_time_given_too_far_ahead_is_taken_for_none() {
        let h = Hush::unshared();
        h.enter();
        h.next_call_by(Some(1_000 + HUSH_AHEAD_MAX_NS + 1));
        assert!(!h.leave());
        assert!(!h.frame_at(1_000), "the frame wakes at once");
        h.enter();
        h.next_call_by(Some(1_000 + HUSH_AHEAD_MAX_NS));
        assert!(!h.leave());
        assert!(h.frame_at(1_000));
    }

    #[test]
    fn a_psn_is_open_and_none_is_closed() {
        assert_eq!(word(None), 0);
        assert_eq!(word(Some(0)), OPEN);
        assert_eq!(word(Some(u32::MAX)), OPEN | 0xffff_ffff);
    }
}
