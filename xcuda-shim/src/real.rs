//! The real functions: glibc's `dlsym`/`sigaction`/`signal` and the older `signal`-shaped ones (found without going through our own
//! exports) and the real driver's entry points, each resolved once from the real `libcuda.so.1`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering::*};

use crate::interpose::{Sym, SYM_COUNT, SYM_NAMES};

/// `dlsym`'s C type.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
/// `sigaction`'s C type.
pub type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
/// `signal`'s C type.
pub type SignalFn = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Read by the x86-64 `dlsym` trampoline (see `interpose`); same value as the resolved dlsym.
pub static TRAMPOLINE_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc's own `dlsym`, found with `dlvsym` (which we do not export), so never ourselves.
pub fn dlsym_fn() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Acquire);
    if p.is_null() {
        for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated names; it does not call dlsym.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            return None;
        }
        REAL_DLSYM.store(p, Release);
        TRAMPOLINE_DLSYM.store(p, Release);
    }
    // SAFETY: p is glibc's dlsym, whose C type is DlsymFn.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// Looks `name` up after our library in the global lookup order (libc's own definition).
pub fn next_symbol(name: &CStr) -> *mut c_void {
    match dlsym_fn() {
        // SAFETY: glibc dlsym with RTLD_NEXT; called from our code, so "next" means after us.
        Some(d) => unsafe { d(libc::RTLD_NEXT, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

static REAL_SIGACTION: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_SIGNAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn cached(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let mut p = slot.load(Acquire);
    if p.is_null() {
        p = next_symbol(name);
        slot.store(p, Release);
    }
    p
}

/// libc's `sigaction`.
pub fn sigaction_fn() -> Option<SigactionFn> {
    let p = cached(&REAL_SIGACTION, c"sigaction");
    // SAFETY: non-null p is libc's sigaction, whose C type is SigactionFn.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, SigactionFn>(p) })
}

/// libc's `signal`.
pub fn signal_fn() -> Option<SignalFn> {
    let p = cached(&REAL_SIGNAL, c"signal");
    // SAFETY: non-null p is libc's signal, whose C type is SignalFn.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, SignalFn>(p) })
}

/// libc's other `signal`-shaped entry points, each resolved once.
#[derive(Debug, Clone, Copy)]
pub enum OldSignal {
    /// `bsd_signal` (XPG: `signal`'s BSD semantics).
    Bsd,
    /// `sysv_signal`: a one-shot handler, not masked while it runs.
    Sysv,
    /// `__sysv_signal`: what `signal` is redirected to in a strict-standards build (`-std=c11`).
    SysvInternal,
    /// `sigset` (System V; also `SIG_HOLD`).
    Sigset,
}

static REAL_OLD_SIGNAL: [AtomicPtr<c_void>; 4] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 4];

/// libc's `which`.
pub fn old_signal_fn(which: OldSignal) -> Option<SignalFn> {
    let name = match which {
        OldSignal::Bsd => c"bsd_signal",
        OldSignal::Sysv => c"sysv_signal",
        OldSignal::SysvInternal => c"__sysv_signal",
        OldSignal::Sigset => c"sigset",
    };
    let p = cached(&REAL_OLD_SIGNAL[which as usize], name);
    // SAFETY: non-null p is libc's function of that name, whose C type is SignalFn.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, SignalFn>(p) })
}

const UNRESOLVED: u8 = 0;
const RESOLVING: u8 = 1;
const RESOLVED: u8 = 2;
const FAILED: u8 = 3;

static DRIVER_STATE: AtomicU8 = AtomicU8::new(UNRESOLVED);
static DRIVER: [AtomicPtr<c_void>; SYM_COUNT] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SYM_COUNT];

/// The real driver's implementation of `sym` (null if the driver lacks it or cannot be loaded).
/// One atomic load once resolved.
#[inline]
pub fn driver(sym: Sym) -> *mut c_void {
    if DRIVER_STATE.load(Acquire) != RESOLVED {
        resolve_driver();
    }
    DRIVER[sym as usize].load(Relaxed)
}

#[cold]
fn resolve_driver() {
    match DRIVER_STATE.compare_exchange(UNRESOLVED, RESOLVING, AcqRel, Acquire) {
        Ok(_) => {}
        Err(RESOLVING) => {
            while DRIVER_STATE.load(Acquire) == RESOLVING {
                std::hint::spin_loop();
            }
            return;
        }
        Err(_) => return,
    }
    let ok = crate::state::logged(load_driver);
    DRIVER_STATE.store(if ok { RESOLVED } else { FAILED }, Release);
}

fn load_driver() -> bool {
    let cfg = crate::state::config();
    let Ok(path) = CString::new(cfg.real_libcuda.as_str()) else {
        tracing::error!(path = %cfg.real_libcuda, "real driver path has a NUL byte");
        return false;
    };
    // SAFETY: NUL-terminated path; dlopen has no other preconditions.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        tracing::error!(path = %cfg.real_libcuda, "cannot load the real CUDA driver");
        return false;
    }
    let Some(dlsym) = dlsym_fn() else { return false };
    let own = own_object_base();
    for (i, name) in SYM_NAMES.iter().enumerate() {
        let Ok(c) = CString::new(*name) else { continue };
        // SAFETY: valid handle from dlopen, NUL-terminated name, glibc's real dlsym.
        let p = unsafe { dlsym(h, c.as_ptr()) };
        if !p.is_null() && object_base(p) == own {
            tracing::error!(symbol = name, "real driver resolved to libxcuda itself; refusing");
            continue;
        }
        DRIVER[i].store(p, Relaxed);
    }
    tracing::debug!(path = %cfg.real_libcuda, "real driver resolved");
    true
}

fn object_base(p: *const c_void) -> usize {
    // SAFETY: Dl_info is plain data; dladdr only reads the address and fills the struct.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::dladdr(p, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

/// Load base of libxcuda itself.
pub fn own_object_base() -> usize {
    object_base(own_object_base as *const c_void)
}

/// Whether `p` lies in a shared object whose file name contains `libcuda` (and is not us).
pub(crate) fn is_in_driver(p: *const c_void) -> bool {
    is_in_object(p, b"libcuda")
}

/// Whether `p` lies in a shared object (not us) whose file name contains `needle`.
pub(crate) fn is_in_object(p: *const c_void, needle: &[u8]) -> bool {
    // SAFETY: as in `object_base`.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as in `object_base`.
    if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    if info.dli_fbase as usize == own_object_base() {
        return false;
    }
    // SAFETY: dladdr set dli_fname to a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    name.windows(needle.len()).any(|w| w == needle)
}


/// Installs in-process stand-ins for driver entry points instead of loading a library
/// (benchmarks and tests that measure the shim against a stub in the same process).
#[doc(hidden)]
pub fn install_stub_driver(entries: &[(Sym, *mut c_void)]) {
    for (s, p) in entries {
        DRIVER[*s as usize].store(*p, Relaxed);
    }
    DRIVER_STATE.store(RESOLVED, Release);
}
