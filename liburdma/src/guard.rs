//! Keeps Rust panics from unwinding into libibverbs or the application.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; if it panics, logs that and returns `on_panic` instead.
///
/// Every `extern "C"` function of the provider runs its body through this,
/// with the failure value its caller expects (an errno, NULL, ...).
pub(crate) fn catch<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            crate::log::error(format_args!(
                "internal error (panic) caught at the C boundary"
            ));
            on_panic
        }
    }
}

/// Sets the calling thread's `errno`, for verbs that report failure as NULL.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location always returns the valid thread-local errno.
    unsafe { *libc::__errno_location() = e };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_becomes_the_failure_value() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let v = catch(-1, || -> i32 { panic!("boom") });
        std::panic::set_hook(prev);
        assert_eq!(v, -1);
    }

    #[test]
    fn value_passes_through() {
        assert_eq!(catch(-1, || 7), 7);
    }

    #[test]
    fn errno_round_trips() {
        set_errno(libc::EOPNOTSUPP);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
    }
}
