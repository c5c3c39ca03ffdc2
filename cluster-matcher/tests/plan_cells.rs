//! Placement with HiveD cells: online workloads on guaranteed cells of their VC, offline jobs
//! on colocated low-priority cells of the same GPUs.

mod plan_support;

use std::collections::HashSet;
use std::path::Path;

use cluster_matcher::cells::Cluster;
use cluster_matcher::plan::with_cells::plan_round_with_cells;
use cluster_matcher::plan::{GpuHealth, GpuRef, OnlineWorkload, Workloads};
use plan_support::*;

fn fig3() -> Cluster {
    Cluster::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cells/hived-fig3.json")).unwrap()
}

fn unplaced_online(name: &str, tenant: &str, iso: f64) -> OnlineWorkload {
    let mut o = online(name, "v100-n0", 0, 8_000, 30.0, iso);
    o.at = None;
    o.tenant = tenant.into();
    o
}

#[test]
fn online_work_takes_guaranteed_cells_and_offline_work_their_low_priority_view() {
    let mut cells = fig3();
    let spec = cluster(&[("v100-n0", "V100", 8, 32_768), ("v100-n1", "V100", 8, 32_768), ("v100-n2", "V100", 8, 32_768), ("v100-n3", "V100", 8, 32_768)]);
    let mut online: Vec<_> = (0..8).map(|i| unplaced_online(&format!("a{i}"), "tenant-a", 10.0 + i as f64)).collect();
    online.push(unplaced_online("stranger", "tenant-x", 10.0));
    let w = Workloads { online, offline: (0..10).map(|j| offline(&format!("job{j}"), 4_000, 10.0 + j as f64)).collect() };
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let plan = plan_round_with_cells(&spec, &w, &similarity_predictor(), &healthy, 0, &mut cells);

    // tenant-a owns 7 GPUs' worth of cells (a socket, a PCIe switch, a GPU): the 8th waits.
    assert_eq!(plan.online_placements.len(), 7, "{plan:#?}");
    let waiting: Vec<_> = plan.online_waiting.iter().map(|w| (w.online.as_str(), w.reason.clone())).collect();
    assert_eq!(waiting.len(), 2, "{waiting:?}");
    assert!(waiting.iter().any(|(n, r)| n.starts_with('a') && r.contains("tenant-a")), "{waiting:?}");
    assert!(waiting.iter().any(|(n, r)| *n == "stranger" && r.contains("no virtual cluster")), "{waiting:?}");

    // Offline jobs only beside placed online work, one per GPU (colocated_per_gpu = 1).
    let online_gpus: HashSet<_> = plan.online_placements.iter().map(|p| p.at.clone()).collect();
    assert_eq!(online_gpus.len(), 7, "each online workload on its own GPU");
    assert_eq!(plan.assignments.len(), 7);
    let used: HashSet<_> = plan.assignments.iter().map(|a| a.at.clone()).collect();
    assert_eq!(used, online_gpus);
    assert_eq!(plan.unplaced.len(), 3);
    assert_eq!(cells.opportunistic_allocations().len(), 7, "each assignment holds a colocated cell");
    cells.check_safety().unwrap();
}

#[test]
fn full_colocated_slots_keep_a_gpu_out_of_matching() {
    let mut cells = fig3();
    let spec = cluster(&[("v100-n0", "V100", 8, 32_768), ("v100-n1", "V100", 8, 32_768), ("v100-n2", "V100", 8, 32_768), ("v100-n3", "V100", 8, 32_768)]);
    let w = Workloads { online: vec![unplaced_online("a0", "tenant-a", 10.0)], offline: vec![offline("job", 4_000, 10.0)] };
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let first = plan_round_with_cells(&spec, &w, &similarity_predictor(), &healthy, 0, &mut cells);
    assert_eq!(first.assignments.len(), 1);
    // Carry the cells state over and pin the online workload where it landed: its one
    // colocated slot is taken, so a second round cannot put another job there.
    let mut w2 = w.clone();
    w2.online[0].at = Some(first.online_placements[0].at.clone());
    w2.offline[0].name = "job2".into();
    let second = plan_round_with_cells(&spec, &w2, &similarity_predictor(), &healthy, 1, &mut cells);
    assert!(second.assignments.is_empty(), "{second:#?}");
    assert!(second.skipped_gpus[0].reason.contains("low-priority cell"), "{second:#?}");
}
