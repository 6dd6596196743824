//! Copies between a scatter/gather list and the caller's memory. The
//! SGEs were checked when the work request was posted.

use crate::mr::Memory;
use crate::verbs::Sge;

/// Copies bytes `off..off+out.len()` of a scatter list out of memory.
#[inline(always)]
pub(super) fn gather<M: Memory + ?Sized>(mem: &M, sges: &[Sge], mut off: u64, mut out: &mut [u8]) {
    // Most work requests have one SGE: no loop, one copy.
    if let [s] = sges {
        if off + out.len() as u64 <= u64::from(s.len) {
            mem.read(s.addr + off, out);
            return;
        }
    }
    for s in sges {
        if out.is_empty() {
            return;
        }
        let l = u64::from(s.len);
        if off >= l {
            off -= l;
            continue;
        }
        let n = ((l - off) as usize).min(out.len());
        let (head, tail) = out.split_at_mut(n);
        mem.read(s.addr + off, head);
        out = tail;
        off = 0;
    }
}

/// Writes `data` at offset `off` of a scatter list.
#[inline]
pub(super) fn scatter<M: Memory + ?Sized>(
    mem: &mut M,
    sges: &[Sge],
    mut off: u64,
    mut data: &[u8],
) {
    for s in sges {
        if data.is_empty() {
            return;
        }
        let l = u64::from(s.len);
        if off >= l {
            off -= l;
            continue;
        }
        let n = ((l - off) as usize).min(data.len());
        mem.write(s.addr + off, &data[..n]);
        data = &data[n..];
        off = 0;
    }
}
