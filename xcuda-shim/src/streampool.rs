//! Stream-ordered memory pools (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`): counted as what
//! the pools reserve, not per allocation. A pool keeps the memory of freed allocations: until
//! the next synchronisation with the default release threshold (0), for ever when the
//! application raises `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (PyTorch's `cudaMallocAsync` backend
//! sets it to `UINT64_MAX`), until `cuMemPoolTrimTo`. Giving an allocation's bytes back at
//! `cuMemFreeAsync` let a process hold its quota in a pool and as much again elsewhere. So the
//! shim counts, per GPU, the sum of `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` over the pools this
//! process allocated from on that GPU, in the GPU's [`crate::poolcount::PoolCount`]:
//!
//! - the pool of an allocation is the explicit one (`cuMemAllocFromPoolAsync`), else the
//!   current pool of the stream's device (`cuDeviceGetMemPool`; the stream may be another
//!   context's than the current one, on another GPU); a pool counts on the
//!   device whose memory backs it (its `cuMemPoolCreate` location, or the device whose default
//!   or current pool it is), not on the current context's;
//! - before an allocation its whole size is reserved (the pool may have to grow by that much;
//!   the shim cannot prove it will reuse its reserve); refused, the count is first settled (it
//!   may lag behind a pool that released memory at a synchronisation) and asked once more, then
//!   the call fails with `CUDA_ERROR_OUT_OF_MEMORY`, nothing allocated; after the allocation
//!   the count is settled to what the pools reserve;
//! - a free gives nothing back at once: the controller tick, `cuMemPoolTrimTo`,
//!   `cuMemPoolDestroy` and a refused allocation on the GPU settle the count down to what the
//!   pools still reserve;
//! - a destroyed pool with live allocations keeps its last count until the last of them is
//!   freed (its handle can no longer be asked); a pool the driver cannot report on keeps the
//!   count where it is (fail closed: never give back what is not proven gone).
//!
//! The pool table is fixed (64 pools) and lock-free to read; slots change state under a spin
//! lock held for a few atomics, never across a driver call. Launches never touch any of it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};

use cuda_abi::{CUdevice, CUmemPool_attribute, CUmemoryPool, CUresult};

use crate::ptrmap::PtrMap;
use crate::state::{call_real, Gpu, State};

/// Pools one process can allocate from with the shim counting them.
const MAX_POOLS: usize = 64;
/// Live stream-ordered pointers one process records (all GPUs). PyTorch's `cudaMallocAsync`
/// backend makes every live tensor one: a big model's parameters, optimizer state and
/// activations run to tens of thousands. A full table refuses the allocation.
pub const STREAM_PTR_CAPACITY: usize = 1 << 18;

/// A slot's state: unused.
const FREE: u8 = 0;
/// A slot's state: a pool the process allocates from.
const LIVE: u8 = 1;
/// A slot's state: a pool `cuMemPoolDestroy` returned for while allocations were live.
const DESTROYED: u8 = 2;

/// One pool the process allocated from.
#[derive(Default)]
struct Slot {
    state: AtomicU8,
    handle: AtomicU64,
    /// The device ordinal whose memory backs the pool.
    ord: AtomicUsize,
    /// The pool's reserved bytes as the driver last reported them.
    last: AtomicU64,
    /// Allocations from it the shim saw made and not yet freed.
    live: AtomicU64,
}

/// The stream-ordered pools of the process and the pool of each live allocation.
pub struct StreamPools {
    seen: AtomicBool,
    slots: Box<[Slot]>,
    /// Held while a slot changes state (a few atomics; never across a driver call).
    lock: crate::spin::SpinLock,
    /// Live allocation pointer -> its pool's slot.
    ptrs: PtrMap,
}

impl Default for StreamPools {
    fn default() -> Self {
        Self::new()
    }
}

/// The real driver's `RESERVED_MEM_CURRENT` of `pool` (`None` if it cannot say).
fn reserved_of(pool: u64) -> Option<u64> {
    let mut v: u64 = 0;
    let rc = call_real!(cuMemPoolGetAttribute: cuda_abi::PFN_cuMemPoolGetAttribute_v11020, pool as CUmemoryPool, CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, (&mut v as *mut u64).cast());
    (rc == CUresult::CUDA_SUCCESS).then_some(v)
}

impl StreamPools {
    /// An empty table.
    pub fn new() -> Self {
        Self { seen: AtomicBool::new(false), slots: (0..MAX_POOLS).map(|_| Slot::default()).collect(), lock: crate::spin::SpinLock::new(), ptrs: PtrMap::new(STREAM_PTR_CAPACITY) }
    }

    /// Whether the process ever allocated from a counted pool (or created one).
    #[inline]
    pub fn seen(&self) -> bool {
        self.seen.load(Relaxed)
    }

    /// The slot of live pool `handle`.
    fn find(&self, handle: u64) -> Option<usize> {
        self.slots.iter().position(|s| s.state.load(Acquire) == LIVE && s.handle.load(Relaxed) == handle)
    }

    fn locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let _one = self.lock.lock();
        f()
    }

    /// The slot of live pool `handle`, registered on ordinal `ord` if new; `None` if the table
    /// is full (said once).
    pub fn register(&self, handle: u64, ord: usize) -> Option<usize> {
        self.seen.store(true, Relaxed);
        let got = self.locked(|| {
            if let Some(i) = self.find(handle) {
                return Some(i);
            }
            let i = self.slots.iter().position(|s| s.state.load(Relaxed) == FREE)?;
            let s = &self.slots[i];
            s.handle.store(handle, Relaxed);
            s.ord.store(ord, Relaxed);
            s.last.store(0, Relaxed);
            s.live.store(0, Relaxed);
            s.state.store(LIVE, Release);
            Some(i)
        });
        if got.is_none() {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Relaxed) {
                crate::state::logged(|| tracing::error!(pool = handle, "xcuda: stream-ordered pool table full ({MAX_POOLS} pools): allocations from further pools are refused (CUDA_ERROR_OUT_OF_MEMORY); what such a pool keeps could not be counted"));
            }
        }
        got
    }

    /// The ordinal of slot `i`.
    fn ord(&self, i: usize) -> usize {
        self.slots[i].ord.load(Relaxed)
    }

    /// What the pools on ordinal `ord` reserve: the driver's figure for each live one (its
    /// last figure for a destroyed one); `None` if the driver cannot say for one of them.
    pub fn reserved_on(&self, ord: usize, query: impl Fn(u64) -> Option<u64>) -> Option<u64> {
        let mut sum = 0u64;
        for s in self.slots.iter() {
            let state = s.state.load(Acquire);
            if state == FREE || s.ord.load(Relaxed) != ord {
                continue;
            }
            if state == LIVE {
                let r = query(s.handle.load(Relaxed))?;
                s.last.store(r, Relaxed);
            }
            sum = sum.saturating_add(s.last.load(Relaxed));
        }
        Some(sum)
    }

    /// A new allocation `ptr` from slot `i`; `false` if it cannot be recorded (table full).
    fn allocated(&self, ptr: u64, i: usize) -> bool {
        self.slots[i].live.fetch_add(1, AcqRel);
        if self.ptrs.insert(ptr, i as u64) {
            return true;
        }
        self.slots[i].live.fetch_sub(1, AcqRel);
        false
    }

    /// Slot `i` lost an allocation: the ordinal to settle if that freed a destroyed pool.
    fn lost_one(&self, i: usize) -> Option<usize> {
        let s = &self.slots[i];
        if s.live.fetch_sub(1, AcqRel) != 1 {
            return None;
        }
        self.locked(|| {
            let gone = s.state.load(Relaxed) == DESTROYED && s.live.load(Acquire) == 0;
            if gone {
                s.state.store(FREE, Release);
            }
            gone.then(|| s.ord.load(Relaxed))
        })
    }

    /// `cuMemPoolDestroy(handle)` succeeded (`last`: what the pool reserved just before): the
    /// ordinal to settle. With allocations still live the pool keeps its last count until the
    /// last of them is freed ("the resources associated with the pool will be released
    /// automatically once there are no more outstanding allocations").
    fn destroyed(&self, handle: u64, last: Option<u64>) -> Option<usize> {
        self.locked(|| {
            let i = self.find(handle)?;
            let s = &self.slots[i];
            if s.live.load(Acquire) > 0 {
                if let Some(l) = last {
                    s.last.store(l, Relaxed);
                }
                s.state.store(DESTROYED, Release);
            } else {
                s.state.store(FREE, Release);
            }
            Some(s.ord.load(Relaxed))
        })
    }

    /// In a fork child (only the forking thread): no pools, no allocations.
    pub fn after_fork_child(&self) {
        self.lock.reset_after_fork();
        for s in self.slots.iter() {
            s.state.store(FREE, Relaxed);
        }
        self.ptrs.clear();
    }
}

/// Settles GPU `g` (ordinal `dev`)'s stream-pool count to what its pools reserve; `own`: the
/// caller's allocations in flight on it.
fn settle(st: &State, g: &Gpu, dev: usize, own: u32) {
    g.stream_pools.settle(&g.quota, dev as CUdevice, own, || st.stream_pools.reserved_on(dev, reserved_of));
}

/// Settles ordinal `dev`'s count (a trim, a destroy, a pool freed by its last allocation).
fn settle_ord(st: &State, dev: usize) {
    if let Some(g) = st.gpus.get(dev) {
        settle(st, g, dev, 0);
    }
}

/// The device whose memory backs `pool`: its slot's, else as `device_of` finds it.
pub fn pool_device(st: &State, pool: u64) -> usize {
    match st.stream_pools.find(pool) {
        Some(i) => st.stream_pools.ord(i),
        None => device_of(st, pool),
    }
}

/// The device whose memory backs `pool`, a pool the shim did not see created: the device whose
/// current or default pool it is, else the current context's (a few driver calls, once per
/// pool).
fn device_of(st: &State, pool: u64) -> usize {
    for d in 0..st.gpus.len() {
        let dev = d as CUdevice;
        let mut p: CUmemoryPool = std::ptr::null_mut();
        if call_real!(cuDeviceGetMemPool: cuda_abi::PFN_cuDeviceGetMemPool_v11020, &mut p, dev) == CUresult::CUDA_SUCCESS && p as u64 == pool {
            return d;
        }
        let mut p: CUmemoryPool = std::ptr::null_mut();
        if call_real!(cuDeviceGetDefaultMemPool: cuda_abi::PFN_cuDeviceGetDefaultMemPool_v11020, &mut p, dev) == CUresult::CUDA_SUCCESS && p as u64 == pool {
            return d;
        }
    }
    st.current_ordinal()
}

/// Why an allocation has no pool slot ([`pool_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoSlot {
    /// `cuMemAllocFromPoolAsync` of a null pool: the driver refuses it.
    NullPool,
    /// The driver cannot say which pool is current (its allocation fails as well).
    Unknown,
    /// The pool table is full: what the pool keeps could not be counted, so the allocation is
    /// refused (fail closed: counted per allocation, a pool's kept memory would escape).
    TableFull,
}

/// The slot of the pool an allocation comes from: `explicit` (`cuMemAllocFromPoolAsync`), else
/// the current pool of `stream_dev`, the ordinal of the stream's device
/// ([`State::stream_ordinal`]; "the memory pool current to the stream's device"), with the
/// pool's handle.
pub fn pool_for(st: &State, explicit: Option<CUmemoryPool>, stream_dev: usize) -> Result<(usize, CUmemoryPool), NoSlot> {
    let (handle, ord) = match explicit {
        Some(p) if p.is_null() => return Err(NoSlot::NullPool),
        Some(p) => (p as u64, None),
        None => {
            let dev = stream_dev;
            let mut p: CUmemoryPool = std::ptr::null_mut();
            let rc = call_real!(cuDeviceGetMemPool: cuda_abi::PFN_cuDeviceGetMemPool_v11020, &mut p, dev as CUdevice);
            if rc != CUresult::CUDA_SUCCESS || p.is_null() {
                return Err(NoSlot::Unknown);
            }
            (p as u64, Some(dev))
        }
    };
    let sp = &st.stream_pools;
    if let Some(i) = sp.find(handle) {
        return Ok((i, handle as CUmemoryPool));
    }
    let ord = ord.unwrap_or_else(|| device_of(st, handle));
    sp.register(handle, ord).map(|i| (i, handle as CUmemoryPool)).ok_or(NoSlot::TableFull)
}

/// A stream-ordered allocation of `bytes` from the pool of slot `i`: its size reserved in the
/// quota of the pool's GPU first (refused: `CUDA_ERROR_OUT_OF_MEMORY`, the driver not asked),
/// then the driver's `alloc`, then the count settled to what the GPU's pools reserve. An
/// allocation that cannot be recorded is undone.
pub fn counted_alloc(st: &State, i: usize, bytes: u64, alloc: impl FnOnce() -> CUresult, key: impl FnOnce() -> u64, undo: impl FnOnce(u64)) -> CUresult {
    reserved_alloc(st, i, bytes, || {
        let mut rc = alloc();
        if rc == CUresult::CUDA_SUCCESS {
            let k = key();
            if !st.stream_pools.allocated(k, i) {
                crate::state::logged(|| tracing::error!(key = k, bytes, "xcuda: allocation table full; undoing allocation"));
                undo(k);
                rc = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        rc
    })
}

/// [`counted_alloc`] without recording the pointer: `bytes` reserved in the quota of the GPU
/// of slot `i`'s pool around the driver's `alloc`, then the count settled to what the GPU's
/// pools reserve. For an allocation that may be a capture's memory node rather than memory
/// (a capture another thread may end meanwhile): whichever it was, the pool's figure says.
pub fn reserved_alloc(st: &State, i: usize, bytes: u64, alloc: impl FnOnce() -> CUresult) -> CUresult {
    let dev = st.stream_pools.ord(i);
    let g = st.gpu(dev as CUdevice);
    let pc = &g.stream_pools;
    if !pc.begin(&g.quota, |_| bytes) {
        // The count may lag behind pools that released memory (at a synchronisation): settle
        // to what they reserve now, then ask once more.
        settle(st, g, dev, 1);
        pc.end();
        if !pc.begin(&g.quota, |_| bytes) {
            settle(st, g, dev, 1);
            pc.end();
            return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    let rc = alloc();
    settle(st, g, dev, 1);
    pc.end();
    rc
}

/// A free of `ptr` (any of the device-pointer frees): runs the driver's `free`; a stream-ordered
/// allocation's pool loses it (its memory stays counted while the pool reserves it). The record
/// is taken out before the driver frees (it may hand the pointer out again at once) and put
/// back if the driver refuses.
#[inline]
pub fn freeing(st: &State, ptr: u64, free: impl FnOnce() -> CUresult) -> CUresult {
    let sp = &st.stream_pools;
    if !sp.seen() {
        return free();
    }
    let taken = sp.ptrs.remove(ptr);
    let rc = free();
    if let Some(i) = taken {
        if rc != CUresult::CUDA_SUCCESS {
            if !sp.ptrs.insert(ptr, i) {
                // Cannot happen (its entry was just freed); the pool stays counted anyway.
                let _ = sp.lost_one(i as usize);
            }
        } else if let Some(dev) = sp.lost_one(i as usize) {
            settle_ord(st, dev);
        }
    }
    rc
}

/// After `cuMemPoolCreate` made `pool` backed by ordinal `ord`'s memory.
pub fn created(st: &State, pool: CUmemoryPool, ord: usize) {
    st.stream_pools.register(pool as u64, ord);
}

/// Around `cuMemPoolDestroy(pool)`: what it reserves is read first (the handle dies with the
/// call), the count settled after.
pub fn destroying(st: &State, pool: CUmemoryPool, destroy: impl FnOnce() -> CUresult) -> CUresult {
    let sp = &st.stream_pools;
    let last = (sp.seen() && sp.find(pool as u64).is_some()).then(|| reserved_of(pool as u64)).flatten();
    let rc = destroy();
    if rc == CUresult::CUDA_SUCCESS {
        if let Some(dev) = sp.destroyed(pool as u64, last) {
            settle_ord(st, dev);
        }
    }
    rc
}

/// After `cuMemPoolTrimTo(pool)` succeeded: the count settled to what the pools still reserve.
pub fn trimmed(st: &State, pool: CUmemoryPool) {
    if let Some(i) = st.stream_pools.find(pool as u64) {
        settle_ord(st, st.stream_pools.ord(i));
    }
}

/// Controller tick: settles GPU `g` (ordinal `dev`) unless an allocation is in flight on it.
pub fn tick(st: &State, g: &Gpu, dev: CUdevice) {
    if st.stream_pools.seen() {
        g.stream_pools.tick(&g.quota, dev, || st.stream_pools.reserved_on(dev as usize, reserved_of));
    }
}

/// A reservation in `quota` was refused: settles its GPU's stream-pool count (it may lag
/// behind pools that released memory since) and says whether that gave bytes back (worth
/// asking again). Off the hot path: refusals only.
#[cold]
pub fn settled_after_refusal(quota: &crate::quota::Quota) -> bool {
    let Some(st) = crate::state::get() else { return false };
    if !st.stream_pools.seen() {
        return false;
    }
    let Some((dev, g)) = st.gpus.iter().enumerate().find(|(_, g)| std::ptr::eq(&g.quota, quota)) else { return false };
    let before = g.stream_pools.counted();
    settle(st, g, dev, 0);
    g.stream_pools.counted() < before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poolcount::PoolCount;
    use crate::quota::Quota;
    use std::cell::Cell;

    const MIB: u64 = 1 << 20;

    /// The pool table with `reserved` per pool handle, as a settle would see it.
    fn sum(sp: &StreamPools, ord: usize, reserved: &[(u64, Option<u64>)]) -> Option<u64> {
        sp.reserved_on(ord, |h| reserved.iter().find(|(p, _)| *p == h).and_then(|(_, r)| *r))
    }

    #[test]
    fn pools_count_on_their_own_device() {
        let sp = StreamPools::new();
        let a = sp.register(0xa000, 0).unwrap();
        let b = sp.register(0xb000, 1).unwrap();
        assert_eq!(sp.register(0xa000, 1), Some(a), "registered once, on its first device");
        assert_ne!(a, b);
        let r = [(0xa000, Some(30 * MIB)), (0xb000, Some(50 * MIB))];
        assert_eq!(sum(&sp, 0, &r), Some(30 * MIB));
        assert_eq!(sum(&sp, 1, &r), Some(50 * MIB), "the pool of device 1 counts on device 1 only");
    }

    /// Fail closed: a pool the driver cannot report on stops the settle (the count stays).
    #[test]
    fn a_pool_the_driver_cannot_report_keeps_the_count() {
        let sp = StreamPools::new();
        sp.register(0xa000, 0).unwrap();
        sp.register(0xb000, 0).unwrap();
        assert_eq!(sum(&sp, 0, &[(0xa000, Some(MIB)), (0xb000, None)]), None);
        let (q, pc) = (Quota::local(100 * MIB), PoolCount::new("test"));
        assert!(pc.begin(&q, |_| 40 * MIB));
        pc.settle(&q, 0, 1, || sum(&sp, 0, &[(0xa000, Some(MIB)), (0xb000, None)]));
        pc.end();
        assert_eq!((pc.counted(), q.used()), (40 * MIB, 40 * MIB), "nothing given back without the driver's figure");
    }

    /// The flow of a pool that keeps its memory after a free (release threshold UINT64_MAX):
    /// the allocation reserves its size, the settle after it counts what the pool reserves, a
    /// free gives nothing back, a trim (the pool's figure falls) does.
    #[test]
    fn a_free_gives_nothing_back_until_the_pool_releases() {
        let sp = StreamPools::new();
        let i = sp.register(0xa000, 0).unwrap();
        let (q, pc) = (Quota::local(100 * MIB), PoolCount::new("test"));
        let pool = Cell::new(0u64);
        let settle = || pc.settle(&q, 0, 0, || sp.reserved_on(0, |_| Some(pool.get())));
        assert!(pc.begin(&q, |_| 60 * MIB));
        pool.set(60 * MIB); // the driver grew the pool
        assert!(sp.allocated(0x7000, i));
        pc.settle(&q, 0, 1, || sp.reserved_on(0, |_| Some(pool.get())));
        pc.end();
        assert_eq!(q.used(), 60 * MIB);
        assert_eq!(sp.ptrs.remove(0x7000), Some(i as u64), "the free takes the record");
        assert_eq!(sp.lost_one(i), None, "a live pool is not freed with its last allocation");
        settle();
        assert_eq!(q.used(), 60 * MIB, "the pool keeps the memory: still counted");
        assert!(!q.try_reserve(60 * MIB), "60 kept + 60 more > 100");
        pool.set(0); // cuMemPoolTrimTo(pool, 0)
        settle();
        assert_eq!(q.used(), 0);
        assert!(q.try_reserve(60 * MIB));
    }

    /// A destroyed pool keeps its last figure (its handle cannot be asked) until its last live
    /// allocation is freed; then its slot is free and the count falls.
    #[test]
    fn a_destroyed_pool_counts_until_its_last_allocation_is_freed() {
        let sp = StreamPools::new();
        let i = sp.register(0xa000, 1).unwrap();
        assert!(sp.allocated(0x7000, i) && sp.allocated(0x8000, i));
        assert_eq!(sp.destroyed(0xa000, Some(40 * MIB)), Some(1));
        assert_eq!(sp.find(0xa000), None, "the handle is dead: a new pool with it gets a new slot");
        let asked = Cell::new(false);
        assert_eq!(sp.reserved_on(1, |_| { asked.set(true); Some(0) }), Some(40 * MIB), "its last figure");
        assert!(!asked.get(), "a destroyed pool is never asked");
        assert_eq!(sp.lost_one(i), None);
        assert_eq!(sp.lost_one(i), Some(1), "the last free: settle device 1");
        assert_eq!(sp.reserved_on(1, |_| Some(0)), Some(0));
        let j = sp.register(0xa000, 0).unwrap();
        assert_eq!(sp.reserved_on(0, |_| Some(5)), Some(5), "the handle reused by a new pool, on its own device");
        assert_eq!(sp.destroyed(0xa000, None), Some(0));
        assert_eq!(sp.reserved_on(0, |_| Some(5)), Some(0), "destroyed with nothing live: gone at once");
        let _ = j;
    }
}
