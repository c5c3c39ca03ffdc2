//! Every way a driver client commits device memory, for the `alloc-path` / `free-all` steps.

use super::Cuda;
use cuda_abi::*;
use std::os::raw::c_uint;

/// A live allocation and how to give it back.
pub enum Held {
    Plain(CUdeviceptr),
    Async(CUdeviceptr),
    Pool(CUdeviceptr, CUmemoryPool),
    Vmm {
        va: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    },
    Array(CUarray),
    Mipmap(CUmipmappedArray),
}

/// The allocation kinds `alloc-path` accepts.
pub const KINDS: &[&str] = &[
    "plain", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap",
];

fn ok(r: CUresult) -> Result<(), CUresult> {
    if r.is_success() {
        Ok(())
    } else {
        Err(r)
    }
}

/// Commits exactly `bytes` (callers pass multiples of 2 MiB) through the `kind` path.
///
/// # Safety
/// `cu` must be a loaded driver with a current context.
pub unsafe fn alloc(cu: &Cuda, kind: &str, bytes: usize) -> Result<Held, CUresult> {
    // SAFETY: each function is resolved at the version of the PFN type it is cast to; all
    // pointers are to locals.
    unsafe {
        let null_stream: CUstream = std::ptr::null_mut();
        let mut p: CUdeviceptr = 0;
        match kind {
            "plain" => {
                ok(get!(cu, "cuMemAlloc", PFN_cuMemAlloc_v3020, 3020)(
                    &mut p, bytes,
                ))?;
                Ok(Held::Plain(p))
            }
            "pitch" => {
                // 512-byte rows: the pitch equals the width, so exactly `bytes` are committed.
                let mut pitch = 0usize;
                ok(
                    get!(cu, "cuMemAllocPitch", PFN_cuMemAllocPitch_v3020, 3020)(
                        &mut p,
                        &mut pitch,
                        512,
                        bytes / 512,
                        4,
                    ),
                )?;
                Ok(Held::Plain(p))
            }
            "managed" => {
                ok(get!(
                    cu,
                    "cuMemAllocManaged",
                    PFN_cuMemAllocManaged_v6000,
                    6000
                )(&mut p, bytes, 1))?;
                Ok(Held::Plain(p))
            }
            "async" => {
                ok(get!(
                    cu,
                    "cuMemAllocAsync",
                    PFN_cuMemAllocAsync_v11020,
                    11020
                )(&mut p, bytes, null_stream))?;
                Ok(Held::Async(p))
            }
            "pool" => {
                let props = CUmemPoolProps {
                    allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
                    handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
                    location: CUmemLocation {
                        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                        id: 0,
                    },
                    win32SecurityAttributes: std::ptr::null_mut(),
                    maxSize: 0,
                    usage: 0,
                    reserved: [0; 54],
                };
                let mut pool: CUmemoryPool = std::ptr::null_mut();
                ok(get!(
                    cu,
                    "cuMemPoolCreate",
                    PFN_cuMemPoolCreate_v11020,
                    11020
                )(&mut pool, &props))?;
                let r = get!(
                    cu,
                    "cuMemAllocFromPoolAsync",
                    PFN_cuMemAllocFromPoolAsync_v11020,
                    11020
                )(&mut p, bytes, pool, null_stream);
                if !r.is_success() {
                    get!(cu, "cuMemPoolDestroy", PFN_cuMemPoolDestroy_v11020, 11020)(pool);
                    return Err(r);
                }
                Ok(Held::Pool(p, pool))
            }
            "vmm" => {
                let prop = CUmemAllocationProp {
                    type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
                    requestedHandleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
                    location: CUmemLocation {
                        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                        id: 0,
                    },
                    win32HandleMetaData: std::ptr::null_mut(),
                    allocFlags: Default::default(),
                };
                let mut gran = 0usize;
                ok(get!(
                    cu,
                    "cuMemGetAllocationGranularity",
                    PFN_cuMemGetAllocationGranularity_v10020,
                    10020
                )(
                    &mut gran,
                    &prop,
                    CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ))?;
                let size = bytes.div_ceil(gran) * gran;
                let mut handle: CUmemGenericAllocationHandle = 0;
                ok(get!(cu, "cuMemCreate", PFN_cuMemCreate_v10020, 10020)(
                    &mut handle,
                    size,
                    &prop,
                    0,
                ))?;
                let mut va: CUdeviceptr = 0;
                ok(get!(
                    cu,
                    "cuMemAddressReserve",
                    PFN_cuMemAddressReserve_v10020,
                    10020
                )(&mut va, size, 0, 0, 0))?;
                ok(get!(cu, "cuMemMap", PFN_cuMemMap_v10020, 10020)(
                    va, size, 0, handle, 0,
                ))?;
                let access = CUmemAccessDesc {
                    location: prop.location,
                    flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                };
                ok(
                    get!(cu, "cuMemSetAccess", PFN_cuMemSetAccess_v10020, 10020)(
                        va, size, &access, 1,
                    ),
                )?;
                Ok(Held::Vmm { va, size, handle })
            }
            "array" => {
                // 16-byte elements, 65536 wide: up to 32 GiB within the 2D limits
                // (131072 x 65536 elements).
                let d = CUDA_ARRAY_DESCRIPTOR {
                    Width: 65536,
                    Height: bytes / 16 / 65536,
                    Format: CUarray_format::CU_AD_FORMAT_FLOAT,
                    NumChannels: 4,
                };
                let mut a: CUarray = std::ptr::null_mut();
                ok(get!(cu, "cuArrayCreate", PFN_cuArrayCreate_v3020, 3020)(
                    &mut a, &d,
                ))?;
                Ok(Held::Array(a))
            }
            "array3d" | "mipmap" => {
                // 16-byte elements, 1024 x 1024 a slice: up to 256 GiB within the 3D limits
                // (16384 elements each way).
                let d = CUDA_ARRAY3D_DESCRIPTOR {
                    Width: 1024,
                    Height: 1024,
                    Depth: bytes / 16 / 1024 / 1024,
                    Format: CUarray_format::CU_AD_FORMAT_FLOAT,
                    NumChannels: 4,
                    Flags: 0,
                };
                if kind == "array3d" {
                    let mut a: CUarray = std::ptr::null_mut();
                    ok(get!(cu, "cuArray3DCreate", PFN_cuArray3DCreate_v3020, 3020)(&mut a, &d))?;
                    Ok(Held::Array(a))
                } else {
                    let mut m: CUmipmappedArray = std::ptr::null_mut();
                    let levels: c_uint = 1;
                    ok(get!(
                        cu,
                        "cuMipmappedArrayCreate",
                        PFN_cuMipmappedArrayCreate_v5000,
                        5000
                    )(&mut m, &d, levels))?;
                    Ok(Held::Mipmap(m))
                }
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
}

/// Gives an allocation back through the matching free path.
///
/// # Safety
/// As for [`alloc`].
pub unsafe fn free(cu: &Cuda, h: Held) -> CUresult {
    // SAFETY: as in `alloc`.
    unsafe {
        let null_stream: CUstream = std::ptr::null_mut();
        match h {
            Held::Plain(p) => get!(cu, "cuMemFree", PFN_cuMemFree_v3020, 3020)(p),
            // Back into the device's pool, which keeps it until the next synchronisation (release
            // threshold 0 by default): the free path is the free and a synchronise.
            Held::Async(p) => {
                let r = get!(cu, "cuMemFreeAsync", PFN_cuMemFreeAsync_v11020, 11020)(p, null_stream);
                if r.is_success() {
                    get!(cu, "cuCtxSynchronize", PFN_cuCtxSynchronize_v2000, 2000)()
                } else {
                    r
                }
            }
            Held::Pool(p, pool) => {
                let r =
                    get!(cu, "cuMemFreeAsync", PFN_cuMemFreeAsync_v11020, 11020)(p, null_stream);
                let r2 = get!(cu, "cuMemPoolDestroy", PFN_cuMemPoolDestroy_v11020, 11020)(pool);
                if r.is_success() {
                    r2
                } else {
                    r
                }
            }
            Held::Vmm { va, size, handle } => {
                let r = get!(cu, "cuMemUnmap", PFN_cuMemUnmap_v10020, 10020)(va, size);
                let r2 = get!(cu, "cuMemRelease", PFN_cuMemRelease_v10020, 10020)(handle);
                let r3 = get!(cu, "cuMemAddressFree", PFN_cuMemAddressFree_v10020, 10020)(va, size);
                [r, r2, r3]
                    .into_iter()
                    .find(|r| !r.is_success())
                    .unwrap_or(CUresult::CUDA_SUCCESS)
            }
            Held::Array(a) => get!(cu, "cuArrayDestroy", PFN_cuArrayDestroy_v2000, 2000)(a),
            Held::Mipmap(m) => get!(
                cu,
                "cuMipmappedArrayDestroy",
                PFN_cuMipmappedArrayDestroy_v5000,
                5000
            )(m),
        }
    }
}
