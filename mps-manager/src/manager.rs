//! The manager loop: keeps the MPS control daemon up, applies the offline SM budget, detects
//! MPS failures and recovers (evict offline clients, reset MPS, mark them for restart).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::time::Duration;

use node_ledger::{HealthState, Ledger};
use serde::{Deserialize, Serialize};
use node_daemon::clock::{mono_ms, unix_ms};
use node_daemon::errlog::ErrorRun;
use node_daemon::evictor::{PidfdSignaller, Signaller};

use crate::budget::Allocator;
use crate::compute_mode::{self, ComputeModePolicy, Keeper};
use crate::config::Config;
use crate::control::{DaemonId, MpsControl, MpsError};
use crate::detect::{Detector, Fault, Observation, RateLimiter};
use crate::outside::{Candidate, Listed, Outside, OutsideAction};

/// One recovery, for the state file and logs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// Wall-clock ms when it ran.
    pub at_unix_ms: u64,
    /// The fault that called for it.
    pub fault: Fault,
    /// Pids of the offline clients it evicted.
    pub evicted: Vec<u32>,
    /// What it did and how it ended.
    pub outcome: String,
}

/// An offline process the manager evicted and wants its owner to restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestartRequest {
    /// Pid of the evicted process in the manager's pid namespace (what MPS and `/proc` here
    /// name it), or the pid of its own namespace when it was not found from here.
    pub pid: u32,
    /// Its start time (`/proc/<pid>/stat` field 22), so the pid is never taken for another.
    pub start_time: u64,
    /// Why it was evicted.
    pub reason: String,
    /// Wall-clock ms of the eviction.
    pub at_unix_ms: u64,
}

/// A `terminate_client` sent (or about to be sent) for an offline client listed on a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminating {
    /// Pid of the client.
    pub pid: u32,
    /// Its start time (from its ledger registration), so the pid is never taken for another.
    pub start_time: u64,
    /// The server that listed it.
    pub server: u32,
}

/// One Disabled-by-XID episode of the monitor's, as its state file tells it: the XID, since
/// when the GPU is Disabled by it and the boot those monotonic ms belong to. A restarted
/// monitor keeps both, so the episode is the same across restarts of either daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandledXid {
    /// The XID code.
    pub code: u64,
    /// The monitor's `disabled_since_mono_ms` (absent in files of monitors before it).
    pub disabled_since_mono_ms: Option<u64>,
    /// The monitor's `boot_id`.
    pub boot_id: String,
}

impl HandledXid {
    /// The episode of the XID the monitor's state `m` holds the GPU Disabled by, if any.
    pub fn of(m: &node_daemon::monitor_state::MonitorState) -> Option<HandledXid> {
        Some(HandledXid { code: m.disabling_xid()?, disabled_since_mono_ms: m.disabled_since_mono_ms, boot_id: m.boot_id.clone() })
    }
}

/// The manager's state file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ManagerState {
    /// GPU index.
    pub gpu: u32,
    /// Pid of the writing manager.
    pub manager_pid: u32,
    /// Pid of the MPS control daemon, once started or detected; `None` while none runs (from
    /// the first check that finds it gone, even while the rate limit holds its reset back, and
    /// after this manager quit it). node-agent reads it (`node_agent::mps`, with `gpu`,
    /// `shm_dir`, `outside_holders`, `last_error` and `updated_unix_ms`): while it is `None`
    /// the GPU's offline slots are Unhealthy. Keep those fields' names and meanings.
    pub daemon_pid: Option<u32>,
    /// Start time (`/proc/<pid>/stat` field 22) of `daemon_pid` when it was started or
    /// detected: the daemon is only ever signalled as this pid + start time.
    #[serde(default)]
    pub daemon_start_time: Option<u64>,
    /// Pids of the MPS servers at the last look.
    pub servers: Vec<u32>,
    /// The directory the control daemon (and its servers) has as its `/dev/shm`, checked when
    /// it was started or adopted: MPS clients must see it as theirs (containers get it mounted
    /// at `/dev/shm`). `None` when it is not the configured `shm_dir` (`last_error` says).
    /// node-agent reads it (`node_agent::mps`): a GPU whose containers' `/dev/shm` would
    /// differ has Unhealthy offline slots and refuses Allocate. Keep its name and meaning.
    #[serde(default)]
    pub shm_dir: Option<String>,
    /// MPS clients connected at the last look, all servers together.
    pub clients: usize,
    /// The health state the monitor last published, if any.
    pub gpu_health: Option<String>,
    /// Total SM activity the monitor last published, percent.
    pub sm_activity_pct: f64,
    /// Estimated SM activity of the online workload alone (smoothed), percent.
    pub online_estimate_pct: f64,
    /// The offline SM budget in force, percent.
    pub offline_budget_pct: Option<f64>,
    /// Faults seen since start, by kind ([`Fault::kind`]).
    pub faults: BTreeMap<String, u64>,
    /// The latest recoveries (at most 50).
    pub recoveries: Vec<Recovery>,
    /// Recoveries the rate limit held back.
    pub suppressed_recoveries: u64,
    /// Control daemons started in place of a dead one while the rate limit held the recovery
    /// back: with no MPS server left running there is no client to lose, and while no daemon
    /// runs a process initialising CUDA takes the bare GPU (`Manager::restart_dead_daemon`).
    #[serde(default)]
    pub daemons_started_past_limit: u64,
    /// Offline processes evicted for their owners to restart.
    pub restart_requested: Vec<RestartRequest>,
    /// Effective uid of the running MPS server (the user MPS serves now).
    #[serde(default)]
    pub mps_server_uid: Option<u32>,
    /// MPS servers seen running as a user other than `client_uid` (see the config).
    #[serde(default)]
    pub user_breaches: u64,
    /// Offline clients whose MPS work was ended with `terminate_client` because the monitor
    /// was about to SIGKILL them (`terminate_before_kill_ms`).
    #[serde(default)]
    pub terminated_before_kill: u64,
    /// Registered offline processes whose owner this manager has seen holding the slot's lock
    /// (alive then; some may have died since): the registrations it takes for offline clients,
    /// and the only ones whose death it recovers from as a dead client.
    #[serde(default)]
    pub offline_seen: usize,
    /// Offline processes found doing GPU work outside MPS (see the config's `outside_mps`).
    #[serde(default)]
    pub outside_mps: u64,
    /// Offline clients this manager is about to `terminate_client` (written to the state file
    /// before the command is sent, dropped once the recovery is done; those taken over from a
    /// previous manager stay until finished): a manager killed in the
    /// middle of a recovery leaves them here, so the next one knows that such a client, dead and
    /// no longer listed on any server, was terminated (not a reason for a full reset).
    #[serde(default)]
    pub terminating: Vec<Terminating>,
    /// The GPU's compute mode at the last look (`exclusive_process`, `default`, ...; `None`
    /// when the config's `compute_mode` is `leave`).
    #[serde(default)]
    pub compute_mode: Option<String>,
    /// The mode this manager found before it set EXCLUSIVE_PROCESS, put back when it quits MPS.
    #[serde(default)]
    pub compute_mode_found: Option<String>,
    /// Times the compute mode was found changed while the manager ran and set back.
    #[serde(default)]
    pub compute_mode_restored: u64,
    /// Processes holding a context of their own on the GPU outside MPS (NVML lists them, no
    /// MPS server lists them; two looks in a row), with `compute_mode` exclusive_process: no
    /// MPS server can start while one runs.
    #[serde(default)]
    pub outside_holders: Vec<u32>,
    /// Why the monitor's state file (`monitor_state_file`) could not be read at the last look,
    /// `None` when it could: while set, no disabling XID and no pending eviction is seen.
    #[serde(default)]
    pub monitor_state_error: Option<String>,
    /// Set while `pipe_dir/control` is no longer the socket the control daemon had when this
    /// manager started or adopted it (removed, or another file in its place): new MPS clients
    /// of the GPU, and this manager's own commands, no longer reach the daemon. The pipe
    /// directory is in every offline container's mounts (read-write unless node-agent's
    /// `inject.mps_pipe_read_only`), so a tenant can do it. node-agent reads it
    /// (`node_agent::mps`): the GPU's offline slots are Unhealthy and Allocate is refused.
    #[serde(default)]
    pub control_socket_replaced: Option<String>,
    /// The control daemon runs but did not answer this manager's last look
    /// (`get_server_list` timed out: a hang, in which new MPS clients hang as well): what and
    /// since when. Cleared when it answers again, or when another daemon takes its place.
    /// While it is set node-agent (`node_agent::mps`) makes the GPU's offline slots Unhealthy
    /// and refuses Allocate: with the reset that a hang calls for rate-limited, `daemon_pid`
    /// alone kept admitting containers to a daemon that served none.
    #[serde(default)]
    pub daemon_not_answering: Option<String>,
    /// The critical XID whose recovery (a full MPS reset) this manager, or an earlier run of
    /// it, has made: taken over at start ([`Manager::adopt_previous`]), so that a restarted
    /// manager does not reset MPS again for an XID the monitor still reports (the GPU stays
    /// Disabled by it until an operator acts).
    #[serde(default)]
    pub xid_handled: Option<HandledXid>,
    /// The last error talking to MPS.
    pub last_error: Option<String>,
    /// Wall-clock ms of this snapshot.
    pub updated_unix_ms: u64,
}

/// How often the pods directory is read for pod ledgers, ms.
pub const POD_SCAN_EVERY_MS: u64 = 250;

/// The wait before a second control daemon is started past the recovery rate limit
/// (`Manager::restart_dead_daemon`); each further start doubles it up to
/// [`PAST_LIMIT_BACKOFF_MAX_MS`].
pub const PAST_LIMIT_BACKOFF_FIRST_MS: u64 = 1_000;
/// The longest wait between two control daemons started past the rate limit.
pub const PAST_LIMIT_BACKOFF_MAX_MS: u64 = 60_000;
/// A daemon started past the rate limit that lived this long resets the wait to
/// [`PAST_LIMIT_BACKOFF_FIRST_MS`]: it did not die right after starting.
pub const PAST_LIMIT_STABLE_MS: u64 = 300_000;

/// Backoff of control daemons started past the recovery rate limit (a daemon that dies right
/// after it starts is not started again at every check).
#[derive(Debug, Default, Clone, Copy)]
struct PastLimitBackoff {
    /// When the last one was started (monotonic ms), if one was.
    last_start_ms: Option<u64>,
    /// The wait after it before the next may start, ms.
    wait_ms: u64,
}

impl PastLimitBackoff {
    /// How long a start at `now_ms` must still wait (0: it may start now).
    fn wait_left(&self, now_ms: u64) -> u64 {
        self.last_start_ms.map_or(0, |t| t.saturating_add(self.wait_ms).saturating_sub(now_ms))
    }

    /// Records a start at `now_ms`: the wait doubles, or starts again from the first after a
    /// daemon that lived [`PAST_LIMIT_STABLE_MS`].
    fn started(&mut self, now_ms: u64) {
        let stable = self.last_start_ms.is_none_or(|t| now_ms.saturating_sub(t) >= PAST_LIMIT_STABLE_MS);
        self.wait_ms = if stable {
            PAST_LIMIT_BACKOFF_FIRST_MS
        } else {
            self.wait_ms.saturating_mul(2).clamp(PAST_LIMIT_BACKOFF_FIRST_MS, PAST_LIMIT_BACKOFF_MAX_MS)
        };
        self.last_start_ms = Some(now_ms);
    }
}

/// How long a client the servers' log reports torn down may take to be found an offline
/// process of this GPU (its pid here resolved, its owner seen) before the manager leaves it to
/// its owner ([`Manager::evict_torn_down`]).
pub const TORN_DOWN_LOOKUP_MS: u64 = 10_000;

/// One GPU's MPS manager: the SM budget loop, fault detection and rate-limited recovery.
pub struct Manager {
    /// The configuration in force.
    pub cfg: Config,
    /// The MPS control daemon client.
    pub ctl: MpsControl,
    ledger: Ledger,
    /// The GPU's pod ledgers (`node_ledger::pods`), read beside its own ledger.
    pods: node_ledger::pods::PodLedgers,
    /// Monotonic ms of the next scan of the pods directory.
    next_pod_scan_ms: u64,
    /// The GPU's status file: the manager block is this manager's to write; the monitor block
    /// is read here (reopened in place when found damaged or gone).
    status: node_daemon::status::StatusKeeper,
    alloc: Allocator,
    detector: Detector,
    limiter: RateLimiter,
    /// What the state file says.
    pub state: ManagerState,
    /// Faults logged in the current episode (logged once, counted every time).
    logged_faults: HashSet<String>,
    /// Dead registrations (pid here, start time) already reported as a dead client: each is a
    /// fault once. Its slot can outlive it (a forked child still holds the slot's lock), and
    /// a registration is no evidence that a server still lists it: a listed dead client is
    /// caught again by its server's list ([`crate::detect::Observation::dead_listed`]).
    dead_reported: BTreeSet<(u32, u64)>,
    /// The servers' `server.log`, for the clients a fatal GPU error tore down
    /// ([`crate::serverlog`]).
    server_log: crate::serverlog::ServerLog,
    /// Clients the log reported torn down whose offline process has not been asked to leave
    /// yet: pid to (its start time when reported, monotonic ms reported). Retried at each look
    /// until the request is written, the process is gone, or [`TORN_DOWN_LOOKUP_MS`] pass
    /// without it being found an offline process of this GPU.
    torn_pending: std::collections::BTreeMap<u32, (u64, u64)>,
    /// The rate limit was already logged in this episode.
    limited_logged: bool,
    /// A `ClientsStuck` naming no process an MPS server lists was already logged in this
    /// episode ([`Manager::stuck_on_mps`]).
    stuck_unlisted_logged: bool,
    /// The XID episode a check found as a fault: recorded as handled (`xid_handled`, kept
    /// across restarts) once a full MPS reset ran after it was found (its own recovery, or
    /// another fault's that came first in the check), not when it was found. While it is owed
    /// (the rate limit held its recovery back, or another fault's refused recovery came first)
    /// each check asks for it again once the limit allows ([`Manager::check`]); a restarted
    /// manager finds it anew.
    xid_pending: Option<HandledXid>,
    /// The owed XID's hold by the rate limit was said (ERROR once, until it runs or ends).
    xid_held_said: bool,
    /// Until when (monotonic ms) a `ClientsStuck` ends the servers instead of the targeted
    /// step: set by a targeted recovery of stuck clients ([`stuck_episode_ms`] on, or for good
    /// when it failed), cleared by a full recovery. Never for a fault naming no process an MPS
    /// server lists ([`Manager::stuck_on_mps`]): that one ends nothing.
    escalate_stuck_until: Option<u64>,
    own_ns: u64,
    /// The last check saw the control daemon running ([`Manager::daemon_died`]).
    daemon_seen_alive: bool,
    /// The control daemon this manager started or detected, as pid + start time: what its
    /// liveness is judged by ([`Manager::live_daemon`]), never the pid file alone.
    daemon: Option<DaemonId>,
    /// The pid file no longer names the recorded live daemon (warned once until it does again).
    pid_file_astray: bool,
    /// Device and inode numbers of `pipe_dir/control` when that daemon was started or adopted.
    control_socket: Option<(u64, u64)>,
    /// MPS servers as last listed by `get_server_list`, each as pid + start time read when
    /// listed (what a reset kills when `quit` did not stop them).
    servers_seen: Vec<DaemonId>,
    /// Control daemons started past the rate limit ([`Manager::restart_dead_daemon`]).
    past_limit: PastLimitBackoff,
    /// Servers already reported as running for the wrong user (reported once each).
    breach_reported: HashSet<u32>,
    /// Offline processes the manager evicted outside a recovery (another user's, or outside
    /// MPS), by their pid here: (pid, start time) -> when (ms); SIGKILLed once
    /// `evict_grace_ms` is over, never evicted twice.
    evicted: BTreeMap<(u32, u64), u64>,
    /// Offline processes doing GPU work outside MPS, across looks.
    outside: Outside,
    /// Pids here of offline processes registered from other pid namespaces (containers).
    host_pids: node_daemon::procns::HostPids,
    /// Registrations (pid namespace, pid, start time, as the ledger names them) whose owner
    /// this manager saw alive holding the slot's lock ([`Manager::owner_seen`]): only such a
    /// registration, once its process is dead, is a dead client to recover.
    owners_seen: BTreeSet<(u64, u32, u64)>,
    /// `terminating` of the previous manager's state file ([`Manager::adopt_previous`]):
    /// clients it was terminating when it died.
    inherited: Vec<Terminating>,
    /// Evictions in flight whose client was already terminated before the monitor's SIGKILL
    /// (pid namespace, pid, start time, as the ledger names it); forgotten once the monitor no
    /// longer lists them.
    terminated_before_kill: BTreeSet<(u64, u32, u64)>,
    /// The GPU's compute mode, held to the config's `compute_mode`.
    modes: Keeper,
    /// The compute mode could not be held at the last check (logged once until it can).
    mode_failing: bool,
    /// Processes NVML lists on the GPU and no MPS server does, at the last look: (pid, start
    /// time) -> looks in a row.
    holders: BTreeMap<(u32, u64), u32>,
    /// The log lines of a run of failed state-file writes.
    state_write: ErrorRun,
}

/// The pid namespace `Manager::offline` gives a registration naming a process of this
/// namespace that is not found holding the ledger open: no namespace's inode (inodes of
/// `nsfs` never reach it), so no pid of this namespace ever matches it.
pub const NOT_FOUND_NS: u64 = u64::MAX;

/// How long a targeted recovery looks for the clients it must terminate on the servers' lists
/// before it gives up and resets MPS. Well under the 1 s the online neighbour may wait.
pub const LISTING_GRACE_MS: u64 = 500;
/// Pause between two looks.
pub const LISTING_RETRY_MS: u64 = 25;

/// How long after a targeted recovery of stuck clients a new `ClientsStuck` counts as the
/// same episode (the targeted step did not help: the servers are ended): the detector fires
/// again no sooner than `detect.stuck_after_ms` after it plus up to one check period, so twice
/// that plus a check period leaves room for one look that saw a blip of progress. Later, it is
/// a new episode, met with the targeted step again.
pub fn stuck_episode_ms(cfg: &Config) -> u64 {
    cfg.detect.stuck_after_ms.saturating_mul(2).saturating_add(cfg.check_every_ms)
}

/// The order in which the faults of one check are recovered from
/// ([`Manager::handle_faults`]): what needs a new MPS first (a dead daemon before the others:
/// its recovery may start a new one past the rate limit), then crashed servers, dead clients,
/// and stuck clients last.
pub fn recovery_order(f: &Fault) -> u8 {
    match f {
        Fault::DaemonDead => 0,
        Fault::DaemonHang { .. } => 1,
        Fault::Xid { .. } => 2,
        Fault::ServerCrash { .. } => 3,
        Fault::ClientDied { .. } => 4,
        Fault::ClientsStuck { .. } => 5,
    }
}

/// Builds the control client for a config.
pub fn control_for(cfg: &Config) -> MpsControl {
    MpsControl {
        bin: cfg.control_bin.clone(),
        pipe_dir: cfg.pipe_dir.clone(),
        log_dir: cfg.log_dir.clone(),
        visible_devices: cfg.gpu_index.to_string(),
        timeout: Duration::from_millis(cfg.command_timeout_ms),
        shm_dir: cfg.daemon_shm_dir().map(Path::to_path_buf),
    }
}

/// This GPU's single-instance lock file, in its daemon-only directory
/// (`<ledger_dir>/daemons/gpu<N>/mps-manager.lock`: out of containers' reach).
pub fn lock_file(cfg: &Config) -> std::path::PathBuf {
    node_ledger::config::daemon_dir(&cfg.ledger_dir, cfg.gpu_index).join("mps-manager.lock")
}

/// Takes the per-GPU single-instance lock ([`lock_file`], a POSIX write lock held for the life
/// of the returned file, released by the kernel however the manager dies). Two managers of one
/// GPU would both own its control daemon: both recover the same fault (a second
/// `terminate_client`, or a reset that cuts off the clients the first one just saved) and both
/// publish a budget. A second `mps-manager run` for the GPU gets an error naming the holder.
pub fn lock_instance(cfg: &Config) -> Result<std::fs::File, String> {
    node_daemon::instance::lock(
        &lock_file(cfg),
        &format!("mps-manager for GPU {}", cfg.gpu_index),
    )
}

/// Takes the pipe directory's single-manager lock: a POSIX write lock, held for the life of the
/// returned file, on `<ledger_dir>/daemons/mps-pipe-<dev>-<ino>.lock`, named by the device and
/// inode numbers of `pipe_dir` (created first), so that every path to one directory is one
/// lock. Two GPUs' managers given one `pipe_dir` (a config without `{gpu}`) would share one
/// control daemon, serving one GPU, each taking it for its own; the second gets an error
/// naming the directory and both GPUs.
pub fn lock_pipe_dir(cfg: &Config) -> Result<std::fs::File, String> {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let dir = &cfg.pipe_dir;
    std::fs::create_dir_all(dir).map_err(|e| format!("pipe_dir {}: {e}", dir.display()))?;
    let canon = std::fs::canonicalize(dir).map_err(|e| format!("pipe_dir {}: {e}", dir.display()))?;
    let m = std::fs::metadata(&canon).map_err(|e| format!("pipe_dir {}: {e}", canon.display()))?;
    let daemons = cfg.ledger_dir.join(node_ledger::config::DAEMON_DIR);
    let path = daemons.join(format!("mps-pipe-{}-{}.lock", m.dev(), m.ino()));
    match node_daemon::instance::lock(&path, &format!("mps-manager on pipe_dir {}", canon.display())) {
        Ok(mut f) => {
            // After the holder's pid (written by the lock): whose it is, for the next one's error.
            let _ = writeln!(f, "gpu {}", cfg.gpu_index);
            Ok(f)
        }
        Err(e) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let gpu = holder
                .lines()
                .find_map(|l| l.strip_prefix("gpu "))
                .map_or("another GPU".to_string(), |g| format!("GPU {}", g.trim()));
            Err(format!(
                "pipe_dir {} of GPU {} is already the pipe directory of the mps-manager for {gpu}: \
                 two GPUs cannot share one MPS control daemon; give each GPU its own pipe_dir (put \
                 {{gpu}} in it) ({e})",
                canon.display(),
                cfg.gpu_index
            ))
        }
    }
}

impl Manager {
    /// Opens (or creates) the GPU's ledger and sets up the control client; starts nothing.
    pub fn new(cfg: Config) -> Result<Manager, String> {
        let pods = node_ledger::pods::PodLedgers::new(&cfg.ledger_dir, cfg.gpu_index);
        let server_log = crate::serverlog::ServerLog::new(&cfg.log_dir.join("server.log"));
        let ledger = Ledger::open_or_create(&cfg.ledger_path(), cfg.gpu_index)
            .map_err(|e| format!("ledger: {e}"))?;
        let mut status = node_daemon::status::StatusKeeper::new(
            cfg.status_path(),
            cfg.gpu_index,
            "the offline SM budget is not published (shims start at MPS's default percentage)",
        );
        if status.get(mono_ms()).is_none() {
            return Err(status.error().unwrap_or("status file: cannot open").to_string());
        }
        let ctl = control_for(&cfg);
        let modes = Keeper::new(cfg.gpu_index);
        Ok(Manager {
            state: ManagerState {
                gpu: cfg.gpu_index,
                manager_pid: std::process::id(),
                ..Default::default()
            },
            cfg,
            ctl,
            pods,
            next_pod_scan_ms: 0,
            ledger,
            status,
            alloc: Allocator::default(),
            detector: Detector::default(),
            limiter: RateLimiter::default(),
            logged_faults: HashSet::new(),
            dead_reported: BTreeSet::new(),
            server_log,
            torn_pending: std::collections::BTreeMap::new(),
            limited_logged: false,
            stuck_unlisted_logged: false,
            xid_pending: None,
            xid_held_said: false,
            escalate_stuck_until: None,
            own_ns: node_ledger::procinfo::own_pid_ns(),
            daemon_seen_alive: false,
            daemon: None,
            pid_file_astray: false,
            control_socket: None,
            servers_seen: Vec::new(),
            past_limit: PastLimitBackoff::default(),
            breach_reported: HashSet::new(),
            evicted: BTreeMap::new(),
            outside: Outside::default(),
            host_pids: node_daemon::procns::HostPids::default(),
            owners_seen: BTreeSet::new(),
            inherited: Vec::new(),
            terminated_before_kill: BTreeSet::new(),
            modes,
            mode_failing: false,
            holders: BTreeMap::new(),
            state_write: ErrorRun::default(),
        })
    }

    /// Replaces how the GPU's compute mode is read and set (tests; NVML otherwise).
    pub fn set_mode_keeper(&mut self, keeper: Keeper) {
        self.modes = keeper;
    }

    /// Puts the GPU in the compute mode the config asks (EXCLUSIVE_PROCESS unless `leave`),
    /// before the control daemon starts: `Err` when it cannot (the manager then does not
    /// start MPS: a GPU without the fence is a looser limit than configured).
    pub fn hold_compute_mode(&mut self) -> Result<(), String> {
        let changed = self.hold_mode()?;
        if let Some(from) = changed {
            tracing::info!(
                gpu = self.cfg.gpu_index,
                from = compute_mode::name(from),
                "GPU compute mode set to exclusive_process: only the MPS server holds a context of its own; a process outside MPS is refused one (CUDA_ERROR_DEVICE_UNAVAILABLE)"
            );
        }
        self.note_modes();
        Ok(())
    }

    /// [`Keeper::hold`], with the mode found, when none was found before, written to the state
    /// file (`compute_mode_found`) before the mode is changed: a restarted manager takes it
    /// over ([`Manager::adopt_previous`]) to put it back with `quit_on_exit`. Before, it reached
    /// the file only at the first check: a manager whose control daemon failed to start, or
    /// that was killed before its first check, left its successor finding EXCLUSIVE_PROCESS,
    /// and the mode found (DEFAULT) was never put back. A change that fails takes it back out
    /// (nothing was changed: an operator may set the mode by hand before the next start).
    fn hold_mode(&mut self) -> Result<Option<nvml_wrapper::enum_wrappers::device::ComputeMode>, String> {
        let noted = self.modes.note_found(self.cfg.compute_mode)?;
        if noted {
            self.note_modes();
            self.write_found_mode();
        }
        let held = self.modes.hold(self.cfg.compute_mode);
        if held.is_err() && noted {
            self.modes.forget_found();
            self.note_modes();
            self.write_found_mode();
        }
        held
    }

    /// Writes `compute_mode_found` as it stands to the state file ([`Manager::hold_mode`]).
    fn write_found_mode(&mut self) {
        let path = self.cfg.state_file.clone();
        if self.state.updated_unix_ms != 0 {
            // This manager has written its state already: the file is its own.
            self.write_state(&path);
            return;
        }
        // At start, before the control daemon is started or adopted: the previous manager's
        // file (what it says of the daemon stays until this manager knows better) with the
        // mode found in it; this manager's own state when there is none.
        let mut s = match Self::read_previous(&path) {
            Ok(Some(prev)) if prev.gpu == self.state.gpu => prev,
            _ => self.state.clone(),
        };
        s.compute_mode_found.clone_from(&self.state.compute_mode_found);
        s.updated_unix_ms = unix_ms();
        let written = node_daemon::state_file::write_json_pretty(&path, &s);
        node_daemon::state_file::log_write(&mut self.state_write, mono_ms(), &path, written, "node-agent and mps-manager status");
    }

    /// At each check: the compute mode is still what the config asks, else set back (an
    /// operator's `nvidia-smi -c`, another tool), loudly.
    fn keep_compute_mode(&mut self) {
        // Never held before (the config was `leave` at start and is `exclusive_process` since a
        // reload): a first setting, not a change to undo.
        let first = self.modes.last().is_none();
        match self.hold_mode() {
            Ok(Some(from)) if first => {
                tracing::info!(gpu = self.cfg.gpu_index, from = compute_mode::name(from), "GPU compute mode set to exclusive_process (config reloaded)");
                self.mode_failing = false;
            }
            Ok(Some(from)) => {
                self.state.compute_mode_restored += 1;
                tracing::error!(
                    gpu = self.cfg.gpu_index,
                    found = compute_mode::name(from),
                    "the GPU's compute mode was changed while mps-manager runs (nvidia-smi -c?): set back to exclusive_process; set compute_mode = \"leave\" in the config to manage it yourself"
                );
                self.mode_failing = false;
            }
            Ok(None) => self.mode_failing = false,
            Err(e) => {
                if !self.mode_failing {
                    tracing::error!(gpu = self.cfg.gpu_index, error = %e, "cannot hold the GPU's compute mode");
                }
                self.mode_failing = true;
                self.state.last_error = Some(e);
            }
        }
        self.note_modes();
    }

    /// With the GPU held EXCLUSIVE_PROCESS: the processes holding a context of their own
    /// outside MPS (NVML lists them, no server lists them or is one; `clients`, a complete
    /// look), each an ERROR line once it is seen on two looks in a row (a client connecting
    /// between the two listings is on the next look's lists): no MPS server can start while it
    /// runs, so every MPS client, the online service's included, is refused. An offline one is
    /// also judged by `outside_mps`; any other (the online service started before MPS, or
    /// with another `CUDA_MPS_PIPE_DIRECTORY`) is for its operator to restart.
    fn check_holders(&mut self, clients: &BTreeMap<u32, Vec<u32>>, offline: &[node_ledger::ProcSnapshot]) {
        if self.cfg.compute_mode == ComputeModePolicy::Leave {
            self.holders.clear();
            self.state.outside_holders.clear();
            return;
        }
        let Some(pids) = self.modes.compute_pids() else {
            return;
        };
        let on_mps: BTreeSet<u32> = clients.keys().chain(clients.values().flatten()).copied().collect();
        let mut seen = BTreeMap::new();
        for pid in pids.into_iter().filter(|p| !on_mps.contains(p)) {
            let Some(start_time) = node_ledger::procinfo::start_time(pid) else {
                continue;
            };
            let looks = self.holders.get(&(pid, start_time)).map_or(1, |n| n + 1);
            seen.insert((pid, start_time), looks);
            if looks != 2 {
                continue;
            }
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let registered = offline.iter().any(|p| p.pid_ns == self.own_ns && p.pid == pid);
            tracing::error!(
                gpu = self.cfg.gpu_index,
                pid,
                comm = comm.trim(),
                uid = proc_euid(pid),
                offline = registered,
                pipe_dir = %self.cfg.pipe_dir.display(),
                "a process holds a context of its own on the GPU outside MPS: in exclusive_process mode no MPS server can start while it runs, and every MPS client is refused; {}",
                if registered {
                    "it is a registered offline process (outside_mps decides)"
                } else {
                    "restart it with CUDA_MPS_PIPE_DIRECTORY set to pipe_dir once MPS runs (the online service started before MPS?)"
                }
            );
        }
        self.holders = seen;
        self.state.outside_holders = self.holders.iter().filter(|(_, &n)| n >= 2).map(|(&(pid, _), _)| pid).collect();
    }

    fn note_modes(&mut self) {
        self.state.compute_mode = self.modes.last().map(|m| compute_mode::name(m).to_string());
        self.state.compute_mode_found = self.modes.found().map(|m| compute_mode::name(m).to_string());
    }

    /// Starts the control daemon unless one already runs for this pipe directory
    /// (`Manager::live_daemon`); records it as pid + start time.
    pub fn ensure_daemon(&mut self) -> Result<u32, MpsError> {
        if let Some(id) = self.live_daemon() {
            return Ok(id.pid);
        }
        let pid = self.ctl.start_daemon()?;
        let Some(id) = self.ctl.daemon_identity().filter(|d| d.pid == pid) else {
            return Err(MpsError::Spawn(format!(
                "control daemon {pid} (from {}) exited right after it started",
                self.ctl.pipe_dir.join(crate::control::PID_FILE).display()
            )));
        };
        self.note_daemon_shm(pid).map_err(MpsError::Spawn)?;
        tracing::info!(pid, start_time = id.start_time, pipe_dir = %self.ctl.pipe_dir.display(), shm_dir = self.state.shm_dir.as_deref().unwrap_or("?"), "MPS control daemon started");
        self.remember_daemon(id);
        self.alloc.reset_applied();
        Ok(pid)
    }

    /// Checks that control daemon `pid` sees the configured `shm_dir` as its `/dev/shm` and
    /// records it in the state file (`shm_dir`: what MPS clients must be given as theirs), or
    /// clears it and says why not.
    fn note_daemon_shm(&mut self, pid: u32) -> Result<(), String> {
        let r = self.ctl.check_daemon_shm(pid);
        self.state.shm_dir = r.is_ok().then(|| {
            self.ctl.shm_dir.as_deref().unwrap_or(Path::new("/dev/shm")).display().to_string()
        });
        r
    }

    /// Says once, at adoption, when a control daemon this manager did not start logs elsewhere
    /// than `log_dir` (an earlier version's default was `gpu<N>/mps-log`, which offline
    /// containers can write): it keeps logging there until MPS is restarted.
    fn note_adopted_log_dir(&self, pid: u32) {
        let Some(theirs) = crate::control::daemon_env(pid, "CUDA_MPS_LOG_DIRECTORY") else {
            return;
        };
        let theirs = std::path::PathBuf::from(theirs);
        if theirs == self.cfg.log_dir {
            return;
        }
        let tenant_dir = self.cfg.ledger_path().parent().map(Path::to_path_buf).unwrap_or_default();
        let hazard = if theirs.starts_with(&tenant_dir) {
            "; it is inside the GPU's directory, which offline containers get read-write: a tenant could \
             redirect the root daemon's writes with a symbolic link: restart MPS once its clients allow \
             (`echo quit | nvidia-cuda-mps-control` with CUDA_MPS_PIPE_DIRECTORY=pipe_dir; this manager \
             starts the next one) and remove that directory"
        } else {
            ""
        };
        tracing::warn!(
            pid,
            daemon_log_dir = %theirs.display(),
            log_dir = %self.cfg.log_dir.display(),
            "the running MPS control daemon (started before this manager) logs elsewhere than log_dir until it is restarted{hazard}"
        );
    }

    /// Whether `pipe_dir/control` is still the socket the running daemon had when it was
    /// started or adopted; else [`ManagerState::control_socket_replaced`] says why (ERROR once).
    fn control_socket_sound(&mut self) -> bool {
        let Some(had) = self.control_socket else {
            self.control_socket = self.ctl.control_socket_id();
            return true;
        };
        let now = self.ctl.control_socket_id();
        if now == Some(had) {
            if self.state.control_socket_replaced.take().is_some() {
                tracing::info!(gpu = self.cfg.gpu_index, "the MPS control socket is the daemon's again");
            }
            return true;
        }
        if self.state.control_socket_replaced.is_some() {
            return false;
        }
        // A socket that answers the daemon's commands is the daemon's (were it to bind its
        // socket anew): taken as such, so that only a socket gone or silent is reported.
        if now.is_some() && self.ctl.server_list().is_ok() {
            tracing::info!(gpu = self.cfg.gpu_index, "the MPS control socket is a new one that answers: taken as the daemon's");
            self.control_socket = now;
            return true;
        }
        let sock = self.ctl.pipe_dir.join("control");
        let what = if now.is_none() { "is gone" } else { "is another file than the daemon's" };
        let line = format!(
            "{} {what}: new MPS clients of GPU {} (and this manager's commands) no longer reach control daemon {}; the pipe directory is in every offline container's mounts (read-write unless node-agent's inject.mps_pipe_read_only); MPS is not judged nor reset meanwhile (a reset would end the online service's connection too) and offline work is not admitted: put the daemon's socket back, or restart the daemon once its clients allow (stop it, remove the file; this manager starts the next one)",
            sock.display(),
            self.cfg.gpu_index,
            self.daemon.map_or(0, |d| d.pid)
        );
        tracing::error!(gpu = self.cfg.gpu_index, "{line}");
        self.state.control_socket_replaced = Some(line);
        false
    }

    /// The running control daemon of this pipe directory, as pid + start time: the one this
    /// manager recorded while that process lives (whatever the pid file says: the pipe
    /// directory is in offline containers' mounts, read-write unless node-agent's
    /// `inject.mps_pipe_read_only`, so a tenant can remove or rewrite the file, and a daemon
    /// judged dead by it would get a full MPS reset, which ends every client's context, the
    /// online service's too). Only when none is recorded, or the recorded one is gone, is the
    /// pid file looked at ([`MpsControl::daemon_identity`]): a daemon found there (an
    /// operator restarted MPS by hand, or one ran before this manager) is adopted. With none,
    /// the state's `daemon_pid` and `daemon_start_time` are cleared.
    fn live_daemon(&mut self) -> Option<DaemonId> {
        let recorded = self.daemon.filter(|d| {
            !node_ledger::procinfo::is_dead(d.pid, d.start_time) && crate::control::is_mps_process(d.pid)
        });
        if let Some(d) = recorded {
            self.note_pid_file(d);
            return Some(d);
        }
        let Some(id) = self.ctl.daemon_identity() else {
            // Unpublished at once, whatever becomes of the recovery (the rate limit may hold
            // the reset back for long): node-agent reads `daemon_pid` and admits no offline
            // container to a GPU without a daemon. Published again when one is started or
            // found ([`Manager::remember_daemon`]).
            if let Some(pid) = self.state.daemon_pid.take() {
                tracing::warn!(gpu = self.cfg.gpu_index, pid, "the MPS control daemon is gone: no longer published in the state file (node-agent admits no offline work to the GPU until one runs)");
            }
            self.state.daemon_start_time = None;
            return None;
        };
        if self.daemon != Some(id) {
            self.adopt_daemon(id);
        }
        Some(id)
    }

    /// Adopts control daemon `id` found through the pid file: a daemon this manager did not
    /// start (a restart adopts the running one, an operator may restart MPS by hand) may log
    /// elsewhere and have another /dev/shm than configured: said loudly, and left running
    /// (stopping it would cut off the online service).
    fn adopt_daemon(&mut self, id: DaemonId) {
        if let Some(gone) = self.daemon {
            tracing::warn!(
                gpu = self.cfg.gpu_index,
                pid = id.pid,
                start_time = id.start_time,
                recorded_pid = gone.pid,
                pipe_dir = %self.ctl.pipe_dir.display(),
                "the MPS control daemon this manager recorded is gone and the pid file names another one running for this pipe directory (MPS restarted by hand?): adopted"
            );
        }
        self.note_adopted_log_dir(id.pid);
        self.remember_daemon(id);
        if let Err(e) = self.note_daemon_shm(id.pid) {
            tracing::error!(pid = id.pid, error = %e, "the running MPS control daemon's /dev/shm is not shm_dir");
            self.state.last_error = Some(e);
        }
    }

    /// Warns once when the pid file no longer names the recorded live daemon `d` (removed or
    /// rewritten, by a tenant or by hand), and says when it does again. The file is not acted
    /// on: the daemon is judged, and signalled, as recorded.
    fn note_pid_file(&mut self, d: DaemonId) {
        let named = self.ctl.pid_file_pid();
        if named == Some(d.pid) {
            if std::mem::take(&mut self.pid_file_astray) {
                tracing::info!(gpu = self.cfg.gpu_index, pid = d.pid, "the MPS pid file names the control daemon again");
            }
            return;
        }
        if !self.pid_file_astray {
            self.pid_file_astray = true;
            tracing::warn!(
                gpu = self.cfg.gpu_index,
                pid = d.pid,
                start_time = d.start_time,
                pid_file = %self.ctl.pipe_dir.join(crate::control::PID_FILE).display(),
                names = ?named,
                "the MPS pid file no longer names the control daemon this manager runs (removed or rewritten; the pipe directory is in offline containers' mounts): the daemon is judged by its recorded pid and start time, the file is ignored"
            );
        }
    }

    fn remember_daemon(&mut self, id: DaemonId) {
        if self.daemon != Some(id) {
            // The socket as this daemon has it now (an adopted one's as found: it cannot be
            // told from a forged one that was already there).
            self.control_socket = self.ctl.control_socket_id();
            self.state.control_socket_replaced = None;
            self.state.daemon_not_answering = None;
        }
        self.daemon = Some(id);
        self.state.daemon_pid = Some(id.pid);
        self.state.daemon_start_time = Some(id.start_time);
    }

    /// The control daemon this manager recorded (started or detected), if any.
    pub fn recorded_daemon(&self) -> Option<DaemonId> {
        self.daemon
    }

    /// Takes over what the previous manager of this GPU left in its state file (`prev`, read
    /// at start): the clients it was terminating when it was killed (SIGKILL, OOM killer)
    /// mid-recovery. Such a client, dead, still registered in the ledger (the previous manager
    /// died before reclaiming it) and no longer listed on any server, was removed by that
    /// `terminate_client`: the recovery then finishes without the full reset a dead client
    /// missing from every server otherwise calls for.
    pub fn adopt_previous(&mut self, prev: &ManagerState) {
        if prev.gpu != self.state.gpu {
            tracing::error!(
                file = %self.cfg.state_file.display(),
                gpu = prev.gpu,
                manager_pid = prev.manager_pid,
                "the state file this manager resumes from is another GPU's manager's: nothing taken \
                 over (each GPU's manager needs its own state_file: put {{gpu}} in it)"
            );
            return;
        }
        if !prev.terminating.is_empty() {
            tracing::warn!(clients = ?prev.terminating, previous_manager = prev.manager_pid, "the previous manager was stopped while terminating these offline clients; finishing that recovery");
        }
        self.inherited = prev.terminating.clone();
        // Kept in this manager's state file too, until finished: killed again before it gets
        // to them, this manager passes them on.
        self.state.terminating = self.inherited.clone();
        // An XID the previous manager recovered from is not recovered from again.
        self.state.xid_handled.clone_from(&prev.xid_handled);
        // The compute mode found before the first manager changed it is the one to put back.
        if let Some(found) = prev.compute_mode_found.as_deref().and_then(compute_mode::from_name) {
            self.modes.adopt_found(found);
            self.note_modes();
        }
    }

    /// The previous manager's state file at `path`, for [`Manager::adopt_previous`]: `Ok(None)`
    /// when there is none (first start), `Err` naming the file when it cannot be read or parsed
    /// (damaged, or written by an incompatible version). Without it a recovery the previous
    /// manager left unfinished ends in a full MPS reset, so the caller says so loudly.
    pub fn read_previous(path: &std::path::Path) -> Result<Option<ManagerState>, String> {
        node_daemon::state_file::read_json_if_present(path)
    }

    /// Whether the previous manager was terminating `pid` (with this start time).
    fn inherited_termination(&self, pid: u32, start_time: u64) -> bool {
        self.inherited
            .iter()
            .any(|t| t.pid == pid && t.start_time == start_time)
    }

    /// The registered offline processes as their ledgers name them (pid and pid namespace of
    /// their own): the GPU's ledger and each pod's.
    fn registered(&self) -> Vec<node_ledger::ProcSnapshot> {
        let pods = self.pods.iter().flat_map(|p| p.ledger.procs());
        self.ledger
            .procs()
            .into_iter()
            .chain(pods)
            .filter(|p| p.start_time != 0)
            .collect()
    }

    /// Reads the pods directory (pod ledgers come and go with pods), at most every
    /// [`POD_SCAN_EVERY_MS`].
    fn scan_pods(&mut self, now_ms: u64) {
        if now_ms < self.next_pod_scan_ms {
            return;
        }
        self.next_pod_scan_ms = now_ms + POD_SCAN_EVERY_MS;
        for c in self.pods.scan() {
            if let node_ledger::pods::PodChange::Refused(pod, path, error) = c {
                tracing::warn!(%pod, file = %path.display(), %error, "pod ledger refused: its processes are not read from it");
            }
        }
    }

    /// Gives back the usage of dead processes in every ledger of the GPU.
    fn reclaim_all(&self) {
        let _ = self.ledger.reclaim_dead();
        for p in self.pods.iter() {
            let _ = p.ledger.reclaim_dead();
        }
    }

    /// The registered offline processes in this manager's terms: one whose pid here is found
    /// ([`node_daemon::procns::HostPids`]: alive when first seen, and holding the ledger open)
    /// carries that pid and this namespace, so that it is matched to the pids MPS lists and
    /// signalled; one not found keeps its own pid and namespace, or [`NOT_FOUND_NS`] for a slot
    /// naming this namespace (a slot any ledger client may have written, naming an online
    /// client), and is left to the request: never matched to an MPS client, never signalled.
    /// Eviction requests are addressed to the slot's own pid namespace, pid and start time: see
    /// [`Manager::request_evict_id`].
    fn offline(&mut self) -> Vec<node_ledger::ProcSnapshot> {
        self.scan_pods(mono_ms());
        let raw = self.registered();
        self.in_my_terms(&raw)
    }

    /// [`Manager::offline`] of registrations already read (`raw`, [`Manager::registered`]):
    /// the same processes in the same order.
    ///
    /// A registration whose process is dead is taken only if this manager saw its owner, alive,
    /// holding the slot's lock ([`Manager::owner_seen`]), or the previous manager was
    /// terminating it (`terminating`). A slot naming a pid that no process has (now, or ever)
    /// proves nothing: any ledger client can write one, with a new start time at every check,
    /// and each was a dead client whose recovery waited [`LISTING_GRACE_MS`] for it. A client
    /// that died before this manager saw it is still caught when its server lists it
    /// ([`crate::detect::Observation::dead_listed`]).
    fn in_my_terms(&mut self, raw: &[node_ledger::ProcSnapshot]) -> Vec<node_ledger::ProcSnapshot> {
        self.host_pids_keep(raw);
        let current = |r: &(u64, u32, u64)| raw.iter().any(|p| (p.pid_ns, p.pid, p.start_time) == *r);
        self.owners_seen.retain(current);
        let here = raw
            .iter()
            .map(|p| {
                let mut p = p.clone();
                match self.host_pids.of(&p) {
                    Some(h) if self.owner_seen(&p, h) => (p.pid, p.pid_ns) = (h, self.own_ns),
                    _ if p.pid_ns == self.own_ns => p.pid_ns = NOT_FOUND_NS,
                    _ => {}
                }
                p
            })
            .collect();
        self.state.offline_seen = self.owners_seen.len();
        here
    }

    /// Whether registration `p` (as the ledger names it), whose process is `host` here, is one
    /// whose owner this manager saw alive holding the slot's lock (checked once, then
    /// remembered while it stays registered), or one the previous manager was terminating.
    fn owner_seen(&mut self, p: &node_ledger::ProcSnapshot, host: u32) -> bool {
        let r = (p.pid_ns, p.pid, p.start_time);
        if self.owners_seen.contains(&r) {
            return true;
        }
        if node_ledger::procinfo::is_alive(host, p.start_time)
            && node_daemon::procns::holds_lock(host, &p.ledger_file, p.owner_lock)
        {
            self.owners_seen.insert(r);
            return true;
        }
        self.inherited_termination(host, p.start_time)
    }

    /// Keeps what `host_pids` found of the registrations `raw` alone.
    fn host_pids_keep(&mut self, raw: &[node_ledger::ProcSnapshot]) {
        let keys: std::collections::HashSet<_> = raw.iter().map(node_daemon::procns::HostPids::key_of).collect();
        self.host_pids.retain(|k| keys.contains(k));
    }

    /// Asks the offline processes the servers' log reports torn down by a fatal GPU error
    /// ([`crate::serverlog`]) to leave: until every torn-down client has exited the server
    /// takes no new client, the online service's restarted ones included. `raw` and `offline`:
    /// the registrations as read and in this manager's terms (same order). A reported pid is
    /// kept, by its start time then, and tried at each look until its request is written, it
    /// exits, or [`TORN_DOWN_LOOKUP_MS`] pass without it being found an offline process here
    /// (the online service's, another user's: left to its owner, said once if it still runs).
    fn evict_torn_down(&mut self, raw: &[node_ledger::ProcSnapshot], offline: &[node_ledger::ProcSnapshot]) {
        let now = mono_ms();
        for pid in self.server_log.torn_down() {
            // By its start time now (0 while `/proc` cannot be read: read again below); a pid
            // reported again with another start time is another process.
            let st = node_ledger::procinfo::start_time(pid).unwrap_or(0);
            if st != 0 || !node_ledger::procinfo::is_gone(pid) {
                self.torn_pending.insert(pid, (st, now));
            }
        }
        let pending: Vec<(u32, (u64, u64))> = self.torn_pending.iter().map(|(p, v)| (*p, *v)).collect();
        for (pid, (mut start_time, since)) in pending {
            let late = now.saturating_sub(since) >= TORN_DOWN_LOOKUP_MS;
            if start_time == 0 {
                match node_ledger::procinfo::start_time(pid) {
                    Some(st) => {
                        start_time = st;
                        self.torn_pending.insert(pid, (st, since));
                    }
                    None => {
                        if late || node_ledger::procinfo::is_gone(pid) {
                            self.torn_pending.remove(&pid);
                        }
                        continue;
                    }
                }
            }
            match node_ledger::procinfo::liveness(pid, start_time) {
                node_ledger::procinfo::Liveness::Alive => {}
                node_ledger::procinfo::Liveness::Gone => {
                    self.torn_pending.remove(&pid);
                    continue;
                }
                node_ledger::procinfo::Liveness::Unknown => {
                    if late {
                        self.torn_pending.remove(&pid);
                    }
                    continue;
                }
            }
            let found = offline
                .iter()
                .zip(raw)
                .find(|(p, _)| p.pid_ns == self.own_ns && p.pid == pid && p.start_time == start_time);
            match found {
                Some((_, r)) => match self.request_evict_id(node_ledger::ProcId::of(r), Some(pid)) {
                    Ok(()) => {
                        self.torn_pending.remove(&pid);
                        tracing::warn!(
                            gpu = self.cfg.gpu_index,
                            pid,
                            "an offline client was torn down by a fatal GPU error: asked to leave, since the MPS server takes \
                             no new client (the online service's restarts included) until it exits"
                        );
                    }
                    // Tried again at the next look (a status file being reopened, a full table).
                    Err(e) if !late => {
                        tracing::debug!(gpu = self.cfg.gpu_index, pid, error = %e, "torn-down offline client: request not written yet");
                    }
                    Err(e) => {
                        self.torn_pending.remove(&pid);
                        tracing::error!(
                            gpu = self.cfg.gpu_index,
                            pid,
                            error = %e,
                            "an offline client torn down by a fatal GPU error could not be asked to leave: the MPS server \
                             takes no new client until it exits"
                        );
                    }
                },
                None if !late => {}
                None => {
                    self.torn_pending.remove(&pid);
                    tracing::warn!(
                        gpu = self.cfg.gpu_index,
                        pid,
                        "the MPS server reports a client torn down by a fatal GPU error that is no offline process of this \
                         GPU: the server takes no new client until it exits (left to its owner)"
                    );
                }
            }
        }
    }

    /// Asks the process `id` names (as the ledger names it, [`Manager::registered`]) to leave:
    /// a request addressed to its pid namespace, pid and start time in this manager's table of
    /// the status file, which the process's shim acts on whatever its pid namespace, and which
    /// no tenant can write (a slot's word could be written by any ledger client). `host`: its
    /// pid here, when found holding its slot's lock; the request names the pod its cgroup path
    /// names, which node-agent evicts (never the group its slot claims, the process's own word).
    /// One not found takes no entry of the table's reserve
    /// ([`node_ledger::status::EVICT_RESERVED_FOR_FOUND`]): slots nobody holds, which any ledger
    /// client can write by the hundred, filled this manager's table, and the genuine processes
    /// of a recovery got no request. `Err`: why none was written (the caller says it).
    fn request_evict_id(&mut self, id: node_ledger::ProcId, host: Option<u32>) -> Result<(), String> {
        // The pod its cgroup names, else the pod whose ledger it is registered in (mounted into
        // that pod alone). Requests are rare: the pod ledgers' slots are read for each.
        let pod = host.and_then(|h| node_daemon::offline_pods::pod_of_live(h, id.start_time)).or_else(|| {
            self.pods.iter().find(|pl| pl.ledger.procs().iter().any(|p| node_ledger::ProcId::of(p) == id)).map(|pl| pl.pod)
        });
        let w = self.status.get(mono_ms()).ok_or("the status file is not open (its error is logged)")?;
        w.request_evict_for(node_ledger::Requester::Manager, id, pod, libc::SIGTERM as u32, host.is_some())
            .map_err(|e| e.to_string())
    }

    /// Recomputes the offline SM budget, applies it to offline MPS clients and publishes it in
    /// the status file.
    pub fn budget_tick(&mut self) {
        // Checked (reopened in place when damaged or gone) once a second.
        self.status.get(mono_ms());
        self.scan_pods(mono_ms());
        let snap = self.status.current().and_then(|s| s.read_monitor());
        let fresh = snap.is_some_and(|s| s.is_fresh(node_ledger::clock::now_ns(), 2_000_000_000));
        let health = snap.and_then(|s| s.health());
        let total = snap.map_or(0.0, |s| s.sample.sm_active_permille as f64 / 10.0);
        let raw = self.registered();
        // This manager's requests of processes no longer registered are withdrawn (the table
        // has one entry per registrable process).
        if let Some(w) = self.status.current() {
            w.retain_evictions(node_ledger::Requester::Manager, |id| raw.iter().any(|p| node_ledger::ProcId::of(p) == id));
        }
        self.host_pids_keep(&raw);
        // Offline work is what runs: registrations whose owner was found holding its slot's
        // lock (`HostPids::holder`). Any ledger client can write any slot of its ledgers: a
        // slot no process holds the lock of, claiming 100 %, took that much more off the
        // reading as offline, so the online estimate fell and the budget rose.
        let running: Vec<_> = raw.iter().filter(|p| self.host_pids.holder(p).is_some()).cloned().collect();
        let current = self.alloc.applied().unwrap_or(self.cfg.budget.max_pct);
        // The offline side holds at most its jobs' MPS percentages (each fixed at its start),
        // at most the budget; the budget alone when a job's percentage is unknown.
        let held = node_ledger::jobs::offline_cap_pct(Some(current), &node_ledger::jobs::jobs_of(&running))
            .unwrap_or(current);
        let online = Allocator::online_estimate(total, !running.is_empty(), held);
        let safe = fresh && matches!(health, Some(HealthState::Healthy | HealthState::Unhealthy));
        self.state.gpu_health = health.map(|h| format!("{h:?}").to_lowercase());
        self.state.sm_activity_pct = total;
        if online.is_finite() {
            // NaN: no estimate from this reading (see Allocator::online_estimate).
            self.state.online_estimate_pct = online;
        }
        let changed = self.alloc.update(&self.cfg.budget, online, safe);
        let hold = self.cfg.budget.saturated_hold_readings;
        if hold > 0 && self.alloc.saturated_run() == hold.saturating_add(1) {
            tracing::warn!(
                gpu = self.cfg.gpu_index,
                readings = hold,
                sm_activity_pct = total,
                "SM activity has read saturated beside offline work for budget.saturated_hold_readings readings in a row (no estimate of the online share): the offline budget decays toward min_pct until a reading says more"
            );
        }
        let Some(pct) = self.alloc.applied() else {
            return;
        };
        self.state.offline_budget_pct = Some(pct);
        if let Some(s) = self.status.current() {
            s.publish_sm_budget((pct * 10.0).round().clamp(0.0, 1000.0) as u32);
        }
        if let Some(p) = changed {
            log_budget(p, online, total, safe);
        }
        // Real MPS fixes a client's limit when it connects, and a server's (or the default)
        // percentage would also cap every client that connects to it later: the online
        // workload's clients share a server with offline ones when they run as the same user,
        // and the default applies to the online user's own server. So the manager sets no MPS
        // percentage at all: a new offline process takes the budget as its own
        // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the shim sets it at load from this ledger
        // block), and running ones follow it through the shim's throttle.
    }

    /// Looks at MPS and the ledger; returns the faults seen.
    pub fn check(&mut self, now_ms: u64) -> Vec<Fault> {
        self.keep_compute_mode();
        let mut o = Observation {
            daemon_alive: self.live_daemon().is_some(),
            ..Default::default()
        };
        // The daemon runs (its pid and start time) but its socket was moved away or replaced
        // (the pipe directory is in offline containers' mounts): nothing can be asked of it,
        // and nothing of MPS is judged. Taken for a dead daemon, as before, it got a full MPS
        // reset, which ends every client's connection, the online service's too: a tenant's
        // rename would have cut the online service off.
        if o.daemon_alive && !self.control_socket_sound() {
            self.kill_after_grace();
            return Vec::new();
        }
        // The servers of the last look still running, before the listing replaces them.
        o.servers_alive = self
            .servers_seen
            .iter()
            .filter(|d| node_ledger::procinfo::is_alive(d.pid, d.start_time))
            .map(|d| d.pid)
            .collect();
        if o.daemon_alive {
            match self.ctl.server_list() {
                Ok(s) => {
                    self.servers_seen = s
                        .iter()
                        .filter_map(|&pid| {
                            let start_time = node_ledger::procinfo::start_time(pid)?;
                            Some(DaemonId { pid, start_time })
                        })
                        .collect();
                    for &srv in &s {
                        if let Ok(c) = self.ctl.client_list(srv) {
                            o.clients.insert(srv, c);
                        }
                    }
                    o.servers = Some(s);
                    if self.state.daemon_not_answering.take().is_some() {
                        tracing::info!(gpu = self.cfg.gpu_index, "the MPS control daemon answers again");
                    }
                }
                Err(e @ MpsError::Timeout { .. }) => {
                    o.servers = None;
                    if self.state.daemon_not_answering.is_none() {
                        let since = unix_ms();
                        self.state.daemon_not_answering = Some(format!(
                            "MPS control daemon {}: {e} (since unix ms {since}): new MPS clients would hang too",
                            self.daemon.map_or(0, |d| d.pid)
                        ));
                    }
                }
                Err(MpsError::NoDaemon) => o.daemon_alive = false,
                Err(e) => {
                    self.state.last_error = Some(e.to_string());
                    o.servers = Some(Vec::new());
                }
            }
        }
        // One read of the registrations for every judgement of this look.
        let raw = self.registered();
        let offline = self.in_my_terms(&raw);
        let dead: Vec<(u32, u64)> = offline
            .iter()
            .filter(|p| {
                p.pid_ns == self.own_ns && node_ledger::procinfo::is_dead(p.pid, p.start_time)
            })
            .map(|p| (p.pid, p.start_time))
            .collect();
        self.dead_reported.retain(|d| dead.contains(d));
        o.dead_offline = dead.iter().filter(|d| self.dead_reported.insert(**d)).map(|d| d.0).collect();
        self.evict_torn_down(&raw, &offline);
        // A client killed holding its context stays on its server's list, hanging the server's
        // other clients, until it is terminated, whether or not its ledger registration is
        // still there (the monitor reclaims a dead process's registration within a second).
        o.dead_listed = o
            .clients
            .values()
            .flatten()
            .copied()
            .filter(|&pid| node_ledger::procinfo::is_gone(pid))
            .collect();
        o.offline_registered = offline.len();
        // A slot's sync and launch counts are its writer's word (pod ledgers are
        // tenant-writable): waiting counts only for a process found here (its owner seen holding
        // the slot's lock) and listed by a server as its client, and each one's progress is its
        // own counts alone. Before, a slot of another namespace (or naming a process no server
        // lists) with one sync begun made a quiet GPU "stuck", and the recovery, with nothing it
        // could terminate, ended every MPS server, the online service's context with them; and
        // the launches of every slot, summed, were the GPU's progress, so one slot whose count
        // rose at every check (a tenant's, or one nobody holds) hid every hung client.
        let listed: BTreeSet<u32> = o.clients.values().flatten().copied().collect();
        o.offline_waiting = offline
            .iter()
            .filter(|p| p.syncs.0 > p.syncs.1 && p.pid_ns == self.own_ns && listed.contains(&p.pid))
            .map(|p| crate::detect::Waiting { pid: p.pid, start_time: p.start_time, ended: p.syncs.1, launches: p.launches })
            .collect();
        o.sm_activity_pct = self
            .status
            .current()
            .and_then(|s| s.read_monitor())
            .map_or(0.0, |s| s.sample.sm_active_permille as f64 / 10.0);
        // One read of the monitor's state file: its XID, and the evictions it will SIGKILL.
        let mon = self.read_monitor_state();
        // An XID episode recovered from already (by this run or, from the state file, an
        // earlier one) is no fault again.
        let xid = mon.as_ref().and_then(HandledXid::of);
        o.xid = xid.as_ref().filter(|&x| self.state.xid_handled.as_ref() != Some(x)).map(|x| x.code);
        self.state.servers = o.servers.clone().unwrap_or_default();
        self.state.clients = o.clients.values().map(|c| c.len()).sum();
        self.kill_after_grace();
        self.check_users(&o.clients, &offline);
        self.terminate_before_kill(&o.clients, mon.as_ref().map_or(&[][..], |m| &m.evictions_pending), &raw, &offline);
        self.daemon_seen_alive = o.daemon_alive;
        let mut faults = self.detector.observe(&self.cfg.detect, now_ms, &o);
        if faults.iter().any(|f| matches!(f, Fault::Xid { .. })) {
            self.xid_pending = xid;
            self.xid_held_said = false;
        } else if self.xid_pending.is_some() {
            // Found, and no full reset since: its recovery is owed. The detector reports an
            // episode once, so it is asked for here once the rate limit allows it. Before, a
            // recovery the limit held back was never tried again in this run: MPS stayed as
            // the XID left it until the manager restarted. `o.xid` is an episode not handled.
            match (o.xid, xid) {
                (Some(code), Some(x)) => {
                    if self.xid_pending.as_ref() != Some(&x) {
                        self.xid_held_said = false; // another episode: its hold is said again
                    }
                    self.xid_pending = Some(x);
                    if self.limiter.would_allow(&self.cfg.recovery, now_ms) {
                        tracing::warn!(gpu = self.cfg.gpu_index, code, "critical XID recovery held back by the rate limit: the limit allows it now");
                        faults.push(Fault::Xid { code });
                    }
                }
                _ => {
                    tracing::info!(gpu = self.cfg.gpu_index, "the XID whose recovery was held back is no longer reported by the monitor: nothing owed");
                    self.xid_pending = None;
                    self.xid_held_said = false;
                }
            }
        }
        // Every server's clients seen, and nothing wrong with MPS: a client missing from the
        // lists is not one a fault took off them.
        let complete = o.daemon_alive
            && o.servers.as_ref().is_some_and(|s| s.iter().all(|srv| o.clients.contains_key(srv)));
        if complete && faults.is_empty() && o.dead_listed.is_empty() {
            self.check_holders(&o.clients, &offline);
            self.check_outside(now_ms, &o.clients, &raw, &offline);
        } else {
            self.outside.interrupted();
        }
        faults
    }

    /// The monitor's state file, read once per look. When it cannot be read (missing: no
    /// monitor on this GPU, or its `state_file` is not this config's `monitor_state_file`;
    /// damaged; written by an incompatible version) this manager sees neither an XID that
    /// disabled the GPU nor the evictions the monitor is about to SIGKILL, so it cannot end
    /// their MPS work first (`terminate_before_kill_ms`): said at WARN once per distinct
    /// error, kept in the state file (`monitor_state_error`), and its end said at INFO.
    fn read_monitor_state(&mut self) -> Option<node_daemon::monitor_state::MonitorState> {
        let path = &self.cfg.monitor_state_file;
        let (mon, err) = match node_daemon::monitor_state::read_for(path, self.cfg.gpu_index) {
            Ok(m) => (Some(m), None),
            Err(e) => (None, Some(e)),
        };
        if err != self.state.monitor_state_error {
            match &err {
                Some(e) => tracing::warn!(
                    file = %path.display(),
                    error = %e,
                    "cannot read the monitor's state file: no XID and no pending eviction seen \
                     (the monitor's SIGKILLs are not preceded by terminate_client); check that \
                     sysmonitor runs on this GPU and that its state_file is this monitor_state_file"
                ),
                None => tracing::info!(file = %path.display(), "the monitor's state file is readable again"),
            }
            self.state.monitor_state_error = err;
        }
        mon
    }

    /// Offline processes the manager evicted outside a recovery that still run once
    /// `evict_grace_ms` is over get SIGKILL (each checked by pid + start time).
    fn kill_after_grace(&mut self) {
        let now = mono_ms();
        self.adopt_own_requests(now);
        let grace = self.cfg.evict_grace_ms;
        self.evicted.retain(|&(pid, st), at| {
            if node_ledger::procinfo::is_dead(pid, st) {
                return false;
            }
            if now.saturating_sub(*at) >= grace {
                tracing::warn!(pid, grace_ms = grace, "offline process evicted by the manager ignored SIGTERM: SIGKILL");
                let _ = PidfdSignaller.signal(pid, st, libc::SIGKILL);
            }
            true
        });
    }

    /// Takes on the escalation of this manager's requests in the status file that it is not
    /// escalating (an earlier manager run made them and was stopped within their grace): the
    /// grace starts again from `now`, so that a process ignoring SIGTERM is SIGKILLed whatever
    /// restarts came in between. Only a process found here ([`Manager::in_my_terms`]), by pid +
    /// start time; the registrations are read only while a request of this manager is in force.
    fn adopt_own_requests(&mut self, now: u64) {
        let mine: Vec<node_ledger::ProcId> = self.status.current().map_or_else(Vec::new, |s| {
            s.evict_requests().into_iter().filter(|r| r.by == node_ledger::Requester::Manager).map(|r| r.id).collect()
        });
        if mine.is_empty() {
            return;
        }
        let raw = self.registered();
        let here = self.in_my_terms(&raw);
        for (r, p) in raw.iter().zip(&here) {
            if p.pid_ns != self.own_ns || !mine.contains(&node_ledger::ProcId::of(r)) {
                continue;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = self.evicted.entry((p.pid, p.start_time)) {
                tracing::warn!(
                    pid = p.pid,
                    grace_ms = self.cfg.evict_grace_ms,
                    "offline process asked to leave by an earlier run of this manager: SIGKILL if it still runs after the grace"
                );
                e.insert(now);
            }
        }
    }

    /// Finds offline processes doing GPU work outside MPS ([`crate::outside`]) and evicts them
    /// for a restart under MPS, or reports them (`outside_mps`). Only processes found here
    /// holding their slot's lock that the manager has not evicted or terminated itself are
    /// judged; a listed client is matched to its ledger registration by pid namespace and pid
    /// there, so containers are judged too.
    /// `raw` and `here`: the registrations as the ledger names them and in this manager's
    /// terms ([`Manager::in_my_terms`]), in one order.
    fn check_outside(
        &mut self,
        now_ms: u64,
        clients: &BTreeMap<u32, Vec<u32>>,
        raw: &[node_ledger::ProcSnapshot],
        here: &[node_ledger::ProcSnapshot],
    ) {
        let mut listed = Listed::default();
        for &pid in clients.values().flatten() {
            match node_daemon::procns::ns_pid(pid) {
                Some(id) => {
                    listed.known.insert(id);
                }
                None if node_ledger::procinfo::is_gone(pid) => {}
                None => {
                    // Unreadable (another user's, without CAP_SYS_PTRACE): its pid is the one
                    // it has in this namespace at least.
                    listed.unknown = true;
                    listed.known.insert((self.own_ns, pid));
                }
            }
        }
        // Judged as the ledger names them (listed clients are named so above); what the manager
        // did to them is recorded by their pid here.
        let handled = |r: &node_ledger::ProcSnapshot, pid: u32| {
            self.state.restart_requested.iter().any(|q| q.pid == pid && q.start_time == r.start_time)
                || self.evicted.contains_key(&(pid, r.start_time))
                || self.terminated_before_kill.contains(&(r.pid_ns, r.pid, r.start_time))
                || self.inherited_termination(pid, r.start_time)
        };
        // Only processes found here holding their slot's lock: a slot nobody holds says nothing
        // of a process (any ledger client writes one, its launches too), and each it named
        // "outside MPS" took an entry of the eviction table.
        let candidates: Vec<Candidate> = raw
            .iter()
            .zip(here)
            .filter(|(r, p)| p.pid_ns == self.own_ns && !handled(r, p.pid))
            .map(|(r, _)| Candidate { pid_ns: r.pid_ns, pid: r.pid, start_time: r.start_time, launches: r.launches })
            .collect();
        // Keyed by the process's identity as its ledger names it (what a candidate carries):
        // slot numbers repeat across the pod ledgers.
        let host_of: BTreeMap<node_ledger::ProcId, u32> = raw
            .iter()
            .zip(here)
            .filter(|(_, p)| p.pid_ns == self.own_ns)
            .map(|(r, p)| (node_ledger::ProcId::of(r), p.pid))
            .collect();
        let found = self.outside.look(now_ms, self.cfg.outside_mps_after_ms, self.own_ns, &listed, &candidates);
        for c in found {
            self.state.outside_mps += 1;
            let evict = self.cfg.outside_mps == OutsideAction::Evict;
            let host = host_of.get(&node_ledger::ProcId { pid_ns: c.pid_ns, pid: c.pid, start_time: c.start_time }).copied();
            let line = format!(
                "offline process {} (pid namespace {}; {}) launches kernels on GPU {} but no MPS server lists it: it initialised CUDA before the MPS control daemon ran, or looked for it in another CUDA_MPS_PIPE_DIRECTORY than {} (CUDA looks once); outside MPS it time-slices the GPU with the online service and the offline SM budget does not reach it; {}",
                c.pid,
                c.pid_ns,
                host.map_or("not found from here".to_string(), |h| format!("pid {h} here")),
                self.cfg.gpu_index,
                self.cfg.pipe_dir.display(),
                if evict {
                    "evicted for a restart under MPS (start offline containers after mps-manager; outside_mps: report only reports)"
                } else {
                    "left running (outside_mps: report)"
                }
            );
            tracing::error!(pid = c.pid, pid_ns = c.pid_ns, host_pid = host, gpu = self.cfg.gpu_index, "{line}");
            self.state.last_error = Some(line);
            if !evict {
                continue;
            }
            // Addressed by pid namespace, pid and start time; the process's own shim acts on the
            // request, whatever its pid namespace.
            if let Err(e) = self.request_evict_id(node_ledger::ProcId { pid_ns: c.pid_ns, pid: c.pid, start_time: c.start_time }, host) {
                tracing::warn!(pid = c.pid, pid_ns = c.pid_ns, error = %e, "no eviction request written: the process is only signalled");
            }
            if let Some(h) = host {
                if PidfdSignaller.signal(h, c.start_time, libc::SIGTERM).unwrap_or(false) {
                    self.evicted.insert((h, c.start_time), mono_ms());
                }
            }
            self.state.restart_requested.push(RestartRequest {
                pid: host.unwrap_or(c.pid),
                start_time: c.start_time,
                reason: "ran outside MPS".into(),
                at_unix_ms: unix_ms(),
            });
        }
        if self.state.restart_requested.len() > 200 {
            let n = self.state.restart_requested.len() - 200;
            self.state.restart_requested.drain(..n);
        }
    }

    /// An offline process the monitor is evicting and will SIGKILL within
    /// `terminate_before_kill_ms` (it did not exit on SIGTERM) has its MPS work ended first
    /// with `terminate_client`, so that the SIGKILL finds no kernel of it in flight. On an H200
    /// (driver 580) a SIGKILL with kernels in flight was followed, in 12 of 20 kills, by a fatal
    /// GPU error the MPS server blamed on the online neighbour, which it tore down
    /// (CUDA_ERROR_ILLEGAL_ADDRESS); with `terminate_client` 0.3 s before the SIGKILL, in none of 12.
    /// Only a process registered in the ledger with the same pid namespace, pid and start time
    /// whose pid here is known (its own, or found by its pid namespace), alive, and listed by a
    /// server under that pid: the pid is never mistaken for another process, not even another
    /// container's with the same pid and start time.
    fn terminate_before_kill(
        &mut self,
        clients: &BTreeMap<u32, Vec<u32>>,
        evictions: &[node_daemon::monitor_state::PendingEviction],
        raw: &[node_ledger::ProcSnapshot],
        offline: &[node_ledger::ProcSnapshot],
    ) {
        let lead = self.cfg.terminate_before_kill_ms;
        if lead == 0 {
            return;
        }
        let pending: Vec<(&node_daemon::monitor_state::PendingEviction, u64)> =
            evictions.iter().filter_map(|e| Some((e, e.kill_at_mono_ms?))).collect();
        // The registration an eviction names: its pid namespace, pid and start time, among the
        // registrations whose process was found here (its slot's owner holding the slot's lock:
        // a copy of its identity in another slot, which any ledger client can write, is not, and
        // must not make the genuine one ambiguous, leaving it to a SIGKILL with kernels in
        // flight). An entry without the namespace (a monitor before it published it) names one
        // only where no other such registration has its pid and start time: two containers'
        // processes can (pid 1 each, started in the same clock tick), and the other's MPS work
        // must not be ended.
        let own_ns = self.own_ns;
        let named = |e: &node_daemon::monitor_state::PendingEviction| {
            let mut m = raw.iter().zip(offline).filter(|(r, o)| {
                o.pid_ns == own_ns && r.pid == e.pid && r.start_time == e.start_time && e.pid_ns.is_none_or(|ns| ns == r.pid_ns)
            });
            match (m.next(), m.next()) {
                (Some(one), None) => Some(one),
                _ => None,
            }
        };
        let live: Vec<(u64, u32, u64)> =
            pending.iter().filter_map(|(e, _)| named(e)).map(|(r, _)| (r.pid_ns, r.pid, r.start_time)).collect();
        self.terminated_before_kill.retain(|k| live.contains(k));
        let now = mono_ms();
        // The monitor names processes as the ledger does (`raw`); MPS and signals by their pid
        // here (`offline`, in the same order).
        for (e, kill_at) in pending {
            let Some((r, p)) = named(e) else { continue };
            let key = (r.pid_ns, r.pid, r.start_time);
            if now.saturating_add(lead) < kill_at || self.terminated_before_kill.contains(&key) {
                continue;
            }
            let st = r.start_time;
            let here = (p.pid_ns == self.own_ns).then_some(p.pid);
            let Some(pid) = here.filter(|&h| node_ledger::procinfo::is_alive(h, st)) else {
                continue;
            };
            let Some((&srv, _)) = clients.iter().find(|(_, c)| c.contains(&pid)) else {
                continue;
            };
            self.terminated_before_kill.insert(key);
            match self.ctl.command(&format!("terminate_client {srv} {pid}")) {
                Ok(_) => {
                    self.state.terminated_before_kill += 1;
                    tracing::warn!(
                        pid,
                        server = srv,
                        kill_in_ms = kill_at.saturating_sub(now),
                        "offline client still running as the monitor's SIGKILL nears: its MPS work ended with terminate_client first (a SIGKILL with kernels in flight can make MPS tear down a neighbour)"
                    );
                }
                Err(e) => tracing::warn!(pid, server = srv, error = %e, "terminate_client before the monitor's SIGKILL failed"),
            }
        }
    }

    /// One user per MPS GPU: finds the running server's user; with `client_uid` set, a server
    /// of another user (or a registered offline process of another user, which MPS queues and
    /// whose turn would come as soon as this user's clients are done) is reported loudly and
    /// its offline processes are terminated and evicted, restart requested.
    fn check_users(&mut self, clients: &BTreeMap<u32, Vec<u32>>, offline: &[node_ledger::ProcSnapshot]) {
        let servers: Vec<(u32, u32)> = self
            .servers_seen
            .iter()
            // Still the process that was listed (a recycled pid's user means nothing).
            .filter(|s| node_ledger::procinfo::is_alive(s.pid, s.start_time))
            .filter_map(|s| Some((s.pid, proc_euid(s.pid)?)))
            .collect();
        let now_uid = servers.first().map(|s| s.1);
        let Some(want) = self.cfg.client_uid else {
            if let (Some(was), Some(now)) = (self.state.mps_server_uid, now_uid) {
                if was != now {
                    tracing::warn!(gpu = self.cfg.gpu_index, was, now, "the MPS server changed users: MPS serves one user at a time, so clients of uid {now} waited until those of uid {was} were done; set client_uid to enforce one user");
                }
            }
            self.state.mps_server_uid = now_uid.or(self.state.mps_server_uid);
            return;
        };
        self.state.mps_server_uid = now_uid.or(self.state.mps_server_uid);
        let mine: Vec<&node_ledger::ProcSnapshot> = offline
            .iter()
            .filter(|p| p.pid_ns == self.own_ns && node_ledger::procinfo::is_alive(p.pid, p.start_time))
            .collect();
        let mut culprits: Vec<u32> = Vec::new();
        let mut lines: Vec<String> = Vec::new();
        for &(srv, uid) in servers.iter().filter(|s| s.1 != want) {
            let cl = clients.get(&srv).cloned().unwrap_or_default();
            let off: Vec<u32> = cl.iter().copied().filter(|c| mine.iter().any(|p| p.pid == *c)).collect();
            if self.breach_reported.insert(srv) {
                self.state.user_breaches += 1;
                lines.push(format!(
                    "MPS server {srv} runs as uid {uid}, but every MPS client of GPU {} must run as uid {want} (client_uid): MPS serves one user at a time, so clients of uid {want} (the online service) are queued until its clients {cl:?} are done; offline ones among them {off:?} are terminated and evicted; run offline containers as uid {want} (securityContext.runAsUser)",
                    self.cfg.gpu_index
                ));
            }
            culprits.extend(off);
        }
        // Evicted earlier ([`Manager::kill_after_grace`]): never evicted twice.
        let now = mono_ms();
        culprits.retain(|c| !mine.iter().any(|p| p.pid == *c && self.evicted.contains_key(&(p.pid, p.start_time))));
        for p in &mine {
            if self.evicted.contains_key(&(p.pid, p.start_time)) {
                continue;
            }
            let Some(uid) = proc_euid(p.pid) else { continue };
            if uid != want && !culprits.contains(&p.pid) {
                lines.push(format!(
                    "offline process {} runs as uid {uid}, but every MPS client of GPU {} must run as uid {want} (client_uid): MPS would queue it and then stop the server of uid {want} once its clients are done; terminated and evicted; run offline containers as uid {want} (securityContext.runAsUser)",
                    p.pid, self.cfg.gpu_index
                ));
                culprits.push(p.pid);
            }
        }
        for l in &lines {
            tracing::error!("{l}");
        }
        if let Some(l) = lines.pop() {
            self.state.last_error = Some(l);
        }
        for p in mine.iter().filter(|p| culprits.contains(&p.pid)) {
            self.evicted.insert((p.pid, p.start_time), now);
        }
        if !culprits.is_empty() {
            match self.terminate_offline(&culprits, false, "client of another user than client_uid") {
                Ok(outcome) => tracing::warn!(%outcome, "clients of another user removed from MPS"),
                Err(e) => tracing::warn!(error = %e, pids = ?culprits, "clients of another user evicted (not listed on an MPS server)"),
            }
        }
    }

    /// Counts every fault (the `faults` counters), logs each fault once per episode (while it
    /// keeps being seen it is counted, not logged again) and recovers from each.
    ///
    /// Most sweeping first ([`recovery_order`]): a dead or hung daemon or an XID (a new MPS),
    /// then crashed servers (one recovery for all of them), then dead clients (one targeted
    /// recovery terminating all of them), then stuck clients. A recovery that ended every
    /// client's connection (all servers or MPS restarted), or that the rate limit held back, is
    /// the last of the check; after a targeted one, or crashed servers ended alone, the next
    /// fault gets its recovery too, but a
    /// stuck fault only when nothing else was recovered from (it may have been the other
    /// fault's doing; still stuck, it is reported again). Before, the first fault alone was
    /// recovered from and the others were lost: dead registrations came first, and one a
    /// tenant rewrote with a new start time at every check kept a dead client its server
    /// listed (the one hanging the online client) and a crashed server from ever being
    /// recovered.
    pub fn handle_faults(&mut self, now_ms: u64, faults: Vec<Fault>) {
        let keys: HashSet<String> = faults.iter().map(|f| format!("{f:?}")).collect();
        for f in &faults {
            *self.state.faults.entry(f.kind().to_string()).or_default() += 1;
            if !self.logged_faults.contains(&format!("{f:?}")) {
                tracing::error!(fault = ?f, gpu = self.cfg.gpu_index, "MPS fault detected");
            }
        }
        self.logged_faults = keys;
        if faults.is_empty() {
            self.limited_logged = false;
            self.stuck_unlisted_logged = false;
        }
        let mut faults = faults;
        faults.sort_by_key(recovery_order);
        let dead: Vec<u32> = faults.iter().filter_map(|f| if let Fault::ClientDied { pid } = f { Some(*pid) } else { None }).collect();
        let crashed: Vec<u32> = faults.iter().filter_map(|f| if let Fault::ServerCrash { server } = f { Some(*server) } else { None }).collect();
        let mut recovered = false;
        for f in faults {
            let also = match &f {
                Fault::ClientDied { pid } if dead.first() == Some(pid) => &dead[1..],
                Fault::ServerCrash { server } if crashed.first() == Some(server) => &crashed[1..],
                // Recovered from with the first of their kind.
                Fault::ClientDied { .. } | Fault::ServerCrash { .. } => continue,
                Fault::ClientsStuck { .. } if recovered => continue,
                _ => &[][..],
            };
            recovered = true;
            if !self.recover_with(now_ms, f, also) {
                break;
            }
        }
    }

    /// Targeted recovery first: a dead or hung offline client is removed from its MPS server
    /// with `terminate_client`, the server and the online clients keep their contexts. When
    /// that fails (or clients are stuck again within [`stuck_episode_ms`] of it) the servers
    /// are ended and the control daemon kept (for a crashed server, that one alone, gone
    /// already: [`Manager::restart_servers`]); stuck clients none of which an MPS server lists
    /// ([`Manager::stuck_on_mps`]) get nothing, neither step. A full MPS reset (a new
    /// control daemon) is the last resort, for a dead or hung daemon, a GPU fault, or servers
    /// that would not end. Both cost every client its context and both are rate-limited; a
    /// dead daemon with no server left is replaced past the limit
    /// ([`Manager::restart_dead_daemon`]: that ends nothing).
    ///
    /// `also`: more faults of `fault`'s kind seen at the same check, other dead clients
    /// (terminated in the same targeted recovery) or other crashed servers (ended in the same
    /// server restart). Returns whether the other faults of the check still call for their
    /// recovery: after a targeted one (or none needed), or crashed servers ended alone; `false`
    /// when it ended every client's connection, or the rate limit held it back.
    fn recover_with(&mut self, now_ms: u64, fault: Fault, also: &[u32]) -> bool {
        let started = mono_ms();
        let targeted = match &fault {
            Fault::ClientDied { pid } => {
                // Every dead client's work hangs the server until it is terminated, and the
                // recovery reclaims every dead registration from the ledger (after which no
                // fault would name them again): all of them now, not only this one.
                let mut pids: Vec<u32> = self
                    .offline()
                    .iter()
                    .filter(|p| {
                        p.pid_ns == self.own_ns
                            && node_ledger::procinfo::is_dead(p.pid, p.start_time)
                    })
                    .map(|p| p.pid)
                    .collect();
                for p in std::iter::once(pid).chain(also) {
                    if !pids.contains(p) {
                        pids.push(*p);
                    }
                }
                // A pid known only from a server's list that no server lists any more has left
                // MPS (its connection closed): nothing of it hangs, no reset for it.
                let registered: Vec<u32> =
                    self.offline().iter().filter(|p| p.pid_ns == self.own_ns).map(|p| p.pid).collect();
                if pids.iter().any(|p| !registered.contains(p)) {
                    let listed = self.listed_clients();
                    pids.retain(|p| registered.contains(p) || listed.as_ref().is_none_or(|l| l.contains(p)));
                }
                if pids.is_empty() {
                    Some(Ok(format!("client {pid} no longer listed on any MPS server: nothing to terminate")))
                } else {
                    Some(self.terminate_offline(&pids, true, fault.kind()))
                }
            }
            Fault::ClientsStuck { pids: hung, for_ms } => {
                // The processes that waited all along: an idle neighbour is left alone.
                let pids = self.stuck_on_mps(hung);
                if pids.is_empty() {
                    // Nothing MPS serves waited: no client to terminate, and nothing that ending
                    // the servers would help (it would cost the online service its context).
                    if !std::mem::replace(&mut self.stuck_unlisted_logged, true) {
                        tracing::warn!(
                            gpu = self.cfg.gpu_index,
                            pids = ?hung,
                            for_ms = *for_ms,
                            "clients_stuck names no offline process found here that an MPS server lists (gone, another pid namespace's, or not an MPS client): nothing terminated, MPS servers left running"
                        );
                    }
                    return true;
                }
                if self.escalate_stuck_until.is_some_and(|t| now_ms <= t) {
                    // Stuck again within the episode: the targeted step did not help.
                    None
                } else {
                    // Armed before the command (a journal write happens meanwhile): a failure
                    // leaves it armed until a full recovery runs, a success for this episode only.
                    self.escalate_stuck_until = Some(u64::MAX);
                    let r = self.terminate_offline(&pids, false, fault.kind());
                    if r.is_ok() {
                        self.escalate_stuck_until = Some(now_ms.saturating_add(stuck_episode_ms(&self.cfg)));
                    }
                    Some(r)
                }
            }
            _ => None,
        };
        // Whatever became of it, this recovery's journal is done with (a reset follows); what
        // the previous manager left and is still registered stays.
        self.state.terminating = self.inherited.clone();
        let why_full = match targeted {
            Some(Ok(outcome)) => {
                tracing::warn!(fault = fault.kind(), %outcome, took_ms = mono_ms() - started, "targeted recovery done; MPS and online clients untouched");
                self.record(fault, Vec::new(), outcome);
                return true;
            }
            Some(Err(e)) => format!("targeted recovery failed: {e}"),
            None => format!("{} needs a new MPS", fault.kind()),
        };
        if let Err(why) = self.limiter.allow(&self.cfg.recovery, now_ms) {
            if fault == Fault::DaemonDead && self.restart_dead_daemon(now_ms, &why) {
                return false;
            }
            self.state.suppressed_recoveries += 1;
            if !self.limited_logged {
                self.limited_logged = true;
                tracing::error!(fault = fault.kind(), %why, "full MPS reset rate-limited; counting in suppressed_recoveries");
            }
            if let Some(x) = self.xid_pending.as_ref().filter(|_| !self.xid_held_said) {
                self.xid_held_said = true;
                tracing::error!(
                    gpu = self.cfg.gpu_index,
                    code = x.code,
                    fault = fault.kind(),
                    %why,
                    "critical XID recovery (a full MPS reset) held back by the rate limit: MPS stays as the XID left it until the limit allows it, then it runs"
                );
            }
            return false;
        }
        let servers_only = !fault.needs_new_daemon() && self.live_daemon().is_some();
        if servers_only {
            tracing::error!(fault = fault.kind(), reason = %why_full, "MPS SERVER RESTART: every MPS client, online included, loses its context; the control daemon stays");
        } else {
            tracing::error!(fault = fault.kind(), reason = %why_full, "FULL MPS RESET: every MPS client, online included, loses its context");
        }
        let evicted = self.evict_offline(fault.kind());
        // A crashed server is gone already, its clients with it: the other servers (a new one
        // a relaunched online client may have got meanwhile) are left alone.
        let only: Option<Vec<u32>> = match &fault {
            Fault::ServerCrash { server } => Some(std::iter::once(*server).chain(also.iter().copied()).collect()),
            _ => None,
        };
        let restarted = servers_only.then(|| self.restart_servers(only.as_deref()));
        // Crashed servers ended alone: the other servers' clients keep their connections, and
        // the other faults of the check (a dead client another server lists) their recovery.
        let others_kept = only.is_some() && matches!(restarted, Some(Ok(_)));
        let mut new_daemon = false;
        let outcome = match restarted {
            Some(Ok(o)) => format!("{o} ({why_full})"),
            not_restarted => {
                let why = match not_restarted {
                    Some(Err(e)) => {
                        tracing::error!(fault = fault.kind(), error = %e, "MPS servers not restarted: FULL MPS RESET");
                        format!("{why_full}; servers not restarted: {e}")
                    }
                    _ => why_full.clone(),
                };
                match self.reset_mps() {
                    Ok(pid) => {
                        new_daemon = true;
                        format!("MPS reset ({why}); control daemon {pid} running")
                    }
                    Err(e) => format!("MPS reset ({why}) failed: {e}"),
                }
            }
        };
        tracing::warn!(fault = fault.kind(), evicted = ?evicted, %outcome, "recovery done");
        // A full reset is the XID's recovery whichever fault asked for it: a dead or hung
        // daemon sorts first in a check and ends it. Before, only the XID's own recovery
        // recorded it, so a restarted manager reset MPS a second time for the same episode. A
        // reset that failed recovered nothing: the XID stays owed, tried again.
        if new_daemon {
            if let Some(x) = self.xid_pending.take() {
                if !matches!(fault, Fault::Xid { .. }) {
                    tracing::info!(gpu = self.cfg.gpu_index, code = x.code, fault = fault.kind(), "this full MPS reset was also the recovery from the critical XID found");
                }
                self.state.xid_handled = Some(x);
                self.xid_held_said = false;
            }
        }
        self.escalate_stuck_until = None;
        self.record(fault, evicted, outcome);
        self.detector.reset();
        others_kept
    }

    /// While the rate limit holds a [`Fault::DaemonDead`] recovery back: starts a new control
    /// daemon when none runs and no MPS server of the last look still runs. Starting one ends
    /// nothing, and with no server left there is no client to lose. Without a daemon, a process
    /// that initialises CUDA (an online service relaunched by its supervisor) gets a context of
    /// its own on the bare GPU, and in EXCLUSIVE_PROCESS mode that context keeps every MPS
    /// server off the GPU until the process exits. Before, no daemon ran until the limit allowed
    /// the reset, up to an hour later. What still needs the limit is left to it: `quit`, kills and
    /// `shutdown_server` of live processes, and offline evictions. Returns `false` (nothing
    /// done) while a daemon or such a server runs, or while the backoff holds.
    ///
    /// Servers are looked for in `/proc` now as well ([`MpsControl::live_mps_processes`]): the
    /// last listing can miss one started since, and a second daemon beside an orphaned server
    /// is what this must never make. Starts back off ([`PastLimitBackoff`]: 1 s doubling to
    /// 60 s, reset once a daemon lived 5 min): a daemon that dies right after it starts was
    /// started again at every check, for ever.
    ///
    /// [`MpsControl::live_mps_processes`]: crate::control::MpsControl::live_mps_processes
    fn restart_dead_daemon(&mut self, now_ms: u64, limited: &str) -> bool {
        let server_left = self.servers_seen.iter().any(|s| node_ledger::procinfo::is_alive(s.pid, s.start_time));
        if server_left || self.live_daemon().is_some() {
            return false;
        }
        let wait_left = self.past_limit.wait_left(now_ms);
        if wait_left > 0 {
            tracing::debug!(gpu = self.cfg.gpu_index, wait_left_ms = wait_left, "MPS control daemon dead: the next start past the rate limit waits (backoff)");
            return false;
        }
        let live = self.ctl.live_mps_processes();
        if !live.is_empty() {
            tracing::warn!(
                gpu = self.cfg.gpu_index,
                pids = ?live,
                pipe_dir = %self.ctl.pipe_dir.display(),
                "MPS control daemon dead but MPS processes of its pipe directory still run (an orphaned server?): no new daemon beside them while recoveries are rate-limited"
            );
            return false;
        }
        self.past_limit.started(now_ms);
        self.state.daemons_started_past_limit += 1;
        match self.ensure_daemon() {
            Ok(pid) => tracing::warn!(
                gpu = self.cfg.gpu_index,
                pid,
                rate_limit = %limited,
                started_past_limit = self.state.daemons_started_past_limit,
                next_start_after_ms = self.past_limit.wait_ms,
                "MPS control daemon dead and no MPS server left: a new one started although recoveries are rate-limited (no client to lose; without a daemon a process initialising CUDA takes the bare GPU)"
            ),
            Err(e) => {
                tracing::error!(gpu = self.cfg.gpu_index, error = %e, pipe_dir = %self.ctl.pipe_dir.display(), next_start_after_ms = self.past_limit.wait_ms, "MPS control daemon dead: starting a new one failed");
                self.state.last_error = Some(format!("starting a new MPS control daemon in {}: {e}", self.ctl.pipe_dir.display()));
            }
        }
        self.servers_seen.clear();
        self.detector.reset();
        true
    }

    fn record(&mut self, fault: Fault, evicted: Vec<u32>, outcome: String) {
        self.state.recoveries.push(Recovery {
            at_unix_ms: unix_ms(),
            fault,
            evicted,
            outcome,
        });
        if self.state.recoveries.len() > 50 {
            self.state.recoveries.remove(0);
        }
    }

    /// `terminate_client <server> <pid>` for each of `pids` that an MPS server lists (a dead
    /// client stays listed while its work hangs the server); live ones are also evicted and
    /// marked for restart. Err when MPS does not answer, or within [`LISTING_GRACE_MS`] none of
    /// `pids` is terminated (`all` false: live clients of a stuck server), or one of them is
    /// still listed at the last look (`all` true: dead clients, each of which hangs its server
    /// while listed; one no server lists has left MPS).
    ///
    /// What MPS may legitimately show meanwhile is tolerated: a client not listed yet (its
    /// connection still being handed to its server), a server that went away between
    /// `get_server_list` and `get_client_list`, a client gone between the listing and
    /// `terminate_client` (`... not found`). Each is looked at again, every
    /// [`LISTING_RETRY_MS`], until the grace runs out; only then is the full reset the answer.
    fn terminate_offline(
        &mut self,
        pids: &[u32],
        all: bool,
        why: &str,
    ) -> Result<String, MpsError> {
        let deadline = mono_ms() + LISTING_GRACE_MS;
        let mut done: Vec<(u32, u32)> = Vec::new();
        let mut looks = 0u32;
        let mut last_refusal = None;
        let registered: BTreeMap<u32, u64> = self
            .offline()
            .iter()
            .filter(|p| p.pid_ns == self.own_ns)
            .map(|p| (p.pid, p.start_time))
            .collect();
        // Dead clients the previous manager was terminating when it was killed: done if no
        // server lists them (terminated then); listed, they are terminated again below.
        let inherited: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| {
                registered.get(p).is_some_and(|&st| {
                    self.inherited_termination(*p, st)
                        && !node_ledger::procinfo::is_alive(*p, st)
                })
            })
            .collect();
        let mut listed: Vec<u32> = Vec::new();
        loop {
            looks += 1;
            listed.clear();
            for srv in self.ctl.server_list()? {
                let clients = match self.ctl.client_list(srv) {
                    Ok(c) => c,
                    Err(e @ MpsError::Rejected { .. }) => {
                        last_refusal = Some(e.to_string());
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                listed.extend(clients.iter().copied());
                for c in clients {
                    if !pids.contains(&c) || done.iter().any(|&(_, d)| d == c) {
                        continue;
                    }
                    self.journal_termination(c, registered.get(&c).copied(), srv);
                    match self.ctl.command(&format!("terminate_client {srv} {c}")) {
                        Ok(_) => done.push((srv, c)),
                        Err(e @ MpsError::Rejected { .. }) => last_refusal = Some(e.to_string()),
                        Err(e) => return Err(e),
                    }
                }
            }
            for &p in &inherited {
                if !listed.contains(&p) && !done.iter().any(|&(_, d)| d == p) {
                    tracing::info!(pid = p, "dead client terminated by the previous manager: no longer listed");
                    done.push((0, p));
                }
            }
            let enough = if all {
                pids.iter().all(|p| done.iter().any(|&(_, d)| d == *p))
            } else {
                !done.is_empty()
            };
            if enough || mono_ms() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(LISTING_RETRY_MS));
        }
        let offline = self.offline();
        let mut sig = PidfdSignaller;
        for p in offline.iter().filter(|p| pids.contains(&p.pid)) {
            if p.pid_ns == self.own_ns && sig.alive(p.pid, p.start_time) {
                let _ = sig.signal(p.pid, p.start_time, libc::SIGTERM);
            }
            self.state.restart_requested.push(RestartRequest {
                pid: p.pid,
                start_time: p.start_time,
                reason: format!("MPS recovery ({why})"),
                at_unix_ms: unix_ms(),
            });
        }
        self.reclaim_all();
        // Reclaimed: no fault names them again; the journal has served (what the previous
        // manager left and is still registered stays).
        let still: Vec<(u32, u64)> = self.offline().iter().map(|p| (p.pid, p.start_time)).collect();
        self.inherited.retain(|t| still.contains(&(t.pid, t.start_time)));
        self.state.terminating = self.inherited.clone();
        if self.state.restart_requested.len() > 200 {
            let n = self.state.restart_requested.len() - 200;
            self.state.restart_requested.drain(..n);
        }
        let missing: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| !done.iter().any(|&(_, d)| d == *p))
            .collect();
        // Dead clients (`all`): one no server lists at the last look has left MPS, its
        // connection closed and dropped by its server (on an H200 the server logs "assuming
        // client exit" the moment a SIGKILLed client dies, before the manager's first look):
        // nothing of it is left to hang anything. A reset is the answer only for one still
        // listed that `terminate_client` did not remove. Live clients to remove (`all` false,
        // a stuck server): none terminated is a failure whatever the lists show.
        let stuck: Vec<u32> = if all {
            missing.iter().copied().filter(|p| listed.contains(p)).collect()
        } else {
            missing.clone()
        };
        if (all && !stuck.is_empty()) || (!all && done.is_empty()) {
            return Err(MpsError::Rejected {
                command: "terminate_client".into(),
                reply: format!(
                    "clients {stuck:?} still listed after {looks} looks over {LISTING_GRACE_MS} ms (terminated: {done:?}){}",
                    last_refusal.map_or(String::new(), |r| format!("; last refusal: {r}"))
                ),
            });
        }
        let gone = if missing.is_empty() {
            String::new()
        } else {
            format!("; {missing:?} not listed on any MPS server in {looks} looks over {LISTING_GRACE_MS} ms: left MPS, nothing to terminate")
        };
        Ok(if done.is_empty() {
            format!("no client to terminate{gone}; MPS not reset")
        } else {
            format!("terminate_client {done:?} (listed at look {looks}){gone}; MPS not reset")
        })
    }

    /// Whether the control daemon the last check saw running has died since (its pid + start
    /// time gone; one `/proc` read): worth a check now rather than at the next
    /// `check_every_ms`, as while no daemon runs a client initialising CUDA finds no MPS and
    /// takes the bare GPU. Once per death: the check that sees it dead clears it.
    pub fn daemon_died(&self) -> bool {
        self.daemon_seen_alive && self.daemon.is_some_and(|d| node_ledger::procinfo::is_dead(d.pid, d.start_time))
    }

    /// Whether a dead client still listed by MPS awaits its confirming second look (the
    /// daemon then checks again after `period_ms`, not `check_every_ms`).
    pub fn awaits_confirmation(&self) -> bool {
        self.detector.awaits_confirmation()
    }

    /// Every client the MPS servers list now; `None` when MPS did not answer.
    fn listed_clients(&mut self) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        for srv in self.ctl.server_list().ok()? {
            out.extend(self.ctl.client_list(srv).ok()?);
        }
        Some(out)
    }

    /// Of the pids a [`Fault::ClientsStuck`] names, those of registered offline processes
    /// found here (pid in this namespace known) that an MPS server lists now: what a stuck
    /// recovery may terminate, and the only processes whose waiting may escalate it to ending
    /// the servers. All of them found here when MPS does not answer (the listing cannot tell;
    /// a daemon that does not answer is a fault of its own).
    fn stuck_on_mps(&mut self, hung: &[u32]) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .offline()
            .iter()
            .filter(|p| p.pid_ns == self.own_ns && hung.contains(&p.pid))
            .map(|p| p.pid)
            .collect();
        if let Some(listed) = self.listed_clients() {
            pids.retain(|p| listed.contains(p));
        }
        pids
    }

    /// Records, in the state file, before the command is sent, that `pid` (listed on `server`)
    /// is being terminated (see [`ManagerState::terminating`]). Without its start time (not
    /// registered) nothing is recorded: a bare pid could name another process later.
    fn journal_termination(&mut self, pid: u32, start_time: Option<u64>, server: u32) {
        let Some(start_time) = start_time else { return };
        self.state.terminating.push(Terminating { pid, start_time, server });
        let path = self.cfg.state_file.clone();
        self.write_state(&path);
    }

    /// SIGTERM every offline client (by pid + start time), SIGKILL after the grace period,
    /// record the requests in the ledger and in the restart list.
    fn evict_offline(&mut self, why: &str) -> Vec<u32> {
        let mut sig = PidfdSignaller;
        self.scan_pods(mono_ms());
        let raw = self.registered();
        let offline = self.in_my_terms(&raw);
        let mut out = Vec::new();
        let mut unwritten: Vec<(u64, u32, String)> = Vec::new();
        for (r, p) in raw.iter().zip(&offline) {
            if let Err(e) = self.request_evict_id(node_ledger::ProcId::of(r), (p.pid_ns == self.own_ns).then_some(p.pid)) {
                unwritten.push((r.pid_ns, r.pid, e));
            }
            if p.pid_ns == self.own_ns
                && sig
                    .signal(p.pid, p.start_time, libc::SIGTERM)
                    .unwrap_or(false)
            {
                out.push(p.pid);
            }
            self.state.restart_requested.push(RestartRequest {
                pid: p.pid,
                start_time: p.start_time,
                reason: format!("MPS recovery ({why})"),
                at_unix_ms: unix_ms(),
            });
        }
        // One line for them all: a ledger client can write a slot for each entry of the table.
        if let Some((pid_ns, pid, error)) = unwritten.first() {
            tracing::warn!(
                gpu = self.cfg.gpu_index,
                unwritten = unwritten.len(),
                first_pid = pid,
                first_pid_ns = pid_ns,
                %error,
                "offline processes evicted for an MPS recovery got no eviction request: they are only signalled where found"
            );
        }
        let deadline = mono_ms() + self.cfg.evict_grace_ms;
        while mono_ms() < deadline
            && offline
                .iter()
                .any(|p| p.pid_ns == self.own_ns && sig.alive(p.pid, p.start_time))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for p in offline.iter().filter(|p| p.pid_ns == self.own_ns) {
            if sig.alive(p.pid, p.start_time) {
                tracing::warn!(
                    pid = p.pid,
                    "offline client ignored SIGTERM during recovery: SIGKILL"
                );
                let _ = sig.signal(p.pid, p.start_time, libc::SIGKILL);
            }
        }
        self.reclaim_all();
        if self.state.restart_requested.len() > 200 {
            let n = self.state.restart_requested.len() - 200;
            self.state.restart_requested.drain(..n);
        }
        out
    }

    /// Ends every MPS server with `shutdown_server -f` and keeps the control daemon, which
    /// starts a new server for the next client: every client loses its context as in a full
    /// reset, but the daemon's pipe stays, so a client relaunched at once (an online service's
    /// supervisor) reaches MPS again. With no daemon to reach, it would take a context of its
    /// own on the bare GPU, and in EXCLUSIVE_PROCESS no MPS server could start until it exits.
    /// `Err` (the caller then resets MPS whole) when the daemon does not answer, refuses, or a
    /// server is still there `command_timeout_ms` after it was told.
    ///
    /// `only`: end those servers alone (those still listed), not every one.
    fn restart_servers(&mut self, only: Option<&[u32]>) -> Result<String, String> {
        let daemon = self.live_daemon().map(|d| d.pid).ok_or_else(|| MpsError::NoDaemon.to_string())?;
        let mut servers = self.ctl.server_list().map_err(|e| e.to_string())?;
        if let Some(s) = only {
            servers.retain(|p| s.contains(p));
            if servers.is_empty() {
                let s: Vec<String> = s.iter().map(u32::to_string).collect();
                return Ok(format!(
                    "MPS server {} gone; control daemon {daemon} kept, a new server starts for the next client",
                    s.join(", ")
                ));
            }
        }
        // Each as pid + start time now: a recycled pid is never taken for a server still there.
        let ids: Vec<(u32, Option<u64>)> =
            servers.iter().map(|&p| (p, node_ledger::procinfo::start_time(p))).collect();
        for &s in &servers {
            match self.ctl.force_shutdown_server(s) {
                Ok(()) => {}
                // Gone between the listing and the command.
                Err(MpsError::Rejected { reply, .. }) if reply.contains("not found") => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        let deadline = mono_ms() + self.cfg.command_timeout_ms;
        loop {
            let listed = self.ctl.server_list().map_err(|e| e.to_string())?;
            let left: Vec<u32> = ids
                .iter()
                .filter(|(p, st)| listed.contains(p) || st.is_some_and(|st| node_ledger::procinfo::is_alive(*p, st)))
                .map(|(p, _)| *p)
                .collect();
            if left.is_empty() {
                break;
            }
            if mono_ms() >= deadline {
                return Err(format!(
                    "MPS servers {left:?} still running {} ms after shutdown_server -f",
                    self.cfg.command_timeout_ms
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.servers_seen.clear();
        Ok(format!(
            "MPS servers {servers:?} shut down (shutdown_server -f); control daemon {daemon} kept, a new server starts for the next client"
        ))
    }

    /// `quit`, or kill the daemon and its servers when it does not answer; then start afresh.
    ///
    /// The daemon is signalled only as the pid + start time recorded when it was started or
    /// detected, through a pidfd: a pid file naming another process (the daemon died and its
    /// pid was reused) is never acted on; that is logged as an error, the stale pid file is
    /// removed and the recovery goes on to start a new daemon.
    pub(crate) fn reset_mps(&mut self) -> Result<u32, MpsError> {
        let recorded = self.daemon;
        let mut sig = PidfdSignaller;
        let ours_alive =
            |sig: &mut PidfdSignaller| recorded.is_some_and(|d| sig.alive(d.pid, d.start_time));
        match self.ctl.quit() {
            Ok(()) => {
                let deadline = mono_ms() + self.cfg.command_timeout_ms;
                while ours_alive(&mut sig) && mono_ms() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Err(e) => tracing::warn!(error = %e, "MPS quit failed; killing the control daemon"),
        }
        // Named as an MPS process when recorded ([`MpsControl::daemon_identity`]) and still so.
        if let Some(d) = recorded.filter(|d| crate::control::is_mps_process(d.pid)) {
            match sig.signal(d.pid, d.start_time, libc::SIGKILL) {
                Ok(true) => {
                    tracing::warn!(pid = d.pid, "MPS control daemon killed");
                    // Gone before a new one is looked for: a daemon still dying holds its control
                    // socket (a connection there succeeds into its backlog) and would be found
                    // and adopted as the new one, a recovery that recovered nothing.
                    let deadline = mono_ms() + self.cfg.command_timeout_ms;
                    while ours_alive(&mut sig) && mono_ms() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if ours_alive(&mut sig) {
                        return Err(MpsError::Spawn(format!(
                            "control daemon {} still running {} ms after SIGKILL: not starting or adopting another meanwhile",
                            d.pid, self.cfg.command_timeout_ms
                        )));
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(pid = d.pid, error = %e, "cannot kill the MPS control daemon");
                    self.state.last_error = Some(format!("killing MPS control daemon {}: {e}", d.pid));
                }
            }
        }
        if let Some(pid) = self.ctl.pid_file_pid() {
            let now = node_ledger::procinfo::start_time(pid);
            let ours = recorded.is_some_and(|d| d.pid == pid && Some(d.start_time) == now);
            if now.is_some() && !ours {
                let msg = format!(
                    "MPS pid file {} names pid {pid} (start time {}), not the control daemon \
                     this manager recorded ({}): the pid was reused or the daemon was replaced \
                     behind the manager's back; pid {pid} is NOT signalled",
                    self.ctl.pipe_dir.join(crate::control::PID_FILE).display(),
                    now.unwrap_or_default(),
                    recorded.map_or("none".into(), |d| format!(
                        "pid {} start time {}",
                        d.pid, d.start_time
                    )),
                );
                tracing::error!("{msg}");
                self.state.last_error = Some(msg);
            }
        }
        // Servers as listed (pid + start time when listed); a recycled pid is never hit, nor a
        // process that is no MPS server by name (a listing from a socket someone replaced).
        for s in std::mem::take(&mut self.servers_seen) {
            if !crate::control::is_mps_process(s.pid) {
                continue;
            }
            let _ = sig.signal(s.pid, s.start_time, libc::SIGKILL);
        }
        let _ = std::fs::remove_file(self.ctl.pipe_dir.join(crate::control::PID_FILE));
        std::thread::sleep(Duration::from_millis(50));
        self.daemon = None;
        self.state.daemon_pid = None;
        self.state.daemon_start_time = None;
        self.ensure_daemon()
    }

    /// Stops MPS when configured to, and then puts back the compute mode found at start (only
    /// once MPS is gone: a running MPS keeps the fence).
    pub fn shutdown(&mut self) {
        if !self.cfg.quit_on_exit {
            return;
        }
        if self.live_daemon().is_some() {
            match self.ctl.quit() {
                Ok(()) => {
                    tracing::info!("MPS control daemon stopped");
                    // What the state file says once this manager is gone.
                    (self.state.daemon_pid, self.state.daemon_start_time) = (None, None);
                    (self.state.servers, self.state.clients) = (Vec::new(), 0);
                    self.daemon = None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "MPS quit failed at shutdown: the compute mode stays exclusive_process");
                    return;
                }
            }
        }
        if self.cfg.compute_mode == ComputeModePolicy::Leave {
            return;
        }
        match self.modes.restore() {
            Ok(Some(m)) => tracing::info!(gpu = self.cfg.gpu_index, mode = compute_mode::name(m), "GPU compute mode put back"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot put the GPU's compute mode back"),
        }
        self.note_modes();
    }

    /// Writes the state file at `path` atomically, stamped with the current time. A run of
    /// failed writes (a read-only or full directory) is logged at its start, on a changed
    /// error, once a minute and at its end ([`node_daemon::errlog`]), not at every check.
    pub fn write_state(&mut self, path: &Path) {
        self.state.updated_unix_ms = unix_ms();
        let written = node_daemon::state_file::write_json_pretty(path, &self.state);
        node_daemon::state_file::log_write(&mut self.state_write, mono_ms(), path, written, "node-agent and mps-manager status");
    }

    /// Current budget published in the status file (per-mille).
    pub fn published_budget_permille(&self) -> u32 {
        self.status
            .current()
            .and_then(|s| s.read_manager())
            .map_or(0, |m| m.offline_sm_budget_permille)
    }
}

/// Effective uid of a process (`/proc/<pid>/status`, `Uid:` second field).
pub fn proc_euid(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}


/// The "offline SM budget" line. A reading that gave no online estimate (NaN, see
/// `Allocator::online_estimate`) logs none: the field is left out rather than written as NaN.
fn log_budget(budget_pct: f64, online_estimate: f64, sm_activity_pct: f64, safe: bool) {
    tracing::info!(
        budget_pct,
        online_estimate_pct = online_estimate.is_finite().then_some(online_estimate),
        sm_activity_pct,
        safe,
        "offline SM budget"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Child, Command};

    impl Manager {
        /// [`Manager::recover_with`] of `fault` alone.
        fn recover(&mut self, now_ms: u64, fault: Fault) -> bool {
            self.recover_with(now_ms, fault, &[])
        }
    }

    /// A manager whose control program is a stand-in: `-d` starts a sleeper named as the real
    /// daemon is ([`crate::control::mps_named_sleeper`]) as "the daemon"
    /// and writes its pid file; every command is answered with nothing, so `quit` "succeeds"
    /// while the stand-in daemon stays (a daemon that does not stop).
    fn manager(dir: &Path) -> Manager {
        manager_answering(dir, "cat >/dev/null\n")
    }

    /// As [`manager`], with `commands` (shell, the command line on its stdin) answering every
    /// command but `-d`.
    fn manager_answering(dir: &Path, commands: &str) -> Manager {
        let bin = dir.join("ctl.sh");
        let daemon = crate::control::mps_named_sleeper(dir);
        std::fs::write(
            &bin,
            format!(
                "#!/bin/sh\nif [ \"$1\" = -d ]; then\n  '{}' </dev/null >/dev/null 2>&1 &\n  \
                 echo $! > \"$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid\"\n  exit 0\nfi\n{commands}",
                daemon.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = Config {
            ledger_dir: dir.join("ledger"),
            control_bin: bin,
            pipe_dir: dir.join("pipe"),
            log_dir: dir.join("log"),
            monitor_state_file: dir.join("state.json"),
            state_file: dir.join("mps-manager.json"),
            command_timeout_ms: 300,
            // No NVML here; the compute-mode test gives its manager a fake GPU.
            compute_mode: ComputeModePolicy::Leave,
            ..Config::default()
        };
        Manager::new(cfg).unwrap()
    }

    /// [`manager_answering`] with one MPS server, 4242 (no process), listing the pids in
    /// `<pipe>/clients` (`terminate_client` answers) until `shutdown_server 4242 -f` ends it
    /// (`<pipe>/down`).
    fn manager_with_a_server(dir: &Path) -> Manager {
        manager_answering(
            dir,
            "p=\"$CUDA_MPS_PIPE_DIRECTORY\"; read cmd\ncase \"$cmd\" in\n\
             get_server_list) [ -f \"$p/down\" ] || echo 4242;;\n\
             \"get_client_list 4242\") cat \"$p/clients\" 2>/dev/null;;\n\
             \"shutdown_server 4242 -f\") touch \"$p/down\";;\n\
             esac\nexit 0\n",
        )
    }

    /// [`manager`] with `compute_mode` = `policy`, reading and setting the mode of `gpu`.
    fn manager_on(dir: &Path, policy: ComputeModePolicy, gpu: &crate::compute_mode::testing::Fake) -> Manager {
        let mut m = manager(dir);
        m.cfg.compute_mode = policy;
        m.set_mode_keeper(Keeper::over(Box::new(gpu.clone())));
        m
    }

    /// The compute mode is set before MPS starts, set back at a check when found changed
    /// (counted, in the state file), and the mode found put back only once MPS has quit at
    /// shutdown; a manager that leaves MPS running keeps the fence.
    #[test]
    fn the_compute_mode_is_held_while_mps_runs_and_put_back_after_quit() {
        use nvml_wrapper::enum_wrappers::device::ComputeMode;
        let dir = tempfile::tempdir().unwrap();
        let gpu = crate::compute_mode::testing::Fake::new(ComputeMode::Default);
        let mut m = manager_on(dir.path(), ComputeModePolicy::ExclusiveProcess, &gpu);
        m.hold_compute_mode().unwrap();
        assert_eq!(gpu.mode(), ComputeMode::ExclusiveProcess);
        assert_eq!(m.state.compute_mode.as_deref(), Some("exclusive_process"));
        assert_eq!(m.state.compute_mode_found.as_deref(), Some("default"));
        m.ensure_daemon().unwrap();
        *gpu.mode.lock().unwrap() = ComputeMode::Default;
        m.check(0);
        assert_eq!(gpu.mode(), ComputeMode::ExclusiveProcess, "set back at the check");
        assert_eq!(m.state.compute_mode_restored, 1);
        // Leaving MPS running (the default) leaves the fence.
        m.shutdown();
        assert_eq!(gpu.mode(), ComputeMode::ExclusiveProcess);
        // A restarted manager finds EXCLUSIVE_PROCESS, and takes over the mode its predecessor
        // found from the state file.
        let prev = m.state.clone();
        let mut m2 = manager_on(dir.path(), ComputeModePolicy::ExclusiveProcess, &gpu);
        m2.adopt_previous(&prev);
        m2.hold_compute_mode().unwrap();
        assert_eq!(m2.state.compute_mode_found.as_deref(), Some("default"));
        m2.cfg.quit_on_exit = true;
        m2.shutdown();
        assert_eq!(gpu.mode(), ComputeMode::Default, "MPS quit: the mode found is back");
        assert_eq!(m2.state.compute_mode_found, None);
        if let Some(d) = m.recorded_daemon() {
            kill(d.pid);
        }
    }

    /// The mode found is in the state file before the mode is changed: a manager whose control
    /// daemon then fails to start (or that is killed before its first check) leaves it to its
    /// successor, which puts it back with `quit_on_exit`. What the previous manager's file says
    /// of the daemon is kept meanwhile. Before, the mode found reached the file only at the
    /// first check, and the successor found EXCLUSIVE_PROCESS: DEFAULT was never put back.
    #[test]
    fn the_mode_found_is_in_the_state_file_before_the_mode_is_changed() {
        use nvml_wrapper::enum_wrappers::device::ComputeMode;
        let dir = tempfile::tempdir().unwrap();
        let gpu = crate::compute_mode::testing::Fake::new(ComputeMode::Default);
        let file = dir.path().join("mps-manager.json");
        // A previous manager's file, written before any mode was changed.
        let before = ManagerState { manager_pid: 1, daemon_pid: Some(4242), daemon_start_time: Some(7), ..Default::default() };
        std::fs::write(&file, serde_json::to_string(&before).unwrap()).unwrap();
        let mut m = manager_on(dir.path(), ComputeModePolicy::ExclusiveProcess, &gpu);
        m.adopt_previous(&Manager::read_previous(&file).unwrap().unwrap());
        m.hold_compute_mode().unwrap();
        assert_eq!(gpu.mode(), ComputeMode::ExclusiveProcess);
        // Killed here, or its control daemon fails to start: no state written by this manager.
        drop(m);
        let left = Manager::read_previous(&file).unwrap().expect("the state file");
        assert_eq!(left.compute_mode_found.as_deref(), Some("default"), "{left:?}");
        assert_eq!((left.manager_pid, left.daemon_pid, left.daemon_start_time), (1, Some(4242), Some(7)), "the rest as it was");
        let mut next = manager_on(dir.path(), ComputeModePolicy::ExclusiveProcess, &gpu);
        next.adopt_previous(&left);
        next.hold_compute_mode().unwrap();
        next.cfg.quit_on_exit = true;
        next.shutdown();
        assert_eq!(gpu.mode(), ComputeMode::Default, "the mode the first manager found is back");
        // With no previous file, the manager's own state carries it.
        std::fs::remove_file(&file).unwrap();
        let mut m = manager_on(dir.path(), ComputeModePolicy::ExclusiveProcess, &gpu);
        m.hold_compute_mode().unwrap();
        let left = Manager::read_previous(&file).unwrap().expect("the state file");
        assert_eq!((left.compute_mode_found.as_deref(), left.daemon_pid), (Some("default"), None));
    }

    /// MPS recovery asks every offline process to leave: the request names the pod its cgroup
    /// path names (node-agent evicts that pod), not the neighbour pod whose group its slot
    /// claims. A real process in a pod-shaped cgroup; needs root and a writable cgroup
    /// hierarchy (says so and passes vacuously otherwise).
    #[test]
    fn a_recovery_request_names_the_pod_of_the_processs_cgroup_not_the_group_its_slot_claims() {
        const TENANT: &str = "99999999-7777-4777-8777-777777777777";
        let Some(cg) = workloads::host::PodCgroup::create_or_skip(TENANT) else { return };
        let dir = tempfile::tempdir().unwrap();
        let mut m = manager(dir.path());
        m.cfg.evict_grace_ms = 0;
        let path = node_ledger::config::ledger_path(&m.cfg.ledger_dir, 0);
        let l = node_ledger::Ledger::open_or_create(&path, 0).unwrap();
        let mut child = cg.spawn_ledger_holder(&path);
        let g = l.group(node_ledger::ledger::group_id_for("k8s-pod-88888888-8888-4888-8888-888888888888"), 1 << 30).unwrap();
        let h = l.register(child.id(), g).unwrap();
        assert!(workloads::host::hold_slot_lock(child.id(), h.slot), "the stand-in holds its slot's lock");
        let start_time = node_ledger::procinfo::start_time(child.id());
        m.evict_offline("test");
        let reqs = node_ledger::Status::open(&node_ledger::config::status_path(&m.cfg.ledger_dir, 0)).unwrap().evict_requests();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(reqs.len(), 1, "{reqs:?}");
        assert_eq!((reqs[0].by, reqs[0].id.pid, Some(reqs[0].id.start_time)), (node_ledger::Requester::Manager, child.id(), start_time));
        assert_eq!(reqs[0].pod, node_ledger::PodUid::parse(TENANT));
    }

    /// A process registered in a pod's ledger (`node_ledger::pods`) is one of the manager's
    /// offline processes: MPS recovery asks it to leave, naming the pod whose ledger it is in
    /// when its cgroup names none.
    #[test]
    fn a_process_in_a_pods_ledger_is_asked_to_leave_naming_its_pod() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = manager(dir.path());
        m.cfg.evict_grace_ms = 0;
        let (mut child, pod, _l) = pod_client(&m);
        let signalled = m.evict_offline("test");
        let reqs = node_ledger::Status::open(&node_ledger::config::status_path(&m.cfg.ledger_dir, 0)).unwrap().evict_requests();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(signalled, [child.id()], "signalled here");
        assert_eq!(reqs.len(), 1, "{reqs:?}");
        assert_eq!((reqs[0].by, reqs[0].id.pid), (node_ledger::Requester::Manager, child.id()));
        if node_daemon::offline_pods::pod_uid_of(std::process::id()).is_none() {
            assert_eq!(reqs[0].pod, Some(pod), "no pod in the cgroup path: the ledger's pod");
        }
    }

    /// Slots nobody holds the lock of (any ledger client writes them, here every slot of the
    /// GPU's ledger naming processes of a pid namespace nobody has) take at most the manager's
    /// eviction table but [`node_ledger::status::EVICT_RESERVED_FOR_FOUND`] entries in a
    /// recovery's evictions: the genuine process of a pod ledger read after them still gets its
    /// request. Before, the forged slots took all 256 entries.
    #[test]
    fn slots_nobody_holds_cannot_fill_the_managers_eviction_table() {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = tempfile::tempdir().unwrap();
        let mut m = manager(dir.path());
        m.cfg.evict_grace_ms = 0;
        let g = m.ledger.group(7, 1 << 30).unwrap();
        let forged: Vec<_> = (0..node_ledger::layout::MAX_PROCS as u64)
            .map(|i| {
                let h = m.ledger.register(std::process::id(), g).unwrap();
                m.ledger.layout().procs[h.slot].pid_ns.store(m.own_ns ^ (i + 1), Relaxed);
                h
            })
            .collect();
        let (mut child, _, _l) = pod_client(&m);
        let signalled = m.evict_offline("test");
        let reqs = node_ledger::Status::open(&node_ledger::config::status_path(&m.cfg.ledger_dir, 0)).unwrap().evict_requests();
        let _ = child.kill();
        let _ = child.wait();
        for h in forged {
            m.ledger.unregister(h);
        }
        assert_eq!(signalled, [child.id()]);
        assert!(reqs.iter().any(|r| r.id.pid == child.id()), "the genuine process is asked");
        let room = node_ledger::status::EVICT_ENTRIES - node_ledger::status::EVICT_RESERVED_FOR_FOUND;
        assert_eq!(reqs.len(), room + 1, "the forged slots take all but the reserve");
    }

    /// Only a registration whose owner was found holding its slot's lock is judged outside MPS:
    /// a slot naming a live process that holds no lock on it (any ledger client can write one,
    /// and its launch count) is never reported nor asked to leave, where a found process
    /// launching with no server listing it is. Before, every registration was a candidate, and
    /// each forged slot reported took an entry of the eviction table.
    #[test]
    fn only_a_process_found_holding_its_slot_is_judged_outside_mps() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager_with_a_server(d.path());
        m.cfg.evict_grace_ms = 1_000;
        let daemon = m.ensure_daemon().unwrap();
        let mut online = sleeper();
        std::fs::write(d.path().join("pipe").join("clients"), format!("{}\n", online.id())).unwrap();
        let mut nobody = sleeper();
        let forged = m.ledger.register(nobody.id(), m.ledger.group(8, 1 << 30).unwrap()).unwrap();
        let (mut found, hf) = offline_client(&m);
        let after = m.cfg.outside_mps_after_ms;
        let mut faults = Vec::new();
        for now in [0, after / 2, after + 1] {
            m.ledger.count_launches(forged, 10, 0);
            m.ledger.count_launches(hf, 10, 0);
            faults.extend(m.check(now));
        }
        let reqs = node_ledger::Status::open(&m.cfg.status_path()).unwrap().evict_requests();
        let asked: Vec<u32> = reqs.iter().map(|r| r.id.pid).collect();
        for c in [&mut online, &mut nobody, &mut found] {
            let _ = c.kill();
            let _ = c.wait();
        }
        kill(daemon);
        assert!(faults.is_empty(), "{faults:?}");
        assert_eq!(m.state.outside_mps, 1, "the found process alone");
        assert_eq!(asked, [found.id()]);
    }

    /// A process this manager asked to leave that ignores SIGTERM is SIGKILLed after the grace
    /// even when the manager that asked was stopped within it: the next one takes on the
    /// escalation of its requests in the status file (before, nothing did while the monitor
    /// ran on: the request stayed and the process with it).
    #[test]
    fn a_request_of_an_earlier_manager_run_is_escalated_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = node_ledger::config::ledger_path(&dir.path().join("ledger"), 0);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let l = node_ledger::Ledger::open_or_create(&path, 0).unwrap();
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "trap '' TERM; exec sleep 30"]);
        workloads::host::hold_ledger(&mut cmd, &path);
        let mut child = cmd.spawn().unwrap();
        let g = l.group(node_ledger::ledger::group_id_for("x"), 1 << 30).unwrap();
        let h = l.register(child.id(), g).unwrap();
        assert!(workloads::host::hold_slot_lock(child.id(), h.slot), "the stand-in holds its slot's lock");
        let id = node_ledger::ProcId::of(&l.procs().into_iter().find(|p| p.pid == child.id()).unwrap());
        {
            // The earlier run: its request written, SIGTERM sent (ignored), then it stops.
            let mut first = manager(dir.path());
            first.request_evict_id(id, Some(child.id())).unwrap();
            first.budget_tick();
        }
        let alive = |c: &mut Child| c.try_wait().unwrap().is_none();
        assert!(alive(&mut child));
        let mut m = manager(dir.path());
        m.cfg.evict_grace_ms = 200;
        m.budget_tick();
        m.kill_after_grace();
        assert!(alive(&mut child), "a full grace from when the request is found");
        std::thread::sleep(Duration::from_millis(250));
        m.kill_after_grace();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive(&mut child) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let killed = !alive(&mut child);
        let _ = child.kill();
        let status = child.wait().unwrap();
        assert!(killed, "SIGKILLed after the grace");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    /// Every pod ledger numbers its slots from 0: a process found outside MPS in one pod's
    /// ledger (in a container's pid namespace, found here under another pid) is never taken for
    /// another ledger's process of this namespace in the same slot with the same start time,
    /// which an MPS server lists: that one is left alone, and the request names the process
    /// found, as its ledger names it.
    #[test]
    fn a_process_outside_mps_is_never_taken_for_another_ledgers_in_the_same_slot() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = manager(dir.path());
        m.cfg.outside_mps = OutsideAction::Evict;
        m.cfg.outside_mps_after_ms = 0;
        let mut listed = sleeper();
        let st = node_ledger::procinfo::start_time(listed.id()).unwrap();
        let snap = |pid: u32, pid_ns: u64, launches: u64| node_ledger::ProcSnapshot {
            slot: 0,
            pid,
            start_time: st,
            pid_ns,
            group_id: 1,
            mem_bytes: 0,
            launches,
            launches_delayed: 0,
            heartbeat_ns: 0,
            syncs: (0, 0),
            mps_pct: 0,
            ledger_file: Default::default(),
            owner_lock: (0, 0),
        };
        let container_ns = m.own_ns ^ 1;
        // Its pid here: one no process has (nothing is signalled by it).
        let host = 4_000_007;
        let clients = BTreeMap::from([(1, vec![listed.id()])]);
        for (t, launches) in [(0, 10), (500, 20)] {
            let raw = [snap(7, container_ns, launches), snap(listed.id(), m.own_ns, launches)];
            let here = [snap(host, m.own_ns, launches), raw[1].clone()];
            m.check_outside(t, &clients, &raw, &here);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let alive = listed.try_wait().unwrap().is_none();
        let _ = listed.kill();
        let _ = listed.wait();
        assert_eq!(m.state.outside_mps, 1, "the container's process, found on the second look");
        assert!(alive, "the listed process of the other ledger was signalled");
        let r = m.state.restart_requested.last().expect("a restart requested");
        assert_eq!((r.pid, r.start_time), (host, st), "named by its pid here");
        let reqs = node_ledger::Status::open(&m.cfg.status_path()).unwrap().evict_requests();
        let asked: Vec<_> = reqs.iter().map(|r| (r.id.pid_ns, r.id.pid)).collect();
        assert_eq!(asked, [(container_ns, 7)], "asked as its ledger names it");
    }

    /// A reload from `leave` to `exclusive_process` sets the mode at the next check, as a first
    /// setting (not counted as a change undone).
    #[test]
    fn a_reload_to_exclusive_process_sets_the_mode_at_the_next_check() {
        use nvml_wrapper::enum_wrappers::device::ComputeMode;
        let dir = tempfile::tempdir().unwrap();
        let gpu = crate::compute_mode::testing::Fake::new(ComputeMode::Default);
        let mut m = manager_on(dir.path(), ComputeModePolicy::Leave, &gpu);
        m.hold_compute_mode().unwrap();
        m.check(0);
        assert_eq!((gpu.mode(), m.state.compute_mode.clone()), (ComputeMode::Default, None), "leave");
        m.cfg.compute_mode = ComputeModePolicy::ExclusiveProcess;
        m.check(500);
        assert_eq!(gpu.mode(), ComputeMode::ExclusiveProcess);
        assert_eq!(m.state.compute_mode_restored, 0);
        assert_eq!(m.state.compute_mode_found.as_deref(), Some("default"));
    }

    /// A process NVML lists on the GPU and no MPS server does is reported after two looks in
    /// a row (not at the first: a client may connect between the listings), and forgotten
    /// once gone; with compute_mode leave nothing is looked at.
    #[test]
    fn a_process_holding_the_gpu_outside_mps_is_reported_on_the_second_look() {
        use nvml_wrapper::enum_wrappers::device::ComputeMode;
        let dir = tempfile::tempdir().unwrap();
        let gpu = crate::compute_mode::testing::Fake::new(ComputeMode::ExclusiveProcess);
        let mut m = manager_on(dir.path(), ComputeModePolicy::ExclusiveProcess, &gpu);
        m.hold_compute_mode().unwrap();
        m.ensure_daemon().unwrap();
        let mut holder = sleeper();
        *gpu.pids.lock().unwrap() = vec![holder.id()];
        m.check(0);
        assert!(m.state.outside_holders.is_empty(), "one look is not enough");
        m.check(500);
        assert_eq!(m.state.outside_holders, vec![holder.id()]);
        m.check(1000);
        assert_eq!(m.state.outside_holders, vec![holder.id()], "still there");
        let _ = holder.kill();
        let _ = holder.wait();
        m.check(1500);
        assert!(m.state.outside_holders.is_empty(), "gone with it");
        let mut again = sleeper();
        *gpu.pids.lock().unwrap() = vec![again.id()];
        m.cfg.compute_mode = ComputeModePolicy::Leave;
        m.check(2000);
        m.check(2500);
        assert!(m.state.outside_holders.is_empty(), "leave: not looked at");
        let _ = again.kill();
        let _ = again.wait();
        if let Some(d) = m.recorded_daemon() {
            kill(d.pid);
        }
    }

    /// A manager that cannot set the mode (not root) does not start: its error says how to
    /// fix it, and the GPU is as it was.
    #[test]
    fn a_compute_mode_it_cannot_set_stops_the_manager_before_mps() {
        use nvml_wrapper::enum_wrappers::device::ComputeMode;
        let dir = tempfile::tempdir().unwrap();
        let mut gpu = crate::compute_mode::testing::Fake::new(ComputeMode::Default);
        gpu.deny = true;
        let mut m = manager_on(dir.path(), ComputeModePolicy::ExclusiveProcess, &gpu);
        let e = m.hold_compute_mode().unwrap_err();
        assert!(e.contains("nvidia-smi -i 0 -c EXCLUSIVE_PROCESS"), "{e}");
        assert_eq!(gpu.mode(), ComputeMode::Default);
        // Nothing changed, nothing to put back (an operator may set the mode by hand next).
        let left = Manager::read_previous(&m.cfg.state_file).unwrap().expect("the state file");
        assert_eq!(left.compute_mode_found, None);
        // At a check the failure is recorded for the operator, not fatal.
        m.check(0);
        assert!(m.state.last_error.as_deref().is_some_and(|l| l.contains("exclusive_process")), "{:?}", m.state.last_error);
    }

    /// A monitor state file the manager cannot read (none there, damaged, of another
    /// version) is kept as `monitor_state_error` naming the file, and cleared once it reads
    /// again: the manager never mistakes it for "no XID, nothing about to be SIGKILLed" silently.
    #[test]
    fn an_unreadable_monitor_state_file_is_reported_until_it_reads_again() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let p = m.cfg.monitor_state_file.clone();
        m.check(0);
        let e = m.state.monitor_state_error.clone().expect("a missing file is reported");
        assert!(e.contains("state.json"), "{e}");
        let good = node_daemon::monitor_state::MonitorState::example();
        node_daemon::monitor_state::write(&p, &good).unwrap();
        m.check(500);
        assert_eq!(m.state.monitor_state_error, None, "readable again");
        for bad in [&b"{\"gpu\": "[..], b"", b"\x00\x00\x00", b"{\"gpu\": 0}"] {
            std::fs::write(&p, bad).unwrap();
            m.check(1000);
            let e = m.state.monitor_state_error.clone().expect("a damaged file is reported");
            assert!(e.contains("state.json"), "{e}");
        }
        // Another GPU's monitor's file (a state_file path two GPUs share) is not this GPU's.
        let other = node_daemon::monitor_state::MonitorState { gpu: 1, ..good.clone() };
        node_daemon::monitor_state::write(&p, &other).unwrap();
        m.check(1500);
        let e = m.state.monitor_state_error.clone().expect("another GPU's file is reported");
        assert!(e.contains("GPU 1's monitor"), "{e}");
        node_daemon::monitor_state::write(&p, &good).unwrap();
        m.check(2000);
        assert_eq!(m.state.monitor_state_error, None);
    }

    /// A critical XID keeps the GPU Disabled until an operator acts, and the monitor's state
    /// file says so all along: it is recovered from (a full MPS reset) once. A restarted
    /// manager takes the XID it recovered from over from its state file and does not reset MPS
    /// again for it, which would end the online service's context for nothing; a new episode
    /// (Disabled again later, or after a reboot) is a fault again. Before, the XID handled
    /// was kept in memory only, and every restart of the manager reset MPS again. It counts as
    /// handled once its recovery ran, not when it was found: a recovery the rate limit held
    /// back is tried again by a restarted manager (found in review).
    #[test]
    fn a_restarted_manager_does_not_recover_again_from_an_xid_it_recovered_from() {
        use node_daemon::monitor_state::{write, MonitorState};
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        m.ensure_daemon().unwrap();
        let p = m.cfg.monitor_state_file.clone();
        let xid = MonitorState::example();
        assert_eq!((xid.disabling_xid(), xid.disabled_since_mono_ms), (Some(79), Some(4)));
        write(&p, &xid).unwrap();
        assert_eq!(m.check(0), vec![Fault::Xid { code: 79 }]);
        assert_eq!(m.check(100), vec![Fault::Xid { code: 79 }], "asked again while its recovery is owed");
        assert_eq!(m.state.xid_handled, None, "found, not yet recovered from");
        m.recover(mono_ms(), Fault::Xid { code: 79 });
        assert!(m.state.xid_handled.is_some(), "recovered from");
        let daemon = m.ensure_daemon().unwrap();
        let prev: ManagerState = serde_json::from_str(&serde_json::to_string(&m.state).unwrap()).unwrap();
        let restarted = |prev: Option<&ManagerState>| {
            let mut m = manager(d.path());
            if let Some(prev) = prev {
                m.adopt_previous(prev);
            }
            assert_eq!(m.ensure_daemon().unwrap(), daemon, "the daemon adopted");
            m
        };
        let mut m2 = restarted(Some(&prev));
        assert!(m2.check(0).is_empty(), "recovered from already, by the manager before");
        assert!(m2.check(100).is_empty());
        // Without its predecessor's state file, the XID is new to a manager.
        assert_eq!(restarted(None).check(0), vec![Fault::Xid { code: 79 }]);
        // Disabled by the same XID again later, or after a reboot: a new episode.
        write(&p, &MonitorState { disabled_since_mono_ms: Some(9), ..xid.clone() }).unwrap();
        assert_eq!(m2.check(200), vec![Fault::Xid { code: 79 }]);
        m2.recover(mono_ms(), Fault::Xid { code: 79 });
        assert!(m2.check(300).is_empty());
        write(&p, &MonitorState { disabled_since_mono_ms: Some(9), boot_id: "c".into(), ..xid }).unwrap();
        assert_eq!(m2.check(400), vec![Fault::Xid { code: 79 }]);
        let now = m2.ensure_daemon().unwrap();
        kill(daemon);
        kill(now);
    }

    /// A critical XID whose recovery the rate limit holds back is owed, not dropped: checks
    /// while the limit holds ask nothing (an ERROR line once), and the first check it allows
    /// asks for the recovery again, which runs and records the episode handled. Before, the
    /// detector had reported the episode once, and MPS stayed as the XID left it for the rest
    /// of the run.
    #[test]
    fn an_xid_recovery_the_rate_limit_held_back_runs_once_the_limit_allows() {
        use node_daemon::monitor_state::{write, MonitorState};
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let first = m.ensure_daemon().unwrap();
        let limit = m.cfg.recovery.min_interval_ms;
        m.limiter.allow(&m.cfg.recovery, 0).unwrap(); // a recovery just ran
        write(&m.cfg.monitor_state_file, &MonitorState::example()).unwrap();
        let faults = m.check(1);
        assert_eq!(faults, vec![Fault::Xid { code: 79 }]);
        let (_, said) = logs_of(|| m.handle_faults(1, faults));
        assert!(said.contains("held back by the rate limit"), "{said}");
        assert_eq!((m.state.xid_handled.as_ref(), m.state.suppressed_recoveries), (None, 1));
        let (faults, said) = logs_of(|| m.check(limit / 2));
        assert!(faults.is_empty(), "the limit still holds: {faults:?}");
        m.handle_faults(limit / 2, faults);
        assert!(!said.contains("held back"), "said once: {said}");
        // Disabled again meanwhile (another episode, the same code): owed in its turn, and its
        // hold said when a recovery is held back again.
        let again = MonitorState { disabled_since_mono_ms: Some(9), ..MonitorState::example() };
        write(&m.cfg.monitor_state_file, &again).unwrap();
        assert!(m.check(limit / 2 + 1).is_empty());
        let (_, said) = logs_of(|| m.recover(limit / 2 + 1, Fault::DaemonHang { command: "get_server_list".into() }));
        assert!(said.contains("critical XID recovery (a full MPS reset) held back"), "{said}");
        let faults = m.check(limit);
        assert_eq!(faults, vec![Fault::Xid { code: 79 }], "owed, and the limit allows it");
        m.handle_faults(limit, faults);
        let handled = m.state.xid_handled.clone();
        let last = m.state.recoveries.last().map(|r| (r.fault.clone(), r.outcome.clone()));
        let faults = m.check(limit + 1);
        kill(first);
        if let Some(p) = m.recorded_daemon() {
            kill(p.pid);
        }
        assert!(matches!(&last, Some((Fault::Xid { code: 79 }, o)) if o.contains("MPS reset")), "{last:?}");
        assert_eq!(handled, HandledXid::of(&again), "recorded as handled");
        assert!(faults.is_empty(), "once: {faults:?}");
    }

    /// A manager whose control daemon died after its first check, with the monitor reporting
    /// a critical XID (`MonitorState::example`): its next check finds both.
    fn daemon_dead_with_an_xid(dir: &Path) -> Manager {
        let mut m = manager(dir);
        m.ensure_daemon().unwrap();
        assert!(m.check(0).is_empty());
        kill_recorded_daemon(&m);
        node_daemon::monitor_state::write(&m.cfg.monitor_state_file, &node_daemon::monitor_state::MonitorState::example()).unwrap();
        m
    }

    /// A dead control daemon and a critical XID seen at one check: the dead daemon's full
    /// reset, first, is the XID's recovery too, recorded as such, so a restarted manager does
    /// not reset MPS again for the same episode (ending the online service's new context).
    /// Before, `xid_handled` was written by the XID's own recovery only, which the full reset
    /// before it left unrun.
    #[test]
    fn a_full_reset_for_another_fault_of_the_check_counts_as_the_xids_recovery() {
        use node_daemon::monitor_state::MonitorState;
        let d = tempfile::tempdir().unwrap();
        let mut m = daemon_dead_with_an_xid(d.path());
        let faults = m.check(100);
        assert_eq!(faults, vec![Fault::Xid { code: 79 }, Fault::DaemonDead]);
        m.handle_faults(100, faults);
        let kinds: Vec<&str> = m.state.recoveries.iter().map(|r| r.fault.kind()).collect();
        let prev: ManagerState = serde_json::from_str(&serde_json::to_string(&m.state).unwrap()).unwrap();
        let now = m.recorded_daemon().map(|d| d.pid);
        let mut m2 = manager(d.path());
        m2.adopt_previous(&prev);
        let adopted = m2.ensure_daemon();
        let faults = m2.check(0);
        for p in now.into_iter().chain(adopted.ok()) {
            kill(p);
        }
        assert_eq!(kinds, ["daemon_dead"], "one full reset");
        assert_eq!(prev.xid_handled, HandledXid::of(&MonitorState::example()));
        assert!(faults.is_empty(), "no second reset for the episode: {faults:?}");
    }

    /// A full reset that failed (no control daemon could be started) recovered nothing: the
    /// XID found in that check stays owed, not recorded handled (a restarted manager would
    /// otherwise never reset MPS for it).
    #[test]
    fn a_failed_full_reset_leaves_the_xid_owed() {
        let d = tempfile::tempdir().unwrap();
        let mut m = daemon_dead_with_an_xid(d.path());
        // The control binary now starts no daemon: every reset fails.
        std::fs::write(&m.cfg.control_bin, "#!/bin/sh\nexit 1\n").unwrap();
        let faults = m.check(100);
        assert_eq!(faults, vec![Fault::Xid { code: 79 }, Fault::DaemonDead]);
        m.handle_faults(100, faults);
        let outcome = m.state.recoveries.last().map(|r| r.outcome.clone()).unwrap_or_default();
        assert!(outcome.contains("failed"), "{outcome}");
        assert_eq!(m.state.xid_handled, None, "a failed reset is no recovery from the XID");
    }

    /// A state file that cannot be written (its directory is a file) is a run of failures the
    /// manager keeps trying through, ended by the first write that works.
    #[test]
    fn a_state_file_that_cannot_be_written_is_retried_until_it_is() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let blocker = d.path().join("blocked");
        std::fs::write(&blocker, "").unwrap();
        let p = blocker.join("mps-manager.json");
        for _ in 0..3 {
            m.write_state(&p);
        }
        assert!(m.state_write.failing());
        std::fs::remove_file(&blocker).unwrap();
        std::fs::create_dir(&blocker).unwrap();
        m.write_state(&p);
        assert!(!m.state_write.failing());
        assert!(Manager::read_previous(&p).unwrap().is_some());
    }

    /// A previous state file of another GPU's manager (a state_file path two GPUs share) is
    /// not taken over: neither its terminations nor the compute mode it found.
    #[test]
    fn another_gpus_previous_state_is_not_taken_over() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let prev = ManagerState {
            gpu: 1,
            terminating: vec![Terminating { pid: 7, start_time: 9, server: 3 }],
            ..ManagerState::default()
        };
        m.adopt_previous(&prev);
        assert!(m.state.terminating.is_empty() && m.inherited.is_empty());
        m.adopt_previous(&ManagerState { gpu: 0, ..prev });
        assert_eq!(m.inherited.len(), 1, "this GPU's own is taken over");
    }

    /// The previous state file: none is a first start; a damaged one is an error naming the
    /// file (logged at start), never mistaken for "nothing was being terminated".
    #[test]
    fn the_previous_state_file_missing_is_none_damaged_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mps-manager.json");
        assert_eq!(Manager::read_previous(&p), Ok(None));
        let prev = ManagerState {
            terminating: vec![Terminating { pid: 7, start_time: 9, server: 3 }],
            ..ManagerState::default()
        };
        node_daemon::state_file::write_json(&p, &prev).unwrap();
        assert_eq!(Manager::read_previous(&p), Ok(Some(prev)));
        for bad in [&b"{\"terminating\": [{\"pid\": "[..], b"", b"\x00\x00\x00"] {
            std::fs::write(&p, bad).unwrap();
            let e = Manager::read_previous(&p).unwrap_err();
            assert!(e.contains("mps-manager.json"), "{e}");
        }
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(d.path().join("nowhere"), &p).unwrap();
        assert!(Manager::read_previous(&p).is_err(), "a dangling link is not a first start");
    }

    /// A manager SIGKILLed right after `terminate_client` of a dead offline client, before it
    /// reclaimed the registration: the next manager finds the dead client registered but on
    /// no server. Taken over from the previous state file's `terminating`, that is a finished
    /// termination (Ok, no reset); without the journal it stays the unknown case, Err (full
    /// reset). Failed before the journal with the e2e line `round 5 (delay Some(15000) µs):
    /// MPS never reset` (`tests/e2e/tests/mps_manager_restart.rs`).
    #[test]
    fn a_termination_journaled_by_the_previous_manager_finishes_without_a_reset() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let daemon = m.ensure_daemon().unwrap();
        let g = m.ledger.group(7, 1 << 30).unwrap();
        let dead_client = |m: &Manager| {
            let mut c = sleeper();
            let pid = c.id();
            m.ledger.register(pid, g).unwrap();
            let st = node_ledger::procinfo::start_time(pid).unwrap();
            c.kill().unwrap();
            c.wait().unwrap();
            (pid, st)
        };
        // The journal the killed manager left (a state file as written before the command).
        let (pid, st) = dead_client(&m);
        let prev = ManagerState {
            manager_pid: 1,
            terminating: vec![Terminating { pid, start_time: st, server: 4242 }],
            ..Default::default()
        };
        let text = serde_json::to_string(&prev).unwrap();
        m.adopt_previous(&serde_json::from_str(&text).unwrap());
        assert_eq!(m.state.terminating, prev.terminating, "passed on until finished");
        let out = m.terminate_offline(&[pid], true, "client_died");
        assert!(out.is_ok(), "{out:?}");
        assert!(m.offline().iter().all(|p| p.pid != pid), "registration reclaimed");
        assert!(m.state.terminating.is_empty() && m.inherited.is_empty());

        // A dead client nobody was terminating and no server lists: it has left MPS (its
        // server dropped it when its connection closed), nothing to terminate, no reset.
        let (pid2, _) = dead_client(&m);
        let out = m.terminate_offline(&[pid2], true, "client_died");
        assert!(out.as_ref().is_ok_and(|o| o.contains("left MPS")), "{out:?}");
        // A state file of a manager without the field still reads.
        let old: ManagerState = serde_json::from_str(r#"{"gpu":0,"manager_pid":1,"daemon_pid":null,"servers":[],"clients":0,"gpu_health":null,"sm_activity_pct":0,"online_estimate_pct":0,"offline_budget_pct":null,"faults":{},"recoveries":[],"suppressed_recoveries":0,"restart_requested":[],"last_error":null,"updated_unix_ms":0}"#).unwrap();
        assert!(old.terminating.is_empty());
        kill(daemon);
    }

    /// One lock per GPU, beside its ledger, naming its holder. The refusal of a second
    /// process is tested in `node_daemon::instance` (POSIX locks are per process) and end to
    /// end in `tests/e2e/tests/mps_manager_restart.rs`.
    #[test]
    fn the_instance_lock_is_per_gpu_beside_the_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = |gpu| {
            let mut c = Config {
                ledger_dir: dir.path().join("ledger"),
                ..Config::default()
            };
            c.gpu_index = gpu;
            c
        };
        assert_eq!(lock_file(&cfg(0)), node_ledger::config::daemon_dir(&cfg(0).ledger_dir, 0).join("mps-manager.lock"));
        assert_ne!(lock_file(&cfg(0)), lock_file(&cfg(1)));
        let a = lock_instance(&cfg(0)).unwrap();
        let b = lock_instance(&cfg(1)).unwrap();
        let holder = std::fs::read_to_string(lock_file(&cfg(0))).unwrap();
        assert_eq!(holder.trim(), std::process::id().to_string());
        drop((a, b));
    }

    /// What `f` logs (this thread), as text.
    fn logs_of<R>(f: impl FnOnce() -> R) -> (R, String) {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt().with_ansi(false).with_writer(move || w.clone()).finish();
        let r = tracing::subscriber::with_default(sub, f);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        (r, text)
    }

    /// Fails with the estimate logged as it is: `online_estimate_pct=NaN`.
    #[test]
    fn a_budget_without_an_online_estimate_logs_none() {
        let ((), text) = logs_of(|| {
            log_budget(40.0, f64::NAN, 100.0, true);
            log_budget(35.0, 12.5, 50.0, true);
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("budget_pct=40") && !lines[0].contains("online_estimate_pct"), "{text}");
        assert!(!text.contains("NaN"), "{text}");
        assert!(lines[1].contains("online_estimate_pct=12.5"), "{text}");
    }

    fn sleeper() -> Child {
        Command::new("sleep").arg("30").spawn().unwrap()
    }

    /// A registered offline process of this namespace that the manager finds here: a sleeper
    /// holding the GPU's ledger open and its slot's lock; with its registration.
    fn offline_client(m: &Manager) -> (Child, node_ledger::ProcHandle) {
        let g = m.ledger.group(7, 1 << 30).unwrap();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        workloads::host::hold_ledger(&mut cmd, &m.cfg.ledger_path());
        let c = cmd.spawn().unwrap();
        let h = m.ledger.register(c.id(), g).unwrap();
        assert!(workloads::host::hold_slot_lock(c.id(), h.slot), "the stand-in holds its slot's lock");
        (c, h)
    }

    /// A registered offline process of a pod's ledger that the manager finds: a sleeper holding
    /// the pod's ledger open and its slot's lock; with the pod and the ledger.
    fn pod_client(m: &Manager) -> (Child, node_ledger::PodUid, node_ledger::Ledger) {
        let pod = node_ledger::PodUid::parse("66666666-6666-4666-8666-666666666666").unwrap();
        let path = node_ledger::pods::pod_ledger_path(&m.cfg.ledger_dir, pod, 0);
        let l = node_ledger::Ledger::open_or_create(&path, 0).unwrap();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        workloads::host::hold_ledger(&mut cmd, &path);
        let child = cmd.spawn().unwrap();
        let g = l.group(node_ledger::ledger::group_id_for("x"), 1 << 30).unwrap();
        let h = l.register(child.id(), g).unwrap();
        assert!(workloads::host::hold_slot_lock(child.id(), h.slot), "the stand-in holds its slot's lock");
        (child, pod, l)
    }

    fn kill(pid: u32) {
        if let Some(st) = node_ledger::procinfo::start_time(pid) {
            let _ = PidfdSignaller.signal(pid, st, libc::SIGKILL);
        }
    }

    /// SIGKILLs the daemon `m` recorded and waits until it is gone; returns it.
    fn kill_recorded_daemon(m: &Manager) -> DaemonId {
        let daemon = m.recorded_daemon().unwrap();
        kill(daemon.pid);
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while node_ledger::procinfo::is_alive(daemon.pid, daemon.start_time) {
            assert!(std::time::Instant::now() < end, "the stand-in daemon never died");
            std::thread::sleep(Duration::from_millis(5));
        }
        daemon
    }

    /// The online estimate takes off what the offline jobs hold (their MPS percentages, fixed
    /// at their start), not the whole budget: one job holding 10 % beside a 60 % reading is
    /// 50 % online, so the budget falls to 100 - 50 - 28 = 22 % (before: 60 - 42 = 18 %
    /// online, budget left at its 42 % maximum).
    #[test]
    fn the_online_estimate_takes_off_the_jobs_percentages() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let g = m.ledger.group(7, 1 << 30).unwrap();
        let h = m.ledger.register_with_mps(std::process::id(), g, 10).unwrap();
        node_ledger::Status::open_or_create(&m.cfg.status_path(), 0).unwrap().publish(
            &node_ledger::MonitorSample { sm_active_permille: 600, ..Default::default() }
                .with_health(HealthState::Healthy),
        );
        m.budget_tick();
        assert_eq!(m.published_budget_permille(), 220);
        m.ledger.unregister(h);
    }

    /// Only registrations whose owner holds its slot's lock count as offline work in the
    /// online estimate: a slot any ledger client wrote claiming 100 % (naming a process that
    /// holds no lock on it) took the whole budget off the reading as offline, so the budget
    /// stayed at its 42 % maximum beside a 60 % reading instead of falling to 22 %.
    #[test]
    fn a_slot_whose_owner_holds_no_lock_takes_nothing_off_the_online_estimate() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let g = m.ledger.group(7, 1 << 30).unwrap();
        let h = m.ledger.register_with_mps(std::process::id(), g, 10).unwrap();
        let mut online = sleeper();
        let g2 = m.ledger.group(8, 1 << 30).unwrap();
        let _forged = m.ledger.register_with_mps(online.id(), g2, 100).unwrap();
        node_ledger::Status::open_or_create(&m.cfg.status_path(), 0).unwrap().publish(
            &node_ledger::MonitorSample { sm_active_permille: 600, ..Default::default() }
                .with_health(HealthState::Healthy),
        );
        m.budget_tick();
        assert_eq!(m.published_budget_permille(), 220, "the genuine job's 10 % off the reading, not 42 %");
        m.ledger.unregister(h);
        let _ = online.kill();
        let _ = online.wait();
    }

    /// A slot's launch count is its writer's word: a slot whose count rises at every check,
    /// whether nobody holds its lock (any ledger client can write one) or a genuine listed
    /// client's (its tenant writes its own slot), does not hide a found, listed client that
    /// waits with nothing returning on a quiet GPU: it is stuck after `stuck_after_ms`. Before,
    /// the launches of every registration were summed into one progress for the GPU, and the
    /// fault never came while any count moved. A count at `u64::MAX` is no panic either.
    #[test]
    fn another_slots_rising_launch_count_does_not_hide_a_stuck_client() {
        use std::sync::atomic::Ordering::Relaxed;
        let d = tempfile::tempdir().unwrap();
        let mut m = manager_with_a_server(d.path());
        let daemon = m.ensure_daemon().unwrap();
        let (mut waiting, hw) = offline_client(&m);
        let (mut busy, hb) = offline_client(&m);
        let mut nobody = sleeper();
        let g = m.ledger.group(8, 1 << 30).unwrap();
        let forged = m.ledger.register(nobody.id(), g).unwrap();
        std::fs::write(d.path().join("pipe").join("clients"), format!("{}\n{}\n", waiting.id(), busy.id())).unwrap();
        m.ledger.set_syncs(hw, 1, 0);
        m.ledger.layout().procs[forged.slot].launches.store(u64::MAX, Relaxed);
        let t0 = mono_ms();
        let step = m.cfg.detect.stuck_after_ms / 4;
        let mut faults = Vec::new();
        for i in 0..=5 {
            m.ledger.count_launches(forged, 1, 0);
            m.ledger.count_launches(hb, 1, 0);
            faults.extend(m.check(t0 + i * step));
        }
        for c in [&mut waiting, &mut busy, &mut nobody] {
            let _ = c.kill();
            let _ = c.wait();
        }
        kill(daemon);
        assert_eq!(
            faults.iter().map(|f| f.kind()).collect::<Vec<_>>(),
            ["clients_stuck"],
            "{faults:?}"
        );
        assert!(matches!(&faults[0], Fault::ClientsStuck { pids, .. } if pids == &[waiting.id()]), "{faults:?}");
    }

    /// A server fault with a sound control daemon: its servers are ended with
    /// `shutdown_server -f` and the daemon kept (a client relaunched meanwhile reaches MPS);
    /// servers still there after it mean a full reset, a new daemon.
    #[test]
    fn a_server_fault_ends_the_servers_and_keeps_the_daemon_unless_they_stay() {
        let d = tempfile::tempdir().unwrap();
        // The stand-in lists one server (a sleep, pid in <pipe>/server.pid) with the clients in
        // <pipe>/clients, and ends it (as its daemon, which reaps it, no longer lists it) on
        // `shutdown_server <pid> -f` only while <pipe>/obey exists.
        let mut m = manager_answering(
            d.path(),
            "p=\"$CUDA_MPS_PIPE_DIRECTORY\"; read cmd\ncase \"$cmd\" in\n\
             get_server_list) cat \"$p/server.pid\" 2>/dev/null;;\n\
             \"get_client_list $(cat \"$p/server.pid\")\") cat \"$p/clients\" 2>/dev/null;;\n\
             \"shutdown_server $(cat \"$p/server.pid\") -f\") [ -f \"$p/obey\" ] && kill -9 $(cat \"$p/server.pid\") && rm \"$p/server.pid\";;\n\
             esac\nexit 0\n",
        );
        m.cfg.recovery.min_interval_ms = 0;
        m.cfg.evict_grace_ms = 100;
        let daemon = m.ensure_daemon().unwrap();
        let pipe = d.path().join("pipe");
        let server = |pipe: &Path| {
            let s = sleeper();
            std::fs::write(pipe.join("server.pid"), format!("{}\n", s.id())).unwrap();
            s
        };
        let mut s1 = server(&pipe);
        std::fs::write(pipe.join("obey"), "").unwrap();
        // A crashed server is gone: the one a relaunched client got since is left alone.
        m.recover(mono_ms(), Fault::ServerCrash { server: 1 });
        let r = m.state.recoveries.last().unwrap().outcome.clone();
        assert!(r.contains("MPS server 1 gone") && r.contains(&format!("control daemon {daemon} kept")), "{r}");
        assert!(s1.try_wait().unwrap().is_none(), "another server was ended");
        // Clients stuck after terminate_client (a client the server lists waits again): the
        // servers are ended, the daemon kept.
        let stuck = |m: &mut Manager| {
            let (c, _) = offline_client(m);
            std::fs::write(pipe.join("clients"), format!("{}\n", c.id())).unwrap();
            m.escalate_stuck_until = Some(u64::MAX);
            m.recover(mono_ms(), Fault::ClientsStuck { for_ms: 1, pids: vec![c.id()] });
            c
        };
        let c1 = stuck(&mut m);
        let r = m.state.recoveries.last().unwrap().outcome.clone();
        assert!(r.contains("shutdown_server -f") && r.contains(&format!("control daemon {daemon} kept")), "{r}");
        assert!(s1.try_wait().unwrap().is_some(), "the server was ended");
        assert_eq!(m.ctl.daemon_pid(), Some(daemon), "the daemon was kept");
        // A server that does not end: the full reset replaces the daemon.
        let s2 = server(&pipe);
        std::fs::remove_file(pipe.join("obey")).unwrap();
        let c2 = stuck(&mut m);
        let r = m.state.recoveries.last().unwrap().outcome.clone();
        assert!(r.contains("MPS reset") && r.contains("still running") && r.contains(&s2.id().to_string()), "{r}");
        assert_ne!(m.ctl.daemon_pid(), Some(daemon), "a new daemon");
        for mut c in [s2, c1, c2] {
            let _ = c.kill();
            let _ = c.wait();
        }
        kill(daemon);
        if let Some(p) = m.ctl.daemon_pid() {
            kill(p);
        }
    }

    /// A dead registration is a dead client only if this manager saw its owner, alive, holding
    /// the slot's lock. A slot naming a pid nobody has any more, written by another ledger
    /// client (never holding its lock) and rewritten with a new start time at every check, is
    /// no fault; before, each rewrite was a new `client_died`, first of every check, whose
    /// recovery waited 500 ms for it and left every other fault of the check unrecovered. A
    /// real offline client seen alive that dies is one, once.
    #[test]
    fn a_dead_registration_is_a_client_only_if_its_owner_was_seen_holding_its_lock() {
        use std::sync::atomic::Ordering::Relaxed;
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let daemon = m.ensure_daemon().unwrap();
        let g = m.ledger.group(7, 1 << 30).unwrap();
        let mut gone = sleeper();
        let h = m.ledger.register(gone.id(), g).unwrap();
        gone.kill().unwrap();
        gone.wait().unwrap();
        let start = m.ledger.layout().procs[h.slot].start_time.load(Relaxed);
        for i in 1..=5 {
            m.ledger.layout().procs[h.slot].start_time.store(start + i, Relaxed);
            let faults = m.check(i * 100);
            assert!(faults.is_empty(), "rewrite {i}: {faults:?}");
        }
        let (mut c, _) = offline_client(&m);
        let pid = c.id();
        assert!(m.check(600).is_empty(), "seen alive");
        c.kill().unwrap();
        c.wait().unwrap();
        assert_eq!(m.check(700), vec![Fault::ClientDied { pid }]);
        assert!(m.check(800).is_empty(), "once");
        m.ledger.unregister(h);
        kill(daemon);
    }

    /// Two containers' processes with the same pid in their namespaces (1) and the same start
    /// time (started in one clock tick), both MPS clients: the monitor's eviction of one has its
    /// MPS work ended before the SIGKILL, never the other's. Before, the eviction named pid and
    /// start time only, and the first registration with both was taken: the other container's
    /// client was terminated. An entry without the namespace (an older monitor) names neither.
    #[test]
    fn terminate_before_kill_ends_the_evicted_containers_client_not_its_twins() {
        use node_daemon::monitor_state::PendingEviction;
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("commands");
        let mut m = manager_answering(d.path(), &format!("cat >> '{}'\n", log.display()));
        // Two processes that started in the same clock tick (10 ms): back to back, most tries.
        let (mut a, mut b, st) = loop {
            let (mut a, mut b) = (sleeper(), sleeper());
            let (sa, sb) = (node_ledger::procinfo::start_time(a.id()), node_ledger::procinfo::start_time(b.id()));
            if let Some(st) = sa.filter(|_| sa == sb) {
                break (a, b, st);
            }
            for c in [&mut a, &mut b] {
                let _ = c.kill();
                let _ = c.wait();
            }
        };
        let snap = |pid: u32, pid_ns: u64| registration(0, pid, pid_ns, st);
        let (ns_a, ns_b) = (m.own_ns ^ 1, m.own_ns ^ 2);
        // As the ledgers name them (pid 1 of each container), and as the manager found them here.
        let raw = [snap(1, ns_a), snap(1, ns_b)];
        let here = [snap(a.id(), m.own_ns), snap(b.id(), m.own_ns)];
        let clients = BTreeMap::from([(9, vec![a.id(), b.id()])]);
        let evict = |pid_ns| PendingEviction { pid: 1, pid_ns, start_time: st, requested_mono_ms: 0, kill_at_mono_ms: Some(mono_ms()) };
        m.terminate_before_kill(&clients, &[evict(None)], &raw, &here);
        m.terminate_before_kill(&clients, &[evict(Some(ns_b))], &raw, &here);
        m.terminate_before_kill(&clients, &[evict(Some(ns_b))], &raw, &here);
        let sent = std::fs::read_to_string(&log).unwrap_or_default();
        for c in [&mut a, &mut b] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert_eq!(sent, format!("terminate_client 9 {}\n", b.id()), "once, the evicted container's client alone");
        assert_eq!(m.state.terminated_before_kill, 1);
    }

    /// A registration of group 1 in `slot`, as a ledger names it (nothing else reported).
    fn registration(slot: usize, pid: u32, pid_ns: u64, start_time: u64) -> node_ledger::ProcSnapshot {
        node_ledger::ProcSnapshot { slot, pid, start_time, pid_ns, group_id: 1, ..Default::default() }
    }

    /// A copy of an evicted process's identity in another slot (any ledger client can write
    /// one) is not found here, and leaves the genuine registration the one the eviction names:
    /// it is terminated on MPS before its kill. Before (found in review), the two matches made
    /// the eviction ambiguous, and the process was SIGKILLed with its kernels in flight.
    #[test]
    fn a_copied_identity_does_not_keep_the_evicted_client_from_terminate_before_kill() {
        use node_daemon::monitor_state::PendingEviction;
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("commands");
        let mut m = manager_answering(d.path(), &format!("cat >> '{}'\n", log.display()));
        let mut a = sleeper();
        let st = node_ledger::procinfo::start_time(a.id()).unwrap();
        let ns = m.own_ns ^ 1;
        let snap = |slot: usize, pid: u32, pid_ns: u64| registration(slot, pid, pid_ns, st);
        // The genuine slot (found here) and a copy in slot 5 (not found: its own namespace kept).
        let raw = [snap(0, 1, ns), snap(5, 1, ns)];
        let here = [snap(0, a.id(), m.own_ns), snap(5, 1, ns)];
        let clients = BTreeMap::from([(9, vec![a.id()])]);
        let evict = PendingEviction { pid: 1, pid_ns: Some(ns), start_time: st, requested_mono_ms: 0, kill_at_mono_ms: Some(mono_ms()) };
        m.terminate_before_kill(&clients, &[evict], &raw, &here);
        let sent = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = a.kill();
        let _ = a.wait();
        assert_eq!(sent, format!("terminate_client 9 {}\n", a.id()));
    }

    /// Every fault of one check is recovered from, not only the first: a crashed server (its
    /// servers ended alone, the others' clients kept) and then a dead client another server
    /// still lists (terminated). Before, the first fault of the list (a dead client) alone got
    /// a recovery and the crash was lost.
    #[test]
    fn every_fault_of_a_check_is_recovered_from_not_only_the_first() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager_with_a_server(d.path());
        m.cfg.evict_grace_ms = 100;
        let daemon = m.ensure_daemon().unwrap();
        let mut dead = Command::new("true").spawn().unwrap();
        let pid = dead.id();
        dead.wait().unwrap();
        std::fs::write(d.path().join("pipe").join("clients"), format!("{pid}\n")).unwrap();
        m.handle_faults(mono_ms(), vec![Fault::ClientDied { pid }, Fault::ServerCrash { server: 1 }]);
        let r: Vec<(String, String)> = m.state.recoveries.iter().map(|r| (r.fault.kind().to_string(), r.outcome.clone())).collect();
        kill(daemon);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].0 == "server_crash" && r[0].1.contains("MPS server 1 gone"), "{r:?}");
        assert!(r[1].0 == "client_died" && r[1].1.contains(&format!("terminate_client [(4242, {pid})]")), "{r:?}");
    }

    /// The pipe directory is in offline containers' mounts: a root tenant can remove the pid
    /// file or write junk into it. The daemon the manager recorded still runs, so no check
    /// sees it dead (that was a full MPS reset, every client's context lost); the file's
    /// change is warned once, and its return said.
    #[test]
    fn a_removed_or_rewritten_pid_file_is_no_dead_daemon() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager_answering(d.path(), "cat >/dev/null\n");
        let daemon = m.ensure_daemon().unwrap();
        assert!(m.check(mono_ms()).is_empty());
        let file = d.path().join("pipe").join(crate::control::PID_FILE);
        let mut bystander = sleeper();
        for junk in [None, Some("garbage\n".to_string()), Some(format!("{}\n", bystander.id()))] {
            match &junk {
                None => std::fs::remove_file(&file).unwrap(),
                Some(j) => std::fs::write(&file, j).unwrap(),
            }
            let (faults, text) = logs_of(|| [m.check(mono_ms()), m.check(mono_ms())].concat());
            assert!(faults.is_empty(), "pid file {junk:?}: {faults:?}");
            assert_eq!(m.recorded_daemon().map(|d| d.pid), Some(daemon));
            assert_eq!(m.state.daemon_pid, Some(daemon));
            assert!(!m.daemon_died());
            let warned = text.matches("no longer names the control daemon").count();
            assert_eq!(warned, usize::from(junk.is_none()), "warned once, not at every check: {text}");
        }
        std::fs::write(&file, format!("{daemon}\n")).unwrap();
        let (faults, text) = logs_of(|| m.check(mono_ms()));
        assert!(faults.is_empty() && text.contains("names the control daemon again"), "{faults:?} {text}");
        let _ = bystander.kill();
        let _ = bystander.wait();
        kill(daemon);
    }

    /// A targeted recovery of stuck clients that worked ends its episode: a `ClientsStuck`
    /// long after it (days, in production) is a new episode, met with the targeted step
    /// again; one within [`stuck_episode_ms`] means the targeted step did not help, and the
    /// servers are ended. Before, the first targeted recovery armed the escalation for good.
    #[test]
    fn stuck_clients_escalate_only_within_the_episode_of_a_targeted_recovery() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager_with_a_server(d.path());
        m.cfg.recovery.min_interval_ms = 0;
        m.cfg.evict_grace_ms = 100;
        let daemon = m.ensure_daemon().unwrap();
        let mut children = Vec::new();
        let mut stuck_at = |m: &mut Manager, now: u64| {
            let (c, _) = offline_client(m);
            std::fs::write(d.path().join("pipe").join("clients"), format!("{}\n", c.id())).unwrap();
            let pid = c.id();
            children.push(c);
            m.recover(now, Fault::ClientsStuck { for_ms: 1, pids: vec![pid] });
            m.state.recoveries.last().unwrap().outcome.clone()
        };
        let episode = stuck_episode_ms(&m.cfg);
        let t0 = mono_ms();
        let r = stuck_at(&mut m, t0);
        assert!(r.contains("terminate_client") && r.contains("MPS not reset"), "{r}");
        let later = t0 + 10 * episode + 1;
        let r = stuck_at(&mut m, later);
        assert!(r.contains("terminate_client") && r.contains("MPS not reset"), "a new episode escalated: {r}");
        let r = stuck_at(&mut m, later + episode);
        assert!(!r.contains("MPS not reset"), "within the episode, not escalated: {r}");
        for mut c in children {
            let _ = c.kill();
            let _ = c.wait();
        }
        kill(daemon);
        if let Some(p) = m.recorded_daemon() {
            kill(p.pid);
        }
    }

    /// A slot's sync counts are its writer's word (pod ledgers are tenant-writable): one sync
    /// begun and none returned in the slot of a process of another pid namespace (its pid here
    /// unknown), or of a process found here that no MPS server lists, on a quiet GPU with the
    /// online client connected, is no stuck client. Before, the check called it
    /// `clients_stuck`, the recovery found nothing to terminate and ended every MPS server
    /// (`shutdown_server -f`), the online service's context with them.
    #[test]
    fn a_waiting_slot_mps_does_not_list_never_ends_the_servers() {
        use std::sync::atomic::Ordering::Relaxed;
        for foreign in [true, false] {
            let d = tempfile::tempdir().unwrap();
            let mut m = manager_with_a_server(d.path());
            m.cfg.evict_grace_ms = 100;
            let daemon = m.ensure_daemon().unwrap();
            let pipe = d.path().join("pipe");
            let online = sleeper();
            std::fs::write(pipe.join("clients"), format!("{}\n", online.id())).unwrap();
            let (unlisted, h) = if foreign {
                // This test process's slot, rewritten to name another pid namespace.
                let g = m.ledger.group(7, 1 << 30).unwrap();
                let h = m.ledger.register(std::process::id(), g).unwrap();
                m.ledger.layout().procs[h.slot].pid_ns.store(m.own_ns ^ 1, Relaxed);
                (None, h)
            } else {
                let (c, h) = offline_client(&m);
                (Some(c), h)
            };
            m.ledger.set_syncs(h, 1, 0);
            let t0 = mono_ms();
            let mut faults = m.check(t0);
            let later = t0 + m.cfg.detect.stuck_after_ms + 1;
            faults.extend(m.check(later));
            m.handle_faults(later, faults.clone());
            // Nor is such a fault, within the episode of a targeted stuck recovery (which ends
            // the servers at once), a reason to end them.
            let named = unlisted.as_ref().map_or(std::process::id(), |c| c.id());
            m.escalate_stuck_until = Some(u64::MAX);
            m.recover(later, Fault::ClientsStuck { for_ms: 1, pids: vec![named] });
            let restarted = m
                .state
                .recoveries
                .iter()
                .find(|r| r.outcome.contains("shutdown_server") || r.outcome.contains("MPS reset"))
                .cloned();
            let server_up = !pipe.join("down").exists();
            if foreign {
                m.ledger.unregister(h);
            }
            for mut c in [Some(online), unlisted].into_iter().flatten() {
                let _ = c.kill();
                let _ = c.wait();
            }
            kill(daemon);
            if let Some(p) = m.recorded_daemon() {
                kill(p.pid);
            }
            let case = if foreign { "another pid namespace's slot" } else { "a process no server lists" };
            assert_eq!(restarted, None, "{case}: the servers were ended ({faults:?})");
            assert!(server_up, "{case}: the server was shut down");
            assert!(faults.is_empty(), "{case}: {faults:?}");
        }
    }

    /// The pipe directory is mounted into offline containers: one running as root can write
    /// any host pid into the daemon's pid file. A process not named as an MPS process, or an
    /// MPS process started for another pipe directory (another GPU's control daemon), is never
    /// taken for the daemon, so never signalled: the manager starts its own daemon, and a reset
    /// leaves the named process alone.
    #[test]
    fn a_pid_file_naming_no_daemon_of_this_pipe_dir_is_never_adopted_nor_signalled() {
        let d = tempfile::tempdir().unwrap();
        let other_pipe = d.path().join("gpu1-pipe");
        std::fs::create_dir_all(&other_pipe).unwrap();
        let bystanders = [sleeper(), crate::control::spawn_mps_named(&other_pipe, Some(&other_pipe))];
        for mut bystander in bystanders {
            let mut m = manager(d.path());
            std::fs::create_dir_all(d.path().join("pipe")).unwrap();
            std::fs::write(d.path().join("pipe").join(crate::control::PID_FILE), format!("{}\n", bystander.id())).unwrap();
            assert_eq!(m.ctl.daemon_identity(), None, "pid {} taken for the daemon", bystander.id());
            let daemon = m.ensure_daemon().unwrap();
            assert_ne!(daemon, bystander.id());
            let second = m.reset_mps().unwrap();
            assert_ne!(second, bystander.id());
            std::thread::sleep(Duration::from_millis(50));
            assert!(bystander.try_wait().unwrap().is_none(), "the bystander was signalled");
            let _ = bystander.kill();
            let _ = bystander.wait();
            kill(daemon);
            kill(second);
        }
    }

    /// The recorded daemon is gone and an operator started another for this pipe directory by
    /// hand: the check adopts it (no fault), and it is what the manager records.
    #[test]
    fn a_daemon_restarted_by_hand_is_adopted() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let first = m.ensure_daemon().unwrap();
        assert!(m.check(mono_ms()).is_empty());
        kill(first);
        let by_hand = m.ctl.start_daemon().unwrap();
        let (faults, text) = logs_of(|| m.check(mono_ms()));
        assert!(faults.is_empty(), "{faults:?}");
        assert!(text.contains("adopted"), "{text}");
        assert_eq!(m.recorded_daemon().map(|d| d.pid), Some(by_hand));
        assert_eq!(m.state.daemon_pid, Some(by_hand));
        kill(by_hand);
    }

    /// A control program whose daemon is not named as NVIDIA's (a `control_bin` that is no
    /// `nvidia-cuda-mps-control`): the error says so, not that it exited.
    #[test]
    fn a_started_daemon_not_named_as_mps_is_refused_saying_why() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        std::fs::write(
            d.path().join("ctl.sh"),
            "#!/bin/sh\nif [ \"$1\" = -d ]; then\n  sleep 30 </dev/null >/dev/null 2>&1 &\n  \
             echo $! > \"$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid\"\nfi\n",
        )
        .unwrap();
        let e = m.ensure_daemon().unwrap_err().to_string();
        assert!(e.contains("is named `sleep`") && e.contains("nvidia-cuda-mps") && e.contains("ctl.sh"), "{e}");
        if let Some(pid) = m.ctl.pid_file_pid() {
            // SAFETY: kill(2) of the stand-in this test's control program started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }

    /// The control daemon dies while the recovery rate limit holds resets back. The state file
    /// stops naming it at the first check that sees it dead (node-agent then makes the GPU's
    /// offline slots Unhealthy and refuses Allocate, `node_agent::mps`). With no MPS server
    /// left, a new daemon is started at once whatever the limit: it ends nothing. Before, none
    /// ran until the limit allowed the reset (up to an hour), and meanwhile a process
    /// initialising CUDA took the bare GPU. A dead daemon beside a server that still runs
    /// stays rate-limited, and that server is not touched.
    #[test]
    fn a_dead_daemon_is_unpublished_at_once_and_started_again_past_the_rate_limit() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        m.cfg.recovery.min_interval_ms = 3_600_000;
        m.ensure_daemon().unwrap();
        let t0 = mono_ms();
        // One recovery uses up the limiter (and starts a new daemon).
        m.recover(t0, Fault::DaemonHang { command: "get_server_list".into() });
        let dead_and_checked = |m: &mut Manager, now: u64| {
            assert_eq!(m.state.daemon_pid, m.recorded_daemon().map(|d| d.pid));
            let daemon = kill_recorded_daemon(m);
            let faults = m.check(now);
            assert_eq!(faults, vec![Fault::DaemonDead]);
            let path = m.cfg.state_file.clone();
            m.write_state(&path);
            let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            assert!(written["daemon_pid"].is_null() && written["daemon_start_time"].is_null(), "{written}");
            m.handle_faults(now, faults);
            daemon
        };
        let first = dead_and_checked(&mut m, t0 + 1);
        let again = m.recorded_daemon().expect("a new daemon started past the rate limit");
        assert_ne!(again.pid, first.pid);
        assert!(node_ledger::procinfo::is_alive(again.pid, again.start_time));
        assert_eq!(m.state.daemon_pid, Some(again.pid), "published again");
        assert_eq!((m.state.daemons_started_past_limit, m.state.suppressed_recoveries), (1, 0));
        // A server of the last look still runs: its clients would be lost to a reset, which
        // stays rate-limited; the server is left alone.
        let mut server = sleeper();
        let st = node_ledger::procinfo::start_time(server.id()).unwrap();
        m.servers_seen = vec![DaemonId { pid: server.id(), start_time: st }];
        dead_and_checked(&mut m, t0 + 2);
        let left_alone = server.try_wait().unwrap().is_none();
        let _ = server.kill();
        let _ = server.wait();
        assert_eq!(m.state.daemon_pid, None, "no daemon started beside a live server");
        assert_eq!((m.state.daemons_started_past_limit, m.state.suppressed_recoveries), (1, 1));
        assert!(left_alone, "the server was signalled");
        // A daemon found again (restarted by hand) is published again.
        let by_hand = m.ctl.start_daemon().unwrap();
        assert!(m.check(t0 + 3).is_empty());
        assert_eq!(m.state.daemon_pid, Some(by_hand));
        kill(by_hand);
    }

    /// A control daemon that dies right after it starts, while the recovery rate limit holds:
    /// ten checks (and their fault handling) at the same moment start one daemon past the
    /// limit, not ten; the next waits for the backoff (1 s, then doubling). Before, each check
    /// started one, for ever. And an MPS server of this pipe directory the last listing never
    /// named (started since, orphaned by the dead daemon) keeps a new daemon from starting.
    #[test]
    fn daemons_dying_at_once_are_started_past_the_limit_with_backoff_and_never_beside_a_server() {
        let d = tempfile::tempdir().unwrap();
        let starts = d.path().join("starts");
        let mut m = manager_answering(d.path(), "cat >/dev/null
");
        // The stand-in daemon exits at once; each start is counted.
        std::fs::write(
            &m.cfg.control_bin,
            format!("#!/bin/sh
if [ \"$1\" = -d ]; then
  echo x >> '{}'
  exit 0
fi
cat >/dev/null
", starts.display()),
        )
        .unwrap();
        let count = || std::fs::read_to_string(&starts).map_or(0, |s| s.lines().count());
        m.cfg.recovery.min_interval_ms = 3_600_000;
        let t0 = mono_ms();
        m.recover(t0, Fault::DaemonHang { command: "get_server_list".into() });
        let before = count();
        let checks = |m: &mut Manager, now: u64| {
            for _ in 0..10 {
                let faults = m.check(now);
                m.handle_faults(now, faults);
            }
        };
        checks(&mut m, t0 + 1);
        assert_eq!((count() - before, m.state.daemons_started_past_limit), (1, 1), "one start past the limit, not one per check");
        checks(&mut m, t0 + 1 + PAST_LIMIT_BACKOFF_FIRST_MS - 1);
        assert_eq!(count() - before, 1, "the backoff holds");
        checks(&mut m, t0 + 1 + PAST_LIMIT_BACKOFF_FIRST_MS);
        assert_eq!(count() - before, 2, "started again once the backoff is over");
        checks(&mut m, t0 + 1 + 3 * PAST_LIMIT_BACKOFF_FIRST_MS - 1);
        assert_eq!(count() - before, 2, "the wait doubled");
        // An orphaned server of this pipe directory, which no listing named.
        std::fs::create_dir_all(d.path().join("srv")).unwrap();
        let mut server = crate::control::spawn_mps_named(&d.path().join("srv"), Some(&m.cfg.pipe_dir));
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while !m.ctl.live_mps_processes().contains(&server.id()) {
            assert!(std::time::Instant::now() < end, "the stand-in server is never seen");
            std::thread::sleep(Duration::from_millis(5));
        }
        checks(&mut m, t0 + 1 + PAST_LIMIT_BACKOFF_MAX_MS * 10);
        let _ = server.kill();
        let _ = server.wait();
        assert_eq!(count() - before, 2, "no daemon started beside a live server");
        checks(&mut m, t0 + 1 + PAST_LIMIT_BACKOFF_MAX_MS * 11);
        assert_eq!(count() - before, 3, "the server gone, started again");
    }

    /// A control daemon that dies between two checks is noticed at the next tick, once: the
    /// check that sees it dead (and replaces it) clears the early call.
    #[test]
    fn a_dead_daemon_calls_for_a_check_once() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        assert!(!m.daemon_died(), "no daemon yet");
        let first = m.ensure_daemon().unwrap();
        assert!(!m.daemon_died(), "not seen running by a check yet");
        let faults = m.check(mono_ms());
        assert!(faults.is_empty(), "{faults:?}");
        assert!(!m.daemon_died());
        kill(first);
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while !m.daemon_died() {
            assert!(std::time::Instant::now() < end, "its death never called for a check");
            std::thread::sleep(Duration::from_millis(5));
        }
        let faults = m.check(mono_ms());
        assert_eq!(faults, vec![Fault::DaemonDead]);
        assert!(!m.daemon_died(), "once per death");
    }

    #[test]
    fn a_hung_daemon_is_killed_as_recorded_and_replaced() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let first = m.ensure_daemon().unwrap();
        let id = m.recorded_daemon().unwrap();
        assert_eq!(id.pid, first);
        assert_eq!(m.state.daemon_start_time, Some(id.start_time));
        let second = m.reset_mps().unwrap();
        assert!(!node_ledger::procinfo::is_alive(id.pid, id.start_time), "old daemon killed");
        assert_ne!(second, first);
        assert!(m.state.last_error.is_none(), "{:?}", m.state.last_error);
        kill(second);
    }

    /// A child of this test traced by a thread of its own with `PTRACE_O_TRACEEXIT`, so that,
    /// SIGKILLed, it stops at its exit (`PTRACE_EVENT_EXIT`): the signal taken and its exit
    /// begun, yet not a zombie (`/proc` shows it in state `t`) and its descriptors still open.
    /// That is what a control daemon still dying is to the manager (one in an uninterruptible
    /// driver call when killed, or freeing its memory): alive by pid + start time, and holding
    /// its listening control socket, where a connection still succeeds into the backlog. It is
    /// held there `hold` after the stop (`None`: until [`Traced::finish`] or a drop), then
    /// goes on dying.
    struct Traced {
        child: Child,
        release: Option<std::sync::mpsc::Sender<()>>,
        /// Told when the child stops at its exit.
        stopped: std::sync::mpsc::Receiver<()>,
        /// Whether the child was held at its exit, and whether the tracer reaped it.
        tracer: Option<std::thread::JoinHandle<(bool, bool)>>,
    }

    impl Traced {
        /// `Err` says why this process cannot trace its child (ptrace refused: a seccomp
        /// profile, Yama).
        fn seize(mut child: Child, hold: Option<Duration>) -> Result<Traced, String> {
            use std::sync::mpsc::{channel, TryRecvError};
            let pid = child.id() as libc::pid_t;
            let (seized_tx, seized) = channel();
            let (release, released) = channel::<()>();
            let (stopped_tx, stopped) = channel();
            // Only the tracing thread may resume or detach its tracee: all of it runs there.
            let tracer = std::thread::spawn(move || {
                // SAFETY: ptrace(2) on a child of this process; `data` carries the options.
                let r = unsafe {
                    libc::ptrace(libc::PTRACE_SEIZE, pid, std::ptr::null_mut::<libc::c_void>(), libc::PTRACE_O_TRACEEXIT as libc::c_ulong)
                };
                let _ = seized_tx.send((r == 0).then_some(()).ok_or_else(|| std::io::Error::last_os_error().to_string()));
                if r != 0 {
                    return (false, false);
                }
                let mut held: Option<std::time::Instant> = None;
                loop {
                    let mut st = 0;
                    // SAFETY: waitpid(2) on the traced child, without blocking.
                    let w = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG | libc::__WALL) };
                    if w == pid && libc::WIFSTOPPED(st) {
                        if st >> 8 == libc::SIGTRAP | (libc::PTRACE_EVENT_EXIT << 8) {
                            held = Some(std::time::Instant::now());
                            let _ = stopped_tx.send(());
                        } else {
                            // Any other stop (a signal on its way): the signal is passed on.
                            // SAFETY: ptrace(2) on the tracee, stopped.
                            unsafe {
                                libc::ptrace(libc::PTRACE_CONT, pid, std::ptr::null_mut::<libc::c_void>(), libc::WSTOPSIG(st) as libc::c_ulong)
                            };
                        }
                    } else if w != 0 {
                        // Exited (reaped here), or no longer a child to wait for.
                        return (held.is_some(), w == pid);
                    }
                    let told = !matches!(released.try_recv(), Err(TryRecvError::Empty));
                    let over = held.zip(hold).is_some_and(|(at, hold)| at.elapsed() >= hold);
                    if told || over {
                        if held.is_some() {
                            // SAFETY: ptrace(2) on the tracee, stopped at its exit: it goes on.
                            unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, std::ptr::null_mut::<libc::c_void>(), 0 as libc::c_ulong) };
                        }
                        // A tracee still running is detached as this thread ends.
                        return (held.is_some(), false);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            match seized.recv() {
                Ok(Ok(())) => Ok(Traced { child, release: Some(release), stopped, tracer: Some(tracer) }),
                r => {
                    let _ = tracer.join();
                    let _ = child.kill();
                    let _ = child.wait();
                    Err(r.map_or_else(|e| e.to_string(), |r| r.unwrap_err()))
                }
            }
        }

        /// Releases the child (if held), kills and reaps it; whether it was held at its exit.
        fn finish(mut self) -> bool {
            self.end()
        }

        fn end(&mut self) -> bool {
            let Some(tracer) = self.tracer.take() else { return false };
            drop(self.release.take());
            let (held, reaped) = tracer.join().unwrap_or((false, false));
            if !reaped {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
            held
        }
    }

    impl Drop for Traced {
        fn drop(&mut self) {
            self.end();
        }
    }

    /// A stand-in control daemon of `m`'s pipe directory (named as NVIDIA's, started for that
    /// directory), the only holder of the listening control socket, adopted through the pid
    /// file as the daemon `m` runs, and traced ([`Traced`], with `hold`). `None` (said why)
    /// where this process cannot trace its children, or a SIGKILLed tracee does not stop at
    /// its exit.
    fn dying_daemon(m: &mut Manager, dir: &Path, hold: Option<Duration>) -> Option<(Traced, DaemonId)> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        // Whether a SIGKILLed tracee stops at its exit here, on a bystander.
        let probe = Traced::seize(sleeper(), None).and_then(|t| {
            // SAFETY: kill(2) of the sleeper this test started, not reaped yet.
            unsafe { libc::kill(t.child.id() as i32, libc::SIGKILL) };
            let stopped = t.stopped.recv_timeout(Duration::from_secs(5)).is_ok();
            (t.finish() && stopped).then_some(()).ok_or_else(|| "a SIGKILLed tracee does not stop at PTRACE_EVENT_EXIT".to_string())
        });
        if let Err(e) = probe {
            eprintln!("skipped: no control daemon still dying can be made here: {e}");
            return None;
        }
        let pipe = m.cfg.pipe_dir.clone();
        std::fs::create_dir_all(&pipe).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(pipe.join("control")).unwrap();
        let fd = listener.as_raw_fd();
        // The socket as its descriptor 3, which its sleep does not get (the socket is the
        // daemon's alone: gone with it).
        let bin = dir.join("dying");
        std::fs::create_dir_all(&bin).unwrap();
        let bin = bin.join("nvidia-cuda-mps-control");
        std::fs::write(&bin, "#!/bin/sh\nsleep 30 3<&-\n").unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cmd = Command::new(&bin);
        cmd.env("CUDA_MPS_PIPE_DIRECTORY", &pipe);
        // SAFETY: dup2(2) and fcntl(2) on a descriptor of the child, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if fd == 3 {
                    libc::fcntl(fd, libc::F_SETFD, 0);
                } else {
                    libc::dup2(fd, 3);
                }
                Ok(())
            })
        };
        let child = cmd.spawn().unwrap();
        drop(listener);
        let pid = child.id();
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while !crate::control::is_mps_process(pid) {
            assert!(std::time::Instant::now() < end, "the stand-in daemon never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::fs::write(pipe.join(crate::control::PID_FILE), format!("{pid}\n")).unwrap();
        assert_eq!(m.ensure_daemon().unwrap(), pid, "the stand-in is the daemon the manager runs");
        let id = m.recorded_daemon().unwrap();
        let traced = Traced::seize(child, hold).unwrap();
        assert_eq!(m.ctl.socket_daemon(), Some(id), "the stand-in is found by the socket, as a daemon without pid file is");
        Some((traced, id))
    }

    /// A control daemon that does not answer is killed by the reset; one still dying then
    /// (SIGKILL taken, not gone yet) holds its control socket, where the adoption without a
    /// pid file ([`MpsControl::socket_daemon`]; the reset removes the file) finds it. Before
    /// 0058ef6 the reset, 50 ms after the SIGKILL, adopted it as the new daemon: a recovery
    /// that recovered nothing, and the next one rate-limited. The reset waits for it to be
    /// gone (`command_timeout_ms` at most) and then starts another; still there, it fails
    /// rather than adopt it.
    #[test]
    fn a_killed_daemon_still_dying_is_waited_for_and_never_adopted() {
        let refusing = "read cmd; echo \"Error: $cmd: no answer\"\n";
        // Dying past command_timeout_ms: the reset fails, adopting nothing.
        let d = tempfile::tempdir().unwrap();
        let mut m = manager_answering(d.path(), refusing);
        let Some((traced, dying)) = dying_daemon(&mut m, d.path(), None) else { return };
        let r = m.reset_mps();
        let alive = node_ledger::procinfo::is_alive(dying.pid, dying.start_time);
        assert!(traced.finish(), "the stand-in was not held at its exit: nothing was modelled");
        assert!(alive, "the stand-in died before the reset ended: nothing was modelled");
        if let Ok(pid) = r {
            kill(pid);
        }
        assert_ne!(r.as_ref().ok(), Some(&dying.pid), "the killed daemon, still dying, was adopted as the new one");
        let e = r.unwrap_err().to_string();
        assert!(e.contains("still running") && e.contains(&dying.pid.to_string()), "{e}");
        // Dying for a while, within command_timeout_ms: waited for, then another started.
        let d = tempfile::tempdir().unwrap();
        let mut m = manager_answering(d.path(), refusing);
        m.cfg.command_timeout_ms = 30_000;
        let Some((traced, dying)) = dying_daemon(&mut m, d.path(), Some(Duration::from_millis(300))) else { return };
        let r = m.reset_mps();
        let gone = !node_ledger::procinfo::is_alive(dying.pid, dying.start_time);
        assert!(traced.finish(), "the stand-in was not held at its exit: nothing was modelled");
        let new = r.expect("a new daemon once the killed one is gone");
        kill(new);
        assert_ne!(new, dying.pid, "the killed daemon, still dying, was adopted as the new one");
        assert!(gone, "the reset ended before the killed daemon was gone");
        assert_eq!(m.recorded_daemon().map(|d| d.pid), Some(new));
    }

    /// A daemon that runs but does not answer (a hang) is published as such at the first look
    /// that times out, whatever the rate limit does with its reset: node-agent then admits no
    /// container to the GPU.
    #[test]
    fn a_daemon_that_does_not_answer_is_published_as_such() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager_answering(d.path(), "sleep 5\n");
        let daemon = m.ensure_daemon().unwrap();
        let _ = m.check(mono_ms());
        m.write_state(&m.cfg.state_file.clone());
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&m.cfg.state_file).unwrap()).unwrap();
        assert_eq!(v["daemon_pid"], daemon, "it runs");
        let why = v["daemon_not_answering"].as_str().expect("published as not answering");
        assert!(why.contains(&daemon.to_string()) && why.contains("get_server_list"), "{why}");
        kill(daemon);
    }

    /// The daemon the manager recorded died and its pid now belongs to an unrelated process
    /// (same pid, another start time), which the pid file still names: the reset must not
    /// signal it, must say so, and must still bring MPS back.
    #[test]
    fn a_recycled_daemon_pid_is_never_signalled_and_recovery_goes_on() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manager(d.path());
        let first = m.ensure_daemon().unwrap();
        kill(first);
        let mut bystander = sleeper();
        let pid = bystander.id();
        let st = node_ledger::procinfo::start_time(pid).unwrap();
        std::fs::write(
            d.path().join("pipe").join(crate::control::PID_FILE),
            format!("{pid}\n"),
        )
        .unwrap();
        // What the manager recorded: this pid, but the process that had it then.
        m.daemon = Some(DaemonId { pid, start_time: st.wrapping_sub(1) });
        let new = m.reset_mps().expect("recovery starts a new daemon");
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            bystander.try_wait().unwrap().is_none(),
            "the process holding the recycled pid was signalled"
        );
        let err = m.state.last_error.clone().unwrap_or_default();
        assert!(err.contains("NOT signalled") && err.contains(&pid.to_string()), "{err}");
        assert_ne!(new, pid);
        assert_eq!(m.recorded_daemon().map(|d| d.pid), Some(new));
        bystander.kill().unwrap();
        bystander.wait().unwrap();
        kill(new);
    }
}
