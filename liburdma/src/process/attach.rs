//! Attaching to urdmad, and letting go of the attachment in a forked child.
//!
//! # Attachment
//! Nothing DPDK happens before the first `create_qp` of a process (a
//! process that opened the device and then forked works in the child).
//! That call finds the device's urdmad in sysfs
//! (`/sys/class/infiniband/<dev>/urdmad`), connects, sends `ATTACH`, starts
//! the helper thread, which initialises EAL as urdmad's secondary, and
//! registers the QP (`QP dev= qpn=`). A process attaches once, to one
//! urdmad: it may use devices served by that urdmad only.
//!
//! # fork()
//! An attachment belongs to the process that made it. The child of an
//! attached process ([`crate::fork`]) lets go of its copy at once: the QPs
//! (which stay the parent's), the control connection, and the helper's
//! eventfd, timerfd and epoll set (shared objects after fork, replaced by
//! fresh ones under the same descriptor numbers). Its first `create_qp`
//! attaches it as a process of its own: a new control connection and
//! `ATTACH`, so new rings, and a helper thread of its own. EAL is not
//! initialised again: the child has the parent's, whose memory is urdmad's
//! shared memory mapped at the same addresses, and its threads are not
//! needed to use the rings.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use urdma_shared::client::Connection as Control;
use urdma_shared::proto::{Request, Response};

use super::helper::{helper_loop, new_alarm};
use super::{rt, Attached, Shared, CONTROL_TIMEOUT, IN_CALLS};
use crate::dpdk::{self, Rings};
use crate::error::Error;
use crate::log;
use trp::Instant;
use urdma_shared::secondary::SecondaryError;

/// The urdmad control socket of the device at `ibdev_path`, from sysfs.
pub fn urdmad_socket(ibdev_path: &Path) -> Result<PathBuf, Error> {
    let f = ibdev_path.join("urdmad");
    let s = std::fs::read_to_string(&f).map_err(|e| {
        Error::NoUrdmad(format!(
            "cannot read {}: {e} (is urdma.ko new enough to name the device's urdmad?)",
            f.display()
        ))
    })?;
    let s = s.trim();
    if s.is_empty() {
        return Err(Error::NoUrdmad(format!(
            "no urdmad serves device {} ({} is empty): start urdmad for its interface",
            ibdev_path.display(),
            f.display()
        )));
    }
    Ok(PathBuf::from(s))
}

impl Shared {
    /// Attaches the process to the urdmad serving the device at `ibdev_path` unless it is
    /// attached already (to the same one).
    pub fn ensure_attached_for(&mut self, ibdev_path: &Path) -> Result<(), Error> {
        let known = self
            .attached
            .as_ref()
            .filter(|a| a.devices.iter().any(|d| d == ibdev_path))
            .map(|a| a.path.clone());
        if let Some(path) = known {
            return self.ensure_attached(&path);
        }
        let socket = urdmad_socket(ibdev_path).inspect_err(|e| {
            log::error(format_args!("create_qp: {e}"));
        })?;
        self.ensure_attached(&socket)?;
        if let Some(a) = self.attached.as_mut() {
            a.devices.push(ibdev_path.to_owned());
        }
        Ok(())
    }

    /// Attaches the process to the urdmad at `path` unless it is attached
    /// already (to the same one).
    pub fn ensure_attached(&mut self, path: &Path) -> Result<(), Error> {
        if let Some(a) = &self.attached {
            let e = if a.path != path {
                Error::OtherUrdmad {
                    attached: a.path.clone(),
                    wanted: path.to_owned(),
                }
            } else if a.ctl.is_none() {
                Error::UrdmadGone
            } else {
                return Ok(());
            };
            log::error(format_args!("{e}"));
            return Err(e);
        }
        if let Some(e) = &self.attach_failed {
            return Err(e.clone());
        }
        let r = attach(path);
        match r {
            Ok(a) => {
                self.attached = Some(a);
                Ok(())
            }
            Err(e) => {
                if e.ends_attaching() {
                    self.attach_failed = Some(e.clone());
                    log::fatal(format_args!(
                        "cannot attach to urdmad at {} ({e}): this process cannot use urdma devices",
                        path.display(),
                    ));
                }
                Err(e)
            }
        }
    }

    /// In the child of a fork(), before fork() returns there, with the lock taken before
    /// the fork (no thread can have held it then): lets go of the parent's attachment,
    /// keeping nothing that the parent still uses (see the module's comment).
    pub(crate) fn forked(&mut self) {
        if !renew_descriptors() {
            log::error(format_args!(
                "forked: cannot make the progress thread's descriptors: this process cannot attach to urdmad"
            ));
            self.attach_failed.get_or_insert(Error::Os {
                what: "forked: the progress thread's descriptors",
                errno: libc::EMFILE,
            });
        }
        self.engine.forked();
        // The parent gives these back or keeps them parked; the child's copies just close.
        drop(crate::socket_flow::take_for_urdmad());
        crate::socket_flow::forget_parked();
        if let Some(a) = self.attached.take() {
            if a.ctl.is_none() {
                // The parent lost urdmad and let go of EAL's memory: nothing to attach with.
                self.attach_failed.get_or_insert(Error::UrdmadGone);
            }
            // Dropping closes the child's copies of the control socket, of the packet
            // sockets urdmad passed and of the doorbell's socket; the parent's stay open.
            drop(a);
        }
        self.helper_sleep = None;
        self.armed = false;
        self.event_look = Instant::ZERO;
        self.peer_closed.clear();
        // The parent's QPs: the child never moves them itself.
        self.handles = Default::default();
        IN_CALLS.store(0, Ordering::Relaxed);
        super::forget_hush();
    }
}

/// Connects, attaches, starts the helper (which initialises EAL) and looks
/// up the rings ([`Error::ends_attaching`] says whether trying again is pointless).
fn attach(path: &Path) -> Result<Attached, Error> {
    let urdmad = |what, source| {
        let e = Error::Urdmad { what, source };
        log::error(format_args!("{e}"));
        e
    };
    let mut ctl = Control::connect(path, CONTROL_TIMEOUT).map_err(|e| {
        let e = Error::Unreachable(e);
        log::error(format_args!("{e}"));
        e
    })?;
    let a = match ctl.request(&Request::Attach) {
        Ok(Response::Attached(a)) => a,
        Ok(other) => return Err(urdmad("ATTACH", urdma_shared::client::refusal(other))),
        Err(e) => return Err(urdmad("ATTACH", e)),
    };
    // Without it, what could wait goes on the control socket and wakes urdmad.
    if let Err(e) = ctl.open_quiet() {
        log::error(format_args!("QUIET: {e}"));
    }
    // The first attachment makes them; a forked child's attachment finds them renewed.
    for (cell, make) in helper_descriptors() {
        if cell.get().is_none() {
            let fd = make();
            if fd < 0 {
                return Err(Error::last_os("the progress thread's descriptors"));
            }
            // SAFETY: a fresh descriptor we own.
            let _ = cell.set(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let attachment = a.clone();
    let started = std::time::Instant::now();
    spawn_blocking_signals(move || {
        let r = dpdk::eal_init(&attachment);
        let ok = r.is_ok();
        let _ = tx.send(r);
        if ok {
            helper_loop();
        }
    })
    .map_err(|e| {
        let e = Error::Os {
            what: "starting the progress thread",
            errno: e.raw_os_error().unwrap_or(libc::EAGAIN),
        };
        log::error(format_args!("{e}"));
        e
    })?;
    let eal = rx.recv().unwrap_or_else(|_| {
        Err(Error::Dpdk(SecondaryError::EalInit {
            reason: "the progress thread ended before EAL was up".into(),
        }))
    });
    let rings = eal
        .and_then(|()| Rings::lookup(&a, path))
        .inspect_err(|e| log::error(format_args!("{e}")))?;
    // The helper runs: it can end the connections still closing when the process exits.
    super::at_exit::wait_for_closes_at_exit();
    log::info(format_args!(
        "attached to urdmad at {} (client {}, {} port(s), DPDK up in {} ms)",
        path.display(),
        a.client,
        a.ports.len(),
        started.elapsed().as_millis()
    ));
    Ok(Attached {
        path: path.to_owned(),
        devices: Vec::new(),
        ctl: Some(ctl),
        rings,
    })
}

/// A new descriptor for one of the helper's three, or -1 (`errno` says why).
type MakeFd = fn() -> i32;

/// The helper's descriptors, each with how to make it: the kick (an eventfd), the alarm (a
/// timerfd on the clock of [`now`]) and the epoll set of the direct path's sockets.
fn helper_descriptors() -> [(&'static OnceLock<OwnedFd>, MakeFd); 3] {
    fn kick() -> i32 {
        // SAFETY: plain eventfd creation.
        unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) }
    }
    fn sockets() -> i32 {
        // SAFETY: plain epoll creation.
        unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }
    }
    let r = rt();
    [
        (&r.kick, kick),
        (&r.alarm, new_alarm),
        (&r.sockets, sockets),
    ]
}

/// In a forked child: the helper's descriptors name objects the parent still uses (a kick
/// would wake the parent's helper, an alarm set would move its alarm, a socket taken out of
/// the epoll set would leave the parent's). Each is replaced by a fresh one under the same
/// number, so that nothing holding the number needs to hear of it. False if one could not
/// be made (the number then names /dev/null, and the child must not attach).
fn renew_descriptors() -> bool {
    let mut all = true;
    for (cell, make) in helper_descriptors() {
        let Some(old) = cell.get() else { continue };
        let fresh = make();
        // SAFETY: `fresh` is ours; `old` is the cell's descriptor, which keeps its number
        // and now names the fresh object (or /dev/null's, if none could be made).
        unsafe {
            if fresh >= 0 && libc::dup3(fresh, old.as_raw_fd(), libc::O_CLOEXEC) >= 0 {
                libc::close(fresh);
                continue;
            }
            if fresh >= 0 {
                libc::close(fresh);
            }
            all = false;
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup3(null, old.as_raw_fd(), libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }
    all
}

/// Starts a thread with every signal blocked (set around the spawn, so
/// there is no moment when it could take one of the application's).
fn spawn_blocking_signals(f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    // SAFETY: sigset manipulation on local storage; pthread_sigmask on the
    // calling thread, restored right after the spawn.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let r = std::thread::Builder::new()
            .name("urdma-progress".into())
            .spawn(move || crate::guard::catch((), f));
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::super::helper::kick_helper;
    use super::*;

    #[test]
    fn urdmad_socket_comes_from_sysfs() {
        let dir = std::env::temp_dir().join(format!("urdma-sysfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(urdmad_socket(&dir)
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
        std::fs::write(dir.join("urdmad"), "\n").unwrap();
        assert!(urdmad_socket(&dir)
            .unwrap_err()
            .to_string()
            .contains("no urdmad serves"));
        std::fs::write(dir.join("urdmad"), "/run/urdma/A.sock\n").unwrap();
        assert_eq!(
            urdmad_socket(&dir).unwrap(),
            PathBuf::from("/run/urdma/A.sock")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn renewed_descriptors_keep_their_numbers_and_leave_the_parents_objects_alone() {
        for (cell, make) in helper_descriptors() {
            if cell.get().is_none() {
                // SAFETY: a fresh descriptor we own.
                let _ = cell.set(unsafe { OwnedFd::from_raw_fd(make()) });
            }
        }
        let kick = rt().kick.get().unwrap().as_raw_fd();
        // What the parent keeps: the same eventfd under another number.
        // SAFETY: duplicating our own descriptor.
        let parents = unsafe { OwnedFd::from_raw_fd(libc::dup(kick)) };
        let read = |fd: i32| {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes of a non-blocking eventfd into a local.
            let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
            (n == 8).then_some(v)
        };
        kick_helper();
        assert!(renew_descriptors());
        assert_eq!(rt().kick.get().unwrap().as_raw_fd(), kick);
        assert_eq!(read(kick), None, "the number names a fresh eventfd");
        kick_helper();
        assert_eq!(
            read(parents.as_raw_fd()),
            Some(1),
            "the parent's saw one kick"
        );
        assert_eq!(read(kick), Some(1));
        // The fresh ones keep close-on-exec.
        for (cell, _) in helper_descriptors() {
            // SAFETY: querying our own descriptor's flags.
            let flags = unsafe { libc::fcntl(cell.get().unwrap().as_raw_fd(), libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }
    }

    #[test]
    fn helper_thread_blocks_every_signal() {
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_blocking_signals(move || {
            // SAFETY: reading the calling thread's mask into local storage.
            let blocked = unsafe {
                let mut cur: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
                [
                    libc::SIGINT,
                    libc::SIGTERM,
                    libc::SIGUSR1,
                    libc::SIGALRM,
                    libc::SIGCHLD,
                ]
                .iter()
                .all(|&s| libc::sigismember(&cur, s) == 1)
            };
            tx.send(blocked).unwrap();
        })
        .unwrap();
        assert!(rx.recv().unwrap());
        // The spawning thread's mask is back as it was.
        // SAFETY: a sigset on the stack, queried for the calling thread.
        let mine = unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, libc::SIGUSR1)
        };
        assert_eq!(mine, 0);
    }
}
