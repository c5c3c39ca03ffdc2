//! What Allocate injects is what the shim reads: the container's environment, given to the
//! shim's own parser (xcuda-shim's `Config::apply_env`), yields the plan's memory quota, the
//! pod's quota group (the one the eviction side maps back to the pod), the pod's own ledger of
//! the planned GPU (or, with `inject.pod_ledgers` off, the GPU's, inside the mounted
//! directory), and an MPS percentage the shim keeps as set.
//! A misspelt variable would leave the shim on its default quota (40 % of the GPU), silently.

use std::path::{Path, PathBuf};

use node_agent::allocate::{container_response, group_name, PodPlan};
use node_agent::config::AgentConfig;
use node_ledger::ledger::group_id_for;

fn check(cdi: bool, pod_ledgers: bool) {
    let d = tempfile::tempdir().unwrap();
    let text = serde_json::json!({
        "node_name": "n1",
        "ledger_dir": d.path(),
        "gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 3, "uuid": "GPU-d"}],
        "cdi": {"enabled": cdi},
        "inject": {"ledger_container_dir": "/run/xshare", "pod_ledgers": pod_ledgers},
    })
    .to_string();
    let cfg = AgentConfig::from_text(Path::new("c.json"), &text, |_| None).unwrap();
    let plan = PodPlan {
        namespace: "batch".into(),
        name: "train-0".into(),
        uid: "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b".into(),
        gpu: 3,
        mps_percent: 35,
        memory_quota_bytes: 3 << 30,
        kill_grace_ms: Some(90_000),
    };
    let resp = container_response(&cfg, &plan).unwrap();
    let mut env = resp.envs.clone();
    let mut mounts: Vec<(String, String)> = resp
        .mounts
        .iter()
        .map(|m| (m.host_path.clone(), m.container_path.clone()))
        .collect();
    if cdi {
        // The runtime applies the CDI device's edits from the spec.
        let spec = node_agent::allocate::cdi_spec(&cfg);
        let name = resp.cdi_devices[0]
            .name
            .rsplit('=')
            .next()
            .unwrap()
            .to_string();
        let dev = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name.as_str())
            .unwrap();
        for kv in dev["containerEdits"]["env"].as_array().unwrap() {
            let (k, v) = kv.as_str().unwrap().split_once('=').unwrap();
            env.insert(k.into(), v.into());
        }
        for m in dev["containerEdits"]["mounts"].as_array().unwrap() {
            mounts.push((
                m["hostPath"].as_str().unwrap().into(),
                m["containerPath"].as_str().unwrap().into(),
            ));
        }
    }
    let get = |k: &str| env.get(k).cloned();
    let mut shim = xcuda::config::Config::default();
    let errs = shim.apply_env(&get);
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(
        shim.memory.quota_bytes,
        Some(3 << 30),
        "the plan's quota, not the default fraction"
    );
    assert_eq!(shim.group, group_name(&plan.uid));
    assert_eq!(
        group_id_for(&shim.group),
        group_id_for(&group_name(&plan.uid))
    );
    assert_eq!(shim.gpu_index, 3);
    assert_eq!(shim.exit.kill_grace_ms, 90_000, "the shim drains the GPU before the kubelet's SIGKILL");
    // The shim's ledger path is a mounted file (the pod's own ledger, made by Allocate), or lies
    // inside a mounted directory (the GPU's, shared).
    let ledger = shim.ledger().ledger_path();
    assert_eq!(ledger, PathBuf::from("/run/xshare/gpu3/ledger"));
    let (host, ctr) = mounts
        .iter()
        .filter(|(_, c)| ledger.starts_with(c))
        .max_by_key(|(_, c)| c.len())
        .expect("ledger not under any mount");
    let rel = ledger.strip_prefix(ctr).unwrap();
    let host = if rel.as_os_str().is_empty() { PathBuf::from(host) } else { Path::new(host).join(rel) };
    if pod_ledgers {
        let uid = node_ledger::PodUid::parse(&plan.uid).unwrap();
        assert_eq!(host, node_ledger::pods::pod_ledger_path(&cfg.ledger_dir, uid, 3));
        let l = node_ledger::Ledger::open_existing(&host).expect("Allocate made the pod's ledger");
        assert_eq!(l.gpu_index(), 3);
        assert_eq!(l.access().unwrap().0, 0o666, "writable by the pod's processes of any user");
        assert!(!mounts.iter().any(|(h, _)| Path::new(h) == cfg.ledger_dir.join("gpu3")), "the GPU's shared ledger directory is not mounted: {mounts:?}");
    } else {
        assert_eq!(host, node_ledger::config::ledger_path(&cfg.ledger_dir, 3));
    }
    // The shim library LD_PRELOAD names is mounted.
    assert!(mounts.iter().any(|(_, c)| *c == env["LD_PRELOAD"]));
    // The plan's MPS percentage is the user's to the shim: kept while within the process's
    // start share (35 % decided under a 90 % budget), lowered to the share only above it.
    assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "35");
    assert_eq!(xcuda::budget::user_mps_value(&get).as_deref(), Some("35"));
    assert_eq!(xcuda::budget::mps_env_value(&get, Some(35)), None);
    assert_eq!(xcuda::budget::mps_env_value(&get, Some(20)), Some("20".into()));
}

#[test]
fn inline_env_is_what_the_shim_reads() {
    check(false, true);
    check(false, false);
}

#[test]
fn cdi_edits_plus_env_are_what_the_shim_reads() {
    check(true, true);
    check(true, false);
}
