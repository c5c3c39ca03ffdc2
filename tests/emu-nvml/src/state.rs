//! Library-wide state: the init reference count, device handles, this process's metric
//! history per device, and live GPM samples.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::*;

use emu_device::Device;

use emu_device::Reading;

use crate::metrics::Point;
use crate::source::{self, Facts};

/// Most devices this library can hand out handles for (the emulator has one per state file;
/// `GPUEMU_STATE` may list several, a multi-GPU host).
pub const MAX_DEVICES: usize = 16;

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
/// Handles are addresses inside this array; never dereferenced by anyone.
static HANDLE_BASE: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

/// Mutable state behind one lock (queries are not on any hot path).
pub struct Shared {
    /// The emulated host's devices (NVML order = the order `GPUEMU_STATE` lists them), opened
    /// at the first successful init. NVML ignores `CUDA_VISIBLE_DEVICES`, as the real one does.
    pub devices: Vec<Device>,
    /// Live GPM samples: (id, (device, point) once filled), looked up by a linear scan (a
    /// monitor holds two; no hashing at every sample).
    pub gpm: Vec<(usize, Option<(u32, Point)>)>,
    /// Next GPM sample id (never 0, so handles are never null).
    pub next_gpm: usize,
    /// Per device: its fixed facts, read once at init.
    pub facts: Vec<Facts>,
    /// Per device: the last reading and when it was taken (see [`SNAPSHOT_REUSE`]).
    pub cache: Vec<Option<(Instant, Reading)>>,
}

/// How long one device reading answers further utilization-window queries (utilization rates,
/// power, temperature): they share one model update, as a real driver answers them from
/// counters it samples itself. Memory and the SM clock are read live each time
/// (`emu_device::Device::counters`, lock-free while the model runs on unchanged), GPM samples
/// copy the device's snapshot of the current refresh period (`Device::gpm_counters`); process
/// lists and utilization samples are always read afresh.
pub const SNAPSHOT_REUSE: Duration = Duration::from_micros(500);

static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

/// Locks the shared state (a poisoned lock is recovered: the data stays consistent because
/// every update is a single insert or remove).
pub fn shared() -> MutexGuard<'static, Option<Shared>> {
    SHARED.lock().unwrap_or_else(|p| p.into_inner())
}

/// NVML result type for the safe layer.
pub type NvmlResult<T> = Result<T, nvmlReturn_t>;

/// `nvmlInit*`: opens the emulated device (DRIVER_NOT_LOADED when the environment names
/// none), then counts one more user.
pub fn init() -> NvmlResult<()> {
    let mut g = shared();
    if g.is_none() {
        let devices = source::open_all().map_err(|_| nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED)?;
        if devices.len() > MAX_DEVICES {
            return Err(nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED);
        }
        *g = Some(Shared {
            cache: devices.iter().map(|_| None).collect(),
            facts: devices.iter().map(|d| Facts::of(&d.info())).collect(),
            devices,
            gpm: Vec::new(),
            next_gpm: 1,
        });
    }
    INIT_COUNT.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// `nvmlShutdown`: one user fewer; UNINITIALIZED when there was none.
pub fn shutdown() -> NvmlResult<()> {
    INIT_COUNT
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .map(|_| ())
        .map_err(|_| nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)
}

/// UNINITIALIZED unless `nvmlInit` succeeded more often than `nvmlShutdown` ran.
pub fn check_init() -> NvmlResult<()> {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        Err(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)
    } else {
        Ok(())
    }
}

/// Number of devices (after init).
pub fn device_count() -> NvmlResult<u32> {
    check_init()?;
    let g = shared();
    let sh = g.as_ref().ok_or(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
    Ok(sh.devices.len() as u32)
}

/// The handle of device `index`.
pub fn handle(index: u32) -> NvmlResult<nvmlDevice_t> {
    if index >= device_count()? {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(HANDLE_BASE.as_ptr().wrapping_add(index as usize) as nvmlDevice_t)
}

/// The index behind a handle, or INVALID_ARGUMENT for anything we did not hand out.
pub fn index(dev: nvmlDevice_t) -> NvmlResult<u32> {
    check_init()?;
    let base = HANDLE_BASE.as_ptr() as usize;
    let off = (dev as usize).wrapping_sub(base);
    if off >= MAX_DEVICES || off as u32 >= device_count()? {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(off as u32)
}

/// The shared state and the index of the device behind `dev`, handed to `f` under one lock
/// (UNINITIALIZED before init, INVALID_ARGUMENT for a handle we never handed out).
pub fn with_shared<T>(dev: nvmlDevice_t, f: impl FnOnce(&mut Shared, usize) -> T) -> NvmlResult<T> {
    check_init()?;
    let mut g = shared();
    let sh = g.as_mut().ok_or(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
    let off = (dev as usize).wrapping_sub(HANDLE_BASE.as_ptr() as usize);
    if off >= MAX_DEVICES || off >= sh.devices.len() {
        return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(f(sh, off))
}

/// The fixed facts of the device behind `dev`, handed to `f`.
pub fn with_facts<T>(dev: nvmlDevice_t, f: impl FnOnce(&Facts) -> T) -> NvmlResult<T> {
    with_shared(dev, |sh, i| f(&sh.facts[i]))
}

/// A reading of the device behind `dev` (at most [`SNAPSHOT_REUSE`] old), handed to `f` with
/// the device's facts.
pub fn with_reading<T>(dev: nvmlDevice_t, f: impl FnOnce(&Reading, &Facts) -> T) -> NvmlResult<T> {
    with_shared(dev, |sh, i| {
        let r = reading(sh, i);
        f(&r, &sh.facts[i])
    })
}

/// Device `i`'s reading: the cached one when it is younger than [`SNAPSHOT_REUSE`], else
/// taken now (and cached).
pub fn reading(sh: &mut Shared, i: usize) -> Reading {
    let now = Instant::now();
    match sh.cache[i] {
        Some((at, r)) if now.duration_since(at) < SNAPSHOT_REUSE => r,
        _ => {
            let r = sh.devices[i].reading();
            sh.cache[i] = Some((now, r));
            r
        }
    }
}

/// The device behind `dev`, handed to `f` (memory, process lists and samples, read live).
pub fn with_device<T>(dev: nvmlDevice_t, f: impl FnOnce(&Device) -> T) -> NvmlResult<T> {
    with_shared(dev, |sh, i| f(&sh.devices[i]))
}
