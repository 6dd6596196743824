//! Attaching to urdmad as a DPDK secondary process and using what it hands out: EAL's
//! initialisation and the lookups of urdmad's pool and rings, which the provider (liburdma's
//! `dpdk` module) shares, and a [`Session`] over a flow's RX ring and the process's TX ring
//! for `urdmad-testclient` and the daemon's tests. Frames are built by [`crate::frame`].

use crate::client::{self, Connection};
use crate::doorbell::{self, Bell, Ringer};
use crate::holder;
use crate::proto::{self, Attachment, FlowSpec, Request, Response, Steering};
use dpdk_sys as sys;
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::sync::OnceLock;

/// Why attaching to urdmad or using what it handed out failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecondaryError {
    /// Talking to urdmad failed, or it refused the request.
    #[error("{0}")]
    Control(client::Error),
    /// `reason` is `rte_strerror` of EAL's error.
    #[error("EAL secondary initialisation failed: {reason}")]
    EalInit { reason: String },
    /// EAL is up already, for another urdmad (one EAL per process).
    #[error("this process is already attached to prefix {prefix}")]
    OtherPrefix { prefix: String },
    #[error("pool name")]
    PoolName,
    #[error("mempool {pool} not found")]
    PoolNotFound { pool: String },
    /// The pool's operations index names other operations in this process than in urdmad,
    /// whose drivers registered theirs in another order.
    #[error(
        "urdmad's pool uses mempool operations #{index}, which are {found:?} in this \
         process, not {}",
        proto::POOL_OPS
    )]
    PoolOps { index: i32, found: String },
    #[error("ring name")]
    RingName,
    #[error("ring {name} not found in urdmad's memory")]
    RingNotFound { name: String },
    #[error("no port {port}")]
    NoPort { port: usize },
    #[error("frame larger than an mbuf")]
    FrameTooLarge,
    #[error("mbuf pool exhausted")]
    PoolExhausted,
    #[error("TX ring full")]
    TxRingFull,
}

/// `?` on what the control connection returns.
impl From<client::Error> for SecondaryError {
    fn from(e: client::Error) -> Self {
        SecondaryError::Control(e)
    }
}

/// The EAL of this process, initialised by the first attachment (EAL cannot be initialised
/// twice in one process): the DPDK file prefix of the urdmad it serves.
static EAL: OnceLock<Result<String, SecondaryError>> = OnceLock::new();

/// Initialises EAL as the secondary of the urdmad that handed out `a`, once per process;
/// `program` is EAL's argv[0]. EAL binds the calling thread to the lcore urdmad reserved and
/// starts its own threads from it (they inherit its signal mask); it logs errors only, as a
/// library inside an application should.
pub fn eal_init(a: &Attachment, program: &str) -> Result<(), SecondaryError> {
    let r = EAL.get_or_init(|| {
        let mut args = vec![program.to_string()];
        args.extend(a.eal_args());
        args.push("--log-level=3".into());
        let cargs: Vec<CString> = args
            .iter()
            .map(|s| CString::new(s.as_str()).unwrap_or_default())
            .collect();
        // EAL keeps pointers into argv: it lives for the whole process.
        let argv: &mut Vec<*mut c_char> =
            Box::leak(Box::new(cargs.into_iter().map(|c| c.into_raw()).collect()));
        // SAFETY: argv holds NUL-terminated strings that live for the whole process.
        let rc = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if rc < 0 {
            Err(SecondaryError::EalInit {
                reason: sys::rte_strerror_string(sys::rte_errno()),
            })
        } else {
            Ok(a.file_prefix.clone())
        }
    });
    match r {
        Ok(prefix) if *prefix == a.file_prefix => Ok(()),
        Ok(prefix) => Err(SecondaryError::OtherPrefix {
            prefix: prefix.clone(),
        }),
        Err(e) => Err(e.clone()),
    }
}

/// Whether [`eal_init`] succeeded in this process.
pub fn eal_is_up() -> bool {
    matches!(EAL.get(), Some(Ok(_)))
}

/// A ring urdmad created, by name (after [`eal_init`]).
pub fn lookup_ring(name: &str) -> Result<*mut sys::rte_ring, SecondaryError> {
    let c = CString::new(name).map_err(|_| SecondaryError::RingName)?;
    // SAFETY: valid C string; EAL is up (a lookup before finds nothing).
    let r = unsafe { sys::rte_ring_lookup(c.as_ptr()) };
    if r.is_null() {
        Err(SecondaryError::RingNotFound {
            name: name.to_string(),
        })
    } else {
        Ok(r)
    }
}

/// urdmad's mbuf pool, by name (after [`eal_init`]).
pub fn lookup_pool(name: &str) -> Result<*mut sys::rte_mempool, SecondaryError> {
    let c = CString::new(name).map_err(|_| SecondaryError::PoolName)?;
    // SAFETY: valid C string; EAL is up (a lookup before finds nothing).
    let pool = unsafe { sys::rte_mempool_lookup(c.as_ptr()) };
    if pool.is_null() {
        return Err(SecondaryError::PoolNotFound {
            pool: name.to_string(),
        });
    }
    // SAFETY: a pool in urdmad's memory, mapped here; the index is below the table's size,
    // which every DPDK process shares (RTE_MEMPOOL_MAX_OPS_IDX), and an entry no driver
    // filled in this process has an empty name.
    let (index, found) = unsafe {
        let index = (*pool).ops_index;
        let ops = sys::rte_mempool_get_ops(index);
        (
            index,
            CStr::from_ptr((*ops).name.as_ptr()).to_string_lossy(),
        )
    };
    if found != proto::POOL_OPS {
        return Err(SecondaryError::PoolOps {
            index,
            found: found.into_owned(),
        });
    }
    Ok(pool)
}

/// What `ATTACH` handed out, in urdmad's memory (after [`eal_init`]): its mbuf pool and
/// the process's TX ring of each port, in port order.
pub fn lookup_attachment(
    a: &Attachment,
) -> Result<(*mut sys::rte_mempool, Vec<*mut sys::rte_ring>), SecondaryError> {
    let pool = lookup_pool(&a.pool)?;
    let tx = a
        .ports
        .iter()
        .map(|p| lookup_ring(&p.tx_ring))
        .collect::<Result<_, _>>()?;
    Ok((pool, tx))
}

/// The doorbell of the urdmad whose control socket is `control` (after [`eal_init`]);
/// `None` when it has none, and then a frame put on a TX ring while urdmad sleeps waits for
/// the end of its sleep.
pub fn lookup_ringer(control: &std::path::Path) -> Option<Ringer> {
    let name = CString::new(doorbell::MEMZONE).ok()?;
    // SAFETY: valid C string; EAL is up.
    let mz = unsafe { sys::rte_memzone_lookup(name.as_ptr()) };
    if mz.is_null() {
        return None;
    }
    // SAFETY: a memzone urdmad reserved for a Bell and keeps while it runs, mapped in this
    // process for as long as EAL is up.
    unsafe {
        let bell = (*mz).__bindgen_anon_1.addr as *const Bell;
        Ringer::new(bell, control).ok()
    }
}

/// An open flow: its id and RX ring.
pub struct Flow {
    pub id: u32,
    pub spec: FlowSpec,
    /// How urdmad steers the flow (the ring is read the same way either way).
    pub steering: Steering,
    pub queue: Option<u16>,
    ring: *mut sys::rte_ring,
}

/// An attached process.
pub struct Session {
    conn: Connection,
    pub attachment: Attachment,
    pool: *mut sys::rte_mempool,
    tx: Vec<*mut sys::rte_ring>,
    ringer: Option<Ringer>,
    pub flows: Vec<Flow>,
}

impl Session {
    /// Sends `ATTACH`, initialises EAL as a secondary (once per process) and finds the pool
    /// and TX rings.
    pub fn attach(mut conn: Connection) -> Result<Session, SecondaryError> {
        let attachment = match conn.request(&Request::Attach)? {
            Response::Attached(a) => a,
            other => return Err(client::refusal(other).into()),
        };
        eal_init(&attachment, "urdma-secondary")?;
        let (pool, tx) = lookup_attachment(&attachment)?;
        let ringer = lookup_ringer(conn.path());
        Ok(Session {
            conn,
            attachment,
            pool,
            tx,
            ringer,
            flows: Vec::new(),
        })
    }

    pub fn open(&mut self, spec: FlowSpec) -> Result<&Flow, SecondaryError> {
        match self.conn.request(&Request::Open(spec.clone()))? {
            Response::Opened {
                flow,
                rx_ring,
                steering,
                queue,
            } => {
                let ring = lookup_ring(&rx_ring)?;
                self.flows.push(Flow {
                    id: flow,
                    spec,
                    steering,
                    queue,
                    ring,
                });
                Ok(self.flows.last().unwrap())
            }
            other => Err(client::refusal(other).into()),
        }
    }

    pub fn close(&mut self, flow: u32) -> Result<(), SecondaryError> {
        self.flows.retain(|f| f.id != flow);
        match self.conn.request(&Request::Close { flow })? {
            Response::Closed { .. } => Ok(()),
            other => Err(client::refusal(other).into()),
        }
    }

    /// Takes one received frame of flow number `i` (in opening order), if any, as a copy.
    pub fn recv(&self, i: usize) -> Option<Vec<u8>> {
        let mut m = [std::ptr::null_mut(); 1];
        if self.recv_burst(i, &mut m) == 0 {
            return None;
        }
        // SAFETY: the mbuf is ours; it is freed after copying.
        unsafe {
            let data = std::slice::from_raw_parts(
                sys::rte_pktmbuf_mtod::<u8>(m[0]) as *const u8,
                usize::from((*m[0]).data_len),
            )
            .to_vec();
            holder::free(m[0]);
            Some(data)
        }
    }

    /// Queues a copy of one frame for transmission on port `port`.
    pub fn send(&self, port: usize, frame: &[u8]) -> Result<(), SecondaryError> {
        if port >= self.tx.len() {
            return Err(SecondaryError::NoPort { port });
        }
        let Ok(len) = u16::try_from(frame.len()) else {
            return Err(SecondaryError::FrameTooLarge);
        };
        // SAFETY: the mbuf comes from urdmad's pool; it is handed over or freed.
        unsafe {
            let m = sys::rte_pktmbuf_alloc(self.pool);
            if m.is_null() {
                return Err(SecondaryError::PoolExhausted);
            }
            holder::mark(m, self.attachment.client);
            let dst = sys::rte_pktmbuf_append(m, len) as *mut u8;
            if dst.is_null() {
                holder::free(m);
                return Err(SecondaryError::FrameTooLarge);
            }
            std::ptr::copy_nonoverlapping(frame.as_ptr(), dst, frame.len());
            if self.send_burst(port, &[m]) == 0 {
                holder::free(m);
                return Err(SecondaryError::TxRingFull);
            }
        }
        Ok(())
    }

    /// Allocates `n` mbufs from the pool, marked as this process's, and keeps them for good
    /// (a test's stand-in for a process killed between taking mbufs and handing them on);
    /// returns how many it got.
    pub fn allocate_kept(&self, n: usize) -> usize {
        (0..n)
            .take_while(|_| {
                // SAFETY: allocation from urdmad's pool; the mbuf is never used again.
                unsafe {
                    let m = sys::rte_pktmbuf_alloc(self.pool);
                    if !m.is_null() {
                        holder::mark(m, self.attachment.client);
                    }
                    !m.is_null()
                }
            })
            .count()
    }

    /// Zero-copy receive: moves up to `out.len()` of flow `i`'s mbufs into `out` and
    /// returns how many. The caller owns them and frees them with [`holder::free`].
    pub fn recv_burst(&self, i: usize, out: &mut [*mut sys::rte_mbuf]) -> usize {
        let Some(f) = self.flows.get(i) else { return 0 };
        // SAFETY: this process is the ring's only consumer; `out` has room for the count.
        unsafe {
            sys::rte_ring_sc_dequeue_burst(
                f.ring,
                out.as_mut_ptr() as *mut *mut std::ffi::c_void,
                out.len() as u32,
                std::ptr::null_mut(),
            ) as usize
        }
    }

    /// Zero-copy send: hands as many of `pkts` (mbufs from [`Session::pool`]) as fit to port
    /// `port`'s TX ring and returns how many; the rest remain the caller's.
    pub fn send_burst(&self, port: usize, pkts: &[*mut sys::rte_mbuf]) -> usize {
        let Some(&ring) = self.tx.get(port) else {
            return 0;
        };
        // SAFETY: this process is the ring's only producer.
        let n = unsafe {
            sys::rte_ring_sp_enqueue_burst(
                ring,
                pkts.as_ptr() as *const *mut std::ffi::c_void,
                pkts.len() as u32,
                std::ptr::null_mut(),
            ) as usize
        };
        if n > 0 {
            if let Some(r) = &self.ringer {
                r.ring();
            }
        }
        n
    }

    /// The pool to allocate frames to send from.
    pub fn pool(&self) -> *mut sys::rte_mempool {
        self.pool
    }

    /// Stops using the rings, then tells urdmad.
    pub fn detach(mut self) -> Result<(), SecondaryError> {
        self.flows.clear();
        match self.conn.request(&Request::Detach)? {
            Response::Detached => Ok(()),
            other => Err(client::refusal(other).into()),
        }
    }
}
