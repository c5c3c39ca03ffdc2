//! A node-pressure eviction the kubelet began, carried from its Event to the pod's node agent.
//!
//! # Why
//!
//! The kubelet's eviction manager kills a pod by its own decision: no deletion comes first
//! (nothing in `metadata`), and its status manager holds the pod's new status (phase `Failed`,
//! reason `Evicted`, the `DisruptionTarget` condition) back until every container ended. The
//! only word of it that comes before the kill is the `Evicted` Event it records just before
//! (`source` `{component: kubelet, host: <node>}`). Offline pods (BestEffort) are its first
//! candidates, and an offline process killed with kernels in flight under MPS can take the
//! online clients of its server down; its shim drains the GPU first when it knows the kill is
//! coming.
//!
//! # Who does what
//!
//! - The cluster side (`cluster-matcher serve --watch`) watches those Events once for the
//!   whole cluster ([`EVENTS_FIELD_SELECTOR`], every namespace: the API server keeps no watch
//!   cache of events by default, so one watch, not one per node) and writes the eviction onto
//!   the offline pod as the annotation [`ANNOTATION`] ([`KubeletEviction::render`]), once.
//! - The node agent, whose watch of its node's pods sees it at once, writes it into the pod's
//!   termination file with the grace its node's kubelet gives (`node_ledger::termination`).
//!
//! Only the extender may set the annotation (`deploy/admission-policy.yaml`), so a tenant
//! cannot freeze another's job with it.

use k8s_openapi::api::core::v1::Event;
use serde::{Deserialize, Serialize};

/// The pod annotation carrying the eviction ([`KubeletEviction`] as JSON).
pub const ANNOTATION: &str = "xshare.io/kubelet-eviction";

/// The field selector of the watch of the kubelet's pod evictions (core/v1 Events; `source` is
/// the reporting component).
pub const EVENTS_FIELD_SELECTOR: &str = "involvedObject.kind=Pod,reason=Evicted,source=kubelet";

/// How the kubelet's eviction message for node pressure begins (`nodeLowMessageFmt`); its
/// evictions over a storage limit say otherwise.
const NODE_PRESSURE_MESSAGE: &str = "The node was low on resource:";

/// An eviction the kubelet of `node` began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeletEviction {
    /// The evicted pod's UID (a pod of the same name made later is another pod).
    pub uid: String,
    /// The node whose kubelet evicts the pod.
    pub node: String,
    /// When it recorded the eviction (the Event's `eventTime`, else `firstTimestamp`, to the
    /// second: never later than it was), ms since the epoch, on that kubelet's clock.
    pub since_unix_ms: u64,
    /// For node pressure (its grace: the kubelet's `evictionMaxPodGracePeriod` or, past a hard
    /// threshold, at once), not over a storage limit (always at once).
    pub node_pressure: bool,
}

/// The pod an eviction Event names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictedPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

impl KubeletEviction {
    /// The eviction `e` tells, with its pod, if it is a kubelet's `Evicted` Event of a pod
    /// (reported by `kubelet`, dated). Anything else is `None`.
    pub fn from_event(e: &Event) -> Option<(EvictedPod, KubeletEviction)> {
        if e.reason.as_deref() != Some("Evicted") {
            return None;
        }
        let source = e.source.as_ref();
        let component = source.and_then(|s| s.component.as_deref()).filter(|c| !c.is_empty()).or(e.reporting_component.as_deref());
        let host = source.and_then(|s| s.host.as_deref()).filter(|h| !h.is_empty()).or(e.reporting_instance.as_deref());
        let o = &e.involved_object;
        if component != Some("kubelet") || o.kind.as_deref() != Some("Pod") {
            return None;
        }
        let ms = |t: i64| u64::try_from(t).unwrap_or(0);
        let since_unix_ms = e
            .event_time
            .as_ref()
            .map(|t| ms(t.0.as_millisecond()))
            .or_else(|| e.first_timestamp.as_ref().map(|t| ms(t.0.as_millisecond())))?;
        let pod = EvictedPod { namespace: o.namespace.clone()?, name: o.name.clone()?, uid: o.uid.clone()? };
        let eviction = KubeletEviction {
            uid: pod.uid.clone(),
            node: host?.to_string(),
            since_unix_ms,
            node_pressure: e.message.as_deref().is_some_and(|m| m.starts_with(NODE_PRESSURE_MESSAGE)),
        };
        Some((pod, eviction))
    }

    /// The annotation's value.
    pub fn render(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses the annotation's value, strictly.
    pub fn parse(v: &str) -> Result<KubeletEviction, String> {
        serde_json::from_str(v).map_err(|e| format!("`{}` is not a kubelet eviction: {e}", ANNOTATION))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-30T10:00:05Z, ms since the epoch.
    const AT_05_MS: u64 = 1_796_032_805_000;

    /// The `Evicted` Event the kubelet of `host` records just before it kills pod `ml/train-0`,
    /// as its legacy recorder sends it.
    fn eviction_event(host: &str, message: &str) -> Event {
        serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "train-0.187c4e2a9b1f0d3e", "namespace": "ml", "resourceVersion": "90211",
                "creationTimestamp": "2026-11-30T10:00:05Z"},
            "involvedObject": {"kind": "Pod", "namespace": "ml", "name": "train-0", "uid": "0000000a-0000-4000-8000-000000000000",
                "apiVersion": "v1", "resourceVersion": "4711"},
            "reason": "Evicted", "message": message, "source": {"component": "kubelet", "host": host},
            "firstTimestamp": "2026-11-30T10:00:05Z", "lastTimestamp": "2026-11-30T10:00:05Z", "count": 1, "type": "Warning",
            "eventTime": null, "reportingComponent": "kubelet", "reportingInstance": host}))
        .unwrap()
    }

    const PRESSURE: &str = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 92Mi. Container c was using 7Gi, request is 0, has larger consumption of memory. ";

    /// Read off the kubelet's Event: the pod, the node, the time, node pressure told from a
    /// storage limit; another component's, reason's or kind's Event, or one with no time, is
    /// none. The annotation round-trips and is parsed strictly.
    #[test]
    fn the_kubelets_eviction_is_read_off_its_event_and_round_trips() {
        let (pod, ev) = KubeletEviction::from_event(&eviction_event("n1", PRESSURE)).unwrap();
        assert_eq!(pod, EvictedPod { namespace: "ml".into(), name: "train-0".into(), uid: "0000000a-0000-4000-8000-000000000000".into() });
        assert_eq!(ev, KubeletEviction { uid: pod.uid.clone(), node: "n1".into(), since_unix_ms: AT_05_MS, node_pressure: true });
        let storage = eviction_event("n1", "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ");
        assert!(!KubeletEviction::from_event(&storage).unwrap().1.node_pressure);
        let mut other = eviction_event("n1", PRESSURE);
        other.source.as_mut().unwrap().component = Some("taint-eviction-controller".into());
        other.reporting_component = Some("taint-eviction-controller".into());
        assert_eq!(KubeletEviction::from_event(&other), None);
        let mut killing = eviction_event("n1", PRESSURE);
        killing.reason = Some("Killing".into());
        assert_eq!(KubeletEviction::from_event(&killing), None);
        let mut node = eviction_event("n1", PRESSURE);
        node.involved_object.kind = Some("Node".into());
        assert_eq!(KubeletEviction::from_event(&node), None);
        // events.k8s.io-style: no `source`, the reporter and a micro-time.
        let mut new_style = eviction_event("n1", PRESSURE);
        new_style.source = None;
        new_style.first_timestamp = None;
        new_style.event_time = Some(serde_json::from_value(serde_json::json!("2026-11-30T10:00:05.250000Z")).unwrap());
        assert_eq!(KubeletEviction::from_event(&new_style).unwrap().1.since_unix_ms, AT_05_MS + 250);
        new_style.event_time = None;
        assert_eq!(KubeletEviction::from_event(&new_style), None, "no time: nothing to time a kill by");
        assert_eq!(KubeletEviction::parse(&ev.render()), Ok(ev.clone()));
        assert!(KubeletEviction::parse(r#"{"uid":"u1","node":"n1","since_unix_ms":1,"node_pressure":true,"grace_ms":9}"#).is_err());
        assert!(KubeletEviction::parse(r#"{"node":"n1","since_unix_ms":1,"node_pressure":true}"#).is_err(), "no UID");
        assert!(KubeletEviction::parse("1796032805000").is_err());
    }
}
