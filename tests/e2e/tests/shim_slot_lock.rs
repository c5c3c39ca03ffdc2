//! An offline process whose application closes the shim's slot-lock descriptor (a dup2 over
//! it, a close by number) keeps its memory counted in its group.
//! The lock is how every reclaimer tells a live registration from a dead one, so its slot is
//! reclaimed and its bytes given back at once; before, the shim then stopped counting
//! ("this process's trouble") and the rest of the group could take the whole quota again
//! beside the memory it still held. Now it registers again and counts what it holds.
//!
//! The processes run as uid/gid 65534 (`nobody`), as offline containers do; the test needs root
//! to switch to it and says so (and passes vacuously) when run unprivileged.

mod shim_support;

use e2e::{lacks_root, T};
use shim_support::*;

const QUOTA: u64 = 64 * MIB;


#[test]
fn memory_held_after_the_application_closes_the_ledger_stays_counted() {
    if lacks_root("run offline processes as uid 65534") {
        return;
    }
    let host = host_for_users();
    let l = ledger(&host);
    let held = (40 * MIB).to_string();
    let mut a = host.spawn(
        as_nobody(&mut limited(&host, "shim_client", QUOTA, "ctr"))
            .args(["ctx", "alloc", &held, "closeledgerlocks", "ready", "wait"]),
    );
    assert!(a.wait_for_line("ready", T).is_some(), "{}", a.stderr());
    assert_eq!(a.lines("alloc=")[0], format!("alloc=0 bytes={held}"), "{}", a.stderr());
    let closed = a.lines("closeledgerlocks=");
    assert!(closed.first().is_some_and(|c| c != "closeledgerlocks=0"), "no ledger fd closed: {closed:?}");
    let g = group_of(&l, "ctr");
    // Its old slot reclaimed (the lock is gone: its own controller's reclaim pass, or any
    // other's), its memory counted again in a new registration (the controller looks every
    // 250 ms).
    let pid = a.pid();
    e2e::wait_until("the process registered again with its 40 MiB", T, || {
        let _ = l.reclaim_dead();
        let again = a.stderr().contains("registered again");
        let counted = l.procs().iter().any(|p| p.pid == pid && p.mem_bytes == 40 * MIB);
        (again && counted && l.group_used(g) == 40 * MIB).then_some(())
    });
    // Another process of the container finds those 40 MiB held: 30 more do not fit in 64.
    let b = run(
        &host,
        as_nobody(&mut limited(&host, "shim_client", QUOTA, "ctr")).args(["ctx", "alloc", &(30 * MIB).to_string()]),
    );
    assert_eq!(rc_of(&b, "alloc="), ["2"], "the group lost the first process's bytes: {b:?}\n{}", a.stderr());
    a.send_line("go");
    a.finish(T);
    e2e::wait_until("the group empty once the process left", T, || (l.group_used(g) == 0).then_some(()));
}
