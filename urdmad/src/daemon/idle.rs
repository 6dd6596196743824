//! How urdmad sleeps when it has nothing to do, and what wakes it.
//!
//! Every sleep ends early for a request (the control socket, the processes' sockets, the
//! kernel's channel) and for a process's kick (the doorbell, [`crate::doorbell`]). When every
//! port can say that frames came ([`RxWake`]), a frame from the wire ends the sleep too:
//! an af_packet port's sockets are in the polled set, and so are a PCI port's RX interrupts
//! (vfio-pci), armed for the sleep only. Nothing then needs a timer, and urdmad sleeps
//! `idle_sleep_max_us` at once instead of waking every `idle_sleep_us` to look. A PCI device
//! without interrupts (uio_pci_generic) gives nothing to sleep on, nor does a TAP port here
//! (its PMD raises SIGIO, which may reach another thread), and with such a port urdmad keeps
//! waking to look. The exception TAPs carry only the kernel's own traffic, which waits at
//! most a sleep either way.
//!
//! Why it matters: on a small host the processes and urdmad share the cores; a urdmad that
//! wakes ten thousand times a second to find nothing takes them from the processes it waits
//! for, and a frame that waits for urdmad's next timer pays that timer on every hop.
//!
//! A descriptor that keeps saying "readable" while the sweep after finds nothing would turn
//! the sleep into a busy loop; the daemon then sleeps one round on the timer
//! ([`Idle::spurious`]).

use super::StartupError;
use crate::doorbell::{self, Bell};
use crate::port::{self, RxWake};
use dpdk_sys as sys;
use std::ffi::CString;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

/// What urdmad's sleep waits on besides the control sockets.
pub struct Idle {
    bell: *const Bell,
    mz: *const sys::rte_memzone,
    kick: UnixDatagram,
    kick_path: PathBuf,
    /// The ports' own descriptors; empty when some port has none.
    port_fds: Vec<RawFd>,
    /// The ports in interrupt mode: their id and their RX queues' interrupts (in
    /// `port_fds` too).
    interrupts: Vec<(u16, Vec<RawFd>)>,
    /// The last sleep was ended by a port's descriptor and nothing was found after it.
    pub spurious: bool,
    /// How often that happened (status).
    pub spurious_wakes: u64,
}

impl Idle {
    /// Reserves the doorbell and binds the kick socket beside the control socket `control`
    /// (with its mode and group).
    pub fn new(control: &Path, mode: u32, gid: Option<u32>) -> Result<Idle, StartupError> {
        let kick_path = doorbell::kick_path(control);
        let what = |error| StartupError::Socket {
            path: kick_path.clone(),
            error,
        };
        // What a killed urdmad left behind (the control socket, checked first, says no
        // urdmad runs).
        let _ = std::fs::remove_file(&kick_path);
        let kick = UnixDatagram::bind(&kick_path).map_err(what)?;
        let setup = || -> std::io::Result<()> {
            kick.set_nonblocking(true)?;
            std::fs::set_permissions(&kick_path, std::fs::Permissions::from_mode(mode))?;
            if let Some(g) = gid {
                std::os::unix::fs::chown(&kick_path, None, Some(g))?;
            }
            Ok(())
        };
        if let Err(e) = setup() {
            let _ = std::fs::remove_file(&kick_path);
            return Err(what(e));
        }
        let name = CString::new(doorbell::MEMZONE).unwrap();
        // SAFETY: EAL is up; a valid name.
        let mz = unsafe {
            sys::rte_memzone_reserve(
                name.as_ptr(),
                std::mem::size_of::<Bell>(),
                sys::SOCKET_ID_ANY,
                0,
            )
        };
        if mz.is_null() {
            let _ = std::fs::remove_file(&kick_path);
            return Err(StartupError::Doorbell {
                reason: sys::rte_strerror_string(sys::rte_errno()),
            });
        }
        // SAFETY: the memzone is ours, cache-line aligned and large enough for a Bell.
        let bell = unsafe {
            let p = (*mz).__bindgen_anon_1.addr as *mut Bell;
            p.write(Bell::default());
            p as *const Bell
        };
        Ok(Idle {
            bell,
            mz,
            kick,
            kick_path,
            port_fds: Vec::new(),
            interrupts: Vec::new(),
            spurious: false,
            spurious_wakes: 0,
        })
    }

    /// Once the ports are up (their ids and how each says that frames came): when every
    /// one can, finds the descriptors that make a frame end a sleep.
    pub fn watch_ports(&mut self, ports: &[(u16, &RxWake)]) {
        self.port_fds.clear();
        self.interrupts.clear();
        if ports.iter().any(|(_, w)| matches!(w, RxWake::Timer(_))) {
            return;
        }
        if ports.iter().any(|(_, w)| **w == RxWake::Socket) {
            self.port_fds = port_descriptors();
        }
        for (id, w) in ports {
            if let RxWake::Interrupt(fds) = w {
                self.port_fds.extend(fds);
                self.interrupts.push((*id, fds.clone()));
            }
        }
    }

    /// Arms the ports' RX interrupts for a sleep; the ports armed, whose frames that came
    /// before the arming the caller must still look for (they raised nothing).
    pub fn arm(&self) -> impl Iterator<Item = u16> + '_ {
        self.interrupts.iter().map(|(id, fds)| {
            port::arm(*id, fds.len() as u16);
            *id
        })
    }

    /// After a sleep: the interrupts disarmed, and those that fired (`fired` says which
    /// descriptors poll() found readable) read, so that they do not end the next sleep.
    pub fn disarm(&self, fired: impl Fn(RawFd) -> bool) {
        for (id, fds) in &self.interrupts {
            port::disarm(*id, fds.len() as u16);
            for &fd in fds.iter().filter(|&&fd| fired(fd)) {
                let mut count = [0u8; 8];
                // SAFETY: an eventfd, readable (poll said so): the read does not block.
                unsafe { libc::read(fd, count.as_mut_ptr().cast(), count.len()) };
            }
        }
    }

    /// Whether the next sleep may wait for a frame without a timer.
    pub fn frames_wake(&self) -> bool {
        !self.port_fds.is_empty() && !self.spurious
    }

    /// The kick socket, polled in every sleep.
    pub fn kick_fd(&self) -> RawFd {
        self.kick.as_raw_fd()
    }

    /// The ports' descriptors, polled in a sleep that [`Idle::frames_wake`].
    pub fn port_fds(&self) -> &[RawFd] {
        &self.port_fds
    }

    pub fn bell(&self) -> &Bell {
        // SAFETY: the memzone lives as long as self.
        unsafe { &*self.bell }
    }

    /// Empties the kick socket after a sleep.
    pub fn drain_kicks(&self) {
        let mut b = [0u8; 16];
        while self.kick.recv(&mut b).is_ok() {}
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kick_path);
        // SAFETY: ours; no process reads it once urdmad stops (they see the socket close).
        unsafe { sys::rte_memzone_free(self.mz) };
    }
}

/// Whether `fd` is readable now.
pub fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a zero timeout only looks.
    unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0 }
}

/// This process's AF_PACKET sockets: what the af_packet PMD reads.
fn port_descriptors() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()))
        .filter(|&fd| is_packet_socket(fd))
        .collect()
}

fn is_packet_socket(fd: RawFd) -> bool {
    let mut domain: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid out-pointers; a descriptor that is not a socket fails with ENOTSOCK.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut domain as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    r == 0 && domain == libc::AF_PACKET
}
