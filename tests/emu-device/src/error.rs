//! Errors of the emulated device; each maps to the `CUresult` a real driver would give.

use cuda_abi::CUresult;
use std::path::PathBuf;

/// Why a device operation failed.
#[derive(Debug)]
pub enum EmuError {
    /// `GPUEMU_STATE` is not set.
    NoStatePath,
    /// `GPUEMU_PROFILE` names no known profile.
    BadProfile(String),
    /// `GPUEMU_STATE`'s list of state files has an empty entry or names one file twice.
    BadStateList(String),
    /// A system call on the state file failed.
    Io {
        /// The state file.
        path: PathBuf,
        /// The call that failed (`open`, `lock`, `stat`, `resize`, ...).
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The state file is not ours or from another layout version.
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// Which check failed (magic, version, size).
        detail: String,
    },
    /// Not enough free device memory.
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes free at the time.
        free: u64,
    },
    /// Every client slot is taken.
    TooManyClients,
    /// The MPS server has as many clients as the GPU's architecture allows
    /// ([`crate::profile::mps_max_clients`]); the driver refuses the next one with
    /// `CUDA_ERROR_MPS_MAX_CLIENTS_REACHED`.
    MpsMaxClients {
        /// The limit.
        limit: u32,
    },
    /// A bad argument (what and why).
    InvalidValue(String),
    /// No process with this pid holds the device.
    NoSuchClient(u32),
    /// MPS is poisoned or restarting: new clients are refused.
    MpsServerNotReady,
    /// The MPS server this client was attached to is gone.
    MpsClientTerminated,
    /// The MPS server tore this client down after a fatal GPU error (sticky, as on real MPS).
    MpsFatalError,
    /// MPS serves one user at a time: the running server belongs to `server_uid` (or a client
    /// of another user queued first), so this client of `uid` is queued by the control daemon
    /// until that server's clients are done. The fake libcuda waits (real MPS blocks the
    /// connection); the error is only what a single look answers.
    MpsUserQueued {
        /// Uid of the user whose server runs (or whose client is queued ahead).
        server_uid: u32,
        /// Effective uid of the queued client.
        uid: u32,
    },
    /// The client asked the control daemon for its user's server and the daemon has not yet
    /// handed it to one that holds its context (a server is starting, or the daemon has not
    /// looked yet). The fake libcuda waits, as a real client's connection blocks until the
    /// daemon tells it its server is ready; the error is only what a single look answers.
    MpsConnecting {
        /// Pid of the control daemon the client waits for.
        control_pid: u32,
    },
    /// The client's MPS connection failed: the control daemon could not start a server for it
    /// (or is gone). `CUDA_ERROR_MPS_CONNECTION_FAILED`, for the process's life.
    MpsConnectionFailed(String),
    /// The GPU is in EXCLUSIVE_PROCESS compute mode and process `holder` (a process outside
    /// MPS, or an MPS server) holds its one context: `CUDA_ERROR_DEVICE_UNAVAILABLE` ("all
    /// CUDA-capable devices are busy or unavailable").
    DeviceUnavailable {
        /// Pid of the process holding the device's context.
        holder: u32,
    },
    /// The GPU is in PROHIBITED compute mode: no context can be created (`CUDA_ERROR_UNKNOWN`,
    /// as cuda.h says of `cuCtxCreate` and `cuDevicePrimaryCtxRetain`).
    ComputeProhibited,
    /// A device setting only root may change (`NVML_ERROR_NO_PERMISSION`).
    NoPermission(String),
    /// A setting the device (or driver) does not support (`NVML_ERROR_NOT_SUPPORTED`).
    NotSupported(String),
}

impl EmuError {
    /// The driver status a real GPU would return for this failure.
    pub fn to_curesult(&self) -> CUresult {
        match self {
            EmuError::NoStatePath
            | EmuError::BadProfile(_)
            | EmuError::BadStateList(_)
            | EmuError::Io { .. } | EmuError::Corrupt { .. } => {
                CUresult::CUDA_ERROR_NO_DEVICE
            }
            EmuError::OutOfMemory { .. } => CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            EmuError::TooManyClients | EmuError::MpsMaxClients { .. } => CUresult::CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
            EmuError::InvalidValue(_) | EmuError::NoSuchClient(_) => CUresult::CUDA_ERROR_INVALID_VALUE,
            EmuError::MpsServerNotReady => CUresult::CUDA_ERROR_MPS_SERVER_NOT_READY,
            EmuError::MpsClientTerminated => CUresult::CUDA_ERROR_MPS_CLIENT_TERMINATED,
            EmuError::MpsFatalError => CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            EmuError::MpsUserQueued { .. } | EmuError::MpsConnecting { .. } | EmuError::MpsConnectionFailed(_) => {
                CUresult::CUDA_ERROR_MPS_CONNECTION_FAILED
            }
            EmuError::DeviceUnavailable { .. } => CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE,
            EmuError::ComputeProhibited => CUresult::CUDA_ERROR_UNKNOWN,
            EmuError::NoPermission(_) => CUresult::CUDA_ERROR_NOT_PERMITTED,
            EmuError::NotSupported(_) => CUresult::CUDA_ERROR_NOT_SUPPORTED,
        }
    }
}

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmuError::NoStatePath => write!(f, "GPUEMU_STATE is not set: point it at the emulated GPU's state file"),
            EmuError::BadProfile(p) => {
                write!(f, "GPUEMU_PROFILE={p:?} is not a known profile (use t4, a10 or h100)")
            }
            EmuError::BadStateList(v) => write!(
                f,
                "GPUEMU_STATE={v:?}: a list of state files (one per GPU) separated by ':' must name each file once and have no empty entry"
            ),
            EmuError::Io { path, op, source } => write!(f, "{op} {}: {source}", path.display()),
            EmuError::Corrupt { path, detail } => write!(f, "{}: not a GPU emulator state file: {detail}", path.display()),
            EmuError::OutOfMemory { requested, free } => {
                write!(f, "out of device memory: requested {requested} bytes, {free} free")
            }
            EmuError::TooManyClients => write!(f, "too many processes on the emulated GPU"),
            EmuError::MpsMaxClients { limit } => {
                write!(f, "the MPS server already has {limit} clients, all this GPU's architecture allows")
            }
            EmuError::InvalidValue(w) => write!(f, "invalid value: {w}"),
            EmuError::NoSuchClient(pid) => write!(f, "no process {pid} holds the emulated GPU"),
            EmuError::MpsServerNotReady => write!(f, "MPS server is not ready (a client died holding a context)"),
            EmuError::MpsClientTerminated => write!(f, "the MPS server this client was attached to has gone"),
            EmuError::MpsFatalError => write!(f, "the MPS server tore this client down after a fatal GPU error (a neighbour was killed with kernels in flight)"),
            EmuError::MpsUserQueued { server_uid, uid } => write!(
                f,
                "MPS serves one user at a time: the server of uid {server_uid} is active, so this client (uid {uid}) is queued until all its clients are done"
            ),
            EmuError::MpsConnecting { control_pid } => write!(
                f,
                "waiting for the MPS control daemon (pid {control_pid}) to hand this client to its user's server"
            ),
            EmuError::MpsConnectionFailed(why) => write!(f, "MPS connection failed: {why}"),
            EmuError::DeviceUnavailable { holder } => write!(
                f,
                "the GPU is in EXCLUSIVE_PROCESS compute mode and process {holder} holds its one context: device unavailable"
            ),
            EmuError::ComputeProhibited => write!(f, "the GPU is in PROHIBITED compute mode: no context can be created"),
            EmuError::NoPermission(what) => write!(f, "{what}: requires root"),
            EmuError::NotSupported(what) => write!(f, "{what}: not supported"),
        }
    }
}

impl std::error::Error for EmuError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EmuError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
