//! The dynamic SM budget (MuxFlow's dynamic SM allocation) as it reaches an offline process.
//! Real MPS fixes a client's active-thread percentage when the client starts, and
//! `set_active_thread_percentage` never changes a running client, so the budget arrives two ways:
//! at start, the library constructor sets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from it (a value
//! the user set is kept only where it asks for no more, see below), so MPS itself caps the new
//! client; while running, the throttle's
//! controller reads it on each periodic tick (never per launch) and lowers its load target.
//! Stale or absent budget: the configured static target; never looser than configured.
//!
//! The budget is the whole offline side's, and several offline jobs may share a GPU
//! (`max_offline_per_gpu` > 1). Each process records the percentage it started with in its own
//! ledger slot ([`node_ledger::layout::ProcSlot::mps_pct`]), and the budget is split between
//! *jobs* (quota groups: a container's processes share its share, see [`node_ledger::jobs`]):
//! - at start ([`start_share`]): a process of a job already on the GPU takes its job's
//!   percentage; a new job takes what the other jobs leave of the budget, at least
//!   [`MIN_MPS_PERCENTAGE`]. So the percentages sum to at most the budget (plus rounding up
//!   to whole percents) unless the others already hold it all: a job arriving then gets the
//!   floor, for its whole life (MPS cannot raise it later), and the sum passes the budget by
//!   that floor, which the running split below takes back in time;
//! - while running ([`job_share`]): the fresh budget is divided between the live jobs in
//!   proportion to their percentages (the parts sum to the budget). A job whose part covers
//!   its MPS percentage is left to MPS (as while the budget is what it was at its start); one
//!   whose part is below it (the budget fell, or the jobs hold more than it) is throttled, its
//!   PID aiming the GPU's load at the budget (`Throttle::target_for_part`: the load measured
//!   is the whole GPU's, so every such job aiming at the budget holds all of them to it), and
//!   without monitor data its fixed rate is scaled to its part;
//! - sysmonitor judges co-located load with the sum of the live jobs' percentages (at most
//!   the budget), not one budget per job.
//!
//! Registration is lazy (the first driver call, seconds after library load for Python +
//! torch), so at start the constructor also reads the other jobs' *start claims* and records
//! its own ([`claim_start_percentage`], protocol in [`node_ledger::claims`]): per ledger it
//! takes the ledger's claims lock, reads registered jobs and fresh claims, computes its share,
//! writes its claim and lets go. Two jobs starting together then split the budget as two jobs
//! starting one after the other do, instead of both taking the whole of it. A lock that cannot
//! be had within [`node_ledger::claims::CLAIM_LOCK_WAIT`] gives the floor (never the whole
//! budget), said once in the log. Claims count for start shares only: the running split and
//! the monitor's judgement read registered slots alone (see [`node_ledger::jobs::with_claims`]).
//! A percentage the user set (node-agent's plan, or the tenant's own) is kept where it is at
//! most the process's start share: a job may take less than its share, never more. Above the
//! share, or not a percentage MPS would apply (`0`, `150`, `abc`), it is replaced by the share
//! and said once at WARN: the manager sets no daemon-wide cap (the online service's clients run
//! on the same servers), so the client's own variable is the only cap MPS applies to it, and
//! NVIDIA's MPS documentation has that variable only further constrain a limit the control
//! daemon set. Without a fresh budget the user's value is left as it is. What the process
//! starts with is claimed (the next job must leave room for it).
//!
//! The jobs of other pods are not in a process's ledger (each pod has its own): both splits take
//! them from the monitor's jobs table in the status file ([`fresh_jobs`]), merged with the
//! process's own ledger ([`node_ledger::jobs::merge`]). Without a fresh table a starting process
//! takes the floor; the running split then reads its own ledger alone (the monitor is down: its
//! throttle has no load reading either, and node-agent admits no new work).
//!
//! Cost at library load (every process of an offline container pays it): beside the ledger's
//! open and map that reading the budget already needed, two `fcntl` (lock, unlock) and one
//! `stat` (the claimer's pid namespace, for reports); see `benches/start_claim.rs`.

use std::time::Duration;

pub use node_ledger::jobs::{job_share, start_share};
use node_ledger::{Ledger, Status};

/// The MPS client variable real MPS reads at client start.
pub const MPS_ENV: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// Set beside [`MPS_ENV`] when the shim chose its value, so a child process (which inherits
/// both) recomputes it from the budget of its own start instead of taking it as the user's.
pub const MPS_ENV_MARK: &str = "XCUDA_MPS_PERCENTAGE_FROM_BUDGET";
/// Smallest percentage the shim sets: below it a client can barely make progress. A job that
/// starts when the other offline jobs on its GPU already hold the whole budget still gets it
/// (for its life: MPS fixes it at start), so the jobs' percentages then sum to the budget plus
/// this floor; the throttle's running split holds every job to its part of the budget, and the
/// monitor takes off at most the budget.
pub const MIN_MPS_PERCENTAGE: u32 = 10;

/// Shortest age at which the manager's budget counts as stale, ns. mps-manager publishes it
/// every period (100 ms) but its loop also runs MPS control commands, which take up to a
/// second on a busy host (seen at the moment a new offline client connects, i.e. exactly when
/// the constructor reads it); the budget is smoothed and moves slowly, and a stale one means a
/// looser limit (MPS's default percentage), so an age of a few periods must not count.
pub const BUDGET_STALE_NS: u64 = 2_000_000_000;

/// The offline SM budget (the status file's manager block, written by mps-manager) as a
/// fraction of the SMs if it is fresh (published within `stale_ns`, at least
/// [`BUDGET_STALE_NS`]), else `None`.
pub fn fresh_budget(status: &Status, now_ns: u64, stale_ns: u64) -> Option<f64> {
    let s = status.read_manager()?;
    s.is_fresh(now_ns, stale_ns.max(BUDGET_STALE_NS))
        .then(|| f64::from(s.offline_sm_budget_permille.min(1000)) / 1000.0)
}

/// The offline jobs on the GPU as the monitor last counted them in every ledger of the GPU
/// (the status file's jobs table), if published within `stale_ns` (at least
/// [`BUDGET_STALE_NS`]); else `None`. `starting`: for a starting process's share, with the jobs
/// known by a fresh start claim alone ([`node_ledger::JobsSnapshot::for_start`]); else for the
/// running split, registered jobs only ([`node_ledger::JobsSnapshot::for_running`]). A process
/// sees only its own pod's ledger: the other pods' jobs reach it through this table alone.
pub fn fresh_jobs(status: &Status, now_ns: u64, stale_ns: u64, starting: bool) -> Option<Vec<node_ledger::OfflineJob>> {
    let t = status.read_jobs()?;
    t.is_fresh(now_ns, stale_ns.max(BUDGET_STALE_NS))
        .then(|| if starting { t.for_start() } else { t.for_running() })
}

/// MPS active-thread percentage for a budget of `permille`: rounded up, at least
/// [`MIN_MPS_PERCENTAGE`], at most 100.
pub fn mps_percentage(permille: u32) -> u32 {
    permille.div_ceil(10).clamp(MIN_MPS_PERCENTAGE, 100)
}

/// The value [`MPS_ENV`] holds that the user set (node-agent's plan, or the tenant), not a
/// shim in a parent process (which marks its own with [`MPS_ENV_MARK`]), if any.
pub fn user_mps_value(get: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    get(MPS_ENV).filter(|v| get(MPS_ENV_MARK).as_deref() != Some(v.as_str()))
}

/// The value to give [`MPS_ENV`] at process start for a decided percentage `pct`
/// ([`claim_start_percentage`]), if it must change: `None` when nothing was decided (no fresh
/// budget: MPS's default, or the user's value as it is) or the user's own value already asks
/// for exactly `pct` (kept as written, a fraction included).
pub fn mps_env_value(get: &dyn Fn(&str) -> Option<String>, pct: Option<u32>) -> Option<String> {
    let pct = pct?;
    if user_mps_value(get).is_some() && own_mps_pct(get) == Some(pct) {
        return None;
    }
    Some(pct.to_string())
}

/// This process's own SM cap as MPS applies it: [`MPS_ENV`] (the user's or the one the
/// constructor set from the budget) as a fraction, if it holds a valid percentage (1..=100).
/// The throttle leaves a budget this cap already enforces to MPS.
pub fn own_mps_share(get: &dyn Fn(&str) -> Option<String>) -> Option<f64> {
    own_mps_pct(get).map(|pct| f64::from(pct) / 100.0)
}

/// [`own_mps_share`] in whole percent (1..=100), as the ledger slot records it. A fractional
/// value (MPS accepts one) is rounded up: the slot never records less than MPS allows.
pub fn own_mps_pct(get: &dyn Fn(&str) -> Option<String>) -> Option<u32> {
    let pct: f64 = get(MPS_ENV)?.trim().parse().ok()?;
    (pct > 0.0 && pct <= 100.0).then(|| pct.ceil() as u32)
}

/// What [`claim_start_percentage`] decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StartPercentage {
    /// The percentage this process starts with and claimed: the user's, or its share of the
    /// fresh budget; `None` when neither (no fresh budget on any ledger: MPS's default).
    pub pct: Option<u32>,
    /// What went wrong, for one log line (a claims lock not had in time: the floor was taken;
    /// a claim not recorded).
    pub trouble: Option<String>,
}

/// Decides the MPS percentage a process of `cfg`'s group starts with at `now_ns` and claims it
/// on every host GPU ledger of `cfg` that opens ([`node_ledger::claims`]): its start share of
/// each ledger's fresh budget, the strictest of them (MPS applies one percentage to all of a
/// client's devices), or `user_pct`, the percentage the user set, where that is lower (a job
/// may take less than its share, never more); the user's alone without a fresh budget. A ledger whose claims lock is not had within `lock_wait` counts as
/// leaving the floor. Never panics; every error is a line in `trouble`.
pub fn claim_start_percentage(cfg: &crate::config::Config, user_pct: Option<u32>, now_ns: u64, lock_wait: Duration) -> StartPercentage {
    let group = node_ledger::ledger::group_id_for(&cfg.group);
    let ttl_ns = cfg.budget.claim_ttl_ms.saturating_mul(1_000_000);
    let stale_ns = cfg.throttle.stale_after_ms.saturating_mul(1_000_000);
    let mut trouble: Option<String> = None;
    // Each ledger with its GPU's status file (the budget), when that opens; a user's own
    // percentage needs no budget, and this runs in every process that loads the shim.
    let (ledgers, statuses): (Vec<Ledger>, Vec<Option<Status>>) = cfg
        .host_gpus()
        .into_iter()
        .filter_map(|i| {
            let at = cfg.ledger_of(i);
            let status = Status::open(&at.status_path()).ok();
            Some((Ledger::open_existing(&at.ledger_path()).ok()?, status))
        })
        .unzip();
    if ledgers.is_empty() {
        return StartPercentage { pct: user_pct, trouble: None };
    }
    // Read before the locks are taken (a `stat` in /proc: the lock is held for less).
    let (pid, pid_ns) = (std::process::id(), node_ledger::procinfo::own_pid_ns());
    let locks: Vec<_> = ledgers
        .iter()
        .map(|l| match l.lock_claims(lock_wait) {
            Ok(Some(lock)) => Some(lock),
            Ok(None) => {
                trouble.get_or_insert_with(|| {
                    format!(
                        "{}: the start-claims lock stayed held for {} ms: starting at the floor ({MIN_MPS_PERCENTAGE} %), unclaimed",
                        l.path().display(),
                        lock_wait.as_millis()
                    )
                });
                None
            }
            Err(e) => {
                trouble.get_or_insert_with(|| format!("{e}: starting at the floor ({MIN_MPS_PERCENTAGE} %), unclaimed"));
                None
            }
        })
        .collect();
    let share = {
        statuses
            .iter()
            .zip(&locks)
            .filter_map(|(status, lock)| {
                let status = status.as_ref()?;
                let b = fresh_budget(status, now_ns, stale_ns)?;
                // The jobs of this ledger and its claims, with the monitor's table of every
                // ledger of the GPU; without a fresh table the other pods' jobs are unknown:
                // fail closed, the floor.
                let others = fresh_jobs(status, now_ns, stale_ns, true);
                Some(match (lock, others) {
                    (Some(lock), Some(table)) => start_share(b, &node_ledger::jobs::merge(&lock.start_jobs(now_ns, ttl_ns), &table), group),
                    _ => 0.0,
                })
            })
            .reduce(f64::min)
            .map(|share| mps_percentage((share * 1000.0).round() as u32))
    };
    let pct = match (user_pct, share) {
        (Some(u), Some(s)) => Some(u.min(s)),
        (u, s) => u.or(s),
    };
    if let Some(p) = pct {
        for (l, lock) in ledgers.iter().zip(&locks) {
            if let Some(lock) = lock {
                if !lock.record(group, p, pid, pid_ns, now_ns, ttl_ns) {
                    trouble.get_or_insert_with(|| {
                        format!(
                            "{}: the start-claims table is full of other jobs' fresh claims: {p} % not claimed",
                            l.path().display()
                        )
                    });
                }
            }
        }
    }
    drop(locks);
    StartPercentage { pct, trouble }
}

/// Library constructor: runs when the shim is loaded, before the application's `main` and so
/// before any `cuInit`.
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(set_mps_percentage_from_budget);
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

fn set_mps_percentage_from_budget() {
    let get = |k: &str| std::env::var(k).ok();
    let user_value = user_mps_value(&get);
    // A user's value that is not a percentage MPS would apply counts as none: the share.
    let user_pct = user_value.as_ref().and(own_mps_pct(&get));
    // Loaded here without caching: the process's config is loaded (and its errors reported)
    // on the first driver call, after the application may have set its environment.
    let (cfg, _) = crate::config::Config::load(&get);
    let decided = claim_start_percentage(&cfg, user_pct, node_ledger::clock::now_ns(), node_ledger::claims::CLAIM_LOCK_WAIT);
    let v = mps_env_value(&get, decided.pct);
    let overridden = v.as_ref().and(user_value.as_ref());
    if decided.trouble.is_some() || overridden.is_some() {
        let d = crate::state::our_dispatch(&cfg.log);
        tracing::dispatcher::with_default(&d, || {
            if let Some(t) = &decided.trouble {
                tracing::warn!("xcuda: {t}");
            }
            if let (Some(user), Some(pct)) = (overridden, decided.pct) {
                tracing::warn!(
                    user_value = %user,
                    pct,
                    "xcuda: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE above this job's share of the offline SM budget, or not a percentage MPS applies: starting at the share"
                );
            }
        });
    }
    let Some(v) = v else {
        return;
    };
    let (Ok(k), Ok(val), Ok(mark)) = (
        std::ffi::CString::new(MPS_ENV),
        std::ffi::CString::new(v.clone()),
        std::ffi::CString::new(MPS_ENV_MARK),
    ) else {
        return;
    };
    // SAFETY: a library constructor runs before main, while the process has one thread; the
    // strings are NUL-terminated and setenv copies them.
    unsafe {
        libc::setenv(k.as_ptr(), val.as_ptr(), 1);
        libc::setenv(mark.as_ptr(), val.as_ptr(), 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentage_rounds_up_with_a_floor() {
        assert_eq!(mps_percentage(300), 30);
        assert_eq!(mps_percentage(301), 31);
        assert_eq!(mps_percentage(20), MIN_MPS_PERCENTAGE);
        assert_eq!(mps_percentage(5000), 100);
    }

    #[test]
    fn env_value_keeps_a_user_value_asking_for_what_was_decided_and_needs_a_decision() {
        let none = |_: &str| None;
        assert_eq!(mps_env_value(&none, Some(25)), Some("25".into()));
        assert_eq!(mps_env_value(&none, None), None, "nothing decided (no fresh budget): leave MPS's default");
        let user = |v: &'static str| move |k: &str| (k == MPS_ENV).then(|| v.to_string());
        assert_eq!(user_mps_value(&user("70")).as_deref(), Some("70"));
        assert_eq!(mps_env_value(&user("70"), Some(25)), Some("25".into()), "above the share: the share");
        assert_eq!(mps_env_value(&user("12.5"), Some(13)), None, "the user's own (lower) value, kept as written");
        assert_eq!(mps_env_value(&user("70"), None), None, "no budget: the user's value as it is");
        let ours = |k: &str| (k == MPS_ENV || k == MPS_ENV_MARK).then(|| "70".to_string());
        assert_eq!(user_mps_value(&ours), None, "a parent shim's value is not the user's");
        assert_eq!(mps_env_value(&ours, Some(25)), Some("25".into()), "a parent shim's value is recomputed");
    }

    #[test]
    fn own_share_is_the_mps_percentage_in_force() {
        let env = |v: &'static str| move |k: &str| (k == MPS_ENV).then(|| v.to_string());
        assert_eq!(own_mps_share(&env("45")), Some(0.45));
        assert_eq!(own_mps_share(&env(" 100 ")), Some(1.0));
        assert_eq!(own_mps_share(&env("0")), None);
        assert_eq!(own_mps_share(&env("150")), None);
        assert_eq!(own_mps_share(&env("x")), None);
        assert_eq!(own_mps_share(&|_: &str| None), None);
    }

    fn job(group_id: u64, mps_pct: Option<u32>) -> node_ledger::OfflineJob {
        node_ledger::OfflineJob { group_id, procs: 1, mps_pct }
    }

    fn pct_of(share: f64) -> u32 {
        mps_percentage((share * 1000.0).round() as u32)
    }

    /// Two offline jobs on one GPU take the budget between them, not each the whole of it
    /// (before the split each took the whole budget: 40 % + 40 % against a 40 % budget).
    #[test]
    fn a_new_job_takes_what_the_others_leave_of_the_budget() {
        assert_eq!(pct_of(start_share(0.4, &[], 1)), 40, "alone: the whole budget");
        let a = job(1, Some(25));
        assert_eq!(pct_of(start_share(0.4, &[a], 2)), 15);
        assert!(25 + pct_of(start_share(0.4, &[a], 2)) <= 40);
        assert_eq!(pct_of(start_share(0.4, &[a], 1)), 25, "a job's next process shares the job's share");
        let full = job(1, Some(40));
        assert_eq!(pct_of(start_share(0.4, &[full], 2)), MIN_MPS_PERCENTAGE, "nothing left: the floor");
        assert_eq!(pct_of(start_share(0.4, &[job(1, None)], 2)), MIN_MPS_PERCENTAGE, "an uncapped job leaves nothing");
        assert_eq!(pct_of(start_share(0.4, &[job(2, None)], 2)), 40, "its own uncapped job: a job's share is computed anew");
        assert_eq!(pct_of(start_share(0.404, &[job(1, Some(20))], 2)), 21, "rounded up to whole percents");
    }

    #[test]
    fn own_percentage_in_whole_percents() {
        let env = |v: &'static str| move |k: &str| (k == MPS_ENV).then(|| v.to_string());
        assert_eq!(own_mps_pct(&env("25")), Some(25));
        assert_eq!(own_mps_pct(&env("12.5")), Some(13), "never less than MPS allows");
        assert_eq!(own_mps_pct(&env("nan")), None);
        assert_eq!(own_mps_pct(&env("0")), None);
    }

    fn cfg_in(dir: &std::path::Path, group: &str) -> crate::config::Config {
        crate::config::Config { ledger_dir: dir.to_owned(), group: group.into(), ..Default::default() }
    }

    /// The constructor's decision, two jobs loading one after the other before either
    /// registers: the second sees the first's claim (before: 40 + 40 against a 40 % budget).
    #[test]
    fn jobs_loading_together_split_the_budget_through_their_claims() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, c) = (cfg_in(d.path(), "job-a"), cfg_in(d.path(), "job-b"), cfg_in(d.path(), "job-c"));
        let l = Ledger::open_or_create(&a.ledger().ledger_path(), 0).unwrap();
        let manager = Status::open_or_create(&a.ledger().status_path(), 0).unwrap();
        // In the past (a claim time in the future is read, and rewritten, as now).
        let now = node_ledger::clock::now_ns().saturating_sub(60_000_000_000);
        let wait = node_ledger::claims::CLAIM_LOCK_WAIT;
        assert_eq!(claim_start_percentage(&a, None, now, wait).pct, None, "no budget: nothing set or claimed");
        assert!(l.claims(now).is_empty());
        manager.publish_sm_budget_at(400, now);
        manager.publish_jobs_at(&[], now); // as the monitor does: no job registered anywhere
        let pa = claim_start_percentage(&a, None, now, wait);
        let pb = claim_start_percentage(&b, None, now, wait);
        assert_eq!((pa.pct, pb.pct), (Some(40), Some(MIN_MPS_PERCENTAGE)), "{pa:?} {pb:?}");
        assert_eq!(claim_start_percentage(&a, None, now, wait).pct, Some(40), "job A's next process: job A's share");
        assert!(pa.trouble.is_none() && pb.trouble.is_none());
        assert!(l.offline_jobs().is_empty(), "nobody registered: the claims did it");
        // The lock held elsewhere (a stopped claimer): the floor, said once, nothing claimed.
        let holder = Ledger::open_existing(l.path()).unwrap();
        let held = holder.lock_claims(Duration::ZERO).unwrap().unwrap();
        let pc = claim_start_percentage(&c, None, now + 1, Duration::from_millis(5));
        assert_eq!(pc.pct, Some(MIN_MPS_PERCENTAGE));
        assert!(pc.trouble.as_deref().is_some_and(|t| t.contains("start-claims lock") && t.contains(&*l.path().to_string_lossy())), "{pc:?}");
        drop(held);
        assert!(l.claims(now + 1).iter().all(|c| c.group_id != node_ledger::ledger::group_id_for("job-c")), "unclaimed");
        // A user's percentage within the share is claimed as it is.
        let later = now + 31_000_000_000;
        manager.publish_sm_budget_at(400, later);
        manager.publish_jobs_at(&[], later);
        assert_eq!(claim_start_percentage(&c, Some(35), later, wait).pct, Some(35));
        assert_eq!(claim_start_percentage(&b, None, later, wait).pct, Some(MIN_MPS_PERCENTAGE), "the claims of 31 s ago expired, job C's 35 % held");
        // One above it (a tenant's 100 %) is held to the share: before, it was claimed as it
        // was, and every job after it took the floor.
        let later = later + 31_000_000_000;
        manager.publish_sm_budget_at(400, later);
        manager.publish_jobs_at(&[], later);
        let e = cfg_in(d.path(), "job-e");
        assert_eq!(claim_start_percentage(&e, Some(100), later, wait).pct, Some(40), "the whole budget at most");
        assert_eq!(claim_start_percentage(&b, None, later, wait).pct, Some(MIN_MPS_PERCENTAGE), "job E holds its 40 %, not 100 %");
        let l_claims = l.claims(later);
        let e_claim = l_claims.iter().find(|c| c.group_id == node_ledger::ledger::group_id_for("job-e"));
        assert_eq!(e_claim.and_then(|c| c.mps_pct), Some(40), "claimed at the share: {l_claims:?}");
    }

    /// A pod's ledger shows its own jobs only: the other pods' jobs reach a starting process
    /// through the monitor's jobs table, and without a fresh table it takes the floor.
    #[test]
    fn other_pods_jobs_reach_the_start_share_through_the_monitors_table_and_none_means_the_floor() {
        let d = tempfile::tempdir().unwrap();
        let a = cfg_in(d.path(), "job-a");
        let _own = Ledger::open_or_create(&a.ledger().ledger_path(), 0).unwrap();
        let daemons = Status::open_or_create(&a.ledger().status_path(), 0).unwrap();
        let now = node_ledger::clock::now_ns().saturating_sub(60_000_000_000);
        let wait = node_ledger::claims::CLAIM_LOCK_WAIT;
        daemons.publish_sm_budget_at(400, now);
        let got = claim_start_percentage(&a, None, now, wait);
        assert_eq!(got.pct, Some(MIN_MPS_PERCENTAGE), "no jobs table: other pods unknown, the floor: {got:?}");
        // Claims live 30 s: each step below starts after the last one's claim expired.
        let t1 = now + 31_000_000_000;
        let other = node_ledger::OfflineJob { group_id: node_ledger::ledger::group_id_for("pod-x"), procs: 2, mps_pct: Some(25) };
        daemons.publish_sm_budget_at(400, t1);
        daemons.publish_jobs_at(&[other], t1);
        let b = cfg_in(d.path(), "job-b");
        assert_eq!(claim_start_percentage(&b, None, t1, wait).pct, Some(15), "what pod X's 25 % leaves of 40 %");
        let t2 = t1 + 31_000_000_000;
        daemons.publish_sm_budget_at(400, t2);
        let c = cfg_in(d.path(), "job-c");
        assert_eq!(claim_start_percentage(&c, None, t2, wait).pct, Some(MIN_MPS_PERCENTAGE), "a stale table: the floor");
    }

    #[test]
    fn budget_is_read_only_when_fresh() {
        let d = tempfile::tempdir().unwrap();
        let l = Status::open_or_create(&node_ledger::config::status_path(d.path(), 0), 0).unwrap();
        assert_eq!(
            fresh_budget(&l, node_ledger::clock::now_ns(), 500_000_000),
            None
        );
        let now = node_ledger::clock::now_ns();
        l.publish(&node_ledger::monitor::MonitorSample::default());
        assert_eq!(fresh_budget(&l, now, 500_000_000), None, "the monitor does not publish it");
        l.publish_sm_budget_at(300, now);
        assert_eq!(fresh_budget(&l, now, 500_000_000), Some(0.3));
        assert_eq!(
            fresh_budget(&l, now + 600_000_000, 500_000_000),
            Some(0.3),
            "a few manager periods late is not stale (its loop also runs MPS commands)"
        );
        assert_eq!(
            fresh_budget(&l, now + BUDGET_STALE_NS + 1, 500_000_000),
            None,
            "stale"
        );
    }
}
