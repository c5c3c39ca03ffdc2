//! Reconfiguration: build a cluster from a new config and carry over the live allocations
//! and bad GPUs that still fit, at the same physical places. A guaranteed allocation that no
//! longer fits its VC is lazily downgraded, as HiveD lazy-preempts an affinity group: it keeps
//! running on the same GPUs as exclusive opportunistic work, which guaranteed work preempts
//! when it needs those GPUs. Only what cannot run on at all is reported lost.

use super::super::config::CellsConfig;
use super::super::error::AllocError;
use super::super::error::ConfigError;
use super::super::freelist::NONE;
use super::super::topology::{PState, VState, MAX_LEVELS};
use super::{
    category, plist, Cluster, GpuId, GuaranteedAllocation, GuaranteedId, OpportunisticId,
    Sharing, VcId,
};

/// A guaranteed allocation that lost its guarantee in a reconfiguration but runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downgraded {
    /// Its handle in the old cluster.
    pub old: GuaranteedId,
    /// Its exclusive opportunistic allocation on the same GPUs in the new cluster.
    pub new: OpportunisticId,
    /// Why it no longer fits its VC.
    pub reason: String,
}

/// Outcome of [`Cluster::reconfigure`].
#[derive(Debug)]
pub struct Reconfigured {
    /// The new cluster state.
    pub cluster: Cluster,
    /// Guaranteed allocations kept in place: old handle, new handle.
    pub kept_guaranteed: Vec<(GuaranteedId, GuaranteedId)>,
    /// Opportunistic allocations kept in place: old handle, new handle.
    pub kept_opportunistic: Vec<(OpportunisticId, OpportunisticId)>,
    /// Guaranteed allocations that no longer fit their VC, lazily downgraded to exclusive
    /// opportunistic allocations on the same GPUs (preempted when guaranteed work needs them).
    pub downgraded: Vec<Downgraded>,
    /// Guaranteed allocations that cannot run on at all (a GPU left the cluster or went
    /// bad), with the reason (their work must move).
    pub lost_guaranteed: Vec<(GuaranteedId, String)>,
    /// Opportunistic allocations that no longer fit, with the reason.
    pub lost_opportunistic: Vec<(OpportunisticId, String)>,
}

impl Cluster {
    /// Builds the cluster of `new` (validated like any config; on error `self` is untouched)
    /// and replays the live state onto it: bad GPUs by address, guaranteed allocations at the
    /// same physical cells (largest first), then opportunistic ones on the same GPUs.
    pub fn reconfigure(&self, new: CellsConfig, origin: &str) -> Result<Reconfigured, ConfigError> {
        let mut next = Cluster::build(new, origin, None)?;
        for g in self.bad_gpus() {
            let a = self.gpu_address(g).expect("live GPU");
            if let Some(ng) = next.gpu_by_address(a.node, a.index) {
                let _ = next.set_gpu_health(ng, true);
            }
        }
        let mut out = Reconfigured {
            cluster: next,
            kept_guaranteed: Vec::new(),
            kept_opportunistic: Vec::new(),
            downgraded: Vec::new(),
            lost_guaranteed: Vec::new(),
            lost_opportunistic: Vec::new(),
        };
        let mut live = self.guaranteed_allocations();
        live.sort_by_key(|id| std::cmp::Reverse(self.vcells[id.cell as usize].level));
        let mut misfits = Vec::new();
        for id in live {
            match self.replay_guaranteed(id, &mut out.cluster) {
                Ok(a) => {
                    out.cluster.vcells[a.id.cell as usize].prio =
                        self.vcells[id.cell as usize].prio;
                    out.kept_guaranteed.push((id, a.id));
                }
                Err(why) => misfits.push((id, why)),
            }
        }
        // Lazy downgrade: the work runs on, without its guarantee.
        for (id, why) in misfits {
            let range = self.guaranteed_gpus(id).expect("live allocation");
            let gpus: Option<Vec<GpuId>> = range
                .iter()
                .map(|g| {
                    let a = self.gpu_address(g)?;
                    out.cluster.gpu_by_address(a.node, a.index)
                })
                .collect();
            match gpus.map(|g| out.cluster.allocate_opportunistic_on(&g, Sharing::Exclusive)) {
                Some(Ok(new)) => {
                    tracing::warn!(%id, %new, reason = %why, "guaranteed allocation downgraded to opportunistic");
                    out.downgraded.push(Downgraded {
                        old: id,
                        new,
                        reason: why,
                    });
                }
                Some(Err(e)) => out
                    .lost_guaranteed
                    .push((id, format!("{why}; cannot run on as opportunistic work: {e}"))),
                None => out
                    .lost_guaranteed
                    .push((id, format!("{why}; a GPU left the cluster"))),
            }
        }
        for id in self.opportunistic_allocations() {
            let slot = &self.opp[id.slot as usize];
            let gpus: Option<Vec<GpuId>> = slot
                .gpus
                .iter()
                .map(|&g| {
                    let a = self.gpu_address(GpuId(g))?;
                    out.cluster.gpu_by_address(a.node, a.index)
                })
                .collect();
            let r = match gpus {
                None => Err("a GPU left the cluster".to_string()),
                Some(g) => out
                    .cluster
                    .allocate_opportunistic_on(&g, slot.sharing)
                    .map_err(|e| e.to_string()),
            };
            match r {
                Ok(n) => out.kept_opportunistic.push((id, n)),
                Err(why) => out.lost_opportunistic.push((id, why)),
            }
        }
        tracing::info!(
            origin,
            kept_guaranteed = out.kept_guaranteed.len(),
            downgraded = out.downgraded.len(),
            lost_guaranteed = out.lost_guaranteed.len(),
            kept_opportunistic = out.kept_opportunistic.len(),
            lost_opportunistic = out.lost_opportunistic.len(),
            "cells reconfigured"
        );
        Ok(out)
    }

    fn replay_guaranteed(
        &self,
        id: GuaranteedId,
        next: &mut Cluster,
    ) -> Result<GuaranteedAllocation, String> {
        let v = &self.vcells[id.cell as usize];
        let p = &self.pcells[v.pbind as usize];
        let vc_name = &self.vc_names[v.vc as usize];
        let chain_name = &self.chains[v.chain as usize].name;
        let level_name = &self.chains[v.chain as usize].level_names[v.level as usize];
        let vc = next
            .vc_id(vc_name)
            .ok_or_else(|| format!("virtual cluster `{vc_name}` no longer exists"))?;
        let chain = next
            .chain_id(chain_name)
            .ok_or_else(|| format!("chain `{chain_name}` no longer exists"))?;
        let level = next
            .level(chain, level_name)
            .ok_or_else(|| format!("level `{level_name}` no longer exists"))?;
        let a = self.gpu_address(GpuId(p.first_gpu)).expect("live GPU");
        let g = next
            .gpu_by_address(a.node, a.index)
            .ok_or_else(|| format!("GPU {a} left the cluster"))?;
        let mut t = next.gpu_leaf[g.0 as usize];
        while t != NONE && next.pcells[t as usize].level < level {
            t = next.pcells[t as usize].parent;
        }
        if t == NONE
            || next.pcells[t as usize].chain != chain.0
            || next.pcells[t as usize].first_gpu != g.0
            || next.pcells[t as usize].n_gpus != p.n_gpus
        {
            return Err(format!(
                "no `{level_name}` cell of chain `{chain_name}` starts at GPU {a} any more"
            ));
        }
        let mut root = id.cell;
        while self.vcells[root as usize].parent != NONE {
            root = self.vcells[root as usize].parent;
        }
        let root_level = self.vcells[root as usize].level;
        next.allocate_guaranteed_at(vc.0, t, root_level)
    }

    /// Registers a GPU-level guaranteed allocation of `vc` on exactly GPU `g` (work already
    /// running there, e.g. an online workload pinned to a GPU): binds the VC's virtual cells
    /// along the GPU's ancestors, trying the VC's free roots from the smallest level up.
    /// Checks everything before changing state; the error says why the GPU cannot be taken.
    pub fn allocate_guaranteed_gpu(
        &mut self,
        vc: VcId,
        g: GpuId,
    ) -> Result<GuaranteedAllocation, AllocError> {
        if vc.0 as usize >= self.vc_names.len() {
            return Err(super::unknown("virtual cluster", vc.0));
        }
        let t = *self
            .gpu_leaf
            .get(g.0 as usize)
            .ok_or_else(|| super::unknown("GPU", g.0))?;
        let top = self.chains[self.pcells[t as usize].chain as usize].top;
        let mut last = String::from("no level fits");
        for r in 1..=top {
            match self.allocate_guaranteed_at(vc.0, t, r) {
                Ok(a) => return Ok(a),
                Err(why) => last = why,
            }
        }
        Err(AllocError::NotRegistrable {
            gpu: self
                .gpu_address(g)
                .map_or_else(|| g.0.to_string(), |a| a.to_string()),
            why: format!(
                "virtual cluster `{}` cannot take it: {last}",
                self.vc_names[vc.0 as usize]
            ),
        })
    }

    /// Allocates for `vc` exactly the physical cell `t` (same level as the request), binding
    /// the VC's virtual cells along `t`'s ancestors; an unbound VC root of level `root_level`
    /// is bound to `t`'s ancestor at that level. Checks everything before changing state.
    pub(super) fn allocate_guaranteed_at(
        &mut self,
        vc: u16,
        t: u32,
        root_level: u8,
    ) -> Result<GuaranteedAllocation, String> {
        let (chain, j) = (self.pcells[t as usize].chain, self.pcells[t as usize].level);
        let tc = &self.pcells[t as usize];
        if tc.vbind != NONE || tc.gused != 0 {
            return Err("the cell is already in use".into());
        }
        // Ancestors of t, by level (t itself at level j).
        let mut anc = [NONE; MAX_LEVELS];
        let mut x = t;
        let mut top = j;
        while x != NONE {
            let c = &self.pcells[x as usize];
            if c.used_by != NONE {
                return Err("an enclosing cell is allocated".into());
            }
            anc[c.level as usize] = x;
            top = c.level;
            x = c.parent;
        }
        // Lowest bound ancestor, if any, must belong to this VC.
        let bound = (j + 1..=top).find(|&l| self.pcells[anc[l as usize] as usize].vbind != NONE);
        let mut plan_root = None;
        if let Some(l) = bound {
            let w = self.pcells[anc[l as usize] as usize].vbind;
            if self.vcells[w as usize].vc != vc {
                return Err(format!(
                    "the cell is bound to virtual cluster `{}`",
                    self.vc_names[self.vcells[w as usize].vc as usize]
                ));
            }
        } else {
            // Need one of the VC's free roots at some level r >= j whose physical ancestor is
            // still free in the buddy lists, and a safe split.
            let nchains = self.chains.len();
            let mut found = None;
            for r in (root_level.max(j)..=top).take(1) {
                let ar = anc[r as usize];
                let list = super::vlist(nchains, vc, chain, r);
                let Some(root) = self
                    .vfree
                    .iter(list)
                    .find(|&c| self.vcells[c as usize].parent == NONE)
                else {
                    continue;
                };
                // The free buddy cell containing anc[r].
                let mut f = ar;
                while f != NONE && self.pcells[f as usize].state == PState::Inner {
                    f = self.pcells[f as usize].parent;
                }
                if f == NONE || self.pcells[f as usize].state != PState::Free {
                    continue;
                }
                let l = self.pcells[f as usize].level;
                let ch = &self.chains[chain as usize];
                let mut delta = vec![(l, -1i64), (r, 1)];
                delta.extend((r..l).map(|m| (m, ch.fanout[m as usize + 1] as i64 - 1)));
                if l > r && self.chain_safe(chain, &delta).is_err() {
                    continue;
                }
                found = Some((root, f, r));
                break;
            }
            plan_root = Some(found.ok_or_else(|| {
                let ch = &self.chains[chain as usize];
                format!(
                    "virtual cluster `{}` has no free `{}` cell of chain `{}` that can take this place safely",
                    self.vc_names[vc as usize],
                    ch.level_names.get(root_level as usize).map_or("?", |s| s.as_str()),
                    ch.name
                )
            })?);
        }

        // Mutation starts: every check above passed.
        let mut cur;
        let mut lv;
        if let Some((root, f, r)) = plan_root {
            self.vfree.remove(root);
            self.pfree.remove(f);
            let mut c = f;
            while c != anc[r as usize] {
                let pc = &self.pcells[c as usize];
                let (fc, lvc) = (pc.first_child, pc.level);
                let fan = self.chains[chain as usize].fanout[lvc as usize];
                self.pcells[c as usize].state = PState::Split;
                let next = anc[lvc as usize - 1];
                for k in 0..fan {
                    let s = fc + k;
                    if s != next {
                        let sc = &mut self.pcells[s as usize];
                        sc.state = PState::Free;
                        let list = plist(sc.chain, sc.level, category(sc));
                        self.pfree.push_front(list, s);
                    }
                }
                c = next;
            }
            self.pcells[c as usize].state = PState::Taken;
            self.owed[chain as usize * MAX_LEVELS + r as usize] -= 1;
            self.bind(root, c);
            cur = root;
            lv = r;
            if lv > j {
                self.split_virtual(cur);
            }
        } else {
            lv = bound.expect("bound ancestor");
            cur = self.pcells[anc[lv as usize] as usize].vbind;
        }
        while lv > j {
            let pchild = anc[lv as usize - 1];
            let w = self.pcells[pchild as usize].vbind;
            let next = if w != NONE {
                w
            } else {
                let vcur = &self.vcells[cur as usize];
                let fan = self.chains[chain as usize].fanout[vcur.level as usize];
                let w = (0..fan)
                    .map(|k| vcur.first_child + k)
                    .find(|&c| self.vcells[c as usize].state == VState::Free)
                    .expect("an unbound physical child implies a free virtual child");
                self.vfree.remove(w);
                self.bind(w, pchild);
                if lv - 1 > j {
                    self.split_virtual(w);
                }
                w
            };
            cur = next;
            lv -= 1;
        }
        let v = &mut self.vcells[cur as usize];
        v.state = VState::Allocated;
        v.gen = v.gen.wrapping_add(1);
        Ok(self.finish_allocation(cur))
    }

    /// Marks a free virtual cell split, its children free in the VC's lists.
    fn split_virtual(&mut self, w: u32) {
        let v = &self.vcells[w as usize];
        let (vc, chain, level, fc) = (v.vc, v.chain, v.level, v.first_child);
        let fan = self.chains[chain as usize].fanout[level as usize];
        self.vcells[w as usize].state = VState::Split;
        for k in 0..fan {
            self.vcells[(fc + k) as usize].state = VState::Free;
            let list = self.vl(vc, chain, level - 1);
            self.vfree.push_back(list, fc + k);
        }
    }
}
