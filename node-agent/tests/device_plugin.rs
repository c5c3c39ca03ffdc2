//! The device plugin against the kubelet's side of the real gRPC protocol, over unix sockets:
//! a Registration server stands in for the kubelet (`kubelet.sock`), the plugin registers with
//! it, then the test calls GetDevicePluginOptions / ListAndWatch / GetPreferredAllocation /
//! Allocate on the plugin's socket as the kubelet does. GPU health comes from real node
//! ledgers; pending pods from a loopback API server answering real-shaped JSON.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{offline_pod, pod_list, start_kubelet, FakeApi, Recorded};
use node_agent::config::AgentConfig;
use node_agent::pb;
use node_agent::pb::device_plugin_client::DevicePluginClient;
use node_agent::plugin::{self, Plugin, PodSource};
use node_ledger::config::ledger_path;
use node_ledger::{HealthState, Ledger, MonitorSample};
use tokio::sync::watch;
use tokio_stream::StreamExt;

/// GPU `gpu`'s ledger under `dir`, and its status file for a test to publish in as the monitor.
fn monitor_files(dir: &std::path::Path, gpu: u32) -> (Ledger, node_ledger::StatusWriter) {
    (
        Ledger::open_or_create(&ledger_path(dir, gpu), gpu).unwrap(),
        node_ledger::Status::open_or_create(&node_ledger::config::status_path(dir, gpu), gpu).unwrap(),
    )
}

fn publish(l: &node_ledger::StatusWriter, s: HealthState) {
    l.publish(&MonitorSample::default().with_health(s));
}

async fn next_until(
    s: &mut tonic::Streaming<pb::ListAndWatchResponse>,
    want: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = s
                .next()
                .await
                .expect("ListAndWatch stream ended")
                .expect("ListAndWatch error");
            let d: BTreeMap<_, _> = m.devices.into_iter().map(|d| (d.id, d.health)).collect();
            if want(&d) {
                return d;
            }
        }
    })
    .await
    .expect("ListAndWatch did not report the expected health in 10 s")
}

fn all(d: &BTreeMap<String, String>, gpu: u32, health: &str) -> bool {
    let v: Vec<_> = d
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("gpu{gpu}-")))
        .collect();
    !v.is_empty() && v.iter().all(|(_, h)| *h == health)
}

/// `pod` as the kubelet reports it once admitted: its container waiting to be created.
fn admitted(mut pod: serde_json::Value) -> serde_json::Value {
    pod["status"]["containerStatuses"] = serde_json::json!([{"name": "main", "image": "trainer:1", "imageID": "",
        "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]);
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_reports_health_and_allocates_the_planned_pod() {
    let tmp = tempfile::tempdir().unwrap();
    let dp_dir = tmp.path().join("device-plugins");
    let ledger_dir = tmp.path().join("run-xshare");
    std::fs::create_dir_all(&dp_dir).unwrap();
    let (_ledger0, l0) = monitor_files(&ledger_dir, 0);
    let (_ledger1, l1) = monitor_files(&ledger_dir, 1);
    publish(&l0, HealthState::Healthy);
    publish(&l1, HealthState::Healthy);

    let api = FakeApi::start(Arc::new(|r: &Recorded| {
        if r.method == "GET" && r.path == "/api/v1/pods" {
            let pods = vec![
                // Unplanned, but the kubelet already reports its container: admitted, so no
                // candidate for the container being admitted now.
                admitted(offline_pod("unplanned", "0000000e-0000-4000-8000-00000000000e", "node-a", None, "2026-01-01T00:00:00Z")),
                offline_pod(
                    "train-0",
                    "00000001-0000-4000-8000-000000000001",
                    "node-a",
                    Some(1),
                    "2026-01-01T00:00:05Z",
                ),
            ];
            (200, pod_list(pods))
        } else {
            (404, common::status(404, "NotFound", "no such path"))
        }
    }))
    .await;

    let cfg_text = serde_json::json!({
        "node_name": "node-a",
        "ledger_dir": ledger_dir,
        "gpus": [{"index": 0, "uuid": "GPU-00000000-aaaa"}, {"index": 1, "uuid": "GPU-11111111-bbbb"}],
        "device_plugin": {"dir": dp_dir, "max_offline_per_gpu": 2},
        "health": {"poll_ms": 50, "stale_after_ms": 60000},
        "kube": {"api_url": api.url()},
    })
    .to_string();
    let cfg =
        Arc::new(AgentConfig::from_text(Path::new("test.json"), &cfg_text, |_| None).unwrap());
    let mut kubelet = start_kubelet(&dp_dir);

    let (health_tx, health_rx) = watch::channel(BTreeMap::new());
    let (dev_tx, dev_rx) = watch::channel(Vec::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(plugin::poll_health(
        cfg.clone(),
        health_tx,
        dev_tx,
        stop_rx.clone(),
    ));
    let client = node_agent::kube::client(&cfg.kube).await.unwrap();
    let p = Arc::new(Plugin::new(
        cfg.clone(),
        health_rx,
        dev_rx,
        PodSource::Api(client),
    ));
    let agent = tokio::spawn(plugin::run(cfg.clone(), p, stop_rx));

    // Registration: what the kubelet receives.
    let reg = tokio::time::timeout(Duration::from_secs(10), kubelet.recv())
        .await
        .expect("no Register in 10 s")
        .unwrap();
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.endpoint, "xshare-offline-gpu.sock");
    assert_eq!(reg.resource_name, "xshare.io/offline-gpu");
    assert_eq!(
        reg.options,
        Some(pb::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true
        })
    );

    // The kubelet dials the endpoint it was given, inside its device-plugin directory.
    let ch = plugin::unix_channel(dp_dir.join(&reg.endpoint))
        .await
        .unwrap();
    let mut dp = DevicePluginClient::new(ch);
    let opts = dp
        .get_device_plugin_options(pb::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);

    let mut law = dp.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let d = next_until(&mut law, |d| all(d, 0, "Healthy") && all(d, 1, "Healthy")).await;
    assert_eq!(
        d.keys().cloned().collect::<Vec<_>>(),
        ["gpu0-0", "gpu0-1", "gpu1-0", "gpu1-1"]
    );

    // GPU 1 goes Overlimit: its slots turn Unhealthy, GPU 0's stay Healthy.
    publish(&l1, HealthState::Overlimit);
    next_until(&mut law, |d| all(d, 1, "Unhealthy") && all(d, 0, "Healthy")).await;

    // The kubelet prefers healthy slots on the GPU with most free slots.
    let pref = dp
        .get_preferred_allocation(pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["gpu0-1".into(), "gpu1-0".into(), "gpu1-1".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        ["gpu0-1"],
        "GPU 1 is not Healthy"
    );

    // The pod's plan says GPU 1, which is not Healthy: Allocate refuses (admission fails).
    let alloc = |ids: &[&str]| pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    };
    let e = dp.allocate(alloc(&["gpu0-0"])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("batch/train-0") && e.message().contains("not Healthy"),
        "{}",
        e.message()
    );

    publish(&l1, HealthState::Healthy);
    next_until(&mut law, |d| all(d, 1, "Healthy")).await;

    // GPU 1's mps-manager says no MPS control daemon runs (a recovery held back by its rate
    // limit): every offline container would get no context there. Its slots turn Unhealthy
    // and Allocate refuses, naming why; the monitor's verdict is still Healthy.
    let mgr_state = node_ledger::config::daemon_dir(&ledger_dir, 1).join("mps-manager.json");
    std::fs::create_dir_all(mgr_state.parent().unwrap()).unwrap();
    let state = |daemon: Option<u32>| {
        let v = serde_json::json!({"gpu": 1, "manager_pid": 9, "daemon_pid": daemon,
            "shm_dir": "/dev/shm/xshare-gpu1", "outside_holders": [],
            "last_error": daemon.is_none().then_some("recovery rate limit reached"),
            "updated_unix_ms": node_daemon::clock::unix_ms()});
        std::fs::write(&mgr_state, v.to_string()).unwrap();
    };
    state(None);
    next_until(&mut law, |d| all(d, 1, "Unhealthy") && all(d, 0, "Healthy")).await;
    let e = dp.allocate(alloc(&["gpu0-0"])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("batch/train-0")
            && e.message().contains("no MPS control daemon runs")
            && e.message().contains("rate limit"),
        "{}",
        e.message()
    );
    state(Some(4321));
    next_until(&mut law, |d| all(d, 1, "Healthy")).await;
    api.take();
    let r = dp.allocate(alloc(&["gpu0-0"])).await.unwrap().into_inner();
    assert_eq!(r.container_responses.len(), 1);
    let c = &r.container_responses[0];
    let env = |k: &str| c.envs.get(k).map(String::as_str);
    assert_eq!(
        env("LD_PRELOAD"),
        Some("/usr/local/lib/xshare/libxcuda.so")
    );
    assert_eq!(env("XSHARE_LEDGER_DIR"), Some("/run/xshare"));
    assert_eq!(
        env("XSHARE_GPU_INDEX"),
        Some("1"),
        "the plan's GPU, not the kubelet's slot"
    );
    assert_eq!(env("NVIDIA_VISIBLE_DEVICES"), Some("GPU-11111111-bbbb"));
    assert_eq!(env("CUDA_VISIBLE_DEVICES"), Some("GPU-11111111-bbbb"));
    assert_eq!(
        env("CUDA_MPS_PIPE_DIRECTORY"),
        Some("/run/xshare/gpu1/mps-pipe")
    );
    assert_eq!(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("40"));
    assert_eq!(env("XCUDA_QUOTA_BYTES"), Some("2147483648"));
    assert_eq!(env("XCUDA_GROUP"), Some("k8s-pod-00000001-0000-4000-8000-000000000001"));
    let mounts: Vec<_> = c
        .mounts
        .iter()
        .map(|m| (m.host_path.clone(), m.container_path.clone(), m.read_only))
        .collect();
    // The pod's own ledger of GPU 1, made by Allocate, mounted alone where the shim looks.
    let pod = node_ledger::PodUid::parse("00000001-0000-4000-8000-000000000001").unwrap();
    let host_ledger = node_ledger::pods::pod_ledger_path(&ledger_dir, pod, 1);
    assert!(node_ledger::Ledger::open_existing(&host_ledger).is_ok());
    assert!(
        mounts.contains(&(host_ledger.display().to_string(), "/run/xshare/gpu1/ledger".into(), false)),
        "{mounts:?}"
    );
    assert!(
        mounts
            .iter()
            .any(|(_, c, ro)| c == "/usr/local/lib/xshare/libxcuda.so" && *ro),
        "{mounts:?}"
    );
    assert!(c.cdi_devices.is_empty(), "CDI is off by default");
    // The pod was found the documented way: Pending pods bound to this node.
    let reqs = api.take();
    assert_eq!(reqs[0].method, "GET");
    assert_eq!(reqs[0].path, "/api/v1/pods");
    assert!(
        reqs[0]
            .query
            .contains("fieldSelector=spec.nodeName%3Dnode-a%2Cstatus.phase%3DPending"),
        "{}",
        reqs[0].query
    );

    // Its only container is allocated; the other pending pod has no plan: refused.
    let e = dp.allocate(alloc(&["gpu0-1"])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("no Pending pod"), "{}", e.message());

    // A restarted kubelet wipes the directory: the plugin serves and registers again.
    std::fs::remove_file(dp_dir.join("xshare-offline-gpu.sock")).unwrap();
    let reg2 = tokio::time::timeout(Duration::from_secs(10), kubelet.recv())
        .await
        .expect("no second Register")
        .unwrap();
    assert_eq!(reg2.endpoint, "xshare-offline-gpu.sock");
    let ch = plugin::unix_channel(dp_dir.join(&reg2.endpoint))
        .await
        .unwrap();
    let mut dp2 = DevicePluginClient::new(ch);
    let mut law2 = dp2.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    next_until(&mut law2, |d| all(d, 0, "Healthy") && all(d, 1, "Healthy")).await;

    // Monitor gone (block stale): the next poll marks the slots Unhealthy.
    l0.publish_at(
        &MonitorSample::default().with_health(HealthState::Healthy),
        1,
    );
    next_until(&mut law2, |d| all(d, 0, "Unhealthy")).await;

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), agent)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        !dp_dir.join("xshare-offline-gpu.sock").exists(),
        "socket removed at stop"
    );
}
