//! Placement rounds: optimality, forbidden pairs, health filtering, SM and memory quotas,
//! several jobs per GPU, and input-file errors.

mod plan_support;

use std::path::Path;
use std::time::{Duration, SystemTime};

use cluster_matcher::plan::health::write_state;
use cluster_matcher::plan::{
    health_fn, plan_round, ClusterSpec, GpuHealth, GpuRef, HealthReader, SpecError, Workloads,
};
use plan_support::*;
use proptest::prelude::*;

fn healthy(_: &GpuRef) -> GpuHealth {
    GpuHealth::Healthy
}

/// Best total over every partial one-to-one assignment, by brute force.
fn brute_force(w: &[Vec<Option<f64>>]) -> f64 {
    fn go(w: &[Vec<Option<f64>>], row: usize, used: &mut Vec<bool>) -> f64 {
        if row == w.len() {
            return 0.0;
        }
        let mut best = go(w, row + 1, used);
        for c in 0..used.len() {
            if let (false, Some(x)) = (used[c], w[row][c]) {
                used[c] = true;
                best = best.max(x + go(w, row + 1, used));
                used[c] = false;
            }
        }
        best
    }
    let cols = w.first().map_or(0, Vec::len);
    go(w, 0, &mut vec![false; cols])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The plan's total predicted throughput is the true optimum (the matching is exact), and
    /// no forbidden (memory) pair is ever used.
    #[test]
    fn plan_is_optimal_against_brute_force(
        gpus in prop::collection::vec((1.0f64..100.0, 0u64..12_000), 1..5),
        jobs in prop::collection::vec((1.0f64..100.0, 1_000u64..10_000), 1..6),
    ) {
        let c = cluster(&[("n", "V100", gpus.len() as u32, 16_000)]);
        let w = Workloads {
            online: gpus.iter().enumerate().map(|(i, (iso, mem))| online(&format!("on{i}"), "n", i as u32, *mem, 30.0, *iso)).collect(),
            offline: jobs.iter().enumerate().map(|(j, (iso, mem))| offline(&format!("off{j}"), *mem, *iso)).collect(),
        };
        let weights: Vec<Vec<Option<f64>>> = gpus.iter().map(|(giso, gmem)| {
            jobs.iter().map(|(jiso, jmem)| (gmem + jmem <= 16_000).then(|| similarity(*jiso, *giso))).collect()
        }).collect();
        let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 0);
        let best = brute_force(&weights);
        prop_assert!((plan.total_predicted - best).abs() < 1e-4, "plan {} vs optimum {}", plan.total_predicted, best);
        for a in &plan.assignments {
            let g = a.at.gpu as usize;
            let j: usize = a.offline[3..].parse().unwrap();
            prop_assert!(weights[g][j].is_some(), "forbidden pair {:?}", a);
        }
    }
}

#[test]
fn forbidden_pairs_are_never_matched_whatever_their_weight() {
    let mut c = cluster(&[("a", "V100", 3, 16_000), ("b", "T4", 1, 16_000)]);
    c.tenants.insert("locked".into(), Default::default());
    c.tenants.get_mut("locked").unwrap().no_offline_sharing = true;
    c.tenants.insert("picky".into(), Default::default());
    c.tenants.get_mut("picky").unwrap().deny_offline_from.insert("batch".into());
    let mut locked = online("locked-svc", "a", 0, 1_000, 10.0, 10.0);
    locked.tenant = "locked".into();
    let mut picky = online("picky-svc", "a", 1, 1_000, 10.0, 10.0);
    picky.tenant = "picky".into();
    let big = online("big-svc", "a", 2, 12_000, 10.0, 10.0);
    let t4 = online("t4-svc", "b", 0, 1_000, 10.0, 10.0);
    let mut job = offline("job", 6_000, 10.0);
    job.gpu_types = vec!["V100".into()];
    let w = Workloads { online: vec![locked, picky, big, t4], offline: vec![job] };
    let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 0);
    assert!(plan.assignments.is_empty(), "{plan}");
    assert_eq!(plan.unplaced, vec!["job".to_string()]);
    // Lift one rule at a time: each makes exactly its GPU usable.
    let mut w2 = w.clone();
    w2.offline[0].gpu_types.clear();
    let plan = plan_round(&c, &w2, &similarity_predictor(), &healthy, 0);
    assert_eq!(plan.assignments.len(), 1);
    assert_eq!(plan.assignments[0].at, GpuRef { node: "b".into(), gpu: 0 });
    let mut w3 = w.clone();
    w3.offline[0].memory_mib = 3_000;
    let plan = plan_round(&c, &w3, &similarity_predictor(), &healthy, 0);
    assert_eq!(plan.assignments[0].at, GpuRef { node: "a".into(), gpu: 2 });
}

#[test]
fn only_healthy_gpus_get_offline_work_and_broken_pairs_say_why() {
    let dir = std::env::temp_dir().join(format!("xshare-plan-health-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let reader = HealthReader { dir: dir.clone(), stale_after: Duration::from_secs(30) };
    let now = SystemTime::now();
    write_state(&reader.path("n", 0), "Healthy", now).unwrap();
    write_state(&reader.path("n", 1), "Overlimit", now).unwrap();
    write_state(&reader.path("n", 2), "Healthy", now - Duration::from_secs(300)).unwrap();
    // GPU 3: no state file at all.
    let c = cluster(&[("n", "V100", 4, 16_000)]);
    let mut jobs: Vec<_> = (0..4).map(|j| offline(&format!("job{j}"), 1_000, 10.0)).collect();
    jobs[0].current = Some(GpuRef { node: "n".into(), gpu: 1 });
    let w = Workloads {
        online: (0..4).map(|g| online(&format!("svc{g}"), "n", g, 1_000, 20.0, 10.0)).collect(),
        offline: jobs,
    };
    let plan = plan_round(&c, &w, &similarity_predictor(), &*health_fn(Some(reader)), 3);
    assert_eq!(plan.assignments.len(), 1, "{plan}");
    assert_eq!(plan.assignments[0].at.gpu, 0);
    let skipped: Vec<_> = plan.skipped_gpus.iter().map(|s| (s.at.gpu, s.reason.clone())).collect();
    assert_eq!(skipped[0], (1, "Overlimit".to_string()));
    assert!(skipped[1].1.starts_with("Stale("), "{skipped:?}");
    assert_eq!(skipped[2], (3, "Missing".to_string()));
    let brk = plan.breaks.iter().find(|b| b.offline == "job0").expect("pair on the Overlimit GPU is broken");
    assert!(brk.reason.contains("Overlimit"), "{}", brk.reason);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sm_share_and_memory_quota_follow_the_online_workload() {
    let mut c = cluster(&[("n", "V100", 2, 16_000)]);
    c.memory_headroom_mib = 1_000;
    c.max_offline_memory_fraction = 0.4;
    let w = Workloads {
        online: vec![online("svc0", "n", 0, 4_000, 35.0, 10.0), online("svc1", "n", 1, 2_000, 95.0, 10.0)],
        offline: vec![offline("job", 5_000, 10.0)],
    };
    let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 0);
    assert_eq!(plan.assignments.len(), 1);
    let a = &plan.assignments[0];
    assert_eq!(a.at.gpu, 0, "GPU 1 has only 5% SM left, below the 10% floor");
    assert_eq!(a.sm_percent, 65.0);
    // Free = 16000 - 4000 - 1000 = 11000; cap = 40% of 16000 = 6400: quota = 6400.
    assert_eq!(a.memory_quota_mib, 6_400);
    assert!(plan.skipped_gpus.iter().any(|s| s.at.gpu == 1 && s.reason.contains("SM")));
    let mut w2 = w.clone();
    w2.offline[0].memory_mib = 7_000;
    assert!(plan_round(&c, &w2, &similarity_predictor(), &healthy, 0).assignments.is_empty());
}

#[test]
fn several_jobs_per_gpu_also_fit_together() {
    let mut c = cluster(&[("n", "V100", 1, 16_000)]);
    c.max_offline_per_gpu = 3;
    let w = Workloads {
        online: vec![online("svc", "n", 0, 6_000, 20.0, 10.0)],
        offline: vec![offline("a", 5_000, 10.0), offline("b", 4_000, 11.0), offline("c", 3_000, 50.0)],
    };
    let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 0);
    let used: u64 = plan
        .assignments
        .iter()
        .map(|a| w.offline.iter().find(|j| j.name == a.offline).unwrap().memory_mib)
        .sum();
    assert!(used <= 10_000, "{plan}");
    assert_eq!(plan.assignments.len(), 2, "{plan}");
    for a in &plan.assignments {
        assert!((a.sm_percent - 40.0).abs() < 1e-9, "SM share split between the jobs");
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn input_errors_name_file_line_and_field() {
    let dir = std::env::temp_dir().join(format!("xshare-plan-spec-{}", std::process::id()));
    let p = write(&dir, "c1.json", "{\n  \"nodes\": [\n    {\"name\": \"a\", \"gpu_type\": \"V100\", \"gpus\": \"four\", \"gpu_memory_mib\": 1}\n  ]\n}");
    let e = ClusterSpec::load(&p).unwrap_err();
    assert!(matches!(e, SpecError::Parse { line: 3, .. }), "{e}");
    assert!(e.to_string().contains("c1.json:3:"), "{e}");
    let p = write(&dir, "c2.json", r#"{"nodes": [{"name": "a", "gpu_type": "V100", "gpus": 1, "gpu_memory_mib": 1}], "round_period_s": 0}"#);
    assert!(ClusterSpec::load(&p).unwrap_err().to_string().contains("round_period_s"));
    let p = write(&dir, "c3.json", r#"{"nodes": [], "colour": "red"}"#);
    assert!(ClusterSpec::load(&p).unwrap_err().to_string().contains("colour"));
    let c = cluster(&[("a", "V100", 2, 16_000)]);
    let p = write(&dir, "w.json", r#"{"online": [{"name": "s", "tenant": "t", "node": "a", "gpu": 7, "memory_mib": 1, "sm_activity_percent": 5}]}"#);
    let e = Workloads::load(&p, &c).unwrap_err().to_string();
    assert!(e.contains("online[0].node") && e.contains("no GPU 7"), "{e}");
    let p = write(&dir, "c4.json", r#"{"nodes": [{"name": "a", "gpu_type": "V100", "gpus": 1, "gpu_memory_mib": 1}], "state_dir": "state"}"#);
    assert_eq!(ClusterSpec::load(&p).unwrap().state_dir.unwrap(), dir.join("state"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `Planner::keeping_running` (the extender's rounds: nothing there carries a move out):
/// a running job stays on its Healthy GPU and takes a slot and its memory there; a
/// round free to move jobs moves it to give its GPU to a job that fits only there.
#[test]
fn rounds_keeping_running_jobs_never_move_them() {
    use cluster_matcher::plan::{Planner, SolverChoice};
    let mut c = cluster(&[("n1", "V100", 1, 32000), ("n2", "T4", 1, 32000)]);
    let mut a = offline("a", 4000, 4.0);
    a.current = Some(GpuRef { node: "n1".into(), gpu: 0 });
    let mut b = offline("b", 4000, 4.0);
    b.gpu_types = vec!["V100".into()];
    let w = Workloads {
        online: vec![online("s1", "n1", 0, 8000, 30.0, 5.0), online("s2", "n2", 0, 8000, 30.0, 5.0)],
        offline: vec![a, b.clone()],
    };
    let n1 = GpuRef { node: "n1".into(), gpu: 0 };
    for solver in [SolverChoice::Pairwise, SolverChoice::Classes] {
        let moved = Planner::new(solver).plan_round(&c, &w, &similarity_predictor(), &healthy, 1);
        assert!(moved.assignments.iter().any(|x| x.offline == "b" && x.at == n1), "{moved:?}");
        let kept = Planner::new(solver).keeping_running().plan_round(&c, &w, &similarity_predictor(), &healthy, 1);
        let a = kept.assignments.iter().find(|x| x.offline == "a").expect("a kept");
        assert!(a.kept && a.at == n1 && a.predicted_normalized > 0.0, "{kept:?}");
        assert!(kept.breaks.is_empty() && kept.unplaced == vec!["b".to_string()], "{kept:?}");
    }
    // Two jobs per GPU: a keeps one slot and its memory; of b and c (each fitting only on
    // n1, 20000 MiB free beside the online service and a's 4000), one is placed beside it.
    c.max_offline_per_gpu = 2;
    let mut c2 = b.clone();
    c2.name = "c".into();
    let mut w2 = w.clone();
    w2.offline[1].memory_mib = 12000;
    c2.memory_mib = 12000;
    w2.offline.push(c2);
    let kept = Planner::new(SolverChoice::Auto).keeping_running().plan_round(&c, &w2, &similarity_predictor(), &healthy, 1);
    let on_n1: Vec<&str> = kept.assignments.iter().filter(|x| x.at == n1).map(|x| x.offline.as_str()).collect();
    assert_eq!(on_n1.len(), 2, "{kept:?}");
    assert!(on_n1.contains(&"a"), "{kept:?}");
    let used: u64 = kept.assignments.iter().filter(|x| x.at == n1).map(|x| x.memory_quota_mib).sum();
    assert!(used <= 24000, "{kept:?}");
}

/// A kept job keeps the quota it runs with (`held_memory_quota_mib`, what its pod was bound
/// with): the round charges its GPU that, reports it unchanged, and gives a newcomer only
/// the rest of the room; a newcomer needing more than the rest is not placed there.
#[test]
fn a_kept_jobs_held_quota_is_charged_and_never_shared_again() {
    use cluster_matcher::plan::{Planner, SolverChoice};
    let mut c = cluster(&[("n1", "V100", 1, 32000)]);
    c.max_offline_per_gpu = 2;
    c.max_offline_memory_fraction = 0.5;
    let n1 = GpuRef { node: "n1".into(), gpu: 0 };
    let mut a = offline("a", 4000, 4.0);
    a.current = Some(n1.clone());
    a.held_memory_quota_mib = Some(16000);
    let w = |b_mem: u64| Workloads {
        online: vec![online("s1", "n1", 0, 8000, 30.0, 5.0)],
        offline: vec![a.clone(), offline("b", b_mem, 4.0)],
    };
    for solver in [SolverChoice::Pairwise, SolverChoice::Classes] {
        // 24000 MiB of room, 16000 held by a: b (4000) gets the 8000 left.
        let p = Planner::new(solver).keeping_running().plan_round(&c, &w(4000), &similarity_predictor(), &healthy, 1);
        let q = |n: &str| p.assignments.iter().find(|x| x.offline == n).map(|x| x.memory_quota_mib);
        assert_eq!((q("a"), q("b")), (Some(16000), Some(8000)), "{solver:?}: {p:?}");
        // b needing 9000 does not fit in what a leaves.
        let p = Planner::new(solver).keeping_running().plan_round(&c, &w(9000), &similarity_predictor(), &healthy, 1);
        assert_eq!(p.unplaced, vec!["b".to_string()], "{solver:?}: {p:?}");
    }
}

/// A job's allowed nodes (those kube-scheduler's own filters offered its pod) bind both
/// solvers: GPUs that are alike but for which allowed sets hold their node are told apart, so
/// the class solver never places a job outside its set.
#[test]
fn allowed_nodes_bind_both_solvers() {
    use cluster_matcher::plan::{Planner, SolverChoice};
    let c = cluster(&[("n1", "V100", 1, 32000), ("n2", "V100", 1, 32000), ("n3", "V100", 1, 32000), ("n4", "V100", 1, 32000)]);
    let set = |n: &[&str]| Some(n.iter().map(|s| s.to_string()).collect::<std::collections::BTreeSet<String>>());
    let mut a = offline("a", 4000, 4.0);
    a.allowed_nodes = set(&["n3"]);
    let mut b = offline("b", 4000, 4.0);
    b.allowed_nodes = set(&["n3", "n4"]);
    let w = Workloads {
        online: (1..=4).map(|i| online(&format!("s{i}"), &format!("n{i}"), 0, 8000, 30.0, 5.0)).collect(),
        offline: vec![a, b, offline("c", 4000, 4.0), offline("d", 4000, 4.0)],
    };
    for solver in [SolverChoice::Pairwise, SolverChoice::Classes] {
        let p = Planner::new(solver).plan_round(&c, &w, &similarity_predictor(), &healthy, 1);
        let at = |n: &str| p.assignments.iter().find(|x| x.offline == n).map(|x| x.at.node.clone());
        assert_eq!((at("a").as_deref(), at("b").as_deref()), (Some("n3"), Some("n4")), "{solver:?}: {p:?}");
        for j in ["c", "d"] {
            assert!(matches!(at(j).as_deref(), Some("n1" | "n2")), "{solver:?}: {p:?}");
        }
    }
}
