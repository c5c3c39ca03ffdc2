//! Operator view of the cells state: per-level free/owed counts, each VC's allocations with
//! host/GPU addresses, opportunistic work, bad GPUs, doomed cells and the safety verdict.

use serde::Serialize;

use super::super::topology::VState;
use super::{ChainId, Cluster, GpuId, GpuRange, Sharing};

/// Whole-cluster summary, serializable to JSON.
#[derive(Clone, Debug, Serialize)]
pub struct CellsReport {
    /// Per chain.
    pub chains: Vec<ChainReport>,
    /// Per virtual cluster.
    pub virtual_clusters: Vec<VcReport>,
    /// Live opportunistic allocations.
    pub opportunistic: Vec<OpportunisticReport>,
    /// Bad GPUs as `host/index`.
    pub bad_gpus: Vec<String>,
    /// Owed cells that healthy hardware cannot serve.
    pub doomed: Vec<DoomedReport>,
    /// `"ok"` or the safety violation.
    pub safety: String,
}

/// One chain.
#[derive(Clone, Debug, Serialize)]
pub struct ChainReport {
    /// Chain name.
    pub name: String,
    /// GPU model.
    pub gpu_type: String,
    /// GPUs in the chain.
    pub gpus: u64,
    /// Levels, top first.
    pub levels: Vec<LevelReport>,
}

/// Free and owed cells at one level.
#[derive(Clone, Debug, Serialize)]
pub struct LevelReport {
    /// Level name.
    pub name: String,
    /// Level number (1 = GPU).
    pub level: u8,
    /// Free physical cells.
    pub free: u32,
    /// Cells guaranteed to VCs and not bound yet.
    pub owed: u32,
}

/// One virtual cluster.
#[derive(Clone, Debug, Serialize)]
pub struct VcReport {
    /// VC name.
    pub name: String,
    /// GPUs guaranteed by its assignment.
    pub gpus_assigned: u64,
    /// GPUs under its live allocations.
    pub gpus_in_use: u64,
    /// Live allocations.
    pub guaranteed: Vec<GuaranteedReport>,
}

/// One guaranteed allocation.
#[derive(Clone, Debug, Serialize)]
pub struct GuaranteedReport {
    /// Handle, as displayed.
    pub id: String,
    /// Chain name.
    pub chain: String,
    /// Level name.
    pub level: String,
    /// GPUs as `host/index`.
    pub gpus: Vec<String>,
}

/// One opportunistic allocation.
#[derive(Clone, Debug, Serialize)]
pub struct OpportunisticReport {
    /// Handle, as displayed.
    pub id: String,
    /// Exclusive or colocated.
    pub sharing: Sharing,
    /// GPUs as `host/index`.
    pub gpus: Vec<String>,
}

/// Doomed cells at one level.
#[derive(Clone, Debug, Serialize)]
pub struct DoomedReport {
    /// Chain name.
    pub chain: String,
    /// Level name.
    pub level: String,
    /// Cells short.
    pub cells: i64,
}

impl Cluster {
    /// Summary for operators (and the plan's JSON output).
    pub fn report(&self) -> CellsReport {
        let addr = |g: GpuId| {
            self.gpu_address(g)
                .map(|a| a.to_string())
                .unwrap_or_default()
        };
        let chains = self
            .chains
            .iter()
            .enumerate()
            .map(|(ci, ch)| {
                let free = self.free_cells(ChainId(ci as u16));
                let owed = self.owed_cells(ChainId(ci as u16));
                ChainReport {
                    name: ch.name.clone(),
                    gpu_type: ch.gpu_type.clone(),
                    gpus: self
                        .proots
                        .iter()
                        .map(|&r| &self.pcells[r as usize])
                        .filter(|p| p.chain as usize == ci)
                        .map(|p| p.n_gpus as u64)
                        .sum(),
                    levels: (1..=ch.top)
                        .rev()
                        .map(|l| LevelReport {
                            name: ch.level_names[l as usize].clone(),
                            level: l,
                            free: free[l as usize],
                            owed: owed[l as usize],
                        })
                        .collect(),
                }
            })
            .collect();
        let mut vcs: Vec<VcReport> = self
            .vc_names
            .iter()
            .enumerate()
            .map(|(vi, name)| VcReport {
                name: name.clone(),
                gpus_assigned: self.vroots[vi]
                    .iter()
                    .map(|&r| {
                        let v = &self.vcells[r as usize];
                        self.chains[v.chain as usize].gpus_at[v.level as usize]
                    })
                    .sum(),
                gpus_in_use: 0,
                guaranteed: Vec::new(),
            })
            .collect();
        for (i, v) in self.vcells.iter().enumerate() {
            if v.state != VState::Allocated {
                continue;
            }
            let p = &self.pcells[v.pbind as usize];
            let range = GpuRange {
                start: p.first_gpu,
                len: p.n_gpus,
            };
            let r = &mut vcs[v.vc as usize];
            r.gpus_in_use += p.n_gpus as u64;
            r.guaranteed.push(GuaranteedReport {
                id: super::GuaranteedId {
                    cell: i as u32,
                    gen: v.gen,
                }
                .to_string(),
                chain: self.chains[v.chain as usize].name.clone(),
                level: self.chains[v.chain as usize].level_names[v.level as usize].clone(),
                gpus: range.iter().map(addr).collect(),
            });
        }
        let opportunistic = self
            .opp
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live)
            .map(|(i, s)| OpportunisticReport {
                id: super::OpportunisticId {
                    slot: i as u32,
                    gen: s.gen,
                }
                .to_string(),
                sharing: s.sharing,
                gpus: s.gpus.iter().map(|&g| addr(GpuId(g))).collect(),
            })
            .collect();
        let doomed = self
            .doomed()
            .into_iter()
            .map(|d| {
                let ch = &self.chains[d.chain.0 as usize];
                DoomedReport {
                    chain: ch.name.clone(),
                    level: ch.level_names[d.level as usize].clone(),
                    cells: d.cells,
                }
            })
            .collect();
        CellsReport {
            chains,
            virtual_clusters: vcs,
            opportunistic,
            bad_gpus: self.bad_gpus().into_iter().map(addr).collect(),
            doomed,
            safety: match self.check_safety() {
                Ok(()) => "ok".into(),
                Err(e) => e.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;

    #[test]
    fn report_lists_allocations_by_address() {
        let text = include_str!("../../../examples/cells/hived-fig3.json");
        let mut c = Cluster::from_json(text, "fig3").unwrap();
        let ch = c.chain_id("v100-rack").unwrap();
        let a = c.vc_id("tenant-a").unwrap();
        c.allocate_guaranteed(a, ch, 2).unwrap();
        c.allocate_opportunistic_on(&[GpuId(31)], Sharing::Colocate)
            .unwrap();
        c.set_gpu_health(GpuId(30), true).unwrap();
        let r = c.report();
        assert_eq!(r.chains[0].gpus, 32);
        assert_eq!(r.chains[0].levels[0].name, "rack");
        assert_eq!(r.virtual_clusters[0].gpus_assigned, 7);
        assert_eq!(r.virtual_clusters[0].gpus_in_use, 2);
        assert_eq!(
            r.virtual_clusters[0].guaranteed[0].gpus,
            ["v100-n0/0", "v100-n0/1"]
        );
        assert_eq!(r.opportunistic[0].gpus, ["v100-n3/7"]);
        assert_eq!(r.bad_gpus, ["v100-n3/6"]);
        assert_eq!(r.safety, "ok");
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"sharing\":\"Colocate\""), "{json}");
    }
}
