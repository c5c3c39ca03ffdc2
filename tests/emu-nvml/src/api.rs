//! The exported C surface of `libnvidia-ml.so.1`: each entry checks its pointers, calls the
//! safe layer (`state`, `metrics`) and writes results; no panic crosses the ABI (`entry`).
//! Signatures and types are nvml-wrapper-sys's bindings of NVIDIA's `nvml.h`.

#![allow(non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use nvml_wrapper_sys::bindings::*;

use crate::metrics::{ratio, Point};
use crate::source;
use crate::state::{self, NvmlResult};

/// Driver version string the emulated host reports.
pub const DRIVER_VERSION: &str = "550.54.15";
/// NVML library version string.
pub const NVML_VERSION: &str = "12.550.54.15";
/// CUDA driver API version (`cuDriverGetVersion` form).
pub const CUDA_DRIVER_VERSION: c_int = 12040;
/// `gpuInstanceId`/`computeInstanceId` when MIG is off (nvml.h: 0xFFFFFFFF).
const NO_MIG: c_uint = 0xFFFF_FFFF;

/// A 0..=1 fraction as a whole percentage.
fn pct(frac: f64) -> c_uint {
    (frac.clamp(0.0, 1.0) * 100.0).round() as c_uint
}

fn entry(f: impl FnOnce() -> NvmlResult<()>) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => nvmlReturn_enum_NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
    }
}

/// Writes through an out pointer, INVALID_ARGUMENT when it is null.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> NvmlResult<()> {
    if p.is_null() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid per the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` and a NUL into `buf[..len]`; INSUFFICIENT_SIZE when it does not fit.
///
/// # Safety
/// `buf` is null or valid for `len` bytes of writes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> NvmlResult<()> {
    if buf.is_null() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: buf holds at least s.len() + 1 bytes (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    entry(state::init)
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    entry(state::init)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    entry(state::init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    entry(state::shutdown)
}

/// `nvmlErrorString`: static text for each return code.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match result {
        nvmlReturn_enum_NVML_SUCCESS => c"Success",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: caller passes a buffer of `length` bytes.
    entry(|| unsafe { put_str(version, length, DRIVER_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: caller passes a buffer of `length` bytes.
    entry(|| unsafe { put_str(version, length, NVML_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: caller passes a valid int pointer.
    entry(|| unsafe { put(v, CUDA_DRIVER_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: caller passes a valid int pointer.
    entry(|| unsafe { put(v, CUDA_DRIVER_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(count, state::device_count()?) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(count, state::device_count()?) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(device, state::handle(index)?) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(device, state::handle(index)?) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(|| {
        if uuid.is_null() {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null, NUL-terminated per the NVML contract.
        let want = unsafe { CStr::from_ptr(uuid) }
            .to_string_lossy()
            .into_owned();
        for i in 0..state::device_count()? {
            let h = state::handle(i)?;
            if state::with_facts(h, |f| f.uuid == want)? {
                // SAFETY: caller passes a valid pointer.
                return unsafe { put(device, h) };
            }
        }
        Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(index, state::index(device)?) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let n = state::with_facts(device, |f| f.name.clone())?;
        // SAFETY: caller passes a buffer of `length` bytes.
        unsafe { put_str(name, length, &n) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let u = state::with_facts(device, |f| f.uuid.clone())?;
        // SAFETY: caller passes a buffer of `length` bytes.
        unsafe { put_str(uuid, length, &u) }
    })
}

/// `gpu`: percent of the device's last sample window (`emu_device::SNAPSHOT_WINDOW_NS`) with a
/// kernel running; `memory`: percent of the window the memory was read or written, modelled as
/// the same busy fraction scaled by memory occupancy.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    entry(|| {
        let u = state::with_reading(device, |s, _| {
            let gpu = pct(s.gpu_util);
            let mem_frac = if s.memory_total == 0 {
                0.0
            } else {
                s.memory_used as f64 / s.memory_total as f64
            };
            nvmlUtilization_t {
                gpu,
                memory: (f64::from(gpu) * mem_frac).round() as c_uint,
            }
        })?;
        // SAFETY: caller passes a valid pointer.
        unsafe { put(utilization, u) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    entry(|| {
        // Live, as the driver answers it: an allocation shows at once.
        let (total, used) = state::with_device(device, |d| d.memory())?;
        let m = nvmlMemory_t {
            total,
            used: used.min(total),
            free: total.saturating_sub(used),
        };
        // SAFETY: caller passes a valid pointer.
        unsafe { put(memory, m) }
    })
}

/// `nvmlMemory_v2` = NVML_STRUCT_VERSION(Memory, 2) (nvml.h).
const MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() | (2 << 24)) as c_uint;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    entry(|| {
        if memory.is_null() {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller owns a nvmlMemory_v2_t whose version field it set.
        if unsafe { (*memory).version } != MEMORY_V2 {
            return Err(nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = state::with_device(device, |d| d.memory())?;
        let m = nvmlMemory_v2_t {
            version: MEMORY_V2,
            total,
            reserved: 0,
            used: used.min(total),
            free: total.saturating_sub(used),
        };
        // SAFETY: checked non-null above.
        unsafe { put(memory, m) }
    })
}

fn clock(device: nvmlDevice_t, ty: nvmlClockType_t, max: bool) -> NvmlResult<c_uint> {
    let sm = matches!(
        ty,
        nvmlClockType_enum_NVML_CLOCK_GRAPHICS | nvmlClockType_enum_NVML_CLOCK_SM
    );
    if sm && !max {
        // The only live value: the rest are the card's fixed facts.
        return state::with_device(device, |d| d.sm_clock_mhz());
    }
    state::with_facts(device, |f| match ty {
        _ if sm => Ok(f.max_sm_clock_mhz),
        nvmlClockType_enum_NVML_CLOCK_MEM => Ok(f.mem_clock_mhz),
        nvmlClockType_enum_NVML_CLOCK_VIDEO => Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        _ => Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
    })?
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    ty: nvmlClockType_t,
    clock_mhz: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(clock_mhz, clock(device, ty, false)?) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    ty: nvmlClockType_t,
    clock_mhz: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(clock_mhz, clock(device, ty, true)?) })
}

/// The compute mode the device is in (`nvidia-smi -q`'s "Compute Mode").
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut nvmlComputeMode_t,
) -> nvmlReturn_t {
    entry(|| {
        let m = state::with_device(device, |d| d.compute_mode())?;
        // SAFETY: caller passes a valid pointer.
        unsafe { put(mode, m as nvmlComputeMode_t) }
    })
}

/// Sets the compute mode, as `nvidia-smi -c` does: root only (NO_PERMISSION otherwise),
/// EXCLUSIVE_THREAD is NOT_SUPPORTED (support removed), an unknown mode INVALID_ARGUMENT; new
/// contexts obey it at once (`emu_device::Device::set_compute_mode`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(
    device: nvmlDevice_t,
    mode: nvmlComputeMode_t,
) -> nvmlReturn_t {
    entry(|| {
        state::with_device(device, |d| d.set_compute_mode(mode))?.map_err(|e| match e {
            emu_device::EmuError::NoPermission(_) => nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
            emu_device::EmuError::NotSupported(_) => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
            emu_device::EmuError::InvalidValue(_) => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
            _ => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
        })
    })
}

/// Why the clocks are below their maximum (bit mask of `nvmlClocksEventReason*`): `GpuIdle`
/// while no kernel runs, `SwPowerCap` while load holds the SM clock under its boost.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(reasons, state::with_device(device, |d| d.clock_event_reasons())?) })
}

/// The deprecated name of [`nvmlDeviceGetCurrentClocksEventReasons`] (same values; NVML keeps
/// both, and nvml-wrapper 0.13 calls this one).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded unchanged; the caller's pointer contract is the same.
    unsafe { nvmlDeviceGetCurrentClocksEventReasons(device, reasons) }
}

/// Power model: 10% of the board limit at idle plus 90% scaled by GPU utilization.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power_mw: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let p = state::with_reading(device, |s, f| {
            (f64::from(f.power_limit_mw) * (0.1 + 0.9 * s.gpu_util)).round() as c_uint
        })?;
        // SAFETY: caller passes a valid pointer.
        unsafe { put(power_mw, p) }
    })
}

/// Temperature model: 30 °C idle, up to 80 °C at full utilization.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        let t = state::with_reading(device, |s, _| 30 + pct(s.gpu_util) / 2)?;
        // SAFETY: caller passes a valid pointer.
        unsafe { put(temp, t) }
    })
}

/// The size-query protocol shared by the running-process calls: a too-small `*count`
/// (including 0 with a null array) gets INSUFFICIENT_SIZE and the needed count.
///
/// # Safety
/// `count` is null or valid; `infos` is null or valid for `*count` elements.
unsafe fn processes<T>(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: fn(u32, u64) -> T,
) -> NvmlResult<()> {
    if count.is_null() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    let procs = state::with_device(device, |d| d.compute_processes())?;
    // SAFETY: count is non-null and valid.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = procs.len() as c_uint };
    if procs.is_empty() {
        return Ok(());
    }
    if cap < procs.len() {
        return Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if infos.is_null() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    for (i, (pid, mem)) in procs.into_iter().enumerate() {
        // SAFETY: i < procs.len() <= cap, the caller's array length.
        unsafe { infos.add(i).write(make(pid, mem)) };
    }
    Ok(())
}

fn info_v2(pid: u32, mem: u64) -> nvmlProcessInfo_v2_t {
    nvmlProcessInfo_v2_t {
        pid,
        usedGpuMemory: mem,
        gpuInstanceId: NO_MIG,
        computeInstanceId: NO_MIG,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: NVML contract: count valid, infos holds *count elements.
    entry(|| unsafe { processes(device, count, infos, info_v2) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    // SAFETY: NVML contract: count valid, infos holds *count elements.
    entry(|| unsafe { processes(device, count, infos, info_v2) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    // SAFETY: NVML contract: count valid, infos holds *count elements.
    entry(|| unsafe {
        processes(device, count, infos, |pid, mem| nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: mem,
        })
    })
}

/// `nvmlDeviceGetSamples` for GPU utilization (percent per interval) and SM clock (MHz)
/// samples, from the points this process has seen; a null `samples` asks for the buffer size.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    device: nvmlDevice_t,
    ty: nvmlSamplingType_t,
    last_seen_us: c_ulonglong,
    val_type: *mut nvmlValueType_t,
    count: *mut c_uint,
    samples: *mut nvmlSample_t,
) -> nvmlReturn_t {
    entry(|| {
        if count.is_null() || val_type.is_null() {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        let value: fn(&Point, &Point) -> f64 = match ty {
            nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES => {
                |a, b| ratio(a, b, |p| p.busy_ns).unwrap_or(0.0) * 100.0
            }
            nvmlSamplingType_enum_NVML_PROCESSOR_CLK_SAMPLES => |_, b| f64::from(b.sm_clock_mhz),
            _ => return Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        };
        // SAFETY: checked non-null; NVML contract.
        unsafe { *val_type = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT };
        if samples.is_null() {
            // The size query: room for the whole ring (the device is checked, nothing read).
            state::with_device(device, |_| ())?;
            // SAFETY: checked non-null.
            unsafe { *count = emu_device::layout::RING_LEN as c_uint };
            return Ok(());
        }
        let got = state::with_device(device, |d| {
            crate::metrics::samples(&source::samples(d, last_seen_us), last_seen_us, value)
        })?;
        if got.is_empty() {
            // SAFETY: checked non-null.
            unsafe { *count = 0 };
            return Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
        }
        // SAFETY: checked non-null.
        let cap = unsafe { *count } as usize;
        let newest = &got[got.len().saturating_sub(cap)..];
        for (i, (ts, v)) in newest.iter().enumerate() {
            let sample = nvmlSample_t {
                timeStamp: *ts,
                sampleValue: nvmlValue_t {
                    uiVal: v.round() as c_uint,
                },
            };
            // SAFETY: i < cap, the caller's array length.
            unsafe { samples.add(i).write(sample) };
        }
        // SAFETY: checked non-null.
        unsafe { *count = newest.len() as c_uint };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    entry(|| {
        if support.is_null() {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller set the version field.
        if unsafe { (*support).version } != NVML_GPM_SUPPORT_VERSION {
            return Err(nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let ok = state::with_facts(device, |f| f.cc_major >= 9)?;
        // SAFETY: non-null, checked above.
        unsafe { (*support).isSupportedDevice = c_uint::from(ok) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    entry(|| {
        state::check_init()?;
        let id = crate::gpm::alloc()?;
        // SAFETY: caller passes a valid pointer.
        unsafe { put(sample, id as nvmlGpmSample_t) }
    })
}

#[no_mangle]
pub extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    entry(|| crate::gpm::free(sample as usize))
}

#[no_mangle]
pub extern "C" fn nvmlGpmSampleGet(device: nvmlDevice_t, sample: nvmlGpmSample_t) -> nvmlReturn_t {
    entry(|| {
        state::with_shared(device, |sh, i| {
            if sh.facts[i].cc_major < 9 {
                return Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
            }
            // The device's snapshot of this refresh period (emu_device::GPM_REFRESH_NS), the
            // same for every process: the difference of two samples is the measurement, and
            // within one period there is none.
            let p = source::point(&sh.devices[i].gpm_counters());
            crate::gpm::fill_in(sh, sample as usize, i as u32, p)
        })?
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    entry(|| {
        if request.is_null() {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller owns a full nvmlGpmMetricsGet_t.
        let req = unsafe { &mut *request };
        if req.version != NVML_GPM_METRICS_GET_VERSION {
            return Err(nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        crate::gpm::metrics_get(req)
    })
}

// ---- XID event sets (see `events`) ----

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(set, crate::events::create()?) })
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    entry(|| crate::events::free(set))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, types: *mut c_ulonglong) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe {
        state::index(device)?;
        put(types, crate::events::SUPPORTED)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, types: c_ulonglong, set: nvmlEventSet_t) -> nvmlReturn_t {
    entry(|| crate::events::register(device, types, set))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeoutms: c_uint) -> nvmlReturn_t {
    // SAFETY: caller passes a valid pointer.
    entry(|| unsafe { put(data, crate::events::wait(set, timeoutms)?) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeoutms: c_uint) -> nvmlReturn_t {
    // SAFETY: forwarding the caller's arguments.
    unsafe { nvmlEventSetWait_v2(set, data, timeoutms) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::{null, null_mut};

    /// The tests share the library's global state (init count, devices): one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh emulated H100 for this test process (`GPUEMU_STATE` under a directory named
    /// after `name`, which the test removes at its end); call with [`serial`] held.
    fn fresh_h100(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("emu-nvml-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::env::set_var("GPUEMU_STATE", dir.join("gpu.state"));
        std::env::set_var("GPUEMU_PROFILE", "h100");
        dir
    }

    /// `nvmlInit_v2` and GPU 0's handle (both must succeed).
    fn init_gpu0() -> nvmlDevice_t {
        // SAFETY: the handle's out-pointer is a live local.
        unsafe {
            assert_eq!(nvmlInit_v2(), nvmlReturn_enum_NVML_SUCCESS);
            let mut dev: nvmlDevice_t = std::ptr::null_mut();
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut dev), nvmlReturn_enum_NVML_SUCCESS);
            dev
        }
    }

    /// An XID event set delivers the XIDs reported after its registration, one per wait, in
    /// order; waits time out when there is none; other event types are not supported; a freed
    /// or bogus set is refused.
    #[test]
    fn an_xid_event_set_delivers_what_the_device_reports_after_registration() {
        let _one = serial();
        let dir = fresh_h100("xid");
        // SAFETY: every pointer passed points at a live local of the type written.
        unsafe {
            let dev = init_gpu0();
            let report = |code| state::with_device(dev, |d| d.report_xid(code, 0)).unwrap();
            if libc::geteuid() != 0 {
                assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
                return;
            }
            report(48).unwrap();
            let mut set: nvmlEventSet_t = null_mut();
            assert_eq!(nvmlEventSetCreate(&mut set), nvmlReturn_enum_NVML_SUCCESS);
            let mut types: c_ulonglong = 0;
            assert_eq!(nvmlDeviceGetSupportedEventTypes(dev, &mut types), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(types, nvmlEventTypeXidCriticalError as c_ulonglong);
            assert_eq!(
                nvmlDeviceRegisterEvents(dev, nvmlEventTypeAll as c_ulonglong, set),
                nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
            );
            assert_eq!(
                nvmlDeviceRegisterEvents(dev, nvmlEventTypeXidCriticalError as c_ulonglong, set),
                nvmlReturn_enum_NVML_SUCCESS
            );
            let mut e: nvmlEventData_t = std::mem::zeroed();
            assert_eq!(nvmlEventSetWait_v2(set, &mut e, 0), nvmlReturn_enum_NVML_ERROR_TIMEOUT, "the XID before registration is not delivered");
            report(79).unwrap();
            report(43).unwrap();
            for code in [79, 43] {
                assert_eq!(nvmlEventSetWait_v2(set, &mut e, 1000), nvmlReturn_enum_NVML_SUCCESS);
                assert_eq!((e.device, e.eventType, e.eventData), (dev, nvmlEventTypeXidCriticalError as c_ulonglong, code));
                assert_eq!((e.gpuInstanceId, e.computeInstanceId), (NO_MIG, NO_MIG));
            }
            assert_eq!(nvmlEventSetWait_v2(set, &mut e, 5), nvmlReturn_enum_NVML_ERROR_TIMEOUT);
            assert_eq!(nvmlEventSetFree(set), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(nvmlEventSetFree(set), nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
            assert_eq!(nvmlEventSetWait_v2(set, &mut e, 0), nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
            assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
        }
        std::fs::remove_dir_all(dir).ok();
    }

    /// Memory in use and the process list are live, as the driver reports them: an
    /// allocation and a new context show in the very next query, even one made right after
    /// another query (counters such as the SM clock may be answered from a reading up to
    /// `SNAPSHOT_REUSE` old; these never are).
    #[test]
    fn memory_and_processes_are_live_after_an_allocation() {
        let _one = serial();
        let dir = fresh_h100("live");
        // SAFETY: every pointer passed points at a live local of the type written.
        unsafe {
            let dev = init_gpu0();
            let query = |dev| {
                let mut m: nvmlMemory_t = std::mem::zeroed();
                assert_eq!(nvmlDeviceGetMemoryInfo(dev, &mut m), nvmlReturn_enum_NVML_SUCCESS);
                let mut n: c_uint = 8;
                let mut infos: [nvmlProcessInfo_t; 8] = std::mem::zeroed();
                assert_eq!(
                    nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut n, infos.as_mut_ptr()),
                    nvmlReturn_enum_NVML_SUCCESS
                );
                let pids: Vec<u32> = infos[..n as usize].iter().map(|p| p.pid).collect();
                (m.used, pids)
            };
            let (used0, pids0) = query(dev);
            let me = std::process::id();
            assert!(!pids0.contains(&me));
            let c = state::with_device(dev, |d| {
                let c = d.attach().unwrap();
                d.context_created(&c, None).unwrap();
                d.alloc(&c, 64 << 20, 512).unwrap();
                c
            })
            .unwrap();
            let (used1, pids1) = query(dev);
            let ctx = emu_device::profile::H100.context_bytes();
            assert_eq!(used1, used0 + ctx + (64 << 20), "memory in use (the context's too) is live");
            assert!(pids1.contains(&me), "the new context is listed: {pids1:?}");
            state::with_device(dev, |d| d.detach(&c)).unwrap();
            let (used2, pids2) = query(dev);
            assert_eq!((used2, pids2), (used0, pids0), "and gone at once");
            assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The compute mode through NVML: DEFAULT on a new device; set by root (the tests' user
    /// here; a non-root caller gets NO_PERMISSION, checked in a child process that drops to
    /// nobody), read back, and the device's numbers are NVML's. EXCLUSIVE_THREAD is refused
    /// as its support was removed; an unknown mode is an invalid argument.
    #[test]
    fn the_compute_mode_is_read_and_set_with_nvmls_numbers_and_rules() {
        use emu_device::layout::compute_mode as cm;
        assert_eq!(cm::DEFAULT, nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT);
        assert_eq!(cm::EXCLUSIVE_THREAD, nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD);
        assert_eq!(cm::PROHIBITED, nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED);
        assert_eq!(cm::EXCLUSIVE_PROCESS, nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
        let _one = serial();
        let dir = fresh_h100("compute-mode");
        // SAFETY: every pointer passed points at a live local of the type written.
        unsafe {
            let dev = init_gpu0();
            let get = |dev| {
                let mut m: nvmlComputeMode_t = 99;
                assert_eq!(nvmlDeviceGetComputeMode(dev, &mut m), nvmlReturn_enum_NVML_SUCCESS);
                m
            };
            assert_eq!(get(dev), nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT);
            assert_eq!(nvmlDeviceGetComputeMode(dev, null_mut()), nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
            if libc::geteuid() == 0 {
                let set = nvmlDeviceSetComputeMode(dev, nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
                assert_eq!(set, nvmlReturn_enum_NVML_SUCCESS);
                assert_eq!(get(dev), nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
                let thread = nvmlDeviceSetComputeMode(dev, nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD);
                assert_eq!(thread, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
                assert_eq!(nvmlDeviceSetComputeMode(dev, 7), nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
                assert_eq!(get(dev), nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, "refusals change nothing");
                // A non-root process (a forked child as nobody) is refused.
                let pid = libc::fork();
                assert!(pid >= 0);
                if pid == 0 {
                    let ok = libc::setgid(65534) == 0 && libc::setuid(65534) == 0;
                    let r = nvmlDeviceSetComputeMode(dev, nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT);
                    libc::_exit(if ok && r == nvmlReturn_enum_NVML_ERROR_NO_PERMISSION { 0 } else { 1 });
                }
                let mut status = 0;
                assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "nobody must get NO_PERMISSION");
                assert_eq!(get(dev), nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
            } else {
                let r = nvmlDeviceSetComputeMode(dev, nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
                assert_eq!(r, nvmlReturn_enum_NVML_ERROR_NO_PERMISSION);
            }
            assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What a monitor asks at every sample on a quiet device (GPM sample and metrics, memory,
    /// SM clock, the process list) is answered without a single system call: no lock of the
    /// state file (real NVML's own cost is its driver's; the emulator's should not add to it).
    /// Where the kernel offers no syscall counter the count is skipped, the values still
    /// checked.
    #[test]
    fn per_sample_queries_make_no_system_call_on_a_quiet_device() {
        let _one = serial();
        let dir = fresh_h100("quiet");
        // SAFETY: every pointer passed points at a live local of the type written.
        unsafe {
            let dev = init_gpu0();
            let (mut a, mut b): (nvmlGpmSample_t, nvmlGpmSample_t) = (null_mut(), null_mut());
            assert_eq!(nvmlGpmSampleAlloc(&mut a), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(nvmlGpmSampleAlloc(&mut b), nvmlReturn_enum_NVML_SUCCESS);
            // Whoever touched the device last left it settled; one locked read to be sure.
            state::with_device(dev, |d| d.reading_locked()).unwrap();
            let mut req: Box<nvmlGpmMetricsGet_t> = Box::new(std::mem::zeroed());
            let sample = |s| {
                assert_eq!(nvmlGpmSampleGet(dev, s), nvmlReturn_enum_NVML_SUCCESS);
                let mut m: nvmlMemory_t = std::mem::zeroed();
                assert_eq!(nvmlDeviceGetMemoryInfo(dev, &mut m), nvmlReturn_enum_NVML_SUCCESS);
                let mut clk = 0;
                assert_eq!(
                    nvmlDeviceGetClockInfo(dev, nvmlClockType_enum_NVML_CLOCK_SM, &mut clk),
                    nvmlReturn_enum_NVML_SUCCESS
                );
                let mut n: c_uint = 0;
                assert_eq!(
                    nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut n, null_mut()),
                    nvmlReturn_enum_NVML_SUCCESS
                );
                (m.total, clk)
            };
            let counter = emu_device::syscalls::SyscallCounter::open();
            let before = counter.as_ref().map(|c| c.get());
            for i in 0..100 {
                let (s1, s2) = if i % 2 == 0 { (a, b) } else { (b, a) };
                let (total, clk) = sample(s2);
                assert!(total > 0 && clk > 0);
                req.version = NVML_GPM_METRICS_GET_VERSION;
                req.numMetrics = 1;
                req.sample1 = s1;
                req.sample2 = s2;
                req.metrics[0].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
                if i > 0 {
                    assert_eq!(nvmlGpmMetricsGet(&mut *req), nvmlReturn_enum_NVML_SUCCESS);
                    assert_eq!(req.metrics[0].value, 0.0, "idle device");
                }
            }
            if let (Some(c), Some(b)) = (&counter, before) {
                // The counter's own read is the one system call between the two counts.
                assert_eq!(c.get() - b, 1, "system calls made by 100 monitor samples");
            } else {
                eprintln!("no syscall counter on this kernel: count not checked");
            }
            assert_eq!(nvmlGpmSampleFree(a), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(nvmlGpmSampleFree(b), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// GPM counters refresh once a period ([`emu_device::GPM_REFRESH_NS`]), as the driver's do (an
    /// H200 with driver 580: at 10 ms sampling under full load 1 reading in ~100 gave 99.8 %,
    /// the rest 0): two samples within one period are the same snapshot, SM utilization 0
    /// between them; across a refresh the busy device reads busy.
    #[test]
    fn gpm_samples_within_one_refresh_period_are_the_same_snapshot() {
        let _one = serial();
        let dir = fresh_h100("gpmrefresh");
        let period = emu_device::GPM_REFRESH_NS;
        // SAFETY: every pointer passed points at a live local of the type written.
        unsafe {
            assert_eq!(nvmlInit_v2(), nvmlReturn_enum_NVML_SUCCESS);
            let mut dev: nvmlDevice_t = null_mut();
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut dev), nvmlReturn_enum_NVML_SUCCESS);
            // Every SM busy for about 3.8 s.
            let c = state::with_device(dev, |d| {
                let c = d.attach().unwrap();
                d.context_created(&c, None).unwrap();
                d.launch(&c, emu_device::Launch { blocks: 132, cycles_per_block: 6_000_000_000, after: 0 }).unwrap();
                c
            })
            .unwrap();
            let (mut a, mut b, mut z) = (null_mut(), null_mut(), null_mut());
            for s in [&mut a, &mut b, &mut z] {
                assert_eq!(nvmlGpmSampleAlloc(s), nvmlReturn_enum_NVML_SUCCESS);
            }
            let sm_util = |s1, s2| {
                let mut req: Box<nvmlGpmMetricsGet_t> = Box::new(std::mem::zeroed());
                req.version = NVML_GPM_METRICS_GET_VERSION;
                req.numMetrics = 1;
                req.sample1 = s1;
                req.sample2 = s2;
                req.metrics[0].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
                assert_eq!(nvmlGpmMetricsGet(&mut *req), nvmlReturn_enum_NVML_SUCCESS);
                req.metrics[0].value
            };
            // The snapshot is the device's counters at the period's boundary: from the next
            // one on, every snapshot is taken under load.
            let launched = emu_device::now_ns() / period;
            while emu_device::now_ns() / period == launched {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            // Two samples 20 ms apart in one period (tried again if a refresh fell between).
            let same = (0..5).find_map(|_| {
                let t0 = emu_device::now_ns();
                assert_eq!(nvmlGpmSampleGet(dev, a), nvmlReturn_enum_NVML_SUCCESS);
                std::thread::sleep(std::time::Duration::from_millis(20));
                assert_eq!(nvmlGpmSampleGet(dev, b), nvmlReturn_enum_NVML_SUCCESS);
                let t1 = emu_device::now_ns();
                (t0 / period == t1 / period).then(|| sm_util(a, b))
            });
            assert_eq!(same, Some(0.0), "two samples of one refresh period: the same snapshot");
            // One sample a period later spans a refresh: the busy device reads busy.
            std::thread::sleep(std::time::Duration::from_nanos(period + period / 10));
            assert_eq!(nvmlGpmSampleGet(dev, z), nvmlReturn_enum_NVML_SUCCESS);
            let busy = sm_util(a, z);
            assert!(busy > 90.0, "across a refresh under full load: {busy} %");
            for s in [a, b, z] {
                assert_eq!(nvmlGpmSampleFree(s), nvmlReturn_enum_NVML_SUCCESS);
            }
            state::with_device(dev, |d| d.detach(&c)).unwrap();
            assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The C surface called as a careless or hostile caller would: null pointers, handles it
    /// never got, short buffers, wrong struct versions, calls before init and after shutdown.
    /// Every one is answered with an NVML error code; nothing crashes.
    #[test]
    fn hostile_calls_get_error_codes() {
        let _one = serial();
        let dir = fresh_h100("unit");
        // SAFETY: every pointer passed is null on purpose or points at a live local of the
        // type the entry point writes; that is what the test exercises.
        unsafe {
            let mut n: c_uint = 0;
            assert_eq!(
                nvmlDeviceGetCount_v2(&mut n),
                nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
            );
            assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
            assert_eq!(nvmlInit_v2(), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(
                nvmlDeviceGetCount_v2(null_mut()),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(nvmlDeviceGetCount_v2(&mut n), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(n, 1);
            let mut dev: nvmlDevice_t = null_mut();
            assert_eq!(
                nvmlDeviceGetHandleByIndex_v2(1, &mut dev),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetHandleByIndex_v2(0, &mut dev),
                nvmlReturn_enum_NVML_SUCCESS
            );
            let bogus = 0x1234usize as nvmlDevice_t;
            let mut name = [0 as c_char; 96];
            assert_eq!(
                nvmlDeviceGetName(bogus, name.as_mut_ptr(), 96),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetName(dev, name.as_mut_ptr(), 4),
                nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
            );
            assert_eq!(
                nvmlDeviceGetName(dev, null_mut(), 96),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetName(dev, name.as_mut_ptr(), 96),
                nvmlReturn_enum_NVML_SUCCESS
            );
            assert!(CStr::from_ptr(name.as_ptr())
                .to_str()
                .unwrap()
                .contains("H100"));
            assert_eq!(
                nvmlDeviceGetHandleByUUID(null(), &mut dev),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetHandleByUUID(c"GPU-nope".as_ptr(), &mut dev),
                nvmlReturn_enum_NVML_ERROR_NOT_FOUND
            );

            let mut m2: nvmlMemory_v2_t = std::mem::zeroed();
            assert_eq!(
                nvmlDeviceGetMemoryInfo_v2(dev, &mut m2),
                nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            );
            m2.version = MEMORY_V2;
            assert_eq!(
                nvmlDeviceGetMemoryInfo_v2(dev, &mut m2),
                nvmlReturn_enum_NVML_SUCCESS
            );
            assert_eq!(m2.total, m2.used + m2.free);
            let mut clk = 0;
            assert_eq!(
                nvmlDeviceGetClockInfo(dev, 77, &mut clk),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            let mut t = 0;
            assert_eq!(
                nvmlDeviceGetTemperature(dev, 9, &mut t),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );

            let mut count: c_uint = 0;
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v3(dev, null_mut(), null_mut()),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut count, null_mut()),
                nvmlReturn_enum_NVML_SUCCESS
            );
            assert_eq!(count, 0);

            let mut vt: nvmlValueType_t = 0;
            let mut sc: c_uint = 0;
            assert_eq!(
                nvmlDeviceGetSamples(dev, 99, 0, &mut vt, &mut sc, null_mut()),
                nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
            );
            assert_eq!(
                nvmlDeviceGetSamples(
                    dev,
                    nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES,
                    0,
                    null_mut(),
                    &mut sc,
                    null_mut()
                ),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );

            let mut sup: nvmlGpmSupport_t = std::mem::zeroed();
            assert_eq!(
                nvmlGpmQueryDeviceSupport(dev, &mut sup),
                nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            );
            assert_eq!(
                nvmlGpmSampleFree(0xdead as nvmlGpmSample_t),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            let mut s1: nvmlGpmSample_t = null_mut();
            assert_eq!(nvmlGpmSampleAlloc(&mut s1), nvmlReturn_enum_NVML_SUCCESS);
            let mut req: Box<nvmlGpmMetricsGet_t> = Box::new(std::mem::zeroed());
            req.version = NVML_GPM_METRICS_GET_VERSION;
            req.numMetrics = 1;
            req.sample1 = s1;
            req.sample2 = s1;
            assert_eq!(
                nvmlGpmMetricsGet(&mut *req),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
                "unfilled sample"
            );
            req.numMetrics = 100_000;
            assert_eq!(
                nvmlGpmMetricsGet(&mut *req),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlGpmMetricsGet(null_mut()),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(nvmlGpmSampleFree(s1), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(
                nvmlGpmSampleFree(s1),
                nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
                "double free"
            );

            let mut buf = [0 as c_char; 4];
            assert_eq!(
                nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 4),
                nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
            );
            assert!(!nvmlErrorString(12345).is_null());
            assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
            assert_eq!(
                nvmlDeviceGetName(dev, name.as_mut_ptr(), 96),
                nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
