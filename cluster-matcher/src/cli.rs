//! Command-line interface: argument definitions and the glue from each subcommand to the library.

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

use cluster_matcher::plan::{self, alibaba, ClusterSpec, Workloads};
use cluster_matcher::predictor::eval::{self, Split};
use cluster_matcher::predictor::gavel;
use cluster_matcher::predictor::{JobProfile, NeighbourConfig, SpeedPredictor, TrainConfig};

type Error = Box<dyn std::error::Error>;

/// Decides which best-effort (offline) training job shares which latency-critical (online)
/// GPU, MuxFlow-style: a speed predictor scores every allowed pair, maximum-weight matching
/// picks the plan, and a Kubernetes scheduler extender applies it.
///
/// Typical flow:
///
///   cluster-matcher train --out model.json --eval
///   cluster-matcher plan --cluster examples/cluster.json --workloads examples/workloads.json --model model.json
///   cluster-matcher serve --cluster examples/cluster.json --workloads examples/workloads.json --model model.json
///
/// Data files (Gavel throughputs, Alibaba trace) are found under $XSHARE_DATA_DIR, else
/// ../shared/data next to the workspace. Logs go to stderr; set RUST_LOG=debug for more.
#[derive(Debug, Parser)]
#[command(name = "cluster-matcher", version, verbatim_doc_comment)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fit the speed predictor (one model per GPU type: job effects + nearest neighbours, or
    /// MuxFlow's MLP with --kind mlp) on Gavel's measured pairs and save it.
    Train(TrainArgs),
    /// Cross-validated held-out error (MAPE) of the predictor against simple baselines.
    Evaluate(EvalArgs),
    /// Predict one pair's normalized throughput with a saved model.
    Predict(PredictArgs),
    /// Compute one placement round and print the plan (a table, or JSON with --json).
    Plan(PlanArgs),
    /// Run the Kubernetes scheduler extender (filter / prioritize / bind) over HTTP.
    Serve(Box<ServeArgs>),
    /// Replay placement rounds on the Alibaba 2023 GPU trace and report timings.
    Alibaba(AlibabaArgs),
    /// Print the HiveD cells status as JSON, as HiveD's inspect API shows it: the cluster,
    /// the physical cluster, or the virtual clusters (the saved cells state replayed).
    Inspect(InspectArgs),
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Cluster description naming `cells` (and `cells_state`, replayed when it exists).
    #[arg(long, required_unless_present = "cells", conflicts_with = "cells")]
    pub cluster: Option<PathBuf>,
    /// A cells config alone (nothing allocated).
    #[arg(long)]
    pub cells: Option<PathBuf>,
    /// View: empty for the whole cluster status, `physicalcluster`, `virtualclusters`, or
    /// `virtualclusters/NAME`.
    #[arg(default_value = "")]
    pub view: String,
}

#[derive(Debug, Args)]
pub struct DataArgs {
    /// Gavel throughput file [default: $XSHARE_DATA_DIR/gavel/simulation_throughputs.json]
    #[arg(long)]
    pub data: Option<PathBuf>,
}

impl DataArgs {
    fn path(&self) -> PathBuf {
        self.data
            .clone()
            .unwrap_or_else(|| gavel::data_dir().join("gavel/simulation_throughputs.json"))
    }
}

#[derive(Debug, Args)]
pub struct TrainOpts {
    /// Full-batch training epochs.
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    pub epochs: usize,
    /// SGD learning rate.
    #[arg(long, default_value_t = TrainConfig::default().learning_rate)]
    pub lr: f64,
    /// SGD momentum.
    #[arg(long, default_value_t = TrainConfig::default().momentum)]
    pub momentum: f64,
    /// Seed for weight initialisation and data splits.
    #[arg(long, default_value_t = TrainConfig::default().seed)]
    pub seed: u64,
}

impl TrainOpts {
    fn config(&self) -> TrainConfig {
        TrainConfig {
            epochs: self.epochs,
            learning_rate: self.lr,
            momentum: self.momentum,
            seed: self.seed,
            ..TrainConfig::default()
        }
    }
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub opts: TrainOpts,
    /// Which model to fit (the shipped one is `neighbours`).
    #[arg(long, value_enum, default_value = "neighbours")]
    pub kind: KindArg,
    /// Where to write the model file.
    #[arg(long, short)]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum KindArg {
    /// Job effects in log space plus nearest neighbours (deterministic; the shipped model).
    Neighbours,
    /// MuxFlow's 4x64 MLP trained with momentum SGD (seeded; the MLP options apply).
    Mlp,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SplitArg {
    /// Hold out whole job pairs.
    Pair,
    /// Hold out whole jobs (harder: the test jobs were never seen).
    Job,
    /// Hold out whole model families, all batch sizes (hardest); uses one fold per family.
    Family,
    /// Pair, job and family, one after the other.
    All,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub opts: TrainOpts,
    /// How test samples are held out.
    #[arg(long, value_enum, default_value = "all")]
    pub split: SplitArg,
    /// Number of cross-validation folds (pair and job splits; the family split uses one per
    /// family).
    #[arg(long, default_value_t = 5)]
    pub folds: usize,
    /// Leave MuxFlow's MLP out of the table (it is by far the slowest column).
    #[arg(long)]
    pub no_mlp: bool,
    /// Print the reports as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// Model file written by `train`.
    #[arg(long)]
    pub model: PathBuf,
    /// GPU type of the model to use (k80, p100, v100).
    #[arg(long)]
    pub gpu: String,
    /// Offline job: a Gavel job name (e.g. "ResNet-50 (batch size 64)") or a JSON profile file.
    #[arg(long)]
    pub offline: String,
    /// Online job, as for --offline.
    #[arg(long)]
    pub online: String,
    /// SM percentage given to the offline job.
    #[arg(long, default_value_t = 100.0)]
    pub sm: f64,
    #[command(flatten)]
    pub data: DataArgs,
}

#[derive(Debug, Args)]
pub struct PlanInputs {
    /// Cluster description (nodes, GPUs, tenant rules, round period); see examples/cluster.json.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Online workloads with their GPUs, offline jobs waiting or running; see
    /// examples/workloads.json.
    #[arg(long)]
    pub workloads: PathBuf,
    /// Speed-predictor model file (from `train`).
    #[arg(long)]
    pub model: PathBuf,
}

impl PlanInputs {
    fn load(&self) -> Result<(ClusterSpec, Workloads, SpeedPredictor), Error> {
        let cluster = ClusterSpec::load(&self.cluster)?;
        let workloads = Workloads::load(&self.workloads, &cluster)?;
        let model = SpeedPredictor::load(&self.model)?;
        Ok((cluster, workloads, model))
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub inputs: PlanInputs,
    /// Round number to stamp on the plan.
    #[arg(long, default_value_t = 0)]
    pub round: u64,
    /// Print only JSON (default prints the table, then JSON).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub inputs: PlanInputs,
    /// Address to listen on (kube-scheduler's extender `urlPrefix` points here). An address
    /// other than loopback needs --tls-cert, --tls-key and --client-ca (or --insecure-http):
    /// whoever reaches `bind` binds pods.
    #[arg(long, default_value = "127.0.0.1:8888")]
    pub listen: String,
    /// PEM certificate chain to serve TLS with (kube-scheduler's extender `tlsConfig.caFile`
    /// verifies it; `enableHTTPS: true`, an `https://` urlPrefix).
    #[arg(long, requires_all = ["tls_key", "client_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires_all = ["tls_cert", "client_ca"])]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) a client's certificate must chain to: kube-scheduler presents
    /// one (`tlsConfig.certFile`/`keyFile`); a client without one is refused at the handshake.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub client_ca: Option<PathBuf>,
    /// A DNS name (subject alternative name) a client certificate must carry, e.g.
    /// `xshare-scheduler` (repeat for several; any one will do): then a CA that also signs for
    /// others gives them no way in [default: any certificate --client-ca signed].
    #[arg(long, requires = "client_ca")]
    pub client_name: Vec<String>,
    /// Serve plain HTTP on an address other than loopback: anyone who reaches the port may
    /// then ask for filters and binds (a network policy or the host must keep others out).
    #[arg(long, conflicts_with = "tls_cert")]
    pub insecure_http: bool,
    /// Also serve `GET /metrics` and `GET /healthz`, and nothing else, over plain HTTP here
    /// (for Prometheus and the kubelet's probes, e.g. 0.0.0.0:9888).
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Also export the node heartbeats' GPU memory under dcgm-exporter's names and labels
    /// (DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE), for a cluster with no dcgm-exporter. Off
    /// by default: beside dcgm-exporter (the GPU Operator's default) each GPU would have two
    /// series of one name, from two sources, in every query that averages them.
    #[arg(long)]
    pub dcgm_metrics: bool,
    /// Kubeconfig for the API server [default: in-cluster service account, else $KUBECONFIG
    /// or ~/.kube/config].
    #[arg(long, conflicts_with = "kube_api")]
    pub kubeconfig: Option<PathBuf>,
    /// API server URL with no credentials (a `kubectl proxy`, or a test's fake server).
    #[arg(long)]
    pub kube_api: Option<String>,
    /// Deadline in ms for one API call (keep the bind under kube-scheduler's httpTimeout).
    #[arg(long, default_value_t = 2000)]
    pub api_timeout_ms: u64,
    /// Seconds a node's bind lock holds: one offline pod per node at a time from bind to the
    /// node agent's Allocate, which gives the lock back (so Allocate never guesses which
    /// Pending pod a container is for). A lock older than this, or whose pod is gone, is taken
    /// over. 0: no lock (needs no `patch` on nodes, but two pods bound to a node at once may
    /// get each other's plan).
    #[arg(long, default_value_t = kube_contract::bind_lock::DEFAULT_TTL.as_secs())]
    pub bind_lock_ttl_s: u64,
    /// Deadline in ms for a request's headers and for its body (408 after it).
    #[arg(long, default_value_t = 10_000)]
    pub read_timeout_ms: u64,
    /// Largest request body in bytes (413 above it).
    #[arg(long, default_value_t = cluster_matcher::extender::MAX_BODY)]
    pub max_body_bytes: usize,
    /// How far ahead of this host's clock a GPU heartbeat may be dated and still count.
    #[arg(long, default_value_t = 2000)]
    pub max_clock_skew_ms: u64,
    /// Learn online services and offline jobs from watched pods, nodes and GPU health from
    /// watched Nodes' `xshare.io/gpu-heartbeat` (cluster.json then gives round settings,
    /// tenant rules and nodes without a heartbeat; `--workloads` is read but not used).
    #[arg(long)]
    pub watch: bool,
    /// Namespace of the watched pods [default: all namespaces].
    #[arg(long, requires = "watch")]
    pub watch_namespace: Option<String>,
    /// Label selector of the watched pods.
    #[arg(long, default_value = kube_contract::pod::ROLE_SELECTOR, requires = "watch")]
    pub pod_selector: String,
    /// Label selector of the watched GPU nodes [default: every node].
    #[arg(long, requires = "watch")]
    pub node_selector: Option<String>,
    /// Do not watch the kubelet's `Evicted` Events (one watch for the cluster). With it, each
    /// kubelet eviction of a watched offline pod is written onto the pod
    /// (`xshare.io/kubelet-eviction`) so its node agent tells the pod's shim to drain the GPU
    /// before the kill; RBAC `list`/`watch` on events.
    #[arg(long, requires = "watch")]
    pub no_kubelet_evictions: bool,
    /// Extended resource that gives an online service its GPU (repeat for several: MIG
    /// resources, a renamed time-sliced `nvidia.com/gpu.shared`). A pod labelled
    /// `xshare.io/role=online` that asks for none of them is left out of the plan (said once
    /// at WARN): it holds no GPU, whatever its `xshare.io/gpu` says.
    #[arg(long = "online-gpu-resource", default_values_t = [cluster_matcher::watch::DEFAULT_ONLINE_GPU_RESOURCE.to_string()], requires = "watch")]
    pub online_gpu_resources: Vec<String>,
    /// Seconds to wait for the first list of pods and nodes before serving.
    #[arg(long, default_value_t = 60, requires = "watch")]
    pub watch_sync_timeout_s: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Snapshot,
    Timeline,
}

#[derive(Debug, Args)]
pub struct AlibabaArgs {
    /// Trace directory [default: $XSHARE_DATA_DIR/alibaba-gpu-v2023]
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Pod list file name inside the trace directory.
    #[arg(long, default_value = "openb_pod_list_default.csv")]
    pub pods: String,
    /// Speed-predictor model file (from `train`).
    #[arg(long)]
    pub model: PathBuf,
    /// Gavel file whose job profiles are given to the trace's pods.
    #[command(flatten)]
    pub data: DataArgs,
    /// Number of rounds (timeline: spread evenly over the trace's time span).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// snapshot: every GPU pod at once, as the FGD simulator replays the trace;
    /// timeline: pods alive at each round's trace time.
    #[arg(long, value_enum, default_value = "snapshot")]
    pub mode: ModeArg,
    /// Online pod SM activity = gpu_milli / 10 × this (the trace has no utilisation).
    #[arg(long, default_value_t = 1.0)]
    pub online_sm_scale: f64,
    /// Print per-round statistics as JSON.
    #[arg(long)]
    pub json: bool,
}

fn profile_arg(spec: &str, data: &DataArgs) -> Result<JobProfile, Error> {
    if Path::new(spec).is_file() {
        let text = std::fs::read_to_string(spec)?;
        return serde_json::from_str(&text).map_err(|e| format!("{spec}: {e}").into());
    }
    let d = gavel::load(&data.path())?;
    d.profiles.get(spec).cloned().ok_or_else(|| {
        let names: Vec<_> = d.profiles.keys().map(String::as_str).collect();
        format!("`{spec}` is neither a profile file nor a Gavel job; jobs: {}", names.join(", ")).into()
    })
}

/// Writes `text` to stdout. A reader that closed it (`plan | head -1`) is not an error: the
/// rest is not wanted, and the command ends quietly (`println!` panicked, exit 101).
fn out(text: &str) -> Result<(), Error> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("writing to stdout: {e}").into()),
        _ => Ok(()),
    }
}

fn print_reports(split: Split, reports: &[eval::GpuReport]) -> Result<(), Error> {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(o, "held-out MAPE, split {split:?}:");
    let _ = writeln!(
        o,
        "{:<6} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "GPU", "train", "test", "model %", "MLP %", "3-NN %", "mean %", "job-mean %"
    );
    for r in reports {
        let _ = writeln!(
            o,
            "{:<6} {:>7} {:>7} {:>9.1} {:>9} {:>9.1} {:>9.1} {:>12.1}",
            r.gpu,
            r.train_samples,
            r.test_samples,
            r.mape_model,
            r.mape_mlp.map_or("-".to_string(), |m| format!("{m:.1}")),
            r.mape_knn,
            r.mape_mean,
            r.mape_job_mean
        );
    }
    out(&o)
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Train(a) => {
            let data = gavel::load(&a.data.path())?;
            let samples: Vec<_> = data
                .pairs
                .iter()
                .filter_map(|p| eval::sample_row(&data, p).map(|r| (p.gpu.clone(), r, p.normalized)))
                .collect();
            tracing::info!(pairs = samples.len(), infeasible = data.infeasible.len(), "training data");
            let model = match a.kind {
                KindArg::Neighbours => SpeedPredictor::fit(&samples, &NeighbourConfig::default())?,
                KindArg::Mlp => SpeedPredictor::train(&samples, &a.opts.config())?,
            };
            model.save(&a.out)?;
            out(&format!("wrote {} ({} GPU types, {} samples)\n", a.out.display(), model.models.len(), samples.len()))?;
        }
        Command::Evaluate(a) => {
            if a.folds < 2 && !matches!(a.split, SplitArg::Family) {
                return Err(format!("--folds {}: cross-validation needs at least 2 folds", a.folds).into());
            }
            let data = gavel::load(&a.data.path())?;
            let splits = match a.split {
                SplitArg::Pair => vec![Split::ByPair],
                SplitArg::Job => vec![Split::ByJob],
                SplitArg::Family => vec![Split::ByFamily],
                SplitArg::All => vec![Split::ByPair, Split::ByJob, Split::ByFamily],
            };
            let families = data.profiles.keys().map(|j| eval::family(j)).collect::<std::collections::BTreeSet<_>>().len();
            let mut all = Vec::new();
            for s in splits {
                let t = std::time::Instant::now();
                let folds = if s == Split::ByFamily { families } else { a.folds };
                let cfg = eval::EvalConfig {
                    mlp: (!a.no_mlp).then(|| a.opts.config()),
                    seed: a.opts.seed,
                    ..Default::default()
                };
                let r = eval::cross_validate(&data, s, folds, &cfg)?;
                tracing::info!(split = ?s, secs = t.elapsed().as_secs_f64(), "cross-validation done");
                if !a.json {
                    print_reports(s, &r)?;
                }
                all.push((s, r));
            }
            if a.json {
                out(&format!("{}\n", serde_json::to_string_pretty(&all)?))?;
            }
        }
        Command::Predict(a) => {
            let model = SpeedPredictor::load(&a.model)?;
            let off = profile_arg(&a.offline, &a.data)?;
            let on = profile_arg(&a.online, &a.data)?;
            match model.predict(&a.gpu, &off, &on, a.sm)? {
                Some(v) => out(&format!("{v:.4}\n"))?,
                None => return Err(format!("a job has no isolated profile on `{}`", a.gpu).into()),
            }
        }
        Command::Plan(a) => {
            let (cluster, workloads, model) = a.inputs.load()?;
            let mut cells = plan::load_cells(&cluster)?;
            let p = plan::run_round(&cluster, &workloads, &model, cells.as_mut(), a.round);
            let json = serde_json::to_string_pretty(&p)?;
            out(&if a.json { format!("{json}\n") } else { format!("{p}\n{json}\n") })?;
        }
        Command::Serve(a) => {
            let transport = serve_transport(&a)?;
            let (cluster, workloads, model) = a.inputs.load()?;
            let cells = plan::load_cells(&cluster)?;
            use cluster_matcher::{extender, kube_api};
            plan::health::set_max_clock_skew(std::time::Duration::from_millis(a.max_clock_skew_ms));
            let source = match (&a.kube_api, &a.kubeconfig) {
                (Some(url), _) => kube_api::ApiSource::Url(url.clone()),
                (None, Some(path)) => kube_api::ApiSource::Kubeconfig(path.clone()),
                (None, None) => kube_api::ApiSource::Infer,
            };
            let api = kube_api::KubeApi::connect(&source, std::time::Duration::from_millis(a.api_timeout_ms))?
                .with_bind_lock((a.bind_lock_ttl_s > 0).then(|| std::time::Duration::from_secs(a.bind_lock_ttl_s)));
            // Kept alive for the server's lifetime.
            let mut _watch = None;
            let ext = if a.watch {
                use std::sync::{Arc, OnceLock, Weak};
                let settings = cluster_matcher::watch::WatchSettings {
                    namespace: a.watch_namespace.clone(),
                    pod_selector: a.pod_selector.clone(),
                    node_selector: a.node_selector.clone(),
                    stale_after: std::time::Duration::from_secs(cluster.stale_after_s),
                    max_clock_skew: std::time::Duration::from_millis(a.max_clock_skew_ms),
                    kubelet_evictions: !a.no_kubelet_evictions,
                    online_gpu_resources: a.online_gpu_resources.clone(),
                    ..Default::default()
                };
                let slot: Arc<OnceLock<Weak<extender::Extender>>> = Arc::default();
                let s2 = slot.clone();
                let on_change = Arc::new(move || {
                    if let Some(e) = s2.get().and_then(Weak::upgrade) {
                        e.replan();
                    }
                });
                let w = cluster_matcher::watch::ClusterWatch::start(&source, settings, on_change)?;
                if !w.wait_synced(std::time::Duration::from_secs(a.watch_sync_timeout_s)) {
                    return Err(format!(
                        "pods and nodes not listed within {}s (API server unreachable or RBAC missing list/watch?)",
                        a.watch_sync_timeout_s
                    )
                    .into());
                }
                drop(workloads);
                let ext = Arc::new(extender::Extender::watched(cluster, model, cells, w.view()).with_api(api).with_dcgm_metrics(a.dcgm_metrics));
                let _ = slot.set(Arc::downgrade(&ext));
                _watch = Some(w);
                ext
            } else {
                std::sync::Arc::new(extender::Extender::new(cluster, workloads, model, cells).with_api(api).with_dcgm_metrics(a.dcgm_metrics))
            };
            let _planner = ext.spawn_planner();
            let limits = extender::ServerLimits {
                max_body: a.max_body_bytes,
                read_timeout: std::time::Duration::from_millis(a.read_timeout_ms),
            };
            let _metrics = match &a.metrics_listen {
                Some(m) => {
                    let s = extender::HttpServer::start_with(m, ext.clone(), limits, extender::Transport::Plain, extender::Scope::Metrics)?;
                    eprintln!("cluster-matcher: metrics on http://{}/metrics", s.local_addr());
                    Some(s)
                }
                None => None,
            };
            let scheme = if matches!(transport, extender::Transport::Tls(_)) { "https" } else { "http" };
            let http = extender::HttpServer::start_with(&a.listen, ext, limits, transport, extender::Scope::All)?;
            eprintln!("cluster-matcher: extender listening on {scheme}://{}", http.local_addr());
            http.wait();
        }
        Command::Inspect(a) => {
            let cells = match (&a.cluster, &a.cells) {
                (Some(c), _) => {
                    let cluster = ClusterSpec::load(c)?;
                    let st = plan::load_cells(&cluster)?
                        .ok_or_else(|| format!("{}: names no `cells` config", c.display()))?;
                    st.cells
                }
                (None, Some(p)) => cluster_matcher::cells::Cluster::load(p)?,
                (None, None) => return Err("give --cluster or --cells".into()),
            };
            let status = cells.report();
            let path = format!("inspect/clusterstatus/{}", a.view.trim_matches('/'));
            let (code, body) = plan::with_cells::inspect(Some(&status), &path);
            if code != 200 {
                return Err(body.into());
            }
            let v: serde_json::Value = serde_json::from_str(&body)?;
            out(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
        }
        Command::Alibaba(a) => {
            let dir = a.trace.clone().unwrap_or_else(|| gavel::data_dir().join("alibaba-gpu-v2023"));
            let model = SpeedPredictor::load(&a.model)?;
            let data = gavel::load(&a.data.path())?;
            let trace = alibaba::Trace::load(&dir, &a.pods)?;
            let mode = match a.mode {
                ModeArg::Snapshot => alibaba::ReplayMode::Snapshot,
                ModeArg::Timeline => alibaba::ReplayMode::Timeline,
            };
            if !(a.online_sm_scale.is_finite() && a.online_sm_scale >= 0.0) {
                return Err("--online-sm-scale must be a non-negative number".into());
            }
            let asm = alibaba::Assumptions { online_sm_scale: a.online_sm_scale, ..Default::default() };
            let report = alibaba::replay(&trace, &data, &model, a.rounds, mode, asm);
            if a.json {
                out(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
            } else {
                out(&format!("{report}"))?;
            }
        }
    }
    Ok(())
}

/// The extender's transport from `serve`'s flags: TLS with client certificates when given;
/// plain HTTP only on a loopback address or with `--insecure-http` (said at WARN), since
/// whoever reaches the scheduler verbs places and binds pods.
fn serve_transport(a: &ServeArgs) -> Result<cluster_matcher::extender::Transport, String> {
    use cluster_matcher::extender::{tls, Transport};
    if let (Some(cert), Some(key), Some(client_ca)) = (&a.tls_cert, &a.tls_key, &a.client_ca) {
        let client_names = &a.client_name;
        return tls::server_config(&tls::TlsFiles { cert, key, client_ca, client_names }).map(Transport::Tls);
    }
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(a.listen.as_str())
        .map_err(|e| format!("--listen {}: {e}", a.listen))?
        .collect();
    if !addrs.is_empty() && addrs.iter().all(|s| s.ip().is_loopback()) {
        return Ok(Transport::Plain);
    }
    if a.insecure_http {
        tracing::warn!(listen = %a.listen, "serving filter, prioritize and bind over plain HTTP to anyone who reaches the port (--insecure-http)");
        return Ok(Transport::Plain);
    }
    Err(format!(
        "--listen {}: not a loopback address, and no TLS: whoever reaches it could bind pods. Give --tls-cert, --tls-key and --client-ca \
         (kube-scheduler's extender tlsConfig then presents a client certificate; deploy/README.md, \"TLS\"), or --insecure-http",
        a.listen
    ))
}
