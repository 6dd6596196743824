//! The provider's one error type, and the one place where an error becomes the errno an
//! application sees.
//!
//! Inside the provider a failure is an [`Error`] that names its cause, which is what the log
//! shows. Only the C entry points turn it into an errno, through [`Error::errno`], whose
//! table follows libibverbs and the kernel's own providers (rxe, siw): a bad argument is
//! `EINVAL`, a full work queue `ENOMEM`, a verb urdma lacks `EOPNOTSUPP`, and a command the
//! kernel refused keeps the kernel's errno. [`object`] and [`status`] are the two shapes a
//! verb returns a failure in: NULL with `errno` set, or the errno itself.

use std::io;
use std::os::raw::c_int;
use std::path::PathBuf;

use trp::{PostError, SetupError};
use urdma_shared::client;
use urdma_shared::secondary::SecondaryError;

use crate::guard::set_errno;
use crate::log;

/// Why something the provider was asked to do failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An argument the verb does not accept (an unknown object, a value out of range).
    #[error("{0}")]
    Invalid(&'static str),
    /// A work request trp refused (a full queue, a bad SGE, a QP in the wrong state).
    #[error("{0}")]
    Post(#[from] PostError),
    /// A work request on a QP whose connection urdmad has not handed over.
    #[error("the QP has no connection")]
    NotConnected,
    /// Memory, or a slot of a fixed-size table, that could not be had.
    #[error("{0}")]
    NoMemory(&'static str),
    /// A right the memory region lacks (binding a window).
    #[error("{0}")]
    Access(&'static str),
    /// An object still in use (an MR with windows bound to it).
    #[error("{0}")]
    Busy(&'static str),
    /// A verb, flag or mode urdma does not implement.
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    /// A uverbs command urdma.ko refused, with the kernel's errno.
    #[error("{verb}: {}", io::Error::from_raw_os_error(*errno))]
    Kernel { verb: &'static str, errno: i32 },
    /// A system call that failed, with its errno.
    #[error("{what}: {}", io::Error::from_raw_os_error(*errno))]
    Os { what: &'static str, errno: i32 },
    /// The device answered `alloc_ucontext` as some other driver would, or in another ABI.
    #[error("refusing device: {0}")]
    ForeignDevice(String),
    /// No urdmad serves the device (sysfs names none, or cannot be read).
    #[error("{0}")]
    NoUrdmad(String),
    /// urdmad could not be connected to, for whatever reason it gave (the socket's
    /// permissions, its group, its protocol version).
    #[error("connecting to urdmad: {0}")]
    Unreachable(client::Error),
    /// urdmad refused a request, answered what it should not, or went silent.
    #[error("{what}: {source}")]
    Urdmad {
        what: &'static str,
        source: client::Error,
    },
    /// urdmad closed this process's control connection.
    #[error("urdmad has gone away")]
    UrdmadGone,
    /// A device served by another urdmad than the one this process attached to.
    #[error("a process may use the devices of one urdmad only: attached to {}, device served by {}", attached.display(), wanted.display())]
    OtherUrdmad { attached: PathBuf, wanted: PathBuf },
    /// Attaching to urdmad's DPDK memory, or finding a ring in it.
    #[error("{0}")]
    Dpdk(#[from] SecondaryError),
    /// urdmad's hand-over of a connection that this process cannot take.
    #[error("{0}")]
    HandOver(String),
    /// trp refused the handshake urdmad handed over.
    #[error("connection setup: {0}")]
    Setup(#[from] SetupError),
}

impl Error {
    /// The errno of the verbs API for this error: the one mapping there is.
    pub fn errno(&self) -> c_int {
        match self {
            Error::Invalid(_) | Error::NotConnected | Error::OtherUrdmad { .. } => libc::EINVAL,
            Error::Post(PostError::QueueFull) => libc::ENOMEM,
            Error::Post(_) => libc::EINVAL,
            Error::NoMemory(_) => libc::ENOMEM,
            Error::Access(_) => libc::EACCES,
            Error::Busy(_) => libc::EBUSY,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Kernel { errno, .. } | Error::Os { errno, .. } => *errno,
            Error::ForeignDevice(_) => libc::EPROTO,
            Error::NoUrdmad(_) => libc::ENODEV,
            Error::Unreachable(_) => libc::ECONNREFUSED,
            Error::Urdmad { source, .. } => match source {
                client::Error::Refused { .. } | client::Error::Unexpected(_) => libc::EPERM,
                _ => libc::ECONNREFUSED,
            },
            Error::UrdmadGone => libc::ENOTCONN,
            Error::Dpdk(_) => libc::EIO,
            Error::HandOver(_) | Error::Setup(_) => libc::ECONNRESET,
        }
    }

    /// Whether attaching to urdmad can never work in this process: EAL, which a process
    /// can initialise once, failed or attached to what is not usable.
    pub fn ends_attaching(&self) -> bool {
        matches!(self, Error::Dpdk(_))
    }

    /// A system call's failure, from the `io::Error` it left.
    pub fn os(what: &'static str, e: &io::Error) -> Error {
        Error::Os {
            what,
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// The failure of the system call just made, from the thread's `errno`.
    pub fn last_os(what: &'static str) -> Error {
        Error::os(what, &io::Error::last_os_error())
    }

    /// A uverbs command's return value (0 or an errno) as a result.
    pub fn kernel(verb: &'static str, ret: c_int) -> Result<(), Error> {
        match ret {
            0 => Ok(()),
            errno => Err(Error::Kernel { verb, errno }),
        }
    }
}

/// A constructor's answer to libibverbs: the object, or NULL with `errno` set.
pub(crate) fn object<T>(verb: &str, r: Result<*mut T, Error>) -> *mut T {
    r.unwrap_or_else(|e| {
        fail(verb, &e);
        std::ptr::null_mut()
    })
}

/// A verb's answer to libibverbs: 0, or the errno.
pub(crate) fn status(verb: &str, r: Result<(), Error>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            let errno = e.errno();
            log::debug(format_args!("{verb}: {e} (errno {errno})"));
            errno
        }
    }
}

/// Sets `errno` for a verb that failed, and says why in the debug log.
pub(crate) fn fail(verb: &str, e: &Error) {
    let errno = e.errno();
    log::debug(format_args!("{verb}: {e} (errno {errno})"));
    set_errno(errno);
}

#[cfg(test)]
mod tests {
    use super::*;
    use trp::mr::ProtectionError;

    /// The errnos libibverbs users rely on, pinned: a change here changes the verbs API.
    #[test]
    fn errnos_of_the_verbs_api() {
        let cases = [
            (Error::Invalid("no such QP"), libc::EINVAL),
            (Error::NotConnected, libc::EINVAL),
            (Error::Post(PostError::State), libc::EINVAL),
            (Error::Post(PostError::TooLong), libc::EINVAL),
            (
                Error::Post(PostError::LocalProtection(ProtectionError::UnknownStag)),
                libc::EINVAL,
            ),
            (Error::Post(PostError::QueueFull), libc::ENOMEM),
            (Error::NoMemory("SRQ full"), libc::ENOMEM),
            (
                Error::Unsupported("ibv_reg_mr with an IOVA"),
                libc::EOPNOTSUPP,
            ),
            (Error::Access("MR without the bind right"), libc::EACCES),
            (Error::Busy("windows bound to the MR"), libc::EBUSY),
            (
                Error::Kernel {
                    verb: "create_qp",
                    errno: libc::EAGAIN,
                },
                libc::EAGAIN,
            ),
            (
                Error::Kernel {
                    verb: "create_cq",
                    errno: libc::ENOSPC,
                },
                libc::ENOSPC,
            ),
            (Error::NoUrdmad("no urdmad".into()), libc::ENODEV),
            (Error::UrdmadGone, libc::ENOTCONN),
        ];
        for (e, errno) in cases {
            assert_eq!(e.errno(), errno, "{e}");
        }
    }

    #[test]
    fn urdmad_refusing_is_eperm_and_not_reaching_it_econnrefused() {
        let refused = Error::Urdmad {
            what: "ATTACH",
            source: client::Error::Refused {
                code: urdma_shared::proto::ErrorCode::Access,
                message: "no".into(),
            },
        };
        assert_eq!(refused.errno(), libc::EPERM);
        let closed = Error::Urdmad {
            what: "ATTACH",
            source: client::Error::Closed,
        };
        assert_eq!(closed.errno(), libc::ECONNREFUSED);
        // Whatever urdmad says when a process connects (not in its group, another
        // protocol version), the process could not reach it.
        let denied = Error::Unreachable(client::Error::Refused {
            code: urdma_shared::proto::ErrorCode::Access,
            message: "uid 65534 is not allowed".into(),
        });
        assert_eq!(denied.errno(), libc::ECONNREFUSED);
    }

    #[test]
    fn the_log_line_names_the_cause() {
        let e = Error::Kernel {
            verb: "reg_mr",
            errno: libc::EFAULT,
        };
        assert_eq!(e.to_string(), "reg_mr: Bad address (os error 14)");
        assert_eq!(
            status("dereg_mr", Err(Error::Busy("windows bound"))),
            libc::EBUSY
        );
        assert_eq!(status("dereg_mr", Ok(())), 0);
    }
}
