//! Input files of a placement round: the cluster (`cluster.json`) and the workloads
//! (`workloads.json`), with checks that name the field at fault.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::policy::{JobFeedback, Policy};
use crate::predictor::JobProfile;

/// Errors reading or checking the plan's input files.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid JSON for its type.
    #[error("{path}:{line}:{column}: {why}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        why: String,
    },
    /// The file parses but a value breaks a rule (range, duplicate, unknown name).
    #[error("{path}: {field}: {why}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Path of the offending field (e.g. `nodes[2].gpus`).
        field: String,
        /// What is wrong with it.
        why: String,
    },
}

/// The cluster: nodes and their GPUs, round settings, tenant rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Seconds between placement rounds.
    #[serde(default = "default_period")]
    pub round_period_s: u64,
    /// Where node monitors publish `<node>/gpu<i>.json` (relative to this file); absent =
    /// every GPU taken as Healthy.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// A state file older than this is stale (not Healthy).
    #[serde(default = "default_stale")]
    pub stale_after_s: u64,
    /// Lowest SM percentage worth giving an offline job; below it the pair is forbidden.
    #[serde(default = "default_min_sm")]
    pub min_offline_sm_percent: f64,
    /// GPU memory kept free beside the online workload's and offline job's use.
    #[serde(default = "default_headroom")]
    pub memory_headroom_mib: u64,
    /// Largest share of a GPU's memory an offline job's quota may take.
    #[serde(default = "default_quota_fraction")]
    pub max_offline_memory_fraction: f64,
    /// Edge weight used when a job has no profile the predictor can use.
    #[serde(default = "default_weight")]
    pub unprofiled_weight: f64,
    /// HiveD cells config (relative to this file): online workloads then take guaranteed
    /// cells of their tenant's virtual cluster and offline jobs low-priority (colocated)
    /// cells of the same GPUs.
    #[serde(default)]
    pub cells: Option<PathBuf>,
    /// Cells mode: where the cells ledger (who holds which cell) is kept between rounds and
    /// across restarts (relative to this file); absent = kept in memory only.
    #[serde(default)]
    pub cells_state: Option<PathBuf>,
    /// Offline jobs per online GPU (1 = MuxFlow's pairing).
    #[serde(default = "default_per_gpu")]
    pub max_offline_per_gpu: usize,
    /// Offline allocation policy of a round: `max-throughput` (default, MuxFlow's KM),
    /// `gavel-max-min`, `drf`, `optimus` or `gandiva` (see [`crate::policy`]).
    #[serde(default)]
    pub policy: Policy,
    /// Scheduler extender, watched inputs: how long a node kube-scheduler's own filters
    /// kept from an offline job (the plan's node missing from the nodes it asked about) stays
    /// refused to that job in the rounds' plans, seconds; then it is planned again (its CPU or
    /// memory may have freed up). 0: never remembered (the plan keeps offering that node).
    #[serde(default = "default_refusal_ttl")]
    pub scheduler_refusal_ttl_s: u64,
    /// GPU hosts of the cluster.
    pub nodes: Vec<NodeSpec>,
    /// Per-tenant sharing rules, by tenant (virtual cluster) name.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantRule>,
}

fn default_period() -> u64 {
    60
}
fn default_stale() -> u64 {
    30
}
fn default_min_sm() -> f64 {
    10.0
}
fn default_headroom() -> u64 {
    512
}
fn default_quota_fraction() -> f64 {
    0.4
}
fn default_weight() -> f64 {
    0.3
}
fn default_per_gpu() -> usize {
    1
}
fn default_refusal_ttl() -> u64 {
    300
}
/// Longest `scheduler_refusal_ttl_s` accepted: a day.
pub const MAX_SCHEDULER_REFUSAL_TTL_S: u64 = 86_400;

/// One GPU host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Node name, as Kubernetes and the health files name it.
    pub name: String,
    /// GPU model as the operator names it (`V100M32`, `T4`, ...).
    pub gpu_type: String,
    /// Number of GPUs.
    pub gpus: u32,
    /// Memory per GPU.
    pub gpu_memory_mib: u64,
    /// Which predictor model to use for this GPU type (`k80`, `p100`, `v100`); defaults to
    /// `gpu_type` lower-cased.
    #[serde(default)]
    pub predictor_gpu_type: Option<String>,
}

impl NodeSpec {
    /// Predictor model name for this node's GPUs.
    pub fn model_type(&self) -> String {
        self.predictor_gpu_type
            .clone()
            .unwrap_or_else(|| self.gpu_type.to_lowercase())
    }
}

/// What a tenant allows on the GPUs its online workloads hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRule {
    /// Never share this tenant's online GPUs with offline work.
    #[serde(default)]
    pub no_offline_sharing: bool,
    /// Offline tenants refused on this tenant's online GPUs.
    #[serde(default)]
    pub deny_offline_from: BTreeSet<String>,
}

/// A GPU by node name and index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuRef {
    /// Node name.
    pub node: String,
    /// GPU index on the node (as NVML numbers it).
    pub gpu: u32,
}

/// Online and offline work for this round.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workloads {
    /// Latency-critical services, each holding (or asking for) one GPU.
    #[serde(default)]
    pub online: Vec<OnlineWorkload>,
    /// Best-effort jobs to place beside them.
    #[serde(default)]
    pub offline: Vec<OfflineJob>,
}

/// A latency-critical service holding one GPU (a guaranteed cell of its tenant's VC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "OnlineRaw", into = "OnlineRaw")]
pub struct OnlineWorkload {
    /// Unique name of the service (offline jobs' `online` refers to it).
    pub name: String,
    /// Tenant, which is also its virtual cluster when cells are configured.
    pub tenant: String,
    /// The GPU it holds; `None` asks the cells to place it (cluster `cells` set).
    pub at: Option<GpuRef>,
    /// GPU type wanted when the cells place it (a cells chain `gpu_type`); any when absent.
    pub gpu_type: Option<String>,
    /// Affinity group (cells mode): the group's members waiting for a GPU are placed all
    /// together or not at all (HiveD's gang semantics).
    pub group: Option<String>,
    /// GPU memory the service uses.
    pub memory_mib: u64,
    /// Its measured SM activity (0-100); the offline job gets the complement.
    pub sm_activity_percent: f64,
    /// Profile fed to the speed predictor; `None` gives pairs the cluster's unprofiled weight.
    pub profile: Option<JobProfile>,
}

/// Wire form of [`OnlineWorkload`]: `node` and `gpu` are given together or not at all.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnlineRaw {
    name: String,
    tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    memory_mib: u64,
    sm_activity_percent: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    profile: Option<JobProfile>,
}

impl TryFrom<OnlineRaw> for OnlineWorkload {
    type Error = String;

    fn try_from(r: OnlineRaw) -> Result<Self, String> {
        let at = match (r.node, r.gpu) {
            (Some(node), Some(gpu)) => Some(GpuRef { node, gpu }),
            (None, None) => None,
            _ => return Err(format!("online workload `{}`: give `node` and `gpu` together, or neither", r.name)),
        };
        Ok(Self {
            name: r.name,
            tenant: r.tenant,
            at,
            gpu_type: r.gpu_type,
            group: r.group,
            memory_mib: r.memory_mib,
            sm_activity_percent: r.sm_activity_percent,
            profile: r.profile,
        })
    }
}

impl From<OnlineWorkload> for OnlineRaw {
    fn from(o: OnlineWorkload) -> Self {
        let (node, gpu) = o.at.map_or((None, None), |g| (Some(g.node), Some(g.gpu)));
        Self {
            name: o.name,
            tenant: o.tenant,
            node,
            gpu,
            gpu_type: o.gpu_type,
            group: o.group,
            memory_mib: o.memory_mib,
            sm_activity_percent: o.sm_activity_percent,
            profile: o.profile,
        }
    }
}

/// A best-effort training job waiting for (or already in) a shared GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineJob {
    /// Unique name of the job.
    pub name: String,
    /// Tenant it belongs to (tenant rules may keep it off some GPUs).
    pub tenant: String,
    /// GPU memory the job needs.
    pub memory_mib: u64,
    /// GPU types it may run on (node `gpu_type` names); empty = any.
    #[serde(default)]
    pub gpu_types: Vec<String>,
    /// Profile fed to the speed predictor; `None` gives its pairs the cluster's unprofiled weight.
    #[serde(default)]
    pub profile: Option<JobProfile>,
    /// Where it runs now, if it was placed in an earlier round.
    #[serde(default)]
    pub current: Option<GpuRef>,
    /// The GPU memory quota it runs with where it runs now (`current`), MiB: what its pod was
    /// bound with and its shim enforces for the pod's life (node-agent freezes the plan a pod
    /// started with). A round that keeps the job there charges the GPU this, not
    /// `memory_mib`, and gives the job no other; `None`: `memory_mib` is charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_memory_quota_mib: Option<u64>,
    /// The only nodes it may be placed on, when known: those kube-scheduler's own filters
    /// (resources, taints, node selector, affinity) last offered for its pod, after they left
    /// out the node a round had planned (the extender's `scheduler_refusal_ttl_s`). `None`:
    /// any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_nodes: Option<std::collections::BTreeSet<String>>,
    /// What was observed of it (remaining work, measured speed), for the policies that use it.
    #[serde(default, skip_serializing_if = "JobFeedback::is_empty")]
    pub feedback: JobFeedback,
}

fn read(path: &Path) -> Result<String, SpecError> {
    std::fs::read_to_string(path).map_err(|e| SpecError::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, SpecError> {
    serde_json::from_str(text).map_err(|e| SpecError::Parse {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        why: e.to_string(),
    })
}

fn invalid(path: &Path, field: impl Into<String>, why: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        path: path.to_path_buf(),
        field: field.into(),
        why: why.into(),
    }
}

/// The largest `unprofiled_weight` accepted: ten times a job's solo speed, far above any pair's.
pub const MAX_UNPROFILED_WEIGHT: f64 = 10.0;

impl ClusterSpec {
    /// Reads and checks `cluster.json`.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        let mut spec: Self = parse(path, &read(path)?)?;
        spec.check(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        for p in [spec.state_dir.as_mut(), spec.cells.as_mut(), spec.cells_state.as_mut()].into_iter().flatten() {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        Ok(spec)
    }

    /// Checks values serde cannot; `path` only labels errors.
    pub fn check(&self, path: &Path) -> Result<(), SpecError> {
        if self.round_period_s == 0 {
            return Err(invalid(path, "round_period_s", "must be at least 1"));
        }
        if !(0.0..=100.0).contains(&self.min_offline_sm_percent) {
            return Err(invalid(path, "min_offline_sm_percent", "must be within 0..=100"));
        }
        if !(self.max_offline_memory_fraction > 0.0 && self.max_offline_memory_fraction <= 1.0) {
            return Err(invalid(path, "max_offline_memory_fraction", "must be within (0, 1]"));
        }
        // A normalized throughput (0.3 by default: a fraction of the job's solo speed). Far
        // above any prediction it would also push a policy's tiers past the matcher's weight
        // bound (DRF's admission bonus is the round's largest weight times the jobs placed):
        // the round would then place nothing.
        if !(self.unprofiled_weight.is_finite() && (0.0..=MAX_UNPROFILED_WEIGHT).contains(&self.unprofiled_weight)) {
            return Err(invalid(
                path,
                "unprofiled_weight",
                "must be a normalized throughput within 0..=10 (a fraction of the job's solo speed; default 0.3)",
            ));
        }
        if self.max_offline_per_gpu == 0 {
            return Err(invalid(path, "max_offline_per_gpu", "must be at least 1"));
        }
        if self.scheduler_refusal_ttl_s > MAX_SCHEDULER_REFUSAL_TTL_S {
            return Err(invalid(
                path,
                "scheduler_refusal_ttl_s",
                format!("must be within 0..={MAX_SCHEDULER_REFUSAL_TTL_S} (a day): a node freed later is planned again only after it"),
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            // A host with several GPU types is one entry per type (HiveD: several chains on
            // one node); the same host and type twice is an error.
            if !seen.insert((&n.name, &n.gpu_type)) {
                return Err(invalid(
                    path,
                    format!("nodes[{i}].name"),
                    format!("duplicate node `{}` with GPU type `{}`", n.name, n.gpu_type),
                ));
            }
            if n.gpus == 0 || n.gpu_memory_mib == 0 {
                return Err(invalid(path, format!("nodes[{i}]"), "gpus and gpu_memory_mib must be positive"));
            }
        }
        Ok(())
    }

    /// Node by name (its first entry when the host has several GPU types).
    pub fn node(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The node entry a GPU belongs to: a host listed once per GPU type numbers its GPUs
    /// 0.. through its entries in file order (first entry's GPUs first).
    pub fn node_for(&self, at: &GpuRef) -> Option<&NodeSpec> {
        let mut base = 0;
        for n in self.nodes.iter().filter(|n| n.name == at.node) {
            if at.gpu < base + n.gpus {
                return Some(n);
            }
            base += n.gpus;
        }
        None
    }
}

impl Workloads {
    /// Reads `workloads.json` and checks it against the cluster.
    pub fn load(path: &Path, cluster: &ClusterSpec) -> Result<Self, SpecError> {
        let w: Self = parse(path, &read(path)?)?;
        w.check(path, cluster)?;
        Ok(w)
    }

    /// Names unique, GPUs exist, one online workload per GPU, numbers in range.
    pub fn check(&self, path: &Path, cluster: &ClusterSpec) -> Result<(), SpecError> {
        let gpu_exists = |g: &GpuRef| cluster.node_for(g).is_some();
        let mut names = BTreeSet::new();
        let mut held = BTreeSet::new();
        for (i, o) in self.online.iter().enumerate() {
            let f = |s: &str| format!("online[{i}].{s}");
            if !names.insert(&o.name) {
                return Err(invalid(path, f("name"), format!("duplicate workload `{}`", o.name)));
            }
            if let Some(at) = &o.at {
                if !gpu_exists(at) {
                    return Err(invalid(path, f("node"), format!("no GPU {} on node `{}`", at.gpu, at.node)));
                }
                if !held.insert(at) {
                    return Err(invalid(path, f("gpu"), format!("GPU {}/{} already holds an online workload", at.node, at.gpu)));
                }
            } else if cluster.cells.is_none() {
                return Err(invalid(path, f("node"), "missing (only a cluster with `cells` places online workloads itself)"));
            }
            let largest = cluster.nodes.iter().map(|n| n.gpu_memory_mib).max().unwrap_or(0);
            match o.at.as_ref().and_then(|at| cluster.node_for(at)) {
                Some(n) if o.memory_mib > n.gpu_memory_mib => {
                    return Err(invalid(
                        path,
                        f("memory_mib"),
                        format!(
                            "online workload `{}` uses {} MiB, more than its GPU {}/{} has ({} MiB)",
                            o.name,
                            o.memory_mib,
                            n.name,
                            o.at.as_ref().map_or(0, |a| a.gpu),
                            n.gpu_memory_mib
                        ),
                    ));
                }
                None if o.memory_mib > largest => {
                    return Err(invalid(
                        path,
                        f("memory_mib"),
                        format!("online workload `{}` uses {} MiB, more than any GPU of the cluster has ({largest} MiB)", o.name, o.memory_mib),
                    ));
                }
                _ => {}
            }
            if !(0.0..=100.0).contains(&o.sm_activity_percent) {
                return Err(invalid(path, f("sm_activity_percent"), "must be within 0..=100"));
            }
        }
        for (i, j) in self.offline.iter().enumerate() {
            let f = |s: &str| format!("offline[{i}].{s}");
            if !names.insert(&j.name) {
                return Err(invalid(path, f("name"), format!("duplicate workload `{}`", j.name)));
            }
            if let Some(c) = &j.current {
                if !gpu_exists(c) {
                    return Err(invalid(path, f("current"), format!("no GPU {} on node `{}`", c.gpu, c.node)));
                }
                let others: Vec<&str> = self.offline[..i]
                    .iter()
                    .filter(|o| o.current.as_ref() == Some(c))
                    .map(|o| o.name.as_str())
                    .collect();
                if others.len() >= cluster.max_offline_per_gpu {
                    return Err(invalid(
                        path,
                        f("current"),
                        format!(
                            "offline job `{}` runs on GPU {}/{} beside {} already ({}), over max_offline_per_gpu = {}",
                            j.name,
                            c.node,
                            c.gpu,
                            others.len(),
                            others.join(", "),
                            cluster.max_offline_per_gpu
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `unprofiled_weight` of 1e95 passed (finite, non-negative): DRF's admission bonus, the
    /// round's largest weight times the jobs it may place, then passed the matcher's weight
    /// bound and the round placed nothing. It is a normalized throughput: 0..=10.
    #[test]
    fn the_unprofiled_weight_is_a_normalized_throughput() {
        let with = |w: &str| {
            let c: ClusterSpec = serde_json::from_str(&format!(
                r#"{{"nodes": [{{"name": "n", "gpu_type": "V100", "gpus": 1, "gpu_memory_mib": 16000}}], "unprofiled_weight": {w}}}"#
            ))
            .unwrap();
            c.check(Path::new("cluster.json"))
        };
        for ok in ["0", "0.3", "10"] {
            assert!(with(ok).is_ok(), "{ok}");
        }
        for bad in ["10.5", "1e95", "-0.1"] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains("unprofiled_weight") && e.contains("0..=10"), "{bad}: {e}");
        }
    }
}
