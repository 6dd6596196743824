//! A connected QP's [`Flow`] on the direct path (`urdma_shared::direct`): its frames come and go
//! through the connection's own packet socket, whose rings are mapped here, instead of
//! through urdmad.
//!
//! The flow's ring from urdmad is read as well: frames that urdmad received before it
//! stopped taking the connection's frames land there, and the socket takes every later one.

use std::mem::ManuallyDrop;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use urdma_shared::bell::BellWord;
use urdma_shared::direct::{Geometry, Rings};
use urdma_shared::frame::{self, Endpoints, HEADERS};

use crate::dpdk::DpdkFlow;
use crate::engine::Flow;
use crate::log;

const BURST: u32 = 32;

/// The sockets of flows dropped, for the next holder of the provider's lock to give back to
/// urdmad (`GIVEBACK`, in `runtime::control`): the last close of a socket with rings waits
/// for three RCU grace periods, and urdmad makes it its own. Only touched under the
/// provider's lock, so never held across a fork.
static RETURNED: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());
/// Whether [`RETURNED`] holds any: it is looked at after every application call, and is
/// almost always empty. Set and cleared under the provider's lock, like [`RETURNED`].
static ANY_RETURNED: AtomicBool = AtomicBool::new(false);

/// The sockets to give back, taken.
pub fn take_returned() -> Vec<OwnedFd> {
    if !ANY_RETURNED.swap(false, Ordering::Relaxed) {
        return Vec::new();
    }
    std::mem::take(&mut *RETURNED.lock().unwrap_or_else(|e| e.into_inner()))
}

pub struct SocketFlow {
    /// The flow's ring from urdmad (what came before the hand-over).
    ring: DpdkFlow,
    /// Taken out only when the flow is dropped.
    rings: ManuallyDrop<Rings>,
    ep: Endpoints,
    /// The helper's epoll set, which holds the socket while the flow lives.
    epoll: RawFd,
    backlogged: bool,
    /// The last send left frames in the transmit ring: the kernel takes nothing from it
    /// until the next one, which must come even when trp has nothing new to send.
    unsent: bool,
    /// Sends that left frames behind so far (the first few are logged).
    send_failures: u64,
    /// The child's copy after a fork: its socket is not given back.
    forked: bool,
    /// Where the connection tells urdma.ko's bell which frame completes a receive.
    bell: Option<BellWord>,
    /// urdma.ko reads the process's hush word for the connection's frames ([`Flow::hushed`]).
    hushed: bool,
}

impl SocketFlow {
    /// Maps the rings of `sock` (laid out as `geo`) and adds it to the helper's `epoll` set.
    pub fn new(
        ring: DpdkFlow,
        sock: OwnedFd,
        geo: Geometry,
        ep: Endpoints,
        epoll: RawFd,
        bell: Option<BellWord>,
        hushed: bool,
    ) -> Result<SocketFlow, String> {
        let rings = Rings::map(sock, geo).map_err(|e| format!("cannot map its socket: {e}"))?;
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: rings.fd() as u64,
        };
        // SAFETY: valid descriptors and event.
        if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, rings.fd(), &mut ev) } != 0 {
            return Err(format!(
                "cannot watch its socket: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(SocketFlow {
            ring,
            rings: ManuallyDrop::new(rings),
            ep,
            epoll,
            backlogged: false,
            unsent: false,
            send_failures: 0,
            forked: false,
            hushed: hushed && bell.is_some(),
            bell,
        })
    }
}

impl Drop for SocketFlow {
    fn drop(&mut self) {
        // urdmad holds the same open socket, so closing ours would not take it out of the
        // set.
        // SAFETY: valid descriptors; DEL ignores the event.
        unsafe {
            libc::epoll_ctl(
                self.epoll,
                libc::EPOLL_CTL_DEL,
                self.rings.fd(),
                std::ptr::null_mut(),
            )
        };
        // SAFETY: taken once, here, and not used after.
        let rings = unsafe { ManuallyDrop::take(&mut self.rings) };
        let sock = rings.into_socket();
        if !self.forked {
            RETURNED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(sock);
            ANY_RETURNED.store(true, Ordering::Relaxed);
        }
    }
}

impl Flow for SocketFlow {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        let from_ring = self.ring.receive(handle);
        let mut taken = 0;
        {
            let mut payloads: [&[u8]; BURST as usize] = [&[]; BURST as usize];
            let mut k = 0;
            while taken < BURST {
                let Some(f) = self.rings.received(taken) else {
                    break;
                };
                taken += 1;
                // The filter admitted only this connection's addresses; the checksums and
                // the addresses are checked again here all the same.
                if let Some(p) = frame::payload(f, &self.ep) {
                    payloads[k] = p;
                    k += 1;
                }
            }
            if k > 0 {
                handle(&payloads[..k]);
            }
        }
        self.rings.release(taken);
        from_ring + taken as usize
    }

    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        let full = HEADERS + datagram;
        let mut sent = 0;
        // Only as many datagrams leave trp as the transmit ring has free slots for (see
        // DpdkFlow::transmit).
        self.backlogged = false;
        loop {
            let Some(buf) = self.rings.tx_slot() else {
                self.backlogged = true;
                break;
            };
            let Some(buf) = buf.get_mut(..full) else {
                break;
            };
            match fill(&mut buf[HEADERS..]) {
                Some(n) => {
                    let len = frame::write_headers(buf, &self.ep, n);
                    self.rings.tx_commit(len);
                    sent += 1;
                }
                None => break,
            }
        }
        // A full ring with nothing sent gets a send as well: its frames may be requested
        // ones the kernel has not taken (a send that found no room in the socket's budget,
        // or the link's queue full), and without a send they would stay there for good.
        if sent > 0 || self.unsent || self.backlogged {
            self.unsent = false;
            if let Err(e) = self.rings.kick() {
                // As a NIC that drops: trp retransmits.
                self.unsent = true;
                self.send_failures += 1;
                if self.send_failures.is_power_of_two() {
                    log::info(format_args!(
                        "sending on a connection's socket: {e} ({} times so far)",
                        self.send_failures
                    ));
                }
            }
        }
        sent
    }

    fn backlogged(&self) -> bool {
        self.backlogged
    }

    fn wakes_itself(&self) -> bool {
        true
    }

    /// The child's copies of the socket and its mapped rings are its own to close and
    /// unmap (the parent's copy stays open, so the close does not wait); the epoll set was
    /// renewed (`runtime`), so taking the socket out of it leaves
    /// the parent's set alone.
    fn forked(&mut self) {
        self.ring.forked();
        self.forked = true;
        // The parent's connection: the child says nothing of it.
        self.bell = None;
        self.hushed = false;
    }

    fn hushed(&self) -> bool {
        self.hushed
    }

    fn bell(&mut self) -> Option<&mut BellWord> {
        self.bell.as_mut()
    }

    fn figures(&self) -> Option<&urdma_shared::qpstats::Slot> {
        self.ring.figures()
    }
}
