//! Priorities inside a VC and gang allocation (HiveD's intra-VC scheduler): a guaranteed
//! request that finds no free cell in its VC's view preempts lower-priority guaranteed
//! allocations of the same VC, never another VC's; a group of requests gets all its cells or
//! none.

use super::super::freelist::NONE;
use super::super::topology::VState;
use super::{AllocError, ChainId, Cluster, GuaranteedAllocation, GuaranteedId, VcId};

impl Cluster {
    /// Priority of a live guaranteed allocation (0 for [`Cluster::allocate_guaranteed`]).
    pub fn guaranteed_priority(&self, id: GuaranteedId) -> Result<i32, AllocError> {
        Ok(self.vcells[self.live_guaranteed(id)? as usize].prio)
    }

    /// As [`Cluster::allocate_guaranteed`], at `priority`. When the VC's own view has no free
    /// cell for the request, the VC's allocations of strictly lower priority that free one
    /// cell of the level are preempted (released; listed in `preempted_guaranteed`): the
    /// cell whose victims have the lowest highest priority, then the fewest GPUs. Other VCs
    /// are never touched, and nothing changes when the request fails.
    pub fn allocate_guaranteed_with_priority(
        &mut self,
        vc: VcId,
        chain: ChainId,
        level: u8,
        priority: i32,
    ) -> Result<GuaranteedAllocation, AllocError> {
        let first = match self.allocate_guaranteed(vc, chain, level) {
            Ok(a) => {
                self.vcells[a.id.cell as usize].prio = priority;
                return Ok(a);
            }
            Err(e @ AllocError::NotInAssignment { .. }) => e,
            Err(e) => return Err(e),
        };
        let Some(victims) = self.victims_for(vc, chain, level, priority) else {
            return Err(first);
        };
        // Dry run on a copy: the victims are released only if the request then succeeds.
        let mut trial = self.clone();
        for &v in &victims {
            trial.release_guaranteed(v)?;
        }
        let mut a = trial.allocate_guaranteed(vc, chain, level)?;
        trial.vcells[a.id.cell as usize].prio = priority;
        a.preempted_guaranteed = victims;
        tracing::info!(
            vc = %self.vc_names[vc.0 as usize],
            priority,
            victims = a.preempted_guaranteed.len(),
            "guaranteed allocation preempted lower-priority work of its VC"
        );
        *self = trial;
        Ok(a)
    }

    /// The cheapest set of the VC's lower-priority allocations whose release frees one
    /// level-`level` virtual cell of `chain`, if any.
    fn victims_for(
        &self,
        vc: VcId,
        chain: ChainId,
        level: u8,
        priority: i32,
    ) -> Option<Vec<GuaranteedId>> {
        let mut best: Option<((i32, u64), Vec<GuaranteedId>)> = None;
        for (x, v) in self.vcells.iter().enumerate() {
            if v.vc != vc.0 || v.chain != chain.0 || v.level != level {
                continue;
            }
            let mut victims = Vec::new();
            // An allocated ancestor covers x entirely.
            let mut a = v.parent;
            while a != NONE {
                if self.vcells[a as usize].state == VState::Allocated {
                    victims.push(a);
                }
                a = self.vcells[a as usize].parent;
            }
            self.allocated_under(x as u32, &mut victims);
            if victims.is_empty() {
                continue;
            }
            let mut worst = i32::MIN;
            let mut gpus = 0u64;
            for &w in &victims {
                let wv = &self.vcells[w as usize];
                worst = worst.max(wv.prio);
                gpus += self.chains[wv.chain as usize].gpus_at[wv.level as usize];
            }
            if worst >= priority {
                continue;
            }
            let key = (worst, gpus);
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                let ids = victims
                    .iter()
                    .map(|&w| GuaranteedId {
                        cell: w,
                        gen: self.vcells[w as usize].gen,
                    })
                    .collect();
                best = Some((key, ids));
            }
        }
        best.map(|(_, v)| v)
    }

    fn allocated_under(&self, x: u32, out: &mut Vec<u32>) {
        let v = &self.vcells[x as usize];
        match v.state {
            VState::Allocated => out.push(x),
            VState::Split => {
                let f = self.chains[v.chain as usize].fanout[v.level as usize];
                for k in 0..f {
                    self.allocated_under(v.first_child + k, out);
                }
            }
            VState::Free | VState::Inner => {}
        }
    }

    /// Gang allocation of an affinity group: one guaranteed cell per `(chain, level)` request
    /// of `vc`, all at `priority` (lower-priority work of the VC may be preempted as in
    /// [`Cluster::allocate_guaranteed_with_priority`]). Either every request is served or
    /// nothing changes (the group is tried on a copy of the state, so a call costs one copy);
    /// the error names the first member that could not be served.
    pub fn allocate_group(
        &mut self,
        vc: VcId,
        members: &[(ChainId, u8)],
        priority: i32,
    ) -> Result<Vec<GuaranteedAllocation>, (usize, AllocError)> {
        let mut trial = self.clone();
        let mut out = Vec::with_capacity(members.len());
        for (i, &(chain, level)) in members.iter().enumerate() {
            let a = trial
                .allocate_guaranteed_with_priority(vc, chain, level, priority)
                .map_err(|e| (i, e))?;
            // Members share one priority, so no member is ever another's victim.
            out.push(a);
        }
        *self = trial;
        Ok(out)
    }
}
