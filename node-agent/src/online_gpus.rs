//! The GPU each online pod on this node holds, as the kubelet assigned it, written on the pod.
//!
//! An online service gets its GPU from a device plugin (NVIDIA's: `nvidia.com/gpu`), which the
//! kubelet picks at admission; nobody can know it when writing the pod. The extender's plan
//! pairs offline jobs with online GPUs by the online pod's `xshare.io/gpu` annotation (the
//! GPU's index on `spec.nodeName`) and leaves a pod without it out ("online pod not bound or
//! without xshare.io/gpu"), so without this module no offline work was ever placed beside an
//! online service outside cells mode. Every `online_gpus.poll_ms` the agent asks the kubelet's
//! PodResources API (`List`) which devices each container got, maps them to this node's GPUs
//! and, for each online pod (`xshare.io/role=online`) on this node whose annotation is missing
//! or says another GPU, writes the index with a JSON merge patch carrying the pod's UID (no
//! storage precondition, but the UID is immutable: a new pod under the same name refuses the
//! patch, `422 Invalid`, and is never given the old one's GPU). The
//! kubelet's assignment is the truth: an annotation that disagrees is corrected, said at WARN.
//! The agent is the one writer of this annotation on online pods (the extender writes it on
//! offline pods, at bind); `deploy/admission-policy.yaml` lets the agent's ServiceAccount change
//! nothing else, and only on pods of its own node.
//!
//! Device IDs are mapped as the NVIDIA device plugin names them: a GPU's UUID (`GPU-...`), a
//! time-sliced replica of it (`GPU-...::N`), or its index (`deviceIDStrategy: index`). A pod
//! holding devices of several GPUs, or one this agent does not serve, gets no annotation (one
//! GPU per online pod is what the plan pairs), said once per pod; a pod holding none keeps
//! whatever its operator wrote, and so does a pod whose name the kubelet lists twice (its
//! answer carries no UID). A patch the API refuses is tried again after 2, 4 … 64 rounds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};

use crate::config::AgentConfig;
use crate::podresources_pb as pb;

/// How long one `List` call to the kubelet may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// The GPU (index) device `id` names among `gpus` (index, UUID), if any.
pub fn device_gpu(id: &str, gpus: &[(u32, String)]) -> Option<u32> {
    // A time-sliced replica: `<UUID>::<replica>`.
    let base = id.split_once("::").map_or(id, |(b, _)| b);
    if let Some((i, _)) = gpus.iter().find(|(_, u)| !u.is_empty() && u == base) {
        return Some(*i);
    }
    let i: u32 = base.parse().ok()?;
    gpus.iter().any(|(g, _)| *g == i).then_some(i)
}

/// The one GPU a pod's containers got as devices of `resources`: `Ok(None)` when they got
/// none; an error when they got several GPUs' devices or one this agent does not serve.
pub fn gpu_of(containers: &[pb::ContainerResources], resources: &[String], gpus: &[(u32, String)]) -> Result<Option<u32>, String> {
    let mut found = BTreeSet::new();
    for c in containers {
        for d in c.devices.iter().filter(|d| resources.contains(&d.resource_name)) {
            for id in &d.device_ids {
                match device_gpu(id, gpus) {
                    Some(i) => {
                        found.insert(i);
                    }
                    None => {
                        return Err(format!(
                            "container {} holds {} device `{id}`, which names none of this agent's GPUs",
                            c.name, d.resource_name
                        ))
                    }
                }
            }
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.first().copied()),
        _ => {
            let list: Vec<String> = found.iter().map(u32::to_string).collect();
            Err(format!("holds GPUs {}: one GPU per online pod is what the plan pairs", list.join(", ")))
        }
    }
}

/// The kubelet's pods and their containers' devices (`List` on `socket`).
pub async fn list(socket: &Path) -> Result<Vec<pb::PodResources>, String> {
    let call = async {
        let ch = crate::plugin::unix_channel(socket.to_owned()).await.map_err(|e| format!("connecting: {e}"))?;
        let mut c = pb::pod_resources_lister_client::PodResourcesListerClient::new(ch);
        c.list(pb::ListPodResourcesRequest {})
            .await
            .map(|r| r.into_inner().pod_resources)
            .map_err(|s| format!("List: {s}"))
    };
    tokio::time::timeout(LIST_TIMEOUT, call)
        .await
        .map_err(|_| format!("{}: no answer in {} s", socket.display(), LIST_TIMEOUT.as_secs()))?
        .map_err(|e| format!("{}: {e}", socket.display()))
}

/// What one round decided for one online pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Its annotation already names its GPU, or it holds none (its operator's value stays), or
    /// the kubelet does not list it (not admitted yet, or gone).
    Keep,
    /// Write this index.
    Write {
        /// The GPU's index, as the kubelet assigned it.
        gpu: u32,
        /// The annotation's value before, if any.
        was: Option<String>,
    },
    /// Its devices name no single GPU of this agent: nothing written.
    Refuse(String),
}

/// The decision for `pod` given the kubelet's entry for it (`None`: not listed).
pub fn decide(pod: &Pod, listed: Option<&pb::PodResources>, resources: &[String], gpus: &[(u32, String)]) -> Decision {
    let Some(listed) = listed else { return Decision::Keep };
    let was = pod.metadata.annotations.as_ref().and_then(|a| a.get(kube_contract::pod::ANN_GPU)).cloned();
    match gpu_of(&listed.containers, resources, gpus) {
        Ok(Some(gpu)) if was.as_deref() == Some(gpu.to_string().as_str()) => Decision::Keep,
        Ok(Some(gpu)) => Decision::Write { gpu, was },
        Ok(None) => Decision::Keep,
        Err(e) => Decision::Refuse(e),
    }
}

/// The worker: one round per [`OnlineGpus::tick`].
pub struct OnlineGpus {
    client: Client,
    node: String,
    socket: PathBuf,
    resources: Vec<String>,
    gpus: Vec<(u32, String)>,
    written: u64,
    errors: u64,
    /// The refusal last said for each pod (by UID): said again only when it changes.
    refused: BTreeMap<String, String>,
    /// Pods (by UID) whose last patches failed: (failures in a row, the round to try again,
    /// the error last said). A patch the API keeps refusing (an old ClusterRole, the admission
    /// policy on a cluster whose tokens name no node) is tried again after 2, 4 … 64 rounds,
    /// and said again only when its error changes.
    failing: BTreeMap<String, (u32, u64, String)>,
    /// Rounds run.
    round: u64,
    /// The last error reaching the kubelet or the API (said again only when it changes).
    last_error: Option<String>,
}

impl OnlineGpus {
    /// The worker for `cfg`'s node and GPUs (their UUIDs as NVML gave them).
    pub fn new(client: Client, cfg: &AgentConfig) -> Self {
        Self {
            client,
            node: cfg.node_name.clone(),
            socket: cfg.online_gpus.pod_resources_socket.clone(),
            resources: cfg.online_gpus.resources.clone(),
            gpus: cfg.gpus.iter().map(|g| (g.index, g.uuid.clone())).collect(),
            written: 0,
            errors: 0,
            refused: BTreeMap::new(),
            failing: BTreeMap::new(),
            round: 0,
            last_error: None,
        }
    }

    fn failed(&mut self, what: String) {
        self.errors += 1;
        if self.last_error.as_ref() != Some(&what) {
            tracing::warn!(error = %what, "online pods' GPUs not written this round");
            self.last_error = Some(what);
        }
    }

    /// One round: the kubelet's devices, this node's online pods, the patches they need.
    pub async fn tick(&mut self) {
        self.round += 1;
        let listed = match list(&self.socket).await {
            Ok(l) => l,
            Err(e) => return self.failed(format!("kubelet PodResources API: {e}")),
        };
        let pods: Api<Pod> = Api::all(self.client.clone());
        // Any resource version (`resourceVersion=0`): served from the API server's watch cache,
        // not a consistent read of every pod from etcd, from every node every few seconds. A
        // stale answer costs at most a patch that changes nothing (the UID guards the pod).
        let lp = ListParams::default()
            .labels(&format!("{}={}", kube_contract::pod::LABEL_ROLE, kube_contract::pod::ROLE_ONLINE))
            .fields(&format!("spec.nodeName={}", self.node))
            .match_any();
        let pods = match pods.list(&lp).await {
            Ok(l) => l.items,
            Err(e) => return self.failed(format!("listing this node's online pods: {e}")),
        };
        self.last_error = None;
        // The kubelet names pods without their UID: a name it lists twice (a pod gone and one
        // of the same name admitted) says nothing certain about either.
        let mut by_name: BTreeMap<(&str, &str), Option<&pb::PodResources>> = BTreeMap::new();
        for p in &listed {
            by_name
                .entry((p.namespace.as_str(), p.name.as_str()))
                .and_modify(|e| *e = None)
                .or_insert(Some(p));
        }
        let mut seen = BTreeSet::new();
        for pod in &pods {
            let (Some(ns), Some(name), Some(uid)) =
                (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref(), pod.metadata.uid.as_deref())
            else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            seen.insert(uid.to_string());
            if self.failing.get(uid).is_some_and(|(_, next, _)| self.round < *next) {
                continue;
            }
            match decide(pod, by_name.get(&(ns, name)).copied().flatten(), &self.resources, &self.gpus) {
                Decision::Keep => {
                    self.refused.remove(uid);
                }
                Decision::Refuse(why) => {
                    if self.refused.get(uid) != Some(&why) {
                        tracing::warn!(pod = %format!("{ns}/{name}"), reason = %why, "online pod's GPU not written: the extender plans nothing beside it");
                        self.refused.insert(uid.to_string(), why);
                    }
                }
                Decision::Write { gpu, was } => {
                    self.refused.remove(uid);
                    let patch = serde_json::json!({"metadata": {"uid": uid,
                        "annotations": {kube_contract::pod::ANN_GPU: gpu.to_string()}}});
                    let pp = PatchParams { field_manager: Some(kube_contract::NODE_AGENT_FIELD_MANAGER.into()), ..Default::default() };
                    let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                    match api.patch(name, &pp, &Patch::Merge(&patch)).await {
                        Ok(_) => {
                            self.failing.remove(uid);
                            self.written += 1;
                            match was {
                                None => tracing::info!(pod = %format!("{ns}/{name}"), gpu, "online pod's GPU written, as the kubelet assigned it"),
                                Some(w) => tracing::warn!(pod = %format!("{ns}/{name}"), gpu, annotation_was = %w, "online pod's xshare.io/gpu named another GPU than the kubelet assigned: corrected"),
                            }
                        }
                        Err(e) => {
                            self.errors += 1;
                            let e = e.to_string();
                            let (n, said) = self.failing.get(uid).map_or((0, None), |(n, _, m)| (*n, Some(m.clone())));
                            let n = n.saturating_add(1);
                            let wait = 1u64 << n.min(6);
                            if said.as_ref() != Some(&e) {
                                tracing::warn!(pod = %format!("{ns}/{name}"), gpu, error = %e, retry_in_rounds = wait, "writing the online pod's GPU failed (check the agent's RBAC `patch` on pods and the admission policy xshare-node-agent-pods)");
                            }
                            self.failing.insert(uid.to_string(), (n, self.round + wait, e));
                        }
                    }
                }
            }
        }
        self.refused.retain(|uid, _| seen.contains(uid));
        self.failing.retain(|uid, _| seen.contains(uid));
    }

    /// Prometheus text: annotations written and failed rounds/patches.
    pub fn metrics(&self) -> String {
        format!(
            "# HELP xshare_node_agent_online_gpu_writes_total Online pods' xshare.io/gpu annotations written from the kubelet's device assignment.\n\
             # TYPE xshare_node_agent_online_gpu_writes_total counter\n\
             xshare_node_agent_online_gpu_writes_total {}\n\
             # HELP xshare_node_agent_online_gpu_errors_total Rounds that could not read the kubelet or the API, and patches that failed.\n\
             # TYPE xshare_node_agent_online_gpu_errors_total counter\n\
             xshare_node_agent_online_gpu_errors_total {}\n",
            self.written, self.errors
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<(u32, String)> {
        vec![(0, "GPU-aaa".into()), (1, "GPU-bbb".into()), (3, "GPU-ddd".into())]
    }

    fn container(name: &str, resource: &str, ids: &[&str]) -> pb::ContainerResources {
        pb::ContainerResources {
            name: name.into(),
            devices: vec![pb::ContainerDevices { resource_name: resource.into(), device_ids: ids.iter().map(|s| s.to_string()).collect() }],
        }
    }

    #[test]
    fn device_ids_map_by_uuid_replica_or_index() {
        let g = gpus();
        assert_eq!(device_gpu("GPU-bbb", &g), Some(1));
        assert_eq!(device_gpu("GPU-ddd::3", &g), Some(3), "a time-sliced replica");
        assert_eq!(device_gpu("3", &g), Some(3), "deviceIDStrategy: index");
        assert_eq!(device_gpu("2", &g), None, "an index this agent does not serve");
        assert_eq!(device_gpu("GPU-zzz", &g), None);
        assert_eq!(device_gpu("", &g), None);
    }

    #[test]
    fn a_pod_gets_its_one_gpu_and_nothing_else() {
        let g = gpus();
        let r = vec!["nvidia.com/gpu".to_string()];
        // Two containers on replicas of one GPU, one more of another resource: GPU 1.
        let cs = vec![
            container("a", "nvidia.com/gpu", &["GPU-bbb::0"]),
            container("b", "nvidia.com/gpu", &["GPU-bbb::1"]),
            container("c", "example.com/fpga", &["fpga-7"]),
        ];
        assert_eq!(gpu_of(&cs, &r, &g), Ok(Some(1)));
        assert_eq!(gpu_of(&[container("c", "example.com/fpga", &["x"])], &r, &g), Ok(None));
        assert!(gpu_of(&[container("a", "nvidia.com/gpu", &["GPU-aaa", "GPU-bbb"])], &r, &g).unwrap_err().contains("GPUs 0, 1"));
        assert!(gpu_of(&[container("a", "nvidia.com/gpu", &["GPU-zzz"])], &r, &g).unwrap_err().contains("GPU-zzz"));
    }

    #[test]
    fn an_annotation_that_disagrees_with_the_kubelet_is_rewritten() {
        let g = gpus();
        let r = vec!["nvidia.com/gpu".to_string()];
        let pod = |ann: Option<&str>| {
            let mut p = Pod::default();
            if let Some(a) = ann {
                p.metadata.annotations = Some([(kube_contract::pod::ANN_GPU.to_string(), a.to_string())].into());
            }
            p
        };
        let listed = pb::PodResources { name: "web".into(), namespace: "prod".into(), containers: vec![container("m", "nvidia.com/gpu", &["GPU-ddd"])] };
        assert_eq!(decide(&pod(None), Some(&listed), &r, &g), Decision::Write { gpu: 3, was: None });
        assert_eq!(decide(&pod(Some("0")), Some(&listed), &r, &g), Decision::Write { gpu: 3, was: Some("0".into()) });
        assert_eq!(decide(&pod(Some("3")), Some(&listed), &r, &g), Decision::Keep);
        assert_eq!(decide(&pod(None), None, &r, &g), Decision::Keep, "not admitted yet");
        let none = pb::PodResources { containers: vec![], ..listed.clone() };
        assert_eq!(decide(&pod(Some("1")), Some(&none), &r, &g), Decision::Keep, "its operator's value stays");
    }
}
