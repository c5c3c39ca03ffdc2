//! What NVML reports, read from the shared emulated device (`emu-device`, the state file named
//! by `GPUEMU_STATE`): one [`Snapshot`] per query.

use emu_device::Device;

use crate::metrics::Point;

/// The device facts and counters NVML answers from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Marketing name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Bytes allocated by all processes.
    pub used_memory: u64,
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
    /// Fraction of the device's recent window with a kernel running (0..=1).
    pub gpu_util: f64,
    /// Mean fraction of SMs busy over the same window (0..=1).
    pub sm_activity: f64,
    /// Cumulative counters now.
    pub point: Point,
}

/// NVML's UUID text for the device's 16 UUID bytes. Built without `format!` per byte: every
/// NVML query takes a snapshot, so this runs on the monitor's sampling path.
pub fn uuid_text(b: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(40);
    s.push_str("GPU-");
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(HEX[usize::from(x >> 4)] as char);
        s.push(HEX[usize::from(x & 15)] as char);
    }
    s
}

/// Opens every device of the emulated host (`GPUEMU_STATE` may list several state files).
pub fn open_all() -> Result<Vec<Device>, String> {
    Device::open_all_from_env().map_err(|e| e.to_string())
}

/// The current snapshot of `dev`.
pub fn snapshot(dev: &Device) -> Snapshot {
    let s = dev.snapshot();
    Snapshot {
        name: s.info.name.clone(),
        uuid: uuid_text(&s.info.uuid),
        total_memory: s.memory_total,
        used_memory: s.memory_used,
        sm_clock_mhz: s.sm_clock_mhz,
        max_sm_clock_mhz: s.info.max_sm_clock_mhz,
        mem_clock_mhz: s.info.mem_clock_mhz,
        cc_major: s.info.compute_capability.0,
        power_limit_mw: s.info.power_limit_mw,
        processes: s
            .processes
            .iter()
            .filter(|p| p.contexts > 0)
            .map(|p| (p.pid, p.used_memory))
            .collect(),
        gpu_util: s.gpu_util,
        sm_activity: s.sm_activity,
        point: Point {
            now_ns: s.timestamp_ns,
            busy_ns: s.busy_ns_total as u64,
            sm_active_ns: s.sm_active_ns_total as u64,
            sm_clock_mhz: s.sm_clock_mhz,
        },
    }
}

/// The device's utilization sample ring as points, oldest first.
pub fn samples(dev: &Device) -> Vec<Point> {
    dev.samples()
        .iter()
        .map(|s| Point {
            now_ns: s.t_ns,
            busy_ns: s.busy_ns as u64,
            sm_active_ns: s.sm_active_ns as u64,
            sm_clock_mhz: s.sm_clock_mhz.round() as u32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_has_nvml_shape() {
        let u = uuid_text(&[
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
        ]);
        assert_eq!(u, "GPU-12345678-9abc-def0-0102-030405060708");
    }
}
