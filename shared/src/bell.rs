//! The word a process publishes for urdma.ko's bell on a direct connection.
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

/// The word's bytes (the map's value size).
pub const WORD_SIZE: u32 = 8;
/// Set in the word when its low 32 bits are a PSN whose arrival completes a receive.
pub const OPEN: u64 = 1 << 32;

/// The word for `next`: the PSN whose arrival completes a receive at once, or none.
pub fn word(next: Option<u32>) -> u64 {
    next.map_or(0, |psn| OPEN | u64::from(psn))
}

/// A connection's word, mapped.
pub struct BellWord {
    word: *const AtomicU64,
    len: usize,
    /// The last value written: most rounds change nothing.
    last: u64,
    _map: OwnedFd,
}

// SAFETY: the mapping is the word's alone and lives as long as the value; stores to it are
// atomic.
unsafe impl Send for BellWord {}

impl BellWord {
    /// Maps the array `map` (`BPF_F_MMAPABLE`, one entry of [`WORD_SIZE`] bytes). Starts
    /// closed: nothing rings until the process publishes.
    pub fn map(map: OwnedFd) -> io::Result<BellWord> {
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
        let b = BellWord {
            word: p.cast::<AtomicU64>(),
            len,
            last: u64::MAX,
            _map: map,
        };
        b.store(0);
        Ok(b)
    }

    fn store(&self, w: u64) {
        // SAFETY: the mapping holds the 8-byte, 8-aligned word at its start while self lives.
        unsafe { &*self.word }.store(w, Ordering::Release);
    }

    /// Says which PSN's arrival completes a receive now (`None`: none does).
    pub fn publish(&mut self, next: Option<u32>) {
        let w = word(next);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_psn_is_open_and_none_is_closed() {
        assert_eq!(word(None), 0);
        assert_eq!(word(Some(0)), OPEN);
        assert_eq!(word(Some(u32::MAX)), OPEN | 0xffff_ffff);
    }
}
