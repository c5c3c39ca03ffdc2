//! The API client (kube-rs over k8s-openapi types) and the few reads the agent makes.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, Config};

use crate::config::KubeConfig;

/// In-cluster service account (else kubeconfig), or `api_url` when set (tests, kubectl proxy).
/// Every read waits at most `timeout_ms`.
pub async fn client(cfg: &KubeConfig) -> Result<Client, String> {
    build(cfg, Duration::from_millis(cfg.timeout_ms)).await
}

/// The same client for watches: a watch request stays open up to `watch_timeout_s` with no
/// byte read while nothing changes (bookmarks aside), so reads may idle that long and 30 s more
/// before the connection counts as dead.
pub async fn watch_client(cfg: &KubeConfig, watch_timeout_s: u32) -> Result<Client, String> {
    build(cfg, Duration::from_secs(u64::from(watch_timeout_s) + 30)).await
}

async fn build(cfg: &KubeConfig, read_timeout: Duration) -> Result<Client, String> {
    let mut config = if cfg.api_url.is_empty() {
        Config::infer()
            .await
            .map_err(|e| format!("no in-cluster config and no usable kubeconfig: {e}"))?
    } else {
        let uri = cfg
            .api_url
            .parse()
            .map_err(|e| format!("kube.api_url `{}`: {e}", cfg.api_url))?;
        Config::new(uri)
    };
    let t = Duration::from_millis(cfg.timeout_ms);
    config.read_timeout = Some(read_timeout);
    config.connect_timeout = Some(t);
    config.write_timeout = Some(t);
    // Our loops retry themselves (eviction backoff, next heartbeat); a retry inside the client
    // would only delay the local decision.
    config.default_retry = false;
    Client::try_from(config).map_err(|e| format!("cannot build the Kubernetes client: {e}"))
}

/// The pods bound to `node` in `phase` (all phases when `None`), from the API server.
pub async fn pods_on_node(
    client: &Client,
    node: &str,
    phase: Option<&str>,
) -> Result<Vec<Pod>, kube::Error> {
    let mut fields = format!("spec.nodeName={node}");
    if let Some(p) = phase {
        fields.push_str(&format!(",status.phase={p}"));
    }
    let pods: Api<Pod> = Api::all(client.clone());
    Ok(pods
        .list(&ListParams::default().fields(&fields))
        .await?
        .items)
}

/// The bind lock on `node` (`kube_contract::bind_lock`): the pod the extender let through to
/// Allocate. `Ok(None)`: none there, or a value that does not parse (logged).
pub async fn bind_lock(client: &Client, node: &str) -> Result<Option<kube_contract::bind_lock::BindLock>, kube::Error> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let n = nodes.get(node).await?;
    Ok(match kube_contract::bind_lock::BindLock::of_node(&n) {
        Some(Ok(l)) => Some(l),
        Some(Err(e)) => {
            tracing::warn!(node, error = %e, "ignoring a bind lock that does not parse");
            None
        }
        None => None,
    })
}
