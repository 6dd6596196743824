//! fork() in a process that uses the provider.
//!
//! A child gets a copy of the provider's state but only the thread that
//! forked: had the helper (or another application thread) held the state's
//! lock at that moment, the child's copy would stay locked for good. So the
//! lock is taken before the fork and let go after it on both sides, and in
//! the child, while it is held, the copy of the parent's attachment is let
//! go of ([`crate::process::Shared::forked`]) before fork() returns there.
//!
//! `posix_spawn`, `system` and `vfork` run no fork handlers and need none:
//! the child runs nothing of the provider's before it executes a program.

use std::cell::RefCell;
use std::sync::MutexGuard;

use crate::process::{self, Shared};

thread_local! {
    /// The lock, from the fork handler before fork() to the one after it, on the thread
    /// that forks (the only thread the child has).
    static HELD: RefCell<Option<MutexGuard<'static, Shared>>> = const { RefCell::new(None) };
}

/// Installs the fork handlers, once per process (when the provider's state is made).
pub fn watch() {
    // SAFETY: three functions that stay loaded (libibverbs never unloads a provider).
    let rc = unsafe { libc::pthread_atfork(Some(before), Some(in_parent), Some(in_child)) };
    if rc != 0 {
        crate::log::error(format_args!(
            "pthread_atfork: {}: a child forked while the provider is busy may hang in a verb",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
}

extern "C" fn before() {
    crate::guard::catch((), || {
        let g = process::lock();
        HELD.with(|h| *h.borrow_mut() = Some(g));
    });
}

extern "C" fn in_parent() {
    crate::guard::catch((), || {
        crate::socket_flow::forked_parent();
        HELD.with(|h| h.borrow_mut().take());
    });
}

extern "C" fn in_child() {
    crate::guard::catch((), || {
        HELD.with(|h| {
            if let Some(mut g) = h.borrow_mut().take() {
                g.forked();
            }
        });
    });
}
