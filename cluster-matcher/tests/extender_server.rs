//! The extender's HTTP server under hostile clients, and the plan off the request path:
//! a client stalled mid-body blocks no other request and is cut off at the read deadline,
//! an oversized body gets 413, and a filter request during a slow planning round answers
//! from the previous plan.

mod plan_support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster_matcher::extender::{self, Extender, ExtenderArgs, ServerLimits};
use cluster_matcher::plan::{self, ClusterSpec, Workloads};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender").join(name)
}

fn inputs() -> (ClusterSpec, Workloads) {
    let cluster = ClusterSpec::load(&fixture("cluster.json")).unwrap();
    let workloads = Workloads::load(&fixture("workloads.json"), &cluster).unwrap();
    (cluster, workloads)
}

/// Sends one request on a fresh connection; a generous socket timeout only turns a hang
/// into a failure.
fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    fake_kube::http::request(addr, method, path, body).status_json()
}

fn read_reply(s: &mut TcpStream) -> (u16, Value) {
    fake_kube::http::read_reply(s).status_json()
}

#[test]
fn a_client_stalled_mid_body_blocks_no_one_and_is_cut_off() {
    let (cluster, workloads) = inputs();
    let ext = Arc::new(Extender::new(cluster, workloads, plan_support::similarity_predictor(), None));
    let limits = ServerLimits { max_body: 1 << 20, read_timeout: Duration::from_secs(3) };
    let server = extender::HttpServer::start("127.0.0.1:0", ext, limits).unwrap();
    let addr = server.local_addr();
    let body = std::fs::read(fixture("filter_nodenames.json")).unwrap();

    // Announces the full body, sends half, then stalls.
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        stalled,
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    stalled.write_all(&body[..body.len() / 2]).unwrap();
    stalled.flush().unwrap();
    // And idle connections that never send a byte.
    let idle: Vec<TcpStream> = (0..32).map(|_| TcpStream::connect(addr).unwrap()).collect();

    // Meanwhile, many filter requests all get their answers.
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || request(addr, "POST", "/filter", &body))
        })
        .collect();
    for h in handles {
        let (status, v) = h.join().unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["NodeNames"], serde_json::json!(["gpu-b"]));
    }
    // The stalled client is answered 408 at the read deadline, not served forever.
    let (status, v) = read_reply(&mut stalled);
    assert_eq!(status, 408, "{v}");
    drop(idle);
}

#[test]
fn an_oversized_body_gets_413() {
    let (cluster, workloads) = inputs();
    let ext = Arc::new(Extender::new(cluster, workloads, plan_support::similarity_predictor(), None));
    let limits = ServerLimits { max_body: 4096, read_timeout: Duration::from_secs(10) };
    let server = extender::HttpServer::start("127.0.0.1:0", ext, limits).unwrap();
    let addr = server.local_addr();
    // Declared too large: refused before the body is read.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n").unwrap();
    let (status, v) = read_reply(&mut s);
    assert_eq!(status, 413, "{v}");
    // Chunked, with no length declared: cut off at the cap.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
    let chunk = vec![b' '; 1000];
    for _ in 0..8 {
        if write!(s, "{:x}\r\n", chunk.len()).is_err() || s.write_all(&chunk).is_err() || s.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    let (status, v) = read_reply(&mut s);
    assert_eq!(status, 413, "{v}");
    // A normal request still works.
    let (status, _) = request(addr, "POST", "/filter", &std::fs::read(fixture("filter_nodenames.json")).unwrap());
    assert_eq!(status, 200);
}

#[test]
fn filter_answers_from_the_previous_plan_while_a_slow_round_runs() {
    let (cluster, workloads) = inputs();
    let predictor = plan_support::similarity_predictor();
    let (started_tx, started_rx) = mpsc::channel::<u64>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (started_tx, release_rx) = (Mutex::new(started_tx), Mutex::new(release_rx));
    // Round 0 is computed at once; every later round announces itself and then blocks
    // until the test releases it: a planning round as slow as the test wants.
    let planner: extender::Planner = Box::new(move |w: &Workloads, round: u64| {
        let p = plan::run_round(&cluster, w, &predictor, None, round);
        if round > 0 {
            started_tx.lock().unwrap().send(round).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
        }
        p
    });
    let ext = Arc::new(Extender::with_planner(workloads, Duration::from_secs(3600), planner));
    let planner_thread = ext.spawn_planner();
    assert_eq!(ext.snapshot().round, 0);
    ext.replan();
    assert_eq!(started_rx.recv_timeout(Duration::from_secs(60)).unwrap(), 1, "round 1 started");

    // Round 1 is now stuck inside the planner: requests still answer, from round 0.
    let server = extender::HttpServer::start("127.0.0.1:0", ext.clone(), Default::default()).unwrap();
    let body = std::fs::read(fixture("filter_nodenames.json")).unwrap();
    let (status, v) = request(server.local_addr(), "POST", "/filter", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["NodeNames"], serde_json::json!(["gpu-b"]));
    let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
    assert_eq!(ext.filter(args).node_names.unwrap(), ["gpu-b"]);
    assert_eq!(ext.snapshot().round, 0, "answered from the previous plan");
    let (status, _) = request(server.local_addr(), "GET", "/plan", b"");
    assert_eq!(status, 200);

    // Released, round 1 is swapped in.
    release_tx.send(()).unwrap();
    for _ in 0..600 {
        if ext.snapshot().round == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ext.snapshot().round, 1);
    ext.stop_planner();
    drop(release_tx);
    planner_thread.join().unwrap();
}

/// Figures, not a test (`cargo test -p cluster-matcher --release --test extender_server -- --ignored --nocapture`):
/// 1000 concurrent filter requests while one client stalls mid-body; prints the answer times.
#[test]
#[ignore]
fn load_1000_concurrent_filters_with_one_stalled_client() {
    let (cluster, workloads) = inputs();
    let ext = Arc::new(Extender::new(cluster, workloads, plan_support::similarity_predictor(), None));
    let server = extender::HttpServer::start("127.0.0.1:0", ext, ServerLimits::default()).unwrap();
    let addr = server.local_addr();
    let body = std::fs::read(fixture("filter_nodenames.json")).unwrap();
    let mut stalled = TcpStream::connect(addr).unwrap();
    write!(stalled, "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len()).unwrap();
    stalled.write_all(&body[..body.len() / 2]).unwrap();
    let start = Arc::new(std::sync::Barrier::new(1000));
    let handles: Vec<_> = (0..1000)
        .map(|_| {
            let (body, start) = (body.clone(), start.clone());
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    start.wait();
                    let t = std::time::Instant::now();
                    let (status, _) = request(addr, "POST", "/filter", &body);
                    (status, t.elapsed())
                })
                .unwrap()
        })
        .collect();
    let mut times: Vec<Duration> = handles
        .into_iter()
        .map(|h| {
            let (status, t) = h.join().unwrap();
            assert_eq!(status, 200);
            t
        })
        .collect();
    times.sort();
    let pct = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
    println!("1000 concurrent filters, one stalled client: p50 {:?} p99 {:?} max {:?}", pct(50), pct(99), times[999]);
    drop(stalled);
}
