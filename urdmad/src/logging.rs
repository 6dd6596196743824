//! urdmad logs through `tracing`; DPDK's own log lines are routed into it as well, so that
//! everything has one format and one level filter.
//!
//! To a terminal, lines are coloured; to a file or pipe, plain; to the journal (systemd's
//! `JOURNAL_STREAM` names stderr), each line carries its priority as `<N>` and no time,
//! which journald adds itself.

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
use std::fmt;
use std::io::IsTerminal;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::ParseError;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
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
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let r = if stderr_is_journal() {
        fmt.with_ansi(false).event_format(JournalLine).try_init()
    } else {
        fmt.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
    r.map_err(|error| LoggingError::Install { error })
}

/// Whether stderr is the journal's stream: `JOURNAL_STREAM` (`DEV:INODE`) names it.
fn stderr_is_journal() -> bool {
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM")
        .ok()
        .and_then(|v| parse_journal_stream(&v))
    else {
        return false;
    };
    // SAFETY: fstat of a descriptor number into a zeroed stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { libc::fstat(2, &mut st) } == 0;
    ok && st.st_dev == dev && st.st_ino == ino
}

fn parse_journal_stream(v: &str) -> Option<(u64, u64)> {
    let (dev, ino) = v.trim().split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// The syslog priority of a level, as journald reads a `<N>` prefix.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// One journal line: `<N>` and the event's fields.
struct JournalLine;

impl<S, N> FormatEvent<S, N> for JournalLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(w, "<{}>", priority(event.metadata().level()))?;
        ctx.format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn journal_lines_carry_the_priority_and_nothing_else() {
        let out = Captured::default();
        let w = out.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(Level::DEBUG)
            .with_writer(move || w.clone())
            .with_ansi(false)
            .event_format(JournalLine)
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::error!("port {} down", 1);
            tracing::warn!(qp = 7, "slow");
            tracing::info!("up");
            tracing::debug!("detail");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "<3>port 1 down\n<4>slow qp=7\n<6>up\n<7>detail\n");
    }

    #[test]
    fn journal_stream_is_dev_and_inode() {
        assert_eq!(parse_journal_stream("8:12345"), Some((8, 12345)));
        assert_eq!(parse_journal_stream("8:x"), None);
        assert_eq!(parse_journal_stream(""), None);
    }
}
