//! Our matching against `scipy.optimize.linear_sum_assignment` on mid-size inputs: equal
//! total weight. Needs the Python from `XSHARE_PYTHON` or `<repo>/.venv` (see
//! `scripts/setup-test-env.sh`); fails with the reason when it is missing.

#[path = "../benches/matching_common.rs"]
mod common;

use cluster_matcher::matching::{
    max_weight_matching, max_weight_matching_sparse, SparseWeights, WeightMatrix, FORBIDDEN,
};
use common::*;

fn scipy_total(label: &str, w: &WeightMatrix) -> f64 {
    run_scipy(w, 1, true).unwrap_or_else(|e| panic!("{label}: cannot run scipy: {e}")).total
}

fn assert_same_total(label: &str, ours: f64, w: &WeightMatrix) {
    let theirs = scipy_total(label, w);
    let rel = (ours - theirs).abs() / ours.abs().max(theirs.abs()).max(1e-12);
    assert!(rel <= 1e-9, "{label}: ours {ours} scipy {theirs}");
}

/// Mixed-sign weights with a fraction of pairs forbidden.
fn mixed(rows: usize, cols: usize, forbid: f64, seed: u64) -> WeightMatrix {
    let mut g = Rng::new(seed);
    WeightMatrix::from_fn(rows, cols, |_, _| {
        let f = g.f64();
        let x = g.f64() * 10.0 - 2.0;
        (f >= forbid).then_some(x)
    })
    .unwrap()
}

#[test]
fn dense_equals_scipy_with_forbidden_pairs_and_negative_weights() {
    for (r, c, seed) in [(300, 500, 1), (500, 300, 2)] {
        let w = mixed(r, c, 0.3, seed);
        let m = max_weight_matching(&w);
        for (a, b) in m.pairs() {
            assert!(w.get(a, b).is_some(), "forbidden pair ({a},{b}) matched");
        }
        assert_same_total(&format!("mixed {r}x{c}"), m.total_weight(), &w);
    }
}

#[test]
fn dense_equals_scipy_on_structured_and_uniform() {
    let w = structured(400, 600, 7);
    assert_same_total("structured 400x600", max_weight_matching(&w).total_weight(), &w);
    let w = uniform(700, 700, 8);
    assert_same_total("uniform 700x700", max_weight_matching(&w).total_weight(), &w);
}

#[test]
fn sparse_equals_scipy() {
    let s = sparse(400, 900, 4, 9);
    let m = max_weight_matching_sparse(&s);
    assert_same_total("sparse 400x900 degree 4", m.total_weight(), &densify(&s));
    let d: SparseWeights = s.transposed();
    let m = max_weight_matching_sparse(&d);
    assert_same_total("sparse 900x400 degree 4", m.total_weight(), &densify(&d));
}

#[test]
fn scipy_runner_respects_forbidden_pairs() {
    // Guards the comparison itself: were -inf read as an ordinary number or the matrix
    // transposed, scipy's total would not be 7.
    let w = WeightMatrix::new(2, 3, vec![1.0, FORBIDDEN, 5.0, FORBIDDEN, 2.0, FORBIDDEN]).unwrap();
    assert_eq!(scipy_total("guard", &w), 7.0);
    assert_eq!(max_weight_matching(&w).total_weight(), 7.0);
}
