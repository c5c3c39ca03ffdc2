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
    let (x, xg) = c
        .allocate_opportunistic(ch, gpu, Sharing::Exclusive)
        .unwrap();
    assert_eq!(at(&c, xg), "v100-n1/1"); // the lowest free cell first
    let (y, yg) = c
        .allocate_opportunistic(ch, node, Sharing::Exclusive)
        .unwrap();
    assert_eq!(at(&c, yg), "v100-n2/0..7");
    let (z, zg) = c
        .allocate_opportunistic(ch, pcie, Sharing::Colocate)
        .unwrap();
    assert_eq!(at(&c, zg), "v100-n3/0..1"); // n2 now has an exclusive user; n3 is clean
                                            // B's GPU: splitting clean n3 would leave too little for the cells still owed (A's socket,
                                            // A's and B's PCIe switches), so safety wins over avoiding preemption: X goes.
    let b_gpu = c.allocate_guaranteed(b, ch, gpu).unwrap();
    assert_eq!(at(&c, b_gpu.gpus), "v100-n1/1");
    assert_eq!(b_gpu.preempted, vec![x]);
    assert!(c.release_opportunistic(x).is_err());
    // A's PCIe switch: n3 is safe to split; the colocated job Z stays beside it.
    let a_pcie = c.allocate_guaranteed(a, ch, pcie).unwrap();
    assert_eq!(at(&c, a_pcie.gpus), "v100-n3/0..1");
    assert!(a_pcie.preempted.is_empty());
    assert_eq!(c.opportunistic_user(GpuId(24)), Some(z));
    // C's second node: only n2 is left, held by the exclusive job Y.
    let c_node2 = c.allocate_guaranteed(cc, ch, node).unwrap();
    assert_eq!(at(&c, c_node2.gpus), "v100-n2/0..7");
    assert_eq!(c_node2.preempted, vec![y]);
    assert_eq!(c.free_cells(ch), [0, 0, 1, 1, 0, 0]);
    assert_eq!(c.owed_cells(ch), [0, 0, 1, 1, 0, 0]);
    // For MuxFlow's offline jobs: every GPU but the colocated pair has a free low-priority slot.
    assert_eq!(c.free_gpus_for_opportunistic(Sharing::Colocate).len(), 30);
    let excl: Vec<String> = c
        .free_gpus_for_opportunistic(Sharing::Exclusive)
        .iter()
        .map(|&g| c.gpu_address(g).unwrap().to_string())
        .collect();
    assert_eq!(
        excl,
        [
            "v100-n3/2",
            "v100-n3/3",
            "v100-n3/4",
            "v100-n3/5",
            "v100-n3/6",
            "v100-n3/7"
        ]
    );
    c.audit().unwrap();

    // ---- 3. Bad hardware ------------------------------------------------------------------
    let n3_0 = c.gpu_by_address("v100-n3", 0).unwrap();
    let hit = c.set_gpu_health(n3_0, true).unwrap();
    assert_eq!(hit.evicted, vec![z]); // the offline job on the dead GPU is gone
    assert_eq!(hit.affected, vec![a_pcie.id]); // the online one is reported, not moved
    let n3_5 = c.gpu_by_address("v100-n3", 5).unwrap();
    assert!(c.set_gpu_health(n3_5, true).unwrap().affected.is_empty());
    // The only free socket now has a bad GPU: A's socket is doomed until repair.
    assert_eq!(
        c.doomed(),
        vec![Doomed {
            chain: ch,
            level: socket,
            cells: 1
        }]
    );
    let b_pcie = c.allocate_guaranteed(b, ch, pcie).unwrap();
    assert_eq!(at(&c, b_pcie.gpus), "v100-n3/2..3");
    assert!(matches!(
        c.allocate_guaranteed(a, ch, socket),
        Err(AllocError::OnlyBadHardware { .. })
    ));
    // A GPU from A's socket: the socket is bound, the healthy half of it is used.
    let a_gpu2 = c.allocate_guaranteed(a, ch, gpu).unwrap();
    assert_eq!(at(&c, a_gpu2.gpus), "v100-n3/6");
    c.release_guaranteed(a_gpu2.id).unwrap();
    c.set_gpu_health(n3_5, false).unwrap();
    assert_eq!(c.doomed(), vec![]);
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
    assert_eq!(r.lost_guaranteed.len(), 1);
    assert_eq!(r.lost_guaranteed[0].0, c_pcie.id);
    assert!(r.lost_opportunistic.is_empty());
    assert_eq!(r.kept_guaranteed.len(), 7);
    let mut n = r.cluster;
    for (old, new) in &r.kept_guaranteed {
        assert_eq!(
            at(&c, c.guaranteed_gpus(*old).unwrap()),
            at(&n, n.guaranteed_gpus(*new).unwrap())
        );
    }
    assert_eq!(n.bad_gpus(), vec![n.gpu_by_address("v100-n3", 0).unwrap()]);
    n.audit().unwrap();
    let ch2 = n.chain_id("v100-rack").unwrap();
    let d = n.vc_id("tenant-d").unwrap();
    let d_node = n.allocate_guaranteed(d, ch2, node).unwrap();
    assert_eq!(at(&n, d_node.gpus), "v100-n4/0..7");
    // C's PCIe switch is free again in the first rack.
    assert_eq!(n.free_cells(ch2)[pcie as usize], 1);

    // ---- 5. Everything released: the buddies merge back into two racks ---------------------
    for id in n.guaranteed_allocations() {
        n.release_guaranteed(id).unwrap();
    }
    assert_eq!(n.free_cells(ChainId(0)), [0, 0, 0, 0, 0, 2]);
    n.audit().unwrap();
}
