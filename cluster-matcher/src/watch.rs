//! The cluster as the API server tells it: xshare pods (online services, offline jobs) and
//! GPU nodes with their heartbeats, kept by kube-runtime watchers, and the plan inputs derived
//! from them.
//!
//! Each watch lists, then watches from the list's `resourceVersion` with bookmarks (so a
//! reconnect resumes from the latest bookmark, not from an expired version). The stores swap
//! in a relist's contents whole (objects deleted while the watch was down disappear). A
//! restart therefore loses nothing: the state is rebuilt from list + watch.
//!
//! Errors are handled as `kube_contract::watch` says (relist on `410 Gone`, the server's
//! Retry-After, else exponential backoff), in its loop, which the node agent's watch runs too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::Api;
use kube_contract::heartbeat::{self, Freshness, GpuHeartbeat, GpuState};
use kube_contract::pod::{self as contract, Role};
use kube_contract::watch::Seen;

use crate::kube_api::ApiSource;
use crate::plan::{ClusterSpec, GpuHealth, GpuRef, NodeSpec, OfflineJob, OnlineWorkload, Workloads};
use crate::predictor::JobProfile;

/// Node label naming the GPU type as cluster.json and offline jobs' `xshare.io/gpu-types` do.
pub const LABEL_NODE_GPU_TYPE: &str = kube_contract::node::LABEL_GPU_TYPE;
/// Node label naming the predictor model for the node's GPUs.
pub const LABEL_NODE_PREDICTOR_GPU_TYPE: &str = kube_contract::node::LABEL_PREDICTOR_GPU_TYPE;
/// GPU feature discovery's product label (the GPU type when `xshare.io/gpu-type` is absent).
pub const LABEL_GFD_PRODUCT: &str = "nvidia.com/gpu.product";

/// The extended resource an online service's GPU comes with by default (NVIDIA's device plugin).
pub const DEFAULT_ONLINE_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The role the plan gives `pod`: its `xshare.io/role` label, believed only on a pod that asks
/// for the GPU that role implies. A pod's labels and annotations are its owner's to write (the
/// built-in `edit` role), and anyone who may create pods may set `spec.nodeName`: a pause pod
/// labelled `offline` (or `online`) with another tenant's `xshare.io/tenant`, an
/// `xshare.io/gpu` and a huge `xshare.io/memory-mib`, bound by hand to a GPU node, would
/// otherwise be planned as a running job (or service) holding that GPU: real jobs refused
/// there (`gpu_full`), its memory and the other tenant's cells charged. So an offline pod must
/// ask for `xshare.io/offline-gpu`, an online one for one of `online_resources`; `Ok(None)`:
/// not xshare's; `Err(why)`: labelled, left out of the plan.
pub fn planned_role(pod: &Pod, online_resources: &[String]) -> Result<Option<Role>, String> {
    match contract::role(pod.metadata.labels.as_ref()) {
        Some(Role::Offline) if !contract::asks_for(pod, kube_contract::OFFLINE_GPU_RESOURCE) => Err(format!(
            "labelled {}={} but asks for no {}: no offline job of the plan (it holds no GPU slot; its labels and annotations are not believed)",
            contract::LABEL_ROLE,
            contract::ROLE_OFFLINE,
            kube_contract::OFFLINE_GPU_RESOURCE
        )),
        Some(Role::Online) if !online_resources.iter().any(|r| contract::asks_for(pod, r)) => Err(format!(
            "labelled {}={} but asks for none of {} (--online-gpu-resource): no online service of the plan (it holds no GPU; its labels and annotations are not believed)",
            contract::LABEL_ROLE,
            contract::ROLE_ONLINE,
            online_resources.join(", ")
        )),
        r => Ok(r),
    }
}

/// What to watch and how to judge heartbeats.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    /// Namespace of the pods; `None` = all namespaces.
    pub namespace: Option<String>,
    /// Label selector of xshare pods.
    pub pod_selector: String,
    /// Label selector of GPU nodes; `None` = every node.
    pub node_selector: Option<String>,
    /// A heartbeat older than this reads as stale.
    pub stale_after: Duration,
    /// A heartbeat dated further ahead than this reads as stale.
    pub max_clock_skew: Duration,
    /// Longest wait between retries after an error (and cap on a server's Retry-After).
    pub max_backoff: Duration,
    /// Seconds the API server keeps one watch request open.
    pub watch_timeout_s: u32,
    /// Watch the kubelet's `Evicted` Events and write each eviction of a watched offline pod
    /// onto it ([`kube_contract::kubelet_eviction`]), so its node agent tells its shim before
    /// the kill.
    pub kubelet_evictions: bool,
    /// Extended resources that give an online service its GPU (`nvidia.com/gpu`, a MIG or
    /// renamed time-sliced resource): a pod labelled `xshare.io/role=online` counts as the
    /// online service of its `xshare.io/gpu` only when it asks for one of them
    /// ([`planned_role`]).
    pub online_gpu_resources: Vec<String>,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            namespace: None,
            pod_selector: contract::ROLE_SELECTOR.to_string(),
            node_selector: None,
            stale_after: heartbeat::DEFAULT_STALE_AFTER,
            max_clock_skew: heartbeat::DEFAULT_MAX_CLOCK_SKEW,
            max_backoff: Duration::from_secs(30),
            watch_timeout_s: 290,
            kubelet_evictions: true,
            online_gpu_resources: vec![DEFAULT_ONLINE_GPU_RESOURCE.to_string()],
        }
    }
}

/// Counters of the watches (exported as metrics).
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Lists started (the first one and every relist).
    pub lists: AtomicU64,
    /// Errors answered by the API server or the connection.
    pub errors: AtomicU64,
    /// Waits a server's Retry-After asked for.
    pub retry_after_waits: AtomicU64,
    /// Watchers started afresh after a `410 Gone` on a watch request.
    pub gone_restarts: AtomicU64,
    /// Kubelet evictions written onto their offline pods (`annotate_kubelet_evictions`).
    pub kubelet_evictions_annotated: AtomicU64,
    /// Failed writes of a kubelet eviction onto its pod.
    pub kubelet_eviction_errors: AtomicU64,
    /// Kubelet evictions not written onto a pod ([`Skip`]: not an offline pod of the watch,
    /// another node's, finished, written already, stale).
    pub kubelet_evictions_skipped: AtomicU64,
}

/// When this extender saw a node's heartbeat take its current value, by its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenHeartbeat {
    /// The heartbeat's `updated_unix_ms` (the node's clock).
    pub updated_unix_ms: u64,
    /// This host's wall clock when that value was first seen.
    pub seen_unix_ms: u64,
    /// The value replaced another one seen before (so `seen_unix_ms` is when the node wrote
    /// it, within the watch's delay); false for the value found at the first look, whose age
    /// only the node's own date can tell.
    pub changed: bool,
}

/// Records that node `node`'s heartbeat reads `updated_unix_ms` at `now_unix_ms` (this host's
/// clock): a new value is seen now, a known one keeps when it was first seen.
pub fn observe(seen: &mut BTreeMap<String, SeenHeartbeat>, node: &str, updated_unix_ms: u64, now_unix_ms: u64) {
    match seen.get_mut(node) {
        Some(s) if s.updated_unix_ms == updated_unix_ms => {}
        Some(s) => *s = SeenHeartbeat { updated_unix_ms, seen_unix_ms: now_unix_ms, changed: true },
        None => {
            seen.insert(node.to_string(), SeenHeartbeat { updated_unix_ms, seen_unix_ms: now_unix_ms, changed: false });
        }
    }
}

/// A cheap handle on what the watches have seen.
#[derive(Clone)]
pub struct WatchView {
    pods: Store<Pod>,
    nodes: Store<Node>,
    /// When each node's heartbeat was seen to change, by this host's clock.
    seen: Arc<std::sync::Mutex<BTreeMap<String, SeenHeartbeat>>>,
    /// Selectors and staleness limits the watches were started with.
    pub settings: Arc<WatchSettings>,
    /// Counters the watchers update (lists, errors, restarts), shared with them.
    pub stats: Arc<WatchStats>,
}

impl std::fmt::Debug for WatchView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchView")
            .field("pods", &self.pods.len())
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl WatchView {
    /// The objects now, plus the time they are judged at.
    pub fn snapshot(&self) -> ClusterSnapshot {
        let mut pods = self.pods.state();
        pods.sort_by_key(|p| pod_key(p));
        let mut nodes = self.nodes.state();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let now = now_unix_ms();
        let mut snap = ClusterSnapshot { pods, nodes, now_unix_ms: now, settings: self.settings.clone(), seen: BTreeMap::new() };
        // Each heartbeat write is a node event that asks for a plan round, which takes a
        // snapshot: a change is seen here within a round of its event.
        if let Ok(mut seen) = self.seen.lock() {
            let names: Vec<String> = snap.nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
            seen.retain(|n, _| names.contains(n));
            for name in &names {
                if let Ok(hb) = snap.heartbeat(name) {
                    observe(&mut seen, name, hb.updated_unix_ms, now);
                }
            }
            snap.seen = seen.clone();
        }
        snap
    }

    /// Whether both watches finished their first list.
    pub fn is_synced(&self) -> bool {
        use futures::FutureExt;
        matches!(self.pods.wait_until_ready().now_or_never(), Some(Ok(())))
            && matches!(self.nodes.wait_until_ready().now_or_never(), Some(Ok(())))
    }

    /// Every watched pod now, in no particular order.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    /// The pod `namespace/name`, if watched.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&reflector::ObjectRef::new(name).within(namespace))
    }
}

/// The running watches; they stop when this is dropped.
pub struct ClusterWatch {
    view: WatchView,
    rt: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for ClusterWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterWatch").field("view", &self.view).finish()
    }
}

/// Called after every change the watches apply (cheap: it should only wake the planner).
pub type OnChange = Arc<dyn Fn() + Send + Sync>;

impl ClusterWatch {
    /// Connects and starts the pod and node watches. Nothing is listed before this returns;
    /// see [`ClusterWatch::wait_synced`].
    pub fn start(source: &ApiSource, settings: WatchSettings, on_change: OnChange) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kube-watch")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the watch runtime: {e}"))?;
        let mut config = rt.block_on(crate::kube_api::load_config(source))?;
        // Retry timing is the watch loop's (it honours Retry-After and relists on 410);
        // a watch stays open up to `watch_timeout_s`, so reads may idle that long.
        config.default_retry = false;
        config.read_timeout = Some(Duration::from_secs(u64::from(settings.watch_timeout_s) + 30));
        let client = rt
            .block_on(async { kube::Client::try_from(config) })
            .map_err(|e| format!("cannot build the Kubernetes client: {e}"))?;
        let (pod_store, pod_writer) = reflector::store::<Pod>();
        let (node_store, node_writer) = reflector::store::<Node>();
        let settings = Arc::new(settings);
        let stats = Arc::new(WatchStats::default());
        let view = WatchView {
            pods: pod_store,
            nodes: node_store,
            seen: Arc::default(),
            settings: settings.clone(),
            stats: stats.clone(),
        };
        let pods: Api<Pod> = match &settings.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let nodes: Api<Node> = Api::all(client.clone());
        let mut pod_cfg = watcher::Config::default()
            .labels(&settings.pod_selector)
            .timeout(settings.watch_timeout_s);
        pod_cfg.bookmarks = true;
        let mut node_cfg = watcher::Config::default().timeout(settings.watch_timeout_s);
        if let Some(sel) = &settings.node_selector {
            node_cfg = node_cfg.labels(sel);
        }
        node_cfg.bookmarks = true;
        let max = settings.max_backoff;
        rt.spawn(run_watch(
            pods,
            pod_cfg,
            pod_writer,
            "pods",
            stats.clone(),
            on_change.clone(),
            max,
        ));
        rt.spawn(run_watch(nodes, node_cfg, node_writer, "nodes", stats.clone(), on_change, max));
        if settings.kubelet_evictions {
            let events: Api<Event> = match &settings.namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            rt.spawn(annotate_kubelet_evictions(events, settings.watch_timeout_s, client, view.pods.clone(), stats, max));
        }
        Ok(Self { view, rt: Some(rt) })
    }

    /// A handle on the watched state.
    pub fn view(&self) -> WatchView {
        self.view.clone()
    }

    /// Waits until both watches finished their first list; false on timeout.
    pub fn wait_synced(&self, timeout: Duration) -> bool {
        let rt = self.rt.as_ref().expect("runtime present until drop");
        let (p, n) = (self.view.pods.clone(), self.view.nodes.clone());
        rt.block_on(async {
            tokio::time::timeout(timeout, async {
                let _ = p.wait_until_ready().await;
                let _ = n.wait_until_ready().await;
            })
            .await
            .is_ok()
        })
    }
}

impl Drop for ClusterWatch {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn run_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    mut writer: reflector::store::Writer<K>,
    what: &'static str,
    stats: Arc<WatchStats>,
    on_change: OnChange,
    max_backoff: Duration,
) where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    kube_contract::watch::run(api, cfg, what, max_backoff, |seen| match seen {
        // A fresh watcher starts with a list; the writer swaps the listed objects in whole at
        // InitDone.
        Seen::Event(event) => {
            writer.apply_watcher_event(event);
            match event {
                watcher::Event::Init => {
                    stats.lists.fetch_add(1, Ordering::Relaxed);
                }
                watcher::Event::InitApply(_) => {}
                watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_) => on_change(),
            }
        }
        Seen::Error(_, plan) => {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            if plan.server_asked {
                stats.retry_after_waits.fetch_add(1, Ordering::Relaxed);
            }
            if plan.restart {
                stats.gone_restarts.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await;
}

/// A kubelet eviction whose Event is older than this is not written (a list brings the past
/// hour's Events; their pods ended long ago, and the kubelet's grace is never this long).
pub const STALE_KUBELET_EVICTION: Duration = Duration::from_secs(600);

/// How long one write of an eviction onto its pod may take before it is tried again (a hard
/// eviction kills 2 s after its Event).
pub const KUBELET_EVICTION_PATCH_TIMEOUT: Duration = Duration::from_secs(2);
/// How many times a write of an eviction is tried (a failed write, or a pod the watch has not
/// shown yet), 100 ms apart and doubling, up to 2 s: about 20 s in all.
pub const KUBELET_EVICTION_TRIES: u32 = 12;

/// Watches the kubelet's `Evicted` Events (once for the cluster: the API server keeps no watch
/// cache of events by default, so not once per node) and writes each eviction of a watched
/// offline pod onto it as [`kube_contract::kubelet_eviction::ANNOTATION`], which its node
/// agent's pod watch carries to the pod's shim ([`kubelet_eviction_patch`] decides). Each
/// eviction is written by a task of its own, tried again on failure ([`KUBELET_EVICTION_TRIES`],
/// each at most [`KUBELET_EVICTION_PATCH_TIMEOUT`]).
async fn annotate_kubelet_evictions(events: Api<Event>, timeout_s: u32, client: kube::Client, pods: Store<Pod>, stats: Arc<WatchStats>, max_backoff: Duration) {
    // Not `pods.wait_until_ready()` first: a second waiter beside `ClusterWatch::wait_synced`'s
    // held that one up to its timeout. A pod the watch does not show yet is looked for again
    // ([`KUBELET_EVICTION_TRIES`]).
    let s = stats.clone();
    watch_kubelet_evictions(events, timeout_s, stats, max_backoff, move |evicted, eviction| {
        tokio::spawn(annotate_one(client.clone(), pods.clone(), s.clone(), evicted, eviction));
    })
    .await;
}

/// Writes one eviction onto its pod ([`annotate_kubelet_evictions`]).
async fn annotate_one(client: kube::Client, pods: Store<Pod>, stats: Arc<WatchStats>, evicted: kube_contract::kubelet_eviction::EvictedPod, eviction: kube_contract::kubelet_eviction::KubeletEviction) {
    let who = format!("{}/{}", evicted.namespace, evicted.name);
    let api: Api<Pod> = Api::namespaced(client, &evicted.namespace);
    let mut wait = Duration::from_millis(100);
    for attempt in 1..=KUBELET_EVICTION_TRIES {
        let pod = pods.get(&reflector::ObjectRef::new(&evicted.name).within(&evicted.namespace));
        let last = attempt == KUBELET_EVICTION_TRIES;
        match kubelet_eviction_patch(pod.as_deref(), &evicted, &eviction, now_unix_ms()) {
            Ok(patch) => {
                let params = kube::api::PatchParams::default();
                let sent = tokio::time::timeout(KUBELET_EVICTION_PATCH_TIMEOUT, api.patch(&evicted.name, &params, &kube::api::Patch::Merge(&patch))).await;
                match sent {
                    Ok(Ok(_)) => {
                        stats.kubelet_evictions_annotated.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(pod = %who, node = %eviction.node, node_pressure = eviction.node_pressure,
                            "the kubelet evicts an offline pod: written onto it for its node agent (its shim drains the GPU before the kill)");
                        return;
                    }
                    // The patch's UID is not the pod's (422 Invalid, metadata.uid immutable): a
                    // pod of that name made since, not the one the kubelet evicts. Nothing to
                    // write, ever.
                    Ok(Err(e)) if contract::uid_change_refused(&e) => {
                        stats.kubelet_evictions_skipped.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(pod = %who, why = Skip::OtherPod.as_str(), error = %e, "kubelet eviction not written onto the pod");
                        return;
                    }
                    Ok(Err(e)) => {
                        stats.kubelet_eviction_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(pod = %who, attempt, error = %e, "cannot write the kubelet's eviction onto the pod");
                    }
                    Err(_) => {
                        stats.kubelet_eviction_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(pod = %who, attempt, timeout_ms = KUBELET_EVICTION_PATCH_TIMEOUT.as_millis() as u64, "writing the kubelet's eviction onto the pod timed out");
                    }
                }
            }
            // The watch may not have shown the pod yet: looked for again.
            Err(why @ Skip::NotWatched) if !last => tracing::debug!(pod = %who, attempt, why = why.as_str(), "kubelet eviction not written yet"),
            Err(why) => {
                stats.kubelet_evictions_skipped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(pod = %who, why = why.as_str(), "kubelet eviction not written onto the pod");
                return;
            }
        }
        if !last {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
        }
    }
}

/// Watches the kubelet's `Evicted` Events from now on, calling `on_eviction` with each. Not a list and
/// watch (kube-runtime's watcher): the API server keeps no watch cache of events by default, so
/// it sends no bookmarks, a watch whose selector matched nothing resumes from a version etcd
/// compacts away within minutes, and each `410 Gone` would list every Event of the cluster
/// again. Here a watch starts at the version a one-item list of Events (no selector: one etcd
/// read) gives, resumes from the last Event it saw, and takes a fresh version after a `410`.
/// An extender (re)started during a soft eviction's grace therefore misses that eviction.
async fn watch_kubelet_evictions(
    events: Api<Event>,
    timeout_s: u32,
    stats: Arc<WatchStats>,
    max_backoff: Duration,
    on_eviction: impl Fn(kube_contract::kubelet_eviction::EvictedPod, kube_contract::kubelet_eviction::KubeletEviction),
) {
    use futures::StreamExt;
    use kube::api::{ListParams, WatchEvent, WatchParams};
    use kube_contract::kubelet_eviction::{KubeletEviction, EVENTS_FIELD_SELECTOR};
    let mut version: Option<String> = None;
    let mut backoff = kube_contract::watch::MIN_BACKOFF;
    loop {
        let from = match version.clone() {
            Some(v) => Ok(v),
            None => events
                .list(&ListParams::default().limit(1))
                .await
                .map_err(|e| format!("cannot read the events' version: {e}"))
                .and_then(|l| l.metadata.resource_version.filter(|v| !v.is_empty()).ok_or_else(|| "a list of events came without a version".to_string())),
        };
        let params = WatchParams::default().fields(EVENTS_FIELD_SELECTOR).timeout(timeout_s);
        let broke = match from {
            Err(e) => Some(e),
            Ok(from) => match events.watch(&params, &from).await {
                // Compacted past our version: from now on again (not an error).
                Err(kube::Error::Api(s)) if s.code == 410 => {
                    version = None;
                    None
                }
                Err(e) => Some(format!("cannot watch the kubelets' evictions: {e}")),
                Ok(stream) => {
                    let mut stream = std::pin::pin!(stream);
                    version = Some(from);
                    let mut broke = None;
                    while let Some(item) = stream.next().await {
                        match item {
                            Ok(WatchEvent::Added(e) | WatchEvent::Modified(e)) => {
                                backoff = kube_contract::watch::MIN_BACKOFF;
                                if let Some(v) = e.metadata.resource_version.clone() {
                                    version = Some(v);
                                }
                                if let Some((evicted, eviction)) = KubeletEviction::from_event(&e) {
                                    on_eviction(evicted, eviction);
                                }
                            }
                            Ok(WatchEvent::Bookmark(b)) => version = Some(b.metadata.resource_version),
                            Ok(WatchEvent::Deleted(_)) => {}
                            Ok(WatchEvent::Error(s)) if s.code == 410 => {
                                version = None;
                                break;
                            }
                            Ok(WatchEvent::Error(s)) => {
                                broke = Some(format!("the kubelets' evictions watch ended: {}", s.message));
                                break;
                            }
                            Err(e) => {
                                broke = Some(format!("the kubelets' evictions watch broke: {e}"));
                                break;
                            }
                        }
                    }
                    broke
                }
            },
        };
        if let Some(e) = broke {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(watch = "kubelet evictions", error = %e, delay_ms = backoff.as_millis() as u64, "watch error");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(max_backoff.max(kube_contract::watch::MIN_BACKOFF));
        }
    }
}

/// Why an eviction is not written onto its pod ([`kubelet_eviction_patch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The pod is not (yet) in the watch: not an xshare pod, outside `--watch-namespace`, or
    /// not listed yet.
    NotWatched,
    /// Another pod of that name (not the Event's UID).
    OtherPod,
    /// Not an offline pod.
    NotOffline,
    /// Bound to another node than the evicting kubelet's.
    OtherNode,
    /// Finished already.
    Finished,
    /// Written already.
    Written,
    /// The Event is older than [`STALE_KUBELET_EVICTION`].
    Stale,
}

impl Skip {
    /// A short name for the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NotWatched => "not_watched",
            Skip::OtherPod => "other_pod",
            Skip::NotOffline => "not_offline",
            Skip::OtherNode => "other_node",
            Skip::Finished => "finished",
            Skip::Written => "written",
            Skip::Stale => "stale",
        }
    }
}

/// The merge patch that writes `eviction` of `evicted` onto `pod` (as watched), if it is to be
/// written: `pod` is the Event's (same UID, which the patch also carries: the API server
/// refuses it for a pod of the same name made since), an offline pod, bound to the evicting
/// kubelet's node, not finished, not annotated yet, and the Event is not older than
/// [`STALE_KUBELET_EVICTION`] at `now_unix_ms`.
pub fn kubelet_eviction_patch(
    pod: Option<&Pod>,
    evicted: &kube_contract::kubelet_eviction::EvictedPod,
    eviction: &kube_contract::kubelet_eviction::KubeletEviction,
    now_unix_ms: u64,
) -> Result<serde_json::Value, Skip> {
    let pod = pod.ok_or(Skip::NotWatched)?;
    let ann = kube_contract::kubelet_eviction::ANNOTATION;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let check = |ok: bool, why: Skip| if ok { Ok(()) } else { Err(why) };
    check(pod.metadata.uid.as_deref() == Some(evicted.uid.as_str()), Skip::OtherPod)?;
    check(planned_role(pod, &[]) == Ok(Some(Role::Offline)), Skip::NotOffline)?;
    check(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(eviction.node.as_str()), Skip::OtherNode)?;
    check(!matches!(phase, Some("Succeeded" | "Failed")), Skip::Finished)?;
    check(!pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ann)), Skip::Written)?;
    check(eviction.since_unix_ms.saturating_add(STALE_KUBELET_EVICTION.as_millis() as u64) >= now_unix_ms, Skip::Stale)?;
    Ok(serde_json::json!({"metadata": {"uid": evicted.uid, "annotations": {ann: eviction.render()}}}))
}

/// This host's wall clock, ms since the Unix epoch (0 before it).
pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn pod_key(p: &Pod) -> (String, String) {
    (
        p.metadata.namespace.clone().unwrap_or_default(),
        p.metadata.name.clone().unwrap_or_default(),
    )
}

/// The plan's name for the offline job a pod runs: `namespace/job` (see
/// [`kube_contract::pod::job_name`]); `None` for pods that are not offline xshare pods
/// (labelled so and asking for `xshare.io/offline-gpu`: [`planned_role`]).
pub fn offline_job_key(pod: &Pod) -> Option<String> {
    let m = &pod.metadata;
    // Online resources do not matter for an offline pod's role.
    if planned_role(pod, &[]) != Ok(Some(Role::Offline)) {
        return None;
    }
    let owners: Vec<contract::Owner<'_>> = m
        .owner_references
        .iter()
        .flatten()
        .map(|o| contract::Owner {
            api_version: &o.api_version,
            kind: &o.kind,
            name: &o.name,
            controller: o.controller == Some(true),
        })
        .collect();
    let job = contract::job_name(
        m.name.as_deref().unwrap_or(""),
        m.labels.as_ref(),
        m.annotations.as_ref(),
        &owners,
    );
    Some(format!("{}/{job}", m.namespace.as_deref().unwrap_or("default")))
}

/// The GPU memory (MiB) an offline pod's job needs, from its `xshare.io/memory-mib`
/// annotation; `Err` says what is wrong with it (missing, or not a whole number). The one
/// reading of it: the plan's inputs ([`ClusterSnapshot::workloads`]) and the extender's
/// answer for a pod the plan left out both use it.
pub fn offline_memory_mib(annotations: Option<&BTreeMap<String, String>>) -> Result<u64, String> {
    match annotations.and_then(|a| a.get(contract::ANN_MEMORY_MIB)) {
        Some(v) => v.parse::<u64>().map_err(|e| format!("bad {} `{v}`: {e}", contract::ANN_MEMORY_MIB)),
        None => Err(format!("offline pod without {}", contract::ANN_MEMORY_MIB)),
    }
}

/// A pod [`ClusterSnapshot::workloads`] left out of the plan (or planned without a part of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedPod {
    /// What was left out: `pod namespace/name`, or `offline job namespace/job` (a job over
    /// `max_offline_per_gpu`).
    pub what: String,
    /// The pod's UID, when it has one.
    pub uid: Option<String>,
    /// Why.
    pub why: String,
    /// An ordinary state (a pod terminating), not a mistake to report.
    pub routine: bool,
}

impl std::fmt::Display for SkippedPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.why)
    }
}

/// Whether the API server marked the pod as being evicted through the Eviction API (the
/// `DisruptionTarget` condition, reason `EvictionByEvictionAPI`).
pub fn evicted_by_api(pod: &Pod) -> bool {
    pod.status.iter().flat_map(|s| s.conditions.iter().flatten()).any(|c| {
        c.type_ == "DisruptionTarget" && c.status == "True" && c.reason.as_deref() == Some("EvictionByEvictionAPI")
    })
}

/// One consistent look at the watched objects, at one time.
#[derive(Debug, Clone)]
pub struct ClusterSnapshot {
    /// xshare pods seen by the pod watch.
    pub pods: Vec<Arc<Pod>>,
    /// GPU nodes seen by the node watch.
    pub nodes: Vec<Arc<Node>>,
    /// Wall-clock time of the snapshot, milliseconds since the Unix epoch (heartbeat ages are measured from it).
    pub now_unix_ms: u64,
    /// Settings of the watches (staleness and clock-skew limits among them).
    pub settings: Arc<WatchSettings>,
    /// When each node's heartbeat was seen to take its value ([`WatchView::snapshot`]; empty
    /// in a snapshot made of given objects).
    pub seen: BTreeMap<String, SeenHeartbeat>,
}

/// Why a node's heartbeat cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatProblem {
    /// The node is not among the watched nodes.
    NodeNotWatched,
    /// The node has no heartbeat annotation.
    Missing,
    /// The heartbeat annotation does not parse (the parser's message).
    Invalid(String),
}

impl ClusterSnapshot {
    /// A snapshot of given objects (tests, replays).
    pub fn new(pods: Vec<Pod>, nodes: Vec<Node>, now_unix_ms: u64, settings: WatchSettings) -> Self {
        Self {
            pods: pods.into_iter().map(Arc::new).collect(),
            nodes: nodes.into_iter().map(Arc::new).collect(),
            now_unix_ms,
            settings: Arc::new(settings),
            seen: BTreeMap::new(),
        }
    }

    fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .map(|n| &**n)
    }

    /// The node's heartbeat, parsed and validated (freshness not judged).
    pub fn heartbeat(&self, node: &str) -> Result<GpuHeartbeat, HeartbeatProblem> {
        let n = self.node(node).ok_or(HeartbeatProblem::NodeNotWatched)?;
        let text = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(heartbeat::ANNOTATION))
            .ok_or(HeartbeatProblem::Missing)?;
        heartbeat::parse(node, text).map_err(|e| HeartbeatProblem::Invalid(e.to_string()))
    }

    /// A GPU's health from its node's heartbeat: a missing, invalid, stale or future-dated
    /// heartbeat, a GPU the heartbeat does not list, or a cordoned node is not Healthy.
    pub fn health(&self, at: &GpuRef) -> GpuHealth {
        let hb = match self.heartbeat(&at.node) {
            Ok(hb) => hb,
            Err(HeartbeatProblem::NodeNotWatched | HeartbeatProblem::Missing) => return GpuHealth::Missing,
            Err(HeartbeatProblem::Invalid(why)) => return GpuHealth::Unreadable { why },
        };
        // A value seen to replace another is judged by when this host saw it, whatever the
        // node's clock says: a node clock ahead by more than the skew allowed read as
        // `FromFuture`, one behind by more than the staleness as `Stale`, with the node's
        // agent writing every few seconds. The value found at the first look (no change seen
        // yet) has only the node's date to go by.
        let freshness = match self.seen.get(&at.node) {
            Some(s) if s.changed && s.updated_unix_ms == hb.updated_unix_ms => heartbeat::freshness(
                s.seen_unix_ms,
                self.now_unix_ms,
                self.settings.stale_after,
                self.settings.max_clock_skew,
            ),
            _ => hb.freshness(self.now_unix_ms, self.settings.stale_after, self.settings.max_clock_skew),
        };
        match freshness {
            Freshness::Fresh { .. } => {}
            Freshness::Stale { age_ms } => return GpuHealth::Stale { age_s: age_ms / 1000 },
            Freshness::FromFuture { ahead_ms } => return GpuHealth::FromFuture { ahead_ms },
        }
        if self
            .node(&at.node)
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.unschedulable)
            == Some(true)
        {
            return GpuHealth::Disabled;
        }
        match hb.gpu(at.gpu).map(|g| g.state) {
            None => GpuHealth::Missing,
            Some(GpuState::Init) => GpuHealth::Init,
            Some(GpuState::Healthy) => GpuHealth::Healthy,
            Some(GpuState::Unhealthy) => GpuHealth::Unhealthy,
            Some(GpuState::Overlimit) => GpuHealth::Overlimit,
            Some(GpuState::Disabled) => GpuHealth::Disabled,
        }
    }

    /// `base` (cluster.json: round settings, tenants, static nodes) with every watched node
    /// that has a readable heartbeat added or replacing its static entry: GPU count, memory
    /// and type from the heartbeat and the node's labels.
    pub fn cluster_spec(&self, base: &ClusterSpec) -> ClusterSpec {
        let mut spec = base.clone();
        for n in &self.nodes {
            let Some(name) = n.metadata.name.as_deref() else {
                continue;
            };
            let Ok(hb) = self.heartbeat(name) else { continue };
            let Some(gpus) = hb.gpus.iter().map(|g| g.index + 1).max() else {
                continue;
            };
            let labels = n.metadata.labels.as_ref();
            let label = |k: &str| labels.and_then(|l| l.get(k)).filter(|v| !v.is_empty()).cloned();
            let memory = hb.gpus.iter().map(|g| g.memory_total_bytes >> 20).min().unwrap_or(0);
            if memory == 0 {
                continue;
            }
            let gpu_type = label(LABEL_NODE_GPU_TYPE)
                .or_else(|| label(LABEL_GFD_PRODUCT))
                .unwrap_or_else(|| hb.gpus[0].model.clone());
            spec.nodes.retain(|s| s.name != name);
            spec.nodes.push(NodeSpec {
                name: name.to_string(),
                gpu_type,
                gpus,
                gpu_memory_mib: memory,
                predictor_gpu_type: label(LABEL_NODE_PREDICTOR_GPU_TYPE),
            });
        }
        spec
    }

    /// Online and offline workloads from the watched pods, checked against `cluster`; the
    /// second value names each pod left out and why.
    pub fn workloads(&self, cluster: &ClusterSpec) -> (Workloads, Vec<SkippedPod>) {
        let mut w = Workloads::default();
        let mut skipped = Vec::new();
        let mut online_gpus = BTreeSet::new();
        let mut offline_index: BTreeMap<String, usize> = BTreeMap::new();
        for pod in &self.pods {
            let m = &pod.metadata;
            let ns = m.namespace.as_deref().unwrap_or("default");
            let pod_name = m.name.as_deref().unwrap_or("");
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            if matches!(phase, "Succeeded" | "Failed") {
                continue;
            }
            let role = match planned_role(pod, &self.settings.online_gpu_resources) {
                Ok(Some(role)) => role,
                Ok(None) => continue,
                Err(why) => {
                    skipped.push(SkippedPod {
                        what: format!("pod {ns}/{pod_name}"),
                        uid: m.uid.clone(),
                        why,
                        routine: false,
                    });
                    continue;
                }
            };
            // A Terminating offline pod (evicted or deleted, `deletionTimestamp` set) is
            // leaving: not a live placement to keep or replan. Its Job's replacement pod is
            // the job now (the Job controller makes it while this one terminates).
            let skipped_pod = |why: String, routine: bool| SkippedPod {
                what: format!("pod {ns}/{pod_name}"),
                uid: m.uid.clone(),
                why,
                routine,
            };
            if role == Role::Offline && m.deletion_timestamp.is_some() {
                skipped.push(skipped_pod("terminating".into(), true));
                continue;
            }
            let ann = m.annotations.as_ref();
            let get = |k: &str| ann.and_then(|a| a.get(k)).map(String::as_str);
            let mut skip = |why: String| skipped.push(skipped_pod(why, false));
            let profile = match get(contract::ANN_PROFILE).map(serde_json::from_str::<JobProfile>) {
                None => None,
                Some(Ok(p)) => Some(p),
                Some(Err(e)) => {
                    skip(format!(
                        "{} is not a job profile ({e}); planned without one",
                        contract::ANN_PROFILE
                    ));
                    None
                }
            };
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let gpu = get(contract::ANN_GPU).and_then(|g| g.parse::<u32>().ok());
            let at = match (node, gpu) {
                (Some(node), Some(gpu)) => Some(GpuRef { node, gpu }),
                _ => None,
            };
            let at_known = at.as_ref().filter(|a| cluster.node_for(a).is_some()).cloned();
            let tenant = contract::tenant(m.labels.as_ref(), ns);
            match role {
                Role::Online => {
                    let name = format!("{ns}/{pod_name}");
                    let report = at_known
                        .as_ref()
                        .and_then(|a| self.heartbeat(&a.node).ok().and_then(|hb| hb.gpu(a.gpu).cloned()));
                    if at.is_some() && at_known.is_none() {
                        skip(format!("on GPU {:?}, which no watched node or cluster.json lists", at));
                        continue;
                    }
                    if at_known.is_none() && cluster.cells.is_none() {
                        skip(format!(
                            "online pod not bound or without {} (no cells to place it)",
                            contract::ANN_GPU
                        ));
                        continue;
                    }
                    if let Some(a) = &at_known {
                        if !online_gpus.insert(a.clone()) {
                            skip(format!("GPU {}/{} already holds an online pod", a.node, a.gpu));
                            continue;
                        }
                    }
                    let memory_mib = match get(contract::ANN_MEMORY_MIB).map(|v| v.parse::<u64>()) {
                        Some(Ok(v)) => v,
                        Some(Err(e)) => {
                            skip(format!("bad {}: {e}", contract::ANN_MEMORY_MIB));
                            continue;
                        }
                        None => match &report {
                            Some(r) => r.memory_used_bytes >> 20,
                            None => {
                                skip(format!("no {} and no heartbeat for its GPU", contract::ANN_MEMORY_MIB));
                                continue;
                            }
                        },
                    };
                    // Fail closed: without a measurement the service is taken as using
                    // every SM (no room for offline work).
                    let sm = match get(contract::ANN_SM_ACTIVITY_PERCENT).map(|v| v.parse::<f64>()) {
                        Some(Ok(v)) if (0.0..=100.0).contains(&v) => v,
                        Some(_) => {
                            skip(format!("bad {}; taken as 100", contract::ANN_SM_ACTIVITY_PERCENT));
                            100.0
                        }
                        None => report.map_or(100.0, |r| f64::from(r.sm_activity_permille) / 10.0),
                    };
                    w.online.push(OnlineWorkload {
                        name,
                        tenant,
                        at: at_known,
                        gpu_type: None,
                        group: None,
                        memory_mib,
                        sm_activity_percent: sm,
                        profile,
                    });
                }
                Role::Offline => {
                    let Some(key) = offline_job_key(pod) else { continue };
                    // What a running pod was bound with (its shim's limit), in whole MiB.
                    let held_memory_quota_mib = at_known.as_ref().and_then(|_| {
                        get(contract::ANN_MEMORY_QUOTA_BYTES).and_then(contract::parse_memory_quota).map(|b| b.div_ceil(1 << 20))
                    });
                    let memory_mib = match (offline_memory_mib(ann), held_memory_quota_mib) {
                        (Ok(v), _) => v,
                        // A running pod whose need no longer parses (edited after its bind,
                        // where the admission policy is not installed) still holds its GPU and
                        // its quota: charged by the quota, never left out of the plan (its GPU
                        // would be given to another job, its memory promised again).
                        (Err(why), Some(q)) => {
                            skip(format!("{why}; it runs with a quota of {q} MiB, which the plan charges its GPU"));
                            q
                        }
                        (Err(why), None) => {
                            skip(why);
                            continue;
                        }
                    };
                    let job = OfflineJob {
                        name: key.clone(),
                        tenant,
                        memory_mib,
                        gpu_types: contract::gpu_types(ann),
                        profile,
                        held_memory_quota_mib,
                        allowed_nodes: None,
                        current: at_known,
                        feedback: Default::default(),
                    };
                    // Several live pods of one job (a retried Job): one entry, the placed one.
                    match offline_index.get(&key) {
                        Some(&i) if w.offline[i].current.is_some() || job.current.is_none() => {}
                        Some(&i) => w.offline[i] = job,
                        None => {
                            offline_index.insert(key, w.offline.len());
                            w.offline.push(job);
                        }
                    }
                }
            }
        }
        // Over max_offline_per_gpu on one GPU (pods bound behind the plan's back): the extra
        // jobs are planned as not placed, so the plan sees the overcommit as breaks to make.
        let mut per_gpu: BTreeMap<GpuRef, usize> = BTreeMap::new();
        for j in &mut w.offline {
            if let Some(c) = &j.current {
                let n = per_gpu.entry(c.clone()).or_default();
                *n += 1;
                if *n > cluster.max_offline_per_gpu {
                    skipped.push(SkippedPod {
                        what: format!("offline job {}", j.name),
                        uid: None,
                        why: format!("on {}/{}: over max_offline_per_gpu", c.node, c.gpu),
                        routine: false,
                    });
                    j.current = None;
                }
            }
        }
        (w, skipped)
    }

    /// Offline pods the API server marked as evicted through the Eviction API.
    pub fn evicted_offline_pods(&self) -> Vec<&Pod> {
        self.pods
            .iter()
            .filter(|p| planned_role(p, &[]) == Ok(Some(Role::Offline)) && evicted_by_api(p))
            .map(|p| &**p)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_contract::kubelet_eviction::{EvictedPod, KubeletEviction, ANNOTATION};

    const NOW: u64 = 1_796_032_805_000;

    fn offline(node: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "train-0", "namespace": "ml", "uid": "u1",
            "labels": {"xshare.io/role": "offline"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"xshare.io/offline-gpu": "1"}}}]},
            "status": {"phase": phase}}))
        .unwrap()
    }

    /// A pod bound to n1 as its labels, annotations and resource limits say.
    fn bound(name: &str, role: &str, tenant: &str, gpu: u32, memory_mib: u64, limits: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "labels": {"xshare.io/role": role, "xshare.io/tenant": tenant},
            "annotations": {"xshare.io/gpu": gpu.to_string(), "xshare.io/memory-mib": memory_mib.to_string(),
                            "xshare.io/sm-activity-percent": "30"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}))
        .unwrap()
    }

    /// A pod's role label is believed only with the GPU resource it implies: a pause pod
    /// labelled offline (or online) by hand, bound to a GPU with another tenant's label and a
    /// huge memory annotation, holds no GPU in the plan and is said once, by name.
    #[test]
    fn a_role_label_without_its_gpu_resource_is_no_workload_of_the_plan() {
        let cluster: crate::plan::ClusterSpec = serde_json::from_value(serde_json::json!({"nodes": [
            {"name": "n1", "gpu_type": "V100M32", "gpus": 2, "gpu_memory_mib": 32768}]})).unwrap();
        let offline_gpu = serde_json::json!({"xshare.io/offline-gpu": "1"});
        let nvidia = serde_json::json!({"nvidia.com/gpu": "1"});
        let pods = vec![
            // The fakes come first: each would take its GPU's one place.
            bound("fake-svc", "online", "vc-b", 0, 1, serde_json::json!({})),
            bound("fake-job", "offline", "vc-b", 1, 80000, serde_json::json!({})),
            bound("svc", "online", "vc-a", 0, 8000, nvidia.clone()),
            bound("job", "offline", "vc-a", 1, 4000, offline_gpu.clone()),
        ];
        let snap = ClusterSnapshot::new(pods, vec![], NOW, WatchSettings::default());
        let (w, skipped) = snap.workloads(&cluster);
        let online: Vec<_> = w.online.iter().map(|o| (o.name.as_str(), o.memory_mib)).collect();
        assert_eq!(online, vec![("ml/svc", 8000)], "{skipped:?}");
        let offline: Vec<_> = w.offline.iter().map(|o| (o.name.as_str(), o.tenant.as_str(), o.current.clone())).collect();
        assert_eq!(offline, vec![("ml/job", "vc-a", Some(GpuRef { node: "n1".into(), gpu: 1 }))], "{skipped:?}");
        for fake in ["fake-svc", "fake-job"] {
            let s = skipped.iter().find(|s| s.what == format!("pod ml/{fake}")).unwrap_or_else(|| panic!("{fake} not said: {skipped:?}"));
            assert!(!s.routine && (s.why.contains("asks for no ") || s.why.contains("asks for none")), "{s:?}");
        }
        // Neither is an offline job the extender's guards or eviction writes would count.
        let fake_job = bound("fake-job", "offline", "vc-b", 1, 80000, serde_json::json!({}));
        assert_eq!(offline_job_key(&fake_job), None);
        assert!(planned_role(&fake_job, &[]).is_err());
        // The online resources are the operator's: a MIG resource counts when named.
        let mig = bound("mig-svc", "online", "vc-a", 0, 8000, serde_json::json!({"nvidia.com/mig-3g.40gb": "1"}));
        assert!(planned_role(&mig, &[DEFAULT_ONLINE_GPU_RESOURCE.to_string()]).is_err());
        assert_eq!(planned_role(&mig, &["nvidia.com/mig-3g.40gb".to_string()]), Ok(Some(Role::Online)));
        // A DRA claim is not believed: any tenant may claim a device of any class, and the
        // online pod's `xshare.io/gpu` is its own to write.
        let mut dra = bound("dra-svc", "online", "vc-a", 0, 8000, serde_json::json!({}));
        dra.spec.as_mut().unwrap().resource_claims =
            Some(vec![serde_json::from_value(serde_json::json!({"name": "gpu", "resourceClaimTemplateName": "single-gpu"})).unwrap()]);
        assert!(planned_role(&dra, &[DEFAULT_ONLINE_GPU_RESOURCE.to_string()]).is_err());
    }

    /// Written onto a watched offline pod of the evicting kubelet's node, still running, not
    /// annotated yet, for an Event of the last ten minutes; never onto another pod (UID, role,
    /// node), a finished one, twice, or for an old Event.
    #[test]
    fn an_eviction_is_written_only_onto_the_running_offline_pod_of_the_evicting_node() {
        let evicted = EvictedPod { namespace: "ml".into(), name: "train-0".into(), uid: "u1".into() };
        let e = KubeletEviction { uid: "u1".into(), node: "n1".into(), since_unix_ms: NOW - 1000, node_pressure: true };
        let patch = kubelet_eviction_patch(Some(&offline("n1", "Running")), &evicted, &e, NOW).unwrap();
        assert_eq!(patch["metadata"]["annotations"][ANNOTATION], e.render());
        assert_eq!(patch["metadata"]["uid"], "u1", "refused (422, metadata.uid immutable) by a pod of the same name made since");
        assert_eq!(kubelet_eviction_patch(None, &evicted, &e, NOW), Err(Skip::NotWatched));
        assert_eq!(kubelet_eviction_patch(Some(&offline("n2", "Running")), &evicted, &e, NOW), Err(Skip::OtherNode), "another node's kubelet");
        assert_eq!(kubelet_eviction_patch(Some(&offline("n1", "Failed")), &evicted, &e, NOW), Err(Skip::Finished));
        let mut online = offline("n1", "Running");
        online.metadata.labels.as_mut().unwrap().insert("xshare.io/role".into(), "online".into());
        assert_eq!(kubelet_eviction_patch(Some(&online), &evicted, &e, NOW), Err(Skip::NotOffline));
        let mut no_resource = offline("n1", "Running");
        no_resource.spec.as_mut().unwrap().containers[0].resources = None;
        assert_eq!(kubelet_eviction_patch(Some(&no_resource), &evicted, &e, NOW), Err(Skip::NotOffline), "labelled offline, asking for no offline GPU");
        let other = EvictedPod { uid: "u2".into(), ..evicted.clone() };
        assert_eq!(kubelet_eviction_patch(Some(&offline("n1", "Running")), &other, &e, NOW), Err(Skip::OtherPod), "a pod of the same name before");
        let mut done = offline("n1", "Running");
        done.metadata.annotations = Some([(ANNOTATION.to_string(), e.render())].into());
        assert_eq!(kubelet_eviction_patch(Some(&done), &evicted, &e, NOW), Err(Skip::Written));
        let old = KubeletEviction { since_unix_ms: NOW - STALE_KUBELET_EVICTION.as_millis() as u64 - 1, ..e.clone() };
        assert_eq!(kubelet_eviction_patch(Some(&offline("n1", "Running")), &evicted, &old, NOW), Err(Skip::Stale), "an Event from long ago");
    }
}
