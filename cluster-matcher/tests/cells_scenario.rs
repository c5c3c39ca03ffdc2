//! One scenario in the style of hivedscheduler's big test: the HiveD paper's Figure 3 cluster
//! (one rack of four 8-GPU nodes; tenants A, B, C) walked through normal operation,
//! preemption, bad hardware and reconfiguration, with every placement written out.

use cluster_matcher::cells::{
    AllocError, CellsConfig, ChainId, Cluster, Doomed, GpuId, GpuRange, PhysicalCellConfig,
    Sharing, VcCellsConfig, VirtualClusterConfig,
};

const FIG3: &str = include_str!("../examples/cells/hived-fig3.json");

fn at(c: &Cluster, r: GpuRange) -> String {
    let first = c.gpu_address(GpuId(r.start)).unwrap();
    let last = c.gpu_address(GpuId(r.start + r.len - 1)).unwrap();
    if r.len == 1 {
        first.to_string()
    } else {
        format!("{}..{}", first, last.index)
    }
}

#[test]
fn hived_figure3_walkthrough() {
    let mut c = Cluster::from_json(FIG3, "hived-fig3.json").unwrap();
    let ch = c.chain_id("v100-rack").unwrap();
    let [a, b, cc] = ["tenant-a", "tenant-b", "tenant-c"].map(|n| c.vc_id(n).unwrap());
    let lv = |n: &str| c.level(ch, n).unwrap();
    let (gpu, pcie, socket, node) = (lv("gpu"), lv("pcie"), lv("socket"), lv("node"));
    // free per level [_, gpu, pcie, socket, node, rack]; owed = cells guaranteed, not bound.
    assert_eq!(c.free_cells(ch), [0, 0, 0, 0, 0, 1]);
    assert_eq!(c.owed_cells(ch), [0, 2, 3, 2, 2, 0]);

    // ---- 1. Normal operation: buddy splits, lowest level first ----------------------------
    let c_node1 = c.allocate_guaranteed(cc, ch, node).unwrap();
    assert_eq!(at(&c, c_node1.gpus), "v100-n0/0..7"); // rack split into 4 nodes
    let a_gpu = c.allocate_guaranteed(a, ch, gpu).unwrap();
    assert_eq!(at(&c, a_gpu.gpus), "v100-n1/0"); // n1 split down to one GPU
    let b_socket = c.allocate_guaranteed(b, ch, socket).unwrap();
    assert_eq!(at(&c, b_socket.gpus), "v100-n1/4..7"); // the buddy socket left by that split
    let c_pcie = c.allocate_guaranteed(cc, ch, pcie).unwrap();
    assert_eq!(at(&c, c_pcie.gpus), "v100-n1/2..3"); // the buddy PCIe switch
    assert_eq!(c.free_cells(ch), [0, 1, 0, 0, 2, 0]);
    assert_eq!(c.owed_cells(ch), [0, 1, 2, 1, 1, 0]);
    // Tenant A's view: a socket and a PCIe switch left; no node was ever its own.
    assert!(matches!(
        c.allocate_guaranteed(a, ch, node),
        Err(AllocError::NotInAssignment { .. })
    ));
    c.audit().unwrap();

    // ---- 2. Opportunistic work and preemption ---------------------------------------------
    // HiveD's opportunistic scheduler: hosts with the most low-priority work first, then the
    // least guaranteed work (n0 and n1 are full of it; n2 and n3 have none).
    let (x, xg) = c
        .allocate_opportunistic(ch, gpu, Sharing::Exclusive)
        .unwrap();
    assert_eq!(at(&c, xg), "v100-n2/0");
    let (y, yg) = c
        .allocate_opportunistic(ch, node, Sharing::Exclusive)
        .unwrap();
    assert_eq!(at(&c, yg), "v100-n3/0..7"); // n2 is no longer whole
    let (z, zg) = c
        .allocate_opportunistic(ch, pcie, Sharing::Colocate)
        .unwrap();
    assert_eq!(at(&c, zg), "v100-n2/2..3"); // beside X, the first free PCIe switch there
    // A matcher's choice: an exclusive job on the last free GPU of n1.
    let n1_1 = c.gpu_by_address("v100-n1", 1).unwrap();
    let w = c
        .allocate_opportunistic_on(&[n1_1], Sharing::Exclusive)
        .unwrap();
    // B's GPU: the free GPU cell comes before splitting a node (lowest level first); its
    // exclusive job is preempted.
    let b_gpu = c.allocate_guaranteed(b, ch, gpu).unwrap();
    assert_eq!(at(&c, b_gpu.gpus), "v100-n1/1");
    assert_eq!(b_gpu.preempted, vec![w]);
    assert!(c.release_opportunistic(w).is_err());
    // A's PCIe switch: n2 (one exclusive job) is split rather than n3 (eight); inside n2 the
    // socket without victims is taken, and the colocated job Z stays.
    let a_pcie = c.allocate_guaranteed(a, ch, pcie).unwrap();
    assert_eq!(at(&c, a_pcie.gpus), "v100-n2/4..5");
    assert!(a_pcie.preempted.is_empty());
    assert_eq!(c.opportunistic_user(c.gpu_by_address("v100-n2", 2).unwrap()), Some(z));
    // C's second node: only n3 is left, held by the exclusive job Y.
    let c_node2 = c.allocate_guaranteed(cc, ch, node).unwrap();
    assert_eq!(at(&c, c_node2.gpus), "v100-n3/0..7");
    assert_eq!(c_node2.preempted, vec![y]);
    assert_eq!(c.free_cells(ch), [0, 0, 1, 1, 0, 0]);
    assert_eq!(c.owed_cells(ch), [0, 0, 1, 1, 0, 0]);
    // For MuxFlow's offline jobs: every GPU but X's and Z's has a free low-priority slot.
    assert_eq!(c.free_gpus_for_opportunistic(Sharing::Colocate).len(), 29);
    let excl: Vec<String> = c
        .free_gpus_for_opportunistic(Sharing::Exclusive)
        .iter()
        .map(|&g| c.gpu_address(g).unwrap().to_string())
        .collect();
    assert_eq!(excl, ["v100-n2/1", "v100-n2/6", "v100-n2/7"]);
    c.audit().unwrap();

    // ---- 3. Bad hardware ------------------------------------------------------------------
    let n2_2 = c.gpu_by_address("v100-n2", 2).unwrap();
    let hit = c.set_gpu_health(n2_2, true).unwrap();
    assert_eq!(hit.evicted, vec![z]); // the offline job on the dead GPU is gone
    assert!(hit.affected.is_empty());
    let n2_4 = c.gpu_by_address("v100-n2", 4).unwrap();
    let hit = c.set_gpu_health(n2_4, true).unwrap();
    assert_eq!(hit.affected, vec![a_pcie.id]); // the online one is reported, not moved
    // The only free socket now has a bad GPU: A's socket is doomed until repair, in the
    // cluster's count and in A's own (HiveD counts doomed bad cells per VC).
    let doomed_socket = vec![Doomed {
        chain: ch,
        level: socket,
        cells: 1,
    }];
    assert_eq!(c.doomed(), doomed_socket);
    assert_eq!(c.vc_doomed(a), doomed_socket);
    assert_eq!(c.vc_doomed(b), vec![]);
    assert_eq!(c.vc_doomed(cc), vec![]);
    let r = c.report();
    let per_vc: Vec<i64> = r.virtual_clusters.iter().map(|v| v.doomed_cells).collect();
    assert_eq!(per_vc, [1, 0, 0]);
    assert_eq!(r.virtual_clusters[0].doomed[0].level, "socket");
    let b_pcie = c.allocate_guaranteed(b, ch, pcie).unwrap();
    assert_eq!(at(&c, b_pcie.gpus), "v100-n2/6..7");
    assert!(matches!(
        c.allocate_guaranteed(a, ch, socket),
        Err(AllocError::OnlyBadHardware { .. })
    ));
    // A GPU from A's socket: the socket is bound, a healthy GPU without victims is used.
    let a_gpu2 = c.allocate_guaranteed(a, ch, gpu).unwrap();
    assert_eq!(at(&c, a_gpu2.gpus), "v100-n2/1");
    c.release_guaranteed(a_gpu2.id).unwrap();
    c.set_gpu_health(n2_2, false).unwrap();
    assert_eq!(c.doomed(), vec![]);
    assert_eq!(c.vc_doomed(a), vec![]);
    c.audit().unwrap();

    // ---- 4. Reconfiguration ---------------------------------------------------------------
    // A second rack arrives with tenant D; tenant C gives up its PCIe switch.
    let mut cfg: CellsConfig = c.config().clone();
    cfg.physical_cells.push(PhysicalCellConfig {
        chain: "v100-rack".into(),
        level: None,
        nodes: (4..8).map(|i| format!("v100-n{i}")).collect(),
    });
    cfg.virtual_clusters[2].cells.retain(|k| k.level != "pcie");
    cfg.virtual_clusters.push(VirtualClusterConfig {
        name: "tenant-d".into(),
        cells: vec![VcCellsConfig {
            chain: "v100-rack".into(),
            level: "node".into(),
            count: 3,
        }],
    });
    // An infeasible version is refused and changes nothing.
    let mut too_big = cfg.clone();
    too_big.virtual_clusters[3].cells[0].count = 7;
    let err = c
        .reconfigure(too_big, "fig3-v2.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`tenant-d`") && err.contains("level `node`"),
        "{err}"
    );
    let r = c.reconfigure(cfg, "fig3-v2.json").unwrap();
    // C's PCIe switch no longer fits its VC: lazily downgraded, it runs on as opportunistic
    // work on the same GPUs instead of being dropped.
    assert!(r.lost_guaranteed.is_empty(), "{:?}", r.lost_guaranteed);
    assert_eq!(r.downgraded.len(), 1);
    assert_eq!(r.downgraded[0].old, c_pcie.id);
    let down: Vec<String> = r
        .cluster
        .opportunistic_gpus(r.downgraded[0].new)
        .unwrap()
        .iter()
        .map(|&g| r.cluster.gpu_address(g).unwrap().to_string())
        .collect();
    assert_eq!(down, ["v100-n1/2", "v100-n1/3"]);
    assert!(r.lost_opportunistic.is_empty());
    assert_eq!(r.kept_opportunistic.len(), 1);
    assert_eq!(r.kept_opportunistic[0].0, x);
    assert_eq!(r.kept_guaranteed.len(), 7);
    let mut n = r.cluster;
    for (old, new) in &r.kept_guaranteed {
        assert_eq!(
            at(&c, c.guaranteed_gpus(*old).unwrap()),
            at(&n, n.guaranteed_gpus(*new).unwrap())
        );
    }
    assert_eq!(n.bad_gpus(), vec![n.gpu_by_address("v100-n2", 4).unwrap()]);
    n.audit().unwrap();
    let ch2 = n.chain_id("v100-rack").unwrap();
    let d = n.vc_id("tenant-d").unwrap();
    let d_node = n.allocate_guaranteed(d, ch2, node).unwrap();
    assert_eq!(at(&n, d_node.gpus), "v100-n4/0..7");
    // C's PCIe switch is a free cell again in the first rack (with the downgraded work on it).
    assert_eq!(n.free_cells(ch2)[pcie as usize], 1);

    // ---- 5. Everything released: the buddies merge back into two racks ---------------------
    for id in n.guaranteed_allocations() {
        n.release_guaranteed(id).unwrap();
    }
    assert_eq!(n.free_cells(ChainId(0)), [0, 0, 0, 0, 0, 2]);
    n.audit().unwrap();
}

/// HiveD's own published design configuration (`example/config/design/hivedscheduler.yaml`
/// in microsoft/hivedscheduler), translated to this crate's config: one chain per HiveD
/// top-level cell type, the same nodes, and the same VC assignment. Differences, all of them
/// features this crate does not have: pinned cells become ordinary preassigned cells of the
/// same type (VC1-YQW-CT1 a CT1 GPU, VC1-YQW-DGX2 a 2-DGX2-V100-NODE cell, VC1-YQW-IB-DGX2
/// the IB rack), and node 1.0.0.0's permuted GPU indices are in topology order.
const DESIGN: &str = include_str!("../examples/cells/hived-design.json");

fn chain_level(c: &Cluster, chain: &str, level: &str) -> (ChainId, u8) {
    let ch = c.chain_id(chain).unwrap();
    (ch, c.level(ch, level).unwrap())
}

#[test]
fn hived_design_config_walkthrough() {
    let mut c = Cluster::from_json(DESIGN, "hived-design.json").unwrap();
    let [vc1, vc2] = ["VC1", "VC2"].map(|n| c.vc_id(n).unwrap());
    assert_eq!(c.gpu_count(), 24 + 6 + 32 + 48 + 128 + 32);
    // Node 1.0.0.2 lends GPUs 0..7 to the P100 rack and 8, 9 to CT1 (two chains on a host).
    let p100_node = chain_level(&c, "3-DGX1-P100-NODE", "DGX1-P100-NODE");
    let p100_socket = chain_level(&c, "3-DGX1-P100-NODE", "DGX1-P100-CPU-SOCKET");
    let p100_gpu = chain_level(&c, "3-DGX1-P100-NODE", "DGX1-P100");
    let ct1_gpu = chain_level(&c, "CT1-NODE", "CT1");
    let ct1_node = chain_level(&c, "CT1-NODE", "CT1-NODE");
    let dgx2_node = chain_level(&c, "DGX2-V100-NODE", "DGX2-V100-NODE");
    let rack3_node = chain_level(&c, "3-DGX2-V100-NODE", "DGX2-V100-NODE");
    let rack4_pair = chain_level(&c, "4-DGX2-V100-NODE", "2-DGX2-V100-NODE");
    let rack4_node = chain_level(&c, "4-DGX2-V100-NODE", "DGX2-V100-NODE");
    let ib_rack = chain_level(&c, "2-IB-DGX2-V100-NODE", "2-IB-DGX2-V100-NODE");
    let alloc = |c: &mut Cluster, vc, (ch, l): (ChainId, u8)| c.allocate_guaranteed(vc, ch, l);

    // ---- 1. Normal operation ----------------------------------------------------------------
    let v2_node = alloc(&mut c, vc2, p100_node).unwrap();
    assert_eq!(at(&c, v2_node.gpus), "1.0.0.2/0..7");
    let v2_socket = alloc(&mut c, vc2, p100_socket).unwrap();
    assert_eq!(at(&c, v2_socket.gpus), "1.0.0.1/0..3");
    let v1_ct1 = alloc(&mut c, vc1, ct1_gpu).unwrap();
    assert_eq!(at(&c, v1_ct1.gpus), "0.0.0.0/0");
    let v2_ct1 = alloc(&mut c, vc2, ct1_node).unwrap();
    assert_eq!(at(&c, v2_ct1.gpus), "0.0.0.1/0..1");
    let v1_ib = alloc(&mut c, vc1, ib_rack).unwrap();
    assert_eq!(v1_ib.gpus.len, 32);
    assert_eq!(at(&c, v1_ib.gpus), "0.1.0.0/0..15"); // the range runs on into 0.1.0.1
    let v1_pair = alloc(&mut c, vc1, rack4_pair).unwrap();
    assert_eq!(at(&c, v1_pair.gpus), "0.0.3.0/0..15");
    let v1_r3 = alloc(&mut c, vc1, rack3_node).unwrap();
    assert_eq!(at(&c, v1_r3.gpus), "0.0.2.0/0..15");
    // VC1 has no P100 and VC2 no DGX2: a VC only ever gets its own cell types.
    assert!(matches!(alloc(&mut c, vc1, p100_gpu), Err(AllocError::NotInAssignment { .. })));
    assert!(matches!(alloc(&mut c, vc2, dgx2_node), Err(AllocError::NotInAssignment { .. })));
    c.audit().unwrap();

    // ---- 2. Opportunistic work, priorities and preemption -----------------------------------
    // An opportunistic CT1 GPU goes to the CT1 host without guaranteed work: 1.0.0.2, whose
    // CT1 GPUs are 8 and 9.
    let (opp_ct1, g) = c
        .allocate_opportunistic(ct1_gpu.0, ct1_gpu.1, Sharing::Exclusive)
        .unwrap();
    assert_eq!(at(&c, g), "1.0.0.2/8");
    // VC2 fills the rest of its P100 view at priority 1: one node and one socket left.
    let low_node = c
        .allocate_guaranteed_with_priority(vc2, p100_node.0, p100_node.1, 1)
        .unwrap();
    assert_eq!(at(&c, low_node.gpus), "1.0.0.0/0..7");
    let low_socket = c
        .allocate_guaranteed_with_priority(vc2, p100_socket.0, p100_socket.1, 1)
        .unwrap();
    assert_eq!(at(&c, low_socket.gpus), "1.0.0.1/4..7");
    // A priority-10 socket: VC2's view is full, so the lowest-priority work that frees a
    // socket goes — VC2's first socket (priority 0, 4 GPUs) — and the new work takes its place.
    let high = c
        .allocate_guaranteed_with_priority(vc2, p100_socket.0, p100_socket.1, 10)
        .unwrap();
    assert_eq!(high.preempted_guaranteed, vec![v2_socket.id]);
    assert_eq!(at(&c, high.gpus), "1.0.0.1/0..3");
    assert_eq!(c.guaranteed_priority(high.id).unwrap(), 10);
    // Equal priority never preempts; nor does VC1, whatever its priority, touch VC2.
    assert!(matches!(
        c.allocate_guaranteed_with_priority(vc2, p100_socket.0, p100_socket.1, 0),
        Err(AllocError::NotInAssignment { .. })
    ));
    assert!(c
        .allocate_guaranteed_with_priority(vc1, p100_gpu.0, p100_gpu.1, 1000)
        .is_err());
    // A priority-5 GPU must free a whole cell of VC2's view: among the node (priority 0),
    // the node and socket (priority 1) and the socket (priority 10), the priority-0 node goes.
    let gpu5 = c
        .allocate_guaranteed_with_priority(vc2, p100_gpu.0, p100_gpu.1, 5)
        .unwrap();
    assert_eq!(gpu5.preempted_guaranteed, vec![v2_node.id]);
    assert_eq!(at(&c, gpu5.gpus), "1.0.0.2/0");
    assert!(c.guaranteed_priority(low_node.id).is_ok());
    assert!(c.guaranteed_priority(low_socket.id).is_ok());
    c.audit().unwrap();

    // ---- 3. Bad hardware --------------------------------------------------------------------
    // DGX2 node 0.0.5.0 dies: VC1 still owes two DGX2-V100-NODE cells of that chain and only
    // 0.0.1.0 is healthy, so one of VC1's cells is doomed (counted for VC1, not VC2).
    let hit = c.set_node_health("0.0.5.0", true).unwrap();
    assert!(hit.evicted.is_empty() && hit.affected.is_empty());
    assert_eq!(
        c.vc_doomed(vc1),
        vec![Doomed { chain: dgx2_node.0, level: dgx2_node.1, cells: 1 }]
    );
    assert_eq!(c.vc_doomed(vc2), vec![]);
    let status = c.report();
    assert_eq!(status.virtual_clusters[0].doomed_cells, 1);
    assert_eq!(status.virtual_clusters[1].doomed_cells, 0);
    assert_eq!(status.physical_cluster.bad_gpus.len(), 16);
    let d1 = alloc(&mut c, vc1, dgx2_node).unwrap();
    assert_eq!(at(&c, d1.gpus), "0.0.1.0/0..15");
    assert!(matches!(alloc(&mut c, vc1, dgx2_node), Err(AllocError::OnlyBadHardware { .. })));
    // A bad GPU under running work is reported, the work is not moved.
    let hit = c
        .set_gpu_health(c.gpu_by_address("0.0.3.1", 3).unwrap(), true)
        .unwrap();
    assert_eq!(hit.affected, vec![v1_pair.id]);
    // Repaired: the doomed cell is served again.
    c.set_node_health("0.0.5.0", false).unwrap();
    assert_eq!(c.vc_doomed(vc1), vec![]);
    let d2 = alloc(&mut c, vc1, dgx2_node).unwrap();
    assert_eq!(at(&c, d2.gpus), "0.0.5.0/0..15");
    // VC1's second 4-rack node avoids the pair with the bad GPU: it is bound in 0.0.3.2's
    // half of the rack.
    let v1_r4 = alloc(&mut c, vc1, rack4_node).unwrap();
    assert_eq!(at(&c, v1_r4.gpus), "0.0.3.2/0..15");
    c.audit().unwrap();

    // ---- 4. Reconfiguration -----------------------------------------------------------------
    // VC2's CT1 node moves to a new VC3: VC2's running CT1 work is lazily downgraded (runs on
    // as opportunistic work); VC3's node then takes the CT1 host with the fewest victims.
    let mut cfg = c.config().clone();
    cfg.virtual_clusters[1].cells.retain(|k| k.chain != "CT1-NODE");
    cfg.virtual_clusters.push(VirtualClusterConfig {
        name: "VC3".into(),
        cells: vec![VcCellsConfig {
            chain: "CT1-NODE".into(),
            level: "CT1-NODE".into(),
            count: 1,
        }],
    });
    let r = c.reconfigure(cfg, "hived-design-v2.json").unwrap();
    assert!(r.lost_guaranteed.is_empty(), "{:?}", r.lost_guaranteed);
    assert_eq!(r.downgraded.len(), 1);
    assert_eq!(r.downgraded[0].old, v2_ct1.id);
    assert!(r.downgraded[0].reason.contains("CT1"), "{}", r.downgraded[0].reason);
    assert_eq!(r.kept_opportunistic.len(), 1);
    let mut n = r.cluster;
    let vc3 = n.vc_id("VC3").unwrap();
    let (ct1, ct1_node_level) = chain_level(&n, "CT1-NODE", "CT1-NODE");
    let v3 = n.allocate_guaranteed(vc3, ct1, ct1_node_level).unwrap();
    assert_eq!(at(&n, v3.gpus), "1.0.0.2/8..9");
    assert_eq!(v3.preempted, vec![r.kept_opportunistic[0].1]);
    assert_eq!(
        n.opportunistic_gpus(r.downgraded[0].new)
            .unwrap()
            .iter()
            .map(|&g| n.gpu_address(g).unwrap().to_string())
            .collect::<Vec<_>>(),
        ["0.0.0.1/0", "0.0.0.1/1"]
    );
    let _ = opp_ct1;
    n.audit().unwrap();
}

#[test]
fn an_affinity_group_gets_all_its_cells_or_none() {
    let mut c = Cluster::from_json(FIG3, "hived-fig3.json").unwrap();
    let ch = c.chain_id("v100-rack").unwrap();
    let a = c.vc_id("tenant-a").unwrap();
    let lv = |n: &str| c.level(ch, n).unwrap();
    let (gpu, pcie, socket, node) = (lv("gpu"), lv("pcie"), lv("socket"), lv("node"));
    let before = c.report();
    // The third member is outside tenant A's assignment: nobody keeps a cell.
    let err = c
        .allocate_group(a, &[(ch, socket), (ch, pcie), (ch, node)], 0)
        .unwrap_err();
    assert_eq!(err.0, 2);
    assert!(matches!(err.1, AllocError::NotInAssignment { .. }));
    assert_eq!(c.report(), before);
    assert!(c.guaranteed_allocations().is_empty());
    let all = c
        .allocate_group(a, &[(ch, socket), (ch, pcie), (ch, gpu)], 0)
        .unwrap();
    let got: Vec<String> = all.iter().map(|g| at(&c, g.gpus)).collect();
    assert_eq!(got, ["v100-n0/0..3", "v100-n0/4..5", "v100-n0/6"]);
    c.audit().unwrap();
}

#[test]
fn opportunistic_jobs_pack_away_from_guaranteed_work() {
    let mut c = Cluster::from_json(FIG3, "hived-fig3.json").unwrap();
    let ch = c.chain_id("v100-rack").unwrap();
    let a = c.vc_id("tenant-a").unwrap();
    let online = c.allocate_guaranteed(a, ch, 1).unwrap();
    assert_eq!(at(&c, online.gpus), "v100-n0/0");
    // Before: the lowest free cell, n0/1, right beside the guaranteed GPU.
    let (_, g1) = c.allocate_opportunistic(ch, 1, Sharing::Exclusive).unwrap();
    assert_eq!(at(&c, g1), "v100-n1/0");
    // The next one packs with the first (same priority), still away from n0.
    let (_, g2) = c.allocate_opportunistic(ch, 1, Sharing::Exclusive).unwrap();
    assert_eq!(at(&c, g2), "v100-n1/1");
    c.audit().unwrap();
}

#[test]
fn reconfiguration_downgrades_and_guaranteed_work_preempts_the_downgraded_lazily() {
    let text = r#"{ "chains": [ { "name": "c", "gpu_type": "T4",
        "levels": [ { "name": "gpu" }, { "name": "node", "children": 2 } ] } ],
      "physical_cells": [ { "chain": "c", "nodes": ["h0"] }, { "chain": "c", "nodes": ["h1"] } ],
      "virtual_clusters": [ { "name": "a", "cells": [ { "chain": "c", "level": "node", "count": 1 } ] },
                            { "name": "b", "cells": [ { "chain": "c", "level": "node", "count": 1 } ] } ] }"#;
    let mut c = Cluster::from_json(text, "two.json").unwrap();
    let ch = c.chain_id("c").unwrap();
    let a = c.vc_id("a").unwrap();
    let run = c.allocate_guaranteed(a, ch, 1).unwrap();
    assert_eq!(at(&c, run.gpus), "h0/0");
    let gone = c.allocate_guaranteed(a, ch, 1).unwrap();
    assert_eq!(at(&c, gone.gpus), "h0/1");
    // VC a is dropped; b owns h1's node and one GPU; host h0 keeps only GPU 0.
    let mut cfg = c.config().clone();
    cfg.virtual_clusters.remove(0);
    cfg.virtual_clusters[0].cells.push(VcCellsConfig {
        chain: "c".into(),
        level: "gpu".into(),
        count: 1,
    });
    cfg.physical_cells[0].level = Some("gpu".into());
    let r = c.reconfigure(cfg, "two-v2.json").unwrap();
    // Before: both were lost. Now the one whose GPU is still there runs on, downgraded.
    assert_eq!(r.downgraded.len(), 1);
    assert_eq!(r.downgraded[0].old, run.id);
    assert!(r.downgraded[0].reason.contains("`a` no longer exists"), "{:?}", r.downgraded);
    assert_eq!(r.lost_guaranteed.len(), 1);
    assert_eq!(r.lost_guaranteed[0].0, gone.id);
    let mut n = r.cluster;
    n.audit().unwrap();
    let b = n.vc_id("b").unwrap();
    let ch = n.chain_id("c").unwrap();
    // b's GPU cell can only be h0/0 (splitting h1 would break b's node guarantee): the
    // downgraded work is preempted then, lazily, not at the reconfiguration.
    let b1 = n.allocate_guaranteed(b, ch, 1).unwrap();
    assert_eq!(at(&n, b1.gpus), "h0/0");
    assert_eq!(b1.preempted, vec![r.downgraded[0].new]);
    let b2 = n.allocate_guaranteed(b, ch, 2).unwrap();
    assert_eq!(at(&n, b2.gpus), "h1/0..1");
    n.audit().unwrap();
}
