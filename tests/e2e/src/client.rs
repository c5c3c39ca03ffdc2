//! What the two scripted driver clients (`shim_client`, `emu-client`) share: the output lines
//! and the fatal exit, loading a driver library with `dlopen`, resolving typed driver
//! functions ([`Resolve`], [`get!`](crate::get)), the groups of functions both resolve, and the
//! spin kernel's launch parameters. Each client keeps its own way of resolving (`dlsym`,
//! `cuGetProcAddress_v2` with flags, the older `cuGetProcAddress`): that is what the tests
//! vary.

use std::ffi::{c_void, CString};
use std::io::Write;

use cuda_abi::*;

/// Prints `fatal=MSG` (what the tests look for) and exits with status 2.
pub fn die(msg: &str) -> ! {
    println!("fatal={msg}");
    std::process::exit(2)
}

/// Prints one result line and flushes it (the tests read it while the client runs on).
pub fn out(s: String) {
    println!("{s}");
    let _ = std::io::stdout().flush();
}

/// `dlopen(name, RTLD_NOW | RTLD_LOCAL)`, as applications load the driver; [`die`]s when it
/// fails.
pub fn dlopen(name: &str) -> *mut c_void {
    let c = CString::new(name).expect("no NUL");
    // SAFETY: dlopen with a valid C string.
    let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        die(&format!("dlopen {name} failed"));
    }
    lib
}

/// How a client resolves a driver function.
pub trait Resolve {
    /// The entry point of API `name` at ABI `version`; never null (a client [`die`]s when it
    /// cannot resolve one).
    fn resolve(&self, name: &str, version: std::os::raw::c_int) -> *mut c_void;
}

impl<T: Resolve + ?Sized> Resolve for &T {
    fn resolve(&self, name: &str, version: std::os::raw::c_int) -> *mut c_void {
        (**self).resolve(name, version)
    }
}

/// `get!(cu, "cuName", PFN_cuName_vN, N)`: resolves `cuName` through `cu` ([`Resolve`]) at the
/// CUDA version that introduced the ABI `PFN_cuName_vN` (the number in its name), so the
/// pointer always has the type it is cast to.
#[macro_export]
macro_rules! get {
    ($cu:expr, $name:literal, $ty:ty, $ver:literal) => {{
        let p = $crate::client::Resolve::resolve(&$cu, $name, $ver);
        // SAFETY: the entry for (name, version) has the ABI of the given PFN type per
        // cudaTypedefs.h (checked by cuda-abi's header test); `resolve` never returns null.
        #[allow(unused_unsafe)] // also used inside unsafe blocks
        let f = unsafe { std::mem::transmute::<*mut std::ffi::c_void, $ty>(p) };
        f
    }};
}

/// Structs of driver functions, each field resolved by name at its PFN type's version.
macro_rules! functions {
    ($($(#[$doc:meta])* $table:ident { $($field:ident: $ty:ident = $name:literal @ $ver:literal,)* })*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $table {
            $(#[doc = concat!("`", $name, "` (ABI of CUDA version ", stringify!($ver), ").")] pub $field: $ty,)*
        }

        impl $table {
            /// Resolves every function through `cu`.
            pub fn resolve(cu: &impl Resolve) -> Self {
                Self { $($field: get!(cu, $name, $ty, $ver),)* }
            }
        }
    )*};
}

functions! {
    /// Driver start-up and contexts.
    Contexts {
        init: PFN_cuInit_v2000 = "cuInit" @ 2000,
        create: PFN_cuCtxCreate_v3020 = "cuCtxCreate" @ 3020,
        destroy: PFN_cuCtxDestroy_v4000 = "cuCtxDestroy" @ 4000,
        retain: PFN_cuDevicePrimaryCtxRetain_v7000 = "cuDevicePrimaryCtxRetain" @ 7000,
        release: PFN_cuDevicePrimaryCtxRelease_v11000 = "cuDevicePrimaryCtxRelease" @ 11000,
        set_current: PFN_cuCtxSetCurrent_v4000 = "cuCtxSetCurrent" @ 4000,
        sync: PFN_cuCtxSynchronize_v2000 = "cuCtxSynchronize" @ 2000,
    }

    /// Plain device memory.
    Memory {
        alloc: PFN_cuMemAlloc_v3020 = "cuMemAlloc" @ 3020,
        free: PFN_cuMemFree_v3020 = "cuMemFree" @ 3020,
        info: PFN_cuMemGetInfo_v3020 = "cuMemGetInfo" @ 3020,
    }

    /// Loading a module and launching its kernels.
    Kernels {
        load: PFN_cuModuleLoadData_v2000 = "cuModuleLoadData" @ 2000,
        get_function: PFN_cuModuleGetFunction_v2000 = "cuModuleGetFunction" @ 2000,
        launch: PFN_cuLaunchKernel_v4000 = "cuLaunchKernel" @ 4000,
    }

    /// Events, for timing on the device.
    Events {
        create: PFN_cuEventCreate_v2000 = "cuEventCreate" @ 2000,
        record: PFN_cuEventRecord_v2000 = "cuEventRecord" @ 2000,
        elapsed: PFN_cuEventElapsedTime_v2000 = "cuEventElapsedTime" @ 2000,
    }
}

/// Which step of loading the spin kernel failed, with the driver's result.
#[derive(Debug, Clone, Copy)]
pub enum SpinLoad {
    /// `cuModuleLoadData` of [`workloads::ptx::SPIN_PTX`].
    Module(CUresult),
    /// `cuModuleGetFunction(.., "spin")`.
    Function(CUresult),
}

impl Kernels {
    /// Loads the spin kernel ([`workloads::ptx::SPIN_PTX`]) into the current context.
    ///
    /// # Safety
    /// The functions must be the driver's (as [`Kernels::resolve`] gives them).
    pub unsafe fn load_spin(&self) -> Result<CUfunction, SpinLoad> {
        let mut m: CUmodule = std::ptr::null_mut();
        // SAFETY: the caller's promise; the image is a NUL-terminated PTX string, the
        // out-pointers are locals.
        unsafe {
            let r = (self.load)(&mut m, workloads::ptx::SPIN_PTX.as_ptr().cast());
            if !r.is_success() {
                return Err(SpinLoad::Module(r));
            }
            let mut f: CUfunction = std::ptr::null_mut();
            let r = (self.get_function)(&mut f, m, c"spin".as_ptr());
            if !r.is_success() {
                return Err(SpinLoad::Function(r));
            }
            Ok(f)
        }
    }
}

/// `cuInit(0)` through `init`; [`die`]s (`fatal=cuInit RC`) when the driver refuses.
///
/// # Safety
/// `init` must be the driver's `cuInit`.
pub unsafe fn init_or_die(init: PFN_cuInit_v2000) {
    // SAFETY: the caller's promise; cuInit takes flags only.
    let r = unsafe { init(0) };
    if !r.is_success() {
        die(&format!("cuInit {r}"));
    }
}

/// The launch configuration of `blocks` blocks of 32 threads of the spin kernel on `stream`
/// (`cuLaunchKernelEx`).
pub fn spin_launch_config(blocks: u32, stream: CUstream) -> CUlaunchConfig {
    CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 32,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: std::ptr::null_mut(),
        numAttrs: 0,
    }
}

/// A graph kernel node running `spin` with `blocks` blocks of 32 threads and the kernel
/// parameters `params` (`cuGraphAddKernelNode`).
pub fn spin_node_params(spin: CUfunction, blocks: u32, params: *mut *mut c_void) -> CUDA_KERNEL_NODE_PARAMS {
    CUDA_KERNEL_NODE_PARAMS {
        func: spin,
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 32,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: params,
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}
