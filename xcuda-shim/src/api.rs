//! The exported C surface: every entry point is a few lines that fetch the real function and
//! hand the rest to `memory`, `throttle`, `exit` or `interpose`. No panic crosses this file.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cuda_abi::*;

use crate::interpose::{proc_answer, ProcAnswer, Sym};
use crate::memory::{counted, freed, pitched, view};
use crate::quota::{array_bytes, mipmapped_bytes, pitch_estimate, Kind};
use crate::state::state;

#[inline(always)]
fn guard(f: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(CUresult::CUDA_ERROR_UNKNOWN)
}

/// The real driver's `$sym` as `$pfn`, or return CUDA_ERROR_NOT_FOUND from the closure.
macro_rules! real {
    ($sym:ident : $pfn:ty) => {{
        let p = crate::real::driver(Sym::$sym);
        if p.is_null() {
            return CUresult::CUDA_ERROR_NOT_FOUND;
        }
        // SAFETY: p is the real driver's $sym, whose C type is $pfn (cuda-abi's proc table).
        unsafe { std::mem::transmute::<*mut c_void, $pfn>(p) }
    }};
}

/// Reads an out-parameter the driver has just filled (it returned success, so it is valid).
macro_rules! out {
    ($p:expr) => {{
        let p = $p;
        if p.is_null() {
            Default::default()
        } else {
            // SAFETY: non-null, and the driver returned CUDA_SUCCESS, so it wrote through it.
            unsafe { *p }
        }
    }};
}

/// What a hook's bookkeeping after a successful call answers: nothing (the driver's result
/// stands) or a result of its own (the bookkeeping undid the call and refuses it).
trait Then {
    fn then(self, rc: CUresult) -> CUresult;
}

impl Then for () {
    fn then(self, rc: CUresult) -> CUresult {
        rc
    }
}

impl Then for CUresult {
    fn then(self, _: CUresult) -> CUresult {
        self
    }
}

/// Hooks that call the real function with the caller's arguments and, when it returns
/// `CUDA_SUCCESS`, do the shim's bookkeeping (`$after`, the arguments in scope; a `CUresult`
/// it evaluates to replaces the driver's, see [`Then`]). `[gated]`: the
/// call creates a context, refused with `CUDA_ERROR_DEINITIALIZED` once a release has started
/// (signal or exit), since a context created then would outlive it.
macro_rules! forward_then {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($a:ident : $t:ty),* $(,)?) : $pfn:ty $([$gated:ident])? $(, under $lock:expr)? => $after:expr;
    )*) => {
        $(
            $(#[$doc])*
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
                guard(|| {
                    let real_fn = real!($name: $pfn);
                    $(creation_gate!($gated);)?
                    // `under`: held from before the call until its record is made.
                    $(let _held = $lock;)?
                    // SAFETY: forwarding the caller's arguments.
                    let rc = unsafe { real_fn($($a),*) };
                    if rc == CUresult::CUDA_SUCCESS {
                        return Then::then($after, rc);
                    }
                    $(refused!($gated, rc);)?
                    rc
                })
            }
        )*
    };
}

/// `[gated]` / `[init]` of `forward_then!` after the call: a context the driver refused as the
/// device is unavailable, or an MPS connection that failed, is explained (see
/// [`device_unavailable`], [`mps_connection_failed`]).
macro_rules! refused {
    (init, $rc:expr) => {
        if $rc == CUresult::CUDA_ERROR_MPS_CONNECTION_FAILED {
            mps_connection_failed();
        }
    };
    (gated, $rc:expr) => {
        if $rc == CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE {
            device_unavailable();
        } else if $rc == CUresult::CUDA_ERROR_MPS_CONNECTION_FAILED {
            mps_connection_failed();
        }
    };
}

/// A context refused with `CUDA_ERROR_MPS_CONNECTION_FAILED`: the process reached the MPS
/// control daemon but could not connect to its server; in a container the usual cause is a
/// `/dev/shm` that is not the server's (where it keeps the shared memory its clients attach
/// to). Said once per process (a refusal path).
fn mps_connection_failed() {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    explain_once(&SAID, |pipe| {
        tracing::error!(
            pipe_dir = %pipe,
            "xcuda: the driver could not connect this process to MPS (CUDA_ERROR_MPS_CONNECTION_FAILED): \
             the MPS server keeps its clients' shared memory in its /dev/shm, and this process must \
             see the same directory at /dev/shm (xshare: mps-manager's shm_dir, by default \
             /dev/shm/xshare-gpu<N>, mounted at /dev/shm in the container; `mps-manager status` \
             shows it); also check that the client runs as the MPS server's user"
        )
    });
}

/// Runs `say` (an explanation of a refusal, given this process's `CUDA_MPS_PIPE_DIRECTORY`)
/// the first time `said` is found unset: once per process, on a refusal path only.
fn explain_once(said: &std::sync::atomic::AtomicBool, say: impl FnOnce(&str)) {
    if said.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let pipe = std::env::var("CUDA_MPS_PIPE_DIRECTORY").unwrap_or_else(|_| "unset, so /tmp/nvidia-mps".into());
    crate::state::logged(|| say(&pipe));
}

/// A context the driver refused with `CUDA_ERROR_DEVICE_UNAVAILABLE`: the GPU is in the
/// EXCLUSIVE_PROCESS compute mode (mps-manager's default) and another process holds it (the
/// MPS server, when MPS runs), so this process did not reach MPS. Said once per process, with
/// the pipe directory it looked in (a refusal path: never taken by a process that runs).
fn device_unavailable() {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    explain_once(&SAID, |pipe| {
        tracing::error!(
            pipe_dir = %pipe,
            "xcuda: the driver refused a context (CUDA_ERROR_DEVICE_UNAVAILABLE): the GPU is in the \
             EXCLUSIVE_PROCESS compute mode and another process holds it (the MPS server, when \
             mps-manager runs it); this process did not reach MPS: CUDA_MPS_PIPE_DIRECTORY must \
             name the GPU's MPS pipe directory (xshare: <ledger_dir>/gpu<N>/mps-pipe, mounted into \
             the container)"
        )
    });
}

/// `[gated]` of `forward_then!`: holds the creation gate to the end of the hook, or returns.
macro_rules! creation_gate {
    (init) => {};
    (gated) => {
        let Some(_gate) = crate::exit::CreationGate::enter() else { return CUresult::CUDA_ERROR_DEINITIALIZED };
    };
}

// ---- init and lookup -------------------------------------------------------------------------

forward_then! {
    /// Hooked `cuInit`: initialises the driver, then this process's shim state (quota, throttle, controller).
    /// `[init]`: an MPS connection that fails here (`CUDA_ERROR_MPS_CONNECTION_FAILED`) is
    /// explained (see `mps_connection_failed`).
    fn cuInit(flags: c_uint): PFN_cuInit_v2000 [init] => { state(); };
}

/// Rewrites a successful `cuGetProcAddress*` answer (see [`proc_answer`]). `status` is the
/// caller's `symbolStatus` out-pointer (`_v2` only), set for a refused lookup.
fn rewrite_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    rc: CUresult,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    if rc != CUresult::CUDA_SUCCESS || symbol.is_null() || pfn.is_null() {
        return rc;
    }
    // SAFETY: the driver accepted `symbol` as a NUL-terminated name and filled `pfn`.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    // SAFETY: pfn is the caller's out-pointer, valid (the driver just wrote it).
    let driver_ptr = unsafe { *pfn };
    match proc_answer(name, version, flags, driver_ptr, crate::real::driver) {
        ProcAnswer::Driver => rc,
        ProcAnswer::Ours(ours) => {
            // SAFETY: as above.
            unsafe { *pfn = ours };
            rc
        }
        ProcAnswer::Unknown => {
            tracing::error!(
                symbol = %String::from_utf8_lossy(name),
                version,
                "refusing cuGetProcAddress: the driver's ABI of this hooked entry point at this CUDA \
                 version is newer than the shim knows (it would run unlimited); the caller sees \
                 CUDA_ERROR_NOT_SUPPORTED"
            );
            // SAFETY: as above; status is null or the caller's out-pointer.
            unsafe {
                *pfn = std::ptr::null_mut();
                if !status.is_null() {
                    *status = CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
                }
            }
            CUresult::CUDA_ERROR_NOT_SUPPORTED
        }
    }
}

/// Hooked `cuGetProcAddress` (CUDA 11.3 ABI): hooked entry points are answered with ours.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: cuuint64_t) -> CUresult {
    guard(|| {
        let gpa = real!(cuGetProcAddress: PFN_cuGetProcAddress_v11030);
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { gpa(symbol, pfn, version, flags) };
        rewrite_proc(symbol, pfn, version, flags, rc, std::ptr::null_mut())
    })
}

/// Hooked `cuGetProcAddress_v2`: hooked entry points are answered with ours (see `proc_answer`).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    guard(|| {
        let gpa = real!(cuGetProcAddress_v2: PFN_cuGetProcAddress_v12000);
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { gpa(symbol, pfn, version, flags, status) };
        rewrite_proc(symbol, pfn, version, flags, rc, status)
    })
}

// ---- allocation ------------------------------------------------------------------------------

/// Hooked `cuMemAlloc_v2`: reserved in the quota first, refused with `CUDA_ERROR_OUT_OF_MEMORY` over it.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    guard(|| {
        let (alloc, free) = (real!(cuMemAlloc_v2: PFN_cuMemAlloc_v3020), real!(cuMemFree_v2: PFN_cuMemFree_v3020));
        counted(&state().current().quota, Kind::DevicePtr, bytesize as u64,
            // SAFETY: forwarding the caller's arguments to the real function.
            || unsafe { alloc(dptr, bytesize) }, || out!(dptr),
            // SAFETY: freeing the allocation the driver just made.
            |k| { unsafe { free(k) }; })
    })
}

/// Hooked `cuMemAlloc` (32-bit ABI): counted like `cuMemAlloc_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult {
    guard(|| {
        let (alloc, free) = (real!(cuMemAlloc: PFN_cuMemAlloc_v2000), real!(cuMemFree: PFN_cuMemFree_v2000));
        counted(&state().current().quota, Kind::DevicePtr, u64::from(bytesize),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { alloc(dptr, bytesize) }, || u64::from(out!(dptr)),
            // SAFETY: undoing our own allocation.
            |k| { unsafe { free(k as CUdeviceptr_v1) }; })
    })
}

/// Hooked `cuMemAllocPitch_v2`: an estimate reserved first, settled on the driver's pitch.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> CUresult {
    guard(|| {
        let (alloc, free) = (real!(cuMemAllocPitch_v2: PFN_cuMemAllocPitch_v3020), real!(cuMemFree_v2: PFN_cuMemFree_v3020));
        pitched(&state().current().quota, pitch_estimate(width, height),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { alloc(dptr, pitch, width, height, elem) },
            || (out!(dptr), (out!(pitch) as u64).saturating_mul(height as u64)),
            // SAFETY: undoing our own allocation.
            |k| { unsafe { free(k) }; })
    })
}

/// Hooked `cuMemAllocPitch` (32-bit ABI): counted like `cuMemAllocPitch_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) -> CUresult {
    guard(|| {
        let (alloc, free) = (real!(cuMemAllocPitch: PFN_cuMemAllocPitch_v2000), real!(cuMemFree: PFN_cuMemFree_v2000));
        pitched(&state().current().quota, pitch_estimate(width as usize, height as usize),
            // SAFETY: forwarding the caller's arguments.
            || unsafe { alloc(dptr, pitch, width, height, elem) },
            || (u64::from(out!(dptr)), u64::from(out!(pitch)) * u64::from(height)),
            // SAFETY: undoing our own allocation.
            |k| { unsafe { free(k as CUdeviceptr_v1) }; })
    })
}

/// Hooked `cuMemAllocManaged`: managed memory counted against the quota like device memory.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    guard(|| {
        let (alloc, free) = (real!(cuMemAllocManaged: PFN_cuMemAllocManaged_v6000), real!(cuMemFree_v2: PFN_cuMemFree_v3020));
        counted(&state().current().quota, Kind::DevicePtr, bytesize as u64,
            // SAFETY: forwarding the caller's arguments.
            || unsafe { alloc(dptr, bytesize, flags) }, || out!(dptr),
            // SAFETY: undoing our own allocation.
            |k| { unsafe { free(k) }; })
    })
}

/// `CU_STREAM_PER_THREAD` (cuda.h: `((CUstream)0x2)`): the per-thread default stream named
/// explicitly.
const CU_STREAM_PER_THREAD: CUstream = 0x2 as CUstream;

/// Stream-ordered allocations (`pool` for `cuMemAllocFromPoolAsync`): counted as what their
/// pool reserves, on the pool's GPU (see `streampool`; without a pool named, the current pool of
/// the stream's device): the size reserved in the quota first, an allocation that cannot be
/// recorded undone on the same stream. A pool the driver cannot name falls back to counting the
/// allocation itself until its free; a full pool table refuses the allocation.
macro_rules! alloc_async {
    ($name:ident, $free:ident, $from_pool:ident, $pfn:ty, $free_pfn:ty, $from_pool_pfn:ty $(, $pool:ident)?) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: its pool's growth reserved in the quota first, refused with `CUDA_ERROR_OUT_OF_MEMORY` over it.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(dptr: *mut CUdeviceptr, bytesize: usize, $($pool: CUmemoryPool,)? stream: CUstream) -> CUresult {
            guard(|| {
                let (alloc, free) = (real!($name: $pfn), real!($free: $free_pfn));
                let st = state();
                let explicit: Option<CUmemoryPool> = None $(.or(Some($pool)))?;
                // SAFETY: forwarding the caller's arguments.
                let call = || unsafe { alloc(dptr, bytesize, $($pool,)? stream) };
                // SAFETY: undoing our own allocation on the same stream.
                let undo = |k| { unsafe { free(k, stream) }; };
                use crate::streampool::NoSlot;
                // Inside a stream capture nothing is allocated: the driver adds a memory node
                // to the capture's graph, whose launches are counted like any graph's.
                // A `_ptsz` entry's null stream is the per-thread default stream (which may be
                // capturing), not the legacy one the plain query would name.
                let per_thread = stringify!($name).ends_with("_ptsz") && stream.is_null();
                let capturing = if per_thread { CU_STREAM_PER_THREAD } else { stream };
                // Without a pool named, the memory comes from the stream's device, which may
                // be another GPU than the current context's.
                let stream_dev = match explicit {
                    Some(_) => 0,
                    None => match st.stream_ordinal(capturing as u64) {
                        Ok(d) => d,
                        Err(rc) => return rc,
                    },
                };
                // `record`: the pointer recorded as the pool's (false: a capture's node, maybe).
                let counted_alloc = |record: bool| match crate::streampool::pool_for(st, explicit, stream_dev) {
                    // The current pool is asked for by name: the memory comes from the pool
                    // counted, even if another thread makes another pool current (or swaps the
                    // stream) between the shim's question and the driver's allocation.
                    Ok((slot, pool)) if explicit.is_none() => {
                        let from_pool = real!($from_pool: $from_pool_pfn);
                        // SAFETY: the caller's arguments, with the pool the driver named current.
                        let named = || unsafe { from_pool(dptr, bytesize, pool, stream) };
                        if record {
                            crate::streampool::counted_alloc(st, slot, bytesize as u64, named, || out!(dptr), undo)
                        } else {
                            crate::streampool::reserved_alloc(st, slot, bytesize as u64, named)
                        }
                    }
                    Ok((slot, _)) if record => crate::streampool::counted_alloc(st, slot, bytesize as u64, &call, || out!(dptr), undo),
                    Ok((slot, _)) => crate::streampool::reserved_alloc(st, slot, bytesize as u64, &call),
                    // The driver refuses it (nothing allocated); its own answer is passed on.
                    Err(NoSlot::NullPool) => call(),
                    Err(NoSlot::Unknown) => counted(&st.gpu(stream_dev as CUdevice).quota, Kind::StreamOrdered, bytesize as u64, &call, || out!(dptr), undo),
                    Err(NoSlot::TableFull) => CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                };
                if let Some(graph) = crate::graphmem::capture_graph(capturing as u64) {
                    let ord = match explicit {
                        Some(p) if !p.is_null() => crate::streampool::pool_device(st, p as u64),
                        Some(_) => st.current_ordinal(),
                        None => stream_dev,
                    };
                    if crate::capture::owns(capturing as u64, false) {
                        // This thread's own capture, which no other thread can end before the
                        // driver's call: a node, no memory now.
                        return crate::graphmem::captured_alloc(st, graph, ord, bytesize as u64, &call);
                    }
                    // Another thread's capture, or a relaxed one: it may end before the
                    // driver's call, which then allocates. Counted both ways: the node in the
                    // graph's footprint and the size reserved as an allocation (settled to
                    // what the pool reserves once the driver answered).
                    return crate::graphmem::captured_alloc(st, graph, ord, bytesize as u64, || counted_alloc(false));
                }
                counted_alloc(true)
            })
        }
    };
}
alloc_async!(cuMemAllocAsync, cuMemFreeAsync, cuMemAllocFromPoolAsync, PFN_cuMemAllocAsync_v11020, PFN_cuMemFreeAsync_v11020, PFN_cuMemAllocFromPoolAsync_v11020);
alloc_async!(
    cuMemAllocAsync_ptsz,
    cuMemFreeAsync_ptsz,
    cuMemAllocFromPoolAsync_ptsz,
    PFN_cuMemAllocAsync_v11020_ptsz,
    PFN_cuMemFreeAsync_v11020_ptsz,
    PFN_cuMemAllocFromPoolAsync_v11020_ptsz
);
alloc_async!(cuMemAllocFromPoolAsync, cuMemFreeAsync, cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020, PFN_cuMemFreeAsync_v11020, PFN_cuMemAllocFromPoolAsync_v11020, pool);
alloc_async!(
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync_ptsz,
    cuMemAllocFromPoolAsync_ptsz,
    PFN_cuMemAllocFromPoolAsync_v11020_ptsz,
    PFN_cuMemFreeAsync_v11020_ptsz,
    PFN_cuMemAllocFromPoolAsync_v11020_ptsz,
    pool
);

/// Hooked `cuMemCreate`: a VMM allocation counted against the quota until `cuMemRelease`.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult {
    guard(|| {
        let (create, release) = (real!(cuMemCreate: PFN_cuMemCreate_v10020), real!(cuMemRelease: PFN_cuMemRelease_v10020));
        // The physical memory lives on the device the properties name (not the current one's).
        let st = state();
        // One read of the caller's properties, and the driver gets that copy: a thread changing
        // them in between could otherwise have one GPU charged and memory made on another.
        // SAFETY: null or the caller's properties per the API contract.
        let own: Option<CUmemAllocationProp> = (!prop.is_null()).then(|| unsafe { *prop });
        let prop = own.as_ref().map_or(prop, |p| p as *const CUmemAllocationProp);
        let gpu = match &own {
            None => st.current(),
            Some(p) => if p.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
                st.current()
            } else if usize::try_from(p.location.id).is_ok_and(|i| i < st.gpus.len()) {
                st.gpu(p.location.id)
            } else {
                // No such device: refused as the driver refuses it, without asking it (memory
                // on a device this process cannot see would have no quota to count against).
                return CUresult::CUDA_ERROR_INVALID_VALUE;
            },
        };
        counted(&gpu.quota, Kind::Vmm, size as u64,
            // SAFETY: the caller's arguments, its properties as read above.
            || unsafe { create(handle, size, prop, flags) }, || out!(handle),
            // SAFETY: undoing our own allocation.
            |k| { unsafe { release(k) }; })
    })
}

/// Array creations: with a descriptor, the array's size (`$bytes`, the descriptor `$d` in scope)
/// counted against the quota; a null descriptor goes to the driver, which refuses it.
macro_rules! array_create {
    ($(
        $(#[$doc:meta])*
        fn $name:ident(handle: *mut $h:ty, desc: $desc:ty $(, $extra:ident : $et:ty)?) : $pfn:ty, $destroy:ident : $destroy_pfn:ty => |$d:ident| $bytes:expr;
    )*) => {
        $(
            $(#[$doc])*
            #[no_mangle]
            pub unsafe extern "C" fn $name(handle: *mut $h, desc: $desc $(, $extra: $et)?) -> CUresult {
                guard(|| {
                    let (create, destroy) = (real!($name: $pfn), real!($destroy: $destroy_pfn));
                    if desc.is_null() {
                        // SAFETY: the driver rejects the null descriptor itself.
                        return unsafe { create(handle, desc $(, $extra)?) };
                    }
                    // SAFETY: non-null descriptor supplied by the caller per the API contract.
                    let $d = unsafe { *desc };
                    // The driver gets the descriptor that was counted: a thread growing the
                    // caller's in between would otherwise get a big array counted small.
                    let counted_desc: $desc = &$d;
                    counted(&state().current().quota, Kind::Array, $bytes,
                        // SAFETY: the caller's arguments, its descriptor as read above.
                        || unsafe { create(handle, counted_desc $(, $extra)?) }, || out!(handle) as u64,
                        // SAFETY: undoing our own allocation.
                        |k| { unsafe { destroy(k as $h) }; })
                })
            }
        )*
    };
}

array_create! {
    /// Hooked `cuArrayCreate_v2`: the array's size counted against the quota.
    fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR): PFN_cuArrayCreate_v3020, cuArrayDestroy: PFN_cuArrayDestroy_v2000
        => |d| array_bytes(d.Width, d.Height, 0, d.Format, d.NumChannels);
    /// Hooked `cuArray3DCreate_v2`: the array's size counted against the quota.
    fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR): PFN_cuArray3DCreate_v3020, cuArrayDestroy: PFN_cuArrayDestroy_v2000
        => |d| array_bytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels);
    /// Hooked `cuArrayCreate` (the CUDA 2.0 ABI, 32-bit sizes): counted as `cuArrayCreate_v2`.
    fn cuArrayCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1): PFN_cuArrayCreate_v2000, cuArrayDestroy: PFN_cuArrayDestroy_v2000
        => |d| array_bytes(d.Width as usize, d.Height as usize, 0, d.Format, d.NumChannels);
    /// Hooked `cuArray3DCreate` (the CUDA 2.0 ABI, 32-bit sizes): counted as `cuArray3DCreate_v2`.
    fn cuArray3DCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1): PFN_cuArray3DCreate_v2000, cuArrayDestroy: PFN_cuArrayDestroy_v2000
        => |d| array_bytes(d.Width as usize, d.Height as usize, d.Depth as usize, d.Format, d.NumChannels);
    /// Hooked `cuMipmappedArrayCreate`: every level's size counted against the quota.
    fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint): PFN_cuMipmappedArrayCreate_v5000, cuMipmappedArrayDestroy: PFN_cuMipmappedArrayDestroy_v5000
        => |d| mipmapped_bytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels, d.Flags, levels);
}

/// Hooks that give back the bytes counted for `$key` (the pointer or handle, of `Kind::$kind`)
/// to the quota that counted them, around the real call.
macro_rules! freeing {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($a:ident : $t:ty),* $(,)?) : $pfn:ty => $kind:ident($key:expr);
    )*) => {
        $(
            $(#[$doc])*
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
                guard(|| {
                    let free = real!($name: $pfn);
                    let st = state();
                    // SAFETY: forwarding the caller's arguments.
                    let free = || freed(st, Kind::$kind, $key, || unsafe { free($($a),*) });
                    if Kind::$kind == Kind::DevicePtr {
                        crate::streampool::freeing(st, $key, free)
                    } else {
                        free()
                    }
                })
            }
        )*
    };
}

freeing! {
    /// Hooked `cuMemFree_v2`: the bytes counted for the pointer go back to the quota that counted
    /// them (a stream-ordered allocation's stay counted while its pool keeps them).
    fn cuMemFree_v2(dptr: CUdeviceptr): PFN_cuMemFree_v3020 => DevicePtr(dptr);
    /// Hooked `cuMemFree` (32-bit ABI): like `cuMemFree_v2`.
    fn cuMemFree(dptr: CUdeviceptr_v1): PFN_cuMemFree_v2000 => DevicePtr(u64::from(dptr));
    /// Hooked `cuMemFreeAsync`: like `cuMemFree_v2` (a stream-ordered allocation goes back to
    /// its pool, which keeps it counted until it releases it).
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream): PFN_cuMemFreeAsync_v11020 => DevicePtr(dptr);
    /// Hooked `cuMemFreeAsync_ptsz`: like `cuMemFreeAsync`.
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream): PFN_cuMemFreeAsync_v11020_ptsz => DevicePtr(dptr);
    /// Hooked `cuArrayDestroy`: gives the array's bytes back.
    fn cuArrayDestroy(h: CUarray): PFN_cuArrayDestroy_v2000 => Array(h as u64);
    /// Hooked `cuMipmappedArrayDestroy`: gives the mipmapped array's bytes back.
    fn cuMipmappedArrayDestroy(h: CUmipmappedArray): PFN_cuMipmappedArrayDestroy_v5000 => Array(h as u64);
}

// ---- stream-ordered pools (see streampool) ---------------------------------------------------

/// Hooked `cuMemPoolCreate`: the pool is counted on the device its properties name (a
/// host-located pool, new in CUDA 13.0, on the current device: stricter than needed).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult {
    guard(|| {
        let create = real!(cuMemPoolCreate: PFN_cuMemPoolCreate_v11020);
        // Read once, the driver given the copy: the pool is counted on the GPU it is made on.
        // SAFETY: null or the caller's properties per the API contract.
        let own: Option<CUmemPoolProps> = (!props.is_null()).then(|| unsafe { *props });
        let props = own.as_ref().map_or(props, |p| p as *const CUmemPoolProps);
        // SAFETY: the caller's out-pointer, its properties as read above.
        let rc = unsafe { create(pool, props) };
        if rc == CUresult::CUDA_SUCCESS {
            let st = state();
            let on = own.map(|p| p.location).filter(|l| l.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE);
            let ord = on.map_or_else(|| st.current_ordinal(), |l| usize::try_from(l.id).unwrap_or(usize::MAX));
            crate::streampool::created(st, out!(pool), ord);
        }
        rc
    })
}

/// Hooked `cuMemPoolDestroy`: the pool's count settled (kept while its allocations live).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let destroy = real!(cuMemPoolDestroy: PFN_cuMemPoolDestroy_v11020);
        // SAFETY: forwarding the caller's argument.
        crate::streampool::destroying(state(), pool, || unsafe { destroy(pool) })
    })
}

forward_then! {
    /// Hooked `cuMemPoolTrimTo`: the pools' count settled to what the driver still reserves.
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize): PFN_cuMemPoolTrimTo_v11020 => crate::streampool::trimmed(state(), pool);
}

// ---- VMM mappings ----------------------------------------------------------------------------
// The driver frees a cuMemCreate allocation when its handle is released AND no mapping holds it
// (NVIDIA's own idiom releases the handle right after cuMemMap): its bytes stay counted until
// the last of the two. A mapping of a handle the shim did not create (an import) is counted
// for its size while mapped (`map_import`).

/// Hooked `cuMemRelease`: the handle's bytes go back now, or at its last `cuMemUnmap`.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard(|| {
        let release = real!(cuMemRelease: PFN_cuMemRelease_v10020);
        // Marked before the driver releases: once it has, it may give the same handle value to
        // another thread's cuMemCreate, whose record must not be taken for this one.
        let marked = state().vmm_release_begin(handle);
        // SAFETY: forwarding the caller's argument.
        let rc = unsafe { release(handle) };
        if let Some((q, mark)) = marked {
            q.vmm_release_end(handle, rc == CUresult::CUDA_SUCCESS, mark);
        }
        rc
    })
}

/// Hooked `cuMemExportToShareableHandle`: an exported handle's bytes stay counted after its
/// release until the process exits. The driver keeps the memory while the shareable handle
/// (cuda.h: "Once all shareable handles are closed and the allocation is released, the
/// allocated memory referenced will be released") or an import of it lives, in this process or
/// in another one the fd was passed to, none of which the shim sees.
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: CUmemAllocationHandleType, flags: u64) -> CUresult {
    guard(|| {
        let export = real!(cuMemExportToShareableHandle: PFN_cuMemExportToShareableHandle_v10020);
        let marked = state().vmm_export_begin(handle);
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { export(shareable, handle, handle_type, flags) };
        if rc != CUresult::CUDA_SUCCESS {
            if let Some((q, false)) = marked {
                q.vmm_export_undo(handle);
            }
        }
        rc
    })
}

/// Unmaps and retains of VMM handles, one at a time (neither is a hot path): a retain the
/// driver grants holds memory only while its address is mapped, so with an unmap between the
/// driver's answer and the shim's count, the handle's bytes could be given back (released,
/// unmapped, no retain seen) while the retained handle keeps the memory.
pub static VMM_UNMAP_RETAIN: crate::spin::SpinLock = crate::spin::SpinLock::new();

/// Hooked `cuMemRetainAllocationHandle`: the handle's bytes stay counted until this reference
/// is released too (cuda.h: "The returned handle must be released with corresponding number of
/// calls to cuMemRelease").
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult {
    guard(|| {
        let retain = real!(cuMemRetainAllocationHandle: PFN_cuMemRetainAllocationHandle_v11000);
        let st = state();
        let _one = VMM_UNMAP_RETAIN.lock();
        // Counted before the driver answers: a release on another thread meanwhile must not
        // give the bytes back (the driver's reference may already exist).
        let pre = st.vmm_handle_at(addr as u64).filter(|&(q, h)| q.vmm_retain(h));
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { retain(handle, addr) };
        let got = (rc == CUresult::CUDA_SUCCESS && !handle.is_null()).then(|| out!(handle));
        match (pre, got) {
            (Some((_, h)), Some(g)) if g == h => {}
            (pre, got) => {
                // Refused, or (never seen) another handle than the mapping's record: the guess
                // is taken back and the driver's answer counted where it is known.
                if let Some((q, h)) = pre {
                    q.vmm_retain_undo(h);
                }
                if let Some(g) = got {
                    st.quotas().any(|q| q.vmm_retain(g));
                }
            }
        }
        rc
    })
}

/// Hooked `cuMemMap`: the mapping keeps its handle's bytes counted until it is unmapped.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult {
    guard(|| {
        let (map, unmap) = (real!(cuMemMap: PFN_cuMemMap_v10020), real!(cuMemUnmap: PFN_cuMemUnmap_v10020));
        // Counted before the driver maps, so that a release on another thread meanwhile keeps
        // the bytes counted.
        let Some(q) = state().vmm_map_begin(handle) else {
            return map_import(ptr, size, offset, handle, flags);
        };
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { map(ptr, size, offset, handle, flags) };
        if rc != CUresult::CUDA_SUCCESS {
            q.vmm_unmapped(handle);
            return rc;
        }
        if q.vmm_mapped(ptr, size as u64, handle) {
            return rc;
        }
        undo_untracked_map(unmap, ptr, size, handle, || {
            q.vmm_unmapped(handle);
        })
    })
}

/// A mapping the driver made that the shim has no room to record: undone (and `give_back`
/// run), `CUDA_ERROR_OUT_OF_MEMORY` either way. If the undo fails it stays mapped and its bytes
/// stay counted for the process's life (the mapping is in no table, so no unmap will find it).
fn undo_untracked_map(
    unmap: PFN_cuMemUnmap_v10020,
    ptr: CUdeviceptr,
    size: usize,
    handle: CUmemGenericAllocationHandle,
    give_back: impl FnOnce(),
) -> CUresult {
    crate::state::logged(|| tracing::error!(ptr, size, handle, "xcuda: VMM mapping table full; undoing the mapping"));
    let _one = VMM_UNMAP_RETAIN.lock();
    // SAFETY: undoing the mapping the driver has just made for us.
    let undone = unsafe { unmap(ptr, size) };
    if undone == CUresult::CUDA_SUCCESS {
        give_back();
    } else {
        crate::state::logged(|| tracing::error!(ptr, size, handle, rc = undone.0, "xcuda: undoing a mapping failed; its bytes stay counted until exit"));
    }
    CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// `cuMemMap` of a handle the shim did not create: imported (`cuMemImportFromShareableHandle`,
/// perhaps from another process, which may have released its own handle: the driver keeps
/// the memory for the import) or otherwise unknown. Its size is counted while mapped, on the
/// GPU the memory lives on (`cuMemGetAllocationPropertiesFromHandle`; a device this process
/// cannot see has no quota: refused), given back at its `cuMemUnmap`. Over the quota:
/// `CUDA_ERROR_OUT_OF_MEMORY`, nothing mapped. An exporter and an importer of one group
/// count the same memory twice (README, limits).
fn map_import(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult {
    let (map, unmap) = (real!(cuMemMap: PFN_cuMemMap_v10020), real!(cuMemUnmap: PFN_cuMemUnmap_v10020));
    let props = real!(cuMemGetAllocationPropertiesFromHandle: PFN_cuMemGetAllocationPropertiesFromHandle_v10020);
    let st = state();
    // SAFETY: all-zero is a valid CUmemAllocationProp (integers, a null pointer).
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: a local out-parameter and the caller's handle.
    let known = unsafe { props(&mut prop, handle) } == CUresult::CUDA_SUCCESS;
    // Unknown location (the driver will refuse such a handle anyway) or on the host: counted on
    // the current GPU (stricter than needed, as host-located cuMemCreate memory is).
    let gpu = if known && prop.location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE { st.gpu(prop.location.id) } else { st.current() };
    let q = &gpu.quota;
    let bytes = size as u64;
    // SAFETY: forwarding the caller's arguments.
    let rc = crate::memory::reserved(q, bytes, || unsafe { map(ptr, size, offset, handle, flags) });
    if rc != CUresult::CUDA_SUCCESS {
        if rc == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            crate::state::logged(|| tracing::warn!(ptr, size, handle, "xcuda: mapping of an imported VMM handle refused: over the quota"));
        }
        return rc;
    }
    if q.track(Kind::VmmImportMap, ptr, bytes) {
        return rc;
    }
    undo_untracked_map(unmap, ptr, size, handle, || {
        q.release(bytes);
    })
}

/// Hooked `cuMemUnmap`: each handle whose last mapping this was, and which is released, gives
/// its bytes back.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let unmap = real!(cuMemUnmap: PFN_cuMemUnmap_v10020);
        let st = state();
        let _one = VMM_UNMAP_RETAIN.lock();
        // Taken out before the driver unmaps: once it has, another thread may map the range
        // again, and its record must not be mistaken for ours.
        let (taken, imports) = st.unmap_take(ptr, size as u64);
        // SAFETY: forwarding the caller's arguments.
        let rc = unsafe { unmap(ptr, size) };
        for (q, at, bytes) in imports {
            if rc == CUresult::CUDA_SUCCESS {
                q.release(bytes);
            } else {
                q.put_back(Kind::VmmImportMap, at, bytes, 0);
            }
        }
        for (q, at, len, h) in taken {
            if rc == CUresult::CUDA_SUCCESS {
                q.vmm_unmapped(h);
            } else {
                q.vmm_unmap_undo(at, len, h);
            }
        }
        rc
    })
}

// ---- memory view -----------------------------------------------------------------------------

macro_rules! mem_info {
    ($name:ident, $pfn:ty, $int:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: free and total as the quota allows (see `memory::view`).")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(free: *mut $int, total: *mut $int) -> CUresult {
            guard(|| {
                let (mut f, mut t): ($int, $int) = (0, 0);
                let real_fn = real!($name: $pfn);
                // SAFETY: local out-parameters.
                let rc = unsafe { real_fn(&mut f, &mut t) };
                if rc != CUresult::CUDA_SUCCESS {
                    return rc;
                }
                let (vf, vt) = view(&state().current().quota, f as u64, t as u64);
                if free.is_null() || total.is_null() {
                    return CUresult::CUDA_ERROR_INVALID_VALUE;
                }
                // SAFETY: caller's non-null out-pointers; the values are <= the driver's answers,
                // so they fit its integer type.
                unsafe { (*free, *total) = (vf as $int, vt as $int) };
                rc
            })
        }
    };
}
mem_info!(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020, usize);
mem_info!(cuMemGetInfo, PFN_cuMemGetInfo_v2000, c_uint);

/// After the driver wrote a device's total memory to `bytes` (its integer type): capped at the
/// quota of device `dev`.
macro_rules! cap_total {
    ($bytes:ident, $dev:ident) => {{
        let limit = state().gpu($dev).quota.limit();
        // SAFETY: the driver returned success, so it wrote through this pointer.
        unsafe { *$bytes = (*$bytes as u64).min(limit) as _ };
    }};
}

forward_then! {
    /// Hooked `cuDeviceTotalMem_v2`: the device's memory capped at the quota.
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice): PFN_cuDeviceTotalMem_v3020 => cap_total!(bytes, dev);
    /// Hooked `cuDeviceTotalMem` (32-bit ABI): like `cuDeviceTotalMem_v2`.
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice): PFN_cuDeviceTotalMem_v2000 => cap_total!(bytes, dev);
}

/// The GPU (quota) an NVML device handle is, matched by UUID: NVML numbers devices its own way
/// (every GPU of the host, or of the container), never by `CUDA_VISIBLE_DEVICES`. A device this
/// process cannot use through CUDA is answered as it is. One GPU whose UUID (NVML's or the
/// driver's) is unknown: that GPU, as before. Before the process's first CUDA call: none (NVML
/// answers as it is). Building the shim's state initialises CUDA (`cuInit`), which an
/// NVML-only query must not do: a child the process forks afterwards could not use CUDA
/// (`CUDA_ERROR_NOT_INITIALIZED`), and under MPS the query would connect to the server. The
/// view is what the application sees; the quota holds at its allocations either way.
fn gpu_of_nvml(device: nvml_wrapper_sys::bindings::nvmlDevice_t) -> Option<&'static crate::state::Gpu> {
    let st = crate::state::get()?;
    let only = (st.gpus.len() == 1).then(|| &st.gpus[0]);
    // SAFETY: `device` is the handle the application passed to this NVML call; the real NVML
    // receives it just as the application's call would have.
    match unsafe { crate::nvml::uuid_of(device) } {
        Some(u) => st.gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(&u)).or(only.filter(|g| g.uuid.is_empty())),
        None => only,
    }
}

macro_rules! nvml_memory_info {
    ($name:ident, $real:ident, $mem:ty) => {
        #[doc = concat!("Hooked NVML `", stringify!($name), "`: the quota-shaped memory view.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(device: nvml_wrapper_sys::bindings::nvmlDevice_t, memory: *mut $mem) -> nvml_wrapper_sys::bindings::nvmlReturn_t {
            use crate::nvml::*;
            catch_unwind(|| {
                let Some(real) = $real() else { return NVML_ERROR_FUNCTION_NOT_FOUND };
                // SAFETY: forwarding the caller's arguments.
                let rc = unsafe { real(device, memory) };
                if rc == NVML_SUCCESS && !memory.is_null() {
                    // SAFETY: the real call succeeded and filled this non-null struct.
                    let m = unsafe { &mut *memory };
                    if let Some(g) = gpu_of_nvml(device) {
                        apply(&g.quota, &mut m.total, &mut m.free, &mut m.used);
                    }
                }
                rc
            })
            .unwrap_or(NVML_ERROR_UNKNOWN)
        }
    };
}
nvml_memory_info!(nvmlDeviceGetMemoryInfo, real_v1, nvml_wrapper_sys::bindings::nvmlMemory_t);
nvml_memory_info!(nvmlDeviceGetMemoryInfo_v2, real_v2, nvml_wrapper_sys::bindings::nvmlMemory_v2_t);

// ---- synchronizing calls ---------------------------------------------------------------------
// Counted on the GPU they wait for (`crate::state::Syncs`): a client whose thread has waited for
// long with nothing returning while the GPU is idle is hung, one that calls nothing is idle.

/// Runs the synchronizing call `call`, counted on GPU `ord` (uncounted when the GPU is not
/// known, and before the shim's state exists: no context then, nothing to wait for). Never on
/// a guessed GPU: a wait counted on an idle GPU's ledger would look like a hang there.
fn synced(ord: impl FnOnce(&crate::state::State) -> Option<usize>, call: impl FnOnce() -> CUresult) -> CUresult {
    match crate::state::get().and_then(|st| Some(st.gpu(CUdevice::try_from(ord(st)?).ok()?))) {
        Some(g) => g.syncs.around(call),
        None => call(),
    }
}

/// Hooked `cuCtxSynchronize`: waits for the current context's work, counted on its GPU.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        let f = real!(cuCtxSynchronize: PFN_cuCtxSynchronize_v2000);
        // SAFETY: the real function, which takes no arguments.
        synced(|st| st.known_current_ordinal(), || unsafe { f() })
    })
}

/// Hooked `cuCtxSynchronize_v2` (CUDA 13.0): waits for `ctx`'s work, counted on its GPU.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    guard(|| {
        let f = real!(cuCtxSynchronize_v2: PFN_cuCtxSynchronize_v13000);
        // SAFETY: forwarding the caller's argument.
        synced(|st| st.ctx_ordinal(ctx), || unsafe { f(ctx) })
    })
}

/// The GPU a stream synchronize waits for: the stream's (none when the driver cannot say; the
/// call itself is never refused for it).
fn stream_gpu(st: &crate::state::State, stream: CUstream) -> Option<usize> {
    if stream as u64 <= 2 {
        return st.known_current_ordinal();
    }
    st.stream_ordinal(stream as u64).ok()
}

/// Hooked `cuStreamSynchronize`: counted on the stream's GPU.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    guard(|| {
        let f = real!(cuStreamSynchronize: PFN_cuStreamSynchronize_v2000);
        // SAFETY: forwarding the caller's argument.
        synced(|st| stream_gpu(st, stream), || unsafe { f(stream) })
    })
}

/// Hooked `cuStreamSynchronize_ptsz`: counted on the stream's GPU.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult {
    guard(|| {
        let f = real!(cuStreamSynchronize_ptsz: PFN_cuStreamSynchronize_v7000_ptsz);
        // SAFETY: forwarding the caller's argument.
        synced(|st| stream_gpu(st, stream), || unsafe { f(stream) })
    })
}

/// Hooked `cuEventSynchronize`: counted on the current context's GPU (an event does not name
/// its device; it is almost always recorded there), uncounted without a current context.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    guard(|| {
        let f = real!(cuEventSynchronize: PFN_cuEventSynchronize_v2000);
        // SAFETY: forwarding the caller's argument.
        synced(|st| st.known_current_ordinal(), || unsafe { f(event) })
    })
}

// ---- stream captures (see capture) ----------------------------------------------------------

macro_rules! begin_capture {
    ($name:ident, $pfn:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: the capture counted as in progress (see `capture`), after any synchronisation of the exit path now running.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(stream: CUstream, mode: CUstreamCaptureMode) -> CUresult {
            guard(|| {
                let f = real!($name: $pfn);
                let limit = std::time::Duration::from_millis(crate::state::config().exit.release_timeout_ms);
                // SAFETY: forwarding the caller's arguments.
                let ptsz = stringify!($name).ends_with("_ptsz");
                crate::capture::begin(limit, mode.0, stream as u64, ptsz, || unsafe { f(stream, mode) })
            })
        }
    };
}
begin_capture!(cuStreamBeginCapture_v2, PFN_cuStreamBeginCapture_v10010);
begin_capture!(cuStreamBeginCapture_v2_ptsz, PFN_cuStreamBeginCapture_v10010_ptsz);

macro_rules! begin_capture_legacy {
    ($name:ident, $pfn:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "` (the CUDA 10.0 ABI, no mode: a capture in global mode, cuda.h's default): counted as `cuStreamBeginCapture_v2` is (see `capture`).")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(stream: CUstream) -> CUresult {
            guard(|| {
                let f = real!($name: $pfn);
                let limit = std::time::Duration::from_millis(crate::state::config().exit.release_timeout_ms);
                let global = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL.0;
                // SAFETY: forwarding the caller's argument.
                let ptsz = stringify!($name).ends_with("_ptsz");
                crate::capture::begin(limit, global, stream as u64, ptsz, || unsafe { f(stream) })
            })
        }
    };
}
begin_capture_legacy!(cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10000);
begin_capture_legacy!(cuStreamBeginCapture_ptsz, PFN_cuStreamBeginCapture_v10000_ptsz);

macro_rules! begin_capture_to_graph {
    ($name:ident, $pfn:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "` (CUDA 12.3): counted as `cuStreamBeginCapture_v2` is (see `capture`).")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, edges: *const CUgraphEdgeData, n: usize, mode: CUstreamCaptureMode,
        ) -> CUresult {
            guard(|| {
                let f = real!($name: $pfn);
                let limit = std::time::Duration::from_millis(crate::state::config().exit.release_timeout_ms);
                // SAFETY: forwarding the caller's arguments.
                let ptsz = stringify!($name).ends_with("_ptsz");
                crate::capture::begin(limit, mode.0, stream as u64, ptsz, || unsafe {
                    f(stream, graph, deps, edges, n, mode)
                })
            })
        }
    };
}
begin_capture_to_graph!(cuStreamBeginCaptureToGraph, PFN_cuStreamBeginCaptureToGraph_v12030);
begin_capture_to_graph!(cuStreamBeginCaptureToGraph_ptsz, PFN_cuStreamBeginCaptureToGraph_v12030_ptsz);

macro_rules! end_capture {
    ($name:ident, $pfn:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: a capture it ends is no longer counted (see `capture`).")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(stream: CUstream, graph: *mut CUgraph) -> CUresult {
            guard(|| {
                let f = real!($name: $pfn);
                // SAFETY: forwarding the caller's arguments.
                let ptsz = stringify!($name).ends_with("_ptsz");
                crate::capture::end(stream as u64, ptsz, || unsafe { f(stream, graph) })
            })
        }
    };
}
end_capture!(cuStreamEndCapture, PFN_cuStreamEndCapture_v10000);
end_capture!(cuStreamEndCapture_ptsz, PFN_cuStreamEndCapture_v10000_ptsz);

// ---- launches --------------------------------------------------------------------------------

#[inline(always)]
fn blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x) * u64::from(y) * u64::from(z)
}

/// `cuLaunchKernel` and `cuLaunchCooperativeKernel` (which has no `extra`).
macro_rules! launch_kernel {
    ($name:ident, $pfn:ty $(, $extra:ident)?) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: takes the kernel's cost from the launch throttle first.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
            shared: c_uint, stream: CUstream, params: *mut *mut c_void $(, $extra: *mut *mut c_void)?
        ) -> CUresult {
            guard(|| {
                let launch = real!($name: $pfn);
                let t = &state().current().throttle;
                t.acquire_on(t.kernel_cost(blocks(gx, gy, gz)), stream, stringify!($name).ends_with("_ptsz"));
                // SAFETY: forwarding the caller's arguments.
                unsafe { launch(f, gx, gy, gz, bx, by, bz, shared, stream, params $(, $extra)?) }
            })
        }
    };
}
launch_kernel!(cuLaunchKernel, PFN_cuLaunchKernel_v4000, extra);
launch_kernel!(cuLaunchKernel_ptsz, PFN_cuLaunchKernel_v7000_ptsz, extra);
launch_kernel!(cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000);
launch_kernel!(cuLaunchCooperativeKernel_ptsz, PFN_cuLaunchCooperativeKernel_v9000_ptsz);

macro_rules! launch_ex {
    ($name:ident, $pfn:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: takes the kernel's cost from the launch throttle first.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult {
            guard(|| {
                let launch = real!($name: $pfn);
                if config.is_null() {
                    // SAFETY: the driver refuses the null config itself.
                    return unsafe { launch(config, f, params, extra) };
                }
                // SAFETY: non-null config supplied by the caller per the API contract. The
                // driver gets this copy: the grid it launches is the grid priced.
                let c: CUlaunchConfig = unsafe { *config };
                let t = &state().current().throttle;
                t.acquire_on(t.kernel_cost(blocks(c.gridDimX, c.gridDimY, c.gridDimZ)), c.hStream, stringify!($name).ends_with("_ptsz"));
                // SAFETY: the caller's arguments, its config as read above.
                unsafe { launch(&c, f, params, extra) }
            })
        }
    };
}
launch_ex!(cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060);
launch_ex!(cuLaunchKernelEx_ptsz, PFN_cuLaunchKernelEx_v11060_ptsz);

/// Blocks of a `grid_width` x `grid_height` grid of the CUDA 2.0 API (`int`s: a negative one,
/// which the driver refuses, costs the minimum).
#[inline(always)]
fn grid_blocks(width: c_int, height: c_int) -> u64 {
    u64::try_from(width).unwrap_or(0).saturating_mul(u64::try_from(height).unwrap_or(0))
}

/// Hooked `cuLaunch` (CUDA 2.0 execution control, deprecated but exported): a 1 x 1 grid, its
/// one block taken from the launch throttle first.
#[no_mangle]
pub unsafe extern "C" fn cuLaunch(f: CUfunction) -> CUresult {
    guard(|| {
        let launch = real!(cuLaunch: PFN_cuLaunch_v2000);
        let t = &state().current().throttle;
        t.acquire(t.kernel_cost(1));
        // SAFETY: forwarding the caller's argument.
        unsafe { launch(f) }
    })
}

/// Hooked `cuLaunchGrid` (CUDA 2.0): `grid_width * grid_height` blocks taken from the throttle first.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchGrid(f: CUfunction, grid_width: c_int, grid_height: c_int) -> CUresult {
    guard(|| {
        let launch = real!(cuLaunchGrid: PFN_cuLaunchGrid_v2000);
        let t = &state().current().throttle;
        t.acquire(t.kernel_cost(grid_blocks(grid_width, grid_height)));
        // SAFETY: forwarding the caller's arguments.
        unsafe { launch(f, grid_width, grid_height) }
    })
}

/// Hooked `cuLaunchGridAsync` (CUDA 2.0): costed like `cuLaunchGrid`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchGridAsync(f: CUfunction, grid_width: c_int, grid_height: c_int, stream: CUstream) -> CUresult {
    guard(|| {
        let launch = real!(cuLaunchGridAsync: PFN_cuLaunchGridAsync_v2000);
        let t = &state().current().throttle;
        t.acquire(t.kernel_cost(grid_blocks(grid_width, grid_height)));
        // SAFETY: forwarding the caller's arguments.
        unsafe { launch(f, grid_width, grid_height, stream) }
    })
}

/// Hooked `cuLaunchCooperativeKernelMultiDevice` (CUDA 9.0, deprecated but exported): each
/// entry's grid taken from the throttle of its stream's GPU (the current one when the driver
/// cannot name it; it then refuses the launch anyway) before the driver launches any. At most
/// one entry per visible GPU is read: the driver refuses more ("no two kernels can be launched
/// on the same device").
#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS_v1, n: c_uint, flags: c_uint) -> CUresult {
    guard(|| {
        let launch = real!(cuLaunchCooperativeKernelMultiDevice: PFN_cuLaunchCooperativeKernelMultiDevice_v9000);
        if list.is_null() {
            // SAFETY: the driver refuses the null list itself.
            return unsafe { launch(list, n, flags) };
        }
        let st = state();
        let read = (n as usize).min(st.gpus.len().max(1)).min(crate::exit::MAX_DEVICES);
        // Copied onto the stack (no allocation on a launch), and the driver given the copy:
        // the grids it launches are the grids priced.
        // SAFETY: all-zero is a valid CUDA_LAUNCH_PARAMS_v1 (integers and null pointers).
        let mut copy: [CUDA_LAUNCH_PARAMS_v1; crate::exit::MAX_DEVICES] = unsafe { std::mem::zeroed() };
        // SAFETY: the caller's array of `n` >= `read` entries (the driver reads them too).
        copy[..read].copy_from_slice(unsafe { std::slice::from_raw_parts(list, read) });
        let entries = &mut copy[..read];
        for e in entries.iter() {
            let ord = st.stream_ordinal(e.hStream as u64).unwrap_or_else(|_| st.current_ordinal());
            let t = &st.gpu(CUdevice::try_from(ord).unwrap_or(CUdevice::MAX)).throttle;
            t.acquire(t.kernel_cost(blocks(e.gridDimX, e.gridDimY, e.gridDimZ)));
        }
        if read < n as usize {
            // More devices than this process has: the driver refuses the list.
            // SAFETY: forwarding the caller's arguments.
            return unsafe { launch(list, n, flags) };
        }
        // SAFETY: the caller's count and flags, its entries as read above.
        unsafe { launch(entries.as_mut_ptr(), n, flags) }
    })
}

macro_rules! launch_graph {
    ($name:ident, $pfn:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: graph memory reserved (or refused) and the exec's price (see `graphcost`) taken from the throttle first.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(exec: CUgraphExec, stream: CUstream) -> CUresult {
            guard(|| {
                let launch = real!($name: $pfn);
                let st = state();
                // Graph memory is mapped at launch: counted (or refused) first.
                crate::graphmem::mapping(st, exec as u64, || {
                    let t = &st.current().throttle;
                    t.acquire_on(st.graph_cost.launch_cost(exec as u64, t), stream, stringify!($name).ends_with("_ptsz"));
                    // SAFETY: forwarding the caller's arguments.
                    unsafe { launch(exec, stream) }
                })
            })
        }
    };
}

// ---- graph memory nodes (see graphmem) -------------------------------------------------------

/// After a successful instantiation: the exec (`*exec`) inherits `graph`'s memory-node bytes,
/// counted (or refused) when it is launched or uploaded, and is priced by `graph`'s kernel
/// nodes (see `graphcost`). With no room to record either (its launches would go unreserved,
/// or pay the flat graph cost whatever they run) the exec is destroyed and the call fails with
/// `CUDA_ERROR_OUT_OF_MEMORY` (fail closed).
fn instantiated(graph: CUgraph, exec: *mut CUgraphExec) -> CUresult {
    let st = state();
    let e: CUgraphExec = out!(exec);
    let devices = st.gpus.len();
    // A handle the driver just freed in another thread's cuGraphExecDestroy: that thread holds
    // the handle's lock until it has forgotten the old exec's records, so they go before these
    // are made, never after.
    let _held = st.graph_cost.changing(e as u64);
    if st.graph_mem.instantiated(graph as u64, e as u64, devices) {
        if st.graph_cost.instantiated(e as u64, graph as u64, &crate::graphcost::Driver) {
            return CUresult::CUDA_SUCCESS;
        }
        st.graph_mem.exec_destroyed(e as u64, devices);
    }
    let destroy = real!(cuGraphExecDestroy: PFN_cuGraphExecDestroy_v10000);
    // SAFETY: the exec this call created, never handed out; `exec` is the caller's out-pointer
    // the driver just wrote through.
    unsafe {
        destroy(e);
        *exec = std::ptr::null_mut();
    }
    CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

forward_then! {
    /// Hooked `cuGraphInstantiateWithFlags` (also `cuGraphInstantiate` from CUDA 12.0 on): the
    /// exec inherits its graph's memory-node bytes.
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64): PFN_cuGraphInstantiateWithFlags_v11040 => instantiated(graph, exec);
    /// Hooked `cuGraphInstantiate` (CUDA 10.0's 5-argument ABI): counted like `cuGraphInstantiateWithFlags`.
    fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, size: usize): PFN_cuGraphInstantiate_v10000 => instantiated(graph, exec);
    /// Hooked `cuGraphInstantiate_v2` (CUDA 11.0, the same 5 arguments): counted like `cuGraphInstantiateWithFlags`.
    fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, size: usize): PFN_cuGraphInstantiate_v11000 => instantiated(graph, exec);
}

// ---- graph exec changes (see graphcost: the exec's price follows what its launches run) ------

/// The lock a change of `exec` holds across its driver call and its record ([`crate::graphcost::GraphCost::changing`]).
fn changing(exec: CUgraphExec) -> crate::spin::SpinGuard<'static> {
    state().graph_cost.changing(exec as u64)
}

/// Fault injection (`memory.test_graph_change_pause_ms`): the process's first exec change
/// pauses between the driver's answer and its record.
fn change_recorded_after_pause() {
    static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let ms = crate::state::config().memory.test_graph_change_pause_ms;
    if ms > 0 && !PAUSED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// `exec` was updated from `graph`: priced again from it.
fn repriced(exec: CUgraphExec, graph: CUgraph) {
    change_recorded_after_pause();
    state().graph_cost.updated(exec as u64, graph as u64, &crate::graphcost::Driver);
}

/// Kernel node `node` of `exec` runs a grid of `x` x `y` x `z` blocks from now on.
fn kernel_set(exec: CUgraphExec, node: CUgraphNode, (x, y, z): (c_uint, c_uint, c_uint)) {
    change_recorded_after_pause();
    state().graph_cost.node_set(exec as u64, node as u64, crate::graphcost::Price::kernel(crate::graphcost::grid_blocks(x, y, z)));
}

/// Child graph node `node` of `exec` runs `child`'s work from now on.
fn child_set(exec: CUgraphExec, node: CUgraphNode, child: CUgraph) {
    change_recorded_after_pause();
    let p = crate::graphcost::walk(&crate::graphcost::Driver, child as u64, &mut |_, _| {});
    state().graph_cost.node_set(exec as u64, node as u64, p);
}

forward_then! {
    /// Hooked `cuGraphExecUpdate_v2` (CUDA 12.0): the exec is priced again from its new graph.
    fn cuGraphExecUpdate_v2(exec: CUgraphExec, graph: CUgraph, info: *mut CUgraphExecUpdateResultInfo): PFN_cuGraphExecUpdate_v12000, under changing(exec) => repriced(exec, graph);
    /// Hooked `cuGraphExecUpdate` (CUDA 10.2 ABI): like `cuGraphExecUpdate_v2`.
    fn cuGraphExecUpdate(exec: CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, result: *mut CUgraphExecUpdateResult): PFN_cuGraphExecUpdate_v10020, under changing(exec) => repriced(exec, graph);
    /// Hooked `cuGraphExecChildGraphNodeSetParams`: the new child graph's blocks replace the node's old ones in the exec's price.
    fn cuGraphExecChildGraphNodeSetParams(exec: CUgraphExec, node: CUgraphNode, child: CUgraph): PFN_cuGraphExecChildGraphNodeSetParams_v11010, under changing(exec)
        => child_set(exec, node, child);
}

/// An exec's kernel node given new parameters: the caller's read once, the driver given that
/// copy, and on success its grid replaces the node's old one in the exec's price (the grid the
/// driver runs is the grid priced: a thread shrinking the caller's struct after the driver's
/// answer would otherwise price every later replay small).
macro_rules! exec_kernel_set {
    ($(
        $(#[$doc:meta])*
        fn $name:ident(params: *const $ty:ty) : $pfn:ty;
    )*) => {
        $(
            $(#[$doc])*
            #[no_mangle]
            pub unsafe extern "C" fn $name(exec: CUgraphExec, node: CUgraphNode, params: *const $ty) -> CUresult {
                guard(|| {
                    let set = real!($name: $pfn);
                    let _held = changing(exec);
                    if params.is_null() {
                        // SAFETY: the driver refuses null parameters itself.
                        return unsafe { set(exec, node, params) };
                    }
                    // SAFETY: non-null, the caller's parameters per the API contract.
                    let p: $ty = unsafe { *params };
                    // SAFETY: the caller's exec and node, its parameters as read above.
                    let rc = unsafe { set(exec, node, &p) };
                    if rc == CUresult::CUDA_SUCCESS {
                        kernel_set(exec, node, (p.gridDimX, p.gridDimY, p.gridDimZ));
                    }
                    rc
                })
            }
        )*
    };
}

exec_kernel_set! {
    /// Hooked `cuGraphExecKernelNodeSetParams` (CUDA 10.1 ABI): the node's new grid replaces its old one in the exec's price.
    fn cuGraphExecKernelNodeSetParams(params: *const CUDA_KERNEL_NODE_PARAMS_v1): PFN_cuGraphExecKernelNodeSetParams_v10010;
    /// Hooked `cuGraphExecKernelNodeSetParams_v2` (CUDA 12.0): like `cuGraphExecKernelNodeSetParams`.
    fn cuGraphExecKernelNodeSetParams_v2(params: *const CUDA_KERNEL_NODE_PARAMS_v2): PFN_cuGraphExecKernelNodeSetParams_v12000;
}

/// Hooked `cuGraphExecNodeSetParams` (CUDA 12.2): a kernel or child graph node's new work
/// replaces its old in the exec's price; other node types run no kernel (a conditional node's
/// parameters cannot change: cuda.h). The caller's parameters are read once and the driver
/// given that copy (see `exec_kernel_set!`); the function has no out-fields.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *mut CUgraphNodeParams) -> CUresult {
    guard(|| {
        let set = real!(cuGraphExecNodeSetParams: PFN_cuGraphExecNodeSetParams_v12020);
        let _held = changing(exec);
        if params.is_null() {
            // SAFETY: the driver refuses null parameters itself.
            return unsafe { set(exec, node, params) };
        }
        // SAFETY: non-null, the caller's parameter block per the API contract.
        let mut p: CUgraphNodeParams = unsafe { *params };
        // SAFETY: the caller's exec and node, its parameters as read above.
        let rc = unsafe { set(exec, node, &mut p) };
        if rc == CUresult::CUDA_SUCCESS {
            if p.type_ == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                // SAFETY: the tag says `kernel`.
                let k = unsafe { p.u.kernel };
                kernel_set(exec, node, (k.gridDimX, k.gridDimY, k.gridDimZ));
            } else if p.type_ == CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH {
                // SAFETY: the tag says `graph`.
                child_set(exec, node, unsafe { p.u.graph.graph });
            }
        }
        rc
    })
}

/// Hooked `cuGraphAddMemAllocNode`: the node's bytes recorded for the graph (counted at
/// launch) before the driver adds it; with no room to record them, refused with
/// `CUDA_ERROR_OUT_OF_MEMORY` and never added (its launches would go unreserved).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    guard(|| {
        let add = real!(cuGraphAddMemAllocNode: PFN_cuGraphAddMemAllocNode_v11040);
        if params.is_null() {
            // SAFETY: the driver refuses null parameters itself.
            return unsafe { add(node, graph, deps, ndeps, params) };
        }
        // One read of the caller's parameters; the driver gets that copy (the size recorded is
        // the size added) and its answer (the address) goes back to the caller.
        // SAFETY: non-null, the caller's parameter block per the API contract.
        let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { *params };
        let sized = alloc_node_size(&p);
        // SAFETY: the caller's arguments, its parameters as read above.
        let rc = mem_node_added(graph, sized, || unsafe { add(node, graph, deps, ndeps, &mut p) });
        if rc == CUresult::CUDA_SUCCESS {
            // SAFETY: as above; the driver's out-field, written back.
            unsafe { (*params).dptr = p.dptr };
        }
        rc
    })
}

/// The device ordinal and bytes of a memory allocation node's parameters (a copy the caller
/// can no longer change, which is what the driver is given).
fn alloc_node_size(p: &CUDA_MEM_ALLOC_NODE_PARAMS) -> Option<(usize, u64)> {
    Some((p.poolProps.location.id.max(0) as usize, p.bytesize as u64))
}

/// A memory allocation node of `sized` (its device ordinal and bytes, from [`alloc_node_size`])
/// added to `graph` by `add` (the real driver's call):
/// its bytes recorded for the graph first; with no room to record them, refused with
/// `CUDA_ERROR_OUT_OF_MEMORY` and never added; forgotten again when the driver refuses it.
fn mem_node_added(graph: CUgraph, sized: Option<(usize, u64)>, add: impl FnOnce() -> CUresult) -> CUresult {
    let gm = &state().graph_mem;
    if let Some((ord, bytes)) = sized {
        if !gm.node_added(graph as u64, ord, bytes) {
            return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    let rc = add();
    if let (Some((ord, bytes)), false) = (sized, rc == CUresult::CUDA_SUCCESS) {
        gm.node_not_added(graph as u64, ord, bytes);
    }
    rc
}

/// `cuGraphAddNode[_v2]` (CUDA 12.2/12.3): a `CU_GRAPH_NODE_TYPE_MEM_ALLOC` node is recorded
/// like `cuGraphAddMemAllocNode`'s (`nodeParams->alloc`); a `CU_GRAPH_NODE_TYPE_GRAPH` node
/// that moves its child graph in (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`, the only way a child
/// may hold memory nodes: cuda.h, `CUDA_CHILD_GRAPH_NODE_PARAMS`) brings the child's recorded
/// bytes to the parent ([`crate::graphmem::child_moved`]); every other node passes through.
/// (A memory node's parameters cannot change afterwards: cuda.h, `cuGraphNodeSetParams` /
/// `cuGraphExecNodeSetParams`: "not supported for node types CU_GRAPH_NODE_TYPE_MEM_ALLOC";
/// `cuGraphAddChildGraphNode` clones, and refuses a child with memory nodes.)
///
/// The caller's parameters are read once and the driver is given that copy (`add` gets a
/// pointer to it), its out-fields written back on success: a thread changing the caller's block in
/// between (a kernel node turned into a memory node, a size grown) would otherwise add memory
/// the shim never recorded.
fn generic_node_added(graph: CUgraph, params: *mut CUgraphNodeParams, add: impl FnOnce(*mut CUgraphNodeParams) -> CUresult) -> CUresult {
    if params.is_null() {
        return add(params);
    }
    // SAFETY: non-null, the caller's parameter block per the API contract (a plain C struct).
    let mut p: CUgraphNodeParams = unsafe { *params };
    let own: *mut CUgraphNodeParams = &mut p;
    let rc = if p.type_ == CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
        // SAFETY: the tag says `alloc`.
        let sized = alloc_node_size(unsafe { &p.u.alloc });
        mem_node_added(graph, sized, || add(own))
    } else if p.type_ == CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH {
        // SAFETY: the tag says `graph`.
        let child = unsafe { p.u.graph };
        if child.ownership == CUgraphChildGraphNodeOwnership::CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE && !child.graph.is_null() {
            let st = state();
            crate::graphmem::child_moved(&st.graph_mem, graph as u64, child.graph as u64, st.gpus.len(), || add(own))
        } else {
            add(own)
        }
    } else {
        add(own)
    };
    if rc == CUresult::CUDA_SUCCESS {
        // The driver's answer goes back, and only its out-fields: a memory node's address, a
        // conditional node's body graphs (the driver sets `phGraph_out` in the block). Nothing
        // is stored into other nodes' blocks (a template in read-only memory, or shared by
        // threads, is the caller's to keep as it was).
        if p.type_ == CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            // SAFETY: the caller's block (non-null); the tag says `alloc`.
            unsafe { (*params).u.alloc.dptr = p.u.alloc.dptr };
        } else if p.type_ == CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL {
            // SAFETY: the caller's block (non-null), whose union the driver writes for this type.
            unsafe { (*params).u = p.u };
        }
    }
    rc
}

/// Hooked `cuGraphAddNode` (CUDA 12.2): see `generic_node_added`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut CUgraphNodeParams) -> CUresult {
    guard(|| {
        let add = real!(cuGraphAddNode: PFN_cuGraphAddNode_v12020);
        // SAFETY: the caller's arguments, its parameters as `generic_node_added` read them.
        generic_node_added(graph, params, |p| unsafe { add(node, graph, deps, ndeps, p) })
    })
}

/// Hooked `cuGraphAddNode_v2` (CUDA 12.3, edge data; `cuGraphAddNode` in 13.0): see `generic_node_added`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    ndeps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    guard(|| {
        let add = real!(cuGraphAddNode_v2: PFN_cuGraphAddNode_v12030);
        // SAFETY: the caller's arguments, its parameters as `generic_node_added` read them.
        generic_node_added(graph, params, |p| unsafe { add(node, graph, deps, edges, ndeps, p) })
    })
}

/// Hooked `cuGraphExecDestroy`: forgets the exec's memory-node bytes and its price (the price
/// before the driver frees the handle, which another thread's instantiation may get at once;
/// put back if the driver refuses).
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    guard(|| {
        let destroy = real!(cuGraphExecDestroy: PFN_cuGraphExecDestroy_v10000);
        let st = state();
        // Until the driver has freed the handle and its records are gone: a change of it in
        // flight records first, and an instantiation that gets the handle back records after.
        let _held = st.graph_cost.changing(exec as u64);
        let taken = st.graph_cost.destroying(exec as u64);
        // SAFETY: forwarding the caller's argument.
        let rc = unsafe { destroy(exec) };
        if rc == CUresult::CUDA_SUCCESS {
            st.graph_mem.exec_destroyed(exec as u64, st.gpus.len());
        } else {
            st.graph_cost.not_destroyed(exec as u64, taken);
        }
        rc
    })
}

forward_then! {
    /// Hooked `cuGraphDestroy`: forgets the graph's memory-node bytes.
    fn cuGraphDestroy(graph: CUgraph): PFN_cuGraphDestroy_v10000 => {
        let st = state();
        st.graph_mem.graph_destroyed(graph as u64, st.gpus.len());
    };
    /// Hooked `cuDeviceGraphMemTrim`: the graph pool's count settled to what the driver keeps.
    fn cuDeviceGraphMemTrim(dev: CUdevice): PFN_cuDeviceGraphMemTrim_v11040 => {
        let st = state();
        if usize::try_from(dev).is_ok_and(|d| d < st.gpus.len()) {
            crate::graphmem::settle(st.gpu(dev), dev, 0);
        }
    };
}

/// `cuGraphInstantiateWithParams[_ptsz]`: counted like `cuGraphInstantiateWithFlags`. With
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` the driver would map the exec's graph memory right away,
/// before any launch the quota sees: the shim instantiates without the flag, then uploads into
/// the caller's stream through its counted `cuGraphUpload` (the same order the driver's flag
/// means); a refused upload destroys the new exec and fails the call with
/// `CUDA_ERROR_OUT_OF_MEMORY` (`result_out` = `CUDA_GRAPH_INSTANTIATE_ERROR`, nothing mapped).
macro_rules! instantiate_with_params {
    ($name:ident, $pfn:ty, $upload:ident, $upload_pfn:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: counted like `cuGraphInstantiateWithFlags` (see above).")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult {
            guard(|| {
                let inst = real!($name: $pfn);
                let upload_flag = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.0 as u64;
                if params.is_null() {
                    // SAFETY: the driver refuses null parameters itself.
                    return unsafe { inst(exec, graph, params) };
                }
                // SAFETY: non-null, the caller's parameter block. Read once: the driver gets
                // copies, so flags the caller's block gains in between (UPLOAD, which maps the
                // graph's memory at once) are not acted on unreserved.
                let wants_upload = unsafe { (*params).flags } & upload_flag != 0;
                if !wants_upload {
                    // SAFETY: as above.
                    let caller = unsafe { &mut *params };
                    let mut p = *caller;
                    p.flags &= !upload_flag;
                    // SAFETY: the caller's out-pointer and graph, our copy of its parameters.
                    let rc = unsafe { inst(exec, graph, &mut p) };
                    (caller.hErrNode_out, caller.result_out) = (p.hErrNode_out, p.result_out);
                    if rc != CUresult::CUDA_SUCCESS {
                        return rc;
                    }
                    let rc = instantiated(graph, exec);
                    if rc != CUresult::CUDA_SUCCESS {
                        caller.result_out = CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR;
                    }
                    return rc;
                }
                let upload = real!($upload: $upload_pfn);
                // SAFETY: non-null (checked above), the caller's parameter block.
                let caller = unsafe { &mut *params };
                let mut p = *caller;
                p.flags &= !upload_flag;
                // SAFETY: the caller's out-pointer and graph, our copy of its parameters.
                let rc = unsafe { inst(exec, graph, &mut p) };
                (caller.hErrNode_out, caller.result_out) = (p.hErrNode_out, p.result_out);
                if rc != CUresult::CUDA_SUCCESS {
                    return rc;
                }
                let rc = instantiated(graph, exec);
                if rc != CUresult::CUDA_SUCCESS {
                    caller.hErrNode_out = std::ptr::null_mut();
                    caller.result_out = CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR;
                    return rc;
                }
                let (st, e): (_, CUgraphExec) = (state(), out!(exec));
                // SAFETY: the exec just instantiated and the caller's upload stream.
                let rc = unsafe { counted_upload(st, e, p.hUploadStream, upload) };
                if rc != CUresult::CUDA_SUCCESS {
                    let destroy = real!(cuGraphExecDestroy: PFN_cuGraphExecDestroy_v10000);
                    let _ = st.graph_cost.destroying(e as u64);
                    // SAFETY: the exec this call created, never handed out.
                    unsafe { destroy(e) };
                    st.graph_mem.exec_destroyed(e as u64, st.gpus.len());
                    caller.hErrNode_out = std::ptr::null_mut();
                    caller.result_out = CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR;
                }
                rc
            })
        }
    };
}
instantiate_with_params!(cuGraphInstantiateWithParams, PFN_cuGraphInstantiateWithParams_v12000, cuGraphUpload, PFN_cuGraphUpload_v11010);
instantiate_with_params!(
    cuGraphInstantiateWithParams_ptsz,
    PFN_cuGraphInstantiateWithParams_v12000_ptsz,
    cuGraphUpload_ptsz,
    PFN_cuGraphUpload_v11010_ptsz
);

/// An upload maps the exec's graph memory like a launch does: reserved first (or refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, nothing mapped), settled after.
///
/// # Safety
/// `upload` is the real driver's `cuGraphUpload[_ptsz]`; `exec` and `stream` are the caller's.
unsafe fn counted_upload(st: &crate::state::State, exec: CUgraphExec, stream: CUstream, upload: PFN_cuGraphUpload_v11010) -> CUresult {
    // SAFETY: forwarding the caller's arguments to the real function.
    crate::graphmem::mapping(st, exec as u64, || unsafe { upload(exec, stream) })
}

macro_rules! upload_graph {
    ($name:ident, $pfn:ty) => {
        #[doc = concat!("Hooked `", stringify!($name), "`: the upload's graph memory reserved (or refused) first.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(exec: CUgraphExec, stream: CUstream) -> CUresult {
            guard(|| {
                let upload = real!($name: $pfn);
                // SAFETY: the real function and the caller's arguments.
                unsafe { counted_upload(state(), exec, stream, upload) }
            })
        }
    };
}
upload_graph!(cuGraphUpload, PFN_cuGraphUpload_v11010);
upload_graph!(cuGraphUpload_ptsz, PFN_cuGraphUpload_v11010_ptsz);

launch_graph!(cuGraphLaunch, PFN_cuGraphLaunch_v10000);
launch_graph!(cuGraphLaunch_ptsz, PFN_cuGraphLaunch_v10000_ptsz);

// ---- contexts (tracked so they can be released before the process dies) ---------------------

/// A teardown of context `ctx` by `call` (the driver's): its records are set aside on every
/// GPU before the call ([`crate::quota::Quota::context_teardown_begin`]), their bytes given
/// back if `gone` says the driver freed its allocations, put back otherwise. Giving back by
/// handle after the call took the allocations of a context another thread created meanwhile
/// under the same handle value. Returns the driver's answer.
fn context_teardown(ctx: u64, call: impl FnOnce() -> CUresult, gone: impl FnOnce(CUresult) -> bool) -> CUresult {
    crate::quota::context_teardown(|| state().quotas(), ctx, call, gone)
}

/// `cuCtxDestroy*`: on success the driver freed every allocation of the context.
fn context_destroy(ctx: CUcontext, call: impl FnOnce() -> CUresult) -> CUresult {
    context_teardown(ctx as u64, call, |rc| {
        let ok = rc == CUresult::CUDA_SUCCESS;
        if ok {
            state().contexts.destroyed(ctx);
            crate::capture::context_gone(ctx as u64);
        }
        ok
    })
}

/// A primary-context release on `dev`: if it was the last retain, the driver destroyed the
/// context and its allocations.
fn primary_release(dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let st = state();
    let handle = st.contexts.primary_handle(dev);
    context_teardown(handle, call, |rc| {
        let ok = rc == CUresult::CUDA_SUCCESS;
        if ok {
            st.contexts.released(dev);
        }
        let gone = ok && !crate::exit::primary_active(dev);
        if gone {
            crate::capture::context_gone(handle);
        }
        gone
    })
}

/// A primary-context reset on `dev`: on success every allocation of the primary context is gone.
fn primary_reset(dev: CUdevice, call: impl FnOnce() -> CUresult) -> CUresult {
    let handle = state().contexts.primary_handle(dev);
    context_teardown(handle, call, |rc| {
        let ok = rc == CUresult::CUDA_SUCCESS;
        if ok {
            crate::capture::context_gone(handle);
        }
        ok
    })
}

/// Hooked context teardowns (`cuCtxDestroy*`, `cuDevicePrimaryCtxRelease*`,
/// `cuDevicePrimaryCtxReset*`): see [`context_teardown`].
macro_rules! teardown {
    ($($(#[$doc:meta])* fn $name:ident($a:ident: $t:ty): $pfn:ty => $how:ident;)*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($a: $t) -> CUresult {
            guard(|| {
                let real_fn = real!($name: $pfn);
                // SAFETY: forwarding the caller's argument.
                $how($a, || unsafe { real_fn($a) })
            })
        }
    )*};
}

teardown! {
    /// Hooked `cuCtxDestroy`: the destroyed context's allocations are given back.
    fn cuCtxDestroy(ctx: CUcontext): PFN_cuCtxDestroy_v2000 => context_destroy;
    /// Hooked `cuCtxDestroy_v2`: the destroyed context's allocations are given back.
    fn cuCtxDestroy_v2(ctx: CUcontext): PFN_cuCtxDestroy_v4000 => context_destroy;
    /// Hooked `cuDevicePrimaryCtxRelease`: the last release gives the primary context's allocations back.
    fn cuDevicePrimaryCtxRelease(dev: CUdevice): PFN_cuDevicePrimaryCtxRelease_v7000 => primary_release;
    /// Hooked `cuDevicePrimaryCtxRelease_v2`: the last release gives the primary context's allocations back.
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice): PFN_cuDevicePrimaryCtxRelease_v11000 => primary_release;
    /// Hooked `cuDevicePrimaryCtxReset`: the reset primary context's allocations are given back.
    fn cuDevicePrimaryCtxReset(dev: CUdevice): PFN_cuDevicePrimaryCtxReset_v7000 => primary_reset;
    /// Hooked `cuDevicePrimaryCtxReset_v2`: the reset primary context's allocations are given back.
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice): PFN_cuDevicePrimaryCtxReset_v11000 => primary_reset;
}

/// Hooked `cuCtxSetLimit`: the device memory a raised stack, malloc heap or printf FIFO holds
/// is counted against the quota (see [`crate::limits`]).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult {
    guard(|| {
        let set = real!(cuCtxSetLimit: PFN_cuCtxSetLimit_v3010);
        // SAFETY: forwarding the caller's arguments.
        crate::limits::set_limit(limit, value, || unsafe { set(limit, value) })
    })
}

forward_then! {
    /// Hooked `cuCtxCreate` (the CUDA 2.0 ABI, still exported): the context is tracked for
    /// release before the process dies.
    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice): PFN_cuCtxCreate_v2000 [gated]
        => track_created(out!(pctx));
    /// Hooked `cuCtxCreate_v2`: the context is tracked for release before the process dies.
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice): PFN_cuCtxCreate_v3020 [gated]
        => track_created(out!(pctx));
    /// Hooked `cuCtxCreate_v3`: the context is tracked for release before the process dies.
    fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut CUexecAffinityParam, n: c_int, flags: c_uint, dev: CUdevice): PFN_cuCtxCreate_v11040 [gated]
        => track_created(out!(pctx));
    /// Hooked `cuCtxCreate_v4`: the context is tracked for release before the process dies.
    fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice): PFN_cuCtxCreate_v12050 [gated]
        => track_created(out!(pctx));
    /// Hooked `cuDevicePrimaryCtxRetain`: the primary context is tracked for release before exit.
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice): PFN_cuDevicePrimaryCtxRetain_v7000 [gated]
        => state().contexts.retained(dev, out!(pctx));
}

/// A context the driver created, recorded for release before the process dies; one the
/// registry has no room for (256 live contexts) is destroyed again and refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`: a context the shim could not release could hang MPS neighbours
/// when the process is killed.
fn track_created(ctx: CUcontext) -> CUresult {
    if state().contexts.created(ctx) {
        return CUresult::CUDA_SUCCESS;
    }
    let rc = crate::state::call_real!(cuCtxDestroy_v2: PFN_cuCtxDestroy_v4000, ctx);
    crate::state::logged(|| tracing::error!(destroy_rc = rc.0, "xcuda: context registry full (256 live contexts): the new context is destroyed and refused"));
    CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

// ---- signals (the application's SIGINT/SIGTERM actions are kept behind ours) ----------------

/// Exported `sigaction`: the application's SIGINT/SIGTERM actions are kept behind the shim's handlers.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    // SAFETY: the caller's arguments, under sigaction(2)'s contract.
    let r = catch_unwind(|| unsafe { crate::exit::app_sigaction(sig, act, old) }).unwrap_or(None);
    if let Some(rc) = r {
        return rc;
    }
    match crate::real::sigaction_fn() {
        // SAFETY: forwarding the caller's arguments to libc.
        Some(real) => unsafe { real(sig, act, old) },
        None => {
            // SAFETY: errno is thread-local and always writable.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
    }
}

/// Exported `signal`: like our `sigaction`, for the old interface.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let r = catch_unwind(|| crate::exit::app_signal(sig, handler)).unwrap_or(None);
    if let Some(old) = r {
        return old;
    }
    match crate::real::signal_fn() {
        // SAFETY: forwarding the caller's arguments to libc.
        Some(real) => unsafe { real(sig, handler) },
        None => libc::SIG_ERR,
    }
}

/// One of libc's older `signal`-shaped entry points: the application's SIGINT/SIGTERM action
/// recorded behind the shim's handler by `ours`, anything else forwarded to libc's own. glibc's
/// versions call its internal `sigaction`, which our export never sees: without these, an
/// application setting its handler through them replaced the shim's in the kernel, and its
/// contexts were no longer released before a signal ended it.
fn old_signal(
    which: crate::real::OldSignal,
    ours: fn(c_int, libc::sighandler_t) -> Option<libc::sighandler_t>,
    sig: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    if let Some(old) = catch_unwind(|| ours(sig, handler)).unwrap_or(None) {
        return old;
    }
    match crate::real::old_signal_fn(which) {
        // SAFETY: forwarding the caller's arguments to libc's function of the same type.
        Some(real) => unsafe { real(sig, handler) },
        None => libc::SIG_ERR,
    }
}

/// Exported `bsd_signal`: as our `signal`.
#[no_mangle]
pub extern "C" fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    old_signal(crate::real::OldSignal::Bsd, crate::exit::app_signal, sig, handler)
}

/// Exported `sysv_signal`: a one-shot action, kept behind the shim's handler.
#[no_mangle]
pub extern "C" fn sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    old_signal(crate::real::OldSignal::Sysv, crate::exit::app_sysv_signal, sig, handler)
}

/// Exported `__sysv_signal`: what `signal` is in a strict-standards build (`-std=c11`).
#[no_mangle]
pub extern "C" fn __sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    old_signal(crate::real::OldSignal::SysvInternal, crate::exit::app_sysv_signal, sig, handler)
}

/// Exported `sigset` (System V): the application's action kept behind the shim's handler.
#[no_mangle]
pub extern "C" fn sigset(sig: c_int, disp: libc::sighandler_t) -> libc::sighandler_t {
    old_signal(crate::real::OldSignal::Sigset, crate::exit::app_sigset, sig, disp)
}
