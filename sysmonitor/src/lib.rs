//! Per-GPU health monitor: NVML sampling, the five-state health machine, eviction of offline work.

pub mod config;
pub mod daemon;
pub mod evictlog;
pub mod filewatch;
pub mod health;
pub mod hostmem;
pub mod ledger;
pub mod monitor;
pub mod nvmlcost;
pub mod port;
pub mod report;
pub mod ring;
pub mod sampler;
pub mod verify;
pub mod xidlog;
