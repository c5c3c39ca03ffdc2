//! The five-state health machine of MuxFlow's SysMonitor, as a pure function of samples and time.
//!
//! Nothing here reads a clock, a device or a file: callers feed [`Input`]s stamped with a
//! monotonic millisecond time and act on the [`Action`]s that come back.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Device health as the paper names it (MuxFlow §4.1, Fig. 6b): the node runtime's one
/// health enum, [`node_ledger::HealthState`] (the machine steps it, the ledger and the state
/// file carry it).
pub use node_ledger::HealthState as State;

/// The metrics the machine judges, in the order used by [`Metrics`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    /// GPU utilization (a kernel was running), percent.
    GpuUtil,
    /// SM activity, percent.
    SmActivity,
    /// SM clock as a percentage of its maximum (bad when low).
    SmClock,
    /// Memory used as a percentage of total.
    MemUsed,
}

impl MetricKind {
    /// Every metric, in [`Metrics`] order.
    pub const ALL: [MetricKind; 4] = [
        MetricKind::GpuUtil,
        MetricKind::SmActivity,
        MetricKind::SmClock,
        MetricKind::MemUsed,
    ];

    /// The snake_case name (config key and log label).
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::GpuUtil => "gpu_util",
            MetricKind::SmActivity => "sm_activity",
            MetricKind::SmClock => "sm_clock",
            MetricKind::MemUsed => "mem_used",
        }
    }
}

/// One sample's values, all in percent: GPU utilization, SM activity, SM clock as a
/// percentage of its maximum (lower is worse), and memory used as a percentage of total.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Metrics {
    /// GPU utilization, percent.
    pub gpu_util: f64,
    /// SM activity, percent.
    pub sm_activity: f64,
    /// SM clock as a percentage of its maximum.
    pub sm_clock_pct: f64,
    /// Memory used as a percentage of total.
    pub mem_used_pct: f64,
    /// Every process on the GPU is a registered offline process (none online). Load past
    /// Overlimit is then the shim throttle's to take away (MuxFlow §4.2), not a reason to
    /// evict: the load metrics (utilization, SM activity, SM clock) count at most as
    /// Unhealthy. Memory is judged as always. False (the fail-closed default) when unknown.
    #[serde(default)]
    pub offline_only: bool,
    /// Registered offline processes run beside other (online) processes on the GPU. A
    /// back-to-back offline job then fills every busy-time metric (GPU utilization, and SM
    /// activity where it is the busy fraction) whatever the online workload asks for, so those
    /// count at most as Unhealthy; spatial SM activity is judged as the online workload's own
    /// share (see [`online_share`]); the SM clock and memory are judged as always. False (the
    /// fail-closed default) when unknown.
    #[serde(default)]
    pub colocated: bool,
    /// `sm_activity` is spatial (GPM's SM utilization: the share of the SMs busy), which an
    /// offline job held to its MPS active-thread percentage cannot push past that percentage.
    /// False for the busy-time fallbacks (utilization samples or rates).
    #[serde(default)]
    pub sm_spatial: bool,
    /// SM share, percent, the offline side is held to: the sum of the live offline jobs' MPS
    /// active-thread percentages (each recorded in its processes' ledger slots), at most the
    /// budget the MPS manager published (`crate::ledger::offline_cap_pct`). 0 when unknown:
    /// the whole reading then counts as online.
    #[serde(default)]
    pub offline_sm_cap_pct: f64,
}

/// The online workload's own share of the SMs left to it when the offline side is held to
/// `offline_cap_pct` percent of them: `(total - cap) / (100 - cap)`, in percent. With offline
/// work capped at 42 %, a 30 % online workload beside a saturating offline job reads 72 % in
/// total and 52 % here; an online workload that takes every SM it may have reads 100 % in
/// both. A cap above 90 % counts as 90 % (less is taken off: fail closed).
pub fn online_share(total_pct: f64, offline_cap_pct: f64) -> f64 {
    if total_pct.is_nan() {
        return total_pct;
    }
    let cap = if offline_cap_pct.is_finite() {
        offline_cap_pct.clamp(0.0, 90.0)
    } else {
        0.0
    };
    ((total_pct - cap).max(0.0) * 100.0 / (100.0 - cap)).min(100.0)
}

impl Metrics {
    /// The value of metric `k`.
    pub fn get(&self, k: MetricKind) -> f64 {
        match k {
            MetricKind::GpuUtil => self.gpu_util,
            MetricKind::SmActivity => self.sm_activity,
            MetricKind::SmClock => self.sm_clock_pct,
            MetricKind::MemUsed => self.mem_used_pct,
        }
    }
}

/// Which way a metric goes bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Bad when high (utilization, activity, memory).
    Above,
    /// Bad when low (SM clock).
    Below,
}

/// Per-metric thresholds with hysteresis: `healthy` (back to Healthy only when better than
/// this), `unhealthy` (enter Unhealthy at or past this), `overlimit` (enter Overlimit past this).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Threshold {
    /// Back to Healthy only when better than this.
    pub healthy: f64,
    /// Unhealthy at or past this.
    pub unhealthy: f64,
    /// Overlimit past this (after the sustain time).
    pub overlimit: f64,
    /// Which way the metric goes bad (default: above).
    #[serde(default = "default_direction")]
    pub direction: Direction,
    /// A disabled metric is sampled and shown but never judged.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

fn default_direction() -> Direction {
    Direction::Above
}
fn default_true() -> bool {
    true
}

/// Where one value falls against its thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Better than the healthy threshold.
    Calm,
    /// Between healthy and unhealthy: the hysteresis band.
    Band,
    /// At or past unhealthy, not past overlimit.
    Unhealthy,
    /// Past overlimit.
    Overlimit,
}

impl Threshold {
    /// Whether no reading can ever pass `overlimit` (Overlimit is strictly past it: 100 for an
    /// "above" metric, 0 for a "below" one) while the metric is judged: it then makes the GPU
    /// Unhealthy at most, never Overlimit, so it never evicts. Accepted (an operator may mean
    /// it, and refusing a file the previous build ran would crash-loop the monitor at upgrade),
    /// and said: [`MachineConfig::never_overlimit`].
    pub fn never_overlimit(&self) -> bool {
        self.enabled
            && match self.direction {
                Direction::Above => self.overlimit >= 100.0,
                Direction::Below => self.overlimit <= 0.0,
            }
    }

    /// Checks the ordering healthy < unhealthy < overlimit (reversed for `Below`).
    pub fn validate(&self) -> Result<(), String> {
        let ok = match self.direction {
            Direction::Above => self.healthy < self.unhealthy && self.unhealthy < self.overlimit,
            Direction::Below => self.healthy > self.unhealthy && self.unhealthy > self.overlimit,
        };
        let finite =
            self.healthy.is_finite() && self.unhealthy.is_finite() && self.overlimit.is_finite();
        if !finite {
            return Err("thresholds must be finite numbers".into());
        }
        // Every judged metric is a percentage: a threshold outside 0..=100 can never be
        // reached (250 % would switch the protection off) or is always past.
        for (name, v) in [
            ("healthy", self.healthy),
            ("unhealthy", self.unhealthy),
            ("overlimit", self.overlimit),
        ] {
            if !(0.0..=100.0).contains(&v) {
                return Err(format!(
                    "{name} = {v} is a percentage: must be within 0..=100"
                ));
            }
        }
        if !ok {
            return Err(match self.direction {
                Direction::Above => format!(
                    "need healthy < unhealthy < overlimit, got {} / {} / {}",
                    self.healthy, self.unhealthy, self.overlimit
                ),
                Direction::Below => format!(
                    "direction \"below\" needs healthy > unhealthy > overlimit, got {} / {} / {}",
                    self.healthy, self.unhealthy, self.overlimit
                ),
            });
        }
        Ok(())
    }

    /// Where `v` stands against the thresholds (a NaN reads as the worst).
    pub fn level(&self, v: f64) -> Level {
        // A NaN reading is treated as the worst case rather than silently as calm.
        if v.is_nan() {
            return Level::Overlimit;
        }
        let past = |t: f64, strict: bool| match (self.direction, strict) {
            (Direction::Above, true) => v > t,
            (Direction::Above, false) => v >= t,
            (Direction::Below, true) => v < t,
            (Direction::Below, false) => v <= t,
        };
        if past(self.overlimit, true) {
            Level::Overlimit
        } else if past(self.unhealthy, false) {
            Level::Unhealthy
        } else if past(self.healthy, false) {
            Level::Band
        } else {
            Level::Calm
        }
    }
}

/// All thresholds and timing of the machine; missing fields take the defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MachineConfig {
    /// Thresholds for GPU utilization.
    pub gpu_util: Threshold,
    /// Thresholds for SM activity.
    pub sm_activity: Threshold,
    /// Thresholds for the SM clock (as a percentage of its maximum; bad when low).
    pub sm_clock: Threshold,
    /// Thresholds for memory used (percentage of total).
    pub mem_used: Threshold,
    /// How long a metric must stay past its overlimit threshold, sample after sample, before
    /// the machine enters Overlimit (and evicts), ms. MuxFlow's throttle is the fast loop and
    /// eviction the slow safety net: this must be longer than the shim throttle's settling
    /// time, so that an offline job starting on an idle GPU is throttled to its target before
    /// the monitor would call the GPU Overlimit. Only a demand the throttle cannot take away,
    /// the online workload's own, keeps the GPU past Overlimit that long. 0 = at once.
    #[serde(default = "default_sustain")]
    pub overlimit_sustain_ms: u64,
    /// Hold after the first Overlimit entry in the window, in ms.
    pub hold_base_ms: u64,
    /// Multiplier per further entry in the window (the paper's exponent base).
    #[serde(default = "default_hold_factor")]
    pub hold_factor: f64,
    /// Cap on the hold, in ms.
    pub hold_max_ms: u64,
    /// Window over which Overlimit entries are counted, in ms (paper: two hours).
    #[serde(default = "default_window")]
    pub overlimit_window_ms: u64,
    /// Consecutive NVML failures before Disabled.
    #[serde(default = "default_error_limit")]
    pub nvml_error_limit: u32,
    /// Consecutive good samples needed to leave an NVML-caused Disabled.
    #[serde(default = "default_recover")]
    pub nvml_recover_samples: u32,
    /// How long an XID keeps the device Disabled, ms; 0 means until an operator enables it.
    #[serde(default)]
    pub xid_disable_ms: u64,
}

/// Longest accepted `overlimit_sustain_ms`: a longer one would leave an overloaded online
/// workload unprotected for longer than any operator means.
pub const MAX_SUSTAIN_MS: u64 = 60_000;

fn default_sustain() -> u64 {
    2_000
}
fn default_hold_factor() -> f64 {
    2.0
}
fn default_window() -> u64 {
    2 * 3600 * 1000
}
fn default_error_limit() -> u32 {
    3
}
fn default_recover() -> u32 {
    3
}

impl MachineConfig {
    /// The judged metrics whose `overlimit` no reading can pass ([`Threshold::never_overlimit`]),
    /// each as a warning naming its field: logged at start and reload, printed by check-config.
    pub fn never_overlimit(&self) -> Vec<String> {
        MetricKind::ALL
            .into_iter()
            .filter(|&k| self.threshold(k).never_overlimit())
            .map(|k| {
                format!(
                    "machine.{}.overlimit = {} can never be passed (Overlimit is strictly past it): {} makes the GPU \
                     Unhealthy at most and never evicts offline work; if that is not meant, use a value inside 0..100",
                    k.as_str(),
                    self.threshold(k).overlimit,
                    k.as_str()
                )
            })
            .collect()
    }

    /// The thresholds of metric `k`.
    pub fn threshold(&self, k: MetricKind) -> &Threshold {
        match k {
            MetricKind::GpuUtil => &self.gpu_util,
            MetricKind::SmActivity => &self.sm_activity,
            MetricKind::SmClock => &self.sm_clock,
            MetricKind::MemUsed => &self.mem_used,
        }
    }

    /// Returns `(field, message)` for the first invalid setting.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for k in MetricKind::ALL {
            self.threshold(k)
                .validate()
                .map_err(|m| (k.as_str().to_string(), m))?;
        }
        if self.overlimit_sustain_ms > MAX_SUSTAIN_MS {
            return Err((
                "overlimit_sustain_ms".into(),
                format!(
                    "must be <= {MAX_SUSTAIN_MS} ms, got {}",
                    self.overlimit_sustain_ms
                ),
            ));
        }
        if self.hold_base_ms == 0 {
            return Err(("hold_base_ms".into(), "must be > 0".into()));
        }
        if self.hold_max_ms < self.hold_base_ms {
            return Err((
                "hold_max_ms".into(),
                format!("must be >= hold_base_ms ({})", self.hold_base_ms),
            ));
        }
        if !(self.hold_factor >= 1.0 && self.hold_factor.is_finite()) {
            return Err((
                "hold_factor".into(),
                format!("must be a finite number >= 1, got {}", self.hold_factor),
            ));
        }
        if self.overlimit_window_ms == 0 {
            return Err(("overlimit_window_ms".into(), "must be > 0".into()));
        }
        if self.nvml_error_limit == 0 {
            return Err(("nvml_error_limit".into(), "must be >= 1".into()));
        }
        Ok(())
    }

    /// Hold for the `n`-th Overlimit entry in the window (n >= 1): base * factor^(n-1), capped.
    pub fn hold_ms(&self, n: usize) -> u64 {
        let exp = n.saturating_sub(1).min(64) as i32;
        let h = self.hold_base_ms as f64 * self.hold_factor.powi(exp);
        if h >= self.hold_max_ms as f64 {
            self.hold_max_ms
        } else {
            h as u64
        }
    }
}

impl Default for MachineConfig {
    fn default() -> Self {
        let above = |h, u, o| Threshold {
            healthy: h,
            unhealthy: u,
            overlimit: o,
            direction: Direction::Above,
            enabled: true,
        };
        MachineConfig {
            gpu_util: above(80.0, 90.0, 98.0),
            sm_activity: above(70.0, 85.0, 95.0),
            sm_clock: Threshold {
                healthy: 85.0,
                unhealthy: 75.0,
                overlimit: 60.0,
                direction: Direction::Below,
                enabled: true,
            },
            mem_used: above(80.0, 90.0, 95.0),
            overlimit_sustain_ms: default_sustain(),
            hold_base_ms: 30_000,
            hold_factor: 2.0,
            hold_max_ms: 3_600_000,
            overlimit_window_ms: default_window(),
            nvml_error_limit: 3,
            nvml_recover_samples: 3,
            xid_disable_ms: 0,
        }
    }
}

/// Why the machine is Disabled (part of the monitor's state file).
pub use node_daemon::monitor_state::DisableCause;

/// What happened on the device between two steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Input {
    /// A successful sample.
    Sample(Metrics),
    /// The sampler failed (NVML error, device lost).
    SampleError,
    /// A critical XID event was reported for the device.
    Xid(u64),
    /// An operator asked to take the GPU out of service.
    OperatorDisable,
    /// An operator asked to put it back (goes through Init).
    OperatorEnable,
}

/// One state change with its reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// State left.
    pub from: State,
    /// State entered.
    pub to: State,
    /// Why (metric and value, or the event).
    pub reason: String,
}

/// What the caller must do after a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Evict all offline work on the device (entering Overlimit or Disabled).
    EvictOffline {
        /// Why (the transition's reason).
        reason: String,
    },
}

/// Result of one step: changes made (at most two: Init→Healthy→…) and actions to take.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Step {
    /// State changes made, in order.
    pub transitions: Vec<Transition>,
    /// Actions the caller must take.
    pub actions: Vec<Action>,
}

/// The machine's memory: current state plus what the transitions depend on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    state: State,
    /// Times (ms) the machine entered Overlimit, oldest first, within the window.
    overlimit_entries: VecDeque<u64>,
    /// In Overlimit: since when all metrics have stayed under Overlimit.
    calm_since_ms: Option<u64>,
    /// In Healthy/Unhealthy: since when every sample has been past an overlimit threshold.
    #[serde(default)]
    over_since_ms: Option<u64>,
    /// In Overlimit: the hold that applies to this stay.
    hold_ms: u64,
    disabled_by: Option<DisableCause>,
    disabled_at_ms: u64,
    nvml_errors: u32,
    good_samples: u32,
    /// Disabled (NVML errors, an XID, the operator) while Overlimit: the hold that stay
    /// called for is not over, and Disabled is left only once all metrics have also stayed
    /// under Overlimit for that hold (the paper's edges: Disabled -> Init -> Healthy). Without
    /// it a burst of three sampling errors (30 ms) would end a hold of up to an hour and admit
    /// offline work at once.
    #[serde(default)]
    hold_interrupted: bool,
    /// A critical XID (code, monotonic ms seen) that came while, or before, an operator held
    /// the GPU Disabled: the operator's enable leaves the GPU Disabled by it, and only a
    /// second enable (or `xid_disable_ms`) ends that, as for any critical XID.
    #[serde(default)]
    xid_under_operator: Option<(u64, u64)>,
}

impl Default for Machine {
    fn default() -> Self {
        Self::new()
    }
}

impl Machine {
    /// A machine in Init.
    pub fn new() -> Self {
        Machine {
            state: State::Init,
            overlimit_entries: VecDeque::new(),
            calm_since_ms: None,
            over_since_ms: None,
            hold_ms: 0,
            disabled_by: None,
            disabled_at_ms: 0,
            nvml_errors: 0,
            good_samples: 0,
            hold_interrupted: false,
            xid_under_operator: None,
        }
    }

    /// Starts in Init, remembering Overlimit entries from an earlier run (e.g. after a restart).
    pub fn with_history(entries: impl IntoIterator<Item = u64>) -> Self {
        let mut m = Self::new();
        m.overlimit_entries = entries.into_iter().collect();
        m
    }

    /// Takes over the Overlimit stay of an earlier run of the monitor (restarted by systemd or
    /// an operator; see `daemon::resume`): Overlimit with the hold its entries in the window
    /// give ([`MachineConfig::hold_ms`], the stay itself being the last entry), the metrics
    /// calm since monotonic ms `calm_since_ms` when the earlier run's hold was running, else
    /// the hold starts at the first calm sample. No transition and no eviction: the earlier
    /// run made them, and its evictions in flight are resumed from the ledger.
    pub fn resume_overlimit(&mut self, cfg: &MachineConfig, calm_since_ms: Option<u64>) {
        self.state = State::Overlimit;
        self.hold_ms = cfg.hold_ms(self.overlimit_entries.len().max(1));
        self.calm_since_ms = calm_since_ms;
        self.over_since_ms = None;
    }

    /// Takes over the Disabled state an earlier run of the monitor entered for critical XID
    /// `code` at monotonic ms `since_ms` (see `daemon::resume`). The kernel log and NVML's
    /// events are followed from their end, so without this a restart (the OOM killer, the
    /// watchdog, an upgrade) would put a GPU with a fatal XID back in service. It leaves
    /// Disabled as the earlier run would have: `xid_disable_ms` after `since_ms`, or (0) when
    /// an operator enables it.
    pub fn resume_xid_disabled(&mut self, code: u64, since_ms: u64) {
        self.state = State::Disabled;
        self.disabled_by = Some(DisableCause::Xid(code));
        self.disabled_at_ms = since_ms;
        self.calm_since_ms = None;
        self.over_since_ms = None;
        self.good_samples = 0;
    }

    /// Disabled while an Overlimit hold had not run out: that hold is served (calm for
    /// `hold_ms` from the first calm sample) once Disabled's own cause is over.
    pub fn hold_interrupted(&self) -> bool {
        self.state == State::Disabled && self.hold_interrupted
    }

    /// Takes over an Overlimit hold an earlier run of the monitor had not finished when its GPU
    /// went Disabled (its state file's `hold_interrupted`): the machine, Disabled as resumed
    /// ([`Machine::resume_xid_disabled`]), leaves Disabled only after the metrics have been calm
    /// for the hold its Overlimit entries give, as the earlier run would have.
    pub fn resume_interrupted_hold(&mut self, cfg: &MachineConfig) {
        if self.state == State::Disabled {
            self.hold_interrupted = true;
            self.hold_ms = cfg.hold_ms(self.overlimit_entries.len().max(1));
            self.calm_since_ms = None;
        }
    }

    /// The critical XID (code, monotonic ms seen) an operator's Disabled hides: what the GPU
    /// stays Disabled by once the operator enables it.
    pub fn xid_under_operator(&self) -> Option<(u64, u64)> {
        self.xid_under_operator
    }

    /// Since when (monotonic ms) the machine is Disabled, while it is.
    pub fn disabled_since_ms(&self) -> Option<u64> {
        (self.state == State::Disabled).then_some(self.disabled_at_ms)
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Why the machine is Disabled, while it is.
    pub fn disabled_by(&self) -> Option<DisableCause> {
        self.disabled_by
    }

    /// Overlimit entries still inside the window at `now_ms`.
    pub fn overlimit_entries(&self) -> impl Iterator<Item = u64> + '_ {
        self.overlimit_entries.iter().copied()
    }

    /// Time left in the current Overlimit hold, if the metrics are calm and the hold is running.
    pub fn hold_remaining_ms(&self, now_ms: u64) -> Option<u64> {
        match (self.state, self.calm_since_ms) {
            (State::Overlimit, Some(t)) => {
                Some(self.hold_ms.saturating_sub(now_ms.saturating_sub(t)))
            }
            _ => None,
        }
    }

    /// The hold that applies to the current (or last) Overlimit stay.
    pub fn current_hold_ms(&self) -> u64 {
        self.hold_ms
    }

    /// Advances the machine by one input observed at `now_ms` (monotonic).
    pub fn step(&mut self, cfg: &MachineConfig, now_ms: u64, input: Input) -> Step {
        let mut out = Step::default();
        self.prune(cfg, now_ms);
        match input {
            Input::OperatorDisable => {
                if let (State::Disabled, Some(DisableCause::Xid(code))) = (self.state, self.disabled_by) {
                    self.xid_under_operator = Some((code, self.disabled_at_ms));
                }
                self.disable(now_ms, DisableCause::Operator, "operator disabled the GPU".into(), &mut out)
            }
            Input::OperatorEnable => match self.xid_under_operator.take() {
                Some((code, at)) if self.state == State::Disabled => {
                    // Still Disabled (no transition), now by the XID, from when it came.
                    self.disabled_by = Some(DisableCause::Xid(code));
                    self.disabled_at_ms = at;
                }
                _ if self.state == State::Disabled => self.reset_to_init("operator enabled the GPU", &mut out),
                _ => {}
            },
            Input::Xid(code) => {
                if self.disabled_by == Some(DisableCause::Operator) {
                    self.xid_under_operator = Some((code, now_ms));
                } else {
                    self.disable(
                        now_ms,
                        DisableCause::Xid(code),
                        format!("XID {code} reported"),
                        &mut out,
                    );
                }
            }
            Input::SampleError => {
                self.good_samples = 0;
                self.nvml_errors = self.nvml_errors.saturating_add(1);
                if self.state != State::Disabled && self.nvml_errors >= cfg.nvml_error_limit {
                    let why = format!("{} consecutive NVML sampling errors", self.nvml_errors);
                    self.disable(now_ms, DisableCause::Nvml, why, &mut out);
                }
            }
            Input::Sample(m) => {
                self.nvml_errors = 0;
                self.good_samples = self.good_samples.saturating_add(1);
                self.on_sample(cfg, now_ms, &m, &mut out);
            }
        }
        out
    }

    fn on_sample(&mut self, cfg: &MachineConfig, now_ms: u64, m: &Metrics, out: &mut Step) {
        if self.state == State::Disabled {
            let recovered = match self.disabled_by {
                Some(DisableCause::Nvml) => self.good_samples >= cfg.nvml_recover_samples.max(1),
                Some(DisableCause::Xid(_)) => {
                    cfg.xid_disable_ms > 0
                        && now_ms.saturating_sub(self.disabled_at_ms) >= cfg.xid_disable_ms
                }
                Some(DisableCause::Operator) | None => false,
            };
            if !recovered {
                return;
            }
            // The Overlimit hold Disabled interrupted: calm for that long first (the hold runs
            // again from the first calm sample once Disabled's own cause is over).
            if self.hold_interrupted {
                if worst_level(cfg, m).0 == Level::Overlimit {
                    self.calm_since_ms = None;
                    return;
                }
                let since = *self.calm_since_ms.get_or_insert(now_ms);
                if now_ms.saturating_sub(since) < self.hold_ms {
                    return;
                }
            }
            let mut why = match self.disabled_by {
                Some(DisableCause::Xid(c)) => {
                    format!("XID {c} quiet for {} ms", cfg.xid_disable_ms)
                }
                _ => format!("{} good samples after NVML errors", self.good_samples),
            };
            if std::mem::take(&mut self.hold_interrupted) {
                why.push_str(&format!(", then calm for the {} ms Overlimit hold it interrupted", self.hold_ms));
                self.calm_since_ms = None;
            }
            self.reset_to_init(&why, out);
            // Init waits for the next sample, so recovery is visible as its own step.
            return;
        }
        if self.state == State::Init {
            self.go(
                State::Healthy,
                "initialization finished (first good sample)".into(),
                out,
            );
        }
        let (worst, kind, value) = worst_level(cfg, m);
        let describe = |lvl: &str| match kind {
            Some(MetricKind::SmActivity) if m.colocated && m.sm_spatial && !m.offline_only => {
                format!(
                    "sm_activity online share = {value:.1} (total {:.1}, offline cap {:.0} %) past its {lvl} threshold",
                    m.sm_activity, m.offline_sm_cap_pct
                )
            }
            Some(k) => format!("{} = {:.1} past its {lvl} threshold", k.as_str(), value),
            None => String::new(),
        };
        // Overlimit only once it has lasted `overlimit_sustain_ms`; until then the GPU is
        // Unhealthy (admits no new offline work) while the throttle takes offline load away.
        let sustained = if worst == Level::Overlimit
            && matches!(self.state, State::Healthy | State::Unhealthy)
        {
            let since = *self.over_since_ms.get_or_insert(now_ms);
            now_ms.saturating_sub(since) >= cfg.overlimit_sustain_ms
        } else {
            self.over_since_ms = None;
            false
        };
        let over_why = || {
            let mut w = describe("overlimit");
            if cfg.overlimit_sustain_ms > 0 {
                w.push_str(&format!(" for {} ms", cfg.overlimit_sustain_ms));
            }
            w
        };
        match self.state {
            State::Healthy => {
                if sustained {
                    self.enter_overlimit(cfg, now_ms, over_why(), out);
                } else if worst >= Level::Unhealthy {
                    self.go(
                        State::Unhealthy,
                        describe(if worst == Level::Overlimit {
                            "overlimit"
                        } else {
                            "unhealthy"
                        }),
                        out,
                    );
                }
            }
            State::Unhealthy => {
                if sustained {
                    self.enter_overlimit(cfg, now_ms, over_why(), out);
                } else if worst == Level::Calm {
                    self.go(
                        State::Healthy,
                        "all metrics below their healthy thresholds".into(),
                        out,
                    );
                }
            }
            State::Overlimit => {
                if worst == Level::Overlimit {
                    self.calm_since_ms = None;
                } else {
                    let since = *self.calm_since_ms.get_or_insert(now_ms);
                    if now_ms.saturating_sub(since) >= self.hold_ms {
                        let why = format!(
                            "all metrics under overlimit for the {} ms hold",
                            self.hold_ms
                        );
                        self.calm_since_ms = None;
                        self.go(State::Unhealthy, why, out);
                    }
                }
            }
            State::Init | State::Disabled => {}
        }
    }

    fn enter_overlimit(&mut self, cfg: &MachineConfig, now_ms: u64, why: String, out: &mut Step) {
        self.over_since_ms = None;
        self.overlimit_entries.push_back(now_ms);
        self.hold_ms = cfg.hold_ms(self.overlimit_entries.len());
        self.calm_since_ms = None;
        let reason = format!(
            "{why}; hold {} ms ({} entries in window)",
            self.hold_ms,
            self.overlimit_entries.len()
        );
        self.go(State::Overlimit, reason.clone(), out);
        out.actions.push(Action::EvictOffline { reason });
    }

    fn disable(&mut self, now_ms: u64, cause: DisableCause, why: String, out: &mut Step) {
        let was_disabled = self.state == State::Disabled;
        if self.state == State::Overlimit {
            self.hold_interrupted = true;
        }
        self.disabled_by = Some(cause);
        self.disabled_at_ms = now_ms;
        self.calm_since_ms = None;
        self.good_samples = 0;
        if !was_disabled {
            self.go(State::Disabled, why.clone(), out);
            out.actions.push(Action::EvictOffline { reason: why });
        }
    }

    fn reset_to_init(&mut self, why: &str, out: &mut Step) {
        self.over_since_ms = None;
        self.disabled_by = None;
        // Served (the recovery path takes it first) or waived: an operator's enable puts the
        // GPU back in service at once, and a later Disabled must not serve this old hold.
        self.hold_interrupted = false;
        self.nvml_errors = 0;
        self.good_samples = 0;
        self.go(State::Init, why.to_string(), out);
    }

    fn go(&mut self, to: State, reason: String, out: &mut Step) {
        out.transitions.push(Transition {
            from: self.state,
            to,
            reason,
        });
        self.state = to;
    }

    fn prune(&mut self, cfg: &MachineConfig, now_ms: u64) {
        while let Some(&t) = self.overlimit_entries.front() {
            if now_ms.saturating_sub(t) >= cfg.overlimit_window_ms {
                self.overlimit_entries.pop_front();
            } else {
                break;
            }
        }
    }
}

/// The value the machine judges for metric `k` and the worst level it may reach there:
/// the whole reading, except when offline work is on the GPU (see [`Metrics::offline_only`]
/// and [`Metrics::colocated`]): MuxFlow's monitor evicts only for a demand the throttle cannot
/// take away, the online workload's own.
pub fn judged(m: &Metrics, k: MetricKind) -> (f64, Level) {
    let v = m.get(k);
    match k {
        MetricKind::MemUsed => (v, Level::Overlimit),
        _ if m.offline_only => (v, Level::Unhealthy),
        MetricKind::GpuUtil if m.colocated => (v, Level::Unhealthy),
        MetricKind::SmActivity if m.colocated && m.sm_spatial => {
            (online_share(v, m.offline_sm_cap_pct), Level::Overlimit)
        }
        MetricKind::SmActivity if m.colocated => (v, Level::Unhealthy),
        _ => (v, Level::Overlimit),
    }
}

/// The worst level over the enabled metrics, with the metric and (judged) value that set it.
pub fn worst_level(cfg: &MachineConfig, m: &Metrics) -> (Level, Option<MetricKind>, f64) {
    let mut worst = (Level::Calm, None, 0.0);
    for k in MetricKind::ALL {
        let t = cfg.threshold(k);
        if !t.enabled {
            continue;
        }
        let (v, most) = judged(m, k);
        let l = t.level(v).min(most);
        if l > worst.0 {
            worst = (l, Some(k), v);
        }
    }
    worst
}

#[cfg(test)]
mod tests;
