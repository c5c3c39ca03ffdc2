//! Exhaustive reference solvers for tiny inputs, used to check the fast ones.

use super::WeightMatrix;

/// Largest side [`brute_force_total`] accepts on the smaller side of the matrix.
pub const BRUTE_FORCE_MAX_SIDE: usize = 9;

/// Best total weight over every matching of `w` (forbidden pairs excluded, any row or column
/// may stay unmatched), by enumeration. `None` when the smaller side exceeds
/// [`BRUTE_FORCE_MAX_SIDE`] (the enumeration would not finish in reasonable time).
pub fn brute_force_total(w: &WeightMatrix) -> Option<f64> {
    let t;
    let w = if w.rows() > w.cols() {
        t = w.transposed();
        &t
    } else {
        w
    };
    if w.rows() > BRUTE_FORCE_MAX_SIDE || w.cols() > 64 {
        return None;
    }
    Some(best(w, 0, 0u64))
}

fn best(w: &WeightMatrix, row: usize, used: u64) -> f64 {
    if row == w.rows() {
        return 0.0;
    }
    let mut top = best(w, row + 1, used);
    for (c, &x) in w.row(row).iter().enumerate() {
        if used & (1 << c) == 0 && x.is_finite() {
            top = top.max(x + best(w, row + 1, used | (1 << c)));
        }
    }
    top
}
