//! Kubernetes scheduler-extender HTTP endpoints (filter, prioritize, bind).
//!
//! Wire format as kube-scheduler sends it (`k8s.io/kube-scheduler/extender/v1`, Go structs
//! without JSON tags, so keys are the Go field names): `ExtenderArgs {Pod, Nodes, NodeNames}`,
//! `ExtenderFilterResult {Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}`,
//! `HostPriorityList [{Host, Score}]` with scores 0..=10, `ExtenderBindingArgs {PodName,
//! PodNamespace, PodUID, Node}`, `ExtenderBindingResult {Error}`.

pub mod metrics;
pub mod server;
pub mod tls;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::kube_api::{KubeApi, PodPlacement};
use crate::plan::{self, ClusterSpec, GpuRef, Plan, Workloads};
use crate::predictor::SpeedPredictor;
use crate::watch::WatchView;
pub use server::{HttpServer, Scope, ServerLimits, Transport};
pub use wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority, MAX_EXTENDER_PRIORITY,
};

/// Label or annotation naming the offline job a pod runs (else the pod name is used).
pub const JOB_KEY: &str = kube_contract::pod::KEY_OFFLINE_JOB;
/// Largest request body accepted by default.
pub const MAX_BODY: usize = 32 << 20;

/// Computes one round's plan from the workloads and the round number.
pub type Planner = Box<dyn Fn(&Workloads, u64) -> Plan + Send + Sync>;

/// The plan requests read: computed in the background, swapped in whole.
#[derive(Debug)]
pub struct Snapshot {
    /// The plan computed for this round; filter, prioritize and bind answer from it.
    pub plan: Plan,
    /// Round number the plan was computed for (also written onto pods under `ANN_PLAN_ROUND`).
    pub round: u64,
    /// Wall time the round took, seconds.
    pub plan_seconds: f64,
}

/// The extender's state: inputs, the latest plan, and bindings made through it.
///
/// Requests never compute a plan: they read the latest [`Snapshot`] (an `Arc` behind a
/// short lock); [`Extender::spawn_planner`] recomputes it when the inputs change and every
/// round period.
pub struct Extender {
    planner: Planner,
    period: Duration,
    inputs: Mutex<Inputs>,
    wake: Condvar,
    latest: Mutex<Arc<Snapshot>>,
    api: Option<KubeApi>,
    watched: Option<Watched>,
    /// Offline pods per GPU (`max_offline_per_gpu`; unlimited without a cluster).
    per_gpu: usize,
    /// Also export GPU memory under dcgm-exporter's names (`serve --dcgm-metrics`).
    dcgm_metrics: bool,
    /// Binds in flight and binds made that the watch has not shown bound yet.
    placing: Mutex<BTreeMap<String, Placing>>,
    /// Binds refused by the guards below the plan: (GPU full, job has a pod).
    guard_refusals: [std::sync::atomic::AtomicU64; 2],
    /// (job, node) pairs newly seen refused by kube-scheduler's own filters.
    scheduler_refusals: std::sync::atomic::AtomicU64,
}

/// A pod being bound (or bound, not yet seen so by the watch), keyed by UID.
#[derive(Debug, Clone)]
struct Placing {
    pod: String,
    job: String,
    at: GpuRef,
    since: Instant,
}

/// How long a bind made is still counted when the watch does not show its pod bound.
const PLACING_KEPT: Duration = Duration::from_secs(120);

/// Whether an offline pod (labelled so and asking for `xshare.io/offline-gpu`:
/// [`crate::watch::planned_role`]) still runs or is about to: not ended, not Terminating.
fn live_offline(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    !matches!(phase, "Succeeded" | "Failed")
        && p.metadata.deletion_timestamp.is_none()
        && crate::watch::planned_role(p, &[]) == Ok(Some(kube_contract::pod::Role::Offline))
}

fn pod_id(p: &Pod) -> (String, String) {
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    let key = format!("{ns}/{}", p.metadata.name.as_deref().unwrap_or(""));
    (p.metadata.uid.clone().unwrap_or_else(|| key.clone()), key)
}

/// The GPU a bound pod was given (its node and `ANN_GPU`), if any.
fn pod_gpu(p: &Pod) -> Option<GpuRef> {
    let node = p.spec.as_ref()?.node_name.clone().filter(|n| !n.is_empty())?;
    let gpu = p.metadata.annotations.as_ref()?.get(crate::kube_api::ANN_GPU)?.parse().ok()?;
    Some(GpuRef { node, gpu })
}

/// Inputs learned from the API server's watches instead of `workloads.json`.
pub struct Watched {
    /// Pods and nodes as last seen by the API server watches.
    pub view: WatchView,
    /// cluster.json: round settings, tenants, nodes the watches do not describe.
    pub base: ClusterSpec,
    /// Jobs bound through this extender, by job key, until the watch shows them bound: the GPU
    /// and the memory quota (MiB) the pod was bound with, which rounds charge the GPU.
    bound: Arc<Mutex<BTreeMap<String, (GpuRef, u64)>>>,
    /// UIDs of offline pods seen evicted through the Eviction API (a counter's memory).
    evicted: Arc<Mutex<BTreeSet<String>>>,
    /// Nodes kube-scheduler's own filters kept jobs' pods off (see [`SchedulerRefusals`]).
    refusals: Arc<Mutex<SchedulerRefusals>>,
    /// How long such a refusal is remembered (`scheduler_refusal_ttl_s`).
    refusal_ttl: Duration,
}

/// The (job, node) pairs kube-scheduler's own filters refused: the plan placed the job on
/// the node, and a filter call for the job's pod did not offer that node (NodeResourcesFit,
/// taints, node selector or affinity run before extenders, and a node they reject is not in
/// `NodeNames`). Each is remembered for `ttl` from when it was first seen, with the nodes that
/// call did offer: the rounds plan the job only on those meanwhile (every node the filters
/// rule out at once, not one per attempt: a job whose pods may run only in a small pool used
/// to be planned on the next best node outside it at each attempt), and try again after it
/// (the node's CPU may have freed up).
#[derive(Debug, Default)]
pub struct SchedulerRefusals {
    since: BTreeMap<(String, String), Instant>,
    /// Per job, the nodes offered by the call of its latest new refusal, and when.
    offered: BTreeMap<String, (BTreeSet<String>, Instant)>,
}

impl SchedulerRefusals {
    /// Records that the scheduler kept `job`'s pod off `node` at `now`; true when the pair
    /// is new (not remembered, or its refusal expired). With a `ttl` of 0 nothing is
    /// remembered and every call is new.
    pub fn note(&mut self, job: &str, node: &str, offered: &[String], now: Instant, ttl: Duration) -> bool {
        if ttl.is_zero() {
            return true;
        }
        let key = (job.to_string(), node.to_string());
        match self.since.get(&key) {
            Some(t) if now.saturating_duration_since(*t) < ttl => false,
            _ => {
                self.since.insert(key, now);
                self.offered.insert(job.to_string(), (offered.iter().cloned().collect(), now));
                true
            }
        }
    }

    /// A later filter call for a refused `job` offers `offered`: the job's allowed nodes become
    /// those (a node cordoned for a moment is offered again, one planned meanwhile may be left
    /// out); true when they changed (the planner should run). Its refusal keeps its start.
    pub fn refresh(&mut self, job: &str, offered: &[String], now: Instant, ttl: Duration) -> bool {
        match self.offered.get_mut(job) {
            Some((nodes, since)) if now.saturating_duration_since(*since) < ttl => {
                let fresh: BTreeSet<String> = offered.iter().cloned().collect();
                if *nodes == fresh {
                    return false;
                }
                *nodes = fresh;
                true
            }
            _ => false,
        }
    }

    /// The jobs still refused at `now`, each with the only nodes it may be planned on (those
    /// its latest refusal's call offered); expired ones are forgotten.
    pub fn active(&mut self, now: Instant, ttl: Duration) -> BTreeMap<String, BTreeSet<String>> {
        self.since.retain(|_, t| now.saturating_duration_since(*t) < ttl);
        self.offered.retain(|_, (_, t)| now.saturating_duration_since(*t) < ttl);
        self.offered.iter().map(|(j, (nodes, _))| (j.clone(), nodes.clone())).collect()
    }
}

struct Inputs {
    workloads: Workloads,
    /// `namespace/name` of pods seen in filter or prioritize calls, to the job they run and the
    /// plan round of the latest call; an entry goes when a round's plan no longer knows its job,
    /// or the watch no longer shows its pod ([`Extender::forget_gone_pods`]).
    pod_jobs: BTreeMap<String, (String, u64)>,
    /// Inputs changed since the latest plan was started.
    dirty: bool,
    stop: bool,
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
    /// An offline pod (watched inputs) whose job the plan does not know: why (a missing or
    /// bad annotation the plan needs, or not yet in a round), and whether the next round
    /// would plan it (the planner is then woken).
    Unplanned {
        /// What keeps it out of the plan.
        why: String,
        /// Well formed and in the watch: the next round plans it.
        next_round: bool,
    },
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Extender {
    /// Builds the extender and computes the first plan (before any request is served);
    /// `cells` is the starting cells state when the cluster names one (see [`plan::load_cells`]).
    pub fn new(
        cluster: ClusterSpec,
        workloads: Workloads,
        predictor: SpeedPredictor,
        cells: Option<plan::with_cells::CellsState>,
    ) -> Self {
        let period = Duration::from_secs(cluster.round_period_s.max(1));
        let per_gpu = cluster.max_offline_per_gpu.max(1);
        // The cells' state carries from round to round (one round at a time: the planner thread).
        let cells = cells.map(Mutex::new);
        // The last round's pairs warm-start the next round (see `plan::Planner`). Nothing here
        // moves a running job (binds only), so rounds keep each one where it runs.
        let warm = Mutex::new(plan::Planner::default().keeping_running());
        let planner: Planner = Box::new(move |w: &Workloads, round: u64| {
            let mut cells = cells.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()));
            if let Some(st) = cells.as_deref_mut() {
                st.keep_running = true;
            }
            relock(&warm).run_round(&cluster, w, &predictor, cells.as_deref_mut(), round)
        });
        let mut ext = Self::with_planner(workloads, period, planner);
        ext.per_gpu = per_gpu;
        ext
    }

    /// Builds the extender around any planner (tests, replays); computes the first plan.
    pub fn with_planner(workloads: Workloads, period: Duration, planner: Planner) -> Self {
        let t0 = Instant::now();
        let plan = planner(&workloads, 0);
        let plan_seconds = t0.elapsed().as_secs_f64();
        Self {
            planner,
            period,
            inputs: Mutex::new(Inputs { workloads, pod_jobs: BTreeMap::new(), dirty: false, stop: false }),
            wake: Condvar::new(),
            latest: Mutex::new(Arc::new(Snapshot { plan, round: 0, plan_seconds })),
            api: None,
            watched: None,
            per_gpu: usize::MAX,
            dcgm_metrics: false,
            placing: Mutex::default(),
            guard_refusals: Default::default(),
            scheduler_refusals: Default::default(),
        }
    }

    /// Builds the extender on watched inputs: each round takes one snapshot of the watched
    /// pods and nodes and plans from it (nodes and GPU health from the heartbeats, workloads
    /// from the pods). `base` is cluster.json; call [`Extender::replan`] when the watches
    /// change (see [`crate::watch::ClusterWatch::start`]'s `on_change`).
    pub fn watched(
        base: ClusterSpec,
        predictor: SpeedPredictor,
        cells: Option<plan::with_cells::CellsState>,
        view: WatchView,
    ) -> Self {
        let period = Duration::from_secs(base.round_period_s.max(1));
        let bound: Arc<Mutex<BTreeMap<String, (GpuRef, u64)>>> = Arc::default();
        let evicted: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let refusals: Arc<Mutex<SchedulerRefusals>> = Arc::default();
        let refusal_ttl = Duration::from_secs(base.scheduler_refusal_ttl_s);
        let cells = cells.map(Mutex::new);
        // Nothing here moves a running job (binds only): rounds keep each one where it runs.
        let warm = Mutex::new(plan::Planner::default().keeping_running());
        let (b, v, bd, ev, rf) = (base.clone(), view.clone(), bound.clone(), evicted.clone(), refusals.clone());
        // Pods left out of the plan already said at WARN: (UID, why).
        let warned: Mutex<BTreeSet<(String, String)>> = Mutex::default();
        let planner: Planner = Box::new(move |_: &Workloads, round: u64| {
            let snap = v.snapshot();
            let cluster = snap.cluster_spec(&b);
            let (mut workloads, skipped) = snap.workloads(&cluster);
            // Once per pod and reason, not every round: a mis-annotated pod waits forever.
            let new = first_sightings(&mut relock(&warned), &skipped);
            for s in &skipped {
                if new.contains(&s) {
                    tracing::warn!(round, pod = %s.what, why = %s.why, "pod left out of the plan (said once per pod and reason)");
                } else {
                    tracing::debug!(round, pod = %s.what, why = %s.why, "pod left out of the plan");
                }
            }
            {
                // A bind the watch has not shown yet still counts as where the job runs.
                let mut bound = relock(&bd);
                let present: BTreeSet<String> = workloads.offline.iter().map(|o| o.name.clone()).collect();
                bound.retain(|k, _| present.contains(k));
                for job in &mut workloads.offline {
                    if job.current.is_none() {
                        // The quota it was bound with, as the watch would read it off the pod:
                        // a round run before the watch shows the bind (the one the bind itself
                        // starts) charged only the job's need, and gave a newcomer the rest.
                        if let Some((at, quota_mib)) = bound.get(&job.name) {
                            job.current = Some(at.clone());
                            job.held_memory_quota_mib = Some(*quota_mib);
                        }
                    } else {
                        bound.remove(&job.name);
                    }
                }
            }
            {
                let mut seen = relock(&ev);
                for p in snap.evicted_offline_pods() {
                    if let Some(uid) = &p.metadata.uid {
                        seen.insert(uid.clone());
                    }
                }
            }
            // The nodes kube-scheduler's own filters keep jobs' pods off: a refused job is
            // planned only on the nodes they last offered, until the refusal expires.
            {
                let mut active = relock(&rf).active(Instant::now(), refusal_ttl);
                for job in &mut workloads.offline {
                    if let Some(nodes) = active.remove(&job.name) {
                        job.allowed_nodes = Some(nodes);
                    }
                }
            }
            let health = |g: &GpuRef| snap.health(g);
            let mut cells = cells.as_ref().map(|c| relock(c));
            match cells.as_deref_mut() {
                Some(st) => {
                    st.keep_running = true;
                    let plan = plan::with_cells::plan_round_with_cells(&cluster, &workloads, &predictor, &health, round, st);
                    if let Some(p) = &cluster.cells_state {
                        if let Err(e) = st.save(p) {
                            tracing::error!(error = %e, "cells state not saved");
                        }
                    }
                    plan
                }
                None => relock(&warm).plan_round(&cluster, &workloads, &predictor, &health, round),
            }
        });
        let mut ext = Self::with_planner(Workloads::default(), period, planner);
        ext.per_gpu = base.max_offline_per_gpu.max(1);
        ext.watched = Some(Watched { view, base, bound, evicted, refusals, refusal_ttl });
        ext
    }

    /// The watched inputs, when the extender runs on them.
    pub fn watched_inputs(&self) -> Option<&Watched> {
        self.watched.as_ref()
    }

    /// Binds through this API client (without one, bind answers an error: it never reports
    /// a binding it did not make).
    pub fn with_api(mut self, api: KubeApi) -> Self {
        self.api = Some(api);
        self
    }

    /// Also exports the heartbeats' GPU memory under dcgm-exporter's names and labels
    /// ([`metrics::DCGM_FAMILIES`]), for a cluster that runs no dcgm-exporter.
    pub fn with_dcgm_metrics(mut self, on: bool) -> Self {
        self.dcgm_metrics = on;
        self
    }

    /// Whether [`Extender::with_dcgm_metrics`] is on.
    pub fn dcgm_metrics(&self) -> bool {
        self.dcgm_metrics
    }

    /// Starts the background planner: recomputes the plan when the inputs change (a bind)
    /// and every round period, and swaps it in. It stops when the extender is dropped or
    /// [`Extender::stop_planner`] is called.
    pub fn spawn_planner(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let weak: Weak<Self> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("planner".into())
            .spawn(move || {
                let mut round = 0;
                loop {
                    let Some(ext) = weak.upgrade() else { return };
                    let workloads = {
                        let mut i = relock(&ext.inputs);
                        if !i.dirty && !i.stop {
                            i = ext
                                .wake
                                .wait_timeout(i, ext.period)
                                .map(|(g, _)| g)
                                .unwrap_or_else(|p| p.into_inner().0);
                        }
                        if i.stop {
                            return;
                        }
                        i.dirty = false;
                        i.workloads.clone()
                    };
                    round += 1;
                    // Computed with no lock held: requests keep reading the previous plan.
                    let t0 = Instant::now();
                    let planned =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (ext.planner)(&workloads, round)));
                    let plan_seconds = t0.elapsed().as_secs_f64();
                    match planned {
                        Ok(plan) => {
                            *relock(&ext.latest) = Arc::new(Snapshot { plan, round, plan_seconds });
                            tracing::debug!(round, "plan swapped in");
                            ext.forget_gone_pods();
                        }
                        // The last good plan stays; the next round tries again.
                        Err(_) => tracing::error!(round, "planning round panicked; keeping the previous plan"),
                    }
                }
            })
            .expect("spawn planner thread")
    }

    /// Forgets the pods seen in filter and prioritize calls whose job the latest plan no longer
    /// knows (a job that ended or left the watched pods), and, on watched inputs, those the
    /// watch no longer shows that were last asked about two rounds or more ago (a job's pod
    /// deleted and replaced under another name; the wait leaves a pod just created, not yet in
    /// the watch, between its filter and its bind). Without it the map grew by every pod name
    /// the extender ever saw, for the life of the process.
    fn forget_gone_pods(&self) {
        let snap = self.snapshot();
        let mut i = relock(&self.inputs);
        let gone_from_watch = |pod: &str, seen: u64| {
            let Some(w) = &self.watched else { return false };
            let (ns, name) = pod.split_once('/').unwrap_or(("default", pod));
            seen + 2 <= snap.round && w.view.pod(ns, name).is_none()
        };
        let gone: Vec<String> = i
            .pod_jobs
            .iter()
            .filter(|(pod, (job, seen))| !self.knows_job(&i, &snap, job) || gone_from_watch(pod, *seen))
            .map(|(pod, _)| pod.clone())
            .collect();
        for pod in &gone {
            i.pod_jobs.remove(pod);
        }
        if !gone.is_empty() {
            tracing::debug!(forgotten = gone.len(), kept = i.pod_jobs.len(), "pods of jobs the plan no longer knows forgotten");
        }
    }

    /// How many pods seen in filter and prioritize calls the extender remembers (their jobs,
    /// for bind).
    pub fn pods_remembered(&self) -> usize {
        relock(&self.inputs).pod_jobs.len()
    }

    /// Asks the background planner to stop.
    pub fn stop_planner(&self) {
        relock(&self.inputs).stop = true;
        self.wake.notify_all();
    }

    /// Asks the background planner for a new round now.
    pub fn replan(&self) {
        relock(&self.inputs).dirty = true;
        self.wake.notify_all();
    }

    /// The latest plan and its round (never computed on the caller's thread).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        relock(&self.latest).clone()
    }

    /// The latest plan.
    pub fn plan(&self) -> Plan {
        self.snapshot().plan.clone()
    }

    /// What the plan says about `pod`.
    pub fn decide(&self, pod: &Pod) -> PodDecision {
        let job = match &self.watched {
            Some(_) => crate::watch::offline_job_key(pod),
            None => job_name(pod),
        };
        let Some(job) = job else {
            return PodDecision::NotOurs;
        };
        let snap = self.snapshot();
        {
            let mut i = relock(&self.inputs);
            if !self.knows_job(&i, &snap, &job) {
                return match &self.watched {
                    // An offline pod (its role says so) the plan left out: not another
                    // scheduler's business, and no bind of it can succeed.
                    Some(w) => self.unplanned(w, pod),
                    None => PodDecision::NotOurs,
                };
            }
            if let Some(name) = &pod.metadata.name {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                i.pod_jobs.insert(format!("{ns}/{name}"), (job.clone(), snap.round));
            }
        }
        match snap.plan.assignments.iter().find(|a| a.offline == job) {
            Some(a) => PodDecision::Placed(a.at.clone()),
            None => PodDecision::Waiting(job),
        }
    }
    /// Why the plan does not know offline pod `pod` (watched inputs): the pod's own memory
    /// annotation as the plan's inputs read it, else whether the watch shows it yet.
    fn unplanned(&self, w: &Watched, pod: &Pod) -> PodDecision {
        if let Err(why) = crate::watch::offline_memory_mib(pod.metadata.annotations.as_ref()) {
            return PodDecision::Unplanned {
                why: format!(
                    "{why}: the plan leaves this offline pod out until {} names the GPU memory its job needs (MiB)",
                    kube_contract::pod::ANN_MEMORY_MIB
                ),
                next_round: false,
            };
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let shown = pod.metadata.name.as_deref().is_some_and(|n| w.view.pod(ns, n).is_some());
        if shown {
            PodDecision::Unplanned {
                why: "not yet in a plan round: the next round plans it".into(),
                next_round: true,
            }
        } else {
            PodDecision::Unplanned {
                why: "not in the extender's pod watch (yet, or outside its --watch-namespace / --pod-selector): planned once the watch shows it".into(),
                next_round: false,
            }
        }
    }

    /// Whether `job` is an offline job of the plan's inputs.
    fn knows_job(&self, i: &Inputs, snap: &Snapshot, job: &str) -> bool {
        match &self.watched {
            // Watched inputs live in the round's snapshot: every offline job is placed or
            // left waiting by it.
            Some(_) => {
                snap.plan.assignments.iter().any(|a| a.offline == job) || snap.plan.unplaced.iter().any(|u| u == job)
            }
            None => i.workloads.offline.iter().any(|o| o.name == job),
        }
    }

    /// The filter verb.
    pub fn filter(&self, args: ExtenderArgs) -> ExtenderFilterResult {
        let names = args.node_names();
        let decision = self.decide(&args.pod);
        let mut out = ExtenderFilterResult::default();
        // What bind would refuse below the plan (the job already has a live pod, the GPU is
        // already full), refused here already so kube-scheduler waits instead of binding.
        let below = match (&decision, &self.watched) {
            (PodDecision::Placed(at), Some(_)) => crate::watch::offline_job_key(&args.pod).and_then(|job| {
                let (uid, key) = pod_id(&args.pod);
                self.guard(&mut relock(&self.placing), &uid, &key, &job, at).err().map(|(_, why)| why)
            }),
            _ => None,
        };
        // kube-scheduler's own filters ran first: the planned node missing from the nodes
        // it asks about is a node they refuse (its CPU, taints, the pod's node selector or
        // affinity). Remembered, so the next rounds plan the job elsewhere. Not a call about
        // the pod's nominated node alone: kube-scheduler tries that one first, by itself, and
        // then all nodes if it fails.
        let nominated = args.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref());
        let nominated_only = names.len() == 1 && nominated == Some(names[0].as_str());
        let scheduler_refused = match (&decision, &self.watched, &below) {
            (PodDecision::Placed(at), Some(w), None)
                if !names.is_empty() && !names.contains(&at.node) && !nominated_only =>
            {
                self.note_scheduler_refusal(w, &args.pod, at, &names);
                true
            }
            _ => false,
        };
        // A job planned only on the nodes a refusal's call offered: every later call (placed
        // or waiting) brings the nodes the filters offer now, so a node they offer again is
        // planned again, and one they leave out is left out, without waiting for the TTL.
        if let (Some(w), PodDecision::Placed(_) | PodDecision::Waiting(_)) = (&self.watched, &decision) {
            if !names.is_empty() && !nominated_only {
                if let Some(job) = crate::watch::offline_job_key(&args.pod) {
                    if relock(&w.refusals).refresh(&job, &names, Instant::now(), w.refusal_ttl) {
                        self.replan();
                    }
                }
            }
        }
        if let PodDecision::Unplanned { next_round: true, .. } = &decision {
            self.replan();
        }
        let keep = |n: &str| match &decision {
            PodDecision::NotOurs => Ok(()),
            PodDecision::Placed(_) if below.is_some() => Err(below.clone().unwrap_or_default()),
            PodDecision::Placed(at) if at.node == n => Ok(()),
            PodDecision::Placed(at) if scheduler_refused => Err(format!(
                "plan places this offline job on {}/{}, which kube-scheduler's own filters left out: planned again without it",
                at.node, at.gpu
            )),
            PodDecision::Placed(at) => Err(format!("plan places this offline job on {}/{}", at.node, at.gpu)),
            PodDecision::Waiting(job) => Err(format!("no Healthy GPU pairing for `{job}` this round")),
            PodDecision::Unplanned { why, .. } => Err(why.clone()),
        };
        let mut passed = Vec::new();
        for n in &names {
            match keep(n) {
                Ok(()) => passed.push(n.clone()),
                // Every refusal here is the plan's (or what runs), which no preemption on
                // that node changes: reported unresolvable, so kube-scheduler's
                // DefaultPreemption never evicts victims there for nothing (`FailedNodes`
                // would make the node a preemption candidate).
                Err(why) => {
                    out.failed_and_unresolvable_nodes.insert(n.clone(), why);
                }
            }
        }
        tracing::debug!(pod = ?args.pod.metadata.name, ?decision, passed = passed.len(), "filter");
        match args.nodes {
            Some(mut list) => {
                list.items
                    .retain(|node| node.metadata.name.as_deref().is_some_and(|n| passed.contains(&n.to_string())));
                out.nodes = Some(list);
            }
            None => out.node_names = Some(passed),
        }
        out
    }

    /// Remembers that kube-scheduler's own filters kept `pod` off the node the plan places
    /// its job on (see [`SchedulerRefusals`]); a new refusal is said at WARN, counted, and
    /// wakes the planner (when remembered at all: `scheduler_refusal_ttl_s` > 0).
    fn note_scheduler_refusal(&self, w: &Watched, pod: &Pod, at: &GpuRef, offered: &[String]) {
        let Some(job) = crate::watch::offline_job_key(pod) else { return };
        if !relock(&w.refusals).note(&job, &at.node, offered, Instant::now(), w.refusal_ttl) {
            return;
        }
        self.scheduler_refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (_, key) = pod_id(pod);
        tracing::warn!(
            pod = %key,
            %job,
            node = %at.node,
            gpu = at.gpu,
            ttl_s = w.refusal_ttl.as_secs(),
            offered = offered.len(),
            "kube-scheduler's own filters (resources, taints, node selector, affinity) keep this pod off the node the plan places its job on: for scheduler_refusal_ttl_s the job is planned only on the nodes they offered (0: not remembered, the pod waits)"
        );
        if !w.refusal_ttl.is_zero() {
            self.replan();
        }
    }

    /// (job, node) pairs newly seen refused by kube-scheduler's own filters since start.
    pub fn scheduler_refusal_count(&self) -> u64 {
        self.scheduler_refusals.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The prioritize verb: the planned node scores the maximum, scaled by the pair's
    /// predicted normalized throughput; every other node scores 0.
    pub fn prioritize(&self, args: ExtenderArgs) -> Vec<HostPriority> {
        let decision = self.decide(&args.pod);
        let job = match &self.watched {
            Some(_) => crate::watch::offline_job_key(&args.pod),
            None => job_name(&args.pod),
        };
        let pred = job
            .and_then(|j| self.snapshot().plan.assignments.iter().find(|a| a.offline == j).cloned())
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

    /// The bind verb: a binding that agrees with the plan writes the plan's decision onto the
    /// pod and creates its `Binding` through the API server, then records the job as running
    /// there (it becomes `current` for the next round). Anything else, and every API error,
    /// is answered in `Error`: kube-scheduler then retries the pod.
    pub fn bind(&self, args: ExtenderBindingArgs) -> ExtenderBindingResult {
        let fail = |error: String| {
            tracing::warn!(pod = %args.pod_name, ns = %args.pod_namespace, node = %args.node, %error, "bind refused");
            ExtenderBindingResult { error }
        };
        let snap = self.snapshot();
        let job_name = {
            let i = relock(&self.inputs);
            let seen = i.pod_jobs.get(&format!("{}/{}", args.pod_namespace, args.pod_name)).map(|(job, _)| job.clone());
            let job = match (&self.watched, seen) {
                (_, Some(job)) => job,
                (Some(w), None) => w
                    .view
                    .pod(&args.pod_namespace, &args.pod_name)
                    .and_then(|p| crate::watch::offline_job_key(&p))
                    .unwrap_or_else(|| format!("{}/{}", args.pod_namespace, args.pod_name)),
                (None, None) => args.pod_name.clone(),
            };
            if !self.knows_job(&i, &snap, &job) {
                let why = self.watched.as_ref().and_then(|w| {
                    let pod = w.view.pod(&args.pod_namespace, &args.pod_name)?;
                    match self.unplanned(w, &pod) {
                        PodDecision::Unplanned { why, .. } => Some(format!(": {why}")),
                        _ => None,
                    }
                });
                return fail(format!(
                    "pod {}/{} is not an offline job of the plan{}",
                    args.pod_namespace,
                    args.pod_name,
                    why.unwrap_or_default()
                ));
            }
            job
        };
        let a = match snap.plan.assignments.iter().find(|a| a.offline == job_name) {
            Some(a) if a.at.node == args.node => a,
            Some(a) => return fail(format!("plan places {job_name} on {}, not {}", a.at.node, args.node)),
            None => return fail(format!("plan does not place {job_name} this round")),
        };
        let Some(api) = &self.api else {
            return fail(format!(
                "no Kubernetes API client configured: pod {}/{} not bound (run in-cluster or pass --kubeconfig / --kube-api)",
                args.pod_namespace, args.pod_name
            ));
        };
        let placement = PodPlacement {
            node: a.at.node.clone(),
            gpu: a.at.gpu,
            sm_percent: a.sm_percent,
            memory_quota_bytes: a.memory_quota_mib.saturating_mul(1 << 20),
            online: a.online.clone(),
            round: snap.round,
        };
        // Below the plan, against what runs (the watch) and the binds in flight: the plan may
        // be older than a bind that just landed, or than a pod the watch now shows.
        let pod_key = format!("{}/{}", args.pod_namespace, args.pod_name);
        let uid_key = if args.pod_uid.is_empty() { pod_key.clone() } else { args.pod_uid.clone() };
        {
            let mut placing = relock(&self.placing);
            if let Err((why, error)) = self.guard(&mut placing, &uid_key, &pod_key, &job_name, &a.at) {
                self.guard_refusals[why].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return fail(error);
            }
            placing.insert(
                uid_key.clone(),
                Placing { pod: pod_key.clone(), job: job_name.clone(), at: a.at.clone(), since: Instant::now() },
            );
        }
        if let Err(e) = api.bind_pod(&args.pod_namespace, &args.pod_name, &args.pod_uid, &placement) {
            relock(&self.placing).remove(&uid_key);
            let error = format!("pod {}/{} not bound to {}: {e}", args.pod_namespace, args.pod_name, args.node);
            if let crate::kube_api::ApiError::Locked { holder, .. } = &e {
                // Expected while another pod's admission is under way: kube-scheduler retries
                // with backoff, and a WARN per retry would drown the real refusals.
                tracing::info!(pod = %args.pod_name, ns = %args.pod_namespace, node = %args.node, %holder, "bind waits for the node's bind lock");
                return ExtenderBindingResult { error };
            }
            return fail(error);
        }
        tracing::info!(pod = %args.pod_name, job = %job_name, node = %args.node, gpu = a.at.gpu, sm = a.sm_percent, quota_mib = a.memory_quota_mib, "bound");
        {
            let mut i = relock(&self.inputs);
            if let Some(job) = i.workloads.offline.iter_mut().find(|o| o.name == job_name) {
                job.current = Some(a.at.clone());
            }
            if let Some(w) = &self.watched {
                relock(&w.bound).insert(job_name.clone(), (a.at.clone(), a.memory_quota_mib));
            }
            i.dirty = true;
        }
        self.wake.notify_all();
        ExtenderBindingResult::default()
    }

    /// Refuses a bind of pod `pod_key` (UID `uid_key`) of `job` to `at` when another live
    /// pod of the job is bound or being bound (the plan gives a job one GPU slot: a Job's
    /// pods run one at a time), or when `at` already holds `max_offline_per_gpu` live
    /// offline pods, as the watch and the binds in flight show them. `Err((0 | 1, why))`:
    /// GPU full, or the job has a pod. Drops `placing` entries the watch now shows.
    fn guard(
        &self,
        placing: &mut BTreeMap<String, Placing>,
        uid_key: &str,
        pod_key: &str,
        job: &str,
        at: &GpuRef,
    ) -> Result<(), (usize, String)> {
        let pods = self.watched.as_ref().map(|w| w.view.pods()).unwrap_or_default();
        let mut seen: BTreeMap<String, &Pod> = BTreeMap::new();
        for p in &pods {
            seen.insert(pod_id(p).0, p);
        }
        placing.retain(|uid, pl| {
            let shown = seen.get(uid).is_some_and(|p| !live_offline(p) || pod_gpu(p).is_some());
            !shown && pl.since.elapsed() < PLACING_KEPT
        });
        let this = |uid: &str, key: &str| uid == uid_key || key == pod_key;
        let mut on_gpu = Vec::new();
        for p in pods.iter().filter(|p| live_offline(p)) {
            let (uid, key) = pod_id(p);
            if this(&uid, &key) {
                continue;
            }
            let Some(g) = pod_gpu(p) else { continue };
            if crate::watch::offline_job_key(p).as_deref() == Some(job) {
                return Err((1, format!(
                    "job {job} already runs pod {key} on {}/{}: the plan gives a job one GPU slot, so a Job's pods (parallelism > 1) run one at a time",
                    g.node, g.gpu
                )));
            }
            if &g == at {
                on_gpu.push(key);
            }
        }
        for (uid, pl) in placing.iter() {
            if this(uid, &pl.pod) {
                continue;
            }
            if pl.job == job {
                return Err((1, format!(
                    "job {job} already has pod {} being bound to {}/{}: the plan gives a job one GPU slot, so a Job's pods (parallelism > 1) run one at a time",
                    pl.pod, pl.at.node, pl.at.gpu
                )));
            }
            if &pl.at == at && !on_gpu.contains(&pl.pod) {
                on_gpu.push(pl.pod.clone());
            }
        }
        if on_gpu.len() >= self.per_gpu {
            return Err((0, format!(
                "GPU {}/{} already holds {} live offline pod(s) ({}), max_offline_per_gpu = {}: the plan is behind what runs; kube-scheduler retries after the next round",
                at.node, at.gpu, on_gpu.len(), on_gpu.join(", "), self.per_gpu
            )));
        }
        Ok(())
    }

    /// Binds refused below the plan since start: (GPU already full, job already has a pod).
    pub fn guard_refusal_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.guard_refusals[0].load(Relaxed), self.guard_refusals[1].load(Relaxed))
    }

    /// Jobs recorded as running, by job name.
    pub fn bindings(&self) -> BTreeMap<String, GpuRef> {
        relock(&self.inputs)
            .workloads
            .offline
            .iter()
            .filter_map(|o| o.current.clone().map(|c| (o.name.clone(), c)))
            .collect()
    }
}

impl Drop for Extender {
    fn drop(&mut self) {
        self.stop_planner();
    }
}

/// The pods left out of this round that were not left out for the same reason last round
/// (`warned`: (UID, or what was left out, and why), replaced by this round's); routine ones
/// (a pod terminating) never.
fn first_sightings<'a>(
    warned: &mut BTreeSet<(String, String)>,
    skipped: &'a [crate::watch::SkippedPod],
) -> Vec<&'a crate::watch::SkippedPod> {
    let mut now = BTreeSet::new();
    let mut new = Vec::new();
    for s in skipped.iter().filter(|s| !s.routine) {
        let key = (s.uid.clone().unwrap_or_else(|| s.what.clone()), s.why.clone());
        if !warned.contains(&key) {
            new.push(s);
        }
        now.insert(key);
    }
    *warned = now;
    new
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

impl Extender {
    /// The API client binds go through, if one is configured.
    pub fn api(&self) -> Option<&KubeApi> {
        self.api.as_ref()
    }
}

impl Watched {
    /// Offline pods seen evicted through the Eviction API since start.
    pub fn evictions_seen(&self) -> u64 {
        relock(&self.evicted).len() as u64
    }
}

pub(crate) fn error_body(msg: &str) -> String {
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
        ("POST", "filter") => {
            parse::<ExtenderArgs>(body, "ExtenderArgs").map(|a| serde_json::to_string(&ext.filter(a)))
        }
        ("POST", "prioritize") => {
            parse::<ExtenderArgs>(body, "ExtenderArgs").map(|a| serde_json::to_string(&ext.prioritize(a)))
        }
        ("POST", "bind") => {
            parse::<ExtenderBindingArgs>(body, "ExtenderBindingArgs").map(|a| serde_json::to_string(&ext.bind(a)))
        }
        ("GET", "plan") => Ok(serde_json::to_string(&ext.plan())),
        ("GET", "metrics") => return (200, metrics::render(ext)),
        ("GET", "healthz") => Ok(Ok("{\"ok\":true}".to_string())),
        _ => {
            return (
                404,
                error_body(&format!("no endpoint {method} {path}; use POST filter|prioritize|bind, GET plan|metrics|healthz")),
            )
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused (job, node) pair is new once, stays refused for the TTL from when it was
    /// first seen (seeing it again does not extend it), is planned again after it, and is new
    /// again if the scheduler still refuses it then. A TTL of 0 remembers nothing.
    #[test]
    fn scheduler_refusals_expire_after_their_ttl() {
        let ttl = Duration::from_secs(300);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let offered = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        let set = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
        let mut r = SchedulerRefusals::default();
        assert!(r.note("ml/a", "n1", &offered(&["n2", "n3"]), at(0), ttl));
        assert!(!r.note("ml/a", "n1", &offered(&["n2"]), at(100), ttl), "seen again within the TTL: not new");
        assert!(r.note("ml/b", "n1", &offered(&["n4"]), at(100), ttl), "another job: new");
        let active = r.active(at(299), ttl);
        assert_eq!(active.get("ml/a"), Some(&set(&["n2", "n3"])), "planned only on the nodes the first refusal's call offered");
        assert_eq!(active.get("ml/b"), Some(&set(&["n4"])));
        assert_eq!(r.active(at(300), ttl).keys().collect::<Vec<_>>(), ["ml/b"], "ml/a expired, not extended by the second sighting");
        assert!(r.note("ml/a", "n1", &offered(&["n5"]), at(301), ttl), "refused again after expiry: new again");
        assert_eq!(r.active(at(401), ttl).get("ml/a"), Some(&set(&["n5"])));
        assert!(r.active(at(601), ttl).is_empty());

        let mut off = SchedulerRefusals::default();
        assert!(off.note("ml/a", "n1", &offered(&["n2"]), at(0), Duration::ZERO));
        assert!(off.note("ml/a", "n1", &offered(&["n2"]), at(0), Duration::ZERO));
        assert!(off.active(at(0), Duration::ZERO).is_empty());
    }

    /// A pod left out of the plan is said at WARN the first round it is, not the next ones
    /// while the reason stays; again when the reason changes or after it was fixed and broke
    /// again; a terminating pod never.
    #[test]
    fn a_pod_left_out_is_warned_about_once_per_reason() {
        use crate::watch::SkippedPod;
        let pod = |uid: &str, why: &str, routine: bool| SkippedPod {
            what: format!("pod ml/{uid}"),
            uid: Some(uid.into()),
            why: why.into(),
            routine,
        };
        let mut warned = BTreeSet::new();
        let round1 = [pod("a", "offline pod without xshare.io/memory-mib", false), pod("t", "terminating", true)];
        assert_eq!(first_sightings(&mut warned, &round1), vec![&round1[0]]);
        assert!(first_sightings(&mut warned, &round1).is_empty(), "the same again: not said again");
        let round3 = [pod("a", "bad xshare.io/memory-mib `x`", false)];
        assert_eq!(first_sightings(&mut warned, &round3), vec![&round3[0]], "another reason");
        assert!(first_sightings(&mut warned, &[]).is_empty(), "fixed");
        assert_eq!(first_sightings(&mut warned, &round3), vec![&round3[0]], "broken again");
    }
}
