//! Robustness end to end: a bad config file (fails closed), a corrupt ledger, fork, and monitor-requested
//! eviction never crash the host process and keep the limits in force.

mod shim_support;

use std::time::{Duration, Instant};

use e2e::EmuHost;
use shim_support::*;

#[test]
fn bad_config_is_one_clear_line_and_fails_closed() {
    let host = EmuHost::new();
    let cfg = host.root().join("xcuda.json");
    std::fs::write(&cfg, "{\n  \"memory\": {\n    \"quota_fraction\": \"most\"\n  }\n}\n").unwrap();
    let total = host.device().info().total_memory;
    let mut c = limited(&host, "shim_client", 0, "cfg");
    c.env_remove("XCUDA_QUOTA_BYTES").env("XCUDA_CONFIG", &cfg).args(["ctx", "totalmem"]);
    let mut child = host.spawn(&mut c);
    let out = child.finish(T);
    let err = child.stderr();
    let lines: Vec<_> = err.lines().filter(|l| l.contains("config error")).collect();
    assert_eq!(lines.len(), 1, "one error line: {err}");
    assert!(lines[0].contains(&format!("{}:3:", cfg.display())), "file and line: {}", lines[0]);
    assert!(lines[0].contains("memory.quota_fraction"), "field: {}", lines[0]);
    let t = e2e::num(out.lines().find(|l| l.starts_with("totalmem=0")).expect(&out), "total") as u64;
    assert!(total > 0);
    assert_eq!(t, 0, "fails closed: no quota at all, never the 40% default");
}

#[test]
fn corrupt_ledger_is_named_and_the_process_fails_closed() {
    let host = EmuHost::new();
    let path = node_ledger::config::ledger_path(&ledger_dir(&host), 0);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let junk = vec![0x5a_u8; 4096];
    std::fs::write(&path, &junk).unwrap();
    let mut c = limited(&host, "shim_client", 32 * MIB, "corrupt");
    c.args(["ctx", "alloc", &(24 * MIB).to_string(), "alloc", &(24 * MIB).to_string()]);
    let mut child = host.spawn(&mut c);
    let out = child.finish(T);
    let err = child.stderr();
    assert!(err.contains(&path.display().to_string()) && err.contains("total_size"), "names file and field: {err}");
    assert!(!err.contains('\x1b'), "stderr is a file: plain text, no colour codes: {err:?}");
    // Without its group's ledger the process cannot know what its container holds: refused,
    // never a per-process copy of the quota (issue 8, observation 3).
    assert_eq!(rc_of(&out.lines().map(str::to_string).collect::<Vec<_>>(), "alloc="), ["2", "2"], "fails closed: {out}");
    assert_eq!(std::fs::read(&path).unwrap(), junk, "the corrupt file is left alone");
}

#[test]
fn fork_child_keeps_normal_signal_behaviour_and_parent_accounting() {
    let host = EmuHost::new();
    let mut c = limited(&host, "shim_client", 64 * MIB, "fork");
    c.args(["ctx", "alloc", &(16 * MIB).to_string(), "fork", "ready", "hang"]);
    let mut parent = host.spawn(&mut c);
    parent.wait_for_line("ready", T).expect("parent ready");
    let child_line = parent.wait_for_line("child pid=", T).expect("child started");
    let child = e2e::num(&child_line, "pid") as i32;
    // SAFETY: plain kill(2) of the forked child.
    unsafe { libc::kill(child, libc::SIGTERM) };
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{child}")).exists() && start.elapsed() < T {
        // The child is the parent's, not ours: it becomes a zombie until the parent reaps it.
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        if stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(start.elapsed() < T, "the fork child must die of SIGTERM like any process");
    let l = ledger(&host);
    let g = l.find_group(node_ledger::ledger::group_id_for("fork")).unwrap();
    assert_eq!(l.group_used(g), 16 * MIB, "the parent's reservation is untouched by the child");
    parent.kill9();
}

#[test]
fn monitor_eviction_request_makes_the_process_leave_gracefully() {
    let host = EmuHost::new();
    let dev = host.device();
    host.start_mps();
    let mut victim = host.spawn(limited(&host, "shim_client", 64 * MIB, "evict").args(["ctx", "alloc", &(16 * MIB).to_string(), "ready", "hang"]));
    victim.wait_for_line("ready", T).expect("ready");
    let l = ledger(&host);
    let p = l.procs().into_iter().find(|p| p.pid == victim.pid()).expect("registered");
    // As the monitor asks: in its table of the status file, addressed to the process.
    assert!(host.status_writer().request_evict(node_ledger::Requester::Monitor, node_ledger::ProcId::of(&p), None, libc::SIGTERM as u32));
    let st = victim.wait_timeout(T).expect("evicted by the monitor's request");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGTERM));
    assert!(!dev.mps_status().poisoned, "left without poisoning MPS");
    let g = l.find_group(node_ledger::ledger::group_id_for("evict")).unwrap();
    assert_eq!(l.group_used(g), 0);
}
