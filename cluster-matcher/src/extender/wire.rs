//! The scheduler-extender message types, keyed exactly as kube-scheduler's Go structs encode.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::List;
use serde::{Deserialize, Serialize};

/// `MaxExtenderPriority` in kube-scheduler.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// Body of the filter and prioritize calls.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod kube-scheduler is placing.
    #[serde(rename = "Pod")]
    pub pod: Pod,
    /// Filled when the extender is not `nodeCacheCapable`.
    #[serde(rename = "Nodes", default)]
    pub nodes: Option<List<Node>>,
    /// Filled when the extender is `nodeCacheCapable`.
    #[serde(rename = "NodeNames", default)]
    pub node_names: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// Candidate node names, from whichever form was sent.
    pub fn node_names(&self) -> Vec<String> {
        match (&self.node_names, &self.nodes) {
            (Some(n), _) => n.clone(),
            (None, Some(list)) => list.items.iter().filter_map(|n| n.metadata.name.clone()).collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// Reply to the filter call.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// Nodes that pass, when the extender is not `nodeCacheCapable`.
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none", default)]
    pub nodes: Option<List<Node>>,
    /// Names of the nodes that pass, when the extender is `nodeCacheCapable`.
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none", default)]
    pub node_names: Option<Vec<String>>,
    /// Node name to reason, for nodes refused but worth retrying (preemption may help).
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Node name to reason, for nodes refused that preemption cannot fix.
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Non-empty when the whole call failed; kube-scheduler then ignores the node lists.
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// One entry of the prioritize reply (`HostPriorityList`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// Score from 0 to [`MAX_EXTENDER_PRIORITY`]; higher is preferred.
    #[serde(rename = "Score")]
    pub score: i64,
}

/// Body of the bind call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// Name of the pod to bind.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// Namespace of the pod to bind.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// UID of the pod, checked so a recreated pod of the same name is not bound by mistake.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// Node kube-scheduler chose for the pod.
    #[serde(rename = "Node")]
    pub node: String,
}

/// Reply to the bind call; an empty `Error` means success.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Empty on success, else why the bind failed (kube-scheduler retries the pod).
    #[serde(rename = "Error")]
    pub error: String,
}
