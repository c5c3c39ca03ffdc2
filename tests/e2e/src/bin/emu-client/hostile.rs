//! The `hostile` step: bad arguments of every kind, each of which must get an error code and
//! leave the process (and the driver) working.

use super::Cuda;
use cuda_abi::*;
use e2e::client::{Events, Kernels, Memory};
use std::ffi::c_void;

/// Runs the battery; returns `(case, rc)` pairs.
///
/// # Safety
/// `cu` must be a loaded, initialised driver with a current context.
pub unsafe fn run(cu: &Cuda) -> Vec<(&'static str, u32)> {
    let mut out = Vec::new();
    // SAFETY: functions resolved at their PFN's version; every pointer passed is either null on
    // purpose, a local, or a bogus *handle* value the driver must reject without dereferencing.
    unsafe {
        let Memory {
            alloc,
            free,
            info: minfo,
        } = Memory::resolve(cu);
        let Kernels {
            load,
            get_function: get_fn,
            launch,
        } = Kernels::resolve(cu);
        let Events {
            create: ecreate,
            elapsed,
            ..
        } = Events::resolve(cu);
        let htod = get!(cu, "cuMemcpyHtoD", PFN_cuMemcpyHtoD_v3020, 3020);
        let dtoh = get!(cu, "cuMemcpyDtoH", PFN_cuMemcpyDtoH_v3020, 3020);
        let ssync = get!(
            cu,
            "cuStreamSynchronize",
            PFN_cuStreamSynchronize_v2000,
            2000
        );
        let cdestroy = get!(cu, "cuCtxDestroy", PFN_cuCtxDestroy_v4000, 4000);
        let ename = get!(cu, "cuGetErrorName", PFN_cuGetErrorName_v6000, 6000);
        let dget = get!(cu, "cuDeviceGet", PFN_cuDeviceGet_v2000, 2000);
        let gpa = get!(cu, "cuGetProcAddress", PFN_cuGetProcAddress_v12000, 12000);
        let create = get!(cu, "cuMemCreate", PFN_cuMemCreate_v10020, 10020);

        let mut p: CUdeviceptr = 0;
        let mut buf = [0u8; 64];
        let bogus = 0xdead_beef_usize as *mut c_void;
        out.push(("alloc-null-out", alloc(std::ptr::null_mut(), 1).0));
        out.push(("alloc-zero", alloc(&mut p, 0).0));
        out.push(("free-unknown", free(0xdead_beef).0));
        out.push(("htod-unknown", htod(0xdead_beef, buf.as_ptr().cast(), 16).0));
        let mut ok: CUdeviceptr = 0;
        alloc(&mut ok, 32);
        out.push(("dtoh-past-end", dtoh(buf.as_mut_ptr().cast(), ok, 64).0));
        out.push(("double-free-first", free(ok).0));
        out.push(("double-free-second", free(ok).0));
        let mut m: CUmodule = std::ptr::null_mut();
        out.push((
            "load-garbage",
            load(&mut m, c"not a module at all".as_ptr().cast()).0,
        ));
        out.push(("load-null", load(&mut m, std::ptr::null()).0));
        let mut f: CUfunction = std::ptr::null_mut();
        out.push((
            "getfn-bad-module",
            get_fn(&mut f, bogus.cast(), c"spin".as_ptr()).0,
        ));
        let launch_rc = launch(
            bogus.cast(),
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        out.push(("launch-bad-function", launch_rc.0));
        out.push(("sync-bad-stream", ssync(bogus.cast()).0));
        out.push(("destroy-bad-ctx", cdestroy(bogus.cast()).0));
        let mut s: *const std::os::raw::c_char = std::ptr::null();
        out.push(("errname-unknown", ename(CUresult(12345), &mut s).0));
        out.push((
            "meminfo-null",
            minfo(std::ptr::null_mut(), std::ptr::null_mut()).0,
        ));
        let mut d: CUdevice = 0;
        out.push(("device-7", dget(&mut d, 7).0));
        let (mut e0, mut e1): (CUevent, CUevent) = (std::ptr::null_mut(), std::ptr::null_mut());
        ecreate(&mut e0, 0);
        ecreate(&mut e1, 0);
        let mut ms = 0f32;
        out.push(("elapsed-unrecorded", elapsed(&mut ms, e0, e1).0));
        let mut q = CUdriverProcAddressQueryResult(0);
        let mut fp: *mut c_void = std::ptr::null_mut();
        out.push((
            "procaddr-null-name",
            gpa(std::ptr::null(), &mut fp, 12000, 0, &mut q).0,
        ));
        let mut h: CUmemGenericAllocationHandle = 0;
        out.push((
            "memcreate-null-prop",
            create(&mut h, 2 << 20, std::ptr::null(), 0).0,
        ));
        // Host allocations take only the three documented flags.
        let host_alloc = get!(cu, "cuMemHostAlloc", PFN_cuMemHostAlloc_v2020, 2020);
        let free_host = get!(cu, "cuMemFreeHost", PFN_cuMemFreeHost_v2000, 2000);
        let mut hp: *mut c_void = std::ptr::null_mut();
        out.push(("hostalloc-unknown-flag", host_alloc(&mut hp, 4096, 0x80).0));
        let r = host_alloc(&mut hp, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
        out.push(("hostalloc-documented-flags", r.0));
        if r.is_success() {
            free_host(hp);
        }
        // A virtual range larger than the address space: out of memory, not a wrapped address.
        let reserve = get!(cu, "cuMemAddressReserve", PFN_cuMemAddressReserve_v10020, 10020);
        let mut va: CUdeviceptr = 0;
        out.push(("reserve-past-address-space", reserve(&mut va, 1 << 62, 0, 0, 0).0));
        // Array extents past the device's limits, or describing no array type (cuda.h's
        // table): refused with INVALID_VALUE, whatever memory is free.
        let a3d = get!(cu, "cuArray3DCreate", PFN_cuArray3DCreate_v3020, 3020);
        let a2d = get!(cu, "cuArrayCreate", PFN_cuArrayCreate_v3020, 3020);
        let adestroy = get!(cu, "cuArrayDestroy", PFN_cuArrayDestroy_v2000, 2000);
        let desc3 = |w: usize, h: usize, d: usize, flags: u32| CUDA_ARRAY3D_DESCRIPTOR {
            Width: w,
            Height: h,
            Depth: d,
            Format: CUarray_format::CU_AD_FORMAT_FLOAT,
            NumChannels: 1,
            Flags: flags,
        };
        let mut arr: CUarray = std::ptr::null_mut();
        out.push(("array3d-past-3d-limit", a3d(&mut arr, &desc3(16_385, 16, 16, 0)).0));
        out.push(("array3d-depth-without-height", a3d(&mut arr, &desc3(16, 0, 16, 0)).0));
        out.push(("cubemap-not-square", a3d(&mut arr, &desc3(16, 32, 6, CUDA_ARRAY3D_CUBEMAP)).0));
        let wide = CUDA_ARRAY_DESCRIPTOR {
            Width: 131_073,
            Height: 0,
            Format: CUarray_format::CU_AD_FORMAT_FLOAT,
            NumChannels: 1,
        };
        out.push(("array1d-past-limit", a2d(&mut arr, &wide).0));
        let r = a3d(&mut arr, &desc3(16_384, 1, 1, 0));
        out.push(("array3d-at-limit", r.0));
        if r.is_success() {
            adestroy(arr);
        }
        // Still healthy afterwards.
        let mut again: CUdeviceptr = 0;
        out.push(("alloc-after", alloc(&mut again, 1024).0));
        out.push(("free-after", free(again).0));
    }
    out
}
