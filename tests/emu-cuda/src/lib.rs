//! Fake `libcuda.so.1`: the CUDA driver API, with NVIDIA's signatures and values (from
//! `cuda-abi`), over the emulated GPU of `emu-device` (state file `$GPUEMU_STATE`).
//!
//! * `api` — the exported C entry points (thin; panics caught).
//! * `driver` — process-local driver state: contexts, modules, streams, events, allocations.
//! * `procaddr` — `cuGetProcAddress(_v2)` answers from the shared proc table.
//! * `pools` — stream-ordered memory pools (reserve kept after frees, release threshold, trim).
//! * `ptx`, `memstore`, `attrs` — PTX entry parsing, device memory contents, device attributes.
//! * `extents` — the array extents cuda.h allows and the device limits behind them.
//!
//! Kernels: an entry named `spin` with one `u64` parameter runs that many cycles per block;
//! other kernels cost a nominal 2000 cycles per block. SM demand is min(blocks, SMs).

pub mod api;
pub mod attrs;
pub mod driver;
pub mod extents;
pub mod memstore;
pub mod pools;
pub mod procaddr;
pub mod ptx;
