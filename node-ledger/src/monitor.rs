//! What the monitor publishes in the status file (`crate::status`): its sample and health
//! verdict (its eviction requests are the status file's too: `crate::status::Requester`).

use crate::health::HealthState;

/// What the monitor publishes each tick.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MonitorSample {
    /// Health state as [`HealthState`]'s discriminant (see [`MonitorSample::with_health`]).
    pub health: u32,
    /// SM activity, per-mille ([`MonitorSample::sm_active_pct`] reads it in percent).
    pub sm_active_permille: u32,
    /// GPU utilization, per-mille.
    pub gpu_util_permille: u32,
    /// Current SM clock, MHz.
    pub sm_clock_mhz: u32,
    /// Highest SM clock, MHz (0 when unknown).
    pub sm_clock_max_mhz: u32,
    /// SM count of the device (0 when unknown).
    pub sm_count: u32,
    /// Device memory in use, bytes.
    pub mem_used_bytes: u64,
    /// Device memory in total, bytes.
    pub mem_total_bytes: u64,
    /// The operator's floor for the offline processes' launch throttles on this GPU
    /// (sysmonitor's `offline_throttle`), published with every sample. The default is no
    /// floor at all (what a publisher that does not set it, a test harness, means).
    pub throttle_floor: ThrottleFloor,
}

/// The operator's floor for offline launch throttles: how loose a shim's throttle may be,
/// whatever the process's own configuration (`XCUDA_THROTTLE`, `XCUDA_TARGET_LOAD`,
/// `XCUDA_FALLBACK_RATE`, a file of its own in `XCUDA_CONFIG`): a process may tighten its
/// throttle, never loosen it past this. A limit of 0 (or anything not a positive, finite
/// number) is no limit on that field; [`ThrottleFloor::default`] is no floor.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ThrottleFloor {
    /// The throttle may not be turned off, and its control law (bucket depth, online-pressure
    /// hold, clock weights, gains, period, staleness) may not be looser than the shipped one.
    pub required: bool,
    /// Highest load target (U_GPU) a throttle may aim at.
    pub max_target_load: f64,
    /// Highest launch rate, SM-waves per second.
    pub max_rate: f64,
    /// Highest rate while monitor data are missing or stale, SM-waves per second.
    pub max_fallback_rate: f64,
}

impl ThrottleFloor {
    /// `v` as a limit: `None` unless positive and finite (0 = no limit).
    fn limit(v: f64) -> Option<f64> {
        (v > 0.0 && v.is_finite()).then_some(v)
    }

    /// The highest load target, if limited.
    pub fn target_load_limit(&self) -> Option<f64> {
        Self::limit(self.max_target_load)
    }

    /// The highest launch rate, if limited.
    pub fn rate_limit(&self) -> Option<f64> {
        Self::limit(self.max_rate)
    }

    /// The highest fallback rate, if limited.
    pub fn fallback_rate_limit(&self) -> Option<f64> {
        Self::limit(self.max_fallback_rate)
    }

    /// Whether this floor limits nothing.
    pub fn is_none(&self) -> bool {
        !self.required
            && self.target_load_limit().is_none()
            && self.rate_limit().is_none()
            && self.fallback_rate_limit().is_none()
    }
}

/// A consistent copy of the monitor block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MonitorSnapshot {
    /// The published values.
    pub sample: MonitorSample,
    /// CLOCK_MONOTONIC ns of the publish (0 = never).
    pub publish_ns: u64,
    /// Sequence number of the publish read (even: consistent).
    pub seq: u64,
    /// Pid of the publishing monitor (its own pid namespace).
    pub monitor_pid: u32,
}

/// A consistent copy of the status file's jobs table: the offline jobs the monitor counted in
/// every ledger of the GPU (the GPU's own and each pod's), which no offline process sees whole.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobsSnapshot {
    /// The jobs, as [`crate::jobs::jobs_of`] counts them.
    pub jobs: Vec<crate::jobs::OfflineJob>,
    /// Jobs that did not fit the table.
    pub dropped: u32,
    /// CLOCK_MONOTONIC ns of the publish (0 = never).
    pub publish_ns: u64,
}

impl JobsSnapshot {
    /// Whether the table was published within `max_age_ns` of `now_ns`.
    pub fn is_fresh(&self, now_ns: u64, max_age_ns: u64) -> bool {
        self.publish_ns != 0 && now_ns.saturating_sub(self.publish_ns) <= max_age_ns
    }

    /// The jobs a *starting* process leaves room for: the table's (registered jobs, and jobs
    /// known by a fresh start claim alone, `procs` 0), plus one uncapped job (group 0, which no
    /// group has) standing for the jobs that did not fit: they hold an unknown share, read as
    /// the tightest.
    pub fn for_start(&self) -> Vec<crate::jobs::OfflineJob> {
        let mut v = self.jobs.clone();
        if self.dropped > 0 {
            v.push(crate::jobs::OfflineJob { group_id: 0, procs: self.dropped, mps_pct: None });
        }
        v
    }

    /// The jobs a *running* split divides the budget between: [`JobsSnapshot::for_start`]
    /// less the jobs known by a start claim alone (a claim says a process will start, not that
    /// any SM is in use: `crate::claims`, point 4).
    pub fn for_running(&self) -> Vec<crate::jobs::OfflineJob> {
        self.for_start().into_iter().filter(|j| j.procs > 0).collect()
    }
}

impl MonitorSnapshot {
    /// Decoded health; an unknown stored value reads as `None`.
    pub fn health(&self) -> Option<HealthState> {
        HealthState::from_u32(self.sample.health)
    }

    /// Whether the data were published within `max_age_ns` of `now_ns`.
    pub fn is_fresh(&self, now_ns: u64, max_age_ns: u64) -> bool {
        self.publish_ns != 0 && now_ns.saturating_sub(self.publish_ns) <= max_age_ns
    }
}

impl MonitorSample {
    /// SM activity in percent (the unit of [`crate::GpuSample`]).
    pub fn sm_active_pct(&self) -> f64 {
        crate::sample::permille_to_pct(self.sm_active_permille)
    }

    /// SM activity as a fraction, 0..=1 (the unit of the shim's controller).
    pub fn sm_active_fraction(&self) -> f64 {
        crate::sample::permille_to_fraction(self.sm_active_permille)
    }

    /// GPU utilization in percent.
    pub fn gpu_util_pct(&self) -> f64 {
        crate::sample::permille_to_pct(self.gpu_util_permille)
    }

    /// Sets the health field from the enum.
    pub fn with_health(mut self, h: HealthState) -> Self {
        self.health = h as u32;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::OfflineJob;

    #[test]
    fn a_running_split_leaves_out_jobs_known_by_their_claim_alone() {
        let registered = OfflineJob { group_id: 1, procs: 2, mps_pct: Some(20) };
        let claimed = OfflineJob { group_id: 2, procs: 0, mps_pct: Some(15) };
        let t = JobsSnapshot { jobs: vec![registered, claimed], dropped: 1, publish_ns: 1 };
        let overflow = OfflineJob { group_id: 0, procs: 1, mps_pct: None };
        assert_eq!(t.for_start(), [registered, claimed, overflow]);
        assert_eq!(t.for_running(), [registered, overflow]);
    }
}
