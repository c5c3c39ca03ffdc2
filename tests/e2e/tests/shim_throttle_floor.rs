//! An offline tenant cannot switch its launch throttle off past the operator's floor. It
//! controls its own environment (`XCUDA_THROTTLE=0`, `XCUDA_TARGET_LOAD`, ...), so its shim's
//! own configuration cannot be what holds it: sysmonitor publishes a floor in the status file
//! (`offline_throttle`, which only the daemons write and containers get read-only), and every
//! shim holds its throttle to it. The test plays the monitor (online pressure, with or without
//! a floor, in the status file) and runs a shimmed client with `XCUDA_THROTTLE=0` as `nobody`,
//! as offline containers run; a 40 % MPS cap makes a low clock online pressure, which holds
//! the launches of a throttle that is on.

mod shim_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use node_ledger::{HealthState, MonitorSample, ThrottleFloor};
use shim_support::*;

/// What one client run showed: its ledger counters and its log.
struct Seen {
    launches: u64,
    launches_delayed: u64,
    stderr: String,
}

/// A client with `XCUDA_THROTTLE=0` (and `own_config` as its `XCUDA_CONFIG` file, when given)
/// launching `kernels` one-wave kernels beside a monitor that publishes online pressure and
/// `floor`; the pressure ends once the launches are printed or after `hold_for`, whichever
/// comes first. `late`: the floor is published only once the client runs (its first launch
/// waits for the test), as by a monitor that starts, or is reloaded to a tighter floor, after it.
fn throttle_off_beside_pressure(floor: ThrottleFloor, hold_for: Duration, own_config: Option<&str>, kernels: &str, late: bool) -> Seen {
    let host = host_for_users();
    let info = host.device().info();
    let ledger = ledger(&host);
    let status = status(&host);
    let pressure = Arc::new(AtomicBool::new(true));
    let floor_on = Arc::new(AtomicBool::new(!late));
    let stop = Arc::new(AtomicBool::new(false));
    let max = info.max_sm_clock_mhz;
    let monitor = {
        let (pressure, floor_on, stop) = (pressure.clone(), floor_on.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let busy = pressure.load(Ordering::Relaxed);
                let floor = if floor_on.load(Ordering::Relaxed) { floor } else { ThrottleFloor::default() };
                status.publish(&MonitorSample {
                    sm_active_permille: if busy { 1000 } else { 0 },
                    sm_clock_mhz: if busy { max / 2 } else { max },
                    sm_clock_max_mhz: max,
                    sm_count: info.sm_count,
                    throttle_floor: floor,
                    ..Default::default()
                }.with_health(HealthState::Healthy));
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let sms = info.sm_count.to_string();
    let mut c = limited(&host, "shim_client", 64 * MIB, "floor");
    c.env("XCUDA_THROTTLE", "0").env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40");
    if let Some(text) = own_config {
        let own = host.root().join("xcuda-own.json");
        std::fs::write(&own, text).unwrap();
        e2e::chmod(&own, 0o644);
        c.env("XCUDA_CONFIG", own);
    }
    c.args(["ctxon", "0", "sleep", "300"]);
    if late {
        c.args(["ready", "wait"]);
    }
    c.args(["launch", &sms, "1000", kernels, "ready", "wait"]);
    let mut k = host.spawn(as_nobody(&mut c));
    let msg = |k: &e2e::EmuChild| format!("{}\n{}", k.stdout(), k.stderr());
    if late {
        assert!(k.wait_for_line("ready", T).is_some(), "{}", msg(&k));
        floor_on.store(true, Ordering::Relaxed);
        // Controller ticks (10 ms) see it; then the launches.
        std::thread::sleep(Duration::from_millis(200));
        k.send_line("go");
    }
    let end = Instant::now() + hold_for;
    while k.lines("launch=").is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    pressure.store(false, Ordering::Relaxed);
    let readies = if late { 2 } else { 1 };
    let deadline = Instant::now() + T;
    while k.lines("ready").len() < readies && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(k.lines("ready").len(), readies, "{}", msg(&k));
    assert!(k.lines("launch=").iter().all(|l| e2e::field(l, "launch") == Some("0")), "{}", msg(&k));
    // The housekeeping tick (250 ms) reports the launch counts to the ledger.
    let pid = k.pid();
    let slot = || ledger.procs().into_iter().find(|p| p.pid == pid);
    let n: u64 = kernels.parse().unwrap();
    while slot().is_none_or(|p| p.launches < n) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = slot().unwrap_or_else(|| panic!("registered in the ledger: {}", msg(&k)));
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    k.send_line("go");
    k.finish(T);
    Seen { launches: p.launches, launches_delayed: p.launches_delayed, stderr: k.stderr() }
}

/// With the floor `required` published beside online pressure, the client's `XCUDA_THROTTLE=0`
/// is overridden: its launches are held (counted as delayed in its ledger slot), and its log
/// says why, once. Fails without the shim applying the floor: no launch is delayed.
#[test]
fn a_required_floor_turns_a_throttle_the_tenant_switched_off_back_on() {
    let floor = ThrottleFloor { required: true, max_target_load: 0.8, max_rate: 100_000.0, max_fallback_rate: 50.0 };
    // Two one-wave kernels fit the bucket's burst (4 waves): only a hold makes them wait.
    let s = throttle_off_beside_pressure(floor, Duration::from_millis(1200), None, "2", false);
    assert_eq!(s.launches, 2, "{}", s.stderr);
    assert!(s.launches_delayed > 0, "held by the online-pressure hold of a throttle forced on: {}", s.stderr);
    let said: Vec<&str> = s.stderr.lines().filter(|l| l.contains("turned on by the operator's floor")).collect();
    assert_eq!(said.len(), 1, "said once, at WARN: {}", s.stderr);
    assert!(said[0].contains("WARN") && said[0].contains("XCUDA_THROTTLE=0"), "{}", said[0]);
}

/// The control: the same client and pressure with no floor published (what a monitor of an
/// earlier layout, or `offline_throttle.required: false`, leaves) runs unthrottled, as its
/// `XCUDA_THROTTLE=0` asks: no launch is delayed.
#[test]
fn without_a_floor_a_throttle_switched_off_stays_off() {
    let s = throttle_off_beside_pressure(ThrottleFloor::default(), T, None, "2", false);
    assert_eq!((s.launches, s.launches_delayed), (2, 0), "{}", s.stderr);
    assert!(!s.stderr.contains("operator's floor"), "{}", s.stderr);
}

/// The floor holds from the process's first launch, not from its controller's first tick a
/// period later: a tenant whose own `XCUDA_CONFIG` sets a 3 s controller period (and
/// `XCUDA_THROTTLE=0`) launches 8 one-wave kernels at once, past the bucket's 4-wave burst;
/// with the floor read when the process's state is built, the launches past the burst wait for
/// the first refill. Fails without that first read (`floor_at_start`): all 8 go through
/// unthrottled before the controller first looks.
#[test]
fn the_floor_holds_before_the_controllers_first_tick() {
    let floor = ThrottleFloor { required: true, ..Default::default() };
    let own = r#"{ "throttle": { "enabled": false, "period_ms": 3000 } }"#;
    let s = throttle_off_beside_pressure(floor, Duration::from_millis(500), Some(own), "8", false);
    assert_eq!(s.launches, 8, "{}", s.stderr);
    assert!(s.launches_delayed > 0, "launches past the burst wait for a refill: {}", s.stderr);
}

/// A floor published after the process started (a monitor started, or reloaded to a tighter
/// floor, later) holds it from the controller's next tick. Fails without the controller's
/// look at the floor on each tick: the throttle the tenant switched off stays off.
#[test]
fn a_floor_published_after_the_process_started_holds_it_from_the_next_tick() {
    let floor = ThrottleFloor { required: true, ..Default::default() };
    let s = throttle_off_beside_pressure(floor, Duration::from_millis(1200), None, "2", true);
    assert_eq!(s.launches, 2, "{}", s.stderr);
    assert!(s.launches_delayed > 0, "held by the online-pressure hold of a throttle forced on: {}", s.stderr);
}

/// A floor requiring a throttle also holds the process's control law to the shipped one: a
/// tenant that leaves its throttle on but takes it apart in its own `XCUDA_CONFIG` (a bucket a
/// million waves deep, the online-pressure hold turned off; or every monitor sample called
/// stale, `stale_after_ms: 1`, which skips the hold and the PID) is held beside online pressure
/// all the same, and its log says the law was held. Fails without the law held
/// (`Throttle::tighten` leaving the law alone, or keeping a shorter staleness): the launches
/// run from the deep bucket, or at the open-loop rate, none delayed.
#[test]
fn a_required_floor_holds_a_control_law_the_tenant_loosened() {
    let floor = ThrottleFloor { required: true, ..Default::default() };
    for own in [r#"{ "throttle": { "burst": 1000000, "hold_below_clock": 0 } }"#, r#"{ "throttle": { "stale_after_ms": 1, "fallback_rate": 100000 } }"#] {
        let s = throttle_off_beside_pressure(floor, Duration::from_millis(1200), Some(own), "2", false);
        assert_eq!(s.launches, 2, "{own}: {}", s.stderr);
        assert!(s.launches_delayed > 0, "{own}: held by the shipped law's online-pressure hold: {}", s.stderr);
        assert!(s.stderr.lines().any(|l| l.contains("operator's floor") && l.contains("law_held=true")), "{own}: {}", s.stderr);
    }
}
