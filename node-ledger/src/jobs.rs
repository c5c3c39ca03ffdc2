//! Offline *jobs* on a GPU, as the SM budget is shared between them. A job is one quota group
//! (one container or pod: `XCUDA_GROUP`); its processes (a trainer and its workers) share the
//! job's share. Every party that splits or judges the offline SM budget reads the jobs here,
//! from the registry slots' recorded MPS percentages ([`crate::layout::ProcSlot::mps_pct`]):
//! the shim at start (its MPS percentage, [`start_share`]) and on its periodic tick (its load
//! target, [`job_share`]), the monitor when it judges co-located load; the simulator applies
//! the same rules.

use crate::ledger::{Ledger, ProcSnapshot};

/// One offline job on the GPU, from its registered processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflineJob {
    /// Its quota group's id (`group_id_for` its `XCUDA_GROUP`).
    pub group_id: u64,
    /// Its registered processes counted (0 for a job known only by its start claim,
    /// [`with_claims`]).
    pub procs: u32,
    /// The job's MPS active-thread percentage: the largest its processes started with, `None`
    /// when any of them started without one (that process is not capped by MPS at all).
    pub mps_pct: Option<u32>,
}

/// Groups registered processes into jobs (by group id, in order of first appearance). A slot
/// still mid-registration (start time 0) is not counted.
pub fn jobs_of<'a>(procs: impl IntoIterator<Item = &'a ProcSnapshot>) -> Vec<OfflineJob> {
    let mut jobs: Vec<OfflineJob> = Vec::new();
    for p in procs.into_iter().filter(|p| p.start_time != 0) {
        let pct = (p.mps_pct != 0).then_some(p.mps_pct);
        match jobs.iter_mut().find(|j| j.group_id == p.group_id) {
            Some(j) => {
                j.procs += 1;
                j.mps_pct = j.mps_pct.zip(pct).map(|(a, b)| a.max(b));
            }
            None => jobs.push(OfflineJob { group_id: p.group_id, procs: 1, mps_pct: pct }),
        }
    }
    jobs
}

/// The jobs a process starting at `now_ns` must leave room for ([`start_share`]'s `jobs`):
/// the registered `jobs`, plus one job (its `procs` 0) per group that has a fresh start claim
/// (younger than `ttl_ns`, see [`crate::claims`]) and no registered process. A registered
/// group's claim is redundant: its slots say what it holds. Several claims of one group (a
/// damaged block) count as one job with the largest percentage (unknown if any is).
///
/// For a starting process's share only. The monitor's judgement ([`offline_cap_pct`]), the
/// manager's estimate and the running split ([`job_share`]) take registered jobs alone: a
/// claim says a process will start with a percentage, not that any SM is in use (the shell of
/// an offline container claims too), and counting it there would subtract a cap for work that
/// is not running, which fails open.
pub fn with_claims(
    jobs: &[OfflineJob],
    claims: &[crate::claims::StartClaim],
    now_ns: u64,
    ttl_ns: u64,
) -> Vec<OfflineJob> {
    let mut out = jobs.to_vec();
    for c in claims.iter().filter(|c| c.is_fresh(now_ns, ttl_ns)) {
        if jobs.iter().any(|j| j.group_id == c.group_id) {
            continue;
        }
        match out.iter_mut().find(|j| j.group_id == c.group_id) {
            Some(j) => j.mps_pct = j.mps_pct.zip(c.mps_pct).map(|(a, b)| a.max(b)),
            None => out.push(OfflineJob { group_id: c.group_id, procs: 0, mps_pct: c.mps_pct }),
        }
    }
    out
}

/// The jobs of two views of one GPU together (the jobs of a process's own ledger and the
/// monitor's table of every ledger): one job per group, with the larger process count and the
/// larger percentage (unknown, read as uncapped, if either view has it so): the tighter reading
/// wherever the views differ (one of them is older).
pub fn merge(a: &[OfflineJob], b: &[OfflineJob]) -> Vec<OfflineJob> {
    let mut out = a.to_vec();
    for j in b {
        match out.iter_mut().find(|o| o.group_id == j.group_id) {
            Some(o) => {
                o.procs = o.procs.max(j.procs);
                o.mps_pct = o.mps_pct.zip(j.mps_pct).map(|(x, y)| x.max(y));
            }
            None => out.push(*j),
        }
    }
    out
}

/// A pod's jobs (those of its own ledger, `node_ledger::pods`, with their start claims:
/// [`with_claims`]) as the one job the pod is to every other pod, under the pod's own group id
/// `pod_group` (`group_id_for(pod_group_name(uid))`, the `XCUDA_GROUP` node-agent gives its
/// containers): its registered processes counted together, at the sum of their jobs'
/// percentages, at most 100 (unknown if any is); while it has no registered process, its
/// fresh claims the same way (a job of `procs` 0). `None` when it has neither.
///
/// What a pod writes into its own ledger thus weighs, in the other pods' splits, at most as
/// one job holding the whole GPU: groups made up by a tenant (any number of them, each at
/// 100 %) would otherwise divide everyone else's part of the budget further with each one.
/// A pod with registered processes is judged by them alone: its claims say nothing more
/// (every process of a planned pod starts at the plan's percentage).
pub fn pod_job(pod_group: u64, jobs: &[OfflineJob]) -> Option<OfflineJob> {
    let running: Vec<&OfflineJob> = jobs.iter().filter(|j| j.procs > 0).collect();
    let counted: Vec<&OfflineJob> = if running.is_empty() { jobs.iter().collect() } else { running };
    if counted.is_empty() {
        return None;
    }
    let pct = counted
        .iter()
        .try_fold(0u32, |sum, j| j.mps_pct.map(|p| sum.saturating_add(p)))
        .map(|p| p.min(100));
    Some(OfflineJob { group_id: pod_group, procs: counted.iter().map(|j| j.procs).sum(), mps_pct: pct })
}

/// Weight of a job in the split: its MPS percentage, or the whole GPU (100) for a job with an
/// uncapped process (it can take every SM).
fn weight(j: &OfflineJob) -> f64 {
    f64::from(j.mps_pct.unwrap_or(100))
}

/// The SM share (fraction) a process of job `my_group` may start with, of a fresh `budget`
/// (fraction) when `jobs` are on the GPU: its own job's percentage if that job is already
/// there with one (processes of a job share the job's share); else what the other jobs
/// leave of the budget (a job with an uncapped process leaves nothing), possibly 0: the
/// caller's floor then applies (the shim's `MIN_MPS_PERCENTAGE`: MPS needs more than 0).
/// The shim passes the registered jobs together with the fresh start claims of jobs not yet
/// registered ([`with_claims`], under the claims lock), so that two jobs starting together
/// do not both take the whole budget.
pub fn start_share(budget: f64, jobs: &[OfflineJob], my_group: u64) -> f64 {
    if let Some(pct) = jobs.iter().find(|j| j.group_id == my_group).and_then(|j| j.mps_pct) {
        return f64::from(pct) / 100.0;
    }
    let held: f64 = jobs.iter().filter(|j| j.group_id != my_group).map(weight).sum::<f64>() / 100.0;
    (budget - held).clamp(0.0, 1.0)
}

/// Job `my_group`'s part of a fresh offline SM `budget` (fraction) shared by `jobs`: the budget
/// times its MPS percentage over the sum of every job's (a job with an uncapped process
/// weighs 100). The parts of all jobs sum to the budget. `own_pct` weighs this job when the
/// ledger does not list it (not registered yet): this process's own percentage, if any.
pub fn job_share(budget: f64, jobs: &[OfflineJob], my_group: u64, own_pct: Option<u32>) -> f64 {
    let mine = jobs
        .iter()
        .find(|j| j.group_id == my_group)
        .map_or_else(|| f64::from(own_pct.unwrap_or(100)), weight);
    let others: f64 = jobs.iter().filter(|j| j.group_id != my_group).map(weight).sum();
    budget * mine / (mine + others)
}

/// The SM share, percent, the offline side is held to when `jobs` run beside online work
/// (sysmonitor judges the online workload's own share with it, mps-manager estimates the
/// online activity with it, and the simulator does both): the
/// sum of the jobs' MPS percentages (MPS caps each job's processes in space; several jobs on
/// one GPU each hold their own), and never more than the MPS manager's fresh `budget` (the
/// shims' throttles hold the jobs to their parts of it in time). `None`, so that the whole
/// reading counts as online (fail closed), when the budget is stale or absent, when no job is
/// registered, or when a job has a process without a percentage (MPS does not cap it).
pub fn offline_cap_pct(budget: Option<f64>, jobs: &[OfflineJob]) -> Option<f64> {
    let budget = budget?;
    if jobs.is_empty() {
        return None;
    }
    let sum = jobs.iter().map(|j| j.mps_pct.map(f64::from)).sum::<Option<f64>>()?;
    Some(sum.min(budget))
}

impl Ledger {
    /// The offline jobs registered on this GPU now ([`jobs_of`] over [`Ledger::procs`]). A
    /// process that died and is not yet reclaimed still counts (for at most the reclaimers'
    /// period): its share is given back a little late, never early. Reads every slot: for
    /// process start and periodic ticks, never a launch.
    pub fn offline_jobs(&self) -> Vec<OfflineJob> {
        jobs_of(&self.procs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(group_id: u64, mps_pct: Option<u32>) -> OfflineJob {
        OfflineJob { group_id, procs: 1, mps_pct }
    }

    fn p(group_id: u64, mps_pct: u32) -> ProcSnapshot {
        ProcSnapshot {
            slot: 0,
            pid: 1,
            start_time: 1,
            pid_ns: 0,
            group_id,
            mem_bytes: 0,
            launches: 0,
            launches_delayed: 0,
            heartbeat_ns: 0,
            syncs: (0, 0),
            mps_pct,
            ledger_file: Default::default(),
            owner_lock: (0, 0),
        }
    }

    /// The running split: parts in proportion to the jobs' percentages, summing to the budget.
    /// A pod is one job to the others: its registered jobs summed (at most 100), its claims
    /// only while nothing of it is registered.
    #[test]
    fn a_pod_weighs_as_one_job_at_most_the_whole_gpu() {
        let pod = 77;
        assert_eq!(pod_job(pod, &[]), None);
        let one = OfflineJob { group_id: pod, procs: 2, mps_pct: Some(20) };
        assert_eq!(pod_job(pod, &[one]), Some(one), "a planned pod: as it is");
        // A tenant's made-up groups, each at 100 %, and one uncapped.
        let made_up: Vec<_> = (1..=50).map(|g| OfflineJob { group_id: g, procs: 1, mps_pct: Some(100) }).collect();
        assert_eq!(pod_job(pod, &made_up), Some(OfflineJob { group_id: pod, procs: 50, mps_pct: Some(100) }));
        let mut uncapped = made_up.clone();
        uncapped.push(OfflineJob { group_id: 99, procs: 1, mps_pct: None });
        assert_eq!(pod_job(pod, &uncapped).unwrap().mps_pct, None);
        let two = [OfflineJob { group_id: 1, procs: 1, mps_pct: Some(20) }, OfflineJob { group_id: 2, procs: 3, mps_pct: Some(15) }];
        assert_eq!(pod_job(pod, &two), Some(OfflineJob { group_id: pod, procs: 4, mps_pct: Some(35) }));
        // Claims count only while nothing is registered.
        let claim = OfflineJob { group_id: 5, procs: 0, mps_pct: Some(60) };
        assert_eq!(pod_job(pod, &[one, claim]), Some(one));
        assert_eq!(pod_job(pod, &[claim]), Some(OfflineJob { group_id: pod, procs: 0, mps_pct: Some(60) }));
        // Beside another pod of 20 %: a share of the budget by the split, whatever the tenant made up.
        let other = OfflineJob { group_id: 1000, procs: 1, mps_pct: Some(20) };
        let share = job_share(0.6, &[other, pod_job(pod, &uncapped).unwrap()], 1000, None);
        assert!((share - 0.6 * 20.0 / 120.0).abs() < 1e-9, "{share}");
    }

    #[test]
    fn merged_views_keep_every_job_once_at_its_tighter_reading() {
        let a = [job(1, Some(20)), job(2, Some(30))];
        let b = [job(2, Some(35)), job(3, None), job(1, None)];
        let m = merge(&a, &b);
        assert_eq!(m.len(), 3);
        assert_eq!(m.iter().find(|j| j.group_id == 1).unwrap().mps_pct, None, "unknown in one view: uncapped");
        assert_eq!(m.iter().find(|j| j.group_id == 2).unwrap().mps_pct, Some(35));
        assert_eq!(m.iter().find(|j| j.group_id == 3).unwrap().mps_pct, None);
        assert_eq!(merge(&a, &[]), a.to_vec());
        assert_eq!(merge(&[], &a), a.to_vec());
    }

    #[test]
    fn running_jobs_divide_the_budget_in_proportion_to_their_percentages() {
        let jobs = [job(1, Some(30)), job(2, Some(10))];
        let (a, b) = (job_share(0.4, &jobs, 1, None), job_share(0.4, &jobs, 2, None));
        assert!((a - 0.3).abs() < 1e-9 && (b - 0.1).abs() < 1e-9, "{a} {b}");
        let (a, b) = (job_share(0.2, &jobs, 1, None), job_share(0.2, &jobs, 2, None));
        assert!((a - 0.15).abs() < 1e-9 && (b - 0.05).abs() < 1e-9, "the budget halved: each part halves");
        assert!((job_share(0.4, &[job(1, Some(40))], 1, None) - 0.4).abs() < 1e-9, "alone: the whole budget");
        assert!((job_share(0.4, &[], 1, Some(20)) - 0.4).abs() < 1e-9, "not registered yet, alone");
        assert!((job_share(0.4, &[job(2, Some(20))], 1, Some(20)) - 0.2).abs() < 1e-9, "not registered yet, beside another");
        let u = job_share(0.4, &[job(1, Some(20)), job(2, None)], 1, None);
        assert!((u - 0.4 * 20.0 / 120.0).abs() < 1e-9, "an uncapped job weighs the whole GPU: {u}");
    }

    /// Several offline jobs on one GPU: the cap taken off is the sum of their MPS percentages,
    /// at most the budget; unknown anywhere = none (the whole reading counts as online).
    #[test]
    fn the_offline_cap_is_the_sum_of_the_jobs_percentages_at_most_the_budget() {
        let two = [job(1, Some(20)), job(2, Some(15))];
        assert_eq!(offline_cap_pct(Some(40.0), &two), Some(35.0));
        assert_eq!(offline_cap_pct(Some(40.0), &[job(1, Some(40)), job(2, Some(40))]), Some(40.0), "never past the budget");
        assert_eq!(offline_cap_pct(Some(60.0), &[job(1, Some(40))]), Some(40.0), "one job's own cap, below a risen budget");
        assert_eq!(offline_cap_pct(None, &two), None, "stale budget");
        assert_eq!(offline_cap_pct(Some(40.0), &[job(1, Some(20)), job(2, None)]), None, "an uncapped job");
        assert_eq!(offline_cap_pct(Some(40.0), &[]), None);
    }

    #[test]
    fn processes_of_one_group_are_one_job_with_its_largest_percentage() {
        let jobs = jobs_of(&[p(7, 20), p(9, 30), p(7, 25)]);
        assert_eq!(
            jobs,
            vec![
                OfflineJob { group_id: 7, procs: 2, mps_pct: Some(25) },
                OfflineJob { group_id: 9, procs: 1, mps_pct: Some(30) },
            ]
        );
    }

    #[test]
    fn one_uncapped_process_makes_its_job_uncapped_and_registering_slots_do_not_count() {
        let mut mid = p(3, 50);
        mid.start_time = 0;
        let jobs = jobs_of(&[p(7, 20), p(7, 0), mid]);
        assert_eq!(jobs, vec![OfflineJob { group_id: 7, procs: 2, mps_pct: None }]);
    }

    #[test]
    fn the_ledger_records_each_process_percentage_in_its_own_slot() {
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open_or_create(&d.path().join("ledger"), 0).unwrap();
        let (a, b) = (l.group(1, 100).unwrap(), l.group(2, 100).unwrap());
        let me = std::process::id();
        let ha = l.register_with_mps(me, a, 20).unwrap();
        let hb = l.register_with_mps(me, b, 400).unwrap();
        assert_eq!(l.procs().iter().map(|p| p.mps_pct).collect::<Vec<_>>(), [20, 0], "out of range: none known");
        let jobs = l.offline_jobs();
        assert_eq!(jobs.iter().map(|j| j.mps_pct).collect::<Vec<_>>(), [Some(20), None]);
        l.unregister(ha);
        let hc = l.register(me, a).unwrap();
        assert_eq!(l.procs().iter().find(|p| p.slot == hc.slot).unwrap().mps_pct, 0, "a reused slot starts without the previous owner's");
        l.unregister(hb);
        l.unregister(hc);
        assert!(l.offline_jobs().is_empty());
    }
}
