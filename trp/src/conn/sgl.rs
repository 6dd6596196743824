//! Copies between a scatter/gather list and the caller's memory. The
//! SGEs were checked when the work request was posted.

use std::ops::Deref;

use crate::mr::{self, Access, Memory};
use crate::verbs::{PostError, Sge};

/// Checks a work request's SGEs against the region table for `need` in
/// protection domain `pd`, and returns their total length.
pub(super) fn check_sges<M: Memory + ?Sized>(
    mem: &M,
    pd: u32,
    sges: &[Sge],
    need: Access,
) -> Result<u32, PostError> {
    let mut total: u64 = 0;
    for s in sges {
        mr::check(mem, s.lkey, pd, s.addr, u64::from(s.len), need)
            .map_err(PostError::LocalProtection)?;
        total += u64::from(s.len);
    }
    if total > 1 << 31 {
        return Err(PostError::TooLong);
    }
    Ok(total as u32)
}

/// A work request's scatter/gather list, kept with the request until it completes. Nearly
/// every request has one or two elements: those are held in place, so that a post allocates
/// nothing (an allocation and its free were a twentieth of a small message's instructions
/// in the provider's ping-pong); longer lists go on the heap.
#[derive(Clone, Debug)]
pub(super) enum SgeList {
    Inline {
        n: u8,
        sges: [Sge; 2],
    },
    Heap(Vec<Sge>),
    /// No longer the caller's memory: a copy of the bytes the list held,
    /// taken when the caller let go of its memory (`Connection::release_memory`).
    /// As a list it is empty: nothing lands in it.
    Copied(Box<[u8]>),
}

impl SgeList {
    pub(super) fn new(sges: &[Sge]) -> SgeList {
        let n = sges.len();
        if n > 2 {
            return SgeList::Heap(sges.to_vec());
        }
        let none = Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        };
        let mut inline = [none; 2];
        inline[..n].copy_from_slice(sges);
        SgeList::Inline {
            n: n as u8,
            sges: inline,
        }
    }

    /// Copies bytes `off..off+out.len()` of the list's data into `out`.
    #[inline(always)]
    pub(super) fn gather<M: Memory + ?Sized>(&self, mem: &M, off: u64, out: &mut [u8]) {
        match self {
            SgeList::Copied(data) => {
                let from = usize::try_from(off).unwrap_or(usize::MAX);
                if let Some(src) = data.get(from..from.saturating_add(out.len())) {
                    out.copy_from_slice(src);
                }
            }
            sges => gather(mem, sges, off, out),
        }
    }

    /// The list replaced by a copy of its first `len` bytes.
    pub(super) fn copy_out<M: Memory + ?Sized>(&mut self, mem: &M, len: u32) {
        if matches!(self, SgeList::Copied(_)) {
            return;
        }
        let mut data = vec![0; len as usize].into_boxed_slice();
        gather(mem, self, 0, &mut data);
        *self = SgeList::Copied(data);
    }
}

impl Deref for SgeList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        match self {
            SgeList::Inline { n, sges } => &sges[..usize::from(*n)],
            SgeList::Heap(v) => v,
            SgeList::Copied(_) => &[],
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_its_elements_in_order_whatever_its_length() {
        let all: Vec<Sge> = (0..5u32)
            .map(|i| Sge {
                addr: u64::from(i) * 100,
                len: i + 1,
                lkey: i,
            })
            .collect();
        for n in 0..=all.len() {
            let l = SgeList::new(&all[..n]);
            assert_eq!(&*l, &all[..n]);
            assert_eq!(matches!(l, SgeList::Heap(_)), n > 2);
        }
    }
}
