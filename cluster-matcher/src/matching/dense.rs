//! Dense rows for the engine: contiguous row-major scans, Dijkstra without a heap.

use super::engine::{Rows, Sink, State, DUMMY, FREE};
use super::WeightMatrix;

/// A dense matrix with the search's scratch space, allocated once per solve.
pub(super) struct DenseRows<'a> {
    w: &'a WeightMatrix,
    d: Vec<f64>,
    pred: Vec<u32>,
    /// Columns made final in the current search: `(column, distance, saved dual)`.
    ready: Vec<(u32, f64, f64)>,
}

impl<'a> DenseRows<'a> {
    pub(super) fn new(w: &'a WeightMatrix) -> Self {
        let m = w.cols();
        DenseRows { w, d: vec![f64::INFINITY; m], pred: vec![0; m], ready: Vec::new() }
    }
}

impl Rows for DenseRows<'_> {
    fn dims(&self) -> (usize, usize) {
        (self.w.rows(), self.w.cols())
    }

    fn two_smallest(&self, i: usize, v: &[f64]) -> (f64, u32, f64, u32) {
        let (mut u1, mut j1, mut u2, mut j2) = (0.0, DUMMY, f64::INFINITY, DUMMY);
        for (j, (&w, &vj)) in self.w.row(i).iter().zip(v).enumerate() {
            let h = -w - vj;
            if h < u2 {
                if h >= u1 {
                    u2 = h;
                    j2 = j as u32;
                } else {
                    u2 = u1;
                    j2 = j1;
                    u1 = h;
                    j1 = j as u32;
                }
            }
        }
        (u1, j1, u2, j2)
    }

    /// Dijkstra over all columns with one contiguous pass per scanned row. A column made
    /// final gets dual `-inf` for the rest of the search, so the pass needs no index list
    /// and no branch to skip it: its tentative cost is `+inf` and never wins.
    fn shortest_path(&mut self, f: usize, st: &mut State) -> Sink {
        self.d.fill(f64::INFINITY);
        self.ready.clear();
        let (mut dummy_d, mut dummy_row) = (0.0f64, f);
        let mut i = f;
        let mut h = 0.0f64;
        let (sink, dist) = loop {
            let row = self.w.row(i);
            let v = &st.v[..row.len()];
            let d = &mut self.d[..row.len()];
            let pred = &mut self.pred[..row.len()];
            let mut min = f64::INFINITY;
            let mut jmin = usize::MAX;
            for j in 0..row.len() {
                let nd = h - row[j] - v[j];
                let old = d[j];
                let dj = if nd < old {
                    pred[j] = i as u32;
                    nd
                } else {
                    old
                };
                d[j] = dj;
                if dj < min {
                    min = dj;
                    jmin = j;
                }
            }
            if dummy_d <= min {
                break (Sink::Dummy(dummy_row), dummy_d);
            }
            let j = jmin;
            if st.row4col[j] == FREE {
                break (Sink::Column(j), min);
            }
            let vj = st.v[j];
            self.ready.push((j as u32, min, vj));
            st.v[j] = f64::NEG_INFINITY;
            self.d[j] = f64::INFINITY;
            i = st.row4col[j] as usize;
            h = min + self.w.row(i)[j] + vj;
            if h < dummy_d {
                dummy_d = h;
                dummy_row = i;
            }
        };
        for &(j, dj, vj) in &self.ready {
            st.v[j as usize] = vj + dj - dist;
        }
        sink
    }

    fn pred(&self, j: usize) -> usize {
        self.pred[j] as usize
    }
}
