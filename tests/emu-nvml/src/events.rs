//! NVML event sets for XIDs (`nvmlEventTypeXidCriticalError`): what a real driver delivers when
//! it logs an Xid. The emulated device keeps the last XIDs it reported (`Device::report_xid`,
//! `gpuemu xid`, and the XID 31 of each client an MPS server tears down); a set registered on a
//! device delivers those reported after its registration, one per wait, in order.
//!
//! As nvml.h documents them: `nvmlDeviceRegisterEvents` is NOT_SUPPORTED for event types the
//! device does not support (here every type but XIDs: the emulator has no ECC, P-state or clock
//! events), `nvmlEventSetWait_v2` returns TIMEOUT when nothing arrives within `timeoutms`, and
//! the data names the device, the type and the XID code, with both MIG instance ids
//! 0xFFFFFFFF (no MIG).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::*;

use crate::state::{self, NvmlResult};

/// The event types an emulated device delivers.
pub const SUPPORTED: u64 = nvmlEventTypeXidCriticalError as u64;

/// One device registered in a set: its index and the XID count it has delivered up to.
struct Reg {
    index: u32,
    seen: u64,
}

/// Live sets by id (the handle the caller holds is the id: a bogus handle is refused, never
/// dereferenced).
struct Sets {
    next: usize,
    live: BTreeMap<usize, Vec<Reg>>,
}

static SETS: Mutex<Sets> = Mutex::new(Sets { next: 1, live: BTreeMap::new() });

fn sets() -> MutexGuard<'static, Sets> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `nvmlEventSetCreate`: a new, empty set.
pub fn create() -> NvmlResult<nvmlEventSet_t> {
    state::check_init()?;
    let mut s = sets();
    let id = s.next;
    s.next += 1;
    s.live.insert(id, Vec::new());
    Ok(id as nvmlEventSet_t)
}

/// `nvmlEventSetFree`.
pub fn free(set: nvmlEventSet_t) -> NvmlResult<()> {
    sets().live.remove(&(set as usize)).map(|_| ()).ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
}

/// `nvmlDeviceRegisterEvents`: `types` of `dev` delivered through `set` from now on.
pub fn register(dev: nvmlDevice_t, types: u64, set: nvmlEventSet_t) -> NvmlResult<()> {
    let index = state::index(dev)?;
    if types & !SUPPORTED != 0 {
        return Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
    }
    let seen = state::with_device(dev, |d| d.xid_count())?;
    let mut s = sets();
    let regs = s.live.get_mut(&(set as usize)).ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
    if types == 0 {
        return Ok(());
    }
    match regs.iter_mut().find(|r| r.index == index) {
        Some(r) => r.seen = r.seen.max(seen),
        None => regs.push(Reg { index, seen }),
    }
    Ok(())
}

/// The next undelivered XID of `set`'s devices, if any (advances the set past it).
fn next(set: nvmlEventSet_t) -> NvmlResult<Option<nvmlEventData_t>> {
    let mut s = sets();
    let regs = s.live.get_mut(&(set as usize)).ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
    for r in regs.iter_mut() {
        let dev = state::handle(r.index)?;
        let (n, xids) = state::with_device(dev, |d| d.xids_after(r.seen))?;
        if let Some(x) = xids.first() {
            // Events older than the device's ring are lost (a bounded queue, as NVML's is).
            r.seen = n - xids.len() as u64 + 1;
            return Ok(Some(nvmlEventData_t {
                device: dev,
                eventType: SUPPORTED,
                eventData: x.code,
                gpuInstanceId: 0xFFFF_FFFF,
                computeInstanceId: 0xFFFF_FFFF,
            }));
        }
        r.seen = n;
    }
    Ok(None)
}

/// `nvmlEventSetWait_v2`: the next event of `set`, waiting up to `timeout_ms` for one.
pub fn wait(set: nvmlEventSet_t, timeout_ms: u32) -> NvmlResult<nvmlEventData_t> {
    state::check_init()?;
    let until = Instant::now() + Duration::from_millis(timeout_ms.into());
    loop {
        if let Some(e) = next(set)? {
            return Ok(e);
        }
        if Instant::now() >= until {
            return Err(nvmlReturn_enum_NVML_ERROR_TIMEOUT);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
