//! The GPU heartbeat reaches the Node: a JSON merge patch of `xshare.io/gpu-heartbeat` on
//! `/api/v1/nodes/{node}` (field manager `xshare-node-agent`), readable by kube-contract's
//! parser, published first at start and again as soon as a GPU's state changes.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{FakeApi, Recorded};
use k8s_openapi::api::core::v1::Node;
use kube_contract::heartbeat::{self, GpuState};
use node_agent::config::AgentConfig;
use node_ledger::config::ledger_path;
use node_ledger::{HealthState, Ledger, MonitorSample};
use tokio::sync::watch;

fn node_json(annotations: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "uid": "n-uid", "resourceVersion": "9", "annotations": annotations},
        "status": {"allocatable": {"xshare.io/offline-gpu": "4"}}})
}

async fn patches(api: &FakeApi, n: usize) -> Vec<Recorded> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let v: Vec<_> = api
                .requests
                .lock()
                .unwrap()
                .iter()
                .filter(|r| r.method == "PATCH")
                .cloned()
                .collect();
            if v.len() >= n {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("heartbeat not published in 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_the_node_annotation_and_again_on_a_state_change() {
    let tmp = tempfile::tempdir().unwrap();
    let _l0 = Ledger::open_or_create(&ledger_path(tmp.path(), 0), 0).unwrap();
    let l0 = node_ledger::Status::open_or_create(&node_ledger::config::status_path(tmp.path(), 0), 0).unwrap();
    let sample = MonitorSample {
        sm_active_permille: 350,
        mem_used_bytes: 3 << 30,
        mem_total_bytes: 16 << 30,
        ..Default::default()
    };
    l0.publish(&sample.with_health(HealthState::Healthy));
    l0.publish_sm_budget(600);
    // GPU 1 has no monitor (no ledger).
    let api = FakeApi::start(Arc::new(|r: &Recorded| {
        if r.method == "PATCH" && r.path == "/api/v1/nodes/node-a" {
            let ann = r.json()["metadata"]["annotations"].clone();
            (200, node_json(ann))
        } else {
            (404, common::status(404, "NotFound", "no such path"))
        }
    }))
    .await;
    let text = serde_json::json!({
        "node_name": "node-a", "ledger_dir": tmp.path(),
        "gpus": [{"index": 0, "uuid": "GPU-aaaa", "model": "Tesla T4"}, {"index": 1, "uuid": "GPU-bbbb"}],
        "health": {"poll_ms": 50, "stale_after_ms": 60000},
        "heartbeat": {"interval_ms": 60000},
        "kube": {"api_url": api.url()},
    })
    .to_string();
    let cfg = Arc::new(AgentConfig::from_text(Path::new("t.json"), &text, |_| None).unwrap());
    let client = node_agent::kube::client(&cfg.kube).await.unwrap();
    let (htx, hrx) = watch::channel(BTreeMap::new());
    let (dtx, _drx) = watch::channel(Vec::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(node_agent::plugin::poll_health(
        cfg.clone(),
        htx,
        dtx,
        stop_rx.clone(),
    ));
    let task = tokio::spawn(node_agent::heartbeat::run(
        cfg.clone(),
        client,
        hrx,
        stop_rx,
    ));

    let p = patches(&api, 1).await;
    let r = &p[0];
    assert_eq!(r.path, "/api/v1/nodes/node-a");
    assert!(
        r.query.contains("fieldManager=xshare-node-agent"),
        "{}",
        r.query
    );
    assert_eq!(r.content_type, "application/merge-patch+json");
    // The body is a partial Node carrying only the annotation.
    let partial: Node = serde_json::from_value(r.json()).unwrap();
    let ann = partial.metadata.annotations.unwrap();
    assert_eq!(ann.len(), 1);
    let hb = heartbeat::parse("node-a", &ann[heartbeat::ANNOTATION]).unwrap();
    let g0 = hb.gpu(0).unwrap();
    assert_eq!(g0.state, GpuState::Healthy);
    assert_eq!(
        (
            g0.sm_activity_permille,
            g0.memory_used_bytes,
            g0.memory_total_bytes
        ),
        (350, 3 << 30, 16 << 30)
    );
    assert_eq!(g0.offline_sm_budget_permille, 600);
    assert_eq!(
        (g0.uuid.as_str(), g0.model.as_str()),
        ("GPU-aaaa", "Tesla T4")
    );
    assert_eq!(
        hb.gpu(1).unwrap().state,
        GpuState::Init,
        "no monitor: no verdict"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(hb
        .freshness(
            now,
            heartbeat::DEFAULT_STALE_AFTER,
            heartbeat::DEFAULT_MAX_CLOCK_SKEW
        )
        .is_fresh());

    // Overlimit: published at the next poll, not after the 60 s interval.
    l0.publish(&sample.with_health(HealthState::Overlimit));
    let p = patches(&api, 2).await;
    let ann = serde_json::from_value::<Node>(p[1].json())
        .unwrap()
        .metadata
        .annotations
        .unwrap();
    let hb = heartbeat::parse("node-a", &ann[heartbeat::ANNOTATION]).unwrap();
    assert_eq!(hb.gpu(0).unwrap().state, GpuState::Overlimit);
    // Nothing changes now: no third write before the interval (checked over a few polls).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(patches(&api, 2).await.len(), 2);

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

/// A refused heartbeat is not retried at every health change: the API server's 429 asks for a
/// wait (`details.retryAfterSeconds`, capped at `MAX_RETRY_BACKOFF`, 10 s), and the agent sends
/// nothing before it, however many state changes come meanwhile (before, each health poll sent
/// a patch: one a second per node while the API server was refusing them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_heartbeat_waits_for_the_servers_retry_after_whatever_the_health_changes() {
    let api = FakeApi::start(Arc::new(|r: &Recorded| {
        if r.method == "PATCH" {
            let mut st = common::status(429, "TooManyRequests", "too many requests, please try again later");
            st["details"] = serde_json::json!({"retryAfterSeconds": 3600});
            (429, st)
        } else {
            (404, common::status(404, "NotFound", "no such path"))
        }
    }))
    .await;
    let text = serde_json::json!({
        "node_name": "node-a", "ledger_dir": "/nonexistent",
        "gpus": [{"index": 0, "uuid": "GPU-aaaa"}],
        "health": {"poll_ms": 20, "stale_after_ms": 60000},
        "heartbeat": {"interval_ms": 60000},
        "kube": {"api_url": api.url()},
    })
    .to_string();
    let cfg = Arc::new(AgentConfig::from_text(Path::new("t.json"), &text, |_| None).unwrap());
    let client = node_agent::kube::client(&cfg.kube).await.unwrap();
    let health = |s: HealthState| {
        BTreeMap::from([(0, node_agent::health::GpuHealth { index: 0, state: Some(s), why: String::new(), snapshot: None, budget_permille: None })])
    };
    let (htx, hrx) = watch::channel(health(HealthState::Healthy));
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(node_agent::heartbeat::run(cfg.clone(), client, hrx, stop_rx));
    assert_eq!(patches(&api, 1).await.len(), 1);
    // Twenty state changes, each of which would be published at once if the API took it.
    for i in 0..20 {
        htx.send(health(if i % 2 == 0 { HealthState::Overlimit } else { HealthState::Healthy })).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(patches(&api, 1).await.len(), 1, "a patch was sent before the server's Retry-After");
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}
