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

/// Device memory a process's first context takes beyond its local-memory reservation (the
/// driver's per-process state and module code). Measured on an H200 with driver 580: a context
/// took 526 MiB of which 264 MiB are local memory ([`context_local_bytes`]); as an MPS client
/// 228-290 MiB, the local memory alone (the MPS server holds the rest, once).
pub const CONTEXT_BASE_BYTES: u64 = 262 * MIB;

/// Resident threads per SM of compute capability `cc` (`CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR`).
pub fn max_threads_per_sm(cc: (u32, u32)) -> u32 {
    match cc {
        (7, 5) => 1024,
        (8, 6) | (8, 9) => 1536,
        _ => 2048,
    }
}

/// Device memory each context reserves for local memory: CUDA's default stack of 1 KiB
/// (`CU_LIMIT_STACK_SIZE`) for every thread the device can hold resident. H100: 132 SMs x 2048
/// threads = 264 MiB; T4: 40 MiB; A10: 108 MiB.
pub fn context_local_bytes(sm_count: u32, cc: (u32, u32)) -> u64 {
    u64::from(sm_count) * u64::from(max_threads_per_sm(cc)) * 1024
}

/// MPS clients one server takes at a time on a GPU of compute capability `cc`
/// (nvidia-cuda-mps-control(1): 16 for SM 3.5 through 6.x, 48 from SM 7.0, Volta MPS); the
/// driver refuses the next with `CUDA_ERROR_MPS_MAX_CLIENTS_REACHED`. Later NVIDIA documents
/// mention more on newer parts; the emulator takes the documented 48, the stricter figure.
pub fn mps_max_clients(cc: (u32, u32)) -> u32 {
    if cc.0 >= 7 {
        48
    } else {
        16
    }
}

/// All profiles, for lookup and `--help` text.
pub const ALL: [&Profile; 3] = [&T4, &A10, &H100];

impl Profile {
    /// Device memory a process's first context holds outside MPS (NVML counts it for the
    /// process): the per-process part and its local memory. H100: 526 MiB.
    pub fn context_bytes(&self) -> u64 {
        CONTEXT_BASE_BYTES + self.context_local_bytes()
    }

    /// Device memory each context holds for local memory (all an MPS client's context holds).
    pub fn context_local_bytes(&self) -> u64 {
        context_local_bytes(self.sm_count, self.compute_capability)
    }

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

    #[test]
    fn a_context_reserves_local_memory_for_every_resident_thread() {
        let local = |p: &Profile| context_local_bytes(p.sm_count, p.compute_capability) / MIB;
        assert_eq!(local(&H100), 264);
        assert_eq!(local(&A10), 108);
        assert_eq!(local(&T4), 40);
        // The H200 measurement this model comes from: 526 MiB alone, 264 as an MPS client.
        assert_eq!((CONTEXT_BASE_BYTES / MIB) + local(&H100), 526);
    }
}
