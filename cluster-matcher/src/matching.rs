//! Maximum-weight bipartite matching (shortest augmenting path / Jonker-Volgenant family).
//!
//! Rows are online GPUs, columns are offline jobs (the solver does not care which side is
//! which). Every pair carries an `f64` weight or is forbidden; forbidden pairs are never
//! matched, whatever else the matrix holds. The objective is **maximum total weight**, not
//! maximum cardinality: a row or column stays unmatched when matching it does not pay, and
//! pairs of weight `<= 0` are never reported (they cannot raise the total).
//!
//! Two entry points share one engine (`engine`: Jonker-Volgenant augmenting row reduction,
//! then shortest augmenting paths, with an implicit "stay unmatched" column per row):
//! [`max_weight_matching`] for a dense row-major [`WeightMatrix`], and
//! [`max_weight_matching_sparse`] for [`SparseWeights`] (each job allowed on few GPUs),
//! whose cost follows the number of allowed pairs rather than `rows * cols`. A dense
//! matrix is first solved on a small candidate graph (each row's best columns) whose
//! optimality is then certified against every pair by dual feasibility; contested
//! matrices where that does not pay fall back to dense Dijkstra scans. [`multi`] extends
//! matching to up to `k` jobs per GPU; `reference` holds exhaustive solvers for tests.
//! [`classes`] solves exactly on classes of identical rows and columns (a transportation
//! problem), and [`classes::max_weight_matching_auto`] picks it or the pairwise solver.
//!
//! Inputs are validated when built, so solving cannot fail: NaN and `+inf` weights, finite
//! weights beyond [`MAX_ABS_WEIGHT`], mismatched shapes, out-of-range or duplicate sparse
//! entries are refused with a [`MatchError`] naming the entry. The result is exact up to
//! `f64` rounding of sums (the candidate-graph certificate tolerates a dual violation of
//! `1e-11 * max |w|` per pair, so a dense total is within `rows * 1e-11 * max |w|` of the
//! optimum).

mod candidates;
pub mod classes;
mod dense;
mod engine;
pub mod multi;
pub mod reference;
mod sparse;

use std::fmt;

/// Weight of a forbidden pair in a [`WeightMatrix`] (`-inf`).
pub const FORBIDDEN: f64 = f64::NEG_INFINITY;

/// Largest accepted magnitude of a finite weight. Keeps every path length (a sum of at most
/// `2 * (rows + cols)` weights) far from overflow.
pub const MAX_ABS_WEIGHT: f64 = 1e100;

/// Why a weight matrix or edge list was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum MatchError {
    /// `rows * cols` does not equal the number of weights given (or overflows `usize`).
    Shape {
        /// Rows declared.
        rows: usize,
        /// Columns declared.
        cols: usize,
        /// Weights given.
        len: usize,
    },
    /// A weight is NaN.
    NaN {
        /// Row of the weight.
        row: usize,
        /// Column of the weight.
        col: usize,
    },
    /// A weight is `+inf` (use a finite weight; `-inf` means forbidden).
    PositiveInfinity {
        /// Row of the weight.
        row: usize,
        /// Column of the weight.
        col: usize,
    },
    /// A finite weight exceeds [`MAX_ABS_WEIGHT`] in magnitude.
    TooLarge {
        /// Row of the weight.
        row: usize,
        /// Column of the weight.
        col: usize,
        /// The weight given.
        value: f64,
    },
    /// A sparse entry or a setter names a row or column outside the matrix.
    OutOfRange {
        /// Row named.
        row: usize,
        /// Column named.
        col: usize,
        /// Rows in the matrix.
        rows: usize,
        /// Columns in the matrix.
        cols: usize,
    },
    /// A sparse edge list names the same pair twice.
    DuplicatePair {
        /// Row of the repeated pair.
        row: usize,
        /// Column of the repeated pair.
        col: usize,
    },
    /// More rows or columns than [`MAX_SIDE`].
    TooBig {
        /// Rows asked for.
        rows: usize,
        /// Columns asked for.
        cols: usize,
    },
}

impl fmt::Display for MatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatchError::Shape { rows, cols, len } => write!(
                f,
                "weight matrix shape {rows}x{cols} needs {} weights, got {len}",
                rows.checked_mul(*cols).map_or("more than usize::MAX".to_string(), |n| n.to_string())
            ),
            MatchError::NaN { row, col } => write!(f, "weight at (row {row}, col {col}) is NaN"),
            MatchError::PositiveInfinity { row, col } => write!(
                f,
                "weight at (row {row}, col {col}) is +inf; use a finite weight (-inf means forbidden)"
            ),
            MatchError::TooLarge { row, col, value } => write!(
                f,
                "weight at (row {row}, col {col}) is {value:e}, beyond the accepted magnitude {MAX_ABS_WEIGHT:e}"
            ),
            MatchError::OutOfRange { row, col, rows, cols } => write!(
                f,
                "pair (row {row}, col {col}) is outside the {rows}x{cols} matrix"
            ),
            MatchError::DuplicatePair { row, col } => {
                write!(f, "pair (row {row}, col {col}) is given twice")
            }
            MatchError::TooBig { rows, cols } => write!(
                f,
                "matrix {rows}x{cols} is too big: at most {} rows and columns",
                MAX_SIDE
            ),
        }
    }
}

impl std::error::Error for MatchError {}

/// Largest number of rows or columns accepted (16.7 million): far beyond a cluster's
/// GPUs or jobs, and small enough that the per-row and per-column arrays of a solve
/// (a few hundred MB at most) cannot exhaust memory on a hostile shape.
pub const MAX_SIDE: usize = 1 << 24;

fn check_weight(row: usize, col: usize, w: f64) -> Result<(), MatchError> {
    if w.is_nan() {
        Err(MatchError::NaN { row, col })
    } else if w == f64::INFINITY {
        Err(MatchError::PositiveInfinity { row, col })
    } else if w.is_finite() && w.abs() > MAX_ABS_WEIGHT {
        Err(MatchError::TooLarge { row, col, value: w })
    } else {
        Ok(())
    }
}

fn check_sides(rows: usize, cols: usize) -> Result<(), MatchError> {
    if rows > MAX_SIDE || cols > MAX_SIDE {
        Err(MatchError::TooBig { rows, cols })
    } else {
        Ok(())
    }
}

/// Dense row-major weights; [`FORBIDDEN`] (`-inf`) marks a pair that must never be matched.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightMatrix {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl WeightMatrix {
    /// Wraps row-major `data` (`rows * cols` weights), refusing NaN, `+inf` and huge values.
    pub fn new(rows: usize, cols: usize, data: Vec<f64>) -> Result<Self, MatchError> {
        check_sides(rows, cols)?;
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(MatchError::Shape { rows, cols, len: data.len() });
        }
        if let Some(k) = data.iter().position(|&w| check_weight(0, 0, w).is_err()) {
            check_weight(k / cols, k % cols, data[k])?;
        }
        Ok(WeightMatrix { rows, cols, data })
    }

    /// Builds a matrix from `f(row, col)`: `Some(weight)` or `None` for a forbidden pair.
    pub fn from_fn(
        rows: usize,
        cols: usize,
        mut f: impl FnMut(usize, usize) -> Option<f64>,
    ) -> Result<Self, MatchError> {
        check_sides(rows, cols)?;
        let len = rows
            .checked_mul(cols)
            .ok_or(MatchError::Shape { rows, cols, len: 0 })?;
        let mut data = Vec::with_capacity(len);
        for r in 0..rows {
            for c in 0..cols {
                let w = f(r, c).unwrap_or(FORBIDDEN);
                check_weight(r, c, w)?;
                data.push(w);
            }
        }
        Ok(WeightMatrix { rows, cols, data })
    }

    /// A `rows x cols` matrix with every pair forbidden, to be filled with [`Self::set`].
    pub fn all_forbidden(rows: usize, cols: usize) -> Result<Self, MatchError> {
        Self::from_fn(rows, cols, |_, _| None)
    }

    /// Sets one pair's weight (`None` forbids it).
    pub fn set(&mut self, row: usize, col: usize, weight: Option<f64>) -> Result<(), MatchError> {
        if row >= self.rows || col >= self.cols {
            return Err(MatchError::OutOfRange { row, col, rows: self.rows, cols: self.cols });
        }
        let w = weight.unwrap_or(FORBIDDEN);
        check_weight(row, col, w)?;
        self.data[row * self.cols + col] = w;
        Ok(())
    }

    /// The weight of a pair, `None` when forbidden or out of range.
    pub fn get(&self, row: usize, col: usize) -> Option<f64> {
        if row >= self.rows || col >= self.cols {
            return None;
        }
        let w = self.data[row * self.cols + col];
        (w != FORBIDDEN).then_some(w)
    }

    /// Number of rows (online GPUs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (offline jobs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// One row's weights, [`FORBIDDEN`] included.
    pub fn row(&self, row: usize) -> &[f64] {
        &self.data[row * self.cols..(row + 1) * self.cols]
    }

    /// The weights, row-major.
    pub fn as_slice(&self) -> &[f64] {
        &self.data
    }

    /// The transposed matrix (rows become columns).
    pub fn transposed(&self) -> WeightMatrix {
        let mut data = vec![FORBIDDEN; self.data.len()];
        const B: usize = 32;
        for r0 in (0..self.rows).step_by(B) {
            for c0 in (0..self.cols).step_by(B) {
                for r in r0..(r0 + B).min(self.rows) {
                    for c in c0..(c0 + B).min(self.cols) {
                        data[c * self.rows + r] = self.data[r * self.cols + c];
                    }
                }
            }
        }
        WeightMatrix { rows: self.cols, cols: self.rows, data }
    }
}

/// Sparse weights in compressed rows: only the listed pairs are allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseWeights {
    rows: usize,
    cols: usize,
    row_start: Vec<usize>,
    col_idx: Vec<u32>,
    weight: Vec<f64>,
}

impl SparseWeights {
    /// Builds from `(row, col, weight)` triples in any order; unlisted pairs are forbidden.
    /// A `-inf` weight is accepted and means forbidden, like an unlisted pair.
    pub fn from_edges(
        rows: usize,
        cols: usize,
        edges: impl IntoIterator<Item = (usize, usize, f64)>,
    ) -> Result<Self, MatchError> {
        check_sides(rows, cols)?;
        let mut list: Vec<(usize, usize, f64)> = Vec::new();
        for (r, c, w) in edges {
            if r >= rows || c >= cols {
                return Err(MatchError::OutOfRange { row: r, col: c, rows, cols });
            }
            check_weight(r, c, w)?;
            if w != FORBIDDEN {
                list.push((r, c, w));
            }
        }
        list.sort_unstable_by_key(|&(r, c, _)| (r, c));
        if let Some(pair) = list.windows(2).find(|p| p[0].0 == p[1].0 && p[0].1 == p[1].1) {
            return Err(MatchError::DuplicatePair { row: pair[0].0, col: pair[0].1 });
        }
        let mut row_start = vec![0usize; rows + 1];
        for &(r, _, _) in &list {
            row_start[r + 1] += 1;
        }
        for r in 0..rows {
            row_start[r + 1] += row_start[r];
        }
        Ok(SparseWeights {
            rows,
            cols,
            row_start,
            col_idx: list.iter().map(|&(_, c, _)| c as u32).collect(),
            weight: list.iter().map(|&(_, _, w)| w).collect(),
        })
    }

    /// The allowed pairs of a dense matrix.
    pub fn from_dense(w: &WeightMatrix) -> SparseWeights {
        let mut row_start = Vec::with_capacity(w.rows + 1);
        let mut col_idx = Vec::new();
        let mut weight = Vec::new();
        row_start.push(0);
        for r in 0..w.rows {
            for (c, &x) in w.row(r).iter().enumerate() {
                if x != FORBIDDEN {
                    col_idx.push(c as u32);
                    weight.push(x);
                }
            }
            row_start.push(col_idx.len());
        }
        SparseWeights { rows: w.rows, cols: w.cols, row_start, col_idx, weight }
    }

    /// Number of rows (online GPUs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (offline jobs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Number of allowed pairs.
    pub fn nnz(&self) -> usize {
        self.col_idx.len()
    }

    /// One row's allowed columns and their weights (columns ascending).
    pub fn row(&self, row: usize) -> (&[u32], &[f64]) {
        let (a, b) = (self.row_start[row], self.row_start[row + 1]);
        (&self.col_idx[a..b], &self.weight[a..b])
    }

    /// The weight of a pair, `None` when not allowed or out of range.
    pub fn get(&self, row: usize, col: usize) -> Option<f64> {
        if row >= self.rows {
            return None;
        }
        let (cs, ws) = self.row(row);
        cs.binary_search(&u32::try_from(col).ok()?).ok().map(|k| ws[k])
    }

    /// The same pairs restricted to rows and columns that have any, renumbered densely;
    /// with the original index of each kept row and column.
    fn compacted(&self) -> (SparseWeights, Vec<u32>, Vec<u32>) {
        let mut col_ids = self.col_idx.clone();
        col_ids.sort_unstable();
        col_ids.dedup();
        let row_ids: Vec<u32> =
            (0..self.rows).filter(|&r| self.row_start[r + 1] > self.row_start[r]).map(|r| r as u32).collect();
        let mut row_start = Vec::with_capacity(row_ids.len() + 1);
        row_start.push(0);
        let mut col_idx = Vec::with_capacity(self.nnz());
        let mut weight = Vec::with_capacity(self.nnz());
        for &r in &row_ids {
            let (cs, ws) = self.row(r as usize);
            for (&c, &x) in cs.iter().zip(ws) {
                col_idx.push(col_ids.binary_search(&c).expect("column listed") as u32);
                weight.push(x);
            }
            row_start.push(col_idx.len());
        }
        let c = SparseWeights { rows: row_ids.len(), cols: col_ids.len(), row_start, col_idx, weight };
        (c, row_ids, col_ids)
    }

    /// The transposed edge list (rows become columns).
    pub fn transposed(&self) -> SparseWeights {
        let mut row_start = vec![0usize; self.cols + 1];
        for &c in &self.col_idx {
            row_start[c as usize + 1] += 1;
        }
        for c in 0..self.cols {
            row_start[c + 1] += row_start[c];
        }
        let mut fill = row_start.clone();
        let mut col_idx = vec![0u32; self.col_idx.len()];
        let mut weight = vec![0.0; self.col_idx.len()];
        for r in 0..self.rows {
            let (cs, ws) = self.row(r);
            for (&c, &w) in cs.iter().zip(ws) {
                let at = &mut fill[c as usize];
                col_idx[*at] = r as u32;
                weight[*at] = w;
                *at += 1;
            }
        }
        SparseWeights { rows: self.cols, cols: self.rows, row_start, col_idx, weight }
    }
}

/// A matching: which column each row got, and the total weight of the matched pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct Matching {
    row_to_col: Vec<Option<usize>>,
    col_to_row: Vec<Option<usize>>,
    total: f64,
}

impl Matching {
    /// Builds a matching from `row -> col` choices, checking it is one (no column twice).
    /// The total is `total`; callers compute it from their weights.
    fn from_rows(row_to_col: Vec<Option<usize>>, cols: usize, total: f64) -> Matching {
        let mut col_to_row = vec![None; cols];
        for (r, c) in row_to_col.iter().enumerate() {
            if let Some(c) = *c {
                debug_assert!(col_to_row[c].is_none(), "column {c} matched twice");
                col_to_row[c] = Some(r);
            }
        }
        Matching { row_to_col, col_to_row, total }
    }

    /// The column matched to `row`, if any.
    pub fn col_of(&self, row: usize) -> Option<usize> {
        self.row_to_col.get(row).copied().flatten()
    }

    /// The row matched to `col`, if any.
    pub fn row_of(&self, col: usize) -> Option<usize> {
        self.col_to_row.get(col).copied().flatten()
    }

    /// Matched `(row, col)` pairs in row order.
    pub fn pairs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.row_to_col
            .iter()
            .enumerate()
            .filter_map(|(r, c)| c.map(|c| (r, c)))
    }

    /// Number of matched pairs.
    pub fn len(&self) -> usize {
        self.row_to_col.iter().filter(|c| c.is_some()).count()
    }

    /// True when nothing is matched.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sum of the weights of the matched pairs.
    pub fn total_weight(&self) -> f64 {
        self.total
    }

    /// Column per row (`None` = unmatched).
    pub fn row_assignment(&self) -> &[Option<usize>] {
        &self.row_to_col
    }
}

/// Maximum-total-weight matching of a dense matrix; forbidden pairs are never matched.
///
/// Cost: `O(rows * cols)` for the initial auction-like reduction, then one shortest
/// augmenting path (Dijkstra over dense rows) per row it leaves unassigned; in practice
/// well under cubic on random inputs.
pub fn max_weight_matching(w: &WeightMatrix) -> Matching {
    if w.rows == 0 || w.cols == 0 {
        return Matching::from_rows(vec![None; w.rows], w.cols, 0.0);
    }
    let transpose = w.rows > w.cols;
    let tw;
    let m = if transpose {
        tw = w.transposed();
        &tw
    } else {
        w
    };
    let col4row = candidates::solve(m).map(|s| s.0).unwrap_or_else(|| {
        let mut rows = dense::DenseRows::new(m);
        engine::solve(&mut rows).assignment()
    });
    finish(col4row, transpose, w.rows, w.cols, |r, c| w.data[r * w.cols + c])
}

/// Maximum-total-weight matching of a sparse edge list; only listed pairs can be matched.
///
/// Same engine as [`max_weight_matching`], with heap-based Dijkstra over the allowed pairs:
/// the work follows the number of edges explored, not `rows * cols`.
pub fn max_weight_matching_sparse(w: &SparseWeights) -> Matching {
    if w.nnz() == 0 {
        return Matching::from_rows(vec![None; w.rows], w.cols, 0.0);
    }
    // Solve on the rows and columns that have pairs, so memory follows the pairs.
    let (c, row_ids, col_ids) = w.compacted();
    let transpose = c.rows > c.cols;
    let tc;
    let m = if transpose {
        tc = c.transposed();
        &tc
    } else {
        &c
    };
    let mut rows = sparse::SparseRows::new(m);
    let compact = engine::solve(&mut rows).assignment();
    let mut col4row = vec![None; c.rows];
    for (a, b) in compact.iter().enumerate() {
        if let Some(b) = *b {
            let (r, k) = if transpose { (b, a) } else { (a, b) };
            col4row[r] = Some(k);
        }
    }
    let mut full = vec![None; w.rows];
    for (r, k) in col4row.into_iter().enumerate() {
        full[row_ids[r] as usize] = k.map(|k| col_ids[k] as usize);
    }
    finish(full, false, w.rows, w.cols, |r, c| {
        w.get(r, c).expect("solver matched an unlisted pair")
    })
}

/// Maximum-cardinality matching of a dense matrix, and among those one of maximum total
/// weight; forbidden pairs are never matched, and unlike [`max_weight_matching`] pairs of
/// weight `<= 0` are matched when that adds a pair.
///
/// Solved as a maximum-weight matching after adding one constant `M` (larger than any
/// weight gain a matching can make) to every allowed weight, so each extra pair outweighs
/// any weight difference. The shift costs precision: the result is exact up to rounding
/// at the scale of `M`, about `2 * (rows + cols) * max |w|`.
pub fn max_cardinality_matching(w: &WeightMatrix) -> Matching {
    let span = w.data.iter().filter(|x| x.is_finite()).fold(0.0f64, |a, x| a.max(x.abs()));
    let shift = 1.0 + 2.0 * (w.rows + w.cols) as f64 * span;
    let shifted = WeightMatrix {
        rows: w.rows,
        cols: w.cols,
        data: w.data.iter().map(|&x| if x == FORBIDDEN { x } else { x + shift }).collect(),
    };
    let m = max_weight_matching(&shifted);
    let row_to_col = m.row_to_col;
    let total = row_to_col
        .iter()
        .enumerate()
        .filter_map(|(r, c)| c.map(|c| w.data[r * w.cols + c]))
        .sum();
    Matching::from_rows(row_to_col, w.cols, total)
}

/// Turns the engine's row assignment (possibly of the transpose) into a [`Matching`] of the
/// caller's orientation, dropping pairs of weight `<= 0`.
fn finish(
    col4row: Vec<Option<usize>>,
    transposed: bool,
    rows: usize,
    cols: usize,
    weight: impl Fn(usize, usize) -> f64,
) -> Matching {
    let mut row_to_col = vec![None; rows];
    for (a, b) in col4row.iter().enumerate() {
        if let Some(b) = *b {
            let (r, c) = if transposed { (b, a) } else { (a, b) };
            row_to_col[r] = Some(c);
        }
    }
    let mut total = 0.0;
    for (r, slot) in row_to_col.iter_mut().enumerate() {
        if let Some(c) = *slot {
            let x = weight(r, c);
            if x > 0.0 {
                total += x;
            } else {
                *slot = None;
            }
        }
    }
    Matching::from_rows(row_to_col, cols, total)
}

#[cfg(test)]
mod tests;
