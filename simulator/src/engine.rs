//! The discrete-event engine: online services come and go, offline jobs arrive, placement
//! rounds call the real planner (`cluster_matcher::plan::plan_round`), and every tick each
//! online GPU is evaluated with the interference model, sampled by the real health machine
//! (`sysmonitor::health::Machine` on the simulated clock) and, in protected modes, throttled
//! by the real throttle controller (see [`crate::throttle`]).
//!
//! Events are ordered by (time, class, sequence): online ends and starts, then arrivals,
//! then job completions, then rounds, then ticks. Job progress and the per-GPU accounting are
//! integrated lazily between events at the rate the last tick set; a job's completion is an
//! exact event inside a tick.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use cluster_matcher::plan::alibaba::Assumptions;
use cluster_matcher::plan::{
    plan_round, ClusterSpec, GpuHealth, GpuRef, NodeSpec, OfflineJob, OnlineWorkload, Workloads,
};
use cluster_matcher::policy::{JobFeedback, Policy, GANDIVA_KEEP};
use cluster_matcher::predictor::SpeedPredictor;
use mps_manager::budget::{Allocator, BudgetConfig};
use serde::Serialize;
use sysmonitor::health::{Action, Input, Machine, MachineConfig, Metrics, State};
use sysmonitor::monitor::Occupancy;

use crate::metrics::{Accum, Report};
use crate::model::{evaluate, OnlineLoad, Pair, Share, View};
use crate::online::Service;
use crate::rng::{hash2, Rng};
use crate::throttle::{settle_multi, ThrottleSettings, ThrottleState};
use crate::trace::{JobTypes, Trace};

/// Gandiva in the simulator: migrations per job before it stays where it lands.
pub const GANDIVA_MAX_MIGRATIONS: u32 = 3;

/// Node sharing modes (MuxFlow §7.3-7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
pub enum Mode {
    /// Online services only; offline jobs never run (the latency reference).
    OnlineOnly,
    /// Gandiva-style time slicing, no protection, no matching.
    TimeSharing,
    /// Priority-based time sharing (AntMan / PAI): online preempts offline; no matching.
    PbTimeSharing,
    /// Protection (health machine + throttle), dynamic SM allocation, KM matching.
    Muxflow,
    /// MuxFlow without dynamic SM allocation: a static cap sized for the online peak.
    MuxflowS,
    /// MuxFlow without matching: pair-blind first-fit placement.
    MuxflowM,
    /// Protection only.
    MuxflowSM,
}

impl Mode {
    /// Every mode, in the order the comparison table prints them.
    pub const ALL: [Mode; 7] = [
        Mode::OnlineOnly,
        Mode::TimeSharing,
        Mode::PbTimeSharing,
        Mode::Muxflow,
        Mode::MuxflowS,
        Mode::MuxflowM,
        Mode::MuxflowSM,
    ];

    /// Name of the mode as MuxFlow's figures call it (table rows, JSON `mode`).
    pub fn label(self) -> &'static str {
        match self {
            Mode::OnlineOnly => "Online-only",
            Mode::TimeSharing => "Time-sharing",
            Mode::PbTimeSharing => "PB-time-sharing",
            Mode::Muxflow => "MuxFlow",
            Mode::MuxflowS => "MuxFlow-S",
            Mode::MuxflowM => "MuxFlow-M",
            Mode::MuxflowSM => "MuxFlow-S-M",
        }
    }
    fn runs_offline(self) -> bool {
        self != Mode::OnlineOnly
    }
    /// Health-gated admission, health evictions, the throttle.
    fn protected(self) -> bool {
        matches!(
            self,
            Mode::Muxflow | Mode::MuxflowS | Mode::MuxflowM | Mode::MuxflowSM
        )
    }
    fn dynamic_sm(self) -> bool {
        matches!(self, Mode::Muxflow | Mode::MuxflowM)
    }
    /// Predicted-throughput matching that may also move running jobs.
    fn matching(self) -> bool {
        matches!(self, Mode::Muxflow | Mode::MuxflowS)
    }
}

/// Everything a run depends on besides the trace.
#[derive(Debug, Clone, Serialize)]
pub struct SimConfig {
    /// The sharing scheme simulated.
    pub mode: Mode,
    /// The planner's offline allocation policy (`cluster.json` `policy`); matching modes only
    /// (the others place pair-blind).
    pub policy: Policy,
    /// Offline jobs are spread over this many tenants (seeded by name), for DRF and fairness.
    pub tenants: u32,

    /// Seed of every random draw (services, SLOs, tenants, job types), so runs are reproducible.
    pub seed: u64,
    /// Seconds between ticks (model evaluation, health sample, throttle settling).
    pub tick_s: f64,
    /// Seconds between placement rounds (a round with no waiting job is skipped).
    pub round_s: f64,
    /// Matching modes re-match running jobs too (and may move them) every this many rounds;
    /// 0 = never (running jobs stay; rounds place waiting jobs on GPUs without one).
    pub rematch_every: u64,
    /// Solo work (s) an offline job loses when evicted, moved or its GPU goes away.
    pub restart_penalty_s: f64,
    /// A request is an SLO violation when its tick's latency exceeds this many times the
    /// service's latency alone at the same rate (or the service saturates).
    pub slo_slowdown: f64,
    /// Per-online-workload SLOs: each service gets its own p99 slowdown target, seeded
    /// uniformly in this range, and violations are judged against it (`None`: every service
    /// has `slo_slowdown`).
    pub slo_range: Option<(f64, f64)>,
    /// The offline SM budget follows each service's SLO slack (MuxFlow modes): a GPU whose
    /// online slowdown is well under its service's target lets the budget grow (x1.1 a tick,
    /// up to 3x the allocator's), one over it shrinks it (x0.7, down to 0.1x).
    pub slo_follow_slack: bool,
    /// Offline jobs an online GPU may host at once (`cluster.json` `max_offline_per_gpu`,
    /// handed to the planner; the interference model is [`crate::model::evaluate_multi`]).
    /// MuxFlow modes only: the time-sharing modes keep one.
    pub max_offline_per_gpu: u32,
    /// Global multiplier on every GPU's offline SM budget (MuxFlow modes; 1 = mps-manager's
    /// allocator as shipped). Sweeping it trades oversold GPU for SLO violations the same way
    /// everywhere: the baseline that `--match-violations` compares the per-service slack loop
    /// with at equal violations.
    pub budget_scale: f64,
    /// PB-time-sharing: relative cost of preempting an offline slice per online request.
    pub pb_switch: f64,
    /// Offline memory at gpu_milli = 1000 (MiB); scaled by gpu_milli.
    pub offline_memory_mib: u64,
    /// Smallest offline SM cap (fraction); matches the planner's `min_offline_sm_percent`.
    pub min_cap: f64,
    /// The real health machine's thresholds and timing.
    pub health: MachineConfig,
    /// The throttle's control settings.
    pub throttle: ThrottleSettings,
    /// mps-manager's dynamic SM allocation settings (its shipped defaults unless changed).
    pub budget: BudgetConfig,
    /// Stop at this simulated time (s); `None` = when every offline job is done, or 7 days
    /// after the last arrival.
    pub horizon_s: Option<f64>,
}

impl SimConfig {
    /// Offline jobs per GPU in this mode: `max_offline_per_gpu` (at least 1) in the MuxFlow
    /// modes, 1 in the others (their time-slicing models take one job).
    pub fn offline_per_gpu(&self) -> u32 {
        if self.mode.protected() {
            self.max_offline_per_gpu.max(1)
        } else {
            1
        }
    }

    /// The shipped settings for `mode` (tick, round period, throttle, budgets).
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            policy: Policy::MaxThroughput,
            tenants: 4,
            seed: 1,
            tick_s: 30.0,
            round_s: 60.0,
            rematch_every: 0,
            restart_penalty_s: 60.0,
            slo_slowdown: 1.5,
            slo_range: None,
            slo_follow_slack: false,
            budget_scale: 1.0,
            max_offline_per_gpu: 1,
            pb_switch: 0.03,
            offline_memory_mib: 6144,
            min_cap: 0.1,
            health: MachineConfig::default(),
            throttle: ThrottleSettings::default(),
            budget: BudgetConfig::default(),
            horizon_s: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    OnlineEnd(usize),
    OnlineStart(usize),
    Arrive(usize),
    Done(usize, u32),
    Round,
    Tick,
}

#[derive(Debug, PartialEq)]
struct Timed(f64, Ev, u64);

impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap.
        o.0.total_cmp(&self.0)
            .then_with(|| o.1.cmp(&self.1))
            .then_with(|| o.2.cmp(&self.2))
    }
}

struct Gpu {
    at: GpuRef,
    model_type: String,
    mem_mib: u64,
    online: Option<usize>,
    /// Offline jobs on the GPU, in the order placed (at most `max_offline_per_gpu`).
    jobs: Vec<usize>,
    machine: Machine,
    /// The throttle of each offline process, `throttles[i]` that of `jobs[i]` (created at the
    /// job's first evaluation, so possibly shorter than `jobs`).
    throttles: Vec<ThrottleState>,
    budget: Allocator,
    view: View,
    since: f64,
    /// The online service's own SM activity (percent) at the last tick.
    online_sm_pct: f64,
    /// The SM share (percent) the offline side is held to at the last evaluation, as the
    /// MPS manager publishes it in the ledger (`None`: no MPS cap, time-sharing modes).
    offline_cap_pct: Option<f64>,
    qps: f64,
    /// Multiplier of the offline SM budget that follows the service's SLO slack.
    slack_scale: f64,
}

struct Inst {
    pod: usize,
    name: String,
    service: usize,
    mem_mib: u64,
    gpus: Vec<usize>,
}

#[derive(Debug, Clone)]
struct Job {
    name: String,
    tenant: String,
    job_type: usize,
    d_off: f64,
    mem_mib: u64,
    spec: Vec<String>,
    arrival: f64,
    duration: f64,
    done: f64,
    rate: f64,
    since: f64,
    gpu: Option<usize>,
    arrived: bool,
    finish: Option<f64>,
    epoch: u32,
    placed_s: f64,
    evictions: u32,
    moves: u32,
    breaks: u32,
    /// Gandiva: the current pair was judged (kept, or the job migrated).
    introspected: bool,
}

/// One simulation run.
pub struct Sim<'a> {
    cfg: SimConfig,
    trace: &'a Trace,
    types: &'a JobTypes,
    predictor: &'a SpeedPredictor,
    cluster: ClusterSpec,
    gpus: Vec<Gpu>,
    node_gpus: Vec<std::ops::Range<usize>>,
    gpu_index: HashMap<GpuRef, usize>,
    services: Vec<Service>,
    /// Each service's SLO: p99 latency at most this many times alone.
    slo: Vec<f64>,
    insts: Vec<Option<Inst>>,
    jobs: Vec<Job>,
    job_index: HashMap<String, usize>,
    pending: Vec<usize>,
    heap: BinaryHeap<Timed>,
    seq: u64,
    now: f64,
    round: u64,
    /// Rounds seen, planned or not.
    round_no: u64,
    acc: Accum,
    /// Latency accounting stops here (the last arrival), the same for every mode.
    latency_until: f64,
    horizon: f64,
    remaining: usize,
}

impl Gpu {
    /// Takes job `j` and its throttle off the GPU.
    fn remove_job(&mut self, j: usize) {
        if let Some(i) = self.jobs.iter().position(|&x| x == j) {
            self.jobs.remove(i);
            if i < self.throttles.len() {
                self.throttles.remove(i);
            }
        }
    }
}

fn health_of(s: State) -> GpuHealth {
    match s {
        State::Init => GpuHealth::Init,
        State::Healthy => GpuHealth::Healthy,
        State::Unhealthy => GpuHealth::Unhealthy,
        State::Overlimit => GpuHealth::Overlimit,
        State::Disabled => GpuHealth::Disabled,
    }
}

impl<'a> Sim<'a> {
    /// Sets up a run: nodes and GPUs from the trace, seeded services and jobs, nothing placed yet.
    pub fn new(
        cfg: SimConfig,
        trace: &'a Trace,
        types: &'a JobTypes,
        predictor: &'a SpeedPredictor,
    ) -> Self {
        let asm = Assumptions::default();
        let nodes: Vec<NodeSpec> = trace
            .nodes
            .iter()
            .map(|n| NodeSpec {
                name: n.name.clone(),
                gpu_type: n.model.clone(),
                gpus: n.gpus,
                gpu_memory_mib: *asm
                    .gpu_memory_mib
                    .get(&n.model)
                    .unwrap_or(&asm.default_gpu_memory_mib),
                predictor_gpu_type: Some(
                    asm.predictor_type
                        .get(&n.model)
                        .unwrap_or(&asm.default_predictor_type)
                        .clone(),
                ),
            })
            .collect();
        let cluster = ClusterSpec {
            round_period_s: cfg.round_s.max(1.0) as u64,
            state_dir: None,
            stale_after_s: 30,
            min_offline_sm_percent: cfg.min_cap * 100.0,
            memory_headroom_mib: 512,
            max_offline_memory_fraction: 0.4,
            unprofiled_weight: 0.3,
            cells: None,
            cells_state: None,
            max_offline_per_gpu: cfg.offline_per_gpu() as usize,
            policy: cfg.policy,
            scheduler_refusal_ttl_s: 300,
            nodes,
            tenants: Default::default(),
        };
        let mut gpus = Vec::new();
        let mut node_gpus = Vec::new();
        let mut gpu_index = HashMap::new();
        for n in &cluster.nodes {
            let first = gpus.len();
            for i in 0..n.gpus {
                let at = GpuRef {
                    node: n.name.clone(),
                    gpu: i,
                };
                gpu_index.insert(at.clone(), gpus.len());
                gpus.push(Gpu {
                    at,
                    model_type: n.model_type(),
                    mem_mib: n.gpu_memory_mib,
                    online: None,
                    jobs: Vec::new(),
                    machine: Machine::new(),
                    throttles: Vec::new(),
                    budget: Allocator::default(),
                    view: View::default(),
                    since: 0.0,
                    online_sm_pct: 0.0,
                    offline_cap_pct: None,
                    slack_scale: 1.0,
                    qps: 0.0,
                });
            }
            node_gpus.push(first..gpus.len());
        }
        let services = trace
            .online
            .iter()
            .map(|p| {
                Service::seeded(
                    cfg.seed,
                    &p.name,
                    p.milli,
                    types.assign(cfg.seed, &format!("online:{}", p.name)),
                )
            })
            .collect();
        let slo = trace
            .online
            .iter()
            .map(|p| match cfg.slo_range {
                Some((lo, hi)) => Rng::new(hash2(cfg.seed, &format!("slo:{}", p.name))).range(lo, hi),
                None => cfg.slo_slowdown,
            })
            .collect();
        let mut jobs = Vec::new();
        let mut job_index = HashMap::new();
        if cfg.mode.runs_offline() {
            for p in &trace.offline {
                let mut rng = Rng::new(hash2(cfg.seed, &format!("offline:{}", p.name)));
                job_index.insert(p.name.clone(), jobs.len());
                let tenant = format!("t{}", hash2(cfg.seed, &format!("tenant:{}", p.name)) % u64::from(cfg.tenants.max(1)));
                jobs.push(Job {
                    name: p.name.clone(),
                    tenant,
                    job_type: types.assign(cfg.seed, &format!("offline:{}", p.name)),
                    d_off: rng.range(0.6, 1.0),
                    mem_mib: (cfg.offline_memory_mib * u64::from(p.milli.min(1000)) / 1000)
                        .max(256),
                    spec: p.spec.clone(),
                    arrival: p.arrival,
                    duration: p.duration,
                    done: 0.0,
                    rate: 0.0,
                    since: p.arrival,
                    gpu: None,
                    arrived: false,
                    finish: None,
                    epoch: 0,
                    placed_s: 0.0,
                    evictions: 0,
                    moves: 0,
                    breaks: 0,
                    introspected: false,
                });
            }
        }
        let latency_until = trace.last_arrival();
        let horizon = cfg.horizon_s.unwrap_or(latency_until + 7.0 * 86_400.0);
        let remaining = jobs.len();
        let mut sim = Self {
            cfg,
            trace,
            types,
            predictor,
            cluster,
            gpus,
            node_gpus,
            gpu_index,
            services,
            slo,
            insts: (0..trace.online.len()).map(|_| None).collect(),
            jobs,
            job_index,
            pending: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            round: 0,
            round_no: 0,
            acc: Accum::default(),
            latency_until,
            horizon,
            remaining,
        };
        for (i, p) in trace.online.iter().enumerate() {
            sim.push(p.start, Ev::OnlineStart(i));
        }
        for j in 0..sim.jobs.len() {
            let t = sim.jobs[j].arrival;
            sim.push(t, Ev::Arrive(j));
        }
        sim.push(0.0, Ev::Tick);
        if sim.cfg.mode.runs_offline() {
            sim.push(0.0, Ev::Round);
        }
        sim
    }

    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Timed(t, ev, self.seq));
    }

    /// Runs to the end; `progress(now, end)` is called every few thousand events.
    pub fn run(mut self, progress: impl FnMut(f64, f64)) -> Report {
        self.advance(f64::INFINITY, progress);
        self.report()
    }

    /// Processes events up to simulated time `until` (or the end of the run).
    pub fn advance(&mut self, until: f64, mut progress: impl FnMut(f64, f64)) {
        let mut n = 0u64;
        while let Some(Timed(t, ..)) = self.heap.peek() {
            let t = *t;
            if t > until || t > self.horizon || self.over(t) {
                break;
            }
            let Some(Timed(t, ev, _)) = self.heap.pop() else {
                break;
            };
            self.now = t;
            n += 1;
            if n.is_multiple_of(4096) {
                progress(t, self.latency_until);
            }
            match ev {
                Ev::OnlineStart(i) => self.online_start(i),
                Ev::OnlineEnd(i) => self.online_end(i),
                Ev::Arrive(j) => {
                    self.jobs[j].arrived = true;
                    self.pending.push(j);
                }
                Ev::Done(j, epoch) => self.job_done(j, epoch),
                Ev::Round => {
                    self.plan();
                    let next = t + self.cfg.round_s;
                    self.push(next, Ev::Round);
                }
                Ev::Tick => {
                    self.tick();
                    let next = t + self.cfg.tick_s;
                    self.push(next, Ev::Tick);
                }
            }
        }
    }

    fn over(&self, t: f64) -> bool {
        if self.cfg.mode.runs_offline() {
            self.remaining == 0 && t > self.latency_until
        } else {
            t > self.latency_until
        }
    }

    /// Simulated time of the last event processed.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Where offline job `name` runs now.
    pub fn job_gpu(&self, name: &str) -> Option<&GpuRef> {
        let j = *self.job_index.get(name)?;
        self.jobs[j].gpu.map(|g| &self.gpus[g].at)
    }

    /// When offline job `name` finished.
    pub fn job_finish(&self, name: &str) -> Option<f64> {
        self.jobs[*self.job_index.get(name)?].finish
    }

    /// Health state of a GPU.
    pub fn gpu_state(&self, at: &GpuRef) -> Option<State> {
        self.gpu_index
            .get(at)
            .map(|&g| self.gpus[g].machine.state())
    }

    /// Ends the run at the current time and computes its report.
    pub fn report(mut self) -> Report {
        let end = self.now;
        for g in 0..self.gpus.len() {
            self.flush(g, end);
        }
        self.finish(end)
    }

    fn online_start(&mut self, i: usize) {
        let p = &self.trace.online[i];
        let want = p.gpus as usize;
        let fits = |g: &Gpu, nodes: &[NodeSpec], ni: usize| {
            g.online.is_none() && (p.spec.is_empty() || p.spec.contains(&nodes[ni].gpu_type))
        };
        let mut chosen = None;
        for (ni, r) in self.node_gpus.iter().enumerate() {
            let free: Vec<usize> = r
                .clone()
                .filter(|&g| fits(&self.gpus[g], &self.cluster.nodes, ni))
                .take(want)
                .collect();
            if free.len() == want {
                chosen = Some(free);
                break;
            }
        }
        let Some(gs) = chosen else {
            self.acc.online_unplaced += 1;
            return;
        };
        for (k, &g) in gs.iter().enumerate() {
            let gpu = &mut self.gpus[g];
            gpu.online = Some(i);
            gpu.machine = Machine::new();
            gpu.budget = Allocator::default();
            gpu.slack_scale = 1.0;
            gpu.since = self.now;
            gpu.view = View::default();
            let _ = k;
        }
        let mem = |g: &Gpu| (g.mem_mib as f64 * (0.2 + 0.3 * f64::from(p.milli) / 1000.0)) as u64;
        let mem_mib = mem(&self.gpus[gs[0]]);
        self.insts[i] = Some(Inst {
            pod: i,
            name: p.name.clone(),
            service: i,
            mem_mib,
            gpus: gs.clone(),
        });
        self.acc.online_placed += 1;
        for &g in &gs {
            self.evaluate(g, false);
        }
        let end = p.end;
        self.push(end, Ev::OnlineEnd(i));
    }

    fn online_end(&mut self, i: usize) {
        let Some(inst) = self.insts[i].take() else {
            return;
        };
        for &g in &inst.gpus {
            self.flush(g, self.now);
            for j in self.gpus[g].jobs.clone() {
                self.unplace(j, "online gone");
            }
            let gpu = &mut self.gpus[g];
            gpu.online = None;
            gpu.view = View::default();
            gpu.throttles.clear();
        }
        let _ = inst.pod;
    }

    /// Integrates GPU `g`'s accounting and its job's progress up to `t`.
    fn flush(&mut self, g: usize, t: f64) {
        let gpu = &mut self.gpus[g];
        let dt = t - gpu.since;
        gpu.since = t;
        if dt <= 0.0 || gpu.online.is_none() {
            return;
        }
        let lat_dt = (self.latency_until.min(t) - (t - dt)).max(0.0);
        let slo = gpu
            .online
            .map_or(self.cfg.slo_slowdown, |oi| self.slo[self.insts[oi].as_ref().map_or(oi, |x| x.service)]);
        self.acc.add_gpu(
            t - 0.5 * dt,
            &gpu.view,
            gpu.qps,
            dt,
            lat_dt,
            slo,
            !gpu.jobs.is_empty(),
        );
        for &j in &gpu.jobs {
            let job = &mut self.jobs[j];
            let d = t - job.since;
            if d > 0.0 {
                job.done = (job.done + job.rate * d).min(job.duration);
                job.placed_s += d;
                job.since = t;
            }
        }
    }

    /// Re-evaluates GPU `g` from now on; `sample` also feeds the health machine.
    fn evaluate(&mut self, g: usize, sample: bool) {
        self.flush(g, self.now);
        let Some(oi) = self.gpus[g].online else {
            return;
        };
        let svc = &self.services[self.insts[oi].as_ref().map_or(oi, |x| x.service)];
        let qps = svc.diurnal.qps(self.now);
        let load = OnlineLoad {
            qps,
            s0: svc.s0,
            d_on: svc.d_on,
        };
        let online_sm = (qps * svc.s0).min(1.0) * svc.d_on;
        let mode = self.cfg.mode;
        let jobs = self.gpus[g].jobs.clone();
        let mut offline_cap_pct = None;
        let pairs: Vec<Pair> = jobs
            .iter()
            .map(|&j| {
                let jb = &self.jobs[j];
                let (go, gn, _) =
                    self.types
                        .pair(&self.gpus[g].model_type, jb.job_type, svc.job_type);
                Pair {
                    d_on: svc.d_on,
                    d_off: jb.d_off,
                    gavel_off: go,
                    gavel_on: gn,
                }
            })
            .collect();
        let (view, progress) = match pairs.first() {
            None => (evaluate(&load, &dummy_pair(), Share::None), Vec::new()),
            Some(&pair) => {
                let single = |v: View| {
                    let p = v.progress;
                    (v, vec![p])
                };
                match mode {
                    Mode::OnlineOnly => single(evaluate(&load, &pair, Share::None)),
                    Mode::TimeSharing => single(evaluate(&load, &pair, Share::Slices)),
                    Mode::PbTimeSharing => single(evaluate(
                        &load,
                        &pair,
                        Share::Priority {
                            switch: self.cfg.pb_switch,
                        },
                    )),
                    _ => {
                        // Dynamic SM allocation: mps-manager's own allocator (complement of
                        // the online SM activity minus headroom, within limits, smoothed);
                        // without it (-S) the same rule applied once to the online peak.
                        let b = &self.cfg.budget;
                        let pct = if mode.dynamic_sm() {
                            let gpu = &mut self.gpus[g];
                            let safe =
                                matches!(gpu.machine.state(), State::Healthy | State::Unhealthy);
                            if sample || gpu.budget.applied().is_none() {
                                gpu.budget.update(b, online_sm * 100.0, safe);
                            }
                            gpu.budget.applied().unwrap_or(b.min_pct)
                        } else {
                            (100.0 - svc.peak_sm() * 100.0 - b.headroom_pct)
                                .clamp(b.min_pct, b.max_pct)
                        };
                        let pct = if self.cfg.slo_follow_slack {
                            (pct * self.gpus[g].slack_scale).clamp(b.min_pct, 100.0)
                        } else {
                            pct
                        };
                        let pct = if self.cfg.budget_scale != 1.0 {
                            (pct * self.cfg.budget_scale).clamp(0.0, 100.0)
                        } else {
                            pct
                        };
                        let cap = (pct / 100.0).max(self.cfg.min_cap);
                        let gpu = &mut self.gpus[g];
                        // A job starting now gets what the jobs already running leave of the
                        // budget (the shim's rule, `node_ledger::jobs::start_share`), never
                        // below the floor; MPS keeps it for the job's life. Jobs placed at the
                        // same instant (one planning round) see each other too: the shim claims
                        // its share at library load under the ledger's claims lock
                        // (`node_ledger::claims`), so starts are taken one after the other.
                        while gpu.throttles.len() < gpu.jobs.len() {
                            let held = crate::throttle::jobs_of(&gpu.throttles);
                            let start = node_ledger::jobs::start_share(cap, &held, u64::MAX);
                            let own = start.max(self.cfg.min_cap);
                            gpu.throttles.push(ThrottleState::new(&self.cfg.throttle, own));
                        }
                        // The monitor takes off the jobs' caps, at most the budget.
                        offline_cap_pct = sysmonitor::ledger::offline_cap_pct(
                            Some(cap * 100.0),
                            &crate::throttle::jobs_of(&gpu.throttles),
                        );
                        settle_multi(
                            &mut gpu.throttles,
                            &self.cfg.throttle,
                            &load,
                            &pairs,
                            cap,
                            self.cfg.tick_s,
                        )
                    }
                }
            }
        };
        if sample && !jobs.is_empty() && self.cfg.slo_follow_slack {
            // Slack of the service's own SLO (p99 / alone = mean / alone for the model's
            // exponential latencies): grow the budget with room to spare, shrink it when over.
            let target = self.slo[self.insts[oi].as_ref().map_or(oi, |x| x.service)];
            let slowdown = if view.saturated { f64::INFINITY } else { view.latency_ms / view.latency_alone_ms.max(1e-9) };
            let gpu = &mut self.gpus[g];
            if slowdown > target {
                gpu.slack_scale = (gpu.slack_scale * 0.7).max(0.1);
            } else if slowdown < 0.8 * target {
                gpu.slack_scale = (gpu.slack_scale * 1.1).min(3.0);
            }
        }
        let gpu = &mut self.gpus[g];
        gpu.view = view;
        gpu.qps = qps;
        gpu.online_sm_pct = online_sm * 100.0;
        gpu.offline_cap_pct = offline_cap_pct;
        let mem_used = {
            let on = self.insts[oi].as_ref().map_or(0, |x| x.mem_mib);
            let off: u64 = jobs.iter().map(|&j| self.jobs[j].mem_mib).sum();
            100.0 * (on + off) as f64 / gpu.mem_mib.max(1) as f64
        };
        if sample {
            let m = judged_sample(
                &self.cfg.health,
                &view,
                mem_used,
                occupancy(!jobs.is_empty(), offline_cap_pct),
            );
            let step = gpu.machine.step(
                &self.cfg.health,
                (self.now * 1000.0) as u64,
                Input::Sample(m),
            );
            let evict = step
                .actions
                .iter()
                .any(|a| matches!(a, Action::EvictOffline { .. }));
            self.acc.health_transitions += step.transitions.len() as u64;
            if evict && mode.protected() && !jobs.is_empty() {
                for &j in &jobs {
                    self.acc.evictions += 1;
                    self.jobs[j].evictions += 1;
                    self.unplace(j, "evicted");
                }
                // The GPU runs the online service alone for the rest of the tick.
                self.evaluate(g, false);
                return;
            }
        }
        for (&j, &rate) in jobs.iter().zip(&progress) {
            let t = self.now;
            let jb = &mut self.jobs[j];
            jb.rate = rate;
            jb.since = t;
            jb.epoch += 1;
            if rate > 0.0 {
                let left = (jb.duration - jb.done).max(0.0) / rate;
                let e = jb.epoch;
                self.push(t + left, Ev::Done(j, e));
            }
        }
    }

    fn tick(&mut self) {
        for g in 0..self.gpus.len() {
            if self.gpus[g].online.is_some() {
                self.evaluate(g, true);
            }
        }
        self.acc.ticks += 1;
    }

    fn job_done(&mut self, j: usize, epoch: u32) {
        if self.jobs[j].epoch != epoch || self.jobs[j].finish.is_some() {
            return;
        }
        let Some(g) = self.jobs[j].gpu else { return };
        self.flush(g, self.now);
        let jb = &mut self.jobs[j];
        jb.done = jb.duration;
        jb.finish = Some(self.now);
        jb.gpu = None;
        self.gpus[g].remove_job(j);
        self.remaining -= 1;
        self.evaluate(g, false);
    }

    /// Takes job `j` off its GPU (it keeps its progress less the restart penalty) and back
    /// into the queue.
    fn unplace(&mut self, j: usize, why: &str) {
        let Some(g) = self.jobs[j].gpu else { return };
        self.flush(g, self.now);
        let pen = self.cfg.restart_penalty_s;
        let jb = &mut self.jobs[j];
        jb.done = (jb.done - pen).max(0.0);
        jb.gpu = None;
        jb.rate = 0.0;
        jb.epoch += 1;
        match why {
            "evicted" => {}
            "moved" => jb.moves += 1,
            _ => jb.breaks += 1,
        }
        self.gpus[g].remove_job(j);
        self.pending.push(j);
    }

    fn place(&mut self, j: usize, g: usize) {
        self.flush(g, self.now);
        self.pending.retain(|&x| x != j);
        let jb = &mut self.jobs[j];
        jb.gpu = Some(g);
        jb.since = self.now;
        jb.introspected = false;
        self.gpus[g].jobs.push(j);
        self.evaluate(g, false);
    }

    /// One placement round through the real planner.
    fn plan(&mut self) {
        self.pending
            .retain(|&j| self.jobs[j].finish.is_none() && self.jobs[j].gpu.is_none());
        let mode = self.cfg.mode;
        let matching = mode.matching();
        let rematch = matching
            && self.cfg.rematch_every > 0
            && self.round_no.is_multiple_of(self.cfg.rematch_every);
        self.round_no += 1;
        // Gandiva: each new pair is judged once, at the first round after it was tried; one
        // measured below the keep threshold is re-planned (the policy migrates it), up to
        // GANDIVA_MAX_MIGRATIONS times per job (then it stays where it lands).
        let mut introspect: Vec<usize> = Vec::new();
        if matching && self.cfg.policy == Policy::Gandiva {
            for (j, jb) in self.jobs.iter_mut().enumerate() {
                if jb.gpu.is_some() && !jb.introspected {
                    jb.introspected = true;
                    if jb.rate < GANDIVA_KEEP && jb.moves + jb.breaks < GANDIVA_MAX_MIGRATIONS {
                        introspect.push(j);
                    }
                }
            }
        }
        if self.pending.is_empty() && !rematch && introspect.is_empty() {
            return;
        }
        let k_per_gpu = self.cfg.offline_per_gpu() as usize;
        let mut online = Vec::new();
        // Jobs running on GPUs offered to this round: the planner must see them (`current`)
        // to count them against the GPU's room.
        let mut running_on_offered: Vec<usize> = Vec::new();
        for (g, gpu) in self.gpus.iter().enumerate() {
            let Some(oi) = gpu.online else { continue };
            let full = gpu.jobs.len() >= k_per_gpu;
            if !rematch && full && !gpu.jobs.iter().any(|j| introspect.contains(j)) {
                continue;
            }
            let Some(inst) = self.insts[oi].as_ref() else {
                continue;
            };
            running_on_offered.extend(&gpu.jobs);
            let svc = &self.services[inst.service];
            let k = inst.gpus.iter().position(|&x| x == g).unwrap_or(0);
            online.push(OnlineWorkload {
                name: if k == 0 {
                    inst.name.clone()
                } else {
                    format!("{}#{k}", inst.name)
                },
                tenant: "ls".into(),
                at: Some(gpu.at.clone()),
                gpu_type: None,
                group: None,
                memory_mib: inst.mem_mib,
                // As the monitor publishes it: in 5% steps.
                sm_activity_percent: ((gpu.online_sm_pct / 5.0).round() * 5.0).clamp(0.0, 100.0),
                profile: matching.then(|| self.types.profiles[svc.job_type].clone()),
            });
        }
        let mut offline = Vec::new();
        let mut consider: Vec<usize> = self.pending.clone();
        if rematch {
            consider.extend((0..self.jobs.len()).filter(|&j| self.jobs[j].gpu.is_some()));
        }
        consider.extend(&introspect);
        if k_per_gpu > 1 {
            consider.extend(&running_on_offered);
        }
        consider.sort_unstable();
        consider.dedup();
        if consider.is_empty() {
            return;
        }
        for &j in &consider {
            let jb = &self.jobs[j];
            offline.push(OfflineJob {
                name: jb.name.clone(),
                tenant: jb.tenant.clone(),
                memory_mib: jb.mem_mib,
                gpu_types: jb.spec.clone(),
                profile: matching.then(|| self.types.profiles[jb.job_type].clone()),
                current: jb.gpu.map(|g| self.gpus[g].at.clone()),
                held_memory_quota_mib: None,
                allowed_nodes: None,
                feedback: JobFeedback {
                    remaining_s: Some((jb.duration - jb.done).max(1.0)),
                    measured_normalized: jb.gpu.map(|_| jb.rate),
                },
            });
        }
        let workloads = Workloads { online, offline };
        let gpus = &self.gpus;
        let index = &self.gpu_index;
        let protected = mode.protected();
        let health = |at: &GpuRef| {
            if !protected {
                return GpuHealth::Healthy;
            }
            index
                .get(at)
                .map_or(GpuHealth::Missing, |&g| health_of(gpus[g].machine.state()))
        };
        let plan = plan_round(
            &self.cluster,
            &workloads,
            self.predictor,
            &health,
            self.round,
        );
        self.round += 1;
        self.acc.rounds += 1;
        if std::env::var_os("SIM_DEBUG").is_some() {
            eprintln!(
                "t={} plan: {}",
                self.now,
                serde_json::to_string(&plan).unwrap_or_default()
            );
        }
        self.acc.plan_ms += plan.stats.weights_ms + plan.stats.matching_ms;
        // Moves and breaks first, then placements.
        let mut target: Vec<(usize, usize)> = Vec::new();
        for a in &plan.assignments {
            let (Some(&j), Some(&g)) = (self.job_index.get(&a.offline), self.gpu_index.get(&a.at))
            else {
                continue;
            };
            target.push((j, g));
        }
        // Jobs handed to the round only so that it counts them against their GPU's room stay
        // where they run (as running jobs do with one job per GPU): without re-matching, the
        // simulator does not let a round move them.
        let stay: Vec<usize> = if rematch {
            Vec::new()
        } else {
            running_on_offered.iter().copied().filter(|j| !introspect.contains(j)).collect()
        };
        for b in &plan.breaks {
            if let Some(&j) = self.job_index.get(&b.offline) {
                if stay.contains(&j) && self.jobs[j].gpu.is_some_and(|g| self.gpus[g].online.is_some()) {
                    continue;
                }
                if self.jobs[j].gpu.is_some() {
                    let moved = target.iter().any(|&(x, _)| x == j);
                    self.unplace(j, if moved { "moved" } else { "break" });
                    self.acc.plan_breaks += 1;
                }
            }
        }
        for (j, g) in target {
            if self.jobs[j].gpu == Some(g) || (stay.contains(&j) && self.jobs[j].gpu.is_some()) {
                continue;
            }
            if self.gpus[g].jobs.len() >= k_per_gpu || self.gpus[g].online.is_none() {
                continue;
            }
            self.place(j, g);
            self.acc.placements += 1;
        }
    }

    fn finish(self, end: f64) -> Report {
        let mut acc = self.acc;
        for jb in &self.jobs {
            acc.add_job(
                &jb.tenant,
                jb.arrival,
                jb.finish,
                jb.duration,
                jb.done,
                jb.placed_s,
                jb.moves,
                jb.breaks,
            );
        }
        Report::new(
            self.cfg.mode.label(),
            self.cfg.policy,
            &self.cfg,
            end,
            self.latency_until,
            acc,
            self.jobs.len(),
        )
    }
}

/// Who is on a simulated GPU, as sysmonitor's monitor finds it from NVML's process list and
/// the ledger: an online service always runs there (offline jobs run only beside one), so a
/// GPU is co-located while an offline job runs on it, with the SM share the offline side is
/// held to (`None` without an MPS cap), and online-only otherwise.
pub fn occupancy(offline_running: bool, offline_cap_pct: Option<f64>) -> Occupancy {
    if offline_running {
        Occupancy::Colocated { offline_cap_pct }
    } else {
        Occupancy::OnlineOnly
    }
}

/// The sample the health machine steps on, fed the way sysmonitor's monitor feeds it
/// (`Monitor::tick`): the whole reading first; only when the product's own judgement
/// ([`sysmonitor::health::worst_level`], which applies `health::judged`) finds it past
/// Overlimit is the occupancy attached, so that beside offline work only the online
/// workload's own demand can evict (busy-time metrics count at most as Unhealthy, spatial
/// SM activity is judged as the online share). The model's SM activity is spatial (the
/// share of SMs busy, which an offline job capped by MPS cannot push past its cap), as
/// GPM's SM utilization is on the real GPUs.
pub fn judged_sample(cfg: &MachineConfig, view: &View, mem_used_pct: f64, occ: Occupancy) -> Metrics {
    let mut m = Metrics {
        gpu_util: view.gpu_util,
        sm_activity: view.sm_activity,
        sm_clock_pct: view.clock_pct,
        mem_used_pct,
        sm_spatial: true,
        ..Default::default()
    };
    if sysmonitor::monitor::needs_occupancy(cfg, &m) {
        occ.mark(&mut m);
    }
    m
}

fn dummy_pair() -> Pair {
    Pair {
        d_on: 1.0,
        d_off: 1.0,
        gavel_off: 1.0,
        gavel_on: 1.0,
    }
}
