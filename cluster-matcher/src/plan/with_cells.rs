//! A round with HiveD cells: online workloads take guaranteed GPU cells of their tenant's
//! virtual cluster, offline jobs take colocated low-priority cells of those same GPUs.

use std::collections::HashSet;

use crate::cells::{Cluster, Sharing};
use crate::predictor::SpeedPredictor;

use super::{plan_core, ClusterSpec, GpuHealth, GpuRef, OnlinePlacement, OnlineWaiting, Plan, Workloads};

/// Cell level of a single GPU (cells number levels from 1 at the GPU).
const GPU_LEVEL: u8 = 1;

/// Runs one round against `cells` (a fresh or carried-over cells state, changed in place):
///
/// 1. every online workload without a GPU gets a GPU-level guaranteed cell of its tenant's
///    VC (on a chain of its `gpu_type` when given); one that cannot waits, with the reason;
/// 2. only GPUs that the cells say can take one more colocated job enter matching, with at
///    most `min(max_offline_per_gpu, colocated_per_gpu)` jobs each;
/// 3. every assignment takes a colocated low-priority cell on its GPU; one refused there
///    is dropped from the plan and its job waits.
pub fn plan_round_with_cells(
    cluster: &ClusterSpec,
    workloads: &Workloads,
    predictor: &SpeedPredictor,
    health: &dyn Fn(&GpuRef) -> GpuHealth,
    round: u64,
    cells: &mut Cluster,
) -> Plan {
    let mut placed = workloads.clone();
    let mut online_placements = Vec::new();
    let mut online_waiting = Vec::new();
    for o in placed.online.iter_mut().filter(|o| o.at.is_none()) {
        match place_online(cells, &o.tenant, o.gpu_type.as_deref()) {
            Ok(at) => {
                tracing::info!(online = %o.name, vc = %o.tenant, node = %at.node, gpu = at.gpu, "guaranteed cell");
                online_placements.push(OnlinePlacement { online: o.name.clone(), at: at.clone() });
                o.at = Some(at);
            }
            Err(reason) => {
                tracing::warn!(online = %o.name, vc = %o.tenant, %reason, "online workload not placed");
                online_waiting.push(OnlineWaiting { online: o.name.clone(), reason });
            }
        }
    }
    placed.online.retain(|o| o.at.is_some());

    let colocatable: HashSet<GpuRef> = cells
        .free_gpus_for_opportunistic(Sharing::Colocate)
        .into_iter()
        .filter_map(|g| cells.gpu_address(g).map(|a| GpuRef { node: a.node.to_string(), gpu: a.index }))
        .collect();
    let excluded = |g: &GpuRef| {
        (!colocatable.contains(g)).then(|| "no low-priority cell (unknown to cells, bad, or colocated slots full)".to_string())
    };
    let per_gpu = cluster.max_offline_per_gpu.min(cells.colocated_per_gpu().max(1));
    let mut plan = plan_core(cluster, &placed, predictor, health, round, &excluded, per_gpu);

    let mut refused = Vec::new();
    plan.assignments.retain(|a| {
        let gpu = cells.gpu_by_address(&a.at.node, a.at.gpu);
        match gpu.map(|g| cells.allocate_opportunistic_on(&[g], Sharing::Colocate)) {
            Some(Ok(_)) => true,
            other => {
                let why = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "GPU unknown to cells".to_string(),
                };
                tracing::warn!(offline = %a.offline, node = %a.at.node, gpu = a.at.gpu, %why, "low-priority cell refused");
                refused.push((a.offline.clone(), a.predicted_normalized));
                false
            }
        }
    });
    for (job, w) in refused {
        plan.total_predicted -= w;
        plan.unplaced.push(job);
    }
    plan.online_placements = online_placements;
    plan.online_waiting.extend(online_waiting);
    plan
}

fn place_online(cells: &mut Cluster, tenant: &str, gpu_type: Option<&str>) -> Result<GpuRef, String> {
    let vc = cells
        .vc_id(tenant)
        .ok_or_else(|| format!("tenant `{tenant}` has no virtual cluster in the cells config"))?;
    let chains: Vec<_> = match gpu_type {
        Some(t) => cells.chains_of_type(t),
        None => (0..cells.chains().len())
            .filter_map(|i| cells.chain_id(&cells.chains()[i].name))
            .collect(),
    };
    if chains.is_empty() {
        return Err(format!("no cells chain of GPU type `{}`", gpu_type.unwrap_or("?")));
    }
    let mut last = String::new();
    for chain in chains {
        match cells.allocate_guaranteed(vc, chain, GPU_LEVEL) {
            Ok(a) => {
                let g = a.gpus.iter().next().ok_or("empty guaranteed cell")?;
                let addr = cells.gpu_address(g).ok_or("guaranteed GPU without an address")?;
                return Ok(GpuRef { node: addr.node.to_string(), gpu: addr.index });
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("VC `{tenant}` has no free guaranteed GPU cell: {last}"))
}
