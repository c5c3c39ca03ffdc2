//! One monitor tick: sample, step the health machine, evict, verify, publish. Generic over the
//! GPU source, the ledger and the signaller so the whole loop runs in unit tests.

use std::collections::{BTreeMap, HashMap};

use crate::config::Config;
use node_daemon::clock::{boot_id, unix_ms};
use node_daemon::errlog::{ErrorRun, Say};
use node_daemon::evictor::{Event, Evictor, Signaller};
use node_daemon::monitor_state::{MonitorState as Snapshot, PendingEviction};
use crate::health::{Action, Input, Level, Machine, MachineConfig, Metrics, State, Transition};
use crate::hostmem::{self, HostMem, PressureJudge};
use crate::ledger::next_on_grid;
use crate::port::{EvictReason, LedgerPort, OfflineProc, Published};
use crate::ring::Ring;
use crate::sampler::{GpuSample, GpuSource, SampleMetrics};
use crate::verify::{Found, Held, ProcProbe, Verifier};

/// Who is on the GPU, for judging an overloaded sample (see [`crate::health::judged`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Occupancy {
    /// NVML could not say (error, or no process listed): judge every metric whole.
    Unknown,
    /// Only registered offline processes: load is the throttle's to take away.
    OfflineOnly,
    /// Offline processes beside online ones: judge the online workload's own demand.
    Colocated {
        /// The SM share the offline side is held to (its jobs' MPS percentages, at most the
        /// MPS manager's fresh budget), percent.
        offline_cap_pct: Option<f64>,
    },
    /// No registered offline process on the GPU.
    OnlineOnly,
}

/// Whether `m` must be judged with who is on the GPU: only an overloaded sample is (asking
/// NVML costs a process listing), since an overload nothing online drives is the throttle's
/// job, not a reason to evict, and beside offline work only the online workload's own demand
/// is (MuxFlow §4.1; [`crate::health::judged`]). Used by the monitor and the simulator alike.
pub fn needs_occupancy(cfg: &MachineConfig, m: &Metrics) -> bool {
    crate::health::worst_level(cfg, m).0 == Level::Overlimit
}

/// `comm` of NVIDIA's MPS server, `nvidia-cuda-mps-server` cut to the kernel's 15 characters
/// (the emulated server names itself the same).
pub const MPS_SERVER_COMM: &[u8] = b"nvidia-cuda-mps";

/// Whether `pid` is an MPS server. NVML lists the server as a compute process (it holds the
/// context its clients share, and its memory) beside its clients, which it lists too on Volta
/// and later; it runs nothing of its own, so it is neither online nor offline work. Read from
/// `/proc/<pid>/comm` (the monitor runs in the host's pid namespace, as NVML's pids are);
/// unreadable, the process counts as online work (the stricter reading).
pub fn is_mps_server(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| c.strip_suffix(b"\n").unwrap_or(&c) == MPS_SERVER_COMM)
}

impl Occupancy {
    /// Marks a sample with this occupancy, for [`crate::health::judged`].
    pub fn mark(self, m: &mut Metrics) {
        match self {
            Occupancy::OfflineOnly => m.offline_only = true,
            Occupancy::Colocated { offline_cap_pct } => {
                m.colocated = true;
                m.offline_sm_cap_pct = offline_cap_pct.unwrap_or(0.0);
            }
            Occupancy::Unknown | Occupancy::OnlineOnly => {}
        }
    }
}

/// How often a Healthy <-> Unhealthy transition is logged at most, ms (see `FlapLog`).
pub const FLAP_LOG_MS: u64 = 1000;


/// Rate limit for the log lines of Healthy <-> Unhealthy flapping: one line per
/// [`FLAP_LOG_MS`], which reports how many transitions were left out since the last one.
#[derive(Debug, Default)]
struct FlapLog {
    next_ms: u64,
    suppressed: u64,
}

impl FlapLog {
    /// `Some(left out since the last line)` when a line may be logged at `now_ms`, else `None`
    /// (the transition is counted).
    fn admit(&mut self, now_ms: u64) -> Option<u64> {
        if now_ms < self.next_ms {
            self.suppressed += 1;
            return None;
        }
        self.next_ms = now_ms.saturating_add(FLAP_LOG_MS);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// How long the monitor trusts what it found out about who is on the GPU, ms: a process
/// that starts or stops changes the judgement at most this late (against a default
/// `overlimit_sustain_ms` of 2000 ms); an eviction forgets it at once.
pub const OCCUPANCY_TTL_MS: u64 = 200;

/// The part of the state file that readers act on (see [`Monitor::change_key`]): health,
/// why it is Disabled, transitions, the Overlimit hold and history, evictions and the number
/// of registered offline processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeKey {
    state: State,
    disabled_by: Option<crate::health::DisableCause>,
    transitions: u64,
    hold_ms: u64,
    overlimit_entries: usize,
    evictions: u64,
    kills: u64,
    evictions_in_flight: usize,
    offline_registered: usize,
}

/// The monitor's whole state.
pub struct Monitor<G: GpuSource, L: LedgerPort, S: Signaller> {
    /// The configuration in force (replaced on reload).
    pub cfg: Config,
    /// Where samples come from (NVML in production).
    pub gpu: G,
    /// The per-GPU ledger (offline registry, eviction requests) and the status file the monitor
    /// block is published in.
    pub ledger: L,
    /// The five-state health machine.
    pub machine: Machine,
    /// Evictions of offline processes (SIGTERM, grace, SIGKILL).
    pub evictor: Evictor<S>,
    /// The latest samples, `history_secs` of them.
    pub history: Ring<GpuSample>,
    verifier: Verifier,
    /// The offline pod list and what was found by it (boxed: read at verification only, it
    /// stays off the cache lines of the per-sample fields).
    pods: Box<PodCheck>,
    pressure: PressureJudge,
    host: Option<HostMem>,
    next_host_ms: u64,
    next_verify_ms: u64,
    /// Samples taken since start.
    pub samples: u64,
    /// Samples that failed since start.
    pub sample_errors: u64,
    /// The last health transition.
    pub last_transition: Option<Transition>,
    /// State changes since start (the state file is rewritten in the tick one happens).
    pub transitions: u64,
    flap_log: FlapLog,
    /// The log lines of a run of failing samples (NVML gone fails every one).
    sample_log: ErrorRun,
    /// Offline processes registered in the ledger at the last look.
    pub offline_registered: usize,
    /// Tick (monotonic ms) of the last successful look at the registry.
    offline_read_ms: Option<u64>,
    /// Sample number at the last Overlimit entry.
    pub overlimit_entry_sample: Option<u64>,
    /// Sample number at the last eviction started.
    pub last_eviction_sample: Option<u64>,
    /// Samples between the last Overlimit entry and the Overlimit eviction it caused.
    pub overlimit_eviction_lag_samples: Option<u64>,
    /// Events of the last tick (for tests and the bench).
    pub events: Vec<Event>,
    ledger_error_logged: bool,
    /// Until when (monotonic ms) the last [`Occupancy`] found holds.
    occupancy_cache: Option<(u64, Occupancy)>,
    xid_log: Option<crate::xidlog::XidTail>,
    /// No XID read (NVML events, kernel log) before this (monotonic ms).
    next_xid_ms: u64,
}

impl<G: GpuSource, L: LedgerPort, S: Signaller> Monitor<G, L, S> {
    /// Builds a monitor, resuming Overlimit history and evictions in flight from an earlier run.
    pub fn new(cfg: Config, gpu: G, ledger: L, sig: S, history: Vec<u64>) -> Self {
        Self::resume(cfg, gpu, ledger, sig, history, &[])
    }

    /// [`Monitor::new`] for a restarted monitor that knows when the earlier run requested the
    /// evictions it left in flight (`pending`, from its state file): their grace periods run
    /// from those requests, so that restarts in quick succession (a crash loop, the watchdog)
    /// cannot put off a SIGKILL for ever. A request in the ledger that `pending` does not name
    /// gets a full grace from now.
    pub fn resume(
        cfg: Config,
        mut gpu: G,
        mut ledger: L,
        sig: S,
        history: Vec<u64>,
        pending: &[PendingEviction],
    ) -> Self {
        gpu.set_pace(&cfg.nvml);
        let mut evictor = Evictor::new(sig, cfg.gpu_index);
        let mut events = Vec::new();
        let now = node_daemon::clock::mono_ms();
        match ledger.offline(now) {
            Ok(mut procs) => {
                for p in &mut procs {
                    let Some(asked) = p.evict_requested_ms else { continue };
                    let earlier = pending
                        .iter()
                        .find(|e| (e.pid, e.start_time) == (p.pid, p.start_time) && e.pid_ns.is_none_or(|ns| ns == p.pid_ns))
                        .map(|e| e.requested_mono_ms.min(asked));
                    p.evict_requested_ms = Some(earlier.unwrap_or(asked));
                    tracing::info!(
                        pid = p.pid,
                        start_time = p.start_time,
                        requested_ms_ago = earlier.map(|t| now.saturating_sub(t)),
                        grace_left_ms = earlier
                            .unwrap_or(now)
                            .saturating_add(p.adopted_grace_ms(&cfg.evictor))
                            .saturating_sub(now),
                        "resumed eviction recorded by an earlier monitor run"
                    );
                }
                evictor.adopt(&cfg.evictor, &procs, &mut events);
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the ledger at start"),
        }
        let xid_log = cfg
            .xid_log
            .as_deref()
            .map(|p| crate::xidlog::XidTail::open(p, cfg.xid_log_match.clone()));
        let pods = Box::new(PodCheck::new(&cfg));
        Monitor {
            history: Ring::new(cfg.history_len()),
            machine: Machine::with_history(history),
            evictor,
            cfg,
            gpu,
            ledger,
            verifier: Verifier::default(),
            pods,
            pressure: PressureJudge::default(),
            host: None,
            next_host_ms: 0,
            next_verify_ms: 0,
            samples: 0,
            sample_errors: 0,
            last_transition: None,
            transitions: 0,
            flap_log: FlapLog::default(),
            sample_log: ErrorRun::default(),
            offline_registered: 0,
            offline_read_ms: None,
            overlimit_entry_sample: None,
            last_eviction_sample: None,
            overlimit_eviction_lag_samples: None,
            xid_log,
            next_xid_ms: 0,
            events,
            ledger_error_logged: false,
            occupancy_cache: None,
        }
    }

    /// Puts a new configuration in force (a reload): the next tick judges by it, and the GPU
    /// source reads at its `nvml` paces.
    pub fn reconfigure(&mut self, cfg: Config) {
        self.gpu.set_pace(&cfg.nvml);
        if cfg.offline_pods_path() != self.cfg.offline_pods_path() {
            *self.pods = PodCheck::new(&cfg);
        }
        self.cfg = cfg;
    }

    /// Feeds an operator or external input (disable/enable) into the machine.
    pub fn input(&mut self, now_ms: u64, input: Input) {
        let step = self.machine.step(&self.cfg.machine, now_ms, input);
        self.apply(now_ms, step);
    }

    #[cold]
    #[inline(never)]
    fn sample_recovered(&mut self, now_ms: u64) {
        if let Say::Recovered { errors, for_ms } = self.sample_log.ok(now_ms) {
            tracing::info!(gpu = self.cfg.gpu_index, errors, for_ms, "GPU sampling works again");
        }
    }

    /// One sampling period's work.
    pub fn tick(&mut self, now_ms: u64) {
        self.events.clear();
        // Dead offline processes' quota back first, whatever their pid namespace.
        self.ledger.reclaim(now_ms);
        let input = match self.gpu.sample(now_ms) {
            Ok(s) => {
                self.samples += 1;
                if self.sample_log.failing() {
                    self.sample_recovered(now_ms);
                }
                self.history.push(s);
                let mut m = s.metrics();
                if needs_occupancy(&self.cfg.machine, &m) {
                    self.occupancy(now_ms).mark(&mut m);
                }
                Input::Sample(m)
            }
            Err(e) => {
                self.sample_errors += 1;
                if let Say::Failed { errors, for_ms } = self.sample_log.failed(now_ms, &e) {
                    tracing::warn!(error = %e, gpu = self.cfg.gpu_index, errors, for_ms, "GPU sample failed");
                }
                Input::SampleError
            }
        };
        let mut xids = Vec::new();
        if now_ms >= self.next_xid_ms {
            // XIDs are not a hot path: NVML's event set and the kernel log are read at most
            // every `nvml.xid_every_ms` (50 ms), not at every sample (each read is a driver call
            // or a syscall, a monitor samples every 10 ms, and 50 ms is nothing to an XID).
            self.next_xid_ms = now_ms + self.cfg.nvml.xid_every_ms;
            xids = self.gpu.xids();
            if let Some(t) = &mut self.xid_log {
                xids.extend(t.poll());
            }
        }
        for x in xids {
            if self.cfg.xid_critical.contains(&x) {
                tracing::error!(xid = x, gpu = self.cfg.gpu_index, "critical XID");
                self.input(now_ms, Input::Xid(x));
            } else if crate::config::APPLICATION_XIDS.contains(&x) {
                tracing::warn!(
                    xid = x,
                    gpu = self.cfg.gpu_index,
                    "application XID (one process's own fault; the GPU stays in service)"
                );
            } else {
                tracing::warn!(
                    xid = x,
                    gpu = self.cfg.gpu_index,
                    "XID (not configured as critical)"
                );
            }
        }
        let step = self.machine.step(&self.cfg.machine, now_ms, input);
        self.apply(now_ms, step);

        // Nothing offline may run while Overlimit or Disabled: late registrations go too.
        if matches!(self.machine.state(), State::Overlimit | State::Disabled) {
            let reason = if self.machine.state() == State::Overlimit {
                EvictReason::Overlimit
            } else {
                EvictReason::Disabled
            };
            self.evict_all(
                now_ms,
                reason,
                "registered while the GPU does not admit offline work",
            );
        }
        if self.cfg.host_memory.enabled && now_ms >= self.next_host_ms {
            self.next_host_ms = next_on_grid(now_ms, self.cfg.host_memory.check_every_ms);
            self.check_host(now_ms);
        }
        if self.cfg.verify.enabled && now_ms >= self.next_verify_ms {
            // On the grid the ledger's reclaim scan uses: the registry is read once that tick.
            self.next_verify_ms = next_on_grid(now_ms, self.cfg.verify.every_ms);
            self.verify(now_ms);
        }
        if self.evictor.in_flight() > 0 {
            let mut ev = std::mem::take(&mut self.events);
            self.evictor.tick(&self.cfg.evictor, now_ms, &mut ev);
            self.events = ev;
        } else {
            // An eviction command may outlive its eviction: waited for all the same.
            self.evictor.reap_commands();
        }
        self.publish(now_ms);
    }

    fn apply(&mut self, now_ms: u64, step: crate::health::Step) {
        for t in step.transitions {
            // Improvements (init -> healthy, recovery) are INFO; degradations WARN/ERROR.
            let sev = |s: State| match s {
                State::Init | State::Healthy => 0,
                State::Unhealthy => 1,
                State::Overlimit => 2,
                State::Disabled => 3,
            };
            let (gpu, from, to) = (self.cfg.gpu_index, t.from.as_str(), t.to.as_str());
            // A load hovering at a threshold flips Healthy <-> Unhealthy every sample (the
            // throttle holds offline load right there): log those at most once a second with
            // the count left out, so the journal is not flooded; Overlimit, Disabled and Init
            // are always logged, and the state file and metrics carry every transition.
            let flap = matches!(
                (t.from, t.to),
                (State::Healthy, State::Unhealthy) | (State::Unhealthy, State::Healthy)
            );
            let logged = if flap { self.flap_log.admit(now_ms) } else { Some(0) };
            if let Some(suppressed) = logged {
                match sev(t.to) {
                    n if n <= sev(t.from) => {
                        tracing::info!(gpu, from, to, reason = %t.reason, suppressed, "health transition")
                    }
                    1 => tracing::warn!(gpu, from, to, reason = %t.reason, suppressed, "health transition"),
                    _ => tracing::error!(gpu, from, to, reason = %t.reason, suppressed, "health transition"),
                }
            }
            if t.to == State::Overlimit {
                self.overlimit_entry_sample = Some(self.samples);
            }
            self.transitions += 1;
            self.last_transition = Some(t);
        }
        for a in step.actions {
            let Action::EvictOffline { reason } = a;
            let r = if self.machine.state() == State::Disabled {
                EvictReason::Disabled
            } else {
                EvictReason::Overlimit
            };
            self.evict_all(now_ms, r, &reason);
        }
    }

    /// The sampling interval to use after this tick, ms: `idle_interval_ms` while nothing on
    /// the GPU needs the fast pace (no offline process registered as of the last registry
    /// read, the GPU Healthy, no eviction in flight), else `interval_ms`. There is nothing to
    /// throttle or evict while idle; the registry is read at every idle tick (the daemon's
    /// housekeeping), so a registration brings the fast pace back within one idle interval.
    pub fn sampling_ms(&self) -> u64 {
        let (fast, idle) = (self.cfg.interval_ms, self.cfg.idle_interval_ms);
        let quiet = self.offline_registered == 0
            && self.offline_read_ms.is_some()
            && !self.ledger_error_logged
            && self.machine.state() == State::Healthy
            && self.evictor.in_flight() == 0;
        if idle > fast && quiet {
            idle
        } else {
            fast
        }
    }

    /// Re-reads the offline registry at monotonic ms `now_ms` (for the state file's count),
    /// unless this tick has read it already (verification, an eviction, the occupancy).
    pub fn refresh_offline(&mut self, now_ms: u64) {
        if self.offline_read_ms != Some(now_ms) {
            self.offline(now_ms);
        }
    }

    fn offline(&mut self, now_ms: u64) -> Vec<OfflineProc> {
        match self.ledger.offline(now_ms) {
            Ok(v) => {
                self.ledger_error_logged = false;
                self.offline_registered = v.len();
                self.offline_read_ms = Some(now_ms);
                if self.evictor.in_flight() > 0 {
                    let mut ev = std::mem::take(&mut self.events);
                    self.evictor.retain_registered(&self.cfg.evictor, now_ms, &v, &mut ev);
                    self.events = ev;
                }
                if v.iter().any(|p| p.evict_requested_ms.is_some()) {
                    self.adopt_requests(&v);
                }
                v
            }
            Err(e) => {
                if !self.ledger_error_logged {
                    tracing::error!(error = %e, "cannot read offline processes from the ledger");
                    self.ledger_error_logged = true;
                }
                Vec::new()
            }
        }
    }

    /// Escalates the eviction requests in the status file that no eviction in flight here
    /// stands for (mps-manager's, whose SIGTERM a process may ignore after the manager is
    /// gone): SIGKILL after the grace, counted from when the request is first seen (for a
    /// request that is the manager's alone, the longest grace the manager may give: it
    /// escalates its own; this is the backstop for a manager that died).
    #[cold]
    #[inline(never)]
    fn adopt_requests(&mut self, procs: &[OfflineProc]) {
        let mut ev = std::mem::take(&mut self.events);
        for p in self.evictor.adopt_requests(&self.cfg.evictor, procs, &mut ev) {
            tracing::warn!(
                gpu = self.cfg.gpu_index,
                pid = p.pid,
                host_pid = p.host_pid,
                start_time = p.start_time,
                grace_ms = p.adopted_grace_ms(&self.cfg.evictor),
                "eviction request in the status file (mps-manager's, or one no eviction here stands for) \
                 taken on: SIGKILL after the grace if the process stays"
            );
        }
        self.events = ev;
    }

    /// Who is on the GPU, remembered for [`OCCUPANCY_TTL_MS`] (it is asked at every
    /// overloaded sample, and NVML's process list plus a ledger scan cost more than a sample).
    fn occupancy(&mut self, now_ms: u64) -> Occupancy {
        if let Some((until, o)) = self.occupancy_cache {
            if now_ms < until {
                return o;
            }
        }
        let o = self.find_occupancy(now_ms);
        self.occupancy_cache = Some((now_ms + OCCUPANCY_TTL_MS, o));
        o
    }

    /// Sorts the processes NVML lists on the GPU into registered offline processes of this
    /// pid namespace (not being evicted) and the rest, counted as online; MPS servers
    /// ([`is_mps_server`]) are neither. Any doubt (NVML error, nobody listed but servers) is
    /// `Unknown`: every metric is judged whole, eviction stays armed.
    /// A ledger error gives no offline processes: every NVML process counts as online.
    #[inline(never)] // periodic or rare: kept out of `tick`'s frame and cache lines
    fn find_occupancy(&mut self, now_ms: u64) -> Occupancy {
        let nvml = match self.gpu.processes() {
            Ok(v) => v,
            Err(_) => return Occupancy::Unknown,
        };
        if nvml.is_empty() {
            return Occupancy::Unknown;
        }
        let offline = self.offline(now_ms);
        let is_offline = |pid: u32| {
            offline
                .iter()
                .any(|o| o.host_pid == Some(pid) && o.evict_requested_ms.is_none())
        };
        let mut n_off = 0;
        let mut n_other = 0;
        for p in &nvml {
            if is_offline(p.pid) {
                n_off += 1;
            } else if !is_mps_server(p.pid) {
                n_other += 1;
            }
        }
        if n_off == 0 && n_other == 0 {
            // Only MPS servers: nobody runs work on the GPU that the monitor knows of.
            return Occupancy::Unknown;
        }
        if n_other == 0 {
            Occupancy::OfflineOnly
        } else if n_off > 0 {
            Occupancy::Colocated {
                offline_cap_pct: self.ledger.offline_sm_cap_pct(),
            }
        } else {
            Occupancy::OnlineOnly
        }
    }

    #[inline(never)] // periodic or rare: kept out of `tick`'s frame and cache lines
    fn evict_all(&mut self, now_ms: u64, reason: EvictReason, why: &str) {
        let procs = self.offline(now_ms);
        for p in procs {
            self.evict_one(now_ms, &p, reason, why);
        }
    }

    fn evict_one(&mut self, now_ms: u64, p: &OfflineProc, reason: EvictReason, why: &str) {
        self.evict_with(now_ms, p, reason, why, None);
    }

    /// [`Monitor::evict_one`]; a process with no slot (work without the shim) is recorded in
    /// the eviction log with `pod_uid`, the pod its cgroup names.
    fn evict_with(&mut self, now_ms: u64, p: &OfflineProc, reason: EvictReason, why: &str, pod_uid: Option<&str>) {
        // A process being evicted no longer counts as offline work on the GPU.
        self.occupancy_cache = None;
        let mut ev = std::mem::take(&mut self.events);
        let ledger = &mut self.ledger;
        // The request is recorded (ledger slot, eviction log) before the SIGTERM is sent, and
        // not at all in a dry run (the shim in the process acts on the request).
        let record = || {
            let r = if p.slot == node_daemon::evictor::NO_SLOT {
                ledger.record_unshimmed(p, reason, pod_uid)
            } else {
                ledger.mark_evicting(p, reason, now_ms)
            };
            if let Err(e) = r {
                tracing::error!(pid = p.pid, error = %e, "cannot record the eviction");
            }
        };
        if self
            .evictor
            .evict_recorded(&self.cfg.evictor, now_ms, p, reason, why, &mut ev, record)
        {
            self.last_eviction_sample = Some(self.samples);
            if reason == EvictReason::Overlimit {
                self.overlimit_eviction_lag_samples = self
                    .overlimit_entry_sample
                    .map(|e| self.samples.saturating_sub(e));
            }
        }
        self.events = ev;
    }

    #[inline(never)] // periodic or rare: kept out of `tick`'s frame and cache lines
    fn check_host(&mut self, now_ms: u64) {
        let h = &self.cfg.host_memory;
        match hostmem::read(&h.meminfo_path, &h.psi_path) {
            Ok(r) => {
                self.host = Some(r);
                if let Some(why) = self.pressure.judge(h, now_ms, &r) {
                    self.evict_all(now_ms, EvictReason::HostMemory, &why);
                }
            }
            Err(e) => tracing::warn!(error = %e, "host memory reading failed"),
        }
    }

    /// Takes in a changed offline pod list (a look every [`POD_LIST_EVERY_MS`]); says once that
    /// there is none.
    fn refresh_offline_pods(&mut self, now_ms: u64) {
        use node_daemon::offline_pods::Change;
        if now_ms < self.pods.next_look_ms {
            return;
        }
        self.pods.next_look_ms = now_ms.saturating_add(POD_LIST_EVERY_MS);
        let w = &mut self.pods.watch;
        let change = w.refresh();
        let path = || w.path().display().to_string();
        match change {
            Some(Change::Read { pods }) => tracing::info!(path = path(), pods, "offline pod list read (node-agent's): GPU processes in these pods must be registered"),
            Some(Change::Gone) => tracing::warn!(path = path(), pods = w.uids().len(), "the offline pod list was removed: the last one read stays in force"),
            Some(Change::Refused(e)) => tracing::error!(error = %e, pods = w.uids().len(), "offline pod list refused: the last good one stays in force"),
            None if !w.has_list() && !self.pods.absent_said => {
                self.pods.absent_said = true;
                tracing::info!(path = path(), "no offline pod list (node-agent writes it): work without the shim is found only in containers with a registered process");
            }
            None => {}
        }
    }

    #[inline(never)] // periodic or rare: kept out of `tick`'s frame and cache lines
    fn verify(&mut self, now_ms: u64) {
        self.refresh_offline_pods(now_ms);
        let offline = self.offline(now_ms);
        if offline.is_empty() && self.pods.watch.uids().is_empty() {
            self.pods.pod_of_pid.clear();
            return;
        }
        let nvml = match self.gpu.processes() {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "per-process GPU memory unavailable; skipping verification");
                return;
            }
        };
        let own_ns = node_ledger::procinfo::own_pid_ns();
        let path = self.cfg.ledger_path();
        let PodCheck { watch, pod_of_pid, .. } = &mut *self.pods;
        pod_of_pid.retain(|pid, _| nvml.iter().any(|m| m.pid == *pid));
        let mut probe = ProcfsProbe {
            ledger_path: &path,
            ledgers: None,
            ns: HashMap::new(),
            pods: pod_of_pid,
        };
        let plans = if watch.any_plan() {
            self.verifier.check_plans(&self.cfg.verify, &offline, &nvml, |uid| watch.plan(uid), &mut probe)
        } else {
            Default::default()
        };
        let unshimmed = self.verifier.check_unregistered(
            &self.cfg.verify,
            &offline,
            &nvml,
            own_ns,
            watch.uids(),
            &mut probe,
        );
        // A planned pod's processes are judged together against its plan, by NVML's figures
        // alone; their own reported memory is a ledger word any ledger client can write (a
        // neighbour's write of a low figure got an honest process evicted as under-reporting).
        let by_report: Vec<OfflineProc> = offline.iter().filter(|p| !plans.judged.contains(&p.key())).copied().collect();
        for l in self.verifier.check(&self.cfg.verify, &by_report, &nvml) {
            let why = format!(
                "reports {} MiB in the ledger but NVML sees {} MiB",
                l.proc_.reported_bytes >> 20,
                l.nvml_bytes >> 20
            );
            self.evict_one(now_ms, &l.proc_, EvictReason::UnderReport, &why);
        }
        self.pods.foreign_reported.retain(|k| offline.iter().any(|p| p.key() == *k));
        for (p, uid) in plans.foreign {
            let pod = match self.pods.watch.pod(&uid) {
                Some(q) => format!("{}/{} (UID {uid})", q.namespace, q.name),
                None => uid.clone(),
            };
            let why = format!(
                "a process of offline pod {pod} registered under another quota group than its pod's ({}): its allocations were charged to another pod's quota (XCUDA_GROUP changed in the container, or node-agent's Allocate took the container for another pending pod's: its environment then carries that pod's quota and MPS share too)",
                node_ledger::ledger::pod_group_name(&uid)
            );
            if self.cfg.verify.foreign_group == crate::config::ForeignGroupAction::Report {
                if self.pods.foreign_reported.insert(p.key()) {
                    tracing::warn!(pid = p.pid, host_pid = p.host_pid, "{why}; left running (verify.foreign_group: report)");
                }
                continue;
            }
            self.evict_with(now_ms, &p, EvictReason::ForeignGroup, &why, Some(&uid));
        }
        for o in plans.over {
            let pod = match self.pods.watch.pod(&o.pod) {
                Some(p) => format!("{}/{} (UID {})", p.namespace, p.name, o.pod),
                None => o.pod.clone(),
            };
            let why = format!(
                "offline pod {pod} holds {} MiB on this GPU in {} process(es) as NVML measures them, over its plan of {} MiB ({} MiB with their contexts and the tolerance): its quota was set higher than planned (its environment, or a ledger group it shares), or it allocates outside the shim; each of its processes is evicted",
                o.nvml_bytes >> 20,
                o.procs.len(),
                o.quota_bytes >> 20,
                o.allowed_bytes >> 20,
            );
            for p in &o.procs {
                self.evict_with(now_ms, p, EvictReason::OverQuota, &why, Some(&o.pod));
            }
        }
        for u in unshimmed {
            let pid = u.proc_.pid;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let (how, pod) = match &u.found {
                Found::Neighbour(n) => (
                    format!("in the pid namespace of registered offline process {n}"),
                    node_daemon::offline_pods::pod_uid_of(pid),
                ),
                Found::Pod(uid) => (
                    match self.pods.watch.pod(uid) {
                        Some(p) => format!("in offline pod {}/{} (UID {uid})", p.namespace, p.name),
                        None => format!("in offline pod {uid}"),
                    },
                    Some(uid.clone()),
                ),
            };
            let why = format!(
                "GPU process {pid} ({}) holds {} MiB {how} but has no registration: offline work \
                 running without the shim (no memory quota, no launch throttle), which was judged \
                 as online load",
                comm.trim(),
                u.nvml_bytes >> 20,
            );
            self.evict_with(now_ms, &u.proc_, EvictReason::UnderReport, &why, pod.as_deref());
        }
    }

    fn publish(&mut self, now_ms: u64) {
        let s = self.history.last().copied().unwrap_or_default();
        let p = Published {
            state: Some(self.machine.state()),
            gpu_util: s.gpu_util,
            sm_activity: s.sm_activity,
            sm_source: s.sm_source,
            // The shims' throttles read a low clock as online pressure: an idle card's is not.
            sm_clock_mhz: s.load_clock_mhz(),
            sm_clock_max_mhz: s.sm_clock_max_mhz,
            mem_used: s.mem_used,
            mem_total: s.mem_total,
            t_ms: now_ms,
            throttle_floor: self.cfg.offline_throttle.floor(),
        };
        if let Err(e) = self.ledger.publish(&p) {
            if !self.ledger_error_logged {
                tracing::error!(error = %e, "cannot publish into the ledger");
                self.ledger_error_logged = true;
            }
        }
    }

    /// What readers of the state file act on, in a form cheap enough to compare every tick:
    /// the daemon rewrites the file in the tick this changes, and otherwise only at its
    /// heartbeat (the live sample and counters in between are for people and freshness).
    pub fn change_key(&self) -> ChangeKey {
        ChangeKey {
            state: self.machine.state(),
            disabled_by: self.machine.disabled_by(),
            transitions: self.transitions,
            hold_ms: self.machine.current_hold_ms(),
            overlimit_entries: self.machine.overlimit_entries().count(),
            evictions: self.evictor.counts().values().sum(),
            kills: self.evictor.kills(),
            evictions_in_flight: self.evictor.in_flight(),
            offline_registered: self.offline_registered,
        }
    }

    /// The state file / status content.
    pub fn snapshot(
        &self,
        now_ms: u64,
        config_files: &[String],
        config_error: Option<String>,
        reloads: u64,
    ) -> Snapshot {
        let evictions: BTreeMap<String, u64> = self
            .evictor
            .counts()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), *v))
            .collect();
        Snapshot {
            gpu: self.cfg.gpu_index,
            monitor_pid: std::process::id(),
            boot_id: boot_id(),
            state: self.machine.state(),
            admits_offline: self.machine.state().admits_offline(),
            disabled_by: self.machine.disabled_by(),
            disabled_since_mono_ms: self.machine.disabled_since_ms(),
            xid_under_operator: self.machine.xid_under_operator(),
            hold_interrupted: self.machine.hold_interrupted(),
            updated_unix_ms: unix_ms(),
            updated_mono_ms: now_ms,
            interval_ms: self.cfg.interval_ms,
            sampling_ms: self.sampling_ms(),
            sample: self.history.last().copied(),
            hold_ms: self.machine.current_hold_ms(),
            hold_remaining_ms: self.machine.hold_remaining_ms(now_ms),
            overlimit_entries_mono_ms: self.machine.overlimit_entries().collect(),
            last_transition: self
                .last_transition
                .as_ref()
                .map(|t| (t.from, t.to, t.reason.clone())),
            evictions,
            kills: self.evictor.kills(),
            evictions_in_flight: self.evictor.in_flight(),
            offline_registered: self.offline_registered,
            samples: self.samples,
            sample_errors: self.sample_errors,
            host_mem_available_pct: self.host.map(|h| h.available_pct()),
            host_psi_some_avg10: self.host.and_then(|h| h.psi_some_avg10),
            config_files: config_files.to_vec(),
            config_error,
            config_reloads: reloads,
            overlimit_entry_sample: self.overlimit_entry_sample,
            last_eviction_sample: self.last_eviction_sample,
            overlimit_eviction_lag_samples: self.overlimit_eviction_lag_samples,
            ledger_error: None,
            status_file_error: None,
            offline_pods: (self.pods.watch.has_list() || self.pods.watch.error().is_some()).then(|| {
                node_daemon::monitor_state::OfflinePodsState {
                    path: self.pods.watch.path().display().to_string(),
                    pods: self.pods.watch.uids().len(),
                    error: self.pods.watch.error().map(str::to_string),
                }
            }),
            pod_ledgers: 0, // the ledger adapter's: set by the daemon
            pod_ledgers_refused: Default::default(),
            evictions_pending: self
                .evictor
                .pending()
                .map(|(p, t, kill)| PendingEviction {
                    pid: p.pid,
                    pid_ns: Some(p.pid_ns),
                    start_time: p.start_time,
                    requested_mono_ms: t,
                    kill_at_mono_ms: kill.filter(|_| !self.cfg.evictor.dry_run),
                })
                .collect(),
        }
    }
}

/// How often the monitor looks at node-agent's offline pod list, ms (one `stat`; node-agent
/// lists the pods every `offline_pods.poll_ms`, 5 s by default).
pub const POD_LIST_EVERY_MS: u64 = 1000;

/// node-agent's offline pod list as the monitor judges by it.
struct PodCheck {
    /// The list (`cfg.offline_pods_path()`).
    watch: node_daemon::offline_pods::Watch,
    /// Whether the absence of the list was said (once).
    absent_said: bool,
    /// Monotonic ms of the next look at the file ([`POD_LIST_EVERY_MS`]).
    next_look_ms: u64,
    /// Host pid -> (pid namespace, pod its cgroup names), for the processes NVML listed at the
    /// last verification (a container's processes never change cgroup).
    pod_of_pid: HashMap<u32, (u64, Option<String>)>,
    /// Processes under a foreign group already reported (`verify.foreign_group: report`), while
    /// registered.
    foreign_reported: std::collections::HashSet<node_daemon::evictor::ProcKey>,
}

impl PodCheck {
    fn new(cfg: &Config) -> Self {
        PodCheck {
            watch: node_daemon::offline_pods::Watch::new(cfg.offline_pods_path()),
            absent_said: false,
            next_look_ms: 0,
            pod_of_pid: HashMap::new(),
            foreign_reported: Default::default(),
        }
    }
}

/// The unshimmed-work check's reads of a process by its pid here, from `/proc`.
struct ProcfsProbe<'a> {
    ledger_path: &'a std::path::Path,
    /// The live ledger file and the damaged copies moved aside, listed at the first need.
    ledgers: Option<(Option<node_ledger::LedgerFile>, Vec<node_ledger::LedgerFile>)>,
    /// Pid namespaces read in this check.
    ns: HashMap<u32, u64>,
    /// Pods found by cgroup, kept across checks while NVML lists the process: (namespace, pod).
    pods: &'a mut HashMap<u32, (u64, Option<String>)>,
}

impl ProcProbe for ProcfsProbe<'_> {
    fn pid_ns(&mut self, pid: u32) -> Option<u64> {
        let ns = node_daemon::procns::pid_ns(pid)?;
        self.ns.insert(pid, ns);
        Some(ns)
    }
    fn start_time(&mut self, pid: u32) -> Option<u64> {
        node_ledger::procinfo::start_time(pid)
    }
    fn ledger_held(&mut self, pid: u32) -> Option<Held> {
        let path = self.ledger_path;
        let (live, aside) = self.ledgers.get_or_insert_with(|| {
            let live = node_ledger::LedgerFile::of_path(path).ok();
            let aside = node_ledger::LedgerFile::with_damaged_copies(path).into_iter().filter(|f| Some(*f) != live).collect();
            (live, aside)
        });
        if live.is_some_and(|f| node_daemon::procns::holds_open(pid, &f)) {
            return Some(Held::Live);
        }
        aside.iter().any(|f| node_daemon::procns::holds_open(pid, f)).then_some(Held::Aside)
    }
    fn parent(&mut self, pid: u32) -> Option<u32> {
        node_ledger::procinfo::parent_pid(pid)
    }
    fn pod_uid(&mut self, pid: u32) -> Option<String> {
        // Read once per process: the same pid in the same pid namespace, listed by NVML at
        // every check since (an exit drops it from the list and the cache), is the same process.
        let ns = *self.ns.get(&pid)?;
        if let Some((n, uid)) = self.pods.get(&pid) {
            if *n == ns {
                return uid.clone();
            }
        }
        let uid = node_daemon::offline_pods::pod_uid_of(pid);
        self.pods.insert(pid, (ns, uid.clone()));
        uid
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn healthy_unhealthy_flapping_is_logged_once_a_second_with_the_count_left_out() {
        let mut f = super::FlapLog::default();
        // A transition every 10 ms for 2.5 s: three lines (0 ms, 1000 ms, 2000 ms).
        let logged: Vec<(u64, u64)> =
            (0..250u64).filter_map(|i| f.admit(i * 10).map(|n| (i * 10, n))).collect();
        assert_eq!(logged, vec![(0, 0), (1000, 99), (2000, 99)]);
        // The next one after a quiet spell is logged at once and reports what was left out.
        assert_eq!(f.admit(10_000), Some(49));
        assert_eq!(f.admit(10_001), None);
    }

    use super::*;

    use crate::port::MemLedger;
    use crate::sampler::ProcMem;

    struct Script {
        next: Vec<Result<GpuSample, String>>,
        procs: Vec<ProcMem>,
        xids: Vec<u64>,
        /// The paces the monitor handed over, last first.
        paces: Vec<crate::config::NvmlPaceConfig>,
    }
    impl GpuSource for Script {
        fn sample(&mut self, now_ms: u64) -> Result<GpuSample, String> {
            let mut s = if self.next.len() > 1 {
                self.next.remove(0)
            } else {
                self.next[0].clone()
            };
            if let Ok(x) = &mut s {
                x.t_ms = now_ms;
            }
            s
        }
        fn processes(&mut self) -> Result<Vec<ProcMem>, String> {
            Ok(self.procs.clone())
        }
        fn xids(&mut self) -> Vec<u64> {
            std::mem::take(&mut self.xids)
        }
        fn set_pace(&mut self, pace: &crate::config::NvmlPaceConfig) {
            self.paces.insert(0, pace.clone());
        }
    }

    /// Records the signals sent; every process is alive but those in `.1` (a test may add one
    /// through [`Evictor::signaller`]).
    #[derive(Default)]
    struct Rec(Vec<(u32, i32)>, std::cell::RefCell<Vec<u32>>);
    impl Signaller for Rec {
        fn signal(&mut self, pid: u32, _s: u64, sig: i32) -> Result<bool, String> {
            self.0.push((pid, sig));
            Ok(!self.1.borrow().contains(&pid))
        }
        fn alive(&mut self, pid: u32, _s: u64) -> bool {
            !self.1.borrow().contains(&pid)
        }
    }

    fn gs(util: f64) -> GpuSample {
        GpuSample {
            gpu_util: util,
            sm_activity: util,
            sm_clock_mhz: 1000,
            sm_clock_max_mhz: 1000,
            mem_used: 1,
            mem_total: 100,
            ..Default::default()
        }
    }

    fn cfg() -> Config {
        let mut c = Config::default();
        c.host_memory.enabled = false;
        c.machine.hold_base_ms = 100;
        // These tests are about what an Overlimit decision does, not when it is taken.
        c.machine.overlimit_sustain_ms = 0;
        c.machine.hold_max_ms = 1000;
        c.evictor.grace_ms = 30;
        c.verify.strikes = 1;
        c.verify.context_mib = 0; // the scripted processes hold no context
        c
    }

    fn off(pid: u32) -> OfflineProc {
        OfflineProc {
            slot: 0,
            pod_ledger: None,
            host_pid: Some(pid),
            pid,
            pid_ns: 0,
            start_time: 7,
            reported_bytes: 0,
            group_id: 0,
            evict_requested_ms: None,
            evict_by_manager: false,
        }
    }

    /// A monitor with offline process 500 registered and NVML listing nobody, fed `samples`.
    fn one_offline(samples: Vec<GpuSample>) -> Monitor<Script, MemLedger, Rec> {
        let gpu = Script { next: samples.into_iter().map(Ok).collect(), procs: vec![], xids: vec![], paces: vec![] };
        let ledger = MemLedger { procs: vec![off(500)], ..Default::default() };
        Monitor::new(cfg(), gpu, ledger, Rec::default(), vec![])
    }

    /// A dry run leaves the ledger's eviction request alone: the shim in the process acts on
    /// it by itself, so recording it would evict for real.
    #[test]
    fn a_dry_run_asks_no_process_to_leave_through_the_ledger() {
        let mut m = one_offline(vec![gs(10.0), gs(99.5)]);
        m.cfg.evictor.dry_run = true;
        for t in [0, 10, 20, 100] {
            m.tick(t);
        }
        assert_eq!(m.machine.state(), State::Overlimit);
        assert_eq!(m.evictor.counts()[&EvictReason::Overlimit], 1);
        assert!(m.ledger.marks.is_empty(), "{:?}", m.ledger.marks);
        assert!(m.evictor.signaller().0.is_empty());
    }

    /// The operator's first run is a dry run; reloaded with `dry_run: false` once the GPU is
    /// back in service, the monitor SIGKILLs nobody: the dry run's evictions sent nothing.
    #[test]
    fn leaving_a_dry_run_sigkills_nobody_it_only_logged() {
        let mut m = one_offline(vec![gs(10.0), gs(99.5), gs(10.0), gs(10.0), gs(10.0)]);
        m.cfg.evictor.dry_run = true;
        for t in [0, 10, 20] {
            m.tick(t);
        }
        assert_eq!(m.evictor.counts()[&EvictReason::Overlimit], 1, "would evict");
        let mut c = m.cfg.clone();
        c.evictor.dry_run = false;
        m.reconfigure(c);
        for t in [200, 300, 2000] {
            m.tick(t);
        }
        assert_eq!(m.machine.state(), State::Healthy, "back in service");
        assert!(m.evictor.signaller().0.is_empty(), "{:?}", m.evictor.signaller().0);
        assert_eq!(m.evictor.in_flight(), 0);
    }

    /// A process mps-manager asked to leave after this monitor started (a request in the
    /// status file that no eviction here stands for), which ignores the manager's SIGTERM, is
    /// SIGKILLed by the running monitor once the grace from when the request was first seen is
    /// over: the manager may be gone. Before, only a monitor starting up took such requests
    /// on, and every eviction refused a process with a request: nothing was ever sent to it.
    /// The grace is the longest mps-manager may give, not the monitor's own (default 10 s): the
    /// manager escalates its requests itself, after its `evict_grace_ms` (up to 10 min), and a
    /// job it gave minutes to checkpoint was SIGKILLed by the monitor after 10 s. (The monitor's
    /// own eviction of such a process keeps the monitor's grace: the next test.)
    #[test]
    fn a_running_monitor_escalates_a_request_mps_manager_made_after_the_managers_longest_grace() {
        let mut m = one_offline(vec![gs(10.0)]);
        m.cfg.evictor.grace_ms = node_daemon::evictor::EvictorConfig::default().grace_ms;
        m.tick(0);
        assert_eq!(m.evictor.in_flight(), 0);
        // The manager's request appears (the adapter reports it with the time it reads it).
        m.ledger.procs[0].evict_requested_ms = Some(10);
        m.ledger.procs[0].evict_by_manager = true;
        for t in [10, 20, 30] {
            m.tick(t);
        }
        assert_eq!(m.machine.state(), State::Healthy);
        assert!(m.evictor.signaller().0.is_empty(), "no second SIGTERM: the manager sent one");
        let long = node_ledger::MANAGER_MAX_EVICT_GRACE_MS;
        for t in [10 + m.cfg.evictor.grace_ms, 10 + 2 * m.cfg.evictor.grace_ms, 10 + long - 1] {
            m.tick(t);
        }
        assert!(m.evictor.signaller().0.is_empty(), "not at the monitor's grace: the manager's may be longer");
        m.tick(10 + long);
        assert_eq!(m.evictor.signaller().0, [(500, libc::SIGKILL)], "the manager's longest grace from 10 is over");
    }

    /// A process mps-manager asked to leave (its request taken on with the manager's longest
    /// grace, 10 min) that the monitor then evicts itself, the GPU going Overlimit: SIGKILL
    /// after the monitor's grace from its eviction, as for any process it evicts, with its
    /// request recorded as the monitor's. Before, the eviction was refused (a request was in
    /// flight): a process ignoring SIGTERM stayed 10 min beside the overloaded online service.
    #[test]
    fn the_monitors_own_eviction_of_a_process_the_manager_asked_to_leave_sigkills_after_its_grace() {
        let mut m = one_offline(vec![gs(10.0), gs(10.0), gs(99.5)]);
        m.cfg.evictor.grace_ms = node_daemon::evictor::EvictorConfig::default().grace_ms;
        m.tick(0);
        m.ledger.procs[0].evict_requested_ms = Some(10);
        m.ledger.procs[0].evict_by_manager = true;
        m.tick(10);
        m.tick(20);
        assert_eq!(m.machine.state(), State::Overlimit);
        assert_eq!(m.evictor.in_flight(), 1);
        assert_eq!(m.ledger.marks, vec![(500, EvictReason::Overlimit)], "the monitor's request recorded");
        assert_eq!(m.evictor.counts()[&EvictReason::Overlimit], 1);
        let grace = m.cfg.evictor.grace_ms;
        m.tick(20 + grace - 1);
        assert!(m.evictor.signaller().0.is_empty(), "no second SIGTERM, no SIGKILL inside the grace");
        m.tick(20 + grace);
        assert_eq!(m.evictor.signaller().0, [(500, libc::SIGKILL)], "the monitor's grace from its eviction at 20");
    }

    /// The operator's eviction command is waited for once it exits, even when the eviction it
    /// ran for ended before it (its process left at once): before, the command's children were
    /// reaped only while an eviction was in flight, and lingered as zombies until the next one.
    #[test]
    fn an_eviction_command_outliving_its_eviction_is_reaped() {
        let d = tempfile::tempdir().unwrap();
        let pid_file = d.path().join("pid");
        let mut m = one_offline(vec![gs(10.0), gs(99.5), gs(10.0), gs(10.0), gs(10.0), gs(10.0)]);
        let script = format!("echo $$ > {}.tmp && mv {0}.tmp {0} && sleep 0.05", pid_file.display());
        m.cfg.evictor.command = Some(vec!["sh".into(), "-c".into(), script]);
        m.tick(0);
        m.tick(10);
        assert!(m.events.iter().any(|e| matches!(e, Event::Command { pid: 500, .. })), "{:?}", m.events);
        // The process leaves at once: its eviction is over while the command still runs.
        m.evictor.signaller().1.borrow_mut().push(500);
        m.tick(20);
        assert_eq!(m.evictor.in_flight(), 0);
        // Wait (bounded) for the command to have exited: a zombie until it is waited for.
        let state = |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next()));
        let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let pid = loop {
            if let Ok(pid) = std::fs::read_to_string(&pid_file) {
                let pid = pid.trim().to_string();
                if matches!(state(&pid), None | Some(Some('Z'))) {
                    break pid;
                }
            }
            assert!(std::time::Instant::now() < end, "the command never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        m.tick(30);
        m.tick(40);
        assert_eq!(state(&pid), None, "the command's process {pid} is still there (a zombie): state {:?}", state(&pid));
    }

    /// A process asked through its ledger only (no pid here) is no eviction in flight once
    /// its registration is gone: the monitor goes back to the idle pace.
    #[test]
    fn an_eviction_asked_through_the_ledger_only_ends_with_the_registration() {
        let mut m = one_offline(vec![gs(10.0), gs(99.5), gs(10.0)]);
        m.ledger.procs[0].host_pid = None;
        m.tick(0);
        m.tick(10);
        assert_eq!(m.evictor.in_flight(), 1);
        assert!(m.evictor.signaller().0.is_empty(), "no pid here: nothing sent");
        m.ledger.procs.clear();
        m.refresh_offline(20);
        assert_eq!(m.evictor.in_flight(), 0, "the registration is gone: the eviction is over");
    }

    /// Every sample carries the operator's throttle floor (`offline_throttle`), the one in
    /// force: a reload's at the next sample. Fails without it in `publish` (no floor: every
    /// offline process's own throttle configuration rules).
    #[test]
    fn every_sample_publishes_the_throttle_floor_in_force() {
        let mut m = one_offline(vec![gs(10.0), gs(10.0)]);
        m.tick(0);
        let f = m.ledger.published.last().unwrap().throttle_floor;
        assert_eq!(f, crate::config::OfflineThrottleConfig::default().floor());
        assert!(f.required && f.max_target_load > 0.0, "{f:?}");
        let mut cfg = m.cfg.clone();
        cfg.offline_throttle.required = false;
        cfg.offline_throttle.max_target_load = 0.5;
        m.reconfigure(cfg);
        m.tick(10);
        let f = m.ledger.published.last().unwrap().throttle_floor;
        assert!(!f.required && f.max_target_load == 0.5, "a reload's floor at the next sample: {f:?}");
    }

    #[test]
    fn overlimit_sample_sigterms_offline_in_the_same_tick_and_publishes() {
        let mut m = one_offline(vec![gs(10.0), gs(99.5)]);
        m.tick(0);
        assert_eq!(m.machine.state(), State::Healthy);
        assert!(m.evictor.counts().is_empty());
        m.tick(10);
        assert_eq!(m.machine.state(), State::Overlimit);
        assert_eq!(
            m.events,
            vec![Event::Term {
                pid: 500,
                reason: EvictReason::Overlimit
            }]
        );
        assert_eq!(m.ledger.marks, vec![(500, EvictReason::Overlimit)]);
        assert_eq!(
            m.ledger.published.last().unwrap().state,
            Some(State::Overlimit)
        );
        assert_eq!(m.ledger.reclaims, 2, "every tick reclaims dead processes' quota");
        m.tick(45);
        assert_eq!(
            m.events,
            vec![Event::Kill {
                pid: 500,
                reason: EvictReason::Overlimit
            }]
        );
    }

    /// Issue 8 obs. 1: an overload only offline processes drive is the throttle's job; the
    /// same overload with an online process on the GPU is judged by the online workload's own
    /// demand (busy-time metrics, which the offline job fills alone, at most Unhealthy; GPM's
    /// spatial SM activity less the offline cap); anything unknown evicts.
    #[test]
    fn overload_evicts_only_for_the_online_workloads_own_demand() {
        let mib = 1 << 20;
        let pm = |pid| ProcMem {
            pid,
            used_bytes: mib,
        };
        let gpm = |util: f64, sm: f64| GpuSample {
            sm_activity: sm,
            sm_source: Some(crate::sampler::SmSource::Gpm),
            ..gs(util)
        };
        for (procs, sample, cap, evicted) in [
            // The offline job alone.
            (vec![pm(500)], gs(99.5), None, false),
            // Beside an online process, busy-time metrics full (T4, MuxFlow's scenario).
            (vec![pm(500), pm(42)], gs(99.5), Some(42.0), false),
            (vec![pm(500), pm(42)], gs(99.5), None, false),
            // GPM: 30 % online + offline at its 42 % cap, then online on every SM.
            (vec![pm(500), pm(42)], gpm(99.5, 72.0), Some(42.0), false),
            (vec![pm(500), pm(42)], gpm(99.5, 100.0), Some(42.0), true),
            // GPM with no budget published: the whole reading counts as online.
            (vec![pm(500), pm(42)], gpm(99.5, 96.0), None, true),
            // Online processes only, or NVML lists nobody (fail closed).
            (vec![pm(42)], gs(99.5), None, true),
            (vec![], gs(99.5), None, true),
        ] {
            let m = overloaded_beside(&procs, sample, cap);
            let what = format!("procs {procs:?} sample {sample:?} cap {cap:?}");
            assert_eq!(m.machine.state() == State::Overlimit, evicted, "{what}");
            assert_eq!(m.ledger.marks.is_empty(), !evicted, "{what}");
            if !evicted {
                assert_eq!(
                    m.machine.state(),
                    State::Unhealthy,
                    "admits no new offline work: {what}"
                );
            }
        }
    }

    /// A monitor that saw one calm sample and then `sample` for 190 ms, with offline process
    /// 500 registered, the offline SM cap `cap` published, and NVML listing `procs`.
    fn overloaded_beside(
        procs: &[ProcMem],
        sample: GpuSample,
        cap: Option<f64>,
    ) -> Monitor<Script, MemLedger, Rec> {
        let gpu = Script {
            next: vec![Ok(gs(10.0)), Ok(sample)],
            procs: procs.to_vec(),
            xids: vec![],
            paces: vec![],
        };
        let ledger = MemLedger {
            procs: vec![off(500)],
            sm_cap_pct: cap,
            ..Default::default()
        };
        let mut m = Monitor::new(cfg(), gpu, ledger, Rec::default(), vec![]);
        for t in 0..20 {
            m.tick(t * 10);
        }
        m
    }

    /// NVML lists the MPS server beside its clients (it holds their shared context): it is not
    /// online work. An offline job alone under MPS whose load pulls the SM clock past Overlimit
    /// is the throttle's to slow down, not evicted; beside a real online process it is.
    #[test]
    fn the_mps_server_is_no_online_work() {
        let dir = tempfile::tempdir().unwrap();
        let server_bin = dir.path().join("nvidia-cuda-mps-server");
        std::fs::copy("/bin/sleep", &server_bin).unwrap();
        let mut server = std::process::Command::new(&server_bin).arg("30").spawn().unwrap();
        let spid = server.id();
        let t0 = std::time::Instant::now();
        while !is_mps_server(spid) {
            assert!(t0.elapsed().as_secs() < 10, "the server never showed its name");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!is_mps_server(std::process::id()));
        let pm = |pid| ProcMem {
            pid,
            used_bytes: 1 << 20,
        };
        // Offline load at full utilization with the SM clock at 45 % of its top.
        let slow = GpuSample {
            sm_clock_mhz: 450,
            ..gs(99.5)
        };
        let online = std::process::id();
        for (procs, evicted) in [
            (vec![pm(500), pm(spid)], false),
            (vec![pm(500), pm(spid), pm(online)], true),
            (vec![pm(spid)], true),
        ] {
            let m = overloaded_beside(&procs, slow, None);
            let what = format!("procs {procs:?}");
            assert_eq!(m.machine.state() == State::Overlimit, evicted, "{what}");
            assert_eq!(m.ledger.marks.is_empty(), !evicted, "{what}");
        }
        server.kill().unwrap();
        server.wait().unwrap();
    }

    /// The state file is rewritten when the change key moves (see `daemon`): it must stay put
    /// over quiet samples and move with a state change and with an eviction.
    #[test]
    fn change_key_moves_with_state_and_evictions_not_with_samples() {
        let mut m = one_offline(vec![gs(10.0), gs(12.0), gs(99.5)]);
        m.tick(0);
        let healthy = m.change_key();
        m.tick(10);
        assert_eq!(m.change_key(), healthy, "a new sample alone is no change");
        m.tick(20);
        let over = m.change_key();
        assert_ne!(over, healthy, "Overlimit + SIGTERM is");
        m.tick(55);
        assert_eq!(m.evictor.kills(), 1);
        assert_ne!(m.change_key(), over, "the SIGKILL is too");
    }

    /// The registry is read once in a tick whose verification read it already; the count
    /// still follows a registration at the next look.
    #[test]
    fn the_registry_count_reuses_this_ticks_read_and_follows_the_next_one() {
        let mut c = cfg();
        c.verify.every_ms = 200;
        let gpu = Script { next: vec![Ok(gs(10.0))], procs: vec![], xids: vec![], paces: vec![] };
        let ledger = MemLedger { procs: vec![off(500)], ..Default::default() };
        let mut m = Monitor::new(c, gpu, ledger, Rec::default(), vec![]);
        let reads = |m: &Monitor<Script, MemLedger, Rec>| m.ledger.offline_reads;
        let start = reads(&m);
        m.tick(0); // verification (on the grid) reads the registry
        assert_eq!(reads(&m), start + 1);
        m.refresh_offline(0);
        assert_eq!(reads(&m), start + 1, "read once in this tick");
        assert_eq!(m.offline_registered, 1);
        m.ledger.procs.push(off(501));
        m.tick(100); // no verification at 100 ms
        m.refresh_offline(100);
        assert_eq!(reads(&m), start + 2, "a later tick reads afresh");
        assert_eq!(m.offline_registered, 2);
    }

    /// The idle pace: only with no offline process registered (as of a registry read), the
    /// GPU Healthy and no eviction in flight; a registration, a state other than Healthy, or
    /// `idle_interval_ms` not above `interval_ms` give the full pace.
    #[test]
    fn the_idle_pace_needs_an_empty_registry_a_healthy_gpu_and_no_eviction() {
        let mut c = cfg();
        c.interval_ms = 10;
        c.idle_interval_ms = 100;
        let gpu = Script { next: vec![Ok(gs(10.0))], procs: vec![], xids: vec![], paces: vec![] };
        let mut m = Monitor::new(c.clone(), gpu, MemLedger::default(), Rec::default(), vec![]);
        assert_eq!(m.sampling_ms(), 10, "before the first sample (Init) and registry read");
        m.tick(0);
        m.refresh_offline(0);
        assert_eq!(m.machine.state(), State::Healthy);
        assert_eq!(m.sampling_ms(), 100, "nothing registered, Healthy: idle");
        m.ledger.procs.push(off(500));
        m.tick(100);
        m.refresh_offline(100);
        assert_eq!(m.sampling_ms(), 10, "a registration: full pace");
        m.ledger.procs.clear();
        m.tick(110);
        m.refresh_offline(110);
        assert_eq!(m.sampling_ms(), 100, "the last one gone: idle again");
        m.cfg.idle_interval_ms = 0;
        assert_eq!(m.sampling_ms(), 10, "0: always interval_ms");
        m.cfg.idle_interval_ms = 5;
        assert_eq!(m.sampling_ms(), 10, "not above interval_ms: always interval_ms");

        // Not Healthy (here Overlimit, with its eviction in flight): full pace.
        let gpu = Script { next: vec![Ok(gs(10.0)), Ok(gs(99.5))], procs: vec![], xids: vec![], paces: vec![] };
        let ledger = MemLedger { procs: vec![off(600)], ..Default::default() };
        let mut m = Monitor::new(c, gpu, ledger, Rec::default(), vec![]);
        m.tick(0);
        m.tick(10);
        assert_eq!(m.machine.state(), State::Overlimit);
        m.ledger.procs.clear(); // the evicted process already gone from the registry
        m.refresh_offline(20);
        assert_eq!(m.offline_registered, 0);
        assert_eq!(m.sampling_ms(), 10, "Overlimit: full pace");
    }

    #[test]
    fn under_reporter_is_evicted_honest_one_is_not() {
        let mib = 1 << 20;
        let gpu = Script {
            next: vec![Ok(gs(10.0))],
            procs: vec![
                ProcMem {
                    pid: 600,
                    used_bytes: 900 * mib,
                },
                ProcMem {
                    pid: 601,
                    used_bytes: 100 * mib,
                },
            ],
            xids: vec![],
            paces: vec![],
        };
        let mut a = off(600);
        a.reported_bytes = 100 * mib;
        let mut b = off(601);
        b.reported_bytes = 100 * mib;
        let ledger = MemLedger {
            procs: vec![a, b],
            ..Default::default()
        };
        let mut m = Monitor::new(cfg(), gpu, ledger, Rec::default(), vec![]);
        m.tick(0);
        assert_eq!(m.evictor.signaller().0.clone(), vec![(600, libc::SIGTERM)]);
        assert_eq!(
            m.machine.state(),
            State::Healthy,
            "a liar does not change GPU health"
        );
    }

    /// The `nvml` paces reach the GPU source at start and on reload, and the monitor reads
    /// XIDs at its own: a critical XID waiting in NVML's event set is taken only once
    /// `nvml.xid_every_ms` has passed since the last read.
    #[test]
    fn the_configured_nvml_paces_are_the_ones_used() {
        let mut c = cfg();
        c.nvml.xid_every_ms = 300;
        c.nvml.gpm_every_ms = 1000;
        let gpu = Script {
            next: vec![Ok(gs(10.0))],
            procs: vec![],
            xids: vec![],
            paces: vec![],
        };
        let ledger = MemLedger {
            procs: vec![off(700)],
            ..Default::default()
        };
        let mut m = Monitor::new(c.clone(), gpu, ledger, Rec::default(), vec![]);
        assert_eq!(m.gpu.paces, vec![c.nvml.clone()], "handed over at start");
        m.tick(0);
        m.gpu.xids = vec![48];
        m.tick(Config::default().nvml.xid_every_ms);
        m.tick(299);
        assert_eq!(m.machine.state(), State::Healthy, "not read before 300 ms");
        m.tick(300);
        assert_eq!(m.machine.state(), State::Disabled);
        let mut reloaded = c.clone();
        reloaded.nvml.gpm_every_ms = 2000;
        m.reconfigure(reloaded.clone());
        assert_eq!(m.gpu.paces[0], reloaded.nvml, "handed over on reload");
        assert_eq!(m.cfg, reloaded);
    }

    /// XIDs are read at most every `nvml.xid_every_ms`: a critical one waiting in NVML's event set
    /// is taken at the first sample that far from the last read, not at every sample.
    #[test]
    fn critical_xid_disables_and_evicts_other_xids_do_not() {
        let gpu = Script {
            next: vec![Ok(gs(10.0))],
            procs: vec![],
            // Application XIDs (a process's own page fault, engine exception, cleanup after a
            // kill): the GPU stays in service and nothing is evicted.
            xids: vec![13, 31, 43, 45, 68],
            paces: vec![],
        };
        let ledger = MemLedger {
            procs: vec![off(700)],
            ..Default::default()
        };
        let mut m = Monitor::new(cfg(), gpu, ledger, Rec::default(), vec![]);
        m.tick(0);
        assert_eq!(m.machine.state(), State::Healthy);
        m.gpu.xids = vec![79];
        m.tick(10);
        assert_eq!(
            m.machine.state(),
            State::Healthy,
            "not read 10 ms after the last read"
        );
        assert_eq!(m.gpu.xids, vec![79]);
        m.tick(Config::default().nvml.xid_every_ms);
        assert_eq!(m.machine.state(), State::Disabled);
        assert_eq!(
            m.events,
            vec![Event::Term {
                pid: 700,
                reason: EvictReason::Disabled
            }]
        );
    }

    /// A restarted monitor finishes the grace of a request the state file dates (990 ms,
    /// grace 30 ms: SIGKILL at 1020, not 30 ms after it found the request at 1000); a request
    /// the file does not name (another start time, or another pid namespace: another process)
    /// gets a full grace.
    #[test]
    fn a_resumed_eviction_finishes_the_grace_of_the_earlier_request() {
        let pending = [PendingEviction {
            pid: 800,
            pid_ns: Some(off(800).pid_ns),
            start_time: 7,
            requested_mono_ms: 990,
            kill_at_mono_ms: None,
        }];
        for (start_time, pid_ns, kill_at) in [(7, 0, 1020), (8, 0, 1030), (7, 5, 1030)] {
            let gpu = Script { next: vec![Ok(gs(99.5))], procs: vec![], xids: vec![], paces: vec![] };
            // The ledger keeps the request, not its time: it dates it when it is read.
            let p = OfflineProc { start_time, pid_ns, evict_requested_ms: Some(1000), ..off(800) };
            let ledger = MemLedger { procs: vec![p], ..Default::default() };
            let mut m = Monitor::resume(cfg(), gpu, ledger, Rec::default(), vec![], &pending);
            m.tick(kill_at - 1);
            assert!(m.evictor.signaller().0.is_empty(), "start time {start_time}, pid namespace {pid_ns}");
            let want = if kill_at == 1020 { 990 } else { 1000 };
            // Before the SIGKILL the state file says when it comes (mps-manager terminates the
            // process's MPS work first); once sent, it says none will.
            let before = m.snapshot(kill_at - 1, &[], None, 0);
            assert_eq!(
                before.evictions_pending,
                vec![PendingEviction { pid: 800, pid_ns: Some(pid_ns), start_time, requested_mono_ms: want, kill_at_mono_ms: Some(kill_at) }],
            );
            m.tick(kill_at);
            assert_eq!(m.evictor.signaller().0, vec![(800, libc::SIGKILL)], "start time {start_time}, pid namespace {pid_ns}");
            let s = m.snapshot(kill_at, &[], None, 0);
            assert_eq!(
                s.evictions_pending,
                vec![PendingEviction { pid: 800, pid_ns: Some(pid_ns), start_time, requested_mono_ms: want, kill_at_mono_ms: None }],
                "the state file dates the request for the next restart"
            );
        }
    }

    #[test]
    fn restart_does_not_signal_twice() {
        let gpu = Script {
            next: vec![Ok(gs(99.5))],
            procs: vec![],
            xids: vec![],
            paces: vec![],
        };
        let mut p = off(800);
        p.evict_requested_ms = Some(0);
        let ledger = MemLedger {
            procs: vec![p],
            ..Default::default()
        };
        let mut m = Monitor::new(cfg(), gpu, ledger, Rec::default(), vec![]);
        m.tick(5);
        assert_eq!(m.machine.state(), State::Overlimit);
        assert!(
            m.evictor.signaller().0.clone().is_empty(),
            "SIGTERM already sent by the previous run"
        );
        m.tick(31);
        assert_eq!(m.evictor.signaller().0.clone(), vec![(800, libc::SIGKILL)]);
    }
}
