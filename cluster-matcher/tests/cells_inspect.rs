//! HiveD's inspect view of the cells (cluster status, physical cluster, per VC) from the
//! `inspect` subcommand and from the extender's `GET /inspect/clusterstatus…` routes.

mod plan_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cluster_matcher::cells::Cluster;
use cluster_matcher::extender::{self, Extender, ServerLimits};
use cluster_matcher::plan::with_cells::CellsState;
use cluster_matcher::plan::Workloads;
use plan_support::*;
use serde_json::Value;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/cells")
        .join(name)
}

fn inspect(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cluster-matcher"))
        .env("RUST_LOG", "warn")
        .arg("inspect")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_cli_prints_each_view() {
    let design = example("hived-design.json");
    let design = design.to_str().unwrap();
    let (ok, out, err) = inspect(&["--cells", design]);
    assert!(ok, "{err}");
    let all: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(all["virtual_clusters"].as_array().unwrap().len(), 2);
    assert_eq!(all["physical_cluster"]["safety"], "ok");
    let (ok, out, err) = inspect(&["--cells", design, "physicalcluster"]);
    assert!(ok, "{err}");
    let phys: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(phys["chains"].as_array().unwrap().len(), 6);
    // Host 1.0.0.2 appears once per chain it lends GPUs to: P100 0..7 and CT1 8, 9.
    let ct1: Vec<&Value> = phys["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["name"] == "1.0.0.2")
        .collect();
    assert_eq!(ct1.len(), 2);
    assert_eq!(ct1[1]["chain"], "CT1-NODE");
    assert_eq!(ct1[1]["gpus"][0]["index"], 8);
    let (ok, out, err) = inspect(&["--cells", design, "virtualclusters/VC2"]);
    assert!(ok, "{err}");
    let vc2: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(vc2["name"], "VC2");
    assert_eq!(vc2["gpus_assigned"], 24 + 2);
    assert_eq!(vc2["doomed_cells"], 0);
    let (ok, _, err) = inspect(&["--cells", design, "virtualclusters/nope"]);
    assert!(!ok && err.contains("no virtual cluster `nope`"), "{err}");
    let (ok, _, err) = inspect(&["--cells", design, "bogus"]);
    assert!(!ok && err.contains("no inspect view"), "{err}");
}

fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    fake_kube::http::request(addr, "GET", path, b"").status_json()
}

#[test]
fn the_server_serves_the_latest_rounds_cells_status() {
    let fig3 = example("hived-fig3.json");
    let mut spec = cluster(&[
        ("v100-n0", "V100", 8, 32_768),
        ("v100-n1", "V100", 8, 32_768),
        ("v100-n2", "V100", 8, 32_768),
        ("v100-n3", "V100", 8, 32_768),
    ]);
    spec.cells = Some(fig3.clone());
    let mut svc = online("svc-a", "v100-n0", 0, 8_000, 30.0, 10.0);
    svc.at = None;
    svc.tenant = "tenant-a".into();
    let w = Workloads {
        online: vec![svc],
        offline: vec![],
    };
    let cells = CellsState::new(Cluster::load(&fig3).unwrap());
    let ext = Arc::new(Extender::new(
        spec.clone(),
        w.clone(),
        similarity_predictor(),
        Some(cells),
    ));
    let server =
        extender::HttpServer::start("127.0.0.1:0", ext, ServerLimits::default()).unwrap();
    let addr = server.local_addr();
    let (status, all) = get(addr, "/inspect/clusterstatus");
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["virtual_clusters"][0]["gpus_in_use"], 1);
    let (status, a) = get(addr, "/inspect/clusterstatus/virtualclusters/tenant-a");
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["guaranteed"][0]["gpus"][0], "v100-n0/0");
    let (status, vcs) = get(addr, "/inspect/clusterstatus/virtualclusters");
    assert_eq!((status, vcs.as_array().unwrap().len()), (200, 3));
    let (status, p) = get(addr, "/inspect/clusterstatus/physicalcluster/");
    assert_eq!(status, 200);
    assert_eq!(p["nodes"][0]["gpus"][0]["guaranteed_vc"], "tenant-a");
    let (status, e) = get(addr, "/inspect/clusterstatus/virtualclusters/nope");
    assert_eq!(status, 404);
    assert!(e["Error"].as_str().unwrap().contains("`nope`"), "{e}");
    drop(server);

    // Without cells there is no inspect view, and the other routes are untouched.
    spec.cells = None;
    let ext = Arc::new(Extender::new(spec, Workloads::default(), similarity_predictor(), None));
    let server =
        extender::HttpServer::start("127.0.0.1:0", ext, ServerLimits::default()).unwrap();
    let (status, e) = get(server.local_addr(), "/inspect/clusterstatus");
    assert_eq!(status, 404);
    assert!(e["Error"].as_str().unwrap().contains("cells mode is off"), "{e}");
    assert_eq!(get(server.local_addr(), "/healthz").0, 200);
}
