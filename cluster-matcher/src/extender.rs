//! Kubernetes scheduler-extender HTTP endpoints (filter, prioritize, bind).
//!
//! Wire format as kube-scheduler sends it (`k8s.io/kube-scheduler/extender/v1`, Go structs
//! without JSON tags, so keys are the Go field names): `ExtenderArgs {Pod, Nodes, NodeNames}`,
//! `ExtenderFilterResult {Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}`,
//! `HostPriorityList [{Host, Score}]` with scores 0..=10, `ExtenderBindingArgs {PodName,
//! PodNamespace, PodUID, Node}`, `ExtenderBindingResult {Error}`.

pub mod wire;

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::plan::{self, ClusterSpec, GpuRef, Plan, Workloads};
use crate::predictor::SpeedPredictor;
pub use wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
    MAX_EXTENDER_PRIORITY,
};

/// Label or annotation naming the offline job a pod runs (else the pod name is used).
pub const JOB_KEY: &str = "xshare.io/offline-job";
/// Largest request body accepted.
pub const MAX_BODY: usize = 32 << 20;

/// The extender's state: inputs, the current plan, and bindings made through it.
pub struct Extender {
    cluster: ClusterSpec,
    predictor: SpeedPredictor,
    cells: Option<Mutex<plan::with_cells::CellsState>>,
    state: Mutex<State>,
}

struct State {
    workloads: Workloads,
    /// `namespace/name` of pods seen in filter or prioritize calls, to the job they run.
    pod_jobs: BTreeMap<String, String>,
    plan: Plan,
    computed: Instant,
    round: u64,
}

/// How the plan treats one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum PodDecision {
    /// Not an offline job we know: leave it to the other plugins.
    NotOurs,
    /// Planned on this GPU.
    Placed(GpuRef),
    /// A known offline job the plan does not place this round.
    Waiting(String),
}

impl Extender {
    /// Builds the extender and computes the first plan; `cells` is the starting cells state
    /// when the cluster names one (see [`plan::load_cells`]).
    pub fn new(
        cluster: ClusterSpec,
        workloads: Workloads,
        predictor: SpeedPredictor,
        mut cells: Option<plan::with_cells::CellsState>,
    ) -> Self {
        let plan = plan::run_round(&cluster, &workloads, &predictor, cells.as_mut(), 0);
        let cells = cells.map(Mutex::new);
        Self {
            cluster,
            predictor,
            cells,
            state: Mutex::new(State { workloads, pod_jobs: BTreeMap::new(), plan, computed: Instant::now(), round: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current plan, recomputed when older than the round period.
    pub fn plan(&self) -> Plan {
        let mut s = self.lock();
        if s.computed.elapsed() >= Duration::from_secs(self.cluster.round_period_s) {
            s.round += 1;
            let mut cells = self.cells.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()));
            s.plan = plan::run_round(&self.cluster, &s.workloads, &self.predictor, cells.as_deref_mut(), s.round);
            s.computed = Instant::now();
        }
        s.plan.clone()
    }

    /// What the plan says about `pod`.
    pub fn decide(&self, pod: &Pod) -> PodDecision {
        let Some(job) = job_name(pod) else { return PodDecision::NotOurs };
        let plan = self.plan();
        let mut s = self.lock();
        if !s.workloads.offline.iter().any(|o| o.name == job) {
            return PodDecision::NotOurs;
        }
        if let Some(name) = &pod.metadata.name {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            s.pod_jobs.insert(format!("{ns}/{name}"), job.clone());
        }
        match plan.assignments.iter().find(|a| a.offline == job) {
            Some(a) => PodDecision::Placed(a.at.clone()),
            None => PodDecision::Waiting(job),
        }
    }

    /// The filter verb.
    pub fn filter(&self, args: ExtenderArgs) -> ExtenderFilterResult {
        let names = args.node_names();
        let decision = self.decide(&args.pod);
        let mut out = ExtenderFilterResult::default();
        let keep = |n: &str| match &decision {
            PodDecision::NotOurs => Ok(()),
            PodDecision::Placed(at) if at.node == n => Ok(()),
            PodDecision::Placed(at) => Err(format!("plan places this offline job on {}/{}", at.node, at.gpu)),
            PodDecision::Waiting(job) => Err(format!("no Healthy GPU pairing for `{job}` this round")),
        };
        let mut passed = Vec::new();
        for n in &names {
            match keep(n) {
                Ok(()) => passed.push(n.clone()),
                Err(why) if matches!(decision, PodDecision::Waiting(_)) => {
                    out.failed_and_unresolvable_nodes.insert(n.clone(), why);
                }
                Err(why) => {
                    out.failed_nodes.insert(n.clone(), why);
                }
            }
        }
        tracing::debug!(pod = ?args.pod.metadata.name, ?decision, passed = passed.len(), "filter");
        match args.nodes {
            Some(mut list) => {
                list.items.retain(|node| node.metadata.name.as_deref().is_some_and(|n| passed.contains(&n.to_string())));
                out.nodes = Some(list);
            }
            None => out.node_names = Some(passed),
        }
        out
    }

    /// The prioritize verb: the planned node scores the maximum, scaled by the pair's
    /// predicted normalized throughput; every other node scores 0.
    pub fn prioritize(&self, args: ExtenderArgs) -> Vec<HostPriority> {
        let decision = self.decide(&args.pod);
        let job = job_name(&args.pod);
        let pred = job
            .and_then(|j| self.plan().assignments.into_iter().find(|a| a.offline == j))
            .map_or(0.0, |a| a.predicted_normalized);
        args.node_names()
            .into_iter()
            .map(|host| {
                let score = match &decision {
                    PodDecision::Placed(at) if at.node == host => {
                        ((pred.min(1.0) * MAX_EXTENDER_PRIORITY as f64).round() as i64).max(1)
                    }
                    _ => 0,
                };
                HostPriority { host, score }
            })
            .collect()
    }

    /// The bind verb: accepts a binding that agrees with the plan and records the job as
    /// running there (it becomes `current` for the next round); refuses one that does not.
    pub fn bind(&self, args: ExtenderBindingArgs) -> ExtenderBindingResult {
        let plan = self.plan();
        let mut s = self.lock();
        let job_name = s
            .pod_jobs
            .get(&format!("{}/{}", args.pod_namespace, args.pod_name))
            .cloned()
            .unwrap_or_else(|| args.pod_name.clone());
        let Some(job) = s.workloads.offline.iter_mut().find(|o| o.name == job_name) else {
            return ExtenderBindingResult {
                error: format!("pod {}/{} is not an offline job of the plan", args.pod_namespace, args.pod_name),
            };
        };
        match plan.assignments.iter().find(|a| a.offline == job_name) {
            Some(a) if a.at.node == args.node => {
                tracing::info!(pod = %args.pod_name, job = %job_name, node = %args.node, gpu = a.at.gpu, sm = a.sm_percent, quota_mib = a.memory_quota_mib, "bound");
                job.current = Some(a.at.clone());
                ExtenderBindingResult::default()
            }
            Some(a) => ExtenderBindingResult {
                error: format!("plan places {job_name} on {}, not {}", a.at.node, args.node),
            },
            None => ExtenderBindingResult {
                error: format!("plan does not place {job_name} this round"),
            },
        }
    }

    /// Jobs recorded as running, by job name.
    pub fn bindings(&self) -> BTreeMap<String, GpuRef> {
        self.lock()
            .workloads
            .offline
            .iter()
            .filter_map(|o| o.current.clone().map(|c| (o.name.clone(), c)))
            .collect()
    }
}

/// The offline job a pod runs: its `xshare.io/offline-job` label or annotation, else its name.
pub fn job_name(pod: &Pod) -> Option<String> {
    let m = &pod.metadata;
    m.labels
        .as_ref()
        .and_then(|l| l.get(JOB_KEY))
        .or_else(|| m.annotations.as_ref().and_then(|a| a.get(JOB_KEY)))
        .cloned()
        .or_else(|| m.name.clone())
}

/// Binds the HTTP listener.
pub fn bind(addr: &str) -> Result<tiny_http::Server, Box<dyn std::error::Error + Send + Sync>> {
    tiny_http::Server::http(addr).map_err(|e| format!("cannot listen on {addr}: {e}").into())
}

fn json_response(status: u16, body: String) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("static header");
    tiny_http::Response::from_string(body).with_status_code(status).with_header(header)
}

fn error_body(msg: &str) -> String {
    serde_json::json!({ "Error": msg }).to_string()
}

/// Answers one request: `(status, JSON body)`.
pub fn handle(ext: &Extender, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    fn parse<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, String> {
        serde_json::from_slice(body).map_err(|e| format!("bad {what} body: {e}"))
    }
    let path = path.split('?').next().unwrap_or("").trim_end_matches('/');
    let path = path.rsplit('/').next().unwrap_or("");
    let result = match (method, path) {
        ("POST", "filter") => parse::<ExtenderArgs>(body, "ExtenderArgs").map(|a| serde_json::to_string(&ext.filter(a))),
        ("POST", "prioritize") => parse::<ExtenderArgs>(body, "ExtenderArgs").map(|a| serde_json::to_string(&ext.prioritize(a))),
        ("POST", "bind") => parse::<ExtenderBindingArgs>(body, "ExtenderBindingArgs").map(|a| serde_json::to_string(&ext.bind(a))),
        ("GET", "plan") => Ok(serde_json::to_string(&ext.plan())),
        ("GET", "healthz") => Ok(Ok("{\"ok\":true}".to_string())),
        _ => return (404, error_body(&format!("no endpoint {method} {path}; use POST filter|prioritize|bind, GET plan|healthz"))),
    };
    match result {
        Ok(Ok(s)) => (200, s),
        Ok(Err(e)) => (500, error_body(&e.to_string())),
        Err(e) => {
            tracing::warn!(endpoint = path, error = %e, "rejected request");
            (400, error_body(&e))
        }
    }
}

/// Serves requests until the server is unblocked (`Server::unblock`).
pub fn serve(server: &tiny_http::Server, ext: &Extender) {
    for mut req in server.incoming_requests() {
        let method = req.method().as_str().to_string();
        let url = req.url().to_string();
        let mut body = Vec::new();
        let read = req.as_reader().take(MAX_BODY as u64 + 1).read_to_end(&mut body);
        let (status, text) = match read {
            Err(e) => (400, error_body(&format!("cannot read body: {e}"))),
            Ok(_) if body.len() > MAX_BODY => (413, error_body(&format!("body larger than {MAX_BODY} bytes"))),
            Ok(_) => {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(ext, &method, &url, &body)));
                r.unwrap_or_else(|_| (500, error_body("internal error")))
            }
        };
        if let Err(e) = req.respond(json_response(status, text)) {
            tracing::warn!(error = %e, "could not send response");
        }
    }
}
