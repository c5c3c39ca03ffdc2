//! Shim configuration: JSON file (`XCUDA_CONFIG`, default `/etc/xshare/xcuda.json`) plus
//! environment overrides, parsed once at start-up. A config error never loosens a limit: any
//! error in the file (or an explicitly named file that cannot be read) or in an override fails
//! closed ([`Config::fail_closed`]: device allocations refused, launches at the minimum rate),
//! never built-in defaults. A missing default file is not an error.
//!
//! Environment overrides (applied after the file):
//! `XCUDA_GROUP` (quota group / container id), `XCUDA_QUOTA_BYTES`, `XCUDA_QUOTA_FRACTION`,
//! `XCUDA_THROTTLE` (`0`/`1`), `XCUDA_TARGET_LOAD`, `XCUDA_FALLBACK_RATE`,
//! `XCUDA_KILL_GRACE_MS`, `XCUDA_DRAIN_BEFORE_KILL_MS`, `XCUDA_TERMINATION_FILE` (see [`ExitConfig`]),
//! `XSHARE_LEDGER_DIR`, `XSHARE_GPU_INDEX`, `XSHARE_GPUS` (several GPUs: `<host index>=<UUID>,...`,
//! see [`node_ledger::config::ENV_GPUS`]), `XCUDA_REAL_LIBCUDA` (path of the real driver),
//! `XCUDA_REAL_LIBNVML` (path of the real NVML),
//! `XCUDA_LOG` (`error`..`trace`, default `warn`).
//!
//! The environment and the file are the process's own (an offline tenant's): the throttle
//! settings here are held to the operator's floor in the GPU's status file at run time
//! (`node_ledger::ThrottleFloor`, applied by the controller in [`crate::state`]).

use std::path::{Path, PathBuf};

use node_ledger::config::{parse_gpu_map, parse_json, ConfigError, GpuMapEntry, LedgerConfig, ENV_GPUS};
use serde::Deserialize;

/// Env var naming the config file.
pub const ENV_CONFIG: &str = "XCUDA_CONFIG";
/// Operator default config path.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/xshare/xcuda.json";

/// Everything the shim reads at start-up.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Directory of the per-GPU ledgers (`<dir>/gpu<N>/ledger`).
    pub ledger_dir: PathBuf,
    /// GPU this process is limited on.
    pub gpu_index: u32,
    /// Quota group (container id); processes with the same group share one quota.
    pub group: String,
    /// Memory quota settings (`memory`).
    pub memory: MemoryConfig,
    /// Launch-throttle settings (`throttle`).
    pub throttle: ThrottleConfig,
    /// Graceful-exit settings (`exit`).
    pub exit: ExitConfig,
    /// SM-budget settings at process start (`budget`).
    pub budget: BudgetConfig,
    /// Path or soname of the real driver.
    pub real_libcuda: String,
    /// Path or soname of the real NVML library.
    pub real_libnvml: String,
    /// Log level: error, warn, info, debug, trace, off.
    pub log: String,
    /// Set when a config error made [`Config::load`] fail closed (never read from the file).
    #[serde(skip)]
    pub failed_closed: bool,
    /// The host GPUs this process may see, by UUID (`XSHARE_GPUS`; empty = not given). Each
    /// GPU's quota and throttle live in that GPU's ledger.
    #[serde(skip)]
    pub gpus: Vec<GpuMapEntry>,
}

/// Memory quota settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Fraction of device memory the group may use (MuxFlow: 0.4).
    pub quota_fraction: f64,
    /// Absolute quota in bytes; wins over the fraction when set.
    pub quota_bytes: Option<u64>,
    /// Fault injection for tests only: pause the controller's ledger registration check this
    /// long between its slot-lock and owner halves (0 = never), so an exit release racing with
    /// it always lands inside.
    pub test_ledger_check_pause_ms: u64,
    /// Fault injection for tests only: pause a graph launch with memory nodes this long after
    /// it read the driver's graph-pool figures, before it reserves its growth (0 = never), so
    /// launches on several threads all read the pool before any of them reserves.
    pub test_graph_launch_pause_ms: u64,
    /// Fault injection for tests only: pause the process's first change of a graph exec
    /// (`cuGraphExecUpdate`, a node's new parameters) this long between the driver's answer
    /// and the new price's record (0 = never), so a second change on another thread always
    /// lands inside.
    pub test_graph_change_pause_ms: u64,
}

/// Launch-throttle settings (MuxFlow eq. 1-2 + PID): defined beside the control law.
pub use xshare_control::ThrottleConfig;

/// Graceful-exit settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExitConfig {
    /// Catch SIGINT/SIGTERM, freeze launches and release contexts before the process dies.
    pub handle_signals: bool,
    /// Release contexts at normal exit.
    pub release_at_exit: bool,
    /// Longest wait for synchronise + release (a hung driver must not keep the process alive), ms.
    pub release_timeout_ms: u64,
    /// Longest wait, before synchronising the contexts on a signal or at the drain, for the
    /// stream captures in progress to end (a synchronisation invalidates them), ms; at most
    /// half of `release_timeout_ms` is used.
    pub capture_wait_ms: u64,
    /// When the SIGKILL is expected after a SIGTERM the process survives (an application that
    /// ignores it, or whose handler keeps it running), ms: the pod's
    /// `terminationGracePeriodSeconds`, which the kubelet waits before it SIGKILLs (node-agent
    /// passes it as `XCUDA_KILL_GRACE_MS`). 0: unknown: drained only by a deletion read from
    /// `termination_file`.
    pub kill_grace_ms: u64,
    /// How long before that SIGKILL launches stop for good and the GPU is drained
    /// (synchronised), ms: under MPS, a client killed with kernels in flight can take its
    /// neighbours' contexts down with it (an H200, driver 580: 12 of 20 kills), one killed
    /// between kernels harms nobody. At least the longest kernel the job runs. 0: no drain;
    /// at least `kill_grace_ms`: launches stop at the SIGTERM.
    pub drain_before_kill_ms: u64,
    /// The pod's deletion as node-agent writes it when it sees one (`node_ledger::termination`;
    /// node-agent mounts it read-only and passes its path as `XCUDA_TERMINATION_FILE`): read
    /// after a SIGTERM and by the controller's housekeeping, a deletion there decides when the
    /// SIGKILL comes (the kubelet kills by the deletion's grace, shorter or longer than
    /// `kill_grace_ms`, and a `preStop` hook spends part of it), arms the drain even when no
    /// SIGTERM reaches the process, and keeps launches stopped until the kill. `None`: the
    /// grace alone decides.
    pub termination_file: Option<PathBuf>,
    /// Fault injection for tests only: pause this long inside a context release (0 = never).
    pub test_release_pause_ms: u64,
    /// Fault injection for tests only: delay the signal helper's re-raise after the release by
    /// this long (0 = never), so an exit racing with it always comes first.
    pub test_raise_delay_ms: u64,
    /// Fault injection for tests only: pause this long while the SIGINT/SIGTERM handlers are
    /// being installed, just before each signal's action changes (0 = never), so a signal that
    /// lands during the installation does so every time.
    pub test_install_pause_ms: u64,
    /// Fault injection for tests only: hold the lock on the application's SIGINT/SIGTERM
    /// actions this long inside the shim's `sigaction`/`signal` (0 = never), so a `fork` from
    /// another thread lands while it is held every time.
    pub test_sigaction_hold_ms: u64,
}

/// SM-budget settings at process start ([`crate::budget`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// How long another job's start claim counts against this process's start share, ms
    /// (`node_ledger::claims`): it must cover the time between a job's library load and its
    /// first driver call (seconds for Python + torch). Shorter lets two jobs starting together
    /// both take the whole budget again; longer makes a newcomer leave room, for that long,
    /// for a job that claimed and then never used the GPU. 1000..=600000.
    pub claim_ttl_ms: u64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self { claim_ttl_ms: node_ledger::claims::DEFAULT_CLAIM_TTL_MS }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ledger_dir: LedgerConfig::default().ledger_dir,
            gpu_index: 0,
            group: "default".into(),
            memory: MemoryConfig::default(),
            throttle: ThrottleConfig::default(),
            exit: ExitConfig::default(),
            budget: BudgetConfig::default(),
            real_libcuda: "libcuda.so.1".into(),
            real_libnvml: "libnvidia-ml.so.1".into(),
            log: "warn".into(),
            failed_closed: false,
            gpus: Vec::new(),
        }
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self { quota_fraction: 0.4, quota_bytes: None, test_ledger_check_pause_ms: 0, test_graph_launch_pause_ms: 0, test_graph_change_pause_ms: 0 }
    }
}

impl Default for ExitConfig {
    fn default() -> Self {
        Self {
            handle_signals: true,
            release_at_exit: true,
            release_timeout_ms: 5000,
            capture_wait_ms: 2000,
            kill_grace_ms: 0,
            drain_before_kill_ms: 2000,
            termination_file: None,
            test_release_pause_ms: 0,
            test_raise_delay_ms: 0,
            test_install_pause_ms: 0,
            test_sigaction_hold_ms: 0,
        }
    }
}

impl Config {
    /// The ledger location.
    pub fn ledger(&self) -> LedgerConfig {
        LedgerConfig { ledger_dir: self.ledger_dir.clone(), gpu_index: self.gpu_index }
    }

    /// The ledger location of host GPU `index`.
    pub fn ledger_of(&self, index: u32) -> LedgerConfig {
        LedgerConfig { ledger_dir: self.ledger_dir.clone(), gpu_index: index }
    }

    /// Host GPUs whose ledgers this process may use: every `XSHARE_GPUS` entry, else
    /// `gpu_index`.
    pub fn host_gpus(&self) -> Vec<u32> {
        if self.gpus.is_empty() {
            vec![self.gpu_index]
        } else {
            self.gpus.iter().map(|g| g.index).collect()
        }
    }

    /// Checks ranges; the error names the field (and its line when `text` is the file).
    pub fn validate(&self, file: &Path, text: &str) -> Result<(), ConfigError> {
        let bad = |field: &str, msg: &str| Err(ConfigError::invalid(file, text, field, msg));
        let f = self.memory.quota_fraction;
        if !(f > 0.0 && f <= 1.0) {
            return bad("memory.quota_fraction", "must be in (0, 1]");
        }
        let t = &self.throttle;
        if !(t.target_load > 0.0 && t.target_load.is_finite()) {
            return bad("throttle.target_load", "must be a positive number");
        }
        for (name, v) in [("a_l", t.a_l), ("a_h", t.a_h), ("kp", t.kp), ("ki", t.ki), ("kd", t.kd)] {
            if !(v >= 0.0 && v.is_finite()) {
                return bad(&format!("throttle.{name}"), "must be a non-negative number");
            }
        }
        if t.t_sm_mhz.is_nan() || t.t_sm_mhz <= 0.0 {
            return bad("throttle.t_sm_mhz", "must be positive");
        }
        if t.min_rate.is_nan() || t.min_rate <= 0.0 {
            return bad("throttle.min_rate", "must be positive (a throttle is never unlimited)");
        }
        if !(t.max_rate >= t.min_rate && t.max_rate.is_finite()) {
            return bad("throttle.max_rate", "must be finite and >= min_rate");
        }
        if !(t.fallback_rate >= t.min_rate && t.fallback_rate <= t.max_rate) {
            return bad("throttle.fallback_rate", "must lie within [min_rate, max_rate]");
        }
        if !(t.burst >= 1.0 && t.burst.is_finite()) {
            return bad("throttle.burst", "must be >= 1");
        }
        if !(t.graph_launch_waves > 0.0 && t.graph_launch_waves.is_finite()) {
            return bad("throttle.graph_launch_waves", "must be positive");
        }
        if t.period_ms == 0 || t.period_ms > 10_000 {
            return bad("throttle.period_ms", "must be in 1..=10000");
        }
        if !(0.0..1.0).contains(&t.hold_below_clock) {
            return bad("throttle.hold_below_clock", "must be in [0, 1) (0 = no online-pressure hold)");
        }
        if t.hold_ms > 10_000 {
            return bad("throttle.hold_ms", "must be at most 10000");
        }
        if t.stale_after_ms == 0 {
            return bad("throttle.stale_after_ms", "must be positive");
        }
        if !(1_000..=600_000).contains(&self.budget.claim_ttl_ms) {
            return bad("budget.claim_ttl_ms", "must be in 1000..=600000 (a claim must outlive the start-up it covers)");
        }
        if self.exit.release_timeout_ms == 0 {
            return bad("exit.release_timeout_ms", "must be positive");
        }
        if self.exit.capture_wait_ms > 60_000 {
            return bad("exit.capture_wait_ms", "must be at most 60000");
        }
        Ok(())
    }

    /// Parses and validates file text; on error nothing of it is used.
    pub fn from_text(file: &Path, text: &str) -> Result<Self, ConfigError> {
        let c: Self = parse_json(file, text)?;
        c.validate(file, text)?;
        Ok(c)
    }

    /// Applies the documented environment overrides; a bad value keeps the previous one and is
    /// reported.
    pub fn apply_env(&mut self, get: &dyn Fn(&str) -> Option<String>) -> Vec<ConfigError> {
        let mut errs = Vec::new();
        let mut ledger = self.ledger();
        match ledger.apply_env(get) {
            Ok(()) => (self.ledger_dir, self.gpu_index) = (ledger.ledger_dir, ledger.gpu_index),
            Err(e) => errs.push(e),
        }
        let env_err = |var: &str, msg: String| ConfigError {
            file: PathBuf::from(format!("${var}")),
            line: None,
            column: None,
            field: Some(var.to_owned()),
            message: msg,
        };
        if let Some(v) = get(ENV_GPUS) {
            match parse_gpu_map(&v) {
                Ok(m) => self.gpus = m,
                Err(e) => errs.push(e),
            }
        }
        if let Some(g) = get("XCUDA_GROUP").filter(|g| !g.is_empty()) {
            self.group = g;
        }
        if let Some(v) = get("XCUDA_QUOTA_BYTES") {
            match v.trim().parse::<u64>() {
                Ok(b) => self.memory.quota_bytes = Some(b),
                Err(_) => errs.push(env_err("XCUDA_QUOTA_BYTES", format!("`{v}` is not a byte count"))),
            }
        }
        if let Some(v) = get("XCUDA_QUOTA_FRACTION") {
            match v.trim().parse::<f64>() {
                Ok(f) if f > 0.0 && f <= 1.0 => self.memory.quota_fraction = f,
                _ => errs.push(env_err("XCUDA_QUOTA_FRACTION", format!("`{v}` is not in (0, 1]"))),
            }
        }
        if let Some(v) = get("XCUDA_THROTTLE") {
            match v.trim() {
                "0" | "false" | "off" => self.throttle.enabled = false,
                "1" | "true" | "on" => self.throttle.enabled = true,
                _ => errs.push(env_err("XCUDA_THROTTLE", format!("`{v}` is not 0/1"))),
            }
        }
        // Same ranges as the file's (validate): target > 0, fallback within [min_rate, max_rate].
        let (min_rate, max_rate) = (self.throttle.min_rate, self.throttle.max_rate);
        for (var, slot, lo, hi) in [
            ("XCUDA_TARGET_LOAD", &mut self.throttle.target_load, f64::MIN_POSITIVE, f64::MAX),
            ("XCUDA_FALLBACK_RATE", &mut self.throttle.fallback_rate, min_rate, max_rate),
        ] {
            if let Some(v) = get(var) {
                match v.trim().parse::<f64>() {
                    Ok(x) if x >= lo && x <= hi && x.is_finite() => *slot = x,
                    _ => errs.push(env_err(var, format!("`{v}` must be a number in [{lo}, {hi}]"))),
                }
            }
        }
        for (var, slot) in [
            ("XCUDA_KILL_GRACE_MS", &mut self.exit.kill_grace_ms),
            ("XCUDA_DRAIN_BEFORE_KILL_MS", &mut self.exit.drain_before_kill_ms),
        ] {
            if let Some(v) = get(var) {
                match v.trim().parse::<u64>() {
                    Ok(ms) => *slot = ms,
                    Err(_) => errs.push(env_err(var, format!("`{v}` is not a whole number of milliseconds"))),
                }
            }
        }
        if let Some(p) = get("XCUDA_TERMINATION_FILE").filter(|p| !p.is_empty()) {
            self.exit.termination_file = Some(PathBuf::from(p));
        }
        if let Some(p) = get("XCUDA_REAL_LIBCUDA").filter(|p| !p.is_empty()) {
            self.real_libcuda = p;
        }
        if let Some(p) = get("XCUDA_REAL_LIBNVML").filter(|p| !p.is_empty()) {
            self.real_libnvml = p;
        }
        if let Some(l) = get("XCUDA_LOG").filter(|l| !l.is_empty()) {
            self.log = l;
        }
        errs
    }

    /// The most restrictive interpretation, used when the configuration has an error: a quota
    /// of 0 bytes (every device allocation refused), the throttle on and capped at its minimum
    /// rate, contexts released on signals and exit. Where to find the driver and the log level
    /// are kept, so the process still runs (and says why it is limited).
    pub fn fail_closed(self) -> Self {
        let d = ThrottleConfig::default();
        Self {
            memory: MemoryConfig { quota_bytes: Some(0), ..MemoryConfig::default() },
            throttle: ThrottleConfig { enabled: true, fallback_rate: d.min_rate, max_rate: d.min_rate, ..d },
            // The drain before an expected SIGKILL stays: it only ever stops launches.
            exit: ExitConfig {
                kill_grace_ms: self.exit.kill_grace_ms,
                drain_before_kill_ms: self.exit.drain_before_kill_ms,
                termination_file: self.exit.termination_file.clone(),
                ..ExitConfig::default()
            },
            failed_closed: true,
            ..self
        }
    }

    /// Loads the file named by `XCUDA_CONFIG` (or the default path), then the env overrides.
    /// Returns the config and every problem found (each one line naming file, line, field);
    /// a missing default file is not a problem. With any problem the config is
    /// [`Config::fail_closed`].
    pub fn load(get: &dyn Fn(&str) -> Option<String>) -> (Self, Vec<ConfigError>) {
        let explicit = get(ENV_CONFIG).filter(|p| !p.is_empty());
        let path = PathBuf::from(explicit.clone().unwrap_or_else(|| DEFAULT_CONFIG_PATH.into()));
        let mut errs = Vec::new();
        let mut cfg = match std::fs::read_to_string(&path) {
            Ok(text) => Self::from_text(&path, &text).unwrap_or_else(|e| {
                errs.push(e);
                Self::default()
            }),
            Err(e) if explicit.is_some() || e.kind() != std::io::ErrorKind::NotFound => {
                errs.push(ConfigError {
                    file: path.clone(),
                    line: None,
                    column: None,
                    field: None,
                    message: format!("cannot read: {e}"),
                });
                Self::default()
            }
            Err(_) => Self::default(),
        };
        errs.extend(cfg.apply_env(get));
        if !errs.is_empty() {
            cfg = cfg.fail_closed();
        }
        (cfg, errs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_are_valid_and_muxflow_like() {
        let c = Config::default();
        c.validate(Path::new("x"), "").unwrap();
        assert_eq!(c.memory.quota_fraction, 0.4);
        assert!(c.throttle.enabled && c.throttle.fallback_rate < c.throttle.max_rate);
    }

    #[test]
    fn file_values_and_flattened_ledger_fields_parse() {
        let text = r#"{"ledger_dir": "/tmp/l", "gpu_index": 2, "group": "c9",
                       "memory": {"quota_bytes": 1024}, "throttle": {"target_load": 0.5}}"#;
        let c = Config::from_text(Path::new("f.json"), text).unwrap();
        assert_eq!(c.gpu_index, 2);
        assert_eq!(c.memory.quota_bytes, Some(1024));
        assert_eq!(c.throttle.target_load, 0.5);
        assert_eq!(c.group, "c9");
    }

    #[test]
    fn bad_file_names_file_line_field_and_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("xcuda.json");
        std::fs::write(&p, "{\n  \"memory\": {\n    \"quota_fraction\": 1.5\n  }\n}\n").unwrap();
        let ps = p.to_string_lossy().into_owned();
        let (c, errs) = Config::load(&|k| (k == ENV_CONFIG).then(|| ps.clone()));
        assert_eq!(c, Config::default().fail_closed());
        assert!(c.failed_closed && c.memory.quota_bytes == Some(0));
        assert_eq!(errs.len(), 1);
        let line = errs[0].to_string();
        assert!(line.starts_with(&format!("{ps}:3")), "{line}");
        assert!(line.contains("memory.quota_fraction"), "{line}");

        std::fs::write(&p, "{\n \"throttle\": {\"kp\": \"x\"}}").unwrap();
        let (_, errs) = Config::load(&|k| (k == ENV_CONFIG).then(|| ps.clone()));
        assert!(errs[0].to_string().contains(":2:"), "{}", errs[0]);
        assert_eq!(errs[0].field.as_deref(), Some("throttle.kp"));
    }

    #[test]
    fn missing_default_file_is_silent_but_missing_explicit_is_reported() {
        let (c, errs) = Config::load(&no_env);
        assert!(errs.is_empty() || !Path::new(DEFAULT_CONFIG_PATH).exists());
        assert!(!c.failed_closed || Path::new(DEFAULT_CONFIG_PATH).exists());
        let (c, errs) = Config::load(&|k| (k == ENV_CONFIG).then(|| "/nonexistent/x.json".into()));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].to_string().contains("/nonexistent/x.json"));
        assert!(c.failed_closed, "an operator's named file that is not there fails closed");
    }

    /// Observation 8: one typo anywhere must not turn a configured 20 % quota into the
    /// default 40 %: the result is the restrictive config, and the error names file, line, field.
    #[test]
    fn a_typo_anywhere_never_loosens_the_quota() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("xcuda.json");
        let ps = p.to_string_lossy().into_owned();
        let good = "{\n  \"memory\": {\"quota_fraction\": 0.2},\n  \"throttle\": {\"target_load\": 0.5}\n}\n";
        std::fs::write(&p, good).unwrap();
        let (c, errs) = Config::load(&|k| (k == ENV_CONFIG).then(|| ps.clone()));
        assert!(errs.is_empty() && !c.failed_closed);
        assert_eq!(c.memory.quota_fraction, 0.2);
        for (typo, line, field) in [
            (good.replace("target_load", "target_lod"), ":3", "target_lod"),
            (good.replace("0.5", "0.5,"), ":3", ""),
            (good.replace("0.2", "\"20%\""), ":2", "memory.quota_fraction"),
        ] {
            std::fs::write(&p, &typo).unwrap();
            let (c, errs) = Config::load(&|k| (k == ENV_CONFIG).then(|| ps.clone()));
            assert_eq!(errs.len(), 1, "{typo}: {errs:?}");
            let e = errs[0].to_string();
            assert!(e.starts_with(&format!("{ps}{line}")), "file and line: {e}");
            assert!(e.contains(field), "field: {e}");
            assert!(c.failed_closed, "{typo}");
            assert_eq!(c.memory.quota_bytes, Some(0), "no allocation allowed, never the 40% default");
            assert!(c.throttle.enabled && c.throttle.max_rate <= Config::default().throttle.min_rate);
        }
    }

    #[test]
    fn claim_ttl_is_range_checked_naming_the_field() {
        let c = Config::from_text(Path::new("f.json"), r#"{"budget": {"claim_ttl_ms": 5000}}"#).unwrap();
        assert_eq!(c.budget.claim_ttl_ms, 5000);
        assert_eq!(Config::default().budget.claim_ttl_ms, 30_000);
        for bad in ["0", "999", "600001"] {
            let text = format!("{{\n  \"budget\": {{\"claim_ttl_ms\": {bad}}}\n}}\n");
            let e = Config::from_text(Path::new("f.json"), &text).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("budget.claim_ttl_ms"), "{bad}: {e}");
            assert!(e.to_string().contains("f.json:2"), "{e}");
        }
    }

    #[test]
    fn malformed_env_override_fails_closed() {
        for (var, val) in [
            ("XCUDA_QUOTA_BYTES", "12x"),
            ("XCUDA_QUOTA_FRACTION", "2"),
            ("XCUDA_THROTTLE", "maybe"),
            ("XCUDA_TARGET_LOAD", "-1"),
            ("XCUDA_FALLBACK_RATE", "fast"),
            ("XCUDA_KILL_GRACE_MS", "30s"),
            ("XCUDA_DRAIN_BEFORE_KILL_MS", "-1"),
            ("XSHARE_GPU_INDEX", "first"),
        ] {
            let (c, errs) = Config::load(&|k| match k {
                ENV_CONFIG => Some("/nonexistent-but-unused".into()).filter(|_| false),
                "XCUDA_REAL_LIBCUDA" => Some("/opt/real/libcuda.so.1".into()),
                k if k == var => Some(val.into()),
                _ => None,
            });
            assert_eq!(errs.len(), 1, "{var}: {errs:?}");
            assert!(errs[0].to_string().contains(var), "names the variable: {}", errs[0]);
            assert!(c.failed_closed && c.memory.quota_bytes == Some(0), "{var}");
            assert_eq!(c.real_libcuda, "/opt/real/libcuda.so.1", "the driver is still found");
        }
    }

    proptest::proptest! {
        /// Arbitrary text is either a valid config or one located error; never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            if let Err(e) = Config::from_text(Path::new("f.json"), &text) {
                proptest::prop_assert!(e.to_string().starts_with("f.json"));
            }
        }

        /// Arbitrary values in known fields are validated, never a panic.
        #[test]
        fn arbitrary_numbers_never_panic(a in proptest::num::f64::ANY, b in proptest::num::f64::ANY, n in proptest::num::u64::ANY) {
            let text = format!(r#"{{"memory": {{"quota_fraction": {a:?}}}, "throttle": {{"kp": {b:?}, "period_ms": {n}}}}}"#);
            let _ = Config::from_text(Path::new("f.json"), &text);
        }
    }

    /// A config that failed closed still drains before the kubelet's SIGKILL: the drain only
    /// ever stops launches.
    #[test]
    fn failing_closed_keeps_the_drain_before_the_kill() {
        let (c, errs) = Config::load(&|k| match k {
            "XCUDA_THROTTLE" => Some("maybe".into()),
            "XCUDA_KILL_GRACE_MS" => Some("45000".into()),
            "XCUDA_TERMINATION_FILE" => Some("/run/xshare/termination".into()),
            _ => None,
        });
        assert!(c.failed_closed && errs.len() == 1, "{errs:?}");
        assert_eq!((c.exit.kill_grace_ms, c.exit.drain_before_kill_ms), (45000, 2000));
        assert_eq!(c.exit.termination_file.as_deref(), Some(Path::new("/run/xshare/termination")));
    }

    #[test]
    fn env_overrides_apply_and_bad_ones_are_reported() {
        let mut c = Config::default();
        let errs = c.apply_env(&|k| match k {
            "XCUDA_QUOTA_BYTES" => Some("4096".into()),
            "XCUDA_GROUP" => Some("ctr".into()),
            "XCUDA_THROTTLE" => Some("maybe".into()),
            "XCUDA_TARGET_LOAD" => Some("-1".into()),
            "XCUDA_KILL_GRACE_MS" => Some(" 45000".into()),
            "XCUDA_TERMINATION_FILE" => Some("/run/xshare/termination".into()),
            _ => None,
        });
        assert_eq!(c.exit.termination_file.as_deref(), Some(Path::new("/run/xshare/termination")));
        assert_eq!(c.memory.quota_bytes, Some(4096));
        assert_eq!((c.exit.kill_grace_ms, c.exit.drain_before_kill_ms), (45000, 2000));
        assert_eq!(c.group, "ctr");
        assert!(c.throttle.enabled);
        assert_eq!(c.throttle.target_load, 0.8);
        assert_eq!(errs.len(), 2);
    }
}
