//! Offline processes run as arbitrary non-root users (issue 8, observation 2): the ledger the
//! monitor creates under `UMask=0022` must still be theirs to use, and a process that cannot
//! use it is refused device memory instead of taking the whole quota for itself.
//!
//! The offline processes here run as uid/gid 65534 (`nobody`); the test needs root to switch
//! to it and says so (and passes vacuously) when run unprivileged.

mod shim_support;

use e2e::lacks_root;
use shim_support::*;

const QUOTA: u64 = 64 * MIB;


#[test]
fn non_root_processes_of_one_container_share_the_monitors_ledger() {
    if lacks_root("run offline processes as uid 65534") {
        return;
    }
    let host = host_for_users();
    // The ledger as the monitor creates it: a root service with systemd's UMask=0022.
    // SAFETY: umask(2) only changes this test process's file-creation mask (this test binary
    // holds this one test).
    unsafe { libc::umask(0o022) };
    let l = ledger(&host);
    let (mode, _) = l.access().unwrap();
    assert_eq!(
        mode & 0o006,
        0o006,
        "mode {mode:o}: other users cannot read and write the ledger"
    );

    let big = (QUOTA * 3 / 4).to_string();
    let mut a = host.spawn(
        as_nobody(&mut limited(&host, "shim_client", QUOTA, "ctr"))
            .args(["ctx", "alloc", &big, "ready", "wait"]),
    );
    assert!(a.wait_for_line("ready", T).is_some(), "{}", a.stderr());
    assert_eq!(
        a.lines("alloc=")[0],
        format!("alloc=0 bytes={big}"),
        "{}",
        a.stderr()
    );
    let b = run(
        &host,
        as_nobody(&mut limited(&host, "shim_client", QUOTA, "ctr")).args(["ctx", "alloc", &big]),
    );
    assert_eq!(
        rc_of(&b, "alloc="),
        ["2"],
        "the second non-root process must see the first one's bytes: {b:?}"
    );
    let g = group_of(&l, "ctr");
    assert_eq!(
        l.group_used(g),
        QUOTA * 3 / 4,
        "the monitor sees what the non-root process holds"
    );
    a.send_line("go");
    a.finish(T);
}

#[test]
fn a_process_that_cannot_open_the_ledger_is_refused_not_given_the_quota() {
    if lacks_root("run offline processes as uid 65534") {
        return;
    }
    let host = host_for_users();
    let l = ledger(&host);
    l.set_access(0o600, None).unwrap(); // an operator's mistake: only root can open it
    let lines = run(
        &host,
        as_nobody(&mut limited(&host, "shim_client", QUOTA, "ctr")).args([
            "ctx",
            "alloc",
            &MIB.to_string(),
        ]),
    );
    assert_eq!(rc_of(&lines, "alloc="), ["2"], "fail closed: {lines:?}");
}
