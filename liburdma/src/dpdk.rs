//! The process as urdmad's DPDK secondary: EAL initialisation (once per
//! process), the rings urdmad hands out (the process's mbuf rings,
//! `urdma_shared::lending`, and a TX ring per port), and a connected QP's
//! [`Flow`] over its RX ring and its port's TX ring.
//!
//! Ring discipline (docs/urdmad.md): the process is the only consumer of
//! its flows' RX rings and its alloc ring, and the only producer of its TX
//! rings and its free ring. Every ring operation here runs under the engine
//! lock, which serialises the application's threads and the helper thread.

use std::ffi::c_void;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use dpdk_sys as sys;
use urdma_shared::bell::BellWord;
use urdma_shared::doorbell::Ringer;
use urdma_shared::lending::Borrower;
use urdma_shared::proto::Attachment;
use urdma_shared::qpstats::{Slot, SLOTS};
use urdma_shared::secondary;

use crate::engine::Flow;
use crate::error::Error;
use urdma_shared::frame::{self, Endpoints, HEADERS};

const BURST: usize = 32;

/// Initialises EAL as urdmad's secondary, once per process. Run it on the
/// provider's helper thread: EAL binds the calling thread to the lcore
/// urdmad reserved and starts its own threads from it, which inherit its
/// signal mask, so the application's threads keep their affinity and
/// signals.
pub fn eal_init(a: &Attachment) -> Result<(), Error> {
    secondary::eal_init(a, "liburdma")?;
    // The first success is the process that initialised EAL; a child forked later
    // finds EAL up and this already set.
    let _ = EAL_PID.compare_exchange(0, std::process::id(), Ordering::Relaxed, Ordering::Relaxed);
    Ok(())
}

/// The process that initialised EAL (0: none has).
static EAL_PID: AtomicU32 = AtomicU32::new(0);

/// Lets go of urdmad's DPDK state once urdmad is gone (EAL initialised and
/// nothing of the process using a ring or mbuf any more): unmaps its
/// memory and closes the files EAL holds in its runtime directory.
///
/// A secondary keeps shared locks on the primary's memory-segment files and
/// its socket in that directory for as long as EAL is up; a restarted
/// urdmad reuses the directory (same `--file-prefix`), and its EAL cannot
/// initialise while any process holds those locks, nor would its hugepages
/// be freed. EAL cannot be initialised again in this process, so it stays
/// without urdmad for good.
///
/// A child forked after EAL came up only unlocks: `rte_eal_cleanup` would wait for EAL
/// threads that exist in the parent alone, and remove the parent's multi-process socket.
/// The locks belong to descriptions the parent shares, and urdmad is gone for it too.
pub fn detach() {
    static DONE: std::sync::Once = std::sync::Once::new();
    if !secondary::eal_is_up() {
        return;
    }
    DONE.call_once(|| {
        // SAFETY: EAL is up: a static string of its own.
        let dir = unsafe { std::ffi::CStr::from_ptr(sys::rte_eal_get_runtime_dir()) }
            .to_string_lossy()
            .into_owned();
        if EAL_PID.load(Ordering::Relaxed) == std::process::id() {
            // SAFETY: EAL is up, initialised by this process; the caller guarantees nothing
            // uses a DPDK object any more (every flow is dropped and no new one can be made).
            unsafe { sys::rte_eal_cleanup() };
        }
        unlock_files_under(Path::new(&dir));
    });
}

/// Drops the `flock` locks the process still holds on files under `dir`.
///
/// DPDK 22.11's cleanup detaches the memory-segment arrays but not the
/// memzone array, whose file (`fbarray_memzone`) stays locked (shared) for
/// as long as the descriptor is open, and a new primary's EAL stops at
/// "Cannot allocate memzone list" while anyone holds that lock. Unlocking
/// leaves the descriptor, which DPDK owns, in place.
fn unlock_files_under(dir: &Path) {
    // The descriptors name the files by their real paths (EAL's
    // /var/run/dpdk is /run/dpdk on most systems).
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for e in fds.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(&dir)) {
            // SAFETY: flock on a descriptor of this process; unlocking
            // changes nothing else about it.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
        }
    }
}

fn lookup_ring(name: &str) -> Result<*mut sys::rte_ring, Error> {
    Ok(secondary::lookup_ring(name)?)
}

/// What the attachment gave the process: its mbuf rings and one TX ring
/// per port.
pub struct Rings {
    mbufs: Borrower,
    tx: Vec<*mut sys::rte_ring>,
    macs: Vec<[u8; 6]>,
    /// Wakes urdmad after frames are put on a TX ring while it sleeps.
    ringer: Option<Arc<Ringer>>,
    /// urdmad's table of QP figures (null: it has none).
    figures: *const Slot,
}

// SAFETY: the pointers name objects in urdmad's shared memory, valid while
// the process is attached; they are used under the engine lock only.
unsafe impl Send for Rings {}

impl Rings {
    /// An attachment without rings, for tests that never reach DPDK.
    #[cfg(test)]
    pub fn none() -> Rings {
        Rings {
            mbufs: Borrower::new(std::ptr::null_mut(), std::ptr::null_mut()),
            tx: Vec::new(),
            macs: Vec::new(),
            ringer: None,
            figures: std::ptr::null(),
        }
    }

    /// Looks up the rings and the doorbell of the urdmad whose control
    /// socket is `control` (after [`eal_init`]).
    pub fn lookup(a: &Attachment, control: &Path) -> Result<Rings, Error> {
        let (mbufs, tx) = secondary::lookup_attachment(a)?;
        Ok(Rings {
            mbufs,
            tx,
            macs: a.ports.iter().map(|p| p.mac.0).collect(),
            ringer: secondary::lookup_ringer(control).map(Arc::new),
            figures: secondary::lookup_qp_table().unwrap_or(std::ptr::null()),
        })
    }

    /// The flow of a connected QP: `rx_ring` on `port`, frames between
    /// `local` and `remote` (peer MAC `remote_mac`), its figures kept in slot
    /// `stats` of urdmad's table.
    pub fn flow(
        &self,
        port: u16,
        rx_ring: &str,
        local: std::net::SocketAddrV4,
        remote: std::net::SocketAddrV4,
        remote_mac: [u8; 6],
        stats: Option<u32>,
    ) -> Result<DpdkFlow, Error> {
        let p = usize::from(port);
        let (Some(&tx), Some(&local_mac)) = (self.tx.get(p), self.macs.get(p)) else {
            return Err(Error::HandOver(format!(
                "urdmad named port {port}, which the attachment lacks"
            )));
        };
        Ok(DpdkFlow {
            rx: lookup_ring(rx_ring)?,
            tx,
            mbufs: self.mbufs,
            ringer: self.ringer.clone(),
            backlogged: false,
            spare: std::ptr::null_mut(),
            figures: match stats {
                // SAFETY: within the table, which urdmad keeps while it runs.
                Some(i) if i < SLOTS && !self.figures.is_null() => unsafe {
                    self.figures.add(i as usize)
                },
                _ => std::ptr::null(),
            },
            bell: None,
            hushed: false,
            ep: Endpoints {
                local_mac,
                remote_mac,
                local,
                remote,
            },
        })
    }
}

pub struct DpdkFlow {
    rx: *mut sys::rte_ring,
    tx: *mut sys::rte_ring,
    mbufs: Borrower,
    ringer: Option<Arc<Ringer>>,
    /// The last `transmit` stopped because the TX ring was full, or no mbuf
    /// was left to send with.
    backlogged: bool,
    /// A lent mbuf that the last `transmit` had no datagram for. Most calls
    /// find nothing to send; taking and giving back an mbuf in each would
    /// move both mbuf rings' indexes, cache lines that urdmad reads on
    /// another CPU, for nothing.
    spare: *mut sys::rte_mbuf,
    /// The QP's slot in urdmad's table of figures (null: none).
    figures: *const Slot,
    ep: Endpoints,
    /// The word of urdma.ko's bell, which urdmad reads for each frame it puts on the ring.
    bell: Option<BellWord>,
    /// urdmad reads the process's hush word for the frames it puts on the ring
    /// ([`Flow::hushed`]).
    hushed: bool,
}

impl Drop for DpdkFlow {
    fn drop(&mut self) {
        if !self.spare.is_null() {
            // Ours and handed to no ring; a flow is dropped before the process
            // lets go of urdmad's memory (`detach`).
            self.mbufs.give_back(&[self.spare]);
        }
    }
}

// SAFETY: as for Rings.
unsafe impl Send for DpdkFlow {}

impl DpdkFlow {
    /// The flow with `bell`, the word urdmad passed for a connection whose frames ring
    /// urdma.ko's bell from urdmad (`urdmad::ringbell`); `hushed` when urdmad follows the
    /// process's hush word for them too.
    pub fn with_bell(mut self, bell: Option<BellWord>, hushed: bool) -> DpdkFlow {
        self.hushed = hushed && bell.is_some();
        self.bell = bell;
        self
    }

    /// Both ends of the flow.
    pub fn endpoints(&self) -> Endpoints {
        self.ep
    }

    /// Hands `pkts` to the port's TX ring; `transmit` makes no more than
    /// fit, and anything that did not would be dropped (trp retransmits it).
    fn enqueue(&self, pkts: &[*mut sys::rte_mbuf]) {
        if pkts.is_empty() {
            return;
        }
        // SAFETY: the process is this TX ring's only producer (engine lock).
        let n = unsafe {
            sys::rte_ring_sp_enqueue_burst(
                self.tx,
                pkts.as_ptr() as *const *mut c_void,
                pkts.len() as u32,
                std::ptr::null_mut(),
            )
        } as usize;
        if n > 0 {
            if let Some(r) = &self.ringer {
                r.ring();
            }
        }
        // Not handed over: still ours.
        self.mbufs.give_back(&pkts[n..]);
    }
}

impl Flow for DpdkFlow {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        let mut m = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        // SAFETY: the process is this ring's only consumer (engine lock);
        // `m` has room for BURST pointers.
        let n = unsafe {
            sys::rte_ring_sc_dequeue_burst(
                self.rx,
                m.as_mut_ptr() as *mut *mut c_void,
                BURST as u32,
                std::ptr::null_mut(),
            )
        } as usize;
        if n == 0 {
            return 0;
        }
        let mut payloads: [&[u8]; BURST] = [&[]; BURST];
        let mut k = 0;
        for &mb in &m[..n] {
            // SAFETY: a valid mbuf we now own; its first segment's data is
            // `data_len` bytes at mtod. Frames of several segments are not
            // ours (urdmad's pool holds a whole frame per mbuf).
            let frame = unsafe {
                if (*mb).nb_segs != 1 {
                    continue;
                }
                std::slice::from_raw_parts(
                    sys::rte_pktmbuf_mtod::<u8>(mb) as *const u8,
                    usize::from((*mb).data_len),
                )
            };
            if let Some(p) = frame::payload(frame, &self.ep) {
                payloads[k] = p;
                k += 1;
            }
        }
        if k > 0 {
            handle(&payloads[..k]);
        }
        // Ours; the payload slices are no longer used.
        self.mbufs.give_back(&m[..n]);
        n
    }

    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        let Ok(full) = u16::try_from(HEADERS + datagram) else {
            return 0;
        };
        let mut pkts = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        let mut k = 0;
        let mut sent = 0;
        // Only as many datagrams as the TX ring has room for leave trp: one
        // made and then dropped at a full ring would count as sent, wait for
        // its retransmission timer and, under load, be dropped again until
        // the peer gave up. The process is the ring's only producer, so the
        // room can only grow while we fill it.
        // SAFETY: the ring lives while the process is attached.
        let mut room = unsafe { sys::rte_ring_free_count(self.tx) } as usize;
        self.backlogged = false;
        loop {
            if room == 0 {
                self.backlogged = true;
                break;
            }
            // Lent by urdmad, or the spare the last call kept (empty).
            let m = if self.spare.is_null() {
                let Some(m) = self.mbufs.take() else {
                    // No buffer on the way out either: what is left waits in trp as
                    // for a full ring, and goes once urdmad has lent more, which a
                    // sleeping urdmad does once woken.
                    if let Some(r) = &self.ringer {
                        r.ring();
                    }
                    self.backlogged = true;
                    break;
                };
                m
            } else {
                std::mem::replace(&mut self.spare, std::ptr::null_mut())
            };
            // SAFETY: m is an empty mbuf of ours; append returns room for
            // `full` bytes in its first segment or NULL.
            let buf = unsafe {
                let p = sys::rte_pktmbuf_append(m, full) as *mut u8;
                if p.is_null() {
                    self.mbufs.give_back(&[m]);
                    break;
                }
                std::slice::from_raw_parts_mut(p, usize::from(full))
            };
            match fill(&mut buf[HEADERS..]) {
                Some(n) => {
                    let len = frame::write_headers(buf, &self.ep, n);
                    // SAFETY: shortening the data we appended.
                    unsafe { sys::rte_pktmbuf_trim(m, full - len as u16) };
                    pkts[k] = m;
                    k += 1;
                    sent += 1;
                    room -= 1;
                    if k == BURST {
                        self.enqueue(&pkts[..k]);
                        k = 0;
                    }
                }
                None => {
                    // Kept for the next call, empty again.
                    // SAFETY: ours, handed to no ring; `full` bytes were appended above.
                    unsafe { sys::rte_pktmbuf_trim(m, full) };
                    self.spare = m;
                    break;
                }
            }
        }
        self.enqueue(&pkts[..k]);
        sent
    }

    fn backlogged(&self) -> bool {
        self.backlogged
    }

    fn forked(&mut self) {
        // The spare is the parent's, and giving it back would make the child a second
        // producer on the parent's free ring. The figures are the parent's QP's.
        self.spare = std::ptr::null_mut();
        self.figures = std::ptr::null();
        // The parent's connection: the child says nothing of it.
        self.bell = None;
        self.hushed = false;
    }

    fn hushed(&self) -> bool {
        self.hushed
    }

    fn figures(&self) -> Option<&Slot> {
        // SAFETY: a slot urdmad gave this connection, in memory mapped while attached.
        unsafe { self.figures.as_ref() }
    }

    fn bell(&mut self) -> Option<&mut BellWord> {
        self.bell.as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn try_exclusive(f: &std::fs::File) -> bool {
        // SAFETY: flock on a file we own.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    }

    #[test]
    fn locks_under_the_runtime_directory_are_dropped_and_others_kept() {
        let base = std::env::temp_dir().join(format!("urdma-locks-{}", std::process::id()));
        let dir = base.join("prefix");
        std::fs::create_dir_all(&dir).unwrap();
        let inside = dir.join("fbarray_memzone");
        let outside = base.join("other");
        std::fs::write(&inside, b"x").unwrap();
        std::fs::write(&outside, b"x").unwrap();
        // What a secondary's EAL holds: shared locks, descriptors kept open.
        let held: Vec<std::fs::File> = [&inside, &outside]
            .iter()
            .map(|p| {
                let f = std::fs::File::open(p).unwrap();
                // SAFETY: flock on a file we own.
                assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) }, 0);
                f
            })
            .collect();
        let (a, b) = (
            std::fs::File::open(&inside).unwrap(),
            std::fs::File::open(&outside).unwrap(),
        );
        assert!(!try_exclusive(&a), "a new primary is locked out");
        // Named through a symbolic link, as EAL names /run/dpdk.
        let link = base.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        unlock_files_under(&link);
        assert!(try_exclusive(&a), "the lock under the directory is gone");
        assert!(!try_exclusive(&b), "a lock elsewhere stays");
        drop(held);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
