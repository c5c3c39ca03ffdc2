//! Builds the index arenas from a checked config: chains, physical cells (children and GPUs
//! contiguous), hosts, and each VC's virtual cells.

use std::collections::HashMap;

use super::config::{line_of, CellsConfig};
use super::error::ConfigError;
use super::freelist::NONE;

/// Deepest hierarchy supported (levels per chain).
pub const MAX_LEVELS: usize = 16;

/// One homogeneous chain, levels numbered 1 (GPU) ..= `top`.
#[derive(Clone, Debug)]
pub struct Chain {
    /// Chain name.
    pub name: String,
    /// GPU model.
    pub gpu_type: String,
    /// Level names, index = level number (index 0 unused).
    pub level_names: Vec<String>,
    /// Children per cell, index = level number (`fanout[1] == 1`).
    pub fanout: Vec<u32>,
    /// GPUs per cell, index = level number.
    pub gpus_at: Vec<u64>,
    /// Level of one host.
    pub node_level: u8,
    /// Highest level.
    pub top: u8,
}

impl Chain {
    /// Level number of a level name.
    pub fn level(&self, name: &str) -> Option<u8> {
        self.level_names
            .iter()
            .position(|n| n == name)
            .filter(|&i| i > 0)
            .map(|i| i as u8)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PState {
    /// In a global free list at its level.
    Free,
    /// Split by the buddy allocator; its children carry the state.
    Split,
    /// Taken from the buddy allocator as a VC's bound root.
    Taken,
    /// Inside a free or taken cell.
    Inner,
}

#[derive(Clone, Debug)]
pub(crate) struct PCell {
    pub level: u8,
    pub chain: u16,
    pub state: PState,
    pub parent: u32,
    pub first_child: u32,
    pub first_gpu: u32,
    pub n_gpus: u32,
    /// Virtual cell bound to this cell, or NONE.
    pub vbind: u32,
    /// Virtual cell whose guaranteed allocation is exactly this cell, or NONE.
    pub used_by: u32,
    /// GPUs under guaranteed allocations made at this cell or below.
    pub gused: u32,
    /// GPUs with an opportunistic user.
    pub opp_any: u32,
    /// GPUs with an exclusive opportunistic user (preemptable by guaranteed work).
    pub opp_ex: u32,
    /// GPUs that take no more opportunistic users (an exclusive one, or colocated slots full).
    pub opp_full: u32,
    /// Bad GPUs.
    pub bad: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VState {
    Free,
    Split,
    Allocated,
    Inner,
}

#[derive(Clone, Debug)]
pub(crate) struct VCell {
    pub vc: u16,
    pub chain: u16,
    pub level: u8,
    pub state: VState,
    pub parent: u32,
    pub first_child: u32,
    /// Physical cell bound to this virtual cell, or NONE.
    pub pbind: u32,
    /// Bumped on every allocation, so stale handles are refused.
    pub gen: u32,
    /// Allocations at or below this cell.
    pub active: u32,
    /// Priority of the allocation made at exactly this cell (meaningful while allocated).
    pub prio: i32,
}

/// A host: name and its GPU range.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub name: String,
    pub first_gpu: u32,
    pub n_gpus: u32,
    /// Host GPU index of `first_gpu`: a host in several chains (several GPU types, as HiveD
    /// allows) lends GPUs 0.. to its first chain in config order, the next indices to the next.
    pub index_base: u32,
    pub chain: u16,
}

/// Everything built from a config, before any allocation.
pub(crate) struct Built {
    pub chains: Vec<Chain>,
    pub pcells: Vec<PCell>,
    /// Top-level physical cells (roots of the forest).
    pub proots: Vec<u32>,
    pub gpu_leaf: Vec<u32>,
    pub gpu_node: Vec<u32>,
    pub gpu_index: Vec<u32>,
    pub nodes: Vec<Node>,
    /// Host name -> its entries (one per chain it lends GPUs to), in config order.
    pub node_by_name: HashMap<String, Vec<u32>>,
    pub vc_names: Vec<String>,
    pub vcells: Vec<VCell>,
    /// Virtual roots (preassigned cells), per VC.
    pub vroots: Vec<Vec<u32>>,
}

fn invalid(origin: &str, text: Option<&str>, field: String, message: String) -> ConfigError {
    let line = text.and_then(|t| line_of(t, &field)).unwrap_or(0);
    ConfigError::Invalid {
        file: origin.to_string(),
        line,
        field,
        message,
    }
}

pub(crate) fn build(
    cfg: &CellsConfig,
    origin: &str,
    text: Option<&str>,
) -> Result<Built, ConfigError> {
    let err = |field: String, message: String| invalid(origin, text, field, message);
    if cfg.chains.len() > u16::MAX as usize {
        return Err(err("chains".into(), "too many chains".into()));
    }
    if cfg.colocated_per_gpu == 0 {
        return Err(err("colocated_per_gpu".into(), "must be at least 1".into()));
    }
    let mut chains = Vec::new();
    let mut chain_by_name = HashMap::new();
    for (ci, c) in cfg.chains.iter().enumerate() {
        if chain_by_name.insert(c.name.clone(), ci).is_some() {
            return Err(err(
                format!("chains[{ci}].name"),
                format!("duplicate chain `{}`", c.name),
            ));
        }
        if c.levels.is_empty() || c.levels.len() >= MAX_LEVELS {
            return Err(err(
                format!("chains[{ci}].levels"),
                format!(
                    "a chain needs 1 to {} levels, got {}",
                    MAX_LEVELS - 1,
                    c.levels.len()
                ),
            ));
        }
        let mut level_names = vec![String::new()];
        let mut fanout = vec![0u32];
        let mut gpus_at = vec![0u64];
        for (li, l) in c.levels.iter().enumerate() {
            if level_names.contains(&l.name) {
                return Err(err(
                    format!("chains[{ci}].levels[{li}].name"),
                    format!("duplicate level `{}`", l.name),
                ));
            }
            let f = match (li, l.children) {
                (0, None) | (0, Some(1)) => 1,
                (0, Some(n)) => {
                    return Err(err(
                        format!("chains[{ci}].levels[0].children"),
                        format!("the first level is one GPU and has no children (got {n})"),
                    ))
                }
                (_, Some(n)) if n >= 1 => n,
                _ => {
                    return Err(err(
                        format!("chains[{ci}].levels[{li}].children"),
                        "every level above the GPU needs `children` >= 1".into(),
                    ))
                }
            };
            let g = if li == 0 { 1 } else { gpus_at[li] * f as u64 };
            if g > u32::MAX as u64 / 2 {
                return Err(err(
                    format!("chains[{ci}].levels[{li}].children"),
                    "cell too large".into(),
                ));
            }
            level_names.push(l.name.clone());
            fanout.push(f);
            gpus_at.push(g);
        }
        let top = c.levels.len() as u8;
        let node_level = match &c.node_level {
            None => top,
            Some(n) => match level_names.iter().position(|x| x == n).filter(|&i| i > 0) {
                Some(i) => i as u8,
                None => {
                    return Err(err(
                        format!("chains[{ci}].node_level"),
                        format!("no level named `{n}` in chain `{}`", c.name),
                    ))
                }
            },
        };
        chains.push(Chain {
            name: c.name.clone(),
            gpu_type: c.gpu_type.clone(),
            level_names,
            fanout,
            gpus_at,
            node_level,
            top,
        });
    }

    let mut pcells: Vec<PCell> = Vec::new();
    let mut proots = Vec::new();
    let (mut gpu_leaf, mut gpu_node, mut gpu_index) = (Vec::new(), Vec::new(), Vec::new());
    let mut nodes: Vec<Node> = Vec::new();
    let mut node_by_name = HashMap::new();
    for (pi, p) in cfg.physical_cells.iter().enumerate() {
        let ci = *chain_by_name.get(&p.chain).ok_or_else(|| {
            err(
                format!("physical_cells[{pi}].chain"),
                format!("unknown chain `{}`", p.chain),
            )
        })?;
        let ch = &chains[ci];
        let level = match &p.level {
            None => ch.top,
            Some(l) => ch.level(l).ok_or_else(|| {
                err(
                    format!("physical_cells[{pi}].level"),
                    format!("no level `{l}` in chain `{}`", ch.name),
                )
            })?,
        };
        // A cell below the node level is part of one host (the host lends only those GPUs).
        let host_level = level.min(ch.node_level);
        let want = (ch.gpus_at[level as usize] / ch.gpus_at[host_level as usize]) as usize;
        if p.nodes.len() != want {
            return Err(err(
                format!("physical_cells[{pi}].nodes"),
                format!(
                    "a `{}` cell of chain `{}` holds {want} node(s), {} named",
                    ch.level_names[level as usize],
                    ch.name,
                    p.nodes.len()
                ),
            ));
        }
        if pcells.len() as u64 + 2 * ch.gpus_at[level as usize] * level as u64
            > (u32::MAX / 2) as u64
        {
            return Err(err(
                format!("physical_cells[{pi}]"),
                "cluster too large".into(),
            ));
        }
        let first_node = nodes.len() as u32;
        let per_node = ch.gpus_at[host_level as usize] as u32;
        for (ni, n) in p.nodes.iter().enumerate() {
            let entries: &mut Vec<u32> = node_by_name.entry(n.clone()).or_default();
            if entries
                .iter()
                .any(|&e| nodes[e as usize].chain == ci as u16)
            {
                return Err(err(
                    format!("physical_cells[{pi}].nodes[{ni}]"),
                    format!("node `{n}` appears twice in chain `{}`", ch.name),
                ));
            }
            let index_base = entries.iter().map(|&e| nodes[e as usize].n_gpus).sum();
            entries.push(nodes.len() as u32);
            nodes.push(Node {
                name: n.clone(),
                first_gpu: gpu_leaf.len() as u32 + ni as u32 * per_node,
                n_gpus: per_node,
                index_base,
                chain: ci as u16,
            });
        }
        let root = pcells.len() as u32;
        pcells.push(new_pcell(level, ci as u16, NONE));
        proots.push(root);
        // Fill children breadth-first per cell so each cell's children are contiguous.
        let mut stack = vec![root];
        let mut order = Vec::new();
        while let Some(c) = stack.pop() {
            order.push(c);
            let lv = pcells[c as usize].level;
            if lv > 1 {
                let f = ch.fanout[lv as usize];
                let first = pcells.len() as u32;
                pcells[c as usize].first_child = first;
                for _ in 0..f {
                    pcells.push(new_pcell(lv - 1, ci as u16, c));
                }
                for k in (0..f).rev() {
                    stack.push(first + k);
                }
            }
        }
        // `order` is a pre-order walk with children in order: leaves come out left to right.
        let base = gpu_leaf.len() as u32;
        for &c in &order {
            if pcells[c as usize].level == 1 {
                let g = gpu_leaf.len() as u32;
                gpu_leaf.push(c);
                let node = first_node + (g - base) / per_node;
                gpu_node.push(node);
                gpu_index.push(nodes[node as usize].index_base + (g - base) % per_node);
                pcells[c as usize].first_gpu = g;
                pcells[c as usize].n_gpus = 1;
            }
        }
        for &c in order.iter().rev() {
            let lv = pcells[c as usize].level;
            if lv > 1 {
                let fc = pcells[c as usize].first_child as usize;
                pcells[c as usize].first_gpu = pcells[fc].first_gpu;
                pcells[c as usize].n_gpus = ch.gpus_at[lv as usize] as u32;
            }
        }
        pcells[root as usize].state = PState::Free;
    }

    let mut vc_names = Vec::new();
    let mut vcells: Vec<VCell> = Vec::new();
    let mut vroots = Vec::new();
    if cfg.virtual_clusters.len() > u16::MAX as usize {
        return Err(err(
            "virtual_clusters".into(),
            "too many virtual clusters".into(),
        ));
    }
    for (vi, v) in cfg.virtual_clusters.iter().enumerate() {
        if vc_names.contains(&v.name) {
            return Err(err(
                format!("virtual_clusters[{vi}].name"),
                format!("duplicate virtual cluster `{}`", v.name),
            ));
        }
        vc_names.push(v.name.clone());
        let mut roots = Vec::new();
        for (ki, c) in v.cells.iter().enumerate() {
            let ci = *chain_by_name.get(&c.chain).ok_or_else(|| {
                err(
                    format!("virtual_clusters[{vi}].cells[{ki}].chain"),
                    format!("unknown chain `{}`", c.chain),
                )
            })?;
            let ch = &chains[ci];
            let level = ch.level(&c.level).ok_or_else(|| {
                err(
                    format!("virtual_clusters[{vi}].cells[{ki}].level"),
                    format!("no level `{}` in chain `{}`", c.level, ch.name),
                )
            })?;
            let size = vcells.len() as u64 + c.count as u64 * 2 * ch.gpus_at[level as usize];
            if size > (u32::MAX / 2) as u64 {
                return Err(err(
                    format!("virtual_clusters[{vi}].cells[{ki}].count"),
                    "too many cells".into(),
                ));
            }
            for _ in 0..c.count {
                let root = vcells.len() as u32;
                vcells.push(new_vcell(vi as u16, ci as u16, level, NONE));
                roots.push(root);
                let mut stack = vec![root];
                while let Some(x) = stack.pop() {
                    let lv = vcells[x as usize].level;
                    if lv > 1 {
                        let f = ch.fanout[lv as usize];
                        let first = vcells.len() as u32;
                        vcells[x as usize].first_child = first;
                        for k in 0..f {
                            vcells.push(new_vcell(vi as u16, ci as u16, lv - 1, x));
                            stack.push(first + k);
                        }
                    }
                }
                vcells[root as usize].state = VState::Free;
            }
        }
        vroots.push(roots);
    }

    Ok(Built {
        chains,
        pcells,
        proots,
        gpu_leaf,
        gpu_node,
        gpu_index,
        nodes,
        node_by_name,
        vc_names,
        vcells,
        vroots,
    })
}

fn new_pcell(level: u8, chain: u16, parent: u32) -> PCell {
    PCell {
        level,
        chain,
        state: PState::Inner,
        parent,
        first_child: NONE,
        first_gpu: 0,
        n_gpus: 0,
        vbind: NONE,
        used_by: NONE,
        gused: 0,
        opp_any: 0,
        opp_ex: 0,
        opp_full: 0,
        bad: 0,
    }
}

fn new_vcell(vc: u16, chain: u16, level: u8, parent: u32) -> VCell {
    VCell {
        vc,
        chain,
        level,
        state: VState::Inner,
        parent,
        first_child: NONE,
        pbind: NONE,
        gen: 0,
        active: 0,
        prio: 0,
    }
}
