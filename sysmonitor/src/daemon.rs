//! The `sysmonitor run` loop: schedule, signals (SIGHUP reload, SIGTERM stop), systemd
//! readiness and watchdog, state file, metrics endpoint, operator disable file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use node_daemon::clock::{boot_id, mono_ms};
use node_daemon::errlog::ErrorRun;
use node_daemon::evictor::PidfdSignaller;
use node_daemon::monitor_state;
use node_daemon::run::Service;
use node_daemon::sdnotify::Notifier;
use node_daemon::ConfigError;

use crate::config::{Config, NvmlPaceConfig};
use crate::health::Input;
use crate::ledger::{next_on_grid, LedgerAdapter};
use crate::monitor::{ChangeKey, Monitor};
use crate::report;
use crate::sampler::{GpuSample, GpuSource, NvmlSource, ProcMem};

/// NVML source that keeps retrying to open the device; until it opens, samples fail (so the
/// machine goes Disabled) rather than the daemon exiting.
pub struct RetryingNvml {
    index: u32,
    inner: Option<NvmlSource>,
    next_try_ms: u64,
    /// Why the last try to open it failed: what samples fail with until the next try (the
    /// same text, so the monitor's log of a run of failures sees one error, not two).
    open_error: String,
    /// Paces the source is opened with (and handed on reload).
    pace: NvmlPaceConfig,
}

impl RetryingNvml {
    /// A source for GPU `index`; the first sample tries to open NVML.
    pub fn new(index: u32) -> Self {
        RetryingNvml {
            index,
            inner: None,
            next_try_ms: 0,
            open_error: String::new(),
            pace: NvmlPaceConfig::default(),
        }
    }
}

impl RetryingNvml {
    /// The first sample, and every second until NVML opens. Kept out of line: `Nvml::init`
    /// needs several KiB of stack, and inlined into [`GpuSource::sample`] it gave that
    /// function a 12 KiB frame whose stack probe touched three pages at every sample.
    #[cold]
    #[inline(never)]
    fn open_and_sample(&mut self, now_ms: u64) -> Result<GpuSample, String> {
        if now_ms < self.next_try_ms {
            return Err(self.open_error.clone());
        }
        self.next_try_ms = now_ms + 1000;
        match NvmlSource::open(self.index, &self.pace) {
            Ok(s) => self.inner.insert(s).sample(now_ms),
            Err(e) => {
                self.open_error = format!("NVML unavailable (retried every second): {e}");
                Err(self.open_error.clone())
            }
        }
    }
}

impl GpuSource for RetryingNvml {
    fn sample(&mut self, now_ms: u64) -> Result<GpuSample, String> {
        match &mut self.inner {
            Some(s) => s.sample(now_ms),
            None => self.open_and_sample(now_ms),
        }
    }
    fn processes(&mut self) -> Result<Vec<ProcMem>, String> {
        self.inner.as_mut().ok_or("NVML unavailable")?.processes()
    }
    fn xids(&mut self) -> Vec<u64> {
        self.inner.as_mut().map(|s| s.xids()).unwrap_or_default()
    }
    fn set_pace(&mut self, pace: &NvmlPaceConfig) {
        self.pace = pace.clone();
        if let Some(s) = &mut self.inner {
            s.set_pace(pace);
        }
    }
}

/// File whose presence means "an operator disabled this GPU" (in the daemon-only directory:
/// no tenant creates or removes it).
pub fn operator_file(cfg: &Config) -> PathBuf {
    cfg.daemon_dir().join("disabled")
}

/// At the first start of a monitor that keeps its files in the daemon-only directory (no lock
/// file there yet), an operator's disable file left by an earlier version in the
/// container-visible `gpu<N>` directory is moved there: a GPU disabled before an upgrade stays
/// disabled. Never afterwards: from then on, a file there is nobody's request.
pub fn adopt_legacy_operator_file(cfg: &Config) {
    let legacy = cfg.ledger_path().with_file_name("disabled");
    if lock_file(cfg).exists() || !legacy.exists() {
        return;
    }
    let to = operator_file(cfg);
    match std::fs::create_dir_all(cfg.daemon_dir()).and_then(|()| std::fs::rename(&legacy, &to)) {
        Ok(()) => tracing::warn!(from = %legacy.display(), to = %to.display(), "the operator's disable file moved to the daemon-only directory (first start after an upgrade): the GPU stays disabled"),
        Err(e) => tracing::error!(from = %legacy.display(), to = %to.display(), error = %e, "cannot move the operator's disable file: the GPU is not disabled; run `sysmonitor disable`"),
    }
}

/// File whose presence asks the monitor to put a GPU Disabled by a critical XID back in
/// service (`sysmonitor enable`; the monitor removes it when it has looked).
pub fn enable_file(cfg: &Config) -> PathBuf {
    cfg.daemon_dir().join("enable")
}

/// This GPU's single-instance lock file, in its daemon-only directory (a tenant holding a
/// lock in the container-visible `gpu<N>` directory kept a restarted monitor from starting).
pub fn lock_file(cfg: &Config) -> PathBuf {
    cfg.daemon_dir().join("sysmonitor.lock")
}

/// Takes the per-GPU single-instance lock (a POSIX write lock on [`lock_file`], held for the
/// life of the returned file and released by the kernel when the process dies, however it
/// dies). A second `sysmonitor run` for the same GPU gets an error naming the holder's pid.
pub fn lock_instance(cfg: &Config) -> Result<std::fs::File, String> {
    node_daemon::instance::lock(
        &lock_file(cfg),
        &format!("sysmonitor for GPU {}", cfg.gpu_index),
    )
}

/// Makes way for a unix socket at `path`: removes a socket file no one listens on any more (a
/// monitor that died leaves its socket behind), never one a live process listens on (another
/// GPU's monitor given the same path) or a file that is no socket. The lock on `<path>.lock`,
/// returned to be held as long as the socket is served, keeps two monitors that start at once
/// from each removing the other's socket.
fn claim_socket_path(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::FileTypeExt;
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    let held = node_daemon::instance::lock(Path::new(&lock), &format!("monitor serving metrics on {}", path.display()))?;
    let shared = "each GPU's monitor needs its own socket (`{gpu}` in the path)";
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(held),
        Err(e) => return Err(e.to_string()),
        Ok(m) if !m.file_type().is_socket() => return Err("exists and is not a socket; not removed".into()),
        Ok(_) => {}
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(format!("another process listens on this socket; not removed ({shared})"));
    }
    std::fs::remove_file(path).map_err(|e| format!("stale socket not removed: {e}"))?;
    Ok(held)
}

/// Serves the latest Prometheus text over HTTP on TCP or a unix socket, one request at a time.
fn spawn_metrics(listen: &str, text: Arc<Mutex<String>>) -> Result<(), String> {
    fn serve(mut s: impl Read + Write, text: &Mutex<String>) {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        let body = text.lock().map(|t| t.clone()).unwrap_or_default();
        let _ = write!(
            s,
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{}",
            body.len(),
            body
        );
    }
    let spawned = if let Some(path) = listen.strip_prefix("unix:") {
        let held = claim_socket_path(Path::new(path))?;
        let l = std::os::unix::net::UnixListener::bind(path).map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                crate::filewatch::block_sigio_in_this_thread();
                let _held = held;
                for s in l.incoming().flatten() {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    serve(s, &text);
                }
            })
    } else {
        let l = std::net::TcpListener::bind(listen).map_err(|e| {
            format!("{e} (each GPU's monitor needs its own port: `host:PORT+{{gpu}}` is PORT plus the GPU index)")
        })?;
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                crate::filewatch::block_sigio_in_this_thread();
                for s in l.incoming().flatten() {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    serve(s, &text);
                }
            })
    };
    spawned.map(drop).map_err(|e| e.to_string())
}

/// What a restarted monitor takes over from the state file of its earlier run (same boot, same
/// GPU: the monotonic times are on the clock this run reads).
#[derive(Debug, Default, PartialEq)]
struct Resume {
    /// Overlimit entries in the window ([`crate::health::Machine::with_history`]).
    history: Vec<u64>,
    /// The earlier run was Overlimit: `Some(calm since)`, monotonic ms, when its hold was
    /// running, `Some(None)` when the metrics were still past a threshold at its last write.
    overlimit: Option<Option<u64>>,
    /// Its evictions in flight, with when they were requested ([`Monitor::resume`]).
    pending: Vec<monitor_state::PendingEviction>,
    /// The earlier run held the GPU Disabled for a critical XID: the code, and since when
    /// (monotonic ms; the file's time when it does not say).
    xid: Option<(u64, u64)>,
    /// The earlier run went Disabled (XID, NVML errors) in the middle of an Overlimit hold:
    /// that hold is still to be served.
    interrupted_hold: bool,
}

/// Reads what [`Resume`] holds from `cfg.state_file`. A restart (the OOM killer, the watchdog,
/// `systemctl restart`) in the middle of an Overlimit hold must not end the hold: the online
/// workload that overloaded the GPU is protected for the rest of it, and the stay counts as
/// one entry, not two. Nor may it put a GPU Disabled by a critical XID back in service.
fn resume(cfg: &Config) -> Resume {
    let read = node_daemon::state_file::read_json_if_present::<monitor_state::MonitorState>(
        &cfg.state_file,
    );
    match read {
        Err(e) => {
            // tmpfs and atomic renames make this a hostile or broken host, not a crash: say
            // what cannot be taken over rather than start as if nothing had happened.
            tracing::error!(
                error = %e,
                "the state file of the earlier monitor run is unreadable: an Overlimit hold, a \
                 critical XID's Disabled or the grace of evictions in flight it recorded cannot \
                 be resumed (check the GPU; `sysmonitor disable` keeps offline work off it); the \
                 file is rewritten from this run's state"
            );
            Resume::default()
        }
        Ok(Some(s)) if s.boot_id == boot_id() && s.gpu == cfg.gpu_index => {
            tracing::info!(
                entries = s.overlimit_entries_mono_ms.len(),
                "resumed Overlimit history from the state file"
            );
            // Disabled in the middle of an Overlimit hold: by an XID, resumed Disabled and the
            // hold served after it; by NVML errors (a restart starts afresh from Init), the
            // hold resumed as Overlimit from the first calm sample: never admitted at once.
            let interrupted_hold = s.state == crate::health::State::Disabled && s.hold_interrupted;
            let nvml_interrupted = interrupted_hold && s.disabled_by == Some(monitor_state::DisableCause::Nvml);
            let overlimit = if nvml_interrupted { Some(None) } else { (s.state == crate::health::State::Overlimit).then(|| {
                // The hold had run for `hold_ms - remaining` at the last write.
                s.hold_remaining_ms.map(|r| {
                    s.updated_mono_ms
                        .saturating_sub(s.hold_ms.saturating_sub(r))
                })
            }) };
            let xid = match (s.state, s.disabled_by) {
                (crate::health::State::Disabled, Some(monitor_state::DisableCause::Xid(c))) => {
                    Some((c, s.disabled_since_mono_ms.unwrap_or(s.updated_mono_ms)))
                }
                // The XID an operator's Disabled hid: Disabled by it from the start (the
                // operator's file, looked at next, puts the operator's Disabled over it again).
                (crate::health::State::Disabled, Some(monitor_state::DisableCause::Operator)) => s.xid_under_operator,
                _ => None,
            };
            Resume {
                history: s.overlimit_entries_mono_ms,
                overlimit,
                pending: s.evictions_pending,
                xid,
                interrupted_hold: interrupted_hold && xid.is_some(),
            }
        }
        Ok(_) => Resume::default(),
    }
}

/// Longest time between two looks at the operator's disable file and the ledger's count of
/// registered offline processes, ms (`state_file_every_ms` when that is shorter).
pub const HOUSEKEEPING_MS: u64 = 100;

/// The monitor as a [`Service`] of the shared run/reload loop. Generic over the GPU source so
/// the loop runs in unit tests; production uses [`RetryingNvml`].
struct MonitorService<G: GpuSource> {
    cfg: Config,
    base: PathBuf,
    files: Vec<PathBuf>,
    mon: Monitor<G, LedgerAdapter, PidfdSignaller>,
    metrics_text: Arc<Mutex<String>>,
    config_error: Option<String>,
    reloads: u64,
    ready: bool,
    /// Next look at the operator file and the offline count ([`HOUSEKEEPING_MS`]).
    next_housekeeping: u64,
    /// Next unconditional rewrite of the state file (`state_file_every_ms` after the last one).
    next_heartbeat: u64,
    /// What the state file last written says that readers act on (with whether the ledger
    /// was damaged); `None` forces a write at the next tick (start, reload).
    written: Option<(ChangeKey, bool)>,
    next_tick: u64,
    /// The sampling interval of the last tick ([`Monitor::sampling_ms`]), for its log line.
    pace: u64,
    operator_path: PathBuf,
    operator_disabled: bool,
    /// [`enable_file`].
    enable_path: PathBuf,
    start_ledger_error: Option<String>,
    /// The log lines of a run of failed state-file writes (a read-only or full directory).
    state_write: ErrorRun,
}

impl<G: GpuSource> MonitorService<G> {
    fn new(
        cfg: Config,
        base: &Path,
        files: Vec<PathBuf>,
        mon: Monitor<G, LedgerAdapter, PidfdSignaller>,
        start_ledger_error: Option<String>,
    ) -> Self {
        let cfg_interval = cfg.interval_ms;
        MonitorService {
            operator_path: operator_file(&cfg),
            enable_path: enable_file(&cfg),
            cfg,
            base: base.to_path_buf(),
            files,
            mon,
            metrics_text: Arc::new(Mutex::new(String::new())),
            config_error: None,
            reloads: 0,
            ready: false,
            next_housekeeping: 0,
            next_heartbeat: 0,
            written: None,
            next_tick: mono_ms(),
            pace: cfg_interval,
            operator_disabled: false,
            start_ledger_error,
            state_write: ErrorRun::default(),
        }
    }

    fn snapshot(&mut self, now: u64) -> monitor_state::MonitorState {
        let names: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
        let mut snap = self
            .mon
            .snapshot(now, &names, self.config_error.clone(), self.reloads);
        snap.ledger_error = self
            .mon
            .ledger
            .check(now)
            .map(str::to_owned)
            .or_else(|| self.start_ledger_error.clone());
        snap.status_file_error = self.mon.ledger.status_error().map(str::to_owned);
        snap.pod_ledgers = self.mon.ledger.pod_ledgers();
        snap.pod_ledgers_refused = self.mon.ledger.refused_pod_ledgers();
        snap
    }

    /// The slow checks: the operator's disable file (one `stat`) and the ledger's count of
    /// registered offline processes (a scan of its slots), every [`HOUSEKEEPING_MS`] rather
    /// than every (possibly 1 ms) tick; and the systemd watchdog keep-alive.
    fn housekeeping(&mut self, now: u64, notifier: &Notifier) {
        let disabled_now = self.operator_path.exists();
        if disabled_now != self.operator_disabled {
            self.operator_disabled = disabled_now;
            self.mon.input(
                now,
                if disabled_now {
                    Input::OperatorDisable
                } else {
                    Input::OperatorEnable
                },
            );
            if let (false, Some(monitor_state::DisableCause::Xid(xid))) = (disabled_now, self.mon.machine.disabled_by()) {
                tracing::error!(
                    gpu = self.cfg.gpu_index,
                    xid,
                    "operator enabled the GPU, but it stays Disabled for the critical XID reported \
                     before or during the operator's disable (`sysmonitor enable` again ends that)"
                );
            }
        }
        if self.enable_path.exists() {
            // `sysmonitor enable` of a GPU Disabled by an XID (no operator file to remove);
            // after the operator file's removal, so that two `enable`s run back to back (the
            // operator's disable, then the XID it hid) both count.
            let _ = std::fs::remove_file(&self.enable_path);
            if self.mon.machine.state() == crate::health::State::Disabled && !self.operator_disabled {
                self.mon.input(now, Input::OperatorEnable);
            }
        }
        self.mon.refresh_offline(now);
        if self.ready && notifier.watchdog_usec.is_some() {
            notifier.notify("WATCHDOG=1");
        }
    }

    /// Writes the state file (atomically) and the metrics text, and tells systemd.
    fn report(&mut self, now: u64, notifier: &Notifier) {
        let snap = self.snapshot(now);
        let cfg = &self.cfg;
        node_daemon::state_file::log_write(
            &mut self.state_write,
            now,
            &cfg.state_file,
            monitor_state::write(&cfg.state_file, &snap),
            "its readers (mps-manager, sysmonitor status, the matcher)",
        );
        if cfg.metrics_listen.is_some() {
            if let Ok(mut t) = self.metrics_text.lock() {
                *t = report::prometheus(&snap);
            }
        }
        if !self.ready {
            self.ready = true;
            notifier.notify("READY=1");
        }
        notifier.notify(&format!(
            "STATUS=GPU {} {}\nWATCHDOG=1",
            cfg.gpu_index,
            snap.state.as_str()
        ));
    }
}

/// The settings read only at start that differ between the config in force and a reloaded
/// one (both finalized): what a reload keeps and warns about.
fn start_only_changes(cfg: &Config, new: &Config) -> Vec<&'static str> {
    [
        ("gpu_index", new.gpu_index != cfg.gpu_index),
        ("ledger_dir", new.ledger_dir != cfg.ledger_dir),
        ("state_file", new.state_file != cfg.state_file),
        ("xid_log", new.xid_log != cfg.xid_log || new.xid_log_match != cfg.xid_log_match),
        ("metrics_listen", new.metrics_listen != cfg.metrics_listen),
        ("history_secs", new.history_secs != cfg.history_secs),
        ("ledger_mode", new.ledger_mode != cfg.ledger_mode),
        ("ledger_group", new.ledger_group != cfg.ledger_group),
    ]
    .into_iter()
    .filter_map(|(f, changed)| changed.then_some(f))
    .collect()
}

impl<G: GpuSource> Service for MonitorService<G> {
    type Config = (Config, Vec<PathBuf>);

    fn load(&mut self) -> Result<Self::Config, ConfigError> {
        // Started on built-in defaults (no config file at the default path): a reload with
        // still no file keeps them, as a start would, rather than failing every SIGHUP; one
        // with override files added beside the missing base is refused, as a start would.
        if self.files.is_empty() && node_daemon::cli::defaults_without_base(&self.base)? {
            return Ok((Config::default(), Vec::new()));
        }
        Config::load(&self.base)
    }

    fn apply(&mut self, (mut new, files): Self::Config) {
        let cfg = &self.cfg;
        // As at start (`--gpu`, `$XSHARE_LEDGER_DIR`, the derived state file), so that only
        // a real change of a start-only setting is reported.
        new.finalize(Some(cfg.gpu_index));
        let restart_only = start_only_changes(cfg, &new);
        if !restart_only.is_empty() {
            tracing::warn!(fields = ?restart_only, "these settings take effect at the next start; the running monitor keeps the old ones");
        }
        let mut applied = new;
        crate::evictlog::configure(&applied.evict_log);
        applied.gpu_index = cfg.gpu_index;
        applied.ledger_dir = cfg.ledger_dir.clone();
        applied.state_file = cfg.state_file.clone();
        applied.metrics_listen = cfg.metrics_listen.clone();
        applied.xid_log = cfg.xid_log.clone();
        applied.xid_log_match = cfg.xid_log_match.clone();
        applied.history_secs = cfg.history_secs;
        applied.ledger_mode = cfg.ledger_mode.clone();
        applied.ledger_group = cfg.ledger_group.clone();
        self.cfg = applied;
        self.mon.reconfigure(self.cfg.clone());
        self.files = files;
        self.config_error = None;
        self.reloads += 1;
        self.next_housekeeping = 0;
        self.written = None;
        tracing::info!(files = ?self.files, "config in force");
        for w in self.cfg.machine.never_overlimit() {
            tracing::warn!("{w}");
        }
    }

    fn reload_failed(&mut self, error: &ConfigError) {
        self.config_error = Some(error.to_string());
        self.written = None;
    }

    /// One sample, then the state file: rewritten in the tick anything readers act on changes
    /// ([`Monitor::change_key`], ledger damage, a reload), otherwise every
    /// `state_file_every_ms` as a heartbeat. The status file's monitor block, which the shim,
    /// the MPS manager and node-agent read, is published at every tick by [`Monitor::tick`].
    fn tick(&mut self, now: u64, notifier: &Notifier) -> u64 {
        let damaged = self.mon.ledger.check(now).is_some();
        self.mon.tick(now);
        if now >= self.next_housekeeping {
            // On the grid of the ledger's own periodic jobs (`ledger::next_on_grid`): the
            // registry's count comes from cache lines the reclaim scan just brought in.
            self.next_housekeeping =
                next_on_grid(now, HOUSEKEEPING_MS.min(self.cfg.state_file_every_ms));
            self.housekeeping(now, notifier);
        }
        let key = (self.mon.change_key(), damaged);
        if now >= self.next_heartbeat || self.written != Some(key) {
            self.next_heartbeat = now.saturating_add(self.cfg.state_file_every_ms);
            self.written = Some(key);
            self.report(now, notifier);
        }
        let pace = self.mon.sampling_ms();
        if pace != self.pace {
            tracing::info!(
                gpu = self.cfg.gpu_index,
                interval_ms = pace,
                offline_registered = self.mon.offline_registered,
                state = self.mon.machine.state().as_str(),
                "sampling pace: {}",
                if pace > self.cfg.interval_ms {
                    "idle (no offline work on this GPU)"
                } else {
                    "full"
                }
            );
            self.pace = pace;
        }
        self.next_tick += pace;
        let after = mono_ms();
        if self.next_tick <= after {
            // Fell behind (slow NVML call): skip missed ticks rather than bursting.
            self.next_tick = after;
        }
        self.next_tick
    }

    /// Only once ready (the first state file written): between ticks further apart than the
    /// watchdog allows ([`node_daemon::run::run`]).
    fn keep_alive(&mut self, _now: u64, notifier: &Notifier) {
        if self.ready {
            notifier.notify("WATCHDOG=1");
        }
    }

    fn stop(&mut self) {
        let snap = self.snapshot(mono_ms());
        let _ = monitor_state::write(&self.cfg.state_file, &snap);
        tracing::info!("sysmonitor stopped");
    }
}

/// Runs the monitor until SIGTERM/SIGINT (the shared run/reload loop, [`node_daemon::run`]).
/// `files` are the config files in force (base first); SIGHUP reloads from `base`.
pub fn run(cfg: Config, base: &Path, files: Vec<PathBuf>) -> Result<(), String> {
    adopt_legacy_operator_file(&cfg);
    let _instance = lock_instance(&cfg)?;
    let _state_owner = node_daemon::cli::lock_state_file(
        &cfg.state_file,
        lock_file(&cfg).parent().unwrap_or(Path::new("")),
        &format!("sysmonitor for GPU {}", cfg.gpu_index),
    )?;
    crate::evictlog::configure(&cfg.evict_log);
    node_daemon::signals::install_signal_handlers();
    let lpath = cfg.ledger_path();
    // A damaged file is moved aside and replaced, never a reason to exit: under
    // Restart=always that would be a crash loop with the GPU unmonitored.
    let (ledger, recreated) = node_ledger::Ledger::open_or_recreate(&lpath, cfg.gpu_index)
        .map_err(|e| format!("ledger: {e}"))?;
    let mut start_ledger_error = None;
    if let Some(r) = recreated {
        tracing::error!(
            ledger = %lpath.display(),
            moved_to = %r.moved_to.display(),
            error = %r.error,
            "damaged ledger moved aside; created a fresh one"
        );
        start_ledger_error = Some(format!("{} (moved to {})", r.error, r.moved_to.display()));
    }
    // Validated with the config; applied on every start so an existing file gets it too.
    let (mode, gid) = (cfg.ledger_mode_bits()?, cfg.ledger_gid()?);
    ledger
        .set_access(mode, gid)
        .map_err(|e| format!("ledger access (ledger_mode/ledger_group): {e}"))?;
    if let Some(dir) = cfg.state_file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let resumed = resume(&cfg);
    let gpu = RetryingNvml::new(cfg.gpu_index);
    let mut mon = Monitor::resume(
        cfg.clone(),
        gpu,
        LedgerAdapter::new(ledger, cfg.status_path()),
        PidfdSignaller,
        resumed.history,
        &resumed.pending,
    );
    if let Some(calm_since) = resumed.overlimit {
        mon.machine.resume_overlimit(&cfg.machine, calm_since);
        tracing::info!(
            gpu = cfg.gpu_index,
            hold_ms = mon.machine.current_hold_ms(),
            hold_remaining_ms = ?mon.machine.hold_remaining_ms(mono_ms()),
            "resumed the Overlimit hold of an earlier monitor run"
        );
    }
    if let Some((code, since)) = resumed.xid {
        mon.machine.resume_xid_disabled(code, since);
        if resumed.interrupted_hold {
            mon.machine.resume_interrupted_hold(&cfg.machine);
        }
        tracing::warn!(
            gpu = cfg.gpu_index,
            xid = code,
            disabled_ms_ago = mono_ms().saturating_sub(since),
            "GPU stays Disabled for the critical XID an earlier monitor run saw (`sysmonitor enable` puts it back in service)"
        );
    }
    // The operator's switch before the first sample: a restarted monitor never publishes a
    // state the operator turned off, not even for one tick.
    let operator_disabled = operator_file(&cfg).exists();
    if operator_disabled {
        mon.input(mono_ms(), Input::OperatorDisable);
    }
    let mut svc = MonitorService::new(cfg, base, files, mon, start_ledger_error);
    svc.operator_disabled = operator_disabled;
    // Metrics are an operator's convenience, the monitor the GPU's protection: an endpoint that
    // cannot be served (an address another GPU's monitor holds, one config for every GPU) is
    // an ERROR and the monitor runs without it, never a start refused (a crash loop under
    // `Restart=always`, the GPU unmonitored).
    if let Some(l) = svc.cfg.metrics_listen.clone() {
        if let Err(e) = spawn_metrics(&l, svc.metrics_text.clone()) {
            let msg = format!("metrics_listen `{l}`: {e}; the monitor runs without its metrics endpoint");
            tracing::error!(gpu = svc.cfg.gpu_index, "{msg}");
            svc.config_error = Some(msg);
        }
    }
    tracing::info!(
        gpu = svc.cfg.gpu_index,
        interval_ms = svc.cfg.interval_ms,
        ledger = %lpath.display(),
        state_file = %svc.cfg.state_file.display(),
        "sysmonitor running"
    );
    node_daemon::run::run(&mut svc, &Notifier::from_env());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;
    use crate::health::State;

    /// An operator's disable file of an earlier version (in the container-visible `gpu<N>`
    /// directory) is moved at the monitor's first start in the new layout, and only then.
    /// A second monitor given the socket path a live one serves is refused and leaves that
    /// socket alone; a socket no one listens on any more is replaced.
    #[test]
    fn a_metrics_socket_a_live_monitor_serves_is_never_removed() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("metrics.sock");
        let listen = format!("unix:{}", path.display());
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "a dead monitor's socket");
        spawn_metrics(&listen, Arc::new(Mutex::new("first".into()))).expect("a stale socket is replaced");
        // The second is refused by the first's lock on `<path>.lock` (a description's lock:
        // refused within one process too).
        let e = spawn_metrics(&listen, Arc::new(Mutex::new("second".into()))).unwrap_err();
        assert!(e.contains("already runs"), "{e}");
        let mut s = std::os::unix::net::UnixStream::connect(&path).expect("the first monitor's socket is still there");
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.ends_with("first"), "{body}");
        // A socket some other process listens on, with no lock beside it: left alone too.
        let other = d.path().join("other.sock");
        let _listening = std::os::unix::net::UnixListener::bind(&other).unwrap();
        let e = spawn_metrics(&format!("unix:{}", other.display()), Arc::new(Mutex::new("x".into()))).unwrap_err();
        assert!(e.contains("listens"), "{e}");
    }

    #[test]
    fn a_legacy_disable_file_is_adopted_once_and_never_again() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config { ledger_dir: d.path().to_owned(), ..Config::default() };
        let legacy = cfg.ledger_path().with_file_name("disabled");
        std::fs::create_dir_all(legacy.parent().unwrap()).unwrap();
        std::fs::write(&legacy, "").unwrap();
        adopt_legacy_operator_file(&cfg);
        assert!(operator_file(&cfg).exists() && !legacy.exists(), "a GPU disabled before the upgrade stays disabled");
        assert!(operator_file(&cfg).starts_with(d.path().join("daemons/gpu0")));
        let lock = lock_instance(&cfg).unwrap();
        std::fs::remove_file(operator_file(&cfg)).unwrap();
        std::fs::write(&legacy, "").unwrap();
        adopt_legacy_operator_file(&cfg);
        assert!(!operator_file(&cfg).exists(), "after the first start, a file there (a tenant's) is nobody's request");
        drop(lock);
    }

    /// Samples whose utilization the test sets.
    struct Dial(Rc<Cell<f64>>);
    impl GpuSource for Dial {
        fn sample(&mut self, now_ms: u64) -> Result<GpuSample, String> {
            let u = self.0.get();
            if u < 0.0 {
                return Err("NVML error (dialled)".into());
            }
            Ok(GpuSample {
                t_ms: now_ms,
                gpu_util: u,
                sm_activity: u,
                sm_clock_mhz: 1000,
                sm_clock_max_mhz: 1000,
                mem_used: 1,
                mem_total: 100,
                ..Default::default()
            })
        }
        fn processes(&mut self) -> Result<Vec<ProcMem>, String> {
            Ok(Vec::new())
        }
        fn xids(&mut self) -> Vec<u64> {
            Vec::new()
        }
    }

    fn service(dir: &Path, util: Rc<Cell<f64>>, heartbeat_ms: u64) -> MonitorService<Dial> {
        let mut cfg = Config {
            ledger_dir: dir.join("run"),
            state_file: dir.join("run/daemons/gpu0/state.json"),
            state_file_every_ms: heartbeat_ms,
            ..Config::default()
        };
        cfg.host_memory.enabled = false;
        cfg.verify.enabled = false;
        cfg.machine.overlimit_sustain_ms = 0;
        cfg.machine.hold_base_ms = 200;
        cfg.machine.hold_max_ms = 200;
        std::fs::create_dir_all(cfg.daemon_dir()).unwrap(); // as `run`'s instance lock makes it
        let ledger = node_ledger::Ledger::open_or_create(&cfg.ledger_path(), 0).unwrap();
        let mon = Monitor::new(
            cfg.clone(),
            Dial(util),
            LedgerAdapter::new(ledger, cfg.status_path()),
            PidfdSignaller,
            Vec::new(),
        );
        MonitorService::new(cfg, &dir.join("mon.json"), Vec::new(), mon, None)
    }

    /// [`service`], ticked every 10 ms from 0 to `until_ms` (healthy by then at a calm dial).
    fn running(dir: &Path, util: Rc<Cell<f64>>, until_ms: u64) -> (MonitorService<Dial>, Notifier) {
        let mut svc = service(dir, util, 10);
        let n = Notifier::from_env();
        for t in (0..=until_ms).step_by(10) {
            svc.tick(t, &n);
        }
        (svc, n)
    }

    /// A monitor started with `--gpu 1` on built-in defaults (no config file): a SIGHUP
    /// keeps the defaults (it failed, every time), and an unchanged config reloaded reports
    /// no start-only setting as changed (the unfinalized reload differed in `gpu_index` and
    /// `state_file`, and warned at every SIGHUP).
    #[test]
    fn a_reload_of_an_unchanged_config_changes_nothing_and_defaults_reload_as_defaults() {
        let d = tempfile::tempdir().unwrap();
        let mut svc = service(d.path(), Rc::new(Cell::new(10.0)), 100);
        let (loaded, files) = svc.load().expect("no config file: the defaults, as at start");
        assert!(files.is_empty());
        let mut started = Config { ledger_dir: d.path().to_owned(), ..Config::default() };
        started.finalize(Some(1));
        let mut reloaded = loaded;
        reloaded.ledger_dir = d.path().to_owned();
        reloaded.finalize(Some(started.gpu_index));
        assert_eq!(start_only_changes(&started, &reloaded), Vec::<&str>::new());
        reloaded.history_secs += 1;
        assert_eq!(start_only_changes(&started, &reloaded), ["history_secs"]);
        // A config file that was in force and is gone is an error: the last good one stays.
        svc.files = vec![d.path().join("mon.json")];
        assert!(svc.load().is_err());
    }

    /// A reload says what it does not do: override files added beside a missing base are an
    /// error (a start refuses them; the reload kept the defaults and said "config reloaded"),
    /// and the ledger's mode and group, set only at start, are reported as start-only.
    #[test]
    fn a_reload_refuses_overrides_without_a_base_and_reports_ledger_access_changes() {
        let d = tempfile::tempdir().unwrap();
        let mut svc = service(d.path(), Rc::new(Cell::new(10.0)), 100);
        std::fs::create_dir(d.path().join("mon.d")).unwrap();
        std::fs::write(d.path().join("mon.d/50-tight.json"), r#"{"interval_ms": 5}"#).unwrap();
        let e = svc.load().expect_err("an override with no base");
        assert!(e.to_string().contains("50-tight.json"), "{e}");
        let cfg = svc.cfg.clone();
        let changed = Config { ledger_mode: "0660".into(), ledger_group: Some("video".into()), ..cfg.clone() };
        assert_eq!(start_only_changes(&cfg, &changed), ["ledger_mode", "ledger_group"]);
    }

    /// A state file that cannot be written (here its directory is a file) is a run of failures
    /// the monitor keeps trying through, logged by [`ErrorRun`], and ends when a write works.
    #[test]
    fn a_state_file_that_cannot_be_written_is_retried_and_its_run_ends_with_a_write() {
        let d = tempfile::tempdir().unwrap();
        let mut svc = service(d.path(), Rc::new(Cell::new(10.0)), 100);
        let n = Notifier::from_env();
        let blocker = d.path().join("blocked");
        std::fs::write(&blocker, "").unwrap();
        svc.cfg.state_file = blocker.join("state.json");
        for t in (0..=1000).step_by(10) {
            svc.tick(t, &n);
        }
        assert!(svc.state_write.failing(), "every write failed");
        std::fs::remove_file(&blocker).unwrap();
        std::fs::create_dir(&blocker).unwrap();
        svc.tick(1200, &n);
        assert!(!svc.state_write.failing(), "the run ended with a write");
        assert_eq!(monitor_state::read(&svc.cfg.state_file).unwrap().gpu, 0);
    }

    /// The state file is no longer rewritten every report period: quiet ticks leave it alone
    /// until the heartbeat, a health change (here Healthy -> Overlimit -> Unhealthy -> Healthy, and
    /// an operator's disable) is in the file at the end of the very tick it happened, and the
    /// file is never older than one heartbeat.
    #[test]
    fn state_file_follows_changes_in_the_same_tick_and_beats_otherwise() {
        let d = tempfile::tempdir().unwrap();
        let util = Rc::new(Cell::new(10.0));
        let heartbeat = 1000;
        let mut svc = service(d.path(), util.clone(), heartbeat);
        let n = Notifier::from_env();
        let path = svc.cfg.state_file.clone();
        let read = || monitor_state::read(&path).unwrap();

        svc.tick(0, &n);
        assert_eq!((read().state, read().updated_mono_ms), (State::Healthy, 0));
        for t in (10..=500).step_by(10) {
            svc.tick(t, &n);
        }
        assert_eq!(
            read().updated_mono_ms,
            0,
            "quiet ticks before the heartbeat do not rewrite the file"
        );

        let mut seen = vec![State::Healthy];
        for t in (510..=6000).step_by(10) {
            // Overload at 510 (Overlimit, hold 200 ms), calm again from 520.
            util.set(if t == 510 { 99.5 } else { 10.0 });
            if t == 4000 {
                std::fs::write(&svc.operator_path, "").unwrap();
            }
            svc.tick(t, &n);
            let s = read();
            assert_eq!(
                s.state,
                svc.mon.machine.state(),
                "at {t} ms the file says what the machine says"
            );
            assert!(
                t - s.updated_mono_ms < heartbeat,
                "at {t} ms the file is {} ms old",
                t - s.updated_mono_ms
            );
            if seen.last() != Some(&s.state) {
                assert_eq!(s.updated_mono_ms, t, "a change is written in its own tick");
                seen.push(s.state);
            }
        }
        assert_eq!(
            seen,
            [
                State::Healthy,
                State::Overlimit,
                State::Unhealthy,
                State::Healthy,
                State::Disabled
            ]
        );
        let s = read();
        assert_eq!(s.disabled_by, Some(crate::health::DisableCause::Operator));
        assert!(
            s.overlimit_entries_mono_ms == vec![510],
            "{:?}",
            s.overlimit_entries_mono_ms
        );
    }

    /// A restart resumes the Overlimit stay from the state file: with the hold's start when it
    /// was running (the metrics calm since 520 ms here), without it while the metrics were
    /// still past a threshold, and nothing once the stay is over.
    #[test]
    fn a_restart_resumes_the_overlimit_stay_from_the_state_file() {
        let d = tempfile::tempdir().unwrap();
        let util = Rc::new(Cell::new(10.0));
        let (mut svc, n) = running(d.path(), util.clone(), 500);
        assert_eq!(resume(&svc.cfg), Resume::default());
        util.set(99.5);
        svc.tick(510, &n);
        let r = resume(&svc.cfg);
        assert_eq!((r.history, r.overlimit), (vec![510], Some(None)));
        assert!(r.pending.is_empty());
        util.set(10.0);
        for t in (520..=600).step_by(10) {
            svc.tick(t, &n);
        }
        assert_eq!(resume(&svc.cfg).overlimit, Some(Some(520)));
        let mut m = crate::health::Machine::with_history(vec![510]);
        m.resume_overlimit(&svc.cfg.machine, Some(520));
        assert_eq!((m.state(), m.hold_remaining_ms(600)), (State::Overlimit, Some(120)));
        for t in (610..=800).step_by(10) {
            svc.tick(t, &n);
        }
        assert_eq!(svc.mon.machine.state(), State::Healthy);
        assert_eq!(resume(&svc.cfg).overlimit, None);
    }

    /// `sysmonitor enable` twice in a row on a GPU an operator disabled while an XID came: the
    /// first ends the operator's disable, the second the XID's, both before the monitor's next
    /// look. Before, the look took the enable request first (still operator-disabled, so it was
    /// dropped), then the operator's enable left the GPU Disabled by the XID.
    #[test]
    fn two_enables_before_one_look_end_both_disables() {
        let d = tempfile::tempdir().unwrap();
        let util = Rc::new(Cell::new(10.0));
        let (mut svc, n) = running(d.path(), util, 200);
        std::fs::write(&svc.operator_path, "").unwrap();
        svc.tick(300, &n);
        assert_eq!(svc.mon.machine.disabled_by(), Some(crate::health::DisableCause::Operator));
        svc.mon.input(310, Input::Xid(48));
        svc.tick(320, &n);
        // The two `enable`s: the operator file removed, then the enable request written.
        std::fs::remove_file(&svc.operator_path).unwrap();
        std::fs::write(&svc.enable_path, "enabled by operator\n").unwrap();
        svc.tick(500, &n);
        assert_ne!(svc.mon.machine.state(), State::Disabled, "{:?}", svc.mon.machine.disabled_by());
    }

    /// NVML errors in the middle of an Overlimit hold (Disabled), then a restart (the watchdog
    /// killing a monitor stuck in a hung NVML call is the likely one): the restarted monitor
    /// serves the hold before it admits offline work. Before, the hold's interruption was not in
    /// the state file, and the new run went Init -> Healthy at its first good sample.
    #[test]
    fn a_restart_serves_an_overlimit_hold_that_nvml_errors_interrupted() {
        let d = tempfile::tempdir().unwrap();
        let util = Rc::new(Cell::new(10.0));
        let (mut svc, n) = running(d.path(), util.clone(), 500);
        util.set(99.5);
        svc.tick(510, &n);
        assert_eq!(svc.mon.machine.state(), State::Overlimit);
        util.set(-1.0);
        for t in (520..=600).step_by(10) {
            svc.tick(t, &n);
        }
        assert_eq!(svc.mon.machine.disabled_by(), Some(crate::health::DisableCause::Nvml));
        let r = resume(&svc.cfg);
        assert_eq!((r.history.clone(), r.overlimit), (vec![510], Some(None)), "the hold is still to be served");
        // The restarted run's machine: calm samples admit offline work only after the hold.
        let mut m = crate::health::Machine::with_history(r.history);
        m.resume_overlimit(&svc.cfg.machine, None);
        let calm = crate::health::Metrics { gpu_util: 10.0, sm_activity: 10.0, sm_clock_pct: 100.0, mem_used_pct: 1.0, ..Default::default() };
        for t in (610..=800).step_by(10) {
            m.step(&svc.cfg.machine, t, crate::health::Input::Sample(calm));
            assert_eq!(m.state(), State::Overlimit, "admitted at {t} ms, before the 200 ms hold");
        }
        m.step(&svc.cfg.machine, 820, crate::health::Input::Sample(calm));
        assert_ne!(m.state(), State::Overlimit, "the hold is over");
    }

    /// A critical XID's Disabled is resumed with its time; an `enable` request ends it (and is
    /// consumed); an operator's Disabled is the operator file's, not resumed from the state.
    #[test]
    fn a_restart_resumes_an_xid_disabled_gpu_until_an_enable_request() {
        let d = tempfile::tempdir().unwrap();
        let mut svc = service(d.path(), Rc::new(Cell::new(10.0)), 10);
        let n = Notifier::from_env();
        svc.tick(0, &n);
        svc.mon.input(5, Input::Xid(79));
        svc.tick(10, &n);
        assert_eq!(resume(&svc.cfg).xid, Some((79, 5)));
        let mut m = crate::health::Machine::new();
        m.resume_xid_disabled(79, 5);
        assert_eq!((m.state(), m.disabled_since_ms()), (State::Disabled, Some(5)));
        std::fs::write(&svc.enable_path, "").unwrap();
        svc.tick(100, &n);
        assert_eq!(svc.mon.machine.state(), State::Init);
        assert!(!svc.enable_path.exists(), "the request is consumed");
        svc.tick(110, &n);
        assert_eq!(svc.mon.machine.state(), State::Healthy);
        assert_eq!(resume(&svc.cfg).xid, None);
        std::fs::write(&svc.operator_path, "").unwrap();
        svc.tick(200, &n);
        assert_eq!(svc.mon.machine.state(), State::Disabled);
        assert_eq!(resume(&svc.cfg).xid, None, "the operator's switch is its file");
        // A critical XID under the operator's Disabled is kept in the state file: a restart
        // resumes it, and the operator's enable leaves the GPU Disabled by it.
        svc.mon.input(205, Input::Xid(48));
        svc.tick(210, &n);
        assert_eq!(resume(&svc.cfg).xid, Some((48, 205)));
        std::fs::remove_file(&svc.operator_path).unwrap();
        svc.tick(300, &n);
        assert_eq!(svc.mon.machine.disabled_by(), Some(monitor_state::DisableCause::Xid(48)));
        assert_eq!(resume(&svc.cfg).xid, Some((48, 205)));
    }

    /// The operator's disable file is looked at every `HOUSEKEEPING_MS` whatever the heartbeat.
    #[test]
    fn operator_disable_is_seen_within_the_housekeeping_period() {
        let d = tempfile::tempdir().unwrap();
        let mut svc = service(d.path(), Rc::new(Cell::new(10.0)), 60_000);
        let n = Notifier::from_env();
        svc.tick(0, &n);
        std::fs::write(&svc.operator_path, "").unwrap();
        let mut t = 0;
        while svc.mon.machine.state() != State::Disabled {
            t += 10;
            assert!(t <= HOUSEKEEPING_MS, "not disabled after {t} ms");
            svc.tick(t, &n);
        }
        let s = monitor_state::read(&svc.cfg.state_file).unwrap();
        assert_eq!((s.state, s.updated_mono_ms), (State::Disabled, t));
    }
}
