//! The durable side of an eviction request: each request the monitor writes into a process
//! slot is also appended to the GPU's eviction log (`node_ledger::evictlog`,
//! `<ledger_dir>/evict-log/gpu<N>.jsonl`, this monitor its only writer), so node-agent can
//! report it through the Eviction API even when the process exited before the agent's next
//! scan of the slots, or the agent was restarted.

use node_ledger::evictlog::{append, EvictRecord};
use node_ledger::Ledger;

use crate::port::{EvictReason, OfflineProc};

/// Appends the request for `p` (already written into its slot) to the log beside `ledger`'s
/// GPU directory. A failure is returned for the caller to log; the local signal path does not
/// depend on it.
pub fn record(ledger: &Ledger, p: &OfflineProc, reason: EvictReason, signal: u32) -> Result<(), String> {
    // <ledger_dir>/gpu<N>/ledger
    let dir = ledger
        .path()
        .parent()
        .and_then(|g| g.parent())
        .ok_or_else(|| format!("ledger path {} has no ledger directory", ledger.path().display()))?;
    let slot = ledger
        .procs()
        .into_iter()
        .find(|s| s.slot == p.slot && s.pid == p.pid && s.start_time == p.start_time);
    let Some(slot) = slot else {
        return Err(format!("pid {} left slot {} before it was logged", p.pid, p.slot));
    };
    let rec = EvictRecord {
        gpu: ledger.gpu_index(),
        pid: p.pid,
        start_time: p.start_time,
        pid_ns: slot.pid_ns,
        group_id: slot.group_id,
        signal,
        reason: reason.as_str().to_string(),
        unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    };
    append(dir, &rec).map_err(|e| format!("appending to the eviction log in {}: {e}", dir.display()))
}
