//! Replay of placement rounds on the Alibaba 2023 GPU trace (`alibaba-gpu-v2023`): LS pods are
//! online workloads, BE pods offline jobs.
//!
//! The trace has no model names, GPU memory sizes or SM activity, so the replay states its
//! assumptions in one place ([`Assumptions`]): each pod gets the profile of a Gavel job chosen
//! by a hash of its name; an online pod's SM activity is its `gpu_milli` share; GPU memory is
//! shared in proportion to `gpu_milli`; undisclosed GPU models use a stated predictor type.
//!
//! Every GPU pod of the trace is modelled, by QoS class:
//! * `LS`, `Burstable`, `Guaranteed`: GPU holders (Kubernetes does not evict the last two for
//!   best-effort work), placed first-fit on `num_gpu` free GPUs of one node and kept while
//!   they live; offline pods may share their GPUs (SM room = the complement of `gpu_milli`).
//! * `BE` on one GPU: offline jobs, matched beside holders by the planner.
//! * `BE` on several GPUs: the trace means `num_gpu` whole GPUs on one node (`gpu_milli` is
//!   1000 for them), which no holder's GPU can give; they take wholly free GPUs of one node,
//!   first-fit, and wait with that reason otherwise.
//!
//! Every round reports what was placed and, per reason, what waits.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::spec::{ClusterSpec, GpuRef, NodeSpec, OfflineJob, OnlineWorkload, Workloads};
use super::{plan_round, GpuHealth};
use crate::predictor::gavel::GavelData;
use crate::predictor::{JobProfile, SpeedPredictor};

/// Errors reading the trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A trace file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    #[error("{path}:{line}: {why}")]
    /// A row (or the header) is malformed.
    Row {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong (missing column, not a number).
        why: String,
    },
}

/// One GPU node of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceNode {
    /// Node serial name (`sn` column).
    pub name: String,
    /// GPUs on the node (`gpu` column); nodes with none are dropped.
    pub gpus: u32,
    /// GPU model (`model` column, e.g. `V100M16`; may be empty).
    pub model: String,
}

/// One pod of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePod {
    /// Pod name (also hashed to pick its Gavel job profile).
    pub name: String,
    /// GPUs the pod asks for.
    pub num_gpu: u32,
    /// Share of each GPU asked for, thousandths (1000 = a whole GPU).
    pub gpu_milli: u32,
    /// GPU models the pod accepts (empty: any).
    pub gpu_spec: Vec<String>,
    /// QoS class: `LS`, `BE`, `Burstable` or `Guaranteed`.
    pub qos: String,
    /// Creation time, trace seconds.
    pub creation: u64,
    /// Deletion time, trace seconds (`u64::MAX` when the pod never leaves).
    pub deletion: u64,
}

/// Nodes and pods of the trace.
#[derive(Debug, Clone)]
pub struct Trace {
    /// GPU nodes (those with at least one GPU).
    pub nodes: Vec<TraceNode>,
    /// Pods of the pod list, in file order.
    pub pods: Vec<TracePod>,
}

/// A CSV file's header and its rows, each with its line number.
type Csv = (Vec<String>, Vec<(usize, Vec<String>)>);

fn csv_rows(path: &Path) -> Result<Csv, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError::Io { path: path.to_path_buf(), source: e })?;
    let mut lines = text.lines().enumerate();
    let header: Vec<String> = lines
        .next()
        .map(|(_, h)| h.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let rows = lines
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.split(',').map(str::to_string).collect()))
        .collect();
    Ok((header, rows))
}

fn column(path: &Path, header: &[String], name: &str) -> Result<usize, TraceError> {
    header.iter().position(|h| h == name).ok_or_else(|| TraceError::Row {
        path: path.to_path_buf(),
        line: 1,
        why: format!("no column `{name}`"),
    })
}

fn num<T: std::str::FromStr>(path: &Path, line: usize, row: &[String], col: usize, name: &str) -> Result<T, TraceError> {
    row.get(col).and_then(|v| v.trim().parse().ok()).ok_or_else(|| TraceError::Row {
        path: path.to_path_buf(),
        line,
        why: format!("column `{name}` is not a number"),
    })
}

impl Trace {
    /// Reads `openb_node_list_gpu_node.csv` and the pod list `pods` from `dir`.
    pub fn load(dir: &Path, pods: &str) -> Result<Self, TraceError> {
        let np = dir.join("openb_node_list_gpu_node.csv");
        let (h, rows) = csv_rows(&np)?;
        let (c_sn, c_gpu, c_model) = (column(&np, &h, "sn")?, column(&np, &h, "gpu")?, column(&np, &h, "model")?);
        let mut nodes = Vec::new();
        for (line, r) in rows {
            let gpus: u32 = num(&np, line, &r, c_gpu, "gpu")?;
            if gpus > 0 {
                nodes.push(TraceNode { name: r[c_sn].clone(), gpus, model: r.get(c_model).cloned().unwrap_or_default() });
            }
        }
        let pp = dir.join(pods);
        let (h, rows) = csv_rows(&pp)?;
        let cols: Vec<usize> = ["name", "num_gpu", "gpu_milli", "gpu_spec", "qos", "creation_time", "deletion_time"]
            .iter()
            .map(|c| column(&pp, &h, c))
            .collect::<Result<_, _>>()?;
        let mut out = Vec::new();
        for (line, r) in rows {
            let deletion = r.get(cols[6]).and_then(|v| v.trim().parse().ok()).unwrap_or(u64::MAX);
            out.push(TracePod {
                name: r[cols[0]].clone(),
                num_gpu: num(&pp, line, &r, cols[1], "num_gpu")?,
                gpu_milli: num(&pp, line, &r, cols[2], "gpu_milli")?,
                gpu_spec: r.get(cols[3]).map(|s| s.split('|').filter(|x| !x.is_empty()).map(str::to_string).collect()).unwrap_or_default(),
                qos: r.get(cols[4]).cloned().unwrap_or_default(),
                creation: num(&pp, line, &r, cols[5], "creation_time")?,
                deletion,
            });
        }
        Ok(Self { nodes, pods: out })
    }
}

/// Which pods a round sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ReplayMode {
    /// Every GPU pod at once, in creation order, none leaving (how the FGD simulator replays
    /// this trace); later rounds re-plan the same set from the previous round's placements.
    Snapshot,
    /// Pods alive at evenly spaced trace times (creation <= t < deletion).
    Timeline,
}

/// Every assumption the replay makes about what the trace does not say.
#[derive(Debug, Clone, Serialize)]
pub struct Assumptions {
    /// An online pod's SM activity = `gpu_milli / 10 ×` this (percent).
    pub online_sm_scale: f64,
    /// GPU memory per trace GPU model (MiB); models not listed use `default_gpu_memory_mib`.
    pub gpu_memory_mib: BTreeMap<String, u64>,
    /// GPU memory of models not in `gpu_memory_mib`, MiB.
    pub default_gpu_memory_mib: u64,
    /// Predictor model per trace GPU model (Gavel measured only K80, P100, V100).
    pub predictor_type: BTreeMap<String, String>,
    /// Predictor model for trace GPU models not in `predictor_type`.
    pub default_predictor_type: String,
    /// An offline pod's memory = `gpu_milli / 1000 ×` this.
    pub offline_memory_reference_mib: u64,
}

impl Default for Assumptions {
    fn default() -> Self {
        let mem = [("V100M16", 16384), ("V100M32", 32768), ("P100", 16384), ("T4", 15360), ("A10", 24576)];
        let pred = [("V100M16", "v100"), ("V100M32", "v100"), ("P100", "p100"), ("T4", "p100")];
        Self {
            online_sm_scale: 1.0,
            gpu_memory_mib: mem.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            default_gpu_memory_mib: 16384,
            predictor_type: pred.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            default_predictor_type: "v100".into(),
            offline_memory_reference_mib: 16384,
        }
    }
}

/// Statistics of one replayed round.
#[derive(Debug, Clone, Serialize)]
pub struct RoundReport {
    /// Round number, from 0.
    pub round: u64,
    /// Trace time the round looks at, seconds.
    pub trace_time_s: u64,
    /// GPU holders' GPUs this round (LS, Burstable and Guaranteed pods, one per GPU).
    pub online_pods: usize,
    /// GPU holders waiting for GPUs.
    pub online_unplaced: usize,
    /// Live GPU holders by QoS class (pods, not GPUs).
    pub holders_by_qos: BTreeMap<String, usize>,
    /// Multi-GPU BE pods placed on whole free GPUs.
    pub whole_gpu_placed: usize,
    /// Pods waiting, by reason (holders, multi-GPU BE pods and offline pods).
    pub waiting: BTreeMap<String, usize>,
    /// Offline (single-GPU BE) pods given to the planner.
    pub offline_pods: usize,
    /// GPUs that entered matching (see `PlanStats::candidate_gpus`).
    pub candidate_gpus: usize,
    /// Offline pod-GPU pairs given a weight.
    pub allowed_pairs: usize,
    /// Offline pods placed beside a holder (new or kept).
    pub placed: usize,
    /// Of those, pods kept where they ran last round.
    pub kept: usize,
    /// Offline pods moved or taken off their GPU.
    pub breaks: usize,
    /// Sum of predicted normalized throughput over placements.
    pub total_predicted: f64,
    /// Time to build the weights, milliseconds.
    pub weights_ms: f64,
    /// Time to solve the matching, milliseconds.
    pub matching_ms: f64,
    /// Wall time of the whole round (workloads built, planned, counted), milliseconds.
    pub round_ms: f64,
    /// CPU time of the round on this thread (from `/proc/self/schedstat`), when readable.
    pub round_cpu_ms: Option<f64>,
}

/// The whole replay.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// How pods were chosen per round.
    pub mode: ReplayMode,
    /// GPU nodes in the trace.
    pub nodes: usize,
    /// GPUs over those nodes.
    pub gpus: u32,
    /// Assumptions the replay made.
    pub assumptions: Assumptions,
    /// One report per round, in order.
    pub rounds: Vec<RoundReport>,
}

/// CPU time the main thread has run, ms (Linux `/proc/self/schedstat`, first field in ns).
fn main_thread_cpu_ms() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/schedstat").ok()?;
    Some(s.split_whitespace().next()?.parse::<f64>().ok()? / 1e6)
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Whether a pod holds its GPUs like an online workload: LS, and the Kubernetes QoS classes
/// Burstable and Guaranteed, which are not evicted for best-effort work.
fn is_holder(p: &TracePod) -> bool {
    matches!(p.qos.as_str(), "LS" | "Burstable" | "Guaranteed")
}

/// Why each offline job the plan left waiting found no GPU: no holder GPU of an allowed type
/// open to offline work, none of them with the memory, or every GPU it fits went to another job.
fn offline_waiting(cluster: &ClusterSpec, w: &Workloads, plan: &super::Plan) -> BTreeMap<&'static str, usize> {
    let skipped: std::collections::HashSet<&GpuRef> = plan.skipped_gpus.iter().map(|s| &s.at).collect();
    let nodes: HashMap<&str, &NodeSpec> = cluster.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    // Open GPUs: (GPU type, free memory cap).
    let open: Vec<(&str, u64)> = w
        .online
        .iter()
        .filter_map(|o| {
            let at = o.at.as_ref()?;
            let n = nodes.get(at.node.as_str())?;
            if skipped.contains(at) || 100.0 - o.sm_activity_percent < cluster.min_offline_sm_percent {
                return None;
            }
            let free = n.gpu_memory_mib.saturating_sub(o.memory_mib).saturating_sub(cluster.memory_headroom_mib);
            let cap = (n.gpu_memory_mib as f64 * cluster.max_offline_memory_fraction) as u64;
            Some((n.gpu_type.as_str(), free.min(cap)))
        })
        .collect();
    let unplaced: std::collections::HashSet<&str> = plan.unplaced.iter().map(String::as_str).collect();
    let mut out = BTreeMap::new();
    for j in w.offline.iter().filter(|j| unplaced.contains(j.name.as_str())) {
        let typed = |t: &str| j.gpu_types.is_empty() || j.gpu_types.iter().any(|g| g == t);
        let reason = if !open.iter().any(|(t, _)| typed(t)) {
            "no holder GPU of an allowed type with SM room"
        } else if !open.iter().any(|(t, m)| typed(t) && *m >= j.memory_mib) {
            "memory will not fit beside any holder"
        } else {
            "every GPU it fits went to another job"
        };
        *out.entry(reason).or_default() += 1;
    }
    out
}

/// Runs `rounds` placement rounds at evenly spaced trace times.
pub fn replay(
    trace: &Trace,
    gavel: &GavelData,
    predictor: &SpeedPredictor,
    rounds: usize,
    mode: ReplayMode,
    asm: Assumptions,
) -> ReplayReport {
    let profiles: Vec<&JobProfile> = gavel.profiles.values().collect();
    let profile_of = |name: &str| (!profiles.is_empty()).then(|| profiles[(fnv(name) % profiles.len() as u64) as usize].clone());
    let cluster = ClusterSpec {
        round_period_s: 900,
        state_dir: None,
        stale_after_s: 30,
        min_offline_sm_percent: 10.0,
        memory_headroom_mib: 0,
        max_offline_memory_fraction: 1.0,
        unprofiled_weight: 0.3,
        max_offline_per_gpu: 1,
        policy: Default::default(),
        scheduler_refusal_ttl_s: 300,
        nodes: trace
            .nodes
            .iter()
            .map(|n| NodeSpec {
                name: n.name.clone(),
                gpu_type: n.model.clone(),
                gpus: n.gpus,
                gpu_memory_mib: *asm.gpu_memory_mib.get(&n.model).unwrap_or(&asm.default_gpu_memory_mib),
                predictor_gpu_type: Some(asm.predictor_type.get(&n.model).unwrap_or(&asm.default_predictor_type).clone()),
            })
            .collect(),
        tenants: BTreeMap::new(),
        cells: None,
        cells_state: None,
    };
    let gpus: Vec<(usize, GpuRef)> = cluster
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| (0..n.gpus).map(move |g| (i, GpuRef { node: n.name.clone(), gpu: g })))
        .collect();
    let mut node_gpus = Vec::with_capacity(cluster.nodes.len());
    let mut first = 0;
    for n in &cluster.nodes {
        node_gpus.push(first..first + n.gpus as usize);
        first += n.gpus as usize;
    }
    let gpu_pods: Vec<&TracePod> = trace.pods.iter().filter(|p| p.num_gpu > 0).collect();
    let by_name: HashMap<&str, &TracePod> = gpu_pods.iter().map(|p| (p.name.as_str(), *p)).collect();
    let start = gpu_pods.iter().map(|p| p.creation).min().unwrap_or(0);
    let end = gpu_pods.iter().map(|p| p.creation).max().unwrap_or(0);
    let healthy = |_: &GpuRef| GpuHealth::Healthy;

    // `num_gpu` free GPUs of one node of an allowed type, first-fit.
    let first_fit = |p: &TracePod, busy: &[bool]| -> Option<Vec<usize>> {
        let fits = |i: &usize| !busy[*i] && (p.gpu_spec.is_empty() || p.gpu_spec.contains(&cluster.nodes[gpus[*i].0].gpu_type));
        node_gpus.iter().find_map(|range| {
            let free: Vec<usize> = range.clone().filter(fits).collect();
            (free.len() >= p.num_gpu as usize).then(|| free[..p.num_gpu as usize].to_vec())
        })
    };
    let mut online_at: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut whole_at: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut busy = vec![false; gpus.len()];
    let mut offline_at: HashMap<String, GpuRef> = HashMap::new();
    let mut reports = Vec::new();
    for r in 0..rounds {
        let t0 = Instant::now();
        let cpu0 = main_thread_cpu_ms();
        let t = match mode {
            ReplayMode::Snapshot => end,
            ReplayMode::Timeline => start + ((end - start) as f64 * (r as f64 + 0.5) / rounds.max(1) as f64) as u64,
        };
        let alive = |p: &TracePod| mode == ReplayMode::Snapshot || (p.creation <= t && t < p.deletion);
        let active = |p: &&&TracePod| alive(p);
        // Online pods keep their GPUs while they live; new ones take free GPUs first-fit.
        online_at.retain(|name, idx| {
            let alive = by_name.get(name).is_some_and(|p| alive(p));
            if !alive {
                idx.iter().for_each(|&i| busy[i] = false);
            }
            alive
        });
        let mut online = Vec::new();
        let mut online_unplaced = 0;
        let mut holders_by_qos: BTreeMap<String, usize> = BTreeMap::new();
        let mut waiting: BTreeMap<String, usize> = BTreeMap::new();
        for p in gpu_pods.iter().filter(active).filter(|p| is_holder(p)) {
            if !online_at.contains_key(p.name.as_str()) {
                match first_fit(p, &busy) {
                    Some(idx) => {
                        idx.iter().for_each(|&i| busy[i] = true);
                        online_at.insert(&p.name, idx);
                    }
                    None => {
                        online_unplaced += 1;
                        *waiting.entry(format!("{}: no node with {} free GPU(s) of an allowed type", p.qos, p.num_gpu)).or_default() += 1;
                        continue;
                    }
                }
            }
            *holders_by_qos.entry(p.qos.clone()).or_default() += 1;
            for (k, &i) in online_at[p.name.as_str()].iter().enumerate() {
                let node = &cluster.nodes[gpus[i].0];
                let milli = if p.num_gpu > 1 { 1000 } else { p.gpu_milli.min(1000) };
                online.push(OnlineWorkload {
                    group: None,
                    name: if k == 0 { p.name.clone() } else { format!("{}#{k}", p.name) },
                    tenant: p.qos.to_lowercase(),
                    at: Some(gpus[i].1.clone()),
                    gpu_type: None,
                    memory_mib: node.gpu_memory_mib * u64::from(milli) / 1000,
                    sm_activity_percent: (f64::from(milli) / 10.0 * asm.online_sm_scale).clamp(0.0, 100.0),
                    profile: profile_of(&p.name),
                });
            }
        }
        // Multi-GPU BE pods: whole free GPUs of one node, kept while they live.
        whole_at.retain(|name, idx| {
            let alive = by_name.get(name).is_some_and(|p| alive(p));
            if !alive {
                idx.iter().for_each(|&i| busy[i] = false);
            }
            alive
        });
        for p in gpu_pods.iter().filter(active).filter(|p| p.qos == "BE" && p.num_gpu > 1) {
            if whole_at.contains_key(p.name.as_str()) {
                continue;
            }
            match first_fit(p, &busy) {
                Some(idx) => {
                    idx.iter().for_each(|&i| busy[i] = true);
                    whole_at.insert(&p.name, idx);
                }
                None => {
                    *waiting.entry(format!("BE x{}: no node with {} whole free GPUs of an allowed type", p.num_gpu, p.num_gpu)).or_default() += 1;
                }
            }
        }
        let whole_gpu_placed = whole_at.len();
        let offline: Vec<OfflineJob> = gpu_pods
            .iter()
            .filter(active)
            .filter(|p| p.qos == "BE" && p.num_gpu == 1)
            .map(|p| OfflineJob {
                name: p.name.clone(),
                tenant: "be".into(),
                memory_mib: asm.offline_memory_reference_mib * u64::from(p.gpu_milli.min(1000)) / 1000,
                gpu_types: p.gpu_spec.clone(),
                profile: profile_of(&p.name),
                current: offline_at.get(&p.name).cloned(),
                held_memory_quota_mib: None,
                allowed_nodes: None,
                feedback: Default::default(),
            })
            .collect();
        let workloads = Workloads { online, offline };
        let plan = plan_round(&cluster, &workloads, predictor, &healthy, r as u64);
        for (reason, n) in offline_waiting(&cluster, &workloads, &plan) {
            *waiting.entry(format!("BE: {reason}")).or_default() += n;
        }
        offline_at = plan.assignments.iter().map(|a| (a.offline.clone(), a.at.clone())).collect();
        reports.push(RoundReport {
            round: r as u64,
            trace_time_s: t,
            online_pods: workloads.online.len(),
            online_unplaced,
            holders_by_qos,
            whole_gpu_placed,
            waiting,
            offline_pods: workloads.offline.len(),
            candidate_gpus: plan.stats.candidate_gpus,
            allowed_pairs: plan.stats.allowed_pairs,
            placed: plan.assignments.len(),
            kept: plan.assignments.iter().filter(|a| a.kept).count(),
            breaks: plan.breaks.len(),
            total_predicted: plan.total_predicted,
            weights_ms: plan.stats.weights_ms,
            matching_ms: plan.stats.matching_ms,
            round_ms: t0.elapsed().as_secs_f64() * 1e3,
            round_cpu_ms: cpu0.zip(main_thread_cpu_ms()).map(|(a, b)| b - a),
        });
    }
    ReplayReport {
        mode,
        nodes: trace.nodes.len(),
        gpus: trace.nodes.iter().map(|n| n.gpus).sum(),
        assumptions: asm,
        rounds: reports,
    }
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Alibaba 2023 trace: {} nodes, {} GPUs, {:?} mode, online SM = gpu_milli/10 x {}", self.nodes, self.gpus, self.mode, self.assumptions.online_sm_scale)?;
        writeln!(
            f,
            "{:>5} {:>9} {:>7} {:>8} {:>8} {:>9} {:>10} {:>7} {:>6} {:>7} {:>10} {:>10} {:>10} {:>8}",
            "round", "t(s)", "online", "on-wait", "offline", "cand-GPU", "pairs", "placed", "kept", "breaks", "weights ms", "match ms", "round ms", "cpu ms"
        )?;
        for r in &self.rounds {
            writeln!(
                f,
                "{:>5} {:>9} {:>7} {:>8} {:>8} {:>9} {:>10} {:>7} {:>6} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>8}",
                r.round, r.trace_time_s, r.online_pods, r.online_unplaced, r.offline_pods, r.candidate_gpus,
                r.allowed_pairs, r.placed, r.kept, r.breaks, r.weights_ms, r.matching_ms, r.round_ms,
                r.round_cpu_ms.map_or("-".to_string(), |c| format!("{c:.1}"))
            )?;
            let holders: Vec<String> = r.holders_by_qos.iter().map(|(q, n)| format!("{q} {n}")).collect();
            writeln!(f, "      holders: {}; multi-GPU BE on whole GPUs: {}", holders.join(", "), r.whole_gpu_placed)?;
            for (why, n) in &r.waiting {
                writeln!(f, "      waiting {n:>6}  {why}")?;
            }
        }
        let n = self.rounds.len().max(1) as f64;
        let mean = self.rounds.iter().map(|r| r.round_ms).sum::<f64>() / n;
        let max = self.rounds.iter().map(|r| r.round_ms).fold(0.0, f64::max);
        let placed: usize = self.rounds.iter().map(|r| r.placed).sum();
        let offered: usize = self.rounds.iter().map(|r| r.offline_pods).sum();
        // `offline` above counts one-GPU BE pods (the planner's jobs); multi-GPU BE pods are
        // on the `multi-GPU BE` line.
        let cpu: Vec<f64> = self.rounds.iter().filter_map(|r| r.round_cpu_ms).collect();
        let cpu_mean = cpu.iter().sum::<f64>() / cpu.len().max(1) as f64;
        writeln!(
            f,
            "mean round {mean:.1} ms wall ({cpu_mean:.1} ms CPU), max {max:.1} ms wall; placed {placed} of {offered} offline pod-rounds"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predictor::gavel;

    fn write_trace(tag: &str, nodes: &str, pods: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xshare-ali-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("openb_node_list_gpu_node.csv"), nodes).unwrap();
        std::fs::write(d.join("pods.csv"), pods).unwrap();
        d
    }

    const HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    #[test]
    fn bad_rows_name_file_and_line() {
        let d = write_trace("bad", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,two,V100M16\n", HEADER);
        let e = Trace::load(&d, "pods.csv").unwrap_err().to_string();
        assert!(e.contains("openb_node_list_gpu_node.csv:2") && e.contains("`gpu`"), "{e}");
        let d = write_trace("bad2", "sn,cpu_milli,memory_mib,gpu,model\n", "name,qos\n");
        assert!(Trace::load(&d, "pods.csv").unwrap_err().to_string().contains("no column `num_gpu`"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A fractional LS pod leaves room: the BE pod is placed beside it, and stays in the next
    /// round; a full-GPU LS pod leaves no SM room; a CPU-only pod is ignored.
    #[test]
    fn snapshot_places_be_pods_beside_fractional_ls_pods() {
        let pods = format!(
            "{HEADER}ls-a,1,1,1,460,,LS,Running,0,100,0\nls-b,1,1,1,1000,,LS,Running,1,100,1\nbe-a,1,1,1,300,,BE,Running,2,100,2\nbe-b,1,1,1,900,,BE,Running,3,100,3\ncpu,1,1,0,0,,BE,Running,3,100,3\n"
        );
        let d = write_trace("ok", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,V100M16\nn1,1,1,0,\n", &pods);
        let t = Trace::load(&d, "pods.csv").unwrap();
        assert_eq!(t.nodes.len(), 1);
        let p = gavel::data_dir().join("gavel/simulation_throughputs.json");
        let data = if p.exists() { gavel::load(&p).unwrap() } else { GavelData { profiles: Default::default(), pairs: vec![], infeasible: vec![] } };
        let r = replay(&t, &data, &SpeedPredictor::default(), 2, ReplayMode::Snapshot, Assumptions::default());
        assert_eq!(r.gpus, 2);
        let (r0, r1) = (&r.rounds[0], &r.rounds[1]);
        assert_eq!((r0.online_pods, r0.offline_pods, r0.candidate_gpus), (2, 2, 1));
        // be-b needs 90% of 16 GiB beside an online pod using 46%: forbidden by memory.
        assert_eq!((r0.allowed_pairs, r0.placed), (1, 1));
        assert_eq!((r1.placed, r1.kept, r1.breaks), (1, 1, 0));
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn no_gavel() -> GavelData {
        GavelData { profiles: Default::default(), pairs: vec![], infeasible: vec![] }
    }

    /// Burstable and Guaranteed pods hold GPUs (an LS pod arriving later finds the node full
    /// and waits with that reason); they were silently dropped before.
    #[test]
    fn burstable_and_guaranteed_pods_hold_gpus() {
        let pods = format!(
            "{HEADER}bu,1,1,2,1000,,Burstable,Running,0,100,0\ngu,1,1,1,400,,Guaranteed,Running,1,100,1\nls,1,1,1,500,,LS,Running,2,100,2\nbe,1,1,1,200,,BE,Running,3,100,3\n"
        );
        let d = write_trace("qos", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,3,V100M16\n", &pods);
        let t = Trace::load(&d, "pods.csv").unwrap();
        let r = replay(&t, &no_gavel(), &SpeedPredictor::default(), 1, ReplayMode::Snapshot, Assumptions::default());
        let r0 = &r.rounds[0];
        assert_eq!(r0.holders_by_qos, [("Burstable".to_string(), 1), ("Guaranteed".to_string(), 1)].into());
        assert_eq!((r0.online_pods, r0.online_unplaced), (3, 1));
        assert_eq!(r0.waiting.get("LS: no node with 1 free GPU(s) of an allowed type"), Some(&1), "{:?}", r0.waiting);
        // The BE pod shares the Guaranteed pod's GPU (60% SM room); the Burstable GPUs are full.
        assert_eq!((r0.candidate_gpus, r0.placed), (1, 1));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A multi-GPU BE pod takes whole free GPUs of one node (it used to be one GPU with its
    /// memory multiplied, which never fits); one that finds no such node waits with the reason,
    /// as does a one-GPU BE pod whose GPU type is absent.
    #[test]
    fn multi_gpu_be_pods_take_whole_gpus_and_waiting_pods_say_why() {
        let pods = format!(
            "{HEADER}ls,1,1,1,300,,LS,Running,0,100,0\nbe2,1,1,2,1000,,BE,Running,1,100,1\nbe4,1,1,4,1000,,BE,Running,2,100,2\nbe-t4,1,1,1,100,T4,BE,Running,3,100,3\nbe-ok,1,1,1,100,,BE,Running,4,100,4\n"
        );
        let d = write_trace("multi", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,4,V100M32\n", &pods);
        let t = Trace::load(&d, "pods.csv").unwrap();
        let r = replay(&t, &no_gavel(), &SpeedPredictor::default(), 2, ReplayMode::Snapshot, Assumptions::default());
        for r in &r.rounds {
            assert_eq!(r.whole_gpu_placed, 1, "{r:?}");
            assert_eq!(r.offline_pods, 2);
            assert_eq!(r.placed, 1);
            assert_eq!(r.waiting.get("BE x4: no node with 4 whole free GPUs of an allowed type"), Some(&1), "{:?}", r.waiting);
            assert_eq!(r.waiting.get("BE: no holder GPU of an allowed type with SM room"), Some(&1), "{:?}", r.waiting);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn real_trace_loads_whole() {
        let d = gavel::data_dir().join("alibaba-gpu-v2023");
        if !d.exists() {
            return;
        }
        let t = Trace::load(&d, "openb_pod_list_default.csv").unwrap();
        assert_eq!(t.nodes.len(), 1213);
        assert_eq!(t.nodes.iter().map(|n| n.gpus).sum::<u32>(), 6212);
        assert_eq!(t.pods.len(), 8152);
    }
}
