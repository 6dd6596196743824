//! urdmad logs through `tracing`; DPDK's own log lines are routed into it as well, so that
//! everything has one format and one level filter.

use dpdk_sys as sys;
use std::os::raw::{c_char, c_int, c_void};

/// glibc's `cookie_io_functions_t` (not in the libc crate).
#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> isize>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, usize) -> isize>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, funcs: CookieIo) -> *mut libc::FILE;
}
use tracing_subscriber::filter::ParseError;
use tracing_subscriber::EnvFilter;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("bad log level {level:?}: {error}")]
    Level { level: String, error: ParseError },
    /// Another subscriber is installed already.
    #[error("cannot install logger: {error}")]
    Install {
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Installs the subscriber. `level` is `error`..`trace` or any `tracing` filter directive.
pub fn init(level: &str) -> Result<(), LoggingError> {
    let filter = EnvFilter::try_new(level).map_err(|error| LoggingError::Level {
        level: level.to_string(),
        error,
    })?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init()
        .map_err(|error| LoggingError::Install { error })
}

unsafe extern "C" fn write_dpdk_log(
    _cookie: *mut c_void,
    buf: *const c_char,
    size: usize,
) -> isize {
    let text = if buf.is_null() {
        String::new()
    } else {
        String::from_utf8_lossy(std::slice::from_raw_parts(buf as *const u8, size)).into_owned()
    };
    let _ = std::panic::catch_unwind(|| {
        let level = sys::rte_log_cur_msg_loglevel() as u32;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match level {
                0..=sys::RTE_LOG_ERR => tracing::error!(target: "dpdk", "{line}"),
                sys::RTE_LOG_WARNING => tracing::warn!(target: "dpdk", "{line}"),
                sys::RTE_LOG_NOTICE | sys::RTE_LOG_INFO => {
                    tracing::debug!(target: "dpdk", "{line}")
                }
                _ => tracing::trace!(target: "dpdk", "{line}"),
            }
        }
    });
    size as isize
}

/// Sends DPDK's log stream through `tracing` (DPDK's notices become debug events).
pub fn route_dpdk_logs() {
    let funcs = CookieIo {
        read: None,
        write: Some(write_dpdk_log),
        seek: None,
        close: None,
    };
    // SAFETY: the stream lives for the whole process; DPDK only writes to it.
    unsafe {
        let stream = fopencookie(std::ptr::null_mut(), c"w".as_ptr(), funcs);
        if !stream.is_null() {
            libc::setvbuf(stream, std::ptr::null_mut(), libc::_IOLBF, 0);
            sys::rte_openlog_stream(stream as *mut sys::FILE);
        }
    }
}

/// DPDK's log level matching ours, so DPDK does not format what would be dropped.
pub fn dpdk_level_arg(level: &str) -> String {
    let l = match level {
        "error" => sys::RTE_LOG_ERR,
        "warn" | "info" => sys::RTE_LOG_WARNING,
        "debug" => sys::RTE_LOG_INFO,
        "trace" => sys::RTE_LOG_DEBUG,
        _ => sys::RTE_LOG_WARNING,
    };
    format!("--log-level={l}")
}
