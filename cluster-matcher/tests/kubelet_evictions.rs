//! The kubelet's node-pressure eviction of an offline pod, carried to its node agent: the
//! extender's one watch of the kubelet's `Evicted` Events (not one per node: the API server
//! keeps no watch cache of events by default) writes the eviction onto the pod
//! (`xshare.io/kubelet-eviction`), which the node agent's pod watch sees at once. Against the
//! stateful fake API server, whose kubelet records the Event before it kills and reports the
//! pod's status only once its containers ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_matcher::kube_api::ApiSource;
use cluster_matcher::watch::{ClusterWatch, WatchSettings};
use fake_kube::cluster::FakeCluster;
use fake_kube::objects::*;
use kube_contract::kubelet_eviction::{KubeletEviction, ANNOTATION};

fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(30), "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const PRESSURE: &str = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 92Mi. ";

fn bound_job_pod(suffix: &str, node: &str) -> serde_json::Value {
    let mut p = job_pod("ml", "train", suffix, "1", 4096);
    p["spec"]["nodeName"] = node.into();
    p["status"]["phase"] = "Running".into();
    p
}

/// The watch event of the kubelet of gpu-node-1 evicting pod ml/train-a (`uid`) now, at
/// resource version `rv`.
fn added_eviction_event(uid: &str, rv: &str) -> serde_json::Value {
    serde_json::json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "train-a.1", "namespace": "ml", "resourceVersion": rv},
        "involvedObject": {"kind": "Pod", "namespace": "ml", "name": "train-a", "uid": uid, "apiVersion": "v1"},
        "reason": "Evicted", "message": PRESSURE, "source": {"component": "kubelet", "host": "gpu-node-1"},
        "firstTimestamp": k8s_openapi::jiff::Timestamp::from_millisecond(now_ms() as i64).unwrap().to_string(),
        "count": 1, "type": "Warning"}})
}

fn eviction_of(c: &FakeCluster, name: &str) -> Option<KubeletEviction> {
    c.pod("ml", name)?["metadata"]["annotations"][ANNOTATION].as_str().map(|v| KubeletEviction::parse(v).unwrap())
}

#[test]
fn the_kubelets_eviction_of_an_offline_pod_is_written_onto_it_once() {
    let c = FakeCluster::start();
    c.add_pod(bound_job_pod("a", "gpu-node-1"));
    c.add_pod(bound_job_pod("b", "gpu-node-1"));
    c.add_pod(online_pod("prod", "svc-0", "1", "gpu-node-1", 0));
    let w = ClusterWatch::start(&ApiSource::Url(c.url()), WatchSettings::default(), Arc::new(|| {})).unwrap();
    assert!(w.wait_synced(Duration::from_secs(30)));
    let v = w.view();
    eventually("a watch of the kubelet's evictions", || !c.api.watches("/api/v1/events").is_empty());
    let q = &c.api.watches("/api/v1/events")[0].query;
    assert_eq!(q.get("fieldSelector").map(String::as_str), Some("involvedObject.kind=Pod,reason=Evicted,source=kubelet"), "{q:?}");

    c.kubelet_evict("ml", "train-a", PRESSURE);
    eventually("the eviction written onto the pod", || eviction_of(&c, "train-a").is_some());
    let e = eviction_of(&c, "train-a").unwrap();
    let event = c.events().into_iter().find(|e| e["reason"] == "Evicted").unwrap();
    let since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time = serde_json::from_value(event["firstTimestamp"].clone()).unwrap();
    let uid = c.pod("ml", "train-a").unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(e, KubeletEviction { uid, node: "gpu-node-1".into(), since_unix_ms: since.0.as_millisecond() as u64, node_pressure: true });
    // A second Event for it (the kubelet's eviction manager tried again): written already.
    eventually("the watch shows the annotation", || {
        v.pod("ml", "train-a").is_some_and(|p| p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION)))
    });
    c.kubelet_evict("ml", "train-a", PRESSURE);
    eventually("the second Event skipped", || v.stats.kubelet_evictions_skipped.load(std::sync::atomic::Ordering::Relaxed) == 1);
    // Not an offline pod: nothing written.
    c.kubelet_evict("prod", "svc-0", PRESSURE);
    // Its containers ended: the kubelet reports the status; nothing written again.
    c.kubelet_evicted_pod_stopped("ml", "train-a", PRESSURE);
    std::thread::sleep(Duration::from_millis(300));
    assert!(c.pod("prod", "svc-0").unwrap()["metadata"]["annotations"][ANNOTATION].is_null());
    assert_eq!(eviction_of(&c, "train-b"), None, "the other offline pod goes on");
    let patches = c.api.all().into_iter().filter(|r| r.method == "PATCH" && r.path.ends_with("/pods/train-a")).count();
    assert_eq!(patches, 1, "written once");
    // The online pod's Event: looked for again while the watch might lag, then skipped.
    eventually("the online pod's Event skipped", || v.stats.kubelet_evictions_skipped.load(std::sync::atomic::Ordering::Relaxed) == 2);
    assert_eq!(v.stats.kubelet_evictions_annotated.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(v.stats.kubelet_eviction_errors.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn the_watch_of_the_kubelets_evictions_can_be_left_off() {
    let c = FakeCluster::start();
    c.add_pod(bound_job_pod("a", "gpu-node-1"));
    let w = ClusterWatch::start(&ApiSource::Url(c.url()), WatchSettings { kubelet_evictions: false, ..Default::default() }, Arc::new(|| {})).unwrap();
    assert!(w.wait_synced(Duration::from_secs(30)));
    c.kubelet_evict("ml", "train-a", PRESSURE);
    std::thread::sleep(Duration::from_millis(300));
    assert!(c.api.requests("/api/v1/events").is_empty());
    assert_eq!(eviction_of(&c, "train-a"), None);
}

/// The Events watch starts at the version of a one-Event list with no selector (one etcd read,
/// not a list of every Event), and a `410 Gone` inside it (etcd compacted past a version no
/// matching Event moved on) takes a fresh version the same way: not counted as an error, never
/// a list of the cluster's Events. An eviction then seen is written onto its pod, with its UID
/// as the patch's precondition.
#[test]
fn the_events_watch_starts_from_now_and_a_gone_version_takes_a_fresh_one_without_a_list() {
    use fake_kube::{fake_api, Answer};
    use serde_json::json;
    const EVENTS: &str = "/api/v1/events";
    let pod = bound_job_pod("a", "gpu-node-1");
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let evicted = added_eviction_event(&uid, "201");
    let served_pod = pod.clone();
    let api = fake_api(move |r, before| match (r.path.as_str(), r.is_watch()) {
        ("/api/v1/pods", false) => Answer::Json(200, list("PodList", "10", vec![served_pod.clone()]), vec![]),
        ("/api/v1/nodes", false) => Answer::Json(200, list("NodeList", "10", vec![]), vec![]),
        (EVENTS, false) => {
            let rv = if before.iter().any(|b| !b.is_watch()) { "200" } else { "100" };
            Answer::Json(200, list("EventList", rv, vec![]), vec![])
        }
        (EVENTS, true) if r.rv() == "100" => Answer::Stream(vec![json!({"type": "ERROR", "object": gone("100")})], false),
        (EVENTS, true) if r.rv() == "200" => Answer::Stream(vec![evicted.clone()], true),
        ("/api/v1/namespaces/ml/pods/train-a", false) if r.method == "PATCH" => Answer::Json(200, served_pod.clone(), vec![]),
        (_, true) => Answer::Stream(vec![], true),
        _ => Answer::Json(404, status(404, "NotFound", "no", json!({})), vec![]),
    });
    let w = ClusterWatch::start(&ApiSource::Url(api.url.clone()), WatchSettings::default(), Arc::new(|| {})).unwrap();
    assert!(w.wait_synced(Duration::from_secs(30)));
    let v = w.view();
    eventually("the eviction written", || v.stats.kubelet_evictions_annotated.load(std::sync::atomic::Ordering::Relaxed) == 1);
    let lists: Vec<_> = api.lists(EVENTS);
    assert_eq!(lists.len(), 2, "one version at the start, one after the 410");
    for l in &lists {
        assert_eq!(l.query.get("limit").map(String::as_str), Some("1"), "{:?}", l.query);
        assert!(!l.query.contains_key("fieldSelector"), "never a selected list (it reads every Event): {:?}", l.query);
    }
    let from: Vec<_> = api.watches(EVENTS).iter().map(|r| r.rv().to_string()).collect();
    assert_eq!(&from[..2], ["100", "200"]);
    assert_eq!(v.stats.errors.load(std::sync::atomic::Ordering::Relaxed), 0, "a 410 is not an error here");
    let patch = api.requests("/api/v1/namespaces/ml/pods/train-a").into_iter().find(|r| r.method == "PATCH").unwrap();
    let body = patch.json();
    assert_eq!(body["metadata"]["uid"], uid.as_str(), "{body}");
    let e = KubeletEviction::parse(body["metadata"]["annotations"][ANNOTATION].as_str().unwrap()).unwrap();
    assert_eq!((e.uid.as_str(), e.node.as_str(), e.node_pressure), (uid.as_str(), "gpu-node-1", true));
}

/// A write refused for its UID precondition (`409`: the pod of that name was made again since
/// the kubelet evicted the old one) is not tried again: that pod is not the evicted one.
#[test]
fn a_write_refused_for_its_uid_is_not_tried_again() {
    use fake_kube::{fake_api, Answer};
    use serde_json::json;
    const EVENTS: &str = "/api/v1/events";
    const POD: &str = "/api/v1/namespaces/ml/pods/train-a";
    let pod = bound_job_pod("a", "gpu-node-1");
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let evicted = added_eviction_event(&uid, "101");
    let served_pod = pod.clone();
    let api = fake_api(move |r, _| match (r.path.as_str(), r.is_watch()) {
        ("/api/v1/pods", false) => Answer::Json(200, list("PodList", "10", vec![served_pod.clone()]), vec![]),
        ("/api/v1/nodes", false) => Answer::Json(200, list("NodeList", "10", vec![]), vec![]),
        (EVENTS, false) => Answer::Json(200, list("EventList", "100", vec![]), vec![]),
        (EVENTS, true) if r.rv() == "100" => Answer::Stream(vec![evicted.clone()], true),
        // As the API server answers a merge patch carrying another UID than the pod's.
        (POD, false) if r.method == "PATCH" => Answer::Json(422, uid_immutable("Pod", "train-a", &uid), vec![]),
        (_, true) => Answer::Stream(vec![], true),
        _ => Answer::Json(404, status(404, "NotFound", "no", json!({})), vec![]),
    });
    let w = ClusterWatch::start(&ApiSource::Url(api.url.clone()), WatchSettings::default(), Arc::new(|| {})).unwrap();
    assert!(w.wait_synced(Duration::from_secs(30)));
    let v = w.view();
    eventually("the refused write skipped", || v.stats.kubelet_evictions_skipped.load(std::sync::atomic::Ordering::Relaxed) == 1);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(api.requests(POD).iter().filter(|r| r.method == "PATCH").count(), 1, "not tried again");
    assert_eq!(v.stats.kubelet_eviction_errors.load(std::sync::atomic::Ordering::Relaxed), 0);
}
