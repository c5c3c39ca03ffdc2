//! `cuGetProcAddress` for the fake driver: the shared cuda-abi resolver picks the (symbol, ABI);
//! this module maps the symbol to our implementation, coerced to that ABI's function type.

use crate::api;
use cuda_abi::*;
use std::os::raw::c_void;

macro_rules! exports {
    ($($sym:ident : $pfn:ident),* $(,)?) => {
        /// `(exported symbol, PFN typedef)` of every implemented entry point.
        pub const IMPLEMENTED: &[(&str, &str)] = &[$((stringify!($sym), stringify!($pfn))),*];

        /// Our function for `symbol`, as a raw pointer of the ABI the table names for it.
        pub fn exported(symbol: &str) -> Option<*mut c_void> {
            match symbol {
                $(stringify!($sym) => Some(api::$sym as $pfn as *mut c_void),)*
                _ => None,
            }
        }
    };
}

exports! {
    cuGetErrorString: PFN_cuGetErrorString_v6000,
    cuGetErrorName: PFN_cuGetErrorName_v6000,
    cuInit: PFN_cuInit_v2000,
    cuDriverGetVersion: PFN_cuDriverGetVersion_v2020,
    cuDeviceGet: PFN_cuDeviceGet_v2000,
    cuDeviceGetCount: PFN_cuDeviceGetCount_v2000,
    cuDeviceGetName: PFN_cuDeviceGetName_v2000,
    cuDeviceGetUuid: PFN_cuDeviceGetUuid_v9020,
    cuDeviceGetUuid_v2: PFN_cuDeviceGetUuid_v11040,
    cuDeviceTotalMem_v2: PFN_cuDeviceTotalMem_v3020,
    cuDeviceGetAttribute: PFN_cuDeviceGetAttribute_v2000,
    cuDeviceComputeCapability: PFN_cuDeviceComputeCapability_v2000,
    cuDeviceGetPCIBusId: PFN_cuDeviceGetPCIBusId_v4010,
    cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain_v7000,
    cuDevicePrimaryCtxRelease: PFN_cuDevicePrimaryCtxRelease_v7000,
    cuDevicePrimaryCtxRelease_v2: PFN_cuDevicePrimaryCtxRelease_v11000,
    cuDevicePrimaryCtxSetFlags: PFN_cuDevicePrimaryCtxSetFlags_v7000,
    cuDevicePrimaryCtxSetFlags_v2: PFN_cuDevicePrimaryCtxSetFlags_v11000,
    cuDevicePrimaryCtxGetState: PFN_cuDevicePrimaryCtxGetState_v7000,
    cuDevicePrimaryCtxReset: PFN_cuDevicePrimaryCtxReset_v7000,
    cuDevicePrimaryCtxReset_v2: PFN_cuDevicePrimaryCtxReset_v11000,
    cuCtxCreate: PFN_cuCtxCreate_v2000,
    cuCtxCreate_v2: PFN_cuCtxCreate_v3020,
    cuCtxCreate_v3: PFN_cuCtxCreate_v11040,
    cuCtxCreate_v4: PFN_cuCtxCreate_v12050,
    cuCtxDestroy: PFN_cuCtxDestroy_v2000,
    cuCtxDestroy_v2: PFN_cuCtxDestroy_v4000,
    cuCtxPushCurrent: PFN_cuCtxPushCurrent_v2000,
    cuCtxPushCurrent_v2: PFN_cuCtxPushCurrent_v4000,
    cuCtxPopCurrent: PFN_cuCtxPopCurrent_v2000,
    cuCtxPopCurrent_v2: PFN_cuCtxPopCurrent_v4000,
    cuCtxSetCurrent: PFN_cuCtxSetCurrent_v4000,
    cuCtxGetCurrent: PFN_cuCtxGetCurrent_v4000,
    cuCtxGetDevice: PFN_cuCtxGetDevice_v2000,
    cuCtxGetDevice_v2: PFN_cuCtxGetDevice_v13000,
    cuCtxGetFlags: PFN_cuCtxGetFlags_v7000,
    cuCtxSetLimit: PFN_cuCtxSetLimit_v3010,
    cuCtxGetLimit: PFN_cuCtxGetLimit_v3010,
    cuCtxSynchronize: PFN_cuCtxSynchronize_v2000,
    cuCtxSynchronize_v2: PFN_cuCtxSynchronize_v13000,
    cuCtxGetApiVersion: PFN_cuCtxGetApiVersion_v3020,
    cuCtxGetStreamPriorityRange: PFN_cuCtxGetStreamPriorityRange_v5050,
    cuModuleLoadData: PFN_cuModuleLoadData_v2000,
    cuModuleLoadDataEx: PFN_cuModuleLoadDataEx_v2010,
    cuModuleUnload: PFN_cuModuleUnload_v2000,
    cuModuleGetFunction: PFN_cuModuleGetFunction_v2000,
    cuFuncGetAttribute: PFN_cuFuncGetAttribute_v2020,
    cuMemGetInfo_v2: PFN_cuMemGetInfo_v3020,
    cuMemAlloc_v2: PFN_cuMemAlloc_v3020,
    cuMemAllocPitch_v2: PFN_cuMemAllocPitch_v3020,
    cuMemFree_v2: PFN_cuMemFree_v3020,
    cuMemGetAddressRange_v2: PFN_cuMemGetAddressRange_v3020,
    cuMemAllocHost_v2: PFN_cuMemAllocHost_v3020,
    cuMemHostAlloc: PFN_cuMemHostAlloc_v2020,
    cuMemFreeHost: PFN_cuMemFreeHost_v2000,
    cuMemAllocManaged: PFN_cuMemAllocManaged_v6000,
    cuIpcOpenMemHandle: PFN_cuIpcOpenMemHandle_v4010,
    cuIpcOpenMemHandle_v2: PFN_cuIpcOpenMemHandle_v11000,
    cuMemcpyHtoD_v2: PFN_cuMemcpyHtoD_v3020,
    cuMemcpyHtoD_v2_ptds: PFN_cuMemcpyHtoD_v7000_ptds,
    cuMemcpyDtoH_v2: PFN_cuMemcpyDtoH_v3020,
    cuMemcpyDtoH_v2_ptds: PFN_cuMemcpyDtoH_v7000_ptds,
    cuMemcpyDtoD_v2: PFN_cuMemcpyDtoD_v3020,
    cuMemcpyDtoD_v2_ptds: PFN_cuMemcpyDtoD_v7000_ptds,
    cuMemcpyHtoDAsync_v2: PFN_cuMemcpyHtoDAsync_v3020,
    cuMemcpyHtoDAsync_v2_ptsz: PFN_cuMemcpyHtoDAsync_v7000_ptsz,
    cuMemcpyDtoHAsync_v2: PFN_cuMemcpyDtoHAsync_v3020,
    cuMemcpyDtoHAsync_v2_ptsz: PFN_cuMemcpyDtoHAsync_v7000_ptsz,
    cuMemsetD8_v2: PFN_cuMemsetD8_v3020,
    cuMemsetD8_v2_ptds: PFN_cuMemsetD8_v7000_ptds,
    cuArrayCreate: PFN_cuArrayCreate_v2000,
    cuArrayCreate_v2: PFN_cuArrayCreate_v3020,
    cuArray3DCreate: PFN_cuArray3DCreate_v2000,
    cuArray3DCreate_v2: PFN_cuArray3DCreate_v3020,
    cuArrayDestroy: PFN_cuArrayDestroy_v2000,
    cuMipmappedArrayCreate: PFN_cuMipmappedArrayCreate_v5000,
    cuMipmappedArrayDestroy: PFN_cuMipmappedArrayDestroy_v5000,
    cuMemAddressReserve: PFN_cuMemAddressReserve_v10020,
    cuMemAddressFree: PFN_cuMemAddressFree_v10020,
    cuMemCreate: PFN_cuMemCreate_v10020,
    cuMemRelease: PFN_cuMemRelease_v10020,
    cuMemRetainAllocationHandle: PFN_cuMemRetainAllocationHandle_v11000,
    cuMemExportToShareableHandle: PFN_cuMemExportToShareableHandle_v10020,
    cuMemImportFromShareableHandle: PFN_cuMemImportFromShareableHandle_v10020,
    cuMemGetAllocationPropertiesFromHandle: PFN_cuMemGetAllocationPropertiesFromHandle_v10020,
    cuMemMap: PFN_cuMemMap_v10020,
    cuMemUnmap: PFN_cuMemUnmap_v10020,
    cuMemSetAccess: PFN_cuMemSetAccess_v10020,
    cuMemGetAllocationGranularity: PFN_cuMemGetAllocationGranularity_v10020,
    cuMemFreeAsync: PFN_cuMemFreeAsync_v11020,
    cuMemFreeAsync_ptsz: PFN_cuMemFreeAsync_v11020_ptsz,
    cuMemAllocAsync: PFN_cuMemAllocAsync_v11020,
    cuMemAllocAsync_ptsz: PFN_cuMemAllocAsync_v11020_ptsz,
    cuMemPoolCreate: PFN_cuMemPoolCreate_v11020,
    cuMemPoolDestroy: PFN_cuMemPoolDestroy_v11020,
    cuMemPoolTrimTo: PFN_cuMemPoolTrimTo_v11020,
    cuMemPoolGetAttribute: PFN_cuMemPoolGetAttribute_v11020,
    cuMemPoolSetAttribute: PFN_cuMemPoolSetAttribute_v11020,
    cuDeviceGetDefaultMemPool: PFN_cuDeviceGetDefaultMemPool_v11020,
    cuDeviceGetMemPool: PFN_cuDeviceGetMemPool_v11020,
    cuDeviceSetMemPool: PFN_cuDeviceSetMemPool_v11020,
    cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync_v11020,
    cuMemAllocFromPoolAsync_ptsz: PFN_cuMemAllocFromPoolAsync_v11020_ptsz,
    cuPointerGetAttribute: PFN_cuPointerGetAttribute_v4000,
    cuStreamCreate: PFN_cuStreamCreate_v2000,
    cuStreamGetCtx: PFN_cuStreamGetCtx_v9020,
    cuStreamGetCtx_ptsz: PFN_cuStreamGetCtx_v9020_ptsz,
    cuStreamGetCtx_v2: PFN_cuStreamGetCtx_v12050,
    cuStreamGetCtx_v2_ptsz: PFN_cuStreamGetCtx_v12050_ptsz,
    cuStreamGetDevice: PFN_cuStreamGetDevice_v12080,
    cuStreamGetDevice_ptsz: PFN_cuStreamGetDevice_v12080_ptsz,
    cuStreamWaitEvent: PFN_cuStreamWaitEvent_v3020,
    cuStreamWaitEvent_ptsz: PFN_cuStreamWaitEvent_v7000_ptsz,
    cuStreamQuery: PFN_cuStreamQuery_v2000,
    cuStreamQuery_ptsz: PFN_cuStreamQuery_v7000_ptsz,
    cuStreamBeginCapture: PFN_cuStreamBeginCapture_v10000,
    cuStreamBeginCapture_ptsz: PFN_cuStreamBeginCapture_v10000_ptsz,
    cuStreamBeginCapture_v2: PFN_cuStreamBeginCapture_v10010,
    cuStreamBeginCapture_v2_ptsz: PFN_cuStreamBeginCapture_v10010_ptsz,
    cuStreamBeginCaptureToGraph: PFN_cuStreamBeginCaptureToGraph_v12030,
    cuStreamBeginCaptureToGraph_ptsz: PFN_cuStreamBeginCaptureToGraph_v12030_ptsz,
    cuStreamEndCapture: PFN_cuStreamEndCapture_v10000,
    cuStreamEndCapture_ptsz: PFN_cuStreamEndCapture_v10000_ptsz,
    cuStreamIsCapturing: PFN_cuStreamIsCapturing_v10000,
    cuStreamIsCapturing_ptsz: PFN_cuStreamIsCapturing_v10000_ptsz,
    cuStreamGetCaptureInfo_v2: PFN_cuStreamGetCaptureInfo_v11030,
    cuStreamGetCaptureInfo_v2_ptsz: PFN_cuStreamGetCaptureInfo_v11030_ptsz,
    cuStreamGetCaptureInfo_v3: PFN_cuStreamGetCaptureInfo_v12030,
    cuStreamGetCaptureInfo_v3_ptsz: PFN_cuStreamGetCaptureInfo_v12030_ptsz,
    cuStreamSynchronize: PFN_cuStreamSynchronize_v2000,
    cuStreamSynchronize_ptsz: PFN_cuStreamSynchronize_v7000_ptsz,
    cuStreamDestroy: PFN_cuStreamDestroy_v2000,
    cuStreamDestroy_v2: PFN_cuStreamDestroy_v4000,
    cuEventCreate: PFN_cuEventCreate_v2000,
    cuEventRecord: PFN_cuEventRecord_v2000,
    cuEventRecord_ptsz: PFN_cuEventRecord_v7000_ptsz,
    cuEventQuery: PFN_cuEventQuery_v2000,
    cuEventSynchronize: PFN_cuEventSynchronize_v2000,
    cuEventDestroy: PFN_cuEventDestroy_v2000,
    cuEventDestroy_v2: PFN_cuEventDestroy_v4000,
    cuEventElapsedTime: PFN_cuEventElapsedTime_v2000,
    cuEventElapsedTime_v2: PFN_cuEventElapsedTime_v12080,
    cuLaunchKernel: PFN_cuLaunchKernel_v4000,
    cuLaunchKernel_ptsz: PFN_cuLaunchKernel_v7000_ptsz,
    cuLaunchKernelEx: PFN_cuLaunchKernelEx_v11060,
    cuLaunchKernelEx_ptsz: PFN_cuLaunchKernelEx_v11060_ptsz,
    cuLaunchCooperativeKernel: PFN_cuLaunchCooperativeKernel_v9000,
    cuLaunchCooperativeKernel_ptsz: PFN_cuLaunchCooperativeKernel_v9000_ptsz,
    cuLaunchCooperativeKernelMultiDevice: PFN_cuLaunchCooperativeKernelMultiDevice_v9000,
    cuFuncSetBlockShape: PFN_cuFuncSetBlockShape_v2000,
    cuFuncSetSharedSize: PFN_cuFuncSetSharedSize_v2000,
    cuParamSetSize: PFN_cuParamSetSize_v2000,
    cuParamSeti: PFN_cuParamSeti_v2000,
    cuParamSetf: PFN_cuParamSetf_v2000,
    cuParamSetv: PFN_cuParamSetv_v2000,
    cuLaunch: PFN_cuLaunch_v2000,
    cuLaunchGrid: PFN_cuLaunchGrid_v2000,
    cuLaunchGridAsync: PFN_cuLaunchGridAsync_v2000,
    cuGraphCreate: PFN_cuGraphCreate_v10000,
    cuGraphAddKernelNode: PFN_cuGraphAddKernelNode_v10000,
    cuGraphAddKernelNode_v2: PFN_cuGraphAddKernelNode_v12000,
    cuGraphInstantiate: PFN_cuGraphInstantiate_v10000,
    cuGraphInstantiate_v2: PFN_cuGraphInstantiate_v11000,
    cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags_v11040,
    cuGraphInstantiateWithParams: PFN_cuGraphInstantiateWithParams_v12000,
    cuGraphInstantiateWithParams_ptsz: PFN_cuGraphInstantiateWithParams_v12000_ptsz,
    cuGraphUpload: PFN_cuGraphUpload_v11010,
    cuGraphUpload_ptsz: PFN_cuGraphUpload_v11010_ptsz,
    cuGraphExecDestroy: PFN_cuGraphExecDestroy_v10000,
    cuGraphDestroy: PFN_cuGraphDestroy_v10000,
    cuGraphLaunch: PFN_cuGraphLaunch_v10000,
    cuGraphLaunch_ptsz: PFN_cuGraphLaunch_v10000_ptsz,
    cuGraphAddMemAllocNode: PFN_cuGraphAddMemAllocNode_v11040,
    cuGraphAddMemFreeNode: PFN_cuGraphAddMemFreeNode_v11040,
    cuGraphAddNode: PFN_cuGraphAddNode_v12020,
    cuGraphAddNode_v2: PFN_cuGraphAddNode_v12030,
    cuGraphNodeSetParams: PFN_cuGraphNodeSetParams_v12020,
    cuGraphExecNodeSetParams: PFN_cuGraphExecNodeSetParams_v12020,
    cuGraphGetNodes: PFN_cuGraphGetNodes_v10000,
    cuGraphNodeGetType: PFN_cuGraphNodeGetType_v10000,
    cuGraphKernelNodeGetParams: PFN_cuGraphKernelNodeGetParams_v10000,
    cuGraphKernelNodeGetParams_v2: PFN_cuGraphKernelNodeGetParams_v12000,
    cuGraphChildGraphNodeGetGraph: PFN_cuGraphChildGraphNodeGetGraph_v10000,
    cuGraphExecKernelNodeSetParams: PFN_cuGraphExecKernelNodeSetParams_v10010,
    cuGraphExecKernelNodeSetParams_v2: PFN_cuGraphExecKernelNodeSetParams_v12000,
    cuGraphExecChildGraphNodeSetParams: PFN_cuGraphExecChildGraphNodeSetParams_v11010,
    cuGraphExecUpdate: PFN_cuGraphExecUpdate_v10020,
    cuGraphExecUpdate_v2: PFN_cuGraphExecUpdate_v12000,
    cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim_v11040,
    cuDeviceGetGraphMemAttribute: PFN_cuDeviceGetGraphMemAttribute_v11040,
    cuDeviceSetGraphMemAttribute: PFN_cuDeviceSetGraphMemAttribute_v11040,
    cuGetExportTable: PFN_cuGetExportTable_v3000,
    cuGetProcAddress: PFN_cuGetProcAddress_v11030,
    cuGetProcAddress_v2: PFN_cuGetProcAddress_v12000,
}

/// Resolves (name, version, flags): our function pointer, or the query result to report.
pub fn lookup(name: &str, version: i32, flags: u64) -> Result<*mut c_void, CUdriverProcAddressQueryResult> {
    match resolve(name, version, flags) {
        Resolution::Found(e) => exported(e.symbol).ok_or(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        Resolution::SymbolNotFound => Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        Resolution::VersionNotSufficient => Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
    }
}

/// Table entries deliberately not implemented: the pre-3.2 ABIs with 32-bit sizes and pointers
/// (our device addresses do not fit in 32 bits).
pub const LEGACY_UNIMPLEMENTED: &[&str] = &[
    "cuDeviceTotalMem", "cuMemGetInfo", "cuMemAlloc", "cuMemAllocPitch", "cuMemFree", "cuMemcpyHtoD", "cuMemcpyDtoH",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_export_has_the_abi_the_table_names() {
        for (sym, pfn) in IMPLEMENTED {
            let e = entry_for_symbol(sym).unwrap_or_else(|| panic!("{sym} not in the proc table"));
            assert_eq!(e.pfn, *pfn, "{sym}");
        }
    }

    #[test]
    fn every_table_entry_is_implemented_or_listed_legacy() {
        for e in PROC_TABLE {
            let implemented = IMPLEMENTED.iter().any(|(s, _)| *s == e.symbol);
            assert!(implemented || LEGACY_UNIMPLEMENTED.contains(&e.symbol), "{} neither implemented nor listed", e.symbol);
            assert!(!(implemented && LEGACY_UNIMPLEMENTED.contains(&e.symbol)));
        }
    }

    #[test]
    fn lookup_answers_by_version_and_flags() {
        let v2 = lookup("cuMemAlloc", 12000, 0).unwrap();
        assert_eq!(v2, exported("cuMemAlloc_v2").unwrap());
        assert_eq!(lookup("cuMemAlloc", 3000, 0), Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        assert_eq!(lookup("cuLaunchKernel", 12000, 2).unwrap(), exported("cuLaunchKernel_ptsz").unwrap());
        assert_ne!(lookup("cuLaunchKernel", 12000, 0).unwrap(), lookup("cuLaunchKernel", 12000, 2).unwrap());
        assert_eq!(lookup("", 12000, 0), Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        assert_eq!(lookup("cuLaunchKernelEx", 11000, 0), Err(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT));
        // The legacy 5-argument instantiation by version, then the name's CUDA 12.0 meaning.
        assert_eq!(lookup("cuGraphInstantiate", 10000, 0).unwrap(), exported("cuGraphInstantiate").unwrap());
        assert_eq!(lookup("cuGraphInstantiate", 11000, 0).unwrap(), exported("cuGraphInstantiate_v2").unwrap());
        assert_eq!(lookup("cuGraphInstantiate", 12000, 0).unwrap(), exported("cuGraphInstantiateWithFlags").unwrap());
    }
}
