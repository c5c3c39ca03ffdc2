//! Gavel's heterogeneity-aware max-min fairness (Narayanan et al., OSDI'20, §3.1 and §4.1) as
//! a linear program, solved with `microlp` (pure Rust simplex).
//!
//! Resources are the round's shared GPUs grouped by GPU type `t` (capacity `cap_t` = GPUs x
//! jobs per GPU). Job `j`'s throughput on type `t`, `T[j][t]`, is the mean predicted
//! normalized throughput of its allowed pairs there: it is measured beside the online service
//! holding the GPU at the SM share left to offline work, so the LP is space-sharing-aware.
//! Variables `x[j][t]` are the share of time `j` should run on `t`. Gavel's objective:
//!
//! ```text
//! maximize z  subject to  sum_t T[j][t] x[j][t] / E_j >= z   for every job j
//!                         sum_t x[j][t] <= 1                   for every job j
//!                         sum_j x[j][t] <= cap_t               for every type t
//!                         0 <= x[j][t] <= 1,  x[j][t] = 0 where j may not run on t
//! ```
//!
//! where `E_j = min(1, C / N) * sum_t T[j][t] cap_t / C` is `j`'s throughput under an equal,
//! heterogeneity-agnostic share of the cluster (`C` slots, `N` jobs). Among the allocations
//! reaching the optimal `z`, a second LP takes the one with the largest total normalized
//! throughput (Gavel leaves the tie open; this keeps the solution efficient and unique in
//! practice).

use std::collections::HashMap;

use microlp::{ComparisonOp, OptimizationDirection, Problem, Variable};

use super::{Shaped, Slot};
use crate::matching::FORBIDDEN;

/// The LP's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// `x[j][t]`: share of time job `j` runs on GPU type `t`.
    pub x: Vec<Vec<f64>>,
    /// The optimal smallest normalized throughput.
    pub z: f64,
}

/// Solves Gavel's max-min LP for throughputs `tput[j][t]` (0 = `j` cannot run on `t`) and
/// slot capacities `cap[t]`. Jobs with no usable type get no time and do not bound `z`.
pub fn max_min(tput: &[Vec<f64>], cap: &[f64]) -> Result<Allocation, String> {
    let types = cap.len();
    let total_cap: f64 = cap.iter().sum();
    let runnable: Vec<usize> = (0..tput.len()).filter(|&j| tput[j].iter().any(|&v| v > 0.0)).collect();
    let mut x = vec![vec![0.0; types]; tput.len()];
    if runnable.is_empty() || total_cap <= 0.0 {
        return Ok(Allocation { x, z: 0.0 });
    }
    let share = (total_cap / runnable.len() as f64).min(1.0);
    let equal: Vec<f64> =
        tput.iter().map(|row| share * row.iter().zip(cap).map(|(v, c)| v * c).sum::<f64>() / total_cap).collect();
    // Phase 1: the largest z. Phase 2: z held at its optimum, the largest total normalized
    // throughput.
    let build = |phase_two: Option<f64>| -> Result<(f64, Vec<Vec<f64>>), String> {
        let dir = OptimizationDirection::Maximize;
        let mut p = Problem::new(dir);
        let z = p.add_var(if phase_two.is_some() { 0.0 } else { 1.0 }, (0.0, f64::INFINITY));
        let mut vars: Vec<Vec<Option<Variable>>> = vec![vec![None; types]; tput.len()];
        for &j in &runnable {
            for t in 0..types {
                if tput[j][t] > 0.0 && cap[t] > 0.0 {
                    let obj = if phase_two.is_some() { tput[j][t] / equal[j] } else { 0.0 };
                    vars[j][t] = Some(p.add_var(obj, (0.0, 1.0)));
                }
            }
        }
        for &j in &runnable {
            let row: Vec<(Variable, f64)> =
                (0..types).filter_map(|t| vars[j][t].map(|v| (v, tput[j][t] / equal[j]))).collect();
            let mut with_z = row.clone();
            with_z.push((z, -1.0));
            p.add_constraint(with_z.as_slice(), ComparisonOp::Ge, 0.0);
            let time: Vec<(Variable, f64)> = row.iter().map(|(v, _)| (*v, 1.0)).collect();
            p.add_constraint(time.as_slice(), ComparisonOp::Le, 1.0);
        }
        for (t, &c) in cap.iter().enumerate() {
            let col: Vec<(Variable, f64)> = runnable.iter().filter_map(|&j| vars[j][t].map(|v| (v, 1.0))).collect();
            if !col.is_empty() {
                p.add_constraint(col.as_slice(), ComparisonOp::Le, c);
            }
        }
        if let Some(zstar) = phase_two {
            // Hold z at its optimum, less a hair for the simplex's tolerance.
            p.add_constraint([(z, 1.0)], ComparisonOp::Ge, zstar * (1.0 - 1e-9) - 1e-12);
        }
        let sol = p
            .solve()
            .map_err(|e| format!("Gavel max-min LP: {e}"))?
            .into_solution()
            .map_err(|_| "Gavel max-min LP: solve interrupted".to_string())?;
        let xs = vars.iter().map(|row| row.iter().map(|v| v.map_or(0.0, |v| sol.var_value(v).clamp(0.0, 1.0))).collect()).collect();
        Ok((sol.var_value(z), xs))
    };
    let (zstar, _) = build(None)?;
    let (_, xs) = build(Some(zstar))?;
    x = xs;
    Ok(Allocation { x, z: zstar })
}

/// The round's Gavel shares: `T[j][t]` from the predicted weights of allowed pairs, the LP,
/// and the matching weight `x[j][type(g)] + eps * predicted` (see [`Shaped::weight`]). On an
/// LP failure (logged) every job gets the equal share of each type.
pub(super) fn shape(slots: &[Slot], jobs: usize, per_gpu: usize, weight: &dyn Fn(usize, usize) -> f64) -> Shaped {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let gpu_type: Vec<usize> = slots
        .iter()
        .map(|s| {
            let next = ids.len();
            *ids.entry(s.gpu_type).or_insert(next)
        })
        .collect();
    let types = ids.len();
    let mut cap = vec![0.0; types];
    for &t in &gpu_type {
        cap[t] += per_gpu.max(1) as f64;
    }
    let mut tput = vec![vec![0.0; types]; jobs];
    let mut count = vec![vec![0u32; types]; jobs];
    for (gi, &t) in gpu_type.iter().enumerate() {
        for j in 0..jobs {
            let w = weight(gi, j);
            if w != FORBIDDEN && w > 0.0 {
                tput[j][t] += w;
                count[j][t] += 1;
            }
        }
    }
    for j in 0..jobs {
        for t in 0..types {
            if count[j][t] > 0 {
                tput[j][t] /= f64::from(count[j][t]);
            }
        }
    }
    let x = match max_min(&tput, &cap) {
        Ok(a) => a.x,
        Err(e) => {
            tracing::error!(error = %e, "Gavel LP failed; using equal shares this round");
            let total: f64 = cap.iter().sum();
            let share = (total / jobs.max(1) as f64).min(1.0);
            (0..jobs).map(|_| cap.iter().map(|c| share * c / total.max(1.0)).collect()).collect()
        }
    };
    Shaped::Gavel { x: x.into_iter().flatten().collect(), types, gpu_type }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: one V100 and one K80 slot. Job A runs at 0.8 on the V100 and 0.2 on the K80,
    /// job B at 0.3 on both. Equal shares (half a GPU of each type per job): E_A = 0.5,
    /// E_B = 0.3. B can never beat 0.3 (it has one unit of time), so the optimum is z = 1,
    /// reached when B runs all the time and A gets at least 0.5. Among those
    /// allocations the largest total is A on the V100 all the time (0.8) and B on the K80
    /// (0.3): normalized 1.6 and 1.0.
    #[test]
    fn two_jobs_two_types_by_hand() {
        let a = max_min(&[vec![0.8, 0.2], vec![0.3, 0.3]], &[1.0, 1.0]).unwrap();
        assert!((a.z - 1.0).abs() < 1e-6, "z = {}", a.z);
        let want = [[1.0, 0.0], [0.0, 1.0]];
        for (got, want) in a.x.iter().zip(&want) {
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-6, "x = {:?}", a.x);
            }
        }
    }

    /// By hand: three jobs on one V100 and one K80 slot (C = 2, N = 3: each job's equal share
    /// is 2/3 of a slot, a third of each type). A: V100 0.9, K80 0.3 (E_A = 0.4); B and C:
    /// 0.6 on both (E = 0.4). With B and C sharing the K80 and the V100's rest, z is largest when
    /// all three get the same normalized throughput: A on the V100 for a, B and C each (1 - a)/2
    /// of the V100 and half the K80: 0.9a / 0.4 = 0.6 ((1 - a)/2 + 1/2) / 0.4 gives a = 1/2,
    /// z = 1.125: every job beats its equal share by 12.5 %.
    #[test]
    fn three_jobs_share_two_types_above_equal() {
        let a = max_min(&[vec![0.9, 0.3], vec![0.6, 0.6], vec![0.6, 0.6]], &[1.0, 1.0]).unwrap();
        assert!((a.z - 1.125).abs() < 1e-6, "z = {}", a.z);
        assert!((a.x[0][0] - 0.5).abs() < 1e-6 && a.x[0][1].abs() < 1e-6, "x = {:?}", a.x);
    }

    #[test]
    fn nothing_to_share_is_no_error() {
        let a = max_min(&[vec![0.0]], &[1.0]).unwrap();
        assert_eq!(a.z, 0.0);
        assert!(max_min(&[], &[]).unwrap().x.is_empty());
    }
}
