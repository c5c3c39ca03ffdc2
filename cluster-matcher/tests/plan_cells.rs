//! Placement with HiveD cells: online workloads on guaranteed cells of their VC, offline jobs
//! on colocated low-priority cells of the same GPUs.

mod plan_support;

use std::collections::HashSet;
use std::path::Path;

use cluster_matcher::cells::Cluster;
use cluster_matcher::cells::Sharing;
use cluster_matcher::plan::with_cells::{CellsState, plan_round_with_cells};
use cluster_matcher::plan::{GpuHealth, GpuRef, OnlineWorkload, Workloads};
use plan_support::*;

fn fig3() -> Cluster {
    Cluster::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cells/hived-fig3.json"))
        .unwrap()
}

/// The four 8-GPU V100 nodes of HiveD's figure 3.
fn spec4() -> cluster_matcher::plan::ClusterSpec {
    cluster(&[
        ("v100-n0", "V100", 8, 32_768),
        ("v100-n1", "V100", 8, 32_768),
        ("v100-n2", "V100", 8, 32_768),
        ("v100-n3", "V100", 8, 32_768),
    ])
}

fn unplaced_online(name: &str, tenant: &str, iso: f64) -> OnlineWorkload {
    let mut o = online(name, "v100-n0", 0, 8_000, 30.0, iso);
    o.at = None;
    o.tenant = tenant.into();
    o
}

#[test]
fn online_work_takes_guaranteed_cells_and_offline_work_their_low_priority_view() {
    let mut st = CellsState::new(fig3());
    let spec = spec4();
    let mut online: Vec<_> = (0..8)
        .map(|i| unplaced_online(&format!("a{i}"), "tenant-a", 10.0 + i as f64))
        .collect();
    online.push(unplaced_online("stranger", "tenant-x", 10.0));
    let w = Workloads {
        online,
        offline: (0..10)
            .map(|j| offline(&format!("job{j}"), 4_000, 10.0 + j as f64))
            .collect(),
    };
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let plan = plan_round_with_cells(&spec, &w, &similarity_predictor(), &healthy, 0, &mut st);

    // tenant-a owns 7 GPUs' worth of cells (a socket, a PCIe switch, a GPU): the 8th waits.
    assert_eq!(plan.online_placements.len(), 7, "{plan:#?}");
    let waiting: Vec<_> = plan
        .online_waiting
        .iter()
        .map(|w| (w.online.as_str(), w.reason.clone()))
        .collect();
    assert_eq!(waiting.len(), 2, "{waiting:?}");
    assert!(
        waiting
            .iter()
            .any(|(n, r)| n.starts_with('a') && r.contains("tenant-a")),
        "{waiting:?}"
    );
    assert!(
        waiting
            .iter()
            .any(|(n, r)| *n == "stranger" && r.contains("no virtual cluster")),
        "{waiting:?}"
    );

    // Offline jobs only beside placed online work, one per GPU (colocated_per_gpu = 1).
    let online_gpus: HashSet<_> = plan
        .online_placements
        .iter()
        .map(|p| p.at.clone())
        .collect();
    assert_eq!(online_gpus.len(), 7, "each online workload on its own GPU");
    assert_eq!(plan.assignments.len(), 7);
    let used: HashSet<_> = plan.assignments.iter().map(|a| a.at.clone()).collect();
    assert_eq!(used, online_gpus);
    assert_eq!(plan.unplaced.len(), 3);
    assert_eq!(
        st.cells.opportunistic_allocations().len(),
        7,
        "each assignment holds a colocated cell"
    );
    st.cells.check_safety().unwrap();
}

#[test]
fn full_colocated_slots_keep_a_gpu_out_of_matching() {
    let mut st = CellsState::new(fig3());
    let spec = spec4();
    let w = Workloads {
        online: vec![unplaced_online("a0", "tenant-a", 10.0)],
        offline: vec![offline("job", 4_000, 10.0)],
    };
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let first = plan_round_with_cells(&spec, &w, &similarity_predictor(), &healthy, 0, &mut st);
    assert_eq!(first.assignments.len(), 1);
    // Carry the cells state over and pin the online workload where it landed; its one
    // colocated slot is taken by a job outside the plan, so no job of the plan goes there.
    let mut w2 = w.clone();
    w2.online[0].at = Some(first.online_placements[0].at.clone());
    w2.offline[0].name = "job2".into();
    let g = st
        .cells
        .gpu_by_address(
            &first.online_placements[0].at.node,
            first.online_placements[0].at.gpu,
        )
        .unwrap();
    let second = plan_round_with_cells(&spec, &w2, &similarity_predictor(), &healthy, 1, &mut st);
    assert_eq!(
        second.assignments.len(),
        1,
        "the plan's own job moves to job2: {second:#?}"
    );
    st.cells
        .allocate_opportunistic_on(&[g], Sharing::Colocate)
        .unwrap_err();
    let mut w3 = w2.clone();
    w3.offline.clear();
    plan_round_with_cells(&spec, &w3, &similarity_predictor(), &healthy, 2, &mut st);
    st.cells
        .allocate_opportunistic_on(&[g], Sharing::Colocate)
        .unwrap();
    let second = plan_round_with_cells(&spec, &w2, &similarity_predictor(), &healthy, 3, &mut st);
    assert!(second.assignments.is_empty(), "{second:#?}");
    assert!(
        second.skipped_gpus[0].reason.contains("low-priority cell"),
        "{second:#?}"
    );
}

/// The GPU the pinned online workloads below are pinned to.
fn n0_gpu0() -> GpuRef {
    GpuRef {
        node: "v100-n0".into(),
        gpu: 0,
    }
}

#[test]
fn pinned_online_work_is_registered_so_the_cells_never_hand_its_gpu_out_again() {
    // Failed before pinned placements were registered: `u` got v100-n0/0 as well (two online
    // workloads, 40,000 MiB on one 32,768 MiB V100).
    let mut st = CellsState::new(fig3());
    let mut pinned = online("p", "v100-n0", 0, 20_000, 30.0, 10.0);
    pinned.tenant = "tenant-a".into();
    let mut u = unplaced_online("u", "tenant-a", 10.0);
    u.memory_mib = 20_000;
    let w = Workloads {
        online: vec![pinned, u],
        offline: vec![],
    };
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let plan = plan_round_with_cells(&spec4(), &w, &similarity_predictor(), &healthy, 0, &mut st);
    assert_eq!(plan.online_placements.len(), 1, "{plan:#?}");
    assert_ne!(plan.online_placements[0].at, n0_gpu0(), "{plan:#?}");
    let g = st.cells.gpu_by_address("v100-n0", 0).unwrap();
    assert!(
        st.cells.guaranteed_user(g).is_some(),
        "the pinned GPU is a guaranteed cell of tenant-a"
    );
    assert!(plan.online_unregistered.is_empty(), "{plan:#?}");
    st.cells.check_safety().unwrap();
    // A second round changes nothing and registers nothing twice.
    let again = plan_round_with_cells(&spec4(), &w, &similarity_predictor(), &healthy, 1, &mut st);
    assert!(
        again.online_placements.is_empty()
            && again.online_waiting.is_empty()
            && again.online_unregistered.is_empty(),
        "{again:#?}"
    );
    assert_eq!(st.cells.guaranteed_allocations().len(), 2);

    // Pinned work the tenant's VC cannot take is reported, and its GPU still never given out.
    let mut st = CellsState::new(fig3());
    let mut stranger = online("s", "v100-n0", 0, 20_000, 30.0, 10.0);
    stranger.tenant = "tenant-x".into();
    let w = Workloads {
        online: vec![stranger, unplaced_online("u", "tenant-a", 10.0)],
        offline: vec![],
    };
    let plan = plan_round_with_cells(&spec4(), &w, &similarity_predictor(), &healthy, 0, &mut st);
    assert_eq!(plan.online_unregistered.len(), 1, "{plan:#?}");
    assert!(
        plan.online_unregistered[0].reason.contains("tenant-x"),
        "{plan:#?}"
    );
    assert_ne!(plan.online_placements[0].at, n0_gpu0(), "{plan:#?}");
}

#[test]
fn an_offline_job_refused_at_the_cell_stage_is_rematched_to_its_next_best_gpu() {
    // Failed before re-matching: job2 was left waiting although v100-n0/1 had room.
    let text = include_str!("../examples/cells/hived-fig3.json").replacen(
        '{',
        "{ \"colocated_per_gpu\": 2,",
        1,
    );
    let mut st = CellsState::new(Cluster::from_json(&text, "fig3-2").unwrap());
    let mut spec = spec4();
    spec.max_offline_per_gpu = 2;
    let mut a = online("a", "v100-n0", 0, 8_000, 30.0, 10.0);
    a.tenant = "tenant-a".into();
    let mut b = online("b", "v100-n0", 1, 8_000, 30.0, 50.0);
    b.tenant = "tenant-a".into();
    // A colocated job outside the plan already holds one of n0/0's two slots.
    let g = st.cells.gpu_by_address("v100-n0", 0).unwrap();
    st.cells
        .allocate_opportunistic_on(&[g], Sharing::Colocate)
        .unwrap();
    let w = Workloads {
        online: vec![a, b],
        offline: vec![offline("job1", 4_000, 10.0), offline("job2", 4_000, 11.0)],
    };
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let plan = plan_round_with_cells(&spec, &w, &similarity_predictor(), &healthy, 0, &mut st);
    assert_eq!(plan.assignments.len(), 2, "{plan:#?}");
    assert!(plan.unplaced.is_empty(), "{plan:#?}");
    let gpus: HashSet<_> = plan.assignments.iter().map(|a| a.at.gpu).collect();
    assert_eq!(gpus, [0, 1].into(), "{plan:#?}");
    assert_eq!(st.offline.len(), 2);
}

#[test]
fn rounds_carry_the_cells_state_and_it_survives_a_restart() {
    // Failed before: every round started from the config, so `second` got the same GPU as
    // `first`, and the job's colocated cell was forgotten.
    let dir = std::env::temp_dir().join(format!("xshare-cells-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state_path = dir.join("cells-state.json");
    let _ = std::fs::remove_file(&state_path);
    let mut spec = spec4();
    spec.cells = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cells/hived-fig3.json"));
    spec.cells_state = Some(state_path.clone());
    let pred = similarity_predictor();
    let w1 = Workloads {
        online: vec![unplaced_online("first", "tenant-a", 10.0)],
        offline: vec![offline("job", 4_000, 10.0)],
    };
    let mut st = cluster_matcher::plan::load_cells(&spec).unwrap().unwrap();
    let p1 = cluster_matcher::plan::run_round(&spec, &w1, &pred, Some(&mut st), 0);
    let at1 = p1.online_placements[0].at.clone();
    assert_eq!(p1.assignments[0].at, at1);
    assert!(state_path.exists());

    // A restart: the state is rebuilt from the config plus the saved ledger.
    let mut st = cluster_matcher::plan::load_cells(&spec).unwrap().unwrap();
    assert_eq!(st.online["first"].at, at1);
    assert_eq!(st.offline["job"].at, at1);
    assert_eq!(st.cells.guaranteed_allocations().len(), 1);
    let mut w2 = w1.clone();
    w2.online.push(unplaced_online("second", "tenant-a", 10.0));
    let p2 = cluster_matcher::plan::run_round(&spec, &w2, &pred, Some(&mut st), 1);
    assert_eq!(
        p2.online_placements.len(),
        1,
        "only `second` is new: {p2:#?}"
    );
    assert_ne!(p2.online_placements[0].at, at1, "{p2:#?}");
    let kept = p2.assignments.iter().find(|a| a.offline == "job").unwrap();
    assert!(kept.kept && kept.at == at1, "{p2:#?}");
    assert!(p2.breaks.is_empty(), "{p2:#?}");
    assert_eq!(st.cells.guaranteed_allocations().len(), 2);

    // A workload that leaves gives its cell back (and the saved ledger says so).
    let w3 = Workloads {
        online: vec![w2.online[1].clone()],
        offline: vec![],
    };
    cluster_matcher::plan::run_round(&spec, &w3, &pred, Some(&mut st), 2);
    assert_eq!(st.cells.guaranteed_allocations().len(), 1);
    let st = cluster_matcher::plan::load_cells(&spec).unwrap().unwrap();
    assert_eq!(st.online.keys().collect::<Vec<_>>(), ["second"]);
    assert!(st.offline.is_empty());

    // A damaged state file is an error naming the file, never a silent fresh start.
    std::fs::write(&state_path, "{\"format\": \"xshare-cells-state\", \"vers").unwrap();
    let err = cluster_matcher::plan::load_cells(&spec)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cells-state.json") && err.contains("damaged"),
        "{err}"
    );
    std::fs::write(&state_path, r#"{"format":"xshare-cells-state","version":1,"online":{"x":{"tenant":"tenant-a","node":"nowhere","gpu":0}},"offline":{}}"#).unwrap();
    let err = cluster_matcher::plan::load_cells(&spec)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cells-state.json") && err.contains("`x`") && err.contains("nowhere"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_host_with_two_gpu_types_is_legal_and_scheduled_per_type() {
    // Failed before: the cells refused `mixed` appearing in two chains, and cluster.json
    // refused two entries named `mixed`.
    let cells_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cells/two-types-one-host.json");
    let mut st = CellsState::new(Cluster::load(&cells_path).unwrap());
    assert_eq!(
        st.cells
            .gpu_address(st.cells.gpu_by_address("mixed", 3).unwrap())
            .unwrap()
            .to_string(),
        "mixed/3"
    );
    assert_eq!(
        st.cells.chains()[st
            .cells
            .gpu_chain(st.cells.gpu_by_address("mixed", 2).unwrap())
            .unwrap()
            .0 as usize]
            .gpu_type,
        "T4"
    );
    assert!(st.cells.gpu_by_address("mixed", 4).is_none());
    let mut spec = cluster(&[("mixed", "V100", 2, 32_768), ("mixed", "T4", 2, 16_384)]);
    spec.check(Path::new("cluster.json")).unwrap();
    spec.cells = Some(cells_path);
    let mut t4 = unplaced_online("t4-svc", "tenant-a", 10.0);
    t4.gpu_type = Some("T4".into());
    t4.memory_mib = 8_000;
    let mut v = unplaced_online("v-svc", "tenant-a", 10.0);
    v.gpu_type = Some("V100".into());
    let mut job = offline("t4-only", 4_000, 10.0);
    job.gpu_types = vec!["T4".into()];
    let w = Workloads {
        online: vec![t4, v],
        offline: vec![job],
    };
    w.check(Path::new("w.json"), &spec).unwrap();
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let plan = plan_round_with_cells(&spec, &w, &similarity_predictor(), &healthy, 0, &mut st);
    let at = |n: &str| {
        plan.online_placements
            .iter()
            .find(|p| p.online == n)
            .unwrap()
            .at
            .clone()
    };
    assert_eq!(at("t4-svc").node, "mixed");
    assert!(
        at("t4-svc").gpu >= 2,
        "T4 GPUs are mixed/2 and mixed/3: {plan:#?}"
    );
    assert!(at("v-svc").gpu < 2, "{plan:#?}");
    assert_eq!(plan.assignments.len(), 1, "{plan:#?}");
    assert_eq!(plan.assignments[0].at, at("t4-svc"));
    assert_eq!(plan.assignments[0].gpu_type, "T4");
    // The same host and type twice is still an error naming it.
    let dup = cluster(&[("mixed", "V100", 2, 32_768), ("mixed", "V100", 2, 32_768)]);
    let err = dup
        .check(Path::new("cluster.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nodes[1].name") && err.contains("mixed"),
        "{err}"
    );
}

#[test]
fn an_affinity_group_gets_all_its_cells_or_none() {
    // Failed before groups existed: 2 of 3 members kept their cells when the third was refused.
    // tenant-c owns two node cells and a PCIe cell = 18 GPUs: 17 placed first, then a group of 3.
    let mut st = CellsState::new(fig3());
    let mut online: Vec<_> = (0..17)
        .map(|i| unplaced_online(&format!("c{i}"), "tenant-c", 10.0))
        .collect();
    for k in 0..3 {
        let mut m = unplaced_online(&format!("g{k}"), "tenant-c", 10.0);
        m.group = Some("trio".into());
        online.push(m);
    }
    let w = Workloads {
        online,
        offline: vec![],
    };
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let plan = plan_round_with_cells(&spec4(), &w, &similarity_predictor(), &healthy, 0, &mut st);
    assert_eq!(plan.online_placements.len(), 17, "{plan:#?}");
    assert!(
        plan.online_placements
            .iter()
            .all(|p| p.online.starts_with('c')),
        "{plan:#?}"
    );
    let waiting: Vec<_> = plan
        .online_waiting
        .iter()
        .filter(|w| w.online.starts_with('g'))
        .collect();
    assert_eq!(waiting.len(), 3, "{plan:#?}");
    assert!(
        waiting
            .iter()
            .all(|w| w.reason.contains("affinity group `trio`")),
        "{waiting:?}"
    );
    assert_eq!(
        st.cells.guaranteed_allocations().len(),
        17,
        "no member keeps a cell"
    );
    st.cells.check_safety().unwrap();
    // Room for the whole group: it is placed together.
    let w2 = Workloads {
        online: w.online[14..].to_vec(),
        offline: vec![],
    };
    let plan = plan_round_with_cells(&spec4(), &w2, &similarity_predictor(), &healthy, 1, &mut st);
    assert_eq!(
        plan.online_placements
            .iter()
            .filter(|p| p.online.starts_with('g'))
            .count(),
        3,
        "{plan:#?}"
    );
}

#[test]
fn a_restart_on_a_changed_config_downgrades_what_no_longer_fits_instead_of_failing() {
    // Failed before: the restart was refused ("tenant `a` has no virtual cluster"), so the
    // whole planner stopped; HiveD lazily downgrades such work instead.
    let dir = std::env::temp_dir().join(format!("xshare-cells-reconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cfg, state_path) = (dir.join("cells.json"), dir.join("cells-state.json"));
    let _ = std::fs::remove_file(&state_path);
    let v1 = r#"{ "chains": [ { "name": "c", "gpu_type": "V100",
        "levels": [ { "name": "gpu" }, { "name": "node", "children": 2 } ] } ],
      "physical_cells": [ { "chain": "c", "nodes": ["h0"] } ],
      "virtual_clusters": [ { "name": "a", "cells": [ { "chain": "c", "level": "gpu", "count": 1 } ] },
                            { "name": "b", "cells": [ { "chain": "c", "level": "gpu", "count": 1 } ] } ] }"#;
    std::fs::write(&cfg, v1).unwrap();
    let mut spec = cluster(&[("h0", "V100", 2, 32_768)]);
    spec.cells = Some(cfg.clone());
    spec.cells_state = Some(state_path.clone());
    let pred = similarity_predictor();
    let mut w = Workloads {
        online: vec![
            unplaced_online("sa", "a", 10.0),
            unplaced_online("sb", "b", 10.0),
        ],
        offline: vec![offline("job", 4_000, 10.0)],
    };
    let mut st = cluster_matcher::plan::load_cells(&spec).unwrap().unwrap();
    let p = cluster_matcher::plan::run_round(&spec, &w, &pred, Some(&mut st), 0);
    assert_eq!(p.online_placements.len(), 2, "{p:#?}");
    let at_sa = st.online["sa"].at.clone();

    // v2: VC `a` is gone, `b` owns the whole host.
    std::fs::write(&cfg, v1.replace(r#"{ "name": "a", "cells": [ { "chain": "c", "level": "gpu", "count": 1 } ] },"#, "").replace(r#""level": "gpu", "count": 1 } ] } ] }"#, r#""level": "node", "count": 1 } ] } ] }"#)).unwrap();
    let mut st = cluster_matcher::plan::load_cells(&spec).unwrap().unwrap();
    assert!(st.online.contains_key("sb"));
    assert_eq!(st.downgraded["sa"].at, at_sa);
    assert!(st.downgraded["sa"].reason.contains("tenant `a`"), "{:?}", st.downgraded);
    let p = cluster_matcher::plan::run_round(&spec, &w, &pred, Some(&mut st), 1);
    let sa = p.online_unregistered.iter().find(|u| u.online == "sa").unwrap();
    assert!(sa.reason.contains("downgraded"), "{p:#?}");
    // No offline job joins the downgraded workload's GPU (it holds it exclusively).
    assert!(p.assignments.iter().all(|a| a.at != at_sa), "{p:#?}");
    // The downgrade is saved and survives another restart.
    let mut st = cluster_matcher::plan::load_cells(&spec).unwrap().unwrap();
    assert_eq!(st.downgraded["sa"].at, at_sa);

    // `b` needs the GPU for new guaranteed work: the downgraded one is preempted then.
    w.online.push(unplaced_online("sb2", "b", 10.0));
    let p = cluster_matcher::plan::run_round(&spec, &w, &pred, Some(&mut st), 2);
    let sb2 = p.online_placements.iter().find(|o| o.online == "sb2").unwrap();
    assert_eq!(sb2.at, at_sa, "{p:#?}");
    let sa = p.online_waiting.iter().find(|u| u.online == "sa").unwrap();
    assert!(sa.reason.contains("preempted"), "{p:#?}");
    assert!(st.downgraded.is_empty());
    st.cells.audit().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A job's allowed nodes (the extender's: those kube-scheduler's own filters offered its pod)
/// bind cells mode too: allowed only on a node with no online GPU to pair with, the job is
/// placed nowhere (it was placed when any node was allowed).
#[test]
fn allowed_nodes_bind_cells_mode() {
    let spec = spec4();
    let mut w = Workloads {
        online: vec![unplaced_online("a0", "tenant-a", 10.0), unplaced_online("a1", "tenant-a", 20.0)],
        offline: vec![offline("job0", 4_000, 10.0)],
    };
    let healthy = |_: &GpuRef| GpuHealth::Healthy;
    let first = plan_round_with_cells(&spec, &w, &similarity_predictor(), &healthy, 0, &mut CellsState::new(fig3()));
    let planned = first.assignments.iter().find(|a| a.offline == "job0").expect("job0 placed").at.clone();
    w.offline[0].allowed_nodes = Some(["not-".to_string() + &planned.node].into());
    let plan = plan_round_with_cells(&spec, &w, &similarity_predictor(), &healthy, 0, &mut CellsState::new(fig3()));
    assert!(plan.assignments.iter().all(|a| a.offline != "job0"), "{plan:#?}");
    assert!(plan.unplaced.contains(&"job0".to_string()), "{plan:#?}");
}
