//! The pod and node watches against a fake API server on loopback that speaks the list/watch
//! protocol as a real one does: `PodList`/`NodeList` with `metadata.resourceVersion`, chunked
//! watch streams of `{"type", "object"}` lines (ADDED/MODIFIED/DELETED, BOOKMARK objects with
//! only a resourceVersion, ERROR with a `Status`), `410 Gone` (reason `Expired`) inside a stream
//! and as the answer to a watch request, `429 TooManyRequests` with `Retry-After` and
//! `details.retryAfterSeconds`.

mod plan_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_matcher::extender::{Extender, ExtenderArgs, PodDecision};
use cluster_matcher::kube_api::ApiSource;
use cluster_matcher::plan::{ClusterSpec, GpuHealth, GpuRef};
use cluster_matcher::watch::{ClusterSnapshot, ClusterWatch, WatchSettings, WatchView};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};

// The loopback API server and the real-shaped objects are shared test support (tests/fake-kube).
use fake_kube::objects::*;
use fake_kube::{fake_api, Answer, FakeApi, Req};

// ---------------------------------------------------------------- real-shaped objects

const PODS: &str = "/api/v1/pods";
const NODES: &str = "/api/v1/nodes";

fn settings() -> WatchSettings {
    WatchSettings {
        max_backoff: Duration::from_secs(5),
        ..Default::default()
    }
}

fn start(api: &FakeApi) -> ClusterWatch {
    let w = ClusterWatch::start(&ApiSource::Url(api.url.clone()), settings(), Arc::new(|| {})).unwrap();
    assert!(w.wait_synced(Duration::from_secs(30)), "watches did not sync");
    w
}

fn pod_names(v: &WatchView) -> Vec<String> {
    v.snapshot()
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

/// Polls `cond` until it holds (a generous deadline, only against hanging forever).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(30), "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn nodes_ok(rv: &str) -> Answer {
    let hb = heartbeat_json("gpu-a", now_ms(), &["Healthy", "Healthy"]);
    Answer::Json(200, list("NodeList", rv, vec![node("gpu-a", rv, Some(hb))]), vec![])
}

/// `404 NotFound`, the answer to any path a test does not serve.
fn not_found() -> Answer {
    Answer::Json(404, status(404, "NotFound", "no", json!({})), vec![])
}

/// The node side of a cluster whose nodes never change (one healthy node listed at version
/// 7, a watch with no events); `not_found` for any other path.
fn quiet_nodes(r: &Req) -> Answer {
    match (r.path.as_str(), r.is_watch()) {
        (NODES, false) => nodes_ok("7"),
        (NODES, true) => Answer::Stream(vec![], true),
        _ => not_found(),
    }
}

/// The pod lists around a lost watch: pods a and b at version 100 on the first list; a and c
/// at version 200 on any later one (b was deleted while the watch was down, its DELETED event
/// compacted away).
fn relist_without_b(before: &[Req]) -> Answer {
    let (rv, pods) = match before.iter().filter(|b| !b.is_watch()).count() {
        0 => ("100", vec![job_pod("ml", "a", "1", "90", 1000), job_pod("ml", "b", "1", "91", 1000)]),
        _ => ("200", vec![job_pod("ml", "a", "1", "90", 1000), job_pod("ml", "c", "1", "150", 1000)]),
    };
    Answer::Json(200, list("PodList", rv, pods), vec![])
}

/// An API server listing these pods and nodes at version 10, with watches that stay quiet.
fn fixed_cluster(pods: Vec<Value>, nodes: Vec<Value>) -> FakeApi {
    fake_api(move |r, _| match (r.path.as_str(), r.is_watch()) {
        (PODS, false) => Answer::Json(200, list("PodList", "10", pods.clone()), vec![]),
        (NODES, false) => Answer::Json(200, list("NodeList", "10", nodes.clone()), vec![]),
        (_, true) => Answer::Stream(vec![], true),
        _ => not_found(),
    })
}

/// A cluster spec with no headroom and no cap on offline memory; its nodes come from the
/// heartbeats.
fn open_cluster() -> ClusterSpec {
    serde_json::from_value(json!({"round_period_s": 3600, "memory_headroom_mib": 0,
        "max_offline_memory_fraction": 1.0, "nodes": []}))
    .unwrap()
}

// ---------------------------------------------------------------- tests

#[test]
fn state_is_rebuilt_from_list_and_watch_after_a_restart() {
    let api = fake_api(|r, _| match (r.path.as_str(), r.is_watch()) {
        (PODS, false) => {
            // Only the selector's pods: the server filters, as a real one does.
            assert_eq!(
                r.query.get("labelSelector").map(String::as_str),
                Some(kube_contract::pod::ROLE_SELECTOR)
            );
            Answer::Json(
                200,
                list(
                    "PodList",
                    "100",
                    vec![
                        online_pod("prod", "svc-0", "90", "gpu-a", 0),
                        online_pod("prod", "svc-1", "91", "gpu-a", 1),
                        job_pod("ml", "train-resnet", "x7k2p", "95", 4000),
                    ],
                ),
                vec![],
            )
        }
        (PODS, true) => Answer::Stream(
            vec![event("ADDED", job_pod("ml", "train-bert", "q9z8w", "101", 2000))],
            true,
        ),
        (NODES, false) => nodes_ok("100"),
        (NODES, true) => Answer::Stream(vec![], true),
        _ => Answer::Json(404, status(404, "NotFound", "no such path", json!({})), vec![]),
    });
    let cluster = open_cluster();
    for restart in 0..2 {
        let w = start(&api);
        let v = w.view();
        eventually("the watched ADDED pod", || pod_names(&v).len() == 4);
        let snap = v.snapshot();
        let spec = snap.cluster_spec(&cluster);
        assert_eq!(spec.nodes.len(), 1, "node from its heartbeat");
        assert_eq!(
            (
                spec.nodes[0].gpus,
                spec.nodes[0].gpu_memory_mib,
                spec.nodes[0].gpu_type.as_str()
            ),
            (2, 32768, "V100M32")
        );
        let (workloads, skipped) = snap.workloads(&spec);
        assert!(skipped.is_empty(), "{skipped:?}");
        workloads.check(std::path::Path::new("<watch>"), &spec).unwrap();
        let offline: Vec<&str> = workloads.offline.iter().map(|o| o.name.as_str()).collect();
        // Job pods are their Job, by label and owner, never by generated name.
        assert_eq!(offline, ["ml/train-bert", "ml/train-resnet"], "restart {restart}");
        assert_eq!(workloads.online.len(), 2);
        assert_eq!(
            workloads.online[0].at,
            Some(GpuRef {
                node: "gpu-a".into(),
                gpu: 0
            })
        );

        // The extender plans from the watched state and places the Job's pod.
        let ext = Arc::new(Extender::watched(
            cluster.clone(),
            plan_support::similarity_predictor(),
            None,
            v.clone(),
        ));
        let pod: Pod = serde_json::from_value(job_pod("ml", "train-resnet", "x7k2p", "95", 4000)).unwrap();
        assert!(
            matches!(ext.decide(&pod), PodDecision::Placed(GpuRef { ref node, .. }) if node == "gpu-a"),
            "{:?}",
            ext.decide(&pod)
        );
        let args = ExtenderArgs {
            pod,
            nodes: None,
            node_names: Some(vec!["gpu-a".into(), "gpu-b".into()]),
        };
        assert_eq!(ext.filter(args).node_names.unwrap(), ["gpu-a"]);
        drop(w);
    }
    // Each start listed afresh: nothing was kept anywhere but in the API server.
    assert_eq!(api.lists(PODS).len(), 2);
}

#[test]
fn watch_resumes_from_the_latest_bookmark() {
    let api = fake_api(|r, before| match (r.path.as_str(), r.is_watch()) {
        (PODS, false) => Answer::Json(
            200,
            list("PodList", "100", vec![job_pod("ml", "a", "1", "90", 1000)]),
            vec![],
        ),
        (PODS, true) => {
            let watches = before.iter().filter(|b| b.is_watch()).count();
            match (watches, r.rv()) {
                // First watch: one change, then a bookmark, then the server ends the stream
                // (its watch timeout).
                (0, "100") if r.query.get("allowWatchBookmarks").map(String::as_str) == Some("true") => Answer::Stream(
                    vec![
                        event("ADDED", job_pod("ml", "b", "1", "120", 1000)),
                        bookmark("Pod", "4096"),
                    ],
                    false,
                ),
                (0, "100") => Answer::Stream(vec![event("ADDED", job_pod("ml", "b", "1", "120", 1000))], false),
                (_, "4096") => Answer::Stream(vec![], true),
                // Version 120 was compacted away while only bookmarks moved the version on.
                (_, rv) => Answer::Stream(vec![event("ERROR", gone(rv))], false),
            }
        }
        _ => quiet_nodes(r),
    });
    let w = start(&api);
    eventually("a second pod watch", || api.watches(PODS).len() >= 2);
    let watches = api.watches(PODS);
    assert_eq!(
        watches[0].query.get("allowWatchBookmarks").map(String::as_str),
        Some("true")
    );
    assert_eq!(watches[1].rv(), "4096", "resumed from the bookmark's resourceVersion");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(api.lists(PODS).len(), 1, "no relist was needed");
    // The bookmark object is no pod.
    assert_eq!(pod_names(&w.view()), ["a-1", "b-1"]);
}

#[test]
fn gone_inside_the_stream_relists_and_drops_what_was_deleted_meanwhile() {
    let api = fake_api(|r, before| match (r.path.as_str(), r.is_watch()) {
        (PODS, false) => relist_without_b(before),
        (PODS, true) if r.rv() == "100" => Answer::Stream(vec![event("ERROR", gone("100"))], true),
        (PODS, true) => Answer::Stream(vec![], true),
        _ => quiet_nodes(r),
    });
    let w = start(&api);
    let v = w.view();
    eventually("the relisted state", || pod_names(&v) == ["a-1", "c-1"]);
    assert!(api.lists(PODS).len() >= 2);
    eventually("a watch from the relist's version", || api.watches(PODS).iter().any(|r| r.rv() == "200"));
}

#[test]
fn gone_answered_to_the_watch_request_starts_a_fresh_list() {
    let api = fake_api(|r, before| match (r.path.as_str(), r.is_watch()) {
        (PODS, false) => relist_without_b(before),
        // The version expired before the watch started: the API server refuses the request.
        (PODS, true) if r.rv() == "100" => Answer::Json(410, gone("100"), vec![]),
        (PODS, true) => Answer::Stream(vec![], true),
        _ => quiet_nodes(r),
    });
    let w = start(&api);
    let v = w.view();
    eventually("a relist after the 410", || pod_names(&v) == ["a-1", "c-1"]);
    assert_eq!(
        api.watches(PODS).iter().filter(|r| r.rv() == "100").count(),
        1,
        "the expired version was not retried"
    );
    assert!(v.stats.gone_restarts.load(Ordering::Relaxed) >= 1);
}

#[test]
fn too_many_requests_waits_for_retry_after() {
    let api = fake_api(|r, before| match (r.path.as_str(), r.is_watch()) {
        (PODS, false) if before.is_empty() => Answer::Json(
            429,
            status(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                json!({"retryAfterSeconds": 2}),
            ),
            vec![("Retry-After", "2".into())],
        ),
        (PODS, false) => Answer::Json(
            200,
            list("PodList", "100", vec![job_pod("ml", "a", "1", "90", 1000)]),
            vec![],
        ),
        (PODS, true) => Answer::Stream(vec![], true),
        _ => quiet_nodes(r),
    });
    let w = start(&api);
    let lists = api.lists(PODS);
    assert_eq!(lists.len(), 2, "one refused list, one retry");
    // A lower bound only: the retry came no sooner than the server asked.
    let gap = lists[1].at - lists[0].at;
    assert!(
        gap >= Duration::from_secs(2),
        "retried after {gap:?}, before Retry-After"
    );
    assert_eq!(w.view().stats.retry_after_waits.load(Ordering::Relaxed), 1);
    assert_eq!(pod_names(&w.view()), ["a-1"]);
}

// ---------------------------------------------------------------- heartbeat -> health

fn snapshot_with(nodes: Vec<Value>, now: u64) -> ClusterSnapshot {
    let nodes: Vec<Node> = nodes.into_iter().map(|n| serde_json::from_value(n).unwrap()).collect();
    ClusterSnapshot::new(vec![], nodes, now, WatchSettings::default())
}

#[test]
fn missing_stale_future_dated_or_unknown_heartbeats_are_not_healthy() {
    let now = now_ms();
    let g = |n: &str, i| GpuRef { node: n.into(), gpu: i };
    let unknown_version = heartbeat_json("v2", now, &["Healthy"]).replace("\"version\":1", "\"version\":2");
    let snap = snapshot_with(
        vec![
            node(
                "fresh",
                "1",
                Some(heartbeat_json("fresh", now - 1_000, &["Healthy", "Overlimit"])),
            ),
            node("none", "1", None),
            node("old", "1", Some(heartbeat_json("old", now - 60_000, &["Healthy"]))),
            node(
                "ahead",
                "1",
                Some(heartbeat_json("ahead", now + 3_600_000, &["Healthy"])),
            ),
            node("forever", "1", Some(heartbeat_json("forever", u64::MAX, &["Healthy"]))),
            node("v2", "1", Some(unknown_version)),
            node("liar", "1", Some(heartbeat_json("someone-else", now, &["Healthy"]))),
        ],
        now,
    );
    assert_eq!(snap.health(&g("fresh", 0)), GpuHealth::Healthy);
    assert_eq!(snap.health(&g("fresh", 1)), GpuHealth::Overlimit);
    assert_eq!(
        snap.health(&g("fresh", 2)),
        GpuHealth::Missing,
        "a GPU the heartbeat does not list"
    );
    assert_eq!(snap.health(&g("none", 0)), GpuHealth::Missing);
    assert_eq!(snap.health(&g("unwatched", 0)), GpuHealth::Missing);
    assert_eq!(snap.health(&g("old", 0)), GpuHealth::Stale { age_s: 60 });
    assert_eq!(
        snap.health(&g("ahead", 0)),
        GpuHealth::FromFuture { ahead_ms: 3_600_000 }
    );
    assert!(matches!(snap.health(&g("forever", 0)), GpuHealth::FromFuture { .. }));
    assert!(matches!(snap.health(&g("v2", 0)), GpuHealth::Unreadable { ref why } if why.contains("version 2")));
    assert!(matches!(snap.health(&g("liar", 0)), GpuHealth::Unreadable { ref why } if why.contains("someone-else")));
}

/// A heartbeat seen to replace another is judged by when this extender saw it, not by the
/// node's clock: a node whose clock runs an hour ahead, or a minute behind, is Healthy while
/// its agent keeps writing. Before, the first read `FromFuture` and the second `Stale` for as
/// long as the clocks disagreed. A value found at the first look, or one seen to change long
/// ago, is judged as before.
#[test]
fn a_heartbeat_seen_to_change_is_judged_by_this_hosts_clock() {
    use cluster_matcher::watch::{observe, SeenHeartbeat};
    let now = now_ms();
    let g = |n: &str| GpuRef { node: n.into(), gpu: 0 };
    let (ahead, behind) = (now + 3_600_000, now - 60_000);
    let mut snap = snapshot_with(
        vec![
            node("ahead", "1", Some(heartbeat_json("ahead", ahead, &["Healthy"]))),
            node("behind", "1", Some(heartbeat_json("behind", behind, &["Healthy"]))),
            node("first", "1", Some(heartbeat_json("first", ahead, &["Healthy"]))),
            node("quiet", "1", Some(heartbeat_json("quiet", now, &["Healthy"]))),
        ],
        now,
    );
    let mut seen = std::collections::BTreeMap::new();
    // Each node's previous value, seen a while ago, then its current one.
    for (n, updated) in [("ahead", ahead), ("behind", behind), ("quiet", now)] {
        observe(&mut seen, n, updated - 10_000, now - 70_000);
        observe(&mut seen, n, updated, if n == "quiet" { now - 60_000 } else { now - 1_000 });
    }
    observe(&mut seen, "first", ahead, now - 1_000);
    assert_eq!(seen["first"], SeenHeartbeat { updated_unix_ms: ahead, seen_unix_ms: now - 1_000, changed: false });
    // The same value again keeps when it was first seen.
    observe(&mut seen, "ahead", ahead, now);
    assert_eq!(seen["ahead"].seen_unix_ms, now - 1_000);
    snap.seen = seen;
    assert_eq!(snap.health(&g("ahead")), GpuHealth::Healthy);
    assert_eq!(snap.health(&g("behind")), GpuHealth::Healthy);
    assert_eq!(snap.health(&g("first")), GpuHealth::FromFuture { ahead_ms: 3_600_000 }, "no change seen yet: the node's date");
    assert_eq!(snap.health(&g("quiet")), GpuHealth::Stale { age_s: 60 }, "seen to change a minute ago, nothing since");
}

#[test]
fn the_planner_places_offline_work_only_beside_fresh_healthy_heartbeats() {
    let now = now_ms();
    let nodes = vec![
        node("gpu-ok", "1", Some(heartbeat_json("gpu-ok", now, &["Healthy"]))),
        node(
            "gpu-old",
            "1",
            Some(heartbeat_json("gpu-old", now - 120_000, &["Healthy"])),
        ),
        node(
            "gpu-ahead",
            "1",
            Some(heartbeat_json("gpu-ahead", u64::MAX, &["Healthy"])),
        ),
    ];
    let pods = vec![
        online_pod("prod", "svc-ok", "1", "gpu-ok", 0),
        online_pod("prod", "svc-old", "1", "gpu-old", 0),
        online_pod("prod", "svc-ahead", "1", "gpu-ahead", 0),
        job_pod("ml", "j1", "a", "1", 1000),
        job_pod("ml", "j2", "b", "1", 1000),
        job_pod("ml", "j3", "c", "1", 1000),
    ];
    let api = fixed_cluster(pods, nodes);
    let w = start(&api);
    let cluster = open_cluster();
    let ext = Extender::watched(cluster, plan_support::similarity_predictor(), None, w.view());
    let plan = ext.plan();
    let placed: Vec<&str> = plan.assignments.iter().map(|a| a.at.node.as_str()).collect();
    assert_eq!(placed, ["gpu-ok"], "{plan:?}");
    let skipped: BTreeMap<&str, &str> = plan
        .skipped_gpus
        .iter()
        .map(|s| (s.at.node.as_str(), s.reason.as_str()))
        .collect();
    assert!(skipped["gpu-old"].starts_with("Stale("), "{skipped:?}");
    assert!(skipped["gpu-ahead"].starts_with("Stale(dated"), "{skipped:?}");
    assert_eq!(plan.unplaced.len(), 2);
}

/// An evicted Job pod stays listed while it terminates (deletionTimestamp set, still bound to
/// its GPU), beside the Job's replacement: the job is planned once, from the replacement, as
/// not placed (the Terminating pod is no live placement to keep), and lands on a Healthy GPU.
#[test]
fn a_terminating_offline_pod_is_not_a_placement_and_its_replacement_is_planned() {
    let now = now_ms();
    let nodes = vec![node("gpu-n", "1", Some(heartbeat_json("gpu-n", now, &["Overlimit", "Healthy"])))];
    let mut old = job_pod("ml", "train", "old", "1", 1000);
    old["spec"]["nodeName"] = "gpu-n".into();
    old["metadata"]["annotations"]["xshare.io/gpu"] = "0".into();
    old["status"]["phase"] = "Running".into();
    old["metadata"]["deletionTimestamp"] = "2026-11-23T06:20:30Z".into();
    old["metadata"]["deletionGracePeriodSeconds"] = 30.into();
    let fresh = job_pod("ml", "train", "new", "2", 1000);
    let pods = vec![
        online_pod("prod", "svc-0", "1", "gpu-n", 0),
        online_pod("prod", "svc-1", "1", "gpu-n", 1),
        old,
        fresh.clone(),
    ];
    let typed: Vec<Pod> = pods.iter().map(|p| serde_json::from_value(p.clone()).unwrap()).collect();
    let nodes_t: Vec<Node> = nodes.iter().map(|n| serde_json::from_value(n.clone()).unwrap()).collect();
    let snap = ClusterSnapshot::new(typed, nodes_t, now, WatchSettings::default());
    let cluster = open_cluster();
    let spec = snap.cluster_spec(&cluster);
    let (workloads, skipped) = snap.workloads(&spec);
    assert_eq!(workloads.offline.len(), 1, "{workloads:?}");
    assert_eq!(workloads.offline[0].name, "ml/train");
    assert_eq!(workloads.offline[0].current, None, "the terminating pod is no placement");
    assert!(skipped.iter().any(|s| s.what.contains("train-old") && s.why == "terminating" && s.routine), "{skipped:?}");

    let api = fixed_cluster(pods, nodes);
    let w = start(&api);
    eventually("both watches listed", || w.view().snapshot().pods.len() == 4);
    let ext = Extender::watched(cluster, plan_support::similarity_predictor(), None, w.view());
    let plan = ext.plan();
    let placed: Vec<(&str, u32)> = plan.assignments.iter().map(|a| (a.offline.as_str(), a.at.gpu)).collect();
    assert_eq!(placed, [("ml/train", 1)], "{plan:?}");
    let fresh_pod: Pod = serde_json::from_value(fresh).unwrap();
    assert_eq!(
        ext.decide(&fresh_pod),
        PodDecision::Placed(GpuRef { node: "gpu-n".into(), gpu: 1 })
    );
}

/// A running offline pod whose `xshare.io/memory-mib` no longer parses (edited after its bind
/// where the admission policy is not installed) still holds its GPU and its bound quota: the
/// plan charges its GPU that quota and keeps the job where it runs, instead of leaving it out
/// (its GPU was then given to another job, its memory promised again).
#[test]
fn a_running_pod_with_a_broken_need_is_charged_its_bound_quota() {
    let now = now_ms();
    let nodes = [node("gpu-n", "1", Some(heartbeat_json("gpu-n", now, &["Healthy"])))];
    let mut run = job_pod("ml", "train", "a", "1", 1000);
    run["spec"]["nodeName"] = "gpu-n".into();
    run["metadata"]["annotations"]["xshare.io/gpu"] = "0".into();
    run["metadata"]["annotations"]["xshare.io/memory-quota-bytes"] = (6000u64 << 20).to_string().into();
    run["metadata"]["annotations"]["xshare.io/memory-mib"] = "x".into();
    run["status"]["phase"] = "Running".into();
    let pods = [online_pod("prod", "svc-0", "1", "gpu-n", 0), run];
    let typed: Vec<Pod> = pods.iter().map(|p| serde_json::from_value(p.clone()).unwrap()).collect();
    let nodes_t: Vec<Node> = nodes.iter().map(|n| serde_json::from_value(n.clone()).unwrap()).collect();
    let snap = ClusterSnapshot::new(typed, nodes_t, now, WatchSettings::default());
    let spec = snap.cluster_spec(&open_cluster());
    let (workloads, skipped) = snap.workloads(&spec);
    assert_eq!(workloads.offline.len(), 1, "{workloads:?}");
    let j = &workloads.offline[0];
    assert_eq!((j.memory_mib, j.held_memory_quota_mib), (6000, Some(6000)), "{j:?}");
    assert_eq!(j.current, Some(GpuRef { node: "gpu-n".into(), gpu: 0 }));
    assert!(skipped.iter().any(|s| s.what.contains("train-a") && s.why.contains("quota of 6000 MiB")), "{skipped:?}");
}

// ---------------------------------------------------------------- metrics and dashboard

fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let r = fake_kube::http::request(addr, "GET", path, b"");
    (r.head, r.body)
}

/// Metric names in a PromQL expression: the identifiers of our families' prefixes.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("DCGM_") || t.starts_with("xshare_"))
        .map(String::from)
        .collect()
}

/// GPU series carry dcgm-exporter's labels under xshare's own names (the heartbeat's SM
/// activity is no DCGM field, and beside dcgm-exporter, DCGM's names would give each GPU two
/// series of one name); DCGM's memory names only with `--dcgm-metrics`. The planner's health
/// states are its own family, not sysmonitor's `xshare_gpu_health_state`.
#[test]
fn metrics_use_dcgm_labels_and_the_dashboard_charts_only_exported_series() {
    let now = now_ms();
    let nodes = vec![
        node(
            "gpu-a",
            "1",
            Some(heartbeat_json("gpu-a", now, &["Healthy", "Overlimit"])),
        ),
        node(
            "gpu-old",
            "1",
            Some(heartbeat_json("gpu-old", now - 600_000, &["Healthy"])),
        ),
    ];
    let mut bound = job_pod("ml", "train", "k2", "5", 2000);
    bound["spec"]["nodeName"] = json!("gpu-a");
    bound["metadata"]["annotations"]["xshare.io/gpu"] = json!("0");
    bound["status"]["phase"] = json!("Running");
    let mut evicted = job_pod("ml", "old", "z1", "6", 2000);
    evicted["status"]["conditions"] = json!([{"type": "DisruptionTarget", "status": "True",
        "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting",
        "lastTransitionTime": "2026-11-23T06:20:00Z"}]);
    let pods = vec![online_pod("prod", "svc-0", "1", "gpu-a", 0), bound, evicted];
    let api = fixed_cluster(pods, nodes);
    let w = start(&api);
    let cluster: ClusterSpec = serde_json::from_value(json!({"round_period_s": 3600, "nodes": []})).unwrap();
    let ext = Arc::new(Extender::watched(
        cluster.clone(),
        plan_support::similarity_predictor(),
        None,
        w.view(),
    ));
    let server = cluster_matcher::extender::HttpServer::start("127.0.0.1:0", ext, Default::default()).unwrap();
    let (head, body) = http_get(server.local_addr(), "/metrics");
    assert!(!body.contains("DCGM_"), "no DCGM names unless asked: {body}");
    let with_dcgm = Arc::new(Extender::watched(cluster, plan_support::similarity_predictor(), None, w.view()).with_dcgm_metrics(true));
    let dcgm_server = cluster_matcher::extender::HttpServer::start("127.0.0.1:0", with_dcgm, Default::default()).unwrap();
    let (_, dcgm_body) = http_get(dcgm_server.local_addr(), "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );

    let samples: BTreeMap<String, f64> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse::<f64>().unwrap())
        })
        .collect();
    let gpu0 = r#"gpu="0",UUID="GPU-gpu-a-0",device="nvidia0",modelName="Tesla V100-SXM2-32GB",Hostname="gpu-a""#;
    for (pod, ns) in [("svc-0", "prod"), ("train-k2", "ml")] {
        let l = format!(r#"{{{gpu0},pod="{pod}",namespace="{ns}"}}"#);
        assert_eq!(samples.get(&format!("xshare_gpu_sm_activity_ratio{l}")), Some(&0.3), "{body}");
        assert_eq!(samples.get(&format!("xshare_gpu_memory_used_bytes{l}")), Some(&(8192.0 * 1048576.0)));
        assert_eq!(samples.get(&format!("xshare_gpu_memory_free_bytes{l}")), Some(&(24576.0 * 1048576.0)));
        assert!(dcgm_body.contains(&format!("DCGM_FI_DEV_FB_USED{l} 8192\n")), "{dcgm_body}");
        assert!(dcgm_body.contains(&format!("DCGM_FI_DEV_FB_FREE{l} 24576\n")), "{dcgm_body}");
    }
    for f in cluster_matcher::extender::metrics::DCGM_FAMILIES {
        assert!(dcgm_body.contains(&format!("# TYPE {f} gauge")), "{f}");
    }
    assert!(!dcgm_body.contains("DCGM_FI_DEV_GPU_UTIL") && !dcgm_body.contains("DCGM_FI_PROF_SM_ACTIVE"), "SM activity is no DCGM field");
    // A GPU no pod uses: one series with empty pod/namespace.
    let gpu1 = r#"gpu="1",UUID="GPU-gpu-a-1",device="nvidia1",modelName="Tesla V100-SXM2-32GB",Hostname="gpu-a""#;
    assert!(samples.contains_key(&format!(r#"xshare_gpu_sm_activity_ratio{{{gpu1},pod="",namespace=""}}"#)));
    assert!(!samples.keys().any(|k| k.starts_with("xshare_gpu_health_state")), "sysmonitor's family, not the planner's");
    assert_eq!(
        samples.get(&format!(r#"xshare_planner_gpu_health_state{{{gpu0},state="Healthy"}}"#)),
        Some(&1.0)
    );
    assert_eq!(
        samples.get(&format!(r#"xshare_planner_gpu_health_state{{{gpu0},state="Stale"}}"#)),
        Some(&0.0)
    );
    assert_eq!(
        samples.get(&format!(r#"xshare_planner_gpu_health_state{{{gpu1},state="Overlimit"}}"#)),
        Some(&1.0)
    );
    let old = r#"gpu="0",UUID="GPU-gpu-old-0",device="nvidia0",modelName="Tesla V100-SXM2-32GB",Hostname="gpu-old""#;
    assert_eq!(
        samples.get(&format!(r#"xshare_planner_gpu_health_state{{{old},state="Stale"}}"#)),
        Some(&1.0)
    );
    // A stale heartbeat's load is not exported as if current.
    assert!(!samples
        .keys()
        .any(|k| ["xshare_gpu_sm_activity_ratio", "xshare_gpu_memory_"].iter().any(|f| k.starts_with(f)) && k.contains(r#"Hostname="gpu-old""#)));
    assert_eq!(samples.get("xshare_offline_evictions_total"), Some(&1.0));
    assert_eq!(samples.get("xshare_plan_round"), Some(&0.0));
    assert!(samples.contains_key("xshare_plan_round_duration_seconds"));

    let exported: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    for f in cluster_matcher::extender::metrics::FAMILIES {
        assert!(exported.contains(f), "family {f} not exported");
    }

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/xshare-dashboard.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("dashboard is valid JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut charted = std::collections::BTreeSet::new();
    for p in panels {
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("panel {} has no targets", p["title"]));
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "panel {}: `{expr}` charts no xshare/DCGM metric",
                p["title"]
            );
            for n in names {
                assert!(
                    exported.contains(&n.as_str()),
                    "panel {}: `{n}` is not exported",
                    p["title"]
                );
                charted.insert(n);
            }
        }
    }
    for must in [
        "xshare_gpu_sm_activity_ratio",
        "xshare_gpu_memory_used_bytes",
        "xshare_planner_gpu_health_state",
        "xshare_plan_round_duration_seconds",
        "xshare_plan_placed_jobs",
        "xshare_plan_waiting_jobs",
        "xshare_offline_evictions_total",
    ] {
        assert!(charted.contains(must), "dashboard does not chart {must}");
    }
}

// ---------------------------------------------------------------- the binary, end to end

fn http_post(addr: std::net::SocketAddr, path: &str, body: &Value) -> Value {
    let r = fake_kube::http::request(addr, "POST", path, body.to_string().as_bytes());
    assert!(r.head.starts_with("HTTP/1.1 200"), "{}\n{}", r.head, r.body);
    serde_json::from_str(&r.body).unwrap()
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_watch_learns_a_job_pod_created_later_then_binds_it() {
    let now = now_ms();
    let job = job_pod("ml", "train", "k2", "20", 2000);
    let j = job.clone();
    let api = fake_api(move |r, _| match (r.method.as_str(), r.path.as_str(), r.is_watch()) {
        ("GET", PODS, false) => {
            Answer::Json(200, list("PodList", "10", vec![online_pod("prod", "svc-0", "5", "gpu-a", 0)]), vec![])
        }
        // The Job controller creates its pod after the extender started.
        ("GET", PODS, true) => Answer::Later(Duration::from_millis(1500), vec![event("ADDED", j.clone())]),
        ("GET", NODES, false) => {
            let hb = heartbeat_json("gpu-a", now + 1_000, &["Healthy", "Healthy"]);
            Answer::Json(200, list("NodeList", "10", vec![node("gpu-a", "3", Some(hb))]), vec![])
        }
        ("GET", NODES, true) => Answer::Stream(vec![], true),
        // The bind lock: the node read, then patched with the read resourceVersion.
        ("GET", "/api/v1/nodes/gpu-a", false) => Answer::Json(200, node("gpu-a", "3", None), vec![]),
        ("PATCH", "/api/v1/nodes/gpu-a", _) => Answer::Json(200, node("gpu-a", "4", None), vec![]),
        ("PATCH", "/api/v1/namespaces/ml/pods/train-k2", _) => Answer::Json(200, j.clone(), vec![]),
        ("POST", "/api/v1/namespaces/ml/pods/train-k2/binding", _) => {
            let b: k8s_openapi::api::core::v1::Binding = serde_json::from_slice(&r.body).unwrap();
            Answer::Json(201, serde_json::to_value(b).unwrap(), vec![])
        }
        _ => not_found(),
    });
    let dir = std::env::temp_dir().join(format!("xshare-watch-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A round period far beyond the test: only the watch's change can start the next round.
    std::fs::write(dir.join("cluster.json"), r#"{"round_period_s": 86400, "nodes": []}"#).unwrap();
    std::fs::write(dir.join("workloads.json"), "{}").unwrap();
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/speed-predictor.json");
    let mut child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_cluster-matcher"))
            .args(["serve", "--watch", "--listen", "127.0.0.1:0", "--kube-api", &api.url])
            .arg("--cluster")
            .arg(dir.join("cluster.json"))
            .arg("--workloads")
            .arg(dir.join("workloads.json"))
            .arg("--model")
            .arg(&model)
            .env("RUST_LOG", "warn")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = BufReader::new(child.0.stderr.take().unwrap());
    let addr: std::net::SocketAddr = loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "serve exited before listening");
        if let Some(a) = line.trim().strip_prefix("cluster-matcher: extender listening on http://") {
            break a.parse().unwrap();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let filter = json!({"Pod": job, "NodeNames": ["gpu-a", "gpu-b"]});
    eventually("the pod created later is planned", || {
        http_post(addr, "/xshare/filter", &filter)["NodeNames"] == json!(["gpu-a"])
    });
    let bound = http_post(
        addr,
        "/xshare/bind",
        &json!({"PodName": "train-k2", "PodNamespace": "ml", "PodUID": "uid-train-k2", "Node": "gpu-a"}),
    );
    assert_eq!(bound["Error"], "", "{bound}");
    let posted: Vec<Req> = api.reqs.lock().unwrap().iter().filter(|r| r.method == "POST").cloned().collect();
    assert_eq!(posted.len(), 1);
    let b: k8s_openapi::api::core::v1::Binding = serde_json::from_slice(&posted[0].body).unwrap();
    assert_eq!(b.target.name.as_deref(), Some("gpu-a"));
    // The node's bind lock was taken first (serve's default), naming the pod.
    let lock: Vec<Req> = api.reqs.lock().unwrap().iter().filter(|r| r.method == "PATCH" && r.path == "/api/v1/nodes/gpu-a").cloned().collect();
    assert_eq!(lock.len(), 1);
    let l = lock[0].json();
    assert_eq!(l["metadata"]["resourceVersion"], "3");
    let l = kube_contract::bind_lock::BindLock::parse(l["metadata"]["annotations"][kube_contract::bind_lock::ANNOTATION].as_str().unwrap()).unwrap();
    assert_eq!((l.uid.as_str(), l.pod().as_str()), ("uid-train-k2", "ml/train-k2"));
    assert_eq!(b.metadata.uid.as_deref(), Some("uid-train-k2"));
    // The next round counts the job as running there before any watch event shows the bind.
    eventually("a round that keeps the bound job in place", || {
        let (_, plan) = http_get(addr, "/plan");
        let plan: Value = serde_json::from_str(&plan).unwrap();
        plan["round"].as_u64() > Some(1)
            && plan["assignments"].as_array().unwrap().iter().any(|a| a["offline"] == "ml/train" && a["kept"] == true)
    });
    let (_, metrics) = http_get(addr, "/metrics");
    assert!(metrics.lines().any(|l| l == "xshare_plan_placed_jobs 1"), "{metrics}");
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}
