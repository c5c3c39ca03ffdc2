//! Dominant Resource Fairness (Ghodsi et al., NSDI'11; the lecture's DRF section) by
//! progressive filling, and its use as a round's admission quota per offline tenant over
//! (SM share, GPU memory) of the round's shared GPUs.

use std::collections::HashMap;

use super::{Shaped, Slot};
use crate::matching::FORBIDDEN;
use crate::plan::OfflineJob;

/// DRF by progressive filling: `capacity[r]` of each resource, `demand[u][r]` per task of
/// user `u`; repeatedly launches one task of the user with the lowest dominant share whose
/// next task still fits (ties: lowest index), until no user's next task fits. Returns the
/// number of tasks per user.
pub fn drf(capacity: &[f64], demand: &[Vec<f64>]) -> Vec<u32> {
    drf_limited(capacity, demand, &vec![u32::MAX; demand.len()])
}

/// [`drf`] where user `u` has at most `limit[u]` tasks (a user whose tasks are all launched
/// drops out of the filling).
pub fn drf_limited(capacity: &[f64], demand: &[Vec<f64>], limit: &[u32]) -> Vec<u32> {
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
            tasks[u] < limit.get(u).copied().unwrap_or(0)
                && demand[u].iter().any(|d| *d > 0.0)
                && demand[u].iter().zip(used).zip(capacity).all(|((d, x), c)| x + d <= c + 1e-9)
        };
        let next = (0..demand.len())
            .filter(|&u| fits(u, &used))
            .min_by(|&a, &b| dominant(a, tasks[a]).total_cmp(&dominant(b, tasks[b])).then(a.cmp(&b)));
        let Some(u) = next else { return tasks };
        tasks[u] += 1;
        for (x, d) in used.iter_mut().zip(&demand[u]) {
            *x += d;
        }
    }
}

/// The round's DRF quotas: resources are the slots' SM percentages and offline memory pooled;
/// a task of tenant `t` needs one job slot's mean SM share (the GPUs' SM over `per_gpu`
/// jobs each) and the mean memory of `t`'s jobs; a tenant has at most as many tasks as jobs.
/// Only jobs with an allowed pair (`weight(gi, j)` not [`FORBIDDEN`] for some slot) count: a
/// tenant whose jobs can run nowhere this round takes no share. Each tenant's running jobs
/// come first, then its jobs in list (queue) order. Jobs over quota are not refused: the
/// admitted ones get [`Shaped::Drf`]'s `bonus`, so the matching fills what they cannot use
/// with the others.
pub(super) fn shape(
    slots: &[Slot],
    jobs: &[OfflineJob],
    per_gpu: usize,
    weight: &dyn Fn(usize, usize) -> f64,
    current: &dyn Fn(usize) -> Option<usize>,
) -> Shaped {
    let mut tenant_of: HashMap<&str, usize> = HashMap::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut largest = 0.0f64;
    let mut runnable = 0usize;
    for (j, job) in jobs.iter().enumerate() {
        let mut allowed = false;
        for gi in 0..slots.len() {
            let w = weight(gi, j);
            if w != FORBIDDEN {
                allowed = true;
                largest = largest.max(w.abs());
            }
        }
        // A running job counts even where its pair is held outside the matching.
        if !allowed && current(j).is_none() {
            continue;
        }
        runnable += 1;
        let next = members.len();
        let t = *tenant_of.entry(job.tenant.as_str()).or_insert(next);
        if t == next {
            members.push(Vec::new());
        }
        members[t].push(j);
    }
    let sm: f64 = slots.iter().map(|s| s.sm_percent).sum();
    let mem: f64 = slots.iter().map(|s| s.memory_mib as f64).sum();
    let task_sm = if slots.is_empty() { 0.0 } else { sm / (slots.len() * per_gpu.max(1)) as f64 };
    let demand: Vec<Vec<f64>> = members
        .iter()
        .map(|m| vec![task_sm, m.iter().map(|&j| jobs[j].memory_mib as f64).sum::<f64>() / m.len() as f64])
        .collect();
    let limit: Vec<u32> = members.iter().map(|m| m.len() as u32).collect();
    let quota = drf_limited(&[sm, mem], &demand, &limit);
    let mut admitted = vec![false; jobs.len()];
    for (t, m) in members.iter_mut().enumerate() {
        m.sort_by_key(|&j| (current(j).is_none(), j));
        for &j in m.iter().take(quota[t] as usize) {
            admitted[j] = true;
        }
    }
    // One more admitted job placed outweighs any change in the placed jobs' throughput.
    let placeable = runnable.min(slots.len().saturating_mul(per_gpu.max(1)));
    let bonus = largest.max(1.0) * (placeable as f64 + 1.0);
    Shaped::Drf { admitted, bonus }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::JobFeedback;

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
        assert_eq!(drf_limited(&[10.0, 10.0], &[vec![2.0, 1.0]], &[3]), vec![3]);
    }

    /// By hand: 6 GPUs x 2 jobs each, 60 % SM and 16 000 MiB offline room per GPU: SM 360
    /// (30 per task, 12 tasks), memory 96 000. Tenant A's jobs need 12 000 MiB (dominant:
    /// memory, 0.125 a task), B's 2 000 MiB (dominant: SM, 1/12 a task). Progressive filling
    /// (ties to A): A1 B1 B2 A2 B3 A3 B4 B5 A4 B6 A5 B7, then SM is full: A 5 (share 0.625),
    /// B 7 (0.583). A's running job is admitted before its older queued ones.
    #[test]
    fn round_quota_follows_dominant_shares() {
        let slots: Vec<Slot> = (0..6).map(|_| Slot { gpu_type: "V100", sm_percent: 60.0, memory_mib: 16_000 }).collect();
        let mk = |i: usize, tenant: &str, mem| OfflineJob {
            name: format!("{tenant}{i}"),
            tenant: tenant.into(),
            memory_mib: mem,
            gpu_types: vec![],
            profile: None,
            current: None,
            held_memory_quota_mib: None,
            allowed_nodes: None,
            feedback: JobFeedback::default(),
        };
        let mut jobs: Vec<OfflineJob> = (0..12).map(|i| mk(i, "a", 12_000)).collect();
        jobs.extend((0..12).map(|i| mk(i, "b", 2_000)));
        // Job a11 runs on GPU 3.
        let cur = |j: usize| (j == 11).then_some(3);
        let Shaped::Drf { admitted, .. } = shape(&slots, &jobs, 2, &|_, _| 1.0, &cur) else { panic!("not DRF") };
        let a: Vec<usize> = (0..12).filter(|&j| admitted[j]).collect();
        assert_eq!(a, vec![0, 1, 2, 3, 11]);
        assert_eq!((12..24).filter(|&j| admitted[j]).count(), 7);
    }
}
