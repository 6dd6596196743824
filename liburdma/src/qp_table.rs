//! The engine's QPs in key order, in one vector.
//!
//! Every call an application makes to poll takes a round over the process's QPs, most often
//! one or a few of them: a walk over a slice costs next to nothing, where a tree costs a
//! search to find where the round starts and two more to split it there (a third of what
//! a round over one idle QP cost, by callgrind). QPs come and go rarely, so an insertion or
//! removal that moves the entries after it is cheap enough, and a lookup by key is a binary
//! search.

use crate::engine::QpKey;

pub struct QpTable<V> {
    entries: Vec<(QpKey, V)>,
}

/// Some of a table's entries, in key order.
pub type Entries<'a, V> = &'a mut [(QpKey, V)];

impl<V> Default for QpTable<V> {
    fn default() -> Self {
        QpTable {
            entries: Vec::new(),
        }
    }
}

impl<V> QpTable<V> {
    fn find(&self, key: &QpKey) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// Adds `v` under `key`, replacing what was there.
    pub fn insert(&mut self, key: QpKey, v: V) {
        match self.find(&key) {
            Ok(i) => self.entries[i].1 = v,
            Err(i) => self.entries.insert(i, (key, v)),
        }
    }

    pub fn remove(&mut self, key: &QpKey) -> Option<V> {
        let i = self.find(key).ok()?;
        Some(self.entries.remove(i).1)
    }

    pub fn get(&self, key: &QpKey) -> Option<&V> {
        let i = self.find(key).ok()?;
        Some(&self.entries[i].1)
    }

    pub fn get_mut(&mut self, key: &QpKey) -> Option<&mut V> {
        let i = self.find(key).ok()?;
        Some(&mut self.entries[i].1)
    }

    pub fn contains_key(&self, key: &QpKey) -> bool {
        self.find(key).is_ok()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// The entries from the first key after `after` (from the first key when `after` is
    /// `None` or the last), then the ones before it: a round that starts one QP further on
    /// each time. The first of them, if any, is where the next round should start after.
    pub fn rotated_after(&mut self, after: Option<QpKey>) -> (Entries<'_, V>, Entries<'_, V>) {
        let start = match after {
            None => 0,
            Some(k) => match self.find(&k) {
                Ok(i) => i + 1,
                Err(i) => i,
            },
        };
        let start = if start >= self.entries.len() {
            0
        } else {
            start
        };
        let (before, from) = self.entries.split_at_mut(start);
        (from, before)
    }
}

/// `table[&key]`, for tests: panics when there is no such QP.
#[cfg(test)]
impl<V> std::ops::Index<&QpKey> for QpTable<V> {
    type Output = V;
    fn index(&self, key: &QpKey) -> &V {
        self.get(key).expect("no such QP")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(t: &mut QpTable<u32>, after: Option<QpKey>) -> Vec<u32> {
        let (a, b) = t.rotated_after(after);
        a.iter().chain(b.iter()).map(|(_, v)| *v).collect()
    }

    #[test]
    fn keeps_key_order_and_finds_by_key() {
        let mut t = QpTable::default();
        for (i, k) in [(1, 7), (1, 3), (2, 1), (1, 5)].into_iter().enumerate() {
            t.insert(k, i as u32);
        }
        assert_eq!(t.len(), 4);
        assert_eq!(keys(&mut t, None), vec![1, 3, 0, 2]);
        assert_eq!(t.get(&(1, 5)), Some(&3));
        t.insert((1, 5), 9);
        assert_eq!((t.len(), t.get(&(1, 5))), (4, Some(&9)));
        assert_eq!(t.remove(&(1, 3)), Some(1));
        assert_eq!(t.remove(&(1, 3)), None);
        assert!(!t.contains_key(&(1, 3)) && t.contains_key(&(2, 1)));
        *t.get_mut(&(2, 1)).unwrap() += 10;
        assert_eq!(t.values().copied().collect::<Vec<_>>(), vec![9, 0, 12]);
    }

    #[test]
    fn rounds_start_one_further_on_and_wrap() {
        let mut t = QpTable::default();
        for k in [10, 20, 30] {
            t.insert((1, k), k);
        }
        assert_eq!(keys(&mut t, Some((1, 10))), vec![20, 30, 10]);
        assert_eq!(keys(&mut t, Some((1, 30))), vec![10, 20, 30]);
        // A key that has gone: the next one after where it was.
        assert_eq!(keys(&mut t, Some((1, 25))), vec![30, 10, 20]);
        assert_eq!(keys(&mut t, Some((9, 9))), vec![10, 20, 30]);
        let mut empty = QpTable::<u32>::default();
        assert!(keys(&mut empty, Some((1, 1))).is_empty());
    }
}
