//! The agent's configuration: one JSON file (`--config`), every field defaulted, unknown fields
//! refused, errors located by file, line and field (node-ledger's `ConfigError`).

use std::path::{Path, PathBuf};

use node_daemon::layered::read_bounded;
use node_ledger::config::{parse_json, ConfigError};
use serde::Deserialize;

/// Env var the DaemonSet sets from the downward API (`spec.nodeName`).
pub const ENV_NODE_NAME: &str = "NODE_NAME";

/// The largest `offline_pods.deleted_pod_linger_ms` (10 min past the pod's grace).
pub const MAX_DELETED_POD_LINGER_MS: u64 = 600_000;
/// The longest accepted poll period (`health.poll_ms`, `eviction.poll_ms`) and retry wait
/// (`eviction.retry_ms`): 1 minute.
pub const MAX_POLL_MS: u64 = 60_000;
/// The largest `health.stale_after_ms`: 10 minutes. Past it a monitor (or an mps-manager) that
/// stopped writing is no longer trusted: its last Healthy would otherwise admit offline work
/// on a GPU nobody watches for as long as the value says.
pub const MAX_STALE_AFTER_MS: u64 = 600_000;
/// The smallest `health.stale_after_ms`: 1 s. A monitor writes its block at every sample (100 ms
/// at its idle pace); below a second a scheduling pause of the monitor, or of this agent between
/// its reads, reads as a dead monitor, and the slots flap Unhealthy (at 1 ms they never left it).
pub const MIN_STALE_AFTER_MS: u64 = 1_000;
/// The longest accepted period or wait of the other durations (`offline_pods.poll_ms`,
/// `offline_pods.kubelet_eviction_grace_ms`, `heartbeat.interval_ms`, `kube.timeout_ms`): 1 hour.
pub const MAX_PERIOD_MS: u64 = 3_600_000;

/// Everything `node-agent run` reads from its JSON config file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// This node's name (else `$NODE_NAME`).
    pub node_name: String,
    /// Host directory of the per-GPU ledgers (`<dir>/gpu<N>/ledger`), as sysmonitor uses it.
    pub ledger_dir: PathBuf,
    /// The GPUs this agent serves. Each must have a monitor (its ledger) to be Healthy.
    pub gpus: Vec<GpuConfig>,
    /// The kubelet device plugin (sockets, resource name, slots per GPU).
    pub device_plugin: DevicePluginConfig,
    /// What Allocate injects into an offline container.
    pub inject: InjectConfig,
    /// CDI mode (off by default).
    pub cdi: CdiConfig,
    /// How GPU health is read from the ledgers.
    pub health: HealthConfig,
    /// The API server connection.
    pub kube: KubeConfig,
    /// The Eviction API worker.
    pub eviction: EvictionConfig,
    /// The list of this node's offline pods written for the monitors.
    pub offline_pods: OfflinePodsConfig,
    /// The Node heartbeat annotation.
    pub heartbeat: HeartbeatConfig,
    /// The GPU of each online pod on this node, from the kubelet, written on the pod.
    pub online_gpus: OnlineGpusConfig,
    /// `host:port` serving Prometheus text on `/metrics`; empty: off.
    pub metrics_listen: String,
    /// mps-manager's state file of each GPU, read at Allocate for the `/dev/shm` its MPS daemon
    /// has (`shm_dir`); `{gpu}` is replaced by the index. Empty: mps-manager's default
    /// `<ledger_dir>/daemons/gpu<N>/mps-manager.json`. Set it alike when mps-manager's `state_file` is set.
    pub mps_manager_state_file: String,
    /// Let `node-agent run` start on the config's `gpus[].uuid` when NVML cannot be loaded
    /// (they are then not checked against the GPUs at their indices, and a wrong one gives
    /// containers another GPU). Off: NVML unavailable with UUIDs configured stops `run` (exit
    /// 2) with an error naming the fix (the DaemonSet's `runtimeClassName: nvidia`).
    pub allow_unverified_uuids: bool,
}

/// One GPU on this host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// Host GPU index (the ledger's `gpu<N>` and the plan's `xshare.io/gpu`).
    pub index: u32,
    /// `GPU-...` UUID: what NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES get. Taken from NVML
    /// at start-up (`crate::gpus`); one given here must match NVML's, and stands in where NVML
    /// cannot be loaded only for `cdi-spec`, or for `run` with `allow_unverified_uuids`.
    #[serde(default)]
    pub uuid: String,
    /// Product name for the heartbeat (`nvidia-smi --query-gpu=name`), optional.
    #[serde(default)]
    pub model: String,
}

/// The kubelet device plugin: where it listens and what it advertises.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicePluginConfig {
    /// The kubelet's device-plugin directory (holds `kubelet.sock`).
    pub dir: PathBuf,
    /// The kubelet's registration socket, inside `dir`.
    pub kubelet_socket: String,
    /// This plugin's socket, inside `dir`.
    pub socket_name: String,
    /// Extended resource advertised.
    pub resource_name: String,
    /// Offline slots per GPU (MuxFlow: a few offline jobs share a GPU with one online job).
    pub max_offline_per_gpu: u32,
}

/// What an allocated container gets (host paths and the paths seen inside the container).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InjectConfig {
    /// The shim (`libxcuda.so`) on the host.
    pub shim_host_path: PathBuf,
    /// Where the container sees it (LD_PRELOAD).
    pub shim_container_path: PathBuf,
    /// Where the container sees the ledger directory (`XSHARE_LEDGER_DIR`): its pod's ledger
    /// of the GPU as `gpu<N>/ledger` (`pod_ledgers`), the pipe directory, the status files;
    /// nothing of the other GPUs or pods.
    pub ledger_container_dir: PathBuf,
    /// Host MPS pipe directory; `{gpu}` is replaced by the index. Empty: mps-manager's default
    /// `<ledger_dir>/gpu<N>/mps-pipe` (inside the mounted ledger directory). Every offline
    /// container of the GPU gets it mounted, so `/`, `ledger_dir` or a directory above it, and
    /// a directory inside `ledger_dir` other than one of its own below `gpu<N>/`, are refused.
    pub mps_pipe_dir: String,
    /// Host directory mounted at the container's `/dev/shm`: the one mps-manager gives the MPS
    /// control daemon (and so its servers) as theirs (its `shm_dir`), where a server keeps the
    /// shared memory its clients attach to; a client with a `/dev/shm` of its own cannot
    /// connect (`CUDA_ERROR_MPS_CONNECTION_FAILED`). `{gpu}` is replaced by the index. Empty:
    /// mps-manager's default `/dev/shm/xshare-gpu<N>`; `host`: the host's `/dev/shm` itself
    /// (for a manager with `shm_dir` = `host`; the container then shares all of it). Mounted
    /// read-write into every offline container of the GPU, so `/`, `..`, `ledger_dir` (or above
    /// or inside it), the kubelet's, CDI's and the shim's directories and system directories
    /// (outside `/dev/shm`) are refused. Not mounted with `mps_shm: "private"`.
    pub mps_shm_dir: String,
    /// What an offline container gets as its `/dev/shm`. `shared` (the default): `mps_shm_dir`,
    /// the MPS server's, read-write, as NVIDIA's device plugin shares the MPS daemon's: what
    /// drivers whose MPS serves only clients with the server's `/dev/shm` need. Every offline
    /// tenant of the GPU then shares it with the online service and its neighbours: it can
    /// fill it (a directory on the host's `/dev/shm` tmpfs by default, half the host's RAM,
    /// shared by every GPU's MPS server, the online pods and the host), read or unlink the
    /// other MPS clients' files there (one uid per MPS GPU), and its files outlive the pod.
    /// `private`: no `/dev/shm` mount from this agent; the container keeps the runtime's own
    /// (a tmpfs of its pod, 64 MiB under containerd's and CRI-O's defaults, its pages charged
    /// to the pod's memory): for drivers whose MPS serves
    /// such a client (the GPU check kit's `shm` row says `own /dev/shm: MPS client`, as on an
    /// H200 with driver 580; `CUresult 805` there: keep `shared`). Allocate then no longer
    /// checks `mps_shm_dir` against mps-manager's `shm_dir`.
    pub mps_shm: MpsShm,
    /// Mount the MPS pipe directory read-only (a mount of its own, over the read-write ledger
    /// directory when it is inside it). Read-write, a tenant that is root in its container can
    /// unlink the control daemon's `control` socket and bind one of its own there: every MPS
    /// client started later on the GPU (a relaunched online service among them) and
    /// mps-manager's own commands then reach the tenant's process instead of MPS. Connecting to
    /// a socket or opening a FIFO needs no write access to the mount, and real MPS clients need
    /// nothing more: on an H200 (driver 580, 2026-11-29) the GPU check kit's `pipe-ro` check
    /// had a client as uid 65534 get its context from the MPS server through a read-only bind
    /// mount of the pipe directory. On by default; off mounts it read-write, as NVIDIA's own
    /// device plugin does (for a driver whose clients are seen to need it: run the kit's
    /// `pipe-ro` check there).
    pub mps_pipe_read_only: bool,
    /// Give each offline pod a ledger of its own (`node_ledger::pods`: created at Allocate,
    /// its file alone mounted at `<ledger_container_dir>/gpu<N>/ledger`, removed once the pod
    /// is gone), instead of mounting the GPU's ledger directory, which every offline pod of the
    /// GPU then shares read-write: any of them could raise a neighbour's usage (its
    /// allocations refused) or write a neighbour's group into its slot. On by default; off
    /// only for daemons older than pod ledgers (they would not see the pods' processes).
    pub pod_ledgers: bool,
}

/// What an offline container gets as its `/dev/shm` ([`InjectConfig::mps_shm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MpsShm {
    /// The MPS server's (`inject.mps_shm_dir`), read-write, shared with every MPS client of
    /// the GPU.
    #[default]
    Shared,
    /// The container runtime's own, private to the pod: no mount from this agent.
    Private,
}

/// CDI (Container Device Interface) mode: the static edits go into a CDI spec file and
/// Allocate returns CDI device names; needs a runtime with CDI on (containerd >= 1.7 with
/// `enable_cdi`, CRI-O) and the kubelet's DevicePluginCDIDevices (GA in 1.31).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CdiConfig {
    /// Whether Allocate answers with CDI device names (and writes the spec file).
    pub enabled: bool,
    /// Where the runtime reads CDI specs.
    pub spec_dir: PathBuf,
    /// Also request this CDI kind's device for the GPU (e.g. `nvidia.com/gpu` from NVIDIA's
    /// `nvidia-ctk cdi generate`), named by UUID.
    pub gpu_device_kind: Option<String>,
}

/// How the GPUs' health is read from the monitor blocks of their status files.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// How often the ledgers are read, ms.
    pub poll_ms: u64,
    /// A monitor block older than this reads as not Healthy, ms.
    pub stale_after_ms: u64,
}

/// The Kubernetes API server connection.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeConfig {
    /// API server URL without credentials (tests, `kubectl proxy`); empty: in-cluster config
    /// or kubeconfig.
    pub api_url: String,
    /// Bound on each API call, ms.
    pub timeout_ms: u64,
}

/// The Eviction API worker (reports sysmonitor's evictions to the cluster).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvictionConfig {
    /// Whether evictions are posted through the API (the monitor's local signal acts anyway).
    pub enabled: bool,
    /// How often the ledgers' slots and sysmonitor's eviction logs are scanned for eviction
    /// requests, ms (a request whose process already exited is still in the log).
    pub poll_ms: u64,
    /// First wait before retrying a refused (429) or failed eviction, ms; doubles up to 60 s.
    pub retry_ms: u64,
}

/// The list of this node's offline pods (`<ledger_dir>/offline-pods.json`), by which the
/// monitors find offline work that runs without the shim in a pod none of whose processes
/// registered.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OfflinePodsConfig {
    /// Whether the list is written (off: such pods are found only beside a registered process).
    pub enabled: bool,
    /// How often the written file is checked, ms (at least 1000), and written again if it was
    /// removed. The pods themselves come from a watch of this node's pods, as they change.
    pub poll_ms: u64,
    /// The grace, ms, this node's kubelet gives a pod it evicts for node pressure: the shim of
    /// an offline pod the kubelet evicts (written onto the pod by the extender from the
    /// kubelet's `Evicted` Event, `xshare.io/kubelet-eviction`) drains its GPU work by it, or
    /// by the pod's spec grace when shorter. 0 (the default) drains at once, right for any
    /// kubelet with a hard eviction threshold (its defaults have them: such an eviction kills
    /// after the kubelet's 2 s minimum; the Event does not tell a hard threshold's from a soft
    /// one's). Only a kubelet with no hard threshold (`evictionHard` emptied) may say its
    /// `evictionMaxPodGracePeriod`, in ms; else the drain comes after the kill. The cost of 0:
    /// a job's checkpoint that still launches kernels after a soft eviction's SIGTERM is
    /// frozen. An eviction over a storage limit always drains at once.
    pub kubelet_eviction_grace_ms: u64,
    /// How long, ms, past its grace a pod deleted from the API while its containers may still
    /// run stays in the list (with its plan: the monitors go on judging its processes):
    /// `kubectl delete --grace-period=0 --force` removes a pod from the API at once, and the
    /// kubelet kills its containers later, on kubelets hit by kubernetes/kubernetes#115819
    /// after its full spec grace. Such a pod stays until its cgroup says no process is left
    /// (`cgroup_root`), at the latest its grace (its spec's or a longer deletion's, at most
    /// 1 h) and this after its deletion was seen. A pod whose last status says every container
    /// stopped (the kubelet's confirmed graceful deletion) leaves at once. 30000 by default, at
    /// most 600000.
    pub deleted_pod_linger_ms: u64,
    /// The host's cgroup v2 mount, where the pod cgroups of the kubelet (either driver) show
    /// that a pod deleted from the API has no process left, so it leaves the list before its
    /// linger ends (`deleted_pod_linger_ms`). `/sys/fs/cgroup` by default: the host's for a
    /// systemd unit; in a container with a cgroup namespace of its own (the shipped DaemonSet)
    /// it shows no kubelet pods and only the linger applies, unless the host's is mounted
    /// (read-only) and named here. Empty: not looked at. An absolute path.
    pub cgroup_root: String,
}

/// The GPU of each online pod (label `xshare.io/role=online`) on this node, as the kubelet
/// assigned it: read from the kubelet's PodResources API and written on the pod as the
/// `xshare.io/gpu` annotation (the GPU's index), by which the extender's plan pairs offline work
/// with the online service (`node_agent::online_gpus`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OnlineGpusConfig {
    /// Whether the annotation is written (off: the operator writes it).
    pub enabled: bool,
    /// The kubelet's PodResources socket (an absolute path; the DaemonSet mounts its directory).
    pub pod_resources_socket: PathBuf,
    /// The extended resources whose devices are GPUs (device IDs: a GPU's UUID, `UUID::N`
    /// for a time-sliced replica, or its index with the NVIDIA device plugin's
    /// `deviceIDStrategy: index`). At least one.
    pub resources: Vec<String>,
    /// How often the kubelet is asked and the pods compared, ms (1000..=60000).
    pub poll_ms: u64,
}

/// The GPU heartbeat published on this node's Node object.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeartbeatConfig {
    /// Whether the heartbeat annotation is published.
    pub enabled: bool,
    /// Publication period without a state change, ms (at least kube-contract's
    /// `MIN_PUBLISH_INTERVAL_MS`: every write reaches every Node watcher); a GPU state change
    /// is published at the next health poll.
    pub interval_ms: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            ledger_dir: PathBuf::from(node_ledger::config::DEFAULT_LEDGER_DIR),
            gpus: Vec::new(),
            device_plugin: DevicePluginConfig::default(),
            inject: InjectConfig::default(),
            cdi: CdiConfig::default(),
            health: HealthConfig::default(),
            kube: KubeConfig::default(),
            eviction: EvictionConfig::default(),
            offline_pods: OfflinePodsConfig::default(),
            heartbeat: HeartbeatConfig::default(),
            online_gpus: OnlineGpusConfig::default(),
            metrics_listen: String::new(),
            mps_manager_state_file: String::new(),
            allow_unverified_uuids: false,
        }
    }
}

impl Default for DevicePluginConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            kubelet_socket: "kubelet.sock".into(),
            socket_name: "xshare-offline-gpu.sock".into(),
            resource_name: kube_contract::OFFLINE_GPU_RESOURCE.into(),
            max_offline_per_gpu: 4,
        }
    }
}

impl Default for InjectConfig {
    fn default() -> Self {
        Self {
            shim_host_path: PathBuf::from("/usr/local/lib/xshare/libxcuda.so"),
            shim_container_path: PathBuf::from("/usr/local/lib/xshare/libxcuda.so"),
            ledger_container_dir: PathBuf::from(node_ledger::config::DEFAULT_LEDGER_DIR),
            mps_pipe_dir: String::new(),
            mps_shm_dir: String::new(),
            mps_shm: MpsShm::Shared,
            mps_pipe_read_only: true,
            pod_ledgers: true,
        }
    }
}

impl Default for CdiConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            spec_dir: PathBuf::from("/var/run/cdi"),
            gpu_device_kind: None,
        }
    }
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            poll_ms: 1000,
            stale_after_ms: 5000,
        }
    }
}

impl Default for KubeConfig {
    fn default() -> Self {
        Self {
            api_url: String::new(),
            timeout_ms: 5000,
        }
    }
}

impl Default for EvictionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            poll_ms: 100,
            retry_ms: 2000,
        }
    }
}

impl Default for OfflinePodsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            poll_ms: 5000,
            kubelet_eviction_grace_ms: 0,
            deleted_pod_linger_ms: 30_000,
            cgroup_root: "/sys/fs/cgroup".into(),
        }
    }
}

impl Default for OnlineGpusConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            resources: vec!["nvidia.com/gpu".into()],
            poll_ms: 5000,
        }
    }
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_ms: kube_contract::heartbeat::MIN_PUBLISH_INTERVAL_MS,
        }
    }
}

impl AgentConfig {
    /// Reads, parses and validates `path`; `$NODE_NAME` fills an empty `node_name`.
    pub fn load(
        path: &Path,
        get_env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let text = read_bounded(path)?;
        Self::from_text(path, &text, get_env)
    }

    /// Parses and validates `text` attributed to `path`.
    pub fn from_text(
        path: &Path,
        text: &str,
        get_env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        node_daemon::layered::refuse_duplicate_keys(path, text)?;
        let mut c: Self = parse_json(path, text)?;
        c.finish(path, text, get_env)?;
        Ok(c)
    }

    fn finish(
        &mut self,
        path: &Path,
        text: &str,
        get_env: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if self.node_name.is_empty() {
            self.node_name = get_env(ENV_NODE_NAME).unwrap_or_default();
        }
        let bad = |field: &str, msg: String| Err(ConfigError::invalid(path, text, field, msg));
        if self.node_name.is_empty() {
            return bad(
                "node_name",
                format!("empty, and ${ENV_NODE_NAME} is not set"),
            );
        }
        if self.gpus.is_empty() {
            return bad(
                "gpus",
                "no GPU listed: the agent would advertise nothing".into(),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &self.gpus {
            if !seen.insert(g.index) {
                return bad("gpus.index", format!("GPU {} listed twice", g.index));
            }
            if !g.uuid.is_empty() && !g.uuid.starts_with("GPU-") && !g.uuid.starts_with("MIG-") {
                return bad(
                    "gpus.uuid",
                    format!("`{}` is not a GPU UUID (GPU-...)", g.uuid),
                );
            }
        }
        let dp = &self.device_plugin;
        if dp.max_offline_per_gpu == 0 || dp.max_offline_per_gpu > 64 {
            return bad(
                "device_plugin.max_offline_per_gpu",
                "must be in 1..=64 (ledger quota groups per GPU)".into(),
            );
        }
        if !dp.resource_name.contains('/') {
            return bad(
                "device_plugin.resource_name",
                "must be `domain/name`".into(),
            );
        }
        for (field, name) in [
            ("device_plugin.socket_name", &dp.socket_name),
            ("device_plugin.kubelet_socket", &dp.kubelet_socket),
        ] {
            if name.is_empty() || name.contains('/') {
                return bad(field, "must be a file name inside device_plugin.dir".into());
            }
        }
        for (field, p) in [
            ("inject.shim_host_path", &self.inject.shim_host_path),
            (
                "inject.shim_container_path",
                &self.inject.shim_container_path,
            ),
            (
                "inject.ledger_container_dir",
                &self.inject.ledger_container_dir,
            ),
            ("ledger_dir", &self.ledger_dir),
            ("device_plugin.dir", &self.device_plugin.dir),
            ("cdi.spec_dir", &self.cdi.spec_dir),
        ] {
            // The CDI directory is used only with CDI on.
            if field == "cdi.spec_dir" && !self.cdi.enabled {
                continue;
            }
            if !p.is_absolute() {
                return bad(field, format!("`{}` must be an absolute path", p.display()));
            }
        }
        // Containers get `<ledger_container_dir>/gpu<N>/ledger` mounted: the directory must be
        // one of the product's own inside the container, not its root.
        if self.inject.ledger_container_dir.parent().is_none() {
            return bad(
                "inject.ledger_container_dir",
                "must be a directory of its own inside the container (default /run/xshare), not /".into(),
            );
        }
        if !self.inject.mps_pipe_dir.is_empty() && !self.inject.mps_pipe_dir.starts_with('/') {
            return bad("inject.mps_pipe_dir", "must be an absolute path".into());
        }
        if !self.inject.mps_pipe_dir.is_empty() {
            for g in &self.gpus {
                if let Some(why) = self.pipe_dir_exposes_ledgers(g.index) {
                    return bad("inject.mps_pipe_dir", why);
                }
            }
        }
        if !(self.mps_manager_state_file.is_empty() || self.mps_manager_state_file.starts_with('/')) {
            return bad(
                "mps_manager_state_file",
                "must be an absolute path or empty (mps-manager's default <ledger_dir>/daemons/gpu<N>/mps-manager.json)".into(),
            );
        }
        let shm = &self.inject.mps_shm_dir;
        if !(shm.is_empty() || shm == "host" || shm.starts_with('/')) {
            return bad(
                "inject.mps_shm_dir",
                "must be an absolute path, \"host\" or empty (mps-manager's default /dev/shm/xshare-gpu<N>)".into(),
            );
        }
        for g in &self.gpus {
            if let Some(why) = self.shm_dir_exposes_host(g.index) {
                return bad("inject.mps_shm_dir", why);
            }
        }
        // Durations: bounded, so that none silently means "never" (a dead monitor's last
        // Healthy trusted for decades) and none overflows a clock.
        for (field, v, min, max) in [
            ("health.poll_ms", self.health.poll_ms, 1, MAX_POLL_MS),
            ("health.stale_after_ms", self.health.stale_after_ms, MIN_STALE_AFTER_MS, MAX_STALE_AFTER_MS),
            ("eviction.poll_ms", self.eviction.poll_ms, 1, MAX_POLL_MS),
            ("eviction.retry_ms", self.eviction.retry_ms, 1, MAX_POLL_MS),
            ("offline_pods.poll_ms", self.offline_pods.poll_ms, 1000, MAX_PERIOD_MS),
            ("offline_pods.kubelet_eviction_grace_ms", self.offline_pods.kubelet_eviction_grace_ms, 0, MAX_PERIOD_MS),
            ("heartbeat.interval_ms", self.heartbeat.interval_ms, kube_contract::heartbeat::MIN_PUBLISH_INTERVAL_MS, MAX_PERIOD_MS),
            ("kube.timeout_ms", self.kube.timeout_ms, 1, MAX_PERIOD_MS),
            ("online_gpus.poll_ms", self.online_gpus.poll_ms, 1000, MAX_POLL_MS),
        ] {
            if !(min..=max).contains(&v) {
                let why = match field {
                    "offline_pods.poll_ms" if v < min => " (how often the offline pod file is checked; the pods come from a watch)",
                    "heartbeat.interval_ms" if v < min => " (every write reaches every Node watcher)",
                    "health.stale_after_ms" if v < min => " (below a second a pause of the monitor reads as its death: the slots flap Unhealthy)",
                    _ => "",
                };
                return bad(field, format!("must be within {min}..={max} ms, got {v}{why}"));
            }
        }
        if self.offline_pods.deleted_pod_linger_ms > MAX_DELETED_POD_LINGER_MS {
            return bad(
                "offline_pods.deleted_pod_linger_ms",
                format!("must be at most {MAX_DELETED_POD_LINGER_MS} (past the pod's grace, which is counted apart)"),
            );
        }
        let root = &self.offline_pods.cgroup_root;
        if !(root.is_empty() || Path::new(root).is_absolute()) {
            return bad("offline_pods.cgroup_root", "must be an absolute path (the host's cgroup v2 mount) or empty (not looked at)".into());
        }
        let o = &self.online_gpus;
        if !o.pod_resources_socket.is_absolute() {
            return bad("online_gpus.pod_resources_socket", "must be an absolute path (the kubelet's PodResources socket)".into());
        }
        if o.resources.is_empty() || o.resources.iter().any(|r| r.trim().is_empty()) {
            return bad("online_gpus.resources", "must name at least one extended resource (e.g. nvidia.com/gpu), none empty".into());
        }
        if !self.metrics_listen.is_empty()
            && self.metrics_listen.parse::<std::net::SocketAddr>().is_err()
        {
            return bad(
                "metrics_listen",
                format!(
                    "`{}` is not host:port (e.g. 0.0.0.0:9402)",
                    self.metrics_listen
                ),
            );
        }
        Ok(())
    }

    /// The GPU with host index `index`, if this agent serves it.
    pub fn gpu(&self, index: u32) -> Option<&GpuConfig> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// Host directory mounted at the `/dev/shm` of GPU `index`'s containers
    /// ([`InjectConfig::mps_shm_dir`]).
    pub fn mps_shm_host_dir(&self, index: u32) -> PathBuf {
        match self.inject.mps_shm_dir.as_str() {
            "" => PathBuf::from(format!("/dev/shm/xshare-gpu{index}")),
            "host" => PathBuf::from("/dev/shm"),
            t => PathBuf::from(t.replace("{gpu}", &index.to_string())),
        }
    }

    /// mps-manager's state file of GPU `index` ([`AgentConfig::mps_manager_state_file`]).
    pub fn mps_manager_state_path(&self, index: u32) -> PathBuf {
        if self.mps_manager_state_file.is_empty() {
            node_ledger::config::daemon_dir(&self.ledger_dir, index).join("mps-manager.json")
        } else {
            PathBuf::from(self.mps_manager_state_file.replace("{gpu}", &index.to_string()))
        }
    }

    /// Why GPU `index`'s MPS pipe directory ([`AgentConfig::mps_pipe_host_dir`]), which every
    /// offline container of the GPU gets mounted (read-write unless
    /// `inject.mps_pipe_read_only`), would show them more than MPS's pipes: `/`, `ledger_dir`
    /// or a directory above it (every GPU's ledger, status files, the daemons' files), or a
    /// directory inside `ledger_dir` other than one below this GPU's own `gpu<N>/` that holds
    /// no ledger (`gpu<N>` itself holds the GPU's shared ledger; `status`, `daemons`, `pods`
    /// and other GPUs' directories are not the container's to write). `..` is refused: the
    /// paths are compared as written. `None` when it is fine (the default,
    /// `<ledger_dir>/gpu<N>/mps-pipe`, is).
    fn pipe_dir_exposes_ledgers(&self, index: u32) -> Option<String> {
        use std::path::Component;
        let pipe = self.mps_pipe_host_dir(index);
        let shown = pipe.display();
        if pipe.components().any(|c| c == Component::ParentDir) {
            return Some(format!("`{shown}` (GPU {index}) must not contain `..`"));
        }
        if pipe.parent().is_none() {
            return Some(format!("`{shown}` (GPU {index}) is `/`: every offline container would get the whole host read-write"));
        }
        if self.ledger_dir.starts_with(&pipe) {
            return Some(format!(
                "`{shown}` (GPU {index}) is ledger_dir {} or contains it: every offline container would get every \
                 GPU's ledger, status files and the daemons' files mounted",
                self.ledger_dir.display()
            ));
        }
        let gpu_dir = self.ledger_dir.join(format!("gpu{index}"));
        let ledger = node_ledger::config::ledger_path(&self.ledger_dir, index);
        let own = pipe.starts_with(&gpu_dir) && pipe != gpu_dir && !pipe.starts_with(&ledger);
        if pipe.starts_with(&self.ledger_dir) && !own {
            return Some(format!(
                "`{shown}` (GPU {index}) is inside ledger_dir {} but not a directory of its own below {} \
                 (status files, the daemons' files, pod ledgers, other GPUs' ledgers and this GPU's shared \
                 ledger are not offline containers' to mount): leave it empty (<ledger_dir>/gpu<N>/mps-pipe) \
                 or name a directory outside ledger_dir",
                self.ledger_dir.display(),
                gpu_dir.display()
            ));
        }
        None
    }

    /// Why GPU `index`'s MPS shm directory ([`AgentConfig::mps_shm_host_dir`]), which every
    /// offline container of the GPU gets mounted read-write at `/dev/shm`, would give them
    /// more than MPS's shared memory: `/`; a path with `..` (compared as written); `ledger_dir`,
    /// a directory above it or inside it (ledgers, status files, the daemons' and this agent's
    /// files); the kubelet's directory (`/var/lib/kubelet`, `device_plugin.dir`), the CDI spec
    /// directory or the shim's directory, or one above or inside them; a system directory or
    /// one above or inside it (`/etc`, `/usr`, `/var/lib`, `/run/containerd`, ...), where
    /// `/dev` admits only `/dev/shm` and below (the default `/dev/shm/xshare-gpu<N>`, `host`).
    /// `None` when it is fine.
    fn shm_dir_exposes_host(&self, index: u32) -> Option<String> {
        use std::path::Component;
        let shm = self.mps_shm_host_dir(index);
        let shown = shm.display();
        if shm.components().any(|c| c == Component::ParentDir) {
            return Some(format!("`{shown}` (GPU {index}) must not contain `..`"));
        }
        if shm.parent().is_none() {
            return Some(format!("`{shown}` (GPU {index}) is `/`: every offline container would get the whole host read-write"));
        }
        let near = |p: &Path| shm.starts_with(p) || p.starts_with(&shm);
        if near(&self.ledger_dir) {
            return Some(format!(
                "`{shown}` (GPU {index}) is ledger_dir {}, above or inside it: every offline container would get \
                 ledgers, status files or the daemons' files read-write; leave it empty (/dev/shm/xshare-gpu<N>) \
                 or name mps-manager's shm_dir outside ledger_dir",
                self.ledger_dir.display()
            ));
        }
        let shim_dir = self.inject.shim_host_path.parent().unwrap_or(Path::new("/"));
        for (what, p) in [
            ("the kubelet's directory", Path::new("/var/lib/kubelet")),
            ("device_plugin.dir", self.device_plugin.dir.as_path()),
            ("cdi.spec_dir", self.cdi.spec_dir.as_path()),
            ("the shim's directory (inject.shim_host_path)", shim_dir),
        ] {
            if near(p) {
                return Some(format!(
                    "`{shown}` (GPU {index}) is {what} {}, above or inside it: every offline container would get it read-write",
                    p.display()
                ));
            }
        }
        if shm.starts_with("/dev/shm") {
            return None;
        }
        const SYSTEM: [&str; 23] = [
            "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/sbin", "/sys",
            "/usr", "/var/lib", "/var/log", "/var/run", "/run/containerd", "/run/crio", "/run/docker", "/run/systemd", "/run/dbus", "/run/udev",
        ];
        SYSTEM.iter().map(Path::new).find(|p| near(p)).map(|p| {
            format!(
                "`{shown}` (GPU {index}) is the system directory {}, above or inside it: every offline container would \
                 get it read-write at /dev/shm; name a directory of its own (mps-manager's shm_dir, default /dev/shm/xshare-gpu<N>)",
                p.display()
            )
        })
    }

    /// Host MPS pipe directory of GPU `index`.
    pub fn mps_pipe_host_dir(&self, index: u32) -> PathBuf {
        if self.inject.mps_pipe_dir.is_empty() {
            self.ledger_dir.join(format!("gpu{index}")).join("mps-pipe")
        } else {
            PathBuf::from(
                self.inject
                    .mps_pipe_dir
                    .replace("{gpu}", &index.to_string()),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"{"node_name": "n1", "gpus": [{"index": 0, "uuid": "GPU-aaaa"}]}"#;

    #[test]
    fn defaults_and_env_node_name() {
        let c = AgentConfig::from_text(Path::new("a.json"), OK, |_| None).unwrap();
        assert_eq!(c.device_plugin.resource_name, "xshare.io/offline-gpu");
        assert_eq!(
            c.heartbeat.interval_ms,
            kube_contract::heartbeat::MIN_PUBLISH_INTERVAL_MS
        );
        let t = r#"{"node_name": "n", "gpus": [{"index": 0, "uuid": "GPU-a"}], "heartbeat": {"interval_ms": 1000}}"#;
        let e = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("heartbeat.interval_ms"));
        assert_eq!((c.offline_pods.enabled, c.offline_pods.poll_ms, c.offline_pods.kubelet_eviction_grace_ms), (true, 5000, 0));
        let t = r#"{"node_name": "n", "gpus": [{"index": 0, "uuid": "GPU-a"}], "offline_pods": {"kubelet_eviction_grace_ms": 30000}}"#;
        assert_eq!(AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap().offline_pods.kubelet_eviction_grace_ms, 30_000);
        let t = r#"{"node_name": "n", "gpus": [{"index": 0, "uuid": "GPU-a"}], "offline_pods": {"poll_ms": 10}}"#;
        let e = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("offline_pods.poll_ms"));
        assert_eq!((c.offline_pods.deleted_pod_linger_ms, c.offline_pods.cgroup_root.as_str()), (30_000, "/sys/fs/cgroup"));
        assert_eq!(
            c.mps_pipe_host_dir(0),
            PathBuf::from("/run/xshare/gpu0/mps-pipe")
        );
        let t = r#"{"gpus": [{"index": 1, "uuid": "GPU-b"}]}"#;
        let c = AgentConfig::from_text(Path::new("a.json"), t, |k| {
            (k == ENV_NODE_NAME).then(|| "n9".into())
        })
        .unwrap();
        assert_eq!(c.node_name, "n9");
        let e = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("node_name"));
    }

    #[test]
    fn bad_fields_are_named_with_their_line() {
        let t = "{\"node_name\": \"n\",\n \"gpus\": [{\"index\": 0, \"uuid\": \"GPU-a\"}],\n \"device_plugin\": {\"max_offline_per_gpu\": 0}}";
        let e = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap_err();
        assert_eq!(
            e.field.as_deref(),
            Some("device_plugin.max_offline_per_gpu")
        );
        assert_eq!(e.line, Some(3));
        let t = r#"{"node_name": "n", "gpus": [{"index": 0, "uuid": "0"}]}"#;
        let e = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("gpus.uuid"));
        let t = r#"{"node_name": "n", "gpus": [{"index": 0, "uuid": "GPU-a", "x": 1}]}"#;
        assert!(AgentConfig::from_text(Path::new("a.json"), t, |_| None).is_err());
        let t = r#"{"node_name": "n", "gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 0, "uuid": "GPU-b"}]}"#;
        let e = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
    }

    /// `online_gpus`: an absolute socket, at least one resource, a bounded poll; each refusal
    /// names its field.
    #[test]
    fn online_gpus_settings_are_checked() {
        let cfg = |o: &str| AgentConfig::from_text(Path::new("a.json"), &format!("{{\"node_name\": \"n\", \"gpus\": [{{\"index\": 0}}], \"online_gpus\": {{{o}}}}}"), |_| None);
        let c = cfg("").unwrap().online_gpus;
        assert_eq!((c.enabled, c.poll_ms, c.resources.as_slice()), (true, 5000, ["nvidia.com/gpu".to_string()].as_slice()));
        for (o, field) in [
            (r#""pod_resources_socket": "kubelet.sock""#, "online_gpus.pod_resources_socket"),
            (r#""resources": []"#, "online_gpus.resources"),
            (r#""resources": [" "]"#, "online_gpus.resources"),
            (r#""poll_ms": 999"#, "online_gpus.poll_ms"),
            (r#""poll_ms": 60001"#, "online_gpus.poll_ms"),
        ] {
            assert_eq!(cfg(o).unwrap_err().field.as_deref(), Some(field), "{o}");
        }
    }

    /// The MPS pipe directory is mounted into every offline container of its GPU: one that
    /// is `/`, the ledger directory or above it, or inside it but not a directory of its own
    /// below `gpu<N>/`, would mount ledgers, status files or the daemons' files; refused,
    /// naming the field and its line. Directories of their own stay accepted.
    #[test]
    fn an_mps_pipe_dir_exposing_the_ledger_tree_is_refused() {
        let cfg = |pipe: &str| {
            let t = format!(
                "{{\"node_name\": \"n\", \"ledger_dir\": \"/run/xshare\",\n \"gpus\": [{{\"index\": 0}}, {{\"index\": 1}}],\n \"inject\": {{\"mps_pipe_dir\": \"{pipe}\"}}}}"
            );
            AgentConfig::from_text(Path::new("a.json"), &t, |_| None)
        };
        for bad in [
            "/",
            "/run",
            "/run/xshare",
            "/run/xshare/",
            "/run/xshare/gpu{gpu}",
            "/run/xshare/gpu{gpu}/ledger",
            "/run/xshare/gpu0/mps-pipe",
            "/run/xshare/gpu{gpu}/../status",
            "/run/xshare/daemons",
            "/run/xshare/daemons/gpu{gpu}/pipe",
            "/run/xshare/status",
            "/run/xshare/pods",
            "/run/xshare/mps-{gpu}",
        ] {
            let e = cfg(bad).expect_err(bad);
            assert_eq!(e.field.as_deref(), Some("inject.mps_pipe_dir"), "{bad}: {e}");
            assert_eq!(e.line, Some(3), "{bad}: {e}");
            assert!(e.to_string().contains("a.json"), "{e}");
        }
        for good in ["/run/xshare/gpu{gpu}/mps-pipe", "/run/xshare/gpu{gpu}/mps/pipe", "/srv/mps/gpu{gpu}", "/run/xshare-mps/{gpu}"] {
            let c = cfg(good).unwrap_or_else(|e| panic!("{good}: {e}"));
            assert_eq!(c.mps_pipe_host_dir(1), PathBuf::from(good.replace("{gpu}", "1")));
        }
    }

    /// The MPS shm directory is mounted read-write at every offline container's `/dev/shm`:
    /// `/`, `..`, the ledger directory (or above or inside it), the kubelet's, CDI's and the
    /// shim's directories and system directories are refused, naming the field and its line;
    /// `/dev/shm` and directories of their own stay accepted. Fails without the check: all
    /// were accepted.
    #[test]
    fn an_mps_shm_dir_exposing_the_host_is_refused() {
        let cfg = |shm: &str| {
            let t = format!(
                "{{\"node_name\": \"n\", \"ledger_dir\": \"/run/xshare\",\n \"gpus\": [{{\"index\": 0}}, {{\"index\": 1}}],\n \"inject\": {{\"mps_shm_dir\": \"{shm}\"}}}}"
            );
            AgentConfig::from_text(Path::new("a.json"), &t, |_| None)
        };
        for bad in [
            "/",
            "/run",
            "/run/xshare",
            "/run/xshare/status",
            "/run/xshare/gpu{gpu}",
            "/run/xshare/node-agent",
            "/var/lib/kubelet",
            "/var/lib/kubelet/pods",
            "/var/lib",
            "/var",
            "/var/run/cdi",
            "/usr/local/lib/xshare",
            "/etc",
            "/etc/cron.d",
            "/dev",
            "/dev/mem-{gpu}",
            "/dev/shm/../../etc",
            "/run/containerd",
            "/home/x",
            "/proc",
        ] {
            let e = cfg(bad).expect_err(bad);
            assert_eq!(e.field.as_deref(), Some("inject.mps_shm_dir"), "{bad}: {e}");
            assert_eq!(e.line, Some(3), "{bad}: {e}");
        }
        for good in ["", "host", "/dev/shm", "/dev/shm/xshare-gpu{gpu}", "/run/mps-shm-{gpu}", "/srv/mps/shm{gpu}"] {
            let c = cfg(good).unwrap_or_else(|e| panic!("{good}: {e}"));
            assert!(c.mps_shm_host_dir(1).starts_with("/"), "{good}");
        }
    }

    /// A key given twice: the later value counted, and an error in it was blamed on the first's
    /// line. Refused, at the second's line.
    #[test]
    fn a_key_given_twice_is_refused_at_its_second_line() {
        let t = "{\"node_name\": \"n\",\n \"gpus\": [{\"index\": 0}],\n \"health\": {\"poll_ms\": 1000},\n \"health\": {\"poll_ms\": 0}}";
        let e = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("`health` given twice") && e.to_string().contains("a.json:4"), "{e}");
    }

    /// Durations had no upper bound: `health.stale_after_ms: 10^12` trusted a dead monitor's
    /// last Healthy for decades. Each is bounded, named with its field and line; the bounds
    /// themselves are accepted.
    #[test]
    fn durations_are_bounded_naming_field_and_line() {
        let cfg = |block: &str, key: &str, v: u64| {
            let t = format!("{{\"node_name\": \"n\",\n \"gpus\": [{{\"index\": 0}}],\n \"{block}\": {{\"{key}\": {v}}}}}");
            AgentConfig::from_text(Path::new("a.json"), &t, |_| None)
        };
        for (block, key, max) in [
            ("health", "poll_ms", MAX_POLL_MS),
            ("health", "stale_after_ms", MAX_STALE_AFTER_MS),
            ("eviction", "poll_ms", MAX_POLL_MS),
            ("eviction", "retry_ms", MAX_POLL_MS),
            ("offline_pods", "poll_ms", MAX_PERIOD_MS),
            ("offline_pods", "kubelet_eviction_grace_ms", MAX_PERIOD_MS),
            ("heartbeat", "interval_ms", MAX_PERIOD_MS),
            ("kube", "timeout_ms", MAX_PERIOD_MS),
        ] {
            let field = format!("{block}.{key}");
            for v in [max + 1, 1_000_000_000_000, u64::MAX] {
                let e = cfg(block, key, v).expect_err(&field);
                assert_eq!((e.field.as_deref(), e.line), (Some(field.as_str()), Some(3)), "{v}: {e}");
                assert!(e.message.contains(&format!("got {v}")), "{e}");
            }
            assert!(cfg(block, key, max).is_ok(), "{field} = {max}");
        }
        // The lower bounds name their own field (poll_ms was blamed on stale_after_ms).
        for (block, key) in [("health", "poll_ms"), ("eviction", "poll_ms"), ("kube", "timeout_ms")] {
            let e = cfg(block, key, 0).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(format!("{block}.{key}").as_str()), "{e}");
        }
        // A staleness under a second made every monitor read as dead (at 1 ms, always).
        let e = cfg("health", "stale_after_ms", 1).unwrap_err();
        assert!(e.field.as_deref() == Some("health.stale_after_ms") && e.message.contains("flap"), "{e}");
        assert!(cfg("health", "stale_after_ms", MIN_STALE_AFTER_MS).is_ok());
    }

    /// A relative device-plugin or CDI directory (resolved against wherever the agent runs) and
    /// `/` as the containers' ledger directory were accepted; `[]` as the whole file too.
    #[test]
    fn directories_are_absolute_and_the_file_is_one_object() {
        let with = |extra: &str| {
            let t = format!("{{\"node_name\": \"n\",\n \"gpus\": [{{\"index\": 0}}],\n {extra}}}");
            AgentConfig::from_text(Path::new("a.json"), &t, |_| None)
        };
        for (extra, field) in [
            (r#""device_plugin": {"dir": "device-plugins"}"#, "device_plugin.dir"),
            (r#""cdi": {"enabled": true, "spec_dir": "cdi"}"#, "cdi.spec_dir"),
            (r#""inject": {"ledger_container_dir": "/"}"#, "inject.ledger_container_dir"),
        ] {
            let e = with(extra).unwrap_err();
            assert_eq!((e.field.as_deref(), e.line), (Some(field), Some(3)), "{extra}: {e}");
        }
        assert!(with(r#""inject": {"ledger_container_dir": "/run/xshare"}"#).is_ok());
        assert!(with(r#""cdi": {"enabled": false, "spec_dir": "cdi"}"#).is_ok(), "not used with CDI off");
        let e = AgentConfig::from_text(Path::new("a.json"), "[]", |_| Some("n".into())).unwrap_err();
        assert!(e.message.contains("one JSON object"), "{e}");
    }

    /// A deleted pod's linger is bounded, and the cgroup root is absolute or empty; each bad
    /// value named with its field and line.
    #[test]
    fn the_deleted_pod_linger_is_bounded_and_the_cgroup_root_absolute() {
        let cfg = |op: &str| {
            let t = format!("{{\"node_name\": \"n\",\n \"gpus\": [{{\"index\": 0}}],\n \"offline_pods\": {{{op}}}}}");
            AgentConfig::from_text(Path::new("a.json"), &t, |_| None)
        };
        let c = cfg(r#""deleted_pod_linger_ms": 600000, "cgroup_root": "/host/sys/fs/cgroup""#).unwrap();
        assert_eq!((c.offline_pods.deleted_pod_linger_ms, c.offline_pods.cgroup_root.as_str()), (600_000, "/host/sys/fs/cgroup"));
        assert_eq!(cfg(r#""deleted_pod_linger_ms": 0, "cgroup_root": """#).unwrap().offline_pods.deleted_pod_linger_ms, 0);
        for (bad, field) in [
            (r#""deleted_pod_linger_ms": 600001"#, "offline_pods.deleted_pod_linger_ms"),
            (r#""cgroup_root": "sys/fs/cgroup""#, "offline_pods.cgroup_root"),
        ] {
            let e = cfg(bad).expect_err(bad);
            assert_eq!((e.field.as_deref(), e.line), (Some(field), Some(3)), "{bad}: {e}");
            assert!(e.to_string().contains("a.json"), "{e}");
        }
        assert!(cfg(r#""deleted_pod_linger_ms": -1"#).is_err());
    }

    /// `inject.mps_shm`: `shared` by default, `private` or `shared` as written; anything else
    /// refused naming the field and its line.
    #[test]
    fn the_mps_shm_is_shared_by_default_private_when_asked_and_nothing_else() {
        let c = AgentConfig::from_text(Path::new("a.json"), OK, |_| None).unwrap();
        assert_eq!(c.inject.mps_shm, MpsShm::Shared);
        let cfg = |v: &str| {
            let t = format!("{{\"node_name\": \"n\",\n \"gpus\": [{{\"index\": 0}}],\n \"inject\": {{\"mps_shm\": {v}}}}}");
            AgentConfig::from_text(Path::new("a.json"), &t, |_| None)
        };
        assert_eq!(cfg("\"private\"").unwrap().inject.mps_shm, MpsShm::Private);
        assert_eq!(cfg("\"shared\"").unwrap().inject.mps_shm, MpsShm::Shared);
        for bad in ["\"none\"", "\"Private\"", "true", "\"\""] {
            let e = cfg(bad).expect_err(bad);
            assert_eq!((e.field.as_deref(), e.line), (Some("inject.mps_shm"), Some(3)), "{bad}: {e}");
            assert!(e.to_string().contains("a.json"), "{e}");
        }
    }

    /// mps-manager's state file: its default beside the GPU's ledger, or the template given.
    #[test]
    fn the_mps_manager_state_file_is_the_default_or_the_template() {
        let c = AgentConfig::from_text(Path::new("a.json"), OK, |_| None).unwrap();
        assert_eq!(c.mps_manager_state_path(3), PathBuf::from("/run/xshare/daemons/gpu3/mps-manager.json"));
        let t = r#"{"node_name": "n", "gpus": [{"index": 0}], "mps_manager_state_file": "/var/lib/x/gpu{gpu}.json"}"#;
        let c = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap();
        assert_eq!(c.mps_manager_state_path(3), PathBuf::from("/var/lib/x/gpu3.json"));
        let t = r#"{"node_name": "n", "gpus": [{"index": 0}], "mps_manager_state_file": "gpu{gpu}.json"}"#;
        let e = AgentConfig::from_text(Path::new("a.json"), t, |_| None).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("mps_manager_state_file"));
    }
}
