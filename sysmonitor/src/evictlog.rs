//! The durable side of an eviction request: each request the monitor writes into a process
//! slot is also appended to the GPU's eviction log (`node_ledger::evictlog`,
//! `<ledger_dir>/evict-log/gpu<N>.jsonl`, this monitor its only writer), so node-agent can
//! report it through the Eviction API even when the process exited before the agent's next
//! scan of the slots, or the agent was restarted. The log is rotated by size
//! (`evict_log.max_bytes`, `evict_log.keep` in the config; see [`configure`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use node_ledger::evictlog::{append_with, EvictRecord, Rotation, DEFAULT_KEEP, DEFAULT_MAX_BYTES};
use node_ledger::Ledger;

use crate::port::{EvictReason, OfflineProc};

static MAX_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_MAX_BYTES);
static KEEP: AtomicU32 = AtomicU32::new(DEFAULT_KEEP);

/// Sets the rotation every later [`record`] uses (from the validated config, at start and on
/// reload).
pub fn configure(rot: &Rotation) {
    MAX_BYTES.store(rot.max_bytes, Ordering::Relaxed);
    KEEP.store(rot.keep, Ordering::Relaxed);
}

/// The rotation in force.
pub fn rotation() -> Rotation {
    Rotation {
        max_bytes: MAX_BYTES.load(Ordering::Relaxed),
        keep: KEEP.load(Ordering::Relaxed),
    }
}

/// `<ledger_dir>` of the ledger at `path` (`<ledger_dir>/gpu<N>/ledger`).
fn ledger_dir(path: &std::path::Path) -> Result<&std::path::Path, String> {
    path.parent()
        .and_then(|g| g.parent())
        .ok_or_else(|| format!("ledger path {} has no ledger directory", path.display()))
}

/// Appends the request for `p` (already written into the status file), registered in `ledger`
/// (the GPU's or a pod's), to the log beside the GPU's directory (of its own ledger at
/// `gpu_ledger_path`), naming `pod`, the pod its cgroup path names (node-agent evicts it
/// rather than the one the slot's group claims). A failure is returned for the caller to log;
/// the local signal path does not depend on it.
pub fn record(
    gpu_ledger_path: &std::path::Path,
    ledger: &Ledger,
    p: &OfflineProc,
    reason: EvictReason,
    signal: u32,
    pod: Option<node_ledger::PodUid>,
) -> Result<(), String> {
    let dir = ledger_dir(gpu_ledger_path)?;
    let slot = ledger
        .procs()
        .into_iter()
        .find(|s| s.slot == p.slot && s.pid == p.pid && s.start_time == p.start_time);
    let Some(slot) = slot else {
        return Err(format!(
            "pid {} left slot {} before it was logged",
            p.pid, p.slot
        ));
    };
    let rec = EvictRecord {
        gpu: ledger.gpu_index(),
        pid: p.pid,
        start_time: p.start_time,
        pid_ns: slot.pid_ns,
        group_id: slot.group_id,
        signal,
        reason: reason.as_str().to_string(),
        unix_ms: node_daemon::clock::unix_ms(),
        pod_uid: pod.map(|u| u.to_string()),
    };
    append_with(dir, &rec, &rotation())
        .map_err(|e| format!("appending to the eviction log in {}: {e}", dir.display()))
}

/// Appends the eviction of `p`, a GPU process running offline work without the shim (no slot,
/// no ledger group: its host pid in this monitor's pid namespace), to GPU `gpu`'s log beside
/// the ledger at `ledger_path`, naming the pod its cgroup names (`pod_uid`), by which
/// node-agent finds the pod to evict through the API.
pub fn record_unshimmed(
    ledger_path: &std::path::Path,
    gpu: u32,
    p: &OfflineProc,
    reason: EvictReason,
    signal: u32,
    pod_uid: Option<&str>,
) -> Result<(), String> {
    let dir = ledger_dir(ledger_path)?;
    let rec = EvictRecord {
        gpu,
        pid: p.pid,
        start_time: p.start_time,
        pid_ns: p.pid_ns,
        group_id: 0,
        signal,
        reason: reason.as_str().to_string(),
        unix_ms: node_daemon::clock::unix_ms(),
        pod_uid: pod_uid.map(str::to_string),
    };
    append_with(dir, &rec, &rotation())
        .map_err(|e| format!("appending to the eviction log in {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use node_ledger::evictlog::{generation_path, log_path, read_from, rotated_generations};

    /// The writer rotates with the configured bound, and every request is still read back.
    #[test]
    fn records_rotate_with_the_configured_bound() {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&node_ledger::config::ledger_path(d.path(), 2), 2).unwrap();
        let g = l.group(7, 1 << 30).unwrap();
        let h = l.register(std::process::id(), g).unwrap();
        let snap = l.procs().into_iter().find(|s| s.slot == h.slot).unwrap();
        let p = OfflineProc {
            slot: h.slot,
            pod_ledger: None,
            pid: snap.pid,
            pid_ns: snap.pid_ns,
            host_pid: Some(snap.pid),
            start_time: snap.start_time,
            reported_bytes: 0,
            group_id: 0,
            evict_requested_ms: None,
            evict_by_manager: false,
        };
        configure(&Rotation {
            max_bytes: 500,
            keep: 100,
        });
        for _ in 0..20 {
            record(l.path(), &l, &p, EvictReason::Overlimit, 15, None).unwrap();
        }
        configure(&Rotation::default());
        let gens = rotated_generations(d.path(), 2).unwrap();
        assert!(gens.len() >= 5, "{gens:?}");
        for f in gens
            .iter()
            .map(|&g| generation_path(d.path(), 2, g))
            .chain([log_path(d.path(), 2)])
        {
            assert!(
                std::fs::metadata(&f).unwrap().len() <= 500,
                "{}",
                f.display()
            );
        }
        let b = read_from(d.path(), 2, None, 1 << 20).unwrap();
        assert_eq!(b.entries.len(), 20);
        assert!(b
            .entries
            .iter()
            .all(|e| e.record.as_ref().unwrap().group_id == 7));
    }
}
