//! A loopback stand-in for the Kubernetes API server: answers each request with what the
//! test's handler returns (real-shaped JSON) and records every request (method, path, query,
//! body) for the test to check against k8s-openapi types and the documented paths.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use node_agent::pb;
use node_agent::pb::registration_server::{Registration, RegistrationServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnixListenerStream;

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
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

pub struct FakeApi {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeApi {
    pub async fn start(handler: Handler) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reqs = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (h, reqs) = (handler.clone(), reqs.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (h, reqs) = (h.clone(), reqs.clone());
                        async move {
                            let method = req.method().to_string();
                            let path = req.uri().path().to_string();
                            let query = req.uri().query().unwrap_or("").to_string();
                            let content_type = req
                                .headers()
                                .get("content-type")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string();
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let rec = Recorded {
                                method,
                                path,
                                query,
                                content_type,
                                body: String::from_utf8_lossy(&body).into_owned(),
                            };
                            let (code, json) = h(&rec);
                            reqs.lock().unwrap().push(rec);
                            let resp = Response::builder()
                                .status(code)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(serde_json::to_vec(&json).unwrap())))
                                .unwrap();
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FakeApi {
            addr,
            requests,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
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

/// The kubelet's side of registration: a `Registration` server on `<dir>/kubelet.sock` that
/// accepts v1beta1 and hands each request to the test.
struct FakeKubelet(mpsc::UnboundedSender<pb::RegisterRequest>);

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(
        &self,
        req: tonic::Request<pb::RegisterRequest>,
    ) -> Result<tonic::Response<pb::Empty>, tonic::Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(tonic::Status::invalid_argument(format!(
                "unsupported version {}",
                r.version
            )));
        }
        let _ = self.0.send(r);
        Ok(tonic::Response::new(pb::Empty {}))
    }
}

pub fn start_kubelet(dir: &std::path::Path) -> mpsc::UnboundedReceiver<pb::RegisterRequest> {
    let (tx, rx) = mpsc::unbounded_channel();
    let l = tokio::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(FakeKubelet(tx)))
            .serve_with_incoming(UnixListenerStream::new(l)),
    );
    rx
}
