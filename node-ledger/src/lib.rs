//! What the node runtime shares between processes: config schema, the per-GPU ledger layout, the health-state enum.
//!
//! A ledger is a fixed-layout file, mapped `MAP_SHARED` by the shim (in every offline process), the
//! monitor and the MPS manager; every offline process writes the one it registers in: its pod's
//! own ledger of the GPU under Kubernetes ([`pods`]), else the GPU's. What the daemons
//! publish (health, sample, SM budget) is in a status file per GPU that only they write
//! ([`status`]). Every field is an atomic, so a hostile or torn file
//! can only yield odd values, never undefined behaviour; the header is validated on open.

pub mod claims;
pub mod clock;
pub mod config;
pub mod evictlog;
pub mod health;
pub mod jobs;
pub mod layout;
pub mod ledger;
pub mod manager;
pub mod monitor;
pub mod pods;
pub mod procinfo;
pub mod sample;
pub mod sigbus;
pub mod status;
pub mod termination;

/// Unit tests that spawn a child take this lock around the spawn; the proptests that watch slot
/// locks hold it for their whole run. Between fork and exec a child holds duplicates of every
/// fd of the test process, and with them every OFD slot lock, so a concurrently "dead" test
/// registration would look alive for that instant (in production a forked worker keeps its
/// parent's slot alive the same way: usage stays counted, the safe direction).
#[cfg(test)]
pub(crate) static SPAWN_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `open` `tries` times while another thread keeps truncating the file at `path` to 100
/// bytes and growing it back to `full` (a tenant racing a daemon's open of a file it can
/// write); returns the panic message of the first `open` that panicked, if any. An open may
/// fail, never panic.
#[cfg(test)]
pub(crate) fn panic_opening_while_shrinking(path: &std::path::Path, full: u64, tries: usize, open: impl Fn()) -> Option<String> {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (f, stop) = (std::fs::OpenOptions::new().write(true).open(path).unwrap(), &stop);
        s.spawn(move || {
            while !stop.load(Relaxed) {
                f.set_len(100).unwrap();
                f.set_len(full).unwrap();
            }
        });
        let panicked = (0..tries).find_map(|_| std::panic::catch_unwind(std::panic::AssertUnwindSafe(&open)).err());
        stop.store(true, Relaxed);
        panicked.map(|p| p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default())
    })
}

pub use config::{ConfigError, LedgerConfig};
pub use health::HealthState;
pub use jobs::OfflineJob;
pub use ledger::{Ledger, LedgerError, LedgerFile, ProcHandle, ProcSnapshot, ReserveError};
pub use manager::ManagerSnapshot;
pub use monitor::{JobsSnapshot, MonitorSample, MonitorSnapshot, ThrottleFloor};
pub use sample::{GpuSample, SmSource};
pub use status::{EvictRefused, EvictRequest, MANAGER_MAX_EVICT_GRACE_MS, MIN_EVICT_GRACE_MS, PodUid, ProcId, Requester, Status, StatusReader, StatusWriter};
