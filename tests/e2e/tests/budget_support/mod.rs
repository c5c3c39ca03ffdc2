//! Set-up shared by the tests of the offline SM budget split under the whole node runtime
//! (emulated MPS + `mps-manager` + `sysmonitor` + shimmed offline clients):
//! `offline_budget_split.rs` and `offline_start_claims.rs`.
#![allow(dead_code)]

use std::time::Duration;

use e2e::{artifact, monitor_state as state, EmuChild, EmuHost, Load};

use crate::shim_support::{ledger, limited, MIB};

/// Bound for each wait.
pub const WAIT: Duration = Duration::from_secs(30);
/// The variable MPS reads at client start.
pub const VAR: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// The shim's floor (`xcuda::budget::MIN_MPS_PERCENTAGE`).
pub const FLOOR: u32 = 10;

/// The budget is `max_pct` = 40 while no online load runs (the offline clients here hold
/// contexts and run nothing); under load it follows the online estimate (total SM activity less
/// what the offline jobs hold), and comes back to 40 when the load stops.
pub fn manager_config() -> String {
    format!(
        r#"{{
  "control_bin": "{}",
  "command_timeout_ms": 2000,
  "period_ms": 50,
  "check_every_ms": 200,
  "compute_mode": "{}",
  "shm_dir": "host",
  "budget": {{ "headroom_pct": 10, "min_pct": 10, "max_pct": 40, "min_step_pct": 1, "smoothing": 1.0, "unsafe_pct": 10 }},
  "detect": {{ "stuck_after_ms": 0 }}
}}
"#,
        artifact("emu-mps-control").display(),
        e2e::manager_compute_mode()
    )
}

/// Judges SM activity only, Overlimit never sustained long enough to evict within the test.
/// An online load on 90 % of the SMs reads Overlimit as a whole (past 45), so the monitor asks
/// who is on the GPU and judges the online workload's own share, `(90 - cap) / (100 - cap)`,
/// past 45 for either cap here. Unhealthy and Overlimit (nearly) coincide so that a reading
/// on its way up (the load's first samples) moves nothing until it is judged with the cap.
pub const MONITOR: &str = r#"{
  "interval_ms": 20,
  "state_file_every_ms": 20,
  "host_memory": { "enabled": false },
  "machine": {
    "gpu_util":    { "healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false },
    "sm_activity": { "healthy": 10, "unhealthy": 45, "overlimit": 45.001 },
    "sm_clock":    { "healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false },
    "overlimit_sustain_ms": 60000
  }
}
"#;

/// [`e2e::wait_until`] for at most [`WAIT`].
pub fn wait_until<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    e2e::wait_until(what, WAIT, f)
}

/// A node with the monitor Healthy and mps-manager publishing its 40 % budget.
pub fn node_with_budget() -> (EmuHost, EmuChild, EmuChild) {
    let host = EmuHost::node();
    let mon = host.start_monitor("mon.json", MONITOR);
    host.wait_state(WAIT, "healthy", |v| state(v) == "healthy");
    let mgr = host.start_manager("mps.json", &manager_config());
    budget_at_40(&host);
    (host, mon, mgr)
}

/// Waits until mps-manager publishes (fresh) the 40 % budget it gives an idle GPU.
pub fn budget_at_40(host: &EmuHost) {
    let end = std::time::Instant::now() + WAIT;
    loop {
        let m = node_ledger::Status::open(&node_ledger::config::status_path(host.ledger_dir(), 0)).ok().and_then(|s| s.read_manager());
        if m.is_some_and(|m| {
            m.offline_sm_budget_permille == 400 && m.is_fresh(node_ledger::clock::now_ns(), 500_000_000)
        }) {
            return;
        }
        if std::time::Instant::now() >= end {
            // What the manager and the monitor saw, to tell a slow return from a stall.
            let tail = |name: &str| {
                let l = host.log(name);
                let lines: Vec<&str> = l.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            };
            panic!(
                "timed out waiting for the budget at 40 %: manager block {m:?} (now {} ns)\nmonitor state: {}\nmps-manager state: {}\nmonitor log:\n{}\nmanager log:\n{}",
                node_ledger::clock::now_ns(),
                std::fs::read_to_string(host.monitor_state_file()).unwrap_or_default(),
                std::fs::read_to_string(host.manager_state_file()).unwrap_or_default(),
                tail("mon.json"),
                tail("mps.json"),
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shimmed client of container `group` (256 MiB quota, no user percentage) that prints the
/// percentage it started with and holds a context until told to leave (`leave`): `--hold`
/// first makes it wait, loaded but before any driver call, for a line on stdin.
pub fn offline_client(host: &EmuHost, group: &str, hold: bool) -> EmuChild {
    let mut c = limited(host, "shim_client", 256 * MIB, group);
    c.env_remove(VAR);
    if hold {
        c.arg("--hold");
    }
    c.args(["env", VAR, "ctx", "ready", "wait"]);
    host.spawn(&mut c)
}

/// An offline job: one shimmed client of container `group` holding a context until it leaves.
pub fn offline_job(host: &EmuHost, group: &str) -> EmuChild {
    let mut k = offline_client(host, group, false);
    k.wait_for_line("ready", WAIT)
        .unwrap_or_else(|| panic!("{group} never got a context:\n{}", k.stderr()));
    k
}

/// The client ends its run and exits normally (a client killed holding a context would hang
/// its MPS neighbours until the manager's recovery).
pub fn leave(k: &mut EmuChild) {
    k.send_line("go");
    k.finish(WAIT);
}

/// The job's MPS percentage three ways, which must agree: the variable the shim set before
/// `main`, the limit the emulated MPS fixed at connection, the one recorded in its slot.
pub fn percentage(host: &EmuHost, k: &EmuChild) -> u32 {
    let env: u32 = k
        .lines("env=")
        .first()
        .and_then(|l| l.strip_prefix("env="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no percentage set: {:?}\n{}", k.lines("env="), k.stderr()));
    let on_gpu = host
        .device()
        .snapshot()
        .processes
        .iter()
        .find(|p| p.pid == k.pid() && p.mps_client)
        .map(|p| p.active_thread_pct)
        .unwrap_or_else(|| panic!("pid {} is no MPS client", k.pid()));
    let recorded = wait_until("the slot's percentage", || {
        ledger(host)
            .procs()
            .into_iter()
            .find(|p| p.pid == k.pid() && p.start_time != 0)
            .map(|p| p.mps_pct)
    });
    assert_eq!((on_gpu, recorded), (env, env), "pid {}", k.pid());
    env
}

/// With the online load on, the monitor's first transition out of Healthy, which states the
/// offline cap it judged with; then the load stops and the monitor is Healthy again. The load
/// starts once the monitor reads GPM's SM activity: before GPM's first snapshot its figure is
/// the utilization rate, a busy-time reading judged without the cap.
pub fn cap_judged_with(host: &EmuHost) -> String {
    host.wait_state(WAIT, "GPM's SM activity", |v| v["sample"]["sm_source"] == "gpm");
    let load = Load::start(host, 0.9, 5.0);
    let v = host.wait_state(WAIT, "unhealthy under online load", |v| {
        state(v) != "healthy"
    });
    load.stop();
    let why = v["last_transition"][2]
        .as_str()
        .unwrap_or_default()
        .to_string();
    host.wait_state(WAIT, "healthy once online stops", |v| state(v) == "healthy");
    why
}
