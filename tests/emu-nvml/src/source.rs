//! What NVML reports, read from the shared emulated device: one [`Snapshot`] per query.

/// The device facts and counters NVML answers from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Marketing name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `GPU-xxxxxxxx-...` UUID.
    pub uuid: String,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Bytes allocated by all processes.
    pub used_memory: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// Maximum SM clock, MHz.
    pub max_sm_clock_mhz: u32,
    /// Memory clock, MHz.
    pub mem_clock_mhz: u32,
    /// Compute capability major (GPM is answered for 9 and newer, as on Hopper).
    pub cc_major: u32,
    /// Board power limit, milliwatts.
    pub power_limit_mw: u32,
    /// Processes holding a context: (pid, bytes allocated).
    pub processes: Vec<(u32, u64)>,
    /// Emulated time of this snapshot, nanoseconds (monotonic, shared by all processes).
    pub now_ns: u64,
    /// Cumulative time during which at least one kernel ran, nanoseconds.
    pub busy_ns: u64,
    /// Cumulative SM-occupancy integral: sum over time of (busy SMs / SM count), nanoseconds.
    pub sm_active_ns: u64,
    /// A kernel is running at this instant.
    pub busy_now: bool,
    /// Fraction of SMs busy at this instant (0..=1).
    pub sm_active_now: f64,
}

impl Snapshot {
    /// Instantaneous state when no history exists: (kernel running now, SM-active fraction now).
    pub fn now_activity(&self) -> (bool, f64) {
        (self.busy_now, self.sm_active_now)
    }
}

/// Number of emulated devices.
pub fn device_count() -> Result<u32, String> {
    Err("the emulated device is not wired in yet (waiting for emu-device)".into())
}

/// The current snapshot of device `index`.
pub fn snapshot(index: u32) -> Result<Snapshot, String> {
    Err(format!("device {index}: the emulated device is not wired in yet"))
}
