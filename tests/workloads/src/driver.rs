//! Loads the CUDA driver the way real clients do: `dlopen("libcuda.so.1")`, `dlsym` only
//! `cuGetProcAddress_v2`, and every other entry point through it by (name, CUDA version).
//!
//! Signatures follow NVIDIA's `cudaTypedefs.h` (`PFN_<name>_v<version>`), for the variant that
//! `cuGetProcAddress_v2` hands out when asked with [`REQUESTED_CUDA_VERSION`].

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::fmt;

/// `CUresult` (cuda.h: `typedef enum cudaError_enum`, an `int`-sized enum).
pub type CuResult = c_int;
/// `CUdevice_v1` (cuda.h: `typedef int CUdevice_v1`).
pub type CuDevice = c_int;
/// `CUdeviceptr_v2` (cuda.h: `typedef unsigned long long CUdeviceptr_v2`).
pub type CuDevicePtr = u64;
/// Opaque handles (`CUcontext`, `CUmodule`, `CUfunction`, `CUstream` are pointers).
pub type Handle = *mut c_void;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_NOT_FOUND`.
pub const CUDA_ERROR_NOT_FOUND: CuResult = 500;
/// `CU_DEVICE_ATTRIBUTE_CLOCK_RATE` (kHz).
pub const ATTR_CLOCK_RATE: c_int = 13;
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
/// `CU_GET_PROC_ADDRESS_DEFAULT`.
const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
/// `CU_GET_PROC_ADDRESS_SUCCESS` (`CUdriverProcAddressQueryResult`).
const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;

/// The CUDA version these clients claim to be built for (12.0): it selects the `_v2` memory
/// and copy entry points, `cuDevicePrimaryCtxRelease_v2` and the 4000 `cuLaunchKernel`.
pub const REQUESTED_CUDA_VERSION: c_int = 12000;

/// `PFN_cuGetProcAddress_v12000`.
type GetProcAddressFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;
type InitFn = unsafe extern "C" fn(c_uint) -> CuResult;
type DriverGetVersionFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type GetErrorNameFn = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;
type DeviceGetCountFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type DeviceGetFn = unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult;
type DeviceGetNameFn = unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult;
type DeviceGetAttributeFn = unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult;
type PrimaryCtxRetainFn = unsafe extern "C" fn(*mut Handle, CuDevice) -> CuResult;
type PrimaryCtxReleaseFn = unsafe extern "C" fn(CuDevice) -> CuResult;
type CtxSetCurrentFn = unsafe extern "C" fn(Handle) -> CuResult;
type CtxSynchronizeFn = unsafe extern "C" fn() -> CuResult;
type ModuleLoadDataFn = unsafe extern "C" fn(*mut Handle, *const c_void) -> CuResult;
type ModuleUnloadFn = unsafe extern "C" fn(Handle) -> CuResult;
type ModuleGetFunctionFn = unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CuResult;
type MemAllocFn = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
type MemFreeFn = unsafe extern "C" fn(CuDevicePtr) -> CuResult;
type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult;
type MemcpyHtoDFn = unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult;
type MemcpyDtoHFn = unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult;
/// `PFN_cuLaunchKernel_v4000`.
type LaunchKernelFn = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;

/// A failed driver call: which call, and the `CUresult` with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CuError {
    /// The driver function (or loading step) that failed.
    pub call: String,
    /// The raw `CUresult` (0 when loading failed before any call).
    pub code: CuResult,
    /// `cuGetErrorName`'s answer, or a description when the driver could not say.
    pub name: String,
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.code == 0 {
            write!(f, "{}: {}", self.call, self.name)
        } else {
            write!(f, "{} failed: {} ({})", self.call, self.name, self.code)
        }
    }
}

impl std::error::Error for CuError {}

/// The resolved driver entry points. The library stays loaded for the life of this value.
pub struct Driver {
    _lib: libloading::Library,
    get_error_name: Option<GetErrorNameFn>,
    init: InitFn,
    driver_get_version: DriverGetVersionFn,
    device_get_count: DeviceGetCountFn,
    device_get: DeviceGetFn,
    device_get_name: DeviceGetNameFn,
    device_get_attribute: DeviceGetAttributeFn,
    primary_ctx_retain: PrimaryCtxRetainFn,
    primary_ctx_release: PrimaryCtxReleaseFn,
    ctx_set_current: CtxSetCurrentFn,
    ctx_synchronize: CtxSynchronizeFn,
    module_load_data: ModuleLoadDataFn,
    module_unload: ModuleUnloadFn,
    module_get_function: ModuleGetFunctionFn,
    mem_alloc: MemAllocFn,
    mem_free: MemFreeFn,
    mem_get_info: MemGetInfoFn,
    memcpy_htod: MemcpyHtoDFn,
    memcpy_dtoh: MemcpyDtoHFn,
    launch_kernel: LaunchKernelFn,
}

/// libloading's message with the loader's own reason (`dlerror`) appended.
fn lib_error(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(why) => format!("{e}: {why}"),
        None => e.to_string(),
    }
}

fn load_error(call: &str, why: String) -> CuError {
    CuError { call: call.to_string(), code: 0, name: why }
}

/// Resolves `name` through `cuGetProcAddress_v2` and casts it to the function type `F`.
///
/// # Safety
/// `F` must be the `PFN_` signature that the driver returns for `name` at
/// [`REQUESTED_CUDA_VERSION`] with default flags.
unsafe fn resolve<F: Copy>(gpa: GetProcAddressFn, name: &str) -> Result<F, CuError> {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    let cname = CString::new(name).expect("entry point names have no NUL");
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = -1;
    // SAFETY: gpa is cuGetProcAddress_v2 (PFN_cuGetProcAddress_v12000); all pointers are valid
    // for the duration of the call.
    let rc = unsafe {
        gpa(cname.as_ptr(), &mut pfn, REQUESTED_CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &mut status)
    };
    if rc != CUDA_SUCCESS || pfn.is_null() || status != CU_GET_PROC_ADDRESS_SUCCESS {
        return Err(CuError {
            call: format!("cuGetProcAddress_v2(\"{name}\", {REQUESTED_CUDA_VERSION})"),
            code: if rc == CUDA_SUCCESS { CUDA_ERROR_NOT_FOUND } else { rc },
            name: format!("symbol status {status}, the driver does not provide {name}"),
        });
    }
    // SAFETY: pfn is non-null and, per this function's contract, has the signature F, which is
    // a function pointer type of pointer size (checked above).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&pfn) })
}

impl Driver {
    /// Opens `libcuda.so.1` (or `$WORKLOADS_LIBCUDA` when set) and resolves every entry point.
    pub fn load() -> Result<Self, CuError> {
        let path = std::env::var_os("WORKLOADS_LIBCUDA").unwrap_or_else(|| "libcuda.so.1".into());
        // SAFETY: loading the CUDA driver runs its initialisers, which is what every CUDA
        // client does; we trust the library found on the loader path as they do.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| load_error("dlopen", format!("cannot load {}: {}", path.to_string_lossy(), lib_error(&e))))?;
        // SAFETY: the symbol has the PFN_cuGetProcAddress_v12000 signature in cuda.h.
        let gpa: GetProcAddressFn = unsafe {
            *lib.get::<GetProcAddressFn>(b"cuGetProcAddress_v2\0").map_err(|e| {
                load_error("dlsym", format!("cuGetProcAddress_v2 missing from {}: {}", path.to_string_lossy(), lib_error(&e)))
            })?
        };
        // SAFETY (every resolve below): each type alias is the PFN_ typedef for that name at
        // CUDA 12.0 (cudaTypedefs.h), which is what cuGetProcAddress_v2 returns for 12000.
        unsafe {
            Ok(Driver {
                get_error_name: resolve(gpa, "cuGetErrorName").ok(),
                init: resolve(gpa, "cuInit")?,
                driver_get_version: resolve(gpa, "cuDriverGetVersion")?,
                device_get_count: resolve(gpa, "cuDeviceGetCount")?,
                device_get: resolve(gpa, "cuDeviceGet")?,
                device_get_name: resolve(gpa, "cuDeviceGetName")?,
                device_get_attribute: resolve(gpa, "cuDeviceGetAttribute")?,
                primary_ctx_retain: resolve(gpa, "cuDevicePrimaryCtxRetain")?,
                primary_ctx_release: resolve(gpa, "cuDevicePrimaryCtxRelease")?,
                ctx_set_current: resolve(gpa, "cuCtxSetCurrent")?,
                ctx_synchronize: resolve(gpa, "cuCtxSynchronize")?,
                module_load_data: resolve(gpa, "cuModuleLoadData")?,
                module_unload: resolve(gpa, "cuModuleUnload")?,
                module_get_function: resolve(gpa, "cuModuleGetFunction")?,
                mem_alloc: resolve(gpa, "cuMemAlloc")?,
                mem_free: resolve(gpa, "cuMemFree")?,
                mem_get_info: resolve(gpa, "cuMemGetInfo")?,
                memcpy_htod: resolve(gpa, "cuMemcpyHtoD")?,
                memcpy_dtoh: resolve(gpa, "cuMemcpyDtoH")?,
                launch_kernel: resolve(gpa, "cuLaunchKernel")?,
                _lib: lib,
            })
        }
    }

    /// The `CUresult` name (`CUDA_ERROR_OUT_OF_MEMORY`), from the driver itself.
    pub fn error_name(&self, code: CuResult) -> String {
        let Some(f) = self.get_error_name else { return format!("CUresult {code}") };
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: valid out pointer; the driver returns a static string or an error.
        let rc = unsafe { f(code, &mut p) };
        if rc != CUDA_SUCCESS || p.is_null() {
            return format!("unknown CUresult {code}");
        }
        // SAFETY: cuGetErrorName returns a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, call: &str, rc: CuResult) -> Result<(), CuError> {
        if rc == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CuError { call: call.to_string(), code: rc, name: self.error_name(rc) })
        }
    }

    /// `cuInit(0)`.
    pub fn init(&self) -> Result<(), CuError> {
        // SAFETY: plain value argument.
        self.check("cuInit", unsafe { (self.init)(0) })
    }

    /// `cuDriverGetVersion`.
    pub fn driver_version(&self) -> Result<i32, CuError> {
        let mut v = 0;
        // SAFETY: valid out pointer.
        self.check("cuDriverGetVersion", unsafe { (self.driver_get_version)(&mut v) })?;
        Ok(v)
    }

    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<i32, CuError> {
        let mut n = 0;
        // SAFETY: valid out pointer.
        self.check("cuDeviceGetCount", unsafe { (self.device_get_count)(&mut n) })?;
        Ok(n)
    }

    /// `cuDeviceGet(ordinal)`.
    pub fn device(&self, ordinal: i32) -> Result<CuDevice, CuError> {
        let mut d = 0;
        // SAFETY: valid out pointer.
        self.check("cuDeviceGet", unsafe { (self.device_get)(&mut d, ordinal) })?;
        Ok(d)
    }

    /// `cuDeviceGetName`.
    pub fn device_name(&self, dev: CuDevice) -> Result<String, CuError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: buf is writable for its full length, which we pass.
        self.check("cuDeviceGetName", unsafe {
            (self.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, dev)
        })?;
        buf[buf.len() - 1] = 0;
        // SAFETY: buf is NUL-terminated (forced above).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// `cuDeviceGetAttribute`.
    pub fn device_attribute(&self, dev: CuDevice, attr: c_int) -> Result<i32, CuError> {
        let mut v = 0;
        // SAFETY: valid out pointer.
        self.check("cuDeviceGetAttribute", unsafe { (self.device_get_attribute)(&mut v, attr, dev) })?;
        Ok(v)
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub fn primary_ctx_retain(&self, dev: CuDevice) -> Result<Handle, CuError> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        self.check("cuDevicePrimaryCtxRetain", unsafe { (self.primary_ctx_retain)(&mut ctx, dev) })?;
        Ok(ctx)
    }

    /// `cuDevicePrimaryCtxRelease_v2`.
    pub fn primary_ctx_release(&self, dev: CuDevice) -> Result<(), CuError> {
        // SAFETY: plain value argument.
        self.check("cuDevicePrimaryCtxRelease", unsafe { (self.primary_ctx_release)(dev) })
    }

    /// `cuCtxSetCurrent`.
    pub fn ctx_set_current(&self, ctx: Handle) -> Result<(), CuError> {
        // SAFETY: ctx came from the driver (or is null, which unbinds).
        self.check("cuCtxSetCurrent", unsafe { (self.ctx_set_current)(ctx) })
    }

    /// `cuCtxSynchronize`.
    pub fn ctx_synchronize(&self) -> Result<(), CuError> {
        // SAFETY: no arguments.
        self.check("cuCtxSynchronize", unsafe { (self.ctx_synchronize)() })
    }

    /// `cuModuleLoadData` with a NUL-terminated PTX image.
    pub fn module_load_ptx(&self, ptx: &CStr) -> Result<Handle, CuError> {
        let mut m = std::ptr::null_mut();
        // SAFETY: ptx is a NUL-terminated image that outlives the call.
        self.check("cuModuleLoadData", unsafe { (self.module_load_data)(&mut m, ptx.as_ptr().cast()) })?;
        Ok(m)
    }

    /// `cuModuleUnload`.
    pub fn module_unload(&self, m: Handle) -> Result<(), CuError> {
        // SAFETY: m came from cuModuleLoadData.
        self.check("cuModuleUnload", unsafe { (self.module_unload)(m) })
    }

    /// `cuModuleGetFunction`.
    pub fn module_get_function(&self, m: Handle, name: &CStr) -> Result<Handle, CuError> {
        let mut f = std::ptr::null_mut();
        // SAFETY: m came from cuModuleLoadData; name is NUL-terminated.
        self.check("cuModuleGetFunction", unsafe { (self.module_get_function)(&mut f, m, name.as_ptr()) })?;
        Ok(f)
    }

    /// `cuMemAlloc_v2`.
    pub fn mem_alloc(&self, bytes: usize) -> Result<CuDevicePtr, CuError> {
        let mut p = 0;
        // SAFETY: valid out pointer.
        self.check("cuMemAlloc", unsafe { (self.mem_alloc)(&mut p, bytes) })?;
        Ok(p)
    }

    /// `cuMemFree_v2`.
    pub fn mem_free(&self, p: CuDevicePtr) -> Result<(), CuError> {
        // SAFETY: p came from cuMemAlloc.
        self.check("cuMemFree", unsafe { (self.mem_free)(p) })
    }

    /// `cuMemGetInfo_v2`: (free, total) bytes.
    pub fn mem_get_info(&self) -> Result<(usize, usize), CuError> {
        let (mut free, mut total) = (0, 0);
        // SAFETY: valid out pointers.
        self.check("cuMemGetInfo", unsafe { (self.mem_get_info)(&mut free, &mut total) })?;
        Ok((free, total))
    }

    /// `cuMemcpyHtoD_v2` of a whole host slice.
    pub fn memcpy_htod(&self, dst: CuDevicePtr, src: &[u8]) -> Result<(), CuError> {
        // SAFETY: src is readable for src.len() bytes.
        self.check("cuMemcpyHtoD", unsafe { (self.memcpy_htod)(dst, src.as_ptr().cast(), src.len()) })
    }

    /// `cuMemcpyDtoH_v2` filling a whole host slice.
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: CuDevicePtr) -> Result<(), CuError> {
        // SAFETY: dst is writable for dst.len() bytes.
        self.check("cuMemcpyDtoH", unsafe { (self.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len()) })
    }

    /// `cuLaunchKernel` on the default stream with `kernelParams` (one pointer per parameter).
    pub fn launch(
        &self,
        f: Handle,
        grid: [u32; 3],
        block: [u32; 3],
        params: &mut [*mut c_void],
    ) -> Result<(), CuError> {
        // SAFETY: f came from cuModuleGetFunction; params holds one valid pointer per kernel
        // parameter, alive for the call (the driver copies the values at launch).
        self.check("cuLaunchKernel", unsafe {
            (self.launch_kernel)(
                f,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
