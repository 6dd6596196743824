//! The process's registered memory as trp sees it: a table of the MRs
//! registered and the memory windows allocated through this provider (STag
//! → region) and a [`trp::Memory`] view of it for one QP, which copies
//! straight into and out of the application's memory.
//!
//! trp checks every access (STag known and valid, protection domain,
//! bounds, rights) before it calls `read` or `write`; the view only moves
//! bytes. The table lives under the engine's lock, so a deregistration
//! cannot run between a check and the copy it allowed.
//!
//! Tagged offsets are virtual addresses: a region's base is the address it
//! was registered at (`ibv_reg_mr`), a window's the address it was bound at.
//! A registration whose I/O virtual address differs from its address
//! (`ibv_reg_mr_iova`) and a zero-based window are refused, as the copies
//! use the addresses trp hands them as pointers.
//!
//! A window is an STag of its own (urdma.ko allocates MR and MW indices
//! from one space) over part of a bound MR. Binding one happens when the
//! request is posted, under the engine lock, so it is in force before any
//! later request of that send queue runs; its completion follows the send
//! queue's order (`trp::SendOp::Local`).

use std::sync::atomic::{AtomicU64, Ordering};
use trp::mr::InvalidateError;
use trp::{Access, AtomicOp, Memory, Region, Srq};

use crate::error::Error;
use crate::int_hash::IntMap;

/// The STag of a QP's private inline buffer. The kernel's STags are
/// `(index << 8) | key` with index ≥ 1, so index 0 never names an MR; the
/// region carries no remote rights, so a peer that names it fails the
/// rights check like any other.
pub const INLINE_STAG: u32 = 0x0000_00ff;

/// One registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    pub region: Region,
    /// `IBV_ACCESS_MW_BIND`: windows may be bound to it.
    pub bind: bool,
    /// Windows bound to it now; it cannot be deregistered before they go.
    pub windows: u32,
}

/// A memory window's type (`ibv_mw_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MwType {
    /// Bound by `ibv_bind_mw`, for any QP of its PD; never invalidated.
    One,
    /// Bound by an `IBV_WR_BIND_MW` request, for that QP only;
    /// invalidated locally or by the peer's Send with Invalidate.
    Two,
}

/// One memory window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mw {
    pub pd: u32,
    pub kind: MwType,
    /// Its STag now: the index urdma.ko gave it and the key of its last bind.
    pub stag: u32,
    pub bound: Option<Binding>,
}

/// What a window is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The range and rights it grants, in its PD.
    pub region: Region,
    /// The STag of the MR it lies in.
    pub mr: u32,
    /// The QP (number) a type 2 window is bound through.
    pub qp: Option<u32>,
}

/// A bind request (`ibv_mw_bind_info` and the window's new STag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bind {
    /// The window's STag as the application knows it (its index counts).
    pub mw: u32,
    pub new_stag: u32,
    /// The MR's lkey; None unbinds (type 1 only).
    pub mr: Option<u32>,
    pub addr: u64,
    pub len: u64,
    /// `ibv_access_flags` of the window.
    pub access: u32,
}

/// The MRs registered and the windows allocated in this process, by
/// (device, STag), windows by (device, STag index): STags are unique per
/// device only, and a window keeps its index across binds.
#[derive(Default, Debug)]
pub struct MrTable {
    mrs: IntMap<(u32, u32), Mr>,
    mws: IntMap<(u32, u32), Mw>,
}

/// `ibv_access_flags` → trp's rights (the same four bits).
pub fn access_from_ibv(flags: u32) -> Access {
    Access::from_bits((flags & 15) as u8)
}

const IBV_ACCESS_MW_BIND: u32 = 16;
const IBV_ACCESS_ZERO_BASED: u32 = 32;

fn index(stag: u32) -> u32 {
    stag >> 8
}

impl MrTable {
    /// Registers an MR with `ibv_access_flags` `access` over `region`.
    pub fn insert(&mut self, dev: u32, stag: u32, region: Region, access: u32) {
        let mr = Mr {
            region,
            bind: access & IBV_ACCESS_MW_BIND != 0,
            windows: 0,
        };
        self.mrs.insert((dev, stag), mr);
    }
    /// Takes an MR out of the table; refused while windows are bound to it.
    pub fn remove(&mut self, dev: u32, stag: u32) -> Result<Option<Mr>, Error> {
        match self.mrs.get(&(dev, stag)) {
            Some(m) if m.windows > 0 => Err(Error::Busy("memory windows are bound to the MR")),
            _ => Ok(self.mrs.remove(&(dev, stag))),
        }
    }
    /// Puts back an MR `remove` returned (the kernel refused to let it go).
    pub fn restore(&mut self, dev: u32, stag: u32, mr: Mr) {
        self.mrs.insert((dev, stag), mr);
    }
    pub fn get(&self, dev: u32, stag: u32) -> Option<&Mr> {
        self.mrs.get(&(dev, stag))
    }
    pub fn len(&self) -> usize {
        self.mrs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.mrs.is_empty()
    }

    /// A window urdma.ko allocated, unbound.
    pub fn add_window(&mut self, dev: u32, stag: u32, pd: u32, kind: MwType) {
        let mw = Mw {
            pd,
            kind,
            stag,
            bound: None,
        };
        self.mws.insert((dev, index(stag)), mw);
    }

    pub fn window(&self, dev: u32, stag: u32) -> Option<&Mw> {
        self.mws.get(&(dev, index(stag)))
    }

    /// Forgets a window (`ibv_dealloc_mw`), unbinding it.
    pub fn remove_window(&mut self, dev: u32, stag: u32) -> Option<Mw> {
        let mut mw = self.mws.remove(&(dev, index(stag)))?;
        self.unbind(dev, &mut mw);
        Some(mw)
    }

    fn unbind(&mut self, dev: u32, mw: &mut Mw) {
        if let Some(b) = mw.bound.take() {
            if let Some(mr) = self.mrs.get_mut(&(dev, b.mr)) {
                mr.windows -= 1;
            }
        }
    }

    /// Checks that a QP of protection domain `pd` may make `b`, by the
    /// verbs' rules (the window, the MR and the QP in one PD; the MR with
    /// the bind right, and local write for a window that writes; the range
    /// inside the MR); a right missing is [`Error::Access`].
    pub fn check_bind(&self, dev: u32, pd: u32, b: &Bind) -> Result<(), Error> {
        let mw = self
            .window(dev, b.mw)
            .ok_or(Error::Invalid("bind: no such memory window"))?;
        if index(b.new_stag) != index(mw.stag) {
            return Err(Error::Invalid(
                "bind: the new rkey is not the window's index",
            ));
        }
        if mw.pd != pd {
            return Err(Error::Invalid(
                "bind: the window is of another PD than the QP",
            ));
        }
        if b.access & IBV_ACCESS_ZERO_BASED != 0 {
            return Err(Error::Invalid("bind: a zero-based window"));
        }
        let Some(lkey) = b.mr else {
            // Only a type 1 window is unbound by a bind (of nothing).
            return match (mw.kind, b.len, b.addr) {
                (MwType::One, 0, 0) => Ok(()),
                _ => Err(Error::Invalid(
                    "bind: no MR, and not the unbinding of a type 1 window",
                )),
            };
        };
        // A type 2 window must be free (invalidated) and the bind non-empty.
        if mw.kind == MwType::Two && mw.bound.is_some() {
            return Err(Error::Invalid("bind: a type 2 window still bound"));
        }
        if mw.kind == MwType::Two && b.len == 0 {
            return Err(Error::Invalid("bind: an empty type 2 window"));
        }
        let mr = self
            .mrs
            .get(&(dev, lkey))
            .ok_or(Error::Invalid("bind: no such MR"))?;
        let r = &mr.region;
        if !r.valid || r.pd != pd {
            return Err(Error::Invalid("bind: an MR invalidated or of another PD"));
        }
        if !mr.bind {
            return Err(Error::Access("bind: the MR lacks IBV_ACCESS_MW_BIND"));
        }
        let rights = access_from_ibv(b.access);
        let writes = Access::REMOTE_WRITE.union(Access::REMOTE_ATOMIC).bits();
        if rights.bits() & writes != 0 && !r.access.contains(Access::LOCAL_WRITE) {
            return Err(Error::Access(
                "bind: remote write or atomic rights over an MR without local write",
            ));
        }
        let outside = Error::Invalid("bind: the range is not inside the MR");
        let end = b.addr.checked_add(b.len).ok_or(outside.clone())?;
        if b.addr < r.base || end > r.base + r.len {
            return Err(outside);
        }
        Ok(())
    }

    /// Makes a bind [`MrTable::check_bind`] allowed.
    pub fn bind(&mut self, dev: u32, qp: u32, b: &Bind) {
        let Some(mut mw) = self.mws.get(&(dev, index(b.mw))).copied() else {
            return;
        };
        self.unbind(dev, &mut mw);
        mw.stag = b.new_stag;
        if let Some(lkey) = b.mr.filter(|_| b.len > 0) {
            if let Some(mr) = self.mrs.get_mut(&(dev, lkey)) {
                mr.windows += 1;
                let rights = access_from_ibv(b.access);
                let remote = Access::REMOTE_WRITE
                    .union(Access::REMOTE_READ)
                    .union(Access::REMOTE_ATOMIC);
                mw.bound = Some(Binding {
                    region: Region::new(
                        mw.pd,
                        b.addr,
                        b.len,
                        Access::from_bits(rights.bits() & remote.bits()),
                    ),
                    mr: lkey,
                    qp: (mw.kind == MwType::Two).then_some(qp),
                });
            }
        }
        self.mws.insert((dev, index(b.mw)), mw);
    }

    /// Unbinds the type 2 windows bound through a QP that is going away.
    pub fn unbind_qp(&mut self, dev: u32, qp: u32) {
        let keys: Vec<_> = self
            .mws
            .iter()
            .filter(|(k, mw)| k.0 == dev && mw.bound.is_some_and(|b| b.qp == Some(qp)))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(mut mw) = self.mws.get(&k).copied() {
                self.unbind(dev, &mut mw);
                self.mws.insert(k, mw);
            }
        }
    }

    /// The region a window's STag grants QP `qp`: None when the STag is not
    /// the window's (an older bind's key) or a type 2 window is bound
    /// through another QP; invalid when it is not bound.
    fn window_region(&self, dev: u32, qp: Option<u32>, stag: u32) -> Option<Region> {
        let mw = self.window(dev, stag).filter(|mw| mw.stag == stag)?;
        match mw.bound {
            None => Some(Region {
                valid: false,
                ..Region::new(mw.pd, 0, 0, Access::NONE)
            }),
            Some(b) if b.qp.is_some() && b.qp != qp => None,
            Some(b) => Some(b.region),
        }
    }

    /// Invalidates `stag` for QP `qp` of protection domain `pd`, by the
    /// peer's Send with Invalidate or a local `IBV_WR_LOCAL_INV`: an MR of
    /// that PD (as siw does) or a type 2 window bound through that QP.
    pub fn invalidate(
        &mut self,
        dev: u32,
        qp: Option<u32>,
        stag: u32,
        pd: u32,
    ) -> Result<(), InvalidateError> {
        self.check_invalidate(dev, qp, stag, pd)?;
        if let Some(m) = self.mrs.get_mut(&(dev, stag)) {
            m.region.valid = false;
        } else if let Some(mut mw) = self.window(dev, stag).copied() {
            self.unbind(dev, &mut mw);
            self.mws.insert((dev, index(stag)), mw);
        }
        Ok(())
    }

    /// Whether [`MrTable::invalidate`] would succeed (a window already
    /// free may be invalidated again).
    pub fn check_invalidate(
        &self,
        dev: u32,
        qp: Option<u32>,
        stag: u32,
        pd: u32,
    ) -> Result<(), InvalidateError> {
        if let Some(m) = self.mrs.get(&(dev, stag)) {
            return match m.region.pd == pd {
                true => Ok(()),
                false => Err(InvalidateError::NotInvalidatable),
            };
        }
        let mw = self
            .window(dev, stag)
            .filter(|mw| mw.stag == stag)
            .ok_or(InvalidateError::Unknown)?;
        match mw.bound {
            Some(b) if b.qp.is_some() && b.qp != qp => Err(InvalidateError::Unknown),
            _ if mw.kind == MwType::One || mw.pd != pd => Err(InvalidateError::NotInvalidatable),
            _ => Ok(()),
        }
    }

    /// The [`Memory`] QP `qp` of device `dev` sees (None: an SRQ's checks
    /// of its receives' SGEs): the table, plus its own
    /// inline buffer at [`INLINE_STAG`] when it has one, and the shared
    /// receive queue its receives come from when it has one.
    pub fn view<'a>(
        &'a mut self,
        dev: u32,
        qp: Option<u32>,
        inline: Option<Region>,
        srq: Option<&'a mut Srq>,
    ) -> QpMemory<'a> {
        QpMemory {
            table: self,
            dev,
            qp,
            inline,
            srq,
        }
    }
}

/// The memory of one QP: see [`MrTable::view`].
pub struct QpMemory<'a> {
    table: &'a mut MrTable,
    dev: u32,
    qp: Option<u32>,
    inline: Option<Region>,
    srq: Option<&'a mut Srq>,
}

impl Memory for QpMemory<'_> {
    #[inline]
    fn region(&self, stag: u32) -> Option<Region> {
        if stag == INLINE_STAG {
            return self.inline;
        }
        match self.table.mrs.get(&(self.dev, stag)) {
            Some(m) => Some(m.region),
            None => self.table.window_region(self.dev, self.qp, stag),
        }
    }

    fn invalidate(&mut self, stag: u32, pd: u32) -> Result<(), InvalidateError> {
        if stag == INLINE_STAG {
            return Err(InvalidateError::NotInvalidatable);
        }
        self.table.invalidate(self.dev, self.qp, stag, pd)
    }

    #[inline]
    fn write(&mut self, addr: u64, data: &[u8]) {
        // SAFETY: trp calls write only for a range it has checked against a
        // registered region of this process (the kernel pinned those pages
        // at registration) or a posted receive SGE checked the same way; the
        // table cannot change while the engine lock is held for this call.
        // Source and destination cannot overlap: data is a received
        // datagram or provider-owned.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len())
        }
    }

    #[inline]
    fn read(&self, addr: u64, out: &mut [u8]) {
        // SAFETY: as for write: a range of registered memory (or of the
        // QP's inline buffer) that trp has checked.
        unsafe {
            std::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), out.len())
        }
    }

    fn srq(&mut self) -> Option<&mut Srq> {
        self.srq.as_deref_mut()
    }

    /// A locked instruction on the memory itself: indivisible against every
    /// other atomic on it, from any thread or process of this host, urdma's
    /// own and the CPU's (more than `IBV_ATOMIC_HCA` asks).
    fn atomic(&mut self, addr: u64, op: AtomicOp) -> u64 {
        // SAFETY: trp checked that the 8 bytes at addr lie in a registered
        // region (pinned) with remote atomic access, and that addr is
        // 8-byte aligned, as AtomicU64 needs; other accesses to that memory
        // are the application's, which verbs leaves to it.
        let cell = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
        match op {
            AtomicOp::FetchAdd { add, fields: 0 } => cell.fetch_add(add, Ordering::SeqCst),
            AtomicOp::CompareSwap {
                compare,
                compare_mask: u64::MAX,
                swap,
                swap_mask: u64::MAX,
            } => match cell.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
            // RFC 7306's masked forms: no instruction does them, a CAS loop does.
            masked => {
                match cell.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                    Some(masked.apply(v))
                }) {
                    Ok(v) | Err(v) => v,
                }
            }
        }
    }
}

/// A QP's inline buffer: inline data is copied here at post time and
/// posted as one SGE of [`INLINE_STAG`].
///
/// Slots are used round robin, 2 × the send queue depth of them. A slot is
/// reused only after 2 × depth further successful posts; trp holds at most
/// `depth` requests in its send queue (it refuses the post otherwise) and
/// keeps a request there until it is acknowledged, so the request that
/// used the slot before is gone, even when a refused post overwrote the
/// slot that follows the last successful one.
pub struct InlineBuf {
    buf: Box<[u8]>,
    slot: usize,
    slots: usize,
    next: usize,
}

impl InlineBuf {
    pub fn new(depth: usize, max_inline: usize) -> Option<InlineBuf> {
        if depth == 0 || max_inline == 0 {
            return None;
        }
        let slots = depth * 2;
        Some(InlineBuf {
            buf: vec![0u8; slots * max_inline].into_boxed_slice(),
            slot: max_inline,
            slots,
            next: 0,
        })
    }

    pub fn max(&self) -> usize {
        self.slot
    }

    /// The region trp sees at [`INLINE_STAG`] for protection domain `pd`:
    /// local access only.
    pub fn region(&self, pd: u32) -> Region {
        Region::new(
            pd,
            self.buf.as_ptr() as usize as u64,
            self.buf.len() as u64,
            Access::NONE,
        )
    }

    /// Gathers `parts` into the next slot and returns (address, length), or
    /// None when they do not fit. Call [`InlineBuf::commit`] once the post
    /// succeeded.
    pub fn stage<'p>(&mut self, parts: impl IntoIterator<Item = &'p [u8]>) -> Option<(u64, u32)> {
        let start = self.next * self.slot;
        let dst = &mut self.buf[start..start + self.slot];
        let mut n = 0;
        for p in parts {
            let end = n + p.len();
            if end > dst.len() {
                return None;
            }
            dst[n..end].copy_from_slice(p);
            n = end;
        }
        Some((dst.as_ptr() as usize as u64, n as u32))
    }

    pub fn commit(&mut self) {
        self.next = (self.next + 1) % self.slots;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trp::mr::{check, ProtectionError};

    #[test]
    fn view_finds_mrs_of_its_device_only() {
        let mut t = MrTable::default();
        let buf = [0u8; 64];
        let base = buf.as_ptr() as u64;
        t.insert(
            1,
            0x100,
            Region::new(3, base, 64, Access::REMOTE_WRITE | Access::LOCAL_WRITE),
            0,
        );
        let v = t.view(1, None, None, None);
        assert!(v.region(0x100).is_some());
        assert_eq!(check(&v, 0x100, 3, base, 64, Access::REMOTE_WRITE), Ok(()));
        assert_eq!(
            check(&v, 0x100, 3, base + 1, 64, Access::REMOTE_WRITE),
            Err(ProtectionError::Bounds)
        );
        assert_eq!(
            check(&v, 0x100, 4, base, 1, Access::REMOTE_WRITE),
            Err(ProtectionError::WrongPd)
        );
        assert_eq!(
            check(&v, 0x100, 3, base, 1, Access::REMOTE_READ),
            Err(ProtectionError::Access)
        );
        let v = t.view(2, None, None, None);
        assert_eq!(v.region(0x100), None);
    }

    #[test]
    fn copies_go_to_application_memory() {
        let mut t = MrTable::default();
        let mut buf = vec![0u8; 16];
        let base = buf.as_mut_ptr() as u64;
        t.insert(0, 0x200, Region::new(1, base, 16, Access::ALL), 0);
        let mut v = t.view(0, None, None, None);
        v.write(base + 4, b"abcd");
        let mut out = [0u8; 6];
        v.read(base + 3, &mut out);
        assert_eq!(&out, b"\0abcd\0");
        assert_eq!(&buf[4..8], b"abcd");
    }

    #[test]
    fn invalidate_checks_pd_and_sticks() {
        let mut t = MrTable::default();
        t.insert(0, 0x300, Region::new(1, 0x1000, 16, Access::ALL), 0);
        let mut v = t.view(0, None, None, None);
        assert_eq!(
            v.invalidate(0x300, 2),
            Err(InvalidateError::NotInvalidatable)
        );
        assert_eq!(v.invalidate(0x999, 1), Err(InvalidateError::Unknown));
        assert_eq!(v.invalidate(0x300, 1), Ok(()));
        assert_eq!(
            check(&v, 0x300, 1, 0x1000, 1, Access::REMOTE_WRITE),
            Err(ProtectionError::Invalidated)
        );
        assert_eq!(
            v.invalidate(INLINE_STAG, 1),
            Err(InvalidateError::NotInvalidatable)
        );
    }

    #[test]
    fn inline_region_is_local_only_and_private_to_the_view() {
        let mut ib = InlineBuf::new(2, 16).unwrap();
        let (addr, len) = ib.stage([&b"hello "[..], &b"world"[..]]).unwrap();
        assert_eq!(len, 11);
        let mut t = MrTable::default();
        let v = t.view(0, None, Some(ib.region(5)), None);
        assert_eq!(check(&v, INLINE_STAG, 5, addr, 11, Access::NONE), Ok(()));
        assert_eq!(
            check(&v, INLINE_STAG, 5, addr, 1, Access::REMOTE_READ),
            Err(ProtectionError::Access)
        );
        assert_eq!(
            check(&v, INLINE_STAG, 5, addr, 1, Access::REMOTE_WRITE),
            Err(ProtectionError::Access)
        );
        let mut out = [0u8; 11];
        v.read(addr, &mut out);
        assert_eq!(&out, b"hello world");
        let other = t.view(0, None, None, None);
        assert_eq!(other.region(INLINE_STAG), None);
    }

    #[test]
    fn inline_slots_rotate_and_refuse_oversize() {
        let mut ib = InlineBuf::new(1, 4).unwrap();
        assert!(ib.stage([&b"12345"[..]]).is_none());
        let (a0, _) = ib.stage([&b"1234"[..]]).unwrap();
        let (again, _) = ib.stage([&b"1"[..]]).unwrap();
        assert_eq!(a0, again, "an uncommitted slot is reused");
        ib.commit();
        let (a1, _) = ib.stage([&b"x"[..]]).unwrap();
        assert_ne!(a0, a1);
        ib.commit();
        let (a2, _) = ib.stage([&b"y"[..]]).unwrap();
        assert_eq!(a0, a2);
        assert!(InlineBuf::new(0, 4).is_none());
    }

    /// An MR of PD 1 at 0x1000..0x2000 that windows may be bound to, and
    /// a window of each type in PD 1.
    fn windows() -> MrTable {
        let mut t = MrTable::default();
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ;
        let flags = u32::from(access.bits()) | IBV_ACCESS_MW_BIND;
        t.insert(0, 0x100, Region::new(1, 0x1000, 0x1000, access), flags);
        t.add_window(0, 0x200, 1, MwType::One);
        t.add_window(0, 0x300, 1, MwType::Two);
        t
    }

    fn bind(mw: u32, new_stag: u32, addr: u64, len: u64, access: u32) -> Bind {
        Bind {
            mw,
            new_stag,
            mr: Some(0x100),
            addr,
            len,
            access,
        }
    }

    const RW: u32 = 2 | 4;

    #[test]
    fn a_bound_window_grants_its_range_and_rights_to_its_stag_only() {
        let mut t = windows();
        let b = bind(0x200, 0x201, 0x1800, 0x100, RW);
        assert_eq!(t.check_bind(0, 1, &b), Ok(()));
        t.bind(0, 7, &b);
        let v = t.view(0, Some(9), None, None);
        let w = Access::REMOTE_WRITE;
        assert_eq!(check(&v, 0x201, 1, 0x1800, 0x100, w), Ok(()));
        assert_eq!(
            check(&v, 0x201, 1, 0x17ff, 1, w),
            Err(ProtectionError::Bounds)
        );
        assert_eq!(
            check(&v, 0x201, 1, 0x1800, 1, Access::REMOTE_ATOMIC),
            Err(ProtectionError::Access)
        );
        assert_eq!(
            check(&v, 0x201, 2, 0x1800, 1, w),
            Err(ProtectionError::WrongPd)
        );
        // The key before the bind is no longer the window's.
        assert_eq!(
            check(&v, 0x200, 1, 0x1800, 1, w),
            Err(ProtectionError::UnknownStag)
        );
        assert_eq!(t.remove(0, 0x100).map_err(|e| e.errno()), Err(libc::EBUSY));
        // Bound to nothing (type 1): unusable, and the MR is free again.
        let none = Bind {
            mr: None,
            ..bind(0x201, 0x202, 0, 0, 0)
        };
        assert_eq!(t.check_bind(0, 1, &none), Ok(()));
        t.bind(0, 7, &none);
        let v = t.view(0, Some(9), None, None);
        assert_eq!(
            check(&v, 0x202, 1, 0x1800, 1, w),
            Err(ProtectionError::Invalidated)
        );
        assert!(t.remove(0, 0x100).unwrap().is_some());
    }

    #[test]
    fn binds_that_break_a_rule_are_refused() {
        let mut t = windows();
        t.insert(0, 0x400, Region::new(1, 0x4000, 0x100, Access::ALL), 15);
        let no_local = u32::from(Access::REMOTE_READ.bits()) | IBV_ACCESS_MW_BIND;
        t.insert(
            0,
            0x500,
            Region::new(1, 0x5000, 0x100, Access::REMOTE_READ),
            no_local,
        );
        let ok = bind(0x200, 0x201, 0x1000, 0x1000, RW);
        assert_eq!(t.check_bind(0, 1, &ok), Ok(()));
        let refused = [
            (bind(0x200, 0x201, 0x1000, 0x1000, RW), 2, libc::EINVAL), // QP of another PD
            (bind(0x600, 0x601, 0x1000, 0x10, RW), 1, libc::EINVAL),   // no such window
            (bind(0x200, 0x301, 0x1000, 0x10, RW), 1, libc::EINVAL),   // another index
            (bind(0x200, 0x201, 0xfff, 0x10, RW), 1, libc::EINVAL),    // before the MR
            (bind(0x200, 0x201, 0x1ff8, 0x10, RW), 1, libc::EINVAL),   // past its end
            (bind(0x200, 0x201, u64::MAX, 2, RW), 1, libc::EINVAL),    // wraps
            (bind(0x200, 0x201, 0x1000, 1, RW | 32), 1, libc::EINVAL), // zero-based
            (bind(0x300, 0x301, 0x1000, 0, RW), 1, libc::EINVAL),      // type 2, empty
            (
                Bind {
                    mr: Some(0x400),
                    ..bind(0x200, 0x201, 0x4000, 1, RW)
                },
                1,
                libc::EACCES, // MR without the bind right
            ),
            (
                Bind {
                    mr: Some(0x500),
                    ..bind(0x200, 0x201, 0x5000, 1, 2)
                },
                1,
                libc::EACCES, // remote write over an MR without local write
            ),
            (
                Bind {
                    mr: None,
                    ..bind(0x300, 0x301, 0, 0, 0)
                },
                1,
                libc::EINVAL, // type 2 bound to nothing
            ),
        ];
        for (b, pd, errno) in refused {
            assert_eq!(
                t.check_bind(0, pd, &b).map_err(|e| e.errno()),
                Err(errno),
                "{b:?}"
            );
        }
        // A remote read window over an MR without local write is fine.
        let ro = Bind {
            mr: Some(0x500),
            ..bind(0x200, 0x201, 0x5000, 1, 4)
        };
        assert_eq!(t.check_bind(0, 1, &ro), Ok(()));
        // A type 2 window must be free to be bound.
        let b2 = bind(0x300, 0x301, 0x1000, 0x10, RW);
        t.bind(0, 7, &b2);
        assert_eq!(
            t.check_bind(0, 1, &bind(0x301, 0x302, 0x1000, 0x10, RW))
                .map_err(|e| e.errno()),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn type_2_windows_belong_to_their_qp_and_are_invalidated() {
        let mut t = windows();
        t.bind(0, 7, &bind(0x300, 0x3a0, 0x1000, 0x10, RW));
        let w = Access::REMOTE_WRITE;
        let other = t.view(0, Some(8), None, None);
        assert_eq!(
            check(&other, 0x3a0, 1, 0x1000, 1, w),
            Err(ProtectionError::UnknownStag)
        );
        assert_eq!(
            t.invalidate(0, Some(8), 0x3a0, 1),
            Err(InvalidateError::Unknown)
        );
        assert_eq!(
            t.invalidate(0, Some(7), 0x3a0, 2),
            Err(InvalidateError::NotInvalidatable)
        );
        let mut own = t.view(0, Some(7), None, None);
        assert_eq!(check(&own, 0x3a0, 1, 0x1000, 1, w), Ok(()));
        assert_eq!(own.invalidate(0x3a0, 1), Ok(()));
        assert_eq!(
            check(&own, 0x3a0, 1, 0x1000, 1, w),
            Err(ProtectionError::Invalidated)
        );
        // Free again: bound anew with another key, then its QP goes.
        let again = bind(0x3a0, 0x3a1, 0x1000, 0x10, RW);
        assert_eq!(t.check_bind(0, 1, &again), Ok(()));
        t.bind(0, 7, &again);
        assert_eq!(t.remove(0, 0x100).map_err(|e| e.errno()), Err(libc::EBUSY));
        t.unbind_qp(0, 7);
        assert!(t.window(0, 0x3a1).unwrap().bound.is_none());
        // Type 1 windows are never invalidated.
        t.bind(0, 7, &bind(0x200, 0x201, 0x1000, 0x10, RW));
        assert_eq!(
            t.invalidate(0, Some(7), 0x201, 1),
            Err(InvalidateError::NotInvalidatable)
        );
        // Deallocation unbinds.
        assert!(t.remove_window(0, 0x201).is_some());
        assert!(t.remove(0, 0x100).unwrap().is_some());
    }
}
