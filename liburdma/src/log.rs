//! Diagnostics, silent unless `URDMA_LOG` asks for them.
//!
//! A provider runs inside someone else's process: it must not write to the
//! application's stderr by default, nor install a logger of its own.
//! `URDMA_LOG=error|info|debug` (read once) selects what goes to stderr.

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

fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| parse_level(std::env::var("URDMA_LOG").ok().as_deref()))
}

fn emit(at: Level, args: Arguments<'_>) {
    if at != Level::Off && level() >= at {
        write_line(&mut std::io::stderr(), args);
    }
}

/// Writes one log line to `out` in a single write: stderr has no buffer, and `eprintln!`
/// writes each formatted piece by itself, so the application's own lines could land in the
/// middle of ours. A failed write is dropped (`eprintln!` would panic, in the application's
/// call).
fn write_line(out: &mut impl std::io::Write, args: Arguments<'_>) {
    let line = format!("liburdma[{}]: {args}\n", std::process::id());
    let _ = out.write_all(line.as_bytes());
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
    fn known_levels() {
        assert_eq!(parse_level(Some("error")), Level::Error);
        assert_eq!(parse_level(Some("info")), Level::Info);
        assert_eq!(parse_level(Some("debug\n")), Level::Debug);
    }
}
