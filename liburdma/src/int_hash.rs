//! The hash of the provider's tables, whose keys are pairs of small integers (a device and
//! a CQ id, a device and an STag).
//!
//! std's SipHash is built to withstand keys chosen by an attacker, and costs its price on
//! every lookup: two per message on the data path (the MR a Write names, the CQ a
//! completion goes to), some 170 instructions each by callgrind. Here the keys in a table are
//! the process's own (the kernel's STags are an index and an 8-bit key); a peer chooses only
//! the STags looked up, and a lookup of a key that is absent stops at the first empty slot
//! whatever the key, so it cannot make lookups slow. One multiplication per word spreads the
//! bits over the whole hash, the high ones included, which the table's probing uses.

use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`IntHasher`].
pub type IntMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl IntHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        // An odd constant with its bits spread (the 64-bit golden ratio).
        self.0 = (self.0.rotate_left(26) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    /// A product's low bits depend only on its factors' low bits, and the table picks a
    /// bucket by the hash's low bits: the rotation brings the well-mixed high bits down, so
    /// that keys differing only above their low bits (STags of one random key byte) do not
    /// share buckets.
    #[inline]
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash(k: (u32, u32)) -> u64 {
        BuildHasherDefault::<IntHasher>::default().hash_one(k)
    }

    #[test]
    fn pairs_that_differ_anywhere_hash_apart() {
        let mut seen = std::collections::HashSet::new();
        for dev in 0..4u32 {
            for index in 1..512u32 {
                for key in [0u32, 1, 0x5a, 0xff] {
                    assert!(seen.insert(hash((dev, index << 8 | key))));
                }
            }
        }
        // The two halves of a pair are not interchangeable.
        assert_ne!(hash((1, 2)), hash((2, 1)));
    }

    #[test]
    fn sequential_stags_spread_over_the_high_bits() {
        // The table's control bytes take the top 7 bits: consecutive STags must not share
        // them all.
        let tops: std::collections::HashSet<u64> =
            (1..200u32).map(|i| hash((1, i << 8)) >> 57).collect();
        assert!(tops.len() > 64, "only {} of 128 top-bit values", tops.len());
    }

    #[test]
    fn keys_alike_in_their_low_bits_spread_over_the_buckets() {
        // The same key byte in every STag: the bucket (the low 9 bits of 512) must still vary.
        let buckets: std::collections::HashSet<u64> = (1..257u32)
            .map(|i| hash((1, i << 8 | 0x5a)) & 511)
            .collect();
        assert!(buckets.len() > 128, "only {} of 512 buckets", buckets.len());
    }

    #[test]
    fn works_as_a_map() {
        let mut m: IntMap<(u32, u32), u32> = IntMap::default();
        for i in 0..1000 {
            m.insert((i % 3, i), i);
        }
        assert!((0..1000).all(|i| m.get(&(i % 3, i)) == Some(&i)));
        assert_eq!(m.get(&(1, 0)), None);
    }
}
