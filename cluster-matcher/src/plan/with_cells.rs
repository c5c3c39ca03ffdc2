//! A round with HiveD cells: online workloads take guaranteed GPU cells of their tenant's
//! virtual cluster, offline jobs take colocated low-priority cells of those same GPUs.
//!
//! The cells state lives in a [`CellsState`]: the cells themselves plus a ledger of which
//! workload holds which cell, so that a round starts from the last one's placements.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cells::{Cluster, GuaranteedId, OpportunisticId, Sharing};
use crate::predictor::SpeedPredictor;

use super::{
    ClusterSpec, GpuHealth, GpuRef, OnlinePlacement, OnlineWaiting, Plan, Workloads, plan_core,
};

/// Cell level of a single GPU (cells number levels from 1 at the GPU).
const GPU_LEVEL: u8 = 1;

/// An online workload's guaranteed GPU cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldOnline {
    /// Its GPU.
    pub at: GpuRef,
    /// Its tenant (VC).
    pub tenant: String,
    /// The guaranteed cell.
    pub id: GuaranteedId,
}

/// An offline job's colocated low-priority cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldOffline {
    /// Its GPU.
    pub at: GpuRef,
    /// The colocated cell.
    pub id: OpportunisticId,
}

/// An online workload whose guarantee a reconfiguration took away (its VC no longer has room
/// for it, or no longer exists): as HiveD lazily preempts such a group, it runs on at its GPU
/// on an exclusive low-priority cell, until guaranteed work needs that GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldDowngraded {
    /// Its GPU.
    pub at: GpuRef,
    /// Its tenant (VC).
    pub tenant: String,
    /// The exclusive low-priority cell.
    pub id: OpportunisticId,
    /// Why it lost its guarantee.
    pub reason: String,
}

/// The cells and who holds what in them; carried from round to round.
#[derive(Debug, Clone)]
pub struct CellsState {
    /// The cells.
    pub cells: Cluster,
    /// Online workload name -> its guaranteed cell.
    pub online: BTreeMap<String, HeldOnline>,
    /// Online workload name -> its low-priority cell after a downgrade.
    pub downgraded: BTreeMap<String, HeldDowngraded>,
    /// Offline job name -> its colocated cell.
    pub offline: BTreeMap<String, HeldOffline>,
    /// Rounds never move a running job (see [`super::Planner::keeping_running`]); not saved.
    pub keep_running: bool,
}

/// Format name of the cells state file.
pub const STATE_FORMAT: &str = "xshare-cells-state";
/// Version of the cells state file.
pub const STATE_VERSION: u32 = 1;

/// The cells state file: who holds which GPU, replayed onto cells built from the config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    /// Always [`STATE_FORMAT`].
    pub format: String,
    /// Always [`STATE_VERSION`].
    pub version: u32,
    /// Online workload name -> its tenant (VC) and guaranteed GPU.
    pub online: BTreeMap<String, OnlineEntry>,
    /// Online workload name -> its tenant and GPU, downgraded by a reconfiguration (absent
    /// when none is).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub downgraded: BTreeMap<String, OnlineEntry>,
    /// Offline job name -> its colocated GPU.
    pub offline: BTreeMap<String, GpuRef>,
}

/// One online workload's guaranteed GPU in the state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnlineEntry {
    /// Tenant (VC).
    pub tenant: String,
    /// Host.
    pub node: String,
    /// GPU index on the host.
    pub gpu: u32,
}

impl OnlineEntry {
    /// The entry of an online workload of `tenant` held on the GPU `at`.
    fn of(tenant: &str, at: &GpuRef) -> Self {
        OnlineEntry { tenant: tenant.to_string(), node: at.node.clone(), gpu: at.gpu }
    }
}

/// Errors loading or saving the cells state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The cells config is invalid.
    #[error(transparent)]
    Config(#[from] crate::cells::ConfigError),
    /// The state file cannot be read, written or replayed.
    #[error("{path}: cells state file: {why}")]
    File {
        /// The state file.
        path: PathBuf,
        /// What is wrong, naming the entry.
        why: String,
    },
}

impl CellsState {
    /// A state with nothing recorded (allocations already in `cells` stay, unowned).
    pub fn new(cells: Cluster) -> Self {
        Self {
            cells,
            online: BTreeMap::new(),
            downgraded: BTreeMap::new(),
            offline: BTreeMap::new(),
            keep_running: false,
        }
    }

    /// The ledger as written to the state file.
    pub fn to_file(&self) -> StateFile {
        StateFile {
            format: STATE_FORMAT.into(),
            version: STATE_VERSION,
            online: self.online.iter().map(|(n, h)| (n.clone(), OnlineEntry::of(&h.tenant, &h.at))).collect(),
            downgraded: self
                .downgraded
                .iter()
                .map(|(n, h)| (n.clone(), OnlineEntry::of(&h.tenant, &h.at)))
                .collect(),
            offline: self
                .offline
                .iter()
                .map(|(n, h)| (n.clone(), h.at.clone()))
                .collect(),
        }
    }

    /// Holds online workload `name` at `at`: as a guaranteed cell of its VC when the cells
    /// take it there, else (a reconfiguration took its guarantee away) downgraded to an
    /// exclusive low-priority cell on the same GPU. Errs when neither is possible.
    fn hold_online(&mut self, name: &str, tenant: &str, at: &GpuRef) -> Result<(), String> {
        match register_pinned(&mut self.cells, tenant, at) {
            Ok(id) => {
                self.online.insert(
                    name.to_string(),
                    HeldOnline {
                        at: at.clone(),
                        tenant: tenant.to_string(),
                        id,
                    },
                );
                Ok(())
            }
            Err(why) => {
                let g = self
                    .cells
                    .gpu_by_address(&at.node, at.gpu)
                    .ok_or_else(|| format!("GPU {}/{} is not in the cells config", at.node, at.gpu))?;
                let id = self
                    .cells
                    .allocate_opportunistic_on(&[g], Sharing::Exclusive)
                    .map_err(|e| format!("{why}; cannot run on as low-priority work either: {e}"))?;
                tracing::warn!(online = %name, vc = %tenant, node = %at.node, gpu = at.gpu, reason = %why, "online workload downgraded: no guarantee, runs on as low-priority work");
                self.downgraded.insert(
                    name.to_string(),
                    HeldDowngraded {
                        at: at.clone(),
                        tenant: tenant.to_string(),
                        id,
                        reason: why,
                    },
                );
                Ok(())
            }
        }
    }

    /// Writes the ledger to `path` atomically (a temporary file beside it, synced, renamed).
    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        let err = |why: String| StateError::File {
            path: path.to_path_buf(),
            why,
        };
        let text = serde_json::to_string_pretty(&self.to_file()).map_err(|e| err(e.to_string()))?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(format!("cannot write: {e}"))
        })
    }

    /// `cells` (freshly built from the config) with the ledger of `path` replayed onto it:
    /// online workloads re-registered on their GPUs as guaranteed cells of their VC, offline
    /// jobs' colocated cells retaken. An online workload the cells no longer guarantee (the
    /// config changed: its VC is gone or has no room there) is lazily downgraded, as HiveD
    /// does: it runs on at its GPU on an exclusive low-priority cell (see
    /// [`HeldDowngraded`]). A missing file is a fresh start; a damaged one (bad JSON, other
    /// format or version, unknown GPU, a place the cells refuse outright) is an error naming
    /// the file and the entry.
    pub fn load(cells: Cluster, path: &Path) -> Result<Self, StateError> {
        let err = |why: String| StateError::File {
            path: path.to_path_buf(),
            why,
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(path = %path.display(), "no cells state file yet: starting empty");
                return Ok(Self::new(cells));
            }
            Err(e) => return Err(err(format!("cannot read: {e}"))),
        };
        let file: StateFile = serde_json::from_str(&text).map_err(|e| {
            err(format!(
                "damaged (line {}, column {}): {e}",
                e.line(),
                e.column()
            ))
        })?;
        if file.format != STATE_FORMAT || file.version != STATE_VERSION {
            return Err(err(format!(
                "format `{}` version {} (expected `{STATE_FORMAT}` version {STATE_VERSION})",
                file.format, file.version
            )));
        }
        let mut st = Self::new(cells);
        for (what, entries) in [("online", &file.online), ("downgraded", &file.downgraded)] {
            for (name, e) in entries {
                let at = GpuRef {
                    node: e.node.clone(),
                    gpu: e.gpu,
                };
                st.hold_online(name, &e.tenant, &at).map_err(|why| {
                    err(format!(
                        "{what} entry `{name}` on {}/{}: {why}",
                        at.node, at.gpu
                    ))
                })?;
            }
        }
        for (name, at) in &file.offline {
            let g = st.cells.gpu_by_address(&at.node, at.gpu).ok_or_else(|| {
                err(format!(
                    "offline entry `{name}`: GPU {}/{} is not in the cells config",
                    at.node, at.gpu
                ))
            })?;
            if let Some((who, _)) = st.downgraded.iter().find(|(_, h)| h.at == *at) {
                // A downgraded online workload holds this GPU exclusively now: the offline
                // job leaves the ledger and is matched again (its pair is broken).
                tracing::warn!(offline = %name, online = %who, node = %at.node, gpu = at.gpu, "offline job's GPU now holds a downgraded online workload: matched again");
                continue;
            }
            let id = st
                .cells
                .allocate_opportunistic_on(&[g], Sharing::Colocate)
                .map_err(|e| {
                    err(format!(
                        "offline entry `{name}` on {}/{}: {e}",
                        at.node, at.gpu
                    ))
                })?;
            st.offline
                .insert(name.clone(), HeldOffline { at: at.clone(), id });
        }
        tracing::info!(path = %path.display(), online = st.online.len(), downgraded = st.downgraded.len(), offline = st.offline.len(), "cells state reloaded");
        Ok(st)
    }
}

/// Runs one round against `state` (changed in place; pass the same state to the next round):
///
/// 1. the ledger drops cells of workloads that are gone or now pinned elsewhere;
/// 2. every online workload pinned to a GPU (`node`/`gpu`) is registered as a GPU-level
///    guaranteed cell of its tenant's VC on that GPU, so the cells never hand it out again;
///    one the VC cannot take is reported in `online_unregistered` and its GPU is still never
///    given to another online workload;
/// 3. every other online workload keeps the cell it got in an earlier round, or gets a
///    GPU-level guaranteed cell of its tenant's VC (on a chain of its `gpu_type` when given);
///    one that cannot waits, with the reason;
/// 4. offline jobs: their colocated cells are given back, GPUs the cells say can take a
///    colocated job enter matching (at most `min(max_offline_per_gpu, colocated_per_gpu)`
///    jobs each), and every assignment takes a colocated cell on its GPU; a pair the cells
///    refuse is forbidden and the round re-matched, so the job goes to its next best GPU.
pub fn plan_round_with_cells(
    cluster: &ClusterSpec,
    workloads: &Workloads,
    predictor: &SpeedPredictor,
    health: &dyn Fn(&GpuRef) -> GpuHealth,
    round: u64,
    state: &mut CellsState,
) -> Plan {
    let mut placed = workloads.clone();
    // A job the ledger holds a cell for runs there unless the workloads say otherwise.
    for j in placed.offline.iter_mut().filter(|j| j.current.is_none()) {
        j.current = state.offline.get(&j.name).map(|h| h.at.clone());
    }
    let mut online_placements = Vec::new();
    let mut online_waiting = Vec::new();
    let mut online_unregistered = Vec::new();

    // 1. Forget workloads that left or moved.
    let wanted: BTreeMap<&str, (Option<&GpuRef>, &str)> = workloads
        .online
        .iter()
        .map(|o| (o.name.as_str(), (o.at.as_ref(), o.tenant.as_str())))
        .collect();
    let stale: Vec<String> = state
        .online
        .iter()
        .filter(|(name, h)| match wanted.get(name.as_str()) {
            None => true,
            Some((Some(at), tenant)) => *at != &h.at || *tenant != h.tenant,
            Some((None, tenant)) => *tenant != h.tenant,
        })
        .map(|(n, _)| n.clone())
        .collect();
    for name in stale {
        if let Some(h) = state.online.remove(&name) {
            if let Err(e) = state.cells.release_guaranteed(h.id) {
                tracing::error!(online = %name, error = %e, "releasing a guaranteed cell failed");
            }
        }
    }
    // Downgraded workloads that left or moved give their low-priority cell back; the others
    // get their guarantee back when their VC has room for it again.
    let names: Vec<String> = state.downgraded.keys().cloned().collect();
    for name in names {
        let h = state.downgraded.remove(&name).expect("listed");
        if let Err(e) = state.cells.release_opportunistic(h.id) {
            tracing::error!(online = %name, error = %e, "releasing a downgraded cell failed");
        }
        let keep = match wanted.get(name.as_str()) {
            None => false,
            Some((Some(at), tenant)) => **at == h.at && *tenant == h.tenant,
            Some((None, tenant)) => *tenant == h.tenant,
        };
        if keep {
            if let Err(why) = state.hold_online(&name, &h.tenant, &h.at) {
                tracing::error!(online = %name, %why, "a downgraded workload lost its GPU");
            }
        }
    }

    // 2. Register pinned online workloads where they run.
    let pinned: HashSet<GpuRef> = placed.online.iter().filter_map(|o| o.at.clone()).collect();
    for o in placed.online.iter().filter(|o| o.at.is_some()) {
        if state.online.contains_key(&o.name) {
            continue;
        }
        if let Some(h) = state.downgraded.get(&o.name) {
            online_unregistered.push(OnlineWaiting {
                online: o.name.clone(),
                reason: downgraded_reason(h),
            });
            continue;
        }
        let at = o.at.clone().expect("pinned");
        match register_pinned(&mut state.cells, &o.tenant, &at) {
            Ok(id) => {
                tracing::info!(online = %o.name, vc = %o.tenant, node = %at.node, gpu = at.gpu, "pinned online workload registered in the cells");
                state.online.insert(
                    o.name.clone(),
                    HeldOnline {
                        at,
                        tenant: o.tenant.clone(),
                        id,
                    },
                );
            }
            Err(reason) => {
                tracing::warn!(online = %o.name, vc = %o.tenant, node = %at.node, gpu = at.gpu, %reason, "pinned online workload not registered in the cells");
                online_unregistered.push(OnlineWaiting {
                    online: o.name.clone(),
                    reason,
                });
            }
        }
    }

    // 3. Place the others (keeping earlier rounds' cells), never on a pinned GPU; the new
    //    members of an affinity group all at once or none (gang semantics).
    let mut order: Vec<Vec<usize>> = Vec::new();
    let mut group_slot: BTreeMap<String, usize> = BTreeMap::new();
    for (i, o) in placed
        .online
        .iter_mut()
        .enumerate()
        .filter(|(_, o)| o.at.is_none())
    {
        if let Some(h) = state.online.get(&o.name) {
            o.at = Some(h.at.clone());
            continue;
        }
        if let Some(h) = state.downgraded.get(&o.name) {
            o.at = Some(h.at.clone());
            online_unregistered.push(OnlineWaiting {
                online: o.name.clone(),
                reason: downgraded_reason(h),
            });
            continue;
        }
        match &o.group {
            Some(g) => match group_slot.get(g) {
                Some(&k) => order[k].push(i),
                None => {
                    group_slot.insert(g.clone(), order.len());
                    order.push(vec![i]);
                }
            },
            None => order.push(vec![i]),
        }
    }
    for members in order {
        let mut got: Vec<(usize, GpuRef, GuaranteedId)> = Vec::new();
        let mut failed: Option<(String, String)> = None;
        for &i in &members {
            let o = &placed.online[i];
            match place_online(&mut state.cells, &o.tenant, o.gpu_type.as_deref(), &pinned) {
                Ok((at, id)) => got.push((i, at, id)),
                Err(reason) => {
                    failed = Some((o.name.clone(), reason));
                    break;
                }
            }
        }
        if let Some((who, reason)) = failed {
            for (_, _, id) in got {
                if let Err(e) = state.cells.release_guaranteed(id) {
                    tracing::error!(error = %e, "releasing a guaranteed cell failed");
                }
            }
            for &i in &members {
                let o = &placed.online[i];
                let reason = match &o.group {
                    Some(g) if members.len() > 1 || who != o.name => {
                        format!(
                            "affinity group `{g}` placed all or nothing; `{who}` got no cell: {reason}"
                        )
                    }
                    _ => reason.clone(),
                };
                tracing::warn!(online = %o.name, vc = %o.tenant, %reason, "online workload not placed");
                online_waiting.push(OnlineWaiting {
                    online: o.name.clone(),
                    reason,
                });
            }
            continue;
        }
        for (i, at, id) in got {
            let o = &mut placed.online[i];
            tracing::info!(online = %o.name, vc = %o.tenant, node = %at.node, gpu = at.gpu, "guaranteed cell");
            online_placements.push(OnlinePlacement {
                online: o.name.clone(),
                at: at.clone(),
            });
            state.online.insert(
                o.name.clone(),
                HeldOnline {
                    at: at.clone(),
                    tenant: o.tenant.clone(),
                    id,
                },
            );
            o.at = Some(at);
        }
    }
    // Downgraded workloads whose GPU guaranteed work took this round (lazy preemption).
    let preempted: Vec<String> = state
        .downgraded
        .iter()
        .filter(|(_, h)| state.cells.opportunistic_gpus(h.id).is_err())
        .map(|(n, _)| n.clone())
        .collect();
    for name in preempted {
        let h = state.downgraded.remove(&name).expect("listed");
        let reason = format!(
            "downgraded ({}), then preempted: guaranteed work needed GPU {}/{}",
            h.reason, h.at.node, h.at.gpu
        );
        tracing::warn!(online = %name, %reason, "downgraded online workload preempted");
        online_unregistered.retain(|w| w.online != name);
        online_waiting.push(OnlineWaiting {
            online: name.clone(),
            reason,
        });
        for o in placed.online.iter_mut().filter(|o| o.name == name) {
            o.at = None;
        }
    }
    placed.online.retain(|o| o.at.is_some());

    // 4. Offline jobs: give back their cells, match, take cells; re-match on refusals.
    for (name, h) in std::mem::take(&mut state.offline) {
        if let Err(e) = state.cells.release_opportunistic(h.id) {
            tracing::error!(offline = %name, error = %e, "releasing a colocated cell failed");
        }
    }
    let colocatable: HashSet<GpuRef> = state
        .cells
        .free_gpus_for_opportunistic(Sharing::Colocate)
        .into_iter()
        .filter_map(|g| {
            state.cells.gpu_address(g).map(|a| GpuRef {
                node: a.node.to_string(),
                gpu: a.index,
            })
        })
        .collect();
    let excluded = |g: &GpuRef| {
        (!colocatable.contains(g)).then(|| {
            "no low-priority cell (unknown to cells, bad, or colocated slots full)".to_string()
        })
    };
    let per_gpu = cluster
        .max_offline_per_gpu
        .min(state.cells.colocated_per_gpu().max(1));
    let mut refused_pairs: BTreeSet<(String, GpuRef)> = BTreeSet::new();
    let mut plan;
    loop {
        plan = plan_core(
            cluster,
            &placed,
            predictor,
            health,
            round,
            &excluded,
            &refused_pairs,
            per_gpu,
            super::SolverChoice::Auto,
            None,
            state.keep_running,
        );
        let mut taken: Vec<(String, HeldOffline)> = Vec::new();
        let mut refused = Vec::new();
        for a in &plan.assignments {
            let gpu = state.cells.gpu_by_address(&a.at.node, a.at.gpu);
            match gpu.map(|g| {
                state
                    .cells
                    .allocate_opportunistic_on(&[g], Sharing::Colocate)
            }) {
                Some(Ok(id)) => taken.push((
                    a.offline.clone(),
                    HeldOffline {
                        at: a.at.clone(),
                        id,
                    },
                )),
                other => {
                    let why = match other {
                        Some(Err(e)) => e.to_string(),
                        _ => "GPU unknown to cells".to_string(),
                    };
                    tracing::warn!(offline = %a.offline, node = %a.at.node, gpu = a.at.gpu, %why, "low-priority cell refused; re-matching without this pair");
                    refused.push((a.offline.clone(), a.at.clone()));
                }
            }
        }
        if refused.is_empty() {
            state.offline = taken.into_iter().collect();
            break;
        }
        for (_, h) in taken {
            if let Err(e) = state.cells.release_opportunistic(h.id) {
                tracing::error!(error = %e, "releasing a colocated cell failed");
            }
        }
        // Each pass forbids at least one more pair, so this ends.
        refused_pairs.extend(refused);
    }
    plan.online_placements = online_placements;
    plan.online_waiting.extend(online_waiting);
    plan.online_unregistered = online_unregistered;
    plan.cells_status = Some(std::sync::Arc::new(state.cells.report()));
    plan
}

fn downgraded_reason(h: &HeldDowngraded) -> String {
    format!(
        "downgraded by a reconfiguration ({}): runs on at {}/{} as low-priority work until guaranteed work needs the GPU",
        h.reason, h.at.node, h.at.gpu
    )
}

fn register_pinned(cells: &mut Cluster, tenant: &str, at: &GpuRef) -> Result<GuaranteedId, String> {
    let vc = cells
        .vc_id(tenant)
        .ok_or_else(|| format!("tenant `{tenant}` has no virtual cluster in the cells config"))?;
    let g = cells
        .gpu_by_address(&at.node, at.gpu)
        .ok_or_else(|| format!("GPU {}/{} is not in the cells config", at.node, at.gpu))?;
    cells
        .allocate_guaranteed_gpu(vc, g)
        .map(|a| a.id)
        .map_err(|e| e.to_string())
}

fn place_online(
    cells: &mut Cluster,
    tenant: &str,
    gpu_type: Option<&str>,
    pinned: &HashSet<GpuRef>,
) -> Result<(GpuRef, GuaranteedId), String> {
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
        return Err(format!(
            "no cells chain of GPU type `{}`",
            gpu_type.unwrap_or("?")
        ));
    }
    let mut last = String::new();
    // Cells landing on a GPU that pinned (unregistered) work runs on are held while we look
    // further, then given back.
    let mut held = Vec::new();
    let mut found = None;
    'chains: for chain in chains {
        loop {
            match cells.allocate_guaranteed(vc, chain, GPU_LEVEL) {
                Ok(a) => {
                    let Some(g) = a.gpus.iter().next() else {
                        last = "empty guaranteed cell".into();
                        held.push(a.id);
                        continue 'chains;
                    };
                    let Some(addr) = cells.gpu_address(g) else {
                        held.push(a.id);
                        continue 'chains;
                    };
                    let at = GpuRef {
                        node: addr.node.to_string(),
                        gpu: addr.index,
                    };
                    if pinned.contains(&at) {
                        held.push(a.id);
                        last = format!("GPU {}/{} runs a pinned online workload", at.node, at.gpu);
                        continue;
                    }
                    found = Some((at, a.id));
                    break 'chains;
                }
                Err(e) => {
                    last = e.to_string();
                    continue 'chains;
                }
            }
        }
    }
    for id in held {
        if let Err(e) = cells.release_guaranteed(id) {
            tracing::error!(error = %e, "releasing a held guaranteed cell failed");
        }
    }
    found.ok_or_else(|| format!("VC `{tenant}` has no free guaranteed GPU cell: {last}"))
}

/// Answers a GET of HiveD's inspect API from a round's cells status: `(status, JSON body)`.
/// `path` ends with `inspect/clusterstatus` (everything), `…/physicalcluster`,
/// `…/virtualclusters` (every VC) or `…/virtualclusters/NAME` (one VC); any prefix before
/// `inspect/` is ignored. 404 without cells, for an unknown VC or another path.
pub fn inspect(status: Option<&crate::cells::CellsReport>, path: &str) -> (u16, String) {
    let not_found = |why: String| (404, serde_json::json!({ "Error": why }).to_string());
    let path = path.split('?').next().unwrap_or("").trim_end_matches('/');
    let Some(at) = path.find("inspect/clusterstatus") else {
        return not_found(format!("no inspect view at `{path}`"));
    };
    let rest = &path[at + "inspect/clusterstatus".len()..];
    let Some(st) = status else {
        return not_found("cells mode is off: the cluster names no `cells` config".into());
    };
    let body = match rest {
        "" => serde_json::to_string(st),
        "/physicalcluster" => serde_json::to_string(&st.physical_cluster),
        "/virtualclusters" => serde_json::to_string(&st.virtual_clusters),
        _ => match rest.strip_prefix("/virtualclusters/") {
            Some(name) => match st.virtual_clusters.iter().find(|v| v.name == name) {
                Some(v) => serde_json::to_string(v),
                None => return not_found(format!("no virtual cluster `{name}`")),
            },
            None => return not_found(format!("no inspect view at `{path}`")),
        },
    };
    match body {
        Ok(b) => (200, b),
        Err(e) => (500, serde_json::json!({ "Error": e.to_string() }).to_string()),
    }
}
