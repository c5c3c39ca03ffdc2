//! Context limits that hold device memory (`cuCtxSetLimit`), counted against the quota.
//!
//! cuda.h: raising `CU_LIMIT_STACK_SIZE` "will take effect immediately" (the driver reserves
//! that stack for every thread the GPU holds resident: 1 KiB more is 264 MiB on an H100),
//! `CU_LIMIT_MALLOC_HEAP_SIZE` and `CU_LIMIT_PRINTF_FIFO_SIZE` size buffers the driver
//! allocates for the context, and the device-runtime limits "require the driver to reserve
//! large amounts of device memory ... If these reservations fail, cuCtxSetLimit() will return
//! CUDA_ERROR_OUT_OF_MEMORY". No allocation call carries any of it, so a process could hold
//! gigabytes past its quota through this one call.
//!
//! - Stack, heap and FIFO: the bytes above a new context's defaults (1 KiB of stack per
//!   resident thread, 8 MiB of heap, 1 MiB of FIFO: a context's own memory, outside the quota
//!   like the rest of it) are reserved before the driver is asked, refused with
//!   `CUDA_ERROR_OUT_OF_MEMORY` over the quota, settled to what the driver set (it may round:
//!   `cuCtxGetLimit` says) and given back when lowered or when the context ends.
//! - Device-runtime sync depth and pending launch count: NVIDIA does not say how much memory a
//!   raise reserves, so the shim cannot count it; a raise above the context's current value is
//!   refused with `CUDA_ERROR_OUT_OF_MEMORY`, the answer the driver gives when the memory is
//!   not there (fail closed), and logged once. Lowering them passes through.
//! - The L2 hints hold no device memory: passed through.

use cuda_abi::{CUdevice, CUdevice_attribute, CUlimit, CUresult};

use crate::quota::{Kind, Quota};
use crate::spin::SpinLock;
use crate::state::{call_real, logged, state};

/// A new context's stack per thread, printf FIFO and malloc heap (CUDA C Programming Guide).
const DEFAULT_STACK: u64 = 1024;
const DEFAULT_PRINTF_FIFO: u64 = 1 << 20;
const DEFAULT_MALLOC_HEAP: u64 = 8 << 20;

/// Limit bits of a record's key (context handles are pointers, below 2^56).
const LIMIT_SHIFT: u32 = 56;

/// Serialises limit changes (rare calls) so that two threads changing one context's limit
/// cannot both read the old record.
pub static CHANGES: SpinLock = SpinLock::new();

/// How a limit's value becomes device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sizing {
    /// `value` bytes beyond `default`, times `per` (resident threads for the stack, else 1).
    Bytes { default: u64, per: u64 },
    /// Memory of a size NVIDIA does not state: raises refused.
    Unsized,
    /// No device memory.
    Free,
}

/// The record key of `limit` of context `ctx`.
fn key(ctx: u64, limit: CUlimit) -> u64 {
    ctx ^ (u64::from(limit.0 + 1) << LIMIT_SHIFT)
}

/// Bytes counted for `value` of a limit sized `default`/`per`.
fn bytes(value: u64, default: u64, per: u64) -> u64 {
    value.saturating_sub(default).saturating_mul(per)
}

fn attribute(dev: CUdevice, a: CUdevice_attribute) -> Option<u64> {
    let mut v = 0i32;
    let rc = call_real!(cuDeviceGetAttribute: cuda_abi::PFN_cuDeviceGetAttribute_v2000, &mut v, a, dev);
    (rc == CUresult::CUDA_SUCCESS && v > 0).then_some(v as u64)
}

/// Threads device `dev` holds resident (SMs x threads per SM); `None` if the driver cannot say.
fn resident_threads(dev: CUdevice) -> Option<u64> {
    let sms = attribute(dev, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let per_sm = attribute(dev, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?;
    Some(sms * per_sm)
}

/// The current context's `limit` (`None` if the driver cannot say).
fn current_limit(limit: CUlimit) -> Option<u64> {
    let mut v = 0usize;
    let rc = call_real!(cuCtxGetLimit: cuda_abi::PFN_cuCtxGetLimit_v3010, &mut v, limit);
    (rc == CUresult::CUDA_SUCCESS).then_some(v as u64)
}

fn sizing(limit: CUlimit, dev: CUdevice) -> Sizing {
    match limit {
        // Unknown thread count: assume the largest a GPU holds today (an over-count only).
        CUlimit::CU_LIMIT_STACK_SIZE => Sizing::Bytes { default: DEFAULT_STACK, per: resident_threads(dev).unwrap_or(256 * 2048) },
        CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE => Sizing::Bytes { default: DEFAULT_PRINTF_FIFO, per: 1 },
        CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE => Sizing::Bytes { default: DEFAULT_MALLOC_HEAP, per: 1 },
        CUlimit::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH | CUlimit::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => Sizing::Unsized,
        _ => Sizing::Free,
    }
}

/// Hooked `cuCtxSetLimit`: `real` asks the driver to set `limit` to `value` on the current
/// context.
pub fn set_limit(limit: CUlimit, value: usize, real: impl FnOnce() -> CUresult) -> CUresult {
    let value = value as u64;
    let ctx = crate::exit::current_context();
    if ctx == 0 {
        // No current context: the driver refuses (CUDA_ERROR_INVALID_CONTEXT).
        return real();
    }
    let mut dev: CUdevice = 0;
    if call_real!(cuCtxGetDevice: cuda_abi::PFN_cuCtxGetDevice_v2000, &mut dev) != CUresult::CUDA_SUCCESS {
        return real();
    }
    let q = &state().gpu(dev).quota;
    let _one = CHANGES.lock();
    match sizing(limit, dev) {
        Sizing::Free => real(),
        Sizing::Unsized => match current_limit(limit) {
            Some(cur) if value > cur => {
                logged(|| tracing::error!(limit = limit.0, value, current = cur, device = dev, "xcuda: cuCtxSetLimit refused (CUDA_ERROR_OUT_OF_MEMORY): raising a device-runtime limit reserves device memory NVIDIA does not size, which the quota cannot count"));
                CUresult::CUDA_ERROR_OUT_OF_MEMORY
            }
            // Lowered, unchanged, or one the driver cannot read (it answers the set too).
            _ => real(),
        },
        Sizing::Bytes { default, per } => set_sized(q, ctx, limit, value, (default, per), real, || current_limit(limit)),
    }
}

/// [`set_limit`] of a limit whose memory is `(value - default) x per` bytes; `set` reads back
/// the value the driver set.
fn set_sized(
    q: &Quota,
    ctx: u64,
    limit: CUlimit,
    value: u64,
    (default, per): (u64, u64),
    real: impl FnOnce() -> CUresult,
    set: impl FnOnce() -> Option<u64>,
) -> CUresult {
    // Begun before the driver's call, as an allocation is (`crate::quota::Flight`): a
    // teardown of `ctx` waits for its record, or it for the teardown.
    let flight = q.flight_in(ctx);
    let k = key(ctx, limit);
    let have = q.tracked(Kind::CtxLimit, k).unwrap_or(0);
    let want = bytes(value, default, per);
    let more = want.saturating_sub(have);
    if more > 0 && !q.try_reserve(more) {
        logged(|| tracing::error!(limit = limit.0, value, bytes = want, quota_used = q.used(), quota = q.limit(), "xcuda: cuCtxSetLimit refused: the device memory this limit holds would take the group over its quota (CUDA_ERROR_OUT_OF_MEMORY)"));
        return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = real();
    if rc != CUresult::CUDA_SUCCESS {
        q.release(more);
        return rc;
    }
    // What the driver set (it may round or clamp); unreadable, the value asked for.
    let set = bytes(set().unwrap_or(value), default, per);
    let counted = have + more;
    let counted = if set > counted {
        let got = q.reserve_up_to(set - counted);
        if got < set - counted {
            logged(|| tracing::error!(limit = limit.0, bytes = set, counted = counted + got, "xcuda: the driver set a context limit above what was asked and past the group's quota: counted as far as the quota allows; the group is at its limit"));
        }
        counted + got
    } else {
        q.release(counted - set);
        set
    };
    q.set_ctx_limit(&flight, k, counted);
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_memory_above_a_new_contexts_defaults_is_counted() {
        assert_eq!(bytes(1024, DEFAULT_STACK, 264 * 1024), 0, "the default stack is the context's own");
        assert_eq!(bytes(512, DEFAULT_STACK, 1000), 0, "lowered below the default: nothing");
        assert_eq!(bytes(4096, DEFAULT_STACK, 132 * 2048), 3072 * 132 * 2048, "the stack is reserved for every resident thread");
        assert_eq!(bytes(u64::MAX, DEFAULT_STACK, 1 << 20), u64::MAX, "saturates, never wraps to a small count");
        assert_eq!(bytes(1 << 30, DEFAULT_MALLOC_HEAP, 1), (1 << 30) - (8 << 20));
    }

    #[test]
    fn each_limit_of_each_context_has_its_own_record() {
        let (a, b) = (0x7f00_0000_1000u64, 0x7f00_0000_2000u64);
        let keys = [
            key(a, CUlimit::CU_LIMIT_STACK_SIZE),
            key(a, CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE),
            key(a, CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE),
            key(b, CUlimit::CU_LIMIT_STACK_SIZE),
        ];
        for (i, x) in keys.iter().enumerate() {
            assert_ne!(*x, a, "a record never takes the context's own key");
            for y in &keys[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[test]
    fn a_limit_change_is_counted_settled_and_given_back() {
        let q = Quota::local(100 << 20);
        let ctx = 0x7f00_0000_1000u64;
        let heap = CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE;
        let set = |v: u64| set_sized(&q, ctx, heap, v, (DEFAULT_MALLOC_HEAP, 1), || CUresult::CUDA_SUCCESS, || Some(v));
        assert_eq!(set(40 << 20), CUresult::CUDA_SUCCESS);
        assert_eq!(q.used(), 32 << 20, "32 MiB above the default heap");
        assert_eq!(set(200 << 20), CUresult::CUDA_ERROR_OUT_OF_MEMORY, "over the quota: refused");
        assert_eq!(q.used(), 32 << 20, "a refusal changes nothing");
        assert_eq!(set(16 << 20), CUresult::CUDA_SUCCESS);
        assert_eq!(q.used(), 8 << 20, "lowered: the difference given back");
        let failed = set_sized(&q, ctx, heap, 50 << 20, (DEFAULT_MALLOC_HEAP, 1), || CUresult::CUDA_ERROR_INVALID_VALUE, || None);
        assert_eq!(failed, CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(q.used(), 8 << 20, "a set the driver refused: the reservation given back");
        assert_eq!(q.release_context(ctx), 8 << 20, "the context's end gives its limits back");
        assert_eq!(q.used(), 0);
    }

    #[test]
    fn what_the_driver_rounded_up_to_is_counted_as_far_as_the_quota_allows() {
        let q = Quota::local(64 << 20);
        let (ctx, stack) = (0x7f00_0000_1000u64, CUlimit::CU_LIMIT_STACK_SIZE);
        let rc = set_sized(&q, ctx, stack, 1040, (DEFAULT_STACK, 1 << 20), || CUresult::CUDA_SUCCESS, || Some(1088));
        assert_eq!(rc, CUresult::CUDA_SUCCESS);
        assert_eq!(q.used(), 64 << 20, "asked 16 MiB, the driver set 64 MiB: all of it counted");
        let rc = set_sized(&q, ctx, stack, 1100, (DEFAULT_STACK, 1 << 20), || CUresult::CUDA_SUCCESS, || Some(1200));
        assert_eq!(rc, CUresult::CUDA_ERROR_OUT_OF_MEMORY, "12 MiB more than the quota holds: refused first");
        let rc = set_sized(&q, ctx, stack, 1050, (DEFAULT_STACK, 1 << 20), || CUresult::CUDA_SUCCESS, || Some(1200));
        assert_eq!(rc, CUresult::CUDA_SUCCESS, "the driver went past what fit");
        assert_eq!(q.used(), 64 << 20, "counted up to the quota: the group is at its limit");
        assert_eq!(q.tracked(Kind::CtxLimit, key(ctx, stack)), Some(64 << 20));
    }

    /// A limit another thread sets in a context while its teardown is in progress (its
    /// records set aside) waits for the teardown's end: the driver destroyed the context, so
    /// the set fails and nothing stays counted. Before, the limit was recorded under the
    /// context after the set-aside and its bytes stayed counted for the process's life.
    #[test]
    fn a_limit_set_during_its_contexts_teardown_is_not_left_counted() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        use std::sync::Arc;
        let q = Arc::new(Quota::local(100 << 20));
        let (ctx, heap) = (0x7f00_0000_1000u64, CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE);
        q.context_teardown_begin(ctx);
        let (live, done) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(false)));
        let set = std::thread::spawn({
            let (q, live, done) = (q.clone(), live.clone(), done.clone());
            move || {
                let driver = || if live.load(SeqCst) { CUresult::CUDA_SUCCESS } else { CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED };
                let rc = set_sized(&q, ctx, heap, 40 << 20, (DEFAULT_MALLOC_HEAP, 1), driver, || Some(40 << 20));
                done.store(true, SeqCst);
                rc
            }
        });
        // Set (and recorded), or waiting for the teardown's end; a minute is a hang.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !done.load(SeqCst) && q.teardown_waits() == 0 {
            assert!(std::time::Instant::now() < end, "neither set nor waiting for the teardown");
            std::thread::yield_now();
        }
        // The driver destroys the context.
        live.store(false, SeqCst);
        q.context_teardown_end(ctx, true);
        let rc = set.join().unwrap();
        assert_eq!(q.used(), 0, "a limit set during its context's teardown stayed counted after the driver freed it");
        assert_eq!(rc, CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
}
