//! `sysmonitor`: per-GPU health monitor daemon and its operator commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use node_daemon::cli::{out, ConfigArgs};
use node_daemon::{clock, monitor_state};
use sysmonitor::config::{Config, DEFAULT_PATH};
use sysmonitor::{daemon, report};

/// Read after the options by `--help`: how the monitor is configured and what it decides.
const AFTER_HELP: &str = "\
CONFIG:
    FILE defaults to $XSHARE_SYSMONITOR_CONFIG, else /etc/xshare/sysmonitor.json. Every
    <stem>.d/*.json beside it (e.g. /etc/xshare/sysmonitor.d/50-local.json) is merged over it in
    name order, key by key, over the built-in defaults (a block given in part keeps the defaults
    of the rest). Errors name the file, line and field; a key given twice is one. A missing
    default file means built-in defaults; a file named by -c or the variable must exist. SIGHUP reloads; a broken reload keeps the previous config and says why
    (log, state file `config_error`, metric xshare_config_error).

    Main keys: interval_ms (>= 1), idle_interval_ms (100: the pace while no offline process is
    registered and the GPU is healthy; 0 = always interval_ms), history_secs, ledger_dir (absolute; $XSHARE_LEDGER_DIR overrides),
    state_file (`{gpu}`: the GPU index; each GPU's monitor needs its own), metrics_listen (one per GPU: \"127.0.0.1:9410+{gpu}\" is port 9410 plus
    the GPU index, or \"unix:/run/xshare/metrics-{gpu}.sock\"),
    machine.{gpu_util,sm_activity,sm_clock,mem_used}.{healthy,unhealthy,overlimit,direction,enabled}
    (percentages; Overlimit is strictly past `overlimit`: at 100 (0 for direction \"below\") the
    metric never causes Overlimit, said as a warning),
    machine.{overlimit_sustain_ms,hold_base_ms,hold_factor,hold_max_ms,overlimit_window_ms,nvml_error_limit,xid_disable_ms}
    (nvml_error_limit: 1..=100 failed samples in a row),
    host_memory.{min_available_pct,psi_some_avg10_pct,psi_sustain_ms}, evictor.{grace_ms,command,dry_run}
    (grace_ms: 1000..=600000 between SIGTERM and SIGKILL)
    (command: argv with {pid} (pid here, checked by its start time; never run without one),
    {start_time}, {reason}, {gpu}),
    verify.{tolerance_mib,context_mib,strikes,every_ms}, xid_critical, xid_log (\"/dev/kmsg\": XIDs from the
    kernel log besides NVML events; only /dev/kmsg's kernel records cannot be forged by a user),
    xid_log_match (\"PCI:0000:3b:00\" or nvidia-smi's \"00000000:3B:00.0\": only XIDs naming this GPU's address).
    `sysmonitor check-config` prints the effective config.

STATES (MuxFlow): init -> healthy; healthy -> unhealthy | overlimit; unhealthy -> healthy | overlimit;
    overlimit only after a metric stays past it for overlimit_sustain_ms (default 2000) and only
    for the online workload's own demand (offline-only load is the shim throttle's job:
    unhealthy; beside offline work busy-time metrics count at most unhealthy and GPM's SM
    activity is judged as the online share left by the offline MPS budget);
    overlimit -> unhealthy after a hold of hold_base_ms * hold_factor^(entries in window - 1);
    disabled on NVML errors, critical XIDs or operator. Offline work is admitted only when healthy.
    A restarted monitor resumes an Overlimit hold, the grace of evictions in flight and a
    critical XID's Disabled (until xid_disable_ms passes, or `enable` when it is 0). A critical
    XID reported before or during an operator's disable is kept (state file
    `xid_under_operator`): the operator's `enable` leaves the GPU Disabled by it.

FILES: <ledger_dir>/pods/<pod uid>/gpu<N>/ledger (one per offline pod, made by node-agent's
    Allocate and mounted into that pod alone, where the shim looks for gpu<N>/ledger; read with
    the GPU's own ledger, a damaged one refused and named in `status`), <ledger_dir>/gpu<N>/ledger
    (the GPU's own, for offline work outside Kubernetes; shared with the shim and mps-manager),
    <ledger_dir>/status/gpu<N> (health, load and the offline jobs of every ledger, for the
    shims, mps-manager and node-agent; containers get status/ read-only).
    In <ledger_dir>/daemons/gpu<N>/, never mounted into containers: state.json (what `status`
    reads), `disabled` (operator switch), `enable` (an operator's enable of an XID's Disabled,
    removed by the monitor), sysmonitor.lock (one monitor per GPU), state.json.lock (one writer
    per state file, wherever it is).

LOGS: RUST_LOG=debug|info|warn (default info), to stderr.

EXAMPLES:
    sysmonitor run --gpu 0                      under systemd: xshare-sysmonitor@0.service
    sysmonitor status --gpu 0                   state, hold left, metrics, evictions
    sysmonitor check-config -c ./sysmonitor.json
    sysmonitor nvml-cost --gpu 0                what each NVML query costs on this GPU, and in all
    sysmonitor nvml-cost --gpu 0 --gap-ms 10    the same, each call spaced as the monitor spaces them
    kill -HUP $(pidof sysmonitor)               reload the config
";

node_daemon::daemon_cli! {
    /// sysmonitor - watches one GPU, keeps its health state, evicts offline work when online work
    /// is at risk.
    name = "sysmonitor",
    after_long_help = AFTER_HELP,
    cmd = Cmd,
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
enum Cmd {
    /// Run the monitor until SIGTERM (systemd: Type=notify, watchdog); SIGHUP reloads the config.
    Run,
    /// Print the GPU's state from the state file the running monitor writes; exit 3 when no
    /// monitor runs for the GPU (the file is then how the last one left it).
    Status {
        /// The whole state file as JSON, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Validate the config (base + overrides) and print the effective config.
    CheckConfig,
    /// Take the GPU out of service: Disabled at the next report, offline work evicted.
    Disable,
    /// Put the GPU back into service (it goes through Init): ends an operator's `disable`, or
    /// else a critical XID's Disabled. A critical XID reported before or during the operator's
    /// disable outlasts it: the GPU stays Disabled by the XID until a second `enable`.
    Enable,
    /// Time each NVML query the monitor makes on this GPU (CPU per call) and what they add up
    /// to at the configured interval_ms: where the monitor's CPU goes on this driver. Safe
    /// beside a running monitor (its own NVML handle; reads only).
    NvmlCost {
        /// Calls timed per query (GPM metrics, about 1 ms each on a real GPU: at most 100).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        calls: u32,
        /// Sleep this long before each timed call, as the monitor spaces its calls (a call
        /// made every few ms finds cold caches; 0: back to back, the cost at its cheapest).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1000))]
        gap_ms: u64,
        /// The report as JSON, for scripts.
        #[arg(long)]
        json: bool,
    },
}

fn load(a: &ConfigArgs) -> Result<(Config, PathBuf, Vec<PathBuf>), String> {
    let l = a
        .load("XSHARE_SYSMONITOR_CONFIG", DEFAULT_PATH, Config::load)
        .map_err(|e| e.to_string())?;
    let mut cfg = l.config;
    cfg.finalize(a.gpu);
    Ok((cfg, l.base, l.files))
}

fn main() -> ExitCode {
    node_daemon::cli::init_logging();
    let cli = Cli::parse();
    let a = &cli.cfg;
    let cmd = cli.cmd.clone().unwrap_or(Cmd::Run);
    let (cfg, base, files) = match load(a) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("sysmonitor: config error: {e}");
            return ExitCode::from(2);
        }
    };
    // `status` of a GPU whose monitor is not running: printed, then exit 3 (as `systemctl
    // status` says a unit is not running), so a script or probe sees what a person reads.
    let mut not_running = false;
    let gpu = cfg.gpu_index;
    let r = match cmd {
        Cmd::Run => daemon::run(cfg, &base, files),
        Cmd::CheckConfig => {
            out(&format!(
                "{}\n",
                serde_json::to_string_pretty(&cfg).unwrap_or_default()
            ))
            .map(|()| {
                for w in cfg.machine.never_overlimit() {
                    eprintln!("warning: {w}");
                }
                let ledger_dir = cfg.ledger_dir.clone();
                let socket = cfg.metrics_listen.as_deref().and_then(|l| l.strip_prefix("unix:")).map(std::path::PathBuf::from);
                let mut written = vec![("ledger_dir", ledger_dir.as_path()), ("state_file", cfg.state_file.as_path())];
                if let Some(s) = &socket {
                    written.push(("metrics_listen", s.as_path()));
                }
                for w in node_daemon::cli::unit_write_warnings(&written) {
                    eprintln!("warning: {w}");
                }
                eprintln!("{}", node_daemon::cli::config_ok_line(&files, &base))
            })
        }
        Cmd::Status { json } => monitor_state::read_for(&cfg.state_file, cfg.gpu_index)
            .map_err(|e| format!("{e}\n(is `sysmonitor run` running for GPU {} with the same ledger_dir / $XSHARE_LEDGER_DIR?)", cfg.gpu_index))
            .and_then(|s| {
                // The monitor of this GPU runs while its single-instance lock is held.
                let running = node_daemon::instance::held(&daemon::lock_file(&cfg));
                not_running = !running;
                if json {
                    out(&format!("{}\n", serde_json::to_string_pretty(&s).unwrap_or_default()))
                } else {
                    out(&report::status_table(&s, clock::unix_ms(), running))
                }
            }),
        Cmd::NvmlCost { calls, gap_ms, json } => sysmonitor::sampler::NvmlSource::open(cfg.gpu_index, &cfg.nvml).and_then(|mut src| {
            let pace = sysmonitor::nvmlcost::Pace::of(&cfg);
            let gap = std::time::Duration::from_millis(gap_ms);
            let r = sysmonitor::nvmlcost::measure(&mut src, cfg.gpu_index, calls, gap, pace);
            if json {
                out(&format!("{}\n", serde_json::to_string_pretty(&r).unwrap_or_default()))
            } else {
                out(&sysmonitor::nvmlcost::table(&r))
            }
        }),
        Cmd::Disable => {
            let f = daemon::operator_file(&cfg);
            let running = node_daemon::instance::held(&daemon::lock_file(&cfg));
            std::fs::write(&f, b"disabled by operator\n")
                .map_err(|e| match f.parent().filter(|d| !d.exists()) {
                    Some(d) => format!(
                        "no monitor has run for GPU {} on this host ({} does not exist): is it the right --gpu and ledger_dir?",
                        cfg.gpu_index,
                        d.display()
                    ),
                    None => format!("{}: {e}", f.display()),
                })
                .and_then(|_| {
                    if !running {
                        eprintln!(
                            "warning: no monitor runs for GPU {}: it is Disabled when one starts; the file lives in {} \
                             (a tmpfs under /run: a reboot ends the disable)",
                            cfg.gpu_index,
                            f.parent().unwrap_or(&f).display()
                        );
                    }
                    out(&format!(
                        "GPU {} will be Disabled at the monitor's next report ({})\n",
                        cfg.gpu_index,
                        f.display()
                    ))
                })
        }
        Cmd::Enable => {
            let f = daemon::operator_file(&cfg);
            match std::fs::remove_file(&f) {
                Ok(()) => match monitor_state::read_for(&cfg.state_file, cfg.gpu_index).ok().and_then(|s| s.xid_under_operator) {
                    Some((xid, _)) => out(&format!(
                        "GPU {}: the operator's disable is over, but the GPU stays Disabled by XID {xid}, \
                         reported before or during it; run `sysmonitor enable` again to end that\n",
                        cfg.gpu_index
                    )),
                    None => out(&format!("GPU {} re-enabled; it goes through Init\n", cfg.gpu_index)),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Disabled by an XID, or (an `enable` right after the one that ended the
                    // operator's disable, before the monitor looked) by the XID that disable hid.
                    let hidden = || monitor_state::read_for(&cfg.state_file, cfg.gpu_index).ok().and_then(|s| s.xid_under_operator).map(|x| x.0);
                    match monitor_state::disabling_xid(&cfg.state_file, cfg.gpu_index).or_else(hidden) {
                        // Kept across monitor restarts: only an operator puts it back.
                        Some(xid) => {
                            let f = daemon::enable_file(&cfg);
                            std::fs::write(&f, b"enabled by operator\n")
                                .map_err(|e| format!("{}: {e}", f.display()))
                                .and_then(|_| {
                                    out(&format!(
                                        "GPU {} was Disabled by XID {xid}; re-enabled at the monitor's next look ({}); it goes through Init\n",
                                        cfg.gpu_index,
                                        f.display()
                                    ))
                                })
                        }
                        None => out(&format!(
                            "GPU {} was not disabled by an operator\n",
                            cfg.gpu_index
                        )),
                    }
                }
                Err(e) => Err(format!("{}: {e}", f.display())),
            }
        }
    };
    match r {
        Ok(()) if not_running => {
            eprintln!("sysmonitor: the monitor of GPU {gpu} is not running (exit 3)");
            ExitCode::from(3)
        }
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sysmonitor: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent_and_defaults_to_run() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["sysmonitor", "--gpu", "1"]).unwrap();
        assert_eq!((c.cmd, c.cfg.gpu), (None, Some(1)));
        let c = Cli::try_parse_from(["sysmonitor", "status", "--json", "-c", "/x.json"]).unwrap();
        assert_eq!(c.cmd, Some(Cmd::Status { json: true }));
        let e = Cli::try_parse_from(["sysmonitor", "stauts"]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "a typo is a usage error, not a run");
    }

    /// A subcommand's --help said "see CONFIG below" and had no CONFIG section.
    #[test]
    fn subcommand_help_points_at_a_config_section_it_has() {
        let mut c = Cli::command();
        // The global options reach the subcommands when the command is built, as at parsing.
        c.build();
        for name in ["run", "check-config", "status"] {
            let h = c.find_subcommand_mut(name).unwrap().render_long_help().to_string();
            assert!(!h.contains("see CONFIG below"), "{name} --help:\n{h}");
            assert!(h.contains("--config <FILE>") && h.contains("CONFIG in the daemon's own --help"), "{name} --help:\n{h}");
        }
    }

    #[test]
    fn long_help_teaches_config_states_and_examples() {
        let h = Cli::command().render_long_help().to_string();
        for want in [
            "XSHARE_SYSMONITOR_CONFIG",
            "sysmonitor.d",
            "SIGHUP",
            "overlimit_sustain_ms",
            "STATES",
            "EXAMPLES",
            "check-config",
            "--gpu <N>",
            "--config <FILE>",
        ] {
            assert!(h.contains(want), "--help lacks {want}:\n{h}");
        }
    }
}
