//! An offline job that initialised CUDA before MPS ran is outside MPS for its life (CUDA looks
//! for the control daemon once): time-sliced against the online service, out of reach of the
//! offline SM budget. mps-manager finds it from the ledger (its launches advance) and the
//! servers' client lists (it is on none), and evicts it for a restart under MPS, or reports it.
//!
//! The offline jobs are the `offline` workload under the shim, as uid 65534 when the test runs
//! as root (as offline containers run), otherwise as the test's user; as root the evicting
//! test runs each in a pid namespace of its own (`unshare --pid --fork`, the job its pid 1, as a
//! container's entrypoint): the manager matches the pids MPS lists (host pids) to the ledger's
//! (pid 1 of each namespace) by namespace.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use e2e::{artifact, is_root, EmuChild, EmuHost};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);
const NOBODY: u32 = 65534;

/// An offline job: the process started (`unshare` for one in its own pid namespace) and the
/// job's pid here (what the device and MPS name it).
struct Job {
    child: EmuChild,
    pid: u32,
}

/// The `offline` workload under the shim, in quota group `job`, small kernels back to back; in
/// a pid namespace of its own when `container` (root only).
fn offline_job(n: &EmuHost, job: &str, container: bool) -> Job {
    let mut c = if container {
        let mut c = n.command("unshare");
        c.args(["--pid", "--fork", "--kill-child=SIGTERM", "--setuid", "65534", "--setgid", "65534"])
            .arg(n.programs_dir().join("offline"));
        c
    } else {
        n.command("offline")
    };
    c.args(["--json", "--blocks", "8", "--kernel-us", "2000", "--report-interval", "0.1", "--state-mb", "4"])
        .env("LD_PRELOAD", artifact("libxcuda.so"))
        .env("XSHARE_LEDGER_DIR", n.ledger_dir())
        .env("XCUDA_GROUP", job)
        .env("XCUDA_THROTTLE", "0");
    if is_root() && !container {
        // std drops the supplementary groups when root switches uid.
        c.uid(NOBODY).gid(NOBODY);
    }
    let mut p = n.spawn(&mut c);
    assert!(
        p.wait_for_line("{\"client\":\"offline\",\"t_s\"", T).is_some(),
        "offline job {job} never reported progress: {}",
        p.stderr()
    );
    let pid = if container {
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", p.pid())).unwrap_or_default();
        kids.split_whitespace().next().and_then(|k| k.parse().ok()).expect("the job under unshare")
    } else {
        p.pid()
    };
    Job { child: p, pid }
}

/// An emulated node whose device, ledger and MPS directories every user may use; the manager
/// is not started.
fn node() -> EmuHost {
    let n = EmuHost::node();
    n.open_to_all_users();
    for d in [n.ledger_dir().to_path_buf(), n.ledger_dir().join("gpu0")] {
        std::fs::create_dir_all(&d).unwrap();
        e2e::chmod(&d, 0o755);
    }
    // The ledger as the node daemons create it (mode for every offline user).
    node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).expect("ledger");
    n
}

fn manager(n: &EmuHost, outside: &str) -> EmuChild {
    let cfg = e2e::fast_manager_config(None).replacen(
        "{",
        &format!("{{\n  \"outside_mps\": \"{outside}\",\n  \"outside_mps_after_ms\": 500,"),
        1,
    );
    let m = n.start_manager("mps.json", &cfg);
    n.wait_manager_state(T, "mps.json", "daemon started", |v| v["daemon_pid"].is_u64());
    m
}

/// Whether `pid` is an MPS client (`Some(true)`), outside MPS while it runs (`Some(false)`),
/// per the emulated device.
fn mps_client(n: &EmuHost, pid: u32) -> Option<bool> {
    let p = n.device().snapshot().processes.into_iter().find(|p| p.pid == pid)?;
    (p.mps_client || p.mps_outside).then_some(p.mps_client)
}

fn restart_reasons(v: &Value, pid: u32) -> Vec<String> {
    v["restart_requested"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter(|x| x["pid"] == pid)
                .map(|x| x["reason"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_offline_job_started_before_mps_is_evicted_for_a_restart_under_mps() {
    let n = node();
    let container = is_root();
    let Job { child: mut early, pid: early_pid } = offline_job(&n, "early", container);
    let _m = manager(&n, "evict");
    let Job { child: mut late, pid: late_pid } = offline_job(&n, "late", container);
    assert_eq!(mps_client(&n, late_pid), Some(true), "started once MPS runs: an MPS client");
    assert_eq!(mps_client(&n, early_pid), Some(false), "started before MPS: outside it for life");

    let v = n.wait_manager_state(T, "mps.json", "the early job found outside MPS", |v| {
        v["outside_mps"].as_u64() >= Some(1)
    });
    assert_eq!(v["outside_mps"], 1, "only the early job: {v:#}");
    assert_eq!(restart_reasons(&v, early_pid), ["ran outside MPS"], "by its pid here: {v:#}");
    assert!(restart_reasons(&v, late_pid).is_empty(), "{v:#}");
    assert!(early.wait_exit(T).is_some(), "evicted, the early job never exited: {}", early.stderr());
    let log = n.log("mps.json");
    let ledger_pid = if container { 1 } else { early_pid };
    assert!(
        log.contains(&format!("offline process {ledger_pid} "))
            && log.contains(&format!("pid {early_pid} here"))
            && log.contains("no MPS server lists it"),
        "{log}"
    );
    // The job on MPS keeps running, and is never judged outside.
    let end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < end {
        assert!(late.wait_timeout(Duration::ZERO).is_none(), "the job on MPS was stopped: {}", late.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = n.wait_manager_state(T, "mps.json", "a later look", |v| v["outside_mps"] == 1);
    assert!(restart_reasons(&v, late_pid).is_empty(), "{v:#}");
    // Relaunched, the early job runs under MPS.
    let again = offline_job(&n, "early", container);
    assert_eq!(mps_client(&n, again.pid), Some(true), "relaunched: an MPS client");
}

#[test]
fn with_outside_mps_report_the_job_is_reported_and_left_running() {
    let n = node();
    let Job { child: mut early, pid: early_pid } = offline_job(&n, "early", false);
    let _m = manager(&n, "report");
    let v = n.wait_manager_state(T, "mps.json", "the early job found outside MPS", |v| {
        v["outside_mps"].as_u64() >= Some(1)
    });
    assert!(restart_reasons(&v, early_pid).is_empty(), "{v:#}");
    assert!(
        v["last_error"].as_str().is_some_and(|e| e.contains("left running (outside_mps: report)")),
        "{v:#}"
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert!(early.wait_timeout(Duration::ZERO).is_none(), "reported only: {}", early.stderr());
    let v = n.wait_manager_state(T, "mps.json", "a later look", |v| v["outside_mps"].is_u64());
    assert_eq!(v["outside_mps"], 1, "reported once: {v:#}");
}

