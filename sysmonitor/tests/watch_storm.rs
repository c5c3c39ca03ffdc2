//! A writer that touches a watched ledger in a loop (the GPU's ledger is open to every offline
//! process, a pod's to its tenant) raises at most one `SIGIO` per look of the monitor, and at
//! most one reclaim scan per tick, however many inotify events it makes. Before, every queued
//! event sent a `SIGIO` that woke the daemon's sleep: a loop of `futimens` and `pwrite` took a
//! monitor from 0.6 % to 48 % of a core. Its own test binary: the signal counter is
//! process-wide. Counts only, no timing.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use node_ledger::Ledger;
use sysmonitor::filewatch;
use sysmonitor::ledger::LedgerAdapter;
use sysmonitor::port::LedgerPort;

#[test]
fn a_writer_in_a_loop_costs_one_signal_per_look_not_one_per_event() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("gpu0/ledger");
    let mut a = LedgerAdapter::new(
        Ledger::open_or_create(&path, 0).unwrap(),
        node_ledger::config::status_path(d.path(), 0),
    );
    a.reclaim(0);
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (path, done) = (path.clone(), done.clone());
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            // Alternating events, which the kernel does not merge into one queued event.
            for _ in 0..20_000 {
                // SAFETY: futimens(2) on our own descriptor; null times mean now.
                unsafe { libc::futimens(f.as_raw_fd(), std::ptr::null()) };
                // The first byte of the header, written with what it holds.
                let mut b = [0u8; 1];
                f.read_at(&mut b, 0).unwrap();
                f.write_at(&b, 0).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let (signals, scans) = (filewatch::signals(), a.reclaim_scans());
    let mut looks = 0u64;
    let mut t = 10;
    while !done.load(Ordering::SeqCst) {
        a.reclaim(t);
        looks += 1;
        t += 10;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    writer.join().unwrap();
    // The events the writer left queued are read over the next looks.
    for _ in 0..3 {
        a.reclaim(t);
        looks += 1;
        t += 10;
    }
    let (signals, scans) = (filewatch::signals() - signals, a.reclaim_scans() - scans);
    eprintln!("{signals} SIGIOs, {scans} scans, {looks} looks");
    assert!(
        signals <= looks + 1,
        "{signals} SIGIOs for {looks} looks (40,000 events)"
    );
    assert!(scans <= looks, "{scans} reclaim scans for {looks} ticks");
}
