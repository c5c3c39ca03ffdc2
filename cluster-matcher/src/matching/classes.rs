//! Exact matching on classes: when many rows are interchangeable (identical weight rows)
//! and many columns are too, a maximum-weight matching is a *transportation problem* on
//! the classes, with supplies = class sizes.
//!
//! Why it is exact: any matching of the pairwise problem adds up, class pair by class pair,
//! to an integer flow `x[r][c]` with row sums `<=` the row class's size (times the per-row
//! capacity `k`) and column sums `<=` the column class's size, of the same total weight; and
//! any such integer flow expands back to a matching of the same total, since every member
//! of a class has the same weights. The transportation problem is totally unimodular, so
//! its optimum over integers is its LP optimum.
//!
//! Solver: successive shortest paths (min-cost flow, cost `-w`, pairs of weight `<= 0` and
//! forbidden pairs absent) from all unsaturated row classes at once, Dijkstra on reduced
//! costs with node potentials, each path pushed by its bottleneck; it stops when the
//! cheapest path no longer gains (so rows may stay unmatched: maximum weight, not maximum
//! cardinality). Work per path is `O(R * C * log)` on `R x C` classes.
//!
//! Warm start ([`WarmStart`]): the last solution's flow, restricted to classes still present
//! and clipped to the new sizes, is kept when a Bellman-Ford search over the residual
//! circulation finds no negative cycle (the certificate that it is optimal); a few
//! negative cycles are cancelled; otherwise the solve starts cold. The answer is exact
//! either way, only the work differs.
//!
//! [`max_weight_matching_auto`] detects classes in a dense matrix and picks the class
//! solver or the pairwise one by a stated rule ([`prefer_classes`]).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::{max_weight_matching, Matching, WeightMatrix};

/// A transportation problem: row classes of sizes `row_size`, column classes of sizes
/// `col_size`, weights per class pair (row-major; [`super::FORBIDDEN`] or any weight
/// `<= 0` = never used).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassProblem {
    /// Members in each row class (supply of each row node).
    pub row_size: Vec<u64>,
    /// Members in each column class (capacity of each column node).
    pub col_size: Vec<u64>,
    /// Weight of one unit between row class `r` and column class `c`, at `r * col_size.len() + c`.
    pub weight: Vec<f64>,
}

/// The optimum: units per class pair, its total, and the duals (potentials) reached.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassSolution {
    /// `(row class, column class, units)` with `units > 0`.
    pub flow: Vec<(u32, u32, u64)>,
    /// Sum of `units * weight` over `flow`.
    pub total: f64,
    /// Node potentials at the end (reduced costs `-w + p_row - p_col >= 0`).
    pub row_potential: Vec<f64>,
    /// Potentials of the column classes (same convention as `row_potential`).
    pub col_potential: Vec<f64>,
    /// Shortest paths pushed.
    pub paths: usize,
    /// How the solve started.
    pub start: Start,
}

/// How a solve started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// From no flow.
    Cold,
    /// The previous flow (clipped) was certified optimal as it stood.
    WarmOptimal,
    /// The previous flow (clipped), improved by cancelling this many negative cycles.
    WarmCancelled(usize),
}

/// The previous round's flow, in the new problem's class indices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WarmStart {
    /// `(row class, column class, units)` from the previous round; clipped to the new sizes.
    pub flow: Vec<(u32, u32, u64)>,
}

/// Negative cycles cancelled at most before a warm start gives up and solves cold.
const MAX_CANCELS: usize = 64;

#[derive(PartialEq)]
struct Item(f64, u32);
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

struct Net<'a> {
    r: usize,
    c: usize,
    w: &'a [f64],
    x: Vec<u64>,
    row_used: Vec<u64>,
    col_used: Vec<u64>,
    /// Per column class, the row classes with flow on that pair (unordered).
    col_rows: Vec<Vec<u32>>,
}

impl Net<'_> {
    fn allowed(&self, g: usize, j: usize) -> bool {
        self.w[g * self.c + j] > 0.0
    }

    fn push(&mut self, g: usize, j: usize, d: i64) {
        let k = g * self.c + j;
        let before = self.x[k];
        self.x[k] = (before as i64 + d) as u64;
        self.row_used[g] = (self.row_used[g] as i64 + d) as u64;
        self.col_used[j] = (self.col_used[j] as i64 + d) as u64;
        if before == 0 && self.x[k] > 0 {
            self.col_rows[j].push(g as u32);
        } else if before > 0 && self.x[k] == 0 {
            self.col_rows[j].retain(|&r| r as usize != g);
        }
    }
}

/// Solves `p` exactly (see the module notes); `warm` seeds it with a previous flow.
///
/// # Panics
/// When the sizes do not match `row_size.len() * col_size.len()` weights.
pub fn solve_classes(p: &ClassProblem, warm: Option<&WarmStart>) -> ClassSolution {
    let (r, c) = (p.row_size.len(), p.col_size.len());
    assert_eq!(p.weight.len(), r * c, "class weights must be rows x cols");
    let mut net = Net {
        r,
        c,
        w: &p.weight,
        x: vec![0; r * c],
        row_used: vec![0; r],
        col_used: vec![0; c],
        col_rows: vec![Vec::new(); c],
    };
    let scale = p
        .weight
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |a, w| a.max(w.abs()));
    let eps = 1e-12 * scale.max(1e-300);
    let mut start = Start::Cold;
    if let Some(ws) = warm {
        for &(g, j, f) in &ws.flow {
            let (g, j) = (g as usize, j as usize);
            if g < r && j < c && net.allowed(g, j) {
                let f = f
                    .min(p.row_size[g] - net.row_used[g])
                    .min(p.col_size[j] - net.col_used[j]);
                if f > 0 {
                    net.push(g, j, f as i64);
                }
            }
        }
        let mut cancels = 0;
        loop {
            match negative_cycle(&net, p, eps) {
                None => {
                    start = if cancels == 0 {
                        Start::WarmOptimal
                    } else {
                        Start::WarmCancelled(cancels)
                    };
                    break;
                }
                Some(_) if cancels >= MAX_CANCELS => {
                    net.x.iter_mut().for_each(|x| *x = 0);
                    net.row_used.iter_mut().for_each(|x| *x = 0);
                    net.col_used.iter_mut().for_each(|x| *x = 0);
                    net.col_rows.iter_mut().for_each(Vec::clear);
                    break;
                }
                Some(cycle) => {
                    cancel(&mut net, p, &cycle);
                    cancels += 1;
                }
            }
        }
    }
    // Potentials: with the flow at hand optimal for its value, any feasible potentials
    // work; a Bellman-Ford pass gives them (cold: the closed form below).
    let (mut pr, mut pc) = if start == Start::Cold {
        let pr = vec![0.0; r];
        let pc: Vec<f64> = (0..c)
            .map(|j| {
                (0..r)
                    .filter(|&g| net.allowed(g, j))
                    .map(|g| -p.weight[g * c + j])
                    .fold(0.0, f64::min)
            })
            .collect();
        (pr, pc)
    } else {
        feasible_potentials(&net)
    };
    let mut paths = 0;
    // A warm flow without negative cycles in the residual circulation is optimal.
    if start == Start::Cold {
        paths = augment_all(&mut net, p, &mut pr, &mut pc, eps);
    }
    let mut flow = Vec::new();
    let mut total = 0.0;
    for g in 0..r {
        for j in 0..c {
            let f = net.x[g * c + j];
            if f > 0 {
                flow.push((g as u32, j as u32, f));
                total += f as f64 * p.weight[g * c + j];
            }
        }
    }
    ClassSolution {
        flow,
        total,
        row_potential: pr,
        col_potential: pc,
        paths,
        start,
    }
}

/// Successive shortest paths until no path gains; returns how many were pushed.
fn augment_all(net: &mut Net, p: &ClassProblem, pr: &mut [f64], pc: &mut [f64], eps: f64) -> usize {
    let (r, c) = (net.r, net.c);
    let mut dr = vec![f64::INFINITY; r];
    let mut dc = vec![f64::INFINITY; c];
    let mut done_r = vec![false; r];
    let mut done_c = vec![false; c];
    // pred_c[j] = row that reached column j; pred_r[g] = column that reached row g
    // (through a backward arc), u32::MAX = a source.
    let mut pred_c = vec![u32::MAX; c];
    let mut pred_r = vec![u32::MAX; r];
    let mut heap = BinaryHeap::new();
    let mut paths = 0;
    loop {
        dr.iter_mut().for_each(|d| *d = f64::INFINITY);
        dc.iter_mut().for_each(|d| *d = f64::INFINITY);
        done_r.iter_mut().for_each(|d| *d = false);
        done_c.iter_mut().for_each(|d| *d = false);
        heap.clear();
        for g in 0..r {
            if net.row_used[g] < p.row_size[g] {
                dr[g] = -pr[g];
                pred_r[g] = u32::MAX;
                heap.push(Item(dr[g], g as u32));
            }
        }
        if heap.is_empty() {
            break;
        }
        // Nodes: rows 0..r, columns r..r+c.
        let mut dmax = f64::NEG_INFINITY;
        while let Some(Item(d, v)) = heap.pop() {
            let v = v as usize;
            if v < r {
                if done_r[v] || d > dr[v] {
                    continue;
                }
                done_r[v] = true;
                dmax = dmax.max(d);
                let row = &p.weight[v * c..(v + 1) * c];
                for (j, &w) in row.iter().enumerate() {
                    if w > 0.0 && !done_c[j] {
                        let nd = d + (-w + pr[v] - pc[j]).max(0.0);
                        if nd < dc[j] {
                            dc[j] = nd;
                            pred_c[j] = v as u32;
                            heap.push(Item(nd, (r + j) as u32));
                        }
                    }
                }
            } else {
                let j = v - r;
                if done_c[j] || d > dc[j] {
                    continue;
                }
                done_c[j] = true;
                dmax = dmax.max(d);
                for &g in &net.col_rows[j] {
                    let g = g as usize;
                    if !done_r[g] {
                        let nd = d + (p.weight[g * c + j] + pc[j] - pr[g]).max(0.0);
                        if nd < dr[g] {
                            dr[g] = nd;
                            pred_r[g] = j as u32;
                            heap.push(Item(nd, g as u32));
                        }
                    }
                }
            }
        }
        // Cheapest true path cost to an unsaturated column.
        let mut best: Option<(f64, usize)> = None;
        for j in 0..c {
            if done_c[j] && net.col_used[j] < p.col_size[j] {
                let t = dc[j] + pc[j];
                if best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, j));
                }
            }
        }
        // New potentials keep every residual reduced cost >= 0.
        for g in 0..r {
            pr[g] += if done_r[g] { dr[g] } else { dmax };
        }
        for j in 0..c {
            pc[j] += if done_c[j] { dc[j] } else { dmax };
        }
        let Some((cost, sink)) = best else { break };
        if cost >= -eps {
            break;
        }
        // Bottleneck along the path.
        let mut delta = p.col_size[sink] - net.col_used[sink];
        let mut j = sink;
        loop {
            let g = pred_c[j] as usize;
            match pred_r[g] {
                u32::MAX => {
                    delta = delta.min(p.row_size[g] - net.row_used[g]);
                    break;
                }
                j2 => {
                    delta = delta.min(net.x[g * c + j2 as usize]);
                    j = j2 as usize;
                }
            }
        }
        let mut j = sink;
        loop {
            let g = pred_c[j] as usize;
            net.push(g, j, delta as i64);
            match pred_r[g] {
                u32::MAX => break,
                j2 => {
                    net.push(g, j2 as usize, -(delta as i64));
                    j = j2 as usize;
                }
            }
        }
        paths += 1;
        // More shortest paths of the same length: every arc of reduced cost ~0 is on one,
        // and every column at distance `cost` ends one (primal-dual phase).
        let tol = 16.0 * eps;
        let sink_ok: Vec<bool> = (0..c).map(|j| done_c[j] && pc[j] <= cost + tol).collect();
        paths += phase(net, p, pr, pc, &sink_ok, tol);
    }
    paths
}

/// Pushes flow along paths of reduced cost ~0 (within `tol` per arc) from unsaturated row
/// classes to unsaturated columns marked in `sink_ok`, depth-first with dead-end marks.
/// Paths it misses are found by the next Dijkstra; returns the paths pushed.
fn phase(
    net: &mut Net,
    p: &ClassProblem,
    pr: &[f64],
    pc: &[f64],
    sink_ok: &[bool],
    tol: f64,
) -> usize {
    let (r, c) = (net.r, net.c);
    let mut dead_r = vec![false; r];
    let mut dead_c = vec![false; c];
    let mut on_r = vec![false; r];
    let mut on_c = vec![false; c];
    let mut ptr_r = vec![0usize; r];
    let mut paths = 0;
    // Stack entries: (node, next index); rows are `0..r`, columns `r..r+c`.
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for g0 in 0..r {
        while net.row_used[g0] < p.row_size[g0] && !dead_r[g0] {
            stack.clear();
            stack.push((g0, 0));
            on_r[g0] = true;
            let mut sink = None;
            while let Some(&(v, k)) = stack.last() {
                if v < r {
                    let g = v;
                    let row = &p.weight[g * c..(g + 1) * c];
                    let mut next = None;
                    while ptr_r[g] < c {
                        let j = ptr_r[g];
                        let w = row[j];
                        if w > 0.0 && !dead_c[j] && !on_c[j] && -w + pr[g] - pc[j] <= tol {
                            next = Some(j);
                            break;
                        }
                        ptr_r[g] += 1;
                    }
                    match next {
                        None => {
                            dead_r[g] = true;
                            on_r[g] = false;
                            stack.pop();
                        }
                        Some(j) if sink_ok[j] && net.col_used[j] < p.col_size[j] => {
                            sink = Some(j);
                            break;
                        }
                        Some(j) => {
                            on_c[j] = true;
                            stack.push((r + j, 0));
                        }
                    }
                } else {
                    let j = v - r;
                    let list = &net.col_rows[j];
                    let mut next = None;
                    let mut idx = k;
                    while idx < list.len() {
                        let g = list[idx] as usize;
                        idx += 1;
                        if !dead_r[g] && !on_r[g] && p.weight[g * c + j] + pc[j] - pr[g] <= tol {
                            next = Some(g);
                            break;
                        }
                    }
                    stack.last_mut().expect("column on the stack").1 = idx;
                    match next {
                        None => {
                            dead_c[j] = true;
                            on_c[j] = false;
                            stack.pop();
                            if let Some(&(g, _)) = stack.last() {
                                ptr_r[g] += 1;
                            }
                        }
                        Some(g) => {
                            on_r[g] = true;
                            stack.push((g, 0));
                        }
                    }
                }
            }
            let Some(sink) = sink else { break };
            // The stack alternates row, column, row, ..., row; the sink column ends it.
            let mut delta = p.col_size[sink] - net.col_used[sink];
            delta = delta.min(p.row_size[g0] - net.row_used[g0]);
            for pair in stack.windows(2).skip(1).step_by(2) {
                let (j, g) = (pair[0].0 - r, pair[1].0);
                delta = delta.min(net.x[g * c + j]);
            }
            let last = stack.last().expect("row on the stack").0;
            net.push(last, sink, delta as i64);
            for k in (1..stack.len()).step_by(2) {
                let (g_prev, j, g) = (stack[k - 1].0, stack[k].0 - r, stack[k + 1].0);
                net.push(g_prev, j, delta as i64);
                net.push(g, j, -(delta as i64));
            }
            for &(v, _) in &stack {
                if v < r {
                    on_r[v] = false;
                } else {
                    on_c[v - r] = false;
                }
            }
            paths += 1;
        }
        on_r[g0] = false;
    }
    paths
}

/// Nodes of the residual circulation: rows `0..r`, columns `r..r+c`, source `r+c`, sink
/// `r+c+1`. Arcs: row->col `-w` (always), col->row `+w` (flow > 0), source->row (room
/// left), row->source (flow), col->sink (room left), sink->col (flow), sink->source
/// (always: more flow), source->sink (flow > 0: less flow); all but the pair arcs cost 0.
fn for_arcs(net: &Net, p: &ClassProblem, mut each: impl FnMut(usize, usize, f64)) {
    let (r, c) = (net.r, net.c);
    let (s, t) = (r + c, r + c + 1);
    for g in 0..r {
        for j in 0..c {
            let w = p.weight[g * c + j];
            if w > 0.0 {
                each(g, r + j, -w);
                if net.x[g * c + j] > 0 {
                    each(r + j, g, w);
                }
            }
        }
        if net.row_used[g] < p.row_size[g] {
            each(s, g, 0.0);
        }
        if net.row_used[g] > 0 {
            each(g, s, 0.0);
        }
    }
    for j in 0..c {
        if net.col_used[j] < p.col_size[j] {
            each(r + j, t, 0.0);
        }
        if net.col_used[j] > 0 {
            each(t, r + j, 0.0);
        }
    }
    each(t, s, 0.0);
    if net.row_used.iter().any(|&u| u > 0) {
        each(s, t, 0.0);
    }
}

/// Bellman-Ford from every node at distance 0: a negative cycle of the residual
/// circulation (cost below `-eps`) as its node list, or `None` (the flow is optimal).
fn negative_cycle(net: &Net, p: &ClassProblem, eps: f64) -> Option<Vec<usize>> {
    let n = net.r + net.c + 2;
    let mut d = vec![0.0f64; n];
    let mut pred = vec![usize::MAX; n];
    for _ in 0..n {
        let mut changed = None;
        for_arcs(net, p, |a, b, w| {
            if d[a] + w < d[b] - eps {
                d[b] = d[a] + w;
                pred[b] = a;
                changed = Some(b);
            }
        });
        let mut v = changed?;
        // A relaxation chain longer than n nodes holds a cycle; look for it now.
        for _ in 0..n {
            v = pred[v];
            if v == usize::MAX {
                break;
            }
        }
        if v != usize::MAX {
            let mut cycle = vec![v];
            let mut u = pred[v];
            while u != v && u != usize::MAX && cycle.len() <= n {
                cycle.push(u);
                u = pred[u];
            }
            if u == v {
                cycle.reverse();
                let cost: f64 = cycle_cost(net, p, &cycle);
                if cost < -eps {
                    return Some(cycle);
                }
            }
        }
    }
    // Still relaxing after n passes: a negative cycle lies on some predecessor chain.
    (0..n).find_map(|start| {
        let mut v = start;
        for _ in 0..n {
            v = pred[v];
            if v == usize::MAX {
                return None;
            }
        }
        let mut cycle = vec![v];
        let mut u = pred[v];
        while u != v && cycle.len() <= n {
            cycle.push(u);
            u = pred[u];
        }
        cycle.reverse();
        (u == v && cycle_cost(net, p, &cycle) < -eps).then_some(cycle)
    })
}

/// Cost of a cycle given as nodes in arc order (last back to first).
fn cycle_cost(net: &Net, p: &ClassProblem, cycle: &[usize]) -> f64 {
    let (r, c) = (net.r, net.c);
    (0..cycle.len())
        .map(|k| {
            let (a, b) = (cycle[k], cycle[(k + 1) % cycle.len()]);
            if a < r && b >= r && b < r + c {
                -p.weight[a * c + (b - r)]
            } else if a >= r && a < r + c && b < r {
                p.weight[b * c + (a - r)]
            } else {
                0.0
            }
        })
        .sum()
}

/// Pushes the bottleneck around a negative cycle.
fn cancel(net: &mut Net, p: &ClassProblem, cycle: &[usize]) {
    let (r, c) = (net.r, net.c);
    let (s, t) = (r + c, r + c + 1);
    let total: u64 = net.row_used.iter().sum();
    let mut delta = u64::MAX;
    for k in 0..cycle.len() {
        let (a, b) = (cycle[k], cycle[(k + 1) % cycle.len()]);
        let room = if a < r && b >= r && b < s {
            u64::MAX
        } else if a >= r && a < s && b < r {
            net.x[b * c + (a - r)]
        } else if a == s && b < r {
            p.row_size[b] - net.row_used[b]
        } else if a < r && b == s {
            net.row_used[a]
        } else if a >= r && a < s && b == t {
            p.col_size[a - r] - net.col_used[a - r]
        } else if a == t && b >= r && b < s {
            net.col_used[b - r]
        } else if a == s && b == t {
            total
        } else {
            u64::MAX
        };
        delta = delta.min(room);
    }
    debug_assert!(delta > 0 && delta < u64::MAX);
    for k in 0..cycle.len() {
        let (a, b) = (cycle[k], cycle[(k + 1) % cycle.len()]);
        if a < r && b >= r && b < s {
            net.push(a, b - r, delta as i64);
        } else if a >= r && a < s && b < r {
            net.push(b, a - r, -(delta as i64));
        }
    }
}

/// Potentials with every residual pair arc of reduced cost `>= 0`, for a flow without
/// negative cycles (Bellman-Ford over the pair arcs only).
fn feasible_potentials(net: &Net) -> (Vec<f64>, Vec<f64>) {
    let (r, c) = (net.r, net.c);
    let mut d = vec![0.0f64; r + c];
    for _ in 0..(r + c) {
        let mut changed = false;
        for g in 0..r {
            for j in 0..c {
                let w = net.w[g * c + j];
                if w > 0.0 {
                    if d[g] - w < d[r + j] {
                        d[r + j] = d[g] - w;
                        changed = true;
                    }
                    if net.x[g * c + j] > 0 && d[r + j] + w < d[g] {
                        d[g] = d[r + j] + w;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    (d[..r].to_vec(), d[r..].to_vec())
}

/// Classes of a dense matrix: rows with bitwise-identical weights share a class, and so do
/// columns. Returns (class of each row, class of each column, members per class).
pub struct MatrixClasses {
    /// Class index of each row.
    pub row_class: Vec<u32>,
    /// Class index of each column.
    pub col_class: Vec<u32>,
    /// Row indices in each row class, ascending.
    pub row_members: Vec<Vec<u32>>,
    /// Column indices in each column class, ascending.
    pub col_members: Vec<Vec<u32>>,
}

fn mix(h: u64, x: u64) -> u64 {
    (h ^ x)
        .wrapping_mul(0x100_0000_01b3)
        .rotate_left(29)
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
}

/// Finds identical rows and identical columns of `w` (one pass to hash, one to confirm).
pub fn matrix_classes(w: &WeightMatrix) -> MatrixClasses {
    let (n, m) = (w.rows(), w.cols());
    let data = w.as_slice();
    // Rows: hash, then confirm against the class representative.
    let mut row_class = vec![0u32; n];
    let mut row_members: Vec<Vec<u32>> = Vec::new();
    let mut by_hash: HashMap<u64, Vec<u32>> = HashMap::new();
    for r in 0..n {
        let row = &data[r * m..(r + 1) * m];
        let h = row
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, x| mix(h, x.to_bits()));
        let list = by_hash.entry(h).or_default();
        let found = list.iter().copied().find(|&k| {
            let rep = row_members[k as usize][0] as usize;
            data[rep * m..(rep + 1) * m]
                .iter()
                .zip(row)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        });
        let k = found.unwrap_or_else(|| {
            row_members.push(Vec::new());
            list.push((row_members.len() - 1) as u32);
            (row_members.len() - 1) as u32
        });
        row_class[r] = k;
        row_members[k as usize].push(r as u32);
    }
    // Columns: per-column hashes accumulated over row classes' representatives only
    // (identical rows add nothing), then confirmed the same way.
    let reps: Vec<usize> = row_members.iter().map(|v| v[0] as usize).collect();
    let mut ch = vec![0xcbf2_9ce4_8422_2325u64; m];
    for &r in &reps {
        for (h, x) in ch.iter_mut().zip(&data[r * m..(r + 1) * m]) {
            *h = mix(*h, x.to_bits());
        }
    }
    let mut col_class = vec![0u32; m];
    let mut col_members: Vec<Vec<u32>> = Vec::new();
    let mut by_hash: HashMap<u64, Vec<u32>> = HashMap::new();
    for c in 0..m {
        let list = by_hash.entry(ch[c]).or_default();
        let found = list.iter().copied().find(|&k| {
            let rep = col_members[k as usize][0] as usize;
            reps.iter()
                .all(|&r| data[r * m + rep].to_bits() == data[r * m + c].to_bits())
        });
        let k = found.unwrap_or_else(|| {
            col_members.push(Vec::new());
            list.push((col_members.len() - 1) as u32);
            (col_members.len() - 1) as u32
        });
        col_class[c] = k;
        col_members[k as usize].push(c as u32);
    }
    MatrixClasses {
        row_class,
        col_class,
        row_members,
        col_members,
    }
}

/// The rule for choosing the class solver over the pairwise one: classes pay when the
/// class problem is far smaller than the pairwise one. The class solver's work is about
/// `(R + C)` shortest paths of `R * C` each; the pairwise solver's at least `rows * cols`.
/// A unit of class work is far cheaper than a unit of pairwise work (release build, plan_round
/// bench: 311 x 416 classes, 94 M units, solved in 0.135 s; pairwise 1,000 x 3,000, 3 M
/// units, 0.85 s: about 200x per unit), so classes are chosen when
/// `R * C * (R + C) <= CLASS_WORK_FACTOR * rows * cols`, a conservative 16.
pub fn prefer_classes(row_classes: usize, col_classes: usize, rows: usize, cols: usize) -> bool {
    let class_work =
        (row_classes as u128) * (col_classes as u128) * (row_classes + col_classes) as u128;
    class_work <= CLASS_WORK_FACTOR * (rows as u128) * (cols as u128)
}

/// How many units of class work one unit of pairwise work is taken to be worth (see
/// [`prefer_classes`]; measured ~200, kept low so unstructured inputs stay pairwise).
pub const CLASS_WORK_FACTOR: u128 = 16;

/// Expands a class flow to pairs: `rows_of[g]` lists class `g`'s members (each taking up to
/// `per_row` columns), `cols_of[j]` class `j`'s. A column whose `prefer(col)` row lies in a
/// class pair with flow left is placed there first (e.g. a job kept where it runs).
/// Returns columns per row. Work: `O(rows + cols + flow entries)`.
pub fn expand(
    flow: &[(u32, u32, u64)],
    rows_of: &[Vec<u32>],
    cols_of: &[Vec<u32>],
    rows: usize,
    cols: usize,
    per_row: usize,
    prefer: impl Fn(u32) -> Option<u32>,
) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); rows];
    let mut col_done = vec![false; cols];
    let mut row_class = vec![u32::MAX; rows];
    for (g, m) in rows_of.iter().enumerate() {
        for &x in m {
            row_class[x as usize] = g as u32;
        }
    }
    let mut left: HashMap<(u32, u32), u64> = flow.iter().map(|&(g, j, f)| ((g, j), f)).collect();
    for (j, members) in cols_of.iter().enumerate() {
        for &col in members {
            let Some(row) = prefer(col) else { continue };
            let ru = row as usize;
            if ru >= rows || out[ru].len() >= per_row {
                continue;
            }
            if let Some(f) = left.get_mut(&(row_class[ru], j as u32)) {
                if *f > 0 {
                    *f -= 1;
                    out[ru].push(col);
                    col_done[col as usize] = true;
                }
            }
        }
    }
    let mut row_cursor = vec![0usize; rows_of.len()];
    let mut col_cursor = vec![0usize; cols_of.len()];
    for &(g, j, _) in flow {
        let mut n = left[&(g, j)];
        let members = &rows_of[g as usize];
        let cm = &cols_of[j as usize];
        while n > 0 {
            let rc = &mut row_cursor[g as usize];
            while out[members[*rc] as usize].len() >= per_row {
                *rc += 1;
            }
            let row = members[*rc] as usize;
            let cc = &mut col_cursor[j as usize];
            while col_done[cm[*cc] as usize] {
                *cc += 1;
            }
            let col = cm[*cc];
            out[row].push(col);
            col_done[col as usize] = true;
            n -= 1;
        }
    }
    out
}

/// Maximum-weight matching of a dense matrix that solves on classes of identical rows and
/// columns when [`prefer_classes`] says so, else with [`max_weight_matching`]. Same result
/// (total) as [`max_weight_matching`].
pub fn max_weight_matching_auto(w: &WeightMatrix) -> Matching {
    let cl = matrix_classes(w);
    let (r, c) = (cl.row_members.len(), cl.col_members.len());
    if !prefer_classes(r, c, w.rows(), w.cols()) {
        return max_weight_matching(w);
    }
    let mut weight = Vec::with_capacity(r * c);
    for g in 0..r {
        let row = w.row(cl.row_members[g][0] as usize);
        for j in 0..c {
            weight.push(row[cl.col_members[j][0] as usize]);
        }
    }
    let p = ClassProblem {
        row_size: cl.row_members.iter().map(|m| m.len() as u64).collect(),
        col_size: cl.col_members.iter().map(|m| m.len() as u64).collect(),
        weight,
    };
    let sol = solve_classes(&p, None);
    let groups = expand(
        &sol.flow,
        &cl.row_members,
        &cl.col_members,
        w.rows(),
        w.cols(),
        1,
        |_| None,
    );
    let row_to_col: Vec<Option<usize>> = groups
        .iter()
        .map(|g| g.first().map(|&c| c as usize))
        .collect();
    let total = row_to_col
        .iter()
        .enumerate()
        .filter_map(|(r, c)| c.map(|c| w.as_slice()[r * w.cols() + c]))
        .sum();
    debug_assert!(row_to_col
        .iter()
        .enumerate()
        .all(|(r, c)| c.is_none_or(|c| w.get(r, c).is_some_and(|x| x > 0.0))));
    Matching::from_rows(row_to_col, w.cols(), total)
}

#[cfg(test)]
mod tests;
