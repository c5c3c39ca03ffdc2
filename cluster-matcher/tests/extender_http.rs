//! The scheduler extender over loopback HTTP, fed recorded request bodies of the shapes
//! kube-scheduler sends (`tests/fixtures/extender/`).

mod plan_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cluster_matcher::extender::{self, Extender};
use cluster_matcher::plan::{ClusterSpec, Workloads};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender").join(name)
}

/// A running extender on an ephemeral loopback port; stopped on drop.
struct Running {
    addr: String,
    _server: extender::HttpServer,
    ext: Arc<Extender>,
}

fn start() -> Running {
    let cluster = ClusterSpec::load(&fixture("cluster.json")).unwrap();
    let workloads = Workloads::load(&fixture("workloads.json"), &cluster).unwrap();
    let ext = Arc::new(Extender::new(cluster, workloads, plan_support::similarity_predictor(), None));
    let server = extender::HttpServer::start("127.0.0.1:0", ext.clone(), Default::default()).unwrap();
    let addr = server.local_addr().to_string();
    Running { addr, _server: server, ext }
}

/// Sends one request; returns status and parsed JSON body.
fn request(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    fake_kube::http::request(addr, method, path, body).status_json()
}

fn post_fixture(addr: &str, path: &str, name: &str) -> (u16, Value) {
    request(addr, "POST", path, &std::fs::read(fixture(name)).unwrap())
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort();
    k
}

#[test]
fn filter_keeps_only_the_planned_node_in_both_request_forms() {
    let r = start();
    let (status, v) = post_fixture(&r.addr, "/xshare/filter", "filter_nodenames.json");
    assert_eq!(status, 200, "{v}");
    assert_eq!(keys(&v), ["Error", "FailedAndUnresolvableNodes", "FailedNodes", "NodeNames"]);
    assert_eq!(v["NodeNames"], serde_json::json!(["gpu-b"]));
    // Placed elsewhere by the plan: preemption on gpu-a changes nothing, so unresolvable
    // (a FailedNodes entry would let DefaultPreemption evict victims there for nothing).
    assert!(v["FailedAndUnresolvableNodes"]["gpu-a"].as_str().unwrap().contains("gpu-b/0"), "{v}");
    assert!(v["FailedNodes"].as_object().unwrap().is_empty(), "{v}");
    assert_eq!(v["Error"], "");

    let (status, v) = post_fixture(&r.addr, "/xshare/filter", "filter_nodes.json");
    assert_eq!(status, 200, "{v}");
    let items = v["Nodes"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "gpu-b");
    assert_eq!(items[0]["status"]["capacity"]["nvidia.com/gpu"], "1", "node objects pass through whole");
    assert!(v.get("NodeNames").is_none());
}

#[test]
fn waiting_jobs_are_unresolvable_and_other_pods_pass_untouched() {
    let r = start();
    let (_, v) = post_fixture(&r.addr, "/filter", "filter_waiting.json");
    assert_eq!(v["NodeNames"], serde_json::json!([]));
    assert_eq!(keys(&v["FailedAndUnresolvableNodes"]), ["gpu-a", "gpu-b"]);
    let (_, v) = post_fixture(&r.addr, "/filter", "filter_not_offline.json");
    assert_eq!(v["NodeNames"], serde_json::json!(["gpu-a", "gpu-b"]));
    assert!(v["FailedNodes"].as_object().unwrap().is_empty());
}

#[test]
fn prioritize_scores_the_planned_node_within_extender_range() {
    let r = start();
    let (status, v) = post_fixture(&r.addr, "/prioritize", "prioritize.json");
    assert_eq!(status, 200);
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(keys(&list[0]), ["Host", "Score"]);
    let score = |h: &str| list.iter().find(|e| e["Host"] == h).unwrap()["Score"].as_i64().unwrap();
    assert_eq!(score("gpu-a"), 0);
    assert!((1..=extender::MAX_EXTENDER_PRIORITY).contains(&score("gpu-b")));
}

#[test]
fn bind_refuses_what_the_plan_does_not_say_and_never_fakes_success() {
    let r = start();
    post_fixture(&r.addr, "/filter", "filter_nodenames.json");
    let (status, v) = post_fixture(&r.addr, "/bind", "bind_wrong_node.json");
    assert_eq!(status, 200);
    assert!(v["Error"].as_str().unwrap().contains("not gpu-a"), "{v}");
    assert!(r.ext.bindings().is_empty());
    // With no API server to create the Binding, a planned bind is an error, not a false
    // success (tests/extender_bind_api.rs binds through a fake API server).
    let (_, v) = post_fixture(&r.addr, "/bind", "bind.json");
    assert_eq!(keys(&v), ["Error"]);
    assert!(v["Error"].as_str().unwrap().contains("no Kubernetes API client"), "{v}");
    assert!(r.ext.bindings().is_empty());
}

#[test]
fn hostile_requests_get_clear_errors_and_the_server_survives() {
    let r = start();
    let (status, v) = request(&r.addr, "POST", "/filter", b"{\"Pod\": 42");
    assert_eq!(status, 400);
    assert!(v["Error"].as_str().unwrap().contains("ExtenderArgs"), "{v}");
    let (status, _) = request(&r.addr, "POST", "/bind", b"[]");
    assert_eq!(status, 400);
    let (status, v) = request(&r.addr, "GET", "/nope", b"");
    assert_eq!(status, 404);
    assert!(v["Error"].as_str().unwrap().contains("filter"));
    let (status, v) = request(&r.addr, "GET", "/plan", b"");
    assert_eq!(status, 200);
    assert_eq!(v["assignments"].as_array().unwrap().len(), 2);
}
