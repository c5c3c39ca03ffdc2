//! The GPU of each online pod on this node reaches the pod: the agent asks the kubelet's
//! PodResources API (a fake kubelet serving `List` on a unix socket, as the real one does on
//! `/var/lib/kubelet/pod-resources/kubelet.sock`) which devices each container got, lists this
//! node's online pods (`labelSelector=xshare.io/role=online`, `fieldSelector=spec.nodeName=…`)
//! and writes `xshare.io/gpu` with a JSON merge patch carrying the pod's UID (a precondition),
//! field manager `xshare-node-agent`. Without it the extender's plan skipped every online pod
//! ("online pod not bound or without xshare.io/gpu"): no offline work was ever placed.

mod common;

use std::sync::{Arc, Mutex};

use common::{pod_list, status, FakeApi, Recorded};
use node_agent::config::{AgentConfig, GpuConfig, KubeConfig};
use node_agent::online_gpus::OnlineGpus;
use node_agent::podresources_pb::{ContainerDevices, ContainerResources, PodResources};

fn online_pod(name: &str, uid: &str, gpu: Option<&str>) -> serde_json::Value {
    let mut p = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "prod", "uid": uid, "resourceVersion": "5",
            "labels": {"xshare.io/role": "online"}, "annotations": {}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "server:1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}});
    if let Some(g) = gpu {
        p["metadata"]["annotations"]["xshare.io/gpu"] = g.into();
    }
    p
}

fn listed(name: &str, ids: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: "prod".into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices { resource_name: "nvidia.com/gpu".into(), device_ids: ids.iter().map(|s| s.to_string()).collect() }],
        }],
    }
}

async fn worker(url: String, socket: &std::path::Path) -> OnlineGpus {
    let client = node_agent::kube::client(&KubeConfig { api_url: url, timeout_ms: 2000 }).await.unwrap();
    let mut cfg = AgentConfig {
        node_name: "node-a".into(),
        gpus: vec![
            GpuConfig { index: 0, uuid: "GPU-aaa".into(), model: String::new() },
            GpuConfig { index: 1, uuid: "GPU-bbb".into(), model: String::new() },
        ],
        ..AgentConfig::default()
    };
    cfg.online_gpus.pod_resources_socket = socket.to_path_buf();
    OnlineGpus::new(client, &cfg)
}

fn patches(api: &FakeApi) -> Vec<Recorded> {
    api.requests.lock().unwrap().iter().filter(|r| r.method == "PATCH").cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_online_pod_gets_the_gpu_the_kubelet_gave_it() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("kubelet.sock");
    // `web` has no annotation, `api` names another GPU than it got, `ok` names its own, `multi`
    // got two GPUs, `new` is not admitted yet (the kubelet does not list it).
    let kubelet = Arc::new(Mutex::new(vec![
        listed("web", &["GPU-bbb::2"]),
        listed("api", &["GPU-aaa"]),
        listed("ok", &["1"]),
        listed("multi", &["GPU-aaa", "GPU-bbb"]),
        // A name the kubelet lists twice (one pod gone, one admitted): no UID tells which.
        listed("dup", &["GPU-aaa"]),
        listed("dup", &["GPU-bbb"]),
    ]));
    node_agent::test_support::serve_pod_resources(&socket, kubelet.clone());
    let pods = vec![
        online_pod("web", "u-web", None),
        online_pod("api", "u-api", Some("1")),
        online_pod("ok", "u-ok", Some("1")),
        online_pod("multi", "u-multi", None),
        online_pod("new", "u-new", None),
        online_pod("dup", "u-dup", None),
    ];
    let api = FakeApi::start(Arc::new(move |r: &Recorded| match r.method.as_str() {
        "GET" if r.path == "/api/v1/pods" => (200, pod_list(pods.clone())),
        "PATCH" => (200, online_pod("patched", "u", None)),
        _ => (404, status(404, "NotFound", "not here")),
    }))
    .await;
    let mut w = worker(api.url(), &socket).await;
    w.tick().await;
    let list = api.requests.lock().unwrap().iter().find(|r| r.method == "GET").cloned().expect("a list");
    let q = &list.query;
    assert!(q.contains("labelSelector=xshare.io%2Frole%3Donline") && q.contains("fieldSelector=spec.nodeName%3Dnode-a"), "{q}");
    // From the API server's cache, not a consistent read of every pod, every round, every node.
    assert!(q.contains("resourceVersion=0"), "{q}");
    let mut got: Vec<(String, serde_json::Value)> = patches(&api).iter().map(|r| (r.path.clone(), r.json())).collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("/api/v1/namespaces/prod/pods/api".to_string(), serde_json::json!({"metadata": {"uid": "u-api", "annotations": {"xshare.io/gpu": "0"}}})),
            ("/api/v1/namespaces/prod/pods/web".to_string(), serde_json::json!({"metadata": {"uid": "u-web", "annotations": {"xshare.io/gpu": "1"}}})),
        ],
        "only the pods whose annotation is missing or wrong, each with its UID"
    );
    let p = patches(&api);
    assert!(p.iter().all(|r| r.content_type == "application/merge-patch+json"), "{p:?}");
    assert!(p.iter().all(|r| r.query.contains("fieldManager=xshare-node-agent")), "{p:?}");
    assert!(w.metrics().contains("xshare_node_agent_online_gpu_writes_total 2"), "{}", w.metrics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_kubelet_answer_writes_nothing_and_is_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let api = FakeApi::start(Arc::new(move |r: &Recorded| match r.method.as_str() {
        "GET" => (200, pod_list(vec![online_pod("web", "u-web", None)])),
        _ => (200, online_pod("patched", "u", None)),
    }))
    .await;
    let mut w = worker(api.url(), &tmp.path().join("missing.sock")).await;
    w.tick().await;
    assert!(patches(&api).is_empty());
    assert!(w.metrics().contains("xshare_node_agent_online_gpu_errors_total 1"), "{}", w.metrics());
}

/// A patch the API keeps refusing (an old ClusterRole without `patch`, or the admission policy
/// on a cluster whose tokens name no node) is tried again after 2, 4 … 64 rounds, not every
/// round: 2 patches in 3 rounds, 3 in 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_patch_backs_off() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("kubelet.sock");
    node_agent::test_support::serve_pod_resources(&socket, Arc::new(Mutex::new(vec![listed("web", &["GPU-aaa"])])));
    let api = FakeApi::start(Arc::new(move |r: &Recorded| match r.method.as_str() {
        "GET" => (200, pod_list(vec![online_pod("web", "u-web", None)])),
        _ => (403, status(403, "Forbidden", "pods \"web\" is forbidden: User \"system:serviceaccount:kube-system:xshare-node-agent\" cannot patch resource \"pods\"")),
    }))
    .await;
    let mut w = worker(api.url(), &socket).await;
    for _ in 0..3 {
        w.tick().await;
    }
    assert_eq!(patches(&api).len(), 2, "rounds 1 and 3");
    for _ in 0..4 {
        w.tick().await;
    }
    assert_eq!(patches(&api).len(), 3, "then round 7");
}
