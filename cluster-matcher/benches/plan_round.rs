//! A full `plan` round at cluster scale with realistic classes, and its scale curve.
//!
//! ```text
//! cargo bench -p cluster-matcher --bench plan_round -- [--sizes 1000,3000,10000,30000,100000]
//!     [--jobs-per-gpu 3] [--check-upto 10000] [--per-gpu 1]
//! ```
//! Each size runs in its own process (peak RSS is per process): GPUs are the Alibaba
//! trace's nodes (`alibaba-gpu-v2023`, its GPU models and per-node GPU counts) repeated
//! until the size is reached; one online workload per GPU and `jobs-per-gpu` offline jobs
//! per GPU, each with the profile of one of Gavel's 26 job types (`gavel/`), memory by job
//! type, online memory in three levels of the GPU's, four online tenants (one refusing an
//! offline tenant), a quarter of the jobs limited to one GPU model; the shipped predictor
//! (`examples/speed-predictor.json`). Round 1 is cold; round 2 replaces 1 % of the jobs,
//! gives the others their round-1 GPU as `current` and runs warm from round 1. With
//! `--check-upto N` sizes up to N also run round 1 with the pairwise solver and compare
//! totals (exit 1 if they differ). Data: `$XSHARE_DATA_DIR`, else `../shared/data`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use cluster_matcher::plan::alibaba::Trace;
use cluster_matcher::plan::spec::TenantRule;
use cluster_matcher::plan::{
    ClusterSpec, GpuHealth, GpuRef, NodeSpec, OfflineJob, OnlineWorkload, Planner, SolverChoice,
    Workloads,
};
use cluster_matcher::predictor::gavel::{data_dir, load};
use cluster_matcher::predictor::SpeedPredictor;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn build(gpus: usize, jobs_per_gpu: usize, per_gpu: usize) -> (ClusterSpec, Workloads) {
    let data = data_dir();
    let gavel = load(&data.join("gavel/simulation_throughputs.json")).expect("Gavel data");
    let profiles: Vec<_> = gavel.profiles.values().cloned().collect();
    let trace = Trace::load(
        &data.join("alibaba-gpu-v2023"),
        "openb_pod_list_default.csv",
    )
    .expect("Alibaba trace");
    let asm = cluster_matcher::plan::alibaba::Assumptions::default();
    let mut rng = Rng(42);
    let mut nodes = Vec::new();
    let mut online = Vec::new();
    let mut total = 0usize;
    let mut rep = 0;
    'outer: loop {
        for n in &trace.nodes {
            if total >= gpus {
                break 'outer;
            }
            let count = (n.gpus as usize).min(gpus - total) as u32;
            let name = format!("{}-r{rep}", n.name);
            let mem = *asm
                .gpu_memory_mib
                .get(&n.model)
                .unwrap_or(&asm.default_gpu_memory_mib);
            nodes.push(NodeSpec {
                name: name.clone(),
                gpu_type: n.model.clone(),
                gpus: count,
                gpu_memory_mib: mem,
                predictor_gpu_type: Some(
                    asm.predictor_type
                        .get(&n.model)
                        .unwrap_or(&asm.default_predictor_type)
                        .clone(),
                ),
            });
            for g in 0..count {
                let p = rng.below(profiles.len());
                online.push(OnlineWorkload {
                    name: format!("on-{}", online.len()),
                    tenant: format!("svc-{}", rng.below(4)),
                    at: Some(GpuRef {
                        node: name.clone(),
                        gpu: g,
                    }),
                    gpu_type: None,
                    group: None,
                    memory_mib: mem * [2, 3, 4][rng.below(3)] / 8,
                    sm_activity_percent: 20.0 + 50.0 * (rng.below(1000) as f64 / 1000.0),
                    profile: Some(profiles[p].clone()),
                });
            }
            total += count as usize;
        }
        rep += 1;
    }
    let models: Vec<String> = nodes
        .iter()
        .map(|n| n.gpu_type.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let offline = (0..gpus * jobs_per_gpu)
        .map(|i| {
            let p = rng.below(profiles.len());
            OfflineJob {
                name: format!("off-{i}"),
                tenant: format!("team-{}", rng.below(3)),
                memory_mib: [1024, 2048, 3072, 4096][p % 4],
                gpu_types: if rng.below(4) == 0 {
                    vec![models[rng.below(models.len())].clone()]
                } else {
                    vec![]
                },
                profile: Some(profiles[p].clone()),
                current: None,
                held_memory_quota_mib: None,
                allowed_nodes: None,
                feedback: Default::default(),
            }
        })
        .collect();
    let mut tenants = BTreeMap::new();
    tenants.insert(
        "svc-0".to_string(),
        TenantRule {
            no_offline_sharing: false,
            deny_offline_from: ["team-2".to_string()].into(),
        },
    );
    let cluster = ClusterSpec {
        round_period_s: 60,
        state_dir: None,
        stale_after_s: 30,
        min_offline_sm_percent: 10.0,
        memory_headroom_mib: 512,
        max_offline_memory_fraction: 0.4,
        unprofiled_weight: 0.3,
        cells: None,
        cells_state: None,
        max_offline_per_gpu: per_gpu,
        policy: Default::default(),
        scheduler_refusal_ttl_s: 300,
        nodes,
        tenants,
    };
    (cluster, Workloads { online, offline })
}

fn one(gpus: usize, jobs_per_gpu: usize, per_gpu: usize, check: bool) {
    let predictor = SpeedPredictor::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/speed-predictor.json"),
    )
    .expect("predictor");
    let (cluster, mut w) = build(gpus, jobs_per_gpu, per_gpu);
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let rss0 = status_kib("VmRSS:");
    let mut planner = Planner::new(SolverChoice::Auto);
    let t = Instant::now();
    let p1 = planner.plan_round(&cluster, &w, &predictor, &healthy, 1);
    let t1 = t.elapsed().as_secs_f64();
    let hwm = status_kib("VmHWM:");
    // Round 2: 1 % of the jobs replaced, the rest where round 1 put them.
    let placed: BTreeMap<&str, &GpuRef> = p1
        .assignments
        .iter()
        .map(|a| (a.offline.as_str(), &a.at))
        .collect();
    let mut w2 = w.clone();
    for (i, j) in w2.offline.iter_mut().enumerate() {
        j.current = placed.get(j.name.as_str()).map(|g| (*g).clone());
        if i % 100 == 0 {
            j.name = format!("new-{i}");
            j.current = None;
        }
    }
    let t = Instant::now();
    let p2 = planner.plan_round(&cluster, &w2, &predictor, &healthy, 2);
    let t2 = t.elapsed().as_secs_f64();
    let mut cold = Planner::new(SolverChoice::Auto);
    let t = Instant::now();
    let p2c = cold.plan_round(&cluster, &w2, &predictor, &healthy, 2);
    let t2c = t.elapsed().as_secs_f64();
    let mut checked = String::from("-");
    let mut ok =
        (p2.total_predicted - p2c.total_predicted).abs() <= 1e-9 * p2c.total_predicted.max(1.0);
    if check {
        w.offline.iter_mut().for_each(|j| j.current = None);
        let t = Instant::now();
        let pp =
            Planner::new(SolverChoice::Pairwise).plan_round(&cluster, &w, &predictor, &healthy, 1);
        let tp = t.elapsed().as_secs_f64();
        let same =
            (pp.total_predicted - p1.total_predicted).abs() <= 1e-9 * pp.total_predicted.max(1.0);
        ok &= same;
        checked = format!(
            "pairwise {:.6} in {:.1} s ({})",
            pp.total_predicted,
            tp,
            if same { "equal" } else { "DIFFERS" }
        );
    }
    let s = &p1.stats;
    println!(
        "{:>7} {:>7} {:>9.3} {:>8.3} {:>8.3} {:>7} {:>7} {:>9.0} {:>9.0} {:>8.3} {:>8.3} {:>11} {:>7} {:>14.6}  {}",
        gpus,
        w.offline.len(),
        t1,
        s.weights_ms / 1e3,
        s.matching_ms / 1e3,
        s.gpu_classes,
        s.job_classes,
        (hwm.saturating_sub(rss0)) as f64 / 1024.0,
        hwm as f64 / 1024.0,
        t2,
        t2c,
        format!("{:?}", p2.stats.start.map(|x| format!("{x:?}")).unwrap_or_else(|| p2.stats.solver.clone())),
        p1.assignments.len(),
        p1.total_predicted,
        checked
    );
    if !ok {
        eprintln!(
            "totals differ (warm {} cold {})",
            p2.total_predicted, p2c.total_predicted
        );
        std::process::exit(1);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|k| args.get(k + 1))
    };
    let jobs_per_gpu: usize = value("--jobs-per-gpu")
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let per_gpu: usize = value("--per-gpu").and_then(|s| s.parse().ok()).unwrap_or(1);
    let check_upto: usize = value("--check-upto")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if let Some(n) = value("--one").and_then(|s| s.parse::<usize>().ok()) {
        one(n, jobs_per_gpu, per_gpu, n <= check_upto);
        return;
    }
    let sizes: Vec<usize> = value("--sizes")
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1000, 3000, 10_000, 30_000, 100_000]);
    println!("max_offline_per_gpu {per_gpu}; round 1 cold; round 2 = 1 % jobs replaced, warm vs cold; MB = MiB");
    println!(
        "{:>7} {:>7} {:>9} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9} {:>8} {:>8} {:>11} {:>7} {:>14}  check",
        "GPUs",
        "jobs",
        "round s",
        "weights",
        "match",
        "GPU cl",
        "job cl",
        "round MB",
        "peak MB",
        "r2 warm",
        "r2 cold",
        "r2 start",
        "placed",
        "total"
    );
    let exe = std::env::current_exe().expect("own path");
    let mut ok = true;
    for n in sizes {
        let status = std::process::Command::new(&exe)
            .args([
                "--one",
                &n.to_string(),
                "--jobs-per-gpu",
                &jobs_per_gpu.to_string(),
            ])
            .args([
                "--per-gpu",
                &per_gpu.to_string(),
                "--check-upto",
                &check_upto.to_string(),
            ])
            .status()
            .expect("run one size");
        ok &= status.success();
    }
    if !ok {
        std::process::exit(1);
    }
}
