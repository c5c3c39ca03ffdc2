//! `CUresult`: the driver status code, a transparent `u32` so unknown codes pass through unchanged.

/// A CUDA driver status code. Any `u32` is a valid value: codes newer than this table pass through.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CUresult(pub u32);

macro_rules! results {
    ($($name:ident = $val:literal),* $(,)?) => {
        impl CUresult {
            $(
                #[allow(missing_docs)]
                pub const $name: CUresult = CUresult($val);
            )*
            /// Every named code as `(C enumerator name, value)`; used by the header test.
            pub const ALL: &'static [(&'static str, u32)] = &[$((stringify!($name), $val)),*];
        }
    };
}

results! {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_PROFILER_DISABLED = 5,
    CUDA_ERROR_PROFILER_NOT_INITIALIZED = 6,
    CUDA_ERROR_PROFILER_ALREADY_STARTED = 7,
    CUDA_ERROR_PROFILER_ALREADY_STOPPED = 8,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_DEVICE_NOT_LICENSED = 102,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_UNMAP_FAILED = 206,
    CUDA_ERROR_ARRAY_IS_MAPPED = 207,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_ALREADY_ACQUIRED = 210,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_NOT_MAPPED_AS_ARRAY = 212,
    CUDA_ERROR_NOT_MAPPED_AS_POINTER = 213,
    CUDA_ERROR_ECC_UNCORRECTABLE = 214,
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_INVALID_GRAPHICS_CONTEXT = 219,
    CUDA_ERROR_NVLINK_UNCORRECTABLE = 220,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_JIT_COMPILATION_DISABLED = 223,
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224,
    CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC = 225,
    CUDA_ERROR_CONTAINED = 226,
    CUDA_ERROR_INVALID_SOURCE = 300,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302,
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED = 303,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_LOSSY_QUERY = 402,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING = 703,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_ASSERT = 710,
    CUDA_ERROR_TOO_MANY_PEERS = 711,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
    CUDA_ERROR_INVALID_PC = 718,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    CUDA_ERROR_TENSOR_MEMORY_LEAK = 721,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
    CUDA_ERROR_MPS_CONNECTION_FAILED = 805,
    CUDA_ERROR_MPS_RPC_FAILURE = 806,
    CUDA_ERROR_MPS_SERVER_NOT_READY = 807,
    CUDA_ERROR_MPS_MAX_CLIENTS_REACHED = 808,
    CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED = 809,
    CUDA_ERROR_MPS_CLIENT_TERMINATED = 810,
    CUDA_ERROR_CDP_NOT_SUPPORTED = 811,
    CUDA_ERROR_CDP_VERSION_MISMATCH = 812,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_MERGE = 902,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_TIMEOUT = 909,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
    CUDA_ERROR_EXTERNAL_DEVICE = 911,
    CUDA_ERROR_INVALID_CLUSTER_SIZE = 912,
    CUDA_ERROR_FUNCTION_NOT_LOADED = 913,
    CUDA_ERROR_INVALID_RESOURCE_TYPE = 914,
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915,
    CUDA_ERROR_KEY_ROTATION = 916,
    CUDA_ERROR_UNKNOWN = 999,
}

impl CUresult {
    /// True for `CUDA_SUCCESS`.
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// The C enumerator name (`"CUDA_ERROR_OUT_OF_MEMORY"`), or `None` for a code this table does not know.
    pub fn name(self) -> Option<&'static str> {
        Self::ALL.iter().find(|(_, v)| *v == self.0).map(|(n, _)| *n)
    }

    /// The same name, NUL-terminated, for handing out through the C ABI (`cuGetErrorName`).
    pub fn name_cstr(self) -> Option<&'static std::ffi::CStr> {
        NAMES_NUL.get_or_init(build_names).iter().find(|(v, _)| *v == self.0).map(|(_, s)| s.as_c_str())
    }

    /// A short English description (`cuGetErrorString`), NUL-terminated; `None` for unknown codes.
    pub fn description_cstr(self) -> Option<&'static std::ffi::CStr> {
        DESCS_NUL.get_or_init(build_descs).iter().find(|(v, _)| *v == self.0).map(|(_, s)| s.as_c_str())
    }

    /// A short English description of this code.
    pub fn description(self) -> Option<&'static str> {
        self.name()?;
        Some(match self {
            Self::CUDA_SUCCESS => "no error",
            Self::CUDA_ERROR_INVALID_VALUE => "invalid argument",
            Self::CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
            Self::CUDA_ERROR_NOT_INITIALIZED => "initialization error",
            Self::CUDA_ERROR_DEINITIALIZED => "driver shutting down",
            Self::CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
            Self::CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
            Self::CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
            Self::CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
            Self::CUDA_ERROR_INVALID_PTX => "a PTX JIT compilation failed",
            Self::CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
            Self::CUDA_ERROR_NOT_FOUND => "named symbol not found",
            Self::CUDA_ERROR_NOT_READY => "device not ready",
            Self::CUDA_ERROR_LAUNCH_FAILED => "unspecified launch failure",
            Self::CUDA_ERROR_NOT_PERMITTED => "operation not permitted",
            Self::CUDA_ERROR_NOT_SUPPORTED => "operation not supported",
            Self::CUDA_ERROR_MPS_CONNECTION_FAILED => "MPS client failed to connect to the MPS control daemon or the MPS server",
            Self::CUDA_ERROR_MPS_RPC_FAILURE => "the remote procedural call between the MPS server and the MPS client failed",
            Self::CUDA_ERROR_MPS_SERVER_NOT_READY => "MPS server is not ready to accept new MPS client requests",
            Self::CUDA_ERROR_MPS_MAX_CLIENTS_REACHED => "the hardware resources required to create MPS client have been exhausted",
            Self::CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED => "the hardware resources required to support device connections have been exhausted",
            Self::CUDA_ERROR_MPS_CLIENT_TERMINATED => "the MPS client has been terminated by the server",
            Self::CUDA_ERROR_UNKNOWN => "unknown error",
            _ => "CUDA driver error",
        })
    }
}

static NAMES_NUL: std::sync::OnceLock<Vec<(u32, std::ffi::CString)>> = std::sync::OnceLock::new();
static DESCS_NUL: std::sync::OnceLock<Vec<(u32, std::ffi::CString)>> = std::sync::OnceLock::new();

fn build_names() -> Vec<(u32, std::ffi::CString)> {
    CUresult::ALL.iter().map(|(n, v)| (*v, std::ffi::CString::new(*n).expect("no NUL in names"))).collect()
}

fn build_descs() -> Vec<(u32, std::ffi::CString)> {
    CUresult::ALL
        .iter()
        .map(|(_, v)| {
            let d = CUresult(*v).description().unwrap_or("CUDA driver error");
            (*v, std::ffi::CString::new(d).expect("no NUL in descriptions"))
        })
        .collect()
}

impl std::fmt::Debug for CUresult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

impl std::fmt::Display for CUresult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_codes_pass_through() {
        let r = CUresult(12345);
        assert_eq!(r.0, 12345);
        assert_eq!(r.name(), None);
        assert_eq!(format!("{r:?}"), "CUresult(12345)");
    }

    #[test]
    fn mps_codes_are_named() {
        assert_eq!(CUresult::CUDA_ERROR_MPS_CLIENT_TERMINATED.0, 810);
        assert_eq!(CUresult(805).name(), Some("CUDA_ERROR_MPS_CONNECTION_FAILED"));
        assert_eq!(CUresult(2).name_cstr().unwrap().to_str().unwrap(), "CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(CUresult(2).description_cstr().unwrap().to_str().unwrap(), "out of memory");
    }
}
