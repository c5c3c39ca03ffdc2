//! The throttle's online-pressure hold, end to end through the shim (issue 8, "Control that
//! works as MuxFlow intends"). MPS never preempts a running kernel, so while the online
//! workload runs the only protection is not launching offline kernels: a fresh monitor sample
//! with the SM clock under 85 % of its top holds every launch of an offline process capped at
//! <= half the SMs, until 500 ms after the last such sample. The test plays the monitor
//! (publishes samples into the status file) and watches the offline process's SM time on the
//! emulated device. Mechanism only: no latency or ratio is asserted.

mod shim_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::EmuHost;
use node_ledger::MonitorSample;
use shim_support::*;

/// SM time (ns) the offline process gained over `d`.
fn progress(dev: &e2e::emu_device::Device, pid: u32, d: Duration) -> f64 {
    let at = || {
        dev.snapshot()
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .map_or(0.0, |p| p.sm_time_ns)
    };
    let a = at();
    std::thread::sleep(d);
    at() - a
}

/// Runs an offline trainer under the shim (with `mps_pct` as its MPS percentage, if any)
/// while the test publishes samples whose SM clock is `clock_permille` of the top clock
/// (switchable while running); returns the SM time gained while calm, then under pressure,
/// then right after the pressure ends, and again once the hold has run out.
fn run(mps_pct: Option<&str>) -> [f64; 4] {
    let host = EmuHost::new();
    let dev = host.device();
    let info = dev.info();
    let l = status(&host);
    let clock_permille = Arc::new(AtomicU32::new(1000));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (clock, stop) = (clock_permille.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let c = clock.load(Ordering::Relaxed);
                l.publish(&MonitorSample {
                    health: node_ledger::HealthState::Healthy as u32,
                    sm_active_permille: 400,
                    gpu_util_permille: 1000,
                    sm_clock_mhz: info.max_sm_clock_mhz * c / 1000,
                    sm_clock_max_mhz: info.max_sm_clock_mhz,
                    sm_count: info.sm_count,
                    ..Default::default()
                });
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let mut off = limited(&host, "offline", 1 << 30, "trainer");
    off.env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if let Some(p) = mps_pct {
        off.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", p);
    }
    // Short kernels: the one in flight when the hold starts ends within milliseconds.
    off.args([
        "--kernel-us",
        "500",
        "--blocks",
        &info.sm_count.to_string(),
        "--state-mb",
        "4",
        "--report-interval",
        "0.2",
        "--json",
    ]);
    let mut offline = host.spawn(&mut off);
    let pid = offline.pid();
    let start = Instant::now();
    while progress(&dev, pid, Duration::from_millis(50)) <= 0.0 && start.elapsed() < T {}
    let calm = progress(&dev, pid, Duration::from_millis(400));
    clock_permille.store(800, Ordering::Relaxed); // online pressure: clock at 80 % of top
    std::thread::sleep(Duration::from_millis(200)); // seen, and the kernel in flight done
    let pressed = progress(&dev, pid, Duration::from_millis(300));
    clock_permille.store(1000, Ordering::Relaxed);
    let after = progress(&dev, pid, Duration::from_millis(150)); // inside the 500 ms hold
    std::thread::sleep(Duration::from_millis(400));
    let released = progress(&dev, pid, Duration::from_millis(400));
    offline.signal(libc::SIGTERM);
    offline.finish(T);
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    [calm, pressed, after, released]
}

#[test]
fn online_pressure_holds_a_capped_offline_process_and_releases_it() {
    let [calm, pressed, after, released] = run(Some("40"));
    let msg = format!("SM time ns: calm {calm:.0}, pressure {pressed:.0}, just after {after:.0}, released {released:.0}");
    eprintln!("{msg}");
    assert!(calm > 0.0, "runs while calm: {msg}");
    assert_eq!(pressed, 0.0, "held under online pressure: {msg}");
    assert_eq!(after, 0.0, "slow release: still held right after: {msg}");
    assert!(released > 0.0, "runs again once the hold ran out: {msg}");
}

/// Control: without a known cap of at most half the SMs the process could be lowering the
/// clock itself, so the same samples hold nothing (the PID alone acts).
#[test]
fn an_uncapped_process_is_not_held() {
    let [calm, pressed, _, _] = run(None);
    assert!(
        calm > 0.0 && pressed > 0.0,
        "calm {calm}, pressure {pressed}"
    );
}
