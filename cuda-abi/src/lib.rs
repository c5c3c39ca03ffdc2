//! CUDA driver API declarations (types, enum values, struct layouts, entry-point versions) as published in NVIDIA's `cuda.h` / `cudaTypedefs.h`.
//!
//! Shared by the emulator (`emu-cuda`) and the interposer (`xcuda-shim`): both answer
//! `cuGetProcAddress` from `resolve` over the one [`PROC_TABLE`], so they cannot disagree about
//! which exported symbol implements which (name, version, flags).

pub mod procs;
pub mod resolve;
pub mod result;
pub mod types;

pub use procs::{c_type, ProcEntry, Variant, PROC_TABLE};
pub use resolve::{entry_for_symbol, resolve, resolve_in, Resolution};
pub use result::CUresult;
pub use types::*;
pub use procs::*;
