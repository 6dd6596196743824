//! A connected QP's [`Flow`] on the direct path (`urdma_shared::direct`): its frames come and go
//! through the connection's own packet socket, whose rings are mapped here, instead of
//! through urdmad.
//!
//! The flow's ring from urdmad is read as well: frames that urdmad received before it
//! stopped taking the connection's frames land there, and the socket takes every later one.
//!
//! # Parked sockets
//! Setting a socket's rings up costs the kernel grace periods and cleared pages, and the
//! process a mapping, for every connection. So when a connection whose `CONNECTED` said
//! `park` ends, its socket stays here with its rings and its bell word mapped ([`PARK_MAX`]
//! at most) and urdmad hears of it (`PARK`); urdmad aims its filter at a later connection of
//! this process and names it in that connection's `reuse`. A socket whose copies a forked child
//! may hold (it was open at a fork) is given back instead: only this process ever sees
//! what a parked socket receives next.

use std::mem::ManuallyDrop;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use urdma_shared::bell::BellWord;
use urdma_shared::direct::{Geometry, Rings};

use crate::error::Error;
use urdma_shared::frame::{self, Endpoints, HEADERS};

use crate::dpdk::DpdkFlow;
use crate::engine::Flow;
use crate::log;

const BURST: u32 = 32;

/// The sockets of flows dropped, for the next holder of the provider's lock to give back to
/// urdmad (`GIVEBACK`, in `process::control`): the last close of a socket with rings waits
/// for three RCU grace periods, and urdmad makes it its own. Only touched under the
/// provider's lock, so never held across a fork.
static RETURNED: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());
/// Whether [`RETURNED`] holds any, or a socket was parked: it is looked at after every
/// application call, and is almost always false. Set and cleared under the provider's
/// lock, like [`RETURNED`].
static ANY_RETURNED: AtomicBool = AtomicBool::new(false);

/// What urdmad is to hear of, taken: the sockets to give back (`GIVEBACK`) and the cookies of
/// those parked since the last call (`PARK`).
pub fn take_for_urdmad() -> (Vec<OwnedFd>, Vec<u64>) {
    if !ANY_RETURNED.swap(false, Ordering::Relaxed) {
        return (Vec::new(), Vec::new());
    }
    let returned = std::mem::take(&mut *RETURNED.lock().unwrap_or_else(|e| e.into_inner()));
    (returned, std::mem::take(&mut parked().untold))
}

/// Most sockets a process keeps parked; each is a connection's rings (1.25 MiB with 512-slot
/// receive rings at a 1500-byte MTU).
pub const PARK_MAX: usize = 16;

/// The sockets parked, with their rings mapped, and the cookies urdmad has not heard of
/// yet. Only touched under the provider's lock, like [`RETURNED`].
static PARKED: Mutex<Parked> = Mutex::new(Parked::EMPTY);

struct Parked {
    rings: Vec<(u64, Rings, Option<BellWord>)>,
    untold: Vec<u64>,
}

fn parked() -> std::sync::MutexGuard<'static, Parked> {
    PARKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forks so far in this process: a socket open at a fork is never parked (see the
/// module's comment).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// In the parent, after a fork: the sockets open now may have copies in the child.
pub fn forked_parent() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Takes the parked socket `cookie`, with its rings and its bell word, for a new connection.
pub fn take_parked(cookie: u64) -> Option<(Rings, Option<BellWord>)> {
    parked().take(cookie)
}

/// Unmaps and closes every parked socket: in a forked child (its copies), or when urdmad,
/// which would have used them again, is gone.
pub fn forget_parked() {
    let mut p = parked();
    p.untold.clear();
    drop(std::mem::take(&mut p.rings));
}

/// Parks the rings of an ended connection's socket when it may be (urdmad said `park`, no
/// fork came since `forks`, fewer than [`PARK_MAX`] parked, its cookie known); gives it
/// back otherwise.
fn dispose(rings: Rings, bell: Option<BellWord>, park: bool, forks: u64) {
    let now = FORKS.load(Ordering::Relaxed);
    let back = parked().keep(rings, bell, park && forks == now);
    if let Some(sock) = back {
        give_back(sock);
    } else {
        ANY_RETURNED.store(true, Ordering::Relaxed);
    }
}

impl Parked {
    const EMPTY: Parked = Parked {
        rings: Vec::new(),
        untold: Vec::new(),
    };

    /// Parks `rings` if `may` and there is room (its cookie known); otherwise the socket
    /// to give back.
    fn keep(&mut self, mut rings: Rings, bell: Option<BellWord>, may: bool) -> Option<OwnedFd> {
        if may && self.rings.len() < PARK_MAX {
            if let Ok(cookie) = urdma_shared::direct::socket_cookie(rings.fd()) {
                rings.drain();
                self.rings.push((cookie, rings, bell));
                self.untold.push(cookie);
                return None;
            }
        }
        Some(rings.into_socket())
    }

    fn take(&mut self, cookie: u64) -> Option<(Rings, Option<BellWord>)> {
        let i = self.rings.iter().position(|(c, ..)| *c == cookie)?;
        let (_, rings, bell) = self.rings.swap_remove(i);
        Some((rings, bell))
    }
}

fn give_back(sock: OwnedFd) {
    RETURNED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(sock);
    ANY_RETURNED.store(true, Ordering::Relaxed);
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
    /// urdmad takes the socket back parked when the connection ends (`CONNECTED`'s `park`).
    park: bool,
    /// [`FORKS`] when the socket came: parked only if no fork came since.
    forks: u64,
    /// urdma.ko reads the process's hush word for the connection's frames ([`Flow::hushed`]).
    hushed: bool,
}

impl SocketFlow {
    /// The flow on `rings` (a new socket's, mapped by [`map`], or a parked one's), added to
    /// the helper's `epoll` set.
    pub fn new(
        ring: DpdkFlow,
        rings: Rings,
        ep: Endpoints,
        epoll: RawFd,
        bell: Option<BellWord>,
        hushed: bool,
        park: bool,
    ) -> Result<SocketFlow, Error> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: rings.fd() as u64,
        };
        // SAFETY: valid descriptors and event.
        if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, rings.fd(), &mut ev) } != 0 {
            return Err(Error::last_os("watching the connection's socket"));
        }
        Ok(SocketFlow {
            ring,
            rings: ManuallyDrop::new(rings),
            park,
            forks: FORKS.load(Ordering::Relaxed),
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

/// Maps the rings of a new connection's `sock`, laid out as `geo`.
pub fn map(sock: OwnedFd, geo: Geometry) -> Result<Rings, Error> {
    Rings::map(sock, geo).map_err(|e| Error::os("mapping the connection's socket", &e))
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
        if self.forked {
            // The parent's socket: the child's copy just closes.
            return;
        }
        dispose(rings, self.bell.take(), self.park, self.forks);
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
    /// renewed (`process`), so taking the socket out of it leaves
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

#[cfg(test)]
mod tests {
    use super::*;
    use urdma_shared::direct::prepare_socket;

    fn rings() -> Rings {
        let geo = Geometry::new(1000, 4);
        let sock = prepare_socket(geo).expect("a packet socket (the tests run as root)");
        map(sock, geo).unwrap()
    }

    fn cookie(r: &Rings) -> u64 {
        urdma_shared::direct::socket_cookie(r.fd()).unwrap()
    }

    /// On a table of its own: the process's is shared with every other test.
    #[test]
    fn sockets_are_parked_up_to_the_bound_and_only_when_they_may_be() {
        let mut p = Parked::EMPTY;
        let r = rings();
        let c = cookie(&r);
        assert!(p.keep(r, None, true).is_none());
        assert_eq!(std::mem::take(&mut p.untold), [c]);
        let (again, _) = p.take(c).expect("parked");
        assert_eq!(again.geometry(), Geometry::new(1000, 4));
        assert!(p.take(c).is_none(), "taken once");
        // Not to be parked (unasked, or open at a fork): given back.
        assert!(p.keep(again, None, false).is_some());
        // At most PARK_MAX.
        let back: Vec<_> = (0..=PARK_MAX)
            .filter_map(|_| p.keep(rings(), None, true))
            .collect();
        assert_eq!((back.len(), p.untold.len()), (1, PARK_MAX));
    }

    #[test]
    fn a_socket_open_at_a_fork_is_not_parked() {
        let before = FORKS.load(Ordering::Relaxed);
        forked_parent();
        assert_ne!(FORKS.load(Ordering::Relaxed), before);
        // What `dispose` asks of the table for a socket that came before the fork.
        let mut p = Parked::EMPTY;
        let now = FORKS.load(Ordering::Relaxed);
        assert!(p.keep(rings(), None, before == now).is_some());
    }
}
