//! The offline pod list node-agent writes for the monitors (`<ledger_dir>/offline-pods.json`),
//! kept by a watch of this node's pods against a loopback API server speaking the list/watch
//! protocol: which pods are in it, that it follows a change at the change's event (not at a
//! poll), that a failing watch leaves the last list in force and a gone version relists, and
//! that a removed file is written again.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_kube::cluster::FakeCluster;
use fake_kube::objects::{gone, list};
use fake_kube::{fake_api, Answer};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use node_agent::config::KubeConfig;
use node_agent::offline_pods::{run, Publisher, DEFAULT_DELETED_POD_LINGER, WATCH_TIMEOUT_S};
use node_daemon::offline_pods::{path, read};

const RUNNING: &str = "11111111-1111-4111-8111-111111111111";
const DELETING: &str = "22222222-2222-4222-8222-222222222222";
const DONE: &str = "33333333-3333-4333-8333-333333333333";
const ONLINE: &str = "44444444-4444-4444-8444-444444444444";
const LATER: &str = "55555555-5555-4555-8555-555555555555";
const ELSEWHERE: &str = "66666666-6666-4666-8666-666666666666";

const PODS: &str = "/api/v1/pods";

fn pod(name: &str, uid: &str, phase: &str) -> serde_json::Value {
    let mut p = common::offline_pod(name, uid, "node-a", Some(0), "2026-01-01T00:00:00Z");
    p["status"]["phase"] = phase.into();
    p
}

/// `pod` as its kubelet reports it before it confirms a graceful deletion: its container
/// terminated.
fn stopped(mut pod: serde_json::Value) -> serde_json::Value {
    pod["status"]["containerStatuses"] = serde_json::json!([{"name": "main", "image": "trainer:1", "imageID": "", "ready": false,
        "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]);
    pod
}

fn online(uid: &str) -> serde_json::Value {
    let mut p = pod("web", uid, "Running");
    p["spec"]["containers"][0]["resources"] = serde_json::json!({"limits": {"nvidia.com/gpu": "1"}});
    p
}

fn uids(dir: &std::path::Path) -> Vec<String> {
    read(&path(dir))
        .ok()
        .flatten()
        .map(|l| l.pods.into_iter().map(|p| p.uid).collect())
        .unwrap_or_default()
}

/// Polls `cond` until it holds (a generous deadline, only against hanging forever).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(30), "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The publisher's watch against `url`, its file checked every `check`; returns the stop
/// sender (dropping it stops nothing: send `true`) and the metrics text it keeps.
async fn start(url: String, dir: &std::path::Path, check: Duration) -> (tokio::sync::watch::Sender<bool>, Arc<Mutex<String>>) {
    start_with(url, dir, check, |p| p).await
}

/// [`start`] with the publisher as `with` makes it.
async fn start_with(
    url: String,
    dir: &std::path::Path,
    check: Duration,
    with: impl FnOnce(Publisher) -> Publisher,
) -> (tokio::sync::watch::Sender<bool>, Arc<Mutex<String>>) {
    let client = node_agent::kube::watch_client(&KubeConfig { api_url: url, timeout_ms: 2000 }, WATCH_TIMEOUT_S).await.unwrap();
    let p = with(Publisher::new("node-a", kube_contract::OFFLINE_GPU_RESOURCE, dir));
    assert_eq!(p.path(), path(dir));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let metrics = Arc::new(Mutex::new(String::new()));
    tokio::spawn(run(client, p, check, rx, metrics.clone()));
    (tx, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_follows_this_nodes_pods_at_each_event_not_at_a_poll() {
    let tmp = tempfile::tempdir().unwrap();
    let c = FakeCluster::start();
    c.add_pod(pod("train", RUNNING, "Running"));
    c.add_pod(pod("deleting", DELETING, "Running"));
    c.add_pod(pod("done", DONE, "Succeeded"));
    c.add_pod(online(ONLINE));
    let mut other = pod("other", ELSEWHERE, "Running");
    other["spec"]["nodeName"] = "node-b".into();
    c.add_pod(other);
    // Terminating: its processes still run until the kubelet reports them stopped.
    c.delete_pod("batch", "deleting", Some(3600));
    // Checked once an hour: every change below can reach the file only through the watch.
    let (stop, metrics) = start(c.url(), tmp.path(), Duration::from_secs(3600)).await;

    eventually("the first list written", || uids(tmp.path()) == [RUNNING, DELETING]).await;
    // Each pod with its plan's memory (the annotation Allocate gives the shim as its quota):
    // the monitor holds the pod to it.
    let plans: Vec<_> = read(&path(tmp.path())).unwrap().unwrap().pods.into_iter().map(|p| p.memory_quota_bytes).collect();
    assert_eq!(plans, [Some(2 << 30), Some(2 << 30)]);
    // The file is written at the list's end, before the watch request goes out.
    eventually("a watch after the list", || !c.api.watches(PODS).is_empty()).await;
    let w = c.api.watches(PODS);
    assert_eq!(w[0].query.get("fieldSelector").map(String::as_str), Some("spec.nodeName=node-a"), "{:?}", w[0].query);

    c.add_pod(pod("later", LATER, "Pending"));
    eventually("a new offline pod at its ADDED event", || uids(tmp.path()) == [RUNNING, DELETING, LATER]).await;
    c.set_pod_phase("batch", "later", "Succeeded");
    eventually("a finished pod left out at its MODIFIED event", || uids(tmp.path()) == [RUNNING, DELETING]).await;
    // The kubelet reports its containers stopped, then confirms the deletion.
    c.add_pod(stopped(c.pod("batch", "deleting").unwrap()));
    assert!(c.kubelet_confirm_stopped("batch", "deleting", DELETING));
    eventually("a deleted pod whose containers stopped left out at its DELETED event", || uids(tmp.path()) == [RUNNING]).await;
    // The metrics text is rendered just after the file is written.
    eventually("the metrics of the list in force", || metrics.lock().unwrap().contains("xshare_node_agent_offline_pods{node=\"node-a\"} 1")).await;
    let m = metrics.lock().unwrap().clone();
    assert!(m.contains("xshare_node_agent_offline_pod_lists_total{node=\"node-a\"} 1"), "one list, then events only: {m}");
    assert_eq!(c.api.lists(PODS).len(), 1, "no list a poll");
    let _ = stop.send(true);
}

/// `kubectl delete pod --grace-period=0 --force` of a running offline pod: the API server
/// deletes it at once, its containers run on; it stays in the list past its DELETED event,
/// with its plan, until its cgroup (here a pod-shaped tree of the test's own) holds no process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_deleted_pod_stays_listed_until_its_cgroup_is_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let cg = tempfile::tempdir().unwrap();
    let events = cg.path().join(format!("kubepods/besteffort/pod{DELETING}/cgroup.events"));
    std::fs::create_dir_all(events.parent().unwrap()).unwrap();
    std::fs::write(&events, "populated 1\nfrozen 0\n").unwrap();
    let c = FakeCluster::start();
    c.add_pod(pod("train", RUNNING, "Running"));
    let mut forced = pod("forced", DELETING, "Running");
    forced["spec"]["terminationGracePeriodSeconds"] = 3600.into();
    c.add_pod(forced);
    let root = cg.path().to_owned();
    let (stop, metrics) = start_with(c.url(), tmp.path(), Duration::from_millis(100), |p| p.with_cgroup_root(Some(root))).await;
    eventually("the first list written", || uids(tmp.path()) == [RUNNING, DELETING]).await;
    c.delete_pod("batch", "forced", Some(0));
    assert!(c.pod("batch", "forced").is_none(), "gone from the API at once");
    eventually("its DELETED event seen", || metrics.lock().unwrap().contains("xshare_node_agent_offline_pods_deleted{node=\"node-a\"} 1")).await;
    assert_eq!(quotas(tmp.path()), [Some(2 << 30), Some(2 << 30)], "still listed with its plan");
    std::fs::write(&events, "populated 0\nfrozen 0\n").unwrap();
    eventually("out once its cgroup holds no process", || uids(tmp.path()) == [RUNNING]).await;
    eventually("counted", || metrics.lock().unwrap().contains("xshare_node_agent_offline_pods_deleted_dropped_total{node=\"node-a\"} 1")).await;
    let _ = stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_watch_keeps_the_list_a_gone_version_relists_and_a_removed_file_is_written_again() {
    let tmp = tempfile::tempdir().unwrap();
    // List at version 100: one offline pod. The watch from 100 fails twice (500), then the
    // version is gone (410); the relist at 200 has a second pod, and its watch stays quiet.
    let api = fake_api(|r, before| match (r.path.as_str(), r.is_watch()) {
        (PODS, false) if before.iter().all(|b| b.is_watch()) => {
            Answer::Json(200, list("PodList", "100", vec![pod("train", RUNNING, "Running")]), vec![])
        }
        (PODS, false) => Answer::Json(
            200,
            list("PodList", "200", vec![pod("train", RUNNING, "Running"), pod("later", LATER, "Running")]),
            vec![],
        ),
        (PODS, true) if r.rv() == "100" && before.iter().filter(|b| b.is_watch()).count() < 2 => Answer::Json(
            500,
            fake_kube::objects::status(500, "InternalError", "etcdserver: request timed out", serde_json::json!({})),
            vec![],
        ),
        (PODS, true) if r.rv() == "100" => Answer::Json(410, gone("100"), vec![]),
        (PODS, true) => Answer::Stream(vec![], true),
        _ => Answer::Json(404, fake_kube::objects::status(404, "NotFound", "no", serde_json::json!({})), vec![]),
    });
    let (stop, metrics) = start(api.url.clone(), tmp.path(), Duration::from_millis(100)).await;
    eventually("the relisted pods", || uids(tmp.path()) == [RUNNING, LATER]).await;
    assert_eq!(api.lists(PODS).len(), 2, "one list, one relist after the 410");
    assert_eq!(api.watches(PODS).iter().filter(|r| r.rv() == "100").count(), 3, "two failed watches, one gone");
    let m = metrics.lock().unwrap().clone();
    assert!(m.contains("xshare_node_agent_offline_pod_list_errors_total{node=\"node-a\"} 3"), "{m}");
    assert!(m.contains("xshare_node_agent_offline_pod_lists_total{node=\"node-a\"} 2"), "{m}");

    std::fs::remove_file(path(tmp.path())).unwrap();
    eventually("the removed file written again at the next check", || uids(tmp.path()) == [RUNNING, LATER]).await;
    let _ = stop.send(true);
}

fn typed(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

#[test]
fn nothing_is_written_before_the_first_list_completes_and_a_relist_replaces_the_set_keeping_what_it_lost_as_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let mut p = Publisher::new("node-a", kube_contract::OFFLINE_GPU_RESOURCE, tmp.path());
    assert!(!p.apply(&Event::Init));
    assert!(!p.apply(&Event::InitApply(typed(pod("train", RUNNING, "Running")))));
    assert!(!p.refresh(), "no list completed: nothing to write");
    assert!(!path(tmp.path()).exists());
    assert!(p.apply(&Event::InitDone));
    assert_eq!(uids(tmp.path()), [RUNNING]);
    assert!(!p.apply(&Event::Apply(typed(online(ONLINE)))), "an online pod changes nothing");
    assert!(p.apply(&Event::Apply(typed(pod("later", LATER, "Pending")))));
    assert_eq!(uids(tmp.path()), [RUNNING, LATER]);
    // A relist (after the watch was down) that no longer has `train`: the set is replaced at
    // InitDone, not before (the monitors keep the whole last list until the new one is
    // complete), but `train`, deleted meanwhile with its last word unknown (its containers may
    // still run: a forced deletion), stays as a deleted pod.
    let t1 = Instant::now();
    assert!(!p.apply_at(&Event::Init, t1));
    assert!(!p.apply_at(&Event::InitApply(typed(pod("later", LATER, "Running"))), t1));
    assert_eq!(uids(tmp.path()), [RUNNING, LATER]);
    assert!(!p.apply_at(&Event::InitDone, t1), "the same list");
    assert_eq!(uids(tmp.path()), [RUNNING, LATER]);
    // Its kubelet said `later`'s containers stopped before it let it go: out at its DELETED event.
    assert!(p.apply(&Event::Delete(typed(stopped(pod("later", LATER, "Running"))))));
    assert_eq!(uids(tmp.path()), [RUNNING]);
    // `train` once its grace (the default 30 s) and the linger passed.
    assert!(p.refresh_at(t1 + Duration::from_secs(30) + DEFAULT_DELETED_POD_LINGER));
    assert_eq!(uids(tmp.path()), Vec::<String>::new());
    assert_eq!((p.writes, p.lists, p.errors), (4, 2, 0));
}

fn quotas(dir: &std::path::Path) -> Vec<Option<u64>> {
    read(&path(dir)).ok().flatten().map(|l| l.pods.into_iter().map(|p| p.memory_quota_bytes).collect()).unwrap_or_default()
}

/// A tenant that may patch its own pods (`kubectl annotate --overwrite`) raises its running
/// pod's `xshare.io/memory-quota-bytes`, then removes it: the list the monitor enforces keeps
/// the plan frozen at the pod's first sight, the changes are counted, and an agent restarted
/// afterwards (a new publisher over the same directory) still publishes the frozen plan, not
/// the annotation it reads then. Fails without the frozen plans: the list follows the
/// annotation (85899345920, then no plan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_rewriting_its_plan_annotation_does_not_change_the_list() {
    let tmp = tempfile::tempdir().unwrap();
    let c = FakeCluster::start();
    c.add_pod(pod("train", RUNNING, "Running"));
    let (stop, _metrics) = start(c.url(), tmp.path(), Duration::from_secs(3600)).await;
    eventually("the first list", || quotas(tmp.path()) == [Some(2 << 30)]).await;
    let plans = node_agent::plans::PlanStore::open(tmp.path());

    let mut raised = c.pod("batch", "train").unwrap();
    raised["metadata"]["annotations"]["xshare.io/memory-quota-bytes"] = "85899345920".into();
    c.add_pod(raised);
    // A second pod's event after it: the file is rewritten, so the raise has been applied.
    c.add_pod(pod("later", LATER, "Running"));
    eventually("the second pod listed", || uids(tmp.path()) == [RUNNING, LATER]).await;
    assert_eq!(quotas(tmp.path()), [Some(2 << 30), Some(2 << 30)], "the frozen plan, not the raised annotation");

    let mut removed = c.pod("batch", "train").unwrap();
    removed["metadata"]["annotations"].as_object_mut().unwrap().remove("xshare.io/memory-quota-bytes");
    c.add_pod(removed);
    c.set_pod_phase("batch", "later", "Succeeded");
    eventually("the finished pod left", || uids(tmp.path()) == [RUNNING]).await;
    assert_eq!(quotas(tmp.path()), [Some(2 << 30)], "still planned without its annotation");
    assert_eq!(plans.get(RUNNING).and_then(|p| p.memory_quota_bytes), Some(2 << 30), "the record on disk");
    let _ = stop.send(true);

    // A restarted agent reads the record, not the annotation (now missing).
    std::fs::remove_file(path(tmp.path())).unwrap();
    let (stop, _metrics) = start(c.url(), tmp.path(), Duration::from_secs(3600)).await;
    eventually("the list after a restart", || uids(tmp.path()) == [RUNNING]).await;
    assert_eq!(quotas(tmp.path()), [Some(2 << 30)]);
    let _ = stop.send(true);
}

/// The publisher counts each ignored change on the store it was given; its metrics text says so.
#[test]
fn ignored_plan_changes_are_counted_on_the_shared_store() {
    let tmp = tempfile::tempdir().unwrap();
    let plans = Arc::new(node_agent::plans::PlanStore::open(tmp.path()));
    let mut p = Publisher::new("node-a", kube_contract::OFFLINE_GPU_RESOURCE, tmp.path()).with_plans(plans.clone());
    assert!(!p.apply(&Event::Init));
    assert!(!p.apply(&Event::InitApply(typed(pod("train", RUNNING, "Running")))));
    assert!(p.apply(&Event::InitDone));
    let mut raised = pod("train", RUNNING, "Running");
    raised["metadata"]["annotations"]["xshare.io/memory-quota-bytes"] = " 85899345920 ".into();
    raised["metadata"]["annotations"]["xshare.io/sm-percent"] = "100".into();
    assert!(!p.apply(&Event::Apply(typed(raised))), "nothing to write: the plan is unchanged");
    assert_eq!(quotas(tmp.path()), [Some(2 << 30)]);
    assert_eq!(plans.ignored_changes(), 2, "memory and SM share");
    assert!(plans.metrics("node-a").contains("xshare_node_agent_plan_annotation_changes_ignored_total{node=\"node-a\"} 2"));
}

/// A node-pressure eviction has no deletion, and the kubelet's status says nothing until the
/// containers ended: the extender writes the kubelet's Event onto the pod
/// (`xshare.io/kubelet-eviction`), and this watch writes it into the pod's termination file at
/// that event, at once by default (a hard threshold kills 2 s later). Another node's eviction
/// and another pod are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_eviction_written_onto_the_pod_reaches_its_termination_file() {
    use kube_contract::kubelet_eviction::{KubeletEviction, ANNOTATION};
    use node_ledger::termination::{read, termination_path, Termination};
    let tmp = tempfile::tempdir().unwrap();
    let c = FakeCluster::start();
    c.add_pod(pod("train", RUNNING, "Running"));
    c.add_pod(pod("later", LATER, "Running"));
    let file = |u: &str| termination_path(tmp.path(), node_ledger::PodUid::parse(u).unwrap());
    for u in [RUNNING, LATER] {
        std::fs::create_dir_all(file(u).parent().unwrap()).unwrap();
        node_ledger::termination::create(&file(u)).unwrap();
    }
    let (stop, metrics) = start(c.url(), tmp.path(), Duration::from_secs(3600)).await;
    eventually("the first list written", || uids(tmp.path()) == [RUNNING, LATER]).await;
    let annotate = |name: &str, e: &KubeletEviction| {
        let mut p = c.pod("batch", name).unwrap();
        p["metadata"]["annotations"][ANNOTATION] = e.render().into();
        c.add_pod(p);
    };
    let since = fake_kube::objects::now_ms() / 1000 * 1000;
    annotate("later", &KubeletEviction { uid: LATER.into(), node: "node-b".into(), since_unix_ms: since, node_pressure: true });
    annotate("train", &KubeletEviction { uid: RUNNING.into(), node: "node-a".into(), since_unix_ms: since, node_pressure: true });
    eventually("the eviction written", || read(&file(RUNNING)).is_ok_and(|t| t.is_some())).await;
    assert_eq!(read(&file(RUNNING)), Ok(Some(Termination { deletion_unix_ms: since, grace_ms: 0 })));
    assert_eq!(read(&file(LATER)), Ok(None), "another node's kubelet");
    eventually("counted", || metrics.lock().unwrap().contains("xshare_node_agent_pod_terminations_written_total{node=\"node-a\"} 1")).await;
    let _ = stop.send(true);
}
