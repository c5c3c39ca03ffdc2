//! Buddy-cell throughput on a 100k-GPU cluster: guaranteed alloc+release pairs per second,
//! against a baseline (a bare Vec free list of GPU ids) measured in the same run.
//!
//! Run: `cargo bench -p cluster-matcher --bench cells` (optional arg: seconds per case).

use std::hint::black_box;
use std::time::{Duration, Instant};

use cluster_matcher::cells::{
    CellsConfig, ChainConfig, ChainId, Cluster, GuaranteedId, LevelConfig, PhysicalCellConfig,
    VcCellsConfig, VcId, VirtualClusterConfig,
};

const RACKS: usize = 782; // 782 racks x 16 nodes x 8 GPUs = 100,096 GPUs
const VCS: usize = 8;

fn config() -> CellsConfig {
    let levels = [
        ("gpu", None),
        ("pcie", Some(2)),
        ("socket", Some(2)),
        ("node", Some(2)),
        ("rack", Some(16)),
    ]
    .iter()
    .map(|&(n, c)| LevelConfig {
        name: n.into(),
        children: c,
    })
    .collect();
    let chain = ChainConfig {
        name: "v100".into(),
        gpu_type: "V100".into(),
        levels,
        node_level: Some("node".into()),
    };
    let physical_cells = (0..RACKS)
        .map(|r| PhysicalCellConfig {
            chain: "v100".into(),
            level: None,
            nodes: (0..16).map(|n| format!("r{r}-n{n}")).collect(),
        })
        .collect();
    let cells = |level: &str, count| VcCellsConfig {
        chain: "v100".into(),
        level: level.into(),
        count,
    };
    let virtual_clusters = (0..VCS)
        .map(|v| VirtualClusterConfig {
            name: format!("vc{v}"),
            cells: vec![
                cells("rack", 90),
                cells("node", 40),
                cells("socket", 30),
                cells("pcie", 50),
                cells("gpu", 100),
            ],
        })
        .collect();
    CellsConfig {
        chains: vec![chain],
        physical_cells,
        virtual_clusters,
    }
}

struct Rng(u64);
impl Rng {
    #[inline]
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn measure(budget: Duration, mut body: impl FnMut(u64)) -> f64 {
    const BATCH: u64 = 10_000;
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < budget {
        body(BATCH);
        done += BATCH;
    }
    done as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2.0);
    let budget = Duration::from_secs_f64(secs);
    let t = Instant::now();
    let mut cluster = Cluster::from_config(config()).expect("bench config is feasible");
    let build = t.elapsed();
    let chain = ChainId(0);
    println!(
        "cells bench: {} GPUs, {VCS} VCs, built in {:.1} ms",
        cluster.gpu_count(),
        build.as_secs_f64() * 1e3
    );

    // Baseline: the cheapest possible allocator, a Vec of free GPU ids.
    let mut free: Vec<u32> = (0..cluster.gpu_count() as u32).collect();
    let baseline = measure(budget, |n| {
        for _ in 0..n {
            let g = free.pop().unwrap();
            free.push(black_box(g));
        }
    });
    println!(
        "baseline  Vec free-list pop+push          {:>12.0} pairs/s",
        baseline
    );

    // Case 1: one GPU allocated and released at once in an empty cluster (a full rack is
    // split down to a GPU and merged back every time).
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let cold = measure(budget, |n| {
        for _ in 0..n {
            let vc = VcId((rng.next() % VCS as u64) as u16);
            let a = cluster.allocate_guaranteed(vc, chain, 1).unwrap();
            cluster.release_guaranteed(black_box(a.id)).unwrap();
        }
    });
    println!(
        "guaranteed GPU alloc+release, empty       {:>12.0} pairs/s  ({:.2}x baseline time)",
        cold,
        baseline / cold
    );

    // Case 2: steady state near half occupancy, random levels and VCs, random victims.
    let mut live: Vec<GuaranteedId> = Vec::with_capacity(1 << 20);
    let mut used_gpus = 0u64;
    let target = cluster.gpu_count() as u64 / 2;
    let gpus_at = cluster.chains()[0].gpus_at.clone();
    let mut refused = 0u64;
    while used_gpus < target {
        let vc = VcId((rng.next() % VCS as u64) as u16);
        let level = 1 + (rng.next() % 4) as u8;
        if let Ok(a) = cluster.allocate_guaranteed(vc, chain, level) {
            used_gpus += gpus_at[level as usize];
            live.push(a.id);
        }
    }
    cluster.audit().expect("state consistent after fill");
    let steady = measure(budget, |n| {
        for _ in 0..n {
            let vc = VcId((rng.next() % VCS as u64) as u16);
            let level = 1 + (rng.next() % 4) as u8;
            match cluster.allocate_guaranteed(vc, chain, level) {
                Ok(a) => live.push(a.id),
                Err(_) => refused += 1,
            }
            let i = (rng.next() % live.len() as u64) as usize;
            let id = live.swap_remove(i);
            cluster.release_guaranteed(black_box(id)).unwrap();
        }
    });
    cluster
        .audit()
        .expect("state consistent after steady state");
    println!(
        "guaranteed mixed-level alloc+release, ~50% full {:>6.0} pairs/s  ({:.2}x baseline time, {refused} requests outside a VC's assignment)",
        steady,
        baseline / steady
    );
    for id in live.drain(..) {
        cluster.release_guaranteed(id).unwrap();
    }
    cluster.audit().expect("state consistent after draining");
    println!(
        "target >= 1,000,000 pairs/s: empty {}, steady {}",
        cold >= 1e6,
        steady >= 1e6
    );
}
