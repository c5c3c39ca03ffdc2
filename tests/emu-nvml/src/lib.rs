//! Fake `libnvidia-ml.so.1`: NVML queries answered from the emulated device state.
//!
//! Exports what `nvml-wrapper` calls for init/shutdown, versions, device handles, names,
//! UUIDs, utilization, memory, clocks, power, temperature, running processes, utilization
//! samples, the GPM metrics (SM utilization / occupancy, Hopper and newer) and XID event sets. Functions it
//! does not implement are simply not exported, so callers get "function not found".

mod api;
mod events;
mod gpm;
mod metrics;
mod source;
mod state;
