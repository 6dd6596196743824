//! The direct path's filters, used again once the socket they served is gone.
//!
//! Loading a connection's filter ([`crate::flowfilter`]) runs the kernel's verifier: 3 ms of
//! CPU per load under emulation, on both ends of every connection, spent by the socket
//! keeper's threads on the CPUs that the connections being set up need. A filter stays on
//! its socket until the socket is destroyed, and while any process still holds that socket
//! the filter must admit its connection's frames and nothing else. So a filter is used again
//! only when its socket has left the kernel's list of packet sockets (sock_diag: its last
//! descriptor closed, wherever it was), and after one RCU grace period more, by when no
//! frame that the socket's receive path had begun to take can still be inside the filter.
//! Only then is it renewed (admitting nothing, with a new word) and aimed at another
//! connection ([`crate::flowfilter::FlowFilter::renew`]).
//!
//! urdmad's thread only hands filters in ([`FilterPool::retire`], which never waits); the
//! keeper's threads take them ([`FilterPool::take`]), and do the checks, which wait. The
//! checks come in as functions, so that the policy is tested here without a kernel. At
//! start, a thread of its own loads a stock of filters ([`FilterPool::stock`]), so that a
//! burst of connections loads none before the first ones come back.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};

/// Most filters kept waiting for their sockets to go. One that a newer one pushes out is
/// dropped: the kernel frees it with its socket. Each holds five descriptors in urdmad.
pub const MAX_WAITING: usize = 64;

pub struct FilterPool<F> {
    retired: Sender<(u64, F)>,
    state: Mutex<State<F>>,
    /// Filters freed for use again, since urdmad started.
    reused: AtomicU64,
}

struct State<F> {
    retired: Receiver<(u64, F)>,
    /// By the cookie of the socket each was on, oldest first.
    waiting: VecDeque<(u64, F)>,
    /// Off their sockets for good, the grace period past.
    free: Vec<F>,
}

impl<F> Default for FilterPool<F> {
    fn default() -> Self {
        let (tx, rx) = channel();
        FilterPool {
            retired: tx,
            state: Mutex::new(State {
                retired: rx,
                waiting: VecDeque::new(),
                free: Vec::new(),
            }),
            reused: AtomicU64::new(0),
        }
    }
}

impl<F> FilterPool<F> {
    /// `filter` is on the socket whose cookie is `cookie`, which urdmad no longer uses.
    pub fn retire(&self, cookie: u64, filter: F) {
        // The receiver lives as long as the pool: this cannot fail.
        let _ = self.retired.send((cookie, filter));
    }

    /// A filter whose socket is gone, if one is. `live` lists the cookies of the packet
    /// sockets that exist; `grace` waits for an RCU grace period. Either failing, none is
    /// used again this time.
    pub fn take(
        &self,
        live: impl FnOnce() -> io::Result<HashSet<u64>>,
        grace: impl FnOnce() -> io::Result<()>,
    ) -> Option<F> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = s.free.pop() {
            return Some(f);
        }
        while let Ok(r) = s.retired.try_recv() {
            s.waiting.push_back(r);
        }
        while s.waiting.len() > MAX_WAITING {
            s.waiting.pop_front();
        }
        if s.waiting.is_empty() {
            return None;
        }
        let live = live().ok()?;
        let (gone, waiting): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut s.waiting)
            .into_iter()
            .partition(|(cookie, _)| !live.contains(cookie));
        s.waiting = waiting;
        if gone.is_empty() || grace().is_err() {
            return None;
        }
        self.reused.fetch_add(gone.len() as u64, Ordering::Relaxed);
        s.free = gone.into_iter().map(|(_, f)| f).collect();
        s.free.pop()
    }

    /// Loads `count` filters with `load` into the free ones, on a thread of its own at the
    /// idle policy; the first that fails to load ends it.
    pub fn stock(
        self: &Arc<Self>,
        count: usize,
        load: impl Fn() -> io::Result<F> + Send + 'static,
    ) -> io::Result<()>
    where
        F: Send + 'static,
    {
        let pool = Arc::clone(self);
        std::thread::Builder::new()
            .name("urdmad-filters".into())
            .spawn(move || {
                crate::socket_keeper::idle_policy("the filters' stock");
                for _ in 0..count {
                    match load() {
                        Ok(f) => pool
                            .state
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .free
                            .push(f),
                        Err(e) => {
                            tracing::debug!("no more filters in stock: {e}");
                            break;
                        }
                    }
                }
            })
            .map(drop)
    }

    /// Filters freed for use again so far, their sockets gone (read without the lock).
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// (waiting for their sockets to go, free): for the status.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while let Ok(r) = s.retired.try_recv() {
            s.waiting.push_back(r);
        }
        (s.waiting.len(), s.free.len())
    }
}

/// Waits for an RCU grace period (`membarrier(MEMBARRIER_CMD_GLOBAL)`, which is
/// `synchronize_rcu` on a host of several CPUs).
pub fn grace_period() -> io::Result<()> {
    const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1;
    // SAFETY: a plain system call without pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn live(cookies: &[u64]) -> impl FnOnce() -> io::Result<HashSet<u64>> + '_ {
        move || Ok(cookies.iter().copied().collect())
    }

    fn fine() -> io::Result<()> {
        Ok(())
    }

    #[test]
    fn a_filter_is_used_again_only_once_its_socket_is_gone_and_a_grace_period_passed() {
        let pool = FilterPool::default();
        assert_eq!(pool.take(live(&[]), fine), None, "none retired");
        pool.retire(1, "a");
        pool.retire(2, "b");
        // Both sockets still exist (a process may hold one): neither is used.
        assert_eq!(pool.take(live(&[1, 2, 3]), fine), None);
        // a's is gone, but no grace period could be waited for: not yet.
        let fails = || Err(io::Error::from_raw_os_error(libc::EINVAL));
        assert_eq!(pool.take(live(&[2]), fails), None);
        assert_eq!(pool.counts(), (1, 0), "a's filter is dropped, b's waits");
        pool.retire(3, "c");
        let waited = Cell::new(0);
        let grace = || {
            waited.set(waited.get() + 1);
            Ok(())
        };
        assert_eq!(pool.take(live(&[2]), grace), Some("c"));
        assert_eq!(waited.get(), 1);
        // b's socket gone too: one grace period for all that are gone at once.
        pool.retire(4, "d");
        assert_eq!(pool.take(live(&[]), grace), Some("d"));
        assert_eq!(waited.get(), 2);
        assert_eq!(
            pool.take(|| panic!("free ones need no check"), fine),
            Some("b")
        );
        assert_eq!(pool.counts(), (0, 0));
        assert_eq!(pool.reused(), 3);
    }

    #[test]
    fn a_stock_is_taken_first_without_a_check() {
        let pool = Arc::new(FilterPool::default());
        let n = std::sync::atomic::AtomicU32::new(0);
        let n = Arc::new(n);
        let m = Arc::clone(&n);
        pool.stock(3, move || {
            let i = m.fetch_add(1, Ordering::Relaxed);
            if i < 2 {
                Ok(i)
            } else {
                Err(io::Error::from_raw_os_error(libc::EPERM))
            }
        })
        .unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while pool.counts().1 < 2 {
            assert!(std::time::Instant::now() < until, "not stocked within 10 s");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let never = || -> io::Result<HashSet<u64>> { panic!("no check for a stocked filter") };
        let mut got = [pool.take(never, fine), pool.take(never, fine)];
        got.sort();
        assert_eq!(got, [Some(0), Some(1)]);
        assert_eq!(pool.take(live(&[]), fine), None);
        assert_eq!(n.load(Ordering::Relaxed), 3, "stopped at the first failure");
    }

    #[test]
    fn a_failed_list_uses_none_again_and_loses_none() {
        let pool = FilterPool::default();
        pool.retire(1, 10);
        let fails = || Err(io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(pool.take(fails, fine), None);
        assert_eq!(pool.take(live(&[]), fine), Some(10));
    }

    #[test]
    fn at_most_max_waiting_wait_the_oldest_dropped() {
        let pool = FilterPool::default();
        for i in 0..MAX_WAITING as u64 + 5 {
            pool.retire(i, i);
        }
        let all: Vec<u64> = (0..MAX_WAITING as u64 + 5).collect();
        assert_eq!(pool.take(live(&all), fine), None);
        assert_eq!(pool.counts(), (MAX_WAITING, 0));
        assert_eq!(pool.take(live(&[]), fine), Some(MAX_WAITING as u64 + 4));
    }

    #[test]
    fn retiring_never_waits_for_a_thread_that_holds_the_pool() {
        let pool = FilterPool::default();
        let held = pool.state.lock().unwrap();
        pool.retire(1, 1);
        drop(held);
        assert_eq!(pool.take(live(&[]), fine), Some(1));
    }

    /// The kernel's grace period, as urdmad waits for it (needs nothing special).
    #[test]
    fn a_grace_period_can_be_waited_for() {
        grace_period().unwrap();
    }
}
