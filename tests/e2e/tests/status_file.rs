//! The daemons' status file (`<ledger_dir>/status/gpu<N>`, `node_ledger::status`): the monitor
//! publishes there and nowhere in the ledger, keeps publishing through a damaged or deleted
//! file, and a tenant that is root in its container cannot write it through the mounts
//! node-agent gives containers.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use e2e::{monitor_state as state, wait_until, EmuHost};
use node_ledger::{HealthState, Status};

const T: Duration = Duration::from_secs(20);

const MONITOR: &str = r#"{ "interval_ms": 10, "state_file_every_ms": 10, "host_memory": { "enabled": false } }"#;

/// The status file at `path` once it holds a fresh publish by `pid`.
fn fresh_from(path: &std::path::Path, pid: u32) -> Option<Status> {
    let s = Status::open(path).ok()?;
    let m = s.read_monitor()?;
    (m.monitor_pid == pid && m.is_fresh(node_ledger::clock::now_ns(), 500_000_000)).then_some(s)
}

/// Before, the monitor published into the ledger, which every offline process may write: a
/// tenant could set every neighbour's throttle input and the health node-agent admits by. Now
/// the monitor's verdict is in the status file (0644, a directory of its own) and the ledger's
/// old blocks stay zero. A status file whose header is overwritten is rewritten in place (the
/// same inode: the mappings of readers and containers' mounts stay valid); a deleted one is
/// made again; both within about a second, by the running monitor.
#[test]
fn the_monitor_publishes_only_in_its_status_file_and_keeps_it_through_damage_and_deletion() {
    let n = EmuHost::node();
    let mon = n.start_monitor("mon.json", MONITOR);
    n.wait_state(T, "healthy", |v| state(v) == "healthy");
    let path = n.status_path();
    let s = wait_until("a fresh publish in the status file", T, || fresh_from(&path, mon.pid()));
    assert_eq!(s.health(), HealthState::Healthy);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o644, "readable by every offline user, written by its owner only");
    assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o7777, 0o755);
    let ledger = std::fs::read(n.ledger_path()).unwrap();
    let r = node_ledger::layout::retired_range();
    assert!(ledger[r.start as usize..r.end as usize].iter().all(|&b| b == 0), "nothing published in the ledger");

    // A damaged header: readers see nothing published, then the monitor's rewrite in place.
    std::os::unix::fs::FileExt::write_all_at(&std::fs::OpenOptions::new().write(true).open(&path).unwrap(), &[0xee; 8], 0).unwrap();
    assert!(s.read_monitor().is_none_or(|m| m.monitor_pid == mon.pid()), "a damaged header reads as nothing, or is already rewritten");
    wait_until("the damaged status file rewritten and published again", T, || fresh_from(&path, mon.pid()));
    assert_eq!(std::fs::metadata(&path).unwrap().ino(), meta.ino(), "rewritten in place");
    assert!(s.read_monitor().is_some_and(|m| m.monitor_pid == mon.pid()), "an old reader's mapping sees the new publishes");

    // Deleted: made again.
    std::fs::remove_file(&path).unwrap();
    wait_until("the deleted status file made again and published", T, || fresh_from(&path, mon.pid()));
    let log = n.log("mon.json");
    assert!(log.contains("status file reopened"), "{log}");
}

/// The mounts node-agent's Allocate gives an offline container, made as a container runtime
/// makes them (bind mounts in a mount namespace of its own, the read-only ones remounted
/// read-only), with the container paths equal to the host paths. In there a root tenant can
/// write its GPU's ledger (it registers there) but cannot write, truncate, replace or delete a
/// status file; outside, the published values are intact. Needs root (mount namespaces).
#[test]
fn a_root_tenant_cannot_write_the_status_files_through_the_mounts_node_agent_gives() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (mount namespaces)");
        return;
    }
    let n = EmuHost::node();
    let writer = n.status_writer();
    node_ledger::Ledger::open_or_create(&n.ledger_path(), 0).unwrap();
    let sample = node_ledger::MonitorSample { sm_active_permille: 500, ..Default::default() }.with_health(HealthState::Overlimit);
    writer.publish(&sample);
    let mut cfg = node_agent::config::AgentConfig { ledger_dir: n.ledger_dir().to_path_buf(), ..Default::default() };
    cfg.inject.ledger_container_dir = n.ledger_dir().to_path_buf();
    let (_env, mounts) = node_agent::allocate::static_edits(&cfg, 0);
    // Containers see the ledger directory's mounts only (the shim's and /dev/shm are not
    // under it).
    assert!(mounts.iter().any(|m| m.read_only && m.container_path.starts_with(&*n.ledger_dir().to_string_lossy())), "a read-only mount for the status files: {mounts:?}");
    let mut script = e2e::allocate_mounts_script(mounts.iter().map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.read_only)), n.ledger_dir());
    let status = n.status_path().to_string_lossy().to_string();
    let ledger = n.ledger_path().to_string_lossy().to_string();
    script += &format!(
        "test -w '{ledger}' && [ -w \"$(dirname '{ledger}')\" ]; echo ledger_writable=$?\n\
         printf XXXXXXXX | dd of='{status}' conv=notrunc 2>/dev/null; echo write=$?\n\
         truncate -s 0 '{status}' 2>/dev/null; echo truncate=$?\n\
         rm -f '{status}' 2>/dev/null; echo delete=$?\n\
         echo x > '{status}.new' 2>/dev/null && mv '{status}.new' '{status}' 2>/dev/null; echo replace=$?\n\
         cat '{status}' > /dev/null; echo read=$?\n"
    );
    let out = std::process::Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let rc = |k: &str| text.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap_or("?").to_string();
    assert_eq!(rc("ledger_writable"), "0", "the ledger stays the tenant's to register in: {text}");
    assert_eq!(rc("read"), "0", "{text}");
    for k in ["write", "truncate", "delete", "replace"] {
        assert_ne!(rc(k), "0", "{k}: {text}");
    }
    let s = Status::open(&n.status_path()).unwrap();
    assert_eq!(s.read_monitor().unwrap().sample, sample, "the published values are intact");
}

/// Offline containers get the `gpu<N>` directory read-write. The monitor's single-instance lock
/// and the operator's `disabled` and `enable` files were there: a tenant could hold the lock
/// (a restarted monitor refused to start: the GPU unmonitored), disable the GPU for every
/// other tenant, or put a GPU an XID disabled back in service. They are in the daemon-only
/// directory now (`<ledger_dir>/daemons/gpu<N>`, never mounted into containers): the same
/// files written and locked in `gpu<N>` change nothing.
#[test]
fn files_a_tenant_writes_or_locks_in_its_gpu_directory_neither_disable_the_gpu_nor_stop_a_restart() {
    let n = EmuHost::node();
    let mut mon = n.start_monitor("mon.json", MONITOR);
    n.wait_state(T, "healthy", |v| state(v) == "healthy");
    let gdir = n.ledger_path().parent().unwrap().to_path_buf();
    std::fs::write(gdir.join("disabled"), "a tenant\n").unwrap();
    let _locks: Vec<_> = ["sysmonitor.lock", "mps-manager.lock"]
        .iter()
        .map(|f| node_daemon::instance::lock(&gdir.join(f), "a tenant").unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let v = n.wait_state(T, "a fresh state", |_| true);
    assert_eq!(state(&v), "healthy", "a tenant's disable file is nobody's request: {v:#}");
    mon.signal(libc::SIGTERM);
    assert!(mon.wait_exit(T).is_some(), "the monitor stopped");
    let restarted = n.start_monitor("mon.json", "");
    wait_until("the restarted monitor publishing", T, || fresh_from(&n.status_path(), restarted.pid()));
    let v = n.wait_state(T, "healthy after the restart", |v| state(v) == "healthy" && v["monitor_pid"].as_u64() == Some(u64::from(restarted.pid())));
    assert_eq!(state(&v), "healthy");
}
