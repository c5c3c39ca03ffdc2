//! Targeted recovery against what real MPS may legitimately show: the dead client not on any
//! server's list yet when the manager first looks. The manager looks again within a bound
//! (`LISTING_GRACE_MS`) and terminates it there instead of resetting MPS (which would also
//! kill the online client's context).
//!
//! The control program here is a scripted stand-in, not the emulator: the emulator lists a
//! client from the moment it holds a context (as real MPS does once the client is connected),
//! so it never shows this state, and the manager must still survive it on real hardware.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use e2e::{register, EmuHost};
use serde_json::Value;

/// A control program whose one server (pid 4242) lists the pid in `$PIPE/dead` only from the
/// `$PIPE/list_from`-th `get_client_list` after that file appeared. Every command is logged.
const SCRIPT: &str = r#"#!/bin/sh
D="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then
  mkdir -p "$D"
  # The stand-in daemon, named as the real one is (mps-manager checks the name).
  printf '#!/bin/sh\nsleep 600\n' > "$D/nvidia-cuda-mps-control"; chmod +x "$D/nvidia-cuda-mps-control"
  "$D/nvidia-cuda-mps-control" </dev/null >/dev/null 2>&1 &
  echo $! > "$D/nvidia-cuda-mps-control.pid"
  exit 0
fi
read -r line
echo "$line" >> "$D/commands.log"
case "$line" in
  get_server_list) echo 4242 ;;
  "get_client_list 4242")
    if [ -f "$D/dead" ]; then
      n=$(( $(cat "$D/looks" 2>/dev/null || echo 0) + 1 ))
      echo $n > "$D/looks"
      [ $n -ge "$(cat "$D/list_from")" ] && [ ! -f "$D/terminated" ] && cat "$D/dead"
    fi ;;
  "get_client_list "*) echo "Server not found" ;;
  terminate_client*) touch "$D/terminated" ;;
  quit) kill "$(cat "$D/nvidia-cuda-mps-control.pid")"; rm -f "$D/nvidia-cuda-mps-control.pid" ;;
esac
exit 0
"#;

fn mstate(n: &EmuHost, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    n.wait_manager_state(Duration::from_secs(20), "mps.json", what, pred)
}

/// The manager (`mps.json`, a fast check) with `script` as its control program; returns the
/// pipe directory the script keeps its files in, and the manager.
fn start_with_script(n: &EmuHost, script: &str) -> (std::path::PathBuf, e2e::EmuChild) {
    let ctl = n.path("fake-mps-control");
    std::fs::write(&ctl, script).unwrap();
    std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pipe = n.path("pipe");
    std::fs::write(
        n.path("mps.json"),
        format!(
            r#"{{"control_bin": "{}", "pipe_dir": "{}", "log_dir": "{}", "command_timeout_ms": 2000,
                "period_ms": 50, "check_every_ms": 100, "evict_grace_ms": 1000,
                "compute_mode": "{}", "shm_dir": "host",
                "detect": {{ "stuck_after_ms": 0 }},
                "recovery": {{ "min_interval_ms": 0, "max_per_hour": 20 }}}}"#,
            ctl.display(),
            pipe.display(),
            n.path("mpslog").display(),
            e2e::manager_compute_mode()
        ),
    )
    .unwrap();
    let manager = n.start_manager("mps.json", "");
    (pipe, manager)
}

/// The manager against the scripted control program, an offline `sleep` registered in the
/// ledger and SIGKILLed; its server lists it from the `list_from`-th look after its death.
/// Returns the manager's first recovery, the commands the control program got, the control
/// daemon's pid file before and after, and the dead pid.
fn kill_a_registered_client(list_from: u64) -> (Value, String, String, String, u32) {
    let n = EmuHost::node();
    let (pipe, _manager) = start_with_script(&n, SCRIPT);
    mstate(&n, "daemon started", |v| v["daemon_pid"].is_u64());
    let daemon = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid")).unwrap();

    let ledger = node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let mut off = n.spawn_sh_offline("exec sleep 600");
    let pid = off.pid();
    register(&ledger, pid, 64 << 20);
    // Seen alive holding its slot's lock: only then is its dead registration a dead client.
    mstate(&n, "the client seen holding its slot's lock", |v| v["offline_seen"].as_u64() >= Some(1));
    std::fs::write(pipe.join("list_from"), list_from.to_string()).unwrap();
    off.signal(libc::SIGKILL);
    off.wait_exit(Duration::from_secs(10)).expect("killed");
    std::fs::write(pipe.join("dead"), format!("{pid}\n")).unwrap();

    let v = mstate(&n, "recovery", |v| {
        v["recoveries"].as_array().is_some_and(|r| !r.is_empty())
    });
    let commands = std::fs::read_to_string(pipe.join("commands.log")).unwrap();
    let now = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid")).unwrap_or_default();
    // SAFETY: the stand-in daemon is a `sleep` this test's script started.
    unsafe { libc::kill(daemon.trim().parse::<i32>().unwrap(), libc::SIGKILL) };
    (v["recoveries"][0].clone(), commands, daemon, now, pid)
}

/// The dead offline client appears on its server's list only at the third look after its
/// death (the manager's periodic check and the first look of the recovery both miss it).
/// The recovery must terminate it there, with no `quit`. Before the bounded retry the first
/// miss meant a full MPS reset (`quit`).
#[test]
fn a_dead_client_listed_late_is_terminated_not_reset() {
    let (r, commands, daemon, now, pid) = kill_a_registered_client(3);
    assert_eq!(r["fault"]["client_died"]["pid"], pid, "{r:#}");
    assert!(
        r["outcome"].as_str().unwrap().contains("terminate_client"),
        "{r:#}\n{commands}"
    );
    assert!(
        commands.contains(&format!("terminate_client 4242 {pid}")),
        "{commands}"
    );
    assert!(!commands.contains("quit") && !commands.contains("shutdown_server"), "no MPS reset:\n{commands}");
    assert_eq!(now, daemon, "same control daemon");
}

/// A SIGKILLed offline client its server never lists: the server dropped it when its
/// connection closed (an H200 logs "assuming client ... exit" at the moment of the kill,
/// before the manager's first look). It has left MPS; nothing hangs on it, so no `quit`.
/// Before, a registered dead client missing from every list for the whole grace meant a full
/// MPS reset, which takes the online clients' contexts with it.
#[test]
fn a_dead_client_no_server_lists_has_left_mps_and_nothing_is_reset() {
    let (r, commands, daemon, now, pid) = kill_a_registered_client(u64::from(u32::MAX));
    assert_eq!(r["fault"]["client_died"]["pid"], pid, "{r:#}");
    let outcome = r["outcome"].as_str().unwrap();
    assert!(outcome.contains("left MPS"), "{r:#}\n{commands}");
    assert!(!commands.contains("terminate_client"), "{commands}");
    assert!(!commands.contains("quit") && !commands.contains("shutdown_server"), "no MPS reset:\n{commands}");
    assert_eq!(now, daemon, "same control daemon");
}

/// A control program whose one server is a real process (a `sleep`, pid in `$PIPE/server.pid`)
/// listing itself as its client; `get_server_list` answers nothing once while `$PIPE/blank`
/// exists (as the real control daemon did on an H200: a connection accepted and closed
/// unanswered right after a `terminate_client`).
const BLANK_SCRIPT: &str = r#"#!/bin/sh
D="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then
  mkdir -p "$D"
  # The stand-in daemon, named as the real one is (mps-manager checks the name).
  printf '#!/bin/sh\nsleep 600\n' > "$D/nvidia-cuda-mps-control"; chmod +x "$D/nvidia-cuda-mps-control"
  "$D/nvidia-cuda-mps-control" </dev/null >/dev/null 2>&1 &
  echo $! > "$D/nvidia-cuda-mps-control.pid"
  sleep 600 </dev/null >/dev/null 2>&1 &
  echo $! > "$D/server.pid"
  exit 0
fi
read -r line
echo "$line" >> "$D/commands.log"
S=$(cat "$D/server.pid")
case "$line" in
  get_server_list)
    if [ -f "$D/blank" ]; then rm -f "$D/blank"; touch "$D/blanked"; else echo "$S"; fi ;;
  "get_client_list $S") echo "$S" ;;
  "get_client_list "*) echo "Server not found" ;;
  quit) kill "$(cat "$D/nvidia-cuda-mps-control.pid")"; rm -f "$D/nvidia-cuda-mps-control.pid" ;;
esac
exit 0
"#;

/// One listing without the server (whose process still runs, with a client) is a missed
/// listing, not a crashed server: no recovery, no `quit`. Before, the empty reply read as
/// "the server with clients vanished" and meant a full MPS reset, which on the H200 took the
/// online client's context with it (CUDA_ERROR_MPS_RPC_FAILURE).
#[test]
fn a_listing_that_misses_a_live_server_is_no_crash() {
    let n = EmuHost::node();
    let (pipe, _manager) = start_with_script(&n, BLANK_SCRIPT);
    mstate(&n, "the server with its client", |v| v["clients"].as_u64() >= Some(1));
    let daemon = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid")).unwrap();
    let server: i32 = std::fs::read_to_string(pipe.join("server.pid")).unwrap().trim().parse().unwrap();
    std::fs::write(pipe.join("blank"), "").unwrap();
    let t0 = std::time::Instant::now();
    while !pipe.join("blanked").exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the blank listing was never asked for");
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let v = mstate(&n, "looks after the blank listing", |v| {
        v["updated_unix_ms"].as_u64().is_some_and(|t| t > after + 300) && v["clients"].as_u64() >= Some(1)
    });
    let commands = std::fs::read_to_string(pipe.join("commands.log")).unwrap();
    assert!(
        v["recoveries"].as_array().is_none_or(|r| r.is_empty()),
        "no recovery: {v:#}"
    );
    assert!(!commands.contains("quit") && !commands.contains("shutdown_server"), "no MPS reset:\n{commands}");
    let now = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid")).unwrap_or_default();
    assert_eq!(now, daemon, "same control daemon");
    // SAFETY: both are `sleep`s this test's script started.
    unsafe {
        libc::kill(daemon.trim().parse::<i32>().unwrap(), libc::SIGKILL);
        libc::kill(server, libc::SIGKILL);
    }
}
