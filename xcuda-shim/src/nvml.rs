//! NVML memory queries show the quota too: the real `nvmlDeviceGetMemoryInfo`/`_v2` (struct
//! layouts from nvml-wrapper-sys's published bindings) answered through the same memory view as
//! `cuMemGetInfo`.

use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicPtr, Ordering::*};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlReturn_t};

use crate::quota::Quota;

/// `nvmlDeviceGetMemoryInfo`'s C type.
pub type MemInfoFn = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
/// `nvmlDeviceGetMemoryInfo_v2`'s C type.
pub type MemInfoV2Fn = unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> nvmlReturn_t;

/// NVML_SUCCESS.
pub const NVML_SUCCESS: nvmlReturn_t = 0;
/// NVML_ERROR_FUNCTION_NOT_FOUND: the real library lacks the function.
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
/// NVML_ERROR_UNKNOWN.
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// NVML symbols we answer, with our implementations.
pub fn hook_for_symbol(name: &[u8]) -> Option<*mut c_void> {
    match name {
        b"nvmlDeviceGetMemoryInfo" => Some(crate::api::nvmlDeviceGetMemoryInfo as *const () as *mut c_void),
        b"nvmlDeviceGetMemoryInfo_v2" => Some(crate::api::nvmlDeviceGetMemoryInfo_v2 as *const () as *mut c_void),
        _ => None,
    }
}

static REAL_V1: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_V2: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn resolve(slot: &AtomicPtr<c_void>, symbol: &str) -> *mut c_void {
    let p = slot.load(Acquire);
    if !p.is_null() {
        return p;
    }
    let cfg = crate::state::config();
    let (Ok(lib), Ok(sym)) = (CString::new(cfg.real_libnvml.as_str()), CString::new(symbol)) else {
        return std::ptr::null_mut();
    };
    // SAFETY: NUL-terminated path; NOLOAD first (the application already loaded NVML).
    let mut h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        // SAFETY: as above.
        h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    }
    let Some(dlsym) = crate::real::dlsym_fn() else { return std::ptr::null_mut() };
    if h.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: live handle, NUL-terminated name, glibc's dlsym.
    let p = unsafe { dlsym(h, sym.as_ptr()) };
    if !p.is_null() && crate::real::is_in_object(p, b"libnvidia-ml") {
        slot.store(p, Release);
        return p;
    }
    std::ptr::null_mut()
}

/// The real `nvmlDeviceGetMemoryInfo`.
pub fn real_v1() -> Option<MemInfoFn> {
    let p = resolve(&REAL_V1, "nvmlDeviceGetMemoryInfo");
    // SAFETY: the real NVML function of that name has this C type (nvml.h).
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, MemInfoFn>(p) })
}

/// The real `nvmlDeviceGetMemoryInfo_v2`.
pub fn real_v2() -> Option<MemInfoV2Fn> {
    let p = resolve(&REAL_V2, "nvmlDeviceGetMemoryInfo_v2");
    // SAFETY: the real NVML function of that name has this C type (nvml.h).
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, MemInfoV2Fn>(p) })
}

static REAL_UUID: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `nvmlDeviceGetUUID`'s C type.
pub type UuidFn = unsafe extern "C" fn(nvmlDevice_t, *mut std::ffi::c_char, std::ffi::c_uint) -> nvmlReturn_t;

/// The UUID text of an NVML device (`GPU-...`), from the real NVML; `None` if it cannot say.
///
/// # Safety
/// `device` is passed to the real `nvmlDeviceGetUUID` as it is: it must be a handle the
/// caller may pass to NVML (one NVML gave out, as for any NVML call).
pub unsafe fn uuid_of(device: nvmlDevice_t) -> Option<String> {
    let p = resolve(&REAL_UUID, "nvmlDeviceGetUUID");
    if p.is_null() {
        return None;
    }
    // SAFETY: the real NVML function of that name has this C type (nvml.h).
    let f = unsafe { std::mem::transmute::<*mut c_void, UuidFn>(p) };
    // NVML_DEVICE_UUID_V2_BUFFER_SIZE is 96.
    let mut buf = [0 as std::ffi::c_char; 96];
    // SAFETY: a buffer of the length we pass; NVML NUL-terminates on success.
    if unsafe { f(device, buf.as_mut_ptr(), buf.len() as std::ffi::c_uint) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NUL-terminated by NVML within the buffer (its last byte is still 0).
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(s.to_string_lossy().into_owned())
}

/// Rewrites an NVML answer into the quota view: total = min(device, quota), used = the
/// container's usage, free = min(device free, quota - used).
pub fn apply(q: &Quota, total: &mut u64, free: &mut u64, used: &mut u64) {
    let (f, t) = crate::memory::view(q, *free, *total);
    *total = t;
    *free = f;
    *used = q.used().min(t);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_view_is_the_quota() {
        let q = Quota::local(1000);
        assert!(q.try_reserve(300));
        let (mut t, mut f, mut u) = (16_000u64, 15_000u64, 1_000u64);
        apply(&q, &mut t, &mut f, &mut u);
        assert_eq!((t, f, u), (1000, 700, 300));
        let (mut t, mut f, mut u) = (16_000u64, 100u64, 15_900u64);
        apply(&q, &mut t, &mut f, &mut u);
        assert_eq!((t, f, u), (1000, 100, 300), "device nearly full: free is the device's");
    }

    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(std::mem::size_of::<nvmlMemory_t>(), 24);
        assert_eq!(std::mem::size_of::<nvmlMemory_v2_t>(), 40);
        assert!(hook_for_symbol(b"nvmlDeviceGetMemoryInfo_v2").is_some());
        assert!(hook_for_symbol(b"nvmlInit_v2").is_none());
    }
}
