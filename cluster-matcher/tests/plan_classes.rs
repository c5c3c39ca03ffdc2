//! The round solved on classes against the pairwise exact round and brute force: few
//! profiles (exact ties), two GPU types, memory limits, tenant rules, GPU-type limits,
//! several jobs per GPU, rectangular shapes; and the warm start across rounds.

mod plan_support;

use cluster_matcher::matching::reference::brute_force_groups;
use cluster_matcher::plan::{GpuHealth, GpuRef, Planner, SolverChoice, Workloads};
use plan_support::*;
use proptest::prelude::*;

fn healthy(_: &GpuRef) -> GpuHealth {
    GpuHealth::Healthy
}

/// One small round: GPUs (type 0/1, online iso speed of 3, online memory of 3, tenant of
/// 2), jobs (iso speed of 3, memory of 3, tenant of 2, any type or type 0 only).
#[derive(Debug, Clone)]
struct Round {
    gpus: Vec<(usize, usize, usize, usize)>,
    jobs: Vec<(usize, usize, usize, bool)>,
    per_gpu: usize,
    picky: bool,
}

const ISO: [f64; 3] = [2.0, 5.0, 11.0];
const ON_MEM: [u64; 3] = [2_000, 8_000, 12_000];
const JOB_MEM: [u64; 3] = [1_000, 3_000, 6_000];
const TYPES: [&str; 2] = ["V100", "T4"];

fn round(max_gpus: usize, max_jobs: usize) -> impl Strategy<Value = Round> {
    (
        prop::collection::vec((0usize..2, 0usize..3, 0usize..3, 0usize..2), 0..=max_gpus),
        prop::collection::vec(
            (0usize..3, 0usize..3, 0usize..2, any::<bool>()),
            0..=max_jobs,
        ),
        1usize..=3,
        any::<bool>(),
    )
        .prop_map(|(gpus, jobs, per_gpu, picky)| Round {
            gpus,
            jobs,
            per_gpu,
            picky,
        })
}

impl Round {
    fn inputs(&self) -> (cluster_matcher::plan::ClusterSpec, Workloads) {
        let n0 = self.gpus.iter().filter(|g| g.0 == 0).count() as u32;
        let n1 = self.gpus.iter().filter(|g| g.0 == 1).count() as u32;
        let mut nodes = vec![];
        if n0 > 0 {
            nodes.push(("a", TYPES[0], n0, 16_000));
        }
        if n1 > 0 {
            nodes.push(("b", TYPES[1], n1, 16_000));
        }
        let mut c = cluster(&nodes);
        c.max_offline_per_gpu = self.per_gpu;
        if self.picky {
            c.tenants.insert("svc1".into(), Default::default());
            c.tenants
                .get_mut("svc1")
                .unwrap()
                .deny_offline_from
                .insert("team1".into());
        }
        let (mut i0, mut i1) = (0u32, 0u32);
        let online = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, &(t, iso, mem, tenant))| {
                let (node, idx) = if t == 0 {
                    i0 += 1;
                    ("a", i0 - 1)
                } else {
                    i1 += 1;
                    ("b", i1 - 1)
                };
                let mut o = online(&format!("on{i}"), node, idx, ON_MEM[mem], 30.0, ISO[iso]);
                o.tenant = format!("svc{tenant}");
                o
            })
            .collect();
        let offline = self
            .jobs
            .iter()
            .enumerate()
            .map(|(j, &(iso, mem, tenant, v100_only))| {
                let mut o = offline(&format!("off{j}"), JOB_MEM[mem], ISO[iso]);
                o.tenant = format!("team{tenant}");
                if v100_only {
                    o.gpu_types = vec!["V100".into()];
                }
                o
            })
            .collect();
        (c, Workloads { online, offline })
    }

    /// Pair weight or `None` when forbidden, by the plan's stated rules.
    fn weight(&self, g: usize, j: usize) -> Option<f64> {
        let (t, giso, gmem, gten) = self.gpus[g];
        let (jiso, jmem, jten, v100_only) = self.jobs[j];
        if v100_only && t != 0 {
            return None;
        }
        if JOB_MEM[jmem] > 16_000 - ON_MEM[gmem] {
            return None;
        }
        if self.picky && gten == 1 && jten == 1 {
            return None;
        }
        Some(similarity(ISO[jiso], ISO[giso]))
    }

    /// GPU index in the order the plan numbers candidates (online order).
    fn gpu_of(&self, at: &GpuRef) -> usize {
        let t = if at.node == "a" { 0 } else { 1 };
        self.gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.0 == t)
            .nth(at.gpu as usize)
            .map(|(i, _)| i)
            .unwrap()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * (1.0 + a.abs().max(b.abs()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Tiny rounds: classes == brute force (groups of up to k, memory of the group within
    /// the GPU's free memory), and == pairwise exact with one job per GPU; every pair
    /// allowed; no GPU over k; no job twice.
    #[test]
    fn class_round_equals_brute_force_and_pairwise(r in round(3, 5)) {
        let (c, w) = r.inputs();
        let pred = similarity_predictor();
        let cls = Planner::new(SolverChoice::Classes).plan_round(&c, &w, &pred, &healthy, 0);
        let pair = Planner::new(SolverChoice::Pairwise).plan_round(&c, &w, &pred, &healthy, 0);
        let group = |g: usize, s: &[usize]| -> Option<f64> {
            let mem: u64 = s.iter().map(|&j| JOB_MEM[r.jobs[j].1]).sum();
            if mem > 16_000 - ON_MEM[r.gpus[g].2] {
                return None;
            }
            s.iter().map(|&j| r.weight(g, j)).sum()
        };
        let brute = brute_force_groups(r.gpus.len(), r.jobs.len(), r.per_gpu, group).unwrap();
        if cls.stats.solver == "classes" {
            prop_assert!(close(cls.total_predicted, brute), "classes {} brute {} ({:?})", cls.total_predicted, brute, cls.stats);
        } else {
            // Group memory could bind: the round fell back to the pairwise planner.
            prop_assert!(r.per_gpu > 1);
        }
        if r.per_gpu == 1 {
            prop_assert_eq!(&cls.stats.solver, "classes");
            prop_assert!(close(pair.total_predicted, brute), "pairwise {} brute {}", pair.total_predicted, brute);
        } else {
            prop_assert!(cls.total_predicted >= pair.total_predicted - 1e-9);
        }
        let mut per = vec![0usize; r.gpus.len()];
        let mut seen = std::collections::BTreeSet::new();
        for a in &cls.assignments {
            let g = r.gpu_of(&a.at);
            let j: usize = a.offline[3..].parse().unwrap();
            prop_assert!(r.weight(g, j).is_some(), "forbidden pair {:?}", a);
            prop_assert!(seen.insert(j), "job placed twice");
            per[g] += 1;
        }
        prop_assert!(per.iter().all(|&n| n <= r.per_gpu));
    }

    /// Larger rounds with one job per GPU: auto (classes) == pairwise; a second round,
    /// warm from the first with some jobs gone and new ones, == a cold one.
    #[test]
    fn class_round_equals_pairwise_and_warm_equals_cold(r in round(40, 80), drop_every in 2usize..7) {
        let (mut c, w) = r.inputs();
        c.max_offline_per_gpu = 1;
        let pred = similarity_predictor();
        let mut planner = Planner::new(SolverChoice::Auto);
        let first = planner.plan_round(&c, &w, &pred, &healthy, 0);
        let pair = Planner::new(SolverChoice::Pairwise).plan_round(&c, &w, &pred, &healthy, 0);
        prop_assert!(close(first.total_predicted, pair.total_predicted), "auto {} pairwise {}", first.total_predicted, pair.total_predicted);
        let mut w2 = w.clone();
        w2.offline = w.offline.iter().enumerate().filter(|(j, _)| j % drop_every != 0).map(|(_, o)| o.clone()).collect();
        for k in 0..drop_every {
            w2.offline.push(offline(&format!("new{k}"), JOB_MEM[k % 3], ISO[k % 3]));
        }
        let warm = planner.plan_round(&c, &w2, &pred, &healthy, 1);
        let cold = Planner::new(SolverChoice::Pairwise).plan_round(&c, &w2, &pred, &healthy, 1);
        prop_assert!(close(warm.total_predicted, cold.total_predicted), "warm {} cold {} ({:?})", warm.total_predicted, cold.total_predicted, warm.stats.start);
    }
}

/// Classes collapse: 40 GPUs of 2 kinds and 60 jobs of 3 kinds are 2 x 3 classes, and the
/// same round repeated warm is certified optimal without a single path.
#[test]
fn identical_members_share_a_class_and_a_repeated_round_is_certified() {
    let mut c = cluster(&[("a", "V100", 40, 16_000)]);
    c.max_offline_per_gpu = 1;
    let online = (0..40)
        .map(|i| {
            online(
                &format!("on{i}"),
                "a",
                i,
                2_000,
                30.0,
                ISO[(i % 2) as usize],
            )
        })
        .collect();
    let offline = (0..60)
        .map(|j| offline(&format!("off{j}"), 1_000, ISO[j % 3]))
        .collect();
    let w = Workloads { online, offline };
    let pred = similarity_predictor();
    let mut planner = Planner::new(SolverChoice::Auto);
    let p1 = planner.plan_round(&c, &w, &pred, &healthy, 0);
    assert_eq!((p1.stats.gpu_classes, p1.stats.job_classes), (2, 3));
    assert_eq!(p1.stats.solver, "classes");
    assert_eq!(p1.stats.allowed_pairs, 40 * 60);
    assert_eq!(p1.assignments.len(), 40);
    let p2 = planner.plan_round(&c, &w, &pred, &healthy, 1);
    assert_eq!(
        p2.stats.start,
        Some(cluster_matcher::matching::classes::Start::WarmOptimal)
    );
    assert_eq!(p2.stats.class_paths, 0);
    assert!(close(p1.total_predicted, p2.total_predicted));
}

/// A job keeps its current GPU when an optimal plan allows it (the class solver places
/// preferred pairs first within a class pair).
#[test]
fn class_round_keeps_jobs_where_they_run_among_equal_choices() {
    let c = cluster(&[("a", "V100", 4, 16_000)]);
    let online = (0..4)
        .map(|i| online(&format!("on{i}"), "a", i, 2_000, 30.0, 5.0))
        .collect();
    let mut offline: Vec<_> = (0..4)
        .map(|j| offline(&format!("off{j}"), 1_000, 5.0))
        .collect();
    for (j, o) in offline.iter_mut().enumerate() {
        o.current = Some(GpuRef {
            node: "a".into(),
            gpu: 3 - j as u32,
        });
    }
    let w = Workloads { online, offline };
    let p = Planner::new(SolverChoice::Classes).plan_round(
        &c,
        &w,
        &similarity_predictor(),
        &healthy,
        0,
    );
    assert_eq!(p.assignments.len(), 4);
    assert!(p.assignments.iter().all(|a| a.kept), "{p}");
    assert!(p.breaks.is_empty());
}
