//! An offline job that initialised CUDA before MPS ran is outside MPS for its life (CUDA looks
//! for the control daemon once): time-sliced against the online service, out of reach of the
//! offline SM budget. Two layers keep such processes off the GPU:
//!
//! - the compute mode (`compute_mode`, default `exclusive_process`): mps-manager holds the GPU
//!   in EXCLUSIVE_PROCESS, where only the MPS server holds a context of its own, so a process
//!   that misses MPS once it runs gets no context at all; one that already held the GPU keeps
//!   MPS from starting, and is reported (NVML lists it, no server does);
//! - `outside_mps`: an offline process found launching kernels (ledger) while no server lists
//!   it is evicted for a restart under MPS, or reported. The tests of this layer leave the
//!   compute mode as it is (`compute_mode: leave`), as on a GPU whose operator manages it.
//!
//! The offline jobs are the `offline` workload under the shim, as uid 65534 when the test runs
//! as root (as offline containers run), otherwise as the test's user; as root the evicting
//! test runs each in a pid namespace of its own (`unshare --pid --fork`, the job its pid 1, as a
//! container's entrypoint): the manager matches the pids MPS lists (host pids) to the ledger's
//! (pid 1 of each namespace) by namespace.

use std::os::unix::process::CommandExt;
use std::path::Path;
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
/// a pid namespace of its own when `container` (root only). Waits for its first progress
/// report.
fn offline_job(n: &EmuHost, job: &str, container: bool) -> Job {
    let mut p = spawn_offline(n, job, container, None);
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

/// [`offline_job`] started, not waited for; `pipe_dir` replaces the host's
/// `CUDA_MPS_PIPE_DIRECTORY` (a job that looks for MPS elsewhere).
fn spawn_offline(n: &EmuHost, job: &str, container: bool, pipe_dir: Option<&Path>) -> EmuChild {
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
    if let Some(d) = pipe_dir {
        c.env("CUDA_MPS_PIPE_DIRECTORY", d);
    }
    if is_root() && !container {
        // std drops the supplementary groups when root switches uid.
        c.uid(NOBODY).gid(NOBODY);
    }
    n.spawn(&mut c)
}

fn node() -> EmuHost {
    e2e::node_for_all_users()
}

/// mps-manager with `outside_mps` = `outside`, `compute_mode` = `mode`, `quit_on_exit`; not
/// waited for.
fn spawn_manager(n: &EmuHost, outside: &str, mode: &str) -> EmuChild {
    let cfg = e2e::fast_manager_config(Some(true))
        .replace(
            &format!("\"compute_mode\": \"{}\"", e2e::manager_compute_mode()),
            &format!("\"compute_mode\": \"{mode}\""),
        )
        .replacen(
            "{",
            &format!("{{\n  \"outside_mps\": \"{outside}\",\n  \"outside_mps_after_ms\": 500,"),
            1,
        );
    n.start_manager("mps.json", &cfg)
}

/// [`spawn_manager`], once its control daemon runs.
fn manager(n: &EmuHost, outside: &str, mode: &str) -> EmuChild {
    let m = spawn_manager(n, outside, mode);
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
    let _m = manager(&n, "evict", "leave");
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
    let _m = manager(&n, "report", "leave");
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


/// The device's compute mode.
fn compute_mode(n: &EmuHost) -> u32 {
    n.device().compute_mode()
}

/// With the shipped `compute_mode` (exclusive_process) the manager puts the GPU in
/// EXCLUSIVE_PROCESS before MPS starts: a job on MPS runs, a job that looks for MPS in another
/// pipe directory gets no context (CUDA_ERROR_DEVICE_UNAVAILABLE) instead of running beside MPS
/// (with `leave` it runs: `emu_mps::a_client_in_another_pipe_directory_runs_without_mps`).
/// With quit_on_exit the mode found (DEFAULT) is back once the manager has quit MPS. Not root,
/// the manager cannot set the mode (root only, as on a real GPU): it does not start MPS, and
/// says how to fix it.
#[test]
fn in_exclusive_process_mode_a_job_that_misses_mps_gets_no_context() {
    use emu_device::layout::compute_mode as cm;
    let n = node();
    assert_eq!(compute_mode(&n), cm::DEFAULT);
    if !is_root() {
        let mut m = spawn_manager(&n, "evict", "exclusive_process");
        assert!(m.wait_exit(T).is_some_and(|c| c != Some(0)), "a manager unable to set the mode must not run");
        let log = n.log("mps.json");
        assert!(log.contains("nvidia-smi -i 0 -c EXCLUSIVE_PROCESS"), "{log}");
        assert_eq!(compute_mode(&n), cm::DEFAULT);
        assert!(!n.device().mps_status().enabled, "no MPS without the fence");
        return;
    }
    let mut m = manager(&n, "evict", "exclusive_process");
    assert_eq!(compute_mode(&n), cm::EXCLUSIVE_PROCESS, "set before the daemon started");
    let v = n.wait_manager_state(T, "mps.json", "the mode in the state file", |v| v["compute_mode"].is_string());
    assert_eq!((v["compute_mode"].as_str(), v["compute_mode_found"].as_str()), (Some("exclusive_process"), Some("default")), "{v:#}");
    let on = offline_job(&n, "on-mps", false);
    assert_eq!(mps_client(&n, on.pid), Some(true));
    let elsewhere = n.path("another-pipe-dir");
    std::fs::create_dir_all(&elsewhere).unwrap();
    e2e::chmod(&elsewhere, 0o755);
    let mut missed = spawn_offline(&n, "missed", false, Some(&elsewhere));
    let status = missed.wait_timeout(T).expect("the job that missed MPS never stopped");
    assert!(!status.success());
    assert!(missed.stderr().contains("CUDA_ERROR_DEVICE_UNAVAILABLE"), "{}", missed.stderr());
    // The shim says why, naming where the job looked for MPS.
    assert!(
        missed.stderr().contains("did not reach MPS") && missed.stderr().contains(&elsewhere.display().to_string()),
        "{}",
        missed.stderr()
    );
    let v = n.wait_manager_state(T, "mps.json", "a later look", |v| v["clients"].as_u64() >= Some(1));
    assert_eq!(v["outside_mps"], 0, "nothing ran outside: {v:#}");
    assert_eq!(v["outside_holders"], serde_json::json!([]), "{v:#}");
    drop(on);
    m.signal(libc::SIGTERM);
    assert!(m.wait_exit(T).is_some(), "the manager never stopped");
    assert_eq!(compute_mode(&n), cm::DEFAULT, "put back after quit: {}", n.log("mps.json"));
}

/// A manager that sets EXCLUSIVE_PROCESS and then cannot start MPS (its control program fails)
/// exits, and the next manager finds EXCLUSIVE_PROCESS: the mode found (DEFAULT) must reach it
/// through the state file, written before the mode is changed, so that `quit_on_exit` puts it
/// back. Before, the state file was first written at the first check, which such a manager never
/// reached: the GPU stayed EXCLUSIVE_PROCESS after the last manager quit MPS.
#[test]
fn a_manager_that_cannot_start_mps_leaves_the_mode_found_to_the_next() {
    use emu_device::layout::compute_mode as cm;
    if e2e::lacks_root("set the GPU's compute mode") {
        return;
    }
    let n = node();
    assert_eq!(compute_mode(&n), cm::DEFAULT);
    let cfg = e2e::fast_manager_config(Some(true));
    let broken = cfg.replace(&artifact("emu-mps-control").display().to_string(), "/nonexistent/nvidia-cuda-mps-control");
    assert_ne!(broken, cfg);
    let mut first = n.start_manager("mps-broken.json", &broken);
    let status = first.wait_timeout(T).expect("the manager that cannot start MPS never exited");
    assert!(!status.success(), "{}", n.log("mps-broken.json"));
    assert!(n.log("mps-broken.json").contains("cannot start MPS"), "{}", n.log("mps-broken.json"));
    assert_eq!(compute_mode(&n), cm::EXCLUSIVE_PROCESS, "set before the daemon would start");
    let mut m = n.start_manager("mps.json", &cfg);
    let v = n.wait_manager_state(T, "mps.json", "daemon started", |v| v["daemon_pid"].is_u64());
    assert_eq!(v["compute_mode_found"].as_str(), Some("default"), "{v:#}");
    m.signal(libc::SIGTERM);
    assert!(m.wait_exit(T).is_some(), "the manager never stopped");
    assert_eq!(compute_mode(&n), cm::DEFAULT, "put back after quit: {}", n.log("mps.json"));
}

/// A process that held the GPU before MPS started (here the online workload, no offline job:
/// not in the ledger) keeps any MPS server from starting in EXCLUSIVE_PROCESS mode: the manager
/// reports it (ERROR line, state file `outside_holders`) and an MPS client is refused until
/// it exits; then MPS serves the next client.
#[test]
fn in_exclusive_process_mode_a_process_that_held_the_gpu_first_is_reported() {
    if e2e::lacks_root("set the GPU's compute mode") {
        return;
    }
    let n = node();
    let mut early = n.spawn(n.command("online").args(["--json", "--rate", "20", "--duration", "60"]));
    let dev = n.device();
    let end = Instant::now() + T;
    while !dev.snapshot().processes.iter().any(|p| p.pid == early.pid() && p.contexts > 0) {
        assert!(Instant::now() < end, "the online workload never made its context: {}", early.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    let _m = manager(&n, "evict", "exclusive_process");
    let v = n.wait_manager_state(T, "mps.json", "the holder reported", |v| {
        v["outside_holders"].as_array().is_some_and(|h| !h.is_empty())
    });
    assert_eq!(v["outside_holders"], serde_json::json!([early.pid()]), "{v:#}");
    // node-agent reads it: the GPU takes no offline work (its slots Unhealthy) while held.
    let ready = || node_agent::test_support::mps_ready_gpu0(n.ledger_dir(), &n.manager_state_file());
    let e = ready().unwrap_err();
    assert!(e.contains(&format!("[{}]", early.pid())) && e.contains("EXCLUSIVE_PROCESS"), "{e}");
    let log = n.log("mps.json");
    assert!(
        log.contains(&format!("pid={}", early.pid())) && log.contains("restart it with CUDA_MPS_PIPE_DIRECTORY"),
        "{log}"
    );
    let mut refused = spawn_offline(&n, "refused", false, None);
    let status = refused.wait_timeout(T).expect("the refused job never stopped");
    assert!(!status.success());
    assert!(refused.stderr().contains("CUDA_ERROR_MPS_CONNECTION_FAILED"), "{}", refused.stderr());
    assert!(early.wait_timeout(Duration::ZERO).is_none(), "the holder is not the manager's to stop");
    early.signal(libc::SIGTERM);
    assert!(early.wait_exit(T).is_some());
    n.wait_manager_state(T, "mps.json", "the holder gone", |v| v["outside_holders"] == serde_json::json!([]));
    assert_eq!(ready(), Ok(()), "the GPU free again");
    let again = offline_job(&n, "after", false);
    assert_eq!(mps_client(&n, again.pid), Some(true), "MPS serves once the GPU is free");
}
