//! Eviction through the API: ledger eviction requests (as sysmonitor records them) are mapped
//! to pods and posted as `policy/v1` Evictions with a UID precondition, against a loopback API
//! server answering real-shaped JSON; requests are parsed back into k8s-openapi types and
//! checked against the documented paths. 201 / 429 (PDB) / 404 / 409 / unreachable.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{pod_list, status, FakeApi, Recorded};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::policy::v1::Eviction;
use node_agent::allocate::group_name;
use node_agent::config::KubeConfig;
use node_agent::evict::{Evictor, Outcome};
use node_ledger::config::ledger_path;
use node_ledger::ledger::group_id_for;
use node_ledger::Ledger;

const UIDS: [(&str, &str); 5] = [
    ("ok", "11111111-1111-4111-8111-111111111111"),
    ("pdb", "22222222-2222-4222-8222-222222222222"),
    ("gone", "33333333-3333-4333-8333-333333333333"),
    ("replaced", "44444444-4444-4444-8444-444444444444"),
    ("dying", "55555555-5555-4555-8555-555555555555"),
];

fn running_pod(name: &str, uid: &str) -> serde_json::Value {
    let mut p = common::offline_pod(name, uid, "node-a", Some(0), "2026-01-01T00:00:00Z");
    p["status"]["phase"] = "Running".into();
    if name == "dying" {
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:10:00Z".into();
        p["metadata"]["deletionGracePeriodSeconds"] = 30.into();
    }
    p
}

/// The API server's answer to a request the test does not script: an Event is created (the
/// request's body), anything else is not found.
fn events_or_not_found(r: &Recorded) -> (u16, serde_json::Value) {
    match (r.method.as_str(), r.path.as_str()) {
        ("POST", "/api/v1/namespaces/batch/events") => (201, r.json()),
        _ => (404, status(404, "NotFound", "no such path")),
    }
}

fn success() -> serde_json::Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// Registers this test process once per pod group in GPU 0's ledger and asks it to leave, as
/// sysmonitor's `mark_evicting` does (a request in the monitor's table of the GPU's status
/// file, addressed to the process: every registration of it is asked).
fn ledger_with_requests(dir: &Path, names: &[&str]) -> Ledger {
    let l = Ledger::open_or_create(&ledger_path(dir, 0), 0).unwrap();
    for (name, uid) in UIDS.iter().filter(|(n, _)| names.contains(n)) {
        let g = l.group(group_id_for(&group_name(uid)), 1 << 30).unwrap();
        l.register(std::process::id(), g).unwrap();
        let _ = name;
    }
    let status = node_ledger::Status::open_or_create(&node_ledger::config::status_path(dir, 0), 0).unwrap();
    assert!(status.request_evict(node_ledger::Requester::Monitor, node_ledger::ProcId::own().unwrap(), None, libc_sigterm()));
    l
}

fn libc_sigterm() -> u32 {
    15
}

async fn evictor(url: String, dir: &Path) -> Evictor {
    let client = node_agent::kube::client(&KubeConfig {
        api_url: url,
        timeout_ms: 2000,
    })
    .await
    .unwrap();
    // No pace between lists: these tests read each tick's list (the pace has its own test,
    // `unmapped_requests_and_failing_lists_do_not_list_at_every_tick`).
    Evictor::new(client, "node-a", dir, vec![0], kube_contract::OFFLINE_GPU_RESOURCE, Duration::from_millis(200))
        .with_list_pace(Duration::ZERO)
}

/// One tick of `ev`: the pods it settled, by name, and how.
async fn outcomes(ev: &mut Evictor) -> Vec<(String, Outcome)> {
    ev.tick()
        .await
        .into_iter()
        .map(|(p, o)| (p.name, o))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicts_each_pod_once_and_handles_pdb_gone_and_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let _l = ledger_with_requests(tmp.path(), &["ok", "pdb", "gone", "replaced", "dying"]);
    let pdb_refusals = Arc::new(AtomicU32::new(1));
    let refusals = pdb_refusals.clone();
    let api = FakeApi::start_with_headers(Arc::new(move |r: &Recorded| {
        // As the API server answers a PDB refusal: 429, `Retry-After` header (what we follow),
        // and a longer `details.retryAfterSeconds` in the body (used only without the header).
        let (code, body) = match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/api/v1/pods") => (200, pod_list(UIDS.iter().map(|(n, u)| running_pod(n, u)).collect())),
            ("POST", "/api/v1/namespaces/batch/events") => {
                let mut e = r.json();
                e["metadata"]["name"] = "ev.1".into();
                (201, e)
            }
            ("POST", p) if p.ends_with("/eviction") => match p {
                "/api/v1/namespaces/batch/pods/ok/eviction" => (201, success()),
                "/api/v1/namespaces/batch/pods/pdb/eviction" => {
                    if refusals.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                        let mut st = status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.");
                        st["details"] = serde_json::json!({"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget train-pdb needs 1 healthy pods and has 1 currently"}], "retryAfterSeconds": 600});
                        return (429, st, vec![("Retry-After", "1".to_string())]);
                    } else {
                        (201, success())
                    }
                }
                "/api/v1/namespaces/batch/pods/gone/eviction" => (404, status(404, "NotFound", "pods \"gone\" not found")),
                "/api/v1/namespaces/batch/pods/replaced/eviction" => (
                    409,
                    status(409, "Conflict", "Precondition failed: UID in precondition: 44444444-4444-4444-8444-444444444444, UID in object meta: 99999999-9999-4999-8999-999999999999"),
                ),
                _ => (404, status(404, "NotFound", "unexpected eviction")),
            },
            _ => (404, status(404, "NotFound", "no such path")),
        };
        (code, body, vec![])
    }))
    .await;
    let mut ev = evictor(api.url(), tmp.path()).await;

    let mut got = outcomes(&mut ev).await;
    got.sort();
    assert_eq!(
        got,
        [
            ("dying".to_string(), Outcome::Terminating),
            ("gone".to_string(), Outcome::Gone),
            ("ok".to_string(), Outcome::Evicted),
            ("pdb".to_string(), Outcome::Blocked),
            ("replaced".to_string(), Outcome::Replaced),
        ]
    );
    let reqs = api.take();
    // Pods bound to this node, listed once to map ledger groups to pods.
    let lists: Vec<_> = reqs.iter().filter(|r| r.method == "GET").collect();
    assert_eq!(lists.len(), 1);
    assert_eq!(lists[0].path, "/api/v1/pods");
    assert!(
        lists[0]
            .query
            .contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "{}",
        lists[0].query
    );
    // Evictions: documented subresource path, policy/v1 body, UID precondition.
    let evictions: Vec<_> = reqs
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .collect();
    assert_eq!(
        evictions.len(),
        4,
        "no Eviction for the terminating pod: {evictions:?}"
    );
    for r in &evictions {
        assert_eq!(r.method, "POST");
        let name = r
            .path
            .trim_start_matches("/api/v1/namespaces/batch/pods/")
            .trim_end_matches("/eviction");
        let uid = UIDS.iter().find(|(n, _)| *n == name).unwrap().1;
        let raw = r.json();
        assert_eq!(raw["apiVersion"], "policy/v1");
        assert_eq!(raw["kind"], "Eviction");
        assert!(
            raw.get("delete_options").is_none(),
            "snake_case field the API server ignores: {raw}"
        );
        let e: Eviction = serde_json::from_value(raw).unwrap();
        assert_eq!(e.metadata.name.as_deref(), Some(name));
        let pre = e.delete_options.unwrap().preconditions.unwrap();
        assert_eq!(pre.uid.as_deref(), Some(uid));
    }
    // Events: one for the eviction, one for the PDB refusal.
    let events: Vec<Event> = reqs
        .iter()
        .filter(|r| r.path.ends_with("/events"))
        .map(|r| serde_json::from_value(r.json()).unwrap())
        .collect();
    let mut reasons: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.reason.clone().unwrap(),
                e.involved_object.name.clone().unwrap(),
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("XshareEvictionBlocked".to_string(), "pdb".to_string()),
            (kube_contract::EVICTION_EVENT_REASON.into(), "ok".into()),
        ]
    );
    for e in &events {
        assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert!(e.involved_object.uid.is_some());
        assert_eq!(
            e.source.as_ref().and_then(|s| s.host.as_deref()),
            Some("node-a")
        );
    }

    // At once again: nothing posted (finished pods never twice, the PDB one is backing off).
    assert!(ev.tick().await.is_empty());
    assert!(api.take().iter().all(|r| r.method != "POST"));

    // Past our own backoff (200 ms) but before the server's Retry-After (1 s): not retried.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        ev.tick().await.is_empty(),
        "retried before the server's Retry-After"
    );
    assert!(api.take().iter().all(|r| r.method != "POST"));

    // After the Retry-After the PDB allows it: evicted, one more Event, no second "blocked" Event.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let got = outcomes(&mut ev).await;
    assert_eq!(got, [("pdb".to_string(), Outcome::Evicted)]);
    let reqs = api.take();
    let posts: Vec<_> = reqs
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.path.as_str())
        .collect();
    assert_eq!(
        posts,
        [
            "/api/v1/namespaces/batch/pods/pdb/eviction",
            "/api/v1/namespaces/batch/events"
        ]
    );
    assert_eq!(ev.outcome(UIDS[1].1), Some(Outcome::Evicted));

    // The ledger still asks (the processes have not exited): still nothing posted, ever.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(ev.tick().await.is_empty());
    assert!(api.take().iter().all(|r| r.method != "POST"));
    let m = ev.metrics();
    assert!(
        m.contains("xshare_node_agent_evictions_total{node=\"node-a\",result=\"evicted\"} 2\n"),
        "{m}"
    );
    assert!(m.contains("result=\"blocked\"} 1\n"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_api_is_retried_and_leaves_the_ledger_request_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let l = ledger_with_requests(tmp.path(), &["ok"]);
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut ev = evictor(format!("http://127.0.0.1:{port}"), tmp.path()).await;
    // The pod cannot even be listed: no pod found, nothing final.
    assert!(ev.tick().await.is_empty());
    assert_eq!(ev.unmapped, 1);
    assert_eq!(ev.outcome(UIDS[0].1), None);
    // The monitor's request (and so its local signal path) is untouched.
    let st = node_ledger::Status::open(&node_ledger::config::status_path(tmp.path(), 0)).unwrap();
    assert_eq!(st.evict_request(node_ledger::ProcId::of(&l.procs()[0])), 15);

    // API back (list works, eviction answers 500 once): Failed, retried later, then evicted.
    let fails = Arc::new(AtomicU32::new(1));
    let f = fails.clone();
    let api = FakeApi::start(Arc::new(move |r: &Recorded| {
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/api/v1/pods") => (200, pod_list(vec![running_pod("ok", UIDS[0].1)])),
            ("POST", "/api/v1/namespaces/batch/pods/ok/eviction") => {
                if f.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    (
                        500,
                        status(500, "InternalError", "etcdserver: request timed out"),
                    )
                } else {
                    (201, success())
                }
            }
            _ => events_or_not_found(r),
        }
    }))
    .await;
    let mut ev = evictor(api.url(), tmp.path()).await;
    let got = outcomes(&mut ev).await;
    assert_eq!(got, [("ok".to_string(), Outcome::Failed)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = outcomes(&mut ev).await;
    assert_eq!(got, [("ok".to_string(), Outcome::Evicted)]);
    assert_eq!(evicted_names(&api).len(), 2, "one failed attempt, one accepted, no more");
}

/// The monitor's durable eviction log: a process that exited before any scan of the slots is
/// still reported (once), and a restarted agent posts nothing again (its cursor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logged_evictions_of_gone_processes_are_posted_once_across_restarts() {
    use node_ledger::evictlog::append;
    let tmp = tempfile::tempdir().unwrap();
    // The GPU's ledger exists, but no process is registered any more.
    let _l = Ledger::open_or_create(&ledger_path(tmp.path(), 0), 0).unwrap();
    let rec = log_rec;
    append(tmp.path(), &rec(UIDS[0].1, 100)).unwrap();
    // A process of no pod on this node (not a Kubernetes pod): settled, nothing posted.
    append(
        tmp.path(),
        &rec("99999999-0000-4000-8000-000000000000", 101),
    )
    .unwrap();
    // The monitor's SIGKILL after the grace period logs the same process again.
    append(tmp.path(), &rec(UIDS[0].1, 100)).unwrap();
    // Once evicted, the API server lists the pod as terminating (deletionTimestamp set).
    let evicted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let e2 = evicted.clone();
    let api = FakeApi::start(Arc::new(move |r: &Recorded| {
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/api/v1/pods") => {
                let mut p = running_pod("ok", UIDS[0].1);
                if e2.load(Ordering::SeqCst) {
                    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:10:00Z".into();
                    p["metadata"]["deletionGracePeriodSeconds"] = 30.into();
                }
                (200, pod_list(vec![p]))
            }
            ("POST", "/api/v1/namespaces/batch/pods/ok/eviction") => {
                e2.store(true, Ordering::SeqCst);
                (201, success())
            }
            _ => events_or_not_found(r),
        }
    }))
    .await;
    let mut ev = evictor(api.url(), tmp.path()).await;
    let got = outcomes(&mut ev).await;
    assert_eq!(got, [("ok".to_string(), Outcome::Evicted)]);
    let posted = |api: &FakeApi| evicted_names(api).len();
    assert_eq!(posted(&api), 1);
    let cursor = node_agent::evict::load_cursor(tmp.path(), 0).unwrap();
    let len = std::fs::metadata(node_ledger::evictlog::log_path(tmp.path(), 0))
        .unwrap()
        .len();
    assert_eq!(
        cursor.at.unwrap().offset,
        len,
        "every record settled: {cursor:?}"
    );
    assert!(ev.tick().await.is_empty());

    // A restarted agent (new Evictor, same directory): nothing posted again.
    drop(ev);
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert!(ev.tick().await.is_empty());
    assert_eq!(posted(&api), 0);
    // A late record of the same pod after the restart: the pod is terminating, not posted.
    append(tmp.path(), &rec(UIDS[0].1, 102)).unwrap();
    let got = outcomes(&mut ev).await;
    assert_eq!(got, [("ok".to_string(), Outcome::Terminating)]);
    assert_eq!(posted(&api), 0);
    assert!(evicted.load(Ordering::SeqCst));
}

fn log_rec(uid: &str, pid: u32) -> node_ledger::evictlog::EvictRecord {
    node_ledger::evictlog::EvictRecord {
        gpu: 0,
        pid,
        start_time: 1234,
        pid_ns: 4026531836,
        group_id: group_id_for(&group_name(uid)),
        signal: 15,
        reason: "overlimit".into(),
        unix_ms: 1,
        pod_uid: None,
    }
}

/// An API server listing `names` running on node-a, accepting their Evictions and Events.
async fn accepting_api(names: &'static [&'static str]) -> FakeApi {
    FakeApi::start(Arc::new(move |r: &Recorded| {
        let path = r.path.as_str();
        if r.method == "GET" && path == "/api/v1/pods" {
            let pods = UIDS
                .iter()
                .filter(|(n, _)| names.contains(n))
                .map(|(n, u)| running_pod(n, u))
                .collect();
            return (200, pod_list(pods));
        }
        if r.method == "POST" && path.ends_with("/eviction") {
            return (201, success());
        }
        events_or_not_found(r)
    }))
    .await
}

/// The pods whose Evictions `api` received since it was last asked, in order.
fn evicted_names(api: &FakeApi) -> Vec<String> {
    api.take()
        .into_iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .map(|r| r.path.split('/').nth_back(1).unwrap().to_string())
        .collect()
}

/// The monitor rotates its eviction log between two of the agent's reads, and again while the
/// agent is down (the generation it had finished is deleted): each pod is posted exactly once,
/// nothing is lost, and the cursor follows the generations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_rotation_between_reads_and_across_restarts_posts_each_pod_once() {
    use node_ledger::evictlog::{append_with, rotated_generations, Rotation};
    let tmp = tempfile::tempdir().unwrap();
    let _l = Ledger::open_or_create(&ledger_path(tmp.path(), 0), 0).unwrap();
    // Two records per file at most; one rotated generation kept.
    let rot = Rotation {
        max_bytes: 420,
        keep: 1,
    };
    let stranger = "99999999-0000-4000-8000-000000000000";
    let api = accepting_api(&["ok", "pdb", "gone", "replaced"]).await;
    let mut ev = evictor(api.url(), tmp.path()).await;
    append_with(tmp.path(), &log_rec(UIDS[0].1, 100), &rot).unwrap();
    append_with(tmp.path(), &log_rec(UIDS[1].1, 101), &rot).unwrap();
    assert!(ev.tick().await.len() == 2);
    // Rotation right after the agent's read: the next record is in a new generation.
    append_with(tmp.path(), &log_rec(UIDS[2].1, 102), &rot).unwrap();
    assert_eq!(rotated_generations(tmp.path(), 0).unwrap(), [0]);
    // A process of no pod of ours: settled once the pod list is read.
    append_with(tmp.path(), &log_rec(stranger, 103), &rot).unwrap();
    let got: Vec<_> = ev.tick().await.into_iter().map(|(p, _)| p.name).collect();
    assert_eq!(got, ["gone"]);
    assert_eq!(evicted_names(&api), ["ok", "pdb", "gone"]);
    drop(ev);
    // While the agent is down: another pod's record and a stranger's, two rotations (the
    // generation the cursor was in is deleted: it had been read whole).
    append_with(tmp.path(), &log_rec(UIDS[3].1, 104), &rot).unwrap();
    append_with(tmp.path(), &log_rec(stranger, 105), &rot).unwrap();
    append_with(tmp.path(), &log_rec(stranger, 106), &rot).unwrap();
    assert!(!rotated_generations(tmp.path(), 0).unwrap().contains(&1));
    let before = node_agent::evict::load_cursor(tmp.path(), 0).unwrap();
    assert_eq!(before.at.unwrap().generation, 1, "{before:?}");
    let mut ev = evictor(api.url(), tmp.path()).await;
    let got: Vec<_> = ev.tick().await.into_iter().map(|(p, _)| p.name).collect();
    assert!(ev.log_stalled(0).is_none(), "{:?}", ev.log_stalled(0));
    assert_eq!(got, ["replaced"]);
    assert_eq!(evicted_names(&api), ["replaced"]);
    let after = node_agent::evict::load_cursor(tmp.path(), 0).unwrap();
    assert!(after.at.unwrap().generation >= 2, "{after:?}");
    // A restart with nothing new: nothing posted.
    drop(ev);
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert!(ev.tick().await.is_empty());
    assert!(evicted_names(&api).is_empty());
}

/// A damaged cursor file, or a log that no longer matches the cursor, stops that GPU's log
/// reading loudly (error, stalled gauge): nothing is re-reported from the start, nothing skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_cursor_or_truncated_log_stalls_loudly_without_reposting() {
    use node_ledger::evictlog::append;
    let tmp = tempfile::tempdir().unwrap();
    let _l = Ledger::open_or_create(&ledger_path(tmp.path(), 0), 0).unwrap();
    let api = accepting_api(&["ok", "pdb"]).await;
    append(tmp.path(), &log_rec(UIDS[0].1, 100)).unwrap();
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert_eq!(ev.tick().await.len(), 1);
    assert_eq!(evicted_names(&api), ["ok"]);
    drop(ev);
    // A damaged cursor: a restarted agent refuses to guess.
    let cpath = node_agent::evict::cursor_path(tmp.path(), 0);
    let saved = std::fs::read(&cpath).unwrap();
    std::fs::write(&cpath, b"{\"at\": {\"generation\": 0, \"off").unwrap();
    append(tmp.path(), &log_rec(UIDS[1].1, 101)).unwrap();
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert!(ev.tick().await.is_empty());
    assert!(evicted_names(&api).is_empty(), "nothing re-posted");
    let why = ev.log_stalled(0).unwrap().to_string();
    assert!(
        why.contains("gpu0.cursor") && why.contains("damaged"),
        "{why}"
    );
    assert!(ev
        .metrics()
        .contains("xshare_node_agent_eviction_log_stalled{node=\"node-a\",gpu=\"0\"} 1"));
    drop(ev);
    // The cursor restored; the log truncated under it instead.
    std::fs::write(&cpath, &saved).unwrap();
    let log = node_ledger::evictlog::log_path(tmp.path(), 0);
    let text = std::fs::read(&log).unwrap();
    let mut ev = evictor(api.url(), tmp.path()).await;
    let at = node_agent::evict::load_cursor(tmp.path(), 0)
        .unwrap()
        .at
        .unwrap();
    std::fs::write(&log, &text[..at.offset as usize - 5]).unwrap();
    assert!(ev.tick().await.is_empty());
    let why = ev.log_stalled(0).unwrap().to_string();
    assert!(
        why.contains("gpu0.jsonl") && why.contains("truncated"),
        "{why}"
    );
    assert!(evicted_names(&api).is_empty());
    // Restored: the pending record is posted, once.
    std::fs::write(&log, &text).unwrap();
    drop(ev);
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert_eq!(ev.tick().await.len(), 1);
    assert_eq!(evicted_names(&api), ["pdb"]);
}

/// A ledger request naming the quota group of a pod that asks for no offline slot (an online
/// service's: any ledger client can write a slot with any group id) evicts nothing: only pods
/// asking for the device plugin's resource are offline work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_a_pod_without_the_offline_resource_evicts_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let _l = ledger_with_requests(tmp.path(), &["ok"]);
    let api = FakeApi::start(Arc::new(move |r: &Recorded| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/api/v1/pods") => {
            let mut p = running_pod("ok", UIDS[0].1);
            p["spec"]["containers"][0]["resources"] = serde_json::json!({"limits": {"nvidia.com/gpu": "1"}});
            (200, pod_list(vec![p]))
        }
        ("POST", "/api/v1/namespaces/batch/pods/ok/eviction") => (201, success()),
        _ => events_or_not_found(r),
    }))
    .await;
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert!(outcomes(&mut ev).await.is_empty());
    assert_eq!(ev.unmapped, 1);
    assert_eq!(ev.outcome(UIDS[0].1), None);
    assert!(
        !api.take().iter().any(|r| r.method == "POST" && r.path.ends_with("/eviction")),
        "an eviction was posted for a pod that asks for no offline slot"
    );
}

/// Work that ran without the shim has no ledger group: the monitor found it by its cgroup and
/// logged its pod's UID. That pod is evicted through the API, once, also after a restart of the
/// agent; a logged pod that asks for no offline slot (an online service's) is not, and a record
/// naming no pod at all is settled without a post.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unshimmed_process_logged_with_its_pod_evicts_that_pod_once() {
    use node_ledger::evictlog::append;
    let tmp = tempfile::tempdir().unwrap();
    let _l = Ledger::open_or_create(&ledger_path(tmp.path(), 0), 0).unwrap();
    let unshimmed = |uid: Option<&str>, pid: u32| node_ledger::evictlog::EvictRecord {
        group_id: 0,
        reason: "under_report".into(),
        pod_uid: uid.map(str::to_string),
        ..log_rec(UIDS[0].1, pid)
    };
    let online_uid = UIDS[1].1;
    append(tmp.path(), &unshimmed(Some(UIDS[0].1), 100)).unwrap();
    append(tmp.path(), &unshimmed(Some(online_uid), 101)).unwrap();
    append(tmp.path(), &unshimmed(None, 102)).unwrap();
    let api = FakeApi::start(Arc::new(move |r: &Recorded| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/api/v1/pods") => {
            let mut online = running_pod("pdb", online_uid);
            online["spec"]["containers"][0]["resources"] = serde_json::json!({"limits": {"nvidia.com/gpu": "1"}});
            (200, pod_list(vec![running_pod("ok", UIDS[0].1), online]))
        }
        ("POST", p) if p.ends_with("/eviction") => (201, success()),
        _ => events_or_not_found(r),
    }))
    .await;
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert_eq!(outcomes(&mut ev).await, [("ok".to_string(), Outcome::Evicted)]);
    assert_eq!(evicted_names(&api), ["ok"]);
    assert_eq!(ev.log_damaged, 0, "a record naming no pod is not a damaged line");
    let len = std::fs::metadata(node_ledger::evictlog::log_path(tmp.path(), 0)).unwrap().len();
    let cursor = node_agent::evict::load_cursor(tmp.path(), 0).unwrap();
    assert_eq!(cursor.at.unwrap().offset, len, "every record settled: {cursor:?}");
    drop(ev);
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert!(ev.tick().await.is_empty());
    assert!(evicted_names(&api).is_empty(), "nothing posted again after a restart");
}

/// A tenant's process registers under its neighbour pod's ledger group (its slot is its own
/// to write) and is asked to leave. The daemons name the pod its cgroup path names in the
/// request (status file) and the log record; the agent evicts that pod, the tenant's own, and
/// never the neighbour its slot claims, reporting the claim once (log and metric). Before, the
/// slot's group decided: the neighbour was evicted and the tenant stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_claiming_a_neighbours_group_gets_only_its_own_pod_evicted() {
    let tmp = tempfile::tempdir().unwrap();
    let (tenant, neighbour) = (UIDS[0], UIDS[1]);
    let l = Ledger::open_or_create(&ledger_path(tmp.path(), 0), 0).unwrap();
    let g = l.group(group_id_for(&group_name(neighbour.1)), 1 << 30).unwrap();
    l.register(std::process::id(), g).unwrap();
    let me = node_ledger::ProcId::own().unwrap();
    let cgroup_pod = node_ledger::PodUid::parse(tenant.1);
    let status = node_ledger::Status::open_or_create(&node_ledger::config::status_path(tmp.path(), 0), 0).unwrap();
    assert!(status.request_evict(node_ledger::Requester::Monitor, me, cgroup_pod, libc_sigterm()));
    let rec = node_ledger::evictlog::EvictRecord {
        pid: me.pid,
        start_time: me.start_time,
        pid_ns: me.pid_ns,
        pod_uid: Some(tenant.1.to_string()),
        ..log_rec(neighbour.1, me.pid)
    };
    node_ledger::evictlog::append(tmp.path(), &rec).unwrap();
    let api = accepting_api(&["ok", "pdb"]).await;
    let mut ev = evictor(api.url(), tmp.path()).await;
    let got = outcomes(&mut ev).await;
    assert_eq!(got, [(tenant.0.to_string(), Outcome::Evicted)]);
    assert_eq!(evicted_names(&api), [tenant.0], "the neighbour's pod is never posted");
    assert_eq!(ev.group_mismatch, 1);
    // The request stays until the process leaves: later ticks post nothing and count nothing.
    assert!(outcomes(&mut ev).await.is_empty());
    assert!(evicted_names(&api).is_empty());
    assert_eq!(ev.group_mismatch, 1, "one claim, counted once");
    assert_eq!(ev.outcome(neighbour.1), None);
    assert!(
        ev.metrics().contains("xshare_node_agent_eviction_group_mismatch_total{node=\"node-a\"} 1\n"),
        "{}",
        ev.metrics()
    );
}

/// A request naming a pod no list maps (a process of no pod of this node) does not make every
/// tick a consistent LIST of the node's pods: after a list, the next one waits for the pace;
/// after a failed list (403, 429, 500), for its backoff (doubling from the retry delay, or the
/// server's `retryAfterSeconds`). Before, each 100 ms tick listed (and warned) again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmapped_requests_and_failing_lists_do_not_list_at_every_tick() {
    let tmp = tempfile::tempdir().unwrap();
    let _l = ledger_with_requests(tmp.path(), &["ok"]);
    let client = |url: String| async move {
        node_agent::kube::client(&KubeConfig { api_url: url, timeout_ms: 2000 }).await.unwrap()
    };
    let lists = |api: &FakeApi| api.take().iter().filter(|r| r.method == "GET" && r.path == "/api/v1/pods").count();
    // The list works but shows no pod of the request's group.
    let api = FakeApi::start(Arc::new(|r: &Recorded| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/api/v1/pods") => (200, pod_list(vec![])),
        _ => events_or_not_found(r),
    }))
    .await;
    let mut ev = Evictor::new(client(api.url()).await, "node-a", tmp.path(), vec![0], kube_contract::OFFLINE_GPU_RESOURCE, Duration::from_millis(200))
        .with_list_pace(Duration::from_secs(600));
    for _ in 0..20 {
        assert!(ev.tick().await.is_empty());
    }
    assert_eq!(lists(&api), 1, "listed again before the pace");
    assert_eq!(ev.pod_lists, 1);
    // The list fails (500, then a 429 with the server's wait): one attempt per backoff.
    for code in [500u16, 429] {
        let api = FakeApi::start(Arc::new(move |r: &Recorded| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/api/v1/pods") => {
                let mut st = status(code, "InternalError", "etcdserver: request timed out");
                if code == 429 {
                    st["details"] = serde_json::json!({"retryAfterSeconds": 600});
                }
                (code, st)
            }
            _ => events_or_not_found(r),
        }))
        .await;
        let retry_first = if code == 429 { Duration::from_millis(1) } else { Duration::from_secs(600) };
        let mut ev = Evictor::new(client(api.url()).await, "node-a", tmp.path(), vec![0], kube_contract::OFFLINE_GPU_RESOURCE, retry_first)
            .with_list_pace(Duration::ZERO);
        for _ in 0..20 {
            assert!(ev.tick().await.is_empty());
        }
        assert_eq!(lists(&api), 1, "listed again before the backoff after a {code}");
    }
}

/// A 409 that is not the UID precondition (the resourceVersion precondition the API server sets
/// on a Pending pod's deletion failed after its retries: the pod changed meanwhile) leaves the
/// pod to evict: retried, then evicted. Before, every 409 was final (`Replaced`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_the_resource_version_is_retried_not_taken_for_a_replaced_pod() {
    let tmp = tempfile::tempdir().unwrap();
    let _l = ledger_with_requests(tmp.path(), &["ok"]);
    let conflicts = Arc::new(AtomicU32::new(1));
    let c = conflicts.clone();
    let api = FakeApi::start(Arc::new(move |r: &Recorded| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/api/v1/pods") => {
            let mut p = running_pod("ok", UIDS[0].1);
            p["status"]["phase"] = "Pending".into();
            (200, pod_list(vec![p]))
        }
        ("POST", "/api/v1/namespaces/batch/pods/ok/eviction") => {
            if c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                (409, status(409, "Conflict", "Operation cannot be fulfilled on Pod \"ok\": the ResourceVersion in the precondition (41) does not match the ResourceVersion in record (42). The object might have been modified"))
            } else {
                (201, success())
            }
        }
        _ => events_or_not_found(r),
    }))
    .await;
    let mut ev = evictor(api.url(), tmp.path()).await;
    assert_eq!(outcomes(&mut ev).await, [("ok".to_string(), Outcome::Failed)]);
    assert_eq!(ev.outcome(UIDS[0].1), None, "not final");
    let t0 = std::time::Instant::now();
    loop {
        let got = outcomes(&mut ev).await;
        if got == [("ok".to_string(), Outcome::Evicted)] {
            break;
        }
        assert!(got.is_empty(), "{got:?}");
        assert!(t0.elapsed() < Duration::from_secs(30), "never evicted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(evicted_names(&api).len(), 2, "one conflict, one accepted, no more");
}
