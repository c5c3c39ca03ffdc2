//! Device profiles: the real cards the emulator can pretend to be.

/// What a card is: name, memory, SMs, clocks, compute capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// Short id used in `GPUEMU_PROFILE` (`t4`, `a10`, `h100`).
    pub id: &'static str,
    /// Marketing name as the driver reports it.
    pub name: &'static str,
    /// Device memory in bytes (what `cuDeviceTotalMem` / NVML report).
    pub total_memory: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Maximum (boost) SM clock in MHz.
    pub max_sm_clock_mhz: u32,
    /// SM clock of the idle card, MHz (what `nvidia-smi` shows with nothing running).
    pub idle_sm_clock_mhz: u32,
    /// Memory clock in MHz.
    pub mem_clock_mhz: u32,
    /// Memory bus width in bits.
    pub mem_bus_width: u32,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Board power limit in milliwatts.
    pub power_limit_mw: u32,
}

const MIB: u64 = 1024 * 1024;

/// NVIDIA Tesla T4 (Turing, 16 GB GDDR6, 40 SMs, 1590 MHz boost).
pub const T4: Profile = Profile {
    id: "t4",
    name: "Tesla T4",
    total_memory: 15360 * MIB,
    sm_count: 40,
    max_sm_clock_mhz: 1590,
    idle_sm_clock_mhz: 300,
    mem_clock_mhz: 5001,
    mem_bus_width: 256,
    compute_capability: (7, 5),
    power_limit_mw: 70_000,
};

/// NVIDIA A10 (Ampere, 24 GB GDDR6, 72 SMs, 1695 MHz boost).
pub const A10: Profile = Profile {
    id: "a10",
    name: "NVIDIA A10",
    total_memory: 23028 * MIB,
    sm_count: 72,
    max_sm_clock_mhz: 1695,
    idle_sm_clock_mhz: 210,
    mem_clock_mhz: 6251,
    mem_bus_width: 384,
    compute_capability: (8, 6),
    power_limit_mw: 150_000,
};

/// NVIDIA H100 SXM5 80GB (Hopper, 132 SMs, 1980 MHz boost).
pub const H100: Profile = Profile {
    id: "h100",
    name: "NVIDIA H100 80GB HBM3",
    total_memory: 81559 * MIB,
    sm_count: 132,
    max_sm_clock_mhz: 1980,
    idle_sm_clock_mhz: 345,
    mem_clock_mhz: 2619,
    mem_bus_width: 5120,
    compute_capability: (9, 0),
    power_limit_mw: 700_000,
};

/// All profiles, for lookup and `--help` text.
pub const ALL: [&Profile; 3] = [&T4, &A10, &H100];

impl Profile {
    /// Looks a profile up by id, case-insensitively.
    pub fn by_id(id: &str) -> Option<&'static Profile> {
        ALL.iter().copied().find(|p| p.id.eq_ignore_ascii_case(id.trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup() {
        assert_eq!(Profile::by_id("T4").unwrap().sm_count, 40);
        assert_eq!(Profile::by_id(" h100 ").unwrap().sm_count, 132);
        assert!(Profile::by_id("v100").is_none());
    }
}
