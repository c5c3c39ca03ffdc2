//! The Kubernetes loop end to end on the emulator, on loopback (issue 9, "How to test without
//! a cluster"). Real binaries: `cluster-matcher serve --watch` (the scheduler extender),
//! `node-agent run` (device plugin, heartbeat, Eviction API), `sysmonitor` (fake NVML), the
//! `offline` and `online` clients, `libxcuda.so`. The fake parts: the API server
//! (`fake-kube`, stateful: list/watch with resourceVersions, Binding and Eviction
//! subresources with UID preconditions, a Job controller), and this test playing
//! kube-scheduler (filter/prioritize/bind over HTTP, as its extender config calls them) and
//! the kubelet (Register / ListAndWatch / Allocate over the device-plugin unix socket, then
//! starting the container's process with exactly what Allocate returned).
//!
//! Steps, each asserted: node-agent writes the online service's GPU on its pod from the
//! kubelet's PodResources API (the test plays it too) → an offline Job pod appears → filter/prioritize/bind → the node's bind
//! lock taken, Binding posted and the plan's decision on the pod → Allocate injects the shim
//! and the planned quota and gives the lock back → the offline process runs under the shim on
//! the emulated GPU and the quota holds → an online burst (the online service's own full-GPU
//! demand) → Overlimit → sysmonitor evicts →
//! node-agent posts the Eviction (policy/v1, UID precondition) once → the API server marks
//! the pod Terminating (deletionTimestamp, its grace period) and the Job controller makes a
//! new one at once → the extender replans and binds the new one while the old one is still
//! Terminating (no second eviction, not planned twice) → the kubelet confirms, the old pod
//! goes → the replacement is admitted and runs; the kubelet evicts it on its own (node
//! pressure: only its `Evicted` Event says so in time) → the extender writes it onto the pod →
//! node-agent writes it into the pod's termination file → the shim drains the GPU with no
//! SIGTERM sent.

mod workloads_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_kube::cluster::FakeCluster;
use k8s_openapi::api::core::v1::{Binding, Event};
use k8s_openapi::api::policy::v1::Eviction;
use node_agent::pb;
use serde_json::{json, Value};
use workloads_support::*;

const T: Duration = Duration::from_secs(90);
const NODE: &str = "gpu-node-1";
const HOLD_MS: u64 = 600;

/// Polls `f` until it returns `Some` (bounded by `T`).
fn eventually<R>(what: &str, mut f: impl FnMut() -> Option<R>) -> R {
    let end = Instant::now() + T;
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Children stopped (SIGTERM, then SIGKILL) and reaped when dropped.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(5);
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(name: &'static str, mut c: Command, log: &Path) -> Daemon {
    let f = std::fs::File::create(log).unwrap();
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(f)
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Daemon(child)
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &Value) -> Value {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let r = fake_kube::http::request(addr, method, path, body.as_bytes());
    assert!(r.head.starts_with("HTTP/1.1 200"), "{method} {path}: {}\n{}", r.head, r.body);
    r.json()
}

fn node_object() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
      "metadata": {"name": NODE, "creationTimestamp": "2026-11-20T08:00:00Z",
        "labels": {"kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux",
                   "xshare.io/gpu-type": "H100", "xshare.io/predictor-gpu-type": "v100"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
      "spec": {"podCIDR": "10.244.1.0/24"},
      "status": {"capacity": {"cpu": "16", "memory": "131072Mi", "xshare.io/offline-gpu": "4"},
                 "allocatable": {"cpu": "16", "memory": "131072Mi", "xshare.io/offline-gpu": "4"},
                 "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": "2026-11-23T06:00:00Z", "lastTransitionTime": "2026-11-20T08:01:00Z"}]}})
}

fn online_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "svc-0", "namespace": "prod",
        "labels": {"app": "svc", "xshare.io/role": "online"},
        "annotations": {"xshare.io/gpu": "0", "xshare.io/memory-mib": "8000",
                        "xshare.io/sm-activity-percent": "30",
                        "xshare.io/profile": "{\"isolated\": {\"v100\": 5.0}}"}},
      "spec": {"nodeName": NODE, "containers": [{"name": "svc", "image": "registry.local/svc:1"}]},
      "status": {"phase": "Running", "qosClass": "Guaranteed"}})
}

/// The pod the Job controller creates for Job `train` (generated name, Job labels, owner).
fn job_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "train-x7k2p", "generateName": "train-", "namespace": "ml",
        "labels": {"batch.kubernetes.io/job-name": "train", "job-name": "train",
                   "batch.kubernetes.io/controller-uid": "c0ffee00-0000-4000-8000-000000000001",
                   "controller-uid": "c0ffee00-0000-4000-8000-000000000001", "xshare.io/role": "offline"},
        "annotations": {"xshare.io/memory-mib": "256",
                        "xshare.io/profile": "{\"isolated\": {\"v100\": 4.0}}"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
            "uid": "c0ffee00-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": true}]},
      "spec": {"restartPolicy": "Never", "schedulerName": "xshare-scheduler",
        "containers": [{"name": "train", "image": "registry.local/train:1",
          "resources": {"limits": {"xshare.io/offline-gpu": "1"}, "requests": {"xshare.io/offline-gpu": "1"}}}]},
      "status": {"phase": "Pending", "qosClass": "BestEffort"}})
}

fn name_of(p: &Value) -> String {
    p["metadata"]["name"].as_str().unwrap().to_string()
}

fn uid_of(p: &Value) -> String {
    p["metadata"]["uid"].as_str().unwrap().to_string()
}

/// kube-scheduler's extender calls for `pod`: filter until the plan places it on our node,
/// prioritize, bind. Returns the bind answer.
fn schedule(ext: SocketAddr, pod: &Value) -> Value {
    let args = json!({"Pod": pod, "NodeNames": [NODE, "cpu-node-2"]});
    eventually("the extender's filter keeps our node", || {
        let r = http(ext, "POST", "/xshare/filter", &args);
        (r["NodeNames"] == json!([NODE])).then_some(())
    });
    let scores = http(ext, "POST", "/xshare/prioritize", &args);
    let top = scores
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|h| h["Score"].as_i64())
        .unwrap()
        .clone();
    assert_eq!(top["Host"], NODE, "{scores}");
    http(
        ext,
        "POST",
        "/xshare/bind",
        &json!({"PodName": name_of(pod), "PodNamespace": "ml", "PodUID": uid_of(pod), "Node": NODE}),
    )
}

fn read_state(run: &Path) -> Value {
    std::fs::read_to_string(node_ledger::config::daemon_dir(run, 0).join("state.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

fn heartbeat_state(cluster: &FakeCluster) -> Option<String> {
    let n = cluster.node(NODE)?;
    let text = n["metadata"]["annotations"][kube_contract::heartbeat::ANNOTATION].as_str()?;
    let hb: Value = serde_json::from_str(text).ok()?;
    hb["gpus"][0]["state"].as_str().map(String::from)
}

/// The kubelet's registration socket (served on `rt`), then `node-agent run` against `cluster`
/// for GPU 0 of `host`, its config's top-level keys overridden by `extra`. Returns the agent and
/// its registration with the kubelet.
fn start_node_agent(host: &Host, rt: &tokio::runtime::Runtime, cluster: &FakeCluster, extra: Value) -> (Daemon, pb::RegisterRequest) {
    let (root, run, bins) = (host.root().to_path_buf(), host.ledger_dir().to_path_buf(), bin_dir());
    let dp = root.join("device-plugins");
    std::fs::create_dir_all(&dp).unwrap();
    let (reg_tx, reg_rx) = std::sync::mpsc::channel();
    {
        let _g = rt.enter();
        node_agent::test_support::serve_kubelet(&dp, move |r| {
            let _ = reg_tx.send(r);
        });
    }
    let shim = bins.join("libxcuda.so");
    let agent_cfg = root.join("node-agent.json");
    let mut cfg = json!({
        "node_name": NODE,
        "ledger_dir": run,
        // No UUID here: node-agent asks NVML (the emulator's libnvidia-ml).
        "gpus": [{"index": 0}],
        "device_plugin": {"dir": dp},
        // No container here: the host paths are the paths the process sees.
        "inject": {"shim_host_path": shim, "shim_container_path": shim, "ledger_container_dir": run},
        "health": {"poll_ms": 50},
        "kube": {"api_url": cluster.url()},
        "eviction": {"poll_ms": 20, "retry_ms": 200},
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        cfg[k] = v.clone();
    }
    std::fs::write(&agent_cfg, cfg.to_string()).unwrap();
    let mut c = Command::new(bins.join("node-agent"));
    c.args(["run", "--config"])
        .arg(&agent_cfg)
        .envs(host.env().iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "info");
    let agent = daemon("node-agent", c, &root.join("node-agent.log"));
    let reg = reg_rx.recv_timeout(T).expect("node-agent never registered with the kubelet");
    (agent, reg)
}

#[test]
fn offline_pod_is_planned_bound_allocated_run_evicted_through_the_api_and_replanned() {
    for f in ["sysmonitor", "libxcuda.so", "node-agent", "cluster-matcher", "shim_client"] {
        assert!(
            bin_dir().join(f).exists(),
            "{} is not built: run `cargo build --workspace --all-targets` first",
            bin_dir().join(f).display()
        );
    }
    let host = host("h100");
    let root = host.root().to_path_buf();
    let run = host.ledger_dir().to_path_buf();
    let bins = bin_dir();

    // --- the node: sysmonitor on the emulated GPU.
    let _monitor = host.start_monitor("sysmonitor.json", &node_monitor_config(HOLD_MS));
    eventually("sysmonitor Healthy", || (read_state(&run)["state"] == "healthy").then_some(()));

    // --- the API server, with the GPU node and the online service already running on GPU 0,
    // which the kubelet gave it through NVIDIA's device plugin: no `xshare.io/gpu` on the pod
    // (nobody can write it before the kubelet picks the GPU); node-agent writes it from the
    // kubelet's PodResources API, else the extender plans nothing beside the service.
    let cluster = FakeCluster::start();
    cluster.add_node(node_object());
    let mut online = online_pod();
    online["metadata"]["annotations"].as_object_mut().unwrap().remove("xshare.io/gpu");
    online["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    cluster.add_pod(online);

    // --- the kubelet's registration socket, then node-agent.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dp = root.join("device-plugins");
    let shim = bins.join("libxcuda.so");
    // The kubelet's PodResources API: what it lists is filled in once NVML's UUID is known.
    let pod_resources = root.join("pod-resources.sock");
    let kubelet_pods = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let _g = rt.enter();
        node_agent::test_support::serve_pod_resources(&pod_resources, kubelet_pods.clone());
    }
    let online_gpus = json!({"pod_resources_socket": pod_resources, "poll_ms": 1000});
    let (_agent, reg) = start_node_agent(&host, &rt, &cluster, json!({"online_gpus": online_gpus}));
    assert_eq!(reg.resource_name, "xshare.io/offline-gpu");

    // Its heartbeat reaches the Node: GPU 0 Healthy, with NVML's UUID.
    eventually("the node-agent heartbeat on the Node", || {
        (heartbeat_state(&cluster).as_deref() == Some("Healthy")).then_some(())
    });
    let hb: Value = serde_json::from_str(
        cluster.node(NODE).unwrap()["metadata"]["annotations"][kube_contract::heartbeat::ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let uuid = hb["gpus"][0]["uuid"].as_str().unwrap().to_string();
    assert!(uuid.starts_with("GPU-"), "{hb}");
    // The kubelet admitted the online service on GPU 0 (device ID: the GPU's UUID); node-agent
    // writes it on the pod.
    kubelet_pods.lock().unwrap().push(node_agent::podresources_pb::PodResources {
        name: "svc-0".into(),
        namespace: "prod".into(),
        containers: vec![node_agent::podresources_pb::ContainerResources {
            name: "svc".into(),
            devices: vec![node_agent::podresources_pb::ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec![uuid.clone()],
            }],
        }],
    });
    eventually("node-agent writes the online pod's GPU from the kubelet's PodResources", || {
        (cluster.pod("prod", "svc-0").unwrap()["metadata"]["annotations"]["xshare.io/gpu"] == "0").then_some(())
    });

    // --- the extender, watching the API server.
    let cm_cluster = root.join("cluster.json");
    std::fs::write(&cm_cluster, r#"{"round_period_s": 86400, "nodes": []}"#).unwrap();
    std::fs::write(root.join("workloads.json"), "{}").unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cluster-matcher/examples/speed-predictor.json");
    let mut ext_child = Command::new(bins.join("cluster-matcher"))
        .args(["serve", "--watch", "--listen", "127.0.0.1:0", "--kube-api", &cluster.url()])
        .arg("--cluster")
        .arg(&cm_cluster)
        .arg("--workloads")
        .arg(root.join("workloads.json"))
        .arg("--model")
        .arg(&model)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(ext_child.stderr.take().unwrap());
    let ext_addr: SocketAddr = loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "cluster-matcher exited before listening");
        if let Some(a) = line.trim().strip_prefix("cluster-matcher: extender listening on http://") {
            break a.parse().unwrap();
        }
    };
    let ext_log = root.join("cluster-matcher.log");
    let mut ext_log_f = std::fs::File::create(&ext_log).unwrap();
    std::thread::spawn(move || std::io::copy(&mut err, &mut ext_log_f));
    let _ext = Daemon(ext_child);

    // --- 1. An offline Job pod appears; kube-scheduler asks the extender; it binds.
    let pod = cluster.add_pod(job_pod());
    let bound = schedule(ext_addr, &pod);
    assert_eq!(bound["Error"], "", "{bound}");
    let bindings = cluster.bindings();
    assert_eq!(bindings.len(), 1, "{bindings:?}");
    let b: Binding = serde_json::from_value(bindings[0].clone()).unwrap();
    assert_eq!(b.target.name.as_deref(), Some(NODE));
    assert_eq!(b.metadata.uid.as_deref(), Some(uid_of(&pod).as_str()));
    let p = cluster.pod("ml", "train-x7k2p").unwrap();
    assert_eq!(p["spec"]["nodeName"], NODE);
    let ann = &p["metadata"]["annotations"];
    assert_eq!(ann["xshare.io/gpu"], "0", "{ann}");
    let quota: u64 = ann["xshare.io/memory-quota-bytes"].as_str().unwrap().parse().unwrap();
    let sm: f64 = ann["xshare.io/sm-percent"].as_str().unwrap().parse().unwrap();
    // The plan's quota: at least the job's declared memory, within the GPU's (80 GiB).
    assert!((256 << 20..=80 << 30).contains(&quota), "{ann}");
    assert!(sm > 0.0 && sm <= 100.0, "{ann}");
    // The bind took the node's bind lock for the pod: no other offline pod is bound here
    // until its Allocate.
    let lock = |c: &FakeCluster| {
        c.node(NODE).unwrap()["metadata"]["annotations"][kube_contract::bind_lock::ANNOTATION]
            .as_str()
            .map(|v| kube_contract::bind_lock::BindLock::parse(v).unwrap())
    };
    assert_eq!(lock(&cluster).map(|l| l.uid), Some(uid_of(&pod)));

    // --- 2. The kubelet admits the pod: ListAndWatch, then Allocate one slot.
    let sock = dp.join("xshare-offline-gpu.sock");
    let allocate = || rt.block_on(async {
        let ch = node_agent::plugin::unix_channel(sock.clone()).await.unwrap();
        let mut cl = pb::device_plugin_client::DevicePluginClient::new(ch);
        let mut devs = cl.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
        let first = devs.message().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 4, "{first:?}");
        assert!(first.devices.iter().all(|d| d.health == "Healthy"), "{first:?}");
        let req = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: vec![first.devices[0].id.clone()],
            }],
        };
        cl.allocate(req).await.unwrap().into_inner()
    });
    let alloc = allocate();
    let resp = &alloc.container_responses[0];
    let env = &resp.envs;
    let want_mps = (sm.ceil() as u32).clamp(1, 100).to_string();
    assert_eq!(env["LD_PRELOAD"], shim.display().to_string());
    assert_eq!(env["XCUDA_QUOTA_BYTES"], quota.to_string());
    assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], want_mps);
    assert_eq!(env["XCUDA_GROUP"], format!("k8s-pod-{}", uid_of(&pod)));
    assert_eq!(env["XSHARE_LEDGER_DIR"], run.display().to_string());
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], uuid);
    assert!(resp.mounts.iter().any(|m| m.host_path == shim.display().to_string() && m.read_only));
    // The pod's own ledger of GPU 0, made by Allocate and mounted alone where the shim looks;
    // the GPU's shared ledger directory is mounted nowhere.
    let pod_uid = node_ledger::PodUid::parse(&uid_of(&pod)).unwrap();
    let pod_ledger = node_ledger::pods::pod_ledger_path(&run, pod_uid, 0);
    assert!(resp.mounts.iter().any(|m| Path::new(&m.host_path) == pod_ledger && Path::new(&m.container_path) == run.join("gpu0/ledger") && !m.read_only), "{:?}", resp.mounts);
    assert!(!resp.mounts.iter().any(|m| Path::new(&m.host_path) == run.join("gpu0")), "{:?}", resp.mounts);
    // Beside it the pod's termination file, empty until node-agent sees the pod's deletion,
    // mounted read-only and named to the shim.
    let termination = node_ledger::termination::termination_path(&run, pod_uid);
    assert_eq!(node_ledger::termination::read(&termination), Ok(None));
    assert!(resp.mounts.iter().any(|m| Path::new(&m.host_path) == termination && Path::new(&m.container_path) == run.join("termination") && m.read_only), "{:?}", resp.mounts);
    assert_eq!(env["XCUDA_TERMINATION_FILE"], run.join("termination").display().to_string());
    // Its only container allocated, node-agent gave the lock back.
    eventually("node-agent gives the bind lock back", || lock(&cluster).is_none().then_some(()));
    cluster.set_pod_phase("ml", "train-x7k2p", "Running");

    // --- 3. The container's process: exactly Allocate's env, and (as root) its mounts, made as
    // a runtime makes them in a mount namespace of its own (container paths are host paths
    // here): the pod's ledger file over the GPU's. The runtime's part: the emulator.
    let mounted = !e2e::lacks_root("make mount namespaces: the container sees the GPU's ledger, not its pod's");
    let container_of = |resp: &pb::ContainerAllocateResponse, program: &str| {
        let env = &resp.envs;
        let mut c = if mounted {
            // The shim is preloaded into the container's program only, after the mounts.
            let mounts_script = e2e::allocate_mounts_script(resp.mounts.iter().map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.read_only)), &run);
            let prog = host.command(program).get_program().to_owned();
            let mut c = host.command("unshare");
            let script = format!("{mounts_script}export LD_PRELOAD='{}'\nexec \"$@\"\n", env["LD_PRELOAD"]);
            c.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"]).arg(prog);
            c
        } else {
            host.command(program)
        };
        for (k, v) in env.iter().filter(|(k, _)| !mounted || k.as_str() != "LD_PRELOAD") {
            c.env(k, v);
        }
        if !mounted {
            // No mounts: the pod's own files where they lie on the host.
            for m in resp.mounts.iter().filter(|m| m.container_path == run.join("termination").display().to_string()) {
                c.env("XCUDA_TERMINATION_FILE", &m.host_path);
            }
        }
        c
    };
    let container = |program: &str| container_of(resp, program);
    let mut off = {
        let mut c = container("offline");
        c.args(["--json", "--blocks", "40", "--kernel-us", "20000", "--report-interval", "0.2", "--state-mb", "64"]);
        Proc::spawn(c)
    };
    off.wait_line("iters_per_s", T);
    eventually("the offline process registered in the ledger", || {
        (read_state(&run)["offline_registered"] == 1).then_some(())
    });
    if mounted {
        // In its pod's ledger, and nothing in the GPU's, which no offline pod writes.
        let procs = node_ledger::Ledger::open_existing(&pod_ledger).unwrap().procs();
        assert_eq!(procs.len(), 1, "{procs:?}");
        assert!(node_ledger::Ledger::open_existing(&run.join("gpu0/ledger")).unwrap().procs().is_empty());
    }
    // The quota the plan chose holds: a second process of the pod cannot take it all again.
    let probe = |bytes: u64| -> String {
        let mut c = container("shim_client");
        c.args(["ctx", "alloc", &bytes.to_string(), "exit"]);
        let out = run_bounded(c, "", T);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines()
            .find_map(|l| e2e::field(l, "alloc").map(String::from))
            .unwrap_or_else(|| panic!("no alloc result: {text} {}", String::from_utf8_lossy(&out.stderr)))
    };
    assert_eq!(probe(16 << 20), "0", "a small allocation within the quota");
    assert_ne!(probe(quota), "0", "an allocation over the pod's planned quota is refused");

    // --- 4. The online service's own burst on every SM: Overlimit, the monitor evicts.
    let burst = {
        let mut c = host.command("online");
        c.args(["--json", "--rate", "400", "--duration", "1.5", "--kernels", "4", "--kernel-us", "2000", "--blocks", "132"]);
        run_bounded(c, "", T)
    };
    assert!(burst.status.success(), "{}", String::from_utf8_lossy(&burst.stderr));
    let (st, lines) = off.stop(0, T);
    assert!(st.success(), "offline exits through its SIGTERM path: {st:?} {lines:?}");
    let fin = final_summary(&lines);
    assert_eq!(fin["signal"], libc::SIGTERM, "{fin}");
    let v = read_state(&run);
    assert_eq!(v["evictions"]["overlimit"], 1, "{v:#}");

    // --- 5. node-agent posts the Eviction; the API server deletes the pod; the Job
    // controller makes a new one.
    let evictions = eventually("the Eviction reaching the API server", || {
        let e = cluster.evictions();
        (!e.is_empty()).then_some(e)
    });
    let e: Eviction = serde_json::from_value(evictions[0].clone()).unwrap();
    assert_eq!(e.metadata.name.as_deref(), Some("train-x7k2p"));
    assert_eq!(e.metadata.namespace.as_deref(), Some("ml"));
    let pre = e.delete_options.unwrap().preconditions.unwrap();
    assert_eq!(pre.uid.as_deref(), Some(uid_of(&pod).as_str()));
    // Graceful deletion, as a real API server does it: the pod stays, Terminating, until the
    // kubelet confirms (below) or its grace (terminationGracePeriodSeconds, default 30 s) ends.
    let terminating = cluster.pod("ml", "train-x7k2p").expect("the evicted pod stays while Terminating");
    assert!(terminating["metadata"]["deletionTimestamp"].is_string(), "{terminating}");
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 30, "{terminating}");
    // node-agent's pod watch writes the deletion into the pod's termination file.
    let deletion: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time = serde_json::from_value(terminating["metadata"]["deletionTimestamp"].clone()).unwrap();
    let written = eventually("node-agent writes the pod's deletion into its termination file", || {
        node_ledger::termination::read(&termination).ok().flatten()
    });
    assert_eq!(written, node_ledger::termination::Termination { deletion_unix_ms: deletion.0.as_millisecond() as u64, grace_ms: 30_000 });
    let events: Vec<Event> = cluster
        .events()
        .into_iter()
        .map(|e| serde_json::from_value(e).unwrap())
        .collect();
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some(kube_contract::EVICTION_EVENT_REASON)
            && e.involved_object.uid.as_deref() == Some(uid_of(&pod).as_str())),
        "{events:?}"
    );
    let next = eventually("the Job's replacement pod", || {
        cluster.pods().into_iter().find(|p| {
            p["metadata"]["labels"]["job-name"] == "train" && p["metadata"]["name"] != "train-x7k2p"
        })
    });
    assert!(next["spec"]["nodeName"].is_null(), "{next}");
    assert_ne!(uid_of(&next), uid_of(&pod));

    // --- 6. The extender replans: the new pod is placed and bound once the GPU is Healthy
    // (the old pod, Terminating meanwhile, is no placement of the job's).
    let bound = schedule(ext_addr, &next);
    assert_eq!(bound["Error"], "", "{bound}");
    let bindings = cluster.bindings();
    assert_eq!(bindings.len(), 2, "{bindings:?}");
    let b: Binding = serde_json::from_value(bindings[1].clone()).unwrap();
    assert_eq!(b.metadata.uid.as_deref(), Some(uid_of(&next).as_str()));
    assert_eq!(cluster.pod("ml", &name_of(&next)).unwrap()["spec"]["nodeName"], NODE);
    let old = cluster.pod("ml", "train-x7k2p");
    assert!(
        old.as_ref().is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string()),
        "the replacement was planned and bound while the old pod was still Terminating: {old:?}"
    );
    // The kubelet confirms the old pod's containers stopped: it goes; no second replacement.
    assert!(cluster.kubelet_confirm_stopped("ml", "train-x7k2p", &uid_of(&pod)));
    assert!(cluster.pod("ml", "train-x7k2p").is_none());
    let train_pods: Vec<String> = cluster
        .pods()
        .iter()
        .filter(|p| p["metadata"]["labels"]["job-name"] == "train")
        .map(name_of)
        .collect();
    assert_eq!(train_pods, [name_of(&next)]);

    // --- 7. The replacement is admitted and runs; then the kubelet evicts it on its own (node
    // pressure): no deletion, and the pod's status says nothing until its containers ended;
    // only the kubelet's `Evicted` Event, recorded just before the kill, does. The extender's
    // watch of those writes it onto the pod (`xshare.io/kubelet-eviction`), node-agent's pod
    // watch into the pod's termination file, and the shim drains the GPU at once
    // (`kubelet_eviction_grace_ms` 0: a hard threshold kills 2 s later), with no SIGTERM sent:
    // the kubelet's signal may reach PID 1 only.
    let next_name = name_of(&next);
    eventually("the GPU Healthy for the replacement", || (read_state(&run)["state"] == "healthy").then_some(()));
    let alloc2 = allocate();
    let resp2 = &alloc2.container_responses[0];
    assert_eq!(resp2.envs["XCUDA_GROUP"], format!("k8s-pod-{}", uid_of(&next)));
    let termination2 = node_ledger::termination::termination_path(&run, node_ledger::PodUid::parse(&uid_of(&next)).unwrap());
    assert_eq!(node_ledger::termination::read(&termination2), Ok(None));
    cluster.set_pod_phase("ml", &next_name, "Running");
    let shim_log = root.join("replacement-shim.log");
    let mut off2 = {
        let mut c = container_of(resp2, "offline");
        c.args(["--json", "--blocks", "40", "--kernel-us", "20000", "--report-interval", "0.2", "--state-mb", "64"]);
        c.env("XCUDA_LOG", "info").stderr(std::fs::File::create(&shim_log).unwrap());
        Proc::spawn(c)
    };
    off2.wait_line("iters_per_s", T);
    assert!(!std::fs::read_to_string(&shim_log).unwrap().contains("GPU drained"), "nothing to drain for yet");
    const PRESSURE: &str = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 92Mi. ";
    cluster.kubelet_evict("ml", &next_name, PRESSURE);
    let by_kubelet = eventually("node-agent writes the kubelet's eviction into the termination file", || {
        node_ledger::termination::read(&termination2).ok().flatten()
    });
    assert_eq!(by_kubelet.grace_ms, 0, "{by_kubelet:?}");
    let evicted = cluster.pod("ml", &next_name).unwrap();
    assert!(evicted["metadata"]["deletionTimestamp"].is_null(), "no deletion");
    assert!(evicted["metadata"]["annotations"][kube_contract::kubelet_eviction::ANNOTATION].is_string(), "{evicted}");
    let log = eventually("the replacement's shim drains by the kubelet's eviction", || {
        std::fs::read_to_string(&shim_log).ok().filter(|l| l.contains("GPU drained"))
    });
    assert!(log.contains("armed_by=\"the pod's termination file\"") || log.contains("armed_by=the pod's termination file"), "armed by the file: {log}");
    // The kubelet's SIGKILL finds it drained; then the pod's status says it.
    let (st, _) = off2.stop(libc::SIGKILL, T);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGKILL), "{st:?}");
    cluster.kubelet_evicted_pod_stopped("ml", &next_name, PRESSURE);
    assert_eq!(node_ledger::termination::read(&termination2), Ok(Some(by_kubelet)), "nothing more written");

    // The eviction was posted once, never again.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cluster.evictions().len(), 1);
    let posted: Vec<PathBuf> = cluster
        .api
        .all()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/eviction"))
        .map(|r| PathBuf::from(&r.path))
        .collect();
    assert_eq!(posted, [PathBuf::from("/api/v1/namespaces/ml/pods/train-x7k2p/eviction")]);
}

/// An offline pod whose container runs its GPU work without the shim (a launcher that clears
/// `LD_PRELOAD`, a static CUDA runtime) registers nothing in the ledger: the monitor took its
/// process for the online service's load. node-agent lists the node's offline pods for the
/// monitor (`offline-pods.json`), sysmonitor finds the process by its cgroup and SIGTERMs it,
/// and node-agent posts the pod's Eviction (UID precondition) from the logged record, once.
/// The online service's pod and process are left alone. Root only (a real pod cgroup).
#[test]
fn an_offline_pod_running_without_the_shim_is_found_by_its_cgroup_and_evicted_through_the_api() {
    if e2e::lacks_root("make the pod's cgroup") {
        return;
    }
    for f in ["sysmonitor", "node-agent"] {
        assert!(bin_dir().join(f).exists(), "{} is not built", bin_dir().join(f).display());
    }
    let host = host("h100");
    let run = host.ledger_dir().to_path_buf();
    let cfg = node_monitor_config(HOLD_MS).replace(
        r#""verify": { "enabled": false }"#,
        r#""verify": { "every_ms": 50, "strikes": 2 }"#,
    );
    assert!(cfg.contains("\"strikes\": 2"), "{cfg}");
    let _monitor = host.start_monitor("sysmonitor.json", &cfg);
    eventually("sysmonitor Healthy", || (read_state(&run)["state"] == "healthy").then_some(()));

    let cluster = FakeCluster::start();
    cluster.add_node(node_object());
    let online = cluster.add_pod(online_pod());
    let mut job = job_pod();
    job["spec"]["nodeName"] = NODE.into();
    job["status"]["phase"] = "Running".into();
    let pod = cluster.add_pod(job);
    let uid = uid_of(&pod);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (_agent, _reg) = start_node_agent(&host, &rt, &cluster, json!({"offline_pods": {"poll_ms": 1000}}));
    let listed = eventually("node-agent's offline pod list", || {
        node_daemon::offline_pods::read(&node_daemon::offline_pods::path(&run)).ok().flatten()
    });
    let uids: Vec<&str> = listed.pods.iter().map(|p| p.uid.as_str()).collect();
    assert_eq!(uids, [uid.as_str()], "only the offline pod, not {}", uid_of(&online));

    // The pod's container and the online service's, each in its pod's cgroup; no shim in either.
    let off_cg = e2e::PodCgroup::create(&uid).expect("the offline pod's cgroup");
    let on_cg = e2e::PodCgroup::create(&uid_of(&online)).expect("the online pod's cgroup");
    let container = |program: &str, args: &[&str]| {
        let mut c = host.command(program);
        c.args(args).env_remove("LD_PRELOAD");
        Proc::spawn(c)
    };
    let mut svc = container("online", &["--json", "--rate", "20", "--duration", "60", "--kernels", "1", "--kernel-us", "200", "--blocks", "8"]);
    on_cg.add(svc.child.id()).unwrap();
    let mut off = container("offline", &["--json", "--blocks", "8", "--kernel-us", "2000", "--report-interval", "0.2", "--state-mb", "64"]);
    off_cg.add(off.child.id()).unwrap();
    off.wait_line("iters_per_s", T);

    let (st, _) = off.stop(0, T);
    use std::os::unix::process::ExitStatusExt as _;
    assert!(st.success() || st.signal() == Some(libc::SIGTERM), "the unshimmed process ends on the monitor's SIGTERM: {st:?}");
    let v = read_state(&run);
    assert_eq!(v["evictions"]["under_report"], 1, "{v:#}");
    assert_eq!(v["offline_registered"], 0, "nothing registered: {v:#}");
    let evictions = eventually("the Eviction reaching the API server", || {
        let e = cluster.evictions();
        (!e.is_empty()).then_some(e)
    });
    let e: Eviction = serde_json::from_value(evictions[0].clone()).unwrap();
    assert_eq!((e.metadata.namespace.as_deref(), e.metadata.name.as_deref()), (Some("ml"), Some("train-x7k2p")));
    assert_eq!(e.delete_options.unwrap().preconditions.unwrap().uid.as_deref(), Some(uid.as_str()));
    assert!(matches!(svc.child.try_wait(), Ok(None)), "the online service's process was evicted");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cluster.evictions().len(), 1, "one Eviction, never again");
    drop(svc);
}
