//! `mps-manager`: keeps one GPU's MPS control daemon running, sets the offline SM budget,
//! detects MPS failures and recovers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use mps_manager::config::{Config, DEFAULT_PATH};
use mps_manager::manager::{Manager, ManagerState};
use node_daemon::cli::out;
use node_daemon::run::Service;
use node_daemon::sdnotify::Notifier;
use node_daemon::ConfigError;

/// Read after the options by `--help`: configuration, the SM budget, faults and recovery.
const AFTER_HELP: &str = "\
CONFIG:
    FILE defaults to $XSHARE_MPS_MANAGER_CONFIG, else /etc/xshare/mps-manager.json, plus
    <stem>.d/*.json overrides merged in name order. Errors name file, line and field; SIGHUP
    reloads and keeps the previous config when the new one is broken (log, state file
    `last_error`). A missing default file means built-in defaults; a file named by -c or the
    variable must exist. ledger_dir, control_bin,
    pipe_dir, log_dir, state_file and shm_dir take effect at the next start: a reload keeps them
    and says so (WARN, state file `last_error`).
    Keys: gpu_index, ledger_dir ($XSHARE_LEDGER_DIR), control_bin, pipe_dir, log_dir,
    command_timeout_ms, period_ms, check_every_ms, quit_on_exit, monitor_state_file, state_file,
    evict_grace_ms, terminate_before_kill_ms, client_uid, compute_mode, shm_dir, outside_mps,
    outside_mps_after_ms,
    budget.{headroom_pct,min_pct,max_pct,min_step_pct,smoothing,unsafe_pct,saturated_hold_readings},
    detect.{stuck_after_ms,idle_sm_pct}, recovery.{min_interval_ms,max_per_hour}.
    evict_grace_ms is 1000..=600000; unsafe_pct at most min_pct; paths absolute, without `..`.
    In pipe_dir, log_dir, monitor_state_file, state_file and shm_dir `{gpu}` is the GPU index:
    one file serves every GPU's manager (a second manager on another's state_file is refused).
    `mps-manager check-config` prints the effective config.

SM BUDGET:
    offline % = clamp(100 - online SM activity (smoothed) - headroom, min, max); unsafe_pct while
    the GPU is Overlimit/Disabled/unknown (from sysmonitor, through the ledger). Published in the
    ledger: the shim throttles running offline processes to it and gives new ones it as their
    MPS active-thread percentage. The manager sets no MPS percentage itself (it would also cap
    online clients that connect later).

FAULTS -> RECOVERY:
    a dead or stuck offline client -> terminate_client on its MPS server (MPS and online clients
    untouched), SIGTERM it, mark it for restart (state file restart_requested). A failed
    targeted recovery -> server restart: SIGTERM/SIGKILL offline clients, shutdown_server -f
    each server, the control daemon kept (a client relaunched at once reaches MPS, not the bare
    GPU); a server with clients vanished -> the same for that server only (gone already: the
    offline clients are evicted, a new server a relaunched client got is left alone). Control
    daemon dead, command timeout (hang), a critical XID from sysmonitor, or servers that
    outlive shutdown_server -f -> full reset: quit/kill MPS, start it again. Both are
    rate-limited by recovery.{min_interval_ms,max_per_hour}.

USERS:
    MPS serves one user at a time: a client of another user than the running server's is
    queued (its cuInit blocks) until that server's clients are done, then the server is
    replaced by one for that user. So the online service and all offline containers of this
    GPU run as one uid; set it as client_uid. A server or registered offline process of another
    uid is then an error (log, state file last_error, user_breaches) and those offline processes
    are terminate_client'ed, SIGTERMed (SIGKILL after evict_grace_ms) and marked for restart.
    Unset: the server's user is reported (mps_server_uid) and a change warned.

SHARED MEMORY:
    An MPS server keeps the shared memory its clients attach to in its /dev/shm: a client
    that sees another /dev/shm (a container's own) fails to connect
    (CUDA_ERROR_MPS_CONNECTION_FAILED). The manager starts the control daemon, and so its
    servers, with shm_dir (default /dev/shm/xshare-gpu<N>, mode 1777) bound over /dev/shm in a
    mount namespace of its own (root); MPS clients in containers get that directory mounted
    at /dev/shm (node-agent does it for offline containers; the online service's pod mounts
    it), and share nothing else of the host's /dev/shm. shm_dir \"host\": the daemon keeps the
    host's /dev/shm (clients running on the host). Checked when the daemon is started or
    adopted; state file shm_dir. A missing shm_dir is created (root, 1777); an existing one must
    already be a root-owned 1777 directory (never chmodded), and / or a system directory is refused.

COMPUTE MODE:
    compute_mode exclusive_process (the default, as NVIDIA's MPS docs recommend): before it
    starts the control daemon the manager sets the GPU's compute mode to EXCLUSIVE_PROCESS
    through NVML (root only; else it exits naming the fix), where only the MPS server holds a
    context of its own: a process that misses MPS is refused a context
    (CUDA_ERROR_DEVICE_UNAVAILABLE) instead of running beside it, and while such a process
    holds the GPU no MPS server can start. A change while it runs (nvidia-smi -c 0) is set back
    (ERROR line, state file compute_mode_restored). With quit_on_exit the mode it found is put
    back once MPS has quit; otherwise the fence stays for the next manager. leave: untouched.

OUTSIDE MPS:
    CUDA looks for the control daemon once, when it initialises: an offline process started
    before MPS ran (or with another CUDA_MPS_PIPE_DIRECTORY) runs without MPS for its life,
    time-sliced against the online service, out of reach of the SM budget. One whose kernel
    launches advance (ledger) while no server lists it (matched by pid namespace, containers
    included) for outside_mps_after_ms (2000) is an error (log, state file outside_mps) and,
    with outside_mps evict (the default), SIGTERMed (SIGKILL after evict_grace_ms) and marked
    for restart; report leaves it running. Start offline containers after mps-manager.

RESTARTS:
    One manager per GPU: `run` takes a lock on <ledger_dir>/daemons/gpu<N>/mps-manager.lock; a
    second one exits naming the holder's pid. Likewise one manager per pipe_dir: a manager whose
    pipe_dir another GPU's manager uses exits naming that GPU. A restarted manager adopts the
    running control daemon (pid file; missing or stale, the process holding the control socket;
    nothing is reset) and finishes a recovery its predecessor was killed in (the state file's
    `terminating`). quit_on_exit true makes SIGTERM quit MPS: every client, online included,
    loses its context. It is false by default: restarts keep MPS running.

LOGS: RUST_LOG=debug|info|warn (default info), to stderr.

EXAMPLES:
    mps-manager run --gpu 0                     under systemd: xshare-mps-manager@0.service
    mps-manager status --gpu 0                  daemon, servers, budget, faults, recoveries
    mps-manager check-config -c ./mps-manager.json
";

node_daemon::daemon_cli! {
    /// mps-manager - runs one GPU's MPS control daemon, gives offline work the SM share online
    /// work leaves free, and recovers MPS when it crashes or hangs.
    name = "mps-manager",
    after_long_help = AFTER_HELP,
    cmd = Cmd,
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
enum Cmd {
    /// Run until SIGTERM (systemd: Type=notify, watchdog); SIGHUP reloads the config.
    Run,
    /// Print the manager's state file: MPS daemon, budget, faults, recoveries; exit 3 when no
    /// manager runs for the GPU (the file is then how the last one left it).
    Status,
    /// Validate the config (base + overrides) and print the effective config.
    CheckConfig,
}

fn main() -> ExitCode {
    node_daemon::cli::init_logging();
    let cli = Cli::parse();
    let loaded = match cli
        .cfg
        .load("XSHARE_MPS_MANAGER_CONFIG", DEFAULT_PATH, Config::load)
    {
        Ok(l) => l,
        Err(e) => return fail(&format!("config error: {e}"), 2),
    };
    let mut cfg = loaded.config;
    cfg.finalize(cli.cfg.gpu);
    if let Err(e) = cfg.check_paths_in(&loaded.files) {
        return fail(&format!("config error: {e}"), 2);
    }
    // `status` of a GPU whose manager is not running: printed, then exit 3.
    let mut not_running = false;
    let gpu = cfg.gpu_index;
    let r = match cli.cmd.unwrap_or(Cmd::Run) {
        Cmd::CheckConfig => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&cfg).unwrap_or_default()
        ))
        .map(|()| {
            for w in check_config_warnings(&cfg) {
                eprintln!("warning: {w}");
            }
            eprintln!("{}", node_daemon::cli::config_ok_line(&loaded.files, &loaded.base))
        }),
        Cmd::Status => node_daemon::state_file::read_json::<ManagerState>(&cfg.state_file)
            .and_then(|s| {
                // The manager of this GPU runs while its single-instance lock is held.
                let running = node_daemon::instance::held(&mps_manager::manager::lock_file(&cfg));
                not_running = !running;
                out(&status_text(&s, node_daemon::clock::unix_ms(), running))
            }),
        Cmd::Run => run(cfg, loaded.base, loaded.files),
    };
    match r {
        Ok(()) if not_running => fail(&format!("the manager of GPU {gpu} is not running (exit 3)"), 3),
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, 1),
    }
}

/// What `check-config` warns of beyond the config's own validity: paths the shipped unit does
/// not let the manager write, and a control program that is not there to run (the manager
/// would exit at start, again at every restart).
fn check_config_warnings(cfg: &Config) -> Vec<String> {
    let mut w = node_daemon::cli::unit_write_warnings(&[
        ("ledger_dir", cfg.ledger_dir.as_path()),
        ("pipe_dir", cfg.pipe_dir.as_path()),
        ("log_dir", cfg.log_dir.as_path()),
        ("state_file", cfg.state_file.as_path()),
    ]);
    if !mps_manager::config::runnable(&cfg.control_bin) {
        w.push(format!(
            "control_bin {} is not an executable file{}: the manager cannot start MPS",
            cfg.control_bin.display(),
            if cfg.control_bin.is_absolute() { "" } else { " in PATH" }
        ));
    }
    w
}

fn fail(msg: &str, code: u8) -> ExitCode {
    eprintln!("mps-manager: {msg}");
    ExitCode::from(code)
}

/// `mps-manager status`: the state file as of `now_unix_ms`; a file whose manager is gone says
/// so first (what it shows is how that manager left things).
fn status_text(s: &ManagerState, now_unix_ms: u64, running: bool) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let age = now_unix_ms.saturating_sub(s.updated_unix_ms);
    let gpu = format!("GPU {}", s.gpu);
    let _ = writeln!(o, "{}", node_daemon::cli::status_heading(&gpu, "manager", s.manager_pid, running, age));
    let _ = writeln!(
        o,
        "  {:<20} {}",
        "control daemon",
        s.daemon_pid.map_or("not running".into(), |p| p.to_string())
    );
    let _ = writeln!(
        o,
        "  {:<20} {:?} ({} clients)",
        "servers", s.servers, s.clients
    );
    if let Some(r) = &s.control_socket_replaced {
        let _ = writeln!(o, "  {:<20} REPLACED: {r}", "control socket");
    }
    let _ = writeln!(
        o,
        "  {:<20} {}",
        "MPS /dev/shm",
        s.shm_dir.as_deref().unwrap_or("not the configured shm_dir (see last error)")
    );
    let _ = writeln!(
        o,
        "  {:<20} {} ({} servers of another user than client_uid seen)",
        "MPS user",
        s.mps_server_uid
            .map_or("-".into(), |u| format!("uid {u}")),
        s.user_breaches
    );
    let _ = writeln!(
        o,
        "  {:<20} {}",
        "gpu health",
        s.gpu_health.as_deref().unwrap_or("unknown")
    );
    let _ = writeln!(
        o,
        "  {:<20} {:.1} % total, {:.1} % online (est.)",
        "sm activity", s.sm_activity_pct, s.online_estimate_pct
    );
    let _ = writeln!(
        o,
        "  {:<20} {}",
        "offline SM budget",
        s.offline_budget_pct
            .map_or("-".into(), |b| format!("{b:.1} %"))
    );
    let _ = writeln!(o, "  {:<20} {:?}", "faults", s.faults);
    let _ = writeln!(
        o,
        "  {:<20} {} ({} suppressed by rate limit; {} dead daemons replaced past it)",
        "recoveries",
        s.recoveries.len(),
        s.suppressed_recoveries,
        s.daemons_started_past_limit
    );
    for r in s.recoveries.iter().rev().take(5) {
        let _ = writeln!(o, "    {:?}: {} (evicted {:?})", r.fault, r.outcome, r.evicted);
    }
    let _ = writeln!(
        o,
        "  {:<20} {}",
        "restart requested",
        s.restart_requested.len()
    );
    let _ = writeln!(
        o,
        "  {:<20} {}{}{}",
        "compute mode",
        s.compute_mode.as_deref().unwrap_or("left as it is"),
        s.compute_mode_found
            .as_deref()
            .map_or(String::new(), |f| format!(" (found {f}, put back when MPS quits)")),
        if s.compute_mode_restored > 0 {
            format!(", set back {} times", s.compute_mode_restored)
        } else {
            String::new()
        }
    );
    let _ = writeln!(o, "  {:<20} {}", "outside MPS", s.outside_mps);
    if !s.outside_holders.is_empty() {
        let _ = writeln!(
            o,
            "  {:<20} {:?} hold the GPU outside MPS: no MPS server can start",
            "GPU held by", s.outside_holders
        );
    }
    if let Some(e) = &s.monitor_state_error {
        let _ = writeln!(o, "  {:<20} unreadable, no XID or pending eviction seen: {e}", "monitor state");
    }
    if let Some(e) = &s.last_error {
        let _ = writeln!(o, "  {:<20} {e}", "last error");
    }
    o
}

/// The manager as a [`Service`] of the shared run/reload loop.
struct ManagerService {
    m: Manager,
    base: PathBuf,
    /// Started on built-in defaults (no config file at the default path): a reload with
    /// still no file keeps them, as a start would, rather than failing every SIGHUP.
    on_defaults: bool,
    state_file: PathBuf,
    next_check: u64,
}

impl Service for ManagerService {
    type Config = (Config, Vec<PathBuf>);

    fn load(&mut self) -> Result<Self::Config, ConfigError> {
        // With still no file, a reload keeps the defaults; override files added beside the
        // missing base are refused, as a start refuses them (not silently ignored).
        if self.on_defaults && node_daemon::cli::defaults_without_base(&self.base)? {
            return Ok((Config::default(), Vec::new()));
        }
        Config::load(&self.base)
    }

    fn apply(&mut self, (mut new, _): Self::Config) {
        let cfg = &self.m.cfg;
        // As at start (`--gpu`, `$XSHARE_LEDGER_DIR`, derived paths), so that only a real
        // change of a start-only setting is reported.
        new.finalize(Some(cfg.gpu_index));
        let start_only = cfg.keep_start_only(&mut new);
        self.m.ctl.timeout = Duration::from_millis(new.command_timeout_ms);
        self.m.cfg = new;
        self.m.state.last_error = None;
        if !start_only.is_empty() {
            let msg = format!(
                "config reload: {} take effect at the next start (the running control daemon keeps \
                 them); the running manager keeps the old ones",
                start_only.join(", ")
            );
            tracing::warn!(fields = ?start_only, "{msg}");
            self.m.state.last_error = Some(msg);
        }
    }

    fn reload_failed(&mut self, error: &ConfigError) {
        self.m.state.last_error = Some(format!("config reload: {error}"));
    }

    fn tick(&mut self, now: u64, notifier: &Notifier) -> u64 {
        self.m.budget_tick();
        if now >= self.next_check || self.m.daemon_died() {
            let faults = self.m.check(now);
            self.m.handle_faults(now, faults);
            // A dead client still listed is confirmed at the next period, not a whole check
            // interval later: the server's other clients hang meanwhile.
            self.next_check = now
                + if self.m.awaits_confirmation() {
                    self.m.cfg.period_ms.min(self.m.cfg.check_every_ms)
                } else {
                    self.m.cfg.check_every_ms
                };
            self.m.write_state(&self.state_file);
            notifier.notify("WATCHDOG=1");
        }
        node_daemon::clock::mono_ms() + self.m.cfg.period_ms
    }

    fn stop(&mut self) {
        self.m.shutdown();
        self.m.write_state(&self.state_file);
        // As sysmonitor says it: the journal shows the manager ended on purpose (the MPS
        // daemon kept for the next one unless quit_on_exit, said by shutdown above).
        tracing::info!(quit_mps = self.m.cfg.quit_on_exit, "mps-manager stopped");
    }
}

fn run(cfg: Config, base: PathBuf, files: Vec<PathBuf>) -> Result<(), String> {
    node_daemon::signals::install_signal_handlers();
    // Before anything touches MPS: a second manager must not adopt (or reset) the daemon the
    // first one owns.
    let _instance = mps_manager::manager::lock_instance(&cfg)?;
    let _pipe_owner = mps_manager::manager::lock_pipe_dir(&cfg)?;
    let _state_owner = node_daemon::cli::lock_state_file(
        &cfg.state_file,
        mps_manager::manager::lock_file(&cfg).parent().unwrap_or(std::path::Path::new("")),
        &format!("mps-manager for GPU {}", cfg.gpu_index),
    )?;
    let mut m = Manager::new(cfg.clone())?;
    // What a previous manager (SIGKILLed, OOM-killed) left unfinished.
    match Manager::read_previous(&cfg.state_file) {
        Ok(Some(prev)) => m.adopt_previous(&prev),
        Ok(None) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "the previous manager's state file is unreadable: a recovery it left unfinished \
             (offline clients it was terminating) will end in a full MPS reset; the file is \
             rewritten from this manager's state"
        ),
    }
    let state_file = cfg.state_file.clone();
    if let Some(d) = state_file.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    // The fence first: a process that misses MPS while the daemon starts must find the GPU
    // exclusive already.
    m.hold_compute_mode()
        .map_err(|e| format!("cannot start MPS: {e}"))?;
    m.ensure_daemon()
        .map_err(|e| format!("cannot start MPS: {e}"))?;
    let notifier = Notifier::from_env();
    notifier.notify("READY=1");
    tracing::info!(gpu = cfg.gpu_index, pipe_dir = %cfg.pipe_dir.display(), "mps-manager running");
    let mut svc = ManagerService {
        m,
        base,
        on_defaults: files.is_empty(),
        state_file,
        next_check: 0,
    };
    node_daemon::run::run(&mut svc, &notifier);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent_and_defaults_to_run() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["mps-manager", "--config", "/m.json", "--gpu", "3"]).unwrap();
        assert_eq!((c.cmd, c.cfg.gpu), (None, Some(3)));
        let c = Cli::try_parse_from(["mps-manager", "status", "--gpu", "1"]).unwrap();
        assert_eq!(c.cmd, Some(Cmd::Status));
        let e = Cli::try_parse_from(["mps-manager", "run", "--json"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn long_help_teaches_config_budget_and_recovery() {
        let h = Cli::command().render_long_help().to_string();
        for want in [
            "XSHARE_MPS_MANAGER_CONFIG",
            "<stem>.d/*.json",
            "SIGHUP",
            "SM BUDGET",
            "terminate_client",
            "EXCLUSIVE_PROCESS",
            "mps-manager.lock",
            "EXAMPLES",
            "--gpu <N>",
        ] {
            assert!(h.contains(want), "--help lacks {want}:\n{h}");
        }
    }

    /// A SIGHUP with a changed shm_dir or control_bin keeps them (the running daemon was
    /// started with them) and says so; the rest of the config is applied.
    #[test]
    fn a_reload_keeps_and_reports_start_only_changes() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("mps.json");
        let write = |extra: &str| {
            std::fs::write(&base, format!("{{ \"ledger_dir\": \"{}\", \"compute_mode\": \"leave\"{extra} }}", d.path().join("run").display())).unwrap()
        };
        write("");
        let (mut cfg, files) = Config::load(&base).unwrap();
        cfg.finalize(None);
        let mut svc = ManagerService { m: Manager::new(cfg.clone()).unwrap(), base: base.clone(), on_defaults: files.is_empty(), state_file: cfg.state_file.clone(), next_check: 0 };
        assert_eq!(node_daemon::run::reload(&mut svc), node_daemon::run::Reload::Applied);
        assert_eq!(svc.m.state.last_error, None, "an unchanged config reports nothing");
        write(", \"shm_dir\": \"/dev/shm/elsewhere\", \"control_bin\": \"/opt/other-mps-control\", \"command_timeout_ms\": 1234");
        node_daemon::run::reload(&mut svc);
        let e = svc.m.state.last_error.clone().unwrap_or_default();
        assert!(e.contains("control_bin, shm_dir") && e.contains("next start"), "{e}");
        assert_eq!((&svc.m.cfg.shm_dir, &svc.m.cfg.control_bin), (&cfg.shm_dir, &cfg.control_bin), "kept");
        assert_eq!(svc.m.ctl.timeout, Duration::from_millis(1234), "the rest applied");
    }

    /// Started on built-in defaults (no config file), a reload after an override file was
    /// added beside the missing base is refused naming it, as a start refuses that layout;
    /// before, the reload kept the defaults and said it applied.
    #[test]
    fn a_reload_refuses_overrides_added_without_a_base() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("mps.json");
        let mut cfg = Config { ledger_dir: d.path().join("run"), compute_mode: mps_manager::compute_mode::ComputeModePolicy::Leave, ..Config::default() };
        cfg.finalize(None);
        let mut svc = ManagerService { m: Manager::new(cfg.clone()).unwrap(), base: base.clone(), on_defaults: true, state_file: cfg.state_file.clone(), next_check: 0 };
        assert_eq!(node_daemon::run::reload(&mut svc), node_daemon::run::Reload::Applied, "no file at all: the defaults");
        std::fs::create_dir_all(d.path().join("mps.d")).unwrap();
        let over = d.path().join("mps.d/50-tight.json");
        std::fs::write(&over, "{ \"check_every_ms\": 500 }").unwrap();
        match node_daemon::run::reload(&mut svc) {
            node_daemon::run::Reload::Kept(e) => assert_eq!(e.file, over, "{e}"),
            r => panic!("the override was ignored: {r:?}"),
        }
    }

    #[test]
    fn status_text_shows_budget_and_errors() {
        let s = ManagerState {
            gpu: 2,
            offline_budget_pct: Some(40.0),
            last_error: Some("config reload: x".into()),
            mps_server_uid: Some(1000),
            user_breaches: 2,
            compute_mode: Some("exclusive_process".into()),
            compute_mode_found: Some("default".into()),
            shm_dir: Some("/dev/shm/xshare-gpu2".into()),
            monitor_state_error: Some("/run/xshare/gpu2/state.json: No such file".into()),
            ..Default::default()
        };
        let t = status_text(&s, 1500, true);
        assert!(t.starts_with("GPU 2  (manager pid 0, updated 1500 ms ago)"), "{t}");
        let gone = status_text(&s, 61_000, false);
        assert!(gone.starts_with("GPU 2  (manager pid 0 is not running: its state as it left it, 61.0 s ago)"), "{gone}");
        assert!(t.contains("monitor state        unreadable, no XID or pending eviction seen: /run/xshare/gpu2/state.json"), "{t}");
        assert!(t.contains("MPS /dev/shm         /dev/shm/xshare-gpu2"), "{t}");
        assert!(t.contains("exclusive_process (found default, put back when MPS quits)"), "{t}");
        assert!(t.contains("uid 1000 (2 servers"), "{t}");
        assert!(t.starts_with("GPU 2"), "{t}");
        assert!(t.contains("40.0 %"), "{t}");
        assert!(t.contains("config reload: x"), "{t}");
    }
}
