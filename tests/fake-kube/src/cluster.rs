//! A stateful fake API server: the objects live here, every change gets the next
//! resourceVersion and reaches the watches whose selectors it concerns.
//!
//! Graceful deletion as the API server and the kubelet do it: an Eviction (or a deletion) of a
//! pod bound to a node marks it Terminating (`metadata.deletionTimestamp` = now + grace,
//! `metadata.deletionGracePeriodSeconds` = grace: the request's `gracePeriodSeconds`, else the
//! pod's `spec.terminationGracePeriodSeconds`, else 30) and the pod stays listed until the
//! kubelet confirms its containers stopped ([`FakeCluster::kubelet_confirm_stopped`]) or the
//! grace runs out (the kubelet kills them then). One grace second lasts
//! [`FakeCluster::set_grace_second`] of real time (1 s by default; tests shorten it). A pod not
//! bound to a node, or already Succeeded/Failed, is deleted at once. Evicting a pod already
//! Terminating changes nothing and answers 201, as the API server does. The Job controller
//! follows the default `podReplacementPolicy: TerminatingOrFailed`: a Job's pod is replaced as
//! soon as it is Terminating (or deleted), once. A later deletion (or eviction) of a
//! Terminating pod with a shorter `gracePeriodSeconds` shortens its grace, counted from the
//! first deletion; 0 deletes it at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::objects::{list, status, success};
use crate::server::{fake_api, Answer, FakeApi, Req};

/// Annotations a scheduler writes onto a pod: a Job's new pod comes from the Job's template,
/// without them.
const JOB_LABELS: [&str; 2] = ["batch.kubernetes.io/job-name", "job-name"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pod,
    Node,
    Event,
}

struct Watcher {
    kind: Kind,
    namespace: Option<String>,
    labels: String,
    fields: String,
    tx: Sender<Value>,
}

struct Change {
    kind: Kind,
    rv: u64,
    old: Option<Value>,
    new: Option<Value>,
}

#[derive(Default)]
struct State {
    rv: u64,
    uids: u64,
    pods: BTreeMap<(String, String), Value>,
    nodes: BTreeMap<String, Value>,
    /// Job (namespace, name) -> the pod template its controller creates pods from.
    jobs: BTreeMap<(String, String), Value>,
    history: Vec<Change>,
    watchers: Vec<Watcher>,
    events: Vec<Value>,
    evictions: Vec<Value>,
    bindings: Vec<Value>,
    /// Terminating pods (namespace, name, uid) -> when their graceful deletion began and when
    /// the kubelet kills them (grace over).
    terminating: BTreeMap<(String, String, String), Termination>,
    /// Real time one grace second lasts.
    grace_second: Duration,
    /// UIDs of the Job pods already replaced by the Job controller.
    replaced: BTreeSet<String>,
}

/// A pod's graceful deletion in progress.
#[derive(Debug, Clone, Copy)]
struct Termination {
    /// When the first deletion request came (real time, for the grace clock).
    since: Instant,
    /// The same moment as Unix seconds (for `deletionTimestamp`).
    since_unix: i64,
    /// When the kubelet kills the pod: `since` + grace.
    until: Instant,
}

/// Grace period of a pod without `spec.terminationGracePeriodSeconds` (the API default).
pub const DEFAULT_GRACE_SECONDS: u64 = 30;

/// The fake cluster: its API server on loopback and the objects it holds.
pub struct FakeCluster {
    /// The HTTP side (every request recorded).
    pub api: FakeApi,
    state: Arc<Mutex<State>>,
}

fn now_rfc3339() -> String {
    rfc3339_at(now_unix())
}

/// Seconds since the Unix epoch, now.
fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// The wall-clock time `s` (Unix seconds), RFC 3339 (seconds, UTC).
fn rfc3339_at(s: i64) -> String {
    let (days, rem) = (s.div_euclid(86_400), s.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Splits a selector on the commas outside parentheses.
fn terms(sel: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in sel.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Whether `labels` match a label selector (`k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (..)`,
/// `k notin (..)`).
pub fn labels_match(labels: &Value, sel: &str) -> bool {
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    terms(sel).iter().all(|t| {
        let set = |rest: &str| -> Vec<String> {
            rest.trim()
                .trim_start_matches('(')
                .trim_end_matches(')')
                .split(',')
                .map(|v| v.trim().to_string())
                .collect()
        };
        if let Some((k, rest)) = t.split_once(" notin ") {
            return get(k.trim()).is_none_or(|v| !set(rest).iter().any(|s| s == v));
        }
        if let Some((k, rest)) = t.split_once(" in ") {
            return get(k.trim()).is_some_and(|v| set(rest).iter().any(|s| s == v));
        }
        if let Some((k, v)) = t.split_once("!=") {
            return get(k.trim()) != Some(v.trim());
        }
        if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            return get(k.trim()) == Some(v.trim());
        }
        if let Some(k) = t.strip_prefix('!') {
            return get(k.trim()).is_none();
        }
        get(t).is_some()
    })
}

/// Whether `obj` matches a field selector (`a.b=v`, `a.b==v`, `a.b!=v`).
pub fn fields_match(obj: &Value, sel: &str) -> bool {
    terms(sel).iter().all(|t| {
        let (path, want, eq) = match t.split_once("!=") {
            Some((p, v)) => (p, v, false),
            None => match t.split_once("==").or_else(|| t.split_once('=')) {
                Some((p, v)) => (p, v, true),
                None => return false,
            },
        };
        let mut cur = obj;
        for part in path.trim().split('.') {
            cur = cur.get(part).unwrap_or(&Value::Null);
        }
        let got = cur.as_str().unwrap_or("");
        (got == want.trim()) == eq
    })
}

impl Watcher {
    fn sees(&self, obj: &Value) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|ns| {
            obj["metadata"]["namespace"].as_str() == Some(ns)
        });
        ns_ok
            && labels_match(&obj["metadata"]["labels"], &self.labels)
            && fields_match(&selectable(self.kind, obj), &self.fields)
    }

    /// The event this watch gets for a change (objects entering or leaving the selector are
    /// ADDED or DELETED for it, as the API server's watch cache does).
    fn event(&self, c: &Change) -> Option<Value> {
        if c.kind != self.kind {
            return None;
        }
        let old = c.old.as_ref().filter(|o| self.sees(o));
        let new = c.new.as_ref().filter(|n| self.sees(n));
        let (t, o) = match (old, new, &c.new) {
            (Some(_), Some(n), _) => ("MODIFIED", n.clone()),
            (None, Some(n), _) => ("ADDED", n.clone()),
            (Some(o), None, Some(n)) => {
                let _ = o;
                ("DELETED", n.clone())
            }
            (Some(o), None, None) => ("DELETED", o.clone()),
            (None, None, _) => return None,
        };
        Some(json!({"type": t, "object": typed(self.kind, o)}))
    }
}

/// `obj` as field selectors see it: an Event's `source` is its `source.component` (else its
/// `reportingComponent`), as the API server's event strategy selects it; other fields as stored.
fn selectable(kind: Kind, obj: &Value) -> std::borrow::Cow<'_, Value> {
    if kind != Kind::Event {
        return std::borrow::Cow::Borrowed(obj);
    }
    let mut o = obj.clone();
    let source = obj["source"]["component"].as_str().filter(|c| !c.is_empty()).or(obj["reportingComponent"].as_str()).unwrap_or("");
    o["source"] = source.into();
    std::borrow::Cow::Owned(o)
}

fn typed(kind: Kind, mut o: Value) -> Value {
    let k = match kind {
        Kind::Pod => "Pod",
        Kind::Node => "Node",
        Kind::Event => "Event",
    };
    o["kind"] = k.into();
    o["apiVersion"] = "v1".into();
    o
}

impl State {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("0f1e2d3c-0000-4000-8000-{:012x}", self.uids)
    }

    /// Records a change (stamping the new object's resourceVersion) and tells the watches.
    fn change(&mut self, kind: Kind, old: Option<Value>, new: Option<&mut Value>) {
        let rv = self.next_rv();
        let new = new.map(|n| {
            n["metadata"]["resourceVersion"] = rv.to_string().into();
            n.clone()
        });
        let c = Change { kind, rv, old, new };
        self.watchers
            .retain(|w| w.event(&c).is_none_or(|e| w.tx.send(e).is_ok()));
        self.history.push(c);
    }

    /// Stores a new Event (named `<generateName or "ev.">`+hex when unnamed), told to the
    /// watches of events; returns it as stored.
    fn put_event(&mut self, mut e: Value) -> Value {
        if e["metadata"]["name"].as_str().is_none() {
            let g = e["metadata"]["generateName"].as_str().unwrap_or("ev.").to_string();
            e["metadata"]["name"] = format!("{g}{:x}", self.rv + 1).into();
        }
        self.change(Kind::Event, None, Some(&mut e));
        self.events.push(e.clone());
        e
    }

    fn put_pod(&mut self, mut pod: Value) -> Value {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        pod["metadata"]["namespace"] = ns.clone().into();
        let name = pod["metadata"]["name"].as_str().expect("pod name").to_string();
        if pod["metadata"]["uid"].as_str().is_none() {
            pod["metadata"]["uid"] = self.next_uid().into();
        }
        if pod["metadata"]["creationTimestamp"].as_str().is_none() {
            pod["metadata"]["creationTimestamp"] = now_rfc3339().into();
        }
        let labels = &pod["metadata"]["labels"];
        if let Some(job) = JOB_LABELS.iter().find_map(|k| labels.get(*k).and_then(Value::as_str)) {
            self.jobs
                .entry((ns.clone(), job.to_string()))
                .or_insert_with(|| pod.clone());
        }
        let old = self.pods.get(&(ns.clone(), name.clone())).cloned();
        self.change(Kind::Pod, old, Some(&mut pod));
        self.pods.insert((ns, name), pod.clone());
        pod
    }

    fn delete_pod(&mut self, ns: &str, name: &str) -> Option<Value> {
        let old = self.pods.remove(&(ns.to_string(), name.to_string()))?;
        let mut gone = old.clone();
        self.change(Kind::Pod, Some(old), None);
        gone["metadata"]["resourceVersion"] = self.rv.to_string().into();
        Some(gone)
    }

    /// Graceful deletion of the pod at `key` (see the module docs): deleted at once when not
    /// bound or already finished, else marked Terminating. Already Terminating: see
    /// [`State::shorten_grace`].
    fn delete_gracefully(&mut self, key: &(String, String), grace: Option<u64>, conditions: Option<Value>) {
        let Some(mut pod) = self.pods.get(key).cloned() else {
            return;
        };
        if pod["metadata"]["deletionTimestamp"].is_string() {
            self.shorten_grace(key, pod, grace);
            return;
        }
        let bound = pod["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty());
        let finished = matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
        let grace = grace.unwrap_or_else(|| {
            pod["spec"]["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(DEFAULT_GRACE_SECONDS)
        });
        let old = pod.clone();
        if let Some(c) = conditions {
            let mut conds = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
            conds.push(c);
            pod["status"]["conditions"] = conds.into();
        }
        if !bound || finished || grace == 0 {
            // No kubelet to wait for (or nothing left to stop): gone at once.
            if pod != old {
                self.change(Kind::Pod, Some(old), Some(&mut pod));
                self.pods.insert(key.clone(), pod);
            }
            if let Some(gone) = self.delete_pod(&key.0, &key.1) {
                self.replace_job_pod(&gone);
            }
            return;
        }
        let (since, since_unix) = (Instant::now(), now_unix());
        pod["metadata"]["deletionTimestamp"] = rfc3339_at(since_unix + grace as i64).into();
        pod["metadata"]["deletionGracePeriodSeconds"] = grace.into();
        self.change(Kind::Pod, Some(old), Some(&mut pod));
        self.pods.insert(key.clone(), pod.clone());
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let until = since + self.grace_second.saturating_mul(grace as u32);
        let t = Termination { since, since_unix, until };
        self.terminating.insert((key.0.clone(), key.1.clone(), uid), t);
        // TerminatingOrFailed: the replacement starts now, beside the terminating pod.
        self.replace_job_pod(&pod);
    }

    /// A deletion of a pod already Terminating, as the API server's `BeforeDelete` treats it:
    /// only a shorter `grace` than the pod's `deletionGracePeriodSeconds` changes anything;
    /// the grace then counts from the first deletion (`deletionTimestamp` moves to that moment
    /// plus `grace`), and a grace of 0 deletes the pod at once. No grace, or a longer one: the
    /// pending graceful deletion stands.
    fn shorten_grace(&mut self, key: &(String, String), mut pod: Value, grace: Option<u64>) {
        let current = pod["metadata"]["deletionGracePeriodSeconds"].as_u64().unwrap_or(0);
        let Some(grace) = grace.filter(|&g| g < current) else {
            return;
        };
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let tkey = (key.0.clone(), key.1.clone(), uid.clone());
        let Some(t) = self.terminating.get(&tkey).copied() else {
            return;
        };
        let old = pod.clone();
        pod["metadata"]["deletionTimestamp"] = rfc3339_at(t.since_unix + grace as i64).into();
        pod["metadata"]["deletionGracePeriodSeconds"] = grace.into();
        self.change(Kind::Pod, Some(old), Some(&mut pod));
        self.pods.insert(key.clone(), pod);
        if grace == 0 {
            self.finish_termination(&key.0, &key.1, &uid);
            return;
        }
        let until = t.since + self.grace_second.saturating_mul(grace as u32);
        self.terminating.insert(tkey, Termination { until, ..t });
    }

    /// The kubelet's final delete of a Terminating pod (its containers stopped or killed).
    fn finish_termination(&mut self, ns: &str, name: &str, uid: &str) -> bool {
        self.terminating
            .remove(&(ns.to_string(), name.to_string(), uid.to_string()));
        let key = (ns.to_string(), name.to_string());
        let same = self.pods.get(&key).is_some_and(|p| {
            p["metadata"]["uid"].as_str() == Some(uid) && p["metadata"]["deletionTimestamp"].is_string()
        });
        if same {
            if let Some(gone) = self.delete_pod(ns, name) {
                self.replace_job_pod(&gone);
            }
        }
        same
    }

    /// Removes the Terminating pods whose grace is over.
    fn expire_graces(&mut self) {
        let now = Instant::now();
        let due: Vec<_> = self
            .terminating
            .iter()
            .filter(|(_, t)| t.until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for (ns, name, uid) in due {
            self.finish_termination(&ns, &name, &uid);
        }
    }

    /// The Job controller: a Job pod that is Terminating or deleted is replaced (once) by a new
    /// pod from the Job's template.
    fn replace_job_pod(&mut self, deleted: &Value) {
        let uid = deleted["metadata"]["uid"].as_str().unwrap_or("").to_string();
        if self.replaced.contains(&uid) {
            return;
        }
        let labels = &deleted["metadata"]["labels"];
        let Some(job) = JOB_LABELS.iter().find_map(|k| labels.get(*k).and_then(Value::as_str)) else {
            return;
        };
        let ns = deleted["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        let Some(mut p) = self.jobs.get(&(ns, job.to_string())).cloned() else {
            return;
        };
        self.replaced.insert(uid);
        let n = self.uids + 1;
        let suffix: String = format!("{:05x}", n * 7919 % 0xfffff)
            .chars()
            .map(|c| if c.is_ascii_digit() { (b'a' + (c as u8 - b'0')) as char } else { c })
            .collect();
        let m = &mut p["metadata"];
        m["name"] = format!("{job}-{suffix}").into();
        m["generateName"] = format!("{job}-").into();
        m.as_object_mut().unwrap().remove("uid");
        m.as_object_mut().unwrap().remove("creationTimestamp");
        m.as_object_mut().unwrap().remove("deletionTimestamp");
        m.as_object_mut().unwrap().remove("deletionGracePeriodSeconds");
        if let Some(s) = p["spec"].as_object_mut() {
            s.remove("nodeName");
        }
        p["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        self.put_pod(p);
    }
}

fn path_parts(path: &str) -> Vec<&str> {
    path.trim_matches('/').split('/').collect()
}

fn not_found(what: &str) -> Answer {
    Answer::Json(404, status(404, "NotFound", &format!("{what} not found"), json!({})), vec![])
}

fn conflict(msg: &str) -> Answer {
    Answer::Json(409, status(409, "Conflict", msg, json!({})), vec![])
}

fn bad(msg: &str) -> Answer {
    Answer::Json(400, status(400, "BadRequest", msg, json!({})), vec![])
}

impl FakeCluster {
    /// Starts an empty cluster.
    pub fn start() -> FakeCluster {
        let state: Arc<Mutex<State>> = Arc::default();
        {
            let mut st = state.lock().unwrap();
            // Versions start high, as on a long-lived cluster.
            st.rv = 41_000;
            st.grace_second = Duration::from_secs(1);
        }
        let s = state.clone();
        let api = fake_api(move |r, _| answer(&s, r));
        // The kubelet's side of graceful deletion: kill (delete) once the grace is over.
        let weak = Arc::downgrade(&state);
        std::thread::spawn(move || {
            while let Some(st) = weak.upgrade() {
                st.lock().unwrap().expire_graces();
                drop(st);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        FakeCluster { api, state }
    }

    /// How long one second of a pod's grace period lasts here (tests shorten it so a
    /// Terminating pod goes within their time; 1 s by default). Applies to later deletions.
    pub fn set_grace_second(&self, d: Duration) {
        self.state.lock().unwrap().grace_second = d;
    }

    /// The kubelet reports the Terminating pod `ns/name` (UID `uid`) stopped: it is deleted now.
    /// Returns whether such a pod was Terminating.
    pub fn kubelet_confirm_stopped(&self, ns: &str, name: &str, uid: &str) -> bool {
        self.state.lock().unwrap().finish_termination(ns, name, uid)
    }

    /// Deletes pod `ns/name` as `kubectl delete pod` does (graceful; `grace`: the request's
    /// `gracePeriodSeconds`, else the pod's).
    pub fn delete_pod(&self, ns: &str, name: &str, grace: Option<u64>) {
        self.state
            .lock()
            .unwrap()
            .delete_gracefully(&(ns.to_string(), name.to_string()), grace, None);
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        self.api.url.clone()
    }

    /// Creates (or replaces) a pod as its controller would; returns it as stored.
    pub fn add_pod(&self, pod: Value) -> Value {
        self.state.lock().unwrap().put_pod(pod)
    }

    /// Creates (or replaces) a node.
    pub fn add_node(&self, mut node: Value) {
        let mut st = self.state.lock().unwrap();
        let name = node["metadata"]["name"].as_str().expect("node name").to_string();
        if node["metadata"]["uid"].as_str().is_none() {
            node["metadata"]["uid"] = st.next_uid().into();
        }
        let old = st.nodes.get(&name).cloned();
        st.change(Kind::Node, old, Some(&mut node));
        st.nodes.insert(name, node);
    }

    /// The pod `ns/name` now.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .unwrap()
            .pods
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Every pod now.
    pub fn pods(&self) -> Vec<Value> {
        self.state.lock().unwrap().pods.values().cloned().collect()
    }

    /// The node `name` now.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.state.lock().unwrap().nodes.get(name).cloned()
    }

    /// What the kubelet reports once the pod's containers started (`Running`) or ended.
    pub fn set_pod_phase(&self, ns: &str, name: &str, phase: &str) {
        let mut st = self.state.lock().unwrap();
        let Some(mut p) = st.pods.get(&(ns.to_string(), name.to_string())).cloned() else {
            panic!("no pod {ns}/{name}");
        };
        let old = p.clone();
        p["status"]["phase"] = phase.into();
        if phase == "Running" {
            p["status"]["startTime"] = now_rfc3339().into();
        }
        st.change(Kind::Pod, Some(old), Some(&mut p));
        st.pods.insert((ns.to_string(), name.to_string()), p);
    }

    /// The kubelet of the pod's node evicts pod `ns/name` for node pressure or a storage limit,
    /// as its eviction manager does before it kills: a Warning Event, reason `Evicted`, from
    /// source `kubelet` on that host, with `message`, dated now (to the second). The pod's status
    /// does not change yet: the kubelet's status manager holds the terminal phase, its reason and
    /// the `DisruptionTarget` condition back until every container ended
    /// ([`FakeCluster::kubelet_evicted_pod_stopped`]).
    pub fn kubelet_evict(&self, ns: &str, name: &str, message: &str) {
        let mut st = self.state.lock().unwrap();
        let Some(p) = st.pods.get(&(ns.to_string(), name.to_string())).cloned() else {
            panic!("no pod {ns}/{name}");
        };
        let host = p["spec"]["nodeName"].as_str().expect("the pod is bound").to_string();
        let now = now_rfc3339();
        let e = serde_json::json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{name}.{:x}", now_unix()), "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "uid": p["metadata"]["uid"], "apiVersion": "v1",
                "resourceVersion": p["metadata"]["resourceVersion"]},
            "reason": "Evicted", "message": message, "source": {"component": "kubelet", "host": host},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1, "type": "Warning", "eventTime": null,
            "reportingComponent": "kubelet", "reportingInstance": host});
        st.put_event(e);
    }

    /// The kubelet reports pod `ns/name`, evicted ([`FakeCluster::kubelet_evict`]), stopped: its
    /// containers terminated, then, in the same update, phase `Failed`, reason `Evicted`, the
    /// eviction's `message` and the `DisruptionTarget` condition (reason `TerminationByKubelet`).
    pub fn kubelet_evicted_pod_stopped(&self, ns: &str, name: &str, message: &str) {
        let mut st = self.state.lock().unwrap();
        let Some(mut p) = st.pods.get(&(ns.to_string(), name.to_string())).cloned() else {
            panic!("no pod {ns}/{name}");
        };
        let old = p.clone();
        let now = now_rfc3339();
        p["status"]["phase"] = "Failed".into();
        p["status"]["reason"] = "Evicted".into();
        p["status"]["message"] = message.into();
        let condition = serde_json::json!({"type": "DisruptionTarget", "status": "True", "lastProbeTime": null,
            "lastTransitionTime": now, "reason": "TerminationByKubelet", "message": message});
        match p["status"]["conditions"].as_array_mut() {
            Some(c) => c.push(condition),
            None => p["status"]["conditions"] = serde_json::json!([condition]),
        }
        let containers: Vec<Value> = p["spec"]["containers"].as_array().into_iter().flatten().map(|c| serde_json::json!({
            "name": c["name"], "ready": false, "restartCount": 0, "image": c["image"], "imageID": "",
            "state": {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now}}})).collect();
        p["status"]["containerStatuses"] = containers.into();
        st.change(Kind::Pod, Some(old), Some(&mut p));
        st.pods.insert((ns.to_string(), name.to_string()), p);
    }

    /// The Eviction bodies accepted (201), in order.
    pub fn evictions(&self) -> Vec<Value> {
        self.state.lock().unwrap().evictions.clone()
    }

    /// The Binding bodies accepted (201), in order.
    pub fn bindings(&self) -> Vec<Value> {
        self.state.lock().unwrap().bindings.clone()
    }

    /// The Events created, in order.
    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().events.clone()
    }
}

fn answer(state: &Mutex<State>, r: &Req) -> Answer {
    let p = path_parts(&r.path);
    let mut st = state.lock().unwrap();
    match (r.method.as_str(), p.as_slice()) {
        ("GET", ["api", "v1", "pods"]) => list_or_watch(&mut st, Kind::Pod, None, r),
        ("GET", ["api", "v1", "namespaces", ns, "pods"]) => {
            list_or_watch(&mut st, Kind::Pod, Some(ns.to_string()), r)
        }
        ("GET", ["api", "v1", "nodes"]) => list_or_watch(&mut st, Kind::Node, None, r),
        ("GET", ["api", "v1", "events"]) => list_or_watch(&mut st, Kind::Event, None, r),
        ("GET", ["api", "v1", "namespaces", ns, "events"]) => {
            list_or_watch(&mut st, Kind::Event, Some(ns.to_string()), r)
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match st.pods.get(&(ns.to_string(), name.to_string())) {
                Some(pod) => Answer::Json(200, typed(Kind::Pod, pod.clone()), vec![]),
                None => not_found(&format!("pods \"{name}\"")),
            }
        }
        ("GET", ["api", "v1", "nodes", name]) => match st.nodes.get(*name) {
            Some(n) => Answer::Json(200, typed(Kind::Node, n.clone()), vec![]),
            None => not_found(&format!("nodes \"{name}\"")),
        },
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
            if let Some(a) = merge_only(r) {
                return a;
            }
            let key = (ns.to_string(), name.to_string());
            let Some(mut pod) = st.pods.get(&key).cloned() else {
                return not_found(&format!("pods \"{name}\""));
            };
            let patch = r.json();
            // A resourceVersion in a merge patch is a precondition (409, checked first); a uid
            // is not, but the UID is immutable: a patch changing it is invalid (422), as the
            // API server's validation answers (`objects::uid_immutable`).
            if let Some(a) = stale_version("pods", name, &pod, &patch) {
                return a;
            }
            if let Some(uid) = patch["metadata"]["uid"].as_str() {
                if Some(uid) != pod["metadata"]["uid"].as_str() {
                    return Answer::Json(422, crate::objects::uid_immutable("Pod", name, uid), vec![]);
                }
            }
            let old = pod.clone();
            merge_patch(&mut pod, &patch);
            st.change(Kind::Pod, Some(old), Some(&mut pod));
            st.pods.insert(key, pod.clone());
            Answer::Json(200, typed(Kind::Pod, pod), vec![])
        }
        ("PATCH", ["api", "v1", "nodes", name]) => {
            if let Some(a) = merge_only(r) {
                return a;
            }
            let Some(mut node) = st.nodes.get(*name).cloned() else {
                return not_found(&format!("nodes \"{name}\""));
            };
            let patch = r.json();
            if let Some(a) = stale_version("nodes", name, &node, &patch) {
                return a;
            }
            let old = node.clone();
            merge_patch(&mut node, &patch);
            st.change(Kind::Node, Some(old), Some(&mut node));
            st.nodes.insert(name.to_string(), node.clone());
            Answer::Json(200, typed(Kind::Node, node), vec![])
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods", name, "binding"]) => {
            let b = r.json();
            if b["kind"] != "Binding" || b["apiVersion"] != "v1" {
                return bad("a v1 Binding is expected");
            }
            let target = b["target"]["name"].as_str().unwrap_or("");
            if b["target"]["kind"] != "Node" || target.is_empty() {
                return bad("Binding.target must name a Node");
            }
            // The API server's BindingREST.Create and assignPod, in their order.
            if b["metadata"]["name"].as_str() != Some(name) {
                return bad("name in URL does not match name in Binding object");
            }
            let key = (ns.to_string(), name.to_string());
            let Some(mut pod) = st.pods.get(&key).cloned() else {
                return not_found(&format!("pods \"{name}\""));
            };
            if let Some(uid) = b["metadata"]["uid"].as_str() {
                if Some(uid) != pod["metadata"]["uid"].as_str() {
                    return conflict(&format!(
                        "Operation cannot be fulfilled on pods/binding \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        pod["metadata"]["uid"].as_str().unwrap_or("")
                    ));
                }
            }
            if !pod["metadata"]["deletionTimestamp"].is_null() {
                return conflict(&format!(
                    "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is being deleted, cannot be assigned to a host"
                ));
            }
            if let Some(n) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
                return conflict(&format!(
                    "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{n}\""
                ));
            }
            let old = pod.clone();
            pod["spec"]["nodeName"] = target.into();
            pod["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True",
                "lastProbeTime": null, "lastTransitionTime": now_rfc3339()}]);
            st.change(Kind::Pod, Some(old), Some(&mut pod));
            st.pods.insert(key, pod);
            st.bindings.push(b);
            Answer::Json(201, success(201), vec![])
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods", name, "eviction"]) => {
            let e = r.json();
            if e["kind"] != "Eviction" || e["apiVersion"] != "policy/v1" {
                return bad("a policy/v1 Eviction is expected");
            }
            if e["metadata"]["name"].as_str() != Some(name) {
                return bad("name in URL does not match name in Eviction object");
            }
            let key = (ns.to_string(), name.to_string());
            let Some(pod) = st.pods.get(&key).cloned() else {
                return not_found(&format!("pods \"{name}\""));
            };
            let have = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
            if let Some(uid) = e["deleteOptions"]["preconditions"]["uid"].as_str() {
                if uid != have {
                    return conflict(&format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                    ));
                }
            }
            // As the API server does: a pod already Terminating is deleted again (no change);
            // else the DisruptionTarget condition and a graceful deletion (see the module docs).
            let terminating = pod["metadata"]["deletionTimestamp"].is_string();
            let cond = (!terminating).then(|| {
                json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting", "lastProbeTime": null, "lastTransitionTime": now_rfc3339()})
            });
            let grace = e["deleteOptions"]["gracePeriodSeconds"].as_u64();
            st.delete_gracefully(&key, grace, cond);
            st.evictions.push(e);
            Answer::Json(201, success(201), vec![])
        }
        ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
            // DeleteOptions in the body (kubectl, client-go) or `gracePeriodSeconds` in the query.
            let d = r.json();
            let key = (ns.to_string(), name.to_string());
            let Some(pod) = st.pods.get(&key).cloned() else {
                return not_found(&format!("pods \"{name}\""));
            };
            let have = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
            if let Some(uid) = d["preconditions"]["uid"].as_str() {
                if uid != have {
                    return conflict(&format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                    ));
                }
            }
            let grace = d["gracePeriodSeconds"]
                .as_u64()
                .or_else(|| r.query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()));
            st.delete_gracefully(&key, grace, None);
            // The pod as it is now: Terminating, or (deleted at once) as it was last.
            let now = st.pods.get(&key).cloned().unwrap_or(pod);
            Answer::Json(200, typed(Kind::Pod, now), vec![])
        }
        ("POST", ["api", "v1", "namespaces", ns, "events"]) => {
            let mut e = r.json();
            if e["kind"] != "Event" || e["involvedObject"]["name"].as_str().is_none() {
                return bad("a v1 Event with an involvedObject is expected");
            }
            e["metadata"]["namespace"] = ns.to_string().into();
            Answer::Json(201, st.put_event(e), vec![])
        }
        _ => not_found(&format!("{} {}", r.method, r.path)),
    }
}

/// A `metadata.resourceVersion` in a patch is a precondition, as the API server applies it:
/// the patched object keeps the given version, and the update is refused with `409 Conflict`
/// when the stored object has another.
fn stale_version(resource: &str, name: &str, obj: &Value, patch: &Value) -> Option<Answer> {
    let want = patch["metadata"]["resourceVersion"].as_str()?;
    (Some(want) != obj["metadata"]["resourceVersion"].as_str()).then(|| {
        conflict(&format!(
            "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        ))
    })
}

/// PATCH must be a JSON merge patch here (what both clients send).
fn merge_only(r: &Req) -> Option<Answer> {
    let ct = r.headers.get("content-type").map_or("", String::as_str);
    (ct != "application/merge-patch+json").then(|| {
        Answer::Json(
            415,
            status(415, "UnsupportedMediaType", &format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json (got `{ct}`)"), json!({})),
            vec![],
        )
    })
}

fn list_or_watch(st: &mut State, kind: Kind, namespace: Option<String>, r: &Req) -> Answer {
    let w = Watcher {
        kind,
        namespace,
        labels: r.query.get("labelSelector").cloned().unwrap_or_default(),
        fields: r.query.get("fieldSelector").cloned().unwrap_or_default(),
        tx: channel().0,
    };
    let objects: Vec<Value> = match kind {
        Kind::Pod => st.pods.values().cloned().collect(),
        Kind::Node => st.nodes.values().cloned().collect(),
        Kind::Event => st.events.clone(),
    };
    if !r.is_watch() {
        let items: Vec<Value> = objects.into_iter().filter(|o| w.sees(o)).collect();
        let k = match kind {
            Kind::Pod => "PodList",
            Kind::Node => "NodeList",
            Kind::Event => "EventList",
        };
        return Answer::Json(200, list(k, &st.rv.to_string(), items), vec![]);
    }
    let (tx, rx) = channel();
    match r.rv() {
        // No version: the current objects as ADDED, then changes.
        "" | "0" => {
            for o in objects.into_iter().filter(|o| w.sees(o)) {
                let _ = tx.send(json!({"type": "ADDED", "object": typed(kind, o)}));
            }
        }
        rv => {
            let Ok(from) = rv.parse::<u64>() else {
                return bad(&format!("invalid resourceVersion `{rv}`"));
            };
            for c in st.history.iter().filter(|c| c.rv > from) {
                if let Some(e) = w.event(c) {
                    let _ = tx.send(e);
                }
            }
        }
    }
    st.watchers.push(Watcher { tx, ..w });
    Answer::Live(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let l = json!({"xshare.io/role": "offline", "job-name": "train"});
        assert!(labels_match(&l, "xshare.io/role in (online,offline)"));
        assert!(labels_match(&l, "xshare.io/role in (online, offline),job-name=train"));
        assert!(!labels_match(&l, "xshare.io/role in (online)"));
        assert!(labels_match(&l, "job-name,!other"));
        assert!(!labels_match(&l, "job-name!=train"));
        let p = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}});
        assert!(fields_match(&p, "spec.nodeName=n1,status.phase=Pending"));
        assert!(!fields_match(&p, "spec.nodeName=n2"));
        assert!(fields_match(&json!({}), "spec.nodeName="));
    }

    /// An Event's `source` selects on its component, as the API server's event strategy does.
    #[test]
    fn event_source_selects_on_its_component() {
        let e = json!({"reason": "Evicted", "source": {"component": "kubelet", "host": "n1"}, "involvedObject": {"kind": "Pod"}});
        let sel = "involvedObject.kind=Pod,reason=Evicted,source=kubelet";
        assert!(fields_match(&selectable(Kind::Event, &e), sel));
        assert!(!fields_match(&e, sel), "stored, `source` is an object");
        let reported = json!({"reason": "Evicted", "reportingComponent": "kubelet", "involvedObject": {"kind": "Pod"}});
        assert!(fields_match(&selectable(Kind::Event, &reported), sel));
        assert!(!fields_match(&selectable(Kind::Event, &e), "source=default-scheduler"));
    }

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge_patch(&mut t, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(t, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }

    fn req(method: &str, path: &str, body: Value, query: &[(&str, &str)]) -> Req {
        Req {
            method: method.into(),
            path: path.into(),
            body: serde_json::to_vec(&body).unwrap(),
            query: query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            raw_query: String::new(),
            headers: BTreeMap::new(),
            at: Instant::now(),
        }
    }

    fn merge(path: &str, body: Value) -> Req {
        let mut r = req("PATCH", path, body, &[]);
        r.headers.insert("content-type".into(), "application/merge-patch+json".into());
        r
    }

    /// A patch carrying the resourceVersion that was read applies; one carrying an older
    /// version is refused with 409 and changes nothing (optimistic concurrency).
    #[test]
    fn a_resource_version_in_a_patch_is_a_precondition() {
        let c = FakeCluster::start();
        c.add_node(json!({"metadata": {"name": "n1"}}));
        let rv = c.node("n1").unwrap()["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        let set = |v: &str, rv: &str| merge("/api/v1/nodes/n1", json!({"metadata": {"resourceVersion": rv, "annotations": {"k": v}}}));
        let (code, n) = post(&c, set("a", &rv));
        assert_eq!(code, 200);
        assert_eq!(n["metadata"]["annotations"]["k"], "a");
        assert_ne!(n["metadata"]["resourceVersion"].as_str(), Some(rv.as_str()), "a new version");
        let (code, e) = post(&c, set("b", &rv));
        assert_eq!(code, 409);
        assert_eq!(e["reason"], "Conflict");
        assert!(e["message"].as_str().unwrap().contains("the object has been modified"), "{e}");
        assert_eq!(c.node("n1").unwrap()["metadata"]["annotations"]["k"], "a");
        // Without a version the patch applies whatever changed (the heartbeat's).
        let (code, _) = post(&c, merge("/api/v1/nodes/n1", json!({"metadata": {"annotations": {"k": "c"}}})));
        assert_eq!(code, 200);
        let p = c.add_pod(job_pod("train-a", None, None));
        let stale = json!({"metadata": {"resourceVersion": "1", "annotations": {"k": "v"}}});
        assert_ne!(p["metadata"]["resourceVersion"], "1");
        assert_eq!(post(&c, merge("/api/v1/namespaces/ml/pods/train-a", stale)).0, 409);
    }

    /// A uid in a merge patch is no storage precondition: the patched object changing it is
    /// refused by validation, `422 Invalid` naming `metadata.uid`, and nothing changes; the
    /// pod's own UID applies.
    #[test]
    fn a_patch_changing_the_uid_is_invalid() {
        let c = FakeCluster::start();
        let p = c.add_pod(job_pod("train-a", None, None));
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        let set = |uid: &str, v: &str| merge("/api/v1/namespaces/ml/pods/train-a", json!({"metadata": {"uid": uid, "annotations": {"k": v}}}));
        let (code, e) = post(&c, set("another-uid", "a"));
        assert_eq!(code, 422, "{e}");
        assert_eq!(e["reason"], "Invalid");
        assert_eq!(e["details"]["causes"][0]["field"], "metadata.uid");
        assert!(e["message"].as_str().unwrap().contains("field is immutable"), "{e}");
        assert!(c.pod("ml", "train-a").unwrap()["metadata"]["annotations"]["k"].is_null());
        let (code, p) = post(&c, set(&uid, "b"));
        assert_eq!(code, 200);
        assert_eq!(p["metadata"]["annotations"]["k"], "b");
    }

    fn eviction(name: &str, uid: &str) -> Value {
        json!({"apiVersion": "policy/v1", "kind": "Eviction",
               "metadata": {"name": name, "namespace": "ml"},
               "deleteOptions": {"preconditions": {"uid": uid}}})
    }

    fn binding(name: &str, node: &str) -> Req {
        req("POST", &format!("/api/v1/namespaces/ml/pods/{}/binding", "train-a"), json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": "ml"}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}}), &[])
    }

    /// The Binding is refused as the API server refuses it: a name other than the URL's
    /// (400), a Terminating pod (409 "being deleted"), a pod already assigned (409); a
    /// `nodeName` of "" is no assignment.
    #[test]
    fn a_binding_is_refused_as_the_api_server_refuses_it() {
        let c = FakeCluster::start();
        let mut p = job_pod("train-a", None, None);
        p["spec"]["nodeName"] = "".into();
        p["metadata"]["deletionTimestamp"] = "2026-11-28T10:00:00Z".into();
        c.add_pod(p.clone());
        let (code, e) = post(&c, binding("train-b", "n1"));
        assert_eq!(code, 400, "{e}");
        assert!(e["message"].as_str().unwrap().contains("name in URL does not match"), "{e}");
        let (code, e) = post(&c, binding("train-a", "n1"));
        assert_eq!(code, 409, "{e}");
        assert!(e["message"].as_str().unwrap().contains("pod train-a is being deleted, cannot be assigned to a host"), "{e}");
        p["metadata"]["deletionTimestamp"] = Value::Null;
        c.add_pod(p);
        assert_eq!(post(&c, binding("train-a", "n1")).0, 201, "nodeName \"\" is unassigned");
        assert_eq!(c.pod("ml", "train-a").unwrap()["spec"]["nodeName"], "n1");
        let (code, e) = post(&c, binding("train-a", "n2"));
        assert_eq!(code, 409, "{e}");
        assert!(e["message"].as_str().unwrap().contains("already assigned to node \"n1\""), "{e}");
        assert_eq!(c.bindings().len(), 1);
    }

    fn job_pod(name: &str, node: Option<&str>, grace: Option<u64>) -> Value {
        let mut p = json!({"metadata": {"name": name, "namespace": "ml",
                                        "labels": {"job-name": "train", "xshare.io/role": "offline"}},
                           "spec": {"containers": [{"name": "main", "image": "x"}]},
                           "status": {"phase": "Running"}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = n.into();
        }
        if let Some(g) = grace {
            p["spec"]["terminationGracePeriodSeconds"] = g.into();
        }
        p
    }

    fn post(c: &FakeCluster, r: Req) -> (u16, Value) {
        match answer(&c.state, &r) {
            Answer::Json(code, v, _) => (code, v),
            _ => panic!("not a JSON answer"),
        }
    }

    fn replacements(c: &FakeCluster, not: &str) -> Vec<Value> {
        c.pods()
            .into_iter()
            .filter(|p| p["metadata"]["name"] != not && p["metadata"]["labels"]["job-name"] == "train")
            .collect()
    }

    /// An evicted bound pod stays, Terminating, for its grace period (deletionTimestamp and
    /// deletionGracePeriodSeconds from terminationGracePeriodSeconds), its watchers see it
    /// MODIFIED then DELETED, the Job controller replaces it once at once, and a second
    /// Eviction of it changes nothing (201, as the API server answers).
    #[test]
    fn eviction_is_graceful_and_the_job_pod_is_replaced_once() {
        let c = FakeCluster::start();
        let p = c.add_pod(job_pod("train-a", Some("n1"), Some(5)));
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        let rv = c.state.lock().unwrap().rv.to_string();
        let watch = req("GET", "/api/v1/pods", Value::Null, &[("watch", "true"), ("resourceVersion", &rv)]);
        let Answer::Live(rx) = answer(&c.state, &watch) else {
            panic!("not a watch");
        };
        let evict = || req("POST", "/api/v1/namespaces/ml/pods/train-a/eviction", eviction("train-a", &uid), &[]);
        let (code, _) = post(&c, evict());
        assert_eq!(code, 201);
        let t = c.pod("ml", "train-a").expect("still listed while Terminating");
        assert_eq!(t["metadata"]["deletionGracePeriodSeconds"], 5);
        let ts = t["metadata"]["deletionTimestamp"].as_str().unwrap().to_string();
        assert!(ts > now_rfc3339(), "deletionTimestamp is now + grace: {ts}");
        assert_eq!(t["status"]["phase"], "Running");
        assert_eq!(t["status"]["conditions"][0]["reason"], "EvictionByEvictionAPI");
        let next = replacements(&c, "train-a");
        assert_eq!(next.len(), 1, "TerminatingOrFailed: replaced at once");
        assert!(next[0]["spec"]["nodeName"].is_null());
        assert!(next[0]["metadata"]["deletionTimestamp"].is_null());
        // Evicted again while Terminating: accepted, nothing changes.
        let rv_before = t["metadata"]["resourceVersion"].clone();
        let (code, _) = post(&c, evict());
        assert_eq!(code, 201);
        assert_eq!(c.pod("ml", "train-a").unwrap()["metadata"]["resourceVersion"], rv_before);
        assert_eq!(c.evictions().len(), 2);
        // The kubelet confirms: deleted, not replaced again.
        assert!(!c.kubelet_confirm_stopped("ml", "train-a", "other-uid"));
        assert!(c.kubelet_confirm_stopped("ml", "train-a", &uid));
        assert!(c.pod("ml", "train-a").is_none());
        assert_eq!(replacements(&c, "train-a").len(), 1);
        let types: Vec<String> = rx
            .try_iter()
            .filter(|e| e["object"]["metadata"]["name"] == "train-a")
            .map(|e| e["type"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(types, ["MODIFIED", "DELETED"]);
    }

    /// The grace runs out (30 s by default, here 30 x 2 ms): the pod goes without a kubelet
    /// confirmation. Unbound pods go at once; DELETE is graceful like an eviction.
    #[test]
    fn grace_expires_and_unbound_pods_go_at_once() {
        let c = FakeCluster::start();
        c.set_grace_second(Duration::from_millis(2));
        let p = c.add_pod(job_pod("train-b", Some("n1"), None));
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        post(&c, req("POST", "/api/v1/namespaces/ml/pods/train-b/eviction", eviction("train-b", &uid), &[]));
        let t = c.pod("ml", "train-b").expect("Terminating first");
        assert_eq!(t["metadata"]["deletionGracePeriodSeconds"], DEFAULT_GRACE_SECONDS);
        let end = Instant::now() + Duration::from_secs(10);
        while c.pod("ml", "train-b").is_some() {
            assert!(Instant::now() < end, "grace never expired");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(replacements(&c, "train-b").len(), 1);
        // The replacement is not bound: evicting it deletes it at once (and replaces it).
        let next = replacements(&c, "train-b").remove(0);
        let name = next["metadata"]["name"].as_str().unwrap();
        let uid = next["metadata"]["uid"].as_str().unwrap();
        let path = format!("/api/v1/namespaces/ml/pods/{name}/eviction");
        post(&c, req("POST", &path, eviction(name, uid), &[]));
        assert!(c.pod("ml", name).is_none());
        // DELETE with gracePeriodSeconds: Terminating with that grace.
        c.set_grace_second(Duration::from_secs(1));
        c.add_pod(job_pod("train-c", Some("n1"), Some(60)));
        let del = req("DELETE", "/api/v1/namespaces/ml/pods/train-c", json!({"gracePeriodSeconds": 7}), &[]);
        let (code, v) = post(&c, del);
        assert_eq!(code, 200);
        assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 7);
        assert!(c.pod("ml", "train-c").is_some());
    }

    /// A second deletion of a Terminating pod: no grace or a longer one changes nothing; a
    /// shorter one moves `deletionTimestamp` back (counted from the first deletion) and the
    /// pod goes when that shorter grace is over; 0 deletes it at once.
    #[test]
    fn a_second_deletion_may_only_shorten_the_grace() {
        let c = FakeCluster::start();
        c.set_grace_second(Duration::from_millis(20));
        c.add_pod(job_pod("train-d", Some("n1"), Some(600)));
        let del = |g: Option<u64>| {
            let body = g.map_or(json!({}), |g| json!({"gracePeriodSeconds": g}));
            post(&c, req("DELETE", "/api/v1/namespaces/ml/pods/train-d", body, &[]))
        };
        del(None);
        let first = c.pod("ml", "train-d").unwrap();
        assert_eq!(first["metadata"]["deletionGracePeriodSeconds"], 600);
        let ts0 = first["metadata"]["deletionTimestamp"].as_str().unwrap().to_string();
        for g in [None, Some(600), Some(900)] {
            del(g);
            let p = c.pod("ml", "train-d").unwrap();
            assert_eq!(p["metadata"]["resourceVersion"], first["metadata"]["resourceVersion"], "{g:?}");
        }
        del(Some(10));
        let p = c.pod("ml", "train-d").expect("still Terminating for the shorter grace");
        assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 10);
        let ts = p["metadata"]["deletionTimestamp"].as_str().unwrap().to_string();
        assert!(ts < ts0, "moved back: {ts} vs {ts0}");
        let end = Instant::now() + Duration::from_secs(10);
        while c.pod("ml", "train-d").is_some() {
            assert!(Instant::now() < end, "the shortened grace (10 x 20 ms) never expired");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Grace 0 on a Terminating pod: gone at once.
        c.add_pod(job_pod("train-e", Some("n1"), Some(600)));
        let path = "/api/v1/namespaces/ml/pods/train-e";
        post(&c, req("DELETE", path, json!({}), &[]));
        assert!(c.pod("ml", "train-e").is_some());
        post(&c, req("DELETE", path, json!({"gracePeriodSeconds": 0}), &[]));
        assert!(c.pod("ml", "train-e").is_none());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'));
    }
}
