//! Forwarding: the run loop that moves frames between the ports, their exception interfaces,
//! the flows' rings and the processes' TX rings, and sleeps when there is nothing to move.

use super::connections::Tap;
use super::{Daemon, PortState, BURST, STOP};
use crate::demux::FlowTable;
use crate::holder;
use crate::hwflow::{FlowQueue, QueueUse};
use crate::proto;
use dpdk_sys as sys;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often the control socket is polled; bounds how late a dead process is noticed.
const CONTROL_PERIOD: Duration = Duration::from_millis(2);
/// Empty polls before the loop sleeps, where only a timer ends its sleeps: a burst's next
/// frame then finds urdmad awake rather than a sleep away.
const IDLE_POLLS: u32 = 256;
/// How long an idle urdmad sleeps when every port's frames end a sleep and no handshake is
/// under way: it then has nothing a timer must start (a few request expiries of seconds).
const QUIET_SLEEP: Duration = Duration::from_millis(100);
/// Idle this long, the sleep between polls starts doubling (up to `idle_sleep_max_us`).
const BACKOFF_AFTER: Duration = Duration::from_millis(100);

/// What ended an idle sleep.
pub(super) enum Woken {
    /// A control socket or the kernel's channel.
    Request,
    /// A process's doorbell, or frames found on a TX ring before sleeping.
    Kick,
    /// A port's descriptor.
    Frame,
    Timer,
}

/// Hands `pkts` to a port's TX queue 0; returns (sent, dropped) after freeing the unsent.
pub(super) unsafe fn tx_all(port: u16, pkts: &mut [*mut sys::rte_mbuf]) -> (u64, u64) {
    if pkts.is_empty() {
        return (0, 0);
    }
    let sent = usize::from(sys::rte_eth_tx_burst(
        port,
        0,
        pkts.as_mut_ptr(),
        pkts.len() as u16,
    ));
    for &m in &pkts[sent..] {
        sys::rte_pktmbuf_free(m);
    }
    (sent as u64, (pkts.len() - sent) as u64)
}

/// Frees the frames whose source is the port's own MAC and packs the others at the front of
/// `rx`; returns how many remain. Such frames are our own transmissions coming back: an
/// af_packet port whose sends go through the kernel's queueing (needed for `tc` on the link)
/// also receives a copy of every frame it sends. Classified, they would all be handed to the
/// kernel, at the cost of a TAP write each, only for the kernel to drop them as addressed to
/// another host.
///
/// # Safety
/// Every pointer in `rx` is a received mbuf owned by the caller.
pub(super) unsafe fn drop_echoes(rx: &mut [*mut sys::rte_mbuf], own: &[u8; 6]) -> usize {
    let mut kept = 0;
    for i in 0..rx.len() {
        let m = rx[i];
        if src_mac_is(m, own) {
            sys::rte_pktmbuf_free(m);
        } else {
            rx[kept] = m;
            kept += 1;
        }
    }
    kept
}

/// Receives one burst from a flow queue. A queue steered to a flow moves the burst onto the
/// flow's ring as it is (the rule already chose these frames); any other queue's frames are
/// classified in software and the kernel's sent to the exception path. Returns the count.
///
/// # Safety
/// The port is started; `rx` and `kernel` are scratch space of at least [`BURST`].
pub(super) unsafe fn poll_flow_queue(
    port: u16,
    exception: u16,
    q: &mut FlowQueue,
    flows: &mut FlowTable,
    rx: &mut [*mut sys::rte_mbuf; BURST],
    kernel: &mut Vec<*mut sys::rte_mbuf>,
    (tap, pi): (&mut Tap, usize),
) -> usize {
    let n = usize::from(sys::rte_eth_rx_burst(
        port,
        q.id,
        rx.as_mut_ptr(),
        BURST as u16,
    ));
    if n == 0 {
        return 0;
    }
    match q.state {
        QueueUse::Flow { slot, ring, .. } => {
            let client = flows.get(slot).map_or(0, |f| f.holder);
            let verdicts = flows.get(slot).map(|f| f.judge(&rx[..n]));
            for &m in &rx[..n] {
                holder::mark(m, client);
            }
            let done = sys::rte_ring_sp_enqueue_burst(
                ring,
                rx.as_ptr() as *const *mut std::ffi::c_void,
                n as u32,
                std::ptr::null_mut(),
            ) as usize;
            let mut bytes = 0u64;
            for &m in &rx[..done] {
                bytes += u64::from((*m).pkt_len);
            }
            for &m in &rx[done..n] {
                holder::free(m);
            }
            q.rx_packets += done as u64;
            q.rx_bytes += bytes;
            q.drops += (n - done) as u64;
            if let (Some(f), Some(v)) = (flows.get_mut(slot), verdicts) {
                f.rx_packets += done as u64;
                f.rx_bytes += bytes;
                f.drops += (n - done) as u64;
                let mut rings = Vec::new();
                f.enqueued(slot, &v[..done], &mut rings);
                flows.add_rings(&rings);
            }
        }
        QueueUse::Free | QueueUse::Quarantined => {
            q.strays += n as u64;
            kernel.clear();
            flows.dispatch(&rx[..n], kernel);
            take_cm_frames(tap, pi, kernel);
            tx_all(exception, kernel);
        }
    }
    n
}

/// Takes the connection-management frames out of those bound for the kernel: copied into
/// `tap.frames`, the mbufs freed.
///
/// # Safety
/// Every pointer in `kernel` is a valid mbuf owned by the caller.
pub(super) unsafe fn take_cm_frames(
    tap: &mut Tap,
    pi: usize,
    kernel: &mut Vec<*mut sys::rte_mbuf>,
) {
    if !tap.enabled {
        return;
    }
    kernel.retain(|&m| {
        let frame = std::slice::from_raw_parts(
            sys::rte_pktmbuf_mtod::<u8>(m) as *const u8,
            usize::from((*m).data_len),
        );
        if tap.wants(pi, frame) {
            tap.frames.push((pi, frame.to_vec()));
            sys::rte_pktmbuf_free(m);
            false
        } else {
            true
        }
    });
}

/// Whether the six bytes at `off` in a frame's first segment are `mac`.
///
/// # Safety
/// `m` is a valid mbuf.
pub(super) unsafe fn mac_at_is(m: *mut sys::rte_mbuf, off: usize, mac: &[u8; 6]) -> bool {
    usize::from((*m).data_len) >= off + 6
        && std::slice::from_raw_parts(sys::rte_pktmbuf_mtod::<u8>(m).add(off) as *const u8, 6)
            == mac
}

/// Whether a frame's destination MAC is `mac`.
///
/// # Safety
/// `m` is a valid mbuf.
pub(super) unsafe fn dst_mac_is(m: *mut sys::rte_mbuf, mac: &[u8; 6]) -> bool {
    mac_at_is(m, 0, mac)
}

/// Whether a frame's source MAC is `mac`.
///
/// # Safety
/// `m` is a valid mbuf.
pub(super) unsafe fn src_mac_is(m: *mut sys::rte_mbuf, mac: &[u8; 6]) -> bool {
    mac_at_is(m, 6, mac)
}

/// Classifies frames of this node as if the port had received them (loopback): to their
/// flows, to urdmad's connection management, or to the kernel.
///
/// # Safety
/// Every pointer in `mbufs` (at most [`BURST`]) is a valid mbuf owned by the caller.
pub(super) unsafe fn ingest_local(
    p: &mut PortState,
    tap: &mut Tap,
    pi: usize,
    mbufs: &[*mut sys::rte_mbuf],
    kernel: &mut Vec<*mut sys::rte_mbuf>,
) {
    kernel.clear();
    p.flows.dispatch(mbufs, kernel);
    take_cm_frames(tap, pi, kernel);
    let (sent, dropped) = tx_all(p.port.exception_id, kernel);
    p.to_kernel += sent;
    p.to_kernel_drops += dropped;
}

impl Daemon {
    /// Polls until [`STOP`] is set.
    pub fn run(&mut self) {
        let mut kernel_q: Vec<*mut sys::rte_mbuf> = Vec::with_capacity(BURST);
        let mut rx = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        let mut kernel: Vec<*mut sys::rte_mbuf> = Vec::with_capacity(BURST);
        let mut next_control = Instant::now();
        let mut idle = 0u32;
        let idle_sleep = Duration::from_micros(u64::from(self.cfg.daemon.idle_sleep_us));
        let idle_sleep_max = Duration::from_micros(u64::from(
            self.cfg
                .daemon
                .idle_sleep_max_us
                .max(self.cfg.daemon.idle_sleep_us),
        ));
        let mut idle_since: Option<Instant> = None;
        let mut sleep = idle_sleep;
        // The last sleep ended for a port's descriptor; the sweeps after say if it was real.
        let mut port_woke = false;
        while !STOP.load(Ordering::Relaxed) {
            let mut work = 0usize;
            for (pi, p) in self.ports.iter_mut().enumerate() {
                let tap = &mut self.tap;
                // SAFETY: ports are started; every mbuf is passed on exactly once.
                unsafe {
                    let port = p.port.id;
                    let n = if p.rx_stash.is_empty() {
                        usize::from(sys::rte_eth_rx_burst(
                            port,
                            0,
                            rx.as_mut_ptr(),
                            BURST as u16,
                        ))
                    } else {
                        let n = p.rx_stash.len();
                        rx[..n].copy_from_slice(&p.rx_stash);
                        p.rx_stash.clear();
                        n
                    };
                    if n > 0 {
                        work += n;
                        let kept = if p.may_echo {
                            drop_echoes(&mut rx[..n], &p.port.mac.0)
                        } else {
                            n
                        };
                        p.echoes += (n - kept) as u64;
                        let n = kept;
                        kernel.clear();
                        p.flows.dispatch(&rx[..n], &mut kernel);
                        take_cm_frames(tap, pi, &mut kernel);
                        let (sent, dropped) = tx_all(p.port.exception_id, &mut kernel);
                        p.to_kernel += sent;
                        p.to_kernel_drops += dropped;
                    }
                    for q in p.queues.iter_mut() {
                        if let QueueUse::Flow { .. } = q.state {
                            work += poll_flow_queue(
                                port,
                                p.port.exception_id,
                                q,
                                &mut p.flows,
                                &mut rx,
                                &mut kernel_q,
                                (tap, pi),
                            );
                        }
                    }
                    let n = usize::from(sys::rte_eth_rx_burst(
                        p.port.exception_id,
                        0,
                        rx.as_mut_ptr(),
                        BURST as u16,
                    ));
                    if n > 0 {
                        work += n;
                        let (sent, dropped) = tx_all(port, &mut rx[..n]);
                        p.from_kernel += sent;
                        p.from_kernel_drops += dropped;
                    }
                }
            }
            let pool = self.pool;
            for c in self.clients.iter_mut() {
                let Some(a) = &mut c.attached else { continue };
                // Not work: mbufs given back need no quick answer, and a refill before
                // each sleep leaves every process something to send with.
                // SAFETY: urdmad's thread, its pool; the process's rings while attached.
                unsafe { a.lender.serve(pool) };
                for (pi, t) in a.tx.iter_mut().enumerate() {
                    // SAFETY: the ring holds mbufs the process handed over.
                    unsafe {
                        let n = sys::rte_ring_sc_dequeue_burst(
                            t.ring,
                            rx.as_mut_ptr() as *mut *mut std::ffi::c_void,
                            BURST as u32,
                            std::ptr::null_mut(),
                        ) as usize;
                        if n > 0 {
                            work += n;
                            for &m in &rx[..n] {
                                holder::mark(m, 0);
                            }
                            let p = &mut self.ports[pi];
                            let mac = p.port.mac.0;
                            let (sent, dropped) = if rx[..n].iter().any(|&m| dst_mac_is(m, &mac)) {
                                // Frames to the port's own MAC (two processes of this node)
                                // are received here rather than sent.
                                let mut wire = Vec::with_capacity(n);
                                let mut local = Vec::with_capacity(n);
                                for &m in &rx[..n] {
                                    if dst_mac_is(m, &mac) {
                                        local.push(m);
                                    } else {
                                        wire.push(m);
                                    }
                                }
                                p.loopback += local.len() as u64;
                                let nlocal = local.len() as u64;
                                ingest_local(p, &mut self.tap, pi, &local, &mut kernel);
                                let (s, d) = tx_all(p.port.id, &mut wire);
                                (s + nlocal, d)
                            } else {
                                tx_all(p.port.id, &mut rx[..n])
                            };
                            p.from_processes += sent;
                            p.from_processes_drops += dropped;
                            t.packets += sent;
                            t.drops += dropped;
                        }
                    }
                }
            }
            self.ring_bells();
            if !self.tap.frames.is_empty() {
                work += self.cm_frames();
            }
            if work > 0 && !self.armed.is_empty() {
                self.check_wakes();
            }
            let late = self.check_late();
            let now = Instant::now();
            // A pass that moved nothing looks for requests as a sleep would: a request
            // met while urdmad polls on (a connection's ACCEPT, a process's QP) is served
            // now, not at the next CONTROL_PERIOD.
            if work == 0 && now < next_control && self.requests_waiting() {
                next_control = now;
            }
            if now >= next_control {
                next_control = now + CONTROL_PERIOD;
                // Queues of no flow receive nothing while the catch-all rule holds; they
                // are looked at rarely, and whatever is found is steered in software.
                for (pi, p) in self.ports.iter_mut().enumerate() {
                    for q in p.queues.iter_mut() {
                        if !matches!(q.state, QueueUse::Flow { .. }) {
                            // SAFETY: the port is started; mbufs are passed on once.
                            work += unsafe {
                                poll_flow_queue(
                                    p.port.id,
                                    p.port.exception_id,
                                    q,
                                    &mut p.flows,
                                    &mut rx,
                                    &mut kernel_q,
                                    (&mut self.tap, pi),
                                )
                            };
                        }
                    }
                }
                self.ring_bells();
                self.serve_control();
            }
            if port_woke {
                // The sweep after a sleep that a port's descriptor ended: one that found
                // nothing makes the next sleep a timer's (idle.rs).
                port_woke = false;
                if work == 0 {
                    self.idle.spurious = true;
                    self.idle.spurious_wakes += 1;
                }
            }
            if work == 0 {
                idle = idle.saturating_add(1);
                if idle > self.idle_polls() && !idle_sleep.is_zero() {
                    // Idle. When frames end a sleep (idle.rs), sleep until the next timer;
                    // otherwise sleep idle_sleep between looks, and after BACKOFF_AFTER
                    // double it up to idle_sleep_max.
                    let since = *idle_since.get_or_insert(now);
                    let d = if self.idle.frames_wake() {
                        // Nothing but a frame, a request, a kick or a timer bounded below
                        // (the connection manager's, a process's) can give it work, and
                        // each of those ends the sleep: a handshake's Accept is a frame.
                        QUIET_SLEEP.max(idle_sleep_max)
                    } else if now.saturating_duration_since(since) < BACKOFF_AFTER {
                        idle_sleep
                    } else {
                        sleep = (sleep * 2).min(idle_sleep_max);
                        sleep
                    };
                    // Not past the connection manager's next timer (a request waiting for
                    // its listener, `cm::LISTEN_GRACE`).
                    let d = self.cm.poll_timeout().map_or(d, |t| {
                        d.min(t.max(next_control).saturating_duration_since(now))
                    });
                    // Nor past the time a process gave for its next call (wakes.rs).
                    let d = late.map_or(d, |l| d.min(l));
                    match self.sleep(d) {
                        Woken::Request => {
                            next_control = Instant::now();
                            idle_since = None;
                            sleep = idle_sleep;
                        }
                        Woken::Frame => {
                            port_woke = true;
                            idle_since = None;
                            sleep = idle_sleep;
                        }
                        Woken::Kick | Woken::Timer => {}
                    }
                    if !port_woke {
                        // A timer's sleep after a spurious wake-up: the ports may be
                        // trusted again.
                        self.idle.spurious = false;
                    }
                    // A sweep follows at once; it decides whether the next sleep can
                    // trust the ports' descriptors, and if it finds nothing, urdmad sleeps
                    // again without a spin.
                    idle = IDLE_POLLS;
                }
            } else {
                idle = 0;
                idle_since = None;
                sleep = idle_sleep;
            }
        }
    }

    /// Empty passes before a sleep. None where a frame, a request and a kick each end the
    /// sleep: a spin there would only hold requests back until the next `CONTROL_PERIOD`
    /// (a connection's ACCEPT, a process's QP) and take the CPU that the processes it
    /// serves need on a host whose cores they share.
    fn idle_polls(&self) -> u32 {
        if self.idle.frames_wake() {
            0
        } else {
            IDLE_POLLS
        }
    }

    /// Sleeps up to `limit`, or until a request, a process's kick or (when the ports can
    /// say so) a frame comes; says which.
    pub(super) fn sleep(&mut self, limit: Duration) -> Woken {
        self.control_ready = None;
        let bell = self.idle.bell();
        bell.going_to_sleep();
        // The last look, after the flag is up: a frame put on a TX ring, or mbufs taken,
        // before a process could see the flag are found here (doorbell.rs).
        if self.clients_need_a_pass() {
            self.idle.bell().awake();
            return Woken::Kick;
        }
        let ports: &[std::os::fd::RawFd] = if self.idle.frames_wake() {
            self.idle.port_fds()
        } else {
            &[]
        };
        let control = self.control_fds();
        let mut fds: Vec<libc::pollfd> = control
            .iter()
            .chain(std::iter::once(&self.idle.kick_fd()))
            .chain(ports)
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let control = control.len();
        let armed = !ports.is_empty() && self.arm_interrupts();
        if armed && self.ports.iter().any(|p| !p.rx_stash.is_empty()) {
            // An interrupt the look's frames raised after the arming is read here, so that
            // it does not end the next sleep for nothing.
            self.idle.disarm(super::idle::readable);
            self.idle.bell().awake();
            return Woken::Frame;
        }
        let ts = libc::timespec {
            tv_sec: limit.as_secs() as libc::time_t,
            tv_nsec: limit.subsec_nanos() as libc::c_long,
        };
        // SAFETY: fds is a valid array of pollfd, ts a valid timespec.
        let n = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        self.idle.bell().awake();
        if armed {
            self.idle
                .disarm(|fd| fds.iter().any(|f| f.fd == fd && f.revents != 0));
        }
        if n <= 0 {
            return Woken::Timer;
        }
        let kicked = fds[control].revents != 0;
        if kicked {
            self.idle.drain_kicks();
        }
        if fds[..control].iter().any(|f| f.revents != 0) {
            self.control_ready = Some(super::control::ControlReady::of(&fds[..control]));
            return Woken::Request;
        }
        if kicked {
            return Woken::Kick;
        }
        Woken::Frame
    }

    /// Arms the ports' RX interrupts for a sleep, then looks at their queues once more: a
    /// frame that came between the last pass and the arming raised no interrupt, and waits
    /// in the port's stash for the next pass. Whether any port is armed.
    fn arm_interrupts(&mut self) -> bool {
        let mut armed = false;
        for id in self.idle.arm() {
            armed = true;
            let Some(p) = self.ports.iter_mut().find(|p| p.port.id == id) else {
                continue;
            };
            p.rx_stash.resize(BURST, std::ptr::null_mut());
            // SAFETY: a started port; the mbufs are kept for the next pass, which takes them
            // on exactly once.
            let n = unsafe { sys::rte_eth_rx_burst(id, 0, p.rx_stash.as_mut_ptr(), BURST as u16) };
            p.rx_stash.truncate(usize::from(n));
        }
        armed
    }

    /// What carries requests: the control socket, every process's socket, the kernel's
    /// channel.
    pub(super) fn control_fds(&self) -> Vec<std::os::fd::RawFd> {
        std::iter::once(self.listener.as_raw_fd())
            .chain(self.clients.iter().map(|c| c.stream.as_raw_fd()))
            .chain(self.chan.as_ref().map(|ch| ch.as_raw_fd()))
            .collect()
    }

    /// Whether a request waits on any of [`Daemon::control_fds`].
    fn requests_waiting(&self) -> bool {
        let mut fds: Vec<libc::pollfd> = self
            .control_fds()
            .into_iter()
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: fds is a valid array of pollfd; a zero timeout only looks.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) > 0 }
    }

    /// Whether any process's TX ring holds frames, or its alloc ring wants a refill.
    pub(super) fn clients_need_a_pass(&self) -> bool {
        self.clients
            .iter()
            .filter_map(|c| c.attached.as_ref())
            .any(|a| {
                a.lender.wants_refill()
                    // SAFETY: the ring lives while the process is attached.
                    || a.tx.iter().any(|t| unsafe { sys::rte_ring_count(t.ring) } > 0)
            })
    }

    /// Sends one UDP datagram of urdmad's own (handshake, Reject, Abort) on a port; to the
    /// port's own MAC it is received here instead.
    pub(super) fn send_datagram(
        &mut self,
        pi: usize,
        dst_mac: proto::Mac,
        src: std::net::SocketAddrV4,
        dst: std::net::SocketAddrV4,
        payload: &[u8],
    ) {
        let p = &mut self.ports[pi];
        let frame = crate::frame::udp_frame(dst_mac.0, p.port.mac.0, src, dst, payload);
        let Ok(len) = u16::try_from(frame.len()) else {
            return;
        };
        // SAFETY: the mbuf comes from the pool and is handed on or freed exactly once.
        unsafe {
            let m = sys::rte_pktmbuf_alloc(self.pool);
            if m.is_null() {
                tracing::warn!("mbuf pool exhausted: a connection datagram is dropped");
                return;
            }
            let d = sys::rte_pktmbuf_append(m, len) as *mut u8;
            if d.is_null() {
                sys::rte_pktmbuf_free(m);
                return;
            }
            std::ptr::copy_nonoverlapping(frame.as_ptr(), d, frame.len());
            if dst_mac == p.port.mac {
                p.loopback += 1;
                let mut kernel = Vec::with_capacity(1);
                ingest_local(p, &mut self.tap, pi, &[m], &mut kernel);
            } else {
                tx_all(p.port.id, &mut [m]);
            }
        }
    }
}
