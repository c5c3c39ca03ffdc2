//! One placement round: health-filtered GPUs, predicted weights, matching, the emitted plan.

pub mod alibaba;
pub mod health;
pub mod solve;
pub mod spec;
pub mod table;
pub mod with_cells;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use serde::Serialize;

use crate::matching::classes::{expand, prefer_classes, solve_classes, ClassProblem, Start, WarmStart};
use crate::matching::{SparseWeights, FORBIDDEN};
use crate::predictor::{JobProfile, SpeedPredictor};
pub use health::{GpuHealth, HealthReader};
pub use spec::{ClusterSpec, GpuRef, NodeSpec, OfflineJob, OnlineWorkload, SpecError, Workloads};

/// An offline job placed beside an online workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assignment {
    /// Name of the offline job.
    pub offline: String,
    /// Tenant the job belongs to (tenant rules may forbid some GPUs).
    pub tenant: String,
    /// Node and GPU index the job runs on.
    #[serde(flatten)]
    pub at: GpuRef,
    /// GPU model name (selects the predictor model).
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
    /// Name of the offline job taken off the GPU.
    pub offline: String,
    /// GPU it ran on.
    #[serde(flatten)]
    pub at: GpuRef,
    /// Why it was taken off (online workload gone, GPU unhealthy, moved, not placed).
    pub reason: String,
}

/// A GPU left out of matching and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkippedGpu {
    /// The GPU left out.
    #[serde(flatten)]
    pub at: GpuRef,
    /// Why: its health state label, a tenant rule, or no SM room left.
    pub reason: String,
}

/// An online workload the cells placed this round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlinePlacement {
    /// Name of the online workload.
    pub online: String,
    /// GPU the cells gave it.
    #[serde(flatten)]
    pub at: GpuRef,
}

/// An online workload without a GPU this round and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlineWaiting {
    /// Name of the online workload.
    pub online: String,
    /// Why it has no GPU (e.g. "no GPU given").
    pub reason: String,
}

/// The result of one round.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    /// Round number this plan was computed for.
    pub round: u64,
    /// Round period, seconds: the plan holds until the next round.
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
    /// Offline jobs placed (new or kept) beside online workloads.
    pub assignments: Vec<Assignment>,
    /// Existing pairs this plan ends.
    pub breaks: Vec<Break>,
    /// Offline jobs left waiting.
    pub unplaced: Vec<String>,
    /// GPUs left out of matching and why.
    pub skipped_gpus: Vec<SkippedGpu>,
    /// Sum of predicted normalized throughput over assignments.
    pub total_predicted: f64,
    /// Sizes and timings of the round.
    pub stats: PlanStats,
    /// Cells mode: the cells' status after the round (HiveD's inspect view, served by the
    /// extender under `GET /inspect/clusterstatus`; not part of the plan's JSON).
    #[serde(skip)]
    pub cells_status: Option<std::sync::Arc<crate::cells::CellsReport>>,
}

/// Sizes and timings of a round.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PlanStats {
    /// GPUs that entered matching (healthy, tenant-allowed, with SM room).
    pub candidate_gpus: usize,
    /// Offline jobs that entered matching.
    pub offline_jobs: usize,
    /// GPU-job pairs given a weight (counted over members, not classes).
    pub allowed_pairs: usize,
    /// GPU-job pairs refused by a rule or a refused binding (counted over members).
    pub forbidden_pairs: usize,
    /// Predictor calls made: distinct (model, offline, online, SM) keys in the round's cache.
    pub distinct_predictions: usize,
    /// Classes of interchangeable GPUs and jobs (same weights, same constraints).
    pub gpu_classes: usize,
    /// Classes of interchangeable jobs (see `gpu_classes`).
    pub job_classes: usize,
    /// `classes` (transportation problem on the classes) or `pairwise` (see [`SolverChoice`]).
    pub solver: String,
    /// Class solver: shortest paths pushed, and how it started (cold, or warm from the
    /// last round's pairs).
    pub class_paths: usize,
    /// How the class solver started (cold or warm); `None` for the pairwise solver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<Start>,
    /// Time to build the weights (predictions included), milliseconds.
    pub weights_ms: f64,
    /// Time to solve the matching, milliseconds.
    pub matching_ms: f64,
}

/// How a round's matching is solved. Both are exact for one job per GPU and give equal
/// totals; they may pick different pairs among equally good ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SolverChoice {
    /// Classes when [`crate::matching::classes::prefer_classes`] says the class problem
    /// is far smaller (`R * C * (R + C) <= gpus * k * jobs`), else pairwise.
    #[default]
    Auto,
    /// Always the pairwise solver (sparse or dense Jonker-Volgenant; with
    /// `max_offline_per_gpu > 1` the k-per-GPU planner).
    Pairwise,
    /// Always classes, unless several jobs per GPU could exceed a GPU's memory together
    /// (then pairwise: the class solver cannot see group memory).
    Classes,
}

/// Rounds that carry the last round's solution to warm-start the next one. A plain value:
/// no files, no globals; one per cluster (or simulation).
#[derive(Debug, Clone, Default)]
pub struct Planner {
    /// Which solver the rounds use.
    pub solver: SolverChoice,
    /// Keep each running job on its GPU while that GPU stays Healthy and open to offline
    /// work (see [`Planner::keeping_running`]).
    pub keep_running: bool,
    last: Vec<(GpuRef, String)>,
}

impl Planner {
    /// A planner with no previous round (the first round starts cold).
    pub fn new(solver: SolverChoice) -> Self {
        Planner { solver, keep_running: false, last: Vec::new() }
    }

    /// Rounds that never move a running job: a job whose `current` GPU is Healthy and open
    /// to offline work stays there and takes one of its slots and its memory; one on a
    /// Healthy GPU closed to offline work this round is matched nowhere else. For callers
    /// with nothing that carries a move out (the scheduler extender binds pods, it evicts
    /// none): a planned move would hand the job's GPU to another job while it still runs.
    pub fn keeping_running(mut self) -> Self {
        self.keep_running = true;
        self
    }

    /// [`plan_round`], warm-started from this planner's previous round (the class solver
    /// starts from the previous pairs, counted on this round's classes, and keeps them
    /// when certified optimal); remembers this round's pairs.
    pub fn plan_round(
        &mut self,
        cluster: &ClusterSpec,
        workloads: &Workloads,
        predictor: &SpeedPredictor,
        health: &dyn Fn(&GpuRef) -> GpuHealth,
        round: u64,
    ) -> Plan {
        let plan = plan_core(
            cluster,
            workloads,
            predictor,
            health,
            round,
            &|_| None,
            &BTreeSet::new(),
            cluster.max_offline_per_gpu,
            self.solver,
            Some(&self.last),
            self.keep_running,
        );
        self.last = plan.assignments.iter().map(|a| (a.at.clone(), a.offline.clone())).collect();
        plan
    }
}

/// Pairwise path: the keep bonus of a running job's current pair, as a share of the job's own
/// largest |weight| (see `plan_core`): breaks ties in favour of not moving a running job.
pub const KEEP_EPS: f64 = 1e-6;
/// Pairwise path: the least keep bonus, as a share of the round's largest |weight|: above the
/// matcher's tolerance (1e-11 of it), so that a tie is seen as one.
pub const KEEP_FLOOR: f64 = 1e-10;

/// Pairwise path: above this many GPU x job pairs a round logs a warning (the class solver,
/// which only max-throughput uses, solves such rounds in milliseconds; pairwise takes seconds
/// to minutes).
pub const PAIRWISE_WARN_PAIRS: usize = 100_000;

/// One usable online GPU in this round.
struct Candidate<'a> {
    at: GpuRef,
    node: &'a NodeSpec,
    online: &'a OnlineWorkload,
    sm_percent: f64,
    memory_free_mib: u64,
    quota_cap_mib: u64,
    /// Running jobs kept on this GPU (`keep_running`), and the memory they hold there (each
    /// its quota, else its need).
    held: usize,
    held_mib: u64,
}

impl Candidate<'_> {
    /// Memory a newly matched job may take: the free memory less the kept jobs'.
    fn free_for_new(&self) -> u64 {
        self.memory_free_mib.saturating_sub(self.held_mib)
    }
}

/// Why a pair may not be matched, or `None` when it may.
fn forbidden(cluster: &ClusterSpec, c: &Candidate, job: &OfflineJob) -> Option<&'static str> {
    if !job.gpu_types.is_empty() && !job.gpu_types.iter().any(|t| t == &c.node.gpu_type) {
        return Some("GPU type not allowed");
    }
    if job.memory_mib > c.free_for_new().min(c.quota_cap_mib) {
        return Some("memory will not fit");
    }
    if job.allowed_nodes.as_ref().is_some_and(|a| !a.contains(&c.at.node)) {
        return Some("kube-scheduler's own filters keep its pod off this node");
    }
    if let Some(rule) = cluster.tenants.get(&c.online.tenant) {
        if rule.no_offline_sharing || rule.deny_offline_from.contains(&job.tenant) {
            return Some("tenant rule");
        }
    }
    None
}

/// GPUs and jobs grouped into classes of interchangeable members: two GPUs share a class
/// when every job sees the same weight and the same constraints on both (predictor model,
/// GPU type, SM key, online profile, tenant when it has a rule, which job memory sizes
/// fit, which jobs' allowed-node sets hold its node), two jobs when every GPU does (profile,
/// tenant when a rule names it, allowed GPU types, which GPU memory caps they fit, their
/// allowed-node set). A GPU or job named in a refused pair is a class of its own.
struct Classes {
    gpu_class: Vec<u32>,
    job_class: Vec<u32>,
    gpu_members: Vec<Vec<u32>>,
    job_members: Vec<Vec<u32>>,
    /// Least free memory over a GPU class's members (group memory with several jobs).
    gpu_min_free: Vec<u64>,
    /// Largest memory over a job class's members.
    job_max_mem: Vec<u64>,
}

fn group<K: std::hash::Hash + Eq>(keys: impl Iterator<Item = K>) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut ids: HashMap<K, u32> = HashMap::new();
    let mut class = Vec::new();
    let mut members: Vec<Vec<u32>> = Vec::new();
    for (i, k) in keys.enumerate() {
        let next = members.len() as u32;
        let c = *ids.entry(k).or_insert(next);
        if c == next {
            members.push(Vec::new());
        }
        members[c as usize].push(i as u32);
        class.push(c);
    }
    (class, members)
}

fn intern<'a>(m: &mut HashMap<&'a str, u32>, s: &'a str) -> u32 {
    let next = m.len() as u32;
    *m.entry(s).or_insert(next)
}

/// The SM share as a weight sees it: rounded when the GPU type's model uses it, else 0.
fn sm_key(predictor: &SpeedPredictor, c: &Candidate) -> u32 {
    if predictor.models.get(&c.node.model_type()).is_some_and(|m| m.uses_sm_input()) {
        c.sm_percent.round() as u32
    } else {
        0
    }
}

fn classify<'a>(
    cluster: &'a ClusterSpec,
    predictor: &SpeedPredictor,
    candidates: &'a [Candidate<'a>],
    jobs: &'a [OfflineJob],
    refused: &BTreeSet<(String, GpuRef)>,
    full: &[bool],
    frozen: &[bool],
) -> Classes {
    let refused_jobs: HashSet<&str> = refused.iter().map(|(j, _)| j.as_str()).collect();
    let refused_gpus: HashSet<&GpuRef> = refused.iter().map(|(_, g)| g).collect();
    let cap = |c: &Candidate| c.free_for_new().min(c.quota_cap_mib);
    let mut job_mems: Vec<u64> = jobs.iter().map(|j| j.memory_mib).collect();
    job_mems.sort_unstable();
    job_mems.dedup();
    let mut caps: Vec<u64> = candidates.iter().map(cap).collect();
    caps.sort_unstable();
    caps.dedup();
    let mut strings: HashMap<&str, u32> = HashMap::new();
    // Tenants matter only through rules: an online tenant with a rule, an offline tenant
    // some rule names; all others are alike.
    let ruled: HashSet<&str> = cluster.tenants.keys().map(String::as_str).collect();
    let named: HashSet<&str> =
        cluster.tenants.values().flat_map(|r| r.deny_offline_from.iter().map(String::as_str)).collect();
    let mut profiles = ProfileIds::default();
    // The distinct allowed-node sets of the round's jobs: a job's class names its set, a GPU's
    // the sets its node is in (so every job sees the members of a GPU class alike).
    let mut allowed_sets: Vec<&BTreeSet<String>> = Vec::new();
    let allowed_id: Vec<u32> = jobs
        .iter()
        .map(|j| match &j.allowed_nodes {
            None => u32::MAX,
            Some(a) => match allowed_sets.iter().position(|s| *s == a) {
                Some(i) => i as u32,
                None => {
                    allowed_sets.push(a);
                    (allowed_sets.len() - 1) as u32
                }
            },
        })
        .collect();
    let gpu_keys: Vec<_> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            // GPUs kept full by running jobs share one class that matches nothing.
            if full[i] {
                return (u32::MAX, None, 0, None, u32::MAX, 0, usize::MAX - 1, Vec::new());
            }
            let own = if refused_gpus.contains(&c.at) { i } else { usize::MAX };
            (
                intern(&mut strings, &c.node.gpu_type),
                c.node.predictor_gpu_type.as_deref().map(|t| intern(&mut strings, t)),
                // The SM share enters a weight only through a model that uses it, and
                // then by its rounded value (the prediction cache's key).
                sm_key(predictor, c),
                profiles.id(c.online.profile.as_ref()),
                if ruled.contains(c.online.tenant.as_str()) { intern(&mut strings, &c.online.tenant) } else { u32::MAX },
                // Which job memory sizes fit: exact for every job of the round.
                job_mems.partition_point(|&m| m <= cap(c)),
                own,
                allowed_sets.iter().enumerate().filter(|(_, a)| a.contains(&c.at.node)).map(|(i, _)| i as u32).collect::<Vec<u32>>(),
            )
        })
        .collect();
    let job_keys: Vec<_> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            // Jobs kept where they run share one class that matches nothing.
            if frozen[i] {
                return (None, u32::MAX, Vec::new(), 0, usize::MAX - 1, u32::MAX);
            }
            let own = if refused_jobs.contains(j.name.as_str()) { i } else { usize::MAX };
            (
                profiles.id(j.profile.as_ref()),
                if named.contains(j.tenant.as_str()) { intern(&mut strings, &j.tenant) } else { u32::MAX },
                j.gpu_types.iter().map(|t| intern(&mut strings, t)).collect::<Vec<u32>>(),
                // Which GPU caps it fits under: exact for every GPU of the round.
                caps.partition_point(|&c| c < j.memory_mib),
                own,
                allowed_id[i],
            )
        })
        .collect();
    let (gpu_class, gpu_members) = group(gpu_keys.into_iter());
    let (job_class, job_members) = group(job_keys.into_iter());
    let gpu_min_free = gpu_members
        .iter()
        .map(|m| m.iter().map(|&i| candidates[i as usize].free_for_new()).min().unwrap_or(0))
        .collect();
    let job_max_mem = job_members.iter().map(|m| m.iter().map(|&j| jobs[j as usize].memory_mib).max().unwrap_or(0)).collect();
    Classes { gpu_class, job_class, gpu_members, job_members, gpu_min_free, job_max_mem }
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
    plan_core(
        cluster,
        workloads,
        predictor,
        health,
        round,
        &|_| None,
        &BTreeSet::new(),
        cluster.max_offline_per_gpu,
        SolverChoice::Auto,
        None,
        false,
    )
}

/// The round itself; `excluded` gives a reason to keep a GPU out of matching (or `None`);
/// `refused` forbids single `(job, GPU)` pairs; `last` is the previous round's pairs (warm
/// start; `None`: the jobs' `current`); `keep_running`: see [`Planner::keeping_running`]
/// (a job whose pair with its current GPU is in `refused` is not kept there).
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_core(
    cluster: &ClusterSpec,
    workloads: &Workloads,
    predictor: &SpeedPredictor,
    health: &dyn Fn(&GpuRef) -> GpuHealth,
    round: u64,
    excluded: &dyn Fn(&GpuRef) -> Option<String>,
    refused: &BTreeSet<(String, GpuRef)>,
    per_gpu: usize,
    solver: SolverChoice,
    last: Option<&[(GpuRef, String)]>,
    keep_running: bool,
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
        candidates.push(Candidate { at: at.clone(), node, online, sm_percent, memory_free_mib, quota_cap_mib, held: 0, held_mib: 0 });
    }

    let k = per_gpu.max(1);
    // Running jobs kept where they run (`keep_running`): on a candidate GPU they take a slot
    // and their memory there and match nothing else; on a Healthy GPU closed to offline work
    // this round they match nothing (nothing would move them, so a new GPU would be wasted).
    let mut pinned: Vec<Option<usize>> = vec![None; workloads.offline.len()];
    let mut frozen = vec![false; workloads.offline.len()];
    if keep_running {
        let at_index: HashMap<GpuRef, usize> = candidates.iter().enumerate().map(|(i, c)| (c.at.clone(), i)).collect();
        for (j, job) in workloads.offline.iter().enumerate() {
            let Some(cur) = &job.current else { continue };
            if !refused.is_empty() && refused.contains(&(job.name.clone(), cur.clone())) {
                continue;
            }
            match at_index.get(cur) {
                Some(&gi) if candidates[gi].held < k => {
                    candidates[gi].held += 1;
                    candidates[gi].held_mib += job.held_memory_quota_mib.unwrap_or(job.memory_mib);
                    pinned[j] = Some(gi);
                    frozen[j] = true;
                }
                Some(_) => {}
                None => frozen[j] = gpu_state.get(cur).is_some_and(|s| s.is_healthy()),
            }
        }
    }
    let full: Vec<bool> = candidates.iter().map(|c| c.held >= k).collect();

    plan.stats.candidate_gpus = candidates.len();
    plan.stats.offline_jobs = workloads.offline.len();
    let cl = classify(cluster, predictor, &candidates, &workloads.offline, refused, &full, &frozen);
    let (nr, nc) = (cl.gpu_members.len(), cl.job_members.len());
    plan.stats.gpu_classes = nr;
    plan.stats.job_classes = nc;

    // Weights per class pair (every member of a class pair has the same one).
    let mut cache: HashMap<(usize, usize, usize, u32), f64> = HashMap::new();
    let mut model_ids: HashMap<String, usize> = HashMap::new();
    let mut missing_models = std::collections::BTreeSet::new();
    let mut class_w = vec![FORBIDDEN; nr * nc];
    let mut ids = ProfileIds::default();
    let off_ids: Vec<Option<usize>> =
        cl.job_members.iter().map(|m| ids.id(workloads.offline[m[0] as usize].profile.as_ref())).collect();
    for g in 0..nr {
        let c = &candidates[cl.gpu_members[g][0] as usize];
        let gsize = cl.gpu_members[g].len();
        if full[cl.gpu_members[g][0] as usize] {
            plan.stats.forbidden_pairs += gsize * workloads.offline.len();
            continue;
        }
        let on_id = ids.id(c.online.profile.as_ref());
        let model_type = c.node.model_type();
        let next_id = model_ids.len();
        let model_id = *model_ids.entry(model_type.clone()).or_insert(next_id);
        // A model that ignores the SM input gives one prediction per profile pair.
        let sm_key = sm_key(predictor, c);
        for j in 0..nc {
            let job = &workloads.offline[cl.job_members[j][0] as usize];
            let jsize = cl.job_members[j].len();
            if frozen[cl.job_members[j][0] as usize] {
                plan.stats.forbidden_pairs += gsize * jsize;
                continue;
            }
            let refused_pair = !refused.is_empty() && refused.contains(&(job.name.clone(), c.at.clone()));
            if forbidden(cluster, c, job).is_some() || refused_pair {
                plan.stats.forbidden_pairs += gsize * jsize;
                continue;
            }
            plan.stats.allowed_pairs += gsize * jsize;
            let w = match (on_id, off_ids[j], &c.online.profile, &job.profile) {
                (Some(a), Some(b), Some(on), Some(off)) => *cache.entry((model_id, b, a, sm_key)).or_insert_with(|| {
                    match predictor.predict(&model_type, off, on, c.sm_percent) {
                        Ok(Some(w)) => w,
                        Ok(None) => cluster.unprofiled_weight,
                        Err(_) => {
                            missing_models.insert(model_type.clone());
                            cluster.unprofiled_weight
                        }
                    }
                }),
                _ => cluster.unprofiled_weight,
            };
            class_w[g * nc + j] = w;
        }
    }
    for m in &missing_models {
        tracing::warn!(gpu_type = %m, weight = cluster.unprofiled_weight, "no predictor model for GPU type; using the unprofiled weight");
    }
    // The kept pairs' own weights (their classes match nothing, so they were not computed).
    let mut kept_w: HashMap<usize, f64> = HashMap::new();
    for (j, gi) in pinned.iter().enumerate().filter_map(|(j, g)| g.map(|g| (j, g))) {
        let (c, job) = (&candidates[gi], &workloads.offline[j]);
        let model_type = c.node.model_type();
        let next_id = model_ids.len();
        let model_id = *model_ids.entry(model_type.clone()).or_insert(next_id);
        let w = match (ids.id(c.online.profile.as_ref()), ids.id(job.profile.as_ref()), &c.online.profile, &job.profile) {
            (Some(a), Some(b), Some(on), Some(off)) => *cache.entry((model_id, b, a, sm_key(predictor, c))).or_insert_with(|| {
                predictor.predict(&model_type, off, on, c.sm_percent).ok().flatten().unwrap_or(cluster.unprofiled_weight)
            }),
            _ => cluster.unprofiled_weight,
        };
        kept_w.insert(j, w);
    }
    plan.stats.distinct_predictions = cache.len();
    plan.stats.weights_ms = t0.elapsed().as_secs_f64() * 1e3;
    let weight_of = |gi: usize, j: usize| class_w[cl.gpu_class[gi] as usize * nc + cl.job_class[j] as usize];

    let t1 = Instant::now();
    // The offline allocation policy (crate::policy) may reshape the weights; the class solver
    // then cannot be used (reshaped weights differ within a class).
    let job_at: HashMap<&GpuRef, usize> = candidates.iter().enumerate().map(|(i, c)| (&c.at, i)).collect();
    let slots: Vec<crate::policy::Slot> = candidates
        .iter()
        .map(|c| crate::policy::Slot { gpu_type: &c.node.gpu_type, sm_percent: c.sm_percent, memory_mib: c.free_for_new().min(c.quota_cap_mib) })
        .collect();
    let current_of = |j: usize| workloads.offline[j].current.as_ref().and_then(|at| job_at.get(at).copied());
    let shaped = crate::policy::shape(cluster.policy, &slots, &workloads.offline, k, &weight_of, &current_of);
    // With several jobs per GPU the round refuses groups whose memory does not fit; the
    // class solver is exact only when that can never bind: k times the largest job a GPU
    // class may take fits in the class's least free memory.
    let memory_never_binds = k == 1
        || (0..nr).all(|g| {
            let most = (0..nc).filter(|&j| class_w[g * nc + j] > 0.0).map(|j| cl.job_max_mem[j]).max().unwrap_or(0);
            (k as u64).saturating_mul(most) <= cl.gpu_min_free[g]
        });
    // A GPU partly held by running jobs has fewer slots than its class's `k`.
    let partly_held = candidates.iter().any(|c| c.held > 0 && c.held < k);
    let use_classes = memory_never_binds
        && !partly_held
        && shaped.is_none()
        && match solver {
            SolverChoice::Classes => true,
            SolverChoice::Pairwise => false,
            SolverChoice::Auto => prefer_classes(nr, nc, candidates.len() * k, workloads.offline.len()),
        };
    let gpu_index: HashMap<&GpuRef, usize> = candidates.iter().enumerate().map(|(i, c)| (&c.at, i)).collect();
    let chosen: Vec<Vec<usize>> = if use_classes {
        let problem = ClassProblem {
            row_size: cl.gpu_members.iter().map(|m| (m.len() * k) as u64).collect(),
            col_size: cl.job_members.iter().map(|m| m.len() as u64).collect(),
            weight: class_w.clone(),
        };
        // Warm start: the last round's pairs (the planner's, else the jobs' `current`),
        // counted per class pair of this round.
        let job_index: HashMap<&str, usize> =
            workloads.offline.iter().enumerate().map(|(j, o)| (o.name.as_str(), j)).collect();
        let mut seed: HashMap<(u32, u32), u64> = HashMap::new();
        let mut add = |at: &GpuRef, name: &str| {
            if let (Some(&gi), Some(&j)) = (gpu_index.get(at), job_index.get(name)) {
                if full[gi] || frozen[j] {
                    return;
                }
                *seed.entry((cl.gpu_class[gi], cl.job_class[j])).or_default() += 1;
            }
        };
        match last {
            Some(pairs) => pairs.iter().for_each(|(at, name)| add(at, name)),
            None => workloads.offline.iter().for_each(|o| {
                if let Some(at) = &o.current {
                    add(at, &o.name)
                }
            }),
        }
        let warm = (!seed.is_empty()).then(|| WarmStart { flow: seed.into_iter().map(|((g, j), f)| (g, j, f)).collect() });
        let sol = solve_classes(&problem, warm.as_ref());
        plan.stats.solver = "classes".into();
        plan.stats.class_paths = sol.paths;
        plan.stats.start = Some(sol.start);
        // Expand to pairs, keeping each job where it runs when its class pair has room.
        let current: Vec<u32> = workloads
            .offline
            .iter()
            .map(|o| o.current.as_ref().and_then(|at| gpu_index.get(at)).map_or(u32::MAX, |&gi| gi as u32))
            .collect();
        let groups = expand(
            &sol.flow,
            &cl.gpu_members,
            &cl.job_members,
            candidates.len(),
            workloads.offline.len(),
            k,
            |j| (current[j as usize] != u32::MAX).then(|| current[j as usize]),
        );
        groups.into_iter().map(|g| g.into_iter().map(|j| j as usize).collect()).collect()
    } else {
        let mut edges: Vec<(usize, usize, f64)> = Vec::new();
        for gi in 0..candidates.len() {
            for j in 0..workloads.offline.len() {
                let w = weight_of(gi, j);
                let w = match &shaped {
                    Some(s) if w != FORBIDDEN => s.weight(gi, j, w),
                    _ => w,
                };
                if w != FORBIDDEN {
                    edges.push((gi, j, w));
                }
            }
        }
        // Among equally good plans, keep running jobs where they run (the class path does so
        // when it expands classes to pairs): every move kills and restarts a training job.
        // A job's current pair gets KEEP_EPS of the job's own largest |weight| (DRF's admission
        // tier left out), below the resolution of the predictor's f32 model: no real gain of
        // the job's is lost, whatever the spread of weights in the round (Optimus divides by
        // the time left: a week-long job's weights are a millionth of a job about to end, and a
        // bonus scaled to the round's largest outweighed its own). It is at least
        // KEEP_FLOOR of the round's largest weight as the matcher gets it, above the matcher's
        // tolerance (1e-11 of that), so the tie is still seen.
        let ranking = |e: &(usize, usize, f64)| shaped.as_ref().map_or(e.2, |s| s.ranking_part(e.1, e.2)).abs();
        let mut own = vec![0.0f64; workloads.offline.len()];
        for e in &edges {
            own[e.1] = own[e.1].max(ranking(e));
        }
        // The matcher's tolerance is relative to the largest weight it is given, policy tiers
        // (DRF's admission bonus) included: the floor is too.
        let scale = edges.iter().fold(0.0f64, |m, e| m.max(e.2.abs()));
        for e in edges.iter_mut().filter(|e| current_of(e.1) == Some(e.0)) {
            e.2 += (KEEP_EPS * own[e.1]).max(KEEP_FLOOR * scale);
        }
        if candidates.len().saturating_mul(workloads.offline.len()) > PAIRWISE_WARN_PAIRS {
            tracing::warn!(
                round,
                gpus = candidates.len(),
                offline = workloads.offline.len(),
                policy = cluster.policy.name(),
                "large round solved pairwise (no class solver for this policy or input): expect seconds to minutes"
            );
        }
        let weights = match SparseWeights::from_edges(candidates.len(), workloads.offline.len(), edges) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "weights refused by the matcher; no placements this round");
                SparseWeights::from_edges(candidates.len(), workloads.offline.len(), []).expect("empty edge list")
            }
        };
        let group_fits = |gi: usize, jobs: &[usize]| {
            let c = &candidates[gi];
            jobs.len() + c.held <= k
                && jobs.iter().map(|&j| workloads.offline[j].memory_mib).sum::<u64>() <= c.free_for_new()
        };
        plan.stats.solver = "pairwise".into();
        solve::assign(&weights, per_gpu, group_fits)
    };
    plan.stats.matching_ms = t1.elapsed().as_secs_f64() * 1e3;
    let mut chosen = chosen;
    chosen.resize(candidates.len(), Vec::new());
    for (j, gi) in pinned.iter().enumerate().filter_map(|(j, g)| g.map(|g| (j, g))) {
        chosen[gi].push(j);
    }

    let mut placed: HashMap<usize, usize> = HashMap::new();
    for (gi, jobs) in chosen.into_iter().enumerate() {
        let c = &candidates[gi];
        // A kept job keeps the quota it runs with (its shim enforces it for the pod's life):
        // the others share what is left of the GPU's room. Sharing the whole room again gave
        // a newcomer part of what a running job still held (GPU memory promised twice).
        let fixed = |j: usize| workloads.offline[j].held_memory_quota_mib.filter(|_| pinned[j] == Some(gi));
        let held: u64 = jobs.iter().filter_map(|&j| fixed(j)).fold(0, u64::saturating_add);
        let shared: Vec<usize> = jobs.iter().copied().filter(|&j| fixed(j).is_none()).collect();
        let need: u64 = shared.iter().map(|&j| workloads.offline[j].memory_mib).sum();
        let room = c.memory_free_mib.min(c.quota_cap_mib.saturating_mul(jobs.len() as u64)).saturating_sub(held);
        let spare = room.saturating_sub(need) / shared.len().max(1) as u64;
        for &j in &jobs {
            let job = &workloads.offline[j];
            let w = kept_w.get(&j).copied().unwrap_or_else(|| weight_of(gi, j));
            placed.insert(j, gi);
            plan.total_predicted += w;
            plan.assignments.push(Assignment {
                offline: job.name.clone(),
                tenant: job.tenant.clone(),
                at: c.at.clone(),
                gpu_type: c.node.gpu_type.clone(),
                online: c.online.name.clone(),
                sm_percent: c.sm_percent / jobs.len() as f64,
                memory_quota_mib: fixed(j).unwrap_or(job.memory_mib + spare),
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
    run_round_with(cluster, workloads, predictor, cells, round, None)
}

impl Planner {
    /// [`run_round`] warm-started from this planner's last round (without cells; in cells
    /// mode the cells state is what carries), remembering this round's pairs.
    pub fn run_round(
        &mut self,
        cluster: &ClusterSpec,
        workloads: &Workloads,
        predictor: &SpeedPredictor,
        cells: Option<&mut with_cells::CellsState>,
        round: u64,
    ) -> Plan {
        run_round_with(cluster, workloads, predictor, cells, round, Some(self))
    }
}

fn run_round_with(
    cluster: &ClusterSpec,
    workloads: &Workloads,
    predictor: &SpeedPredictor,
    cells: Option<&mut with_cells::CellsState>,
    round: u64,
    planner: Option<&mut Planner>,
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
        None => match planner {
            Some(p) => p.plan_round(cluster, workloads, predictor, &*health, round),
            None => plan_round(cluster, workloads, predictor, &*health, round),
        },
    }
}
