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
