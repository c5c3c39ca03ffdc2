//! Stream-ordered memory pools (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemPool*`,
//! `cuDevice{Get,Set,GetDefault}MemPool`) as NVIDIA's CUDA driver API documents them (the
//! doc comments of `cuda.h`, 12.9 and 13.0, quoted where a rule is modelled). Bookkeeping only:
//! the driver (`driver.rs`) commits the growth this model asks for on the emulated device, and
//! gives back what it releases, so pool memory shows in NVML and counts toward the device's
//! capacity (a pool that cannot grow fails the allocation with `CUDA_ERROR_OUT_OF_MEMORY`).
//!
//! A pool has reserved bytes (backing memory committed on its device) and used bytes (handed to
//! live allocations). An allocation takes the pool's unused reserve when it covers the size,
//! else the pool grows by the shortfall; a free returns the bytes to the pool (used drops,
//! reserved stays); synchronisation releases reserve above max(used, release threshold).

use cuda_abi::CUresult;
use std::collections::HashMap;

type R<T = ()> = Result<T, CUresult>;

/// `CUmemPool_attribute` values (cuda.h).
pub mod attr {
    /// `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES` (int).
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES` (int), the last int attribute.
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: u32 = 3;
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (cuuint64_t).
    pub const RELEASE_THRESHOLD: u32 = 4;
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (cuuint64_t).
    pub const RESERVED_MEM_CURRENT: u32 = 5;
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` (cuuint64_t).
    pub const RESERVED_MEM_HIGH: u32 = 6;
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (cuuint64_t).
    pub const USED_MEM_CURRENT: u32 = 7;
    /// `CU_MEMPOOL_ATTR_USED_MEM_HIGH` (cuuint64_t).
    pub const USED_MEM_HIGH: u32 = 8;

    /// Whether `a` is one of the three `int`-valued reuse attributes (the others are
    /// `cuuint64_t`).
    pub fn is_int(a: u32) -> bool {
        (REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES).contains(&a)
    }
}

/// One memory pool of this process.
#[derive(Clone, Debug)]
struct MemPool {
    /// The device ordinal whose memory backs it.
    ord: usize,
    /// A device's default pool (never destroyed).
    default: bool,
    reserved: u64,
    used: u64,
    reserved_high: u64,
    used_high: u64,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` ("(default 0)").
    threshold: u64,
    /// The three reuse attributes ("(default enabled)"); stored, not modelled (the emulator's
    /// pools always reuse their unused reserve).
    reuse: [i32; 3],
    /// Allocations not freed yet.
    live: u64,
    /// `cuMemPoolDestroy` returned while allocations were outstanding: the handle is dead, the
    /// memory stays until the last of them is freed.
    destroyed: bool,
}

impl MemPool {
    fn new(ord: usize, default: bool) -> Self {
        Self { ord, default, reserved: 0, used: 0, reserved_high: 0, used_high: 0, threshold: 0, reuse: [1; 3], live: 0, destroyed: false }
    }
}

/// Device memory a pool operation gives back: (ordinal, bytes).
pub type Release = (usize, u64);

/// Every pool of the process, the devices' default and current pools.
#[derive(Default, Debug)]
pub struct Pools {
    pools: HashMap<u64, MemPool>,
    default: HashMap<usize, u64>,
    current: HashMap<usize, u64>,
}

impl Pools {
    fn live(&self, h: u64) -> R<&MemPool> {
        self.pools.get(&h).filter(|p| !p.destroyed).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    fn live_mut(&mut self, h: u64) -> R<&mut MemPool> {
        self.pools.get_mut(&h).filter(|p| !p.destroyed).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuDeviceGetDefaultMemPool` of ordinal `ord` (made with handle `fresh()` the first time):
    /// "The default mempool of a device contains device memory from that device."
    pub fn default_of(&mut self, ord: usize, fresh: impl FnOnce() -> u64) -> u64 {
        if let Some(&h) = self.default.get(&ord) {
            return h;
        }
        let h = fresh();
        self.pools.insert(h, MemPool::new(ord, true));
        self.default.insert(ord, h);
        h
    }

    /// `cuDeviceGetMemPool`: "Returns the last pool provided to cuDeviceSetMemPool for this
    /// device or the device's default memory pool if cuDeviceSetMemPool has never been called."
    pub fn current_of(&mut self, ord: usize, fresh: impl FnOnce() -> u64) -> u64 {
        match self.current.get(&ord) {
            Some(&h) => h,
            None => self.default_of(ord, fresh),
        }
    }

    /// `cuDeviceSetMemPool`: "The memory pool must be local to the specified device."
    pub fn set_current(&mut self, ord: usize, h: u64) -> R {
        if self.live(h)?.ord != ord {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.current.insert(ord, h);
        Ok(())
    }

    /// `cuMemPoolCreate` of a pool backed by ordinal `ord`'s memory, as handle `h`.
    pub fn create(&mut self, h: u64, ord: usize) {
        self.pools.insert(h, MemPool::new(ord, false));
    }

    /// The ordinal of live pool `h`.
    pub fn ord_of(&self, h: u64) -> R<usize> {
        Ok(self.live(h)?.ord)
    }

    /// Before an allocation of `size` from pool `h`: its ordinal and how much the pool must grow
    /// (its unused reserve is reused when it covers the size).
    pub fn growth(&self, h: u64, size: u64) -> R<(usize, u64)> {
        let p = self.live(h)?;
        Ok((p.ord, size.saturating_sub(p.reserved - p.used)))
    }

    /// An allocation of `size` from pool `h` was made, the pool grown by `grown` (committed).
    pub fn allocated(&mut self, h: u64, size: u64, grown: u64) {
        if let Ok(p) = self.live_mut(h) {
            p.reserved += grown;
            p.used += size;
            p.live += 1;
            p.reserved_high = p.reserved_high.max(p.reserved);
            p.used_high = p.used_high.max(p.used);
        }
    }

    /// An allocation of `size` from pool `h` was freed: its bytes go back to the pool (used
    /// drops, reserved stays). A destroyed pool's last free releases the pool ("the resources
    /// associated with the pool will be released automatically once there are no more
    /// outstanding allocations", cuMemPoolDestroy).
    pub fn freed(&mut self, h: u64, size: u64) -> Option<Release> {
        let p = self.pools.get_mut(&h)?;
        p.used = p.used.saturating_sub(size);
        p.live = p.live.saturating_sub(1);
        if p.destroyed && p.live == 0 {
            let p = self.pools.remove(&h)?;
            return Some((p.ord, p.reserved));
        }
        None
    }

    /// At a stream, event or context synchronisation: "When more than the release threshold
    /// bytes of memory are held by the memory pool, the allocator will try to release memory
    /// back to the OS on the next call to stream, event or context synchronize. (default 0)"
    /// (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD). Memory live allocations use is never released.
    pub fn release_at_sync(&mut self) -> Vec<Release> {
        let mut out = Vec::new();
        for p in self.pools.values_mut() {
            let keep = p.used.max(p.threshold);
            if p.reserved > keep {
                out.push((p.ord, p.reserved - keep));
                p.reserved = keep;
            }
        }
        out
    }

    /// `cuMemPoolTrimTo(h, keep)`: "Releases memory back to the OS until the pool contains fewer
    /// than minBytesToKeep reserved bytes, or there is no more memory that the allocator can
    /// safely release. The allocator cannot release OS allocations that back outstanding
    /// asynchronous allocations." and "If the pool has less than minBytesToKeep reserved, the
    /// TrimTo operation is a no-op. Otherwise the pool will be guaranteed to have at least
    /// minBytesToKeep bytes reserved after the operation."
    pub fn trim_to(&mut self, h: u64, keep: u64) -> R<Option<Release>> {
        let p = self.live_mut(h)?;
        if p.reserved <= keep {
            return Ok(None);
        }
        let to = keep.max(p.used);
        let freed = p.reserved - to;
        p.reserved = to;
        Ok((freed > 0).then_some((p.ord, freed)))
    }

    /// `cuMemPoolDestroy`: "If any pointers obtained from this pool haven't been freed or the
    /// pool has free operations that haven't completed when cuMemPoolDestroy is invoked, the
    /// function will return immediately and the resources associated with the pool will be
    /// released automatically once there are no more outstanding allocations." "Destroying the
    /// current mempool of a device sets the default mempool of that device as the current
    /// mempool for that device." "A device's default memory pool cannot be destroyed."
    pub fn destroy(&mut self, h: u64) -> R<Option<Release>> {
        let p = self.live_mut(h)?;
        if p.default {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ord = p.ord;
        if self.current.get(&ord) == Some(&h) {
            self.current.remove(&ord);
        }
        let p = self.live_mut(h)?;
        if p.live > 0 {
            p.destroyed = true;
            return Ok(None);
        }
        let p = self.pools.remove(&h).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Ok((p.reserved > 0).then_some((p.ord, p.reserved)))
    }

    /// `cuMemPoolGetAttribute`: an `int` attribute's value as `u64` (see [`attr::is_int`]).
    pub fn get_attribute(&self, h: u64, a: u32) -> R<u64> {
        let p = self.live(h)?;
        Ok(match a {
            1..=3 => p.reuse[a as usize - 1] as u64,
            attr::RELEASE_THRESHOLD => p.threshold,
            attr::RESERVED_MEM_CURRENT => p.reserved,
            attr::RESERVED_MEM_HIGH => p.reserved_high,
            attr::USED_MEM_CURRENT => p.used,
            attr::USED_MEM_HIGH => p.used_high,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// `cuMemPoolSetAttribute`: the threshold, the reuse flags, and the high watermarks reset
    /// to zero only ("It is illegal to set this attribute to a non-zero value",
    /// CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH; "High watermark can only be reset to zero", both).
    /// The current figures are not in the settable list: `CUDA_ERROR_INVALID_VALUE`.
    pub fn set_attribute(&mut self, h: u64, a: u32, value: u64) -> R {
        let p = self.live_mut(h)?;
        match a {
            1..=3 => p.reuse[a as usize - 1] = value as i32,
            attr::RELEASE_THRESHOLD => p.threshold = value,
            attr::RESERVED_MEM_HIGH | attr::USED_MEM_HIGH if value != 0 => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            // Reset to the current value (a watermark never reads below it).
            attr::RESERVED_MEM_HIGH => p.reserved_high = p.reserved,
            attr::USED_MEM_HIGH => p.used_high = p.used,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn pools() -> (Pools, u64) {
        let mut ps = Pools::default();
        let d = ps.default_of(0, || 0x100);
        (ps, d)
    }

    /// Allocate `size` from `h` as the driver does: the growth is committed, then recorded.
    fn alloc(ps: &mut Pools, h: u64, size: u64) -> u64 {
        let (_, grow) = ps.growth(h, size).unwrap();
        ps.allocated(h, size, grow);
        grow
    }

    #[test]
    fn the_default_pool_is_the_current_one_until_another_is_set() {
        let (mut ps, d) = pools();
        assert_eq!(ps.current_of(0, || unreachable!()), d);
        assert_eq!(ps.default_of(0, || unreachable!()), d, "made once");
        ps.create(0x200, 1);
        assert_eq!(ps.set_current(0, 0x200), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "a pool of device 1 is not local to device 0");
        assert_eq!(ps.set_current(1, 0x200), Ok(()));
        assert_eq!(ps.current_of(1, || unreachable!()), 0x200);
        assert_eq!(ps.destroy(0x200), Ok(None));
        assert_eq!(ps.current_of(1, || 0x300), 0x300, "destroying the current pool makes the default current");
        assert_eq!(ps.destroy(d), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "a default pool cannot be destroyed");
    }

    #[test]
    fn a_pool_reuses_its_reserve_and_keeps_it_after_a_free() {
        let (mut ps, d) = pools();
        assert_eq!(alloc(&mut ps, d, 60 * MIB), 60 * MIB, "an empty pool grows by the size");
        assert_eq!(ps.freed(d, 60 * MIB), None);
        assert_eq!(ps.get_attribute(d, attr::RESERVED_MEM_CURRENT), Ok(60 * MIB), "freed: reserved stays");
        assert_eq!(ps.get_attribute(d, attr::USED_MEM_CURRENT), Ok(0));
        assert_eq!(alloc(&mut ps, d, 40 * MIB), 0, "the unused reserve covers it");
        assert_eq!(alloc(&mut ps, d, 40 * MIB), 20 * MIB, "only the shortfall is committed");
        assert_eq!(ps.get_attribute(d, attr::RESERVED_MEM_HIGH), Ok(80 * MIB));
        assert_eq!(ps.get_attribute(d, attr::USED_MEM_HIGH), Ok(80 * MIB));
    }

    #[test]
    fn synchronisation_releases_reserve_above_the_threshold_and_use() {
        let (mut ps, d) = pools();
        alloc(&mut ps, d, 60 * MIB);
        alloc(&mut ps, d, 10 * MIB);
        ps.freed(d, 60 * MIB);
        assert_eq!(ps.release_at_sync(), vec![(0, 60 * MIB)], "threshold 0: all but the used 10 MiB");
        assert_eq!(ps.get_attribute(d, attr::RESERVED_MEM_CURRENT), Ok(10 * MIB));
        ps.set_attribute(d, attr::RELEASE_THRESHOLD, u64::MAX).unwrap();
        alloc(&mut ps, d, 50 * MIB);
        ps.freed(d, 50 * MIB);
        assert_eq!(ps.release_at_sync(), vec![], "threshold UINT64_MAX: the pool keeps everything");
        assert_eq!(ps.get_attribute(d, attr::RESERVED_MEM_CURRENT), Ok(60 * MIB));
        ps.set_attribute(d, attr::RELEASE_THRESHOLD, 30 * MIB).unwrap();
        assert_eq!(ps.release_at_sync(), vec![(0, 30 * MIB)], "down to the threshold");
    }

    #[test]
    fn trim_keeps_at_least_min_bytes_and_never_live_memory() {
        let (mut ps, d) = pools();
        alloc(&mut ps, d, 50 * MIB);
        alloc(&mut ps, d, 20 * MIB);
        ps.freed(d, 50 * MIB);
        assert_eq!(ps.trim_to(d, 100 * MIB), Ok(None), "less reserved than minBytesToKeep: a no-op");
        assert_eq!(ps.trim_to(d, 30 * MIB), Ok(Some((0, 40 * MIB))));
        assert_eq!(ps.trim_to(d, 0), Ok(Some((0, 10 * MIB))), "down to the 20 MiB in use");
        assert_eq!(ps.get_attribute(d, attr::RESERVED_MEM_CURRENT), Ok(20 * MIB));
        assert_eq!(ps.trim_to(0x999, 0), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn a_destroyed_pool_keeps_its_memory_until_its_last_allocation_is_freed() {
        let (mut ps, _) = pools();
        ps.create(0x200, 1);
        alloc(&mut ps, 0x200, 30 * MIB);
        alloc(&mut ps, 0x200, 10 * MIB);
        assert_eq!(ps.destroy(0x200), Ok(None), "returns at once, nothing released");
        assert_eq!(ps.get_attribute(0x200, attr::RESERVED_MEM_CURRENT), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "the handle is dead");
        assert_eq!(ps.growth(0x200, 1), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(ps.freed(0x200, 30 * MIB), None);
        assert_eq!(ps.freed(0x200, 10 * MIB), Some((1, 40 * MIB)), "the last free releases the whole pool");
        ps.create(0x300, 0);
        alloc(&mut ps, 0x300, 5 * MIB);
        ps.freed(0x300, 5 * MIB);
        assert_eq!(ps.destroy(0x300), Ok(Some((0, 5 * MIB))), "no outstanding allocation: released now");
    }

    #[test]
    fn attributes_follow_the_documented_rules() {
        let (mut ps, d) = pools();
        assert_eq!(ps.get_attribute(d, attr::RELEASE_THRESHOLD), Ok(0), "(default 0)");
        assert_eq!(ps.get_attribute(d, attr::REUSE_FOLLOW_EVENT_DEPENDENCIES), Ok(1), "(default enabled)");
        assert_eq!(ps.set_attribute(d, attr::RESERVED_MEM_CURRENT, 0), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(ps.set_attribute(d, attr::USED_MEM_CURRENT, 0), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(ps.set_attribute(d, attr::RESERVED_MEM_HIGH, 1), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(ps.set_attribute(d, attr::USED_MEM_HIGH, 5), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(ps.set_attribute(d, 9, 0), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        alloc(&mut ps, d, 8 * MIB);
        ps.freed(d, 8 * MIB);
        ps.release_at_sync();
        assert_eq!(ps.get_attribute(d, attr::RESERVED_MEM_HIGH), Ok(8 * MIB));
        assert_eq!(ps.set_attribute(d, attr::RESERVED_MEM_HIGH, 0), Ok(()));
        assert_eq!(ps.set_attribute(d, attr::USED_MEM_HIGH, 0), Ok(()));
        assert_eq!(ps.get_attribute(d, attr::RESERVED_MEM_HIGH), Ok(0));
        assert_eq!(ps.get_attribute(d, attr::USED_MEM_HIGH), Ok(0));
    }
}
