//! Several offline jobs on one GPU (`max_offline_per_gpu` > 1) share the offline SM budget
//! under the whole node runtime (emulated MPS + `mps-manager` + `sysmonitor` + shimmed
//! offline clients): each job's MPS active-thread percentage, fixed by MPS at client start, is
//! what the other jobs leave of the budget (never below the floor), and the monitor judges
//! co-located load with the sum of the live jobs' percentages. Before, every offline client
//! took the whole budget (two jobs: twice the budget on the GPU) and the monitor subtracted
//! one budget whatever the number of jobs.
//!
//! All processes run as one user: MPS serves one user at a time, and the online load runs in
//! this test process. Mechanisms are asserted (percentages, the monitor's stated cap), never
//! timings.

mod shim_support;

use std::time::{Duration, Instant};

use e2e::{artifact, monitor_state as state, EmuChild, EmuHost, Load};
use shim_support::*;

const WAIT: Duration = Duration::from_secs(30);
const VAR: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// The shim's floor (`xcuda::budget::MIN_MPS_PERCENTAGE`).
const FLOOR: u32 = 10;

/// The budget is `max_pct` = 40 while no online load runs (the offline clients here hold
/// contexts and run nothing); under load it follows the online estimate (total SM activity less
/// what the offline jobs hold), and comes back to 40 when the load stops.
fn manager_config() -> String {
    format!(
        r#"{{
  "control_bin": "{}",
  "command_timeout_ms": 2000,
  "period_ms": 50,
  "check_every_ms": 200,
  "budget": {{ "headroom_pct": 10, "min_pct": 10, "max_pct": 40, "min_step_pct": 1, "smoothing": 1.0, "unsafe_pct": 10 }},
  "detect": {{ "stuck_after_ms": 0 }}
}}
"#,
        artifact("emu-mps-control").display()
    )
}

/// Judges SM activity only, Overlimit never sustained long enough to evict within the test.
/// An online load on 90 % of the SMs reads Overlimit as a whole (past 45), so the monitor asks
/// who is on the GPU and judges the online workload's own share, `(90 - cap) / (100 - cap)`,
/// past 45 for either cap here. Unhealthy and Overlimit (nearly) coincide so that a reading
/// on its way up (the load's first samples) moves nothing until it is judged with the cap.
const MONITOR: &str = r#"{
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

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until mps-manager publishes (fresh) the 40 % budget it gives an idle GPU.
fn budget_at_40(host: &EmuHost) {
    wait_until("the budget at 40 %", || {
        let m = ledger(host).read_manager()?;
        (m.offline_sm_budget_permille == 400 && m.is_fresh(node_ledger::clock::now_ns(), 500_000_000))
            .then_some(())
    });
}

/// An offline job: one shimmed client of container `group` holding a context until killed.
fn offline_job(host: &EmuHost, group: &str) -> EmuChild {
    let mut c = limited(host, "shim_client", 256 * MIB, group);
    c.env_remove(VAR).args(["env", VAR, "ctx", "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", WAIT)
        .unwrap_or_else(|| panic!("{group} never got a context:\n{}", k.stderr()));
    k
}

/// The client ends its run and exits normally (a client killed holding a context would hang
/// its MPS neighbours until the manager's recovery).
fn leave(k: &mut EmuChild) {
    k.send_line("go");
    k.finish(WAIT);
}

/// The job's MPS percentage three ways, which must agree: the variable the shim set before
/// `main`, the limit the emulated MPS fixed at connection, the one recorded in its slot.
fn percentage(host: &EmuHost, k: &EmuChild) -> u32 {
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

/// The client throttle's `xcuda throttle target changed` log lines.
fn throttle_lines(k: &EmuChild) -> Vec<String> {
    k.stderr()
        .lines()
        .filter(|l| l.contains("throttle target changed"))
        .map(str::to_string)
        .collect()
}

/// With the online load on, the monitor's first transition out of Healthy, which states the
/// offline cap it judged with; then the load stops and the monitor is Healthy again.
fn cap_judged_with(host: &EmuHost) -> String {
    let load = Load::start(host, 0.9, 5.0);
    let v = host.wait_state(WAIT, "unhealthy under online load", |v| state(v) != "healthy");
    load.stop();
    let why = v["last_transition"][2].as_str().unwrap_or_default().to_string();
    host.wait_state(WAIT, "healthy once online stops", |v| state(v) == "healthy");
    why
}

#[test]
fn two_offline_jobs_split_the_budget_and_the_monitor_judges_with_their_sum() {
    let host = EmuHost::node();
    let _mon = host.start_monitor("mon.json", MONITOR);
    host.wait_state(WAIT, "healthy", |v| state(v) == "healthy");
    let _mgr = host.start_manager("mps.json", &manager_config());
    budget_at_40(&host);

    // Job A alone takes the whole budget; job B finds it all held and gets the floor.
    let mut a = offline_job(&host, "job-a");
    let pa = percentage(&host, &a);
    assert_eq!(pa, 40, "alone: the whole budget");
    let b = offline_job(&host, "job-b");
    let pb = percentage(&host, &b);
    assert_eq!(pb, FLOOR, "the budget is held: the floor");
    assert!(pa + pb <= 40 + FLOOR, "{pa} + {pb}: at most the floor over the budget");
    // Running, each job's part of the budget is in proportion to the jobs' percentages (read
    // on the controller's periodic tick): 40 x 40/50 = 32 % and 40 x 10/50 = 8 %, each under
    // its job's MPS percentage, so both throttles now aim the GPU's load at the budget (job A
    // alone was left to MPS: target 1).
    for (k, part) in [(&a, 0.8), (&b, 0.2)] {
        wait_until("the throttle judging the job's part", || {
            throttle_lines(k)
                .iter()
                .any(|l| (e2e::num(l, "job_part") - part).abs() < 1e-6 && (e2e::num(l, "target") - 0.4).abs() < 1e-6)
                .then_some(())
        });
    }
    // A second process of job B shares job B's share (it does not take another).
    let mut b2 = offline_job(&host, "job-b");
    assert_eq!(percentage(&host, &b2), pb);
    leave(&mut b2);

    // The monitor takes off what the jobs hold, at most the budget: min(40 + 10, 40).
    let why = cap_judged_with(&host);
    assert!(why.contains("offline cap 40 %"), "{why}");

    // Job A leaves: the monitor takes off job B's 10 %, not the 40 % budget.
    leave(&mut a);
    wait_until("job A reclaimed", || {
        ledger(&host).procs().iter().all(|p| p.pid != a.pid()).then_some(())
    });
    // The monitor remembers who is on the GPU for `OCCUPANCY_TTL_MS` (200 ms): let the last
    // answer, with job A, expire.
    std::thread::sleep(Duration::from_millis(400));
    let why = cap_judged_with(&host);
    assert!(why.contains("offline cap 10 %"), "the live jobs' sum: {why}");

    // Job C takes what job B leaves: the two sum to the budget.
    budget_at_40(&host);
    let c = offline_job(&host, "job-c");
    let pc = percentage(&host, &c);
    assert_eq!(pc, 40 - pb, "the budget less job B's share");
    assert_eq!(pb + pc, 40);
}
