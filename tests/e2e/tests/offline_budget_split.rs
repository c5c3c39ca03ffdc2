//! Several offline jobs on one GPU (`max_offline_per_gpu` > 1) share the offline SM budget
//! under the whole node runtime (emulated MPS + `mps-manager` + `sysmonitor` + shimmed
//! offline clients): each job's MPS active-thread percentage, fixed by MPS at client start, is
//! what the other jobs leave of the budget (never below the floor), and the monitor judges
//! co-located load with the sum of the live jobs' percentages. Before, every offline client
//! took the whole budget (two jobs: twice the budget on the GPU) and the monitor subtracted
//! one budget whatever the number of jobs.
//!
//! All processes run as one user: MPS serves one user at a time, and the online load runs in
//! this test process. Mechanisms are asserted (percentages, the monitor's stated cap), never
//! timings.

mod budget_support;
mod shim_support;

use std::time::Duration;

use budget_support::*;
use e2e::EmuChild;
use shim_support::*;

/// The client throttle's `xcuda throttle target changed` log lines.
fn throttle_lines(k: &EmuChild) -> Vec<String> {
    k.stderr()
        .lines()
        .filter(|l| l.contains("throttle target changed"))
        .map(str::to_string)
        .collect()
}

#[test]
fn two_offline_jobs_split_the_budget_and_the_monitor_judges_with_their_sum() {
    let (host, _mon, _mgr) = node_with_budget();

    // Job A alone takes the whole budget; job B finds it all held and gets the floor.
    let mut a = offline_job(&host, "job-a");
    let pa = percentage(&host, &a);
    assert_eq!(pa, 40, "alone: the whole budget");
    let b = offline_job(&host, "job-b");
    let pb = percentage(&host, &b);
    assert_eq!(pb, FLOOR, "the budget is held: the floor");
    assert!(pa + pb <= 40 + FLOOR, "{pa} + {pb}: at most the floor over the budget");
    // Running, each job's part of the budget is in proportion to the jobs' percentages (read
    // on the controller's periodic tick): 40 x 40/50 = 32 % and 40 x 10/50 = 8 %, each under
    // its job's MPS percentage, so both throttles now aim the GPU's load at the budget (job A
    // alone was left to MPS: target 1).
    for (k, part) in [(&a, 0.8), (&b, 0.2)] {
        wait_until("the throttle judging the job's part", || {
            throttle_lines(k)
                .iter()
                .any(|l| (e2e::num(l, "job_part") - part).abs() < 1e-6 && (e2e::num(l, "target") - 0.4).abs() < 1e-6)
                .then_some(())
        });
    }
    // A second process of job B shares job B's share (it does not take another).
    let mut b2 = offline_job(&host, "job-b");
    assert_eq!(percentage(&host, &b2), pb);
    leave(&mut b2);

    // The monitor takes off what the jobs hold, at most the budget: min(40 + 10, 40).
    let why = cap_judged_with(&host);
    assert!(why.contains("offline cap 40 %"), "{why}");

    // Job A leaves: the monitor takes off job B's 10 %, not the 40 % budget.
    leave(&mut a);
    wait_until("job A reclaimed", || {
        ledger(&host).procs().iter().all(|p| p.pid != a.pid()).then_some(())
    });
    // The monitor remembers who is on the GPU for `OCCUPANCY_TTL_MS` (200 ms): let the last
    // answer, with job A, expire.
    std::thread::sleep(Duration::from_millis(400));
    let why = cap_judged_with(&host);
    assert!(why.contains("offline cap 10 %"), "the live jobs' sum: {why}");

    // Job C takes what job B leaves: the two sum to the budget.
    budget_at_40(&host);
    let c = offline_job(&host, "job-c");
    let pc = percentage(&host, &c);
    assert_eq!(pc, 40 - pb, "the budget less job B's share");
    assert_eq!(pb + pc, 40);
}
