//! Sparse rows for the engine: Dijkstra with a binary heap over the allowed pairs only.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::engine::{Rows, Sink, State, DUMMY, FREE};
use super::SparseWeights;

/// A heap entry: tentative distance of a column (min-heap by distance).
#[derive(Clone, Copy)]
struct Entry {
    d: f64,
    j: u32,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> Ordering {
        o.d.total_cmp(&self.d).then(o.j.cmp(&self.j))
    }
}

/// A sparse matrix with the search's scratch space, allocated once per solve. Per-column
/// scratch is invalidated by bumping `epoch` instead of clearing it.
pub(super) struct SparseRows<'a> {
    w: &'a SparseWeights,
    d: Vec<f64>,
    pred: Vec<u32>,
    seen: Vec<u32>,
    done: Vec<u32>,
    epoch: u32,
    ready: Vec<(u32, f64)>,
    heap: BinaryHeap<Entry>,
}

impl<'a> SparseRows<'a> {
    pub(super) fn new(w: &'a SparseWeights) -> Self {
        let m = w.cols();
        SparseRows {
            w,
            d: vec![f64::INFINITY; m],
            pred: vec![0; m],
            seen: vec![0; m],
            done: vec![0; m],
            epoch: 0,
            ready: Vec::new(),
            heap: BinaryHeap::new(),
        }
    }

    /// Cost `c[i][j] = -w[i][j]` of an assigned (hence allowed) pair.
    fn cost(&self, i: usize, j: usize) -> f64 {
        let (cs, ws) = self.w.row(i);
        match cs.binary_search(&(j as u32)) {
            Ok(k) => -ws[k],
            Err(_) => f64::INFINITY,
        }
    }

    /// Relaxes every edge of row `i`, reached at shifted distance `h`.
    fn scan(&mut self, i: usize, h: f64, v: &[f64]) {
        let (cs, ws) = self.w.row(i);
        for (&j, &w) in cs.iter().zip(ws) {
            let ju = j as usize;
            if self.done[ju] == self.epoch {
                continue;
            }
            let nd = h - w - v[ju];
            if self.seen[ju] != self.epoch || nd < self.d[ju] {
                self.seen[ju] = self.epoch;
                self.d[ju] = nd;
                self.pred[ju] = i as u32;
                self.heap.push(Entry { d: nd, j });
            }
        }
    }
}

impl Rows for SparseRows<'_> {
    fn dims(&self) -> (usize, usize) {
        (self.w.rows(), self.w.cols())
    }

    fn two_smallest(&self, i: usize, v: &[f64]) -> (f64, u32, f64, u32) {
        let (mut u1, mut j1, mut u2, mut j2) = (0.0, DUMMY, f64::INFINITY, DUMMY);
        let (cs, ws) = self.w.row(i);
        for (&j, &w) in cs.iter().zip(ws) {
            let h = -w - v[j as usize];
            if h < u2 {
                if h >= u1 {
                    u2 = h;
                    j2 = j;
                } else {
                    u2 = u1;
                    j2 = j1;
                    u1 = h;
                    j1 = j;
                }
            }
        }
        (u1, j1, u2, j2)
    }

    fn shortest_path(&mut self, f: usize, st: &mut State) -> Sink {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.seen.fill(0);
            self.done.fill(0);
            self.epoch = 1;
        }
        self.heap.clear();
        self.ready.clear();
        let (mut dummy_d, mut dummy_row) = (0.0f64, f);
        self.scan(f, 0.0, &st.v);
        let (sink, dist) = loop {
            let top = loop {
                match self.heap.peek() {
                    Some(e) if self.done[e.j as usize] == self.epoch || e.d > self.d[e.j as usize] => {
                        self.heap.pop();
                    }
                    other => break other.copied(),
                }
            };
            let min = top.map_or(f64::INFINITY, |e| e.d);
            if dummy_d <= min {
                break (Sink::Dummy(dummy_row), dummy_d);
            }
            self.heap.pop();
            let j = top.map_or(0, |e| e.j as usize);
            if st.row4col[j] == FREE {
                break (Sink::Column(j), min);
            }
            self.done[j] = self.epoch;
            self.ready.push((j as u32, min));
            let i = st.row4col[j] as usize;
            let h = min - (self.cost(i, j) - st.v[j]);
            if h < dummy_d {
                dummy_d = h;
                dummy_row = i;
            }
            self.scan(i, h, &st.v);
        };
        for &(j, dj) in &self.ready {
            st.v[j as usize] += dj - dist;
        }
        sink
    }

    fn pred(&self, j: usize) -> usize {
        self.pred[j] as usize
    }
}
