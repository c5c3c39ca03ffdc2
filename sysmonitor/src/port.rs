//! What the monitor needs from the per-GPU ledger, as a trait so the daemon logic can be
//! tested without shared memory; `ledger.rs` implements it over `node-ledger`.

use crate::health::State;
use crate::sampler::SmSource;

/// An offline process registered by the shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OfflineProc {
    /// Registry slot in the ledger.
    pub slot: usize,
    pub pid: u32,
    /// False when the process registered from another pid namespace: its pid means nothing
    /// here, so it is asked to exit through the ledger only, never signalled.
    pub signalable: bool,
    /// Start time in clock ticks since boot (/proc/<pid>/stat field 22).
    pub start_time: u64,
    /// GPU memory the process says it holds, bytes.
    pub reported_bytes: u64,
    /// Monotonic ms at which an eviction was requested, if one was (survives monitor restarts).
    pub evict_requested_ms: Option<u64>,
}

impl OfflineProc {
    pub fn key(&self) -> (u32, u64) {
        (self.pid, self.start_time)
    }
}

/// What the monitor publishes each sample.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Published {
    pub state: Option<State>,
    pub gpu_util: f64,
    pub sm_activity: f64,
    pub sm_source: Option<SmSource>,
    pub sm_clock_mhz: u32,
    pub sm_clock_max_mhz: u32,
    pub mem_used: u64,
    pub mem_total: u64,
    /// Monotonic ms of the sample.
    pub t_ms: u64,
}

/// Why a process was evicted (also the Prometheus label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvictReason {
    Overlimit,
    Disabled,
    HostMemory,
    UnderReport,
}

impl EvictReason {
    pub const ALL: [EvictReason; 4] = [
        EvictReason::Overlimit,
        EvictReason::Disabled,
        EvictReason::HostMemory,
        EvictReason::UnderReport,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EvictReason::Overlimit => "overlimit",
            EvictReason::Disabled => "disabled",
            EvictReason::HostMemory => "host_memory",
            EvictReason::UnderReport => "under_report",
        }
    }

    pub fn code(self) -> u32 {
        self as u32 + 1
    }
}

/// The monitor's view of the ledger.
pub trait LedgerPort {
    /// Offline processes currently registered.
    fn offline(&mut self) -> Result<Vec<OfflineProc>, String>;
    /// Records that `p` is being evicted (so a restarted monitor does not signal it again).
    fn mark_evicting(
        &mut self,
        p: &OfflineProc,
        reason: EvictReason,
        now_ms: u64,
    ) -> Result<(), String>;
    /// Publishes state and measurements for the shim and the MPS manager.
    fn publish(&mut self, p: &Published) -> Result<(), String>;
    /// Gives back the quota of registered processes that have died, in any pid namespace
    /// (called every tick; the ledger adapter scans at most every `RECLAIM_EVERY_MS`).
    fn reclaim(&mut self) {}
}

/// In-memory ledger for unit tests and dry runs.
#[derive(Debug, Default)]
pub struct MemLedger {
    pub procs: Vec<OfflineProc>,
    pub published: Vec<Published>,
    pub marks: Vec<(u32, EvictReason)>,
    /// Calls of [`LedgerPort::reclaim`].
    pub reclaims: usize,
}

impl LedgerPort for MemLedger {
    fn offline(&mut self) -> Result<Vec<OfflineProc>, String> {
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
    fn publish(&mut self, p: &Published) -> Result<(), String> {
        self.published.push(*p);
        Ok(())
    }
    fn reclaim(&mut self) {
        self.reclaims += 1;
    }
}
