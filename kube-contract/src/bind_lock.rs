//! The bind lock: at most one offline pod per node between the extender's bind and the node
//! agent's Allocate.
//!
//! # Why
//!
//! The kubelet tells a device plugin only device IDs, never the pod. The node agent's
//! Allocate therefore takes the container for a Pending pod bound to its node that carries the
//! plan's decision (as HAMi does). With two such pods Pending at once it must guess, oldest
//! first, and the kubelet may admit them in the other order (the scheduler's binds run
//! concurrently; the kubelet sees pods in the order their binds land): each container then
//! runs with the other pod's GPU, SM share, quota and quota group. The monitor would evict
//! both as `foreign_group`, loudly, but the jobs are lost.
//!
//! # Protocol
//!
//! A Node annotation [`ANNOTATION`] holds a [`BindLock`] as JSON: the pod (namespace, name,
//! UID) whose bind holds the node, and since when.
//!
//! 1. **Take (extender, at bind).** Read the Node; if a lock of another pod is there and not
//!    [stale](BindLock::is_expired), refuse the bind (kube-scheduler retries the pod with
//!    backoff). Else write the lock with a JSON merge patch carrying the Node's
//!    `metadata.resourceVersion` ([`take_patch`]): the API server applies it only if the Node
//!    did not change since it was read (`409 Conflict` otherwise), so two extenders (or two
//!    binds) cannot both take it. Then write the plan onto the pod and post its Binding.
//! 2. **Give back (extender).** A bind that fails after taking the lock gives it back at once.
//! 3. **Give back (node agent, at Allocate).** Allocate takes the pod the lock names when it
//!    is a candidate (no guessing), and gives the lock back once that pod's last container is
//!    allocated, or when its Allocate fails (its admission fails with it). Give-back reads the
//!    Node and removes the annotation only if it still names that pod's UID, again with the
//!    read `resourceVersion` as precondition ([`release_patch`]).
//! 4. **Stale locks.** A lock older than the extender's TTL (default [`DEFAULT_TTL`]) is taken
//!    over: its holder's Allocate never came (the kubelet is down, the pod was deleted before
//!    admission) or its give-back was lost. The extender also takes over a lock whose pod is
//!    gone, replaced (other UID), bound to another node, no longer Pending, or started by the
//!    kubelet (`status.startTime`: admitted, so past Allocate), or bound to no node while the
//!    lock is older than twice the extender's bind deadline (the bind that took it ended
//!    without a Binding; a bind cut short by its deadline gives its lock back in the
//!    background). A lock it cannot parse is taken over, with a warning: nothing else writes
//!    the key.
//!
//! Two writers share this one key by design (a lock has a taker and a giver); both write it
//! only through this module's patches, and every write is conditional on what was read.
//!
//! Cost: offline binds to one node are serialised by the time from bind to Allocate (the
//! kubelet's admission: usually well under a second). Binds to other nodes are not affected.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The Node annotation that holds the lock.
pub const ANNOTATION: &str = "xshare.io/bind-lock";

/// How long a lock holds by default before another bind may take it over, seconds' worth:
/// the kubelet admits a bound pod within seconds, image pulls come after Allocate.
pub const DEFAULT_TTL: Duration = Duration::from_secs(120);

/// Largest lock value accepted (namespace and name are each at most 253 bytes).
const MAX_VALUE_BYTES: usize = 1024;

/// Who holds a node's bind lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindLock {
    /// The pod's UID.
    pub uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// When the extender took the lock, ms since the Unix epoch (its clock).
    pub since_unix_ms: u64,
}

impl BindLock {
    /// Parses an annotation value.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_VALUE_BYTES {
            return Err(format!("`{ANNOTATION}` is {} bytes (at most {MAX_VALUE_BYTES})", text.len()));
        }
        let l: BindLock = serde_json::from_str(text).map_err(|e| format!("`{ANNOTATION}` is not a bind lock: {e}"))?;
        if l.uid.is_empty() {
            return Err(format!("`{ANNOTATION}` names no pod UID"));
        }
        Ok(l)
    }

    /// The annotation value.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a struct of strings and integers serialises")
    }

    /// The lock on `node`, if its annotations hold one (`Err`: a value that does not parse).
    pub fn of_node(node: &k8s_openapi::api::core::v1::Node) -> Option<Result<Self, String>> {
        let v = node.metadata.annotations.as_ref()?.get(ANNOTATION)?;
        Some(Self::parse(v))
    }

    /// `namespace/name` of the holder.
    pub fn pod(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the lock is older than `ttl` at `now_unix_ms`. A lock dated in the future (the
    /// taker's clock ahead of ours) holds until `ttl` past its date: never longer than one TTL
    /// after the taker's own view.
    pub fn is_expired(&self, now_unix_ms: u64, ttl: Duration) -> bool {
        now_unix_ms.saturating_sub(self.since_unix_ms) > ttl.as_millis() as u64
    }
}

/// The JSON merge patch that sets `lock` on a Node read at `resource_version` (the API server
/// refuses it with `409 Conflict` if the Node changed since).
pub fn take_patch(lock: &BindLock, resource_version: &str) -> serde_json::Value {
    serde_json::json!({ "metadata": {
        "resourceVersion": resource_version,
        "annotations": { ANNOTATION: lock.encode() },
    } })
}

/// The JSON merge patch that removes the lock from a Node read at `resource_version`.
pub fn release_patch(resource_version: &str) -> serde_json::Value {
    serde_json::json!({ "metadata": {
        "resourceVersion": resource_version,
        "annotations": { ANNOTATION: null },
    } })
}

/// Attempts at a conditional write before giving up: each `409 Conflict` means the Node
/// changed between read and write (a heartbeat, another bind), and is read again.
pub const WRITE_ATTEMPTS: usize = 4;

/// Gives back the lock on `node` if it still names pod `uid` (the node agent after Allocate,
/// the extender after a failed bind): reads the Node and removes the annotation with the read
/// `resourceVersion` as precondition, reading again on `409 Conflict`. Returns whether a lock
/// of `uid` was removed (`false`: none there, or another pod's).
pub async fn release(client: &kube::Client, node: &str, uid: &str, field_manager: &str) -> Result<bool, kube::Error> {
    use kube::api::{Patch, PatchParams};
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let mut last = None;
    for _ in 0..WRITE_ATTEMPTS {
        let n = nodes.get(node).await?;
        match BindLock::of_node(&n) {
            Some(Ok(l)) if l.uid == uid => {}
            _ => return Ok(false),
        }
        let rv = n.metadata.resource_version.clone().unwrap_or_default();
        let pp = PatchParams { field_manager: Some(field_manager.into()), ..Default::default() };
        match nodes.patch(node, &pp, &Patch::Merge(&release_patch(&rv))).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => last = Some(kube::Error::Api(s)),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("every attempt ended in a conflict"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> BindLock {
        BindLock { uid: "6f1c2a0e-3f7b-4a51-9c1e-0d2b7e4c0013".into(), namespace: "ml".into(), name: "train-0".into(), since_unix_ms: 1_000_000 }
    }

    #[test]
    fn a_lock_round_trips_and_hostile_values_are_refused() {
        let l = lock();
        assert_eq!(BindLock::parse(&l.encode()).unwrap(), l);
        assert!(BindLock::parse("").is_err());
        assert!(BindLock::parse("{\"uid\":\"\",\"namespace\":\"a\",\"name\":\"b\",\"since_unix_ms\":1}").unwrap_err().contains("UID"));
        assert!(BindLock::parse("{\"uid\":\"u\",\"namespace\":\"a\",\"name\":\"b\",\"since_unix_ms\":-1}").is_err());
        let extra = l.encode().replace('}', ",\"x\":1}");
        assert!(BindLock::parse(&extra).is_err(), "unknown fields are refused: nothing else writes the key");
        let big = format!("{{\"uid\":\"{}\",\"namespace\":\"a\",\"name\":\"b\",\"since_unix_ms\":1}}", "u".repeat(2000));
        assert!(BindLock::parse(&big).unwrap_err().contains("bytes"));
    }

    #[test]
    fn a_lock_expires_after_its_ttl_and_a_future_date_holds_one_ttl_past_it() {
        let l = lock();
        let ttl = Duration::from_secs(120);
        assert!(!l.is_expired(l.since_unix_ms, ttl));
        assert!(!l.is_expired(l.since_unix_ms + 120_000, ttl));
        assert!(l.is_expired(l.since_unix_ms + 120_001, ttl));
        // The taker's clock ahead of ours: held, never expired by the difference.
        assert!(!l.is_expired(l.since_unix_ms - 50_000, ttl));
    }

    #[test]
    fn the_patches_carry_the_read_resource_version_and_set_or_remove_only_the_lock() {
        let l = lock();
        let p = take_patch(&l, "4811");
        assert_eq!(p["metadata"]["resourceVersion"], "4811");
        assert_eq!(BindLock::parse(p["metadata"]["annotations"][ANNOTATION].as_str().unwrap()).unwrap(), l);
        assert_eq!(p["metadata"]["annotations"].as_object().unwrap().len(), 1);
        let r = release_patch("4812");
        assert_eq!(r["metadata"]["resourceVersion"], "4812");
        assert!(r["metadata"]["annotations"][ANNOTATION].is_null());
        // A Node carrying it.
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "annotations": {ANNOTATION: l.encode()}}})).unwrap();
        assert_eq!(BindLock::of_node(&node).unwrap().unwrap(), l);
        let bare: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).unwrap();
        assert!(BindLock::of_node(&bare).is_none());
    }
}
