//! Eviction the cluster can see.
//!
//! sysmonitor decides and acts locally: it records the request in its eviction table of the
//! GPU's status file (`node_ledger::status`, addressed to the process's pid namespace, pid and
//! start time; mps-manager has a table of its own there) and signals the process (SIGTERM,
//! SIGKILL after the grace period). Only the daemons write the status file: a request in a
//! ledger slot, as before, could be written by any offline container into any slot, and this
//! agent posted the Eviction of every pod such a write named. That local signal stays the emergency path. This worker makes the decision
//! visible to Kubernetes: it finds each requested process's pod and posts an `Eviction`
//! (`policy/v1`, `deleteOptions.preconditions.uid`, so a pod re-created under the same name is
//! never hit) and an Event, so the pod's controller re-creates it and the planner re-places it.
//!
//! Two sources of requests: the live requests (at once, while the process is registered) and the
//! monitor's durable per-GPU eviction log (`node_ledger::evictlog`), which outlives a process
//! that exits on SIGTERM before our next scan. The log is read from a cursor this agent keeps
//! in `<ledger_dir>/evict-log/gpu<N>.cursor` (its only writer): the place (log generation and
//! byte offset, so it survives the monitor's size rotation) of the first record not yet
//! settled, and the pods already finished with past it, so a restarted agent posts nothing
//! twice. A record is settled once its pod has a final outcome, or the pod list (read
//! successfully) has no pod for it. A missing cursor reads the log from its oldest kept
//! generation (first start). A damaged cursor, or a log that no longer matches it (truncated,
//! a generation rotated away unread), stops that GPU's log reading loudly (an error, the
//! `xshare_node_agent_eviction_log_stalled` gauge) instead of re-reporting everything or
//! skipping; the live slots are still served, and the operator moves the cursor aside to go
//! on. A damaged line is reported (error, `xshare_node_agent_eviction_log_damaged_total`) and
//! passed.
//!
//! Process -> pod: first the pod the requesting daemon read in the process's cgroup path on the
//! host (the status file's request names it, `node_ledger::PodUid`, and so does the monitor's
//! log record, for work without the shim too): a ledger slot's group is the process's own word
//! (any ledger client writes its own slot), and a slot claiming a neighbour pod's group, once
//! taken as the pod, got that neighbour evicted; such a claim is now logged and counted
//! (`xshare_node_agent_eviction_group_mismatch_total`) and never acted on. Without a daemon's
//! pod (a process the daemon could not see, or in no pod's cgroup) the ledger group
//! (`XCUDA_GROUP = k8s-pod-<uid>`, set at Allocate) gives the pod UID from any pid namespace;
//! any other process outside a group is mapped by its cgroup path
//! (`.../pod<uid>/...`), read under its pid in the agent's pid namespace: the pid itself when
//! the process shares it, else the one its pid namespace and pid there lead to
//! (`node_daemon::procns`, as the daemons find a container's host pid). That needs an agent
//! that sees the host's processes (a systemd unit, or `hostPID` with `CAP_SYS_PTRACE`); the
//! shipped DaemonSet has neither and relies on the group alone.
//!
//! Answers: 201 evicted; 429 refused by a PodDisruptionBudget or API Priority and Fairness
//! (Event once, retried after the server's `Retry-After` header, else its
//! `details.retryAfterSeconds`, else our backoff); 404 pod gone, 409 whose message says the
//! UID precondition failed (pod replaced): done, never retried; any other 409 (the
//! resourceVersion precondition the API server sets on a Pending pod's deletion, failed after
//! its retries), other errors and timeouts: retried likewise. A pod is evicted at most once.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, ObjectMeta, Preconditions, Time,
};
use kube::api::PostParams;
use kube::{Api, Client};
use node_ledger::config::ledger_path;
use node_ledger::evictlog::Pos;
use node_ledger::ledger::group_id_for;
use node_ledger::Ledger;

use crate::allocate::group_name;

/// An offline process the monitor asked to leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    /// Host GPU index.
    pub gpu: u32,
    /// Pid in the process's own pid namespace.
    pub pid: u32,
    /// Start time (clock ticks): with `pid`, the process's identity.
    pub start_time: u64,
    /// Pid-namespace inode of the process.
    pub pid_ns: u64,
    /// Ledger quota group (maps the process to its pod when no daemon found its pod); 0 for a
    /// damaged log line and for work that ran without the shim.
    pub group_id: u64,
    /// The pod the requesting daemon found in the process's cgroup path (the status file's
    /// request, or the eviction log's record): taken over `group_id`, which the process wrote.
    pub pod_uid: Option<String>,
    /// For a record of the eviction log: its line was damaged (nothing to evict, counted).
    pub damaged: bool,
    /// Signal the monitor asked for.
    pub signal: u32,
    /// The ledger file the process must hold open to be the one named
    /// ([`node_ledger::ProcSnapshot::ledger_file`]; for a record of the eviction log, the
    /// GPU's ledger of the moment): a process found by pid but holding none is not offline
    /// work, whatever a slot says, and its pod is never looked up by its cgroup.
    pub ledger_file: node_ledger::LedgerFile,
    /// For a record of the eviction log: where its line ends (the cursor past it).
    pub log_end: Option<Pos>,
}

impl Requested {
    /// A record of the eviction log that names no pod in any way: a damaged line, or work
    /// without the shim in no pod's cgroup. Settled as read; nothing to post.
    fn names_nothing(&self) -> bool {
        self.log_end.is_some() && self.group_id == 0 && self.pod_uid.is_none()
    }
}

/// How far this agent has reported GPU `gpu`'s eviction log (persisted as JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogCursor {
    /// Where the first record not settled yet is (`None`: nothing read yet, start at the
    /// oldest kept generation).
    pub at: Option<Pos>,
    /// Pods (UIDs) finished with whose records lie past `at`.
    pub done: Vec<String>,
}

/// `<ledger_dir>/evict-log/gpu<N>.cursor`.
pub fn cursor_path(ledger_dir: &Path, gpu: u32) -> std::path::PathBuf {
    ledger_dir
        .join(node_ledger::evictlog::DIR)
        .join(format!("gpu{gpu}.cursor"))
}

/// The saved cursor; a missing one is the start (nothing read yet). An unreadable or damaged
/// one is an error naming the file: guessing would re-report every kept record or skip some.
pub fn load_cursor(ledger_dir: &Path, gpu: u32) -> Result<LogCursor, String> {
    let path = cursor_path(ledger_dir, gpu);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LogCursor::default()),
        Err(e) => return Err(format!("eviction log cursor {}: {e}", path.display())),
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "eviction log cursor {} is damaged ({e}); move it aside to re-read GPU {gpu}'s log from its oldest kept generation",
            path.display()
        )
    })
}

fn save_cursor(ledger_dir: &Path, gpu: u32, c: &LogCursor) -> std::io::Result<()> {
    let path = cursor_path(ledger_dir, gpu);
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(c).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, &path)
}

/// The records of GPU `gpu`'s eviction log past `from` (damaged lines as requests of group 0),
/// and where reading stopped.
pub fn scan_log(
    ledger_dir: &Path,
    gpu: u32,
    from: Option<Pos>,
) -> Result<(Vec<Requested>, Pos), node_ledger::evictlog::LogError> {
    let batch = node_ledger::evictlog::read_from(ledger_dir, gpu, from, 1 << 20)?;
    // No ledger, no file to hold: such a record maps to a pod by its group only.
    let ledger_file = node_ledger::LedgerFile::of_path(&ledger_path(ledger_dir, gpu)).unwrap_or_default();
    let reqs = batch
        .entries
        .into_iter()
        .map(|e| match e.record {
            Some(r) => Requested {
                gpu,
                pid: r.pid,
                start_time: r.start_time,
                pid_ns: r.pid_ns,
                group_id: r.group_id,
                signal: r.signal,
                log_end: Some(e.end),
                ledger_file,
                pod_uid: r.pod_uid,
                damaged: false,
            },
            // A damaged line: nothing to evict, the cursor moves past it.
            None => {
                tracing::error!(
                    gpu,
                    generation = e.start.generation,
                    offset = e.start.offset,
                    log = %node_ledger::evictlog::log_path(ledger_dir, gpu).display(),
                    "damaged line in the eviction log: skipped"
                );
                Requested {
                    gpu,
                    pid: 0,
                    start_time: 0,
                    pid_ns: 0,
                    group_id: 0,
                    signal: 0,
                    log_end: Some(e.end),
                    ledger_file,
                    pod_uid: None,
                    damaged: true,
                }
            }
        })
        .collect();
    Ok((reqs, batch.end))
}

/// The daemons' eviction requests (the status files of `gpus`) of processes registered in the
/// ledgers of `gpus`, the GPU's own and each pod's (a missing or damaged ledger or status file
/// is skipped: the monitor's own path handles them). A process is taken as its registration
/// names it: pid namespace, pid and start time, the address of the request.
pub fn scan(ledger_dir: &Path, gpus: &[u32]) -> Vec<Requested> {
    let mut out = Vec::new();
    for &gpu in gpus {
        let Ok(status) = node_ledger::Status::open(&node_ledger::config::status_path(ledger_dir, gpu)) else {
            continue;
        };
        let asked = status.evict_requests();
        if asked.is_empty() {
            continue;
        }
        // The GPU's ledger and each pod's (`node_ledger::pods`): opened only while a request
        // is in force.
        let mut pods = node_ledger::pods::PodLedgers::new(ledger_dir, gpu);
        pods.scan();
        let own = Ledger::open_existing(&ledger_path(ledger_dir, gpu)).ok();
        let procs = own
            .iter()
            .flat_map(|l| l.procs().into_iter().map(|p| (None, p)))
            .chain(pods.iter().flat_map(|pl| pl.ledger.procs().into_iter().map(|p| (Some(pl.pod), p))));
        for (ledger_pod, p) in procs {
            let id = node_ledger::ProcId::of(&p);
            let Some(req) = asked.iter().find(|a| a.id == id) else { continue };
            let sig = req.signal;
            if sig != 0 && p.start_time != 0 {
                out.push(Requested {
                    gpu,
                    pid: p.pid,
                    start_time: p.start_time,
                    pid_ns: p.pid_ns,
                    group_id: p.group_id,
                    signal: sig,
                    log_end: None,
                    ledger_file: p.ledger_file,
                    // The pod the daemon read in the process's cgroup, else the pod whose
                    // ledger it is in (mounted into that pod alone).
                    pod_uid: req.pod.or(ledger_pod).map(|u| u.to_string()),
                    damaged: false,
                });
            }
        }
    }
    out
}

/// The pod UID in the cgroup path of the live process that is `pid` in the pid namespace
/// `pid_ns` and started at `start_time` (its ledger identity) and holds a slot's lock in
/// `file`, read under its pid here (`host_pids`); `None` when it is gone, not visible from
/// here, holds no such lock (no registered ledger client: not offline work), or in no pod's
/// cgroup. Any slot's lock: a record of the eviction log names no slot.
pub fn pod_uid_of_process(
    host_pids: &mut node_daemon::procns::HostPids,
    (pid_ns, pid, start_time): (u64, u32, u64),
    file: &node_ledger::LedgerFile,
) -> Option<String> {
    let host = host_pids.get((pid_ns, pid, start_time), file, node_ledger::layout::registry_lock_range())?;
    // The pid here may have been reused since it was found: same start time, same process.
    if !node_ledger::procinfo::is_alive(host, start_time) {
        return None;
    }
    node_daemon::offline_pods::pod_uid_of(host)
}

/// A pod, as far as eviction needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (the Eviction's precondition).
    pub uid: String,
    /// Already being deleted (`deletionTimestamp` set).
    pub terminating: bool,
}

impl PodRef {
    /// `p` if it asks for `resource` (the device plugin's offline slots) in any container's
    /// limits or requests: only such a pod is offline work this agent may evict. A ledger
    /// group id or a process's cgroup naming any other pod (an online service's) maps to none.
    pub(crate) fn of(p: &Pod, resource: &str) -> Option<Self> {
        if !asks_for(p, resource) {
            return None;
        }
        Some(PodRef {
            namespace: p.metadata.namespace.clone()?,
            name: p.metadata.name.clone()?,
            uid: p.metadata.uid.clone()?,
            terminating: p.metadata.deletion_timestamp.is_some(),
        })
    }
}

/// Whether pod `p` asks for `resource` (the device plugin's offline slots) in any container's
/// limits or requests, init containers included: offline work.
pub fn asks_for(p: &Pod, resource: &str) -> bool {
    kube_contract::pod::asks_for(p, resource)
}

/// Whether a `409 Conflict` answer to an Eviction (its `Status` message) says the UID
/// precondition failed: the pod of that name is another one now (the store's "Precondition
/// failed: UID in precondition: …", or the eviction's own "the UID in the precondition (…) does
/// not match the UID in record (…)"). The API server answers 409 too when the resourceVersion
/// precondition it sets on a Pending pod's deletion fails after its retries (eviction.go
/// `shouldEnforceResourceVersion`): that pod is still this one, to evict again.
pub fn uid_precondition_failed(message: &str) -> bool {
    message.contains("UID in precondition") || message.contains("the UID in the precondition")
}

/// What happened to a pod's eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// 201: the API server accepted the eviction.
    Evicted,
    /// 429: a PodDisruptionBudget refuses it now (retried).
    Blocked,
    /// 404: the pod is gone.
    Gone,
    /// 409: the UID precondition failed: the name now belongs to another pod.
    Replaced,
    /// Already being deleted when found: nothing posted.
    Terminating,
    /// Transport error, timeout, other status (retried).
    Failed,
}

impl Outcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Evicted => "evicted",
            Outcome::Blocked => "blocked",
            Outcome::Gone => "gone",
            Outcome::Replaced => "replaced",
            Outcome::Terminating => "terminating",
            Outcome::Failed => "failed",
        }
    }

    /// Whether the pod is finished with (never posted again).
    pub fn is_final(self) -> bool {
        !matches!(self, Outcome::Blocked | Outcome::Failed)
    }
}

#[derive(Debug)]
struct Retry {
    next: Instant,
    backoff: Duration,
    blocked_event_sent: bool,
}

/// The eviction worker's state: finished pods (never evicted twice), retries, counters.
pub struct Evictor {
    client: Client,
    node: String,
    ledger_dir: std::path::PathBuf,
    gpus: Vec<u32>,
    retry_first: Duration,
    /// Pod UID -> final outcome.
    done: HashMap<String, Outcome>,
    retries: HashMap<String, Retry>,
    /// The device plugin's resource: only pods asking for it are evicted ([`PodRef::of`]).
    resource: String,
    /// Ledger group id -> pod, from the offline pods bound to this node.
    groups: HashMap<u64, PodRef>,
    by_uid: HashMap<String, PodRef>,
    /// Attempts by outcome (Prometheus `xshare_node_agent_evictions_total{result}`).
    pub counts: BTreeMap<Outcome, u64>,
    /// Requests whose pod could not be found (not a Kubernetes pod, or not ours).
    pub unmapped: u64,
    /// Processes whose slot claimed another pod's group than the pod a daemon found in their
    /// cgroup (`xshare_node_agent_eviction_group_mismatch_total`): counted once each.
    pub group_mismatch: u64,
    mismatch_seen: std::collections::HashSet<(u64, u32, u64)>,
    /// Host pids of requested processes outside a pod group (cached, misses backed off).
    host_pids: node_daemon::procns::HostPids,
    /// Per GPU, how far its eviction log is reported, or why it cannot be read (stalled).
    cursors: BTreeMap<u32, Result<LogCursor, String>>,
    /// Per GPU, where this tick's read of the log stopped.
    log_ends: BTreeMap<u32, Pos>,
    /// Damaged log lines passed (`xshare_node_agent_eviction_log_damaged_total`).
    pub log_damaged: u64,
    /// Damaged lines already counted (a blocked cursor reads them again).
    damaged_seen: std::collections::BTreeSet<(u32, Pos)>,
    /// The pod list's pace and backoff: a request naming a pod the last list did not map
    /// (a process of no pod of this node, or of a pod not yet listed) lists again at most every
    /// `list_pace`, and a failing list waits (doubling, or the server's wait) before the next,
    /// its error said once: not a consistent LIST and a warning every tick.
    list_backoff: kube_contract::retry::Backoff<Instant>,
    list_pace: Duration,
    /// Pod lists sent (`xshare_node_agent_eviction_pod_lists_total`).
    pub pod_lists: u64,
}

/// Shortest time between two lists of this node's pods for eviction requests no list mapped.
pub const DEFAULT_LIST_PACE: Duration = Duration::from_secs(3);
/// Longest wait after failed lists (and cap on the server's wait).
pub const MAX_LIST_BACKOFF: Duration = Duration::from_secs(60);

impl Evictor {
    /// A worker for the GPUs `gpus` of node `node`, reading `ledger_dir`, evicting only pods
    /// that ask for `resource` (the device plugin's `resource_name`); a refused or failed
    /// eviction is retried after `retry_first`, doubling (unless the server says when).
    pub fn new(
        client: Client,
        node: &str,
        ledger_dir: &Path,
        gpus: Vec<u32>,
        resource: &str,
        retry_first: Duration,
    ) -> Self {
        let gpus_c = gpus.clone();
        Self {
            client,
            node: node.to_string(),
            resource: resource.to_string(),
            ledger_dir: ledger_dir.to_owned(),
            gpus,
            retry_first,
            done: HashMap::new(),
            retries: HashMap::new(),
            groups: HashMap::new(),
            by_uid: HashMap::new(),
            counts: BTreeMap::new(),
            unmapped: 0,
            group_mismatch: 0,
            mismatch_seen: Default::default(),
            host_pids: node_daemon::procns::HostPids::default(),
            cursors: gpus_c
                .iter()
                .map(|&g| {
                    let c = load_cursor(ledger_dir, g);
                    if let Err(e) = &c {
                        tracing::error!(gpu = g, error = %e, "eviction log reading stopped for this GPU");
                    }
                    (g, c)
                })
                .collect(),
            log_ends: BTreeMap::new(),
            log_damaged: 0,
            damaged_seen: Default::default(),
            list_backoff: kube_contract::retry::Backoff::new(retry_first, MAX_LIST_BACKOFF),
            list_pace: DEFAULT_LIST_PACE,
            pod_lists: 0,
        }
    }

    /// Lists this node's pods for unmapped requests at most every `pace` (default
    /// [`DEFAULT_LIST_PACE`]).
    pub fn with_list_pace(mut self, pace: Duration) -> Self {
        self.list_pace = pace;
        self
    }

    /// Why GPU `gpu`'s eviction log is not being read, if it is not.
    pub fn log_stalled(&self, gpu: u32) -> Option<&str> {
        self.cursors.get(&gpu)?.as_ref().err().map(String::as_str)
    }

    /// Final outcome for pod `uid`, if it has one.
    pub fn outcome(&self, uid: &str) -> Option<Outcome> {
        self.done.get(uid).copied()
    }

    async fn refresh_pods(&mut self) -> Result<(), kube::Error> {
        let pods = crate::kube::pods_on_node(&self.client, &self.node, None).await?;
        self.groups.clear();
        self.by_uid.clear();
        for p in pods.iter().filter_map(|p| PodRef::of(p, &self.resource)) {
            self.groups
                .insert(group_id_for(&group_name(&p.uid)), p.clone());
            self.by_uid.insert(p.uid.clone(), p);
        }
        Ok(())
    }

    /// The pod of `r` as far as the pod list knows it, without reading any process: the pod a
    /// daemon found in its cgroup, else its slot's group.
    fn known_pod(&self, r: &Requested) -> Option<&PodRef> {
        match &r.pod_uid {
            Some(uid) => self.by_uid.get(uid),
            None => self.groups.get(&r.group_id),
        }
    }

    fn resolve(&mut self, r: &Requested) -> Option<PodRef> {
        // The pod a daemon found in the process's cgroup (it sees the host's processes; this
        // agent may not) decides; the group its slot claims is its own word.
        if let Some(uid) = &r.pod_uid {
            if let Some(claimed) = self.groups.get(&r.group_id).filter(|c| &c.uid != uid) {
                if self.mismatch_seen.insert((r.pid_ns, r.pid, r.start_time)) {
                    self.group_mismatch += 1;
                    tracing::warn!(
                        gpu = r.gpu,
                        pid = r.pid,
                        pid_ns = r.pid_ns,
                        cgroup_pod = %uid,
                        claimed_pod = %format!("{}/{}", claimed.namespace, claimed.name),
                        "an offline process's ledger slot claims another pod's group than the pod its cgroup names: the claim is ignored (only the cgroup's pod is evicted)"
                    );
                }
            }
            return self.by_uid.get(uid).cloned();
        }
        if let Some(p) = self.groups.get(&r.group_id) {
            return Some(p.clone());
        }
        let uid = pod_uid_of_process(&mut self.host_pids, (r.pid_ns, r.pid, r.start_time), &r.ledger_file)?;
        self.by_uid.get(&uid).cloned()
    }

    /// One pass: read the ledgers' requests, evict their pods. Returns the outcomes of this pass.
    pub async fn tick(&mut self) -> Vec<(PodRef, Outcome)> {
        let mut reqs = scan(&self.ledger_dir, &self.gpus);
        self.log_ends.clear();
        for (&gpu, c) in self.cursors.iter_mut() {
            let Ok(cur) = c else { continue };
            let (mut from_log, end) = match scan_log(&self.ledger_dir, gpu, cur.at) {
                Ok(x) => x,
                Err(e) => {
                    let e = e.to_string();
                    tracing::error!(gpu, error = %e, "eviction log reading stopped for this GPU (the live slots are still served)");
                    *c = Err(e);
                    continue;
                }
            };
            self.log_ends.insert(gpu, end);
            for r in from_log.iter().filter(|r| r.damaged) {
                if let Some(end) = r.log_end {
                    if self.damaged_seen.insert((gpu, end)) {
                        self.log_damaged += 1;
                    }
                }
            }
            let c = &*cur;
            // Pods already finished with (before a restart too): their records are settled.
            from_log.retain(|r| {
                r.names_nothing()
                    || !c.done.iter().any(|u| match &r.pod_uid {
                        Some(p) => p == u,
                        None => r.group_id != 0 && group_id_for(&group_name(u)) == r.group_id,
                    })
            });
            reqs.extend(from_log);
        }
        let mut out = Vec::new();
        if reqs.iter().all(Requested::names_nothing) {
            self.settle_logs(&reqs, false);
            return out;
        }
        let unknown = reqs
            .iter()
            .any(|r| !r.names_nothing() && (r.pod_uid.is_some() || r.group_id != 0) && self.known_pod(r).is_none());
        let mut listed = false;
        if (unknown || self.groups.is_empty()) && self.list_backoff.ready(Instant::now()) {
            self.pod_lists += 1;
            match self.refresh_pods().await {
                Ok(()) => {
                    listed = true;
                    if self.list_backoff.succeeded() {
                        tracing::info!("listing pods on this node works again");
                    }
                    self.list_backoff.hold_until(Instant::now() + self.list_pace);
                }
                Err(e) => {
                    let f = self.list_backoff.failed(Instant::now(), &e.to_string(), kube_contract::retry::retry_after(&e));
                    if f.say {
                        tracing::warn!(error = %e, retry_in_ms = f.delay.as_millis() as u64, server_asked = f.server_asked, "listing pods on this node failed; retrying with backoff, this error said once (the monitor's local signal still applies)")
                    }
                }
            }
        }
        let registry = node_ledger::layout::registry_lock_range();
        self.host_pids.retain(|&(file, lock, (ns, pid, st))| {
            lock == registry && reqs.iter().any(|r| r.ledger_file == file && (r.pid_ns, r.pid, r.start_time) == (ns, pid, st))
        });
        self.mismatch_seen
            .retain(|&(ns, pid, st)| reqs.iter().any(|r| (r.pid_ns, r.pid, r.start_time) == (ns, pid, st)));
        let mut seen = std::collections::HashSet::new();
        for r in &reqs {
            if r.names_nothing() {
                continue;
            }
            let Some(pod) = self.resolve(r) else {
                if r.log_end.is_none() || listed {
                    self.unmapped += 1;
                }
                tracing::debug!(
                    pid = r.pid,
                    gpu = r.gpu,
                    "eviction request for a process with no pod found (local signal only)"
                );
                continue;
            };
            if !seen.insert(pod.uid.clone()) || self.done.contains_key(&pod.uid) {
                continue;
            }
            if let Some(rt) = self.retries.get(&pod.uid) {
                if Instant::now() < rt.next {
                    continue;
                }
            }
            if pod.terminating {
                self.finish(&pod, Outcome::Terminating);
                out.push((pod, Outcome::Terminating));
                continue;
            }
            let o = self.evict(&pod, r).await;
            out.push((pod, o));
        }
        self.settle_logs(&reqs, listed);
        out
    }

    /// Moves each GPU's log cursor past its settled records (and saves it when it moved).
    /// `listed`: the pod list was read this tick, so a record with no pod has none.
    fn settle_logs(&mut self, reqs: &[Requested], listed: bool) {
        let gpus: Vec<u32> = self.log_ends.keys().copied().collect();
        for gpu in gpus {
            let Some(Ok(before)) = self.cursors.get(&gpu).cloned() else {
                continue;
            };
            let mut c = before.clone();
            let mut blocked = false;
            for r in reqs.iter().filter(|r| r.gpu == gpu && r.log_end.is_some()) {
                let pod = self.known_pod(r);
                let settled = match pod {
                    _ if r.names_nothing() => true,
                    Some(p) => self.done.contains_key(&p.uid),
                    None => listed,
                };
                let end = r.log_end.unwrap_or_default();
                if !blocked && settled {
                    c.at = c.at.max(Some(end));
                } else {
                    blocked = true;
                    if let Some(p) = pod.filter(|p| self.done.contains_key(&p.uid)) {
                        if !c.done.contains(&p.uid) {
                            c.done.push(p.uid.clone());
                        }
                    }
                }
            }
            if !blocked {
                // Everything read is settled: on to where reading stopped (maybe a newer
                // generation, so a fully read one may be rotated away).
                c.at = c.at.max(self.log_ends.get(&gpu).copied());
                c.done.clear();
            }
            if c != before {
                if let Err(e) = save_cursor(&self.ledger_dir, gpu, &c) {
                    tracing::warn!(gpu, error = %e, "cannot save the eviction log cursor");
                }
                self.cursors.insert(gpu, Ok(c));
            }
        }
    }

    fn finish(&mut self, pod: &PodRef, o: Outcome) {
        *self.counts.entry(o).or_default() += 1;
        self.retries.remove(&pod.uid);
        self.done.insert(pod.uid.clone(), o);
    }

    async fn evict(&mut self, pod: &PodRef, r: &Requested) -> Outcome {
        let mut asked = None;
        let o = match post_eviction(&self.client, pod).await {
            Ok(()) => Outcome::Evicted,
            Err(e) => {
                asked = e.retry_after;
                match e.code {
                    Some(429) => Outcome::Blocked,
                    Some(404) => Outcome::Gone,
                    Some(409) if uid_precondition_failed(&e.message) => Outcome::Replaced,
                    Some(409) => {
                        // The API server also answers 409 when the resourceVersion precondition
                        // it sets itself on a Pending pod's deletion kept failing (the pod
                        // changed meanwhile, after its retries): not final, the pod is still ours.
                        tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), error = %e, "Eviction conflicted with a change of the pod; retrying (the monitor's local signal still applies)");
                        Outcome::Failed
                    }
                    _ => {
                        tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), error = %e, "Eviction failed; retrying (the monitor's local signal still applies)");
                        Outcome::Failed
                    }
                }
            }
        };
        tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, gpu = r.gpu, pid = r.pid, result = o.as_str(), "Eviction API");
        let why = format!(
            "GPU {} on node {}: the xshare monitor evicts offline work (pid {}, signal {})",
            r.gpu, self.node, r.pid, r.signal
        );
        if o.is_final() {
            self.finish(pod, o);
            if o == Outcome::Evicted {
                self.event(
                    pod,
                    kube_contract::EVICTION_EVENT_REASON,
                    &format!("{why}; evicted through the Eviction API"),
                )
                .await;
            }
            return o;
        }
        *self.counts.entry(o).or_default() += 1;
        let first = self.retry_first;
        let rt = self.retries.entry(pod.uid.clone()).or_insert(Retry {
            next: Instant::now(),
            backoff: first,
            blocked_event_sent: false,
        });
        match asked {
            // The server said when: that long (bounded, a bad header must not park a pod).
            Some(d) => rt.next = Instant::now() + d.min(MAX_RETRY_AFTER),
            None => {
                rt.next = Instant::now() + rt.backoff;
                rt.backoff = (rt.backoff * 2).min(Duration::from_secs(60));
            }
        }
        let send_blocked = o == Outcome::Blocked && !rt.blocked_event_sent;
        if send_blocked {
            rt.blocked_event_sent = true;
            self.event(
                pod,
                "XshareEvictionBlocked",
                &format!("{why}; a PodDisruptionBudget refuses the eviction now, retrying"),
            )
            .await;
        }
        o
    }

    async fn event(&self, pod: &PodRef, reason: &str, message: &str) {
        let ev = event_for(pod, &self.node, reason, message);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &pod.namespace);
        if let Err(e) = api.create(&PostParams::default(), &ev).await {
            tracing::warn!(error = %e, reason, "could not record the Event");
        }
    }

    /// Prometheus text of the counters.
    pub fn metrics(&self) -> String {
        let mut o = String::from("# HELP xshare_node_agent_evictions_total Eviction API attempts by result\n# TYPE xshare_node_agent_evictions_total counter\n");
        for r in [
            Outcome::Evicted,
            Outcome::Blocked,
            Outcome::Gone,
            Outcome::Replaced,
            Outcome::Terminating,
            Outcome::Failed,
        ] {
            o.push_str(&format!(
                "xshare_node_agent_evictions_total{{node=\"{}\",result=\"{}\"}} {}\n",
                self.node,
                r.as_str(),
                self.counts.get(&r).unwrap_or(&0)
            ));
        }
        o.push_str("# HELP xshare_node_agent_eviction_log_stalled Whether a GPU's eviction log can no longer be read from the saved cursor (damaged cursor, truncated log, generation lost)\n# TYPE xshare_node_agent_eviction_log_stalled gauge\n");
        for (gpu, c) in &self.cursors {
            o.push_str(&format!(
                "xshare_node_agent_eviction_log_stalled{{node=\"{}\",gpu=\"{gpu}\"}} {}\n",
                self.node,
                u8::from(c.is_err())
            ));
        }
        o.push_str(&format!("# HELP xshare_node_agent_eviction_log_damaged_total Damaged eviction log lines skipped\n# TYPE xshare_node_agent_eviction_log_damaged_total counter\nxshare_node_agent_eviction_log_damaged_total{{node=\"{}\"}} {}\n", self.node, self.log_damaged));
        o.push_str(&format!("# HELP xshare_node_agent_eviction_unmapped_total Eviction requests with no pod found\n# TYPE xshare_node_agent_eviction_unmapped_total counter\nxshare_node_agent_eviction_unmapped_total{{node=\"{}\"}} {}\n", self.node, self.unmapped));
        o.push_str(&format!("# HELP xshare_node_agent_eviction_group_mismatch_total Processes asked to leave whose ledger slot claimed another pod's group than the pod their cgroup names (the claim is ignored)\n# TYPE xshare_node_agent_eviction_group_mismatch_total counter\nxshare_node_agent_eviction_group_mismatch_total{{node=\"{}\"}} {}\n", self.node, self.group_mismatch));
        o.push_str(&format!("# HELP xshare_node_agent_eviction_pod_lists_total Lists of this node's pods sent to map eviction requests (paced, backed off after errors)\n# TYPE xshare_node_agent_eviction_pod_lists_total counter\nxshare_node_agent_eviction_pod_lists_total{{node=\"{}\"}} {}\n", self.node, self.pod_lists));
        o
    }
}

/// The `policy/v1` Eviction for `pod`, guarded by its UID.
pub fn eviction_for(pod: &PodRef) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..Default::default()
        },
        delete_options: Some(DeleteOptions {
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        }),
    }
}

/// Longest wait a server's Retry-After can impose before the next attempt.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// An Eviction the API server refused, or that got no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}{message}", code.map(|c| format!("API server answered {c}: ")).unwrap_or_default())]
pub struct EvictError {
    /// HTTP status, when the server answered.
    pub code: Option<u16>,
    /// When to try again, as the server asked: the `Retry-After` header, else the Status
    /// body's `details.retryAfterSeconds`.
    pub retry_after: Option<Duration>,
    /// The Status message, or the transport error.
    pub message: String,
}

/// The server's wait from a `Retry-After` header (delay-seconds; the API server never sends
/// an HTTP date) or, failing that, a Status body's `details.retryAfterSeconds`.
pub fn retry_after(header: Option<&str>, body: &serde_json::Value) -> Option<Duration> {
    header
        .and_then(|h| h.trim().parse::<u64>().ok())
        .or_else(|| body["details"]["retryAfterSeconds"].as_u64())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// `POST /api/v1/namespaces/{ns}/pods/{name}/eviction`. (kube's `Api::evict` writes the body
/// as `delete_options`, which the API server does not read; the k8s-openapi type writes
/// `deleteOptions` with `apiVersion: policy/v1`.) Sent raw, so the answer's `Retry-After`
/// header can be read (kube's typed calls keep only the Status body).
pub async fn post_eviction(client: &Client, pod: &PodRef) -> Result<(), EvictError> {
    let fail = |message: String| EvictError {
        code: None,
        retry_after: None,
        message,
    };
    let body = serde_json::to_vec(&eviction_for(pod)).map_err(|e| fail(e.to_string()))?;
    let req = kube::core::Request::new(format!("/api/v1/namespaces/{}/pods", pod.namespace))
        .create_subresource("eviction", &pod.name, &PostParams::default(), body)
        .map_err(|e| fail(e.to_string()))?;
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let code = res.status().as_u16();
    let header = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = res
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| fail(format!("reading the answer: {e}")))?;
    if (200..300).contains(&code) {
        return Ok(());
    }
    let status: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    Err(EvictError {
        code: Some(code),
        retry_after: retry_after(header.as_deref(), &status),
        message: status["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned()),
    })
}

/// A core/v1 Event about `pod` from this agent.
pub fn event_for(pod: &PodRef, node: &str, reason: &str, message: &str) -> Event {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", pod.name)),
            namespace: Some(pod.namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        action: Some("Evict".into()),
        source: Some(EventSource {
            component: Some("xshare-node-agent".into()),
            host: Some(node.into()),
        }),
        reporting_component: Some("xshare.io/node-agent".into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failed_uid_precondition_is_a_replaced_pod() {
        // The store's precondition check, and the eviction's own (PodDisruptionConditions).
        assert!(uid_precondition_failed("Precondition failed: UID in precondition: 4444, UID in object meta: 9999"));
        assert!(uid_precondition_failed("Operation cannot be fulfilled on Pod \"train-0\": the UID in the precondition (4444) does not match the UID in record (9999). The object might have been deleted and then recreated"));
        // The resourceVersion precondition the API server sets on a Pending pod's deletion.
        assert!(!uid_precondition_failed("Precondition failed: ResourceVersion in precondition: 41, ResourceVersion in object meta: 42"));
        assert!(!uid_precondition_failed("Operation cannot be fulfilled on Pod \"train-0\": the ResourceVersion in the precondition (41) does not match the ResourceVersion in record (42). The object might have been modified"));
        assert!(!uid_precondition_failed(""));
    }

    #[test]
    fn retry_after_header_wins_over_the_body() {
        let body =
            serde_json::json!({"kind": "Status", "code": 429, "details": {"retryAfterSeconds": 7}});
        assert_eq!(retry_after(Some("3"), &body), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(None, &body), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after(Some("soon"), &body),
            Some(Duration::from_secs(7))
        );
        assert_eq!(retry_after(None, &serde_json::json!({})), None);
        assert_eq!(retry_after(Some("0"), &serde_json::json!({})), None);
    }

    #[test]
    fn eviction_body_is_policy_v1_with_uid_precondition() {
        let p = PodRef {
            namespace: "b".into(),
            name: "p".into(),
            uid: "u-1".into(),
            terminating: false,
        };
        let v = serde_json::to_value(eviction_for(&p)).unwrap();
        assert_eq!(v["apiVersion"], "policy/v1");
        assert_eq!(v["kind"], "Eviction");
        assert_eq!(v["deleteOptions"]["preconditions"]["uid"], "u-1");
        assert_eq!(v["metadata"]["name"], "p");
    }
}
