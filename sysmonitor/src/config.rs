//! The monitor's configuration schema, defaults and validation.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::health::MachineConfig;
pub use node_daemon::evictor::EvictorConfig;
use node_daemon::layered::{self, ConfigError};

/// Default location of the base config file.
pub const DEFAULT_PATH: &str = "/etc/xshare/sysmonitor.json";

/// Longest accepted period of the daemon's periodic work (`state_file_every_ms`,
/// `host_memory.check_every_ms`, `host_memory.psi_sustain_ms`, `verify.every_ms`): 1 hour.
pub const MAX_PERIOD_MS: u64 = 3_600_000;
/// Longest accepted Overlimit hold (`machine.hold_base_ms`, `machine.hold_max_ms`): 1 day.
pub const MAX_HOLD_MS: u64 = 86_400_000;
/// Longest accepted `machine.overlimit_window_ms` and `machine.xid_disable_ms`: 7 days.
pub const MAX_WINDOW_MS: u64 = 7 * 86_400_000;
/// Longest accepted `evictor.grace_ms` (SIGTERM to SIGKILL): 10 minutes.
pub const MAX_GRACE_MS: u64 = 600_000;
/// Shortest accepted `evictor.grace_ms`: [`node_ledger::MIN_EVICT_GRACE_MS`] (1 s), so that
/// the SIGKILL never follows the SIGTERM at the next tick.
pub const MIN_GRACE_MS: u64 = node_ledger::MIN_EVICT_GRACE_MS;
/// Largest accepted `machine.nvml_error_limit` (consecutive failed samples before Disabled):
/// 1 s of samples at the default 10 ms interval, 10 s at the idle pace. A larger one would
/// keep a GPU whose NVML keeps failing Healthy (admitting offline work) for as long.
pub const MAX_NVML_ERROR_LIMIT: u32 = 100;
/// Longest accepted `history_secs`: one day.
pub const MAX_HISTORY_SECS: u64 = 86_400;
/// Longest accepted `interval_ms`: one minute.
pub const MAX_INTERVAL_MS: u64 = 60_000;
/// Longest accepted `idle_interval_ms`: one second. A process that registers waits up to one
/// idle interval for fresh samples (the shim's throttle judges a sample stale after its
/// `throttle.stale_after_ms`, 500 by default, and then runs at its fallback rate).
pub const MAX_IDLE_INTERVAL_MS: u64 = 1_000;

/// Everything `sysmonitor run` reads from its config files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// NVML index of the GPU this instance watches.
    #[serde(default)]
    pub gpu_index: u32,
    /// Sampling interval in milliseconds (1 ms and up).
    #[serde(default = "d_interval")]
    pub interval_ms: u64,
    /// Sampling interval, ms, while nothing on this GPU needs `interval_ms`: no offline
    /// process registered, the GPU Healthy and no eviction in flight. There is nothing to
    /// throttle or evict then; health is still judged (admission, state file, metrics) at this
    /// pace. A registration is seen within one idle interval (the registry is read at every
    /// idle sample), and from then on the GPU is sampled every `interval_ms`. `0`, or a value
    /// not above `interval_ms`, samples every `interval_ms` always. At most
    /// [`MAX_IDLE_INTERVAL_MS`]: keep it under the shim's `throttle.stale_after_ms` (500).
    #[serde(default = "d_idle_interval")]
    pub idle_interval_ms: u64,
    /// How much sample history to keep in memory, in seconds.
    #[serde(default = "d_history")]
    pub history_secs: u64,
    /// Directory of the per-GPU ledgers (`<dir>/gpu<N>/ledger`), shared with the shim and the
    /// MPS manager; `$XSHARE_LEDGER_DIR` overrides it.
    #[serde(default = "d_ledger")]
    pub ledger_dir: PathBuf,
    /// Permission bits of the ledger file, octal (`"0666"`: offline processes run as arbitrary
    /// users and must all reach it; `"0660"` with `ledger_group` when they share a group). Set
    /// explicitly on every start, whatever the service's umask.
    #[serde(default = "d_ledger_mode")]
    pub ledger_mode: String,
    /// Group owning the ledger file (a name from the group database, or a numeric gid).
    #[serde(default)]
    pub ledger_group: Option<String>,
    /// JSON state file for the cluster component (rewritten atomically); empty means
    /// `<ledger_dir>/daemons/gpu<N>/state.json` (the daemon-only directory, never mounted into
    /// a container). `{gpu}` is replaced by the GPU index: every GPU's
    /// monitor needs its own file (a second monitor given one another GPU's monitor writes is
    /// refused at start).
    #[serde(default)]
    pub state_file: PathBuf,
    /// Heartbeat of the state file, ms: it is rewritten in the tick anything its readers act
    /// on changes (health, Disabled cause, hold, evictions, registered offline processes,
    /// config and ledger errors), and otherwise at least this often with the latest sample
    /// and counters, so a reader can tell a live monitor from a dead one. The metrics endpoint
    /// is refreshed with it. (The shim, the MPS manager and node-agent read the monitor block
    /// of the status file, `<ledger_dir>/status/gpu<N>`, published every sample.)
    #[serde(default = "d_state_every")]
    pub state_file_every_ms: u64,
    /// Prometheus endpoint: `host:port`, or `unix:/path`; absent for none. Every GPU's
    /// monitor needs its own: `{gpu}` is replaced by the GPU index (`unix:/run/xshare/metrics-{gpu}.sock`),
    /// and a port written `PORT+{gpu}` is PORT plus the index (`127.0.0.1:9410+{gpu}`: 9410
    /// for GPU 0, 9411 for GPU 1). [`metrics_address`] resolves it.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Thresholds and timing of the health machine.
    #[serde(default)]
    pub machine: MachineConfig,
    /// Host memory pressure checks.
    #[serde(default)]
    pub host_memory: HostMemoryConfig,
    /// How offline processes are evicted.
    #[serde(default)]
    pub evictor: EvictorConfig,
    /// Checks of ledger-reported memory against NVML.
    #[serde(default)]
    pub verify: VerifyConfig,
    /// How often the NVML queries not made at every sample are made.
    #[serde(default)]
    pub nvml: NvmlPaceConfig,
    /// Rotation of the GPU's eviction log (`<ledger_dir>/evict-log/gpu<N>.jsonl`, read by
    /// node-agent): size bound per file and rotated generations kept.
    #[serde(default)]
    pub evict_log: node_ledger::evictlog::Rotation,
    /// XID codes that disable the device (default: the GPU's own faults, not the application
    /// XIDs of [`APPLICATION_XIDS`]).
    #[serde(default = "d_xids")]
    pub xid_critical: Vec<u64>,
    /// Also read XIDs from this kernel log (`/dev/kmsg`, a syslog file) besides NVML events.
    #[serde(default)]
    pub xid_log: Option<PathBuf>,
    /// Only XID lines naming this GPU count: its PCI address as the driver writes it between
    /// the parentheses (`PCI:0000:3b:00`, or `0000:3b:00`), compared whole.
    #[serde(default)]
    pub xid_log_match: Option<String>,
    /// The operator's floor for the launch throttles of the offline processes on this GPU,
    /// published in the status file with every sample (a reload changes what is published).
    #[serde(default)]
    pub offline_throttle: OfflineThrottleConfig,
}

/// The operator's floor for offline launch throttles ([`node_ledger::ThrottleFloor`]): an
/// offline process controls its own environment and so its shim's configuration
/// (`XCUDA_THROTTLE`, `XCUDA_TARGET_LOAD`, `XCUDA_FALLBACK_RATE`, a file of its own in
/// `XCUDA_CONFIG`); every shim on the GPU holds its throttle to this floor, which only the
/// daemons can write: a process may tighten its throttle, never loosen it past the floor. The
/// defaults are the shim's shipped settings (`xshare_control::ThrottleConfig::default`), so a
/// shim left at its defaults is unchanged. A shim keeps the tightest floor it has seen for its
/// life: a reload that loosens the floor applies to processes started after it; one that
/// tightens it applies to running ones within a controller period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OfflineThrottleConfig {
    /// A shim may not turn its throttle off (`XCUDA_THROTTLE=0`, `throttle.enabled: false`),
    /// nor loosen its control law past the shipped one (its bucket depth, online-pressure
    /// hold, clock weights, gains, period and staleness: `xshare_control::ThrottleConfig::law_within`).
    pub required: bool,
    /// Highest load target (U_GPU, the shim's `throttle.target_load`) a shim may aim at.
    pub max_target_load: f64,
    /// Highest launch rate (the shim's `throttle.max_rate`), SM-waves per second.
    pub max_rate: f64,
    /// Highest rate while monitor data are missing or stale (the shim's
    /// `throttle.fallback_rate`), SM-waves per second.
    pub max_fallback_rate: f64,
}

impl Default for OfflineThrottleConfig {
    fn default() -> Self {
        let d = xshare_control::ThrottleConfig::default();
        OfflineThrottleConfig {
            required: true,
            max_target_load: d.target_load,
            max_rate: d.max_rate,
            max_fallback_rate: d.fallback_rate,
        }
    }
}

impl OfflineThrottleConfig {
    /// Range checks, as the shim checks its own `throttle` settings (its shipped `min_rate`
    /// standing for the lowest rate); returns `(field within the block, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let min_rate = xshare_control::ThrottleConfig::default().min_rate;
        if !(self.max_target_load > 0.0 && self.max_target_load.is_finite()) {
            return Err(("max_target_load".into(), format!("must be a positive number, got {}", self.max_target_load)));
        }
        if !(self.max_rate >= min_rate && self.max_rate.is_finite()) {
            return Err(("max_rate".into(), format!("must be finite and >= {min_rate} (the shim's min_rate), got {}", self.max_rate)));
        }
        if !(self.max_fallback_rate >= min_rate && self.max_fallback_rate <= self.max_rate) {
            return Err((
                "max_fallback_rate".into(),
                format!("must lie within [{min_rate}, max_rate = {}], got {}", self.max_rate, self.max_fallback_rate),
            ));
        }
        Ok(())
    }

    /// What the status file carries.
    pub fn floor(&self) -> node_ledger::ThrottleFloor {
        node_ledger::ThrottleFloor {
            required: self.required,
            max_target_load: self.max_target_load,
            max_rate: self.max_rate,
            max_fallback_rate: self.max_fallback_rate,
        }
    }
}

/// Host memory pressure: evict offline work when memory runs short or reclaim stays busy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostMemoryConfig {
    /// Whether host memory is checked at all.
    pub enabled: bool,
    /// Evict when MemAvailable falls below this percentage of MemTotal.
    pub min_available_pct: f64,
    /// Evict when PSI `some avg10` stays at or above this percentage ...
    pub psi_some_avg10_pct: f64,
    /// ... for this long, ms.
    pub psi_sustain_ms: u64,
    /// How often to read /proc, ms (host memory moves slower than the GPU).
    pub check_every_ms: u64,
    /// Where MemTotal/MemAvailable are read (`/proc/meminfo`).
    pub meminfo_path: PathBuf,
    /// Where memory PSI is read (`/proc/pressure/memory`).
    pub psi_path: PathBuf,
}

impl Default for HostMemoryConfig {
    fn default() -> Self {
        HostMemoryConfig {
            enabled: true,
            min_available_pct: 5.0,
            psi_some_avg10_pct: 40.0,
            psi_sustain_ms: 10_000,
            check_every_ms: 500,
            meminfo_path: "/proc/meminfo".into(),
            psi_path: "/proc/pressure/memory".into(),
        }
    }
}

/// How often the monitor makes the NVML queries it does not need at every sample: what costs
/// much or changes slowly. `sysmonitor nvml-cost` shows what each query costs on this GPU and
/// what these paces add up to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlPaceConfig {
    /// GPM SM activity (Hopper and later), read at most this often, ms. `nvmlGpmMetricsGet`
    /// costs 0.75 ms of CPU back to back and 1.8-1.9 ms spaced as the monitor makes it (H200,
    /// driver 580: 0.37 % of a core at 500 ms), and the driver refreshes the counters it
    /// reads about once a second: a read more often than that mostly finds the same snapshot;
    /// a read less often leaves the throttle on older SM activity. At 1000 (the default) the
    /// kit's throttle check on the H200 settled at 0.61x of the solo rate, 0.63x at 500
    /// (target load 0.5). Within [`MIN_GPM_EVERY_MS`]..=[`MAX_GPM_EVERY_MS`].
    pub gpm_every_ms: u64,
    /// Device memory in use (`nvmlDeviceGetMemoryInfo`), read at most this often, ms; the
    /// sample carries the last reading in between. Spaced as the monitor spaces its calls,
    /// the query costs 30-40 us of CPU on an H200 (driver 580), 5 us back to back: at every
    /// 10 ms sample that alone was 0.4 % of a core. Memory is a health metric judged over
    /// seconds (`overlimit_sustain_ms`); the quota itself is the shim's, at every allocation.
    /// At most [`MAX_MEMORY_EVERY_MS`].
    pub memory_every_ms: u64,
    /// Why the SM clock is below its top (`nvmlDeviceGetCurrentClocksThrottleReasons`: an idle
    /// GPU's low clock is no sign of load), asked again at most this often while the clock
    /// stays where it was, ms; a clock that moves is asked about at once. An idle GPU keeps
    /// its clock low and still, so this is a query at every sample otherwise (8-16 us of CPU
    /// spaced as the monitor makes it on an H200). At most [`MAX_CLOCK_REASONS_EVERY_MS`].
    pub clock_reasons_every_ms: u64,
    /// Power draw and temperature (shown, not judged), ms. NVML's power reading is itself an
    /// average over about a second on recent GPUs.
    pub power_temp_every_ms: u64,
    /// XID events (NVML's critical-XID event set, and `xid_log`), ms: a critical XID disables
    /// the GPU at most this long after it is reported. At most [`MAX_XID_EVERY_MS`].
    pub xid_every_ms: u64,
}

/// Shortest accepted `nvml.gpm_every_ms`.
pub const MIN_GPM_EVERY_MS: u64 = 100;
/// Longest accepted `nvml.gpm_every_ms`: beyond it, a GPU that stays busy could read as the
/// same snapshot (see `sampler::GPM_SAME_SNAPSHOT_MS`).
pub const MAX_GPM_EVERY_MS: u64 = 2_000;
/// Longest accepted `nvml.memory_every_ms`.
pub const MAX_MEMORY_EVERY_MS: u64 = 1_000;
/// Longest accepted `nvml.clock_reasons_every_ms`.
pub const MAX_CLOCK_REASONS_EVERY_MS: u64 = 1_000;
/// Longest accepted `nvml.xid_every_ms`.
pub const MAX_XID_EVERY_MS: u64 = 1_000;
/// Longest accepted `nvml.power_temp_every_ms`.
pub const MAX_POWER_TEMP_EVERY_MS: u64 = 60_000;

impl Default for NvmlPaceConfig {
    fn default() -> Self {
        NvmlPaceConfig {
            gpm_every_ms: 1000,
            memory_every_ms: 50,
            clock_reasons_every_ms: 100,
            power_temp_every_ms: 100,
            xid_every_ms: 50,
        }
    }
}

impl NvmlPaceConfig {
    /// Range checks; returns `(field within the block, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (f, v, lo, hi) in [
            ("gpm_every_ms", self.gpm_every_ms, MIN_GPM_EVERY_MS, MAX_GPM_EVERY_MS),
            ("memory_every_ms", self.memory_every_ms, 1, MAX_MEMORY_EVERY_MS),
            ("clock_reasons_every_ms", self.clock_reasons_every_ms, 1, MAX_CLOCK_REASONS_EVERY_MS),
            ("power_temp_every_ms", self.power_temp_every_ms, 1, MAX_POWER_TEMP_EVERY_MS),
            ("xid_every_ms", self.xid_every_ms, 1, MAX_XID_EVERY_MS),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err((f.into(), format!("must be within {lo}..={hi} ms, got {v}")));
            }
        }
        Ok(())
    }
}

/// Trust but verify: compare ledger-reported memory with NVML's per-process view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifyConfig {
    /// Whether the check runs at all.
    pub enabled: bool,
    /// Allowed excess of NVML's figure over the reported one, MiB.
    pub tolerance_mib: u64,
    /// Device memory each process's CUDA context holds outside any allocation the shim
    /// counts (code, stacks, heaps the driver reserves), MiB: NVML charges it to the process.
    /// Measured with driver 580 on an H200: about 580 MiB per context, 228-290 MiB per MPS
    /// client (`scripts/gpu-check.sh`); frameworks that raise stack or heap limits hold more.
    /// 0 on the emulator, whose contexts hold nothing.
    pub context_mib: u64,
    /// Consecutive checks a process must under-report before it is evicted.
    pub strikes: u32,
    /// How often to check, ms.
    pub every_ms: u64,
    /// node-agent's list of the offline pods on this node (`node_daemon::offline_pods`): a GPU
    /// process whose cgroup names one of them and that has no registration is offline work
    /// without the shim, even when none of its pod's processes registered. Empty: the default
    /// `<ledger_dir>/offline-pods.json`. With no such file, only containers with a registered
    /// process are checked.
    pub offline_pods_file: PathBuf,
    /// What becomes of a planned pod's process registered under another quota group than its
    /// pod's (`k8s-pod-<uid>`): `evict` (`foreign_group`) or `report` (a WARN once per
    /// process). Its allocations are charged to the other pod's quota; `report` is for a
    /// cluster that runs the extender without its bind lock (`--bind-lock-ttl-s 0`), where
    /// node-agent's Allocate may take a container for another pending pod's (two planned pods
    /// pending on a node at once).
    pub foreign_group: ForeignGroupAction,
}

/// [`VerifyConfig::foreign_group`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForeignGroupAction {
    /// Evict the process (`foreign_group`).
    #[default]
    Evict,
    /// Log a WARN once per process, evict nothing.
    Report,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig {
            enabled: true,
            tolerance_mib: 64,
            context_mib: 1024,
            strikes: 3,
            every_ms: 200,
            offline_pods_file: PathBuf::new(),
            foreign_group: ForeignGroupAction::Evict,
        }
    }
}

fn d_interval() -> u64 {
    10
}
fn d_idle_interval() -> u64 {
    100
}
fn d_history() -> u64 {
    300
}
fn d_ledger() -> PathBuf {
    node_ledger::config::DEFAULT_LEDGER_DIR.into()
}
fn d_ledger_mode() -> String {
    format!("{:04o}", node_ledger::ledger::DEFAULT_FILE_MODE)
}
fn d_state_every() -> u64 {
    1000
}
fn d_xids() -> Vec<u64> {
    // Faults of the GPU itself: double-bit ECC (48), internal micro-controller halt (61, 62),
    // row remapping and page retirement (63, 64), NVLink (74), fallen off the bus (79), ECC
    // rates and uncontained errors (92, 94, 95). Not the application XIDs (APPLICATION_XIDS).
    vec![48, 61, 62, 63, 64, 74, 79, 92, 94, 95]
}

/// XIDs that report one process's own fault, not the GPU's (NVIDIA's XID catalog: "user
/// application error"; NVIDIA's device plugin keeps a GPU healthy on them): graphics engine
/// exception (13), GPU memory page fault (31), GPU stopped processing (43), preemptive cleanup
/// (45), video processor exception (68). Under MPS the server itself tears down the faulting
/// client; on an H200 (driver 580) an offline client SIGKILLed with kernels in flight was
/// followed by XID 31 on its online neighbour. Disabling the GPU for them would let any job's
/// bug, or one `kill -9`, stop offline sharing on the node until an operator re-enables it.
/// Not in the default `xid_critical`; an operator may still list them.
pub const APPLICATION_XIDS: [u64; 5] = [13, 31, 43, 45, 68];

impl Default for Config {
    fn default() -> Self {
        serde_json::from_str("{}").expect("empty config takes all defaults")
    }
}

/// `metrics_listen` for GPU `gpu`: `{gpu}` replaced by the index and a TCP port written
/// `PORT+N` summed (`127.0.0.1:9410+{gpu}` is `127.0.0.1:9411` for GPU 1); `unix:/path` or
/// `host:port` out, or why not.
pub fn metrics_address(listen: &str, gpu: u32) -> Result<String, String> {
    let l = listen.replace(node_daemon::cli::GPU_PLACEHOLDER, &gpu.to_string());
    if l.starts_with("unix:") {
        return Ok(l);
    }
    let bad = || format!("`{listen}` is neither host:port (host:PORT+{{gpu}} for a port per GPU) nor unix:/path");
    let (host, port) = l.rsplit_once(':').ok_or_else(bad)?;
    let port = match port.split_once('+') {
        Some((a, b)) => {
            let (a, b) = (a.parse::<u16>().map_err(|_| bad())?, b.parse::<u16>().map_err(|_| bad())?);
            a.checked_add(b)
                .ok_or_else(|| format!("`{listen}`: port {a}+{b} for GPU {gpu} is past 65535"))?
        }
        None => port.parse::<u16>().map_err(|_| bad())?,
    };
    let a = format!("{host}:{port}");
    a.parse::<std::net::SocketAddr>().map_err(|_| bad())?;
    Ok(a)
}

impl Config {
    /// Semantic checks; returns `(dotted field, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        self.ledger_mode_bits()
            .map_err(|m| ("ledger_mode".to_string(), m))?;
        self.ledger_gid()
            .map_err(|m| ("ledger_group".to_string(), m))?;
        if self.interval_ms == 0 {
            return Err(("interval_ms".into(), "must be >= 1".into()));
        }
        if self.interval_ms > MAX_INTERVAL_MS {
            return Err((
                "interval_ms".into(),
                format!("must be <= {MAX_INTERVAL_MS}, got {}", self.interval_ms),
            ));
        }
        if self.idle_interval_ms > MAX_IDLE_INTERVAL_MS {
            return Err((
                "idle_interval_ms".into(),
                format!(
                    "must be <= {MAX_IDLE_INTERVAL_MS} (0: always interval_ms), got {}",
                    self.idle_interval_ms
                ),
            ));
        }
        if self.history_secs == 0 || self.history_secs > MAX_HISTORY_SECS {
            return Err((
                "history_secs".into(),
                format!(
                    "must be within 1..={MAX_HISTORY_SECS}, got {}",
                    self.history_secs
                ),
            ));
        }
        if !(MIN_GRACE_MS..=MAX_GRACE_MS).contains(&self.evictor.grace_ms) {
            return Err((
                "evictor.grace_ms".into(),
                format!(
                    "must be within {MIN_GRACE_MS}..={MAX_GRACE_MS} ms (1 s to 10 min) between SIGTERM and SIGKILL \
                     (a shorter grace SIGKILLs a process that is still leaving MPS), got {}",
                    self.evictor.grace_ms
                ),
            ));
        }
        if self.machine.nvml_error_limit > MAX_NVML_ERROR_LIMIT {
            return Err((
                "machine.nvml_error_limit".into(),
                format!(
                    "must be within 1..={MAX_NVML_ERROR_LIMIT} consecutive failed samples (a larger limit keeps a GPU \
                     whose NVML fails Healthy for as long), got {}",
                    self.machine.nvml_error_limit
                ),
            ));
        }
        // Relative, a path would be resolved against whatever directory the daemon was
        // started in (systemd: `/`), and the monitor, the shims, mps-manager and node-agent
        // would not agree on it.
        if !self.ledger_dir.is_absolute() {
            return Err((
                "ledger_dir".into(),
                format!("must be an absolute directory (default {}), got {:?}", node_ledger::config::DEFAULT_LEDGER_DIR, self.ledger_dir),
            ));
        }
        for (f, p) in [("state_file", &self.state_file), ("verify.offline_pods_file", &self.verify.offline_pods_file)] {
            if !(p.as_os_str().is_empty() || p.is_absolute()) {
                return Err((f.into(), format!("must be an absolute path or empty (the default below ledger_dir), got {p:?}")));
            }
        }
        if let Some(p) = self.xid_log.as_ref().filter(|p| !p.is_absolute()) {
            return Err(("xid_log".into(), format!("must be an absolute path (\"/dev/kmsg\") or null, got {p:?}")));
        }
        self.machine
            .validate()
            .map_err(|(f, m)| (format!("machine.{f}"), m))?;
        // Periods and durations the daemon adds to a clock: bounded, so that none overflows
        // (a panic in a debug build, a state file rewritten at every tick in a release one)
        // and none silently means "never".
        for (f, v, max) in [
            ("state_file_every_ms", self.state_file_every_ms, MAX_PERIOD_MS),
            ("machine.hold_base_ms", self.machine.hold_base_ms, MAX_HOLD_MS),
            ("machine.hold_max_ms", self.machine.hold_max_ms, MAX_HOLD_MS),
            ("machine.overlimit_window_ms", self.machine.overlimit_window_ms, MAX_WINDOW_MS),
            ("machine.xid_disable_ms", self.machine.xid_disable_ms, MAX_WINDOW_MS),
            ("host_memory.check_every_ms", self.host_memory.check_every_ms, MAX_PERIOD_MS),
            ("host_memory.psi_sustain_ms", self.host_memory.psi_sustain_ms, MAX_PERIOD_MS),
            ("verify.every_ms", self.verify.every_ms, MAX_PERIOD_MS),
        ] {
            if v > max {
                return Err((f.into(), format!("must be <= {max} ms, got {v}")));
            }
        }
        let h = &self.host_memory;
        // 100 % would evict every offline process at every check (MemAvailable is always
        // below MemTotal); 0 never evicts by this measure.
        if !(0.0..100.0).contains(&h.min_available_pct) {
            return Err((
                "host_memory.min_available_pct".into(),
                format!(
                    "must be within 0 (off) ..< 100 (100 would evict all offline work at every check), got {}",
                    h.min_available_pct
                ),
            ));
        }
        // PSI's `some avg10` is >= 0 on every host: a 0 threshold would evict every offline
        // process after `psi_sustain_ms`, an idle host's included.
        if !(h.psi_some_avg10_pct > 0.0 && h.psi_some_avg10_pct <= 100.0) {
            return Err((
                "host_memory.psi_some_avg10_pct".into(),
                format!(
                    "must be within 0 <.. 100 (0 would evict all offline work on an idle host; \
                     `host_memory.enabled: false` turns the host-memory checks off), got {}",
                    h.psi_some_avg10_pct
                ),
            ));
        }
        self.evictor.check_command().map_err(|m| ("evictor.command".to_string(), m))?;
        self.evict_log
            .validate()
            .map_err(|(f, m)| (format!("evict_log.{f}"), m))?;
        self.nvml
            .validate()
            .map_err(|(f, m)| (format!("nvml.{f}"), m))?;
        self.offline_throttle
            .validate()
            .map_err(|(f, m)| (format!("offline_throttle.{f}"), m))?;
        if self.verify.strikes == 0 {
            return Err(("verify.strikes".into(), "must be >= 1".into()));
        }
        for (f, v) in [
            ("verify.tolerance_mib", self.verify.tolerance_mib),
            ("verify.context_mib", self.verify.context_mib),
        ] {
            if v > 1 << 20 {
                return Err((
                    f.into(),
                    format!("{v} MiB is more than any GPU holds (at most 1048576)"),
                ));
            }
        }
        if let Some(l) = &self.metrics_listen {
            metrics_address(l, self.gpu_index).map_err(|m| ("metrics_listen".into(), m))?;
        }
        if let Some(m) = &self.xid_log_match {
            if !crate::xidlog::valid_match(m) {
                // A text that names no address would match no XID line: the GPU's faults
                // would go unseen.
                return Err((
                    "xid_log_match".into(),
                    format!(
                        "`{m}` is not a GPU's PCI bus address ([PCI:]domain:bus:device[.function] in hex, \
                         e.g. PCI:0000:3b:00 as the driver's XID lines write it, or 00000000:3B:00.0 as nvidia-smi does)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Loads `base` and its `<stem>.d/*.json` overrides, merged over the built-in defaults: a
    /// block given in part keeps the defaults of the keys it leaves out (`{"machine":
    /// {"gpu_util": {"enabled": false}}}` keeps gpu_util's thresholds).
    pub fn load(base: &Path) -> Result<(Config, Vec<PathBuf>), ConfigError> {
        layered::load_with_overrides_over(base, &Config::default(), Config::validate)
    }

    /// Applies `$XSHARE_LEDGER_DIR`, a `--gpu` override, and fills derived paths.
    pub fn finalize(&mut self, gpu: Option<u32>) {
        node_daemon::cli::apply_overrides(&mut self.ledger_dir, &mut self.gpu_index, gpu);
        if self.state_file.as_os_str().is_empty() {
            self.state_file = self.daemon_dir().join("state.json");
        }
        node_daemon::cli::expand_gpu(&mut self.state_file, self.gpu_index);
        if let Some(l) = &mut self.metrics_listen {
            // Left as written when it does not resolve: the bind at start names the error.
            if let Ok(a) = metrics_address(l, self.gpu_index) {
                *l = a;
            }
        }
    }

    /// `ledger_mode` as permission bits (validated).
    pub fn ledger_mode_bits(&self) -> Result<u32, String> {
        let t = self.ledger_mode.trim();
        let bits = u32::from_str_radix(t.trim_start_matches("0o"), 8)
            .map_err(|_| format!("`{t}` is not an octal mode like \"0660\""))?;
        if bits > 0o777 {
            return Err(format!(
                "`{t}`: only permission bits (at most 0777) are allowed"
            ));
        }
        if bits & 0o600 != 0o600 {
            return Err(format!(
                "`{t}`: the owner (the monitor) needs read and write"
            ));
        }
        Ok(bits)
    }

    /// `ledger_group` as a gid (a name is looked up in the group database).
    pub fn ledger_gid(&self) -> Result<Option<u32>, String> {
        let Some(g) = self.ledger_group.as_deref() else {
            return Ok(None);
        };
        if let Ok(n) = g.parse::<u32>() {
            return Ok(Some(n));
        }
        let name = std::ffi::CString::new(g).map_err(|_| format!("`{g}` contains a NUL"))?;
        // SAFETY: getgrnam(3) with a valid C string; the returned record is read at once, before
        // any other group-database call on this thread.
        let gr = unsafe { libc::getgrnam(name.as_ptr()) };
        if gr.is_null() {
            return Err(format!("no group named `{g}` in the group database"));
        }
        // SAFETY: non-null record from getgrnam, see above.
        Ok(Some(unsafe { (*gr).gr_gid }))
    }

    /// Where node-agent's offline pod list is read (`verify.offline_pods_file`, else its default
    /// in the ledger directory).
    pub fn offline_pods_path(&self) -> PathBuf {
        if self.verify.offline_pods_file.as_os_str().is_empty() {
            node_daemon::offline_pods::path(&self.ledger_dir)
        } else {
            self.verify.offline_pods_file.clone()
        }
    }

    /// This GPU's ledger file.
    pub fn ledger_path(&self) -> PathBuf {
        node_ledger::config::ledger_path(&self.ledger_dir, self.gpu_index)
    }

    /// This GPU's daemon-only directory (`<ledger_dir>/daemons/gpu<N>`,
    /// [`node_ledger::config::daemon_dir`]).
    pub fn daemon_dir(&self) -> PathBuf {
        node_ledger::config::daemon_dir(&self.ledger_dir, self.gpu_index)
    }

    /// This GPU's status file (`<ledger_dir>/status/gpu<N>`), where the monitor publishes.
    pub fn status_path(&self) -> PathBuf {
        node_ledger::config::status_path(&self.ledger_dir, self.gpu_index)
    }

    /// Number of samples the ring buffer keeps.
    pub fn history_len(&self) -> usize {
        (self.history_secs.saturating_mul(1000) / self.interval_ms.max(1)).clamp(16, 1_000_000)
            as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--help` lists `machine.<metric>.enabled`, yet `{"gpu_util": {"enabled": false}}` was
    /// refused ("missing field `healthy`"): a metric's block given in part keeps the defaults
    /// of the rest, as every other block does.
    #[test]
    fn a_metric_block_given_in_part_keeps_its_default_thresholds() {
        let c = load_text(r#"{"machine": {"gpu_util": {"enabled": false}, "sm_clock": {"overlimit": 50}}}"#).unwrap();
        let d = MachineConfig::default();
        assert!(!c.machine.gpu_util.enabled);
        assert_eq!(c.machine.gpu_util, crate::health::Threshold { enabled: false, ..d.gpu_util });
        assert_eq!(c.machine.sm_clock, crate::health::Threshold { overlimit: 50.0, ..d.sm_clock });
        assert_eq!((c.machine.sm_activity, c.machine.hold_base_ms), (d.sm_activity, d.hold_base_ms));
        assert_eq!(load_text("{}").unwrap(), Config::default());
        let e = load_text("{\"machine\": {\n\"gpu_util\": {\"healthy\": 95}}}").unwrap_err();
        assert_eq!((e.field.as_deref(), e.line), (Some("machine.gpu_util"), Some(2)), "still checked whole: {e}");
    }

    #[test]
    fn ledger_access_is_checked() {
        let mut c = Config::default();
        assert_eq!(c.ledger_mode_bits(), Ok(0o666));
        for bad in ["rw", "0999", "01777", "0066"] {
            c.ledger_mode = bad.into();
            assert_eq!(c.validate().unwrap_err().0, "ledger_mode", "{bad}");
        }
        c.ledger_mode = "0660".into();
        c.ledger_group = Some("no-such-group-xshare".into());
        assert_eq!(c.validate().unwrap_err().0, "ledger_group");
        c.ledger_group = Some("0".into());
        assert_eq!(c.ledger_gid(), Ok(Some(0)));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn nvml_paces_are_range_checked() {
        let ok = Config::default();
        assert_eq!((ok.nvml.gpm_every_ms, ok.nvml.memory_every_ms), (1000, 50));
        for (f, set) in [
            ("nvml.gpm_every_ms", (|c: &mut Config| c.nvml.gpm_every_ms = 10) as fn(&mut Config)),
            ("nvml.gpm_every_ms", |c| c.nvml.gpm_every_ms = 5_000),
            ("nvml.memory_every_ms", |c| c.nvml.memory_every_ms = 0),
            ("nvml.memory_every_ms", |c| c.nvml.memory_every_ms = 5_000),
            ("nvml.clock_reasons_every_ms", |c| c.nvml.clock_reasons_every_ms = 0),
            ("nvml.clock_reasons_every_ms", |c| c.nvml.clock_reasons_every_ms = 2_000),
            ("nvml.power_temp_every_ms", |c| c.nvml.power_temp_every_ms = 0),
            ("nvml.xid_every_ms", |c| c.nvml.xid_every_ms = 0),
            ("nvml.xid_every_ms", |c| c.nvml.xid_every_ms = 60_000),
        ] {
            let mut c = ok.clone();
            set(&mut c);
            assert_eq!(c.validate().unwrap_err().0, f);
        }
        let c: Config =
            serde_json::from_str(r#"{"nvml": {"gpm_every_ms": 500, "xid_every_ms": 20}}"#).unwrap();
        assert!(c.validate().is_ok());
        assert_eq!((c.nvml.gpm_every_ms, c.nvml.power_temp_every_ms, c.nvml.xid_every_ms), (500, 100, 20));
        assert!(serde_json::from_str::<Config>(r#"{"nvml": {"gpm_ms": 1000}}"#).is_err(), "a misspelt key is refused");
    }

    #[test]
    fn empty_file_gives_defaults_that_validate() {
        let c = Config::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.interval_ms, 10);
        assert_eq!(c.machine.overlimit_window_ms, 7_200_000);
    }

    #[test]
    fn broken_threshold_names_file_line_field() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sysmonitor.json");
        std::fs::write(
            &p,
            "{\n \"machine\": {\n  \"gpu_util\": {\"healthy\": 90, \"unhealthy\": 80, \"overlimit\": 95},\n  \"sm_activity\": {\"healthy\": 1, \"unhealthy\": 2, \"overlimit\": 3},\n  \"sm_clock\": {\"healthy\": 3, \"unhealthy\": 2, \"overlimit\": 1, \"direction\": \"below\"},\n  \"mem_used\": {\"healthy\": 1, \"unhealthy\": 2, \"overlimit\": 3},\n  \"hold_base_ms\": 10, \"hold_max_ms\": 100\n }\n}\n",
        )
        .unwrap();
        let e = Config::load(&p).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("machine.gpu_util"));
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("healthy < unhealthy"), "{e}");
    }

    fn load_text(text: &str) -> Result<Config, ConfigError> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sysmonitor.json");
        std::fs::write(&p, text).unwrap();
        Config::load(&p).map(|(c, _)| c).map_err(|mut e| {
            e.file = e.file.file_name().unwrap().into();
            e
        })
    }

    #[test]
    fn evict_log_rotation_is_range_checked_naming_file_line_field() {
        let c = load_text("{}").unwrap();
        assert_eq!(c.evict_log, node_ledger::evictlog::Rotation::default());
        let c = load_text(r#"{"evict_log": {"max_bytes": 65536, "keep": 2}}"#).unwrap();
        assert_eq!((c.evict_log.max_bytes, c.evict_log.keep), (65536, 2));
        let e = load_text("{\n\"evict_log\": {\n \"max_bytes\": 100\n}}").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("evict_log.max_bytes"));
        assert_eq!(e.line, Some(3));
        assert!(e.to_string().contains("sysmonitor.json"), "{e}");
        let e = load_text(r#"{"evict_log": {"keep": 0}}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("evict_log.keep"));
    }

    #[test]
    fn percent_thresholds_outside_0_100_are_errors_naming_file_line_field() {
        for (metric, t) in [
            (
                "sm_activity",
                r#"{"healthy": 70, "unhealthy": 85, "overlimit": 250}"#,
            ),
            (
                "gpu_util",
                r#"{"healthy": -5, "unhealthy": 85, "overlimit": 95}"#,
            ),
            (
                "mem_used",
                r#"{"healthy": 70, "unhealthy": 101, "overlimit": 150}"#,
            ),
            (
                "sm_clock",
                r#"{"healthy": 185, "unhealthy": 75, "overlimit": 60, "direction": "below"}"#,
            ),
        ] {
            let e =
                load_text(&format!("{{\n\"machine\": {{\n \"{metric}\": {t}\n}}}}")).unwrap_err();
            assert_eq!(
                e.field.as_deref(),
                Some(&*format!("machine.{metric}")),
                "{e}"
            );
            assert_eq!(e.line, Some(3), "{e}");
            assert_eq!(e.file, PathBuf::from("sysmonitor.json"));
            assert!(e.message.contains("0..=100"), "{e}");
        }
        assert!(load_text(
            r#"{"machine": {"sm_activity": {"healthy": 0, "unhealthy": 50, "overlimit": 99.9}}}"#
        )
        .is_ok());
    }

    /// Overlimit is entered strictly past its threshold: 100 for an "above" metric (0 for a
    /// "below" one) can never be passed, so that metric never evicts. Accepted (the previous
    /// build ran such files; refusing them crash-looped the monitor at upgrade), with a
    /// warning naming the field; a metric that is not judged says nothing.
    #[test]
    fn an_overlimit_threshold_no_reading_can_pass_is_accepted_with_a_warning() {
        for (metric, t) in [
            ("sm_activity", r#"{"healthy": 0, "unhealthy": 50, "overlimit": 100}"#),
            ("sm_clock", r#"{"healthy": 85, "unhealthy": 75, "overlimit": 0, "direction": "below"}"#),
        ] {
            let c = load_text(&format!("{{\n\"machine\": {{\n \"{metric}\": {t}\n}}}}")).unwrap();
            let w = c.machine.never_overlimit();
            assert!(w.len() == 1 && w[0].starts_with(&format!("machine.{metric}.overlimit = ")) && w[0].contains("never evicts"), "{w:?}");
            let off = t.replace('}', r#", "enabled": false}"#);
            let c = load_text(&format!(r#"{{"machine": {{"{metric}": {off}}}}}"#)).unwrap();
            assert!(c.machine.never_overlimit().is_empty(), "{off}");
        }
        assert!(Config::default().machine.never_overlimit().is_empty(), "the shipped thresholds all evict");
    }

    #[test]
    fn grace_ms_is_bounded_so_sigkill_never_comes_with_sigterm() {
        let e = load_text("{\n\"evictor\": {\n \"grace_ms\": 18446744073709551615}}").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("evictor.grace_ms"), "{e}");
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.to_string().contains("sysmonitor.json"), "{e}");
        assert!(load_text(r#"{"evictor": {"grace_ms": 600000}}"#).is_ok());
        assert!(load_text(r#"{"evictor": {"grace_ms": 600001}}"#).is_err());
    }

    /// `grace_ms: 0` passed check-config, and the SIGKILL came at the tick after the SIGTERM:
    /// the process was killed while leaving MPS. Refused under [`MIN_GRACE_MS`].
    #[test]
    fn a_grace_under_the_floor_is_refused_naming_file_line_field() {
        for v in [0, 1, MIN_GRACE_MS - 1] {
            let e = load_text(&format!("{{\n\"evictor\": {{\n \"grace_ms\": {v}}}}}")).unwrap_err();
            assert_eq!((e.field.as_deref(), e.line), (Some("evictor.grace_ms"), Some(3)), "{v}: {e}");
            assert!(e.to_string().contains("sysmonitor.json") && e.message.contains(&format!("got {v}")), "{e}");
        }
        assert!(load_text(&format!(r#"{{"evictor": {{"grace_ms": {MIN_GRACE_MS}}}}}"#)).is_ok());
        assert!(Config::default().evictor.grace_ms >= MIN_GRACE_MS);
    }

    /// `nvml_error_limit: 4294967295` kept a GPU whose NVML failed at every sample Healthy for
    /// ever: bounded.
    #[test]
    fn the_nvml_error_limit_is_bounded() {
        let e = load_text("{\n\"machine\": {\n \"nvml_error_limit\": 4294967295}}").unwrap_err();
        assert_eq!((e.field.as_deref(), e.line), (Some("machine.nvml_error_limit"), Some(3)), "{e}");
        assert!(load_text(&format!(r#"{{"machine": {{"nvml_error_limit": {}}}}}"#, MAX_NVML_ERROR_LIMIT + 1)).is_err());
        assert!(load_text(&format!(r#"{{"machine": {{"nvml_error_limit": {MAX_NVML_ERROR_LIMIT}}}}}"#)).is_ok());
    }

    /// A relative or empty `ledger_dir` (or state file, pod list, XID log) was accepted and
    /// resolved against the daemon's working directory: the monitor, the shims and mps-manager
    /// then disagree on where the ledger is. Refused naming file, line and field.
    #[test]
    fn relative_paths_are_refused_naming_file_line_field() {
        for (text, field) in [
            ("\"ledger_dir\": \"\"", "ledger_dir"),
            ("\"ledger_dir\": \"run/xshare\"", "ledger_dir"),
            ("\"state_file\": \"state-{gpu}.json\"", "state_file"),
            ("\"verify\": {\"offline_pods_file\": \"pods.json\"}", "verify.offline_pods_file"),
            ("\"xid_log\": \"kern.log\"", "xid_log"),
        ] {
            let e = load_text(&format!("{{\n \"interval_ms\": 10,\n {text}}}")).unwrap_err();
            assert_eq!((e.field.as_deref(), e.line), (Some(field), Some(3)), "{text}: {e}");
            assert!(e.to_string().contains("sysmonitor.json") && e.message.contains("absolute"), "{e}");
        }
        let ok = r#"{"ledger_dir": "/run/x", "state_file": "/var/lib/x/{gpu}.json", "xid_log": "/dev/kmsg", "verify": {"offline_pods_file": "/run/x/p.json"}}"#;
        assert!(load_text(ok).is_ok());
    }

    /// Periods and holds the daemon adds to its clock: u64::MAX passed `check-config` and
    /// `state_file_every_ms` then panicked the daemon at its first tick (debug build).
    #[test]
    fn periods_and_holds_are_bounded_naming_the_field() {
        for (path, field) in [
            ("\"state_file_every_ms\": V", "state_file_every_ms"),
            ("\"machine\": {\"hold_max_ms\": V}", "machine.hold_max_ms"),
            ("\"machine\": {\"hold_base_ms\": V, \"hold_max_ms\": V}", "machine.hold_base_ms"),
            ("\"machine\": {\"overlimit_window_ms\": V}", "machine.overlimit_window_ms"),
            ("\"machine\": {\"xid_disable_ms\": V}", "machine.xid_disable_ms"),
            ("\"host_memory\": {\"check_every_ms\": V}", "host_memory.check_every_ms"),
            ("\"host_memory\": {\"psi_sustain_ms\": V}", "host_memory.psi_sustain_ms"),
            ("\"verify\": {\"every_ms\": V}", "verify.every_ms"),
        ] {
            let text = format!("{{\n{}}}", path.replace('V', "18446744073709551615"));
            let e = load_text(&text).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
            assert_eq!(e.line, Some(2), "{e}");
        }
        assert!(load_text(r#"{"state_file_every_ms": 3600000}"#).is_ok());
    }

    /// Host-memory thresholds that would evict every offline process at every check.
    #[test]
    fn host_memory_thresholds_that_always_evict_are_errors() {
        for (text, field) in [
            (r#"{"host_memory": {"psi_some_avg10_pct": 0}}"#, "host_memory.psi_some_avg10_pct"),
            (r#"{"host_memory": {"min_available_pct": 100}}"#, "host_memory.min_available_pct"),
        ] {
            let e = load_text(text).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
        }
        assert!(load_text(r#"{"host_memory": {"psi_some_avg10_pct": 100, "min_available_pct": 0}}"#).is_ok());
    }

    /// Every GPU's monitor reads the same file: `{gpu}` and `PORT+{gpu}` give each its own
    /// metrics address.
    #[test]
    fn one_metrics_listen_gives_each_gpu_its_own_address() {
        for (listen, gpu0, gpu1) in [
            ("127.0.0.1:9400+{gpu}", "127.0.0.1:9400", "127.0.0.1:9401"),
            ("[::1]:9400+{gpu}", "[::1]:9400", "[::1]:9401"),
            ("unix:/run/xshare/metrics-{gpu}.sock", "unix:/run/xshare/metrics-0.sock", "unix:/run/xshare/metrics-1.sock"),
        ] {
            let c = load_text(&format!(r#"{{"metrics_listen": "{listen}"}}"#)).unwrap();
            let at = |gpu| {
                let mut c = c.clone();
                c.finalize(Some(gpu));
                c.metrics_listen.unwrap()
            };
            assert_eq!((at(0).as_str(), at(1).as_str()), (gpu0, gpu1), "{listen}");
        }
        for bad in ["127.0.0.1:9400+x", "127.0.0.1:65535+1", "nonsense", "127.0.0.1:{gpu}x"] {
            let e = load_text(&format!(r#"{{"gpu_index": 1, "metrics_listen": "{bad}"}}"#)).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("metrics_listen"), "{bad}: {e}");
        }
    }

    /// `xid_log_match` is compared with the GPU an XID line names: a text that is no bus
    /// address would match nothing, and the GPU's faults would go unseen. NVML's and
    /// `nvidia-smi`'s form (8-digit domain, function, upper case), which operators copy, is a
    /// bus address: refusing it left the monitor unable to start after an upgrade.
    #[test]
    fn xid_log_match_must_be_a_pci_address() {
        for good in ["PCI:0000:3b:00", "0000:3B:00", "00000000:3B:00.0", "PCI:00000000:3b:00.0", "pci:0000:3b:00"] {
            assert!(load_text(&format!(r#"{{"xid_log_match": "{good}"}}"#)).is_ok(), "{good}");
        }
        for bad in ["3b:00", "GPU-8f6c", "NVRM", ""] {
            let e = load_text(&format!("{{\n\"xid_log_match\": \"{bad}\"}}")).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("xid_log_match"), "{bad}: {e}");
            assert_eq!(e.line, Some(2), "{bad}: {e}");
            assert!(e.to_string().contains("00000000:3B:00.0"), "an example: {e}");
        }
    }

    #[test]
    fn history_secs_that_would_overflow_is_an_error_not_a_panic() {
        let e = load_text("{\n\"history_secs\": 18446744073709551615}").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("history_secs"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
        // And the arithmetic itself no longer overflows whatever the value.
        let c = Config {
            history_secs: u64::MAX,
            ..Config::default()
        };
        assert_eq!(c.history_len(), 1_000_000);
    }

    #[test]
    fn idle_interval_is_bounded_and_zero_turns_it_off() {
        assert_eq!(Config::default().idle_interval_ms, 100);
        let e = load_text("{\n\"idle_interval_ms\": 5000}").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("idle_interval_ms"), "{e}");
        let c = Config {
            idle_interval_ms: 0,
            ..Config::default()
        };
        assert!(c.validate().is_ok(), "0: always interval_ms");
    }

    /// The operator's throttle floor: the shim's shipped settings by default, `required` on;
    /// values out of the shim's own ranges are refused naming file, line and field.
    #[test]
    fn the_offline_throttle_floor_defaults_to_the_shims_settings_and_is_range_checked() {
        let c = load_text("{}").unwrap();
        let d = xshare_control::ThrottleConfig::default();
        let f = c.offline_throttle.floor();
        assert!(f.required);
        assert_eq!((f.max_target_load, f.max_rate, f.max_fallback_rate), (d.target_load, d.max_rate, d.fallback_rate));
        let c = load_text(r#"{"offline_throttle": {"required": false, "max_target_load": 0.5}}"#).unwrap();
        assert!(!c.offline_throttle.required);
        assert_eq!((c.offline_throttle.max_target_load, c.offline_throttle.max_rate), (0.5, d.max_rate));
        for (bad, field) in [
            (r#""max_target_load": 0"#, "offline_throttle.max_target_load"),
            (r#""max_target_load": -1"#, "offline_throttle.max_target_load"),
            (r#""max_target_load": 1e400"#, ""),
            (r#""max_rate": 1"#, "offline_throttle.max_rate"),
            (r#""max_fallback_rate": 1"#, "offline_throttle.max_fallback_rate"),
            (r#""max_rate": 100, "max_fallback_rate": 200"#, "offline_throttle.max_fallback_rate"),
            (r#""requird": true"#, ""),
        ] {
            let e = load_text(&format!("{{\n\"offline_throttle\": {{\n {bad}\n}}}}")).unwrap_err();
            if !field.is_empty() {
                assert_eq!(e.field.as_deref(), Some(field), "{bad}: {e}");
            }
            assert_eq!(e.line, Some(3), "{bad}: {e}");
            assert!(e.to_string().contains("sysmonitor.json"), "{e}");
        }
    }

    #[test]
    fn bad_metrics_listen_is_rejected() {
        let c = Config {
            metrics_listen: Some("nonsense".into()),
            ..Config::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "metrics_listen");
    }
}
