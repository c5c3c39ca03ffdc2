//! Human-readable rendering of a plan.

use std::fmt;

use super::Plan;

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "round {} (period {} s): {} placed, {} breaks, {} waiting, total predicted {:.3}",
            self.round,
            self.period_s,
            self.assignments.len(),
            self.breaks.len(),
            self.unplaced.len(),
            self.total_predicted
        )?;
        if !self.assignments.is_empty() {
            writeln!(
                f,
                "{:<24} {:<20} {:>4} {:<10} {:<20} {:>5} {:>9} {:>6}  KEPT",
                "OFFLINE", "NODE", "GPU", "TYPE", "ONLINE", "SM%", "MEM(MiB)", "PRED"
            )?;
            for a in &self.assignments {
                writeln!(
                    f,
                    "{:<24} {:<20} {:>4} {:<10} {:<20} {:>5.0} {:>9} {:>6.3}  {}",
                    a.offline,
                    a.at.node,
                    a.at.gpu,
                    a.gpu_type,
                    a.online,
                    a.sm_percent,
                    a.memory_quota_mib,
                    a.predicted_normalized,
                    if a.kept { "yes" } else { "new" }
                )?;
            }
        }
        for b in &self.breaks {
            writeln!(f, "break {} on {}/{}: {}", b.offline, b.at.node, b.at.gpu, b.reason)?;
        }
        for s in &self.skipped_gpus {
            writeln!(f, "skip GPU {}/{}: {}", s.at.node, s.at.gpu, s.reason)?;
        }
        if !self.unplaced.is_empty() {
            writeln!(f, "waiting: {}", self.unplaced.join(", "))?;
        }
        Ok(())
    }
}
