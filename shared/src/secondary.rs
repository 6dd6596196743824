//! Attaching to urdmad as a DPDK secondary process and using what it hands out: EAL's
//! initialisation and the lookups of the process's rings, which the provider (liburdma's
//! `dpdk` module) shares, and a [`Session`] over a flow's RX ring and the process's TX ring
//! for `urdmad-testclient` and the daemon's tests. Frames are built by [`crate::frame`].

use crate::client::{self, Connection};
use crate::doorbell::{self, Bell, Ringer};
use crate::lending::Borrower;
use crate::proto::{Attachment, FlowSpec, Request, Response, Steering};
use dpdk_sys as sys;
use std::ffi::CString;
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
    #[error("ring name")]
    RingName,
    #[error("ring {name} not found in urdmad's memory")]
    RingNotFound { name: String },
    #[error("no port {port}")]
    NoPort { port: usize },
    #[error("frame larger than an mbuf")]
    FrameTooLarge,
    /// urdmad has not refilled the process's alloc ring yet.
    #[error("no mbuf lent")]
    NoMbuf,
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

/// What `ATTACH` handed out, in urdmad's memory (after [`eal_init`]): the process's mbuf
/// rings and its TX ring of each port, in port order.
pub fn lookup_attachment(
    a: &Attachment,
) -> Result<(Borrower, Vec<*mut sys::rte_ring>), SecondaryError> {
    let mbufs = Borrower::new(lookup_ring(&a.alloc_ring)?, lookup_ring(&a.free_ring)?);
    let tx = a
        .ports
        .iter()
        .map(|p| lookup_ring(&p.tx_ring))
        .collect::<Result<_, _>>()?;
    Ok((mbufs, tx))
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

/// The table of QP figures of the urdmad this process attached to (after [`eal_init`]);
/// `None` when it has none.
pub fn lookup_qp_table() -> Option<*const crate::qpstats::Slot> {
    use crate::qpstats::{Slot, MEMZONE, SLOTS};
    let name = CString::new(MEMZONE).ok()?;
    // SAFETY: valid C string; EAL is up.
    let mz = unsafe { sys::rte_memzone_lookup(name.as_ptr()) };
    if mz.is_null() {
        return None;
    }
    // SAFETY: a memzone urdmad reserved and keeps while it runs, mapped in this process
    // for as long as EAL is up; used only if it is as long as the table.
    unsafe {
        ((*mz).len >= SLOTS as usize * std::mem::size_of::<Slot>())
            .then(|| (*mz).__bindgen_anon_1.addr as *const Slot)
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
    mbufs: Borrower,
    tx: Vec<*mut sys::rte_ring>,
    ringer: Option<Ringer>,
    pub flows: Vec<Flow>,
}

impl Session {
    /// Sends `ATTACH`, initialises EAL as a secondary (once per process) and finds the
    /// process's rings.
    pub fn attach(mut conn: Connection) -> Result<Session, SecondaryError> {
        let attachment = match conn.request(&Request::Attach)? {
            Response::Attached(a) => a,
            other => return Err(client::refusal(other).into()),
        };
        eal_init(&attachment, "urdma-secondary")?;
        let (mbufs, tx) = lookup_attachment(&attachment)?;
        let ringer = lookup_ringer(conn.path());
        Ok(Session {
            conn,
            attachment,
            mbufs,
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
        // SAFETY: the mbuf is ours; it is given back after copying.
        let data = unsafe {
            std::slice::from_raw_parts(
                sys::rte_pktmbuf_mtod::<u8>(m[0]) as *const u8,
                usize::from((*m[0]).data_len),
            )
            .to_vec()
        };
        self.mbufs.give_back(&m);
        Some(data)
    }

    /// Queues a copy of one frame for transmission on port `port`.
    pub fn send(&self, port: usize, frame: &[u8]) -> Result<(), SecondaryError> {
        if port >= self.tx.len() {
            return Err(SecondaryError::NoPort { port });
        }
        let Ok(len) = u16::try_from(frame.len()) else {
            return Err(SecondaryError::FrameTooLarge);
        };
        let m = self.mbufs.take().ok_or(SecondaryError::NoMbuf)?;
        // SAFETY: a lent mbuf, empty; it is handed over or given back.
        unsafe {
            let dst = sys::rte_pktmbuf_append(m, len) as *mut u8;
            if dst.is_null() {
                self.mbufs.give_back(&[m]);
                return Err(SecondaryError::FrameTooLarge);
            }
            std::ptr::copy_nonoverlapping(frame.as_ptr(), dst, frame.len());
        }
        if self.send_burst(port, &[m]) == 0 {
            self.mbufs.give_back(&[m]);
            return Err(SecondaryError::TxRingFull);
        }
        Ok(())
    }

    /// Takes `n` lent mbufs and keeps them for good (a test's stand-in for a process killed
    /// between taking mbufs and handing them on); returns how many it got.
    pub fn allocate_kept(&self, n: usize) -> usize {
        (0..n).take_while(|_| self.mbufs.take().is_some()).count()
    }

    /// Takes up to `n` lent mbufs, then gives them all back; returns how many it took.
    pub fn churn(&self, n: usize) -> usize {
        let held: Vec<_> = (0..n).map_while(|_| self.mbufs.take()).collect();
        self.mbufs.give_back(&held);
        held.len()
    }

    /// Zero-copy receive: moves up to `out.len()` of flow `i`'s mbufs into `out` and
    /// returns how many. The caller owns them and gives them back with [`Session::give_back`].
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

    /// Zero-copy send: hands as many of `pkts` (mbufs from [`Session::take`]) as fit to port
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

    /// A lent mbuf to send with, if urdmad has refilled the process's ring.
    pub fn take(&self) -> Option<*mut sys::rte_mbuf> {
        self.mbufs.take()
    }

    /// Gives back mbufs the process is done with.
    pub fn give_back(&self, mbufs: &[*mut sys::rte_mbuf]) {
        self.mbufs.give_back(mbufs)
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
