//! Real-shaped API objects: lists, watch events, `Status` failures, Nodes with the GPU
//! heartbeat annotation, Job-controller pods and online pods, as a real API server writes them.

#![allow(missing_docs)]

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// `metav1.Status` of a successful call.
pub fn success(code: u16) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code})
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

pub fn heartbeat_json(node: &str, updated_unix_ms: u64, states: &[&str]) -> String {
    let gpus: Vec<Value> = states
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"index": i, "uuid": format!("GPU-{node}-{i}"), "state": s, "sm_activity_permille": 300,
                   "memory_used_bytes": 8u64 << 30, "memory_total_bytes": 32u64 << 30,
                   "offline_sm_budget_permille": 600, "model": "Tesla V100-SXM2-32GB"})
        })
        .collect();
    json!({"version": 1, "node": node, "updated_unix_ms": updated_unix_ms, "gpus": gpus}).to_string()
}

pub fn node(name: &str, rv: &str, heartbeat: Option<String>) -> Value {
    let mut annotations = json!({"node.alpha.kubernetes.io/ttl": "0",
                                 "volumes.kubernetes.io/controller-managed-attach-detach": "true"});
    if let Some(hb) = heartbeat {
        annotations[kube_contract::heartbeat::ANNOTATION] = Value::String(hb);
    }
    json!({"kind": "Node", "apiVersion": "v1",
      "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": rv,
                   "creationTimestamp": "2026-11-20T08:00:00Z",
                   "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                              "xshare.io/gpu-type": "V100M32", "xshare.io/predictor-gpu-type": "v100",
                              "nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB"},
                   "annotations": annotations},
      "spec": {"podCIDR": "10.244.1.0/24"},
      "status": {"capacity": {"cpu": "64", "memory": "527927808Ki", "nvidia.com/gpu": "2", "xshare.io/offline-gpu": "2"},
                 "allocatable": {"cpu": "63", "memory": "517000000Ki", "nvidia.com/gpu": "2", "xshare.io/offline-gpu": "2"},
                 "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                 "lastHeartbeatTime": "2026-11-23T06:00:00Z", "lastTransitionTime": "2026-11-20T08:01:00Z"}]}})
}

/// A pod the Job controller made for Job `job` (generated name, its labels, ownerReference).
pub fn job_pod(ns: &str, job: &str, suffix: &str, rv: &str, memory_mib: u64) -> Value {
    let uid = format!("uid-job-{job}");
    json!({"kind": "Pod", "apiVersion": "v1",
      "metadata": {"name": format!("{job}-{suffix}"), "generateName": format!("{job}-"), "namespace": ns,
                   "uid": format!("uid-{job}-{suffix}"), "resourceVersion": rv,
                   "creationTimestamp": "2026-11-23T06:10:00Z",
                   "labels": {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": job,
                              "controller-uid": uid, "job-name": job, "xshare.io/role": "offline"},
                   "annotations": {"xshare.io/memory-mib": memory_mib.to_string(),
                                   "xshare.io/profile": "{\"isolated\": {\"v100\": 4.0}}"},
                   "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid,
                                        "controller": true, "blockOwnerDeletion": true}]},
      "spec": {"restartPolicy": "Never", "schedulerName": "default-scheduler",
               "containers": [{"name": "train", "image": "registry.local/train:1",
                               "resources": {"limits": {"xshare.io/offline-gpu": "1"}, "requests": {"xshare.io/offline-gpu": "1"}}}]},
      "status": {"phase": "Pending", "qosClass": "BestEffort"}})
}

pub fn online_pod(ns: &str, name: &str, rv: &str, node: &str, gpu: u32) -> Value {
    json!({"kind": "Pod", "apiVersion": "v1",
      "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "resourceVersion": rv,
                   "labels": {"app": "svc", "xshare.io/role": "online", "pod-template-hash": "5d8c7b"},
                   "annotations": {"xshare.io/gpu": gpu.to_string(), "xshare.io/memory-mib": "8000",
                                   "xshare.io/sm-activity-percent": "30",
                                   "xshare.io/profile": "{\"isolated\": {\"v100\": 5.0}}"},
                   "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "svc-5d8c7b",
                                        "uid": "uid-rs", "controller": true, "blockOwnerDeletion": true}]},
      "spec": {"nodeName": node, "containers": [{"name": "svc", "image": "registry.local/svc:1",
                                                     "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]},
      "status": {"phase": "Running", "qosClass": "Guaranteed"}})
}

pub fn list(kind: &str, rv: &str, items: Vec<Value>) -> Value {
    // Items of a list carry no kind/apiVersion of their own.
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut i| {
            i.as_object_mut().unwrap().remove("kind");
            i.as_object_mut().unwrap().remove("apiVersion");
            i
        })
        .collect();
    json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items})
}

pub fn event(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

pub fn bookmark(kind: &str, rv: &str) -> Value {
    event(
        "BOOKMARK",
        json!({"kind": kind, "apiVersion": "v1",
                             "metadata": {"resourceVersion": rv, "creationTimestamp": null},
                             "spec": {"containers": null}, "status": {}}),
    )
}

pub fn status(code: u16, reason: &str, message: &str, details: Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "details": details, "code": code})
}

/// The API server's answer to an update or patch that changes `metadata.uid` (say, a merge
/// patch carrying the UID the client read, of a pod replaced since under the same name): a
/// patch carries no storage precondition (the handler's `DefaultUpdatedObjectInfo(nil, …)` has
/// no object to take a UID from), so the patched object reaches validation
/// (`ValidateObjectMetaUpdate`: the UID is immutable) and is refused `422 Invalid`, naming the
/// field. Only a `resourceVersion` in it is a precondition (`409 Conflict`).
pub fn uid_immutable(kind: &str, name: &str, uid: &str) -> Value {
    status(
        422,
        "Invalid",
        &format!("{kind} \"{name}\" is invalid: metadata.uid: Invalid value: \"{uid}\": field is immutable"),
        json!({"name": name, "kind": kind,
               "causes": [{"reason": "FieldValueInvalid", "message": format!("Invalid value: \"{uid}\": field is immutable"), "field": "metadata.uid"}]}),
    )
}

pub fn gone(rv: &str) -> Value {
    status(
        410,
        "Expired",
        &format!("too old resource version: {rv} (4117)"),
        json!({}),
    )
}

