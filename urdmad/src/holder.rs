//! Which process holds an mbuf of urdmad's pool, so that urdmad can take back the mbufs of
//! a process that was killed.
//!
//! A process takes mbufs from its alloc ring to send and from its flow rings to receive, and
//! gives them back when it is done (`crate::lending`). Killed in between, it never does:
//! nothing else knows the mbuf is no longer used, and the pool is one mbuf smaller for good.
//! So each mbuf carries, in its private area, the id of the process that holds it (0: urdmad
//! or nobody). Only urdmad sets and clears marks:
//!
//! - it marks an mbuf with a process's id when it puts it on the process's alloc ring or on
//!   one of its flows' rings;
//! - it clears the mark when it takes the mbuf back, off the process's free ring or TX ring;
//! - once a process is gone and its rings are emptied, it frees every mbuf of the pool still
//!   marked with the process's id ([`reclaim`]).
//!
//! So an mbuf is marked for as long as a process could hold it, and a kill at any moment
//! neither loses one nor frees one twice. The marks live in the pool's private area
//! ([`PRIV_SIZE`], zeroed when the pool is made); an mbuf of a pool without one
//! (`priv_size` 0) is neither marked nor reclaimed.

use dpdk_sys as sys;
use std::sync::atomic::{AtomicU32, Ordering};

/// The private area urdmad's pool gives each mbuf: room for the mark, aligned as DPDK wants
/// (`RTE_MBUF_PRIV_ALIGN`).
pub const PRIV_SIZE: u16 = 8;

/// The mark of `m`, if its pool has room for one.
///
/// # Safety
/// `m` is a valid mbuf.
unsafe fn mark_of<'a>(m: *mut sys::rte_mbuf) -> Option<&'a AtomicU32> {
    if (*m).priv_size < 4 {
        return None;
    }
    // The private area follows the mbuf header; the header is cache-line aligned, so the
    // area is aligned for a u32.
    let p = (m as *mut u8).add(std::mem::size_of::<sys::rte_mbuf>()) as *const AtomicU32;
    Some(&*p)
}

/// Marks `m` as held by process `client` (0: by nobody).
///
/// # Safety
/// `m` is a valid mbuf that the caller holds.
pub unsafe fn mark(m: *mut sys::rte_mbuf, client: u32) {
    if let Some(a) = mark_of(m) {
        a.store(client, Ordering::Relaxed);
    }
}

/// The process that holds `m` (0: none marked).
///
/// # Safety
/// `m` is a valid mbuf.
pub unsafe fn holder(m: *mut sys::rte_mbuf) -> u32 {
    mark_of(m).map_or(0, |a| a.load(Ordering::Relaxed))
}

/// Clears the mark of `m`, then gives it back to its pool.
///
/// # Safety
/// `m` is a valid mbuf that the caller holds and no longer uses.
pub unsafe fn free(m: *mut sys::rte_mbuf) {
    mark(m, 0);
    sys::rte_pktmbuf_free(m);
}

/// Frees every mbuf of `pool` that process `client` (gone, its rings emptied) still held;
/// returns how many.
///
/// # Safety
/// `client` is not 0, no process of that id runs any more, and nothing but that process
/// could hold an mbuf marked with it (its rings are freed).
pub unsafe fn reclaim(pool: *mut sys::rte_mempool, client: u32) -> u32 {
    struct Sweep {
        client: u32,
        freed: u32,
    }
    unsafe extern "C" fn visit(
        _: *mut sys::rte_mempool,
        arg: *mut std::ffi::c_void,
        obj: *mut std::ffi::c_void,
        _: u32,
    ) {
        // SAFETY: arg is the Sweep below; every object of an mbuf pool is an mbuf.
        let s = &mut *(arg as *mut Sweep);
        let m = obj as *mut sys::rte_mbuf;
        if holder(m) == s.client {
            free(m);
            s.freed += 1;
        }
    }
    let mut s = Sweep { client, freed: 0 };
    sys::rte_mempool_obj_iter(pool, Some(visit), (&mut s as *mut Sweep).cast());
    s.freed
}
