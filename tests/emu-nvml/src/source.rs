//! What NVML reports, read from the shared emulated device (`emu-device`, the state file named
//! by `GPUEMU_STATE`): the card's fixed facts once per process ([`Facts`]), the live counters
//! per query ([`emu_device::Counters`], [`emu_device::Reading`] where the utilization window
//! is asked for), the process list and utilization samples only for the queries that ask for
//! them.

use emu_device::{Device, DeviceInfo};

use crate::metrics::Point;

/// The card's fixed facts (set when its state file was created; a real driver reads them once
/// from the board too).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// Marketing name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Maximum SM clock, MHz.
    pub max_sm_clock_mhz: u32,
    /// Memory clock, MHz.
    pub mem_clock_mhz: u32,
    /// Compute capability major (GPM is answered for 9 and newer, as on Hopper).
    pub cc_major: u32,
    /// Board power limit, milliwatts.
    pub power_limit_mw: u32,
}

impl Facts {
    /// The NVML view of the emulator's card facts.
    pub fn of(i: &DeviceInfo) -> Facts {
        Facts {
            name: i.name.clone(),
            uuid: uuid_text(&i.uuid),
            max_sm_clock_mhz: i.max_sm_clock_mhz,
            mem_clock_mhz: i.mem_clock_mhz,
            cc_major: i.compute_capability.0,
            power_limit_mw: i.power_limit_mw,
        }
    }
}

/// The cumulative counters, as a GPM sample holds them.
pub fn point(r: &emu_device::Counters) -> Point {
    Point {
        now_ns: r.timestamp_ns,
        busy_ns: r.busy_ns_total as u64,
        sm_active_ns: r.sm_active_ns_total as u64,
        sm_clock_mhz: r.sm_clock_mhz,
    }
}

/// NVML's UUID text for the device's 16 UUID bytes. Built once per device and process.
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

/// The device's utilization samples newer than `after_us` (µs timestamps, NVML's
/// `lastSeenTimeStamp`) as points, oldest first, with the point before them (the start of the
/// first interval).
pub fn samples(dev: &Device, after_us: u64) -> Vec<Point> {
    // `t_ns / 1000 > after_us` <=> `t_ns > after_us * 1000 + 999`.
    dev.samples_after(after_us.saturating_mul(1000).saturating_add(999))
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
