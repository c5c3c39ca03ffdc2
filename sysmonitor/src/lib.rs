//! Per-GPU health monitor: NVML sampling, the five-state health machine, eviction of offline work.
