//! Operator view of the cells state: per-level free/owed counts, each VC's allocations with
//! host/GPU addresses, opportunistic work, bad GPUs, doomed cells and the safety verdict.

use serde::Serialize;

use super::super::topology::VState;
use super::{ChainId, Cluster, GpuId, GpuRange, Sharing, VcId};

/// Whole-cluster status, serializable to JSON; the shape of HiveD's inspect API
/// (`/v1/inspect/clusterstatus`): the physical cluster and every virtual cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CellsReport {
    /// The physical cluster.
    pub physical_cluster: PhysicalReport,
    /// Per virtual cluster, in config order.
    pub virtual_clusters: Vec<VcReport>,
}

/// The physical cluster (HiveD's `physicalcluster` view).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhysicalReport {
    /// Per chain: free and owed cells per level.
    pub chains: Vec<ChainReport>,
    /// Per host and chain: what each GPU holds.
    pub nodes: Vec<NodeReport>,
    /// Live opportunistic allocations.
    pub opportunistic: Vec<OpportunisticReport>,
    /// Bad GPUs as `host/index`.
    pub bad_gpus: Vec<String>,
    /// Owed cells that healthy hardware cannot serve, over all VCs.
    pub doomed: Vec<DoomedReport>,
    /// `"ok"` or the safety violation.
    pub safety: String,
}

/// One host's GPUs in one chain.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeReport {
    /// Host name.
    pub name: String,
    /// Chain name.
    pub chain: String,
    /// Its GPUs in index order.
    pub gpus: Vec<GpuReport>,
}

/// One GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuReport {
    /// GPU index on the host.
    pub index: u32,
    /// Not marked bad.
    pub healthy: bool,
    /// VC of the guaranteed allocation covering it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guaranteed_vc: Option<String>,
    /// That allocation's priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Opportunistic allocations on it, as displayed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub opportunistic: Vec<String>,
}

/// One chain.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VcReport {
    /// VC name.
    pub name: String,
    /// GPUs guaranteed by its assignment.
    pub gpus_assigned: u64,
    /// GPUs under its live allocations.
    pub gpus_in_use: u64,
    /// Live allocations.
    pub guaranteed: Vec<GuaranteedReport>,
    /// Its unbound preassigned cells that healthy free hardware cannot serve even if no
    /// other VC asks (HiveD's doomed bad cells, counted per VC).
    pub doomed: Vec<DoomedReport>,
    /// Sum of `doomed` cells.
    pub doomed_cells: i64,
}

/// One guaranteed allocation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GuaranteedReport {
    /// Handle, as displayed.
    pub id: String,
    /// Chain name.
    pub chain: String,
    /// Level name.
    pub level: String,
    /// Priority inside its VC.
    pub priority: i32,
    /// GPUs as `host/index`.
    pub gpus: Vec<String>,
}

/// One opportunistic allocation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpportunisticReport {
    /// Handle, as displayed.
    pub id: String,
    /// Exclusive or colocated.
    pub sharing: Sharing,
    /// GPUs as `host/index`.
    pub gpus: Vec<String>,
}

/// Doomed cells at one level.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DoomedReport {
    /// Chain name.
    pub chain: String,
    /// Level name.
    pub level: String,
    /// Cells short.
    pub cells: i64,
}

impl Cluster {
    /// Whole-cluster status for operators (`cluster-matcher cells-inspect`, the extender's
    /// `GET /inspect/clusterstatus`).
    pub fn report(&self) -> CellsReport {
        CellsReport {
            physical_cluster: self.physical_report(),
            virtual_clusters: (0..self.vc_names.len() as u16)
                .map(|v| self.vc_report_of(VcId(v)))
                .collect(),
        }
    }

    /// One virtual cluster's status by name, `None` for an unknown name.
    pub fn vc_report(&self, name: &str) -> Option<VcReport> {
        self.vc_id(name).map(|v| self.vc_report_of(v))
    }

    fn addr(&self, g: GpuId) -> String {
        self.gpu_address(g)
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    fn doomed_report(&self, d: Vec<super::Doomed>) -> Vec<DoomedReport> {
        d.into_iter()
            .map(|d| {
                let ch = &self.chains[d.chain.0 as usize];
                DoomedReport {
                    chain: ch.name.clone(),
                    level: ch.level_names[d.level as usize].clone(),
                    cells: d.cells,
                }
            })
            .collect()
    }

    fn vc_report_of(&self, vc: VcId) -> VcReport {
        let vi = vc.0 as usize;
        let mut r = VcReport {
            name: self.vc_names[vi].clone(),
            gpus_assigned: self.vroots[vi]
                .iter()
                .map(|&r| {
                    let v = &self.vcells[r as usize];
                    self.chains[v.chain as usize].gpus_at[v.level as usize]
                })
                .sum(),
            gpus_in_use: 0,
            guaranteed: Vec::new(),
            doomed: self.doomed_report(self.vc_doomed(vc)),
            doomed_cells: 0,
        };
        r.doomed_cells = r.doomed.iter().map(|d| d.cells).sum();
        for (i, v) in self.vcells.iter().enumerate() {
            if v.state != VState::Allocated || v.vc != vc.0 {
                continue;
            }
            let p = &self.pcells[v.pbind as usize];
            let range = GpuRange {
                start: p.first_gpu,
                len: p.n_gpus,
            };
            r.gpus_in_use += p.n_gpus as u64;
            r.guaranteed.push(GuaranteedReport {
                id: super::GuaranteedId {
                    cell: i as u32,
                    gen: v.gen,
                }
                .to_string(),
                chain: self.chains[v.chain as usize].name.clone(),
                level: self.chains[v.chain as usize].level_names[v.level as usize].clone(),
                priority: v.prio,
                gpus: range.iter().map(|g| self.addr(g)).collect(),
            });
        }
        r
    }

    /// The physical cluster's status (HiveD's `physicalcluster` view).
    pub fn physical_report(&self) -> PhysicalReport {
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
        let nodes = self
            .nodes
            .iter()
            .map(|n| NodeReport {
                name: n.name.clone(),
                chain: self.chains[n.chain as usize].name.clone(),
                gpus: (n.first_gpu..n.first_gpu + n.n_gpus)
                    .map(|g| {
                        let gid = GpuId(g);
                        let owner = self.guaranteed_user(gid);
                        let vcell = owner.map(|o| &self.vcells[o.cell as usize]);
                        GpuReport {
                            index: self.gpu_index[g as usize],
                            healthy: !self.gpu_bad[g as usize],
                            guaranteed_vc: vcell.map(|v| self.vc_names[v.vc as usize].clone()),
                            priority: vcell.map(|v| v.prio),
                            opportunistic: self
                                .opportunistic_users(gid)
                                .iter()
                                .map(|o| o.to_string())
                                .collect(),
                        }
                    })
                    .collect(),
            })
            .collect();
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
                gpus: s.gpus.iter().map(|&g| self.addr(GpuId(g))).collect(),
            })
            .collect();
        PhysicalReport {
            chains,
            nodes,
            opportunistic,
            bad_gpus: self.bad_gpus().into_iter().map(|g| self.addr(g)).collect(),
            doomed: self.doomed_report(self.doomed()),
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
        let p = &r.physical_cluster;
        assert_eq!(p.chains[0].gpus, 32);
        assert_eq!(p.chains[0].levels[0].name, "rack");
        assert_eq!(r.virtual_clusters[0].gpus_assigned, 7);
        assert_eq!(r.virtual_clusters[0].gpus_in_use, 2);
        assert_eq!(
            r.virtual_clusters[0].guaranteed[0].gpus,
            ["v100-n0/0", "v100-n0/1"]
        );
        assert_eq!(r.virtual_clusters[0].guaranteed[0].priority, 0);
        assert_eq!(p.opportunistic[0].gpus, ["v100-n3/7"]);
        assert_eq!(p.bad_gpus, ["v100-n3/6"]);
        assert_eq!(p.safety, "ok");
        let n0 = &p.nodes[0];
        assert_eq!((n0.name.as_str(), n0.gpus.len()), ("v100-n0", 8));
        assert_eq!(n0.gpus[1].guaranteed_vc.as_deref(), Some("tenant-a"));
        assert_eq!(n0.gpus[2].guaranteed_vc, None);
        assert!(!p.nodes[3].gpus[6].healthy);
        assert_eq!(p.nodes[3].gpus[7].opportunistic.len(), 1);
        assert_eq!(c.vc_report("tenant-a").unwrap(), r.virtual_clusters[0]);
        assert!(c.vc_report("nope").is_none());
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"sharing\":\"Colocate\""), "{json}");
    }
}
