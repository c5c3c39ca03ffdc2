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
//! processes still run), and so does a pod gone from the API while its containers may still run
//! (a `DELETED` event whose pod's status does not say every container stopped, as
//! `kubectl delete --grace-period=0 --force` gives one; or a pod missing from a relist, or
//! from the first list after a restart against the file the previous node-agent wrote): with
//! its plan (a `DELETED` event's pod also has its termination file record the deletion), until
//! its cgroup says no process is left or, where the cgroup cannot say, its grace (at most
//! [`DELETED_POD_GRACE_CAP`]) and `offline_pods.deleted_pod_linger_ms` after its deletion was
//! seen ([`Publisher::apply_at`]); a cgroup holding a process keeps it listed. A failing watch
//! leaves the file as it was: the monitors keep judging by the last list written, and a relist
//! after the failure replaces what it missed whole, but for the pods it no longer has, kept as
//! deleted ones (a pod it shows finished leaves).
//!
//! The same watch carries an offline pod's deletion to its processes: at the first event that
//! shows `metadata.deletionTimestamp` (a list's included, before the first list completes) the
//! deletion's time and grace are written into the pod's termination file
//! (`node_ledger::termination`, made and mounted read-only by Allocate), which the shim reads
//! after its SIGTERM to drain the GPU before a SIGKILL that a shortened grace or a `preStop` hook
//! brings early ([`termination`]). So is a node-pressure eviction the kubelet of this node
//! began, which has no deletion: the extender writes it onto the pod from the kubelet's Event
//! (`kube_contract::kubelet_eviction`), and this watch sees it ([`kubelet_eviction`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_contract::watch::Seen;
use node_daemon::offline_pods::{OfflinePod, OfflinePods};
use tokio::sync::watch as signal;

/// `pod` as an offline pod of the list, if it asks for `resource` and has not finished, with
/// the plan memory its annotation gives now (the publisher replaces it with the frozen plan's).
pub fn offline_pod(pod: &Pod, resource: &str) -> Option<OfflinePod> {
    if !crate::evict::asks_for(pod, resource) {
        return None;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    // The plan's memory as the annotation says now, read as Allocate reads it (a malformed or
    // zero value: none; Allocate refuses such a pod). The list itself publishes the frozen plan
    // instead ([`Publisher`], `crate::plans`).
    let memory_quota_bytes =
        crate::allocate::annotation(pod, kube_contract::pod::ANN_MEMORY_QUOTA_BYTES).and_then(crate::allocate::parse_memory_quota);
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

/// The deletion `pod`'s metadata records, as its termination file says it
/// (`node_ledger::termination`): `deletionTimestamp` in ms since the epoch (a time before the
/// epoch: 0), and `deletionGracePeriodSeconds` in ms (negative: 0), or the pod's spec grace
/// ([`crate::allocate::kill_grace_ms`]) when the API server gave none. `None` while the pod is
/// not being deleted.
pub fn termination(pod: &Pod) -> Option<node_ledger::termination::Termination> {
    let at = pod.metadata.deletion_timestamp.as_ref()?;
    let grace_ms = match pod.metadata.deletion_grace_period_seconds {
        Some(s) => (s.max(0) as u64).saturating_mul(1000),
        None => crate::allocate::kill_grace_ms(pod),
    };
    Some(node_ledger::termination::Termination { deletion_unix_ms: u64::try_from(at.0.as_millisecond()).unwrap_or(0), grace_ms })
}

/// The eviction this node's kubelet began of `pod`, as the extender wrote it onto the pod
/// (`kube_contract::kubelet_eviction`), written as a deletion ending its grace after the
/// kubelet's Event: the grace this node's kubelet gives for node pressure (`grace_cap_ms`,
/// `offline_pods.kubelet_eviction_grace_ms`, at most the pod's spec grace; 0 by default: at
/// once, as past a hard threshold), 0 for a storage limit's. `Ok(None)`: none, another node's,
/// or another pod's (a pod of the same name before it); `Err`: the annotation does not parse
/// (only the extender may write it).
pub fn kubelet_eviction(pod: &Pod, node: &str, grace_cap_ms: u64) -> Result<Option<node_ledger::termination::Termination>, String> {
    use kube_contract::kubelet_eviction::{KubeletEviction, ANNOTATION};
    let Some(v) = pod.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) else { return Ok(None) };
    let e = KubeletEviction::parse(v)?;
    if e.node != node || pod.metadata.uid.as_deref() != Some(e.uid.as_str()) {
        return Ok(None);
    }
    let grace_ms = if e.node_pressure { crate::allocate::kill_grace_ms(pod).min(grace_cap_ms) } else { 0 };
    Ok(Some(node_ledger::termination::Termination { deletion_unix_ms: e.since_unix_ms.saturating_add(grace_ms), grace_ms }))
}

/// What a shim reading both of two terminations of one pod would expect: the SIGKILL by the
/// earlier end and by the shorter grace ([`node_ledger::termination::Termination::kill_ns`]
/// takes the earlier of the two), so the file only ever moves the kill earlier.
fn combine(a: node_ledger::termination::Termination, b: node_ledger::termination::Termination) -> node_ledger::termination::Termination {
    node_ledger::termination::Termination { deletion_unix_ms: a.deletion_unix_ms.min(b.deletion_unix_ms), grace_ms: a.grace_ms.min(b.grace_ms) }
}

/// One offline pod of the list, as the watch last told it.
#[derive(Debug, Clone)]
struct Entry {
    /// As published.
    pod: OfflinePod,
    /// The longest the kubelet may wait to kill its containers once told to, ms: its spec
    /// grace ([`crate::allocate::kill_grace_ms`]) or a longer deletion grace it was given.
    grace_ms: u64,
    /// Deleted from the API while its processes may still run ([`Publisher::apply`]).
    deleted: Option<Deleted>,
}

/// A pod gone from the API, kept in the list until its processes are ([`Publisher::linger`]).
#[derive(Debug, Clone, Copy)]
struct Deleted {
    /// When it leaves the list, unless its cgroup shows a process of it left.
    until: Instant,
    /// Its cgroup was seen ([`node_daemon::offline_pods::pod_cgroup`]): when it is no longer
    /// there, the kubelet removed it.
    cgroup_seen: bool,
    /// Its cgroup was seen holding a process: an empty one after that means they ended.
    populated_seen: bool,
    /// When a look first found its cgroup empty without a process seen before: one look is not
    /// enough (a container the kubelet was still starting may come up in it), nor a second
    /// one at once (events of a mass deletion each look): [`EMPTY_LOOKS_APART`] later.
    first_empty: Option<Instant>,
}

/// Offline pods by UID.
type ByUid = BTreeMap<String, Entry>;

/// The longest grace a pod deleted from the API is kept in the list for
/// ([`Publisher::apply_at`]), whatever its `terminationGracePeriodSeconds`: a tenant's pods of a
/// year's grace, deleted over and over, would otherwise fill the list.
pub const DELETED_POD_GRACE_CAP: Duration = Duration::from_secs(3600);

/// How far apart two looks must be that find the cgroup of a pod deleted from the API empty,
/// with no process seen in it before, for the pod to leave the list.
pub const EMPTY_LOOKS_APART: Duration = Duration::from_secs(1);

/// The grace the kubelet may give `pod`'s containers, ms: its spec's, or its deletion's when
/// longer (`kubectl delete --grace-period` may give more than the spec).
fn longest_grace_ms(pod: &Pod) -> u64 {
    let deletion = pod.metadata.deletion_grace_period_seconds.map_or(0, |s| (s.max(0) as u64).saturating_mul(1000));
    crate::allocate::kill_grace_ms(pod).max(deletion)
}

/// Whether `pod`'s status says every container of it stopped (each of its containers'
/// `state.terminated`, no init or ephemeral container running): what the kubelet reports
/// before it confirms a graceful deletion. A pod force-deleted (`--grace-period=0 --force`)
/// while its containers run says they run.
pub fn containers_stopped(pod: &Pod) -> bool {
    let (Some(spec), Some(st)) = (&pod.spec, &pod.status) else { return false };
    let statuses = st.container_statuses.as_deref().unwrap_or_default();
    let terminated = |name: &str| statuses.iter().any(|c| c.name == name && c.state.as_ref().is_some_and(|s| s.terminated.is_some()));
    let running = |l: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        l.iter().flatten().any(|c| c.state.as_ref().is_none_or(|s| s.running.is_some()))
    };
    spec.containers.iter().all(|c| terminated(&c.name)) && !running(&st.init_container_statuses) && !running(&st.ephemeral_container_statuses)
}

/// Puts `pod` in `set` if it is an offline pod now, with its frozen plan's memory (frozen now
/// at first sight: `crate::plans`), takes it out if it is not (finished, or its resources
/// changed).
fn note(set: &mut ByUid, pod: &Pod, resource: &str, plans: &crate::plans::PlanStore) {
    let Some(uid) = pod.metadata.uid.as_deref() else { return };
    match offline_pod(pod, resource) {
        Some(mut p) => {
            p.memory_quota_bytes = plans.memory_quota_bytes(pod);
            set.insert(uid.to_string(), Entry { pod: p, grace_ms: longest_grace_ms(pod), deleted: None });
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
    /// A list in progress (`Init` .. `InitDone`): swapped in whole at its end, but for the pods
    /// it no longer has, kept as deleted ([`Publisher::linger`]).
    listing: Option<ByUid>,
    /// The UIDs the list in progress has shown, offline pods or not (a pod that finished while
    /// the watch was down is in the list, finished: it leaves, it is not kept as deleted).
    listing_seen: std::collections::BTreeSet<String>,
    /// The pods of the list a previous node-agent left in the file, until the first list
    /// completes: those the list no longer has are kept as deleted ones (a restart would
    /// otherwise forget the pods it kept).
    inherited: Vec<OfflinePod>,
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
    /// Pod ledger directories removed (their pods gone from the node).
    pub pod_ledgers_removed: u64,
    ledger_dir: PathBuf,
    errors_logged: bool,
    /// The frozen plans the list publishes (`crate::plans`).
    plans: Arc<crate::plans::PlanStore>,
    /// Frozen plans removed (their pods gone from the node).
    pub plans_removed: u64,
    /// Pod deletions written into their termination files (changes only).
    pub terminations_written: u64,
    /// Failed termination file writes (each try).
    pub termination_errors: u64,
    /// Deletions whose write failed, retried every [`TERMINATION_RETRY`] and at every check
    /// ([`Publisher::retry_terminations`]): a pod being deleted may see no further event before
    /// its SIGKILL. Each pod's failure is said when it enters, its recovery when it leaves.
    pending_terminations: BTreeMap<node_ledger::PodUid, (node_ledger::termination::Termination, String)>,
    /// The grace this node's kubelet gives a pod it evicts for node pressure, ms
    /// ([`kubelet_eviction`]).
    kubelet_grace_ms: u64,
    /// How long past its grace a pod deleted from the API is kept in the list
    /// ([`Publisher::linger`]).
    deleted_linger: Duration,
    /// The host's cgroup v2 mount, where a pod deleted from the API is seen to have no process
    /// left ([`node_daemon::offline_pods::pod_cgroup`]); `None`: not looked at.
    cgroup_root: Option<PathBuf>,
    /// Pods deleted from the API taken out of the list: their cgroup empty or gone, or their
    /// grace and the linger passed.
    pub deleted_pods_dropped: u64,
}

/// How long a pod's ledger directory (`node_ledger::pods`) may lie without its pod in this
/// node's list before it is removed: Allocate makes it as the kubelet admits the pod, which may
/// be before this watch has seen the pod bound here.
pub const POD_LEDGER_GRACE: Duration = Duration::from_secs(300);

/// Removes the ledger directories of pods not in `keep` (this node's offline pods) under
/// `ledger_dir`, once older than `grace` and only when no process is registered in any of
/// their ledgers (the dead ones are reclaimed first): a pod's containers are gone before the API
/// server forgets the pod, so a live registration means a process outside Kubernetes'
/// knowledge, which keeps its ledger. Returns the pods whose directory was removed.
pub fn remove_gone_pod_ledgers(
    ledger_dir: &std::path::Path,
    keep: &dyn Fn(node_ledger::PodUid) -> bool,
    grace: Duration,
) -> Vec<node_ledger::PodUid> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(node_ledger::pods::pods_dir(ledger_dir)) else { return removed };
    for e in entries.flatten() {
        let Some(pod) = e.file_name().to_str().and_then(node_ledger::PodUid::parse) else { continue };
        if keep(pod) {
            continue;
        }
        let young = e.metadata().ok().and_then(|m| m.modified().ok()).is_some_and(|t| t.elapsed().map_or(true, |age| age < grace));
        if young {
            continue;
        }
        let dir = e.path();
        let busy = std::fs::read_dir(&dir).into_iter().flatten().flatten().any(|g| {
            let Ok(l) = node_ledger::Ledger::open_existing(&g.path().join("ledger")) else { return false };
            let _ = l.reclaim_dead();
            !l.procs().is_empty()
        });
        if busy {
            tracing::warn!(%pod, dir = %dir.display(), "the pod is gone from this node but a process is still registered in its ledger: kept");
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(%pod, dir = %dir.display(), "removed the ledgers of a pod gone from this node");
                removed.push(pod);
            }
            Err(err) => tracing::warn!(%pod, dir = %dir.display(), error = %err, "cannot remove the ledgers of a pod gone from this node"),
        }
    }
    removed
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
            listing_seen: std::collections::BTreeSet::new(),
            inherited: match node_daemon::offline_pods::read(&node_daemon::offline_pods::path(ledger_dir)) {
                Ok(Some(f)) if f.node == node => f.pods,
                _ => Vec::new(),
            },
            synced: false,
            last: None,
            writes: 0,
            errors: 0,
            lists: 0,
            pod_ledgers_removed: 0,
            ledger_dir: ledger_dir.to_owned(),
            errors_logged: false,
            plans: Arc::new(crate::plans::PlanStore::open(ledger_dir)),
            plans_removed: 0,
            terminations_written: 0,
            termination_errors: 0,
            pending_terminations: BTreeMap::new(),
            kubelet_grace_ms: 0,
            deleted_linger: DEFAULT_DELETED_POD_LINGER,
            cgroup_root: None,
            deleted_pods_dropped: 0,
        }
    }

    /// The same publisher keeping a pod deleted from the API in the list for `linger` past its
    /// grace ([`Publisher::apply_at`]; [`DEFAULT_DELETED_POD_LINGER`] by default).
    pub fn with_deleted_pod_linger(mut self, linger: Duration) -> Self {
        self.deleted_linger = linger;
        self
    }

    /// The same publisher dropping a pod deleted from the API as soon as its cgroup under
    /// `root` (the host's cgroup v2 mount) says no process of it is left
    /// ([`node_daemon::offline_pods::pod_cgroup`]); `None` (the default): only at the end of
    /// its linger.
    pub fn with_cgroup_root(mut self, root: Option<PathBuf>) -> Self {
        self.cgroup_root = root;
        self
    }

    /// The same publisher taking `ms` for the grace this node's kubelet gives a pod it evicts
    /// for node pressure ([`kubelet_eviction`]; 0 by default).
    pub fn with_kubelet_grace_ms(mut self, ms: u64) -> Self {
        self.kubelet_grace_ms = ms;
        self
    }

    /// The same publisher reading and freezing plans in `plans` (the store Allocate uses).
    pub fn with_plans(mut self, plans: Arc<crate::plans::PlanStore>) -> Self {
        self.plans = plans;
        self
    }

    /// The file written.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// One event of the watch of this node's pods; returns whether the file was written.
    /// Nothing is written before the first list completes, except a pod's termination file
    /// ([`Self::note_termination`]): a pod being deleted reaches its processes at once.
    pub fn apply(&mut self, event: &watcher::Event<Pod>) -> bool {
        self.apply_at(event, Instant::now())
    }

    /// [`Publisher::apply`] at monotonic time `now`.
    ///
    /// A pod gone from the API (its `DELETED` event, or missing from a relist) stays in the
    /// list, with its plan and its termination file, until its processes are gone
    /// (`Publisher::linger`), unless its last status says every container of it stopped
    /// ([`containers_stopped`], which the kubelet reports before it confirms a graceful
    /// deletion): `kubectl delete --grace-period=0 --force` removes the pod from the API at
    /// once, and its containers may run on until the kubelet kills them, with its full spec
    /// grace on kubelets hit by kubernetes/kubernetes#115819.
    pub fn apply_at(&mut self, event: &watcher::Event<Pod>, now: Instant) -> bool {
        self.recovered();
        match event {
            watcher::Event::Init => {
                self.lists += 1;
                self.listing = Some(ByUid::new());
                self.listing_seen.clear();
                false
            }
            watcher::Event::InitApply(p) => {
                self.note_termination(p);
                if let Some(l) = &mut self.listing {
                    note(l, p, &self.resource, &self.plans);
                    if let Some(uid) = &p.metadata.uid {
                        self.listing_seen.insert(uid.clone());
                    }
                }
                false
            }
            watcher::Event::InitDone => {
                if let Some(mut l) = self.listing.take() {
                    // A first list after a restart: the pods the previous node-agent listed
                    // are known again (as of its file), so those this list lacks are kept too.
                    for p in std::mem::take(&mut self.inherited) {
                        if !self.pods.contains_key(&p.uid) {
                            let uid = p.uid.clone();
                            let mut e = Entry { pod: p, grace_ms: u64::MAX, deleted: None };
                            e.deleted = Some(self.inherited_linger(&e, now));
                            self.pods.insert(uid, e);
                        }
                    }
                    // Pods deleted while the watch was down, their last word unknown: kept
                    // as any pod deleted. A pod the list shows, finished, leaves.
                    let seen = std::mem::take(&mut self.listing_seen);
                    let missed: Vec<_> = self.pods.keys().filter(|u| !seen.contains(*u)).cloned().collect();
                    for uid in missed {
                        if let Some(mut e) = self.pods.remove(&uid) {
                            if e.deleted.is_none() {
                                e.deleted = Some(self.linger(&e, now));
                                tracing::info!(pod = %format!("{}/{}", e.pod.namespace, e.pod.name), uid = %uid,
                                    "an offline pod deleted while the pod watch was down is kept in the offline pod list until its processes are gone");
                            }
                            l.insert(uid, e);
                        }
                    }
                    self.pods = l;
                }
                self.synced = true;
                self.expire_deleted(now);
                self.publish()
            }
            watcher::Event::Apply(p) => {
                self.note_termination(p);
                note(&mut self.pods, p, &self.resource, &self.plans);
                self.synced && self.publish()
            }
            watcher::Event::Delete(p) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    if containers_stopped(p) || !self.pods.contains_key(uid) {
                        // The kubelet said every container stopped before it let the pod go
                        // (or it was no offline pod of the list).
                        self.drop_pod(uid);
                    } else if let Some(mut e) = self.pods.remove(uid) {
                        e.grace_ms = e.grace_ms.max(longest_grace_ms(p));
                        let d = e.deleted.unwrap_or_else(|| self.linger(&e, now));
                        e.deleted = Some(d);
                        let who = format!("{}/{}", e.pod.namespace, e.pod.name);
                        tracing::info!(pod = %who, uid, grace_ms = e.grace_ms, linger_ms = d.until.saturating_duration_since(now).as_millis() as u64,
                            "an offline pod deleted from the API while its containers may still run (force-deleted?) stays in the offline pod list until its processes are gone");
                        self.pods.insert(uid.to_string(), e);
                        self.note_deleted(p, uid, who);
                        self.expire_deleted(now);
                    }
                }
                self.synced && self.publish()
            }
        }
    }

    /// How long pod `e`, deleted from the API at `now` while its containers may still run, stays
    /// in the list: its grace (its spec's, or a longer deletion's; at most
    /// [`DELETED_POD_GRACE_CAP`]), which the kubelet may still give its containers, and
    /// `offline_pods.deleted_pod_linger_ms` past it; less once its cgroup says no process of it
    /// is left ([`Publisher::expire_deleted`]).
    fn linger(&self, e: &Entry, now: Instant) -> Deleted {
        let grace = Duration::from_millis(e.grace_ms).min(DELETED_POD_GRACE_CAP);
        Deleted { until: now + grace + self.deleted_linger, cgroup_seen: false, populated_seen: false, first_empty: None }
    }

    /// How long pod `e`, listed by the previous node-agent and missing from this one's first
    /// list, stays: counted from its deletion where its termination file records one (a pod
    /// force-deleted before the restart: the restart does not start its bound again), else
    /// from now; at most [`DELETED_POD_GRACE_CAP`] and the linger either way. Used only if the
    /// first list does not have it.
    fn inherited_linger(&self, e: &Entry, now: Instant) -> Deleted {
        let mut d = self.linger(e, now);
        let deleted_ms = node_ledger::PodUid::parse(&e.pod.uid)
            .and_then(|u| node_ledger::termination::read(&node_ledger::termination::termination_path(&self.ledger_dir, u)).ok().flatten())
            .map(|t| t.deletion_unix_ms)
            .filter(|&ms| ms > 0);
        if let Some(ms) = deleted_ms {
            let bound = (DELETED_POD_GRACE_CAP + self.deleted_linger).as_millis() as u64;
            let left = ms.saturating_add(bound).saturating_sub(node_daemon::clock::unix_ms());
            d.until = d.until.min(now + Duration::from_millis(left));
        }
        d
    }

    /// Takes pod `uid` out of the list and out of the termination retries; returns whether it
    /// was in the list.
    fn drop_pod(&mut self, uid: &str) -> bool {
        if let Some(u) = node_ledger::PodUid::parse(uid) {
            self.pending_terminations.remove(&u);
        }
        self.pods.remove(uid).is_some()
    }

    /// Takes out of the list the pods deleted from the API whose processes are gone at `now`:
    /// their cgroup under `cgroup_root` holds none (after it held one, or at two looks
    /// [`EMPTY_LOOKS_APART`] apart), or is
    /// gone after it was seen ([`node_daemon::offline_pods::pod_cgroup`]); or, where it cannot
    /// be read (the shipped DaemonSet has its own cgroup namespace) or is not there, their
    /// linger is over. A cgroup holding a process keeps its pod listed past its linger.
    fn expire_deleted(&mut self, now: Instant) {
        use node_daemon::offline_pods::{pod_cgroup, PodCgroup};
        let mut gone = Vec::new();
        for (uid, e) in self.pods.iter_mut() {
            let Some(d) = &mut e.deleted else { continue };
            let cgroup = match (&self.cgroup_root, node_ledger::PodUid::parse(uid)) {
                (Some(root), Some(u)) => pod_cgroup(root, u),
                _ => PodCgroup::Unknown,
            };
            d.cgroup_seen |= matches!(cgroup, PodCgroup::Populated | PodCgroup::Empty);
            d.populated_seen |= cgroup == PodCgroup::Populated;
            let why = match cgroup {
                // A process of it still runs: judged, however long the tenant's grace (a pod
                // of a day's grace force-deleted would otherwise run a day unjudged).
                PodCgroup::Populated => None,
                PodCgroup::Empty if d.populated_seen || d.first_empty.is_some_and(|t| now.saturating_duration_since(t) >= EMPTY_LOOKS_APART) => {
                    Some("its cgroup holds no process")
                }
                PodCgroup::Empty => {
                    d.first_empty.get_or_insert(now);
                    None
                }
                PodCgroup::Absent if d.cgroup_seen => Some("its cgroup is gone"),
                _ if now >= d.until => Some("its grace and offline_pods.deleted_pod_linger_ms passed"),
                _ => None,
            };
            if let Some(why) = why {
                tracing::info!(pod = %format!("{}/{}", e.pod.namespace, e.pod.name), uid = %uid, why,
                    "an offline pod deleted from the API leaves the offline pod list");
                gone.push(uid.clone());
            }
        }
        for uid in gone {
            if self.drop_pod(&uid) {
                self.deleted_pods_dropped += 1;
            }
        }
    }

    /// Records in pod `uid`'s termination file (if Allocate made one) that `pod`, as its
    /// `DELETED` event shows it, is gone from the API: its deletion and its kubelet's eviction
    /// ([`Publisher::note_termination`]), or, when it shows no deletion (removed at once), a
    /// deletion now with no grace: its containers are to be killed, its shim drains at once.
    /// So the file says why a pod deleted from the API is still in the list.
    fn note_deleted(&mut self, pod: &Pod, uid: &str, who: String) {
        self.note_termination(pod);
        if termination(pod).is_none() {
            if let Some(u) = node_ledger::PodUid::parse(uid) {
                let now = node_ledger::termination::Termination { deletion_unix_ms: node_daemon::clock::unix_ms(), grace_ms: 0 };
                self.write_termination(u, now, who);
            }
        }
    }

    /// Writes the deletion of `pod`, an offline pod being deleted, into its termination file
    /// ([`termination`]), in place, if the file exists (Allocate made it: the pod's containers
    /// run here with it mounted); a pod allocated without one, elsewhere, or not at all gets
    /// none. An eviction this node's kubelet began ([`kubelet_eviction`]) is written the same
    /// way; with a deletion too, both as one (`combine`). A later deletion with a shorter
    /// grace rewrites it, a later one never moves the kill later; the same reading is not
    /// written again. Returns whether the file changed; a failure is counted, said until a
    /// write succeeds, and retried at every check.
    pub fn note_termination(&mut self, pod: &Pod) -> bool {
        if !crate::evict::asks_for(pod, &self.resource) {
            return false;
        }
        let (ns, name) = (pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or(""));
        let evicted = kubelet_eviction(pod, &self.node, self.kubelet_grace_ms).unwrap_or_else(|e| {
            tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "the pod's kubelet eviction annotation is ignored");
            None
        });
        let Some(t) = [termination(pod), evicted].into_iter().flatten().reduce(combine) else { return false };
        let Some(uid) = pod.metadata.uid.as_deref().and_then(node_ledger::PodUid::parse) else { return false };
        self.write_termination(uid, t, format!("{ns}/{name}"))
    }

    /// Writes termination `t` of pod `uid` (`who`: namespace/name, for the log), combined with
    /// what the file says already ([`combine`]: only ever earlier); see
    /// [`Publisher::note_termination`].
    fn write_termination(&mut self, uid: node_ledger::PodUid, t: node_ledger::termination::Termination, who: String) -> bool {
        let path = node_ledger::termination::termination_path(&self.ledger_dir, uid);
        let t = match node_ledger::termination::read(&path) {
            Ok(Some(written)) => combine(written, t),
            _ => t,
        };
        match node_ledger::termination::write(&path, &t) {
            Ok(changed) => {
                if self.pending_terminations.remove(&uid).is_some() {
                    tracing::info!(pod = %who, path = %path.display(), "the pod's termination file is written again");
                }
                if changed {
                    self.terminations_written += 1;
                    tracing::info!(pod = %who, grace_ms = t.grace_ms, deletion_unix_ms = t.deletion_unix_ms, path = %path.display(),
                        "the pod's termination (its deletion, or its kubelet's eviction) written for its offline processes (the shim drains before the SIGKILL)");
                }
                changed
            }
            Err(e) => {
                self.termination_errors += 1;
                if !self.pending_terminations.contains_key(&uid) {
                    tracing::warn!(pod = %who, path = %path.display(), error = %e,
                        "cannot write the pod's termination into its termination file (retried): meanwhile its shim drains by the pod's spec grace only");
                }
                self.pending_terminations.insert(uid, (t, who));
                false
            }
        }
    }

    /// Writes again the deletions whose write failed; returns whether any is still pending.
    pub fn retry_terminations(&mut self) -> bool {
        let pending: Vec<_> = self.pending_terminations.iter().map(|(u, (t, w))| (*u, *t, w.clone())).collect();
        for (uid, t, who) in pending {
            self.write_termination(uid, t, who);
        }
        !self.pending_terminations.is_empty()
    }

    /// A watch error (the watch goes on by itself): counted and said once; the monitors keep
    /// the last list written.
    pub fn watch_failed(&mut self, error: &str) {
        self.failed(&format!("watching the pods on this node: {error}"));
    }

    /// The periodic check: writes again the termination files whose write failed
    /// ([`Publisher::retry_terminations`], also every [`TERMINATION_RETRY`] while any is
    /// pending), and the list if its file was removed (one `stat`; nothing before the first
    /// list).
    pub fn refresh(&mut self) -> bool {
        self.refresh_at(Instant::now())
    }

    /// [`Publisher::refresh`] at monotonic time `now`; also takes out of the list the pods
    /// deleted from the API whose processes are gone (`Publisher::expire_deleted`).
    pub fn refresh_at(&mut self, now: Instant) -> bool {
        self.retry_terminations();
        self.expire_deleted(now);
        if self.synced {
            // The pods of a complete list only: a pod missed while the watch was down would
            // lose its ledger under its running processes (they keep it: checked there too).
            let pods = &self.pods;
            let keep = |p: node_ledger::PodUid| pods.keys().any(|u| node_ledger::PodUid::parse(u) == Some(p));
            self.pod_ledgers_removed += remove_gone_pod_ledgers(&self.ledger_dir, &keep, POD_LEDGER_GRACE).len() as u64;
            // The same for the frozen plans (a pod may be allocated before the watch saw it).
            let keep_plan = |u: &str| node_ledger::PodUid::parse(u).map_or(pods.contains_key(u), keep);
            self.plans_removed += self.plans.forget_gone(&keep_plan, POD_LEDGER_GRACE) as u64;
        }
        self.synced && self.publish()
    }

    /// Writes the offline set if it differs from the last list written or the file is gone.
    fn publish(&mut self) -> bool {
        let list = OfflinePods::new(&self.node, node_daemon::clock::unix_ms(), self.pods.values().map(|e| e.pod.clone()).collect());
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

    /// Prometheus text: pods in the list in force, lists written, failures, termination files
    /// written, pods deleted from the API kept in the list.
    pub fn metrics(&self) -> String {
        let pods = self.last.as_ref().map_or(0, Vec::len);
        let deleted = self.pods.values().filter(|e| e.deleted.is_some()).count();
        format!(
            "# HELP xshare_node_agent_offline_pods Offline pods in the list the monitors read\n\
             # TYPE xshare_node_agent_offline_pods gauge\n\
             xshare_node_agent_offline_pods{{node=\"{n}\"}} {pods}\n\
             # HELP xshare_node_agent_offline_pod_list_errors_total Failed refreshes of the offline pod list (pod watch or write)\n\
             # TYPE xshare_node_agent_offline_pod_list_errors_total counter\n\
             xshare_node_agent_offline_pod_list_errors_total{{node=\"{n}\"}} {e}\n\
             # HELP xshare_node_agent_offline_pod_lists_total Lists of this node's pods the watch made (the first and every relist)\n\
             # TYPE xshare_node_agent_offline_pod_lists_total counter\n\
             xshare_node_agent_offline_pod_lists_total{{node=\"{n}\"}} {l}\n\
             # HELP xshare_node_agent_pod_ledgers_removed_total Pod ledger directories removed after their pods left the node\n\
             # TYPE xshare_node_agent_pod_ledgers_removed_total counter\n\
             xshare_node_agent_pod_ledgers_removed_total{{node=\"{n}\"}} {r}\n\
             # HELP xshare_node_agent_pod_terminations_written_total Offline pods' terminations (deletions, their kubelets' evictions) written into their termination files (for the shim's drain)\n\
             # TYPE xshare_node_agent_pod_terminations_written_total counter\n\
             xshare_node_agent_pod_terminations_written_total{{node=\"{n}\"}} {t}\n\
             # HELP xshare_node_agent_pod_termination_write_errors_total Failed writes of an offline pod's termination into its termination file (each retried at every check)\n\
             # TYPE xshare_node_agent_pod_termination_write_errors_total counter\n\
             xshare_node_agent_pod_termination_write_errors_total{{node=\"{n}\"}} {te}\n\
             # HELP xshare_node_agent_offline_pods_deleted Offline pods deleted from the API kept in the list while their processes may still run (force-deleted)\n\
             # TYPE xshare_node_agent_offline_pods_deleted gauge\n\
             xshare_node_agent_offline_pods_deleted{{node=\"{n}\"}} {deleted}\n\
             # HELP xshare_node_agent_offline_pods_deleted_dropped_total Offline pods deleted from the API taken out of the list (cgroup empty or gone, or grace and linger passed)\n\
             # TYPE xshare_node_agent_offline_pods_deleted_dropped_total counter\n\
             xshare_node_agent_offline_pods_deleted_dropped_total{{node=\"{n}\"}} {dd}\n",
            dd = self.deleted_pods_dropped,
            te = self.termination_errors,
            n = self.node,
            e = self.errors,
            l = self.lists,
            r = self.pod_ledgers_removed,
            t = self.terminations_written
        )
    }
}

/// How long past its grace a pod deleted from the API while its containers may still run stays
/// in the list by default (`offline_pods.deleted_pod_linger_ms`).
pub const DEFAULT_DELETED_POD_LINGER: Duration = Duration::from_secs(30);

/// How often a failed termination file write is tried again (a pod's deletion matters within
/// its grace, seconds; the list's check is slower).
pub const TERMINATION_RETRY: Duration = Duration::from_millis(250);

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
    let retries = async {
        loop {
            tokio::time::sleep(TERMINATION_RETRY).await;
            let mut p = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !p.pending_terminations.is_empty() {
                p.retry_terminations();
                render(&p);
            }
        }
    };
    tokio::select! {
        _ = watch => {}
        _ = checks => {}
        _ = retries => {}
        _ = stop.changed() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list reads the memory annotation as Allocate does: trimmed (it was not).
    #[test]
    fn the_memory_annotation_is_read_trimmed_as_allocate_reads_it() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml", "uid": "u1", "annotations": {kube_contract::pod::ANN_MEMORY_QUOTA_BYTES: " 1024\n"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"xshare.io/offline-gpu": "1"}}}]},
        }))
        .unwrap();
        assert_eq!(offline_pod(&pod, "xshare.io/offline-gpu").unwrap().memory_quota_bytes, Some(1024));
    }

    fn uid(n: u8) -> node_ledger::PodUid {
        node_ledger::PodUid::parse(&format!("{n:08x}-0000-4000-8000-000000000000")).unwrap()
    }

    /// A pod's ledgers go once the pod left the node's list and the grace passed, never while
    /// a process is registered in them; a pod in the list keeps them.
    #[test]
    fn gone_pods_ledgers_are_removed_after_the_grace_unless_a_process_is_registered() {
        let d = tempfile::tempdir().unwrap();
        let (kept, gone, busy) = (uid(1), uid(2), uid(3));
        for (p, g) in [(kept, 0), (gone, 0), (gone, 1), (busy, 0)] {
            node_ledger::Ledger::open_or_create(&node_ledger::pods::pod_ledger_path(d.path(), p, g), g).unwrap();
        }
        let l = node_ledger::Ledger::open_existing(&node_ledger::pods::pod_ledger_path(d.path(), busy, 0)).unwrap();
        let h = l.register(std::process::id(), l.group(7, 1 << 20).unwrap()).unwrap();
        let keep = |p: node_ledger::PodUid| p == kept;
        assert!(remove_gone_pod_ledgers(d.path(), &keep, Duration::from_secs(3600)).is_empty(), "within the grace");
        assert_eq!(remove_gone_pod_ledgers(d.path(), &keep, Duration::ZERO), [gone]);
        assert!(!node_ledger::pods::pod_dir(d.path(), gone).exists());
        assert!(node_ledger::pods::pod_dir(d.path(), kept).exists() && node_ledger::pods::pod_dir(d.path(), busy).exists());
        // The registered process leaves: its pod's ledgers go at the next pass.
        l.unregister(h);
        assert_eq!(remove_gone_pod_ledgers(d.path(), &keep, Duration::ZERO), [busy]);
    }

    const RES: &str = "xshare.io/offline-gpu";
    /// 2026-11-30T10:00:05Z and 10:00:01Z, ms since the epoch.
    const AT_05_MS: u64 = 1_796_032_805_000;
    const AT_01_MS: u64 = 1_796_032_801_000;

    /// An offline pod bound to n1 as the API server sends it, deleted at `deletion` (RFC 3339)
    /// with `grace` s when given (`kubectl delete --grace-period`).
    fn deleted_pod(uid: &str, deletion: Option<&str>, grace: Option<i64>) -> Pod {
        let mut meta = serde_json::json!({"name": "train-0", "namespace": "ml", "uid": uid,
            "creationTimestamp": "2026-11-30T09:00:00Z", "resourceVersion": "4711"});
        if let Some(t) = deletion {
            meta["deletionTimestamp"] = t.into();
        }
        if let Some(g) = grace {
            meta["deletionGracePeriodSeconds"] = g.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 30, "containers": [{"name": "c", "image": "trainer:1",
                "resources": {"limits": {RES: "1"}, "requests": {RES: "1"}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    /// Pod `uid`'s termination file in `ledger_dir`, made empty as Allocate makes it.
    fn allocated_termination_file(ledger_dir: &std::path::Path, uid: &str) -> std::path::PathBuf {
        let path = node_ledger::termination::termination_path(ledger_dir, node_ledger::PodUid::parse(uid).unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        node_ledger::termination::create(&path).unwrap();
        path
    }

    fn terminations_metric(p: &Publisher) -> String {
        p.metrics().lines().find(|l| l.starts_with("xshare_node_agent_pod_terminations_written_total{")).unwrap().to_string()
    }

    /// The deletion's time is `deletionTimestamp` to the ms; its grace
    /// `deletionGracePeriodSeconds` (negative: 0), or the pod's spec grace when absent.
    #[test]
    fn a_deletion_is_read_off_the_pods_metadata() {
        let u = "0000000a-0000-4000-8000-000000000000";
        assert_eq!(termination(&deleted_pod(u, None, None)), None);
        let t = |d: &str, g| termination(&deleted_pod(u, Some(d), g)).unwrap();
        assert_eq!(t("2026-11-30T10:00:05Z", Some(5)), node_ledger::termination::Termination { deletion_unix_ms: AT_05_MS, grace_ms: 5000 });
        assert_eq!(t("2026-11-30T10:00:05.250Z", Some(0)).deletion_unix_ms, AT_05_MS + 250);
        assert_eq!(t("2026-11-30T10:00:05Z", Some(-3)).grace_ms, 0);
        assert_eq!(t("2026-11-30T10:00:05Z", None).grace_ms, 30_000, "the spec's grace");
    }

    /// (a) An Apply of a terminating offline pod whose termination file Allocate made writes
    /// the deletion into it, also before the first list, and also from a list; (b) a second
    /// deletion with a shorter grace rewrites it in place; the same reading is not counted
    /// again; (d) the metric counts the writes.
    #[test]
    fn a_pods_deletion_is_written_into_its_termination_file_and_a_shorter_one_rewrites_it() {
        use std::os::unix::fs::MetadataExt;
        use node_ledger::termination::{read, Termination};
        let d = tempfile::tempdir().unwrap();
        let u = "0000000a-0000-4000-8000-000000000000";
        let path = allocated_termination_file(d.path(), u);
        let ino = std::fs::metadata(&path).unwrap().ino();
        let mut p = Publisher::new("n1", RES, d.path());
        assert_eq!(terminations_metric(&p), "xshare_node_agent_pod_terminations_written_total{node=\"n1\"} 0");
        // Not synced yet: the termination file is written all the same.
        assert!(!p.apply(&watcher::Event::Apply(deleted_pod(u, None, None))));
        assert_eq!(read(&path), Ok(None), "not being deleted: nothing written");
        p.apply(&watcher::Event::Apply(deleted_pod(u, Some("2026-11-30T10:00:05Z"), Some(5))));
        assert_eq!(read(&path), Ok(Some(Termination { deletion_unix_ms: AT_05_MS, grace_ms: 5000 })));
        assert_eq!(p.terminations_written, 1);
        // The same deletion again (a status update while the pod terminates): unchanged.
        p.apply(&watcher::Event::Apply(deleted_pod(u, Some("2026-11-30T10:00:05Z"), Some(5))));
        assert_eq!(p.terminations_written, 1);
        // `kubectl delete --grace-period=1` a second later: earlier end, shorter grace.
        p.apply(&watcher::Event::Apply(deleted_pod(u, Some("2026-11-30T10:00:01Z"), Some(1))));
        assert_eq!(read(&path), Ok(Some(Termination { deletion_unix_ms: AT_01_MS, grace_ms: 1000 })));
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino, "in place: the container's mount names this inode");
        assert_eq!(p.terminations_written, 2);
        assert_eq!(terminations_metric(&p), "xshare_node_agent_pod_terminations_written_total{node=\"n1\"} 2");
        assert!(p.metrics().contains("# TYPE xshare_node_agent_pod_terminations_written_total counter\n"));
        // A relist (the watch restarted) that finds the pod deleted with another grace.
        std::fs::write(&path, "").unwrap();
        p.apply(&watcher::Event::Init);
        p.apply(&watcher::Event::InitApply(deleted_pod(u, Some("2026-11-30T10:00:05Z"), Some(5))));
        assert_eq!(read(&path), Ok(Some(Termination { deletion_unix_ms: AT_05_MS, grace_ms: 5000 })));
        assert_eq!(p.terminations_written, 3);
        assert_eq!(p.errors, 0);
    }

    /// (c) A pod not being deleted, one whose termination file does not exist (not allocated
    /// here), one asking for no offline slot, and one whose UID is not one get nothing written
    /// and nothing made.
    #[test]
    fn no_deletion_no_file_or_no_offline_pod_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (allocated, elsewhere) = ("0000000a-0000-4000-8000-000000000000", "0000000b-0000-4000-8000-000000000000");
        let path = |u: &str| node_ledger::termination::termination_path(d.path(), node_ledger::PodUid::parse(u).unwrap());
        std::fs::create_dir_all(path(allocated).parent().unwrap()).unwrap();
        node_ledger::termination::create(&path(allocated)).unwrap();
        let mut p = Publisher::new("n1", RES, d.path());
        for e in [watcher::Event::Init, watcher::Event::InitApply(deleted_pod(allocated, None, None)), watcher::Event::InitDone] {
            p.apply(&e);
        }
        p.apply(&watcher::Event::Apply(deleted_pod(allocated, None, None)));
        p.apply(&watcher::Event::Apply(deleted_pod(elsewhere, Some("2026-11-30T10:00:05Z"), Some(5))));
        assert!(!path(elsewhere).exists() && !node_ledger::pods::pod_dir(d.path(), node_ledger::PodUid::parse(elsewhere).unwrap()).exists());
        // The resource is another's: not an offline pod of this agent.
        let mut online = deleted_pod(allocated, Some("2026-11-30T10:00:05Z"), Some(5));
        online.spec.as_mut().unwrap().containers[0].resources = None;
        p.apply(&watcher::Event::Apply(online));
        p.apply(&watcher::Event::Apply(deleted_pod("u1", Some("2026-11-30T10:00:05Z"), Some(5))));
        assert_eq!(std::fs::read(path(allocated)).unwrap(), b"", "nothing written");
        assert_eq!((p.terminations_written, p.errors), (0, 0));
        assert!(p.metrics().contains("xshare_node_agent_pod_terminations_written_total{node=\"n1\"} 0\n"));
    }

    /// `pod` with the eviction the extender wrote onto it from the kubelet's Event.
    fn evicted(mut pod: Pod, node: &str, since: &str, node_pressure: bool) -> Pod {
        let since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time = serde_json::from_value(serde_json::json!(since)).unwrap();
        let uid = pod.metadata.uid.clone().unwrap();
        let e = kube_contract::kubelet_eviction::KubeletEviction { uid, node: node.into(), since_unix_ms: since.0.as_millisecond() as u64, node_pressure };
        pod.metadata.annotations.get_or_insert_with(Default::default).insert(kube_contract::kubelet_eviction::ANNOTATION.into(), e.render());
        pod
    }

    /// The eviction this node's kubelet began is read off the extender's annotation: a deletion
    /// ending the node's grace for node pressure (at most the spec's) after the Event, at once
    /// for a storage limit; another node's is none, a damaged one an error.
    #[test]
    fn the_kubelets_eviction_is_read_off_the_extenders_annotation() {
        use node_ledger::termination::Termination;
        let u = "0000000a-0000-4000-8000-000000000000";
        let pod = evicted(deleted_pod(u, None, None), "n1", "2026-11-30T10:00:05Z", true);
        assert_eq!(kubelet_eviction(&deleted_pod(u, None, None), "n1", 0), Ok(None));
        assert_eq!(kubelet_eviction(&pod, "n1", 0), Ok(Some(Termination { deletion_unix_ms: AT_05_MS, grace_ms: 0 })), "at once by default");
        assert_eq!(kubelet_eviction(&pod, "n1", 5000), Ok(Some(Termination { deletion_unix_ms: AT_05_MS + 5000, grace_ms: 5000 })));
        assert_eq!(kubelet_eviction(&pod, "n1", 600_000).unwrap().unwrap().grace_ms, 30_000, "never past the spec's grace");
        let storage = evicted(deleted_pod(u, None, None), "n1", "2026-11-30T10:00:05Z", false);
        assert_eq!(kubelet_eviction(&storage, "n1", 5000).unwrap().unwrap().grace_ms, 0, "a storage limit's: at once");
        assert_eq!(kubelet_eviction(&pod, "n2", 0), Ok(None), "another node's kubelet");
        let mut successor = pod.clone();
        successor.metadata.uid = Some("0000000b-0000-4000-8000-000000000000".into());
        assert_eq!(kubelet_eviction(&successor, "n1", 0), Ok(None), "a pod of the same name made after the evicted one");
        let mut damaged = pod.clone();
        damaged.metadata.annotations.as_mut().unwrap().insert(kube_contract::kubelet_eviction::ANNOTATION.into(), "soon".into());
        assert!(kubelet_eviction(&damaged, "n1", 0).is_err());
    }

    /// Written into the pod's termination file, combined with a deletion and with what the
    /// file says: the kill only ever moves earlier. A damaged annotation leaves the deletion.
    #[test]
    fn the_kubelets_eviction_is_written_and_the_file_only_moves_the_kill_earlier() {
        use node_ledger::termination::{read, Termination};
        let d = tempfile::tempdir().unwrap();
        let u = "0000000a-0000-4000-8000-000000000000";
        let path = allocated_termination_file(d.path(), u);
        let mut p = Publisher::new("n1", RES, d.path()).with_kubelet_grace_ms(5000);
        let pod = evicted(deleted_pod(u, None, None), "n1", "2026-11-30T10:00:01Z", true);
        p.apply(&watcher::Event::Apply(pod.clone()));
        assert_eq!(read(&path), Ok(Some(Termination { deletion_unix_ms: AT_01_MS + 5000, grace_ms: 5000 })));
        // A deletion ending later (the spec's 30 s from 10:00:05, the pod GC's or a user's): the
        // file keeps the eviction.
        let mut deleted = evicted(deleted_pod(u, Some("2026-11-30T10:00:35Z"), Some(30)), "n1", "2026-11-30T10:00:01Z", true);
        p.apply(&watcher::Event::Apply(deleted.clone()));
        assert_eq!(read(&path), Ok(Some(Termination { deletion_unix_ms: AT_01_MS + 5000, grace_ms: 5000 })));
        assert_eq!(p.terminations_written, 1);
        // One ending earlier, with a shorter grace: both as one.
        deleted.metadata.deletion_timestamp = Some(serde_json::from_value(serde_json::json!("2026-11-30T10:00:05Z")).unwrap());
        deleted.metadata.deletion_grace_period_seconds = Some(0);
        p.apply(&watcher::Event::Apply(deleted));
        assert_eq!(read(&path), Ok(Some(Termination { deletion_unix_ms: AT_05_MS, grace_ms: 0 })));
        // A relist's reading of the eviction alone: the file keeps the earlier kill.
        p.apply(&watcher::Event::Apply(pod));
        assert_eq!(read(&path), Ok(Some(Termination { deletion_unix_ms: AT_05_MS, grace_ms: 0 })));
        assert_eq!(p.terminations_written, 2);
        // A damaged annotation: ignored, the deletion still written.
        std::fs::write(&path, "").unwrap();
        let mut damaged = deleted_pod(u, Some("2026-11-30T10:00:05Z"), Some(5));
        damaged.metadata.annotations.get_or_insert_with(Default::default).insert(kube_contract::kubelet_eviction::ANNOTATION.into(), "soon".into());
        p.apply(&watcher::Event::Apply(damaged));
        assert_eq!(read(&path), Ok(Some(Termination { deletion_unix_ms: AT_05_MS, grace_ms: 5000 })));
    }

    /// A termination file that cannot be written (here a directory in its place) is counted
    /// as an error, and the watch goes on.
    #[test]
    fn a_termination_file_that_cannot_be_written_is_counted_and_retried() {
        let d = tempfile::tempdir().unwrap();
        let u = "0000000a-0000-4000-8000-000000000000";
        std::fs::create_dir_all(node_ledger::termination::termination_path(d.path(), node_ledger::PodUid::parse(u).unwrap())).unwrap();
        let mut p = Publisher::new("n1", RES, d.path());
        p.apply(&watcher::Event::Apply(deleted_pod(u, Some("2026-11-30T10:00:05Z"), Some(5))));
        p.apply(&watcher::Event::Apply(deleted_pod(u, Some("2026-11-30T10:00:05Z"), Some(5))));
        assert_eq!((p.terminations_written, p.termination_errors, p.errors), (0, 2, 0), "counted apart from the list's errors");
        assert!(p.metrics().contains("xshare_node_agent_pod_termination_write_errors_total{node=\"n1\"} 2"), "{}", p.metrics());
        // The cause goes; no further event comes for the pod: the next check writes it.
        let path = node_ledger::termination::termination_path(d.path(), node_ledger::PodUid::parse(u).unwrap());
        std::fs::remove_dir(&path).unwrap();
        node_ledger::termination::create(&path).unwrap();
        assert!(!p.retry_terminations(), "written at the retry");
        assert_eq!(p.terminations_written, 1);
        assert_eq!(node_ledger::termination::read(&path).unwrap().map(|t| t.grace_ms), Some(5000));
        p.refresh();
        assert_eq!((p.terminations_written, p.termination_errors), (1, 2), "nothing left to retry");
        // A pod whose write keeps failing leaves the retries when it is gone.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        p.apply(&watcher::Event::Apply(deleted_pod(u, Some("2026-11-30T10:00:04Z"), Some(4))));
        assert!(p.retry_terminations(), "still failing");
        // Deleted from the API with its containers said running: it stays, and so does its
        // retry, until it leaves the list.
        let t0 = Instant::now();
        p.apply_at(&watcher::Event::Delete(deleted_pod(u, Some("2026-11-30T10:00:04Z"), Some(4))), t0);
        assert!(p.retry_terminations(), "its processes may still run");
        p.refresh_at(t0 + Duration::from_secs(30) + DEFAULT_DELETED_POD_LINGER);
        assert!(!p.retry_terminations(), "the pod is gone");
        // One whose containers its kubelet said stopped leaves the retries at its DELETED event.
        p.apply(&watcher::Event::Apply(deleted_pod(u, Some("2026-11-30T10:00:04Z"), Some(4))));
        assert!(p.retry_terminations());
        p.apply(&watcher::Event::Delete(stopped(deleted_pod(u, Some("2026-11-30T10:00:04Z"), Some(0)))));
        assert!(!p.retry_terminations(), "the pod is gone");
    }

    /// `pod` as its kubelet reports it before it confirms a graceful deletion: every container
    /// terminated.
    fn stopped(mut pod: Pod) -> Pod {
        let st: k8s_openapi::api::core::v1::ContainerStatus = serde_json::from_value(serde_json::json!({
            "name": "c", "image": "trainer:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}
        }))
        .unwrap();
        pod.status.get_or_insert_with(Default::default).container_statuses = Some(vec![st]);
        pod
    }

    /// An offline pod of plan memory 2 GiB and spec grace `grace_s`, running, `deletion` (RFC
    /// 3339, grace s) when being deleted.
    fn planned_pod(uid: &str, grace_s: i64, deletion: Option<(&str, i64)>) -> Pod {
        let mut pod = deleted_pod(uid, deletion.map(|d| d.0), deletion.map(|d| d.1));
        pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(grace_s);
        pod.metadata.annotations.get_or_insert_with(Default::default).insert(kube_contract::pod::ANN_MEMORY_QUOTA_BYTES.into(), (2u64 << 30).to_string());
        pod
    }

    /// The pods of the file written, with their plan memory.
    fn listed(p: &Publisher) -> Vec<(String, Option<u64>)> {
        node_daemon::offline_pods::read(p.path()).unwrap().unwrap().pods.into_iter().map(|o| (o.uid, o.memory_quota_bytes)).collect()
    }

    /// A complete list of `pods` fed to `p` at `t` (`Init`, one `InitApply` each, `InitDone`).
    fn list(p: &mut Publisher, pods: impl IntoIterator<Item = Pod>, t: Instant) {
        p.apply_at(&watcher::Event::Init, t);
        for pod in pods {
            p.apply_at(&watcher::Event::InitApply(pod), t);
        }
        p.apply_at(&watcher::Event::InitDone, t);
    }

    /// Pod `u`'s cgroup (cgroupfs layout, BestEffort) under `root`, made if missing, its
    /// `cgroup.events` saying `populated <v>`; returns its directory.
    fn pod_cgroup_events(root: &std::path::Path, u: &str, populated: u8) -> std::path::PathBuf {
        let dir = root.join("kubepods/besteffort").join(format!("pod{u}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.events"), format!("populated {populated}\nfrozen 0\n")).unwrap();
        dir
    }

    /// A pod force-deleted (`kubectl delete --grace-period=0 --force`) is gone from the API
    /// while its containers run on (on kubelets hit by kubernetes/kubernetes#115819, for its
    /// full spec grace): it stays listed, with its plan memory, so the monitors go on judging
    /// its processes, and its termination file records the deletion; it leaves the list once
    /// its spec grace and the linger passed after its deletion was seen. Failed before: the
    /// pod left the list at its DELETED event.
    #[test]
    fn a_force_deleted_pod_stays_listed_with_its_plan_until_its_grace_and_the_linger_passed() {
        let d = tempfile::tempdir().unwrap();
        let u = "0000000a-0000-4000-8000-000000000000";
        let term = allocated_termination_file(d.path(), u);
        let mut p = Publisher::new("n1", RES, d.path());
        let t0 = Instant::now();
        list(&mut p, [planned_pod(u, 3600, None)], t0);
        let planned = vec![(u.to_string(), Some(2u64 << 30))];
        assert_eq!(listed(&p), planned);
        let forced = planned_pod(u, 3600, Some(("2026-11-30T10:00:05Z", 0)));
        p.apply_at(&watcher::Event::Apply(forced.clone()), t0);
        p.apply_at(&watcher::Event::Delete(forced), t0);
        assert_eq!(listed(&p), planned, "deleted from the API, its processes may still run: still judged against its plan");
        assert_eq!(
            node_ledger::termination::read(&term),
            Ok(Some(node_ledger::termination::Termination { deletion_unix_ms: AT_05_MS, grace_ms: 0 })),
            "its termination file says it is deleted"
        );
        assert!(p.metrics().contains("xshare_node_agent_offline_pods_deleted{node=\"n1\"} 1\n"), "{}", p.metrics());
        let bound = t0 + Duration::from_secs(3600) + DEFAULT_DELETED_POD_LINGER;
        assert!(!p.refresh_at(bound - Duration::from_millis(1)));
        assert_eq!(listed(&p), planned, "within its spec grace and the linger");
        assert!(p.refresh_at(bound), "written without it");
        assert_eq!(listed(&p), []);
        assert!(p.metrics().contains("xshare_node_agent_offline_pods_deleted_dropped_total{node=\"n1\"} 1\n"), "{}", p.metrics());
    }

    /// A pod whose last status says every container stopped (the kubelet confirmed a graceful
    /// deletion) leaves the list at its DELETED event; one deleted with no deletion shown (removed
    /// at once) stays, its termination file written as a deletion now with no grace; the grace
    /// counted is at most [`DELETED_POD_GRACE_CAP`], and the linger is the configured one.
    #[test]
    fn a_pod_whose_kubelet_said_its_containers_stopped_leaves_at_once_and_the_linger_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = ("0000000a-0000-4000-8000-000000000000", "0000000b-0000-4000-8000-000000000000");
        let term = allocated_termination_file(d.path(), b);
        let mut p = Publisher::new("n1", RES, d.path()).with_deleted_pod_linger(Duration::from_secs(5));
        let t0 = Instant::now();
        let year = 365 * 24 * 3600;
        list(&mut p, [planned_pod(a, 30, None), planned_pod(b, year, None)], t0);
        p.apply_at(&watcher::Event::Delete(stopped(planned_pod(a, 30, Some(("2026-11-30T10:00:05Z", 0))))), t0);
        assert_eq!(listed(&p).len(), 1, "the kubelet said its containers stopped");
        assert!(node_ledger::termination::read(&term).unwrap().is_none());
        let before = node_daemon::clock::unix_ms();
        p.apply_at(&watcher::Event::Delete(planned_pod(b, year, None)), t0);
        assert_eq!(listed(&p), [(b.to_string(), Some(2u64 << 30))]);
        let t = node_ledger::termination::read(&term).unwrap().expect("written");
        assert!(t.grace_ms == 0 && t.deletion_unix_ms >= before, "{t:?}");
        let bound = t0 + DELETED_POD_GRACE_CAP + Duration::from_secs(5);
        p.refresh_at(bound - Duration::from_millis(1));
        assert_eq!(listed(&p).len(), 1);
        p.refresh_at(bound);
        assert_eq!(listed(&p), []);
    }

    /// A relist without a pod the watch had (deleted while it was down, its last word unknown)
    /// keeps it as a deleted pod, from the list's end; one deleted before keeps its bound.
    #[test]
    fn a_relist_without_a_pod_keeps_it_as_deleted() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = ("0000000a-0000-4000-8000-000000000000", "0000000b-0000-4000-8000-000000000000");
        let mut p = Publisher::new("n1", RES, d.path());
        let t0 = Instant::now();
        list(&mut p, [planned_pod(a, 60, None), planned_pod(b, 60, None)], t0);
        p.apply_at(&watcher::Event::Delete(planned_pod(a, 60, None)), t0);
        let t1 = t0 + Duration::from_secs(20);
        list(&mut p, [], t1);
        assert_eq!(listed(&p).len(), 2, "both kept");
        p.refresh_at(t0 + Duration::from_secs(60) + DEFAULT_DELETED_POD_LINGER);
        assert_eq!(listed(&p), [(b.to_string(), Some(2u64 << 30))], "the one deleted first keeps its own bound");
        p.refresh_at(t1 + Duration::from_secs(60) + DEFAULT_DELETED_POD_LINGER);
        assert_eq!(listed(&p), []);
    }

    /// Where the host's cgroups are seen, a deleted pod leaves the list as soon as its cgroup
    /// holds no process, or is gone after it was seen; a cgroup never seen (the kubelet's tree
    /// is there, the pod's not: perhaps another layout) or one still populated keeps it.
    #[test]
    fn a_deleted_pod_leaves_once_its_cgroup_is_empty_or_gone() {
        let d = tempfile::tempdir().unwrap();
        let cg = tempfile::tempdir().unwrap();
        let (a, b, c) = ("0000000a-0000-4000-8000-000000000000", "0000000b-0000-4000-8000-000000000000", "0000000c-0000-4000-8000-000000000000");
        pod_cgroup_events(cg.path(), a, 1);
        let b_dir = pod_cgroup_events(cg.path(), b, 1);
        let mut p = Publisher::new("n1", RES, d.path()).with_cgroup_root(Some(cg.path().to_owned()));
        let t0 = Instant::now();
        list(&mut p, [a, b, c].map(|u| planned_pod(u, 600, None)), t0);
        for u in [a, b, c] {
            p.apply_at(&watcher::Event::Delete(planned_pod(u, 600, None)), t0);
        }
        assert_eq!(listed(&p).len(), 3, "a and b populated, c's cgroup never seen");
        pod_cgroup_events(cg.path(), a, 0);
        std::fs::remove_dir_all(b_dir).unwrap();
        p.refresh_at(t0);
        assert_eq!(listed(&p), [(c.to_string(), Some(2u64 << 30))], "a empty, b gone");
        p.refresh_at(t0 + Duration::from_secs(600) + DEFAULT_DELETED_POD_LINGER);
        assert_eq!(listed(&p), []);
    }

    /// A deleted pod whose cgroup still holds a process stays listed past its bound, whatever
    /// grace its tenant gave it (a day's grace, force-deleted, its processes running on unjudged
    /// after the 1 h cap, before); it leaves once the cgroup is empty.
    #[test]
    fn a_deleted_pod_whose_cgroup_holds_a_process_stays_past_its_bound() {
        let d = tempfile::tempdir().unwrap();
        let cg = tempfile::tempdir().unwrap();
        let u = "0000000a-0000-4000-8000-000000000000";
        pod_cgroup_events(cg.path(), u, 1);
        let mut p = Publisher::new("n1", RES, d.path()).with_cgroup_root(Some(cg.path().to_owned()));
        let t0 = Instant::now();
        list(&mut p, [planned_pod(u, 86_400, None)], t0);
        p.apply_at(&watcher::Event::Delete(planned_pod(u, 86_400, Some(("2026-11-30T10:00:05Z", 0)))), t0);
        p.refresh_at(t0 + DELETED_POD_GRACE_CAP + DEFAULT_DELETED_POD_LINGER + Duration::from_secs(60));
        assert_eq!(listed(&p).len(), 1, "a process of it still runs");
        pod_cgroup_events(cg.path(), u, 0);
        p.refresh_at(t0 + DELETED_POD_GRACE_CAP + DEFAULT_DELETED_POD_LINGER + Duration::from_secs(61));
        assert_eq!(listed(&p), [], "empty after it held a process: gone at the first look");
    }

    /// A cgroup empty at the first look, never seen holding a process (a pod force-deleted
    /// while its containers were still being made), is looked at once more, at least
    /// [`EMPTY_LOOKS_APART`] later, before its pod leaves the list.
    #[test]
    fn an_empty_cgroup_never_seen_populated_needs_a_second_look() {
        let d = tempfile::tempdir().unwrap();
        let cg = tempfile::tempdir().unwrap();
        let u = "0000000a-0000-4000-8000-000000000000";
        pod_cgroup_events(cg.path(), u, 0);
        let mut p = Publisher::new("n1", RES, d.path()).with_cgroup_root(Some(cg.path().to_owned()));
        let t0 = Instant::now();
        list(&mut p, [planned_pod(u, 600, None)], t0);
        p.apply_at(&watcher::Event::Delete(planned_pod(u, 600, Some(("2026-11-30T10:00:05Z", 0)))), t0);
        assert_eq!(listed(&p).len(), 1, "one look at an empty cgroup is not enough");
        // Another pod's forced deletion at once (a mass deletion) looks again: too soon.
        let v = "0000000b-0000-4000-8000-000000000000";
        p.apply_at(&watcher::Event::Apply(planned_pod(v, 600, None)), t0);
        p.apply_at(&watcher::Event::Delete(planned_pod(v, 600, Some(("2026-11-30T10:00:05Z", 0)))), t0 + Duration::from_millis(5));
        assert!(listed(&p).iter().any(|(x, _)| x == u), "a second look 5 ms later is not enough either");
        p.refresh_at(t0 + EMPTY_LOOKS_APART);
        assert_eq!(listed(&p), [(v.to_string(), Some(2u64 << 30))], "u empty at a second look a second later; v's cgroup never seen");
    }

    /// A relist that shows a pod finished (it ended while the watch was down) drops it at once:
    /// it is not a pod deleted from the API whose processes may run on.
    #[test]
    fn a_relist_showing_a_pod_finished_drops_it_at_once() {
        let d = tempfile::tempdir().unwrap();
        let u = "0000000a-0000-4000-8000-000000000000";
        let mut p = Publisher::new("n1", RES, d.path());
        let t0 = Instant::now();
        list(&mut p, [planned_pod(u, 600, None)], t0);
        let mut done = planned_pod(u, 600, None);
        done.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into());
        list(&mut p, [done], t0);
        assert_eq!(listed(&p), []);
        assert!(p.metrics().contains("xshare_node_agent_offline_pods_deleted{node=\"n1\"} 0\n"), "{}", p.metrics());
    }

    /// A node-agent restarted while a force-deleted pod was kept: the first list lacks the pod,
    /// and the file the previous agent wrote names it, so it is kept as deleted again (before,
    /// the restart rewrote the list without it at once).
    #[test]
    fn a_restarted_agent_keeps_the_deleted_pods_the_previous_one_listed() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = ("0000000a-0000-4000-8000-000000000000", "0000000b-0000-4000-8000-000000000000");
        let t0 = Instant::now();
        {
            let mut p = Publisher::new("n1", RES, d.path());
            list(&mut p, [planned_pod(a, 600, None), planned_pod(b, 600, None)], t0);
            p.apply_at(&watcher::Event::Delete(planned_pod(a, 600, Some(("2026-11-30T10:00:05Z", 0)))), t0);
            assert_eq!(listed(&p).len(), 2);
        }
        let mut p = Publisher::new("n1", RES, d.path());
        list(&mut p, [planned_pod(b, 600, None)], t0);
        assert_eq!(listed(&p), [(a.to_string(), Some(2u64 << 30)), (b.to_string(), Some(2u64 << 30))], "a kept, with its plan");
        p.refresh_at(t0 + DELETED_POD_GRACE_CAP + DEFAULT_DELETED_POD_LINGER);
        assert_eq!(listed(&p), [(b.to_string(), Some(2u64 << 30))], "at most its capped grace and the linger");
        // Another node's file is not this node's list.
        let mut q = Publisher::new("n2", RES, d.path());
        for e in [watcher::Event::Init, watcher::Event::InitDone] {
            q.apply_at(&e, t0);
        }
        assert_eq!(listed(&q), []);
    }

    /// A pod the previous node-agent kept as deleted, whose termination file records its
    /// deletion longer ago than the bound, is not kept again by a restarted agent (a restart
    /// used to start its bound again, so an agent restarting more often than hourly kept it
    /// for ever); one deleted recently keeps what is left of its bound.
    #[test]
    fn a_restarted_agent_counts_an_inherited_pods_bound_from_its_recorded_deletion() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = ("0000000a-0000-4000-8000-000000000000", "0000000b-0000-4000-8000-000000000000");
        let (ta, tb) = (allocated_termination_file(d.path(), a), allocated_termination_file(d.path(), b));
        let t0 = Instant::now();
        {
            let mut p = Publisher::new("n1", RES, d.path());
            list(&mut p, [planned_pod(a, 600, None), planned_pod(b, 600, None)], t0);
            for u in [a, b] {
                p.apply_at(&watcher::Event::Delete(planned_pod(u, 600, Some(("2026-11-30T10:00:05Z", 0)))), t0);
            }
            assert_eq!(listed(&p).len(), 2);
        }
        // As the files would read: a deleted two hours ago, b a minute ago.
        let now_ms = node_daemon::clock::unix_ms();
        node_ledger::termination::write(&ta, &node_ledger::termination::Termination { deletion_unix_ms: now_ms - 2 * 3600 * 1000, grace_ms: 0 }).unwrap();
        node_ledger::termination::write(&tb, &node_ledger::termination::Termination { deletion_unix_ms: now_ms - 60 * 1000, grace_ms: 0 }).unwrap();
        let mut p = Publisher::new("n1", RES, d.path());
        list(&mut p, [], t0);
        assert_eq!(listed(&p), [(b.to_string(), Some(2u64 << 30))], "a's bound passed before the restart");
        p.refresh_at(t0 + DELETED_POD_GRACE_CAP + DEFAULT_DELETED_POD_LINGER - Duration::from_secs(60));
        assert_eq!(listed(&p), [], "b's bound counted from its deletion, not from the restart");
    }
}
