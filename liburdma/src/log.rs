//! Diagnostics, silent unless the environment asks for them.
//!
//! A provider runs inside someone else's process: it must not write to the
//! application's stderr by default, nor install a logger of its own. Two
//! ways ask:
//! - `URDMA_LOG=error|info|debug` (read once): those lines to stderr;
//! - otherwise rdma-core's own, as its providers honour them:
//!   `VERBS_LOG_LEVEL` (1 error, 3 info, 4 debug) and `VERBS_LOG_FILE`,
//!   which libibverbs reads; the lines go through its `__verbs_log`.
//!
//! One line is written whatever the environment: that the process cannot
//! use urdma at all ([`fatal`]), which an application would otherwise only
//! see as an errno.

use std::ffi::CString;
use std::fmt::Arguments;
use std::sync::OnceLock;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Level {
    Off,
    Error,
    Info,
    Debug,
}

/// Parses the value of `URDMA_LOG`; anything unknown means off.
pub(crate) fn parse_level(v: Option<&str>) -> Level {
    match v.map(str::trim) {
        Some("error") => Level::Error,
        Some("info") => Level::Info,
        Some("debug") | Some("trace") | Some("1") => Level::Debug,
        _ => Level::Off,
    }
}

/// `URDMA_LOG`'s level; None when it is not set (rdma-core's variables decide).
fn own_level() -> Option<Level> {
    static LEVEL: OnceLock<Option<Level>> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        std::env::var("URDMA_LOG")
            .ok()
            .map(|v| parse_level(Some(&v)))
    })
}

/// rdma-core's `VERBS_LOG_*` level of ours.
pub(crate) fn verbs_level(at: Level) -> u32 {
    match at {
        Level::Off => rdma_core_sys::VERBS_LOG_LEVEL_NONE,
        Level::Error => rdma_core_sys::VERBS_LOG_ERR,
        Level::Info => rdma_core_sys::VERBS_LOG_INFO,
        Level::Debug => rdma_core_sys::VERBS_LOG_DEBUG,
    }
}

fn emit(at: Level, args: Arguments<'_>) {
    match own_level() {
        Some(l) => {
            if at != Level::Off && l >= at {
                write_line(&mut std::io::stderr(), args);
            }
        }
        None => verbs_log(at, args),
    }
}

/// One line through libibverbs, which writes it if `VERBS_LOG_LEVEL` asks
/// for `at` (to `VERBS_LOG_FILE`, or stderr).
fn verbs_log(at: Level, args: Arguments<'_>) {
    // Not even formatted when libibverbs would drop it: the connection paths log at debug.
    if !verbs_passes(at, verbs_level_set()) {
        return;
    }
    let line = format!("liburdma[{}]: {args}\n", std::process::id());
    let Ok(line) = CString::new(line) else { return };
    // SAFETY: libibverbs' logger (IBVERBS_PRIVATE_34): a printf format of
    // one %s and a C string; it does not look at the context.
    unsafe {
        rdma_core_sys::__verbs_log(
            std::ptr::null_mut(),
            verbs_level(at),
            c"%s".as_ptr(),
            line.as_ptr(),
        )
    };
}

/// libibverbs' level from `VERBS_LOG_LEVEL`: `strtol`'s number kept in a `uint32_t`, 0
/// (nothing) when unset.
fn verbs_threshold(v: Option<&str>) -> u32 {
    v.and_then(parse_c_long).map_or(0, |l| l as u32)
}

/// Whether libibverbs' `__verbs_log` passes a line of ours at `at`. Level 0 would pass its
/// check even when it has no log file.
fn verbs_passes(at: Level, threshold: u32) -> bool {
    at != Level::Off && verbs_level(at) <= threshold
}

/// Writes one log line to `out` in a single write: stderr has no buffer, and `eprintln!`
/// writes each formatted piece by itself, so the application's own lines could land in the
/// middle of ours. A failed write is dropped (`eprintln!` would panic, in the application's
/// call).
fn write_line(out: &mut impl std::io::Write, args: Arguments<'_>) {
    let line = format!("liburdma[{}]: {args}\n", std::process::id());
    let _ = out.write_all(line.as_bytes());
}

/// A failure that leaves the process without urdma for good: logged as an
/// error and, when no logging was asked for, still said once on stderr.
pub(crate) fn fatal(args: Arguments<'_>) {
    let asked = own_level().is_some_and(|l| l >= Level::Error) || verbs_asked();
    if asked {
        error(args);
    } else {
        write_line(&mut std::io::stderr(), args);
    }
}

/// Whether `VERBS_LOG_LEVEL` asks for errors (libibverbs then writes them).
fn verbs_asked() -> bool {
    verbs_passes(Level::Error, verbs_level_set())
}

/// `VERBS_LOG_LEVEL` as libibverbs reads it (once).
fn verbs_level_set() -> u32 {
    static SET: OnceLock<u32> = OnceLock::new();
    *SET.get_or_init(|| verbs_threshold(std::env::var("VERBS_LOG_LEVEL").ok().as_deref()))
}

/// The number at the start of `v` as C's `strtol(v, NULL, 0)` reads it (decimal, 0x hex,
/// 0 octal); None when there is none.
fn parse_c_long(v: &str) -> Option<i64> {
    let v = v.trim_start();
    let (neg, v) = match v.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, v.strip_prefix('+').unwrap_or(v)),
    };
    let (radix, digits) = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        (16, h)
    } else if v.len() > 1 && v.starts_with('0') {
        (8, &v[1..])
    } else {
        (10, v)
    };
    let end = digits
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(digits.len());
    let n = i64::from_str_radix(&digits[..end], radix).ok()?;
    Some(if neg { -n } else { n })
}

pub(crate) fn error(args: Arguments<'_>) {
    emit(Level::Error, args);
}

pub(crate) fn info(args: Arguments<'_>) {
    emit(Level::Info, args);
}

pub(crate) fn debug(args: Arguments<'_>) {
    emit(Level::Debug, args);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_unknown_is_off() {
        assert_eq!(parse_level(None), Level::Off);
        assert_eq!(parse_level(Some("")), Level::Off);
        assert_eq!(parse_level(Some("verbose")), Level::Off);
    }

    #[test]
    fn a_line_is_one_write_and_a_failed_write_is_dropped() {
        /// Records each write; fails all after the first `ok`.
        struct Writes {
            seen: Vec<Vec<u8>>,
            ok: usize,
        }
        impl std::io::Write for Writes {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                if self.seen.len() == self.ok {
                    return Err(std::io::ErrorKind::BrokenPipe.into());
                }
                self.seen.push(b.to_vec());
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut w = Writes {
            seen: Vec::new(),
            ok: 1,
        };
        write_line(&mut w, format_args!("QP {}/{}: {:?}", 1, 2, "x"));
        let want = format!("liburdma[{}]: QP 1/2: \"x\"\n", std::process::id());
        assert_eq!(w.seen, vec![want.into_bytes()]);
        write_line(&mut w, format_args!("lost"));
        assert_eq!(w.seen.len(), 1);
    }

    #[test]
    fn lines_libibverbs_would_drop_are_not_made() {
        assert_eq!(verbs_threshold(None), 0);
        assert_eq!(verbs_threshold(Some("3")), 3);
        assert_eq!(verbs_threshold(Some("-1")), u32::MAX);
        assert!(!verbs_passes(Level::Error, verbs_threshold(None)));
        assert!(!verbs_passes(Level::Debug, 3));
        assert!(verbs_passes(Level::Info, 3));
        assert!(verbs_passes(Level::Debug, u32::MAX));
        assert!(!verbs_passes(Level::Off, u32::MAX));
    }

    #[test]
    fn verbs_log_level_is_read_as_strtol_does() {
        assert_eq!(parse_c_long("4"), Some(4));
        assert_eq!(parse_c_long(" 0x3"), Some(3));
        assert_eq!(parse_c_long("010"), Some(8));
        assert_eq!(parse_c_long("2abc"), Some(2));
        assert_eq!(parse_c_long("-1"), Some(-1));
        assert_eq!(parse_c_long("abc"), None);
        assert_eq!(verbs_level(Level::Error), 1);
        assert_eq!(verbs_level(Level::Debug), 4);
    }

    #[test]
    fn known_levels() {
        assert_eq!(parse_level(Some("error")), Level::Error);
        assert_eq!(parse_level(Some("info")), Level::Info);
        assert_eq!(parse_level(Some("debug\n")), Level::Debug);
    }
}
