//! The kubelet device plugin (API v1beta1): the `DevicePlugin` service on our own unix socket,
//! registration with the kubelet, and re-registration when the kubelet restarts.
//!
//! Lifecycle (as NVIDIA's plugin): serve on `<dir>/<socket_name>`, then `Register` with
//! `<dir>/kubelet.sock`; a restarted kubelet wipes the directory (our socket disappears) or
//! recreates `kubelet.sock` (new inode): then the server is stopped and both steps redone.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Mutex};
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use crate::allocate::{self, AllocError, Allocations};
use kube_contract::bind_lock::BindLock;
use crate::config::AgentConfig;
use crate::health::GpuHealth;
use crate::pb;
use crate::pb::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::pb::registration_client::RegistrationClient;

/// API version string the kubelet expects in `RegisterRequest.version`.
pub const API_VERSION: &str = "v1beta1";
/// `Device.health` of a slot whose GPU takes offline work.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a slot whose GPU is not Healthy (the kubelet admits nothing to it).
pub const UNHEALTHY: &str = "Unhealthy";

/// Device ID of slot `slot` of GPU `gpu`.
pub fn device_id(gpu: u32, slot: u32) -> String {
    format!("gpu{gpu}-{slot}")
}

/// GPU index of a device ID made by [`device_id`].
pub fn device_gpu(id: &str) -> Option<u32> {
    id.strip_prefix("gpu")?.split_once('-')?.0.parse().ok()
}

/// The advertised devices: `max_offline_per_gpu` slots per GPU, Unhealthy unless the GPU is.
pub fn devices(cfg: &AgentConfig, health: &BTreeMap<u32, GpuHealth>) -> Vec<pb::Device> {
    let mut out = Vec::new();
    for g in &cfg.gpus {
        let ok = health.get(&g.index).is_some_and(|h| h.healthy());
        for s in 0..cfg.device_plugin.max_offline_per_gpu {
            out.push(pb::Device {
                id: device_id(g.index, s),
                health: if ok { HEALTHY } else { UNHEALTHY }.into(),
                topology: None,
            });
        }
    }
    out
}

/// Where Allocate finds pending pods: the API server, or (tests of the gRPC side alone) a list.
#[derive(Clone)]
pub enum PodSource {
    /// The node's Pending pods, listed from the API server.
    Api(kube::Client),
    /// A fixed list (tests of the gRPC side alone).
    Fixed(Arc<std::sync::Mutex<Vec<k8s_openapi::api::core::v1::Pod>>>),
}

impl PodSource {
    /// The pod the node's bind lock lets through (`kube_contract::bind_lock`). Unreadable
    /// (no `get` on nodes, the API down): none, logged; Allocate then matches by age alone.
    async fn bind_lock(&self, node: &str) -> Option<BindLock> {
        match self {
            PodSource::Api(c) => match crate::kube::bind_lock(c, node).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(node, error = %e, "cannot read the node's bind lock; matching without it");
                    None
                }
            },
            PodSource::Fixed(..) => None,
        }
    }

    /// Gives back the bind lock of pod `uid` (a task of its own: the kubelet's Allocate does
    /// not wait on it). A failure is logged: the extender takes the lock over after its TTL.
    fn give_back(&self, node: &str, uid: &str, given: Arc<Counter>) {
        let PodSource::Api(c) = self else { return };
        let (c, node, uid) = (c.clone(), node.to_string(), uid.to_string());
        tokio::spawn(async move {
            match kube_contract::bind_lock::release(&c, &node, &uid, kube_contract::NODE_AGENT_FIELD_MANAGER).await {
                Ok(true) => {
                    given.inc();
                    tracing::debug!(node, pod_uid = uid, "bind lock given back");
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(node, pod_uid = uid, error = %e, "cannot give back the bind lock; the extender takes it over after its TTL"),
            }
        });
    }

    async fn pending(&self, node: &str) -> Result<Vec<k8s_openapi::api::core::v1::Pod>, String> {
        match self {
            PodSource::Api(c) => crate::kube::pods_on_node(c, node, Some("Pending"))
                .await
                .map_err(|e| format!("listing Pending pods on {node}: {e}")),
            PodSource::Fixed(p) => Ok(p
                .lock()
                .map_err(|_| "pod list poisoned".to_string())?
                .clone()),
        }
    }
}

/// A counter for `/metrics`.
#[derive(Debug, Default)]
struct Counter(std::sync::atomic::AtomicU64);

impl Counter {
    fn inc(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Allocate's counters ([`Plugin::metrics`]).
#[derive(Debug, Default)]
struct AllocStats {
    by_lock: Counter,
    by_age: Counter,
    ambiguous: Counter,
    refused: Counter,
    give_backs: Arc<Counter>,
}

/// The service state shared by every gRPC call.
pub struct Plugin {
    cfg: Arc<AgentConfig>,
    health: watch::Receiver<BTreeMap<u32, GpuHealth>>,
    devices: watch::Receiver<Vec<pb::Device>>,
    pods: PodSource,
    allocs: Mutex<Allocations>,
    stats: AllocStats,
    plans: Arc<crate::plans::PlanStore>,
}

impl Plugin {
    /// The plugin over the agent's config, the health and device-list channels, and `pods`.
    pub fn new(
        cfg: Arc<AgentConfig>,
        health: watch::Receiver<BTreeMap<u32, GpuHealth>>,
        devices: watch::Receiver<Vec<pb::Device>>,
        pods: PodSource,
    ) -> Self {
        Self {
            health,
            devices,
            pods,
            allocs: Mutex::new(Allocations::default()),
            stats: AllocStats::default(),
            plans: Arc::new(crate::plans::PlanStore::open(&cfg.ledger_dir)),
            cfg,
        }
    }

    /// The same plugin keeping its frozen plans in `plans` (the store the offline pod list
    /// reads, `crate::plans`).
    pub fn with_plans(mut self, plans: Arc<crate::plans::PlanStore>) -> Self {
        self.plans = plans;
        self
    }

    async fn allocate_one(
        &self,
        req: &pb::ContainerAllocateRequest,
    ) -> Result<pb::ContainerAllocateResponse, AllocError> {
        let count = req.devices_ids.len() as i64;
        let node = &self.cfg.node_name;
        // One Allocate at a time: two containers must not pick the same pod container.
        let mut allocs = self.allocs.lock().await;
        let pods = self.pods.pending(node).await.map_err(AllocError::Api)?;
        allocs.retain(&pods.iter().filter_map(|p| p.metadata.uid.clone()).collect());
        let lock = self.pods.bind_lock(node).await;
        let resource = &self.cfg.device_plugin.resource_name;
        let picked = allocs.pick(&pods, node, resource, count, lock.as_ref());
        // Ambiguous: the lock stays (its pod may not be the one refused; the extender takes
        // it over once that pod is no longer Pending, or after its TTL).
        let picked = picked.inspect_err(|e| {
            self.stats.refused.inc();
            if matches!(e, AllocError::Ambiguous { .. }) {
                self.stats.ambiguous.inc();
            }
        })?;
        let pod = picked.pod;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let locked = lock.as_ref().is_some_and(|l| l.uid == uid);
        if locked { &self.stats.by_lock } else { &self.stats.by_age }.inc();
        let r = self.admit(&mut allocs, &pod, req).await;
        if r.is_err() {
            self.stats.refused.inc();
        }
        // The lock's pod is through once its last container is allocated; a failed Allocate
        // fails its admission: either way the node is free for the next offline pod's bind.
        if locked && (r.is_err() || allocs.complete(&pod, resource)) {
            self.pods.give_back(node, &uid, self.stats.give_backs.clone());
        }
        r
    }

    /// Allocate's counters, as Prometheus text (`xshare_node_agent_*`).
    pub fn metrics(&self) -> String {
        let s = &self.stats;
        let node = &self.cfg.node_name;
        format!(
            "# HELP xshare_node_agent_allocate_matches_total Containers matched to a pod at Allocate: the one candidate the node's bind lock names, or one it does not name\n\
             # TYPE xshare_node_agent_allocate_matches_total counter\n\
             xshare_node_agent_allocate_matches_total{{node=\"{node}\",by=\"bind_lock\"}} {}\n\
             xshare_node_agent_allocate_matches_total{{node=\"{node}\",by=\"oldest\"}} {}\n\
             # HELP xshare_node_agent_allocate_ambiguous_total Containers several Pending pods could own, refused (pods bound past the bind lock or with spec.nodeName)\n\
             # TYPE xshare_node_agent_allocate_ambiguous_total counter\n\
             xshare_node_agent_allocate_ambiguous_total{{node=\"{node}\"}} {}\n\
             # HELP xshare_node_agent_allocate_refused_total Allocate calls refused (the pod's admission fails)\n\
             # TYPE xshare_node_agent_allocate_refused_total counter\n\
             xshare_node_agent_allocate_refused_total{{node=\"{node}\"}} {}\n\
             # HELP xshare_node_agent_bind_lock_give_backs_total Bind locks given back after the locked pod's Allocate\n\
             # TYPE xshare_node_agent_bind_lock_give_backs_total counter\n\
             xshare_node_agent_bind_lock_give_backs_total{{node=\"{node}\"}} {}\n",
            s.by_lock.get(),
            s.by_age.get(),
            s.ambiguous.get(),
            s.refused.get(),
            s.give_backs.get(),
        )
    }

    /// Checks the picked pod's plan against this node and builds its container's response.
    async fn admit(
        &self,
        allocs: &mut Allocations,
        pod: &k8s_openapi::api::core::v1::Pod,
        req: &pb::ContainerAllocateRequest,
    ) -> Result<pb::ContainerAllocateResponse, AllocError> {
        // The plan frozen for the pod (at its first sight or now), never later annotations.
        let plan = self.plans.for_allocate(pod)?;
        if self.cfg.gpu(plan.gpu).is_none() {
            return Err(AllocError::UnknownGpu {
                ns: plan.namespace,
                name: plan.name,
                gpu: plan.gpu,
            });
        }
        let h = self.health.borrow().get(&plan.gpu).cloned();
        if !h.as_ref().is_some_and(|h| h.healthy()) {
            let why = h.map(|h| h.why).unwrap_or_else(|| "no reading".into());
            return Err(AllocError::Unhealthy {
                ns: plan.namespace,
                name: plan.name,
                gpu: plan.gpu,
                why,
            });
        }
        // Read again: the health above is up to `health.poll_ms` old.
        if let Err(why) = crate::mps::offline_ready(&self.cfg, plan.gpu, node_daemon::clock::unix_ms(), self.cfg.health.stale_after_ms) {
            return Err(AllocError::Mps {
                ns: plan.namespace,
                name: plan.name,
                gpu: plan.gpu,
                why,
            });
        }
        let resp = allocate::container_response(&self.cfg, &plan)?;
        allocs.record(&plan.uid);
        tracing::info!(pod = %format!("{}/{}", plan.namespace, plan.name), gpu = plan.gpu,
            mps_percent = plan.mps_percent, quota = plan.memory_quota_bytes, devices = ?req.devices_ids, "allocated");
        Ok(resp)
    }
}

type DeviceStream =
    Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<DeviceStream>, Status> {
        // The current list at once, then each change.
        let s = WatchStream::new(self.devices.clone())
            .map(|devices| Ok(pb::ListAndWatchResponse { devices }));
        Ok(Response::new(Box::pin(s)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let health = self.health.borrow().clone();
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| pb::ContainerPreferredAllocationResponse {
                device_i_ds: preferred(c, &health),
            })
            .collect();
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for c in &req.get_ref().container_requests {
            match self.allocate_one(c).await {
                Ok(r) => container_responses.push(r),
                Err(e) => {
                    tracing::warn!(error = %e, devices = ?c.devices_ids, "Allocate refused");
                    let status = match e {
                        AllocError::Api(_) => Status::unavailable(e.to_string()),
                        _ => Status::failed_precondition(e.to_string()),
                    };
                    return Err(status);
                }
            }
        }
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

/// Our options: no PreStartContainer, GetPreferredAllocation available.
pub fn options() -> pb::DevicePluginOptions {
    pb::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The must-include IDs, then slots of healthy GPUs, the GPU with most free slots first
/// (offline work spread over GPUs), up to `allocation_size`.
pub fn preferred(
    c: &pb::ContainerPreferredAllocationRequest,
    health: &BTreeMap<u32, GpuHealth>,
) -> Vec<String> {
    let want = c.allocation_size.max(0) as usize;
    let mut out: Vec<String> = c
        .must_include_device_i_ds
        .iter()
        .take(want)
        .cloned()
        .collect();
    let mut free: HashMap<Option<u32>, usize> = HashMap::new();
    for id in &c.available_device_i_ds {
        *free.entry(device_gpu(id)).or_default() += 1;
    }
    let mut rest: Vec<&String> = c
        .available_device_i_ds
        .iter()
        .filter(|id| !out.contains(id))
        .collect();
    rest.sort_by_key(|id| {
        let g = device_gpu(id);
        let healthy = g.and_then(|g| health.get(&g)).is_some_and(|h| h.healthy());
        (
            !healthy,
            std::cmp::Reverse(free.get(&g).copied().unwrap_or(0)),
            g,
            (*id).clone(),
        )
    });
    out.extend(
        rest.into_iter()
            .take(want.saturating_sub(out.len()))
            .cloned(),
    );
    out
}

/// Serves the plugin on `<dir>/<socket_name>` and registers with the kubelet, again after
/// each kubelet restart, until `stop` turns true.
pub async fn run(
    cfg: Arc<AgentConfig>,
    plugin: Arc<Plugin>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let dp = &cfg.device_plugin;
    let sock = dp.dir.join(&dp.socket_name);
    let kubelet = dp.dir.join(&dp.kubelet_socket);
    let mut backoff = Duration::from_millis(500);
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        let (shut_tx, shut_rx) = tokio::sync::oneshot::channel::<()>();
        let server = match serve(&sock, plugin.clone(), shut_rx).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "device plugin cannot serve; retrying");
                if sleep_or_stop(&mut stop, backoff).await {
                    return Ok(());
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        match register(&kubelet, &dp.socket_name, &dp.resource_name).await {
            Ok(()) => {
                backoff = Duration::from_millis(500);
                tracing::info!(socket = %sock.display(), resource = %dp.resource_name, "registered with the kubelet");
                let kubelet_ino = inode(&kubelet);
                // Watch for a kubelet restart.
                loop {
                    if sleep_or_stop(&mut stop, Duration::from_millis(500)).await {
                        stop_server(shut_tx, server).await;
                        let _ = std::fs::remove_file(&sock);
                        return Ok(());
                    }
                    if inode(&sock).is_none() || inode(&kubelet) != kubelet_ino {
                        tracing::warn!("kubelet restarted (socket removed or kubelet.sock replaced): registering again");
                        break;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, kubelet = %kubelet.display(), "registration failed; retrying");
                if sleep_or_stop(&mut stop, backoff).await {
                    stop_server(shut_tx, server).await;
                    let _ = std::fs::remove_file(&sock);
                    return Ok(());
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
        stop_server(shut_tx, server).await;
    }
}

/// Stops a server: graceful for a second (ListAndWatch streams never end by themselves, and
/// the kubelet that held them is gone), then dropped with its connections.
async fn stop_server(
    shut_tx: tokio::sync::oneshot::Sender<()>,
    mut server: tokio::task::JoinHandle<()>,
) {
    let _ = shut_tx.send(());
    if tokio::time::timeout(Duration::from_secs(1), &mut server)
        .await
        .is_err()
    {
        server.abort();
        let _ = server.await;
    }
}

async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *stop.borrow(),
        r = stop.changed() => r.is_err() || *stop.borrow(),
    }
}

fn inode(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.ino())
}

/// Binds `sock` (replacing a stale file) and serves the plugin on it until `shutdown`.
pub async fn serve(
    sock: &Path,
    plugin: Arc<Plugin>,
    shutdown: tokio::sync::oneshot::Receiver<()>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    match std::fs::remove_file(sock) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing stale {}: {e}", sock.display())),
    }
    let listener =
        UnixListener::bind(sock).map_err(|e| format!("binding {}: {e}", sock.display()))?;
    let incoming = UnixListenerStream::new(listener);
    let svc = DevicePluginServer::from_arc(plugin);
    Ok(tokio::spawn(async move {
        let r = Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = shutdown.await;
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "device plugin server stopped");
        }
    }))
}

/// A gRPC channel over the unix socket `path` (the URI is a placeholder tonic requires).
pub async fn unix_channel(
    path: PathBuf,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(p).await?)) }
        }))
        .await
}

/// `Register` with the kubelet at `kubelet`: our socket's file name, resource, options.
pub async fn register(kubelet: &Path, endpoint: &str, resource: &str) -> Result<(), String> {
    let ch = tokio::time::timeout(Duration::from_secs(5), unix_channel(kubelet.to_owned()))
        .await
        .map_err(|_| format!("connecting to {}: timed out", kubelet.display()))?
        .map_err(|e| format!("connecting to {}: {e}", kubelet.display()))?;
    let req = pb::RegisterRequest {
        version: API_VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(options()),
    };
    tokio::time::timeout(
        Duration::from_secs(5),
        RegistrationClient::new(ch).register(req),
    )
    .await
    .map_err(|_| "Register: timed out".to_string())?
    .map_err(|e| format!("Register refused: {} {}", e.code(), e.message()))?;
    Ok(())
}

/// Reads every GPU's health each `poll_ms` (the monitor's verdict, made Unhealthy while MPS
/// could not serve an offline container: [`crate::mps`]) and publishes it and the device list
/// (the latter only when a device's health changed, so ListAndWatch sends changes only).
pub async fn poll_health(
    cfg: Arc<AgentConfig>,
    health_tx: watch::Sender<BTreeMap<u32, GpuHealth>>,
    devices_tx: watch::Sender<Vec<pb::Device>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let h = crate::health::read_offline(&cfg);
        for g in h.values() {
            let was = health_tx.borrow().get(&g.index).map(|o| o.healthy());
            if was != Some(g.healthy()) {
                tracing::info!(gpu = g.index, healthy = g.healthy(), why = %g.why, "GPU health for offline slots");
            }
        }
        let d = devices(&cfg, &h);
        health_tx.send_replace(h);
        devices_tx.send_if_modified(|cur| {
            if *cur != d {
                *cur = d;
                true
            } else {
                false
            }
        });
        if sleep_or_stop(&mut stop, Duration::from_millis(cfg.health.poll_ms)).await {
            return;
        }
    }
}
