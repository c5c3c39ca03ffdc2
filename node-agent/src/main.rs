//! `node-agent`: the per-GPU-host Kubernetes agent (device plugin, eviction through the API,
//! GPU heartbeat). See the crate docs and `deploy/node-agent.yaml`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, Subcommand};
use node_agent::config::AgentConfig;
use node_agent::plugin::{self, Plugin, PodSource};
use tokio::sync::watch;

#[derive(Parser)]
#[command(name = "node-agent", about = "xshare's per-GPU-host Kubernetes agent")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent: device plugin, eviction through the API, heartbeat.
    Run {
        #[arg(long, default_value = "/etc/xshare/node-agent.json")]
        config: PathBuf,
    },
    /// Check a config file, as the other daemons' `check-config` does: `config ok: FILE`, or
    /// the error naming file, line and field (exit 2). Needs no $NODE_NAME, NVML or API.
    CheckConfig {
        #[arg(long, default_value = "/etc/xshare/node-agent.json")]
        config: PathBuf,
    },
    /// Check a config file and print the CDI spec it would write.
    CdiSpec {
        #[arg(long, default_value = "/etc/xshare/node-agent.json")]
        config: PathBuf,
    },
    /// Whether each GPU's offline slots take work now, and why not: the reading the running
    /// agent advertises (the monitor's verdict from the ledger; MPS from mps-manager's state
    /// file: a control daemon running, no process holding the GPU outside MPS in
    /// EXCLUSIVE_PROCESS, the `/dev/shm` containers get). Reads files only: no API, no NVML.
    #[command(after_help = "Example:\n    node-agent status --config /etc/xshare/node-agent.json\n\n\
        GPU  offline slots  budget  why not\n\
        0    Healthy        42 %\n\
        1    Unhealthy      -       MPS: no MPS control daemon runs (mps-manager's state file ...)")]
    Status {
        #[arg(long, default_value = "/etc/xshare/node-agent.json")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    // Logs on stderr (`cdi-spec` prints the spec on stdout) at $RUST_LOG (default info),
    // coloured only on a terminal: the daemons' setup, shared.
    node_daemon::cli::init_logging();
    let cli = Cli::parse();
    let path = match &cli.cmd {
        Cmd::Run { config } | Cmd::CdiSpec { config } | Cmd::Status { config } | Cmd::CheckConfig { config } => config.clone(),
    };
    let status = matches!(cli.cmd, Cmd::Status { .. } | Cmd::CheckConfig { .. });
    let env = |k: &str| {
        // `status` and `check-config` read files only and never name the node: they run from an
        // operator's shell, where $NODE_NAME (the DaemonSet's downward API) is not set.
        std::env::var(k).ok().or_else(|| (status && k == node_agent::config::ENV_NODE_NAME).then(|| "(status)".to_string()))
    };
    let mut cfg = match AgentConfig::load(&path, env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("node-agent: config error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Cmd::CheckConfig { .. } = cli.cmd {
        // The placeholder `env` gave: no node_name in the file and no $NODE_NAME here.
        let from_env = if cfg.node_name == "(status)" { " (node_name from $NODE_NAME where the DaemonSet runs it)" } else { "" };
        eprintln!("config ok: {}{from_env}", path.display());
        return ExitCode::SUCCESS;
    }
    if let Cmd::Status { .. } = cli.cmd {
        // A closed stdout (`| head`) is not worth a panic.
        let _ = write!(std::io::stdout(), "{}", status_table(&cfg));
        return ExitCode::SUCCESS;
    }
    let nvml = node_agent::gpus::NvmlLookup::init();
    // `cdi-spec` may run off the node (no driver); `run` hands the UUIDs to containers.
    let unchecked_ok = matches!(cli.cmd, Cmd::CdiSpec { .. }) || cfg.allow_unverified_uuids;
    if let Err(e) = node_agent::gpus::resolve(&mut cfg, |i| nvml.gpu(i), unchecked_ok) {
        eprintln!("node-agent: {}: {e}", path.display());
        return ExitCode::from(2);
    }
    match cli.cmd {
        // Answered above, before NVML.
        Cmd::Status { .. } | Cmd::CheckConfig { .. } => ExitCode::SUCCESS,
        Cmd::CdiSpec { .. } => {
            let text = serde_json::to_string_pretty(&node_agent::allocate::cdi_spec(&cfg))
                .unwrap_or_default();
            // A closed stdout (`| head`) is not worth a panic.
            let _ = writeln!(std::io::stdout(), "{text}");
            ExitCode::SUCCESS
        }
        Cmd::Run { .. } => {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("node-agent: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(run(Arc::new(cfg))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("node-agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `node-agent status`: one line per served GPU.
fn status_table(cfg: &AgentConfig) -> String {
    let mut out = format!(
        "node-agent status: ledgers {}\n{:<4} {:<14} {:<7} {}\n",
        cfg.ledger_dir.display(),
        "GPU",
        "offline slots",
        "budget",
        "why not"
    );
    for (i, h) in node_agent::health::read_offline(cfg) {
        let budget = h.budget_permille.map_or("-".to_string(), |p| format!("{} %", p / 10));
        let slots = if h.healthy() { plugin::HEALTHY } else { plugin::UNHEALTHY };
        out.push_str(&format!("{i:<4} {slots:<14} {budget:<7} {}\n", h.why));
    }
    out.push_str(&offline_pods_line(cfg));
    out
}

/// `node-agent status`'s line on the offline pod list the monitors read.
fn offline_pods_line(cfg: &AgentConfig) -> String {
    let path = node_daemon::offline_pods::path(&cfg.ledger_dir);
    let off = if cfg.offline_pods.enabled { "" } else { " (offline_pods.enabled is false: not refreshed)" };
    match node_daemon::offline_pods::read(&path) {
        Ok(Some(l)) => {
            let age_s = node_daemon::clock::unix_ms().saturating_sub(l.unix_ms) / 1000;
            format!("offline pod list: {} pods, listed {age_s} s ago ({}){off}\n", l.pods.len(), path.display())
        }
        Ok(None) => format!("offline pod list: none written ({}){off}\n", path.display()),
        Err(e) => format!("offline pod list: ERROR {e}{off}\n"),
    }
}

/// Runs `step` every `period` until `stop` changes, keeping the Prometheus text it returns in
/// `metrics` (served by the metrics listener).
async fn every<F>(period: Duration, mut stop: watch::Receiver<bool>, metrics: Arc<Mutex<String>>, mut step: F)
where
    F: AsyncFnMut() -> String,
{
    loop {
        let text = step().await;
        if let Ok(mut g) = metrics.lock() {
            *g = text;
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
    }
}

async fn run(cfg: Arc<AgentConfig>) -> Result<(), String> {
    if cfg.cdi.enabled {
        let p = node_agent::allocate::write_cdi_spec(&cfg).map_err(|e| {
            format!(
                "writing the CDI spec into {}: {e}",
                cfg.cdi.spec_dir.display()
            )
        })?;
        tracing::info!(spec = %p.display(), "CDI spec written");
    }
    let client = node_agent::kube::client(&cfg.kube).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (health_tx, health_rx) = watch::channel(BTreeMap::new());
    let (dev_tx, dev_rx) = watch::channel(Vec::new());
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(plugin::poll_health(
        cfg.clone(),
        health_tx,
        dev_tx,
        stop_rx.clone(),
    )));
    let health_view = health_rx.clone();
    if cfg.heartbeat.enabled {
        tasks.push(tokio::spawn(node_agent::heartbeat::run(
            cfg.clone(),
            client.clone(),
            health_rx.clone(),
            stop_rx.clone(),
        )));
    }
    // One store of frozen plans for Allocate and the offline pod list (`node_agent::plans`).
    let plans = Arc::new(node_agent::plans::PlanStore::open(&cfg.ledger_dir));
    let p = Arc::new(
        Plugin::new(cfg.clone(), health_rx, dev_rx, PodSource::Api(client.clone())).with_plans(plans.clone()),
    );
    let plugin_view = p.clone();
    let c = cfg.clone();
    let s = stop_rx.clone();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = plugin::run(c, p, s).await {
            tracing::error!(error = %e, "device plugin stopped");
        }
    }));
    let metrics = Arc::new(Mutex::new(String::new()));
    if cfg.eviction.enabled {
        let gpus: Vec<u32> = cfg.gpus.iter().map(|g| g.index).collect();
        let mut ev = node_agent::evict::Evictor::new(
            client.clone(),
            &cfg.node_name,
            &cfg.ledger_dir,
            gpus,
            &cfg.device_plugin.resource_name,
            Duration::from_millis(cfg.eviction.retry_ms),
        );
        let period = Duration::from_millis(cfg.eviction.poll_ms);
        tasks.push(tokio::spawn(every(period, stop_rx.clone(), metrics.clone(), async move || {
            ev.tick().await;
            ev.metrics()
        })));
    }
    let online_metrics = Arc::new(Mutex::new(String::new()));
    if cfg.online_gpus.enabled {
        let mut w = node_agent::online_gpus::OnlineGpus::new(client.clone(), &cfg);
        let period = Duration::from_millis(cfg.online_gpus.poll_ms);
        tasks.push(tokio::spawn(every(period, stop_rx.clone(), online_metrics.clone(), async move || {
            w.tick().await;
            w.metrics()
        })));
    }
    let list_metrics = Arc::new(Mutex::new(String::new()));
    if cfg.offline_pods.enabled {
        let publisher = node_agent::offline_pods::Publisher::new(
            &cfg.node_name,
            &cfg.device_plugin.resource_name,
            &cfg.ledger_dir,
        )
        .with_plans(plans.clone())
        .with_kubelet_grace_ms(cfg.offline_pods.kubelet_eviction_grace_ms)
        .with_deleted_pod_linger(Duration::from_millis(cfg.offline_pods.deleted_pod_linger_ms))
        .with_cgroup_root((!cfg.offline_pods.cgroup_root.is_empty()).then(|| cfg.offline_pods.cgroup_root.clone().into()));
        let watch_client = node_agent::kube::watch_client(&cfg.kube, node_agent::offline_pods::WATCH_TIMEOUT_S).await?;
        let check = Duration::from_millis(cfg.offline_pods.poll_ms);
        tasks.push(tokio::spawn(node_agent::offline_pods::run(
            watch_client,
            publisher,
            check,
            stop_rx.clone(),
            list_metrics.clone(),
        )));
    }
    if !cfg.metrics_listen.is_empty() {
        let l = tokio::net::TcpListener::bind(&cfg.metrics_listen)
            .await
            .map_err(|e| format!("metrics_listen {}: {e}", cfg.metrics_listen))?;
        let (c, m, lm, om, dp, pl) = (cfg.clone(), metrics.clone(), list_metrics.clone(), online_metrics.clone(), plugin_view, plans.clone());
        let render = Arc::new(move || {
            let mut o = node_agent::metrics::gpu_metrics(&c, &health_view.borrow());
            o.push_str(&dp.metrics());
            o.push_str(&pl.metrics(&c.node_name));
            o.push_str(&m.lock().map(|g| g.clone()).unwrap_or_default());
            o.push_str(&lm.lock().map(|g| g.clone()).unwrap_or_default());
            o.push_str(&om.lock().map(|g| g.clone()).unwrap_or_default());
            o
        });
        tasks.push(tokio::spawn(node_agent::metrics::serve(
            l,
            render,
            stop_rx.clone(),
        )));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping");
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    Ok(())
}
