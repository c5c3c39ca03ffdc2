//! One placement round: health-filtered GPUs, predicted weights, matching, the emitted plan.

pub mod alibaba;
pub mod health;
pub mod solve;
pub mod spec;
pub mod table;
pub mod with_cells;

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::Serialize;

use crate::matching::SparseWeights;
use crate::predictor::{JobProfile, SpeedPredictor};
pub use health::{GpuHealth, HealthReader};
pub use spec::{ClusterSpec, GpuRef, NodeSpec, OfflineJob, OnlineWorkload, SpecError, Workloads};

/// An offline job placed beside an online workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assignment {
    pub offline: String,
    pub tenant: String,
    #[serde(flatten)]
    pub at: GpuRef,
    pub gpu_type: String,
    /// The online workload it shares the GPU with.
    pub online: String,
    /// MPS active-thread percentage for the offline job.
    pub sm_percent: f64,
    /// GPU memory quota for the offline job (the shim's limit).
    pub memory_quota_mib: u64,
    /// Predicted normalized throughput (edge weight).
    pub predicted_normalized: f64,
    /// Whether the job already runs there.
    pub kept: bool,
}

/// An existing pair the plan ends.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Break {
    pub offline: String,
    #[serde(flatten)]
    pub at: GpuRef,
    pub reason: String,
}

/// A GPU left out of matching and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkippedGpu {
    #[serde(flatten)]
    pub at: GpuRef,
    pub reason: String,
}

/// An online workload the cells placed this round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlinePlacement {
    pub online: String,
    #[serde(flatten)]
    pub at: GpuRef,
}

/// An online workload without a GPU this round and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlineWaiting {
    pub online: String,
    pub reason: String,
}

/// The result of one round.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    pub round: u64,
    pub period_s: u64,
    /// Online workloads placed on guaranteed cells (cells mode only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub online_placements: Vec<OnlinePlacement>,
    /// Online workloads left without a GPU.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub online_waiting: Vec<OnlineWaiting>,
    /// Online workloads pinned to a GPU that their VC's cells cannot take (cells mode): they
    /// keep running, their GPU is never handed to other online work, the reason says why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub online_unregistered: Vec<OnlineWaiting>,
    pub assignments: Vec<Assignment>,
    pub breaks: Vec<Break>,
    /// Offline jobs left waiting.
    pub unplaced: Vec<String>,
    pub skipped_gpus: Vec<SkippedGpu>,
    /// Sum of predicted normalized throughput over assignments.
    pub total_predicted: f64,
    pub stats: PlanStats,
}

/// Sizes and timings of a round.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PlanStats {
    pub candidate_gpus: usize,
    pub offline_jobs: usize,
    pub allowed_pairs: usize,
    pub forbidden_pairs: usize,
    pub distinct_predictions: usize,
    pub weights_ms: f64,
    pub matching_ms: f64,
}

/// One usable online GPU in this round.
struct Candidate<'a> {
    at: GpuRef,
    node: &'a NodeSpec,
    online: &'a OnlineWorkload,
    sm_percent: f64,
    memory_free_mib: u64,
    quota_cap_mib: u64,
}

/// Why a pair may not be matched, or `None` when it may.
fn forbidden(cluster: &ClusterSpec, c: &Candidate, job: &OfflineJob) -> Option<&'static str> {
    if !job.gpu_types.is_empty() && !job.gpu_types.iter().any(|t| t == &c.node.gpu_type) {
        return Some("GPU type not allowed");
    }
    if job.memory_mib > c.memory_free_mib.min(c.quota_cap_mib) {
        return Some("memory will not fit");
    }
    if let Some(rule) = cluster.tenants.get(&c.online.tenant) {
        if rule.no_offline_sharing || rule.deny_offline_from.contains(&job.tenant) {
            return Some("tenant rule");
        }
    }
    None
}

/// Interns profiles so that identical ones share predictions.
#[derive(Default)]
struct ProfileIds {
    ids: HashMap<String, usize>,
}

impl ProfileIds {
    fn id(&mut self, p: Option<&JobProfile>) -> Option<usize> {
        let key = serde_json::to_string(&(&p?.batch_size, &p?.isolated, &p?.isolated_2gpu)).ok()?;
        let next = self.ids.len();
        Some(*self.ids.entry(key).or_insert(next))
    }
}

/// Computes one round's plan. `health` gives each GPU's state (see [`HealthReader`]).
/// Online workloads without a GPU wait (use [`with_cells::plan_round_with_cells`] to have
/// cells place them).
pub fn plan_round(
    cluster: &ClusterSpec,
    workloads: &Workloads,
    predictor: &SpeedPredictor,
    health: &dyn Fn(&GpuRef) -> GpuHealth,
    round: u64,
) -> Plan {
    plan_core(cluster, workloads, predictor, health, round, &|_| None, &|_, _| false, cluster.max_offline_per_gpu)
}

/// The round itself; `excluded` gives a reason to keep a GPU out of matching (or `None`);
/// `pair_refused(job, gpu)` forbids single pairs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_core(
    cluster: &ClusterSpec,
    workloads: &Workloads,
    predictor: &SpeedPredictor,
    health: &dyn Fn(&GpuRef) -> GpuHealth,
    round: u64,
    excluded: &dyn Fn(&GpuRef) -> Option<String>,
    pair_refused: &dyn Fn(&str, &GpuRef) -> bool,
    per_gpu: usize,
) -> Plan {
    let t0 = Instant::now();
    let mut plan = Plan {
        round,
        period_s: cluster.round_period_s,
        ..Plan::default()
    };
    let mut gpu_state: BTreeMap<GpuRef, GpuHealth> = BTreeMap::new();
    let mut candidates = Vec::new();
    // Host name -> its entries (one per GPU type), GPUs numbered through them in order.
    let mut nodes: HashMap<&str, Vec<&NodeSpec>> = HashMap::new();
    for n in &cluster.nodes {
        nodes.entry(n.name.as_str()).or_default().push(n);
    }
    let node_for = |at: &GpuRef| -> Option<&NodeSpec> {
        let mut base = 0;
        for n in nodes.get(at.node.as_str())? {
            if at.gpu < base + n.gpus {
                return Some(n);
            }
            base += n.gpus;
        }
        None
    };
    for online in &workloads.online {
        let Some(at) = &online.at else {
            plan.online_waiting.push(OnlineWaiting { online: online.name.clone(), reason: "no GPU given".into() });
            continue;
        };
        let Some(node) = node_for(at) else { continue };
        let state = health(at);
        gpu_state.insert(at.clone(), state.clone());
        if !state.is_healthy() {
            plan.skipped_gpus.push(SkippedGpu { at: at.clone(), reason: state.label() });
            continue;
        }
        if let Some(reason) = excluded(at) {
            plan.skipped_gpus.push(SkippedGpu { at: at.clone(), reason });
            continue;
        }
        if cluster.tenants.get(&online.tenant).is_some_and(|r| r.no_offline_sharing) {
            plan.skipped_gpus.push(SkippedGpu { at: at.clone(), reason: "tenant rule".into() });
            continue;
        }
        let sm_percent = (100.0 - online.sm_activity_percent).clamp(0.0, 100.0);
        if sm_percent < cluster.min_offline_sm_percent {
            plan.skipped_gpus.push(SkippedGpu { at: at.clone(), reason: format!("no SM room ({sm_percent:.0}%)") });
            continue;
        }
        let memory_free_mib = node
            .gpu_memory_mib
            .saturating_sub(online.memory_mib)
            .saturating_sub(cluster.memory_headroom_mib);
        let quota_cap_mib = (node.gpu_memory_mib as f64 * cluster.max_offline_memory_fraction) as u64;
        candidates.push(Candidate { at: at.clone(), node, online, sm_percent, memory_free_mib, quota_cap_mib });
    }

    let mut ids = ProfileIds::default();
    let online_ids: Vec<Option<usize>> = candidates.iter().map(|c| ids.id(c.online.profile.as_ref())).collect();
    let offline_ids: Vec<Option<usize>> = workloads.offline.iter().map(|j| ids.id(j.profile.as_ref())).collect();
    let mut cache: HashMap<(usize, usize, usize, u32), f64> = HashMap::new();
    let mut model_ids: HashMap<String, usize> = HashMap::new();
    let mut edges: Vec<(usize, usize, f64)> = Vec::new();
    let mut missing_models = std::collections::BTreeSet::new();
    for (gi, (c, on_id)) in candidates.iter().zip(&online_ids).enumerate() {
        let model_type = c.node.model_type();
        let next_id = model_ids.len();
        let model_id = *model_ids.entry(model_type.clone()).or_insert(next_id);
        // A model that ignores the SM input gives one prediction per profile pair.
        let sm_key = if predictor.models.get(&model_type).is_some_and(|m| m.uses_sm_input()) {
            c.sm_percent.round() as u32
        } else {
            0
        };
        for (j, (job, off_id)) in workloads.offline.iter().zip(&offline_ids).enumerate() {
            if forbidden(cluster, c, job).is_some() || pair_refused(&job.name, &c.at) {
                plan.stats.forbidden_pairs += 1;
                continue;
            }
            plan.stats.allowed_pairs += 1;
            let w = match (on_id, off_id, &c.online.profile, &job.profile) {
                (Some(a), Some(b), Some(on), Some(off)) => {
                    let key = (model_id, *b, *a, sm_key);
                    if let Some(w) = cache.get(&key) {
                        *w
                    } else {
                        let w = match predictor.predict(&model_type, off, on, c.sm_percent) {
                            Ok(Some(w)) => w,
                            Ok(None) => cluster.unprofiled_weight,
                            Err(_) => {
                                missing_models.insert(model_type.clone());
                                cluster.unprofiled_weight
                            }
                        };
                        cache.insert(key, w);
                        w
                    }
                }
                _ => cluster.unprofiled_weight,
            };
            edges.push((gi, j, w));
        }
    }
    for m in &missing_models {
        tracing::warn!(gpu_type = %m, weight = cluster.unprofiled_weight, "no predictor model for GPU type; using the unprofiled weight");
    }
    plan.stats.candidate_gpus = candidates.len();
    plan.stats.offline_jobs = workloads.offline.len();
    plan.stats.distinct_predictions = cache.len();
    plan.stats.weights_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    let weights = match SparseWeights::from_edges(candidates.len(), workloads.offline.len(), edges) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "weights refused by the matcher; no placements this round");
            SparseWeights::from_edges(candidates.len(), workloads.offline.len(), []).expect("empty edge list")
        }
    };
    let group_fits = |gi: usize, jobs: &[usize]| {
        jobs.iter().map(|&j| workloads.offline[j].memory_mib).sum::<u64>() <= candidates[gi].memory_free_mib
    };
    let chosen = solve::assign(&weights, per_gpu, group_fits);
    plan.stats.matching_ms = t1.elapsed().as_secs_f64() * 1e3;

    let mut placed: HashMap<usize, usize> = HashMap::new();
    for (gi, jobs) in chosen.into_iter().enumerate() {
        let c = &candidates[gi];
        let need: u64 = jobs.iter().map(|&j| workloads.offline[j].memory_mib).sum();
        let room = c.memory_free_mib.min(c.quota_cap_mib.saturating_mul(jobs.len() as u64));
        let spare = room.saturating_sub(need) / jobs.len().max(1) as u64;
        for &j in &jobs {
            let job = &workloads.offline[j];
            let w = weights.get(gi, j).unwrap_or(0.0);
            placed.insert(j, gi);
            plan.total_predicted += w;
            plan.assignments.push(Assignment {
                offline: job.name.clone(),
                tenant: job.tenant.clone(),
                at: c.at.clone(),
                gpu_type: c.node.gpu_type.clone(),
                online: c.online.name.clone(),
                sm_percent: c.sm_percent / jobs.len() as f64,
                memory_quota_mib: job.memory_mib + spare,
                predicted_normalized: w,
                kept: job.current.as_ref() == Some(&c.at),
            });
        }
    }
    let online_at: BTreeMap<&GpuRef, &OnlineWorkload> =
        workloads.online.iter().filter_map(|o| o.at.as_ref().map(|a| (a, o))).collect();
    for (j, job) in workloads.offline.iter().enumerate() {
        let Some(cur) = &job.current else {
            if !placed.contains_key(&j) {
                plan.unplaced.push(job.name.clone());
            }
            continue;
        };
        let new_at = placed.get(&j).map(|&gi| &candidates[gi].at);
        if new_at == Some(cur) {
            continue;
        }
        let skipped = plan.skipped_gpus.iter().find(|s| &s.at == cur).map(|s| s.reason.clone());
        let reason = match (gpu_state.get(cur), online_at.get(cur)) {
            (_, None) => "online workload gone".to_string(),
            (Some(s), _) if !s.is_healthy() => format!("GPU not Healthy: {}", s.label()),
            _ if skipped.is_some() => format!("GPU closed to offline work: {}", skipped.unwrap_or_default()),
            _ => match new_at {
                Some(to) => format!("moved to {}/{} (better plan)", to.node, to.gpu),
                None => "not placed this round".to_string(),
            },
        };
        if new_at.is_none() {
            plan.unplaced.push(job.name.clone());
        }
        plan.breaks.push(Break { offline: job.name.clone(), at: cur.clone(), reason });
    }
    tracing::info!(
        round,
        gpus = plan.stats.candidate_gpus,
        offline = plan.stats.offline_jobs,
        placed = plan.assignments.len(),
        breaks = plan.breaks.len(),
        weights_ms = plan.stats.weights_ms,
        matching_ms = plan.stats.matching_ms,
        "placement round"
    );
    plan
}

/// Health lookup for a round: the state files under `reader`, or, when the cluster names no
/// state directory, every GPU taken as Healthy (logged once).
pub fn health_fn(reader: Option<HealthReader>) -> Box<dyn Fn(&GpuRef) -> GpuHealth + Send + Sync> {
    match reader {
        Some(r) => Box::new(move |g: &GpuRef| r.read(&g.node, g.gpu)),
        None => {
            tracing::warn!("cluster has no state_dir: taking every GPU as Healthy");
            Box::new(|_: &GpuRef| GpuHealth::Healthy)
        }
    }
}

/// The cells state of a cluster with `cells`: the cells built from that config, with the
/// ledger of `cells_state` replayed onto them when that file exists (see
/// [`with_cells::CellsState::load`]). `None` without `cells`.
pub fn load_cells(cluster: &ClusterSpec) -> Result<Option<with_cells::CellsState>, with_cells::StateError> {
    let Some(cfg) = cluster.cells.as_deref() else { return Ok(None) };
    let cells = crate::cells::Cluster::load(cfg)?;
    Ok(Some(match &cluster.cells_state {
        Some(p) => with_cells::CellsState::load(cells, p)?,
        None => with_cells::CellsState::new(cells),
    }))
}

/// One round as the CLI and the extender run it: health from the cluster's state directory,
/// and, when `cells` is given, placement through that cells state, which carries to the next
/// round (and, when the cluster names `cells_state`, is saved there; a failed save is logged
/// and the in-memory state still carries).
pub fn run_round(
    cluster: &ClusterSpec,
    workloads: &Workloads,
    predictor: &SpeedPredictor,
    cells: Option<&mut with_cells::CellsState>,
    round: u64,
) -> Plan {
    let reader = cluster.state_dir.clone().map(|dir| HealthReader {
        dir,
        stale_after: std::time::Duration::from_secs(cluster.stale_after_s),
    });
    let health = health_fn(reader);
    match cells {
        Some(st) => {
            let plan = with_cells::plan_round_with_cells(cluster, workloads, predictor, &*health, round, st);
            if let Some(p) = &cluster.cells_state {
                if let Err(e) = st.save(p) {
                    tracing::error!(error = %e, "cells state not saved");
                }
            }
            plan
        }
        None => plan_round(cluster, workloads, predictor, &*health, round),
    }
}
