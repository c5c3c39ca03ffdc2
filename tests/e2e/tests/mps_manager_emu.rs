//! The MPS manager as a real process against the emulator's `nvidia-cuda-mps-control`:
//! crash and hang recovery with the online client continuing, and dynamic SM allocation.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use e2e::{lacks_root, register, EmuChild, EmuHost, Load};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

/// Not a test: the entry point of helper processes the tests spawn (`spawn_helper`).
#[test]
#[ignore = "helper-process entry point, run by the other tests"]
fn helper_entry() {
    e2e::helper_main();
}

fn manager_config() -> String {
    e2e::fast_manager_config(None)
}

/// The manager with [`manager_config`] (unless `mps.json` was written already), its log in
/// `mps.json.log`.
fn start_manager(n: &EmuHost) -> EmuChild {
    n.start_manager("mps.json", &manager_config())
}

fn mstate(n: &EmuHost, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    n.wait_manager_state(T, "mps.json", what, pred)
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Online client (this process) and an offline client both on MPS; returns the offline index.
fn online_and_offline(n: &EmuHost) -> (Load, EmuChild) {
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let load = Load::start(n, 0.5, 2.0);
    let off = n.spawn_helper_offline("gpu-mem", "256");
    let dev = n.device();
    let op = off.pid();
    wait_until("both clients on MPS", || {
        let s = dev.snapshot();
        s.processes.iter().filter(|p| p.mps_client).count() >= 2
            && s.processes.iter().any(|p| p.pid == op)
    });
    register(&ledger, op, 256 << 20);
    (load, off)
}

#[test]
fn mps_server_killed_under_load_is_recovered_and_online_continues() {
    let n = EmuHost::node();
    let _manager = start_manager(&n);
    let v = mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = v["daemon_pid"].as_u64().unwrap();
    let (load, mut off) = online_and_offline(&n);
    let v = mstate(&n, "server with clients", |v| {
        v["servers"].as_array().is_some_and(|s| !s.is_empty()) && v["clients"].as_u64() >= Some(2)
    });
    let server = v["servers"][0].as_u64().unwrap() as i32;
    // SAFETY: signalling the emulated MPS server process by the pid the manager reports.
    unsafe { libc::kill(server, libc::SIGKILL) };

    let v = mstate(&n, "recovery", |v| {
        v["recoveries"].as_array().is_some_and(|r| !r.is_empty())
    });
    assert!(v["faults"]["server_crash"].as_u64() >= Some(1), "{v:#}");
    assert_eq!(
        v["recoveries"][0]["fault"]["server_crash"]["server"],
        server as u64
    );
    let sig = off.wait_exit(T).expect("offline client evicted");
    assert!(sig == Some(libc::SIGTERM) || sig == Some(libc::SIGKILL));
    assert!(
        v["restart_requested"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["pid"] == off.pid() as u64),
        "offline marked for restart"
    );
    // The control daemon is sound: it is kept (no `quit`), and the crashed server is gone.
    let outcome = v["recoveries"][0]["outcome"].as_str().unwrap_or_default();
    assert!(outcome.contains(&format!("MPS server {server} gone; control daemon {daemon} kept")), "{v:#}");
    assert_eq!(v["daemon_pid"].as_u64(), Some(daemon), "the control daemon was kept: {v:#}");
    online_progresses(&load, "online kernels after recovery");
    assert!(n.device().snapshot().mps.enabled);
    // The server's death terminated the online client: real MPS serves it again only once it
    // is relaunched (its supervisor's work), which the load did at once, and the daemon's pipe
    // never went away: it is an MPS client again, not a context of its own on the bare GPU
    // (which, in EXCLUSIVE_PROCESS, would keep every MPS server off the GPU until it exits).
    assert!(load.relaunches.load(Ordering::Relaxed) >= 1, "the online client was relaunched");
    let me = std::process::id();
    let snap = n.device().snapshot();
    let online: Vec<_> = snap.processes.iter().filter(|p| p.pid == me).collect();
    assert!(!online.is_empty() && online.iter().all(|p| p.mps_client), "the relaunched online client is outside MPS: {:?}", snap.processes);
    // And offline work gets on MPS again.
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let _again = offline_on_mps(&n, &ledger, 64);
    // One recovery: the servers it ended are no second crash.
    let v = mstate(&n, "a check after the new offline client", |v| {
        v["clients"].as_u64() >= Some(2)
    });
    assert_eq!(v["recoveries"].as_array().map(Vec::len), Some(1), "{v:#}");
    assert_eq!(v["daemon_pid"].as_u64(), Some(daemon), "{v:#}");
}

/// Waits until the online client (this process's [`Load`]) completes 20 more kernels.
fn online_progresses(load: &Load, what: &str) {
    let after = load.kernels.load(Ordering::Relaxed);
    wait_until(what, || load.kernels.load(Ordering::Relaxed) >= after + 20);
}

/// After `what`: the online client completes kernels again, MPS was not reset (same
/// `generation`) and the online client never lost its context.
fn online_kept_its_context(
    load: &Load,
    dev: &e2e::emu_device::Device,
    generation: u64,
    what: &str,
) {
    online_progresses(load, &format!("online kernels after {what}"));
    assert_eq!(
        dev.snapshot().mps.generation,
        generation,
        "MPS was not reset by {what}"
    );
    assert_eq!(
        load.failures.load(Ordering::Relaxed),
        0,
        "the online client's context was never lost ({what})"
    );
    assert_eq!(load.relaunches.load(Ordering::Relaxed), 0, "the online client was never relaunched ({what})");
}

/// A helper process holding `mib` MiB on MPS, registered in `ledger` as offline with them.
fn offline_on_mps(n: &EmuHost, ledger: &node_ledger::Ledger, mib: u64) -> EmuChild {
    let off = n.spawn_helper_offline("gpu-mem", &mib.to_string());
    let (dev, pid) = (n.device(), off.pid());
    wait_until("offline client on MPS", || {
        dev.snapshot()
            .processes
            .iter()
            .any(|p| p.pid == pid && p.mps_client)
    });
    register(ledger, pid, mib << 20);
    off
}

/// SIGKILLs `off` (it dies holding its MPS context, hanging the server) and waits for the
/// manager's latest recovery to name it (a `client_died` fault); returns the manager state.
fn kill_until_recovered(n: &EmuHost, off: &mut EmuChild) -> Value {
    let op = off.pid();
    off.signal(libc::SIGKILL);
    let _ = off.wait_exit(T);
    mstate(n, "the recovery of the killed client", |v| {
        v["recoveries"]
            .as_array()
            .and_then(|r| r.last())
            .is_some_and(|r| r["fault"]["client_died"]["pid"] == op)
    })
}

/// SIGKILLs the offline client (it dies holding its MPS context, hanging the server) and
/// waits for the `n`th recovery; returns the manager state and the recovery time.
fn kill_offline_and_recover(n: &EmuHost, off: &mut EmuChild, nth: usize) -> (Value, Duration) {
    let dev = n.device();
    off.signal(libc::SIGKILL);
    let _ = off.wait_exit(T);
    let t0 = Instant::now();
    let v = mstate(n, "recovery", |v| {
        v["recoveries"].as_array().is_some_and(|r| r.len() >= nth)
    });
    wait_until("MPS no longer hung", || !dev.snapshot().mps.poisoned);
    (v, t0.elapsed())
}

/// Observation 7: the dead offline client is removed with `terminate_client`; MPS is not
/// reset, the online client's context survives (no failed call, same MPS generation) and it
/// completes kernels again. Two faults 5 s apart (inside the full-reset rate limit of 30 s)
/// are both recovered; the ERROR lines stay bounded (once per episode, not per tick).
#[test]
fn offline_killed_holding_its_context_is_terminated_alone_and_online_keeps_its_context() {
    let n = EmuHost::node();
    let cfg = n.path("mps.json");
    // Shipped rate limit for full resets: a second one within 30 s would be refused.
    std::fs::write(
        &cfg,
        manager_config().replace(
            r#""recovery": { "min_interval_ms": 0, "max_per_hour": 20 }"#,
            r#""recovery": { "min_interval_ms": 30000, "max_per_hour": 6 }"#,
        ),
    )
    .unwrap();
    let _manager = start_manager(&n);
    let v = mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = v["daemon_pid"].as_u64().unwrap();
    let (load, mut off) = online_and_offline(&n);
    let dev = n.device();
    let generation = dev.snapshot().mps.generation;
    mstate(&n, "offline client listed on its server", |v| {
        v["clients"].as_u64() >= Some(2)
    });
    let (v, took) = kill_offline_and_recover(&n, &mut off, 1);
    eprintln!("first recovery: online unblocked after {took:?}");
    let r = &v["recoveries"][0];
    assert_eq!(r["fault"]["client_died"]["pid"], off.pid() as u64, "{v:#}");
    assert!(
        r["outcome"].as_str().unwrap().contains("terminate_client"),
        "{v:#}"
    );
    online_kept_its_context(&load, &dev, generation, "the targeted recovery");

    // Second fault 5 s later: inside the full-reset window, still recovered.
    std::thread::sleep(Duration::from_secs(5));
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let mut off2 = offline_on_mps(&n, &ledger, 128);
    let op2 = off2.pid();
    mstate(&n, "second offline client listed", |v| {
        v["clients"].as_u64() >= Some(2)
    });
    let (v, took) = kill_offline_and_recover(&n, &mut off2, 2);
    eprintln!("second recovery (5 s after the first): online unblocked after {took:?}");
    assert_eq!(
        v["recoveries"][1]["fault"]["client_died"]["pid"],
        op2 as u64
    );
    assert_eq!(v["suppressed_recoveries"], 0, "{v:#}");
    assert_eq!(v["daemon_pid"].as_u64(), Some(daemon), "no reset");
    online_kept_its_context(&load, &dev, generation, "the second recovery");
    std::thread::sleep(Duration::from_secs(1));
    let log = n.log("mps.json");
    let errors = log.lines().filter(|l| l.contains(" ERROR ")).count();
    assert!(
        errors <= 2,
        "one ERROR line per fault episode, got {errors}:\n{log}"
    );
}

/// A client killed holding its context with no ledger registration: what the manager sees
/// when the monitor reclaimed the dead process's registration before the manager's check
/// (sysmonitor reclaims within about a second; the kit's `recovery` check hung the online
/// client for good that way), or when the dead client was an unregistered one. The server
/// still lists it, and that listing is enough: it is terminated, MPS is not reset, the online
/// client keeps its context and progresses.
#[test]
fn a_dead_client_its_server_still_lists_is_terminated_without_a_ledger_registration() {
    let n = EmuHost::node();
    let _manager = start_manager(&n);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let load = Load::start(&n, 0.5, 2.0);
    let dev = n.device();
    let _quit = QuitOnPanic(n.device());
    let mut off = n.spawn_helper("gpu-mem", "64");
    let op = off.pid();
    wait_until("the unregistered client on MPS", || {
        dev.snapshot().processes.iter().any(|p| p.pid == op && p.mps_client)
    });
    mstate(&n, "both clients listed on their server", |v| v["clients"].as_u64() >= Some(2));
    let generation = dev.snapshot().mps.generation;
    let v = kill_until_recovered(&n, &mut off);
    let r = v["recoveries"].as_array().unwrap().last().unwrap();
    assert!(r["outcome"].as_str().unwrap().contains("terminate_client"), "{v:#}");
    wait_until("MPS no longer hung", || !dev.snapshot().mps.poisoned);
    online_kept_its_context(&load, &dev, generation, "terminating a dead listed client");
    load.stop();
}

/// Any process that can open the ledger can write any slot. One naming an online MPS client
/// by its pid (NVML shows it to a container) with a start time that makes it look dead, kept
/// alive under a lock its writer holds, must not get that client terminated when a real
/// offline client dies and its recovery terminates the dead registered clients: the online
/// client holds no ledger open, so no slot makes it offline work.
#[test]
fn a_slot_naming_the_online_client_as_dead_does_not_get_it_terminated() {
    let n = EmuHost::node();
    let _manager = start_manager(&n);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let dev = n.device();
    let _quit = QuitOnPanic(n.device());
    let mut online = n.spawn_helper("gpu-mem", "64");
    let on = online.pid();
    wait_until("the online client on MPS", || {
        dev.snapshot().processes.iter().any(|p| p.pid == on && p.mps_client)
    });
    let start = node_ledger::procinfo::start_time(on).unwrap();
    let _forged = e2e::forge_slot(&ledger, on, start + 1, 0);
    let mut off = offline_on_mps(&n, &ledger, 64);
    mstate(&n, "both clients listed on their server", |v| v["clients"].as_u64() >= Some(2));
    // Several checks (every 100 ms) in which the slot alone could pass for a dead client.
    std::thread::sleep(Duration::from_millis(500));
    let v = mstate(&n, "a fresh state", |_| true);
    assert_eq!(v["recoveries"], serde_json::json!([]), "the forged slot alone made a recovery: {v:#}");
    let v = kill_until_recovered(&n, &mut off);
    let r = v["recoveries"].as_array().unwrap().last().unwrap();
    let outcome = r["outcome"].as_str().unwrap();
    assert!(outcome.contains("terminate_client"), "{v:#}");
    assert!(!outcome.contains(&on.to_string()), "the online client was terminated: {v:#}");
    wait_until("MPS no longer hung", || !dev.snapshot().mps.poisoned);
    assert!(online.alive(), "the online client was signalled: {v:#}");
    assert!(
        dev.snapshot().processes.iter().any(|p| p.pid == on && p.mps_client),
        "the online client lost its MPS context: {v:#}"
    );
}

/// On a panic, quits MPS on the device so a hung online `Load` can be joined (no hanging test).
struct QuitOnPanic(e2e::emu_device::Device);

impl Drop for QuitOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.mps_quit();
        }
    }
}

/// Two offline clients die holding their contexts at once. Each one's work hangs the server
/// until it is terminated (as on real MPS), and the recovery reclaims every dead registration
/// from the ledger, after which no fault names the second one again: one recovery must
/// terminate both. MPS is not reset and the online client progresses with its context.
#[test]
fn two_offline_clients_killed_together_are_both_terminated() {
    let n = EmuHost::node();
    let _manager = start_manager(&n);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let (load, mut off) = online_and_offline(&n);
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let dev = n.device();
    let mut off2 = offline_on_mps(&n, &ledger, 64);
    let op2 = off2.pid();
    let op = off.pid();
    let generation = dev.snapshot().mps.generation;
    // Dropped before `load`: on a failure, quit MPS so the hung online thread returns.
    let _quit = QuitOnPanic(n.device());
    off.signal(libc::SIGKILL);
    off2.signal(libc::SIGKILL);
    let _ = off.wait_exit(T);
    let _ = off2.wait_exit(T);
    wait_until("both deaths noticed", || {
        let m = dev.snapshot().mps;
        m.dead_clients.len() == 2 || !m.poisoned
    });
    let v = mstate(&n, "both terminated", |v| {
        let outcomes: String = v["recoveries"]
            .as_array()
            .map(|r| r.iter().map(|x| x["outcome"].to_string()).collect())
            .unwrap_or_default();
        outcomes.contains(&op.to_string()) && outcomes.contains(&op2.to_string())
    });
    wait_until("MPS not hung", || !dev.snapshot().mps.poisoned);
    online_kept_its_context(&load, &dev, generation, &format!("the recovery {v:#}"));
}

#[test]
fn hung_control_daemon_is_detected_by_timeout_and_replaced() {
    let n = EmuHost::node();
    let _manager = start_manager(&n);
    let v = mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = v["daemon_pid"].as_u64().unwrap() as i32;
    // SAFETY: freezing the emulated control daemon (it then never answers).
    unsafe { libc::kill(daemon, libc::SIGSTOP) };
    let v = mstate(&n, "hang recovery", |v| {
        v["faults"]["daemon_hang"].as_u64() >= Some(1)
            && v["recoveries"].as_array().is_some_and(|r| !r.is_empty())
    });
    let v2 = mstate(&n, "new daemon", |v| {
        v["daemon_pid"].as_u64().is_some_and(|p| p as i32 != daemon)
    });
    assert!(
        v["recoveries"][0]["outcome"]
            .as_str()
            .unwrap()
            .contains("MPS reset"),
        "{v:#}"
    );
    // SAFETY: the frozen daemon was SIGKILLed by the recovery; make sure it is not left stopped.
    unsafe { libc::kill(daemon, libc::SIGKILL) };
    assert_ne!(v2["daemon_pid"].as_u64().unwrap() as i32, daemon);
    // A client arriving now is served by the new daemon, on MPS.
    let mut c = n.client(&["ctx", "ready", "wait", "spin", "1", "1000", "1"]);
    c.wait_for_line("ready", T)
        .unwrap_or_else(|| panic!("no context after the daemon was replaced: {}", c.stderr()));
    let p = n.device().snapshot().processes.into_iter().find(|p| p.pid == c.pid());
    assert!(p.as_ref().is_some_and(|p| p.mps_client), "{p:?}");
    c.send_line("go");
    c.finish(T);
    let spin = c.lines("spin=");
    assert!(spin[0].starts_with("spin=0 "), "{spin:?} {}", c.stderr());
}

#[test]
fn offline_sm_budget_follows_online_activity() {
    let n = EmuHost::node();
    let _mon = n.start_monitor(
        "mon.json",
        r#"{"interval_ms": 10, "host_memory": {"enabled": false},
            "machine": {"sm_activity": {"healthy": 90, "unhealthy": 95, "overlimit": 99},
                        "gpu_util": {"healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false},
                        "sm_clock": {"healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false}}}"#,
    );
    n.wait_state(T, "healthy", |v| v["state"] == "healthy");
    let _manager = start_manager(&n);
    let idle = mstate(&n, "idle budget", |v| {
        v["offline_budget_pct"].as_f64() == Some(90.0)
    });
    assert_eq!(idle["gpu_health"], "healthy");
    let status = node_ledger::Status::open(&n.status_path()).unwrap();
    assert_eq!(
        status.read_manager().unwrap().offline_sm_budget_permille,
        900
    );

    let load = Load::start(&n, 0.6, 2.0);
    let v = mstate(&n, "budget under online load", |v| {
        v["offline_budget_pct"].as_f64().is_some_and(|b| b <= 40.0)
    });
    let b = v["offline_budget_pct"].as_f64().unwrap();
    let online = v["online_estimate_pct"].as_f64().unwrap();
    assert!(
        (b - (100.0 - online - 10.0).clamp(10.0, 90.0)).abs() <= 5.0,
        "budget {b} vs online {online}"
    );
    // The manager sets no MPS percentage: a client that connects now (here without the shim,
    // as an online client would) is not capped by it. New offline processes take the budget
    // as their own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE from the shim (tests/e2e shim_budget).
    let other = n.spawn_helper("gpu-mem", "64");
    let dev = n.device();
    let op = other.pid();
    wait_until("client on MPS", || {
        dev.snapshot()
            .processes
            .iter()
            .any(|p| p.pid == op && p.mps_client)
    });
    std::thread::sleep(Duration::from_millis(500)); // several manager periods
    let pct = dev
        .snapshot()
        .processes
        .iter()
        .find(|p| p.pid == op)
        .map_or(0, |p| p.active_thread_pct);
    assert_eq!(
        pct, 100,
        "a client connecting while the budget is low keeps the whole GPU"
    );
    load.stop();
    mstate(&n, "budget back up when online goes idle", |v| {
        v["offline_budget_pct"].as_f64().is_some_and(|b| b >= 80.0)
    });
}

/// Control for the test above: with no manager, the same death leaves MPS poisoned and the
/// online client stalled, so the recovery there is what brings online service back.
#[test]
fn without_the_manager_a_killed_offline_client_stalls_online() {
    let n = EmuHost::node();
    n.mps_control(Some("-d"), "");
    let (load, mut off) = online_and_offline(&n);
    off.signal(libc::SIGKILL);
    let _ = off.wait_exit(T);
    let dev = n.device();
    wait_until("MPS poisoned", || dev.snapshot().mps.poisoned);
    std::thread::sleep(Duration::from_millis(100));
    let stalled = load.kernels.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        load.kernels.load(Ordering::Relaxed),
        stalled,
        "online made progress on a poisoned MPS"
    );
    n.mps_control(None, "quit\n");
    drop(load);
}

/// A monitor (shipped XID defaults) reading `root()/kern.log`, the manager beside it, and an
/// online and an offline client on MPS; returns the monitor, the manager, the kernel log, the
/// daemon's pid, the clients.
fn node_with_xid_log(n: &EmuHost) -> (EmuChild, EmuChild, std::path::PathBuf, u64, Load, EmuChild) {
    let klog = n.path("kern.log");
    std::fs::write(&klog, "").unwrap();
    let mon = n.start_monitor(
        "mon.json",
        &format!(
            r#"{{"interval_ms": 10, "host_memory": {{"enabled": false}}, "xid_log": "{}",
                "machine": {{"sm_activity": {{"healthy": 97, "unhealthy": 98, "overlimit": 99}},
                             "gpu_util": {{"healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false}},
                             "sm_clock": {{"healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false}}}}}}"#,
            klog.display()
        ),
    );
    n.wait_state(T, "healthy", |v| v["state"] == "healthy");
    let manager = start_manager(n);
    let v = mstate(n, "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = v["daemon_pid"].as_u64().unwrap();
    let (load, off) = online_and_offline(n);
    (mon, manager, klog, daemon, load, off)
}

fn kernel_log(klog: &std::path::Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(klog).unwrap();
    writeln!(f, "{line}").unwrap();
}

#[test]
fn xid_reported_by_the_monitor_resets_mps_and_online_continues() {
    let n = EmuHost::node();
    let (_mon, _manager, klog, daemon, load, mut off) = node_with_xid_log(&n);
    // A fault of the GPU itself (double-bit ECC): the monitor disables the GPU, the manager
    // starts a new MPS.
    kernel_log(&klog, "NVRM: Xid (PCI:0000:01:00): 48, pid=1, An uncorrectable double bit error");
    // The monitor's own eviction of the (signal-unaware) helper may be seen first as an unclean
    // client death; the XID must still get its recovery.
    let xid_recoveries = |v: &Value| {
        v["recoveries"].as_array().map_or(0, |r| {
            r.iter().filter(|x| x["fault"]["xid"]["code"] == 48).count()
        })
    };
    mstate(&n, "xid recovery", |v| xid_recoveries(v) == 1);
    assert!(off.wait_exit(T).is_some(), "offline client evicted");
    let v = mstate(&n, "MPS running again", |v| {
        v["daemon_pid"].as_u64().is_some_and(|p| p != daemon)
    });
    assert!(
        v["recoveries"].as_array().unwrap().last().unwrap()["outcome"]
            .as_str()
            .unwrap()
            .contains("MPS reset")
    );
    online_progresses(&load, "online kernels after the reset");
    assert!(load.relaunches.load(Ordering::Relaxed) >= 1, "a full reset costs the online client a relaunch");
    let again = mstate(&n, "one recovery per XID episode", |v| {
        let last = v["recoveries"]
            .as_array()
            .and_then(|r| r.last())
            .and_then(|r| r["at_unix_ms"].as_u64());
        v["updated_unix_ms"].as_u64() > last.map(|t| t + 500)
    });
    assert_eq!(xid_recoveries(&again), 1, "{again:#}");
}

/// After a critical XID the GPU stays Disabled by it until an operator acts, and the monitor's
/// state file says so all along. The manager that reset MPS for it is restarted (SIGKILL, as
/// the OOM killer does; an upgrade alike): the new one adopts the control daemon and does not
/// reset MPS again, so the online client, relaunched once by the reset, keeps its new context.
/// Before, the XID handled was known to the manager's memory only: every restart was a fresh
/// `xid` fault and a full reset.
#[test]
fn a_restarted_manager_does_not_reset_mps_again_for_an_xid_it_recovered_from() {
    let n = EmuHost::node();
    let (_mon, mut manager, klog, daemon, load, mut off) = node_with_xid_log(&n);
    kernel_log(&klog, "NVRM: Xid (PCI:0000:01:00): 48, pid=1, An uncorrectable double bit error");
    let v = mstate(&n, "the xid recovery and MPS running again", |v| {
        v["recoveries"].as_array().is_some_and(|r| r.iter().any(|x| x["fault"]["xid"]["code"] == 48))
            && v["daemon_pid"].as_u64().is_some_and(|p| p != daemon)
    });
    let reset_daemon = v["daemon_pid"].as_u64().unwrap();
    assert!(off.wait_exit(T).is_some(), "offline client evicted");
    online_progresses(&load, "online kernels after the reset");
    let dev = n.device();
    let generation = dev.snapshot().mps.generation;
    let relaunches = load.relaunches.load(Ordering::Relaxed);
    assert!(relaunches >= 1, "a full reset costs the online client a relaunch");
    manager.signal(libc::SIGKILL);
    assert!(manager.wait_exit(T).is_some());
    let manager = start_manager(&n);
    let mp = manager.pid();
    let v = mstate(&n, "the restarted manager's state", |v| v["manager_pid"] == mp && v["daemon_pid"].is_u64());
    assert_eq!(v["daemon_pid"].as_u64(), Some(reset_daemon), "the daemon adopted: {v:#}");
    // A few checks later (every 100 ms; the state file is written after each).
    let t = v["updated_unix_ms"].as_u64().unwrap();
    let v = mstate(&n, "later checks", |v| v["manager_pid"] == mp && v["updated_unix_ms"].as_u64() > Some(t + 500));
    assert_eq!(v["recoveries"], serde_json::json!([]), "recovered again: {v:#}");
    assert_eq!(v["daemon_pid"].as_u64(), Some(reset_daemon), "{v:#}");
    assert_eq!(v["xid_handled"]["code"], 48, "{v:#}");
    online_progresses(&load, "online kernels after the manager's restart");
    assert_eq!(dev.snapshot().mps.generation, generation, "MPS reset again");
    assert_eq!(load.relaunches.load(Ordering::Relaxed), relaunches, "the online client relaunched again");
    load.stop();
}

/// An application XID (one process's page fault, as an H200 reported for an online client
/// right after its offline neighbour was SIGKILLed under MPS; or an offline job's own bug) is
/// the faulting process's: MPS tears that client down itself. With the shipped defaults the
/// monitor keeps the GPU in service and the manager resets nothing: no eviction, no new MPS,
/// the online client keeps its context.
#[test]
fn an_application_xid_disables_nothing_and_resets_nothing() {
    let n = EmuHost::node();
    let (_mon, _manager, klog, daemon, load, mut off) = node_with_xid_log(&n);
    let dev = n.device();
    let generation = dev.snapshot().mps.generation;
    for x in [31, 43, 45] {
        kernel_log(&klog, &format!("NVRM: Xid (PCI:0000:01:00): {x}, pid=1, name=train, Ch 00000010"));
    }
    // Each XID the monitor takes is logged with its `xid=` field, critical or not.
    n.wait_log(T, "the XIDs read", "mon.json", |l| l.matches("xid=").count() >= 3);
    // Past the moment the monitor read them: its state file and the manager's next looks.
    let seen = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    n.wait_state(T, "a state after the XIDs", |v| {
        v["updated_unix_ms"].as_u64().is_some_and(|t| t > seen + 100)
    });
    let v = mstate(&n, "the manager's looks after the XIDs", |v| {
        v["updated_unix_ms"].as_u64().is_some_and(|t| t > seen + 500)
    });
    assert_eq!(v["daemon_pid"].as_u64(), Some(daemon), "MPS not restarted: {v:#}");
    assert!(
        v["recoveries"].as_array().is_none_or(|r| r.is_empty()),
        "no recovery: {v:#}"
    );
    let s = n.wait_state(T, "state", |_| true);
    assert_eq!(s["state"], "healthy", "{s:#}");
    assert!(s["disabled_by"].is_null(), "{s:#}");
    assert!(off.alive(), "the offline client is not evicted");
    online_kept_its_context(&load, &dev, generation, "the application XIDs");
}

/// A node whose emulated device tears an MPS server's clients down when one dies with kernels
/// in flight (`GPUEMU_MPS_KILL=teardown`), with a monitor (eviction grace `grace_ms`, SM activity
/// judged by `sm_activity` (the block, then any further `machine` keys), the busy time and the
/// clock not judged) and the manager running: the node, the monitor, the device, the manager
/// and the manager's state once its daemon started.
fn teardown_node(grace_ms: u64, sm_activity: &str) -> (EmuHost, EmuChild, e2e::emu_device::Device, EmuChild, Value) {
    let n = EmuHost::node();
    let mon = n.start_monitor(
        "mon.json",
        &format!(
            r#"{{"interval_ms": 10, "host_memory": {{"enabled": false}}, "evictor": {{"grace_ms": {grace_ms}}},
                "machine": {{"sm_activity": {sm_activity},
                            "gpu_util": {{"healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false}},
                            "sm_clock": {{"healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false}}}}}}"#
        ),
    );
    n.wait_state(T, "healthy", |v| v["state"] == "healthy");
    let dev = n.device();
    dev.set_mps_kill_teardown(true);
    let manager = start_manager(&n);
    let v = mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    (n, mon, dev, manager, v)
}

/// An offline process that ignores the monitor's SIGTERM is SIGKILLed when the grace runs out.
/// On real MPS a SIGKILL with kernels in flight can make the server tear down the online
/// neighbour (an H200: 12 of 20 kills); the emulated device here does so every time
/// (`GPUEMU_MPS_KILL=teardown`). mps-manager ends the process's MPS work with `terminate_client`
/// before the SIGKILL (`terminate_before_kill_ms`, from the monitor's published SIGKILL time):
/// the kill then harms nobody. Without it (`terminate_before_kill_ms: 0`) nothing is terminated
/// before the kill (the first wait times out) and the kill tears the online client down.
#[test]
fn a_client_the_monitor_will_sigkill_is_terminated_in_mps_first() {
    let (n, _mon, dev, _manager, v) = teardown_node(2000, r#"{"healthy": 5, "unhealthy": 10, "overlimit": 20}, "overlimit_sustain_ms": 0"#);
    let daemon = v["daemon_pid"].as_u64().unwrap();
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let mut off = n.spawn_helper_offline("gpu-mem-stubborn", "256");
    let op = off.pid();
    wait_until("the offline client on MPS", || {
        dev.snapshot().processes.iter().any(|p| p.pid == op && p.mps_client)
    });
    register(&ledger, op, 256 << 20);
    // The online load drives the GPU past Overlimit: the monitor evicts the offline client,
    // which ignores SIGTERM.
    let load = Load::start(&n, 0.5, 2.0);
    let v = mstate(&n, "terminated before the SIGKILL", |v| v["terminated_before_kill"] == 1);
    assert!(off.alive(), "terminated in MPS while still running: {v:#}");
    assert!(off.wait_exit(T).is_some(), "SIGKILLed by the monitor after the grace");
    n.wait_log(T, "the monitor's SIGKILL", "mon.json", |l| l.contains("SIGKILL"));
    online_progresses(&load, "online kernels after the kill");
    // Some looks after the kill: the dead client needed no termination, MPS no reset.
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let v = mstate(&n, "looks after the kill", |v| {
        v["updated_unix_ms"].as_u64().is_some_and(|t| t > after + 500)
    });
    assert_eq!(v["daemon_pid"].as_u64(), Some(daemon), "MPS not reset: {v:#}");
    assert_eq!(load.failures.load(Ordering::Relaxed), 0, "the online client kept its context");
    assert_eq!(dev.mps_status().fatal_errors, 0, "the kill tore nobody down");
    let terminated_after_death = v["recoveries"].as_array().map_or(0, |r| {
        r.iter()
            .filter(|x| x["outcome"].as_str().is_some_and(|o| o.contains(&format!("{op})]"))))
            .count()
    });
    assert_eq!(terminated_after_death, 0, "nothing left to terminate after the kill: {v:#}");
}

/// After a fatal GPU error (a client SIGKILLed with kernels in flight, which an H200 turned
/// into one 12 times in 20) the MPS server takes no new client until every client it tore down
/// has exited (NVIDIA's MPS docs, "Server Recovery"; the emulator refuses with
/// CUDA_ERROR_MPS_SERVER_NOT_READY). An offline process torn down with the online client that
/// does not exit (here one sleeping holding its dead context) kept the online service's
/// restarted client out for good. The server names each torn-down client in `server.log`;
/// mps-manager asks the offline ones to leave, the monitor evicts them, and the online
/// service's restart gets in.
#[test]
fn an_offline_client_torn_down_by_a_fatal_error_is_made_to_leave_so_the_online_service_gets_back_in() {
    let (n, _mon, dev, _manager, _) = teardown_node(1000, r#"{"healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false}"#);
    // The offline job that will linger: registered by its own process (as a shimmed one is).
    let mut lingering = n.spawn_helper_offline("gpu-mem-registered", "64");
    let lp = lingering.pid();
    wait_until("the lingering offline client on MPS", || dev.snapshot().processes.iter().any(|p| p.pid == lp && p.mps_client));
    let load = Load::start(&n, 0.3, 1.0);
    online_progresses(&load, "online kernels on MPS");
    // Another offline job, killed with kernels in flight: the fatal error.
    let mut killed = n.spawn_helper_offline("gpu-mem-stubborn", "64");
    let kp = killed.pid();
    wait_until("the killed client's kernels in flight", || {
        dev.snapshot().processes.iter().any(|p| p.pid == kp && p.mps_client && p.kernels > 0)
    });
    killed.kill9();
    wait_until("the fatal error", || dev.mps_status().fatal_errors == 1);
    assert!(lingering.alive(), "torn down, not dead");
    let said = format!("Client {{PID: {lp}}} encountered a fatal GPU error");
    wait_until("the server's report", || std::fs::read_to_string(n.log_dir().join("server.log")).is_ok_and(|t| t.contains(&said)));
    // The manager asks the lingering one to leave; the monitor evicts it; then the online
    // service's restarted client connects and works.
    n.wait_log(T, "the manager's request", "mps.json", |l| l.contains("torn down by a fatal GPU error: asked to leave") && l.contains(&format!("pid={lp}")));
    assert!(lingering.wait_exit(T).is_some(), "the torn-down offline client was evicted");
    online_progresses(&load, "the online service's restarted client after the recovery");
    assert!(load.relaunches.load(Ordering::Relaxed) >= 1, "the online client was torn down and restarted");
}

#[test]
fn sighup_with_a_broken_config_keeps_the_old_one_and_says_why() {
    let n = EmuHost::node();
    let mut m = start_manager(&n);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let cfg = n.path("mps.json");
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, good.replace(r#""min_pct": 10"#, r#""min_pct": 95"#)).unwrap();
    m.signal(libc::SIGHUP);
    let v = mstate(&n, "reload error", |v| {
        v["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("config reload"))
    });
    let e = v["last_error"].as_str().unwrap();
    assert!(
        e.contains("mps.json:") && e.contains("budget.min_pct"),
        "{e}"
    );
    assert!(m.alive(), "a broken reload never stops the manager");
    std::fs::write(&cfg, &good).unwrap();
    m.signal(libc::SIGHUP);
    mstate(&n, "good reload", |v| v["last_error"].is_null());
}

/// The GPU's ledger directory (`gpu<N>/`) is mounted read-write into every offline container.
/// The MPS control daemon runs as root and appends to `control.log` in its log directory: were
/// that directory in `gpu<N>/` (the default until now), a tenant's symbolic link there would
/// have the daemon write into any file of the host. The default log directory is the daemons'
/// own (`daemons/gpu<N>/mps-log`), and a log directory configured inside `gpu<N>/` is refused.
#[test]
fn a_tenants_link_in_its_gpu_directory_never_gets_the_control_daemon_writing_host_files() {
    let n = EmuHost::node();
    let gpu_dir = n.ledger_path().parent().unwrap().to_path_buf();
    // What a tenant, root in its container, plants through its read-write mount.
    let host_file = n.path("host-file");
    std::fs::write(&host_file, "host data\n").unwrap();
    let planted = gpu_dir.join("mps-log");
    std::fs::create_dir_all(&planted).unwrap();
    std::os::unix::fs::symlink(&host_file, planted.join("control.log")).unwrap();
    std::os::unix::fs::symlink(&host_file, planted.join("server.log")).unwrap();

    let _m = start_manager(&n);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let load = Load::start(&n, 0.3, 1.0);
    online_progresses(&load, "online kernels on MPS");
    assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "host data\n", "the control daemon wrote through the tenant's link");
    let log = n.log_dir().join("control.log");
    assert!(log.starts_with(n.root().join("run/daemons/gpu0")), "{}", log.display());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.is_empty(), "the daemon logs in {}, where no container reaches", log.display());
    drop(load);

    // An operator's log_dir inside gpu<N>/: refused at start, naming the field and the hazard.
    let cfg = manager_config().replacen('{', &format!("{{\n  \"log_dir\": \"{}\",", planted.display()), 1);
    let mut bad = n.start_manager("bad-mps.json", &cfg);
    let status = bad.wait_timeout(T).expect("a manager with a tenant-writable log_dir exits");
    assert_eq!(status.code(), Some(2), "{}", n.log("bad-mps.json"));
    let l = n.log("bad-mps.json");
    assert!(l.contains("log_dir") && l.contains("symbolic link"), "{l}");
    assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "host data\n");
}

/// A control daemon an earlier version started keeps its log directory (then `gpu<N>/mps-log`)
/// until MPS restarts: the manager that adopts it says where it logs and why that matters.
#[test]
fn an_adopted_control_daemon_logging_in_the_gpu_directory_is_named() {
    let n = EmuHost::node();
    let old_logs = n.ledger_path().parent().unwrap().join("mps-log");
    let bin = n.require_mps_control();
    let st = n
        .command(bin.to_str().unwrap())
        .env("CUDA_MPS_LOG_DIRECTORY", &old_logs)
        .arg("-d")
        .status()
        .unwrap();
    assert!(st.success());
    let _m = start_manager(&n);
    mstate(&n, "daemon adopted", |v| v["daemon_pid"].is_u64());
    let l = n.wait_log(T, "the adopted daemon's log directory", "mps.json", |l| l.contains("logs elsewhere than log_dir"));
    assert!(l.contains(&old_logs.display().to_string()) && l.contains("read-write"), "{l}");
    assert!(old_logs.join("control.log").exists(), "the earlier daemon logs where it was told");
}

/// The pipe directory is in every offline container's mounts: a tenant can move the control
/// daemon's socket away (and bind one of its own). New MPS clients would no longer reach the
/// daemon: the manager says so in its state file (node-agent then admits no offline work) and
/// clears it when the daemon's socket is back.
#[test]
fn a_control_socket_moved_away_is_reported_and_the_report_clears_when_it_is_back() {
    let n = EmuHost::node();
    let _m = start_manager(&n);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let load = Load::start(&n, 0.3, 1.0);
    online_progresses(&load, "online kernels on MPS");
    let sock = n.pipe_dir().join("control");
    let aside = n.pipe_dir().join("control.tenant");
    std::fs::rename(&sock, &aside).unwrap();
    // A file of the tenant's in its place.
    std::fs::write(&sock, "").unwrap();
    let v = mstate(&n, "the replaced socket reported", |v| v["control_socket_replaced"].is_string());
    let why = v["control_socket_replaced"].as_str().unwrap();
    assert!((why.contains("another file") || why.contains("is gone")) && why.contains("inject.mps_pipe_read_only"), "{why}");
    let cfg = node_agent::config::AgentConfig {
        ledger_dir: n.ledger_dir().to_path_buf(),
        mps_manager_state_file: n.manager_state_file().display().to_string(),
        ..Default::default()
    };
    let now = node_daemon::clock::unix_ms();
    let e = node_agent::mps::offline_ready(&cfg, 0, now, 60_000).unwrap_err();
    assert!(e.contains("control socket was replaced"), "{e}");
    // Meanwhile MPS is neither judged nor reset: the online client keeps its connection.
    std::thread::sleep(Duration::from_millis(500));
    let v = mstate(&n, "no recovery", |_| true);
    assert!(v["recoveries"].as_array().is_none_or(|r| r.is_empty()), "a reset would end the online service's connection: {v:#}");
    std::fs::remove_file(&sock).unwrap();
    std::fs::rename(&aside, &sock).unwrap();
    mstate(&n, "the report cleared", |v| v["control_socket_replaced"].is_null());
    online_progresses(&load, "online kernels through the daemon's own socket");
    assert_eq!(load.relaunches.load(Ordering::Relaxed), 0, "the online client never lost its connection");
}

/// Stress tool, not a timed test: SIGKILLs an offline MPS client holding its context N times
/// (`MPS_STRESS_N`, default 20) beside an online client, each at a random moment (0-40 ms)
/// after the client's context appeared on the device (so also before the control daemon or
/// the manager has seen it), and prints the online client's time-to-progress (SIGKILL -> first
/// completed online kernel once MPS is no longer hung) as median / p99 / max, the rounds over
/// 1 s and the full resets. Asserts only the mechanism: every fault recovered by
/// `terminate_client`, no MPS reset, the online client never lost its context.
/// `MPS_STRESS_MONITOR=1` runs sysmonitor beside the manager, as deployed, and the manager
/// checks at its shipped pace (500 ms): the monitor reclaims a dead process's ledger
/// registration, often before the manager looks, and the manager then finds the dead client
/// on its server's list.
/// `MPS_STRESS_N=200 cargo test -p e2e --test mps_manager_emu stress_sigkill -- --ignored --nocapture`
#[test]
#[ignore = "stress tool; run by hand"]
fn stress_sigkill_offline_online_time_to_progress() {
    let rounds: usize = e2e::env_or("MPS_STRESS_N", 20);
    let mut rng = e2e::XorShift(e2e::seed_from_env("MPS_STRESS_SEED"));
    let mut rand = move || rng.next_u64();
    let n = EmuHost::node();
    let with_monitor = e2e::env_or("MPS_STRESS_MONITOR", 0u32) == 1;
    let _monitor = with_monitor.then(|| n.start_monitor("mon.json", "{}"));
    if with_monitor {
        let shipped = manager_config().replace(r#""check_every_ms": 100"#, r#""check_every_ms": 500"#);
        assert!(shipped.contains(r#""check_every_ms": 500"#), "{shipped}");
        std::fs::write(n.path("mps.json"), shipped).unwrap();
    }
    let _manager = start_manager(&n);
    let v = mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = v["daemon_pid"].as_u64();
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let load = Load::start(&n, 0.5, 2.0);
    let dev = n.device();
    let generation = dev.snapshot().mps.generation;
    let mut times = Vec::new();
    let mut resets = 0;
    for i in 0..rounds {
        let mut off = offline_on_mps(&n, &ledger, 64);
        let delay = Duration::from_micros(rand() % 40_000);
        std::thread::sleep(delay);
        let t0 = Instant::now();
        let v = kill_until_recovered(&n, &mut off);
        let outcome = v["recoveries"].as_array().unwrap().last().unwrap()["outcome"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if outcome.contains("MPS reset") || outcome.contains("shutdown_server") {
            resets += 1;
        }
        wait_until("MPS not hung", || {
            let m = dev.snapshot().mps;
            m.enabled && !m.poisoned
        });
        let k = load.kernels.load(Ordering::Relaxed);
        wait_until("online progress", || {
            load.kernels.load(Ordering::Relaxed) > k
        });
        let took = t0.elapsed();
        times.push(took);
        eprintln!(
            "round {i}: killed {:.1} ms after its context appeared; online progress {took:?} after the SIGKILL; {outcome}",
            delay.as_secs_f64() * 1000.0
        );
        drop(off);
    }
    let v = mstate(&n, "final state", |_| true);
    let generation_now = dev.snapshot().mps.generation;
    let failures = load.failures.load(Ordering::Relaxed);
    eprintln!(
        "full resets {resets} (daemon {:?} -> {:?}, generation {generation} -> {generation_now}), online failed calls {failures}",
        daemon,
        v["daemon_pid"].as_u64(),
    );
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pick = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
    eprintln!(
        "SIGKILL of an offline MPS client x{rounds}: online time-to-progress min {:.0} ms, median {:.0} ms, p99 {:.0} ms, max {:.0} ms; over 1 s: {}; full resets: {resets}",
        ms(times[0]),
        ms(pick(0.5)),
        ms(pick(0.99)),
        ms(times[times.len() - 1]),
        times.iter().filter(|t| **t > Duration::from_secs(1)).count(),
    );
    load.stop();
    assert_eq!(resets, 0, "every fault recovered by terminate_client");
    assert_eq!(generation_now, generation, "MPS never reset");
    assert_eq!(failures, 0, "the online client never lost its context");
}

/// The manager (config `mps.json`) running root's MPS server with an online client (this
/// process's [`Load`]) on it, and the ledger.
fn manager_with_roots_online_client(n: &EmuHost) -> (EmuChild, node_ledger::Ledger, Load) {
    let manager = start_manager(n);
    mstate(n, "daemon started", |v| v["daemon_pid"].is_u64());
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let load = Load::start(n, 0.5, 2.0);
    mstate(n, "root's server", |v| v["mps_server_uid"] == 0);
    (manager, ledger, load)
}

/// `sleep 30` as uid/gid 65534 (needs root), holding `n`'s ledger open as an offline process.
fn sleep_as_nobody(n: &EmuHost) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new("sleep");
    c.arg("30").uid(65534).gid(65534);
    e2e::hold_ledger(&mut c, &n.ledger_path());
    c.spawn().unwrap()
}

/// One user per MPS GPU: with `client_uid` set, a registered offline process of another user
/// (which MPS would queue, then hand the GPU to once this user's clients are done) is reported
/// with the uids and the fix, and evicted (pid + start time, restart requested); the online
/// client of `client_uid` keeps its context. Without `client_uid`, it is left alone.
#[test]
fn an_offline_process_of_another_user_is_refused_loudly_when_client_uid_is_set() {
    if lacks_root("run an offline process as uid 65534") {
        return;
    }
    let n = EmuHost::node();
    let cfg = n.path("mps.json");
    let text = manager_config().replace(
        "\"evict_grace_ms\": 1000,",
        "\"evict_grace_ms\": 1000, \"client_uid\": 0,",
    );
    assert!(text.contains("\"client_uid\": 0"), "the config sets client_uid: {text}");
    std::fs::write(&cfg, text).unwrap();
    let (_manager, ledger, load) = manager_with_roots_online_client(&n);
    let mut nobody = sleep_as_nobody(&n);
    let pid = nobody.id();
    register(&ledger, pid, 0);
    let v = mstate(&n, "the other user's process evicted", |v| {
        v["restart_requested"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x["pid"] == pid))
    });
    let err = v["last_error"].as_str().unwrap_or_default().to_string();
    assert!(
        err.contains(&format!("offline process {pid} runs as uid 65534"))
            && err.contains("client_uid")
            && err.contains("runAsUser"),
        "{v:#}"
    );
    let end = Instant::now() + T;
    while nobody.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "not evicted");
        std::thread::sleep(Duration::from_millis(10));
    }
    online_progresses(&load, "online kernels");
    assert_eq!(load.failures.load(Ordering::Relaxed), 0);
    load.stop();
}

#[test]
fn without_client_uid_another_users_process_is_left_alone() {
    if lacks_root("run an offline process as uid 65534") {
        return;
    }
    let n = EmuHost::node();
    let (_manager, ledger, load) = manager_with_roots_online_client(&n);
    let mut nobody = sleep_as_nobody(&n);
    register(&ledger, nobody.id(), 0);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        nobody.try_wait().unwrap().is_none(),
        "not enforced without client_uid"
    );
    let _ = nobody.kill();
    let _ = nobody.wait();
    load.stop();
}


/// A registration can outlive its process: a forked child (a data-loader worker) inherits the
/// slot lock and holds the slot while the registered parent is dead. The dead client is a
/// fault once: its recovery finds no server listing it ("left MPS"), and it is not recovered
/// again at every check while the slot stays (before: a recovery, with its 500 ms of listing,
/// every ~0.6 s, each with a WARN line). The manager saw the parent alive holding the slot's
/// lock (`offline_seen`) before it died: a dead registration it never saw so is no dead client
/// (`a_forged_dead_registration_rewritten_at_every_check_does_not_starve_a_dead_listed_client`).
#[test]
fn a_dead_registration_kept_by_its_slot_lock_is_one_fault_not_one_per_check() {
    let n = EmuHost::node();
    let _manager = start_manager(&n);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let child_pid = n.path("child.pid");
    let mut parent = n.spawn_sh_offline(&format!("sleep 60 & echo $! > '{}'; exec sleep 60", child_pid.display()));
    let _slot = register(&ledger, parent.pid(), 0);
    mstate(&n, "the registered process seen holding its slot's lock", |v| v["offline_seen"].as_u64() >= Some(1));
    wait_until("the child forked", || std::fs::read_to_string(&child_pid).is_ok_and(|s| s.ends_with('\n')));
    let child: i32 = std::fs::read_to_string(&child_pid).unwrap().trim().parse().unwrap();
    parent.signal(libc::SIGKILL);
    assert!(parent.wait_exit(T).is_some());
    let v = mstate(&n, "the dead client's recovery", |v| v["recoveries"].as_array().is_some_and(|r| !r.is_empty()));
    let outcome = v["recoveries"][0]["outcome"].as_str().unwrap().to_string();
    // Several checks (every 100 ms) and recoveries' worth of time with the slot still there.
    std::thread::sleep(Duration::from_secs(2));
    let v = mstate(&n, "a fresh state", |_| true);
    // SAFETY: kill(2) of the child this test's shell forked (still running: it holds the slot).
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert!(outcome.contains("left MPS"), "{v:#}");
    assert_eq!(v["recoveries"].as_array().unwrap().len(), 1, "recovered again and again: {v:#}");
}

/// A tenant writes a slot naming a pid nobody has (a dead client, as it reads) and rewrites its
/// start time at every check, while an online neighbour's real dead client, killed holding its
/// context, stays on its server's list and hangs it. The forged slot is no dead client (the
/// manager never saw its owner holding its lock): the listed dead client is terminated, MPS is
/// not reset. Before, each rewrite was a new `client_died`, first of every check, whose
/// recovery waited 500 ms for a pid no server listed and was the only one of the check: the
/// listed dead client was never terminated and the online client stayed hung.
#[test]
fn a_forged_dead_registration_rewritten_at_every_check_does_not_starve_a_dead_listed_client() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let n = EmuHost::node();
    let _manager = start_manager(&n);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let load = Load::start(&n, 0.5, 2.0);
    let dev = n.device();
    let _quit = QuitOnPanic(n.device());
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    let start = node_ledger::procinfo::start_time(gone_pid).unwrap_or(1);
    gone.wait().unwrap();
    let forged = e2e::forge_slot(&ledger, gone_pid, start, 0);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let forger = {
        let (stop, path) = (stop.clone(), n.ledger_path());
        std::thread::spawn(move || {
            let ledger = node_ledger::Ledger::open_or_create(&path, 0).unwrap();
            let mut st = start;
            while !stop.load(SeqCst) {
                st += 1;
                ledger.layout().procs[forged.slot].start_time.store(st, SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut off = n.spawn_helper("gpu-mem", "64");
    let op = off.pid();
    wait_until("the client on MPS", || dev.snapshot().processes.iter().any(|p| p.pid == op && p.mps_client));
    mstate(&n, "both clients listed on their server", |v| v["clients"].as_u64() >= Some(2));
    let generation = dev.snapshot().mps.generation;
    let v = kill_until_recovered(&n, &mut off);
    stop.store(true, SeqCst);
    forger.join().unwrap();
    let r = v["recoveries"].as_array().unwrap().last().unwrap();
    assert!(r["outcome"].as_str().unwrap().contains("terminate_client"), "{v:#}");
    assert!(
        v["recoveries"].as_array().unwrap().iter().all(|r| r["fault"]["client_died"]["pid"] != gone_pid),
        "the forged slot made a recovery: {v:#}"
    );
    wait_until("MPS no longer hung", || !dev.snapshot().mps.poisoned);
    online_kept_its_context(&load, &dev, generation, "terminating the dead listed client");
    load.stop();
}
