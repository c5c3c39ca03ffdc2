//! Offline allocation policies beyond the planner's maximum-throughput matching. So far:
//! Dominant Resource Fairness (Ghodsi et al.; the lecture's DRF section) by progressive
//! filling over any resources, e.g. (SM share, GPU memory) across tenants. Not yet wired into
//! the planner's rounds (that needs a policy hook in `cluster-matcher`'s `plan`).

/// DRF by progressive filling: `capacity[r]` of each resource, `demand[u][r]` per task of
/// user `u`; repeatedly launches one task of the user with the lowest dominant share whose
/// next task still fits (ties: lowest index), until no user's next task fits. Returns the
/// number of tasks per user.
pub fn drf(capacity: &[f64], demand: &[Vec<f64>]) -> Vec<u32> {
    let mut tasks = vec![0u32; demand.len()];
    let mut used = vec![0.0; capacity.len()];
    let dominant = |u: usize, n: u32| {
        demand[u]
            .iter()
            .zip(capacity)
            .map(|(d, c)| if *c > 0.0 { d * f64::from(n) / c } else { 0.0 })
            .fold(0.0, f64::max)
    };
    loop {
        let fits = |u: usize, used: &[f64]| {
            demand[u].iter().any(|d| *d > 0.0)
                && demand[u]
                    .iter()
                    .zip(used)
                    .zip(capacity)
                    .all(|((d, x), c)| x + d <= c + 1e-9)
        };
        let next = (0..demand.len())
            .filter(|&u| fits(u, &used))
            .min_by(|&a, &b| {
                dominant(a, tasks[a])
                    .total_cmp(&dominant(b, tasks[b]))
                    .then(a.cmp(&b))
            });
        let Some(u) = next else { return tasks };
        tasks[u] += 1;
        for (x, d) in used.iter_mut().zip(&demand[u]) {
            *x += d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lecture's textbook case: 9 CPUs, 18 GB; A's tasks need <1 CPU, 4 GB>, B's
    /// <3 CPU, 1 GB>. DRF equalizes dominant shares (2x/9 = y/3): A gets 3 tasks (3 CPU,
    /// 12 GB, share 2/3 of memory), B gets 2 (6 CPU, 2 GB, share 2/3 of CPU).
    #[test]
    fn lecture_textbook_example() {
        let got = drf(&[9.0, 18.0], &[vec![1.0, 4.0], vec![3.0, 1.0]]);
        assert_eq!(got, vec![3, 2]);
    }

    #[test]
    fn a_single_user_fills_its_bottleneck() {
        assert_eq!(drf(&[10.0, 10.0], &[vec![2.0, 1.0]]), vec![5]);
        assert_eq!(drf(&[10.0, 10.0], &[vec![0.0, 0.0]]), vec![0]);
    }
}
