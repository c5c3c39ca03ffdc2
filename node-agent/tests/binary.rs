//! The `node-agent run` binary as deployed: config file, fake kubelet, loopback API server.
//! It registers, publishes the heartbeat, serves /metrics, and on SIGTERM stops cleanly and
//! removes its socket.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{start_kubelet, FakeApi, Recorded};
use node_ledger::config::ledger_path;
use node_ledger::{HealthState, Ledger, MonitorSample};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_registers_heartbeats_serves_metrics_and_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let dp_dir = tmp.path().join("dp");
    std::fs::create_dir_all(&dp_dir).unwrap();
    let _ledger = Ledger::open_or_create(&ledger_path(&tmp.path().join("run"), 0), 0).unwrap();
    let l = node_ledger::Status::open_or_create(&node_ledger::config::status_path(&tmp.path().join("run"), 0), 0).unwrap();
    l.publish(&MonitorSample::default().with_health(HealthState::Healthy));
    let mut kubelet = start_kubelet(&dp_dir);
    let api = FakeApi::start(Arc::new(|r: &Recorded| match r.method.as_str() {
        "PATCH" => (
            200,
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}}),
        ),
        _ => (200, common::pod_list(vec![])),
    }))
    .await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = tmp.path().join("agent.json");
    std::fs::write(
        &cfg,
        serde_json::json!({
            "ledger_dir": tmp.path().join("run"),
            "gpus": [{"index": 0, "uuid": "GPU-0"}],
            // No NVML here: the config's UUID stands in, as the operator allowed.
            "allow_unverified_uuids": true,
            "device_plugin": {"dir": dp_dir},
            "health": {"poll_ms": 100},
            "kube": {"api_url": api.url()},
            "metrics_listen": format!("127.0.0.1:{port}"),
        })
        .to_string(),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["run", "--config"])
        .arg(&cfg)
        .env("NODE_NAME", "node-b")
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let reg = tokio::time::timeout(Duration::from_secs(20), kubelet.recv())
        .await
        .expect("no Register")
        .unwrap();
    assert_eq!(reg.resource_name, "xshare.io/offline-gpu");
    let patch = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(r) = api
                .requests
                .lock()
                .unwrap()
                .iter()
                .find(|r| r.method == "PATCH")
                .cloned()
            {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("no heartbeat");
    assert_eq!(patch.path, "/api/v1/nodes/node-b");
    let metrics = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await
                    .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                if out.contains("health=\"Healthy\"} 4") {
                    return out;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("no /metrics with healthy slots");
    assert!(
        metrics.contains("xshare_node_agent_evictions_total")
            || metrics.contains("xshare_node_agent_offline_slots")
    );

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let st = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("no exit after SIGTERM")
        .unwrap();
    assert!(st.success(), "{st:?}");
    assert!(!dp_dir.join("xshare-offline-gpu.sock").exists());
}

#[test]
fn bad_config_exits_2_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("agent.json");
    std::fs::write(&cfg, "{\"node_name\": \"n\",\n \"gpus\": []}").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent.json:2") && err.contains("gpus"),
        "{err}"
    );
}

/// `run` without NVML (a DaemonSet without the NVIDIA runtime) and with UUIDs in the config:
/// nothing could check that they are the GPUs at their indices, and containers would get them
/// as NVIDIA_VISIBLE_DEVICES: exit 2, naming the GPU, the UUID and both fixes, before any API
/// call. `cdi-spec` (may run off the node) still takes them. Fails without the check: `run`
/// started on the unchecked UUID with a warning. Needs a host without libnvidia-ml (the
/// build hosts; the e2e tests give NVML through their emulated host only).
#[test]
fn run_without_nvml_and_with_configured_uuids_exits_2_naming_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("agent.json");
    std::fs::write(
        &cfg,
        serde_json::json!({
            "node_name": "n",
            "ledger_dir": tmp.path().join("run"),
            "gpus": [{"index": 0, "uuid": "GPU-5f2c0a11-7d0e-4a3b-9c55-0123456789ab"}],
            "device_plugin": {"dir": tmp.path().join("dp")},
            // Nothing listens there: an agent that got past the check would not exit 2.
            "kube": {"api_url": "http://127.0.0.1:9", "timeout_ms": 200},
        })
        .to_string(),
    )
    .unwrap();
    if node_agent::gpus::NvmlLookup::init().gpu(0).is_ok() {
        eprintln!("NVML answers on this host: the check is not reached; nothing to test");
        return;
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["run", "--config"])
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // An agent past the check runs until stopped: a bound on the wait, not a timing.
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "still running or another exit: {err}");
    assert!(
        err.contains("NVML is unavailable")
            && err.contains("GPU-5f2c0a11-7d0e-4a3b-9c55-0123456789ab")
            && err.contains("runtimeClassName: nvidia")
            && err.contains("allow_unverified_uuids"),
        "{err}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent")).args(["cdi-spec", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Its WARN went into a pipe: plain text, no terminal colour codes (they were there).
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NVML unavailable") && !err.contains('\x1b'), "{err:?}");
}

#[test]
fn the_shipped_example_config_is_valid() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/node-agent.example.json"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["cdi-spec", "--config", cfg])
        .env("NODE_NAME", "gpu-node-1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(spec["kind"], "xshare.io/offline-gpu");
    assert_eq!(spec["devices"].as_array().unwrap().len(), 2);
}

/// `node-agent status` shows each GPU's offline slots as the running agent advertises them,
/// and why not: here GPU 0 Healthy, GPU 1's monitor Healthy but its mps-manager running no
/// control daemon, GPU 2 with no ledger. Files only (no API server, no NVML).
#[test]
fn status_says_which_gpus_take_offline_work_and_why_not() {
    use node_ledger::{HealthState, Ledger, MonitorSample};
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    for gpu in [0, 1] {
        Ledger::open_or_create(&node_ledger::config::ledger_path(&run, gpu), gpu).unwrap();
        let l = node_ledger::Status::open_or_create(&node_ledger::config::status_path(&run, gpu), gpu).unwrap();
        l.publish(&MonitorSample::default().with_health(HealthState::Healthy));
    }
    let now = node_daemon::clock::unix_ms();
    std::fs::write(
        {
            std::fs::create_dir_all(run.join("daemons/gpu1")).unwrap();
            run.join("daemons/gpu1/mps-manager.json")
        },
        serde_json::json!({"gpu": 1, "daemon_pid": null, "last_error": "recovery rate limit reached", "updated_unix_ms": now}).to_string(),
    )
    .unwrap();
    let cfg = tmp.path().join("agent.json");
    std::fs::write(
        &cfg,
        serde_json::json!({"node_name": "n", "ledger_dir": run,
            "gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}, {"index": 2, "uuid": "GPU-c"}]})
        .to_string(),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["status", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |gpu: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(gpu))
            .unwrap_or_else(|| panic!("no GPU {gpu} line in\n{text}"))
            .to_string()
    };
    assert!(line("0").split_whitespace().nth(1) == Some("Healthy"), "{text}");
    let l1 = line("1");
    assert!(
        l1.split_whitespace().nth(1) == Some("Unhealthy") && l1.contains("no MPS control daemon runs") && l1.contains("rate limit"),
        "{text}"
    );
    let l2 = line("2");
    assert!(l2.split_whitespace().nth(1) == Some("Unhealthy") && l2.contains("ledger"), "{text}");
    assert!(text.contains("offline pod list: none written"), "{text}");
    let pods = node_daemon::offline_pods::OfflinePods::new(
        "n",
        now,
        vec![node_daemon::offline_pods::OfflinePod { uid: "11111111-1111-4111-8111-111111111111".into(), namespace: "ml".into(), name: "train-0".into(), memory_quota_bytes: None }],
    );
    node_daemon::offline_pods::write(&node_daemon::offline_pods::path(&run), &pods).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent")).args(["status", "--config"]).arg(&cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("offline pod list: 1 pods, listed ") && text.contains("s ago (") && text.contains("offline-pods.json"), "{text}");
    // From an operator's shell: no $NODE_NAME, and a config that leaves node_name to it (as the
    // DaemonSet's does). `status` reads files only: it needs no node name (it required one).
    std::fs::write(&cfg, serde_json::json!({"ledger_dir": run, "gpus": [{"index": 0, "uuid": "GPU-a"}]}).to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent")).args(["status", "--config"]).arg(&cfg).env_remove("NODE_NAME").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).lines().any(|l| l.starts_with("0 ") && l.contains("Healthy")), "{}", String::from_utf8_lossy(&out.stdout));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent")).args(["run", "--config"]).arg(&cfg).env_remove("NODE_NAME").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "run still needs the node's name");
}

/// `check-config`, as sysmonitor and mps-manager have it: from an operator's shell (no
/// $NODE_NAME, no NVML), `config ok` naming the file, or the error naming file and line, exit 2.
#[test]
fn check_config_checks_a_file_from_an_operators_shell() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("node-agent.json");
    let run = |text: &str| {
        std::fs::write(&cfg, text).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_node-agent")).args(["check-config", "--config"]).arg(&cfg).env_remove("NODE_NAME").output().unwrap()
    };
    let out = run(r#"{"gpus": [{"index": 0}]}"#);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("config ok: ") && err.contains("node-agent.json"), "{err}");
    let out = run("{\"gpus\": [{\"index\": 0}],\n \"health\": {\"stale_after_ms\": 1}}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && err.contains("node-agent.json:2") && err.contains("health.stale_after_ms"), "{err}");
}
