//! Buddy-cell throughput on a 100k-GPU cluster: guaranteed alloc+release pairs per second,
//! against a baseline (a bare Vec free list of GPU ids) measured in the same run.
//!
//! Run: `cargo bench -p cluster-matcher --bench cells` (optional arg: seconds per case).

use std::hint::black_box;
use std::time::{Duration, Instant};

use cluster_matcher::cells::{
    CellsConfig, ChainConfig, ChainId, Cluster, GuaranteedId, LevelConfig, PhysicalCellConfig,
    Sharing, VcCellsConfig, VcId, VirtualClusterConfig,
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
        colocated_per_gpu: 1,
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

/// CPU seconds this thread has run (utime + stime from /proc), so a busy shared machine
/// does not count time the thread spent descheduled.
fn thread_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Runs `body` in batches for `budget` wall time; returns (ops per wall second, ops per CPU
/// second of this thread).
fn measure(budget: Duration, mut body: impl FnMut(u64)) -> (f64, f64) {
    const BATCH: u64 = 10_000;
    let cpu0 = thread_cpu_secs();
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < budget {
        body(BATCH);
        done += BATCH;
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = match (cpu0, thread_cpu_secs()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => wall,
    };
    (done as f64 / wall, done as f64 / cpu)
}

fn line(name: &str, (wall, cpu): (f64, f64), baseline: Option<(f64, f64)>) {
    match baseline {
        Some((_, bc)) => println!(
            "{name:<48} {wall:>12.0} pairs/s wall {cpu:>12.0} pairs/CPU-s  ({:.0}x baseline time per op, CPU)",
            bc / cpu
        ),
        None => println!("{name:<48} {wall:>12.0} pairs/s wall {cpu:>12.0} pairs/CPU-s"),
    }
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
    line("baseline: Vec free-list pop+push", baseline, None);

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
    line(
        "guaranteed GPU alloc+release, empty cluster",
        cold,
        Some(baseline),
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
    line(
        "guaranteed mixed-level alloc+release, ~50% full",
        steady,
        Some(baseline),
    );
    println!("  ({refused} requests were outside a VC's assignment and refused)");
    // Case 3: opportunistic single-GPU cells (exclusive) on the half-full cluster.
    let opp = measure(budget, |n| {
        for _ in 0..n {
            let (id, _) = cluster
                .allocate_opportunistic(chain, 1, Sharing::Exclusive)
                .unwrap();
            cluster.release_opportunistic(black_box(id)).unwrap();
        }
    });
    line(
        "opportunistic GPU alloc+release, ~50% full",
        opp,
        Some(baseline),
    );
    // Case 4: the list of GPUs free for colocated offline work, once per placement round.
    let t = Instant::now();
    let mut rounds = 0u32;
    while t.elapsed() < budget {
        black_box(cluster.free_gpus_for_opportunistic(Sharing::Colocate));
        rounds += 1;
    }
    println!(
        "free_gpus_for_opportunistic over {} GPUs        {:>10.2} ms/call",
        cluster.gpu_count(),
        t.elapsed().as_secs_f64() * 1e3 / rounds as f64
    );
    for id in live.drain(..) {
        cluster.release_guaranteed(id).unwrap();
    }
    cluster.audit().expect("state consistent after draining");
    println!(
        "target >= 1,000,000 pairs per CPU-second: empty {}, steady {}",
        cold.1 >= 1e6,
        steady.1 >= 1e6
    );
}
