//! The fake NVML's error answers: no emulated device named -> DriverNotLoaded (the monitor
//! treats the GPU as unavailable); T4 has no GPM (pre-Hopper), like the real card.

mod workloads_support;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use workloads_support::*;

#[test]
fn no_device_state_is_driver_not_loaded_and_t4_has_no_gpm() {
    let host = host("t4");
    let lib = host.root().join("lib/libnvidia-ml.so.1");
    std::env::remove_var("GPUEMU_STATE");
    match Nvml::builder().lib_path(lib.as_os_str()).init() {
        Err(NvmlError::DriverNotLoaded) => {}
        Err(e) => panic!("expected DriverNotLoaded, got {e:?}"),
        Ok(_) => panic!("init must fail without an emulated device"),
    }
    for (k, v) in host.env() {
        if k.starts_with("GPUEMU_") {
            std::env::set_var(k, v);
        }
    }
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("init");
    let dev = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        nvml.device_by_index(1),
        Err(NvmlError::InvalidArg)
    ));
    assert_eq!(dev.name().unwrap(), "Tesla T4");
    assert!(!dev.gpm_support().unwrap());
    assert!(matches!(dev.gpm_sample(), Err(NvmlError::NotSupported)));
    // Not exported on purpose: nvml-wrapper reports the missing symbol.
    assert!(matches!(
        dev.pcie_throughput(nvml_wrapper::enum_wrappers::device::PcieUtilCounter::Send),
        Err(NvmlError::FailedToLoadSymbol(_))
    ));
    nvml.shutdown().unwrap();
}
