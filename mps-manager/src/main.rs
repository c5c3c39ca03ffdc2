//! `mps-manager`: keeps one GPU's MPS control daemon running, sets the offline SM budget,
//! detects MPS failures and recovers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use mps_manager::config::{Config, DEFAULT_PATH};
use mps_manager::manager::{Manager, ManagerState};
use node_daemon::run::Service;
use node_daemon::sdnotify::Notifier;
use node_daemon::ConfigError;

const HELP: &str = "\
mps-manager - runs one GPU's MPS control daemon, gives offline work the SM share online work leaves free,
and recovers MPS when it crashes or hangs

USAGE:
    mps-manager [run] [--config FILE] [--gpu N]    run (systemd: Type=notify)
    mps-manager status [--config FILE] [--gpu N]   print the manager's state file
    mps-manager check-config [--config FILE]       validate and print the effective config

CONFIG:
    FILE defaults to $XSHARE_MPS_MANAGER_CONFIG, else /etc/xshare/mps-manager.json, plus
    <stem>.d/*.json overrides merged in name order. Errors name file, line and field; SIGHUP
    reloads and keeps the previous config when the new one is broken.
    Keys: gpu_index, ledger_dir ($XSHARE_LEDGER_DIR), control_bin, pipe_dir, log_dir,
    command_timeout_ms, period_ms, check_every_ms, quit_on_exit, monitor_state_file, state_file,
    evict_grace_ms, budget.{headroom_pct,min_pct,max_pct,min_step_pct,smoothing,unsafe_pct},
    detect.{stuck_after_ms,idle_sm_pct}, recovery.{min_interval_ms,max_per_hour}.

SM BUDGET:
    offline % = clamp(100 - online SM activity (smoothed) - headroom, min, max); unsafe_pct while
    the GPU is Overlimit/Disabled/unknown. Published in the ledger (the shim throttles
    running offline processes to it) and set as MPS's default and offline servers' active-thread
    percentage, so offline clients that start afterwards are capped from their first kernel.

FAULTS -> RECOVERY (rate-limited):
    control daemon dead, command timeout (hang), MPS server with clients vanished, clients stuck
    (no launches and idle SMs), critical XID from sysmonitor -> SIGTERM/SIGKILL offline clients,
    mark them for restart (state file restart_requested), quit/kill MPS, start it again.
";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut cmd = "run".to_string();
    let mut config: Option<PathBuf> = None;
    let mut gpu: Option<u32> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" | "--help" | "help" => {
                print!("{HELP}");
                return ExitCode::SUCCESS;
            }
            "--config" | "-c" => match args.next() {
                Some(v) => config = Some(v.into()),
                None => return fail("--config needs a file", 2),
            },
            "--gpu" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) => gpu = Some(v),
                None => return fail("--gpu needs a GPU index", 2),
            },
            "run" | "status" | "check-config" => cmd = a,
            other => return fail(&format!("unknown argument `{other}` (see --help)"), 2),
        }
    }
    let explicit =
        config.or_else(|| std::env::var_os("XSHARE_MPS_MANAGER_CONFIG").map(PathBuf::from));
    let base = explicit.clone().unwrap_or_else(|| DEFAULT_PATH.into());
    let loaded = if explicit.is_none() && !base.exists() {
        Ok((Config::default(), Vec::new()))
    } else {
        Config::load(&base)
    };
    let (mut cfg, files) = match loaded {
        Ok(x) => x,
        Err(e) => return fail(&format!("config error: {e}"), 2),
    };
    cfg.finalize(gpu);
    match cmd.as_str() {
        "check-config" => {
            println!("{}", serde_json::to_string_pretty(&cfg).unwrap_or_default());
            ExitCode::SUCCESS
        }
        "status" => match std::fs::read_to_string(&cfg.state_file)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<ManagerState>(&t).map_err(|e| e.to_string()))
        {
            Ok(s) => {
                print_status(&s);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("{}: {e}", cfg.state_file.display()), 1),
        },
        _ => match run(cfg, base, files) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e, 1),
        },
    }
}

fn fail(msg: &str, code: u8) -> ExitCode {
    eprintln!("mps-manager: {msg}");
    ExitCode::from(code)
}

fn print_status(s: &ManagerState) {
    println!("GPU {}  (manager pid {})", s.gpu, s.manager_pid);
    println!(
        "  {:<20} {}",
        "control daemon",
        s.daemon_pid.map_or("not running".into(), |p| p.to_string())
    );
    println!(
        "  {:<20} {:?} ({} clients)",
        "servers", s.servers, s.clients
    );
    println!(
        "  {:<20} {}",
        "gpu health",
        s.gpu_health.as_deref().unwrap_or("unknown")
    );
    println!(
        "  {:<20} {:.1} % total, {:.1} % online (est.)",
        "sm activity", s.sm_activity_pct, s.online_estimate_pct
    );
    println!(
        "  {:<20} {}",
        "offline SM budget",
        s.offline_budget_pct
            .map_or("-".into(), |b| format!("{b:.1} %"))
    );
    println!("  {:<20} {:?}", "faults", s.faults);
    println!(
        "  {:<20} {} ({} suppressed by rate limit)",
        "recoveries",
        s.recoveries.len(),
        s.suppressed_recoveries
    );
    for r in s.recoveries.iter().rev().take(5) {
        println!("    {:?}: {} (evicted {:?})", r.fault, r.outcome, r.evicted);
    }
    println!(
        "  {:<20} {}",
        "restart requested",
        s.restart_requested.len()
    );
    if let Some(e) = &s.last_error {
        println!("  {:<20} {e}", "last error");
    }
}

/// The manager as a [`Service`] of the shared run/reload loop.
struct ManagerService {
    m: Manager,
    base: PathBuf,
    state_file: PathBuf,
    next_check: u64,
}

impl Service for ManagerService {
    type Config = (Config, Vec<PathBuf>);

    fn load(&mut self) -> Result<Self::Config, ConfigError> {
        Config::load(&self.base)
    }

    fn apply(&mut self, (mut new, _): Self::Config) {
        let cfg = &self.m.cfg;
        new.finalize(Some(cfg.gpu_index));
        new.ledger_dir = cfg.ledger_dir.clone();
        new.pipe_dir = cfg.pipe_dir.clone();
        new.log_dir = cfg.log_dir.clone();
        new.state_file = cfg.state_file.clone();
        self.m.ctl.timeout = Duration::from_millis(new.command_timeout_ms);
        self.m.cfg = new;
        self.m.state.last_error = None;
    }

    fn reload_failed(&mut self, error: &ConfigError) {
        self.m.state.last_error = Some(format!("config reload: {error}"));
    }

    fn tick(&mut self, now: u64, notifier: &Notifier) -> u64 {
        self.m.budget_tick();
        if now >= self.next_check {
            self.next_check = now + self.m.cfg.check_every_ms;
            let faults = self.m.check(now);
            self.m.handle_faults(now, faults);
            self.m.write_state(&self.state_file);
            notifier.notify("WATCHDOG=1");
        }
        node_daemon::clock::mono_ms() + self.m.cfg.period_ms
    }

    fn stop(&mut self) {
        self.m.shutdown();
        self.m.write_state(&self.state_file);
    }
}

fn run(cfg: Config, base: PathBuf, _files: Vec<PathBuf>) -> Result<(), String> {
    node_daemon::signals::install_signal_handlers();
    let mut m = Manager::new(cfg.clone())?;
    let state_file = cfg.state_file.clone();
    if let Some(d) = state_file.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    m.ensure_daemon()
        .map_err(|e| format!("cannot start MPS: {e}"))?;
    let notifier = Notifier::from_env();
    notifier.notify("READY=1");
    tracing::info!(gpu = cfg.gpu_index, pipe_dir = %cfg.pipe_dir.display(), "mps-manager running");
    let mut svc = ManagerService {
        m,
        base,
        state_file,
        next_check: 0,
    };
    node_daemon::run::run(&mut svc, &notifier);
    Ok(())
}
