//! Software steering: classifies received frames by destination IPv4 address and UDP port
//! and hands each flow's frames to that flow's ring. Everything else belongs to the kernel.

use crate::frame::udp4_addresses;
use crate::holder;
use crate::ringbell::{Burst, RingBell};
use dpdk_sys as sys;
use std::net::SocketAddrV4;

const NONE: u32 = u32::MAX;
/// Most frames handed to [`FlowTable::dispatch`] at once.
pub const MAX_BURST: usize = 64;

#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Where a received frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Index of the flow in its table.
    Flow(u32),
    /// Not a QP's packet: the kernel's, through the exception path.
    Kernel,
}

/// One open flow.
pub struct Flow {
    pub local: SocketAddrV4,
    pub remote: Option<SocketAddrV4>,
    pub ring: *mut sys::rte_ring,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Frames dropped because the ring was full.
    pub drops: u64,
    /// The process that takes the ring's frames: what marks them (`crate::holder`).
    pub holder: u32,
    /// The connection's word for urdma.ko's bell ([`crate::ringbell`]), once handed over.
    pub bell: Option<RingBell>,
    /// Frames enqueued that wake the process's helper when it asked (`ARM`): all of them
    /// but those that rang the bell or are quiet.
    pub wakes: u64,
    next: u32,
    live: bool,
    /// This burst's frames for the flow, enqueued together after classification.
    staged: Vec<*mut sys::rte_mbuf>,
}

/// A frame on a flow's ring that completes a receive: urdma.ko is to ring the QP's bell
/// (`Channel::ring`), and if that fires nothing, the frame wakes the process's helper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    pub flow: u32,
    pub dev: u32,
    pub qpn: u32,
    pub verdict: u32,
}

/// The bell's verdicts on a burst of one flow's frames (`crate::cm_channel::verdict`).
pub type Verdicts = [u32; MAX_BURST];

impl Flow {
    /// The bell's verdicts on `mbufs` (at most [`MAX_BURST`]), this flow's frames about to
    /// go onto its ring: read before, since the process may free a frame as soon as it is
    /// there. Without a bell, every frame's is `NONE`.
    ///
    /// # Safety
    /// Every pointer in `mbufs` is a valid mbuf.
    pub unsafe fn judge(&self, mbufs: &[*mut sys::rte_mbuf]) -> Verdicts {
        let mut v = [crate::cm_channel::verdict::NONE; MAX_BURST];
        if let Some(b) = &self.bell {
            for (v, &m) in v.iter_mut().zip(mbufs) {
                let frame = std::slice::from_raw_parts(
                    sys::rte_pktmbuf_mtod::<u8>(m) as *const u8,
                    usize::from((*m).data_len),
                );
                *v = b.verdict(frame);
            }
        }
        v
    }

    /// Counts what the frames judged `verdicts`, now on the ring, ask for; adds to `rings`
    /// the one ring of the bell they need, if any. `idx`: this flow's.
    pub fn enqueued(&mut self, idx: u32, verdicts: &[u32], rings: &mut Vec<Ring>) {
        let mut b = Burst::default();
        for &v in verdicts {
            b.add(v);
        }
        self.wakes += b.wakes;
        let Some(verdict) = b.ring else { return };
        match &self.bell {
            Some(bell) if bell.events() => rings.push(Ring {
                flow: idx,
                dev: bell.dev,
                qpn: bell.qpn,
                verdict,
            }),
            // No event to fire: the frame wakes the helper, as without a bell.
            _ => self.wakes += 1,
        }
    }
}

/// The flows of one port, indexed by local UDP port so that classification costs one array
/// read and a short chain walk whatever the number of flows.
pub struct FlowTable {
    heads: Box<[u32]>,
    flows: Vec<Flow>,
    free: Vec<u32>,
    /// Flows with staged frames in the current burst.
    touched: Vec<u32>,
    /// The bells to ring for frames enqueued since the last [`FlowTable::take_rings`].
    rings: Vec<Ring>,
}

impl Default for FlowTable {
    fn default() -> Self {
        FlowTable {
            heads: vec![NONE; 65536].into_boxed_slice(),
            flows: Vec::new(),
            free: Vec::new(),
            touched: Vec::with_capacity(MAX_BURST),
            rings: Vec::new(),
        }
    }
}

impl FlowTable {
    /// Adds a flow; `None` when one with the same addresses exists.
    pub fn insert(
        &mut self,
        local: SocketAddrV4,
        remote: Option<SocketAddrV4>,
        ring: *mut sys::rte_ring,
    ) -> Option<u32> {
        if self.chain(local.port()).any(|i| {
            let f = &self.flows[i as usize];
            f.local == local && f.remote == remote
        }) {
            return None;
        }
        let head = &mut self.heads[usize::from(local.port())];
        let flow = Flow {
            local,
            remote,
            ring,
            rx_packets: 0,
            rx_bytes: 0,
            drops: 0,
            holder: 0,
            bell: None,
            wakes: 0,
            next: *head,
            live: true,
            staged: Vec::with_capacity(MAX_BURST),
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.flows[i as usize] = flow;
                i
            }
            None => {
                self.flows.push(flow);
                (self.flows.len() - 1) as u32
            }
        };
        // Flows with a remote address are more specific: they go first in the chain.
        if remote.is_some() || *head == NONE {
            *head = idx;
        } else {
            self.flows[idx as usize].next = NONE;
            let mut cur = *head;
            while self.flows[cur as usize].next != NONE {
                cur = self.flows[cur as usize].next;
            }
            self.flows[cur as usize].next = idx;
        }
        Some(idx)
    }

    /// Unlinks a flow and returns its ring.
    pub fn remove(&mut self, idx: u32) -> Option<*mut sys::rte_ring> {
        let f = self.flows.get(idx as usize).filter(|f| f.live)?;
        let port = usize::from(f.local.port());
        let next = f.next;
        if self.heads[port] == idx {
            self.heads[port] = next;
        } else {
            let mut cur = self.heads[port];
            while cur != NONE {
                if self.flows[cur as usize].next == idx {
                    self.flows[cur as usize].next = next;
                    break;
                }
                cur = self.flows[cur as usize].next;
            }
        }
        let f = &mut self.flows[idx as usize];
        f.live = false;
        f.next = NONE;
        f.bell = None;
        self.free.push(idx);
        Some(std::mem::replace(&mut f.ring, std::ptr::null_mut()))
    }

    pub fn get(&self, idx: u32) -> Option<&Flow> {
        self.flows.get(idx as usize).filter(|f| f.live)
    }

    pub fn get_mut(&mut self, idx: u32) -> Option<&mut Flow> {
        self.flows.get_mut(idx as usize).filter(|f| f.live)
    }

    pub fn len(&self) -> usize {
        self.flows.len() - self.free.len()
    }

    /// Adds the bells to ring for frames a flow queue moved onto its flow's ring.
    pub fn add_rings(&mut self, rings: &[Ring]) {
        self.rings.extend_from_slice(rings);
    }

    /// The bells to ring for the frames enqueued since the last call, in order; ring them
    /// before a flow can go ([`FlowTable::remove`]), as the flow of each is named by index.
    pub fn take_rings(&mut self) -> std::vec::Drain<'_, Ring> {
        self.rings.drain(..)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn chain(&self, port: u16) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.heads[usize::from(port)];
        std::iter::from_fn(move || {
            if cur == NONE {
                return None;
            }
            let i = cur;
            cur = self.flows[i as usize].next;
            Some(i)
        })
    }

    /// The flow a frame belongs to.
    pub fn classify(&self, frame: &[u8]) -> Verdict {
        let Some((dst, src)) = udp4_addresses(frame) else {
            return Verdict::Kernel;
        };
        for i in self.chain(dst.port()) {
            let f = &self.flows[i as usize];
            if f.local.ip() == dst.ip() && (f.remote.is_none() || f.remote == Some(src)) {
                return Verdict::Flow(i);
            }
        }
        Verdict::Kernel
    }

    /// Steers a burst of at most [`MAX_BURST`] frames: each flow's frames go onto its ring
    /// in one enqueue (dropped and counted when the ring is full); the kernel's are
    /// appended to `kernel`.
    ///
    /// # Safety
    /// Every pointer in `burst` is a valid mbuf owned by the caller.
    pub unsafe fn dispatch(
        &mut self,
        burst: &[*mut sys::rte_mbuf],
        kernel: &mut Vec<*mut sys::rte_mbuf>,
    ) {
        debug_assert!(burst.len() <= MAX_BURST);
        // Frames arrive cold; asking for every header of the burst up front overlaps the
        // cache misses instead of paying them one after another.
        for &m in burst {
            prefetch(sys::rte_pktmbuf_mtod::<u8>(m));
        }
        for &m in burst {
            let frame = std::slice::from_raw_parts(
                sys::rte_pktmbuf_mtod::<u8>(m) as *const u8,
                usize::from((*m).data_len),
            );
            match self.classify(frame) {
                Verdict::Kernel => kernel.push(m),
                Verdict::Flow(i) => {
                    let f = &mut self.flows[i as usize];
                    if f.staged.is_empty() {
                        self.touched.push(i);
                    }
                    f.staged.push(m);
                }
            }
        }
        for &i in &self.touched {
            let f = &mut self.flows[i as usize];
            let n = f.staged.len();
            let verdicts = f.judge(&f.staged);
            // Marked before they are on the ring: from then on the process may take them.
            for &m in &f.staged {
                holder::mark(m, f.holder);
            }
            let done = sys::rte_ring_sp_enqueue_burst(
                f.ring,
                f.staged.as_ptr() as *const *mut std::ffi::c_void,
                n as u32,
                std::ptr::null_mut(),
            ) as usize;
            for &m in &f.staged[..done] {
                f.rx_bytes += u64::from((*m).pkt_len);
            }
            for &m in &f.staged[done..] {
                holder::free(m);
            }
            f.rx_packets += done as u64;
            f.drops += (n - done) as u64;
            f.staged.clear();
            f.enqueued(i, &verdicts[..done], &mut self.rings);
        }
        self.touched.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: SocketAddrV4, src: SocketAddrV4) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 4];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[26..30].copy_from_slice(&src.ip().octets());
        f[30..34].copy_from_slice(&dst.ip().octets());
        f[34..36].copy_from_slice(&src.port().to_be_bytes());
        f[36..38].copy_from_slice(&dst.port().to_be_bytes());
        f
    }

    fn a(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    #[test]
    fn classification_by_address_port_and_remote() {
        let mut t = FlowTable::default();
        let any = t
            .insert(a("10.0.0.1:5000"), None, std::ptr::null_mut())
            .unwrap();
        let one = t
            .insert(
                a("10.0.0.1:5000"),
                Some(a("10.0.0.2:9")),
                std::ptr::null_mut(),
            )
            .unwrap();
        let other = t
            .insert(a("10.0.0.1:5001"), None, std::ptr::null_mut())
            .unwrap();
        assert!(t
            .insert(a("10.0.0.1:5001"), None, std::ptr::null_mut())
            .is_none());
        assert_eq!(
            t.classify(&frame(a("10.0.0.1:5000"), a("10.0.0.2:9"))),
            Verdict::Flow(one)
        );
        assert_eq!(
            t.classify(&frame(a("10.0.0.1:5000"), a("10.0.0.3:9"))),
            Verdict::Flow(any)
        );
        assert_eq!(
            t.classify(&frame(a("10.0.0.1:5001"), a("10.0.0.3:9"))),
            Verdict::Flow(other)
        );
        assert_eq!(
            t.classify(&frame(a("10.0.0.9:5001"), a("10.0.0.3:9"))),
            Verdict::Kernel
        );
        assert_eq!(
            t.classify(&frame(a("10.0.0.1:5002"), a("10.0.0.3:9"))),
            Verdict::Kernel
        );
        t.remove(one).unwrap();
        assert_eq!(
            t.classify(&frame(a("10.0.0.1:5000"), a("10.0.0.2:9"))),
            Verdict::Flow(any)
        );
        t.remove(any).unwrap();
        assert!(t.remove(any).is_none());
        assert_eq!(
            t.classify(&frame(a("10.0.0.1:5000"), a("10.0.0.2:9"))),
            Verdict::Kernel
        );
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn fragments_and_short_frames_go_to_the_kernel() {
        let mut t = FlowTable::default();
        t.insert(a("10.0.0.1:5000"), None, std::ptr::null_mut())
            .unwrap();
        let mut f = frame(a("10.0.0.1:5000"), a("10.0.0.2:9"));
        f[14 + 6] = 0x20; // more fragments
        assert_eq!(t.classify(&f), Verdict::Kernel);
        let f = frame(a("10.0.0.1:5000"), a("10.0.0.2:9"));
        for len in 0..f.len() {
            let _ = t.classify(&f[..len]);
        }
        assert_eq!(t.classify(&f[..41]), Verdict::Kernel);
    }
}
