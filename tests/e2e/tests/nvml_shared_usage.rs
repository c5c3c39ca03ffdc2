//! NVML through `nvml-wrapper` (the monitor's crate) against the fake `libnvidia-ml.so.1`:
//! two client processes allocate on one emulated GPU and both show up, with their memory;
//! utilization and SM activity (GPM) rise under load and fall when the load goes away.

mod workloads_support;

use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::Nvml;
use workloads_support::*;

const MIB: u64 = 1 << 20;

fn nvml_for(host: &Host) -> Nvml {
    for (k, v) in host.env() {
        if k.starts_with("GPUEMU_") {
            std::env::set_var(k, v);
        }
    }
    let lib = host.root().join("lib/libnvidia-ml.so.1");
    Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("nvmlInit against the emulator")
}

fn sm_util(nvml: &Nvml, dev: &nvml_wrapper::Device, gap: Duration) -> f64 {
    let a = dev.gpm_sample().expect("gpm sample");
    std::thread::sleep(gap);
    let b = dev.gpm_sample().expect("gpm sample");
    let m = nvml_wrapper::gpm::gpm_metrics_get(nvml, &a, &b, &[GpmMetricId::SmUtil])
        .expect("gpm metrics");
    m[0].as_ref().expect("SM_UTIL supported").value
}

#[test]
fn two_processes_see_each_other_and_load_through_nvml() {
    let host = host("h100");
    let nvml = nvml_for(&host);
    let dev = nvml.device_by_index(0).expect("device 0");
    assert_eq!(nvml.device_count().unwrap(), 1);
    assert!(dev.name().unwrap().contains("H100"));
    assert!(dev.uuid().unwrap().starts_with("GPU-"));
    assert_eq!(
        nvml.device_by_uuid(dev.uuid().unwrap())
            .unwrap()
            .index()
            .unwrap(),
        0
    );
    assert!(
        dev.gpm_support().expect("GPM query"),
        "H100 profile answers GPM"
    );
    let idle_used = dev.memory_info().unwrap().used;
    assert_eq!(dev.running_compute_processes().unwrap().len(), 0);

    let mut a = offline(&host, &["--state-mb", "64", "--kernel-us", "20000"]);
    let mut b = offline(&host, &["--state-mb", "128", "--kernel-us", "20000"]);
    a.wait_line("iters_per_s", Duration::from_secs(60));
    b.wait_line("iters_per_s", Duration::from_secs(60));

    let procs = dev
        .running_compute_processes()
        .expect("process list (size-query protocol)");
    let mem_of = |pid: u32| match procs
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| &p.used_gpu_memory)
    {
        Some(nvml_wrapper::enums::device::UsedGpuMemory::Used(b)) => *b,
        other => panic!("pid {pid} not listed with memory: {other:?} in {procs:?}"),
    };
    assert!(mem_of(a.pid()) >= 64 * MIB, "{procs:?}");
    assert!(mem_of(b.pid()) >= 128 * MIB, "{procs:?}");
    let mem = dev.memory_info().unwrap();
    assert!(
        mem.used >= idle_used + 192 * MIB,
        "used {} after two allocations",
        mem.used
    );
    assert_eq!(mem.total, mem.used + mem.free);

    let util = dev.utilization_rates().unwrap().gpu;
    assert!(
        util >= 80,
        "GPU utilization under back-to-back kernels: {util}%"
    );
    // The driver refreshes GPM counters about once a second: two samples closer than that
    // can be the same snapshot (0 %), as on a real H200; a longer gap spans a refresh. A
    // snapshot is the counters at its refresh: the first sample is taken a whole period after
    // the load is known to run, so that it is no snapshot of the idle GPU before.
    std::thread::sleep(Duration::from_nanos(e2e::emu_device::GPM_REFRESH_NS));
    let busy = sm_util(&nvml, &dev, Duration::from_millis(1100));
    assert!(
        busy >= 80.0,
        "SM utilization under two full-grid clients: {busy}%"
    );
    let sm = dev.clock_info(Clock::SM).unwrap();
    assert!(sm > 0 && sm <= dev.max_clock_info(Clock::SM).unwrap());
    assert!(dev.temperature(TemperatureSensor::Gpu).unwrap() > 30);
    assert!(dev.power_usage().unwrap() > 0);
    let samples = dev
        .samples(
            nvml_wrapper::enum_wrappers::device::Sampling::GpuUtilization,
            None,
        )
        .expect("samples");
    assert!(!samples.is_empty());

    let (sa, _) = a.stop(libc::SIGTERM, Duration::from_secs(30));
    let (sb, _) = b.stop(libc::SIGTERM, Duration::from_secs(30));
    assert!(sa.success() && sb.success());

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let util = dev.utilization_rates().unwrap().gpu;
        let procs = dev.running_compute_processes().unwrap();
        if util <= 5 && procs.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "load did not go away: util {util}%, processes {procs:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The first window may start at a snapshot taken while the clients still ran.
    let _ = sm_util(&nvml, &dev, Duration::from_millis(1100));
    assert!(sm_util(&nvml, &dev, Duration::from_millis(1100)) <= 5.0);
    assert_eq!(dev.memory_info().unwrap().used, idle_used);
}
