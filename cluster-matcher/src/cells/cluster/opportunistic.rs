//! Opportunistic (low-priority) allocations: exclusive HiveD-style jobs and colocated MuxFlow
//! offline jobs, and the per-cell counters that steer binding away from them.

use super::super::freelist::NONE;
use super::super::topology::PState;
use super::{
    category, plist, unknown, AllocError, ChainId, Cluster, GpuId, GpuRange, OppSlot,
    OpportunisticId, Sharing, BAD, CLEAN, DIRTY,
};

/// The opportunistic scheduler's order of hosts: (has a bad GPU, most GPUs used by
/// low-priority work first, GPUs used by guaranteed work).
type HostOrder = (bool, std::cmp::Reverse<u32>, u32);

impl Cluster {
    /// Allocates a level-`level` cell of `chain` for a low-priority job: no other
    /// opportunistic user, healthy, and (for `Exclusive`) no guaranteed user. An `Exclusive`
    /// job of a host's size or smaller goes where HiveD's opportunistic scheduler puts it: on
    /// the healthy host with the most low-priority work already, then the least guaranteed
    /// work. Otherwise free cells are preferred (clean, then with opportunistic users), so
    /// later guaranteed work preempts less.
    pub fn allocate_opportunistic(
        &mut self,
        chain: ChainId,
        level: u8,
        sharing: Sharing,
    ) -> Result<(OpportunisticId, GpuRange), AllocError> {
        let ch = self
            .chains
            .get(chain.0 as usize)
            .ok_or_else(|| unknown("chain", chain.0))?;
        if level == 0 || level > ch.top {
            return Err(unknown("level", level));
        }
        let excl = sharing == Sharing::Exclusive;
        let mut found = None;
        if excl && level <= ch.node_level {
            // HiveD's opportunistic scheduler: hosts sorted healthy first, then most GPUs
            // already used by low-priority work (pack it together), then fewest GPUs used by
            // guaranteed work (stay away from it); the first host that fits takes the job.
            let mut hosts: Vec<(HostOrder, u32)> = self
                .nodes
                .iter()
                .filter(|n| n.chain == chain.0)
                .map(|n| {
                    let c = self.host_cell(n.first_gpu);
                    let pc = &self.pcells[c as usize];
                    ((pc.bad > 0, std::cmp::Reverse(pc.opp_any), pc.gused), c)
                })
                .collect();
            hosts.sort_by_key(|&(k, _)| k);
            found = hosts
                .iter()
                .find_map(|&(_, c)| self.find_sub(c, level, excl));
        }
        'outer: for l in level..=ch.top {
            if found.is_some() {
                break;
            }
            for cat in [CLEAN, DIRTY, BAD] {
                for c in self.pfree.iter(plist(chain.0, l, cat)) {
                    if let Some(x) = self.find_sub(c, level, excl) {
                        found = Some(x);
                        break 'outer;
                    }
                }
            }
        }
        if found.is_none() {
            found = self
                .proots
                .iter()
                .filter(|&&r| self.pcells[r as usize].chain == chain.0)
                .find_map(|&r| self.find_sub(r, level, excl));
        }
        let c = found.ok_or_else(|| AllocError::NoOpportunisticCell {
            chain: ch.name.clone(),
            level,
        })?;
        let pc = &self.pcells[c as usize];
        let range = GpuRange {
            start: pc.first_gpu,
            len: pc.n_gpus,
        };
        let id = self.add_opp(range.iter().map(|g| g.0).collect(), sharing);
        tracing::debug!(%id, chain = chain.0, level, ?sharing, first_gpu = range.start, "opportunistic cell allocated");
        Ok((id, range))
    }

    /// Puts a low-priority job on the given GPUs (a matcher's choice): each must be healthy,
    /// without another opportunistic user, and for `Exclusive` without guaranteed work.
    pub fn allocate_opportunistic_on(
        &mut self,
        gpus: &[GpuId],
        sharing: Sharing,
    ) -> Result<OpportunisticId, AllocError> {
        if gpus.is_empty() {
            return Err(AllocError::GpuUnavailable {
                gpu: "-".into(),
                why: "no GPUs given",
            });
        }
        for (i, &g) in gpus.iter().enumerate() {
            let Some(addr) = self.gpu_address(g) else {
                return Err(unknown("GPU", g.0));
            };
            let why = if self.gpu_bad[g.0 as usize] {
                Some("marked bad")
            } else if !self.gpu_takes(g.0, sharing) {
                Some(match sharing {
                    Sharing::Exclusive => "already has an opportunistic user (exclusive use asked)",
                    Sharing::Colocate => "holds an exclusive job or its colocated slots are full",
                })
            } else if gpus[..i].contains(&g) {
                Some("listed twice")
            } else if sharing == Sharing::Exclusive && self.guaranteed_user(g).is_some() {
                Some("used by guaranteed work (exclusive use asked)")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(AllocError::GpuUnavailable {
                    gpu: addr.to_string(),
                    why,
                });
            }
        }
        let id = self.add_opp(gpus.iter().map(|g| g.0).collect(), sharing);
        tracing::debug!(%id, gpus = gpus.len(), ?sharing, "opportunistic GPUs allocated");
        Ok(id)
    }

    /// Releases an opportunistic allocation.
    pub fn release_opportunistic(&mut self, id: OpportunisticId) -> Result<(), AllocError> {
        let s = self.live_opp(id)?;
        self.drop_opp(s);
        tracing::debug!(%id, "opportunistic allocation released");
        Ok(())
    }

    pub(super) fn live_opp(&self, id: OpportunisticId) -> Result<u32, AllocError> {
        match self.opp.get(id.slot as usize) {
            Some(s) if s.live && s.gen == id.gen => Ok(id.slot),
            _ => Err(AllocError::Unknown {
                what: "opportunistic allocation",
                id: id.to_string(),
            }),
        }
    }

    /// The host-sized cell holding a GPU: its ancestor at the chain's node level, or the
    /// top cell when a partial host sits below that level.
    fn host_cell(&self, g: u32) -> u32 {
        let mut c = self.gpu_leaf[g as usize];
        let node_level = self.chains[self.pcells[c as usize].chain as usize].node_level;
        loop {
            let p = self.pcells[c as usize].parent;
            if p == NONE || self.pcells[p as usize].level > node_level {
                return c;
            }
            c = p;
        }
    }

    fn find_sub(&self, c: u32, level: u8, excl: bool) -> Option<u32> {
        let pc = &self.pcells[c as usize];
        // Bad GPUs never hold opportunistic users, so these counts never overlap.
        let blocked = if excl { pc.opp_any } else { pc.opp_full };
        if blocked + pc.bad >= pc.n_gpus {
            return None;
        }
        if excl && (pc.used_by != NONE || pc.gused >= pc.n_gpus) {
            return None;
        }
        if pc.level == level {
            return (blocked == 0 && pc.bad == 0 && (!excl || pc.gused == 0)).then_some(c);
        }
        let f = self.chains[pc.chain as usize].fanout[pc.level as usize];
        (0..f).find_map(|k| self.find_sub(pc.first_child + k, level, excl))
    }

    fn add_opp(&mut self, gpus: Vec<u32>, sharing: Sharing) -> OpportunisticId {
        let slot = match self.opp_free.pop() {
            Some(s) => s,
            None => {
                self.opp.push(OppSlot {
                    gen: 0,
                    live: false,
                    sharing,
                    gpus: Vec::new(),
                });
                self.opp.len() as u32 - 1
            }
        };
        let s = &mut self.opp[slot as usize];
        s.gen = s.gen.wrapping_add(1);
        s.live = true;
        s.sharing = sharing;
        let gen = s.gen;
        for &g in &gpus {
            let before = self.gpu_flags(g);
            self.gpu_users[g as usize].push(slot);
            let after = self.gpu_flags(g);
            self.adjust_gpu(g, before, after, 0);
        }
        self.opp[slot as usize].gpus = gpus;
        OpportunisticId { slot, gen }
    }

    pub(super) fn drop_opp(&mut self, slot: u32) {
        let gpus = std::mem::take(&mut self.opp[slot as usize].gpus);
        for &g in &gpus {
            let before = self.gpu_flags(g);
            self.gpu_users[g as usize].retain(|&x| x != slot);
            let after = self.gpu_flags(g);
            self.adjust_gpu(g, before, after, 0);
        }
        self.opp[slot as usize].gpus = gpus;
        self.opp[slot as usize].gpus.clear();
        self.opp[slot as usize].live = false;
        self.opp_free.push(slot);
    }

    /// Applies one GPU's change of opportunistic flags (and bad mark) to the counters of its
    /// cell and every ancestor.
    fn adjust_gpu(&mut self, g: u32, before: (i64, i64, i64), after: (i64, i64, i64), d_bad: i64) {
        let d = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        if d != (0, 0, 0) || d_bad != 0 {
            self.adjust_up(self.gpu_leaf[g as usize], d, d_bad);
        }
    }

    /// Adds to the counters of a cell and its ancestors, moving a free cell to the free list
    /// of its new category.
    pub(super) fn adjust_up(
        &mut self,
        cell: u32,
        (d_opp, d_ex, d_full): (i64, i64, i64),
        d_bad: i64,
    ) {
        let mut c = cell;
        while c != NONE {
            let pc = &mut self.pcells[c as usize];
            let before = category(pc);
            pc.opp_any = (pc.opp_any as i64 + d_opp) as u32;
            pc.opp_ex = (pc.opp_ex as i64 + d_ex) as u32;
            pc.opp_full = (pc.opp_full as i64 + d_full) as u32;
            pc.bad = (pc.bad as i64 + d_bad) as u32;
            let after = category(pc);
            if pc.state == PState::Free && before != after {
                let list = plist(pc.chain, pc.level, after);
                self.pfree.remove(c);
                self.pfree.push_back(list, c);
            }
            c = self.pcells[c as usize].parent;
        }
    }
}
