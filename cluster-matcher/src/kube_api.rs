//! The extender's Kubernetes API client (kube-rs over k8s-openapi types): writes the plan's
//! decision onto a pod and creates its `Binding` (`POST /api/v1/namespaces/{ns}/pods/{name}/binding`).
//!
//! Calls run on a small tokio runtime this module owns, so the (async) HTTP server and
//! plain threads can both use it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Config};

// The annotation keys live in the shared contract (the node agent reads what we write).
pub use kube_contract::pod::{ANN_COLOCATED_WITH, ANN_GPU, ANN_MEMORY_QUOTA_BYTES, ANN_PLAN_ROUND, ANN_SM_PERCENT};

/// Field manager name for the extender's patches.
pub const FIELD_MANAGER: &str = kube_contract::EXTENDER_FIELD_MANAGER;

/// Where the API server is and how to reach it.
#[derive(Debug, Clone, Default)]
pub enum ApiSource {
    /// In-cluster service account, else `$KUBECONFIG` / `~/.kube/config` (kube's `Config::infer`).
    #[default]
    Infer,
    /// This kubeconfig file (its current context).
    Kubeconfig(std::path::PathBuf),
    /// A plain URL with no credentials (a `kubectl proxy`, or a test's fake server).
    Url(String),
}

/// The plan's decision for one pod, as written onto it before binding.
#[derive(Debug, Clone, PartialEq)]
pub struct PodPlacement {
    /// Node the pod is bound to.
    pub node: String,
    /// GPU index on that node (annotation `ANN_GPU`).
    pub gpu: u32,
    /// MPS active-thread percentage for the pod, 0-100 (written rounded to 2 decimals).
    pub sm_percent: f64,
    /// GPU memory quota for the pod, bytes (the shim's limit).
    pub memory_quota_bytes: u64,
    /// Name of the online workload the pod shares the GPU with.
    pub online: String,
    /// Plan round that made this decision.
    pub round: u64,
}

impl PodPlacement {
    /// The annotations written onto the pod (documented in the README).
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (ANN_GPU.to_string(), self.gpu.to_string()),
            (ANN_SM_PERCENT.to_string(), format!("{}", (self.sm_percent * 100.0).round() / 100.0)),
            (ANN_MEMORY_QUOTA_BYTES.to_string(), self.memory_quota_bytes.to_string()),
            (ANN_COLOCATED_WITH.to_string(), self.online.clone()),
            (ANN_PLAN_ROUND.to_string(), self.round.to_string()),
        ])
    }
}

/// A failed API call, phrased for kube-scheduler's `ExtenderBindingResult.Error`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The API server answered with an error `Status`.
    #[error("{step}: API server answered {code} {reason}: {message}{}", retry_after_s.map(|s| format!(" (retry after {s}s)")).unwrap_or_default())]
    Status {
        /// The call that failed (e.g. reading or patching the pod).
        step: &'static str,
        /// HTTP status code of the answer.
        code: u16,
        /// `Status.reason` (e.g. `NotFound`, `Conflict`).
        reason: String,
        /// `Status.message`, the API server's own words.
        message: String,
        /// `Retry-After` seconds, when the server gave one.
        retry_after_s: Option<u32>,
    },
    /// No answer (connection refused, timeout, TLS, bad body).
    #[error("{step}: {why}")]
    Transport {
        /// The call that failed.
        step: &'static str,
        /// The client error, as text.
        why: String,
    },
}

impl ApiError {
    fn from_kube(step: &'static str, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => ApiError::Status {
                step,
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
                retry_after_s: s.details.as_ref().map(|d| d.retry_after_seconds).filter(|s| *s > 0),
            },
            other => ApiError::Transport { step, why: other.to_string() },
        }
    }

    /// HTTP status of an API answer, if there was one.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            ApiError::Transport { .. } => None,
        }
    }
}

/// A connected client plus the runtime its calls run on.
pub struct KubeApi {
    /// Always `Some` until dropped.
    rt: Option<tokio::runtime::Runtime>,
    client: Client,
    timeout: Duration,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl KubeApi {
    /// Connects (builds the client; no request is made). `timeout` bounds each call: keep it
    /// under kube-scheduler's extender `httpTimeout`.
    pub fn connect(source: &ApiSource, timeout: Duration) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kube-api")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the Kubernetes client runtime: {e}"))?;
        let mut config = rt.block_on(load_config(source))?;
        // kube-scheduler retries the pod itself: a 429/5xx goes back to it at once, instead of
        // being retried here past its extender timeout.
        config.default_retry = false;
        config.read_timeout = Some(timeout);
        config.connect_timeout = Some(timeout);
        let client = rt
            .block_on(async { Client::try_from(config) })
            .map_err(|e| format!("cannot build the Kubernetes client: {e}"))?;
        Ok(Self { rt: Some(rt), client, timeout })
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime present until drop")
    }

    /// Writes `placement` onto the pod (merge patch of its annotations, guarded by `uid`), then
    /// creates its `Binding` to `placement.node` with the pod's UID as precondition.
    pub fn bind_pod(&self, namespace: &str, name: &str, uid: &str, placement: &PodPlacement) -> Result<(), ApiError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let fut = async {
            let mut meta = serde_json::json!({ "annotations": placement.annotations() });
            if !uid.is_empty() {
                // A merge patch carrying metadata.uid fails with 409 if the pod was replaced.
                meta["uid"] = serde_json::Value::String(uid.to_string());
            }
            let patch = serde_json::json!({ "metadata": meta });
            pods.patch(
                name,
                &PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() },
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| ApiError::from_kube("writing the plan onto the pod", e))?;
            let binding = binding_for(namespace, name, uid, &placement.node);
            // The API server answers a created Binding with a `Status` (`status: Success`), not
            // the Binding: any JSON body is success here.
            let _: serde_json::Value = pods
                .create_subresource("binding", name, &PostParams::default(), &binding)
                .await
                .map_err(|e| ApiError::from_kube("creating the Binding", e))?;
            Ok(())
        };
        let timeout = self.timeout * 2;
        self.rt().block_on(async {
            tokio::time::timeout(timeout, fut).await.unwrap_or_else(|_| {
                Err(ApiError::Transport { step: "binding", why: format!("no answer within {timeout:?}") })
            })
        })
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        // A runtime dropped the ordinary way panics inside another runtime's async context
        // (the extender may be dropped by the HTTP server's tasks).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The client configuration `source` names.
pub(crate) async fn load_config(source: &ApiSource) -> Result<Config, String> {
    match source {
        ApiSource::Infer => Config::infer().await.map_err(|e| format!("no in-cluster config and no usable kubeconfig: {e}")),
        ApiSource::Kubeconfig(path) => load_kubeconfig(path).await,
        ApiSource::Url(url) => {
            let uri = url.parse().map_err(|e| format!("bad --kube-api URL `{url}`: {e}"))?;
            Ok(Config::new(uri))
        }
    }
}

async fn load_kubeconfig(path: &Path) -> Result<Config, String> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
    Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| format!("bad kubeconfig {}: {e}", path.display()))
}

/// The `v1.Binding` kube-scheduler's default binder posts: pod name/namespace/UID, target Node.
pub fn binding_for(namespace: &str, name: &str, uid: &str, node: &str) -> Binding {
    Binding {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            uid: (!uid.is_empty()).then(|| uid.to_string()),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    }
}
