//! Eviction the cluster can see.
//!
//! sysmonitor decides and acts locally: it records the request in the process's ledger slot
//! (`ProcSlot::evict_signal`, non-zero) and signals the process (SIGTERM, SIGKILL after the
//! grace period). That local signal stays the emergency path. This worker makes the decision
//! visible to Kubernetes: it finds each requested process's pod and posts an `Eviction`
//! (`policy/v1`, `deleteOptions.preconditions.uid`, so a pod re-created under the same name is
//! never hit) and an Event, so the pod's controller re-creates it and the planner re-places it.
//!
//! Process -> pod: the ledger group (`XCUDA_GROUP = k8s-pod-<uid>`, set at Allocate) gives the
//! pod UID from any pid namespace; a process outside such a group but in our pid namespace
//! (hostPID) is mapped by its cgroup path (`.../pod<uid>/...`).
//!
//! Answers: 201 evicted; 429 refused by a PodDisruptionBudget (Event once, retried with
//! backoff); 404 pod gone, 409 UID precondition failed (pod replaced): done, never retried;
//! other errors and timeouts: retried with backoff. A pod is evicted at most once.

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
use node_ledger::ledger::group_id_for;
use node_ledger::Ledger;

use crate::allocate::group_name;

/// An offline process the monitor asked to leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub gpu: u32,
    pub pid: u32,
    pub start_time: u64,
    pub pid_ns: u64,
    pub group_id: u64,
    pub signal: u32,
}

/// The eviction requests in the ledgers of `gpus` (missing or damaged ledgers are skipped:
/// the monitor's own path handles them).
pub fn scan(ledger_dir: &Path, gpus: &[u32]) -> Vec<Requested> {
    let mut out = Vec::new();
    for &gpu in gpus {
        let Ok(l) = Ledger::open_existing(&ledger_path(ledger_dir, gpu)) else {
            continue;
        };
        let slots = &l.layout().procs;
        for p in l.procs() {
            let sig = slots.get(p.slot).map_or(0, |s| {
                s.evict_signal.load(std::sync::atomic::Ordering::Acquire)
            });
            if sig != 0 && p.start_time != 0 {
                out.push(Requested {
                    gpu,
                    pid: p.pid,
                    start_time: p.start_time,
                    pid_ns: p.pid_ns,
                    group_id: p.group_id,
                    signal: sig,
                });
            }
        }
    }
    out
}

/// Pod UID from a `/proc/<pid>/cgroup` text: cgroupfs (`/kubepods/burstable/pod<uid>/<ctr>`)
/// and systemd (`kubepods-burstable-pod<uid_with_underscores>.slice`) drivers.
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        for comp in path.split('/') {
            let Some(i) = comp.rfind("pod") else { continue };
            let rest = comp[i + 3..].trim_end_matches(".slice");
            let uid = rest.replace('_', "-");
            if uid.len() == 36
                && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
                && uid.matches('-').count() == 4
            {
                return Some(uid);
            }
        }
    }
    None
}

/// A pod, as far as eviction needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub terminating: bool,
}

impl PodRef {
    fn of(p: &Pod) -> Option<Self> {
        Some(PodRef {
            namespace: p.metadata.namespace.clone()?,
            name: p.metadata.name.clone()?,
            uid: p.metadata.uid.clone()?,
            terminating: p.metadata.deletion_timestamp.is_some(),
        })
    }
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
    /// Ledger group id -> pod, from the pods bound to this node.
    groups: HashMap<u64, PodRef>,
    by_uid: HashMap<String, PodRef>,
    /// Attempts by outcome (Prometheus `xshare_node_agent_evictions_total{result}`).
    pub counts: BTreeMap<Outcome, u64>,
    /// Requests whose pod could not be found (not a Kubernetes pod, or not ours).
    pub unmapped: u64,
    own_pid_ns: u64,
}

impl Evictor {
    pub fn new(
        client: Client,
        node: &str,
        ledger_dir: &Path,
        gpus: Vec<u32>,
        retry_first: Duration,
    ) -> Self {
        Self {
            client,
            node: node.to_string(),
            ledger_dir: ledger_dir.to_owned(),
            gpus,
            retry_first,
            done: HashMap::new(),
            retries: HashMap::new(),
            groups: HashMap::new(),
            by_uid: HashMap::new(),
            counts: BTreeMap::new(),
            unmapped: 0,
            own_pid_ns: node_ledger::procinfo::own_pid_ns(),
        }
    }

    /// Final outcome for pod `uid`, if it has one.
    pub fn outcome(&self, uid: &str) -> Option<Outcome> {
        self.done.get(uid).copied()
    }

    async fn refresh_pods(&mut self) -> Result<(), kube::Error> {
        let pods = crate::kube::pods_on_node(&self.client, &self.node, None).await?;
        self.groups.clear();
        self.by_uid.clear();
        for p in pods.iter().filter_map(PodRef::of) {
            self.groups
                .insert(group_id_for(&group_name(&p.uid)), p.clone());
            self.by_uid.insert(p.uid.clone(), p);
        }
        Ok(())
    }

    fn resolve(&self, r: &Requested) -> Option<PodRef> {
        if let Some(p) = self.groups.get(&r.group_id) {
            return Some(p.clone());
        }
        if r.pid_ns == self.own_pid_ns && node_ledger::procinfo::is_alive(r.pid, r.start_time) {
            let text = std::fs::read_to_string(format!("/proc/{}/cgroup", r.pid)).ok()?;
            let uid = pod_uid_from_cgroup(&text)?;
            return self.by_uid.get(&uid).cloned();
        }
        None
    }

    /// One pass: read the ledgers' requests, evict their pods. Returns the outcomes of this pass.
    pub async fn tick(&mut self) -> Vec<(PodRef, Outcome)> {
        let reqs = scan(&self.ledger_dir, &self.gpus);
        let mut out = Vec::new();
        if reqs.is_empty() {
            return out;
        }
        let unknown = reqs.iter().any(|r| !self.groups.contains_key(&r.group_id));
        if unknown || self.groups.is_empty() {
            if let Err(e) = self.refresh_pods().await {
                tracing::warn!(error = %e, "listing pods on this node failed; the monitor's local signal still applies");
            }
        }
        let mut seen = std::collections::HashSet::new();
        for r in &reqs {
            let Some(pod) = self.resolve(r) else {
                self.unmapped += 1;
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
        out
    }

    fn finish(&mut self, pod: &PodRef, o: Outcome) {
        *self.counts.entry(o).or_default() += 1;
        self.retries.remove(&pod.uid);
        self.done.insert(pod.uid.clone(), o);
    }

    async fn evict(&mut self, pod: &PodRef, r: &Requested) -> Outcome {
        let o = match post_eviction(&self.client, pod).await {
            Ok(()) => Outcome::Evicted,
            Err(kube::Error::Api(s)) if s.code == 429 => Outcome::Blocked,
            Err(kube::Error::Api(s)) if s.code == 404 => Outcome::Gone,
            Err(kube::Error::Api(s)) if s.code == 409 => Outcome::Replaced,
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), error = %e, "Eviction failed; retrying (the monitor's local signal still applies)");
                Outcome::Failed
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
        rt.next = Instant::now() + rt.backoff;
        rt.backoff = (rt.backoff * 2).min(Duration::from_secs(60));
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
        o.push_str(&format!("# HELP xshare_node_agent_eviction_unmapped_total Eviction requests with no pod found\n# TYPE xshare_node_agent_eviction_unmapped_total counter\nxshare_node_agent_eviction_unmapped_total{{node=\"{}\"}} {}\n", self.node, self.unmapped));
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

/// `POST /api/v1/namespaces/{ns}/pods/{name}/eviction`. (kube's `Api::evict` writes the body
/// as `delete_options`, which the API server does not read; the k8s-openapi type writes
/// `deleteOptions` with `apiVersion: policy/v1`.)
pub async fn post_eviction(client: &Client, pod: &PodRef) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let _: serde_json::Value = api
        .create_subresource(
            "eviction",
            &pod.name,
            &PostParams::default(),
            &eviction_for(pod),
        )
        .await?;
    Ok(())
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
    fn cgroup_paths_of_both_drivers() {
        let sd = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-abc.scope\n";
        assert_eq!(
            pod_uid_from_cgroup(sd).as_deref(),
            Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b")
        );
        let fs = "12:memory:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/0123abcd\n";
        assert_eq!(
            pod_uid_from_cgroup(fs).as_deref(),
            Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(
            pod_uid_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n"),
            None
        );
        assert_eq!(pod_uid_from_cgroup("0::/kubepods/podnotauid/x\n"), None);
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
