//! Bad hardware: marking GPUs and hosts bad or healthy, evicting opportunistic users of dead
//! GPUs and reporting the guaranteed ones.

use super::{unknown, AllocError, Cluster, GpuId, HealthChange};

impl Cluster {
    /// Marks a GPU bad or healthy. A bad GPU's opportunistic users are evicted; guaranteed
    /// allocations on it are reported (kept). Binding avoids bad cells from now on.
    pub fn set_gpu_health(&mut self, g: GpuId, bad: bool) -> Result<HealthChange, AllocError> {
        let addr = self
            .gpu_address(g)
            .ok_or_else(|| unknown("GPU", g.0))?
            .to_string();
        let mut change = HealthChange::default();
        if self.gpu_bad[g.0 as usize] == bad {
            return Ok(change);
        }
        self.gpu_bad[g.0 as usize] = bad;
        if bad {
            while let Some(&s) = self.gpu_users[g.0 as usize].first() {
                change.evicted.push(self.opp_id(s));
                self.drop_opp(s);
            }
        }
        self.adjust_up(
            self.gpu_leaf[g.0 as usize],
            (0, 0, 0),
            if bad { 1 } else { -1 },
        );
        if bad {
            change.affected.extend(self.guaranteed_user(g));
            tracing::warn!(gpu = %addr, evicted = change.evicted.len(), affected = change.affected.len(), "GPU marked bad");
        } else {
            tracing::info!(gpu = %addr, "GPU marked healthy");
        }
        Ok(change)
    }

    /// Marks every GPU of a host bad or healthy.
    pub fn set_node_health(&mut self, node: &str, bad: bool) -> Result<HealthChange, AllocError> {
        let range = self.node_gpus(node).ok_or_else(|| AllocError::Unknown {
            what: "node",
            id: node.to_string(),
        })?;
        let mut all = HealthChange::default();
        for g in range.iter() {
            let c = self.set_gpu_health(g, bad)?;
            all.evicted.extend(c.evicted);
            for a in c.affected {
                if !all.affected.contains(&a) {
                    all.affected.push(a);
                }
            }
        }
        Ok(all)
    }

    /// Bad GPUs.
    pub fn bad_gpus(&self) -> Vec<GpuId> {
        (0..self.gpu_bad.len() as u32)
            .filter(|&g| self.gpu_bad[g as usize])
            .map(GpuId)
            .collect()
    }
}
