//! How a process gets the mbufs it sends and gives back the ones it is done with, without
//! ever touching urdmad's pool.
//!
//! The pool's ring has many producers and many consumers. A put or a get on it first claims
//! slots (moves the ring's head), then copies, then publishes (moves its tail), and the
//! publish waits until every earlier claim has published. A process killed between claim
//! and publish therefore stops every later put and get for good, urdmad's included: a
//! `kill -9` at the wrong instruction hangs urdmad. (Killing a process that took and
//! returned mbufs in a loop found that moment within 42 kills; urdmad's tests kill 200.)
//!
//! So each process gets two rings of its own at `ATTACH`, each with one producer and one
//! consumer:
//!
//! - the *alloc* ring, which urdmad keeps filled with free mbufs, already marked as the
//!   process's ([`crate::holder`]), and from which the process takes what it sends;
//! - the *free* ring, on which the process puts every mbuf it is done with (received
//!   frames, mbufs it took and did not use), still marked; urdmad clears their marks and
//!   frees them into the pool.
//!
//! On a ring with one producer and one consumer, each side moves only its own head and
//! tail, and reads only what the other side published: a side killed half-way leaves
//! nothing for the other to wait on. From the moment urdmad lends an mbuf until it takes it
//! back (off the free ring or a TX ring), the mbuf carries the process's mark, so an mbuf a
//! killed process held at any instant is freed by [`crate::holder::reclaim`], and no kill
//! between two steps can lose one or free one twice.
//!
//! [`Borrower`] is the process's side, [`Lender`] urdmad's. Both rings are created and freed
//! by urdmad; the process finds them by name.

#[cfg(feature = "daemon")]
use crate::daemon::{ring_create, RingError};
use dpdk_sys as sys;
use std::ffi::c_void;

/// The process's side: its two rings (after EAL's initialisation).
///
/// Every operation assumes the process is the alloc ring's only consumer and the free ring's
/// only producer: a process that uses one `Borrower` from several threads serialises them.
#[derive(Clone, Copy)]
pub struct Borrower {
    alloc: *mut sys::rte_ring,
    free: *mut sys::rte_ring,
}

// SAFETY: the rings live in urdmad's shared memory while the process is attached; the
// caller serialises their use (above).
unsafe impl Send for Borrower {}

impl Borrower {
    /// The rings urdmad named `alloc` and `free` in its `ATTACH` reply.
    pub fn new(alloc: *mut sys::rte_ring, free: *mut sys::rte_ring) -> Borrower {
        Borrower { alloc, free }
    }

    /// A lent mbuf, empty and marked as this process's; `None` when urdmad has not refilled
    /// the ring yet (it does so on each pass of its loop).
    pub fn take(&self) -> Option<*mut sys::rte_mbuf> {
        let mut m = std::ptr::null_mut::<c_void>();
        // SAFETY: the process is the ring's only consumer.
        let rc = unsafe { sys::rte_ring_sc_dequeue(self.alloc, &mut m) };
        (rc == 0 && !m.is_null()).then_some(m as *mut sys::rte_mbuf)
    }

    /// Gives `mbufs` back to urdmad. They must be this process's (taken from the alloc ring
    /// or received on a flow's ring) and no longer used.
    pub fn give_back(&self, mbufs: &[*mut sys::rte_mbuf]) {
        if mbufs.is_empty() {
            return;
        }
        // The ring has a slot for every mbuf of the pool (`Lender::new`), so it takes them
        // all. If it did not, the rest would stay marked as this process's and come back to
        // the pool when the process ends.
        // SAFETY: the process is the ring's only producer.
        unsafe {
            sys::rte_ring_sp_enqueue_burst(
                self.free,
                mbufs.as_ptr() as *const *mut c_void,
                mbufs.len() as u32,
                std::ptr::null_mut(),
            )
        };
    }
}

/// How many mbufs a process may hold on its alloc ring. A pass of urdmad's loop sends at
/// most 32 frames of a process's TX ring, and refills the ring at each pass, so more would
/// only keep mbufs idle.
#[cfg(feature = "daemon")]
pub const LENT: u32 = 128;

/// urdmad's side: one process's two rings.
#[cfg(feature = "daemon")]
pub struct Lender {
    pub alloc_name: String,
    pub free_name: String,
    alloc: *mut sys::rte_ring,
    free: *mut sys::rte_ring,
    client: u32,
    /// The last refill found the pool too low: a sleep need not wait for the next one.
    starved: bool,
}

#[cfg(feature = "daemon")]
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
