//! Adapter from the plan's allowed pairs to the matching engine (`crate::matching`): exact
//! one-job-per-GPU matching, or up to `k` jobs per GPU.

use crate::matching::multi::best_k_plan;
use crate::matching::{max_weight_matching, max_weight_matching_sparse, SparseWeights, WeightMatrix, FORBIDDEN};

/// Local-search passes for `k > 1` when the instance is small enough for them.
const K_PASSES: usize = 3;
/// Above this many GPU×job cells, `k > 1` plans skip local search (its cost is quadratic).
const K_SEARCH_LIMIT: usize = 200_000;

/// Chosen jobs (columns) per GPU (row). With `per_gpu == 1` this is the exact maximum-weight
/// matching; above 1, the matching engine's group planner with group weight = the sum of
/// the pairs' weights, for groups that `group_fits` accepts (e.g. memory of all jobs fits).
pub fn assign(
    w: &SparseWeights,
    per_gpu: usize,
    group_fits: impl Fn(usize, &[usize]) -> bool,
) -> Vec<Vec<usize>> {
    if per_gpu <= 1 {
        return one_per_gpu(w);
    }
    let f = |g: usize, s: &[usize]| -> Option<f64> {
        if !group_fits(g, s) {
            return None;
        }
        s.iter().map(|&j| w.get(g, j)).sum()
    };
    let passes = if w.rows().saturating_mul(w.cols()) <= K_SEARCH_LIMIT { K_PASSES } else { 0 };
    match best_k_plan(w.rows(), w.cols(), per_gpu, passes, f) {
        Ok(plan) => plan.groups,
        Err(e) => {
            // Weights come from validated predictions; an error here is a bug, not input.
            tracing::error!(error = %e, "k-per-GPU planner refused the weights; falling back to one job per GPU");
            one_per_gpu(w)
        }
    }
}

/// Above this share of allowed pairs the dense solver is used.
const DENSE_ABOVE: f64 = 0.25;

fn one_per_gpu(w: &SparseWeights) -> Vec<Vec<usize>> {
    let cells = w.rows().saturating_mul(w.cols());
    let m = if cells > 0 && w.nnz() as f64 > DENSE_ABOVE * cells as f64 {
        let mut data = vec![FORBIDDEN; cells];
        for r in 0..w.rows() {
            let (cols, ws) = w.row(r);
            for (&c, &x) in cols.iter().zip(ws) {
                data[r * w.cols() + c as usize] = x;
            }
        }
        match WeightMatrix::new(w.rows(), w.cols(), data) {
            Ok(d) => max_weight_matching(&d),
            Err(_) => max_weight_matching_sparse(w),
        }
    } else {
        max_weight_matching_sparse(w)
    };
    let mut groups = vec![Vec::new(); w.rows()];
    for (g, j) in m.pairs() {
        groups[g].push(j);
    }
    groups
}
