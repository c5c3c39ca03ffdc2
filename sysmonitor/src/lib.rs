//! Per-GPU health monitor: NVML sampling, the five-state health machine, eviction of offline work.

pub mod config;
pub mod daemon;
pub mod evictor;
pub mod health;
pub mod hostmem;
pub mod layered;
pub mod ledger;
pub mod monitor;
pub mod port;
pub mod procinfo;
pub mod report;
pub mod ring;
pub mod sampler;
pub mod sdnotify;
pub mod verify;
pub mod xidlog;
