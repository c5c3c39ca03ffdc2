//! Stress tool (`#[ignore]`d, figures printed): the monitor restarted at random moments, as
//! systemd (`Restart=always`) restarts it after the OOM killer's or the watchdog's SIGKILL, or
//! an operator's `systemctl restart` (SIGTERM), while the node works: on an emulated T4,
//! non-root offline clients under the shim (uids 65534, 1000, 1001, 60002; one container group
//! with a 256 MiB quota) register, allocate under the quota and exit or are SIGKILLed (their
//! quota comes back through dead-process reclaim); an online burst (14000 of the T4's
//! 15360 MiB, every SM busy) drives the GPU Overlimit so the monitor evicts; an offline client
//! that ignores SIGTERM (a shimmed one, `trap '' TERM`) and one that counts the SIGTERMs it
//! gets (a registered shell) keep the SIGTERM -> grace -> SIGKILL escalation in flight when
//! the monitor dies.
//!
//! ```text
//! XSHARE_STRESS_RUNS=N cargo test -p e2e --test monitor_restart_stress -- --ignored --nocapture
//! ```
//! `XSHARE_STRESS_SECS` (per run, default 20), `XSHARE_STRESS_SEED` (replay a run; the seed
//! is printed). Needs root (switching users); says so and passes vacuously otherwise.
//!
//! Checked after every restart: the new monitor writes its state file (it comes back, no crash
//! loop), is still running, and, when the killed one was in an Overlimit hold that had time
//! left, resumes it (Overlimit in its first state file). Checked all along: the state file
//! always parses (a reader thread, every ~2 ms); the ledger is never moved aside or reported
//! damaged; live offline processes never hold more than the quota by NVML's process list (a
//! sampler process reading the fake NVML as a monitoring tool does, outside the shim). Checked
//! at the end of a run: every process asked to leave is gone (an eviction in flight when a
//! monitor died is finished or redone by a later one), no process was asked to leave twice
//! (monitor logs and the durable eviction log, one request per process; the counting client
//! got at most one SIGTERM), and every dead client's quota is back (the group at 0 bytes, the
//! registry empty).

mod shim_support;

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::nvml_sampler::NvmlSampler;
use e2e::{lacks_root, monitor_state as state, EmuChild, EmuHost, Load, XorShift};
use node_ledger::ledger::group_id_for;
use serde_json::Value;
use shim_support::*;

/// The offline container's quota (group [`GROUP`]).
const QUOTA: u64 = 256 * MIB;
const GROUP: &str = "ctr";
/// SIGTERM to SIGKILL.
const GRACE_MS: u64 = 1500;
/// The online burst's memory: with the offline quota under 93 % of a T4, past `mem_used`'s
/// Overlimit threshold (90 %) whoever else is on the GPU.
const ONLINE_MIB: u64 = 14_000;
/// The users offline clients run as.
const UIDS: [u32; 4] = [NOBODY, 1000, 1001, 60_002];

/// On a T4 with offline work on the GPU, busy-time metrics full beside an online process are
/// the throttle's (at most Unhealthy); memory is judged whole: the burst's memory evicts.
fn config() -> String {
    format!(
        r#"{{
  "interval_ms": 10,
  "state_file_every_ms": 50,
  "host_memory": {{ "enabled": false }},
  "machine": {{
    "gpu_util":    {{ "healthy": 80, "unhealthy": 90, "overlimit": 98 }},
    "sm_activity": {{ "healthy": 70, "unhealthy": 85, "overlimit": 95 }},
    "sm_clock":    {{ "healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false }},
    "mem_used":    {{ "healthy": 60, "unhealthy": 80, "overlimit": 90 }},
    "overlimit_sustain_ms": 0,
    "hold_base_ms": 500,
    "hold_max_ms": 2000
  }},
  "evictor": {{ "grace_ms": {GRACE_MS} }},
  "verify": {{ "every_ms": 100, "strikes": 3, "tolerance_mib": 16 }}
}}
"#
    )
}

/// Not a test: the entry point of helper processes (the online burst's `gpu-mem`).
#[test]
#[ignore = "helper-process entry point, run by the stress tool"]
fn helper_entry() {
    e2e::helper_main();
}

// ---------------------------------------------------------------------------------------
// The state file, read as its readers (status, mps-manager, the matcher) read it.

/// Reads the state file every ~2 ms from another thread: every read must parse.
struct StateReader {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    th: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl StateReader {
    fn start(path: PathBuf) -> StateReader {
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), reads.clone());
        let th = std::thread::spawn(move || {
            let mut bad = Vec::new();
            let mut seen = false;
            while !s.load(Ordering::Relaxed) {
                match std::fs::read_to_string(&path) {
                    Ok(t) => {
                        seen = true;
                        r.fetch_add(1, Ordering::Relaxed);
                        if let Err(e) = node_daemon_state_parses(&t) {
                            bad.push(format!("{e}: {t:?}"));
                        }
                    }
                    Err(e) if seen => bad.push(format!("state file unreadable: {e}")),
                    Err(_) => {}
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            bad
        });
        StateReader {
            stop,
            reads,
            th: Some(th),
        }
    }

    /// (reads, the failures).
    fn stop(mut self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let bad = self.th.take().unwrap().join().unwrap();
        (self.reads.load(Ordering::Relaxed), bad)
    }
}

/// The state file parses as JSON with the fields its readers need.
fn node_daemon_state_parses(t: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(t).map_err(|e| e.to_string())?;
    for k in [
        "state",
        "monitor_pid",
        "boot_id",
        "updated_mono_ms",
        "evictions",
    ] {
        if v.get(k).is_none() {
            return Err(format!("no `{k}`"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The node's processes.

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A shimmed client that allocates, sleeps and exits (or is SIGKILLed by the tool).
    Worker,
    /// A shimmed client that ignores SIGTERM (`trap '' TERM`): only SIGKILL ends it.
    Stubborn,
    /// A registered shell that counts the SIGTERMs it gets and ignores them.
    Counter,
}

struct Client {
    child: EmuChild,
    kind: Kind,
    /// When the tool first saw its slot's eviction request.
    requested: Option<Instant>,
    /// Monitor deaths while its eviction was in flight (request seen, process alive): the first.
    interrupted_at: Option<Instant>,
    interruptions: u32,
    /// SIGKILLed by the tool at this instant (a dead client whose quota must come back).
    killed_by_tool: Option<Instant>,
    /// Counter: its count file, and whether it is registered yet.
    count_file: Option<PathBuf>,
    registered: bool,
}

/// A shimmed `shim_client` as user `uid` of the offline container, running `steps`.
fn worker(host: &EmuHost, uid: u32, steps: &[String]) -> EmuChild {
    let mut c = limited(host, "shim_client", QUOTA, GROUP);
    c.args(steps).uid(uid).gid(uid);
    host.spawn(&mut c)
}

/// A shimmed `shim_client` that ignores SIGTERM: the shell sets SIGTERM to SIG_IGN (kept
/// across exec) and only then preloads the shim into the client.
fn stubborn(host: &EmuHost, uid: u32, mib: u64) -> EmuChild {
    let mut c = limited(host, "sh", QUOTA, GROUP);
    c.env_remove("LD_PRELOAD")
        .env("STRESS_SHIM", shim())
        .env("STRESS_CLIENT", e2e::artifact("shim_client"))
        .arg("-c")
        .arg(format!(
            "trap '' TERM; LD_PRELOAD=\"$STRESS_SHIM\" exec \"$STRESS_CLIENT\" ctx alloc {} ready hang",
            mib * MIB
        ))
        .uid(uid)
        .gid(uid);
    host.spawn(&mut c)
}

/// A shell that appends a line to `file` per SIGTERM and otherwise ignores it, holding the
/// ledger open (it is registered as an offline process).
fn counter(host: &EmuHost, file: &Path) -> EmuChild {
    host.spawn_sh_offline(&format!(
        "trap 'echo t >> {0}' TERM; : > {0}.ready; while :; do sleep 0.02; done",
        file.display()
    ))
}

fn worker_steps(rnd: &mut impl FnMut(u64) -> u64) -> Vec<String> {
    let mut s: Vec<String> = vec!["ctx".into()];
    for _ in 0..1 + rnd(3) {
        s.push("alloc".into());
        s.push(((8 + rnd(88)) * MIB).to_string());
        s.push("sleep".into());
        s.push((50 + rnd(1500)).to_string());
    }
    if rnd(3) == 0 {
        s.push("hang".into());
    }
    s
}

/// The eviction request a daemon addressed to the registered process `pid` (0: none), in the
/// status file at `status`; `None` while `pid` is not registered.
fn evict_signal_of(l: &node_ledger::Ledger, status: &Path, pid: u32) -> Option<u32> {
    l.procs().into_iter().find(|p| p.pid == pid).map(|p| {
        node_ledger::Status::open(status).map_or(0, |s| s.evict_request(node_ledger::ProcId::of(&p)))
    })
}

fn damaged_files(ledger: &Path) -> Vec<PathBuf> {
    let name = ledger.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(ledger.parent().unwrap())
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(&format!("{name}.damaged"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// How a monitor's life ends.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// After this long up.
    After(Duration),
    /// This long after an eviction request for a SIGTERM-ignoring client was seen (within the
    /// grace, so the escalation is in flight), or after the fallback.
    MidEviction(Duration),
    /// Once its Overlimit hold runs, or after the fallback.
    MidHold,
}

const PLAN_FALLBACK: Duration = Duration::from_secs(4);

/// Most a process asked to leave may outlive the grace: a loaded machine's delays, plus the
/// downtime of each monitor death during it (under 300 ms, and a start), never a grace per
/// restart.
fn overrun_max(deaths: u32) -> Duration {
    Duration::from_millis(1000 + 600 * u64::from(deaths))
}

/// Figures over all runs.
#[derive(Default, Debug)]
struct Figures {
    runs: u64,
    restarts: u64,
    sigkills: u64,
    sigterms: u64,
    /// Monitor deaths with at least one eviction in flight.
    deaths_mid_eviction: u64,
    /// Evictions in flight at a monitor's death (process asked to leave, still alive).
    interrupted_evictions: u64,
    /// ... finished by a later monitor: most time from the first death to the process's end.
    interrupted_finish_max: Duration,
    /// Most monitor deaths one eviction lived through.
    interruptions_max: u32,
    /// Most time a process asked to leave lived past the grace (from the tool's first sight of
    /// the request).
    overrun_max: Duration,
    /// Deaths in an Overlimit hold with time left, and how many the new monitor resumed.
    deaths_mid_hold: u64,
    holds_resumed: u64,
    /// Most time from starting a monitor to its first state file.
    first_state_max: Duration,
    evictions: u64,
    escalations: u64,
    workers: u64,
    workers_killed: u64,
    reclaim_max: Duration,
    allocs_ok: u64,
    allocs_refused: u64,
    nvml_samples: u64,
    nvml_live_max: u64,
    state_reads: u64,
    bursts: u64,
}

/// One run of `secs` seconds with `rng`.
fn run_once(secs: u64, rng: &mut XorShift, f: &mut Figures) {
    let host = host_for_users();
    host.require_nvml();
    let mut rnd = |n: u64| rng.below(n.max(1));
    let cfg = config();
    let mut mon = host.start_monitor("mon.json", &cfg);
    let lpath = host.ledger_path();
    let end = Instant::now() + T;
    let ledger = loop {
        if let Ok(l) = node_ledger::Ledger::open_existing(&lpath) {
            break l;
        }
        assert!(Instant::now() < end, "no ledger: {}", host.log("mon.json"));
        std::thread::sleep(Duration::from_millis(10));
    };
    let first = host.wait_state(T, "the first monitor's state", |v| {
        v["monitor_pid"] == mon.pid()
    });
    assert!(
        matches!(state(&first), "healthy" | "unhealthy"),
        "{first:#}"
    );
    let reader = StateReader::start(host.monitor_state_file());
    let mut sampler = NvmlSampler::start(&host, QUOTA);
    let group = ledger.group(group_id_for(GROUP), QUOTA).unwrap();

    let mut clients: Vec<Client> = Vec::new();
    let mut seq = 0u64;
    let mut burst: Option<(EmuChild, Load, Instant)> = None;
    let mut next_burst = Instant::now() + Duration::from_millis(300 + rnd(1500));
    let mut mon_up: Option<(Instant, Plan)> = Some((
        Instant::now(),
        Plan::After(Duration::from_millis(200 + rnd(2000))),
    ));
    let mut mon_down_until: Option<Instant> = None;
    let mut last_state: Value = first;
    let mut died_in_hold: Option<u64> = None; // the hold's end on the monotonic clock
    let deadline = Instant::now() + Duration::from_secs(secs);

    while Instant::now() < deadline {
        let now = Instant::now();
        if let Some(v) = std::fs::read_to_string(host.monitor_state_file())
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        {
            last_state = v;
        }

        // --- the monitor, supervised as systemd does.
        if let Some((since, plan)) = mon_up {
            if !mon.alive() {
                panic!(
                    "the monitor (pid {}) exited on its own: {:?}\n{}",
                    mon.pid(),
                    mon.wait_exit(Duration::ZERO),
                    host.log("mon.json")
                );
            }
            let victims_requested = clients
                .iter()
                .filter(|c| c.kind != Kind::Worker)
                .filter_map(|c| c.requested)
                .min();
            let trigger = match plan {
                Plan::After(d) => now >= since + d,
                Plan::MidEviction(d) => match victims_requested {
                    Some(t) => now >= t.max(since) + d,
                    None => now >= since + PLAN_FALLBACK,
                },
                Plan::MidHold => {
                    (state(&last_state) == "overlimit"
                        && last_state["monitor_pid"] == mon.pid()
                        && last_state["hold_remaining_ms"]
                            .as_u64()
                            .is_some_and(|r| r > 150))
                        || now >= since + PLAN_FALLBACK
                }
            };
            if trigger {
                let sig = if rnd(5) == 0 {
                    libc::SIGTERM
                } else {
                    libc::SIGKILL
                };
                mon.signal(sig);
                let st = mon.wait_exit(T).expect("the monitor did not stop");
                if sig == libc::SIGTERM {
                    assert_eq!(st, None, "SIGTERM: a clean exit\n{}", host.log("mon.json"));
                    f.sigterms += 1;
                } else {
                    f.sigkills += 1;
                }
                let died = Instant::now();
                // What it was doing when it died.
                let s = std::fs::read_to_string(host.monitor_state_file())
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .unwrap_or(Value::Null);
                died_in_hold = (state(&s) == "overlimit")
                    .then(|| {
                        s["hold_remaining_ms"]
                            .as_u64()
                            .map(|r| s["updated_mono_ms"].as_u64().unwrap() + r)
                    })
                    .flatten();
                let mut any = false;
                for c in clients.iter_mut() {
                    if c.requested.is_some() && c.child.alive() {
                        any = true;
                        f.interrupted_evictions += u64::from(c.interrupted_at.is_none());
                        c.interrupted_at.get_or_insert(died);
                        c.interruptions += 1;
                        f.interruptions_max = f.interruptions_max.max(c.interruptions);
                    }
                }
                f.deaths_mid_eviction += u64::from(any);
                mon_up = None;
                mon_down_until = Some(died + Duration::from_millis(rnd(300)));
            }
        } else if mon_down_until.is_some_and(|t| now >= t) {
            mon_down_until = None;
            let started = Instant::now();
            mon = host.start_monitor("mon.json", &cfg);
            f.restarts += 1;
            let pid = mon.pid();
            let v = wait_new_state(&host, &mut mon, pid);
            f.first_state_max = f.first_state_max.max(started.elapsed());
            if let Some(hold_end) = died_in_hold.take() {
                let t = v["updated_mono_ms"].as_u64().unwrap();
                if t + 20 < hold_end {
                    f.deaths_mid_hold += 1;
                    assert_eq!(
                        state(&v),
                        "overlimit",
                        "the restarted monitor left an Overlimit hold with {} ms left: {v:#}",
                        hold_end - t
                    );
                    f.holds_resumed += 1;
                }
            }
            assert!(
                mon.alive(),
                "the restarted monitor exited: {}",
                host.log("mon.json")
            );
            let plan = match rnd(3) {
                0 => Plan::After(Duration::from_millis(rnd(2500))),
                1 => Plan::MidEviction(Duration::from_millis(rnd(GRACE_MS))),
                _ => Plan::MidHold,
            };
            mon_up = Some((Instant::now(), plan));
        }

        // --- the online burst.
        match &burst {
            None if now >= next_burst => {
                let online = host.spawn_helper("gpu-mem", &ONLINE_MIB.to_string());
                let load = Load::start(&host, 1.0, 5.0);
                burst = Some((online, load, now + Duration::from_millis(300 + rnd(1700))));
                f.bursts += 1;
            }
            Some((_, _, until)) if now >= *until => {
                let (mut online, load, _) = burst.take().unwrap();
                online.kill9();
                load.stop();
                next_burst = Instant::now() + Duration::from_millis(500 + rnd(3000));
            }
            _ => {}
        }

        // --- offline clients come and go.
        let count = |k: Kind, cs: &Vec<Client>| cs.iter().filter(|c| c.kind == k).count();
        if count(Kind::Worker, &clients) < 3 && rnd(10) == 0 {
            let steps = worker_steps(&mut rnd);
            let child = worker(&host, UIDS[rnd(4) as usize], &steps);
            sampler.watch(child.pid());
            f.workers += 1;
            clients.push(Client {
                child,
                kind: Kind::Worker,
                requested: None,
                interrupted_at: None,
                interruptions: 0,
                killed_by_tool: None,
                count_file: None,
                registered: true,
            });
        }
        if count(Kind::Stubborn, &clients) < 1 && rnd(20) == 0 {
            let child = stubborn(&host, UIDS[rnd(4) as usize], 8 + rnd(40));
            sampler.watch(child.pid());
            clients.push(Client {
                child,
                kind: Kind::Stubborn,
                requested: None,
                interrupted_at: None,
                interruptions: 0,
                killed_by_tool: None,
                count_file: None,
                registered: true,
            });
        }
        if count(Kind::Counter, &clients) < 1 && rnd(20) == 0 {
            seq += 1;
            let file = host.path(&format!("terms-{seq}"));
            let child = counter(&host, &file);
            clients.push(Client {
                child,
                kind: Kind::Counter,
                requested: None,
                interrupted_at: None,
                interruptions: 0,
                killed_by_tool: None,
                count_file: Some(file),
                registered: false,
            });
        }
        if rnd(40) == 0 {
            let ws: Vec<usize> = (0..clients.len())
                .filter(|&i| clients[i].kind == Kind::Worker && clients[i].killed_by_tool.is_none())
                .collect();
            if !ws.is_empty() {
                let c = &mut clients[ws[rnd(ws.len() as u64) as usize]];
                c.child.kill9();
                c.killed_by_tool = Some(Instant::now());
                f.workers_killed += 1;
            }
        }
        for c in clients.iter_mut() {
            if let (false, Some(file)) = (c.registered, &c.count_file) {
                if Path::new(&format!("{}.ready", file.display())).exists() {
                    e2e::register(&ledger, c.child.pid(), 0);
                    c.registered = true;
                }
            }
            if c.requested.is_none()
                && c.child.alive()
                && evict_signal_of(&ledger, &host.status_path(), c.child.pid()).is_some_and(|s| s != 0)
            {
                c.requested = Some(Instant::now());
            }
        }

        // --- ended clients.
        let mut i = 0;
        while i < clients.len() {
            let c = &mut clients[i];
            let done = match c.killed_by_tool {
                // Dead and reaped: its quota must come back (reclaim by the monitor, a shim).
                Some(t) => {
                    if evict_signal_of(&ledger, &host.status_path(), c.child.pid()).is_none() {
                        f.reclaim_max = f.reclaim_max.max(t.elapsed());
                        true
                    } else {
                        assert!(
                            t.elapsed() < T,
                            "pid {} killed {:?} ago is still registered",
                            c.child.pid(),
                            t.elapsed()
                        );
                        false
                    }
                }
                None => !c.child.alive(),
            };
            if done {
                let c = clients.swap_remove(i);
                finished(c, f);
            } else {
                i += 1;
            }
        }

        // --- always.
        assert!(
            ledger.group_used(group) <= QUOTA,
            "the ledger holds {} bytes for a {QUOTA}-byte quota",
            ledger.group_used(group)
        );
        assert!(
            damaged_files(&lpath).is_empty(),
            "{:?}",
            damaged_files(&lpath)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // --- the end: the monitor up, no burst, every offline client gone.
    if let Some((mut online, load, _)) = burst.take() {
        online.kill9();
        load.stop();
    }
    if mon_up.is_none() {
        mon = host.start_monitor("mon.json", &cfg);
        f.restarts += 1;
        let pid = mon.pid();
        wait_new_state(&host, &mut mon, pid);
    }
    // Evictions in flight end (the escalation needs a grace and a restarted monitor's grace).
    let end = Instant::now() + Duration::from_millis(3 * GRACE_MS) + T;
    while clients
        .iter_mut()
        .any(|c| c.requested.is_some() && c.child.alive())
    {
        assert!(
            Instant::now() < end,
            "a process asked to leave is still running: {:?}\n{}",
            clients
                .iter_mut()
                .filter_map(
                    |c| (c.requested.is_some() && c.child.alive()).then(|| (c.kind, c.child.pid()))
                )
                .collect::<Vec<_>>(),
            host.log("mon.json")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for mut c in clients.drain(..) {
        if c.child.alive() {
            c.child.kill9();
        }
        finished(c, f);
    }
    let end = Instant::now() + T;
    while ledger.group_used(group) != 0 || !ledger.procs().is_empty() {
        assert!(
            Instant::now() < end,
            "dead clients' quota not given back: {} bytes, registered {:?}\n{}",
            ledger.group_used(group),
            ledger.procs(),
            host.log("mon.json")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let nvml = sampler.stop();
    let (samples, live_max) = (nvml.samples, nvml.live_max);
    f.nvml_samples += samples;
    f.nvml_live_max = f.nvml_live_max.max(live_max);
    assert!(
        live_max <= QUOTA,
        "live offline processes held {live_max} bytes by NVML for a {QUOTA}-byte quota"
    );
    let (reads, bad) = reader.stop();
    f.state_reads += reads;
    assert!(bad.is_empty(), "state file reads that failed: {bad:?}");
    assert!(mon.alive(), "{}", host.log("mon.json"));
    let v = host.wait_state(T, "the last monitor's state", |v| {
        v["monitor_pid"] == mon.pid()
    });
    assert!(v["ledger_error"].is_null(), "{v:#}");

    // --- one request per process, across every monitor of the run.
    let log = host.log("mon.json");
    for bad in ["damaged", "moved aside", "panicked"] {
        assert!(!log.contains(bad), "`{bad}` in the monitor log:\n{log}");
    }
    let mut per_proc: HashMap<(String, String), u32> = HashMap::new();
    for l in log
        .lines()
        .filter(|l| l.contains("evicting offline process"))
    {
        let k = (
            e2e::field(l, "pid").unwrap_or("?").to_string(),
            e2e::field(l, "start_time").unwrap_or("?").to_string(),
        );
        *per_proc.entry(k).or_default() += 1;
    }
    f.evictions += per_proc.values().map(|&n| u64::from(n)).sum::<u64>();
    f.escalations += log.matches("grace period over: SIGKILL").count() as u64;
    let twice: Vec<_> = per_proc.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "asked to leave more than once (pid, start time): {twice:?}\n{log}"
    );
    let records = node_ledger::evictlog::read_from(host.ledger_dir(), 0, None, 1 << 24)
        .expect("the eviction log reads");
    let mut per_rec: HashMap<(u32, u64), u32> = HashMap::new();
    for e in &records.entries {
        let r = e
            .record
            .as_ref()
            .expect("no damaged line in the eviction log");
        *per_rec.entry((r.pid, r.start_time)).or_default() += 1;
    }
    let twice: Vec<_> = per_rec.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "eviction log: more than one request for {twice:?}"
    );
    drop(mon);
    f.runs += 1;
}

/// Waits for the first state file of the monitor `pid` just started (it comes back).
fn wait_new_state(host: &EmuHost, mon: &mut EmuChild, pid: u32) -> Value {
    let v = e2e::wait_json(&host.monitor_state_file(), T, |v| v["monitor_pid"] == pid)
        .unwrap_or_else(|last| {
            panic!(
                "the restarted monitor (pid {pid}, alive {}) wrote no state file; last: {last:#}\n{}",
                mon.alive(),
                host.log("mon.json")
            )
        });
    assert!(
        matches!(state(&v), "init" | "healthy" | "unhealthy" | "overlimit"),
        "{v:#}"
    );
    v
}

/// Books an ended client: its allocations, its SIGTERM count, and an interrupted eviction's end.
fn finished(mut c: Client, f: &mut Figures) {
    if let Some(t) = c.interrupted_at {
        f.interrupted_finish_max = f.interrupted_finish_max.max(t.elapsed());
    }
    if let (Some(t), None) = (c.requested, c.killed_by_tool) {
        // Restarts may add their downtime, never a grace of their own.
        let over = t.elapsed().saturating_sub(Duration::from_millis(GRACE_MS));
        f.overrun_max = f.overrun_max.max(over);
        assert!(
            over < overrun_max(c.interruptions),
            "pid {} ({:?}) gone {:?} after its request, past the {GRACE_MS} ms grace by {over:?} \
             ({} monitor deaths during it)",
            c.child.pid(),
            c.kind,
            t.elapsed(),
            c.interruptions
        );
    }
    for l in c.child.stdout().lines().filter(|l| l.starts_with("alloc=")) {
        if l.starts_with("alloc=0") {
            f.allocs_ok += 1;
        } else {
            f.allocs_refused += 1;
        }
    }
    if let Some(file) = &c.count_file {
        let n = std::fs::read_to_string(file).map_or(0, |s| s.lines().count());
        assert!(n <= 1, "pid {} got {n} SIGTERMs", c.child.pid());
    }
    let _ = c.child.kill9();
}

#[test]
#[ignore = "stress tool: run by hand, prints its figures"]
fn stress_monitor_restarts_mid_operation() {
    if lacks_root("run offline processes as other users") {
        return;
    }
    let runs: u64 = e2e::env_or("XSHARE_STRESS_RUNS", 1);
    let secs: u64 = e2e::env_or("XSHARE_STRESS_SECS", 20);
    let seed = e2e::seed_from_env("XSHARE_STRESS_SEED");
    let mut rng = XorShift(seed);
    let mut f = Figures::default();
    let started = Instant::now();
    for run in 0..runs {
        let run_seed = rng.next_u64() | 1;
        eprintln!("run {run}: seed {run_seed}");
        run_once(secs, &mut XorShift(run_seed), &mut f);
    }
    eprintln!(
        "monitor restart stress (seed {seed}): {} runs x {secs} s on an emulated T4 in {:.0} s: \
         {} restarts ({} after SIGKILL, {} after SIGTERM); \
         the new monitor's first state file at most {} ms after its start; \
         {} online bursts, {} eviction requests (one per process), {} SIGKILL escalations; \
         {} monitor deaths with an eviction in flight ({} evictions interrupted, one lived through {} deaths), \
         the process gone at most {} ms after the first death; \
         processes asked to leave outlived the {GRACE_MS} ms grace by at most {} ms; \
         {} deaths in an Overlimit hold, {} holds resumed; \
         {} offline clients ({} SIGKILLed: quota back at most {} ms after), {} allocations ok, {} refused; \
         NVML: {} samples, live offline processes held at most {:.1} MiB of a {} MiB quota; \
         {} state file reads, all parsed",
        f.runs,
        started.elapsed().as_secs_f64(),
        f.restarts,
        f.sigkills,
        f.sigterms,
        f.first_state_max.as_millis(),
        f.bursts,
        f.evictions,
        f.escalations,
        f.deaths_mid_eviction,
        f.interrupted_evictions,
        f.interruptions_max,
        f.interrupted_finish_max.as_millis(),
        f.overrun_max.as_millis(),
        f.deaths_mid_hold,
        f.holds_resumed,
        f.workers,
        f.workers_killed,
        f.reclaim_max.as_millis(),
        f.allocs_ok,
        f.allocs_refused,
        f.nvml_samples,
        f.nvml_live_max as f64 / MIB as f64,
        QUOTA / MIB,
        f.state_reads,
    );
    assert!(
        f.restarts > 0 && f.evictions > 0,
        "nothing was exercised: {f:?}"
    );
}
