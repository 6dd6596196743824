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
//!   process's (urdmad's `holder`), and from which the process takes what it sends;
//! - the *free* ring, on which the process puts every mbuf it is done with (received
//!   frames, mbufs it took and did not use), still marked; urdmad clears their marks and
//!   frees them into the pool.
//!
//! On a ring with one producer and one consumer, each side moves only its own head and
//! tail, and reads only what the other side published: a side killed half-way leaves
//! nothing for the other to wait on. From the moment urdmad lends an mbuf until it takes it
//! back (off the free ring or a TX ring), the mbuf carries the process's mark, so an mbuf a
//! killed process held at any instant is freed by urdmad (`holder::reclaim`), and no kill
//! between two steps can lose one or free one twice.
//!
//! [`Borrower`] is the process's side, urdmad's `lending::Lender` its own. Both rings are created and freed
//! by urdmad; the process finds them by name.

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
        // The ring has a slot for every mbuf of the pool (urdmad's `Lender::new`), so it takes them
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
