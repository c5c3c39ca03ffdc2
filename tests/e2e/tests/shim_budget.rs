//! Observation 10 (shim side, issue 8): the dynamic SM budget reaches offline processes.
//! Real MPS fixes a client's active-thread percentage at client start, so (1) the shim's
//! library constructor sets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from a fresh budget (a value the
//! user set is kept where it asks for no more), and (2) a running process follows the budget through its throttle's target
//! (read on the controller's periodic tick), back to the configured target when it goes stale.

mod shim_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::EmuHost;
use shim_support::*;

const VAR: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// Publishes `permille` as the offline SM budget (the manager block, as mps-manager does)
/// and an empty jobs table (as sysmonitor does while no offline job is registered) every
/// 20 ms until dropped.
struct Publisher {
    stop: Arc<AtomicBool>,
    h: Option<std::thread::JoinHandle<()>>,
}

impl Publisher {
    fn start(host: &EmuHost, permille: u32) -> Self {
        let l = status(host);
        // Published before returning: a client started next must see this budget, not the
        // previous publisher's (still fresh) one.
        l.publish_sm_budget(permille);
        l.publish_jobs(&[]);
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let h = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                l.publish_sm_budget(permille);
                l.publish_jobs(&[]);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self { stop, h: Some(h) }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.h.take() {
            let _ = h.join();
        }
    }
}

fn env_seen(host: &EmuHost, user: Option<&str>) -> String {
    let mut c = limited(host, "shim_client", 1 << 30, "budget");
    c.env_remove(VAR);
    if let Some(v) = user {
        c.env(VAR, v);
    }
    c.args(["env", VAR]);
    let lines = run(host, &mut c);
    lines
        .iter()
        .find_map(|l| l.strip_prefix("env="))
        .unwrap_or_else(|| panic!("{lines:?}"))
        .to_string()
}

/// The constructor sets the percentage from a fresh budget; a value the user set is kept where
/// it asks for no more than the share, and held to the share where it asks for more or is not a
/// percentage MPS applies (before: any user value was kept, and a tenant's 100 % ran on every
/// SM the online service had).
#[test]
fn constructor_sets_the_mps_percentage_from_a_fresh_budget_and_holds_the_users_to_it() {
    let host = EmuHost::new();
    assert_eq!(
        env_seen(&host, None),
        "",
        "no budget published: MPS's own default"
    );
    assert_eq!(env_seen(&host, Some("70")), "70", "no budget: the user's value as it is");
    let _p = Publisher::start(&host, 301);
    assert_eq!(env_seen(&host, None), "31", "rounded up from 30.1 %");
    assert_eq!(env_seen(&host, Some("20.5")), "20.5", "the user's lower value is kept as written");
    for user in ["70", "100", "150", "0", "abc"] {
        assert_eq!(env_seen(&host, Some(user)), "31", "the user's {user:?}: held to the share");
    }
    drop(_p);
    let _p = Publisher::start(&host, 20);
    assert_eq!(env_seen(&host, None), "10", "never below the sane minimum");
}

#[test]
fn a_running_process_follows_the_budget_and_falls_back_when_it_goes_stale() {
    let host = EmuHost::new();
    let cfg = host.root().join("xcuda-budget.json");
    std::fs::write(
        &cfg,
        r#"{"throttle": {"target_load": 0.8, "stale_after_ms": 200}}"#,
    )
    .unwrap();
    let mut c = limited(&host, "shim_client", 1 << 30, "follow");
    c.env("XCUDA_CONFIG", &cfg)
        .args(["ctx", "ready", "wait", "ready", "wait"]);
    let mut k = host.spawn(&mut c);
    k.wait_for_line("ready", T)
        .unwrap_or_else(|| panic!("{}", k.stderr()));
    let targets = |k: &e2e::EmuChild| -> Vec<String> {
        k.stderr()
            .lines()
            .filter(|l| l.contains("throttle target changed"))
            .map(str::to_string)
            .collect()
    };
    let wait_for = |k: &e2e::EmuChild, n: usize| {
        let start = Instant::now();
        while targets(k).len() < n && start.elapsed() < T {
            std::thread::sleep(Duration::from_millis(20));
        }
        targets(k)
    };
    {
        let _p = Publisher::start(&host, 250);
        let t = wait_for(&k, 1);
        assert!(
            t.len() == 1 && t[0].contains("target=0.25"),
            "fresh budget lowers the target: {t:?}\n{}",
            k.stderr()
        );
    }
    // Publisher stopped: the budget goes stale and the configured target comes back.
    let t = wait_for(&k, 2);
    assert!(
        t.len() >= 2 && t[1].contains("target=0.8"),
        "stale budget: static target again: {t:?}"
    );
    {
        let _p = Publisher::start(&host, 950);
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            targets(&k).len(),
            2,
            "a budget above the configured target never loosens it: {:?}",
            targets(&k)
        );
    }
    k.send_line("go");
    k.send_line("go");
    k.finish(T);
}
