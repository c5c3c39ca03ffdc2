//! Allocate and the node's bind lock (`kube_contract::bind_lock`), against the stateful fake
//! API server (fake-kube: Pods and Nodes with resourceVersions, merge patches whose
//! `metadata.resourceVersion` is a precondition). Two offline pods Pending on the node at once
//! (planned or not) refuse the container whatever the lock names: none gets another's plan;
//! the pod the lock names gets its own once it is the only one, and the lock is given back
//! once its containers are allocated, or when its Allocate fails.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::offline_pod;
use fake_kube::cluster::FakeCluster;
use kube_contract::bind_lock::{BindLock, ANNOTATION};
use node_agent::config::AgentConfig;
use node_agent::pb;
use node_agent::pb::device_plugin_server::DevicePlugin;
use node_agent::plugin::{self, Plugin, PodSource};
use node_ledger::{HealthState, MonitorSample};
use tokio::sync::watch;

const NODE: &str = "node-a";

fn lock_on(c: &FakeCluster) -> Option<BindLock> {
    c.node(NODE).unwrap()["metadata"]["annotations"][ANNOTATION].as_str().map(|v| BindLock::parse(v).unwrap())
}

fn hold(c: &FakeCluster, uid: &str, name: &str) {
    let mut n = c.node(NODE).unwrap();
    let l = BindLock { uid: uid.into(), namespace: "batch".into(), name: name.into(), since_unix_ms: node_daemon::clock::unix_ms() };
    n["metadata"]["annotations"][ANNOTATION] = l.encode().into();
    c.add_node(n);
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// node-agent's device plugin on `NODE` with `gpus` GPUs (their status files under
/// `ledger_dir` already published Healthy), `max_offline` per GPU, reading pods from `c`: once
/// every GPU is Healthy to it. With the plugin: its health view, and the sender that keeps its
/// health poll running (dropped, the poll stops).
async fn plugin_on(c: &FakeCluster, tmp: &Path, ledger_dir: &Path, gpus: u32, max_offline: u32) -> (Plugin, HealthView, watch::Sender<bool>) {
    let uuids = ["GPU-00000000-aaaa", "GPU-11111111-bbbb"];
    let cfg_text = serde_json::json!({
        "node_name": NODE,
        "ledger_dir": ledger_dir,
        "gpus": (0..gpus).map(|g| serde_json::json!({"index": g, "uuid": uuids[g as usize]})).collect::<Vec<_>>(),
        "device_plugin": {"dir": tmp.join("dp"), "max_offline_per_gpu": max_offline},
        "health": {"poll_ms": 50, "stale_after_ms": 60000},
        "kube": {"api_url": c.url()},
    })
    .to_string();
    let cfg = Arc::new(AgentConfig::from_text(Path::new("test.json"), &cfg_text, |_| None).unwrap());
    let (health_tx, health_rx) = watch::channel(BTreeMap::new());
    let (dev_tx, dev_rx) = watch::channel(Vec::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(plugin::poll_health(cfg.clone(), health_tx, dev_tx, stop_rx));
    let mut h = health_rx.clone();
    tokio::time::timeout(Duration::from_secs(10), h.wait_for(|m| m.len() == gpus as usize && m.values().all(|g| g.healthy())))
        .await
        .expect("every GPU Healthy within 10 s")
        .unwrap();
    let client = node_agent::kube::client(&cfg.kube).await.unwrap();
    (Plugin::new(cfg, health_rx, dev_rx, PodSource::Api(client)), h, stop_tx)
}

/// node-agent's view of its GPUs' health.
type HealthView = watch::Receiver<BTreeMap<u32, node_agent::health::GpuHealth>>;

fn alloc(id: &str) -> tonic::Request<pb::AllocateRequest> {
    tonic::Request::new(pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec![id.into()] }],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locked_pod_gets_its_own_plan_and_the_lock_is_given_back() {
    let tmp = tempfile::tempdir().unwrap();
    let ledger_dir = tmp.path().join("run-xshare");
    let (mut status, mut ledgers) = (Vec::new(), Vec::new());
    for g in 0..2 {
        ledgers.push(node_ledger::Ledger::open_or_create(&node_ledger::config::ledger_path(&ledger_dir, g), g).unwrap());
        let s = node_ledger::Status::open_or_create(&node_ledger::config::status_path(&ledger_dir, g), g).unwrap();
        s.publish(&MonitorSample::default().with_health(HealthState::Healthy));
        status.push(s);
    }
    let c = FakeCluster::start();
    c.add_node(serde_json::json!({"metadata": {"name": NODE}}));
    // The older pod's plan says GPU 0, the newer one's GPU 1; both bound here, both Pending.
    c.add_pod(offline_pod("train-old", "0000000a-0000-4000-8000-00000000000a", NODE, Some(0), "2026-01-01T00:00:00Z"));
    let mut newer = offline_pod("train-new", "0000000b-0000-4000-8000-00000000000b", NODE, Some(1), "2026-01-01T00:00:05Z");
    newer["metadata"]["annotations"]["xshare.io/memory-quota-bytes"] = "1073741824".into();
    c.add_pod(newer);

    let (p, mut h, _stop) = plugin_on(&c, tmp.path(), &ledger_dir, 2, 2).await;

    // The extender let the newer pod through, but the older one is Pending here too (bound
    // past the lock): the kubelet may be admitting either, so the container is refused, and
    // the lock stays with the newer pod.
    hold(&c, "0000000b-0000-4000-8000-00000000000b", "train-new");
    let e = p.allocate(alloc("gpu0-0")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("batch/train-new") && e.message().contains("batch/train-old"), "{}", e.message());
    // The refused admission was the older pod's: it failed. The newer pod's container is its own.
    c.set_pod_phase("batch", "train-old", "Failed");
    assert_eq!(lock_on(&c).map(|l| l.uid), Some("0000000b-0000-4000-8000-00000000000b".into()), "not given back on an ambiguous refusal");
    let r = p.allocate(alloc("gpu0-0")).await.unwrap().into_inner();
    let env = &r.container_responses[0].envs;
    assert_eq!(env["XCUDA_GROUP"], "k8s-pod-0000000b-0000-4000-8000-00000000000b");
    assert_eq!(env["XSHARE_GPU_INDEX"], "1");
    assert_eq!(env["XCUDA_QUOTA_BYTES"], "1073741824");
    // Its only container is allocated: the node is free for the next bind.
    eventually("the lock given back", || lock_on(&c).is_none()).await;

    // A locked pod whose Allocate fails (its GPU not Healthy) gives the node back too: its
    // admission fails, and the next pod must not wait for the TTL.
    c.add_pod(offline_pod("train-3", "0000000c-0000-4000-8000-00000000000c", NODE, Some(1), "2026-01-01T00:00:09Z"));
    hold(&c, "0000000c-0000-4000-8000-00000000000c", "train-3");
    status[1].publish(&MonitorSample::default().with_health(HealthState::Overlimit));
    // The plugin reads the same health channel.
    tokio::time::timeout(Duration::from_secs(10), h.wait_for(|m| m.get(&1).is_some_and(|g| !g.healthy())))
        .await
        .expect("GPU 1 not Healthy within 10 s")
        .unwrap();
    let e = p.allocate(alloc("gpu1-0")).await.unwrap_err();
    assert!(e.message().contains("batch/train-3") && e.message().contains("not Healthy"), "{}", e.message());
    eventually("the lock given back after a failed Allocate", || lock_on(&c).is_none()).await;

    // Another pod's lock is left alone by an Allocate that is not its pod's.
    status[1].publish(&MonitorSample::default().with_health(HealthState::Healthy));
    hold(&c, "0000000d-0000-4000-8000-00000000000d", "train-elsewhere");
    tokio::time::timeout(Duration::from_secs(10), h.wait_for(|m| m.get(&1).is_some_and(|g| g.healthy())))
        .await
        .expect("GPU 1 Healthy again within 10 s")
        .unwrap();
    let r = p.allocate(alloc("gpu1-1")).await.unwrap().into_inner();
    assert_eq!(r.container_responses[0].envs["XCUDA_GROUP"], "k8s-pod-0000000c-0000-4000-8000-00000000000c");
    // A give-back would be spawned by the Allocate that just returned; give it time to land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(lock_on(&c).map(|l| l.uid), Some("0000000d-0000-4000-8000-00000000000d".into()));

    // What the operator sees on /metrics: one container refused with two pods that could own
    // it, two matched by the lock (train-3's then refused), one not by the lock, two give-backs.
    let m = p.metrics();
    for line in [
        r#"xshare_node_agent_allocate_matches_total{node="node-a",by="bind_lock"} 2"#,
        r#"xshare_node_agent_allocate_matches_total{node="node-a",by="oldest"} 1"#,
        r#"xshare_node_agent_allocate_ambiguous_total{node="node-a"} 1"#,
        r#"xshare_node_agent_allocate_refused_total{node="node-a"} 2"#,
        r#"xshare_node_agent_bind_lock_give_backs_total{node="node-a"} 2"#,
    ] {
        assert!(m.lines().any(|l| l == line), "{line} not in\n{m}");
    }
}

/// The extender's lock names the victim, Pending; another pod asking for the offline resource
/// with no plan of its own (bound without the extender: default scheduler or `spec.nodeName`)
/// is Pending too, and the kubelet admits it first. Its Allocate is refused and gets nothing of
/// the victim's (no plan, no quota group, no pod ledger made), the lock stays; once its
/// admission failed, the victim's Allocate succeeds with its own plan. Fails without the
/// change: the intruder got `XCUDA_GROUP=k8s-pod-<victim>` and the victim's ledger, the lock
/// was given back, and the victim's Allocate found no pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unplanned_pod_admitted_first_gets_nothing_of_the_locked_pods() {
    const VICTIM: &str = "0000000a-0000-4000-8000-00000000000a";
    const INTRUDER: &str = "0000000b-0000-4000-8000-00000000000b";
    let tmp = tempfile::tempdir().unwrap();
    let ledger_dir = tmp.path().join("run-xshare");
    let _ledger = node_ledger::Ledger::open_or_create(&node_ledger::config::ledger_path(&ledger_dir, 0), 0).unwrap();
    let status = node_ledger::Status::open_or_create(&node_ledger::config::status_path(&ledger_dir, 0), 0).unwrap();
    status.publish(&MonitorSample::default().with_health(HealthState::Healthy));
    let c = FakeCluster::start();
    c.add_node(serde_json::json!({"metadata": {"name": NODE}}));
    c.add_pod(offline_pod("victim", VICTIM, NODE, Some(0), "2026-01-01T00:00:05Z"));
    let mut intruder = offline_pod("intruder", INTRUDER, NODE, None, "2026-01-01T00:00:00Z");
    intruder["spec"]["schedulerName"] = "default-scheduler".into();
    c.add_pod(intruder);
    hold(&c, VICTIM, "victim");
    let (p, _h, _stop) = plugin_on(&c, tmp.path(), &ledger_dir, 1, 4).await;

    // The kubelet admits the intruder first.
    let e = p.allocate(alloc("gpu0-0")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("batch/intruder") && e.message().contains("batch/victim"), "{}", e.message());
    let victim_ledgers = node_ledger::pods::pod_dir(&ledger_dir, node_ledger::PodUid::parse(VICTIM).unwrap());
    assert!(!victim_ledgers.exists(), "no ledger made for the victim by another pod's Allocate");
    assert_eq!(lock_on(&c).map(|l| l.uid), Some(VICTIM.into()), "the lock stays with the victim");
    // Its admission failed; the victim's container is the victim's.
    c.set_pod_phase("batch", "intruder", "Failed");
    let r = p.allocate(alloc("gpu0-1")).await.unwrap().into_inner();
    let env = &r.container_responses[0].envs;
    assert_eq!(env["XCUDA_GROUP"], format!("k8s-pod-{VICTIM}"));
    assert_eq!(env["XCUDA_QUOTA_BYTES"], "2147483648");
    assert!(victim_ledgers.exists());
    eventually("the lock given back after the victim's Allocate", || lock_on(&c).is_none()).await;
    assert!(p.metrics().lines().any(|l| l == r#"xshare_node_agent_allocate_ambiguous_total{node="node-a"} 1"#), "{}", p.metrics());
}
