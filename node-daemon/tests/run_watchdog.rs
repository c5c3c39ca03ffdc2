//! The run loop under a systemd watchdog whose period is shorter than the service's tick
//! interval: keep-alives still come at least every half watchdog period. Fake time (a
//! [`LoopClock`] that jumps to each deadline): no test waits for a watchdog period. One test
//! per file: the signal flags and the environment are process-wide.

use std::os::unix::net::UnixDatagram;

use node_daemon::run::{run_on, LoopClock, Service};
use node_daemon::sdnotify::Notifier;
use node_daemon::ConfigError;

/// Ticks every 15 s (an `interval_ms` of 15 000) and sends a keep-alive from each tick, as
/// the daemons do.
struct Slow {
    ticks: Vec<u64>,
}

impl Service for Slow {
    type Config = ();
    fn load(&mut self) -> Result<(), ConfigError> {
        Ok(())
    }
    fn apply(&mut self, _: ()) {}
    fn reload_failed(&mut self, _: &ConfigError) {}
    fn tick(&mut self, now_ms: u64, notifier: &Notifier) -> u64 {
        self.ticks.push(now_ms);
        notifier.notify("WATCHDOG=1");
        now_ms + 15_000
    }
    fn stop(&mut self) {}
}

/// Jumps to each deadline; stamps each keep-alive received on the notify socket with the
/// fake time at which the loop went back to sleep after sending it; stops after a minute.
struct Fake {
    now: u64,
    rx: UnixDatagram,
    keep_alives: Vec<u64>,
}

impl LoopClock for Fake {
    fn now_ms(&mut self) -> u64 {
        self.now
    }
    fn sleep_until_ms(&mut self, deadline_ms: u64) {
        let mut buf = [0u8; 256];
        while let Ok(n) = self.rx.recv(&mut buf) {
            if buf[..n].split(|&b| b == b'\n').any(|l| l == b"WATCHDOG=1") {
                self.keep_alives.push(self.now);
            }
        }
        self.now = self.now.max(deadline_ms);
        if self.now >= 60_000 {
            // SAFETY: raise(3) with a valid signal number; the handler only sets the stop flag.
            unsafe { libc::raise(libc::SIGTERM) };
        }
    }
}

#[test]
fn keep_alives_come_every_half_watchdog_period_though_ticks_are_further_apart() {
    let d = tempfile::tempdir().unwrap();
    let sock = d.path().join("notify");
    let rx = UnixDatagram::bind(&sock).unwrap();
    rx.set_nonblocking(true).unwrap();
    std::env::set_var("NOTIFY_SOCKET", &sock);
    std::env::set_var("WATCHDOG_USEC", "10000000");
    std::env::remove_var("WATCHDOG_PID");
    let notifier = Notifier::from_env();
    assert_eq!(notifier.watchdog_usec, Some(10_000_000));
    let mut svc = Slow { ticks: Vec::new() };
    let mut clock = Fake { now: 0, rx, keep_alives: Vec::new() };
    run_on(&mut svc, &notifier, &mut clock);
    assert_eq!(svc.ticks, [0, 15_000, 30_000, 45_000], "stopped at 60 s");
    let k = &clock.keep_alives;
    assert_eq!(k.first(), Some(&0), "{k:?}");
    assert!(k.last().is_some_and(|&t| t >= 55_000), "{k:?}");
    for w in k.windows(2) {
        assert!(w[1] - w[0] <= 5_000, "keep-alives {} ms apart under a 10 s watchdog: {k:?}", w[1] - w[0]);
    }
}
