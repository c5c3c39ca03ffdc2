//! The cell allocator: global buddy free lists, VC-internal buddy allocation, lazy binding of
//! virtual to physical cells, opportunistic cells with preemption, bad hardware.

use std::collections::HashMap;
use std::path::Path;

use super::config::{line_of, CellsConfig};
use super::error::{AllocError, ConfigError, Infeasible};
use super::freelist::{FreeLists, NONE};
use super::safety::cascade;
use super::topology::{build, Chain, Node, PCell, PState, VCell, VState, MAX_LEVELS};

mod audit;
mod health;
mod opportunistic;
mod priority;
mod reconfig;
mod report;
pub use reconfig::{Downgraded, Reconfigured};
pub use report::{
    CellsReport, ChainReport, DoomedReport, GpuReport, GuaranteedReport, LevelReport, NodeReport,
    OpportunisticReport, PhysicalReport, VcReport,
};

const CLEAN: usize = 0;
const DIRTY: usize = 1;
const BAD: usize = 2;
const CATS: usize = 3;
/// How many free cells with opportunistic users are compared when one must be taken.
const DIRTY_SCAN: usize = 64;

/// Index of a chain in the config order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ChainId(pub u16);

/// Index of a virtual cluster in the config order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct VcId(pub u16);

/// Cluster-wide GPU number (dense, 0..gpu_count).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct GpuId(pub u32);

/// Handle of a live guaranteed allocation (a VC's virtual cell bound to a physical cell).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GuaranteedId {
    cell: u32,
    gen: u32,
}

/// Handle of a live opportunistic (low-priority) allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpportunisticId {
    slot: u32,
    gen: u32,
}

impl std::fmt::Display for GuaranteedId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "g{}.{}", self.cell, self.gen)
    }
}

impl std::fmt::Display for OpportunisticId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "o{}.{}", self.slot, self.gen)
    }
}

/// How an opportunistic job uses its GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Sharing {
    /// HiveD low-priority job: GPUs no guaranteed work uses; preempted when guaranteed work
    /// needs them.
    Exclusive,
    /// MuxFlow offline job: the low-priority view of a GPU, beside the online (guaranteed)
    /// work on it; not preempted by guaranteed work.
    Colocate,
}

/// A contiguous run of GPUs (every cell covers one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct GpuRange {
    /// First GPU.
    pub start: u32,
    /// Number of GPUs.
    pub len: u32,
}

impl GpuRange {
    /// The GPUs in order.
    pub fn iter(&self) -> impl Iterator<Item = GpuId> {
        (self.start..self.start + self.len).map(GpuId)
    }

    /// Whether a GPU lies in the range.
    pub fn contains(&self, g: GpuId) -> bool {
        g.0 >= self.start && g.0 < self.start + self.len
    }
}

/// Result of a guaranteed allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuaranteedAllocation {
    /// Handle to release it with.
    pub id: GuaranteedId,
    /// Physical GPUs it covers.
    pub gpus: GpuRange,
    /// Exclusive opportunistic allocations preempted (already released) to make room.
    pub preempted: Vec<OpportunisticId>,
    /// Lower-priority guaranteed allocations of the same VC preempted (already released) to
    /// make room (see [`Cluster::allocate_guaranteed_with_priority`]).
    pub preempted_guaranteed: Vec<GuaranteedId>,
}

/// A host and GPU index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct GpuAddress<'a> {
    /// Host name.
    pub node: &'a str,
    /// GPU index on the host.
    pub index: u32,
}

impl std::fmt::Display for GpuAddress<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.node, self.index)
    }
}

/// What a health change did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthChange {
    /// Opportunistic allocations on the GPUs that went bad (released).
    pub evicted: Vec<OpportunisticId>,
    /// Guaranteed allocations covering a GPU that went bad (kept; their owners decide).
    pub affected: Vec<GuaranteedId>,
}

/// Owed cells that cannot be bound to healthy hardware any more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doomed {
    /// Chain.
    pub chain: ChainId,
    /// Level number.
    pub level: u8,
    /// Cells short.
    pub cells: i64,
}

#[derive(Clone, Debug)]
struct OppSlot {
    gen: u32,
    live: bool,
    sharing: Sharing,
    gpus: Vec<u32>,
}

/// The cells state of one cluster: physical cells, virtual clusters and every allocation.
#[derive(Clone, Debug)]
pub struct Cluster {
    config: CellsConfig,
    chains: Vec<Chain>,
    chain_by_name: HashMap<String, u16>,
    pcells: Vec<PCell>,
    proots: Vec<u32>,
    gpu_leaf: Vec<u32>,
    gpu_node: Vec<u32>,
    gpu_index: Vec<u32>,
    gpu_bad: Vec<bool>,
    /// Opportunistic users per GPU (one exclusive, or up to `colocated_per_gpu` colocated).
    gpu_users: Vec<Vec<u32>>,
    colocated_per_gpu: usize,
    nodes: Vec<Node>,
    node_by_name: HashMap<String, Vec<u32>>,
    pfree: FreeLists,
    owed: Vec<i64>,
    vc_names: Vec<String>,
    vc_by_name: HashMap<String, u16>,
    vcells: Vec<VCell>,
    vroots: Vec<Vec<u32>>,
    vfree: FreeLists,
    opp: Vec<OppSlot>,
    opp_free: Vec<u32>,
}

#[inline]
fn plist(chain: u16, level: u8, cat: usize) -> usize {
    (chain as usize * MAX_LEVELS + level as usize) * CATS + cat
}

#[inline]
fn category(c: &PCell) -> usize {
    if c.bad > 0 {
        BAD
    } else if c.opp_ex > 0 {
        DIRTY
    } else {
        CLEAN
    }
}

impl Cluster {
    /// Loads a config file and builds the cluster; errors name file, line and field.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            file: path.display().to_string(),
            source: e,
        })?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses JSON text (`origin` names it in errors) and builds the cluster.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let cfg = CellsConfig::parse(text, origin)?;
        Self::build(cfg, origin, Some(text))
    }

    /// Builds from an already parsed config.
    pub fn from_config(cfg: CellsConfig) -> Result<Self, ConfigError> {
        Self::build(cfg, "<config>", None)
    }

    fn build(cfg: CellsConfig, origin: &str, text: Option<&str>) -> Result<Self, ConfigError> {
        let b = build(&cfg, origin, text)?;
        let nchains = b.chains.len();
        let mut pfree = FreeLists::new(nchains * MAX_LEVELS * CATS, b.pcells.len());
        for &r in &b.proots {
            let c = &b.pcells[r as usize];
            pfree.push_back(plist(c.chain, c.level, CLEAN), r);
        }
        let nvc = b.vc_names.len();
        let mut vfree = FreeLists::new((nvc * nchains * MAX_LEVELS).max(1), b.vcells.len());
        let mut owed = vec![0i64; nchains * MAX_LEVELS];
        // Feasibility, one VC at a time in file order, so the error names the first VC that
        // does not fit.
        let mut free = vec![vec![0i64; MAX_LEVELS]; nchains];
        for &r in &b.proots {
            let c = &b.pcells[r as usize];
            free[c.chain as usize][c.level as usize] += 1;
        }
        for (vi, roots) in b.vroots.iter().enumerate() {
            for &r in roots {
                let v = &b.vcells[r as usize];
                owed[v.chain as usize * MAX_LEVELS + v.level as usize] += 1;
                vfree.push_back(vlist(nchains, vi as u16, v.chain, v.level), r);
            }
            for (ci, ch) in b.chains.iter().enumerate() {
                let o = &owed[ci * MAX_LEVELS..(ci + 1) * MAX_LEVELS];
                if let Err((level, short)) = cascade(ch.top, &ch.fanout, &free[ci], o) {
                    let requested = (1..=ch.top)
                        .rev()
                        .filter(|&l| o[l as usize] > 0)
                        .map(|l| format!("{}={}", ch.level_names[l as usize], o[l as usize]))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let physical_gpus = (1..=ch.top)
                        .map(|l| free[ci][l as usize] as u64 * ch.gpus_at[l as usize])
                        .sum();
                    return Err(ConfigError::Infeasible(Box::new(Infeasible {
                        file: origin.to_string(),
                        line: text
                            .and_then(|t| line_of(t, &format!("virtual_clusters[{vi}]")))
                            .unwrap_or(0),
                        field: format!("virtual_clusters[{vi}].cells"),
                        vc: b.vc_names[vi].clone(),
                        chain: ch.name.clone(),
                        level: ch.level_names[level as usize].clone(),
                        level_number: level,
                        short,
                        physical_gpus,
                        requested,
                    })));
                }
            }
        }
        let ngpu = b.gpu_leaf.len();
        let chain_by_name = b
            .chains
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i as u16))
            .collect();
        let vc_by_name = b
            .vc_names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u16))
            .collect();
        tracing::info!(
            origin,
            chains = nchains,
            gpus = ngpu,
            physical_cells = b.pcells.len(),
            virtual_clusters = nvc,
            "cells cluster built"
        );
        Ok(Cluster {
            colocated_per_gpu: cfg.colocated_per_gpu.max(1) as usize,
            config: cfg,
            chains: b.chains,
            chain_by_name,
            pcells: b.pcells,
            proots: b.proots,
            gpu_leaf: b.gpu_leaf,
            gpu_node: b.gpu_node,
            gpu_index: b.gpu_index,
            gpu_bad: vec![false; ngpu],
            gpu_users: vec![Vec::new(); ngpu],
            nodes: b.nodes,
            node_by_name: b.node_by_name,
            pfree,
            owed,
            vc_names: b.vc_names,
            vc_by_name,
            vcells: b.vcells,
            vroots: b.vroots,
            vfree,
            opp: Vec::new(),
            opp_free: Vec::new(),
        })
    }

    // ---- lookups -------------------------------------------------------------------------

    /// The config this cluster was built from.
    pub fn config(&self) -> &CellsConfig {
        &self.config
    }

    /// Chains in config order.
    pub fn chains(&self) -> &[Chain] {
        &self.chains
    }

    /// Chains whose GPUs are of the given model.
    pub fn chains_of_type(&self, gpu_type: &str) -> Vec<ChainId> {
        (0..self.chains.len() as u16)
            .filter(|&c| self.chains[c as usize].gpu_type == gpu_type)
            .map(ChainId)
            .collect()
    }

    /// Chain by name.
    pub fn chain_id(&self, name: &str) -> Option<ChainId> {
        self.chain_by_name.get(name).map(|&c| ChainId(c))
    }

    /// Level number of a level name in a chain.
    pub fn level(&self, chain: ChainId, name: &str) -> Option<u8> {
        self.chains.get(chain.0 as usize)?.level(name)
    }

    /// Virtual cluster by name.
    pub fn vc_id(&self, name: &str) -> Option<VcId> {
        self.vc_by_name.get(name).map(|&v| VcId(v))
    }

    /// Virtual cluster names in config order.
    pub fn vc_names(&self) -> &[String] {
        &self.vc_names
    }

    /// Number of GPUs.
    pub fn gpu_count(&self) -> usize {
        self.gpu_leaf.len()
    }

    /// Host and index of a GPU.
    pub fn gpu_address(&self, g: GpuId) -> Option<GpuAddress<'_>> {
        let n = *self.gpu_node.get(g.0 as usize)?;
        Some(GpuAddress {
            node: &self.nodes[n as usize].name,
            index: self.gpu_index[g.0 as usize],
        })
    }

    /// GPU by host name and index.
    pub fn gpu_by_address(&self, node: &str, index: u32) -> Option<GpuId> {
        self.node_by_name.get(node)?.iter().find_map(|&e| {
            let n = &self.nodes[e as usize];
            (index >= n.index_base && index < n.index_base + n.n_gpus)
                .then_some(GpuId(n.first_gpu + index - n.index_base))
        })
    }

    /// GPUs of a host in its first chain (see [`Cluster::node_gpu_ranges`] for a host in
    /// several chains).
    pub fn node_gpus(&self, node: &str) -> Option<GpuRange> {
        self.node_gpu_ranges(node)?.first().copied()
    }

    /// GPUs of a host, one range per chain it lends GPUs to, in host index order.
    pub fn node_gpu_ranges(&self, node: &str) -> Option<Vec<GpuRange>> {
        let entries = self.node_by_name.get(node)?;
        Some(
            entries
                .iter()
                .map(|&e| {
                    let n = &self.nodes[e as usize];
                    GpuRange { start: n.first_gpu, len: n.n_gpus }
                })
                .collect(),
        )
    }

    /// Chain (GPU type) of a GPU.
    pub fn gpu_chain(&self, g: GpuId) -> Option<ChainId> {
        let leaf = *self.gpu_leaf.get(g.0 as usize)?;
        Some(ChainId(self.pcells[leaf as usize].chain))
    }

    /// Whether a GPU is marked bad.
    pub fn gpu_is_bad(&self, g: GpuId) -> bool {
        self.gpu_bad.get(g.0 as usize).copied().unwrap_or(false)
    }

    /// GPUs covered by a live guaranteed allocation.
    pub fn guaranteed_gpus(&self, id: GuaranteedId) -> Result<GpuRange, AllocError> {
        let v = self.live_guaranteed(id)?;
        let p = &self.pcells[self.vcells[v as usize].pbind as usize];
        Ok(GpuRange {
            start: p.first_gpu,
            len: p.n_gpus,
        })
    }

    /// VC, chain and level of a live guaranteed allocation.
    pub fn guaranteed_info(&self, id: GuaranteedId) -> Result<(VcId, ChainId, u8), AllocError> {
        let v = &self.vcells[self.live_guaranteed(id)? as usize];
        Ok((VcId(v.vc), ChainId(v.chain), v.level))
    }

    /// GPUs of a live opportunistic allocation.
    pub fn opportunistic_gpus(&self, id: OpportunisticId) -> Result<Vec<GpuId>, AllocError> {
        let s = self.live_opp(id)?;
        Ok(self.opp[s as usize]
            .gpus
            .iter()
            .map(|&g| GpuId(g))
            .collect())
    }

    /// The guaranteed allocation using a GPU, if any.
    pub fn guaranteed_user(&self, g: GpuId) -> Option<GuaranteedId> {
        let mut c = *self.gpu_leaf.get(g.0 as usize)?;
        while c != NONE {
            let pc = &self.pcells[c as usize];
            if pc.used_by != NONE {
                let v = pc.used_by;
                return Some(GuaranteedId {
                    cell: v,
                    gen: self.vcells[v as usize].gen,
                });
            }
            c = pc.parent;
        }
        None
    }

    /// The (first) opportunistic allocation on a GPU, if any.
    pub fn opportunistic_user(&self, g: GpuId) -> Option<OpportunisticId> {
        let s = *self.gpu_users.get(g.0 as usize)?.first()?;
        Some(self.opp_id(s))
    }

    /// Every opportunistic allocation on a GPU.
    pub fn opportunistic_users(&self, g: GpuId) -> Vec<OpportunisticId> {
        self.gpu_users
            .get(g.0 as usize)
            .map(|u| u.iter().map(|&s| self.opp_id(s)).collect())
            .unwrap_or_default()
    }

    /// How many colocated opportunistic jobs one GPU may hold.
    pub fn colocated_per_gpu(&self) -> usize {
        self.colocated_per_gpu
    }

    fn opp_id(&self, slot: u32) -> OpportunisticId {
        OpportunisticId {
            slot,
            gen: self.opp[slot as usize].gen,
        }
    }

    /// (has a user, has an exclusive user, takes no more users) for one GPU.
    fn gpu_flags(&self, g: u32) -> (i64, i64, i64) {
        let u = &self.gpu_users[g as usize];
        let ex = u
            .first()
            .is_some_and(|&s| self.opp[s as usize].sharing == Sharing::Exclusive);
        let full = ex || u.len() >= self.colocated_per_gpu;
        (!u.is_empty() as i64, ex as i64, full as i64)
    }

    /// Whether a healthy GPU can take one more opportunistic user of this kind.
    fn gpu_takes(&self, g: u32, sharing: Sharing) -> bool {
        match sharing {
            Sharing::Exclusive => self.gpu_users[g as usize].is_empty(),
            Sharing::Colocate => self.gpu_flags(g).2 == 0,
        }
    }

    /// Healthy GPUs that can take one more low-priority job: for `Exclusive`, GPUs with no
    /// opportunistic and no guaranteed user; for `Colocate`, GPUs (online ones included)
    /// holding fewer than `colocated_per_gpu` colocated jobs and no exclusive one.
    pub fn free_gpus_for_opportunistic(&self, sharing: Sharing) -> Vec<GpuId> {
        (0..self.gpu_leaf.len() as u32)
            .map(GpuId)
            .filter(|&g| {
                !self.gpu_bad[g.0 as usize]
                    && self.gpu_takes(g.0, sharing)
                    && (sharing == Sharing::Colocate || self.guaranteed_user(g).is_none())
            })
            .collect()
    }

    /// Live guaranteed allocations (handle per allocation).
    pub fn guaranteed_allocations(&self) -> Vec<GuaranteedId> {
        self.vcells
            .iter()
            .enumerate()
            .filter(|(_, v)| v.state == VState::Allocated)
            .map(|(i, v)| GuaranteedId {
                cell: i as u32,
                gen: v.gen,
            })
            .collect()
    }

    /// Live opportunistic allocations.
    pub fn opportunistic_allocations(&self) -> Vec<OpportunisticId> {
        self.opp
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live)
            .map(|(i, s)| OpportunisticId {
                slot: i as u32,
                gen: s.gen,
            })
            .collect()
    }

    /// Free physical cells per level of a chain (index = level number), bad ones included;
    /// empty for an unknown chain.
    pub fn free_cells(&self, chain: ChainId) -> Vec<u32> {
        let Some(ch) = self.chains.get(chain.0 as usize) else {
            return Vec::new();
        };
        (0..=ch.top)
            .map(|l| if l == 0 { 0 } else { self.free_at(chain.0, l) })
            .collect()
    }

    /// Cells owed to VCs (preassigned cells not bound yet) per level of a chain.
    pub fn owed_cells(&self, chain: ChainId) -> Vec<u32> {
        let Some(ch) = self.chains.get(chain.0 as usize) else {
            return Vec::new();
        };
        (0..=ch.top)
            .map(|l| self.owed[chain.0 as usize * MAX_LEVELS + l as usize] as u32)
            .collect()
    }

    /// Free cells of a VC (its private view) per level of a chain.
    pub fn vc_free_cells(&self, vc: VcId, chain: ChainId) -> Vec<u32> {
        let Some(ch) = self.chains.get(chain.0 as usize) else {
            return Vec::new();
        };
        if vc.0 as usize >= self.vc_names.len() {
            return Vec::new();
        }
        (0..=ch.top)
            .map(|l| {
                if l == 0 {
                    0
                } else {
                    self.vfree.len(self.vl(vc.0, chain.0, l))
                }
            })
            .collect()
    }

    // ---- safety ----------------------------------------------------------------------------

    /// HiveD Theorem 1 as a checked quantity: in every chain, free cells (split top-down)
    /// cover the cells still owed to VCs at every level.
    pub fn check_safety(&self) -> Result<(), AllocError> {
        for ci in 0..self.chains.len() as u16 {
            self.chain_safe(ci, &[])?;
        }
        Ok(())
    }

    fn chain_safe(&self, ci: u16, free_delta: &[(u8, i64)]) -> Result<(), AllocError> {
        let ch = &self.chains[ci as usize];
        let mut free = [0i64; MAX_LEVELS];
        for l in 1..=ch.top {
            free[l as usize] = self.free_at(ci, l) as i64;
        }
        for &(l, d) in free_delta {
            free[l as usize] += d;
        }
        let owed = &self.owed[ci as usize * MAX_LEVELS..(ci as usize + 1) * MAX_LEVELS];
        cascade(ch.top, &ch.fanout, &free, owed).map_err(|(l, short)| {
            AllocError::Safety(format!(
                "chain `{}` level `{}`: {short} owed cell(s) cannot be served by free cells",
                ch.name, ch.level_names[l as usize]
            ))
        })
    }

    /// Owed cells that healthy free hardware can no longer serve (HiveD's "doomed" cells),
    /// over all VCs together.
    pub fn doomed(&self) -> Vec<Doomed> {
        self.doomed_against(&self.owed)
    }

    /// The cells of one VC that are doomed to be bad, as HiveD counts them per VC
    /// (`vcDoomedBadCells`): the VC's unbound preassigned cells that the healthy free cells of
    /// the whole cluster (split top-down) could not serve even if no other VC asked for any.
    /// Empty for an unknown VC.
    pub fn vc_doomed(&self, vc: VcId) -> Vec<Doomed> {
        let Some(roots) = self.vroots.get(vc.0 as usize) else {
            return Vec::new();
        };
        let mut owed = vec![0i64; self.owed.len()];
        for &r in roots {
            let v = &self.vcells[r as usize];
            if v.pbind == NONE {
                owed[v.chain as usize * MAX_LEVELS + v.level as usize] += 1;
            }
        }
        self.doomed_against(&owed)
    }

    fn doomed_against(&self, owed: &[i64]) -> Vec<Doomed> {
        let mut out = Vec::new();
        for (ci, ch) in self.chains.iter().enumerate() {
            if owed[ci * MAX_LEVELS..(ci + 1) * MAX_LEVELS].iter().all(|&o| o == 0) {
                continue;
            }
            let mut free = [0i64; MAX_LEVELS];
            for l in 1..=ch.top {
                for cat in [CLEAN, DIRTY, BAD] {
                    for c in self.pfree.iter(plist(ci as u16, l, cat)) {
                        self.count_healthy(c, &mut free);
                    }
                }
            }
            let mut spare: i64 = 0;
            for l in (1..=ch.top as usize).rev() {
                if l < ch.top as usize {
                    spare = spare.saturating_mul(ch.fanout[l + 1] as i64);
                }
                spare += free[l] - owed[ci * MAX_LEVELS + l];
                if spare < 0 {
                    out.push(Doomed {
                        chain: ChainId(ci as u16),
                        level: l as u8,
                        cells: -spare,
                    });
                    spare = 0;
                }
            }
        }
        out
    }

    fn count_healthy(&self, c: u32, free: &mut [i64; MAX_LEVELS]) {
        let pc = &self.pcells[c as usize];
        if pc.bad == 0 {
            free[pc.level as usize] += 1;
        } else if pc.level > 1 {
            let f = self.chains[pc.chain as usize].fanout[pc.level as usize];
            for k in 0..f {
                self.count_healthy(pc.first_child + k, free);
            }
        }
    }

    // ---- guaranteed ------------------------------------------------------------------------

    /// Allocates a level-`level` cell of `chain` for VC `vc` (an online workload's cells).
    /// Binds the VC's virtual cell to a physical one lazily, preferring healthy cells without
    /// opportunistic users; exclusive opportunistic users of the chosen GPUs are preempted.
    pub fn allocate_guaranteed(
        &mut self,
        vc: VcId,
        chain: ChainId,
        level: u8,
    ) -> Result<GuaranteedAllocation, AllocError> {
        let ch = self
            .chains
            .get(chain.0 as usize)
            .ok_or_else(|| unknown("chain", chain.0))?;
        if vc.0 as usize >= self.vc_names.len() {
            return Err(unknown("virtual cluster", vc.0));
        }
        if level == 0 || level > ch.top {
            return Err(unknown("level", level));
        }
        let top = ch.top;
        // VC-internal buddy search (read-only until everything is known to succeed).
        let mut chosen = None;
        let mut only_bad = false;
        'search: for l in level..=top {
            let list = self.vl(vc.0, chain.0, l);
            for src in self.vfree.iter(list) {
                match self.plan_binding(src, level) {
                    Ok(root_pick) => {
                        chosen = Some((src, root_pick));
                        break 'search;
                    }
                    Err(Plan::OnlyBad) => only_bad = true,
                    Err(Plan::Unsafe(e)) => return Err(e),
                }
            }
        }
        let Some((src, root_pick)) = chosen else {
            let (vc, chain) = (self.vc_names[vc.0 as usize].clone(), ch.name.clone());
            return Err(if only_bad {
                AllocError::OnlyBadHardware { vc, chain, level }
            } else {
                AllocError::NotInAssignment { vc, chain, level }
            });
        };

        self.vfree.remove(src);
        let mut v = src;
        while self.vcells[v as usize].level > level {
            let vcl = &mut self.vcells[v as usize];
            vcl.state = VState::Split;
            let (fc, lv) = (vcl.first_child, vcl.level);
            let f = self.chains[chain.0 as usize].fanout[lv as usize];
            for k in (1..f).rev() {
                self.vcells[(fc + k) as usize].state = VState::Free;
                self.vfree
                    .push_front(self.vl(vc.0, chain.0, lv - 1), fc + k);
            }
            v = fc;
        }
        {
            let vcl = &mut self.vcells[v as usize];
            vcl.state = VState::Allocated;
            vcl.gen = vcl.gen.wrapping_add(1);
        }
        if let Some((cell, from_level)) = root_pick {
            self.owed[chain.0 as usize * MAX_LEVELS + self.vcells[src as usize].level as usize] -=
                1;
            let r = self.vcells[src as usize].level;
            let p = self.take_root(cell, from_level, r, level);
            self.bind(src, p);
        }
        // Bind the path below the lowest bound ancestor.
        let mut path = [NONE; MAX_LEVELS];
        let mut n = 0;
        let mut x = v;
        while self.vcells[x as usize].pbind == NONE {
            path[n] = x;
            n += 1;
            x = self.vcells[x as usize].parent;
        }
        for &w in path[..n].iter().rev() {
            let pp = self.vcells[self.vcells[w as usize].parent as usize].pbind;
            let child = self.best_child(pp, level);
            self.bind(w, child);
        }
        Ok(self.finish_allocation(v))
    }

    /// Marks a bound virtual cell's physical cell used and preempts exclusive opportunistic
    /// users of its GPUs.
    fn finish_allocation(&mut self, v: u32) -> GuaranteedAllocation {
        let (vc, chain, level) = {
            let x = &self.vcells[v as usize];
            (x.vc, x.chain, x.level)
        };
        let mut x = v;
        while x != NONE {
            self.vcells[x as usize].active += 1;
            x = self.vcells[x as usize].parent;
        }
        self.vcells[v as usize].prio = 0;
        let p = self.vcells[v as usize].pbind;
        self.pcells[p as usize].used_by = v;
        let ng = self.pcells[p as usize].n_gpus;
        let mut c = p;
        while c != NONE {
            self.pcells[c as usize].gused += ng;
            c = self.pcells[c as usize].parent;
        }
        let mut preempted = Vec::new();
        let pc = &self.pcells[p as usize];
        let range = GpuRange {
            start: pc.first_gpu,
            len: pc.n_gpus,
        };
        if pc.opp_ex > 0 {
            for g in range.iter() {
                if self.gpu_flags(g.0).1 == 1 {
                    let s = self.gpu_users[g.0 as usize][0];
                    let id = self.opp_id(s);
                    self.drop_opp(s);
                    preempted.push(id);
                }
            }
            tracing::info!(vc = %self.vc_names[vc as usize], victims = preempted.len(), "guaranteed allocation preempted opportunistic work");
        }
        let id = GuaranteedId {
            cell: v,
            gen: self.vcells[v as usize].gen,
        };
        tracing::debug!(vc, chain, level, %id, first_gpu = range.start, gpus = range.len, "guaranteed cell allocated");
        debug_assert!(self.check_safety().is_ok());
        GuaranteedAllocation {
            id,
            gpus: range,
            preempted,
            preempted_guaranteed: Vec::new(),
        }
    }

    /// Releases a guaranteed allocation; merges virtual and physical buddies back.
    pub fn release_guaranteed(&mut self, id: GuaranteedId) -> Result<(), AllocError> {
        let v = self.live_guaranteed(id)?;
        let p = self.vcells[v as usize].pbind;
        let ng = self.pcells[p as usize].n_gpus;
        self.pcells[p as usize].used_by = NONE;
        let mut c = p;
        while c != NONE {
            self.pcells[c as usize].gused -= ng;
            c = self.pcells[c as usize].parent;
        }
        let mut x = v;
        while x != NONE {
            let vx = &mut self.vcells[x as usize];
            vx.active -= 1;
            let parent = vx.parent;
            if vx.active == 0 {
                let pb = vx.pbind;
                vx.pbind = NONE;
                let (chain, level) = (vx.chain, vx.level);
                self.pcells[pb as usize].vbind = NONE;
                if parent == NONE {
                    self.owed[chain as usize * MAX_LEVELS + level as usize] += 1;
                    self.release_root(pb);
                }
            }
            x = parent;
        }
        // VC-internal merge.
        let (vc, chain) = (self.vcells[v as usize].vc, self.vcells[v as usize].chain);
        self.vcells[v as usize].state = VState::Free;
        let mut x = v;
        loop {
            let parent = self.vcells[x as usize].parent;
            if parent == NONE {
                break;
            }
            let pv = &self.vcells[parent as usize];
            let f = self.chains[chain as usize].fanout[pv.level as usize];
            let fc = pv.first_child;
            if !(0..f).all(|k| fc + k == x || self.vcells[(fc + k) as usize].state == VState::Free)
            {
                break;
            }
            for k in 0..f {
                let s = fc + k;
                self.vfree.remove(s);
                self.vcells[s as usize].state = VState::Inner;
            }
            self.vcells[parent as usize].state = VState::Free;
            x = parent;
        }
        let lv = self.vcells[x as usize].level;
        if self.vcells[x as usize].parent == NONE {
            self.vfree.push_back(self.vl(vc, chain, lv), x);
        } else {
            self.vfree.push_front(self.vl(vc, chain, lv), x);
        }
        tracing::debug!(%id, "guaranteed cell released");
        debug_assert!(self.check_safety().is_ok());
        Ok(())
    }

    fn live_guaranteed(&self, id: GuaranteedId) -> Result<u32, AllocError> {
        match self.vcells.get(id.cell as usize) {
            Some(v) if v.state == VState::Allocated && v.gen == id.gen => Ok(id.cell),
            _ => Err(AllocError::Unknown {
                what: "guaranteed allocation",
                id: id.to_string(),
            }),
        }
    }

    #[inline]
    fn vl(&self, vc: u16, chain: u16, level: u8) -> usize {
        vlist(self.chains.len(), vc, chain, level)
    }

    #[inline]
    fn free_at(&self, chain: u16, level: u8) -> u32 {
        self.pfree.len(plist(chain, level, CLEAN))
            + self.pfree.len(plist(chain, level, DIRTY))
            + self.pfree.len(plist(chain, level, BAD))
    }

    fn bind(&mut self, v: u32, p: u32) {
        debug_assert_eq!(
            self.pcells[p as usize].vbind, NONE,
            "physical cell {p} bound twice"
        );
        self.vcells[v as usize].pbind = p;
        self.pcells[p as usize].vbind = v;
    }

    /// Chooses the free physical cell to bind an owed level-`r` root to: healthy and clean
    /// first, then with opportunistic users, then bad; a higher cell is split only when the
    /// safety check still holds afterwards.
    fn pick_root(&self, chain: u16, r: u8, want: u8) -> Result<(u32, u8), Plan> {
        let ch = &self.chains[chain as usize];
        let mut delta = [(0u8, 0i64); MAX_LEVELS + 1];
        let mut saw_bad = false;
        for cat in [CLEAN, DIRTY, BAD] {
            let mut levels = [0u8; MAX_LEVELS];
            let mut n = 0;
            if cat == BAD {
                for l in r + 1..=ch.top {
                    levels[n] = l;
                    n += 1;
                }
                levels[n] = r;
                n += 1;
            } else {
                for l in r..=ch.top {
                    levels[n] = l;
                    n += 1;
                }
            }
            for &l in &levels[..n] {
                let list = plist(chain, l, cat);
                let c = if cat == BAD {
                    match self
                        .pfree
                        .iter(list)
                        .find(|&c| self.has_healthy_sub(c, want))
                    {
                        Some(c) => c,
                        None => {
                            saw_bad |= self.pfree.len(list) > 0;
                            continue;
                        }
                    }
                } else if cat == DIRTY {
                    // Fewest exclusive opportunistic GPUs = fewest preemptions (bounded scan).
                    match self
                        .pfree
                        .iter(list)
                        .take(DIRTY_SCAN)
                        .min_by_key(|&c| self.pcells[c as usize].opp_ex)
                    {
                        Some(c) => c,
                        None => continue,
                    }
                } else {
                    match self.pfree.front(list) {
                        Some(c) => c,
                        None => continue,
                    }
                };
                if l == r {
                    return Ok((c, l));
                }
                // Splitting one level-l cell down to r: one taken, the buddies freed.
                let mut k = 0;
                delta[k] = (l, -1);
                k += 1;
                for m in r..l {
                    delta[k] = (m, ch.fanout[m as usize + 1] as i64 - 1);
                    k += 1;
                }
                // The root being bound is no longer owed: model it as one more free at r.
                delta[k] = (r, 1);
                k += 1;
                if self.chain_safe(chain, &delta[..k]).is_ok() {
                    return Ok((c, l));
                }
            }
        }
        if saw_bad {
            return Err(Plan::OnlyBad);
        }
        Err(Plan::Unsafe(AllocError::Safety(format!(
            "chain `{}`: no free cell at level `{}` or above for an owed cell",
            ch.name, ch.level_names[r as usize]
        ))))
    }

    /// Decides where a free virtual cell `src` would be bound for a level-`want` allocation,
    /// without changing anything: `Some(root pick)` when its root must be bound first.
    fn plan_binding(&self, src: u32, want: u8) -> Result<Option<(u32, u8)>, Plan> {
        let sv = &self.vcells[src as usize];
        if sv.parent == NONE {
            let pick = self.pick_root(sv.chain, sv.level, want)?;
            if self.pcells[pick.0 as usize].bad > 0
                && self.pcells[self.descend(pick.0, want) as usize].bad > 0
            {
                return Err(Plan::OnlyBad);
            }
            Ok(Some(pick))
        } else {
            let start = self.vcells[sv.parent as usize].pbind;
            if self.pcells[start as usize].bad > 0
                && self.pcells[self.descend(start, want) as usize].bad > 0
            {
                return Err(Plan::OnlyBad);
            }
            Ok(None)
        }
    }

    /// The cell the binding walk would reach from `start` down to level `want`.
    fn descend(&self, start: u32, want: u8) -> u32 {
        let mut c = start;
        while self.pcells[c as usize].level > want {
            c = self.best_child(c, want);
        }
        c
    }

    /// Whether a cell holds a level-`want` cell without bad GPUs.
    fn has_healthy_sub(&self, c: u32, want: u8) -> bool {
        let pc = &self.pcells[c as usize];
        if pc.bad == 0 {
            return true;
        }
        if pc.level <= want {
            return false;
        }
        let f = self.chains[pc.chain as usize].fanout[pc.level as usize];
        (0..f).any(|k| self.has_healthy_sub(pc.first_child + k, want))
    }

    fn take_root(&mut self, cell: u32, from_level: u8, r: u8, want: u8) -> u32 {
        self.pfree.remove(cell);
        let mut c = cell;
        let mut l = from_level;
        while l > r {
            self.pcells[c as usize].state = PState::Split;
            let best = self.best_child(c, want);
            let fc = self.pcells[c as usize].first_child;
            let f = self.chains[self.pcells[c as usize].chain as usize].fanout[l as usize];
            for k in (0..f).rev() {
                let s = fc + k;
                if s != best {
                    let pc = &mut self.pcells[s as usize];
                    pc.state = PState::Free;
                    let list = plist(pc.chain, pc.level, category(pc));
                    self.pfree.push_front(list, s);
                }
            }
            c = best;
            l -= 1;
        }
        self.pcells[c as usize].state = PState::Taken;
        c
    }

    fn release_root(&mut self, p: u32) {
        let mut c = p;
        loop {
            let parent = self.pcells[c as usize].parent;
            if parent == NONE {
                break;
            }
            let pp = &self.pcells[parent as usize];
            let f = self.chains[pp.chain as usize].fanout[pp.level as usize];
            let fc = pp.first_child;
            if !(0..f).all(|k| fc + k == c || self.pcells[(fc + k) as usize].state == PState::Free)
            {
                break;
            }
            for k in 0..f {
                let s = fc + k;
                self.pfree.remove(s);
                self.pcells[s as usize].state = PState::Inner;
            }
            c = parent;
        }
        let pc = &mut self.pcells[c as usize];
        pc.state = PState::Free;
        let list = plist(pc.chain, pc.level, category(pc));
        self.pfree.push_front(list, c);
    }

    /// Best unbound child of a cell on the way down to level `want`: one without bad GPUs,
    /// else one still holding a healthy level-`want` cell; then fewest exclusive
    /// opportunistic users (fewest preemptions).
    fn best_child(&self, c: u32, want: u8) -> u32 {
        let pc = &self.pcells[c as usize];
        let f = self.chains[pc.chain as usize].fanout[pc.level as usize];
        let mut best = NONE;
        let mut key = (u8::MAX, u32::MAX, u32::MAX);
        for k in 0..f {
            let s = pc.first_child + k;
            let sc = &self.pcells[s as usize];
            if sc.vbind != NONE {
                continue;
            }
            let class = if sc.bad == 0 {
                0
            } else if self.has_healthy_sub(s, want) {
                1
            } else {
                2
            };
            let kk = (class, sc.opp_ex, sc.bad);
            if kk < key {
                key = kk;
                best = s;
                if kk == (0, 0, 0) {
                    break;
                }
            }
        }
        debug_assert_ne!(best, NONE, "no unbound child under physical cell {c}");
        best
    }
}

/// Why a binding plan was refused.
enum Plan {
    /// Only cells with bad GPUs could take the request.
    OnlyBad,
    /// No free cell at all (the safety invariant is broken).
    Unsafe(AllocError),
}

#[inline]
fn vlist(nchains: usize, vc: u16, chain: u16, level: u8) -> usize {
    (vc as usize * nchains + chain as usize) * MAX_LEVELS + level as usize
}

fn unknown(what: &'static str, id: impl std::fmt::Display) -> AllocError {
    AllocError::Unknown {
        what,
        id: id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIG3: &str = include_str!("../../examples/cells/hived-fig3.json");

    fn fig3() -> (Cluster, ChainId, [VcId; 3]) {
        let c = Cluster::from_json(FIG3, "hived-fig3.json").unwrap();
        let ch = c.chain_id("v100-rack").unwrap();
        let vcs = [
            c.vc_id("tenant-a").unwrap(),
            c.vc_id("tenant-b").unwrap(),
            c.vc_id("tenant-c").unwrap(),
        ];
        (c, ch, vcs)
    }

    #[test]
    fn example_configs_load_and_keep_chains_apart() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cells");
        Cluster::load(&dir.join("hived-fig3.json")).unwrap();
        let mut c = Cluster::load(&dir.join("heterogeneous.json")).unwrap();
        assert_eq!(c.gpu_count(), 40 + 12);
        let k80 = c.chain_id("k80").unwrap();
        let search = c.vc_id("search").unwrap();
        let g = c.allocate_guaranteed(search, k80, 1).unwrap();
        let addr = c.gpu_address(GpuId(g.gpus.start)).unwrap();
        assert!(addr.node.starts_with("k80-"), "{addr}");
        assert_eq!(c.chains()[k80.0 as usize].gpu_type, "K80");
        let spare = c.node_gpus("v100-spare").unwrap();
        assert_eq!(spare.len, 8);
        c.audit().unwrap();
    }

    #[test]
    fn a_cell_below_the_node_level_is_part_of_one_host() {
        let text = FIG3.replace(
            "{ \"chain\": \"v100-rack\", \"nodes\": [\"v100-n0\", \"v100-n1\", \"v100-n2\", \"v100-n3\"] }",
            "{ \"chain\": \"v100-rack\", \"nodes\": [\"v100-n0\", \"v100-n1\", \"v100-n2\", \"v100-n3\"] },
             { \"chain\": \"v100-rack\", \"level\": \"socket\", \"nodes\": [\"half\"] }",
        );
        let c = Cluster::from_json(&text, "partial.json").unwrap();
        assert_eq!(c.gpu_count(), 36);
        assert_eq!(c.node_gpus("half").unwrap(), GpuRange { start: 32, len: 4 });
        assert!(c.gpu_by_address("half", 4).is_none());
        let bad = text.replace("[\"half\"]", "[\"half\", \"other\"]");
        let err = Cluster::from_json(&bad, "partial.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds 1 node(s), 2 named"), "{err}");
    }

    #[test]
    fn unreadable_file_is_named() {
        let err = Cluster::load(Path::new("/nonexistent/cells.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/nonexistent/cells.json: cannot read"),
            "{err}"
        );
    }

    #[test]
    fn hostile_handles_and_gpus_are_refused() {
        let (mut c, ch, [a, _, _]) = fig3();
        assert!(c.allocate_guaranteed(VcId(99), ch, 1).is_err());
        assert!(c.allocate_guaranteed(a, ChainId(7), 1).is_err());
        assert!(c.allocate_guaranteed(a, ch, 0).is_err());
        assert!(c.allocate_guaranteed(a, ch, 9).is_err());
        assert!(c
            .allocate_opportunistic_on(&[GpuId(1_000_000)], Sharing::Colocate)
            .is_err());
        assert!(c
            .allocate_opportunistic_on(&[GpuId(3), GpuId(3)], Sharing::Colocate)
            .is_err());
        assert!(c.allocate_opportunistic_on(&[], Sharing::Colocate).is_err());
        assert!(c.set_gpu_health(GpuId(32), true).is_err());
        assert!(c.set_node_health("nope", true).is_err());
        assert!(c
            .release_guaranteed(GuaranteedId {
                cell: 12345,
                gen: 1
            })
            .is_err());
        assert!(c
            .release_opportunistic(OpportunisticId { slot: 0, gen: 1 })
            .is_err());
        assert_eq!(c.free_cells(ch), vec![0, 0, 0, 0, 0, 1]);
        assert!(c.free_cells(ChainId(9)).is_empty() && c.owed_cells(ChainId(9)).is_empty());
        assert!(c.vc_free_cells(VcId(9), ch).is_empty());
        c.audit().unwrap();
    }

    #[test]
    fn allocation_splits_and_release_merges_back() {
        let (mut c, ch, [a, _, _]) = fig3();
        let before = c.free_cells(ch);
        assert_eq!(before, vec![0, 0, 0, 0, 0, 1]);
        let g = c.allocate_guaranteed(a, ch, 1).unwrap();
        assert_eq!(g.gpus.len, 1);
        c.audit().unwrap();
        // The tenant's GPU-level cell binds first; the rack was split down to one GPU.
        assert_eq!(c.free_cells(ch), vec![0, 1, 1, 1, 3, 0]);
        c.release_guaranteed(g.id).unwrap();
        assert_eq!(c.free_cells(ch), before);
        c.audit().unwrap();
    }

    #[test]
    fn request_beyond_assignment_is_refused_without_change() {
        let (mut c, ch, [a, _, _]) = fig3();
        let node = c.level(ch, "node").unwrap();
        let err = c.allocate_guaranteed(a, ch, node).unwrap_err();
        assert!(matches!(err, AllocError::NotInAssignment { .. }), "{err}");
        assert_eq!(c.free_cells(ch), vec![0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn stale_handles_are_refused() {
        let (mut c, ch, [a, _, _]) = fig3();
        let g = c.allocate_guaranteed(a, ch, 1).unwrap();
        c.release_guaranteed(g.id).unwrap();
        assert!(c.release_guaranteed(g.id).is_err());
        let g2 = c.allocate_guaranteed(a, ch, 1).unwrap();
        assert!(c.release_guaranteed(g.id).is_err());
        c.release_guaranteed(g2.id).unwrap();
        c.audit().unwrap();
    }

    #[test]
    fn infeasible_assignment_names_vc_chain_and_level() {
        let text = FIG3.replace(
            "{ \"chain\": \"v100-rack\", \"level\": \"node\", \"count\": 2 }",
            "{ \"chain\": \"v100-rack\", \"level\": \"node\", \"count\": 4 }",
        );
        let err = Cluster::from_json(&text, "fig3-bad.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("fig3-bad.json:28: field `virtual_clusters[2].cells`"),
            "{err}"
        );
        assert!(err.contains("`tenant-c`"), "{err}");
        assert!(err.contains("chain `v100-rack`"), "{err}");
        assert!(err.contains("level `socket`"), "{err}");
    }

    #[test]
    fn semantic_config_error_names_line_and_field() {
        let text = FIG3.replace(
            "\"level\": \"pcie\", \"count\": 1 } ] }",
            "\"level\": \"pcei\", \"count\": 1 } ] }",
        );
        let err = Cluster::from_json(&text, "f.json").unwrap_err().to_string();
        assert!(
            err.starts_with("f.json:30: field `virtual_clusters[2].cells[1].level`"),
            "{err}"
        );
    }

    #[test]
    fn colocated_slots_stack_up_to_the_limit() {
        let text = FIG3.replacen("{", "{ \"colocated_per_gpu\": 2,", 1);
        let mut c = Cluster::from_json(&text, "fig3-k2.json").unwrap();
        let ch = c.chain_id("v100-rack").unwrap();
        let a = c.vc_id("tenant-a").unwrap();
        let online = c.allocate_guaranteed(a, ch, 1).unwrap();
        let g = GpuId(online.gpus.start);
        let j1 = c
            .allocate_opportunistic_on(&[g], Sharing::Colocate)
            .unwrap();
        assert!(c
            .free_gpus_for_opportunistic(Sharing::Colocate)
            .contains(&g));
        let j2 = c
            .allocate_opportunistic_on(&[g], Sharing::Colocate)
            .unwrap();
        assert!(!c
            .free_gpus_for_opportunistic(Sharing::Colocate)
            .contains(&g));
        let err = c
            .allocate_opportunistic_on(&[g], Sharing::Colocate)
            .unwrap_err();
        assert!(err.to_string().contains("v100-n0/0"), "{err}");
        assert_eq!(c.opportunistic_users(g), vec![j1, j2]);
        // An exclusive job never joins a GPU with other users.
        let g1 = GpuId(1);
        c.allocate_opportunistic_on(&[g1], Sharing::Colocate)
            .unwrap();
        assert!(c
            .allocate_opportunistic_on(&[g1], Sharing::Exclusive)
            .is_err());
        c.audit().unwrap();
        let hit = c.set_gpu_health(g, true).unwrap();
        assert_eq!(hit.evicted, vec![j1, j2]);
        assert_eq!(hit.affected, vec![online.id]);
        c.audit().unwrap();
        assert!(Cluster::from_json(
            &FIG3.replacen("{", "{ \"colocated_per_gpu\": 0,", 1),
            "k0.json"
        )
        .unwrap_err()
        .to_string()
        .contains("field `colocated_per_gpu`"));
    }

    #[test]
    fn binding_takes_the_cell_with_fewest_victims() {
        let (mut c, ch, [_, _, cc]) = fig3();
        let node = c.level(ch, "node").unwrap();
        assert_eq!(c.allocate_guaranteed(cc, ch, node).unwrap().gpus.start, 0);
        // n1: 4 exclusive jobs, n2: 1, n3: 3 (n1 became "dirty" first).
        for g in [8, 9, 10, 11, 16, 24, 25, 26] {
            c.allocate_opportunistic_on(&[GpuId(g)], Sharing::Exclusive)
                .unwrap();
        }
        let b = c.allocate_guaranteed(cc, ch, node).unwrap();
        assert_eq!(b.gpus, GpuRange { start: 16, len: 8 });
        assert_eq!(b.preempted.len(), 1);
        c.audit().unwrap();
    }

    #[test]
    fn exclusive_opportunistic_is_preempted_colocated_is_not() {
        let (mut c, ch, [_, _, cc]) = fig3();
        let node = c.level(ch, "node").unwrap();
        // Fill every GPU with opportunistic work: 16 exclusive, 16 colocated.
        let mut ex = Vec::new();
        for g in 0..16 {
            ex.push(
                c.allocate_opportunistic_on(&[GpuId(g)], Sharing::Exclusive)
                    .unwrap(),
            );
        }
        for g in 16..32 {
            c.allocate_opportunistic_on(&[GpuId(g)], Sharing::Colocate)
                .unwrap();
        }
        let a = c.allocate_guaranteed(cc, ch, node).unwrap();
        // Binding prefers the cells whose opportunistic users need no preemption.
        assert!(a.preempted.is_empty(), "{:?}", a.preempted);
        assert!(a.gpus.start >= 16);
        let b = c.allocate_guaranteed(cc, ch, node).unwrap();
        assert!(b.preempted.is_empty());
        let d = c.allocate_guaranteed(cc, ch, 2).unwrap();
        assert_eq!(d.preempted.len(), 2);
        for p in &d.preempted {
            assert!(ex.contains(p));
            assert!(c.release_opportunistic(*p).is_err());
        }
        c.audit().unwrap();
    }
}
