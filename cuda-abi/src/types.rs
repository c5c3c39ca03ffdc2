//! Driver handle types, scalar typedefs, enums and the structs whose layout crosses the ABI.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, missing_docs)]

use std::os::raw::{c_int, c_uint, c_void};

/// `CUdevice` (`CUdevice_v1`): a device ordinal.
pub type CUdevice = c_int;
/// `CUdevice_v1`.
pub type CUdevice_v1 = c_int;
/// `CUdeviceptr` (`CUdeviceptr_v2`): a 64-bit device address.
pub type CUdeviceptr = u64;
/// `CUdeviceptr_v2`.
pub type CUdeviceptr_v2 = u64;
/// `CUdeviceptr_v1`: the 32-bit address of the pre-3.2 ABI.
pub type CUdeviceptr_v1 = c_uint;
/// `cuuint64_t` (`uint64_t`).
pub type cuuint64_t = u64;
/// `cuuint32_t` (`uint32_t`).
pub type cuuint32_t = u32;
/// `CUmemGenericAllocationHandle` (`unsigned long long`).
pub type CUmemGenericAllocationHandle = u64;
/// `CUmemGenericAllocationHandle_v1`.
pub type CUmemGenericAllocationHandle_v1 = u64;

macro_rules! opaque_handles {
    ($($handle:ident => $st:ident),* $(,)?) => {
        $(
            /// Opaque driver object (C `struct`), only ever used behind a pointer.
            #[repr(C)]
            pub struct $st {
                _private: [u8; 0],
            }
            /// Driver handle: pointer to the opaque object.
            pub type $handle = *mut $st;
        )*
        /// `(handle typedef, struct tag)` for every handle; used by the header test.
        pub const HANDLES: &[(&str, &str)] = &[$((stringify!($handle), stringify!($st))),*];
    };
}

opaque_handles! {
    CUcontext => CUctx_st,
    CUmodule => CUmod_st,
    CUfunction => CUfunc_st,
    CUstream => CUstream_st,
    CUevent => CUevent_st,
    CUarray => CUarray_st,
    CUmipmappedArray => CUmipmappedArray_st,
    CUgraphExec => CUgraphExec_st,
    CUmemoryPool => CUmemPoolHandle_st,
    CUgraph => CUgraph_st,
    CUgraphNode => CUgraphNode_st,
    CUkernel => CUkern_st,
    CUgreenCtx => CUgreenCtx_st,
}

/// Scalar typedefs and their sizes, for the header test.
pub const SCALARS: &[(&str, usize)] = &[
    ("CUdevice", std::mem::size_of::<CUdevice>()),
    ("CUdeviceptr", std::mem::size_of::<CUdeviceptr>()),
    ("CUdeviceptr_v1", std::mem::size_of::<CUdeviceptr_v1>()),
    ("cuuint64_t", std::mem::size_of::<cuuint64_t>()),
    ("cuuint32_t", std::mem::size_of::<cuuint32_t>()),
    ("CUmemGenericAllocationHandle", std::mem::size_of::<CUmemGenericAllocationHandle>()),
];

macro_rules! c_enums {
    ($($ty:ident { $($name:ident = $val:expr),* $(,)? })*) => {
        $(
            /// C enum, passed as its 32-bit value; unknown values pass through.
            #[repr(transparent)]
            #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
            pub struct $ty(pub u32);
            impl $ty {
                $(pub const $name: $ty = $ty($val);)*
            }
        )*
        /// `(type, enumerator, value)` for every enumerator declared here; used by the header test.
        pub const ENUM_VALUES: &[(&str, &str, u32)] = &[$($((stringify!($ty), stringify!($name), $val),)*)*];
    };
}

c_enums! {
    CUdevice_attribute {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
        CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
        CU_DEVICE_ATTRIBUTE_MAX_PITCH = 11,
        CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
        CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
        CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
        CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH = 21,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH = 22,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT = 23,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH = 24,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT = 25,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH = 26,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH = 27,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT = 28,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS = 29,
        CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
        CU_DEVICE_ATTRIBUTE_ECC_ENABLED = 32,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
        CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
        CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
        CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH = 42,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS = 43,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH = 45,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT = 46,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE = 47,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE = 48,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE = 49,
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH = 52,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH = 53,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS = 54,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH = 55,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH = 56,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT = 57,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH = 58,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT = 59,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH = 60,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH = 61,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS = 62,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH = 63,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT = 64,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS = 65,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH = 66,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH = 67,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS = 68,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH = 73,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT = 74,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
        CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH = 77,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
        CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
        CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
        CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH = 96,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
        CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
    }
    CUdriverProcAddress_flags {
        CU_GET_PROC_ADDRESS_DEFAULT = 0,
        CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
    }
    CUdriverProcAddressQueryResult {
        CU_GET_PROC_ADDRESS_SUCCESS = 0,
        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
        CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
    }
    CUlaunchAttributeID {
        CU_LAUNCH_ATTRIBUTE_IGNORE = 0,
        CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
        CU_LAUNCH_ATTRIBUTE_PRIORITY = 8,
    }
    CUmemAllocationType {
        CU_MEM_ALLOCATION_TYPE_INVALID = 0,
        CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    }
    CUmemAllocationHandleType {
        CU_MEM_HANDLE_TYPE_NONE = 0,
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
    }
    CUmemLocationType {
        CU_MEM_LOCATION_TYPE_INVALID = 0,
        CU_MEM_LOCATION_TYPE_DEVICE = 1,
        CU_MEM_LOCATION_TYPE_HOST = 2,
        CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
        CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
    }
    CUmemAccess_flags {
        CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
        CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
    }
    CUmemAllocationGranularity_flags {
        CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
    }
    CUarray_format {
        CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
        CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
        CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
        CU_AD_FORMAT_SIGNED_INT8 = 0x08,
        CU_AD_FORMAT_SIGNED_INT16 = 0x09,
        CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
        CU_AD_FORMAT_HALF = 0x10,
        CU_AD_FORMAT_FLOAT = 0x20,
    }
    CUpointer_attribute {
        CU_POINTER_ATTRIBUTE_CONTEXT = 1,
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    }
    CUmemorytype {
        CU_MEMORYTYPE_HOST = 1,
        CU_MEMORYTYPE_DEVICE = 2,
    }
    CUfunction_attribute {
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
        CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    }
    CUjit_option {
        CU_JIT_MAX_REGISTERS = 0,
    }
    CUgraphNodeType {
        CU_GRAPH_NODE_TYPE_KERNEL = 0,
        CU_GRAPH_NODE_TYPE_MEMCPY = 1,
        CU_GRAPH_NODE_TYPE_MEMSET = 2,
        CU_GRAPH_NODE_TYPE_HOST = 3,
        CU_GRAPH_NODE_TYPE_GRAPH = 4,
        CU_GRAPH_NODE_TYPE_EMPTY = 5,
        CU_GRAPH_NODE_TYPE_WAIT_EVENT = 6,
        CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7,
        CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL = 8,
        CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT = 9,
        CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
        CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
        CU_GRAPH_NODE_TYPE_BATCH_MEM_OP = 12,
        CU_GRAPH_NODE_TYPE_CONDITIONAL = 13,
    }
    CUgraphExecUpdateResult {
        CU_GRAPH_EXEC_UPDATE_SUCCESS = 0,
        CU_GRAPH_EXEC_UPDATE_ERROR = 1,
        CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2,
        CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 3,
        CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED = 4,
        CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED = 5,
        CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED = 6,
        CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE = 7,
        CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED = 8,
    }
    CUgraphChildGraphNodeOwnership {
        CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE = 0,
        CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE = 1,
    }
    CUgraphMem_attribute {
        CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
        CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
        CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3,
    }
    CUlimit {
        CU_LIMIT_STACK_SIZE = 0,
        CU_LIMIT_PRINTF_FIFO_SIZE = 1,
        CU_LIMIT_MALLOC_HEAP_SIZE = 2,
        CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH = 3,
        CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 4,
        CU_LIMIT_MAX_L2_FETCH_GRANULARITY = 5,
        CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 6,
        CU_LIMIT_SHMEM_SIZE = 7,
        CU_LIMIT_CIG_ENABLED = 8,
        CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED = 9,
    }
    CUstreamCaptureStatus {
        CU_STREAM_CAPTURE_STATUS_NONE = 0,
        CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
        CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
    }
    CUstreamCaptureMode {
        CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
        CU_STREAM_CAPTURE_MODE_RELAXED = 2,
    }
    CUmemPool_attribute {
        CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
        CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
        CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
        CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
        CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
    }
    CUgraphInstantiateResult {
        CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
        CUDA_GRAPH_INSTANTIATE_ERROR = 1,
        CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE = 2,
        CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED = 3,
        CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED = 4,
    }
    CUgraphInstantiate_flags {
        CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1,
        CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD = 2,
        CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH = 4,
        CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY = 8,
    }
}

impl CUmemAllocationType {
    /// Managed-memory pools (`cuMemPoolCreate` / `cuMemGetDefaultMemPool`): new in CUDA 13.0.
    pub const CU_MEM_ALLOCATION_TYPE_MANAGED: CUmemAllocationType = CUmemAllocationType(2);
}

/// `(type, enumerator, value, first CUDA version whose cuda.h has it)` for enumerators newer than
/// the oldest headers the header test checks; used by the header test.
pub const ENUM_VALUES_SINCE: &[(&str, &str, u32, u32)] =
    &[("CUmemAllocationType", "CU_MEM_ALLOCATION_TYPE_MANAGED", 2, 13000)];

/// The newest CUDA version whose headers the table is checked against (`CUDA_VERSION` of the
/// newest `cuda.h` the header test compiles): requests for a newer version may name ABIs the table
/// does not know.
pub const NEWEST_CHECKED_CUDA_VERSION: u32 = 13000;

/// Flag values for `cuGetProcAddress` (`CUdriverProcAddress_flags`), as plain integers.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
/// Ask for the legacy-default-stream variant.
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
/// Ask for the per-thread-default-stream (`_ptsz` / `_ptds`) variant.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CU_LAUNCH_PARAM_END` marker in the `extra` array of `cuLaunchKernel`.
pub const CU_LAUNCH_PARAM_END: usize = 0;
/// `CU_LAUNCH_PARAM_BUFFER_POINTER` marker.
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
/// `CU_LAUNCH_PARAM_BUFFER_SIZE` marker.
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;
/// `CU_IPC_HANDLE_SIZE`.
pub const CU_IPC_HANDLE_SIZE: usize = 64;

/// `CUDA_ARRAY3D_DESCRIPTOR::Flags`: a layered array (`Depth` is the number of layers).
pub const CUDA_ARRAY3D_LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_DESCRIPTOR::Flags`: surface loads and stores allowed (the surface limits apply too).
pub const CUDA_ARRAY3D_SURFACE_LDST: u32 = 0x02;
/// `CUDA_ARRAY3D_DESCRIPTOR::Flags`: a cubemap (`Depth` is 6 faces, or 6 x layers when layered).
pub const CUDA_ARRAY3D_CUBEMAP: u32 = 0x04;
/// `CUDA_ARRAY3D_DESCRIPTOR::Flags`: used for texture gather (2D arrays only, gather limits).
pub const CUDA_ARRAY3D_TEXTURE_GATHER: u32 = 0x08;

/// `cuMemHostAlloc` flags: memory portable across contexts, mapped into the device's
/// address space, write-combined; no other bit is defined.
pub const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x01;
/// See [`CU_MEMHOSTALLOC_PORTABLE`].
pub const CU_MEMHOSTALLOC_DEVICEMAP: u32 = 0x02;
/// See [`CU_MEMHOSTALLOC_PORTABLE`].
pub const CU_MEMHOSTALLOC_WRITECOMBINED: u32 = 0x04;

/// `(macro, value)` of the `#define`d constants above; used by the header test.
pub const MACRO_VALUES: &[(&str, u64)] = &[
    ("CU_IPC_HANDLE_SIZE", CU_IPC_HANDLE_SIZE as u64),
    ("CUDA_ARRAY3D_LAYERED", CUDA_ARRAY3D_LAYERED as u64),
    ("CUDA_ARRAY3D_SURFACE_LDST", CUDA_ARRAY3D_SURFACE_LDST as u64),
    ("CUDA_ARRAY3D_CUBEMAP", CUDA_ARRAY3D_CUBEMAP as u64),
    ("CUDA_ARRAY3D_TEXTURE_GATHER", CUDA_ARRAY3D_TEXTURE_GATHER as u64),
    ("CU_MEMHOSTALLOC_PORTABLE", CU_MEMHOSTALLOC_PORTABLE as u64),
    ("CU_MEMHOSTALLOC_DEVICEMAP", CU_MEMHOSTALLOC_DEVICEMAP as u64),
    ("CU_MEMHOSTALLOC_WRITECOMBINED", CU_MEMHOSTALLOC_WRITECOMBINED as u64),
];

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUipcMemHandle` (`CUipcMemHandle_v1`), passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [u8; CU_IPC_HANDLE_SIZE],
}
/// `CUipcMemHandle_v1`.
pub type CUipcMemHandle_v1 = CUipcMemHandle;

/// `CUlaunchAttributeValue`: a 64-byte union; read it through the accessors.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchAttributeValue {
    pub pad: [u64; 8],
}

impl CUlaunchAttributeValue {
    /// The first `int` member (`cooperative`, `priority`, ... share offset 0).
    pub fn as_int(&self) -> i32 {
        (self.pad[0] & 0xffff_ffff) as u32 as i32
    }
}

/// `CUlaunchAttribute`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: CUlaunchAttributeID,
    pub pad: [u8; 4],
    pub value: CUlaunchAttributeValue,
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchConfig {
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub numAttrs: c_uint,
}

/// `CUDA_LAUNCH_PARAMS_v1` (= `CUDA_LAUNCH_PARAMS`): one device's launch of
/// `cuLaunchCooperativeKernelMultiDevice` (CUDA 9.0).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_LAUNCH_PARAMS_v1 {
    pub function: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub kernelParams: *mut *mut c_void,
}
/// `CUDA_LAUNCH_PARAMS`.
pub type CUDA_LAUNCH_PARAMS = CUDA_LAUNCH_PARAMS_v1;

/// The graph kernel-node parameter structs: CUDA 10.0's fields, then those a later ABI added.
macro_rules! kernel_node_params {
    ($($(#[$doc:meta])* $name:ident { $($more:ident : $t:ty),* $(,)? })*) => {
        $(
            $(#[$doc])*
            #[repr(C)]
            #[derive(Clone, Copy)]
            pub struct $name {
                pub func: CUfunction,
                pub gridDimX: c_uint,
                pub gridDimY: c_uint,
                pub gridDimZ: c_uint,
                pub blockDimX: c_uint,
                pub blockDimY: c_uint,
                pub blockDimZ: c_uint,
                pub sharedMemBytes: c_uint,
                pub kernelParams: *mut *mut c_void,
                pub extra: *mut *mut c_void,
                $(pub $more: $t,)*
            }
        )*
    };
}

kernel_node_params! {
    /// `CUDA_KERNEL_NODE_PARAMS_v1` (graph kernel node of the CUDA 10.0 ABI).
    CUDA_KERNEL_NODE_PARAMS_v1 {}
    /// `CUDA_KERNEL_NODE_PARAMS` (`_v2`, CUDA 12.0): v1 plus a `CUkernel` and a context.
    CUDA_KERNEL_NODE_PARAMS { kern: CUkernel, ctx: CUcontext }
}
/// `CUDA_KERNEL_NODE_PARAMS_v2`.
pub type CUDA_KERNEL_NODE_PARAMS_v2 = CUDA_KERNEL_NODE_PARAMS;

/// `CUmemLocation` (`CUmemLocation_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: CUmemLocationType,
    pub id: c_int,
}
/// `CUmemLocation_v1`.
pub type CUmemLocation_v1 = CUmemLocation;

/// The anonymous `allocFlags` member of `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUmemAllocationPropAllocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp` (`CUmemAllocationProp_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: CUmemAllocationType,
    pub requestedHandleTypes: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocationPropAllocFlags,
}
/// `CUmemAllocationProp_v1`.
pub type CUmemAllocationProp_v1 = CUmemAllocationProp;

/// `CUmemAccessDesc` (`CUmemAccessDesc_v1`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: CUmemAccess_flags,
}
/// `CUmemAccessDesc_v1`.
pub type CUmemAccessDesc_v1 = CUmemAccessDesc;

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}
/// `CUDA_ARRAY_DESCRIPTOR_v2`.
pub type CUDA_ARRAY_DESCRIPTOR_v2 = CUDA_ARRAY_DESCRIPTOR;

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}
/// `CUDA_ARRAY3D_DESCRIPTOR_v2`.
pub type CUDA_ARRAY3D_DESCRIPTOR_v2 = CUDA_ARRAY3D_DESCRIPTOR;

/// The type-specific part of [`CUgraphNodeParams`] (cuda.h's anonymous union; the members the
/// shim and the emulator read).
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUgraphNodeParamsUnion {
    pub reserved1: [i64; 29],
    /// `CUDA_KERNEL_NODE_PARAMS_v3` (the layout of [`CUDA_KERNEL_NODE_PARAMS`]).
    pub kernel: CUDA_KERNEL_NODE_PARAMS,
    /// `CUDA_MEM_ALLOC_NODE_PARAMS_v2` (the layout of [`CUDA_MEM_ALLOC_NODE_PARAMS`]).
    pub alloc: CUDA_MEM_ALLOC_NODE_PARAMS,
    /// `CUDA_MEM_FREE_NODE_PARAMS`: the address to free.
    pub free: CUdeviceptr,
    /// `CUDA_CHILD_GRAPH_NODE_PARAMS`: a child graph node.
    pub graph: CUDA_CHILD_GRAPH_NODE_PARAMS,
}

/// `CUDA_CHILD_GRAPH_NODE_PARAMS` (CUDA 12.2; `ownership` since 12.9, zero before: a clone):
/// the child graph of a `CU_GRAPH_NODE_TYPE_GRAPH` node, cloned into the parent or moved there
/// (only a moved child may hold memory nodes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_CHILD_GRAPH_NODE_PARAMS {
    pub graph: CUgraph,
    pub ownership: CUgraphChildGraphNodeOwnership,
}

/// `CUgraphNodeParams` (CUDA 12.2): a tagged union of every node type's parameters
/// (`cuGraphAddNode`, `cuGraphNodeSetParams`, `cuGraphExecNodeSetParams`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUgraphNodeParams {
    pub type_: CUgraphNodeType,
    pub reserved0: [c_int; 3],
    pub u: CUgraphNodeParamsUnion,
    pub reserved2: i64,
}

/// `CUgraphExecUpdateResultInfo` (`_v1`, CUDA 12.0): why `cuGraphExecUpdate_v2` refused an
/// update, and the node it refused.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUgraphExecUpdateResultInfo {
    pub result: CUgraphExecUpdateResult,
    pub errorNode: CUgraphNode,
    pub errorFromNode: CUgraphNode,
}
/// `CUgraphExecUpdateResultInfo_v1`.
pub type CUgraphExecUpdateResultInfo_v1 = CUgraphExecUpdateResultInfo;

/// `CUgraphEdgeData` (CUDA 12.3): the ports and type of a graph edge.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUgraphEdgeData {
    pub from_port: u8,
    pub to_port: u8,
    pub type_: u8,
    pub reserved: [u8; 5],
}

/// `CUDA_ARRAY_DESCRIPTOR_v1`: the CUDA 2.0 ABI of `cuArrayCreate` (32-bit sizes), still
/// exported by the driver as the unversioned symbol and answered by `cuGetProcAddress` for a
/// `cudaVersion` below 3020.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`: the CUDA 2.0 ABI of `cuArray3DCreate` (32-bit sizes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub Width: c_uint,
    pub Height: c_uint,
    pub Depth: c_uint,
    pub Format: CUarray_format,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// `CUmemPoolProps` (`CUmemPoolProps_v1`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemPoolProps {
    pub allocType: CUmemAllocationType,
    pub handleTypes: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}
/// `CUmemPoolProps_v1`.
pub type CUmemPoolProps_v1 = CUmemPoolProps;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`CUDA_MEM_ALLOC_NODE_PARAMS_v1`): a graph memory
/// allocation node; `dptr` is an out-parameter (the allocation's fixed address).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub poolProps: CUmemPoolProps,
    pub accessDescs: *const CUmemAccessDesc,
    pub accessDescCount: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}
/// `CUDA_MEM_ALLOC_NODE_PARAMS_v1`.
pub type CUDA_MEM_ALLOC_NODE_PARAMS_v1 = CUDA_MEM_ALLOC_NODE_PARAMS;

impl CUDA_MEM_ALLOC_NODE_PARAMS {
    /// `bytesize` bytes of pinned memory on device ordinal `device` (the one kind of memory a
    /// graph allocation node takes), no further access descriptors, everything else zero.
    pub fn pinned_on_device(device: c_int, bytesize: usize) -> Self {
        // SAFETY: plain C data; all-zero is a valid value of every field (null pointers, zero
        // enum values and sizes), as C callers `memset` it.
        let mut p: Self = unsafe { std::mem::zeroed() };
        p.poolProps.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device };
        p.bytesize = bytesize;
        p
    }
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (`CUDA_GRAPH_INSTANTIATE_PARAMS_st`), argument of
/// `cuGraphInstantiateWithParams`: `flags` are `CUgraphInstantiate_flags` bits; the driver writes
/// `hErrNode_out` and `result_out`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_GRAPH_INSTANTIATE_PARAMS {
    pub flags: cuuint64_t,
    pub hUploadStream: CUstream,
    pub hErrNode_out: CUgraphNode,
    pub result_out: CUgraphInstantiateResult,
}

/// `CUexecAffinityParam`: only passed behind a pointer here.
#[repr(C)]
pub struct CUexecAffinityParam {
    _private: [u8; 0],
}

/// `CUctxCreateParams`: only passed behind a pointer here.
#[repr(C)]
pub struct CUctxCreateParams {
    _private: [u8; 0],
}

/// Array format element size in bytes, `None` for formats this crate does not size.
pub fn array_format_bytes(f: CUarray_format) -> Option<u64> {
    Some(match f {
        CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8 | CUarray_format::CU_AD_FORMAT_SIGNED_INT8 => 1,
        CUarray_format::CU_AD_FORMAT_UNSIGNED_INT16
        | CUarray_format::CU_AD_FORMAT_SIGNED_INT16
        | CUarray_format::CU_AD_FORMAT_HALF => 2,
        CUarray_format::CU_AD_FORMAT_UNSIGNED_INT32
        | CUarray_format::CU_AD_FORMAT_SIGNED_INT32
        | CUarray_format::CU_AD_FORMAT_FLOAT => 4,
        _ => return None,
    })
}
