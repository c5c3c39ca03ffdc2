//! A monitor started or restarted while offline work runs beside an online service must not
//! evict the offline work in its first seconds. Until GPM's first snapshot (about a second; on
//! a GPU idle when the monitor starts, after 3 s of zeros) the monitor's SM activity is the
//! utilization rate, the busy fraction, which an offline job beside the online service fills
//! to 100 %. Labelled as GPM's spatial figure it was judged as the online workload's share of
//! the SMs the offline cap leaves, (100 - cap) / (100 - cap) = 100 %, and the monitor evicted
//! the job (before the fix the first monitor already did here, the co-location starting in its
//! first 3 s). Emulated H100 (GPM), MPS with mps-manager's budget, a shimmed offline job at its
//! 40 % MPS cap, an online load on 30 % of the SMs.

mod budget_support;
mod shim_support;

use std::time::{Duration, Instant};

use budget_support::*;
use e2e::{monitor_state as state, Load};
use shim_support::*;

/// SM activity judged alone (the online share of the spatial figure beside offline work,
/// about (70 - 40) / 60 = 50 % here), Overlimit sustained for 300 ms evicts. No required
/// throttle for offline work: the job runs with `XCUDA_THROTTLE=0` to keep the busy fraction
/// full, which the operator's floor would not allow.
const MONITOR: &str = r#"{
  "offline_throttle": { "required": false },
  "interval_ms": 10,
  "state_file_every_ms": 20,
  "host_memory": { "enabled": false },
  "evictor": { "grace_ms": 2000 },
  "machine": {
    "gpu_util":    { "healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false },
    "sm_activity": { "healthy": 60, "unhealthy": 85, "overlimit": 90 },
    "sm_clock":    { "healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false },
    "overlimit_sustain_ms": 300
  }
}
"#;

#[test]
fn a_restarted_monitor_keeps_co_located_offline_work() {
    let host = e2e::EmuHost::node();
    let mut mon = host.start_monitor("mon.json", MONITOR);
    host.wait_state(WAIT, "healthy", |v| state(v) == "healthy");
    let _mgr = host.start_manager("mps.json", &manager_config());
    budget_at_40(&host);

    // The offline job: back-to-back kernels on every SM it may use (its 40 % MPS cap), about
    // 20 s of them queued at once, throttle off (the busy fraction stays full); then it waits.
    let mut c = limited(&host, "shim_client", 256 * MIB, "job");
    c.env_remove(VAR).env("XCUDA_THROTTLE", "0");
    c.args(["ctx", "ready", "launch", "132", "19800000", "800", "wait"]);
    let mut job = host.spawn(&mut c);
    job.wait_for_line("ready", WAIT)
        .unwrap_or_else(|| panic!("the job never got a context:\n{}", job.stderr()));
    let online = Load::start(&host, 0.3, 5.0);
    // Co-located and judged with GPM's spatial figure: no eviction.
    host.wait_state(WAIT, "GPM's SM activity under both loads", |v| {
        v["sample"]["sm_source"] == "gpm" && v["sample"]["sm_activity"].as_f64().unwrap_or(0.0) > 50.0
    });
    std::thread::sleep(Duration::from_millis(500));
    let before = host.log("mon.json");
    assert!(!before.contains("evicting offline process"), "evicted before the restart:\n{before}");

    mon.signal(libc::SIGKILL);
    let _ = mon.wait_exit(WAIT);
    let restarted = host.start_monitor("mon.json", "");
    host.wait_state(WAIT, "the restarted monitor", |v| {
        v["monitor_pid"].as_u64() == Some(u64::from(restarted.pid()))
    });
    // Its first seconds, through GPM's first snapshot: the job stays.
    let end = Instant::now() + Duration::from_secs(3);
    let mut source_seen = Vec::new();
    while Instant::now() < end {
        let v = host.wait_state(WAIT, "a state", |_| true);
        let src = v["sample"]["sm_source"].as_str().unwrap_or("").to_string();
        if source_seen.last() != Some(&src) {
            source_seen.push(src);
        }
        assert!(job.wait_timeout(Duration::ZERO).is_none(), "the job is gone:\n{}", job.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = host.log("mon.json");
    assert!(
        !log.contains("evicting offline process"),
        "the restarted monitor evicted co-located offline work (sources seen {source_seen:?}):\n{log}"
    );
    assert!(source_seen.iter().any(|s| s == "gpm"), "GPM's figure came: {source_seen:?}");
    online.stop();
    // Not SIGTERM: the shim would let the ~20 s of queued kernels finish first. The host and
    // its MPS go with the test.
    job.signal(libc::SIGKILL);
}
