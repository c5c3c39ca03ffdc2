//! Issue 8 observation 6: a dead container's quota comes back whatever happens to its pid
//! namespace, given back by the monitor (no other shimmed process needed), with offline
//! processes as non-root users. Plus three stress tools (`#[ignore]`d, figures printed):
//! reclaim time of SIGKILLed namespaced containers, and 8 offline users of one container
//! group allocating at random for 30 s (without and with SIGKILLs), bytes over quota measured
//! through NVML.
//!
//! Every test here has its own emulated host, passed explicitly to its children, and the
//! process environment is never changed, so they can run together in one test process
//! (`-- --include-ignored`). NVML is read by a process of its own per tool
//! ([`NvmlSampler`]), as a monitoring tool reads it.
//!
//! Needs root (unshare, switching users); says so and passes vacuously otherwise.

mod shim_support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::nvml_sampler::{NvmlFigures, NvmlSampler};
use e2e::{lacks_root, EmuChild, EmuHost};
use node_ledger::ledger::group_id_for;
use node_ledger::PodUid;
use shim_support::*;

const QUOTA: u64 = 256 * MIB;

/// A running sysmonitor on `host` sampling every 10 ms, and the ledger it created.
fn start_monitor(host: &EmuHost) -> (EmuChild, node_ledger::Ledger) {
    host.require_nvml();
    let mon = host.start_monitor(
        "sysmonitor.json",
        r#"{ "interval_ms": 10, "state_file_every_ms": 100, "host_memory": { "enabled": false }, "verify": { "enabled": false } }"#,
    );
    let path = host.ledger_path();
    let end = Instant::now() + T;
    loop {
        if let Ok(l) = node_ledger::Ledger::open_existing(&path) {
            return (mon, l);
        }
        assert!(
            Instant::now() < end,
            "no ledger from the monitor: {}",
            mon.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A shimmed `shim_client` with `args`, as user `uid`, alone in a new pid namespace of which it
/// is the init. Without a /proc of its own: the emulator names its clients by pid + start time
/// read from /proc, and the other processes' liveness sweeps (host namespace) would take a
/// client whose pid is 1 in its own /proc for dead and tear its context down (a real driver
/// tracks clients by their device file handles). node-ledger's own namespace test
/// (`node-ledger/tests/reclaim_namespaces.rs`) runs its registrant with its own /proc.
fn in_container(host: &EmuHost, uid: u32, group: &str, args: &[&str]) -> EmuChild {
    let inner = limited(host, "shim_client", QUOTA, group);
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "setpriv"])
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(inner.get_program())
        .args(args);
    c.env_clear();
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    host.spawn(&mut c)
}

/// [`in_container`] for pod `pod` as node-agent's Allocate makes it (`inject.pod_ledgers`, the
/// default; [`in_pod`]). Returns the container and the pod's ledger as the host sees it.
fn in_pod_container(host: &EmuHost, pod: PodUid, uid: u32, group: &str, args: &[&str]) -> (EmuChild, node_ledger::Ledger) {
    let mut inner = limited(host, "shim_client", QUOTA, group);
    inner.args(args);
    let (mut c, path) = in_pod(host, pod, Some(uid), true, &inner);
    (host.spawn(&mut c), node_ledger::Ledger::open_existing(&path).expect("the pod's ledger"))
}

/// Kills a container started by [`in_container`]: SIGKILL to its init (the client), and the
/// kernel takes the namespace down. Returns when `unshare` has seen it die.
fn kill_container(c: &mut EmuChild) {
    let init = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", c.pid()))
        .unwrap_or_default();
    let init: Vec<i32> = init
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    assert_eq!(
        init.len(),
        1,
        "unshare has one child, the container's init: {init:?}"
    );
    // SAFETY: kill(2) on a process this test started (through unshare).
    assert_eq!(unsafe { libc::kill(init[0], libc::SIGKILL) }, 0);
    c.wait_timeout(T)
        .expect("unshare exits once its child is gone");
}

/// Kills container `c` ([`kill_container`]) while another one starts ([`another_container`]),
/// then waits (up to `T`) until group `g` of `l` holds nothing.
fn kill_and_wait_given_back(c: &mut EmuChild, l: &node_ledger::Ledger, g: usize) {
    kill_container(c);
    let mut other = another_container();
    let end = Instant::now() + T;
    while l.group_used(g) != 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = other.kill();
    let _ = other.wait();
}

/// Another container starting (a new pid namespace: it may get the dead one's inode number).
fn another_container() -> std::process::Child {
    Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "sleep", "60"])
        .spawn()
        .expect("unshare")
}

#[test]
fn a_dead_containers_quota_is_given_back_by_the_monitor_whatever_its_namespace() {
    if lacks_root("unshare and run offline processes as uid 65534") {
        return;
    }
    let host = host_for_users();
    let (mut mon, l) = start_monitor(&host);
    let g = l.group(group_id_for("ctr"), QUOTA).unwrap();
    let held = (QUOTA * 3 / 4).to_string();
    let mut c = in_container(
        &host,
        NOBODY,
        "ctr",
        &["ctx", "alloc", &held, "ready", "hang"],
    );
    assert!(c.wait_for_line("ready", T).is_some(), "{}", c.stderr());
    assert_eq!(
        c.lines("alloc=")[0],
        format!("alloc=0 bytes={held}"),
        "{}\n{}",
        c.stdout(),
        c.stderr()
    );
    assert_eq!(l.group_used(g), QUOTA * 3 / 4);
    let p = l
        .procs()
        .into_iter()
        .find(|p| p.mem_bytes == QUOTA * 3 / 4)
        .expect("registered");
    assert_ne!(
        p.pid_ns,
        node_ledger::procinfo::own_pid_ns(),
        "ran in its own pid namespace"
    );

    // No shimmed process is left: only the monitor can give the quota back.
    kill_and_wait_given_back(&mut c, &l, g);
    assert_eq!(
        l.group_used(g),
        0,
        "dead container's quota never given back: {}",
        mon.stderr()
    );
    assert!(l.procs().is_empty(), "{:?}", l.procs());
    mon.signal(libc::SIGTERM);
    mon.wait_timeout(T);
    assert!(
        mon.stderr().contains("reclaimed dead process"),
        "{}",
        mon.stderr()
    );
}

/// With a ledger per pod the dead container's registration is in its pod's ledger, which no
/// process of another pod opens: the monitor reads the pods directory and gives the quota back
/// there too (without that, nobody would until node-agent removes the pod's ledgers).
#[test]
fn a_dead_pods_quota_is_given_back_by_the_monitor_in_the_pods_own_ledger() {
    if lacks_root("unshare, mount the pod's ledger and run offline processes as uid 65534") {
        return;
    }
    let host = host_for_users();
    let (mut mon, gpu_ledger) = start_monitor(&host);
    let pod = PodUid::parse("0000000d-0000-4000-8000-00000000000d").unwrap();
    let held = QUOTA * 3 / 4;
    let (mut c, l) = in_pod_container(&host, pod, NOBODY, "ctr", &["ctx", "alloc", &held.to_string(), "ready", "hang"]);
    assert!(c.wait_for_line("ready", T).is_some(), "{}", c.stderr());
    assert_eq!(c.lines("alloc=")[0], format!("alloc=0 bytes={held}"), "{}\n{}", c.stdout(), c.stderr());
    let g = l.find_group(group_id_for("ctr")).expect("the container's group is in its pod's ledger");
    assert_eq!(l.group_used(g), held);
    assert!(gpu_ledger.procs().is_empty(), "registered in the GPU's ledger: {:?}", gpu_ledger.procs());
    let p = l.procs().into_iter().find(|p| p.mem_bytes == held).expect("registered in the pod's ledger");
    assert_ne!(p.pid_ns, node_ledger::procinfo::own_pid_ns(), "ran in its own pid namespace");

    kill_and_wait_given_back(&mut c, &l, g);
    assert_eq!(l.group_used(g), 0, "the dead container's quota never given back in its pod's ledger: {}", mon.stderr());
    assert!(l.procs().is_empty(), "{:?}", l.procs());
    mon.signal(libc::SIGTERM);
    mon.wait_timeout(T);
    let said = mon.stderr();
    assert!(said.lines().any(|x| x.contains("reclaimed the quota of a dead process") && x.contains(&pod.to_string())), "{said}");
}

/// A pod's container that dies while the monitor is down (SIGKILLed, as a crash or an OOM kill
/// takes it): the restarted monitor finds the pod's ledger, and the dead container's quota in
/// it, as it starts.
#[test]
fn a_pod_container_dead_while_the_monitor_was_down_is_given_back_when_it_restarts() {
    if lacks_root("unshare, mount the pod's ledger and run offline processes as uid 65534") {
        return;
    }
    let host = host_for_users();
    let (mut mon, _gpu_ledger) = start_monitor(&host);
    let pod = PodUid::parse("0000000f-0000-4000-8000-00000000000f").unwrap();
    let held = QUOTA / 2;
    let (mut c, l) = in_pod_container(&host, pod, NOBODY, "ctr", &["ctx", "alloc", &held.to_string(), "ready", "hang"]);
    assert!(c.wait_for_line("ready", T).is_some(), "{}", c.stderr());
    let g = l.find_group(group_id_for("ctr")).expect("the container's group is in its pod's ledger");
    assert_eq!(l.group_used(g), held);
    mon.signal(libc::SIGKILL);
    mon.wait_timeout(T);
    kill_container(&mut c);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(l.group_used(g), held, "nobody gave it back while the monitor was down");
    let (mut again, _) = start_monitor(&host);
    let end = Instant::now() + T;
    while l.group_used(g) != 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(l.group_used(g), 0, "the restarted monitor never gave the dead container's quota back: {}", again.stderr());
    again.signal(libc::SIGTERM);
    again.wait_timeout(T);
}

/// The stress tools' NVML samplers are independent: two hosts sampled at once, each sampler
/// sees its own GPU only (read in the test process, both would read the first host's GPU).
#[test]
fn nvml_samplers_of_two_hosts_at_once_each_see_their_own_gpu() {
    let hosts = [EmuHost::new(), EmuHost::new()];
    let mut samplers: Vec<NvmlSampler> =
        hosts.iter().map(|h| NvmlSampler::start(h, QUOTA)).collect();
    let mut clients: Vec<EmuChild> = hosts
        .iter()
        .zip([16 * MIB, 48 * MIB])
        .map(|(h, bytes)| {
            let mut c = h.command("shim_client");
            c.args(["ctx", "alloc", &bytes.to_string(), "ready", "hang"]);
            h.spawn(&mut c)
        })
        .collect();
    for (c, s) in clients.iter_mut().zip(&mut samplers) {
        assert!(c.wait_for_line("ready", T).is_some(), "{}", c.stderr());
        s.watch(c.pid());
    }
    std::thread::sleep(Duration::from_millis(100));
    let seen: Vec<(u64, u64)> = samplers
        .into_iter()
        .map(|s| {
            let f = s.stop();
            assert!(f.samples > 0);
            (f.procs_max, f.used_max)
        })
        .collect();
    assert_eq!(seen, [(16 * MIB, 16 * MIB), (48 * MIB, 48 * MIB)]);
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Stress (`cargo test -p e2e --test reclaim_dead_container stress_reclaim -- --ignored
/// --nocapture`, `RECLAIM_STRESS_CYCLES`, default 100; `RECLAIM_STRESS_POD_LEDGER=1`: each
/// container in its pod's own ledger, [`in_pod_container`]): containers (own pid namespace, as one
/// of several non-root users) allocate and are SIGKILLed with their namespace while new
/// namespaces start; prints how long until the monitor gave each one's quota back, measured
/// from the moment `unshare` saw its child die.
#[test]
#[ignore = "stress tool: run by hand, prints its figures"]
fn stress_reclaim_of_killed_containers() {
    if lacks_root("") {
        return;
    }
    let cycles: usize = e2e::env_or("RECLAIM_STRESS_CYCLES", 100);
    let pod_ledger = e2e::env_or("RECLAIM_STRESS_POD_LEDGER", 0u8) == 1;
    let host = host_for_users();
    let (mut mon, gpu_ledger) = start_monitor(&host);
    let pod = PodUid::parse("0000000e-0000-4000-8000-00000000000e").unwrap();
    let mut l = gpu_ledger;
    let mut took_ms = Vec::new();
    let mut others = Vec::new();
    for i in 0..cycles {
        let uid = 60_001 + (i % 8) as u32;
        let bytes = ((1 + i % 16) as u64 * 8 * MIB).to_string();
        let args = ["ctx", "alloc", &bytes, "ready", "hang"];
        let mut c = if pod_ledger {
            let (c, pl) = in_pod_container(&host, pod, uid, "ctr", &args);
            l = pl;
            c
        } else {
            in_container(&host, uid, "ctr", &args)
        };
        assert!(c.wait_for_line("ready", T).is_some(), "{}", c.stderr());
        let g = l.find_group(group_id_for("ctr")).expect("the container's group");
        assert!(l.group_used(g) > 0, "{}", c.stderr());
        kill_container(&mut c);
        let t0 = Instant::now();
        others.push(another_container());
        while l.group_used(g) != 0 {
            assert!(
                t0.elapsed() < T,
                "cycle {i}: never given back: {}",
                mon.stderr()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        took_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        if others.len() > 4 {
            let mut o: std::process::Child = others.remove(0);
            let _ = o.kill();
            let _ = o.wait();
        }
    }
    for mut o in others {
        let _ = o.kill();
        let _ = o.wait();
    }
    let over_1s = took_ms.iter().filter(|&&t| t > 1000.0).count();
    let max = took_ms.iter().cloned().fold(0.0, f64::max);
    let (p50, p99) = (
        percentile(&mut took_ms, 0.5),
        percentile(&mut took_ms, 0.99),
    );
    eprintln!(
        "reclaim of {cycles} SIGKILLed containers ({}; monitor interval 10 ms): p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms, over 1 s: {over_1s}",
        if pod_ledger { "a pod ledger" } else { "the GPU's ledger" }
    );
    mon.signal(libc::SIGTERM);
    mon.wait_timeout(T);
    assert_eq!(over_1s, 0);
}

/// Stress (`cargo test -p e2e --test reclaim_dead_container stress_eight_users -- --ignored
/// --nocapture`, `QUOTA_STRESS_SECS`, default 30): 8 offline processes, each as a different
/// non-root user, in one container group, allocate and free at random for 30 s under a
/// running monitor; a sampler reads NVML (the emulator's process list) every few ms and
/// reports the most those processes held at once against the group's quota.
#[test]
#[ignore = "stress tool: run by hand, prints its figures"]
fn stress_eight_users_random_allocations_against_nvml() {
    if lacks_root("") {
        return;
    }
    let secs: u64 = e2e::env_or("QUOTA_STRESS_SECS", 30);
    let host = host_for_users();
    let (mut mon, l) = start_monitor(&host);
    let mut sampler = NvmlSampler::start(&host, QUOTA);

    let mut rng = e2e::XorShift(0x2545_F491_4F6C_DD1D);
    let mut rnd = move |n: u64| rng.below(n);
    let mut procs: Vec<EmuChild> = (0..8u32)
        .map(|i| {
            let steps = random_script(&mut rnd, secs, true);
            user_client(&host, i, &steps)
        })
        .collect();
    for p in &mut procs {
        assert!(p.wait_for_line("ready", T).is_some(), "{}", p.stderr());
    }
    let pids: Vec<u32> = procs.iter().map(|p| p.pid()).collect();
    for &p in &pids {
        sampler.watch(p);
    }
    for p in &mut procs {
        p.send_line("go");
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs + 60)
        && pids.iter().any(|p| {
            Path::new(&format!("/proc/{p}")).exists()
                && !std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .unwrap_or_default()
                    .contains(") Z")
        })
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let NvmlFigures {
        samples,
        procs_max: worst_procs,
        used_max: worst_total,
        over: over_samples,
        ..
    } = sampler.stop();
    let mut allocs = (0usize, 0usize);
    for p in &mut procs {
        let out = p.finish(T);
        for line in out.lines().filter(|l| l.starts_with("alloc=")) {
            if line.starts_with("alloc=0") {
                allocs.0 += 1;
            } else {
                allocs.1 += 1;
            }
        }
    }
    let g = l.group(group_id_for("users"), QUOTA).unwrap();
    eprintln!(
        "8 users x {secs} s random allocations, quota {} MiB: {} allocations ok, {} refused; NVML samples {samples}; \
         most held at once: {:.1} MiB (process list), {:.1} MiB (device used); bytes over quota: {} (samples over: {over_samples}); \
         ledger after: {} bytes",
        QUOTA / MIB,
        allocs.0,
        allocs.1,
        worst_procs as f64 / MIB as f64,
        worst_total as f64 / MIB as f64,
        worst_procs.max(worst_total).saturating_sub(QUOTA),
        l.group_used(g),
    );
    mon.signal(libc::SIGTERM);
    mon.wait_timeout(T);
    assert!(
        allocs.1 > 0,
        "the quota was never reached: the stress proves nothing"
    );
    assert_eq!(worst_procs.max(worst_total).saturating_sub(QUOTA), 0);
    assert_eq!(l.group_used(g), 0);
}

/// Stress user `i` (uid and gid 60001 + i): a shimmed `shim_client` of the "users" group
/// running `steps`.
fn user_client(host: &EmuHost, i: u32, steps: &[String]) -> EmuChild {
    let mut c = limited(host, "shim_client", QUOTA, "users");
    c.args(steps).uid(60_001 + i).gid(60_001 + i);
    host.spawn(&mut c)
}

/// A random shim_client script of about `secs` seconds: allocations of 1..64 MiB, frees and
/// short sleeps; gated on one stdin line after "ready" when `gate`.
fn random_script(rnd: &mut impl FnMut(u64) -> u64, secs: u64, gate: bool) -> Vec<String> {
    let mut steps: Vec<String> = vec!["ctx".into()];
    if gate {
        steps.extend(["ready".into(), "wait".into()]);
    }
    let (mut slept, mut held) = (0u64, 0usize);
    while slept < secs * 1000 {
        match rnd(10) {
            0..=4 => {
                steps.push("alloc".into());
                steps.push(((1 + rnd(64)) * MIB).to_string());
                held += 1;
            }
            5..=7 if held > 0 => {
                steps.push("free".into());
                held -= 1;
            }
            _ => {
                let ms = 1 + rnd(20);
                steps.push("sleep".into());
                steps.push(ms.to_string());
                slept += ms;
            }
        }
    }
    steps.push("freeall".into());
    steps
}

/// Stress (`cargo test -p e2e --test reclaim_dead_container stress_eight_users_with_sigkills
/// -- --ignored --nocapture`, `QUOTA_STRESS_SECS` default 30, `QUOTA_STRESS_KILL_MS` default
/// 300): as above, and every ~300 ms one of the 8 processes is SIGKILLed holding whatever it
/// holds and replaced by a new one of the same user, so the group's quota keeps coming back
/// through reclaim. NVML is read as before; a killed process counts for as long as NVML lists
/// it (the emulator frees a dead client's memory at its next reap, every 20 ms); the figure
/// for live processes only leaves them out.
#[test]
#[ignore = "stress tool: run by hand, prints its figures"]
fn stress_eight_users_with_sigkills_against_nvml() {
    if lacks_root("") {
        return;
    }
    let (secs, kill_ms): (u64, u64) = (
        e2e::env_or("QUOTA_STRESS_SECS", 30),
        e2e::env_or("QUOTA_STRESS_KILL_MS", 300),
    );
    let host = host_for_users();
    let (mut mon, l) = start_monitor(&host);
    let mut sampler = NvmlSampler::start(&host, QUOTA);
    let mut rng = e2e::XorShift(0x9E37_79B9_7F4A_7C15);
    let mut rnd = move |n: u64| rng.below(n);
    let spawn = |rnd: &mut dyn FnMut(u64) -> u64, i: u32, secs: u64| {
        let mut r = |n| rnd(n);
        let steps = random_script(&mut r, secs, false);
        user_client(&host, i, &steps)
    };
    let mut procs: Vec<EmuChild> = (0..8u32).map(|i| spawn(&mut rnd, i, secs)).collect();
    for p in &procs {
        sampler.watch(p.pid());
    }
    let (mut kills, mut reclaimed_by_kill) = (0u64, 0u64);
    let start = Instant::now();
    let mut next_kill = Instant::now() + Duration::from_millis(kill_ms);
    while start.elapsed() < Duration::from_secs(secs) {
        if Instant::now() >= next_kill {
            next_kill = Instant::now() + Duration::from_millis(kill_ms);
            let i = rnd(8) as usize;
            let victim = l.procs().into_iter().find(|p| p.pid == procs[i].pid());
            reclaimed_by_kill += victim.map_or(0, |v| u64::from(v.mem_bytes > 0));
            procs[i].kill9();
            kills += 1;
            let left = secs.saturating_sub(start.elapsed().as_secs()).max(1);
            procs[i] = spawn(&mut rnd, i as u32, left);
            sampler.watch(procs[i].pid());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let f = sampler.stop();
    let (samples, worst, live, over_samples) =
        (f.samples, f.procs_max.max(f.used_max), f.live_max, f.over);
    for p in &mut procs {
        p.kill9();
    }
    let g = l.group(group_id_for("users"), QUOTA).unwrap();
    let end = Instant::now() + T;
    while l.group_used(g) != 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "8 users x {secs} s random allocations with a SIGKILL every {kill_ms} ms ({kills} kills, {reclaimed_by_kill} holding memory), \
         quota {} MiB: NVML samples {samples}; most held at once (NVML, killed processes included while listed): {:.1} MiB; \
         bytes over quota: {} (samples over: {over_samples}); live processes only: {:.1} MiB, {} bytes over; \
         ledger after all killed: {} bytes",
        QUOTA / MIB,
        worst as f64 / MIB as f64,
        worst.saturating_sub(QUOTA),
        live as f64 / MIB as f64,
        live.saturating_sub(QUOTA),
        l.group_used(g),
    );
    mon.signal(libc::SIGTERM);
    mon.wait_timeout(T);
    assert_eq!(
        l.group_used(g),
        0,
        "every killed process's quota given back"
    );
    assert_eq!(
        live.saturating_sub(QUOTA),
        0,
        "live processes never hold more than the quota"
    );
}

/// A ledger left by another version of the node runtime (layout v2 here): a shimmed process
/// refuses device memory and says which versions met, never a quota of its own.
#[test]
fn a_shim_facing_a_ledger_of_another_version_fails_closed_naming_both_versions() {
    use node_ledger::layout::{LAYOUT_SIZE, LAYOUT_VERSION, MAGIC, MAX_PROCS};
    let host = EmuHost::new();
    let path = node_ledger::config::ledger_path(&ledger_dir(&host), 0);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let old = LAYOUT_VERSION - 1;
    let mut bytes = vec![0u8; LAYOUT_SIZE - MAX_PROCS * 8 + 64];
    bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[8..12].copy_from_slice(&old.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let mut c = limited(&host, "shim_client", QUOTA, "ctr");
    c.args(["ctx", "alloc", &MIB.to_string()]);
    let mut child = host.spawn(&mut c);
    let out: Vec<String> = child.finish(T).lines().map(str::to_string).collect();
    let err = child.stderr();
    assert_eq!(rc_of(&out, "alloc="), ["2"], "fails closed: {out:?}");
    assert!(
        err.contains("layout_version")
            && err.contains(&format!("found {old}, this build reads {LAYOUT_VERSION}"))
            && err.contains(&*path.to_string_lossy()),
        "one clear error naming the file and both versions: {err}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the other version's file is left alone"
    );
}
