//! The offline pod list node-agent writes for the monitors (`<ledger_dir>/offline-pods.json`),
//! against a loopback API server answering real-shaped JSON: which pods are in it, when it is
//! rewritten, and that a failed list leaves the last one in force.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use common::{pod_list, status, FakeApi, Recorded};
use node_agent::config::KubeConfig;
use node_agent::offline_pods::Publisher;
use node_daemon::offline_pods::{path, read};

const RUNNING: &str = "11111111-1111-4111-8111-111111111111";
const DELETING: &str = "22222222-2222-4222-8222-222222222222";
const DONE: &str = "33333333-3333-4333-8333-333333333333";
const ONLINE: &str = "44444444-4444-4444-8444-444444444444";
const LATER: &str = "55555555-5555-4555-8555-555555555555";

fn pod(name: &str, uid: &str, phase: &str) -> serde_json::Value {
    let mut p = common::offline_pod(name, uid, "node-a", Some(0), "2026-01-01T00:00:00Z");
    p["status"]["phase"] = phase.into();
    p
}

/// The pods of node-a as the API server lists them at call `n` (0-based): an offline pod
/// running, one being deleted, one finished, an online service (no offline resource); from
/// call 3 on, a new offline pod too; call 4 fails (500).
fn pods_at(n: u32) -> (u16, serde_json::Value) {
    if n == 4 {
        return (500, status(500, "InternalError", "etcd is down"));
    }
    let mut deleting = pod("deleting", DELETING, "Running");
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:10:00Z".into();
    deleting["metadata"]["deletionGracePeriodSeconds"] = 30.into();
    let mut online = pod("web", ONLINE, "Running");
    online["spec"]["containers"][0]["resources"] = serde_json::json!({"limits": {"nvidia.com/gpu": "1"}});
    let mut items = vec![pod("train", RUNNING, "Running"), deleting, pod("done", DONE, "Succeeded"), online];
    if n >= 3 {
        items.push(pod("later", LATER, "Pending"));
    }
    (200, pod_list(items))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_the_unfinished_offline_pods_rewrites_on_change_and_keeps_the_list_through_a_failed_call() {
    let tmp = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let api = FakeApi::start(Arc::new(move |r: &Recorded| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/api/v1/pods") => pods_at(c.fetch_add(1, Ordering::SeqCst)),
        _ => (404, status(404, "NotFound", "no such path")),
    }))
    .await;
    let client = node_agent::kube::client(&KubeConfig { api_url: api.url(), timeout_ms: 2000 }).await.unwrap();
    let mut p = Publisher::new(client, "node-a", kube_contract::OFFLINE_GPU_RESOURCE, tmp.path());
    assert_eq!(p.path(), path(tmp.path()));
    let uids = || -> Vec<String> { read(&path(tmp.path())).unwrap().unwrap().pods.into_iter().map(|p| p.uid).collect() };

    assert!(p.tick().await, "the first list is written");
    assert_eq!(uids(), [RUNNING, DELETING], "offline pods not finished, a deleted one until it is gone");
    let list = api.take();
    assert_eq!(list.len(), 1);
    assert!(list[0].query.contains("fieldSelector=spec.nodeName%3Dnode-a"), "{}", list[0].query);
    let written = std::fs::read(path(tmp.path())).unwrap();

    assert!(!p.tick().await, "unchanged: not written again");
    assert_eq!(std::fs::read(path(tmp.path())).unwrap(), written);
    std::fs::remove_file(path(tmp.path())).unwrap();
    assert!(p.tick().await, "removed: written again");
    assert_eq!(uids(), [RUNNING, DELETING]);

    assert!(p.tick().await, "a new offline pod: written");
    assert_eq!(uids(), [RUNNING, DELETING, LATER]);

    assert!(!p.tick().await, "the list call failed");
    assert_eq!(uids(), [RUNNING, DELETING, LATER], "the last list stays in force");
    assert_eq!((p.writes, p.errors), (3, 1));
    let m = p.metrics();
    assert!(m.contains("xshare_node_agent_offline_pods{node=\"node-a\"} 3"), "{m}");
    assert!(m.contains("xshare_node_agent_offline_pod_list_errors_total{node=\"node-a\"} 1"), "{m}");
}
