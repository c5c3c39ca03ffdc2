//! The MPS manager's configuration schema and validation.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use node_daemon::layered::{self, ConfigError};

use crate::budget::BudgetConfig;
use crate::compute_mode::ComputeModePolicy;
use crate::detect::{DetectConfig, RateConfig};
use crate::outside::OutsideAction;

/// Default location of the base config file.
pub const DEFAULT_PATH: &str = "/etc/xshare/mps-manager.json";

/// Longest command timeout / eviction grace, ms (10 min).
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// Shortest [`Config::command_timeout_ms`], ms. Every control command runs the control program,
/// which connects to the daemon; a timeout under that round trip (tens to hundreds of ms on a
/// loaded host) would make every look a `daemon_hang` and every check a full MPS reset, the
/// online service's context with it. The shipped default is 2000.
pub const MIN_COMMAND_TIMEOUT_MS: u64 = 1000;
/// Longest loop period, ms (1 h).
pub const MAX_PERIOD_MS: u64 = 3_600_000;
/// Longest detection / rate-limit window, ms (1 day).
pub const MAX_WINDOW_MS: u64 = 86_400_000;

/// [`Config::shm_dir`] value that leaves the control daemon the host's `/dev/shm`.
pub const SHM_HOST: &str = "host";

/// Directories [`Config::shm_dir`] may never name (a typo would have the manager, root, make
/// one world-writable): `/` and the usual system directories.
pub const SYSTEM_DIRS: &[&str] = &[
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt", "/opt",
    "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib",
    "/usr/local", "/usr/sbin", "/usr/share", "/var", "/var/lib", "/var/log", "/var/run", "/var/tmp",
];

/// Everything `mps-manager run` reads from its config files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// NVML index of the GPU whose MPS this instance manages.
    pub gpu_index: u32,
    /// Ledger directory (`<dir>/gpu<N>/ledger`); `$XSHARE_LEDGER_DIR` overrides.
    pub ledger_dir: PathBuf,
    /// The control program (searched in PATH when not absolute).
    pub control_bin: PathBuf,
    /// `CUDA_MPS_PIPE_DIRECTORY`; empty means `<ledger_dir>/gpu<N>/mps-pipe`. In this path and
    /// the four below (`log_dir`, `monitor_state_file`, `state_file`, `shm_dir`) `{gpu}` is
    /// replaced by the GPU index: one config serves every GPU's manager.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`; empty means `<ledger_dir>/daemons/gpu<N>/mps-log`, beside the
    /// daemons' other files, which no container gets. Not in `gpu<N>/`, which offline containers
    /// get read-write: there a tenant could replace `control.log` with a symbolic link, and the
    /// control daemon, root, would append to whatever file it names. MPS clients never use it.
    pub log_dir: PathBuf,
    /// Timeout of one control command, ms (a longer wait is a daemon hang); at least
    /// [`MIN_COMMAND_TIMEOUT_MS`].
    pub command_timeout_ms: u64,
    /// How often the SM budget is recomputed, ms.
    pub period_ms: u64,
    /// How often MPS health is checked, ms.
    pub check_every_ms: u64,
    /// Stop MPS (`quit`) when the manager stops (SIGTERM/SIGINT). Off by default: a restart
    /// (`systemctl restart`, an upgrade) must not cut off the online service, whose clients
    /// would all lose their contexts; the next manager adopts the running daemon. On for a
    /// setup the manager tears down (a demo), or stop MPS yourself
    /// (`echo quit | nvidia-cuda-mps-control`).
    pub quit_on_exit: bool,
    /// The monitor's state file (for XID reports); empty means
    /// `<ledger_dir>/daemons/gpu<N>/state.json` (sysmonitor's default).
    pub monitor_state_file: PathBuf,
    /// This manager's state file; empty means `<ledger_dir>/daemons/gpu<N>/mps-manager.json`
    /// (the daemon-only directory, never mounted into a container). Each
    /// GPU's manager needs its own (a second manager given one another GPU's manager writes is
    /// refused at start): put `{gpu}` in a path set here.
    pub state_file: PathBuf,
    /// SIGTERM -> SIGKILL grace when recovery evicts offline clients, ms.
    pub evict_grace_ms: u64,
    /// An offline process the monitor evicts and will SIGKILL within this many ms (it did not
    /// exit on SIGTERM) first has its MPS work ended with `terminate_client`: on real MPS a
    /// SIGKILL with kernels in flight can make the server tear down a neighbour. At least
    /// `check_every_ms` (each check looks once); 0 turns it off.
    pub terminate_before_kill_ms: u64,
    /// The one user (uid) every MPS client of this GPU runs as, the online service and the
    /// offline containers alike. MPS serves one user at a time (nvidia-cuda-mps-control(1)):
    /// a client of another user is queued until the running server's clients are all done,
    /// then the server is replaced by one for that user, so two users cannot share the GPU
    /// through MPS. When set, an MPS server of another user is an error: its registered
    /// offline clients are terminated and evicted (restart requested) so that this user's
    /// clients get the GPU back. `null`: not enforced; a change of the server's user is
    /// logged as a warning.
    pub client_uid: Option<u32>,
    /// What to do with an offline process doing GPU work outside MPS (it started before the
    /// control daemon, or looked for it in another `CUDA_MPS_PIPE_DIRECTORY`: CUDA looks once,
    /// when it initialises, and such a process runs without MPS for its life, time-sliced
    /// against the online service, out of reach of the SM budget): `evict` (SIGTERM, restart
    /// requested; restarted, it runs under MPS) or `report` (an ERROR line and
    /// `outside_mps` in the state file).
    pub outside_mps: OutsideAction,
    /// How long an offline process must be seen launching kernels while no MPS server lists
    /// it (over at least two checks) before [`Config::outside_mps`] applies, ms.
    pub outside_mps_after_ms: u64,
    /// The GPU's compute mode while the manager runs MPS: `exclusive_process` (the default,
    /// as NVIDIA's MPS docs recommend; set through NVML, root only, before the control daemon
    /// starts, kept while the manager runs, and the mode found put back when it quits MPS) lets
    /// only the MPS server hold a context of its own, so a process that missed MPS is refused
    /// a context (`CUDA_ERROR_DEVICE_UNAVAILABLE`) instead of running beside it; `leave`
    /// never touches it (then `outside_mps` is what finds such processes).
    pub compute_mode: ComputeModePolicy,
    /// The directory the control daemon, and so every MPS server it starts, gets as its
    /// `/dev/shm`, where a real MPS server keeps the shared memory its clients attach to: a
    /// client must see the same directory at its own `/dev/shm` or its connection fails
    /// (`CUDA_ERROR_MPS_CONNECTION_FAILED`). Containers get it mounted there (node-agent
    /// `inject.mps_shm_dir`; NVIDIA's k8s device plugin does the same), so they share nothing
    /// else of the host's `/dev/shm`. Empty means `/dev/shm/xshare-gpu<N>`; `host` gives the
    /// daemon the host's own `/dev/shm` (MPS clients that run on the host, outside
    /// containers). A directory needs root: the daemon is started in a mount namespace of its
    /// own with the directory bound over `/dev/shm`. The manager creates it (root, mode 1777);
    /// one that exists must already be so and is never changed, and `/` or a system directory
    /// ([`SYSTEM_DIRS`]) is refused.
    pub shm_dir: PathBuf,
    /// How the offline SM budget is computed.
    pub budget: BudgetConfig,
    /// Thresholds of MPS fault detection.
    pub detect: DetectConfig,
    /// Rate limit of recoveries.
    pub recovery: RateConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            gpu_index: 0,
            ledger_dir: node_ledger::config::DEFAULT_LEDGER_DIR.into(),
            control_bin: "nvidia-cuda-mps-control".into(),
            pipe_dir: PathBuf::new(),
            log_dir: PathBuf::new(),
            command_timeout_ms: 2000,
            period_ms: 100,
            check_every_ms: 500,
            quit_on_exit: false,
            monitor_state_file: PathBuf::new(),
            state_file: PathBuf::new(),
            evict_grace_ms: 5000,
            terminate_before_kill_ms: 1500,
            client_uid: None,
            outside_mps: OutsideAction::Evict,
            outside_mps_after_ms: 2000,
            compute_mode: ComputeModePolicy::ExclusiveProcess,
            shm_dir: PathBuf::new(),
            budget: BudgetConfig::default(),
            detect: DetectConfig::default(),
            recovery: RateConfig::default(),
        }
    }
}

impl Config {
    /// Semantic checks; returns `(dotted field, message)` for the first bad value.
    pub fn validate(&self) -> Result<(), (String, String)> {
        // Durations: bounded so that `now + d` never overflows and a typo (u64::MAX) cannot
        // silently turn a timeout or grace period into "never".
        for (f, v, min, max) in [
            (
                "command_timeout_ms",
                self.command_timeout_ms,
                MIN_COMMAND_TIMEOUT_MS,
                MAX_TIMEOUT_MS,
            ),
            ("period_ms", self.period_ms, 1, MAX_PERIOD_MS),
            ("check_every_ms", self.check_every_ms, 1, MAX_PERIOD_MS),
            // Bounded by the constant sysmonitor's backstop waits for (a request of ours it adopts
            // is escalated no sooner than this): raising one without the other makes it kill early.
            // At least node_ledger::MIN_EVICT_GRACE_MS: 0 SIGKILLed at the check after the
            // SIGTERM, a process still leaving MPS.
            ("evict_grace_ms", self.evict_grace_ms, node_ledger::MIN_EVICT_GRACE_MS, node_ledger::MANAGER_MAX_EVICT_GRACE_MS),
            ("outside_mps_after_ms", self.outside_mps_after_ms, 0, MAX_WINDOW_MS),
            (
                "detect.stuck_after_ms",
                self.detect.stuck_after_ms,
                0,
                MAX_WINDOW_MS,
            ),
            (
                "recovery.min_interval_ms",
                self.recovery.min_interval_ms,
                0,
                MAX_WINDOW_MS,
            ),
        ] {
            if !(min..=max).contains(&v) {
                let why = match f {
                    "command_timeout_ms" if v < min => {
                        " (a shorter wait than the control program's round trip would make every look a daemon hang, and each a full MPS reset)"
                    }
                    "evict_grace_ms" if v < min => " (a shorter grace SIGKILLs a process that is still leaving MPS)",
                    _ => "",
                };
                return Err((
                    f.into(),
                    format!("must be within {min}..={max} ms, got {v}{why}"),
                ));
            }
        }
        if self.terminate_before_kill_ms != 0
            && !(self.check_every_ms..=MAX_TIMEOUT_MS).contains(&self.terminate_before_kill_ms)
        {
            return Err((
                "terminate_before_kill_ms".into(),
                format!(
                    "must be 0 (off) or within check_every_ms ({})..={MAX_TIMEOUT_MS} ms (a check looks once every check_every_ms; a shorter lead can miss the SIGKILL), got {}",
                    self.check_every_ms, self.terminate_before_kill_ms
                ),
            ));
        }
        if self.control_bin.as_os_str().is_empty() {
            return Err((
                "control_bin".into(),
                "must name the MPS control program (nvidia-cuda-mps-control, searched in PATH, or an absolute path), got an empty path".into(),
            ));
        }
        // A bare name is searched in PATH; anything with a slash is a path, and then it must be
        // absolute and without `..` (relative to wherever the manager was started, systemd: `/`).
        let bare = self.control_bin.components().count() == 1 && !self.control_bin.is_absolute();
        if !bare
            && (!self.control_bin.is_absolute()
                || self.control_bin.components().any(|c| c == std::path::Component::ParentDir))
        {
            return Err((
                "control_bin".into(),
                format!(
                    "must be a program name searched in PATH (nvidia-cuda-mps-control) or an absolute path without `..`, got {:?}",
                    self.control_bin
                ),
            ));
        }
        // Relative, they would be resolved against whatever directory the manager was started
        // in (systemd: `/`), and the daemon, its clients and node-agent would not agree on them.
        // `..` is refused: the paths are judged as written (`check_paths`: a `log_dir` that
        // names the tenants' `gpu<N>/` through `daemons/../` would pass it).
        if !self.ledger_dir.is_absolute() {
            return Err((
                "ledger_dir".into(),
                format!("must be an absolute directory (default {}), got {:?}", node_ledger::config::DEFAULT_LEDGER_DIR, self.ledger_dir),
            ));
        }
        for (f, p) in [
            ("ledger_dir", &self.ledger_dir),
            ("pipe_dir", &self.pipe_dir),
            ("log_dir", &self.log_dir),
            ("monitor_state_file", &self.monitor_state_file),
            ("state_file", &self.state_file),
        ] {
            if !(p.as_os_str().is_empty() || p.is_absolute()) {
                return Err((f.into(), format!("must be an absolute path or empty (the default below ledger_dir), got {p:?}")));
            }
            if p.components().any(|c| c == std::path::Component::ParentDir) {
                return Err((f.into(), format!("must not contain `..` (paths are judged as written), got {p:?}")));
            }
        }
        if !(self.shm_dir.as_os_str().is_empty() || self.shm_dir == Path::new(SHM_HOST) || self.shm_dir.is_absolute()) {
            return Err((
                "shm_dir".into(),
                format!(
                    "must be an absolute directory, \"{SHM_HOST}\" (the host's /dev/shm) or empty (/dev/shm/xshare-gpu<N>), got {:?}",
                    self.shm_dir
                ),
            ));
        }
        if let Some(sys) = SYSTEM_DIRS.iter().find(|d| self.shm_dir == Path::new(d)) {
            return Err((
                "shm_dir".into(),
                format!("must not be the system directory {sys}: the manager makes shm_dir a world-writable (1777) directory; name one of its own, e.g. /dev/shm/xshare-gpu{{gpu}}"),
            ));
        }
        if self.shm_dir.components().any(|c| c == std::path::Component::ParentDir) {
            return Err(("shm_dir".into(), format!("must not contain `..`, got {:?}", self.shm_dir)));
        }
        if !(1..=3600).contains(&self.recovery.max_per_hour) {
            return Err((
                "recovery.max_per_hour".into(),
                format!(
                    "must be within 1..=3600, got {}",
                    self.recovery.max_per_hour
                ),
            ));
        }
        let idle = self.detect.idle_sm_pct;
        if !(idle.is_finite() && (0.0..=100.0).contains(&idle)) {
            return Err((
                "detect.idle_sm_pct".into(),
                format!("must be within 0..=100, got {idle}"),
            ));
        }
        self.budget.validate()
    }

    /// Loads `base` plus `<stem>.d/*.json` overrides.
    pub fn load(base: &Path) -> Result<(Config, Vec<PathBuf>), ConfigError> {
        layered::load_with_overrides(base, Config::validate)
    }

    /// Applies `$XSHARE_LEDGER_DIR`, `--gpu`, and fills derived paths.
    pub fn finalize(&mut self, gpu: Option<u32>) {
        node_daemon::cli::apply_overrides(&mut self.ledger_dir, &mut self.gpu_index, gpu);
        let gdir = self
            .ledger_path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let fill = |p: &mut PathBuf, name: &str| {
            if p.as_os_str().is_empty() {
                *p = gdir.join(name);
            }
        };
        fill(&mut self.pipe_dir, "mps-pipe");
        let ddir = node_ledger::config::daemon_dir(&self.ledger_dir, self.gpu_index);
        if self.log_dir.as_os_str().is_empty() {
            self.log_dir = ddir.join("mps-log");
        }
        for (p, name) in [(&mut self.monitor_state_file, "state.json"), (&mut self.state_file, "mps-manager.json")] {
            if p.as_os_str().is_empty() {
                *p = ddir.join(name);
            }
        }
        if self.shm_dir.as_os_str().is_empty() {
            self.shm_dir = PathBuf::from(format!("/dev/shm/xshare-gpu{}", self.gpu_index));
        }
        for p in [&mut self.pipe_dir, &mut self.log_dir, &mut self.monitor_state_file, &mut self.state_file, &mut self.shm_dir] {
            node_daemon::cli::expand_gpu(p, self.gpu_index);
        }
    }

    /// Checks the paths [`Config::finalize`] made: `Err((field, why))` for a `log_dir` in the
    /// GPU's ledger directory (`<ledger_dir>/gpu<N>`), which offline containers get read-write.
    /// The control daemon and its servers run as root and append to `control.log` and
    /// `server.log` there: a tenant that replaced one with a symbolic link would have them
    /// write into any file of the host. Judged on the paths as written (no link is followed).
    pub fn check_paths(&self) -> Result<(), (String, String)> {
        let ledger = self.ledger_path();
        let Some(tenant_dir) = ledger.parent() else { return Ok(()) };
        if self.log_dir.starts_with(tenant_dir) {
            return Err((
                "log_dir".into(),
                format!(
                    "{} is inside {}, which offline containers get read-write: a tenant could replace \
                     control.log with a symbolic link and the MPS control daemon (root) would append to the \
                     file it names; leave log_dir empty (<ledger_dir>/daemons/gpu<N>/mps-log) or name a \
                     directory no container gets",
                    self.log_dir.display(),
                    tenant_dir.display()
                ),
            ));
        }
        Ok(())
    }

    /// [`Config::check_paths`] with the error located in the files the config came from
    /// (`files`, base first, as [`Config::load`] returns them; empty for built-in defaults):
    /// file, line and field.
    pub fn check_paths_in(&self, files: &[PathBuf]) -> Result<(), ConfigError> {
        self.check_paths().map_err(|(field, why)| layered::locate_in_files(files, &field, why))
    }

    /// Puts this config's settings read only at start into `new` (a reloaded config, finalized
    /// as this one was): the directories and program of the running control daemon and this
    /// manager's files. Returns those `new` had changed, for the reload to report.
    pub fn keep_start_only(&self, new: &mut Config) -> Vec<&'static str> {
        let mut changed = Vec::new();
        macro_rules! keep {
            ($($field:ident),*) => {$(
                if new.$field != self.$field {
                    changed.push(stringify!($field));
                    new.$field = self.$field.clone();
                }
            )*};
        }
        keep!(ledger_dir, control_bin, pipe_dir, log_dir, state_file, shm_dir);
        changed
    }

    /// The directory the control daemon gets as its `/dev/shm` ([`Config::shm_dir`]); `None`
    /// when it keeps the host's.
    pub fn daemon_shm_dir(&self) -> Option<&Path> {
        (self.shm_dir != Path::new(SHM_HOST) && !self.shm_dir.as_os_str().is_empty()).then_some(self.shm_dir.as_path())
    }

    /// This GPU's ledger file (`<ledger_dir>/gpu<N>/ledger`).
    pub fn ledger_path(&self) -> PathBuf {
        node_ledger::config::ledger_path(&self.ledger_dir, self.gpu_index)
    }

    /// This GPU's status file (`<ledger_dir>/status/gpu<N>`), where the manager publishes the
    /// offline SM budget and reads the monitor's sample.
    pub fn status_path(&self) -> PathBuf {
        node_ledger::config::status_path(&self.ledger_dir, self.gpu_index)
    }
}

/// Whether `bin` names an executable regular file: an absolute path as is, a bare name
/// searched in `$PATH` as the manager's spawn searches it.
pub fn runnable(bin: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let exec = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if bin.is_absolute() {
        return exec(bin);
    }
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| exec(&d.join(bin))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_paths_derive_from_the_gpu() {
        let mut c = Config::default();
        assert!(c.validate().is_ok());
        assert!(
            !c.quit_on_exit,
            "a restart (an upgrade) must keep MPS, and the online service on it, running"
        );
        c.ledger_dir = "/run/x".into();
        c.finalize(Some(3));
        assert_eq!(c.pipe_dir, PathBuf::from("/run/x/gpu3/mps-pipe"));
        assert_eq!(
            c.log_dir,
            PathBuf::from("/run/x/daemons/gpu3/mps-log"),
            "the root daemons' log files where no container reaches"
        );
        assert!(c.check_paths().is_ok());
        assert_eq!(
            c.monitor_state_file,
            PathBuf::from("/run/x/daemons/gpu3/state.json")
        );
        assert_eq!(c.daemon_shm_dir(), Some(Path::new("/dev/shm/xshare-gpu3")), "the daemon's own /dev/shm by default");
        // One config for every GPU: `{gpu}` in the paths it sets.
        let mut c = Config {
            pipe_dir: "/srv/mps/{gpu}/pipe".into(),
            log_dir: "/var/log/mps-{gpu}".into(),
            monitor_state_file: "/var/lib/xshare/monitor-{gpu}.json".into(),
            state_file: "/var/lib/xshare/manager-{gpu}.json".into(),
            shm_dir: "/dev/shm/mps{gpu}".into(),
            ..Config::default()
        };
        c.finalize(Some(2));
        assert_eq!(
            [c.pipe_dir, c.log_dir, c.monitor_state_file, c.state_file, c.shm_dir],
            ["/srv/mps/2/pipe", "/var/log/mps-2", "/var/lib/xshare/monitor-2.json", "/var/lib/xshare/manager-2.json", "/dev/shm/mps2"]
                .map(PathBuf::from)
        );
    }

    #[test]
    fn a_log_dir_offline_containers_can_write_is_refused() {
        for dir in ["/run/x/gpu3/mps-log", "/run/x/gpu3", "/run/x/gpu{gpu}/logs/mps"] {
            let mut c = Config { ledger_dir: "/run/x".into(), log_dir: dir.into(), ..Config::default() };
            c.finalize(Some(3));
            let (field, why) = c.check_paths().unwrap_err();
            assert_eq!(field, "log_dir");
            assert!(why.contains("/run/x/gpu3") && why.contains("symbolic link"), "{why}");
        }
        // Another GPU's directory, the daemon directory, elsewhere: fine.
        for dir in ["/run/x/gpu30/mps-log", "/run/x/daemons/gpu3/mps-log", "/var/log/mps-{gpu}"] {
            let mut c = Config { ledger_dir: "/run/x".into(), log_dir: dir.into(), ..Config::default() };
            c.finalize(Some(3));
            assert!(c.check_paths().is_ok(), "{dir}");
        }
    }

    /// `/run/xshare/daemons/../gpu{gpu}/mps-log` names the tenants' directory through the
    /// daemons' one: `check_paths`, which judges paths as written, let it through. `..` is
    /// refused in every path of the config, naming file, line and field; and what
    /// `check_paths` refuses names file, line and field too.
    #[test]
    fn a_log_dir_reaching_the_tenants_directory_through_dotdot_is_refused_naming_file_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mps-manager.json");
        for (f, v) in [
            ("log_dir", "/run/xshare/daemons/../gpu{gpu}/mps-log"),
            ("pipe_dir", "/run/xshare/gpu{gpu}/../status"),
            ("state_file", "/run/xshare/daemons/gpu{gpu}/../../gpu{gpu}/m.json"),
            ("ledger_dir", "/run/xshare/../xshare"),
        ] {
            std::fs::write(&p, format!("{{\n  \"period_ms\": 100,\n  \"{f}\": \"{v}\"\n}}\n")).unwrap();
            let e = Config::load(&p).unwrap_err();
            assert_eq!((e.file.as_path(), e.line, e.field.as_deref()), (p.as_path(), Some(3), Some(f)), "{v}: {e}");
            assert!(e.message.contains("`..`"), "{e}");
        }
        std::fs::write(&p, "{\n  \"ledger_dir\": \"/run/x\",\n  \"log_dir\": \"/run/x/gpu{gpu}/mps-log\"\n}\n").unwrap();
        let (mut c, files) = Config::load(&p).unwrap();
        c.finalize(Some(2));
        let e = c.check_paths_in(&files).unwrap_err();
        assert_eq!((e.file.as_path(), e.line, e.field.as_deref()), (p.as_path(), Some(3), Some("log_dir")), "{e}");
        assert!(e.to_string().contains("mps-manager.json:3") && e.message.contains("symbolic link"), "{e}");
    }

    /// An empty or relative ledger_dir was accepted and resolved against the manager's working
    /// directory: the manager, the monitor and the shims then disagree on the ledger.
    #[test]
    fn a_relative_or_empty_ledger_dir_is_refused() {
        for v in ["", "run/xshare", "./xshare"] {
            let e = load_text(&format!("{{\n  \"ledger_dir\": \"{v}\"\n}}\n"));
            assert_eq!((e.field.as_deref(), e.line), (Some("ledger_dir"), Some(2)), "{v}: {e}");
            assert!(e.message.contains("absolute"), "{e}");
        }
    }

    /// `evict_grace_ms: 0` passed check-config: the SIGKILL came at the check after the
    /// SIGTERM. Refused under node_ledger::MIN_EVICT_GRACE_MS.
    #[test]
    fn an_evict_grace_under_the_floor_is_refused() {
        let min = node_ledger::MIN_EVICT_GRACE_MS;
        for v in [0, min - 1] {
            let e = load_text(&format!("{{\n  \"evict_grace_ms\": {v}\n}}\n"));
            assert_eq!((e.field.as_deref(), e.line), (Some("evict_grace_ms"), Some(2)), "{v}: {e}");
            assert!(e.message.contains(&format!("got {v}")) && e.message.contains("leaving MPS"), "{e}");
        }
        assert!(Config { evict_grace_ms: min, ..Config::default() }.validate().is_ok());
    }

    /// `unsafe_pct` was checked against max_pct only: an Overlimit or Disabled GPU published
    /// more for offline work (42 %) than a safe but busy one (min_pct, 5 %).
    #[test]
    fn unsafe_pct_above_min_pct_is_refused() {
        let e = load_text("{\n  \"budget\": {\n    \"min_pct\": 5,\n    \"max_pct\": 42,\n    \"unsafe_pct\": 42\n  }\n}\n");
        assert_eq!((e.field.as_deref(), e.line), (Some("budget.unsafe_pct"), Some(5)), "{e}");
        assert!(e.message.contains("min_pct (5)"), "{e}");
        // Lowering min_pct under the default unsafe_pct (10) is refused too, blamed on the block.
        let e = load_text("{\n  \"budget\": {\n    \"min_pct\": 5\n  }\n}\n");
        assert_eq!((e.field.as_deref(), e.line), (Some("budget.unsafe_pct"), Some(2)), "{e}");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.json");
        std::fs::write(&p, r#"{"budget": {"min_pct": 5, "unsafe_pct": 5}}"#).unwrap();
        assert!(Config::load(&p).is_ok());
    }

    #[test]
    fn shm_dir_is_a_directory_or_host() {
        let mut c = Config { shm_dir: "host".into(), ..Config::default() };
        c.finalize(None);
        assert!(c.validate().is_ok());
        assert_eq!(c.daemon_shm_dir(), None, "the host's /dev/shm");
        c.shm_dir = "/srv/mps-shm".into();
        assert_eq!(c.daemon_shm_dir(), Some(Path::new("/srv/mps-shm")));
        c.shm_dir = "mps-shm".into();
        let (field, msg) = c.validate().unwrap_err();
        assert_eq!(field, "shm_dir");
        assert!(msg.contains("absolute") && msg.contains("\"host\""), "{msg}");
        // `/` or a system directory would be made world-writable: refused, however written.
        for sys in ["/", "/var/lib", "/var/lib/", "/etc", "/usr//local", "/tmp"] {
            c.shm_dir = sys.into();
            let (field, msg) = c.validate().unwrap_err();
            assert_eq!(field, "shm_dir", "{sys}");
            assert!(msg.contains("system directory"), "{sys}: {msg}");
        }
        c.shm_dir = "/dev/shm/../../etc".into();
        assert_eq!(c.validate().unwrap_err().0, "shm_dir");
        c.shm_dir = "/var/lib/xshare/shm-{gpu}".into();
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_budget_names_file_line_and_field() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mps-manager.json");
        std::fs::write(
            &p,
            "{\n  \"budget\": {\n    \"min_pct\": 80,\n    \"max_pct\": 50\n  }\n}\n",
        )
        .unwrap();
        let e = Config::load(&p).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("budget.min_pct"));
        assert_eq!(e.line, Some(3));
    }

    fn load_text(text: &str) -> ConfigError {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mps-manager.json");
        std::fs::write(&p, text).unwrap();
        let e = Config::load(&p).unwrap_err();
        assert_eq!(e.file, p);
        e
    }

    #[test]
    fn out_of_range_values_name_file_line_and_field() {
        for (text, field, line) in [
            (
                "{\n  \"evict_grace_ms\": 18446744073709551615\n}\n",
                "evict_grace_ms",
                2,
            ),
            (
                "{\n\n  \"command_timeout_ms\": 600001\n}\n",
                "command_timeout_ms",
                3,
            ),
            // Under the control program's round trip: every look a daemon hang, a reset.
            ("{\n  \"command_timeout_ms\": 1\n}\n", "command_timeout_ms", 2),
            (
                "{\n  \"detect\": {\n    \"idle_sm_pct\": 250\n  }\n}\n",
                "detect.idle_sm_pct",
                3,
            ),
            (
                "{\n  \"detect\": {\n    \"stuck_after_ms\": 18446744073709551615\n  }\n}\n",
                "detect.stuck_after_ms",
                3,
            ),
            (
                "{\n  \"recovery\": {\n    \"min_interval_ms\": 18446744073709551615\n  }\n}\n",
                "recovery.min_interval_ms",
                3,
            ),
            (
                "{\n  \"budget\": {\n    \"headroom_pct\": 250\n  }\n}\n",
                "budget.headroom_pct",
                3,
            ),
            (
                "{\n  \"budget\": {\n    \"max_pct\": 101\n  }\n}\n",
                "budget.max_pct",
                3,
            ),
            // A lead shorter than the check period could miss the monitor's SIGKILL.
            (
                "{\n  \"check_every_ms\": 500,\n  \"terminate_before_kill_ms\": 400\n}\n",
                "terminate_before_kill_ms",
                3,
            ),
            // A config error must never loosen a limit: Overlimit would raise the budget.
            (
                "{\n  \"budget\": {\n    \"max_pct\": 42,\n    \"unsafe_pct\": 60\n  }\n}\n",
                "budget.unsafe_pct",
                4,
            ),
            ("{\n  \"control_bin\": \"\"\n}\n", "control_bin", 2),
            // A path is judged as written: relative to wherever the manager started, or
            // climbing out through `..`.
            ("{\n  \"control_bin\": \"../../bin/sh\"\n}\n", "control_bin", 2),
            ("{\n  \"control_bin\": \"bin/nvidia-cuda-mps-control\"\n}\n", "control_bin", 2),
            ("{\n  \"control_bin\": \"/usr/bin/../bin/sh\"\n}\n", "control_bin", 2),
            ("{\n  \"period_ms\": 100,\n  \"pipe_dir\": \"mps-pipe\"\n}\n", "pipe_dir", 3),
            ("{\n  \"log_dir\": \"./log\"\n}\n", "log_dir", 2),
            ("{\n  \"state_file\": \"mps-{gpu}.json\"\n}\n", "state_file", 2),
            ("{\n  \"monitor_state_file\": \"state.json\"\n}\n", "monitor_state_file", 2),
        ] {
            let e = load_text(text);
            assert_eq!(e.field.as_deref(), Some(field), "{text}: {e}");
            assert_eq!(e.line, Some(line), "{text}: {e}");
        }
    }

    /// A command timeout under the control program's round trip turned every look into a
    /// `daemon_hang` and a full MPS reset: refused under [`MIN_COMMAND_TIMEOUT_MS`], saying why.
    #[test]
    fn a_command_timeout_under_the_floor_is_refused() {
        for v in [1, MIN_COMMAND_TIMEOUT_MS - 1] {
            let c = Config { command_timeout_ms: v, ..Config::default() };
            let (field, why) = c.validate().unwrap_err();
            assert_eq!(field, "command_timeout_ms");
            assert!(why.contains(&format!("got {v}")) && why.contains("daemon hang"), "{why}");
        }
        let c = Config { command_timeout_ms: MIN_COMMAND_TIMEOUT_MS, ..Config::default() };
        assert!(c.validate().is_ok());
    }

    /// `check-config` said ok for a control program that was not there; the manager then
    /// exited at every restart.
    #[test]
    fn a_control_program_is_runnable_only_as_an_executable_file() {
        assert!(runnable(Path::new("/bin/sh")));
        assert!(runnable(Path::new("sh")), "a bare name is searched in PATH");
        assert!(!runnable(Path::new("/nonexistent/nvidia-cuda-mps-control")));
        let d = tempfile::tempdir().unwrap();
        let plain = d.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&plain, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        assert!(!runnable(&plain), "not executable");
        assert!(!runnable(Path::new("/bin")), "a directory");
        assert!(!runnable(Path::new("no-such-program-xshare")));
    }

    #[test]
    fn an_oversized_file_is_refused_unread() {
        let big = format!(
            "{{\"period_ms\": 100{}}}",
            " ".repeat(layered::MAX_FILE_BYTES as usize)
        );
        let e = load_text(&big);
        assert!(e.message.contains("bytes"), "{e}");
        assert_eq!(e.field, None);
    }
}

