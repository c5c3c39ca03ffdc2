//! Allocate's decisions, apart from gRPC and the API: which pending pod a container belongs to
//! and what the container gets.
//!
//! The kubelet tells a device plugin only device IDs, never the pod. Like HAMi, the scheduler
//! side writes its decision onto the pod (cluster-matcher's bind: `xshare.io/gpu`,
//! `xshare.io/sm-percent`, `xshare.io/memory-quota-bytes`) and the plugin finds the pod: the
//! one Pending pod bound to this node that still has a container asking for this many slots
//! that was not allocated yet (more than one: refused, [`Allocations::pick`]). The GPU is the plan's (annotation),
//! not the slot the kubelet picked: slots are a count per node, health is checked on the
//! planned GPU at Allocate.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::config::AgentConfig;
use crate::pb;

/// Annotations written by the extender at bind (kube-contract, shared with cluster-matcher).
pub use kube_contract::pod::{ANN_GPU, ANN_MEMORY_QUOTA_BYTES, ANN_SM_PERCENT};

/// Quota group of a pod's processes in the ledger (`XCUDA_GROUP`): all containers of a pod
/// share the pod's planned quota. The eviction side maps a ledger group back to its pod by
/// the same name.
pub fn group_name(pod_uid: &str) -> String {
    node_ledger::ledger::pod_group_name(pod_uid)
}

/// The plan's decision for one pod, read from its annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct PodPlan {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (its quota group is `k8s-pod-<uid>`).
    pub uid: String,
    /// Host GPU index the plan chose (`xshare.io/gpu`).
    pub gpu: u32,
    /// MPS active-thread percentage (1..=100, rounded up from the plan's SM %).
    pub mps_percent: u32,
    /// The shim's GPU memory limit (`xshare.io/memory-quota-bytes`).
    pub memory_quota_bytes: u64,
    /// How long the kubelet waits after a SIGTERM before it SIGKILLs the pod's containers, ms
    /// ([`kill_grace_ms`]); the shim drains the GPU just before (`XCUDA_KILL_GRACE_MS`), unless
    /// the pod's deletion in its termination file says otherwise. `None` for a plan frozen
    /// before node-agent recorded it: drained by a deletion alone.
    pub kill_grace_ms: Option<u64>,
}

/// The kubelet's wait between a container's SIGTERM and its SIGKILL for `pod`, ms: the pod's
/// `spec.terminationGracePeriodSeconds` (the API server's default is 30 s), at least the 2 s
/// the kubelet itself never goes below. A deletion's own grace (shorter or longer than the
/// spec's) and a `preStop` hook that uses part of it move the kill: the shim learns them from
/// the pod's termination file (`crate::offline_pods`; xcuda-shim/README.md, "Drain before the
/// kubelet's SIGKILL").
pub fn kill_grace_ms(pod: &Pod) -> u64 {
    let s = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
    (s.max(2) as u64).saturating_mul(1000)
}

/// Why no pod could be matched or its plan read; the kubelet fails the pod's admission with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocError {
    /// No Pending pod bound here has a container left to allocate.
    #[error("no Pending pod on node {node} has an unallocated container asking for {count} {resource}")]
    NoPod {
        /// This node.
        node: String,
        /// Devices the kubelet asked for in the container request.
        count: i64,
        /// The extended resource.
        resource: String,
    },
    /// More than one Pending pod bound here could own the container: the kubelet may be
    /// admitting any of them, so none is given another's plan.
    #[error("node {node}: several Pending pods could own this container ({pods}): refused, as no pod may get another's plan, quota group or ledger (the pod being admitted fails; a pod bound past the extender's bind lock, or created with spec.nodeName, is one of them)")]
    Ambiguous {
        /// This node.
        node: String,
        /// The candidates, `namespace/name`.
        pods: String,
    },
    /// A placement annotation is missing or malformed.
    #[error("pod {ns}/{name}: annotation `{key}` {why}")]
    BadAnnotation {
        /// The pod's namespace.
        ns: String,
        /// The pod's name.
        name: String,
        /// The annotation.
        key: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// The plan's GPU is not one this agent serves.
    #[error("pod {ns}/{name}: planned GPU {gpu} is not served by this agent")]
    UnknownGpu {
        /// The pod's namespace.
        ns: String,
        /// The pod's name.
        name: String,
        /// The planned GPU index.
        gpu: u32,
    },
    #[error(
        "pod {ns}/{name}: planned GPU {gpu} is not Healthy ({why}); offline work is not admitted"
    )]
    /// The plan's GPU is not Healthy now: offline work is refused admission.
    Unhealthy {
        /// The pod's namespace.
        ns: String,
        /// The pod's name.
        name: String,
        /// The planned GPU index.
        gpu: u32,
        /// Its health verdict.
        why: String,
    },
    /// MPS on the plan's GPU could not serve the container now (no control daemon, or another
    /// `/dev/shm` than its server has): it would get no context ([`crate::mps`]).
    #[error("pod {ns}/{name}: GPU {gpu}'s MPS could not serve it: {why}")]
    Mps {
        /// The pod's namespace.
        ns: String,
        /// The pod's name.
        name: String,
        /// The planned GPU index.
        gpu: u32,
        /// Why not, and the fix.
        why: String,
    },
    /// The pod's ledger on its planned GPU could not be made (`node_ledger::pods`).
    #[error("pod {ns}/{name}: no ledger for GPU {gpu}: {why}")]
    PodLedger {
        /// The pod's namespace.
        ns: String,
        /// The pod's name.
        name: String,
        /// The planned GPU index.
        gpu: u32,
        /// What failed.
        why: String,
    },
    /// The pod's termination file (`node_ledger::termination`) could not be made: refused as
    /// a pod ledger failure is, rather than started with a drain blind to a shortened grace.
    #[error("pod {ns}/{name}: no termination file: {why}")]
    TerminationFile {
        /// The pod's namespace.
        ns: String,
        /// The pod's name.
        name: String,
        /// What failed (names the file).
        why: String,
    },
    /// The plan frozen for the pod when this agent first saw it (`crate::plans`) is not a
    /// complete one: plan annotations added or changed later are not followed.
    #[error("pod {ns}/{name}: the plan frozen when this node first saw it is incomplete ({why}); plan annotations added or changed since are not followed")]
    Unplanned {
        /// The pod's namespace.
        ns: String,
        /// The pod's name.
        name: String,
        /// Which part was missing.
        why: String,
    },
    /// The pod's plan could not be recorded (`crate::plans`): refused rather than allocated
    /// with a plan the agent could not keep.
    #[error("pod {ns}/{name}: cannot record its plan: {why}")]
    PlanRecord {
        /// The pod's namespace.
        ns: String,
        /// The pod's name.
        name: String,
        /// What failed (names the file).
        why: String,
    },
    /// Listing the node's pods failed.
    #[error("{0}")]
    Api(String),
}

/// A plan annotation's value as Allocate and the offline pod list both read it: trimmed.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(|v| v.trim())
}

/// `xshare.io/gpu`'s value as a GPU index.
pub fn parse_gpu(v: &str) -> Option<u32> {
    v.trim().parse::<u32>().ok()
}

/// `xshare.io/sm-percent`'s value as the MPS active-thread percentage (in (0, 100], rounded
/// up to 1..=100).
pub fn parse_sm_percent(v: &str) -> Option<u32> {
    let sm = v.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0 && *v <= 100.0)?;
    Some((sm.ceil() as u32).clamp(1, 100))
}

pub use kube_contract::pod::parse_memory_quota;

/// Reads the plan's annotations off `pod`; every one must be there and well formed.
pub fn pod_plan(pod: &Pod) -> Result<PodPlan, AllocError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let bad = |key: &'static str, why: String| AllocError::BadAnnotation {
        ns: ns.clone(),
        name: name.clone(),
        key,
        why,
    };
    let get = |key: &'static str| annotation(pod, key).ok_or_else(|| bad(key, "is missing".into()));
    let gpu_s = get(ANN_GPU)?;
    let gpu = parse_gpu(gpu_s).ok_or_else(|| bad(ANN_GPU, format!("`{gpu_s}` is not a GPU index")))?;
    let sm_s = get(ANN_SM_PERCENT)?;
    let mps_percent = parse_sm_percent(sm_s)
        .ok_or_else(|| bad(ANN_SM_PERCENT, format!("`{sm_s}` is not a percentage in (0, 100]")))?;
    let q_s = get(ANN_MEMORY_QUOTA_BYTES)?;
    let memory_quota_bytes = parse_memory_quota(q_s)
        .ok_or_else(|| bad(ANN_MEMORY_QUOTA_BYTES, format!("`{q_s}` is not a positive byte count")))?;
    Ok(PodPlan {
        namespace: ns.clone(),
        name: name.clone(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        gpu,
        mps_percent,
        memory_quota_bytes,
        kill_grace_ms: Some(kill_grace_ms(pod)),
    })
}

/// How many `resource` a container asks for (limits win; extended resources must have
/// requests == limits).
pub fn container_count(c: &Container, resource: &str) -> i64 {
    let r = c.resources.as_ref();
    let q = r
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(resource))
        .or_else(|| {
            r.and_then(|r| r.requests.as_ref())
                .and_then(|l| l.get(resource))
        });
    q.and_then(|q| q.0.trim().parse::<i64>().ok()).unwrap_or(0)
}

/// The containers of `pod` that ask for `resource`, init containers first (the kubelet's
/// admission order), with their counts.
pub fn requesting_containers(pod: &Pod, resource: &str) -> Vec<(String, i64)> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| (c.name.clone(), container_count(c, resource)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The pod [`Allocations::pick`] chose for a container.
#[derive(Debug, Clone)]
pub struct Picked {
    /// The pod.
    pub pod: Pod,
    /// How many Pending pods could have owned the container (one: more are refused).
    pub candidates: usize,
}

/// Tracks which containers of which pods were allocated already (by pod UID).
#[derive(Debug, Default)]
pub struct Allocations {
    done: HashMap<String, usize>,
}

impl Allocations {
    /// Picks the pod for a container asking for `count` slots among `pods` (the Pending pods
    /// bound to `node`). Every such pod asking for `resource` with a container left to
    /// allocate is a candidate, planned or not: the kubelet tells a plugin no pod, so when more
    /// than one could be the pod being admitted the container is refused
    /// ([`AllocError::Ambiguous`]) rather than given one pod's plan, quota group and ledger
    /// for another's; the bind `lock` only names the pod the extender let through, not the one
    /// the kubelet admits. A pod whose containers the kubelet already reports on
    /// (`status.containerStatuses`, `initContainerStatuses`) was admitted, every container
    /// allocated: no candidate (also across an agent restart, which forgets the record).
    /// [`Self::record`] the pick once the container's response is built.
    pub fn pick(
        &self,
        pods: &[Pod],
        node: &str,
        resource: &str,
        count: i64,
        lock: Option<&kube_contract::bind_lock::BindLock>,
    ) -> Result<Picked, AllocError> {
        let admitted = |p: &Pod| {
            p.status.as_ref().is_some_and(|s| {
                s.container_statuses.as_ref().is_some_and(|c| !c.is_empty())
                    || s.init_container_statuses.as_ref().is_some_and(|c| !c.is_empty())
            })
        };
        let cands: Vec<&Pod> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter(|p| !admitted(p))
            .filter(|p| {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let done = self.done.get(&uid).copied().unwrap_or(0);
                requesting_containers(p, resource)
                    .get(done)
                    .is_some_and(|(_, n)| *n == count)
            })
            .collect();
        if cands.len() > 1 {
            // Pods bound past the lock (turned off, taken over after its TTL, bound before an
            // upgrade that brought it), or bound by someone else than the extender: the kubelet
            // may be admitting any of them.
            let mut names: Vec<String> = cands
                .iter()
                .map(|p| format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or(""), p.metadata.name.as_deref().unwrap_or("")))
                .collect();
            names.sort();
            tracing::warn!(node, candidates = ?names, lock = ?lock.map(|l| l.pod()),
                "several Pending pods could own this container: refused (no pod's plan, quota group or ledger is handed to another)");
            return Err(AllocError::Ambiguous { node: node.to_string(), pods: names.join(", ") });
        }
        let pod = cands.first().ok_or_else(|| AllocError::NoPod {
            node: node.to_string(),
            count,
            resource: resource.to_string(),
        })?;
        Ok(Picked { pod: (*pod).clone(), candidates: cands.len() })
    }

    /// Whether every container of `pod` asking for `resource` was allocated.
    pub fn complete(&self, pod: &Pod, resource: &str) -> bool {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.done.get(uid).copied().unwrap_or(0) >= requesting_containers(pod, resource).len()
    }

    /// Records that one more container of pod `uid` was allocated.
    pub fn record(&mut self, uid: &str) {
        *self.done.entry(uid.to_string()).or_default() += 1;
    }

    /// Forgets pods no longer Pending on the node (keeps the map small).
    pub fn retain(&mut self, live_uids: &std::collections::HashSet<String>) {
        self.done.retain(|u, _| live_uids.contains(u));
    }
}

/// Env and mounts common to every container on GPU `gpu` (also the CDI spec's edits). With
/// `inject.pod_ledgers` (the default) no ledger is among them: each pod gets its own
/// ([`pod_ledger_mount`]); without, the GPU's ledger directory, shared by every offline pod.
pub fn static_edits(cfg: &AgentConfig, gpu: u32) -> (BTreeMap<String, String>, Vec<pb::Mount>) {
    let inj = &cfg.inject;
    let uuid = cfg.gpu(gpu).map(|g| g.uuid.clone()).unwrap_or_default();
    let ledger_host = cfg.ledger_dir.join(format!("gpu{gpu}"));
    let ledger_ctr = inj.ledger_container_dir.join(format!("gpu{gpu}"));
    let pipe_host = cfg.mps_pipe_host_dir(gpu);
    // A pipe directory inside the ledger directory is where the container sees that directory.
    let pipe_ctr = match pipe_host.strip_prefix(&ledger_host) {
        Ok(rel) => ledger_ctr.join(rel),
        Err(_) => pipe_host.clone(),
    };
    let s = |p: &Path| p.display().to_string();
    let env = BTreeMap::from([
        ("LD_PRELOAD".to_string(), s(&inj.shim_container_path)),
        (
            node_ledger::config::ENV_LEDGER_DIR.to_string(),
            s(&inj.ledger_container_dir),
        ),
        (
            node_ledger::config::ENV_GPU_INDEX.to_string(),
            gpu.to_string(),
        ),
        ("CUDA_MPS_PIPE_DIRECTORY".to_string(), s(&pipe_ctr)),
        ("NVIDIA_VISIBLE_DEVICES".to_string(), uuid.clone()),
        ("CUDA_VISIBLE_DEVICES".to_string(), uuid),
    ]);
    let mut mounts = vec![pb::Mount {
        container_path: s(&inj.shim_container_path),
        host_path: s(&inj.shim_host_path),
        read_only: true,
    }];
    if !inj.pod_ledgers {
        // Read-write: the shim registers its process and reserves memory in the ledger, which
        // every offline pod of the GPU shares.
        mounts.push(pb::Mount {
            container_path: s(&ledger_ctr),
            host_path: s(&ledger_host),
            read_only: false,
        });
    }
    // Read-only: the daemons' status files (health, the monitor's sample and jobs, the SM
    // budget), which every offline process's throttle reads. Not inside a read-write mount: a
    // tenant, root in its container or not, must never write its neighbours' throttle input
    // (`node_ledger::status`).
    mounts.push(pb::Mount {
        container_path: s(&inj.ledger_container_dir.join(node_ledger::config::STATUS_DIR)),
        host_path: s(&cfg.ledger_dir.join(node_ledger::config::STATUS_DIR)),
        read_only: true,
    });
    // The pipe directory: a mount of its own unless the shared ledger directory's mount shows
    // it read-write as configured (a runtime mounts parents first).
    if inj.pod_ledgers || !pipe_host.starts_with(&ledger_host) || inj.mps_pipe_read_only {
        mounts.push(pb::Mount {
            container_path: s(&pipe_ctr),
            host_path: s(&pipe_host),
            read_only: inj.mps_pipe_read_only,
        });
    }
    // The MPS server's /dev/shm as the container's: its clients attach to the shared memory
    // it keeps there, as NVIDIA's device plugin shares the MPS daemon's (the emulator refuses a
    // client with a /dev/shm of its own; an H200's MPS with driver 580 served one: kit `shm`).
    // `inject.mps_shm: "private"` leaves the container the runtime's own, which no other
    // tenant, the online service or the host shares.
    if inj.mps_shm == crate::config::MpsShm::Shared {
        mounts.push(pb::Mount {
            container_path: "/dev/shm".to_string(),
            host_path: s(&cfg.mps_shm_host_dir(gpu)),
            read_only: false,
        });
    }
    (env, mounts)
}

/// Mode of a pod ledger, set explicitly whatever the umask: the pod's processes, of whatever
/// user, write it; it is mounted into that pod's containers alone.
pub const POD_LEDGER_MODE: u32 = 0o666;

/// Creates (or opens, for the pod's next container) pod `pod`'s ledger of GPU `gpu`
/// (`node_ledger::pods`), mode [`POD_LEDGER_MODE`]; returns its host path.
///
/// The pods' directory (`<ledger_dir>/pods`) is made the daemons' alone (0700) first: a pod
/// reaches its ledger through the file mounted into it, and a user of the host must not reach
/// every pod's 0666 ledger through the host's path.
pub fn create_pod_ledger(cfg: &AgentConfig, gpu: u32, pod: node_ledger::PodUid) -> Result<std::path::PathBuf, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let pods = node_ledger::pods::pods_dir(&cfg.ledger_dir);
    std::fs::create_dir_all(&pods).map_err(|e| format!("{}: {e}", pods.display()))?;
    std::fs::set_permissions(&pods, std::fs::Permissions::from_mode(0o700)).map_err(|e| format!("{}: {e}", pods.display()))?;
    let path = node_ledger::pods::pod_ledger_path(&cfg.ledger_dir, pod, gpu);
    let l = node_ledger::Ledger::open_or_create(&path, gpu).map_err(|e| e.to_string())?;
    l.set_access(POD_LEDGER_MODE, None).map_err(|e| e.to_string())?;
    Ok(path)
}

/// The mount of pod `pod`'s ledger of GPU `gpu` (host: [`create_pod_ledger`]'s path) where the
/// shim looks for its GPU's ledger (`<inject.ledger_container_dir>/gpu<N>/ledger`), read-write.
/// The file alone, never its directory: a tenant can write it but neither unlink nor replace it
/// (a mount point is busy), so it cannot hand its next processes a fresh, empty ledger.
pub fn pod_ledger_mount(cfg: &AgentConfig, gpu: u32, pod: node_ledger::PodUid) -> pb::Mount {
    pb::Mount {
        container_path: node_ledger::config::ledger_path(&cfg.inject.ledger_container_dir, gpu).display().to_string(),
        host_path: node_ledger::pods::pod_ledger_path(&cfg.ledger_dir, pod, gpu).display().to_string(),
        read_only: false,
    }
}

/// The env naming the pod's termination file in its containers (read by the shim after a
/// SIGTERM: `node_ledger::termination`).
pub const ENV_TERMINATION_FILE: &str = "XCUDA_TERMINATION_FILE";

/// Where a container sees its pod's termination file: `<inject.ledger_container_dir>/termination`.
pub fn termination_container_path(cfg: &AgentConfig) -> std::path::PathBuf {
    cfg.inject.ledger_container_dir.join(node_ledger::termination::FILE_NAME)
}

/// Creates pod `pod`'s termination file empty (`node_ledger::termination::create`: kept as it
/// is for the pod's next container), in the pod's directory [`create_pod_ledger`] made; returns
/// its host path. node-agent writes the pod's deletion into it when its watch sees it
/// (`crate::offline_pods`).
pub fn create_termination_file(cfg: &AgentConfig, pod: node_ledger::PodUid) -> Result<std::path::PathBuf, String> {
    let path = node_ledger::termination::termination_path(&cfg.ledger_dir, pod);
    node_ledger::termination::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The mount of pod `pod`'s termination file (host: [`create_termination_file`]'s path) at
/// [`termination_container_path`], **read-only**: node-agent alone writes it, and a tenant must
/// not be able to move its own drain (nor can it unlink or replace a mount point).
pub fn termination_mount(cfg: &AgentConfig, pod: node_ledger::PodUid) -> pb::Mount {
    pb::Mount {
        container_path: termination_container_path(cfg).display().to_string(),
        host_path: node_ledger::termination::termination_path(&cfg.ledger_dir, pod).display().to_string(),
        read_only: true,
    }
}

/// Env that depends on the pod's plan.
pub fn plan_env(plan: &PodPlan) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("XCUDA_GROUP".to_string(), group_name(&plan.uid)),
        (
            "XCUDA_QUOTA_BYTES".to_string(),
            plan.memory_quota_bytes.to_string(),
        ),
        (
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
            plan.mps_percent.to_string(),
        ),
    ]);
    if let Some(ms) = plan.kill_grace_ms {
        env.insert("XCUDA_KILL_GRACE_MS".to_string(), ms.to_string());
    }
    env
}

/// CDI device name of GPU `gpu` in this agent's spec (`<resource_name>=gpu<N>`).
pub fn cdi_device_name(cfg: &AgentConfig, gpu: u32) -> String {
    format!("{}=gpu{gpu}", cfg.device_plugin.resource_name)
}

/// The container's response: in CDI mode the static edits come from the CDI spec (named
/// devices) and only the plan's env is returned; otherwise everything inline. With
/// `inject.pod_ledgers`, the pod's ledger of its GPU and its termination file are created here
/// and mounted inline in either mode (a CDI spec is the same for every pod), the file named by
/// `XCUDA_TERMINATION_FILE`. Fails only when either cannot be made: the container is then
/// refused rather than given a shared ledger or a drain that misses a shortened grace.
pub fn container_response(cfg: &AgentConfig, plan: &PodPlan) -> Result<pb::ContainerAllocateResponse, AllocError> {
    let mut envs: HashMap<String, String> = plan_env(plan).into_iter().collect();
    let mut resp = pb::ContainerAllocateResponse::default();
    if cfg.cdi.enabled {
        resp.cdi_devices.push(pb::CdiDevice {
            name: cdi_device_name(cfg, plan.gpu),
        });
        if let (Some(kind), Some(g)) = (&cfg.cdi.gpu_device_kind, cfg.gpu(plan.gpu)) {
            resp.cdi_devices.push(pb::CdiDevice {
                name: format!("{kind}={}", g.uuid),
            });
        }
    } else {
        let (env, mounts) = static_edits(cfg, plan.gpu);
        envs.extend(env);
        resp.mounts = mounts;
    }
    if cfg.inject.pod_ledgers {
        let err = |why: String| AllocError::PodLedger { ns: plan.namespace.clone(), name: plan.name.clone(), gpu: plan.gpu, why };
        let uid = node_ledger::PodUid::parse(&plan.uid).ok_or_else(|| err(format!("the pod's UID `{}` is not a UID", plan.uid)))?;
        create_pod_ledger(cfg, plan.gpu, uid).map_err(err)?;
        // After the status and pipe mounts: a runtime mounts parents first, and the ledger
        // lies beside the pipe directory, under no other mount.
        resp.mounts.push(pod_ledger_mount(cfg, plan.gpu, uid));
        // The pod's termination file, after its ledger (the pod's directory exists then):
        // read-only, directly under the ledger's container directory, which no mount covers
        // with pod ledgers (only the status and GPU directories below it are mounted).
        create_termination_file(cfg, uid)
            .map_err(|why| AllocError::TerminationFile { ns: plan.namespace.clone(), name: plan.name.clone(), why })?;
        let m = termination_mount(cfg, uid);
        envs.insert(ENV_TERMINATION_FILE.to_string(), m.container_path.clone());
        resp.mounts.push(m);
    }
    resp.envs = envs;
    Ok(resp)
}

/// The CDI spec (JSON, CDI 0.6.0) for every served GPU: kind `<resource_name>`, device
/// `gpu<N>` with the static edits.
pub fn cdi_spec(cfg: &AgentConfig) -> serde_json::Value {
    let devices: Vec<_> = cfg
        .gpus
        .iter()
        .map(|g| {
            let (env, mounts) = static_edits(cfg, g.index);
            let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
            let mounts: Vec<_> = mounts
                .iter()
                .map(|m| {
                    let mode = if m.read_only { "ro" } else { "rw" };
                    serde_json::json!({
                        "hostPath": m.host_path,
                        "containerPath": m.container_path,
                        "options": [mode, "nosuid", "nodev", "bind"],
                    })
                })
                .collect();
            serde_json::json!({ "name": format!("gpu{}", g.index), "containerEdits": { "env": env, "mounts": mounts } })
        })
        .collect();
    serde_json::json!({ "cdiVersion": "0.6.0", "kind": cfg.device_plugin.resource_name, "devices": devices })
}

/// Writes the CDI spec atomically as `<spec_dir>/<vendor>-<class>.json`; returns its path.
pub fn write_cdi_spec(cfg: &AgentConfig) -> std::io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(&cfg.cdi.spec_dir)?;
    let path = cfg.cdi.spec_dir.join(format!(
        "{}.json",
        cfg.device_plugin.resource_name.replace('/', "-")
    ));
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(&cdi_spec(cfg)).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AgentConfig {
        let t = r#"{"node_name": "n1", "gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]}"#;
        AgentConfig::from_text(Path::new("c.json"), t, |_| None).unwrap()
    }

    pub(crate) fn pod(
        name: &str,
        uid: &str,
        created: &str,
        gpu: Option<&str>,
        counts: &[i64],
    ) -> Pod {
        let containers: Vec<_> = counts
            .iter()
            .enumerate()
            .map(|(i, n)| {
                serde_json::json!({"name": format!("c{i}"), "image": "x",
                "resources": {"limits": {"xshare.io/offline-gpu": n.to_string()}}})
            })
            .collect();
        let mut ann = serde_json::json!({});
        if let Some(g) = gpu {
            ann = serde_json::json!({ANN_GPU: g, ANN_SM_PERCENT: "35.5", ANN_MEMORY_QUOTA_BYTES: "1073741824"});
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "creationTimestamp": created, "annotations": ann},
            "spec": {"nodeName": "n1", "containers": containers},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    /// The plan carries the kubelet's SIGTERM-to-SIGKILL wait from the pod's spec (the API
    /// server's 30 s when unset; the kubelet's floor of 2 s), and Allocate hands it to the shim.
    #[test]
    fn the_plan_carries_the_pods_kill_grace() {
        let mut p = pod("a", "u1", "2026-01-01T00:00:00Z", Some("0"), &[1]);
        assert_eq!(pod_plan(&p).unwrap().kill_grace_ms, Some(30_000));
        for (spec, ms) in [(120, 120_000), (0, 2000), (-5, 2000)] {
            p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(spec);
            let plan = pod_plan(&p).unwrap();
            assert_eq!(plan.kill_grace_ms, Some(ms), "{spec} s");
            assert_eq!(plan_env(&plan)["XCUDA_KILL_GRACE_MS"], ms.to_string());
        }
        let frozen = crate::plans::FrozenPlan::from_annotations(&p, crate::plans::Source::Watch);
        assert_eq!(frozen.plan().unwrap().kill_grace_ms, Some(2000));
        // A plan frozen before the wait was recorded has none: no drain, never a wrong one.
        let old: crate::plans::FrozenPlan = serde_json::from_value(serde_json::json!({
            "uid": "u1", "namespace": "ml", "name": "a", "gpu": 0, "mps_percent": 36,
            "memory_quota_bytes": 5, "source": "watch", "unix_ms": 1
        }))
        .unwrap();
        let plan = old.plan().unwrap();
        assert_eq!(plan.kill_grace_ms, None);
        assert!(!plan_env(&plan).contains_key("XCUDA_KILL_GRACE_MS"));
    }

    /// Pod ledgers are 0666 (a pod's processes may be of any user); the directory holding
    /// them was made with the umask's 0755, and any user of the host could write every pod's.
    #[test]
    fn pod_ledgers_are_reached_through_a_directory_only_the_daemons_enter() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let cfg = AgentConfig { ledger_dir: d.path().to_owned(), ..cfg() };
        let pod = node_ledger::PodUid::parse("0000000a-0000-4000-8000-00000000000a").unwrap();
        let path = create_pod_ledger(&cfg, 0, pod).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), POD_LEDGER_MODE);
        assert_eq!(mode(&node_ledger::pods::pods_dir(d.path())), 0o700);
    }

    #[test]
    fn picks_the_one_pending_pod_and_each_container_once() {
        let pods = vec![
            pod("old", "u1", "2026-01-01T00:00:00Z", Some("0"), &[1, 1]),
            pod("other", "u3", "2025-01-01T00:00:00Z", Some("1"), &[2]),
        ];
        let mut a = Allocations::default();
        let r = "xshare.io/offline-gpu";
        let take = |a: &mut Allocations| {
            let p = a.pick(&pods, "n1", r, 1, None)?.pod;
            a.record(p.metadata.uid.as_deref().unwrap());
            Ok::<_, AllocError>(p.metadata.name.unwrap())
        };
        assert_eq!(take(&mut a).unwrap(), "old");
        assert_eq!(
            a.pick(&pods, "n1", r, 1, None).unwrap().pod.metadata.name.as_deref(),
            Some("old"),
            "not recorded: same pod"
        );
        assert!(!a.complete(&pods[0], r));
        assert_eq!(take(&mut a).unwrap(), "old");
        assert!(a.complete(&pods[0], r));
        assert!(matches!(take(&mut a), Err(AllocError::NoPod { .. })));
        assert!(matches!(
            Allocations::default().pick(&pods, "other", r, 1, None),
            Err(AllocError::NoPod { .. })
        ));
        assert_eq!(
            Allocations::default().pick(&pods, "n1", r, 2, None).unwrap().pod.metadata.name.as_deref(),
            Some("other"),
            "the one pod asking for 2"
        );
    }

    /// A pod bound here asking for the resource, with no plan of its own (bound by someone
    /// else than the extender, or `spec.nodeName` at creation), Pending beside the pod the
    /// bind lock names: the kubelet may be admitting either, so the container is refused
    /// whatever the lock says, and nobody gets the locked pod's plan. Once the other pod is
    /// gone (its admission failed) the locked pod's container is its own. A pod the kubelet
    /// reports containers of was admitted: no candidate. Fails without the change: the
    /// unplanned pod was no candidate, so its container got the locked pod's plan.
    #[test]
    fn several_pending_pods_that_could_own_a_container_refuse_it_whatever_the_lock() {
        let r = "xshare.io/offline-gpu";
        let lock = |uid: &str| kube_contract::bind_lock::BindLock {
            uid: uid.into(),
            namespace: "ml".into(),
            name: "x".into(),
            since_unix_ms: 1,
        };
        let victim = pod("victim", "u1", "2026-01-01T00:00:05Z", Some("0"), &[1]);
        let intruder = pod("intruder", "u2", "2026-01-01T00:00:00Z", None, &[1]);
        let a = Allocations::default();
        for l in [Some(lock("u1")), Some(lock("u2")), None] {
            let e = a.pick(&[victim.clone(), intruder.clone()], "n1", r, 1, l.as_ref()).unwrap_err();
            assert!(matches!(e, AllocError::Ambiguous { .. }), "{e}");
            assert!(e.to_string().contains("ml/intruder, ml/victim"), "{e}");
        }
        // Two planned pods alike (bound past the lock).
        let other = pod("other", "u3", "2026-01-01T00:00:09Z", Some("1"), &[1]);
        assert!(matches!(a.pick(&[victim.clone(), other], "n1", r, 1, Some(&lock("u1"))), Err(AllocError::Ambiguous { .. })));
        // The intruder's admission failed (no longer Pending): the victim's own.
        let p = a.pick(std::slice::from_ref(&victim), "n1", r, 1, Some(&lock("u1"))).unwrap();
        assert_eq!((p.pod.metadata.name.as_deref(), p.candidates), (Some("victim"), 1));
        // A pod the kubelet already reports containers of is no candidate.
        let mut admitted = intruder.clone();
        admitted.status.as_mut().unwrap().container_statuses =
            Some(vec![serde_json::from_value(serde_json::json!({"name": "c0", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}})).unwrap()]);
        let p = a.pick(&[victim.clone(), admitted], "n1", r, 1, None).unwrap();
        assert_eq!(p.pod.metadata.name.as_deref(), Some("victim"));
        // An unplanned pod alone is picked, and its plan check refuses it (pod_plan).
        let p = a.pick(std::slice::from_ref(&intruder), "n1", r, 1, None).unwrap();
        assert!(matches!(pod_plan(&p.pod), Err(AllocError::BadAnnotation { .. })));
    }

    #[test]
    fn plan_is_read_and_bad_annotations_are_named() {
        let p = pod_plan(&pod("a", "u1", "2026-01-01T00:00:00Z", Some("1"), &[1])).unwrap();
        assert_eq!(
            (p.gpu, p.mps_percent, p.memory_quota_bytes),
            (1, 36, 1 << 30)
        );
        let mut bad = pod("a", "u1", "2026-01-01T00:00:00Z", Some("1"), &[1]);
        bad.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_MEMORY_QUOTA_BYTES.into(), "0".into());
        let e = pod_plan(&bad).unwrap_err().to_string();
        assert!(
            e.contains("ml/a") && e.contains(ANN_MEMORY_QUOTA_BYTES),
            "{e}"
        );
        bad.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(ANN_SM_PERCENT);
        assert!(pod_plan(&bad)
            .unwrap_err()
            .to_string()
            .contains("sm-percent"));
    }

    #[test]
    fn response_inline_and_cdi() {
        let mut c = cfg();
        // The GPU's shared ledger directory (pod ledgers: the next test), its pipe directory
        // read-write as NVIDIA's device plugin mounts it (read-only, the default: below).
        c.inject.pod_ledgers = false;
        c.inject.mps_pipe_read_only = false;
        let plan = PodPlan {
            namespace: "ml".into(),
            name: "a".into(),
            uid: "u1".into(),
            gpu: 1,
            mps_percent: 36,
            memory_quota_bytes: 5,
            kill_grace_ms: Some(45_000),
        };
        let r = container_response(&c, &plan).unwrap();
        assert_eq!(r.envs["CUDA_VISIBLE_DEVICES"], "GPU-b");
        assert_eq!(r.envs["XCUDA_KILL_GRACE_MS"], "45000", "the shim drains the GPU before the kubelet's SIGKILL");
        assert_eq!(
            r.envs["CUDA_MPS_PIPE_DIRECTORY"],
            "/run/xshare/gpu1/mps-pipe"
        );
        assert_eq!(r.envs["XCUDA_GROUP"], "k8s-pod-u1");
        assert_eq!(
            r.mounts.len(),
            4,
            "shim, ledger (the pipe dir inside it), status, the MPS server's /dev/shm: {:?}",
            r.mounts
        );
        let status = r.mounts.iter().find(|m| m.container_path == "/run/xshare/status").expect("the status directory");
        assert!(status.read_only && status.host_path == "/run/xshare/status", "{status:?}");
        assert!(
            r.mounts.iter().filter(|m| !m.read_only).all(|m| !Path::new(&m.container_path).starts_with("/run/xshare/status")
                && !Path::new("/run/xshare/status").starts_with(&m.container_path)),
            "no read-write mount covers the status files: {:?}",
            r.mounts
        );
        assert!(
            r.mounts.iter().any(|m| m.container_path == "/dev/shm" && m.host_path == "/dev/shm/xshare-gpu1" && !m.read_only),
            "mps-manager's default shm_dir of GPU 1 as the container's /dev/shm: {:?}",
            r.mounts
        );
        assert!(r.cdi_devices.is_empty());
        // No pod ledgers, no pod directory: no termination file, mounted or named.
        assert!(!r.envs.contains_key(ENV_TERMINATION_FILE), "{:?}", r.envs);
        assert!(!r.mounts.iter().any(|m| m.container_path.ends_with("/termination")), "{:?}", r.mounts);
        // The pipe directory read-only: a mount of its own over the read-write ledger
        // directory's, after it (parents first).
        c.inject.mps_pipe_read_only = true;
        let r = container_response(&c, &plan).unwrap();
        let at = |p: &str| r.mounts.iter().position(|m| m.container_path == p);
        let pipe = at("/run/xshare/gpu1/mps-pipe").expect("a mount of the pipe directory");
        assert!(r.mounts[pipe].read_only && r.mounts[pipe].host_path == "/run/xshare/gpu1/mps-pipe", "{:?}", r.mounts);
        assert!(at("/run/xshare/gpu1").is_some_and(|l| l < pipe), "the ledger directory first: {:?}", r.mounts);
        c.inject.mps_pipe_read_only = false;
        c.inject.mps_pipe_dir = "/tmp/mps-{gpu}".into();
        let r = container_response(&c, &plan).unwrap();
        assert_eq!(r.envs["CUDA_MPS_PIPE_DIRECTORY"], "/tmp/mps-1");
        assert!(r
            .mounts
            .iter()
            .any(|m| m.host_path == "/tmp/mps-1" && !m.read_only));
        c.inject.mps_shm_dir = "host".into();
        let r = container_response(&c, &plan).unwrap();
        assert!(r.mounts.iter().any(|m| m.container_path == "/dev/shm" && m.host_path == "/dev/shm"));
        c.inject.mps_shm_dir = "/run/mps-shm-{gpu}".into();
        let r = container_response(&c, &plan).unwrap();
        assert!(r.mounts.iter().any(|m| m.container_path == "/dev/shm" && m.host_path == "/run/mps-shm-1"));
        c.cdi.enabled = true;
        c.cdi.gpu_device_kind = Some("nvidia.com/gpu".into());
        let r = container_response(&c, &plan).unwrap();
        let names: Vec<_> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["xshare.io/offline-gpu=gpu1", "nvidia.com/gpu=GPU-b"]
        );
        assert!(r.mounts.is_empty() && !r.envs.contains_key("LD_PRELOAD"));
        assert_eq!(r.envs["XCUDA_QUOTA_BYTES"], "5");
        let spec = cdi_spec(&c);
        assert_eq!(spec["kind"], "xshare.io/offline-gpu");
        assert_eq!(spec["devices"][1]["name"], "gpu1");
        let env = spec["devices"][1]["containerEdits"]["env"]
            .as_array()
            .unwrap();
        assert!(env
            .iter()
            .any(|e| e == "LD_PRELOAD=/usr/local/lib/xshare/libxcuda.so"));
        let mounts = spec["devices"][1]["containerEdits"]["mounts"].as_array().unwrap();
        assert!(
            mounts.iter().any(|m| m["containerPath"] == "/dev/shm" && m["hostPath"] == "/run/mps-shm-1"),
            "the CDI spec mounts the MPS server's /dev/shm too: {mounts:?}"
        );
    }

    /// `inject.mps_shm: "private"`: no `/dev/shm` mount at all, inline or in the CDI spec (the
    /// container keeps the runtime's own); the other mounts are as shared. Fails without the
    /// option: the MPS shm directory was always mounted.
    #[test]
    fn a_private_mps_shm_mounts_no_dev_shm() {
        let d = tempfile::tempdir().unwrap();
        let mut c = cfg();
        c.ledger_dir = d.path().to_owned();
        let plan = PodPlan {
            namespace: "ml".into(),
            name: "a".into(),
            uid: "0000000a-0000-4000-8000-000000000000".into(),
            gpu: 1,
            mps_percent: 36,
            memory_quota_bytes: 5,
            kill_grace_ms: None,
        };
        let shared = container_response(&c, &plan).unwrap();
        assert!(shared.mounts.iter().any(|m| m.container_path == "/dev/shm"), "shared by default: {:?}", shared.mounts);
        c.inject.mps_shm = crate::config::MpsShm::Private;
        let private = container_response(&c, &plan).unwrap();
        assert!(!private.mounts.iter().any(|m| m.container_path == "/dev/shm" || m.host_path.starts_with("/dev/shm")), "{:?}", private.mounts);
        let others = |r: &pb::ContainerAllocateResponse| {
            r.mounts.iter().filter(|m| m.container_path != "/dev/shm").map(|m| (m.container_path.clone(), m.host_path.clone(), m.read_only)).collect::<Vec<_>>()
        };
        assert_eq!(others(&private), others(&shared), "nothing else changes");
        assert_eq!(private.envs, shared.envs);
        c.cdi.enabled = true;
        let spec = cdi_spec(&c);
        let mounts = spec["devices"][1]["containerEdits"]["mounts"].as_array().unwrap();
        assert!(!mounts.iter().any(|m| m["containerPath"] == "/dev/shm"), "{mounts:?}");
    }

    /// With pod ledgers (the default) Allocate makes the pod's own ledger of its GPU and mounts
    /// that file alone where the shim looks for the GPU's ledger, in inline and CDI mode; the
    /// GPU's shared ledger directory is mounted nowhere, the pipe directory read-only; a pod
    /// whose UID is not one is refused. Beside it the pod's termination file, read-only
    /// (`XCUDA_TERMINATION_FILE`); one that cannot be made refuses the container.
    #[test]
    fn each_pod_gets_a_ledger_of_its_own_and_no_shared_one() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let mut c = cfg();
        c.ledger_dir = d.path().to_owned();
        let uid = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
        let plan = PodPlan { namespace: "ml".into(), name: "a".into(), uid: uid.into(), gpu: 1, mps_percent: 36, memory_quota_bytes: 5, kill_grace_ms: None };
        let pod = node_ledger::PodUid::parse(uid).unwrap();
        let host = node_ledger::pods::pod_ledger_path(d.path(), pod, 1);
        let termination_host = node_ledger::termination::termination_path(d.path(), pod);
        for cdi in [false, true] {
            c.cdi.enabled = cdi;
            let r = container_response(&c, &plan).unwrap();
            let m = r.mounts.iter().find(|m| m.container_path == "/run/xshare/gpu1/ledger").expect("the ledger file's mount");
            assert!(!m.read_only && Path::new(&m.host_path) == host, "{m:?}");
            let at = |p: &str| r.mounts.iter().position(|m| m.container_path == p);
            assert!(at("/run/xshare/gpu1/ledger") > at("/run/xshare/gpu1/mps-pipe"), "after the pipe directory's mount: {:?}", r.mounts);
            let gpu_dir = d.path().join("gpu1");
            assert!(!r.mounts.iter().any(|m| Path::new(&m.host_path) == gpu_dir), "{:?}", r.mounts);
            let l = node_ledger::Ledger::open_existing(&host).unwrap();
            assert_eq!((l.gpu_index(), l.access().unwrap().0), (1, POD_LEDGER_MODE));
            // The pod's termination file: made empty beside its ledger, mounted read-only
            // under no read-write mount, named to the shim.
            let t = r.mounts.iter().find(|m| m.container_path == "/run/xshare/termination").expect("the termination file's mount");
            assert!(t.read_only && Path::new(&t.host_path) == termination_host, "{t:?}");
            assert!(
                r.mounts.iter().filter(|m| !m.read_only).all(|m| !Path::new(&t.container_path).starts_with(&m.container_path)),
                "no read-write mount covers the termination file: {:?}",
                r.mounts
            );
            assert_eq!(std::fs::metadata(&termination_host).unwrap().permissions().mode() & 0o777, 0o644);
            assert_eq!(node_ledger::termination::read(&termination_host), Ok(None), "empty: no deletion yet");
            assert_eq!(r.envs[ENV_TERMINATION_FILE], "/run/xshare/termination");
        }
        // The pod's next container keeps what node-agent wrote (a deletion seen meanwhile).
        let seen = node_ledger::termination::Termination { deletion_unix_ms: 1_796_012_345_000, grace_ms: 5000 };
        assert!(node_ledger::termination::write(&termination_host, &seen).unwrap());
        container_response(&c, &plan).unwrap();
        assert_eq!(node_ledger::termination::read(&termination_host), Ok(Some(seen)));
        // A termination file that cannot be made refuses the container, naming the pod and file.
        let other = node_ledger::PodUid::parse("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5c").unwrap();
        std::fs::create_dir_all(node_ledger::termination::termination_path(d.path(), other)).unwrap();
        let e = container_response(&c, &PodPlan { uid: other.to_string(), ..plan.clone() }).unwrap_err();
        assert!(matches!(e, AllocError::TerminationFile { .. }) && e.to_string().contains("ml/a") && e.to_string().contains("termination"), "{e}");
        c.cdi.enabled = false;
        let r = container_response(&c, &plan).unwrap();
        let pipe = r.mounts.iter().find(|m| m.container_path == "/run/xshare/gpu1/mps-pipe").expect("the pipe directory, a mount of its own");
        assert!(pipe.read_only, "read-only by default (a root tenant cannot replace the control socket): {pipe:?}");
        let spec = cdi_spec(&c);
        let mounts = spec["devices"][1]["containerEdits"]["mounts"].as_array().unwrap();
        assert!(!mounts.iter().any(|m| m["hostPath"].as_str().is_some_and(|h| h.ends_with("/gpu1"))), "no shared ledger in the CDI spec: {mounts:?}");
        let bad = PodPlan { uid: "u1".into(), ..plan };
        let e = container_response(&c, &bad).unwrap_err().to_string();
        assert!(e.contains("ml/a") && e.contains("not a UID"), "{e}");
    }
}
