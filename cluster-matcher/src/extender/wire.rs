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
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none", default)]
    pub nodes: Option<List<Node>>,
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none", default)]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// One entry of the prioritize reply (`HostPriorityList`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}

/// Body of the bind call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    #[serde(rename = "PodName")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "Node")]
    pub node: String,
}

/// Reply to the bind call; an empty `Error` means success.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    #[serde(rename = "Error")]
    pub error: String,
}
