//! `sysmonitor`: per-GPU health monitor daemon and its operator commands.

use std::path::PathBuf;
use std::process::ExitCode;

use sysmonitor::config::{Config, DEFAULT_PATH};
use node_daemon::{clock, monitor_state};
use sysmonitor::{daemon, report};

const HELP: &str = "\
sysmonitor - watches one GPU, keeps its health state, evicts offline work when online work is at risk

USAGE:
    sysmonitor [run] [--config FILE] [--gpu N]   run the monitor (systemd: Type=notify)
    sysmonitor status [--config FILE] [--gpu N] [--json]
                                               print the GPU's state from the state file
    sysmonitor check-config [--config FILE]    validate the config (base + overrides) and print it
    sysmonitor disable|enable [--config FILE] [--gpu N]
                                               take the GPU out of / back into service (Disabled state)

CONFIG:
    FILE defaults to $XSHARE_SYSMONITOR_CONFIG, else /etc/xshare/sysmonitor.json. Every
    <stem>.d/*.json beside it (e.g. /etc/xshare/sysmonitor.d/50-local.json) is merged over it in
    name order, key by key. Errors name the file, line and field. A missing default file means
    built-in defaults. SIGHUP reloads; a broken reload keeps the previous config and says why
    (log, state file `config_error`, metric xshare_config_error).

    Main keys: interval_ms (>= 1), history_secs, ledger_dir ($XSHARE_LEDGER_DIR overrides),
    state_file, metrics_listen (\"127.0.0.1:9400\" or \"unix:/run/xshare/m.sock\"),
    machine.{gpu_util,sm_activity,sm_clock,mem_used}.{healthy,unhealthy,overlimit,direction,enabled},
    machine.{overlimit_sustain_ms,hold_base_ms,hold_factor,hold_max_ms,overlimit_window_ms,nvml_error_limit,xid_disable_ms},
    host_memory.{min_available_pct,psi_some_avg10_pct,psi_sustain_ms}, evictor.{grace_ms,command,dry_run},
    verify.{tolerance_mib,strikes,every_ms}, xid_critical, xid_log (\"/dev/kmsg\": XIDs from the
    kernel log besides NVML events), xid_log_match (\"PCI:0000:3b:00\": only this GPU's lines).

STATES (MuxFlow): init -> healthy; healthy -> unhealthy | overlimit; unhealthy -> healthy | overlimit;
    overlimit only after a metric stays past it for overlimit_sustain_ms (default 2000) and only
    for load an online process drives (offline-only load is the shim throttle's job: unhealthy);
    overlimit -> unhealthy after a hold of hold_base_ms * hold_factor^(entries in window - 1);
    disabled on NVML errors, critical XIDs or operator. Offline work is admitted only when healthy.

LOGS: RUST_LOG=debug|info|warn (default info), to stderr.
";

struct Args {
    cmd: String,
    config: Option<PathBuf>,
    gpu: Option<u32>,
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        cmd: "run".into(),
        config: None,
        gpu: None,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    let mut cmd_set = false;
    while let Some(x) = it.next() {
        match x.as_str() {
            "-h" | "--help" | "help" => a.cmd = "help".into(),
            "--config" | "-c" => a.config = Some(it.next().ok_or("--config needs a file")?.into()),
            "--gpu" => {
                let v = it.next().ok_or("--gpu needs an index")?;
                a.gpu = Some(
                    v.parse()
                        .map_err(|_| format!("--gpu: `{v}` is not a GPU index"))?,
                );
            }
            "--json" => a.json = true,
            c if !cmd_set && !c.starts_with('-') => {
                a.cmd = c.to_string();
                cmd_set = true;
            }
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    Ok(a)
}

fn load(a: &Args) -> Result<(Config, PathBuf, Vec<PathBuf>), String> {
    let explicit = a
        .config
        .clone()
        .or_else(|| std::env::var_os("XSHARE_SYSMONITOR_CONFIG").map(PathBuf::from));
    let base = explicit.clone().unwrap_or_else(|| DEFAULT_PATH.into());
    let (mut cfg, files) = if explicit.is_none() && !base.exists() {
        tracing::warn!(
            path = DEFAULT_PATH,
            "no config file; using built-in defaults"
        );
        (Config::default(), Vec::new())
    } else {
        Config::load(&base).map_err(|e| e.to_string())?
    };
    cfg.finalize(a.gpu);
    Ok((cfg, base, files))
}

/// Writes `text` to stdout. A closed reader (`sysmonitor status | head`) is not an error:
/// the output is simply no longer wanted, so it ends quietly instead of panicking.
fn out(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(format!("writing to stdout: {e}")),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: never into files, pipes or the journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sysmonitor: {e}");
            return ExitCode::from(2);
        }
    };
    if a.cmd == "help" {
        let _ = out(HELP);
        return ExitCode::SUCCESS;
    }
    let (cfg, base, files) = match load(&a) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("sysmonitor: config error: {e}");
            return ExitCode::from(2);
        }
    };
    let r = match a.cmd.as_str() {
        "run" => daemon::run(cfg, &base, files),
        "check-config" => {
            out(&format!(
                "{}\n",
                serde_json::to_string_pretty(&cfg).unwrap_or_default()
            ))
            .map(|()| {
                eprintln!(
                    "config ok: {}",
                    files
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" + ")
                )
            })
        }
        "status" => monitor_state::read(&cfg.state_file)
            .map_err(|e| format!("{e}\n(is `sysmonitor run` running for GPU {} with the same ledger_dir / $XSHARE_LEDGER_DIR?)", cfg.gpu_index))
            .and_then(|s| {
                if a.json {
                    out(&format!("{}\n", serde_json::to_string_pretty(&s).unwrap_or_default()))
                } else {
                    out(&report::status_table(&s, clock::unix_ms()))
                }
            }),
        "disable" => {
            let f = daemon::operator_file(&cfg);
            std::fs::write(&f, b"disabled by operator\n")
                .map_err(|e| format!("{}: {e}", f.display()))
                .and_then(|_| {
                    out(&format!(
                        "GPU {} will be Disabled at the monitor's next report ({})\n",
                        cfg.gpu_index,
                        f.display()
                    ))
                })
        }
        "enable" => {
            let f = daemon::operator_file(&cfg);
            match std::fs::remove_file(&f) {
                Ok(()) => out(&format!(
                    "GPU {} re-enabled; it goes through Init\n",
                    cfg.gpu_index
                )),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => out(&format!(
                    "GPU {} was not disabled by an operator\n",
                    cfg.gpu_index
                )),
                Err(e) => Err(format!("{}: {e}", f.display())),
            }
        }
        other => Err(format!("unknown command `{other}` (see --help)")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sysmonitor: {e}");
            ExitCode::FAILURE
        }
    }
}
