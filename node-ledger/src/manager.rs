//! What mps-manager publishes in the status file (`crate::status`): the offline SM budget.

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

