//! What the monitor needs from the per-GPU ledger, as a trait so the daemon logic can be
//! tested without shared memory; `ledger.rs` implements it over `node-ledger`.

pub use node_daemon::evictor::{EvictReason, OfflineProc};

use crate::health::State;
use crate::sampler::SmSource;

/// What the monitor publishes each sample.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Published {
    /// Health state to publish (`None`: nothing decided yet, published as Init).
    pub state: Option<State>,
    /// GPU utilization, percent.
    pub gpu_util: f64,
    /// SM activity, percent.
    pub sm_activity: f64,
    /// Source of `sm_activity`.
    pub sm_source: Option<SmSource>,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// Highest SM clock, MHz.
    pub sm_clock_max_mhz: u32,
    /// Device memory in use, bytes.
    pub mem_used: u64,
    /// Device memory in total, bytes.
    pub mem_total: u64,
    /// Monotonic ms of the sample.
    pub t_ms: u64,
    /// The operator's floor for the offline throttles (`offline_throttle`).
    pub throttle_floor: node_ledger::ThrottleFloor,
}

/// The monitor's view of the ledger.
pub trait LedgerPort {
    /// Offline processes currently registered, at monotonic ms `now_ms` (the time a pending
    /// eviction request is taken to date from when the ledger does not keep it).
    fn offline(&mut self, now_ms: u64) -> Result<Vec<OfflineProc>, String>;
    /// Records that `p` is being evicted (so a restarted monitor does not signal it again).
    fn mark_evicting(
        &mut self,
        p: &OfflineProc,
        reason: EvictReason,
        now_ms: u64,
    ) -> Result<(), String>;
    /// Records the eviction of `p`, a GPU process running offline work without the shim (no
    /// slot: `p.slot` is `NO_SLOT`), for node-agent, with the pod its cgroup names if any.
    fn record_unshimmed(
        &mut self,
        _p: &OfflineProc,
        _reason: EvictReason,
        _pod_uid: Option<&str>,
    ) -> Result<(), String> {
        Ok(())
    }
    /// Publishes state and measurements for the shim and the MPS manager.
    fn publish(&mut self, p: &Published) -> Result<(), String>;
    /// Gives back the quota of registered processes that have died, in any pid namespace
    /// (called every tick with its monotonic ms; the ledger adapter scans when its watch
    /// reports a close of the file, and on its own only every `RECLAIM_EVERY_MS` or
    /// `RECLAIM_FALLBACK_MS`, see `ledger::RECLAIM_EVERY_MS`).
    fn reclaim(&mut self, _now_ms: u64) {}
    /// The SM share, percent, the offline side is held to: the sum of the registered offline
    /// jobs' MPS percentages, at most the budget the MPS manager published if published
    /// recently ([`BUDGET_FRESH_MS`]). `None` (stale, never published, unreadable, a job not
    /// capped by MPS): no cap is known and the whole SM activity counts as online.
    fn offline_sm_cap_pct(&mut self) -> Option<f64> {
        None
    }
}

/// How recent the MPS manager's budget must be for the monitor to rely on it (the manager
/// publishes it every budget tick, about every second).
pub const BUDGET_FRESH_MS: u64 = 2_000;

/// In-memory ledger for unit tests and dry runs.
#[derive(Debug, Default)]
pub struct MemLedger {
    /// Registered offline processes.
    pub procs: Vec<OfflineProc>,
    /// Everything published, in order.
    pub published: Vec<Published>,
    /// Eviction marks made: pid and reason.
    pub marks: Vec<(u32, EvictReason)>,
    /// Calls of [`LedgerPort::reclaim`].
    pub reclaims: usize,
    /// What [`LedgerPort::offline_sm_cap_pct`] answers.
    pub sm_cap_pct: Option<f64>,
    /// Calls of [`LedgerPort::offline`] (reads of the registry).
    pub offline_reads: usize,
    /// Evictions of work without the shim recorded: host pid and pod.
    pub unshimmed: Vec<(u32, Option<String>)>,
}

impl LedgerPort for MemLedger {
    fn offline(&mut self, _now_ms: u64) -> Result<Vec<OfflineProc>, String> {
        self.offline_reads += 1;
        Ok(self.procs.clone())
    }
    fn mark_evicting(
        &mut self,
        p: &OfflineProc,
        reason: EvictReason,
        now_ms: u64,
    ) -> Result<(), String> {
        self.marks.push((p.pid, reason));
        for q in &mut self.procs {
            if q.key() == p.key() {
                q.evict_requested_ms = Some(now_ms);
            }
        }
        Ok(())
    }
    fn record_unshimmed(
        &mut self,
        p: &OfflineProc,
        _reason: EvictReason,
        pod_uid: Option<&str>,
    ) -> Result<(), String> {
        self.unshimmed.push((p.pid, pod_uid.map(str::to_string)));
        Ok(())
    }
    fn publish(&mut self, p: &Published) -> Result<(), String> {
        self.published.push(*p);
        Ok(())
    }
    fn reclaim(&mut self, _now_ms: u64) {
        self.reclaims += 1;
    }
    fn offline_sm_cap_pct(&mut self) -> Option<f64> {
        self.sm_cap_pct
    }
}
