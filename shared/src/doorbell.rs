//! The doorbell: how a process wakes an idle urdmad after putting frames on its TX ring.
//!
//! An idle urdmad sleeps in `ppoll()`. Frames from the wire and requests end the sleep by
//! themselves (the ports' descriptors and the control sockets are in the set it polls), but a
//! process's TX ring is plain shared memory: without a doorbell, a frame put there while
//! urdmad sleeps would wait for the sleep's timeout, and a ping-pong would pay that on every
//! message. So urdmad raises a flag in shared memory ([`MEMZONE`]) before it takes its last
//! look at the TX rings and sleeps, and a process that has just filled a TX ring and finds
//! the flag raised takes it down and sends one datagram to urdmad's kick socket
//! ([`kick_path`]), which is in the polled set too.
//!
//! Each side orders its store (urdmad's flag, the process's ring entry) before its load (the
//! rings, the flag) with a sequentially consistent fence, so at least one of them sees the
//! other's store: either urdmad finds the frame on its last look, or the process finds the
//! flag and kicks. Only the process that takes the flag down kicks, so a burst of posts while
//! urdmad sleeps costs one datagram, and none while it is awake.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, Ordering};

/// The memzone that holds the [`Bell`].
pub const MEMZONE: &str = "urd_doorbell";

/// The shared flag, alone in its cache line.
#[repr(C, align(64))]
pub struct Bell {
    asleep: AtomicU32,
}

impl Default for Bell {
    fn default() -> Self {
        Bell {
            asleep: AtomicU32::new(0),
        }
    }
}

impl Bell {
    /// urdmad, before its last look at the TX rings ahead of a sleep.
    pub fn going_to_sleep(&self) {
        self.asleep.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// urdmad, awake again (or not sleeping after all).
    pub fn awake(&self) {
        self.asleep.store(0, Ordering::Relaxed);
    }

    /// A process, after enqueueing: whether it must kick (it took the flag down).
    pub fn take(&self) -> bool {
        fence(Ordering::SeqCst);
        self.asleep.load(Ordering::Relaxed) != 0 && self.asleep.swap(0, Ordering::SeqCst) != 0
    }
}

/// Where urdmad's kick socket is: beside its control socket.
pub fn kick_path(control: &Path) -> PathBuf {
    let mut p = control.as_os_str().to_owned();
    p.push(".kick");
    PathBuf::from(p)
}

/// A process's side of the doorbell.
pub struct Ringer {
    bell: *const Bell,
    sock: UnixDatagram,
    path: PathBuf,
}

// SAFETY: the bell is an atomic in urdmad's shared memory, mapped while the process is
// attached; the socket is usable from any thread.
unsafe impl Send for Ringer {}
unsafe impl Sync for Ringer {}

impl Ringer {
    /// The doorbell of the urdmad whose control socket is `control`, whose memzone holds
    /// `bell` (after EAL is up).
    ///
    /// # Safety
    /// `bell` points to urdmad's [`Bell`] and stays mapped for as long as the result lives.
    pub unsafe fn new(bell: *const Bell, control: &Path) -> std::io::Result<Ringer> {
        let sock = UnixDatagram::unbound()?;
        sock.set_nonblocking(true)?;
        Ok(Ringer {
            bell,
            sock,
            path: kick_path(control),
        })
    }

    /// Call after putting frames on a TX ring: wakes urdmad if it is asleep. A kick that
    /// cannot be sent (urdmad gone, its socket full of kicks) is dropped: urdmad is awake
    /// or not there.
    pub fn ring(&self) {
        // SAFETY: mapped for our lifetime (see `new`).
        if unsafe { &*self.bell }.take() {
            let _ = self.sock.send_to(&[0], &self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_process_after_the_flag_kicks() {
        let b = Bell::default();
        assert!(!b.take(), "awake: nobody kicks");
        b.going_to_sleep();
        assert!(b.take());
        assert!(!b.take(), "the flag is down after the first kick");
        b.going_to_sleep();
        b.awake();
        assert!(!b.take());
    }

    #[test]
    fn the_kick_socket_sits_beside_the_control_socket() {
        assert_eq!(
            kick_path(Path::new("/run/urdma/urdmad.sock")),
            PathBuf::from("/run/urdma/urdmad.sock.kick")
        );
    }
}
