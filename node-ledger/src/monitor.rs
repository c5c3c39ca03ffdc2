//! What the monitor publishes in the status file (`crate::status`): its sample and health
//! verdict; and the monitor's eviction requests in the ledger's process slots.

use std::sync::atomic::Ordering::*;

use crate::health::HealthState;
use crate::ledger::Ledger;

/// What the monitor publishes each tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
}

/// A consistent copy of the monitor block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl Ledger {
    /// Asks the process `pid` that started at `start_time` (clock ticks, `/proc/<pid>/stat`
    /// field 22), registered in `slot`, to take `signal`: only if the slot still holds that
    /// process. Returns whether the request stands. A slot freed and claimed by a newcomer
    /// while the request was written gets it taken back, so a request never reaches another
    /// process than the one it was meant for.
    pub fn request_evict_of(&self, slot: usize, pid: u32, start_time: u64, signal: u32) -> bool {
        use crate::layout::owner_pid;
        let Some(p) = self.layout().procs.get(slot) else {
            return false;
        };
        let owner = p.owner.load(Acquire);
        if pid == 0 || owner_pid(owner) != pid || p.start_time.load(Acquire) != start_time {
            return false;
        }
        p.evict_signal.store(signal, Release);
        // A newcomer claims a slot by changing `owner` (the generation moves on every claim)
        // before it clears `evict_signal`: if the owner is unchanged now, the request is ours.
        if p.owner.load(Acquire) == owner {
            return true;
        }
        let _ = p.evict_signal.compare_exchange(signal, 0, AcqRel, Relaxed);
        false
    }

    /// Asks the process in registry `slot` to take `signal` (e.g. SIGTERM), whoever holds the
    /// slot now; [`Ledger::request_evict_of`] checks pid + start time first.
    pub fn request_evict(&self, slot: usize, signal: u32) {
        if let Some(p) = self.layout().procs.get(slot) {
            p.evict_signal.store(signal, Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eviction_request_reaches_only_the_process_it_names() {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&d.path().join("gpu0/ledger"), 0).unwrap();
        let g = l.group(1, 1 << 30).unwrap();
        let me = std::process::id();
        let start = crate::procinfo::start_time(me).unwrap();
        let h = l.register(me, g).unwrap();
        assert!(!l.request_evict_of(h.slot, me, start + 1, 15), "another start time");
        assert!(!l.request_evict_of(h.slot, me + 1, start, 15), "another pid");
        assert!(!l.request_evict_of(usize::MAX, me, start, 15), "no such slot");
        assert_eq!(l.evict_signal(h), 0);
        assert!(l.request_evict_of(h.slot, me, start, 15));
        assert_eq!(l.evict_signal(h), 15);
        // The slot changes hands: a request for its old owner is refused.
        l.unregister(h);
        let mut child = { let _spawn = crate::SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner()); std::process::Command::new("sleep").arg("30").spawn().unwrap() };
        let h2 = l.register(child.id(), g).unwrap();
        assert_eq!(h2.slot, h.slot, "the freed slot is reused");
        assert!(!l.request_evict_of(h.slot, me, start, 15));
        assert_eq!(l.evict_signal(h2), 0, "the newcomer got no request");
        let child_start = crate::procinfo::start_time(child.id()).unwrap();
        assert!(l.request_evict_of(h2.slot, child.id(), child_start, 15));
        let _ = child.kill();
        let _ = child.wait();
    }
}
