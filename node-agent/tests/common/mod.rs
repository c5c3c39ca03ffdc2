//! The loopback stand-in for the Kubernetes API server (shared test support, `fake-kube`),
//! seen through a handler that answers each request with real-shaped JSON (and headers when
//! the test needs them); every request is recorded (method, path, query, body) for the test
//! to check against k8s-openapi types and the documented paths. Plus the kubelet's
//! registration side of the device-plugin API.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use fake_kube::Answer;
use node_agent::pb;
use node_agent::test_support::serve_kubelet;
use tokio::sync::mpsc;

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// The query string as sent (percent-encoded).
    pub query: String,
    pub content_type: String,
    pub body: String,
}

impl Recorded {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

pub type Handler = Arc<dyn Fn(&Recorded) -> (u16, serde_json::Value) + Send + Sync>;
/// A handler that also sets response headers (e.g. `Retry-After`).
pub type HeaderHandler =
    Arc<dyn Fn(&Recorded) -> (u16, serde_json::Value, Vec<(&'static str, String)>) + Send + Sync>;

pub struct FakeApi {
    inner: fake_kube::FakeApi,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
}

impl FakeApi {
    pub async fn start(handler: Handler) -> Self {
        Self::start_with_headers(Arc::new(move |r: &Recorded| {
            let (c, v) = handler(r);
            (c, v, Vec::new())
        }))
        .await
    }

    pub async fn start_with_headers(handler: HeaderHandler) -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reqs = requests.clone();
        let inner = fake_kube::fake_api(move |r, _| {
            let rec = Recorded {
                method: r.method.clone(),
                path: r.path.clone(),
                query: r.raw_query.clone(),
                content_type: r.headers.get("content-type").cloned().unwrap_or_default(),
                body: String::from_utf8_lossy(&r.body).into_owned(),
            };
            let (code, json, headers) = handler(&rec);
            let watch = r.is_watch();
            reqs.lock().unwrap().push(rec);
            // A watch the handler answers 200 (the agent's offline pod list watches this node's
            // pods): an open stream with no event, as the API server's for a quiet node.
            if watch && code == 200 {
                return Answer::Stream(Vec::new(), true);
            }
            Answer::Json(code, json, headers)
        });
        FakeApi { inner, requests }
    }

    pub fn url(&self) -> String {
        self.inner.url.clone()
    }

    pub fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }
}

/// A `metav1.Status` failure as the API server writes it.
pub fn status(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
}

/// A `v1.PodList`.
pub fn pod_list(items: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "100"}, "items": items})
}

/// A Pending pod bound to `node` with the extender's decision (`gpu`) and one container asking
/// for one offline slot.
pub fn offline_pod(
    name: &str,
    uid: &str,
    node: &str,
    gpu: Option<u32>,
    created: &str,
) -> serde_json::Value {
    let mut ann =
        serde_json::json!({"xshare.io/colocated-with": "web", "xshare.io/plan-round": "3"});
    if let Some(g) = gpu {
        ann["xshare.io/gpu"] = g.to_string().into();
        ann["xshare.io/sm-percent"] = "40".into();
        ann["xshare.io/memory-quota-bytes"] = "2147483648".into();
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "batch", "uid": uid, "resourceVersion": "7",
            "creationTimestamp": created, "labels": {"xshare.io/offline-job": "train"}, "annotations": ann},
        "spec": {"nodeName": node, "schedulerName": "xshare-scheduler", "containers": [{"name": "main", "image": "trainer:1",
            "resources": {"limits": {"xshare.io/offline-gpu": "1"}, "requests": {"xshare.io/offline-gpu": "1"}}}]},
        "status": {"phase": "Pending", "qosClass": "BestEffort"}
    })
}

/// The kubelet's side of registration on `<dir>/kubelet.sock` ([`serve_kubelet`]); the
/// registrations it accepted arrive on the receiver.
pub fn start_kubelet(dir: &std::path::Path) -> mpsc::UnboundedReceiver<pb::RegisterRequest> {
    let (tx, rx) = mpsc::unbounded_channel();
    serve_kubelet(dir, move |r| {
        let _ = tx.send(r);
    });
    rx
}
