//! The monitor's reclaim scan follows the close of a registered process's ledger description
//! (the inotify watch, `IN_CLOSE_WRITE`): quiet ticks do not pass over the registry, and a dead
//! process's quota is back at the next tick rather than at the fallback period. Its own test
//! binary: the watch's signal counter is process-wide, and other tests' ledgers would add
//! changes of their own.

use node_ledger::Ledger;
use sysmonitor::ledger::{LedgerAdapter, RECLAIM_FALLBACK_MS};
use sysmonitor::port::LedgerPort;

#[test]
fn a_dead_process_is_reclaimed_on_its_close_and_quiet_ticks_do_not_scan() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("gpu0/ledger");
    let mut a = LedgerAdapter::new(Ledger::open_or_create(&path, 0).unwrap(), node_ledger::config::status_path(d.path(), 0));
    let g = a.ledger.group(7, 1 << 30).unwrap();
    // An offline "process": its own open ledger, its slot lock on its own description.
    let p = Ledger::open_existing(&path).unwrap();
    let h = p.register(std::process::id(), g).unwrap();
    p.try_reserve(h, 100).unwrap();
    a.reclaim(0); // the first scan runs at once
    // Let a change reported for the setup arrive and be acted on.
    std::thread::sleep(std::time::Duration::from_millis(50));
    a.reclaim(10);
    a.reclaim(20);
    let before = a.reclaim_scans();
    for t in (30..RECLAIM_FALLBACK_MS / 2).step_by(10) {
        a.reclaim(t);
    }
    assert_eq!(a.reclaim_scans(), before, "quiet ticks pass over the registry");
    assert_eq!(a.ledger.group_used(g), 100, "a live process keeps its quota");
    drop(p); // the process "dies": its descriptions close, its slot lock goes
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let t = RECLAIM_FALLBACK_MS / 2;
    loop {
        a.reclaim(t);
        if a.ledger.group_used(g) == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "the closed registration's quota is not back before the fallback scan"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(a.reclaim_scans() - before <= 2, "one close, at most two scans");
}
