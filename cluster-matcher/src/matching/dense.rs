//! Dense rows for the engine: contiguous row-major scans, Dijkstra without a heap.
//!
//! The two hot loops (a row's two smallest reduced costs; relaxing a row into the
//! distance array and finding the next minimum) run over [`LANES`] independent lanes with
//! branch-free selects, which the compiler turns into SIMD code in safe Rust.

use super::engine::{Rows, Sink, State, DUMMY, FREE};
use super::WeightMatrix;

/// Independent accumulators per hot loop (a multiple of the SIMD width).
const LANES: usize = 8;

/// A dense matrix with the search's scratch space, allocated once per solve.
pub(super) struct DenseRows<'a> {
    w: &'a WeightMatrix,
    d: Vec<f64>,
    /// Path predecessors, written only for the columns of the last augmenting path.
    pred: Vec<u32>,
    /// Rows scanned in the current search, in order, with their shifted distance.
    scanned: Vec<(u32, f64)>,
    /// Columns made final in the current search, in order: `(column, distance, saved dual)`.
    /// The column of `scanned[t]` is `ready[t - 1]`.
    ready: Vec<(u32, f64, f64)>,
}

impl<'a> DenseRows<'a> {
    pub(super) fn new(w: &'a WeightMatrix) -> Self {
        let m = w.cols();
        DenseRows {
            w,
            d: vec![f64::INFINITY; m],
            pred: vec![0; m],
            scanned: Vec::new(),
            ready: Vec::new(),
        }
    }

    /// Index `t` into `scanned[..=last]` of the row giving column `j` (dual `vj`) its
    /// smallest distance: the same expression as the relaxation, so the same minimum.
    fn best_pred(&self, j: usize, vj: f64, last: usize) -> usize {
        let mut best = f64::INFINITY;
        let mut at = 0;
        for (t, &(r, h)) in self.scanned[..=last].iter().enumerate() {
            let x = h - self.w.row(r as usize)[j] - vj;
            if x < best {
                best = x;
                at = t;
            }
        }
        at
    }
}

/// Columns per block of [`relax_and_min`]: the minimum is tracked per block so that
/// finding its index rereads one block, not the whole row.
const BLOCK: usize = 512;

/// `d[j] = min(d[j], h - row[j] - v[j])` for all `j`; returns the new minimum of `d` and
/// its first index (`usize::MAX` when every entry is `+inf`).
fn relax_and_min(h: f64, row: &[f64], v: &[f64], d: &mut [f64]) -> (f64, usize) {
    let n = row.len();
    let (mut best, mut best_block) = (f64::INFINITY, 0);
    for (b, ((rb, vb), db)) in
        row.chunks(BLOCK).zip(v[..n].chunks(BLOCK)).zip(d[..n].chunks_mut(BLOCK)).enumerate()
    {
        let m = relax_block(h, rb, vb, db);
        if m < best {
            best = m;
            best_block = b;
        }
    }
    if best == f64::INFINITY {
        return (best, usize::MAX);
    }
    let start = best_block * BLOCK;
    let end = (start + BLOCK).min(n);
    let at = d[start..end].iter().position(|&x| x == best).map_or(usize::MAX, |k| start + k);
    (best, at)
}

/// One block of [`relax_and_min`]: a branch-free relaxation keeping per-lane minima
/// (vectorized as packed `min`); returns the block's minimum.
#[inline(never)]
fn relax_block(h: f64, row: &[f64], v: &[f64], d: &mut [f64]) -> f64 {
    let n = row.len();
    let v = &v[..n];
    let d = &mut d[..n];
    let mut lmin = [f64::INFINITY; LANES];
    let body = n - n % LANES;
    for ((r, vv), dd) in row[..body]
        .chunks_exact(LANES)
        .zip(v[..body].chunks_exact(LANES))
        .zip(d[..body].chunks_exact_mut(LANES))
    {
        let r: &[f64; LANES] = r.try_into().expect("exact chunk");
        let vv: &[f64; LANES] = vv.try_into().expect("exact chunk");
        let dd: &mut [f64; LANES] = dd.try_into().expect("exact chunk");
        for k in 0..LANES {
            let nd = h - r[k] - vv[k];
            let x = if nd < dd[k] { nd } else { dd[k] };
            dd[k] = x;
            lmin[k] = if x < lmin[k] { x } else { lmin[k] };
        }
    }
    let mut min = lmin.iter().fold(f64::INFINITY, |a, &x| if x < a { x } else { a });
    for j in body..n {
        let nd = h - row[j] - v[j];
        let x = if nd < d[j] { nd } else { d[j] };
        d[j] = x;
        min = if x < min { x } else { min };
    }
    min
}

/// Smallest `-row[j] - v[j]` over the row (`+inf` for an empty or all-forbidden row).
#[inline(never)]
pub(super) fn row_min(row: &[f64], v: &[f64]) -> f64 {
    let n = row.len();
    let v = &v[..n];
    let mut m = [f64::INFINITY; LANES];
    let body = n - n % LANES;
    for (r, vv) in row[..body].chunks_exact(LANES).zip(v[..body].chunks_exact(LANES)) {
        let r: &[f64; LANES] = r.try_into().expect("exact chunk");
        let vv: &[f64; LANES] = vv.try_into().expect("exact chunk");
        for k in 0..LANES {
            let h = -r[k] - vv[k];
            m[k] = if h < m[k] { h } else { m[k] };
        }
    }
    let mut min = m.iter().fold(f64::INFINITY, |a, &x| if x < a { x } else { a });
    for j in body..n {
        let h = -row[j] - v[j];
        min = if h < min { h } else { min };
    }
    min
}

/// Smallest and second smallest of `-row[j] - v[j]`, with the first index of the smallest.
#[inline(never)]
fn two_smallest_real(row: &[f64], v: &[f64]) -> (f64, usize, f64) {
    let n = row.len();
    let v = &v[..n];
    let mut m1 = [f64::INFINITY; LANES];
    let mut m2 = [f64::INFINITY; LANES];
    let body = n - n % LANES;
    for (r, vv) in row[..body].chunks_exact(LANES).zip(v[..body].chunks_exact(LANES)) {
        let r: &[f64; LANES] = r.try_into().expect("exact chunk");
        let vv: &[f64; LANES] = vv.try_into().expect("exact chunk");
        for k in 0..LANES {
            let h = -r[k] - vv[k];
            let hi = if h > m1[k] { h } else { m1[k] };
            m2[k] = if hi < m2[k] { hi } else { m2[k] };
            m1[k] = if h < m1[k] { h } else { m1[k] };
        }
    }
    let (mut a, mut b) = (f64::INFINITY, f64::INFINITY);
    let mut push = |h: f64, h2: f64| {
        let hi = if h > a { h } else { a };
        b = b.min(hi).min(h2);
        a = a.min(h);
    };
    for k in 0..LANES {
        push(m1[k], m2[k]);
    }
    for j in body..n {
        push(-row[j] - v[j], f64::INFINITY);
    }
    let ia = if a == f64::INFINITY {
        usize::MAX
    } else {
        row.iter().zip(v).position(|(&w, &vj)| -w - vj == a).unwrap_or(usize::MAX)
    };
    (a, ia, b)
}

impl Rows for DenseRows<'_> {
    fn dims(&self) -> (usize, usize) {
        (self.w.rows(), self.w.cols())
    }

    fn two_smallest(&self, i: usize, v: &[f64]) -> (f64, u32, f64, u32) {
        let row = self.w.row(i);
        let (a, ia, b) = two_smallest_real(row, v);
        // Merge the dummy (reduced cost 0); ties go to the dummy first.
        if a >= 0.0 {
            let j2 = if a.is_finite() { ia as u32 } else { DUMMY };
            return (0.0, DUMMY, a, j2);
        }
        if b >= 0.0 {
            return (a, ia as u32, 0.0, DUMMY);
        }
        // Second smallest is real: find its index (needed only on ties, but cheap).
        let j2 = row
            .iter()
            .zip(v)
            .enumerate()
            .position(|(j, (&w, &vj))| j != ia && -w - vj == b)
            .unwrap_or(ia);
        (a, ia as u32, b, j2 as u32)
    }

    /// Dijkstra over all columns with one contiguous pass per scanned row. A column made
    /// final gets dual `-inf` for the rest of the search, so the pass needs no index list
    /// and no branch to skip it: its tentative distance is `+inf` and never wins.
    /// Predecessors are not stored during the passes; the few on the final path are
    /// recomputed from the scanned rows.
    fn shortest_path(&mut self, f: usize, st: &mut State) -> Sink {
        self.d.fill(f64::INFINITY);
        self.ready.clear();
        self.scanned.clear();
        let (mut dummy_d, mut dummy_t) = (0.0f64, 0usize);
        let mut i = f;
        let mut h = 0.0f64;
        let (sink, dist) = loop {
            self.scanned.push((i as u32, h));
            let (min, j) = relax_and_min(h, self.w.row(i), &st.v, &mut self.d);
            if dummy_d <= min {
                break (None, dummy_d);
            }
            if st.row4col[j] == FREE {
                break (Some(j), min);
            }
            let vj = st.v[j];
            self.ready.push((j as u32, min, vj));
            st.v[j] = f64::NEG_INFINITY;
            self.d[j] = f64::INFINITY;
            i = st.row4col[j] as usize;
            h = min + self.w.row(i)[j] + vj;
            if h < dummy_d {
                dummy_d = h;
                dummy_t = self.scanned.len();
            }
        };
        // Record the path's predecessors before the duals change.
        let (result, mut t) = match sink {
            Some(j) => {
                let t = self.best_pred(j, st.v[j], self.scanned.len() - 1);
                self.pred[j] = self.scanned[t].0;
                (Sink::Column(j), t)
            }
            None => (Sink::Dummy(self.scanned[dummy_t].0 as usize), dummy_t),
        };
        while t > 0 {
            let (j, _, vj) = self.ready[t - 1];
            let p = self.best_pred(j as usize, vj, t - 1);
            self.pred[j as usize] = self.scanned[p].0;
            t = p;
        }
        for &(j, dj, vj) in &self.ready {
            st.v[j as usize] = vj + dj - dist;
        }
        result
    }

    fn pred(&self, j: usize) -> usize {
        self.pred[j] as usize
    }
}
