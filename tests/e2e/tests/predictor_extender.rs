//! End to end: the real `cluster-matcher serve` process answers kube-scheduler's extender calls
//! and follows the GPU health that node monitors publish (sysmonitor's state snapshot).
//! Needs `cargo build -p cluster-matcher` (same profile) first.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

struct Server {
    child: Child,
    addr: String,
    dir: PathBuf,
    /// Requests the fake API server saw: (method, path, body).
    api_seen: std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>,
}

/// A stand-in for the Kubernetes API server on loopback, enough for the extender's bind: the
/// node's GET and PATCH (its bind lock) with the node, the annotation PATCH with the pod, the `binding` subresource POST with 201 and the
/// Binding it was given (the shapes kube-apiserver answers with; the request shapes themselves
/// are checked against k8s-openapi types in cluster-matcher's extender_bind_api tests).
/// Requests the fake API server saw: `(method, path, body)`.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>;

fn fake_api() -> (String, Seen) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut head = String::new();
            let mut len = 0usize;
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                    break;
                }
                if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                if head.is_empty() {
                    head = l.trim().to_string();
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let mut parts = head.split_whitespace();
            let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
            let body = String::from_utf8_lossy(&body).into_owned();
            // The node's bind lock: read, then written conditionally (always free here).
            let (code, reply) = if path.starts_with("/api/v1/nodes/") {
                let name = path.trim_start_matches("/api/v1/nodes/").split('?').next().unwrap_or("").to_string();
                (200, json!({"kind": "Node", "apiVersion": "v1",
                    "metadata": {"name": name, "resourceVersion": "1"}}).to_string())
            } else if method == "PATCH" {
                let name = path.rsplit('/').next().unwrap_or("").split('?').next().unwrap_or("").to_string();
                (200, json!({"kind": "Pod", "apiVersion": "v1",
                    "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"},
                    "spec": {"containers": [{"name": "c", "image": "i"}]}}).to_string())
            } else {
                (201, body.clone())
            };
            log.lock().unwrap().push((method, path, body));
            let _ = write!(
                conn,
                "HTTP/1.1 {code} OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    (url, seen)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes a sysmonitor-shaped state snapshot for `node`'s GPU `gpu`.
fn publish(dir: &Path, node: &str, gpu: u32, state: &str) {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let p = dir
        .join("state")
        .join(node)
        .join(format!("gpu{gpu}"))
        .join("state.json");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let snap = json!({
        "gpu": gpu, "monitor_pid": 1, "boot_id": "e2e", "state": state,
        "admits_offline": state == "healthy", "disabled_by": null,
        "updated_unix_ms": ms, "updated_mono_ms": 1, "interval_ms": 5, "sample": null, "hold_ms": 0,
    });
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, snap.to_string()).unwrap();
    std::fs::rename(tmp, p).unwrap();
}

fn start() -> Server {
    let dir = std::env::temp_dir().join(format!("xshare-e2e-extender-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fixtures = repo().join("cluster-matcher/tests/fixtures/extender");
    let mut cluster: Value =
        serde_json::from_slice(&std::fs::read(fixtures.join("cluster.json")).unwrap()).unwrap();
    cluster["round_period_s"] = json!(1);
    cluster["state_dir"] = json!("state");
    for n in cluster["nodes"].as_array_mut().unwrap() {
        n["predictor_gpu_type"] = json!("v100");
    }
    std::fs::write(dir.join("cluster.json"), cluster.to_string()).unwrap();
    std::fs::copy(fixtures.join("workloads.json"), dir.join("workloads.json")).unwrap();
    publish(&dir, "gpu-a", 0, "healthy");
    publish(&dir, "gpu-a", 1, "healthy");
    publish(&dir, "gpu-b", 0, "healthy");

    let (api_url, api_seen) = fake_api();
    let bin = e2e::artifact("cluster-matcher");
    let mut child = Command::new(bin)
        .args(["serve", "--kube-api", &api_url, "--listen", "127.0.0.1:0", "--cluster"])
        .arg(dir.join("cluster.json"))
        .arg("--workloads")
        .arg(dir.join("workloads.json"))
        .arg("--model")
        .arg(repo().join("cluster-matcher/examples/speed-predictor.json"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        assert!(
            Instant::now() < deadline,
            "server did not report its address"
        );
        let line = lines.next().expect("server exited early").unwrap();
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server { child, addr, dir, api_seen }
}

fn post(addr: &str, path: &str, body: &Value) -> Value {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    serde_json::from_str(body).unwrap()
}

fn fixture(name: &str) -> Value {
    serde_json::from_slice(
        &std::fs::read(
            repo()
                .join("cluster-matcher/tests/fixtures/extender")
                .join(name),
        )
        .unwrap(),
    )
    .unwrap()
}

#[test]
fn extender_follows_the_plan_and_the_published_health() {
    let srv = start();
    let filter = fixture("filter_nodenames.json");

    // Healthy everywhere: the LM job is planned on exactly one node.
    let v = post(&srv.addr, "/xshare/filter", &filter);
    let placed = v["NodeNames"].as_array().unwrap().clone();
    assert_eq!(placed.len(), 1, "{v}");
    let node = placed[0].as_str().unwrap().to_string();
    let prio = post(&srv.addr, "/xshare/prioritize", &fixture("prioritize.json"));
    let top = prio
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|e| e["Score"].as_i64().unwrap())
        .unwrap()
        .clone();
    assert_eq!(top["Host"], node.as_str());

    // The monitor on every GPU of that node reports Overlimit: after the next round the job
    // may not go there any more.
    let gpus = if node == "gpu-a" { 2 } else { 1 };
    for g in 0..gpus {
        publish(&srv.dir, &node, g, "overlimit");
    }
    std::thread::sleep(Duration::from_millis(1_200));
    let v = post(&srv.addr, "/xshare/filter", &filter);
    assert!(
        !v["NodeNames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == node.as_str()),
        "{v}"
    );

    // Healthy again: the plan comes back.
    for g in 0..gpus {
        publish(&srv.dir, &node, g, "healthy");
    }
    std::thread::sleep(Duration::from_millis(1_200));
    let v = post(&srv.addr, "/xshare/filter", &filter);
    assert_eq!(v["NodeNames"], json!([node.as_str()]), "{v}");
    let mut bind = fixture("bind.json");
    bind["Node"] = json!(node.as_str());
    assert_eq!(post(&srv.addr, "/xshare/bind", &bind), json!({"Error": ""}));
    // Bind went through the API server: the Binding subresource got the planned node.
    let seen = srv.api_seen.lock().unwrap().clone();
    let post_binding = seen
        .iter()
        .find(|(m, p, _)| m == "POST" && p.split('?').next().unwrap_or("").ends_with("/binding"))
        .unwrap_or_else(|| panic!("no Binding posted: {seen:?}"));
    let b: Value = serde_json::from_str(&post_binding.2).unwrap();
    assert_eq!(b["target"]["name"], json!(node.as_str()), "{b}");
}
