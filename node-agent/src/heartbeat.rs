//! The GPU heartbeat: each GPU's monitor state, load and offline budget, published as the
//! Node annotation `xshare.io/gpu-heartbeat` (format owned by `kube-contract`) with a JSON
//! merge patch on this node's Node object, every `heartbeat.interval_ms` and at once when a
//! GPU's state changes. A GPU with no fresh monitor verdict (monitor not running, ledger
//! missing or damaged, block stale or dated ahead) is reported `Init` (no verdict), which the
//! cluster side never reads as Healthy; a dead agent stops the heartbeat, which the cluster
//! side reads as stale.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kube_contract::heartbeat::{GpuHeartbeat, GpuReport, GpuState, VERSION};
use node_ledger::HealthState;
use tokio::sync::watch;

use crate::config::AgentConfig;
use crate::health::GpuHealth;
use node_daemon::clock::unix_ms;

/// The contract's state for a reading (no fresh verdict: `Init`).
pub fn state_of(h: Option<&GpuHealth>) -> GpuState {
    match h.and_then(|h| h.state) {
        Some(HealthState::Init) | None => GpuState::Init,
        Some(HealthState::Healthy) => GpuState::Healthy,
        Some(HealthState::Unhealthy) => GpuState::Unhealthy,
        Some(HealthState::Overlimit) => GpuState::Overlimit,
        Some(HealthState::Disabled) => GpuState::Disabled,
    }
}

/// The heartbeat for `health` at wall-clock `now_unix_ms`.
pub fn build(
    cfg: &AgentConfig,
    health: &BTreeMap<u32, GpuHealth>,
    now_unix_ms: u64,
) -> GpuHeartbeat {
    let gpus = cfg
        .gpus
        .iter()
        .map(|g| {
            let h = health.get(&g.index);
            // Load figures only with a verdict: a stale block's numbers describe the past.
            let fresh = h.filter(|h| h.state.is_some());
            let s = fresh
                .and_then(|h| h.snapshot)
                .map(|s| s.sample)
                .unwrap_or_default();
            GpuReport {
                index: g.index,
                uuid: g.uuid.clone(),
                state: state_of(h),
                sm_activity_permille: s.sm_active_permille.min(1000),
                memory_used_bytes: s.mem_used_bytes.min(s.mem_total_bytes),
                memory_total_bytes: s.mem_total_bytes,
                offline_sm_budget_permille: fresh
                    .and_then(|h| h.budget_permille)
                    .unwrap_or(0)
                    .min(1000),
                model: g.model.clone(),
            }
        })
        .collect();
    GpuHeartbeat {
        version: VERSION,
        node: cfg.node_name.clone(),
        updated_unix_ms: now_unix_ms,
        gpus,
    }
}

/// When to publish: first time, after `interval_ms` without one, or when a GPU's state changed
/// since the last successful publication.
#[derive(Debug, Default)]
pub struct Schedule {
    last_ms: Option<u64>,
    last_states: Vec<(u32, GpuState)>,
}

impl Schedule {
    /// Whether to publish now: never published, a GPU's state changed, or `interval_ms` passed.
    pub fn due(&self, now_ms: u64, interval_ms: u64, states: &[(u32, GpuState)]) -> bool {
        match self.last_ms {
            None => true,
            Some(t) => {
                now_ms.saturating_sub(t) >= interval_ms || states != self.last_states.as_slice()
            }
        }
    }

    /// Records a successful publication.
    pub fn published(&mut self, now_ms: u64, states: Vec<(u32, GpuState)>) {
        self.last_ms = Some(now_ms);
        self.last_states = states;
    }
}

/// Merge-patches the annotation onto Node `hb.node`. `Err`: what failed, and the server's wait
/// if its answer gave one.
pub async fn publish(client: &Client, hb: &GpuHeartbeat) -> Result<(), (String, Option<Duration>)> {
    let patch = hb.node_merge_patch().map_err(|e| (e.to_string(), None))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams {
        field_manager: Some(kube_contract::NODE_AGENT_FIELD_MANAGER.into()),
        ..Default::default()
    };
    nodes
        .patch(&hb.node, &pp, &Patch::Merge(&patch))
        .await
        .map_err(|e| (format!("patching Node {}: {e}", hb.node), kube_contract::retry::retry_after(&e)))?;
    Ok(())
}

/// Longest wait between heartbeat attempts after errors (and cap on the server's wait): a
/// third of the cluster side's default staleness (30 s), so that once the API server is back
/// the next heartbeat lands well before the node's GPUs read stale for the wait alone.
pub const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(10);

/// Publishes on every health update that makes it due (and at least each health poll checks).
pub async fn run(
    cfg: Arc<AgentConfig>,
    client: Client,
    mut health: watch::Receiver<BTreeMap<u32, GpuHealth>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sched = Schedule::default();
    let start = tokio::time::Instant::now();
    // After a failed patch: no attempt before its backoff (from one health poll, doubling, or
    // the server's wait), whatever polls and state changes come meanwhile.
    let mut backoff = kube_contract::retry::Backoff::new(Duration::from_millis(cfg.health.poll_ms), MAX_RETRY_BACKOFF);
    loop {
        let h = health.borrow_and_update().clone();
        if !h.is_empty() {
            let states: Vec<(u32, GpuState)> = cfg
                .gpus
                .iter()
                .map(|g| (g.index, state_of(h.get(&g.index))))
                .collect();
            let now = start.elapsed().as_millis() as u64;
            if sched.due(now, cfg.heartbeat.interval_ms, &states) && backoff.ready(tokio::time::Instant::now()) {
                match publish(&client, &build(&cfg, &h, unix_ms())).await {
                    Ok(()) => {
                        if backoff.succeeded() {
                            tracing::info!("heartbeat published again");
                        }
                        sched.published(now, states);
                    }
                    Err((e, asked)) => {
                        let f = backoff.failed(tokio::time::Instant::now(), &e, asked);
                        if f.say {
                            tracing::warn!(error = %e, retry_in_ms = f.delay.as_millis() as u64, server_asked = f.server_asked, "heartbeat not published; retrying with backoff, this error said once (the cluster side reads a stale heartbeat as not Healthy)");
                        }
                    }
                }
            }
        }
        tokio::select! {
            r = health.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(cfg.health.poll_ms)) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_publishes_first_on_interval_and_on_state_change() {
        let mut s = Schedule::default();
        let a = vec![(0, GpuState::Healthy)];
        let b = vec![(0, GpuState::Overlimit)];
        assert!(s.due(0, 10_000, &a));
        s.published(0, a.clone());
        assert!(!s.due(5_000, 10_000, &a));
        assert!(
            s.due(5_000, 10_000, &b),
            "a state change is published at once"
        );
        assert!(s.due(10_000, 10_000, &a));
        // A failed publication is not recorded: still due at the next poll.
        assert!(s.due(5_001, 10_000, &b));
        s.published(5_001, b.clone());
        assert!(!s.due(6_000, 10_000, &b));
    }

    #[test]
    fn no_verdict_is_init_and_carries_no_load() {
        let t = r#"{"node_name": "n1", "gpus": [{"index": 0, "uuid": "GPU-a", "model": "V100"}, {"index": 1, "uuid": "GPU-b"}]}"#;
        let cfg = AgentConfig::from_text(std::path::Path::new("c.json"), t, |_| None).unwrap();
        let snap = node_ledger::MonitorSnapshot {
            sample: node_ledger::MonitorSample {
                sm_active_permille: 420,
                mem_used_bytes: 5,
                mem_total_bytes: 10,
                ..Default::default()
            },
            publish_ns: 1,
            seq: 2,
            monitor_pid: 3,
        };
        let h = BTreeMap::from([
            (
                0,
                GpuHealth {
                    index: 0,
                    state: Some(HealthState::Healthy),
                    why: String::new(),
                    snapshot: Some(snap),
                    budget_permille: Some(500),
                },
            ),
            (
                1,
                GpuHealth {
                    index: 1,
                    state: None,
                    why: "stale".into(),
                    snapshot: Some(snap),
                    budget_permille: None,
                },
            ),
        ]);
        let hb = build(&cfg, &h, 1_700_000_000_000);
        hb.validate("n1").unwrap();
        let g0 = hb.gpu(0).unwrap();
        assert_eq!(
            (
                g0.state,
                g0.sm_activity_permille,
                g0.memory_used_bytes,
                g0.offline_sm_budget_permille
            ),
            (GpuState::Healthy, 420, 5, 500)
        );
        assert_eq!(g0.model, "V100");
        let g1 = hb.gpu(1).unwrap();
        assert_eq!(
            (g1.state, g1.sm_activity_permille, g1.memory_total_bytes),
            (GpuState::Init, 0, 0)
        );
        // GPU 0's MPS cannot serve offline work: the cluster reads it as admitting none.
        let mut h = h;
        h.get_mut(&0).unwrap().mps_unavailable("no MPS control daemon runs".into());
        let g0 = build(&cfg, &h, 1_700_000_000_000).gpu(0).unwrap().clone();
        assert_eq!((g0.state, g0.sm_activity_permille), (GpuState::Unhealthy, 420));
    }
}
