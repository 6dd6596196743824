//! Memory regions and the protection checks that run before any byte moves.
//!
//! The table and the memory belong to the caller (liburdma: registered
//! application memory; tests: plain vectors). The core only asks questions
//! through [`Memory`] and reads or writes ranges it has checked first.

use crate::conn::srq::Srq;
use crate::verbs::AtomicOp;

/// Access rights of a region (a subset of `ibv_access_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Access(u8);

impl Access {
    pub const NONE: Access = Access(0);
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const REMOTE_ATOMIC: Access = Access(8);
    pub const ALL: Access = Access(15);

    pub const fn union(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
    pub const fn contains(self, o: Access) -> bool {
        self.0 & o.0 == o.0
    }
    pub const fn bits(self) -> u8 {
        self.0
    }
    pub const fn from_bits(b: u8) -> Access {
        Access(b & 15)
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        self.union(o)
    }
}

/// What the table knows about one STag. Tagged offsets are virtual
/// addresses: a region covers `[base, base + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub pd: u32,
    pub base: u64,
    pub len: u64,
    pub access: Access,
    pub valid: bool,
}

impl Region {
    /// A region that has not been invalidated.
    pub fn new(pd: u32, base: u64, len: u64, access: Access) -> Self {
        Region {
            pd,
            base,
            len,
            access,
            valid: true,
        }
    }
}

/// Why an STag cannot be invalidated by a remote Send with Invalidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidateError {
    Unknown,
    NotInvalidatable,
}

/// The caller's memory and its region table.
///
/// `write` and `read` are only called for ranges that passed [`check`]
/// (or local SGEs validated when posted), so implementations may treat an
/// out-of-range call as a bug.
///
/// During one `Connection::handle_datagram_burst` call the answers of
/// `region` may change only through `invalidate`: the burst reuses a
/// region it has looked up for the following segments of the same STag
/// (still checking bounds, rights and PD for each). An implementation
/// shared with other threads keeps its table fixed for the call, as it
/// must anyway so that nothing is deregistered between a check and the
/// write it allows.
pub trait Memory {
    fn region(&self, stag: u32) -> Option<Region>;
    /// Marks the STag invalid in response to a remote Send with Invalidate.
    fn invalidate(&mut self, stag: u32, pd: u32) -> Result<(), InvalidateError>;
    fn write(&mut self, addr: u64, data: &[u8]);
    fn read(&self, addr: u64, out: &mut [u8]);
    /// Applies `op` to the 8-byte-aligned 64-bit integer at `addr`, as one
    /// indivisible step with respect to every other atomic on that memory,
    /// and returns the value it found.
    fn atomic(&mut self, addr: u64, op: AtomicOp) -> u64;
    /// The shared receive queue of a connection created with
    /// [`Config::srq`](crate::Config::srq), where its messages take their
    /// receives.
    fn srq(&mut self) -> Option<&mut Srq> {
        None
    }
}

/// A failed protection check, in the order the checks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtectionError {
    /// No region has this STag.
    UnknownStag,
    /// The region was invalidated or deregistered.
    Invalidated,
    /// The region belongs to another protection domain.
    WrongPd,
    /// `to + len` overflows 64 bits.
    Wrap,
    /// The range is not inside the region.
    Bounds,
    /// The region lacks the needed right.
    Access,
}

impl core::fmt::Display for ProtectionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ProtectionError::UnknownStag => "unknown STag",
            ProtectionError::Invalidated => "STag invalidated",
            ProtectionError::WrongPd => "STag belongs to another protection domain",
            ProtectionError::Wrap => "tagged offset wraps",
            ProtectionError::Bounds => "range outside the region",
            ProtectionError::Access => "access right missing",
        })
    }
}

impl std::error::Error for ProtectionError {}

/// Checks that `[to, to + len)` of `stag` may be accessed with `need` by a
/// QP in protection domain `pd`. A zero-length range still needs a valid
/// STag of the right PD and rights, and an offset inside the region.
#[inline]
pub fn check<M: Memory + ?Sized>(
    mem: &M,
    stag: u32,
    pd: u32,
    to: u64,
    len: u64,
    need: Access,
) -> Result<(), ProtectionError> {
    let r = mem.region(stag).ok_or(ProtectionError::UnknownStag)?;
    check_region(&r, pd, to, len, need)
}

/// The checks of [`check`] after the region lookup.
#[inline]
pub fn check_region(
    r: &Region,
    pd: u32,
    to: u64,
    len: u64,
    need: Access,
) -> Result<(), ProtectionError> {
    if !r.valid {
        return Err(ProtectionError::Invalidated);
    }
    if r.pd != pd {
        return Err(ProtectionError::WrongPd);
    }
    let end = to.checked_add(len).ok_or(ProtectionError::Wrap)?;
    let rend = r.base.checked_add(r.len).ok_or(ProtectionError::Bounds)?;
    if to < r.base || end > rend {
        return Err(ProtectionError::Bounds);
    }
    if !r.access.contains(need) {
        return Err(ProtectionError::Access);
    }
    Ok(())
}

/// A plain in-memory implementation: one flat byte array addressed from 0
/// and a region table. Used by tests, the simulator and benchmarks.
#[derive(Clone, Debug, Default)]
pub struct VecMemory {
    pub bytes: Vec<u8>,
    /// Few regions per test: a linear scan beats hashing.
    regions: Vec<(u32, Region, bool)>,
    /// The shared receive queue a connection with `Config::srq` uses.
    pub srq: Option<Srq>,
}

impl VecMemory {
    pub fn new(size: usize) -> Self {
        VecMemory {
            bytes: vec![0; size],
            regions: Default::default(),
            srq: None,
        }
    }
    /// Registers a region; `invalidatable` says whether a remote Send with
    /// Invalidate may invalidate it.
    pub fn register(&mut self, stag: u32, region: Region, invalidatable: bool) {
        self.deregister(stag);
        self.regions.push((stag, region, invalidatable));
    }
    pub fn deregister(&mut self, stag: u32) {
        self.regions.retain(|r| r.0 != stag);
    }
}

impl Memory for VecMemory {
    #[inline]
    fn region(&self, stag: u32) -> Option<Region> {
        self.regions.iter().find(|r| r.0 == stag).map(|r| r.1)
    }
    fn invalidate(&mut self, stag: u32, pd: u32) -> Result<(), InvalidateError> {
        match self.regions.iter_mut().find(|r| r.0 == stag) {
            None => Err(InvalidateError::Unknown),
            Some((_, r, inv)) if !*inv || r.pd != pd => Err(InvalidateError::NotInvalidatable),
            Some((_, r, _)) => {
                r.valid = false;
                Ok(())
            }
        }
    }
    #[inline]
    fn write(&mut self, addr: u64, data: &[u8]) {
        let a = addr as usize;
        self.bytes[a..a + data.len()].copy_from_slice(data);
    }
    #[inline]
    fn read(&self, addr: u64, out: &mut [u8]) {
        let a = addr as usize;
        out.copy_from_slice(&self.bytes[a..a + out.len()]);
    }
    fn srq(&mut self) -> Option<&mut Srq> {
        self.srq.as_mut()
    }
    /// One thread owns a `VecMemory`: a read and a write are indivisible.
    fn atomic(&mut self, addr: u64, op: AtomicOp) -> u64 {
        let mut b = [0u8; 8];
        self.read(addr, &mut b);
        let old = u64::from_ne_bytes(b);
        self.write(addr, &op.apply(old).to_ne_bytes());
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> VecMemory {
        let mut m = VecMemory::new(4096);
        m.register(1, Region::new(7, 1000, 100, Access::REMOTE_WRITE), true);
        m
    }

    #[test]
    fn checks_in_order() {
        let m = mem();
        let w = Access::REMOTE_WRITE;
        assert_eq!(check(&m, 1, 7, 1000, 100, w), Ok(()));
        assert_eq!(check(&m, 1, 7, 1100, 0, w), Ok(()));
        assert_eq!(
            check(&m, 2, 7, 1000, 1, w),
            Err(ProtectionError::UnknownStag)
        );
        assert_eq!(check(&m, 1, 8, 1000, 1, w), Err(ProtectionError::WrongPd));
        assert_eq!(check(&m, 1, 7, 999, 1, w), Err(ProtectionError::Bounds));
        assert_eq!(check(&m, 1, 7, 1001, 100, w), Err(ProtectionError::Bounds));
        assert_eq!(check(&m, 1, 7, u64::MAX, 2, w), Err(ProtectionError::Wrap));
        assert_eq!(
            check(&m, 1, 7, 1000, 1, Access::REMOTE_READ),
            Err(ProtectionError::Access)
        );
        let mut m = m;
        m.invalidate(1, 7).unwrap();
        assert_eq!(
            check(&m, 1, 7, 1000, 1, w),
            Err(ProtectionError::Invalidated)
        );
    }
}
