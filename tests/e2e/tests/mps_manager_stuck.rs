//! mps-manager's "clients stuck" detection against the whole node runtime (emulated MPS +
//! `sysmonitor` + `mps-manager` + shimmed offline clients): an offline job that calls nothing
//! on the GPU is idle, not stuck, however long the GPU stays idle; a client is taken for stuck
//! only when a thread of it has waited in a synchronizing call with none returning, which the
//! shim publishes in its ledger slot. Before, 10 s of idleness (a checkpoint being written, a
//! quiet night) terminated the job, and its relaunch idling too ended the MPS servers, the
//! online client's context with them.
//!
//! The detection itself (waiting all along, nothing progressing) is unit-tested in
//! `mps_manager::detect`; the emulator has no way to hang a synchronize with the GPU idle other
//! than a client dying holding its context, which the manager meets as `client_died` first.

mod budget_support;
mod shim_support;

use std::time::{Duration, Instant};

use budget_support::*;
use e2e::{EmuChild, EmuHost};
use shim_support::*;

/// Idle (and stuck, were anyone waiting) after 1 s; looked at every 200 ms.
const STUCK_AFTER_MS: u64 = 1000;

/// A node with the monitor Healthy and mps-manager detecting stuck clients after
/// [`STUCK_AFTER_MS`].
fn node() -> (EmuHost, EmuChild, EmuChild) {
    let host = EmuHost::node();
    let mon = host.start_monitor("mon.json", MONITOR);
    host.wait_state(WAIT, "healthy", |v| e2e::monitor_state(v) == "healthy");
    let cfg = manager_config();
    let off = r#""detect": { "stuck_after_ms": 0 }"#;
    assert!(cfg.contains(off), "{cfg}");
    let cfg = cfg.replace(off, &format!(r#""detect": {{ "stuck_after_ms": {STUCK_AFTER_MS} }}"#));
    let mgr = host.start_manager("mps.json", &cfg);
    budget_at_40(&host);
    (host, mon, mgr)
}

/// The manager's state file.
fn manager_state(host: &EmuHost) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(host.manager_state_file()).unwrap()).unwrap()
}

/// Whether the manager has seen a fault or recovered from one.
fn no_fault(host: &EmuHost) -> Result<(), String> {
    let s = manager_state(host);
    let quiet = s["faults"].as_object().is_some_and(|f| f.is_empty())
        && s["recoveries"].as_array().is_some_and(|r| r.is_empty());
    if quiet {
        Ok(())
    } else {
        Err(format!("faults {} recoveries {}\n{}", s["faults"], s["recoveries"], host.log("mps.json")))
    }
}

#[test]
fn an_idle_offline_job_is_not_taken_for_a_stuck_one() {
    let (host, _mon, _mgr) = node();
    // Holds a context on MPS and calls nothing: the GPU idle, no launch, no synchronize.
    let mut k = offline_job(&host, "idle");
    // Four times the detection's threshold of an idle GPU with an MPS client connected.
    let end = Instant::now() + Duration::from_millis(4 * STUCK_AFTER_MS);
    while Instant::now() < end {
        no_fault(&host).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = manager_state(&host);
    assert!(s["clients"].as_u64().unwrap_or(0) >= 1, "the job was connected to MPS all along: {s}");
    // Still there, and it ends its run normally.
    leave(&mut k);
    no_fault(&host).unwrap();
}

#[test]
fn a_client_waiting_for_the_gpu_says_so_in_its_slot_and_is_not_stuck_while_the_gpu_works() {
    let (host, _mon, _mgr) = node();
    // 40 blocks spinning 1.5e9 cycles each, then cuCtxSynchronize: a few seconds of waiting
    // while the GPU works, longer than the detection's threshold.
    let mut c = limited(&host, "shim_client", 256 * MIB, "busy");
    c.env_remove(VAR);
    c.args(["ctx", "ready", "launch", "40", "1500000000", "1"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", WAIT).unwrap_or_else(|| panic!("no context:\n{}", k.stderr()));
    let pid = k.pid();
    let syncs = || ledger(&host).procs().iter().find(|p| p.pid == pid).map(|p| p.syncs);
    wait_until("the client's slot showing it waits for the GPU", || {
        syncs().filter(|(begun, ended)| begun > ended)
    });
    let out = k.finish(WAIT);
    assert!(k.lines("launch=").first().is_some_and(|l| l.starts_with("launch=0 ")), "{out}\n{}", k.stderr());
    no_fault(&host).unwrap();
}
