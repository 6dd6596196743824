//! The process exits while connections still finish their close.
//!
//! A connection closing gracefully ([`crate::engine::Engine::closing`]: disconnected,
//! or its QP destroyed meanwhile) lives in this process: were it to die with it, a peer
//! whose last message's acknowledgement was lost would retransmit that message to nobody
//! and fail it with `IBV_WC_RETRY_EXC_ERR` once it gave up, seconds later, although the
//! message had arrived (perftest's server and tests/e2e/verify.c's saw exactly that on a
//! lossy link, their clients having disconnected and exited right after their last
//! exchange). The kernel keeps a closed TCP socket, and with it siw's connection, until
//! its FIN exchange ends; here `exit()` waits for the helper to end them, at most
//! [`LINGER_LIMIT`] and a little. A connection still open at exit is urdmad's to abort.

use std::sync::atomic::{AtomicBool, Ordering};
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

/// Whether `exit()` is waiting: only then do ended closes signal [`super::Runtime::closes`].
pub(super) static WAITING: AtomicBool = AtomicBool::new(false);

/// Makes `exit()` wait for closing connections: called once the helper runs.
pub(super) fn wait_for_closes_at_exit() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a function of this library that takes no arguments and
        // catches its own panics; glibc runs it at `exit()`, or when the library is
        // unloaded first.
        if unsafe { libc::atexit(finish_closes) } != 0 {
            log::error(format_args!(
                "atexit: connections still closing at exit will be left to urdmad"
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
        if !g.engine.closing() {
            return;
        }
        WAITING.store(true, Ordering::SeqCst);
        // The helper takes the connections over at once, as when the application blocks.
        g.app_going_to_sleep();
        // Woken by the helper each time closes end (`Shared::deliver_notices`).
        while g.engine.closing() {
            let left = until.saturating_duration_since(now());
            if left.is_zero() {
                log::info(format_args!(
                    "exit: connections still closing after {LINGER_LIMIT:?} are left to urdmad"
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
