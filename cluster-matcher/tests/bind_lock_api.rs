//! The extender's bind takes the node's bind lock (`kube_contract::bind_lock`) before it
//! writes the plan and posts the Binding, against the stateful fake API server (fake-kube:
//! Nodes and Pods with resourceVersions, merge patches whose `metadata.resourceVersion` is a
//! precondition, the `binding` subresource with its UID precondition), and against a scripted
//! one for the `409 Conflict` of a Node that changed between read and write.

use std::time::Duration;

use cluster_matcher::kube_api::{ApiError, ApiSource, KubeApi, PodPlacement};
use fake_kube::cluster::FakeCluster;
use fake_kube::{fake_api, Answer};
use kube_contract::bind_lock::{self, BindLock, ANNOTATION};
use serde_json::{json, Value};

const NODE: &str = "gpu-b";
const TTL: Duration = Duration::from_secs(120);

fn placement() -> PodPlacement {
    PodPlacement {
        node: NODE.into(),
        gpu: 1,
        sm_percent: 30.0,
        memory_quota_bytes: 4 << 30,
        online: "svc".into(),
        round: 7,
    }
}

fn pending_pod(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ml", "labels": {"xshare.io/role": "offline"}},
           "spec": {"containers": [{"name": "main", "image": "train:1",
                     "resources": {"limits": {"xshare.io/offline-gpu": "1"}}}]},
           "status": {"phase": "Pending"}})
}

fn uid(c: &FakeCluster, name: &str) -> String {
    c.pod("ml", name).unwrap()["metadata"]["uid"].as_str().unwrap().to_string()
}

fn lock_on(c: &FakeCluster) -> Option<BindLock> {
    let n = c.node(NODE).unwrap();
    n["metadata"]["annotations"][ANNOTATION].as_str().map(|v| BindLock::parse(v).unwrap())
}

fn bound_to(c: &FakeCluster, name: &str) -> Option<String> {
    c.pod("ml", name).unwrap()["spec"]["nodeName"].as_str().map(str::to_string)
}

fn cluster(pods: &[&str]) -> (FakeCluster, KubeApi) {
    let c = FakeCluster::start();
    c.add_node(json!({"metadata": {"name": NODE, "annotations": {"xshare.io/gpu-heartbeat": "{}"}}}));
    for p in pods {
        c.add_pod(pending_pod(p));
    }
    let api = KubeApi::connect(&ApiSource::Url(c.url()), Duration::from_secs(5)).unwrap().with_bind_lock(Some(TTL));
    (c, api)
}

fn bind(c: &FakeCluster, api: &KubeApi, name: &str) -> Result<(), ApiError> {
    api.bind_pod("ml", name, &uid(c, name), &placement())
}

/// The node agent's side: gives the lock back after the pod's Allocate.
fn give_back(c: &FakeCluster, pod_uid: &str) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = kube::Client::try_from(kube::Config::new(c.url().parse().unwrap())).unwrap();
        bind_lock::release(&client, NODE, pod_uid, "xshare-node-agent").await.unwrap()
    })
}

#[test]
fn one_pod_per_node_is_bound_until_its_allocate_gives_the_lock_back() {
    let (c, api) = cluster(&["a", "b"]);
    bind(&c, &api, "a").unwrap();
    assert_eq!(bound_to(&c, "a").as_deref(), Some(NODE));
    let l = lock_on(&c).expect("a's bind holds the node");
    assert_eq!((l.uid.as_str(), l.pod().as_str()), (uid(&c, "a").as_str(), "ml/a"));
    // The heartbeat annotation is untouched by the lock's patch.
    assert_eq!(c.node(NODE).unwrap()["metadata"]["annotations"]["xshare.io/gpu-heartbeat"], "{}");

    // b waits: refused, nothing written onto it, not bound.
    let e = bind(&c, &api, "b").unwrap_err();
    assert!(matches!(&e, ApiError::Locked { holder, .. } if holder == "ml/a"), "{e}");
    assert!(e.to_string().contains("kube-scheduler retries"), "{e}");
    assert!(bound_to(&c, "b").is_none());
    assert!(c.pod("ml", "b").unwrap()["metadata"]["annotations"].is_null(), "no plan written onto a pod not bound");
    assert_eq!(c.bindings().len(), 1);

    // a's bind retried by kube-scheduler (an answer lost): its own lock, taken again.
    c.add_pod({
        let mut p = c.pod("ml", "a").unwrap();
        p["spec"]["nodeName"] = Value::Null;
        p
    });
    bind(&c, &api, "a").unwrap();

    // Another pod's give-back changes nothing; a's own frees the node.
    assert!(!give_back(&c, &uid(&c, "b")));
    assert!(lock_on(&c).is_some());
    assert!(give_back(&c, &uid(&c, "a")));
    assert!(lock_on(&c).is_none());
    assert!(!give_back(&c, &uid(&c, "a")), "given back once");
    bind(&c, &api, "b").unwrap();
    assert_eq!(bound_to(&c, "b").as_deref(), Some(NODE));
    assert_eq!(lock_on(&c).unwrap().pod(), "ml/b");
    assert_eq!(api.bind_lock_counts(), (1, 0), "one refusal, no takeover");
}

#[test]
fn a_lock_whose_pod_no_longer_waits_for_allocate_or_that_expired_is_taken_over() {
    let (c, api) = cluster(&["a", "b", "c", "d", "e"]);
    // a was admitted (Running) but its give-back was lost.
    bind(&c, &api, "a").unwrap();
    c.set_pod_phase("ml", "a", "Running");
    bind(&c, &api, "b").unwrap();
    assert_eq!(lock_on(&c).unwrap().pod(), "ml/b");
    // b was admitted (the kubelet set its startTime; still Pending, pulling its image) and
    // its give-back was lost.
    let mut b = c.pod("ml", "b").unwrap();
    b["status"]["startTime"] = "2026-11-28T10:00:00Z".into();
    c.add_pod(b);
    c.add_pod(pending_pod("b2"));
    bind(&c, &api, "b2").unwrap();
    assert_eq!(lock_on(&c).unwrap().pod(), "ml/b2");
    // b2 deleted before the kubelet admitted it.
    c.delete_pod("ml", "b2", Some(0));
    assert!(c.pod("ml", "b2").is_none());
    bind(&c, &api, "c").unwrap();
    assert_eq!(lock_on(&c).unwrap().pod(), "ml/c");
    // c still Pending, but its lock is older than the TTL (the kubelet never came).
    let old = BindLock { since_unix_ms: lock_on(&c).unwrap().since_unix_ms - TTL.as_millis() as u64 - 1000, ..lock_on(&c).unwrap() };
    let mut n = c.node(NODE).unwrap();
    n["metadata"]["annotations"][ANNOTATION] = old.encode().into();
    c.add_node(n);
    bind(&c, &api, "d").unwrap();
    assert_eq!(lock_on(&c).unwrap().pod(), "ml/d");
    // A value nothing of ours wrote is taken over too.
    let mut n = c.node(NODE).unwrap();
    n["metadata"]["annotations"][ANNOTATION] = "held".into();
    c.add_node(n);
    bind(&c, &api, "e").unwrap();
    assert_eq!(lock_on(&c).unwrap().pod(), "ml/e");
    assert_eq!(api.bind_lock_counts(), (0, 5), "five takeovers, no refusal");
}

#[test]
fn a_bind_that_fails_after_taking_the_lock_gives_it_back() {
    let (c, api) = cluster(&["a", "b"]);
    // The pod was replaced since kube-scheduler read it: the plan's patch carrying the UID read
    // is refused (422 Invalid: metadata.uid is immutable).
    let e = api.bind_pod("ml", "a", "not-the-uid", &placement()).unwrap_err();
    assert_eq!(e.code(), Some(422), "{e}");
    assert!(lock_on(&c).is_none(), "given back");
    bind(&c, &api, "b").unwrap();
}

/// kube-scheduler retries the bind of a pod whose Binding already landed (it re-queues an
/// extender-bound pod its informer has not seen bound yet): the Binding answers `409 ...
/// already assigned` for this very pod on this very node. That is the bind done: the pod
/// still needs the node's lock until its Allocate, so the lock stays and a second pod waits.
#[test]
fn a_retried_bind_of_a_pod_already_bound_here_keeps_the_lock() {
    let (c, api) = cluster(&["a", "b"]);
    bind(&c, &api, "a").unwrap();
    assert_eq!(bound_to(&c, "a").as_deref(), Some(NODE));
    bind(&c, &api, "a").expect("a retried bind of a pod bound to this node is success");
    assert_eq!(c.bindings().len(), 1, "one Binding made");
    assert_eq!(lock_on(&c).expect("a keeps the node until its Allocate").pod(), "ml/a");
    let e = bind(&c, &api, "b").unwrap_err();
    assert!(matches!(&e, ApiError::Locked { holder, .. } if holder == "ml/a"), "{e}");
    assert!(bound_to(&c, "b").is_none());
    // Bound to another node: still a failure, and this node's lock given back.
    let mut b = c.pod("ml", "b").unwrap();
    b["spec"]["nodeName"] = "other".into();
    c.add_pod(b);
    assert!(give_back(&c, &uid(&c, "a")));
    let e = bind(&c, &api, "b").unwrap_err();
    assert_eq!(e.code(), Some(409), "{e}");
    assert!(lock_on(&c).is_none(), "given back");
}

#[test]
fn a_node_changed_between_read_and_write_is_read_again() {
    // The heartbeat lands between the extender's GET and its PATCH once: 409, then success.
    let patches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let p2 = patches.clone();
    let api = fake_api(move |r, _| {
        let node = |rv: &str| json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "resourceVersion": rv}});
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/api/v1/nodes/gpu-b") => Answer::Json(200, node("11"), vec![]),
            ("PATCH", "/api/v1/nodes/gpu-b") => {
                let body = r.json();
                assert_eq!(body["metadata"]["resourceVersion"], "11", "conditional on what was read");
                if p2.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                    let msg = "Operation cannot be fulfilled on nodes \"gpu-b\": the object has been modified; please apply your changes to the latest version and try again";
                    Answer::Json(409, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": msg, "reason": "Conflict", "details": {"name": NODE, "kind": "nodes"}, "code": 409}), vec![])
                } else {
                    Answer::Json(200, node("12"), vec![])
                }
            }
            ("PATCH", p) if p.starts_with("/api/v1/namespaces/ml/pods/") => {
                Answer::Json(200, json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "a", "namespace": "ml"}}), vec![])
            }
            ("POST", _) => Answer::Json(201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}), vec![]),
            _ => Answer::Json(404, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound", "code": 404}), vec![]),
        }
    });
    let k = KubeApi::connect(&ApiSource::Url(api.url.clone()), Duration::from_secs(5)).unwrap().with_bind_lock(Some(TTL));
    k.bind_pod("ml", "a", "uid-a", &placement()).unwrap();
    assert_eq!(patches.load(std::sync::atomic::Ordering::SeqCst), 2);
    let gets = api.reqs.lock().unwrap().iter().filter(|r| r.method == "GET").count();
    assert_eq!(gets, 2, "read again after the conflict");
}

/// Each slowed call of [`slow_bind_api`]: within the client's 2 s timeout, but the node
/// read, the plan write and the Binding together take longer than the bind's deadline (4 s).
const SLOW_CALL: Duration = Duration::from_millis(1500);

/// A fake API server whose first node read and plan write each take [`SLOW_CALL`], keeping the
/// node's bind lock in `lock`; `binding` answers the Binding's POST, `pod` the pod's GET.
fn slow_bind_api(
    lock: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    binding: impl Fn() -> Answer + Send + Sync + 'static,
    pod: impl Fn() -> Answer + Send + Sync + 'static,
) -> fake_kube::FakeApi {
    fake_api(move |r, before| {
        let node = |ann: &Option<String>| {
            let mut annotations = json!({});
            if let Some(v) = ann {
                annotations[ANNOTATION] = v.clone().into();
            }
            json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "resourceVersion": "11", "annotations": annotations}})
        };
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/api/v1/nodes/gpu-b") => {
                if before.is_empty() {
                    std::thread::sleep(SLOW_CALL);
                }
                Answer::Json(200, node(&lock.lock().unwrap()), vec![])
            }
            ("PATCH", "/api/v1/nodes/gpu-b") => {
                let v = &r.json()["metadata"]["annotations"][ANNOTATION];
                *lock.lock().unwrap() = v.as_str().map(str::to_string);
                Answer::Json(200, node(&lock.lock().unwrap()), vec![])
            }
            ("PATCH", "/api/v1/namespaces/ml/pods/a") => {
                std::thread::sleep(SLOW_CALL);
                Answer::Json(200, json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "a", "namespace": "ml"}}), vec![])
            }
            ("POST", "/api/v1/namespaces/ml/pods/a/binding") => binding(),
            ("GET", "/api/v1/namespaces/ml/pods/a") => pod(),
            _ => Answer::Json(404, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound", "code": 404}), vec![]),
        }
    })
}

/// Pod `ml/a`, Pending, bound to the node or not yet.
fn pod_a(bound: bool) -> Answer {
    let mut spec = json!({"containers": []});
    if bound {
        spec["nodeName"] = NODE.into();
    }
    Answer::Json(200, json!({"kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "a", "namespace": "ml", "uid": "uid-a"}, "spec": spec, "status": {"phase": "Pending"}}), vec![])
}

/// A bind cut short by its deadline (twice the client's timeout) after taking the node's lock:
/// every answer comes within the client's timeout, but the node read, the plan write and the
/// Binding together take longer. The lock is given back (its pod reads back unbound), so the
/// node does not refuse every offline bind until the lock's TTL. Before, nothing gave it back.
#[test]
fn a_bind_that_times_out_after_taking_the_lock_gives_it_back() {
    let lock: std::sync::Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let binding_started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (l2, b2) = (lock.clone(), binding_started.clone());
    let api = slow_bind_api(
        l2,
        move || {
            b2.store(true, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(SLOW_CALL);
            // Too late: the extender gave up; this Binding is not made.
            Answer::Json(504, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Timeout", "code": 504}), vec![])
        },
        || pod_a(false),
    );
    let k = KubeApi::connect(&ApiSource::Url(api.url.clone()), Duration::from_secs(2)).unwrap().with_bind_lock(Some(TTL));
    let e = k.bind_pod("ml", "a", "uid-a", &placement()).unwrap_err();
    assert!(e.to_string().contains("no answer within"), "the bind's deadline, not a call's: {e}");
    assert!(binding_started.load(std::sync::atomic::Ordering::SeqCst), "cut short while posting the Binding");
    let t0 = std::time::Instant::now();
    while lock.lock().unwrap().is_some() {
        assert!(t0.elapsed() < Duration::from_secs(30), "the timed-out bind's lock was never given back");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A bind cut short by its deadline while its Binding is still being made: the Binding lands
/// half a second after the extender gave up, and the pod is then bound to the node, on its
/// way to Allocate, which gives the lock back. The lock is kept: the give-back reads the pod
/// only after a Binding in flight has had time to land. Before, the read came at once, found
/// the pod unbound and gave the lock back, so a second pod could be bound to the node before
/// the first one's Allocate (node-agent then refuses both as ambiguous).
#[test]
fn a_bind_whose_binding_lands_after_the_deadline_keeps_the_lock() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let lock: std::sync::Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let bound = std::sync::Arc::new(AtomicBool::new(false));
    let read_bound = std::sync::Arc::new(AtomicBool::new(false));
    let (l2, b2, r2) = (lock.clone(), bound.clone(), read_bound.clone());
    let b3 = b2.clone();
    let api = slow_bind_api(
        l2,
        move || {
            std::thread::sleep(SLOW_CALL);
            // Made, after the extender's deadline.
            b2.store(true, SeqCst);
            Answer::Json(201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}), vec![])
        },
        move || {
            let is_bound = b3.load(SeqCst);
            if is_bound {
                r2.store(true, SeqCst);
            }
            pod_a(is_bound)
        },
    );
    let k = KubeApi::connect(&ApiSource::Url(api.url.clone()), Duration::from_secs(2)).unwrap().with_bind_lock(Some(TTL));
    let e = k.bind_pod("ml", "a", "uid-a", &placement()).unwrap_err();
    assert!(e.to_string().contains("no answer within"), "the bind's deadline: {e}");
    assert!(lock.lock().unwrap().is_some(), "the lock was taken");
    // Until the give-back has read the pod (or has given the lock back without a read that
    // found it bound).
    let t0 = std::time::Instant::now();
    while !read_bound.load(SeqCst) && lock.lock().unwrap().is_some() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the give-back never read the pod back");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A release would follow the read at once.
    std::thread::sleep(Duration::from_millis(300));
    assert!(lock.lock().unwrap().is_some(), "the bound pod's lock was given back before its Allocate");
}

/// A lock whose pod is still unbound long after any bind could have lasted (its bind timed
/// out and the give-back was lost, or the extender stopped mid-bind) no longer holds the node,
/// whatever its TTL: that pod will never reach Allocate through it.
#[test]
fn a_lock_of_a_pod_never_bound_is_taken_over_after_the_bind_deadline() {
    let c = FakeCluster::start();
    let held = BindLock {
        uid: String::new(),
        namespace: "ml".into(),
        name: "a".into(),
        // Well inside the TTL, well past the bind deadline (4 x 1 s).
        since_unix_ms: fake_kube::objects::now_ms() - 10_000,
    };
    c.add_pod(pending_pod("a"));
    c.add_pod(pending_pod("b"));
    let held = BindLock { uid: uid(&c, "a"), ..held };
    c.add_node(json!({"metadata": {"name": NODE, "annotations": {"xshare.io/gpu-heartbeat": "{}", ANNOTATION: held.encode()}}}));
    let api = KubeApi::connect(&ApiSource::Url(c.url()), Duration::from_secs(1)).unwrap().with_bind_lock(Some(TTL));
    bind(&c, &api, "b").unwrap();
    assert_eq!(lock_on(&c).unwrap().name, "b");
    assert_eq!(api.bind_lock_counts(), (0, 1));
    // A lock of an unbound pod younger than that still holds the node.
    let young = BindLock { uid: uid(&c, "b"), since_unix_ms: fake_kube::objects::now_ms(), namespace: "ml".into(), name: "b".into() };
    let c2 = FakeCluster::start();
    c2.add_pod(pending_pod("b"));
    c2.add_pod(pending_pod("x"));
    let young = BindLock { uid: uid(&c2, "b"), ..young };
    c2.add_node(json!({"metadata": {"name": NODE, "annotations": {"xshare.io/gpu-heartbeat": "{}", ANNOTATION: young.encode()}}}));
    let api2 = KubeApi::connect(&ApiSource::Url(c2.url()), Duration::from_secs(60)).unwrap().with_bind_lock(Some(TTL));
    assert!(matches!(bind(&c2, &api2, "x"), Err(ApiError::Locked { .. })));
}
