//! Property tests of the cells allocator: random clusters with feasible assignments, random
//! request/release sequences (guaranteed and opportunistic, several VCs and levels, bad GPUs).

use std::collections::HashMap;

use cluster_matcher::cells::{
    AllocError, CellsConfig, ChainConfig, ChainId, Cluster, GpuId, GuaranteedId, LevelConfig,
    OpportunisticId, PhysicalCellConfig, Sharing, VcCellsConfig, VcId, VirtualClusterConfig,
};
use proptest::prelude::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random cluster of one or two chains whose VC assignment is feasible by construction:
/// each physical top cell is cut into buddy pieces and pieces are handed to random VCs.
fn random_config(seed: u64, nvc: usize) -> CellsConfig {
    let mut rng = Rng(seed | 1);
    let nchains = 1 + rng.below(2) as usize;
    let mut chains = Vec::new();
    let mut physical = Vec::new();
    let mut counts: HashMap<(usize, String, String), u32> = HashMap::new();
    let mut node = 0;
    for ci in 0..nchains {
        let nlevels = 2 + rng.below(3) as usize;
        let mut levels = vec![LevelConfig {
            name: "l1".into(),
            children: None,
        }];
        let mut fan = vec![0, 1];
        for l in 2..=nlevels {
            let f = 1 + rng.below(3) as u32;
            fan.push(f);
            levels.push(LevelConfig {
                name: format!("l{l}"),
                children: Some(f),
            });
        }
        let name = format!("c{ci}");
        chains.push(ChainConfig {
            name: name.clone(),
            gpu_type: format!("T{ci}"),
            levels,
            node_level: None,
        });
        for _ in 0..1 + rng.below(3) {
            physical.push(PhysicalCellConfig {
                chain: name.clone(),
                level: None,
                nodes: vec![format!("n{node}")],
            });
            node += 1;
            // Cut the top cell into pieces.
            let mut stack = vec![nlevels];
            while let Some(l) = stack.pop() {
                match rng.below(4) {
                    0 | 1 if l > 1 => stack.extend(std::iter::repeat_n(l - 1, fan[l] as usize)),
                    3 => {}
                    _ => {
                        let vc = rng.below(nvc as u64) as usize;
                        *counts
                            .entry((vc, name.clone(), format!("l{l}")))
                            .or_default() += 1;
                    }
                }
            }
        }
    }
    let virtual_clusters = (0..nvc)
        .map(|v| VirtualClusterConfig {
            name: format!("vc{v}"),
            cells: {
                let mut cells: Vec<_> = counts
                    .iter()
                    .filter(|((vv, _, _), _)| *vv == v)
                    .map(|((_, chain, level), &count)| VcCellsConfig {
                        chain: chain.clone(),
                        level: level.clone(),
                        count,
                    })
                    .collect();
                cells.sort_by(|a, b| (&a.chain, &a.level).cmp(&(&b.chain, &b.level)));
                cells
            },
        })
        .collect();
    CellsConfig {
        chains,
        physical_cells: physical,
        virtual_clusters,
        colocated_per_gpu: 1 + rng.below(3) as u32,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        vc: u8,
        chain: u8,
        level: u8,
    },
    Release {
        pick: u16,
    },
    OppCell {
        chain: u8,
        level: u8,
        colocate: bool,
    },
    OppOn {
        gpu: u16,
        colocate: bool,
    },
    ReleaseOpp {
        pick: u16,
    },
    Health {
        gpu: u16,
        bad: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(vc, chain, level)| Op::Alloc { vc, chain, level }),
        3 => any::<u16>().prop_map(|pick| Op::Release { pick }),
        1 => (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(chain, level, colocate)| Op::OppCell { chain, level, colocate }),
        1 => (any::<u16>(), any::<bool>()).prop_map(|(gpu, colocate)| Op::OppOn { gpu, colocate }),
        1 => any::<u16>().prop_map(|pick| Op::ReleaseOpp { pick }),
        1 => (any::<u16>(), prop::bool::weighted(0.3)).prop_map(|(gpu, bad)| Op::Health { gpu, bad }),
    ]
}

/// Snapshot of the free lists and VC views, to compare before and after.
fn views(c: &Cluster) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for ci in 0..c.chains().len() as u16 {
        out.push(c.free_cells(ChainId(ci)));
        out.push(c.owed_cells(ChainId(ci)));
        for v in 0..c.vc_names().len() as u16 {
            out.push(c.vc_free_cells(VcId(v), ChainId(ci)));
        }
    }
    out
}

fn run(seed: u64, nvc: usize, ops: &[Op], with_opportunistic: bool) -> Result<(), TestCaseError> {
    let cfg = random_config(seed, nvc);
    let mut c = Cluster::from_config(cfg).expect("assignment feasible by construction");
    let initial = views(&c);
    let nchains = c.chains().len();
    let ngpu = c.gpu_count() as u32;
    let mut live: Vec<(GuaranteedId, VcId)> = Vec::new();
    let mut opps: HashMap<OpportunisticId, Sharing> = HashMap::new();
    for op in ops {
        match *op {
            Op::Alloc { vc, chain, level } => {
                if nvc == 0 {
                    continue;
                }
                let vc = VcId(vc as u16 % nvc as u16);
                let chain = ChainId(chain as u16 % nchains as u16);
                let top = c.chains()[chain.0 as usize].top;
                let level = 1 + level % top;
                let view = c.vc_free_cells(vc, chain);
                let legal = (level..=top).any(|l| view[l as usize] > 0);
                let before = views(&c);
                match c.allocate_guaranteed(vc, chain, level) {
                    Ok(a) => {
                        prop_assert!(legal, "allocated an illegal request");
                        prop_assert_eq!(
                            a.gpus.len as u64,
                            c.chains()[chain.0 as usize].gpus_at[level as usize]
                        );
                        for p in &a.preempted {
                            prop_assert_eq!(
                                opps.remove(p),
                                Some(Sharing::Exclusive),
                                "preempted a non-opportunistic or colocated allocation"
                            );
                        }
                        for g in a.gpus.iter() {
                            prop_assert!(!c.gpu_is_bad(g), "guaranteed cell bound to a bad GPU");
                            prop_assert_eq!(c.guaranteed_user(g), Some(a.id));
                            prop_assert_eq!(c.gpu_chain(g), Some(chain));
                        }
                        live.push((a.id, vc));
                    }
                    Err(AllocError::NotInAssignment { .. }) => {
                        prop_assert!(!legal, "a legal request failed");
                        prop_assert_eq!(views(&c), before);
                    }
                    Err(AllocError::OnlyBadHardware { .. }) => {
                        let chain_has_bad =
                            c.bad_gpus().iter().any(|&g| c.gpu_chain(g) == Some(chain));
                        prop_assert!(
                            legal && chain_has_bad,
                            "refused for bad hardware without any"
                        );
                        prop_assert_eq!(views(&c), before);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("legal={legal}: {e}"))),
                }
            }
            Op::Release { pick } => {
                if live.is_empty() {
                    continue;
                }
                let (id, _) = live.swap_remove(pick as usize % live.len());
                c.release_guaranteed(id)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(c.release_guaranteed(id).is_err());
            }
            Op::OppCell {
                chain,
                level,
                colocate,
            } if with_opportunistic => {
                let chain = ChainId(chain as u16 % nchains as u16);
                let level = 1 + level % c.chains()[chain.0 as usize].top;
                let sharing = if colocate {
                    Sharing::Colocate
                } else {
                    Sharing::Exclusive
                };
                if let Ok((id, range)) = c.allocate_opportunistic(chain, level, sharing) {
                    for g in range.iter() {
                        prop_assert!(!c.gpu_is_bad(g));
                        if sharing == Sharing::Exclusive {
                            prop_assert!(c.guaranteed_user(g).is_none());
                        }
                    }
                    opps.insert(id, sharing);
                }
            }
            Op::OppOn { gpu, colocate } if with_opportunistic => {
                let sharing = if colocate {
                    Sharing::Colocate
                } else {
                    Sharing::Exclusive
                };
                let g = GpuId(gpu as u32 % ngpu);
                let free = c.free_gpus_for_opportunistic(sharing).contains(&g);
                match c.allocate_opportunistic_on(&[g], sharing) {
                    Ok(id) => {
                        prop_assert!(free);
                        opps.insert(id, sharing);
                    }
                    Err(_) => prop_assert!(!free),
                }
            }
            Op::ReleaseOpp { pick } => {
                if opps.is_empty() {
                    continue;
                }
                let mut ids: Vec<_> = opps.keys().copied().collect();
                ids.sort_by_key(|i| i.to_string());
                let id = ids[pick as usize % ids.len()];
                opps.remove(&id);
                c.release_opportunistic(id)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::Health { gpu, bad } => {
                let g = GpuId(gpu as u32 % ngpu);
                let ch = c
                    .set_gpu_health(g, bad)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                for e in ch.evicted {
                    prop_assert!(
                        opps.remove(&e).is_some(),
                        "evicted something not opportunistic"
                    );
                }
            }
            _ => {}
        }
        c.audit().map_err(TestCaseError::fail)?;
    }
    // Live guaranteed allocations fit inside each VC's assignment.
    let mut by_vc: HashMap<VcId, u64> = HashMap::new();
    for (id, vc) in &live {
        *by_vc.entry(*vc).or_default() += c.guaranteed_gpus(*id).unwrap().len as u64;
    }
    for (vc, used) in by_vc {
        let assigned: u64 = c.config().virtual_clusters[vc.0 as usize]
            .cells
            .iter()
            .map(|k| {
                let ch = &c.chains()[c.chain_id(&k.chain).unwrap().0 as usize];
                k.count as u64 * ch.gpus_at[ch.level(&k.level).unwrap() as usize]
            })
            .sum();
        prop_assert!(used <= assigned);
    }
    // Reconfiguring to the same config keeps every allocation in place.
    let r = c
        .reconfigure(c.config().clone(), "same")
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(r.lost_guaranteed.is_empty(), "{:?}", r.lost_guaranteed);
    prop_assert!(
        r.lost_opportunistic.is_empty(),
        "{:?}",
        r.lost_opportunistic
    );
    prop_assert_eq!(r.kept_guaranteed.len(), live.len());
    for (old, new) in &r.kept_guaranteed {
        prop_assert_eq!(
            c.guaranteed_gpus(*old).unwrap(),
            r.cluster.guaranteed_gpus(*new).unwrap()
        );
    }
    r.cluster.audit().map_err(TestCaseError::fail)?;
    prop_assert_eq!(r.cluster.bad_gpus(), c.bad_gpus());
    // Growing the cluster by one top cell and adding a tenant that owns it loses nothing.
    let mut grown = c.config().clone();
    let c0 = grown.chains[0].clone();
    grown.physical_cells.push(PhysicalCellConfig {
        chain: c0.name.clone(),
        level: None,
        nodes: vec!["extra".into()],
    });
    grown.virtual_clusters.push(VirtualClusterConfig {
        name: "newcomer".into(),
        cells: vec![VcCellsConfig {
            chain: c0.name.clone(),
            level: c0.levels.last().unwrap().name.clone(),
            count: 1,
        }],
    });
    let r = c
        .reconfigure(grown, "grown")
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(r.lost_guaranteed.is_empty(), "{:?}", r.lost_guaranteed);
    prop_assert!(r.lost_opportunistic.is_empty());
    r.cluster.audit().map_err(TestCaseError::fail)?;
    // Releasing everything merges every buddy back.
    for (id, _) in live {
        c.release_guaranteed(id)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    for id in opps.into_keys() {
        c.release_opportunistic(id)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    for g in 0..ngpu {
        c.set_gpu_health(GpuId(g), false).unwrap();
    }
    c.audit().map_err(TestCaseError::fail)?;
    prop_assert_eq!(views(&c), initial);
    prop_assert!(c.guaranteed_allocations().is_empty() && c.opportunistic_allocations().is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Legal guaranteed requests never fail, illegal ones change nothing, no cell or GPU is
    /// bound twice, and releasing everything restores the initial free lists.
    #[test]
    fn guaranteed_sequences_are_always_satisfied(seed in any::<u64>(), nvc in 1usize..4, ops in prop::collection::vec(op(), 0..120)) {
        run(seed, nvc, &ops, false)?;
    }

    /// The same with opportunistic work and bad GPUs mixed in: preemption only ever takes
    /// exclusive opportunistic allocations.
    #[test]
    fn mixed_sequences_keep_safety_and_preempt_only_opportunistic(seed in any::<u64>(), nvc in 1usize..4, ops in prop::collection::vec(op(), 0..120)) {
        run(seed, nvc, &ops, true)?;
    }
}

/// A feasible assignment built from exactly the cluster must use every GPU; one more cell
/// anywhere must be refused.
#[test]
fn one_cell_more_than_the_cluster_is_infeasible() {
    for seed in 1..200u64 {
        let mut cfg = random_config(seed, 2);
        let ch = cfg.chains[0].clone();
        let top = ch.levels.last().unwrap().name.clone();
        let tops = cfg
            .physical_cells
            .iter()
            .filter(|p| p.chain == ch.name)
            .count() as u32;
        cfg.virtual_clusters[1].cells = vec![VcCellsConfig {
            chain: ch.name.clone(),
            level: top,
            count: tops,
        }];
        cfg.virtual_clusters[0].cells = vec![VcCellsConfig {
            chain: ch.name.clone(),
            level: "l1".into(),
            count: 1,
        }];
        let err = Cluster::from_config(cfg).unwrap_err().to_string();
        assert!(
            err.contains("`vc1`") && err.contains(&format!("chain `{}`", ch.name)),
            "{err}"
        );
    }
}

/// A private cluster made of exactly one tenant's cells, with that tenant alone on it.
fn private_config(shared: &CellsConfig, vc: usize) -> CellsConfig {
    let mut physical_cells = Vec::new();
    let mut host = 0;
    for k in &shared.virtual_clusters[vc].cells {
        // random_config chains have the node at the top level: one host per cell.
        let hosts = 1;
        for _ in 0..k.count {
            physical_cells.push(PhysicalCellConfig {
                chain: k.chain.clone(),
                level: Some(k.level.clone()),
                nodes: (0..hosts)
                    .map(|_| {
                        host += 1;
                        format!("p{host}")
                    })
                    .collect(),
            });
        }
    }
    CellsConfig {
        chains: shared.chains.clone(),
        physical_cells,
        virtual_clusters: vec![VirtualClusterConfig {
            name: "private".into(),
            cells: shared.virtual_clusters[vc].cells.clone(),
        }],
        colocated_per_gpu: shared.colocated_per_gpu,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// HiveD's sharing safety against its definition: every tenant's request sequence,
    /// replayed on a private cluster made of exactly its cells, succeeds on the shared cluster
    /// (beside the other tenants and opportunistic work) exactly when it succeeds privately.
    #[test]
    fn shared_cluster_serves_what_private_clusters_serve(seed in any::<u64>(), nvc in 1usize..4, ops in prop::collection::vec(op(), 0..150)) {
        let cfg = random_config(seed, nvc);
        let mut shared = Cluster::from_config(cfg.clone()).unwrap();
        let mut private: Vec<Cluster> = (0..nvc).map(|v| Cluster::from_config(private_config(&cfg, v)).unwrap()).collect();
        let nchains = shared.chains().len();
        let ngpu = shared.gpu_count() as u32;
        let mut live: Vec<(usize, GuaranteedId, GuaranteedId)> = Vec::new();
        let mut opps: Vec<OpportunisticId> = Vec::new();
        for op in &ops {
            match *op {
                Op::Alloc { vc, chain, level } => {
                    let v = vc as usize % nvc;
                    let chain = ChainId(chain as u16 % nchains as u16);
                    let level = 1 + level % shared.chains()[chain.0 as usize].top;
                    let name = &shared.chains()[chain.0 as usize].name;
                    let pchain = private[v].chain_id(name).unwrap();
                    let p = private[v].allocate_guaranteed(VcId(0), pchain, level);
                    let s = shared.allocate_guaranteed(VcId(v as u16), chain, level);
                    match (p, s) {
                        (Ok(p), Ok(s)) => {
                            prop_assert_eq!(p.gpus.len, s.gpus.len);
                            live.push((v, p.id, s.id));
                        }
                        (Err(AllocError::NotInAssignment { .. }), Err(AllocError::NotInAssignment { .. })) => {}
                        (p, s) => return Err(TestCaseError::fail(format!("private {p:?} vs shared {s:?}"))),
                    }
                }
                Op::Release { pick } if !live.is_empty() => {
                    let (v, p, s) = live.swap_remove(pick as usize % live.len());
                    private[v].release_guaranteed(p).unwrap();
                    shared.release_guaranteed(s).unwrap();
                }
                Op::OppCell { chain, level, colocate } => {
                    let chain = ChainId(chain as u16 % nchains as u16);
                    let level = 1 + level % shared.chains()[chain.0 as usize].top;
                    let sharing = if colocate { Sharing::Colocate } else { Sharing::Exclusive };
                    if let Ok((id, _)) = shared.allocate_opportunistic(chain, level, sharing) {
                        opps.push(id);
                    }
                }
                Op::OppOn { gpu, colocate } => {
                    let sharing = if colocate { Sharing::Colocate } else { Sharing::Exclusive };
                    if let Ok(id) = shared.allocate_opportunistic_on(&[GpuId(gpu as u32 % ngpu)], sharing) {
                        opps.push(id);
                    }
                }
                Op::ReleaseOpp { pick } if !opps.is_empty() => {
                    let id = opps.swap_remove(pick as usize % opps.len());
                    // It may have been preempted already.
                    let _ = shared.release_opportunistic(id);
                }
                _ => {}
            }
        }
        shared.audit().map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Damaged config text (cut short, a byte changed, a value swapped for another) gives a
    /// config error or a valid cluster, never a panic; syntax errors carry a line.
    #[test]
    fn damaged_configs_never_panic(cut in 0usize..2000, at in 0usize..2000, byte in any::<u8>(), num in prop_oneof![Just("0"), Just("-1"), Just("4294967295"), Just("99999999999"), Just("1.5"), Just("\"x\""), Just("null")]) {
        let text = include_str!("../examples/cells/heterogeneous.json");
        let variants = [
            text[..cut.min(text.len())].to_string(),
            {
                let mut b = text.as_bytes().to_vec();
                let i = at % b.len();
                b[i] = byte;
                String::from_utf8_lossy(&b).into_owned()
            },
            {
                // Replace the n-th number in the file.
                let digits: Vec<usize> = text.match_indices(|c: char| c.is_ascii_digit()).map(|(i, _)| i).collect();
                let i = digits[at % digits.len()];
                let prev = text[..i].chars().last().unwrap_or(' ');
                if prev == ' ' || prev == ':' {
                    let end = i + text[i..].find(|c: char| !c.is_ascii_digit()).unwrap_or(0);
                    format!("{}{}{}", &text[..i], num, &text[end..])
                } else {
                    text.to_string()
                }
            },
        ];
        for v in &variants {
            match Cluster::from_json(v, "damaged.json") {
                Ok(c) => c.audit().map_err(TestCaseError::fail)?,
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(msg.starts_with("damaged.json"), "{msg}");
                }
            }
        }
    }
}

/// Random guaranteed requests at random priorities (HiveD's intra-VC preemption), releases and
/// bad GPUs: a request preempts only strictly lower-priority work of its own VC, every other
/// allocation survives, a refused request changes nothing, and the audit always holds.
fn run_priorities(seed: u64, nvc: usize, ops: &[(u8, u8, u8, u8, u16, bool)]) -> Result<(), TestCaseError> {
    let cfg = random_config(seed, nvc);
    let mut c = Cluster::from_config(cfg).expect("assignment feasible by construction");
    let nchains = c.chains().len();
    let ngpu = c.gpu_count() as u32;
    let mut live: Vec<(GuaranteedId, VcId, i32)> = Vec::new();
    for &(kind, vc, chain, level, pick, bad) in ops {
        match kind % 6 {
            0..=3 => {
                let vc = VcId(vc as u16 % nvc as u16);
                let chain = ChainId(chain as u16 % nchains as u16);
                let level = 1 + level % c.chains()[chain.0 as usize].top;
                let prio = (pick % 4) as i32;
                let view = c.vc_free_cells(vc, chain);
                let free = (level..=c.chains()[chain.0 as usize].top).any(|l| view[l as usize] > 0);
                let before = (views(&c), c.guaranteed_allocations());
                match c.allocate_guaranteed_with_priority(vc, chain, level, prio) {
                    Ok(a) => {
                        if free {
                            prop_assert!(a.preempted_guaranteed.is_empty(), "preempted with a free cell");
                        }
                        for v in &a.preempted_guaranteed {
                            let k = live.iter().position(|(id, _, _)| id == v);
                            prop_assert!(k.is_some(), "preempted an unknown allocation");
                            let (_, vvc, vp) = live.swap_remove(k.unwrap());
                            prop_assert_eq!(vvc, vc, "preempted another VC's work");
                            prop_assert!(vp < prio, "preempted work of priority {} at {}", vp, prio);
                            prop_assert!(c.guaranteed_info(*v).is_err());
                        }
                        prop_assert_eq!(c.guaranteed_priority(a.id).unwrap(), prio);
                        live.push((a.id, vc, prio));
                    }
                    Err(_) => prop_assert_eq!((views(&c), c.guaranteed_allocations()), before),
                }
                for (id, _, p) in &live {
                    prop_assert_eq!(c.guaranteed_priority(*id).ok(), Some(*p), "an untouched allocation changed");
                }
            }
            4 => {
                if !live.is_empty() {
                    let (id, _, _) = live.swap_remove(pick as usize % live.len());
                    c.release_guaranteed(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            _ => {
                c.set_gpu_health(GpuId(pick as u32 % ngpu), bad).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
        }
        c.audit().map_err(TestCaseError::fail)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn priority_preemption_stays_inside_the_vc_and_below_the_priority(
        seed in any::<u64>(),
        nvc in 1usize..4,
        ops in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u16>(), prop::bool::weighted(0.2)), 0..120),
    ) {
        run_priorities(seed, nvc, &ops)?;
    }
}
