//! The solver shared by the dense and sparse entry points: Jonker-Volgenant augmenting row
//! reduction, then one shortest augmenting path per row still free.
//!
//! Internally the problem is a rectangular min-cost assignment with cost `c = -w` and one
//! private "stay unmatched" column of cost 0 per row (the *dummy*, never stored). Every row
//! ends on a real column or on its dummy; a row on its dummy can never be reached again by
//! an alternating path (its dummy has no other row), so it is settled for good. Invariants
//! kept between steps (LP duals `v` of the real columns, `u` implicit):
//! - `v[j] <= 0`, and `v[j] == 0` for every column still free;
//! - an assigned row's reduced cost `c[i][j] - v[j]` is the minimum over its row, the
//!   dummy's reduced cost `0` included.
//!
//! They make the final assignment optimal (complementary slackness).

/// Marks a row or column that is not assigned.
pub(super) const FREE: u32 = u32::MAX;
/// Marks a row assigned to its own dummy column (left unmatched on purpose).
pub(super) const DUMMY: u32 = u32::MAX - 1;

/// Assignment and column duals.
pub(super) struct State {
    pub v: Vec<f64>,
    pub col4row: Vec<u32>,
    pub row4col: Vec<u32>,
}

/// What a row representation offers the engine.
pub(super) trait Rows {
    /// `(rows, cols)`. Any shape works; `rows <= cols` is faster (fewer searches).
    fn dims(&self) -> (usize, usize);
    /// Smallest and second smallest reduced cost `c[i][j] - v[j]` over row `i`, the dummy
    /// (reduced cost 0, index [`DUMMY`]) included: `(u1, j1, u2, j2)`.
    fn two_smallest(&self, i: usize, v: &[f64]) -> (f64, u32, f64, u32);
    /// Finds a shortest augmenting path from free row `f`, updates the duals of the columns
    /// it made final, and returns the sink: a free column, or the row that moves to its
    /// dummy. `pred()` then holds the path.
    fn shortest_path(&mut self, f: usize, st: &mut State) -> Sink;
    /// Row from which column `j` was reached in the last search.
    fn pred(&self, j: usize) -> usize;
}

/// End of an augmenting path.
pub(super) enum Sink {
    /// A free real column.
    Column(usize),
    /// Row `r` gives up its column (if any) and stays unmatched.
    Dummy(usize),
}

/// Solves the assignment; returns the final assignment and column duals.
pub(super) fn solve<R: Rows>(rows: &mut R) -> State {
    let (n, m) = rows.dims();
    let mut st = State { v: vec![0.0; m], col4row: vec![FREE; n], row4col: vec![FREE; m] };
    let mut free: Vec<u32> = (0..n as u32).collect();
    for _ in 0..2 {
        augmenting_row_reduction(rows, &mut st, &mut free);
    }
    tracing::trace!(rows = n, cols = m, left = free.len(), "augmenting row reduction done");
    for &f in &free {
        let f = f as usize;
        let sink = rows.shortest_path(f, &mut st);
        apply_path(rows, &mut st, f, sink);
    }
    st
}

impl State {
    /// Column per row (`None` = unmatched).
    pub(super) fn assignment(&self) -> Vec<Option<usize>> {
        self.col4row
            .iter()
            .map(|&j| if j == FREE || j == DUMMY { None } else { Some(j as usize) })
            .collect()
    }

    /// The row dual `u[i] = min(0, min_j c[i][j] - v[j])`, read off the assignment: the
    /// reduced cost of the assigned column, or 0 for a row left unmatched.
    pub(super) fn row_dual(&self, i: usize, cost: impl Fn(usize) -> f64) -> f64 {
        match self.col4row[i] {
            FREE | DUMMY => 0.0,
            j => cost(j as usize) - self.v[j as usize],
        }
    }
}

/// One pass of Jonker-Volgenant augmenting row reduction over the free rows: each takes its
/// cheapest column, lowering that column's dual so it becomes indifferent with the second
/// cheapest, and displaces the previous holder. Rows still free remain in `free`.
///
/// The displaced row is retried at once only while a budget lasts: in floating point a
/// sequence of tiny price cuts could otherwise run for very long.
fn augmenting_row_reduction<R: Rows>(rows: &R, st: &mut State, free: &mut Vec<u32>) {
    let (n, m) = rows.dims();
    let prv = free.len();
    let mut budget = 2 * (n + m);
    let mut k = 0;
    let mut kept = 0;
    while k < prv {
        let i = free[k] as usize;
        k += 1;
        let (u1, j1, u2, j2) = rows.two_smallest(i, &st.v);
        if j1 == DUMMY {
            st.col4row[i] = DUMMY;
            continue;
        }
        let mut j = j1 as usize;
        let mut i0 = st.row4col[j];
        if u1 < u2 {
            st.v[j] -= u2 - u1;
        } else if i0 != FREE {
            if j2 == DUMMY {
                st.col4row[i] = DUMMY;
                continue;
            }
            j = j2 as usize;
            i0 = st.row4col[j];
        }
        st.col4row[i] = j as u32;
        st.row4col[j] = i as u32;
        if i0 != FREE {
            st.col4row[i0 as usize] = FREE;
            if u1 < u2 && budget > 0 {
                budget -= 1;
                k -= 1;
                free[k] = i0;
            } else {
                free[kept] = i0;
                kept += 1;
            }
        }
    }
    free.truncate(kept);
}

/// Flips the alternating path ending at `sink` so that row `f` becomes assigned.
fn apply_path<R: Rows>(rows: &R, st: &mut State, f: usize, sink: Sink) {
    let (mut i, mut j) = match sink {
        Sink::Column(j) => (rows.pred(j), j),
        Sink::Dummy(r) => {
            let old = st.col4row[r];
            st.col4row[r] = DUMMY;
            if r == f {
                return;
            }
            let j = old as usize;
            (rows.pred(j), j)
        }
    };
    loop {
        st.row4col[j] = i as u32;
        let old = st.col4row[i];
        st.col4row[i] = j as u32;
        if i == f {
            return;
        }
        j = old as usize;
        i = rows.pred(j);
    }
}
