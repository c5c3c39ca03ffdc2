//! The monitor as a real process against the GPU emulator (fake NVML over the emulated device):
//! Overlimit eviction and hold, trust-but-verify, SIGHUP reload, restart without double eviction.

mod shim_support;

use std::time::Duration;

use e2e::{monitor_state as state, register, EmuChild, EmuHost, Load};
use node_ledger::Ledger;
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

/// Judges SM activity only (the emulator's utilization and clock follow it anyway), with a
/// short hold and grace so the test stays short.
fn config(hold_ms: u64, grace_ms: u64) -> String {
    format!(
        r#"{{
  "interval_ms": 10,
  "state_file_every_ms": 10,
  "host_memory": {{ "enabled": false }},
  "machine": {{
    "gpu_util":    {{ "healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false }},
    "sm_activity": {{ "healthy": 30, "unhealthy": 60, "overlimit": 80 }},
    "sm_clock":    {{ "healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false }},
    "mem_used":    {{ "healthy": 80, "unhealthy": 90, "overlimit": 95 }},
    "overlimit_sustain_ms": 0,
    "hold_base_ms": {hold_ms},
    "hold_max_ms": 60000
  }},
  "evictor": {{ "grace_ms": {grace_ms} }},
  "verify": {{ "every_ms": 50, "strikes": 2, "tolerance_mib": 16 }}
}}
"#
    )
}

/// The monitor with `cfg` (as `mon.json`) once it reports Healthy, and the ledger it created.
fn healthy(n: &EmuHost, cfg: &str) -> (EmuChild, Ledger) {
    let mon = n.start_monitor("mon.json", cfg);
    n.wait_state(T, "healthy", |v| state(v) == "healthy");
    (mon, Ledger::open_existing(&n.ledger_path()).unwrap())
}

/// A `sleep` registered in `ledger` as an offline process (holding the ledger open).
fn offline_sleeper(n: &EmuHost, ledger: &Ledger) -> EmuChild {
    let c = n.spawn_sh_offline("exec sleep 60");
    register(ledger, c.pid(), 0);
    c
}

/// Not a test: the entry point of helper processes the tests spawn (`spawn_helper`).
#[test]
#[ignore = "helper-process entry point, run by the other tests"]
fn helper_entry() {
    e2e::helper_main();
}

/// With no offline process registered (and the GPU Healthy) the monitor samples at the idle
/// pace (`idle_interval_ms`, 100 by default): over a second of its own clock it takes at most
/// one sample per 100 ms (a slow machine only takes fewer; at `interval_ms` it would be ~100).
/// A registration brings `interval_ms` back, and the last one leaving restores the idle pace.
#[test]
fn without_offline_work_the_monitor_samples_at_the_idle_pace_and_a_registration_restores_the_full_one() {
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let a = n.wait_state(T, "the idle pace", |v| v["sampling_ms"] == 100);
    assert_eq!(a["interval_ms"], 10, "the configured interval is still reported");
    assert_eq!(a["offline_registered"], 0);
    std::thread::sleep(Duration::from_secs(1));
    let t = a["updated_mono_ms"].as_u64().unwrap();
    let b = n.wait_state(T, "a later idle snapshot", |v| {
        v["updated_mono_ms"].as_u64().unwrap_or(0) >= t + 1000 && v["sampling_ms"] == 100
    });
    let samples = b["samples"].as_u64().unwrap() - a["samples"].as_u64().unwrap();
    let ms = b["updated_mono_ms"].as_u64().unwrap() - t;
    assert!(
        samples <= ms / 100 + 2,
        "{samples} samples in {ms} ms of the monitor's clock: faster than the idle pace"
    );

    let mut off = offline_sleeper(&n, &ledger);
    n.wait_state(T, "the full pace with an offline process", |v| {
        v["sampling_ms"] == 10 && v["offline_registered"] == 1
    });
    off.kill9();
    n.wait_state(T, "the idle pace once its registration was reclaimed", |v| {
        v["sampling_ms"] == 100 && v["offline_registered"] == 0
    });
}

#[test]
fn online_burst_overlimit_sigterms_offline_at_once_and_holds_before_healthy() {
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let mut offline = offline_sleeper(&n, &ledger);
    let mut online_bystander = n.spawn_sh("exec sleep 60");

    let load = Load::start(&n, 1.0, 5.0);
    let sig = offline
        .wait_exit(T)
        .expect("offline process was not evicted");
    assert_eq!(sig, Some(libc::SIGTERM), "evicted with SIGTERM");
    let v = n.wait_state(T, "eviction recorded", |v| v["evictions"]["overlimit"] == 1);
    assert_eq!(state(&v), "overlimit");
    let lag = v["overlimit_eviction_lag_samples"].as_u64().unwrap();
    assert!(
        lag <= 2,
        "SIGTERM {lag} samples after the Overlimit decision"
    );
    assert!(
        online_bystander.alive(),
        "a process not registered as offline is never touched"
    );

    // Online burst ends: the monitor must stay Overlimit for the whole hold, then Unhealthy,
    // and only then Healthy.
    load.stop();
    // Judged on the monitor's own clock: the largest hold left it reported while calm, and the
    // time it reported leaving Overlimit (robust to when this test happens to read the file).
    let seen = std::cell::Cell::new(None::<(u64, u64)>);
    let left = n.wait_state(T, "leaving overlimit", |v| {
        if state(v) == "overlimit" {
            if let (Some(r), Some(t)) = (
                v["hold_remaining_ms"].as_u64(),
                v["updated_mono_ms"].as_u64(),
            ) {
                if seen.get().is_none_or(|(_, br)| r > br) {
                    seen.set(Some((t, r)));
                }
            }
        }
        state(v) != "overlimit"
    });
    let (t1, r_max) = seen
        .get()
        .expect("the monitor never reported a running hold");
    assert_eq!(left["hold_ms"], 400);
    assert!(
        r_max + 50 >= 400,
        "the hold started at {r_max} ms left, expected about 400"
    );
    let t2 = left["updated_mono_ms"].as_u64().unwrap();
    assert!(
        t2 + 20 >= t1 + r_max,
        "left Overlimit {} ms after a report of {r_max} ms hold left",
        t2 - t1
    );
    let healthy = n.wait_state(T, "healthy again", |v| state(v) == "healthy");
    let last = &healthy["last_transition"];
    assert_eq!(
        last[0], "unhealthy",
        "Healthy is reached through Unhealthy: {last}"
    );
    assert!(n
        .log("mon.json")
        .contains("evicting offline process (SIGTERM)"));
}

#[test]
fn liar_is_evicted_honest_process_is_not() {
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let mut liar = n.spawn_helper_offline("gpu-mem", "2048");
    let mut honest = n.spawn_helper_offline("gpu-mem", "1024");
    let dev = n.device();
    let (lp, hp) = (liar.pid(), honest.pid());
    let deadline = std::time::Instant::now() + T;
    while !(dev.snapshot().processes.iter().any(|p| p.pid == lp)
        && dev.snapshot().processes.iter().any(|p| p.pid == hp))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "helpers never reached the device"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    register(&ledger, lp, 0);
    register(&ledger, hp, 1024 << 20);
    let sig = liar
        .wait_exit(T)
        .expect("the under-reporting process was not evicted");
    assert_eq!(sig, Some(libc::SIGTERM));
    let v = n.wait_state(T, "under_report counted", |v| {
        v["evictions"]["under_report"] == 1
    });
    assert_eq!(
        state(&v),
        "healthy",
        "a liar does not change the GPU's health"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(honest.alive(), "the honest process is left alone");
    // NVML counts the liar's context too (the verify allowance, `verify.context_mib`, covers it
    // for the honest one).
    let seen = 2048 + n.context_bytes() / (1 << 20);
    assert!(
        n.log("mon.json").contains(&format!(
            "reports 0 MiB in the ledger but NVML sees {seen} MiB"
        )),
        "{}",
        n.log("mon.json")
    );
}

/// Any process that can open the ledger can write any slot. A slot naming a process that
/// holds no ledger open (an online GPU user, by its exact pid and start time: the strongest
/// forgery, made under a lock the forger holds so no reclaim frees it) reporting none of the
/// 2 GiB it holds is no offline process: it is not verified, not evicted, and the monitor says
/// so. The control: a real offline process (holding the ledger) under-reporting beside it is
/// evicted, so verification ran.
#[test]
fn a_slot_naming_a_process_that_holds_no_ledger_never_gets_it_signalled() {
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let mut online = n.spawn_helper("gpu-mem", "2048");
    let mut liar = n.spawn_helper_offline("gpu-mem", "1024");
    let dev = n.device();
    let (on, lp) = (online.pid(), liar.pid());
    e2e::wait_until("both helpers on the device", T, || {
        let s = dev.snapshot();
        (s.processes.iter().any(|p| p.pid == on) && s.processes.iter().any(|p| p.pid == lp)).then_some(())
    });
    let start = node_ledger::procinfo::start_time(on).unwrap();
    let _forged = e2e::forge_slot(&ledger, on, start, 0);
    register(&ledger, lp, 0);
    let sig = liar.wait_exit(T).expect("the under-reporting offline process was not evicted");
    assert_eq!(sig, Some(libc::SIGTERM));
    n.wait_state(T, "under_report counted", |v| v["evictions"]["under_report"].as_u64() >= Some(1));
    // Several more verification periods (50 ms each) in which the forged slot could be acted on.
    std::thread::sleep(Duration::from_millis(500));
    assert!(online.alive(), "the process a forged slot named was evicted:\n{}", n.log("mon.json"));
    let v = n.wait_state(T, "a fresh state", |_| true);
    assert_eq!(v["evictions"]["under_report"], 1, "{v:#}");
    n.wait_log(T, "the forged slot reported", "mon.json", |l| {
        l.contains("holds no lock on that slot") && l.contains(&format!("host_pid={on}"))
    });
}

/// A tenant copies a registered offline process's identity (its pid namespace, pid and start
/// time, which any ledger client can read from its slot) into a slot of its own reporting
/// none of the memory the process holds: the copy is no slot of that process (it holds no lock
/// there), so the honest process is never evicted for it, and the monitor says so. Before,
/// the monitor kept a found process by its identity alone: the copy, looked up after the
/// genuine slot, got the victim's host pid unchecked and the victim was SIGTERMed as
/// under-reporting. The control: a real under-reporter registered after the copy is evicted.
#[test]
fn a_copy_of_an_offline_processs_identity_in_another_slot_never_gets_it_signalled() {
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let mut victim = n.spawn_helper_offline("gpu-mem", "1024");
    let mut liar = n.spawn_helper_offline("gpu-mem", "1024");
    let dev = n.device();
    let (vp, lp) = (victim.pid(), liar.pid());
    e2e::wait_until("both helpers on the device", T, || {
        let s = dev.snapshot();
        (s.processes.iter().any(|p| p.pid == vp) && s.processes.iter().any(|p| p.pid == lp)).then_some(())
    });
    register(&ledger, vp, 1024 << 20);
    let start = node_ledger::procinfo::start_time(vp).unwrap();
    let _copy = e2e::forge_slot(&ledger, vp, start, 0);
    register(&ledger, lp, 0);
    let sig = liar.wait_exit(T).expect("the under-reporting offline process was not evicted");
    assert_eq!(sig, Some(libc::SIGTERM));
    n.wait_state(T, "under_report counted", |v| v["evictions"]["under_report"].as_u64() >= Some(1));
    // Several more verification periods (50 ms each) in which the copy could be acted on.
    std::thread::sleep(Duration::from_millis(500));
    assert!(victim.alive(), "the process whose identity was copied was evicted:\n{}", n.log("mon.json"));
    let v = n.wait_state(T, "a fresh state", |_| true);
    assert_eq!(v["evictions"]["under_report"], 1, "{v:#}");
    n.wait_log(T, "the copy reported", "mon.json", |l| {
        l.contains("holds no lock on that slot") && l.contains(&format!("host_pid={vp}"))
    });
}

/// A tenant's under-reporting process writes a copy of its own identity into a lower slot
/// than its genuine one (looked up first): the copy fails its lock check, and the genuine
/// slot is still verified, so the process is evicted. Before, the copy's failure backed the
/// identity off (1 s doubling to 64 s) and the genuine slot got no host pid for as long as
/// the copy was there: the process was never verified nor signalled.
#[test]
fn a_copy_of_its_own_identity_in_a_lower_slot_does_not_hide_an_under_reporter() {
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let mut liar = n.spawn_helper_offline("gpu-mem", "1024");
    let dev = n.device();
    let lp = liar.pid();
    e2e::wait_until("the helper on the device", T, || dev.snapshot().processes.iter().any(|p| p.pid == lp).then_some(()));
    let start = node_ledger::procinfo::start_time(lp).unwrap();
    let copy = e2e::forge_slot(&ledger, lp, start, 0);
    let genuine = register(&ledger, lp, 0);
    assert!(copy.slot < genuine.slot, "the copy is looked up first");
    let sig = liar.wait_exit(T).expect("the under-reporting process hidden behind a copy was not evicted");
    assert_eq!(sig, Some(libc::SIGTERM));
    n.wait_state(T, "under_report counted", |v| v["evictions"]["under_report"].as_u64() >= Some(1));
}

/// Offline work that escapes the shim (a launcher that sanitises its children's environment,
/// a static CUDA runtime) has no registration: no memory quota, no launch throttle, and the
/// monitor took it for online load, so an overload it caused evicted its registered
/// neighbours and never it. A GPU process in the pid namespace of a registered offline
/// process, with no registration of its own, is offline work without the shim: evicted
/// (SIGTERM by its host pid, under_report), its registered neighbour left alone. Root only
/// (`unshare --pid`: the container's pid namespace).
#[test]
fn a_gpu_process_in_an_offline_container_without_the_shim_is_evicted() {
    if e2e::lacks_root("unshare --pid for the offline container") {
        return;
    }
    let n = EmuHost::node();
    let (_mon, _ledger) = healthy(&n, &config(400, 5000));
    let helper = |role: &str, mib: u32| {
        format!("NODE_TEST_HELPER={role} NODE_TEST_ARG={mib} \"$0\" --exact helper_entry --ignored --nocapture --test-threads=1 &")
    };
    let script = format!("{} {} wait", helper("gpu-mem-registered", 64), helper("gpu-mem", 128));
    let mut c = n.node_command("unshare");
    c.args(["--pid", "--fork", "--kill-child", "sh", "-c", &script])
        .arg(std::env::current_exe().unwrap());
    let container = n.spawn(&mut c);
    let dev = n.device();
    let children = |pid: u32| -> Vec<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|k| k.parse().ok())
            .collect()
    };
    let role_of = |pid: u32| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        env.split(|&b| b == 0)
            .find_map(|v| v.strip_prefix(b"NODE_TEST_HELPER=").map(|r| String::from_utf8_lossy(r).into_owned()))
    };
    let (registered, unshimmed) = e2e::wait_until("both helpers of the container on the device", T, || {
        let sh = *children(container.pid()).first()?;
        let kids = children(sh);
        let find = |r: &str| kids.iter().copied().find(|&k| role_of(k).as_deref() == Some(r));
        let (a, b) = (find("gpu-mem-registered")?, find("gpu-mem")?);
        let on_device = |p: u32| dev.snapshot().processes.iter().any(|q| q.pid == p);
        (on_device(a) && on_device(b)).then_some((a, b))
    });
    e2e::wait_until("the unshimmed process evicted", T, || node_ledger::procinfo::is_gone(unshimmed).then_some(()));
    let v = n.wait_state(T, "the eviction counted", |v| v["evictions"]["under_report"].as_u64() >= Some(1));
    assert_eq!(v["evictions"]["under_report"], 1, "{v:#}");
    assert!(!node_ledger::procinfo::is_gone(registered), "the registered neighbour was evicted:\n{}", n.log("mon.json"));
    let log = n.log("mon.json");
    assert!(
        log.contains("offline work running without the shim") && log.contains(&format!("host_pid={unshimmed}")),
        "{log}"
    );
}

/// A pod none of whose processes registered (all its GPU work runs without the shim) left the
/// monitor nothing to see it by: its GPU process was taken for online load, kept its memory
/// and drove evictions of others. With node-agent's list of the offline pods on the node
/// (`<ledger_dir>/offline-pods.json`), a GPU process whose cgroup names a listed pod and that
/// has no registration is evicted (SIGTERM by its host pid, under_report), and the eviction
/// log names its pod, by which node-agent evicts the pod through the API. Holding the ledger
/// file open (anyone in the container can open it) is no pass for a process whose parent is not
/// a registered one: the rogue here holds it. A GPU process of another pod (an online
/// service's) is left alone, and nothing happens before the list is there. Root only (a real
/// cgroup per pod).
#[test]
fn a_gpu_process_of_a_listed_offline_pod_with_no_registration_anywhere_is_evicted() {
    if e2e::lacks_root("make a cgroup per pod") {
        return;
    }
    const OFFLINE_POD: &str = "6d1c2b3a-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
    const ONLINE_POD: &str = "0a9b8c7d-6e5f-4d3c-8b2a-1f0e9d8c7b6a";
    let off_cg = e2e::PodCgroup::create(OFFLINE_POD).expect("a cgroup for the offline pod");
    let on_cg = e2e::PodCgroup::create(ONLINE_POD).expect("a cgroup for the online pod");
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let mut online = n.spawn_helper("gpu-mem", "96");
    let mut rogue = n.spawn_helper_offline("gpu-mem", "128");
    on_cg.add(online.pid()).unwrap();
    off_cg.add(rogue.pid()).unwrap();
    let dev = n.device();
    e2e::wait_until("both processes on the device", T, || {
        let on_device = |p: u32| dev.snapshot().processes.iter().any(|q| q.pid == p);
        (on_device(online.pid()) && on_device(rogue.pid())).then_some(())
    });
    assert!(ledger.procs().is_empty(), "no process registered: {:?}", ledger.procs());
    // Ten verifications (50 ms, 2 strikes) with no list: nothing tells the rogue from online load.
    std::thread::sleep(Duration::from_millis(500));
    assert!(rogue.alive() && online.alive());
    let v = n.wait_state(T, "a fresh state", |_| true);
    assert_eq!(v["evictions"]["under_report"].as_u64().unwrap_or(0), 0, "{v:#}");
    assert_eq!(v["offline_pods"], Value::Null, "no list read: {v:#}");

    let pod = |uid: &str, name: &str| node_daemon::offline_pods::OfflinePod {
        uid: uid.into(),
        namespace: "train".into(),
        name: name.into(),
        memory_quota_bytes: None,
    };
    let list = node_daemon::offline_pods::OfflinePods::new("node-1", 1, vec![pod(OFFLINE_POD, "job-0")]);
    node_daemon::offline_pods::write(&node_daemon::offline_pods::path(n.ledger_dir()), &list).unwrap();
    assert_eq!(rogue.wait_exit(T), Some(Some(libc::SIGTERM)), "the rogue ended by the monitor's SIGTERM");
    let v = n.wait_state(T, "the eviction counted", |v| v["evictions"]["under_report"].as_u64() >= Some(1));
    assert_eq!(v["evictions"]["under_report"], 1, "{v:#}");
    assert_eq!((&v["offline_pods"]["pods"], &v["offline_pods"]["error"]), (&1.into(), &Value::Null), "{v:#}");
    assert!(online.alive(), "the online pod's process was evicted:\n{}", n.log("mon.json"));
    let log = n.log("mon.json");
    assert!(
        log.contains("in offline pod train/job-0") && log.contains("offline work running without the shim"),
        "{log}"
    );
    let batch = node_ledger::evictlog::read_from(n.ledger_dir(), 0, None, 1 << 20).unwrap();
    let recs: Vec<_> = batch.entries.into_iter().filter_map(|e| e.record).collect();
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(
        (recs[0].pid, recs[0].group_id, recs[0].pod_uid.as_deref(), recs[0].reason.as_str()),
        (rogue.pid(), 0, Some(OFFLINE_POD), "under_report"),
        "{recs:?}"
    );
}

#[test]
fn sighup_with_a_broken_config_keeps_the_old_one_and_says_why() {
    let n = EmuHost::node();
    let mut mon = n.start_monitor("mon.json", &config(400, 5000));
    n.wait_state(T, "healthy", |v| state(v) == "healthy");
    let cfg = n.path("mon.json");
    let good = std::fs::read_to_string(&cfg).unwrap();

    std::fs::write(
        &cfg,
        good.replace(
            r#""healthy": 30, "unhealthy": 60"#,
            r#""healthy": 70, "unhealthy": 60"#,
        ),
    )
    .unwrap();
    mon.signal(libc::SIGHUP);
    let v = n.wait_state(T, "config error reported", |v| {
        v["config_error"].is_string()
    });
    let err = v["config_error"].as_str().unwrap();
    assert!(
        err.contains("mon.json:7")
            && err.contains("machine.sm_activity")
            && err.contains("healthy < unhealthy"),
        "{err}"
    );
    assert_eq!(v["interval_ms"], 10);

    std::fs::write(&cfg, "{ \"interval_ms\": 20,\n  \"machine\": { oops } }").unwrap();
    mon.signal(libc::SIGHUP);
    let v = n.wait_state(T, "syntax error reported", |v| {
        v["config_error"]
            .as_str()
            .is_some_and(|e| e.contains("invalid JSON"))
    });
    assert!(
        v["config_error"].as_str().unwrap().contains("mon.json:2"),
        "{}",
        v["config_error"]
    );
    assert!(mon.alive(), "a broken reload never stops the monitor");
    assert_eq!(v["interval_ms"], 10, "old config still in force");

    std::fs::write(
        &cfg,
        good.replace(r#""interval_ms": 10"#, r#""interval_ms": 20"#),
    )
    .unwrap();
    mon.signal(libc::SIGHUP);
    let v = n.wait_state(T, "good reload", |v| {
        v["config_error"].is_null() && v["interval_ms"] == 20
    });
    assert_eq!(v["config_reloads"], 1);
    assert!(n
        .log("mon.json")
        .contains("config reload failed; keeping the previous config"));
}

#[test]
fn monitor_restarted_mid_eviction_signals_nothing_twice() {
    let n = EmuHost::node();
    let grace = 1500;
    let (mut mon, ledger) = healthy(&n, &config(400, grace));
    let terms = n.path("terms");
    // Counts every SIGTERM it gets and ignores it: only SIGKILL ends it.
    let mut victim = n.spawn_sh_offline(&format!(
        "trap 'echo t >> {0}' TERM; : > {0}.ready; while :; do sleep 0.02; done",
        terms.display()
    ));
    // Register only once the trap is in place, or an early SIGTERM would just kill the shell.
    let ready = n.path("terms.ready");
    let deadline = std::time::Instant::now() + T;
    while !ready.exists() {
        assert!(std::time::Instant::now() < deadline, "victim never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    register(&ledger, victim.pid(), 0);
    let _load = Load::start(&n, 1.0, 5.0);
    let deadline = std::time::Instant::now() + T;
    while std::fs::read_to_string(&terms).map_or(0, |s| s.lines().count()) == 0 {
        assert!(std::time::Instant::now() < deadline, "no SIGTERM");
        std::thread::sleep(Duration::from_millis(5));
    }
    mon.signal(libc::SIGKILL);
    let _ = mon.wait_exit(T);
    let first_entries = n.wait_state(T, "state file", |_| true)["overlimit_entries_mono_ms"]
        .as_array()
        .unwrap()
        .len();

    let restarted = n.start_monitor("mon.json", "");
    // The restarted monitor resumes the Overlimit stay (monitor_restart.rs): its history, with
    // no second entry for the same overload, and the hold of that entry. Read from what it
    // logs as it starts, not from a later state file: GPM's SM activity over a refresh period
    // that began before the load can read low enough to end the hold, and the load, still
    // running, then brings a new entry.
    let entries = first_entries as u32;
    let hold = 400 * 2u64.pow(entries - 1);
    let log = e2e::wait_until("the restarted monitor to resume the hold", T, || {
        let l = n.log("mon.json");
        l.contains("resumed the Overlimit hold of an earlier monitor run").then_some(l)
    });
    assert!(
        log.contains(&format!("resumed Overlimit history from the state file entries={first_entries}")),
        "Overlimit history resumed, the same stay counted once:\n{log}"
    );
    assert!(
        log.contains(&format!("resumed the Overlimit hold of an earlier monitor run gpu=0 hold_ms={hold}")),
        "entry {entries} in the window: hold doubled per earlier entry:\n{log}"
    );
    let sig = victim
        .wait_exit(T)
        .expect("victim never killed after the grace period");
    assert_eq!(sig, Some(libc::SIGKILL));
    assert_eq!(
        std::fs::read_to_string(&terms).unwrap().lines().count(),
        1,
        "SIGTERM sent exactly once across the restart"
    );
    let v = n.wait_state(T, "restarted monitor", |v| {
        v["monitor_pid"].as_u64() == Some(u64::from(restarted.pid()))
    });
    assert_eq!(
        v["evictions"].as_object().map_or(0, |m| m.len()),
        0,
        "the restarted monitor started no eviction of its own"
    );
    assert!(n
        .log("mon.json")
        .contains("resumed eviction recorded by an earlier monitor run"));
}

#[test]
fn host_memory_pressure_evicts_offline_work() {
    let n = EmuHost::node();
    let meminfo = n.path("meminfo");
    std::fs::write(&meminfo, "MemTotal: 1000000 kB\nMemAvailable: 500000 kB\n").unwrap();
    let cfg = config(400, 5000).replace(
        r#""host_memory": { "enabled": false }"#,
        &format!(r#""host_memory": {{ "enabled": true, "min_available_pct": 5, "check_every_ms": 20, "meminfo_path": "{}", "psi_path": "/nonexistent" }}"#, meminfo.display()),
    );
    let _mon = n.start_monitor("mon.json", &cfg);
    n.wait_state(T, "healthy with host memory read", |v| {
        state(v) == "healthy" && v["host_mem_available_pct"] == 50.0
    });
    let ledger = node_ledger::Ledger::open_existing(&n.ledger_path()).unwrap();
    let mut offline = offline_sleeper(&n, &ledger);
    std::thread::sleep(Duration::from_millis(200));
    assert!(offline.alive(), "no pressure, no eviction");
    std::fs::write(&meminfo, "MemTotal: 1000000 kB\nMemAvailable: 20000 kB\n").unwrap();
    assert_eq!(
        offline.wait_exit(T).expect("not evicted"),
        Some(libc::SIGTERM)
    );
    let v = n.wait_state(T, "host_memory eviction counted", |v| {
        v["evictions"]["host_memory"] == 1
    });
    assert_eq!(
        state(&v),
        "healthy",
        "host pressure evicts without touching GPU health"
    );
    assert!(n
        .log("mon.json")
        .contains("host MemAvailable 2.0% below 5.0%"));
}

#[test]
fn operator_disable_evicts_and_enable_goes_back_through_init() {
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let mut offline = offline_sleeper(&n, &ledger);
    let cfg = n.path("mon.json");
    let cli = |cmd: &str| {
        let out = n
            .node_command("sysmonitor")
            .args([cmd, "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    cli("disable");
    assert_eq!(
        offline.wait_exit(T).expect("not evicted"),
        Some(libc::SIGTERM)
    );
    let v = n.wait_state(T, "disabled", |v| {
        state(v) == "disabled" && v["evictions"]["disabled"] == 1
    });
    assert_eq!(v["disabled_by"], "operator");
    assert!(cli("status").contains("DISABLED by Operator"));
    cli("enable");
    let v = n.wait_state(T, "healthy again", |v| state(v) == "healthy");
    assert_eq!(
        v["last_transition"][0], "init",
        "re-enabled GPUs go through Init: {v:#}"
    );
}

/// The GPU's shared ledger damaged under a running monitor (its magic overwritten: any local
/// user can, the file is `0666`): its registered offline process is still offline work, and
/// the operator's `disable` still evicts it. Before, a damaged ledger's processes were listed
/// no more: no eviction reached them until the monitor restarted.
#[test]
fn a_damaged_ledgers_offline_process_is_still_evicted() {
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 5000));
    let mut offline = offline_sleeper(&n, &ledger);
    n.wait_state(T, "registered", |v| v["offline_registered"] == 1);
    std::fs::OpenOptions::new()
        .write(true)
        .open(n.ledger_path())
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"NOTLEDGR"))
        .unwrap();
    n.wait_state(T, "damage found", |v| v["ledger_error"].is_string());
    let out = n.node_command("sysmonitor").args(["disable", "--config"]).arg(n.path("mon.json")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(offline.wait_exit(T).expect("not evicted"), Some(libc::SIGTERM));
    n.wait_state(T, "evicted, gone", |v| v["evictions"]["disabled"] == 1 && v["offline_registered"] == 0);
}

/// An offline job in a pid namespace of its own (a container: the job is its pid 1) that
/// ignores SIGTERM: the operator's `disable` evicts it, and after the grace the monitor
/// SIGKILLs it by its host pid, found from its namespace and pid there. Before, a process of
/// another namespace got the ledger request only (its shim raises SIGTERM, ignored here) and
/// no SIGKILL ever; and a ledger pid of 1 was refused outright. Root only (`unshare --pid`).
#[test]
fn a_container_job_ignoring_sigterm_is_sigkilled_by_its_host_pid_after_grace() {
    if e2e::lacks_root("unshare --pid for the offline job") {
        return;
    }
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &config(400, 1000));
    let empty = n.path("xcuda-empty.json");
    std::fs::write(&empty, "{}").unwrap();
    let mut c = n.command("unshare");
    c.args(["--pid", "--fork", "sh", "-c"])
        .arg("trap '' TERM; LD_PRELOAD=\"$JOB_SHIM\" exec \"$JOB_CLIENT\" ctx alloc 1048576 ready hang")
        .env("JOB_SHIM", e2e::artifact("libxcuda.so"))
        .env("JOB_CLIENT", e2e::artifact("shim_client"))
        .env("XSHARE_LEDGER_DIR", n.ledger_dir())
        .env("XCUDA_CONFIG", &empty)
        .env("XCUDA_GROUP", "container-job");
    let mut job = n.spawn(&mut c);
    assert!(job.wait_for_line("ready", T).is_some(), "{}", job.stderr());
    let own = node_ledger::procinfo::own_pid_ns();
    let reg = ledger.procs().into_iter().find(|p| p.pid_ns != own).expect("registered from its namespace");
    assert_eq!(reg.pid, 1, "the container's entrypoint");
    let cfg = n.path("mon.json");
    let out = n.node_command("sysmonitor").args(["disable", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // unshare exits once its child is gone: the job was killed.
    assert!(job.wait_exit(T).is_some(), "the job outlived its grace: {}", job.stderr());
    let v = n.wait_state(T, "the kill counted", |v| v["kills"].as_u64() >= Some(1));
    assert_eq!(v["evictions"]["disabled"], 1, "{v:#}");
    assert!(
        n.log("mon.json").contains("grace period over: SIGKILL"),
        "{}",
        n.log("mon.json")
    );
}

#[test]
fn tells_systemd_ready_then_keeps_the_watchdog_fed() {
    let n = EmuHost::node();
    let sock_path = n.path("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    let cfg = n.path("mon.json");
    std::fs::write(&cfg, config(400, 5000)).unwrap();
    let mut mon = n.spawn(
        n.node_command("sysmonitor")
            .args(["run", "--config"])
            .arg(&cfg)
            .env("NOTIFY_SOCKET", &sock_path)
            .env("WATCHDOG_USEC", "2000000"),
    );
    let mut buf = [0u8; 256];
    let mut msgs = Vec::new();
    while msgs
        .iter()
        .filter(|m: &&String| m.contains("WATCHDOG=1"))
        .count()
        < 3
    {
        let k = sock.recv(&mut buf).expect("no sd_notify message");
        msgs.push(String::from_utf8_lossy(&buf[..k]).into_owned());
    }
    assert_eq!(msgs[0], "READY=1", "readiness first: {msgs:?}");
    assert!(
        msgs.iter().any(|m| m.contains("STATUS=GPU 0 healthy")),
        "{msgs:?}"
    );
    mon.signal(libc::SIGTERM);
    assert_eq!(mon.wait_exit(T), Some(None), "clean exit on SIGTERM");
    loop {
        let k = sock.recv(&mut buf).expect("no STOPPING");
        if &buf[..k] == b"STOPPING=1" {
            break;
        }
    }
}

#[test]
fn critical_xid_in_the_kernel_log_disables_and_evicts_until_quiet() {
    let n = EmuHost::node();
    let klog = n.path("kern.log");
    std::fs::write(&klog, "").unwrap();
    let cfg = config(400, 5000).replace(
        r#""verify":"#,
        &format!(
            r#""xid_log": "{}", "xid_log_match": "PCI:0000:01:00", "verify":"#,
            klog.display()
        ),
    );
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&klog)
        .unwrap();
    xids_disable_and_evict_until_quiet(&n, &cfg, |code, this_gpu| {
        if !this_gpu {
            writeln!(f, "NVRM: Xid (PCI:0000:02:00): {code}, pid=1, another GPU").unwrap();
        } else if code == 79 {
            writeln!(f, "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', GPU has fallen off the bus.").unwrap();
        } else {
            writeln!(f, "NVRM: Xid (PCI:0000:01:00): {code}, pid=1, name=train, Ch 00000010").unwrap();
        }
    });
}

/// The same through NVML's event set (`nvmlEventTypeXidCriticalError`), the monitor's default
/// XID source: the emulated driver reports each XID as `gpuemu xid` names it.
#[test]
fn critical_xid_from_an_nvml_event_set_disables_and_evicts_until_quiet() {
    let n = EmuHost::node();
    let cfg = config(400, 5000);
    xids_disable_and_evict_until_quiet(&n, &cfg, |code, this_gpu| {
        if this_gpu {
            let out = n.command("gpuemu").args(["xid", &code.to_string(), "1"]).output().unwrap();
            assert!(out.status.success(), "gpuemu xid: {}", String::from_utf8_lossy(&out.stderr));
        }
    });
    assert!(n.log("mon.json").contains("xid_events=true"), "the NVML event set was registered: {}", n.log("mon.json"));
}

/// With monitor config `cfg` (its XID source), `report(code, this_gpu)` reporting XIDs: another
/// GPU's XID and the application XIDs (one process's page fault, engine exception, cleanup)
/// change nothing; XID 79 disables the GPU, evicts the offline process, and the GPU comes back
/// after `xid_disable_ms` of quiet.
fn xids_disable_and_evict_until_quiet(n: &EmuHost, cfg: &str, mut report: impl FnMut(u64, bool)) {
    let cfg = cfg.replace(
        r#""hold_max_ms": 60000"#,
        r#""hold_max_ms": 60000, "xid_disable_ms": 500"#,
    );
    let (_mon, ledger) = healthy(n, &cfg);
    let mut offline = offline_sleeper(n, &ledger);
    report(79, false);
    for x in [13, 31, 43, 45] {
        report(x, true);
    }
    // Each XID the monitor takes is logged with its `xid=` field, critical or not.
    n.wait_log(T, "the XIDs read", "mon.json", |l| l.matches("xid=").count() >= 4);
    let seen = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let v = n.wait_state(T, "a state after the XIDs", |v| {
        v["updated_unix_ms"].as_u64().is_some_and(|t| t > seen + 50)
    });
    assert_eq!(state(&v), "healthy", "{v:#}");
    assert!(
        offline.alive(),
        "other GPUs' and application XIDs change nothing"
    );
    report(79, true);
    assert_eq!(
        offline.wait_exit(T).expect("not evicted"),
        Some(libc::SIGTERM)
    );
    let v = n.wait_state(T, "disabled by xid", |v| state(v) == "disabled");
    assert_eq!(v["disabled_by"]["xid"], 79);
    assert_eq!(v["evictions"]["disabled"], 1);
    let v = n.wait_state(T, "healthy after the quiet time", |v| state(v) == "healthy");
    assert_eq!(v["last_transition"][0], "init");
}

#[test]
fn metrics_endpoint_serves_prometheus_text_on_a_unix_socket() {
    use std::io::{Read, Write};
    let n = EmuHost::node();
    let sock = n.path("metrics.sock");
    let cfg = config(400, 5000).replace(
        r#""interval_ms": 10,"#,
        &format!(
            r#""interval_ms": 10, "metrics_listen": "unix:{}","#,
            sock.display()
        ),
    );
    let _mon = n.start_monitor("mon.json", &cfg);
    n.wait_state(T, "healthy", |v| state(v) == "healthy");
    let body = {
        let end = std::time::Instant::now() + T;
        loop {
            let mut s = match std::os::unix::net::UnixStream::connect(&sock) {
                Ok(s) => s,
                Err(e) if std::time::Instant::now() < end => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Err(e) => panic!("metrics socket: {e}"),
            };
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut r = String::new();
            s.read_to_string(&mut r).unwrap();
            // SM activity is labelled with its source: the utilization rate until GPM's first
            // snapshot (an idle GPU's zeros count once they have lasted GPM_SAME_SNAPSHOT_MS).
            if r.contains("xshare_gpu_health_state{gpu=\"0\",state=\"healthy\"} 1")
                && r.contains("source=\"gpm\"")
            {
                break r;
            }
            assert!(
                std::time::Instant::now() < end,
                "never healthy with GPM's SM activity in metrics: {r}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert!(body.starts_with("HTTP/1.0 200 OK"));
    assert!(
        body.contains("xshare_gpu_sm_activity_percent{gpu=\"0\",source=\"gpm\"}"),
        "{body}"
    );
    assert!(
        body.contains("xshare_gpu_memory_total_bytes{gpu=\"0\"} 85520809984"),
        "{body}"
    );
    assert!(body.contains("xshare_evictions_total{gpu=\"0\",reason=\"under_report\"} 0"));
}

/// A metrics endpoint that cannot be served (here a unix socket another live listener holds,
/// as when every GPU's monitor reads one config naming one path) leaves the monitor running and
/// protecting its GPU, the failure named in its state file; before, the start was refused, a
/// crash loop under `Restart=always` with the GPU unmonitored.
#[test]
fn a_metrics_endpoint_it_cannot_serve_never_stops_the_monitor() {
    let n = EmuHost::node();
    let sock = n.path("metrics.sock");
    let _other = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let cfg = config(400, 5000).replace(
        r#""interval_ms": 10,"#,
        &format!(r#""interval_ms": 10, "metrics_listen": "unix:{}","#, sock.display()),
    );
    let _mon = n.start_monitor("mon.json", &cfg);
    let v = n.wait_state(T, "healthy", |v| state(v) == "healthy");
    let e = v["config_error"].as_str().unwrap_or_default();
    assert!(e.contains("metrics_listen") && e.contains("without its metrics endpoint"), "{v}");
    assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok(), "the other listener's socket is left alone");
}

/// `sysmonitor nvml-cost` times every NVML query the monitor makes, on the host's own NVML:
/// GPM's on Hopper, utilization samples before it, each with a CPU cost and a rate, and their
/// sum at the configured interval (figures are not asserted: a shared machine).
#[test]
fn nvml_cost_times_each_query_the_monitor_makes() {
    for (profile, sm_queries) in [
        ("h100", &["nvmlGpmSampleGet", "nvmlGpmMetricsGet"][..]),
        ("t4", &["nvmlDeviceGetSamples"][..]),
    ] {
        let n = EmuHost::with_profile(profile);
        n.require_nvml();
        let cfg = n.path("cost.json");
        std::fs::write(
            &cfg,
            r#"{ "interval_ms": 10, "nvml": { "gpm_every_ms": 500, "memory_every_ms": 100, "power_temp_every_ms": 250 } }"#,
        )
        .unwrap();
        let out = n
            .node_command(e2e::artifact("sysmonitor").to_str().unwrap())
            .args(["nvml-cost", "--calls", "20", "--json", "-c"])
            .arg(&cfg)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{profile}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        let r: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(r["interval_ms"], 10);
        let calls = r["calls"].as_array().unwrap();
        let answered = |q: &str| {
            calls.iter().any(|c| c["query"].as_str().unwrap().starts_with(q) && c["error"].is_null() && c["cpu_ns"].as_f64().unwrap() > 0.0)
        };
        for q in sm_queries.iter().chain(&["nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetClockInfo", "nvmlDeviceGetComputeRunningProcesses"]) {
            assert!(answered(q), "{profile}: {q} not timed: {text}");
        }
        let per_sec = |q: &str| calls.iter().find(|c| c["query"].as_str().unwrap().starts_with(q)).unwrap()["per_sec"].clone();
        assert_eq!(per_sec("nvmlDeviceGetUtilizationRates"), 100.0, "every 10 ms sample");
        assert_eq!(per_sec("nvmlDeviceGetMemoryInfo"), 10.0, "nvml.memory_every_ms");
        assert_eq!(per_sec("nvmlDeviceGetPowerUsage"), 4.0, "nvml.power_temp_every_ms");
        if profile == "h100" {
            assert_eq!(per_sec("nvmlGpmMetricsGet"), 2.0, "nvml.gpm_every_ms");
        }
        assert!(r["total_core_pct"].as_f64().unwrap() > 0.0, "{text}");
        assert_eq!(r["gap_ms"], 0, "back to back by default");
        assert!(r["tick_cpu_ns"].as_f64().unwrap() > 0.0, "whole ticks timed: {text}");
        // Spaced as the monitor spaces them: the same queries, each after a sleep.
        let out = n
            .node_command(e2e::artifact("sysmonitor").to_str().unwrap())
            .args(["nvml-cost", "--calls", "3", "--gap-ms", "2", "--json", "-c"])
            .arg(&cfg)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{profile} spaced: {text}");
        let r: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(r["gap_ms"], 2);
        assert!(r["calls"].as_array().unwrap().iter().any(|c| c["error"].is_null() && c["calls"] == 3), "{text}");
    }
}

fn planned_pod(uid: &str, name: &str, plan: u64) -> node_daemon::offline_pods::OfflinePod {
    node_daemon::offline_pods::OfflinePod { uid: uid.into(), namespace: "train".into(), name: name.into(), memory_quota_bytes: Some(plan) }
}

/// A shimmed `shim_client` with quota `quota` in group `group`, moved into pod cgroup `cg`
/// before its first driver call (as a container's process is born in its pod's), once it
/// holds `bytes` allocated.
fn client_in_pod(n: &EmuHost, cg: &e2e::PodCgroup, quota: u64, group: &str, bytes: u64) -> EmuChild {
    let mut c = shim_support::limited(n, "shim_client", quota, group);
    c.args(["--hold", "ctx", "alloc", &bytes.to_string(), "ready", "sleep", "60000"]);
    let mut child = n.spawn(&mut c);
    child.wait_for_line("loaded", T).expect("the client loaded");
    cg.add(child.pid()).unwrap();
    child.send_line("go");
    child.wait_for_line("ready", T).expect("the client allocated");
    child
}

/// The monitor's config of these tests, with the emulated profile's context (NVML charges it
/// to the process; the shim's quota leaves it out) and `extra` verify settings.
fn plan_config(n: &EmuHost, extra: &str) -> String {
    let context_mib = n.context_bytes().div_ceil(e2e::MIB);
    let cfg = config(400, 5000).replace("\"tolerance_mib\": 16 }", &format!("\"tolerance_mib\": 16, \"context_mib\": {context_mib}{extra} }}"));
    assert!(cfg.contains("context_mib"), "{cfg}");
    cfg
}

/// The monitor holds each planned offline pod to the GPU memory its plan gives it, as NVML
/// measures the pod's processes, whatever quota the shim was given.
///
/// The shim's quota comes from the container's environment (`XCUDA_QUOTA_BYTES`, which Allocate
/// sets from the plan's `xshare.io/memory-quota-bytes`) and its group from `XCUDA_GROUP`: both
/// are the tenant's to change. A pod that raised its own quota held as much as it liked, and
/// reported it honestly, so the under-reporting check saw nothing wrong. node-agent's list of
/// the offline pods (`<ledger_dir>/offline-pods.json`) now carries each pod's plan; the monitor
/// sums NVML's figures for the registered processes whose cgroup names the pod and evicts them
/// (`over_quota`) once they hold more than the plan (plus each process's context and the
/// tolerance) for the strikes. A process that registered under another pod's group (its
/// allocations charged to that pod's quota, which the other pod then lacks) is evicted as well
/// (`foreign_group`), however little it holds. A planned pod is judged by NVML against its plan
/// only: a neighbour's write of a low reported figure into its slot evicts nobody. Root only
/// (a real cgroup per pod).
#[test]
fn a_pod_over_its_plan_or_under_another_pods_group_is_evicted_and_its_neighbour_is_not() {
    if e2e::lacks_root("make a cgroup per pod") {
        return;
    }
    const GREEDY: &str = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d";
    const FAIR: &str = "2b3c4d5e-6f7a-4b8c-9d0e-1f2a3b4c5d6e";
    const BORROWER: &str = "3c4d5e6f-7a8b-4c9d-8e1f-2a3b4c5d6e7f";
    const MIB: u64 = e2e::MIB;
    let borrower_cg = e2e::PodCgroup::create(BORROWER).expect("a cgroup for the borrowing pod");
    let greedy_cg = e2e::PodCgroup::create(GREEDY).expect("a cgroup for the greedy pod");
    let fair_cg = e2e::PodCgroup::create(FAIR).expect("a cgroup for the fair pod");
    let n = EmuHost::node();
    let (_mon, ledger) = healthy(&n, &plan_config(&n, ""));
    // Planned 64 MiB each. The greedy pod's container raised its own quota to 1 GiB and takes
    // 160 MiB (reported as it is: no under-reporting); the fair one takes 48 MiB of its 64.
    let start = |cg: &e2e::PodCgroup, quota: u64, group: String, bytes: u64| client_in_pod(&n, cg, quota, &group, bytes);
    let mut greedy = start(&greedy_cg, 1 << 30, format!("k8s-pod-{GREEDY}"), 160 * MIB);
    let mut fair = start(&fair_cg, 64 * MIB, format!("k8s-pod-{FAIR}"), 48 * MIB);
    // The borrower holds 8 MiB (well within its plan) under the fair pod's group.
    let mut borrower = start(&borrower_cg, 64 * MIB, format!("k8s-pod-{FAIR}"), 8 * MIB);
    // No plan known yet: ten verifications and nothing happens.
    std::thread::sleep(Duration::from_millis(500));
    assert!(greedy.alive() && fair.alive() && borrower.alive(), "{}", n.log("mon.json"));

    let list = node_daemon::offline_pods::OfflinePods::new(
        "node-1",
        1,
        vec![planned_pod(GREEDY, "greedy-0", 64 * MIB), planned_pod(FAIR, "fair-0", 64 * MIB), planned_pod(BORROWER, "borrower-0", 64 * MIB)],
    );
    node_daemon::offline_pods::write(&node_daemon::offline_pods::path(n.ledger_dir()), &list).unwrap();
    assert!(greedy.wait_timeout(T).is_some(), "the greedy pod's process was not evicted:\n{}", n.log("mon.json"));
    assert!(borrower.wait_timeout(T).is_some(), "the borrowing pod's process was not evicted:\n{}", n.log("mon.json"));
    let v = n.wait_state(T, "the evictions counted", |v| {
        v["evictions"]["over_quota"].as_u64() >= Some(1) && v["evictions"]["foreign_group"].as_u64() >= Some(1)
    });
    assert_eq!((&v["evictions"]["over_quota"], &v["evictions"]["foreign_group"]), (&1.into(), &1.into()), "{v:#}");
    assert_eq!(v["evictions"]["under_report"].as_u64().unwrap_or(0), 0, "it reported honestly: {v:#}");
    // A neighbour's raw write into the fair process's slot: it "reports" nothing. A planned
    // pod is judged by NVML against its plan, not by that word: another second of
    // verifications and the fair pod stays (before, it was evicted as under-reporting).
    let slot = ledger.procs().into_iter().find(|p| p.pid == fair.pid()).expect("the fair process's slot").slot;
    ledger.layout().procs[slot].mem_bytes.store(0, std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(fair.alive(), "the fair pod's process was evicted:\n{}", n.log("mon.json"));
    let v = n.wait_state(T, "a fresh state", |_| true);
    assert_eq!(v["evictions"]["under_report"].as_u64().unwrap_or(0), 0, "{v:#}");
    let log = n.log("mon.json");
    assert!(log.contains("offline pod train/greedy-0") && log.contains("over its plan of 64 MiB"), "{log}");
    assert!(log.contains("offline pod train/borrower-0") && log.contains("registered under another quota group"), "{log}");
    // The eviction log names each evicted process's own pod (node-agent evicts it through the
    // API), never the fair pod whose group the borrower claimed.
    let logged = node_ledger::evictlog::read_from(n.ledger_dir(), 0, None, 1 << 20).unwrap();
    let mut recs: Vec<_> = logged.entries.iter().filter_map(|e| e.record.as_ref()).map(|r| (r.pod_uid.clone().unwrap_or_default(), r.reason.clone())).collect();
    recs.sort();
    recs.dedup();
    let want = [(GREEDY.to_string(), "over_quota".to_string()), (BORROWER.to_string(), "foreign_group".to_string())];
    let mut want = want.to_vec();
    want.sort();
    assert_eq!(recs, want);
}

/// With `verify.foreign_group: report` (for a cluster run without the bind lock, where
/// Allocate may mix up two pending pods), a planned pod's process under another pod's group is reported once (WARN) and left
/// running. Root only (a real cgroup per pod).
#[test]
fn a_foreign_group_is_only_reported_when_so_configured() {
    if e2e::lacks_root("make a cgroup per pod") {
        return;
    }
    const BORROWER: &str = "4d5e6f7a-8b9c-4dae-9f0a-1b2c3d4e5f60";
    const LENDER: &str = "5e6f7a8b-9cad-4ebf-8a1b-2c3d4e5f6071";
    let cg = e2e::PodCgroup::create(BORROWER).expect("a cgroup for the borrowing pod");
    let n = EmuHost::node();
    let (_mon, _ledger) = healthy(&n, &plan_config(&n, ", \"foreign_group\": \"report\""));
    let mut borrower = client_in_pod(&n, &cg, 64 * e2e::MIB, &format!("k8s-pod-{LENDER}"), 8 * e2e::MIB);
    let list = node_daemon::offline_pods::OfflinePods::new(
        "node-1",
        1,
        vec![planned_pod(BORROWER, "borrower-0", 64 * e2e::MIB), planned_pod(LENDER, "lender-0", 64 * e2e::MIB)],
    );
    node_daemon::offline_pods::write(&node_daemon::offline_pods::path(n.ledger_dir()), &list).unwrap();
    n.wait_log(T, "the report", "mon.json", |l| l.contains("left running (verify.foreign_group: report)"));
    // A second of verifications more: still running, reported once, evicted by nothing.
    std::thread::sleep(Duration::from_millis(1000));
    assert!(borrower.alive(), "{}", n.log("mon.json"));
    let log = n.log("mon.json");
    assert_eq!(log.matches("left running (verify.foreign_group: report)").count(), 1, "{log}");
    let v = n.wait_state(T, "a fresh state", |_| true);
    assert_eq!(v["evictions"]["foreign_group"].as_u64().unwrap_or(0), 0, "{v:#}");
}
