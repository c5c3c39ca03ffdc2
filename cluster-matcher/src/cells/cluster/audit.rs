//! Full recomputation of every derived quantity, compared with the incremental state.

use super::super::freelist::NONE;
use super::super::topology::{PState, VState, MAX_LEVELS};
use super::{category, plist, Cluster, Sharing};

impl Cluster {
    /// Recomputes every derived quantity from scratch and compares (for tests and operators):
    /// bindings are one-to-one and nested, no GPU is under two guaranteed allocations,
    /// counters and free lists agree with cell states, and the safety check holds.
    pub fn audit(&self) -> Result<(), String> {
        let ngpu = self.gpu_leaf.len();
        let mut g_owner = vec![NONE; ngpu];
        for (i, v) in self.vcells.iter().enumerate() {
            let i = i as u32;
            if v.pbind != NONE {
                let p = &self.pcells[v.pbind as usize];
                if p.vbind != i {
                    return Err(format!("virtual {i} -> physical {} not mirrored", v.pbind));
                }
                if p.level != v.level || p.chain != v.chain {
                    return Err(format!("virtual {i} bound to a cell of another shape"));
                }
                if v.parent != NONE {
                    let pp = self.vcells[v.parent as usize].pbind;
                    if pp == NONE || p.parent != pp {
                        return Err(format!(
                            "virtual {i} bound outside its parent's physical cell"
                        ));
                    }
                }
                if (v.active > 0) != (v.pbind != NONE) {
                    return Err(format!("virtual {i} bound without allocations"));
                }
            } else if v.active > 0 {
                return Err(format!("virtual {i} active but unbound"));
            }
            if v.state == VState::Allocated {
                let p = &self.pcells[v.pbind as usize];
                if p.used_by != i {
                    return Err(format!("allocation {i} not marked on its physical cell"));
                }
                for g in p.first_gpu..p.first_gpu + p.n_gpus {
                    if g_owner[g as usize] != NONE {
                        return Err(format!("GPU {g} under two guaranteed allocations"));
                    }
                    g_owner[g as usize] = i;
                }
            }
        }
        // Opportunistic users per GPU, recomputed from the live slots.
        let mut n_users = vec![0u32; ngpu];
        let mut n_ex = vec![0u32; ngpu];
        for (s, slot) in self.opp.iter().enumerate() {
            if !slot.live {
                continue;
            }
            for &g in &slot.gpus {
                n_users[g as usize] += 1;
                n_ex[g as usize] += (slot.sharing == Sharing::Exclusive) as u32;
                if !self.gpu_users[g as usize].contains(&(s as u32)) {
                    return Err(format!("opportunistic {s} lost GPU {g}"));
                }
                if slot.sharing == Sharing::Exclusive && g_owner[g as usize] != NONE {
                    return Err(format!(
                        "exclusive opportunistic {s} shares GPU {g} with guaranteed work"
                    ));
                }
            }
        }
        for g in 0..ngpu {
            let n = n_users[g];
            if n as usize != self.gpu_users[g].len() {
                return Err(format!("GPU {g} lists users of dead allocations"));
            }
            if n_ex[g] > 0 && n > 1 {
                return Err(format!("GPU {g}: an exclusive job shares it"));
            }
            if n as usize > self.colocated_per_gpu {
                return Err(format!("GPU {g}: {n} colocated jobs, more than allowed"));
            }
            if n > 0 && self.gpu_bad[g] {
                return Err(format!("bad GPU {g} has opportunistic users"));
            }
        }
        let full = |g: usize| n_ex[g] > 0 || n_users[g] as usize >= self.colocated_per_gpu;
        for (i, p) in self.pcells.iter().enumerate() {
            if p.vbind != NONE && self.vcells[p.vbind as usize].pbind != i as u32 {
                return Err(format!("physical {i} -> virtual {} not mirrored", p.vbind));
            }
            let gs = p.first_gpu as usize..(p.first_gpu + p.n_gpus) as usize;
            let opp = gs.clone().filter(|&g| n_users[g] > 0).count() as u32;
            let ex = gs.clone().filter(|&g| n_ex[g] > 0).count() as u32;
            let fu = gs.clone().filter(|&g| full(g)).count() as u32;
            let bad = gs.clone().filter(|&g| self.gpu_bad[g]).count() as u32;
            if (opp, ex, fu, bad) != (p.opp_any, p.opp_ex, p.opp_full, p.bad) {
                return Err(format!(
                    "physical {i}: counters {:?} != {:?}",
                    (p.opp_any, p.opp_ex, p.opp_full, p.bad),
                    (opp, ex, fu, bad)
                ));
            }
            let listed = self.pfree.owner(i as u32);
            match (p.state, listed) {
                (PState::Free, Some(l)) if l == plist(p.chain, p.level, category(p)) => {}
                (PState::Free, _) => {
                    return Err(format!("free physical {i} not in the right free list"))
                }
                (_, Some(_)) => return Err(format!("physical {i} listed but not free")),
                _ => {}
            }
            if p.state == PState::Free && (p.vbind != NONE || p.gused != 0) {
                return Err(format!("free physical {i} bound or used"));
            }
            if p.state == PState::Taken && p.vbind == NONE {
                return Err(format!("taken physical {i} bound to nobody"));
            }
        }
        for (ci, ch) in self.chains.iter().enumerate() {
            let mut owed = [0i64; MAX_LEVELS];
            for roots in &self.vroots {
                for &r in roots {
                    let v = &self.vcells[r as usize];
                    if v.chain as usize == ci && v.pbind == NONE {
                        owed[v.level as usize] += 1;
                    }
                }
            }
            if owed[..] != self.owed[ci * MAX_LEVELS..(ci + 1) * MAX_LEVELS] {
                return Err(format!("chain `{}`: owed counts drifted", ch.name));
            }
        }
        self.check_safety().map_err(|e| e.to_string())
    }
}
