//! Adapter from the plan's weight matrix (GPU rows × offline-job columns, `None` = forbidden)
//! to the matching engine.

/// Chosen offline-job columns per GPU row, at most `per_gpu` each.
pub fn assign(weights: &[Vec<Option<f64>>], per_gpu: usize) -> Vec<Vec<usize>> {
    // Interim greedy until the `matching` branch's API is merged.
    let mut edges: Vec<(f64, usize, usize)> = weights
        .iter()
        .enumerate()
        .flat_map(|(r, row)| row.iter().enumerate().filter_map(move |(c, w)| w.map(|w| (w, r, c))))
        .collect();
    edges.sort_by(|a, b| b.0.total_cmp(&a.0));
    let cols = weights.first().map_or(0, Vec::len);
    let mut taken = vec![false; cols];
    let mut out = vec![Vec::new(); weights.len()];
    for (_, r, c) in edges {
        if !taken[c] && out[r].len() < per_gpu {
            taken[c] = true;
            out[r].push(c);
        }
    }
    out
}
