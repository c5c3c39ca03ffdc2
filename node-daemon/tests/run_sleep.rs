//! The run loop's sleep under signals that arrive while it sleeps: a SIGHUP reloads at once
//! and sends the loop back to sleep until the same deadline (no early tick), a SIGTERM ends
//! the loop at once rather than at its next deadline. One test per file: the signal flags are
//! process-wide.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use node_daemon::run::{run, Service};
use node_daemon::sdnotify::Notifier;
use node_daemon::ConfigError;

/// Ticks once a minute; counts ticks and reloads.
struct Slow {
    ticks: Arc<AtomicU32>,
    reloads: Arc<AtomicU32>,
}

impl Service for Slow {
    type Config = ();
    fn load(&mut self) -> Result<(), ConfigError> {
        Ok(())
    }
    fn apply(&mut self, _: ()) {
        self.reloads.fetch_add(1, SeqCst);
    }
    fn reload_failed(&mut self, _: &ConfigError) {}
    fn tick(&mut self, now_ms: u64, _: &Notifier) -> u64 {
        self.ticks.fetch_add(1, SeqCst);
        now_ms + 60_000
    }
    fn stop(&mut self) {}
}

fn wait_for(what: &str, ok: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < end, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn signals_end_the_sleep_at_once_and_only_a_due_deadline_ticks() {
    use std::os::unix::thread::JoinHandleExt;
    let (ticks, reloads) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let mut svc = Slow {
        ticks: ticks.clone(),
        reloads: reloads.clone(),
    };
    let started = Instant::now();
    let h = std::thread::spawn(move || run(&mut svc, &Notifier::from_env()));
    let thread = h.as_pthread_t();
    // SAFETY (both kills): pthread_kill(3) on a thread that is still running (it ends only
    // after SIGTERM, below); run() has installed flag-only handlers by its first tick.
    let kill = |sig| assert_eq!(unsafe { libc::pthread_kill(thread, sig) }, 0);
    wait_for("first tick", || ticks.load(SeqCst) == 1);
    for n in 1..=3 {
        kill(libc::SIGHUP);
        wait_for("reload while asleep", || reloads.load(SeqCst) == n);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(ticks.load(SeqCst), 1, "a signal is no reason to tick before the deadline");
    kill(libc::SIGTERM);
    wait_for("the loop to end on SIGTERM", || h.is_finished());
    h.join().unwrap();
    assert_eq!(ticks.load(SeqCst), 1);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "SIGTERM ended the sleep, not the minute-long deadline"
    );
}
