//! Offline allocation policies (`cluster.json` `policy`) through the real placement round:
//! each case is small enough to check by hand, and differs from maximum throughput.

mod plan_support;

use cluster_matcher::plan::{plan_round, ClusterSpec, GpuHealth, GpuRef, Workloads};
use cluster_matcher::policy::Policy;
use plan_support::*;

fn healthy(_: &GpuRef) -> GpuHealth {
    GpuHealth::Healthy
}

fn placed(c: &ClusterSpec, w: &Workloads) -> Vec<(String, u32)> {
    let mut v: Vec<(String, u32)> =
        plan_round(c, w, &similarity_predictor(), &healthy, 1).assignments.into_iter().map(|a| (a.offline, a.at.gpu)).collect();
    v.sort();
    v
}

#[test]
fn policy_key_parses_and_names_the_field_when_wrong() {
    let base = r#"{"nodes": [{"name": "n", "gpu_type": "V100", "gpus": 1, "gpu_memory_mib": 16000}]"#;
    let c: ClusterSpec = serde_json::from_str(&format!("{base}}}")).unwrap();
    assert_eq!(c.policy, Policy::MaxThroughput);
    for p in Policy::ALL {
        let c: ClusterSpec = serde_json::from_str(&format!("{base}, \"policy\": \"{}\"}}", p.name())).unwrap();
        assert_eq!(c.policy, p);
    }
    let e = serde_json::from_str::<ClusterSpec>(&format!("{base}, \"policy\": \"fifo\"}}")).unwrap_err().to_string();
    assert!(e.contains("unknown variant `fifo`") && e.contains("gavel-max-min"), "{e}");
}

/// One GPU (online iso 1). `long` pairs at 1.0 with 10 h left, `short` at 0.5 with 1 h left:
/// KM takes `long`, Optimus `short` (0.5 / 3600 > 1 / 36000).
#[test]
fn optimus_places_the_job_it_shortens_most() {
    let mut c = cluster(&[("n0", "V100", 1, 32_000)]);
    let mut long = offline("long", 1000, 1.0);
    long.feedback.remaining_s = Some(36_000.0);
    let mut short = offline("short", 1000, 2.0);
    short.feedback.remaining_s = Some(3600.0);
    let w = Workloads { online: vec![online("svc", "n0", 0, 4000, 40.0, 1.0)], offline: vec![long, short] };
    assert_eq!(placed(&c, &w), vec![("long".to_string(), 0)]);
    c.policy = Policy::Optimus;
    assert_eq!(placed(&c, &w), vec![("short".to_string(), 0)]);
}

/// Two GPUs; tenant `a` has two jobs that pair perfectly (1.0), tenant `b` one at 0.5. KM
/// gives both GPUs to `a`; DRF (both tenants SM-dominant: one slot's SM a task) gives one
/// task each, and the matching puts `a`'s older job and `b`'s job.
#[test]
fn drf_gives_each_tenant_its_dominant_share() {
    let mut c = cluster(&[("n0", "V100", 2, 32_000)]);
    let mut b = offline("b0", 1000, 2.0);
    b.tenant = "b".into();
    let (mut a0, mut a1) = (offline("a0", 1000, 1.0), offline("a1", 1000, 1.0));
    a0.tenant = "a".into();
    a1.tenant = "a".into();
    let w = Workloads {
        online: vec![online("s0", "n0", 0, 4000, 40.0, 1.0), online("s1", "n0", 1, 4000, 40.0, 1.0)],
        offline: vec![a0, a1, b],
    };
    let names = |v: Vec<(String, u32)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(placed(&c, &w)), vec!["a0", "a1"]);
    c.policy = Policy::Drf;
    assert_eq!(names(placed(&c, &w)), vec!["a0", "b0"]);
}

/// Gandiva: a job measured at 0.2 where it runs migrates to the other free GPU; measured at
/// 0.8 it stays (KM, seeing equal predictions, would be free to do either).
#[test]
fn gandiva_migrates_a_pair_that_does_not_pay() {
    let mut c = cluster(&[("n0", "V100", 2, 32_000)]);
    c.policy = Policy::Gandiva;
    let mut j = offline("j", 1000, 1.0);
    j.current = Some(GpuRef { node: "n0".into(), gpu: 0 });
    j.feedback.measured_normalized = Some(0.2);
    let mut w = Workloads {
        online: vec![online("s0", "n0", 0, 4000, 40.0, 1.0), online("s1", "n0", 1, 4000, 40.0, 1.0)],
        offline: vec![j],
    };
    let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 1);
    assert_eq!(plan.assignments.len(), 1);
    assert_eq!(plan.assignments[0].at.gpu, 1, "{plan:?}");
    assert_eq!(plan.breaks.len(), 1);
    w.offline[0].feedback.measured_normalized = Some(0.8);
    let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 1);
    assert!(plan.assignments[0].kept && plan.breaks.is_empty(), "{plan:?}");
}

/// Gavel through the round: three jobs on two GPUs of two types with equal predictions on
/// both: every job's max-min share is 2/3 of a GPU (z = 1), so any two may run this round
/// (Gavel's history decides later rounds); the round must use both GPUs (the LP's shares plus
/// the throughput tie-breaker leave none idle). The LP itself is checked by hand in
/// `policy::gavel`'s tests.
#[test]
fn gavel_round_uses_every_gpu() {
    let mut c = cluster(&[("v", "V100", 1, 32_000), ("k", "K80", 1, 32_000)]);
    c.policy = Policy::GavelMaxMin;
    let w = Workloads {
        online: vec![online("s0", "v", 0, 4000, 40.0, 1.0), online("s1", "k", 0, 4000, 40.0, 1.0)],
        offline: vec![offline("a", 1000, 1.0), offline("b", 1000, 2.0), offline("c", 1000, 4.0)],
    };
    let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 1);
    assert_eq!(plan.assignments.len(), 2, "{plan:?}");
    assert_eq!(plan.unplaced.len(), 1, "{plan:?}");
}

/// Two running jobs with identical weights everywhere (and two waiting ones of the same
/// weight): no policy may move or break a running job, since no move gains anything (each
/// move kills and restarts a training job). The pairwise path used to swap them under
/// optimus and drf ("moved to n0/0 (better plan)") and gavel-max-min broke one to place a
/// waiting job of equal weight.
#[test]
fn equal_weights_keep_every_running_job_where_it_runs() {
    let mut wrong = Vec::new();
    for policy in Policy::ALL {
        for (ga, gb) in [(1, 0), (0, 1)] {
            let mut c = cluster(&[("n0", "V100", 2, 32_000)]);
            c.policy = policy;
            let mut a1 = offline("a1", 1000, 1.0);
            a1.current = Some(GpuRef { node: "n0".into(), gpu: ga });
            let mut a2 = offline("a2", 1000, 1.0);
            a2.current = Some(GpuRef { node: "n0".into(), gpu: gb });
            let w = Workloads {
                online: vec![online("s0", "n0", 0, 4000, 40.0, 1.0), online("s1", "n0", 1, 4000, 40.0, 1.0)],
                offline: vec![a1, a2, offline("b1", 1000, 1.0), offline("b2", 1000, 1.0)],
            };
            let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 1);
            let mut kept: Vec<(String, u32)> =
                plan.assignments.iter().filter(|a| a.kept).map(|a| (a.offline.clone(), a.at.gpu)).collect();
            kept.sort();
            if !plan.breaks.is_empty() || kept != [("a1".to_string(), ga), ("a2".to_string(), gb)] {
                wrong.push(format!("{} (a1 on {ga}): {:?}", policy.name(), plan.breaks));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// An offline job of `tenant` (1000 MiB, profile 1.0) that may run only on GPU `types` (any
/// when empty).
fn tenant_job(name: &str, tenant: &str, types: &[&str]) -> cluster_matcher::plan::OfflineJob {
    let mut j = offline(name, 1000, 1.0);
    j.tenant = tenant.into();
    j.gpu_types = types.iter().map(|t| t.to_string()).collect();
    j
}

/// DRF is work-conserving: one node with two V100s; tenant `a`'s two jobs may only run on
/// K80s, tenant `b` has two jobs. Pooled DRF gave each tenant one task, so `b` got one GPU
/// and the other idled while `b`'s second job waited; a tenant that cannot run anywhere
/// takes no quota.
#[test]
fn drf_does_not_idle_gpus_for_a_tenant_that_cannot_use_them() {
    let mut c = cluster(&[("n0", "V100", 2, 32_000)]);
    c.policy = Policy::Drf;
    let w = Workloads {
        online: vec![online("s0", "n0", 0, 4000, 40.0, 1.0), online("s1", "n0", 1, 4000, 40.0, 1.0)],
        offline: vec![tenant_job("a1", "a", &["K80"]), tenant_job("a2", "a", &["K80"]), tenant_job("b1", "b", &[]), tenant_job("b2", "b", &[])],
    };
    let names = |v: Vec<(String, u32)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(placed(&c, &w)), vec!["b1", "b2"]);
}

/// DRF keeps filling while some tenant still fits: one K80 and two V100s; tenant `a`'s jobs
/// run only on the K80, `b`'s anywhere. Pooled filling gives `a` two tasks (a1, b1, a2) of
/// which one can run, so a V100 idled while `b2` waited. `a` still gets its one runnable
/// share (the K80) and `b` both V100s.
#[test]
fn drf_fills_what_a_constrained_tenant_leaves() {
    let mut c = cluster(&[("k", "K80", 1, 32_000), ("v", "V100", 2, 32_000)]);
    c.policy = Policy::Drf;
    let w = Workloads {
        online: vec![
            online("s0", "k", 0, 4000, 40.0, 1.0),
            online("s1", "v", 0, 4000, 40.0, 1.0),
            online("s2", "v", 1, 4000, 40.0, 1.0),
        ],
        offline: vec![
            tenant_job("a1", "a", &["K80"]),
            tenant_job("a2", "a", &["K80"]),
            tenant_job("a3", "a", &["K80"]),
            tenant_job("b1", "b", &[]),
            tenant_job("b2", "b", &[]),
            tenant_job("b3", "b", &[]),
        ],
    };
    let got = placed(&c, &w);
    assert_eq!(got.len(), 3, "{got:?}");
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.iter().filter(|n| n.starts_with('a')).count(), 1, "{got:?}");
    assert_eq!(names.iter().filter(|n| n.starts_with('b')).count(), 2, "{got:?}");
}

/// The keep bonus is the job's own: under Optimus a running job with years left has weights a
/// hundred-millionth of a job about to end, and a bonus scaled to the round's largest weight
/// (that job's) outweighed the long job's real gain from the GPU it pairs better with (its
/// online service's profile, not the busy one's), so it was never moved.
#[test]
fn the_keep_bonus_never_outweighs_a_running_jobs_own_gain() {
    let mut c = cluster(&[("n0", "V100", 2, 32_000), ("k", "K80", 1, 32_000)]);
    c.policy = Policy::Optimus;
    let mut long = offline("long", 1000, 1.0);
    long.feedback.remaining_s = Some(1e8);
    long.current = Some(GpuRef { node: "n0".into(), gpu: 0 });
    let mut short = offline("short", 1000, 1.0);
    short.feedback.remaining_s = Some(1.0);
    short.gpu_types = vec!["K80".into()];
    let w = Workloads {
        online: vec![
            online("busy", "n0", 0, 4000, 40.0, 2.0),
            online("idle", "n0", 1, 4000, 40.0, 1.0),
            online("k", "k", 0, 4000, 5.0, 1.0),
        ],
        offline: vec![long, short],
    };
    let plan = plan_round(&c, &w, &similarity_predictor(), &healthy, 1);
    let at = |n: &str| plan.assignments.iter().find(|a| a.offline == n).map(|a| (a.at.node.clone(), a.at.gpu));
    assert_eq!(at("short"), Some(("k".into(), 0)));
    assert_eq!(at("long"), Some(("n0".into(), 1)), "the long job moves to the GPU it runs better on: {:?}", plan.breaks);
}
