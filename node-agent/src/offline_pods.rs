//! Publishes the offline pods bound to this node for the monitors
//! (`<ledger_dir>/offline-pods.json`, `node_daemon::offline_pods`; this agent is its only
//! writer).
//!
//! A container whose GPU work all runs without the shim registers nothing in the ledger, so
//! the monitor cannot tell its processes from the online service's. This agent knows which pods
//! ask for the offline resource: it watches the pods bound to its node (list, then watch, as
//! `kube_contract::watch` runs it) and writes their UIDs whenever the offline set changes, at the
//! first list and at the event that changes it, so a pod is in the file within a round trip of
//! the API server's event instead of at the next poll (a list every `offline_pods.poll_ms` left a
//! new pod's unshimmed processes unjudged for up to 5 s). Every `poll_ms` the file is checked and
//! written again if it was removed. The monitor then takes an unregistered GPU process whose
//! cgroup names one of them for offline work without the shim and evicts it; its eviction log
//! record names the pod, which `crate::evict` evicts through the API. Pods that finished
//! (`Succeeded`, `Failed`) are left out; pods being deleted stay in until they are gone (their
//! processes still run). A failing watch leaves the file as it was: the monitors keep judging by
//! the last list written, and a relist after the failure replaces what it missed whole.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_contract::watch::Seen;
use node_daemon::offline_pods::{OfflinePod, OfflinePods};
use tokio::sync::watch as signal;

/// `pod` as an offline pod of the list, if it asks for `resource` and has not finished.
pub fn offline_pod(pod: &Pod, resource: &str) -> Option<OfflinePod> {
    if !crate::evict::asks_for(pod, resource) {
        return None;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    // The plan's memory, as Allocate gives it to the shim (a malformed or zero value: none;
    // Allocate refuses such a pod).
    let memory_quota_bytes = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(kube_contract::pod::ANN_MEMORY_QUOTA_BYTES))
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|q| *q > 0);
    Some(OfflinePod {
        uid: pod.metadata.uid.clone()?,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        memory_quota_bytes,
    })
}

/// The offline pods of `pods` (asking for `resource`, not finished).
pub fn offline_pods(pods: &[Pod], resource: &str) -> Vec<OfflinePod> {
    pods.iter().filter_map(|p| offline_pod(p, resource)).collect()
}

/// Offline pods by UID.
type ByUid = BTreeMap<String, OfflinePod>;

/// Puts `pod` in `set` if it is an offline pod now, takes it out if it is not (finished, or
/// its resources changed).
fn note(set: &mut ByUid, pod: &Pod, resource: &str) {
    let Some(uid) = pod.metadata.uid.as_deref() else { return };
    match offline_pod(pod, resource) {
        Some(p) => {
            set.insert(uid.to_string(), p);
        }
        None => {
            set.remove(uid);
        }
    }
}

/// The publisher's state: the offline pods the watch has told, the last list written, counters
/// for the metrics.
pub struct Publisher {
    node: String,
    resource: String,
    path: PathBuf,
    /// The offline pods as of the last event (complete once `synced`).
    pods: ByUid,
    /// A list in progress (`Init` .. `InitDone`): swapped in whole at its end, so a pod deleted
    /// while the watch was down leaves the set.
    listing: Option<ByUid>,
    /// A first list has completed.
    synced: bool,
    /// The pods of the last list written (sorted), `None` before the first.
    last: Option<Vec<OfflinePod>>,
    /// Lists written.
    pub writes: u64,
    /// Failed watch requests or writes.
    pub errors: u64,
    /// Lists the watch made (the first and every relist).
    pub lists: u64,
    errors_logged: bool,
}

impl Publisher {
    /// A publisher of node `node`'s pods asking for `resource`, into `ledger_dir`.
    pub fn new(node: &str, resource: &str, ledger_dir: &std::path::Path) -> Self {
        Publisher {
            node: node.to_string(),
            resource: resource.to_string(),
            path: node_daemon::offline_pods::path(ledger_dir),
            pods: ByUid::new(),
            listing: None,
            synced: false,
            last: None,
            writes: 0,
            errors: 0,
            lists: 0,
            errors_logged: false,
        }
    }

    /// The file written.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// One event of the watch of this node's pods; returns whether the file was written.
    /// Nothing is written before the first list completes.
    pub fn apply(&mut self, event: &watcher::Event<Pod>) -> bool {
        self.recovered();
        match event {
            watcher::Event::Init => {
                self.lists += 1;
                self.listing = Some(ByUid::new());
                false
            }
            watcher::Event::InitApply(p) => {
                if let Some(l) = &mut self.listing {
                    note(l, p, &self.resource);
                }
                false
            }
            watcher::Event::InitDone => {
                if let Some(l) = self.listing.take() {
                    self.pods = l;
                }
                self.synced = true;
                self.publish()
            }
            watcher::Event::Apply(p) => {
                note(&mut self.pods, p, &self.resource);
                self.synced && self.publish()
            }
            watcher::Event::Delete(p) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    self.pods.remove(uid);
                }
                self.synced && self.publish()
            }
        }
    }

    /// A watch error (the watch goes on by itself): counted and said once; the monitors keep
    /// the last list written.
    pub fn watch_failed(&mut self, error: &str) {
        self.failed(&format!("watching the pods on this node: {error}"));
    }

    /// The periodic check: writes the list again if the file was removed (one `stat`); nothing
    /// before the first list.
    pub fn refresh(&mut self) -> bool {
        self.synced && self.publish()
    }

    /// Writes the offline set if it differs from the last list written or the file is gone.
    fn publish(&mut self) -> bool {
        let list = OfflinePods::new(&self.node, node_daemon::clock::unix_ms(), self.pods.values().cloned().collect());
        // Unchanged and still there (one `stat`): nothing to write. A file removed meanwhile
        // is written again.
        if self.last.as_ref() == Some(&list.pods) && self.path.exists() {
            return false;
        }
        if let Err(e) = node_daemon::offline_pods::write(&self.path, &list) {
            self.failed(&format!("writing {}: {e}", self.path.display()));
            return false;
        }
        self.writes += 1;
        tracing::info!(path = %self.path.display(), pods = list.pods.len(), "offline pod list written for the monitors");
        self.last = Some(list.pods);
        true
    }

    fn failed(&mut self, e: &str) {
        self.errors += 1;
        if !self.errors_logged {
            self.errors_logged = true;
            tracing::warn!(error = e, path = %self.path.display(), "cannot refresh the offline pod list: the monitors keep the last one written");
        }
    }

    fn recovered(&mut self) {
        if std::mem::take(&mut self.errors_logged) {
            tracing::info!(path = %self.path.display(), "the offline pod list is refreshed again");
        }
    }

    /// Prometheus text: pods in the list in force, lists written, failures.
    pub fn metrics(&self) -> String {
        let pods = self.last.as_ref().map_or(0, Vec::len);
        format!(
            "# HELP xshare_node_agent_offline_pods Offline pods in the list the monitors read\n\
             # TYPE xshare_node_agent_offline_pods gauge\n\
             xshare_node_agent_offline_pods{{node=\"{n}\"}} {pods}\n\
             # HELP xshare_node_agent_offline_pod_list_errors_total Failed refreshes of the offline pod list (pod watch or write)\n\
             # TYPE xshare_node_agent_offline_pod_list_errors_total counter\n\
             xshare_node_agent_offline_pod_list_errors_total{{node=\"{n}\"}} {e}\n\
             # HELP xshare_node_agent_offline_pod_lists_total Lists of this node's pods the watch made (the first and every relist)\n\
             # TYPE xshare_node_agent_offline_pod_lists_total counter\n\
             xshare_node_agent_offline_pod_lists_total{{node=\"{n}\"}} {l}\n",
            n = self.node,
            e = self.errors,
            l = self.lists
        )
    }
}

/// Seconds the API server keeps one watch request open (it ends it then; the watch resumes
/// from its last version).
pub const WATCH_TIMEOUT_S: u32 = 290;
/// The longest wait between watch retries after errors (and cap on a server's Retry-After).
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Keeps the offline pod list from a watch of node `publisher.node`'s pods until `stop` changes:
/// every event is applied as it comes, the file is checked every `check` (written again when
/// removed), and the metrics text is kept in `metrics`. `client` must allow reads idle for
/// [`WATCH_TIMEOUT_S`] (`crate::kube::watch_client`).
pub async fn run(client: Client, publisher: Publisher, check: Duration, mut stop: signal::Receiver<bool>, metrics: Arc<Mutex<String>>) {
    let fields = format!("spec.nodeName={}", publisher.node);
    let shared = Arc::new(Mutex::new(publisher));
    let render = |p: &Publisher| {
        if let Ok(mut m) = metrics.lock() {
            *m = p.metrics();
        }
    };
    if let Ok(p) = shared.lock() {
        render(&p);
    }
    let mut cfg = watcher::Config::default().fields(&fields).timeout(WATCH_TIMEOUT_S);
    cfg.bookmarks = true;
    let api: Api<Pod> = Api::all(client);
    let p = shared.clone();
    let watch = kube_contract::watch::run(api, cfg, "offline pods", MAX_BACKOFF, |seen| {
        // A poisoned lock (a panic elsewhere) stops nothing here: the state is plain data.
        let mut p = p.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match seen {
            Seen::Event(e) => {
                p.apply(e);
            }
            Seen::Error(e, _) => p.watch_failed(&e.to_string()),
        }
        render(&p);
    });
    let checks = async {
        loop {
            tokio::time::sleep(check).await;
            let mut p = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            p.refresh();
            render(&p);
        }
    };
    tokio::select! {
        _ = watch => {}
        _ = checks => {}
        _ = stop.changed() => {}
    }
}
