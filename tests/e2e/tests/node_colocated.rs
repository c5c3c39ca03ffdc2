//! MuxFlow's own scenario under the whole node runtime (MPS + `sysmonitor` + `mps-manager` +
//! the offline client under `libxcuda.so`, shipped defaults), held longer than the monitor's
//! `overlimit_sustain_ms`: an online client on about 30 % of the SMs beside a back-to-back
//! offline job must not get the offline job evicted (a busy-time metric the offline job fills
//! alone is no online demand), while an online client that takes the whole GPU still does.
//! Before the fix the 30 % scenario on the T4 profile evicted the offline job about 3 s in
//! (Overlimit on `gpu_util` 100 > 98 for 2000 ms). Mechanisms are asserted, not timings.

mod workloads_support;

use workloads::demo::{node_runtime_phase, run_phase, DemoConfig, PhaseResult};
use workloads_support::*;

fn require_node_built() {
    require_built();
    for f in ["sysmonitor", "mps-manager", "libxcuda.so", "emu-mps-control"] {
        assert!(
            bin_dir().join(f).exists(),
            "{} is not built: run `cargo build --workspace --all-targets` first",
            bin_dir().join(f).display()
        );
    }
}

/// The node-runtime phase of `host-demo` on `profile` with online settings `cfg`; `machine`,
/// when given, replaces the monitor's shipped health-machine settings.
fn node_phase(profile: &str, cfg: &DemoConfig, machine: Option<&str>) -> PhaseResult {
    require_node_built();
    let host = host(profile);
    let root = host.root().to_path_buf();
    let phase = node_runtime_phase(&host).expect("node phase");
    if let Some(m) = machine {
        let f = root.join("sysmonitor.json");
        let text = std::fs::read_to_string(&f).expect("monitor config");
        let body = text.trim_end().strip_suffix('}').expect("a JSON object");
        std::fs::write(&f, format!("{body}, \"machine\": {m} }}")).expect("monitor config");
    }
    let r = run_phase(&host, cfg, &phase).unwrap_or_else(|e| panic!("{profile}: {e}"));
    eprintln!("{profile}: {r:?}");
    r
}

/// MuxFlow's scenario: 50 requests/s of 4 kernels of 1 ms on 30 % of the SMs, 10 s.
fn scenario(online_sm_fraction: f64) -> DemoConfig {
    DemoConfig {
        duration_s: 10.0,
        rate: 50.0,
        online_kernels: 4,
        online_kernel_us: 1000.0,
        online_sm_fraction,
        offline_kernel_us: 20_000.0,
        offline_warmup_s: 0.5,
    }
}

fn thirty_percent_online_keeps_the_offline_job(profile: &str) {
    let r = node_phase(profile, &scenario(0.3), None);
    assert_eq!(
        r.offline_evictions,
        Some(0),
        "{profile}: the offline job beside a 30 % online workload must not be evicted: {r:?}"
    );
    assert!(
        r.offline_iters_per_s.is_some_and(|x| x > 0.0),
        "{profile}: the offline job kept running: {r:?}"
    );
    assert!(r.requests.is_some_and(|n| n > 0), "{r:?}");
}

#[test]
fn t4_thirty_percent_online_for_10s_keeps_the_offline_job() {
    thirty_percent_online_keeps_the_offline_job("t4");
}

#[test]
fn h100_thirty_percent_online_for_10s_keeps_the_offline_job() {
    thirty_percent_online_keeps_the_offline_job("h100");
}

/// An online client that takes every SM (GPM's spatial SM activity reads the whole GPU even
/// with the offline job's MPS share taken off) is its own demand: the offline job is evicted.
/// The SM-activity limit is node-demo's (90 %, sustained 300 ms): on a loaded 2-core test box
/// the emulated online client's launch gaps keep a full-GPU burst's reading between 93 % and
/// 100 %, under the shipped 95 % for the shipped 2 s (a real backlogged GPU reads 100 %).
#[test]
fn h100_full_gpu_online_burst_still_evicts_the_offline_job() {
    let cfg = DemoConfig {
        duration_s: 5.0,
        rate: 300.0,
        online_kernels: 4,
        online_kernel_us: 2000.0,
        online_sm_fraction: 1.0,
        ..scenario(1.0)
    };
    let machine = r#"{
    "gpu_util":    { "healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false },
    "sm_activity": { "healthy": 60, "unhealthy": 75, "overlimit": 90 },
    "overlimit_sustain_ms": 300 }"#;
    let r = node_phase("h100", &cfg, Some(machine));
    assert!(
        r.offline_evictions.is_some_and(|n| n >= 1),
        "a full-GPU online burst must evict the offline job: {r:?}"
    );
}
