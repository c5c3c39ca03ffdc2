//! `libxcuda.so`: the LD_PRELOAD library that enforces memory quota, launch throttle and graceful exit in offline CUDA processes.
//!
//! Modules, one job each: `api` (the exported C surface), `interpose` (which symbols we own,
//! `dlsym` and `cuGetProcAddress` rewriting), `real` (finding the real functions), `quota` +
//! `ptrmap` + `memory` (device-memory accounting), `nvml` (NVML memory view), `throttle` (eq. 1-2 + PID + token bucket),
//! `graphmem` (graph memory nodes), `capture` (stream captures in progress, which the exit path's synchronisations wait for), `graphcost` (graph launch prices), `streampool` (stream-ordered pools), `poolcount` (the
//! settled count both keep in the quota), `limits` (context limits that hold device memory),
//! `spin` (fork-safe locks),
//! `exit` (signals, exit, fork, context release), `budget` (the dynamic SM budget: MPS percentage
//! at start, throttle target while running), `config`, `state` (the process's instance).

pub mod api;
pub mod budget;
pub mod capture;
pub mod config;
pub mod exit;
pub mod graphcost;
pub mod graphmem;
pub mod interpose;
pub mod limits;
pub mod memory;
pub mod nvml;
pub mod poolcount;
pub mod ptrmap;
pub mod quota;
pub mod real;
pub mod spin;
pub mod state;
pub mod streampool;
pub mod throttle;
