//! Whether an offline container could use MPS on a GPU now, as that GPU's mps-manager says in
//! its state file ([`AgentConfig::mps_manager_state_path`]). The agent is its only reader here.
//!
//! mps-manager holds the GPU in EXCLUSIVE_PROCESS and owns its MPS control daemon, so an
//! offline process gets a context only through MPS: while no daemon runs (the manager restarts
//! it, a recovery is rate-limited, or the manager quit MPS when it stopped; the manager clears
//! `daemon_pid` at the first check that finds its daemon gone), while a process
//! outside MPS holds the GPU in EXCLUSIVE_PROCESS (no server can start), or while the daemon's
//! `/dev/shm` is not the one containers are given, every
//! offline container admitted to the GPU would fail to create a context. The GPU's offline
//! slots then read Unhealthy ([`crate::plugin::poll_health`]: the kubelet admits nothing, the
//! heartbeat tells the cluster), and Allocate refuses.
//!
//! Fields read (mps-manager's `ManagerState`; keep their names and meanings): `gpu`,
//! `daemon_pid`, `daemon_not_answering`, `shm_dir`, `outside_holders`, `compute_mode`, `last_error`, `updated_unix_ms`. No state file
//! (no manager on that GPU yet, or none at all) is not judged: MPS is then the operator's.

use std::path::Path;

use serde_json::Value;

use crate::config::AgentConfig;

/// `Ok` when MPS on GPU `gpu` could serve an offline container now (or no manager state is
/// there to say otherwise); `Err` says why not, naming the file, and what to do. A state file
/// older than `stale_after_ms` at wall-clock `now_unix_ms` is a stopped manager's: what it left
/// still holds (a daemon it left running serves; one it quit is gone).
pub fn offline_ready(
    cfg: &AgentConfig,
    gpu: u32,
    now_unix_ms: u64,
    stale_after_ms: u64,
) -> Result<(), String> {
    let path = cfg.mps_manager_state_path(gpu);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("mps-manager's state file {} cannot be read: {e}", path.display())),
    };
    let state: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("mps-manager's state file {} is unreadable: {e}", path.display()))?;
    if !state.is_object() {
        return Err(format!("mps-manager's state file {} is not a JSON object", path.display()));
    }
    if let Some(other) = state.get("gpu").and_then(Value::as_u64).filter(|&g| g != u64::from(gpu)) {
        return Err(format!(
            "mps-manager's state file {} is GPU {other}'s (set node-agent's mps_manager_state_file to the \
             manager's state_file, with {{gpu}})",
            path.display()
        ));
    }
    daemon_runs(&state, &path, now_unix_ms, stale_after_ms)?;
    daemon_answers(&state, &path)?;
    control_socket_sound(&state, &path)?;
    no_outside_holder(&state, &path)?;
    shm_matches(cfg, gpu, &state, &path)
}

/// Whether the state names a running MPS control daemon (`daemon_pid`).
fn daemon_runs(state: &Value, path: &Path, now_unix_ms: u64, stale_after_ms: u64) -> Result<(), String> {
    if state.get("daemon_pid").and_then(Value::as_u64).is_some() {
        return Ok(());
    }
    let updated = state.get("updated_unix_ms").and_then(Value::as_u64).unwrap_or(0);
    let age_ms = now_unix_ms.saturating_sub(updated);
    let mut why = if updated == 0 || age_ms > stale_after_ms {
        format!(
            "no MPS control daemon: mps-manager last wrote {} {} s ago (stopped or hung) and left none",
            path.display(),
            age_ms / 1000
        )
    } else {
        format!(
            "no MPS control daemon runs (mps-manager's state file {}, written {} s ago)",
            path.display(),
            age_ms / 1000
        )
    };
    if let Some(e) = state.get("last_error").and_then(Value::as_str) {
        why.push_str(&format!("; its last error: {e}"));
    }
    Err(why)
}

/// Whether the daemon answered mps-manager's last look (`daemon_not_answering`: a hang, in
/// which a container admitted now would hang at its first CUDA call).
fn daemon_answers(state: &Value, path: &Path) -> Result<(), String> {
    match state.get("daemon_not_answering").and_then(Value::as_str) {
        Some(why) => Err(format!("the MPS control daemon does not answer (mps-manager, {}): {why}", path.display())),
        None => Ok(()),
    }
}

/// Whether new MPS clients reach the daemon: mps-manager found its `pipe_dir/control` socket
/// removed or replaced (`control_socket_replaced`; the pipe directory is in offline containers'
/// mounts): a container admitted now would connect to whatever is there.
fn control_socket_sound(state: &Value, path: &Path) -> Result<(), String> {
    match state.get("control_socket_replaced").and_then(Value::as_str) {
        Some(why) => Err(format!("the MPS control socket was replaced (mps-manager, {}): {why}", path.display())),
        None => Ok(()),
    }
}

/// Whether an MPS server can start: in EXCLUSIVE_PROCESS (`compute_mode`) a process holding a
/// context of its own outside MPS (`outside_holders`, as the manager found them) keeps every
/// server off the GPU until it exits, so every MPS client is refused.
fn no_outside_holder(state: &Value, path: &Path) -> Result<(), String> {
    let holders: Vec<u64> = state
        .get("outside_holders")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    if holders.is_empty() || state.get("compute_mode").and_then(Value::as_str) != Some("exclusive_process") {
        return Ok(());
    }
    Err(format!(
        "processes {holders:?} hold the GPU outside MPS, and in EXCLUSIVE_PROCESS no MPS server can start          until they exit (mps-manager, {}; restart them with the GPU's CUDA_MPS_PIPE_DIRECTORY)",
        path.display()
    ))
}

/// Whether the `/dev/shm` a container of GPU `gpu` is given ([`AgentConfig::mps_shm_host_dir`])
/// is the one the GPU's MPS control daemon has, as mps-manager publishes it (`shm_dir`: the
/// directory the daemon was checked to see as its `/dev/shm`, `null` when it does not see the
/// configured one). A container with another `/dev/shm` reaches the daemon but cannot connect
/// to its server (`CUDA_ERROR_MPS_CONNECTION_FAILED`).
/// With `inject.mps_shm: "private"` containers get no MPS shm directory: nothing to match.
fn shm_matches(cfg: &AgentConfig, gpu: u32, state: &Value, path: &Path) -> Result<(), String> {
    if cfg.inject.mps_shm == crate::config::MpsShm::Private {
        return Ok(());
    }
    let ours = cfg.mps_shm_host_dir(gpu);
    match state.get("shm_dir") {
        // A manager from before `shm_dir` (its daemon keeps the host's /dev/shm).
        None => Ok(()),
        Some(Value::String(theirs)) if Path::new(theirs) == ours => Ok(()),
        Some(Value::String(theirs)) => Err(format!(
            "its daemon's /dev/shm is {theirs} (mps-manager shm_dir, {}), this agent would mount {} \
             (inject.mps_shm_dir): set the two alike",
            path.display(),
            ours.display()
        )),
        Some(_) => Err(format!(
            "its daemon does not see mps-manager's shm_dir as its /dev/shm ({}: {}); restart MPS",
            path.display(),
            state.get("last_error").and_then(Value::as_str).unwrap_or("see mps-manager status")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_800_000_000_000;
    const STALE: u64 = 5000;

    fn cfg(dir: &Path) -> AgentConfig {
        AgentConfig {
            ledger_dir: dir.to_path_buf(),
            ..AgentConfig::default()
        }
    }

    fn write(dir: &Path, v: Value) {
        std::fs::create_dir_all(dir.join("daemons/gpu1")).unwrap();
        std::fs::write(dir.join("daemons/gpu1/mps-manager.json"), v.to_string()).unwrap();
    }

    /// A running manager's state: daemon up, the default `/dev/shm` of GPU 1, written now.
    fn running() -> Value {
        json!({"gpu": 1, "manager_pid": 5, "daemon_pid": 7, "shm_dir": "/dev/shm/xshare-gpu1",
               "outside_holders": [], "last_error": null, "updated_unix_ms": NOW - 400})
    }

    #[test]
    fn no_state_file_is_not_judged_and_a_running_daemon_serves() {
        let d = tempfile::tempdir().unwrap();
        let c = cfg(d.path());
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()), "no manager: not judged");
        write(d.path(), running());
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()));
        // A manager that stopped and left its daemon running: the daemon still serves.
        let mut v = running();
        v["updated_unix_ms"] = json!(NOW - 3_600_000);
        write(d.path(), v);
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()));
    }

    #[test]
    fn no_daemon_is_not_ready_and_says_why() {
        let d = tempfile::tempdir().unwrap();
        let c = cfg(d.path());
        let mut v = running();
        v["daemon_pid"] = Value::Null;
        v["last_error"] = json!("recovery rate limit: 6 in the last hour");
        write(d.path(), v.clone());
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("no MPS control daemon runs") && e.contains("mps-manager.json") && e.contains("rate limit"), "{e}");
        // A manager that quit MPS when it stopped, 2 minutes ago.
        let mut v = running();
        v["daemon_pid"] = Value::Null;
        v["updated_unix_ms"] = json!(NOW - 120_000);
        write(d.path(), v);
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("120 s ago") && e.contains("stopped"), "{e}");
    }

    /// A daemon that runs but does not answer (a hang whose reset is rate-limited): a
    /// container admitted now would hang at its first CUDA call.
    #[test]
    fn a_daemon_that_does_not_answer_is_not_ready() {
        let d = tempfile::tempdir().unwrap();
        let c = cfg(d.path());
        let mut v = running();
        v["daemon_not_answering"] = json!("MPS control daemon 4242: MPS control did not answer `get_server_list` within 2000 ms");
        write(d.path(), v.clone());
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("does not answer") && e.contains("4242") && e.contains("mps-manager.json"), "{e}");
        v["daemon_not_answering"] = Value::Null;
        write(d.path(), v);
        assert!(offline_ready(&c, 1, NOW, STALE).is_ok());
    }

    /// A control socket mps-manager found replaced: new clients would reach whatever is there.
    #[test]
    fn a_replaced_control_socket_is_not_ready() {
        let d = tempfile::tempdir().unwrap();
        let c = cfg(d.path());
        let mut v = running();
        v["control_socket_replaced"] = json!("/run/xshare/gpu1/mps-pipe/control is gone: ...");
        write(d.path(), v.clone());
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("control socket was replaced") && e.contains("is gone") && e.contains("mps-manager.json"), "{e}");
        v["control_socket_replaced"] = Value::Null;
        write(d.path(), v);
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()));
    }

    /// A process holding the GPU outside MPS keeps every server off it in EXCLUSIVE_PROCESS;
    /// in the default mode it shares the GPU beside MPS, which still serves.
    #[test]
    fn a_process_outside_mps_in_exclusive_process_mode_is_not_ready() {
        let d = tempfile::tempdir().unwrap();
        let c = cfg(d.path());
        let mut v = running();
        v["outside_holders"] = json!([4242]);
        v["compute_mode"] = json!("exclusive_process");
        write(d.path(), v.clone());
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("[4242]") && e.contains("EXCLUSIVE_PROCESS") && e.contains("mps-manager.json"), "{e}");
        v["compute_mode"] = json!("default");
        write(d.path(), v.clone());
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()));
        v["compute_mode"] = Value::Null; // `leave`: not read
        write(d.path(), v);
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()));
    }

    #[test]
    fn a_damaged_or_foreign_state_file_is_not_ready() {
        let d = tempfile::tempdir().unwrap();
        let c = cfg(d.path());
        std::fs::create_dir_all(d.path().join("daemons/gpu1")).unwrap();
        for bad in [&b"{\"gpu\": "[..], b"", b"\0\0\0", b"[1, 2]"] {
            std::fs::write(d.path().join("daemons/gpu1/mps-manager.json"), bad).unwrap();
            let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
            assert!(e.contains("mps-manager.json") && (e.contains("unreadable") || e.contains("not a JSON object")), "{e}");
        }
        let mut v = running();
        v["gpu"] = json!(0);
        write(d.path(), v);
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("GPU 0's") && e.contains("{gpu}"), "{e}");
    }

    /// The `/dev/shm` a container is given is checked against the one mps-manager published
    /// for its GPU's daemon (its state file's `shm_dir`, as the manager writes it).
    #[test]
    fn a_dev_shm_the_mps_daemon_does_not_have_is_not_ready() {
        let d = tempfile::tempdir().unwrap();
        let mut c = cfg(d.path());
        let state = |v: Value| write(d.path(), v);
        state(json!({"gpu": 1, "daemon_pid": 7, "shm_dir": "/dev/shm/xshare-gpu1"}));
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()), "the defaults agree");
        c.inject.mps_shm_dir = "host".into();
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("/dev/shm/xshare-gpu1") && e.contains("would mount /dev/shm") && e.contains("inject.mps_shm_dir"), "{e}");
        state(json!({"gpu": 1, "daemon_pid": 7, "shm_dir": "/dev/shm"}));
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()), "both the host's");
        state(json!({"gpu": 1, "daemon_pid": 7}));
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()), "a manager from before shm_dir");
        state(json!({"gpu": 1, "daemon_pid": 7, "shm_dir": null, "last_error": "MPS control daemon 7 does not see /x as its /dev/shm"}));
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("does not see /x") && e.contains("restart MPS"), "{e}");
        // A manager with its own `state_file`: the agent reads the one it is told to.
        c.mps_manager_state_file = format!("{}/mgr{{gpu}}.json", d.path().display());
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()), "none there yet: not judged");
        std::fs::write(d.path().join("mgr1.json"), json!({"daemon_pid": 7, "shm_dir": "/dev/shm/xshare-gpu1"}).to_string()).unwrap();
        let e = offline_ready(&c, 1, NOW, STALE).unwrap_err();
        assert!(e.contains("mgr1.json") && e.contains("would mount /dev/shm"), "{e}");
        // `inject.mps_shm: "private"`: containers get no MPS shm directory, nothing to match.
        c.inject.mps_shm = crate::config::MpsShm::Private;
        assert_eq!(offline_ready(&c, 1, NOW, STALE), Ok(()));
    }
}
