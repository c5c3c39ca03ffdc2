//! Unit and property tests of the matching solvers against exhaustive search.

use super::reference::{brute_force_max_cardinality, brute_force_total};
use super::*;
use proptest::prelude::*;

/// Checks that `m` is a matching of `w` using only allowed, positive pairs, with the
/// reported total equal to the sum of its pairs.
fn assert_valid(w: &WeightMatrix, m: &Matching) {
    let mut used = vec![false; w.cols()];
    let mut sum = 0.0;
    for (r, c) in m.pairs() {
        let x = w.get(r, c).unwrap_or_else(|| panic!("forbidden pair ({r},{c}) matched"));
        assert!(x > 0.0, "pair ({r},{c}) of weight {x} reported");
        assert!(!used[c], "column {c} matched twice");
        used[c] = true;
        assert_eq!(m.row_of(c), Some(r));
        sum += x;
    }
    assert!((sum - m.total_weight()).abs() <= 1e-9 * (1.0 + sum.abs()));
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// Small matrices: sizes 0..=7 both ways, integer weights in -3..=6 (many ties and
/// negatives), about a quarter of pairs forbidden.
fn small_matrix() -> impl Strategy<Value = WeightMatrix> {
    (0usize..=7, 0usize..=7).prop_flat_map(|(r, c)| {
        proptest::collection::vec((0u8..4, -3i32..=6), r * c).prop_map(move |cells| {
            let data = cells
                .into_iter()
                .map(|(f, x)| if f == 0 { FORBIDDEN } else { x as f64 })
                .collect();
            WeightMatrix::new(r, c, data).unwrap()
        })
    })
}

/// Like [`small_matrix`] with real-valued weights of mixed sign.
fn small_real_matrix() -> impl Strategy<Value = WeightMatrix> {
    (0usize..=7, 0usize..=7).prop_flat_map(|(r, c)| {
        proptest::collection::vec((0u8..5, -50.0f64..100.0), r * c).prop_map(move |cells| {
            let data = cells
                .into_iter()
                .map(|(f, x)| if f == 0 { FORBIDDEN } else { x })
                .collect();
            WeightMatrix::new(r, c, data).unwrap()
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn dense_is_optimal_on_small_integer_inputs(w in small_matrix()) {
        let m = max_weight_matching(&w);
        assert_valid(&w, &m);
        let best = brute_force_total(&w).unwrap();
        prop_assert!(close(m.total_weight(), best), "got {} want {}", m.total_weight(), best);
    }

    #[test]
    fn dense_is_optimal_on_small_real_inputs(w in small_real_matrix()) {
        let m = max_weight_matching(&w);
        assert_valid(&w, &m);
        let best = brute_force_total(&w).unwrap();
        prop_assert!(close(m.total_weight(), best), "got {} want {}", m.total_weight(), best);
    }

    #[test]
    fn max_cardinality_is_lexicographically_optimal(w in small_real_matrix()) {
        let m = max_cardinality_matching(&w);
        let (k, best) = brute_force_max_cardinality(&w).unwrap();
        let mut used = vec![false; w.cols()];
        let mut sum = 0.0;
        for (r, c) in m.pairs() {
            prop_assert!(!used[c]);
            used[c] = true;
            sum += w.get(r, c).expect("forbidden pair matched");
        }
        prop_assert_eq!(m.len(), k);
        prop_assert!((sum - m.total_weight()).abs() < 1e-9);
        prop_assert!((m.total_weight() - best).abs() <= 1e-9 * (1.0 + best.abs()),
            "got {} want {}", m.total_weight(), best);
    }

    #[test]
    fn sparse_is_optimal_on_small_inputs(w in small_matrix()) {
        let s = SparseWeights::from_dense(&w);
        let m = max_weight_matching_sparse(&s);
        assert_valid(&w, &m);
        let best = brute_force_total(&w).unwrap();
        prop_assert!(close(m.total_weight(), best), "got {} want {}", m.total_weight(), best);
    }
}

/// A fixed-seed generator for the mid-size tests below (xorshift, no dependency).
fn rng(seed: u64) -> impl FnMut() -> f64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[test]
fn sparse_equals_dense_on_mid_size_inputs() {
    for (seed, (r, c, p)) in [(60, 80, 0.1), (80, 60, 0.05), (100, 100, 0.5), (40, 200, 0.02)]
        .into_iter()
        .enumerate()
    {
        let mut g = rng(seed as u64 + 1);
        let w = WeightMatrix::from_fn(r, c, |_, _| (g() < p).then(|| g() * 10.0 - 1.0)).unwrap();
        let d = max_weight_matching(&w);
        let s = max_weight_matching_sparse(&SparseWeights::from_dense(&w));
        assert_valid(&w, &d);
        assert_valid(&w, &s);
        assert!(close(d.total_weight(), s.total_weight()), "{r}x{c}: {} vs {}", d.total_weight(), s.total_weight());
    }
}

#[test]
fn forbidden_pair_is_never_matched_even_when_it_would_pay() {
    let w = WeightMatrix::new(2, 2, vec![FORBIDDEN, 1.0, 1.0, 1.0]).unwrap();
    let m = max_weight_matching(&w);
    assert_eq!(m.col_of(0), Some(1));
    assert_eq!(m.col_of(1), Some(0));
    let w = WeightMatrix::new(1, 1, vec![FORBIDDEN]).unwrap();
    assert!(max_weight_matching(&w).is_empty());
}

#[test]
fn max_weight_leaves_rows_unmatched_when_it_pays() {
    // Matching both rows (1 + 1) loses to the single heavy pair (10).
    let w = WeightMatrix::new(2, 2, vec![10.0, 1.0, 1.0, FORBIDDEN]).unwrap();
    let m = max_weight_matching(&w);
    assert_eq!(m.total_weight(), 10.0);
    assert_eq!(m.len(), 1);
    let w = WeightMatrix::new(2, 3, vec![-1.0, -2.0, 0.0, 5.0, -1.0, -1.0]).unwrap();
    let m = max_weight_matching(&w);
    assert_eq!(m.pairs().collect::<Vec<_>>(), vec![(1, 0)]);
}

#[test]
fn empty_and_degenerate_shapes() {
    for (r, c) in [(0, 0), (0, 5), (5, 0)] {
        let w = WeightMatrix::new(r, c, vec![]).unwrap();
        let m = max_weight_matching(&w);
        assert!(m.is_empty());
        assert_eq!(m.total_weight(), 0.0);
        assert!(max_weight_matching_sparse(&SparseWeights::from_dense(&w)).is_empty());
    }
    let w = WeightMatrix::all_forbidden(30, 40).unwrap();
    assert!(max_weight_matching(&w).is_empty());
    // Hostile shapes: as many rows or columns as accepted, nothing to match.
    let w = WeightMatrix::new(MAX_SIDE, 0, vec![]).unwrap();
    assert!(max_weight_matching(&w).is_empty());
    let s = SparseWeights::from_edges(3, MAX_SIDE, [(1, MAX_SIDE - 1, 2.0), (2, 7, 1.0)]).unwrap();
    let m = max_weight_matching_sparse(&s);
    assert_eq!(m.pairs().collect::<Vec<_>>(), vec![(1, MAX_SIDE - 1), (2, 7)]);
    let m = max_weight_matching_sparse(&s.transposed());
    assert_eq!(m.pairs().collect::<Vec<_>>(), vec![(7, 2), (MAX_SIDE - 1, 1)]);
    assert!(matches!(SparseWeights::from_edges(MAX_SIDE + 1, 1, []), Err(MatchError::TooBig { .. })));
}

#[test]
fn hostile_weights_are_refused_with_their_position() {
    let e = WeightMatrix::new(2, 2, vec![1.0, 2.0, f64::NAN, 0.0]).unwrap_err();
    assert_eq!(e, MatchError::NaN { row: 1, col: 0 });
    assert!(e.to_string().contains("row 1, col 0"));
    let e = WeightMatrix::new(1, 2, vec![1.0, f64::INFINITY]).unwrap_err();
    assert_eq!(e, MatchError::PositiveInfinity { row: 0, col: 1 });
    let e = WeightMatrix::new(1, 1, vec![-1e200]).unwrap_err();
    assert!(matches!(e, MatchError::TooLarge { row: 0, col: 0, .. }));
    let e = WeightMatrix::new(2, 3, vec![0.0; 5]).unwrap_err();
    assert_eq!(e, MatchError::Shape { rows: 2, cols: 3, len: 5 });
    let e = WeightMatrix::new(usize::MAX, 2, vec![]).unwrap_err();
    assert!(matches!(e, MatchError::TooBig { .. }));
    let mut w = WeightMatrix::all_forbidden(2, 2).unwrap();
    assert!(matches!(w.set(2, 0, Some(1.0)), Err(MatchError::OutOfRange { .. })));
    assert!(matches!(w.set(0, 0, Some(f64::NAN)), Err(MatchError::NaN { .. })));
    assert_eq!(w.get(0, 0), None);
    let e = SparseWeights::from_edges(2, 2, [(0, 1, 1.0), (1, 0, 2.0), (0, 1, 3.0)]).unwrap_err();
    assert_eq!(e, MatchError::DuplicatePair { row: 0, col: 1 });
    let e = SparseWeights::from_edges(2, 2, [(0, 2, 1.0)]).unwrap_err();
    assert!(matches!(e, MatchError::OutOfRange { row: 0, col: 2, .. }));
    let e = SparseWeights::from_edges(2, 2, [(0, 1, f64::NAN)]).unwrap_err();
    assert_eq!(e, MatchError::NaN { row: 0, col: 1 });
}

#[test]
fn extreme_but_accepted_magnitudes_solve_exactly() {
    let big = MAX_ABS_WEIGHT;
    let w = WeightMatrix::new(3, 3, vec![big, big, 1.0, big, -big, 2.0, 1e-300, 3.0, big]).unwrap();
    let m = max_weight_matching(&w);
    assert_valid(&w, &m);
    assert_eq!(m.total_weight(), 3.0 * big);
    let s = max_weight_matching_sparse(&SparseWeights::from_dense(&w));
    assert_eq!(s.total_weight(), 3.0 * big);
}

#[test]
fn all_equal_weights_terminate_with_a_full_matching() {
    let w = WeightMatrix::new(200, 300, vec![1.0; 200 * 300]).unwrap();
    let m = max_weight_matching(&w);
    assert_eq!(m.len(), 200);
    let w = WeightMatrix::new(300, 200, vec![1.0; 200 * 300]).unwrap();
    assert_eq!(max_weight_matching(&w).len(), 200);
}

/// Matrices where the candidate graph needs extra rounds: few distinct column "types"
/// with near-equal weights (every row wants the same columns), plus forbidden pairs.
fn contested(rows: usize, cols: usize, seed: u64) -> WeightMatrix {
    let mut g = rng(seed);
    let types: Vec<f64> = (0..5).map(|_| g()).collect();
    let col_type: Vec<usize> = (0..cols).map(|_| (g() * 5.0) as usize % 5).collect();
    let row_load: Vec<f64> = (0..rows).map(|_| g()).collect();
    WeightMatrix::from_fn(rows, cols, |r, c| {
        (g() > 0.1).then(|| types[col_type[c]] * (1.0 - row_load[r] * 0.5) + 1e-3 * g() - 0.05)
    })
    .unwrap()
}

/// One row in four strongly prefers the same twentieth of the columns: those rows' first
/// candidates are all hot and too few, so some of them need later rounds.
fn hot_columns(rows: usize, cols: usize, seed: u64) -> WeightMatrix {
    let mut g = rng(seed);
    WeightMatrix::from_fn(rows, cols, |r, c| {
        (g() > 0.05).then(|| if r % 4 == 0 && c % 20 == 0 { 5.0 + g() } else { g() })
    })
    .unwrap()
}

#[test]
fn candidate_graph_path_equals_plain_dense_solver() {
    let (mut took_candidates, mut multi_round) = (0, 0);
    for seed in 0..24u64 {
        let (r, c) = [(64, 64), (100, 300), (300, 100), (200, 200)][seed as usize % 4];
        let w = if seed % 3 == 0 { contested(r, c, seed) } else if seed % 3 == 1 { hot_columns(r, c, seed) } else {
            let mut g = rng(seed + 100);
            WeightMatrix::from_fn(r, c, |_, _| (g() > 0.2).then(|| g() * 4.0 - 1.0)).unwrap()
        };
        let (t, tw);
        let m = if w.rows() > w.cols() { tw = w.transposed(); &tw } else { &w };
        let plain = engine::solve(&mut dense::DenseRows::new(m)).assignment();
        let total = |a: &[Option<usize>]| -> f64 {
            a.iter().enumerate().filter_map(|(i, j)| j.map(|j| m.get(i, j).unwrap().max(0.0))).sum()
        };
        if let Some((via, rounds)) = candidates::solve(m) {
            took_candidates += 1;
            multi_round += usize::from(rounds > 1);
            assert!(close(total(&via), total(&plain)), "seed {seed}: {} vs {}", total(&via), total(&plain));
        }
        t = max_weight_matching(&w);
        assert_valid(&w, &t);
        assert!(close(t.total_weight(), total(&plain)), "seed {seed}");
    }
    assert!(took_candidates >= 12, "candidate path taken only {took_candidates} times");
    assert!(multi_round >= 3, "only {multi_round} inputs needed a second candidate round");
}
