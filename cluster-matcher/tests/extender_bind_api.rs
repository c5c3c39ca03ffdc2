//! The extender's bind creates the `Binding` through the API server: checked against a fake
//! API server on loopback that verifies each request's verb, path, content type and body
//! (deserialized as k8s-openapi types) and replays answers shaped as a real API server sends
//! them (201 Binding, 409 AlreadyExists, 404 NotFound, 403 Forbidden, 429 with Retry-After,
//! 500).

mod plan_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster_matcher::extender::{self, Extender, ExtenderArgs, ExtenderBindingArgs};
use cluster_matcher::kube_api::{self, ApiSource, KubeApi};
use cluster_matcher::plan::{ClusterSpec, Workloads};
use k8s_openapi::api::core::v1::Binding;
use serde_json::{json, Value};

const NS: &str = "default";
const POD: &str = "train-lm-7d9f";
const UID: &str = "6f1c2a0e-3f7b-4a51-9c1e-0d2b7e4c0013";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender").join(name)
}

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    url: String,
    content_type: String,
    body: Vec<u8>,
}

type Reply = (u16, Value, Vec<(&'static str, String)>);

/// A fake API server: records every request and answers with `reply`.
struct FakeApi {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn fake_api(reply: impl Fn(&Seen) -> Reply + Send + 'static) -> FakeApi {
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
    let url = format!("http://{}", server.server_addr().to_ip().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s, log) = (server.clone(), seen.clone());
    let thread = std::thread::spawn(move || {
        for mut req in s.incoming_requests() {
            let mut body = Vec::new();
            req.as_reader().read_to_end(&mut body).unwrap();
            let content_type = req
                .headers()
                .iter()
                .find(|h| h.field.equiv("Content-Type"))
                .map(|h| h.value.to_string())
                .unwrap_or_default();
            let rec =
                Seen { method: req.method().as_str().to_string(), url: req.url().to_string(), content_type, body };
            let (status, value, headers) = reply(&rec);
            log.lock().unwrap().push(rec);
            let mut resp = tiny_http::Response::from_string(value.to_string())
                .with_status_code(status)
                .with_header(tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).unwrap());
            for (k, v) in headers {
                resp = resp.with_header(tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).unwrap());
            }
            let _ = req.respond(resp);
        }
    });
    FakeApi { url, seen, server, thread: Some(thread) }
}

fn status(code: u16, reason: &str, message: &str, details: Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "details": details, "code": code})
}

fn pod_json() -> Value {
    json!({"kind": "Pod", "apiVersion": "v1",
           "metadata": {"name": POD, "namespace": NS, "uid": UID, "resourceVersion": "48212"},
           "spec": {"containers": [{"name": "train", "image": "train:1"}]}, "status": {"phase": "Pending"}})
}

fn binding_created(seen: &Seen) -> Reply {
    let b: Binding = serde_json::from_slice(&seen.body).unwrap();
    (201, serde_json::to_value(&b).unwrap(), vec![])
}

/// Answers the annotation patch with the pod and the binding POST with `binding`.
fn api_answering(binding: impl Fn(&Seen) -> Reply + Send + 'static) -> FakeApi {
    fake_api(move |s| if s.method == "PATCH" { (200, pod_json(), vec![]) } else { binding(s) })
}

fn extender_with(api: &FakeApi) -> Arc<Extender> {
    extender_locking(api, None)
}

fn extender_locking(api: &FakeApi, bind_lock_ttl: Option<Duration>) -> Arc<Extender> {
    let cluster = ClusterSpec::load(&fixture("cluster.json")).unwrap();
    let workloads = Workloads::load(&fixture("workloads.json"), &cluster).unwrap();
    let client =
        KubeApi::connect(&ApiSource::Url(api.url.clone()), Duration::from_secs(5)).unwrap().with_bind_lock(bind_lock_ttl);
    let ext = Extender::new(cluster, workloads, plan_support::similarity_predictor(), None).with_api(client);
    let ext = Arc::new(ext);
    // kube-scheduler filters before it binds: the pod -> job mapping comes from there.
    let args: ExtenderArgs = serde_json::from_slice(&std::fs::read(fixture("filter_nodenames.json")).unwrap()).unwrap();
    assert_eq!(ext.filter(args).node_names.unwrap(), ["gpu-b"]);
    ext
}

fn bind_args() -> ExtenderBindingArgs {
    serde_json::from_slice(&std::fs::read(fixture("bind.json")).unwrap()).unwrap()
}

fn bindings_posted(api: &FakeApi) -> Vec<Seen> {
    api.seen.lock().unwrap().iter().filter(|s| s.method == "POST").cloned().collect()
}

#[test]
fn bind_patches_the_plan_onto_the_pod_then_posts_the_binding() {
    let api = api_answering(binding_created);
    let ext = extender_with(&api);
    // Through the HTTP server, as kube-scheduler calls it.
    let server = extender::HttpServer::start("127.0.0.1:0", ext.clone(), Default::default()).unwrap();
    let body = std::fs::read(fixture("bind.json")).unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "POST /xshare/bind HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).unwrap();
    s.write_all(&body).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let reply: Value = serde_json::from_str(out.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(reply, json!({"Error": ""}));

    let seen = api.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    // 1. The plan's decision is written onto the pod (merge patch, UID-guarded).
    let patch = &seen[0];
    assert_eq!(patch.method, "PATCH");
    assert_eq!(patch.url.split('?').next().unwrap(), format!("/api/v1/namespaces/{NS}/pods/{POD}"));
    assert_eq!(patch.content_type, "application/merge-patch+json");
    let p: Value = serde_json::from_slice(&patch.body).unwrap();
    assert_eq!(p["metadata"]["uid"], UID);
    let ann = &p["metadata"]["annotations"];
    let plan = ext.plan();
    let a = plan.assignments.iter().find(|a| a.offline == "train-lm").unwrap();
    assert_eq!(ann[kube_api::ANN_GPU], a.gpu_index_string());
    assert_eq!(ann[kube_api::ANN_MEMORY_QUOTA_BYTES], (a.memory_quota_mib << 20).to_string());
    assert_eq!(ann[kube_api::ANN_SM_PERCENT].as_str().unwrap().parse::<f64>().unwrap().round(), a.sm_percent.round());
    assert_eq!(ann[kube_api::ANN_COLOCATED_WITH], a.online);
    // 2. The Binding subresource, with the pod's UID and the target Node.
    let post = &seen[1];
    assert_eq!(post.method, "POST");
    assert_eq!(post.url.split('?').next().unwrap(), format!("/api/v1/namespaces/{NS}/pods/{POD}/binding"));
    assert_eq!(post.content_type, "application/json");
    let b: Binding = serde_json::from_slice(&post.body).unwrap();
    assert_eq!(b.metadata.name.as_deref(), Some(POD));
    assert_eq!(b.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(b.metadata.uid.as_deref(), Some(UID));
    assert_eq!(b.target.kind.as_deref(), Some("Node"));
    assert_eq!(b.target.name.as_deref(), Some("gpu-b"));
    // Recorded as running for the next round.
    assert_eq!(ext.bindings()["train-lm"].node, "gpu-b");
    ext.stop_planner();
}

trait GpuIndex {
    fn gpu_index_string(&self) -> String;
}
impl GpuIndex for cluster_matcher::plan::Assignment {
    fn gpu_index_string(&self) -> String {
        self.at.gpu.to_string()
    }
}

fn refused_binding(reply: Reply, expect: &[&str]) {
    let api = api_answering(move |_| reply.clone());
    let ext = extender_with(&api);
    let r = ext.bind(bind_args());
    for word in expect {
        assert!(r.error.contains(word), "`{}` lacks `{word}`", r.error);
    }
    assert!(ext.bindings().is_empty(), "a refused binding must not be recorded");
    // Exactly one attempt: kube-scheduler retries the pod, the client does not retry behind it.
    assert_eq!(bindings_posted(&api).len(), 1);
}

#[test]
fn already_bound_pod_409_is_reported() {
    let details = json!({"name": POD, "kind": "pods/binding"});
    let msg = format!(
        "Operation cannot be fulfilled on pods/binding \"{POD}\": pod {POD} is already assigned to node \"gpu-a\""
    );
    refused_binding((409, status(409, "Conflict", &msg, details), vec![]), &["409", "Conflict", "already assigned"]);
    let details = json!({"name": POD, "kind": "pods"});
    let msg = format!("pods \"{POD}\" already exists");
    refused_binding((409, status(409, "AlreadyExists", &msg, details), vec![]), &["409", "AlreadyExists"]);
}

#[test]
fn throttled_429_is_reported_with_its_retry_after() {
    let body =
        status(429, "TooManyRequests", "Too many requests, please try again later.", json!({"retryAfterSeconds": 3}));
    refused_binding((429, body, vec![("Retry-After", "3".into())]), &["429", "TooManyRequests", "retry after 3s"]);
}

#[test]
fn forbidden_and_server_errors_are_reported() {
    let msg = format!("pods \"{POD}\" is forbidden: User \"system:serviceaccount:kube-system:xshare-extender\" cannot create resource \"pods/binding\" in API group \"\" in the namespace \"default\"");
    refused_binding(
        (403, status(403, "Forbidden", &msg, json!({"name": POD, "kind": "pods"})), vec![]),
        &["403", "Forbidden"],
    );
    refused_binding(
        (500, status(500, "InternalError", "etcdserver: request timed out", json!({})), vec![]),
        &["500", "etcdserver"],
    );
}

#[test]
fn pod_gone_404_stops_before_binding() {
    let api = fake_api(|_| {
        let msg = format!("pods \"{POD}\" not found");
        (404, status(404, "NotFound", &msg, json!({"name": POD, "kind": "pods"})), vec![])
    });
    let ext = extender_with(&api);
    let r = ext.bind(bind_args());
    assert!(r.error.contains("404") && r.error.contains("NotFound"), "{}", r.error);
    assert!(bindings_posted(&api).is_empty(), "no Binding for a pod that is gone");
    assert!(ext.bindings().is_empty());
}

#[test]
fn unreachable_api_server_is_an_error_not_a_success() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let cluster = ClusterSpec::load(&fixture("cluster.json")).unwrap();
    let workloads = Workloads::load(&fixture("workloads.json"), &cluster).unwrap();
    let client = KubeApi::connect(&ApiSource::Url(url), Duration::from_secs(2)).unwrap();
    let ext = Extender::new(cluster, workloads, plan_support::similarity_predictor(), None).with_api(client);
    let args: ExtenderArgs = serde_json::from_slice(&std::fs::read(fixture("filter_nodenames.json")).unwrap()).unwrap();
    ext.filter(args);
    let r = ext.bind(bind_args());
    assert!(!r.error.is_empty());
    assert!(ext.bindings().is_empty());
}

#[test]
fn the_client_can_be_dropped_inside_an_async_context() {
    // The extender's last reference may go away on an HTTP server task.
    let api = KubeApi::connect(&ApiSource::Url("http://127.0.0.1:1".into()), Duration::from_secs(1)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async move { drop(api) });
}

#[test]
fn a_node_another_pods_bind_holds_is_answered_with_an_error_naming_it_and_nothing_is_written() {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let lock = kube_contract::bind_lock::BindLock { uid: "uid-other".into(), namespace: "ml".into(), name: "other".into(), since_unix_ms: since };
    let api = fake_api(move |s| match (s.method.as_str(), s.url.split('?').next().unwrap()) {
        ("GET", "/api/v1/nodes/gpu-b") => (200, json!({"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": "gpu-b", "resourceVersion": "77", "annotations": {kube_contract::bind_lock::ANNOTATION: lock.encode()}}}), vec![]),
        // The holder still waits for its Allocate: Pending, bound here, not started.
        ("GET", "/api/v1/namespaces/ml/pods/other") => (200, json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "other", "namespace": "ml", "uid": "uid-other", "resourceVersion": "70"},
            "spec": {"nodeName": "gpu-b", "containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Pending"}}), vec![]),
        _ => (500, status(500, "InternalError", "not expected here", json!({})), vec![]),
    });
    let ext = extender_locking(&api, Some(Duration::from_secs(120)));
    let r = ext.bind(bind_args());
    assert!(r.error.contains("held by the bind of pod ml/other") && r.error.contains("kube-scheduler retries"), "{}", r.error);
    let seen = api.seen.lock().unwrap().clone();
    assert!(seen.iter().all(|s| s.method == "GET"), "nothing written: {seen:?}");
    assert!(ext.bindings().is_empty());
    assert_eq!(ext.api().unwrap().bind_lock_counts(), (1, 0));
}
