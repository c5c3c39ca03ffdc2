//! A process outside any pod's ledger group (its `XCUDA_GROUP` set by hand, or started
//! outside the device plugin's Allocate) is mapped to its pod by its cgroup path, also when it
//! runs in a pid namespace of its own, as a container does: the agent finds its pid here from
//! its namespace and its pid there, and reads that process's cgroup.
//!
//! A real process: put in a pod-shaped cgroup (`kubepods/besteffort/pod<uid>/<container>`,
//! the cgroupfs driver's layout), started in a new pid namespace with its own `/proc`
//! (`unshare --pid --fork --mount-proc`), registered in the ledger under a group of no pod,
//! asked to leave as sysmonitor asks. Needs root for `unshare` and a writable cgroup hierarchy;
//! says so and passes vacuously otherwise.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pod_list, status, FakeApi, Recorded};
use node_agent::config::KubeConfig;
use node_agent::evict::{Evictor, Outcome};
use node_ledger::config::ledger_path;
use node_ledger::ledger::group_id_for;
use node_ledger::Ledger;

const CHILD_ENV: &str = "NODE_AGENT_CGROUP_CHILD";
const POD_UID: &str = "66666666-6666-4666-8666-666666666666";

/// The registrant (run by the test below through this same test binary, pid 1 of its own pid
/// namespace): registers itself under a group no pod has, is asked to leave as sysmonitor's
/// `mark_evicting` asks (a request in the status file addressed to it), says so, and sleeps
/// until killed.
#[test]
fn child_registers_outside_any_pod_group_and_waits() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let l = Ledger::open_existing(path.as_ref()).expect("child: open ledger");
    let g = l.group(group_id_for("set-by-hand"), 1 << 40).expect("child: group");
    l.register(std::process::id(), g).expect("child: register");
    let status_path = node_ledger::config::status_path(std::path::Path::new(&path).parent().and_then(|p| p.parent()).expect("child: ledger dir"), 0);
    let status = node_ledger::Status::open_or_create(&status_path, 0).expect("child: status file");
    assert!(status.request_evict(node_ledger::Requester::Monitor, node_ledger::ProcId::own().expect("child: own id"), None, 15));
    println!("ready pid={}", std::process::id());
    std::thread::sleep(Duration::from_secs(600));
}

fn is_root() -> bool {
    // SAFETY: getuid(2) has no preconditions.
    unsafe { libc::getuid() == 0 }
}

/// A cgroup hierarchy this process may make groups in: cgroup v2 at `/sys/fs/cgroup` (or the
/// hybrid layout's `unified`), else v1's `pids` controller.
fn cgroup_root() -> Option<PathBuf> {
    let v2 = Path::new("/sys/fs/cgroup");
    let candidates = [v2.to_path_buf(), v2.join("unified"), v2.join("pids")];
    candidates.into_iter().find(|c| {
        c.join("cgroup.procs").exists() && {
            let probe = c.join(format!("xshare-probe-{}", std::process::id()));
            let ok = std::fs::create_dir(&probe).is_ok();
            let _ = std::fs::remove_dir(&probe);
            ok
        }
    })
}

/// Removes the pod-shaped cgroups made for the test (the leaf first), once the child is gone.
struct Cgroups(Vec<PathBuf>);

impl Drop for Cgroups {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            // A group empties a moment after its last process is reaped.
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_process_outside_a_pod_group_is_mapped_by_its_cgroup() {
    if !is_root() {
        eprintln!("skipped: needs root for unshare and to make cgroups");
        return;
    }
    let Some(root) = cgroup_root() else {
        eprintln!("skipped: no writable cgroup hierarchy");
        return;
    };
    let tag = format!("xshare-test-{}", std::process::id());
    let pod_dir = root.join(&tag).join("besteffort").join(format!("pod{POD_UID}"));
    let leaf = pod_dir.join("c0ffee");
    let _cgroups = Cgroups(vec![
        root.join(&tag),
        root.join(&tag).join("besteffort"),
        pod_dir.clone(),
        leaf.clone(),
    ]);
    std::fs::create_dir_all(&leaf).expect("make the pod-shaped cgroup");

    let tmp = tempfile::tempdir().unwrap();
    let path = ledger_path(tmp.path(), 0);
    let _monitor = Ledger::open_or_create(&path, 0).unwrap();
    // The shell joins the container's cgroup and becomes unshare, whose child inherits it.
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" && exec unshare --pid --fork --kill-child --mount-proc "$2" --exact child_registers_outside_any_pod_group_and_waits --nocapture --test-threads=1"#)
        .arg("sh")
        .arg(&leaf)
        .arg(&exe)
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sh");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !line.contains("ready") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the registrant did not get ready (unshare refused?)");
        }
    }
    assert!(line.contains("ready pid=1"), "pid 1 of its own namespace: {line}");

    let api = FakeApi::start(Arc::new(move |r: &Recorded| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/api/v1/pods") => {
            let mut p = common::offline_pod("by-cgroup", POD_UID, "node-a", Some(0), "2026-01-01T00:00:00Z");
            p["status"]["phase"] = "Running".into();
            (200, pod_list(vec![p]))
        }
        ("POST", "/api/v1/namespaces/batch/pods/by-cgroup/eviction") => (
            201,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        ),
        ("POST", "/api/v1/namespaces/batch/events") => (201, r.json()),
        _ => (404, status(404, "NotFound", "no such path")),
    }))
    .await;
    let client = node_agent::kube::client(&KubeConfig { api_url: api.url(), timeout_ms: 2000 })
        .await
        .unwrap();
    let mut ev = Evictor::new(client, "node-a", tmp.path(), vec![0], kube_contract::OFFLINE_GPU_RESOURCE, Duration::from_millis(200));
    let got: Vec<_> = ev.tick().await.into_iter().map(|(p, o)| (p.name, p.uid, o)).collect();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        got,
        [("by-cgroup".to_string(), POD_UID.to_string(), Outcome::Evicted)],
        "the namespaced process's pod, from its cgroup (unmapped: {})",
        ev.unmapped
    );
    let evictions: Vec<_> = api
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .map(|r| r.json()["deleteOptions"]["preconditions"]["uid"].clone())
        .collect();
    assert_eq!(evictions, [serde_json::json!(POD_UID)], "one Eviction, with the pod's UID as precondition");
}
