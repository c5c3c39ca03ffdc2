//! Pod labels and annotations: what marks a pod as xshare's, what it needs, and what the
//! extender writes onto an offline pod when it binds it.
//!
//! | key | kind | on | set by | meaning |
//! | --- | --- | --- | --- | --- |
//! | `xshare.io/role` | label | both | user | `online` or `offline`; pods without it are not xshare's |
//! | `xshare.io/offline-job` | label or annotation | offline | user (optional) | the offline job's name |
//! | `batch.kubernetes.io/job-name`, `job-name` | label | offline | Job controller | the job's name when the above is absent |
//! | `xshare.io/tenant` | label | both | user (optional) | tenant / virtual cluster; default: the namespace |
//! | `xshare.io/memory-mib` | annotation | both | user | GPU memory the job needs (offline) or the service uses (online), MiB |
//! | `xshare.io/gpu-types` | annotation | offline | user (optional) | comma-separated GPU types the job may run on |
//! | `xshare.io/profile` | annotation | both | user (optional) | the predictor's JSON job profile |
//! | `xshare.io/sm-activity-percent` | annotation | online | user (optional) | SM activity of the service; default: its GPU's heartbeat |
//! | `xshare.io/gpu` | annotation | both | online: operator/node agent; offline: extender | GPU index on the pod's node |
//! | `xshare.io/sm-percent` | annotation | offline | extender | MPS active-thread percentage the plan chose |
//! | `xshare.io/memory-quota-bytes` | annotation | offline | extender | the shim's GPU memory limit |
//! | `xshare.io/colocated-with` | annotation | offline | extender | the online workload sharing the GPU |
//! | `xshare.io/plan-round` | annotation | offline | extender | the plan round that decided |
//!
//! A pod created by a Job controller is recognized by its labels (`batch.kubernetes.io/job-name`,
//! or the legacy `job-name`) or its controller `ownerReference` of kind `Job`, never by its
//! generated name; see [`job_name`].

use std::collections::BTreeMap;

/// Label that marks a pod as xshare's: value [`ROLE_ONLINE`] or [`ROLE_OFFLINE`].
pub const LABEL_ROLE: &str = "xshare.io/role";
/// [`LABEL_ROLE`] value of a latency-critical service holding a GPU.
pub const ROLE_ONLINE: &str = "online";
/// [`LABEL_ROLE`] value of a best-effort job placed beside an online service.
pub const ROLE_OFFLINE: &str = "offline";
/// Label selector that matches every xshare pod (for list/watch).
pub const ROLE_SELECTOR: &str = "xshare.io/role in (online,offline)";

/// Label or annotation naming the offline job a pod runs.
pub const KEY_OFFLINE_JOB: &str = "xshare.io/offline-job";
/// Label the Job controller puts on its pods (Kubernetes 1.27+).
pub const LABEL_JOB_NAME: &str = "batch.kubernetes.io/job-name";
/// The Job controller's legacy label (still set alongside the new one).
pub const LABEL_JOB_NAME_LEGACY: &str = "job-name";
/// Label: the pod's tenant (virtual cluster); absent = its namespace.
pub const LABEL_TENANT: &str = "xshare.io/tenant";

/// Annotation: GPU memory (MiB) the offline job needs / the online service uses.
pub const ANN_MEMORY_MIB: &str = "xshare.io/memory-mib";
/// Annotation: GPU types an offline job may run on, comma-separated (absent = any).
pub const ANN_GPU_TYPES: &str = "xshare.io/gpu-types";
/// Annotation: the speed predictor's job profile, JSON.
pub const ANN_PROFILE: &str = "xshare.io/profile";
/// Annotation: an online service's SM activity (0-100); absent = its GPU's heartbeat value.
pub const ANN_SM_ACTIVITY_PERCENT: &str = "xshare.io/sm-activity-percent";

/// Annotation: index of the GPU the pod uses on its node (offline: written by the extender
/// at bind from the plan; online: by the operator or node agent).
pub const ANN_GPU: &str = "xshare.io/gpu";
/// Annotation (extender): MPS active-thread percentage the plan chose (e.g. `"35"`).
pub const ANN_SM_PERCENT: &str = "xshare.io/sm-percent";
/// Annotation (extender): GPU memory quota in bytes (the shim's limit).
pub const ANN_MEMORY_QUOTA_BYTES: &str = "xshare.io/memory-quota-bytes";
/// `xshare.io/memory-quota-bytes`'s value as a positive byte count (what node-agent gives the
/// pod's shim, and what the extender charges a running pod's GPU).
pub fn parse_memory_quota(v: &str) -> Option<u64> {
    v.trim().parse::<u64>().ok().filter(|q| *q > 0)
}
/// Annotation (extender): the online workload the pod shares its GPU with.
pub const ANN_COLOCATED_WITH: &str = "xshare.io/colocated-with";
/// Annotation (extender): the plan round that made the decision.
pub const ANN_PLAN_ROUND: &str = "xshare.io/plan-round";

/// Every annotation the extender writes at bind, in the order the device plugin reads them.
pub const PLACEMENT_ANNOTATIONS: [&str; 5] = [
    ANN_GPU,
    ANN_SM_PERCENT,
    ANN_MEMORY_QUOTA_BYTES,
    ANN_COLOCATED_WITH,
    ANN_PLAN_ROUND,
];

/// A pod's xshare role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Latency-critical; its GPU's health is judged by it.
    Online,
    /// Best-effort; throttled or evicted to protect online work.
    Offline,
}

/// The role its labels give a pod; `None` for pods that are not xshare's (no label, or an
/// unknown value).
pub fn role(labels: Option<&BTreeMap<String, String>>) -> Option<Role> {
    match labels?.get(LABEL_ROLE)?.as_str() {
        ROLE_ONLINE => Some(Role::Online),
        ROLE_OFFLINE => Some(Role::Offline),
        _ => None,
    }
}

/// Whether `pod` asks for the extended resource `resource` in any container's or init
/// container's limits or requests. A pod's labels are its owner's to write (the built-in
/// `edit` role): only the resources it asks for bring it a GPU, so an `xshare.io/role` label
/// counts only on a pod that asks for the GPU its role implies (see the extender's plan
/// inputs).
pub fn asks_for(pod: &k8s_openapi::api::core::v1::Pod, resource: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            r.limits.as_ref().is_some_and(|m| m.contains_key(resource))
                || r.requests.as_ref().is_some_and(|m| m.contains_key(resource))
        })
    })
}

/// Whether `e` is the API server refusing a patch that carried a pod's `metadata.uid` because
/// the pod of that name has another UID now (replaced since it was read): the UID is immutable,
/// so validation answers `422 Invalid` naming the field `metadata.uid`. (A patch carries no
/// storage precondition: unlike a Binding's, an Eviction's or a deletion's UID precondition,
/// this is not a `409 Conflict`.)
pub fn uid_change_refused(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) if s.code == 422 => {
            s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
                || s.message.contains("metadata.uid")
        }
        _ => false,
    }
}

/// The fields of a pod's `ownerReference` that [`job_name`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner<'a> {
    /// `apiVersion` (`batch/v1`, ...).
    pub api_version: &'a str,
    /// `kind` (`Job`, ...).
    pub kind: &'a str,
    /// The owner's `metadata.name`.
    pub name: &'a str,
    /// `controller: true`.
    pub controller: bool,
}

/// The offline job a pod runs, in order: the `xshare.io/offline-job` label, the same
/// annotation, the Job controller's `batch.kubernetes.io/job-name` label, its legacy
/// `job-name` label, the controller `ownerReference` of kind `Job` (`batch/*`); else the pod's
/// own name (a bare pod is its own job). A Job's pods never fall through to their generated
/// names.
pub fn job_name(
    pod_name: &str,
    labels: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
    owners: &[Owner<'_>],
) -> String {
    let nonempty = |v: Option<&String>| v.filter(|s| !s.is_empty()).cloned();
    nonempty(labels.and_then(|l| l.get(KEY_OFFLINE_JOB)))
        .or_else(|| nonempty(annotations.and_then(|a| a.get(KEY_OFFLINE_JOB))))
        .or_else(|| nonempty(labels.and_then(|l| l.get(LABEL_JOB_NAME))))
        .or_else(|| nonempty(labels.and_then(|l| l.get(LABEL_JOB_NAME_LEGACY))))
        .or_else(|| {
            owners
                .iter()
                .find(|o| o.controller && o.kind == "Job" && o.api_version.starts_with("batch/") && !o.name.is_empty())
                .map(|o| o.name.to_string())
        })
        .unwrap_or_else(|| pod_name.to_string())
}

/// The tenant of a pod: its `xshare.io/tenant` label, else its namespace.
pub fn tenant(labels: Option<&BTreeMap<String, String>>, namespace: &str) -> String {
    labels
        .and_then(|l| l.get(LABEL_TENANT))
        .filter(|t| !t.is_empty())
        .cloned()
        .unwrap_or_else(|| namespace.to_string())
}

/// The GPU types of [`ANN_GPU_TYPES`] (trimmed, empties dropped).
pub fn gpu_types(annotations: Option<&BTreeMap<String, String>>) -> Vec<String> {
    annotations
        .and_then(|a| a.get(ANN_GPU_TYPES))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn roles() {
        assert_eq!(role(Some(&map(&[(LABEL_ROLE, "offline")]))), Some(Role::Offline));
        assert_eq!(role(Some(&map(&[(LABEL_ROLE, "online")]))), Some(Role::Online));
        assert_eq!(role(Some(&map(&[(LABEL_ROLE, "Offline")]))), None);
        assert_eq!(role(Some(&map(&[("app", "x")]))), None);
        assert_eq!(role(None), None);
    }

    #[test]
    fn job_pods_are_named_by_their_job_not_their_generated_name() {
        let job = Owner {
            api_version: "batch/v1",
            kind: "Job",
            name: "train-resnet",
            controller: true,
        };
        // Labels the Job controller sets.
        let l = map(&[
            (LABEL_JOB_NAME, "train-resnet"),
            (LABEL_JOB_NAME_LEGACY, "train-resnet"),
        ]);
        assert_eq!(job_name("train-resnet-x7k2p", Some(&l), None, &[job]), "train-resnet");
        // Legacy label only.
        let l = map(&[(LABEL_JOB_NAME_LEGACY, "train-resnet")]);
        assert_eq!(job_name("train-resnet-x7k2p", Some(&l), None, &[]), "train-resnet");
        // Owner reference only.
        assert_eq!(job_name("train-resnet-x7k2p", None, None, &[job]), "train-resnet");
        // Not the controller, or not a Job: the pod is its own job.
        let rs = Owner {
            api_version: "apps/v1",
            kind: "ReplicaSet",
            name: "web-5d8",
            controller: true,
        };
        assert_eq!(
            job_name(
                "p",
                None,
                None,
                &[
                    Owner {
                        controller: false,
                        ..job
                    },
                    rs
                ]
            ),
            "p"
        );
        // The explicit key wins, label before annotation.
        let l = map(&[(KEY_OFFLINE_JOB, "a"), (LABEL_JOB_NAME, "b")]);
        let a = map(&[(KEY_OFFLINE_JOB, "c")]);
        assert_eq!(job_name("p", Some(&l), Some(&a), &[job]), "a");
        assert_eq!(job_name("p", None, Some(&a), &[job]), "c");
        assert_eq!(job_name("bare", None, None, &[]), "bare");
    }

    #[test]
    fn tenant_and_gpu_types() {
        assert_eq!(tenant(None, "ns"), "ns");
        assert_eq!(tenant(Some(&map(&[(LABEL_TENANT, "vc1")])), "ns"), "vc1");
        assert_eq!(
            gpu_types(Some(&map(&[(ANN_GPU_TYPES, " V100M32, T4,,")]))),
            vec!["V100M32", "T4"]
        );
        assert!(gpu_types(None).is_empty());
    }
}
