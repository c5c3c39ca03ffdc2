//! What the extender's plan and bind do about what already runs, against the stateful fake
//! API server: a running job is never moved (nothing would move it), and a bind never puts a
//! second live pod of a job, or one pod too many, on a GPU the watch (or a bind in flight)
//! shows taken, whatever the plan it read says.

mod plan_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_matcher::extender::{metrics, Extender, ExtenderArgs, ExtenderBindingArgs, PodDecision};
use cluster_matcher::kube_api::{ApiSource, KubeApi};
use cluster_matcher::plan::{ClusterSpec, GpuRef};
use cluster_matcher::watch::{ClusterWatch, WatchSettings};
use fake_kube::cluster::FakeCluster;
use fake_kube::objects::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

/// Two offline jobs a GPU, each at most half of it: on the fake nodes' 32768 MiB GPUs beside
/// an 8000 MiB online service, 24768 MiB of room, at most 16384 a job.
fn half_gpu_two_per_gpu() -> ClusterSpec {
    serde_json::from_value(json!({"round_period_s": 3600, "memory_headroom_mib": 0,
        "max_offline_memory_fraction": 0.5, "max_offline_per_gpu": 2, "nodes": []}))
    .unwrap()
}

fn open_cluster(per_gpu: usize) -> ClusterSpec {
    serde_json::from_value(json!({"round_period_s": 3600, "memory_headroom_mib": 0,
        "max_offline_memory_fraction": 1.0, "max_offline_per_gpu": per_gpu, "nodes": []}))
    .unwrap()
}

fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(30), "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The extender on `c`'s watches (no bind lock), its first plan made from what they list.
fn ext_on(c: &FakeCluster, per_gpu: usize, pods: usize) -> (ClusterWatch, Arc<Extender>) {
    ext_with(c, open_cluster(per_gpu), pods)
}

/// The extender of `cluster` on `c`'s watches (no bind lock), once they list `pods` pods.
fn ext_with(c: &FakeCluster, cluster: ClusterSpec, pods: usize) -> (ClusterWatch, Arc<Extender>) {
    ext_split(c, c, cluster, pods)
}

/// The extender of `cluster` watching `watched` and binding through `api_side` (the same
/// cluster but for a test of a watch that never shows the binds), once the watches list `pods`.
fn ext_split(watched: &FakeCluster, api_side: &FakeCluster, cluster: ClusterSpec, pods: usize) -> (ClusterWatch, Arc<Extender>) {
    let w = ClusterWatch::start(&ApiSource::Url(watched.url()), WatchSettings::default(), Arc::new(|| {})).unwrap();
    assert!(w.wait_synced(Duration::from_secs(30)));
    let v = w.view();
    eventually("pods listed", || v.snapshot().pods.len() == pods);
    let api = KubeApi::connect(&ApiSource::Url(api_side.url()), Duration::from_secs(5)).unwrap().with_bind_lock(None);
    let ext = Extender::watched(cluster, plan_support::similarity_predictor(), None, w.view());
    (w, Arc::new(ext.with_api(api)))
}

fn pod(c: &FakeCluster, ns: &str, name: &str) -> Pod {
    serde_json::from_value(c.pod(ns, name).unwrap()).unwrap()
}

fn filter(c: &FakeCluster, ext: &Extender, name: &str, nodes: &[&str]) -> cluster_matcher::extender::ExtenderFilterResult {
    ext.filter(ExtenderArgs {
        pod: pod(c, "ml", name),
        nodes: None,
        node_names: Some(nodes.iter().map(|s| s.to_string()).collect()),
    })
}

fn bind(c: &FakeCluster, ext: &Extender, name: &str, node: &str) -> String {
    let uid = c.pod("ml", name).unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
    ext.bind(ExtenderBindingArgs { pod_name: name.into(), pod_namespace: "ml".into(), pod_uid: uid, node: node.into() })
        .error
}

fn node_of(c: &FakeCluster, name: &str) -> Value {
    c.pod("ml", name).unwrap()["spec"]["nodeName"].clone()
}

/// A pod of `job` already bound to `node`/`gpu` and running.
fn running(job: &str, suffix: &str, node: &str, gpu: u32) -> Value {
    let mut p = job_pod("ml", job, suffix, "1", 4000);
    p["spec"]["nodeName"] = node.into();
    p["metadata"]["annotations"]["xshare.io/gpu"] = gpu.to_string().into();
    p["status"]["phase"] = "Running".into();
    p
}

fn at(node: &str, gpu: u32) -> GpuRef {
    GpuRef { node: node.into(), gpu }
}

/// Job `a` runs on n1/0; job `b` may only run on n1's GPU type. A round free to move jobs
/// moves `a` to n2/0 and gives n1/0 to `b`, but nothing moves `a`: n1/0 would hold two
/// offline pods. The extender's rounds keep `a` where it runs, and `b` waits.
#[test]
fn a_running_job_keeps_its_gpu_and_no_new_job_is_given_it() {
    let now = now_ms();
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now, &["Healthy"]))));
    let mut n2 = node("n2", "1", Some(heartbeat_json("n2", now, &["Healthy"])));
    n2["metadata"]["labels"]["xshare.io/gpu-type"] = "T4".into();
    c.add_node(n2);
    c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
    c.add_pod(online_pod("prod", "svc-2", "1", "n2", 0));
    c.add_pod(running("a", "x", "n1", 0));
    let mut b = job_pod("ml", "b", "y", "1", 4000);
    b["metadata"]["annotations"]["xshare.io/gpu-types"] = "V100M32".into();
    c.add_pod(b);
    let (_w, ext) = ext_on(&c, 1, 4);
    let _pl = ext.spawn_planner();
    ext.replan();
    eventually("replanned", || ext.snapshot().round >= 1);
    let plan = ext.plan();
    let a = plan.assignments.iter().find(|x| x.offline == "ml/a").expect("a placed");
    assert_eq!((&a.at, a.kept), (&at("n1", 0), true), "{plan:?}");
    assert!(plan.breaks.is_empty(), "{plan:?}");
    assert!(plan.unplaced.contains(&"ml/b".to_string()), "{plan:?}");
    assert_eq!(ext.decide(&pod(&c, "ml", "b-y")), PodDecision::Waiting("ml/b".into()));
    let f = filter(&c, &ext, "b-y", &["n1", "n2"]);
    assert_eq!(f.node_names, Some(vec![]), "{f:?}");
    assert!(!bind(&c, &ext, "b-y", "n1").is_empty());
    assert!(node_of(&c, "b-y").is_null());
}

/// The plan the bind reads may be behind what runs (a pod bound before the round saw it,
/// or by another extender): a bind onto a GPU the watch shows holding
/// `max_offline_per_gpu` live offline pods is refused, whatever the plan says.
#[test]
fn a_bind_to_a_gpu_the_watch_shows_full_is_refused() {
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
    c.add_pod(job_pod("ml", "a", "x", "1", 4000));
    let (w, ext) = ext_on(&c, 1, 2);
    // The first plan (no planner running: it stays) places a on n1/0.
    assert_eq!(ext.decide(&pod(&c, "ml", "a-x")), PodDecision::Placed(at("n1", 0)));
    // Then a pod of another job appears on n1/0.
    c.add_pod(running("z", "1", "n1", 0));
    let v = w.view();
    eventually("z seen", || v.pod("ml", "z-1").is_some());
    let f = filter(&c, &ext, "a-x", &["n1"]);
    assert_eq!(f.node_names, Some(vec![]), "{f:?}");
    assert!(f.failed_and_unresolvable_nodes["n1"].contains("ml/z-1"), "{f:?}");
    let e = bind(&c, &ext, "a-x", "n1");
    assert!(e.contains("GPU n1/0 already holds 1 live offline pod(s) (ml/z-1)"), "{e}");
    assert!(node_of(&c, "a-x").is_null(), "not bound");
    assert!(metrics::render(&ext).contains("xshare_extender_bind_refusals_total{reason=\"gpu_full\"} 1"));
    // Once z is gone, a is bound.
    c.delete_pod("ml", "z-1", Some(0));
    eventually("z gone", || v.pod("ml", "z-1").is_none());
    assert_eq!(bind(&c, &ext, "a-x", "n1"), "");
    assert_eq!(node_of(&c, "a-x"), "n1");
}

/// A pause pod a tenant labelled offline (another tenant's, with a GPU and a huge memory
/// annotation) and bound by hand to n1/0 asks for no `xshare.io/offline-gpu`: it holds no GPU
/// slot. The plan places the real job there and the bind guard does not count the fake.
#[test]
fn a_pod_labelled_offline_without_the_resource_holds_no_gpu() {
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
    let mut fake = running("squat", "1", "n1", 0);
    fake["metadata"]["labels"]["xshare.io/tenant"] = "vc-other".into();
    fake["metadata"]["annotations"]["xshare.io/memory-mib"] = "80000".into();
    fake["spec"]["containers"][0]["resources"] = json!({});
    c.add_pod(fake);
    c.add_pod(job_pod("ml", "a", "x", "1", 4000));
    let (_w, ext) = ext_on(&c, 1, 3);
    assert_eq!(ext.decide(&pod(&c, "ml", "a-x")), PodDecision::Placed(at("n1", 0)), "{:?}", ext.plan());
    let f = filter(&c, &ext, "a-x", &["n1"]);
    assert_eq!(f.node_names, Some(vec!["n1".to_string()]), "{f:?}");
    assert_eq!(bind(&c, &ext, "a-x", "n1"), "");
    assert_eq!(node_of(&c, "a-x"), "n1");
    assert_eq!(ext.guard_refusal_counts(), (0, 0));
}

/// A Job with parallelism 2: the plan gives the job one GPU slot, so its second pod waits
/// while the first runs (here on a GPU with room for two offline pods, so only the job's
/// own rule stops it).
#[test]
fn a_second_pod_of_a_running_job_is_not_stacked_on_its_gpu() {
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-0", "1", "n1", 0));
    c.add_pod(running("train", "p1", "n1", 0));
    c.add_pod(job_pod("ml", "train", "p2", "1", 4000));
    let (_w, ext) = ext_on(&c, 2, 3);
    assert_eq!(ext.decide(&pod(&c, "ml", "train-p2")), PodDecision::Placed(at("n1", 0)));
    let f = filter(&c, &ext, "train-p2", &["n1"]);
    assert_eq!(f.node_names, Some(vec![]), "{f:?}");
    assert!(f.failed_and_unresolvable_nodes["n1"].contains("already runs pod ml/train-p1"), "{f:?}");
    let e = bind(&c, &ext, "train-p2", "n1");
    assert!(e.contains("job ml/train already runs pod ml/train-p1 on n1/0"), "{e}");
    assert!(node_of(&c, "train-p2").is_null(), "not bound");
    assert!(metrics::render(&ext).contains("xshare_extender_bind_refusals_total{reason=\"job_has_pod\"} 1"));
}

/// Two pods of one job Pending at once: the first bind wins; the second is refused, whether
/// the watch shows the first bound yet or only the bind made through this extender does.
#[test]
fn two_pending_pods_of_one_job_are_not_both_bound() {
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-0", "1", "n1", 0));
    c.add_pod(job_pod("ml", "train", "p1", "1", 4000));
    c.add_pod(job_pod("ml", "train", "p2", "1", 4000));
    let (_w, ext) = ext_on(&c, 2, 3);
    assert_eq!(bind(&c, &ext, "train-p1", "n1"), "");
    let e = bind(&c, &ext, "train-p2", "n1");
    assert!(e.contains("job ml/train already") && e.contains("ml/train-p1"), "{e}");
    assert!(node_of(&c, "train-p2").is_null(), "not bound");
}

/// The pods seen in filter calls are remembered (bind reads their job) only while they are
/// there: a job's pod deleted (and replaced by its Job under another name) is forgotten once
/// the watch no longer shows it and two rounds have passed since it was last asked about; the
/// replacement, asked about, is remembered. Fails without that: the map kept every pod name
/// the extender ever saw.
#[test]
fn pods_the_watch_no_longer_shows_are_forgotten() {
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
    c.add_pod(job_pod("ml", "b", "y", "1", 4000));
    let (w, ext) = ext_on(&c, 1, 2);
    let _pl = ext.spawn_planner();
    assert_ne!(ext.decide(&pod(&c, "ml", "b-y")), PodDecision::NotOurs);
    assert_eq!(ext.pods_remembered(), 1);
    c.delete_pod("ml", "b-y", Some(0));
    let v = w.view();
    eventually("pod gone from the watch", || v.pod("ml", "b-y").is_none());
    // The rounds below must see the Job's replacement (its own watch event, maybe later):
    // else they no longer know job ml/b at all, and forget b-y for that instead.
    eventually("the Job's new pod in the watch", || v.snapshot().pods.iter().any(|p| p.metadata.namespace.as_deref() == Some("ml")));
    for _ in 0..2 {
        let round = ext.snapshot().round;
        ext.replan();
        eventually("replanned", || ext.snapshot().round > round);
    }
    eventually("forgotten", || ext.pods_remembered() == 0);
    let replacement = v.snapshot().pods.into_iter().find(|p| p.metadata.namespace.as_deref() == Some("ml")).expect("the Job's new pod");
    assert_ne!(ext.decide(&replacement), PodDecision::NotOurs);
    assert_eq!(ext.pods_remembered(), 1);
}

/// Two jobs per GPU: a job bound alone holds the quota it was bound with for its pod's life
/// (node-agent freezes the plan a pod started with; its shim enforces it), so a later round
/// gives a newcomer beside it only the GPU memory it does not hold. Before, the round shared
/// the whole room again between the two as if the running job held only its need: the
/// newcomer's quota and the running one's together promised 4000 MiB more than the GPU has.
#[test]
fn a_newcomer_beside_a_running_job_gets_only_the_memory_it_does_not_hold() {
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
    c.add_pod(job_pod("ml", "a", "x", "1", 4000));
    let (w, ext) = ext_with(&c, half_gpu_two_per_gpu(), 2);
    let v = w.view();
    let _pl = ext.spawn_planner();
    let quota_mib = |name: &str| -> u64 {
        let p = c.pod("ml", name).unwrap();
        p["metadata"]["annotations"]["xshare.io/memory-quota-bytes"].as_str().expect("bound with a quota").parse::<u64>().unwrap() >> 20
    };
    assert_eq!(bind(&c, &ext, "a-x", "n1"), "");
    assert_eq!(quota_mib("a-x"), 16384, "alone: its cap");
    eventually("a seen bound", || v.pod("ml", "a-x").is_some_and(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n1")));
    c.add_pod(job_pod("ml", "b", "y", "1", 4000));
    eventually("b listed", || v.pod("ml", "b-y").is_some());
    let round = ext.snapshot().round;
    ext.replan();
    eventually("replanned", || ext.snapshot().round > round);
    assert_eq!(ext.decide(&pod(&c, "ml", "b-y")), PodDecision::Placed(at("n1", 0)));
    assert_eq!(bind(&c, &ext, "b-y", "n1"), "");
    assert_eq!(quota_mib("a-x") + quota_mib("b-y"), 24768, "the GPU's room, not more: a {} b {}", quota_mib("a-x"), quota_mib("b-y"));
}

fn prioritize(c: &FakeCluster, ext: &Extender, name: &str, nodes: &[&str]) -> Vec<i64> {
    let args = ExtenderArgs { pod: pod(c, "ml", name), nodes: None, node_names: Some(nodes.iter().map(|s| s.to_string()).collect()) };
    ext.prioritize(args).into_iter().map(|h| h.score).collect()
}

/// kube-scheduler runs its own filters (NodeResourcesFit, taints, node selector, affinity)
/// before the extender: a node they reject is not among the nodes the filter call names.
/// When that is the node the plan places the job on, the extender remembers the refusal,
/// counts it once, and the next round plans the job on a node the scheduler does offer.
/// Fails without it: every round planned the same node and the pod stayed Pending.
#[test]
fn a_node_the_schedulers_own_filters_leave_out_is_planned_no_more() {
    let now = now_ms();
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now, &["Healthy"]))));
    c.add_node(node("n2", "1", Some(heartbeat_json("n2", now, &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
    c.add_pod(online_pod("prod", "svc-2", "1", "n2", 0));
    c.add_pod(job_pod("ml", "a", "x", "1", 4000));
    let (_w, ext) = ext_on(&c, 1, 3);
    let PodDecision::Placed(planned) = ext.decide(&pod(&c, "ml", "a-x")) else { panic!("a placed: {:?}", ext.plan()) };
    let other = if planned.node == "n1" { "n2" } else { "n1" };
    // kube-scheduler first tries a pod's nominated node alone: no refusal of the planned one.
    let mut nominated = pod(&c, "ml", "a-x");
    nominated.status.get_or_insert_with(Default::default).nominated_node_name = Some(other.into());
    let f = ext.filter(ExtenderArgs { pod: nominated, nodes: None, node_names: Some(vec![other.into()]) });
    assert_eq!(f.node_names, Some(vec![]), "{f:?}");
    assert!(metrics::render(&ext).contains("xshare_extender_scheduler_refusals_total 0\n"));
    // The scheduler offers only the other node (the planned one has no CPU left, say).
    for _ in 0..2 {
        let f = filter(&c, &ext, "a-x", &[other]);
        assert_eq!(f.node_names, Some(vec![]), "{f:?}");
        assert!(f.failed_and_unresolvable_nodes[other].contains("left out"), "{f:?}");
    }
    assert!(metrics::render(&ext).contains("xshare_extender_scheduler_refusals_total 1\n"), "one new (job, node) pair, counted once");
    // The filter call woke the planner: its first round runs at once.
    let _pl = ext.spawn_planner();
    eventually("replanned", || ext.snapshot().round >= 1);
    assert_eq!(ext.decide(&pod(&c, "ml", "a-x")), PodDecision::Placed(at(other, 0)), "{:?}", ext.plan());
    let f = filter(&c, &ext, "a-x", &[other]);
    assert_eq!(f.node_names, Some(vec![other.to_string()]), "{f:?}");
    assert!(prioritize(&c, &ext, "a-x", &[other])[0] > 0);
    assert_eq!(bind(&c, &ext, "a-x", other), "");
    assert_eq!(node_of(&c, "a-x"), other);
    assert!(metrics::render(&ext).contains("xshare_extender_scheduler_refusals_total 1\n"));
}

/// A job whose pods kube-scheduler's own filters allow on one node of forty (a node selector
/// to a pool, say): the first filter call after the planned node is left out offers only that
/// node, and the next round plans the job there, not on the next best of the 39 others (one
/// node learnt per attempt, about 10 s each, before; and with more such nodes ahead than
/// refusals alive in `scheduler_refusal_ttl_s`, never).
#[test]
fn a_job_the_schedulers_filters_allow_on_one_node_of_forty_is_planned_there_at_once() {
    let now = now_ms();
    let c = FakeCluster::start();
    for i in 1..=40 {
        let n = format!("n{i}");
        c.add_node(node(&n, "1", Some(heartbeat_json(&n, now, &["Healthy"]))));
        c.add_pod(online_pod("prod", &format!("svc-{i}"), "1", &n, 0));
    }
    c.add_pod(job_pod("ml", "a", "x", "1", 4000));
    let (_w, ext) = ext_on(&c, 1, 41);
    let PodDecision::Placed(planned) = ext.decide(&pod(&c, "ml", "a-x")) else { panic!("a placed: {:?}", ext.plan()) };
    let pool = if planned.node == "n40" { "n39" } else { "n40" };
    let f = filter(&c, &ext, "a-x", &[pool]);
    assert_eq!(f.node_names, Some(vec![]), "{f:?}");
    let _pl = ext.spawn_planner();
    eventually("replanned", || ext.snapshot().round >= 1);
    assert_eq!(ext.decide(&pod(&c, "ml", "a-x")), PodDecision::Placed(at(pool, 0)), "{:?}", ext.plan());
    assert_eq!(filter(&c, &ext, "a-x", &[pool]).node_names, Some(vec![pool.to_string()]));
    assert!(metrics::render(&ext).contains("xshare_extender_scheduler_refusals_total 1\n"));
}

/// The nodes a refused job may be planned on follow what kube-scheduler's filters offer at
/// each later call: offered only a full node, the job waits; offered a free one too (a node
/// uncordoned, a terminating pod's CPU freed), the next round places it there, without
/// waiting for the refusal's TTL (before, the first call's nodes held for 300 s).
#[test]
fn a_refused_jobs_allowed_nodes_follow_the_nodes_later_calls_offer() {
    let now = now_ms();
    let c = FakeCluster::start();
    for n in ["n1", "n2", "n3"] {
        c.add_node(node(n, "1", Some(heartbeat_json(n, now, &["Healthy"]))));
        c.add_pod(online_pod("prod", &format!("svc-{n}"), "1", n, 0));
    }
    c.add_pod(running("z", "1", "n2", 0));
    c.add_pod(job_pod("ml", "a", "x", "1", 4000));
    let (_w, ext) = ext_on(&c, 1, 5);
    let PodDecision::Placed(planned) = ext.decide(&pod(&c, "ml", "a-x")) else { panic!("a placed: {:?}", ext.plan()) };
    assert_ne!(planned.node, "n2", "n2 is full");
    let free = if planned.node == "n1" { "n3" } else { "n1" };
    let _pl = ext.spawn_planner();
    // Only the full node offered: planned nowhere.
    let _ = filter(&c, &ext, "a-x", &["n2"]);
    eventually("waiting", || matches!(ext.decide(&pod(&c, "ml", "a-x")), PodDecision::Waiting(_)));
    // The free node offered again: placed there at the next round.
    let _ = filter(&c, &ext, "a-x", &["n2", free]);
    eventually("placed on the node offered again", || ext.decide(&pod(&c, "ml", "a-x")) == PodDecision::Placed(at(free, 0)));
}

/// An offline pod whose `xshare.io/memory-mib` is missing or not a number cannot be planned.
/// Filter passes it no node, with the annotation named (kube-scheduler puts the reason in the
/// pod's FailedScheduling event), and prioritize scores it 0. Fails without it: the pod was
/// "not ours", passed every node, and every bind failed with "not an offline job of the plan".
#[test]
fn an_offline_pod_without_a_usable_memory_annotation_passes_no_node_and_says_why() {
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
    let mut missing = job_pod("ml", "a", "x", "1", 4000);
    missing["metadata"]["annotations"].as_object_mut().unwrap().remove("xshare.io/memory-mib");
    c.add_pod(missing);
    let mut bad = job_pod("ml", "b", "y", "1", 4000);
    bad["metadata"]["annotations"]["xshare.io/memory-mib"] = "4GiB".into();
    c.add_pod(bad);
    let (_w, ext) = ext_on(&c, 1, 3);
    for (name, what) in [("a-x", "without xshare.io/memory-mib"), ("b-y", "bad xshare.io/memory-mib `4GiB`")] {
        let f = filter(&c, &ext, name, &["n1"]);
        assert_eq!(f.node_names, Some(vec![]), "{f:?}");
        assert!(f.failed_and_unresolvable_nodes["n1"].contains(what), "{f:?}");
        assert_eq!(prioritize(&c, &ext, name, &["n1"]), vec![0]);
        let e = bind(&c, &ext, name, "n1");
        assert!(e.contains(what), "{e}");
        assert!(node_of(&c, name).is_null());
    }
}

/// A well-formed offline pod the latest round did not see (created after it) passes no node
/// yet, says so, and wakes the planner, whose next round plans it (the rounds here are an
/// hour apart and the watch's changes wake nothing: only the filter call can have).
#[test]
fn an_offline_pod_newer_than_the_plan_waits_for_the_round_its_filter_call_starts() {
    let c = FakeCluster::start();
    c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
    c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
    let (w, ext) = ext_on(&c, 1, 1);
    let _pl = ext.spawn_planner();
    c.add_pod(job_pod("ml", "a", "x", "1", 4000));
    let v = w.view();
    eventually("a listed", || v.pod("ml", "a-x").is_some());
    let f = filter(&c, &ext, "a-x", &["n1"]);
    assert_eq!(f.node_names, Some(vec![]), "{f:?}");
    assert!(f.failed_and_unresolvable_nodes["n1"].contains("not yet in a plan round"), "{f:?}");
    eventually("planned", || ext.decide(&pod(&c, "ml", "a-x")) == PodDecision::Placed(at("n1", 0)));
    assert_eq!(filter(&c, &ext, "a-x", &["n1"]).node_names, Some(vec!["n1".to_string()]));
}

/// The round a bind starts usually runs before the watch shows the pod bound: the job's GPU
/// then comes from the extender's own record of the bind, and so must the quota it was bound
/// with. Here the watch never shows the bind (it watches a copy of the cluster the binds do not
/// reach): before, that round charged the running job only its need, and a newcomer bound from
/// it got part of what the first still held (16384 + 12384 MiB against 24768 of room).
#[test]
fn a_newcomer_planned_before_the_watch_shows_a_bind_gets_only_what_the_bound_job_leaves() {
    let (watched, api_side) = (FakeCluster::start(), FakeCluster::start());
    for c in [&watched, &api_side] {
        c.add_node(node("n1", "1", Some(heartbeat_json("n1", now_ms(), &["Healthy"]))));
        c.add_pod(online_pod("prod", "svc-1", "1", "n1", 0));
        c.add_pod(job_pod("ml", "a", "x", "1", 4000));
    }
    let (w, ext) = ext_split(&watched, &api_side, half_gpu_two_per_gpu(), 2);
    let v = w.view();
    let _pl = ext.spawn_planner();
    let quota_mib = |name: &str| -> u64 {
        let p = api_side.pod("ml", name).unwrap();
        p["metadata"]["annotations"]["xshare.io/memory-quota-bytes"].as_str().expect("bound with a quota").parse::<u64>().unwrap() >> 20
    };
    assert_eq!(bind(&api_side, &ext, "a-x", "n1"), "");
    assert_eq!(quota_mib("a-x"), 16384);
    for c in [&watched, &api_side] {
        c.add_pod(job_pod("ml", "b", "y", "1", 4000));
    }
    eventually("b listed", || v.pod("ml", "b-y").is_some());
    let round = ext.snapshot().round;
    ext.replan();
    eventually("replanned", || ext.snapshot().round > round);
    assert!(v.pod("ml", "a-x").is_some_and(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()), "the watch never saw a bound");
    assert_eq!(bind(&api_side, &ext, "b-y", "n1"), "");
    assert_eq!(quota_mib("a-x") + quota_mib("b-y"), 24768, "a {} b {}", quota_mib("a-x"), quota_mib("b-y"));
}
