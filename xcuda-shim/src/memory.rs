//! Logic behind the memory hooks: reserve-then-allocate with undo (over quota => OUT_OF_MEMORY,
//! nothing allocated, nothing leaked), exact give-back on free, and the quota-shaped memory view.

use cuda_abi::CUresult;

use crate::quota::{Kind, Quota};

/// Reserves `bytes`, then runs the driver's `alloc`: `CUDA_ERROR_OUT_OF_MEMORY` (nothing
/// called) over the quota; the reservation given back if the driver fails.
#[inline(always)]
pub fn reserved(q: &Quota, bytes: u64, alloc: impl FnOnce() -> CUresult) -> CUresult {
    // Refused: the GPU's stream-ordered pool count may lag behind pools that released memory
    // since (a synchronisation): settled, then asked once more.
    let ok = q.try_reserve(bytes) || (crate::streampool::settled_after_refusal(q) && q.try_reserve(bytes));
    if !ok {
        return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = alloc();
    if rc != CUresult::CUDA_SUCCESS {
        q.release(bytes);
    }
    rc
}

/// Reserves `bytes`, runs the driver's `alloc`; on success records the new allocation's key,
/// on failure gives the reservation back. If the allocation cannot be tracked it is undone.
#[inline]
pub fn counted(
    q: &Quota,
    kind: Kind,
    bytes: u64,
    alloc: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
    undo: impl FnOnce(u64),
) -> CUresult {
    // Begun before the driver's call: a teardown of its context waits for its record, or it
    // for the teardown (`crate::quota::Flight`).
    let flight = q.flight(kind);
    let rc = reserved(q, bytes, alloc);
    if rc != CUresult::CUDA_SUCCESS {
        return rc;
    }
    let k = key();
    if q.track_in(&flight, kind, k, bytes) {
        return rc;
    }
    crate::state::logged(|| tracing::error!(key = k, bytes, "xcuda: allocation table full; undoing allocation"));
    undo(k);
    q.release(bytes);
    CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Runs the driver's `free`; on success gives back what was counted for `key` to the GPU that
/// counted it (unknown keys were never counted and pass through untouched).
///
/// The record is taken out of the table *before* the driver frees, and its bytes given back
/// only after: once the driver has freed the pointer it may hand it to another thread's
/// allocation at once, whose record must never be taken for this one's (it would give back
/// the other allocation's bytes while the driver holds them). A free the driver refuses puts
/// the record back.
#[inline]
pub fn freed<C: Untrack + ?Sized>(c: &C, kind: Kind, key: u64, free: impl FnOnce() -> CUresult) -> CUresult {
    let taken = c.take(kind, key);
    let rc = free();
    if let Some((q, bytes, owner)) = taken {
        if rc == CUresult::CUDA_SUCCESS {
            q.release(bytes);
        } else {
            q.put_back(kind, key, bytes, owner);
        }
    }
    rc
}

/// Where a freed allocation's record is: one quota, or the process's state (every GPU's).
pub trait Untrack {
    /// Takes the record of allocation `key` of `kind` out of its table, its bytes still
    /// counted: the quota that counts them, the bytes and the owner word; `None` if unknown.
    fn take(&self, kind: Kind, key: u64) -> Option<(&Quota, u64, u64)>;
}

impl Untrack for Quota {
    fn take(&self, kind: Kind, key: u64) -> Option<(&Quota, u64, u64)> {
        Quota::take(self, kind, key).map(|(b, o)| (self, b, o))
    }
}

impl Untrack for crate::state::State {
    fn take(&self, kind: Kind, key: u64) -> Option<(&Quota, u64, u64)> {
        self.quotas().find_map(|q| q.take(kind, key).map(|(b, o)| (q, b, o)))
    }
}

/// Pitched allocation: reserves `estimate` first, then settles on `pitch * height` once the
/// driver has chosen the pitch (reserving the rest, or undoing if that is over quota).
pub fn pitched(
    q: &Quota,
    estimate: u64,
    alloc: impl FnOnce() -> CUresult,
    result: impl FnOnce() -> (u64, u64),
    undo: impl FnOnce(u64),
) -> CUresult {
    let flight = q.flight(Kind::DevicePtr);
    let rc = reserved(q, estimate, alloc);
    if rc != CUresult::CUDA_SUCCESS {
        return rc;
    }
    let (key, actual) = result();
    if actual > estimate && !q.try_reserve(actual - estimate) {
        undo(key);
        q.release(estimate);
        return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    if actual < estimate {
        q.release(estimate - actual);
    }
    if !q.track_in(&flight, Kind::DevicePtr, key, actual) {
        undo(key);
        q.release(actual);
        return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc
}

/// The memory view a limited process sees: total = min(device, quota), free = min(device free,
/// quota - used), never underflowing.
pub fn view(q: &Quota, free: u64, total: u64) -> (u64, u64) {
    let limit = q.limit();
    let total_v = total.min(limit);
    let free_v = free.min(limit.saturating_sub(q.used())).min(total_v);
    (free_v, total_v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn over_quota_allocates_nothing() {
        let q = Quota::local(100);
        let called = Cell::new(false);
        let rc = counted(&q, Kind::DevicePtr, 101, || { called.set(true); CUresult::CUDA_SUCCESS }, || 1, |_| {});
        assert_eq!(rc, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(!called.get(), "driver never asked");
        assert_eq!(q.used(), 0);
    }

    #[test]
    fn driver_failure_passes_through_unchanged_and_releases() {
        let q = Quota::local(100);
        let odd = CUresult(12345);
        assert_eq!(counted(&q, Kind::DevicePtr, 10, || odd, || 1, |_| {}), odd);
        assert_eq!(q.used(), 0);
    }

    /// The driver frees a pointer and hands it at once to another thread's allocation, whose
    /// record lands in a tombstone ahead of the freed one on the same probe chain: the free
    /// gives back its own bytes, never the new allocation's (which it did when it took the
    /// record out after the driver's free: the quota then counted 2 MiB while 1 GiB was held).
    #[test]
    fn a_pointer_reallocated_during_its_free_keeps_the_new_allocations_bytes_counted() {
        const MIB: u64 = 1 << 20;
        let q = Quota::local(4 << 30);
        // 0x1001 and 0x1000 share a probe chain; 0x1001 leaves a tombstone ahead of 0x1000.
        assert!(q.track(Kind::DevicePtr, 0x1001, 1) && q.try_reserve(1));
        assert_eq!(counted(&q, Kind::DevicePtr, 2 * MIB, || CUresult::CUDA_SUCCESS, || 0x1000, |_| {}), CUresult::CUDA_SUCCESS);
        assert_eq!(q.untrack(Kind::DevicePtr, 0x1001), Some(1));
        let rc = freed(&q, Kind::DevicePtr, 0x1000, || {
            // Inside the driver's free: another thread gets the same pointer for 1 GiB.
            assert_eq!(counted(&q, Kind::DevicePtr, 1 << 30, || CUresult::CUDA_SUCCESS, || 0x1000, |_| {}), CUresult::CUDA_SUCCESS);
            CUresult::CUDA_SUCCESS
        });
        assert_eq!(rc, CUresult::CUDA_SUCCESS);
        assert_eq!(q.used(), 1 << 30, "the new allocation is counted, the freed one is not");
        assert_eq!(q.tracked(Kind::DevicePtr, 0x1000), Some(1 << 30));
    }

    /// The same for a VMM handle: the driver releases it and a `cuMemCreate` on another thread
    /// gets the same handle value before the release's bookkeeping runs.
    #[test]
    fn a_vmm_handle_recreated_during_its_release_keeps_the_new_handles_bytes_counted() {
        const MIB: u64 = 1 << 20;
        let q = Quota::local(4 << 30);
        assert!(q.track(Kind::Vmm, 0x1001, 1) && q.try_reserve(1));
        assert!(q.try_reserve(2 * MIB) && q.track(Kind::Vmm, 0x1000, 2 * MIB));
        assert_eq!(q.untrack(Kind::Vmm, 0x1001), Some(1));
        let mark = q.vmm_release_begin(0x1000).expect("ours");
        // The driver's release, then another thread's cuMemCreate of 1 GiB gets 0x1000 again.
        assert!(q.try_reserve(1 << 30) && q.track(Kind::Vmm, 0x1000, 1 << 30));
        q.vmm_release_end(0x1000, true, mark);
        assert_eq!(q.used(), 1 << 30, "the new handle is counted, the released one is not");
        assert_eq!(q.tracked(Kind::Vmm, 0x1000), Some(1 << 30));
        // A release the driver refuses leaves the handle counted and releasable.
        let mark = q.vmm_release_begin(0x1000).expect("ours");
        q.vmm_release_end(0x1000, false, mark);
        assert!(q.vmm_release_begin(0x1000).is_some(), "the mark was taken off");
    }

    #[test]
    fn free_gives_back_exactly_and_unknown_passes_through() {
        let q = Quota::local(100);
        assert_eq!(counted(&q, Kind::DevicePtr, 60, || CUresult::CUDA_SUCCESS, || 0x1000, |_| {}), CUresult::CUDA_SUCCESS);
        assert_eq!(q.used(), 60);
        assert_eq!(freed(&q, Kind::DevicePtr, 0x2000, || CUresult::CUDA_SUCCESS), CUresult::CUDA_SUCCESS);
        assert_eq!(q.used(), 60);
        assert_eq!(freed(&q, Kind::DevicePtr, 0x1000, || CUresult::CUDA_ERROR_INVALID_VALUE), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(q.used(), 60, "failed free keeps the count");
        freed(&q, Kind::DevicePtr, 0x1000, || CUresult::CUDA_SUCCESS);
        assert_eq!(q.used(), 0);
    }

    #[test]
    fn pitch_settles_on_actual_size() {
        let q = Quota::local(10_000);
        let rc = pitched(&q, 2048, || CUresult::CUDA_SUCCESS, || (0x10, 1536), |_| {});
        assert_eq!(rc, CUresult::CUDA_SUCCESS);
        assert_eq!(q.used(), 1536);
        let undone = Cell::new(0);
        let rc = pitched(&q, 1000, || CUresult::CUDA_SUCCESS, || (0x20, 9000), |k| undone.set(k));
        assert_eq!(rc, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(undone.get(), 0x20);
        assert_eq!(q.used(), 1536);
    }

    #[test]
    fn view_shows_quota_and_never_underflows() {
        let q = Quota::local(1000);
        assert_eq!(view(&q, 50_000, 80_000), (1000, 1000));
        assert!(q.try_reserve(900));
        assert_eq!(view(&q, 50_000, 80_000), (100, 1000));
        assert_eq!(view(&q, 10, 80_000), (10, 1000), "device free smaller than quota room");
        assert!(q.try_reserve(100));
        assert_eq!(view(&q, 50_000, 80_000), (0, 1000));
        assert_eq!(view(&q, 50_000, 500), (0, 500));
    }
}
