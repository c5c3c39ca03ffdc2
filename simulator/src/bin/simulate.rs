//! `simulate`: replays the Alibaba 2023 GPU trace under xshare's sharing modes.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use cluster_matcher::predictor::SpeedPredictor;
use simulator::{table, JobTypes, Mode, Policy, Sim, SimConfig, Trace, TraceOptions};

/// Trace-driven GPU cluster simulator running xshare's own planner, health machine and
/// throttle on a simulated clock.
///
/// Online services are the trace's LS pods (each on its own GPU(s), first-fit by GPU model,
/// with a seeded diurnal request rate of 20-190 QPS); offline jobs are its BE pods (arrival and
/// exclusive duration from the trace). Offline jobs run only beside online services (MuxFlow's
/// setting). Every round the real planner (`cluster_matcher::plan::plan_round`, KM matching on
/// predicted throughput) places waiting jobs; every tick each online GPU is evaluated by the
/// interference model (simulator::model), sampled by the real health machine
/// (sysmonitor::health) and, in MuxFlow modes, throttled (xshare-control) under the SM
/// budget of mps-manager's allocator. Latency is normalized to the same services alone (what
/// Online-only measures); JCT and oversold GPU (MuxFlow eq. 3) also to MuxFlow's run.
///
/// Examples:
///
///   simulate                                  # every mode, default trace replay
///
///   simulate --policy all --plots plots/      # MuxFlow under every planner policy, plots
///
///   simulate --mode muxflow --mode time-sharing --json out.json
///
///   simulate --compress 48 --offline-copies 2 --seed 7
///
///   # the health machine is fed as sysmonitor's monitor feeds it (co-location judged:
///   # beside offline work only the online workload's own demand evicts), so the shipped
///   # thresholds apply; --health FILE changes them (sysmonitor's `machine` JSON).
#[derive(Parser, Debug)]
#[command(name = "simulate", version, verbatim_doc_comment)]
struct Args {
    /// Sharing modes to run (repeat; default: all seven).
    #[arg(long = "mode", value_enum)]
    modes: Vec<Mode>,
    /// Planner policies (`cluster.json` `policy`) to run in the matching modes (MuxFlow,
    /// MuxFlow-S): max-throughput, gavel-max-min, drf, optimus, gandiva, or `all` (repeat;
    /// default: max-throughput). Given without --mode: Online-only and MuxFlow.
    #[arg(long = "policy")]
    policies: Vec<String>,
    /// Offline tenants (jobs spread over them by a seeded hash of their name; DRF, fairness).
    #[arg(long, default_value_t = 4)]
    tenants: u32,
    /// Write SVG plots here (latency and JCT CDFs, utilization over time, per-run bars).
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Seed for every random choice (job types, service parameters, QPS curves, copies).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Alibaba trace directory (default: `<data>/alibaba-gpu-v2023`).
    #[arg(long)]
    trace_dir: Option<PathBuf>,
    /// Pod list inside the trace directory.
    #[arg(long, default_value = "openb_pod_list_default.csv")]
    pods: String,
    /// Gavel throughput file (default: `<data>/gavel/simulation_throughputs.json`).
    #[arg(long)]
    gavel: Option<PathBuf>,
    /// Speed predictor model (default: cluster-matcher/examples/speed-predictor.json).
    #[arg(long)]
    predictor: Option<PathBuf>,
    /// Divide arrival times by this factor (durations are kept): the trace's ~37 days of
    /// arrivals replayed denser, as MuxFlow repeats its trace to fill the cluster.
    #[arg(long, default_value_t = 24.0)]
    compress: f64,
    /// Repeat each BE pod this many times (copies arrive up to an hour later, seeded).
    #[arg(long, default_value_t = 1)]
    offline_copies: u32,
    /// Keep only the first N offline jobs (0 = all).
    #[arg(long, default_value_t = 0)]
    max_offline: usize,
    /// Seconds between ticks (model, health sample, throttle).
    #[arg(long, default_value_t = 30.0)]
    tick_s: f64,
    /// Seconds between placement rounds.
    #[arg(long, default_value_t = 60.0)]
    round_s: f64,
    /// MuxFlow / MuxFlow-S: re-match running jobs too every N rounds (the planner may move
    /// them; each move costs the restart penalty); 0 = never.
    #[arg(long, default_value_t = 0)]
    rematch_every: u64,
    /// Solo work (s) lost on an eviction, move or lost GPU.
    #[arg(long, default_value_t = 60.0)]
    restart_penalty_s: f64,
    /// SLO: a request violates it when its tick is slower than this many times alone.
    #[arg(long, default_value_t = 1.5)]
    slo_slowdown: f64,
    /// Per-online-workload SLOs: each service's own p99 slowdown target, seeded uniformly in
    /// LO,HI (e.g. 1.2,1.8); violations are judged against it instead of --slo-slowdown.
    #[arg(long, value_parser = parse_range)]
    slo_range: Option<(f64, f64)>,
    /// The offline SM budget follows each service's SLO slack (MuxFlow modes; with
    /// --slo-range the per-service target, else --slo-slowdown). With --slo-compare both.
    #[arg(long)]
    slo_follow_slack: bool,
    /// Run each MuxFlow-mode run twice: SM budget as shipped, and following SLO slack.
    #[arg(long)]
    slo_compare: bool,
    /// Offline jobs an online GPU may host at once (`cluster.json` `max_offline_per_gpu`;
    /// MuxFlow modes; the time-sharing modes keep one).
    #[arg(long, default_value_t = 1)]
    max_offline_per_gpu: u32,
    /// Global multiplier on every GPU's offline SM budget (MuxFlow modes; 1 = as shipped).
    #[arg(long, default_value_t = 1.0)]
    budget_scale: f64,
    /// With --slo-compare: also find the global --budget-scale at which the shipped SM
    /// budget (without the slack loop) has the slack-following run's SLO violations
    /// (bisection, up to 10 runs per mode and policy), and report both at equal violations.
    #[arg(long, requires = "slo_compare")]
    match_violations: bool,
    /// Health machine config (sysmonitor's `machine` JSON: thresholds, holds); default: its defaults.
    #[arg(long)]
    health: Option<PathBuf>,
    /// Write the reports as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

fn parse_range(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s.split_once(',').ok_or("expected LO,HI")?;
    let lo: f64 = a.trim().parse().map_err(|e| format!("{a}: {e}"))?;
    let hi: f64 = b.trim().parse().map_err(|e| format!("{b}: {e}"))?;
    if !(lo >= 1.0 && hi >= lo && hi.is_finite()) {
        return Err(format!("{s}: need 1 <= LO <= HI"));
    }
    Ok((lo, hi))
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("simulate: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), String> {
    let data = simulator::data_dir();
    let trace_dir = a
        .trace_dir
        .unwrap_or_else(|| data.join("alibaba-gpu-v2023"));
    let opt = TraceOptions {
        compress: a.compress,
        offline_copies: a.offline_copies,
        max_offline: a.max_offline,
        seed: a.seed,
    };
    let trace = Trace::load(&trace_dir, &a.pods, &opt).map_err(|e| e.to_string())?;
    let types = JobTypes::load(
        &a.gavel
            .unwrap_or_else(|| data.join("gavel/simulation_throughputs.json")),
    )
    .map_err(|e| e.to_string())?;
    let pred_path = a.predictor.unwrap_or_else(simulator::default_predictor);
    let predictor = SpeedPredictor::load(&pred_path).map_err(|e| e.to_string())?;
    let health = match &a.health {
        // Merged over the defaults, as sysmonitor merges its `machine` block: a file that
        // changes one threshold keeps the others (a partial block was refused here, accepted
        // by the monitor). Errors name file, line and field.
        Some(p) => node_daemon::layered::load_files_over(
            std::slice::from_ref(p),
            &sysmonitor::health::MachineConfig::default(),
            sysmonitor::health::MachineConfig::validate,
        )
        .map_err(|e| e.to_string())?,
        None => Default::default(),
    };
    let mut policies = Vec::new();
    for p in &a.policies {
        if p == "all" {
            policies.extend(Policy::ALL);
        } else {
            policies.push(Policy::from_name(p).ok_or_else(|| {
                let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
                format!("--policy {p}: unknown (one of {}, or all)", names.join(", "))
            })?);
        }
    }
    let modes = match (a.modes.is_empty(), policies.is_empty()) {
        (true, true) => Mode::ALL.to_vec(),
        (true, false) => vec![Mode::OnlineOnly, Mode::Muxflow],
        (false, _) => a.modes.clone(),
    };
    if policies.is_empty() {
        policies.push(Policy::MaxThroughput);
    }
    policies.dedup();
    let mut runs = Vec::new();
    let slack_variants: Vec<bool> = if a.slo_compare { vec![false, true] } else { vec![a.slo_follow_slack] };
    for &mode in &modes {
        let protected = !matches!(mode, Mode::OnlineOnly | Mode::TimeSharing | Mode::PbTimeSharing);
        let ps: Vec<Policy> =
            if matches!(mode, Mode::Muxflow | Mode::MuxflowS) { policies.clone() } else { vec![Policy::MaxThroughput] };
        for p in ps {
            if protected {
                runs.extend(slack_variants.iter().map(|&s| (mode, p, s)));
            } else {
                runs.push((mode, p, false));
            }
        }
    }
    eprintln!(
        "trace: {} nodes, {} online pods, {} offline jobs over {:.1} h (compress {}), left out: {:?}",
        trace.nodes.len(),
        trace.online.len(),
        trace.offline.len(),
        trace.last_arrival() / 3600.0,
        a.compress,
        trace.left_out
    );
    if !(a.budget_scale.is_finite() && a.budget_scale > 0.0) {
        return Err(format!("--budget-scale {}: must be a positive number", a.budget_scale));
    }
    let run_one = |mode: Mode, policy: Policy, slack: bool, scale: f64| {
        let mut cfg = SimConfig::new(mode);
        cfg.budget_scale = scale;
        cfg.max_offline_per_gpu = a.max_offline_per_gpu.max(1);
        cfg.policy = policy;
        cfg.slo_range = a.slo_range;
        cfg.slo_follow_slack = slack;
        cfg.tenants = a.tenants;
        cfg.seed = a.seed;
        cfg.tick_s = a.tick_s;
        cfg.round_s = a.round_s;
        cfg.rematch_every = a.rematch_every;
        cfg.restart_penalty_s = a.restart_penalty_s;
        cfg.slo_slowdown = a.slo_slowdown;
        cfg.health = health.clone();
        let t0 = Instant::now();
        let quiet = a.quiet;
        let label = simulator::metrics::run_label(mode.label(), policy, slack);
        let rep = Sim::new(cfg, &trace, &types, &predictor).run(|t, end| {
            if !quiet {
                eprint!(
                    "\r{label:<24} {:>5.1}% of {:.1} h",
                    100.0 * (t / end.max(1.0)).min(1.0),
                    end / 3600.0
                );
            }
        });
        if !quiet {
            eprintln!(
                "\r{:<24} done in {:.1} s wall ({} rounds, planner {:.0} ms)",
                rep.label(),
                t0.elapsed().as_secs_f64(),
                rep.rounds,
                rep.plan_ms_total
            );
        }
        rep
    };
    let mut reports = Vec::new();
    for (mode, policy, slack) in runs {
        reports.push(run_one(mode, policy, slack, a.budget_scale));
    }
    let mut matched = Vec::new();
    if a.match_violations {
        let pairs: Vec<(usize, usize)> = (0..reports.len())
            .filter(|&i| reports[i].slo_follow_slack)
            .filter_map(|i| {
                let r = &reports[i];
                let base = reports.iter().position(|b| {
                    !b.slo_follow_slack && b.mode == r.mode && b.policy == r.policy
                })?;
                Some((i, base))
            })
            .collect();
        for (si, bi) in pairs {
            let target = reports[si].slo_violation_pct;
            let mode = *modes
                .iter()
                .find(|m| m.label() == reports[bi].mode)
                .expect("a run's mode is one of the modes run");
            let policy = reports[bi].policy;
            let found = simulator::metrics::match_violations(target, a.budget_scale, &reports[bi], |scale| {
                run_one(mode, policy, false, scale)
            });
            matched.push((si, found));
        }
    }
    for (_, m) in &matched {
        reports.extend(m.runs.iter().cloned());
    }
    print!("{}", table(&reports));
    for (si, m) in &matched {
        println!("{}", m.describe(&reports[*si]));
    }
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(&reports).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(dir) = &a.plots {
        let files = simulator::plots::write_all(dir, &reports).map_err(|e| format!("plots: {e}"))?;
        for f in files {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}
