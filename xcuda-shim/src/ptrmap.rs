//! Lock-free, fixed-capacity map from allocation key (device pointer, VMM handle, array handle)
//! to the bytes counted for it: open addressing over atomics, no locks, no allocation after
//! construction, so it is safe across threads, signals and fork.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

const EMPTY: u64 = 0;
const TOMB: u64 = 1;

/// What an entry holds besides its key: bytes and owner side by side (one cache line per
/// insert for both). Keys stay in an array of their own: probing reads only keys, and a compact
/// key array (8 bytes a slot) stays in cache where 32-byte slots did not (the hotpath bench's
/// alloc+free pair took twice as long with key, bytes and owner in one slot).
#[repr(C, align(16))]
struct Entry {
    val: AtomicU64,
    /// Owner of the entry (the CUDA context it was made in; 0 = none recorded).
    owner: AtomicU64,
}

/// Map of live allocations. Keys are unique while live (a pointer is not handed out twice).
pub struct PtrMap {
    keys: Box<[AtomicU64]>,
    entries: Box<[Entry]>,
    mask: usize,
    /// The largest distance from its start slot at which any insert placed a key: a lookup
    /// never needs to look further. Removed entries leave tombstones, and after as many
    /// allocations as the table has slots none is EMPTY any more, so without this bound every
    /// lookup of an unknown key (a free of memory the shim never counted, or of another GPU's
    /// allocation in a multi-GPU process, which asks each GPU's map in turn) walked the whole
    /// table: 65,536 slots per cuMemFree.
    max_probe: AtomicUsize,
}

fn stored(key: u64) -> Option<u64> {
    // Shift keys by 2 so that 0 and 1 stay free for EMPTY/TOMB; the two keys that would wrap
    // onto them cannot be tracked (callers treat that like a full table).
    key.checked_add(2)
}

fn zeroed(n: usize) -> (Box<[AtomicU64]>, Box<[Entry]>) {
    ((0..n).map(|_| AtomicU64::new(0)).collect(), (0..n).map(|_| Entry { val: AtomicU64::new(0), owner: AtomicU64::new(0) }).collect())
}

impl PtrMap {
    /// A map with room for `capacity` (rounded up to a power of two) live entries.
    pub fn new(capacity: usize) -> Self {
        let n = capacity.next_power_of_two().max(16);
        let (keys, entries) = zeroed(n);
        Self { keys, entries, mask: n - 1, max_probe: AtomicUsize::new(0) }
    }

    fn start(&self, k: u64) -> usize {
        ((k >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize & self.mask
    }

    /// Records `bytes` for `key`; `false` if the table is full (caller must not keep the
    /// allocation untracked).
    pub fn insert(&self, key: u64, bytes: u64) -> bool {
        self.insert_owned(key, bytes, 0)
    }

    /// Like [`PtrMap::insert`], recording `owner` (a context handle) for [`PtrMap::remove_owned_by`].
    pub fn insert_owned(&self, key: u64, bytes: u64, owner: u64) -> bool {
        let Some(k) = stored(key) else { return false };
        let mut i = self.start(k);
        for d in 0..=self.mask {
            let key = &self.keys[i];
            let cur = key.load(Acquire);
            if cur != EMPTY && cur != TOMB {
                i = (i + 1) & self.mask;
                continue;
            }
            // Announced before the key can be seen: a lookup that may find it looks this far.
            if d > self.max_probe.load(Relaxed) {
                self.max_probe.fetch_max(d, AcqRel);
            }
            if key.compare_exchange(cur, k, AcqRel, Relaxed).is_ok() {
                let e = &self.entries[i];
                e.owner.store(owner, Release);
                e.val.store(bytes, Release);
                return true;
            }
            i = (i + 1) & self.mask;
        }
        false
    }

    /// The slot holding `key` and its stored form, if live: probes no further than any insert
    /// placed a key.
    #[inline]
    fn find(&self, key: u64) -> Option<(usize, u64)> {
        let k = stored(key)?;
        let mut i = self.start(k);
        for _ in 0..=self.max_probe.load(Acquire).min(self.mask) {
            match self.keys[i].load(Acquire) {
                EMPTY => return None,
                cur if cur == k => return Some((i, k)),
                _ => i = (i + 1) & self.mask,
            }
        }
        None
    }

    /// Removes `key`, returning the bytes counted for it; `None` for an unknown key.
    pub fn remove(&self, key: u64) -> Option<u64> {
        let (i, k) = self.find(key)?;
        // The value was stored before the key became visible to us; whoever wins the key owns it.
        let bytes = self.entries[i].val.load(Acquire);
        self.keys[i].compare_exchange(k, TOMB, AcqRel, Relaxed).is_ok().then_some(bytes)
    }

    /// Bytes recorded for `key`, if live.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.find(key).map(|(i, _)| self.entries[i].val.load(Acquire))
    }

    /// The largest distance from its start slot at which a key was ever placed (tests, bench).
    pub fn max_probe(&self) -> usize {
        self.max_probe.load(Relaxed)
    }

    /// Removes every live entry recorded for `owner` (non-zero); returns (entries, bytes).
    /// O(capacity), off the hot path (a context was destroyed).
    pub fn remove_owned_by(&self, owner: u64) -> (usize, u64) {
        let (mut n, mut bytes) = (0usize, 0u64);
        if owner == 0 {
            return (0, 0);
        }
        for (key, e) in self.keys.iter().zip(self.entries.iter()) {
            let k = key.load(Acquire);
            if k == EMPTY || k == TOMB || e.owner.load(Acquire) != owner {
                continue;
            }
            let b = e.val.load(Acquire);
            if key.compare_exchange(k, TOMB, AcqRel, Relaxed).is_ok() {
                n += 1;
                bytes = bytes.saturating_add(b);
            }
        }
        (n, bytes)
    }

    /// Empties the map (fork child: the parent's allocations are not ours).
    pub fn clear(&self) {
        for (key, e) in self.keys.iter().zip(self.entries.iter()) {
            key.store(EMPTY, Relaxed);
            e.val.store(0, Relaxed);
            e.owner.store(0, Relaxed);
        }
    }

    /// Every live `(key, bytes)`; O(capacity), off the hot path.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        self.keys
            .iter()
            .zip(self.entries.iter())
            .filter_map(|(key, e)| match key.load(Acquire) {
                EMPTY | TOMB => None,
                k => Some((k - 2, e.val.load(Acquire))),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    #[test]
    fn insert_get_remove_and_unknown() {
        let m = PtrMap::new(16);
        assert!(m.insert(0, 5), "null-ish keys are still trackable");
        assert!(m.insert(0x7f00_0000_1000, 4096));
        assert_eq!(m.get(0x7f00_0000_1000), Some(4096));
        assert_eq!(m.remove(0x7f00_0000_1000), Some(4096));
        assert_eq!(m.remove(0x7f00_0000_1000), None, "double free is unknown");
        assert_eq!(m.remove(0xdead), None);
        assert_eq!(m.remove(0), Some(5));
        assert!(!m.insert(u64::MAX, 1));
    }

    #[test]
    fn full_table_refuses() {
        let m = PtrMap::new(16);
        for k in 0..16u64 {
            assert!(m.insert(k * 256 + 0x1000, 1));
        }
        assert!(!m.insert(0x99_0000, 1));
        m.remove(0x1000);
        assert!(m.insert(0x99_0000, 1), "tombstone reused");
    }

    /// After as many insert/remove cycles as the table has slots, no slot is EMPTY: a lookup of
    /// an unknown key still stops after the longest displacement ever used (it walked the whole
    /// table before), and keys placed far from their start slot are still found.
    #[test]
    fn lookups_stop_at_the_longest_displacement() {
        let m = PtrMap::new(1 << 10);
        for i in 0..(1u64 << 12) {
            let k = 0x7f00_0000_0000 + (i << 20);
            assert!(m.insert(k, i));
            assert_eq!(m.remove(k), Some(i));
        }
        assert!(m.keys.iter().all(|k| k.load(Relaxed) != EMPTY), "every slot a tombstone");
        assert_eq!(m.max_probe(), 0, "one live key at a time never needed a second slot");
        assert_eq!(m.remove(0xdead_0000), None);
        // A cluster: keys with one start slot go to consecutive slots.
        let keys: Vec<u64> = (0..1u64 << 24).map(|j| 0x1000 + (j << 8)).filter(|k| m.start(k + 2) == m.start(0x1002)).take(3).collect();
        assert_eq!(keys.len(), 3);
        for (n, k) in keys.iter().enumerate() {
            assert!(m.insert(*k, n as u64));
        }
        assert_eq!(m.max_probe(), keys.len() - 1);
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(m.get(*k), Some(n as u64));
        }
        for (n, k) in keys.iter().enumerate().rev() {
            assert_eq!(m.remove(*k), Some(n as u64));
        }
    }

    #[test]
    fn concurrent_disjoint_keys() {
        let m = Arc::new(PtrMap::new(1 << 12));
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for r in 0..200u64 {
                        for i in 0..100u64 {
                            assert!(m.insert((t << 40) | (i << 8), i + r));
                        }
                        for i in 0..100u64 {
                            assert_eq!(m.remove((t << 40) | (i << 8)), Some(i + r));
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(m.entries().is_empty());
    }

    #[test]
    fn remove_owned_by_takes_exactly_that_owners_entries() {
        let m = PtrMap::new(64);
        assert!(m.insert_owned(0x1000, 10, 0xa));
        assert!(m.insert_owned(0x2000, 20, 0xb));
        assert!(m.insert_owned(0x3000, 30, 0xa));
        assert!(m.insert(0x4000, 40));
        assert_eq!(m.remove_owned_by(0), (0, 0), "no owner recorded is never matched");
        assert_eq!(m.remove_owned_by(0xa), (2, 40));
        assert_eq!(m.remove(0x1000), None, "gone with its context");
        assert_eq!(m.get(0x2000), Some(20));
        assert_eq!(m.remove_owned_by(0xa), (0, 0));
        let mut e = m.entries();
        e.sort();
        assert_eq!(e, vec![(0x2000, 20), (0x4000, 40)]);
        assert!(m.insert_owned(0x1000, 5, 0xc), "tombstone reused, new owner");
        assert_eq!(m.remove_owned_by(0xa), (0, 0));
        assert_eq!(m.remove_owned_by(0xc), (1, 5));
    }

    proptest! {
        #[test]
        fn behaves_like_a_hashmap(ops in proptest::collection::vec((0u64..40, any::<bool>(), 1u64..100), 1..300)) {
            let m = PtrMap::new(64);
            let mut model = HashMap::new();
            for (k, ins, v) in ops {
                let key = k * 0x100;
                if ins && !model.contains_key(&key) {
                    prop_assert!(m.insert(key, v));
                    model.insert(key, v);
                } else {
                    prop_assert_eq!(m.remove(key), model.remove(&key));
                }
            }
            let mut e = m.entries();
            e.sort();
            let mut want: Vec<_> = model.into_iter().collect();
            want.sort();
            prop_assert_eq!(e, want);
        }
    }
}
