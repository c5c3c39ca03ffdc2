//! Trace loading: the Alibaba 2023 GPU trace (nodes, LS pods = online services, BE pods =
//! offline jobs) and Gavel's measured co-location throughputs (job types and pair truth).
//!
//! What the trace means and what this loader does with it:
//!
//! * `openb_node_list_gpu_node.csv`: every node with its GPU count and model.
//! * LS pods with `num_gpu >= 1` are online services living `[creation, deletion)`. A pod
//!   with `num_gpu = k > 1` holds `k` whole GPUs of one node (the trace's gang); a pod with
//!   `gpu_milli < 1000` holds one GPU and its load is scaled by `gpu_milli / 1000` (the trace's
//!   GPU sharing *between online pods* is left out: each online pod gets its own GPU).
//! * BE pods with `num_gpu >= 1` are offline jobs arriving at `creation` that ran
//!   `deletion - scheduled` seconds (their exclusive duration). The trace has no multi-GPU BE
//!   pod; one would be left out and counted.
//! * Left out and counted in [`LeftOut`]: pods with no GPU, Burstable / Guaranteed pods, pods
//!   never scheduled (`Pending`, no `scheduled_time`: no duration is known), pods that ended
//!   before the simulated window starts.
//! * Time: the window starts at the first BE arrival; online pods alive then start at 0.
//!   `compress` divides arrival times (not durations) by a factor, so the ~37 days of
//!   arrivals are replayed denser (MuxFlow repeats its trace "to fit in 1,000 GPUs"), and
//!   `offline_copies` repeats each BE pod with seeded arrival jitter for the same purpose.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use cluster_matcher::predictor::gavel::GavelData;
use cluster_matcher::predictor::JobProfile;
use serde::Serialize;

use crate::rng::{hash2, Rng};

/// Errors reading the trace files.
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
    /// A row (or the header) is malformed.
    #[error("{path}:{line}: {why}")]
    Row {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong (missing column, not a number).
        why: String,
    },
    /// The Gavel throughput files could not be loaded or lack what the simulator needs.
    #[error("{path}: {why}")]
    Gavel {
        /// The Gavel file or directory.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// One GPU node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    /// Node serial name from the trace.
    pub name: String,
    /// GPUs on the node.
    pub gpus: u32,
    /// GPU model (e.g. `V100M16`; may be empty).
    pub model: String,
}

/// An online service (LS pod).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlinePod {
    /// Pod name from the trace.
    pub name: String,
    /// GPUs the pod holds.
    pub gpus: u32,
    /// GPU share in milli (1000 for multi-GPU pods).
    pub milli: u32,
    /// Allowed GPU models (empty = any).
    pub spec: Vec<String>,
    /// Simulated start and end, seconds.
    pub start: f64,
    /// Simulated end, seconds (the service leaves then).
    pub end: f64,
}

/// An offline job (BE pod, or a copy of one).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OfflinePod {
    /// Pod name (copies get a `#n` suffix).
    pub name: String,
    /// GPU share asked for, thousandths of a GPU.
    pub milli: u32,
    /// Allowed GPU models (empty = any).
    pub spec: Vec<String>,
    /// Simulated arrival, seconds.
    pub arrival: f64,
    /// Exclusive run time, seconds.
    pub duration: f64,
}

/// Pods the loader did not use, by reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LeftOut {
    /// GPU-less pods.
    pub no_gpu: usize,
    /// Pods of a QoS class other than `LS` and `BE`.
    pub other_qos: usize,
    /// Pods with no `scheduled_time` (never ran in the trace).
    pub never_scheduled: usize,
    /// Online pods deleted at or before the first offline arrival (simulated time 0).
    pub ended_before_window: usize,
    /// `BE` pods asking for more than one GPU (the simulator pairs one job per GPU).
    pub multi_gpu_offline: usize,
}

/// How the trace is replayed.
#[derive(Debug, Clone, Serialize)]
pub struct TraceOptions {
    /// Arrival times are divided by this (>= 1).
    pub compress: f64,
    /// Each BE pod appears this many times (copies jittered by up to an hour).
    pub offline_copies: u32,
    /// Keep only the first this-many BE arrivals (after copies), 0 = all.
    pub max_offline: usize,
    /// Seed of the copies' jitter.
    pub seed: u64,
}

impl Default for TraceOptions {
    fn default() -> Self {
        Self {
            compress: 1.0,
            offline_copies: 1,
            max_offline: 0,
            seed: 1,
        }
    }
}

/// The loaded trace.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    /// GPU nodes.
    pub nodes: Vec<Node>,
    /// Online services, by start time.
    pub online: Vec<OnlinePod>,
    /// Offline jobs, by arrival.
    pub offline: Vec<OfflinePod>,
    /// Pods not used, by reason.
    pub left_out: LeftOut,
    /// Trace time (s) of simulated time 0.
    pub origin_s: u64,
}

struct Row<'a> {
    line: usize,
    cells: Vec<&'a str>,
}

fn read(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|e| TraceError::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

fn table<'a>(
    path: &Path,
    text: &'a str,
    want: &[&str],
) -> Result<(Vec<usize>, Vec<Row<'a>>), TraceError> {
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines
        .next()
        .map(|(_, h)| h.split(',').collect())
        .unwrap_or_default();
    let cols = want
        .iter()
        .map(|w| {
            header
                .iter()
                .position(|h| h.trim() == *w)
                .ok_or_else(|| TraceError::Row {
                    path: path.to_path_buf(),
                    line: 1,
                    why: format!("no column `{w}`"),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rows = lines
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| Row {
            line: i + 1,
            cells: l.split(',').collect(),
        })
        .collect();
    Ok((cols, rows))
}

fn cell<'a>(path: &Path, r: &Row<'a>, col: usize, name: &str) -> Result<&'a str, TraceError> {
    r.cells
        .get(col)
        .map(|s| s.trim())
        .ok_or_else(|| TraceError::Row {
            path: path.to_path_buf(),
            line: r.line,
            why: format!("column `{name}` missing"),
        })
}

fn number<T: std::str::FromStr>(
    path: &Path,
    r: &Row,
    col: usize,
    name: &str,
) -> Result<T, TraceError> {
    let s = cell(path, r, col, name)?;
    s.parse().map_err(|_| TraceError::Row {
        path: path.to_path_buf(),
        line: r.line,
        why: format!("column `{name}` = `{s}` is not a number"),
    })
}

impl Trace {
    /// Reads `openb_node_list_gpu_node.csv` and the pod list `pods` from `dir`.
    pub fn load(dir: &Path, pods: &str, opt: &TraceOptions) -> Result<Self, TraceError> {
        let np = dir.join("openb_node_list_gpu_node.csv");
        let text = read(&np)?;
        let (c, rows) = table(&np, &text, &["sn", "gpu", "model"])?;
        let mut nodes = Vec::new();
        for r in &rows {
            let gpus: u32 = number(&np, r, c[1], "gpu")?;
            if gpus > 0 {
                nodes.push(Node {
                    name: cell(&np, r, c[0], "sn")?.to_string(),
                    gpus,
                    model: cell(&np, r, c[2], "model")?.to_string(),
                });
            }
        }
        let pp = dir.join(pods);
        let text = read(&pp)?;
        let want = [
            "name",
            "num_gpu",
            "gpu_milli",
            "gpu_spec",
            "qos",
            "creation_time",
            "deletion_time",
            "scheduled_time",
        ];
        let (c, rows) = table(&pp, &text, &want)?;
        let mut left = LeftOut::default();
        struct Raw {
            name: String,
            gpus: u32,
            milli: u32,
            spec: Vec<String>,
            ls: bool,
            creation: u64,
            deletion: u64,
            scheduled: u64,
        }
        let mut raw = Vec::new();
        for r in &rows {
            let gpus: u32 = number(&pp, r, c[1], "num_gpu")?;
            let qos = cell(&pp, r, c[4], "qos")?;
            if gpus == 0 {
                left.no_gpu += 1;
                continue;
            }
            if qos != "LS" && qos != "BE" {
                left.other_qos += 1;
                continue;
            }
            if cell(&pp, r, c[7], "scheduled_time")?.is_empty() {
                left.never_scheduled += 1;
                continue;
            }
            if qos == "BE" && gpus > 1 {
                left.multi_gpu_offline += 1;
                continue;
            }
            let spec = cell(&pp, r, c[3], "gpu_spec")?
                .split('|')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            raw.push(Raw {
                name: cell(&pp, r, c[0], "name")?.to_string(),
                gpus,
                milli: number::<u32>(&pp, r, c[2], "gpu_milli")?.min(1000),
                spec,
                ls: qos == "LS",
                creation: number(&pp, r, c[5], "creation_time")?,
                deletion: number(&pp, r, c[6], "deletion_time")?,
                scheduled: number(&pp, r, c[7], "scheduled_time")?,
            });
        }
        let origin = raw
            .iter()
            .filter(|p| !p.ls)
            .map(|p| p.creation)
            .min()
            .unwrap_or(0);
        let k = opt.compress.max(1.0);
        let at = |t: u64| (t.saturating_sub(origin)) as f64 / k;
        let mut online = Vec::new();
        let mut offline = Vec::new();
        for p in &raw {
            if p.ls {
                if p.deletion <= origin {
                    left.ended_before_window += 1;
                    continue;
                }
                let start = at(p.creation);
                let life = (p.deletion - p.creation.max(origin)) as f64;
                online.push(OnlinePod {
                    name: p.name.clone(),
                    gpus: p.gpus,
                    milli: if p.gpus > 1 { 1000 } else { p.milli.max(1) },
                    spec: p.spec.clone(),
                    start,
                    end: start + life.max(1.0),
                });
            } else {
                let duration = p.deletion.saturating_sub(p.scheduled).max(1) as f64;
                for copy in 0..opt.offline_copies.max(1) {
                    let jitter = if copy == 0 {
                        0.0
                    } else {
                        Rng::new(hash2(opt.seed, &format!("{}#{copy}", p.name))).unit() * 3600.0
                    };
                    offline.push(OfflinePod {
                        name: if copy == 0 {
                            p.name.clone()
                        } else {
                            format!("{}#{copy}", p.name)
                        },
                        milli: p.milli.max(1),
                        spec: p.spec.clone(),
                        arrival: at(p.creation) + jitter,
                        duration,
                    });
                }
            }
        }
        online.sort_by(|a, b| {
            a.start
                .total_cmp(&b.start)
                .then_with(|| a.name.cmp(&b.name))
        });
        offline.sort_by(|a, b| {
            a.arrival
                .total_cmp(&b.arrival)
                .then_with(|| a.name.cmp(&b.name))
        });
        if opt.max_offline > 0 {
            offline.truncate(opt.max_offline);
        }
        Ok(Self {
            nodes,
            online,
            offline,
            left_out: left,
            origin_s: origin,
        })
    }

    /// Last offline arrival (s), 0 without offline jobs.
    pub fn last_arrival(&self) -> f64 {
        self.offline.iter().map(|o| o.arrival).fold(0.0, f64::max)
    }
}

/// Gavel job types and the measured pair truth.
#[derive(Debug, Clone)]
pub struct JobTypes {
    /// Job names usable as types (profiled on every GPU type the simulator uses), sorted.
    pub names: Vec<String>,
    /// Profile of each type, `profiles[i]` that of `names[i]` (fed to the predictor).
    pub profiles: Vec<JobProfile>,
    /// `(gpu, offline idx, online idx)` -> (offline normalized, online normalized) when both ran.
    pairs: HashMap<(String, usize, usize), (f64, f64)>,
    /// Per `(gpu, job)` the mean normalized throughput over its measured pairs (fallback).
    mean_norm: HashMap<(String, usize), f64>,
}

/// GPU types whose pair measurements the simulator uses (the predictor types).
pub const GAVEL_TYPES: [&str; 3] = ["k80", "p100", "v100"];

impl JobTypes {
    /// Reads Gavel's `simulation_throughputs.json`.
    pub fn load(path: &Path) -> Result<Self, TraceError> {
        let data =
            cluster_matcher::predictor::gavel::load(path).map_err(|e| TraceError::Gavel {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?;
        Ok(Self::from_data(&data))
    }

    /// Builds the types from parsed Gavel data.
    pub fn from_data(data: &GavelData) -> Self {
        let names: Vec<String> = data
            .profiles
            .iter()
            .filter(|(_, p)| GAVEL_TYPES.iter().all(|g| p.isolated.contains_key(*g)))
            .map(|(n, _)| n.clone())
            .collect();
        let idx: BTreeMap<&str, usize> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i))
            .collect();
        let profiles = names.iter().map(|n| data.profiles[n].clone()).collect();
        let mut one: HashMap<(String, usize, usize), f64> = HashMap::new();
        for p in &data.pairs {
            if let (Some(&a), Some(&b)) = (idx.get(p.offline.as_str()), idx.get(p.online.as_str()))
            {
                one.insert((p.gpu.clone(), a, b), p.normalized);
            }
        }
        let mut pairs = HashMap::new();
        let mut sums: HashMap<(String, usize), (f64, usize)> = HashMap::new();
        for ((g, a, b), v) in &one {
            if let Some(w) = one.get(&(g.clone(), *b, *a)) {
                pairs.insert((g.clone(), *a, *b), (*v, *w));
            }
            let e = sums.entry((g.clone(), *a)).or_default();
            e.0 += v;
            e.1 += 1;
        }
        let mean_norm = sums
            .into_iter()
            .map(|(k, (s, n))| (k, s / n as f64))
            .collect();
        Self {
            names,
            profiles,
            pairs,
            mean_norm,
        }
    }

    /// Seeded type of a pod: a hash of the seed and its name picks one of the types.
    pub fn assign(&self, seed: u64, name: &str) -> usize {
        (hash2(seed, name) % self.names.len().max(1) as u64) as usize
    }

    /// Measured `(offline, online)` normalized throughputs of `off` next to `on` on `gpu` when
    /// both run unrestricted; `measured` is false when Gavel has no usable pair (it could not
    /// co-locate them, `[0, 0]`, or never ran them), and each side's mean over its measured
    /// pairs stands in.
    pub fn pair(&self, gpu: &str, off: usize, on: usize) -> (f64, f64, bool) {
        if let Some(&(a, b)) = self.pairs.get(&(gpu.to_string(), off, on)) {
            return (a, b, true);
        }
        let m = |j| *self.mean_norm.get(&(gpu.to_string(), j)).unwrap_or(&0.5);
        (m(off), m(on), false)
    }
}
