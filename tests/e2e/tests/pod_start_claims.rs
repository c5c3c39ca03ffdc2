//! Two offline pods starting one after the other, each in its own ledger (`node_ledger::pods`,
//! mounted as node-agent's Allocate mounts it), split the offline SM budget under the whole
//! node runtime (emulated MPS + `mps-manager` + `sysmonitor`): pod A's library constructor
//! claims its MPS percentage in pod A's ledger, which pod B cannot see; the monitor copies the
//! claim into its jobs table in the status file, and pod B's constructor leaves room for it.
//! Without the table pod B would take the whole budget too (40 % + 40 % against a 40 % budget).
//!
//! All processes run as one user (MPS serves one user at a time); the containers are mount
//! namespaces of their own, made from Allocate's mounts. Needs root. Mechanisms are asserted
//! (percentages, claims, the table), never timings.

mod budget_support;
mod shim_support;

use budget_support::*;
use e2e::{EmuChild, EmuHost};
use node_ledger::ledger::{group_id_for, pod_group_name};
use node_ledger::PodUid;
use shim_support::*;

/// A shimmed client of pod `pod` as [`offline_client`] makes it (held before its first driver
/// call until a line on stdin), in a container of the pod ([`in_pod`]). Returns it and the
/// pod's ledger as the host sees it.
fn pod_client(host: &EmuHost, pod: PodUid) -> (EmuChild, node_ledger::Ledger) {
    let mut inner = limited(host, "shim_client", 256 * MIB, &pod_group_name(&pod.to_string()));
    inner.env_remove(VAR).args(["--hold", "env", VAR, "ctx", "ready", "wait"]);
    let (mut c, path) = in_pod(host, pod, None, false, &inner);
    (host.spawn(&mut c), node_ledger::Ledger::open_existing(&path).expect("the pod's ledger"))
}

/// The percentage a client's shim set before `main` (its `env` line).
fn env_pct(k: &EmuChild) -> u32 {
    k.lines("env=")
        .first()
        .and_then(|l| l.strip_prefix("env="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no percentage set: {:?}\n{}", k.lines("env="), k.stderr()))
}

/// The pod's claims in its own ledger: (group id, percentage).
fn claims(l: &node_ledger::Ledger) -> Vec<(u64, Option<u32>)> {
    l.claims(node_ledger::clock::now_ns()).into_iter().map(|c| (c.group_id, c.mps_pct)).collect()
}

#[test]
fn pods_starting_one_after_the_other_split_the_budget_through_the_monitors_table() {
    if e2e::lacks_root("make mount namespaces") {
        return;
    }
    let (host, _mon, _mgr) = node_with_budget();
    let (a, b) = (
        PodUid::parse("000000aa-0000-4000-8000-0000000000aa").unwrap(),
        PodUid::parse("000000bb-0000-4000-8000-0000000000bb").unwrap(),
    );
    let group = |p: PodUid| group_id_for(&pod_group_name(&p.to_string()));
    let status = node_ledger::Status::open(&node_ledger::config::status_path(host.ledger_dir(), 0)).unwrap();

    // Pod A loads (no driver call yet: nothing registered): the whole budget, claimed in its
    // own ledger; the monitor's table lists pod A as a job of no process yet.
    let (mut ka, la) = pod_client(&host, a);
    ka.wait_for_line("loaded", WAIT).unwrap_or_else(|| panic!("pod A never loaded:\n{}", ka.stderr()));
    assert_eq!(claims(&la), [(group(a), Some(40))], "{}", ka.stderr());
    assert!(claims(&ledger(&host)).is_empty(), "claimed in the GPU's ledger, which pods do not see");
    wait_until("pod A's claim in the monitor's jobs table", || {
        let t = status.read_jobs()?;
        t.jobs.contains(&node_ledger::OfflineJob { group_id: group(a), procs: 0, mps_pct: Some(40) }).then_some(())
    });

    // Pod B loads: its ledger holds nothing of pod A, the table does: the floor.
    let (mut kb, lb) = pod_client(&host, b);
    kb.wait_for_line("loaded", WAIT).unwrap_or_else(|| panic!("pod B never loaded:\n{}", kb.stderr()));
    assert_eq!(claims(&lb), [(group(b), Some(FLOOR))], "pod B left pod A its claim: {}", kb.stderr());

    // Both initialise: MPS fixes the percentages each constructor chose.
    for k in [&mut ka, &mut kb] {
        k.send_line("go");
    }
    for (k, name) in [(&mut ka, "A"), (&mut kb, "B")] {
        k.wait_for_line("ready", WAIT).unwrap_or_else(|| panic!("pod {name} never got a context:\n{}", k.stderr()));
    }
    let on_gpu = |k: &EmuChild| {
        host.device()
            .snapshot()
            .processes
            .iter()
            .find(|p| p.pid == k.pid() && p.mps_client)
            .map(|p| p.active_thread_pct)
            .unwrap_or_else(|| panic!("pid {} is no MPS client", k.pid()))
    };
    assert_eq!((env_pct(&ka), on_gpu(&ka)), (40, 40));
    assert_eq!((env_pct(&kb), on_gpu(&kb)), (FLOOR, FLOOR), "before the table: 40 and 40");
    // Registered, each in its pod's ledger: the table has both pods as running jobs.
    wait_until("both pods running in the monitor's jobs table", || {
        let t = status.read_jobs()?;
        let running = t.for_running();
        (running.contains(&node_ledger::OfflineJob { group_id: group(a), procs: 1, mps_pct: Some(40) })
            && running.contains(&node_ledger::OfflineJob { group_id: group(b), procs: 1, mps_pct: Some(FLOOR) }))
        .then_some(())
    });
    assert_eq!((la.procs().len(), lb.procs().len()), (1, 1));
    leave(&mut ka);
    leave(&mut kb);
}
