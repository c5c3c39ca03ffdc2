//! Each GPU's health as the monitor publishes it in the GPU's status file
//! (`<dir>/status/gpu<N>`, which only the daemons write), with the GPU's ledger
//! (`<dir>/gpu<N>/ledger`) openable. The agent creates neither: a GPU whose ledger is missing
//! or damaged, or whose status is missing, damaged, never published or stale, is not Healthy.

use std::collections::BTreeMap;
use std::path::Path;

use node_ledger::config::{ledger_path, status_path};
use node_ledger::{HealthState, Ledger, MonitorSnapshot, Status};

/// One GPU's reading.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuHealth {
    /// Host GPU index.
    pub index: u32,
    /// The published state, when the block is readable, published and fresh (Unhealthy
    /// instead of Healthy while MPS could not serve offline work: [`GpuHealth::mps_unavailable`]).
    pub state: Option<HealthState>,
    /// Why it is not Healthy (empty when Healthy).
    pub why: String,
    /// The last consistent monitor block, fresh or not (heartbeat content).
    pub snapshot: Option<MonitorSnapshot>,
    /// mps-manager's offline SM budget, per-mille, when freshly published.
    pub budget_permille: Option<u32>,
}

impl GpuHealth {
    /// Makes a Healthy GPU Unhealthy because its MPS could not serve an offline container
    /// (`why`, from [`crate::mps::offline_ready`]): it admits no new offline work, as when the
    /// monitor says Unhealthy.
    pub fn mps_unavailable(&mut self, why: String) {
        self.state = Some(HealthState::Unhealthy);
        self.why = format!("MPS: {why}");
    }

    /// Whether the GPU may take offline work now (a fresh, published Healthy verdict).
    pub fn healthy(&self) -> bool {
        self.state == Some(HealthState::Healthy)
    }
}

/// Reads GPU `index`'s ledger under `ledger_dir` at monotonic time `now_ns`.
pub fn read_gpu(ledger_dir: &Path, index: u32, now_ns: u64, stale_after_ns: u64) -> GpuHealth {
    let path = ledger_path(ledger_dir, index);
    let not = |why: String, snapshot| GpuHealth {
        index,
        state: None,
        why,
        snapshot,
        budget_permille: None,
    };
    // Offline processes register in the ledger: a GPU without a sound one takes no work.
    match Ledger::open_existing(&path) {
        Ok(_) => {}
        // The error names the file.
        Err(e) if !path.exists() => {
            return not(format!("{e} (no monitor has created it: is sysmonitor running for GPU {index}?)"), None)
        }
        Err(e) => return not(e.to_string(), None),
    }
    let spath = status_path(ledger_dir, index);
    let status = match Status::open(&spath) {
        Ok(s) => s,
        Err(e) if !spath.exists() => {
            return not(format!("{e} (no monitor has created it: is sysmonitor running for GPU {index}?)"), None)
        }
        Err(e) => return not(e.to_string(), None),
    };
    let Some(snap) = status.read_monitor() else {
        return not(
            format!("status file {}: monitor block busy or header not valid", spath.display()),
            None,
        );
    };
    if snap.publish_ns == 0 {
        return not("monitor has not published yet".into(), Some(snap));
    }
    // A block dated ahead of our clock is as untrustworthy as an old one.
    if snap.publish_ns > now_ns.saturating_add(stale_after_ns) {
        return not("monitor block dated in the future".into(), Some(snap));
    }
    if !snap.is_fresh(now_ns, stale_after_ns) {
        let age_ms = now_ns.saturating_sub(snap.publish_ns) / 1_000_000;
        return not(
            format!(
                "monitor block is {age_ms} ms old (monitor pid {} gone or stuck?)",
                snap.monitor_pid
            ),
            Some(snap),
        );
    }
    let Some(state) = snap.health() else {
        return not(
            format!("unknown health value {}", snap.sample.health),
            Some(snap),
        );
    };
    let why = if state == HealthState::Healthy {
        String::new()
    } else {
        format!("monitor says {state:?}")
    };
    let budget_permille = status
        .read_manager()
        .filter(|m| m.is_fresh(now_ns, stale_after_ns))
        .filter(|m| m.publish_ns <= now_ns.saturating_add(stale_after_ns))
        .map(|m| m.offline_sm_budget_permille.min(1000));
    GpuHealth {
        index,
        state: Some(state),
        why,
        snapshot: Some(snap),
        budget_permille,
    }
}

/// Every served GPU's reading for its offline slots now: the monitor's verdict
/// ([`read_all`]), made Unhealthy while the GPU's MPS could not serve an offline container
/// ([`crate::mps::offline_ready`]). What ListAndWatch, the heartbeat, Allocate and
/// `node-agent status` go by.
pub fn read_offline(cfg: &crate::config::AgentConfig) -> BTreeMap<u32, GpuHealth> {
    let idx: Vec<u32> = cfg.gpus.iter().map(|g| g.index).collect();
    let stale = cfg.health.stale_after_ms.saturating_mul(1_000_000);
    let mut h = read_all(&cfg.ledger_dir, &idx, node_ledger::clock::now_ns(), stale);
    let now_ms = node_daemon::clock::unix_ms();
    for g in h.values_mut().filter(|g| g.healthy()) {
        if let Err(why) = crate::mps::offline_ready(cfg, g.index, now_ms, cfg.health.stale_after_ms) {
            g.mps_unavailable(why);
        }
    }
    h
}

/// All served GPUs, by index.
pub fn read_all(
    ledger_dir: &Path,
    gpus: &[u32],
    now_ns: u64,
    stale_after_ns: u64,
) -> BTreeMap<u32, GpuHealth> {
    gpus.iter()
        .map(|&i| (i, read_gpu(ledger_dir, i, now_ns, stale_after_ns)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use node_ledger::clock::now_ns;
    use node_ledger::MonitorSample;

    #[test]
    fn missing_stale_future_and_healthy() {
        let d = tempfile::tempdir().unwrap();
        let stale = 1_000_000_000;
        let h = read_gpu(d.path(), 0, now_ns(), stale);
        assert!(!h.healthy() && h.why.contains("ledger"), "{h:?}");
        let _ledger = Ledger::open_or_create(&ledger_path(d.path(), 0), 0).unwrap();
        let h = read_gpu(d.path(), 0, now_ns(), stale);
        assert!(!h.healthy() && h.why.contains("status file"), "{h:?}");
        let l = Status::open_or_create(&status_path(d.path(), 0), 0).unwrap();
        assert!(read_gpu(d.path(), 0, now_ns(), stale)
            .why
            .contains("not published"));
        let s = MonitorSample::default().with_health(HealthState::Healthy);
        l.publish(&s);
        assert!(read_gpu(d.path(), 0, now_ns(), stale).healthy());
        l.publish_at(&s, now_ns() - 3 * stale);
        assert!(read_gpu(d.path(), 0, now_ns(), stale).why.contains("old"));
        l.publish_at(&s, u64::MAX);
        assert!(read_gpu(d.path(), 0, now_ns(), stale)
            .why
            .contains("future"));
        l.publish(&MonitorSample::default().with_health(HealthState::Overlimit));
        let h = read_gpu(d.path(), 0, now_ns(), stale);
        assert_eq!(h.state, Some(HealthState::Overlimit));
        assert!(!h.healthy());
    }
}
