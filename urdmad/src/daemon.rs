//! The running daemon: one thread that polls every port, its exception interface and every
//! process's TX ring, and between bursts serves the control socket.

use crate::access::{self, Peer};
use crate::config::Config;
use crate::demux::FlowTable;
use crate::holder;
use crate::hwflow::{self, FlowQueue, Match, QueueUse};
use crate::lending::Lender;
use crate::port::{self, Port, SteeringError};
use crate::proto::{self, Attachment, ErrorCode, FlowSpec, PortInfo, Request, Response, Steering};
use crate::service::{ServiceError, StartupError};
use crate::socket_keeper::SocketKeeper;
use crate::status::{self, Record};
use dpdk_sys as sys;
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod cm;
mod counters;
mod device;
mod direct;
mod idle;

const BURST: usize = 32;
/// How often the control socket is polled; bounds how late a dead process is noticed.
const CONTROL_PERIOD: Duration = Duration::from_millis(2);
/// Empty polls before the loop starts sleeping between polls (small machines share cores).
const IDLE_POLLS: u32 = 256;
/// How long an idle urdmad sleeps when every port's frames end a sleep and no handshake is
/// under way: it then has nothing a timer must start (a few request expiries of seconds).
const QUIET_SLEEP: Duration = Duration::from_millis(100);
/// Idle this long, the sleep between polls starts doubling (up to `idle_sleep_max_us`).
const BACKOFF_AFTER: Duration = Duration::from_millis(100);
pub const POOL_NAME: &str = "urd_mbufs";
/// Connections beyond this are closed at once.
const MAX_CONNECTIONS: usize = 1024;
/// A refused peer gets this long to send its first request, which is answered with the
/// refusal, before it is disconnected regardless.
const REFUSAL_GRACE: Duration = Duration::from_secs(1);
/// Descriptors a client sent with requests other than `GIVEBACK` that are kept (the oldest
/// beyond go): a process sends one per `GIVEBACK`, on the same line.
const MAX_HELD_FDS: usize = 8;
const POOL_CACHE: u32 = 256;
/// The pool's mempool operations: the default ones. Only urdmad uses them (processes
/// borrow mbufs through rings of their own, lending.rs), so they need no agreement with
/// any other process.
const POOL_OPS: &str = "ring_mp_mc";

/// Set by SIGTERM/SIGINT.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Per-port state beyond the port itself.
struct PortState {
    port: Port,
    flows: FlowTable,
    /// The port's flow queues; queue `i + 1` is `queues[i]`.
    queues: Vec<FlowQueue>,
    to_kernel: u64,
    to_kernel_drops: u64,
    from_kernel: u64,
    from_kernel_drops: u64,
    from_processes: u64,
    from_processes_drops: u64,
    /// Frames to the port's own MAC, received here instead of sent.
    loopback: u64,
    /// Our own transmissions seen again on receive (see [`drop_echoes`]).
    echoes: u64,
    /// Whether the port can hand us back our own frames ([`port::may_echo`]).
    may_echo: bool,
    /// The direct path ([`crate::direct`]), where the port offers it.
    direct: Option<direct::DirectPort>,
    /// Why it does not (status).
    direct_off: String,
    /// The af_packet PMD's sockets of the port, DPDK's: the kernel drops frames there when
    /// their rings are full, and the PMD of DPDK 22.11 does not count those (`rx_missed`
    /// stays 0), so urdmad reads them itself.
    sockets: Vec<std::os::fd::RawFd>,
    /// What those sockets' kernel counters said so far (reading them resets them).
    socket_drops: std::cell::Cell<u64>,
    /// Connections handed to their processes since urdmad started: on the direct path, and
    /// with their frames forwarded through urdmad.
    conns_direct: u64,
    conns_forwarded: u64,
    /// The urdma device urdmad keeps on the exception interface, when configured.
    rdma: Option<device::RdmaDevice>,
    /// What closed flows left to the port's counters.
    departed: counters::Departed,
    /// The counters last sent to the kernel on the current channel.
    pushed: Option<counters::PortCounters>,
}

struct FlowRec {
    port: u16,
    slot: u32,
    client: u32,
    ring_name: String,
    /// The flow queue steered to this flow, with hardware steering.
    queue: Option<u16>,
    /// Why a flow on a hardware-steered port is steered in software.
    fallback: Option<String>,
    /// The connection's own socket, when it is on the direct path.
    direct: Option<direct::DirectSock>,
    /// Its QP's slot in the table of QP figures, for a connection's flow.
    stats: Option<u32>,
}

struct TxRing {
    name: String,
    ring: *mut sys::rte_ring,
    packets: u64,
    drops: u64,
}

struct Attached {
    lcore: u32,
    /// One per port, indexed like `Daemon::ports`.
    tx: Vec<TxRing>,
    /// The mbufs the process sends and gives back (lending.rs).
    lender: Lender,
}

struct Client {
    id: u32,
    peer: Peer,
    stream: UnixStream,
    buf: Vec<u8>,
    greeted: bool,
    /// Why the peer may not use urdmad, and when it is disconnected regardless.
    refused: Option<(String, Instant)>,
    attached: Option<Attached>,
    flows: Vec<u32>,
    /// Descriptors that came with its requests, for the `GIVEBACK`s among them.
    fds: VecDeque<OwnedFd>,
}

pub struct Daemon {
    cfg: Config,
    pool: *mut sys::rte_mempool,
    ports: Vec<PortState>,
    listener: UnixListener,
    allowed_gid: Option<u32>,
    clients: Vec<Client>,
    flows: BTreeMap<u32, FlowRec>,
    next_client: u32,
    next_flow: u32,
    /// lcore ids handed to processes; 0 is urdmad's own.
    lcores_used: Vec<bool>,
    rings: usize,
    started: Instant,
    /// Connection management (docs/connection.md).
    cm: cm::Cm,
    /// What ends an idle sleep.
    idle: idle::Idle,
    /// Released processes, (pid, client id), until they no longer run: then the mbufs they
    /// held are taken back and their DPDK runtime files removed ([`Daemon::sweep`]).
    departed: Vec<(u32, u32)>,
    swept_at: Instant,
    /// Where processes keep their connected QPs' figures.
    qp_table: counters::QpTable,
    /// Makes the direct path's sockets ready and closes them (`socket_keeper`); why not.
    keeper: Result<Arc<SocketKeeper>, String>,
    /// When the ports' counters may next go to the kernel.
    next_push: Instant,
}

/// What ended an idle sleep.
enum Woken {
    /// A control socket or the kernel's channel.
    Request,
    /// A process's doorbell, or frames found on a TX ring before sleeping.
    Kick,
    /// A port's descriptor.
    Frame,
    Timer,
}

/// A flow opened for a process.
struct FlowSpecOpened {
    flow: u32,
    rx_ring: String,
    steering: Steering,
    queue: Option<u16>,
}

/// Why a flow's or a process's ring was not created.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("ring name")]
    Name,
    /// `reason` is `rte_strerror` of DPDK's error.
    #[error("cannot create ring {name}: {reason}")]
    Create { name: String, reason: String },
}

/// A single-producer, single-consumer ring of `size` slots: a power of two of which one
/// stays empty, or exactly `size` when `exact`.
pub(crate) fn ring_create(
    name: &str,
    size: u32,
    exact: bool,
) -> Result<*mut sys::rte_ring, RingError> {
    let c = CString::new(name).map_err(|_| RingError::Name)?;
    let exact = if exact { sys::RING_F_EXACT_SZ } else { 0 };
    // SAFETY: valid name.
    let r = unsafe {
        sys::rte_ring_create(
            c.as_ptr(),
            size,
            sys::SOCKET_ID_ANY,
            sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ | exact,
        )
    };
    if r.is_null() {
        Err(RingError::Create {
            name: name.to_string(),
            reason: sys::rte_strerror_string(sys::rte_errno()),
        })
    } else {
        Ok(r)
    }
}

/// Whether process `pid` still runs: it exists and is not a zombie (which holds no memory
/// and no locks any more).
fn runs(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which ends with the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// Frees the TX rings of an `ATTACH` that failed half-way.
fn free_new_rings(tx: Vec<TxRing>) {
    for t in tx {
        // SAFETY: just created, never handed out.
        unsafe { sys::rte_ring_free(t.ring) };
    }
}

/// Frees every mbuf left on a ring, then the ring.
pub(crate) unsafe fn ring_drain_free(r: *mut sys::rte_ring) {
    let mut objs = [std::ptr::null_mut::<std::ffi::c_void>(); BURST];
    loop {
        let n = sys::rte_ring_sc_dequeue_burst(
            r,
            objs.as_mut_ptr(),
            BURST as u32,
            std::ptr::null_mut(),
        );
        if n == 0 {
            break;
        }
        for &o in &objs[..n as usize] {
            holder::free(o as *mut sys::rte_mbuf);
        }
    }
    sys::rte_ring_free(r);
}

/// Hands `pkts` to a port's TX queue 0; returns (sent, dropped) after freeing the unsent.
unsafe fn tx_all(port: u16, pkts: &mut [*mut sys::rte_mbuf]) -> (u64, u64) {
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

impl Daemon {
    /// Creates the pool and brings every port and exception interface up. On error,
    /// whatever was created is released again.
    pub fn start(cfg: Config, listener: UnixListener) -> Result<Daemon, ServiceError> {
        let name = CString::new(POOL_NAME).unwrap();
        let ops = CString::new(POOL_OPS).unwrap();
        // SAFETY: EAL is up.
        let pool = unsafe {
            sys::rte_pktmbuf_pool_create_by_ops(
                name.as_ptr(),
                cfg.daemon.mbufs,
                POOL_CACHE,
                holder::PRIV_SIZE,
                sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
                sys::SOCKET_ID_ANY,
                ops.as_ptr(),
            )
        };
        if pool.is_null() {
            return Err(StartupError::Pool {
                mbufs: cfg.daemon.mbufs,
                reason: sys::rte_strerror_string(sys::rte_errno()),
            }
            .into());
        }
        let mut ports: Vec<PortState> = Vec::new();
        for (i, pc) in cfg.ports.iter().enumerate() {
            match Port::open(i as u16, pc, pool) {
                Ok(port) => ports.push(PortState {
                    queues: (1..=port.flow_queues).map(FlowQueue::new).collect(),
                    port,
                    flows: FlowTable::default(),
                    to_kernel: 0,
                    to_kernel_drops: 0,
                    from_kernel: 0,
                    from_kernel_drops: 0,
                    from_processes: 0,
                    from_processes_drops: 0,
                    loopback: 0,
                    echoes: 0,
                    may_echo: port::may_echo(&pc.device),
                    direct: None,
                    direct_off: String::new(),
                    sockets: Vec::new(),
                    socket_drops: std::cell::Cell::new(0),
                    conns_direct: 0,
                    conns_forwarded: 0,
                    rdma: pc.rdma_device.as_deref().map(device::RdmaDevice::new),
                    departed: counters::Departed::default(),
                    pushed: None,
                }),
                Err(e) => {
                    for p in &mut ports {
                        p.port.close();
                    }
                    // SAFETY: no port uses the pool any more.
                    unsafe { sys::rte_mempool_free(pool) };
                    return Err(e.into());
                }
            }
        }
        for pc in &cfg.ports {
            if let Err(e) = device::configure_interface(pc) {
                for p in &mut ports {
                    p.port.close();
                }
                // SAFETY: no port uses the pool any more.
                unsafe { sys::rte_mempool_free(pool) };
                return Err(e.into());
            }
        }
        // The direct path's sockets are made ready and closed on a thread of their own.
        let keeper = SocketKeeper::new(
            cfg.daemon.direct_ready as usize,
            Box::new(crate::direct::prepare_socket),
        )
        .map(Arc::new)
        .map_err(|e| format!("cannot start the thread that keeps its sockets: {e}"));
        // Once the ports' sockets exist.
        for (p, pc) in ports.iter_mut().zip(&cfg.ports) {
            // Found once: the direct path filters them, the status reads their drops.
            let sockets = direct::port_sockets(&pc.device);
            if let Ok((_, fds)) = &sockets {
                p.sockets = fds.clone();
            }
            match direct::DirectPort::new(&sockets, pc.direct, pc.direct_max, &keeper) {
                Ok(d) => {
                    tracing::info!(port = %pc.name, "connections take the direct path");
                    p.direct = Some(d);
                }
                Err(why) => {
                    tracing::info!(port = %pc.name, "no direct path: {why}");
                    p.direct_off = why;
                }
            }
        }
        // After the start-up probes, so that they are not what fails.
        if let Some(f) = hwflow::arm_faults_from_env() {
            tracing::warn!("rte_flow fault injection armed: {f}");
        }
        let allowed_gid = access::group_id(&cfg.daemon.group);
        if allowed_gid.is_none() && !cfg.daemon.group.is_empty() {
            tracing::warn!(group = %cfg.daemon.group, "group does not exist: only root may attach");
        }
        let close_all = |ports: &mut Vec<PortState>| {
            for p in ports {
                p.port.close();
            }
            // SAFETY: no port uses the pool any more.
            unsafe { sys::rte_mempool_free(pool) };
        };
        if let Err(error) = listener.set_nonblocking(true) {
            close_all(&mut ports);
            return Err(StartupError::ControlSocket { error }.into());
        }
        let mut idle = match idle::Idle::new(&cfg.daemon.socket, cfg.socket_mode(), allowed_gid) {
            Ok(i) => i,
            Err(e) => {
                close_all(&mut ports);
                return Err(e.into());
            }
        };
        let qp_table = match counters::QpTable::new() {
            Ok(t) => t,
            Err(e) => {
                close_all(&mut ports);
                return Err(e.into());
            }
        };
        let drivers: Vec<String> = ports.iter().map(|p| p.port.driver()).collect();
        idle.watch_ports(drivers.iter().map(String::as_str));
        tracing::info!(
            frames_wake = idle.frames_wake(),
            "idle sleeps end for frames {}",
            if idle.frames_wake() {
                "(the ports' sockets are polled)"
            } else {
                "only at the next look (a port has no descriptor to poll)"
            }
        );
        let mut d = Daemon {
            cfg,
            pool,
            ports,
            listener,
            allowed_gid,
            clients: Vec::new(),
            flows: BTreeMap::new(),
            next_client: 1,
            next_flow: 1,
            lcores_used: vec![false; sys::RTE_MAX_LCORE as usize],
            rings: 0,
            started: Instant::now(),
            cm: cm::Cm::default(),
            idle,
            departed: Vec::new(),
            swept_at: Instant::now(),
            qp_table,
            keeper,
            next_push: Instant::now(),
        };
        d.cm_open();
        d.devices_create();
        Ok(d)
    }

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
                let tap = &mut self.cm.tap;
                // SAFETY: ports are started; every mbuf is passed on exactly once.
                unsafe {
                    let port = p.port.id;
                    let n = usize::from(sys::rte_eth_rx_burst(
                        port,
                        0,
                        rx.as_mut_ptr(),
                        BURST as u16,
                    ));
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
                                ingest_local(p, &mut self.cm.tap, pi, &local, &mut kernel);
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
            if !self.cm.tap.frames.is_empty() {
                work += self.cm_frames();
            }
            if work > 0 && !self.cm.armed.is_empty() {
                self.check_wakes();
            }
            let now = Instant::now();
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
                                    (&mut self.cm.tap, pi),
                                )
                            };
                        }
                    }
                }
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
                if idle > IDLE_POLLS && !idle_sleep.is_zero() {
                    // Idle. When frames end a sleep (idle.rs), sleep idle_sleep_max at
                    // once; otherwise sleep idle_sleep between looks, and after
                    // BACKOFF_AFTER double it up to idle_sleep_max.
                    let since = *idle_since.get_or_insert(now);
                    let d = if self.idle.frames_wake() && self.cm.handshakes.is_empty() {
                        // Nothing but a frame, a request or a kick can give it work,
                        // and each of those ends the sleep.
                        QUIET_SLEEP.max(idle_sleep_max)
                    } else if self.idle.frames_wake() {
                        idle_sleep_max
                    } else if now.saturating_duration_since(since) < BACKOFF_AFTER {
                        idle_sleep
                    } else {
                        sleep = (sleep * 2).min(idle_sleep_max);
                        sleep
                    };
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
                    // trust the ports' descriptors.
                    idle = IDLE_POLLS;
                }
            } else {
                idle = 0;
                idle_since = None;
                sleep = idle_sleep;
            }
        }
    }

    /// Sleeps up to `limit`, or until a request, a process's kick or (when the ports can
    /// say so) a frame comes; says which.
    fn sleep(&mut self, limit: Duration) -> Woken {
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
        let control: Vec<std::os::fd::RawFd> = std::iter::once(self.listener.as_raw_fd())
            .chain(self.clients.iter().map(|c| c.stream.as_raw_fd()))
            .chain(self.cm.chan.as_ref().map(|ch| ch.as_raw_fd()))
            .collect();
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
        if n <= 0 {
            return Woken::Timer;
        }
        if fds[..control].iter().any(|f| f.revents != 0) {
            self.idle.drain_kicks();
            return Woken::Request;
        }
        if fds[control].revents != 0 {
            self.idle.drain_kicks();
            return Woken::Kick;
        }
        Woken::Frame
    }

    /// Whether any process's TX ring holds frames, or its alloc ring wants a refill.
    fn clients_need_a_pass(&self) -> bool {
        self.clients
            .iter()
            .filter_map(|c| c.attached.as_ref())
            .any(|a| {
                a.lender.wants_refill()
                    // SAFETY: the ring lives while the process is attached.
                    || a.tx.iter().any(|t| unsafe { sys::rte_ring_count(t.ring) } > 0)
            })
    }

    /// Writes `EVENT WAKE` to every armed process that has received frames since it armed.
    fn check_wakes(&mut self) {
        let armed: Vec<(u32, u64)> = self.cm.armed.iter().map(|(&k, &v)| (k, v)).collect();
        for (id, seen) in armed {
            if self.client_rx_packets(id) > seen {
                self.cm.armed.remove(&id);
                if let Some(i) = self.clients.iter().position(|c| c.id == id) {
                    self.send(i, &proto::Event::Wake.encode());
                }
            }
        }
    }

    /// Frames enqueued on the flows of client `id` so far.
    fn client_rx_packets(&self, id: u32) -> u64 {
        self.flows
            .values()
            .filter(|r| r.client == id)
            .filter_map(|r| self.ports[usize::from(r.port)].flows.get(r.slot))
            .map(|f| f.rx_packets)
            .sum()
    }

    /// Whether any of client `i`'s flow rings holds frames.
    fn client_rings_nonempty(&self, i: usize) -> bool {
        self.clients[i]
            .flows
            .iter()
            .filter_map(|f| self.flows.get(f))
            .filter_map(|r| self.ports[usize::from(r.port)].flows.get(r.slot))
            // SAFETY: the ring lives while the flow is open.
            .any(|f| unsafe { sys::rte_ring_count(f.ring) } > 0)
    }

    /// Sends one UDP datagram of urdmad's own (handshake, Reject, Abort) on a port; to the
    /// port's own MAC it is received here instead.
    fn send_datagram(
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
                ingest_local(p, &mut self.cm.tap, pi, &[m], &mut kernel);
            } else {
                tx_all(p.port.id, &mut [m]);
            }
        }
    }

    fn serve_control(&mut self) {
        if self.cm.chan.is_some() {
            self.cm_read_kernel();
            self.cm_tick();
        } else {
            self.cm_retry();
        }
        self.devices_create();
        self.counters_push();
        if !self.departed.is_empty() && self.swept_at.elapsed() >= Duration::from_millis(500) {
            self.sweep();
        }
        let mut fds = Vec::with_capacity(self.clients.len() + 1);
        fds.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for c in &self.clients {
            fds.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: fds is a valid array of pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        let refusals_pending = self.clients.iter().any(|c| c.refused.is_some());
        if n <= 0 && !refusals_pending {
            return;
        }
        let now = Instant::now();
        let mut gone = Vec::new();
        for (i, f) in fds.iter().enumerate().skip(1) {
            let expired = self.clients[i - 1]
                .refused
                .as_ref()
                .is_some_and(|(_, until)| now > *until);
            if expired || (f.revents != 0 && !self.read_client(i - 1)) {
                gone.push(i - 1);
            }
        }
        for i in gone.into_iter().rev() {
            let c = self.clients.remove(i);
            self.release(c, "connection closed");
        }
        if fds[0].revents != 0 {
            self.accept();
        }
    }

    fn accept(&mut self) {
        while let Ok((stream, _)) = self.listener.accept() {
            if self.clients.len() >= MAX_CONNECTIONS {
                tracing::warn!("{MAX_CONNECTIONS} connections open; closing a new one");
                continue;
            }
            let peer = match access::peer_of(&stream) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("control connection without credentials: {e}");
                    continue;
                }
            };
            tracing::debug!(pid = peer.pid, uid = peer.uid, "control connection");
            let refused = access::check(
                peer,
                &access::supplementary_groups(peer.pid),
                self.allowed_gid,
                &self.cfg.daemon.group,
            )
            .err()
            .map(|why| (why.to_string(), Instant::now() + REFUSAL_GRACE));
            if let Some((why, _)) = &refused {
                tracing::warn!(pid = peer.pid, uid = peer.uid, "refused: {why}");
            }
            let _ = stream.set_nonblocking(true);
            let id = self.next_client;
            self.next_client += 1;
            self.clients.push(Client {
                id,
                peer,
                stream,
                buf: Vec::new(),
                greeted: false,
                refused,
                attached: None,
                flows: Vec::new(),
                fds: VecDeque::new(),
            });
        }
    }

    /// Reads and answers what a client sent; false when the connection is to be dropped.
    fn read_client(&mut self, i: usize) -> bool {
        let mut chunk = [0u8; 1024];
        loop {
            let c = &mut self.clients[i];
            match crate::direct::recv_with_fds(&c.stream, &mut chunk, &mut c.fds) {
                Ok(0) => return false,
                Ok(n) => self.clients[i].buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        while let Some(pos) = self.clients[i].buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.clients[i].buf.drain(..=pos).collect();
            let (reply, keep) = match std::str::from_utf8(&line) {
                Ok(text) => self.handle(i, text),
                Err(_) => (
                    error(ErrorCode::Invalid, "message is not UTF-8").encode(),
                    false,
                ),
            };
            if !self.send(i, &reply) || !keep {
                return false;
            }
        }
        if self.clients[i].buf.len() > proto::MAX_LINE {
            let _ = self.send(i, &error(ErrorCode::Invalid, "line too long").encode());
            return false;
        }
        // Descriptors that came with no GIVEBACK are not kept beyond a few.
        while self.clients[i].fds.len() > MAX_HELD_FDS {
            let fd = self.clients[i].fds.pop_front().expect("not empty");
            self.close_off_path(fd);
        }
        true
    }

    /// `GIVEBACK`: the socket of a direct connection that the process no longer uses, to
    /// be closed after its own copy ([`SocketKeeper::close`]).
    fn give_back(&mut self, i: usize) -> Response {
        let Some(fd) = self.clients[i].fds.pop_front() else {
            return error(ErrorCode::Invalid, "GIVEBACK came without a socket");
        };
        let packet = crate::direct::socket_domain(fd.as_raw_fd()) == Some(libc::AF_PACKET);
        self.close_off_path(fd);
        if packet {
            Response::Ok
        } else {
            error(
                ErrorCode::Invalid,
                "what came with GIVEBACK is not a packet socket",
            )
        }
    }

    /// Closes `fd` on the keeper's thread: the last close of a packet socket with rings
    /// waits for grace periods.
    fn close_off_path(&self, fd: OwnedFd) {
        match &self.keeper {
            Ok(k) => k.close(fd),
            Err(_) => drop(fd),
        }
    }

    fn send(&mut self, i: usize, text: &str) -> bool {
        self.send_with(i, text, None).is_ok()
    }

    /// [`Daemon::send`], with `fd` passed along with the text's first byte.
    fn send_with(
        &mut self,
        i: usize,
        text: &str,
        fd: Option<std::os::fd::RawFd>,
    ) -> std::io::Result<()> {
        let s = &mut self.clients[i].stream;
        // A reply is small except a status report; a client that does not read it within
        // the timeout is dropped rather than stalling the data path longer.
        let _ = s.set_nonblocking(false);
        let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
        let r = match fd {
            Some(fd) => crate::direct::send_with_fd(s, text.as_bytes(), fd),
            None => s.write_all(text.as_bytes()),
        };
        let _ = s.set_nonblocking(true);
        r
    }

    /// The reply to one request, and whether the connection stays open.
    fn handle(&mut self, i: usize, line: &str) -> (String, bool) {
        if let Some((why, _)) = self.clients[i].refused.clone() {
            return (error(ErrorCode::Access, &why).encode(), false);
        }
        let req = match Request::decode(line) {
            Ok(r) => r,
            Err(e) => return (error(ErrorCode::Invalid, &e.to_string()).encode(), true),
        };
        let c = &self.clients[i];
        match req {
            Request::Hello { version, .. } => {
                if version != proto::VERSION {
                    return (
                        error(
                            ErrorCode::Version,
                            &format!(
                                "protocol version {version} is not supported, urdmad speaks {}",
                                proto::VERSION
                            ),
                        )
                        .encode(),
                        false,
                    );
                }
                self.clients[i].greeted = true;
                let r = Response::Hello {
                    version: proto::VERSION,
                    daemon: format!("urdmad {}", env!("CARGO_PKG_VERSION")),
                };
                (r.encode(), true)
            }
            _ if !c.greeted => (
                error(ErrorCode::Invalid, "HELLO must come first").encode(),
                false,
            ),
            Request::Attach => (self.attach(i), true),
            Request::Open(spec) => (self.open(i, &spec), true),
            Request::Close { flow } => {
                let mine = self
                    .flows
                    .get(&flow)
                    .is_some_and(|f| f.client == self.clients[i].id);
                if !mine {
                    return (
                        error(ErrorCode::NotFound, &format!("no flow {flow} of yours")).encode(),
                        true,
                    );
                }
                self.close_flow(flow);
                self.clients[i].flows.retain(|&f| f != flow);
                (Response::Closed { flow }.encode(), true)
            }
            Request::Status => {
                let report = status::encode(&self.status());
                let mut text = Response::Status {
                    lines: report.len(),
                }
                .encode();
                for l in report {
                    text.push_str(&l);
                    text.push('\n');
                }
                (text, true)
            }
            Request::Detach => {
                let c = &mut self.clients[i];
                let flows = std::mem::take(&mut c.flows);
                let attached = c.attached.take();
                let (id, pid) = (c.id, c.peer.pid);
                self.release_parts(id, pid, flows, attached, "detached");
                (Response::Detached.encode(), true)
            }
            Request::GiveBack => (self.give_back(i).encode(), true),
            Request::Qp { .. }
            | Request::Unqp { .. }
            | Request::QpClosed { .. }
            | Request::PeerClosed { .. }
            | Request::Arm
            | Request::Sync => (self.cm_client_request(i, &req).encode(), true),
        }
    }

    fn attach(&mut self, i: usize) -> String {
        if self.clients[i].attached.is_some() {
            return error(ErrorCode::Invalid, "already attached").encode();
        }
        let Some(lcore) = (1..self.lcores_used.len()).find(|&l| !self.lcores_used[l]) else {
            return error(
                ErrorCode::NoResources,
                "no free lcore id for another process",
            )
            .encode();
        };
        let id = self.clients[i].id;
        let mut tx = Vec::new();
        for p in &self.ports {
            let name = format!("urd_tx_{id}_{}", p.port.index);
            match ring_create(&name, self.cfg.daemon.ring_size, false) {
                Ok(ring) => tx.push(TxRing {
                    name,
                    ring,
                    packets: 0,
                    drops: 0,
                }),
                Err(e) => {
                    free_new_rings(tx);
                    return error(ErrorCode::NoResources, &e.to_string()).encode();
                }
            }
        }
        // SAFETY: the pool lives as long as the daemon.
        let pool_size = unsafe { (*self.pool).size };
        let mut lender = match Lender::new(id, pool_size) {
            Ok(l) => l,
            Err(e) => {
                free_new_rings(tx);
                return error(ErrorCode::NoResources, &e.to_string()).encode();
            }
        };
        // Filled now: an idle urdmad may sleep before its loop comes to the process.
        // SAFETY: urdmad's thread and pool; the rings are new.
        unsafe { lender.serve(self.pool) };
        self.rings += tx.len() + 2;
        self.lcores_used[lcore] = true;
        let ports = self
            .ports
            .iter()
            .zip(&tx)
            .map(|(p, t)| PortInfo {
                index: p.port.index,
                name: p.port.name.clone(),
                mac: p.port.mac,
                tx_ring: t.name.clone(),
                steering: p.port.steering,
            })
            .collect();
        let (alloc_ring, free_ring) = (lender.alloc_name.clone(), lender.free_name.clone());
        let c = &mut self.clients[i];
        c.attached = Some(Attached {
            lcore: lcore as u32,
            tx,
            lender,
        });
        tracing::info!(
            client = id,
            pid = c.peer.pid,
            uid = c.peer.uid,
            lcore,
            "process attached"
        );
        Response::Attached(Attachment {
            client: id,
            file_prefix: self.cfg.daemon.file_prefix.clone(),
            lcore: lcore as u32,
            alloc_ring,
            free_ring,
            ports,
        })
        .encode()
    }

    fn open(&mut self, i: usize, spec: &FlowSpec) -> String {
        match self.open_flow(i, spec) {
            Ok(o) => Response::Opened {
                flow: o.flow,
                rx_ring: o.rx_ring,
                steering: o.steering,
                queue: o.queue,
            }
            .encode(),
            Err(r) => r.encode(),
        }
    }

    /// Opens a flow for client `i`; the error reply when it cannot.
    fn open_flow(&mut self, i: usize, spec: &FlowSpec) -> Result<FlowSpecOpened, Response> {
        if self.clients[i].attached.is_none() {
            return Err(error(ErrorCode::Invalid, "ATTACH first"));
        }
        let Some(p) = self.ports.get_mut(usize::from(spec.port)) else {
            return Err(error(
                ErrorCode::NotFound,
                &format!("no port {}", spec.port),
            ));
        };
        if spec.local.port() == 0 {
            return Err(error(ErrorCode::Invalid, "local UDP port 0"));
        }
        let flow = self.next_flow;
        let name = format!("urd_rx_{flow}");
        let ring = match ring_create(&name, self.cfg.daemon.ring_size, false) {
            Ok(r) => r,
            Err(e) => return Err(error(ErrorCode::NoResources, &e.to_string())),
        };
        let Some(slot) = p.flows.insert(spec.local, spec.remote, ring) else {
            // SAFETY: just created, unused.
            unsafe { sys::rte_ring_free(ring) };
            return Err(error(
                ErrorCode::Exists,
                &format!("a flow for {} is already open", spec.local),
            ));
        };
        if let Some(f) = p.flows.get_mut(slot) {
            f.holder = self.clients[i].id;
        }
        self.next_flow += 1;
        self.rings += 1;
        let (queue, fallback) = if p.port.steering == Steering::Hardware {
            match steer_to_queue(p, flow, slot, ring, spec) {
                Ok(q) => (Some(q), None),
                Err(why) => {
                    tracing::warn!(flow, port = %p.port.name, "flow steered in software: {why}");
                    (None, Some(why.to_string()))
                }
            }
        } else {
            (None, None)
        };
        let client = self.clients[i].id;
        self.flows.insert(
            flow,
            FlowRec {
                port: spec.port,
                slot,
                client,
                ring_name: name.clone(),
                queue,
                fallback,
                direct: None,
                stats: None,
            },
        );
        self.clients[i].flows.push(flow);
        let steering = if queue.is_some() {
            Steering::Hardware
        } else {
            Steering::Software
        };
        tracing::info!(client, flow, port = spec.port, local = %spec.local, remote = ?spec.remote,
            steering = steering.as_str(), queue, "flow opened");
        Ok(FlowSpecOpened {
            flow,
            rx_ring: name,
            steering,
            queue,
        })
    }

    fn close_flow(&mut self, flow: u32) {
        let Some(mut rec) = self.flows.remove(&flow) else {
            return;
        };
        let p = &mut self.ports[usize::from(rec.port)];
        let drops = p.flows.get(rec.slot).map_or(0, |f| f.drops)
            + rec.direct.as_ref().map_or(0, |d| d.counters().1);
        let qp = rec.stats.map(|s| self.qp_table.give_back(s));
        p.departed.add(qp, drops);
        if let Some(sock) = rec.direct.take() {
            self.direct_close(flow, rec.port, sock);
        }
        let p = &mut self.ports[usize::from(rec.port)];
        if let Some(q) = rec.queue {
            unsteer_queue(p, q, flow);
        }
        if let Some(ring) = p.flows.remove(rec.slot) {
            // SAFETY: unlinked from the table, so nothing enqueues any more; the owner has
            // closed it or is gone.
            unsafe { ring_drain_free(ring) };
            self.rings -= 1;
        }
        tracing::debug!(flow, "flow closed");
    }

    fn release(&mut self, mut c: Client, why: &str) {
        for fd in std::mem::take(&mut c.fds) {
            self.close_off_path(fd);
        }
        let flows = std::mem::take(&mut c.flows);
        self.release_parts(c.id, c.peer.pid, flows, c.attached.take(), why);
    }

    /// Removes a process's flows and rings and frees the mbufs on them.
    fn release_parts(
        &mut self,
        id: u32,
        pid: u32,
        flows: Vec<u32>,
        attached: Option<Attached>,
        why: &str,
    ) {
        let nflows = flows.len();
        // The process's connections end first (an Abort to each peer, CLOSED to the
        // kernel); that closes their flows too.
        self.cm_release(id);
        for f in flows {
            self.close_flow(f);
        }
        if let Some(a) = attached {
            for t in &a.tx {
                // SAFETY: the process detached or died; nothing enqueues any more.
                unsafe { ring_drain_free(t.ring) };
            }
            // SAFETY: as for the TX rings.
            unsafe { a.lender.release() };
            self.rings -= a.tx.len() + 2;
            self.lcores_used[a.lcore as usize] = false;
            tracing::info!(client = id, pid, flows = nflows, "process released: {why}");
            self.departed.push((pid, id));
            self.sweep();
        }
    }

    /// Removes the DPDK runtime files of released processes that no longer exist (a live
    /// secondary still uses its multi-process socket). Cheap: a `stat` per departed process.
    fn sweep(&mut self) {
        self.swept_at = Instant::now();
        let dir = crate::eal::runtime_dir(&self.cfg.daemon.file_prefix);
        let pool = self.pool;
        self.departed.retain(|&(pid, client)| {
            if runs(pid) {
                return true;
            }
            // SAFETY: the process no longer runs and its rings are freed (it was
            // released), so nothing else holds an mbuf marked with its id.
            let n = unsafe { holder::reclaim(pool, client) };
            if n > 0 {
                tracing::info!(
                    client,
                    pid,
                    mbufs = n,
                    "mbufs a departed process held taken back"
                );
            }
            let n = crate::eal::remove_secondary_files(&dir, pid);
            tracing::debug!(
                pid,
                files = n,
                "runtime files of a departed process removed"
            );
            false
        });
    }

    /// The status report: one `kind key=value...` line per object.
    pub fn status(&self) -> Vec<Record> {
        let mut out = Vec::new();
        let attached = self.clients.iter().filter(|c| c.attached.is_some()).count();
        let flow_rules: usize = self
            .ports
            .iter()
            .flat_map(|p| &p.queues)
            .filter(|q| q.rule.is_some())
            .count();
        let keeper = self.keeper.as_ref().ok().map(|k| k.figures());
        out.push(Record::Daemon(status::Daemon {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            prefix: self.cfg.daemon.file_prefix.clone(),
            uptime_s: self.started.elapsed().as_secs(),
            processes: attached,
            flows: self.flows.len(),
            rings: self.rings,
            flow_rules,
            frames_wake: !self.idle.port_fds().is_empty(),
            spurious_wakes: self.idle.spurious_wakes,
            sockets_ready: keeper.map(|k| k.ready),
            sockets_closing: keeper.map(|k| k.closing),
        }));
        // SAFETY: the pool lives as long as the daemon.
        let (available, size) =
            unsafe { (sys::rte_mempool_avail_count(self.pool), (*self.pool).size) };
        out.push(Record::Pool(status::Pool {
            name: POOL_NAME.into(),
            size,
            available,
            in_use: size.saturating_sub(available),
        }));
        for p in &self.ports {
            let c = port::counters(p.port.id);
            let socket_drops = p.socket_drops();
            let in_state = |s: QueueUse| p.queues.iter().filter(|q| q.state == s).count();
            out.push(Record::Port(status::Port {
                index: p.port.index,
                name: p.port.name.clone(),
                device: p.port.device.clone(),
                mac: p.port.mac.to_string(),
                steering: p.port.steering.as_str().into(),
                steering_reason: Some(p.port.steering_reason.clone()).filter(|r| !r.is_empty()),
                flow_queues: p.queues.len(),
                free_queues: in_state(QueueUse::Free),
                quarantined_queues: in_state(QueueUse::Quarantined),
                rx_packets: c.rx_packets,
                rx_bytes: c.rx_bytes,
                rx_missed: c.rx_missed,
                rx_socket_drops: socket_drops,
                rx_errors: c.rx_errors,
                tx_packets: c.tx_packets,
                tx_bytes: c.tx_bytes,
                tx_errors: c.tx_errors,
                from_processes: p.from_processes,
                from_processes_drops: p.from_processes_drops,
                loopback: p.loopback,
                echoes: p.echoes,
                conns_direct: p.conns_direct,
                conns_forwarded: p.conns_forwarded,
                direct: p.direct.is_some(),
                direct_flows: p.direct.as_ref().map(|d| d.len()),
                direct_max: p.direct.as_ref().map(|d| d.max()),
                direct_off: p.direct.is_none().then(|| p.direct_off.clone()),
            }));
            for q in &p.queues {
                out.push(Record::Queue(status::Queue {
                    port: p.port.name.clone(),
                    id: q.id,
                    state: q.state_str().into(),
                    flow: match q.state {
                        QueueUse::Flow { id, .. } => Some(id),
                        _ => None,
                    },
                    rule: q.rule.is_some(),
                    rx_packets: q.rx_packets,
                    rx_bytes: q.rx_bytes,
                    drops: q.drops,
                    strays: q.strays,
                }));
            }
            let e = port::counters(p.port.exception_id);
            out.push(Record::Exception(status::Exception {
                port: p.port.name.clone(),
                iface: p.port.exception_name.clone(),
                to_kernel: p.to_kernel,
                to_kernel_drops: p.to_kernel_drops,
                from_kernel: p.from_kernel,
                from_kernel_drops: p.from_kernel_drops,
                tap_rx_packets: e.rx_packets,
                tap_tx_packets: e.tx_packets,
                addresses: self.cfg.ports[p.port.index as usize]
                    .addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                rdma_device: p.rdma.as_ref().map(|d| d.name.clone()),
                rdma_device_state: p.rdma.as_ref().map(|d| d.state_text()),
            }));
        }
        for c in &self.clients {
            if let Some(a) = &c.attached {
                out.push(Record::Process(status::Process {
                    client: c.id,
                    pid: c.peer.pid,
                    uid: c.peer.uid,
                    lcore: a.lcore,
                    flows: c.flows.len(),
                    // SAFETY: rings live while the client is attached.
                    tx_queued: a
                        .tx
                        .iter()
                        .map(|t| unsafe { sys::rte_ring_count(t.ring) })
                        .sum(),
                    tx_packets: a.tx.iter().map(|t| t.packets).sum(),
                    tx_drops: a.tx.iter().map(|t| t.drops).sum(),
                    mbufs_lent: a.lender.lent(),
                }));
            }
        }
        self.cm_status(&mut out);
        for (&id, rec) in &self.flows {
            let p = &self.ports[usize::from(rec.port)];
            if let Some(f) = p.flows.get(rec.slot) {
                // A direct connection's frames arrive on its socket, but for those urdmad
                // took before the hand-over (`via_urdmad`); its socket ring's drops are the
                // process's as much as its flow ring's.
                let (path, sock_rx, sock_drops) = match &rec.direct {
                    Some(d) => {
                        let (rx, drops) = d.counters();
                        ("direct", rx, drops)
                    }
                    None => ("urdmad", 0, 0),
                };
                out.push(Record::Flow(status::Flow {
                    id,
                    client: rec.client,
                    port: p.port.name.clone(),
                    local: f.local.to_string(),
                    remote: f.remote.map(|r| r.to_string()),
                    ring: rec.ring_name.clone(),
                    steering: if rec.queue.is_some() {
                        "hardware"
                    } else {
                        "software"
                    }
                    .into(),
                    queue: rec.queue,
                    fallback: rec.fallback.clone(),
                    path: path.into(),
                    rx_packets: f.rx_packets + sock_rx,
                    via_urdmad: f.rx_packets,
                    rx_bytes: f.rx_bytes,
                    drops: f.drops + sock_drops,
                    // SAFETY: the ring lives while the flow is open.
                    queued: unsafe { sys::rte_ring_count(f.ring) },
                    qp: rec.stats.map(|s| counters::figures(&self.qp_table.read(s))),
                }));
            }
        }
        out
    }

    /// Releases every process, closes ports (removing the TAPs) and frees the pool.
    pub fn shutdown(mut self) {
        for c in std::mem::take(&mut self.clients) {
            self.release(c, "urdmad stopping");
        }
        for p in &mut self.ports {
            device::delete(p);
            for q in &mut p.queues {
                // Only quarantined queues still hold a rule here; closing the port is the
                // last chance to remove it.
                if let Some(r) = q.rule.take() {
                    if let Err((_, why)) = hwflow::destroy(p.port.id, r) {
                        tracing::error!(port = %p.port.name, queue = q.id, "rule not destroyed: {why}");
                    }
                }
            }
            p.port.close();
        }
        // SAFETY: no port or ring references the pool any more.
        unsafe { sys::rte_mempool_free(self.pool) };
    }
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
unsafe fn drop_echoes(rx: &mut [*mut sys::rte_mbuf], own: &[u8; 6]) -> usize {
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
unsafe fn poll_flow_queue(
    port: u16,
    exception: u16,
    q: &mut FlowQueue,
    flows: &mut FlowTable,
    rx: &mut [*mut sys::rte_mbuf; BURST],
    kernel: &mut Vec<*mut sys::rte_mbuf>,
    (tap, pi): (&mut cm::Tap, usize),
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
            if let Some(f) = flows.get_mut(slot) {
                f.rx_packets += done as u64;
                f.rx_bytes += bytes;
                f.drops += (n - done) as u64;
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
unsafe fn take_cm_frames(tap: &mut cm::Tap, pi: usize, kernel: &mut Vec<*mut sys::rte_mbuf>) {
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
unsafe fn mac_at_is(m: *mut sys::rte_mbuf, off: usize, mac: &[u8; 6]) -> bool {
    usize::from((*m).data_len) >= off + 6
        && std::slice::from_raw_parts(sys::rte_pktmbuf_mtod::<u8>(m).add(off) as *const u8, 6)
            == mac
}

/// Whether a frame's destination MAC is `mac`.
///
/// # Safety
/// `m` is a valid mbuf.
unsafe fn dst_mac_is(m: *mut sys::rte_mbuf, mac: &[u8; 6]) -> bool {
    mac_at_is(m, 0, mac)
}

/// Whether a frame's source MAC is `mac`.
///
/// # Safety
/// `m` is a valid mbuf.
unsafe fn src_mac_is(m: *mut sys::rte_mbuf, mac: &[u8; 6]) -> bool {
    mac_at_is(m, 6, mac)
}

/// Classifies frames of this node as if the port had received them (loopback): to their
/// flows, to urdmad's connection management, or to the kernel.
///
/// # Safety
/// Every pointer in `mbufs` (at most [`BURST`]) is a valid mbuf owned by the caller.
unsafe fn ingest_local(
    p: &mut PortState,
    tap: &mut cm::Tap,
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

/// Frees whatever waits on a flow queue (frames of a flow that is gone, or that arrived
/// before its rule), bounded so that a flood cannot hold the loop.
fn drain_queue(port: u16, q: &mut FlowQueue) {
    let mut rx = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
    for _ in 0..64 {
        // SAFETY: the port is started; the mbufs are ours to free.
        let n = unsafe { sys::rte_eth_rx_burst(port, q.id, rx.as_mut_ptr(), BURST as u16) };
        if n == 0 {
            return;
        }
        q.strays += u64::from(n);
        for &m in &rx[..usize::from(n)] {
            // SAFETY: received above.
            unsafe { sys::rte_pktmbuf_free(m) };
        }
    }
}

/// Takes a free flow queue, empties it, and creates the flow's rule to it. The error says
/// why the flow stays with software steering.
fn steer_to_queue(
    p: &mut PortState,
    flow: u32,
    slot: u32,
    ring: *mut sys::rte_ring,
    spec: &FlowSpec,
) -> Result<u16, SteeringError> {
    let port = p.port.id;
    let q = p
        .queues
        .iter_mut()
        .find(|q| q.state == QueueUse::Free)
        .ok_or(SteeringError::QueuesInUse {
            queues: p.port.flow_queues,
        })?;
    drain_queue(port, q);
    let m = Match::Flow {
        local: spec.local,
        remote: spec.remote,
    };
    let rule =
        hwflow::create(port, m, q.id).map_err(|error| SteeringError::RuleNotCreated { error })?;
    q.rule = Some(rule);
    q.state = QueueUse::Flow {
        id: flow,
        slot,
        ring,
    };
    Ok(q.id)
}

/// Destroys a flow's rule and returns its queue to the pool emptied, or quarantines the
/// queue when the rule cannot be destroyed.
fn unsteer_queue(p: &mut PortState, queue: u16, flow: u32) {
    let port = p.port.id;
    let name = &p.port.name;
    let Some(q) = p.queues.get_mut(usize::from(queue) - 1) else {
        return;
    };
    // The ring is about to be freed: the queue must stop referring to it first.
    q.state = QueueUse::Quarantined;
    let Some(rule) = q.rule.take() else {
        drain_queue(port, q);
        q.state = QueueUse::Free;
        return;
    };
    match hwflow::destroy(port, rule) {
        Ok(()) => {
            drain_queue(port, q);
            q.state = QueueUse::Free;
        }
        Err((rule, why)) => {
            q.rule = Some(rule);
            tracing::error!(port = %name, queue, flow, "rule not destroyed, queue quarantined: {why}");
        }
    }
}

fn error(code: ErrorCode, message: &str) -> Response {
    Response::Error {
        code,
        message: message.to_owned(),
    }
}
