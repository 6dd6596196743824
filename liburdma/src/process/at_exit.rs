//! The process exits while destroyed QPs' connections still finish their close.
//!
//! A lingering connection ([`crate::engine::Engine::lingering`]) lives in this process:
//! were it to die with it, a peer whose last message's acknowledgement was lost would
//! retransmit that message to nobody and fail it with `IBV_WC_RETRY_EXC_ERR` once it gave
//! up, seconds later, although the message had arrived (perftest's server saw exactly that
//! on a lossy link, its client having exited right after its last exchange). The kernel
//! keeps a closed TCP socket, and with it siw's connection, until its FIN exchange ends;
//! here `exit()` waits for the helper to end them, at most [`LINGER_LIMIT`] and a little.

use std::sync::{Once, TryLockError};
use std::time::Duration;

use super::{now, rt};
use crate::engine::LINGER_LIMIT;
use crate::log;

/// Beyond [`LINGER_LIMIT`]: the helper's round that gives the last connection up, and
/// its `CLOSE` to urdmad.
const SLACK: Duration = Duration::from_millis(100);

/// How often a thread that finds the lock held looks again: the lock is held for the
/// length of a call, but the thread in `exit()` may hold it itself, having been
/// interrupted by a signal whose handler exits.
const LOCK_RETRY: Duration = Duration::from_millis(1);

/// Makes `exit()` wait for lingering connections: called when the first one begins.
pub(super) fn wait_for_closes_at_exit() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a function of this library that takes no arguments and
        // catches its own panics; glibc runs it at `exit()`, or when the library is
        // unloaded first.
        if unsafe { libc::atexit(finish_closes) } != 0 {
            log::error(format_args!(
                "atexit: connections still closing at exit will be dropped"
            ));
        }
    });
}

extern "C" fn finish_closes() {
    let _ = std::panic::catch_unwind(|| {
        let until = now() + LINGER_LIMIT + SLACK;
        let mut g = loop {
            match rt().state.try_lock() {
                Ok(g) => break g,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock) if now() < until => std::thread::sleep(LOCK_RETRY),
                Err(TryLockError::WouldBlock) => return,
            }
        };
        // Woken by the helper each time connections end (`Shared::deliver_notices`).
        while g.engine.lingering() {
            let left = until.saturating_duration_since(now());
            if left.is_zero() {
                log::info(format_args!(
                    "exit: connections still closing after {LINGER_LIMIT:?} are dropped"
                ));
                return;
            }
            g = match rt().closes.wait_timeout(g, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    });
}
