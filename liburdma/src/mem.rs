//! The process's registered memory as trp sees it: a table of the MRs
//! registered through this provider (STag → region) and a [`trp::Memory`]
//! view of it for one QP, which copies straight into and out of the
//! application's memory.
//!
//! trp checks every access (STag known and valid, protection domain,
//! bounds, rights) before it calls `read` or `write`; the view only moves
//! bytes. The table lives under the engine's lock, so a deregistration
//! cannot run between a check and the copy it allowed.
//!
//! Tagged offsets are virtual addresses: a region's base is the address it
//! was registered at (`ibv_reg_mr`). A registration whose I/O virtual
//! address differs from its address (`ibv_reg_mr_iova`) is refused, as the
//! copies use the addresses trp hands them as pointers.

use std::sync::atomic::{AtomicU64, Ordering};
use trp::mr::InvalidateError;
use trp::{Access, AtomicOp, Memory, Region, Srq};

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
}

/// The MRs registered in this process, by (device, STag): STags are unique
/// per device only.
#[derive(Default, Debug)]
pub struct MrTable {
    mrs: IntMap<(u32, u32), Mr>,
}

/// `ibv_access_flags` → trp's rights (the same three bits).
pub fn access_from_ibv(flags: u32) -> Access {
    Access::from_bits((flags & 15) as u8)
}

impl MrTable {
    pub fn insert(&mut self, dev: u32, stag: u32, region: Region) {
        self.mrs.insert((dev, stag), Mr { region });
    }
    pub fn remove(&mut self, dev: u32, stag: u32) -> Option<Mr> {
        self.mrs.remove(&(dev, stag))
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

    /// The [`Memory`] one QP of device `dev` sees: the table, plus its own
    /// inline buffer at [`INLINE_STAG`] when it has one, and the shared
    /// receive queue its receives come from when it has one.
    pub fn view<'a>(
        &'a mut self,
        dev: u32,
        inline: Option<Region>,
        srq: Option<&'a mut Srq>,
    ) -> QpMemory<'a> {
        QpMemory {
            table: self,
            dev,
            inline,
            srq,
        }
    }
}

/// The memory of one QP: see [`MrTable::view`].
pub struct QpMemory<'a> {
    table: &'a mut MrTable,
    dev: u32,
    inline: Option<Region>,
    srq: Option<&'a mut Srq>,
}

impl Memory for QpMemory<'_> {
    #[inline]
    fn region(&self, stag: u32) -> Option<Region> {
        if stag == INLINE_STAG {
            return self.inline;
        }
        self.table.mrs.get(&(self.dev, stag)).map(|m| m.region)
    }

    fn invalidate(&mut self, stag: u32, pd: u32) -> Result<(), InvalidateError> {
        if stag == INLINE_STAG {
            return Err(InvalidateError::NotInvalidatable);
        }
        match self.table.mrs.get_mut(&(self.dev, stag)) {
            None => Err(InvalidateError::Unknown),
            Some(m) if m.region.pd != pd => Err(InvalidateError::NotInvalidatable),
            Some(m) => {
                m.region.valid = false;
                Ok(())
            }
        }
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
        );
        let v = t.view(1, None, None);
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
        let v = t.view(2, None, None);
        assert_eq!(v.region(0x100), None);
    }

    #[test]
    fn copies_go_to_application_memory() {
        let mut t = MrTable::default();
        let mut buf = vec![0u8; 16];
        let base = buf.as_mut_ptr() as u64;
        t.insert(0, 0x200, Region::new(1, base, 16, Access::ALL));
        let mut v = t.view(0, None, None);
        v.write(base + 4, b"abcd");
        let mut out = [0u8; 6];
        v.read(base + 3, &mut out);
        assert_eq!(&out, b"\0abcd\0");
        assert_eq!(&buf[4..8], b"abcd");
    }

    #[test]
    fn invalidate_checks_pd_and_sticks() {
        let mut t = MrTable::default();
        t.insert(0, 0x300, Region::new(1, 0x1000, 16, Access::ALL));
        let mut v = t.view(0, None, None);
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
        let v = t.view(0, Some(ib.region(5)), None);
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
        let other = t.view(0, None, None);
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
}
