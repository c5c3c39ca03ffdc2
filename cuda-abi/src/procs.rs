//! The proc table: every driver entry point we declare, per ABI version (as `PFN_<name>_v<ver>[_ptsz]`
//! in `cudaTypedefs.h`), with the exported symbol that implements it and its C signature.
#![allow(non_camel_case_types, non_snake_case)]

use crate::result::CUresult;
use crate::types::*;
use std::os::raw::{c_char, c_float, c_int, c_uchar, c_uint, c_void};

/// Which default-stream flavour an entry implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The ordinary (legacy default stream) entry.
    Plain,
    /// The per-thread-default-stream entry of a stream-ordered call (`_ptsz`).
    Ptsz,
    /// The per-thread-default-stream entry of a synchronous copy/memset (`_ptds`).
    Ptds,
}

impl Variant {
    /// True for the per-thread (`_ptsz` / `_ptds`) variants.
    pub fn is_per_thread(self) -> bool {
        !matches!(self, Variant::Plain)
    }
}

/// One (name, version, variant) row of the table.
#[derive(Debug)]
pub struct ProcEntry {
    /// API name as passed to `cuGetProcAddress` (`"cuMemAlloc"`).
    pub name: &'static str,
    /// The CUDA version that introduced this ABI (`3020` = CUDA 3.2).
    pub version: u32,
    /// Default-stream flavour.
    pub variant: Variant,
    /// Exported symbol implementing it (`"cuMemAlloc_v2"`).
    pub symbol: &'static str,
    /// The `cudaTypedefs.h` typedef (`"PFN_cuMemAlloc_v3020"`) and our Rust alias of the same name.
    pub pfn: &'static str,
    /// `(parameter name, Rust type as written)` in order.
    pub params: &'static [(&'static str, &'static str)],
    /// The name answers, from this version on, with another API's entry point (`symbol`, `pfn`
    /// and `params` are that entry's): cuda.h's `#define cuGraphInstantiate
    /// cuGraphInstantiateWithFlags` (CUDA 12.0).
    pub alias: bool,
}

impl ProcEntry {
    /// The C parameter list derived from the Rust declaration, e.g. `"CUdeviceptr *dptr, size_t bytesize"`.
    pub fn c_params(&self) -> String {
        if self.params.is_empty() {
            return "void".to_string();
        }
        self.params
            .iter()
            .map(|(n, t)| format!("{} {}", c_type(t), n))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A C typedef of our declaration named `alias`, for compile-time comparison with the header.
    pub fn c_typedef(&self, alias: &str) -> String {
        format!("typedef CUresult (*{alias})({});", self.c_params())
    }
}

/// Translates a Rust type as written in the table (`*mut *const c_char`) into C (`const char * *`).
pub fn c_type(rust: &str) -> String {
    let t = rust.trim();
    if let Some(rest) = t.strip_prefix("*mut") {
        return format!("{} *", c_type(rest));
    }
    if let Some(rest) = t.strip_prefix("*const") {
        let inner = c_type(rest);
        return if inner.ends_with('*') { format!("{inner} const *") } else { format!("const {inner} *") };
    }
    match t {
        "c_void" => "void",
        "c_char" => "char",
        "c_uchar" => "unsigned char",
        "c_int" => "int",
        "c_uint" => "unsigned int",
        "c_float" | "f32" => "float",
        "usize" => "size_t",
        "u64" => "unsigned long long",
        "u32" => "unsigned int",
        other => other,
    }
    .to_string()
}

macro_rules! proc_table {
    (
        aliases { $( $aname:ident @ $aver:literal $avariant:ident => $apfn:ident; )* }
        $( $pfn:ident = $name:ident @ $ver:literal $variant:ident => $sym:ident ( $($arg:ident : $ty:ty),* $(,)? ); )*
    ) => {
        $(
            #[doc = concat!("`", stringify!($pfn), "`: `", stringify!($name), "` as exported by `", stringify!($sym), "`.")]
            pub type $pfn = unsafe extern "C" fn($($arg: $ty),*) -> CUresult;
        )*
        /// Each row by its typedef's name (the values behind [`PROC_TABLE`] and its aliases).
        #[allow(non_upper_case_globals)]
        mod rows {
            use super::{ProcEntry, Variant};
            $(
                pub const $pfn: ProcEntry = ProcEntry {
                    name: stringify!($name),
                    version: $ver,
                    variant: Variant::$variant,
                    symbol: stringify!($sym),
                    pfn: stringify!($pfn),
                    params: &[$((stringify!($arg), stringify!($ty))),*],
                    alias: false,
                };
            )*
        }
        /// Every declared entry point version, then the aliases.
        pub static PROC_TABLE: &[ProcEntry] = &[
            $(rows::$pfn,)*
            $(ProcEntry { name: stringify!($aname), version: $aver, variant: Variant::$avariant, alias: true, ..rows::$apfn },)*
        ];
    };
}

proc_table! {
    aliases {
        // CUDA 12.0: the 5-argument cuGraphInstantiate (_v2) gave its name to cuGraphInstantiateWithFlags
        // (cuda.h `#define cuGraphInstantiate cuGraphInstantiateWithFlags`, 12.9 cudaTypedefs.h
        // `#define PFN_cuGraphInstantiate PFN_cuGraphInstantiateWithFlags_v11040`).
        cuGraphInstantiate @ 12000 Plain => PFN_cuGraphInstantiateWithFlags_v11040;
    }
    PFN_cuGetErrorString_v6000 = cuGetErrorString @ 6000 Plain => cuGetErrorString(error: CUresult, pStr: *mut *const c_char);
    PFN_cuGetErrorName_v6000 = cuGetErrorName @ 6000 Plain => cuGetErrorName(error: CUresult, pStr: *mut *const c_char);
    PFN_cuInit_v2000 = cuInit @ 2000 Plain => cuInit(Flags: c_uint);
    PFN_cuDriverGetVersion_v2020 = cuDriverGetVersion @ 2020 Plain => cuDriverGetVersion(driverVersion: *mut c_int);
    PFN_cuDeviceGet_v2000 = cuDeviceGet @ 2000 Plain => cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
    PFN_cuDeviceGetCount_v2000 = cuDeviceGetCount @ 2000 Plain => cuDeviceGetCount(count: *mut c_int);
    PFN_cuDeviceGetName_v2000 = cuDeviceGetName @ 2000 Plain => cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice);
    PFN_cuDeviceGetUuid_v9020 = cuDeviceGetUuid @ 9020 Plain => cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
    PFN_cuDeviceGetUuid_v11040 = cuDeviceGetUuid @ 11040 Plain => cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice);
    PFN_cuDeviceTotalMem_v2000 = cuDeviceTotalMem @ 2000 Plain => cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice);
    PFN_cuDeviceTotalMem_v3020 = cuDeviceTotalMem @ 3020 Plain => cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);
    PFN_cuDeviceGetAttribute_v2000 = cuDeviceGetAttribute @ 2000 Plain => cuDeviceGetAttribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice);
    PFN_cuDeviceComputeCapability_v2000 = cuDeviceComputeCapability @ 2000 Plain => cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice);
    PFN_cuDeviceGetPCIBusId_v4010 = cuDeviceGetPCIBusId @ 4010 Plain => cuDeviceGetPCIBusId(pciBusId: *mut c_char, len: c_int, dev: CUdevice);
    PFN_cuDevicePrimaryCtxRetain_v7000 = cuDevicePrimaryCtxRetain @ 7000 Plain => cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice);
    PFN_cuDevicePrimaryCtxRelease_v7000 = cuDevicePrimaryCtxRelease @ 7000 Plain => cuDevicePrimaryCtxRelease(dev: CUdevice);
    PFN_cuDevicePrimaryCtxRelease_v11000 = cuDevicePrimaryCtxRelease @ 11000 Plain => cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    PFN_cuDevicePrimaryCtxSetFlags_v7000 = cuDevicePrimaryCtxSetFlags @ 7000 Plain => cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint);
    PFN_cuDevicePrimaryCtxSetFlags_v11000 = cuDevicePrimaryCtxSetFlags @ 11000 Plain => cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint);
    PFN_cuDevicePrimaryCtxGetState_v7000 = cuDevicePrimaryCtxGetState @ 7000 Plain => cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int);
    PFN_cuDevicePrimaryCtxReset_v7000 = cuDevicePrimaryCtxReset @ 7000 Plain => cuDevicePrimaryCtxReset(dev: CUdevice);
    PFN_cuDevicePrimaryCtxReset_v11000 = cuDevicePrimaryCtxReset @ 11000 Plain => cuDevicePrimaryCtxReset_v2(dev: CUdevice);
    PFN_cuCtxCreate_v2000 = cuCtxCreate @ 2000 Plain => cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
    PFN_cuCtxCreate_v3020 = cuCtxCreate @ 3020 Plain => cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
    PFN_cuCtxCreate_v11040 = cuCtxCreate @ 11040 Plain => cuCtxCreate_v3(pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int, flags: c_uint, dev: CUdevice);
    PFN_cuCtxCreate_v12050 = cuCtxCreate @ 12050 Plain => cuCtxCreate_v4(pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice);
    PFN_cuCtxDestroy_v2000 = cuCtxDestroy @ 2000 Plain => cuCtxDestroy(ctx: CUcontext);
    PFN_cuCtxDestroy_v4000 = cuCtxDestroy @ 4000 Plain => cuCtxDestroy_v2(ctx: CUcontext);
    PFN_cuCtxPushCurrent_v2000 = cuCtxPushCurrent @ 2000 Plain => cuCtxPushCurrent(ctx: CUcontext);
    PFN_cuCtxPushCurrent_v4000 = cuCtxPushCurrent @ 4000 Plain => cuCtxPushCurrent_v2(ctx: CUcontext);
    PFN_cuCtxPopCurrent_v2000 = cuCtxPopCurrent @ 2000 Plain => cuCtxPopCurrent(pctx: *mut CUcontext);
    PFN_cuCtxPopCurrent_v4000 = cuCtxPopCurrent @ 4000 Plain => cuCtxPopCurrent_v2(pctx: *mut CUcontext);
    PFN_cuCtxSetCurrent_v4000 = cuCtxSetCurrent @ 4000 Plain => cuCtxSetCurrent(ctx: CUcontext);
    PFN_cuCtxGetCurrent_v4000 = cuCtxGetCurrent @ 4000 Plain => cuCtxGetCurrent(pctx: *mut CUcontext);
    PFN_cuCtxGetDevice_v2000 = cuCtxGetDevice @ 2000 Plain => cuCtxGetDevice(device: *mut CUdevice);
    PFN_cuCtxGetDevice_v13000 = cuCtxGetDevice @ 13000 Plain => cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext);
    PFN_cuCtxGetFlags_v7000 = cuCtxGetFlags @ 7000 Plain => cuCtxGetFlags(flags: *mut c_uint);
    PFN_cuCtxSetLimit_v3010 = cuCtxSetLimit @ 3010 Plain => cuCtxSetLimit(limit: CUlimit, value: usize);
    PFN_cuCtxGetLimit_v3010 = cuCtxGetLimit @ 3010 Plain => cuCtxGetLimit(pvalue: *mut usize, limit: CUlimit);
    PFN_cuCtxSynchronize_v2000 = cuCtxSynchronize @ 2000 Plain => cuCtxSynchronize();
    PFN_cuCtxSynchronize_v13000 = cuCtxSynchronize @ 13000 Plain => cuCtxSynchronize_v2(ctx: CUcontext);
    PFN_cuCtxGetApiVersion_v3020 = cuCtxGetApiVersion @ 3020 Plain => cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint);
    PFN_cuCtxGetStreamPriorityRange_v5050 = cuCtxGetStreamPriorityRange @ 5050 Plain => cuCtxGetStreamPriorityRange(leastPriority: *mut c_int, greatestPriority: *mut c_int);
    PFN_cuModuleLoadData_v2000 = cuModuleLoadData @ 2000 Plain => cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
    PFN_cuModuleLoadDataEx_v2010 = cuModuleLoadDataEx @ 2010 Plain => cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, numOptions: c_uint, options: *mut CUjit_option, optionValues: *mut *mut c_void);
    PFN_cuModuleUnload_v2000 = cuModuleUnload @ 2000 Plain => cuModuleUnload(hmod: CUmodule);
    PFN_cuModuleGetFunction_v2000 = cuModuleGetFunction @ 2000 Plain => cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char);
    PFN_cuFuncGetAttribute_v2020 = cuFuncGetAttribute @ 2020 Plain => cuFuncGetAttribute(pi: *mut c_int, attrib: CUfunction_attribute, hfunc: CUfunction);
    PFN_cuMemGetInfo_v2000 = cuMemGetInfo @ 2000 Plain => cuMemGetInfo(free: *mut c_uint, total: *mut c_uint);
    PFN_cuMemGetInfo_v3020 = cuMemGetInfo @ 3020 Plain => cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    PFN_cuMemAlloc_v2000 = cuMemAlloc @ 2000 Plain => cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint);
    PFN_cuMemAlloc_v3020 = cuMemAlloc @ 3020 Plain => cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize);
    PFN_cuMemAllocPitch_v2000 = cuMemAllocPitch @ 2000 Plain => cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pPitch: *mut c_uint, WidthInBytes: c_uint, Height: c_uint, ElementSizeBytes: c_uint);
    PFN_cuMemAllocPitch_v3020 = cuMemAllocPitch @ 3020 Plain => cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pPitch: *mut usize, WidthInBytes: usize, Height: usize, ElementSizeBytes: c_uint);
    PFN_cuMemFree_v2000 = cuMemFree @ 2000 Plain => cuMemFree(dptr: CUdeviceptr_v1);
    PFN_cuMemFree_v3020 = cuMemFree @ 3020 Plain => cuMemFree_v2(dptr: CUdeviceptr);
    PFN_cuMemGetAddressRange_v3020 = cuMemGetAddressRange @ 3020 Plain => cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr);
    PFN_cuMemAllocHost_v3020 = cuMemAllocHost @ 3020 Plain => cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize);
    PFN_cuMemFreeHost_v2000 = cuMemFreeHost @ 2000 Plain => cuMemFreeHost(p: *mut c_void);
    PFN_cuMemHostAlloc_v2020 = cuMemHostAlloc @ 2020 Plain => cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, Flags: c_uint);
    PFN_cuMemAllocManaged_v6000 = cuMemAllocManaged @ 6000 Plain => cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint);
    PFN_cuIpcOpenMemHandle_v4010 = cuIpcOpenMemHandle @ 4010 Plain => cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, Flags: c_uint);
    PFN_cuIpcOpenMemHandle_v11000 = cuIpcOpenMemHandle @ 11000 Plain => cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, Flags: c_uint);
    PFN_cuMemcpyHtoD_v2000 = cuMemcpyHtoD @ 2000 Plain => cuMemcpyHtoD(dstDevice: CUdeviceptr_v1, srcHost: *const c_void, ByteCount: c_uint);
    PFN_cuMemcpyHtoD_v3020 = cuMemcpyHtoD @ 3020 Plain => cuMemcpyHtoD_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize);
    PFN_cuMemcpyHtoD_v7000_ptds = cuMemcpyHtoD @ 7000 Ptds => cuMemcpyHtoD_v2_ptds(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize);
    PFN_cuMemcpyDtoH_v2000 = cuMemcpyDtoH @ 2000 Plain => cuMemcpyDtoH(dstHost: *mut c_void, srcDevice: CUdeviceptr_v1, ByteCount: c_uint);
    PFN_cuMemcpyDtoH_v3020 = cuMemcpyDtoH @ 3020 Plain => cuMemcpyDtoH_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize);
    PFN_cuMemcpyDtoH_v7000_ptds = cuMemcpyDtoH @ 7000 Ptds => cuMemcpyDtoH_v2_ptds(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize);
    PFN_cuMemcpyDtoD_v3020 = cuMemcpyDtoD @ 3020 Plain => cuMemcpyDtoD_v2(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize);
    PFN_cuMemcpyDtoD_v7000_ptds = cuMemcpyDtoD @ 7000 Ptds => cuMemcpyDtoD_v2_ptds(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize);
    PFN_cuMemcpyHtoDAsync_v3020 = cuMemcpyHtoDAsync @ 3020 Plain => cuMemcpyHtoDAsync_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize, hStream: CUstream);
    PFN_cuMemcpyHtoDAsync_v7000_ptsz = cuMemcpyHtoDAsync @ 7000 Ptsz => cuMemcpyHtoDAsync_v2_ptsz(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize, hStream: CUstream);
    PFN_cuMemcpyDtoHAsync_v3020 = cuMemcpyDtoHAsync @ 3020 Plain => cuMemcpyDtoHAsync_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    PFN_cuMemcpyDtoHAsync_v7000_ptsz = cuMemcpyDtoHAsync @ 7000 Ptsz => cuMemcpyDtoHAsync_v2_ptsz(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    PFN_cuMemsetD8_v3020 = cuMemsetD8 @ 3020 Plain => cuMemsetD8_v2(dstDevice: CUdeviceptr, uc: c_uchar, N: usize);
    PFN_cuMemsetD8_v7000_ptds = cuMemsetD8 @ 7000 Ptds => cuMemsetD8_v2_ptds(dstDevice: CUdeviceptr, uc: c_uchar, N: usize);
    PFN_cuArrayCreate_v2000 = cuArrayCreate @ 2000 Plain => cuArrayCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR_v1);
    PFN_cuArrayCreate_v3020 = cuArrayCreate @ 3020 Plain => cuArrayCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY_DESCRIPTOR);
    PFN_cuArray3DCreate_v2000 = cuArray3DCreate @ 2000 Plain => cuArray3DCreate(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR_v1);
    PFN_cuArray3DCreate_v3020 = cuArray3DCreate @ 3020 Plain => cuArray3DCreate_v2(pHandle: *mut CUarray, pAllocateArray: *const CUDA_ARRAY3D_DESCRIPTOR);
    PFN_cuArrayDestroy_v2000 = cuArrayDestroy @ 2000 Plain => cuArrayDestroy(hArray: CUarray);
    PFN_cuMipmappedArrayCreate_v5000 = cuMipmappedArrayCreate @ 5000 Plain => cuMipmappedArrayCreate(pHandle: *mut CUmipmappedArray, pMipmappedArrayDesc: *const CUDA_ARRAY3D_DESCRIPTOR, numMipmapLevels: c_uint);
    PFN_cuMipmappedArrayDestroy_v5000 = cuMipmappedArrayDestroy @ 5000 Plain => cuMipmappedArrayDestroy(hMipmappedArray: CUmipmappedArray);
    PFN_cuMemAddressReserve_v10020 = cuMemAddressReserve @ 10020 Plain => cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64);
    PFN_cuMemAddressFree_v10020 = cuMemAddressFree @ 10020 Plain => cuMemAddressFree(ptr: CUdeviceptr, size: usize);
    PFN_cuMemCreate_v10020 = cuMemCreate @ 10020 Plain => cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64);
    PFN_cuMemRelease_v10020 = cuMemRelease @ 10020 Plain => cuMemRelease(handle: CUmemGenericAllocationHandle);
    PFN_cuMemRetainAllocationHandle_v11000 = cuMemRetainAllocationHandle @ 11000 Plain => cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void);
    PFN_cuMemExportToShareableHandle_v10020 = cuMemExportToShareableHandle @ 10020 Plain => cuMemExportToShareableHandle(shareableHandle: *mut c_void, handle: CUmemGenericAllocationHandle, handleType: CUmemAllocationHandleType, flags: u64);
    PFN_cuMemImportFromShareableHandle_v10020 = cuMemImportFromShareableHandle @ 10020 Plain => cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, osHandle: *mut c_void, shHandleType: CUmemAllocationHandleType);
    PFN_cuMemGetAllocationPropertiesFromHandle_v10020 = cuMemGetAllocationPropertiesFromHandle @ 10020 Plain => cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle);
    PFN_cuMemMap_v10020 = cuMemMap @ 10020 Plain => cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64);
    PFN_cuMemUnmap_v10020 = cuMemUnmap @ 10020 Plain => cuMemUnmap(ptr: CUdeviceptr, size: usize);
    PFN_cuMemSetAccess_v10020 = cuMemSetAccess @ 10020 Plain => cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
    PFN_cuMemGetAllocationGranularity_v10020 = cuMemGetAllocationGranularity @ 10020 Plain => cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: CUmemAllocationGranularity_flags);
    PFN_cuMemFreeAsync_v11020 = cuMemFreeAsync @ 11020 Plain => cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream);
    PFN_cuMemFreeAsync_v11020_ptsz = cuMemFreeAsync @ 11020 Ptsz => cuMemFreeAsync_ptsz(dptr: CUdeviceptr, hStream: CUstream);
    PFN_cuMemAllocAsync_v11020 = cuMemAllocAsync @ 11020 Plain => cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream);
    PFN_cuMemAllocAsync_v11020_ptsz = cuMemAllocAsync @ 11020 Ptsz => cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream);
    PFN_cuMemPoolCreate_v11020 = cuMemPoolCreate @ 11020 Plain => cuMemPoolCreate(pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps);
    PFN_cuMemPoolDestroy_v11020 = cuMemPoolDestroy @ 11020 Plain => cuMemPoolDestroy(pool: CUmemoryPool);
    PFN_cuMemAllocFromPoolAsync_v11020 = cuMemAllocFromPoolAsync @ 11020 Plain => cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream);
    PFN_cuMemAllocFromPoolAsync_v11020_ptsz = cuMemAllocFromPoolAsync @ 11020 Ptsz => cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream);
    PFN_cuMemPoolTrimTo_v11020 = cuMemPoolTrimTo @ 11020 Plain => cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize);
    PFN_cuMemPoolSetAttribute_v11020 = cuMemPoolSetAttribute @ 11020 Plain => cuMemPoolSetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void);
    PFN_cuMemPoolGetAttribute_v11020 = cuMemPoolGetAttribute @ 11020 Plain => cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void);
    PFN_cuDeviceSetMemPool_v11020 = cuDeviceSetMemPool @ 11020 Plain => cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool);
    PFN_cuDeviceGetMemPool_v11020 = cuDeviceGetMemPool @ 11020 Plain => cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice);
    PFN_cuDeviceGetDefaultMemPool_v11020 = cuDeviceGetDefaultMemPool @ 11020 Plain => cuDeviceGetDefaultMemPool(pool_out: *mut CUmemoryPool, dev: CUdevice);
    PFN_cuPointerGetAttribute_v4000 = cuPointerGetAttribute @ 4000 Plain => cuPointerGetAttribute(data: *mut c_void, attribute: CUpointer_attribute, ptr: CUdeviceptr);
    PFN_cuStreamCreate_v2000 = cuStreamCreate @ 2000 Plain => cuStreamCreate(phStream: *mut CUstream, Flags: c_uint);
    PFN_cuStreamGetCtx_v9020 = cuStreamGetCtx @ 9020 Plain => cuStreamGetCtx(hStream: CUstream, pctx: *mut CUcontext);
    PFN_cuStreamGetCtx_v9020_ptsz = cuStreamGetCtx @ 9020 Ptsz => cuStreamGetCtx_ptsz(hStream: CUstream, pctx: *mut CUcontext);
    PFN_cuStreamGetCtx_v12050 = cuStreamGetCtx @ 12050 Plain => cuStreamGetCtx_v2(hStream: CUstream, pCtx: *mut CUcontext, pGreenCtx: *mut CUgreenCtx);
    PFN_cuStreamGetCtx_v12050_ptsz = cuStreamGetCtx @ 12050 Ptsz => cuStreamGetCtx_v2_ptsz(hStream: CUstream, pCtx: *mut CUcontext, pGreenCtx: *mut CUgreenCtx);
    PFN_cuStreamGetDevice_v12080 = cuStreamGetDevice @ 12080 Plain => cuStreamGetDevice(hStream: CUstream, device: *mut CUdevice);
    PFN_cuStreamGetDevice_v12080_ptsz = cuStreamGetDevice @ 12080 Ptsz => cuStreamGetDevice_ptsz(hStream: CUstream, device: *mut CUdevice);
    PFN_cuStreamWaitEvent_v3020 = cuStreamWaitEvent @ 3020 Plain => cuStreamWaitEvent(hStream: CUstream, hEvent: CUevent, Flags: c_uint);
    PFN_cuStreamWaitEvent_v7000_ptsz = cuStreamWaitEvent @ 7000 Ptsz => cuStreamWaitEvent_ptsz(hStream: CUstream, hEvent: CUevent, Flags: c_uint);
    PFN_cuStreamQuery_v2000 = cuStreamQuery @ 2000 Plain => cuStreamQuery(hStream: CUstream);
    PFN_cuStreamQuery_v7000_ptsz = cuStreamQuery @ 7000 Ptsz => cuStreamQuery_ptsz(hStream: CUstream);
    PFN_cuStreamBeginCapture_v10000 = cuStreamBeginCapture @ 10000 Plain => cuStreamBeginCapture(hStream: CUstream);
    PFN_cuStreamBeginCapture_v10000_ptsz = cuStreamBeginCapture @ 10000 Ptsz => cuStreamBeginCapture_ptsz(hStream: CUstream);
    PFN_cuStreamBeginCapture_v10010 = cuStreamBeginCapture @ 10010 Plain => cuStreamBeginCapture_v2(hStream: CUstream, mode: CUstreamCaptureMode);
    PFN_cuStreamBeginCapture_v10010_ptsz = cuStreamBeginCapture @ 10010 Ptsz => cuStreamBeginCapture_v2_ptsz(hStream: CUstream, mode: CUstreamCaptureMode);
    PFN_cuStreamBeginCaptureToGraph_v12030 = cuStreamBeginCaptureToGraph @ 12030 Plain => cuStreamBeginCaptureToGraph(hStream: CUstream, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, mode: CUstreamCaptureMode);
    PFN_cuStreamBeginCaptureToGraph_v12030_ptsz = cuStreamBeginCaptureToGraph @ 12030 Ptsz => cuStreamBeginCaptureToGraph_ptsz(hStream: CUstream, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, mode: CUstreamCaptureMode);
    PFN_cuStreamEndCapture_v10000 = cuStreamEndCapture @ 10000 Plain => cuStreamEndCapture(hStream: CUstream, phGraph: *mut CUgraph);
    PFN_cuStreamEndCapture_v10000_ptsz = cuStreamEndCapture @ 10000 Ptsz => cuStreamEndCapture_ptsz(hStream: CUstream, phGraph: *mut CUgraph);
    PFN_cuStreamIsCapturing_v10000 = cuStreamIsCapturing @ 10000 Plain => cuStreamIsCapturing(hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus);
    PFN_cuStreamIsCapturing_v10000_ptsz = cuStreamIsCapturing @ 10000 Ptsz => cuStreamIsCapturing_ptsz(hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus);
    PFN_cuStreamGetCaptureInfo_v11030 = cuStreamGetCaptureInfo @ 11030 Plain => cuStreamGetCaptureInfo_v2(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, numDependencies_out: *mut usize);
    PFN_cuStreamGetCaptureInfo_v11030_ptsz = cuStreamGetCaptureInfo @ 11030 Ptsz => cuStreamGetCaptureInfo_v2_ptsz(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, numDependencies_out: *mut usize);
    PFN_cuStreamGetCaptureInfo_v12030 = cuStreamGetCaptureInfo @ 12030 Plain => cuStreamGetCaptureInfo_v3(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, edgeData_out: *mut *const CUgraphEdgeData, numDependencies_out: *mut usize);
    PFN_cuStreamGetCaptureInfo_v12030_ptsz = cuStreamGetCaptureInfo @ 12030 Ptsz => cuStreamGetCaptureInfo_v3_ptsz(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, edgeData_out: *mut *const CUgraphEdgeData, numDependencies_out: *mut usize);
    PFN_cuStreamSynchronize_v2000 = cuStreamSynchronize @ 2000 Plain => cuStreamSynchronize(hStream: CUstream);
    PFN_cuStreamSynchronize_v7000_ptsz = cuStreamSynchronize @ 7000 Ptsz => cuStreamSynchronize_ptsz(hStream: CUstream);
    PFN_cuStreamDestroy_v2000 = cuStreamDestroy @ 2000 Plain => cuStreamDestroy(hStream: CUstream);
    PFN_cuStreamDestroy_v4000 = cuStreamDestroy @ 4000 Plain => cuStreamDestroy_v2(hStream: CUstream);
    PFN_cuEventCreate_v2000 = cuEventCreate @ 2000 Plain => cuEventCreate(phEvent: *mut CUevent, Flags: c_uint);
    PFN_cuEventRecord_v2000 = cuEventRecord @ 2000 Plain => cuEventRecord(hEvent: CUevent, hStream: CUstream);
    PFN_cuEventRecord_v7000_ptsz = cuEventRecord @ 7000 Ptsz => cuEventRecord_ptsz(hEvent: CUevent, hStream: CUstream);
    PFN_cuEventQuery_v2000 = cuEventQuery @ 2000 Plain => cuEventQuery(hEvent: CUevent);
    PFN_cuEventSynchronize_v2000 = cuEventSynchronize @ 2000 Plain => cuEventSynchronize(hEvent: CUevent);
    PFN_cuEventDestroy_v2000 = cuEventDestroy @ 2000 Plain => cuEventDestroy(hEvent: CUevent);
    PFN_cuEventDestroy_v4000 = cuEventDestroy @ 4000 Plain => cuEventDestroy_v2(hEvent: CUevent);
    PFN_cuEventElapsedTime_v2000 = cuEventElapsedTime @ 2000 Plain => cuEventElapsedTime(pMilliseconds: *mut c_float, hStart: CUevent, hEnd: CUevent);
    PFN_cuEventElapsedTime_v12080 = cuEventElapsedTime @ 12080 Plain => cuEventElapsedTime_v2(pMilliseconds: *mut c_float, hStart: CUevent, hEnd: CUevent);
    PFN_cuLaunchKernel_v4000 = cuLaunchKernel @ 4000 Plain => cuLaunchKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
    PFN_cuLaunchKernel_v7000_ptsz = cuLaunchKernel @ 7000 Ptsz => cuLaunchKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
    PFN_cuLaunchKernelEx_v11060 = cuLaunchKernelEx @ 11060 Plain => cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
    PFN_cuLaunchKernelEx_v11060_ptsz = cuLaunchKernelEx @ 11060 Ptsz => cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, kernelParams: *mut *mut c_void, extra: *mut *mut c_void);
    PFN_cuLaunchCooperativeKernel_v9000 = cuLaunchCooperativeKernel @ 9000 Plain => cuLaunchCooperativeKernel(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void);
    PFN_cuLaunchCooperativeKernel_v9000_ptsz = cuLaunchCooperativeKernel @ 9000 Ptsz => cuLaunchCooperativeKernel_ptsz(f: CUfunction, gridDimX: c_uint, gridDimY: c_uint, gridDimZ: c_uint, blockDimX: c_uint, blockDimY: c_uint, blockDimZ: c_uint, sharedMemBytes: c_uint, hStream: CUstream, kernelParams: *mut *mut c_void);
    PFN_cuLaunchCooperativeKernelMultiDevice_v9000 = cuLaunchCooperativeKernelMultiDevice @ 9000 Plain => cuLaunchCooperativeKernelMultiDevice(launchParamsList: *mut CUDA_LAUNCH_PARAMS_v1, numDevices: c_uint, flags: c_uint);
    // The execution-control API of CUDA 2.0 (deprecated, still declared and exported in 13.0):
    // block shape and parameters set on the function, then launched.
    PFN_cuFuncSetBlockShape_v2000 = cuFuncSetBlockShape @ 2000 Plain => cuFuncSetBlockShape(hfunc: CUfunction, x: c_int, y: c_int, z: c_int);
    PFN_cuFuncSetSharedSize_v2000 = cuFuncSetSharedSize @ 2000 Plain => cuFuncSetSharedSize(hfunc: CUfunction, bytes: c_uint);
    PFN_cuParamSetSize_v2000 = cuParamSetSize @ 2000 Plain => cuParamSetSize(hfunc: CUfunction, numbytes: c_uint);
    PFN_cuParamSeti_v2000 = cuParamSeti @ 2000 Plain => cuParamSeti(hfunc: CUfunction, offset: c_int, value: c_uint);
    PFN_cuParamSetf_v2000 = cuParamSetf @ 2000 Plain => cuParamSetf(hfunc: CUfunction, offset: c_int, value: c_float);
    PFN_cuParamSetv_v2000 = cuParamSetv @ 2000 Plain => cuParamSetv(hfunc: CUfunction, offset: c_int, ptr: *mut c_void, numbytes: c_uint);
    PFN_cuLaunch_v2000 = cuLaunch @ 2000 Plain => cuLaunch(f: CUfunction);
    PFN_cuLaunchGrid_v2000 = cuLaunchGrid @ 2000 Plain => cuLaunchGrid(f: CUfunction, grid_width: c_int, grid_height: c_int);
    PFN_cuLaunchGridAsync_v2000 = cuLaunchGridAsync @ 2000 Plain => cuLaunchGridAsync(f: CUfunction, grid_width: c_int, grid_height: c_int, hStream: CUstream);
    PFN_cuGraphCreate_v10000 = cuGraphCreate @ 10000 Plain => cuGraphCreate(phGraph: *mut CUgraph, flags: c_uint);
    PFN_cuGraphAddKernelNode_v10000 = cuGraphAddKernelNode @ 10000 Plain => cuGraphAddKernelNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1);
    PFN_cuGraphAddKernelNode_v12000 = cuGraphAddKernelNode @ 12000 Plain => cuGraphAddKernelNode_v2(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_KERNEL_NODE_PARAMS);
    PFN_cuGraphInstantiate_v10000 = cuGraphInstantiate @ 10000 Plain => cuGraphInstantiate(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize);
    PFN_cuGraphInstantiate_v11000 = cuGraphInstantiate @ 11000 Plain => cuGraphInstantiate_v2(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, phErrorNode: *mut CUgraphNode, logBuffer: *mut c_char, bufferSize: usize);
    PFN_cuGraphInstantiateWithFlags_v11040 = cuGraphInstantiateWithFlags @ 11040 Plain => cuGraphInstantiateWithFlags(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: u64);
    PFN_cuGraphInstantiateWithParams_v12000 = cuGraphInstantiateWithParams @ 12000 Plain => cuGraphInstantiateWithParams(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS);
    PFN_cuGraphInstantiateWithParams_v12000_ptsz = cuGraphInstantiateWithParams @ 12000 Ptsz => cuGraphInstantiateWithParams_ptsz(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS);
    PFN_cuGraphUpload_v11010 = cuGraphUpload @ 11010 Plain => cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream);
    PFN_cuGraphUpload_v11010_ptsz = cuGraphUpload @ 11010 Ptsz => cuGraphUpload_ptsz(hGraphExec: CUgraphExec, hStream: CUstream);
    PFN_cuGraphExecDestroy_v10000 = cuGraphExecDestroy @ 10000 Plain => cuGraphExecDestroy(hGraphExec: CUgraphExec);
    PFN_cuGraphDestroy_v10000 = cuGraphDestroy @ 10000 Plain => cuGraphDestroy(hGraph: CUgraph);
    PFN_cuGraphLaunch_v10000 = cuGraphLaunch @ 10000 Plain => cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream);
    PFN_cuGraphLaunch_v10000_ptsz = cuGraphLaunch @ 10000 Ptsz => cuGraphLaunch_ptsz(hGraphExec: CUgraphExec, hStream: CUstream);
    PFN_cuGraphAddMemAllocNode_v11040 = cuGraphAddMemAllocNode @ 11040 Plain => cuGraphAddMemAllocNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *mut CUDA_MEM_ALLOC_NODE_PARAMS);
    PFN_cuGraphAddNode_v12020 = cuGraphAddNode @ 12020 Plain => cuGraphAddNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *mut CUgraphNodeParams);
    PFN_cuGraphAddNode_v12030 = cuGraphAddNode @ 12030 Plain => cuGraphAddNode_v2(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, nodeParams: *mut CUgraphNodeParams);
    PFN_cuGraphNodeSetParams_v12020 = cuGraphNodeSetParams @ 12020 Plain => cuGraphNodeSetParams(hNode: CUgraphNode, nodeParams: *mut CUgraphNodeParams);
    PFN_cuGraphExecNodeSetParams_v12020 = cuGraphExecNodeSetParams @ 12020 Plain => cuGraphExecNodeSetParams(hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *mut CUgraphNodeParams);
    PFN_cuGraphGetNodes_v10000 = cuGraphGetNodes @ 10000 Plain => cuGraphGetNodes(hGraph: CUgraph, nodes: *mut CUgraphNode, numNodes: *mut usize);
    PFN_cuGraphNodeGetType_v10000 = cuGraphNodeGetType @ 10000 Plain => cuGraphNodeGetType(hNode: CUgraphNode, type_: *mut CUgraphNodeType);
    PFN_cuGraphKernelNodeGetParams_v10000 = cuGraphKernelNodeGetParams @ 10000 Plain => cuGraphKernelNodeGetParams(hNode: CUgraphNode, nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v1);
    PFN_cuGraphKernelNodeGetParams_v12000 = cuGraphKernelNodeGetParams @ 12000 Plain => cuGraphKernelNodeGetParams_v2(hNode: CUgraphNode, nodeParams: *mut CUDA_KERNEL_NODE_PARAMS_v2);
    PFN_cuGraphChildGraphNodeGetGraph_v10000 = cuGraphChildGraphNodeGetGraph @ 10000 Plain => cuGraphChildGraphNodeGetGraph(hNode: CUgraphNode, phGraph: *mut CUgraph);
    PFN_cuGraphExecKernelNodeSetParams_v10010 = cuGraphExecKernelNodeSetParams @ 10010 Plain => cuGraphExecKernelNodeSetParams(hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v1);
    PFN_cuGraphExecKernelNodeSetParams_v12000 = cuGraphExecKernelNodeSetParams @ 12000 Plain => cuGraphExecKernelNodeSetParams_v2(hGraphExec: CUgraphExec, hNode: CUgraphNode, nodeParams: *const CUDA_KERNEL_NODE_PARAMS_v2);
    PFN_cuGraphExecChildGraphNodeSetParams_v11010 = cuGraphExecChildGraphNodeSetParams @ 11010 Plain => cuGraphExecChildGraphNodeSetParams(hGraphExec: CUgraphExec, hNode: CUgraphNode, childGraph: CUgraph);
    PFN_cuGraphExecUpdate_v10020 = cuGraphExecUpdate @ 10020 Plain => cuGraphExecUpdate(hGraphExec: CUgraphExec, hGraph: CUgraph, hErrorNode_out: *mut CUgraphNode, updateResult_out: *mut CUgraphExecUpdateResult);
    PFN_cuGraphExecUpdate_v12000 = cuGraphExecUpdate @ 12000 Plain => cuGraphExecUpdate_v2(hGraphExec: CUgraphExec, hGraph: CUgraph, resultInfo: *mut CUgraphExecUpdateResultInfo);
    PFN_cuGraphAddMemFreeNode_v11040 = cuGraphAddMemFreeNode @ 11040 Plain => cuGraphAddMemFreeNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, dptr: CUdeviceptr);
    PFN_cuDeviceGraphMemTrim_v11040 = cuDeviceGraphMemTrim @ 11040 Plain => cuDeviceGraphMemTrim(device: CUdevice);
    PFN_cuDeviceGetGraphMemAttribute_v11040 = cuDeviceGetGraphMemAttribute @ 11040 Plain => cuDeviceGetGraphMemAttribute(device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void);
    PFN_cuDeviceSetGraphMemAttribute_v11040 = cuDeviceSetGraphMemAttribute @ 11040 Plain => cuDeviceSetGraphMemAttribute(device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void);
    PFN_cuGetExportTable_v3000 = cuGetExportTable @ 3000 Plain => cuGetExportTable(ppExportTable: *mut *const c_void, pExportTableId: *const CUuuid);
    PFN_cuGetProcAddress_v11030 = cuGetProcAddress @ 11030 Plain => cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, driverVersion: c_int, flags: cuuint64_t);
    PFN_cuGetProcAddress_v12000 = cuGetProcAddress @ 12000 Plain => cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, driverVersion: c_int, flags: cuuint64_t, symbolFound: *mut CUdriverProcAddressQueryResult);
}
