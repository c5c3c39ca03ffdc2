//! Observation 2: non-root offline processes must share their group's quota through the ledger,
//! and one that cannot open the ledger must be refused, never handed the whole quota.

mod shim_support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;

use e2e::EmuHost;
use shim_support::*;

const NOBODY: u32 = 65534;

fn open_to_all(p: &std::path::Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

fn host_for_nobody() -> EmuHost {
    let host = EmuHost::new();
    let _ = host.device().snapshot();
    open_to_all(host.root(), 0o777);
    for e in std::fs::read_dir(host.root()).unwrap().flatten() {
        let mode = if e.path().is_dir() { 0o777 } else { 0o666 };
        open_to_all(&e.path(), mode);
    }
    host
}

#[test]
fn nonroot_processes_share_the_group_quota_and_are_refused_without_the_ledger() {
    let host = host_for_nobody();
    // The monitor's unit runs with UMask=0022.
    // SAFETY: umask only changes this process's file-creation mask.
    let old = unsafe { libc::umask(0o022) };
    let l = ledger(&host);
    // SAFETY: restores the previous mask.
    unsafe { libc::umask(old) };
    open_to_all(&ledger_dir(&host), 0o755);

    let quota = 64 * MIB;
    let nobody = |steps: &[&str]| {
        let mut c = limited(&host, "shim_client", quota, "nonroot");
        c.uid(NOBODY).gid(NOBODY).args(steps);
        host.spawn(&mut c)
    };
    let mut a = nobody(&["ctx", "alloc", &(40 * MIB).to_string(), "ready", "wait"]);
    assert!(a.wait_for_line("ready", T).is_some(), "first: {}\n{}", a.stdout(), a.stderr());
    let mut b = nobody(&["ctx", "alloc", &(40 * MIB).to_string(), "ready", "wait"]);
    assert!(b.wait_for_line("ready", T).is_some(), "second: {}\n{}", b.stdout(), b.stderr());
    let rcs: Vec<String> = [&a, &b].iter().flat_map(|c| c.lines("alloc=")).collect();
    let ok = rcs.iter().filter(|l| e2e::field(l, "alloc") == Some("0")).count();
    assert_eq!(ok, 1, "two 40 MiB allocations against a 64 MiB group quota: exactly one fits: {rcs:?}\n{}\n{}", a.stderr(), b.stderr());
    let g = l.group(node_ledger::ledger::group_id_for("nonroot"), 1).unwrap();
    assert!(l.group_used(g) <= quota);
    a.send_line("");
    b.send_line("");
    a.finish(T);
    b.finish(T);

    // A non-root process that cannot open the ledger is refused, and says why.
    open_to_all(&node_ledger::config::ledger_path(&ledger_dir(&host), 0), 0o600);
    let mut c = nobody(&["ctx", "alloc", &MIB.to_string(), "exit"]);
    let out = c.finish(T);
    let rc: Vec<String> = out.lines().filter(|l| l.starts_with("alloc=")).map(str::to_string).collect();
    assert_eq!(rc.len(), 1, "{out}\n{}", c.stderr());
    assert_eq!(e2e::field(&rc[0], "alloc"), Some("2"), "no ledger => CUDA_ERROR_OUT_OF_MEMORY: {out}\n{}", c.stderr());
    let err = c.stderr();
    assert!(err.contains("ledger") && err.contains("fail closed"), "one clear error naming the ledger: {err}");
}
