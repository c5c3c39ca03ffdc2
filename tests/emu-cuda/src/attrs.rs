//! `cuDeviceGetAttribute` answers derived from the device profile.

use cuda_abi::CUdevice_attribute as A;
use emu_device::DeviceInfo;

/// Highest attribute id the 12.9 headers define (`CU_DEVICE_ATTRIBUTE_MAX` = 144 is one past it).
const LAST_KNOWN: u32 = 143;

/// The attribute value, `None` for an id no driver knows (`CUDA_ERROR_INVALID_VALUE`).
/// (`CU_DEVICE_ATTRIBUTE_COMPUTE_MODE` is live state: `cuDeviceGetAttribute` answers it from the device.)
pub fn attribute(info: &DeviceInfo, a: A) -> Option<i32> {
    if let Some(v) = crate::extents::limit(a) {
        return i32::try_from(v).ok();
    }
    let (cc_major, cc_minor) = info.compute_capability;
    let v: i64 = match a {
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i64::from(i32::MAX),
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 49152,
        A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => 65536,
        A::CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        A::CU_DEVICE_ATTRIBUTE_MAX_PITCH => i64::from(i32::MAX),
        A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK => 65536,
        A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE => i64::from(info.max_sm_clock_mhz) * 1000,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => i64::from(info.sm_count),
        A::CU_DEVICE_ATTRIBUTE_INTEGRATED => 0,
        A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY => 1,
        A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS => 1,
        A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED => 1,
        A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => i64::from(info.pci_bus),
        A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID | A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => 0,
        A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => i64::from(info.mem_clock_mhz) * 1000,
        A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => i64::from(info.mem_bus_width),
        A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => match cc_major {
            9 => 50 << 20,
            8 => 6 << 20,
            _ => 4 << 20,
        },
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => {
            i64::from(emu_device::profile::max_threads_per_sm((cc_major, cc_minor)))
        }
        A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 3,
        A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING => 1,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => i64::from(cc_major),
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => i64::from(cc_minor),
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => match cc_major {
            9 => 233_472,
            8 => 102_400,
            _ => 65_536,
        },
        A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
        | A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH
        | A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH
        | A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => 1,
        A(id) if (1..=LAST_KNOWN).contains(&id) => 0,
        _ => return None,
    };
    i32::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_values() {
        let p = &emu_device::profile::T4;
        let info = DeviceInfo {
            profile_id: p.id.into(),
            name: p.name.into(),
            uuid: [0; 16],
            total_memory: p.total_memory,
            sm_count: p.sm_count,
            max_sm_clock_mhz: p.max_sm_clock_mhz,
            mem_clock_mhz: p.mem_clock_mhz,
            mem_bus_width: p.mem_bus_width,
            compute_capability: p.compute_capability,
            power_limit_mw: p.power_limit_mw,
            pci_bus: 0x3b,
        };
        assert_eq!(attribute(&info, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), Some(40));
        assert_eq!(attribute(&info, A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE), Some(1_590_000));
        assert_eq!(attribute(&info, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), Some(7));
        assert_eq!(attribute(&info, A(140)), Some(0));
        assert_eq!(attribute(&info, A(0)), None);
        assert_eq!(attribute(&info, A(9999)), None);
    }
}
