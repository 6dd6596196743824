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
        eprintln!("liburdma[{}]: {args}", std::process::id());
    }
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
    fn known_levels() {
        assert_eq!(parse_level(Some("error")), Level::Error);
        assert_eq!(parse_level(Some("info")), Level::Info);
        assert_eq!(parse_level(Some("debug\n")), Level::Debug);
    }
}
