//! Publishes the offline pods bound to this node for the monitors
//! (`<ledger_dir>/offline-pods.json`, `node_daemon::offline_pods`; this agent is its only
//! writer).
//!
//! A container whose GPU work all runs without the shim registers nothing in the ledger, so
//! the monitor cannot tell its processes from the online service's. This agent knows which pods
//! ask for the offline resource; it lists them every `offline_pods.poll_ms` and writes their
//! UIDs whenever the list changes (at its first successful list, and when the file is gone).
//! The monitor then takes an unregistered GPU process whose cgroup names one of them for
//! offline work without the shim and evicts it; its eviction log record names the pod, which
//! `crate::evict` evicts through the API. Pods that finished (`Succeeded`, `Failed`) are left
//! out; pods being deleted stay in until they are gone (their processes still run). A failed
//! list leaves the file as it was: the monitors keep judging by the last list written.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use node_daemon::offline_pods::{OfflinePod, OfflinePods};

/// The offline pods of `pods` (asking for `resource`, not finished).
pub fn offline_pods(pods: &[Pod], resource: &str) -> Vec<OfflinePod> {
    pods.iter()
        .filter(|p| crate::evict::asks_for(p, resource))
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| {
            Some(OfflinePod {
                uid: p.metadata.uid.clone()?,
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
            })
        })
        .collect()
}

/// The publisher's state: the last list written, counters for the metrics.
pub struct Publisher {
    client: Client,
    node: String,
    resource: String,
    path: PathBuf,
    /// The pods of the last list written (sorted), `None` before the first.
    last: Option<Vec<OfflinePod>>,
    /// Lists written.
    pub writes: u64,
    /// Failed pod lists or writes.
    pub errors: u64,
    errors_logged: bool,
}

impl Publisher {
    /// A publisher of node `node`'s pods asking for `resource`, into `ledger_dir`.
    pub fn new(client: Client, node: &str, resource: &str, ledger_dir: &std::path::Path) -> Self {
        Publisher {
            client,
            node: node.to_string(),
            resource: resource.to_string(),
            path: node_daemon::offline_pods::path(ledger_dir),
            last: None,
            writes: 0,
            errors: 0,
            errors_logged: false,
        }
    }

    /// The file written.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// One poll: lists the node's pods and writes the offline ones when they changed. Returns
    /// whether the file was written.
    pub async fn tick(&mut self) -> bool {
        let pods = match crate::kube::pods_on_node(&self.client, &self.node, None).await {
            Ok(p) => p,
            Err(e) => {
                self.failed(&format!("listing pods on this node: {e}"));
                return false;
            }
        };
        let list = OfflinePods::new(&self.node, node_daemon::clock::unix_ms(), offline_pods(&pods, &self.resource));
        // Unchanged and still there (one `stat`): nothing to write. A file removed meanwhile
        // is written again.
        if self.last.as_ref() == Some(&list.pods) && self.path.exists() {
            self.recovered();
            return false;
        }
        if let Err(e) = node_daemon::offline_pods::write(&self.path, &list) {
            self.failed(&format!("writing {}: {e}", self.path.display()));
            return false;
        }
        self.recovered();
        self.writes += 1;
        tracing::info!(path = %self.path.display(), pods = list.pods.len(), "offline pod list written for the monitors");
        self.last = Some(list.pods);
        true
    }

    fn failed(&mut self, e: &str) {
        self.errors += 1;
        if !self.errors_logged {
            self.errors_logged = true;
            tracing::warn!(error = e, path = %self.path.display(), "cannot refresh the offline pod list: the monitors keep the last one written");
        }
    }

    fn recovered(&mut self) {
        if std::mem::take(&mut self.errors_logged) {
            tracing::info!(path = %self.path.display(), "the offline pod list is refreshed again");
        }
    }

    /// Prometheus text: pods in the list in force, lists written, failures.
    pub fn metrics(&self) -> String {
        let pods = self.last.as_ref().map_or(0, Vec::len);
        format!(
            "# HELP xshare_node_agent_offline_pods Offline pods in the list the monitors read\n\
             # TYPE xshare_node_agent_offline_pods gauge\n\
             xshare_node_agent_offline_pods{{node=\"{n}\"}} {pods}\n\
             # HELP xshare_node_agent_offline_pod_list_errors_total Failed refreshes of the offline pod list (pod list or write)\n\
             # TYPE xshare_node_agent_offline_pod_list_errors_total counter\n\
             xshare_node_agent_offline_pod_list_errors_total{{node=\"{n}\"}} {e}\n",
            n = self.node,
            e = self.errors
        )
    }
}
