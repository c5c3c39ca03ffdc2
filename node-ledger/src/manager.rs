//! The MPS-manager block: one writer (mps-manager) publishes the offline SM budget under its own
//! sequence counter; readers (monitor, shims) take consistent snapshots with atomic loads.

use std::sync::atomic::{fence, Ordering::*};

use crate::clock::now_ns;
use crate::ledger::Ledger;

/// A consistent copy of the manager block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagerSnapshot {
    /// SM share the offline side may use, per-mille (clamped to 0..=1000).
    pub offline_sm_budget_permille: u32,
    /// CLOCK_MONOTONIC ns of the publish (0 = never).
    pub publish_ns: u64,
    /// Pid of the publishing manager (its own pid namespace).
    pub manager_pid: u32,
    /// Sequence number of the publish read (even: consistent).
    pub seq: u64,
}

impl ManagerSnapshot {
    /// Whether the data were published within `max_age_ns` of `now_ns`.
    pub fn is_fresh(&self, now_ns: u64, max_age_ns: u64) -> bool {
        self.publish_ns != 0 && now_ns.saturating_sub(self.publish_ns) <= max_age_ns
    }
}

impl Ledger {
    /// Publishes the offline SM budget (per-mille, clamped to 1000) stamped with the current
    /// time. Single writer: only the MPS manager of this GPU calls it.
    pub fn publish_sm_budget(&self, permille: u32) {
        self.publish_sm_budget_at(permille, now_ns());
    }

    /// As `publish_sm_budget` with an explicit timestamp (tests simulate a stale manager).
    pub fn publish_sm_budget_at(&self, permille: u32, publish_ns: u64) {
        let m = &self.layout().manager;
        let seq = m.seq.load(Relaxed);
        let start = if seq & 1 == 0 { seq + 1 } else { seq + 2 };
        m.seq.store(start, Relaxed);
        fence(Release);
        m.manager_pid.store(std::process::id(), Relaxed);
        m.offline_sm_budget_permille
            .store(permille.min(1000), Relaxed);
        m.publish_ns.store(publish_ns, Relaxed);
        m.seq.store(start + 1, Release);
    }

    /// A consistent snapshot, or `None` if a writer kept the block busy (treat as stale).
    pub fn read_manager(&self) -> Option<ManagerSnapshot> {
        let m = &self.layout().manager;
        for _ in 0..64 {
            let s1 = m.seq.load(Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let snap = ManagerSnapshot {
                offline_sm_budget_permille: m.offline_sm_budget_permille.load(Relaxed).min(1000),
                publish_ns: m.publish_ns.load(Relaxed),
                manager_pid: m.manager_pid.load(Relaxed),
                seq: s1,
            };
            fence(Acquire);
            if m.seq.load(Relaxed) == s1 {
                return Some(snap);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::Ledger;

    #[test]
    fn budget_round_trips_and_freshness() {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&d.path().join("ledger"), 0).unwrap();
        let s = l.read_manager().unwrap();
        assert_eq!(s.publish_ns, 0);
        assert!(!s.is_fresh(crate::clock::now_ns(), u64::MAX));
        l.publish_sm_budget(400);
        let s = l.read_manager().unwrap();
        assert_eq!(s.offline_sm_budget_permille, 400);
        assert_eq!(s.manager_pid, std::process::id());
        assert!(s.is_fresh(crate::clock::now_ns(), 1_000_000_000));
        l.publish_sm_budget_at(5000, 1);
        let s = l.read_manager().unwrap();
        assert_eq!(s.offline_sm_budget_permille, 1000);
        assert!(!s.is_fresh(10_000_000_000, 1_000_000_000));
        // The monitor's publish leaves the manager block alone (one writer per block).
        l.publish(&crate::MonitorSample::default());
        assert_eq!(l.read_manager().unwrap().offline_sm_budget_permille, 1000);
    }
}
