//! Lock-free, fixed-capacity map from allocation key (device pointer, VMM handle, array handle)
//! to the bytes counted for it: open addressing over atomics, no locks, no allocation after
//! construction, so it is safe across threads, signals and fork.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

const EMPTY: u64 = 0;
const TOMB: u64 = 1;
/// A slot claimed by one thread that is storing (insert) or taking (remove) its value: occupied
/// but matching no key. An insert publishes its key only after its value, and a remove owns the
/// value from the moment it turns the key into BUSY until it stores TOMB, so nobody ever reads a
/// value that belongs to another key (a tombstone's stale bytes, or a half-made entry).
const BUSY: u64 = 2;

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

#[cfg(test)]
thread_local! {
    /// Whole-table scans ([`PtrMap::entries`]) made by this thread (tests of what avoids them).
    pub static SCANS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn stored(key: u64) -> Option<u64> {
    // Shift keys by 3 so that 0, 1 and 2 stay free for EMPTY/TOMB/BUSY; the three keys that
    // would wrap onto them cannot be tracked (callers treat that like a full table).
    key.checked_add(3)
}

/// `n` slots of keys and entries, all zero (EMPTY), from zeroed memory: a big table costs no
/// resident memory until its slots are used (the allocator maps fresh zero pages for it), so
/// tables sized for the largest jobs (65,536 VMM pages of PyTorch's expandable segments) cost
/// small ones nothing.
fn zeroed(n: usize) -> (Box<[AtomicU64]>, Box<[Entry]>) {
    // SAFETY: `AtomicU64` and `Entry` (two `AtomicU64`) are valid when all bytes are zero.
    unsafe { (zeroed_slice(n), zeroed_slice(n)) }
}

/// `n` zeroed `T`s (`Box::new_zeroed_slice`, which needs Rust 1.92).
///
/// # Safety
/// All-zero bytes must be a valid `T`, and `T` not zero-sized.
unsafe fn zeroed_slice<T>(n: usize) -> Box<[T]> {
    let layout = std::alloc::Layout::array::<T>(n.max(1)).expect("table size fits in memory");
    // SAFETY: the layout has a non-zero size (`n.max(1)` elements of a sized, non-zero T).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `p` is a fresh global-allocator block of `n` (at least 1) zeroed, valid `T`s, laid
    // out as `Box<[T]>` frees it (`Layout::array::<T>(n)`) when n >= 1.
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n.max(1))) }
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
        let Some(i) = self.claim(k) else { return false };
        self.publish(i, k, bytes, owner);
        true
    }

    /// First half of an insert: turns a free slot on `k`'s probe chain into BUSY (no lookup
    /// matches it yet) and returns it; `None` if the table is full.
    #[inline]
    fn claim(&self, k: u64) -> Option<usize> {
        let mut i = self.start(k);
        for d in 0..=self.mask {
            let key = &self.keys[i];
            let cur = key.load(Acquire);
            if cur == EMPTY || cur == TOMB {
                // Announced before the key can be seen: a lookup that may find it looks this far.
                if d > self.max_probe.load(Relaxed) {
                    self.max_probe.fetch_max(d, AcqRel);
                }
                // Acquire: the previous holder's last reads of this entry happen before our stores.
                if key.compare_exchange(cur, BUSY, Acquire, Relaxed).is_ok() {
                    return Some(i);
                }
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Second half of an insert: the value, then (Release) the key. Whoever sees the key sees
    /// the value stored for it. The driver may hand a freed pointer out again before the thread
    /// that freed it untracks it; that untrack then meets either this half-made entry (BUSY,
    /// skipped) or the finished one, never a tombstone's old bytes under the new key.
    #[inline]
    fn publish(&self, i: usize, k: u64, bytes: u64, owner: u64) {
        let e = &self.entries[i];
        e.owner.store(owner, Relaxed);
        e.val.store(bytes, Relaxed);
        self.keys[i].store(k, Release);
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
    ///
    /// A key may briefly be live twice (freed by one thread, handed out by the driver to
    /// another and tracked again before the first untracks it): each remove takes one of the
    /// entries, and one that loses a slot to a concurrent remove looks on along the chain (as
    /// far as the bound reaches now: the other key's entry may lie beyond it when we started).
    #[inline]
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.remove_where(key, |_| true).map(|(bytes, _)| bytes)
    }

    /// Removes an entry for `key` whose owner word `keep` accepts, returning (bytes, owner).
    #[inline]
    pub fn remove_where(&self, key: u64, keep: impl Fn(u64) -> bool) -> Option<(u64, u64)> {
        let k = stored(key)?;
        let mut i = self.start(k);
        let mut d = 0;
        while d <= self.max_probe.load(Acquire).min(self.mask) {
            d += 1;
            let slot = &self.keys[i];
            match slot.load(Acquire) {
                EMPTY => return None,
                // Winning k -> BUSY makes the entry ours alone (no insert claims a BUSY slot);
                // Acquire pairs with the publishing Release, so the value is the one stored for k.
                cur if cur == k
                    && keep(self.entries[i].owner.load(Acquire))
                    && slot.compare_exchange(k, BUSY, Acquire, Relaxed).is_ok() =>
                {
                    let e = &self.entries[i];
                    let (bytes, owner) = (e.val.load(Relaxed), e.owner.load(Acquire));
                    if !keep(owner) {
                        // Changed between the look and the claim: not this one after all.
                        slot.store(k, Release);
                    } else {
                        slot.store(TOMB, Release);
                        return Some((bytes, owner));
                    }
                }
                _ => {}
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Changes the owner word of a live entry for `key` from `w` to `f(w)`, for the first entry
    /// whose word `f` accepts (`Some`), in one compare-and-swap; returns (old, new) words, or
    /// `None` if no entry for `key` accepted. The word of an entry changes only through here,
    /// so a caller may keep a small state machine in it (the VMM handles' map count).
    pub fn update_owner(&self, key: u64, f: impl Fn(u64) -> Option<u64>) -> Option<(u64, u64)> {
        let k = stored(key)?;
        let mut i = self.start(k);
        let mut d = 0;
        while d <= self.max_probe.load(Acquire).min(self.mask) {
            d += 1;
            match self.keys[i].load(Acquire) {
                EMPTY => return None,
                cur if cur == k => {
                    let w = &self.entries[i].owner;
                    let mut old = w.load(Acquire);
                    while let Some(new) = f(old) {
                        match w.compare_exchange_weak(old, new, AcqRel, Acquire) {
                            Ok(_) => return Some((old, new)),
                            Err(now) => old = now,
                        }
                    }
                }
                _ => {}
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Replaces the value of the live entry for `key` (the first on its chain); `false` if
    /// there is none. One store: a concurrent [`PtrMap::get`] sees the old value or the new one.
    /// The caller serialises it with inserts and removes of `key` (a remove taking the entry
    /// meanwhile may return either value).
    pub fn set(&self, key: u64, val: u64) -> bool {
        self.find(key).map(|(i, _)| self.entries[i].val.store(val, Release)).is_some()
    }

    /// Bytes recorded for `key`, if live.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.find(key).map(|(i, _)| self.entries[i].val.load(Acquire))
    }

    /// (bytes, owner word) recorded for `key`, if live.
    pub fn get_owned(&self, key: u64) -> Option<(u64, u64)> {
        self.find(key).map(|(i, _)| (self.entries[i].val.load(Acquire), self.entries[i].owner.load(Acquire)))
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
            if k == EMPTY || k == TOMB || k == BUSY || e.owner.load(Relaxed) != owner {
                continue;
            }
            if key.compare_exchange(k, BUSY, Acquire, Relaxed).is_err() {
                continue;
            }
            // The entry is ours now; the slot may have been freed and refilled for another
            // owner between the check and the claim: then it goes back as it was.
            if e.owner.load(Relaxed) != owner {
                key.store(k, Release);
                continue;
            }
            let b = e.val.load(Relaxed);
            key.store(TOMB, Release);
            n += 1;
            bytes = bytes.saturating_add(b);
        }
        (n, bytes)
    }

    /// Changes the owner word of every entry owned by `from` (non-zero) to `to`; returns how
    /// many. O(capacity), off the hot path (a context's teardown). One compare-and-swap per
    /// entry on its owner word alone: an entry inserted meanwhile for `from` (its slot being
    /// published) is changed too, one for another owner never.
    pub fn relabel_owner(&self, from: u64, to: u64) -> usize {
        if from == 0 {
            return 0;
        }
        self.entries.iter().filter(|e| e.owner.compare_exchange(from, to, AcqRel, Relaxed).is_ok()).count()
    }

    /// Empties the map (fork child: the parent's allocations are not ours). Only slots ever
    /// used are written (a slot once used never reads EMPTY again): the pages of a big table a
    /// process never touched stay the shared zero page, instead of each fork child committing
    /// the whole table (tens of MiB over 8 GPUs, per DataLoader worker).
    pub fn clear(&self) {
        for (key, e) in self.keys.iter().zip(self.entries.iter()) {
            if key.load(Relaxed) != EMPTY {
                key.store(EMPTY, Relaxed);
                e.val.store(0, Relaxed);
                e.owner.store(0, Relaxed);
            }
        }
    }

    /// Every live `(key, bytes)`; O(capacity), off the hot path.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        #[cfg(test)]
        SCANS.with(|n| n.set(n.get() + 1));
        self.keys
            .iter()
            .zip(self.entries.iter())
            .filter_map(|(key, e)| match key.load(Acquire) {
                EMPTY | TOMB | BUSY => None,
                k => Some((k - 3, e.val.load(Acquire))),
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
    fn set_replaces_a_live_value_only() {
        let m = PtrMap::new(16);
        assert!(!m.set(0x1000, 7), "no entry");
        assert!(m.insert_owned(0x1000, 5, 0xa));
        assert!(m.set(0x1000, 7));
        assert_eq!(m.get_owned(0x1000), Some((7, 0xa)), "the owner word stays");
        assert_eq!(m.remove(0x1000), Some(7));
        assert!(!m.set(0x1000, 9), "removed");
    }

    #[test]
    fn clearing_a_big_table_commits_no_memory_it_never_used() {
        /// Resident pages of `len` bytes at `p` (`mincore`: this table's own pages, whatever
        /// the other tests of the process do meanwhile).
        fn resident<T>(p: *const T, len: usize) -> usize {
            let page = 4096;
            let start = (p as usize) & !(page - 1);
            let n = ((p as usize) + len - start).div_ceil(page);
            let mut v = vec![0u8; n];
            // SAFETY: a page-aligned range covering a live allocation of ours; `v` holds one
            // byte per page.
            let rc = unsafe { libc::mincore(start as *mut libc::c_void, n * page, v.as_mut_ptr()) };
            assert_eq!(rc, 0);
            v.iter().filter(|b| **b & 1 != 0).count()
        }
        let m = PtrMap::new(1 << 18);
        assert!(m.insert(0x1000, 1) && m.insert(0x2000, 2));
        // The entries (4 MiB, 1024 pages), which clear reads only where a key was used (the
        // keys are all read, and mincore counts a read page of zeroes as resident).
        let pages = |m: &PtrMap| resident(m.entries.as_ptr(), m.entries.len() * std::mem::size_of::<Entry>());
        let before = pages(&m);
        m.clear();
        // Writing every slot committed every page.
        assert!(pages(&m) <= before + 2, "clear committed {} pages", pages(&m) - before);
        assert_eq!((m.get(0x1000), m.get(0x2000)), (None, None));
        assert!(m.insert(0x1000, 3));
        assert_eq!(m.get(0x1000), Some(3));
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
        let keys: Vec<u64> = (0..1u64 << 24).map(|j| 0x1000 + (j << 8)).filter(|k| m.start(k + 3) == m.start(0x1003)).take(3).collect();
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

    /// The interleaving the quota once lost bytes in: thread A frees P (driver first), the
    /// driver hands P to thread B, whose track lands in an earlier tombstone on P's chain; A's
    /// untrack runs between B's claim and B's store. A must get its own bytes (it once got the
    /// tombstone's stale ones under B's key, and B's entry was orphaned).
    #[test]
    fn untrack_during_a_retrack_of_the_same_key_gets_its_own_bytes() {
        let m = PtrMap::new(64);
        let keys: Vec<u64> = (0..1u64 << 24).map(|j| 0x1000 + (j << 8)).filter(|k| m.start(k + 3) == m.start(0x1003)).take(2).collect();
        let (x, p) = (keys[0], keys[1]);
        assert!(m.insert(x, 999), "x at the start slot");
        assert!(m.insert(p, 10), "A's P one slot on");
        assert_eq!(m.remove(x), Some(999), "a tombstone holding 999 before A's P");
        let k = stored(p).unwrap();
        let slot = m.claim(k).expect("B claims the tombstone");
        assert_eq!(slot, m.start(k));
        assert_eq!(m.remove(p), Some(10), "A's untrack, mid-insert of B");
        m.publish(slot, k, 20, 0);
        assert_eq!(m.remove(p), Some(20), "B's untrack");
        assert_eq!(m.remove(p), None);
        assert!(m.entries().is_empty());
    }

    /// Threads track and untrack a few shared keys at once, as when the driver hands a pointer
    /// that one thread just freed to another before the first untracks it. Every value is a
    /// function of its key, so each untrack must get exactly that value (the entries of one key
    /// may be taken in either order, but never a tombstone's bytes or nothing).
    #[test]
    fn concurrent_reused_keys_give_back_their_own_bytes() {
        let m = Arc::new(PtrMap::new(64));
        let val = |k: u64| k * 7 + 1;
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    let mut bad = 0u64;
                    for r in 0..100_000u64 {
                        let k = 0x1000 + ((r.wrapping_mul(2_654_435_761) ^ t) % 6) * 0x100;
                        assert!(m.insert(k, val(k)));
                        if m.remove(k) != Some(val(k)) {
                            bad += 1;
                        }
                    }
                    bad
                })
            })
            .collect();
        let bad: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(bad, 0, "untracks that got another key's bytes or nothing");
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
