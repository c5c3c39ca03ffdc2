//! Two offline jobs whose shims load within each other's window, before either's first driver
//! call (registration), split the offline SM budget under the whole node runtime (emulated
//! MPS + `mps-manager` + `sysmonitor` + shimmed clients): each library constructor claims its
//! MPS percentage in the ledger as it decides it (`node_ledger::claims`), so the second job
//! sees the first's claim. Before, neither saw the other (registration is lazy) and both took
//! the whole budget: 40 % + 40 % against a 40 % budget.
//!
//! And a claim is no offline work: a shell of an offline container loads the shim and claims,
//! and the monitor still judges the GPU's load as online only (no cap subtracted).
//!
//! All processes run as one user: MPS serves one user at a time, and the online load runs in
//! this test process. Mechanisms are asserted (percentages, claims, the monitor's stated
//! judgement), never timings.

mod budget_support;
mod shim_support;

use budget_support::*;
use node_ledger::ledger::group_id_for;
use shim_support::*;

/// The claims in the ledger now: (group name, percentage) for the names given.
fn claims(host: &e2e::EmuHost, names: &[&str]) -> Vec<(String, Option<u32>)> {
    ledger(host)
        .claims(node_ledger::clock::now_ns())
        .into_iter()
        .filter_map(|c| {
            let name = names.iter().find(|n| group_id_for(n) == c.group_id)?;
            Some((name.to_string(), c.mps_pct))
        })
        .collect()
}

#[test]
fn jobs_loading_together_split_the_budget_through_their_start_claims() {
    let (host, _mon, _mgr) = node_with_budget();

    // The claims lock held by someone else all along (a claimer stopped mid-decision): the
    // floor, never the whole budget, said once, and nothing claimed.
    {
        let l = ledger(&host);
        let held = l.lock_claims(std::time::Duration::ZERO).unwrap().expect("claims lock free");
        let mut sh = limited(&host, "sh", 256 * MIB, "job-d");
        sh.env_remove(VAR).args(["-c", &format!("echo env=${VAR}")]);
        let mut k = host.spawn(&mut sh);
        assert_eq!(k.finish(WAIT).trim(), format!("env={FLOOR}"), "{}", k.stderr());
        assert_eq!(k.stderr().matches("start-claims lock stayed held").count(), 1, "{}", k.stderr());
        drop(held);
        assert!(claims(&host, &["job-d"]).is_empty(), "unclaimed");
    }

    // Both jobs loaded, neither has made a driver call: nobody is registered.
    let mut a = offline_client(&host, "job-a", true);
    a.wait_for_line("loaded", WAIT).unwrap_or_else(|| panic!("job A never loaded:\n{}", a.stderr()));
    let mut b = offline_client(&host, "job-b", true);
    b.wait_for_line("loaded", WAIT).unwrap_or_else(|| panic!("job B never loaded:\n{}", b.stderr()));
    assert!(ledger(&host).procs().is_empty(), "registered before any driver call?");
    assert_eq!(
        claims(&host, &["job-a", "job-b"]),
        [("job-a".to_string(), Some(40)), ("job-b".to_string(), Some(FLOOR))],
        "each constructor claimed its percentage: job B saw job A's"
    );

    // Now both initialise together.
    a.send_line("go");
    b.send_line("go");
    for (k, name) in [(&mut a, "A"), (&mut b, "B")] {
        k.wait_for_line("ready", WAIT).unwrap_or_else(|| panic!("job {name} never got a context:\n{}", k.stderr()));
    }
    let (pa, pb) = (percentage(&host, &a), percentage(&host, &b));
    assert_eq!((pa, pb), (40, FLOOR), "job A the budget, job B the floor (before: 40 and 40)");
    assert!(pa + pb <= 40 + FLOOR, "{pa} + {pb}: at most the floor over the budget");
    wait_until("claims withdrawn once registered", || claims(&host, &["job-a", "job-b"]).is_empty().then_some(()));
    leave(&mut a);
    leave(&mut b);
    wait_until("both jobs gone", || ledger(&host).procs().is_empty().then_some(()));

    // A container's shell loads the shim, claims the budget, and never calls CUDA (once the
    // monitor's jobs table, published every 100 ms, no longer lists the jobs that left).
    budget_at_40(&host);
    wait_until("the monitor's jobs table without the jobs that left", || {
        let s = node_ledger::Status::open(&node_ledger::config::status_path(host.ledger_dir(), 0)).ok()?;
        s.read_jobs().is_some_and(|t| t.jobs.is_empty()).then_some(())
    });
    let mut sh = limited(&host, "sh", 256 * MIB, "job-shell");
    sh.env_remove(VAR).args(["-c", &format!("echo env=${VAR}")]);
    let out = run(&host, &mut sh);
    assert_eq!(out, ["env=40"], "the shell started with the whole budget");
    assert_eq!(claims(&host, &["job-shell"]), [("job-shell".to_string(), Some(40))]);
    // The monitor judges the online load whole: a claim is no offline work (it would have
    // taken off a 40 % cap and judged the online share alone).
    let why = cap_judged_with(&host);
    assert!(!why.is_empty() && !why.contains("offline cap"), "judged as online only: {why}");
    // A job starting now leaves room for the shell's claim (for its TTL): the floor.
    budget_at_40(&host);
    let mut c = offline_job(&host, "job-c");
    assert_eq!(percentage(&host, &c), FLOOR);
    leave(&mut c);
}
