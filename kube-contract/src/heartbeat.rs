//! The per-node GPU heartbeat: the node agent publishes each GPU's health state, load and
//! offline budget as JSON in the Node annotation [`ANNOTATION`]; the cluster side reads it
//! from its Node watch and treats a GPU whose heartbeat is missing, invalid, stale or dated
//! in the future as not Healthy.
//!
//! ```json
//! { "version": 1, "node": "gpu-node-7", "updated_unix_ms": 1763890000000,
//!   "gpus": [ { "index": 0, "uuid": "GPU-5f2c...", "state": "Healthy",
//!               "sm_activity_permille": 420, "memory_used_bytes": 8589934592,
//!               "memory_total_bytes": 34359738368, "offline_sm_budget_permille": 500,
//!               "model": "Tesla V100-SXM2-32GB" } ] }
//! ```
//!
//! Compatibility: fields may be added within a version (readers ignore unknown fields);
//! removing, renaming or re-meaning a field bumps [`VERSION`], and a reader refuses a version
//! it does not know ([`HeartbeatError::UnknownVersion`]) rather than guess.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The Node annotation that carries the heartbeat.
pub const ANNOTATION: &str = "xshare.io/gpu-heartbeat";
/// The heartbeat format this crate reads and writes.
pub const VERSION: u32 = 1;
/// Largest encoded heartbeat accepted or produced (the API server allows 256 KiB of
/// annotations per object in all).
pub const MAX_ANNOTATION_BYTES: usize = 64 << 10;
/// Shortest period between two publications without a state change (write amplification:
/// every write goes to every Node watcher).
pub const MIN_PUBLISH_INTERVAL_MS: u64 = 10_000;
/// Default age past which the cluster side reads a heartbeat as stale.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);
/// Default allowance for a heartbeat dated ahead of the reader's clock (node clock drift).
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(2);

/// A GPU's state in sysmonitor's five-state machine (MuxFlow §4.1). Only `Healthy` admits
/// offline work. Written capitalized; lower-case is accepted when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum GpuState {
    /// Monitor started, no verdict yet.
    #[serde(alias = "init")]
    Init,
    /// All metrics below their thresholds; offline work may be admitted.
    #[serde(alias = "healthy")]
    Healthy,
    /// A metric past its Unhealthy threshold, or (node-agent) no MPS that could serve an
    /// offline container now; no new offline work.
    #[serde(alias = "unhealthy")]
    Unhealthy,
    /// A metric past its Overlimit threshold; offline work is evicted.
    #[serde(alias = "overlimit")]
    Overlimit,
    /// Device unavailable (an XID, or disabled by an operator).
    #[serde(alias = "disabled")]
    Disabled,
}

impl GpuState {
    /// All five, in the machine's order.
    pub const ALL: [GpuState; 5] = [
        GpuState::Init,
        GpuState::Healthy,
        GpuState::Unhealthy,
        GpuState::Overlimit,
        GpuState::Disabled,
    ];

    /// Whether offline work may be admitted.
    pub fn admits_offline(self) -> bool {
        self == GpuState::Healthy
    }

    /// The name as written in the heartbeat (`"Healthy"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            GpuState::Init => "Init",
            GpuState::Healthy => "Healthy",
            GpuState::Unhealthy => "Unhealthy",
            GpuState::Overlimit => "Overlimit",
            GpuState::Disabled => "Disabled",
        }
    }
}

/// One GPU's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuReport {
    /// NVML index on the node.
    pub index: u32,
    /// NVML UUID (`GPU-...`).
    pub uuid: String,
    /// Its state in sysmonitor's machine.
    pub state: GpuState,
    /// SM activity over the last sampling window, 0..=1000 (‰ of the GPU's SMs busy).
    pub sm_activity_permille: u32,
    /// Device memory in use by all processes, bytes.
    pub memory_used_bytes: u64,
    /// Device memory capacity, bytes.
    pub memory_total_bytes: u64,
    /// Share of the SMs the node grants offline work now (MPS active-thread budget), 0..=1000.
    pub offline_sm_budget_permille: u32,
    /// NVML product name (`Tesla V100-SXM2-32GB`).
    pub model: String,
}

/// The whole annotation value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHeartbeat {
    /// Always [`VERSION`] when written by this crate.
    pub version: u32,
    /// The Node it describes (must equal the annotated Node's name).
    pub node: String,
    /// Wall-clock time of publication, milliseconds since the Unix epoch.
    pub updated_unix_ms: u64,
    /// One report per GPU on the node.
    pub gpus: Vec<GpuReport>,
}

/// A heartbeat that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatError {
    #[error("node {node}: annotation {ANNOTATION} is {len} bytes, over the {MAX_ANNOTATION_BYTES}-byte limit")]
    /// Over [`MAX_ANNOTATION_BYTES`]; `len` is the value's size in bytes.
    #[allow(missing_docs)]
    TooLarge { node: String, len: usize },
    #[error("node {node}: annotation {ANNOTATION} is not valid JSON: {why}")]
    /// Not parseable as JSON.
    #[allow(missing_docs)]
    Json { node: String, why: String },
    #[error("node {node}: annotation {ANNOTATION} has no numeric `version`")]
    /// No numeric top-level `version` field.
    #[allow(missing_docs)]
    NoVersion { node: String },
    #[error("node {node}: annotation {ANNOTATION} has version {found}; this build reads version {VERSION} only")]
    /// A `version` other than [`VERSION`].
    #[allow(missing_docs)]
    UnknownVersion { node: String, found: u64 },
    #[error("node {node}: annotation {ANNOTATION}: {field}: {why}")]
    /// Parsed, but `field` breaks an invariant (`why`).
    #[allow(missing_docs)]
    Invalid { node: String, field: String, why: String },
}

/// How old a heartbeat is, as of some reader's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Within the staleness limit (and not further ahead than the skew allowance).
    Fresh {
        /// Reader's clock minus `updated_unix_ms`, saturating at 0.
        age_ms: u64,
    },
    /// Older than the staleness limit: the publisher may be dead.
    Stale {
        /// Reader's clock minus `updated_unix_ms`.
        age_ms: u64,
    },
    /// Dated further ahead than the skew allowance: proves nothing about the publisher being
    /// alive now (a clock set wrong, or `u64::MAX`), so it is not fresh.
    FromFuture {
        /// `updated_unix_ms` minus the reader's clock.
        ahead_ms: u64,
    },
}

impl Freshness {
    /// Whether this is [`Freshness::Fresh`].
    pub fn is_fresh(self) -> bool {
        matches!(self, Freshness::Fresh { .. })
    }
}

impl GpuHeartbeat {
    /// Checks what serde cannot: the node name matches `node`, GPU indices and UUIDs are
    /// unique and non-empty, per-mille values within 0..=1000, memory used within total.
    pub fn validate(&self, node: &str) -> Result<(), HeartbeatError> {
        let bad = |field: String, why: String| HeartbeatError::Invalid {
            node: node.to_string(),
            field,
            why,
        };
        if self.version != VERSION {
            return Err(HeartbeatError::UnknownVersion {
                node: node.to_string(),
                found: u64::from(self.version),
            });
        }
        if self.node != node {
            return Err(bad("node".into(), format!("describes node `{}`", self.node)));
        }
        let mut indices = BTreeSet::new();
        let mut uuids = BTreeSet::new();
        for (i, g) in self.gpus.iter().enumerate() {
            let f = |s: &str| format!("gpus[{i}].{s}");
            if !indices.insert(g.index) {
                return Err(bad(f("index"), format!("GPU {} listed twice", g.index)));
            }
            if g.uuid.is_empty() {
                return Err(bad(f("uuid"), "empty".into()));
            }
            if !uuids.insert(g.uuid.as_str()) {
                return Err(bad(f("uuid"), format!("{} listed twice", g.uuid)));
            }
            if g.sm_activity_permille > 1000 {
                return Err(bad(
                    f("sm_activity_permille"),
                    format!("{} is over 1000", g.sm_activity_permille),
                ));
            }
            if g.offline_sm_budget_permille > 1000 {
                return Err(bad(
                    f("offline_sm_budget_permille"),
                    format!("{} is over 1000", g.offline_sm_budget_permille),
                ));
            }
            if g.memory_used_bytes > g.memory_total_bytes {
                return Err(bad(
                    f("memory_used_bytes"),
                    format!(
                        "{} is more than memory_total_bytes {}",
                        g.memory_used_bytes, g.memory_total_bytes
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Freshness as of `now_unix_ms`: dated more than `max_skew` ahead is [`Freshness::FromFuture`],
    /// older than `stale_after` is [`Freshness::Stale`].
    pub fn freshness(&self, now_unix_ms: u64, stale_after: Duration, max_skew: Duration) -> Freshness {
        freshness(self.updated_unix_ms, now_unix_ms, stale_after, max_skew)
    }

    /// The report for GPU `index`.
    pub fn gpu(&self, index: u32) -> Option<&GpuReport> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The annotation value (validated first; refused over [`MAX_ANNOTATION_BYTES`]).
    pub fn encode(&self) -> Result<String, HeartbeatError> {
        self.validate(&self.node)?;
        let text = serde_json::to_string(self).map_err(|e| HeartbeatError::Json {
            node: self.node.clone(),
            why: e.to_string(),
        })?;
        if text.len() > MAX_ANNOTATION_BYTES {
            return Err(HeartbeatError::TooLarge {
                node: self.node.clone(),
                len: text.len(),
            });
        }
        Ok(text)
    }

    /// The JSON merge patch (`application/merge-patch+json`) body that sets the annotation on
    /// the Node: `{"metadata":{"annotations":{"xshare.io/gpu-heartbeat":"<json>"}}}`.
    pub fn node_merge_patch(&self) -> Result<serde_json::Value, HeartbeatError> {
        let value = self.encode()?;
        Ok(serde_json::json!({ "metadata": { "annotations": { ANNOTATION: value } } }))
    }
}

/// [`GpuHeartbeat::freshness`] of a bare timestamp.
pub fn freshness(updated_unix_ms: u64, now_unix_ms: u64, stale_after: Duration, max_skew: Duration) -> Freshness {
    let ahead_ms = updated_unix_ms.saturating_sub(now_unix_ms);
    if ahead_ms > duration_ms(max_skew) {
        return Freshness::FromFuture { ahead_ms };
    }
    let age_ms = now_unix_ms.saturating_sub(updated_unix_ms);
    if age_ms > duration_ms(stale_after) {
        Freshness::Stale { age_ms }
    } else {
        Freshness::Fresh { age_ms }
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Parses and validates the annotation value found on Node `node`. The version is checked
/// before the shape, so a future format reads as [`HeartbeatError::UnknownVersion`], not as
/// a confusing field error. Freshness is the caller's to judge ([`GpuHeartbeat::freshness`]).
pub fn parse(node: &str, text: &str) -> Result<GpuHeartbeat, HeartbeatError> {
    if text.len() > MAX_ANNOTATION_BYTES {
        return Err(HeartbeatError::TooLarge {
            node: node.to_string(),
            len: text.len(),
        });
    }
    let json = |e: serde_json::Error| HeartbeatError::Json {
        node: node.to_string(),
        why: e.to_string(),
    };
    let value: serde_json::Value = serde_json::from_str(text).map_err(json)?;
    let version = value.get("version").and_then(serde_json::Value::as_u64);
    match version {
        None => return Err(HeartbeatError::NoVersion { node: node.to_string() }),
        Some(v) if v != u64::from(VERSION) => {
            return Err(HeartbeatError::UnknownVersion {
                node: node.to_string(),
                found: v,
            })
        }
        Some(_) => {}
    }
    let hb: GpuHeartbeat = serde_json::from_value(value).map_err(json)?;
    hb.validate(node)?;
    Ok(hb)
}

/// [`parse`] plus freshness: a heartbeat that is stale or dated in the future is an error too
/// (the cluster side's one-call check).
pub fn parse_fresh(
    node: &str,
    text: &str,
    now_unix_ms: u64,
    stale_after: Duration,
    max_skew: Duration,
) -> Result<GpuHeartbeat, FreshError> {
    let hb = parse(node, text).map_err(FreshError::Invalid)?;
    match hb.freshness(now_unix_ms, stale_after, max_skew) {
        Freshness::Fresh { .. } => Ok(hb),
        f => Err(FreshError::NotFresh(f)),
    }
}

/// Why [`parse_fresh`] refused a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreshError {
    /// Unparseable or invalid.
    #[error(transparent)]
    Invalid(HeartbeatError),
    /// Valid, but stale or dated in the future.
    #[error("heartbeat not fresh: {0:?}")]
    NotFresh(Freshness),
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_763_890_000_000;

    fn sample() -> GpuHeartbeat {
        GpuHeartbeat {
            version: VERSION,
            node: "n1".into(),
            updated_unix_ms: NOW,
            gpus: vec![
                GpuReport {
                    index: 0,
                    uuid: "GPU-0a".into(),
                    state: GpuState::Healthy,
                    sm_activity_permille: 420,
                    memory_used_bytes: 8 << 30,
                    memory_total_bytes: 32 << 30,
                    offline_sm_budget_permille: 500,
                    model: "Tesla V100-SXM2-32GB".into(),
                },
                GpuReport {
                    index: 1,
                    uuid: "GPU-1b".into(),
                    state: GpuState::Overlimit,
                    sm_activity_permille: 990,
                    memory_used_bytes: 30 << 30,
                    memory_total_bytes: 32 << 30,
                    offline_sm_budget_permille: 0,
                    model: "Tesla V100-SXM2-32GB".into(),
                },
            ],
        }
    }

    #[test]
    fn round_trips_through_the_annotation_and_patch() {
        let hb = sample();
        let text = hb.encode().unwrap();
        assert!(text.contains(r#""state":"Healthy""#), "{text}");
        assert_eq!(parse("n1", &text).unwrap(), hb);
        let patch = hb.node_merge_patch().unwrap();
        let inner = patch["metadata"]["annotations"][ANNOTATION].as_str().unwrap();
        assert_eq!(parse("n1", inner).unwrap(), hb);
    }

    #[test]
    fn documented_example_parses_and_lower_case_states_are_read() {
        let text = r#"{ "version": 1, "node": "gpu-node-7", "updated_unix_ms": 1763890000000,
          "gpus": [ { "index": 0, "uuid": "GPU-5f2c", "state": "healthy",
                      "sm_activity_permille": 420, "memory_used_bytes": 8589934592,
                      "memory_total_bytes": 34359738368, "offline_sm_budget_permille": 500,
                      "model": "Tesla V100-SXM2-32GB", "added_later": true } ] }"#;
        let hb = parse("gpu-node-7", text).unwrap();
        assert_eq!(hb.gpus[0].state, GpuState::Healthy);
        assert!(hb.gpu(0).unwrap().state.admits_offline());
        assert!(hb.gpu(3).is_none());
        for s in GpuState::ALL {
            let v: GpuState = serde_json::from_str(&format!("\"{}\"", s.as_str())).unwrap();
            assert_eq!(v, s);
        }
        assert!(serde_json::from_str::<GpuState>("\"Sleepy\"").is_err());
    }

    #[test]
    fn unknown_or_missing_version_is_an_error() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["version"] = 2.into();
        // Even a version-2 shape this build cannot read is reported as the version.
        v["gpus"] = serde_json::json!("elsewhere");
        assert_eq!(
            parse("n1", &v.to_string()),
            Err(HeartbeatError::UnknownVersion {
                node: "n1".into(),
                found: 2
            })
        );
        v.as_object_mut().unwrap().remove("version");
        assert_eq!(
            parse("n1", &v.to_string()),
            Err(HeartbeatError::NoVersion { node: "n1".into() })
        );
        assert!(matches!(
            parse("n1", "{\"version\": 1, \"node\""),
            Err(HeartbeatError::Json { .. })
        ));
        let mut hb = sample();
        hb.version = 0;
        assert!(matches!(
            hb.encode(),
            Err(HeartbeatError::UnknownVersion { found: 0, .. })
        ));
    }

    #[test]
    fn invalid_contents_are_named() {
        let field_of = |hb: &GpuHeartbeat, node: &str| match parse(node, &serde_json::to_string(hb).unwrap()) {
            Err(HeartbeatError::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert_eq!(field_of(&sample(), "n2"), "node");
        let mut hb = sample();
        hb.gpus[1].index = 0;
        assert_eq!(field_of(&hb, "n1"), "gpus[1].index");
        let mut hb = sample();
        hb.gpus[1].uuid = "GPU-0a".into();
        assert_eq!(field_of(&hb, "n1"), "gpus[1].uuid");
        let mut hb = sample();
        hb.gpus[0].uuid.clear();
        assert_eq!(field_of(&hb, "n1"), "gpus[0].uuid");
        let mut hb = sample();
        hb.gpus[0].sm_activity_permille = 1001;
        assert_eq!(field_of(&hb, "n1"), "gpus[0].sm_activity_permille");
        let mut hb = sample();
        hb.gpus[0].offline_sm_budget_permille = 5000;
        assert_eq!(field_of(&hb, "n1"), "gpus[0].offline_sm_budget_permille");
        let mut hb = sample();
        hb.gpus[0].memory_used_bytes = hb.gpus[0].memory_total_bytes + 1;
        assert_eq!(field_of(&hb, "n1"), "gpus[0].memory_used_bytes");
        let mut hb = sample();
        hb.gpus[0].state = GpuState::Healthy;
        let text = serde_json::to_string(&hb).unwrap().replace("\"Healthy\"", "\"Sleepy\"");
        assert!(matches!(parse("n1", &text), Err(HeartbeatError::Json { .. })));
    }

    #[test]
    fn size_is_capped_both_ways() {
        let mut hb = sample();
        hb.gpus[0].model = "x".repeat(MAX_ANNOTATION_BYTES);
        assert!(matches!(hb.encode(), Err(HeartbeatError::TooLarge { .. })));
        let text = serde_json::to_string(&hb).unwrap();
        assert!(matches!(parse("n1", &text), Err(HeartbeatError::TooLarge { .. })));
    }

    #[test]
    fn freshness_rejects_stale_and_future_dated() {
        let stale = DEFAULT_STALE_AFTER;
        let skew = DEFAULT_MAX_CLOCK_SKEW;
        let hb = sample();
        assert_eq!(
            hb.freshness(NOW + 1_000, stale, skew),
            Freshness::Fresh { age_ms: 1_000 }
        );
        assert_eq!(
            hb.freshness(NOW + 31_000, stale, skew),
            Freshness::Stale { age_ms: 31_000 }
        );
        // Slightly ahead (within the skew allowance) still counts as fresh.
        assert_eq!(hb.freshness(NOW - 1_500, stale, skew), Freshness::Fresh { age_ms: 0 });
        assert_eq!(
            hb.freshness(NOW - 3_600_000, stale, skew),
            Freshness::FromFuture { ahead_ms: 3_600_000 }
        );
        assert!(!freshness(u64::MAX, NOW, stale, skew).is_fresh());
        assert_eq!(
            freshness(NOW + 5_000, NOW, stale, Duration::from_secs(10)),
            Freshness::Fresh { age_ms: 0 }
        );
        let text = hb.encode().unwrap();
        assert!(parse_fresh("n1", &text, NOW, stale, skew).is_ok());
        assert_eq!(
            parse_fresh("n1", &text, NOW - 60_000, stale, skew),
            Err(FreshError::NotFresh(Freshness::FromFuture { ahead_ms: 60_000 }))
        );
        assert!(matches!(
            parse_fresh("n1", &text, NOW + 60_000, stale, skew),
            Err(FreshError::NotFresh(Freshness::Stale { .. }))
        ));
        assert!(matches!(
            parse_fresh("n2", &text, NOW, stale, skew),
            Err(FreshError::Invalid(_))
        ));
    }
}
