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

/// Best `(pairs, total weight)` in lexicographic order over every matching of `w`, by
/// enumeration; same limits as [`brute_force_total`].
pub fn brute_force_max_cardinality(w: &WeightMatrix) -> Option<(usize, f64)> {
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
    Some(best_lex(w, 0, 0u64))
}

fn best_lex(w: &WeightMatrix, row: usize, used: u64) -> (usize, f64) {
    if row == w.rows() {
        return (0, 0.0);
    }
    let mut top = best_lex(w, row + 1, used);
    for (c, &x) in w.row(row).iter().enumerate() {
        if used & (1 << c) == 0 && x.is_finite() {
            let (k, s) = best_lex(w, row + 1, used | (1 << c));
            let cand = (k + 1, s + x);
            if cand.0 > top.0 || (cand.0 == top.0 && cand.1 > top.1) {
                top = cand;
            }
        }
    }
    top
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

/// Best total of `f(gpu, jobs)` over every placement of at most `k` jobs per GPU (each job
/// on at most one GPU, empty groups worth 0), by enumeration. `None` when
/// `(gpus + 1) ^ jobs` exceeds ten million.
pub fn brute_force_groups(
    gpus: usize,
    jobs: usize,
    k: usize,
    f: impl Fn(usize, &[usize]) -> Option<f64>,
) -> Option<f64> {
    let states = (gpus as f64 + 1.0).powi(jobs as i32);
    if states > 1e7 {
        return None;
    }
    let mut choice = vec![0usize; jobs];
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); gpus];
    let mut best = 0.0f64;
    loop {
        for s in groups.iter_mut() {
            s.clear();
        }
        for (j, &c) in choice.iter().enumerate() {
            if c > 0 {
                groups[c - 1].push(j);
            }
        }
        if groups.iter().all(|s| s.len() <= k) {
            let mut total = 0.0;
            let mut ok = true;
            for (g, s) in groups.iter().enumerate() {
                if !s.is_empty() {
                    match f(g, s) {
                        Some(x) => total += x,
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
            }
            if ok {
                best = best.max(total);
            }
        }
        // Next assignment in base (gpus + 1).
        let mut p = 0;
        loop {
            if p == jobs {
                return Some(best);
            }
            choice[p] += 1;
            if choice[p] <= gpus {
                break;
            }
            choice[p] = 0;
            p += 1;
        }
    }
}
