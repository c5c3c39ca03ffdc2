//! The monitor restarted in the middle of an operation, as systemd (`Restart=always`) and
//! operators restart it: SIGKILLed (OOM killer, watchdog) or stopped with SIGTERM
//! (`systemctl restart`), then started again at once. The operation must go on under the new
//! monitor as if nothing happened: an Overlimit hold keeps holding for what is left of it
//! (a restart is no reason to let offline work back onto a GPU whose online workload just
//! overloaded it, nor to count the same overload twice). The randomised version of these, with
//! offline clients and evictions in flight, is `monitor_restart_stress.rs`.

use std::time::{Duration, Instant};

use e2e::{monitor_state as state, register, EmuChild, EmuHost, Load};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

/// Judges SM activity and memory on a T4 (utilization from NVML's samples), no sustain, a
/// hold of `hold_ms` (doubling per entry in the window) and a grace of `grace_ms`.
fn config(hold_ms: u64, grace_ms: u64) -> String {
    format!(
        r#"{{
  "interval_ms": 10,
  "state_file_every_ms": 20,
  "host_memory": {{ "enabled": false }},
  "machine": {{
    "gpu_util":    {{ "healthy": 97, "unhealthy": 98, "overlimit": 99, "enabled": false }},
    "sm_activity": {{ "healthy": 30, "unhealthy": 60, "overlimit": 80 }},
    "sm_clock":    {{ "healthy": 3, "unhealthy": 2, "overlimit": 1, "direction": "below", "enabled": false }},
    "mem_used":    {{ "healthy": 80, "unhealthy": 90, "overlimit": 95 }},
    "overlimit_sustain_ms": 0,
    "hold_base_ms": {hold_ms},
    "hold_max_ms": 600000
  }},
  "evictor": {{ "grace_ms": {grace_ms} }},
  "verify": {{ "enabled": false }}
}}
"#
    )
}

/// A T4 host with the fake NVML and its device created.
fn t4() -> EmuHost {
    let n = EmuHost::with_profile("t4");
    n.require_nvml();
    n.device();
    n
}

/// The state file once the monitor with pid `pid` wrote one that satisfies `pred`.
fn state_of(n: &EmuHost, pid: u32, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    n.wait_state(T, what, |v| v["monitor_pid"] == pid && pred(v))
}

/// A `sleep` registered in the monitor's ledger as an offline process.
fn offline_sleeper(n: &EmuHost) -> EmuChild {
    let ledger = node_ledger::Ledger::open_existing(&n.ledger_path()).unwrap();
    let c = n.spawn_sh_offline("exec sleep 60");
    register(&ledger, c.pid(), 0);
    c
}

/// The monitor stopped by `sig` while its Overlimit hold runs (the burst is over), and started
/// again: the new monitor is Overlimit from its first state file on, holds for what was left
/// of the hold (on the monotonic clock both share), evicts an offline process that registers
/// meanwhile, leaves through Unhealthy, and counts no new Overlimit entry.
fn restart_during_the_hold_keeps_holding(sig: i32) {
    let n = t4();
    let hold = 4000;
    let mut m1 = n.start_monitor("mon.json", &config(hold, 1000));
    state_of(&n, m1.pid(), "healthy", |v| state(v) == "healthy");
    let load = Load::start(&n, 1.0, 5.0);
    state_of(&n, m1.pid(), "overlimit", |v| state(v) == "overlimit");
    load.stop();
    let v = state_of(&n, m1.pid(), "the hold running", |v| {
        state(v) == "overlimit"
            && v["hold_remaining_ms"]
                .as_u64()
                .is_some_and(|r| r < hold - 300)
    });
    let entries = v["overlimit_entries_mono_ms"].as_array().unwrap().len();
    // The hold ends on the monitors' shared monotonic clock at about `ends`.
    let ends = v["updated_mono_ms"].as_u64().unwrap() + v["hold_remaining_ms"].as_u64().unwrap();
    m1.signal(sig);
    m1.wait_exit(T).expect("the monitor stopped");

    let m2 = n.start_monitor("mon.json", "");
    let first = state_of(
        &n,
        m2.pid(),
        "the restarted monitor's first state file",
        |_| true,
    );
    assert_eq!(
        state(&first),
        "overlimit",
        "signal {sig}: the restarted monitor left the Overlimit hold ({} ms of it were left): {first:#}",
        ends.saturating_sub(first["updated_mono_ms"].as_u64().unwrap())
    );
    assert_eq!(first["admits_offline"], false, "{first:#}");
    // Offline work that registers during the rest of the hold is evicted, not admitted.
    let mut late = offline_sleeper(&n);
    assert_eq!(
        late.wait_exit(T),
        Some(Some(libc::SIGTERM)),
        "signal {sig}: an offline process registered during the hold was not evicted"
    );
    let left = state_of(&n, m2.pid(), "leaving Overlimit", |v| {
        state(v) != "overlimit"
    });
    let t = left["updated_mono_ms"].as_u64().unwrap();
    assert!(
        t + 50 >= ends,
        "signal {sig}: left Overlimit {} ms before the hold ended",
        ends - t
    );
    // It leaves through Unhealthy. The state file may already show the next step (Unhealthy
    // and Healthy can follow one another within one poll: a real H200 did it in 11 ms), so
    // read the restarted monitor's first transition from its log, which has every one.
    let log = n.log("mon.json");
    let resumed = log
        .find("resumed the Overlimit hold of an earlier monitor run")
        .unwrap_or_else(|| panic!("signal {sig}: no resumed hold in the log:\n{log}"));
    let first_step = log[resumed..]
        .lines()
        .find(|l| l.contains("health transition"))
        .unwrap_or_else(|| panic!("signal {sig}: no transition after the resume:\n{log}"));
    assert!(
        first_step.contains(r#"from="overlimit""#) && first_step.contains(r#"to="unhealthy""#),
        "signal {sig}: the restarted monitor did not leave Overlimit through Unhealthy: {first_step}"
    );
    assert_eq!(
        left["overlimit_entries_mono_ms"].as_array().unwrap().len(),
        entries,
        "signal {sig}: one overload, one entry: {left:#}"
    );
    assert!(
        n.log("mon.json")
            .contains("resumed the Overlimit hold of an earlier monitor run"),
        "{}",
        n.log("mon.json")
    );
}

/// The OOM killer's or the watchdog's SIGKILL during the hold.
#[test]
fn monitor_sigkilled_during_the_overlimit_hold_keeps_holding_after_restart() {
    restart_during_the_hold_keeps_holding(libc::SIGKILL);
}

/// `systemctl restart` (SIGTERM) during the hold.
#[test]
fn monitor_sigtermed_during_the_overlimit_hold_keeps_holding_after_restart() {
    restart_during_the_hold_keeps_holding(libc::SIGTERM);
}

/// Restarted while the online burst still overloads the GPU: the new monitor stays in the same
/// Overlimit stay (no second entry, the same hold), and the hold starts once the burst ends.
#[test]
fn monitor_restarted_during_an_overload_counts_it_once() {
    let n = t4();
    let hold = 1000;
    let mut m1 = n.start_monitor("mon.json", &config(hold, 1000));
    state_of(&n, m1.pid(), "healthy", |v| state(v) == "healthy");
    let load = Load::start(&n, 1.0, 5.0);
    let v = state_of(&n, m1.pid(), "overlimit", |v| state(v) == "overlimit");
    let entries = v["overlimit_entries_mono_ms"].clone();
    m1.signal(libc::SIGKILL);
    m1.wait_exit(T).expect("the monitor stopped");
    let m2 = n.start_monitor("mon.json", "");
    let v = state_of(
        &n,
        m2.pid(),
        "the restarted monitor, a few samples on",
        |v| v["samples"].as_u64() >= Some(20),
    );
    assert_eq!(state(&v), "overlimit", "{v:#}");
    assert_eq!(
        v["overlimit_entries_mono_ms"], entries,
        "one overload, one entry: {v:#}"
    );
    assert_eq!(v["hold_ms"], hold, "the hold of the first entry: {v:#}");
    load.stop();
    let stopped_ms = node_ledger::clock::now_ns() / 1_000_000;
    let left = state_of(&n, m2.pid(), "leaving Overlimit", |v| {
        state(v) != "overlimit"
    });
    let t = left["updated_mono_ms"].as_u64().unwrap();
    assert!(
        t + 50 >= stopped_ms + hold,
        "left Overlimit {} ms after the burst ended, before the {hold} ms hold",
        t.saturating_sub(stopped_ms)
    );
}

/// Restarts in quick succession (a crash loop under `Restart=always`, the watchdog) while an
/// eviction's grace runs: each restarted monitor finishes the grace of the one request rather
/// than starting it again, so the process that ignores SIGTERM is SIGKILLed once that grace is
/// over, however often the monitor comes back, and gets no second SIGTERM.
#[test]
fn restarts_within_the_grace_do_not_put_off_the_sigkill() {
    let n = t4();
    let grace = 3000;
    // A hold far longer than the test: every restarted monitor resumes the one Overlimit stay.
    let mut mon = n.start_monitor("mon.json", &config(60_000, grace));
    state_of(&n, mon.pid(), "healthy", |v| state(v) == "healthy");
    let terms = n.path("terms");
    // Counts every SIGTERM it gets and ignores it: only SIGKILL ends it.
    let mut victim = n.spawn_sh_offline(&format!(
        "trap 'echo t >> {0}' TERM; : > {0}.ready; while :; do sleep 0.02; done",
        terms.display()
    ));
    let ready = n.path("terms.ready");
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let end = Instant::now() + T;
        while !f() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait("the victim's trap", &|| ready.exists());
    let ledger = node_ledger::Ledger::open_existing(&n.ledger_path()).unwrap();
    register(&ledger, victim.pid(), 0);
    let load = Load::start(&n, 1.0, 5.0);
    let count = || std::fs::read_to_string(&terms).map_or(0, |s| s.lines().count());
    wait("the SIGTERM", &|| count() > 0);
    let asked = Instant::now();
    load.stop();
    let every = Duration::from_millis(grace / 4);
    let mut restarts = 0;
    while victim.alive() {
        assert!(
            asked.elapsed() < Duration::from_millis(4 * grace),
            "the process asked to leave {:?} ago still runs after {restarts} monitor restarts \
             every {every:?} (grace {grace} ms): each restart started the grace again",
            asked.elapsed()
        );
        let born = Instant::now();
        while born.elapsed() < every && victim.alive() {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !victim.alive() {
            break;
        }
        mon.signal(libc::SIGKILL);
        mon.wait_exit(T).expect("the monitor stopped");
        mon = n.start_monitor("mon.json", "");
        restarts += 1;
        let v = state_of(&n, mon.pid(), "the restarted monitor's state", |_| true);
        assert_eq!(state(&v), "overlimit", "{v:#}");
    }
    assert_eq!(victim.wait_exit(T), Some(Some(libc::SIGKILL)));
    assert_eq!(count(), 1, "SIGTERM sent once across {restarts} restarts");
    assert!(
        restarts >= 2,
        "the monitor was restarted during the grace only {restarts} times"
    );
    let log = n.log("mon.json");
    assert!(
        log.contains("resumed eviction recorded by an earlier monitor run"),
        "{log}"
    );
    assert_eq!(
        log.matches("grace period over: SIGKILL").count(),
        1,
        "{log}"
    );
}

/// A critical XID (here 79, the GPU fallen off the bus, from the kernel log) Disabled the GPU
/// with `xid_disable_ms` 0, the shipped default: until an operator enables it. The monitor is
/// SIGKILLed and started again: the kernel log is followed from its end, yet the new monitor
/// keeps the GPU Disabled by XID 79 from its first state file and its first publish in the
/// ledger on (never Healthy), evicts offline work that registers, and puts the GPU back in
/// service only when the operator runs `sysmonitor enable`.
#[test]
fn monitor_restarted_after_a_critical_xid_keeps_the_gpu_disabled_until_enabled() {
    let n = t4();
    let klog = n.path("kern.log");
    std::fs::write(&klog, "").unwrap();
    let cfg = config(1000, 1000).replace(
        r#""verify":"#,
        &format!(r#""xid_log": "{}", "verify":"#, klog.display()),
    );
    let mut m1 = n.start_monitor("mon.json", &cfg);
    state_of(&n, m1.pid(), "healthy", |v| state(v) == "healthy");
    std::fs::write(
        &klog,
        "NVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the bus.\n",
    )
    .unwrap();
    let v = state_of(&n, m1.pid(), "disabled", |v| state(v) == "disabled");
    assert_eq!(v["disabled_by"]["xid"], 79, "{v:#}");
    m1.signal(libc::SIGKILL);
    m1.wait_exit(T).expect("the monitor stopped");

    // Every health the next monitor publishes in the ledger, from before it starts.
    let ledger = node_ledger::Ledger::open_existing(&n.ledger_path()).unwrap();
    let published = Published::watch(&n);
    let m2 = n.start_monitor("mon.json", "");
    let first = state_of(
        &n,
        m2.pid(),
        "the restarted monitor's first state file",
        |_| true,
    );
    assert_eq!(
        state(&first),
        "disabled",
        "the restarted monitor put a GPU with XID 79 back in service: {first:#}"
    );
    assert_eq!(first["disabled_by"]["xid"], 79, "{first:#}");
    let c = n.spawn_sh_offline("exec sleep 60");
    register(&ledger, c.pid(), 0);
    let mut c = c;
    assert_eq!(
        c.wait_exit(T),
        Some(Some(libc::SIGTERM)),
        "offline work on a GPU Disabled by an XID"
    );
    let v = state_of(&n, m2.pid(), "a few samples later", |v| {
        v["samples"].as_u64() >= Some(30)
    });
    assert_eq!(state(&v), "disabled", "{v:#}");
    assert_eq!(
        published.by(m2.pid()),
        ["Disabled"],
        "what the restarted monitor published in the ledger"
    );

    let out = n
        .node_command("sysmonitor")
        .args(["enable", "--config"])
        .arg(n.path("mon.json"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("Disabled by XID 79"),
        "{said}"
    );
    let v = state_of(&n, m2.pid(), "healthy once enabled", |v| {
        state(v) == "healthy"
    });
    assert_eq!(v["last_transition"][0], "init", "{v:#}");
    assert!(
        !node_ledger::config::daemon_dir(n.ledger_dir(), 0).join("enable").exists(),
        "the request is consumed"
    );
}

/// The healths each monitor publishes in the status file, read every 200 µs from another thread
/// (a monitor publishes at every sample).
struct Published {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    th: Option<std::thread::JoinHandle<Vec<(u32, String)>>>,
}

impl Published {
    fn watch(n: &EmuHost) -> Published {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, path) = (stop.clone(), n.status_path());
        let th = std::thread::spawn(move || {
            let mut l: Option<node_ledger::Status> = None;
            let mut seen: Vec<(u32, String)> = Vec::new();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if l.is_none() {
                    l = node_ledger::Status::open(&path).ok();
                }
                if let Some(m) = l.as_ref().and_then(|l| l.read_monitor()) {
                    let h = (
                        m.monitor_pid,
                        m.health().map_or("unknown".into(), |h| format!("{h:?}")),
                    );
                    if !seen.contains(&h) {
                        seen.push(h);
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            seen
        });
        Published { stop, th: Some(th) }
    }

    /// Stops watching; the healths monitor `pid` published, in order of first sight.
    fn by(mut self, pid: u32) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let seen = self.th.take().unwrap().join().unwrap();
        seen.into_iter()
            .filter(|(p, _)| *p == pid)
            .map(|(_, h)| h)
            .collect()
    }
}

/// An operator disabled the GPU (`sysmonitor disable`); the monitor is SIGKILLed and started
/// again: it publishes the GPU Disabled in the ledger from its first sample on, never Healthy
/// for a tick before it looks at the operator's switch.
#[test]
fn monitor_restarted_on_an_operator_disabled_gpu_never_publishes_it_healthy() {
    let n = t4();
    let mut m1 = n.start_monitor("mon.json", &config(1000, 1000));
    state_of(&n, m1.pid(), "healthy", |v| state(v) == "healthy");
    std::fs::write(node_ledger::config::daemon_dir(n.ledger_dir(), 0).join("disabled"), "").unwrap();
    state_of(&n, m1.pid(), "disabled", |v| state(v) == "disabled");
    m1.signal(libc::SIGKILL);
    m1.wait_exit(T).expect("the monitor stopped");
    let published = Published::watch(&n);
    let m2 = n.start_monitor("mon.json", "");
    let v = state_of(&n, m2.pid(), "a few samples later", |v| {
        v["samples"].as_u64() >= Some(20)
    });
    assert_eq!(state(&v), "disabled", "{v:#}");
    assert_eq!(v["disabled_by"], "operator", "{v:#}");
    assert_eq!(
        published.by(m2.pid()),
        ["Disabled"],
        "what the restarted monitor published in the ledger"
    );
}
