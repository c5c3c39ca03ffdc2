//! Dense solving through a sparse candidate graph: each row keeps its best columns, the
//! sparse engine solves that graph, and its duals are checked against every pair of the
//! dense matrix. Pairs that violate dual feasibility join the graph and it is solved
//! again; when none does, the sparse optimum is the dense optimum (LP duality: a feasible
//! dual with complementary slackness certifies it).

use super::dense::row_min;
use super::engine;
use super::sparse::SparseRows;
use super::{SparseWeights, WeightMatrix};

/// Columns kept per row at first.
const FIRST: usize = 16;
/// Violating columns added per row and round.
const ADD: usize = 16;
/// Rounds before giving up (the caller then solves dense).
const MAX_ROUNDS: usize = 6;
/// Give up after the first round when more than this fraction of rows violate: the
/// matrix is too contested (near-equal columns) for a small graph to hold the optimum.
const FIRST_ROUND_MAX_VIOLATING: f64 = 0.25;

/// Solves `w` through candidate graphs; returns the assignment and the number of sparse
/// solves it took, or `None` when the input looks too contested (many violating rows at
/// first, violations not halving per round, the graph past a quarter of the matrix, or
/// the rounds run out): the dense solver is then the better tool.
pub(super) fn solve(w: &WeightMatrix) -> Option<(Vec<Option<usize>>, usize)> {
    let (n, m) = (w.rows(), w.cols());
    if n < 64 || m < 4 * FIRST {
        return None;
    }
    let mut scale = 0.0f64;
    let mut cand: Vec<Vec<u32>> = Vec::with_capacity(n);
    let mut buf: Vec<(f64, u32)> = Vec::with_capacity(m.min(8 * FIRST));
    let by_weight_desc = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0);
    for i in 0..n {
        // Keep a running top set: once it holds 4 * FIRST entries, cut it to FIRST and
        // only admit weights above the cut, so most entries cost one comparison.
        buf.clear();
        let mut cut = 0.0f64;
        for (j, &x) in w.row(i).iter().enumerate() {
            if x > cut {
                buf.push((x, j as u32));
                if buf.len() == 4 * FIRST {
                    buf.select_nth_unstable_by(FIRST - 1, by_weight_desc);
                    buf.truncate(FIRST);
                    cut = buf.iter().fold(f64::INFINITY, |a, p| a.min(p.0));
                }
            }
        }
        scale = buf.iter().fold(scale, |s, p| s.max(p.0));
        cand.push(top(&mut buf, FIRST, by_weight_desc));
    }
    let tol = 1e-11 * scale.max(f64::MIN_POSITIVE);
    let mut edges: usize = cand.iter().map(Vec::len).sum();
    let mut last_added = usize::MAX;
    for round in 0..MAX_ROUNDS {
        let sw = to_sparse(w, &mut cand);
        let st = engine::solve(&mut SparseRows::new(&sw));
        let mut added = 0;
        let mut violating = 0;
        for (i, c) in cand.iter_mut().enumerate() {
            let row = w.row(i);
            let u = st.row_dual(i, |j| -row[j]);
            let low = row_min(row, &st.v);
            if low >= u - tol {
                continue;
            }
            violating += 1;
            if round == 0 && violating as f64 > FIRST_ROUND_MAX_VIOLATING * n as f64 {
                tracing::trace!(violating, "candidate graph abandoned: contested input");
                return None;
            }
            buf.clear();
            for (j, (&x, &vj)) in row.iter().zip(&st.v).enumerate() {
                let r = -x - vj;
                if r < u - tol {
                    buf.push((r, j as u32));
                }
            }
            let more = top(&mut buf, ADD, |a, b| a.0.total_cmp(&b.0));
            added += more.len();
            c.extend(more);
        }
        tracing::trace!(round, edges, added, "candidate graph checked");
        if added == 0 {
            return Some((st.assignment(), round + 1));
        }
        if round > 0 && added > last_added / 2 {
            break;
        }
        last_added = added;
        edges += added;
        if edges > n * m / 4 {
            break;
        }
    }
    None
}

/// The first `k` of `buf` in the order `cmp`, as column indices (`buf` is reordered).
fn top(
    buf: &mut [(f64, u32)],
    k: usize,
    cmp: impl FnMut(&(f64, u32), &(f64, u32)) -> std::cmp::Ordering,
) -> Vec<u32> {
    if buf.len() > k {
        buf.select_nth_unstable_by(k - 1, cmp);
    }
    buf[..k.min(buf.len())].iter().map(|p| p.1).collect()
}

/// The candidate graph as sparse weights (sorts each row's columns in place).
fn to_sparse(w: &WeightMatrix, cand: &mut [Vec<u32>]) -> SparseWeights {
    let mut row_start = Vec::with_capacity(cand.len() + 1);
    let total = cand.iter().map(Vec::len).sum();
    let mut col_idx = Vec::with_capacity(total);
    let mut weight = Vec::with_capacity(total);
    row_start.push(0);
    for (i, c) in cand.iter_mut().enumerate() {
        c.sort_unstable();
        c.dedup();
        let row = w.row(i);
        for &j in c.iter() {
            col_idx.push(j);
            weight.push(row[j as usize]);
        }
        row_start.push(col_idx.len());
    }
    SparseWeights { rows: w.rows(), cols: w.cols(), row_start, col_idx, weight }
}
