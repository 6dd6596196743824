//! urdmad's side of lending mbufs to a process: the contract, and the process's side, are
//! `urdma_shared::lending`'s.

use crate::daemon::{ring_create, RingError};
use dpdk_sys as sys;
use std::ffi::c_void;

/// How many mbufs a process may hold on its alloc ring. A pass of urdmad's loop sends at
/// most 32 frames of a process's TX ring, and refills the ring at each pass, so more would
/// only keep mbufs idle.
pub const LENT: u32 = 128;

/// urdmad's side: one process's two rings.
pub struct Lender {
    pub alloc_name: String,
    pub free_name: String,
    alloc: *mut sys::rte_ring,
    free: *mut sys::rte_ring,
    client: u32,
    /// The last refill found the pool too low: a sleep need not wait for the next one.
    starved: bool,
}

impl Lender {
    /// Creates the rings of process `client`; the free ring has a slot for each of the
    /// `pool_size` mbufs, so that a process never finds it full.
    pub fn new(client: u32, pool_size: u32) -> Result<Lender, RingError> {
        let alloc_name = format!("urd_alloc_{client}");
        let free_name = format!("urd_free_{client}");
        let alloc = ring_create(&alloc_name, LENT, true)?;
        let free = match ring_create(&free_name, pool_size, true) {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: just created, unused.
                unsafe { sys::rte_ring_free(alloc) };
                return Err(e);
            }
        };
        Ok(Lender {
            alloc_name,
            free_name,
            alloc,
            free,
            client,
            starved: false,
        })
    }

    /// Mbufs on the alloc ring now.
    pub fn lent(&self) -> u32 {
        // SAFETY: the ring lives as long as self.
        unsafe { sys::rte_ring_count(self.alloc) }
    }

    /// Whether a quarter or more of the alloc ring is empty, which [`Lender::serve`] tops
    /// up.
    fn short(&self) -> bool {
        // SAFETY: the ring lives as long as self.
        unsafe { sys::rte_ring_free_count(self.alloc) >= LENT / 4 }
    }

    /// Whether the next [`Lender::serve`] would refill the alloc ring: it is short, and the
    /// last refill did not find the pool too low (then urdmad need not stay awake for it).
    pub fn wants_refill(&self) -> bool {
        self.short() && !self.starved
    }

    /// Frees what the process gave back, then tops its alloc ring up from `pool` when it is
    /// short; returns how many mbufs came back.
    ///
    /// # Safety
    /// `pool` is urdmad's pool, used by urdmad's thread only; urdmad is the free ring's only
    /// consumer and the alloc ring's only producer.
    pub unsafe fn serve(&mut self, pool: *mut sys::rte_mempool) -> usize {
        let mut m = [std::ptr::null_mut::<sys::rte_mbuf>(); LENT as usize];
        let mut back = 0;
        loop {
            let n = sys::rte_ring_sc_dequeue_burst(
                self.free,
                m.as_mut_ptr() as *mut *mut c_void,
                m.len() as u32,
                std::ptr::null_mut(),
            ) as usize;
            if n == 0 {
                break;
            }
            for &mb in &m[..n] {
                crate::holder::mark(mb, 0);
            }
            sys::rte_pktmbuf_free_bulk(m.as_mut_ptr(), n as u32);
            back += n;
            if n < m.len() {
                break;
            }
        }
        if !self.short() {
            self.starved = false;
            return back;
        }
        // All or nothing: the whole gap, or else a quarter of the ring.
        let gap = sys::rte_ring_free_count(self.alloc);
        let got = [gap, LENT / 4]
            .into_iter()
            .find(|&n| sys::rte_pktmbuf_alloc_bulk(pool, m.as_mut_ptr(), n) == 0);
        self.starved = got.is_none();
        if let Some(n) = got {
            for &mb in &m[..n as usize] {
                crate::holder::mark(mb, self.client);
            }
            // Fits: urdmad is the only producer, so the gap can only have grown.
            sys::rte_ring_sp_enqueue_bulk(
                self.alloc,
                m.as_ptr() as *const *mut c_void,
                n,
                std::ptr::null_mut(),
            );
        }
        back
    }

    /// Frees the mbufs on both rings, then the rings: the process detached, or is gone and
    /// no longer runs. An mbuf it was taking or giving back at its end is on neither ring
    /// (not published) and keeps its mark, so [`crate::holder::reclaim`] frees it later.
    ///
    /// # Safety
    /// The process no longer uses the rings.
    pub unsafe fn release(self) {
        crate::daemon::ring_drain_free(self.alloc);
        crate::daemon::ring_drain_free(self.free);
    }
}
