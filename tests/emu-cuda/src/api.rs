//! The exported C surface of the fake `libcuda.so.1`: thin entry points that check pointers,
//! convert arguments and call `driver`. No panic crosses the ABI (`entry` catches it).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use crate::driver::{self, LaunchReq, R};
use crate::pools as emu_pools;
use cuda_abi::*;
use std::ffi::CStr;
use std::os::raw::{c_char, c_float, c_int, c_uchar, c_uint, c_void};

fn entry(f: impl FnOnce() -> R) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUresult::CUDA_ERROR_UNKNOWN,
    }
}

/// The stream a `_ptsz` entry names: its null stream is the calling thread's per-thread default
/// stream (`CU_STREAM_PER_THREAD`), not the legacy one the plain entry's null stream is.
fn pts(s: CUstream) -> CUstream {
    if s.is_null() { CU_STREAM_PER_THREAD_HANDLE as CUstream } else { s }
}

/// `CU_STREAM_PER_THREAD` (cuda.h: `((CUstream)0x2)`).
const CU_STREAM_PER_THREAD_HANDLE: usize = 0x2;

/// Writes an out-parameter after a null check.
///
/// # Safety
/// `p` must be null or valid for a write of `T` (the CUDA API contract for out-parameters).
unsafe fn put<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and, by the caller's contract, valid for writes.
    unsafe { p.write(v) };
    Ok(())
}

fn h<T>(p: *mut T) -> u64 {
    p as usize as u64
}

fn ptr<T>(v: u64) -> *mut T {
    v as usize as *mut T
}

/// Copies a Rust string into a caller buffer of `len` bytes, NUL-terminated, truncating.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
unsafe fn put_str(buf: *mut c_char, len: c_int, s: &str) -> R {
    if buf.is_null() || len <= 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: `buf` has `len` > n bytes by the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// Defines an exported entry point whose body runs inside `entry` (panics caught).
macro_rules! export {
    ($( fn $name:ident($($a:ident : $t:ty),* $(,)?) $body:block )*) => {
        $(
            #[doc = concat!("`", stringify!($name), "` of the CUDA driver API, exported for C callers; a panic returns `CUDA_ERROR_UNKNOWN`.")]
            #[doc = ""]
            #[doc = "# Safety"]
            #[doc = ""]
            #[doc = "Pointer arguments must be null or valid for the access the CUDA API documents."]
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
                entry(|| -> R {
                    // SAFETY: every pointer argument comes from the C caller, which the CUDA
                    // API contract requires to be null or valid for the documented access;
                    // `put`/`put_str` null-check outputs and inputs are checked before use.
                    #[allow(unused_unsafe)]
                    unsafe { $body }
                })
            }
        )*
    };
}

/// Kernel cycles of a `spin` launch: its single `u64` parameter, from `kernelParams` or from
/// the `extra` buffer.
///
/// # Safety
/// `params` / `extra` follow the `cuLaunchKernel` contract.
unsafe fn spin_cycles(params: *mut *mut c_void, extra: *mut *mut c_void) -> R<u64> {
    if !params.is_null() {
        // SAFETY: the kernel has one parameter, so params[0] points at a u64.
        let p0 = unsafe { *params };
        if p0.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: as above; unaligned read tolerates any caller buffer.
        return Ok(unsafe { p0.cast::<u64>().read_unaligned() });
    }
    if !extra.is_null() {
        let mut i = 0;
        loop {
            // SAFETY: `extra` is a CU_LAUNCH_PARAM_END-terminated array of (key, value) pairs.
            let key = unsafe { *extra.add(i) } as usize;
            match key {
                CU_LAUNCH_PARAM_END => break,
                CU_LAUNCH_PARAM_BUFFER_POINTER => {
                    // SAFETY: the value after BUFFER_POINTER is the argument buffer.
                    let buf = unsafe { *extra.add(i + 1) };
                    if buf.is_null() {
                        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                    }
                    // SAFETY: the buffer holds the u64 parameter at offset 0.
                    return Ok(unsafe { buf.cast::<u64>().read_unaligned() });
                }
                _ => i += 2,
            }
            if i > 64 {
                break;
            }
        }
    }
    Err(CUresult::CUDA_ERROR_INVALID_VALUE)
}

#[allow(clippy::too_many_arguments)]
unsafe fn launch_common(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
) -> R {
    let info = driver::func_info(h(f))?;
    let cycles = if info.is_spin && info.params == 1 {
        // SAFETY: forwarded from the caller under the cuLaunchKernel contract.
        Some(unsafe { spin_cycles(params, extra)? })
    } else {
        if info.params > 0 && params.is_null() && extra.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        None
    };
    driver::launch(LaunchReq { f: h(f), grid, block, shared_mem, stream: h(stream), cycles, cooperative })?;
    driver::legacy_forget(h(f));
    Ok(())
}

/// `cuLaunch` / `cuLaunchGrid` / `cuLaunchGridAsync` (CUDA 2.0's execution control): a
/// `width` x `height` grid of the block shape, shared size and parameters set on `f` before.
/// Refused (`CUDA_ERROR_INVALID_VALUE`) without a block shape, with a grid dimension below 1,
/// or when the function takes parameters and no parameter size was set (or a `spin` kernel's
/// is shorter than its `u64`).
fn legacy_launch(f: CUfunction, width: c_int, height: c_int, stream: CUstream) -> R {
    let (Ok(w), Ok(hgt)) = (c_uint::try_from(width), c_uint::try_from(height)) else {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    let st = driver::legacy_state(h(f))?;
    let block = st.block.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let info = driver::func_info(h(f))?;
    let size = st.param_size.unwrap_or(0);
    if info.params > 0 && st.param_size.is_none() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let cycles = if info.is_spin && info.params == 1 {
        let b = st.params.get(..8).filter(|_| size >= 8).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Some(u64::from_ne_bytes(b.try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?))
    } else {
        None
    };
    driver::launch(LaunchReq { f: h(f), grid: [w, hgt, 1], block, shared_mem: st.shared_mem, stream: h(stream), cycles, cooperative: false })
}

/// `cuParamSet{i,f,v}`: `bytes` at `offset` of `f`'s parameter block (within
/// [`driver::LEGACY_PARAM_MAX`]).
fn legacy_param(f: CUfunction, offset: c_int, bytes: &[u8]) -> R {
    let off = usize::try_from(offset).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let end = off.checked_add(bytes.len()).filter(|e| *e <= driver::LEGACY_PARAM_MAX).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    driver::legacy_update(h(f), |st| {
        if st.params.len() < end {
            st.params.resize(end, 0);
        }
        st.params[off..end].copy_from_slice(bytes);
        Ok(())
    })
}

/// `CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_PRE_LAUNCH_SYNC | ..._NO_POST_LAUNCH_SYNC` (cuda.h).
const MULTI_DEVICE_FLAGS: c_uint = 0x01 | 0x02;

/// `cuLaunchCooperativeKernelMultiDevice`: one cooperative launch per entry, each in its
/// stream's context. Checked before anything is launched, as cuda.h documents: known flags, at
/// least one entry and no more than devices, streams created by the application (not the
/// NULL / legacy / per-thread handles), no two entries on one device, the same grid, block and
/// shared size everywhere, the same kernel code, each function of its stream's context.
///
/// # Safety
/// `list` null or valid for `n` entries.
unsafe fn launch_multi_device(list: *mut CUDA_LAUNCH_PARAMS_v1, n: c_uint, flags: c_uint) -> R {
    if list.is_null() || n == 0 || flags & !MULTI_DEVICE_FLAGS != 0 || n as usize > driver::device_count()? {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's array of `n` entries (checked non-null).
    let entries = unsafe { std::slice::from_raw_parts(list, n as usize) };
    let first = entries[0];
    let dims = |e: &CUDA_LAUNCH_PARAMS_v1| (e.gridDimX, e.gridDimY, e.gridDimZ, e.blockDimX, e.blockDimY, e.blockDimZ, e.sharedMemBytes);
    let code = |f: CUfunction| driver::func_info(h(f)).map(|i| (i.is_spin, i.params));
    let mut plan = Vec::with_capacity(entries.len());
    let mut ords = std::collections::HashSet::new();
    for e in entries {
        let s = h(e.hStream);
        if s == 0 || s == 1 || s == CU_STREAM_PER_THREAD_HANDLE as u64 || dims(e) != dims(&first) || code(e.function)? != code(first.function)? {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = driver::stream_ctx(s)?;
        if driver::func_ctx(h(e.function))? != ctx {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        if !ords.insert(driver::ctx_ord(ctx)?) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        plan.push((ctx, *e));
    }
    for (ctx, e) in plan {
        driver::ctx_push(ctx)?;
        let grid = [e.gridDimX, e.gridDimY, e.gridDimZ];
        let block = [e.blockDimX, e.blockDimY, e.blockDimZ];
        // SAFETY: the entry's kernel parameters, under the caller's contract.
        let r = unsafe { launch_common(e.function, grid, block, e.sharedMemBytes, e.hStream, e.kernelParams, std::ptr::null_mut(), true) };
        driver::ctx_pop()?;
        r?;
    }
    Ok(())
}

/// `per_thread`: the `_ptsz` entry (its null stream is the per-thread default stream).
unsafe fn launch_ex(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void, per_thread: bool) -> R {
    if config.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null config from the caller.
    let c = unsafe { *config };
    let mut cooperative = false;
    if !c.attrs.is_null() {
        for i in 0..c.numAttrs as usize {
            // SAFETY: `attrs` has `numAttrs` entries.
            let a = unsafe { *c.attrs.add(i) };
            if a.id == CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE && a.value.as_int() != 0 {
                cooperative = true;
            }
        }
    }
    // SAFETY: forwarded under the caller's contract.
    unsafe {
        launch_common(
            f,
            [c.gridDimX, c.gridDimY, c.gridDimZ],
            [c.blockDimX, c.blockDimY, c.blockDimZ],
            c.sharedMemBytes,
            if per_thread { pts(c.hStream) } else { c.hStream },
            params,
            extra,
            cooperative,
        )
    }
}

unsafe fn proc_address(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: cuuint64_t) -> (R, CUdriverProcAddressQueryResult) {
    use CUdriverProcAddressQueryResult as Q;
    if symbol.is_null() || pfn.is_null() || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM {
        return (Err(CUresult::CUDA_ERROR_INVALID_VALUE), Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    // SAFETY: non-null pfn from the caller.
    unsafe { *pfn = std::ptr::null_mut() };
    // SAFETY: non-null NUL-terminated name from the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    // A driver hands out the ABIs it has: a request newer than the driver resolves as of the
    // driver's own version (a 12.9 driver has no CUDA 13.0 entry points).
    let version = match driver::driver_version() {
        Ok(v) => version.min(v),
        Err(e) => return (Err(e), Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
    };
    match crate::procaddr::lookup(name, version, flags) {
        Ok(p) => {
            // SAFETY: as above.
            unsafe { *pfn = p };
            (Ok(()), Q::CU_GET_PROC_ADDRESS_SUCCESS)
        }
        Err(q) => (Err(CUresult::CUDA_ERROR_NOT_FOUND), q),
    }
}

fn array_bytes(w: usize, hgt: usize, d: usize, fmt: CUarray_format, ch: c_uint) -> R<u64> {
    let elem = array_format_bytes(fmt).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if w == 0 || !matches!(ch, 1 | 2 | 4) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    (w as u64)
        .checked_mul(hgt.max(1) as u64)
        .and_then(|v| v.checked_mul(d.max(1) as u64))
        .and_then(|v| v.checked_mul(elem * u64::from(ch)))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// Reads a NUL-terminated image (PTX text) of at most 256 MiB.
///
/// # Safety
/// `image` must be null or point at a NUL-terminated buffer.
unsafe fn image_text<'a>(image: *const c_void) -> R<&'a str> {
    if image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the API requires PTX images to be NUL-terminated.
    let bytes = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_bytes();
    if bytes.len() > 256 << 20 {
        return Err(CUresult::CUDA_ERROR_INVALID_IMAGE);
    }
    std::str::from_utf8(bytes).map_err(|_| CUresult::CUDA_ERROR_INVALID_IMAGE)
}

/// The graph kernel node a `CUDA_KERNEL_NODE_PARAMS[_v1]` pointer describes (the fields both
/// ABIs share), or `CUDA_ERROR_INVALID_VALUE` from the entry point for a null one.
macro_rules! kernel_node {
    ($params:expr) => {{
        if $params.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let p = *$params;
        graph_node(p.func, [p.gridDimX, p.gridDimY, p.gridDimZ], [p.blockDimX, p.blockDimY, p.blockDimZ], p.sharedMemBytes, p.kernelParams, p.extra)?
    }};
}

/// `cuEventElapsedTime[_v2]`: milliseconds between two recorded events.
///
/// # Safety
/// `out` null or writable.
unsafe fn elapsed(out: *mut c_float, start: CUevent, end: CUevent) -> R {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-null out-pointer.
    unsafe { put(out, driver::event_elapsed(h(start), h(end))?) }
}

export! {
    fn cuGetErrorString(error: CUresult, pStr: *mut *const c_char) {
        match error.description_cstr() {
            Some(s) => put(pStr, s.as_ptr()),
            None => {
                put(pStr, std::ptr::null())?;
                Err(CUresult::CUDA_ERROR_INVALID_VALUE)
            }
        }
    }
    fn cuGetErrorName(error: CUresult, pStr: *mut *const c_char) {
        match error.name_cstr() {
            Some(s) => put(pStr, s.as_ptr()),
            None => {
                put(pStr, std::ptr::null())?;
                Err(CUresult::CUDA_ERROR_INVALID_VALUE)
            }
        }
    }
    fn cuInit(Flags: c_uint) { driver::init(Flags) }
    fn cuDriverGetVersion(driverVersion: *mut c_int) { put(driverVersion, driver::driver_version()?) }
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        driver::check_device(ordinal)?;
        put(device, ordinal)
    }
    fn cuDeviceGetCount(count: *mut c_int) {
        put(count, driver::device_count()? as c_int)
    }
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        put_str(name, len, &driver::gpu(dev)?.dev.info().name)
    }
    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        put(uuid, CUuuid { bytes: driver::gpu(dev)?.dev.info().uuid })
    }
    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        put(uuid, CUuuid { bytes: driver::gpu(dev)?.dev.info().uuid })
    }
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) { put(bytes, driver::total_mem(dev)? as usize) }
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) {
        let gpu = driver::gpu(dev)?;
        if attrib == CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE {
            // Live state (`nvidia-smi -c` changes it while processes run), not a profile fact.
            return put(pi, gpu.dev.compute_mode() as c_int);
        }
        let v = crate::attrs::attribute(&gpu.dev.info(), attrib).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        put(pi, v)
    }
    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) {
        let (a, b) = driver::gpu(dev)?.dev.info().compute_capability;
        put(major, a as c_int)?;
        put(minor, b as c_int)
    }
    fn cuDeviceGetPCIBusId(pciBusId: *mut c_char, len: c_int, dev: CUdevice) {
        let g = driver::gpu(dev)?;
        // Each GPU of an emulated host sits on its own bus.
        let bus = g.dev.info().pci_bus + g.phys as u32;
        put_str(pciBusId, len, &format!("00000000:{bus:02X}:00.0"))
    }
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(pctx, ptr(driver::primary_retain(dev)?))
    }
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) { driver::primary_release(dev) }
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) { driver::primary_release(dev) }
    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) { driver::primary_set_flags(dev, flags) }
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) { driver::primary_set_flags(dev, flags) }
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let (f, a) = driver::primary_state(dev)?;
        put(flags, f)?;
        put(active, c_int::from(a))
    }
    fn cuDevicePrimaryCtxReset(dev: CUdevice) { driver::primary_reset(dev) }
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) { driver::primary_reset(dev) }
    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(pctx, ptr(driver::ctx_create(flags, dev)?))
    }
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(pctx, ptr(driver::ctx_create(flags, dev)?))
    }
    fn cuCtxCreate_v3(pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int, flags: c_uint, dev: CUdevice) {
        if pctx.is_null() || numParams < 0 || (numParams > 0 && paramsArray.is_null()) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(pctx, ptr(driver::ctx_create(flags, dev)?))
    }
    fn cuCtxCreate_v4(pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) {
        let _ = ctxCreateParams;
        if pctx.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(pctx, ptr(driver::ctx_create(flags, dev)?))
    }
    fn cuCtxDestroy(ctx: CUcontext) { driver::ctx_destroy(h(ctx)) }
    fn cuCtxDestroy_v2(ctx: CUcontext) { driver::ctx_destroy(h(ctx)) }
    fn cuCtxPushCurrent(ctx: CUcontext) { driver::ctx_push(h(ctx)) }
    fn cuCtxPushCurrent_v2(ctx: CUcontext) { driver::ctx_push(h(ctx)) }
    fn cuCtxPopCurrent(pctx: *mut CUcontext) {
        let c = driver::ctx_pop()?;
        if !pctx.is_null() {
            put(pctx, ptr(c))?;
        }
        Ok(())
    }
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) {
        let c = driver::ctx_pop()?;
        if !pctx.is_null() {
            put(pctx, ptr(c))?;
        }
        Ok(())
    }
    fn cuCtxSetCurrent(ctx: CUcontext) { driver::ctx_set_current(h(ctx)) }
    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        if let Some(f) = take_next_ctx_get_current_hook() {
            f();
        }
        put(pctx, ptr(driver::ctx_get_current()?))
    }
    fn cuCtxGetDevice(device: *mut CUdevice) {
        put(device, driver::current_ord()? as CUdevice)
    }
    fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) {
        let ord = if ctx.is_null() { driver::current_ord()? } else { driver::ctx_ord(h(ctx))? };
        put(device, ord as CUdevice)
    }
    fn cuCtxGetFlags(flags: *mut c_uint) { put(flags, driver::ctx_flags()?) }
    fn cuCtxSetLimit(limit: CUlimit, value: usize) { driver::ctx_set_limit(limit.0, value as u64) }
    fn cuCtxGetLimit(pvalue: *mut usize, limit: CUlimit) { put(pvalue, driver::ctx_get_limit(limit.0)? as usize) }
    fn cuCtxSynchronize() { driver::ctx_sync() }
    fn cuCtxSynchronize_v2(ctx: CUcontext) { driver::ctx_sync_of(h(ctx)) }
    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) { put(version, driver::ctx_api_version(h(ctx))?) }
    fn cuCtxGetStreamPriorityRange(leastPriority: *mut c_int, greatestPriority: *mut c_int) {
        driver::drv()?;
        if !leastPriority.is_null() {
            put(leastPriority, 0)?;
        }
        if !greatestPriority.is_null() {
            put(greatestPriority, -5)?;
        }
        Ok(())
    }
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) {
        if module.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(module, ptr(driver::module_load(image_text(image)?)?))
    }
    fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, numOptions: c_uint, options: *mut CUjit_option, optionValues: *mut *mut c_void) {
        if module.is_null() || (numOptions > 0 && (options.is_null() || optionValues.is_null())) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(module, ptr(driver::module_load(image_text(image)?)?))
    }
    fn cuModuleUnload(hmod: CUmodule) { driver::module_unload(h(hmod)) }
    fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char) {
        if hfunc.is_null() || name.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let n = CStr::from_ptr(name).to_str().map_err(|_| CUresult::CUDA_ERROR_NOT_FOUND)?;
        put(hfunc, ptr(driver::module_get_function(h(hmod), n)?))
    }
    fn cuFuncGetAttribute(pi: *mut c_int, attrib: CUfunction_attribute, hfunc: CUfunction) {
        put(pi, driver::func_attribute(h(hfunc), attrib.0)?)
    }
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        if free.is_null() || total.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (f, t) = driver::mem_info()?;
        put(free, f as usize)?;
        put(total, t as usize)
    }
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) {
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(dptr, driver::mem_alloc(bytesize as u64)?)
    }
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize, ElementSizeBytes: c_uint) {
        if dptr.is_null() || pPitch.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (p, pitch) = driver::mem_alloc_pitch(WidthInBytes as u64, Height as u64, ElementSizeBytes)?;
        put(dptr, p)?;
        put(pPitch, pitch as usize)
    }
    fn cuMemFree_v2(dptr: CUdeviceptr) { driver::mem_free(dptr) }
    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) {
        let (b, s) = driver::mem_range(dptr)?;
        if !pbase.is_null() {
            put(pbase, b)?;
        }
        if !psize.is_null() {
            put(psize, s as usize)?;
        }
        Ok(())
    }
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) { host_alloc(pp, bytesize) }
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, Flags: c_uint) {
        // Only the three documented flags: the driver refuses any other bit.
        if Flags & !(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED) != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        host_alloc(pp, bytesize)
    }
    fn cuMemFreeHost(p: *mut c_void) {
        driver::drv()?;
        libc::free(p);
        Ok(())
    }
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) {
        if dptr.is_null() || !matches!(flags, 1 | 2) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(dptr, driver::mem_alloc(bytesize as u64)?)
    }
    fn cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, Flags: c_uint) {
        let _ = (handle.reserved, Flags);
        driver::current()?;
        put(pdptr, 0)?;
        Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }
    fn cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, Flags: c_uint) {
        let _ = (handle.reserved, Flags);
        driver::current()?;
        put(pdptr, 0)?;
        Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }
    fn cuMemcpyHtoD_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize) { htod(dstDevice, srcHost, ByteCount, None) }
    fn cuMemcpyHtoD_v2_ptds(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize) { driver::sync_call_on(CU_STREAM_PER_THREAD_HANDLE as u64)?; htod(dstDevice, srcHost, ByteCount, None) }
    fn cuMemcpyDtoH_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize) { dtoh(dstHost, srcDevice, ByteCount, None) }
    fn cuMemcpyDtoH_v2_ptds(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize) { driver::sync_call_on(CU_STREAM_PER_THREAD_HANDLE as u64)?; dtoh(dstHost, srcDevice, ByteCount, None) }
    fn cuMemcpyDtoD_v2(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize) { driver::memcpy_dtod(dstDevice, srcDevice, ByteCount as u64) }
    fn cuMemcpyDtoD_v2_ptds(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize) { driver::sync_call_on(CU_STREAM_PER_THREAD_HANDLE as u64)?; driver::memcpy_dtod(dstDevice, srcDevice, ByteCount as u64) }
    fn cuMemcpyHtoDAsync_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize, hStream: CUstream) { htod(dstDevice, srcHost, ByteCount, Some(h(hStream))) }
    fn cuMemcpyHtoDAsync_v2_ptsz(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize, hStream: CUstream) { htod(dstDevice, srcHost, ByteCount, Some(h(pts(hStream)))) }
    fn cuMemcpyDtoHAsync_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream) { dtoh(dstHost, srcDevice, ByteCount, Some(h(hStream))) }
    fn cuMemcpyDtoHAsync_v2_ptsz(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream) { dtoh(dstHost, srcDevice, ByteCount, Some(h(pts(hStream)))) }
    fn cuMemsetD8_v2(dstDevice: CUdeviceptr, uc: c_uchar, N: usize) { driver::memset_d8(dstDevice, uc, N as u64) }
    fn cuMemsetD8_v2_ptds(dstDevice: CUdeviceptr, uc: c_uchar, N: usize) { driver::sync_call_on(CU_STREAM_PER_THREAD_HANDLE as u64)?; driver::memset_d8(dstDevice, uc, N as u64) }
    fn cuArrayCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR) {
        if pHandle.is_null() || pAllocateArray.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = *pAllocateArray;
        crate::extents::check(d.Width, d.Height, 0, 0, false)?;
        let bytes = array_bytes(d.Width, d.Height, 1, d.Format, d.NumChannels)?;
        put(pHandle, ptr(driver::array_create(bytes)?))
    }
    fn cuArray3DCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR) {
        if pHandle.is_null() || pAllocateArray.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = *pAllocateArray;
        crate::extents::check(d.Width, d.Height, d.Depth, d.Flags, false)?;
        let bytes = array_bytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels)?;
        put(pHandle, ptr(driver::array_create(bytes)?))
    }
    // The CUDA 2.0 ABI (32-bit sizes): the same arrays.
    fn cuArrayCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR_v1) {
        if pAllocateArray.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = *pAllocateArray;
        let v2 = CUDA_ARRAY_DESCRIPTOR { Width: d.Width as usize, Height: d.Height as usize, Format: d.Format, NumChannels: d.NumChannels };
        match cuArrayCreate_v2(pHandle, &v2) {
            CUresult::CUDA_SUCCESS => Ok(()),
            e => Err(e),
        }
    }
    fn cuArray3DCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR_v1) {
        if pAllocateArray.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = *pAllocateArray;
        let v2 = CUDA_ARRAY3D_DESCRIPTOR {
            Width: d.Width as usize,
            Height: d.Height as usize,
            Depth: d.Depth as usize,
            Format: d.Format,
            NumChannels: d.NumChannels,
            Flags: d.Flags,
        };
        match cuArray3DCreate_v2(pHandle, &v2) {
            CUresult::CUDA_SUCCESS => Ok(()),
            e => Err(e),
        }
    }
    fn cuArrayDestroy(hArray: CUarray) { driver::array_destroy(h(hArray)) }
    fn cuMipmappedArrayCreate(pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR, numMipmapLevels: c_uint) {
        if pHandle.is_null() || pMipmappedArrayDesc.is_null() || numMipmapLevels == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = *pMipmappedArrayDesc;
        crate::extents::check(d.Width, d.Height, d.Depth, d.Flags, true)?;
        // As the driver documents it: at most 1 + floor(log2(max spatial dimension)) levels
        // (INVALID_VALUE beyond); a layered or cubemap array's Depth counts layers or faces,
        // which every level keeps.
        let layered = d.Flags & (cuda_abi::CUDA_ARRAY3D_LAYERED | cuda_abi::CUDA_ARRAY3D_CUBEMAP) != 0;
        let layers = if layered { d.Depth.max(1) as u64 } else { 1 };
        let (mut w, mut hh, mut dd) = (d.Width, d.Height, if layered { 0 } else { d.Depth });
        let chain = usize::BITS - w.max(hh).max(dd).max(1).leading_zeros();
        if numMipmapLevels > chain {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut total = 0u64;
        for _ in 0..numMipmapLevels {
            let level = array_bytes(w, hh, dd, d.Format, d.NumChannels)?;
            total = total.checked_add(level.checked_mul(layers).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
            w = (w / 2).max(1);
            hh /= 2;
            dd /= 2;
        }
        put(pHandle, ptr(driver::array_create(total)?))
    }
    fn cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray) { driver::array_destroy(h(hMipmappedArray)) }
    fn cuMemAddressReserve(p: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) {
        let _ = addr;
        if p.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(p, driver::vmm_reserve(size as u64, alignment as u64)?)
    }
    fn cuMemAddressFree(p: CUdeviceptr, size: usize) { driver::vmm_address_free(p, size as u64) }
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) {
        if handle.is_null() || prop.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let pr = *prop;
        if pr.type_ != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let on_device = pr.location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        put(handle, driver::vmm_create(size as u64, on_device, pr.location.id, pr.requestedHandleTypes.0)?)
    }
    fn cuMemExportToShareableHandle(shareableHandle: *mut c_void, handle: CUmemGenericAllocationHandle, handleType: CUmemAllocationHandleType, flags: u64) {
        if shareableHandle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // A POSIX file descriptor is an `int` (cuda.h: "(int)").
        put(shareableHandle.cast::<c_int>(), driver::vmm_export(handle, handleType.0, flags)?)
    }
    fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, osHandle: *mut c_void, shHandleType: CUmemAllocationHandleType) {
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // The descriptor is passed as the pointer's value (NVIDIA's samples:
        // `(void *)(uintptr_t)fd`).
        let fd = c_int::try_from(osHandle as usize).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        put(handle, driver::vmm_import(fd, shHandleType.0)?)
    }
    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) {
        if prop.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (types, ord) = driver::vmm_properties(handle)?;
        put(prop, CUmemAllocationProp {
            type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: CUmemAllocationHandleType(types),
            location: CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ord },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: CUmemAllocationPropAllocFlags::default(),
        })
    }
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) { driver::vmm_release(handle) }
    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) {
        put(handle, driver::vmm_retain(addr as u64)?)
    }
    fn cuMemMap(p: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        driver::vmm_map(p, size as u64, offset as u64, handle)
    }
    fn cuMemUnmap(p: CUdeviceptr, size: usize) { driver::vmm_unmap(p, size as u64) }
    fn cuMemSetAccess(p: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        if desc.is_null() || count == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        driver::vmm_set_access(p, size as u64)
    }
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: CUmemAllocationGranularity_flags) {
        let _ = option;
        if prop.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        driver::drv()?;
        put(granularity, driver::GRANULARITY as usize)
    }
    fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) {
        // Any context's stream, as for the allocation.
        driver::current()?;
        driver::check_stream_ordered(h(hStream))?;
        match driver::capturing_into(h(hStream))? {
            // Captured: a free node of the capture's graph.
            Some(graph) => driver::graph_add_mem_free(graph, dptr).map(|_| ()),
            None => driver::mem_free(dptr),
        }
    }
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream) {
        // Any context's stream, as for the allocation.
        driver::current()?;
        driver::check_stream_ordered(h(pts(hStream)))?;
        match driver::capturing_into(h(pts(hStream)))? {
            // Captured: a free node of the capture's graph.
            Some(graph) => driver::graph_add_mem_free(graph, dptr).map(|_| ()),
            None => driver::mem_free(dptr),
        }
    }
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) { alloc_async(dptr, bytesize, None, hStream) }
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream) { alloc_async(dptr, bytesize, None, pts(hStream)) }
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps) {
        if pool.is_null() || poolProps.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let pr = *poolProps;
        let on_device = pr.location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        put(pool, ptr(driver::pool_create(pr.allocType.0, on_device, pr.location.id)?))
    }
    fn cuMemPoolDestroy(pool: CUmemoryPool) { driver::pool_destroy(h(pool)) }
    fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) { driver::pool_trim_to(h(pool), minBytesToKeep as u64) }
    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) {
        let v = driver::pool_attribute(h(pool), attr.0)?;
        // "(value type = int)" for the reuse attributes, cuuint64_t for the others.
        if emu_pools::attr::is_int(attr.0) { put(value.cast::<c_int>(), v as c_int) } else { put(value.cast::<cuuint64_t>(), v) }
    }
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let v = if emu_pools::attr::is_int(attr.0) { *value.cast::<c_int>() as u64 } else { *value.cast::<cuuint64_t>() };
        driver::pool_set_attribute(h(pool), attr.0, v)
    }
    fn cuDeviceGetDefaultMemPool(pool_out: *mut CUmemoryPool, dev: CUdevice) { put(pool_out, ptr(driver::device_default_pool(dev)?)) }
    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) { put(pool, ptr(driver::device_pool(dev)?)) }
    fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) { driver::device_set_pool(dev, h(pool)) }
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) {
        alloc_async(dptr, bytesize, Some(pool), hStream)
    }
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream) {
        alloc_async(dptr, bytesize, Some(pool), pts(hStream))
    }
    fn cuPointerGetAttribute(data: *mut c_void, attribute: CUpointer_attribute, p: CUdeviceptr) {
        let ctx = driver::pointer_owner(p)?;
        match attribute {
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT => put(data.cast::<CUcontext>(), ptr(ctx)),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => put(data.cast::<c_uint>(), CUmemorytype::CU_MEMORYTYPE_DEVICE.0),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER => put(data.cast::<CUdeviceptr>(), p),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuStreamCreate(phStream: *mut CUstream, Flags: c_uint) {
        if phStream.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(phStream, ptr(driver::stream_create(Flags)?))
    }
    fn cuStreamGetCtx(hStream: CUstream, pctx: *mut CUcontext) { put(pctx, ptr(driver::stream_ctx(h(hStream))?)) }
    fn cuStreamGetCtx_ptsz(hStream: CUstream, pctx: *mut CUcontext) { put(pctx, ptr(driver::stream_ctx(h(pts(hStream)))?)) }
    fn cuStreamGetCtx_v2(hStream: CUstream, pCtx: *mut CUcontext, pGreenCtx: *mut CUgreenCtx) { stream_ctx_v2(hStream, pCtx, pGreenCtx) }
    fn cuStreamGetCtx_v2_ptsz(hStream: CUstream, pCtx: *mut CUcontext, pGreenCtx: *mut CUgreenCtx) { stream_ctx_v2(pts(hStream), pCtx, pGreenCtx) }
    fn cuStreamGetDevice(hStream: CUstream, device: *mut CUdevice) { put(device, driver::stream_ord(h(hStream))? as CUdevice) }
    fn cuStreamGetDevice_ptsz(hStream: CUstream, device: *mut CUdevice) { put(device, driver::stream_ord(h(pts(hStream)))? as CUdevice) }
    fn cuStreamWaitEvent(hStream: CUstream, hEvent: CUevent, Flags: c_uint) {
        let _ = Flags;
        driver::stream_wait_event(h(hStream), h(hEvent))
    }
    fn cuStreamWaitEvent_ptsz(hStream: CUstream, hEvent: CUevent, Flags: c_uint) {
        let _ = Flags;
        driver::stream_wait_event(h(pts(hStream)), h(hEvent))
    }
    fn cuStreamQuery(hStream: CUstream) { driver::stream_query(h(hStream)) }
    fn cuStreamQuery_ptsz(hStream: CUstream) { driver::stream_query(h(pts(hStream))) }
    fn cuStreamSynchronize(hStream: CUstream) { driver::stream_sync(h(hStream)) }
    fn cuStreamSynchronize_ptsz(hStream: CUstream) { driver::stream_sync(h(pts(hStream))) }
    fn cuStreamDestroy(hStream: CUstream) { driver::stream_destroy(h(hStream)) }
    // The CUDA 10.0 ABI (no mode argument): a capture in global mode, cuda.h's default.
    fn cuStreamBeginCapture(hStream: CUstream) { driver::capture_begin(h(hStream), CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL.0) }
    fn cuStreamBeginCapture_ptsz(hStream: CUstream) { driver::capture_begin(h(pts(hStream)), CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL.0) }
    fn cuStreamBeginCapture_v2(hStream: CUstream, mode: CUstreamCaptureMode) { driver::capture_begin(h(hStream), mode.0) }
    fn cuStreamBeginCapture_v2_ptsz(hStream: CUstream, mode: CUstreamCaptureMode) { driver::capture_begin(h(pts(hStream)), mode.0) }
    fn cuStreamBeginCaptureToGraph(hStream: CUstream, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, mode: CUstreamCaptureMode) {
        let _ = (dependencies, dependencyData, numDependencies);
        driver::capture_begin_to_graph(h(hStream), hGraph as u64, mode.0)
    }
    fn cuStreamBeginCaptureToGraph_ptsz(hStream: CUstream, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, mode: CUstreamCaptureMode) {
        let _ = (dependencies, dependencyData, numDependencies);
        driver::capture_begin_to_graph(h(pts(hStream)), hGraph as u64, mode.0)
    }
    fn cuStreamEndCapture(hStream: CUstream, phGraph: *mut CUgraph) { end_capture(hStream, phGraph) }
    fn cuStreamEndCapture_ptsz(hStream: CUstream, phGraph: *mut CUgraph) { end_capture(pts(hStream), phGraph) }
    fn cuStreamIsCapturing(hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus) {
        put(captureStatus, CUstreamCaptureStatus(driver::capture_info(h(hStream))?.0))
    }
    fn cuStreamIsCapturing_ptsz(hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus) {
        put(captureStatus, CUstreamCaptureStatus(driver::capture_info(h(pts(hStream)))?.0))
    }
    fn cuStreamGetCaptureInfo_v2(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, numDependencies_out: *mut usize) {
        capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, std::ptr::null_mut(), numDependencies_out)
    }
    fn cuStreamGetCaptureInfo_v2_ptsz(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, numDependencies_out: *mut usize) {
        capture_info(pts(hStream), captureStatus_out, id_out, graph_out, dependencies_out, std::ptr::null_mut(), numDependencies_out)
    }
    fn cuStreamGetCaptureInfo_v3(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, edgeData_out: *mut *const CUgraphEdgeData, numDependencies_out: *mut usize) {
        capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out)
    }
    fn cuStreamGetCaptureInfo_v3_ptsz(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, edgeData_out: *mut *const CUgraphEdgeData, numDependencies_out: *mut usize) {
        capture_info(pts(hStream), captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out)
    }
    fn cuStreamDestroy_v2(hStream: CUstream) { driver::stream_destroy(h(hStream)) }
    fn cuEventCreate(phEvent: *mut CUevent, Flags: c_uint) {
        if phEvent.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(phEvent, ptr(driver::event_create(Flags)?))
    }
    fn cuEventRecord(hEvent: CUevent, hStream: CUstream) { driver::event_record(h(hEvent), h(hStream)) }
    fn cuEventRecord_ptsz(hEvent: CUevent, hStream: CUstream) { driver::event_record(h(hEvent), h(pts(hStream))) }
    fn cuEventQuery(hEvent: CUevent) { driver::event_query(h(hEvent)) }
    fn cuEventSynchronize(hEvent: CUevent) { driver::event_sync(h(hEvent)) }
    fn cuEventDestroy(hEvent: CUevent) { driver::event_destroy(h(hEvent)) }
    fn cuEventDestroy_v2(hEvent: CUevent) { driver::event_destroy(h(hEvent)) }
    fn cuEventElapsedTime(pMilliseconds: *mut c_float, hStart: CUevent, hEnd: CUevent) {
        elapsed(pMilliseconds, hStart, hEnd)
    }
    fn cuEventElapsedTime_v2(pMilliseconds: *mut c_float, hStart: CUevent, hEnd: CUevent) {
        elapsed(pMilliseconds, hStart, hEnd)
    }
    fn cuLaunchKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_common(f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], sharedMemBytes, hStream, kernelParams, extra, false)
    }
    fn cuLaunchKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_common(f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], sharedMemBytes, pts(hStream), kernelParams, extra, false)
    }
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f, kernelParams, extra, false)
    }
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f, kernelParams, extra, true)
    }
    fn cuLaunchCooperativeKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) {
        launch_common(f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], sharedMemBytes, hStream, kernelParams, std::ptr::null_mut(), true)
    }
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void) {
        launch_common(f, [gridDimX, gridDimY, gridDimZ], [blockDimX, blockDimY, blockDimZ], sharedMemBytes, pts(hStream), kernelParams, std::ptr::null_mut(), true)
    }
    fn cuLaunchCooperativeKernelMultiDevice(launchParamsList: *mut CUDA_LAUNCH_PARAMS_v1, numDevices: c_uint, flags: c_uint) {
        launch_multi_device(launchParamsList, numDevices, flags)
    }
    fn cuFuncSetBlockShape(hfunc: CUfunction, x: c_int, y: c_int, z: c_int) {
        let (Ok(x), Ok(y), Ok(z)) = (c_uint::try_from(x), c_uint::try_from(y), c_uint::try_from(z)) else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        if x == 0 || y == 0 || z == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        driver::legacy_update(h(hfunc), |st| {
            st.block = Some([x, y, z]);
            Ok(())
        })
    }
    fn cuFuncSetSharedSize(hfunc: CUfunction, bytes: c_uint) {
        driver::legacy_update(h(hfunc), |st| {
            st.shared_mem = bytes;
            Ok(())
        })
    }
    fn cuParamSetSize(hfunc: CUfunction, numbytes: c_uint) {
        if numbytes as usize > driver::LEGACY_PARAM_MAX {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        driver::legacy_update(h(hfunc), |st| {
            st.param_size = Some(numbytes as usize);
            Ok(())
        })
    }
    fn cuParamSeti(hfunc: CUfunction, offset: c_int, value: c_uint) {
        legacy_param(hfunc, offset, &value.to_ne_bytes())
    }
    fn cuParamSetf(hfunc: CUfunction, offset: c_int, value: c_float) {
        legacy_param(hfunc, offset, &value.to_ne_bytes())
    }
    fn cuParamSetv(hfunc: CUfunction, offset: c_int, ptr: *mut c_void, numbytes: c_uint) {
        if numbytes == 0 {
            return legacy_param(hfunc, offset, &[]);
        }
        if ptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        legacy_param(hfunc, offset, std::slice::from_raw_parts(ptr.cast::<u8>(), numbytes as usize))
    }
    fn cuLaunch(f: CUfunction) { legacy_launch(f, 1, 1, std::ptr::null_mut()) }
    fn cuLaunchGrid(f: CUfunction, grid_width: c_int, grid_height: c_int) { legacy_launch(f, grid_width, grid_height, std::ptr::null_mut()) }
    fn cuLaunchGridAsync(f: CUfunction, grid_width: c_int, grid_height: c_int, hStream: CUstream) {
        legacy_launch(f, grid_width, grid_height, hStream)
    }
    fn cuGraphCreate(phGraph: *mut CUgraph, flags: c_uint) {
        if phGraph.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(phGraph, ptr(driver::graph_create()?))
    }
    fn cuGraphAddKernelNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1) {
        add_node(phGraphNode, hGraph, dependencies, numDependencies, kernel_node!(nodeParams))
    }
    fn cuGraphAddKernelNode_v2(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_KERNEL_NODE_PARAMS) {
        add_node(phGraphNode, hGraph, dependencies, numDependencies, kernel_node!(nodeParams))
    }
    fn cuGraphInstantiateWithFlags(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: u64) {
        if phGraphExec.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(phGraphExec, ptr(driver::graph_instantiate(h(hGraph), flags, false).map_err(|(rc, _)| rc)?))
    }
    fn cuGraphInstantiate(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) {
        instantiate_legacy(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize)
    }
    fn cuGraphInstantiate_v2(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize) {
        instantiate_legacy(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize)
    }
    fn cuGraphInstantiateWithParams(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) {
        instantiate_with_params(phGraphExec, hGraph, instantiateParams)
    }
    fn cuGraphInstantiateWithParams_ptsz(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) {
        instantiate_with_params(phGraphExec, hGraph, instantiateParams)
    }
    fn cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream) {
        driver::check_stream(h(hStream))?;
        driver::graph_upload(h(hGraphExec))
    }
    fn cuGraphUpload_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) {
        driver::check_stream(h(pts(hStream)))?;
        driver::graph_upload(h(hGraphExec))
    }
    fn cuGraphAddMemAllocNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *mut CUDA_MEM_ALLOC_NODE_PARAMS) {
        mem_alloc_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams)
    }
    fn cuGraphAddNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *mut CUgraphNodeParams) {
        generic_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams)
    }
    fn cuGraphAddNode_v2(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, nodeParams: *mut CUgraphNodeParams) {
        // The emulator runs nodes in the order added: only default (all-zero) edges.
        if !dependencyData.is_null() && numDependencies > 0 {
            let edges = std::slice::from_raw_parts(dependencyData, numDependencies);
            if edges.iter().any(|e| e.from_port != 0 || e.to_port != 0 || e.type_ != 0 || e.reserved != [0; 5]) {
                return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
            }
        }
        generic_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams)
    }
    fn cuGraphNodeSetParams(hNode: CUgraphNode, nodeParams: *mut CUgraphNodeParams) {
        let _ = hNode;
        set_node_params(nodeParams)
    }
    fn cuGraphExecNodeSetParams(hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *mut CUgraphNodeParams) {
        // A kernel node's new parameters, as cuGraphExecKernelNodeSetParams_v2 sets them (the
        // reserved bytes must be zero); other node types are not emulated.
        if !nodeParams.is_null() && (*nodeParams).type_ == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
            let p = &*nodeParams;
            if p.reserved0 != [0; 3] || p.reserved2 != 0 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let k = std::ptr::addr_of!(p.u.kernel);
            return driver::graph_exec_kernel_set(h(hGraphExec), h(hNode), kernel_node!(k));
        }
        set_node_params(nodeParams)
    }
    fn cuGraphGetNodes(hGraph: CUgraph, nodes: *mut CUgraphNode, numNodes: *mut usize) {
        if numNodes.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let all = driver::graph_nodes(h(hGraph))?;
        if nodes.is_null() {
            return put(numNodes, all.len());
        }
        // cuda.h: `*numNodes` entries are filled in, those past the graph's nodes with NULL, and
        // the number of nodes actually obtained is returned (a short buffer: its length).
        let room = *numNodes;
        let out = std::slice::from_raw_parts_mut(nodes, room);
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = all.get(i).map_or(std::ptr::null_mut(), |n| ptr(*n));
        }
        put(numNodes, room.min(all.len()))
    }
    fn cuGraphNodeGetType(hNode: CUgraphNode, type_: *mut CUgraphNodeType) {
        if type_.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(type_, CUgraphNodeType(driver::graph_node_type(h(hNode))?))
    }
    fn cuGraphKernelNodeGetParams(hNode: CUgraphNode, nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v1) {
        let k = driver::graph_kernel_node(h(hNode))?;
        put(nodeParams, kernel_params_v1(&k))
    }
    fn cuGraphKernelNodeGetParams_v2(hNode: CUgraphNode, nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v2) {
        let k = driver::graph_kernel_node(h(hNode))?;
        let v1 = kernel_params_v1(&k);
        put(nodeParams, CUDA_KERNEL_NODE_PARAMS {
            func: v1.func, gridDimX: v1.gridDimX, gridDimY: v1.gridDimY, gridDimZ: v1.gridDimZ,
            blockDimX: v1.blockDimX, blockDimY: v1.blockDimY, blockDimZ: v1.blockDimZ,
            sharedMemBytes: v1.sharedMemBytes, kernelParams: v1.kernelParams, extra: v1.extra,
            kern: std::ptr::null_mut(), ctx: std::ptr::null_mut(),
        })
    }
    fn cuGraphChildGraphNodeGetGraph(hNode: CUgraphNode, phGraph: *mut CUgraph) {
        // The emulator has no child graph nodes: no node is one.
        let _ = (hNode, phGraph);
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
    fn cuGraphExecKernelNodeSetParams(hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1) {
        driver::graph_exec_kernel_set(h(hGraphExec), h(hNode), kernel_node!(nodeParams))
    }
    fn cuGraphExecKernelNodeSetParams_v2(hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v2) {
        driver::graph_exec_kernel_set(h(hGraphExec), h(hNode), kernel_node!(nodeParams))
    }
    fn cuGraphExecChildGraphNodeSetParams(hGraphExec: CUgraphExec, hNode: CUgraphNode, childGraph: CUgraph) {
        // No child graph nodes (see cuGraphChildGraphNodeGetGraph).
        let _ = (hGraphExec, hNode, childGraph);
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
    fn cuGraphExecUpdate(hGraphExec: CUgraphExec, hGraph: CUgraph, hErrorNode_out: *mut CUgraphNode, updateResult_out: *mut CUgraphExecUpdateResult) {
        if hErrorNode_out.is_null() || updateResult_out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (rc, why, node) = match driver::graph_exec_update(h(hGraphExec), h(hGraph)) {
            Ok(()) => (CUresult::CUDA_SUCCESS, CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS, 0),
            Err(e) => e,
        };
        (*hErrorNode_out, *updateResult_out) = (ptr(node), why);
        if rc == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(rc) }
    }
    fn cuGraphExecUpdate_v2(hGraphExec: CUgraphExec, hGraph: CUgraph, resultInfo: *mut CUgraphExecUpdateResultInfo) {
        if resultInfo.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (rc, why, node) = match driver::graph_exec_update(h(hGraphExec), h(hGraph)) {
            Ok(()) => (CUresult::CUDA_SUCCESS, CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS, 0),
            Err(e) => e,
        };
        *resultInfo = CUgraphExecUpdateResultInfo { result: why, errorNode: ptr(node), errorFromNode: std::ptr::null_mut() };
        if rc == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(rc) }
    }
    fn cuGraphAddMemFreeNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, dptr: CUdeviceptr) {
        if phGraphNode.is_null() || (numDependencies > 0 && dependencies.is_null()) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(phGraphNode, ptr(driver::graph_add_mem_free(h(hGraph), dptr)?))
    }
    fn cuDeviceGraphMemTrim(device: CUdevice) { driver::graph_mem_trim(device) }
    fn cuDeviceGetGraphMemAttribute(device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void) {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(value.cast::<cuuint64_t>(), driver::graph_mem_attribute(device, attr.0)?)
    }
    fn cuDeviceSetGraphMemAttribute(device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void) {
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        driver::graph_mem_set_attribute(device, attr.0, *value.cast::<cuuint64_t>())
    }
    fn cuGraphExecDestroy(hGraphExec: CUgraphExec) { driver::graph_exec_destroy(h(hGraphExec)) }
    fn cuGraphDestroy(hGraph: CUgraph) { driver::graph_destroy(h(hGraph)) }
    fn cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream) {
        driver::check_stream(h(hStream))?;
        driver::graph_launch(h(hGraphExec), h(hStream))
    }
    fn cuGraphLaunch_ptsz(hGraphExec: CUgraphExec, hStream: CUstream) {
        driver::check_stream(h(pts(hStream)))?;
        driver::graph_launch(h(hGraphExec), h(pts(hStream)))
    }
    fn cuGetExportTable(ppExportTable: *mut *const c_void, pExportTableId: *const CUuuid) {
        let _ = pExportTableId;
        put(ppExportTable, std::ptr::null())?;
        Err(CUresult::CUDA_ERROR_NOT_FOUND)
    }
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, driverVersion: c_int, flags: cuuint64_t) {
        proc_address(symbol, pfn, driverVersion, flags).0
    }
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, driverVersion: c_int, flags: cuuint64_t, symbolFound: *mut CUdriverProcAddressQueryResult) {
        let (r, q) = proc_address(symbol, pfn, driverVersion, flags);
        if !symbolFound.is_null() {
            put(symbolFound, q)?;
        }
        r
    }
}

/// The 5-argument `cuGraphInstantiate` (CUDA 10.0) / `cuGraphInstantiate_v2` (11.0): what
/// `cuGraphInstantiateWithFlags` does with no flags; a refusal is described in `log` (truncated to
/// `size`, NUL-terminated) when the caller gave one. `error_node` stays untouched (cuda.h: "may be
/// modified"; the emulator names no offending node).
///
/// # Safety
/// `out` null or writable; `log` null or valid for `size` bytes of writes.
unsafe fn instantiate_legacy(out: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, size: usize) -> R {
    let _ = error_node;
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    match driver::graph_instantiate(h(graph), 0, false) {
        // SAFETY: checked non-null out-pointer.
        Ok(exec) => unsafe { put(out, ptr(exec)) },
        Err((rc, why)) => {
            if !log.is_null() && size > 0 {
                let msg = format!("graph instantiation failed: {rc:?} (CUgraphInstantiateResult {})", why.0);
                // SAFETY: the caller's buffer of `size` > 0 bytes.
                let _ = unsafe { put_str(log, c_int::try_from(size).unwrap_or(c_int::MAX), &msg) };
            }
            Err(rc)
        }
    }
}

/// `cuGraphInstantiateWithParams[_ptsz]`: instantiates with `flags`, reports `result_out` and
/// `hErrNode_out` (null: the emulator names no offending node), then uploads into
/// `hUploadStream` when `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` asks for it (a failed upload fails
/// the call and leaves no exec behind).
///
/// # Safety
/// `out` null or writable; `params` null or the caller's parameter block.
unsafe fn instantiate_with_params(out: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> R {
    if out.is_null() || params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, the caller's parameter block.
    let p = unsafe { &mut *params };
    p.hErrNode_out = std::ptr::null_mut();
    let upload = p.flags & CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.0 as u64 != 0;
    let made = driver::graph_instantiate(h(graph), p.flags, true).and_then(|exec| {
        if !upload {
            return Ok(exec);
        }
        let up = driver::check_stream(h(p.hUploadStream)).and_then(|()| driver::graph_upload(exec));
        up.map(|()| exec).map_err(|rc| {
            let _ = driver::graph_exec_destroy(exec);
            (rc, CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR)
        })
    });
    match made {
        Ok(exec) => {
            p.result_out = CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS;
            // SAFETY: checked non-null out-pointer.
            unsafe { put(out, ptr(exec)) }
        }
        Err((rc, why)) => {
            p.result_out = why;
            Err(rc)
        }
    }
}

/// A graph kernel node from its parameters (the spin cycle count is read now, as a real driver
/// copies kernel arguments when the node is added).
///
/// # Safety
/// `params` / `extra` follow the `CUDA_KERNEL_NODE_PARAMS` contract.
unsafe fn graph_node(f: CUfunction, grid: [c_uint; 3], block: [c_uint; 3], shared_mem: c_uint, params: *mut *mut c_void, extra: *mut *mut c_void) -> R<driver::GraphNode> {
    if f.is_null() || grid.contains(&0) || block.contains(&0) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let info = driver::func_info(h(f)).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let cycles = if info.is_spin && info.params == 1 {
        // SAFETY: forwarded under the caller's contract.
        Some(unsafe { spin_cycles(params, extra)? })
    } else {
        None
    };
    Ok(driver::GraphNode { f: h(f), grid, block, shared_mem, cycles })
}

/// The `CUDA_KERNEL_NODE_PARAMS_v1` fields of graph kernel node `k`. The emulator keeps no
/// argument buffers of its own: `kernelParams` and `extra` come back null.
fn kernel_params_v1(k: &driver::GraphNode) -> CUDA_KERNEL_NODE_PARAMS_v1 {
    CUDA_KERNEL_NODE_PARAMS_v1 {
        func: ptr(k.f),
        gridDimX: k.grid[0],
        gridDimY: k.grid[1],
        gridDimZ: k.grid[2],
        blockDimX: k.block[0],
        blockDimY: k.block[1],
        blockDimZ: k.block[2],
        sharedMemBytes: k.shared_mem,
        kernelParams: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
    }
}

/// `cuGraphAddMemAllocNode` (and a `CU_GRAPH_NODE_TYPE_MEM_ALLOC` node of `cuGraphAddNode`):
/// the node's fixed address written to `params->dptr`.
///
/// # Safety
/// `out` null or writable; `deps` valid for `n` handles when `n > 0`; `params` null or the
/// caller's parameter block.
unsafe fn mem_alloc_node(out: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> R {
    if params.is_null() || out.is_null() || (n > 0 && deps.is_null()) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, the caller's parameter block.
    let p = unsafe { *params };
    let pp = &p.poolProps;
    // cuda.h: pinned memory on a device, handleTypes must be CU_MEM_HANDLE_TYPE_NONE (no
    // IPC), at most one access descriptor per GPU.
    if pp.allocType != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
        || pp.handleTypes != CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        || pp.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        || p.accessDescCount > driver::device_count()?
        || (p.accessDescCount > 0 && p.accessDescs.is_null())
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (node, addr) = driver::graph_add_mem_alloc(h(graph), p.bytesize as u64, pp.location.id)?;
    // SAFETY: the caller's parameter block (non-null) and out-pointer (checked).
    unsafe {
        (*params).dptr = addr;
        put(out, ptr(node))
    }
}

/// `cuGraphAddNode[_v2]`: the tagged union's node, added as its own `cuGraphAdd*Node` adds it
/// (kernel, memory allocation, memory free); reserved bytes must be zero
/// (`CUDA_ERROR_INVALID_VALUE`); other node types are not emulated (`CUDA_ERROR_NOT_SUPPORTED`).
///
/// # Safety
/// As [`mem_alloc_node`], `params` the caller's `CUgraphNodeParams`.
unsafe fn generic_node(out: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut CUgraphNodeParams) -> R {
    if params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, the caller's parameter block; the tag names the union member read.
    unsafe {
        let p = &mut *params;
        if p.reserved0 != [0; 3] || p.reserved2 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        match p.type_ {
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => {
                let k = std::ptr::addr_of!(p.u.kernel);
                add_node(out, graph, deps, n, kernel_node!(k))
            }
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => mem_alloc_node(out, graph, deps, n, std::ptr::addr_of_mut!(p.u.alloc)),
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                if out.is_null() || (n > 0 && deps.is_null()) {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                put(out, ptr(driver::graph_add_mem_free(h(graph), p.u.free)?))
            }
            _ => Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        }
    }
}

/// `cuGraphNodeSetParams` / `cuGraphExecNodeSetParams`: "not supported for node types
/// CU_GRAPH_NODE_TYPE_MEM_ALLOC and CU_GRAPH_NODE_TYPE_MEM_FREE" (cuda.h), so a memory node's
/// size never changes after it was added; the emulator changes no other node either, but for
/// an exec's kernel node (`cuGraphExecNodeSetParams`, handled before this)
/// (`CUDA_ERROR_NOT_SUPPORTED`, stricter than a driver).
///
/// # Safety
/// `params` null or the caller's parameter block.
unsafe fn set_node_params(params: *mut CUgraphNodeParams) -> R {
    if params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
}

/// # Safety
/// `out` null or writable; `deps` valid for `n` handles when `n > 0`.
unsafe fn add_node(out: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, node: driver::GraphNode) -> R {
    if out.is_null() || (n > 0 && deps.is_null()) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-null out-pointer.
    unsafe { put(out, ptr(driver::graph_add_kernel(h(graph), node)?)) }
}

/// `cuStreamEndCapture[_ptsz]`: the captured graph (null when the capture failed).
///
/// # Safety
/// `out` null or writable.
unsafe fn end_capture(stream: CUstream, out: *mut CUgraph) -> R {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    match driver::capture_end(h(stream)) {
        // SAFETY: checked non-null out-pointer.
        Ok(g) => unsafe { put(out, ptr(g)) },
        Err(e) => {
            // SAFETY: checked non-null out-pointer.
            unsafe { *out = std::ptr::null_mut() };
            Err(e)
        }
    }
}

/// `cuStreamGetCaptureInfo_v2/_v3[_ptsz]`: status, id and graph of a capture; the emulator
/// tracks no dependencies (none are reported: 0 of them, null arrays).
///
/// # Safety
/// Each out-pointer null (not asked for) or writable.
unsafe fn capture_info(
    stream: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const CUgraphEdgeData,
    n: *mut usize,
) -> R {
    if status.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (st, cid, g) = driver::capture_info(h(stream))?;
    // SAFETY: each pointer checked non-null before its write; the caller's out-parameters.
    unsafe {
        *status = CUstreamCaptureStatus(st);
        if !id.is_null() {
            *id = cid;
        }
        if !graph.is_null() {
            *graph = ptr(g);
        }
        if !deps.is_null() {
            *deps = std::ptr::null();
        }
        if !edges.is_null() {
            *edges = std::ptr::null();
        }
        if !n.is_null() {
            *n = 0;
        }
    }
    Ok(())
}

/// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` (`pool`) and their `_ptsz`: from the pool
/// (`driver::mem_alloc_async`), owned by no context (they outlive it).
///
/// # Safety
/// `dptr` null or writable.
unsafe fn alloc_async(dptr: *mut CUdeviceptr, bytesize: usize, pool: Option<CUmemoryPool>, stream: CUstream) -> R {
    // A stream of any context: the stream names the device whose current pool is used.
    driver::current()?;
    driver::check_stream_ordered(h(stream))?;
    if dptr.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(graph) = driver::capturing_into(h(stream))? {
        // Captured: a memory allocation node of the capture's graph (its address fixed now,
        // its memory mapped from the device's graph pool at launch), nothing allocated.
        if bytesize == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ord = driver::async_alloc_ord(pool.map(h), h(stream))?;
        let (_, addr) = driver::graph_add_mem_alloc(graph, bytesize as u64, ord as i32)?;
        // SAFETY: checked non-null out-pointer.
        return unsafe { put(dptr, addr) };
    }
    // SAFETY: checked non-null out-pointer.
    unsafe { put(dptr, driver::mem_alloc_async(bytesize as u64, pool.map(h), h(stream))?) }
}

/// `cuStreamGetCtx_v2[_ptsz]`: the emulator has no green contexts, so a stream's context is
/// always a regular one, returned in `*pCtx` "and NULL in `pGreenCtx`" (cuda.h). Either
/// out-pointer null is refused (stricter than cuda.h says).
///
/// # Safety
/// `ctx` and `green` null or writable.
unsafe fn stream_ctx_v2(stream: CUstream, ctx: *mut CUcontext, green: *mut CUgreenCtx) -> R {
    if ctx.is_null() || green.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let c = driver::stream_ctx(h(stream))?;
    // SAFETY: both checked non-null; the caller's out-parameters.
    unsafe {
        *ctx = ptr(c);
        *green = std::ptr::null_mut();
    }
    Ok(())
}

/// `cuMemAllocHost_v2` / `cuMemHostAlloc`: `bytesize` bytes of host memory (plain `malloc`: the
/// emulator has no page-locking to do) in a context.
///
/// # Safety
/// `pp` null or writable.
unsafe fn host_alloc(pp: *mut *mut c_void, bytesize: usize) -> R {
    driver::current()?;
    if pp.is_null() || bytesize == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: malloc has no preconditions; a null answer is handled.
    let p = unsafe { libc::malloc(bytesize) };
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: checked non-null out-pointer.
    unsafe { put(pp, p) }
}

/// Whether a copy of `n` bytes between a host buffer (`host_null`: none) and device address
/// `dev` has anything to do, after its checks: nothing for 0 bytes, a host buffer and a device
/// range the driver knows, and an async copy (`stream`) waits for its stream's earlier work.
fn copy_ready(host_null: bool, dev: CUdeviceptr, n: usize, stream: Option<u64>) -> R<bool> {
    if n == 0 {
        return Ok(false);
    }
    if host_null || n > isize::MAX as usize {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    driver::check_device_range(dev, n as u64)?;
    if let Some(s) = stream {
        driver::sync_for_async(s)?;
    }
    Ok(true)
}

unsafe fn htod(dst: CUdeviceptr, src: *const c_void, n: usize, stream: Option<u64>) -> R {
    if !copy_ready(src.is_null(), dst, n, stream)? {
        return Ok(());
    }
    // SAFETY: the caller's host buffer holds `n` readable bytes.
    let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) };
    driver::memcpy_htod(dst, data, stream.is_none())
}

unsafe fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: Option<u64>) -> R {
    if !copy_ready(dst.is_null(), src, n, stream)? {
        return Ok(());
    }
    // SAFETY: the caller's host buffer has room for `n` bytes.
    let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), n) };
    driver::memcpy_dtoh(out, src)
}

/// Test instrumentation, not driver behaviour: a callback the next `cuCtxGetCurrent` runs once
/// before it answers. It stands in for another thread of the application acting between an
/// interposer's read of the caller's arguments and its call into the driver (the shim asks
/// for the current context in that window), a race a test cannot otherwise time.
static NEXT_CTX_GET_CURRENT_HOOK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn take_next_ctx_get_current_hook() -> Option<extern "C" fn()> {
    let f = NEXT_CTX_GET_CURRENT_HOOK.swap(0, std::sync::atomic::Ordering::AcqRel);
    // SAFETY: only `gpuemu_test_on_next_ctx_get_current` stores here, from an `extern "C" fn()`.
    (f != 0).then(|| unsafe { std::mem::transmute::<usize, extern "C" fn()>(f) })
}

/// Arms (or, with `None`, disarms) the callback the next `cuCtxGetCurrent` runs once (see
/// `NEXT_CTX_GET_CURRENT_HOOK`). Exported for the e2e test clients only.
#[no_mangle]
pub extern "C" fn gpuemu_test_on_next_ctx_get_current(f: Option<extern "C" fn()>) {
    NEXT_CTX_GET_CURRENT_HOOK.store(f.map_or(0, |f| f as usize), std::sync::atomic::Ordering::Release);
}
