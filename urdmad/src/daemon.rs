//! The running daemon: one thread that polls every port, its exception interface and every
//! process's TX ring, and between bursts serves the control socket.

use crate::access::{self, Peer};
use crate::config::Config;
use crate::demux::FlowTable;
use crate::flowfilter::FlowFilter;
use crate::holder;
use crate::hwflow::{self, FlowQueue};
use crate::lending::Lender;
use crate::port::{self, Port};
use crate::proto::{ErrorCode, Response, Steering};
use crate::service::{ServiceError, StartupError};
use crate::socket_keeper::SocketKeeper;
use dpdk_sys as sys;
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

mod connections;
mod control;
mod counters;
mod device;
mod direct_port;
mod flows;
mod forward;
mod idle;
mod quiet;
mod report;
mod wakes;

const BURST: usize = 32;
pub const POOL_NAME: &str = "urd_mbufs";
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
    direct: Option<direct_port::DirectPort>,
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
    /// Frames of RX queue 0 found by the look after arming its interrupt, for the next pass.
    rx_stash: Vec<*mut sys::rte_mbuf>,
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
    direct: Option<direct_port::DirectSock>,
    /// Its QP's slot in the table of QP figures, for a connection's flow.
    stats: Option<u32>,
}

/// What is left of a flow urdmad retired ([`crate::cm::Action::RetireFlow`]): off the wire,
/// but its process may still read the ring and write the figures slot.
struct RetiredFlow {
    flow: u32,
    client: u32,
    port: u16,
    ring: *mut sys::rte_ring,
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
    /// Its quiet socket (`QUIET`), read when urdmad wakes for something else.
    quiet: Option<quiet::Quiet>,
    /// The map of its hush word (`urdma_shared::bell::Hush`), made with its first
    /// connection that rings urdma.ko's bell, and urdmad's own mapping of it, to follow
    /// urdma.ko's rule for the frames it puts on the process's rings (wakes.rs).
    hush: Option<(OwnedFd, crate::bell::HushMap)>,
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
    retired: Vec<RetiredFlow>,
    started: Instant,
    /// Connection management (docs/connection.md): the core, urdma.ko's channel, what
    /// the receive path takes for it, and when to look for the channel again.
    cm: crate::cm::Cm,
    chan: Option<crate::cm_channel::Channel>,
    tap: connections::Tap,
    /// `EVENT CONNECTED`s of flows handed over, written once the frames of the same
    /// connection-manager step are sent (connections.rs, [`connections::Deferred`]).
    deferred: Vec<connections::Deferred>,
    next_open: Option<Instant>,
    /// Processes that asked for one `EVENT WAKE` (wakes.rs), by client id, with their flows'
    /// received-frame count then.
    armed: BTreeMap<u32, u64>,
    /// Processes that were left a frame to read by a call due at the given time
    /// (CLOCK_MONOTONIC ns), by client id: their helper is woken then if none has (wakes.rs).
    late: BTreeMap<u32, u64>,
    /// What ends an idle sleep.
    idle: idle::Idle,
    /// Which control descriptors the last sleep found readable, for the pass after it.
    control_ready: Option<control::ControlReady>,
    /// Released processes, (pid, client id), until they no longer run: then the mbufs they
    /// held are taken back and their DPDK runtime files removed ([`Daemon::sweep`]).
    departed: Vec<(u32, u32)>,
    swept_at: Instant,
    /// Where processes keep their connected QPs' figures.
    qp_table: counters::QpFigures,
    /// Makes the direct path's sockets ready and closes them (`socket_keeper`); why not.
    keeper: Result<Arc<SocketKeeper<direct_port::Prepared>>, String>,
    /// The direct path's filters of closed connections, for the keeper to use again.
    filters: Arc<direct_port::Filters>,
    /// When the ports' counters may next go to the kernel.
    next_push: Instant,
    /// The direct sockets of processes' ended connections, by client id, until the process
    /// parks or gives each back (`direct`).
    shelves: BTreeMap<u32, Vec<direct_port::DirectSock>>,
    /// Connections that took a socket their process had parked, since start.
    sockets_reused: u64,
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
                    rx_stash: Vec::with_capacity(BURST),
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
        // The direct path's sockets are made ready and closed on a thread of their own, which
        // also uses the filters of closed connections again.
        let filters = Arc::new(direct_port::Filters::default());
        if cfg.ports.iter().any(|p| p.direct) {
            if let Err(e) = filters.stock(direct_port::FILTER_STOCK, || FlowFilter::new(true)) {
                tracing::debug!("no stock of filters: {e}");
            }
        }
        let make = {
            let filters = Arc::clone(&filters);
            Box::new(move |geo| direct_port::prepare(geo, Some(&filters)))
        };
        let keeper = SocketKeeper::new(cfg.daemon.direct_ready as usize, make)
            .map(Arc::new)
            .map_err(|e| format!("cannot start the thread that keeps its sockets: {e}"));
        // Once the ports' sockets exist.
        for (p, pc) in ports.iter_mut().zip(&cfg.ports) {
            // Found once: the direct path filters them, the status reads their drops.
            let sockets = direct_port::port_sockets(&pc.device);
            if let Ok((_, fds)) = &sockets {
                p.sockets = fds.clone();
            }
            match direct_port::DirectPort::new(
                &sockets,
                pc.direct,
                pc.direct_max,
                &keeper,
                &filters,
            ) {
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
        let qp_table = match counters::QpFigures::new() {
            Ok(t) => t,
            Err(e) => {
                close_all(&mut ports);
                return Err(e.into());
            }
        };
        let wakes: Vec<(u16, &port::RxWake)> =
            ports.iter().map(|p| (p.port.id, &p.port.rx_wake)).collect();
        idle.watch_ports(&wakes);
        tracing::info!(
            frames_wake = idle.frames_wake(),
            "idle sleeps end for frames {}",
            if idle.frames_wake() {
                "(the ports' sockets or interrupts are polled)"
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
            retired: Vec::new(),
            started: Instant::now(),
            cm: connections::new_cm(Vec::new()),
            chan: None,
            tap: connections::Tap::default(),
            deferred: Vec::new(),
            next_open: None,
            armed: BTreeMap::new(),
            late: BTreeMap::new(),
            idle,
            control_ready: None,
            departed: Vec::new(),
            swept_at: Instant::now(),
            qp_table,
            keeper,
            filters,
            next_push: Instant::now(),
            shelves: BTreeMap::new(),
            sockets_reused: 0,
        };
        d.cm = connections::new_cm((0..d.ports.len()).map(|pi| d.port_view(pi)).collect());
        d.cm_open();
        d.devices_create();
        Ok(d)
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

fn error(code: ErrorCode, message: &str) -> Response {
    Response::Error {
        code,
        message: message.to_owned(),
    }
}
