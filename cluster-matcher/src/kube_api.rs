//! The extender's Kubernetes API client (kube-rs over k8s-openapi types): takes the node's bind
//! lock (`kube_contract::bind_lock`), writes the plan's decision onto a pod and creates its
//! `Binding` (`POST /api/v1/namespaces/{ns}/pods/{name}/binding`).
//!
//! Calls run on a small tokio runtime this module owns, so the (async) HTTP server and
//! plain threads can both use it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Config};
use kube_contract::bind_lock::{self, BindLock};

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
    /// Another offline pod's bind holds the node until its Allocate (`kube_contract::bind_lock`).
    #[error("node {node} is held by the bind of pod {holder} (taken {age_s} s ago, until its Allocate or {ttl_s} s): kube-scheduler retries this pod")]
    Locked {
        /// The node.
        node: String,
        /// `namespace/name` of the pod holding it.
        holder: String,
        /// Seconds since the lock was taken.
        age_s: u64,
        /// The lock's TTL, seconds.
        ttl_s: u64,
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
            ApiError::Transport { .. } | ApiError::Locked { .. } => None,
        }
    }
}

/// A connected client plus the runtime its calls run on.
pub struct KubeApi {
    /// Always `Some` until dropped.
    rt: Option<tokio::runtime::Runtime>,
    client: Client,
    timeout: Duration,
    bind_lock_ttl: Option<Duration>,
    lock_refusals: std::sync::atomic::AtomicU64,
    lock_takeovers: std::sync::atomic::AtomicU64,
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
        Ok(Self {
            rt: Some(rt),
            client,
            timeout,
            bind_lock_ttl: None,
            lock_refusals: Default::default(),
            lock_takeovers: Default::default(),
        })
    }

    /// Takes each node's bind lock before binding a pod there (`kube_contract::bind_lock`),
    /// held for at most `ttl` unless the node agent's Allocate gives it back sooner; `None`:
    /// no lock (Allocate then matches a container to the oldest Pending pod, which may be the
    /// wrong one when two are Pending on a node at once).
    pub fn with_bind_lock(mut self, ttl: Option<Duration>) -> Self {
        self.bind_lock_ttl = ttl;
        self
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime present until drop")
    }

    /// Binds refused for a lock held, and locks taken over, since start.
    pub fn bind_lock_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.lock_refusals.load(Relaxed), self.lock_takeovers.load(Relaxed))
    }

    /// Takes the node's bind lock (when configured, [`Self::with_bind_lock`]), writes
    /// `placement` onto the pod (merge patch of its annotations, guarded by `uid`), then creates
    /// its `Binding` to `placement.node` with the pod's UID as precondition. A failure after
    /// the lock was taken gives it back, unless the pod reads back bound to that node (a
    /// retried bind answered `409 already assigned`, or an answer lost after the Binding
    /// was made): that is the bind done, and the pod keeps the lock until its Allocate.
    pub fn bind_pod(&self, namespace: &str, name: &str, uid: &str, placement: &PodPlacement) -> Result<(), ApiError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let lock_uid = if uid.is_empty() { format!("{namespace}/{name}") } else { uid.to_string() };
        // Set once this bind holds the node's lock (whether or not the write's answer came).
        let lock_taken = std::sync::atomic::AtomicBool::new(false);
        let fut = async {
            if let Some(ttl) = self.bind_lock_ttl {
                let lock = BindLock {
                    uid: lock_uid.clone(),
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    since_unix_ms: crate::watch::now_unix_ms(),
                };
                // From the write on: a deadline inside the write may still have let it land.
                lock_taken.store(true, std::sync::atomic::Ordering::SeqCst);
                if let Err(e) = self.take_lock(&placement.node, &lock, ttl).await {
                    lock_taken.store(false, std::sync::atomic::Ordering::SeqCst);
                    return Err(e);
                }
            }
            let mut r = self.patch_and_bind(&pods, namespace, name, uid, placement).await;
            if let Err(e) = &r {
                // A retried bind of a pod whose Binding already landed (kube-scheduler
                // re-queues an extender-bound pod its informer has not yet seen bound) gets
                // `409 ... already assigned`; an answer lost after the Binding was made looks
                // like any failure. Either way the pod is bound here and still needs the
                // node's lock until its Allocate: keep it, and report the bind as done.
                match Self::pod_bound_to(&pods, name, uid, &placement.node).await {
                    Ok(true) => {
                        tracing::info!(node = %placement.node, pod = %format!("{namespace}/{name}"), error = %e,
                            "pod already bound to this node (a retried bind): bind done, the bind lock kept");
                        r = Ok(());
                    }
                    Ok(false) => {}
                    Err(ge) => {
                        // Unknown whether the pod is bound here: giving the lock back could
                        // let a second pod in before this one's Allocate; it lapses after its TTL.
                        tracing::warn!(node = %placement.node, pod = %format!("{namespace}/{name}"), error = %e, read_error = %ge,
                            "bind failed and the pod could not be read back; the bind lock is kept until its TTL");
                        return r;
                    }
                }
            }
            if r.is_err() && self.bind_lock_ttl.is_some() {
                match bind_lock::release(&self.client, &placement.node, &lock_uid, FIELD_MANAGER).await {
                    Ok(_) => {}
                    Err(e) => tracing::warn!(node = %placement.node, pod = %format!("{namespace}/{name}"), error = %e,
                        "could not give back the bind lock after a failed bind; it lapses after its TTL"),
                }
            }
            r
        };
        // Under kube-scheduler's extender httpTimeout: each call takes milliseconds when the
        // API server is well.
        let timeout = self.bind_deadline();
        let r = self.rt().block_on(async { tokio::time::timeout(timeout, fut).await });
        match r {
            Ok(r) => r,
            Err(_) => {
                // The deadline cut the bind short, maybe after it took the node's lock (a
                // lock its pod never comes to Allocate with would refuse every offline bind to
                // the node until its TTL): give it back, unless the pod reads back bound there
                // (its Binding landed: it keeps the lock until its Allocate). In the
                // background, so kube-scheduler hears of the failure now, after one more bind
                // deadline (for a Binding in flight to land); bounded too.
                if lock_taken.load(std::sync::atomic::Ordering::SeqCst) {
                    let (client, node, pod) = (self.client.clone(), placement.node.clone(), format!("{namespace}/{name}"));
                    let (ns, n, u) = (namespace.to_string(), name.to_string(), uid.to_string());
                    self.rt().spawn(async move {
                        // A Binding already sent is not cancelled by the deadline: read the pod
                        // back only once such a request has had the deadline again to land, or
                        // an unbound read could give back the lock of a pod then bound.
                        tokio::time::sleep(timeout).await;
                        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
                        let work = async {
                            if Self::pod_bound_to(&pods, &n, &u, &node).await? {
                                return Ok::<_, ApiError>(false);
                            }
                            bind_lock::release(&client, &node, &lock_uid, FIELD_MANAGER)
                                .await
                                .map_err(|e| ApiError::from_kube("giving back the bind lock", e))
                        };
                        match tokio::time::timeout(timeout, work).await {
                            Ok(Ok(true)) => tracing::warn!(node = %node, pod = %pod, "bind timed out: the bind lock it took was given back"),
                            Ok(Ok(false)) => tracing::info!(node = %node, pod = %pod, "bind timed out, but the pod is bound here (or the lock names another pod): the lock kept"),
                            Ok(Err(e)) => tracing::warn!(node = %node, pod = %pod, error = %e, "bind timed out and its bind lock could not be given back; the next bind to the node takes it over once it is older than the bind deadline"),
                            Err(_) => tracing::warn!(node = %node, pod = %pod, "bind timed out and giving back its bind lock timed out too; the next bind to the node takes it over once it is older than the bind deadline"),
                        }
                    });
                }
                Err(ApiError::Transport { step: "binding", why: format!("no answer within {timeout:?}") })
            }
        }
    }

    /// How long one bind may take (the lock, the plan, the Binding) before it is given up.
    fn bind_deadline(&self) -> Duration {
        self.timeout * 2
    }

    /// Takes the bind lock of `node` for `lock`'s pod: refused ([`ApiError::Locked`]) while
    /// another pod's lock is there, younger than `ttl`, and its pod still waits for Allocate
    /// (exists with that UID, Pending, bound to no other node); else written with the read
    /// `resourceVersion` as precondition, read again on `409 Conflict`.
    async fn take_lock(&self, node: &str, lock: &BindLock, ttl: Duration) -> Result<(), ApiError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut conflict = None;
        for _ in 0..bind_lock::WRITE_ATTEMPTS {
            let n = nodes.get(node).await.map_err(|e| ApiError::from_kube("reading the node's bind lock", e))?;
            match BindLock::of_node(&n) {
                Some(Ok(held)) if held.uid != lock.uid => {
                    let now = crate::watch::now_unix_ms();
                    if !held.is_expired(now, ttl) && self.waits_for_allocate(&held, node).await? {
                        self.lock_refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Err(ApiError::Locked {
                            node: node.to_string(),
                            holder: held.pod(),
                            age_s: now.saturating_sub(held.since_unix_ms) / 1000,
                            ttl_s: ttl.as_secs(),
                        });
                    }
                    tracing::warn!(node, holder = %held.pod(), age_ms = now.saturating_sub(held.since_unix_ms),
                        "taking over a stale bind lock (expired, or its pod no longer waits for Allocate)");
                    self.lock_takeovers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Some(Err(e)) => {
                    tracing::warn!(node, error = %e, "taking over a bind lock that does not parse");
                    self.lock_takeovers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                _ => {}
            }
            let rv = n.metadata.resource_version.clone().unwrap_or_default();
            let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
            match nodes.patch(node, &pp, &Patch::Merge(&bind_lock::take_patch(lock, &rv))).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => conflict = Some(kube::Error::Api(s)),
                Err(e) => return Err(ApiError::from_kube("taking the node's bind lock", e)),
            }
        }
        Err(ApiError::from_kube("taking the node's bind lock", conflict.expect("every attempt ended in a conflict")))
    }

    /// Whether the pod holding a lock on `node` still waits for its Allocate: it exists with
    /// the lock's UID, is Pending, is bound to no other node, and the kubelet has not started
    /// it yet (`status.startTime`, which the kubelet sets when it first syncs an admitted pod:
    /// admission, where Allocate runs, came before; an image pull may keep it Pending long
    /// after).
    ///
    /// A holder bound to no node yet, whose lock is older than a bind may last (this
    /// extender's bind deadline and as long again for clocks and the lock's own write), no
    /// longer waits either: the bind that took the lock ended without a Binding (it failed or
    /// timed out and its give-back was lost, or the extender stopped), so no Allocate will come.
    async fn waits_for_allocate(&self, held: &BindLock, node: &str) -> Result<bool, ApiError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &held.namespace);
        let Some(p) = pods.get_opt(&held.name).await.map_err(|e| ApiError::from_kube("reading the bind lock's pod", e))? else {
            return Ok(false);
        };
        let uid_ok = p.metadata.uid.as_deref() == Some(held.uid.as_str())
            || held.uid == format!("{}/{}", held.namespace, held.name);
        let pending = p.status.as_ref().and_then(|s| s.phase.as_deref()).is_none_or(|ph| ph == "Pending");
        let started = p.status.as_ref().is_some_and(|s| s.start_time.is_some());
        let bound_node = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty());
        let elsewhere = bound_node.is_some_and(|n| n != node);
        let age = Duration::from_millis(crate::watch::now_unix_ms().saturating_sub(held.since_unix_ms));
        let bind_over = bound_node.is_none() && age > self.bind_deadline() * 2;
        Ok(uid_ok && pending && !started && !elsewhere && !bind_over && p.metadata.deletion_timestamp.is_none())
    }

    /// Whether pod `name` (with `uid`, when given) is bound to `node`.
    async fn pod_bound_to(pods: &Api<Pod>, name: &str, uid: &str, node: &str) -> Result<bool, ApiError> {
        let Some(p) = pods.get_opt(name).await.map_err(|e| ApiError::from_kube("reading the pod back", e))? else {
            return Ok(false);
        };
        let uid_ok = uid.is_empty() || p.metadata.uid.as_deref() == Some(uid);
        Ok(uid_ok && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }

    async fn patch_and_bind(&self, pods: &Api<Pod>, namespace: &str, name: &str, uid: &str, placement: &PodPlacement) -> Result<(), ApiError> {
        let mut meta = serde_json::json!({ "annotations": placement.annotations() });
        if !uid.is_empty() {
            // A merge patch carrying metadata.uid is refused if the pod was replaced: no
            // storage precondition, but the UID is immutable (422 Invalid, `metadata.uid`).
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
