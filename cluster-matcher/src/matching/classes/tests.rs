//! The class solver against the pairwise exact solver and brute force.

use super::*;
use crate::matching::multi::max_weight_k_matching_additive;
use crate::matching::reference::{brute_force_groups, brute_force_total};
use crate::matching::FORBIDDEN;
use proptest::prelude::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// A matrix built from few row types and few column types: every row is a copy of one of
/// `rt` type rows, every column a copy of one of `ct` type columns; integer weights (exact
/// ties), negatives and forbidden pairs; any shape.
#[derive(Debug, Clone)]
struct Typed {
    rows: usize,
    cols: usize,
    row_type: Vec<usize>,
    col_type: Vec<usize>,
    table: Vec<f64>,
    ct: usize,
}

impl Typed {
    fn matrix(&self) -> WeightMatrix {
        WeightMatrix::from_fn(self.rows, self.cols, |r, c| {
            let x = self.table[self.row_type[r] * self.ct + self.col_type[c]];
            (x != FORBIDDEN).then_some(x)
        })
        .unwrap()
    }

    /// The class problem of the types directly (types may coincide: still exact).
    fn problem(&self, rt: usize, k: u64) -> ClassProblem {
        let mut row_size = vec![0u64; rt];
        for &t in &self.row_type {
            row_size[t] += k;
        }
        let mut col_size = vec![0u64; self.ct];
        for &t in &self.col_type {
            col_size[t] += 1;
        }
        ClassProblem {
            row_size,
            col_size,
            weight: self.table.clone(),
        }
    }
}

fn typed(max_side: usize) -> impl Strategy<Value = (Typed, usize)> {
    (1usize..=4, 1usize..=4, 0usize..=max_side, 0usize..=max_side).prop_flat_map(
        |(rt, ct, rows, cols)| {
            (
                proptest::collection::vec(0..rt, rows),
                proptest::collection::vec(0..ct, cols),
                proptest::collection::vec((0u8..4, -2i32..=5), rt * ct),
            )
                .prop_map(move |(row_type, col_type, cells)| {
                    let table = cells
                        .into_iter()
                        .map(|(f, x)| if f == 0 { FORBIDDEN } else { x as f64 })
                        .collect();
                    (
                        Typed {
                            rows,
                            cols,
                            row_type,
                            col_type,
                            table,
                            ct,
                        },
                        rt,
                    )
                })
        },
    )
}

/// Checks a class flow: sizes respected, only positive pairs, total = sum.
fn assert_flow_valid(p: &ClassProblem, s: &ClassSolution) {
    let c = p.col_size.len();
    let mut ru = vec![0u64; p.row_size.len()];
    let mut cu = vec![0u64; c];
    let mut sum = 0.0;
    for &(g, j, f) in &s.flow {
        let w = p.weight[g as usize * c + j as usize];
        assert!(w > 0.0, "flow on pair ({g},{j}) of weight {w}");
        ru[g as usize] += f;
        cu[j as usize] += f;
        sum += f as f64 * w;
    }
    assert!(
        ru.iter().zip(&p.row_size).all(|(u, s)| u <= s),
        "row sizes exceeded"
    );
    assert!(
        cu.iter().zip(&p.col_size).all(|(u, s)| u <= s),
        "column sizes exceeded"
    );
    assert!(close(sum, s.total));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Tiny typed matrices: the auto solver, the class solver, the pairwise solver and
    /// brute force agree (ties, negatives, forbidden pairs, rectangular, empty).
    #[test]
    fn class_total_equals_pairwise_and_brute_force((t, rt) in typed(7)) {
        let w = t.matrix();
        let pair = max_weight_matching(&w).total_weight();
        let brute = brute_force_total(&w).unwrap();
        prop_assert!(close(pair, brute), "pairwise {} brute {}", pair, brute);
        let s = solve_classes(&t.problem(rt, 1), None);
        assert_flow_valid(&t.problem(rt, 1), &s);
        prop_assert!(close(s.total, brute), "classes {} brute {}", s.total, brute);
        // Detected classes, expanded back to pairs.
        let auto = max_weight_matching_auto(&w);
        prop_assert!(close(auto.total_weight(), brute));
        let cl = matrix_classes(&w);
        let mut weight = Vec::new();
        for g in &cl.row_members {
            for j in &cl.col_members {
                weight.push(w.row(g[0] as usize)[j[0] as usize]);
            }
        }
        let p = ClassProblem {
            row_size: cl.row_members.iter().map(|m| m.len() as u64).collect(),
            col_size: cl.col_members.iter().map(|m| m.len() as u64).collect(),
            weight,
        };
        let s = solve_classes(&p, None);
        let groups = expand(&s.flow, &cl.row_members, &cl.col_members, w.rows(), w.cols(), 1, |_| None);
        let mut used = vec![false; w.cols()];
        let mut sum = 0.0;
        for (r, g) in groups.iter().enumerate() {
            prop_assert!(g.len() <= 1);
            for &c in g {
                prop_assert!(!used[c as usize]);
                used[c as usize] = true;
                let x = w.get(r, c as usize).expect("expanded pair allowed");
                prop_assert!(x > 0.0);
                sum += x;
            }
        }
        prop_assert!(close(sum, brute));
    }

    /// Up to `k` columns per row: the class solver with row sizes `k * count` equals the
    /// exact replicated pairwise solver and brute force over groups.
    #[test]
    fn class_k_per_row_equals_replicated_pairwise((t, rt) in typed(5), k in 1usize..=3) {
        let w = t.matrix();
        let s = solve_classes(&t.problem(rt, k as u64), None);
        let rep = max_weight_k_matching_additive(&w, k).total;
        prop_assert!(close(s.total, rep), "classes {} replicated {}", s.total, rep);
        if t.rows <= 3 && t.cols <= 6 {
            let f = |g: usize, set: &[usize]| set.iter().map(|&j| w.get(g, j)).sum::<Option<f64>>();
            let brute = brute_force_groups(t.rows, t.cols, k, f).unwrap();
            prop_assert!(close(s.total, brute), "classes {} brute {}", s.total, brute);
        }
    }

    /// Larger typed matrices (no brute force): class and pairwise totals agree.
    #[test]
    fn class_total_equals_pairwise_on_larger_inputs((t, rt) in typed(60)) {
        let w = t.matrix();
        let s = solve_classes(&t.problem(rt, 1), None);
        prop_assert!(close(s.total, max_weight_matching(&w).total_weight()));
        prop_assert!(close(max_weight_matching_auto(&w).total_weight(), s.total));
    }

    /// A warm start from any earlier flow (sizes changed, classes dropped) ends at the
    /// same optimum as a cold solve, and is certified without paths when nothing changed.
    #[test]
    fn warm_start_reaches_the_cold_optimum(
        (t, rt) in typed(30),
        grow in proptest::collection::vec(0u64..4, 8),
        shrink in proptest::collection::vec(0u64..4, 8),
    ) {
        let p1 = t.problem(rt, 1);
        let s1 = solve_classes(&p1, None);
        let again = solve_classes(&p1, Some(&WarmStart { flow: s1.flow.clone() }));
        prop_assert_eq!(again.start, Start::WarmOptimal);
        prop_assert!(close(again.total, s1.total));
        let mut p2 = p1.clone();
        for (k, s) in p2.row_size.iter_mut().enumerate() {
            *s = (*s + grow[k % 8]).saturating_sub(shrink[(k + 3) % 8]);
        }
        for (k, s) in p2.col_size.iter_mut().enumerate() {
            *s = (*s + grow[(k + 5) % 8]).saturating_sub(shrink[k % 8]);
        }
        let cold = solve_classes(&p2, None);
        let warm = solve_classes(&p2, Some(&WarmStart { flow: s1.flow.clone() }));
        assert_flow_valid(&p2, &warm);
        prop_assert!(close(cold.total, warm.total), "cold {} warm {} ({:?})", cold.total, warm.total, warm.start);
    }
}

/// Expansion keeps a preferred pair when its class pair has flow, and never places a
/// column twice or a row over its capacity.
#[test]
fn expand_places_preferred_pairs_first() {
    // Two rows of one class, three columns of one class, flow 2 with one column per row.
    let rows_of = vec![vec![0u32, 1]];
    let cols_of = vec![vec![0u32, 1, 2]];
    let out = expand(&[(0, 0, 2)], &rows_of, &cols_of, 2, 3, 1, |c| {
        (c == 2).then_some(1)
    });
    assert_eq!(out[1], vec![2], "column 2 prefers row 1");
    assert_eq!(out[0], vec![0]);
    // Without the preference the first free column goes to the first row.
    let out = expand(&[(0, 0, 2)], &rows_of, &cols_of, 2, 3, 1, |_| None);
    assert_eq!(out, vec![vec![0], vec![1]]);
}

#[test]
fn matrix_classes_groups_identical_rows_and_columns_only() {
    let w = WeightMatrix::new(
        3,
        3,
        vec![1.0, 2.0, 1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0 + 1e-15],
    )
    .unwrap();
    let cl = matrix_classes(&w);
    assert_eq!(
        cl.row_class,
        vec![0, 0, 1],
        "a 1e-15 difference is another class"
    );
    assert_eq!(cl.col_class, vec![0, 1, 2]);
    let w = WeightMatrix::new(2, 3, vec![1.0, 2.0, 1.0, 3.0, FORBIDDEN, 3.0]).unwrap();
    let cl = matrix_classes(&w);
    assert_eq!(cl.col_class, vec![0, 1, 0]);
}

#[test]
fn prefer_classes_rule() {
    assert!(prefer_classes(3, 26, 2000, 2000));
    assert!(!prefer_classes(2000, 2000, 2000, 2000));
    // The plan_round bench's realistic rounds: 1,000 GPUs (202 x 326 classes) and 3,000
    // (272 x 363) went pairwise with a factor of 1 (0.98 s and 21 s); classes now.
    assert!(prefer_classes(202, 326, 1000, 3000));
    assert!(prefer_classes(272, 363, 3000, 9000));
    // Unstructured inputs (every GPU and job its own class) stay pairwise.
    assert!(!prefer_classes(300, 900, 300, 900));
    assert!(!prefer_classes(1, 1, 0, 0) || prefer_classes(0, 0, 0, 0));
}
